//! A cluster of Kite engines on virtual time: a network that delays, drops, stalls and
//! cuts links, nodes that sleep (the paper's failure study) or crash for good, clocks
//! that drift, and a hook that lets a scripted scenario drop chosen messages.
//!
//! A node runs the loop body a server runs (`keel_exec::Replica`: the engine, the
//! executor's front and its hard-state barrier) over a disk of its own
//! (`keel_exec::VirtualDisk` over the simulated write-ahead log), which keeps what a
//! Kite keyspace keeps: its incarnation, in the hard state. A node boots, and reboots
//! after a crash, through the engine interface from what its disk recovered
//! (`Engine::boot`: one incarnation past the last one on disk, rejoining), and its
//! messages wait until that incarnation is on disk, as in a server. A crash loses the
//! node's memory and every disk write not yet synced.

use crate::rng::Rng;
use keel_core::engine::{Engine, Input, PersistedState, RequestTag};
use keel_core::kite::{
    Config, KiteEngine, KiteOp, KiteReply, KiteRequest, Message, RmwId, RmwOutcome,
};
use keel_core::time::Time;
use keel_exec::{AppendHold, Front, Io, LinkAllowance, LinkHold, Replica, VirtualDisk};
use keel_storage::{SimStorage, Storage, StorageConfig};
use keel_types::{NoRecord, NodeId};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// What a scripted rule does with one message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// The network's ordinary treatment.
    Pass,
    /// Lost.
    Drop,
    /// Held back this many ns more than usual.
    Delay(u64),
}

/// A scripted rule: `(from, to, message) -> fate`.
pub type DropRule = Box<dyn FnMut(NodeId, NodeId, &Message) -> Fate>;

/// How the network behaves.
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
        }
    }
}

#[derive(Debug)]
enum Event {
    Deliver {
        to: NodeId,
        from: NodeId,
        /// The sender's incarnation when it sent the message.
        incarnation: u32,
        message: Box<Message>,
        /// Its hold on the link's allowance, if it carries client values: every copy
        /// holds it until the last is delivered or lost.
        hold: Option<Arc<LinkHold>>,
    },
    Wake {
        node: NodeId,
    },
    /// The node's disk finished something.
    Disk {
        node: NodeId,
    },
    Client {
        node: NodeId,
        request: KiteRequest,
    },
    Pause {
        node: NodeId,
        until: u64,
    },
    /// A sleeping node's wake-up: it handles what waited for it, in arrival order.
    Resume {
        node: NodeId,
    },
}

/// How long a node's fsync takes (a Kite keyspace syncs only its incarnation, once a
/// boot).
const FSYNC_NS: u64 = 1_000_000;

/// What leaves a replica during one step, in order, for the world to carry out.
struct Left<'a> {
    messages: Vec<(NodeId, Message, Option<LinkHold>)>,
    replies: Vec<KiteReply>,
    rejected: Vec<&'static str>,
    rmws: Vec<(RequestTag, RmwId)>,
    /// The sender's links to its peers.
    links: &'a BTreeMap<NodeId, LinkAllowance>,
    /// Holds granted past a link's allowance beside another value on the way.
    over_allowance: Vec<String>,
}

impl Io<KiteEngine> for Left<'_> {
    fn send(&mut self, to: NodeId, message: Message) {
        self.messages.push((to, message, None));
    }

    fn send_bulk(&mut self, to: NodeId, message: Message, bulk: usize) -> Result<(), Message> {
        let link = self.links.get(&to).unwrap_or_else(|| panic!("message to non-member {to}"));
        let before = link.held();
        let Some(hold) = link.hold(bulk) else { return Err(message) };
        if before > 0 && before + bulk > link.max() {
            let max = link.max();
            self.over_allowance.push(format!("-> {to}: {bulk} bytes beside {before}, past {max}"));
        }
        self.messages.push((to, message, Some(hold)));
        Ok(())
    }

    fn reply(&mut self, reply: KiteReply) {
        self.replies.push(reply);
    }

    fn prepare(&mut self, _: keel_types::SnapshotMeta, _: keel_core::engine::SnapshotBytes) {
        unreachable!("a Kite keyspace takes no snapshot");
    }

    fn rejected(&mut self, rejection: keel_core::engine::Rejection) {
        self.rejected.push(rejection.reason);
    }

    fn observe(&mut self, engine: &KiteEngine) {
        engine.check_invariants();
        self.rmws.extend(engine.rmws_in_progress());
    }
}

