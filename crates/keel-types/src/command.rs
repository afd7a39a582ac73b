//! The operations clients ask for, and what they return.
//!
//! Every operation, reads included, is ordered through the leader's log (reads at `any`
//! and reads that pass the durability check are served from applied state without a log
//! entry; see `docs/protocol.md`). Keys and values are opaque bytes.

use crate::limits::Limits;
use crate::{KeelError, NodeId, Version};
use serde::{Deserialize, Serialize};

/// A key: opaque bytes, at most [`Limits::key_bytes_max`] long. Shared: cloning a key
/// (into the log, the state machine, a follower's batch or a reply) counts a reference
/// and copies nothing.
pub type Key = bytes::Bytes;
/// A value: opaque bytes, at most [`Limits::value_bytes_max`] long; shared like [`Key`].
pub type Value = bytes::Bytes;

/// One operation on the key-value state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Read one key.
    Get {
        /// The key read.
        key: Key,
    },
    /// Set a key to a value.
    Put {
        /// The key written.
        key: Key,
        /// The new value.
        value: Value,
    },
    /// Remove a key (leaves a tombstone carrying the update index).
    Delete {
        /// The key removed.
        key: Key,
    },
    /// Set `key` to `new` only if it currently holds `expected` (`None`: absent).
    Cas {
        /// The key compared and written.
        key: Key,
        /// The value the key must hold; `None` means the key must be absent.
        expected: Option<Value>,
        /// The value written when the comparison holds.
        new: Value,
    },
    /// Add `delta` to the key's value read as a decimal i64 (absent counts as 0).
    Incr {
        /// The key incremented.
        key: Key,
        /// The amount added; may be negative.
        delta: i64,
    },
    /// Ordered range scan over `[start, end)`, at most `limit` items.
    Scan {
        /// The first key included.
        start: Key,
        /// The first key excluded; `None` scans to the end of the keyspace.
        end: Option<Key>,
        /// The most items returned.
        limit: u32,
    },
    /// A transaction (`MULTI` ... `EXEC`): `ops` applied in order as one log entry, all of
    /// them or, if one fails, none; none either when a `watch`ed key no longer has the
    /// version given (`WATCH`).
    Multi {
        /// `Get`, `Put`, `Delete`, `Cas` and `Incr`, at most [`MULTI_OPS_MAX`].
        ops: Vec<Command>,
        /// Keys and the version each must still have (`None`: never written), at most
        /// [`MULTI_OPS_MAX`].
        watch: Vec<(Key, Option<Version>)>,
    },
    /// Opens the session named by the entry's client id (one with
    /// [`crate::ClientId::SESSION_BIT`]): changes no key, and gives the session a slot in the
    /// deduplication table. Applying it again changes nothing.
    ///
    /// `seen` is the version of the last entry in the log of the node that first
    /// received it, stamped there (whatever the client sent): the leader refuses the open
    /// (`SessionExpired`) of a session the table does not hold when a session the table
    /// evicted was last used after `seen`. So a late copy of an open (a retry, a
    /// duplicated message) cannot reopen a session that was used and forgotten since:
    /// every request of a session is sent after its open was answered, so it lies past
    /// the `seen` of every copy of that open (`docs/protocol.md` §6, *Late copies of an
    /// open*). `None`: an entry written before the stamp existed, applied as then.
    OpenSession {
        /// The receiving node's last log entry when the open arrived.
        seen: Option<crate::Version>,
    },
    /// Appends `value` to the tail of `queue` (a replicated FIFO queue, created by its
    /// first enqueue); the element gets the queue's next sequence number.
    Enqueue {
        /// The queue's name (a key of its own namespace: queues and keys never collide).
        queue: Key,
        /// The element appended.
        value: Value,
    },
    /// Removes the element at the head of `queue`, if any.
    Dequeue {
        /// The queue's name.
        queue: Key,
    },
    /// Reads `queue`'s head, length and next sequence number without changing it: what a
    /// dequeue or an enqueue applied now would return (a read).
    QueuePeek {
        /// The queue's name.
        queue: Key,
    },
    /// Redis's `SET` with its options: writes `value` when `cond` holds, with the expiry
    /// `ttl` says; answers whether it wrote and (for `GET`) the value it found. The
    /// result is [`CommandResult::Cas`]: `swapped` is whether it wrote.
    Set {
        /// The key written.
        key: Key,
        /// The new value.
        value: Value,
        /// When to write: always, only if absent (`NX`), only if present (`XX`).
        cond: SetCond,
        /// The key's expiry after the write ([`Ttl::Clear`]: none, as a plain `SET`).
        ttl: Ttl,
        /// The leader's clock when it appended the command (unix milliseconds): the time
        /// a relative `ttl` counts from. Clients send 0; the leader fills it in, so every
        /// replica applies the entry with the same time.
        now_ms: u64,
    },
    /// Sets or clears a key's expiry (`EXPIRE` and its kin, `PERSIST`, `GETEX`'s options)
    /// when `cond` holds; an expiry at or before `now_ms` deletes the key. The result is
    /// [`CommandResult::Cas`]: `swapped` is whether the expiry changed (or the key was
    /// deleted), `current` the value the key held.
    Expire {
        /// The key.
        key: Key,
        /// The new expiry: [`Ttl::After`] or [`Ttl::At`], or [`Ttl::Clear`] (`PERSIST`).
        ttl: Ttl,
        /// When to change it (`NX`, `XX`, `GT`, `LT`).
        cond: ExpireCond,
        /// As [`Command::Set`]'s: the leader's clock, filled in by the leader.
        now_ms: u64,
    },
    /// Reads a key with its expiry: [`CommandResult::Held`] (a read).
    Inspect {
        /// The key read.
        key: Key,
    },
    /// Deletes every live key of database `db` of the keyspace (`FLUSHDB`), or of every
    /// database, queues included (`None`: `FLUSHALL`). Each key leaves a tombstone, as a
    /// delete does. [`CommandResult::Count`]: how many keys it deleted.
    Flush {
        /// The database, or `None` for all of them.
        db: Option<u8>,
    },
    /// Exchanges the live keys of databases `a` and `b` of the keyspace (`SWAPDB`): each
    /// key of one is written, with its value, collection and expiry, under the same name
    /// in the other, and a name only one of them held leaves a tombstone where it was, so
    /// every key either database held or now holds gets this entry's version (a `WATCH`
    /// on it fails, as Redis's). One entry, like `FLUSHDB`: its cost is the two
    /// databases' keys. [`CommandResult::Count`]: the keys written or deleted.
    SwapDb {
        /// One database.
        a: u8,
        /// The other (may equal `a`: then nothing changes).
        b: u8,
    },
    /// Reads a key whole, of any type: [`CommandResult::Image`] (a read). What a script
    /// reads a key into before running commands on it (`EVAL`).
    Fetch {
        /// The key read.
        key: Key,
    },
    /// Sets `key` to the item `image` describes (a string or a collection, and its
    /// expiry; the encoding [`CommandResult::Image`] carries), whatever it held: how a
    /// script's writes are applied, inside a transaction that watches every key the script
    /// read. [`CommandResult::Written`]; an image that does not decode fails the command.
    Restore {
        /// The key written.
        key: Key,
        /// The item, encoded (at most [`Limits::value_bytes_max`] bytes).
        image: Value,
    },
    /// Changes the keyspace's membership, or moves its leadership (`KEEL.NODE`,
    /// `keel node`): the leader appends the membership entry it leads to,
    /// [`crate::EntryPayload::Membership`], and answers [`CommandResult::Written`] once
    /// it is committed; a transfer is answered once the target was told to campaign.
    Cluster(ClusterOp),
    /// Counts the live keys of database `db` (`DBSIZE`): [`CommandResult::Count`] (a read).
    Count {
        /// The database.
        db: u8,
    },
    /// Changes one key's value in place (`APPEND`, `SETRANGE`, `SETBIT`, `INCRBYFLOAT`,
    /// `GETDEL`, `GETEX`): [`CommandResult::Modified`]. Keeps the key's expiry unless the
    /// change says otherwise.
    Modify {
        /// The key changed.
        key: Key,
        /// The change.
        op: Modify,
        /// As [`Command::Set`]'s: the leader's clock, filled in by the leader.
        now_ms: u64,
    },
    /// Copies `from`'s value and expiry to `to` (`COPY`, `RENAME`, `RENAMENX`):
    /// [`CommandResult::Modified`] with `number` 1 if it did, 0 if `to` existed and
    /// `replace` is false or `from` is absent (for a rename, an absent `from` is an error).
    Transfer {
        /// The source.
        from: Key,
        /// The destination.
        to: Key,
        /// Whether an existing `to` is overwritten.
        replace: bool,
        /// Whether `from` is deleted (a rename) or kept (a copy).
        remove_source: bool,
    },
    /// An operation of a geo keyspace's session (`crate::geo`): a transaction's step, a
    /// barrier or an attach. Served by geo keyspaces only; never enters a log.
    Geo(crate::geo::GeoOp),
    /// A write to the collection at `key` (`crate::coll`): [`CommandResult::Answer`].
    Coll {
        /// The key written (for the multi-key forms, the first or the destination).
        key: Key,
        /// The write (boxed: most commands are smaller).
        op: Box<crate::coll::CollOp>,
    },
    /// A read of the collection at `key` (`crate::coll`): [`CommandResult::Answer`].
    CollRead {
        /// The key read (for the multi-key forms, the first).
        key: Key,
        /// The read (boxed: most commands are smaller).
        op: Box<crate::coll::CollRead>,
    },
    /// A step of moving hash slots between keyspaces (`crate::slots`): a write.
    Slot(crate::slots::SlotOp),
    /// The command inside, sent on by a slot's source keyspace to the keyspace importing
    /// it (Redis Cluster's `ASKING`), during the move whose id it names: only such a
    /// request may touch a key of a slot being imported, since the source no longer
    /// holds that key (and does not again during that move). Otherwise it is the command
    /// inside (a read if that is one).
    Asking(u64, Box<Command>),
}

