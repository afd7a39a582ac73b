//! Unit tests of the write-ahead log, run on the simulated disk and on real files.

use crate::format::{segment_name, HARD_STATE_NAME, RECORD_HEADER_BYTES, SEAL_BYTES};
use crate::{
    Disk, FileStorage, Recovered, SimFault, SimStorage, Storage, StorageConfig, StorageError, Wal,
};
use keel_types::{
    ClientId, Command, Durability, Entry, EntryPayload, Epoch, HardState, LogIndex, NodeId,
    RequestId, SnapshotMeta, Version,
};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

/// A directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(label: &str) -> TempDir {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("keel-storage-{label}-{}-{n}", std::process::id());
        let path = std::env::temp_dir().join(name);
        let _ = std::fs::remove_dir_all(&path);
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A storage a test can restart as after a process crash (the kernel keeps writes).
trait Restart: Storage<Record = Entry> {
    fn restart(&mut self);
}

impl Restart for SimStorage {
    fn restart(&mut self) {
        self.crash_process();
    }
}

impl Restart for FileStorage {
    fn restart(&mut self) {
        let dir = self.disk_mut_unchecked().dir().to_path_buf();
        let config = self.config().clone();
        *self = Wal::open(dir, config).unwrap();
    }
}

fn config() -> StorageConfig {
    StorageConfig::small_segments(200)
}

fn entry(index: u64, epoch: u64) -> Entry {
    let value = vec![b'v'; (index % 7) as usize * 5];
    Entry {
        epoch: Epoch(epoch),
        index: LogIndex(index),
        payload: EntryPayload::Write {
            client: ClientId(index % 3),
            request: RequestId(index),
            durability: Durability::Memory,
            command: Command::Put {
                key: format!("k{index}").into_bytes().into(),
                value: value.into(),
            },
        },
    }
}

fn entries(first: u64, last: u64, epoch: u64) -> Vec<Entry> {
    (first..=last).map(|i| entry(i, epoch)).collect()
}

/// The hard state an engine saves before the first entry of epoch 1 (recovery refuses a
/// log without one).
fn first_hard_state() -> HardState {
    HardState { epoch: Epoch(1), voted_for: None, repair_floor: None, members_epoch: 0 }
}

fn sim() -> SimStorage {
    sim_with(config())
}

/// A simulated storage, recovered blank, with its first hard state saved.
fn sim_with(config: StorageConfig) -> SimStorage {
    let mut storage = SimStorage::new_sim(config);
    assert_eq!(storage.recover().unwrap(), Default::default());
    storage.save_hard_state(&first_hard_state()).unwrap();
    storage
}

fn file(dir: &TempDir) -> FileStorage {
    let mut storage = <FileStorage>::open(&dir.0, config()).unwrap();
    let recovered = storage.recover().unwrap();
    if recovered.hard_state == HardState::default() {
        storage.save_hard_state(&first_hard_state()).unwrap();
    }
    storage
}

/// Appends, syncs, truncates and snapshots, restarting in between; checks every recovery.
fn round_trip_scenario(storage: &mut impl Restart) {
    let hard_state = HardState {
        epoch: Epoch(3),
        voted_for: Some(NodeId(2)),
        repair_floor: None,
        members_epoch: 0,
    };
    storage.save_hard_state(&hard_state).unwrap();
    storage.append(&entries(1, 30, 1)).unwrap();
    assert_eq!(storage.sync().unwrap(), LogIndex(30));
    storage.restart();
    let recovered = storage.recover().unwrap();
    assert_eq!(recovered.hard_state, hard_state);
    assert_eq!(recovered.entries, entries(1, 30, 1));
    storage.truncate_after(LogIndex(12)).unwrap();
    storage.append(&entries(13, 20, 2)).unwrap();
    storage.restart();
    let mut expected = entries(1, 12, 1);
    expected.extend(entries(13, 20, 2));
    assert_eq!(storage.recover().unwrap().entries, expected);
    let meta = SnapshotMeta { last_index: LogIndex(15), last_epoch: Epoch(2) };
    storage.save_snapshot(meta, b"state at 15").unwrap();
    storage.compact_through(LogIndex(15)).unwrap();
    storage.restart();
    let recovered = storage.recover().unwrap();
    assert_eq!(recovered.snapshot, Some((meta, b"state at 15".to_vec())));
    assert_eq!(recovered.entries, entries(16, 20, 2));
    assert_eq!(storage.last_index(), LogIndex(20));
}

