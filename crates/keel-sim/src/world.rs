//! The simulated cluster: one thread, virtual time in nanoseconds, an event queue keyed
//! by `(time, sequence)`, nodes that each own an engine, a disk and a clock, and a
//! network between them. The driver carries out each step's [`Outputs`] in the order
//! the contract on `Outputs` prescribes and checks the contract as it goes.
//!
//! Layout of one event's handling: pop the earliest event, advance virtual time, defer
//! it if its node is paused, step the node's engine with the matching [`Input`], carry
//! out the outputs ([`World::carry_out`]), then hand the engine's status to the
//! invariant [`Checker`].

use crate::clock::NodeClock;
use crate::disk::{HardStateMode, SimDisk};
use crate::engine::SimEngine;
use crate::invariants::{Checker, Violation};
use crate::net::{NetConfig, Network};
use crate::rng::Rng;
use keel_core::leader::{
    ClientReply, ClientRequest, Config, Input, Message, Outputs, PersistedState, RequestTag,
    SnapshotBytes, Status,
};
use keel_core::time::Time;
use keel_types::{Epoch, HardState, LogIndex, NodeId, SnapshotMeta};
use std::collections::{BTreeMap, BTreeSet};

/// How a simulated cluster is built. Every random choice still comes from the seed.
#[derive(Clone, Debug)]
pub struct WorldConfig {
    /// The engine configuration; `node_id` and `members` are filled in per node.
    pub engine: Config,
    /// Cluster size.
    pub nodes: u32,
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
}

/// Chance (ppm) that a crash corrupts fsynced records, while corruption is armed.
pub const CORRUPT_PER_CRASH_PPM: u32 = 250_000;
/// Most fsynced entries at the log's tail one corruption may cost.
pub const CORRUPT_DEPTH_MAX: u64 = 8;

/// Something the world reports to whoever drives it (clients, scenarios).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    /// A reply reached the client that sent the request to `node`.
    Reply {
        /// The node the client had contacted.
        node: NodeId,
        /// The reply.
        reply: ClientReply,
    },
    /// A timer set with [`World::set_timer`] fired.
    Timer {
        /// The timer's id.
        id: u64,
    },
}

#[derive(Clone, Debug)]
enum Event {
    Deliver { from: NodeId, to: NodeId, message: Message, arrived: bool },
    Tick { node: NodeId, incarnation: u64 },
    Synced { node: NodeId, incarnation: u64, index: LogIndex },
    SnapshotSaved { node: NodeId, incarnation: u64, meta: SnapshotMeta },
    Request { node: NodeId, request: ClientRequest },
    Reply { node: NodeId, reply: ClientReply },
    Timer { id: u64 },
    Crash { node: NodeId, restart_at_ns: u64 },
    Restart { node: NodeId },
}

impl Event {
    /// The node whose pause defers this event, if any.
    fn node(&self) -> Option<NodeId> {
        match self {
            Event::Deliver { to, .. } => Some(*to),
            Event::Tick { node, .. }
            | Event::Synced { node, .. }
            | Event::SnapshotSaved { node, .. }
            | Event::Request { node, .. } => Some(*node),
            Event::Reply { .. }
            | Event::Timer { .. }
            | Event::Crash { .. }
            | Event::Restart { .. } => None,
        }
    }
}

struct Node<E> {
    engine: Option<E>,
    disk: SimDisk,
    clock: NodeClock,
    incarnation: u64,
    recovered: PersistedState,
    paused_until_ns: u64,
    fsync_ns: u64,
    disk_slow_factor: u64,
    disk_slow_until_ns: u64,
    sync_done_ns_last: u64,
    tick_at_ns: Option<u64>,
    pending_tags: BTreeSet<RequestTag>,
    rng: Rng,
}

/// Counters for the run report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorldStats {
    /// Events processed.
    pub events: u64,
    /// Engine steps.
    pub steps: u64,
    /// Crashes injected.
    pub crashes: u64,
    /// Events deferred by a pause.
    pub deferred: u64,
}