/// A message on a held link: the sender's incarnation, the message, its share of the
/// link's allowance.
type HeldMessage = (u32, Message, Option<Arc<LinkHold>>);

/// A node's allowances for its links to the other members.
fn fresh_links(members: &[NodeId], me: NodeId, net: &NetConfig) -> BTreeMap<NodeId, LinkAllowance> {
    let link = || {
        let link = LinkAllowance::new(net.link_bulk_bytes_max);
        if net.unsafe_unbounded_links {
            link.unsafe_unbounded()
        } else {
            link
        }
    };
    members.iter().filter(|&&peer| peer != me).map(|&peer| (peer, link())).collect()
}

/// A node's disk: the simulated write-ahead log, on virtual time.
fn fresh_disk() -> VirtualDisk<SimStorage<NoRecord>> {
    VirtualDisk::new(SimStorage::new_sim(StorageConfig::small_segments(64 * 1024)))
}

struct SimNode {
    /// The loop body (`None`: crashed).
    replica: Option<Replica<KiteEngine>>,
    disk: VirtualDisk<SimStorage<NoRecord>>,
    /// When its disk's next completion is due, if one is scheduled.
    disk_at: Option<u64>,
    /// Local clock: `offset + global * (1e6 + drift_ppm) / 1e6`.
    offset: u64,
    drift_ppm: i64,
    paused_until: u64,
    wake: Option<u64>,
    /// What arrived while it slept, in order.
    deferred: std::collections::VecDeque<Event>,
    resume_scheduled: bool,
    /// Its links' allowances (new with each incarnation, as a server's peer queues are).
    links: BTreeMap<NodeId, LinkAllowance>,
}

/// A node's processor, for throughput in virtual time (`keel sim bench --engine kite`):
/// each step occupies the node for `step_ns` plus `message_ns` per message it sends, and
/// what it sends and answers leaves when the step is over. Inputs that arrive meanwhile
/// wait, in arrival order. `None` (the default): steps take no time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuCost {
    /// Each step (a message handled, a request taken, a timer).
    pub step_ns: u64,
    /// Each message sent.
    pub message_ns: u64,
}

/// What the network did, for reports and coverage.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct NetCounters {
    /// Steps after which a node's messages and replies waited behind a hard state (its
    /// incarnation) not yet on disk: the executor's barrier at work.
    pub held_behind_hard_state: u64,
    /// Hard states (incarnations) saved.
    pub hard_states_saved: u64,
    /// Boots from a disk that had recorded an earlier incarnation.
    pub boots_from_disk: u64,
    /// Messages sent.
    pub sent: u64,
    /// Their encoded bytes.
    pub bytes: u64,
    /// Lost by chance.
    pub dropped: u64,
    /// Lost to a cut link or a crashed receiver.
    pub cut: u64,
    /// Dropped by a scripted rule.
    pub scripted: u64,
    /// Held back long.
    pub stalled: u64,
    /// Delivered twice.
    pub duplicated: u64,
    /// Held on a held link ([`KiteWorld::hold`]).
    pub held: u64,
    /// Shed at the sender: they carried client values while their link held its
    /// allowance (`keel_exec::Replica`'s shedding).
    pub shed: u64,
    /// Delivered after their sender restarted: sent by an earlier incarnation.
    pub late_from_earlier_incarnation: u64,
    /// Of those, replies (they answer a round of the receiver: a late acknowledgement).
    pub late_replies: u64,
}

