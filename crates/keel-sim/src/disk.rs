//! One keyspace's disk on one node: the real write-ahead log ([`keel_storage::SimStorage`],
//! the same code as the file storage over an in-memory disk with exact power-loss
//! semantics), plus what the simulator models around it. It implements
//! [`keel_storage::Storage`], so the effect executor's worker runs on it exactly as it
//! runs on files in a server.
//!
//! The storage is instantaneous; fsync latency and slow disks are modelled by the
//! executor's `VirtualDisk`, which spaces batches and their completions in virtual time.
//! A crash is a power loss (`crash`: every byte not fsynced is lost) or, when the world
//! allows torn tails, sometimes a torn one (a prefix of each file's unsynced appends
//! survives and recovery cuts it at the first bad record). A restart runs the storage's
//! own recovery.
//!
//! A driver mode, [`HardStateMode::SkipSync`], models a bug: the hard state (epoch and
//! vote) is buffered here instead of being saved, so a crash before the next log fsync
//! makes the node forget its vote. It exists for negative-control tests only.
//!
//! Storage errors are fatal to a node; the simulator injects none through this module,
//! so any error is a bug and panics.

use crate::rng::Rng;
use keel_core::engine::PersistedState;
use keel_storage::{Recovered, SimStorage, Storage, StorageConfig, StorageResult};
use keel_types::{Entry, Epoch, HardState, LogIndex, LogRecord, NodeId, SnapshotMeta};
use std::collections::BTreeSet;

/// Segment size of a simulated log: small, so runs roll over segments and compact them.
pub const SEGMENT_BYTES_SIM: u64 = 16 * 1024;

/// Most unsynced bytes per file a torn crash may keep.
pub const TORN_BYTES_MAX: u64 = 4 * 1024;

/// How the driver persists the engine's hard state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HardStateMode {
    /// Write and fsync before any message is sent (the contract).
    Sync,
    /// Buffer only; lost on crash (a deliberate bug for negative controls).
    SkipSync,
}

/// One keyspace's simulated disk on one node, whose log holds records `R` (the engine's).
pub struct SimDisk<R = Entry> {
    storage: SimStorage<R>,
    /// The hard state last saved to the storage (what a restart recovers).
    hard_state_saved: HardState,
    /// A hard state held back by [`HardStateMode::SkipSync`].
    hard_state_buffered: Option<HardState>,
    mode: HardStateMode,
    /// Every vote the driver ever saved, `(epoch, candidate)`: a vote's message may leave
    /// only once its hard state has been saved, even if a later one has replaced it since.
    /// (A vote the [`HardStateMode::SkipSync`] bug only buffered counts as saved: the
    /// driver believes it is; the invariants must catch what that costs.)
    votes_saved: BTreeSet<(Epoch, NodeId)>,
    /// Whether the hard-state file was damaged since the last recovery (only then may
    /// recovery refuse it: any other refusal is a bug).
    hard_state_damaged: bool,
}

impl<R: LogRecord> std::fmt::Debug for SimDisk<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimDisk")
            .field("hard_state_saved", &self.hard_state_saved)
            .field("hard_state_buffered", &self.hard_state_buffered)
            .field("last_index", &self.storage.last_index())
            .field("synced_index", &self.storage.synced_index())
            .finish()
    }
}

fn fatal<T>(result: StorageResult<T>, what: &str) -> T {
    match result {
        Ok(value) => value,
        Err(e) => panic!("simulated storage failed to {what}: {e}"),
    }
}

impl<R: LogRecord> SimDisk<R> {
    /// An empty disk, already recovered (ready for writes).
    pub fn new(mode: HardStateMode) -> SimDisk<R> {
        let mut storage = SimStorage::new_sim(StorageConfig::small_segments(SEGMENT_BYTES_SIM));
        let recovered = fatal(storage.recover(), "recover an empty disk");
        assert!(recovered.entries.is_empty() && recovered.snapshot.is_none());
        SimDisk {
            storage,
            hard_state_saved: recovered.hard_state,
            hard_state_buffered: None,
            mode,
            votes_saved: BTreeSet::new(),
            hard_state_damaged: false,
        }
    }

    /// Whether a vote for `candidate` in `epoch` has been saved at some point.
    pub fn vote_saved(&self, epoch: Epoch, candidate: NodeId) -> bool {
        self.votes_saved.contains(&(epoch, candidate))
    }

