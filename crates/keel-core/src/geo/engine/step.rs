//! Boot, the step, the clock, the channels and the timers.

use super::super::types::{
    Body, Config, GeoOp, GeoReply, GeoRequest, GeoResult, Member, Message, Vector, DCS_MAX,
    PARTITIONS_MAX, PARTITION_BITS,
};
use super::certify::VoteIn;
use super::{Certifier, Coordinator, GeoEngine, Joined, Partition, Role, Uniformity};
use crate::engine::{BootError, ConfigError, Input, Outputs, RequestTag};
use crate::geo::channel::Channel;
use crate::time::Time;
use keel_types::{KeelError, NoRecord, NodeId};
use std::collections::BTreeMap;

/// Checks a geo configuration: `2f + 1` data centers, each holding every partition once,
/// this node among them, timers that are not zero.
/// A checked topology: this replica, the data centers, the partitions per data center,
/// and the node of each replica by data center and partition.
type Topology = (Member, usize, u32, Vec<Vec<NodeId>>);

fn topology(config: &Config) -> Result<Topology, ConfigError> {
    let bad = |field, reason: String| ConfigError { field, reason };
    let dcs = 2 * config.f as usize + 1;
    if dcs > DCS_MAX {
        return Err(bad("f", format!("{dcs} data centers, at most {DCS_MAX}")));
    }
    let partitions = config.members.iter().map(|m| m.partition + 1).max().unwrap_or(0);
    if partitions == 0 || partitions > PARTITIONS_MAX {
        return Err(bad("members", format!("{partitions} partitions, 1 to {PARTITIONS_MAX}")));
    }
    let mut replicas = vec![vec![NodeId(0); partitions as usize]; dcs];
    for m in &config.members {
        let slot = replicas
            .get_mut(m.dc as usize)
            .and_then(|dc| dc.get_mut(m.partition as usize))
            .ok_or_else(|| bad("members", format!("{} is in data center {}", m.node, m.dc)))?;
        if slot.0 != 0 || m.node.0 == 0 {
            return Err(bad("members", format!("{} doubles a replica", m.node)));
        }
        *slot = m.node;
    }
    if replicas.iter().flatten().any(|n| n.0 == 0) {
        let reason =
            format!("each of the {dcs} data centers holds each of {partitions} partitions");
        return Err(bad("members", reason));
    }
    let me = *config
        .members
        .iter()
        .find(|m| m.node == config.node)
        .ok_or_else(|| bad("node", format!("{} is not a member", config.node)))?;
    if config.leader_dc as usize >= dcs {
        return Err(bad("leader_dc", format!("data center {}, of {dcs}", config.leader_dc)));
    }
    let timers = [config.propagate_every, config.broadcast_every, config.retransmit];
    if timers.iter().any(|t| t.0 == 0) || config.tx_timeout.0 == 0 {
        return Err(bad("timers", "a period of zero".into()));
    }
    Ok((me, dcs, partitions, replicas))
}

impl Config {
    /// Checks the configuration as [`GeoEngine::boot`] does (the topology, the timers).
    pub fn validate(&self) -> Result<(), ConfigError> {
        topology(self).map(|_| ())
    }
}

