//! `keel sim run --engine kite --scenario general`: sessions on every node issue random
//! relaxed accesses, releases, acquires, FAAs and CASes (some sessions several at once)
//! while the network drops, delays and stalls messages, links are cut, nodes sleep, and
//! a minority crashes for good. At the end the faults heal, the cluster quiesces, and
//! every live node acquires and then reads every key. Checked: the whole history against
//! release consistency (`keel_check::rc`), the final reads against every write completed
//! by a live node (convergence), and that no node dropped a message of another as
//! malformed.

use super::recorder::{key, value, Recorder};
use super::world::{Fate, KiteWorld, NetConfig};
use crate::rng::Rng;
use keel_check::rc::RcOp;
use keel_core::engine::RequestTag;
use keel_core::kite::{Config, KiteOp, KiteResult, Message, ReplyForm, Stamp, VotersWanted};
use keel_core::time::Span;
use keel_types::NodeId;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// Keys written by relaxed writes, releases and CASes.
pub const DATA_KEYS: u64 = 6;
/// Keys only FAAs write (counters).
pub const COUNTER_KEYS: u64 = 2;

/// What one run is.
#[derive(Clone, Debug)]
pub struct KiteRunConfig {
    /// The seed everything is drawn from.
    pub seed: u64,
    /// The scenario's name (for the replay line).
    pub scenario: String,
    /// Negative control: releases never take the slow path.
    pub no_slow_path: bool,
    /// Negative control: releases and read-modify-writes go on before any acknowledgement
    /// of their session's earlier writes.
    pub release_before_acks: bool,
    /// Negative control: releases and read-modify-write commits complete once sent.
    pub complete_without_quorum: bool,
    /// Negative control: out-of-epoch accesses settle their key in the current epoch.
    pub no_epoch_snapshot: bool,
    /// Negative control: the paper's reset (to every node, naming only the acquire).
    pub paper_reset: bool,
    /// Negative control: a retry a client sends after its connection broke goes as a new
    /// request, not under the number the client gave the first attempt.
    pub unnamed_retries: bool,
    /// Negative control: a restarted node serves at once, without rejoining.
    pub no_rejoin: bool,
    /// Negative control: the rejoin without its fence (rounds count replies of an
    /// earlier incarnation after learning of a later one).
    pub unfenced_rejoin: bool,
    /// Negative control: a named request's failure is answered without being committed.
    pub uncommitted_failures: bool,
    /// Negative control: proposers ignore the outcomes a quorum shows.
    pub forget_outcomes: bool,
    /// Negative control: links refuse no client values (`NetConfig::unsafe_unbounded_links`).
    pub unbounded_links: bool,
    /// Negative control (`membership`): during a change a quorum is a majority of the new
    /// voters alone.
    pub new_quorum_only: bool,
    /// Negative control (`membership`): a change settles without the new voters' sync.
    pub unsynced_change: bool,
    /// Negative control (`membership`): rounds keep replies across memberships.
    pub mixed_epoch_rounds: bool,
    /// Keep the history in the report.
    pub keep_history: bool,
}

impl KiteRunConfig {
    /// The general scenario for `seed`.
    pub fn new(seed: u64) -> KiteRunConfig {
        KiteRunConfig {
            seed,
            scenario: "general".into(),
            no_slow_path: false,
            release_before_acks: false,
            complete_without_quorum: false,
            no_epoch_snapshot: false,
            paper_reset: false,
            no_rejoin: false,
            unfenced_rejoin: false,
            unnamed_retries: false,
            uncommitted_failures: false,
            forget_outcomes: false,
            unbounded_links: false,
            new_quorum_only: false,
            unsynced_change: false,
            mixed_epoch_rounds: false,
            keep_history: false,
        }
    }

    /// The command that replays this run.
    pub fn replay(&self) -> String {
        let mut line =
            format!("keel sim run --engine kite --scenario {} --seed {}", self.scenario, self.seed);
        if self.no_slow_path {
            line.push_str(" --no-slow-path");
        }
        if self.release_before_acks {
            line.push_str(" --release-before-acks");
        }
        if self.complete_without_quorum {
            line.push_str(" --complete-without-quorum");
        }
        if self.no_epoch_snapshot {
            line.push_str(" --no-epoch-snapshot");
        }
        if self.paper_reset {
            line.push_str(" --paper-reset");
        }
        if self.no_rejoin {
            line.push_str(" --no-rejoin");
        }
        if self.unfenced_rejoin {
            line.push_str(" --unfenced-rejoin");
        }
        if self.unnamed_retries {
            line.push_str(" --unnamed-retries");
        }
        if self.uncommitted_failures {
            line.push_str(" --uncommitted-failures");
        }
        if self.forget_outcomes {
            line.push_str(" --forget-outcomes");
        }
        if self.unbounded_links {
            line.push_str(" --unbounded-links");
        }
        if self.new_quorum_only {
            line.push_str(" --new-quorum-only");
        }
        if self.unsynced_change {
            line.push_str(" --unsynced-change");
        }
        if self.mixed_epoch_rounds {
            line.push_str(" --mixed-epoch-rounds");
        }
        line
    }
}

/// What a run found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct KiteReport {
    /// The seed.
    pub seed: u64,
    /// The scenario.
    pub scenario: String,
    /// Nodes.
    pub nodes: u32,
    /// Operations started.
    pub ops: usize,
    /// Operations completed.
    pub ok: usize,
    /// Synchronization operations (acquires, releases, RMWs) in the history.
    pub sync_ops: usize,
    /// Faults injected, in order.
    pub faults: Vec<String>,
    /// Violations found (empty: passed).
    pub violations: Vec<String>,
    /// Paths reached: a name and how often.
    pub reached: BTreeMap<String, u64>,
    /// Virtual time run, ms.
    pub virtual_ms: u64,
    /// The command that replays the run.
    pub replay: String,
    /// A panic's message, if the run panicked.
    pub panic: Option<String>,
    /// The history, when asked for.
    #[serde(skip)]
    pub history: Option<Vec<keel_check::rc::RcOp>>,
}

impl KiteReport {
    /// Whether every check held.
    pub fn passed(&self) -> bool {
        self.violations.is_empty() && self.panic.is_none()
    }
}

/// A configuration template with the run's unsafe switches.
pub fn template(config: &KiteRunConfig, release_timeout: Span) -> Config {
    let mut template = Config::new(NodeId(1), vec![NodeId(1)]);
    template.release_timeout = release_timeout;
    template.retransmit = Span::from_millis(10);
    template.rmw_backoff_max = Span::from_millis(5);
    template.check_invariants = true;
    template.unsafe_no_slow_path = config.no_slow_path;
    template.unsafe_release_before_acks = config.release_before_acks;
    template.unsafe_complete_without_quorum = config.complete_without_quorum;
    template.unsafe_no_epoch_snapshot = config.no_epoch_snapshot;
    template.unsafe_paper_reset = config.paper_reset;
    template.unsafe_uncommitted_failures = config.uncommitted_failures;
    template.unsafe_forget_outcomes = config.forget_outcomes;
    template.unsafe_no_rejoin = config.no_rejoin;
    template.unsafe_unfenced_rejoin = config.unfenced_rejoin;
    template.unsafe_new_quorum_only = config.new_quorum_only;
    template.unsafe_unsynced_change = config.unsynced_change;
    template.unsafe_mixed_epoch_rounds = config.mixed_epoch_rounds;
    template
}

