//! A keyspace's engine loop: one task owns the keyspace's engine and steps it, and
//! carries out each step's outputs through the effect executor's front
//! (`keel_exec::Front`), the same code the simulator runs. Client requests waiting in the
//! input queue are taken together, up to [`CLIENT_BATCH_MAX`], into one step
//! (`Input::Clients`): one step's fixed work (replication, answering what became
//! answerable, timers) is then paid once per burst, not once per request.
//!
//! Inputs arrive on two bounded channels: peer messages (decoded and checked by the
//! gate's stateless half on the connection's task; dropped when the channel is full: the
//! protocol tolerates loss), always taken first so that a backlog of clients cannot
//! delay the heartbeats and acknowledgements that keep a leader; and client requests
//! (refused with a retryable `BUSY` when it is full) and queries (`/status`, `/metrics`,
//! `KEEL.LOG`). Storage completions arrive from the keyspace's storage thread, snapshots
//! written off it from their tasks, and the timer fires at the engine's `wake_at`.
//!
//! Time: the engine sees `Time` as the host's `CLOCK_BOOTTIME` in nanoseconds (the
//! driver reads the clock; the engine never does). Not "since the process started":
//! peers echo this node's send times back to it as lease anchors, and an anchor from
//! before a restart must not look like the future to the restarted node. Not
//! `CLOCK_MONOTONIC`, which stops while the host is suspended: a leader suspended past
//! its lease would wake believing it still held it (`docs/protocol.md` §4).
//!
//! What the front decides and this loop carries out (see `keel_exec::front`):
//! 1. storage operations go to the storage thread in order, appends held for a few
//!    milliseconds and merged (`keel_exec::AppendHold`); the loop never waits for the
//!    disk (messages that depend on a hard state wait in the front instead);
//! 2. a snapshot this node took is written on a blocking task, then adopted in order;
//! 3. messages go to the per-peer queues (dropped when full), replies to connections;
//! 4. memory the engine let go of is freed on a blocking task;
//! 5. messages the engine's gate dropped are counted and logged at a bounded rate.
//!
//! Reads off the loop: the loop holds its engine in an [`EngineView`] and write-locks it
//! only to step it. Between steps a connection may read-lock it (without waiting: a
//! step under way sends the read to the loop) and ask the engine for a reply it would
//! give at once ([`Engine::read_now`]): a `GET` whose key is durable is then answered on
//! the connection's task, with no hop through the loop. Closed while the front holds
//! replies behind a hard state not yet durable (as it would hold that read's reply).

use crate::metrics::{KeyspaceMetrics, Metrics, OpLabel};
use crate::peer::PeerQueues;
use crate::storage::{StorageHandle, STORAGE_QUEUE_MAX};
use keel_core::engine::{
    ClientReply, ClientRequest, Engine, FromClient, Input, OutputsOf, Report, RoleView,
};
use keel_core::time::Time;
use keel_exec::{AppendHold, Completion, EngineCell, Front, Io, Refusal, Replica, StorageOp};
use keel_types::fasthash::FastHash;
use keel_types::{
    ClientId, Command, Durability, KeelError, KeyspaceId, LogIndex, LogRecord, NodeId, ReadLevel,
    RequestId, SnapshotMeta,
};
use keel_wire::peer::{Outgoing, PeerMessage};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, watch};

/// Most client requests one engine step takes (those queued when the loop gets to
/// them): enough to amortize a step's fixed work over a pipelined burst, few enough that
/// one step stays short.
pub const CLIENT_BATCH_MAX: usize = 256;

/// Most entries one `KEEL.LOG` page returns.
pub const LOG_PAGE_ENTRIES_MAX: u32 = 1024;
/// Most key and value bytes one `KEEL.LOG` page carries (at least one entry goes out, so a
/// reader always moves on); the reply, in JSON, is a few times larger.
pub const LOG_PAGE_BYTES_MAX: usize = 4 << 20;

/// A step (engine plus carrying out its outputs) this long is logged as a warning: a
/// third of the default heartbeat-to-election margin.
pub const SLOW_STEP: Duration = Duration::from_millis(100);

/// Most messages held behind a hard state not yet durable (one fsync's worth of steps).
pub const HELD_MESSAGES_MAX: usize = STORAGE_QUEUE_MAX;

/// The host's clock since boot (`CLOCK_BOOTTIME`): monotonic, running while the host is
/// suspended, continuous across restarts of the process (not across reboots, which
/// outlast every lease). Skewed only by the test-only [`skew_clock`].
pub fn monotonic_now() -> Time {
    let raw = boottime_nanos();
    match CLOCK_SKEW.get() {
        None => Time(raw),
        Some(skew) => Time(skew.apply(raw)),
    }
}

/// The system's wall clock, unix milliseconds (what `TTL` and its kin count down to).
pub fn wall_ms() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    since.map_or(0, |since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
}

/// The unix time, in milliseconds, at which [`monotonic_now`] read 0: the engine's wall
/// clock is this plus its monotonic clock (`keel_core::leader::Config::wall_clock_origin_ms`),
/// read once at boot, so that a step of the system clock later does not move expiries.
pub fn wall_clock_origin_ms() -> u64 {
    wall_ms().saturating_sub(monotonic_now().0 / 1_000_000)
}