/// The in-place changes of [`Command::Modify`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Modify {
    /// Appends bytes; `number`: the new length.
    Append(Value),
    /// Writes bytes at an offset, zero-padding before it; `number`: the new length.
    SetRange {
        /// Where the bytes go.
        offset: u64,
        /// The bytes.
        value: Value,
    },
    /// Sets or clears one bit (bit 0 is the most significant of byte 0), zero-padding;
    /// `number`: the bit before.
    SetBit {
        /// The bit's position.
        offset: u64,
        /// Its new value.
        on: bool,
    },
    /// Adds a float (its IEEE-754 bits) to the value read as a float; `value`: the new
    /// value as text.
    IncrByFloat(u64),
    /// Deletes the key; `value`: what it held.
    GetDel,
    /// Sets the expiry (`Ttl::Keep`: unchanged, `Ttl::Clear`: `PERSIST`); `value`: the
    /// key's value.
    GetEx(Ttl),
}

impl Eq for Modify {}

/// The longest string `SETRANGE` and `SETBIT` may grow a value to: 512 MiB, as Redis's
/// `proto-max-bulk-len` default.
pub const STRING_BYTES_MAX: u64 = 512 << 20;

/// The first bytes of every key of a database other than 0 of a keyspace: this prefix,
/// the database's number as one byte, then the client's key. Database 0's keys are the
/// client's keys as they are; none may begin with this prefix.
pub const DB_KEY_PREFIX: &[u8] = b"\xff\xffkeel\x02";
/// The first key past every database's keys.
pub const DB_KEYS_END: &[u8] = b"\xff\xffkeel\x03";

