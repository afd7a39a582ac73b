//! A geo keyspace in the one simulated world (`crate::world::World<GeoEngine>`): data
//! centers of replicas over wide-area links, whole data centers failing and cut off, and
//! the recorder of what clients saw, from which the causal checker's history is built.
//!
//! Node `dc * P + p + 1` holds partition `p` of data center `dc` (`P` partitions per data
//! center). Links inside a data center take a fraction of a millisecond; links between
//! two take that pair's wide-area delay, drawn once or given.

use super::sim::{history_tx, history_vector, GeoWatch};
use crate::disk::HardStateMode;
use crate::invariants::Violation;
use crate::world::{Notice, World, WorldConfig};
use keel_check::causal::history::{self as h, CausalHistory, ClientTx, Outcome, Sync, TxOp};
use keel_core::engine::{FromClient, RequestTag};
use keel_core::geo::{
    Config, GeoEngine, GeoOp, GeoReply, GeoRequest, GeoResult, Kind, Member, Object, TxId, Update,
    Vector,
};
use keel_types::{Key, NodeId};
use std::collections::BTreeMap;

/// How a geo cluster is built.
#[derive(Clone, Debug, Default)]
pub struct GeoShape {
    /// Data-center failures tolerated (`2f + 1` data centers).
    pub f: u32,
    /// Partitions per data center.
    pub partitions: u32,
    /// One-way delay between each pair of data centers, ns, by `(lower, higher)` index.
    pub wan_ns: BTreeMap<(u32, u32), u64>,
    /// Loss on every link, ppm (the channels send again).
    pub loss_ppm: u32,
    /// Duplication on every link, ppm.
    pub duplicate_ppm: u32,
    /// Jitter on every link, ns (reorders messages).
    pub jitter_ns: u64,
    /// Each node's wall clock is off by up to this, ms, either way.
    pub skew_ms: u64,
    /// Negative control: remote transactions visible before they are uniform.
    pub expose_non_uniform: bool,
    /// Negative control: a restarted replica serves again, empty.
    pub rejoin_empty: bool,
    /// Whether sessions run strong transactions too (data center 0 leads certification
    /// first).
    pub strong: bool,
    /// REDBLUE's baseline: partition 0's leader certifies every strong transaction.
    pub central_certifier: bool,
    /// Negative control: certification commits every strong transaction.
    pub certify_all: bool,
    /// Negative control: a strong commit skips its uniform barrier.
    pub skip_strong_barrier: bool,
    /// Negative control: strong delivery ignores undecided votes.
    pub deliver_early: bool,
    /// Negative control: a certification candidate leads without recovering a
    /// majority's log.
    pub skip_recovery: bool,
    /// Negative control: a certification leader forgets a commit before every
    /// participant decided it.
    pub forget_unsettled: bool,
    /// Negative control: collection treats a suspected data center as removed.
    pub collect_suspected: bool,
    /// Negative control: an operator's removal beyond `f` is not refused.
    pub remove_beyond_f: bool,
    /// Negative control: the node asked removes a data center on its own, unagreed.
    pub unagreed_removal: bool,
    /// Negative control: a spent removal notice is not sent again when its peer is heard.
    pub notice_at_rest: bool,
    /// Negative control: a removed replica goes silent without telling the survivors.
    pub removed_silent: bool,
    /// Negative control: an acceptor never asks about a vote it holds undecided.
    pub promises_held: bool,
    /// Negative control: an acceptor asked to abort a proposal it committed records it
    /// aborted.
    pub abort_committed: bool,
    /// Negative control: a return's cut is taken from the first `N - f` survivors'
    /// answers, not every survivor's.
    pub cut_quorum: bool,
    /// Negative control: survivors keep a returning data center's old rows.
    pub no_freeze: bool,
    /// Negative control: survivors record a return's cut but keep the old life above it.
    pub no_cut: bool,
    /// Negative control: pasts naming an old life above its cut are let through.
    pub no_life: bool,
    /// Negative control: earlier returns' cuts neither lower a cut nor are applied late.
    pub no_earlier_cuts: bool,
    /// Negative control: the stable entry follows rows into a life whose cut is unknown.
    pub no_hold: bool,
    /// How often local transactions go to the siblings, ms (0: the default).
    pub propagate_ms: u64,
    /// The transaction time-out (and a strong candidate's time to expiry), ms (0: 10 s).
    pub tx_timeout_ms: u64,
    /// Partition `p`'s certification leaders start in data center `p` (not all in 0).
    pub spread_leaders: bool,
}