/// Runs one seed of the general scenario, catching panics as failures.
pub fn run_general(config: &KiteRunConfig) -> KiteReport {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| general(config))) {
        Ok(report) => report,
        Err(panic) => KiteReport {
            seed: config.seed,
            scenario: config.scenario.clone(),
            replay: config.replay(),
            panic: Some(panic_message(&panic)),
            ..KiteReport::default()
        },
    }
}

/// A panic payload's text.
pub fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panic".into())
}

struct SimSession {
    /// The client's id: its engine session, and its requests' name when it names them.
    id: u64,
    /// The history session its requests are recorded in (a new one after its connection
    /// broke, when it goes on under the same id).
    hist: u64,
    node: NodeId,
    depth: usize,
    outstanding: usize,
    next_at: u64,
    /// The last value this session saw of each data key (a CAS expects it).
    seen: BTreeMap<u64, Option<u64>>,
    /// The data key this session wrote last: half its CASes go to it (a lock taken
    /// where it was last released), so that a CAS often expects a value its own node
    /// may not have passed on yet.
    last_written: Option<u64>,
    /// The number of its next request, for a client that names its requests (as
    /// `KEEL.REQ` does, its session id being its client id); `None` for one that does not.
    named: Option<u64>,
    /// Its requests sent and not answered yet, and whether each is a read-modify-write
    /// (kept for clients that name their requests).
    pending: Vec<(RequestTag, bool)>,
}

/// The clients of `node` whose connections broke (the node crashed, or only the
/// connections did), for those that name their requests: each goes on at another live
/// node under the same client id, as a new session of the history, and first sends its
/// read-modify-writes still unanswered again there, under the numbers it gave them (a
/// new number with `unnamed`, the negative control). No reply to a request sent over the
/// broken connection is listened to any more: its other requests stay without one (they
/// may or may not have been done). Returns the history sessions left behind.
#[allow(clippy::too_many_arguments)]
fn move_named_clients(
    world: &mut KiteWorld,
    recorder: &mut Recorder,
    rng: &mut Rng,
    sessions: &mut [SimSession],
    node: NodeId,
    next_session: &mut u64,
    abandoned: &mut BTreeSet<RequestTag>,
    unnamed: bool,
    reached: &mut BTreeMap<String, u64>,
) -> Vec<u64> {
    // A client reconnects to a node that votes (as it knows): one that does not refuses it.
    let votes = |m: NodeId| world.engine(m).is_some_and(|e| e.membership().contains(m));
    let others: Vec<NodeId> = world.live().into_iter().filter(|&m| m != node && votes(m)).collect();
    let mut moved = Vec::new();
    if others.is_empty() {
        return moved;
    }
    for s in sessions.iter_mut().filter(|s| s.node == node && s.named.is_some()) {
        let to = others[rng.below(others.len() as u64) as usize];
        moved.push(s.hist);
        *next_session += 1;
        s.hist = *next_session;
        recorder.rename(s.id, s.hist);
        s.node = to;
        s.outstanding = 0;
        s.seen.clear();
        s.last_written = None;
        for (tag, rmw) in std::mem::take(&mut s.pending) {
            abandoned.insert(tag);
            if rmw {
                *reached.entry("client-retry".into()).or_default() += 1;
                // The first attempt was done already (its reply lost with the connection):
                // the case a retry must not do again.
                let first = world.watch().rmw_ids().get(&tag);
                if first.is_some_and(|id| world.watch().commits().contains_key(id)) {
                    *reached.entry("client-retry-of-done".into()).or_default() += 1;
                } else if first.is_some() {
                    // Started and not committed: the first attempt may still go on.
                    *reached.entry("client-retry-of-running".into()).or_default() += 1;
                }
                if let Some(again) = recorder.retry(world, tag, to, s.id, unnamed) {
                    s.pending.push((again, true));
                    s.outstanding += 1;
                }
            }
        }
    }
    moved
}

#[derive(Clone, Debug)]
enum Fault {
    Pause {
        node: NodeId,
        ms: u64,
    },
    Isolate {
        node: NodeId,
        ms: u64,
    },
    OneWay {
        from: NodeId,
        to: NodeId,
        ms: u64,
    },
    Crash {
        node: NodeId,
    },
    /// Crash, then boot a new incarnation after `ms` that rejoins.
    Restart {
        node: NodeId,
        ms: u64,
    },
    /// The connections of the node's clients break (the node stays up).
    ClientCut {
        node: NodeId,
    },
    /// `side` and the other members split, every other cut restored; everyone on one
    /// side when `side` holds every member (a heal).
    Partition {
        side: Vec<NodeId>,
    },
    /// A restart with a late acknowledgement ([`LateAck`]): armed now, it goes on by
    /// itself.
    LateAck(LateAck),
    /// The links from `from` to each of `to` are cut (until a partition or a heal).
    Cut {
        from: NodeId,
        to: Vec<NodeId>,
    },
    /// The links from `from` to each of `to` are restored.
    Uncut {
        from: NodeId,
        to: Vec<NodeId>,
    },
    /// The link `from -> to` holds what is sent on it, until released.
    Hold {
        from: NodeId,
        to: NodeId,
    },
    /// The link `from -> to` delivers what it held.
    Release {
        from: NodeId,
        to: NodeId,
    },
}

const STEP_NS: u64 = 200_000;
/// The sessions of the final acquires and reads start here (the scenario's own sessions
/// stay below it).
const FINAL_SESSIONS: u64 = 10_000;
const MS: u64 = 1_000_000;

fn general(config: &KiteRunConfig) -> KiteReport {
    let mut rng = Rng::new(config.seed ^ 0x6b69_7465_5f67_656e);
    // Cluster sizes and the late acknowledgement come from their own stream, so that the
    // rest of a seed's run is drawn as before they existed.
    let mut topology = Rng::new(config.seed ^ 0x6b69_7465_5f74_6f70);
    // Clients' draws (which name their requests, connection cuts) come from their own
    // stream, so that the rest of a seed's run is drawn as before they existed.
    let mut clients = Rng::new(config.seed ^ 0x6b69_7465_5f63_6c69);
    let (world, duration) = draw_cluster(config, &mut rng, &mut topology);
    let n = world.members().len() as u32;
    let schedule = draw_schedule(
        config.seed,
        &world.members(),
        duration,
        &mut rng,
        &mut topology,
        &mut clients,
    );
    let changes = config.scenario == "membership";
    let schedule = if changes { one_restart(schedule) } else { schedule };
    let restarts =
        schedule.iter().any(|(_, f)| matches!(f, Fault::Restart { .. } | Fault::LateAck(_)));
    let sessions = draw_sessions(&world.members(), &mut rng, &mut clients);
    let mut report = KiteReport {
        seed: config.seed,
        scenario: config.scenario.clone(),
        nodes: n,
        replay: config.replay(),
        ..KiteReport::default()
    };
    if schedule.iter().any(|(_, f)| matches!(f, Fault::LateAck(_))) {
        report.reached.insert("fault:late-ack".into(), 1);
    }
    let mut run = GeneralRun {
        unnamed_retries: config.unnamed_retries,
        world,
        rng,
        clients,
        bias: Rng::new(config.seed ^ 0x6b69_7465_5f62_6961),
        sessions,
        recorder: Recorder::new(),
        report,
        heals: Vec::new(),
        abandoned: BTreeSet::new(),
        restarts: Vec::new(),
        dead_sessions: Vec::new(),
        next_session: 1_000,
        failed_named: Vec::new(),
        next_value: 1 << 40,
        mover: changes.then(|| Mover::new(config.seed, n, !restarts)),
    };
    run.load(schedule, duration);
    let settled = run.settle_membership(duration);
    let quiet = settled + 4_000 * MS;
    let finals = run.quiesce_and_read(quiet);
    run.check(quiet, &finals);
    reached(&run.world, &mut run.report);
    if config.keep_history {
        run.report.history = Some(run.recorder.history());
    }
    run.report
}