#[test]
fn round_trip_on_the_simulated_disk() {
    round_trip_scenario(&mut sim());
}

#[test]
fn round_trip_on_files() {
    let dir = TempDir::new("round-trip");
    round_trip_scenario(&mut file(&dir));
}

#[test]
fn small_segments_roll_and_compaction_removes_covered_ones() {
    let mut storage = sim();
    storage.append(&entries(1, 40, 1)).unwrap();
    storage.sync().unwrap();
    let segments_before = storage.segment_count();
    assert!(segments_before > 4, "200-byte segments roll often");
    let meta = SnapshotMeta { last_index: LogIndex(30), last_epoch: Epoch(1) };
    storage.save_snapshot(meta, b"s").unwrap();
    storage.compact_through(LogIndex(30)).unwrap();
    assert!(storage.segment_count() < segments_before);
    let first_kept = *storage.log().segments.keys().next().unwrap();
    assert!(first_kept <= LogIndex(31), "no entry after the snapshot was removed");
    storage.crash();
    assert_eq!(storage.recover().unwrap().entries, entries(31, 40, 1));
}

#[test]
fn a_crash_loses_exactly_the_unsynced_suffix() {
    let mut storage = sim();
    storage.append(&entries(1, 10, 1)).unwrap();
    assert_eq!(storage.sync().unwrap(), LogIndex(10));
    storage.append(&entries(11, 25, 1)).unwrap();
    assert_eq!(storage.synced_index(), LogIndex(10));
    storage.crash();
    assert_eq!(storage.recover().unwrap().entries, entries(1, 10, 1));
    assert_eq!((storage.last_index(), storage.synced_index()), (LogIndex(10), LogIndex(10)));
    storage.append(&entries(11, 12, 2)).unwrap();
    storage.sync().unwrap();
    storage.crash();
    let mut expected = entries(1, 10, 1);
    expected.extend(entries(11, 12, 2));
    assert_eq!(storage.recover().unwrap().entries, expected);
}

#[test]
fn a_torn_last_record_is_cut_at_every_byte() {
    // One segment, so that the torn record's file is durable (its name was synced).
    let mut reference = sim_with(StorageConfig::small_segments(4096));
    reference.append(&entries(1, 5, 1)).unwrap();
    reference.sync().unwrap();
    reference.append(&[entry(6, 1)]).unwrap();
    assert_eq!(reference.segment_count(), 1);
    let (name, _) = reference.record_offset(LogIndex(6)).unwrap();
    let full = reference.sim_disk().read(&name).unwrap().len() as u64;
    // Record 6 starts after record 5's seal: the unsynced bytes are record 6 alone.
    let start = reference.sim_disk().durable_bytes(&name).len() as u64;
    assert!(full > start);
    for keep in 0..=(full - start) {
        let mut storage = reference.clone();
        storage.crash_torn(keep);
        let expected_last = if keep == full - start { 6 } else { 5 };
        assert_eq!(storage.recover().unwrap().entries, entries(1, expected_last, 1), "keep {keep}");
        storage.append(&[entry(expected_last + 1, 2)]).unwrap();
        storage.sync().unwrap();
        storage.crash();
        assert_eq!(storage.recover().unwrap().entries.len() as u64, expected_last + 1);
    }
}