/// The label strong withdrawals carry in the simulations (declared to conflict with
/// itself); other labels conflict with nothing, an unlabelled transaction with all.
pub const WITHDRAW: &str = "withdraw";

impl GeoShape {
    /// Data centers.
    pub fn dcs(&self) -> u32 {
        2 * self.f + 1
    }

    /// Every replica.
    pub fn members(&self) -> Vec<Member> {
        let p = self.partitions;
        (0..self.dcs())
            .flat_map(|dc| {
                (0..p).map(move |q| Member { node: NodeId(dc * p + q + 1), dc, partition: q })
            })
            .collect()
    }
}

/// A text key or value as the history writes it.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// An update in the history's terms.
pub fn history_update(update: &Update) -> h::Update {
    match update {
        Update::Set(v) => h::Update::Set { value: text(v) },
        Update::Add(d) => h::Update::Add { delta: *d },
        Update::Max(v) => h::Update::Max { value: *v },
        Update::GAdd(e) => h::Update::GAdd { elem: text(e) },
        Update::SAdd(e) => h::Update::SAdd { elem: text(e) },
        Update::SRem(e, seen) => {
            h::Update::SRem { elem: text(e), seen: seen.iter().map(|t| history_tx(*t)).collect() }
        }
    }
}

/// A kind in the history's terms.
pub fn history_kind(kind: Kind) -> h::Kind {
    match kind {
        Kind::Register => h::Kind::Register,
        Kind::Counter => h::Kind::Counter,
        Kind::Max => h::Kind::Max,
        Kind::GSet => h::Kind::GSet,
        Kind::AwSet => h::Kind::AwSet,
    }
}

/// An object's state in the history's terms.
pub fn history_seen(object: &Object) -> h::Seen {
    match object {
        Object::Register(v) => h::Seen::Register { value: v.as_ref().map(|(v, _)| text(v)) },
        Object::Counter(n) => h::Seen::Counter { value: *n },
        Object::Max(m) => h::Seen::Max { value: *m },
        Object::GSet(s) => h::Seen::Set { elems: s.iter().map(|e| text(e)).collect() },
        Object::AwSet(s) => h::Seen::Set { elems: s.keys().map(|e| text(e)).collect() },
    }
}

/// A transaction a client has open, as recorded so far.
#[derive(Clone, Debug)]
pub struct OpenTx {
    /// The coordinator.
    pub node: NodeId,
    /// The transaction.
    pub id: TxId,
    /// The record being built.
    pub record: ClientTx,
    /// Whether its commit was sent (its outcome is unknown until answered).
    pub committing: bool,
    /// Its snapshot.
    pub snap: Vector,
}

/// The cluster and its recorder.
pub struct GeoWorld {
    /// The world.
    pub world: World<GeoEngine>,
    /// Its shape.
    pub shape: GeoShape,
    /// Data centers failed so far (a live one being removed among them).
    pub failed: Vec<u32>,
    /// Live data centers being removed (failed from their removal on, though their
    /// replicas run until told).
    pub removed_live: Vec<u32>,
    /// Data centers taken back, each with the life it started (for the checker).
    pub lives: Vec<keel_check::causal::history::Life>,
    /// The epoch of each of `lives`.
    life_epochs: Vec<u32>,
    /// When each data center was last rebuilt for a return.
    rebuilt_at: BTreeMap<u32, u64>,
    /// No data center fails meanwhile (removals asked at once are in flight: one made
    /// spends the budget of failures the run draws from).
    pub failures_held: bool,
    /// Replies not yet taken, by tag.
    pub replies: BTreeMap<RequestTag, (u64, GeoReply)>,
    /// Client transactions recorded.
    pub txs: Vec<ClientTx>,
    /// Barriers and attaches that returned.
    pub syncs: Vec<Sync>,
    /// Per session, the `order` of its last transaction or sync recorded.
    steps: BTreeMap<u64, u64>,
    /// Coverage of the scenario's own paths.
    pub reached: BTreeMap<String, u64>,
}

