//! Kite's scenarios' view of the one simulated world (`crate::world::World<KiteEngine>`):
//! a cluster of Kite engines whose network delays, loses, duplicates, stalls and cuts
//! links, whose nodes sleep (the paper's failure study) or crash by a power loss and
//! restart from their disk as the next incarnation, and which lets a scripted scenario
//! drop, delay or hold chosen messages.
//!
//! Everything happens in the world the leader engine runs in: each node runs the loop
//! body a server runs (`keel_exec::Replica`: the engine, the executor's front and its
//! hard-state barrier, the link allowances) over the simulated write-ahead log, which
//! keeps what a Kite keyspace keeps, its incarnation, in the hard state; every message
//! crosses the real codec; reads are answered off the loop as a server's connection
//! answers them. What the world checks of a Kite keyspace is its watch
//! (`super::sim::KiteWatch`). This module adds what Kite's scripted scenarios ask:
//! sessions' requests at a time to come, replies gathered with their time, sleeps that
//! start later, and the network described as Kite's scenarios draw it ([`NetConfig`]).

use super::sim::KiteWatch;
use crate::disk::HardStateMode;
use crate::invariants::Violation;
use crate::net::NetStats;
use crate::world::{Notice, World, WorldConfig, WorldStats};
use keel_core::engine::RequestTag;
use keel_core::kite::{Config, KiteEngine, KiteOp, KiteReply, KiteRequest, Message, ReplyForm};
use keel_types::NodeId;
use std::collections::BTreeMap;

pub use crate::world::{CpuCost, Fate};

/// A scripted rule: `(from, to, message) -> fate`.
pub type DropRule = crate::world::MessageRule<Message>;

/// How the network behaves, as Kite's scenarios draw it; the world's network model
/// (`crate::net::NetConfig`) carries it: every message's delay uniform in
/// `[delay_min, delay_max)`, losses, duplicates and stalls at their rates.
#[derive(Clone, Debug)]
pub struct NetConfig {
    /// Shortest one-way delay, ns.
    pub delay_min: u64,
    /// Longest ordinary one-way delay, ns.
    pub delay_max: u64,
    /// Chance a message is lost, parts per million.
    pub drop_ppm: u32,
    /// Chance a message is held back long (a retransmission stall), ppm.
    pub stall_ppm: u32,
    /// The longest such stall, ns.
    pub stall_max: u64,
    /// Chance a message is delivered twice (the second copy after a delay of its own), ppm.
    pub dup_ppm: u32,
    /// The client values each link holds in flight at most (`keel_exec::LinkAllowance`;
    /// a message carrying more while it is full is shed, as a server sheds it).
    pub link_bulk_bytes_max: usize,
    /// Negative control: links refuse no client values
    /// (`keel_exec::LinkAllowance::unsafe_unbounded`).
    pub unsafe_unbounded_links: bool,
    /// The share of relaxed reads (ppm) a node answers off its loop, as a server's
    /// connection does when the session has nothing waiting (`Engine::read_now`; the
    /// engine's counters do not see them, so scripted scenarios that count paths keep it
    /// at 0).
    pub reads_off_loop_ppm: u32,
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            delay_min: 50_000,
            delay_max: 400_000,
            drop_ppm: 0,
            stall_ppm: 0,
            stall_max: 0,
            dup_ppm: 0,
            link_bulk_bytes_max: keel_exec::LINK_BULK_BYTES_MAX,
            unsafe_unbounded_links: false,
            reads_off_loop_ppm: 0,
        }
    }
}

impl NetConfig {
    /// The world's network model for this description.
    fn model(&self) -> crate::net::NetConfig {
        let stall_floor = crate::net::STALL_NS_MIN + 1;
        crate::net::NetConfig {
            latency_ns_min: self.delay_min,
            latency_ns_max: self.delay_min + 1,
            jitter_ns_max: self.delay_max.saturating_sub(self.delay_min).max(1),
            loss_ppm: self.drop_ppm,
            duplicate_ppm: self.dup_ppm,
            messages_in_flight_max: 1_000_000,
            stall_ppm: self.stall_ppm,
            stall_ns_max: (crate::net::STALL_NS_MIN + self.stall_max).max(stall_floor),
        }
    }
}

/// How long a node's fsync takes (a Kite keyspace syncs only its incarnation, once a
/// boot).
const FSYNC_NS: u64 = 1_000_000;

/// Something a scripted scenario asked to happen later.
enum Later {
    Request(NodeId, KiteRequest),
    Pause(NodeId, u64),
}

/// The cluster.
pub struct KiteWorld {
    world: World<KiteEngine>,
    replies: Vec<(u64, NodeId, KiteReply)>,
    later: BTreeMap<u64, Later>,
    next_later: u64,
}