    /// The hard state as the running node last wrote it.
    pub fn hard_state(&self) -> HardState {
        self.hard_state_buffered.unwrap_or(self.hard_state_saved)
    }

    /// The in-memory disk under the log, for what a driver writes beside it (a snapshot
    /// prepared under its temporary name, as a server does on another thread).
    pub fn raw(&mut self) -> &mut keel_storage::SimDisk {
        self.storage.sim_disk()
    }

    /// Flips a bit in the record of `index`, which must be fsynced (bit rot of data the
    /// node already reported durable). Returns whether the log held that record.
    pub fn corrupt_entry(&mut self, index: LogIndex) -> bool {
        self.corrupt_record_byte(index, keel_storage::format::RECORD_HEADER_BYTES + 1)
    }

    /// As [`Self::corrupt_entry`], flipping a bit of byte `byte` of the record (0 to 3:
    /// its length field, 4 to 7: its checksum, 8 on: its payload).
    pub fn corrupt_record_byte(&mut self, index: LogIndex, byte: u64) -> bool {
        assert!(index <= self.synced_index(), "corrupting an entry that is not durable");
        self.storage.corrupt_record_byte(index, byte)
    }

    /// Flips a bit in the seal after entry `index`'s record, if a seal follows it.
    pub fn corrupt_seal_after(&mut self, index: LogIndex, byte: u64) -> bool {
        assert!(index <= self.synced_index(), "corrupting a seal that is not durable");
        self.storage.corrupt_seal_after(index, byte)
    }

    /// Whether the log has a snapshot under it.
    pub fn has_snapshot(&self) -> bool {
        self.storage.snapshot_meta().is_some()
    }

    /// Flips a bit in the newest snapshot file, if there is one.
    pub fn corrupt_snapshot(&mut self, byte: u64) -> bool {
        self.storage.corrupt_snapshot(byte)
    }

    /// Flips a bit in the hard-state file, if there is one.
    pub fn corrupt_hard_state(&mut self, byte: u64) -> bool {
        let hit = self.storage.corrupt_hard_state(byte);
        self.hard_state_damaged |= hit;
        hit
    }

    /// The crash: everything not fsynced is lost, except that with `torn_tail` a random
    /// prefix of each file's unsynced bytes may survive. Runs recovery and returns what
    /// a restart boots from.
    ///
    /// With `keep_cache` it is a process crash instead: the kernel keeps every write,
    /// synced or not (recovery fsyncs what it keeps before reporting it synced), and only
    /// what the process held is lost (a hard state the skip mode buffered).
    ///
    /// A damaged hard-state file stops recovery; the world then does what an operator
    /// does (`docs/operations.md`, "Damaged hard state"): rebuilds it from `seen`, the
    /// greatest epoch the other members hold, and recovers again.
    pub fn crash(
        &mut self,
        rng: &mut Rng,
        torn_tail: bool,
        keep_cache: bool,
        seen: Epoch,
    ) -> PersistedState<R> {
        // A torn tail never outlives a buffered hard state: the skip mode forgets votes,
        // it does not keep entries of an epoch whose hard state it lost. Nor does a kept
        // cache: it would keep entries of an epoch whose vote the process never wrote.
        let keep_cache = keep_cache && self.hard_state_buffered.is_none();
        let tearable = torn_tail && self.hard_state_buffered.is_none() && rng.chance(500_000);
        if keep_cache {
            self.storage.crash_process();
        } else if tearable {
            self.storage.crash_torn(rng.range(1, TORN_BYTES_MAX + 1));
        } else {
            self.storage.crash();
        }
        self.hard_state_buffered = None;
        let recovered = match self.storage.recover() {
            Err(keel_storage::StorageError::HardStateDamaged { .. }) if self.hard_state_damaged => {
                self.storage.reset();
                let rebuilt = fatal(self.storage.rebuild_hard_state(seen), "rebuild");
                self.hard_state_saved = rebuilt;
                fatal(self.storage.recover(), "recover after the repair")
            }
            recovered => fatal(recovered, "recover"),
        };
        self.hard_state_damaged = false;
        // Recovery may add a repair floor (damage inside the log), nothing else.
        let saved =
            HardState { repair_floor: recovered.hard_state.repair_floor, ..self.hard_state_saved };
        assert_eq!(recovered.hard_state, saved, "the saved hard state survives");
        assert!(recovered.hard_state.repair_floor >= self.hard_state_saved.repair_floor);
        self.hard_state_saved = recovered.hard_state;
        let last = recovered.entries.last().map(|e| e.version().index);
        let last = last.or(recovered.snapshot.as_ref().map(|(m, _)| m.last_index));
        assert_eq!(last.unwrap_or(LogIndex::ZERO), self.last_index());
        PersistedState {
            hard_state: recovered.hard_state,
            snapshot: recovered.snapshot,
            entries: recovered.entries,
        }
    }