impl GeoWorld {
    /// Boots the cluster of `shape` from `seed`.
    pub fn new(shape: GeoShape, seed: u64) -> GeoWorld {
        let members = shape.members();
        let mut template = Config::new(NodeId(0), members.clone(), shape.f);
        template.suspect_after = keel_core::time::Span::from_millis(1_000);
        template.retransmit = keel_core::time::Span::from_millis(300);
        let tx_timeout_ms = if shape.tx_timeout_ms == 0 { 10_000 } else { shape.tx_timeout_ms };
        template.tx_timeout = keel_core::time::Span::from_millis(tx_timeout_ms);
        template.unsafe_expose_non_uniform = shape.expose_non_uniform;
        template.unsafe_rejoin_empty = shape.rejoin_empty;
        template.unsafe_certify_all = shape.certify_all;
        template.unsafe_skip_strong_barrier = shape.skip_strong_barrier;
        template.unsafe_deliver_early = shape.deliver_early;
        template.unsafe_skip_recovery = shape.skip_recovery;
        template.unsafe_forget_unsettled = shape.forget_unsettled;
        template.unsafe_collect_suspected = shape.collect_suspected;
        template.unsafe_remove_beyond_f = shape.remove_beyond_f;
        template.unsafe_unagreed_removal = shape.unagreed_removal;
        template.unsafe_notice_at_rest = shape.notice_at_rest;
        template.unsafe_removed_silent = shape.removed_silent;
        template.unsafe_promises_held = shape.promises_held;
        template.unsafe_abort_committed = shape.abort_committed;
        template.unsafe_cut_quorum = shape.cut_quorum;
        template.unsafe_no_freeze = shape.no_freeze;
        template.unsafe_no_cut = shape.no_cut;
        template.unsafe_no_life = shape.no_life;
        template.unsafe_no_earlier_cuts = shape.no_earlier_cuts;
        template.unsafe_no_hold = shape.no_hold;
        template.conflicts.declare(WITHDRAW, WITHDRAW);
        template.strong = shape.strong;
        template.central_certifier = shape.central_certifier;
        template.spread_leaders = shape.spread_leaders;
        if shape.propagate_ms > 0 {
            template.propagate_every = keel_core::time::Span::from_millis(shape.propagate_ms);
        }
        let net = crate::net::NetConfig {
            latency_ns_min: 100_000,
            latency_ns_max: 500_000,
            jitter_ns_max: shape.jitter_ns.max(1),
            loss_ppm: shape.loss_ppm,
            duplicate_ppm: shape.duplicate_ppm,
            messages_in_flight_max: 1_000_000,
            stall_ppm: 0,
            stall_ns_max: crate::net::STALL_NS_MIN + 1,
        };
        let config = WorldConfig {
            engine: template,
            nodes: members.len() as u32,
            keyspaces: 1,
            net,
            client_latency_ns: 0,
            fsync_ns_min: 1_000_000,
            fsync_ns_max: 1_000_001,
            clock_offset_ns_max: 1_000_000_000,
            hard_state_mode: HardStateMode::Sync,
            torn_tail: false,
            events_max: 50_000_000,
            crash_after_vote_ppm: 0,
            late_open_copy_ppm: 0,
            unsafe_skip_truncation_clamp: false,
            spread_leaders: false,
            reads_off_loop_ppm: 0,
            process_crash_ppm: 0,
            clock_reboot_ppm: 0,
            drift_change_ppm: 0,
            fault_seed: 0,
            link_bulk_bytes_max: keel_exec::LINK_BULK_BYTES_MAX,
            unsafe_unbounded_links: false,
            forwarded_replies_bytes_max: keel_exec::FORWARDED_REPLIES_BYTES_MAX,
            voters: 0,
            replicas: 0,
            wall_skew_ms_max: shape.skew_ms,
        };
        let mut world = World::new(config, seed);
        for a in &members {
            for b in &members {
                if a.dc != b.dc {
                    let pair = (a.dc.min(b.dc), a.dc.max(b.dc));
                    let ns = shape.wan_ns.get(&pair).copied().unwrap_or(50_000_000);
                    world.net.set_latency(a.node, b.node, ns);
                }
            }
        }
        GeoWorld {
            world,
            shape,
            failed: Vec::new(),
            removed_live: Vec::new(),
            lives: Vec::new(),
            life_epochs: Vec::new(),
            rebuilt_at: BTreeMap::new(),
            failures_held: false,
            replies: BTreeMap::new(),
            txs: Vec::new(),
            syncs: Vec::new(),
            steps: BTreeMap::new(),
            reached: BTreeMap::new(),
        }
    }

