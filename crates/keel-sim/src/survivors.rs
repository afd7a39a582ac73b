//! The final log's effect, key by key: replays the surviving entries on a reference
//! key-value model (with the engine's deduplication of retried writes) to produce the
//! history's `survivor` records.

use crate::history::Survivor;
use keel_types::{ClientId, Command, Entry, EntryPayload, Key, RequestId, Value, Version};
use std::collections::{BTreeMap, BTreeSet};

/// Replays `entries` (a log, in order) and returns every write that took effect, with
/// the value it left, in log order.
pub fn survivors(entries: &[Entry]) -> Vec<Survivor> {
    let mut state: BTreeMap<Key, Value> = BTreeMap::new();
    let mut seen: BTreeSet<(ClientId, RequestId)> = BTreeSet::new();
    let mut out = Vec::new();
    let mut last = Version::default();
    for entry in entries {
        assert!(entry.version() > last || last == Version::default(), "log out of order");
        last = entry.version();
        let EntryPayload::Write { client, request, command, .. } = &entry.payload else {
            continue;
        };
        if !seen.insert((*client, *request)) {
            continue; // a retry: applied once
        }
        if let Some((key, value)) = apply(&mut state, command) {
            out.push(Survivor {
                version: entry.version(),
                key: String::from_utf8_lossy(&key).into_owned(),
                value: value.map(|v| String::from_utf8_lossy(&v).into_owned()),
            });
        }
    }
    out
}

/// Applies one write; returns the key and the value it left if it took effect.
fn apply(state: &mut BTreeMap<Key, Value>, command: &Command) -> Option<(Key, Option<Value>)> {
    match command {
        Command::Put { key, value } => {
            state.insert(key.clone(), value.clone());
            Some((key.clone(), Some(value.clone())))
        }
        Command::Delete { key } => {
            state.remove(key);
            Some((key.clone(), None))
        }
        Command::Cas { key, expected, new } => {
            if state.get(key) != expected.as_ref() {
                return None;
            }
            state.insert(key.clone(), new.clone());
            Some((key.clone(), Some(new.clone())))
        }
        Command::Incr { key, delta } => {
            let current = match state.get(key) {
                None => 0,
                Some(bytes) => std::str::from_utf8(bytes).ok()?.parse::<i64>().ok()?,
            };
            let value = current.checked_add(*delta)?.to_string().into_bytes();
            state.insert(key.clone(), value.clone().into());
            Some((key.clone(), Some(value.into())))
        }
        // Queues are checked by their own checker (`queues.rs`), not as keys.
        Command::Get { .. }
        | Command::Scan { .. }
        | Command::OpenSession
        | Command::Enqueue { .. }
        | Command::Dequeue { .. }
        | Command::QueuePeek { .. } => None,
        Command::Multi { .. } => unreachable!("the simulator's clients send no transactions"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_types::{Durability, Epoch, LogIndex};

    fn write(index: u64, client: u64, request: u64, command: Command) -> Entry {
        Entry {
            epoch: Epoch(1),
            index: LogIndex(index),
            payload: EntryPayload::Write {
                client: ClientId(client),
                request: RequestId(request),
                durability: Durability::Memory,
                command,
            },
        }
    }

    #[test]
    fn replay_keeps_effective_writes_only() {
        let k = || b"k".to_vec();
        let log = vec![
            Entry { epoch: Epoch(1), index: LogIndex(1), payload: EntryPayload::Noop },
            write(2, 1, 1, Command::Put { key: k().into(), value: b"a".to_vec().into() }),
            write(3, 1, 1, Command::Put { key: k().into(), value: b"a".to_vec().into() }), // retry
            write(
                4,
                2,
                1,
                Command::Cas {
                    key: k().into(),
                    expected: Some(b"x".to_vec().into()),
                    new: b"b".to_vec().into(),
                },
            ),
            write(
                5,
                2,
                2,
                Command::Cas {
                    key: k().into(),
                    expected: Some(b"a".to_vec().into()),
                    new: b"c".to_vec().into(),
                },
            ),
            write(6, 3, 1, Command::Incr { key: b"n".to_vec().into(), delta: 2 }),
            write(7, 3, 2, Command::Delete { key: k().into() }),
        ];
        let out = survivors(&log);
        let summary: Vec<(u64, &str, Option<&str>)> =
            out.iter().map(|s| (s.version.index.0, s.key.as_str(), s.value.as_deref())).collect();
        assert_eq!(
            summary,
            vec![(2, "k", Some("a")), (5, "k", Some("c")), (6, "n", Some("2")), (7, "k", None)]
        );
    }
}
