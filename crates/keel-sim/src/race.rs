//! The lease race: an aimed fault sequence, a targeted nemesis in Jepsen's sense, that the
//! `lease-race` scenario starts at a random time in every seed so that random seeds reach
//! the lease overlap of `docs/protocol.md` §4: a follower `V` of a leader `L` moved to a
//! higher epoch by a late reply while `L`'s lease counts on `V` refusing votes.
//!
//! Its steps are network cuts, two directed link stalls, crashes of a candidate as its
//! vote requests leave ([`World::arm_vote_request_crash`]) and, while that candidate
//! climbs, the loss of every other node's pre-votes (the one fault here no network makes:
//! it keeps the others from probing the climber and taking up its epoch from the
//! refusal). The roles come from the cluster as it stands, every time from the seed, and
//! each step waits for what the cluster does (within a deadline, past which the race
//! gives up). Meanwhile the general
//! nemesis injects nothing new; clients, message loss, duplication and stalls, storage
//! faults and clock changes go on. `V` is the leader when the race starts (epoch `e0`);
//! `W`, `L`, `C` and `A` are the others at random (`L`, `C` and `A` are relabelled once one
//! of them is elected).
//!
//! 1. **climb**: the link `V → W` stalls for 5.5 to 6.5 s (everything `V` sends `W` arrives
//!    after, in order) and `V` is cut off (`V → W` stays open, to carry it). Only `W`'s
//!    pre-votes pass, and `W` crashes as its vote requests leave, three times: it ends in
//!    `e0 + 3`, and nobody else left `e0`.
//! 2. **elect**: `W` is cut off; `L`, `C` and `A` elect one of them (all three votes are
//!    needed, so it may take them two rounds: `e0 + 1` or `e0 + 2`, below `W`).
//! 3. **rejoin**: `V` reaches them again and follows the new leader; its lease counts on
//!    `V`.
//! 4. 0.65 to 1.2 s before the `V → W` stall ends, `C` is cut from `L` and `A` (it reaches
//!    `V` and `W`): its election timer runs, and `W`'s refusal of its first pre-vote moves
//!    it to `e0 + 2`.
//! 5. 5 to 50 ms before the stall ends, the link `V → L` stalls for 1 to 3 s. `V`'s old
//!    `Append`s reach `W`, whose replies in `e0 + 2` move `V` there while `L`'s lease
//!    counts on it (`lease-race:setup`); `V`'s answers to `L` are held back.
//! 6. If `C`'s timer fires while `L`'s lease runs, `W` grants its pre-vote; `V` refuses
//!    until `election_timeout_min` after it last heard `L`, after `L`'s lease has ended.
//!    Under the negative control `forget_leader_contact` `V` grants, `C` is elected with
//!    `V`'s and `W`'s votes, and the world's one-lease check fails the run. 600 ms after
//!    the stall ends, the race's cuts end and the general nemesis resumes.

use crate::clients::{timer_id, TIMER_NEMESIS};
use crate::engine::LeaderSim;
use crate::rng::Rng;
use crate::world::{Fate, World};
use keel_core::leader::Role;
use keel_types::{Epoch, NodeId};
use std::collections::BTreeMap;

const MS: u64 = 1_000_000;
/// The bit that marks the race's timers among the nemesis's payloads.
pub const RACE_TIMER: u64 = 1 << 39;
/// How often the race looks at the cluster while it runs.
const POLL_NS: u64 = 2 * MS;
/// How many epochs `W` climbs unheard: enough to stay above the leader that `L`, `C` and
/// `A` elect, which, needing all three votes, often takes them two rounds.
const CLIMB_EPOCHS: u64 = 3;
/// How long `W` may take to climb (each campaign a crash and a restart).
const CLIMB_NS_MAX: u64 = 3_200 * MS;
/// How long `L`, `C` and `A` may take to elect a leader.
const ELECT_NS_MAX: u64 = 1_500 * MS;
/// How long `V` may take to follow that leader.
const REJOIN_NS_MAX: u64 = 1_000 * MS;
/// How long before `C` is cut the clients are: requests already sent reach `L` first.
const QUIET_LEAD_NS: u64 = 30 * MS;

/// Where the race stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Not started: waiting for a leader with a valid lease.
    Waiting,
    Climb,
    Elect,
    Rejoin,
    /// Clients are to be cut off at `at_ns`.
    Ready,
    /// `C` is to be cut at `at_ns`.
    Quiet,
    /// `V → L` is to stall at `at_ns`.
    Armed,
    /// Watching the overlap until `at_ns`.
    Watch,
    Done,
}

