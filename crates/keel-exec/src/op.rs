//! What the front hands the storage worker ([`StorageOp`]) and what comes back
//! ([`Completion`]), and what a completion means to the engine ([`DiskInput`]).

use keel_core::engine::{Input, SnapshotBytes};
use keel_types::{Entry, HardState, LogIndex, SnapshotMeta};

/// One piece of disk work. The front numbers them; the worker carries them out in that
/// order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StorageOp<L = Entry> {
    /// Write and fsync the hard state; reported as [`Completion::HardStateSaved`].
    HardState(HardState),
    /// Remove every entry after the index (durably).
    TruncateAfter(LogIndex),
    /// Append log records (buffered): the engine's records, [`Entry`] for the leader engine.
    Append(Vec<L>),
    /// Fsync the log, coalesced with every other sync of the batch (group commit);
    /// reported as [`Completion::Synced`].
    Sync,
    /// Save a snapshot installed from a leader, in order with the log operations around
    /// it; reported as [`Completion::SnapshotSaved`], then the log is compacted below it.
    Snapshot(SnapshotMeta, SnapshotBytes),
    /// Put in place a snapshot this node took, already written and synced under its
    /// temporary name off the worker (`keel_storage::wal::prepare_snapshot`), of that
    /// many data bytes; then as `Snapshot`. Dropped if an installed one overtook it.
    Adopt(SnapshotMeta, u64),
}

impl<L> StorageOp<L> {
    /// Whether carrying the operation out ends with an fsync of its own (hard state,
    /// truncation, snapshots): what a virtual-time disk charges a sync for.
    pub fn syncs(&self) -> bool {
        matches!(
            self,
            StorageOp::HardState(_)
                | StorageOp::TruncateAfter(_)
                | StorageOp::Snapshot(..)
                | StorageOp::Adopt(..)
        )
    }
}

/// Disk work finished, as the worker reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completion {
    /// The hard state of operation `seq` is durable.
    HardStateSaved {
        /// The operation's sequence number.
        seq: u64,
    },
    /// The log is durable through `index` as of operation `seq` (every operation up to
    /// it was carried out before the fsync).
    Synced {
        /// The last index on disk when the fsync returned.
        index: LogIndex,
        /// The sequence number of the last operation carried out before the fsync.
        seq: u64,
    },
    /// A snapshot is durable and in place.
    SnapshotSaved {
        /// Which one.
        meta: SnapshotMeta,
    },
}

/// What a completion tells the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskInput {
    /// The log is durable through the index (already clamped below later truncations).
    LogSynced(LogIndex),
    /// The snapshot is durable.
    SnapshotSaved(SnapshotMeta),
}

impl DiskInput {
    /// As the engine's input.
    pub fn into_input<M, Q>(self) -> Input<M, Q> {
        match self {
            DiskInput::LogSynced(index) => Input::LogSynced { index },
            DiskInput::SnapshotSaved(meta) => Input::SnapshotSaved { meta },
        }
    }
}