/// `key` of database `db` as the state machine holds it.
pub fn db_key(db: u8, key: &[u8]) -> Key {
    if db == 0 {
        return Key::copy_from_slice(key);
    }
    let mut out = Vec::with_capacity(DB_KEY_PREFIX.len() + 1 + key.len());
    out.extend_from_slice(DB_KEY_PREFIX);
    out.push(db);
    out.extend_from_slice(key);
    out.into()
}

/// The database a key the state machine holds belongs to, and the client's key in it
/// (`None`: a key of a queue's, in no database).
pub fn db_of(key: &[u8]) -> Option<(u8, &[u8])> {
    if key.starts_with(RESERVED_KEY_PREFIX) {
        return None;
    }
    match key.strip_prefix(DB_KEY_PREFIX) {
        Some([db, rest @ ..]) if *db > 0 => Some((*db, rest)),
        Some(_) => None,
        None => Some((0, key)),
    }
}

/// The keys of database `db > 0`: `[start, end)`.
pub fn db_range(db: u8) -> (Key, Key) {
    assert!(db > 0, "database 0 is every key outside the reserved ranges");
    let start = db_key(db, b"");
    let mut end = start.to_vec();
    match db {
        u8::MAX => end = DB_KEYS_END.to_vec(),
        _ => *end.last_mut().expect("not empty") += 1,
    }
    (start, end.into())
}

/// A key's expiry as a write states it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Ttl {
    /// Keeps the expiry the key has (`SET ... KEEPTTL`).
    Keep,
    /// No expiry: the key persists (a plain `SET`, `PERSIST`).
    Clear,
    /// Expires this many milliseconds after the command's time (`EX`, `PX`, `EXPIRE`).
    After(u64),
    /// Expires at this unix time in milliseconds (`EXAT`, `PXAT`, `EXPIREAT`).
    At(u64),
}

impl Ttl {
    /// The unix time in milliseconds a key expires at when this is applied at `now_ms` to
    /// a key whose expiry is `current` (`None`: no expiry).
    pub fn resolve(self, now_ms: u64, current: Option<u64>) -> Option<u64> {
        match self {
            Ttl::Keep => current,
            Ttl::Clear => None,
            Ttl::After(ms) => Some(now_ms.saturating_add(ms)),
            Ttl::At(at) => Some(at),
        }
    }
}

/// When a [`Command::Set`] writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SetCond {
    /// Always.
    Always,
    /// Only if the key is absent (`NX`).
    IfAbsent,
    /// Only if the key is present (`XX`).
    IfPresent,
}