/// The race's roles (see the module docs).
#[derive(Clone, Copy, Debug)]
struct Roles {
    v: NodeId,
    w: NodeId,
    l: NodeId,
    c: NodeId,
    a: NodeId,
    e0: Epoch,
    /// `W`'s epoch once it climbed.
    e_w: Epoch,
    /// When the `V → W` stall ends.
    stall_end: u64,
}

/// One seed's lease race.
pub struct LeaseRace {
    rng: Rng,
    phase: Phase,
    /// The current phase's deadline, or the time of its next step.
    at_ns: u64,
    /// The last moment the race may start.
    start_by_ns: u64,
    roles: Option<Roles>,
    /// Directed links the race holds cut.
    cuts: Vec<(NodeId, NodeId)>,
    /// `V`'s count of epochs raised under a live leader when `V → L` stalled.
    raised_before: u64,
    /// What the race reached, by coverage name.
    pub counts: BTreeMap<&'static str, u64>,
    /// What the race did, for the run report.
    pub log: Vec<String>,
}

impl LeaseRace {
    /// A race drawn from `seed` that starts 0.5 to 1.5 s into the run, as soon as a leader
    /// holds a valid lease (and gives up if none does by 3 s).
    pub fn new(seed: u64) -> LeaseRace {
        LeaseRace {
            rng: Rng::new(seed),
            phase: Phase::Waiting,
            at_ns: 0,
            start_by_ns: 3_000 * MS,
            roles: None,
            cuts: Vec::new(),
            raised_before: 0,
            counts: BTreeMap::new(),
            log: Vec::new(),
        }
    }