/// The record starting at `start` in `image`: its length field and where it ends.
fn storage_record_end(image: &[u8], start: u64) -> (u32, u64) {
    let at = start as usize;
    let len = u32::from_le_bytes(image[at..at + 4].try_into().unwrap());
    (len, start + RECORD_HEADER_BYTES + u64::from(len))
}

#[test]
fn a_torn_file_tail_is_cut_at_every_byte() {
    let dir = TempDir::new("torn");
    let mut storage = <FileStorage>::open(&dir.0, StorageConfig::default()).unwrap();
    storage.recover().unwrap();
    storage.save_hard_state(&first_hard_state()).unwrap();
    storage.append(&entries(1, 3, 1)).unwrap();
    storage.sync().unwrap();
    let (name, start) = storage.record_offset(LogIndex(3)).unwrap();
    drop(storage);
    let path = dir.0.join(&name);
    let image = std::fs::read(&path).unwrap();
    let (_, end) = storage_record_end(&image, start);
    assert_eq!(image.len() as u64, end + SEAL_BYTES, "record 3, then its seal");
    for cut in start..image.len() as u64 {
        std::fs::write(&path, &image[..cut as usize]).unwrap();
        let mut storage = <FileStorage>::open(&dir.0, StorageConfig::default()).unwrap();
        let recovered = storage.recover().unwrap();
        // A cut inside record 3 tears it; a cut inside its seal tears only the seal.
        let (last, len) = if cut < end { (2, start) } else { (3, end) };
        assert_eq!(recovered.entries, entries(1, last, 1), "cut {cut}");
        assert_eq!(recovered.damage, None, "a torn tail is not damage");
        let kept = std::fs::metadata(&path).unwrap().len();
        assert_eq!(kept, len + SEAL_BYTES, "the tail is cut away and what is kept sealed");
    }
}

#[test]
fn a_corrupt_record_in_the_middle_ends_the_log_there() {
    let mut storage = sim();
    storage.append(&entries(1, 30, 1)).unwrap();
    storage.sync().unwrap();
    let segments_before = storage.segment_count();
    assert!(storage.corrupt_entry(LogIndex(9)));
    assert!(!storage.corrupt_entry(LogIndex(99)));
    storage.crash();
    let recovered = storage.recover().unwrap();
    assert_eq!(recovered.entries, entries(1, 8, 1));
    let floor = Version { epoch: Epoch(1), index: LogIndex(30) };
    let damage = recovered.damage.expect("intact records follow the bad one: damage");
    assert_eq!((damage.at, damage.through), (LogIndex(9), floor));
    assert_eq!(recovered.hard_state.repair_floor, Some(floor), "the promise is kept");
    assert!(storage.segment_count() < segments_before, "later segments are removed");
    storage.append(&entries(9, 10, 2)).unwrap();
    storage.sync().unwrap();
    storage.crash();
    let recovered = storage.recover().unwrap();
    assert_eq!(recovered.entries.len(), 10);
    assert_eq!(recovered.damage, None);
    assert_eq!(recovered.hard_state.repair_floor, Some(floor), "the floor outlives the cut");
}

#[test]
fn a_corrupt_last_record_is_told_from_a_torn_one_by_its_seal() {
    for last in 1..=6 {
        let mut storage = sim();
        storage.append(&entries(1, last, 1)).unwrap();
        storage.sync().unwrap();
        assert!(storage.corrupt_entry(LogIndex(last)));
        storage.crash();
        let recovered = storage.recover().unwrap();
        assert_eq!(recovered.entries, entries(1, last - 1, 1));
        let floor = Version { epoch: Epoch(1), index: LogIndex(last) };
        assert_eq!(recovered.damage.map(|d| d.through), Some(floor), "last {last}");
        assert_eq!(recovered.hard_state.repair_floor, Some(floor));
    }
}