/// When a [`Command::Expire`] changes the expiry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ExpireCond {
    /// Always (the key must exist).
    Always,
    /// Only if the key has no expiry (`NX`).
    IfNone,
    /// Only if the key has one (`XX`).
    IfSome,
    /// Only if the new one is later (`GT`; no expiry counts as infinitely late).
    IfLater,
    /// Only if the new one is earlier (`LT`; no expiry counts as infinitely late).
    IfEarlier,
    /// Only if the key has one and the new one is earlier (`XX LT`).
    IfSomeEarlier,
}

impl ExpireCond {
    /// Whether the condition lets `new` replace `current` (`None`: no expiry).
    pub fn holds(self, current: Option<u64>, new: Option<u64>) -> bool {
        let late = |t: Option<u64>| t.unwrap_or(u64::MAX);
        match self {
            ExpireCond::Always => true,
            ExpireCond::IfNone => current.is_none(),
            ExpireCond::IfSome => current.is_some(),
            ExpireCond::IfLater => current.is_some() && late(new) > late(current),
            ExpireCond::IfEarlier => late(new) < late(current),
            ExpireCond::IfSomeEarlier => current.is_some() && late(new) < late(current),
        }
    }
}

/// Most keys one expiry entry ([`crate::EntryPayload::Reap`]) deletes: the leader's
/// active expiry does at most this much work per step.
pub const REAP_KEYS_MAX: usize = 64;

/// The first bytes of every key the state machine keeps for itself (a queue's elements
/// and its head and tail): no client key may begin with them, so queues and keys never
/// collide, and scans step over them.
pub const RESERVED_KEY_PREFIX: &[u8] = b"\xff\xffkeel\x00";
/// The first key past the reserved range: [`RESERVED_KEY_PREFIX`] with its last byte
/// one higher.
pub const RESERVED_KEY_END: &[u8] = b"\xff\xffkeel\x01";

/// Refuses a client key in the reserved range ([`RESERVED_KEY_PREFIX`]).
pub fn check_not_reserved(key: &[u8]) -> Result<(), KeelError> {
    if key.starts_with(RESERVED_KEY_PREFIX) {
        return Err(KeelError::InvalidArgument(
            "keys beginning with \\xff\\xffkeel\\x00 are reserved for queues".into(),
        ));
    }
    Ok(())
}

/// Checks a slot move's step: its slots in range, its batch within bounds and of its
/// slot, and the keys and images it copies within the limits (no reserved key).
fn validate_slot(op: &crate::slots::SlotOp, limits: &Limits) -> Result<(), KeelError> {
    if !op.valid() {
        return Err(KeelError::InvalidArgument(format!(
            "slot {}: slots out of range, or a batch over {} keys or of another slot",
            op.name(),
            crate::slots::SLOT_BATCH_MAX
        )));
    }
    if let crate::slots::SlotOp::Fill { items, .. } = op {
        for (key, image) in items {
            limits.check_key(key)?;
            check_not_reserved(key)?;
            limits.check_value(image)?;
        }
    }
    Ok(())
}

/// Most operations, and most watched keys, in one transaction.
pub const MULTI_OPS_MAX: usize = 16_384;

/// The key of a transaction as a whole (it has many).
static NO_KEY: Key = Key::from_static(b"");

/// A change of a keyspace's members or leader ([`Command::Cluster`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ClusterOp {
    /// Adds a node as a learner: it receives the log (a snapshot first, if the log no
    /// longer reaches back far enough) and counts for no majority.
    AddLearner(NodeId),
    /// Makes a learner a voter.
    Promote(NodeId),
    /// Removes a voter or a learner (not the leader: transfer its leadership first).
    Remove(NodeId),
    /// Hands the leadership to a voter once it holds the leader's whole log.
    TransferLeader(NodeId),
    /// Takes the removed data center of a node back (geo keyspaces only): its new
    /// replicas, booted joining, copy what survived of it and serve in a new life.
    Return(NodeId),
}

impl ClusterOp {
    /// The node the change is about.
    pub fn node(self) -> NodeId {
        match self {
            ClusterOp::AddLearner(n)
            | ClusterOp::Promote(n)
            | ClusterOp::Remove(n)
            | ClusterOp::TransferLeader(n)
            | ClusterOp::Return(n) => n,
        }
    }

    /// The word that asks for it (`KEEL.NODE <word> <id>`).
    pub fn word(self) -> &'static str {
        match self {
            ClusterOp::AddLearner(_) => "ADD",
            ClusterOp::Promote(_) => "PROMOTE",
            ClusterOp::Remove(_) => "REMOVE",
            ClusterOp::TransferLeader(_) => "TRANSFER-LEADER",
            ClusterOp::Return(_) => "RETURN",
        }
    }
}

