//! The simulated cluster: one thread, virtual time in nanoseconds, an event queue keyed
//! by `(time, sequence)`, nodes that each own a clock and, per keyspace, a replica (an
//! engine, the effect executor's front, and a disk the executor's worker runs on in
//! virtual time), and a network between nodes that carries every keyspace's messages.
//!
//! Outputs are carried out by `keel_exec`, the code the server runs: hard state durable
//! before messages (held behind a barrier), log writes in order with group commit,
//! fsync reports clamped below later truncations, snapshots taken by a node written off
//! the log's queue and adopted, installed ones saved in order. The world adds the
//! checks only a simulator can make: every message's epoch, vote and persisted claim is
//! on disk when it leaves, every reply answers a pending request, and the invariant
//! [`Checker`] of each keyspace sees every log write and every step's status.
//!
//! Layout of one event's handling: pop the earliest event, advance virtual time, defer
//! it if its node is paused, step the replica's engine with the matching input, hand the
//! outputs to the front, submit its operations to the disk, send what may leave, then
//! observe the engine's status.

use crate::clock::NodeClock;
use crate::disk::{HardStateMode, SimDisk};
use crate::engine::{SimEngine, Watch};
use crate::invariants::Violation;
use crate::net::{NetConfig, Network};
use crate::rng::Rng;
use keel_core::engine::{ClientReply, RequestTag};
use keel_core::engine::{Input, PersistedState};
use keel_core::leader::Config;
use keel_core::time::Time;
use keel_exec::{
    AppendHold, ByteBudget, Completion, Front, LinkAllowance, LinkHold, Replica, VirtualDisk,
};
use keel_storage::SimFault;
use keel_types::{LogIndex, LogRecord, NodeId, SnapshotMeta, Version};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Most messages a replica holds behind an unsynced hard state.
pub const HELD_MESSAGES_MAX: usize = 4096;
/// Most keyspaces one simulated cluster hosts.
pub const KEYSPACES_MAX: u32 = 8;
/// Most nodes of a simulated cluster whose keyspaces are placed on replica groups.
pub const NODES_PLACED_MAX: u32 = 24;

/// A keyspace's index in the world (its id in a server's configuration).
pub type Keyspace = u32;

/// How a simulated cluster is built. Every random choice still comes from the seed.
#[derive(Clone, Debug)]
pub struct WorldConfig<C = Config> {
    /// The engine configuration; `node_id` and `members` are filled in per node.
    pub engine: C,
    /// Cluster size.
    pub nodes: u32,
    /// Keyspaces, each an engine instance with its own disk on every node.
    pub keyspaces: u32,
    /// The network between nodes.
    pub net: NetConfig,
    /// One-way latency between a client and any node.
    pub client_latency_ns: u64,
    /// Shortest fsync latency of a disk.
    pub fsync_ns_min: u64,
    /// Longest fsync latency of a disk (exclusive).
    pub fsync_ns_max: u64,
    /// Clock offsets are drawn from `[0, clock_offset_ns_max)`.
    pub clock_offset_ns_max: u64,
    /// Whether the hard state is fsynced (the contract) or only buffered (a bug).
    pub hard_state_mode: HardStateMode,
    /// Whether a crash may leave a prefix of the unsynced log on disk.
    pub torn_tail: bool,
    /// Most events queued at once.
    pub events_max: usize,
    /// Targeted fault for negative controls: probability (ppm) that a node crashes right
    /// after granting a vote, restarting 1–50 ms later. Zero in normal runs.
    pub crash_after_vote_ppm: u32,
    /// Targeted fault: probability (ppm) that a forwarded session open is delivered
    /// again 300 ms to 1.5 s later (a copy held in the network), after its session may
    /// have been used and forgotten: what `Kv::open_is_stale` refuses. Drawn from the
    /// sending node's generator only when on.
    pub late_open_copy_ppm: u32,
    /// Negative control: the executor reports fsyncs without clamping them below the
    /// truncations that followed (`Front::unsafe_skip_truncation_clamp`).
    pub unsafe_skip_truncation_clamp: bool,
    /// Whether each keyspace prefers another leader, as a server's keyspaces do.
    pub spread_leaders: bool,
    /// Share (ppm) of client requests a node first offers to its engine's
    /// [`Engine::read_now`](keel_core::engine::Engine::read_now) between steps, as a
    /// server's connections do with reads off the loop (not while the executor holds
    /// replies behind a hard state); the rest, and those it declines, are stepped.
    pub reads_off_loop_ppm: u32,
    /// Of the crashes, the share (parts per million) that are process crashes: the kernel
    /// keeps every write, synced or not, where the rest are power losses.
    pub process_crash_ppm: u32,
    /// Of the power losses, the share (ppm) that also reboot the host: its clock starts
    /// over from a new reading (lower or higher) and a new rate within the bound.
    pub clock_reboot_ppm: u32,
    /// The chance (ppm), at each crash, that a running node's clock changes to another
    /// rate within the bound, faster or slower (drift that changes during a run).
    pub drift_change_ppm: u32,
    /// Seeds the generator behind the three faults above, apart from every other draw.
    pub fault_seed: u64,
    /// The bytes of client values each link queues at most before the replica sheds
    /// them ([`keel_exec::LinkAllowance`]; a server's is
    /// [`keel_exec::LINK_BULK_BYTES_MAX`]): held from send until delivery or loss.
    pub link_bulk_bytes_max: usize,
    /// Negative control: links count the client values they hold but refuse none
    /// ([`LinkAllowance::unsafe_unbounded`]); the world's check of what a link holds
    /// catches it wherever two values meet on a link past its allowance.
    pub unsafe_unbounded_links: bool,
    /// The bytes of forwarded replies' values a node holds until its clients read them
    /// (a server's `forwarded_replies_bytes_max`, by default
    /// [`keel_exec::FORWARDED_REPLIES_BYTES_MAX`]): held from the reply until its client
    /// takes it.
    pub forwarded_replies_bytes_max: usize,
    /// Each node's wall clock (the unix time its engine reads, for expiry) is off true
    /// time by a fixed skew drawn from `[-wall_skew_ms_max, wall_skew_ms_max]`, and runs
    /// at its local clock's rate (drift); a reboot of the local clock keeps the wall
    /// clock's reading.
    pub wall_skew_ms_max: u64,
    /// The configured voters: nodes `1..=voters` (0: every node). The others start as
    /// nodes joining the cluster, outside its membership until an operator (the
    /// `membership` scenario's reconfigurer) adds them.
    pub voters: u32,
    /// Placement: each keyspace on a replica group of this many nodes (keyspace `k` on
    /// the nodes from `k × replicas mod nodes + 1` on, wrapping, as `keel up` places
    /// them); 0: every keyspace on every node.
    pub replicas: u32,
}

/// Bit rot of fsynced log records on a crashing node (see `docs/simulation.md`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Corruption {
    /// No corruption (the default: every fsynced byte survives).
    #[default]
    Off,
    /// At most once per run, corrupt the tail of a crashing node's fsynced log, and only
    /// when a majority of the other nodes durably hold those entries (so no copy a
    /// quorum relies on is lost). The protocol must tolerate this.
    Guarded,
    /// At most once per run, corrupt the tail of a crashing node's fsynced log whatever
    /// the others hold. Outside the fault model: it may lose acknowledged writes.
    Unguarded,
    /// Every crash damages the crashing node's hard-state file (its log is kept), and a
    /// fifth of the voters crash right after voting: every vote is lost, and only the
    /// repair ([`keel_storage::Wal::rebuild_hard_state`]) stands between the node and a
    /// second vote in one epoch.
    HardStates,
}

/// What one injected corruption damaged (`docs/simulation.md`, "Storage damage").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Damage {
    /// A byte of a log record's header or payload (recovery cuts the log there).
    Record,
    /// A byte of the seal after a synced batch (costs nothing when the record after it is
    /// intact; a damaged marker reads as a bad record).
    Seal,
    /// A byte of the newest snapshot file (set aside with the whole log).
    Snapshot,
    /// A byte of the hard-state file: the node cannot start until the operator's repair
    /// ([`keel_storage::Wal::rebuild_hard_state`]), which the world runs at recovery.
    HardState,
}

impl Damage {
    /// The name `--coverage` counts it under.
    pub fn name(self) -> &'static str {
        match self {
            Damage::Record => "damage:record",
            Damage::Seal => "damage:seal",
            Damage::Snapshot => "damage:snapshot",
            Damage::HardState => "damage:hard-state",
        }
    }
}

/// Chance (ppm) that a crash corrupts fsynced records, while corruption is armed.
pub const CORRUPT_PER_CRASH_PPM: u32 = 250_000;
/// Most fsynced entries at the log's tail one corruption may cost.
pub const CORRUPT_DEPTH_MAX: u64 = 8;

/// What a scripted message rule ([`World::set_message_rule`]) does with one message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// The network's ordinary treatment.
    Pass,
    /// Lost before it reaches the network (counted in [`WorldStats::scripted_drops`]).
    Drop,
    /// Held back this many ns more than the network would.
    Delay(u64),
}

/// A scripted rule on every message as it is sent: `(from, to, message) -> fate`.
pub type MessageRule<M> = Box<dyn FnMut(NodeId, NodeId, &M) -> Fate>;

/// Something the world reports to whoever drives it (clients, scenarios).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice<R = ClientReply> {
    /// A reply reached the client that sent the request to `node`.
    Reply {
        /// The node the client had contacted.
        node: NodeId,
        /// The keyspace the request was for.
        keyspace: Keyspace,
        /// The reply.
        reply: R,
    },
    /// A timer set with [`World::set_timer`] fired.
    Timer {
        /// The timer's id.
        id: u64,
    },
}