#[test]
fn damage_to_a_length_field_or_checksum_is_found_by_the_seals_after_it() {
    // One segment, several synced batches; each byte of each header field of a record
    // in the middle, and of the first record after a seal.
    for index in [3u64, 4] {
        for byte in 0..8 {
            let mut storage = sim_with(StorageConfig::small_segments(1 << 20));
            for batch in [(1, 3), (4, 6), (7, 9)] {
                storage.append(&entries(batch.0, batch.1, 1)).unwrap();
                storage.sync().unwrap();
            }
            assert!(storage.corrupt_record_byte(LogIndex(index), byte));
            storage.crash();
            let recovered = storage.recover().unwrap();
            assert_eq!(recovered.entries, entries(1, index - 1, 1), "index {index} byte {byte}");
            let damage = recovered.damage.unwrap_or_else(|| panic!("index {index} byte {byte}"));
            assert_eq!(damage.at, LogIndex(index));
            assert_eq!(damage.through, Version { epoch: Epoch(1), index: LogIndex(9) });
        }
    }
}

#[test]
fn a_damaged_seal_before_an_intact_record_costs_nothing() {
    let mut storage = sim_with(StorageConfig::small_segments(1 << 20));
    storage.append(&entries(1, 3, 1)).unwrap();
    storage.sync().unwrap();
    storage.append(&entries(4, 6, 1)).unwrap();
    storage.sync().unwrap();
    // The seal after record 3 sits just before record 4.
    let (name, start) = storage.record_offset(LogIndex(4)).unwrap();
    assert!(storage.sim_disk().corrupt(&name, start - 4), "a byte of the seal");
    storage.crash();
    let recovered = storage.recover().unwrap();
    assert_eq!(recovered.entries, entries(1, 6, 1), "nothing is cut");
    assert_eq!((recovered.damage, recovered.hard_state.repair_floor), (None, None));
}

#[test]
fn damage_the_snapshot_covers_sets_no_floor() {
    let mut storage = sim();
    storage.append(&entries(1, 30, 1)).unwrap();
    storage.sync().unwrap();
    let meta = SnapshotMeta { last_index: LogIndex(30), last_epoch: Epoch(1) };
    storage.save_snapshot(meta, b"state").unwrap();
    if !storage.corrupt_entry(LogIndex(29)) {
        return; // compacted away: nothing to damage
    }
    storage.crash();
    let recovered = storage.recover().unwrap();
    assert!(recovered.damage.is_some());
    assert_eq!(recovered.hard_state.repair_floor, None, "the snapshot holds those entries");
    assert_eq!(recovered.entries, Vec::new());
}

#[test]
fn truncation_is_durable_and_crosses_segments() {
    let mut storage = sim();
    storage.append(&entries(1, 30, 1)).unwrap();
    storage.sync().unwrap();
    let segments_before = storage.segment_count();
    storage.truncate_after(LogIndex(4)).unwrap();
    assert!(storage.segment_count() < segments_before);
    assert_eq!((storage.last_index(), storage.synced_index()), (LogIndex(4), LogIndex(4)));
    storage.crash();
    assert_eq!(storage.recover().unwrap().entries, entries(1, 4, 1), "removed entries stay gone");
    storage.truncate_after(LogIndex(9)).unwrap(); // past the end: nothing happens
    storage.truncate_after(LogIndex(0)).unwrap();
    assert_eq!(storage.segment_count(), 0);
    storage.append(&entries(1, 3, 4)).unwrap();
    storage.sync().unwrap();
    storage.crash();
    assert_eq!(storage.recover().unwrap().entries, entries(1, 3, 4));
}

#[test]
fn truncation_at_a_segment_boundary_reuses_the_name() {
    let mut storage = sim();
    storage.append(&entries(1, 30, 1)).unwrap();
    storage.sync().unwrap();
    let second = *storage.log().segments.keys().nth(1).unwrap();
    storage.truncate_after(second.prev()).unwrap();
    storage.append(&entries(second.0, second.0 + 2, 2)).unwrap();
    storage.sync().unwrap();
    storage.crash();
    let recovered = storage.recover().unwrap().entries;
    assert_eq!(recovered.len() as u64, second.0 + 2);
    assert_eq!(recovered.last().unwrap().epoch, Epoch(2));
}