/// What an operation returned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandResult {
    /// A get: the value (`None`: absent or deleted) and the version of the write that
    /// produced it (`None`: the key was never written in the surviving log).
    Value {
        /// The value read.
        value: Option<Value>,
        /// The version of the write whose value was read.
        version: Option<Version>,
    },
    /// A put or delete applied at `version`.
    Written {
        /// The version the write created.
        version: Version,
    },
    /// A cas: whether it swapped, the value it found, and the version it created (if it
    /// swapped) or the version of the value it found (if not).
    Cas {
        /// Whether the comparison held and the new value was written.
        swapped: bool,
        /// The value found before the comparison.
        current: Option<Value>,
        /// The version created (swapped) or read (not swapped).
        version: Option<Version>,
    },
    /// A transaction: each operation's result in order, or `None` when a watched key had
    /// changed and nothing was applied.
    Multi {
        /// The results, one per operation.
        results: Option<Vec<CommandResult>>,
    },
    /// An incr: the new value, created at `version`.
    Counter {
        /// The value after the increment.
        value: i64,
        /// The version the increment created.
        version: Version,
    },
    /// An enqueue: the element's sequence number and the queue's length after it.
    Enqueued {
        /// The sequence number the element got (the first element of a queue gets 1).
        seq: u64,
        /// Elements in the queue after the enqueue.
        length: u64,
        /// The version the enqueue created.
        version: Version,
    },
    /// A dequeue: the element removed with its sequence number (`None`: the queue was
    /// empty) and how many elements remain.
    Dequeued {
        /// The removed element's sequence number and value.
        head: Option<(u64, Value)>,
        /// Elements left in the queue.
        remaining: u64,
        /// The version of the dequeue's entry.
        version: Version,
    },
    /// A queue's state as read (`QueuePeek`): its head, length and next sequence number.
    Queue {
        /// The head element's sequence number and value (`None`: empty).
        head: Option<(u64, Value)>,
        /// Elements in the queue.
        length: u64,
        /// The sequence number the next enqueue gets.
        next: u64,
        /// The version of the last operation on the queue (`None`: never used).
        version: Option<Version>,
    },
    /// A key read whole ([`Command::Fetch`]): its item encoded (`None`: absent) and the
    /// version of the write that set it (`None`: never written).
    Image {
        /// The encoded item (as [`Command::Restore`] takes it).
        image: Option<Value>,
        /// The key's version, a tombstone's included.
        version: Option<Version>,
    },
    /// A key read with its expiry ([`Command::Inspect`]).
    Held {
        /// The value (`None`: absent).
        value: Option<Value>,
        /// The version of the write that set it (`None`: never written).
        version: Option<Version>,
        /// When it expires, in unix milliseconds (`None`: never, or absent).
        expires_at: Option<u64>,
    },
    /// An in-place change or a transfer: the value it reports and a number, by its kind
    /// ([`Modify`], [`Command::Transfer`]), and the version it created (`None`: it
    /// changed nothing).
    Modified {
        /// The value reported (the value before, or the new one), if any.
        value: Option<Value>,
        /// The number reported (a length, a bit, 1 or 0).
        number: i64,
        /// The version created, if it changed the state.
        version: Option<Version>,
    },
    /// A count of keys (`DBSIZE`), or of keys deleted (`FLUSHDB`, `FLUSHALL`).
    Count {
        /// How many.
        keys: u64,
    },
    /// A scan: items in key order, each with the version that produced it.
    Items {
        /// `(key, value, version)` in ascending key order.
        items: Vec<(Key, Value, Version)>,
    },
    /// What a geo operation returned ([`Command::Geo`]).
    Geo(crate::geo::GeoResult),
    /// What a collection command answered ([`Command::Coll`], [`Command::CollRead`]), and
    /// the version a write created (`None`: it changed nothing, or a read).
    Answer {
        /// The answer.
        answer: crate::coll::Answer,
        /// The version created.
        version: Option<Version>,
    },
}

impl CommandResult {
    /// The version a write created (`None` for reads and for a cas that did not swap):
    /// what a client's session floor advances to.
    pub fn written_version(&self) -> Option<Version> {
        match self {
            CommandResult::Written { version }
            | CommandResult::Counter { version, .. }
            | CommandResult::Enqueued { version, .. }
            | CommandResult::Dequeued { version, .. } => Some(*version),
            CommandResult::Cas { swapped: true, version, .. }
            | CommandResult::Modified { version, .. }
            | CommandResult::Answer { version, .. } => *version,
            // A transaction's writes all carry its entry's version.
            CommandResult::Multi { results: Some(results) } => {
                results.iter().filter_map(CommandResult::written_version).max()
            }
            _ => None,
        }
    }
}