#[derive(Clone, Debug)]
enum Event<M, Q, R> {
    Deliver {
        from: NodeId,
        to: NodeId,
        ks: Keyspace,
        message: M,
        /// The sender's incarnation when it sent the message.
        incarnation: u64,
        arrived: bool,
        /// The message's hold on its link's allowance, given back once every copy is
        /// delivered or lost.
        hold: Option<Arc<LinkHold>>,
    },
    Tick {
        node: NodeId,
        ks: Keyspace,
        incarnation: u64,
    },
    Disk {
        node: NodeId,
        ks: Keyspace,
        incarnation: u64,
    },
    Prepared {
        node: NodeId,
        ks: Keyspace,
        incarnation: u64,
        meta: SnapshotMeta,
        data: Arc<Vec<u8>>,
    },
    Request {
        node: NodeId,
        ks: Keyspace,
        request: Q,
    },
    Reply {
        node: NodeId,
        ks: Keyspace,
        reply: R,
    },
    Timer {
        id: u64,
    },
    Crash {
        node: NodeId,
        restart_at_ns: u64,
    },
    Restart {
        node: NodeId,
    },
    /// Arms an I/O error for the next write (or fsync) of a node's storage.
    StorageFault {
        node: NodeId,
        ks: Keyspace,
        sync: bool,
    },
}

/// The events of a world of engine `E`.
type EventOf<E> = Event<
    <E as keel_core::engine::Engine>::Message,
    <E as keel_core::engine::Engine>::Request,
    <E as keel_core::engine::Engine>::Reply,
>;

impl<M, Q, R> Event<M, Q, R> {
    /// The node whose pause defers this event, if any.
    fn node(&self) -> Option<NodeId> {
        match self {
            Event::Deliver { to, .. } => Some(*to),
            Event::Tick { node, .. }
            | Event::Disk { node, .. }
            | Event::Prepared { node, .. }
            | Event::Request { node, .. } => Some(*node),
            Event::Reply { .. }
            | Event::Timer { .. }
            | Event::Crash { .. }
            | Event::Restart { .. }
            | Event::StorageFault { .. } => None,
        }
    }
}

/// A node's allowance for one of its links, as `config` has it.
fn fresh_link<C>(config: &WorldConfig<C>) -> LinkAllowance {
    let link = LinkAllowance::new(config.link_bulk_bytes_max);
    if config.unsafe_unbounded_links {
        link.unsafe_unbounded()
    } else {
        link
    }
}

/// A replica's append hold, as a server's engine loop has it.
fn fresh_hold<L>() -> AppendHold<L> {
    AppendHold::new(keel_exec::APPEND_HOLD_NS, keel_exec::APPEND_HOLD_ENTRIES_MAX)
}

/// One keyspace's replica on one node: the loop body the server runs
/// (`keel_exec::Replica`: the engine, the front, the append hold, whose held appends a
/// crash loses with the process's memory) while the node is up, and its disk.
struct Hosted<E: SimEngine> {
    replica: Option<Replica<E>>,
    disk: VirtualDisk<SimDisk<E::Record>>,
    recovered: PersistedState<E::Record>,
    tick_at_ns: Option<u64>,
    disk_at_ns: Option<u64>,
    pending_tags: BTreeSet<RequestTag>,
}

impl<E: SimEngine> Hosted<E> {
    /// Hands the operations the replica has ready to the disk.
    fn submit(&mut self, now: u64, cost: u64) -> keel_storage::StorageResult<()> {
        let Some(replica) = self.replica.as_mut() else { return Ok(()) };
        if !replica.has_ready() {
            return Ok(());
        }
        let mut ready = Vec::new();
        replica.take_ready(&mut ready);
        self.disk.submit(ready, now, cost)
    }
}

/// What leaves a replica during one call, in order, for the world to carry out after it.
enum Left<E: SimEngine> {
    /// A message, with its hold on the link's allowance if it carries client values.
    Send(NodeId, E::Message, Option<LinkHold>),
    Reply(E::Reply),
    Prepare(SnapshotMeta, Arc<Vec<u8>>),
    /// What the engine showed after a step, for its keyspace's watch.
    Observed(<E::Watch as Watch<E>>::Seen),
}

/// The simulator's side of a replica's outputs ([`keel_exec::Io`]): the checks only a
/// simulator can make, as the engine writes its outputs (every log write to the
/// keyspace's checker; no message rejected; what a message claims is on disk; the
/// entries it carries in the sender's log), and what leaves, in order.
struct SimIo<'a, E: SimEngine> {
    node: NodeId,
    ks: Keyspace,
    now_ns: u64,
    watch: &'a mut E::Watch,
    /// The sender's fsynced index (the disk does not move during a call).
    synced: LogIndex,
    left: Vec<Left<E>>,
    violations: Vec<(&'static str, String)>,
    trace: bool,
    /// The sender's links to its peers.
    links: &'a BTreeMap<NodeId, LinkAllowance>,
    /// The keyspace events of the step, checked against the engine after it.
    events: Vec<keel_core::engine::KeyEvent>,
}

impl<E: SimEngine> keel_exec::Io<E> for SimIo<'_, E> {
    fn send(&mut self, to: NodeId, message: E::Message) {
        self.left.push(Left::Send(to, message, None));
    }

    fn send_bulk(
        &mut self,
        to: NodeId,
        message: E::Message,
        bulk: usize,
    ) -> Result<(), E::Message> {
        let link = self.links.get(&to).unwrap_or_else(|| panic!("message to non-member {to}"));
        let before = link.held();
        let Some(hold) = link.hold(bulk) else { return Err(message) };
        if before > 0 && before + bulk > link.max() {
            // Past the allowance with another value already on the way: the memory a
            // slow peer can make this node hold is no longer bounded.
            let detail = format!(
                "{} -> {to}: {bulk} bytes queued beside {before}, past the link's {}",
                self.node,
                link.max()
            );
            self.violations.push(("link-over-allowance", detail));
        }
        self.left.push(Left::Send(to, message, Some(hold)));
        Ok(())
    }

    fn reply(&mut self, reply: E::Reply) {
        self.left.push(Left::Reply(reply));
    }

    fn prepare(&mut self, meta: SnapshotMeta, data: keel_core::engine::SnapshotBytes) {
        self.left.push(Left::Prepare(meta, data));
    }

    fn stepped(&mut self, out: &keel_core::engine::OutputsOf<E>) {
        let (node, ks) = (self.node, self.ks);
        if self.trace {
            eprintln!("{:>12} {node}/{ks} -> {out:?}", "");
        }
        self.watch.stepped(node, out, self.now_ns);
        for rejection in &out.rejected {
            // Every message here was written by an engine: a rejection is a gate that
            // refuses valid traffic, or an engine that breaks its own rules.
            let detail = format!(
                "{node}/{ks} rejected a message from {}: {}",
                rejection.from, rejection.reason
            );
            self.violations.push(("gate-rejection", detail));
        }
        for (_, message) in &out.messages {
            self.check_written(message);
        }
    }

    fn events(&mut self, events: Vec<keel_core::engine::KeyEvent>) {
        self.events.extend(events);
    }

    fn observe(&mut self, engine: &E) {
        if !self.events.is_empty() {
            if let Err(detail) = E::check_events(engine, &std::mem::take(&mut self.events)) {
                let detail = format!("{}/{}: {detail}", self.node, self.ks);
                self.violations.push(("keyspace-events", detail));
            }
        }
        self.left.push(Left::Observed(E::Watch::see(engine)));
    }
}

impl<E: SimEngine> SimIo<'_, E> {
    /// The contract's checks on a message as its engine writes it: what it claims is on
    /// disk is (its persisted index is fsynced) and the entries it carries are in the
    /// sender's log. Checked when written, not when sent: a message held behind a hard
    /// state may leave after a later truncation, as a delayed one may arrive after it.
    fn check_written(&mut self, message: &E::Message) {
        let (from, synced) = (self.node, self.synced);
        let facts = E::facts(message);
        if let Some(persisted) = facts.claims_persisted.filter(|p| *p > synced) {
            let detail = format!("{from} claims persisted {persisted} > fsynced {synced}");
            self.violations.push(("contract-message", format!("keyspace {}: {detail}", self.ks)));
        }
        let watch = &*self.watch;
        let held = |v: Version| watch.epoch_at(from, v.index) == Some(v.epoch);
        if let Some(v) = facts.entries.iter().map(LogRecord::version).find(|v| !held(*v)) {
            let detail = format!("{from} sends entry {v} not in its log");
            self.violations.push(("contract-message", format!("keyspace {}: {detail}", self.ks)));
        }
    }
}

struct Node<E: SimEngine> {
    /// Per keyspace; a keyspace the node does not host never runs a replica here.
    replicas: Vec<Hosted<E>>,
    /// Whether its process runs (between a restart and a crash).
    up: bool,
    /// Its links' allowances, shared by its keyspaces, as a server's peer queues are.
    links: BTreeMap<NodeId, LinkAllowance>,
    /// What its forwarded replies hold, shared by its keyspaces.
    forwarded_replies: Arc<ByteBudget>,
    clock: NodeClock,
    incarnation: u64,
    paused_until_ns: u64,
    fsync_ns: u64,
    disk_slow_factor: u64,
    disk_slow_until_ns: u64,
    rng: Rng,
}