/// The simulated cluster.
pub struct World<E> {
    config: WorldConfig,
    now_ns: u64,
    seq: u64,
    events: BTreeMap<(u64, u64), Event>,
    nodes: Vec<Node<E>>,
    /// The network between nodes.
    pub net: Network,
    checker: Checker,
    next_tag: u64,
    /// Counters.
    pub stats: WorldStats,
    /// Print every step's input and outputs to stderr (for replaying a failing seed).
    pub trace: bool,
    /// Whether crashes may corrupt fsynced records (off unless a scenario arms it).
    pub corruption: Corruption,
    /// The corruption injected so far, if any: `(node, first lost index)`.
    pub corrupted: Option<(NodeId, LogIndex)>,
}

impl<E: SimEngine> World<E> {
    /// Builds and boots a cluster; every parameter not in `config` derives from `seed`.
    pub fn new(config: WorldConfig, seed: u64) -> World<E> {
        assert!((1..=9).contains(&config.nodes), "cluster of {} nodes", config.nodes);
        assert!(config.fsync_ns_max > config.fsync_ns_min, "empty fsync latency range");
        let mut rng = Rng::new(seed);
        let net = Network::new(config.net.clone(), rng.fork());
        // The engine's bound is on drift between any two nodes, so each node drifts by at
        // most half of it from virtual time.
        let drift_max = i64::from(config.engine.clock_drift_ppm_max.min(100_000) / 2);
        debug_assert!(drift_max <= i64::from(crate::clock::DRIFT_PPM_LIMIT));
        let mut nodes = Vec::new();
        for _ in 0..config.nodes {
            let mut node_rng = rng.fork();
            let offset = node_rng.range(0, config.clock_offset_ns_max.max(1));
            let drift = node_rng.range(0, 2 * drift_max as u64 + 1) as i64 - drift_max;
            let fsync_ns = node_rng.range(config.fsync_ns_min, config.fsync_ns_max);
            nodes.push(Node {
                engine: None,
                disk: SimDisk::new(config.hard_state_mode),
                clock: NodeClock::new(offset, drift as i32),
                incarnation: 0,
                recovered: PersistedState::default(),
                paused_until_ns: 0,
                fsync_ns,
                disk_slow_factor: 1,
                disk_slow_until_ns: 0,
                sync_done_ns_last: 0,
                tick_at_ns: None,
                pending_tags: BTreeSet::new(),
                rng: node_rng,
            });
        }
        let mut world = World {
            config,
            now_ns: 0,
            seq: 0,
            events: BTreeMap::new(),
            nodes,
            net,
            checker: Checker::new(),
            next_tag: 1,
            stats: WorldStats::default(),
            trace: std::env::var_os("KEEL_SIM_TRACE").is_some(),
            corruption: Corruption::Off,
            corrupted: None,
        };
        for id in world.node_ids() {
            world.restart(id);
        }
        world
    }

    /// Virtual time now, in nanoseconds.
    pub fn now_ns(&self) -> u64 {
        self.now_ns
    }

    /// Every node's id, ascending.
    pub fn node_ids(&self) -> Vec<NodeId> {
        (1..=self.config.nodes).map(NodeId).collect()
    }

    /// The invariant checker (violations, log models).
    pub fn checker(&self) -> &Checker {
        &self.checker
    }

    /// Violations found so far.
    pub fn violations(&self) -> &[Violation] {
        self.checker.violations()
    }

    /// Records a violation found outside the world (by clients or checkers).
    pub fn violate(&mut self, kind: &'static str, detail: String) {
        let now = self.now_ns;
        self.checker.violate(kind, now, detail);
    }

    /// A running node's status; `None` while it is crashed.
    pub fn status(&self, node: NodeId) -> Option<Status> {
        self.node(node).engine.as_ref().map(SimEngine::status)
    }

    /// Whether the node is running (not crashed).
    pub fn is_up(&self, node: NodeId) -> bool {
        self.node(node).engine.is_some()
    }

    /// The running leader with the highest epoch, if any.
    pub fn leader(&self) -> Option<NodeId> {
        self.node_ids()
            .into_iter()
            .filter_map(|id| self.status(id))
            .filter(|s| s.role == keel_core::leader::Role::Leader)
            .max_by_key(|s| s.epoch)
            .map(|s| s.node_id)
    }

