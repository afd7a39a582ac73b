//! Recording histories in the keel-check format (`docs/history-format.md`).
//!
//! A [`Recorder`] collects operations from any number of sessions (one operation at a
//! time each), timed on one monotonic clock. [`Recording`] wraps a session and records
//! each operation with its outcome: `ok`, `fail` (definitely not applied: a refused
//! request, or a cas that did not swap), or `unknown` (a write that may have taken
//! effect: a lost connection or a timeout). After the run, [`fetch_survivors`] reads a
//! node's log with `KEEL.LOG` and replays it into `survivor` records.

use crate::client::{Client, QueueItem, Session};
use crate::error::ClientError;
use keel_check::history::{HistoryWriter, Op, OpKind, Outcome, Survivor};
use keel_check::queue;
use keel_types::{ClientId, Command, Durability, Entry, EntryPayload, ReadLevel, RequestId};
use keel_wire::resp::Frame;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

/// Most operations one recorder keeps (a bound on memory for long runs).
pub const RECORDED_OPS_MAX: usize = 5_000_000;
/// Entries fetched per `KEEL.LOG` call.
pub const LOG_PAGE_ENTRIES: u32 = 1024;
/// Most log pages fetched for survivors (with [`LOG_PAGE_ENTRIES`]: 16 M entries).
pub const LOG_PAGES_MAX: u64 = 16 * 1024;

/// Collects operations.
#[derive(Debug)]
pub struct Recorder {
    origin: Instant,
    ops: Mutex<Vec<Op>>,
    /// Queue operations, checked apart (`keel_check::queue`).
    queue: Mutex<QueueLog>,
    /// Operations past the bound, not recorded: a history missing any cannot be judged
    /// (a read of a write not recorded looks like a phantom, a dequeue not recorded
    /// like a loss), see [`Recorder::dropped`].
    dropped: std::sync::atomic::AtomicU64,
    /// Most operations held ([`RECORDED_OPS_MAX`]), plain and queue ones each.
    bound: usize,
}

/// The queue operations a [`Recorder`] holds.
#[derive(Clone, Debug, Default)]
pub struct QueueLog {
    /// Enqueues, in the order they completed.
    pub enqueues: Vec<queue::Enqueue>,
    /// Dequeues, in the order they completed.
    pub dequeues: Vec<queue::Dequeue>,
}

impl QueueLog {
    /// Writes the queue operations as JSON Lines (enqueues, then dequeues), for a reader
    /// of a queue violation.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        use std::io::Write;
        let mut file = std::io::BufWriter::new(std::fs::File::create(path)?);
        for e in &self.enqueues {
            let (complete_ns, seq) = match e.outcome {
                queue::Enqueued::Ok { complete_ns, seq } => (Some(complete_ns), Some(seq)),
                _ => (None, None),
            };
            let outcome = match e.outcome {
                queue::Enqueued::Ok { .. } => "ok",
                queue::Enqueued::Fail => "fail",
                queue::Enqueued::Unknown => "unknown",
            };
            let line = serde_json::json!({"op": "enqueue", "queue": e.queue, "value": e.value,
                "invoke_ns": e.invoke_ns, "complete_ns": complete_ns, "seq": seq, "outcome": outcome});
            writeln!(file, "{line}")?;
        }
        for d in &self.dequeues {
            let (outcome, seq, value) = match &d.outcome {
                queue::Dequeued::Took { seq, value } => ("took", Some(*seq), Some(value.as_str())),
                queue::Dequeued::Empty => ("empty", None, None),
                queue::Dequeued::Unknown => ("unknown", None, None),
            };
            let line = serde_json::json!({"op": "dequeue", "queue": d.queue, "invoke_ns": d.invoke_ns,
                "complete_ns": d.complete_ns, "outcome": outcome, "seq": seq, "value": value});
            writeln!(file, "{line}")?;
        }
        file.flush()
    }
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder {
            origin: Instant::now(),
            ops: Mutex::new(Vec::new()),
            queue: Mutex::new(QueueLog::default()),
            dropped: std::sync::atomic::AtomicU64::new(0),
            bound: RECORDED_OPS_MAX,
        }
    }
}