    /// Schedules the race's first look at the cluster.
    pub fn start<E: LeaderSim + 'static>(&mut self, world: &mut World<E>) {
        let at = world.now_ns() + self.rng.range(500 * MS, 1_500 * MS);
        world.set_timer(at, timer_id(TIMER_NEMESIS, RACE_TIMER));
    }

    /// Whether the race holds the network (the general nemesis then injects nothing).
    pub fn active(&self) -> bool {
        !matches!(self.phase, Phase::Waiting | Phase::Done)
    }

    /// Puts the race's cuts back after something healed the network.
    pub fn restore<E: LeaderSim + 'static>(&self, world: &mut World<E>) {
        if self.active() {
            for (from, to) in &self.cuts {
                world.net.cut_one_way(&[*from], &[*to]);
            }
        }
    }

    /// Ends the race where it stands: its cuts and the armed crash end.
    pub fn end<E: LeaderSim + 'static>(&mut self, world: &mut World<E>) {
        if self.active() {
            world.net.heal();
            world.set_message_rule(None);
            if let Some(r) = self.roles {
                world.arm_vote_request_crash(r.w, false);
            }
        }
        self.cuts.clear();
        self.phase = Phase::Done;
    }

    /// The race's timer fired: take the next step, and look again soon unless done.
    pub fn on_timer<E: LeaderSim + 'static>(&mut self, world: &mut World<E>) {
        let now = world.now_ns();
        match self.phase {
            Phase::Waiting => self.begin(world),
            Phase::Climb => self.climb(world),
            Phase::Elect => self.elect(world),
            Phase::Rejoin => self.rejoin(world),
            Phase::Ready if now >= self.at_ns => self.quiet(world),
            Phase::Quiet if now >= self.at_ns => self.cut_c(world),
            Phase::Armed if now >= self.at_ns => self.stall_v_to_l(world),
            Phase::Watch => self.watch(world),
            Phase::Ready | Phase::Quiet | Phase::Armed | Phase::Done => {}
        }
        if self.phase != Phase::Done {
            world.set_timer(world.now_ns() + POLL_NS, timer_id(TIMER_NEMESIS, RACE_TIMER));
        }
    }

    fn note<E: LeaderSim + 'static>(&mut self, world: &World<E>, what: String) {
        if world.trace {
            eprintln!("{:>12} lease race: {what}", world.now_ns());
        }
        self.log.push(format!("{:.3}s lease race: {what}", world.now_ns() as f64 / 1e9));
    }

    fn count(&mut self, what: &'static str) {
        *self.counts.entry(what).or_default() += 1;
    }

    fn give_up<E: LeaderSim + 'static>(&mut self, world: &mut World<E>, why: &str) {
        self.note(world, format!("gave up: {why}"));
        self.count("lease-race:gave-up");
        self.end(world);
    }

    /// Replaces the race's cuts (and every other cut) with `cuts`.
    fn set_cuts<E: LeaderSim + 'static>(
        &mut self,
        world: &mut World<E>,
        cuts: Vec<(NodeId, NodeId)>,
    ) {
        world.net.heal();
        self.cuts = cuts;
        self.restore(world);
    }

    /// Phase 1: roles, the `V → W` stall, `W` armed to crash, and the climb's cuts.
    fn begin<E: LeaderSim + 'static>(&mut self, world: &mut World<E>) {
        let now = world.now_ns();
        let leader = world.leader().filter(|v| lease_valid(world, *v));
        let Some(v) = leader else {
            if now >= self.start_by_ns {
                self.phase = Phase::Done;
            }
            return;
        };
        let mut others: Vec<NodeId> = world.node_ids().into_iter().filter(|n| *n != v).collect();
        assert_eq!(others.len(), 4, "the lease race plays on five nodes");
        let w = others.remove(self.rng.index(others.len()));
        let (l, c, a) = (others[0], others[1], others[2]);
        let stall_end = now + self.rng.range(5_500 * MS, 6_500 * MS);
        let e0 = epoch(world, v);
        self.roles = Some(Roles { v, w, l, c, a, e0, e_w: e0, stall_end });
        world.net.stall_link(v, w, stall_end);
        world.arm_vote_request_crash(w, true);
        world.set_message_rule(Some(Box::new(move |from, _to, m: &E::Message| {
            match from != w && E::facts(m).asks_pre_vote {
                true => Fate::Drop,
                false => Fate::Pass,
            }
        })));
        let mut cuts = both(v, &[l, c, a]);
        cuts.push((w, v));
        self.phase = Phase::Climb;
        self.set_cuts(world, cuts);
        self.at_ns = now + CLIMB_NS_MAX;
        self.count("fault:lease-race");
        let end = stall_end as f64 / 1e9;
        self.note(world, format!("V={v} (leads {e0:?}) W={w}; stall {v}->{w} until {end:.3}s"));
    }

    /// Phase 1 until `W` is [`CLIMB_EPOCHS`] up; then phase 2's cuts.
    fn climb<E: LeaderSim + 'static>(&mut self, world: &mut World<E>) {
        let r = self.roles.expect("started");
        if world.is_up(r.w) && epoch(world, r.w) >= Epoch(r.e0.0 + CLIMB_EPOCHS) {
            self.roles = Some(Roles { e_w: epoch(world, r.w), ..r });
            let mut cuts = both(r.v, &[r.l, r.c, r.a]);
            cuts.extend(both(r.w, &[r.v, r.l, r.c, r.a]).into_iter().filter(|p| *p != (r.v, r.w)));
            world.set_message_rule(None);
            self.phase = Phase::Elect;
            self.set_cuts(world, cuts);
            self.at_ns = world.now_ns() + ELECT_NS_MAX;
            self.count("lease-race:climbed");
            self.note(world, format!("{} in {:?}, unheard", r.w, epoch(world, r.w)));
        } else if world.now_ns() >= self.at_ns {
            self.give_up(world, "W did not climb in time");
        }
    }

    /// Phase 2 until one of `L`, `C` and `A` leads below `W`'s epoch; then `V` rejoins.
    fn elect<E: LeaderSim + 'static>(&mut self, world: &mut World<E>) {
        let r = self.roles.expect("started");
        let elected = [r.l, r.c, r.a].into_iter().find(|n| lease_valid(world, *n));
        if let Some(l) = elected {
            if epoch(world, l) >= r.e_w {
                let why = format!("{l} elected in {:?}, not below {:?}", epoch(world, l), r.e_w);
                return self.give_up(world, &why);
            }
            let mut rest: Vec<NodeId> = [r.l, r.c, r.a].into_iter().filter(|n| *n != l).collect();
            let c = rest.remove(self.rng.index(rest.len()));
            self.roles = Some(Roles { l, c, a: rest[0], ..r });
            let mut cuts = both(r.w, &[r.l, r.c, r.a]);
            cuts.push((r.w, r.v));
            world.arm_vote_request_crash(r.w, false);
            self.phase = Phase::Rejoin;
            self.set_cuts(world, cuts);
            self.at_ns = world.now_ns() + REJOIN_NS_MAX;
            self.count("lease-race:elected");
            self.note(
                world,
                format!("L={l} leads in {:?}; C={c}; {} rejoins", epoch(world, l), r.v),
            );
        } else if world.now_ns() >= self.at_ns {
            self.give_up(world, "no leader elected");
        }
    }

    /// Phase 3 until `V` follows `L`; then phase 4 is scheduled.
    fn rejoin<E: LeaderSim + 'static>(&mut self, world: &mut World<E>) {
        let r = self.roles.expect("started");
        let follows = world.status(r.v).is_some_and(|s| s.leader == Some(r.l));
        let now = world.now_ns();
        if follows && lease_valid(world, r.l) {
            self.at_ns = r.stall_end - self.rng.range(650 * MS, 1_200 * MS) - QUIET_LEAD_NS;
            if self.at_ns <= now {
                return self.give_up(world, "too late to cut C");
            }
            self.phase = Phase::Ready;
            self.count("lease-race:rejoined");
        } else if now >= self.at_ns {
            self.give_up(world, "V did not follow L");
        }
    }

    /// Phase 4 begins: clients are cut off until the stall ends, so that `L` appends
    /// nothing that `C`, about to be cut, would lack and `V` would hold.
    fn quiet<E: LeaderSim + 'static>(&mut self, world: &mut World<E>) {
        let r = self.roles.expect("started");
        world.cut_clients_until(r.stall_end + 100 * MS);
        self.phase = Phase::Quiet;
        self.at_ns += QUIET_LEAD_NS;
        self.count("lease-race:quiet");
        self.note(world, "clients cut off".into());
    }

    /// Phase 4: `C` and `W` cut from `L` and `A`.
    fn cut_c<E: LeaderSim + 'static>(&mut self, world: &mut World<E>) {
        let r = self.roles.expect("started");
        if !lease_valid(world, r.l) {
            return self.give_up(world, "L lost its lease before C was cut");
        }
        let mut cuts = both(r.c, &[r.l, r.a]);
        cuts.extend(both(r.w, &[r.l, r.a]));
        self.phase = Phase::Armed;
        self.set_cuts(world, cuts);
        self.at_ns = r.stall_end - self.rng.range(5 * MS, 50 * MS);
        self.note(world, format!("cut {} from {} and {}", r.c, r.l, r.a));
    }

    /// Phase 5: `V → L` stalls just before `V`'s old `Append`s reach `W`.
    fn stall_v_to_l<E: LeaderSim + 'static>(&mut self, world: &mut World<E>) {
        let r = self.roles.expect("started");
        let until = world.now_ns() + self.rng.range(1_000 * MS, 3_000 * MS);
        world.net.stall_link(r.v, r.l, until);
        self.raised_before = raised_count(world, r.v);
        self.phase = Phase::Watch;
        self.at_ns = r.stall_end + 600 * MS;
        self.note(world, format!("stall {}->{} until {:.3}s", r.v, r.l, until as f64 / 1e9));
    }

    /// Phase 6: counts the setup and a second leader beside `L`'s lease, then ends.
    fn watch<E: LeaderSim + 'static>(&mut self, world: &mut World<E>) {
        let r = self.roles.expect("started");
        let lease = lease_valid(world, r.l);
        let moved =
            epoch(world, r.v) > epoch(world, r.l) && raised_count(world, r.v) > self.raised_before;
        if lease && moved && !self.counts.contains_key("lease-race:setup") {
            self.count("lease-race:setup");
            self.note(
                world,
                format!("{} moved to {:?} under {}'s lease", r.v, epoch(world, r.v), r.l),
            );
        }
        let other =
            world.node_ids().into_iter().any(|n| n != r.l && role(world, n) == Role::Leader);
        if lease && other && !self.counts.contains_key("lease-race:second-leader") {
            self.count("lease-race:second-leader");
        }
        if world.now_ns() >= self.at_ns {
            self.note(world, "over".into());
            self.end(world);
        }
    }
}

