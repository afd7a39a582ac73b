//! The disk model of one node: what the engine asked to write, what is fsynced, and
//! what survives a crash. Everything not fsynced is lost on a crash, except that a torn
//! tail may leave a prefix of the unsynced log entries on disk (a write that reached
//! the platter without an fsync); fsynced data always survives.
//!
//! A driver mode, [`HardStateMode::SkipSync`], models a bug: the hard state (epoch and
//! vote) is buffered instead of fsynced, so a crash before the next log fsync makes the
//! node forget its vote. It exists for negative-control tests only.

use crate::rng::Rng;
use keel_core::leader::PersistedState;
use keel_types::{Entry, HardState, LogIndex, SnapshotMeta};

/// How the driver persists the engine's hard state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HardStateMode {
    /// Write and fsync before any message is sent (the contract).
    Sync,
    /// Buffer only; lost on crash (a deliberate bug for negative controls).
    SkipSync,
}

/// One node's simulated disk.
#[derive(Clone, Debug)]
pub struct SimDisk {
    hard_state_synced: HardState,
    hard_state_buffered: Option<HardState>,
    snapshot: Option<(SnapshotMeta, Vec<u8>)>,
    /// Log entries after the snapshot, contiguous, buffered or synced.
    entries: Vec<Entry>,
    /// Highest index fsynced (covers the snapshot too).
    synced_index: LogIndex,
    mode: HardStateMode,
}

impl SimDisk {
    /// An empty disk.
    pub fn new(mode: HardStateMode) -> SimDisk {
        SimDisk {
            hard_state_synced: HardState::default(),
            hard_state_buffered: None,
            snapshot: None,
            entries: Vec::new(),
            synced_index: LogIndex::ZERO,
            mode,
        }
    }

    /// The hard state as the running node last wrote it.
    pub fn hard_state(&self) -> HardState {
        self.hard_state_buffered.unwrap_or(self.hard_state_synced)
    }

    /// The hard state that would survive a crash now.
    pub fn hard_state_synced(&self) -> HardState {
        self.hard_state_synced
    }

    /// Writes the hard state (and fsyncs it, unless the mode skips that).
    pub fn write_hard_state(&mut self, hard_state: HardState) {
        assert!(hard_state.epoch >= self.hard_state().epoch, "hard state epoch went backwards");
        match self.mode {
            HardStateMode::Sync => self.hard_state_synced = hard_state,
            HardStateMode::SkipSync => self.hard_state_buffered = Some(hard_state),
        }
    }

    /// The index of the last entry on disk (buffered or synced).
    pub fn last_index(&self) -> LogIndex {
        match self.entries.last() {
            Some(e) => e.index,
            None => self.snapshot_index(),
        }
    }

    /// Highest index fsynced.
    pub fn synced_index(&self) -> LogIndex {
        self.synced_index
    }

    fn snapshot_index(&self) -> LogIndex {
        self.snapshot.as_ref().map_or(LogIndex::ZERO, |(m, _)| m.last_index)
    }

    /// Removes every entry after `index`. Truncating below the snapshot is a bug.
    pub fn truncate_after(&mut self, index: LogIndex) {
        assert!(index >= self.snapshot_index(), "truncation below the snapshot");
        self.entries.retain(|e| e.index <= index);
        self.synced_index = self.synced_index.min(index);
    }

    /// Appends entries contiguous with the log; panics on a gap (a contract breach).
    pub fn append(&mut self, entries: &[Entry]) {
        for entry in entries {
            let expected = self.last_index().next();
            assert_eq!(entry.index, expected, "append not contiguous with the log");
            if let Some(last) = self.entries.last() {
                assert!(entry.epoch >= last.epoch, "entry epochs decrease along the log");
            }
            self.entries.push(entry.clone());
        }
    }

    /// Fsyncs the log through `index` (clipped to what is there); returns the new
    /// synced index. A hard state buffered by [`HardStateMode::SkipSync`] reaches the disk
    /// with it (as if both lived in one file), so the skip loses only votes cast since the
    /// last log fsync: the node forgets a vote, never holds entries of an epoch it lost.
    pub fn sync(&mut self, index: LogIndex) -> LogIndex {
        if let Some(hard_state) = self.hard_state_buffered.take() {
            self.hard_state_synced = hard_state;
        }
        let target = index.min(self.last_index());
        self.synced_index = self.synced_index.max(target);
        debug_assert!(self.synced_index <= self.last_index());
        self.synced_index
    }