#[test]
fn a_snapshot_past_the_log_or_disagreeing_with_it_replaces_the_log() {
    let mut storage = sim();
    storage.append(&entries(1, 5, 1)).unwrap();
    storage.sync().unwrap();
    let meta = SnapshotMeta { last_index: LogIndex(50), last_epoch: Epoch(3) };
    storage.save_snapshot(meta, b"fifty").unwrap();
    assert_eq!((storage.last_index(), storage.segment_count()), (LogIndex(50), 0));
    storage.append(&entries(51, 52, 3)).unwrap();
    storage.sync().unwrap();
    storage.crash();
    let recovered = storage.recover().unwrap();
    assert_eq!(recovered.snapshot.unwrap().0, meta);
    assert_eq!(recovered.entries, entries(51, 52, 3));
    let conflicting = SnapshotMeta { last_index: LogIndex(52), last_epoch: Epoch(4) };
    storage.save_snapshot(conflicting, b"other").unwrap();
    assert_eq!(storage.segment_count(), 0);
    storage.crash();
    assert!(storage.recover().unwrap().entries.is_empty());
}

#[test]
fn a_failed_fsync_poisons_the_storage() {
    let mut storage = sim();
    storage.append(&entries(1, 3, 1)).unwrap();
    storage.sync().unwrap();
    storage.append(&entries(4, 6, 1)).unwrap();
    storage.sim_disk().fail_next(SimFault::Sync);
    assert!(matches!(storage.sync(), Err(StorageError::Io { op: "fsync", .. })));
    assert!(storage.is_poisoned());
    assert_eq!(storage.synced_index(), LogIndex(3), "nothing reported durable that is not");
    let later = storage.append(&entries(7, 7, 1)).unwrap_err();
    assert!(matches!(later, StorageError::Poisoned { .. }) && !later.is_retryable());
    assert!(matches!(storage.sync(), Err(StorageError::Poisoned { .. })));
    assert!(storage.save_hard_state(&HardState::default()).is_err());
    storage.crash();
    assert_eq!(storage.recover().unwrap().entries, entries(1, 3, 1));
}

#[test]
fn a_failed_hard_state_write_keeps_the_old_one() {
    let mut storage = sim();
    let old = HardState {
        epoch: Epoch(1),
        voted_for: Some(NodeId(1)),
        repair_floor: None,
        members_epoch: 0,
    };
    storage.save_hard_state(&old).unwrap();
    storage.sim_disk().fail_next(SimFault::Sync);
    let new = HardState {
        epoch: Epoch(2),
        voted_for: Some(NodeId(3)),
        repair_floor: None,
        members_epoch: 0,
    };
    assert!(storage.save_hard_state(&new).is_err());
    storage.crash();
    assert_eq!(storage.recover().unwrap().hard_state, old);
    assert!(storage.sim_disk().list().unwrap().iter().all(|n| !n.ends_with(".tmp")));
}

#[test]
fn a_missing_hard_state_beside_a_log_stops_recovery_too() {
    let mut storage = sim();
    storage.append(&entries(1, 4, 1)).unwrap();
    storage.sync().unwrap();
    storage.sim_disk().remove(HARD_STATE_NAME).unwrap();
    storage.sim_disk().sync_dir().unwrap();
    storage.crash();
    let err = storage.recover().unwrap_err();
    assert!(matches!(err, StorageError::HardStateDamaged { .. }), "{err}");
    storage.reset();
    assert_eq!(storage.rebuild_hard_state(Epoch(3)).unwrap().epoch, Epoch(4));
    assert_eq!(storage.recover().unwrap().entries, entries(1, 4, 1));
}

