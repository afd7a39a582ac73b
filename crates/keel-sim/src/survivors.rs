//! The final log's effect, key by key: replays the surviving entries on a reference
//! key-value model (with the engine's deduplication of retried writes, and its
//! transactions: nothing if a watched key's version changed, a delete included, or if an
//! operation fails; else every operation at the entry's version) to produce the history's
//! `survivor` and `txn-entry` records.
//!
//! The model is the specification, written apart from the engine's state machine: it
//! keeps each key's value, the version of its last write (a delete's too, as the
//! version a `WATCH` of a deleted key reads) and its expiry, and nothing else. An expiry
//! entry deletes the keys it names whose expiry is at or before its time.

use crate::history::Survivor;
use keel_check::history::TxnEntry;
use keel_types::{ClientId, Command, Entry, EntryPayload, Key, RequestId, Value, Version};
use std::collections::{BTreeMap, BTreeSet};

/// The reference model's state: each key's value (`None`: deleted), last version and
/// expiry (unix milliseconds).
type State = BTreeMap<Key, (Option<Value>, Version, Option<u64>)>;

/// What replaying a log found.
#[derive(Clone, Debug, Default)]
pub struct Replayed {
    /// Every write that took effect, with the value it left, in log order.
    pub survivors: Vec<Survivor>,
    /// Every transaction's entry (applied or not), in log order.
    pub txn_entries: Vec<TxnEntry>,
    /// Transactions whose `WATCH` failed on a key deleted since (a tombstone of another
    /// version): the path the negative control `watch_ignores_deletes` breaks.
    pub watch_aborts_over_delete: u64,
    /// Keys the leaders' expiry entries deleted.
    pub keys_expired: u64,
}

/// Replays `entries` (a log, in order) and returns every write that took effect, with
/// the value it left, in log order.
pub fn survivors(entries: &[Entry]) -> Vec<Survivor> {
    replay(entries).survivors
}

/// Replays `entries` (a log, in order): see [`Replayed`].
pub fn replay(entries: &[Entry]) -> Replayed {
    let mut state = State::new();
    let mut seen: BTreeSet<(ClientId, RequestId)> = BTreeSet::new();
    let mut out = Replayed::default();
    let mut last = Version::default();
    for entry in entries {
        assert!(entry.version() > last || last == Version::default(), "log out of order");
        last = entry.version();
        if let EntryPayload::Reap { now_ms, keys } = &entry.payload {
            for key in keys {
                let due = state.get(key).and_then(|(_, _, at)| *at).is_some_and(|at| at <= *now_ms);
                if due {
                    out.keys_expired += 1;
                    state.insert(key.clone(), (None, entry.version(), None));
                    out.survivors.push(Survivor {
                        version: entry.version(),
                        key: String::from_utf8_lossy(key).into_owned(),
                        value: None,
                    });
                }
            }
            continue;
        }
        let EntryPayload::Write { client, request, command, .. } = &entry.payload else {
            continue;
        };
        if !seen.insert((*client, *request)) {
            continue; // a retry: applied once
        }
        let version = entry.version();
        let written = match command {
            Command::Multi { ops, watch } => {
                let over_delete = watch.iter().any(|(key, seen)| {
                    state.get(key).is_some_and(|(value, v, _)| value.is_none() && Some(*v) != *seen)
                });
                let applied = apply_multi(&mut state, version, ops, watch);
                out.watch_aborts_over_delete += u64::from(over_delete);
                out.txn_entries.push(TxnEntry { version, applied: applied.is_some() });
                applied.unwrap_or_default()
            }
            command => apply(&mut state, version, command).into_iter().collect(),
        };
        for (key, value) in written {
            out.survivors.push(Survivor {
                version,
                key: String::from_utf8_lossy(&key).into_owned(),
                value: value.map(|v| String::from_utf8_lossy(&v).into_owned()),
            });
        }
    }
    out
}