/// The cluster.
pub struct KiteWorld {
    now: u64,
    seq: u64,
    events: BTreeMap<(u64, u64), Event>,
    nodes: BTreeMap<NodeId, SimNode>,
    rng: Rng,
    /// The network's behaviour (may change during a run).
    pub net: NetConfig,
    cuts: BTreeSet<(NodeId, NodeId)>,
    /// Held links, each with what was sent on it since it was held (with the sender's
    /// incarnation then), delivered in order when it is released.
    holds: BTreeMap<(NodeId, NodeId), Vec<HeldMessage>>,
    drop_rule: Option<DropRule>,
    replies: Vec<(u64, NodeId, KiteReply)>,
    next_tag: u64,
    /// What the network did.
    pub counters: NetCounters,
    /// Rejections reported by engines (must stay empty: nodes never send malformed
    /// messages).
    pub rejections: Vec<(NodeId, &'static str)>,
    /// Messages the peer codec or the gate's stateless half did not carry through
    /// unchanged ([`crate::codec::across`]; must stay empty).
    pub codec_failures: Vec<String>,
    /// Client values a link took past its allowance beside another value on the way
    /// (must stay empty: the memory a slow peer makes a node hold is bounded).
    pub over_allowance: Vec<String>,
    /// Every read-modify-write some node committed (a commit is sent only once the
    /// record was chosen), by request: what a request whose node crashed before it could
    /// answer did, for the history.
    pub commits: BTreeMap<RmwId, RmwOutcome>,
    /// Requests committed twice with different stamps (applied twice): must stay empty.
    pub double_commits: Vec<(RmwId, keel_core::kite::Stamp, keel_core::kite::Stamp)>,
    /// The id each read-modify-write request went by, once started.
    pub rmw_ids: BTreeMap<RequestTag, RmwId>,
    /// What every node booted with (restarts boot a later incarnation of it).
    template: Config,
    incarnations: BTreeMap<NodeId, u32>,
    /// Restarts so far.
    pub restarts: u64,
    /// The processor model, if steps take time ([`CpuCost`]).
    pub cpu: Option<CpuCost>,
}

impl KiteWorld {
    /// A cluster of nodes 1..=n booted with `template` (its `node` and `members` are set
    /// per node), clocks drifting within `drift_ppm_max`.
    pub fn new(
        n: u32,
        template: &Config,
        seed: u64,
        net: NetConfig,
        drift_ppm_max: u32,
    ) -> KiteWorld {
        let mut rng = Rng::new(seed);
        let members: Vec<NodeId> = (1..=n).map(NodeId).collect();
        let mut nodes = BTreeMap::new();
        let mut seeds = Vec::new();
        for &node in &members {
            seeds.push((node, rng.next_u64()));
            let drift = if drift_ppm_max == 0 {
                0
            } else {
                rng.range(0, u64::from(drift_ppm_max) * 2 + 1) as i64 - i64::from(drift_ppm_max)
            };
            nodes.insert(
                node,
                SimNode {
                    replica: None,
                    disk: fresh_disk(),
                    disk_at: None,
                    offset: rng.below(1_000_000_000),
                    drift_ppm: drift,
                    paused_until: 0,
                    wake: None,
                    deferred: Default::default(),
                    resume_scheduled: false,
                    links: fresh_links(&members, node, &net),
                },
            );
        }
        let mut world = KiteWorld {
            now: 0,
            seq: 0,
            events: BTreeMap::new(),
            nodes,
            rng,
            net,
            cuts: BTreeSet::new(),
            holds: BTreeMap::new(),
            drop_rule: None,
            replies: Vec::new(),
            next_tag: 1,
            counters: NetCounters::default(),
            rejections: Vec::new(),
            codec_failures: Vec::new(),
            over_allowance: Vec::new(),
            commits: BTreeMap::new(),
            double_commits: Vec::new(),
            rmw_ids: BTreeMap::new(),
            template: template.clone(),
            incarnations: BTreeMap::new(),
            restarts: 0,
            cpu: None,
        };
        for (node, seed) in seeds {
            world.boot(node, seed);
        }
        world
    }

    /// Runs until every node has rejoined after the cluster's boot (a cluster booting at
    /// once, every node rejoining with nothing to read, starts after a grace period,
    /// `docs/kite.md`, Restarts), at most 10 s: for scenarios about a cluster already
    /// serving. Whether it did.
    pub fn settle_boot(&mut self) -> bool {
        let serving = |w: &KiteWorld| {
            w.nodes
                .values()
                .all(|n| n.replica.as_ref().is_none_or(|r| !r.engine().epoch_and_rejoining().1))
        };
        self.run_while(self.now + 10_000_000_000, serving)
    }

