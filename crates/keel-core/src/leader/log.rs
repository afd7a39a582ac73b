//! The in-memory replicated log: the entries after the last snapshot, in index order.
//! The driver holds the persistent copy; this one serves replication, log matching and
//! the simulator's introspection.

use keel_types::{Entry, EntryPayload, Epoch, LogIndex, SnapshotMeta};
use std::collections::VecDeque;

/// Entries `snapshot.last_index + 1 ..= last_index`, contiguous.
#[derive(Clone, Debug, Default)]
pub struct Log {
    snapshot: SnapshotMeta,
    entries: VecDeque<Entry>,
    /// [`entry_bytes`] summed over `entries`.
    bytes: u64,
}

/// About what one entry takes: its key and value bytes and a fixed overhead.
/// About how many bytes `entry` takes: its key and values and a fixed overhead.
pub(crate) fn entry_bytes(entry: &Entry) -> u64 {
    const OVERHEAD: u64 = 64;
    let EntryPayload::Write { command, .. } = &entry.payload else { return OVERHEAD };
    OVERHEAD + command.payload_bytes() as u64
}

impl Log {
    /// A log that starts after `snapshot` and holds `entries` (contiguous after it).
    pub fn new(snapshot: SnapshotMeta, entries: Vec<Entry>) -> Log {
        let mut log = Log { snapshot, entries: VecDeque::new(), bytes: 0 };
        for entry in entries {
            log.append(entry);
        }
        log
    }

    /// The snapshot the log starts after.
    pub fn snapshot(&self) -> SnapshotMeta {
        self.snapshot
    }

    /// The last index (the snapshot's when the log is empty).
    pub fn last_index(&self) -> LogIndex {
        self.entries.back().map_or(self.snapshot.last_index, |e| e.index)
    }

    /// The epoch of the last entry (the snapshot's when the log is empty).
    pub fn last_epoch(&self) -> Epoch {
        self.entries.back().map_or(self.snapshot.last_epoch, |e| e.epoch)
    }

    /// The epoch of the entry at `index`: known for the snapshot boundary and every entry
    /// held; `None` below the snapshot or past the end.
    pub fn epoch_at(&self, index: LogIndex) -> Option<Epoch> {
        if index == self.snapshot.last_index {
            return Some(self.snapshot.last_epoch);
        }
        self.entry(index).map(|e| e.epoch)
    }

    /// The entry at `index`, if held.
    pub fn entry(&self, index: LogIndex) -> Option<&Entry> {
        if index <= self.snapshot.last_index || index > self.last_index() {
            return None;
        }
        let offset = usize::try_from(index.0 - self.snapshot.last_index.0 - 1).ok()?;
        let entry = &self.entries[offset];
        debug_assert_eq!(entry.index, index);
        Some(entry)
    }

    /// Entries from `from` (inclusive) to `to` (inclusive), those held.
    pub fn range(&self, from: LogIndex, to: LogIndex) -> impl Iterator<Item = &Entry> {
        let first = from.max(self.snapshot.last_index.next());
        let skip = usize::try_from(first.0 - self.snapshot.last_index.0 - 1).unwrap_or(usize::MAX);
        let take =
            if to < first { 0 } else { usize::try_from(to.0 - first.0 + 1).unwrap_or(usize::MAX) };
        self.entries.iter().skip(skip).take(take)
    }

    /// Appends the next entry. Panics unless it is contiguous and its epoch does not go
    /// backwards: both are programmer errors.
    pub fn append(&mut self, entry: Entry) {
        assert_eq!(entry.index, self.last_index().next(), "log append not contiguous");
        assert!(entry.epoch >= self.last_epoch(), "log epochs go backwards");
        self.bytes += entry_bytes(&entry);
        self.entries.push_back(entry);
    }

    /// Removes every entry after `index` (never the snapshot).
    pub fn truncate_after(&mut self, index: LogIndex) {
        assert!(index >= self.snapshot.last_index, "truncation below the snapshot");
        let keep = usize::try_from(index.0 - self.snapshot.last_index.0).expect("fits");
        for removed in self.entries.range(keep.min(self.entries.len())..) {
            self.bytes -= entry_bytes(removed);
        }
        self.entries.truncate(keep);
        assert!(self.last_index() <= index);
    }