impl GeoEngine {
    /// Boots a replica at local time `now` with nothing stored (a geo node keeps its data
    /// in memory: `docs/geo.md`, *Failures*).
    pub fn boot(config: Config, now: Time) -> Result<GeoEngine, BootError> {
        let (me, dcs, partitions, replicas) = topology(&config)?;
        let joining = config.joining;
        let zero = Vector::zero(dcs);
        let boot = config.wall_clock_origin_us.saturating_add(now.0 / 1_000).max(1);
        let partition = Partition {
            known: zero.clone(),
            remote_commits: vec![BTreeMap::new(); dcs],
            ..Partition::default()
        };
        let uniformity = Uniformity {
            local: vec![zero.clone(); partitions as usize],
            stable: zero.clone(),
            stable_matrix: vec![zero.clone(); dcs],
            global: vec![zero.clone(); dcs],
            uniform: zero,
            heard: vec![now; dcs],
            forwarded: BTreeMap::new(),
            local_heard: vec![now; partitions as usize],
            local_suspected: vec![Vec::new(); partitions as usize],
        };
        let coordinator = Coordinator { next_tx: boot, ..Coordinator::default() };
        let spread = if config.spread_leaders { me.partition % dcs as u32 } else { 0 };
        let leads = config.strong && me.dc == (config.leader_dc + spread) % dcs as u32;
        let certifier = Certifier {
            role: if leads { Role::Leader } else { Role::Follower },
            views: vec![0; partitions as usize],
            acked: vec![0; dcs],
            sent: vec![Some(0); dcs],
            told: vec![0; dcs],
            ..Certifier::default()
        };
        Ok(GeoEngine {
            config,
            me,
            dcs,
            partitions,
            replicas,
            boot,
            now,
            partition,
            coordinator,
            uniformity,
            certifier,
            channels: BTreeMap::new(),
            loopback: Default::default(),
            next_propagate: now,
            next_broadcast: now,
            counters: Default::default(),
            out: Outputs::default(),
            lost: false,
            removed: vec![false; dcs],
            epochs: vec![0; dcs],
            returning: vec![false; dcs],
            removed_nodes: Default::default(),
            agreement: Default::default(),
            welcomes: vec![None; dcs],
            limits: vec![Vec::new(); dcs],
            sending: vec![None; dcs],
            joined: BTreeMap::new(),
            joining: joining.then(super::back::Joining::default),
            catch_up: None,
            first_hard_state: None,
        })
    }

    /// Makes this replica one that restarted and lost what it stored (see
    /// [`GeoEngine::lost`]).
    pub(crate) fn mark_lost(&mut self) {
        self.lost = true;
    }

    /// Has `hard_state` made durable before the first step's messages leave.
    pub(crate) fn persist_first(&mut self, hard_state: keel_types::HardState) {
        self.first_hard_state = Some(hard_state);
    }

    /// Whether this replica restarted and stays failed.
    pub fn is_lost(&self) -> bool {
        self.lost
    }

    /// A step of a lost replica, or of one whose data center was removed: clients are
    /// told to go elsewhere; peers get nothing, as from a failed data center (their
    /// suspicion then forwards its transactions).
    fn step_lost(&mut self, input: Input<Message, GeoRequest>) {
        let refuse = |engine: &mut GeoEngine, request: GeoRequest| {
            let why = "this geo replica restarted and lost what it stored: its data center no longer serves this partition; attach at another data center";
            let error = match engine.lost {
                true => KeelError::Unavailable(why.into()),
                false => super::remove::removed_error(),
            };
            engine.reply(request.tag, Err(error));
        };
        match input {
            Input::Client(request) => refuse(self, request),
            Input::Clients(requests) => requests.into_iter().for_each(|r| refuse(self, r)),
            Input::Message { from, message } => {
                self.counters.dropped_lost += 1;
                if !self.lost {
                    self.last_word_heard(from, &message);
                }
            }
            Input::Tick | Input::LogSynced { .. } | Input::SnapshotSaved { .. } => {}
        }
    }

    /// Handles one input (`crate::engine::Engine::step`).
    pub fn step(
        &mut self,
        now: Time,
        input: Input<Message, GeoRequest>,
    ) -> Outputs<Message, GeoReply, NoRecord> {
        self.now = self.now.max(now);
        self.out.hard_state = self.first_hard_state.take();
        if self.lost || self.is_removed() {
            self.step_lost(input);
            return self.end_silent_step();
        }
        if self.joining.is_some() {
            return self.step_joining(input);
        }
        let tick = matches!(input, Input::Tick);
        match input {
            Input::Message { from, message } => self.receive(from, message),
            Input::Client(request) => self.client(request),
            Input::Clients(requests) => requests.into_iter().for_each(|r| self.client(r)),
            Input::Tick | Input::LogSynced { .. } | Input::SnapshotSaved { .. } => {}
        }
        if self.is_removed() {
            return self.end_silent_step();
        }
        self.drain_loopback();
        self.timers();
        self.drain_loopback();
        if self.leads() {
            self.replicate_log();
        }
        self.flush(tick);
        self.out.wake_at = Some(self.wake_at());
        self.check_invariants();
        std::mem::take(&mut self.out)
    }