fn boottime_nanos() -> u64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .expect("CLOCK_BOOTTIME is readable");
    let nanos = u64::try_from(ts.tv_sec()).expect("non-negative") * 1_000_000_000
        + u64::try_from(ts.tv_nsec()).expect("non-negative");
    assert!(nanos > 0, "the monotonic clock has started");
    nanos
}

/// A test-only clock: ahead by `offset` and running `rate_ppm` fast (or slow) since `start`.
#[derive(Debug)]
struct ClockSkew {
    start: u64,
    offset: u64,
    rate_ppm: i32,
}

impl ClockSkew {
    fn apply(&self, raw: u64) -> u64 {
        let elapsed = raw.saturating_sub(self.start);
        let drift = i128::from(elapsed) * i128::from(self.rate_ppm) / 1_000_000;
        let skewed = i128::from(self.start) + i128::from(self.offset) + i128::from(elapsed) + drift;
        // Monotonic still: |rate| ≤ 100 ppm keeps the slope positive.
        u64::try_from(skewed.max(1)).unwrap_or(u64::MAX)
    }
}

static CLOCK_SKEW: std::sync::OnceLock<ClockSkew> = std::sync::OnceLock::new();

/// Test-only (`[testing] clock_rate_ppm`, `clock_offset_ms`): from now on this process's
/// engines see a clock `offset_ms` ahead of the host's that runs `rate_ppm` parts per
/// million fast (negative: slow). Once per process; a second call changes nothing.
pub fn skew_clock(rate_ppm: i32, offset_ms: u64) {
    assert!(rate_ppm.abs() <= 1_000_000, "a clock that runs forwards");
    let skew = ClockSkew { start: boottime_nanos(), offset: offset_ms * 1_000_000, rate_ppm };
    let _ = CLOCK_SKEW.set(skew);
}

/// Test-only (`[testing] unsafe_ack_durable_before_fsync`): `durable` writes are handed
/// to the engine as `replicated` ones.
static DURABLE_AS_REPLICATED: AtomicBool = AtomicBool::new(false);

/// Turns on the negative control `[testing] unsafe_ack_durable_before_fsync` for this
/// process: its `durable` writes are acknowledged before any fsync.
pub fn ack_durable_before_fsync() {
    DURABLE_AS_REPLICATED.store(true, Ordering::Relaxed);
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
    /// For reads: the connection's session floor (`ClientRequest::after`).
    pub after: LogIndex,
    /// The synchronization asked (Kite keyspaces; `ClientRequest::mode`).
    pub mode: keel_core::engine::OpMode,
    /// Whether the client chose the pair itself (`KEEL.REQ`; `ClientRequest::named`).
    pub named: bool,
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

/// A log record as `KEEL.LOG` shows it, whatever the engine's record type.
pub trait ShownRecord: std::fmt::Debug + Send {
    /// The record as JSON.
    fn to_json(&self) -> Vec<u8>;
}

impl<R: LogRecord> ShownRecord for R {
    fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("log records serialize")
    }
}

/// One page of the log, for `KEEL.LOG`.
#[derive(Debug)]
pub struct LogPage {
    /// The records held from the index asked for, in order (none below the snapshot).
    pub entries: Vec<Box<dyn ShownRecord>>,
    /// The last index covered by the node's snapshot (entries at or below it are gone).
    pub snapshot_index: LogIndex,
}

/// An input for a keyspace's engine loop from connections and the HTTP endpoint.
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
    /// A status query: the engine's report.
    Report(oneshot::Sender<Report>),
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

/// A peer message for one keyspace, decoded and past the gate's stateless half.
#[derive(Debug)]
pub struct PeerEvent<M> {
    /// The sender.
    pub from: NodeId,
    /// The message.
    pub message: M,
}

/// A request inside the engine, waiting for its reply.
struct Waiting {
    reply: oneshot::Sender<ClientReply>,
    started: Instant,
    label: OpLabel,
}

/// The channels and counters a keyspace's loop talks through.
pub struct Wiring<R> {
    /// This keyspace.
    pub keyspace: KeyspaceId,
    /// The keyspace's storage thread.
    pub storage: StorageHandle<R>,
    /// The per-peer send queues, shared by every keyspace of the node.
    pub peers: Arc<PeerQueues>,
    /// The keyspace's metrics.
    pub metrics: Arc<KeyspaceMetrics>,
    /// The node's metrics (peer traffic, rejections).
    pub node_metrics: Arc<Metrics>,
    /// This node.
    pub node_id: NodeId,
    /// What the values of replies the leader served may hold on this node until their
    /// clients read them (`forwarded_replies_bytes_max`, shared by every keyspace).
    pub forwarded_replies: Arc<keel_exec::ByteBudget>,
    /// The node's pub/sub, which hears the keyspace events the replica applies.
    pub broker: Arc<crate::pubsub::Broker>,
}

/// Reads served off the engine loop, whatever the engine kind.
pub trait ReadView: Send + Sync + std::fmt::Debug {
    /// The reply `request` gets at once, if the engine would answer it without waiting
    /// and no step is under way, with the time the engine read it at; `None` sends it to
    /// the loop.
    fn read_now(&self, request: ClientRequest) -> Option<(ClientReply, Time)>;
}