    /// Virtual time, ns.
    pub fn now(&self) -> u64 {
        self.world.now_ns()
    }

    /// The nodes of data center `dc`.
    pub fn nodes_of(&self, dc: u32) -> Vec<NodeId> {
        let p = self.shape.partitions;
        (0..p).map(|q| NodeId(dc * p + q + 1)).collect()
    }

    /// The data center of `node`.
    pub fn dc_of(&self, node: NodeId) -> u32 {
        (node.0 - 1) / self.shape.partitions
    }

    /// Fails data center `dc` for good: every node crashes and stays down.
    pub fn fail_dc(&mut self, dc: u32) {
        if self.failed.contains(&dc) {
            return;
        }
        assert!(self.failed.len() < self.shape.f as usize, "more than f data centers fail");
        self.failed.push(dc);
        for node in self.nodes_of(dc) {
            self.crash(node);
        }
    }

    /// Whether a data center may fail now: fewer than `f` failed, and no removal asked
    /// at once with others in flight.
    pub fn may_fail(&self) -> bool {
        self.failed.len() < self.shape.f as usize && !self.failures_held
    }

    /// Marks live data center `dc` failed, as an operator about to remove it: its
    /// sessions stop; its replicas run on until they are told.
    pub fn remove_live(&mut self, dc: u32) {
        assert!(self.failed.len() < self.shape.f as usize, "more than f data centers fail");
        self.failed.push(dc);
        self.removed_live.push(dc);
    }

    /// Marks data center `dc` failed beyond the `f` tolerated: a removal the engine should
    /// have refused was made (its replicas stop once told).
    pub fn remove_beyond_f(&mut self, dc: u32) {
        self.failed.push(dc);
        self.removed_live.push(dc);
    }

    /// The return of data center `dc` at `epoch` was made: its rebuilt replicas start
    /// a new life once back, its old one failed (for the checker).
    pub fn return_made(&mut self, dc: u32, epoch: u32) {
        let since_ns = self.rebuilt_at.get(&dc).copied().expect("rebuilt before its return");
        let from_ts = u64::from(epoch / 2) << 62;
        self.lives.push(keel_check::causal::history::Life { dc, from_ts, since_ns, cut: 0 });
        self.life_epochs.push(epoch);
    }

    /// Records the cut of each life whose return applied one (a replica keeps only the
    /// latest of a data center's cuts, so it is noted as the run goes).
    pub fn note_cuts(&mut self) {
        for i in 0..self.lives.len() {
            if self.lives[i].cut != 0 {
                continue;
            }
            let (dc, epoch) = (self.lives[i].dc, self.life_epochs[i]);
            let cut = self.world.node_ids().into_iter().find_map(|n| {
                let cuts = self.world.engine(n)?.status().cuts;
                cuts.into_iter().find(|&(d, _, e)| d == dc && e == epoch).map(|(_, c, _)| c)
            });
            self.lives[i].cut = cut.unwrap_or(0);
        }
    }