/// Counters for the run report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorldStats {
    /// Bytes of peer messages encoded (each message once, however many copies the
    /// network delivers).
    pub message_bytes: u64,
    /// Events processed.
    pub events: u64,
    /// Engine steps.
    pub steps: u64,
    /// Crashes injected.
    pub crashes: u64,
    /// Nodes replaced with wiped disks.
    pub wipes: u64,
    /// Events deferred by a pause.
    pub deferred: u64,
    /// Snapshots taken and adopted through the executor's off-worker path.
    pub snapshots_prepared: u64,
    /// Steps that took several client requests at once ([`Input::Clients`]): requests
    /// that reach a node at the same instant, one after another, as a driver batches
    /// what waits in its input queue.
    pub client_batches: u64,
    /// Reads answered off the loop ([`WorldConfig::reads_off_loop_ppm`]).
    pub reads_off_loop: u64,
    /// Crashes that kept every write ([`WorldConfig::process_crash_ppm`]).
    pub process_crashes: u64,
    /// Power losses that rebooted the host's clock ([`WorldConfig::clock_reboot_ppm`]).
    pub clock_reboots: u64,
    /// Clocks whose rate changed during the run ([`WorldConfig::drift_change_ppm`]).
    pub drift_changes: u64,
    /// Of `drift_changes`, those that sped a clock up.
    pub drift_faster: u64,
    /// Of `drift_changes`, those that slowed a clock down.
    pub drift_slower: u64,
    /// Nodes stopped by a storage write or fsync error ([`World::add_storage_faults`]).
    pub storage_errors: u64,
    /// Crashes between an fsync completing and the engine learning of it
    /// ([`World::add_storage_faults`]).
    pub crashes_after_fsync: u64,
    /// Hard-state files damaged under [`Corruption::HardStates`].
    pub hard_states_damaged: u64,
    /// Messages a scripted rule dropped ([`World::set_message_rule`]).
    pub scripted_drops: u64,
    /// Crashes that lost appends still held on the loop, never handed to the disk
    /// (`keel_exec::AppendHold`).
    pub held_appends_lost: u64,
    /// Fsync reports a later one of the same batch covered (`keel_exec::Replica::complete`).
    pub syncs_coalesced: u64,
    /// Messages carrying client values shed for want of room on their link.
    pub bulk_shed: u64,
    /// Forwarded replies answered `BUSY` for want of room in the node's budget.
    pub forwarded_replies_busy: u64,
    /// Calls into a replica after which its messages and replies waited for a hard state.
    pub held_behind_hard_state: u64,
    /// Candidates that crashed as their vote requests left ([`World::arm_vote_request_crash`]).
    pub vote_request_crashes: u64,
    /// Client requests lost while clients were cut off ([`World::cut_clients_until`]).
    pub client_requests_cut: u64,
    /// Late copies of forwarded session opens sent (`WorldConfig::late_open_copy_ppm`).
    pub late_open_copies: u64,
    /// Messages sent on a held link ([`World::hold`]), delivered once it is let go.
    pub held_messages: u64,
    /// Hard states saved (every incarnation's, every vote's).
    pub hard_states_saved: u64,
    /// Boots from a disk that had saved a hard state (restarts that kept their disk).
    pub boots_from_disk: u64,
    /// Messages delivered after their sender restarted: sent by an earlier incarnation.
    pub late_deliveries: u64,
    /// Of those, answers to a request of the receiver ([`SimEngine::answers`]).
    pub late_replies: u64,
}

/// A node's processor, for throughput in virtual time: each call into a replica occupies
/// the node for `step_ns` per step (per request, for requests taken together in one step)
/// plus `message_ns` per message it sends, and what it sends and answers leaves when
/// that time is over; inputs that arrive meanwhile wait, in arrival order
/// ([`World::cpu`]; `None`, the default: steps take no time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuCost {
    /// Each step (a message handled, a request taken, a timer).
    pub step_ns: u64,
    /// Each message sent.
    pub message_ns: u64,
}

/// A message sent on a held link: its keyspace, the sender's incarnation then, the
/// message, its share of the link's allowance.
type Held<M> = (Keyspace, u64, M, Option<Arc<LinkHold>>);

/// A clock rate uniform in `[-drift_max, drift_max]` ppm.
fn draw_drift(rng: &mut Rng, drift_max: i64) -> i64 {
    rng.range(0, 2 * drift_max as u64 + 1) as i64 - drift_max
}

/// The simulated cluster.
pub struct World<E: SimEngine> {
    config: WorldConfig<E::Config>,
    now_ns: u64,
    seq: u64,
    /// Seeds each node's wall-clock skew ([`World::wall_ms`]).
    seed_for_walls: u64,
    events: BTreeMap<(u64, u64), EventOf<E>>,
    nodes: Vec<Node<E>>,
    /// The network between nodes.
    pub net: Network,
    watches: Vec<E::Watch>,
    violations: Vec<Violation>,
    next_tag: u64,
    /// Counters.
    pub stats: WorldStats,
    /// Negative control: every drift change ([`WorldConfig::drift_change_ppm`]) sets the
    /// clock to this rate, faster than the engine's bound allows (`None` in every honest
    /// run).
    pub unsafe_fast_drift_ppm: Option<i32>,
    /// Print every step's input and outputs to stderr (for replaying a failing seed).
    pub trace: bool,
    /// Whether crashes may corrupt fsynced records (off unless a scenario arms it).
    pub corruption: Corruption,
    /// The corruption injected so far, if any: `(node, what, the newest fsynced index
    /// then)` in keyspace 0.
    pub corrupted: Option<(NodeId, Damage, LogIndex)>,
    /// Checks of the one-lease invariant that found a valid lease while another node
    /// said it led (the check's precondition).
    lease_beside_other_leader: u64,
    /// Rare paths taken by engines that have since crashed (see [`World::path_counts`]).
    paths_of_crashed: BTreeMap<&'static str, u64>,
    /// Draws for process crashes, reboots and drift changes ([`WorldConfig::fault_seed`]).
    fault_rng: Rng,
    /// Draws for storage errors and crashes after an fsync ([`World::add_storage_faults`]).
    storage_rng: Rng,
    /// Crashes after an fsync still to inject, and their chance (ppm) per fsync.
    crashes_after_fsync_left: u32,
    crash_after_fsync_ppm: u32,
    /// A scripted nemesis's rule on messages as they are sent (none unless set).
    message_rule: Option<MessageRule<E::Message>>,
    /// Nodes armed to crash as their vote requests leave, and whether that crash is
    /// already queued ([`World::arm_vote_request_crash`]).
    vote_request_crash: BTreeMap<NodeId, bool>,
    /// Until when client requests are lost ([`World::cut_clients_until`]).
    clients_cut_until_ns: u64,
    /// Held links and what was sent on them, in order ([`World::hold`]).
    holds: BTreeMap<(NodeId, NodeId), Vec<Held<E::Message>>>,
    /// The processor model ([`CpuCost`]; `None`: steps take no time).
    pub cpu: Option<CpuCost>,
    /// How long after now what the current call into a replica sends and answers leaves
    /// (its processor time, under [`World::cpu`]).
    leave_after_ns: u64,
    /// Requests beyond the first in the step under way (charged as steps of their own
    /// under [`World::cpu`]).
    batched: u64,
}

impl<E: SimEngine> World<E> {
    /// Builds and boots a cluster; every parameter not in `config` derives from `seed`.
    pub fn new(config: WorldConfig<E::Config>, seed: u64) -> World<E> {
        let most = if config.replicas > 0 { NODES_PLACED_MAX } else { 9 };
        assert!((1..=most).contains(&config.nodes), "cluster of {} nodes", config.nodes);
        assert!(
            config.replicas <= config.nodes,
            "groups of {} on {}",
            config.replicas,
            config.nodes
        );
        assert!(config.replicas == 0 || config.voters == 0, "placed groups: every replica votes");
        assert!((1..=KEYSPACES_MAX).contains(&config.keyspaces), "{} keyspaces", config.keyspaces);
        assert!(config.fsync_ns_max > config.fsync_ns_min, "empty fsync latency range");
        let mut rng = Rng::new(seed);
        let net = Network::new(config.net.clone(), rng.fork());
        let drift_bound = E::drift_bound_ppm(&config.engine);
        let mut nodes = Vec::new();
        for me in 1..=config.nodes {
            let mut node_rng = rng.fork();
            let offset = node_rng.range(0, config.clock_offset_ns_max.max(1));
            // The engine's bound is on drift between any two nodes, so each node drifts
            // by at most half of it from virtual time.
            let drift_max = i64::from(drift_bound / 2);
            debug_assert!(drift_max <= i64::from(crate::clock::DRIFT_PPM_LIMIT));
            let drift = draw_drift(&mut node_rng, drift_max);
            let fsync_ns = node_rng.range(config.fsync_ns_min, config.fsync_ns_max);
            let replicas = (0..config.keyspaces).map(|_| Self::fresh_replica(&config)).collect();
            let links = (1..=config.nodes)
                .filter(|&peer| peer != me)
                .map(|peer| (NodeId(peer), fresh_link(&config)))
                .collect();
            let forwarded_replies = Arc::new(ByteBudget::new(config.forwarded_replies_bytes_max));
            nodes.push(Node {
                replicas,
                up: false,
                links,
                forwarded_replies,
                clock: NodeClock::new(offset, drift as i32),
                incarnation: 0,
                paused_until_ns: 0,
                fsync_ns,
                disk_slow_factor: 1,
                disk_slow_until_ns: 0,
                rng: node_rng,
            });
        }
        let fault_rng = Rng::new(config.fault_seed);
        let mut world = World {
            watches: (0..config.keyspaces).map(|_| E::Watch::new()).collect(),
            config,
            now_ns: 0,
            seq: 0,
            seed_for_walls: seed ^ 0x3A11_C10C_0000_0009,
            events: BTreeMap::new(),
            nodes,
            net,
            violations: Vec::new(),
            next_tag: 1,
            stats: WorldStats::default(),
            unsafe_fast_drift_ppm: None,
            trace: std::env::var_os("KEEL_SIM_TRACE").is_some(),
            corruption: Corruption::Off,
            corrupted: None,
            lease_beside_other_leader: 0,
            paths_of_crashed: BTreeMap::new(),
            fault_rng,
            storage_rng: Rng::new(0),
            crashes_after_fsync_left: 0,
            crash_after_fsync_ppm: 0,
            message_rule: None,
            vote_request_crash: BTreeMap::new(),
            clients_cut_until_ns: 0,
            holds: BTreeMap::new(),
            cpu: None,
            leave_after_ns: 0,
            batched: 0,
        };
        for id in world.node_ids() {
            world.restart(id);
        }
        world
    }

