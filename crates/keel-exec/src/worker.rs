//! [`Worker`]: the executor's half on the disk. It owns a [`Storage`] and carries out
//! numbered operations in order, then fsyncs once for the whole batch (group commit).
//!
//! A batch is carried out in two calls so that a driver can put time between them:
//! [`Worker::apply`] does every operation (appends are buffered; hard state, truncation
//! and snapshots are durable when it returns, and reported at once), and [`Worker::sync`]
//! makes the appends durable and reports how far. The server calls both back to back on
//! its storage thread; the simulator calls `sync` when the batch's virtual fsync time has
//! passed, so a crash in between loses what a power loss would.
//!
//! Failure: a storage error is returned as is; the storage is poisoned and the node must
//! stop (`keel_storage::Storage`).

use crate::op::{Completion, StorageOp};
use keel_storage::{Storage, StorageResult};

/// The disk side of the executor over one storage.
#[derive(Debug)]
pub struct Worker<S> {
    storage: S,
    /// The sequence number of the last operation carried out.
    seq_last: u64,
}

/// What a batch left to do after [`Worker::apply`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Applied {
    /// Whether an operation asked for a log sync (call [`Worker::sync`]).
    pub sync_wanted: bool,
    /// The sequence number of the batch's last operation.
    pub seq_last: u64,
}

impl<S: Storage> Worker<S> {
    /// A worker over a storage that has been recovered.
    pub fn new(storage: S) -> Worker<S> {
        Worker { storage, seq_last: 0 }
    }

    /// The storage, for reads (indexes, the simulator's checks).
    pub fn storage(&self) -> &S {
        &self.storage
    }

    /// The storage, for what drivers do beside the operations (a simulated crash, a
    /// snapshot prepared on the same disk).
    pub fn storage_mut(&mut self) -> &mut S {
        &mut self.storage
    }

    /// Starts numbering over: the process restarted, and with it its front.
    pub fn restart(&mut self) {
        self.seq_last = 0;
    }

    /// The sequence number of the last operation carried out.
    pub fn seq_last(&self) -> u64 {
        self.seq_last
    }

    /// Carries out `batch` in order, reporting each durable operation to `done` as it
    /// completes; returns whether the batch asked for a log sync.
    pub fn apply(
        &mut self,
        batch: impl IntoIterator<Item = (u64, StorageOp<S::Record>)>,
        done: &mut impl FnMut(Completion),
    ) -> StorageResult<Applied> {
        let mut sync_wanted = false;
        for (seq, op) in batch {
            assert!(seq > self.seq_last, "operations arrive in sequence order");
            self.seq_last = seq;
            match op {
                StorageOp::HardState(hard_state) => {
                    self.storage.save_hard_state(&hard_state)?;
                    done(Completion::HardStateSaved { seq });
                }
                StorageOp::TruncateAfter(index) => self.storage.truncate_after(index)?,
                StorageOp::Append(entries) => self.storage.append(&entries)?,
                StorageOp::Sync => sync_wanted = true,
                StorageOp::Snapshot(meta, data) => {
                    self.storage.save_snapshot(meta, &data)?;
                    self.saved(meta, done)?;
                }
                StorageOp::Adopt(meta, len) => {
                    if self.storage.adopt_snapshot(meta, len)? {
                        self.saved(meta, done)?;
                    }
                }
            }
        }
        Ok(Applied { sync_wanted, seq_last: self.seq_last })
    }

    /// Reports a saved snapshot, then compacts the log below it.
    fn saved(
        &mut self,
        meta: keel_types::SnapshotMeta,
        done: &mut impl FnMut(Completion),
    ) -> StorageResult<()> {
        done(Completion::SnapshotSaved { meta });
        self.storage.compact_through(meta.last_index)
    }

    /// Fsyncs the log: everything applied so far is durable. `seq` is the last operation
    /// applied before this sync (from [`Applied::seq_last`]).
    pub fn sync(&mut self, seq: u64) -> StorageResult<Completion> {
        assert_eq!(seq, self.seq_last, "nothing is applied between a batch and its sync");
        let index = self.storage.sync()?;
        assert_eq!(index, self.storage.synced_index());
        Ok(Completion::Synced { index, seq })
    }

    /// [`Worker::apply`] then, if asked, [`Worker::sync`]: one whole batch.
    pub fn run(
        &mut self,
        batch: impl IntoIterator<Item = (u64, StorageOp<S::Record>)>,
        done: &mut impl FnMut(Completion),
    ) -> StorageResult<()> {
        let applied = self.apply(batch, done)?;
        if applied.sync_wanted {
            done(self.sync(applied.seq_last)?);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_storage::{SimFault, SimStorage, StorageConfig};
    use keel_types::{Entry, EntryPayload, Epoch, HardState, LogIndex};

    fn entry(index: u64) -> Entry {
        Entry { epoch: Epoch(1), index: LogIndex(index), payload: EntryPayload::Noop }
    }

    fn recovered() -> SimStorage {
        let mut storage = SimStorage::new_sim(StorageConfig::default());
        storage.recover().unwrap();
        storage
    }

    #[test]
    fn a_batch_is_carried_out_in_order_and_synced_once() {
        let mut worker = Worker::new(recovered());
        let batch = vec![
            (
                1,
                StorageOp::HardState(HardState {
                    epoch: Epoch(1),
                    voted_for: None,
                    repair_floor: None,
                    members_epoch: 0,
                }),
            ),
            (2, StorageOp::Append(vec![entry(1)])),
            (3, StorageOp::Sync),
            (4, StorageOp::Append(vec![entry(2)])),
            (5, StorageOp::Sync),
        ];
        let mut done = Vec::new();
        worker.run(batch, &mut |c| done.push(c)).unwrap();
        assert_eq!(
            done,
            vec![
                Completion::HardStateSaved { seq: 1 },
                Completion::Synced { index: LogIndex(2), seq: 5 },
            ],
            "one fsync for the batch, reported with its last operation"
        );
    }

    #[test]
    fn a_failed_fsync_is_returned_and_nothing_is_reported_durable() {
        let mut worker = Worker::new(recovered());
        worker.storage_mut().sim_disk().fail_next(SimFault::Sync);
        let mut done = Vec::new();
        let batch = vec![(1, StorageOp::Append(vec![entry(1)])), (2, StorageOp::Sync)];
        let error = worker.run(batch, &mut |c| done.push(c)).unwrap_err();
        assert!(error.to_string().contains("fsync"), "{error}");
        assert!(done.is_empty());
        assert_eq!(worker.storage().synced_index(), LogIndex(0));
    }
}