/// The cluster of a `general` run (3 nodes in half the seeds, 5 in 40%, 7 in 10%), its
/// release timeout and network, booted and serving; and how long the load lasts.
fn draw_cluster(config: &KiteRunConfig, rng: &mut Rng, topology: &mut Rng) -> (KiteWorld, u64) {
    let n: u32 = match (rng.below(10) < 7, topology.below(21)) {
        (true, 0..=5) => 5,
        (true, _) => 3,
        (false, 0..=6) => 7,
        (false, _) => 5,
    };
    let timeout = match rng.below(4) {
        0 => Span(1_000),
        1 => Span::from_micros(500),
        2 => Span::from_millis(2),
        _ => Span::from_millis(20),
    };
    let net = NetConfig {
        delay_min: 50_000,
        delay_max: [300_000, 1_000_000, 3_000_000][rng.below(3) as usize],
        drop_ppm: [0, 1_000, 10_000, 50_000][rng.below(4) as usize],
        stall_ppm: if rng.below(3) == 0 { 2_000 } else { 0 },
        stall_max: 300 * MS,
        dup_ppm: [0, 2_000, 20_000][rng.below(3) as usize],
        link_bulk_bytes_max: link_bulk_bytes_max(config.seed),
        unsafe_unbounded_links: config.unbounded_links,
        reads_off_loop_ppm: 250_000,
    };
    let duration = (800 + rng.below(1_200)) * MS;
    let mut world = KiteWorld::new(n, &template(config, timeout), rng.next_u64(), net, true);
    // Faults start once the cluster serves: every node boots rejoining, as in a server,
    // and a node cut off through the whole boot while another is gone for good has no
    // majority to read (docs/kite.md, Restarts).
    world.settle_boot();
    (world, duration)
}

/// Each link's allowance for client values in flight: in a third of the seeds 1 to 11
/// bytes, so that a node sheds what it sends while an earlier value is on the way (a
/// value alone always goes); the server's default otherwise. Drawn from a generator of
/// its own, so that the rest of a seed's run is drawn as before it existed.
fn link_bulk_bytes_max(seed: u64) -> usize {
    let mut rng = Rng::new(seed ^ 0x6b69_7465_5f62_756c);
    if rng.chance(333_333) {
        rng.range(1, 12) as usize
    } else {
        keel_exec::LINK_BULK_BYTES_MAX
    }
}

/// The fault schedule, in time order: 2 to 6 faults, with crashes and restarts of at
/// most a minority in all (so a majority never loses its memory at once), each node at
/// most once; connection cuts; in half the seeds a slow node whose clients move; in 60%
/// a late acknowledgement, when a node may still crash.
fn draw_schedule(
    seed: u64,
    members: &[NodeId],
    duration: u64,
    rng: &mut Rng,
    topology: &mut Rng,
    clients: &mut Rng,
) -> Vec<(u64, Fault)> {
    let n = members.len() as u32;
    let mut schedule: Vec<(u64, Fault)> = Vec::new();
    let mut crashed: Vec<NodeId> = Vec::new();
    let minority = (n as usize - 1) / 2;
    for _ in 0..rng.range(2, 7) {
        let at = rng.below(duration * 3 / 4);
        let node = members[rng.below(members.len() as u64) as usize];
        let may_crash = crashed.len() < minority && !crashed.contains(&node);
        let fault = match rng.below(12) {
            9 | 10 if may_crash => Fault::Restart { node, ms: rng.range(1, 300) },
            0..=3 => Fault::Pause { node, ms: rng.range(20, 600) },
            4..=6 => Fault::Isolate { node, ms: rng.range(50, 800) },
            7 | 8 => {
                let to = members[rng.below(members.len() as u64) as usize];
                if to == node {
                    continue;
                }
                Fault::OneWay { from: node, to, ms: rng.range(50, 800) }
            }
            11 if may_crash => Fault::Crash { node },
            _ => continue,
        };
        if matches!(fault, Fault::Restart { .. } | Fault::Crash { .. }) {
            crashed.push(node);
        }
        schedule.push((at, fault));
    }
    for _ in 0..clients.below(4) {
        let at = clients.below(duration * 3 / 4);
        let node = members[clients.below(members.len() as u64) as usize];
        schedule.push((at, Fault::ClientCut { node }));
    }
    // A slow node whose clients move: what it sends is held back for a while, and its
    // clients' connections break meanwhile. A client naming its requests sends its
    // unanswered read-modify-writes again at another node, which has not seen the slow
    // node's latest writes; the first attempts go on once the node's messages leave.
    let mut slow = Rng::new(seed ^ 0x6b69_7465_5f73_6c6f);
    if slow.below(2) == 0 {
        let node = members[slow.below(members.len() as u64) as usize];
        let at = slow.below(duration * 3 / 4);
        let cut = at + slow.range(2, 30) * MS;
        let release = cut + slow.range(2, 30) * MS;
        for &to in members.iter().filter(|&&m| m != node) {
            schedule.push((at, Fault::Hold { from: node, to }));
            schedule.push((release, Fault::Release { from: node, to }));
        }
        schedule.push((cut, Fault::ClientCut { node }));
    }
    if topology.below(10) < 6 && crashed.len() < minority {
        schedule.extend(late_ack(topology, members, &crashed, duration));
    }
    schedule.sort_by_key(|(at, _)| *at);
    schedule
}

/// The clients: `n` to `3n` sessions spread over the nodes, a third of them with three
/// requests in flight, half of them naming their requests.
fn draw_sessions(members: &[NodeId], rng: &mut Rng, clients: &mut Rng) -> Vec<SimSession> {
    let n = members.len() as u64;
    let count = rng.range(n, n * 3 + 1);
    let mut sessions: Vec<SimSession> = (0..count)
        .map(|i| SimSession {
            id: i + 1,
            hist: i + 1,
            node: members[(i % n) as usize],
            depth: if rng.below(3) == 0 { 3 } else { 1 },
            outstanding: 0,
            next_at: 0,
            seen: BTreeMap::new(),
            last_written: None,
            named: None,
            pending: Vec::new(),
        })
        .collect();
    for s in sessions.iter_mut() {
        s.named = (clients.below(2) == 0).then_some(1);
    }
    sessions
}

/// A `general` run under way: the world, its clients, and what the checks at the end
/// need.
struct GeneralRun {
    unnamed_retries: bool,
    world: KiteWorld,
    /// The run's main stream (operations and their pacing).
    rng: Rng,
    clients: Rng,
    bias: Rng,
    sessions: Vec<SimSession>,
    recorder: Recorder,
    report: KiteReport,
    /// When the cut links heal (all at once, at the last).
    heals: Vec<u64>,
    /// Requests whose connection broke: their replies are not listened to.
    abandoned: BTreeSet<RequestTag>,
    restarts: Vec<(u64, NodeId)>,
    /// Sessions of a node that crashed: their operations may be lost (a relaxed write
    /// completes before it leaves its node), so convergence does not count them.
    dead_sessions: Vec<u64>,
    next_session: u64,
    /// Named read-modify-writes answered as failed.
    failed_named: Vec<keel_core::kite::RmwId>,
    next_value: u64,
    /// The `membership` scenario's changes of the voters.
    mover: Option<Mover>,
}