impl Recorder {
    /// Nanoseconds since the recorder started.
    pub fn now_ns(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).expect("runs are shorter than 584 years")
    }

    /// Adds an operation (its id is assigned here). Past [`RECORDED_OPS_MAX`] operations
    /// are counted out ([`Recorder::dropped`]) and `false` returned.
    pub fn record(&self, mut op: Op) -> bool {
        let mut ops = self.ops.lock().expect("recorder lock");
        if ops.len() >= self.bound {
            self.drop_one();
            return false;
        }
        op.id = ops.len() as u64;
        if let Some(complete) = op.complete_ns {
            assert!(complete >= op.invoke_ns, "an op completes after it is invoked");
        }
        ops.push(op);
        true
    }

    /// Operations not recorded because the recorder was full: when not zero, the history
    /// is incomplete and no verdict on it stands (`keel torture` reports `unknown`).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the recorder holds as many operations as it may: a workload stops there
    /// rather than go on unrecorded.
    pub fn full(&self) -> bool {
        let ops = self.ops.lock().expect("recorder lock").len();
        let queue = self.queue.lock().expect("recorder lock");
        ops >= self.bound || !self.queue_room(&queue)
    }

    fn drop_one(&self) {
        self.dropped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// A copy of the operations so far.
    pub fn ops(&self) -> Vec<Op> {
        self.ops.lock().expect("recorder lock").clone()
    }

    /// A copy of the queue operations so far.
    pub fn queue_ops(&self) -> QueueLog {
        self.queue.lock().expect("recorder lock").clone()
    }

    /// Whether room is left for one more queue operation (the same bound as
    /// [`Recorder::record`]'s).
    fn queue_room(&self, log: &QueueLog) -> bool {
        log.enqueues.len() + log.dequeues.len() < self.bound
    }

    /// Writes the history (operations, then `survivors`) to `path`.
    pub fn write(&self, path: &Path, survivors: &[Survivor]) -> std::io::Result<()> {
        let file = std::io::BufWriter::new(std::fs::File::create(path)?);
        let mut writer = HistoryWriter::new(file)?;
        for op in self.ops.lock().expect("recorder lock").iter() {
            writer.op(op)?;
        }
        for survivor in survivors {
            writer.survivor(survivor)?;
        }
        writer.finish()?;
        Ok(())
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A session whose operations are recorded.
#[derive(Debug)]
pub struct Recording<'r> {
    /// The session.
    pub session: Session,
    /// Where operations go.
    pub recorder: &'r Recorder,
}

impl Recording<'_> {
    fn op(&self, kind: OpKind, invoke_ns: u64, outcome: Outcome, node: Option<usize>) -> Op {
        let complete_ns = (outcome != Outcome::Unknown).then(|| self.recorder.now_ns());
        Op {
            id: 0,
            client: self.session.id(),
            kind,
            invoke_ns,
            complete_ns,
            outcome,
            node: node.map(|n| n as u32 + 1),
            version: None,
            views: Vec::new(),
        }
    }

    fn failure(error: &ClientError) -> Outcome {
        if error.outcome_unknown() {
            Outcome::Unknown
        } else {
            Outcome::Fail
        }
    }

    /// A recorded read.
    pub async fn get(
        &mut self,
        key: &str,
        level: ReadLevel,
    ) -> Result<Option<Vec<u8>>, ClientError> {
        self.get_recorded_as(key, level, level).await
    }

    /// A read at `level` recorded as if it had been at `recorded`: only for a harness's
    /// negative control (`keel torture --control any-as-monotonic`), which must then find
    /// the weaker read breaking the stronger level's promise.
    pub async fn get_recorded_as(
        &mut self,
        key: &str,
        level: ReadLevel,
        recorded: ReadLevel,
    ) -> Result<Option<Vec<u8>>, ClientError> {
        let invoke = self.recorder.now_ns();
        let result = self.session.get(key.as_bytes(), Some(level)).await;
        let kind =
            |result: Option<String>| OpKind::Get { key: key.to_string(), level: recorded, result };
        let op = match &result {
            Ok(read) => Op {
                version: read.version,
                ..self.op(
                    kind(read.value.as_deref().map(text)),
                    invoke,
                    Outcome::Ok,
                    Some(read.node),
                )
            },
            Err(_) => self.op(kind(None), invoke, Outcome::Fail, None),
        };
        self.recorder.record(op);
        result.map(|r| r.value)
    }

    /// A recorded read invoked as a Correctable (`Client::invoke`, one `KEEL.INVOKE`):
    /// one view per level of `levels`, weakest first; recorded as a read at the final
    /// view's level whose `views` are the preliminary ones, each timed when it arrived.
    /// Returns the final view's value.
    pub async fn invoke(
        &mut self,
        key: &str,
        levels: &[ReadLevel],
    ) -> Result<Option<Vec<u8>>, ClientError> {
        let invoke_ns = self.recorder.now_ns();
        let invocation = self.session.client().invoke(key.as_bytes(), levels);
        let mut stream = invocation.views();
        let mut views = Vec::new();
        let mut closing = None;
        while let Some(view) = stream.next().await {
            match view {
                Ok(view) if closing.is_none() => {
                    let at_ns = self.recorder.now_ns();
                    let result = view.value.as_deref().map(text);
                    views.push((
                        keel_check::history::View {
                            level: view.level,
                            result,
                            version: view.version,
                            at_ns,
                        },
                        view.value,
                    ));
                }
                Ok(_) => {}
                Err(e) => closing = Some(e),
            }
        }
        let level = match (&closing, views.last()) {
            (None, Some((last, _))) => last.level,
            _ => *levels.iter().max().unwrap_or(&ReadLevel::Linearizable),
        };
        let kind = |result: Option<String>| OpKind::Get { key: key.to_string(), level, result };
        let (op, result) = match closing {
            Some(error) => {
                // Failed after its preliminary views: a read with no effect; the views
                // stay on record (each was a read the node served).
                let mut op = self.op(kind(None), invoke_ns, Outcome::Fail, None);
                op.views = views.into_iter().map(|(view, _)| view).collect();
                op.views.retain(|view| view.level < level);
                (op, Err(error))
            }
            None => {
                let (last, value) = views.pop().expect("a final view");
                let mut op = self.op(kind(last.result.clone()), invoke_ns, Outcome::Ok, None);
                op.complete_ns = Some(last.at_ns.max(invoke_ns));
                op.version = last.version;
                op.views = views.into_iter().map(|(view, _)| view).collect();
                (op, Ok(value))
            }
        };
        self.recorder.record(op);
        result
    }

    /// A recorded write.
    pub async fn put(
        &mut self,
        key: &str,
        value: &str,
        durability: Durability,
    ) -> Result<(), ClientError> {
        let invoke = self.recorder.now_ns();
        let result = self.session.put(key.as_bytes(), value.as_bytes(), Some(durability)).await;
        let kind = OpKind::Put { key: key.to_string(), value: value.to_string(), durability };
        let op = match &result {
            Ok(w) => Op { version: w.version, ..self.op(kind, invoke, Outcome::Ok, Some(w.node)) },
            Err(e) => self.op(kind, invoke, Self::failure(e), None),
        };
        self.recorder.record(op);
        result.map(|_| ())
    }

    /// A recorded `INCRBY` at the server's default durability, which the caller names
    /// (`INCRBY` takes no durability of its own).
    pub async fn incr(
        &mut self,
        key: &str,
        delta: i64,
        durability: Durability,
    ) -> Result<i64, ClientError> {
        let invoke = self.recorder.now_ns();
        let result = self.session.incr(key.as_bytes(), delta).await;
        let kind = |result| OpKind::Incr { key: key.to_string(), delta, durability, result };
        let op = match &result {
            Ok(n) => self.op(kind(Some(*n)), invoke, Outcome::Ok, None),
            Err(e) => self.op(kind(None), invoke, Self::failure(e), None),
        };
        self.recorder.record(op);
        result
    }

    /// A recorded compare-and-set.
    pub async fn cas(
        &mut self,
        key: &str,
        expected: Option<&str>,
        value: &str,
        durability: Durability,
    ) -> Result<bool, ClientError> {
        let invoke = self.recorder.now_ns();
        let result = self
            .session
            .cas(key.as_bytes(), expected.map(str::as_bytes), value.as_bytes(), Some(durability))
            .await;
        let kind = OpKind::Cas {
            key: key.to_string(),
            expected: expected.map(str::to_string),
            value: value.to_string(),
            durability,
        };
        let op = match &result {
            Ok(c) => {
                let outcome = if c.swapped { Outcome::Ok } else { Outcome::Fail };
                let version = if c.swapped { c.version } else { None };
                Op { version, ..self.op(kind, invoke, outcome, Some(c.node)) }
            }
            Err(e) => self.op(kind, invoke, Self::failure(e), None),
        };
        self.recorder.record(op);
        result.map(|c| c.swapped)
    }
}

