//! The nemesis: a schedule of faults drawn from the seed. Each fault starts at a random
//! time and ends after a random duration: crash then restart (restart recovers from the
//! disk, losing unsynced writes), pause (a stalled process whose events wait), slow disk
//! (fsync latency multiplied), and network partitions (a node isolated, a majority/
//! minority split, or a one-way cut). Clock rates change at crashes (see `world`).

use crate::clients::{timer_id, TIMER_CLASS_SHIFT, TIMER_NEMESIS};
use crate::engine::LeaderSim;
use crate::race::{LeaseRace, RACE_TIMER};
use crate::rng::Rng;
use crate::world::World;
use keel_types::NodeId;
use std::collections::BTreeMap;

/// Most fault endings pending at once.
pub const PENDING_MAX: usize = 64;

/// Which faults the nemesis may inject, and how often.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NemesisConfig {
    /// Crash and restart nodes.
    pub crash: bool,
    /// Pause nodes.
    pub pause: bool,
    /// Partition the network.
    pub partition: bool,
    /// Slow disks down.
    pub slow_disk: bool,
    /// Gap between fault starts, uniform in `[gap_ns_min, gap_ns_max)`.
    pub gap_ns_min: u64,
    /// See `gap_ns_min`.
    pub gap_ns_max: u64,
    /// Fault durations, uniform in `[duration_ns_min, duration_ns_max)`.
    pub duration_ns_min: u64,
    /// See `duration_ns_min`.
    pub duration_ns_max: u64,
    /// Chance (ppm) that a partition puts the leader on its minority side (isolating the
    /// leader, as Jepsen's partition-leader nemesis does), drawn on a generator of its
    /// own (`aim_seed`) so that the other draws of a seed stay the same.
    pub aim_leader_ppm: u32,
    /// Seed of the aiming generator.
    pub aim_seed: u64,
    /// Chance (ppm), drawn on the aiming generator, that a partition is a *bridge*: two
    /// sides cut from each other and one node that reaches both (Jepsen's bridge).
    pub bridge_ppm: u32,
    /// Chance (ppm), drawn on the aiming generator, that a fault start also stalls one
    /// directed link for 100 ms to 2 s: what is sent on it meanwhile arrives after, in
    /// order (a TCP connection waiting out a retransmission timeout).
    pub link_stall_ppm: u32,
}

impl NemesisConfig {
    /// Every fault on, about one fault start every 50–400 ms lasting 20–800 ms.
    pub fn all() -> NemesisConfig {
        NemesisConfig {
            crash: true,
            pause: true,
            partition: true,
            slow_disk: true,
            gap_ns_min: 50_000_000,
            gap_ns_max: 400_000_000,
            duration_ns_min: 20_000_000,
            duration_ns_max: 800_000_000,
            aim_leader_ppm: 0,
            aim_seed: 0,
            bridge_ppm: 0,
            link_stall_ppm: 0,
        }
    }
}

/// A fault's ending.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ending {
    Restart(NodeId),
    Heal,
}

/// The fault schedule of one run.
pub struct Nemesis {
    config: NemesisConfig,
    rng: Rng,
    pending: BTreeMap<u64, Ending>,
    next_id: u64,
    stopped: bool,
    /// Log of injected faults, for the run report (the first [`LOG_MAX`]).
    pub log: Vec<String>,
    /// Faults injected, by coverage name (`fault:crash`, ...), however long the log.
    pub counts: BTreeMap<&'static str, u64>,
    /// Decides which partitions isolate the leader (`NemesisConfig::aim_leader_ppm`).
    aim: Rng,
    /// The `lease-race` scenario's aimed fault sequence (`race.rs`); while it holds the
    /// network, no other fault starts.
    pub race: Option<LeaseRace>,
}

/// Payload of the timer that starts the next fault.
const NEXT_FAULT: u64 = 0;
/// Most entries kept in the fault log.
const LOG_MAX: usize = 10_000;

impl Nemesis {
    /// A nemesis with its own PRNG stream.
    pub fn new(config: NemesisConfig, rng: Rng) -> Nemesis {
        assert!(
            config.gap_ns_max > config.gap_ns_min
                && config.duration_ns_max > config.duration_ns_min
        );
        let aim = Rng::new(config.aim_seed);
        Nemesis {
            config,
            rng,
            pending: BTreeMap::new(),
            next_id: 1,
            stopped: false,
            log: Vec::new(),
            counts: BTreeMap::new(),
            aim,
            race: None,
        }
    }

    /// Schedules the first fault.
    pub fn start<E: LeaderSim>(&mut self, world: &mut World<E>) {
        let at = world.now_ns() + self.rng.range(self.config.gap_ns_min, self.config.gap_ns_max);
        world.set_timer(at, timer_id(TIMER_NEMESIS, NEXT_FAULT));
    }

    /// Handles a nemesis timer; false if the id is not the nemesis's.
    pub fn handle<E: LeaderSim>(&mut self, world: &mut World<E>, id: u64) -> bool {
        if id >> TIMER_CLASS_SHIFT != TIMER_NEMESIS {
            return false;
        }
        let payload = id & ((1 << TIMER_CLASS_SHIFT) - 1);
        if payload == RACE_TIMER {
            if let Some(race) = self.race.as_mut().filter(|_| !self.stopped) {
                race.on_timer(world);
            }
        } else if payload == NEXT_FAULT {
            if !self.stopped {
                self.inject(world);
                self.start(world);
            }
        } else if let Some(ending) = self.pending.remove(&payload) {
            match ending {
                Ending::Restart(node) => world.restart(node),
                Ending::Heal => {
                    world.net.heal();
                    if let Some(race) = &self.race {
                        race.restore(world);
                    }
                }
            }
        }
        true
    }

