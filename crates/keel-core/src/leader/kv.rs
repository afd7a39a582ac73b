//! The key-value state machine every node applies log entries to.
//!
//! Layout:
//! - [`Kv::apply`] executes one entry (put, delete, cas, incr, no-op), deduplicating
//!   retried writes by `(client, request)`, and records an undo record.
//! - [`Kv::rollback_after`] undoes entries above a truncation point (`docs/protocol.md` §12 item 5:
//!   undo records are kept for every applied entry above the local durable index, which
//!   is never truncated; [`Kv::forget_undo_through`] drops them as it advances).
//! - Reads: [`Kv::get`], [`Kv::scan`], [`Kv::update_index`].
//! - [`Kv::encode_at`] / [`Kv::decode`]: the snapshot format (state as of any index the
//!   undo records still reach), and [`Kv::digest_at`], a deterministic digest of it.
//! - [`Kv::begin_snapshot`] / [`Kv::continue_snapshot`]: the same encoding produced a
//!   slice at a time while writes go on (copy-on-write: before a key not yet encoded
//!   changes, its item as of the snapshot index is saved), so that a large state never
//!   stalls one engine step.
//!
//! Deletes leave tombstones that carry the delete's version, so a key's update index
//! survives its deletion (`docs/protocol.md` §12 item 13); a key never written has update index 0.

use crate::engine::reused_request;
use crate::fnv::{Fnv, WordHash};
use keel_types::codec::{put_bytes, put_u32, put_u64, put_u8, Reader};
use keel_types::{
    ClientId, Command, CommandResult, Entry, EntryPayload, Epoch, ExpireCond, KeelError, Key,
    LogIndex, Membership, RequestId, SetCond, Ttl, Value, Version, DB_KEYS_END, DB_KEY_PREFIX,
    RESERVED_KEY_END, RESERVED_KEY_PREFIX,
};
use smallvec::SmallVec;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ops::Bound;
use std::sync::Arc;

/// The keys whose item differs as of some index below the applied one: the item they
/// had then (`None`: absent), from the undo records.
type KeyOverlay<'a> = BTreeMap<&'a Key, Option<&'a Item>>;

/// A queue's bounds, kept under its meta key: elements `head..next` are present.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct QueueMeta {
    head: u64,
    next: u64,
}

impl QueueMeta {
    fn len(self) -> u64 {
        self.next - self.head
    }

    fn encode(self) -> Value {
        let mut bytes = Vec::with_capacity(16);
        bytes.extend_from_slice(&self.head.to_be_bytes());
        bytes.extend_from_slice(&self.next.to_be_bytes());
        bytes.into()
    }

    /// The bounds a meta value holds; a queue never used (or a value of the wrong shape,
    /// which only a damaged snapshot could hold) starts at 1.
    fn of(value: Option<&[u8]>) -> QueueMeta {
        value.and_then(QueueMeta::decode).unwrap_or(QueueMeta { head: 1, next: 1 })
    }

    fn decode(bytes: &[u8]) -> Option<QueueMeta> {
        let head = u64::from_be_bytes(bytes.get(..8)?.try_into().ok()?);
        let next = u64::from_be_bytes(bytes.get(8..16)?.try_into().ok()?);
        (bytes.len() == 16 && head >= 1 && head <= next).then_some(QueueMeta { head, next })
    }
}

/// The key a queue's bounds live under: the reserved prefix, the name's length and the
/// name (so that no two queues' keys interleave, and a queue's element keys follow it).
fn queue_meta_key(queue: &[u8]) -> Key {
    let mut key = Vec::with_capacity(RESERVED_KEY_PREFIX.len() + 4 + queue.len() + 8);
    key.extend_from_slice(RESERVED_KEY_PREFIX);
    key.extend_from_slice(&u32::try_from(queue.len()).unwrap_or(u32::MAX).to_be_bytes());
    key.extend_from_slice(queue);
    key.into()
}

/// The key of a queue's element `seq`: its meta key and the sequence number, big-endian
/// (so elements sort in queue order).
fn queue_item_key(queue: &[u8], seq: u64) -> Key {
    let mut key = queue_meta_key(queue).to_vec();
    key.extend_from_slice(&seq.to_be_bytes());
    key.into()
}

/// The outcome of a write as returned to its client.
pub type WriteResult = Result<CommandResult, KeelError>;

/// The snapshot format written: v7 adds, last, the membership in force at the snapshot's
/// index and the version of the entry that set it (`Kv::membership`).
const SNAPSHOT_MAGIC: &[u8; 8] = b"KEELKV07";
/// The sixth format, still read: v6 adds, after the deduplication slots, the last use of
/// the newest session the table evicted (`Kv::sessions_evicted_through`).
const SNAPSHOT_MAGIC_V6: &[u8; 8] = b"KEELKV06";
/// The fifth format, still read: v5 adds collections (item flags 3 and 4).
const SNAPSHOT_MAGIC_V5: &[u8; 8] = b"KEELKV05";
/// The fourth format, still read: v4 adds an item form with an expiry (flag 2).
const SNAPSHOT_MAGIC_V4: &[u8; 8] = b"KEELKV04";
/// The third format, still read: v3 carries the deduplication bound in force at the
/// snapshot's index (the cluster's, from the log: `docs/protocol.md` §6).
const SNAPSHOT_MAGIC_V3: &[u8; 8] = b"KEELKV03";
/// The second format, still read: each dedup slot's command digest, no bound.
const SNAPSHOT_MAGIC_V2: &[u8; 8] = b"KEELKV02";
/// The first format, still read: dedup slots without a command digest.
const SNAPSHOT_MAGIC_V1: &[u8; 8] = b"KEELKV01";
/// A snapshot's membership (format v7): a flag, then the version of the entry that set it
/// (within the snapshot) and the membership.
fn decode_membership(
    reader: &mut Reader<'_>,
    at: Version,
) -> Result<Option<(Version, Membership)>, String> {
    let err = |e: keel_types::codec::CodecError| e.to_string();
    match reader.u8("membership flag").map_err(err)? {
        0 => Ok(None),
        1 => {
            let epoch = reader.u64("membership epoch").map_err(err)?;
            let version = Version::new(epoch, reader.u64("membership index").map_err(err)?);
            if version > at || version.index == LogIndex::ZERO {
                return Err(format!("a membership set at {version:?}, outside the snapshot"));
            }
            let membership =
                <Membership as keel_types::codec::Decode>::decode_from(reader).map_err(err)?;
            Ok(Some((version, membership)))
        }
        flag => Err(format!("membership flag {flag}")),
    }
}

/// What one key costs in a snapshot beyond its key and value bytes (lengths, version,
/// flag), rounded up.
pub const ITEM_OVERHEAD_BYTES: u64 = 32;
const RESULT_BYTES_MAX: u32 = 64 * 1024 * 1024;

/// A key's current value (`None`: a tombstone), the version of the write that set it,
/// and when it expires.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    /// The value if the key holds a string (`None`: a collection, or deleted).
    pub value: Option<Value>,
    /// The collection the key holds, if any (then `value` is `None`; never empty).
    pub coll: Option<super::coll::Coll>,
    /// The last write to the key.
    pub version: Version,
    /// When the leader deletes the key, in unix milliseconds (`None`: never; always
    /// `None` on a tombstone). The key stays until that deletion's entry is applied.
    pub expires_at: Option<u64>,
}

impl Item {
    /// A live value with no expiry, or a tombstone (`value: None`).
    pub(super) fn plain(value: Option<Value>, version: Version) -> Item {
        Item { value, coll: None, version, expires_at: None }
    }

    /// A string value with an expiry (or none).
    pub fn string(value: Option<Value>, version: Version, expires_at: Option<u64>) -> Item {
        Item { value, coll: None, version, expires_at }
    }

    /// Whether the key exists: it holds a string or a collection.
    pub fn live(&self) -> bool {
        self.value.is_some() || self.coll.is_some()
    }

    /// The string the key holds (`None`: absent or deleted), or `WRONGTYPE` if it holds
    /// a collection.
    pub fn string_value(&self) -> Result<Option<&Value>, KeelError> {
        match &self.coll {
            Some(_) => Err(KeelError::WrongType),
            None => Ok(self.value.as_ref()),
        }
    }
}

/// The last write result remembered for one client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DedupSlot {
    /// The client's latest applied request.
    pub request: RequestId,
    /// The log index of that request's entry.
    pub index: LogIndex,
    /// Its result, returned again to a retry.
    pub result: WriteResult,
    /// [`command_digest`] of its command: a retry must carry the same command (`None`:
    /// unknown, from a snapshot of the first format).
    pub digest: Option<u64>,
}

/// A deterministic 64-bit digest (FNV-1a) of a command's log encoding: two commands
/// with the same digest are, for deduplication's purpose, the same command. A
/// transaction's digest covers its operations, not its watched keys and versions: a
/// retried `EXEC` on a new connection follows a new `WATCH` (which may read other
/// versions, its first attempt's writes among them) and is still the same request.
pub fn command_digest(command: &Command) -> u64 {
    if let Some(timeless) = super::leading::timeless(command) {
        return command_digest(&timeless);
    }
    let mut bytes = Vec::with_capacity(64);
    match command {
        Command::Multi { ops, .. } => {
            let ops_only = Command::Multi { ops: ops.clone(), watch: Vec::new() };
            keel_types::codec::Encode::encode_to(&ops_only, &mut bytes);
        }
        _ => keel_types::codec::Encode::encode_to(command, &mut bytes),
    }
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash: u64, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[derive(Clone, Debug)]
pub(super) struct Undo {
    index: LogIndex,
    /// Each key the entry changed and what it held before, in the order of the changes
    /// (one for a single write; a transaction's, which may change a key twice). Inline
    /// for one, as `dedup` is: a write then allocates nothing for its undo record.
    keys: SmallVec<[(Key, Option<Item>); 1]>,
    dedup: SmallVec<[(ClientId, Option<DedupSlot>); 1]>,
    /// The deduplication bound before a settings entry changed it.
    dedup_clients_max: Option<usize>,
    /// `Kv::sessions_evicted_through` before an eviction raised it.
    evicted_through: Option<Version>,
    /// The membership before a membership entry changed it.
    membership: Option<Option<Arc<(Version, Membership)>>>,
    /// The epoch of the entry applied.
    epoch: Epoch,
}

impl Undo {
    /// The keys changed from the `from`th change on, each with what it held before.
    pub(super) fn changes_from(&self, from: usize) -> &[(Key, Option<Item>)] {
        &self.keys[from..]
    }
}

/// What applying a write entry produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Applied {
    /// A no-op entry.
    Noop,
    /// A write executed now (or a retry answered from the dedup table).
    Write(WriteResult),
}

/// A snapshot being encoded a slice at a time (see [`Kv::begin_snapshot`]).
#[derive(Clone, Debug)]
struct SnapshotCursor {
    /// The index the snapshot describes.
    at: LogIndex,
    /// Every key up to and including this one is encoded (`None`: none yet).
    done_through: Option<Key>,
    /// The items as of `at` of keys changed since and not yet encoded (`None`: the key
    /// was absent at `at`). Replace or hide the applied item of the same key.
    saved: BTreeMap<Key, Option<Item>>,
    /// Items still to encode (the header announced the total).
    remaining: u64,
    /// The dedup section as of `at`, encoded when the snapshot began.
    tail: Vec<u8>,
}

/// A counter of random reads: not part of the replicated state (a clone starts afresh).
#[derive(Debug, Default)]
struct Draws(std::sync::atomic::AtomicU64);

impl Clone for Draws {
    fn clone(&self) -> Draws {
        Draws::default()
    }
}

impl std::ops::Deref for Draws {
    type Target = std::sync::atomic::AtomicU64;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

/// The applied state of one node.
#[derive(Clone, Debug)]
pub struct Kv {
    pub(super) items: BTreeMap<Key, Item>,
    dedup: BTreeMap<ClientId, DedupSlot>,
    dedup_order: BTreeSet<(LogIndex, ClientId)>,
    undo: VecDeque<Undo>,
    undo_floor: LogIndex,
    pub(super) applied: Version,
    /// The deduplication bound in force: part of the replicated state, set by the log's
    /// settings entries (before the first one, the node's configured bound).
    dedup_clients_max: usize,
    /// `(expires_at, key)` of every live key with an expiry: what the leader's active
    /// expiry walks in time order, kept with `items` by [`Kv::account`].
    expiries: BTreeSet<(u64, Key)>,
    /// Live keys per database (`DBSIZE`), kept with `items` by [`Kv::account`].
    live_by_db: BTreeMap<u8, u64>,
    /// Wrapping sum of `item_hash` over `items`, kept current so that the digest of the
    /// applied state costs O(1) (the simulator asks after every step).
    items_hash: u64,
    /// Bytes of keys and values held, plus [`ITEM_OVERHEAD_BYTES`] per key (bounds the
    /// snapshot size through `Config::state_bytes_max`).
    state_bytes: u64,
    /// A snapshot being encoded, if any.
    snapshot: Option<SnapshotCursor>,
    /// Reads that chose at random so far (`SRANDMEMBER`): the seed of the next one.
    read_draws: Draws,
    /// At least the version of the last use of any session the deduplication table
    /// evicted (its index, with the epoch of the entry that evicted it: never lower than
    /// its own): an open stamped below it may be a late copy of an open whose session
    /// was used and forgotten since, and is refused (`Kv::open_is_stale`).
    sessions_evicted_through: Version,
    /// The membership the log set last and the version of its entry: part of the
    /// replicated state, in snapshots and undone with its entry. `None`: no entry set one,
    /// and the node's configured members are the voters.
    membership: Option<Arc<(Version, Membership)>>,
    /// The slot states the reserved keys hold, decoded (`kv_slots`; kept with `items` by
    /// [`Kv::account`]; derived: not in snapshots). Empty spares every request the check.
    pub(super) slot_cache: BTreeMap<u16, keel_types::slots::SlotState>,
    /// Changes whenever a slot state's item does (`Kv::slot_generation`); each state
    /// machine starts from a value no other in the process had.
    pub(super) slot_generation: u64,
    /// `(slot, key)` of every live key of database 0, built on a move's first need
    /// and kept with `items` by [`Kv::account`] from then on (derived: not in snapshots).
    pub(super) slot_index: Option<BTreeSet<(u16, Key)>>,
    /// Keyspace events recorded and not yet taken (`kv_events`); `None`: not recording.
    /// Not replicated state: each replica records what it applies.
    pub(super) events: Option<Vec<crate::engine::KeyEvent>>,
    /// For negative-control tests only (`Config::unsafe_skip_dedup`): apply every write
    /// entry, retries included.
    pub unsafe_skip_dedup: bool,
    /// For negative-control tests only (`Config::unsafe_accept_expired_sessions`): a
    /// session the table no longer holds is taken for a new one, as a plain client is.
    pub unsafe_accept_expired_sessions: bool,
    /// For negative-control tests only (`Config::unsafe_accept_stale_opens`): an open
    /// stamped below the last use of an evicted session reopens it all the same.
    pub unsafe_accept_stale_opens: bool,
    /// For negative-control tests only (`Config::unsafe_watch_ignores_deletes`): a
    /// watched key deleted since (a tombstone now) counts as unchanged.
    pub unsafe_watch_ignores_deletes: bool,
    /// For negative-control tests only (`Config::unsafe_slots_serve_held`).
    pub unsafe_serve_held: bool,
    /// For negative-control tests only (`Config::unsafe_slots_fill_overwrites`).
    pub unsafe_fill_overwrites: bool,
    /// For negative-control tests only (`Config::unsafe_slots_take_unasked`).
    pub unsafe_take_unasked: bool,
}

impl Kv {
    /// An empty state machine (nothing applied).
    pub fn new(dedup_clients_max: usize) -> Kv {
        assert!(dedup_clients_max > 0);
        Kv {
            items: BTreeMap::new(),
            dedup: BTreeMap::new(),
            dedup_order: BTreeSet::new(),
            undo: VecDeque::new(),
            undo_floor: LogIndex::ZERO,
            applied: Version::default(),
            dedup_clients_max,
            expiries: BTreeSet::new(),
            live_by_db: BTreeMap::new(),
            items_hash: 0,
            state_bytes: 0,
            snapshot: None,
            read_draws: Draws::default(),
            sessions_evicted_through: Version::default(),
            membership: None,
            slot_cache: BTreeMap::new(),
            slot_generation: super::kv_slots::fresh_generation(),
            slot_index: None,
            events: None,
            unsafe_skip_dedup: false,
            unsafe_accept_expired_sessions: false,
            unsafe_accept_stale_opens: false,
            unsafe_watch_ignores_deletes: false,
            unsafe_serve_held: false,
            unsafe_fill_overwrites: false,
            unsafe_take_unasked: false,
        }
    }