impl Recording<'_> {
    /// A recorded `KEEL.ENQUEUE`; the value should be unique in the run.
    pub async fn enqueue(
        &mut self,
        queue_name: &str,
        value: &str,
        durability: Durability,
    ) -> Result<u64, ClientError> {
        let invoke_ns = self.recorder.now_ns();
        let result =
            self.session.enqueue(queue_name.as_bytes(), value.as_bytes(), Some(durability)).await;
        let outcome = match &result {
            Ok((seq, _)) => queue::Enqueued::Ok { complete_ns: self.recorder.now_ns(), seq: *seq },
            Err(e) if e.outcome_unknown() => queue::Enqueued::Unknown,
            Err(_) => queue::Enqueued::Fail,
        };
        let mut log = self.recorder.queue.lock().expect("recorder lock");
        if self.recorder.queue_room(&log) {
            log.enqueues.push(queue::Enqueue {
                queue: queue_name.to_string(),
                value: value.to_string(),
                invoke_ns,
                outcome,
            });
        } else {
            self.recorder.drop_one();
        }
        result.map(|(seq, _)| seq)
    }

    /// A recorded `KEEL.DEQUEUE`; as a Correctable (`KEEL.INVOKE DEQUEUE`, one preliminary
    /// view per level of `levels`, only the final one recorded) when `levels` is not
    /// empty. Returns the element taken, if any.
    pub async fn dequeue(
        &mut self,
        queue_name: &str,
        durability: Durability,
        levels: &[ReadLevel],
    ) -> Result<Option<QueueItem>, ClientError> {
        let invoke_ns = self.recorder.now_ns();
        let result = if levels.is_empty() {
            self.session.dequeue(queue_name.as_bytes(), Some(durability)).await
        } else {
            match self.session.invoke_dequeue(queue_name.as_bytes(), levels, Some(durability)).await
            {
                Ok(correctable) => correctable.final_view().await.map(|view| view.value),
                Err(e) => Err(e),
            }
        };
        let outcome = match &result {
            Ok(Some(item)) => queue::Dequeued::Took { seq: item.seq, value: text(&item.value) },
            Ok(None) => queue::Dequeued::Empty,
            Err(e) if e.outcome_unknown() => queue::Dequeued::Unknown,
            // Refused: certainly not applied, nothing to check.
            Err(_) => return result,
        };
        let complete_ns = self.recorder.now_ns();
        let mut log = self.recorder.queue.lock().expect("recorder lock");
        if self.recorder.queue_room(&log) {
            log.dequeues.push(queue::Dequeue {
                queue: queue_name.to_string(),
                invoke_ns,
                complete_ns,
                outcome,
            });
        } else {
            self.recorder.drop_one();
        }
        drop(log);
        result
    }
}