impl<E: Engine + Sync> ReadView for EngineCell<E> {
    fn read_now(&self, request: ClientRequest) -> Option<(ClientReply, Time)> {
        // A request the engine kind refuses goes to the loop, which answers it.
        let request = E::Request::from_client(request).ok()?;
        let (reply, now) = EngineCell::read_now(self, &request, monotonic_now)?;
        Some((reply.into(), now))
    }
}

/// A keyspace's engine loop: the tokio shell around the replica (`keel_exec::Replica`),
/// which is the loop body the simulator runs too.
pub struct Driver<E: Engine> {
    replica: Replica<E>,
    wiring: Wiring<E::Record>,
    tag_next: u64,
    /// Keyed by tag, a number the driver counts up, and never iterated: a hash map
    /// (`docs/performance.md`, *Work per request*).
    waiting: HashMap<keel_core::engine::RequestTag, Waiting, FastHash>,
    /// When the oldest log sync not yet reported was asked for (for the sync-wait
    /// histogram).
    sync_asked: Option<Instant>,
    /// Operations on their way to the storage thread (kept for its allocation).
    handoff: Vec<(u64, StorageOp<E::Record>)>,
    /// Whether the engine records keyspace events (`notify-keyspace-events`).
    recording: bool,
}

/// What leaves the replica, carried out on the server's channels: messages to the peer
/// queues (client values charged to the link, shed past its bound), replies to their
/// connections (values served by another node charged to the forwarded replies' budget),
/// snapshots written and memory freed on blocking tasks, rejections counted.
struct ServerIo<'a, R> {
    wiring: &'a Wiring<R>,
    waiting: &'a mut HashMap<keel_core::engine::RequestTag, Waiting, FastHash>,
    sync_asked: &'a mut Option<Instant>,
    /// One clock reading for the replies of a step: they leave together.
    replied_at: Option<Instant>,
    /// A snapshot that could not be written off the storage thread.
    failed: Option<String>,
}