    fn fresh_replica(config: &WorldConfig<E::Config>) -> Hosted<E> {
        Hosted {
            replica: None,
            disk: VirtualDisk::new(SimDisk::new(config.hard_state_mode)),
            recovered: PersistedState::default(),
            tick_at_ns: None,
            disk_at_ns: None,
            pending_tags: BTreeSet::new(),
        }
    }

    /// Virtual time now, in nanoseconds.
    pub fn now_ns(&self) -> u64 {
        self.now_ns
    }

    /// Every node's id, ascending.
    pub fn node_ids(&self) -> Vec<NodeId> {
        (1..=self.config.nodes).map(NodeId).collect()
    }

    /// How many keyspaces the cluster hosts.
    pub fn keyspaces(&self) -> Keyspace {
        self.config.keyspaces
    }

    /// Keyspace 0's invariant checker (log models, the durable prefix).
    pub fn checker(&self) -> &E::Watch {
        &self.watches[0]
    }

    /// Keyspace 0's invariant checker, to set up what it records.
    pub fn checker_mut(&mut self) -> &mut E::Watch {
        &mut self.watches[0]
    }

    /// A keyspace's invariant checker.
    pub fn checker_of(&self, ks: Keyspace) -> &E::Watch {
        &self.watches[ks as usize]
    }

    /// Violations found so far, first first (every keyspace's).
    pub fn violations(&self) -> &[Violation] {
        &self.violations
    }

    /// Records a violation found outside the world (by clients or checkers).
    pub fn violate(&mut self, kind: &'static str, detail: String) {
        if self.violations.len() < crate::invariants::VIOLATIONS_MAX {
            self.violations.push(Violation { kind, at_ns: self.now_ns, detail });
        }
    }

    /// Moves what keyspace `ks`'s checker found into the run's violations.
    fn collect(&mut self, ks: Keyspace) {
        for violation in self.watches[ks as usize].take_violations() {
            if self.violations.len() < crate::invariants::VIOLATIONS_MAX {
                self.violations.push(violation);
            }
        }
    }

    /// A running node's status in keyspace 0; `None` while it is crashed.
    pub fn status(&self, node: NodeId) -> Option<E::Status> {
        self.status_in(node, 0)
    }

    /// A running node's status in keyspace `ks`.
    pub fn status_in(&self, node: NodeId, ks: Keyspace) -> Option<E::Status> {
        self.replica(node, ks).replica.as_ref().map(|r| r.engine().status())
    }

    /// The hash slot states `node`'s replica of keyspace `ks` applied (`None`: down).
    pub fn slot_states_in(
        &self,
        node: NodeId,
        ks: Keyspace,
    ) -> Option<Vec<(u16, keel_types::slots::SlotState)>> {
        let replica = self.replica(node, ks).replica.as_ref()?;
        let states = replica.engine().slot_states(u64::MAX);
        Some(states.map(|(_, states)| states).unwrap_or_default())
    }

    /// Whether the node is running (not crashed).
    pub fn is_up(&self, node: NodeId) -> bool {
        self.node(node).up
    }

    /// The nodes that host keyspace `ks` ([`WorldConfig::replicas`]), ascending.
    pub fn group(&self, ks: Keyspace) -> Vec<NodeId> {
        let (n, r) = (self.config.nodes, self.config.replicas);
        if r == 0 {
            return self.node_ids();
        }
        let mut ids: Vec<NodeId> = (0..r).map(|i| NodeId((ks * r + i) % n + 1)).collect();
        ids.sort_unstable();
        ids
    }

    /// Whether `node` hosts keyspace `ks`.
    pub fn hosts(&self, node: NodeId, ks: Keyspace) -> bool {
        self.config.replicas == 0 || self.group(ks).contains(&node)
    }

    /// The running leader of keyspace 0 with the highest epoch, if any.
    pub fn leader(&self) -> Option<NodeId> {
        self.leader_in(0)
    }

    /// The running leader of keyspace `ks` with the highest epoch, if any.
    pub fn leader_in(&self, ks: Keyspace) -> Option<NodeId> {
        let roles = self.node_ids().into_iter().filter_map(|id| {
            let replica = self.replica(id, ks).replica.as_ref()?;
            Some((id, replica.engine().role()))
        });
        roles.filter(|(_, r)| r.role == "leader").max_by_key(|(_, r)| r.epoch).map(|(id, _)| id)
    }