    /// Data center `dc`, removed, is back (`back.rs`): it counts as live again.
    pub fn returned(&mut self, dc: u32) {
        self.failed.retain(|&d| d != dc);
        self.removed_live.retain(|&d| d != dc);
    }

    /// Sends `KEEL.NODE REMOVE member` to `node`, through the front door's conversion.
    pub fn submit_remove(&mut self, node: NodeId, member: NodeId) -> RequestTag {
        let request = keel_core::engine::ClientRequest {
            tag: RequestTag(0),
            client: keel_types::ClientId(0),
            request: keel_types::RequestId(0),
            command: keel_types::Command::Cluster(keel_types::ClusterOp::Remove(member)),
            durability: None,
            level: None,
            after: keel_types::LogIndex::ZERO,
            mode: keel_core::engine::OpMode::Plain,
            named: false,
        };
        let request = GeoRequest::from_client(request).expect("a geo keyspace removes by node");
        self.world.submit(node, request)
    }

    /// Records the local commits the replicas of live data centers being removed never
    /// sent on (as for a crash: reads there may have seen them).
    pub fn record_removed_unsent(&mut self) {
        for dc in self.removed_live.clone() {
            for node in self.nodes_of(dc) {
                let unsent = self
                    .world
                    .engine(node)
                    .map(|engine| engine.unpropagated().cloned().collect::<Vec<_>>());
                if let Some(txs) = unsent {
                    self.world.checker_mut().merge_committed(dc, &txs);
                }
            }
        }
    }

    /// Crashes `node`, recording first the local commits it had not yet sent on: reads
    /// in its data center may have seen them, and nothing else ever will.
    fn crash(&mut self, node: NodeId) {
        let unsent = self
            .world
            .engine(node)
            .map(|engine| (engine.place().dc, engine.unpropagated().cloned().collect::<Vec<_>>()));
        if let Some((dc, txs)) = unsent {
            self.world.checker_mut().merge_committed(dc, &txs);
        }
        self.world.crash(node);
    }

    /// Crashes the replica of `partition` in data center `dc`, to restart it later
    /// ([`GeoWorld::restart`]). A restarted replica has lost what it stored and stays
    /// failed, so its data center counts as failed from now on (its sessions stop),
    /// unless the negative control has it serve again.
    pub fn crash_replica(&mut self, dc: u32, partition: u32) -> NodeId {
        let node = self.nodes_of(dc)[partition as usize];
        if !self.shape.rejoin_empty && !self.failed.contains(&dc) {
            assert!(self.failed.len() < self.shape.f as usize, "more than f data centers fail");
            self.failed.push(dc);
        }
        self.crash(node);
        node
    }

    /// Replaces every replica of data center `dc` with a new one, wiped and joining (an
    /// operator about to take it back), recording first what the old ones never sent on.
    pub fn rebuild_dc(&mut self, dc: u32) {
        self.rebuilt_at.insert(dc, self.now());
        for node in self.nodes_of(dc) {
            self.crash(node);
            self.world.restart_wiped(node, |config| config.joining = true);
        }
    }

    /// Restarts a crashed node from what its disk kept.
    pub fn restart(&mut self, node: NodeId) {
        self.world.restart(node);
    }

    /// Stalls until `until_ns` every link into a certification leader of data center `dc`
    /// from the leader of another partition elsewhere: the partitions `dc` leads still
    /// vote, and their votes go out, but they hear no other partition's vote or decision.
    pub fn stall_into_leaders(&mut self, dc: u32, until_ns: u64) {
        let leads = |node: NodeId| {
            self.world.engine(node).and_then(|e| e.status().certification).is_some_and(|c| c.leads)
        };
        let leaders: Vec<NodeId> =
            self.world.node_ids().into_iter().filter(|&n| leads(n)).collect();
        let (inside, outside): (Vec<NodeId>, Vec<NodeId>) =
            leaders.into_iter().partition(|&n| self.dc_of(n) == dc);
        for &from in &outside {
            for &to in &inside {
                self.world.net.stall_link(from, to, until_ns);
            }
        }
    }