/// The live nodes at the end, and the final reads: at which node, of which key, under
/// which tag.
struct Finals {
    live: Vec<NodeId>,
    reads: Vec<(NodeId, u64, RequestTag)>,
}

impl GeneralRun {
    /// Runs the load for `duration`, with the faults of `schedule` as they come due.
    fn load(&mut self, schedule: Vec<(u64, Fault)>, duration: u64) {
        let mut t = 0;
        let mut faults: std::collections::VecDeque<(u64, Fault)> = schedule.into();
        let mut late: Option<LateAck> = None;
        while t < duration {
            t += STEP_NS;
            if let Some(plan) = late.as_mut() {
                // The late acknowledgement's next steps, due now, ahead of the rest.
                for step in plan.next(&self.world, t, &mut self.report.reached).into_iter().rev() {
                    faults.push_front((t, step));
                }
            }
            while faults.front().is_some_and(|(at, _)| *at <= t) {
                let (_, fault) = faults.pop_front().expect("peeked");
                if let Some(plan) = self.inject(t, fault) {
                    late = Some(plan);
                }
            }
            self.restart_and_heal(t);
            self.world.run_until(t);
            self.take_replies();
            self.submit(t);
            self.move_membership(t, false);
        }
    }

    /// Injects `fault` at `t`; a late acknowledgement's plan is returned to be followed.
    fn inject(&mut self, t: u64, fault: Fault) -> Option<LateAck> {
        self.report.faults.push(format!("{:.1}ms {fault:?}", t as f64 / MS as f64));
        // The node's clients' connections break with it (or alone, in a cut).
        if let Fault::ClientCut { node } | Fault::Crash { node } | Fault::Restart { node, .. } =
            fault
        {
            self.reconnect_clients(node);
        }
        let world = &mut self.world;
        let mut count = |name: &str| *self.report.reached.entry(name.into()).or_default() += 1;
        match fault {
            Fault::Pause { node, ms } => {
                count("fault:pause");
                world.pause(node, t + ms * MS);
            }
            Fault::Isolate { node, ms } => {
                count("fault:isolate");
                world.isolate(node);
                self.heals.push(t + ms * MS);
            }
            Fault::OneWay { from, to, ms } => {
                count("fault:one-way");
                world.cut(from, to);
                self.heals.push(t + ms * MS);
            }
            Fault::ClientCut { .. } => count("fault:client-cut"),
            Fault::Partition { side } => {
                count("fault:partition");
                world.partition(&side);
            }
            Fault::LateAck(plan) => return Some(plan),
            Fault::Cut { from, to } => to.into_iter().for_each(|to| world.cut(from, to)),
            Fault::Uncut { from, to } => to.into_iter().for_each(|to| world.uncut(from, to)),
            Fault::Hold { from, to } => world.hold(from, to),
            Fault::Release { from, to } => world.release(from, to),
            Fault::Crash { node } => {
                count("fault:crash");
                world.crash(node);
                let gone = self.sessions.iter().filter(|s| s.node == node).map(|s| s.hist);
                self.dead_sessions.extend(gone);
            }
            Fault::Restart { node, ms } => {
                count("fault:restart");
                world.crash(node);
                self.restarts.push((t + ms * MS, node));
                // Its clients' connections broke: they come back as new sessions.
                for s in self.sessions.iter_mut().filter(|s| s.node == node) {
                    self.dead_sessions.push(s.hist);
                    self.next_session += 1;
                    s.id = self.next_session;
                    s.hist = self.next_session;
                    s.outstanding = 0;
                    s.seen.clear();
                    s.last_written = None;
                }
            }
        }
        None
    }

    /// Restarts the nodes whose time came; heals the network once every cut is due.
    fn restart_and_heal(&mut self, t: u64) {
        for &(_, node) in self.restarts.iter().filter(|(at, _)| *at <= t) {
            self.world.restart(node);
        }
        self.restarts.retain(|(at, _)| *at > t);
        if self.heals.iter().any(|&h| h <= t) {
            self.heals.retain(|&h| h > t);
            if self.heals.is_empty() {
                self.world.heal();
            }
        }
    }

    /// Records the replies that came, and what each session saw of its keys.
    fn take_replies(&mut self) {
        let mut refused_at: Vec<NodeId> = Vec::new();
        for (at, node, reply) in self.world.take_replies() {
            if self.abandoned.contains(&reply.tag) {
                continue;
            }
            if let Some(mover) = self.mover.as_mut().filter(|m| m.asked == Some(reply.tag)) {
                let known = self
                    .world
                    .live()
                    .into_iter()
                    .filter_map(|n| self.world.engine(n))
                    .filter(|e| !e.epoch_and_rejoining().1)
                    .map(|e| e.membership().clone())
                    .max_by_key(|m| m.epoch);
                mover.answered(at, &reply, known.as_ref(), &mut self.report.reached);
                continue;
            }
            let session = self.recorder.session_of(reply.tag);
            let k = self.recorder.key_of(reply.tag);
            if let Ok(KiteResult::Rmw { wrote: None, local: false, .. }) = &reply.result {
                let named =
                    self.world.watch().rmw_ids().get(&reply.tag).filter(|id| id.client_named());
                if let Some(id) = named {
                    self.failed_named.push(*id);
                }
            }
            let seen = self.recorder.complete(at, &reply);
            let Some(s) = self.sessions.iter_mut().find(|s| Some(s.hist) == session) else {
                continue;
            };
            if matches!(reply.result, Err(keel_types::KeelError::Unavailable(_)))
                && s.named.is_some()
            {
                // Refused by a node that stopped voting: the client reconnects to a voter
                // and sends its unanswered requests again there.
                refused_at.push(node);
            }
            s.outstanding -= 1;
            s.pending.retain(|&(t, _)| t != reply.tag);
            // Remember what the session saw of the key, for its next CAS.
            if let (Some(seen), Some(k)) = (seen, k) {
                s.seen.insert(k, seen.written.or(seen.read));
                if seen.written.is_some() && k < DATA_KEYS {
                    s.last_written = Some(k);
                }
            }
        }
        refused_at.sort_unstable();
        refused_at.dedup();
        for node in refused_at {
            *self.report.reached.entry("client-refused-not-voter".into()).or_default() += 1;
            self.reconnect_clients(node);
        }
    }

    /// The clients of `node` whose connection broke reconnect elsewhere
    /// ([`move_named_clients`]); the history sessions they leave behind are dead.
    fn reconnect_clients(&mut self, node: NodeId) {
        let moved = move_named_clients(
            &mut self.world,
            &mut self.recorder,
            &mut self.clients,
            &mut self.sessions,
            node,
            &mut self.next_session,
            &mut self.abandoned,
            self.unnamed_retries,
            &mut self.report.reached,
        );
        self.dead_sessions.extend(moved);
    }

