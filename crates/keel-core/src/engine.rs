//! The interface every protocol engine implements, and the contract between an engine and
//! its drivers.
//!
//! An engine is a deterministic state machine. A driver (the tokio server, the simulator,
//! a test harness) calls [`Engine::step`] with the local time and one [`Input`], and gets
//! [`Outputs`]: disk work, messages, replies and the next wake-up. The ordering contract
//! written on [`Outputs`] is the same for every engine kind, so one effect executor
//! (`keel-exec`) carries it out for all of them.
//!
//! What differs between engine kinds is carried by the trait's associated types: the
//! configuration, the peer message, the client request and reply, and the status. Client
//! requests and replies convert from and to the front door's common [`ClientRequest`] and
//! [`ClientReply`], so a server parses a command once and hands it to any keyspace.
//!
//! The validation gate has two halves. [`Engine::check_message`] is stateless and may run
//! anywhere (the server runs it on the peer connection's task, before the engine loop);
//! the engine runs it again on every message and then checks the message against its own
//! state. A message that fails either half is dropped and reported in
//! [`Outputs::rejected`] with a reason: never a panic, never applied.

use crate::time::Time;
use keel_types::{
    ClientId, Command, CommandResult, Durability, Entry, HardState, KeelError, LogIndex, LogRecord,
    NodeId, ReadLevel, RequestId, SnapshotMeta,
};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

/// The engine kinds a keyspace may run. Named in `keel.toml` (`engine = "orca"`) and in
/// `/status`. What a server does for each kind is in its registry of engine packs
/// (`keel_server::engines`), indexed by the kind: nothing matches on it elsewhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// The leader engine: consistency-aware durability with cross-client monotonic reads
    /// (ORCA), on a replicated log.
    Orca,
    /// Release consistency on a leaderless in-memory store (Kite): relaxed accesses,
    /// releases, acquires and read-modify-writes.
    Kite,
    /// Causal transactions across data centers with uniformity, barriers and attach
    /// (UniStore's causal half).
    Geo,
}

impl EngineKind {
    /// Every kind this build knows, in the order `keel.toml` documents them.
    pub const ALL: [EngineKind; 3] = [EngineKind::Orca, EngineKind::Kite, EngineKind::Geo];

    /// Every kind's name, in [`EngineKind::ALL`]'s order (as `keel.toml` spells it).
    const NAMES: [&'static str; 3] = ["orca", "kite", "geo"];

    /// The name used in configuration and reports.
    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }
}

/// How a request synchronizes, for engines of release consistency (Kite): a plain access
/// is relaxed there; the others name the barrier or the strength asked. Engines without
/// these notions take only [`OpMode::Plain`] (the front door refuses the others before
/// they reach such an engine).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpMode {
    /// No barrier asked (a relaxed access in Kite; a compare-and-swap there is strong).
    #[default]
    Plain,
    /// A read with acquire semantics (`GET k ACQUIRE`).
    Acquire,
    /// A write with release semantics (`SET k v RELEASE`).
    Release,
    /// A compare-and-swap that may fail against the local copy (`KEEL.CAS ... WEAK`).
    Weak,
    /// A compare-and-swap that always compares at a quorum (`KEEL.CAS ... STRONG`).
    Strong,
}

impl OpMode {
    /// The option word that asks for it (`""` for [`OpMode::Plain`]).
    pub fn word(self) -> &'static str {
        match self {
            OpMode::Plain => "",
            OpMode::Acquire => "ACQUIRE",
            OpMode::Release => "RELEASE",
            OpMode::Weak => "WEAK",
            OpMode::Strong => "STRONG",
        }
    }
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for EngineKind {
    type Err = String;

    fn from_str(s: &str) -> Result<EngineKind, String> {
        EngineKind::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| {
            let names: Vec<&str> = EngineKind::ALL.iter().map(|k| k.name()).collect();
            format!("unknown engine kind '{s}' (expected one of: {})", names.join(", "))
        })
    }
}

