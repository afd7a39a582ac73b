//! Redis Cluster's hash slots: which of the [`SLOTS`] slots a key belongs to
//! ([`key_slot`], with hash tags), and sets of slots written as ranges
//! ([`SlotRanges`], `"0-8191,10000"`), as a sharded keyspace names the slots it serves;
//! and how a slot moves from one keyspace to another while both serve ([`SlotOp`],
//! [`SlotState`]; `docs/operations.md`, *Moving slots*).

use crate::{Key, KeyspaceId, Value, Version};
use serde::{Deserialize, Serialize};
use std::fmt;

/// How many hash slots there are (Redis Cluster's 16,384).
pub const SLOTS: u16 = 16_384;

const CRC16: crc::Crc<u16> = crc::Crc::<u16>::new(&crc::CRC_16_XMODEM);

/// The part of `key` its slot is computed from: the bytes between the first `{` and the
/// first `}` after it when there are some (a hash tag: `user:{42}:name` and
/// `cart:{42}` share a slot), else the whole key.
pub fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

/// The hash slot of `key`: CRC-16/XMODEM of its [`hash_tag`], modulo [`SLOTS`].
pub fn key_slot(key: &[u8]) -> u16 {
    CRC16.checksum(hash_tag(key)) % SLOTS
}

/// A set of slots as sorted, disjoint, non-adjacent inclusive ranges.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct SlotRanges(Vec<(u16, u16)>);

impl SlotRanges {
    /// Every slot.
    pub fn all() -> SlotRanges {
        SlotRanges(vec![(0, SLOTS - 1)])
    }

    /// The slots of `ranges` (each inclusive, in any order, overlaps allowed).
    pub fn from_ranges(ranges: impl IntoIterator<Item = (u16, u16)>) -> SlotRanges {
        let mut all: Vec<(u16, u16)> = ranges.into_iter().filter(|(a, b)| a <= b).collect();
        all.sort_unstable();
        let mut merged: Vec<(u16, u16)> = Vec::with_capacity(all.len());
        for (a, b) in all {
            match merged.last_mut() {
                Some(last) if u32::from(a) <= u32::from(last.1) + 1 => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        SlotRanges(merged)
    }

    /// `parts` consecutive ranges covering every slot, the `i`-th of them (the slots are
    /// split as evenly as integers allow): how `keel up --sharded` spreads them.
    pub fn share(i: u32, parts: u32) -> SlotRanges {
        assert!(i < parts && parts <= u32::from(SLOTS), "share {i} of {parts}");
        let at = |k: u32| (u64::from(k) * u64::from(SLOTS) / u64::from(parts)) as u16;
        SlotRanges(vec![(at(i), at(i + 1) - 1)])
    }

    /// The ranges, sorted.
    pub fn ranges(&self) -> &[(u16, u16)] {
        &self.0
    }

    /// How many slots.
    pub fn count(&self) -> u32 {
        self.0.iter().map(|(a, b)| u32::from(b - a) + 1).sum()
    }

    /// Whether `slot` is among them.
    pub fn contains(&self, slot: u16) -> bool {
        let i = self.0.partition_point(|(_, b)| *b < slot);
        self.0.get(i).is_some_and(|(a, _)| *a <= slot)
    }

    /// Whether no slot is in both.
    pub fn disjoint(&self, other: &SlotRanges) -> bool {
        self.0.iter().all(|(a, b)| other.0.iter().all(|(c, d)| b < c || d < a))
    }

    /// Parses `"0-8191,10000,12000-16383"`: ranges (inclusive) and single slots,
    /// separated by commas, each below [`SLOTS`].
    pub fn parse(text: &str) -> Result<SlotRanges, String> {
        let slot = |word: &str| -> Result<u16, String> {
            let n: u16 = word.trim().parse().map_err(|_| format!("{word:?} is not a slot"))?;
            if n >= SLOTS {
                return Err(format!("slot {n} is not below {SLOTS}"));
            }
            Ok(n)
        };
        let mut ranges = Vec::new();
        for part in text.split(',').filter(|p| !p.trim().is_empty()) {
            let (a, b) = match part.split_once('-') {
                Some((a, b)) => (slot(a)?, slot(b)?),
                None => (slot(part)?, slot(part)?),
            };
            if a > b {
                return Err(format!("range {a}-{b} ends before it starts"));
            }
            ranges.push((a, b));
        }
        if ranges.is_empty() {
            return Err("no slots".into());
        }
        Ok(SlotRanges::from_ranges(ranges))
    }
}

impl fmt::Display for SlotRanges {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (a, b)) in self.0.iter().enumerate() {
            let comma = if i > 0 { "," } else { "" };
            match a == b {
                true => write!(f, "{comma}{a}")?,
                false => write!(f, "{comma}{a}-{b}")?,
            }
        }
        Ok(())
    }
}