    /// The membership the log set last, with the version of its entry (`None`: none did).
    pub fn membership(&self) -> Option<&(Version, Membership)> {
        self.membership.as_deref()
    }

    /// The deduplication bound in force at the applied index.
    pub fn dedup_clients_max(&self) -> usize {
        self.dedup_clients_max
    }

    /// The last applied entry's index.
    pub fn applied_index(&self) -> LogIndex {
        self.applied.index
    }

    /// The lowest index the state can be rolled back to.
    pub fn undo_floor(&self) -> LogIndex {
        self.undo_floor
    }

    /// How many undo records are held.
    pub fn undo_len(&self) -> usize {
        self.undo.len()
    }

    /// Applies the next entry; returns what a client of that entry should be told.
    pub fn apply(&mut self, entry: &Entry) -> Applied {
        assert_eq!(entry.index, self.applied.index.next(), "apply out of order");
        assert!(entry.epoch >= self.applied.epoch, "apply epochs go backwards");
        let mut undo = Undo {
            index: entry.index,
            keys: SmallVec::new(),
            dedup: SmallVec::new(),
            dedup_clients_max: None,
            evicted_through: None,
            membership: None,
            epoch: entry.epoch,
        };
        let applied = match &entry.payload {
            EntryPayload::Noop => Applied::Noop,
            EntryPayload::Settings(settings) => {
                self.apply_settings(*settings, &mut undo);
                Applied::Noop
            }
            EntryPayload::Write { client, request, command, .. } => Applied::Write(
                self.apply_write(entry.version(), *client, *request, command, &mut undo),
            ),
            EntryPayload::Reap { now_ms, keys } => {
                self.reap(entry.version(), *now_ms, keys, &mut undo);
                Applied::Noop
            }
            EntryPayload::Membership(membership) => {
                assert!(membership.valid(), "an invalid membership applied: {membership:?}");
                let set = Arc::new((entry.version(), membership.clone()));
                undo.membership = Some(self.membership.replace(set));
                Applied::Noop
            }
        };
        self.applied = entry.version();
        self.undo.push_back(undo);
        applied
    }

    /// A leader's settings entry: from here on, every replica keeps at most the bound it
    /// names, evicting its oldest slots at once if the table holds more (recorded for
    /// rollback, as any eviction).
    fn apply_settings(&mut self, settings: keel_types::ApplySettings, undo: &mut Undo) {
        assert!(settings.valid(), "settings out of range: {settings:?}");
        let bound = settings.dedup_clients_max as usize;
        undo.dedup_clients_max = Some(self.dedup_clients_max);
        self.dedup_clients_max = bound;
        while self.dedup.len() > bound {
            let (_, oldest) = self.dedup_order.pop_first().expect("order mirrors the table");
            let evicted = self.dedup.remove(&oldest);
            assert!(evicted.is_some(), "order mirrors the table");
            self.evicted(oldest, evicted.as_ref(), undo);
            undo.dedup.push((oldest, evicted));
        }
        assert_eq!(self.dedup.len(), self.dedup_order.len());
    }

    fn apply_write(
        &mut self,
        version: Version,
        client: ClientId,
        request: RequestId,
        command: &Command,
        undo: &mut Undo,
    ) -> WriteResult {
        self.session_open(client, command)?;
        if let Command::Slot(_) = command {
            // Every step is idempotent, and a late copy of one changes nothing (`kv_slots`):
            // none is deduplicated, so no answer (a batch's images) is kept in the table.
            return self.execute(version, command, undo);
        }
        // The same request whether or not it was sent on by `ASK`.
        let digest = command_digest(command.unasked().0);
        let dedup = self.dedup.get(&client).filter(|_| !self.unsafe_skip_dedup);
        if let Some(slot) = dedup {
            if slot.request == request {
                if slot.digest.is_some_and(|d| d != digest) {
                    return Err(reused_request(client, request));
                }
                return slot.result.clone();
            }
            if slot.request > request {
                return Err(KeelError::InvalidArgument(format!(
                    "request {} of client {} is older than its last applied request",
                    request.0, client.0
                )));
            }
        }
        // Refused by a move of its slots (`kv_slots`): not done. A key whose home is
        // elsewhere is refused for good under this pair, so a late copy of the request
        // is not applied here should the slot come back; a refusal to wait
        // (`TRYAGAIN`) is not remembered, and the same request may be taken later.
        if let Err(refusal) = self.slot_check(command) {
            if matches!(refusal, KeelError::Redirect { .. }) {
                let result = Err(refusal.clone());
                let slot =
                    DedupSlot { request, index: version.index, result, digest: Some(digest) };
                self.remember(client, slot, undo);
            }
            return Err(refusal);
        }
        let result = self.execute(version, command.unasked().0, undo);
        self.remember(
            client,
            DedupSlot {
                request,
                index: version.index,
                result: result.clone(),
                digest: Some(digest),
            },
            undo,
        );
        result
    }

    /// Refuses a request of a session the table does not hold, unless it opens one: the
    /// session was forgotten (or never opened), so an earlier attempt of this request may
    /// have been applied and must not be applied again. The leader asks before appending,
    /// and every replica again when applying.
    pub fn session_open(&self, client: ClientId, command: &Command) -> Result<(), KeelError> {
        let expired = client.is_session()
            && !matches!(command, Command::OpenSession { .. })
            && !self.dedup.contains_key(&client)
            && !self.unsafe_accept_expired_sessions;
        if expired {
            Err(KeelError::SessionExpired)
        } else {
            Ok(())
        }
    }

    /// Executes one write (a transaction's operations one by one), recording its
    /// keyspace events if it succeeded.
    fn execute(&mut self, version: Version, command: &Command, undo: &mut Undo) -> WriteResult {
        let from = undo.keys.len();
        let result = self.execute_one(version, command, undo);
        if result.is_ok() && !matches!(command, Command::Multi { .. }) {
            self.note_command(command, undo, from);
        }
        result
    }

    fn execute_one(&mut self, version: Version, command: &Command, undo: &mut Undo) -> WriteResult {
        match command {
            Command::Multi { ops, watch } => return self.execute_multi(version, ops, watch, undo),
            Command::OpenSession { .. } => return Ok(CommandResult::Written { version }),
            Command::Enqueue { queue, value } => {
                return Ok(self.enqueue(version, queue, value, undo));
            }
            Command::Dequeue { queue } => return self.dequeue(version, queue, undo),
            Command::Set { key, value, cond, ttl, now_ms } => {
                return self.set(version, key, value, *cond, *ttl, *now_ms, undo);
            }
            Command::Expire { key, ttl, cond, now_ms } => {
                return Ok(self.expire(version, key, *ttl, *cond, *now_ms, undo));
            }
            Command::Flush { db } => return Ok(self.flush(version, *db, undo)),
            Command::Restore { key, image } => {
                let item = super::kv_image::decode(image, version)?;
                self.change(key.clone(), Some(item), undo);
                return Ok(CommandResult::Written { version });
            }
            Command::SwapDb { a, b } => return Ok(self.swap_db(version, *a, *b, undo)),
            Command::Slot(op) => return self.execute_slot(version, op, undo),
            Command::Modify { key, op, now_ms } => {
                return super::kv_strings::modify(self, version, key, op, *now_ms, undo);
            }
            Command::Coll { key, op } => {
                return super::kv_coll::execute(self, version, key, op, undo)
            }
            Command::Transfer { from, to, replace, remove_source } => {
                return super::kv_strings::transfer(
                    self,
                    version,
                    from,
                    to,
                    *replace,
                    *remove_source,
                    undo,
                );
            }
            _ => {}
        }
        let current = self.items.get(command.key());
        let current_value = match command {
            // A delete or a put replaces whatever the key holds.
            Command::Put { .. } | Command::Delete { .. } => None,
            _ => current.map(Item::string_value).transpose()?.flatten().cloned(),
        };
        // A write of a new value clears the key's expiry, as Redis's does; an increment
        // keeps it.
        let mut expires_at = None;
        let (new_value, result) = match command {
            Command::Put { value, .. } => (Some(value.clone()), CommandResult::Written { version }),
            Command::Delete { .. } => (None, CommandResult::Written { version }),
            Command::Cas { expected, new, .. } => {
                if *expected != current_value {
                    let found = current.map(|i| i.version);
                    return Ok(CommandResult::Cas {
                        swapped: false,
                        current: current_value,
                        version: found,
                    });
                }
                let result = CommandResult::Cas {
                    swapped: true,
                    current: current_value,
                    version: Some(version),
                };
                (Some(new.clone()), result)
            }
            Command::Incr { delta, .. } => {
                let value = incremented(current_value.as_deref(), *delta)?;
                expires_at = current.and_then(|i| i.expires_at);
                (Some(value.to_string().into()), CommandResult::Counter { value, version })
            }
            Command::Get { .. }
            | Command::Scan { .. }
            | Command::QueuePeek { .. }
            | Command::Inspect { .. }
            | Command::Fetch { .. }
            | Command::Count { .. }
            | Command::CollRead { .. } => {
                panic!("a read command in the log")
            }
            Command::Geo(_) => panic!("a geo operation in the log (refused at the door)"),
            Command::Cluster(_) => {
                panic!("a cluster change as a write (the leader appends its membership entry)")
            }
            Command::Multi { .. }
            | Command::OpenSession { .. }
            | Command::Enqueue { .. }
            | Command::Dequeue { .. }
            | Command::Set { .. }
            | Command::Expire { .. }
            | Command::Flush { .. }
            | Command::SwapDb { .. }
            | Command::Restore { .. }
            | Command::Modify { .. }
            | Command::Transfer { .. }
            | Command::Slot(_)
            | Command::Coll { .. } => unreachable!("executed above"),
            Command::Asking(..) => unreachable!("unwrapped when applied"),
        };
        let item = Item::string(new_value, version, expires_at);
        self.change(command.key().clone(), Some(item), undo);
        Ok(result)
    }

    /// `SET` with its options. An expiry at or before the command's time leaves a
    /// tombstone: the key was written and expired at once.
    #[allow(clippy::too_many_arguments)]
    fn set(
        &mut self,
        version: Version,
        key: &Key,
        value: &Value,
        cond: SetCond,
        ttl: Ttl,
        now_ms: u64,
        undo: &mut Undo,
    ) -> WriteResult {
        let current = self.items.get(key);
        // `SET` replaces a collection; its answer (`GET`'s) is then no string: the
        // collection's presence is what `NX` and `XX` ask about.
        let live = current.is_some_and(Item::live);
        let previous = current.and_then(|item| item.value.clone());
        let write = match cond {
            SetCond::Always => true,
            SetCond::IfAbsent => !live,
            SetCond::IfPresent => live,
        };
        if !write {
            let found = current.map(|item| item.version);
            return Ok(CommandResult::Cas { swapped: false, current: previous, version: found });
        }
        let expires_at = ttl.resolve(now_ms, current.and_then(|item| item.expires_at));
        let item = match expires_at {
            Some(at) if at <= now_ms => Item::plain(None, version),
            _ => Item::string(Some(value.clone()), version, expires_at),
        };
        self.change(key.clone(), Some(item), undo);
        Ok(CommandResult::Cas { swapped: true, current: previous, version: Some(version) })
    }

    /// `EXPIRE` and its kin: a new expiry (or none) for a live key when `cond` holds; one
    /// at or before the command's time deletes the key.
    fn expire(
        &mut self,
        version: Version,
        key: &Key,
        ttl: Ttl,
        cond: ExpireCond,
        now_ms: u64,
        undo: &mut Undo,
    ) -> CommandResult {
        let Some(current) = self.items.get(key).filter(|item| item.live()) else {
            let found = self.items.get(key).map(|item| item.version);
            return CommandResult::Cas { swapped: false, current: None, version: found };
        };
        let value = current.value.clone();
        let new = ttl.resolve(now_ms, current.expires_at);
        let changes = cond.holds(current.expires_at, new) && new != current.expires_at;
        if !changes {
            // An unchanged expiry that `cond` allows still counts as set (Redis answers 1).
            let set = cond.holds(current.expires_at, new);
            let found = Some(current.version);
            return CommandResult::Cas { swapped: set, current: value, version: found };
        }
        let item = match new {
            Some(at) if at <= now_ms => Item::plain(None, version),
            _ => {
                Item { value: value.clone(), coll: current.coll.clone(), version, expires_at: new }
            }
        };
        self.change(key.clone(), Some(item), undo);
        CommandResult::Cas { swapped: true, current: value, version: Some(version) }
    }

    /// The leader's expiry entry: each key still due at `now_ms` becomes a tombstone.
    fn reap(&mut self, version: Version, now_ms: u64, keys: &[Key], undo: &mut Undo) {
        for key in keys {
            let due = self.items.get(key).and_then(|item| item.expires_at);
            if due.is_some_and(|at| at <= now_ms) {
                self.change(key.clone(), Some(Item::plain(None, version)), undo);
                self.note_expired(key);
            }
        }
    }