/// A configuration field out of range. Not retryable: fix the configuration.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: {field}: {reason}")]
pub struct ConfigError {
    /// The field at fault.
    pub field: &'static str,
    /// Why, with the bound it breaks.
    pub reason: String,
}

/// Why an engine did not start. Neither is retryable: fix the configuration, or restore
/// the node's data (or let it catch up from its peers after clearing it).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BootError {
    /// A configuration field is out of range.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The persisted state breaks a rule the engine never breaks when it writes (an
    /// epoch out of range, entries out of order, a snapshot that does not decode): the
    /// data directory is damaged or was not written by this engine kind.
    #[error("refusing to start on the persisted state: {0}")]
    Persisted(String),
}

/// How a driver identifies a client request so it can route the reply back. Opaque to
/// the engine, which returns it unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RequestTag(pub u64);

/// A client operation as the front door hands it to a keyspace: what every engine kind's
/// request converts from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientRequest {
    /// Returned with the reply.
    pub tag: RequestTag,
    /// Identifies the client for write deduplication.
    pub client: ClientId,
    /// The client's sequence number; a retry of a write carries the same one.
    pub request: RequestId,
    /// The operation.
    pub command: Command,
    /// For writes: when to acknowledge. `None`: the keyspace default.
    pub durability: Option<Durability>,
    /// For reads: what the read guarantees. `None`: the keyspace default.
    pub level: Option<ReadLevel>,
    /// For reads: the client's session floor, the log index of the latest write it was
    /// answered for (`LogIndex::ZERO`: none). A follower answers the read itself only
    /// once it has applied that far, and forwards it to the leader before, so that a
    /// client reads its own writes wherever it reads.
    #[serde(default)]
    pub after: LogIndex,
    /// The synchronization asked (Kite keyspaces); [`OpMode::Plain`] elsewhere. Not carried
    /// between nodes: only engines that never forward take anything else.
    #[serde(default)]
    pub mode: OpMode,
    /// Whether the client chose `client` and `request` itself (`KEEL.REQ`) and may retry
    /// the request at another node: engines that number requests per node then name it by
    /// the client's pair instead. Not carried between nodes.
    #[serde(default)]
    pub named: bool,
}

/// The reply to one client request, as the front door turns it into bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientReply {
    /// The tag of the request answered.
    pub tag: RequestTag,
    /// Which node produced the result (the leader, when the request was forwarded).
    pub served_by: NodeId,
    /// The result, or a typed error saying whether to retry.
    pub result: Result<CommandResult, KeelError>,
    /// Whether serving this read required a durability round (for metrics).
    pub durability_round: bool,
}

/// An engine's request as built from the front door's [`ClientRequest`]: what the engine
/// kind gives no meaning to (an option of another kind's, a command it does not serve) is
/// refused with the error its client is told, and never reaches a step. The host answers
/// a refusal at once, under the request's tag.
pub trait FromClient: Sized {
    /// The engine's request, or why the engine kind refuses it.
    fn from_client(request: ClientRequest) -> Result<Self, KeelError>;
}

/// A reply as a replica's budgets see it: a client value this node holds only because
/// another node served the request (the reply to a forwarded request), from the moment
/// the reply leaves the engine until its client reads it.
pub trait HeldValue {
    /// That value, when `node` (this node) did not serve the reply; `None`: the reply
    /// holds nothing of another node's.
    fn forwarded_value(&mut self, node: NodeId) -> Option<&mut keel_types::Value>;
    /// Makes the reply a `BUSY` refusal saying `why`.
    fn refuse_busy(&mut self, why: &str);
}

impl HeldValue for ClientReply {
    fn forwarded_value(&mut self, node: NodeId) -> Option<&mut keel_types::Value> {
        if self.served_by == node {
            return None;
        }
        match &mut self.result {
            Ok(CommandResult::Value { value: Some(value), .. })
            | Ok(CommandResult::Cas { current: Some(value), .. }) => Some(value),
            _ => None,
        }
    }

    fn refuse_busy(&mut self, why: &str) {
        self.result = Err(KeelError::Busy(why.into()));
    }
}