    /// The node's engine, while it runs (for scenario-specific introspection).
    pub fn engine(&self, node: NodeId) -> Option<&E> {
        self.node(node).engine.as_ref()
    }

    fn node(&self, node: NodeId) -> &Node<E> {
        &self.nodes[Self::slot(node)]
    }

    fn slot(node: NodeId) -> usize {
        assert!(node.0 >= 1, "node ids start at 1");
        (node.0 - 1) as usize
    }

    fn push(&mut self, at_ns: u64, event: Event) {
        assert!(at_ns >= self.now_ns, "event scheduled in the past");
        if self.events.len() >= self.config.events_max {
            self.violate("event-queue-full", format!("{} events queued", self.events.len()));
            return;
        }
        self.seq += 1;
        self.events.insert((at_ns, self.seq), event);
    }

    /// Sets a timer that fires as [`Notice::Timer`] at virtual time `at_ns`.
    pub fn set_timer(&mut self, at_ns: u64, id: u64) {
        self.push(at_ns.max(self.now_ns), Event::Timer { id });
    }

    /// Sends a client request to `node`; the reply comes back as a [`Notice::Reply`]
    /// carrying the returned tag (the node may be down: then no reply ever comes).
    pub fn submit(&mut self, node: NodeId, mut request: ClientRequest) -> RequestTag {
        let tag = RequestTag(self.next_tag);
        self.next_tag += 1;
        request.tag = tag;
        let at = self.now_ns + self.config.client_latency_ns;
        self.push(at, Event::Request { node, request });
        tag
    }

    /// The time of the next event, if any.
    pub fn next_event_ns(&self) -> Option<u64> {
        self.events.keys().next().map(|k| k.0)
    }

    /// Processes the next event; returns what it reports to the driver, if anything.
    /// `None` with an empty queue means the world has stopped.
    pub fn step(&mut self) -> Option<Notice> {
        let ((at_ns, _), event) = self.events.pop_first()?;
        debug_assert!(at_ns >= self.now_ns, "time went backwards");
        self.now_ns = at_ns;
        self.stats.events += 1;
        if let Some(node) = event.node() {
            let paused_until = self.node(node).paused_until_ns;
            if paused_until > at_ns {
                self.stats.deferred += 1;
                let event = match event {
                    Event::Deliver { from, to, message, arrived: false } => {
                        if !self.net.arrived(from, to) {
                            return None;
                        }
                        Event::Deliver { from, to, message, arrived: true }
                    }
                    other => other,
                };
                self.push(paused_until, event);
                return None;
            }
        }
        self.dispatch(event)
    }

