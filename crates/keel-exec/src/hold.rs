//! [`AppendHold`]: log appends held on the engine loop for a moment, so that the storage
//! worker is handed many steps' entries at once instead of one step's at a time.
//!
//! Why: a server's worker is a thread; handing it an operation when it sleeps costs a
//! wake-up and two context switches, and an engine under load steps thousands of times a
//! second, each step appending a few entries. Held appends are merged into one operation
//! and handed over when the hold ends.
//!
//! Why it is safe: an append is buffered. Carrying it out makes nothing durable, and no
//! completion reports it; only a log sync does, and a sync (like every operation other
//! than an append: hard state, truncation, snapshots) first releases the held appends, in
//! order. The worker therefore carries out the same operations in the same order, with
//! some appends merged; what a crash can lose is what it could lose before (everything
//! after the last fsync).
//!
//! A merged append carries the sequence number of the last append it took in: a later
//! completion's sequence number still means "every operation up to it", and the worker
//! accepts numbers with gaps.

use crate::op::StorageOp;
use keel_core::time::Time;
use keel_types::Entry;

/// How long the first held append waits at most before it is handed over: the worker
/// is then woken a few hundred times a second under load instead of once per step.
pub const APPEND_HOLD_NS: u64 = 5_000_000;

/// Most log entries held: the append that reaches it is handed over with the rest.
pub const APPEND_HOLD_ENTRIES_MAX: usize = 1024;

/// Appends held until a time, a count or another operation releases them.
#[derive(Debug)]
pub struct AppendHold<L = Entry> {
    /// How long the first held append waits at most, in nanoseconds (0: none is held).
    hold_ns: u64,
    /// Most entries held; the append that reaches it is released with the rest.
    entries_max: usize,
    /// The held entries, in log order, with the last append's sequence number.
    held: Option<(u64, Vec<L>)>,
    /// When the hold ends (set by the first held append).
    due: Option<Time>,
}

impl<L> AppendHold<L> {
    /// A hold of at most `hold_ns` nanoseconds and `entries_max` entries; with `hold_ns`
    /// 0 every operation passes at once.
    pub fn new(hold_ns: u64, entries_max: usize) -> AppendHold<L> {
        assert!(entries_max >= 1, "an append holds at least one entry");
        AppendHold { hold_ns, entries_max, held: None, due: None }
    }

    /// Takes the next numbered operation (numbers increase) and puts in `out`, in order,
    /// what is to be handed to the worker now: nothing when the append is held.
    pub fn push(&mut self, now: Time, op: (u64, StorageOp<L>), out: &mut Vec<(u64, StorageOp<L>)>) {
        let (seq, op) = op;
        match op {
            StorageOp::Append(entries) if self.hold_ns > 0 => {
                let (last, held) = self.held.get_or_insert_with(|| (seq, Vec::new()));
                assert!(seq >= *last, "operations arrive in sequence order");
                *last = seq;
                held.extend(entries);
                self.due.get_or_insert(Time(now.0.saturating_add(self.hold_ns)));
                if held.len() >= self.entries_max {
                    self.release(out);
                }
            }
            op => {
                self.release(out);
                out.push((seq, op));
            }
        }
    }

    /// When the held appends are to be released (`None`: none is held).
    pub fn due_at(&self) -> Option<Time> {
        self.due
    }

    /// Puts the held appends, merged into one, in `out` (nothing when none is held).
    pub fn release(&mut self, out: &mut Vec<(u64, StorageOp<L>)>) {
        self.due = None;
        if let Some((seq, entries)) = self.held.take() {
            out.push((seq, StorageOp::Append(entries)));
        }
    }

    /// Whether no append is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_types::{EntryPayload, Epoch, HardState, LogIndex};

    fn entry(index: u64) -> Entry {
        Entry { epoch: Epoch(1), index: LogIndex(index), payload: EntryPayload::Noop }
    }

    fn append(seq: u64, indexes: std::ops::RangeInclusive<u64>) -> (u64, StorageOp) {
        (seq, StorageOp::Append(indexes.map(entry).collect()))
    }

    #[test]
    fn appends_are_held_merged_and_released_in_order_before_any_other_operation() {
        let mut hold = AppendHold::new(1_000, 100);
        let mut out = Vec::new();
        hold.push(Time(10), append(1, 1..=2), &mut out);
        hold.push(Time(20), append(2, 3..=3), &mut out);
        assert!(out.is_empty(), "both appends held");
        assert_eq!(hold.due_at(), Some(Time(1_010)), "due from the first held append");
        hold.push(Time(30), (3, StorageOp::Sync), &mut out);
        assert_eq!(out, vec![append(2, 1..=3), (3, StorageOp::Sync)]);
        assert!(hold.is_empty() && hold.due_at().is_none());

        let hard =
            HardState { epoch: Epoch(2), voted_for: None, repair_floor: None, members_epoch: 0 };
        hold.push(Time(40), append(4, 4..=4), &mut out);
        hold.push(Time(50), (5, StorageOp::HardState(hard)), &mut out);
        assert_eq!(out[2..], [append(4, 4..=4), (5, StorageOp::HardState(hard))]);
    }

    #[test]
    fn a_hold_ends_at_its_count_or_when_released() {
        let mut hold = AppendHold::new(1_000, 3);
        let mut out = Vec::new();
        hold.push(Time(0), append(1, 1..=2), &mut out);
        hold.push(Time(0), append(2, 3..=4), &mut out);
        assert_eq!(out, vec![append(2, 1..=4)], "released on reaching the count");
        hold.push(Time(5), append(3, 5..=5), &mut out);
        hold.release(&mut out);
        hold.release(&mut out);
        assert_eq!(out, vec![append(2, 1..=4), append(3, 5..=5)], "a second release adds nothing");
    }

    #[test]
    fn the_worker_carries_merged_appends_out_and_a_sync_reports_them() {
        use crate::{Completion, Worker};
        use keel_storage::{SimStorage, Storage, StorageConfig};
        let mut storage = SimStorage::new_sim(StorageConfig::default());
        storage.recover().unwrap();
        let mut worker = Worker::new(storage);
        let mut hold = AppendHold::new(1_000, 100);
        let mut out = Vec::new();
        for (seq, index) in (1..=3).zip(1..) {
            hold.push(Time(0), append(seq, index..=index), &mut out);
        }
        assert!(out.is_empty());
        hold.push(Time(1), (4, StorageOp::Sync), &mut out);
        let mut done = Vec::new();
        worker.run(out, &mut |c| done.push(c)).unwrap();
        assert_eq!(done, vec![Completion::Synced { index: LogIndex(3), seq: 4 }]);
        assert_eq!(worker.storage().last_index(), LogIndex(3));
    }

    #[test]
    fn without_a_hold_every_operation_passes_at_once() {
        let mut hold = AppendHold::new(0, 100);
        let mut out = Vec::new();
        hold.push(Time(0), append(1, 1..=1), &mut out);
        hold.push(Time(0), append(2, 2..=2), &mut out);
        assert_eq!(out, vec![append(1, 1..=1), append(2, 2..=2)]);
        assert!(hold.due_at().is_none());
    }
}