    /// How many votes of several participants' transactions leaders sent so far.
    pub fn votes_out(&self) -> usize {
        self.world.checker().votes_out.len()
    }

    /// When a node of data center `dc` first sent one of the votes after the first
    /// `since` ([`GeoWorld::votes_out`]).
    pub fn vote_out_from(&self, dc: u32, since: usize) -> Option<u64> {
        let votes = &self.world.checker().votes_out;
        votes.get(since..)?.iter().find(|(_, node)| self.dc_of(*node) == dc).map(|(at, _)| *at)
    }

    /// Cuts data center `dc` off from every other, both ways.
    pub fn isolate_dc(&mut self, dc: u32) {
        let inside = self.nodes_of(dc);
        let outside: Vec<NodeId> =
            self.world.node_ids().into_iter().filter(|n| !inside.contains(n)).collect();
        self.world.net.partition(&inside, &outside);
    }

    /// Restores every link.
    pub fn heal(&mut self) {
        self.world.net.heal();
    }

    /// Sends `op` for `session` to `node` now, as the front door hands it to a geo
    /// keyspace (`FromClient`: the connection's client id names the session).
    pub fn submit(&mut self, node: NodeId, session: u64, op: GeoOp) -> RequestTag {
        let request = keel_core::engine::ClientRequest {
            tag: RequestTag(0),
            client: keel_types::ClientId(session),
            request: keel_types::RequestId(0),
            command: keel_types::Command::Geo(op),
            durability: None,
            level: None,
            after: keel_types::LogIndex::ZERO,
            mode: keel_core::engine::OpMode::Plain,
            named: false,
        };
        let request =
            GeoRequest::from_client(request).expect("a geo keyspace takes geo operations");
        self.world.submit(node, request)
    }

    /// Processes the next event; whether there was one at or before `until`.
    pub fn step_until(&mut self, until: u64) -> bool {
        match self.world.next_event_ns() {
            Some(at) if at <= until => {
                if let Some(Notice::Reply { reply, .. }) = self.world.step() {
                    self.replies.insert(reply.tag, (self.now(), reply));
                }
                true
            }
            _ => {
                self.world.advance_to(until.max(self.now()));
                false
            }
        }
    }

    /// Runs until `until`.
    pub fn run_until(&mut self, until: u64) {
        while self.step_until(until) {}
    }

    /// Sends `op` and runs until its reply, at most `within_ns`; `None`: none came.
    pub fn call(
        &mut self,
        node: NodeId,
        session: u64,
        op: GeoOp,
        within_ns: u64,
    ) -> Option<GeoResult> {
        let tag = self.submit(node, session, op);
        let until = self.now() + within_ns;
        loop {
            if let Some((_, reply)) = self.replies.remove(&tag) {
                return reply.result.ok();
            }
            if !self.step_until(until) {
                return None;
            }
        }
    }

    /// Opens a transaction's record.
    pub fn began(
        &mut self,
        node: NodeId,
        session: u64,
        past: &Vector,
        tx: TxId,
        snap: &Vector,
    ) -> OpenTx {
        let record = ClientTx {
            id: history_tx(tx),
            session,
            dc: self.dc_of(node),
            past: history_vector(past),
            snap: history_vector(snap),
            at_ns: self.now(),
            order: self.next_step(session),
            ops: Vec::new(),
            outcome: Outcome::Unknown,
            strong: false,
            label: None,
        };
        OpenTx { node, id: tx, record, committing: false, snap: snap.clone() }
    }

    /// Records an operation's result in `open`.
    pub fn record_op(
        open: &mut OpenTx,
        key: &Key,
        update: Option<&Update>,
        kind: Kind,
        object: &Object,
    ) {
        let key = text(key);
        open.record.ops.push(match update {
            Some(u) => TxOp::Update { key, update: history_update(u) },
            None => TxOp::Read { key, kind: history_kind(kind), seen: history_seen(object) },
        });
    }

    /// Closes a transaction's record with `outcome`.
    pub fn close(&mut self, mut open: OpenTx, outcome: Outcome) {
        open.record.outcome = outcome;
        self.txs.push(open.record);
    }