    /// The end of a step of a lost replica or a removed one: only a removed one's last
    /// word goes out (`remove.rs`, `last_word`).
    fn end_silent_step(&mut self) -> Outputs<Message, GeoReply, NoRecord> {
        self.flush(true);
        let retransmit = self.config.retransmit;
        self.out.wake_at = self.channels.values().filter_map(|c| c.resend_at(retransmit)).min();
        self.check_invariants();
        std::mem::take(&mut self.out)
    }

    /// A step of a new replica joining its data center's return (`back.rs`): it takes
    /// its peers' messages, refuses its clients, and keeps only its channels' timers.
    fn step_joining(
        &mut self,
        input: Input<Message, GeoRequest>,
    ) -> Outputs<Message, GeoReply, NoRecord> {
        let tick = matches!(input, Input::Tick);
        let refuse = |engine: &mut GeoEngine, r: GeoRequest| {
            engine.reply(r.tag, Err(GeoEngine::joining_error()))
        };
        match input {
            Input::Message { from, message } => self.receive(from, message),
            Input::Client(request) => refuse(self, request),
            Input::Clients(requests) => requests.into_iter().for_each(|r| refuse(self, r)),
            Input::Tick | Input::LogSynced { .. } | Input::SnapshotSaved { .. } => {}
        }
        if !self.is_removed() {
            self.drain_loopback();
            self.flush(tick);
            self.out.wake_at = Some(self.channels_wake_at(self.now + self.config.broadcast_every));
        }
        self.check_invariants();
        std::mem::take(&mut self.out)
    }

    /// The local clock as a timestamp of this partition (`docs/geo.md`, *Timestamps*):
    /// the unix time in µs, shifted, with the partition in the low bits, and the life of
    /// this replica's data center in the two top bits (`back::LIFE_SHIFT`): a data center
    /// taken back issues timestamps above everything its old life did.
    pub(crate) fn clock(&self) -> u64 {
        let us = self.config.wall_clock_origin_us.saturating_add(self.now.0 / 1_000);
        let life = super::back::life_floor(self.epochs[self.me.dc as usize]);
        life | (us << PARTITION_BITS) | u64::from(self.me.partition)
    }

    /// The local time at which the clock reads `ts` (at least now).
    pub(crate) fn time_of(&self, ts: u64) -> Time {
        let within = ts & ((1 << super::back::LIFE_SHIFT) - 1);
        let us = (within >> PARTITION_BITS).saturating_sub(self.config.wall_clock_origin_us);
        Time(us.saturating_mul(1_000).max(self.now.0))
    }

    /// The node holding `partition` in data center `dc`.
    pub(crate) fn replica(&self, dc: u32, partition: u32) -> NodeId {
        self.replicas[dc as usize][partition as usize]
    }

    /// The member `node` is, if it is one.
    pub(crate) fn member(&self, node: NodeId) -> Option<Member> {
        self.config.members.iter().find(|m| m.node == node).copied()
    }

    /// Sends `body` to `to` on their channel (to itself: handled before the step ends).
    /// A body that only refreshes the peer's view of this node (a heartbeat, a vector) is
    /// not queued for a peer silent for `suspect_after`: the one sent after it answers
    /// again carries the news, and a failed data center does not pile them up.
    /// Whether it was queued.
    pub(crate) fn send(&mut self, to: NodeId, body: Body) -> bool {
        if to == self.me.node {
            self.loopback.push_back(body);
            return true;
        }
        if self.removed_nodes.contains(&to) {
            return false;
        }
        if let Some(j) = self.joining.as_mut().filter(|j| !j.joined_to.contains(&to)) {
            // A new replica opens each channel with `Join`: what it sends before waits.
            j.unjoined.entry(to).or_default().push(body);
            return true;
        }
        let channel = self.channels.entry(to).or_default();
        let refresh =
            matches!(body, Body::Heartbeat { .. } | Body::KnownLocal { .. } | Body::Vectors { .. });
        if refresh && channel.silent(self.now, self.config.suspect_after) {
            return false;
        }
        channel.push(body);
        true
    }

    /// Answers the request `tag`.
    pub(crate) fn reply(&mut self, tag: RequestTag, result: Result<GeoResult, KeelError>) {
        self.out.replies.push(GeoReply { tag, served_by: self.me.node, result });
    }

