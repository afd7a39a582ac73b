//! The one trait drivers persist through, and what recovery hands back.

use crate::error::StorageResult;
use keel_types::{Entry, HardState, LogIndex, LogRecord, SnapshotMeta, Version};

/// Everything a node recovered from its disk at start-up, its log of records `R` (the
/// engine's log record). The same fields as the engine contract's `PersistedState`, so a
/// driver converts field by field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recovered<R = Entry> {
    /// The epoch and vote (default if never saved).
    pub hard_state: HardState,
    /// The newest snapshot, with its bytes as the engine produced them.
    pub snapshot: Option<(SnapshotMeta, Vec<u8>)>,
    /// The longest valid prefix of log entries after the snapshot, contiguous, starting
    /// at the snapshot's last index + 1 (or 1 without a snapshot).
    pub entries: Vec<R>,
    /// Damage found inside the log, if recovery cut it before records that had been
    /// written whole (not a torn tail), or a damaged snapshot set aside with the log. `hard_state.repair_floor` then holds the promise
    /// the cut entries carried, unless the snapshot covers them.
    pub damage: Option<LogDamage>,
}

impl<R> Default for Recovered<R> {
    fn default() -> Self {
        Recovered {
            hard_state: HardState::default(),
            snapshot: None,
            entries: Vec::new(),
            damage: None,
        }
    }
}

/// Records recovery found damaged inside the log: intact records or seals follow the
/// first bad one, so it was written whole and synced before it was damaged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogDamage {
    /// The first index the recovered log lacks.
    pub at: LogIndex,
    /// The greatest entry that intact records or seals past the damage name.
    pub through: Version,
    /// Where and what the damage is.
    pub reason: String,
}

/// A node's durable state: its log, hard state and snapshot.
///
/// Driving order (see the engine's `Outputs`): `recover` once at start-up, then per step
/// `save_hard_state`, `truncate_after`, `append`, `sync`, `save_snapshot`,
/// `compact_through`, as the engine asks.
///
/// Failure: every error is fatal to the node and never retryable. After any failed write
/// or fsync the storage is poisoned: that call and every later one return an error
/// ([`crate::StorageError::Poisoned`] after the first), nothing is reported durable that
/// was not, and the node must stop; on restart, [`Storage::recover`] on a fresh instance
/// rebuilds a consistent state from what reached the disk. Calls that break the contract
/// below (gaps in indexes, truncating into the snapshot, using the storage before
/// `recover`) are programmer errors and panic.
pub trait Storage {
    /// What the log holds: the engine's log record (its position and epoch are all the
    /// storage reads of it).
    type Record: LogRecord;

    /// Reads the disk and repairs it: removes temporary files, cuts a torn or corrupt log
    /// tail (the longest valid prefix stays), drops log entries the snapshot replaces,
    /// fsyncs what it keeps. Call exactly once, before any other call.
    ///
    /// A log damaged inside what was synced (intact records or seals follow a bad record)
    /// is cut too, but first the hard state gets a repair floor, saved durably, and
    /// [`Recovered::damage`] says where (`docs/format.md`, "Seals and damage").
    ///
    /// A damaged newest snapshot is set aside (renamed `*.damaged`) with the whole log,
    /// under a repair floor through the greatest entry they held; the node recovers from a
    /// leader's snapshot. Fails with [`crate::StorageError::HardStateDamaged`] when the
    /// hard-state file is damaged (the vote it held is lost: an operator rebuilds it,
    /// [`crate::Wal::rebuild_hard_state`]), and with [`crate::StorageError::Corrupt`] when
    /// the log starts after its snapshot's end.
    fn recover(&mut self) -> StorageResult<Recovered<Self::Record>>;

    /// Appends entries after the last one; they are written to a buffer, not durable
    /// until [`Storage::sync`] returns. Indexes must continue the log without a gap and
    /// epochs must not decrease (panics otherwise). An empty slice does nothing.
    fn append(&mut self, entries: &[Self::Record]) -> StorageResult<()>;

    /// Removes every entry after `index` (a conflicting suffix), durably: on return the
    /// removed entries can no longer reappear after a crash. `index` at or past the last
    /// entry does nothing; `index` below the snapshot's last index panics.
    fn truncate_after(&mut self, index: LogIndex) -> StorageResult<()>;

    /// Makes every appended entry durable (flush, fsync the segments written since the
    /// last sync, fsync the directory if segments were created). Returns the last index,
    /// now durable. Cheap when nothing was appended.
    fn sync(&mut self) -> StorageResult<LogIndex>;

    /// Replaces the hard state atomically and durably (temporary file, fsync, rename,
    /// directory fsync) before returning.
    fn save_hard_state(&mut self, hard_state: &HardState) -> StorageResult<()>;

    /// Saves a snapshot atomically and durably before returning, and deletes the older
    /// one. If the log does not hold `meta.last_index` with epoch `meta.last_epoch`, the
    /// whole log is discarded and the next append starts at `meta.last_index + 1`.
    /// `meta.last_index` below the current snapshot's panics.
    fn save_snapshot(&mut self, meta: SnapshotMeta, data: &[u8]) -> StorageResult<()>;

    /// [`Storage::save_snapshot`] in two steps: [`crate::wal::prepare_snapshot`] wrote and
    /// synced the file of `meta` (`len` data bytes) under its temporary name, off this
    /// storage's thread; this puts it in place and does the rest, and returns `true`. If a
    /// snapshot past `meta` was saved meanwhile, it removes the file instead and returns
    /// `false`. Fails (and poisons the storage) if that file is missing.
    fn adopt_snapshot(&mut self, meta: SnapshotMeta, len: u64) -> StorageResult<bool>;

    /// Deletes whole log segments whose entries are all at or below `index`; `index`
    /// must not pass the saved snapshot (panics). The segment being written is kept.
    fn compact_through(&mut self, index: LogIndex) -> StorageResult<()>;

    /// The last entry's index (buffered or durable); the snapshot's last index if the
    /// log after it is empty.
    fn last_index(&self) -> LogIndex;

    /// The highest index known durable: entries up to it survive any crash.
    fn synced_index(&self) -> LogIndex;
}