    /// Boots `node` through the engine interface from what its disk recovered, as a
    /// server does: one incarnation past the last one on disk, rejoining.
    fn boot(&mut self, node: NodeId, seed: u64) {
        let mut config = self.template.clone();
        config.node = node;
        config.members = self.members();
        let n = self.nodes.get_mut(&node).expect("node");
        let recovered = n.disk.storage_mut().recover().expect("the simulated WAL recovers");
        let persisted = PersistedState {
            hard_state: recovered.hard_state,
            snapshot: recovered.snapshot,
            entries: recovered.entries,
        };
        let local = Self::local_at(n, self.now);
        self.counters.boots_from_disk += u64::from(persisted.hard_state.epoch.0 > 0);
        let engine = <KiteEngine as Engine>::boot(config, persisted, seed, local).expect("boots");
        self.incarnations.insert(node, engine.config().incarnation);
        let n = self.nodes.get_mut(&node).expect("node");
        n.replica = Some(Replica::new(engine, Front::new(4096), AppendHold::new(0, 1)));
        n.wake = Some(self.now);
        self.schedule(self.now, Event::Wake { node });
    }

    /// Global virtual time, ns.
    pub fn now(&self) -> u64 {
        self.now
    }

    /// The members.
    pub fn members(&self) -> Vec<NodeId> {
        self.nodes.keys().copied().collect()
    }

    /// The nodes not crashed.
    pub fn live(&self) -> Vec<NodeId> {
        self.nodes.iter().filter(|(_, n)| n.replica.is_some()).map(|(&id, _)| id).collect()
    }

    /// A node's engine (`None`: crashed).
    pub fn engine(&self, node: NodeId) -> Option<std::sync::RwLockReadGuard<'_, KiteEngine>> {
        self.nodes.get(&node).and_then(|n| n.replica.as_ref()).map(|r| r.engine())
    }

    /// A draw from the world's generator.
    pub fn rng(&mut self) -> &mut Rng {
        &mut self.rng
    }

    /// Installs (or removes) a scripted drop rule.
    pub fn set_drop_rule(&mut self, rule: Option<DropRule>) {
        self.drop_rule = rule;
    }

    /// Cuts the directed link `from -> to`.
    pub fn cut(&mut self, from: NodeId, to: NodeId) {
        self.cuts.insert((from, to));
    }

    /// Restores the directed link `from -> to`.
    pub fn uncut(&mut self, from: NodeId, to: NodeId) {
        self.cuts.remove(&(from, to));
    }

    /// Cuts every link between `node` and the others, both ways.
    pub fn isolate(&mut self, node: NodeId) {
        for other in self.members() {
            if other != node {
                self.cut(node, other);
                self.cut(other, node);
            }
        }
    }

    /// Restores every link, and ends every hold.
    pub fn heal(&mut self) {
        self.cuts.clear();
        let held: Vec<(NodeId, NodeId)> = self.holds.keys().copied().collect();
        for (from, to) in held {
            self.release(from, to);
        }
    }

    /// Splits the cluster in two: `side` and the other members, every link between them
    /// cut both ways, every other link restored.
    pub fn partition(&mut self, side: &[NodeId]) {
        self.cuts.clear();
        for a in self.members() {
            for b in self.members() {
                if side.contains(&a) != side.contains(&b) {
                    self.cut(a, b);
                }
            }
        }
    }

    /// Holds the directed link `from -> to`: what is sent on it from now on waits until
    /// [`KiteWorld::release`], even if `from` crashes and restarts in between (then it is
    /// a late message of an earlier incarnation). Messages already on their way arrive.
    pub fn hold(&mut self, from: NodeId, to: NodeId) {
        self.holds.entry((from, to)).or_default();
    }

    /// Ends the hold of `from -> to`: what it held leaves now, in the order it was sent
    /// (each after the network's ordinary delay, unless the link is cut by then).
    pub fn release(&mut self, from: NodeId, to: NodeId) {
        let Some(held) = self.holds.remove(&(from, to)) else { return };
        let base =
            self.rng.range(self.net.delay_min, self.net.delay_max.max(self.net.delay_min + 1));
        for (i, (incarnation, message, hold)) in held.into_iter().enumerate() {
            if self.cuts.contains(&(from, to)) {
                self.counters.cut += 1;
                continue;
            }
            let at = self.now + base + i as u64;
            let message = Box::new(message);
            self.schedule(at, Event::Deliver { to, from, incarnation, message, hold });
        }
    }

    /// The current incarnation of `node` (0 until it restarts).
    pub fn incarnation(&self, node: NodeId) -> u32 {
        self.incarnations.get(&node).copied().unwrap_or(0)
    }