#[test]
fn a_damaged_hard_state_file_stops_recovery_until_it_is_rebuilt() {
    let dir = TempDir::new("hard-state");
    let mut storage = file(&dir);
    storage
        .save_hard_state(&HardState {
            epoch: Epoch(7),
            voted_for: None,
            repair_floor: None,
            members_epoch: 0,
        })
        .unwrap();
    drop(storage);
    let path = dir.0.join(HARD_STATE_NAME);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[9] ^= 1;
    std::fs::write(&path, bytes).unwrap();
    let mut storage = <FileStorage>::open(&dir.0, config()).unwrap();
    let err = storage.recover().unwrap_err();
    assert!(matches!(err, StorageError::HardStateDamaged { .. }));
    assert!(err.to_string().contains("keel repair-hard-state"), "{err}");
    assert!(storage.is_poisoned());
    // The operator's repair: the epoch after the greatest one the other members report.
    let mut storage = <FileStorage>::open(&dir.0, config()).unwrap();
    let rebuilt = storage.rebuild_hard_state(Epoch(9)).unwrap();
    assert_eq!(
        rebuilt,
        HardState { epoch: Epoch(10), voted_for: None, repair_floor: None, members_epoch: 0 }
    );
    assert_eq!(storage.recover().unwrap().hard_state, rebuilt);
}

#[test]
fn a_rebuilt_hard_state_is_never_older_than_the_log() {
    let mut storage = sim();
    storage.append(&entries(1, 12, 5)).unwrap();
    storage.sync().unwrap();
    storage
        .save_hard_state(&HardState {
            epoch: Epoch(5),
            voted_for: None,
            repair_floor: None,
            members_epoch: 0,
        })
        .unwrap();
    assert!(storage.corrupt_hard_state(9));
    storage.crash();
    assert!(matches!(storage.recover(), Err(StorageError::HardStateDamaged { .. })));
    storage.reset();
    assert_eq!(storage.rebuild_hard_state(Epoch(2)).unwrap().epoch, Epoch(5));
    let recovered = storage.recover().unwrap();
    assert_eq!(recovered.entries, entries(1, 12, 5), "the log is kept");
}

/// Saves a snapshot at 30 over a log of 1..=40 (epoch 2), damages the snapshot's byte
/// `byte`, and recovers.
fn recover_with_damaged_snapshot(byte: u64) -> Recovered {
    let mut storage = sim();
    storage
        .save_hard_state(&HardState {
            epoch: Epoch(3),
            voted_for: None,
            repair_floor: None,
            members_epoch: 0,
        })
        .unwrap();
    storage.append(&entries(1, 40, 2)).unwrap();
    storage.sync().unwrap();
    let meta = SnapshotMeta { last_index: LogIndex(30), last_epoch: Epoch(2) };
    storage.save_snapshot(meta, b"the state through 30").unwrap();
    storage.compact_through(LogIndex(30)).unwrap();
    assert!(storage.corrupt_snapshot(byte));
    storage.crash();
    let recovered = storage.recover().unwrap();
    // Set aside, not read again: a second recovery finds the same empty log and floor.
    let names = storage.sim_disk().list().unwrap();
    assert!(names.iter().any(|n| n.ends_with(".damaged")), "{names:?}");
    storage.crash();
    let again = storage.recover().unwrap();
    assert_eq!(again.hard_state, recovered.hard_state);
    assert!(again.snapshot.is_none() && again.entries.is_empty());
    recovered
}

#[test]
fn a_damaged_snapshot_is_set_aside_with_the_log_under_a_repair_floor() {
    // In the data: the header still names the snapshot's epoch; the log reaches 40.
    let recovered = recover_with_damaged_snapshot(60);
    assert!(recovered.snapshot.is_none() && recovered.entries.is_empty());
    let floor = recovered.hard_state.repair_floor.expect("a floor");
    assert_eq!((floor.epoch, floor.index), (Epoch(2), LogIndex(40)));
    let damage = recovered.damage.expect("damage reported");
    assert_eq!(damage.at, LogIndex(1));
    assert!(damage.reason.contains("set aside"), "{}", damage.reason);
}