/// Every `ok` read that returned a version the final log holds must have read what that
/// version left of its key (`read-against-log`): a value its write wrote, or absence
/// that its delete or expiry entry left. A read that finds a key absent at the version
/// of a write that left it present is one that expired (or lost) the key on its own.
pub fn check_reads_against_log(
    ops: &[keel_check::history::Op],
    versions: &BTreeSet<Version>,
    replayed: &Replayed,
) -> Vec<(&'static str, String)> {
    use keel_check::history::{OpKind, Outcome};
    let left: BTreeMap<(Version, &str), Option<&str>> = replayed
        .survivors
        .iter()
        .map(|s| ((s.version, s.key.as_str()), s.value.as_deref()))
        .collect();
    let mut found = Vec::new();
    for op in ops.iter().filter(|op| op.outcome == Outcome::Ok) {
        let (OpKind::Get { key, result, .. }, Some(version)) = (&op.kind, op.version) else {
            continue;
        };
        if !versions.contains(&version) || op.kind.key().is_empty() {
            continue;
        }
        let Some(was) = left.get(&(version, key.as_str())) else { continue };
        if *was != result.as_deref() {
            let detail = format!(
                "op {} read {key}={result:?} at {version}, where the final log left {was:?}",
                op.id
            );
            found.push(("read-against-log", detail));
        }
    }
    found
}

/// A transaction: `None` if a watched key's version differs or an operation fails (the
/// state untouched); else the value each key it wrote was left with (one per key, in
/// the order of their last writes).
fn apply_multi(
    state: &mut State,
    version: Version,
    ops: &[Command],
    watch: &[(Key, Option<Version>)],
) -> Option<Vec<(Key, Option<Value>)>> {
    if watch.iter().any(|(key, seen)| state.get(key).map(|(_, v, _)| *v) != *seen) {
        return None;
    }
    let mut scratch = state.clone();
    let mut written: Vec<(Key, Option<Value>)> = Vec::new();
    for op in ops {
        if matches!(op, Command::Get { .. }) {
            continue;
        }
        let (key, value) = apply(&mut scratch, version, op)?;
        written.retain(|(k, _)| *k != key);
        written.push((key, value));
    }
    *state = scratch;
    Some(written)
}

