//! The engine loop: one task owns the [`LeaderEngine`] and steps it, one input at a
//! time, carrying out each step's outputs in the order `Outputs` prescribes.
//!
//! Inputs arrive on two bounded channels of [`Event`]s: peer messages (dropped when it is
//! full: the protocol tolerates loss), always taken first so that a backlog of clients
//! cannot delay the heartbeats and acknowledgements that keep a leader; and client
//! requests (refused with a retryable `BUSY` when it is full) and queries (`/status`,
//! `/metrics`, `KEEL.LOG`). Storage completions
//! arrive on their own channels (a `watch` of the newest fsync and the snapshots saved),
//! and the timer fires at the engine's `wake_at`.
//!
//! Time: the engine sees `Time` as the host's `CLOCK_MONOTONIC` in nanoseconds (the
//! driver reads the clock; the engine never does). Not "since the process started":
//! peers echo this node's send times back to it as lease anchors, and an anchor from
//! before a restart must not look like the future to the restarted node.
//!
//! Ordering contract, as carried out here:
//! 1. hard state: sent to the storage thread, and the loop waits until it is durable;
//! 2. truncate and append: queued to the storage thread in order (a queued write is as
//!    good as a buffered one: it is lost on a crash and never reported synced);
//! 3. fsync: queued; the storage thread coalesces them and publishes the synced index,
//!    which the loop reports as `LogSynced`, clamped below any truncation queued after
//!    the fsync's last operation;
//! 4. snapshot: one installed from the leader is queued; one this node took is written
//!    and synced on a blocking task of its own (the log's appends and fsyncs go on), then
//!    queued to be renamed into place; either is reported as `SnapshotSaved` once
//!    durable;
//! 5. messages: handed to the per-peer queues (dropped when full);
//! 6. replies: sent back to the connections.

use crate::metrics::{Metrics, OpLabel};
use crate::storage::{StorageHandle, StorageOp, Synced};
use keel_core::leader::{
    ClientReply, ClientRequest, Counters, Input, LeaderEngine, Message, Outputs, RequestTag, Role,
    Status,
};
use keel_core::time::Time;
use keel_types::{
    ClientId, Command, Durability, Entry, Epoch, KeelError, LogIndex, NodeId, ReadLevel, RequestId,
};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, watch};

/// Most entries one `KEEL.LOG` page returns.
pub const LOG_PAGE_ENTRIES_MAX: u32 = 1024;
/// Most truncations remembered for clamping fsync reports (older ones are covered by any
/// later fsync, so they are dropped first).
pub const TRUNCATIONS_TRACKED_MAX: usize = 1024;

/// A step (engine plus carrying out its outputs) this long is logged as a warning: a
/// third of the default heartbeat-to-election margin.
pub const SLOW_STEP: Duration = Duration::from_millis(100);

/// The kind of an input, for logs.
fn input_name(input: &Input) -> &'static str {
    match input {
        Input::Tick => "tick",
        Input::Message { .. } => "message",
        Input::Client(_) => "client",
        Input::LogSynced { .. } => "log synced",
        Input::SnapshotSaved { .. } => "snapshot saved",
    }
}

/// The host's monotonic clock (`CLOCK_MONOTONIC`), continuous across restarts of the
/// process (not across reboots, which outlast every lease).
pub fn monotonic_now() -> Time {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC is readable");
    let nanos = u64::try_from(ts.tv_sec()).expect("non-negative") * 1_000_000_000
        + u64::try_from(ts.tv_nsec()).expect("non-negative");
    assert!(nanos > 0, "the monotonic clock has started");
    Time(nanos)
}

/// A client operation before the engine loop gives it a tag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Submit {
    /// The client, for write deduplication.
    pub client: ClientId,
    /// The client's sequence number.
    pub request: RequestId,
    /// The operation.
    pub command: Command,
    /// For writes: when to acknowledge.
    pub durability: Option<Durability>,
    /// For reads: what the read guarantees.
    pub level: Option<ReadLevel>,
}