impl Command {
    /// The key an operation touches; for a scan, its start key; for a transaction, the
    /// empty key (its operations name theirs).
    pub fn key(&self) -> &Key {
        match self {
            Command::Asking(_, inner) => inner.key(),
            Command::Get { key }
            | Command::Put { key, .. }
            | Command::Delete { key }
            | Command::Cas { key, .. }
            | Command::Incr { key, .. }
            | Command::Set { key, .. }
            | Command::Expire { key, .. }
            | Command::Modify { key, .. }
            | Command::Transfer { from: key, .. }
            | Command::Inspect { key }
            | Command::Fetch { key }
            | Command::Restore { key, .. }
            | Command::Coll { key, .. }
            | Command::CollRead { key, .. } => key,
            Command::Enqueue { queue, .. }
            | Command::Dequeue { queue }
            | Command::QueuePeek { queue } => queue,
            Command::Scan { start, .. } => start,
            Command::Geo(op) => op.key().unwrap_or(&NO_KEY),
            Command::Multi { .. }
            | Command::OpenSession { .. }
            | Command::Flush { .. }
            | Command::SwapDb { .. }
            | Command::Cluster(_)
            | Command::Slot(_)
            | Command::Count { .. } => &NO_KEY,
        }
    }

    /// Every key the operation reads or writes (a transaction's, its operations' and the
    /// keys it watches); none for a scan, which reads a range, or for the operations on
    /// the whole keyspace or none of its keys.
    pub fn keys(&self) -> Vec<&Key> {
        match self {
            Command::Asking(_, inner) => inner.keys(),
            Command::Transfer { from, to, .. } => vec![from, to],
            Command::Coll { key, op } => std::iter::once(key).chain(op.other_keys()).collect(),
            Command::CollRead { key, op } => std::iter::once(key).chain(op.other_keys()).collect(),
            Command::Multi { ops, watch } => {
                ops.iter().flat_map(Command::keys).chain(watch.iter().map(|(k, _)| k)).collect()
            }
            Command::Geo(op) => op.key().into_iter().collect(),
            Command::Scan { .. }
            | Command::OpenSession { .. }
            | Command::Flush { .. }
            | Command::SwapDb { .. }
            | Command::Cluster(_)
            | Command::Slot(_)
            | Command::Count { .. } => Vec::new(),
            other => vec![other.key()],
        }
    }

    /// Whether a source keyspace's `ASK` may send the operation on: one with keys.
    pub fn may_be_asked(&self) -> bool {
        !self.keys().is_empty()
            && !matches!(
                self,
                Command::Asking(..)
                    | Command::Cluster(_)
                    | Command::Slot(_)
                    | Command::Geo(_)
                    | Command::OpenSession { .. }
            )
    }

    /// The command without its [`Command::Asking`], and the move it was sent on in, if
    /// it had one.
    pub fn unasked(&self) -> (&Command, Option<u64>) {
        match self {
            Command::Asking(id, inner) => (inner, Some(*id)),
            other => (other, None),
        }
    }

    /// Bytes of keys and values the operation carries (what it may add to the state).
    pub fn payload_bytes(&self) -> usize {
        match self {
            Command::Put { key, value }
            | Command::Set { key, value, .. }
            | Command::Modify {
                key,
                op: Modify::Append(value) | Modify::SetRange { value, .. },
                ..
            } => key.len() + value.len(),
            Command::Transfer { from, to, .. } => from.len() + to.len(),
            Command::Restore { key, image } => key.len() + image.len(),
            Command::Enqueue { queue, value } => queue.len() + value.len(),
            Command::Cas { key, expected, new } => {
                key.len() + expected.as_ref().map_or(0, |e| e.len()) + new.len()
            }
            Command::Geo(op) => op.payload_bytes(),
            Command::Slot(op) => op.payload_bytes(),
            Command::Asking(_, inner) => inner.payload_bytes(),
            Command::Coll { key, op } => key.len() + op.payload_bytes(),
            Command::CollRead { key, op } => key.len() + op.payload_bytes(),
            Command::Multi { ops, watch } => {
                ops.iter().map(Command::payload_bytes).sum::<usize>()
                    + watch.iter().map(|(key, _)| key.len()).sum::<usize>()
            }
            other => other.key().len(),
        }
    }

    /// Whether the operation changes state (and so must go through the log).
    pub fn is_write(&self) -> bool {
        if let Command::Asking(_, inner) = self {
            return inner.is_write();
        }
        !matches!(
            self,
            Command::Get { .. }
                | Command::Scan { .. }
                | Command::QueuePeek { .. }
                | Command::Inspect { .. }
                | Command::Fetch { .. }
                | Command::Count { .. }
                | Command::CollRead { .. }
        ) && !matches!(self, Command::Geo(op) if !op.is_write())
    }