    /// Saves a hard state buffered by [`HardStateMode::SkipSync`] before anything else
    /// becomes durable (a log fsync, a snapshot), as if they all lived in one file: the
    /// skip loses only votes cast since, never an epoch that durable entries or a
    /// snapshot already carry. It stays buffered until saved, so that if saving fails
    /// (an injected storage error) the crash that follows still loses it.
    fn save_buffered_hard_state(&mut self) -> StorageResult<()> {
        if let Some(hard_state) = self.hard_state_buffered {
            self.save_hard_state_now(hard_state)?;
            self.hard_state_buffered = None;
        }
        Ok(())
    }

    fn save_hard_state_now(&mut self, hard_state: HardState) -> StorageResult<()> {
        self.storage.save_hard_state(&hard_state)?;
        self.hard_state_saved = hard_state;
        Ok(())
    }
}

impl<R: LogRecord> Storage for SimDisk<R> {
    type Record = R;

    fn recover(&mut self) -> StorageResult<Recovered<R>> {
        self.storage.recover()
    }

    fn append(&mut self, entries: &[R]) -> StorageResult<()> {
        self.storage.append(entries)
    }

    fn truncate_after(&mut self, index: LogIndex) -> StorageResult<()> {
        self.storage.truncate_after(index)
    }

    /// A hard state buffered by [`HardStateMode::SkipSync`] is saved with the log's
    /// fsync (as if both lived in one file), so the skip loses only votes cast since
    /// the last log fsync.
    fn sync(&mut self) -> StorageResult<LogIndex> {
        self.save_buffered_hard_state()?;
        self.storage.sync()
    }

    fn save_hard_state(&mut self, hard_state: &HardState) -> StorageResult<()> {
        assert!(hard_state.epoch >= self.hard_state().epoch, "hard state epoch went backwards");
        if let Some(candidate) = hard_state.voted_for {
            self.votes_saved.insert((hard_state.epoch, candidate));
        }
        match self.mode {
            HardStateMode::Sync => self.save_hard_state_now(*hard_state),
            HardStateMode::SkipSync => {
                self.hard_state_buffered = Some(*hard_state);
                Ok(())
            }
        }
    }

    fn save_snapshot(&mut self, meta: SnapshotMeta, data: &[u8]) -> StorageResult<()> {
        self.save_buffered_hard_state()?;
        self.storage.save_snapshot(meta, data)
    }

    fn adopt_snapshot(&mut self, meta: SnapshotMeta, len: u64) -> StorageResult<bool> {
        self.save_buffered_hard_state()?;
        self.storage.adopt_snapshot(meta, len)
    }

    fn compact_through(&mut self, index: LogIndex) -> StorageResult<()> {
        self.storage.compact_through(index)
    }

    fn last_index(&self) -> LogIndex {
        self.storage.last_index()
    }

