//! Property tests: the codec round-trips and never panics on arbitrary bytes; random
//! sequences of storage operations with crashes recover, on files and on the simulated
//! disk, to the state a simple model predicts, and never lose a synced entry.

use keel_storage::format::{decode_hard_state_file, decode_snapshot_file, scan_segment};
use keel_storage::{FileStorage, SimStorage, Storage, StorageConfig};
use keel_types::codec::{decode, encode};
use keel_types::{
    ClientId, Command, Durability, Entry, EntryPayload, Epoch, HardState, LogIndex, NodeId,
    RequestId, SnapshotMeta,
};
use proptest::prelude::*;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

fn bytes(len_max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..len_max)
}

fn command() -> impl Strategy<Value = Command> {
    prop_oneof![
        bytes(16).prop_map(|key| Command::Get { key: key.into() }),
        (bytes(16), bytes(64))
            .prop_map(|(key, value)| Command::Put { key: key.into(), value: value.into() }),
        bytes(16).prop_map(|key| Command::Delete { key: key.into() }),
        (bytes(16), proptest::option::of(bytes(32)), bytes(32)).prop_map(|(key, expected, new)| {
            Command::Cas { key: key.into(), expected: expected.map(Into::into), new: new.into() }
        }),
        (bytes(16), any::<i64>()).prop_map(|(key, delta)| Command::Incr { key: key.into(), delta }),
        (bytes(16), proptest::option::of(bytes(16)), any::<u32>()).prop_map(
            |(start, end, limit)| Command::Scan {
                start: start.into(),
                end: end.map(Into::into),
                limit
            }
        ),
    ]
}

fn durability() -> impl Strategy<Value = Durability> {
    prop_oneof![Just(Durability::Memory), Just(Durability::Replicated), Just(Durability::Durable)]
}

fn arbitrary_entry() -> impl Strategy<Value = Entry> {
    let write = (any::<u64>(), any::<u64>(), durability(), command()).prop_map(
        |(client, request, durability, command)| EntryPayload::Write {
            client: ClientId(client),
            request: RequestId(request),
            durability,
            command,
        },
    );
    let payload = prop_oneof![Just(EntryPayload::Noop), write];
    (any::<u64>(), any::<u64>(), payload).prop_map(|(epoch, index, payload)| Entry {
        epoch: Epoch(epoch),
        index: LogIndex(index),
        payload,
    })
}

proptest! {
    #[test]
    fn entries_round_trip(entry in arbitrary_entry()) {
        let mut out = Vec::new();
        encode(&entry, &mut out);
        prop_assert_eq!(decode::<Entry>(&out), Ok(entry));
    }

    #[test]
    fn hard_state_and_snapshot_meta_round_trip(
        epoch in any::<u64>(), vote in proptest::option::of(any::<u32>()), index in any::<u64>()
    ) {
        let hard_state = HardState { epoch: Epoch(epoch), voted_for: vote.map(NodeId), repair_floor: None , members_epoch: 0 };
        let mut out = Vec::new();
        encode(&hard_state, &mut out);
        prop_assert_eq!(decode::<HardState>(&out), Ok(hard_state));
        let meta = SnapshotMeta { last_index: LogIndex(index), last_epoch: Epoch(epoch) };
        out.clear();
        encode(&meta, &mut out);
        prop_assert_eq!(decode::<SnapshotMeta>(&out), Ok(meta));
    }

    #[test]
    fn arbitrary_bytes_never_panic_any_decoder(input in bytes(256)) {
        let _ = decode::<Entry>(&input);
        let _ = decode::<HardState>(&input);
        let _ = decode::<SnapshotMeta>(&input);
        let _ = decode::<Command>(&input);
        let _ = decode_hard_state_file(&input);
        let _ = decode_snapshot_file(&input, 1 << 20);
        let scan = scan_segment::<Entry>(&input, LogIndex(1), Epoch(0), 1 << 20);
        prop_assert!(scan.valid_bytes <= input.len() as u64);
    }

    #[test]
    fn flipping_any_byte_of_an_entry_never_panics(entry in arbitrary_entry(), at in any::<usize>()) {
        let mut out = Vec::new();
        encode(&entry, &mut out);
        let at = at % out.len();
        out[at] ^= 0xA5;
        let _ = decode::<Entry>(&out);
    }
}