    /// Puts `node` to sleep until `until` (global ns): it handles nothing meanwhile; what
    /// arrives waits for it.
    pub fn pause(&mut self, node: NodeId, until: u64) {
        if let Some(n) = self.nodes.get_mut(&node) {
            n.paused_until = n.paused_until.max(until);
        }
    }

    /// Puts `node` to sleep from `at` until `until` (global ns).
    pub fn pause_later(&mut self, node: NodeId, at: u64, until: u64) {
        self.schedule(at.max(self.now), Event::Pause { node, until });
    }

    /// Whether `node` sleeps now.
    pub fn paused(&self, node: NodeId) -> bool {
        self.nodes.get(&node).is_some_and(|n| n.paused_until > self.now)
    }

    /// Crashes `node` for good (crash-stop): its memory and pending work are gone.
    pub fn crash(&mut self, node: NodeId) {
        let members = self.members();
        if let Some(n) = self.nodes.get_mut(&node) {
            n.links = fresh_links(&members, node, &self.net);
            n.replica = None;
            n.disk_at = None;
            n.disk.crash();
            n.disk.storage_mut().crash();
        }
    }

    /// Boots a crashed `node` again as its next incarnation, which rejoins: it has lost
    /// its memory, and reads its peers' state before it serves (`docs/kite.md`,
    /// Restarts). Messages already in flight to it arrive at the new incarnation.
    pub fn restart(&mut self, node: NodeId) {
        let seed = self.rng.next_u64();
        let Some(n) = self.nodes.get_mut(&node) else { return };
        if n.replica.is_some() {
            return;
        }
        n.paused_until = 0;
        n.deferred.clear();
        self.restarts += 1;
        self.boot(node, seed);
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
        self.submit_request(self.now, node, session, op, named)
    }

    /// Submits `op` as [`KiteWorld::submit`], arriving at global time `at` (or now, if
    /// that has passed).
    pub fn submit_at(&mut self, at: u64, node: NodeId, session: u64, op: KiteOp) -> RequestTag {
        self.submit_request(at.max(self.now), node, session, op, None)
    }

    fn submit_request(
        &mut self,
        at: u64,
        node: NodeId,
        session: u64,
        op: KiteOp,
        named: Option<u64>,
    ) -> RequestTag {
        let tag = RequestTag(self.next_tag);
        self.next_tag += 1;
        let request = KiteRequest { tag, session, op, form: Default::default(), named };
        self.schedule(at, Event::Client { node, request });
        tag
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
        while let Some((&(at, seq), _)) = self.events.first_key_value() {
            if done(self) {
                return true;
            }
            if at > until {
                break;
            }
            let event = self.events.remove(&(at, seq)).expect("present");
            self.now = at;
            self.handle(event);
        }
        self.now = self.now.max(until);
        done(self)
    }

    fn schedule(&mut self, at: u64, event: Event) {
        self.seq += 1;
        self.events.insert((at, self.seq), event);
    }

    fn local_at(node: &SimNode, now: u64) -> Time {
        let drifted = (i128::from(now) * i128::from(1_000_000 + node.drift_ppm)) / 1_000_000;
        Time(node.offset + drifted as u64)
    }

    /// The first global time at which `node`'s local clock reads at least `local`.
    fn global_of(node: &SimNode, local: Time) -> u64 {
        let since = local.0.saturating_sub(node.offset);
        let rate = i128::from(1_000_000 + node.drift_ppm);
        ((i128::from(since) * 1_000_000 + rate - 1) / rate) as u64
    }