    fn receive(&mut self, from: NodeId, message: Message) {
        if let Err(reason) = self.check_peer(from, &message) {
            self.counters.rejected += 1;
            self.out.rejected.push(crate::engine::Rejection { from, reason });
            return;
        }
        if self.removed_nodes.contains(&from) {
            // Heard, so running: told again if the notice's sends were spent.
            self.counters.dropped_removed += 1;
            let rearm = !self.config.unsafe_notice_at_rest;
            if rearm && self.channels.get_mut(&from).is_some_and(Channel::rearm_notice) {
                self.counters.notices_rearmed += 1;
            }
            return;
        }
        let Some(peer) = self.member(from) else { return };
        if let Some(change) = Self::told_removed(&message, peer.dc) {
            // A removed data center's last word: nothing else it sends is taken.
            let known = self.epochs[peer.dc as usize];
            self.learn_change(change);
            self.counters.removals_told += u64::from(self.epochs[peer.dc as usize] > known);
            return;
        }
        if !self.heard_back(from, peer.dc, &message) {
            self.counters.dropped_removed += 1;
            return;
        }
        if peer.partition == self.me.partition {
            self.uniformity.heard[peer.dc as usize] = self.now;
        }
        let (boot, now) = (self.boot_to(from), self.now);
        let bodies = self.channels.entry(from).or_default().receive(boot, now, message);
        for body in bodies {
            // Told that its own data center was removed, it handles nothing more.
            if self.is_removed() {
                break;
            }
            self.handle(from, body);
        }
    }

    fn drain_loopback(&mut self) {
        while let Some(body) = self.loopback.pop_front() {
            self.handle(self.me.node, body);
        }
    }

    /// One body from `from` (this node itself, for its own partition).
    pub(crate) fn handle(&mut self, from: NodeId, body: Body) {
        if self.joining.is_some() {
            return self.handle_joining(from, body);
        }
        match body {
            Body::GetVersion { read, key, kind, snap } => {
                self.get_version(from, read, key, kind, snap)
            }
            Body::Version { read, object } => self.version(read, object),
            Body::Prepare { tx, writes, snap } => self.prepare(from, tx, writes, &snap),
            Body::PrepareAck { tx, ts } => self.prepare_ack(from, tx, ts),
            Body::Commit { tx, commit } => self.commit(tx, commit),
            Body::Replicate { origin, txs } => self.replicate(origin, txs),
            Body::Heartbeat { origin, ts } => self.heartbeat(origin, ts),
            Body::KnownLocal { known, ballot, suspected } => {
                self.known_local(from, known, ballot, suspected)
            }
            Body::Vectors { stable, known, ballot, leaders } => {
                self.join_larger_ballot(ballot);
                self.vectors(from, stable, known, &leaders)
            }
            Body::Certify(candidate) => self.certify_here(from, *candidate),
            Body::Vote { tx, ok, ts, participants, expiry, ballot, answer } => {
                let vote = VoteIn { tx, ok, ts, participants, expiry, ballot, answer };
                self.vote_in(from, vote)
            }
            Body::Append { ballot, first, records, durable, everywhere } => {
                self.append_in(from, ballot, first, records, durable, everywhere)
            }
            Body::Appended { ballot, through, ok } => self.appended(from, ballot, through, ok),
            Body::Elect { ballot, from: index } => self.elect_in(from, ballot, index),
            Body::Elected { ballot, accepted, durable, first, records } => {
                let joined = Joined { accepted, durable, first, records };
                self.elected_in(from, ballot, joined)
            }
            Body::Outvoted { ballot } => self.outvoted(ballot),
            Body::Settle { txs } => self.settle_in(from, txs),
            Body::Settled { txs } => self.settled_in(from, txs),
            Body::Forgotten { tx } => self.forgotten_in(from, tx),
            Body::Changed { change } => self.learn_change(change),
            Body::Back(back) => self.back_in(from, back),
            Body::ChangePropose { id, change } => self.change_proposed(from, id, change),
            Body::ChangePromised { id, removed, failed } => {
                self.change_promised(from, id, removed, failed)
            }
            Body::ChangeRefused { id, why } => self.change_refused(from, id, why),
            Body::ChangeWithdrawn { id, change } => self.change_withdrawn(from, id, change),
            Body::ChangeCommit { id, change } => self.change_commit(from, id, change),
            Body::ChangeAbort { proposer, id, change } => {
                self.change_abort(from, proposer, id, change)
            }
            Body::ChangeVote { proposer, id, change, vote } => {
                self.change_vote(from, proposer, id, change, vote)
            }
        }
    }