/// One operation of a random storage workload.
#[derive(Clone, Debug)]
enum Op {
    Append { count: u64, value_bytes: usize },
    Sync,
    NewEpoch,
    Truncate { back: u64 },
    Snapshot { back: u64 },
    SnapshotAhead { ahead: u64 },
    HardState { vote: u32 },
    Crash { torn_bytes: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1..6u64, 0..300usize).prop_map(|(count, value_bytes)| Op::Append { count, value_bytes }),
        3 => Just(Op::Sync),
        1 => Just(Op::NewEpoch),
        2 => (0..8u64).prop_map(|back| Op::Truncate { back }),
        1 => (0..8u64).prop_map(|back| Op::Snapshot { back }),
        1 => (1..4u64).prop_map(|ahead| Op::SnapshotAhead { ahead }),
        1 => (0..5u32).prop_map(|vote| Op::HardState { vote }),
        2 => (0..40u64).prop_map(|torn_bytes| Op::Crash { torn_bytes }),
    ]
}

/// What a storage must recover: its log after the snapshot and how much of it is synced.
#[derive(Clone, Debug, Default)]
struct Model {
    hard_state: HardState,
    snapshot: Option<(SnapshotMeta, Vec<u8>)>,
    entries: Vec<Entry>,
    synced_index: LogIndex,
}

impl Model {
    fn snapshot_index(&self) -> LogIndex {
        self.snapshot.as_ref().map_or(LogIndex::ZERO, |(meta, _)| meta.last_index)
    }

    fn last_index(&self) -> LogIndex {
        self.entries.last().map_or(self.snapshot_index(), |entry| entry.index)
    }

    fn epoch_at(&self, index: LogIndex) -> Epoch {
        match self.entries.iter().find(|entry| entry.index == index) {
            Some(entry) => entry.epoch,
            None => self.snapshot.as_ref().map_or(Epoch(0), |(meta, _)| meta.last_epoch),
        }
    }

    fn keep_through(&mut self, index: LogIndex) {
        self.entries.retain(|entry| entry.index <= index);
    }
}

/// How a storage under test crashes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CrashKind {
    /// The process dies; the kernel keeps every write (files: drop and reopen).
    Process,
    /// Power loss: unsynced writes are lost, maybe leaving a torn tail.
    Power,
}

struct Subject<S> {
    storage: S,
    model: Model,
    crash_kind: CrashKind,
}

fn value_entry(index: LogIndex, epoch: Epoch, value_bytes: usize) -> Entry {
    Entry {
        epoch,
        index,
        payload: EntryPayload::Write {
            client: ClientId(1),
            request: RequestId(index.0),
            durability: Durability::Durable,
            command: Command::Put {
                key: index.0.to_le_bytes().to_vec().into(),
                value: vec![7; value_bytes].into(),
            },
        },
    }
}