/// Everything a node recovered from its disk at start-up: its hard state, its newest
/// snapshot and its log of records `L`, the engine's [`Engine::Record`] (the leader
/// engine's log entries; none for an engine that keeps no log).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PersistedState<L = Entry> {
    /// The epoch (a leader engine's term, a leaderless engine's incarnation), the vote if
    /// the engine elects, and the repair floor storage set if it cut a damaged log.
    pub hard_state: HardState,
    /// The newest valid snapshot, with its bytes as produced by the engine.
    pub snapshot: Option<(SnapshotMeta, Vec<u8>)>,
    /// The longest valid prefix of log records after the snapshot, in order.
    pub entries: Vec<L>,
}

impl<L> Default for PersistedState<L> {
    fn default() -> Self {
        PersistedState { hard_state: HardState::default(), snapshot: None, entries: Vec::new() }
    }
}

/// A snapshot's encoding, shared between the engine and its driver without a copy.
pub type SnapshotBytes = Arc<Vec<u8>>;

/// Something large the engine let go of (see [`Outputs::release`]); `L` is its log record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Release<L = Entry> {
    /// A snapshot encoding (the last reference, unless the driver still holds one).
    Snapshot(SnapshotBytes),
    /// Log records a snapshot now covers.
    Entries(VecDeque<L>),
}

/// A peer message the validation gate dropped: who sent it and why. Drivers count these
/// by reason and log them at a bounded rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// The sender.
    pub from: NodeId,
    /// The rule it broke (a short, fixed phrase: a metric label).
    pub reason: &'static str,
}

/// An event given to an engine. `M` is the engine's peer message, `Q` its client request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input<M, Q> {
    /// Time has passed; fire whatever timers are due. Drivers call this at least at
    /// [`Outputs::wake_at`].
    Tick,
    /// A peer message arrived.
    Message {
        /// The sender.
        from: NodeId,
        /// The message.
        message: M,
    },
    /// A client request arrived at this node.
    Client(Q),
    /// Several client requests that arrived together, handled in order in one step: as
    /// if each came in its own [`Input::Client`], but the end-of-step work (replication,
    /// answering what became answerable, timers) runs once for all of them.
    Clients(Vec<Q>),
    /// Every entry up to `index` that was handed out in [`Outputs::append`] is now on
    /// disk (fsync returned). Reported only after fsync returns. `index` describes the
    /// log as it is when the input is delivered: if the log was truncated after the fsync
    /// began, the driver reports at most what is really on disk (the highest index of the
    /// contiguous synced prefix), never an entry written later.
    LogSynced {
        /// The highest index now durable on this node.
        index: LogIndex,
    },
    /// The snapshot handed out in [`Outputs::snapshot`] is durable.
    SnapshotSaved {
        /// Which snapshot.
        meta: SnapshotMeta,
    },
}