    fn client(&mut self, request: GeoRequest) {
        let GeoRequest { tag, session, op } = request;
        // A session with no past yet (a new connection) sends the empty vector.
        let dcs = self.dcs;
        let past = |past: Vector| match past.dcs.is_empty() && past.strong == 0 {
            true => Vector::zero(dcs),
            false => past,
        };
        match op {
            GeoOp::Begin { past: p } => self.begin(tag, session, past(p), None),
            GeoOp::BeginStrong { past: p, label } => self.begin(tag, session, past(p), Some(label)),
            GeoOp::Read { tx, key, kind } => self.operate(tag, session, tx, key, kind, None),
            GeoOp::Update { tx, key, update } => {
                let kind = update.kind();
                self.operate(tag, session, tx, key, kind, Some(update))
            }
            GeoOp::Commit { tx } => self.commit_tx(tag, session, tx),
            GeoOp::Abort { tx } => self.abort(tag, session, tx),
            GeoOp::Barrier { past: p } => self.barrier(tag, past(p)),
            GeoOp::Attach { past: p } => self.attach(tag, past(p)),
            GeoOp::RemoveDc { member } => self.remove_asked(tag, member),
            GeoOp::ReturnDc { member } => self.return_asked(tag, member),
        }
    }

    /// Everything whose time has come: commits waiting for the clock, the known vector,
    /// reads waiting for it, propagation, vectors, suspicion, timeouts.
    fn timers(&mut self) {
        self.apply_due_commits();
        self.advance_known();
        if self.now >= self.next_propagate {
            self.next_propagate = Time(self.now.0 + self.config.propagate_every.0);
            self.propagate();
        }
        if self.now >= self.next_broadcast {
            self.next_broadcast = Time(self.now.0 + self.config.broadcast_every.0);
            self.broadcast();
            self.forward_for_suspected();
            self.collect();
            self.settle_returns();
            self.send_copies();
            if self.leads() {
                self.promise();
                self.settle_and_forget();
            }
            self.elect_if_leader_suspected();
        }
        if self.leads() {
            self.expire_ballots();
        }
        self.expire_txs();
        self.expire_proposals();
        self.ask_about_votes();
    }

    /// Sends each channel's message, if it has one (acknowledgements alone only on a
    /// tick: otherwise they ride on the next message).
    fn flush(&mut self, tick: bool) {
        let (now, retransmit) = (self.now, self.config.retransmit);
        let boots: Vec<u64> = self.channels.keys().map(|&peer| self.boot_to(peer)).collect();
        for ((&peer, channel), boot) in self.channels.iter_mut().zip(boots) {
            let (message, resent) = channel.flush(boot, now, retransmit, tick);
            if resent {
                self.counters.retransmits += 1;
            }
            if let Some(message) = message {
                self.out.messages.push((peer, message));
            }
        }
    }

    /// The next time something is due.
    fn wake_at(&self) -> Time {
        let mut at = self.next_propagate.min(self.next_broadcast);
        if let Some((&(ts, _), _)) = self.partition.commit_waits.first_key_value() {
            at = at.min(self.time_of(ts));
        }
        if let Some(&(deadline, _)) = self.coordinator.deadlines.first() {
            at = at.min(deadline);
        }
        if let Some(&(deadline, _)) = self.agreement.deadlines.first() {
            at = at.min(deadline);
        }
        if let Some(&(ask, _)) = self.agreement.asks.first() {
            at = at.min(ask);
        }
        if let Some(&(expiry, _)) = self.certifier.expiries.first() {
            at = at.min(self.time_of(expiry.saturating_add(1 << PARTITION_BITS)));
        }
        self.channels_wake_at(at)
    }

    /// The earlier of `at` and the channels' next resend, at least a nanosecond away.
    fn channels_wake_at(&self, mut at: Time) -> Time {
        for channel in self.channels.values() {
            if let Some(resend) = channel.resend_at(self.config.retransmit) {
                at = at.min(resend);
            }
        }
        at.max(Time(self.now.0 + 1))
    }
}
