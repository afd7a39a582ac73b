//! Redis Cluster's hash slots: which of the [`SLOTS`] slots a key belongs to
//! ([`key_slot`], with hash tags), and sets of slots written as ranges
//! ([`SlotRanges`], `"0-8191,10000"`), as a sharded keyspace names the slots it serves.

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

#[cfg(test)]
mod tests {
    use super::*;

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