/// The directed links between `node` and each of `others`, both ways.
fn both(node: NodeId, others: &[NodeId]) -> Vec<(NodeId, NodeId)> {
    others.iter().flat_map(|o| [(node, *o), (*o, node)]).collect()
}

fn epoch<E: LeaderSim + 'static>(world: &World<E>, node: NodeId) -> Epoch {
    world.status(node).map_or(Epoch(0), |s| s.epoch)
}

fn role<E: LeaderSim + 'static>(world: &World<E>, node: NodeId) -> Role {
    world.status(node).map_or(Role::Follower, |s| s.role)
}

/// Whether `node` leads with a valid leader lease (as of its last step).
fn lease_valid<E: LeaderSim + 'static>(world: &World<E>, node: NodeId) -> bool {
    world.status(node).is_some_and(|s| s.role == Role::Leader && s.leader_lease_valid)
}

/// How often `node`'s engine moved to a higher epoch while a leader's lease could count
/// on it (the engine's `epochs_raised_under_live_leader`).
fn raised_count<E: LeaderSim + 'static>(world: &World<E>, node: NodeId) -> u64 {
    let paths = world.engine(node).map(|e| e.path_counts()).unwrap_or_default();
    paths.iter().find(|(p, _)| *p == "epoch-raised-under-live-leader").map_or(0, |(_, n)| *n)
}