#[test]
fn a_snapshot_damaged_in_its_header_takes_the_hard_states_epoch_when_the_log_is_gone() {
    let mut storage = sim();
    storage
        .save_hard_state(&HardState {
            epoch: Epoch(3),
            voted_for: None,
            repair_floor: None,
            members_epoch: 0,
        })
        .unwrap();
    storage.append(&entries(1, 30, 2)).unwrap();
    storage.sync().unwrap();
    let meta = SnapshotMeta { last_index: LogIndex(30), last_epoch: Epoch(2) };
    storage.save_snapshot(meta, b"the state through 30").unwrap();
    storage.compact_through(LogIndex(30)).unwrap();
    assert!(storage.corrupt_snapshot(9));
    storage.crash();
    let recovered = storage.recover().unwrap();
    let floor = recovered.hard_state.repair_floor.expect("a floor");
    assert!(floor >= Version { epoch: Epoch(2), index: LogIndex(30) });
    assert_eq!(floor.index, LogIndex(30));
}

#[test]
fn a_log_starting_after_its_snapshot_is_corruption() {
    let mut storage = sim();
    storage.append(&entries(1, 30, 1)).unwrap();
    storage.sync().unwrap();
    let first_segment = segment_name(LogIndex(1));
    storage.sim_disk().remove(&first_segment).unwrap();
    storage.sim_disk().sync_dir().unwrap();
    storage.crash();
    assert!(matches!(storage.recover(), Err(StorageError::Corrupt { .. })));
}

#[test]
fn an_oversized_record_is_refused() {
    let mut storage = sim_with(StorageConfig { record_bytes_max: 40, ..config() });
    storage
        .append(&[Entry { epoch: Epoch(1), index: LogIndex(1), payload: EntryPayload::Noop }])
        .unwrap();
    let err = storage.append(&[entry(2, 1)]).unwrap_err();
    assert!(matches!(err, StorageError::TooLarge { what: "log record", .. }));
    assert!(storage.is_poisoned());
}

#[test]
fn an_empty_segment_left_by_a_crash_is_removed() {
    let mut storage = sim();
    storage.append(&entries(1, 3, 1)).unwrap();
    storage.sync().unwrap();
    let segments_before = storage.segment_count();
    let name = segment_name(LogIndex(4));
    let disk = storage.sim_disk();
    disk.create(&name).unwrap();
    disk.append(&name, &crate::format::segment_header(LogIndex(4))).unwrap();
    disk.sync(&name).unwrap();
    disk.sync_dir().unwrap();
    storage.crash();
    assert_eq!(storage.recover().unwrap().entries, entries(1, 3, 1));
    assert!(!storage.sim_disk().list().unwrap().contains(&name));
    assert_eq!(storage.segment_count(), segments_before);
}

#[test]
#[should_panic(expected = "storage used before recover")]
fn use_before_recover_panics() {
    let mut storage = <SimStorage>::new_sim(config());
    let _ = storage.sync();
}

#[test]
#[should_panic(expected = "appends must continue the log")]
fn a_gap_in_appended_indexes_panics() {
    let mut storage = sim();
    storage.append(&entries(2, 3, 1)).unwrap();
}

#[test]
#[should_panic(expected = "cannot truncate into the snapshot")]
fn truncating_into_the_snapshot_panics() {
    let mut storage = sim();
    storage.append(&entries(1, 5, 1)).unwrap();
    let meta = SnapshotMeta { last_index: LogIndex(4), last_epoch: Epoch(1) };
    storage.save_snapshot(meta, b"").unwrap();
    let _ = storage.truncate_after(LogIndex(3));
}