impl Submit {
    /// The metric labels of this request.
    pub fn label(&self) -> OpLabel {
        let class = if self.command.is_write() {
            self.durability.map_or("default", Durability::as_str)
        } else {
            self.level.map_or("default", ReadLevel::as_str)
        };
        OpLabel { op: self.command.name(), class }
    }
}

/// The engine's externally visible state, as `/status` and `KEEL.STATUS` show it.
#[derive(Clone, Debug)]
pub struct NodeReport {
    /// The engine's status.
    pub status: Status,
    /// The engine's counters.
    pub counters: Counters,
}

/// One page of the log, for `KEEL.LOG`.
#[derive(Clone, Debug)]
pub struct LogPage {
    /// The entries held from the index asked for, in order (none below the snapshot).
    pub entries: Vec<Entry>,
    /// The last index covered by the node's snapshot (entries at or below it are gone).
    pub snapshot_index: LogIndex,
}

/// An input for the engine loop.
#[derive(Debug)]
pub enum Event {
    /// A client request and where to send its reply.
    Client {
        /// The request.
        submit: Submit,
        /// The reply's destination.
        reply: oneshot::Sender<ClientReply>,
        /// When the request entered the input queue.
        queued_at: Instant,
    },
    /// A message from a peer.
    Peer {
        /// The sender.
        from: NodeId,
        /// The message.
        message: Message,
    },
    /// A status query.
    Status(oneshot::Sender<NodeReport>),
    /// A log query: `count` entries from `from`.
    Log {
        /// The first index wanted.
        from: LogIndex,
        /// How many (at most [`LOG_PAGE_ENTRIES_MAX`]).
        count: u32,
        /// The reply's destination.
        reply: oneshot::Sender<LogPage>,
    },
}

/// A request inside the engine, waiting for its reply.
struct Waiting {
    reply: oneshot::Sender<ClientReply>,
    started: Instant,
    label: OpLabel,
}

/// The engine loop's state.
pub struct Driver {
    engine: LeaderEngine,
    tag_next: u64,
    waiting: BTreeMap<RequestTag, Waiting>,
    storage: StorageHandle,
    seq_next: u64,
    /// Truncations queued, `(seq, index)`, oldest first.
    truncations: VecDeque<(u64, LogIndex)>,
    peers: BTreeMap<NodeId, mpsc::Sender<Message>>,
    metrics: Arc<Metrics>,
    wake_at: Option<Time>,
    /// The role, epoch and leader last logged (role changes are logged once each).
    seen: (Role, Epoch, Option<NodeId>),
}

impl Driver {
    /// A driver for `engine` (created at [`monotonic_now`]).
    pub fn new(
        engine: LeaderEngine,
        storage: StorageHandle,
        peers: BTreeMap<NodeId, mpsc::Sender<Message>>,
        metrics: Arc<Metrics>,
    ) -> Driver {
        assert!(!peers.contains_key(&engine.config().node_id), "no queue to itself");
        Driver {
            engine,
            tag_next: 1,
            waiting: BTreeMap::new(),
            storage,
            seq_next: 1,
            truncations: VecDeque::new(),
            peers,
            metrics,
            wake_at: None,
            seen: (Role::Follower, Epoch(0), None),
        }
    }

    fn now(&self) -> Time {
        monotonic_now()
    }