/// Reads node `node`'s whole log with `KEEL.LOG` and returns the writes that took
/// effect. Fails if the node has compacted part of its log into a snapshot (the
/// survivors of the compacted prefix are no longer known).
pub async fn fetch_survivors(client: &Client, node: usize) -> Result<Vec<Survivor>, ClientError> {
    let mut entries: Vec<Entry> = Vec::new();
    let mut from = 1u64;
    for _ in 0..LOG_PAGES_MAX {
        let from_text = from.to_string().into_bytes();
        let count = LOG_PAGE_ENTRIES.to_string().into_bytes();
        let words: [&[u8]; 3] = [b"KEEL.LOG", &from_text, &count];
        let frame = match client.call_node(node, &words).await {
            // A pooled connection the node closed (it restarted) is found closed only
            // when used: once more, on a fresh one.
            Err(ClientError::Connection(_)) => client.call_node(node, &words).await?,
            answer => answer?,
        };
        let Frame::Array(items) = frame else {
            return Err(ClientError::Unexpected("KEEL.LOG reply is not an array".into()));
        };
        let mut items = items.into_iter();
        if !matches!(items.next(), Some(Frame::Integer(0))) {
            return Err(ClientError::Unexpected("the log was compacted; survivors unknown".into()));
        }
        let before = entries.len();
        for item in items {
            let Frame::Bulk(json) = item else {
                return Err(ClientError::Unexpected("KEEL.LOG entry is not a bulk string".into()));
            };
            let entry: Entry = serde_json::from_slice(&json)
                .map_err(|e| ClientError::Unexpected(e.to_string()))?;
            entries.push(entry);
        }
        if entries.len() == before {
            return Ok(survivors(&entries));
        }
        from += (entries.len() - before) as u64;
    }
    Err(ClientError::Unexpected("log longer than the survivor fetch allows".into()))
}