/// Where a keyspace stands with one slot, when its log says anything of it (a slot its
/// log says nothing of is served as the configuration says). A slot moves from a source
/// keyspace to a target one in this order: the target `Importing`, the source
/// `Migrating` (its keys moved a batch at a time, each batch `held` at the source while
/// its copy is written at the target), the target `Owned`, the source `Released`.
///
/// Every state carries the id of the move that set it: a step of a move applies only
/// to the states of that move, so a late copy of an earlier move's step (a retry, a
/// duplicated message) changes nothing. Move ids increase from one move of a slot to the
/// next (`keel slots move` takes the clock's microseconds).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SlotState {
    /// The target of a move: takes the slot's keys only from clients sent by the
    /// source (`ASKING`), and the copies the mover writes.
    Importing {
        /// The source.
        from: KeyspaceId,
        /// The version of the entry that began the import: an item older than it is
        /// not a client's write of this move, and a copy may replace it.
        since: Version,
        /// The move.
        id: u64,
    },
    /// The source of a move: serves the keys it still holds; a key it does not hold
    /// is the target's (`ASK`); a key `held` is being copied (`TRYAGAIN`).
    Migrating {
        /// The target.
        to: KeyspaceId,
        /// The keys being copied now, in key order (at most [`SLOT_BATCH_MAX`]).
        held: Vec<Key>,
        /// The move.
        id: u64,
    },
    /// The target, once the move is done: serves the slot whatever the configuration.
    Owned {
        /// The move.
        id: u64,
    },
    /// The source, once the move is done: serves no key of the slot (`MOVED`).
    Released {
        /// Where the slot went.
        to: KeyspaceId,
        /// The move.
        id: u64,
    },
}

/// Most keys one [`SlotOp::Hold`] takes, and one [`SlotOp::Fill`] writes.
pub const SLOT_BATCH_MAX: usize = 1_024;

impl SlotState {
    /// The state's bytes as the state machine keeps them under [`slot_state_key`].
    pub fn encode(&self) -> Value {
        let mut out = Vec::new();
        let u32_be = |out: &mut Vec<u8>, n: u32| out.extend_from_slice(&n.to_be_bytes());
        let u64_be = |out: &mut Vec<u8>, n: u64| out.extend_from_slice(&n.to_be_bytes());
        match self {
            SlotState::Importing { from, since, id } => {
                out.push(1);
                u32_be(&mut out, from.0);
                u64_be(&mut out, since.epoch.0);
                u64_be(&mut out, since.index.0);
                u64_be(&mut out, *id);
            }
            SlotState::Migrating { to, held, id } => {
                out.push(2);
                u32_be(&mut out, to.0);
                u64_be(&mut out, *id);
                u32_be(&mut out, held.len() as u32);
                for key in held {
                    u32_be(&mut out, key.len() as u32);
                    out.extend_from_slice(key);
                }
            }
            SlotState::Owned { id } => {
                out.push(3);
                u64_be(&mut out, *id);
            }
            SlotState::Released { to, id } => {
                out.push(4);
                u32_be(&mut out, to.0);
                u64_be(&mut out, *id);
            }
        }
        out.into()
    }