#[test]
fn a_snapshot_prepared_on_another_disk_handle_is_adopted_while_the_log_goes_on() {
    let dir = TempDir::new("adopt");
    let mut storage = file(&dir);
    storage.append(&entries(1, 20, 1)).unwrap();
    storage.sync().unwrap();
    let meta = SnapshotMeta { last_index: LogIndex(15), last_epoch: Epoch(1) };
    let missing = SnapshotMeta { last_index: LogIndex(16), last_epoch: Epoch(1) };
    // Written and synced through a handle of its own (another thread, in a server) ...
    let writer = std::thread::spawn({
        let dir = dir.0.clone();
        move || {
            let mut disk = crate::FileDisk::open(dir).unwrap();
            crate::wal::prepare_snapshot(&mut disk, meta, b"state at 15").unwrap();
        }
    });
    writer.join().unwrap();
    // ... while the log goes on; a restart before adoption would not see it.
    storage.append(&entries(21, 25, 1)).unwrap();
    storage.sync().unwrap();
    assert!(storage.adopt_snapshot(meta, 11).unwrap());
    storage.compact_through(LogIndex(15)).unwrap();
    // One overtaken by a newer snapshot is dropped, not adopted.
    let older = SnapshotMeta { last_index: LogIndex(12), last_epoch: Epoch(1) };
    let mut disk = crate::FileDisk::open(&dir.0).unwrap();
    crate::wal::prepare_snapshot(&mut disk, older, b"state at 12").unwrap();
    assert!(!storage.adopt_snapshot(older, 11).unwrap());
    assert!(!dir.0.join("snapshot-00000000000000000012.snap.tmp").exists());
    drop(storage);
    let mut storage = <FileStorage>::open(&dir.0, config()).unwrap();
    let recovered = storage.recover().unwrap();
    assert_eq!(recovered.snapshot, Some((meta, b"state at 15".to_vec())));
    assert_eq!(recovered.entries, entries(16, 25, 1));
    // Adopting a snapshot nobody prepared fails and poisons the storage.
    assert!(matches!(storage.adopt_snapshot(missing, 11), Err(StorageError::Io { .. })));
    assert!(storage.is_poisoned());
}

#[test]
fn an_engine_without_a_log_keeps_its_hard_state_and_refuses_another_kinds_log() {
    use keel_types::NoRecord;
    let dir = TempDir::new("no-record");
    let mut storage = FileStorage::<NoRecord>::open(&dir.0, config()).unwrap();
    assert_eq!(storage.recover().unwrap(), Recovered::default());
    let hard = HardState { epoch: Epoch(7), voted_for: None, repair_floor: None, members_epoch: 0 };
    storage.save_hard_state(&hard).unwrap();
    storage.append(&[]).unwrap();
    assert_eq!(storage.sync().unwrap(), LogIndex::ZERO);
    drop(storage);
    let mut storage = FileStorage::<NoRecord>::open(&dir.0, config()).unwrap();
    let recovered = storage.recover().unwrap();
    assert_eq!((recovered.hard_state, recovered.entries.len()), (hard, 0));
    drop(storage);
    // A leader keyspace's directory: read as this engine's, it is refused, and nothing of
    // it is cut or removed (a record it cannot decode is not damage of its own log).
    let other = TempDir::new("no-record-other");
    let mut leader = file(&other);
    leader.append(&entries(1, 5, 1)).unwrap();
    leader.sync().unwrap();
    drop(leader);
    let before = std::fs::read(other.0.join(segment_name(LogIndex(1)))).unwrap();
    let mut storage = FileStorage::<NoRecord>::open(&other.0, config()).unwrap();
    let refused = storage.recover().unwrap_err();
    assert!(matches!(refused, StorageError::Corrupt { .. }), "{refused}");
    assert!(refused.to_string().contains("another engine kind"), "{refused}");
    assert_eq!(std::fs::read(other.0.join(segment_name(LogIndex(1)))).unwrap(), before);
    let mut leader = <FileStorage>::open(&other.0, config()).unwrap();
    assert_eq!(leader.recover().unwrap().entries, entries(1, 5, 1));
}