/// Applies one write; returns the key and the value it left if it took effect (`None`
/// also for an increment of a value that is no integer, which fails).
fn apply(state: &mut State, version: Version, command: &Command) -> Option<(Key, Option<Value>)> {
    let current = |state: &State, key: &Key| state.get(key).and_then(|(v, _, _)| v.clone());
    let expiry = |state: &State, key: &Key| state.get(key).and_then(|(_, _, at)| *at);
    let mut expires_at = None;
    let (key, value) = match command {
        Command::Put { key, value } => (key, Some(value.clone())),
        Command::Restore { key, image } => {
            let item = keel_core::leader::kv_image::decode(image, version).ok()?;
            expires_at = item.expires_at;
            (key, item.value)
        }
        Command::Delete { key } => (key, None),
        Command::Cas { key, expected, new } => {
            if current(state, key) != *expected {
                return None;
            }
            (key, Some(new.clone()))
        }
        Command::Incr { key, delta } => {
            let base = match current(state, key) {
                None => 0,
                Some(bytes) => std::str::from_utf8(&bytes).ok()?.parse::<i64>().ok()?,
            };
            expires_at = expiry(state, key);
            (key, Some(base.checked_add(*delta)?.to_string().into_bytes().into()))
        }
        Command::Set { key, value, cond, ttl, now_ms } => {
            let present = current(state, key).is_some();
            let write = match cond {
                keel_types::SetCond::Always => true,
                keel_types::SetCond::IfAbsent => !present,
                keel_types::SetCond::IfPresent => present,
            };
            if !write {
                return None;
            }
            expires_at = ttl.resolve(*now_ms, expiry(state, key));
            if expires_at.is_some_and(|at| at <= *now_ms) {
                expires_at = None;
                (key, None)
            } else {
                (key, Some(value.clone()))
            }
        }
        Command::Expire { key, ttl, cond, now_ms } => {
            let value = current(state, key)?;
            let before = expiry(state, key);
            let after = ttl.resolve(*now_ms, before);
            if !cond.holds(before, after) || after == before {
                return None;
            }
            if after.is_some_and(|at| at <= *now_ms) {
                (key, None)
            } else {
                expires_at = after;
                (key, Some(value))
            }
        }
        // Queues are checked by their own checker (`queues.rs`), not as keys.
        Command::Get { .. }
        | Command::Scan { .. }
        | Command::OpenSession { .. }
        | Command::Enqueue { .. }
        | Command::Dequeue { .. }
        | Command::QueuePeek { .. }
        | Command::Inspect { .. }
        | Command::Fetch { .. }
        | Command::Count { .. }
        // The job lists of `jobs` are checked by their own checks (`tickets.rs`).
        | Command::Coll { .. }
        | Command::CollRead { .. }
        // Never a write entry: the leader logs a membership entry.
        | Command::Cluster(_) => return None,
        // The slots scenario's moves and redirected requests: its keys are checked by
        // its own checks (`slot_moves.rs`), which see through the moves.
        Command::Slot(_) | Command::Asking(..) => return None,
        Command::Flush { .. }
        | Command::SwapDb { .. }
        | Command::Modify { .. }
        | Command::Transfer { .. }
        | Command::Geo(_) => {
            unreachable!("the simulator's clients send none of these")
        }
        Command::Multi { .. } => unreachable!("the codec refuses a transaction inside one"),
    };
    state.insert(key.clone(), (value.clone(), version, expires_at));
    Some((key.clone(), value))
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

    #[test]
    fn a_transaction_applies_whole_or_not_at_all_and_a_delete_aborts_its_watch() {
        let key = |k: &str| -> Key { k.as_bytes().to_vec().into() };
        let put =
            |k: &str, v: &str| Command::Put { key: key(k), value: v.as_bytes().to_vec().into() };
        let multi = |ops, watch| Command::Multi { ops, watch };
        let log = vec![
            write(1, 1, 1, put("a", "x")),
            write(2, 1, 2, Command::Delete { key: key("a") }),
            // Watched "a" as never written: it was set and deleted since.
            write(3, 2, 1, multi(vec![put("b", "1")], vec![(key("a"), None)])),
            // Watched "a" at its delete: applied; "b" written twice, left once.
            write(
                4,
                2,
                2,
                multi(
                    vec![
                        put("b", "2"),
                        Command::Get { key: key("b") },
                        put("b", "3"),
                        put("c", "w"),
                    ],
                    vec![(key("a"), Some(Version::new(1, 2)))],
                ),
            ),
            // An increment of a word fails: nothing of it applies.
            write(
                5,
                2,
                3,
                multi(
                    vec![
                        put("d", "5"),
                        Command::Incr { key: key("c"), delta: 1 },
                        Command::Incr { key: key("b"), delta: 1 },
                    ],
                    vec![],
                ),
            ),
            write(6, 2, 3, multi(vec![put("d", "5")], vec![])), // a retry of request 3
        ];
        let replayed = replay(&log);
        let (out, txns) = (&replayed.survivors, &replayed.txn_entries);
        assert_eq!(replayed.watch_aborts_over_delete, 1);
        let summary: Vec<(u64, &str, Option<&str>)> =
            out.iter().map(|s| (s.version.index.0, s.key.as_str(), s.value.as_deref())).collect();
        assert_eq!(
            summary,
            vec![(1, "a", Some("x")), (2, "a", None), (4, "b", Some("3")), (4, "c", Some("w"))]
        );
        let entries: Vec<(u64, bool)> =
            txns.iter().map(|t| (t.version.index.0, t.applied)).collect();
        assert_eq!(entries, vec![(3, false), (4, true), (5, false)]);
    }
}