/// What an engine asks its driver to do, in the order the driver must do it. `M` is the
/// engine's peer message, `R` its client reply, `L` its log record ([`Engine::Record`]).
/// The log fields (2 to 4) are every engine's: an engine that keeps no log leaves them
/// empty.
///
/// 1. `hard_state`: make durable **before** sending any message in `messages` (of this
///    step or any later one). Replies wait with the messages.
/// 2. `truncate_after`, then `append`: apply to the log (buffered is enough) before
///    sending `messages`; entries are never reported as persisted before step 3.
/// 3. `sync_through`: fsync the log through at least that index, then deliver
///    [`Input::LogSynced`]. Drivers may coalesce syncs (group commit), and must clamp the
///    index they report below any truncation that followed the fsync's last write.
/// 4. `snapshot`: write and fsync, then deliver [`Input::SnapshotSaved`]; afterwards the
///    log up to `meta.last_index` may be compacted. A snapshot installed from a leader
///    (`snapshot_installed`) may lie past the log's end or disagree with it: the driver
///    then drops the whole log (this step's `truncate_after` has already removed what was
///    not durable), and later appends continue at `meta.last_index + 1`, so it must be
///    saved before them. A snapshot the engine took lies inside the durable log: the
///    driver may write it while later log operations go on, and put it in place whenever
///    it is written; if an installed one overtook it meanwhile, it is dropped unsaved.
/// 5. `messages`: send (best effort; the network may lose them).
/// 6. `replies`: return to clients.
/// 7. `release`: free, anywhere (it may take a while).
/// 8. `rejected`: count and log.
/// 9. `events`: deliver to the node's subscribers, at once (best effort).
/// 10. Call [`Input::Tick`] no later than `wake_at`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outputs<M, R, L = Entry> {
    /// Hard state to make durable before any message is sent.
    pub hard_state: Option<HardState>,
    /// Remove every log entry after this index (conflicting suffix).
    pub truncate_after: Option<LogIndex>,
    /// Records to append to the log, in index order, contiguous with what is there.
    pub append: Vec<L>,
    /// Fsync the log through this index, then report [`Input::LogSynced`].
    pub sync_through: Option<LogIndex>,
    /// A snapshot to persist, with the engine's encoding of the state (shared with the
    /// engine, which keeps it to send to followers).
    pub snapshot: Option<(SnapshotMeta, SnapshotBytes)>,
    /// Whether `snapshot` was installed from the leader (saved before any later append).
    pub snapshot_installed: bool,
    /// Memory the engine no longer holds: snapshot encodings and compacted log entries.
    /// Freeing it can take as long as the state is large, which a driver may do off its
    /// loop (or simply drop it).
    pub release: Vec<Release<L>>,
    /// Messages to peers.
    pub messages: Vec<(NodeId, M)>,
    /// Replies to clients of this node.
    pub replies: Vec<R>,
    /// Peer messages the validation gate dropped.
    pub rejected: Vec<Rejection>,
    /// What this step's applied writes did to keys, for keyspace notifications (empty
    /// unless [`Engine::record_events`] turned them on).
    pub events: Vec<KeyEvent>,
    /// When the engine next needs an [`Input::Tick`].
    pub wake_at: Option<Time>,
}

/// One keyspace event: what an applied write did to one key, named as Redis names it
/// (`set`, `lpush`, `del`, `expired`, ...), for Redis's keyspace notifications. Events
/// report what this replica applied: an entry applied and later rolled back by a leader
/// change (a `memory` write the new leader never had) has had its events all the same.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyEvent {
    /// The class `notify-keyspace-events` selects it by.
    pub class: EventClass,
    /// The event's name.
    pub event: &'static str,
    /// The key as the state machine holds it (a database's prefix included).
    pub key: keel_types::Key,
}

/// The classes of [`KeyEvent`], as `notify-keyspace-events` names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventClass {
    /// `g`: commands of any type (`del`, `expire`, `rename_from`, ...).
    Generic,
    /// `$`: strings.
    String,
    /// `l`: lists.
    List,
    /// `s`: sets.
    Set,
    /// `h`: hashes.
    Hash,
    /// `z`: sorted sets.
    ZSet,
    /// `x`: a key removed by its expiry.
    Expired,
    /// `n`: a key created.
    New,
}

/// The outputs of engine `E`'s steps.
pub type OutputsOf<E> =
    Outputs<<E as Engine>::Message, <E as Engine>::Reply, <E as Engine>::Record>;

impl<M, R, L> Default for Outputs<M, R, L> {
    fn default() -> Self {
        Outputs {
            hard_state: None,
            truncate_after: None,
            append: Vec::new(),
            sync_through: None,
            snapshot: None,
            snapshot_installed: false,
            release: Vec::new(),
            messages: Vec::new(),
            replies: Vec::new(),
            rejected: Vec::new(),
            events: Vec::new(),
            wake_at: None,
        }
    }
}

impl<M, R, L> Outputs<M, R, L> {
    /// Whether nothing was asked for but (perhaps) a wake-up: the state an engine's
    /// output buffer must be in between two steps.
    pub fn is_empty(&self) -> bool {
        self.hard_state.is_none()
            && self.truncate_after.is_none()
            && self.append.is_empty()
            && self.sync_through.is_none()
            && self.snapshot.is_none()
            && !self.snapshot_installed
            && self.release.is_empty()
            && self.messages.is_empty()
            && self.replies.is_empty()
            && self.rejected.is_empty()
            && self.events.is_empty()
    }
}