impl<S: Storage<Record = Entry>> Subject<S> {
    fn apply(&mut self, op: &Op, epoch: Epoch, crash: &mut dyn FnMut(&mut S, u64)) {
        let model = &mut self.model;
        match *op {
            Op::Append { count, value_bytes } => {
                let first = model.last_index().next();
                let new: Vec<Entry> = (0..count)
                    .map(|k| value_entry(LogIndex(first.0 + k), epoch, value_bytes))
                    .collect();
                self.storage.append(&new).unwrap();
                model.entries.extend(new);
            }
            Op::Sync => {
                model.synced_index = self.storage.sync().unwrap();
                assert_eq!(model.synced_index, model.last_index());
            }
            Op::NewEpoch => {}
            Op::Truncate { back } => {
                let index =
                    LogIndex(model.last_index().0.saturating_sub(back)).max(model.snapshot_index());
                self.storage.truncate_after(index).unwrap();
                model.keep_through(index);
                model.synced_index = model.synced_index.min(index);
            }
            Op::Snapshot { back } => {
                let index =
                    LogIndex(model.last_index().0.saturating_sub(back)).max(model.snapshot_index());
                let meta = SnapshotMeta { last_index: index, last_epoch: model.epoch_at(index) };
                let data = format!("state through {index}").into_bytes();
                self.storage.save_snapshot(meta, &data).unwrap();
                self.storage.compact_through(index).unwrap();
                model.entries.retain(|entry| entry.index > index);
                model.snapshot = Some((meta, data));
                model.synced_index = model.synced_index.max(index);
            }
            Op::SnapshotAhead { ahead } => {
                let index = LogIndex(model.last_index().0 + ahead);
                let meta = SnapshotMeta { last_index: index, last_epoch: epoch };
                self.storage.save_snapshot(meta, b"installed").unwrap();
                model.entries.clear();
                model.snapshot = Some((meta, b"installed".to_vec()));
                model.synced_index = index;
            }
            Op::HardState { vote } => {
                model.hard_state = HardState {
                    epoch,
                    voted_for: Some(NodeId(vote)),
                    repair_floor: None,
                    members_epoch: 0,
                };
                self.storage.save_hard_state(&model.hard_state).unwrap();
            }
            Op::Crash { torn_bytes } => {
                crash(&mut self.storage, torn_bytes);
                self.check_recovery();
            }
        }
        assert_eq!(self.storage.last_index(), self.model.last_index());
        assert_eq!(self.storage.synced_index(), self.model.synced_index);
    }

    fn check_recovery(&mut self) {
        let recovered = self.storage.recover().unwrap();
        let model = &mut self.model;
        assert_eq!(recovered.hard_state, model.hard_state);
        assert_eq!(recovered.snapshot, model.snapshot);
        let synced = model.entries.iter().take_while(|e| e.index <= model.synced_index).count();
        assert!(recovered.entries.len() >= synced, "a synced entry was lost");
        assert_eq!(recovered.entries[..], model.entries[..recovered.entries.len()]);
        if self.crash_kind == CrashKind::Process {
            assert_eq!(recovered.entries, model.entries, "a process crash loses nothing");
        }
        model.entries = recovered.entries;
        model.synced_index = model.last_index();
    }
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn temp_dir() -> TempDir {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("keel-storage-props-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&path);
    TempDir(path)
}

fn run_workload(ops: &[Op]) {
    let config = StorageConfig::small_segments(256);
    let dir = temp_dir();
    // An engine saves its first hard state before any entry (recovery refuses a log
    // without one).
    let first =
        HardState { epoch: Epoch(1), voted_for: None, repair_floor: None, members_epoch: 0 };
    let model = Model { hard_state: first, ..Model::default() };
    let mut file = FileStorage::open(&dir.0, config.clone()).unwrap();
    file.recover().unwrap();
    file.save_hard_state(&first).unwrap();
    let mut file = Subject { storage: file, model: model.clone(), crash_kind: CrashKind::Process };
    let sim_process = |config: &StorageConfig, kind| {
        let mut storage = SimStorage::new_sim(config.clone());
        storage.recover().unwrap();
        storage.save_hard_state(&first).unwrap();
        Subject { storage, model: model.clone(), crash_kind: kind }
    };
    let mut process = sim_process(&config, CrashKind::Process);
    let mut power = sim_process(&config, CrashKind::Power);
    let mut epoch = Epoch(1);
    let reopen = |storage: &mut FileStorage, _: u64| {
        *storage = FileStorage::open(&dir.0, config.clone()).unwrap();
    };
    let mut reopen = reopen;
    for op in ops {
        if let Op::NewEpoch = op {
            epoch = epoch.next();
        }
        file.apply(op, epoch, &mut reopen);
        process.apply(op, epoch, &mut |storage: &mut SimStorage, _| storage.crash_process());
        power.apply(op, epoch, &mut |storage: &mut SimStorage, torn| {
            if torn % 2 == 0 {
                storage.crash()
            } else {
                storage.crash_torn(torn)
            }
        });
        assert_eq!(file.model.entries, process.model.entries, "file and simulated disk agree");
        assert_eq!(file.model.snapshot, process.model.snapshot);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn random_workloads_recover_as_the_model_predicts(ops in proptest::collection::vec(op(), 1..60)) {
        run_workload(&ops);
    }
}