    /// Stops injecting and ends every fault now: heal, restart, unpause.
    pub fn heal_all<E: LeaderSim>(&mut self, world: &mut World<E>) {
        self.stopped = true;
        if let Some(race) = &mut self.race {
            race.end(world);
            for (kind, count) in std::mem::take(&mut race.counts) {
                *self.counts.entry(kind).or_default() += count;
            }
            self.log.append(&mut race.log);
        }
        self.pending.clear();
        world.net.heal();
        for node in world.node_ids() {
            world.unpause(node);
            world.slow_disk(node, 1, 0);
            world.restart(node);
        }
    }

    fn note(&mut self, at_ns: u64, kind: &'static str, what: String) {
        *self.counts.entry(kind).or_default() += 1;
        if self.log.len() < LOG_MAX {
            self.log.push(format!("{:.3}s {what}", at_ns as f64 / 1e9));
        }
    }

    fn inject<E: LeaderSim>(&mut self, world: &mut World<E>) {
        if self.race.as_ref().is_some_and(|race| race.active()) {
            return;
        }
        let nodes = world.node_ids();
        if self.config.link_stall_ppm > 0 && self.aim.chance(self.config.link_stall_ppm) {
            let from = nodes[self.aim.index(nodes.len())];
            let others: Vec<NodeId> = nodes.iter().copied().filter(|n| *n != from).collect();
            let to = others[self.aim.index(others.len())];
            let now = world.now_ns();
            let until = now + self.aim.range(100_000_000, 2_000_000_000);
            world.net.stall_link(from, to, until);
            self.note(
                now,
                "fault:link-stall",
                format!("stall {from} -> {to} until {:.3}s", until as f64 / 1e9),
            );
        }
        let node = nodes[self.rng.index(nodes.len())];
        let now = world.now_ns();
        let until = now + self.rng.range(self.config.duration_ns_min, self.config.duration_ns_max);
        let c = &self.config;
        let kinds: Vec<u8> = [(c.crash, 0u8), (c.pause, 1), (c.partition, 2), (c.slow_disk, 3)]
            .into_iter()
            .filter_map(|(on, k)| on.then_some(k))
            .collect();
        if kinds.is_empty() || self.pending.len() >= PENDING_MAX {
            return;
        }
        match kinds[self.rng.index(kinds.len())] {
            0 => {
                world.crash(node);
                self.end_at(world, until, Ending::Restart(node));
                self.note(
                    now,
                    "fault:crash",
                    format!("crash {node} until {:.3}s", until as f64 / 1e9),
                );
            }
            1 => {
                world.pause(node, until);
                self.note(
                    now,
                    "fault:pause",
                    format!("pause {node} until {:.3}s", until as f64 / 1e9),
                );
            }
            2 => self.partition(world, &nodes, until),
            _ => {
                let factor = self.rng.range(5, 100);
                world.slow_disk(node, factor, until);
                self.note(now, "fault:slow-disk", format!("slow disk {node} x{factor}"));
            }
        }
    }

    fn partition<E: LeaderSim>(&mut self, world: &mut World<E>, nodes: &[NodeId], until: u64) {
        let mut shuffled = nodes.to_vec();
        self.rng.shuffle(&mut shuffled);
        let split = 1 + self.rng.index(nodes.len() / 2);
        let now = world.now_ns();
        if nodes.len() >= 3 && self.config.bridge_ppm > 0 && self.aim.chance(self.config.bridge_ppm)
        {
            // shuffled[0] bridges; the rest splits in two halves cut from each other.
            let (bridge, rest) = shuffled.split_first().expect("three nodes or more");
            let (a, b) = rest.split_at(rest.len() / 2);
            world.net.partition(a, b);
            self.note(now, "fault:bridge", format!("bridge {bridge} between {a:?} | {b:?}"));
            self.end_at(world, until, Ending::Heal);
            return;
        }
        let aimed = self.config.aim_leader_ppm > 0 && self.aim.chance(self.config.aim_leader_ppm);
        if let Some(leader) = world.leader().filter(|_| aimed) {
            let at = shuffled.iter().position(|n| *n == leader).expect("the leader is a node");
            if at >= split {
                shuffled.swap(0, at);
            }
            *self.counts.entry("fault:leader-isolated").or_default() += 1;
        }
        let (minority, majority) = shuffled.split_at(split);
        if self.rng.chance(300_000) {
            world.net.cut_one_way(majority, minority);
            let what = format!("one-way cut {majority:?} -> {minority:?}");
            self.note(now, "fault:one-way-cut", what);
        } else {
            world.net.partition(minority, majority);
            self.note(now, "fault:partition", format!("partition {minority:?} | {majority:?}"));
        }
        self.end_at(world, until, Ending::Heal);
    }

    fn end_at<E: LeaderSim>(&mut self, world: &mut World<E>, at_ns: u64, ending: Ending) {
        let id = self.next_id;
        self.next_id += 1;
        self.pending.insert(id, ending);
        world.set_timer(at_ns, timer_id(TIMER_NEMESIS, id));
    }
}