    /// Processes every event up to and including virtual time `until_ns`, then sets
    /// the clock there; returns the notices in order.
    pub fn run_until(&mut self, until_ns: u64) -> Vec<Notice> {
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

    fn dispatch(&mut self, event: Event) -> Option<Notice> {
        match event {
            Event::Deliver { from, to, message, arrived } => {
                if arrived || self.net.arrived(from, to) {
                    self.step_node(to, Input::Message { from, message });
                }
            }
            Event::Tick { node, incarnation } => self.on_tick(node, incarnation),
            Event::Synced { node, incarnation, index } => self.on_synced(node, incarnation, index),
            Event::SnapshotSaved { node, incarnation, meta } => {
                if self.node(node).incarnation == incarnation {
                    self.step_node(node, Input::SnapshotSaved { meta });
                }
            }
            Event::Request { node, request } => {
                if self.is_up(node) {
                    self.nodes[Self::slot(node)].pending_tags.insert(request.tag);
                    self.step_node(node, Input::Client(request));
                }
            }
            Event::Reply { node, reply } => return Some(Notice::Reply { node, reply }),
            Event::Timer { id } => return Some(Notice::Timer { id }),
            Event::Crash { node, restart_at_ns } => {
                self.crash(node);
                self.push(restart_at_ns, Event::Restart { node });
            }
            Event::Restart { node } => self.restart(node),
        }
        None
    }

    fn on_tick(&mut self, node: NodeId, incarnation: u64) {
        let n = &self.nodes[Self::slot(node)];
        // A tick deferred by a pause fires later than planned; one planned later than now
        // belongs to a newer schedule, and this one was superseded.
        if n.incarnation != incarnation || n.tick_at_ns.is_none_or(|t| t > self.now_ns) {
            return;
        }
        self.nodes[Self::slot(node)].tick_at_ns = None;
        self.step_node(node, Input::Tick);
    }

    fn on_synced(&mut self, node: NodeId, incarnation: u64, index: LogIndex) {
        let n = &mut self.nodes[Self::slot(node)];
        if n.incarnation != incarnation || n.engine.is_none() {
            return;
        }
        let synced = n.disk.sync(index);
        self.step_node(node, Input::LogSynced { index: synced });
    }

    /// Steps a running node's engine with one input and carries out the outputs.
    fn step_node(&mut self, node: NodeId, input: Input) {
        let slot = Self::slot(node);
        let now = self.now_ns;
        let n = &mut self.nodes[slot];
        let local = n.clock.local(now);
        let Some(engine) = n.engine.as_mut() else {
            return; // crashed: the input is lost
        };
        let trace = self.trace.then(|| format!("{now:>12} {node} <- {input:?}"));
        let outputs = engine.step(local, input);
        if let Some(line) = trace {
            eprintln!("{line}\n{:>12} {node} -> {outputs:?}", "");
        }
        self.stats.steps += 1;
        self.carry_out(node, outputs);
        self.observe(node);
    }

    fn observe(&mut self, node: NodeId) {
        let n = &self.nodes[Self::slot(node)];
        let Some(engine) = n.engine.as_ref() else { return };
        let status = engine.status();
        let digest = engine.applied_digest();
        let synced = n.disk.synced_index();
        assert_eq!(status.node_id, node, "engine reports another node's id");
        if status.persisted_index > synced {
            let detail =
                format!("{node} reports persisted {} > fsynced {synced}", status.persisted_index);
            self.violate("contract-persisted", detail);
        }
        let now = self.now_ns;
        self.checker.observe(&status, digest, now);
    }

    /// Carries out one step's outputs in the contract's order (see [`Outputs`]).
    fn carry_out(&mut self, node: NodeId, out: Outputs) {
        let slot = Self::slot(node);
        let now = self.now_ns;
        if let Some(hard_state) = out.hard_state {
            self.nodes[slot].disk.write_hard_state(hard_state);
        }
        if let Some(index) = out.truncate_after {
            self.nodes[slot].disk.truncate_after(index);
            self.checker.truncate(node, index);
        }
        self.nodes[slot].disk.append(&out.append);
        for entry in &out.append {
            self.checker.append(node, entry, now);
        }
        if let Some(index) = out.sync_through {
            // A snapshot in the same outputs may cover the index (an installed snapshot).
            let covered = out.snapshot.as_ref().is_some_and(|(meta, _)| meta.last_index >= index);
            self.request_sync(node, index, covered);
        }
        if let Some((meta, data)) = out.snapshot {
            self.save_snapshot(node, meta, data);
        }
        for (to, message) in out.messages {
            self.send(node, to, message);
        }
        for reply in out.replies {
            self.reply(node, reply);
        }
        if let Some(wake_at) = out.wake_at {
            self.schedule_tick(node, wake_at);
        }
    }

    fn request_sync(&mut self, node: NodeId, index: LogIndex, covered_by_snapshot: bool) {
        let now = self.now_ns;
        let n = &mut self.nodes[Self::slot(node)];
        if index > n.disk.last_index() && !covered_by_snapshot {
            let detail =
                format!("{node} asks to sync {index} beyond its log {}", n.disk.last_index());
            self.violate("contract-sync", detail);
            return;
        }
        let factor = if n.disk_slow_until_ns > now { n.disk_slow_factor } else { 1 };
        // Fsyncs complete in order: one disk, one queue.
        let done = (now + n.fsync_ns * factor).max(n.sync_done_ns_last);
        n.sync_done_ns_last = done;
        let incarnation = n.incarnation;
        self.push(done, Event::Synced { node, incarnation, index });
    }

    fn save_snapshot(&mut self, node: NodeId, meta: SnapshotMeta, data: SnapshotBytes) {
        // The snapshot reaches the disk at once; the engine learns of it after an fsync.
        let n = &mut self.nodes[Self::slot(node)];
        n.disk.save_snapshot(meta, &data);
        let done = self.now_ns + n.fsync_ns;
        let incarnation = n.incarnation;
        self.checker.reset_to_snapshot(node, meta);
        self.push(done, Event::SnapshotSaved { node, incarnation, meta });
    }

    fn send(&mut self, from: NodeId, to: NodeId, message: Message) {
        self.check_message(from, to, &message);
        if matches!(message, Message::Vote { granted: true, .. })
            && self.config.crash_after_vote_ppm > 0
        {
            let rng = &mut self.nodes[Self::slot(from)].rng;
            if rng.chance(self.config.crash_after_vote_ppm) {
                let restart_at_ns = self.now_ns + rng.range(1_000_000, 50_000_000);
                self.push(self.now_ns, Event::Crash { node: from, restart_at_ns });
            }
        }
        for delay in self.net.send(from, to) {
            let at = self.now_ns + delay;
            self.push(at, Event::Deliver { from, to, message: message.clone(), arrived: false });
        }
    }

    /// The contract's message-side checks: state a message depends on is on disk.
    fn check_message(&mut self, from: NodeId, to: NodeId, message: &Message) {
        let n = &self.nodes[Self::slot(from)];
        let hard = n.disk.hard_state();
        let synced = n.disk.synced_index();
        let epoch = message_epoch(message);
        let mut breaches = Vec::new();
        if epoch > hard.epoch {
            breaches
                .push(format!("{from} sends in epoch {epoch} but persisted only {}", hard.epoch));
        }
        match message {
            Message::Vote { epoch, granted: true } => {
                let expected = HardState { epoch: *epoch, voted_for: Some(to) };
                if hard != expected {
                    breaches.push(format!("{from} grants {to} a vote without persisting it"));
                }
            }
            Message::RequestVote { epoch, .. }
                if hard.voted_for != Some(from) || hard.epoch != *epoch =>
            {
                breaches.push(format!("{from} campaigns without persisting its own vote"));
            }
            Message::AppendReply { persisted_index, .. } if *persisted_index > synced => {
                breaches
                    .push(format!("{from} claims persisted {persisted_index} > fsynced {synced}"));
            }
            Message::Append { entries, .. } => {
                let log = self.checker.log(from);
                if let Some(e) = entries.iter().find(|e| log.epoch_at(e.index) != Some(e.epoch)) {
                    breaches.push(format!("{from} sends entry {} not in its log", e.version()));
                }
            }
            _ => {}
        }
        for detail in breaches {
            self.violate("contract-message", detail);
        }
    }

    fn reply(&mut self, node: NodeId, reply: ClientReply) {
        if !self.nodes[Self::slot(node)].pending_tags.remove(&reply.tag) {
            self.violate("contract-reply", format!("{node} answers unknown tag {:?}", reply.tag));
            return;
        }
        let at = self.now_ns + self.config.client_latency_ns;
        self.push(at, Event::Reply { node, reply });
    }

    fn schedule_tick(&mut self, node: NodeId, wake_at: Time) {
        let now = self.now_ns;
        let n = &mut self.nodes[Self::slot(node)];
        let at = n.clock.virtual_at(wake_at).max(now);
        if n.tick_at_ns.is_some_and(|t| t <= at) {
            return; // an earlier tick is already due
        }
        n.tick_at_ns = Some(at);
        let incarnation = n.incarnation;
        self.push(at, Event::Tick { node, incarnation });
    }

    /// Crashes a node: volatile state and unsynced writes are lost; in-flight inputs to
    /// it are dropped. No effect on a node already down.
    pub fn crash(&mut self, node: NodeId) {
        let torn_tail = self.config.torn_tail;
        if !self.is_up(node) {
            return;
        }
        self.maybe_corrupt(node);
        let n = &mut self.nodes[Self::slot(node)];
        n.engine = None;
        n.incarnation += 1;
        n.tick_at_ns = None;
        n.pending_tags.clear();
        n.recovered = n.disk.crash(&mut n.rng, torn_tail);
        let snapshot = n.recovered.snapshot.as_ref().map(|(m, _)| *m);
        let entries = n.recovered.entries.clone();
        self.checker.recover(node, snapshot, &entries);
        self.stats.crashes += 1;
    }

    /// With corruption armed and none injected yet, sometimes flips a bit in one of the
    /// last fsynced records of `node` (still running), so its recovery cuts the log there.
    fn maybe_corrupt(&mut self, node: NodeId) {
        if self.corruption == Corruption::Off || self.corrupted.is_some() {
            return;
        }
        let n = &mut self.nodes[Self::slot(node)];
        let synced = n.disk.synced_index();
        if synced == LogIndex::ZERO || !n.rng.chance(CORRUPT_PER_CRASH_PPM) {
            return;
        }
        let depth = n.rng.range(0, CORRUPT_DEPTH_MAX.min(synced.0));
        let index = LogIndex(synced.0 - depth);
        if self.corruption == Corruption::Guarded && !self.held_by_majority_of_others(node, synced)
        {
            return;
        }
        if self.nodes[Self::slot(node)].disk.corrupt_entry(index) {
            self.corrupted = Some((node, index));
        }
    }

    /// Whether, not counting `node`, a majority of the cluster durably holds `node`'s
    /// entry at `index` (hence, by log matching, its whole log through `index`).
    fn held_by_majority_of_others(&self, node: NodeId, index: LogIndex) -> bool {
        let epoch = self.checker.log(node).epoch_at(index);
        assert!(epoch.is_some(), "{node} has synced {index} but its model lacks it");
        let holders = self
            .node_ids()
            .into_iter()
            .filter(|&m| m != node)
            .filter(|&m| {
                self.node(m).disk.synced_index() >= index
                    && self.checker.log(m).epoch_at(index) == epoch
            })
            .count();
        debug_assert!(holders < self.config.nodes as usize);
        holders > self.config.nodes as usize / 2
    }

    /// Restarts a crashed node from what its disk kept. No effect on a running node.
    pub fn restart(&mut self, node: NodeId) {
        let now = self.now_ns;
        let mut config = self.config.engine.clone();
        config.node_id = node;
        config.members = self.node_ids();
        let n = &mut self.nodes[Self::slot(node)];
        if n.engine.is_some() {
            return;
        }
        let seed = n.rng.next_u64();
        let persisted = std::mem::take(&mut n.recovered);
        n.engine = Some(E::boot(config, persisted, seed, n.clock.local(now)));
        self.step_node(node, Input::Tick);
    }

    /// Pauses a node (a stalled process) until `until_ns`: its events wait.
    pub fn pause(&mut self, node: NodeId, until_ns: u64) {
        let n = &mut self.nodes[Self::slot(node)];
        n.paused_until_ns = n.paused_until_ns.max(until_ns);
    }

    /// Slows a node's clock to `drift_ppm` from now on (its reading now is unchanged).
    /// Beyond the engine's drift bound this is a fault the protocol does not tolerate;
    /// negative tests use it.
    pub fn slow_clock(&mut self, node: NodeId, drift_ppm: i32) {
        let now = self.now_ns;
        let n = &mut self.nodes[Self::slot(node)];
        n.clock = n.clock.with_drift_from(now, drift_ppm);
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

/// The sender's epoch carried by every peer message.
pub fn message_epoch(message: &Message) -> Epoch {
    match message {
        Message::RequestVote { epoch, .. }
        | Message::Vote { epoch, .. }
        | Message::PreVote { epoch, .. }
        | Message::PreVoteReply { epoch, .. }
        | Message::Append { epoch, .. }
        | Message::AppendReply { epoch, .. }
        | Message::InstallSnapshot { epoch, .. }
        | Message::InstallSnapshotReply { epoch, .. }
        | Message::Forward { epoch, .. }
        | Message::ForwardReply { epoch, .. } => *epoch,
    }
}