    /// Saves a snapshot durably and compacts the log up to it. A snapshot beyond or in
    /// conflict with the log (installed from the leader) replaces the whole log.
    pub fn save_snapshot(&mut self, meta: SnapshotMeta, data: Vec<u8>) {
        assert!(meta.last_index >= self.snapshot_index(), "snapshot older than the current one");
        let matches =
            self.entries.iter().any(|e| e.index == meta.last_index && e.epoch == meta.last_epoch);
        if matches {
            self.entries.retain(|e| e.index > meta.last_index);
        } else {
            self.entries.clear();
        }
        self.synced_index = self.synced_index.max(meta.last_index);
        self.snapshot = Some((meta, data));
    }

    /// The crash: everything not fsynced is lost, except that with `torn_tail` a random
    /// prefix of the unsynced entries survives. Returns what a restart recovers.
    pub fn crash(&mut self, rng: &mut Rng, torn_tail: bool) -> PersistedState {
        let unsynced = self.entries.iter().filter(|e| e.index > self.synced_index).count();
        // A torn tail never outlives a buffered hard state: the skip mode forgets votes,
        // it does not keep entries of an epoch whose hard state it lost.
        let tearable = torn_tail && unsynced > 0 && self.hard_state_buffered.is_none();
        let kept = if tearable { rng.index(unsynced + 1) } else { 0 };
        let keep_through = LogIndex(self.synced_index.0 + kept as u64);
        self.entries.retain(|e| e.index <= keep_through);
        self.synced_index = self.last_index();
        self.hard_state_buffered = None;
        assert!(self.entries.iter().all(|e| e.index <= self.synced_index));
        PersistedState {
            hard_state: self.hard_state_synced,
            snapshot: self.snapshot.clone(),
            entries: self.entries.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_types::{EntryPayload, Epoch, NodeId};

    fn entry(epoch: u64, index: u64) -> Entry {
        Entry { epoch: Epoch(epoch), index: LogIndex(index), payload: EntryPayload::Noop }
    }

    #[test]
    fn crash_loses_unsynced_entries_and_keeps_synced_ones() {
        let mut disk = SimDisk::new(HardStateMode::Sync);
        disk.append(&[entry(1, 1), entry(1, 2), entry(1, 3)]);
        assert_eq!(disk.sync(LogIndex(2)), LogIndex(2));
        let recovered = disk.crash(&mut Rng::new(1), false);
        assert_eq!(recovered.entries, vec![entry(1, 1), entry(1, 2)]);
        assert_eq!(disk.last_index(), LogIndex(2));
    }

    #[test]
    fn torn_tail_keeps_only_a_prefix_of_unsynced_entries() {
        for seed in 0..20 {
            let mut disk = SimDisk::new(HardStateMode::Sync);
            disk.append(&[entry(1, 1), entry(1, 2), entry(1, 3), entry(1, 4)]);
            disk.sync(LogIndex(1));
            let recovered = disk.crash(&mut Rng::new(seed), true);
            let n = recovered.entries.len();
            assert!((1..=4).contains(&n));
            assert_eq!(recovered.entries, (1..=n as u64).map(|i| entry(1, i)).collect::<Vec<_>>());
        }
    }

    #[test]
    fn skipped_hard_state_sync_forgets_the_vote() {
        let vote = HardState { epoch: Epoch(3), voted_for: Some(NodeId(2)) };
        let mut honest = SimDisk::new(HardStateMode::Sync);
        honest.write_hard_state(vote);
        assert_eq!(honest.crash(&mut Rng::new(1), false).hard_state, vote);
        let mut buggy = SimDisk::new(HardStateMode::SkipSync);
        buggy.write_hard_state(vote);
        assert_eq!(buggy.hard_state(), vote);
        assert_eq!(buggy.crash(&mut Rng::new(1), false).hard_state, HardState::default());
    }

    #[test]
    #[should_panic(expected = "not contiguous")]
    fn gap_in_append_is_a_contract_breach() {
        let mut disk = SimDisk::new(HardStateMode::Sync);
        disk.append(&[entry(1, 2)]);
    }

    #[test]
    fn snapshot_compacts_or_replaces_the_log() {
        let mut disk = SimDisk::new(HardStateMode::Sync);
        disk.append(&[entry(1, 1), entry(1, 2), entry(1, 3)]);
        disk.save_snapshot(SnapshotMeta { last_index: LogIndex(2), last_epoch: Epoch(1) }, vec![]);
        assert_eq!(disk.last_index(), LogIndex(3));
        disk.save_snapshot(SnapshotMeta { last_index: LogIndex(9), last_epoch: Epoch(2) }, vec![]);
        assert_eq!(disk.last_index(), LogIndex(9));
        assert_eq!(disk.synced_index(), LogIndex(9));
    }
}