    /// Sends the next request of every session with room for one, at `t`.
    fn submit(&mut self, t: u64) {
        for s in self.sessions.iter_mut() {
            if s.outstanding >= s.depth || s.next_at > t || self.world.engine(s.node).is_none() {
                continue;
            }
            // A client of a node that no longer votes waits until it does again (a
            // client told `UNAVAILABLE` reconnects; the `membership` scenario's own).
            let votes = self.world.engine(s.node).is_some_and(|e| e.membership().contains(s.node));
            if !votes {
                continue;
            }
            let op = random_op(&mut self.rng, &mut self.bias, s, &mut self.next_value);
            // Read-modify-writes are sent again (as keel-client does): a failure is
            // committed like a write, so a retry and its first attempt agree.
            let rmw = matches!(op, KiteOp::Faa { .. } | KiteOp::Cas { .. });
            let named = s.named;
            if let Some(n) = s.named.as_mut() {
                *n += 1;
            }
            let tag = self.recorder.submit_named(&mut self.world, s.node, s.id, op, named);
            if named.is_some() {
                s.pending.push((tag, rmw));
            }
            s.outstanding += 1;
            s.next_at = t + self.rng.below(2 * MS);
        }
    }

    /// Heals and quiesces until `quiet` (no new requests, the network reliable again);
    /// then every live node acquires and reads every key. Returns those reads.
    fn quiesce_and_read(&mut self, quiet: u64) -> Finals {
        let world = &mut self.world;
        world.heal();
        world.calm_network();
        world.run_until(quiet);
        for (at, _, reply) in world.take_replies() {
            if !self.abandoned.contains(&reply.tag) {
                self.recorder.complete(at, &reply);
            }
        }
        let (live, mut reads) = (world.live(), Vec::new());
        for (i, &node) in live.iter().enumerate() {
            let session = FINAL_SESSIONS + i as u64;
            let barrier = KiteOp::Acquire { key: key(DATA_KEYS + COUNTER_KEYS) };
            self.recorder.submit(world, node, session, barrier);
            for k in 0..DATA_KEYS + COUNTER_KEYS {
                let tag = self.recorder.submit(world, node, session, KiteOp::Read { key: key(k) });
                reads.push((node, k, tag));
            }
        }
        world.run_until(quiet + 2_000 * MS);
        Finals { live, reads }
    }

    /// The checks: convergence of the final reads, exactly-once of named requests, the
    /// codec and the gate, and the whole history against release consistency.
    fn check(&mut self, quiet: u64, finals: &Finals) {
        let mut final_reads: BTreeMap<RequestTag, Stamp> = BTreeMap::new();
        for (at, _, reply) in self.world.take_replies() {
            if self.abandoned.contains(&reply.tag) {
                continue;
            }
            if let Some(seen) = self.recorder.complete(at, &reply) {
                final_reads.insert(reply.tag, seen.read_stamp);
            }
        }
        self.report.virtual_ms = self.world.now() / MS;
        self.recorder.settle_rmws(self.world.watch().commits(), self.world.watch().rmw_ids());
        let history = self.recorder.history();
        self.check_convergence(&history, quiet, finals, &final_reads);
        self.check_exactly_once();
        let report = &mut self.report;
        let verdict = keel_check::rc::check(&history);
        report.ops = self.recorder.started();
        report.ok = self.recorder.completed();
        report.sync_ops = verdict.sync_ops;
        for v in verdict.violations.iter() {
            report.violations.push(format!("rc {}: {} (ops {:?})", v.rule, v.message, v.ops));
        }
        if verdict.violation_count > verdict.violations.len() {
            let more = verdict.violation_count - verdict.violations.len();
            report.violations.push(format!("rc: {more} more violations"));
        }
    }

    /// Convergence: a final read is at least every write a live node's session completed
    /// before the final reads began. (One still running then, such as read-modify-writes
    /// of several sessions of one node dueling on a key while a majority barely answers,
    /// may complete after them; such are counted.)
    fn check_convergence(
        &mut self,
        history: &[RcOp],
        quiet: u64,
        finals: &Finals,
        final_reads: &BTreeMap<RequestTag, Stamp>,
    ) {
        let (live, report) = (&finals.live, &mut self.report);
        let late = history
            .iter()
            .filter(|op| op.session < FINAL_SESSIONS && op.complete.is_some_and(|c| c > quiet))
            .count() as u64;
        if late > 0 {
            *report.reached.entry("done-after-quiesce".into()).or_default() += late;
        }
        let mut newest: BTreeMap<u64, keel_check::rc::Stamp> = BTreeMap::new();
        for op in history {
            if op.complete.is_none_or(|c| c > quiet)
                || !live.contains(&NodeId(op.machine))
                || self.dead_sessions.contains(&op.session)
            {
                continue;
            }
            if let Some((s, _)) = op.wrote {
                let e = newest.entry(op.key).or_default();
                *e = (*e).max(s);
            }
        }
        for (node, k, tag) in &finals.reads {
            let Some(got) = final_reads.get(tag) else {
                let node = node.0;
                report.violations.push(format!(
                    "convergence: final read of k{k} at node {node} never answered ({})",
                    self.world.engine(NodeId(node)).map_or("down".into(), |e| {
                        let st = e.status();
                        format!("rejoining {} {:?}", st.rejoining, st.membership)
                    })
                ));
                continue;
            };
            let got =
                keel_check::rc::Stamp { version: got.version, writer: got.writer, rmw: got.rmw };
            if let Some(want) = newest.get(k).filter(|want| got < **want) {
                report.violations.push(format!("convergence: node {} reads k{k} at {got:?} after an acquire, older than the completed write {want:?}", node.0));
            }
        }
    }

    /// A named request answered as failed is never committed as a swap (its first
    /// attempt, still running elsewhere, must find the failure), and no request commits
    /// twice; no message failed the codec or the gate.
    fn check_exactly_once(&mut self) {
        let (world, report) = (&self.world, &mut self.report);
        for id in &self.failed_named {
            if world.watch().commits().get(id).is_some_and(|o| o.wrote().is_some()) {
                report.violations.push(format!(
                    "exactly-once: request {id:?} answered failed, then committed a write"
                ));
            }
        }
        // The world's checks: the contract's, the codec's, the gate's, the links', and
        // the watch's (every request committed at one stamp).
        for violation in world.violations() {
            report.violations.push(violation.to_string());
        }
    }
}

/// A restart with a late acknowledgement, the fault the rejoin's fence is for
/// (`docs/kite.md`, Restarts), on a coordinator `C`, a node `R` that restarts, and `C`'s
/// side `X` (a quorum less two other nodes). Armed at a random time, it goes on by itself,
/// each stage when the world is ready for it:
/// 1. **cut**, once `C` has an FAA's proposal in flight (promises on their way): what `R`
///    sends `C` and what `C` sends `X` is held back, `C`'s and `R`'s other links are cut
///    one way, and `X`'s links to the rest but `R` both ways. The accept that follows the
///    promises reaches only `R`'s earlier incarnation, which can pass it on to nobody.
/// 2. **crash**: `R` crashes (`C`'s link to it cut, its own links restored) and restarts
///    after a moment; it rejoins from the others, `X` among them.
/// 3. **split**, once `R` rejoined: the holds end (`R`'s earlier incarnation's replies reach
///    `C`, and `X` answers `C`'s accept only now), and `C` and `X` are split from the rest
///    (a quorum, with the new `R`), which go on serving.
/// 4. **heal**.
///
/// Without the fence `C`'s accept is chosen on {`C`, `R`'s earlier incarnation, `X`},
/// and an FAA of the rest on the same counter never sees it: both write the same stamp.
#[derive(Clone, Debug)]
struct LateAck {
    c: NodeId,
    r: NodeId,
    /// `C`'s side in the split.
    xs: Vec<NodeId>,
    /// The others.
    others: Vec<NodeId>,
    crash_ms: u64,
    down_ms: u64,
    heal_ms: u64,
    stage: LateStage,
}