    /// The state `bytes` encode (`None`: not an encoding [`Self::encode`] writes).
    pub fn decode(bytes: &[u8]) -> Option<SlotState> {
        let u32_at = |at: usize| -> Option<u32> {
            Some(u32::from_be_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
        };
        let u64_at = |at: usize| -> Option<u64> {
            Some(u64::from_be_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
        };
        let state = match bytes.first()? {
            1 if bytes.len() == 29 => SlotState::Importing {
                from: KeyspaceId(u32_at(1)?),
                since: Version::new(u64_at(5)?, u64_at(13)?),
                id: u64_at(21)?,
            },
            2 => {
                let (to, id) = (KeyspaceId(u32_at(1)?), u64_at(5)?);
                let count = u32_at(13)? as usize;
                if count > SLOT_BATCH_MAX {
                    return None;
                }
                let (mut held, mut at) = (Vec::with_capacity(count), 17);
                for _ in 0..count {
                    let len = u32_at(at)? as usize;
                    let key = bytes.get(at + 4..(at + 4).checked_add(len)?)?;
                    held.push(Key::copy_from_slice(key));
                    at += 4 + len;
                }
                if at != bytes.len() || held.windows(2).any(|w| w[0] >= w[1]) {
                    return None;
                }
                SlotState::Migrating { to, held, id }
            }
            3 if bytes.len() == 9 => SlotState::Owned { id: u64_at(1)? },
            4 if bytes.len() == 13 => {
                SlotState::Released { to: KeyspaceId(u32_at(1)?), id: u64_at(5)? }
            }
            _ => return None,
        };
        Some(state)
    }

    /// The state's name as `KEEL.SLOTS STATE` shows it.
    pub fn name(&self) -> &'static str {
        match self {
            SlotState::Importing { .. } => "importing",
            SlotState::Migrating { .. } => "migrating",
            SlotState::Owned { .. } => "owned",
            SlotState::Released { .. } => "released",
        }
    }

    /// The other keyspace of the move (`None`: owned).
    pub fn other(&self) -> Option<KeyspaceId> {
        match self {
            SlotState::Importing { from: k, .. }
            | SlotState::Migrating { to: k, .. }
            | SlotState::Released { to: k, .. } => Some(*k),
            SlotState::Owned { .. } => None,
        }
    }

    /// The move that set the state.
    pub fn id(&self) -> u64 {
        match self {
            SlotState::Importing { id, .. }
            | SlotState::Migrating { id, .. }
            | SlotState::Owned { id }
            | SlotState::Released { id, .. } => *id,
        }
    }
}

/// The reserved key a keyspace keeps its [`SlotState`] of `slot` under: the reserved
/// prefix, four `0xff` bytes (a queue's name length no queue has, so no queue's keys
/// meet them), `slot` and the slot, big-endian.
pub fn slot_state_key(slot: u16) -> Key {
    let mut key = SLOT_STATE_PREFIX.to_vec();
    key.extend_from_slice(&slot.to_be_bytes());
    key.into()
}

/// The first bytes of every [`slot_state_key`].
pub const SLOT_STATE_PREFIX: &[u8] = b"\xff\xffkeel\x00\xff\xff\xff\xffslot";

/// The slot a [`slot_state_key`] names (`None`: not one).
pub fn slot_of_state_key(key: &[u8]) -> Option<u16> {
    let rest = key.strip_prefix(SLOT_STATE_PREFIX)?;
    Some(u16::from_be_bytes(rest.try_into().ok()?)).filter(|s| *s < SLOTS)
}

/// A step of moving slots between keyspaces (`KEEL.SLOTS`, `keel slots move`), applied
/// through the log of the keyspace it is sent to. Each is idempotent, and each names
/// its move (`id`): the mover repeats any of them after a failure, and a late copy of
/// an earlier move's step changes nothing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SlotOp {
    /// At the target: `first..=last` become [`SlotState::Importing`] from `from`.
    Import {
        /// The first slot.
        first: u16,
        /// The last slot.
        last: u16,
        /// The source.
        from: KeyspaceId,
        /// The move.
        id: u64,
    },
    /// At the source: `first..=last` become [`SlotState::Migrating`] to `to`.
    Migrate {
        /// The first slot.
        first: u16,
        /// The last slot.
        last: u16,
        /// The target.
        to: KeyspaceId,
        /// The move.
        id: u64,
    },
    /// At the source, migrating: holds up to `count` live keys of `slot` (the keys held
    /// already, if any) and answers each with its image ([`crate::CommandResult::Items`]).
    Hold {
        /// The slot.
        slot: u16,
        /// Most keys held.
        count: u32,
        /// The move.
        id: u64,
    },
    /// At the target, importing: writes each key's image (as `RESTORE ... REPLACE`),
    /// unless the key was written since the import began (a copy already written, or a
    /// client's write after the source let the key go: a late copy of this step).
    Fill {
        /// The slot every key is in.
        slot: u16,
        /// Keys and images, as [`SlotOp::Hold`] answered them.
        items: Vec<(Key, Value)>,
        /// The move.
        id: u64,
    },
    /// At the source, migrating: deletes those of `keys` it holds (their copies are at
    /// the target) and holds them no more.
    Release {
        /// The slot.
        slot: u16,
        /// The keys, as [`SlotOp::Hold`] answered them.
        keys: Vec<Key>,
        /// The move.
        id: u64,
    },
    /// At the target: `first..=last`, importing, become [`SlotState::Owned`].
    Own {
        /// The first slot.
        first: u16,
        /// The last slot.
        last: u16,
        /// The move.
        id: u64,
    },
    /// Answers the slots of `first..=last` that hold live keys, and how many each
    /// ([`crate::CommandResult::Answer`]: a flat array of slot, count, ...). Changes
    /// nothing; through the log so that it is ordered after the `Migrate` before it:
    /// a migrating slot gets no new key at the source, so the slots it names are all the
    /// mover has to empty.
    Occupied {
        /// The first slot.
        first: u16,
        /// The last slot.
        last: u16,
    },
    /// At the source: `first..=last`, migrating and holding no key, become
    /// [`SlotState::Released`].
    Give {
        /// The first slot.
        first: u16,
        /// The last slot.
        last: u16,
        /// The move.
        id: u64,
    },
}