    /// Runs until `shutdown` is set or `events` closes (`Ok`), or the storage fails
    /// (`Err` with the reason: the node must stop and exit non-zero). `peer_events`
    /// (peer messages) are taken before `events` (client requests and queries).
    pub async fn run(
        mut self,
        mut events: mpsc::Receiver<Event>,
        mut peer_events: mpsc::Receiver<Event>,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<(), String> {
        self.step(Input::Tick).await?;
        loop {
            let deadline = self.deadline();
            tokio::select! {
                biased;
                _ = shutdown.changed() => return Ok(()),
                changed = self.storage.fatal.changed() => {
                    let reason = self.storage.fatal.borrow().clone();
                    return Err(reason.unwrap_or_else(|| format!("storage thread ended: {changed:?}")));
                }
                changed = self.storage.synced.changed() => {
                    if changed.is_err() {
                        return Err("the storage thread ended".into());
                    }
                    let synced = *self.storage.synced.borrow_and_update();
                    self.on_synced(synced).await?;
                }
                Some(meta) = self.storage.snapshots.recv() => {
                    tracing::info!(index = meta.last_index.0, "snapshot saved");
                    self.step(Input::SnapshotSaved { meta }).await?;
                }
                Some(prepared) = self.storage.prepared.recv() => {
                    let (meta, len) = prepared?;
                    self.queue(StorageOp::AdoptSnapshot(meta, len)).await?;
                }
                Some(event) = peer_events.recv() => self.on_event(event).await?,
                event = events.recv() => match event {
                    Some(event) => self.on_event(event).await?,
                    None => return Ok(()),
                },
                () = tokio::time::sleep_until(deadline.into()) => {
                    let late = Instant::now().saturating_duration_since(deadline);
                    if late >= SLOW_STEP {
                        // The loop was not scheduled in time (an overloaded host, or a
                        // runtime thread blocked): timers, heartbeats and leases slip.
                        tracing::warn!(late_ms = late.as_millis() as u64, "engine timer fired late");
                    }
                    self.step(Input::Tick).await?
                }
            }
        }
    }

    fn deadline(&self) -> Instant {
        // Without a wake-up asked for, tick anyway every second (harmless, bounded).
        let now = self.now();
        let at = self.wake_at.unwrap_or(Time(now.0 + 1_000_000_000));
        Instant::now() + Duration::from_nanos((at - now).0)
    }

    async fn on_synced(&mut self, synced: Synced) -> Result<(), String> {
        let index = clamp_synced(&mut self.truncations, synced);
        self.step(Input::LogSynced { index }).await
    }

    async fn on_event(&mut self, event: Event) -> Result<(), String> {
        match event {
            Event::Client { submit, reply, queued_at } => {
                let tag = RequestTag(self.tag_next);
                self.tag_next += 1;
                let label = submit.label();
                self.metrics.input_wait_seconds.observe(queued_at.elapsed().as_secs_f64());
                self.waiting.insert(tag, Waiting { reply, started: queued_at, label });
                let request = ClientRequest {
                    tag,
                    client: submit.client,
                    request: submit.request,
                    command: submit.command,
                    durability: submit.durability,
                    level: submit.level,
                };
                self.step(Input::Client(request)).await
            }
            Event::Peer { from, message } => self.step(Input::Message { from, message }).await,
            Event::Status(reply) => {
                let report =
                    NodeReport { status: self.engine.status(), counters: self.engine.counters() };
                let _ = reply.send(report);
                Ok(())
            }
            Event::Log { from, count, reply } => {
                let count = count.clamp(1, LOG_PAGE_ENTRIES_MAX);
                let to = LogIndex(from.0.saturating_add(u64::from(count) - 1));
                let entries: Vec<Entry> = self.engine.log_entries(from, to).cloned().collect();
                let snapshot_index = self.engine.status().snapshot_index;
                let _ = reply.send(LogPage { entries, snapshot_index });
                Ok(())
            }
        }
    }

    async fn step(&mut self, input: Input) -> Result<(), String> {
        let now = self.now();
        let started = Instant::now();
        let what = input_name(&input);
        let out = self.engine.step(now, input);
        let stepped = started.elapsed();
        let result = self.carry_out(out).await;
        let total = started.elapsed();
        if total >= SLOW_STEP {
            // Long enough to cost leases or an election: say where the time went.
            tracing::warn!(
                input = what,
                engine_ms = stepped.as_millis() as u64,
                outputs_ms = (total - stepped).as_millis() as u64,
                "slow engine step"
            );
        }
        self.log_role_change();
        result
    }

    fn log_role_change(&mut self) {
        let status = self.engine.status();
        let now = (status.role, status.epoch, status.leader);
        if now != self.seen {
            assert!(status.epoch >= self.seen.1, "epochs never go back");
            tracing::info!(role = ?status.role, epoch = status.epoch.0, leader = ?status.leader.map(|l| l.0),
                active_set = ?status.active_set, "role change");
            self.seen = now;
        }
    }

    async fn queue(&mut self, op: StorageOp) -> Result<(), String> {
        let seq = self.seq_next;
        self.seq_next += 1;
        if let StorageOp::TruncateAfter(index) = &op {
            if self.truncations.len() == TRUNCATIONS_TRACKED_MAX {
                // Keep the lowest clamp: fold the oldest into the next one.
                let (_, oldest) = self.truncations.pop_front().expect("full");
                let next = self.truncations.front_mut().expect("max is above one");
                next.1 = next.1.min(oldest);
            }
            self.truncations.push_back((seq, *index));
        }
        self.storage.ops.send((seq, op)).await.map_err(|_| "the storage thread ended".to_string())
    }

    /// Carries out one step's outputs in the contract's order.
    async fn carry_out(&mut self, out: Outputs) -> Result<(), String> {
        if let Some(hard_state) = out.hard_state {
            let (done, durable) = oneshot::channel();
            self.queue(StorageOp::HardState { hard_state, done }).await?;
            // Rule 1: no message leaves before the hard state is on disk.
            durable.await.map_err(|_| "storage failed while saving the hard state".to_string())?;
        }
        if let Some(index) = out.truncate_after {
            self.queue(StorageOp::TruncateAfter(index)).await?;
        }
        if !out.append.is_empty() {
            self.queue(StorageOp::Append(out.append)).await?;
        }
        if out.sync_through.is_some() {
            self.queue(StorageOp::Sync(Instant::now())).await?;
        }
        if !out.release.is_empty() {
            // Freeing an encoding as large as the state takes a while: not on this loop.
            let release = out.release;
            tokio::task::spawn_blocking(move || drop(release));
        }
        if let Some((meta, data)) = out.snapshot {
            tracing::info!(
                index = meta.last_index.0,
                bytes = data.len(),
                installed = out.snapshot_installed,
                "saving a snapshot"
            );
            // A snapshot this node took is written off the storage thread; one installed
            // from the leader is saved in order, before the appends that follow it.
            let inline = if out.snapshot_installed {
                Some((meta, data))
            } else {
                self.storage.prepare_snapshot(meta, data)
            };
            if let Some((meta, data)) = inline {
                self.queue(StorageOp::Snapshot(meta, data)).await?;
            }
        }
        self.send_messages(out.messages);
        self.send_replies(out.replies);
        self.wake_at = out.wake_at;
        Ok(())
    }

    fn send_messages(&mut self, messages: Vec<(NodeId, Message)>) {
        for (to, message) in messages {
            let queue = self.peers.get(&to).unwrap_or_else(|| panic!("message to non-member {to}"));
            if queue.try_send(message).is_err() {
                self.metrics.peer_dropped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }

    fn send_replies(&mut self, replies: Vec<ClientReply>) {
        for reply in replies {
            let Some(waiting) = self.waiting.remove(&reply.tag) else {
                // A reply to a request whose client gave up is still counted by the engine.
                tracing::debug!(tag = reply.tag.0, "reply for an unknown tag");
                continue;
            };
            let outcome = match &reply.result {
                Ok(_) => "ok",
                Err(e) => keel_wire::reply::error_prefix(e),
            };
            let seconds = waiting.started.elapsed().as_secs_f64();
            self.metrics.record(waiting.label, outcome, seconds);
            if reply.durability_round {
                self.metrics.round_read_seconds.observe(seconds);
            }
            let _ = waiting.reply.send(reply);
        }
    }
}

/// The index to report as synced: `synced.index`, clamped below every truncation queued
/// after the fsync's last operation (it may have removed entries the fsync covered; the
/// entries that replace them are not on disk yet). Forgets truncations the fsync covers.
pub fn clamp_synced(truncations: &mut VecDeque<(u64, LogIndex)>, synced: Synced) -> LogIndex {
    while truncations.front().is_some_and(|(seq, _)| *seq <= synced.seq) {
        truncations.pop_front();
    }
    let clamp = truncations.iter().map(|(_, index)| *index).min();
    let index = clamp.map_or(synced.index, |c| c.min(synced.index));
    assert!(index <= synced.index, "never report more than was synced");
    index
}

/// What connections and the HTTP endpoint hold to talk to the engine loop.
#[derive(Clone, Debug)]
pub struct NodeHandle {
    /// The engine loop's input.
    pub events: mpsc::Sender<Event>,
    /// The node's metrics.
    pub metrics: Arc<Metrics>,
    /// This node.
    pub node_id: NodeId,
}

impl NodeHandle {
    /// Submits a request and waits for its reply. A full input queue is a retryable
    /// `Busy`; a stopping node is `Unavailable`.
    pub async fn submit(&self, submit: Submit) -> Result<ClientReply, KeelError> {
        let (reply, answer) = oneshot::channel();
        let event = Event::Client { submit, reply, queued_at: Instant::now() };
        if let Err(e) = self.events.try_send(event) {
            return Err(match e {
                mpsc::error::TrySendError::Full(_) => {
                    self.metrics.busy_refusals.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    KeelError::Busy("input queue full".into())
                }
                mpsc::error::TrySendError::Closed(_) => {
                    KeelError::Unavailable("node stopping".into())
                }
            });
        }
        answer.await.map_err(|_| KeelError::Unavailable("node stopping".into()))
    }

    /// The engine's status and counters (waits for room in the queue, at most `wait`).
    pub async fn report(&self, wait: Duration) -> Result<NodeReport, KeelError> {
        let (reply, answer) = oneshot::channel();
        self.query(Event::Status(reply), wait).await?;
        answer.await.map_err(|_| KeelError::Unavailable("node stopping".into()))
    }

    /// A page of the log from `from`.
    pub async fn log(
        &self,
        from: LogIndex,
        count: u32,
        wait: Duration,
    ) -> Result<LogPage, KeelError> {
        let (reply, answer) = oneshot::channel();
        self.query(Event::Log { from, count, reply }, wait).await?;
        answer.await.map_err(|_| KeelError::Unavailable("node stopping".into()))
    }

    async fn query(&self, event: Event, wait: Duration) -> Result<(), KeelError> {
        match tokio::time::timeout(wait, self.events.send(event)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(KeelError::Unavailable("node stopping".into())),
            Err(_) => Err(KeelError::Busy("input queue full".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synced_index_is_clamped_below_later_truncations_only() {
        let mut truncations: VecDeque<(u64, LogIndex)> =
            [(3, LogIndex(5)), (8, LogIndex(7))].into();
        // The fsync ran after op 4: the truncation at op 3 is on disk, the one at 8 is not.
        let index = clamp_synced(&mut truncations, Synced { index: LogIndex(10), seq: 4 });
        assert_eq!(index, LogIndex(7));
        assert_eq!(truncations.len(), 1);
        // A later fsync covers everything.
        let index = clamp_synced(&mut truncations, Synced { index: LogIndex(9), seq: 9 });
        assert_eq!(index, LogIndex(9));
        assert!(truncations.is_empty());
    }

    #[test]
    fn submit_labels_name_the_level_or_durability() {
        let get = Submit {
            client: ClientId(1),
            request: RequestId(1),
            command: Command::Get { key: b"k".to_vec() },
            durability: None,
            level: Some(ReadLevel::Linearizable),
        };
        assert_eq!(get.label(), OpLabel { op: "get", class: "linearizable" });
        let put = Submit {
            command: Command::Put { key: b"k".to_vec(), value: vec![] },
            level: None,
            ..get
        };
        assert_eq!(put.label(), OpLabel { op: "put", class: "default" });
    }
}