impl<E: Engine> Io<E> for ServerIo<'_, E::Record>
where
    E::Message: PeerMessage + Send + Sync,
{
    fn send(&mut self, to: NodeId, message: E::Message) {
        let outgoing = Outgoing { keyspace: self.wiring.keyspace, message: Box::new(message) };
        if !self.wiring.peers.send(to, outgoing) {
            self.wiring.node_metrics.peer_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn send_bulk(
        &mut self,
        to: NodeId,
        message: E::Message,
        bulk: usize,
    ) -> Result<(), E::Message> {
        let Some(hold) = self.wiring.peers.hold_bulk(to, bulk) else { return Err(message) };
        let message = Box::new(crate::peer::WithBulk { message, hold });
        if !self.wiring.peers.send(to, Outgoing { keyspace: self.wiring.keyspace, message }) {
            self.wiring.node_metrics.peer_dropped.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    fn refused(&mut self, refusal: Refusal) {
        let metrics = &self.wiring.node_metrics;
        match refusal {
            Refusal::Shed { .. } => metrics.peer_bulk_shed.fetch_add(1, Ordering::Relaxed),
            Refusal::ForwardedReplyBusy => {
                metrics.forwarded_replies_refused.fetch_add(1, Ordering::Relaxed)
            }
        };
    }

    fn reply(&mut self, reply: E::Reply) {
        let now = *self.replied_at.get_or_insert_with(Instant::now);
        let reply: ClientReply = reply.into();
        let Some(waiting) = self.waiting.remove(&reply.tag) else {
            // A reply to a request whose client gave up is still counted by the engine.
            tracing::debug!(tag = reply.tag.0, "reply for an unknown tag");
            return;
        };
        let outcome = match &reply.result {
            Ok(_) => "ok",
            Err(e) => keel_wire::reply::error_prefix(e),
        };
        let seconds = now.saturating_duration_since(waiting.started).as_secs_f64();
        self.wiring.metrics.record(waiting.label, outcome, seconds);
        if reply.durability_round {
            self.wiring.metrics.round_read_seconds.observe(seconds);
        }
        let _ = waiting.reply.send(reply);
    }

    fn prepare(&mut self, meta: SnapshotMeta, data: keel_core::engine::SnapshotBytes) {
        // A snapshot this node took is written off the storage thread; the front queues
        // its adoption once it is written.
        if self.wiring.storage.prepare_snapshot(meta, data).is_some() {
            self.failed = Some("this storage cannot write a snapshot off its thread".into());
        }
    }

    fn release(&mut self, release: Vec<keel_core::engine::Release<E::Record>>) {
        // Freeing an encoding as large as the state takes a while: not on this loop.
        tokio::task::spawn_blocking(move || drop(release));
    }

    fn rejected(&mut self, rejection: keel_core::engine::Rejection) {
        self.wiring.node_metrics.rejected(self.wiring.keyspace, rejection.from, rejection.reason);
    }

    fn dropped(&mut self, messages: u64) {
        self.wiring.node_metrics.peer_dropped.fetch_add(messages, Ordering::Relaxed);
    }

    fn stepped(&mut self, out: &OutputsOf<E>) {
        if let Some((meta, data)) = &out.snapshot {
            tracing::info!(keyspace = %self.wiring.keyspace, index = meta.last_index.0, bytes = data.len(),
                installed = out.snapshot_installed, "saving a snapshot");
        }
        if out.sync_through.is_some() {
            self.sync_asked.get_or_insert_with(Instant::now);
        }
    }

    fn events(&mut self, events: Vec<keel_core::engine::KeyEvent>) {
        self.wiring.broker.applied(self.wiring.keyspace, events);
    }

    fn completed(&mut self, completion: &Completion) {
        match completion {
            Completion::Synced { .. } => {
                if let Some(asked) = self.sync_asked.take() {
                    self.wiring.metrics.sync_wait_seconds.observe(asked.elapsed().as_secs_f64());
                }
            }
            Completion::SnapshotSaved { meta } => {
                tracing::info!(keyspace = %self.wiring.keyspace, index = meta.last_index.0, "snapshot saved");
            }
            Completion::HardStateSaved { .. } => {}
        }
    }
}

impl<E: Engine + Sync> Driver<E>
where
    E::Message: PeerMessage + Send + Sync,
{
    /// A loop for `engine` (booted at [`monotonic_now`]).
    pub fn new(engine: E, wiring: Wiring<E::Record>) -> Driver<E> {
        assert!(!wiring.peers.contains(engine.node_id()), "no queue to itself");
        let hold = AppendHold::new(keel_exec::APPEND_HOLD_NS, keel_exec::APPEND_HOLD_ENTRIES_MAX);
        let role = engine.role();
        tracing::info!(keyspace = %wiring.keyspace, role = role.role, epoch = role.epoch,
            leader = ?role.leader.map(|l| l.0), "role at start");
        wiring.metrics.set_leader(role.leader, role.epoch);
        Driver {
            replica: Replica::new(engine, Front::new(HELD_MESSAGES_MAX), hold)
                .with_forwarded_replies(wiring.forwarded_replies.clone()),
            wiring,
            tag_next: 1,
            waiting: HashMap::default(),
            sync_asked: None,
            handoff: Vec::new(),
            recording: false,
        }
    }

    /// Runs until `shutdown` is set or `events` closes (`Ok`), or the storage fails
    /// (`Err` with the reason: the node must stop and exit non-zero). `peer_events` are
    /// taken before `events`.
    pub async fn run(
        mut self,
        mut events: mpsc::Receiver<Event>,
        mut peer_events: mpsc::Receiver<PeerEvent<E::Message>>,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<(), String> {
        self.step(Input::Tick).await?;
        loop {
            // The engine's clock and the runtime's, read once: engine times to instants.
            let (now, now_at) = (monotonic_now(), Instant::now());
            let at = |time: Time| now_at + Duration::from_nanos(time.0.saturating_sub(now.0));
            // Without a wake-up asked for, tick anyway every second (harmless, bounded).
            let tick_at = at(self.replica.wake_at().unwrap_or(Time(now.0 + 1_000_000_000)));
            let release_at = self.replica.hold_due().map(at);
            let deadline = release_at.map_or(tick_at, |release| release.min(tick_at));
            tokio::select! {
                biased;
                _ = shutdown.changed() => {
                    // Hand over what is held, as a stop did before appends were held
                    // (still unsynced: only a sync made anything durable, then and now).
                    self.replica.release_held();
                    let _ = self.hand_over().await;
                    return Ok(());
                }
                changed = self.wiring.storage.fatal.changed() => {
                    let reason = self.wiring.storage.fatal.borrow().clone();
                    return Err(reason.unwrap_or_else(|| format!("storage thread ended: {changed:?}")));
                }
                completion = self.wiring.storage.completions.recv() => {
                    let Some(first) = completion else {
                        return Err("the storage thread ended".into());
                    };
                    self.on_completions(first).await?;
                }
                Some(prepared) = self.wiring.storage.prepared.recv() => {
                    let (meta, len) = prepared?;
                    self.replica.prepared(monotonic_now(), meta, len);
                    self.hand_over().await?;
                }
                Some(event) = peer_events.recv() => {
                    let input = Input::Message { from: event.from, message: event.message };
                    self.step(input).await?;
                }
                event = events.recv() => match event {
                    Some(event) => self.on_events(event, &mut events).await?,
                    None => return Ok(()),
                },
                () = tokio::time::sleep_until(deadline.into()) => {
                    let fired = Instant::now();
                    if release_at.is_some_and(|release| release <= fired) {
                        self.replica.release_held();
                        self.hand_over().await?;
                    }
                    if fired < tick_at {
                        continue;
                    }
                    let late = fired.saturating_duration_since(tick_at);
                    if late >= SLOW_STEP {
                        // The loop was not scheduled in time (an overloaded host, or a
                        // runtime thread blocked): timers, heartbeats and leases slip.
                        tracing::warn!(keyspace = %self.wiring.keyspace, late_ms = late.as_millis() as u64, "engine timer fired late");
                    }
                    self.step(Input::Tick).await?
                }
            }
        }
    }

    /// The engine, read-locked (the loop is its only writer, so this never waits).
    fn engine(&self) -> std::sync::RwLockReadGuard<'_, E> {
        self.replica.engine()
    }

    /// What connections hold to read this keyspace off the loop.
    pub fn view(&self) -> Arc<EngineCell<E>> {
        self.replica.cell().clone()
    }

    /// The server's side of the replica's outputs, for one call. Keyspace events are
    /// recorded from this call on if `notify-keyspace-events` asks for them now.
    fn io(&mut self) -> (&mut Replica<E>, ServerIo<'_, E::Record>) {
        if self.wiring.broker.recording() != self.recording {
            self.recording = !self.recording;
            self.replica.record_events(self.recording);
        }
        let io = ServerIo {
            wiring: &self.wiring,
            waiting: &mut self.waiting,
            sync_asked: &mut self.sync_asked,
            replied_at: None,
            failed: None,
        };
        (&mut self.replica, io)
    }

    /// Takes every completion waiting (the first one given) and hands them to the
    /// replica.
    async fn on_completions(&mut self, first: Completion) -> Result<(), String> {
        let mut completions = vec![first];
        while let Ok(more) = self.wiring.storage.completions.try_recv() {
            completions.push(more);
        }
        let now = monotonic_now();
        let keyspace = self.wiring.keyspace;
        let (replica, mut io) = self.io();
        let changed = replica.complete(now, &completions, &mut io);
        let failed = io.failed.take();
        if let Some(role) = &changed {
            self.wiring.metrics.set_leader(role.leader, role.epoch);
        }
        self.publish_slots();
        log_role_change(keyspace, changed);
        self.hand_over().await?;
        failed.map_or(Ok(()), Err)
    }

    /// Takes `first` and the client requests queued behind it (at most
    /// [`CLIENT_BATCH_MAX`]) into one engine step; a query ends the batch and runs after
    /// it.
    async fn on_events(
        &mut self,
        first: Event,
        events: &mut mpsc::Receiver<Event>,
    ) -> Result<(), String> {
        let mut batch = Vec::new();
        let mut admitted_at = None;
        let mut next = Some(first);
        while let Some(event) = next.take() {
            match event {
                Event::Client { submit, reply, queued_at } => {
                    // One clock reading for the batch: it is admitted at once.
                    let now = *admitted_at.get_or_insert_with(Instant::now);
                    batch.extend(self.admit(submit, reply, queued_at, now));
                    if batch.len() < CLIENT_BATCH_MAX {
                        next = events.try_recv().ok();
                    }
                }
                query => {
                    self.step_clients(std::mem::take(&mut batch)).await?;
                    return self.on_query(query);
                }
            }
        }
        self.step_clients(batch).await
    }

    /// Gives a client request its tag and remembers where its reply goes; a request the
    /// engine kind refuses ([`FromClient`]) is answered at once instead.
    fn admit(
        &mut self,
        submit: Submit,
        reply: oneshot::Sender<ClientReply>,
        queued_at: Instant,
        now: Instant,
    ) -> Option<E::Request> {
        let tag = keel_core::engine::RequestTag(self.tag_next);
        self.tag_next += 1;
        let label = submit.label();
        let waited = now.saturating_duration_since(queued_at);
        self.wiring.metrics.input_wait_seconds.observe(waited.as_secs_f64());
        let request = ClientRequest {
            tag,
            client: submit.client,
            request: submit.request,
            command: submit.command,
            durability: match submit.durability {
                Some(Durability::Durable) if DURABLE_AS_REPLICATED.load(Ordering::Relaxed) => {
                    Some(Durability::Replicated)
                }
                other => other,
            },
            level: submit.level,
            after: submit.after,
            mode: submit.mode,
            named: submit.named,
        };
        match E::Request::from_client(request) {
            Ok(request) => {
                self.waiting.insert(tag, Waiting { reply, started: queued_at, label });
                Some(request)
            }
            Err(error) => {
                let outcome = keel_wire::reply::error_prefix(&error);
                self.wiring.metrics.record(label, outcome, waited.as_secs_f64());
                let served_by = self.wiring.node_id;
                let refusal =
                    ClientReply { tag, served_by, result: Err(error), durability_round: false };
                let _ = reply.send(refusal);
                None
            }
        }
    }

    async fn step_clients(&mut self, batch: Vec<E::Request>) -> Result<(), String> {
        if batch.is_empty() {
            return Ok(());
        }
        self.timed("clients", |replica, now, io| replica.clients(now, batch, io)).await
    }

    fn on_query(&mut self, event: Event) -> Result<(), String> {
        match event {
            Event::Client { .. } => unreachable!("client requests are batched"),
            Event::Report(reply) => {
                let _ = reply.send(self.engine().report());
                Ok(())
            }
            Event::Log { from, count, reply } => {
                let count = count.clamp(1, LOG_PAGE_ENTRIES_MAX) as usize;
                let (mut entries, snapshot_index) = self.engine().log_page(from, count);
                entries.truncate(page_within_budget(&entries));
                let entries = entries.into_iter().map(|r| Box::new(r) as Box<_>).collect();
                let _ = reply.send(LogPage { entries, snapshot_index });
                Ok(())
            }
        }
    }

    async fn step(&mut self, input: Input<E::Message, E::Request>) -> Result<(), String> {
        let what = input_name(&input);
        self.timed(what, |replica, now, io| replica.step(now, input, io)).await
    }

    /// Runs one call into the replica at the clock's time, hands the disk its work, and
    /// warns when it took long enough to cost leases or an election.
    async fn timed(
        &mut self,
        what: &'static str,
        call: impl FnOnce(&mut Replica<E>, Time, &mut ServerIo<'_, E::Record>) -> Option<RoleView>,
    ) -> Result<(), String> {
        let now = monotonic_now();
        let started = Instant::now();
        let keyspace = self.wiring.keyspace;
        let (replica, mut io) = self.io();
        let changed = call(replica, now, &mut io);
        let failed = io.failed.take();
        if let Some(role) = &changed {
            self.wiring.metrics.set_leader(role.leader, role.epoch);
        }
        self.publish_slots();
        log_role_change(keyspace, changed);
        let result = self.hand_over().await;
        let total = started.elapsed();
        if total >= SLOW_STEP {
            tracing::warn!(%keyspace, input = what, ms = total.as_millis() as u64, "slow engine step");
        }
        failed.map_or(result, Err)
    }

    /// Publishes the replica's slot states if a step changed them (cheap otherwise: the
    /// engine compares a generation).
    fn publish_slots(&self) {
        let since = self.wiring.metrics.slot_generation();
        if let Some((generation, states)) = self.replica.engine().slot_states(since) {
            self.wiring.metrics.set_slot_states(generation, states);
        }
    }

    /// Hands the operations the replica has ready to the storage thread, in order.
    async fn hand_over(&mut self) -> Result<(), String> {
        self.replica.take_ready(&mut self.handoff);
        let ops = &self.wiring.storage.ops;
        for op in self.handoff.drain(..) {
            ops.send(op).await.map_err(|_| "the storage thread ended".to_string())?;
        }
        Ok(())
    }
}

fn log_role_change(keyspace: KeyspaceId, changed: Option<RoleView>) {
    if let Some(now) = changed {
        tracing::info!(%keyspace, role = now.role, epoch = now.epoch,
            leader = ?now.leader.map(|l| l.0), "role change");
    }
}

/// How many of `entries`, from the first, fit in [`LOG_PAGE_BYTES_MAX`] (at least one).
fn page_within_budget(entries: &[impl LogRecord]) -> usize {
    let mut bytes = 0usize;
    for (i, entry) in entries.iter().enumerate() {
        bytes += entry.payload_bytes();
        if bytes > LOG_PAGE_BYTES_MAX && i > 0 {
            return i;
        }
    }
    entries.len()
}

/// The kind of an input, for logs.
fn input_name<M, Q>(input: &Input<M, Q>) -> &'static str {
    match input {
        Input::Tick => "tick",
        Input::Message { .. } => "message",
        Input::Client(_) => "client",
        Input::Clients(_) => "clients",
        Input::LogSynced { .. } => "log synced",
        Input::SnapshotSaved { .. } => "snapshot saved",
    }
}

/// What connections and the HTTP endpoint hold to talk to one keyspace's engine loop.
#[derive(Clone, Debug)]
pub struct KeyspaceHandle {
    /// The keyspace.
    pub id: KeyspaceId,
    /// Its name.
    pub name: String,
    /// Its engine kind.
    pub kind: keel_core::engine::EngineKind,
    /// The engine loop's input.
    pub events: mpsc::Sender<Event>,
    /// The engine, for reads served off the loop (`None`: every request goes to the loop).
    pub view: Option<Arc<dyn ReadView>>,
    /// The keyspace's metrics.
    pub metrics: Arc<KeyspaceMetrics>,
    /// This node.
    pub node_id: NodeId,
    /// Negative control only (`[testing] unsafe_stale_invoke`): a `KEEL.INVOKE GET`'s
    /// final view is read at `any`, from this node's state, yet labelled with the
    /// strongest level asked for (a binding that never coordinated).
    pub unsafe_stale_invoke: bool,
    /// Negative control only (`[testing] unsafe_script_skip_watch`): a script's
    /// write-back watches none of the keys it read.
    pub unsafe_script_skip_watch: bool,
    /// In a sharded cluster, what the keyspace takes: every request passes it.
    pub guard: Option<Arc<crate::placement::SlotGuard>>,
    /// The request at hand was sent on by a slot's source (`ASKING`, then `ASK`) in the
    /// move of this id: its command goes as `Command::Asking` (set on a connection's
    /// copy, for one request).
    pub asking: Option<u64>,
}

impl KeyspaceHandle {
    /// Submits a request and waits for its reply. A full input queue is a retryable
    /// `Busy`; a node whose loop has stopped refuses it with `Unavailable`; one whose
    /// loop stops after taking it answers `Timeout` (outcome unknown, [`Sent::answer`]).
    pub async fn submit(&self, submit: Submit) -> Result<ClientReply, KeelError> {
        self.send(submit).answer().await
    }

    /// The reply to `submit` if the engine answers it at once and no step is under way
    /// (a `GET` of a durable key), served here, off the loop; `None`: send it.
    pub fn read_now(&self, submit: &Submit) -> Option<ClientReply> {
        let view = self.view.as_ref()?;
        let request = ClientRequest {
            tag: keel_core::engine::RequestTag(0),
            client: submit.client,
            request: submit.request,
            command: self.asked(submit.command.clone()),
            durability: submit.durability,
            level: submit.level,
            after: submit.after,
            mode: submit.mode,
            named: submit.named,
        };
        if self.guard.as_ref().is_some_and(|g| g.check(&request.command).is_err()) {
            return None; // `send` gives the refusal
        }
        let (mut reply, started) = view.read_now(request)?;
        if let (Some(guard), Err(error)) = (&self.guard, &mut reply.result) {
            *error = guard.translate(std::mem::replace(error, KeelError::Timeout));
        }
        self.metrics.reads_off_loop.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // From the engine's own clock reading: a read off the loop reads the clock twice.
        let took = monotonic_now().0.saturating_sub(started.0);
        self.metrics.record(submit.label(), "ok", Duration::from_nanos(took).as_secs_f64());
        Some(reply)
    }

    /// Puts a request in the engine loop's queue now (requests sent one after another
    /// reach the engine in that order) and returns where its reply will arrive.
    pub fn send(&self, mut submit: Submit) -> Sent {
        if let Some(Err(refusal)) = self.guard.as_ref().map(|g| g.check(&submit.command)) {
            return Sent(Err(refusal), None);
        }
        submit.command = self.asked(submit.command);
        let (reply, answer) = oneshot::channel();
        let event = Event::Client { submit, reply, queued_at: Instant::now() };
        let sent = match self.events.try_send(event) {
            Ok(()) => Ok(answer),
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.metrics.busy_refusals.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Err(KeelError::Busy("input queue full".into()))
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                Err(KeelError::Unavailable("node stopping".into()))
            }
        };
        Sent(sent, self.guard.clone())
    }

    /// The engine's report (waits for room in the queue, at most `wait`).
    pub async fn report(&self, wait: Duration) -> Result<Report, KeelError> {
        let (reply, answer) = oneshot::channel();
        self.query(Event::Report(reply), wait).await?;
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

impl KeyspaceHandle {
    /// `command` as this handle sends it: sent on by a slot's source when
    /// [`Self::asking`] (and it has keys).
    fn asked(&self, command: keel_types::Command) -> keel_types::Command {
        match self.asking.filter(|_| command.may_be_asked()) {
            Some(id) => keel_types::Command::Asking(id, Box::new(command)),
            None => command,
        }
    }
}

/// A request in an engine loop's queue (or refused at its door), and the keyspace's slot
/// guard, which words the engine's slot refusals for the client.
#[derive(Debug)]
pub struct Sent(
    Result<oneshot::Receiver<ClientReply>, KeelError>,
    Option<Arc<crate::placement::SlotGuard>>,
);

impl Sent {
    /// Waits for the reply. A request the engine took and never answered (its loop
    /// stopped: a storage error, a shutdown) may have been applied, by this node or by
    /// the peers it reached, so it is answered `Timeout` (outcome unknown), never as a
    /// refusal: a client told "unavailable" would take it for not done.
    pub async fn answer(self) -> Result<ClientReply, KeelError> {
        let mut reply = self.0?.await.map_err(|_| KeelError::Timeout)?;
        if let (Some(guard), Err(error)) = (&self.1, &mut reply.result) {
            *error = guard.translate(std::mem::replace(error, KeelError::Timeout));
        }
        Ok(reply)
    }
}

/// Every keyspace a node hosts, by id. Shared by connections and the HTTP endpoint.
#[derive(Clone, Debug)]
pub struct Keyspaces {
    by_id: BTreeMap<KeyspaceId, KeyspaceHandle>,
    /// The node's own metrics.
    pub node_metrics: Arc<Metrics>,
    /// This node.
    pub node_id: NodeId,
    /// The node's pub/sub.
    pub broker: Arc<crate::pubsub::Broker>,
    /// Where every keyspace of the cluster lives (`None`: every keyspace is here, and
    /// the cluster is not sharded).
    pub placement: Option<Arc<crate::placement::Placement>>,
    /// The leaders other members said they are (a placed cluster's leader notices).
    pub heard: Option<Arc<crate::leaders::HeardLeaders>>,
}

impl Keyspaces {
    /// The keyspaces this node hosts (one at least).
    pub fn new(
        handles: Vec<KeyspaceHandle>,
        node_metrics: Arc<Metrics>,
        node_id: NodeId,
    ) -> Keyspaces {
        let by_id: BTreeMap<KeyspaceId, KeyspaceHandle> =
            handles.into_iter().map(|h| (h.id, h)).collect();
        assert!(!by_id.is_empty(), "a node hosts a keyspace at least");
        let broker = crate::pubsub::Broker::start(None, node_metrics.clone());
        Keyspaces { by_id, node_metrics, node_id, broker, placement: None, heard: None }
    }

    /// The same keyspaces in a cluster placed as `placement` says.
    pub fn with_placement(mut self, placement: Arc<crate::placement::Placement>) -> Keyspaces {
        self.placement = Some(placement);
        self
    }

    /// The same keyspaces, hearing other members' leader notices in `heard`.
    pub fn with_heard(mut self, heard: Arc<crate::leaders::HeardLeaders>) -> Keyspaces {
        self.heard = Some(heard);
        self
    }

    /// The leader of `keyspace` as this node knows it: its own replica's belief when it
    /// hosts the keyspace, else the leader a notice named lately.
    pub fn leader_of(&self, keyspace: KeyspaceId) -> Option<NodeId> {
        match self.get(keyspace) {
            Some(handle) => handle.metrics.known_leader(),
            None => self.heard.as_ref()?.leader(keyspace, Instant::now()),
        }
    }

    /// The hash slot states of the keyspaces this node hosts, now.
    pub fn slot_view(&self) -> crate::placement::SlotView {
        crate::placement::SlotView::of(self.by_id.iter().map(|(id, h)| (*id, &*h.metrics)))
    }

    /// The cluster's placement, if it places keyspaces on groups or shards them.
    pub fn placement(&self) -> Option<&crate::placement::Placement> {
        self.placement.as_deref()
    }

    /// Whether the cluster is sharded (speaks the Redis Cluster protocol).
    pub fn sharded(&self) -> bool {
        self.placement.as_ref().is_some_and(|p| p.sharded())
    }

    /// Whether `node`'s peer link to this node is up, or `node` is this node.
    pub fn reachable(&self, node: NodeId) -> bool {
        crate::placement::reachable(&self.node_metrics, self.node_id, node)
    }

    /// The same keyspaces with the node's pub/sub `broker` (one that reaches the peers).
    pub fn with_broker(mut self, broker: Arc<crate::pubsub::Broker>) -> Keyspaces {
        self.broker = broker;
        self
    }

    /// The keyspace `id`, if this node hosts it.
    pub fn get(&self, id: KeyspaceId) -> Option<&KeyspaceHandle> {
        self.by_id.get(&id)
    }

    /// The lowest keyspace this node hosts (keyspace 0 where it hosts every keyspace),
    /// where every connection starts.
    pub fn first(&self) -> &KeyspaceHandle {
        self.by_id.values().next().expect("a node hosts a keyspace at least")
    }

    /// Every keyspace, by id.
    pub fn iter(&self) -> impl Iterator<Item = &KeyspaceHandle> {
        self.by_id.values()
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_log_page_stops_at_its_byte_budget_but_never_at_zero_entries() {
        use keel_types::{ClientId, Entry, EntryPayload, Epoch, RequestId};
        let write = |index: u64, bytes: usize| Entry {
            epoch: Epoch(1),
            index: LogIndex(index),
            payload: EntryPayload::Write {
                client: ClientId(1),
                request: RequestId(index),
                durability: Durability::Memory,
                command: Command::Put { key: "k".into(), value: vec![0; bytes].into() },
            },
        };
        let big = LOG_PAGE_BYTES_MAX / 2;
        let entries: Vec<Entry> = (1..=4).map(|i| write(i, big)).collect();
        assert_eq!(page_within_budget(&entries), 1, "two halves and two keys exceed it");
        let huge = vec![write(1, 2 * LOG_PAGE_BYTES_MAX), write(2, 1)];
        assert_eq!(page_within_budget(&huge), 1, "one entry over budget still goes out");
        let small: Vec<Entry> = (1..=100).map(|i| write(i, 10)).collect();
        assert_eq!(page_within_budget(&small), 100);
    }
    use super::*;

    #[test]
    fn a_skewed_test_clock_is_ahead_by_its_offset_and_drifts_at_its_rate() {
        let second = 1_000_000_000;
        let fast = ClockSkew { start: 7 * second, offset: 3_000_000, rate_ppm: 100 };
        assert_eq!(fast.apply(7 * second), 7 * second + 3_000_000);
        assert_eq!(fast.apply(17 * second), 17 * second + 3_000_000 + 1_000_000);
        let slow = ClockSkew { start: 7 * second, offset: 0, rate_ppm: -100 };
        assert_eq!(slow.apply(17 * second), 17 * second - 1_000_000);
        assert!(slow.apply(17 * second + 1) >= slow.apply(17 * second), "still monotonic");
    }

    #[tokio::test]
    async fn a_request_taken_and_never_answered_has_an_unknown_outcome_not_a_refusal() {
        // The engine loop took it and stopped: it may have been applied.
        let (reply, answer) = oneshot::channel::<ClientReply>();
        drop(reply);
        assert_eq!(Sent(Ok(answer), None).answer().await.unwrap_err(), KeelError::Timeout);
        // Refused at the door: certainly not applied.
        let refused = Sent(Err(KeelError::Unavailable("node stopping".into())), None);
        assert!(matches!(refused.answer().await, Err(KeelError::Unavailable(_))));
    }

    #[test]
    fn submit_labels_name_the_level_or_durability() {
        let get = Submit {
            client: ClientId(1),
            request: RequestId(1),
            command: Command::Get { key: b"k".to_vec().into() },
            durability: None,
            level: Some(ReadLevel::Linearizable),
            after: LogIndex::ZERO,
            mode: Default::default(),
            named: false,
        };
        assert_eq!(get.label(), OpLabel { op: "get", class: "linearizable" });
        let put = Submit {
            command: Command::Put { key: b"k".to_vec().into(), value: vec![].into() },
            level: None,
            ..get
        };
        assert_eq!(put.label(), OpLabel { op: "put", class: "default" });
    }
}