    fn handle(&mut self, event: Event) {
        let node = match &event {
            Event::Deliver { to, .. } => *to,
            Event::Wake { node } | Event::Client { node, .. } | Event::Disk { node } => *node,
            Event::Pause { node, until } => {
                self.pause(*node, *until);
                return;
            }
            Event::Resume { node } => {
                let node = *node;
                let Some(n) = self.nodes.get_mut(&node) else { return };
                n.resume_scheduled = false;
                if n.paused_until > self.now {
                    let at = n.paused_until;
                    n.resume_scheduled = true;
                    self.schedule(at, Event::Resume { node });
                    return;
                }
                let waiting = std::mem::take(&mut n.deferred);
                for event in waiting {
                    self.handle(event);
                }
                return;
            }
        };
        let Some(n) = self.nodes.get(&node) else { return };
        if n.replica.is_none() {
            if let Event::Deliver { .. } = event {
                self.counters.cut += 1;
            }
            return;
        }
        if n.paused_until > self.now || !n.deferred.is_empty() {
            // Asleep (or still handing over what waited): everything waits until it
            // wakes, in arrival order, as on a TCP connection.
            let at = n.paused_until;
            let n = self.nodes.get_mut(&node).expect("node");
            n.deferred.push_back(event);
            if !n.resume_scheduled {
                n.resume_scheduled = true;
                self.schedule(at.max(self.now), Event::Resume { node });
            }
            return;
        }
        let input = match event {
            Event::Deliver { from, message, incarnation, hold, .. } => {
                drop(hold); // delivered: the link's allowance is given back
                if incarnation < self.incarnation(from) {
                    self.counters.late_from_earlier_incarnation += 1;
                    if is_reply(&message) {
                        self.counters.late_replies += 1;
                    }
                }
                Input::Message { from, message: *message }
            }
            Event::Wake { .. } => {
                let n = self.nodes.get_mut(&node).expect("node");
                if n.wake.is_some_and(|w| w > self.now) {
                    return;
                }
                n.wake = None;
                Input::Tick
            }
            Event::Client { request, .. } => Input::Client(request),
            Event::Disk { .. } => return self.on_disk(node),
            Event::Pause { .. } | Event::Resume { .. } => return,
        };
        self.step(node, input);
    }

    /// The node's disk finished something: the completions go through the replica, which
    /// releases what waited for the hard state and gives the engine its inputs.
    fn on_disk(&mut self, node: NodeId) {
        let now = self.now;
        let n = self.nodes.get_mut(&node).expect("node");
        if n.disk_at.is_none_or(|at| at > now) {
            return; // superseded by an earlier schedule
        }
        n.disk_at = None;
        let completions = n.disk.poll(now, FSYNC_NS).expect("the simulated WAL does not fail");
        let saved = completions
            .iter()
            .filter(|c| matches!(c, keel_exec::Completion::HardStateSaved { .. }));
        self.counters.hard_states_saved += saved.count() as u64;
        if !completions.is_empty() {
            self.drive(node, |replica, local, io| {
                replica.complete(local, &completions, io);
            });
        }
        self.schedule_disk(node);
    }

    fn schedule_disk(&mut self, node: NodeId) {
        let n = self.nodes.get_mut(&node).expect("node");
        let Some(at) = n.disk.next_due_ns() else { return };
        if n.disk_at.is_some_and(|t| t <= at) {
            return; // an earlier poll is already due
        }
        n.disk_at = Some(at);
        let at = at.max(self.now);
        self.schedule(at, Event::Disk { node });
    }

    fn step(&mut self, node: NodeId, input: Input<Message, KiteRequest>) {
        self.drive(node, |replica, local, io| {
            replica.step(local, input, io);
        });
    }

    /// Runs one call into a running node's replica at its local time (the engine's
    /// invariants are checked after every step, [`Left::observe`]), then carries out
    /// what left it: disk work, the next wake-up, replies and messages (with a processor
    /// model, at the end of the time the steps took).
    fn drive(
        &mut self,
        node: NodeId,
        call: impl FnOnce(&mut Replica<KiteEngine>, Time, &mut Left),
    ) {
        let now = self.now;
        let n = self.nodes.get_mut(&node).expect("node");
        let local = Self::local_at(n, now);
        let Some(replica) = n.replica.as_mut() else { return };
        let links = n.links.clone();
        let mut left = Left {
            messages: Vec::new(),
            replies: Vec::new(),
            rejected: Vec::new(),
            rmws: Vec::new(),
            links: &links,
            over_allowance: Vec::new(),
        };
        let (steps, shed) = (replica.steps(), replica.refusals().0);
        call(replica, local, &mut left);
        let steps = replica.steps() - steps;
        self.counters.shed += replica.refusals().0 - shed;
        self.counters.held_behind_hard_state += u64::from(replica.holding());
        let mut ops = Vec::new();
        replica.take_ready(&mut ops);
        let wake_at = replica.wake_at();
        n.disk.submit(ops, now, FSYNC_NS).expect("the simulated WAL does not fail");
        self.schedule_disk(node);
        self.rmw_ids.extend(left.rmws);
        let over = left.over_allowance.iter().map(|o| format!("{node} {o}"));
        self.over_allowance.extend(over);
        self.rejections.extend(left.rejected.iter().map(|reason| (node, *reason)));
        let n = self.nodes.get_mut(&node).expect("node");
        if let Some(wake) = wake_at {
            let at = Self::global_of(n, wake).max(now);
            if n.wake.is_none_or(|w| at < w || w <= now) {
                n.wake = Some(at);
                self.schedule(at, Event::Wake { node });
            }
        }
        // With a processor model the node is busy for the steps, and what they send and
        // answer leaves at their end.
        let messages = left.messages.len() as u64;
        let busy = self.cpu.map_or(0, |c| c.step_ns * steps + c.message_ns * messages);
        if busy > 0 {
            let n = self.nodes.get_mut(&node).expect("node");
            n.paused_until = n.paused_until.max(now + busy);
        }
        for reply in left.replies {
            self.replies.push((now + busy, node, reply));
        }
        for (to, message, hold) in left.messages {
            self.send_after(node, to, message, hold, busy);
        }
    }