    /// Records a barrier or attach that returned.
    pub fn synced(&mut self, session: u64, dc: u32, past: &Vector, barrier: bool) {
        let at_ns = self.now();
        let order = self.next_step(session);
        self.syncs.push(Sync { session, dc, past: history_vector(past), barrier, at_ns, order });
    }

    /// The next `order` of `session` (a session runs one thing at a time, so the order its
    /// records open in is its session order).
    fn next_step(&mut self, session: u64) -> u64 {
        let step = self.steps.entry(session).or_default();
        *step += 1;
        *step
    }

    /// One whole transaction of `ops` for `session` at `node` from `past`, synchronously
    /// (scripted scenarios): the session's new past, and each operation's object; `None`
    /// if some reply never came (its record is closed as unknown or aborted).
    pub fn tx(
        &mut self,
        node: NodeId,
        session: u64,
        past: &Vector,
        ops: &[(Key, Option<Update>, Kind)],
    ) -> Option<(Vector, Vec<Object>)> {
        const WITHIN: u64 = 20_000_000_000;
        let (mut open, objects) = self.open_tx(node, session, past, None, ops)?;
        let tx = open.id;
        open.committing = true;
        match self.call(node, session, GeoOp::Commit { tx }, WITHIN) {
            Some(GeoResult::Committed { vector }) => {
                self.close(open, Outcome::Committed { vector: history_vector(&vector) });
                Some((vector, objects))
            }
            _ => {
                self.close(open, Outcome::Unknown);
                None
            }
        }
    }

    /// Begins a transaction for `session` at `node` from `past` (strong with its label
    /// when `strong` is `Some`) and runs `ops`, recording them: the open record and each
    /// operation's object; `None` if some reply never came (the record is then closed
    /// as aborted).
    pub fn open_tx(
        &mut self,
        node: NodeId,
        session: u64,
        past: &Vector,
        strong: Option<Option<String>>,
        ops: &[(Key, Option<Update>, Kind)],
    ) -> Option<(OpenTx, Vec<Object>)> {
        const WITHIN: u64 = 20_000_000_000;
        let begin = match &strong {
            Some(label) => GeoOp::BeginStrong { past: past.clone(), label: label.clone() },
            None => GeoOp::Begin { past: past.clone() },
        };
        let Some(GeoResult::Began { tx, snap }) = self.call(node, session, begin, WITHIN) else {
            return None;
        };
        let mut open = self.began(node, session, past, tx, &snap);
        if let Some(label) = strong {
            open.record.strong = true;
            open.record.label = label;
        }
        let mut objects = Vec::new();
        for (key, update, kind) in ops {
            let op = match update {
                Some(update) => GeoOp::Update { tx, key: key.clone(), update: update.clone() },
                None => GeoOp::Read { tx, key: key.clone(), kind: *kind },
            };
            let Some(GeoResult::Object(object)) = self.call(node, session, op, WITHIN) else {
                self.close(open, Outcome::Aborted);
                return None;
            };
            Self::record_op(&mut open, key, update.as_ref(), *kind, &object);
            objects.push(object);
        }
        Some((open, objects))
    }

    /// Runs a quiet end: every link restored, nothing lost, `ns` more of time.
    pub fn quiesce(&mut self, ns: u64) {
        self.heal();
        self.world.net.calm();
        let until = self.now() + ns;
        self.run_until(until);
    }

    /// Runs on, a second at a time and `max_ns` at most, while a correct data center's
    /// strong entry is below the last committed strong transaction: a leader whose clock
    /// runs fast commits at a timestamp the others' promises pass only as their slower
    /// clocks catch up (clocks may drift apart by a fifth, `docs/geo.md`, *Timestamps*).
    /// Whether it ran on.
    pub fn await_strong_delivery(&mut self, max_ns: u64) -> bool {
        let last = self.world.checker().last_strong_commit();
        let until = self.now() + max_ns;
        let mut extended = false;
        while self.now() < until && self.strong_entry() < last {
            extended = true;
            let next = (self.now() + 1_000_000_000).min(until);
            self.run_until(next);
        }
        extended
    }