    /// The node's keyspace-0 engine, while it runs (for scenario-specific introspection).
    pub fn engine(&self, node: NodeId) -> Option<std::sync::RwLockReadGuard<'_, E>> {
        self.replica(node, 0).replica.as_ref().map(|r| r.engine())
    }

    fn node(&self, node: NodeId) -> &Node<E> {
        &self.nodes[Self::slot(node)]
    }

    fn replica(&self, node: NodeId, ks: Keyspace) -> &Hosted<E> {
        &self.node(node).replicas[ks as usize]
    }

    fn replica_mut(&mut self, node: NodeId, ks: Keyspace) -> &mut Hosted<E> {
        &mut self.nodes[Self::slot(node)].replicas[ks as usize]
    }

    /// The voters every node is configured with ([`WorldConfig::voters`]).
    pub fn configured_voters(&self) -> Vec<NodeId> {
        let voters = match self.config.voters {
            0 => self.config.nodes,
            n => n.min(self.config.nodes),
        };
        (1..=voters).map(NodeId).collect()
    }

    /// The voters keyspace `ks` is configured with: its group's nodes when keyspaces are
    /// placed on groups, else [`World::configured_voters`].
    pub fn configured_voters_of(&self, ks: Keyspace) -> Vec<NodeId> {
        match self.config.replicas {
            0 => self.configured_voters(),
            _ => self.group(ks),
        }
    }

    fn slot(node: NodeId) -> usize {
        assert!(node.0 >= 1, "node ids start at 1");
        (node.0 - 1) as usize
    }

    fn push(&mut self, at_ns: u64, event: EventOf<E>) {
        assert!(at_ns >= self.now_ns, "event scheduled in the past");
        if self.events.len() >= self.config.events_max {
            self.violate("event-queue-full", format!("{} events queued", self.events.len()));
            return;
        }
        self.seq += 1;
        self.events.insert((at_ns, self.seq), event);
    }

    /// Arms (or disarms) `node` to crash as its next vote requests leave: they are lost
    /// with it, its vote for itself already durable (the contract checks that before a
    /// request leaves), and it restarts 20 to 300 ms later, a candidate in an epoch that
    /// nobody heard of (a power loss right after the vote's fsync). A targeted fault
    /// (`race.rs`); no other scenario arms it.
    pub fn arm_vote_request_crash(&mut self, node: NodeId, armed: bool) {
        if armed {
            self.vote_request_crash.entry(node).or_insert(false);
        } else {
            self.vote_request_crash.remove(&node);
        }
    }

    /// A vote request of an armed node: lost, and the node's crash queued (once).
    fn crash_at_vote_request(&mut self, node: NodeId) {
        let queued = self.vote_request_crash.get_mut(&node).expect("armed");
        if std::mem::replace(queued, true) {
            return;
        }
        let rng = &mut self.nodes[Self::slot(node)].rng;
        let restart_at_ns = self.now_ns + rng.range(20_000_000, 300_000_000);
        self.stats.vote_request_crashes += 1;
        self.push(self.now_ns, Event::Crash { node, restart_at_ns });
    }

    /// Sets (or, with `None`, removes) a scripted rule that decides, as each message is
    /// sent, whether it passes, is lost or is held back longer (a targeted nemesis). Off
    /// by default; the rule draws nothing from the world's generators, and a dropped
    /// message draws nothing from the network's.
    pub fn set_message_rule(&mut self, rule: Option<MessageRule<E::Message>>) {
        self.message_rule = rule;
    }

    /// Sets a timer that fires as [`Notice::Timer`] at virtual time `at_ns`.
    pub fn set_timer(&mut self, at_ns: u64, id: u64) {
        self.push(at_ns.max(self.now_ns), Event::Timer { id });
    }

    /// Sends a client request to `node` for keyspace 0 (see [`World::submit_to`]).
    pub fn submit(&mut self, node: NodeId, request: E::Request) -> RequestTag {
        self.submit_to(node, 0, request)
    }

    /// Sends a client request to `node` for keyspace `ks`; the reply comes back as a
    /// [`Notice::Reply`] carrying the returned tag (the node may be down: then no reply
    /// ever comes).
    pub fn submit_to(&mut self, node: NodeId, ks: Keyspace, mut request: E::Request) -> RequestTag {
        assert!(ks < self.config.keyspaces, "keyspace {ks} of {}", self.config.keyspaces);
        let tag = self.reserve_tag();
        E::set_tag(&mut request, tag);
        self.send_request(node, ks, request);
        tag
    }

    /// A tag no request has had, for one to be sent later with [`World::submit_tagged`].
    pub fn reserve_tag(&mut self) -> RequestTag {
        let tag = RequestTag(self.next_tag);
        self.next_tag += 1;
        tag
    }

    /// Sends a client request to `node` for keyspace 0 under the tag it carries (one from
    /// [`World::reserve_tag`]).
    pub fn submit_tagged(&mut self, node: NodeId, request: E::Request) {
        self.send_request(node, 0, request);
    }

    fn send_request(&mut self, node: NodeId, ks: Keyspace, request: E::Request) {
        if self.now_ns < self.clients_cut_until_ns {
            self.stats.client_requests_cut += 1;
            return; // lost on the way: no reply ever comes
        }
        let at = self.now_ns + self.config.client_latency_ns;
        self.push(at, Event::Request { node, ks, request });
    }

    /// Cuts every client off the cluster until `until_ns`: requests sent meanwhile are
    /// lost, and their clients time out (a client-side network outage, or an idle spell:
    /// no node gets new work). A targeted fault (`race.rs`); no other scenario cuts them.
    pub fn cut_clients_until(&mut self, until_ns: u64) {
        self.clients_cut_until_ns = self.clients_cut_until_ns.max(until_ns);
    }

    /// The time of the next event, if any.
    pub fn next_event_ns(&self) -> Option<u64> {
        self.events.keys().next().map(|k| k.0)
    }

    /// Processes the next event; returns what it reports to the driver, if anything.
    /// `None` with an empty queue means the world has stopped.
    pub fn step(&mut self) -> Option<Notice<E::Reply>> {
        let ((at_ns, seq), event) = self.events.pop_first()?;
        debug_assert!(at_ns >= self.now_ns, "time went backwards");
        self.now_ns = at_ns;
        self.stats.events += 1;
        if let Some(node) = event.node() {
            let paused_until = self.node(node).paused_until_ns;
            if paused_until > at_ns {
                self.stats.deferred += 1;
                let event = match event {
                    Event::Deliver { from, to, ks, message, incarnation, arrived: false, hold } => {
                        if !self.net.arrived(from, to) {
                            return None;
                        }
                        Event::Deliver { from, to, ks, message, incarnation, arrived: true, hold }
                    }
                    other => other,
                };
                // Under its first sequence number: what arrived while the node slept is
                // handled in arrival order, however often the sleep is extended.
                self.events.insert((paused_until, seq), event);
                return None;
            }
        }
        self.dispatch(event)
    }

    /// Processes every event up to and including virtual time `until_ns`, then sets
    /// the clock there; returns the notices in order.
    pub fn run_until(&mut self, until_ns: u64) -> Vec<Notice<E::Reply>> {
        let mut notices = Vec::new();
        while self.next_event_ns().is_some_and(|t| t <= until_ns) {
            if let Some(n) = self.step() {
                notices.push(n);
            }
        }
        self.now_ns = self.now_ns.max(until_ns);
        notices
    }

    /// Moves virtual time forward to `at_ns` (no earlier than now) without processing
    /// events; events due before it must have been processed.
    pub fn advance_to(&mut self, at_ns: u64) {
        debug_assert!(
            self.next_event_ns().is_none_or(|t| t >= at_ns) || !self.violations().is_empty()
        );
        self.now_ns = self.now_ns.max(at_ns);
    }

    fn dispatch(&mut self, event: EventOf<E>) -> Option<Notice<E::Reply>> {
        match event {
            Event::Deliver { from, to, ks, message, incarnation, arrived, hold: _ } => {
                if arrived || self.net.arrived(from, to) {
                    if incarnation < self.node(from).incarnation && self.is_up(to) {
                        self.stats.late_deliveries += 1;
                        self.stats.late_replies += u64::from(E::answers(&message));
                    }
                    self.step_replica(to, ks, Input::Message { from, message });
                }
            }
            Event::Tick { node, ks, incarnation } => self.on_tick(node, ks, incarnation),
            Event::Disk { node, ks, incarnation } => self.on_disk(node, ks, incarnation),
            Event::Prepared { node, ks, incarnation, meta, data } => {
                self.on_prepared(node, ks, incarnation, meta, &data)
            }
            Event::Request { node, ks, request } => {
                let mut requests = vec![request];
                while let Some(entry) = self.events.first_entry() {
                    let same = entry.key().0 == self.now_ns
                        && matches!(entry.get(), Event::Request { node: n, ks: k, .. } if *n == node && *k == ks);
                    if !same {
                        break;
                    }
                    let Event::Request { request, .. } = entry.remove() else { unreachable!() };
                    self.stats.events += 1;
                    requests.push(request);
                }
                if self.is_up(node) {
                    // A read goes off the loop only while no earlier request of its
                    // connection waits in the loop (engines that order a connection's
                    // requests themselves name it).
                    let mut looped = BTreeSet::new();
                    requests.retain(|request| {
                        let connection = E::connection(request);
                        if connection.is_some_and(|c| looped.contains(&c)) {
                            return true;
                        }
                        let answered = self.read_off_loop(node, ks, request);
                        if !answered {
                            looped.extend(connection);
                        }
                        !answered
                    });
                    if requests.is_empty() {
                        return None;
                    }
                    let replica = self.replica_mut(node, ks);
                    replica.pending_tags.extend(requests.iter().map(E::request_tag));
                    let input = if requests.len() == 1 {
                        Input::Client(requests.pop().expect("one"))
                    } else {
                        self.stats.client_batches += 1;
                        Input::Clients(requests)
                    };
                    self.step_replica(node, ks, input);
                }
            }
            Event::Reply { node, ks, reply } => {
                return Some(Notice::Reply { node, keyspace: ks, reply })
            }
            Event::Timer { id } => return Some(Notice::Timer { id }),
            Event::Crash { node, restart_at_ns } => {
                self.crash(node);
                self.push(restart_at_ns, Event::Restart { node });
            }
            Event::Restart { node } => self.restart(node),
            Event::StorageFault { node, ks, sync } => {
                if self.is_up(node) {
                    let kind = if sync { SimFault::Sync } else { SimFault::Write };
                    self.replica_mut(node, ks).disk.storage_mut().raw().fail_next(kind);
                }
            }
        }
        None
    }

    /// Storage faults for a share of seeds, drawn from `seed` alone: in half of them, one
    /// to three I/O errors (a write or an fsync, at random times before `until_ns`, on
    /// random nodes and keyspaces), each stopping its node as a server stops (exit code 4)
    /// and restarting it 20 to 300 ms later; in half, one or two crashes right after an
    /// fsync completes, before the engine learns of it (each fsync has a 0.5% chance
    /// until they are spent).
    pub fn add_storage_faults(&mut self, seed: u64, until_ns: u64) {
        let mut rng = Rng::new(seed);
        if rng.chance(500_000) {
            let nodes = self.node_ids();
            for _ in 0..rng.range(1, 4) {
                let at = rng.range(self.now_ns, until_ns.max(self.now_ns + 1));
                let node = nodes[rng.index(nodes.len())];
                let ks = rng.index(self.config.keyspaces as usize) as Keyspace;
                // Placed keyspaces: the drawn keyspace's replica at the drawn position in
                // its group (a node that does not host it has no disk of it to fail).
                let group = self.group(ks);
                let node =
                    if self.hosts(node, ks) { node } else { group[node.0 as usize % group.len()] };
                let sync = rng.chance(500_000);
                self.push(at, Event::StorageFault { node, ks, sync });
            }
        }
        if rng.chance(500_000) {
            self.crashes_after_fsync_left = rng.range(1, 3) as u32;
            self.crash_after_fsync_ppm = 5_000;
        }
        self.storage_rng = rng;
    }

    /// A storage operation of `node` failed: the node stops at once, as a server does
    /// (nothing more is sent or answered; what was not fsynced may be lost), and comes
    /// back 20 to 300 ms later.
    fn storage_failed(&mut self, node: NodeId, what: &str) {
        if self.trace {
            eprintln!("{}ns {node} stops: storage failed: {what}", self.now_ns);
        }
        self.stats.storage_errors += 1;
        self.stop_and_restart(node);
    }

    fn stop_and_restart(&mut self, node: NodeId) {
        let restart_at = self.now_ns + self.storage_rng.range(20_000_000, 300_000_000);
        self.crash(node);
        self.push(restart_at, Event::Restart { node });
    }

    fn on_tick(&mut self, node: NodeId, ks: Keyspace, incarnation: u64) {
        let now = self.now_ns;
        let current = self.node(node).incarnation == incarnation;
        let replica = self.replica_mut(node, ks);
        // A tick deferred by a pause fires later than planned; one planned later than now
        // belongs to a newer schedule, and this one was superseded.
        if !current || replica.tick_at_ns.is_none_or(|t| t > now) {
            return;
        }
        replica.tick_at_ns = None;
        self.step_replica(node, ks, Input::Tick);
    }

    /// The fsync time of a node's disk now (slowed while a slow-disk fault lasts).
    fn fsync_cost(&self, node: NodeId) -> u64 {
        let n = self.node(node);
        let factor = if n.disk_slow_until_ns > self.now_ns { n.disk_slow_factor } else { 1 };
        n.fsync_ns * factor
    }

    /// The disk finished something: each completion goes through the front, which
    /// releases held messages and gives the engine its input.
    fn on_disk(&mut self, node: NodeId, ks: Keyspace, incarnation: u64) {
        let now = self.now_ns;
        if self.node(node).incarnation != incarnation {
            return;
        }
        let cost = self.fsync_cost(node);
        let replica = self.replica_mut(node, ks);
        if replica.disk_at_ns.is_none_or(|t| t > now) {
            return; // superseded by an earlier schedule
        }
        replica.disk_at_ns = None;
        if replica.replica.as_mut().is_some_and(|r| r.release_due(Time(now))) {
            if let Err(e) = replica.submit(now, cost) {
                return self.storage_failed(node, &e.to_string());
            }
        }
        let completions = match replica.disk.poll(now, cost) {
            Ok(completions) => completions,
            Err(e) => return self.storage_failed(node, &e.to_string()),
        };
        let saved = completions.iter().filter(|c| matches!(c, Completion::HardStateSaved { .. }));
        self.stats.hard_states_saved += saved.count() as u64;
        let synced = completions.iter().any(|c| matches!(c, Completion::Synced { .. }));
        if synced
            && self.crashes_after_fsync_left > 0
            && self.storage_rng.chance(self.crash_after_fsync_ppm)
        {
            // The fsync returned; the process dies before the engine hears of it.
            self.crashes_after_fsync_left -= 1;
            self.stats.crashes_after_fsync += 1;
            return self.stop_and_restart(node);
        }
        if !completions.is_empty() {
            self.drive(node, ks, |replica, local, io| {
                replica.complete(local, &completions, io);
            });
        }
        self.schedule_disk(node, ks);
    }

    /// A snapshot this node took is written and synced under its temporary name (as a
    /// server writes it on a task of its own): queue its adoption.
    fn on_prepared(
        &mut self,
        node: NodeId,
        ks: Keyspace,
        incarnation: u64,
        meta: SnapshotMeta,
        data: &[u8],
    ) {
        if self.node(node).incarnation != incarnation {
            return; // the crash lost the writing task
        }
        let now = self.now_ns;
        let cost = self.fsync_cost(node);
        let replica = self.replica_mut(node, ks);
        if let Err(e) =
            keel_storage::wal::prepare_snapshot(replica.disk.storage_mut().raw(), meta, data)
        {
            return self.storage_failed(node, &format!("writing a snapshot: {e}"));
        }
        let Some(running) = replica.replica.as_mut() else { return };
        running.prepared(Time(now), meta, data.len() as u64);
        if let Err(e) = replica.submit(now, cost) {
            return self.storage_failed(node, &e.to_string());
        }
        self.stats.snapshots_prepared += 1;
        self.schedule_disk(node, ks);
    }

    fn schedule_disk(&mut self, node: NodeId, ks: Keyspace) {
        let incarnation = self.node(node).incarnation;
        let replica = self.replica_mut(node, ks);
        let held = replica.replica.as_ref().and_then(|r| r.hold_due()).map(|due| due.0);
        let Some(at) = [replica.disk.next_due_ns(), held].into_iter().flatten().min() else {
            return;
        };
        if replica.disk_at_ns.is_some_and(|t| t <= at) {
            return; // an earlier poll is already due
        }
        replica.disk_at_ns = Some(at);
        let at = at.max(self.now_ns);
        self.push(at, Event::Disk { node, ks, incarnation });
    }

    /// Steps a running replica's engine with one input and carries out the outputs.
    fn step_replica(&mut self, node: NodeId, ks: Keyspace, input: Input<E::Message, E::Request>) {
        if self.trace {
            eprintln!("{:>12} {node}/{ks} <- {input:?}", self.now_ns);
        }
        if let Input::Clients(requests) = &input {
            self.batched = requests.len() as u64 - 1;
        }
        self.drive(node, ks, |replica, local, io| {
            replica.step(local, input, io);
        });
        self.batched = 0; // taken by `drive`, unless the call stopped before its charge
    }

    /// Runs one call into a running replica (`call` gets it, the node's local time and
    /// the simulator's [`SimIo`]), then carries out what left it, in order: the disk
    /// operations it has ready, snapshots to write, messages, replies, and the checks of
    /// every step's status. A crashed replica takes nothing (the input is lost).
    fn drive(
        &mut self,
        node: NodeId,
        ks: Keyspace,
        call: impl FnOnce(&mut Replica<E>, Time, &mut SimIo<'_, E>),
    ) {
        let now = self.now_ns;
        let local = self.node(node).clock.local(now);
        let cost = self.fsync_cost(node);
        let incarnation = self.node(node).incarnation;
        let n = &mut self.nodes[Self::slot(node)];
        let hosted = &mut n.replicas[ks as usize];
        let Some(replica) = hosted.replica.as_mut() else { return };
        let synced = keel_storage::Storage::synced_index(hosted.disk.storage());
        let mut io = SimIo {
            links: &n.links,
            node,
            ks,
            now_ns: now,
            watch: &mut self.watches[ks as usize],
            synced,
            left: Vec::new(),
            violations: Vec::new(),
            trace: self.trace,
            events: Vec::new(),
        };
        let (steps, coalesced, refusals) =
            (replica.steps(), replica.coalesced(), replica.refusals());
        call(replica, local, &mut io);
        self.stats.steps += replica.steps() - steps;
        self.stats.syncs_coalesced += replica.coalesced() - coalesced;
        self.stats.bulk_shed += replica.refusals().0 - refusals.0;
        self.stats.forwarded_replies_busy += replica.refusals().1 - refusals.1;
        self.stats.held_behind_hard_state += u64::from(replica.holding());
        let steps = replica.steps() - steps;
        let (left, violations) = (io.left, io.violations);
        for (kind, detail) in violations {
            self.violate(kind, detail);
        }
        self.collect(ks);
        if let Err(e) = self.replica_mut(node, ks).submit(now, cost) {
            // Nothing of this call leaves the node: it stops before sending it.
            return self.storage_failed(node, &e.to_string());
        }
        // With a processor model the node is busy for the steps, and what they send and
        // answer leaves at their end.
        let messages = left.iter().filter(|l| matches!(l, Left::Send(..))).count() as u64;
        let steps = steps + std::mem::take(&mut self.batched);
        self.leave_after_ns = self.cpu.map_or(0, |c| c.step_ns * steps + c.message_ns * messages);
        if self.leave_after_ns > 0 {
            self.pause(node, now + self.leave_after_ns);
        }
        for left in left {
            match left {
                Left::Send(to, message, hold) => self.send(node, ks, to, message, hold),
                Left::Reply(reply) => self.reply(node, ks, reply),
                Left::Prepare(meta, data) => {
                    // Written and synced off the log's queue, in about one fsync's time.
                    self.push(now + cost, Event::Prepared { node, ks, incarnation, meta, data });
                }
                Left::Observed(seen) => self.observe(node, ks, &seen),
            }
        }
        self.leave_after_ns = 0;
        self.schedule_disk(node, ks);
        if let Some(wake_at) = self.replica(node, ks).replica.as_ref().and_then(|r| r.wake_at()) {
            self.schedule_tick(node, ks, wake_at);
        }
    }

    fn observe(&mut self, node: NodeId, ks: Keyspace, seen: &<E::Watch as Watch<E>>::Seen) {
        let synced = keel_storage::Storage::synced_index(self.replica(node, ks).disk.storage());
        let now = self.now_ns;
        self.watches[ks as usize].observe(node, seen, synced, now);
        self.collect(ks);
        self.check_one_lease(ks);
    }

    /// How often each invariant's precondition held, over every keyspace (see
    /// [`Checker::preconditions`]), and `inv:lease-beside-other-leader`: a valid leader
    /// lease while another node said it led (what the one-lease check is about).
    pub fn preconditions(&self) -> BTreeMap<&'static str, u64> {
        let mut counts = BTreeMap::new();
        for checker in &self.watches {
            for (name, count) in checker.preconditions() {
                *counts.entry(*name).or_default() += count;
            }
        }
        counts.insert("inv:lease-beside-other-leader", self.lease_beside_other_leader);
        counts
    }

    /// How often every engine of the run, crashed ones included, took each rare path its
    /// kind counts ([`SimEngine::path_counts`]).
    pub fn path_counts(&self) -> BTreeMap<&'static str, u64> {
        let mut paths = self.paths_of_crashed.clone();
        for node in &self.nodes {
            for replica in &node.replicas {
                for (path, count) in replica.replica.iter().flat_map(|r| r.engine().path_counts()) {
                    *paths.entry(path).or_default() += count;
                }
            }
        }
        paths
    }

    /// At most one node of keyspace `ks` holds a valid leader lease now, each judged on
    /// its own clock (`docs/protocol.md` §4): two would let both serve reads without a
    /// round, one of them stale.
    fn check_one_lease(&mut self, ks: Keyspace) {
        let now = self.now_ns;
        let leased: Vec<NodeId> = self
            .node_ids()
            .into_iter()
            .filter(|id| {
                let local = self.node(*id).clock.local(now);
                let replica = self.replica(*id, ks).replica.as_ref();
                replica.is_some_and(|r| r.engine().leader_lease_valid_at(local))
            })
            .collect();
        if leased.len() > 1 {
            let detail = format!("keyspace {ks}: {leased:?} hold valid leader leases at once");
            self.violate("one-leader-lease", detail);
        }
        // The check's precondition: a lease is valid while another node says it leads.
        let leading = self.watches[ks as usize].leading();
        if leased.iter().any(|held| leading.keys().any(|other| other != held)) {
            self.lease_beside_other_leader += 1;
        }
    }

    fn send(
        &mut self,
        from: NodeId,
        ks: Keyspace,
        to: NodeId,
        message: E::Message,
        hold: Option<LinkHold>,
    ) {
        self.check_sent(from, ks, to, &message);
        // What the receiver gets is what the real codec makes of the sender's bytes.
        let message = match E::across(&message) {
            Ok((decoded, bytes)) => {
                self.stats.message_bytes += bytes as u64;
                decoded
            }
            Err(detail) => return self.violate("codec", format!("{from}/{ks} -> {to}: {detail}")),
        };
        if E::facts(&message).grants_vote && self.config.crash_after_vote_ppm > 0 {
            let rng = &mut self.nodes[Self::slot(from)].rng;
            if rng.chance(self.config.crash_after_vote_ppm) {
                let restart_at_ns = self.now_ns + rng.range(1_000_000, 50_000_000);
                self.push(self.now_ns, Event::Crash { node: from, restart_at_ns });
            }
        }
        if self.config.late_open_copy_ppm > 0 && E::opens_session(&message) {
            let rng = &mut self.nodes[Self::slot(from)].rng;
            if rng.chance(self.config.late_open_copy_ppm) {
                let at = self.now_ns + rng.range(500_000_000, 3_000_000_000);
                let incarnation = self.node(from).incarnation;
                let copy = message.clone();
                self.net.add_copy();
                self.stats.late_open_copies += 1;
                let arrived = false;
                let hold = None;
                self.push(
                    at,
                    Event::Deliver { from, to, ks, message: copy, incarnation, arrived, hold },
                );
            }
        }
        if E::facts(&message).asks_vote && self.vote_request_crash.contains_key(&from) {
            return self.crash_at_vote_request(from);
        }
        let mut extra_ns = 0;
        if let Some(rule) = self.message_rule.as_mut() {
            match rule(from, to, &message) {
                Fate::Pass => {}
                Fate::Drop => {
                    self.stats.scripted_drops += 1;
                    if self.trace {
                        eprintln!("{:>12} {from}->{to} dropped by rule: {message:?}", self.now_ns);
                    }
                    return;
                }
                Fate::Delay(ns) => extra_ns = ns,
            }
        }
        // Every copy holds the link's allowance until the last is delivered or lost.
        let hold = hold.map(Arc::new);
        let incarnation = self.node(from).incarnation;
        if let Some(held) = self.holds.get_mut(&(from, to)) {
            self.stats.held_messages += 1;
            held.push((ks, incarnation, message, hold));
            return;
        }
        let stalled_until = self.net.link_stalled_until(from, to, self.now_ns);
        let extra_ns = extra_ns + self.leave_after_ns;
        for delay in self.net.send(from, to) {
            let at = stalled_until.map_or(self.now_ns, |until| until) + delay + extra_ns;
            let (message, hold) = (message.clone(), hold.clone());
            let arrived = false;
            self.push(at, Event::Deliver { from, to, ks, message, incarnation, arrived, hold });
        }
    }

    /// Holds the link `from -> to`: what is sent on it from now on waits (a connection
    /// whose segments are queued), until [`World::release`].
    pub fn hold(&mut self, from: NodeId, to: NodeId) {
        self.holds.entry((from, to)).or_default();
    }

    /// The links held now ([`World::hold`]).
    pub fn held_links(&self) -> Vec<(NodeId, NodeId)> {
        self.holds.keys().copied().collect()
    }

    /// Lets go of a held link: what it held arrives after the link's ordinary delay, in
    /// the order it was sent, whatever happens to the link meanwhile (it was on its way;
    /// lost only if the link is cut now).
    pub fn release(&mut self, from: NodeId, to: NodeId) {
        let Some(held) = self.holds.remove(&(from, to)) else { return };
        if self.net.is_cut(from, to) {
            self.net.stats.partitioned += held.len() as u64;
            return;
        }
        let base = self.net.delay(from, to);
        for (i, (ks, incarnation, message, hold)) in held.into_iter().enumerate() {
            let at = self.now_ns + base + i as u64;
            let arrived = true;
            self.push(at, Event::Deliver { from, to, ks, message, incarnation, arrived, hold });
        }
    }

    /// The contract's checks on a message as it leaves: the hard state it depends on (its
    /// epoch, a vote it grants or asks for) is on disk.
    fn check_sent(&mut self, from: NodeId, ks: Keyspace, to: NodeId, message: &E::Message) {
        let disk = self.replica(from, ks).disk.storage();
        let hard = disk.hard_state();
        let facts = E::facts(message);
        let mut breaches = Vec::new();
        if facts.epoch > hard.epoch {
            breaches.push(format!(
                "{from} sends in epoch {} but persisted only {}",
                facts.epoch, hard.epoch
            ));
        }
        // Saves are in order: a vote saved once was durable before whatever replaced it.
        if facts.grants_vote && !disk.vote_saved(facts.epoch, to) {
            breaches.push(format!("{from} grants {to} a vote without persisting it"));
        }
        if facts.asks_vote && !disk.vote_saved(facts.epoch, from) {
            breaches.push(format!("{from} campaigns without persisting its own vote"));
        }
        for detail in breaches {
            self.violate("contract-message", format!("keyspace {ks}: {detail}"));
        }
    }

    /// Offers `request` to the engine between steps, as a server's connection does
    /// (drawn at [`WorldConfig::reads_off_loop_ppm`]); whether it was answered.
    fn read_off_loop(&mut self, node: NodeId, ks: Keyspace, request: &E::Request) -> bool {
        let ppm = self.config.reads_off_loop_ppm;
        if ppm == 0 || E::writes(request) {
            return false;
        }
        let local = self.node(node).clock.local(self.now_ns);
        if !self.nodes[Self::slot(node)].rng.chance(ppm) {
            return false;
        }
        let Some(replica) = self.replica(node, ks).replica.as_ref() else { return false };
        let Some((reply, _)) = replica.cell().read_now(request, || local) else {
            return false;
        };
        if self.trace {
            eprintln!("{:>12} {node}/{ks} off the loop: {request:?} -> {reply:?}", self.now_ns);
        }
        self.stats.reads_off_loop += 1;
        // Answered under the request's tag, as a server's connection answers it.
        debug_assert_eq!(E::reply_tag(&reply), E::request_tag(request));
        self.replica_mut(node, ks).pending_tags.insert(E::request_tag(request));
        self.reply(node, ks, reply);
        true
    }

    fn reply(&mut self, node: NodeId, ks: Keyspace, reply: E::Reply) {
        let tag = E::reply_tag(&reply);
        if !self.replica_mut(node, ks).pending_tags.remove(&tag) {
            self.violate("contract-reply", format!("{node}/{ks} answers unknown tag {tag:?}"));
            return;
        }
        let at = self.now_ns + self.leave_after_ns + self.config.client_latency_ns;
        self.push(at, Event::Reply { node, ks, reply });
    }

    fn schedule_tick(&mut self, node: NodeId, ks: Keyspace, wake_at: Time) {
        let now = self.now_ns;
        let n = &mut self.nodes[Self::slot(node)];
        let at = n.clock.virtual_at(wake_at).max(now);
        let incarnation = n.incarnation;
        let replica = &mut n.replicas[ks as usize];
        if replica.tick_at_ns.is_some_and(|t| t <= at) {
            return; // an earlier tick is already due
        }
        replica.tick_at_ns = Some(at);
        self.push(at, Event::Tick { node, ks, incarnation });
    }

    /// Crashes a node (every keyspace): volatile state, queued disk work and unsynced
    /// writes are lost; in-flight inputs to it are dropped. No effect on a node already
    /// down.
    pub fn crash(&mut self, node: NodeId) {
        let torn_tail = self.config.torn_tail;
        if !self.is_up(node) {
            return;
        }
        self.maybe_corrupt(node);
        let seen: Vec<_> =
            (0..self.config.keyspaces as usize).map(|ks| self.epoch_of_others(node, ks)).collect();
        let keep_cache = self.fault_rng.chance(self.config.process_crash_ppm);
        let reboot = !keep_cache && self.fault_rng.chance(self.config.clock_reboot_ppm);
        self.change_clocks(node, reboot);
        for replica in &self.nodes[Self::slot(node)].replicas {
            for (path, count) in replica.replica.iter().flat_map(|r| r.engine().path_counts()) {
                *self.paths_of_crashed.entry(path).or_default() += count;
            }
        }
        let n = &mut self.nodes[Self::slot(node)];
        n.up = false;
        n.incarnation += 1;
        // The process's peer queues and its clients' connections are gone with it: so is
        // what they held of its budgets (messages still on the wire keep their old holds).
        for link in n.links.values_mut() {
            *link = fresh_link(&self.config);
        }
        n.forwarded_replies = Arc::new(ByteBudget::new(self.config.forwarded_replies_bytes_max));
        for (ks, replica) in n.replicas.iter_mut().enumerate() {
            if replica.replica.take().is_some_and(|r| r.hold_due().is_some()) {
                self.stats.held_appends_lost += 1;
            }
            replica.tick_at_ns = None;
            replica.disk_at_ns = None;
            replica.pending_tags.clear();
            replica.disk.crash();
            let disk = replica.disk.storage_mut();
            replica.recovered = disk.crash(&mut n.rng, torn_tail, keep_cache, seen[ks]);
            let snapshot = replica.recovered.snapshot.as_ref().map(|(m, _)| *m);
            self.watches[ks].recover(node, snapshot, &replica.recovered.entries);
        }
        self.stats.crashes += 1;
        self.stats.process_crashes += u64::from(keep_cache);
        if let Some(queued) = self.vote_request_crash.get_mut(&node) {
            *queued = false;
        }
    }

    /// At a crash of `node`: with `reboot`, its clock starts over at a new reading and
    /// rate; and, by chance, another running node's clock changes rate, faster or slower.
    /// Both stay within the drift bound the engine states (each node within half of it
    /// of virtual time, so any two within it), unless the negative control
    /// [`World::unsafe_fast_drift_ppm`] speeds the clock past it.
    fn change_clocks(&mut self, node: NodeId, reboot: bool) {
        let drift_max = i64::from(E::drift_bound_ppm(&self.config.engine) / 2);
        if reboot {
            // `local(now) = offset + now·(1 + drift)`: a fresh offset makes the reading
            // after the reboot anything from far below to far above the one before.
            let offset = self.fault_rng.range(0, self.config.clock_offset_ns_max.max(1));
            let drift = draw_drift(&mut self.fault_rng, drift_max);
            let n = &mut self.nodes[Self::slot(node)];
            n.clock = NodeClock::new(offset, drift as i32);
            self.stats.clock_reboots += 1;
        }
        if self.fault_rng.chance(self.config.drift_change_ppm) {
            let running: Vec<NodeId> =
                self.node_ids().into_iter().filter(|id| *id != node && self.is_up(*id)).collect();
            if running.is_empty() {
                return;
            }
            let other = running[self.fault_rng.index(running.len())];
            let current = i64::from(self.nodes[Self::slot(other)].clock.drift_ppm);
            let drift = match self.unsafe_fast_drift_ppm {
                Some(fast) => i64::from(fast),
                None => draw_drift(&mut self.fault_rng, drift_max),
            };
            if drift == current {
                return;
            }
            self.set_clock_drift(other, drift as i32);
            self.stats.drift_changes += 1;
            if drift > current {
                self.stats.drift_faster += 1;
            } else {
                self.stats.drift_slower += 1;
            }
        }
    }

    /// With corruption armed and none injected yet, sometimes flips a bit in what `node`
    /// (still running) has on disk in keyspace 0: one of its last fsynced log records, the
    /// seal after one, its newest snapshot or its hard-state file.
    fn maybe_corrupt(&mut self, node: NodeId) {
        if self.corruption == Corruption::HardStates {
            let disk = self.nodes[Self::slot(node)].replicas[0].disk.storage_mut();
            if disk.corrupt_hard_state(9) {
                self.stats.hard_states_damaged += 1;
            }
            return;
        }
        if self.corruption == Corruption::Off || self.corrupted.is_some() {
            return;
        }
        let n = &mut self.nodes[Self::slot(node)];
        let synced = keel_storage::Storage::synced_index(n.replicas[0].disk.storage());
        // Unguarded, every crash that can lose what only this node holds does.
        let chance = match self.corruption {
            Corruption::Unguarded => 1_000_000,
            _ => CORRUPT_PER_CRASH_PPM,
        };
        if synced == LogIndex::ZERO || !n.rng.chance(chance) {
            return;
        }
        let depth = n.rng.range(0, CORRUPT_DEPTH_MAX.min(synced.0));
        let index = LogIndex(synced.0 - depth);
        // A snapshot, when the node has one, in two crashes of five (most crashes come
        // before the first); otherwise a record, a seal or the hard state.
        let has_snapshot = n.replicas[0].disk.storage().has_snapshot();
        // Unguarded, only what loses entries (the repair floor's control).
        let kinds = if self.corruption == Corruption::Unguarded { 10 } else { 20 };
        let kind = match n.rng.range(0, kinds) {
            0..=7 if has_snapshot => Damage::Snapshot,
            0..=9 => Damage::Record,
            10..=15 => Damage::Seal,
            _ => Damage::HardState,
        };
        // A byte of a record's header (its length field or checksum) or of its payload; of
        // a seal; anywhere in a file.
        let byte = n.rng.range(0, 1 << 16);
        // Whatever is damaged, the node may lose its log through `synced`: guarded, only
        // when the others hold it. (The hard state's repair keeps the log, but a node
        // whose vote is lost must not also be the only copy of what it voted on.)
        // Unguarded, aimed where it hurts: only when the others do not hold it.
        // (A disk ahead of the model, a snapshot's adoption on its way, is left alone.)
        let Some(held) = self.held_by_majority_of_others(node, synced) else { return };
        if (self.corruption == Corruption::Guarded) != held {
            return;
        }
        let disk = self.nodes[Self::slot(node)].replicas[0].disk.storage_mut();
        let hit = match kind {
            Damage::Record => disk.corrupt_record_byte(index, byte % 16),
            Damage::Seal => {
                (0..=depth).any(|d| disk.corrupt_seal_after(LogIndex(synced.0 - d), byte))
            }
            Damage::Snapshot => disk.corrupt_snapshot(byte),
            Damage::HardState => disk.corrupt_hard_state(byte),
        };
        if hit {
            self.corrupted = Some((node, kind, index));
        }
    }

    /// The greatest epoch any node but `node` has saved in keyspace `ks`'s hard state
    /// (what an operator reads from every other member's status before repairing a
    /// damaged hard-state file).
    fn epoch_of_others(&self, node: NodeId, ks: usize) -> keel_types::Epoch {
        let others = self.node_ids().into_iter().filter(|&m| m != node);
        let epochs =
            others.map(|m| self.replica(m, ks as Keyspace).disk.storage().hard_state().epoch);
        epochs.max().unwrap_or_default()
    }

    /// Whether, not counting `node`, a majority of the cluster durably holds `node`'s
    /// keyspace-0 entry at `index` (hence, by log matching, its whole log through it).
    /// `None` if the checker's model of `node` lacks that entry.
    fn held_by_majority_of_others(&self, node: NodeId, index: LogIndex) -> Option<bool> {
        let checker = &self.watches[0];
        let epoch = Some(checker.epoch_at(node, index)?);
        let holders = self
            .node_ids()
            .into_iter()
            .filter(|&m| m != node)
            .filter(|&m| {
                let synced = keel_storage::Storage::synced_index(self.replica(m, 0).disk.storage());
                synced >= index && checker.epoch_at(m, index) == epoch
            })
            .count();
        debug_assert!(holders < self.config.nodes as usize);
        Some(holders > self.config.nodes as usize / 2)
    }

    /// Node `node`'s wall clock now, unix milliseconds: true time (from a fixed epoch in
    /// 2026) plus the node's skew ([`WorldConfig::wall_skew_ms_max`], drawn apart from
    /// every other draw so that it changes no seed's run).
    pub fn wall_ms(&self, node: NodeId) -> u64 {
        const EPOCH_MS: u64 = 1_780_000_000_000;
        let max = self.config.wall_skew_ms_max;
        let mut rng = Rng::new(self.seed_for_walls ^ u64::from(node.0).wrapping_mul(0x9E37_79B9));
        let skew = rng.range(0, 2 * max + 1) as i64 - max as i64;
        (EPOCH_MS + self.now_ns / 1_000_000).saturating_add_signed(skew)
    }

    /// Restarts a crashed node (every keyspace) from what its disks kept. No effect on a
    /// running node.
    pub fn restart(&mut self, node: NodeId) {
        self.restart_with(node, |_| {});
    }

    /// Replaces `node` with a new machine under its identity: crashed if it runs, its
    /// disks wiped, booted with its configuration as `adjust` leaves it (a geo replica
    /// of a data center coming back boots joining).
    pub fn restart_wiped(&mut self, node: NodeId, adjust: impl Fn(&mut E::Config)) {
        self.crash(node);
        let slot = Self::slot(node);
        for ks in 0..self.config.keyspaces as usize {
            let fresh = Self::fresh_replica(&self.config);
            let hosted = &mut self.nodes[slot].replicas[ks];
            hosted.disk = fresh.disk;
            hosted.recovered = fresh.recovered;
        }
        self.stats.wipes += 1;
        self.restart_with(node, adjust);
    }

    /// [`World::restart`], with the configuration as `adjust` leaves it.
    fn restart_with(&mut self, node: NodeId, adjust: impl Fn(&mut E::Config)) {
        if self.is_up(node) {
            return;
        }
        let now = self.now_ns;
        self.nodes[Self::slot(node)].up = true;
        let hosted: Vec<Keyspace> =
            (0..self.config.keyspaces).filter(|ks| self.hosts(node, *ks)).collect();
        for ks in hosted {
            let members = self.configured_voters_of(ks);
            let spread = self.config.spread_leaders;
            let mut config = E::configure(&self.config.engine, node, members.clone(), ks, spread);
            adjust(&mut config);
            let wall_now_ms = self.wall_ms(node);
            let n = &mut self.nodes[Self::slot(node)];
            let seed = n.rng.next_u64();
            let local = n.clock.local(now);
            E::set_wall_clock(&mut config, wall_now_ms.saturating_sub(local.0 / 1_000_000));
            let replica = &mut n.replicas[ks as usize];
            let persisted = std::mem::take(&mut replica.recovered);
            self.stats.boots_from_disk += u64::from(persisted.hard_state != Default::default());
            let engine = match E::boot(config, persisted, seed, local) {
                Ok(engine) => engine,
                Err(e) => panic!("{node}/{ks} cannot restart: {e}"),
            };
            let front = Front::new(HELD_MESSAGES_MAX);
            let front = if self.config.unsafe_skip_truncation_clamp {
                front.unsafe_skip_truncation_clamp()
            } else {
                front
            };
            let budget = n.forwarded_replies.clone();
            let mut running =
                Replica::new(engine, front, fresh_hold()).with_forwarded_replies(budget);
            // Keyspace events are recorded and checked after every step (`SimIo`).
            running.record_events(true);
            replica.replica = Some(running);
            self.step_replica(node, ks, Input::Tick);
        }
    }

    /// Pauses a node (a stalled process) until `until_ns`: its events wait.
    pub fn pause(&mut self, node: NodeId, until_ns: u64) {
        let n = &mut self.nodes[Self::slot(node)];
        n.paused_until_ns = n.paused_until_ns.max(until_ns);
    }

    /// Sets a node's clock rate to `drift_ppm` from now on, faster or slower (its reading
    /// now is unchanged). Beyond the engine's drift bound this is a fault the protocol
    /// does not tolerate; negative tests use it. A pending wake-up was placed where the
    /// old rate reached its reading, which a faster clock reaches sooner: it moves there.
    pub fn set_clock_drift(&mut self, node: NodeId, drift_ppm: i32) {
        let now = self.now_ns;
        let n = &mut self.nodes[Self::slot(node)];
        let old = n.clock;
        n.clock = old.with_drift_from(now, drift_ppm);
        let mut moved = Vec::new();
        for (ks, replica) in n.replicas.iter_mut().enumerate() {
            let Some(at) = replica.tick_at_ns.filter(|at| *at > now) else { continue };
            let sooner = n.clock.virtual_at(old.local(at)).max(now);
            if sooner < at {
                replica.tick_at_ns = Some(sooner);
                moved.push((sooner, ks as Keyspace));
            }
        }
        let incarnation = n.incarnation;
        for (at, ks) in moved {
            self.push(at, Event::Tick { node, ks, incarnation });
        }
    }

    /// Ends a node's pause now; its deferred events run at their deferred times.
    pub fn unpause(&mut self, node: NodeId) {
        let now = self.now_ns;
        let n = &mut self.nodes[Self::slot(node)];
        n.paused_until_ns = n.paused_until_ns.min(now);
    }

    /// Makes a node's fsyncs `factor` times slower until `until_ns`.
    pub fn slow_disk(&mut self, node: NodeId, factor: u64, until_ns: u64) {
        assert!(factor >= 1, "a slow disk is not faster");
        debug_assert!(until_ns == 0 || until_ns >= self.now_ns);
        let n = &mut self.nodes[Self::slot(node)];
        n.disk_slow_factor = factor;
        n.disk_slow_until_ns = until_ns;
    }

    /// The fsync latency of a node's disk when not slowed.
    pub fn fsync_ns(&self, node: NodeId) -> u64 {
        self.node(node).fsync_ns
    }
}