    /// `FLUSHDB` (`db`) or `FLUSHALL` (`None`: every database and queue): every live key
    /// of it becomes a tombstone.
    fn flush(&mut self, version: Version, db: Option<u8>, undo: &mut Undo) -> CommandResult {
        let (start, end): (Key, Option<Key>) = match db {
            None | Some(0) => (Key::new(), None),
            Some(db) => {
                let (start, end) = keel_types::db_range(db);
                (start, Some(end))
            }
        };
        let range =
            (Bound::Included(&start[..]), end.as_deref().map_or(Bound::Unbounded, Bound::Excluded));
        let doomed: Vec<Key> = self
            .items
            .range::<[u8], _>(range)
            .filter(|(key, item)| {
                // Every database's keys and the queues; never the slot states, which say
                // where the keyspace's slots are, not what they hold.
                item.live()
                    && (db.is_none() || keel_types::db_of(key).map(|(d, _)| d) == db)
                    && !key.starts_with(keel_types::slots::SLOT_STATE_PREFIX)
            })
            .map(|(key, _)| key.clone())
            .collect();
        let keys = doomed.len() as u64;
        for key in doomed {
            self.change(key, Some(Item::plain(None, version)), undo);
        }
        CommandResult::Count { keys }
    }

    /// The live items of database `db`, by their names in the database.
    fn live_in_db(&self, db: u8) -> BTreeMap<Key, Item> {
        let (start, end): (Key, Option<Key>) = match db {
            0 => (Key::new(), None),
            db => {
                let (start, end) = keel_types::db_range(db);
                (start, Some(end))
            }
        };
        let range =
            (Bound::Included(&start[..]), end.as_deref().map_or(Bound::Unbounded, Bound::Excluded));
        self.items
            .range::<[u8], _>(range)
            .filter(|(_, item)| item.live())
            .filter_map(|(key, item)| match keel_types::db_of(key) {
                Some((d, name)) if d == db => Some((Key::copy_from_slice(name), item.clone())),
                _ => None,
            })
            .collect()
    }

    /// `SWAPDB a b` ([`Command::SwapDb`]): every name either database holds gets the
    /// other's item (value, collection, expiry) or a tombstone, at `version`.
    fn swap_db(&mut self, version: Version, a: u8, b: u8, undo: &mut Undo) -> CommandResult {
        if a == b {
            return CommandResult::Count { keys: 0 };
        }
        let (in_a, in_b) = (self.live_in_db(a), self.live_in_db(b));
        let names: BTreeSet<&Key> = in_a.keys().chain(in_b.keys()).collect();
        let mut keys = 0;
        for name in names {
            for (to, from) in [(a, &in_b), (b, &in_a)] {
                let item = match from.get(name) {
                    Some(item) => Item { version, ..item.clone() },
                    None => Item::plain(None, version),
                };
                self.change(keel_types::db_key(to, name), Some(item), undo);
                keys += 1;
            }
        }
        debug_assert_eq!(self.count(a), in_b.len() as u64, "database {a} holds {b}'s keys");
        debug_assert_eq!(self.count(b), in_a.len() as u64, "database {b} holds {a}'s keys");
        CommandResult::Count { keys }
    }

    /// A key's item, tombstones included.
    pub(super) fn item(&self, key: &[u8]) -> Option<&Item> {
        self.items.get(key)
    }

    /// Live keys of database `db`.
    pub fn count(&self, db: u8) -> u64 {
        self.live_by_db.get(&db).copied().unwrap_or(0)
    }

    /// The earliest expiry of a live key, if any.
    pub fn next_expiry(&self) -> Option<u64> {
        self.expiries.first().map(|(at, _)| *at)
    }

    /// Up to `max` keys whose expiry is at or before `now_ms`, earliest first.
    pub fn due_keys(&self, now_ms: u64, max: usize) -> Vec<Key> {
        let due = self.expiries.iter().take_while(|(at, _)| *at <= now_ms);
        due.take(max).map(|(_, key)| key.clone()).collect()
    }

    /// A key's expiry (`None`: none, or the key is absent).
    pub fn expires_at(&self, key: &[u8]) -> Option<u64> {
        self.items.get(key).and_then(|item| item.expires_at)
    }

    /// Sets `key`'s item (`None`: removes the key, leaving no tombstone), recording
    /// what it held for the undo record.
    pub(super) fn change(&mut self, key: Key, item: Option<Item>, undo: &mut Undo) {
        let previous = self.replace(key.clone(), item);
        undo.keys.push((key, previous));
    }

    /// Sets `key`'s item (`None`: removes it) and returns what it held, keeping the
    /// digest, byte count and expiry index with the items (the old item's share out
    /// before the new one's in: the two may share an expiry).
    pub(super) fn replace(&mut self, key: Key, item: Option<Item>) -> Option<Item> {
        self.before_change(&key);
        let previous = match item {
            Some(item) => {
                let previous = self.items.insert(key.clone(), item);
                if let Some(previous) = &previous {
                    self.account(&key, previous, false);
                }
                let inserted = self.items.get(&key).expect("just inserted").clone();
                self.account(&key, &inserted, true);
                previous
            }
            None => {
                let previous = self.items.remove(&key);
                if let Some(previous) = &previous {
                    self.account(&key, previous, false);
                }
                previous
            }
        };
        previous
    }

    /// The name of a queue holding elements whose name is of a slot in `first..=last`, if
    /// any: queues do not move with their slots (`kv_slots`). Walks the queues' keys.
    pub(super) fn queue_in_slots(&self, first: u16, last: u16) -> Option<Key> {
        let start = Key::from_static(RESERVED_KEY_PREFIX);
        let end = Key::from_static(keel_types::slots::SLOT_STATE_PREFIX);
        self.items.range(start..end).find_map(|(key, item)| {
            let rest = &key[RESERVED_KEY_PREFIX.len()..];
            let len = u32::from_be_bytes(rest.get(..4)?.try_into().ok()?) as usize;
            // A meta key is the prefix, the name's length and the name: nothing after.
            let name = rest.get(4..).filter(|name| name.len() == len)?;
            let slot = keel_types::slots::key_slot(name);
            let occupied = QueueMeta::of(item.value.as_deref()).len() > 0;
            (occupied && (first..=last).contains(&slot)).then(|| Key::copy_from_slice(name))
        })
    }

    /// A queue's head and next sequence numbers, from its meta key (a queue never used
    /// starts at 1). A meta value of the wrong shape (only a damaged snapshot could hold
    /// one) reads as an empty queue at 1.
    fn queue_meta(&self, queue: &[u8]) -> QueueMeta {
        let item = self.items.get(&queue_meta_key(queue)[..]);
        QueueMeta::of(item.and_then(|item| item.value.as_deref()))
    }

    fn set_queue_meta(&mut self, queue: &[u8], meta: QueueMeta, version: Version, undo: &mut Undo) {
        let item = Item::plain(Some(meta.encode()), version);
        self.change(queue_meta_key(queue), Some(item), undo);
    }

    fn enqueue(
        &mut self,
        version: Version,
        queue: &[u8],
        value: &Value,
        undo: &mut Undo,
    ) -> CommandResult {
        let meta = self.queue_meta(queue);
        let seq = meta.next;
        let item = Item::plain(Some(value.clone()), version);
        self.change(queue_item_key(queue, seq), Some(item), undo);
        let meta = QueueMeta { head: meta.head, next: seq.saturating_add(1) };
        self.set_queue_meta(queue, meta, version, undo);
        CommandResult::Enqueued { seq, length: meta.len(), version }
    }

    /// Removes the head element (its key goes without a tombstone: a queue's reads go
    /// through its meta key, whose version is that of the queue's last operation).
    fn dequeue(&mut self, version: Version, queue: &[u8], undo: &mut Undo) -> WriteResult {
        let meta = self.queue_meta(queue);
        if meta.len() == 0 {
            return Ok(CommandResult::Dequeued { head: None, remaining: 0, version });
        }
        let key = queue_item_key(queue, meta.head);
        let Some(value) = self.items.get(&key).and_then(|item| item.value.clone()) else {
            return Err(KeelError::InvalidArgument(format!(
                "queue state damaged: element {} missing",
                meta.head
            )));
        };
        self.change(key, None, undo);
        let after = QueueMeta { head: meta.head + 1, next: meta.next };
        self.set_queue_meta(queue, after, version, undo);
        Ok(CommandResult::Dequeued {
            head: Some((meta.head, value)),
            remaining: after.len(),
            version,
        })
    }

    /// A queue's head, length and next sequence number, and the index that must be
    /// durable to serve them (its last operation's).
    pub fn queue_peek(&self, queue: &[u8]) -> (CommandResult, LogIndex) {
        let meta_item = self.items.get(&queue_meta_key(queue)[..]);
        let meta = QueueMeta::of(meta_item.and_then(|item| item.value.as_deref()));
        let version = meta_item.map(|item| item.version);
        let head = match meta.len() {
            0 => None,
            _ => self
                .items
                .get(&queue_item_key(queue, meta.head)[..])
                .and_then(|item| item.value.clone())
                .map(|value| (meta.head, value)),
        };
        let result = CommandResult::Queue { head, length: meta.len(), next: meta.next, version };
        (result, version.map_or(LogIndex::ZERO, |v| v.index))
    }

    /// A transaction: nothing if a watched key's version changed; else every operation
    /// in order at the entry's version, reads seeing the writes before them, and if one
    /// fails, the changes of those before it undone and its error returned (all or none).
    fn execute_multi(
        &mut self,
        version: Version,
        ops: &[Command],
        watch: &[(Key, Option<Version>)],
        undo: &mut Undo,
    ) -> WriteResult {
        if watch.iter().any(|(key, seen)| !self.watch_holds(key, *seen)) {
            return Ok(CommandResult::Multi { results: None });
        }
        let start = undo.keys.len();
        let events_before = self.events_len();
        let mut results = Vec::with_capacity(ops.len());
        for op in ops {
            let result = match op {
                // Inside a transaction, a collection reads as no string (`MGET`'s
                // answer) rather than failing the whole entry.
                Command::Get { key } => Ok(self.read_string(key).unwrap_or_else(|_| {
                    CommandResult::Value { value: None, version: Some(self.items[key].version) }
                })),
                Command::CollRead { key, op } => {
                    super::kv_coll::read(self, key, op, version.index.0).0
                }
                write => self.execute(version, write, undo),
            };
            match result {
                Ok(result) => results.push(result),
                Err(error) => {
                    self.truncate_events(events_before);
                    let done: Vec<_> = undo.keys.drain(start..).collect();
                    for (key, previous) in done.into_iter().rev() {
                        self.put_back(key, previous);
                    }
                    return Err(error);
                }
            }
        }
        Ok(CommandResult::Multi { results: Some(results) })
    }

    /// Whether `key` still has the version `WATCH` saw (`None`: never written). Any write
    /// since changed it, a delete included: a delete leaves a tombstone with its own
    /// version, and tombstones are never collected (`docs/protocol.md` §6, *Transactions*).
    fn watch_holds(&self, key: &[u8], seen: Option<Version>) -> bool {
        let now = self.items.get(key);
        if self.unsafe_watch_ignores_deletes && now.is_some_and(|item| !item.live()) {
            return true;
        }
        now.map(|item| item.version) == seen
    }

    /// Puts `previous` back as `key`'s item (`None`: removes it), undoing one change.
    fn put_back(&mut self, key: Key, previous: Option<Item>) {
        // The current item is absent when the change undone removed the key (a dequeued
        // element).
        self.replace(key, previous);
    }

    fn remember(&mut self, client: ClientId, slot: DedupSlot, undo: &mut Undo) {
        let index = slot.index;
        let previous = self.dedup.insert(client, slot);
        if let Some(previous) = &previous {
            self.dedup_order.remove(&(previous.index, client));
        }
        self.dedup_order.insert((index, client));
        undo.dedup.push((client, previous));
        if self.dedup.len() > self.dedup_clients_max {
            let (_, oldest) = self.dedup_order.pop_first().expect("order mirrors the table");
            let evicted = self.dedup.remove(&oldest);
            assert!(evicted.is_some() && oldest != client, "evicted the newest client");
            self.evicted(oldest, evicted.as_ref(), undo);
            undo.dedup.push((oldest, evicted));
        }
        assert_eq!(self.dedup.len(), self.dedup_order.len());
    }

    /// Notes that `client`'s slot was evicted: a session's last use raises
    /// [`Kv::sessions_evicted_through`] (recorded for rollback).
    fn evicted(&mut self, client: ClientId, slot: Option<&DedupSlot>, undo: &mut Undo) {
        let Some(slot) = slot.filter(|_| client.is_session()) else { return };
        let used = Version { epoch: undo.epoch, index: slot.index };
        if used > self.sessions_evicted_through {
            undo.evicted_through.get_or_insert(self.sessions_evicted_through);
            self.sessions_evicted_through = used;
        }
    }

    /// Whether `command` opens a session the table does not hold, stamped (`seen`) below
    /// the last use of a session the table evicted: possibly a late copy of an open whose
    /// session was used and forgotten since, which must not reopen it. The leader refuses
    /// such an open before appending it (`SessionExpired`); replicas apply what the log
    /// holds.
    pub fn open_is_stale(&self, client: ClientId, command: &Command) -> bool {
        let Command::OpenSession { seen: Some(seen) } = command else { return false };
        !self.unsafe_accept_stale_opens
            && !self.dedup.contains_key(&client)
            && *seen < self.sessions_evicted_through
    }

    /// Undoes every applied entry after `index`. Panics if that reaches below the undo
    /// floor: entries at or below the durable index are never truncated.
    /// `epoch` is the epoch of the entry at `index`, which becomes the applied version.
    pub fn rollback_after(&mut self, index: LogIndex, epoch: Epoch) {
        assert!(index >= self.undo_floor, "rollback below the durable index {}", self.undo_floor);
        if self.applied.index <= index {
            return;
        }
        while self.undo.back().is_some_and(|u| u.index > index) {
            let undo = self.undo.pop_back().expect("checked");
            self.restore(undo);
        }
        assert_eq!(self.applied.index, index, "undo records missing above {index}");
        assert!(epoch <= self.applied.epoch, "rollback to a newer epoch");
        self.applied.epoch = epoch;
    }

    fn restore(&mut self, undo: Undo) {
        assert_eq!(undo.index, self.applied.index, "undo out of order");
        for (key, previous) in undo.keys.into_iter().rev() {
            self.put_back(key, previous);
        }
        for (client, previous) in undo.dedup.into_iter().rev() {
            if let Some(current) = self.dedup.remove(&client) {
                self.dedup_order.remove(&(current.index, client));
            }
            if let Some(previous) = previous {
                self.dedup_order.insert((previous.index, client));
                self.dedup.insert(client, previous);
            }
        }
        if let Some(bound) = undo.dedup_clients_max {
            self.dedup_clients_max = bound;
        }
        if let Some(through) = undo.evicted_through {
            self.sessions_evicted_through = through;
        }
        if let Some(membership) = undo.membership {
            self.membership = membership;
        }
        let prior = self.undo.back().map(|u| u.index).unwrap_or(self.undo_floor);
        // The epoch is set by `rollback_after` once the target is reached.
        self.applied.index = prior;
    }

