//! The `membership` scenario's operator: beside the workload and under every fault, it
//! changes keyspace 0's membership one node at a time (adds a node outside it as a
//! learner, promotes a learner, removes a voter or a learner) and moves its leadership
//! to a voter, asking a random node, which forwards to the leader. The world starts with two nodes more than its voters
//! ([`crate::world::WorldConfig::voters`]), so there is always a node to add, and a node
//! removed may be added again later, with the disk it kept.
//!
//! What it asks is whatever the membership it sees allows, within 3 to 7 voters; the
//! leader refuses what may not be done now (a change not yet committed, a learner not
//! caught up, an active set that would miss a majority, the leader's own removal). Every
//! answer is counted by kind for `--coverage` (`membership:*`).
//!
//! Two faults aim at the moments a change opens (counted as `fault:*`):
//! - **removed with the leader** (after 80% of removals): just after a voter's removal
//!   is answered, the leader
//!   and the removed node are cut off from the rest for 200 ms to 1 s. The removed node
//!   is still in the active set then (it leaves it as any member marked out does): a
//!   leader that counted it toward commits and `durable` writes would acknowledge
//!   writes the new majority never got, and the other side elects a leader without them.
//! - **deaf after the hand-over** (half the transfers): once the leader has handed its
//!   leadership over (`TimeoutNow` sent), everything addressed to it stalls for 50 to
//!   400 ms, so it hears neither its successor nor the voters that moved to the next
//!   epoch: a leader that kept its lease past the hand-over would still hold it while
//!   its successor holds one too.
//! - **learner stalled** (after half the additions): just after a learner is added, the
//!   leader's link to it stalls
//!   for 100 ms to 1 s, so it holds only part of the log for a while: a leader that
//!   admitted it to the active set before it caught up would let it serve stale reads.

use crate::clients::{timer_id, TIMER_CLASS_SHIFT};
use crate::engine::LeaderSim;
use crate::rng::Rng;
use crate::world::{Notice, World};
use keel_core::leader::{ClientReply, ClientRequest, RequestTag};
use keel_types::{ClientId, ClusterOp, Command, KeelError, LogIndex, NodeId, RequestId};
use std::collections::BTreeMap;

/// Timer class of the reconfigurer (above the classes of `clients.rs` and `tickets.rs`).
pub const TIMER_MEMBERSHIP: u64 = 6;
/// The payload bit that marks a deadline (the rest is the change's number).
const DEADLINE_BIT: u64 = 1 << 39;
/// The payload bit that marks the end of an aimed partition.
const HEAL_BIT: u64 = 1 << 38;
/// The payload bit that marks the start of a learner's stall (the leader's id and the
/// learner's below it).
const STALL_BIT: u64 = 1 << 37;
/// The payload bit that marks a poll for a transfer's hand-over (the polls left below).
const WATCH_BIT: u64 = 1 << 36;
/// How often, and how many times, a transfer's hand-over is polled for.
const WATCH_EVERY_NS: u64 = 1_000_000;
const WATCH_POLLS: u64 = 1_000;
/// Chance (ppm) that a transfer's old leader goes deaf once it hands over.
const DEAF_PPM: u32 = 500_000;
/// Chance (ppm) that an added learner's link stalls.
const AIMED_PPM: u32 = 500_000;
/// Chance (ppm) that a removal cuts the leader and the removed node off.
const REMOVAL_AIMED_PPM: u32 = 800_000;
/// The client id the reconfigurer's requests carry (far above the workload's).
const OPERATOR: ClientId = ClientId(0xC0F1_6000);
/// Fewest and most voters the reconfigurer steers between.
const VOTERS_MIN: usize = 3;
const VOTERS_MAX: usize = 7;

/// The operator of one run.
pub struct Reconfigurer {
    rng: Rng,
    /// The change in flight: its tag, what it asked, and its number.
    inflight: Option<(RequestTag, ClusterOp, u64)>,
    changes: u64,
    /// Time between one answer and the next change, `[gap_ns_min, gap_ns_max)`.
    gap_ns_min: u64,
    gap_ns_max: u64,
    /// How long a change may wait for its answer before the operator moves on (its
    /// outcome unknown: it may still be committed).
    patience_ns: u64,
    stopped: bool,
    /// Answers by kind (`membership:added`, `membership:busy`, ...).
    pub counts: BTreeMap<&'static str, u64>,
}

/// The nodes outside keyspace 0's voters, learners first, as the most advanced running
/// node sees the membership (none if every node is down).
pub fn outside_voters<E: LeaderSim>(world: &World<E>) -> Vec<NodeId> {
    let Some((voters, learners)) = Reconfigurer::seen(world) else { return Vec::new() };
    if !learners.is_empty() {
        return learners;
    }
    world.node_ids().into_iter().filter(|id| !voters.contains(id)).collect()
}

