//! Recovery over a mutated data directory: a valid directory (hard state, log segments, a
//! snapshot) is written on the simulated disk, then bytes of its files are overwritten,
//! files cut short or removed, as the input says; recovery must return what it can
//! trust or an error, never panic, and what it returns must be contiguous.
#![no_main]

use keel_storage::{Disk, SimStorage, Storage, StorageConfig};
use keel_types::{
    ClientId, Command, Durability, Entry, EntryPayload, Epoch, HardState, LogIndex, NodeId,
    RequestId, SnapshotMeta,
};
use libfuzzer_sys::fuzz_target;

fn entry(index: u64, epoch: u64) -> Entry {
    let payload = EntryPayload::Write {
        client: ClientId(1),
        request: RequestId(index),
        durability: Durability::Memory,
        command: Command::Put { key: b"k".to_vec().into(), value: vec![b'v'; 40].into() },
    };
    Entry { epoch: Epoch(epoch), index: LogIndex(index), payload }
}

fn build(entries: u64, snapshot_at: u64) -> SimStorage {
    let mut storage = SimStorage::new_sim(StorageConfig::small_segments(512));
    storage.recover().expect("a blank disk recovers");
    storage.save_hard_state(&HardState { epoch: Epoch(2), voted_for: Some(NodeId(1)), repair_floor: None , members_epoch: 0 }).unwrap();
    let all: Vec<Entry> = (1..=entries).map(|i| entry(i, 1 + i / 8)).collect();
    storage.append(&all).unwrap();
    storage.sync().unwrap();
    if snapshot_at > 0 && snapshot_at <= entries {
        let meta = SnapshotMeta { last_index: LogIndex(snapshot_at), last_epoch: Epoch(1 + snapshot_at / 8) };
        storage.save_snapshot(meta, b"state bytes").unwrap();
    }
    storage
}

fuzz_target!(|data: &[u8]| {
    let Some((&shape, rest)) = data.split_first() else { return };
    let mut storage = build(u64::from(shape % 32), u64::from(shape / 32) * 4);
    let disk = storage.sim_disk();
    let mut names = disk.list().unwrap();
    names.sort();
    // Each 4-byte step: file, what to do, where, and a byte.
    for step in rest.chunks_exact(4) {
        if names.is_empty() {
            break;
        }
        let name = names[step[0] as usize % names.len()].clone();
        let mut bytes = disk.read(&name).unwrap_or_default();
        let at = u16::from_le_bytes([step[2], step[3]]) as usize;
        match step[1] % 4 {
            0 | 1 if !bytes.is_empty() => {
                let at = at % bytes.len();
                bytes[at] = step[1];
            }
            2 => bytes.truncate(at % (bytes.len() + 1)),
            3 if step[1] == 3 => {
                let _ = disk.remove(&name);
                names.retain(|n| *n != name);
                continue;
            }
            _ => bytes.extend_from_slice(&step[..2]),
        }
        let _ = disk.truncate(&name, 0);
        let _ = disk.append(&name, &bytes);
        let _ = disk.sync(&name);
    }
    storage.crash();
    if let Ok(recovered) = storage.recover() {
        let first = recovered.snapshot.as_ref().map_or(1, |(meta, _)| meta.last_index.0 + 1);
        for (i, entry) in recovered.entries.iter().enumerate() {
            assert_eq!(entry.index.0, first + i as u64, "recovered entries are contiguous");
        }
    }
});