    /// Called before `key`'s item changes: a snapshot being encoded that has not reached
    /// the key yet keeps its item as of the snapshot index (once; later changes do not
    /// alter what the key was then).
    fn before_change(&mut self, key: &Key) {
        let Some(cursor) = &mut self.snapshot else { return };
        let pending = cursor.done_through.as_ref().is_none_or(|done| key > done);
        if pending && !cursor.saved.contains_key(key) {
            cursor.saved.insert(key.clone(), self.items.get(key).cloned());
        }
    }

    /// Adds (or removes) an item's share of the running digest and byte count.
    fn account(&mut self, key: &[u8], item: &Item, add: bool) {
        self.account_slots(key, item, add);
        let hash = item_hash(key, item);
        let bytes = item_bytes(key, item);
        if let Some(db) = item.live().then(|| keel_types::db_of(key)).flatten().map(|(db, _)| db) {
            let live = self.live_by_db.entry(db).or_default();
            *live =
                if add { *live + 1 } else { live.checked_sub(1).expect("counts mirror the items") };
        }
        if let Some(at) = item.expires_at {
            let entry = (at, Key::copy_from_slice(key));
            let changed =
                if add { self.expiries.insert(entry) } else { self.expiries.remove(&entry) };
            assert!(changed, "the expiry index mirrors the items");
        }
        if add {
            self.items_hash = self.items_hash.wrapping_add(hash);
            self.state_bytes += bytes;
        } else {
            self.items_hash = self.items_hash.wrapping_sub(hash);
            self.state_bytes =
                self.state_bytes.checked_sub(bytes).expect("byte count mirrors the items");
        }
    }

    /// Bytes the items take (keys, values and per-key overhead).
    pub fn state_bytes(&self) -> u64 {
        self.state_bytes
    }

    /// Drops undo records for entries at or below `index` (now durable: never rolled back).
    pub fn forget_undo_through(&mut self, index: LogIndex) {
        let index = index.min(self.applied.index);
        while self.undo.front().is_some_and(|u| u.index <= index) {
            self.undo.pop_front();
        }
        self.undo_floor = self.undo_floor.max(index);
        assert!(self.undo.front().is_none_or(|u| u.index > self.undo_floor));
    }

    /// `GET`'s answer: the key's string value and version, or `WRONGTYPE` if it holds a
    /// collection.
    pub fn read_string(&self, key: &[u8]) -> WriteResult {
        match self.items.get(key) {
            Some(item) => {
                let value = item.string_value()?.cloned();
                Ok(CommandResult::Value { value, version: Some(item.version) })
            }
            None => Ok(CommandResult::Value { value: None, version: None }),
        }
    }

    /// Serves a collection read ([`super::kv_coll::read`]); its random picks draw from a
    /// counter of this replica's reads, so a repeated `SRANDMEMBER` varies.
    pub fn read_coll(&self, key: &Key, op: &keel_types::coll::CollRead) -> (WriteResult, LogIndex) {
        let draw = self.read_draws.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let seed = draw ^ self.applied.index.0.rotate_left(32);
        super::kv_coll::read(self, key, op, seed)
    }

    /// A key's value (`None`: absent, deleted or a collection) and the version that
    /// produced it.
    pub fn get(&self, key: &[u8]) -> (Option<Value>, Option<Version>) {
        match self.items.get(key) {
            Some(item) => (item.value.clone(), Some(item.version)),
            None => (None, None),
        }
    }

    /// Whether `key` holds a collection.
    pub fn holds_collection(&self, key: &[u8]) -> bool {
        self.items.get(key).is_some_and(|item| item.coll.is_some())
    }

    /// The index of the last write to `key` (tombstones included; 0 if never written).
    pub fn update_index(&self, key: &[u8]) -> LogIndex {
        self.items.get(key).map_or(LogIndex::ZERO, |i| i.version.index)
    }

    /// Up to `limit` live items in `[start, end)`, and the highest update index over the
    /// keys the scan passed, tombstones included (what must be durable to serve it).
    pub fn scan(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: u32,
    ) -> (Vec<(Key, Value, Version)>, LogIndex) {
        let mut items = Vec::new();
        let mut needed = LogIndex::ZERO;
        let limit = usize::try_from(limit).expect("fits");
        let mut range = self.items.range::<[u8], _>((Bound::Included(start), Bound::Unbounded));
        while let Some((key, item)) = range.next() {
            if end.is_some_and(|end| &key[..] >= end) || items.len() >= limit {
                break;
            }
            if key.starts_with(RESERVED_KEY_PREFIX) {
                // Queues' keys are never scanned: on past them.
                let from = Bound::Included(RESERVED_KEY_END);
                range = self.items.range::<[u8], _>((from, Bound::Unbounded));
                continue;
            }
            if key.starts_with(DB_KEY_PREFIX) && !start.starts_with(DB_KEY_PREFIX) {
                // A scan of database 0 passes over the other databases' keys.
                let from = Bound::Included(DB_KEYS_END);
                range = self.items.range::<[u8], _>((from, Bound::Unbounded));
                continue;
            }
            needed = needed.max(item.version.index);
            if let Some(value) = &item.value {
                items.push((key.clone(), value.clone(), item.version));
            } else if item.coll.is_some() {
                // A collection's key is listed (`KEYS`, `SCAN`) with no value.
                items.push((key.clone(), Value::new(), item.version));
            }
        }
        assert!(items.len() <= limit);
        (items, needed)
    }

    /// The remembered result of a client's request, if it is the client's latest.
    pub fn dedup(&self, client: ClientId) -> Option<&DedupSlot> {
        self.dedup.get(&client)
    }

    /// The state as of `index` (between the undo floor and the applied index), as the
    /// undo records overlay it on the applied state: the items that differ (keys in
    /// order), and the dedup slots in client order. Costs O(entries undone) plus the
    /// dedup table, never a copy of the key index.
    fn overlay_at(&self, index: LogIndex) -> (KeyOverlay<'_>, Vec<(&ClientId, &DedupSlot)>) {
        assert!(
            index >= self.undo_floor && index <= self.applied.index,
            "state at {index} unreachable"
        );
        let mut key_overlay: KeyOverlay<'_> = BTreeMap::new();
        let mut dedup_overlay: BTreeMap<&ClientId, Option<&DedupSlot>> = BTreeMap::new();
        for undo in self.undo.iter().rev().take_while(|u| u.index > index) {
            for (key, previous) in undo.keys.iter().rev() {
                key_overlay.insert(key, previous.as_ref());
            }
            for (client, previous) in undo.dedup.iter().rev() {
                dedup_overlay.insert(client, previous.as_ref());
            }
        }
        let mut slots: Vec<(&ClientId, &DedupSlot)> = Vec::new();
        let mut clients: BTreeSet<&ClientId> = self.dedup.keys().collect();
        clients.extend(dedup_overlay.keys().copied());
        for client in clients {
            let slot = match dedup_overlay.get(client) {
                Some(previous) => *previous,
                None => self.dedup.get(client),
            };
            if let Some(slot) = slot {
                slots.push((client, slot));
            }
        }
        (key_overlay, slots)
    }

    /// The deduplication bound in force at `index` (between the undo floor and the
    /// applied index): the bound before the oldest settings entry above it, if any.
    fn dedup_clients_max_at(&self, index: LogIndex) -> usize {
        let above = self.undo.iter().rev().take_while(|u| u.index > index);
        above.filter_map(|u| u.dedup_clients_max).last().unwrap_or(self.dedup_clients_max)
    }

    /// [`Kv::sessions_evicted_through`] at `index` (between the undo floor and the applied
    /// index): its value before the oldest eviction above it that raised it, if any.
    fn evicted_through_at(&self, index: LogIndex) -> Version {
        let above = self.undo.iter().rev().take_while(|u| u.index > index);
        above.filter_map(|u| u.evicted_through).last().unwrap_or(self.sessions_evicted_through)
    }

    /// [`Kv::membership`] at `index` (between the undo floor and the applied index): the
    /// one before the oldest membership entry above it, if any.
    fn membership_at(&self, index: LogIndex) -> Option<&(Version, Membership)> {
        let above = self.undo.iter().rev().take_while(|u| u.index > index);
        match above.filter_map(|u| u.membership.as_ref()).last() {
            Some(before) => before.as_deref(),
            None => self.membership(),
        }
    }

    /// Visits the items as of the state `overlay` describes, in key order: a merge of the
    /// applied items with the overlay (an overlay entry replaces or hides the applied one).
    fn visit_items_at<'a>(
        &'a self,
        overlay: &KeyOverlay<'a>,
        mut visit: impl FnMut(&'a Key, &'a Item),
    ) {
        let mut applied = self.items.iter().peekable();
        let mut overlay = overlay.iter().peekable();
        loop {
            let take_applied = match (applied.peek(), overlay.peek()) {
                (None, None) => break,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (Some((a, _)), Some((o, _))) => a < *o,
            };
            if take_applied {
                let (key, item) = applied.next().expect("peeked");
                visit(key, item);
            } else {
                let (key, previous) = overlay.next().expect("peeked");
                if applied.peek().is_some_and(|(a, _)| a == key) {
                    applied.next();
                }
                if let Some(item) = previous {
                    visit(key, item);
                }
            }
        }
    }

    /// The snapshot encoding of the state as of `index` (see `docs/protocol.md`), in one
    /// go. The buffer is sized exactly before it is written: a snapshot is as large as the
    /// state, so growing it by doubling would copy it and hold up to twice its size.
    pub fn encode_at(&self, index: LogIndex) -> Vec<u8> {
        let (mut cursor, header) = self.snapshot_cursor(index);
        let (overlay, _) = self.overlay_at(index);
        let mut len = header.len() + cursor.tail.len();
        self.visit_items_at(&overlay, |key, item| len += encoded_item_bytes(key, item));
        let mut out = Vec::with_capacity(len);
        out.extend_from_slice(&header);
        let done = advance_snapshot(&self.items, &mut cursor, usize::MAX, &mut out);
        assert!(done, "an unbounded slice encodes everything");
        debug_assert_eq!(out.len(), len, "the snapshot size is computed exactly");
        out
    }

    /// Starts encoding the state as of `index` (between the undo floor and the applied
    /// index) a slice at a time; returns the header. Writes may be applied and rolled back
    /// (never below `index`) while it runs. Replaces a snapshot already in progress.
    pub fn begin_snapshot(&mut self, index: LogIndex) -> Vec<u8> {
        let (cursor, header) = self.snapshot_cursor(index);
        self.snapshot = Some(cursor);
        header
    }

    /// Appends the next slice of the snapshot in progress to `out`: items until at least
    /// `budget` bytes were added or the items run out, then the dedup section. Returns
    /// whether the snapshot is complete (it is then no longer in progress). Panics if
    /// none is in progress.
    pub fn continue_snapshot(&mut self, budget: usize, out: &mut Vec<u8>) -> bool {
        let mut cursor = self.snapshot.take().expect("a snapshot in progress");
        let done = advance_snapshot(&self.items, &mut cursor, budget, out);
        if !done {
            self.snapshot = Some(cursor);
        }
        done
    }

    /// The index of the snapshot being encoded, if any.
    pub fn snapshot_in_progress(&self) -> Option<LogIndex> {
        self.snapshot.as_ref().map(|c| c.at)
    }

    /// Abandons the snapshot in progress, if any.
    pub fn abort_snapshot(&mut self) {
        self.snapshot = None;
    }

    /// A cursor over the state as of `index`, and the snapshot header (magic, index and
    /// item count). Costs O(entries above `index`) plus the dedup table.
    fn snapshot_cursor(&self, index: LogIndex) -> (SnapshotCursor, Vec<u8>) {
        let (overlay, slots) = self.overlay_at(index);
        let mut count = self.items.len() as u64;
        for (key, then) in &overlay {
            let now = self.items.contains_key(*key);
            match (then.is_some(), now) {
                (true, false) => count += 1,
                (false, true) => count -= 1,
                _ => {}
            }
        }
        let mut tail = Vec::new();
        let bound = self.dedup_clients_max_at(index);
        put_u32(&mut tail, u32::try_from(bound).expect("the bound is under its ceiling"));
        put_u32(&mut tail, u32::try_from(slots.len()).expect("dedup table is bounded"));
        for (client, slot) in &slots {
            put_u64(&mut tail, client.0);
            put_u64(&mut tail, slot.request.0);
            put_u64(&mut tail, slot.index.0);
            put_bytes(&mut tail, &serde_json::to_vec(&slot.result).expect("results serialize"));
            match slot.digest {
                Some(digest) => {
                    put_u8(&mut tail, 1);
                    put_u64(&mut tail, digest);
                }
                None => put_u8(&mut tail, 0),
            }
        }
        let evicted_through = self.evicted_through_at(index);
        put_u64(&mut tail, evicted_through.epoch.0);
        put_u64(&mut tail, evicted_through.index.0);
        match self.membership_at(index) {
            None => put_u8(&mut tail, 0),
            Some((version, membership)) => {
                put_u8(&mut tail, 1);
                put_u64(&mut tail, version.epoch.0);
                put_u64(&mut tail, version.index.0);
                keel_types::codec::Encode::encode_to(membership, &mut tail);
            }
        }
        let mut header = Vec::with_capacity(SNAPSHOT_MAGIC.len() + 16);
        header.extend_from_slice(SNAPSHOT_MAGIC);
        put_u64(&mut header, index.0);
        put_u64(&mut header, count);
        let saved = overlay.into_iter().map(|(k, then)| (k.clone(), then.cloned())).collect();
        let cursor =
            SnapshotCursor { at: index, done_through: None, saved, remaining: count, tail };
        (cursor, header)
    }