/// Replays a log (in order) and returns each write that took effect with the value it
/// left, in log order. A retried write (same client and request) takes effect once.
pub fn survivors(entries: &[Entry]) -> Vec<Survivor> {
    let mut state: BTreeMap<keel_types::Key, keel_types::Value> = BTreeMap::new();
    // The version of each key's last write, deletes included (what `WATCH` compares).
    let mut versions: BTreeMap<keel_types::Key, keel_types::Version> = BTreeMap::new();
    let mut applied: BTreeSet<(ClientId, RequestId)> = BTreeSet::new();
    let mut out = Vec::new();
    for pair in entries.windows(2) {
        assert!(pair[0].index < pair[1].index, "a log is in index order");
    }
    for entry in entries {
        let EntryPayload::Write { client, request, command, .. } = &entry.payload else { continue };
        if !applied.insert((*client, *request)) {
            continue;
        }
        let effects = match command {
            Command::Multi { ops, watch } => {
                if watch.iter().any(|(key, seen)| versions.get(key) != seen.as_ref()) {
                    continue; // a watched key changed: nothing applied
                }
                // All or none: on a copy, kept only if every operation succeeds.
                let mut scratch = state.clone();
                let mut effects = Vec::new();
                let mut failed = false;
                for op in ops {
                    match effect(&scratch, op) {
                        Ok(Some((key, value))) => {
                            match &value {
                                Some(v) => scratch.insert(key.clone(), v.clone()),
                                None => scratch.remove(&key),
                            };
                            effects.push((key, value));
                        }
                        Ok(None) => {}
                        Err(()) => {
                            failed = true;
                            break;
                        }
                    }
                }
                if failed {
                    continue;
                }
                effects
            }
            single => match effect(&state, single) {
                Ok(Some(one)) => vec![one],
                Ok(None) | Err(()) => continue,
            },
        };
        for (key, value) in effects {
            match &value {
                Some(v) => state.insert(key.clone(), v.clone()),
                None => state.remove(&key),
            };
            versions.insert(key.clone(), entry.version());
            out.push(Survivor {
                version: entry.version(),
                key: text(&key),
                value: value.as_deref().map(text),
            });
        }
    }
    out
}