impl Reconfigurer {
    /// An operator drawing from `rng`, a change about every 100 to 600 ms.
    pub fn new(rng: Rng) -> Reconfigurer {
        Reconfigurer {
            rng,
            inflight: None,
            changes: 0,
            gap_ns_min: 100_000_000,
            gap_ns_max: 600_000_000,
            patience_ns: 2_000_000_000,
            stopped: false,
            counts: BTreeMap::new(),
        }
    }

    /// Schedules the first change.
    pub fn start<E: LeaderSim>(&mut self, world: &mut World<E>) {
        self.schedule(world);
    }

    /// Asks nothing more (a change in flight still gets its answer).
    pub fn stop(&mut self) {
        self.stopped = true;
    }

    fn schedule<E: LeaderSim>(&mut self, world: &mut World<E>) {
        let at = world.now_ns() + self.rng.range(self.gap_ns_min, self.gap_ns_max);
        world.set_timer(at, timer_id(TIMER_MEMBERSHIP, 0));
    }

    /// Takes its own timers and replies; false for anything else.
    pub fn handle<E: LeaderSim>(&mut self, world: &mut World<E>, notice: &Notice) -> bool {
        match notice {
            Notice::Reply { reply, .. } => {
                if self.inflight.is_none_or(|(tag, _, _)| tag != reply.tag) {
                    return false;
                }
                let (_, op, _) = self.inflight.take().expect("checked");
                self.on_reply(op, reply);
                if reply.result.is_ok() && !self.stopped {
                    self.aim(world, op);
                }
                if !self.stopped {
                    self.schedule(world);
                }
                true
            }
            Notice::Timer { id } if id >> TIMER_CLASS_SHIFT == TIMER_MEMBERSHIP => {
                let payload = id & ((1 << TIMER_CLASS_SHIFT) - 1);
                if payload & HEAL_BIT != 0 {
                    world.net.heal();
                } else if payload & WATCH_BIT != 0 {
                    self.watch_hand_over(world, payload & !WATCH_BIT);
                } else if payload & STALL_BIT != 0 {
                    let leader = NodeId((payload >> 16 & 0xFFFF) as u32);
                    let learner = NodeId((payload & 0xFFFF) as u32);
                    let until = world.now_ns() + self.rng.range(100_000_000, 1_000_000_000);
                    world.net.stall_link(leader, learner, until);
                } else if payload & DEADLINE_BIT != 0 {
                    let number = payload & !DEADLINE_BIT;
                    if self.inflight.is_some_and(|(_, _, n)| n == number) {
                        self.inflight = None;
                        *self.counts.entry("membership:unanswered").or_default() += 1;
                        if !self.stopped {
                            self.schedule(world);
                        }
                    }
                } else if !self.stopped && self.inflight.is_none() {
                    self.ask(world);
                }
                true
            }
            Notice::Timer { .. } => false,
        }
    }

    /// The membership as the most advanced running node sees it (the one whose
    /// membership entry is newest), or `None` if every node is down.
    fn seen<E: LeaderSim>(world: &World<E>) -> Option<(Vec<NodeId>, Vec<NodeId>)> {
        let statuses = world.node_ids().into_iter().filter_map(|id| world.status_in(id, 0));
        let newest = statuses.max_by_key(|s| (s.membership_index, s.last_index))?;
        Some((newest.voters, newest.learners))
    }

    fn ask<E: LeaderSim>(&mut self, world: &mut World<E>) {
        let Some((voters, learners)) = Self::seen(world) else {
            return self.schedule(world);
        };
        let outside: Vec<NodeId> = world
            .node_ids()
            .into_iter()
            .filter(|id| !voters.contains(id) && !learners.contains(id))
            .collect();
        let mut options = Vec::new();
        if let Some(node) = self.pick(&outside) {
            options.push(ClusterOp::AddLearner(node));
        }
        if let Some(node) = self.pick(&learners).filter(|_| voters.len() < VOTERS_MAX) {
            options.push(ClusterOp::Promote(node));
            options.push(ClusterOp::Promote(node)); // catching up is the common path
        }
        if let Some(node) = self.pick(&learners) {
            options.push(ClusterOp::Remove(node));
        }
        if let Some(node) = self.pick(&voters).filter(|_| voters.len() > VOTERS_MIN) {
            options.push(ClusterOp::Remove(node));
            options.push(ClusterOp::Remove(node));
        }
        let leader = world.leader_in(0);
        let others: Vec<NodeId> = voters.iter().copied().filter(|v| Some(*v) != leader).collect();
        if let Some(node) = self.pick(&others) {
            // Perhaps to a voter behind, or down: it must catch up first.
            options.push(ClusterOp::TransferLeader(node));
        }
        let Some(op) = self.pick(&options) else { return self.schedule(world) };
        let nodes = world.node_ids();
        let to = nodes[self.rng.index(nodes.len())];
        self.changes += 1;
        let request = ClientRequest {
            tag: RequestTag(0),
            client: OPERATOR,
            request: RequestId(self.changes),
            command: Command::Cluster(op),
            durability: None,
            level: None,
            after: LogIndex::ZERO,
            mode: Default::default(),
            named: false,
        };
        let tag = world.submit_to(to, 0, request);
        self.inflight = Some((tag, op, self.changes));
        let deadline = world.now_ns() + self.patience_ns;
        world.set_timer(deadline, timer_id(TIMER_MEMBERSHIP, DEADLINE_BIT | self.changes));
        *self.counts.entry("membership:asked").or_default() += 1;
        let moves =
            matches!(op, ClusterOp::TransferLeader(node) if world.leader_in(0) != Some(node));
        if moves && self.rng.chance(DEAF_PPM) {
            // Watched from the start: the hand-over comes before the answer.
            let at = world.now_ns() + WATCH_EVERY_NS;
            world.set_timer(at, timer_id(TIMER_MEMBERSHIP, WATCH_BIT | WATCH_POLLS));
        }
    }