    /// The operation's name as users and histories see it.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Get { .. } => "get",
            Command::Put { .. } => "put",
            Command::Delete { .. } => "delete",
            Command::Cas { .. } => "cas",
            Command::Incr { .. } => "incr",
            Command::Scan { .. } => "scan",
            Command::Multi { .. } => "multi",
            Command::OpenSession { .. } => "open-session",
            Command::Enqueue { .. } => "enqueue",
            Command::Dequeue { .. } => "dequeue",
            Command::QueuePeek { .. } => "queue-peek",
            Command::Set { .. } => "set",
            Command::Expire { .. } => "expire",
            Command::Inspect { .. } => "inspect",
            Command::Fetch { .. } => "fetch",
            Command::Restore { .. } => "restore",
            Command::Flush { .. } => "flush",
            Command::SwapDb { .. } => "swap-db",
            Command::Modify { .. } => "modify",
            Command::Transfer { .. } => "transfer",
            Command::Count { .. } => "count",
            Command::Cluster(_) => "cluster",
            Command::Slot(_) => "slot",
            Command::Asking(_, inner) => inner.name(),
            Command::Geo(op) => op.name(),
            Command::Coll { .. } => "coll",
            Command::CollRead { .. } => "coll-read",
        }
    }

    /// Checks the operation against the limits; the error names the limit exceeded.
    pub fn validate(&self, limits: &Limits) -> Result<(), KeelError> {
        if let Command::Asking(_, inner) = self {
            if !inner.may_be_asked() {
                let why = format!("{} cannot be sent on by ASK", inner.name());
                return Err(KeelError::InvalidArgument(why));
            }
            return inner.validate(limits);
        }
        limits.check_key(self.key())?;
        if matches!(
            self,
            Command::Get { .. }
                | Command::Put { .. }
                | Command::Delete { .. }
                | Command::Cas { .. }
                | Command::Incr { .. }
                | Command::Set { .. }
                | Command::Expire { .. }
                | Command::Inspect { .. }
                | Command::Modify { .. }
                | Command::Transfer { .. }
                | Command::Coll { .. }
                | Command::CollRead { .. }
                | Command::Restore { .. }
                | Command::Fetch { .. }
        ) {
            check_not_reserved(self.key())?;
        }
        match self {
            Command::Multi { ops, watch } => self.validate_multi(ops, watch, limits),
            Command::Put { value, .. }
            | Command::Enqueue { value, .. }
            | Command::Set { value, .. } => limits.check_value(value),
            Command::Expire { ttl: Ttl::Keep, .. } => {
                Err(KeelError::InvalidArgument("an expire that keeps the expiry".into()))
            }
            Command::OpenSession { .. } => Ok(()),
            Command::Geo(op) => op.validate(limits),
            Command::Cas { expected, new, .. } => {
                if let Some(expected) = expected {
                    limits.check_value(expected)?;
                }
                limits.check_value(new)
            }
            Command::Scan { end, limit, .. } => {
                if let Some(end) = end {
                    limits.check_key(end)?;
                }
                if *limit == 0 || *limit > limits.scan_items_max {
                    return Err(KeelError::InvalidArgument(format!(
                        "scan limit {limit} outside 1..={}",
                        limits.scan_items_max
                    )));
                }
                Ok(())
            }
            Command::Get { .. }
            | Command::Delete { .. }
            | Command::Incr { .. }
            | Command::Dequeue { .. }
            | Command::QueuePeek { .. }
            | Command::Expire { .. }
            | Command::Inspect { .. }
            | Command::Fetch { .. }
            | Command::Flush { .. }
            | Command::SwapDb { .. }
            | Command::Cluster(_)
            | Command::Count { .. } => Ok(()),
            Command::Restore { image, .. } => limits.check_value(image),
            Command::Modify {
                op: Modify::Append(value) | Modify::SetRange { value, .. }, ..
            } => limits.check_value(value),
            Command::Modify { .. } => Ok(()),
            Command::Transfer { to, .. } => {
                limits.check_key(to)?;
                check_not_reserved(to)
            }
            Command::Coll { op, .. } => {
                op.validate(limits)?;
                let bytes = self.payload_bytes() as u64;
                if bytes > u64::from(limits.value_bytes_max) {
                    return Err(KeelError::ValueTooLarge {
                        len: bytes,
                        max: limits.value_bytes_max,
                    });
                }
                Ok(())
            }
            Command::CollRead { op, .. } => op.validate(limits),
            Command::Asking(..) => unreachable!("validated above"),
            Command::Slot(op) => validate_slot(op, limits),
        }
    }

    /// Whether a transaction ([`Command::Multi`]) may hold this command: a string or
    /// collection read or write, not another transaction, a scan, a session, a queue, an
    /// inspection, a flush, a cluster change or a geo operation. The ORCA gate checks it of
    /// a peer's entries too, as the state machine relies on it.
    pub fn fits_in_multi(&self) -> bool {
        !matches!(
            self,
            Command::Multi { .. }
                | Command::Scan { .. }
                | Command::OpenSession { .. }
                | Command::Enqueue { .. }
                | Command::Dequeue { .. }
                | Command::QueuePeek { .. }
                | Command::Inspect { .. }
                | Command::Fetch { .. }
                | Command::Flush { .. }
                | Command::SwapDb { .. }
                | Command::Count { .. }
                | Command::Cluster(_)
                | Command::Geo(_)
        )
    }

    /// [`Command::validate`] of a transaction: its size, what it may hold, each operation
    /// and watched key, and its bytes in all.
    fn validate_multi(
        &self,
        ops: &[Command],
        watch: &[(Key, Option<Version>)],
        limits: &Limits,
    ) -> Result<(), KeelError> {
        let invalid = |reason: String| Err(KeelError::InvalidArgument(reason));
        // No operation is allowed only with watched keys: `WATCH k`, `MULTI`,
        // `PING`, `EXEC` asks whether `k` changed, and answers null if it did.
        let empty = ops.is_empty() && watch.is_empty();
        if empty || ops.len() > MULTI_OPS_MAX || watch.len() > MULTI_OPS_MAX {
            return invalid(format!(
                "a transaction has at most {MULTI_OPS_MAX} operations and {MULTI_OPS_MAX} watched keys, and at least one of either"
            ));
        }
        for op in ops {
            if !op.fits_in_multi() {
                return invalid(format!("a {} inside a transaction", op.name()));
            }
            op.validate(limits)?;
        }
        for (key, _) in watch {
            limits.check_key(key)?;
            check_not_reserved(key)?;
        }
        let bytes = self.payload_bytes() as u64;
        if bytes > u64::from(limits.value_bytes_max) {
            return Err(KeelError::ValueTooLarge { len: bytes, max: limits.value_bytes_max });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserved_range_ends_where_its_prefix_does() {
        let mut end = RESERVED_KEY_PREFIX.to_vec();
        *end.last_mut().unwrap() += 1;
        assert_eq!(end, RESERVED_KEY_END);
    }

    #[test]
    fn no_client_command_reaches_a_slot_state() {
        let limits = Limits::default();
        let state = crate::slots::slot_state_key(5);
        let image: Value = b"\x01\x00\x00\x00\x01x".to_vec().into();
        let forged = Command::Restore { key: state.clone(), image: image.clone() };
        assert!(matches!(forged.validate(&limits), Err(KeelError::InvalidArgument(_))));
        let read = Command::Fetch { key: state.clone() };
        assert!(matches!(read.validate(&limits), Err(KeelError::InvalidArgument(_))));
        let fill = Command::Slot(crate::slots::SlotOp::Fill {
            slot: crate::slots::key_slot(&state),
            items: vec![(state.clone(), image)],
            id: 1,
        });
        assert!(fill.validate(&limits).is_err(), "a copy of a reserved key");
        let asked = Command::Asking(1, Box::new(Command::Put { key: state, value: "v".into() }));
        assert!(asked.validate(&limits).is_err(), "sent on by ASK");
    }

    #[test]
    fn validate_refuses_oversized_keys_and_values() {
        let limits = Limits::default();
        let big_key = vec![b'k'; limits.key_bytes_max as usize + 1];
        let err = Command::Get { key: big_key.into() }.validate(&limits).unwrap_err();
        assert!(matches!(err, KeelError::KeyTooLarge { .. }));
        let big_value = vec![0; limits.value_bytes_max as usize + 1];
        let err = Command::Put { key: b"k".to_vec().into(), value: big_value.into() }
            .validate(&limits)
            .unwrap_err();
        assert!(matches!(err, KeelError::ValueTooLarge { .. }));
        assert!(!err.is_retryable());
    }

    #[test]
    fn validate_accepts_values_at_the_limit() {
        let limits = Limits::default();
        let key = vec![b'k'; limits.key_bytes_max as usize];
        let value = vec![0; limits.value_bytes_max as usize];
        assert!(Command::Put { key: key.into(), value: value.into() }.validate(&limits).is_ok());
        assert!(Command::Scan { start: vec![].into(), end: None, limit: 0 }
            .validate(&limits)
            .is_err());
    }

    #[test]
    fn writes_are_told_from_reads() {
        assert!(Command::Incr { key: b"c".to_vec().into(), delta: 1 }.is_write());
        assert!(!Command::Get { key: b"c".to_vec().into() }.is_write());
        assert_eq!(Command::Delete { key: b"c".to_vec().into() }.name(), "delete");
    }
}