    /// Rebuilds the state a snapshot at `at` describes. Corrupt bytes are a storage
    /// failure: the caller stops the node (or, for a leader's snapshot, drops it).
    ///
    /// The deduplication bound is the snapshot's own (format v3), whatever this node is
    /// configured with: it is the cluster's, from the log. A snapshot of an older format
    /// carries none; it decodes with `configured`, raised to its slot count if that is
    /// larger, so that no node's configuration makes a snapshot undecodable.
    pub fn decode(bytes: &[u8], at: Version, configured: usize) -> Result<Kv, String> {
        let mut reader = Reader::new(bytes);
        let err = |e: keel_types::codec::CodecError| e.to_string();
        let magic = reader.take("magic", 8).map_err(err)?;
        let with_bound = [
            SNAPSHOT_MAGIC,
            SNAPSHOT_MAGIC_V6,
            SNAPSHOT_MAGIC_V5,
            SNAPSHOT_MAGIC_V4,
            SNAPSHOT_MAGIC_V3,
        ];
        let (with_digests, with_bound) = if with_bound.iter().any(|m| magic == *m) {
            (true, true)
        } else if magic == SNAPSHOT_MAGIC_V2 {
            (true, false)
        } else if magic == SNAPSHOT_MAGIC_V1 {
            (false, false)
        } else {
            return Err("not a Keel state snapshot".into());
        };
        let index = reader.u64("index").map_err(err)?;
        if index != at.index.0 {
            return Err(format!("snapshot encodes index {index}, meta says {}", at.index));
        }
        let mut kv = Kv::new(configured);
        let count = reader.u64("item count").map_err(err)?;
        for _ in 0..count.min(reader.remaining()) {
            let key = reader.bytes("key", u32::MAX).map_err(err)?;
            let version =
                Version::new(reader.u64("epoch").map_err(err)?, reader.u64("index").map_err(err)?);
            let expiring =
                [SNAPSHOT_MAGIC, SNAPSHOT_MAGIC_V6, SNAPSHOT_MAGIC_V5, SNAPSHOT_MAGIC_V4]
                    .iter()
                    .any(|m| magic == *m);
            let (mut value, mut coll, mut expires_at) = (None, None, None);
            match reader.u8("item flag").map_err(err)? {
                0 => {}
                1 => value = Some(reader.bytes("value", u32::MAX).map_err(err)?),
                2 if expiring => {
                    value = Some(reader.bytes("value", u32::MAX).map_err(err)?);
                    expires_at = Some(reader.u64("expiry").map_err(err)?);
                }
                flag @ (3 | 4)
                    if [SNAPSHOT_MAGIC, SNAPSHOT_MAGIC_V6, SNAPSHOT_MAGIC_V5]
                        .iter()
                        .any(|m| magic == *m) =>
                {
                    coll = Some(super::coll::Coll::decode(&mut reader)?);
                    if flag == 4 {
                        expires_at = Some(reader.u64("expiry").map_err(err)?);
                    }
                }
                flag => return Err(format!("item flag {flag}")),
            };
            if version.index > at.index
                || version.epoch > at.epoch
                || version.index == LogIndex::ZERO
            {
                return Err(format!("an item's version {version:?} is outside the snapshot"));
            }
            if kv.items.last_key_value().is_some_and(|(last, _)| *last >= key) {
                return Err("items are not in strictly increasing key order".into());
            }
            let item = Item { value, coll, version, expires_at };
            kv.account(&key, &item, true);
            kv.items.insert(key, item);
        }
        let slots = kv.decode_dedup_bound(&mut reader, with_bound, configured)?;
        for _ in 0..slots {
            let client = ClientId(reader.u64("client").map_err(err)?);
            let request = RequestId(reader.u64("request").map_err(err)?);
            let index = LogIndex(reader.u64("dedup index").map_err(err)?);
            let result = reader.bytes("result", RESULT_BYTES_MAX).map_err(err)?;
            let result: WriteResult = serde_json::from_slice(&result).map_err(|e| e.to_string())?;
            let digest = match with_digests {
                false => None,
                true => match reader.u8("digest flag").map_err(err)? {
                    0 => None,
                    1 => Some(reader.u64("digest").map_err(err)?),
                    tag => return Err(format!("digest flag {tag}")),
                },
            };
            if index > at.index || index == LogIndex::ZERO {
                return Err(format!("a dedup slot at {index} is outside the snapshot"));
            }
            if kv.dedup.contains_key(&client) {
                return Err(format!("client {} has two dedup slots", client.0));
            }
            kv.dedup_order.insert((index, client));
            kv.dedup.insert(client, DedupSlot { request, index, result, digest });
        }
        kv.sessions_evicted_through = match magic == SNAPSHOT_MAGIC || magic == SNAPSHOT_MAGIC_V6 {
            true => {
                let epoch = reader.u64("sessions evicted through").map_err(err)?;
                let through = Version::new(epoch, reader.u64("and its index").map_err(err)?);
                if through > at {
                    return Err(format!("sessions evicted through {through:?}, past the snapshot"));
                }
                through
            }
            // An older snapshot does not say; every slot evicted was the oldest then, so
            // none was used after the oldest slot held now, nor in a later epoch than
            // the snapshot's: a bound that errs towards refusing an open.
            false => kv.dedup_order.first().map_or(Version::default(), |(index, _)| Version {
                epoch: at.epoch,
                index: *index,
            }),
        };
        if magic == SNAPSHOT_MAGIC {
            kv.membership = decode_membership(&mut reader, at)?.map(Arc::new);
        }
        reader.finish().map_err(err)?;
        kv.applied = at;
        kv.undo_floor = at.index;
        Ok(kv)
    }

    /// Reads a snapshot's deduplication bound (format v3; before it, `configured` raised
    /// to the slot count) and its slot count, which the bound must hold; sets the bound.
    fn decode_dedup_bound(
        &mut self,
        reader: &mut Reader<'_>,
        with_bound: bool,
        configured: usize,
    ) -> Result<u32, String> {
        let err = |e: keel_types::codec::CodecError| e.to_string();
        let bound = match with_bound {
            true => {
                let settings = keel_types::ApplySettings {
                    dedup_clients_max: reader.u32("dedup bound").map_err(err)?,
                };
                if !settings.valid() {
                    return Err(format!("a dedup bound of {}", settings.dedup_clients_max));
                }
                Some(settings.dedup_clients_max as usize)
            }
            false => None,
        };
        let slots = reader.u32("dedup count").map_err(err)?;
        if slots > keel_types::limits::DEDUP_CLIENTS_CEILING {
            return Err(format!("{slots} dedup slots, more than any bound allows"));
        }
        self.dedup_clients_max = bound.unwrap_or(configured.max(slots as usize));
        if slots as usize > self.dedup_clients_max {
            let bound = self.dedup_clients_max;
            return Err(format!("{slots} dedup slots, more than the snapshot's bound {bound}"));
        }
        Ok(slots)
    }

    /// A deterministic 64-bit digest of the items as of `index` (`fnv::WordHash` per item, summed,
    /// mixed with the index). Equal states at equal indexes give equal digests.
    pub fn digest_at(&self, index: LogIndex) -> u64 {
        if index == self.applied.index {
            return self.applied_digest();
        }
        let (overlay, _) = self.overlay_at(index);
        let mut sum = 0u64;
        self.visit_items_at(&overlay, |key, item| sum = sum.wrapping_add(item_hash(key, item)));
        combine(index, sum)
    }

    /// [`Kv::digest_at`] the applied index, in O(1).
    pub fn applied_digest(&self) -> u64 {
        combine(self.applied.index, self.items_hash)
    }

    /// Number of keys held (tombstones included).
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether no key was ever written.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

/// Encodes the cursor's next items (the applied ones merged with those it saved) until
/// at least `budget` bytes were added or none are left; then the dedup section. Returns
/// whether the snapshot is complete.
fn advance_snapshot(
    items: &BTreeMap<Key, Item>,
    cursor: &mut SnapshotCursor,
    budget: usize,
    out: &mut Vec<u8>,
) -> bool {
    let start = out.len();
    let lower = match &cursor.done_through {
        Some(key) => Bound::Excluded(&key[..]),
        None => Bound::Unbounded,
    };
    let range = (lower, Bound::Unbounded);
    let mut applied = items.range::<[u8], _>(range).peekable();
    let mut saved = cursor.saved.range::<[u8], _>(range).peekable();
    let mut last: Option<&Key> = None;
    let mut written = 0u64;
    while out.len() - start < budget {
        let take_applied = match (applied.peek(), saved.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some((a, _)), Some((s, _))) => a < s,
        };
        let (key, item) = if take_applied {
            let (key, item) = applied.next().expect("peeked");
            (key, Some(item))
        } else {
            let (key, then) = saved.next().expect("peeked");
            if applied.peek().is_some_and(|(a, _)| *a == key) {
                applied.next();
            }
            (key, then.as_ref())
        };
        last = Some(key);
        if let Some(item) = item {
            encode_item(out, key, item);
            written += 1;
        }
    }
    let finished = applied.peek().is_none() && saved.peek().is_none();
    let last = last.cloned();
    cursor.remaining = cursor.remaining.checked_sub(written).expect("more items than announced");
    if let Some(last) = last {
        while cursor.saved.first_key_value().is_some_and(|(k, _)| *k <= last) {
            cursor.saved.pop_first();
        }
        cursor.done_through = Some(last);
    }
    if !finished {
        return false;
    }
    assert_eq!(cursor.remaining, 0, "fewer items than announced");
    out.extend_from_slice(&cursor.tail);
    true
}

/// What an item counts for in [`Kv::state_bytes`]: its key, its value or elements, and
/// the overheads.
pub fn item_bytes(key: &[u8], item: &Item) -> u64 {
    key.len() as u64
        + item.value.as_ref().map_or(0, |v| v.len() as u64)
        + item.coll.as_ref().map_or(0, super::coll::Coll::bytes)
        + ITEM_OVERHEAD_BYTES
}

fn encode_item(out: &mut Vec<u8>, key: &[u8], item: &Item) {
    put_bytes(out, key);
    put_u64(out, item.version.epoch.0);
    put_u64(out, item.version.index.0);
    encode_body(out, item);
}

/// An item's flag, value or collection, and expiry: its snapshot encoding after the key
/// and version, and the image [`Command::Fetch`] reads and [`Command::Restore`] writes.
pub(super) fn encode_body(out: &mut Vec<u8>, item: &Item) {
    match (&item.value, item.expires_at) {
        (Some(value), None) => {
            put_u8(out, 1);
            put_bytes(out, value);
        }
        (Some(value), Some(at)) => {
            put_u8(out, 2);
            put_bytes(out, value);
            put_u64(out, at);
        }
        (None, expires_at) => match &item.coll {
            None => put_u8(out, 0),
            Some(coll) => {
                put_u8(out, if expires_at.is_some() { 4 } else { 3 });
                coll.encode(out);
                if let Some(at) = expires_at {
                    put_u64(out, at);
                }
            }
        },
    }
}

/// What one item takes in the snapshot encoding: key (length-prefixed), version, flag,
/// value (length-prefixed) if live, and expiry if it has one.
fn encoded_item_bytes(key: &[u8], item: &Item) -> usize {
    let expiry = if item.expires_at.is_some() { 8 } else { 0 };
    let coll = item.coll.as_ref().map_or(0, |c| c.encoded_len() + expiry);
    4 + key.len() + 8 + 8 + 1 + item.value.as_ref().map_or(0, |v| 4 + v.len() + expiry) + coll
}

fn item_hash(key: &[u8], item: &Item) -> u64 {
    let mut hash = WordHash::new();
    hash.write_bytes(key);
    hash.write_u64(item.version.epoch.0);
    hash.write_u64(item.version.index.0);
    match &item.value {
        Some(value) => {
            hash.write_u64(1);
            hash.write_bytes(value);
        }
        None => hash.write_u64(0),
    }
    if let Some(coll) = &item.coll {
        hash.write_u64(3);
        hash.write_u64(coll.hash());
    }
    // Only an expiry adds to the hash: items without one hash as they always did.
    if let Some(at) = item.expires_at {
        hash.write_u64(2);
        hash.write_u64(at);
    }
    hash.finish()
}

fn combine(index: LogIndex, sum: u64) -> u64 {
    let mut hash = Fnv::new();
    hash.write_u64(index.0);
    hash.write_u64(sum);
    hash.0
}

fn incremented(current: Option<&[u8]>, delta: i64) -> Result<i64, KeelError> {
    let base = match current {
        None => 0,
        Some(bytes) => {
            let text = std::str::from_utf8(bytes).map_err(|_| KeelError::NotAnInteger)?;
            text.parse::<i64>().map_err(|_| KeelError::NotAnInteger)?
        }
    };
    base.checked_add(delta).ok_or(KeelError::NotAnInteger)
}

impl Kv {
    /// `key` read whole ([`Command::Fetch`]): its image if live, and its version.
    pub fn fetch(&self, key: &[u8]) -> CommandResult {
        let (image, version) = self.image(key);
        CommandResult::Image { image, version }
    }

    /// `key`'s image if live, and its version (a tombstone's included).
    pub fn image(&self, key: &[u8]) -> (Option<Value>, Option<Version>) {
        let item = self.items.get(key);
        let image = item.filter(|item| item.live()).map(super::kv_image::encode);
        (image, item.map(|item| item.version))
    }

    /// Sets `key` to `image` at `version`, outside the log and with no undo record: how a
    /// script's private copy of the keys it read is filled (`EVAL`), never a replica's
    /// state.
    pub fn load(
        &mut self,
        key: Key,
        image: Option<&[u8]>,
        version: Version,
    ) -> Result<(), KeelError> {
        let item = match image {
            Some(image) => super::kv_image::decode(image, version)?,
            None => Item::plain(None, version),
        };
        self.replace(key, Some(item));
        Ok(())
    }
}

#[cfg(test)]
#[path = "kv_expiry_tests.rs"]
mod expiry_tests;

#[cfg(test)]
#[path = "kv_coll_tests.rs"]
mod coll_tests;