/// The key a single-key write changes and the value it leaves (`None`: deleted) in
/// `state`; `Ok(None)`: no change (a read, a cas that did not swap); `Err`: it fails (an
/// incr of a non-integer or past the i64 range).
#[allow(clippy::type_complexity)]
fn effect(
    state: &BTreeMap<keel_types::Key, keel_types::Value>,
    command: &Command,
) -> Result<Option<(keel_types::Key, Option<keel_types::Value>)>, ()> {
    Ok(match command {
        Command::Asking(_, inner) => return effect(state, inner),
        Command::Put { key, value } => Some((key.clone(), Some(value.clone()))),
        Command::Delete { key } => Some((key.clone(), None)),
        Command::Cas { key, expected, new } => {
            (state.get(key) == expected.as_ref()).then(|| (key.clone(), Some(new.clone())))
        }
        Command::Incr { key, delta } => {
            let current = state
                .get(key)
                .map_or(Some(0), |v| std::str::from_utf8(v).ok()?.parse::<i64>().ok());
            let n = current.and_then(|c| c.checked_add(*delta)).ok_or(())?;
            Some((key.clone(), Some(n.to_string().into())))
        }
        // Redis's SET, its expiry aside (an expiry already past when the entry applies
        // deletes the key: the workloads recorded here never set one).
        Command::Set { key, value, cond, .. } => {
            let write = match cond {
                keel_types::SetCond::Always => true,
                keel_types::SetCond::IfAbsent => !state.contains_key(key),
                keel_types::SetCond::IfPresent => state.contains_key(key),
            };
            write.then(|| (key.clone(), Some(value.clone())))
        }
        // Queues are not keys: their elements survive or not as the queue's own order. An
        // expiry changes no value until the leader's expiry entry deletes the key.
        Command::Get { .. }
        | Command::Expire { .. }
        | Command::Inspect { .. }
        | Command::Flush { .. }
        | Command::SwapDb { .. }
        | Command::Fetch { .. }
        | Command::Restore { .. }
        | Command::Count { .. }
        | Command::Modify { .. }
        | Command::Transfer { .. }
        | Command::Scan { .. }
        | Command::Multi { .. }
        | Command::OpenSession { .. }
        | Command::Enqueue { .. }
        | Command::Dequeue { .. }
        | Command::QueuePeek { .. }
        // Collections are checked by their own checkers (the job queue's, `keel-sim`).
        | Command::Coll { .. }
        | Command::CollRead { .. }
        // A geo keyspace's histories are causal ones (`keel check --model causal`).
        | Command::Cluster(_)
        | Command::Slot(_)
        | Command::Geo(_) => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_types::{Epoch, LogIndex};

    fn write(index: u64, client: u64, request: u64, command: Command) -> Entry {
        let payload = EntryPayload::Write {
            client: ClientId(client),
            request: RequestId(request),
            durability: Durability::Memory,
            command,
        };
        Entry { epoch: Epoch(1), index: LogIndex(index), payload }
    }

    #[test]
    fn replay_keeps_writes_that_took_effect_once() {
        let k = || b"k".to_vec();
        let log = vec![
            Entry { epoch: Epoch(1), index: LogIndex(1), payload: EntryPayload::Noop },
            write(2, 1, 1, Command::Put { key: k().into(), value: b"a".to_vec().into() }),
            write(3, 1, 1, Command::Put { key: k().into(), value: b"a".to_vec().into() }),
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
            write(6, 3, 1, Command::Delete { key: k().into() }),
        ];
        let got: Vec<(u64, Option<String>)> =
            survivors(&log).into_iter().map(|s| (s.version.index.0, s.value)).collect();
        assert_eq!(got, vec![(2, Some("a".into())), (5, Some("c".into())), (6, None)]);
    }

    #[test]
    fn recorder_assigns_ids_in_order() {
        let recorder = Recorder::default();
        let op = Op {
            id: 99,
            client: 1,
            kind: OpKind::Get { key: "k".into(), level: ReadLevel::Any, result: None },
            invoke_ns: 1,
            complete_ns: Some(2),
            outcome: Outcome::Ok,
            node: None,
            version: None,
            views: Vec::new(),
        };
        assert!(recorder.record(op.clone()));
        assert!(recorder.record(op.clone()));
        let ids: Vec<u64> = recorder.ops().iter().map(|o| o.id).collect();
        assert_eq!(ids, vec![0, 1]);
        assert_eq!((recorder.dropped(), recorder.full()), (0, false));
        // Past its bound it records nothing more and counts what it did not record.
        let small = Recorder { bound: 2, ..Recorder::default() };
        assert!(small.record(op.clone()) && small.record(op.clone()));
        assert!(small.full());
        assert!(!small.record(op));
        assert_eq!((small.ops().len(), small.dropped()), (2, 1));
    }
}