impl KiteWorld {
    /// A cluster of nodes 1..=n booted with `template` (its `node` and `members` are set
    /// per node), clocks drifting within 200 ppm of true time when `clocks_drift`
    /// (`SimEngine::drift_bound_ppm`), keeping it otherwise.
    pub fn new(
        n: u32,
        template: &Config,
        seed: u64,
        net: NetConfig,
        clocks_drift: bool,
    ) -> KiteWorld {
        let config = WorldConfig {
            engine: template.clone(),
            nodes: n,
            net: net.model(),
            client_latency_ns: 0,
            fsync_ns_min: FSYNC_NS,
            fsync_ns_max: FSYNC_NS + 1,
            clock_offset_ns_max: 1_000_000_000,
            hard_state_mode: HardStateMode::Sync,
            torn_tail: false,
            events_max: 50_000_000,
            crash_after_vote_ppm: 0,
            late_open_copy_ppm: 0,
            keyspaces: 1,
            unsafe_skip_truncation_clamp: false,
            spread_leaders: false,
            reads_off_loop_ppm: net.reads_off_loop_ppm,
            process_crash_ppm: 0,
            clock_reboot_ppm: 0,
            drift_change_ppm: 0,
            fault_seed: 0,
            link_bulk_bytes_max: net.link_bulk_bytes_max,
            unsafe_unbounded_links: net.unsafe_unbounded_links,
            forwarded_replies_bytes_max: keel_exec::FORWARDED_REPLIES_BYTES_MAX,
            voters: 0,
            replicas: 0,
            wall_skew_ms_max: 0,
        };
        let mut world = World::new(config, seed);
        if !clocks_drift {
            for node in world.node_ids() {
                world.set_clock_drift(node, 0);
            }
        }
        KiteWorld { world, replies: Vec::new(), later: BTreeMap::new(), next_later: 1 }
    }

    /// Runs until every node has rejoined after the cluster's boot (a cluster booting at
    /// once, every node rejoining with nothing to read, starts after a grace period,
    /// `docs/kite.md`, Restarts), at most 10 s: for scenarios about a cluster already
    /// serving. Whether it did.
    pub fn settle_boot(&mut self) -> bool {
        let serving = |w: &KiteWorld| {
            w.members()
                .into_iter()
                .all(|node| w.engine(node).is_none_or(|e| !e.epoch_and_rejoining().1))
        };
        self.run_while(self.now() + 10_000_000_000, serving)
    }

    /// Global virtual time, ns.
    pub fn now(&self) -> u64 {
        self.world.now_ns()
    }

    /// The members.
    pub fn members(&self) -> Vec<NodeId> {
        self.world.node_ids()
    }

    /// The nodes not crashed.
    pub fn live(&self) -> Vec<NodeId> {
        self.members().into_iter().filter(|&node| self.world.is_up(node)).collect()
    }