#[derive(Clone, Copy, Debug)]
enum LateStage {
    Armed { since: u64 },
    Cut { crash_at: u64 },
    Down { since: u64 },
    Split { heal_at: u64 },
    Done,
}

/// The longest a [`LateAck`] stage waits for the world: a proposal in flight at `C`, or
/// `R`'s rejoin.
const LATE_ACK_WAIT_NS: u64 = 300 * MS;

/// Draws a [`LateAck`], armed at a random time; `None` when no node may crash.
fn late_ack(
    rng: &mut Rng,
    members: &[NodeId],
    crashed: &[NodeId],
    duration: u64,
) -> Option<(u64, Fault)> {
    let n = members.len();
    let c = members[rng.below(n as u64) as usize];
    let candidates: Vec<NodeId> =
        members.iter().copied().filter(|m| *m != c && !crashed.contains(m)).collect();
    if candidates.is_empty() {
        return None;
    }
    let r = candidates[rng.below(candidates.len() as u64) as usize];
    let mut others: Vec<NodeId> = members.iter().copied().filter(|m| *m != c && *m != r).collect();
    let mut xs = Vec::new();
    for _ in 0..(n / 2 + 1).saturating_sub(2) {
        xs.push(others.remove(rng.below(others.len() as u64) as usize));
    }
    let armed = duration / 10 + rng.below(duration * 2 / 5);
    let (crash_ms, down_ms, heal_ms) = (rng.range(5, 40), rng.range(1, 40), rng.range(100, 500));
    let stage = LateStage::Armed { since: armed };
    let plan = LateAck { c, r, xs, others, crash_ms, down_ms, heal_ms, stage };
    Some((armed, Fault::LateAck(plan)))
}

impl LateAck {
    /// The faults of the stage that is due now, if one is.
    fn next(
        &mut self,
        world: &KiteWorld,
        now: u64,
        reached: &mut BTreeMap<String, u64>,
    ) -> Vec<Fault> {
        let (c, r) = (self.c, self.r);
        let mut count = |name: &str| *reached.entry(format!("late-ack:{name}")).or_default() += 1;
        match self.stage {
            LateStage::Armed { since } => {
                // An FAA's (on a counter key): the rest's FAAs on it meet it.
                let counters: Vec<_> = (DATA_KEYS..DATA_KEYS + COUNTER_KEYS).map(key).collect();
                let proposing = world.engine(c).is_some_and(|e| {
                    e.proposals_in_flight().into_iter().any(|k| counters.contains(k))
                });
                if !proposing && now < since + LATE_ACK_WAIT_NS {
                    return Vec::new();
                }
                count(if proposing { "cut-proposing" } else { "cut" });
                self.stage = LateStage::Cut { crash_at: now + self.crash_ms * MS };
                let r_out: Vec<NodeId> = self.xs.iter().chain(&self.others).copied().collect();
                let mut faults = vec![
                    Fault::Hold { from: r, to: c },
                    Fault::Cut { from: c, to: self.others.clone() },
                    Fault::Cut { from: r, to: r_out },
                ];
                for &x in &self.xs {
                    faults.push(Fault::Hold { from: c, to: x });
                    faults.push(Fault::Cut { from: x, to: self.others.clone() });
                    faults.extend(self.others.iter().map(|&o| Fault::Cut { from: o, to: vec![x] }));
                }
                faults
            }
            LateStage::Cut { crash_at } if now >= crash_at => {
                self.stage = LateStage::Down { since: now };
                let r_out: Vec<NodeId> = self.xs.iter().chain(&self.others).copied().collect();
                vec![
                    Fault::Restart { node: r, ms: self.down_ms },
                    Fault::Cut { from: c, to: vec![r] },
                    Fault::Uncut { from: r, to: r_out },
                ]
            }
            LateStage::Down { since } => {
                let rejoined = world.engine(r).is_some_and(|e| !e.epoch_and_rejoining().1)
                    && now > since + self.down_ms * MS;
                if !rejoined && now < since + LATE_ACK_WAIT_NS {
                    return Vec::new();
                }
                count(if rejoined { "split-rejoined" } else { "split" });
                self.stage = LateStage::Split { heal_at: now + self.heal_ms * MS };
                let mut faults = vec![Fault::Release { from: r, to: c }];
                faults.extend(self.xs.iter().map(|&x| Fault::Release { from: c, to: x }));
                let side = std::iter::once(c).chain(self.xs.iter().copied()).collect();
                faults.push(Fault::Partition { side });
                faults
            }
            LateStage::Split { heal_at } if now >= heal_at => {
                self.stage = LateStage::Done;
                let mut all = vec![c, r];
                all.extend(self.xs.iter().chain(&self.others));
                vec![Fault::Partition { side: all }]
            }
            _ => Vec::new(),
        }
    }
}

/// A random operation of session `s`; `bias` (a stream of its own, so that `rng` draws
/// as before it existed) sends half of its CASes to the key it wrote last.
fn random_op(rng: &mut Rng, bias: &mut Rng, s: &mut SimSession, next_value: &mut u64) -> KiteOp {
    let data = |rng: &mut Rng| rng.below(DATA_KEYS);
    let any = |rng: &mut Rng| rng.below(DATA_KEYS + COUNTER_KEYS);
    let mut fresh = || {
        *next_value += 1;
        value(*next_value)
    };
    match rng.below(100) {
        0..=34 => KiteOp::Read { key: key(any(rng)) },
        35..=54 => KiteOp::Write { key: key(data(rng)), value: fresh() },
        55..=64 => KiteOp::Acquire { key: key(any(rng)) },
        65..=74 => KiteOp::Release { key: key(data(rng)), value: fresh() },
        75..=86 => KiteOp::Faa {
            key: key(DATA_KEYS + rng.below(COUNTER_KEYS)),
            delta: rng.range(1, 4) as i64,
        },
        _ => {
            let drawn = data(rng);
            let k = match s.last_written {
                Some(k) if bias.below(2) == 0 => k,
                _ => drawn,
            };
            let expected = s.seen.get(&k).copied().flatten().map(value);
            KiteOp::Cas { key: key(k), expected, new: fresh(), strong: rng.below(2) == 0 }
        }
    }
}

