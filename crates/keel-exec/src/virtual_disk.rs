//! [`VirtualDisk`]: the [`Worker`] on virtual time, as the simulator and the engine's
//! scenario tests drive it.
//!
//! Like the server's storage thread, it takes every operation queued while it was busy
//! as one batch. Each operation that ends in an fsync of its own (hard state, truncation,
//! snapshots) costs one fsync time and is reported when that time has passed; the batch's
//! log sync costs one more, at the end. Operations are carried out on the storage when
//! the batch starts (appends buffered), the log fsync when its time comes: a crash in
//! between loses the appends, as a power loss would.

use crate::op::{Completion, StorageOp};
use crate::worker::Worker;
use keel_storage::{Storage, StorageResult};
use std::collections::VecDeque;

/// Most operations one batch takes (the rest wait for the next).
pub const BATCH_OPS_MAX: usize = 4096;

/// A batch in progress.
#[derive(Clone, Copy, Debug)]
struct Busy {
    /// When the batch is done (its log sync, if any, completes then).
    until_ns: u64,
    /// The sequence number to report the log sync with, if the batch asked for one.
    sync_seq: Option<u64>,
}

/// The worker over a storage, in virtual time (nanoseconds).
#[derive(Debug)]
pub struct VirtualDisk<S: Storage> {
    worker: Worker<S>,
    queue: VecDeque<(u64, StorageOp<S::Record>)>,
    busy: Option<Busy>,
    /// Completions with the time they are due, in order.
    due: VecDeque<(u64, Completion)>,
}

impl<S: Storage> VirtualDisk<S> {
    /// A disk over a recovered storage, idle.
    pub fn new(storage: S) -> VirtualDisk<S> {
        VirtualDisk {
            worker: Worker::new(storage),
            queue: VecDeque::new(),
            busy: None,
            due: VecDeque::new(),
        }
    }

    /// The storage (indexes, hard state, for the simulator's checks).
    pub fn storage(&self) -> &S {
        self.worker.storage()
    }

    /// The storage, for what happens beside the operations (a crash, a snapshot written
    /// under its temporary name, bit rot).
    pub fn storage_mut(&mut self) -> &mut S {
        self.worker.storage_mut()
    }

    /// Queues operations at `now`; an idle disk starts on them at once, each fsync
    /// taking `fsync_ns`.
    pub fn submit(
        &mut self,
        ops: impl IntoIterator<Item = (u64, StorageOp<S::Record>)>,
        now_ns: u64,
        fsync_ns: u64,
    ) -> StorageResult<()> {
        self.queue.extend(ops);
        if self.busy.is_none() && !self.queue.is_empty() {
            self.start(now_ns, fsync_ns)?;
        }
        Ok(())
    }

    fn start(&mut self, at_ns: u64, fsync_ns: u64) -> StorageResult<()> {
        assert!(self.busy.is_none(), "one batch at a time");
        let take = self.queue.len().min(BATCH_OPS_MAX);
        let mut t = at_ns;
        let mut sync_seq = None;
        for (seq, op) in self.queue.drain(..take).collect::<Vec<_>>() {
            if op.syncs() {
                t += fsync_ns;
            }
            let due = &mut self.due;
            let applied = self.worker.apply([(seq, op)], &mut |c| due.push_back((t, c)))?;
            if applied.sync_wanted {
                sync_seq = Some(seq);
            }
        }
        if let Some(seq) = sync_seq.as_mut() {
            *seq = self.worker.seq_last(); // a sync reports the whole batch
            t += fsync_ns;
        }
        self.busy = Some(Busy { until_ns: t, sync_seq });
        Ok(())
    }

    /// Runs what is due by `now`: finishes the batch in progress (its log sync), starts
    /// the next, and returns every completion due, in order.
    pub fn poll(&mut self, now_ns: u64, fsync_ns: u64) -> StorageResult<Vec<Completion>> {
        while let Some(busy) = self.busy.filter(|b| b.until_ns <= now_ns) {
            self.busy = None;
            if let Some(seq) = busy.sync_seq {
                let synced = self.worker.sync(seq)?;
                self.due.push_back((busy.until_ns, synced));
            }
            if !self.queue.is_empty() {
                self.start(busy.until_ns, fsync_ns)?;
            }
        }
        let mut ready = Vec::new();
        while self.due.front().is_some_and(|(at, _)| *at <= now_ns) {
            ready.push(self.due.pop_front().expect("checked").1);
        }
        Ok(ready)
    }

    /// When something is next due (a completion, or the batch's end), if anything is.
    pub fn next_due_ns(&self) -> Option<u64> {
        let busy = self.busy.map(|b| b.until_ns);
        let due = self.due.front().map(|(at, _)| *at);
        match (busy, due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Forgets queued operations, the batch in progress and undelivered completions (the
    /// process died). The caller crashes the storage itself.
    pub fn crash(&mut self) {
        self.queue.clear();
        self.busy = None;
        self.due.clear();
        self.worker.restart();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_storage::{SimStorage, StorageConfig};
    use keel_types::{Entry, EntryPayload, Epoch, HardState, LogIndex};

    fn disk() -> VirtualDisk<SimStorage> {
        let mut storage = SimStorage::new_sim(StorageConfig::default());
        storage.recover().unwrap();
        VirtualDisk::new(storage)
    }

    fn append(index: u64) -> StorageOp {
        StorageOp::Append(vec![Entry {
            epoch: Epoch(1),
            index: LogIndex(index),
            payload: EntryPayload::Noop,
        }])
    }

    #[test]
    fn batches_take_their_fsync_time_and_queue_behind_each_other() {
        let mut d = disk();
        d.submit([(1, append(1)), (2, StorageOp::Sync)], 0, 100).unwrap();
        assert_eq!(d.next_due_ns(), Some(100));
        d.submit([(3, append(2)), (4, StorageOp::Sync)], 10, 100).unwrap();
        assert!(d.poll(99, 100).unwrap().is_empty());
        assert_eq!(
            d.poll(100, 100).unwrap(),
            vec![Completion::Synced { index: LogIndex(1), seq: 2 }]
        );
        assert_eq!(d.next_due_ns(), Some(200), "the second batch started when the first ended");
        assert_eq!(
            d.poll(250, 100).unwrap(),
            vec![Completion::Synced { index: LogIndex(2), seq: 4 }]
        );
        assert_eq!(d.next_due_ns(), None);
    }

    #[test]
    fn a_hard_state_costs_an_fsync_and_a_crash_loses_the_unsynced_batch() {
        let mut d = disk();
        let hard =
            HardState { epoch: Epoch(2), voted_for: None, repair_floor: None, members_epoch: 0 };
        d.submit([(1, StorageOp::HardState(hard)), (2, append(1)), (3, StorageOp::Sync)], 0, 50)
            .unwrap();
        assert_eq!(d.poll(50, 50).unwrap(), vec![Completion::HardStateSaved { seq: 1 }]);
        d.crash();
        d.storage_mut().crash();
        let recovered = d.storage_mut().recover().unwrap();
        assert_eq!(recovered.hard_state, hard, "the hard state was durable when reported");
        assert!(recovered.entries.is_empty(), "the append's fsync never ran");
        assert_eq!(d.next_due_ns(), None);
    }
}