impl SlotOp {
    /// The op's name (`KEEL.SLOTS`'s subcommand, lowercase).
    pub fn name(&self) -> &'static str {
        match self {
            SlotOp::Import { .. } => "import",
            SlotOp::Migrate { .. } => "migrate",
            SlotOp::Hold { .. } => "hold",
            SlotOp::Fill { .. } => "fill",
            SlotOp::Release { .. } => "release",
            SlotOp::Own { .. } => "own",
            SlotOp::Occupied { .. } => "occupied",
            SlotOp::Give { .. } => "give",
        }
    }

    /// Whether its slots are in range and its batch within bounds.
    pub fn valid(&self) -> bool {
        match self {
            SlotOp::Import { first, last, .. }
            | SlotOp::Migrate { first, last, .. }
            | SlotOp::Own { first, last, .. }
            | SlotOp::Occupied { first, last }
            | SlotOp::Give { first, last, .. } => first <= last && *last < SLOTS,
            SlotOp::Hold { slot, count, .. } => {
                *slot < SLOTS && *count > 0 && *count as usize <= SLOT_BATCH_MAX
            }
            SlotOp::Fill { slot, items, .. } => {
                *slot < SLOTS
                    && items.len() <= SLOT_BATCH_MAX
                    && items.iter().all(|(k, _)| key_slot(k) == *slot)
            }
            SlotOp::Release { slot, keys, .. } => {
                *slot < SLOTS
                    && keys.len() <= SLOT_BATCH_MAX
                    && keys.iter().all(|k| key_slot(k) == *slot)
            }
        }
    }

    /// Bytes of keys and images it carries.
    pub fn payload_bytes(&self) -> usize {
        match self {
            SlotOp::Fill { items, .. } => items.iter().map(|(k, v)| k.len() + v.len()).sum(),
            SlotOp::Release { keys, .. } => keys.iter().map(|k| k.len()).sum(),
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_states_round_trip_and_forgeries_do_not_decode() {
        let states = [
            SlotState::Importing { from: KeyspaceId(3), since: Version::new(2, 9), id: 7 },
            SlotState::Migrating { to: KeyspaceId(1), held: vec![], id: 7 },
            SlotState::Migrating { to: KeyspaceId(1), held: vec!["a".into(), "bc".into()], id: 1 },
            SlotState::Owned { id: 4 },
            SlotState::Released { to: KeyspaceId(7), id: u64::MAX },
        ];
        for state in states {
            let bytes = state.encode();
            assert_eq!(SlotState::decode(&bytes), Some(state.clone()));
            assert_eq!(SlotState::decode(&bytes[..bytes.len() - 1]), None, "{state:?} cut");
            let mut longer = bytes.to_vec();
            longer.push(0);
            assert_eq!(SlotState::decode(&longer), None, "{state:?} extended");
        }
        let unordered =
            SlotState::Migrating { to: KeyspaceId(1), held: vec!["b".into(), "a".into()], id: 1 };
        assert_eq!(SlotState::decode(&unordered.encode()), None, "held keys out of order");
        assert_eq!(SlotState::decode(&[9]), None);
        assert_eq!(SlotState::decode(&[]), None);
        assert_eq!(slot_of_state_key(&slot_state_key(16383)), Some(16383));
        assert_eq!(slot_of_state_key(b"slot"), None);
        assert!(slot_state_key(0).starts_with(crate::RESERVED_KEY_PREFIX));
    }

    #[test]
    fn slots_are_redis_clusters() {
        // Values Redis Cluster gives (`CLUSTER KEYSLOT`).
        assert_eq!(key_slot(b"123456789"), 0x31C3 % SLOTS, "the CRC-16/XMODEM check value");
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        assert_eq!(key_slot(b"somekey"), 11058);
        assert_eq!(key_slot(b""), 0);
    }

    #[test]
    fn a_hash_tag_picks_the_slot() {
        assert_eq!(key_slot(b"user:{42}:name"), key_slot(b"42"));
        assert_eq!(key_slot(b"{42}cart"), key_slot(b"42"));
        assert_eq!(hash_tag(b"foo{}{bar}"), b"foo{}{bar}", "an empty tag: the whole key");
        assert_eq!(
            hash_tag(b"foo{{bar}}zap"),
            b"{bar",
            "from the first opening brace to the first closing one after it"
        );
        assert_eq!(hash_tag(b"foo{bar}{zap}"), b"bar");
        assert_eq!(hash_tag(b"foo{bar"), b"foo{bar", "unclosed");
    }

    #[test]
    fn ranges_parse_merge_and_print() {
        let r = SlotRanges::parse("10-20, 0-9,30,21").unwrap();
        assert_eq!(r.ranges(), &[(0, 21), (30, 30)]);
        assert_eq!(r.to_string(), "0-21,30");
        assert_eq!(r.count(), 23);
        assert!(r.contains(0) && r.contains(21) && r.contains(30));
        assert!(!r.contains(22) && !r.contains(31) && !r.contains(16383));
        assert!(SlotRanges::parse("5-4").is_err());
        assert!(SlotRanges::parse("16384").is_err());
        assert!(SlotRanges::parse("").is_err());
        assert!(SlotRanges::parse("a-b").is_err());
        assert!(r.disjoint(&SlotRanges::parse("22-29,31").unwrap()));
        assert!(!r.disjoint(&SlotRanges::parse("29-30").unwrap()));
    }

    #[test]
    fn shares_cover_every_slot_once() {
        for parts in [1, 2, 3, 7, 8] {
            let shares: Vec<SlotRanges> = (0..parts).map(|i| SlotRanges::share(i, parts)).collect();
            assert_eq!(shares.iter().map(SlotRanges::count).sum::<u32>(), u32::from(SLOTS));
            let all = SlotRanges::from_ranges(shares.iter().flat_map(|s| s.ranges().to_vec()));
            assert_eq!(all, SlotRanges::all());
        }
        assert_eq!(SlotRanges::share(0, 2).to_string(), "0-8191");
        assert_eq!(SlotRanges::share(1, 2).to_string(), "8192-16383");
    }
}