/// Adds the engines' counters (summed over live nodes) and the network's to `reached`.
pub fn reached(world: &KiteWorld, report: &mut KiteReport) {
    let mut add = |name: &str, v: u64| {
        if v > 0 {
            *report.reached.entry(name.to_string()).or_default() += v;
        }
    };
    for node in world.live() {
        let c = world.engine(node).expect("live").status().counters;
        add("read-slow", c.reads_slow);
        add("write-slow", c.writes_slow);
        add("release-fast", c.releases_fast);
        add("release-slow", c.releases_slow);
        add("acquire-slow", c.acquires_slow);
        add("write-back", c.write_backs);
        add("rmw", c.rmws);
        add("rmw-retry", c.rmw_retries);
        add("rmw-helped", c.rmw_helped);
        add("rmw-finished-covered", c.rmws_finished_covered);
        add("rmw-found-done", c.rmws_found_done);
        add("rmw-queued", c.rmws_queued);
        add("rmw-superseded", c.rmws_superseded);
        add("failure-committed", c.failures_committed);
        add("outcomes-dropped", c.outcomes_dropped);
        add("cas-local-failure", c.cas_local_failures);
        add("self-delinquent", c.self_delinquent);
        add("reset-bit", c.resets);
        add("rejoin", c.rejoins);
        add("membership:sync-own-answered", c.own_sync_queries_answered);
        add("rejoin-unanswered", c.unanswered_rejoining);
        add("rejoin-round-in-flight", c.replies_fenced);
        add("reply-stale", c.replies_stale);
        add("incarnation-learned", c.incarnations_learned);
        add("retransmit", c.retransmits);
        add("write-hurried", c.writes_hurried);
        add("flush", c.flushes);
    }
    let (stats, net) = world.stats();
    add("net:dropped", net.dropped);
    add("net:stalled", net.stalled);
    add("net:duplicated", net.duplicated);
    add("net:cut", net.partitioned);
    add("net:held", stats.held_messages);
    add("exec:bulk-shed", stats.bulk_shed);
    add("exec:read-off-loop", stats.reads_off_loop);
    add("late-reply", stats.late_replies);
    add("exec:held-behind-hard-state", stats.held_behind_hard_state);
    add("exec:hard-state-saved", stats.hard_states_saved);
    add("exec:boot-from-disk", stats.boots_from_disk);
    add(&format!("nodes:{}", world.members().len()), 1);
}

/// The `membership` scenario's schedule: the general one with at most one restart (or
/// late acknowledgement, which restarts a node) and no node gone for good. The voters can
/// be as few as two, so a second restart, or a crash, could take a majority of them: what
/// only those held is lost, as in any in-memory store (`docs/kite.md`, Restarts), which
/// is not what this scenario checks.
fn one_restart(schedule: Vec<(u64, Fault)>) -> Vec<(u64, Fault)> {
    let mut restarts = 0;
    let mut kept = Vec::new();
    for (at, fault) in schedule {
        match fault {
            Fault::Crash { .. } => continue,
            Fault::Restart { .. } | Fault::LateAck(_) => {
                restarts += 1;
                if restarts > 1 {
                    continue;
                }
            }
            _ => {}
        }
        kept.push((at, fault));
    }
    kept
}

/// The session the mover's requests go in (no client's).
const MOVER_SESSION: u64 = 900_000_000;

/// Changes the voters of the `membership` scenario, one change at a time, as an operator
/// does: it asks a voter for the next step towards its target until a voter shows the
/// target settled, then waits and draws the next target (a random set of the nodes, a
/// majority of them or more, or all of them once the load is over).
///
/// The aimed change (a third of the changes): a minority of the nodes is cut off for a while,
/// so that what completes meanwhile is held by the others alone; once healed, the voters
/// move to the lagging nodes and at most one other, whose quorums need not hold a node
/// of the earlier majority. Only the sync, and quorums of both sides during the change,
/// keep what completed (`--unsynced-change`, `--new-quorum-only` fail without them).
/// The straddling change (another third, with five voters or more): [`Mover::straddle`].
struct Mover {
    rng: Rng,
    nodes: u32,
    target: Vec<NodeId>,
    asked: Option<RequestTag>,
    /// When the step asked is given up for lost (its node restarted) and asked again.
    asked_until: u64,
    /// A step was given up for lost (it may still be made, later).
    gave_up: bool,
    next_at: u64,
    /// An aimed change's lagging nodes, cut off until this time.
    lagging: Option<(u64, Vec<NodeId>)>,
    /// A straddling change's proposer and the one voter it still reaches, until the
    /// change settles ([`Mover::straddle`]).
    straddling: Option<(NodeId, NodeId)>,
    /// Whether an aimed change may leave a single voter (only in a run without a
    /// restart: a lone voter restarted loses what only it held, as any in-memory store).
    single: bool,
}

impl Mover {
    fn new(seed: u64, nodes: u32, single: bool) -> Mover {
        let mut mover = Mover {
            rng: Rng::new(seed ^ 0x6b69_7465_5f6d_656d),
            nodes,
            target: Vec::new(),
            asked: None,
            asked_until: 0,
            gave_up: false,
            next_at: 0,
            lagging: None,
            straddling: None,
            single,
        };
        mover.target = mover.draw();
        mover.next_at = mover.rng.range(10, 200) * MS;
        mover
    }

    /// A set of at least a majority of the nodes (at least two), sorted.
    fn draw(&mut self) -> Vec<NodeId> {
        let n = self.nodes as usize;
        let least = (n / 2 + 1).max(2).min(n);
        let size = self.rng.range(least as u64, n as u64 + 1) as usize;
        let mut all: Vec<NodeId> = (1..=self.nodes).map(NodeId).collect();
        while all.len() > size {
            let i = self.rng.below(all.len() as u64) as usize;
            all.remove(i);
        }
        all
    }

    /// An aimed change from `t`: the lagging nodes (a minority), cut off until the time
    /// returned; the target is them and one other node (or, of three nodes in a run
    /// without a restart, the lagging node alone).
    fn aim(&mut self, t: u64) -> (u64, Vec<NodeId>) {
        let n = self.nodes as usize;
        let mut lagging: Vec<NodeId> = (1..=self.nodes).map(NodeId).collect();
        while lagging.len() > n - (n / 2 + 1) {
            let i = self.rng.below(lagging.len() as u64) as usize;
            lagging.remove(i);
        }
        let mut target = lagging.clone();
        if target.len() > 1 || !self.single {
            let others: Vec<NodeId> =
                (1..=self.nodes).map(NodeId).filter(|m| !lagging.contains(m)).collect();
            target.push(others[self.rng.below(others.len() as u64) as usize]);
            target.sort_unstable();
        }
        self.target = target;
        let until = t + self.rng.range(50, 400) * MS;
        self.next_at = until + self.rng.range(0, 3) * MS;
        (until, lagging)
    }

    /// How a step towards `towards` is asked, from the newest membership's target
    /// `from`: as the list, or (half the time, where it is one) as the node an operator
    /// names (`KEEL.NODE ADD|REMOVE id`).
    fn wanted(&mut self, from: &[NodeId], towards: Vec<NodeId>) -> VotersWanted {
        let added: Vec<NodeId> = towards.iter().copied().filter(|v| !from.contains(v)).collect();
        let removed: Vec<NodeId> = from.iter().copied().filter(|v| !towards.contains(v)).collect();
        let by_node = match (&added[..], &removed[..]) {
            ([node], []) => Some(VotersWanted::With(*node)),
            ([], [node]) => Some(VotersWanted::Without(*node)),
            ([], []) => {
                Some(VotersWanted::With(towards[self.rng.below(towards.len() as u64) as usize]))
            }
            _ => None,
        };
        match by_node {
            Some(wanted) if self.rng.below(2) == 0 => wanted,
            _ => VotersWanted::Exactly(towards),
        }
    }