    /// The smallest strong entry of a correct data center's replicas.
    fn strong_entry(&self) -> u64 {
        let correct = (0..self.shape.dcs()).filter(|dc| !self.failed.contains(dc));
        let nodes = correct.flat_map(|dc| self.nodes_of(dc));
        let entries = nodes.filter_map(|n| self.world.engine(n).map(|e| e.status().stable.strong));
        entries.min().unwrap_or(u64::MAX)
    }

    /// Every correct data center's objects on its uniform snapshot (the smallest of its
    /// replicas' uniform vectors): what a new transaction there reads once the run is
    /// quiet. A fragment of a failed data center's transaction that reached only some
    /// partitions is stored but never becomes visible, and is not part of it.
    pub fn finals(&self) -> Vec<h::FinalState> {
        let mut out = Vec::new();
        for dc in (0..self.shape.dcs()).filter(|dc| !self.failed.contains(dc)) {
            let engines: Vec<_> =
                self.nodes_of(dc).into_iter().filter_map(|n| self.world.engine(n)).collect();
            let mut snap =
                Vector { dcs: vec![u64::MAX; self.shape.dcs() as usize], strong: u64::MAX };
            for engine in &engines {
                let status = engine.status();
                for (s, u) in snap.dcs.iter_mut().zip(&status.uniform.dcs) {
                    *s = (*s).min(*u);
                }
                snap.strong = snap.strong.min(status.stable.strong);
            }
            let mut objects = Vec::new();
            for engine in &engines {
                for (key, kind) in engine.stored_keys() {
                    let object = engine.object_on(&key, kind, &snap).expect("its own key");
                    objects.push((text(&key), history_kind(kind), history_seen(&object)));
                }
            }
            objects.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
            out.push(h::FinalState { dc, objects, snap: Some(snap.flat()) });
        }
        out
    }

    /// The history: what clients saw and what the cluster did.
    pub fn history(&self, with_finals: bool) -> CausalHistory {
        let watch: &GeoWatch = self.world.checker();
        // The cluster's record of a transaction gathers what each partition sent on; a
        // failed data center's transaction may have gone out from some partitions only
        // (never to become visible elsewhere). Its client's record, when there is one,
        // is whole: a committed one stands for itself, and an unknown one lends its
        // updates to the cluster's record, which proves it committed.
        let clients: BTreeMap<h::TxId, &ClientTx> = self.txs.iter().map(|t| (t.id, t)).collect();
        let strong = watch.strong_committed();
        let committed = watch
            .committed
            .values()
            .chain(&strong)
            .filter_map(|c| match clients.get(&c.id) {
                Some(t) if matches!(t.outcome, Outcome::Committed { .. }) => None,
                Some(t) => {
                    let writes = t
                        .ops
                        .iter()
                        .filter_map(|op| match op {
                            TxOp::Update { key, update } => Some((key.clone(), update.clone())),
                            TxOp::Read { .. } => None,
                        })
                        .collect();
                    Some(h::Committed { writes, ..c.clone() })
                }
                None => Some(c.clone()),
            })
            .collect();
        CausalHistory {
            // A return abandoned before its cut started no life.
            lives: self.lives.iter().filter(|l| l.cut != 0).copied().collect(),
            dcs: self.shape.dcs(),
            f: self.shape.f,
            failed: self.failed.clone(),
            txs: self.txs.clone(),
            committed,
            syncs: self.syncs.clone(),
            stored: watch.stored.clone(),
            finals: if with_finals { self.finals() } else { Vec::new() },
            conflicts: vec![(WITHDRAW.to_owned(), WITHDRAW.to_owned())],
        }
    }

    /// What the world's own checks found.
    pub fn violations(&self) -> &[Violation] {
        self.world.violations()
    }

    /// Counts a path the scenario took.
    pub fn reach(&mut self, path: &str) {
        *self.reached.entry(path.to_string()).or_default() += 1;
    }
}