    /// A node's engine (`None`: crashed).
    pub fn engine(&self, node: NodeId) -> Option<std::sync::RwLockReadGuard<'_, KiteEngine>> {
        self.world.engine(node)
    }

    /// Installs (or removes) a scripted drop rule.
    pub fn set_drop_rule(&mut self, rule: Option<DropRule>) {
        self.world.set_message_rule(rule);
    }

    /// Cuts the directed link `from -> to`.
    pub fn cut(&mut self, from: NodeId, to: NodeId) {
        self.world.net.cut_one_way(&[from], &[to]);
    }

    /// Restores the directed link `from -> to`.
    pub fn uncut(&mut self, from: NodeId, to: NodeId) {
        self.world.net.uncut(from, to);
    }

    /// Cuts every link between `node` and the others, both ways.
    pub fn isolate(&mut self, node: NodeId) {
        let members = self.members();
        self.world.net.isolate(node, &members);
    }

    /// Restores every link, and ends every hold.
    pub fn heal(&mut self) {
        self.world.net.heal();
        for (from, to) in self.world.held_links() {
            self.world.release(from, to);
        }
    }

    /// Splits the cluster in two: `side` and the other members, every link between them
    /// cut both ways, every other link restored.
    pub fn partition(&mut self, side: &[NodeId]) {
        let others: Vec<NodeId> =
            self.members().into_iter().filter(|node| !side.contains(node)).collect();
        self.world.net.heal();
        self.world.net.partition(side, &others);
    }

    /// Holds the directed link `from -> to`: what is sent on it from now on waits until
    /// [`KiteWorld::release`], even if `from` crashes and restarts in between (then it is
    /// a late message of an earlier incarnation). Messages already on their way arrive.
    pub fn hold(&mut self, from: NodeId, to: NodeId) {
        self.world.hold(from, to);
    }

    /// Ends the hold of `from -> to`: what it held leaves now, in the order it was sent
    /// (each after the network's ordinary delay, lost if the link is cut by then).
    pub fn release(&mut self, from: NodeId, to: NodeId) {
        self.world.release(from, to);
    }

    /// Puts `node` to sleep until `until` (global ns): it handles nothing meanwhile; what
    /// arrives waits for it.
    pub fn pause(&mut self, node: NodeId, until: u64) {
        self.world.pause(node, until);
    }

    /// Puts `node` to sleep from `at` until `until` (global ns).
    pub fn pause_later(&mut self, node: NodeId, at: u64, until: u64) {
        self.later_at(at, Later::Pause(node, until));
    }

    /// Crashes `node` by a power loss: its memory, pending work and unsynced writes are
    /// gone; it stays down until [`KiteWorld::restart`].
    pub fn crash(&mut self, node: NodeId) {
        self.world.crash(node);
    }

    /// Boots a crashed `node` again from its disk as its next incarnation, which rejoins:
    /// it has lost its memory, and reads its peers' state before it serves
    /// (`docs/kite.md`, Restarts). Messages already in flight to it arrive at the new
    /// incarnation.
    pub fn restart(&mut self, node: NodeId) {
        if self.world.is_up(node) {
            return;
        }
        self.world.unpause(node);
        self.world.restart(node);
    }

    /// Submits `op` in `session` at `node` now; returns the tag its reply will carry.
    pub fn submit(&mut self, node: NodeId, session: u64, op: KiteOp) -> RequestTag {
        self.submit_named(node, session, op, None)
    }

    /// Submits `op` as [`KiteWorld::submit`], named by its client (`session` being the
    /// client's id) as request `named` when given, as `KEEL.REQ` does.
    pub fn submit_named(
        &mut self,
        node: NodeId,
        session: u64,
        op: KiteOp,
        named: Option<u64>,
    ) -> RequestTag {
        self.submit_form(node, session, op, named, ReplyForm::default())
    }

    /// Submits `op` as [`KiteWorld::submit_named`], its reply shown as `form` asks.
    pub fn submit_form(
        &mut self,
        node: NodeId,
        session: u64,
        op: KiteOp,
        named: Option<u64>,
        form: ReplyForm,
    ) -> RequestTag {
        let request = KiteRequest { tag: RequestTag(0), session, op, form, named };
        self.world.submit(node, request)
    }

    /// Submits `op` as [`KiteWorld::submit`], arriving at global time `at` (or now, if
    /// that has passed); returns the tag its reply will carry.
    pub fn submit_at(&mut self, at: u64, node: NodeId, session: u64, op: KiteOp) -> RequestTag {
        if at <= self.now() {
            return self.submit(node, session, op);
        }
        let tag = self.world.reserve_tag();
        let request = KiteRequest { tag, session, op, form: Default::default(), named: None };
        self.later_at(at, Later::Request(node, request));
        tag
    }

    fn later_at(&mut self, at: u64, what: Later) {
        let id = self.next_later;
        self.next_later += 1;
        self.later.insert(id, what);
        self.world.set_timer(at, id);
    }

    /// Replies delivered so far (global time, node, reply), emptied.
    pub fn take_replies(&mut self) -> Vec<(u64, NodeId, KiteReply)> {
        std::mem::take(&mut self.replies)
    }

    /// Runs events up to global time `until` (inclusive).
    pub fn run_until(&mut self, until: u64) {
        self.run_while(until, |_| false);
    }

    /// Runs until `done` holds (checked after each event) or `until` passes; whether it held.
    pub fn run_while(&mut self, until: u64, mut done: impl FnMut(&KiteWorld) -> bool) -> bool {
        while let Some(at) = self.world.next_event_ns() {
            if done(self) {
                return true;
            }
            if at > until {
                break;
            }
            if let Some(notice) = self.world.step() {
                self.notice(notice);
            }
        }
        self.world.advance_to(until.max(self.now()));
        done(self)
    }

    fn notice(&mut self, notice: Notice<KiteReply>) {
        match notice {
            Notice::Reply { node, reply, .. } => self.replies.push((self.now(), node, reply)),
            Notice::Timer { id } => match self.later.remove(&id).expect("a timer set here") {
                Later::Request(node, request) => self.world.submit_tagged(node, request),
                Later::Pause(node, until) => self.pause(node, until),
            },
        }
    }

    /// Loses nothing and stalls nothing more from now on (a run's quiet end).
    pub fn calm_network(&mut self) {
        self.world.net.calm();
    }

    /// Steps take time from now on ([`CpuCost`]).
    pub fn set_cpu(&mut self, cpu: CpuCost) {
        self.world.cpu = Some(cpu);
    }

    /// What the world checks of the keyspace: every commit, the ids requests went by.
    pub fn watch(&self) -> &KiteWatch {
        self.world.checker()
    }

    /// What the world's checks found (the contract's, the codec's, the gate's, the link
    /// allowances', the watch's): must stay empty.
    pub fn violations(&self) -> &[Violation] {
        self.world.violations()
    }

    /// What the world and its network did (for reports and coverage).
    pub fn stats(&self) -> (&WorldStats, &NetStats) {
        (&self.world.stats, &self.world.net.stats)
    }
}