    /// A straddling change from the settled `voters` (at least five): node `p`'s
    /// acceptances reach one other voter `q` only, so that its read-modify-writes gather
    /// `q`'s acceptance and no quorum, while the others go on, choosing other values on
    /// the same keys with quorums that hold neither (`p` and `q` answer only each other's
    /// proposals meanwhile). The voters move to `p`,
    /// `q` and one other, of which `p` and `q` are a majority: `p` learns the new voters
    /// with its rounds open, and only asking every open round again keeps it from
    /// counting `q`'s acceptance of the old voters (`--mixed-epoch-rounds` fails without
    /// it). Returns `(p, q)`.
    fn straddle(&mut self, voters: &[NodeId]) -> Option<(NodeId, NodeId)> {
        if voters.len() < 5 {
            return None;
        }
        let mut pool = voters.to_vec();
        let mut pick = |rng: &mut Rng| pool.remove(rng.below(pool.len() as u64) as usize);
        let (p, q, r) = (pick(&mut self.rng), pick(&mut self.rng), pick(&mut self.rng));
        let mut target = vec![p, q, r];
        target.sort_unstable();
        self.target = target;
        Some((p, q))
    }

    /// The answer to the last step asked, judged as the front door shows it (done, or
    /// `BUSY`: ask again). Done means the membership in force is settled on what was
    /// wanted: the newest any node knows (`known`), since only the mover changes it.
    fn answered(
        &mut self,
        at: u64,
        reply: &keel_core::kite::KiteReply,
        known: Option<&keel_core::kite::Membership>,
        reached: &mut BTreeMap<String, u64>,
    ) {
        self.asked = None;
        self.next_at = at + self.rng.range(1, 5) * MS;
        let name = match &reply.result {
            Ok(KiteResult::Rmw { wrote: Some(_), .. }) => "membership:step",
            Ok(_) => "membership:step-answered",
            Err(_) => "membership:step-refused",
        };
        *reached.entry(name.into()).or_default() += 1;
        let ReplyForm::Membership(wanted) = &reply.form else {
            panic!("the mover's step answered in another form: {reply:?}")
        };
        let shown = keel_core::engine::ClientReply::from(reply.clone());
        match (&shown.result, &reply.result) {
            (Ok(_), _) => {
                *reached.entry("membership:step-done".into()).or_default() += 1;
                // Unless a step given up for lost may have moved it on since, or the
                // node restarted meanwhile.
                if let Some(known) = known.filter(|_| !self.gave_up) {
                    assert!(
                        wanted.met_by(known),
                        "a step shown done ({wanted:?}) by node {} while the newest membership is {known:?}",
                        reply.served_by.0
                    );
                }
            }
            (Err(keel_types::KeelError::Busy(_)), Ok(_)) => {
                *reached.entry("membership:step-busy".into()).or_default() += 1;
            }
            (Err(_), _) => {}
        }
    }
}

impl GeneralRun {
    /// The mover's next move at `t` (towards every node when `last`).
    fn move_membership(&mut self, t: u64, last: bool) -> bool {
        let Some(mover) = self.mover.as_mut() else { return true };
        if last {
            mover.target = self.world.members();
        }
        if mover.lagging.as_ref().is_some_and(|(until, _)| *until <= t || last) {
            mover.lagging = None;
            self.world.heal();
        }
        if last && mover.straddling.take().is_some() {
            self.world.set_drop_rule(None);
        }
        if mover.asked.is_some() && mover.asked_until <= t {
            // Lost with its node's restart: an operator asks again.
            mover.asked = None;
            mover.gave_up = true;
        }
        if mover.asked.is_some() || mover.next_at > t {
            return false;
        }
        let voters: Vec<(NodeId, keel_core::kite::Membership)> = self
            .world
            .live()
            .into_iter()
            .filter_map(|n| self.world.engine(n).map(|e| (n, e.membership().clone())))
            .filter(|(n, m)| m.contains(*n))
            .collect();
        if voters.is_empty() {
            return false;
        }
        let newest = voters.iter().map(|(_, m)| m).max_by_key(|m| m.epoch).expect("a voter");
        if newest.next.is_none() && newest.voters == mover.target {
            if last {
                let all_know = voters.iter().all(|(_, m)| m == newest);
                return all_know;
            }
            *self.report.reached.entry("membership:changed".into()).or_default() +=
                u64::from(newest.epoch > 0);
            if mover.straddling.take().is_some() {
                self.world.set_drop_rule(None);
            }
            let draw = mover.rng.below(3);
            let straddle = (draw == 1).then(|| mover.straddle(&newest.voters)).flatten();
            if let Some((p, q)) = straddle {
                // `p`'s acceptances go to `q` alone (retransmissions too), and the other
                // proposers' quorums hold neither: `p` and `q` answer only each other.
                self.world.set_drop_rule(Some(Box::new(move |from, to, m| {
                    let reply = matches!(m, Message::Promise { .. } | Message::Accepted { .. });
                    let accept = matches!(m, Message::Accept { .. });
                    let pair = (from == p || from == q) && to != p && to != q;
                    match pair && (reply || (from == p && accept)) {
                        true => Fate::Drop,
                        false => Fate::Pass,
                    }
                })));
                mover.straddling = Some((p, q));
                // Time for `p` to open rounds that gather `q`'s replies alone.
                mover.next_at = t + mover.rng.range(5, 60) * MS;
                *self.report.reached.entry("membership:straddle".into()).or_default() += 1;
            } else if draw == 0 {
                let (until, lagging) = mover.aim(t);
                for &node in &lagging {
                    self.world.isolate(node);
                }
                mover.lagging = Some((until, lagging));
                *self.report.reached.entry("membership:aimed".into()).or_default() += 1;
            } else {
                mover.target = mover.draw();
                mover.next_at = t + mover.rng.range(20, 300) * MS;
            }
            return false;
        }
        // A change under way towards another set is finished first, as an operator does.
        let towards = newest.next.clone().unwrap_or_else(|| mover.target.clone());
        // During a straddle, `q`: only its proposals gather both its and `p`'s replies.
        let askable: Vec<NodeId> = match mover.straddling {
            Some((_, q)) => vec![q],
            None => voters.iter().map(|(n, _)| *n).collect(),
        };
        let Some(&node) = askable.get(mover.rng.below(askable.len().max(1) as u64) as usize) else {
            return false;
        };
        let wanted = mover.wanted(newest.target(), towards);
        let op = KiteOp::reconfigure_to(wanted.clone());
        let form = ReplyForm::Membership(wanted);
        mover.asked = Some(self.world.submit_form(node, MOVER_SESSION, op, None, form));
        mover.asked_until = t + 3_000 * MS;
        false
    }

    /// After the load: the voters changed back to every node, and every node knowing it.
    /// Returns the time reached.
    fn settle_membership(&mut self, from: u64) -> u64 {
        if self.mover.is_none() {
            return from;
        }
        self.world.heal();
        self.world.calm_network();
        let mut t = from;
        let deadline = from + 60_000 * MS;
        while t < deadline {
            t += STEP_NS;
            self.restart_and_heal(t);
            self.world.run_until(t);
            self.take_replies();
            if self.move_membership(t, true) && self.restarts.is_empty() {
                return t;
            }
        }
        let seen: Vec<String> = self
            .world
            .live()
            .into_iter()
            .filter_map(|n| {
                let e = self.world.engine(n)?;
                Some(format!("{}: {:?} synced {}", n.0, e.membership(), e.status().synced))
            })
            .collect();
        self.report.violations.push(format!(
            "the membership did not settle on every node in 60 s: {}",
            seen.join("; ")
        ));
        t
    }
}