    fn synced_index(&self) -> LogIndex {
        self.storage.synced_index()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_types::{EntryPayload, Epoch, NodeId};

    /// A disk with the hard state an engine saves before its first entry.
    fn disk() -> SimDisk {
        let mut disk = SimDisk::new(HardStateMode::Sync);
        let first =
            HardState { epoch: Epoch(1), voted_for: None, repair_floor: None, members_epoch: 0 };
        disk.save_hard_state(&first).unwrap();
        disk
    }

    fn entry(epoch: u64, index: u64) -> Entry {
        Entry { epoch: Epoch(epoch), index: LogIndex(index), payload: EntryPayload::Noop }
    }

    #[test]
    fn crash_loses_unsynced_entries_and_keeps_synced_ones() {
        let mut disk = disk();
        disk.append(&[entry(1, 1), entry(1, 2)]).unwrap();
        assert_eq!(disk.sync().unwrap(), LogIndex(2));
        disk.append(&[entry(1, 3)]).unwrap();
        let recovered = disk.crash(&mut Rng::new(1), false, false, Epoch(0));
        assert_eq!(recovered.entries, vec![entry(1, 1), entry(1, 2)]);
        assert_eq!(disk.last_index(), LogIndex(2));
    }

    #[test]
    fn a_process_crash_keeps_unsynced_entries_and_recovery_syncs_them() {
        let mut disk = disk();
        disk.append(&[entry(1, 1), entry(1, 2)]).unwrap();
        assert_eq!(disk.sync().unwrap(), LogIndex(2));
        disk.append(&[entry(1, 3)]).unwrap();
        let recovered = disk.crash(&mut Rng::new(1), false, true, Epoch(0));
        assert_eq!(recovered.entries, vec![entry(1, 1), entry(1, 2), entry(1, 3)]);
        // What recovery kept is durable: a power loss now loses none of it.
        let recovered = disk.crash(&mut Rng::new(1), false, false, Epoch(0));
        assert_eq!(recovered.entries.len(), 3);
    }

    #[test]
    fn torn_tail_keeps_only_a_prefix_of_unsynced_entries() {
        let mut torn = 0;
        for seed in 0..40 {
            let mut disk = disk();
            disk.append(&[entry(1, 1)]).unwrap();
            disk.sync().unwrap();
            disk.append(&[entry(1, 2), entry(1, 3), entry(1, 4)]).unwrap();
            let recovered = disk.crash(&mut Rng::new(seed), true, false, Epoch(0));
            let n = recovered.entries.len();
            assert!((1..=4).contains(&n));
            assert_eq!(recovered.entries, (1..=n as u64).map(|i| entry(1, i)).collect::<Vec<_>>());
            torn += usize::from(n > 1);
        }
        assert!(torn > 0, "no torn tail kept anything in 40 seeds");
    }

    #[test]
    fn skipped_hard_state_sync_forgets_the_vote() {
        let vote = HardState {
            epoch: Epoch(3),
            voted_for: Some(NodeId(2)),
            repair_floor: None,
            members_epoch: 0,
        };
        let mut honest = <SimDisk>::new(HardStateMode::Sync);
        honest.save_hard_state(&vote).unwrap();
        assert_eq!(honest.crash(&mut Rng::new(1), false, false, Epoch(0)).hard_state, vote);
        let mut buggy = <SimDisk>::new(HardStateMode::SkipSync);
        buggy.save_hard_state(&vote).unwrap();
        assert_eq!(buggy.hard_state(), vote);
        assert_eq!(
            buggy.crash(&mut Rng::new(1), false, false, Epoch(0)).hard_state,
            HardState::default()
        );
    }

    #[test]
    #[should_panic(expected = "")]
    fn gap_in_append_is_a_contract_breach() {
        let mut disk = disk();
        disk.append(&[entry(1, 2)]).unwrap();
    }

    #[test]
    fn snapshot_compacts_or_replaces_the_log() {
        let mut disk = disk();
        disk.append(&[entry(1, 1), entry(1, 2), entry(1, 3)]).unwrap();
        disk.sync().unwrap();
        let first = SnapshotMeta { last_index: LogIndex(2), last_epoch: Epoch(1) };
        disk.save_snapshot(first, b"s").unwrap();
        disk.compact_through(LogIndex(2)).unwrap();
        assert_eq!(disk.last_index(), LogIndex(3));
        let second = SnapshotMeta { last_index: LogIndex(9), last_epoch: Epoch(2) };
        disk.save_snapshot(second, b"t").unwrap();
        assert_eq!(disk.last_index(), LogIndex(9));
        assert_eq!(disk.synced_index(), LogIndex(9));
        let recovered = disk.crash(&mut Rng::new(3), false, false, Epoch(0));
        assert!(recovered.entries.is_empty());
        assert_eq!(
            recovered.snapshot.map(|(m, d)| (m.last_index, d)),
            Some((LogIndex(9), b"t".to_vec()))
        );
    }

    #[test]
    fn a_corrupt_synced_entry_cuts_the_log_there() {
        let mut disk = disk();
        disk.append(&[entry(1, 1), entry(1, 2), entry(1, 3)]).unwrap();
        disk.sync().unwrap();
        assert!(disk.corrupt_entry(LogIndex(2)));
        let recovered = disk.crash(&mut Rng::new(1), false, false, Epoch(0));
        assert_eq!(recovered.entries, vec![entry(1, 1)]);
    }
}