    /// Puts a message on the network, `busy` ns late (its sender's processor); `hold`, its
    /// share of the link's allowance, is given back with its last copy.
    fn send_after(
        &mut self,
        from: NodeId,
        to: NodeId,
        message: Message,
        hold: Option<LinkHold>,
        busy: u64,
    ) {
        self.counters.sent += 1;
        // What the receiver gets is what the real codec makes of the sender's bytes.
        let message = match crate::codec::across::<KiteEngine>(&message) {
            Ok((decoded, bytes)) => {
                self.counters.bytes += bytes as u64;
                decoded
            }
            Err(detail) => return self.codec_failures.push(format!("{from} -> {to}: {detail}")),
        };
        if let Message::Write { rmw: Some(commit), applied, .. } = &message {
            for (id, outcome) in std::iter::once(commit).chain(applied) {
                let first = self.commits.entry(*id).or_insert_with(|| outcome.clone());
                if first.stamp != outcome.stamp
                    && !self.double_commits.iter().any(|(i, _, _)| i == id)
                {
                    self.double_commits.push((*id, first.stamp, outcome.stamp));
                }
            }
        }
        let mut extra = busy;
        if let Some(rule) = self.drop_rule.as_mut() {
            match rule(from, to, &message) {
                Fate::Pass => {}
                Fate::Drop => {
                    self.counters.scripted += 1;
                    return;
                }
                Fate::Delay(ns) => extra += ns,
            }
        }
        if self.cuts.contains(&(from, to)) {
            self.counters.cut += 1;
            return;
        }
        if self.net.drop_ppm > 0 && self.rng.below(1_000_000) < u64::from(self.net.drop_ppm) {
            self.counters.dropped += 1;
            return;
        }
        let mut delay =
            self.rng.range(self.net.delay_min, self.net.delay_max.max(self.net.delay_min + 1));
        if self.net.stall_ppm > 0 && self.rng.below(1_000_000) < u64::from(self.net.stall_ppm) {
            self.counters.stalled += 1;
            delay += self.rng.below(self.net.stall_max.max(1));
        }
        let at = self.now + delay + extra;
        let incarnation = self.incarnation(from);
        let hold = hold.map(Arc::new);
        if let Some(held) = self.holds.get_mut(&(from, to)) {
            self.counters.held += 1;
            held.push((incarnation, message, hold));
            return;
        }
        if self.net.dup_ppm > 0 && self.rng.below(1_000_000) < u64::from(self.net.dup_ppm) {
            self.counters.duplicated += 1;
            let again =
                self.rng.range(self.net.delay_min, self.net.delay_max.max(self.net.delay_min + 1));
            let copy = Box::new(message.clone());
            self.schedule(
                self.now + again + extra,
                Event::Deliver { to, from, incarnation, message: copy, hold: hold.clone() },
            );
        }
        let message = Box::new(message);
        self.schedule(at, Event::Deliver { to, from, incarnation, message, hold });
    }
}

/// Whether `message` answers a round (an acknowledgement, a read's or a proposal's reply).
fn is_reply(message: &Message) -> bool {
    matches!(
        message,
        Message::WriteAck { .. }
            | Message::ReadReply { .. }
            | Message::SlowReleaseAck { .. }
            | Message::Promise { .. }
            | Message::Accepted { .. }
    )
}