/// What a driver shows of an engine's role without building its whole status: cheap
/// enough to read after every step (the server logs role changes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoleView {
    /// The role's name: `leader`, `follower`, `candidate` (leaderless engines: `replica`).
    pub role: &'static str,
    /// The leader this node believes in, if the engine has leaders.
    pub leader: Option<NodeId>,
    /// The engine's epoch (term); 0 for engines without one.
    pub epoch: u64,
}

/// Whether a metric only goes up or may go both ways.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricKind {
    /// Only increases within one incarnation.
    Counter,
    /// Any value.
    Gauge,
}

/// One engine metric, for `/metrics` (the server adds the keyspace label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Metric {
    /// The Prometheus name (`keel_...`).
    pub name: &'static str,
    /// One line saying what it counts.
    pub help: &'static str,
    /// Counter or gauge.
    pub kind: MetricKind,
    /// One extra label, if the metric has one (`role="leader"`).
    pub label: Option<(&'static str, &'static str)>,
    /// The value.
    pub value: u64,
}

impl Metric {
    /// A counter without a label.
    pub const fn counter(name: &'static str, help: &'static str, value: u64) -> Metric {
        Metric { name, help, kind: MetricKind::Counter, label: None, value }
    }

    /// A gauge without a label.
    pub const fn gauge(name: &'static str, help: &'static str, value: u64) -> Metric {
        Metric { name, help, kind: MetricKind::Gauge, label: None, value }
    }
}

/// An engine's externally visible state, as `/status`, `KEEL.STATUS` and `/metrics`
/// show it.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// The status document (a JSON object; the server adds the keyspace's id and name).
    pub status: serde_json::Value,
    /// Gauges and counters.
    pub metrics: Vec<Metric>,
}