#[cfg(test)]
#[path = "kv_events_tests.rs"]
mod events_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use keel_types::Durability;

    fn write(index: u64, client: u64, request: u64, command: Command) -> Entry {
        Entry {
            epoch: Epoch(1),
            index: LogIndex(index),
            payload: EntryPayload::Write {
                client: ClientId(client),
                request: RequestId(request),
                durability: Durability::Memory,
                command,
            },
        }
    }

    fn put(key: &str, value: &str) -> Command {
        let (key, value) = (key.as_bytes(), value.as_bytes());
        Command::Put { key: Key::copy_from_slice(key), value: Value::copy_from_slice(value) }
    }

    #[test]
    fn swap_db_exchanges_two_databases_and_touches_every_key_of_both() {
        let mut kv = Kv::new(10);
        let (one, two) = (keel_types::db_key(1, b"x"), keel_types::db_key(2, b"x"));
        kv.apply(&write(1, 1, 1, put("x", "zero")));
        kv.apply(&write(2, 1, 2, Command::Put { key: one.clone(), value: "one".into() }));
        let only = keel_types::db_key(1, b"only");
        kv.apply(&write(3, 1, 3, Command::Put { key: only.clone(), value: "1".into() }));
        let set = Command::Set {
            key: keel_types::db_key(1, b"ttl"),
            value: "t".into(),
            cond: keel_types::SetCond::Always,
            ttl: keel_types::Ttl::At(10_000),
            now_ms: 1,
        };
        kv.apply(&write(4, 1, 4, set));
        let before = kv.digest_at(LogIndex(4));
        let swap = |index, a, b| write(index, 1, index, Command::SwapDb { a, b });
        let r = kv.apply(&swap(5, 0, 1));
        let v5 = Version::new(1, 5);
        // x in both, only and ttl in 1 alone: 3 names, 2 keys each.
        assert_eq!(r, Applied::Write(Ok(CommandResult::Count { keys: 6 })));
        assert_eq!(kv.get(b"x"), (Some("one".into()), Some(v5)));
        assert_eq!(kv.get(&one), (Some("zero".into()), Some(v5)));
        assert_eq!(kv.get(b"only"), (Some("1".into()), Some(v5)));
        assert_eq!(kv.get(&only), (None, Some(v5)), "a tombstone where it was");
        assert_eq!(kv.expires_at(b"ttl"), Some(10_000), "the expiry goes with the key");
        assert_eq!(kv.expires_at(&keel_types::db_key(1, b"ttl")), None);
        assert_eq!((kv.count(0), kv.count(1)), (3, 1));
        // A database with nothing: the keys move, the other is emptied.
        kv.apply(&swap(6, 1, 2));
        assert_eq!((kv.count(1), kv.count(2)), (0, 1));
        assert_eq!(kv.get(&two), (Some("zero".into()), Some(Version::new(1, 6))));
        assert_eq!(kv.apply(&swap(7, 4, 4)), Applied::Write(Ok(CommandResult::Count { keys: 0 })));
        // Rolled back, the state is as before.
        kv.rollback_after(LogIndex(4), Epoch(1));
        assert_eq!(kv.digest_at(LogIndex(4)), before);
        assert_eq!(kv.get(b"x"), (Some("zero".into()), Some(Version::new(1, 1))));
        assert_eq!((kv.count(0), kv.count(1), kv.count(2)), (1, 3, 0));
    }

    #[test]
    fn a_fetched_image_restores_the_same_item_under_the_restoring_version() {
        let mut kv = Kv::new(10);
        kv.apply(&write(1, 1, 1, put("s", "text")));
        let push = keel_types::coll::CollOp::Push {
            end: keel_types::coll::End::Back,
            values: vec!["a".into(), "b".into()],
            only_existing: false,
        };
        kv.apply(&write(2, 1, 2, Command::Coll { key: "l".into(), op: Box::new(push) }));
        let image = |kv: &Kv, key: &str| match kv.fetch(key.as_bytes()) {
            CommandResult::Image { image, version } => (image, version),
            other => panic!("{other:?}"),
        };
        let (string, v1) = image(&kv, "s");
        assert_eq!(v1, Some(Version::new(1, 1)));
        let (list, _) = image(&kv, "l");
        assert_eq!(image(&kv, "none"), (None, None));
        let restore = |key: &str, image: Option<Value>| Command::Restore {
            key: Key::copy_from_slice(key.as_bytes()),
            image: image.unwrap(),
        };
        let r = kv.apply(&write(3, 1, 3, restore("s2", string.clone())));
        assert_eq!(r, Applied::Write(Ok(CommandResult::Written { version: Version::new(1, 3) })));
        kv.apply(&write(4, 1, 4, restore("l2", list.clone())));
        assert_eq!(kv.get(b"s2"), (Some("text".into()), Some(Version::new(1, 3))));
        assert_eq!(image(&kv, "l2").0, list, "the list came back whole");
        // An image that does not decode fails the command and changes nothing.
        let before = kv.len();
        let r = kv.apply(&write(5, 1, 5, restore("bad", Some("\x09junk".into()))));
        assert!(matches!(r, Applied::Write(Err(KeelError::InvalidArgument(_)))), "{r:?}");
        assert_eq!(kv.get(b"bad"), (None, None));
        assert_eq!(kv.len(), before);
        // A script's private copy is filled outside the log.
        let mut copy = Kv::new(1);
        copy.load("s".into(), string.as_deref(), Version::new(4, 4)).unwrap();
        copy.load("gone".into(), None, Version::new(4, 5)).unwrap();
        assert_eq!(copy.get(b"s"), (Some("text".into()), Some(Version::new(4, 4))));
        assert_eq!(copy.get(b"gone"), (None, Some(Version::new(4, 5))));
        assert!(copy.load("x".into(), Some(b"\x07"), Version::new(4, 6)).is_err());
    }

    #[test]
    fn operations_and_errors() {
        let mut kv = Kv::new(10);
        kv.apply(&write(1, 1, 1, put("a", "1")));
        let r = kv.apply(&write(2, 1, 2, Command::Incr { key: "a".into(), delta: 41 }));
        assert_eq!(
            r,
            Applied::Write(Ok(CommandResult::Counter { value: 42, version: Version::new(1, 2) }))
        );
        kv.apply(&write(3, 1, 3, put("s", "x")));
        let r = kv.apply(&write(4, 1, 4, Command::Incr { key: "s".into(), delta: 1 }));
        assert_eq!(r, Applied::Write(Err(KeelError::NotAnInteger)));
        let r = kv.apply(&write(
            5,
            1,
            5,
            Command::Cas { key: "a".into(), expected: None, new: "n".into() },
        ));
        assert!(matches!(r, Applied::Write(Ok(CommandResult::Cas { swapped: false, .. }))));
        kv.apply(&write(6, 1, 6, Command::Delete { key: "a".into() }));
        assert_eq!(kv.get(b"a"), (None, Some(Version::new(1, 6))));
        assert_eq!(kv.update_index(b"a"), LogIndex(6));
        assert_eq!(kv.update_index(b"never"), LogIndex::ZERO);
        let r = kv.apply(&write(7, 1, 7, Command::Incr { key: "new".into(), delta: -3 }));
        assert!(matches!(r, Applied::Write(Ok(CommandResult::Counter { value: -3, .. }))));
        let (items, needed) = kv.scan(b"", None, 10);
        assert_eq!(items.len(), 2); // "new" and "s"; "a" is a tombstone
        assert_eq!(needed, LogIndex(7));
    }

    #[test]
    fn transactions_apply_all_or_nothing_and_a_changed_watched_key_aborts_them() {
        let mut kv = Kv::new(10);
        kv.apply(&write(1, 1, 1, put("n", "1")));
        kv.apply(&write(2, 1, 2, put("s", "text")));
        let multi =
            |ops: Vec<Command>, watch: Vec<(Key, Option<Version>)>| Command::Multi { ops, watch };
        // Applied in order, reads seeing the writes before them.
        let r = kv.apply(&write(
            3,
            1,
            3,
            multi(
                vec![
                    put("a", "x"),
                    Command::Incr { key: "n".into(), delta: 1 },
                    Command::Get { key: "a".into() },
                ],
                vec![],
            ),
        ));
        let v3 = Version::new(1, 3);
        assert_eq!(
            r,
            Applied::Write(Ok(CommandResult::Multi {
                results: Some(vec![
                    CommandResult::Written { version: v3 },
                    CommandResult::Counter { value: 2, version: v3 },
                    CommandResult::Value { value: Some("x".into()), version: Some(v3) },
                ])
            }))
        );
        // One failing operation undoes those before it: nothing applied.
        let before = kv.digest_at(LogIndex(3));
        let r = kv.apply(&write(
            4,
            1,
            4,
            multi(
                vec![
                    put("a", "y"),
                    Command::Delete { key: "n".into() },
                    Command::Incr { key: "s".into(), delta: 1 },
                ],
                vec![],
            ),
        ));
        assert_eq!(r, Applied::Write(Err(KeelError::NotAnInteger)));
        assert_eq!(kv.get(b"a").0, Some(Value::from_static(b"x")));
        assert_eq!(kv.get(b"n").0, Some(Value::from_static(b"2")));
        assert_eq!(
            kv.state_bytes(),
            Kv::decode(&kv.encode_at(LogIndex(4)), Version::new(1, 4), 10).unwrap().state_bytes()
        );
        // A watched key whose version changed aborts it; an unchanged one lets it apply.
        let r = kv.apply(&write(
            5,
            1,
            5,
            multi(vec![put("a", "z")], vec![("a".into(), Some(Version::new(1, 1)))]),
        ));
        assert_eq!(r, Applied::Write(Ok(CommandResult::Multi { results: None })));
        assert_eq!(kv.get(b"a").0, Some(Value::from_static(b"x")));
        let r = kv.apply(&write(
            6,
            1,
            6,
            multi(vec![put("a", "z")], vec![("a".into(), Some(v3)), ("never".into(), None)]),
        ));
        assert!(matches!(r, Applied::Write(Ok(CommandResult::Multi { results: Some(_) }))));
        // Rolled back as one entry.
        kv.rollback_after(LogIndex(3), Epoch(1));
        assert_eq!(kv.digest_at(LogIndex(3)), before);
        assert_eq!(kv.get(b"a").0, Some(Value::from_static(b"x")));
    }

    #[test]
    fn a_watched_absent_key_set_and_deleted_since_aborts_the_transaction() {
        let mut kv = Kv::new(10);
        let multi = |watch| Command::Multi { ops: vec![put("w", "mine")], watch };
        // WATCH read "w" never written (`None`); another client sets it, then deletes it.
        kv.apply(&write(1, 2, 1, put("w", "theirs")));
        kv.apply(&write(2, 2, 2, Command::Delete { key: "w".into() }));
        assert_eq!(kv.get(b"w"), (None, Some(Version::new(1, 2))), "a tombstone");
        let r = kv.apply(&write(3, 1, 1, multi(vec![("w".into(), None)])));
        assert_eq!(r, Applied::Write(Ok(CommandResult::Multi { results: None })));
        // A delete alone (of a key WATCH saw live) aborts it too.
        kv.apply(&write(4, 2, 3, put("w", "back")));
        kv.apply(&write(5, 2, 4, Command::Delete { key: "w".into() }));
        let r = kv.apply(&write(6, 1, 2, multi(vec![("w".into(), Some(Version::new(1, 4)))])));
        assert_eq!(r, Applied::Write(Ok(CommandResult::Multi { results: None })));
        // Unchanged since WATCH read the tombstone: applied.
        let r = kv.apply(&write(7, 1, 3, multi(vec![("w".into(), Some(Version::new(1, 5)))])));
        assert!(matches!(r, Applied::Write(Ok(CommandResult::Multi { results: Some(_) }))));
        // The negative control takes a tombstone for "unchanged" and commits over a delete.
        let mut unsafe_kv = Kv::new(10);
        unsafe_kv.unsafe_watch_ignores_deletes = true;
        unsafe_kv.apply(&write(1, 2, 1, put("w", "theirs")));
        unsafe_kv.apply(&write(2, 2, 2, Command::Delete { key: "w".into() }));
        let r = unsafe_kv.apply(&write(3, 1, 1, multi(vec![("w".into(), None)])));
        assert!(matches!(r, Applied::Write(Ok(CommandResult::Multi { results: Some(_) }))));
    }

    #[test]
    fn a_transaction_of_watched_keys_alone_answers_whether_they_changed() {
        // `WATCH k`, `MULTI`, `PING`, `EXEC`: no operation, only the check.
        let mut kv = Kv::new(10);
        let watch_only = |watch| Command::Multi { ops: Vec::new(), watch };
        assert!(watch_only(Vec::new()).validate(&keel_types::Limits::default()).is_err());
        kv.apply(&write(1, 2, 1, put("k", "v")));
        let seen = vec![("k".into(), Some(Version::new(1, 1)))];
        let r = kv.apply(&write(2, 1, 1, watch_only(seen.clone())));
        assert_eq!(r, Applied::Write(Ok(CommandResult::Multi { results: Some(Vec::new()) })));
        assert_eq!(kv.get(b"k").1, Some(Version::new(1, 1)), "nothing written");
        kv.apply(&write(3, 2, 2, put("k", "w")));
        let r = kv.apply(&write(4, 1, 2, watch_only(seen)));
        assert_eq!(r, Applied::Write(Ok(CommandResult::Multi { results: None })));
    }

    #[test]
    fn in_place_changes_and_transfers_in_a_transaction_roll_back_with_it() {
        let mut kv = Kv::new(10);
        kv.apply(&write(1, 2, 1, put("k", "v")));
        let append = Command::Modify {
            key: "k".into(),
            op: keel_types::Modify::Append(Value::from_static(b"+")),
            now_ms: 0,
        };
        let rename = |from: &str| Command::Transfer {
            from: from.as_bytes().to_vec().into(),
            to: "z".into(),
            replace: true,
            remove_source: true,
        };
        // The rename of an absent key fails the transaction: the append goes with it.
        let failed = Command::Multi { ops: vec![append.clone(), rename("absent")], watch: vec![] };
        let Applied::Write(r) = kv.apply(&write(2, 1, 1, failed)) else { panic!() };
        assert!(r.is_err(), "{r:?}");
        let untouched = (Some(Value::from_static(b"v")), Some(Version::new(1, 1)));
        assert_eq!(kv.get(b"k"), untouched, "nothing of it stayed");
        assert_eq!(kv.get(b"z"), (None, None));
        let both = Command::Multi { ops: vec![append, rename("k")], watch: vec![] };
        let Applied::Write(r) = kv.apply(&write(3, 1, 2, both)) else { panic!() };
        assert!(r.is_ok(), "{r:?}");
        assert_eq!(kv.get(b"z").0, Some(Value::from_static(b"v+")));
        assert_eq!(kv.get(b"k").0, None);
    }

    #[test]
    fn a_retried_transaction_is_answered_once_whatever_its_watch_read() {
        let mut kv = Kv::new(10);
        let incr = || Command::Incr { key: "n".into(), delta: 1 };
        let multi = |watch| Command::Multi { ops: vec![incr()], watch };
        let Applied::Write(first) = kv.apply(&write(1, 7, 1, multi(vec![("n".into(), None)])))
        else {
            panic!("a write")
        };
        assert!(matches!(first, Ok(CommandResult::Multi { results: Some(_) })));
        // The retry on a new connection watched again and saw the first attempt's write.
        let rewatched = multi(vec![("n".into(), Some(Version::new(1, 1)))]);
        let Applied::Write(retry) = kv.apply(&write(2, 7, 1, rewatched)) else { panic!() };
        assert_eq!(retry, first, "answered from the table");
        let Applied::Write(unwatched) = kv.apply(&write(3, 7, 1, multi(vec![]))) else { panic!() };
        assert_eq!(unwatched, first);
        assert_eq!(kv.get(b"n").0, Some(Value::from_static(b"1")), "applied once");
        // Other operations under the same pair are another request: refused.
        let other = Command::Multi { ops: vec![incr(), incr()], watch: vec![] };
        let Applied::Write(refused) = kv.apply(&write(4, 7, 1, other)) else { panic!() };
        assert_eq!(refused, Err(reused_request(ClientId(7), RequestId(1))));
    }

    #[test]
    fn a_settings_entry_sets_the_bound_evicting_the_oldest_and_rolls_back() {
        let settings = |index: u64, n: u32| Entry {
            epoch: Epoch(1),
            index: LogIndex(index),
            payload: EntryPayload::Settings(keel_types::ApplySettings { dedup_clients_max: n }),
        };
        let mut kv = Kv::new(10);
        for client in 1..=4 {
            kv.apply(&write(client, client, 1, put("k", "v")));
        }
        let before = kv.encode_at(LogIndex(4));
        assert_eq!(kv.apply(&settings(5, 2)), Applied::Noop);
        assert_eq!(kv.dedup_clients_max(), 2);
        assert!(kv.dedup(ClientId(1)).is_none() && kv.dedup(ClientId(2)).is_none());
        assert!(kv.dedup(ClientId(3)).is_some() && kv.dedup(ClientId(4)).is_some());
        kv.apply(&write(6, 5, 1, put("k", "w")));
        assert!(kv.dedup(ClientId(3)).is_none(), "the new bound evicts on");
        // The state as of 4 still has the old bound and every slot.
        assert_eq!(kv.encode_at(LogIndex(4)), before);
        let at5 = Kv::decode(&kv.encode_at(LogIndex(5)), Version::new(1, 5), 1000).unwrap();
        assert_eq!(at5.dedup_clients_max(), 2, "a snapshot carries the bound, not the node's");
        kv.rollback_after(LogIndex(4), Epoch(1));
        assert_eq!(kv.dedup_clients_max(), 10);
        assert_eq!(kv.encode_at(LogIndex(4)), before);
        assert!(kv.dedup(ClientId(1)).is_some());
    }

    #[test]
    fn a_snapshot_decodes_whatever_bound_the_node_is_configured_with() {
        let mut kv = Kv::new(10);
        for client in 1..=5 {
            kv.apply(&write(client, client, 1, put("k", "v")));
        }
        let bytes = kv.encode_at(LogIndex(5));
        // A node configured to keep 2 installs a snapshot of 5 slots under a bound of 10.
        let small = Kv::decode(&bytes, Version::new(1, 5), 2).expect("decodes");
        assert_eq!(small.dedup_clients_max(), 10);
        assert!((1..=5).all(|c| small.dedup(ClientId(c)).is_some()));
        // A snapshot of the format before bounds: the node's bound, raised to its slots.
        let v2 = forged_in(SNAPSHOT_MAGIC_V2, &[("a", 1)], &[(1, 2), (2, 3), (3, 4)]);
        let old = Kv::decode(&v2, Version::new(1, 5), 2).expect("an older format decodes");
        assert_eq!(old.dedup_clients_max(), 3);
        let old = Kv::decode(&v2, Version::new(1, 5), 50).unwrap();
        assert_eq!(old.dedup_clients_max(), 50);
        // A bound out of range, or more slots than the snapshot's own bound: refused.
        for (bound, slots) in [(0, 0), (keel_types::limits::DEDUP_CLIENTS_CEILING + 1, 0), (1, 2)] {
            let slots: Vec<(u64, u64)> = (1..=slots).map(|c| (c, c + 1)).collect();
            let bytes = forged_bound(bound, &[], &slots);
            assert!(Kv::decode(&bytes, Version::new(1, 5), 10).is_err(), "{bound}");
        }
    }

    #[test]
    fn retried_writes_apply_once() {
        let mut kv = Kv::new(10);
        let first = kv.apply(&write(1, 9, 1, Command::Incr { key: "c".into(), delta: 1 }));
        let retry = kv.apply(&write(2, 9, 1, Command::Incr { key: "c".into(), delta: 1 }));
        assert_eq!(first, retry);
        assert_eq!(kv.get(b"c").0, Some(Value::from_static(b"1")));
        let stale = kv.apply(&write(3, 9, 0, put("c", "9")));
        assert!(matches!(stale, Applied::Write(Err(KeelError::InvalidArgument(_)))));
    }

    #[test]
    fn a_queue_is_fifo_through_dequeues_rollback_and_snapshots_and_hidden_from_scans() {
        let enqueue = |v: &str| Command::Enqueue { queue: "q".into(), value: v.to_string().into() };
        let dequeue = || Command::Dequeue { queue: "q".into() };
        let mut kv = Kv::new(10);
        kv.apply(&write(1, 1, 1, put("a", "1")));
        let first = kv.apply(&write(2, 1, 2, enqueue("x")));
        let v2 = Version::new(1, 2);
        assert_eq!(
            first,
            Applied::Write(Ok(CommandResult::Enqueued { seq: 1, length: 1, version: v2 }))
        );
        kv.apply(&write(3, 1, 3, enqueue("y")));
        let (peek, needed) = kv.queue_peek(b"q");
        let head = Some((1, Value::from_static(b"x")));
        let v3 = Some(Version::new(1, 3));
        assert_eq!(peek, CommandResult::Queue { head, length: 2, next: 3, version: v3 });
        assert_eq!(needed, LogIndex(3));
        // A scan sees the keys only; a retried dequeue takes one element.
        let (items, _) = kv.scan(b"", None, 100);
        assert_eq!(items.iter().map(|i| &i.0[..]).collect::<Vec<_>>(), [b"a"]);
        let bytes_before = kv.state_bytes();
        let taken = kv.apply(&write(4, 2, 1, dequeue()));
        assert_eq!(kv.apply(&write(5, 2, 1, dequeue())), taken, "a retry applies once");
        let x = Some((1, Value::from_static(b"x")));
        let v4 = Version::new(1, 4);
        assert_eq!(
            taken,
            Applied::Write(Ok(CommandResult::Dequeued { head: x, remaining: 1, version: v4 }))
        );
        assert!(kv.state_bytes() < bytes_before, "a dequeued element leaves no tombstone");
        // A snapshot taken now, and a rollback to before the dequeue.
        let snapshot = kv.encode_at(LogIndex(5));
        let digest = kv.digest_at(LogIndex(5));
        kv.rollback_after(LogIndex(3), Epoch(1));
        assert_eq!(kv.queue_peek(b"q").0, peek, "rolled back, x is at the head again");
        let mut restored = Kv::decode(&snapshot, Version::new(1, 5), 10).unwrap();
        assert_eq!(restored.digest_at(LogIndex(5)), digest);
        let y = restored.apply(&write(6, 3, 1, dequeue()));
        let y_head = Some((2, Value::from_static(b"y")));
        let v6 = Version::new(1, 6);
        assert_eq!(
            y,
            Applied::Write(Ok(CommandResult::Dequeued { head: y_head, remaining: 0, version: v6 }))
        );
        let empty = restored.apply(&write(7, 3, 2, dequeue()));
        let v7 = Version::new(1, 7);
        assert_eq!(
            empty,
            Applied::Write(Ok(CommandResult::Dequeued { head: None, remaining: 0, version: v7 }))
        );
        // Sequence numbers go on after the queue empties.
        let next = restored.apply(&write(8, 3, 3, enqueue("z")));
        let v8 = Version::new(1, 8);
        assert_eq!(
            next,
            Applied::Write(Ok(CommandResult::Enqueued { seq: 3, length: 1, version: v8 }))
        );
        // Client keys may not enter the reserved range.
        let reserved = put("\u{0}", "v");
        assert!(reserved.validate(&keel_types::Limits::default()).is_ok());
        let mut key = RESERVED_KEY_PREFIX.to_vec();
        key.push(b'q');
        let reserved = Command::Put { key: key.into(), value: "v".into() };
        assert!(reserved.validate(&keel_types::Limits::default()).is_err());
    }

    #[test]
    fn dedup_table_is_bounded_oldest_out() {
        let mut kv = Kv::new(2);
        for client in 1..=3 {
            kv.apply(&write(client, client, 1, put("k", "v")));
        }
        assert!(kv.dedup(ClientId(1)).is_none());
        assert!(kv.dedup(ClientId(3)).is_some());
        kv.rollback_after(LogIndex(2), Epoch(1));
        assert!(kv.dedup(ClientId(1)).is_some(), "rollback restores the evicted slot");
        assert!(kv.dedup(ClientId(3)).is_none());
    }

    #[test]
    fn a_late_copy_of_an_open_is_stale_once_its_session_was_used_and_evicted() {
        const S: u64 = ClientId::SESSION_BIT | 7;
        const T: u64 = ClientId::SESSION_BIT | 8;
        let open = |seen: u64| Command::OpenSession { seen: Some(Version::new(1, seen)) };
        let incr = || Command::Incr { key: "c".into(), delta: 1 };
        let mut kv = Kv::new(1);
        assert!(!kv.open_is_stale(ClientId(S), &open(0)), "nothing evicted yet");
        kv.apply(&write(1, S, 0, open(0)));
        kv.apply(&write(2, S, 1, incr()));
        // Another session evicts S, last used at (1, 2).
        kv.apply(&write(3, T, 0, open(2)));
        assert!(kv.dedup(ClientId(S)).is_none());
        assert_eq!(kv.sessions_evicted_through, Version::new(1, 2));
        assert!(kv.open_is_stale(ClientId(S), &open(0)), "the late copy, stamped before 2");
        assert!(kv.open_is_stale(ClientId(S), &open(1)));
        assert!(!kv.open_is_stale(ClientId(S), &open(2)), "stamped after every use");
        let newer_epoch = Command::OpenSession { seen: Some(Version::new(2, 1)) };
        assert!(!kv.open_is_stale(ClientId(S), &newer_epoch), "a later epoch's log");
        assert!(!kv.open_is_stale(ClientId(T), &open(0)), "a session the table holds");
        assert!(!kv.open_is_stale(ClientId(S), &Command::OpenSession { seen: None }));
        // The snapshot carries it; a rollback past the eviction takes it back.
        let snapshot = kv.encode_at(LogIndex(3));
        let decoded = Kv::decode(&snapshot, Version::new(1, 3), 1).unwrap();
        assert_eq!(decoded.sessions_evicted_through, Version::new(1, 2));
        let mut v5 = snapshot.clone();
        v5[..8].copy_from_slice(SNAPSHOT_MAGIC_V5);
        v5.truncate(v5.len() - 17); // v6's and v7's fields
        let decoded = Kv::decode(&v5, Version::new(1, 3), 1).unwrap();
        let oldest = Version::new(1, 3);
        assert_eq!(decoded.sessions_evicted_through, oldest, "v5: the oldest slot held");
        let before = kv.encode_at(LogIndex(2));
        let decoded = Kv::decode(&before, Version::new(1, 2), 1).unwrap();
        assert_eq!(decoded.sessions_evicted_through, Version::default(), "as of index 2");
        kv.rollback_after(LogIndex(2), Epoch(1));
        assert_eq!(kv.sessions_evicted_through, Version::default());
        assert!(kv.dedup(ClientId(S)).is_some());
        // A plain client's eviction does not count.
        let mut kv = Kv::new(1);
        kv.apply(&write(1, 5, 1, incr()));
        kv.apply(&write(2, 6, 1, incr()));
        assert_eq!(kv.sessions_evicted_through, Version::default());
    }

    #[test]
    fn a_session_forgotten_by_the_table_is_refused_not_applied_again() {
        const S: u64 = ClientId::SESSION_BIT | 7;
        let incr = || Command::Incr { key: "c".into(), delta: 1 };
        let mut kv = Kv::new(2);
        // Before it is opened, a session's write is refused and changes nothing.
        let early = kv.apply(&write(1, S, 1, incr()));
        assert_eq!(early, Applied::Write(Err(KeelError::SessionExpired)));
        assert_eq!(kv.get(b"c").0, None);
        assert!(kv.dedup(ClientId(S)).is_none());
        let opened = kv.apply(&write(2, S, 0, Command::OpenSession { seen: None }));
        assert!(matches!(opened, Applied::Write(Ok(CommandResult::Written { .. }))));
        let first = kv.apply(&write(3, S, 1, incr()));
        assert_eq!(kv.apply(&write(4, S, 1, incr())), first, "a retry in the window");
        assert_eq!(kv.get(b"c").0, Some(Value::from_static(b"1")));
        // Two other clients write: the session leaves the table (oldest out).
        kv.apply(&write(5, 1, 1, put("k", "v")));
        kv.apply(&write(6, 2, 1, put("k", "w")));
        assert!(kv.dedup(ClientId(S)).is_none());
        let late = kv.apply(&write(7, S, 1, incr()));
        assert_eq!(late, Applied::Write(Err(KeelError::SessionExpired)), "a retry after it");
        let next = kv.apply(&write(8, S, 2, incr()));
        assert_eq!(next, Applied::Write(Err(KeelError::SessionExpired)), "and a new request");
        assert_eq!(kv.get(b"c").0, Some(Value::from_static(b"1")), "applied once");
        assert!(kv.dedup(ClientId(S)).is_none(), "a refusal does not reopen it");
        // A plain client the table forgot is taken for a new one: its retry applies again.
        kv.apply(&write(9, 3, 1, put("p", "1")));
        kv.apply(&write(10, 4, 1, put("k", "x")));
        kv.apply(&write(11, 5, 1, put("k", "y")));
        kv.apply(&write(12, 6, 1, put("p", "2")));
        assert!(kv.dedup(ClientId(3)).is_none());
        let again = kv.apply(&write(13, 3, 1, put("p", "1")));
        assert!(matches!(again, Applied::Write(Ok(_))));
        assert_eq!(kv.get(b"p").0, Some(Value::from_static(b"1")));
        // Rolled back past the eviction, the session is held again.
        let mut kv = Kv::new(1);
        kv.apply(&write(1, S, 0, Command::OpenSession { seen: None }));
        kv.apply(&write(2, 1, 1, put("k", "v")));
        assert_eq!(kv.session_open(ClientId(S), &incr()), Err(KeelError::SessionExpired));
        kv.rollback_after(LogIndex(1), Epoch(1));
        assert_eq!(kv.session_open(ClientId(S), &incr()), Ok(()));
    }

    #[test]
    fn accepting_expired_sessions_applies_a_late_retry_twice() {
        // The negative control's mechanism (`Config::unsafe_accept_expired_sessions`).
        const S: u64 = ClientId::SESSION_BIT | 7;
        let incr = || Command::Incr { key: "c".into(), delta: 1 };
        let mut kv = Kv::new(1);
        kv.unsafe_accept_expired_sessions = true;
        kv.apply(&write(1, S, 0, Command::OpenSession { seen: None }));
        kv.apply(&write(2, S, 1, incr()));
        kv.apply(&write(3, 1, 1, put("k", "v")));
        kv.apply(&write(4, S, 1, incr()));
        assert_eq!(kv.get(b"c").0, Some(Value::from_static(b"2")));
    }

    /// A snapshot encoding at index 5 written by hand: `items` as (key, index) and dedup
    /// slots as (client, index), under a bound of 2.
    fn forged(items: &[(&str, u64)], slots: &[(u64, u64)]) -> Vec<u8> {
        forged_bound(2, items, slots)
    }

    /// As [`forged`], under the bound `bound`.
    fn forged_bound(bound: u32, items: &[(&str, u64)], slots: &[(u64, u64)]) -> Vec<u8> {
        let bytes = forged_in(SNAPSHOT_MAGIC_V2, items, slots);
        let slots_at = bytes.len() - forged_in(SNAPSHOT_MAGIC_V2, &[], slots).len() + 24;
        let mut out = SNAPSHOT_MAGIC.to_vec();
        out.extend_from_slice(&bytes[8..slots_at]);
        put_u32(&mut out, bound);
        out.extend_from_slice(&bytes[slots_at..]);
        put_u64(&mut out, 0); // no session evicted: epoch 0,
        put_u64(&mut out, 0); // index 0
        put_u8(&mut out, 0); // no membership entry
        out
    }

    /// As [`forged`], in the format `magic` names before v3 (v1: slots without digests;
    /// neither with a bound).
    fn forged_in(magic: &[u8; 8], items: &[(&str, u64)], slots: &[(u64, u64)]) -> Vec<u8> {
        let mut out = magic.to_vec();
        put_u64(&mut out, 5);
        put_u64(&mut out, items.len() as u64);
        for (key, index) in items {
            put_bytes(&mut out, key.as_bytes());
            put_u64(&mut out, 1);
            put_u64(&mut out, *index);
            keel_types::codec::put_option_bytes(&mut out, Some(b"v"));
        }
        put_u32(&mut out, slots.len() as u32);
        for (client, index) in slots {
            put_u64(&mut out, *client);
            put_u64(&mut out, 1);
            put_u64(&mut out, *index);
            let result: WriteResult =
                Ok(CommandResult::Written { version: Version::new(1, *index) });
            put_bytes(&mut out, &serde_json::to_vec(&result).unwrap());
            if magic == SNAPSHOT_MAGIC_V2 {
                put_u8(&mut out, 0);
            }
        }
        out
    }

    #[test]
    fn a_request_id_reused_for_another_command_is_refused_and_a_retry_is_answered() {
        let mut kv = Kv::new(10);
        let first = kv.apply(&write(1, 7, 1, put("a", "1")));
        let Applied::Write(first) = first else { panic!("a write") };
        let Applied::Write(retry) = kv.apply(&write(2, 7, 1, put("a", "1"))) else { panic!() };
        assert_eq!(retry, first, "the same command again: the first result");
        let Applied::Write(other) = kv.apply(&write(3, 7, 1, put("a", "2"))) else { panic!() };
        assert_eq!(other, Err(reused_request(ClientId(7), RequestId(1))));
        assert_eq!(kv.get(b"a").0, Some(Value::from_static(b"1")), "nothing applied");
        // The digest survives a snapshot, and a first-format snapshot still decodes.
        let restored = Kv::decode(&kv.encode_at(LogIndex(3)), Version::new(1, 3), 10).unwrap();
        assert!(restored.dedup(ClientId(7)).unwrap().digest.is_some());
        let v1 = forged_in(SNAPSHOT_MAGIC_V1, &[("a", 1)], &[(1, 2)]);
        let old = Kv::decode(&v1, Version::new(1, 5), 2).expect("the first format decodes");
        assert_eq!(old.dedup(ClientId(1)).unwrap().digest, None);
    }

    #[test]
    fn a_membership_entry_is_in_force_from_its_append_rolls_back_and_travels_in_snapshots() {
        let mut kv = Kv::new(10);
        let members = |voters: &[u32], learners: &[u32]| keel_types::Membership {
            voters: voters.iter().map(|n| keel_types::NodeId(*n)).collect(),
            learners: learners.iter().map(|n| keel_types::NodeId(*n)).collect(),
        };
        let entry = |index: u64, m: keel_types::Membership| Entry {
            epoch: Epoch(1),
            index: LogIndex(index),
            payload: EntryPayload::Membership(m),
        };
        assert_eq!(kv.membership(), None, "none before an entry names one");
        kv.apply(&write(1, 7, 1, put("a", "1")));
        assert_eq!(kv.apply(&entry(2, members(&[1, 2, 3], &[4]))), Applied::Noop);
        kv.apply(&write(3, 7, 2, put("a", "2")));
        kv.apply(&entry(4, members(&[1, 2, 3, 4], &[])));
        assert_eq!(kv.membership().unwrap().1, members(&[1, 2, 3, 4], &[]));
        // A snapshot carries the membership as of its index.
        for (index, expected) in [
            (1, None),
            (2, Some((Version::new(1, 2), members(&[1, 2, 3], &[4])))),
            (3, Some((Version::new(1, 2), members(&[1, 2, 3], &[4])))),
            (4, Some((Version::new(1, 4), members(&[1, 2, 3, 4], &[])))),
        ] {
            let at = Version::new(1, index);
            let decoded = Kv::decode(&kv.encode_at(LogIndex(index)), at, 10).unwrap();
            assert_eq!(decoded.membership().cloned(), expected, "at {index}");
        }
        // A cut log takes its membership entries back.
        kv.rollback_after(LogIndex(3), Epoch(1));
        assert_eq!(kv.membership().unwrap().1, members(&[1, 2, 3], &[4]));
        kv.rollback_after(LogIndex(1), Epoch(1));
        assert_eq!(kv.membership(), None);
        // A snapshot naming a membership past itself does not decode.
        kv.apply(&entry(2, members(&[1, 2, 3], &[4])));
        let mut bytes = kv.encode_at(LogIndex(2));
        let len = bytes.len();
        // The version's index comes just before the membership's 18 bytes (two counts,
        // four ids).
        bytes[len - 18 - 8..len - 18].copy_from_slice(&9u64.to_le_bytes());
        let error = Kv::decode(&bytes, Version::new(1, 2), 10).unwrap_err();
        assert!(error.contains("outside the snapshot"), "{error}");
    }

    #[test]
    fn a_snapshot_the_state_machine_cannot_have_written_does_not_decode() {
        let at = Version::new(1, 5);
        let decode = |bytes: Vec<u8>| Kv::decode(&bytes, at, 2).map(|_| ());
        assert_eq!(decode(forged(&[("a", 1), ("b", 5)], &[(1, 2), (2, 5)])), Ok(()));
        let broken = [
            forged(&[("b", 1), ("a", 2)], &[]),
            forged(&[("a", 1), ("a", 2)], &[]),
            forged(&[("a", 6)], &[]),
            forged(&[("a", 0)], &[]),
            forged(&[], &[(1, 6)]),
            forged(&[], &[(1, 2), (1, 3)]),
            forged(&[], &[(1, 2), (2, 3), (3, 4)]),
        ];
        for bytes in broken {
            assert!(decode(bytes).is_err());
        }
        let newer = Version::new(2, 1);
        let mut bytes = forged(&[("a", 1)], &[]);
        bytes[8 + 8 + 8 + 4 + 1..][..8].copy_from_slice(&newer.epoch.0.to_le_bytes());
        assert!(decode(bytes).is_err(), "an item from an epoch after the snapshot's");
    }

    #[test]
    fn rollback_restores_and_snapshot_round_trips_at_any_index() {
        let mut kv = Kv::new(10);
        kv.apply(&write(1, 1, 1, put("a", "1")));
        kv.apply(&write(2, 1, 2, put("b", "2")));
        let digest2 = kv.digest_at(LogIndex(2));
        let bytes2 = kv.encode_at(LogIndex(2));
        kv.apply(&write(3, 1, 3, put("a", "3")));
        kv.apply(&write(4, 1, 4, Command::Delete { key: "b".into() }));
        assert_eq!(kv.encode_at(LogIndex(2)), bytes2, "state as of 2 is reachable through undo");
        kv.rollback_after(LogIndex(2), Epoch(1));
        assert_eq!(kv.applied_index(), LogIndex(2));
        assert_eq!(kv.digest_at(LogIndex(2)), digest2);
        assert_eq!(kv.get(b"a").0, Some(Value::from_static(b"1")));
        let restored = Kv::decode(&bytes2, Version::new(1, 2), 10).unwrap();
        assert_eq!(restored.digest_at(LogIndex(2)), digest2);
        assert_eq!(restored.dedup(ClientId(1)).unwrap().request, RequestId(2));
        assert!(Kv::decode(&bytes2[..bytes2.len() - 1], Version::new(1, 2), 10).is_err());
    }

    #[test]
    fn snapshot_buffer_is_sized_exactly_at_any_reachable_index() {
        let mut kv = Kv::new(10);
        kv.apply(&write(1, 1, 1, put("b", "1")));
        kv.apply(&write(2, 2, 1, put("d", "2")));
        kv.apply(&write(3, 1, 2, put("a", "3"))); // a key the state as of 2 lacks
        kv.apply(&write(4, 2, 2, Command::Delete { key: "d".into() }));
        kv.apply(&write(5, 1, 3, put("c", "5")));
        for index in 0..=5 {
            let bytes = kv.encode_at(LogIndex(index));
            assert_eq!(bytes.capacity(), bytes.len(), "no slack at {index}");
        }
        let (items, _) = Kv::decode(&kv.encode_at(LogIndex(2)), Version::new(1, 2), 10)
            .unwrap()
            .scan(b"", None, 10);
        let keys: Vec<&[u8]> = items.iter().map(|(k, _, _)| &k[..]).collect();
        assert_eq!(keys, [b"b".as_slice(), b"d".as_slice()]);
    }

    #[test]
    fn a_sliced_snapshot_keeps_what_keys_were_when_it_began() {
        let mut kv = Kv::new(10);
        for (index, key) in ["a", "b", "c", "d"].iter().enumerate() {
            kv.apply(&write(index as u64 + 1, 1, index as u64 + 1, put(key, "old")));
        }
        let expected = kv.encode_at(LogIndex(4));
        let mut out = kv.begin_snapshot(LogIndex(4));
        assert!(!kv.continue_snapshot(1, &mut out), "one item per slice");
        kv.apply(&write(5, 1, 5, put("c", "new"))); // not yet encoded: saved first
        kv.apply(&write(6, 1, 6, Command::Delete { key: "d".into() }));
        kv.apply(&write(7, 1, 7, put("bb", "new"))); // a new key, absent at 4
        kv.apply(&write(8, 1, 8, put("a", "new"))); // already encoded
        while !kv.continue_snapshot(1, &mut out) {}
        assert_eq!(out, expected);
        assert_eq!(kv.get(b"c").0, Some(Value::from_static(b"new")), "the live state moved on");
    }

    #[test]
    #[should_panic(expected = "rollback below the durable index")]
    fn rollback_below_durable_is_refused() {
        let mut kv = Kv::new(10);
        kv.apply(&write(1, 1, 1, put("a", "1")));
        kv.apply(&write(2, 1, 2, put("a", "2")));
        kv.forget_undo_through(LogIndex(2));
        kv.rollback_after(LogIndex(1), Epoch(1));
    }

    fn random_entry(index: u64, op: u8, key: u8, arg: i8) -> Entry {
        if op == 6 {
            // A new leader's settings entry: a bound of 1 to 4, evicting at once.
            let dedup_clients_max = u32::from(arg.unsigned_abs() % 4 + 1);
            let settings = keel_types::ApplySettings { dedup_clients_max };
            let payload = EntryPayload::Settings(settings);
            return Entry { epoch: Epoch(1), index: LogIndex(index), payload };
        }
        let key = vec![b'a' + key];
        let command = match op {
            0 => Command::Put { key: key.into(), value: arg.to_string().into_bytes().into() },
            1 => Command::Delete { key: key.into() },
            2 => Command::Incr { key: key.into(), delta: i64::from(arg) },
            3 => Command::Cas { key: key.into(), expected: None, new: b"x".to_vec().into() },
            // Transactions: several keys, a key twice, an incr that may fail (a key holding
            // "x" from a cas) and so undo the rest, a watch that may abort it all.
            4 => {
                let other = vec![b'a' + (key[0] - b'a' + 1) % 4];
                Command::Multi {
                    ops: vec![
                        Command::Put { key: key.clone().into(), value: b"m".to_vec().into() },
                        Command::Incr { key: other.clone().into(), delta: i64::from(arg) },
                        Command::Get { key: other.into() },
                        Command::Delete { key: key.into() },
                    ],
                    watch: Vec::new(),
                }
            }
            _ => Command::Multi {
                ops: vec![
                    Command::Put {
                        key: key.clone().into(),
                        value: arg.to_string().into_bytes().into(),
                    },
                    Command::Put { key: key.clone().into(), value: b"again".to_vec().into() },
                ],
                watch: vec![(key.into(), None)],
            },
        };
        // Few clients with repeating request ids exercise dedup and eviction too.
        write(index, u64::from(key_client(arg)), index / 2 + 1, command)
    }

    fn key_client(arg: i8) -> u8 {
        arg.unsigned_abs() % 4
    }

    proptest::proptest! {
        /// Rolling back to any point equals replaying the prefix, and the state as of any
        /// point (through undo records) encodes like the replayed prefix.
        #[test]
        fn rollback_equals_replaying_the_prefix(
            ops in proptest::collection::vec((0u8..7, 0u8..4, proptest::num::i8::ANY), 1..40),
            cut in 0usize..40,
        ) {
            let entries: Vec<Entry> = ops
                .iter()
                .enumerate()
                .map(|(i, (op, key, arg))| random_entry(i as u64 + 1, *op, *key, *arg))
                .collect();
            let cut = cut.min(entries.len());
            let mut full = Kv::new(3);
            for entry in &entries {
                full.apply(entry);
            }
            let mut prefix = Kv::new(3);
            for entry in &entries[..cut] {
                prefix.apply(entry);
            }
            let at = LogIndex(cut as u64);
            proptest::prop_assert_eq!(full.encode_at(at), prefix.encode_at(at));
            full.rollback_after(at, Epoch(1));
            proptest::prop_assert_eq!(full.digest_at(at), prefix.digest_at(at));
            proptest::prop_assert_eq!(full.encode_at(at), prefix.encode_at(at));
            let (overlay, _) = prefix.overlay_at(at);
            let mut sum = 0u64;
            prefix.visit_items_at(&overlay, |k, i| sum = sum.wrapping_add(item_hash(k, i)));
            proptest::prop_assert_eq!(combine(at, sum), prefix.applied_digest(), "incremental digest");
            let decoded = Kv::decode(&prefix.encode_at(at), Version::new(1, cut as u64), 3).unwrap();
            proptest::prop_assert_eq!(decoded.digest_at(at), prefix.digest_at(at));
        }

        /// A snapshot encoded a slice at a time, while later writes are applied and
        /// rolled back between slices, equals the state as of its index encoded at once.
        #[test]
        fn sliced_snapshot_equals_the_state_when_it_began(
            ops in proptest::collection::vec((0u8..7, 0u8..6, proptest::num::i8::ANY), 1..60),
            at in 0usize..60,
            budget in 1usize..64,
            steps in proptest::collection::vec((0u8..3, 1u8..5), 0..30),
        ) {
            let entries: Vec<Entry> = ops
                .iter()
                .enumerate()
                .map(|(i, (op, key, arg))| random_entry(i as u64 + 1, *op, *key, *arg))
                .collect();
            let at = at.min(entries.len());
            let mut kv = Kv::new(3);
            let (before, after) = entries.split_at(at);
            let mut later = after.iter();
            for entry in before {
                kv.apply(entry);
            }
            // Some entries past the snapshot index are applied before it begins.
            for entry in later.by_ref().take(3) {
                kv.apply(entry);
            }
            let at = LogIndex(at as u64);
            let expected = kv.encode_at(at);
            let mut out = kv.begin_snapshot(at);
            let mut steps = steps.into_iter();
            loop {
                if kv.continue_snapshot(budget, &mut out) {
                    break;
                }
                match steps.next() {
                    Some((0, n)) => {
                        for entry in later.by_ref().take(usize::from(n)) {
                            kv.apply(entry);
                        }
                    }
                    Some((1, n)) => {
                        let back = kv.applied_index().0.saturating_sub(u64::from(n)).max(at.0);
                        kv.rollback_after(LogIndex(back), Epoch(1));
                        // Replaying what was rolled back keeps the entry stream contiguous.
                        let replay: Vec<&Entry> =
                            entries.iter().filter(|e| e.index.0 > back).take(usize::from(n)).collect();
                        for entry in replay {
                            kv.apply(entry);
                        }
                        later = entries[usize::try_from(kv.applied_index().0).unwrap()..].iter();
                    }
                    _ => {}
                }
            }
            proptest::prop_assert_eq!(kv.snapshot_in_progress(), None);
            proptest::prop_assert_eq!(out, expected);
        }
    }
}