    /// The aimed faults (see the module docs), after an answered change.
    fn aim<E: LeaderSim>(&mut self, world: &mut World<E>, op: ClusterOp) {
        let Some(leader) = world.leader_in(0) else { return };
        let now = world.now_ns();
        match op {
            ClusterOp::Remove(node) if node != leader && self.rng.chance(REMOVAL_AIMED_PPM) => {
                let with: Vec<NodeId> = vec![leader, node];
                let rest: Vec<NodeId> =
                    world.node_ids().into_iter().filter(|n| !with.contains(n)).collect();
                world.net.partition(&with, &rest);
                let until = now + self.rng.range(200_000_000, 1_000_000_000);
                world.set_timer(until, timer_id(TIMER_MEMBERSHIP, HEAL_BIT));
                *self.counts.entry("fault:removed-with-leader").or_default() += 1;
            }
            ClusterOp::AddLearner(node) if node != leader && self.rng.chance(AIMED_PPM) => {
                // A little later, while it catches up (the stall's start is the timer's).
                let at = now + self.rng.range(500_000, 10_000_000);
                let payload = STALL_BIT | u64::from(leader.0) << 16 | u64::from(node.0);
                world.set_timer(at, timer_id(TIMER_MEMBERSHIP, payload));
                *self.counts.entry("fault:learner-stalled").or_default() += 1;
            }
            _ => {}
        }
    }

    /// Polls for a leader that handed its leadership over; stalls every link into it
    /// when one has (see the module docs), else polls again while `polls` last.
    fn watch_hand_over<E: LeaderSim>(&mut self, world: &mut World<E>, polls: u64) {
        let nodes = world.node_ids();
        let handed = nodes.iter().copied().find(|id| {
            world.status_in(*id, 0).is_some_and(|s| s.handed_over && s.transfer_to.is_some())
        });
        let Some(old) = handed else {
            if polls > 1 {
                let at = world.now_ns() + WATCH_EVERY_NS;
                world.set_timer(at, timer_id(TIMER_MEMBERSHIP, WATCH_BIT | (polls - 1)));
            }
            return;
        };
        let until = world.now_ns() + self.rng.range(50_000_000, 400_000_000);
        for from in nodes.into_iter().filter(|id| *id != old) {
            world.net.stall_link(from, old, until);
        }
        *self.counts.entry("fault:deaf-after-hand-over").or_default() += 1;
    }

    fn pick<T: Copy>(&mut self, from: &[T]) -> Option<T> {
        (!from.is_empty()).then(|| from[self.rng.index(from.len())])
    }

    fn on_reply(&mut self, op: ClusterOp, reply: &ClientReply) {
        let kind = match (&reply.result, op) {
            (Ok(_), ClusterOp::AddLearner(_)) => "membership:added",
            (Ok(_), ClusterOp::Promote(_)) => "membership:promoted",
            (Ok(_), ClusterOp::Remove(_)) => "membership:removed",
            (Ok(_), ClusterOp::TransferLeader(_)) => "membership:transferred",
            // Never asked here: a leader keyspace refuses a return.
            (Ok(_), ClusterOp::Return(_)) => "membership:returned",
            (Err(KeelError::Busy(_)), ClusterOp::TransferLeader(_)) => "membership:transfer-busy",
            (Err(KeelError::Busy(_)), _) => "membership:busy",
            (Err(KeelError::InvalidArgument(_)), _) => "membership:refused",
            (Err(KeelError::Timeout), ClusterOp::TransferLeader(_)) => {
                "membership:transfer-timeout"
            }
            (Err(KeelError::Timeout), _) => "membership:timeout",
            (Err(_), _) => "membership:no-leader",
        };
        *self.counts.entry(kind).or_default() += 1;
    }
}