    /// Drops entries up to `meta.last_index`, which the new snapshot covers, and returns
    /// them (the caller may free them elsewhere: they can be as large as the state). If
    /// the log does not reach the snapshot, or disagrees with it, every entry is dropped.
    pub fn compact_through(&mut self, meta: SnapshotMeta) -> VecDeque<Entry> {
        assert!(meta.last_index >= self.snapshot.last_index, "snapshot goes backwards");
        let dropped = if self.epoch_at(meta.last_index) == Some(meta.last_epoch) {
            let drop =
                usize::try_from(meta.last_index.0 - self.snapshot.last_index.0).expect("fits");
            // Moves the head out into a buffer of its own (the entries' handles, no
            // per-entry drop here: the caller frees it off the loop). The log keeps its
            // buffer and capacity: had it kept only the short tail, it would grow again
            // from there after every snapshot, reallocating and copying as it doubled.
            let dropped = self.entries.drain(..drop).collect();
            self.bytes = self.entries.iter().map(entry_bytes).sum();
            dropped
        } else {
            self.bytes = 0;
            self.entries.drain(..).collect()
        };
        self.snapshot = meta;
        assert!(self.last_index() >= meta.last_index);
        dropped
    }

    /// About how many bytes the entries held take (keys, values, a fixed overhead each).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// How many entries are held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no entries are held (the snapshot may still cover some).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_types::EntryPayload;

    fn entry(epoch: u64, index: u64) -> Entry {
        Entry { epoch: Epoch(epoch), index: LogIndex(index), payload: EntryPayload::Noop }
    }

    #[test]
    fn append_truncate_compact() {
        let mut log =
            Log::new(SnapshotMeta::default(), vec![entry(1, 1), entry(1, 2), entry(2, 3)]);
        assert_eq!(log.last_index(), LogIndex(3));
        assert_eq!(log.epoch_at(LogIndex(3)), Some(Epoch(2)));
        assert_eq!(log.range(LogIndex(2), LogIndex(9)).count(), 2);
        log.truncate_after(LogIndex(2));
        assert_eq!(log.last_epoch(), Epoch(1));
        log.compact_through(SnapshotMeta { last_index: LogIndex(1), last_epoch: Epoch(1) });
        assert_eq!(log.len(), 1);
        assert_eq!(log.epoch_at(LogIndex(1)), Some(Epoch(1)));
        assert_eq!(log.entry(LogIndex(1)), None);
        log.compact_through(SnapshotMeta { last_index: LogIndex(5), last_epoch: Epoch(3) });
        assert!(log.is_empty());
        assert_eq!(log.last_index(), LogIndex(5));
    }

    #[test]
    fn a_compaction_hands_back_the_head_and_keeps_the_buffer() {
        let mut log = Log::default();
        for index in 1..=1000 {
            log.append(entry(1, index));
        }
        let capacity = log.entries.capacity();
        let dropped =
            log.compact_through(SnapshotMeta { last_index: LogIndex(990), last_epoch: Epoch(1) });
        assert_eq!(dropped.len(), 990);
        assert_eq!(dropped.back().map(|e| e.index), Some(LogIndex(990)));
        assert_eq!(log.len(), 10);
        assert_eq!(log.entry(LogIndex(991)).map(|e| e.index), Some(LogIndex(991)));
        assert_eq!(log.entries.capacity(), capacity, "the log does not grow again from 10");
        let all =
            log.compact_through(SnapshotMeta { last_index: LogIndex(2000), last_epoch: Epoch(2) });
        assert_eq!((all.len(), log.len()), (10, 0));
        assert_eq!(log.entries.capacity(), capacity);
    }

    #[test]
    #[should_panic(expected = "not contiguous")]
    fn gaps_are_refused() {
        let mut log = Log::default();
        log.append(entry(1, 2));
    }
}