/// A deterministic protocol engine: one instance per keyspace per node.
///
/// Driving loop (the server, the simulator and the core tests all do this, through the
/// effect executor):
///
/// ```
/// use keel_core::engine::{Engine, Input};
/// use keel_core::leader::{Config, LeaderEngine};
/// use keel_core::time::Time;
/// use keel_types::NodeId;
///
/// let members = vec![NodeId(1), NodeId(2), NodeId(3)];
/// let config = Config::new(NodeId(1), members);
/// let mut engine = LeaderEngine::boot(config, Default::default(), 42, Time(0)).unwrap();
/// let out = engine.step(Time(1_000_000_000), Input::Tick);
/// // 1. persist out.hard_state; 2. truncate/append the log; 3. fsync through
/// // out.sync_through and later feed Input::LogSynced; 4. save out.snapshot;
/// // 5. send out.messages; 6. return out.replies; 7. tick again by out.wake_at.
/// assert!(out.hard_state.is_none(), "the election timer fired: a pre-vote changes no state");
/// assert_eq!(out.messages.len(), 2, "pre-vote requests to both peers");
/// ```
pub trait Engine: Sized + Send + 'static {
    /// Its configuration (this node, the members, timers, limits, defaults).
    type Config: Clone + fmt::Debug + Send + Sync + 'static;
    /// What its nodes send each other.
    type Message: Clone + fmt::Debug + PartialEq + Send + 'static;
    /// What its clients ask.
    type Request: Clone + fmt::Debug + Send + 'static + FromClient;
    /// What its clients are told.
    type Reply: Clone + fmt::Debug + Send + 'static + Into<ClientReply> + HeldValue;
    /// Its externally visible state, typed (for tests and the simulator's checks).
    type Status: Clone + fmt::Debug + Send + 'static;
    /// What its log holds on disk (the leader engine: its log entries); an engine that
    /// keeps no log names `keel_types::NoRecord`. Storage is generic over it.
    type Record: LogRecord;

    /// Starts a node from what its disk recovered, at local time `now`; `seed` feeds all
    /// of its randomness. Fails on an invalid configuration, or on persisted state the
    /// engine cannot have written.
    fn boot(
        config: Self::Config,
        persisted: PersistedState<Self::Record>,
        seed: u64,
        now: Time,
    ) -> Result<Self, BootError>;

    /// Handles one input at local time `now` and says what the driver must do, in the
    /// order written on [`Outputs`].
    fn step(
        &mut self,
        now: Time,
        input: Input<Self::Message, Self::Request>,
    ) -> Outputs<Self::Message, Self::Reply, Self::Record>;

    /// Panics if the engine's state breaks an invariant its code relies on. Every engine
    /// runs it at the end of each of its steps in the simulator (the leader and geo
    /// engines always; Kite when its configuration says so, as the simulator's does), so
    /// the simulator checks it after every input it delivers (a panic fails the seed).
    fn check_invariants(&self);

    /// The stateless half of the validation gate: whether `message` is well formed for
    /// this engine kind whatever the receiver's state (epochs and indexes in range,
    /// entries contiguous, no read in a log entry, lengths consistent). `Err` names the
    /// rule broken.
    fn check_message(message: &Self::Message) -> Result<(), &'static str>;

    /// This node.
    fn node_id(&self) -> NodeId;

    /// The engine's typed status.
    fn status(&self) -> Self::Status;

    /// The role, leader and epoch, cheaply.
    fn role(&self) -> RoleView;

    /// The status document and metrics.
    fn report(&self) -> Report;

    /// The reply `request` would get at once, alone in a step at local time `now`, if it is
    /// a read the engine answers without waiting (`None` otherwise: the driver steps it).
    /// Changes nothing; drivers call it between steps, off the engine loop, with `now` no
    /// earlier than the last step's. Engines without such reads return `None`.
    fn read_now(&self, request: &Self::Request, now: Time) -> Option<Self::Reply> {
        let _ = (request, now);
        None
    }

    /// Turns the recording of [`KeyEvent`]s into [`Outputs::events`] on or off (off at
    /// boot). Recording changes nothing else: replies, messages and state are the same
    /// either way. Engines whose state has no Redis keys record nothing.
    fn record_events(&mut self, on: bool) {
        let _ = on;
    }

    /// The hash slot states its applied state holds (`keel_types::slots`), with the
    /// generation they are at, when that is not `since` (`None`: unchanged, or an engine
    /// that moves no slots). Drivers ask after every step and publish what changed.
    fn slot_states(&self, since: u64) -> Option<(u64, Vec<(u16, keel_types::slots::SlotState)>)> {
        let _ = since;
        None
    }

    /// Up to `count` log records from `from` (none below the snapshot), and the index the
    /// newest snapshot covers; engines without a log return none.
    fn log_page(&self, from: LogIndex, count: usize) -> (Vec<Self::Record>, LogIndex) {
        let _ = (from, count);
        (Vec::new(), LogIndex::ZERO)
    }
}

/// The error for a client's request number used again with another command: every engine
/// that deduplicates requests by their client's numbers refuses it with these words.
pub fn reused_request(client: ClientId, request: keel_types::RequestId) -> KeelError {
    KeelError::InvalidArgument(format!(
        "request {} of client {} was already used for another command",
        request.0, client.0
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_kinds_parse_by_name_and_refuse_others() {
        for kind in EngineKind::ALL {
            assert_eq!(kind.name().parse::<EngineKind>(), Ok(kind));
        }
        let err = "raft".parse::<EngineKind>().unwrap_err();
        assert!(err.contains("orca"), "{err}");
    }

    #[test]
    fn default_outputs_are_empty_and_any_request_makes_them_not() {
        let mut out: Outputs<(), ()> = Outputs::default();
        assert!(out.is_empty());
        out.wake_at = Some(Time(5));
        assert!(out.is_empty(), "a wake-up alone asks for nothing");
        out.rejected.push(Rejection { from: NodeId(2), reason: "epoch out of range" });
        assert!(!out.is_empty());
    }
}
