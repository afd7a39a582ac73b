//! The geo scenarios: `general` (random sessions at every data center, migrating with a
//! barrier and an attach, under wide-area delays, loss, duplication, skewed clocks, data
//! centers cut off and failing), and the scripted ones of `script.rs`. Every run's
//! history goes through the causal checker (`keel_check::causal`).

use super::back::Return;
use super::removal::{Pair, Removal};
use super::world::{GeoShape, GeoWorld, OpenTx};
use crate::rng::Rng;
use keel_check::causal::history::{CausalHistory, ClientTx, Outcome, TxOp};
use keel_core::engine::RequestTag;
use keel_core::geo::{GeoOp, GeoResult, Kind, Object, Update, Vector};
use keel_types::{Key, NodeId};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// One run's settings.
#[derive(Clone, Debug)]
pub struct GeoRunConfig {
    /// The seed.
    pub seed: u64,
    /// The scenario.
    pub scenario: String,
    /// Negative control: remote transactions visible before they are uniform.
    pub expose_non_uniform: bool,
    /// Negative control: a restarted replica serves again, empty.
    pub rejoin_empty: bool,
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
    /// Every run strong, certified centrally (REDBLUE's baseline); otherwise a quarter of
    /// the strong runs are.
    pub central_certifier: bool,
    /// Keep the history in the report.
    pub keep_history: bool,
}

/// One run's outcome.
#[derive(Clone, Debug, Default, Serialize)]
pub struct GeoReport {
    /// The seed.
    pub seed: u64,
    /// The scenario.
    pub scenario: String,
    /// Data centers.
    pub dcs: u32,
    /// Partitions per data center.
    pub partitions: u32,
    /// Client transactions.
    pub txs: usize,
    /// Update transactions that committed: those their clients saw commit, and those
    /// only the cluster's record shows committed (an outcome unknown to the client).
    pub updates: usize,
    /// Barriers and attaches returned.
    pub syncs: usize,
    /// Data centers failed.
    pub failed: Vec<u32>,
    /// Virtual time, ms.
    pub virtual_ms: u64,
    /// The faults injected, in order.
    pub faults: Vec<String>,
    /// What the checks found.
    pub violations: Vec<String>,
    /// The causal checker's violations by kind (all of them, not only those listed).
    pub counts: BTreeMap<String, usize>,
    /// A panic, if the run panicked (an engine's invariant, say).
    pub panic: Option<String>,
    /// The rare paths the run took (coverage).
    pub reached: BTreeMap<String, u64>,
    /// How to run it again.
    pub replay: String,
    /// The history, when kept.
    #[serde(skip)]
    pub history: Option<CausalHistory>,
}

impl GeoReport {
    /// Whether nothing was violated.
    pub fn passed(&self) -> bool {
        self.violations.is_empty() && self.panic.is_none()
    }
}

/// Keys the workload touches: few, so that transactions meet.
const KEYS: [&str; 6] = ["k0", "k1", "k2", "k3", "k4", "k5"];
/// Elements of the sets.
const ELEMS: [&str; 4] = ["a", "b", "c", "d"];

/// An operation a session plans.
#[derive(Clone, Debug)]
enum Planned {
    Read(Key, Kind),
    Update(Key, Update),
    /// A remove from an add-wins set: a read of the set first, then the remove of the
    /// adds it showed.
    Remove(Key, Key),
}

/// What a session waits for.
#[derive(Clone, Debug)]
enum Waiting {
    Nothing,
    Begin(NodeId),
    Op(Planned, bool),
    Commit,
    Barrier(Option<u32>),
    Attach(u32),
}

/// One client session.
struct Session {
    id: u64,
    dc: u32,
    past: Vector,
    rng: Rng,
    waiting: Waiting,
    open: Option<OpenTx>,
    plan: VecDeque<Planned>,
    next_value: u64,
    done: bool,
    /// The label of the strong transaction being begun (`Some(None)`: unlabelled).
    strong: Option<Option<String>>,
    /// When its last causal update transaction committed.
    last_update_at: Option<u64>,
    /// After a refusal, it sends nothing before this (a client backs off).
    not_before: u64,
}

/// A session that starts over takes its id plus this (ids below it are the first ones).
const SESSION_IDS: u64 = 1_000;

/// How long a session backs off after a refusal, ns.
const BACKOFF_NS: u64 = 10_000_000;

fn key(s: &str) -> Key {
    Key::copy_from_slice(s.as_bytes())
}

impl Session {
    fn plan_tx(&mut self) -> VecDeque<Planned> {
        let n = 1 + self.rng.below(4);
        (0..n)
            .map(|_| {
                let k = key(KEYS[self.rng.below(KEYS.len() as u64) as usize]);
                let elem = key(ELEMS[self.rng.below(ELEMS.len() as u64) as usize]);
                self.next_value += 1;
                let value = key(&format!("s{}-{}", self.id, self.next_value));
                match self.rng.below(12) {
                    0..=3 => Planned::Read(k, Kind::ALL[self.rng.below(5) as usize]),
                    4 => Planned::Update(k, Update::Set(value)),
                    5 | 6 => Planned::Update(k, Update::Add(self.rng.range(1, 200) as i64 - 50)),
                    7 => Planned::Update(k, Update::Max(self.rng.below(1_000) as i64)),
                    8 => Planned::Update(k, Update::GAdd(elem)),
                    9 | 10 => Planned::Update(k, Update::SAdd(elem)),
                    _ => Planned::Remove(k, elem),
                }
            })
            .collect()
    }
}

/// The run's fault plan and the session it aims at.
struct Faults {
    /// Data centers still to fail, each at its time.
    fails: Vec<(u64, u32)>,
    /// Cut-offs and their ends, in time order: `Some(dc)` cuts `dc` off, `None`
    /// restores every link.
    isolations: Vec<(u64, Option<u32>)>,
    /// Whether the next barrier of a session whose past holds another data center's
    /// transactions fails the barrier's data center and that one at once (the aimed
    /// fault that reaches scenario 8).
    barrier_then_fail: bool,
    /// A replica to crash and restart: when it crashes, when it restarts, its data center
    /// and partition.
    restart: Option<(u64, u64, u32, u32)>,
    /// The replica crashed and waiting to restart, with the time.
    down: Option<(u64, NodeId)>,
    /// Whether the next strong commit outside the leaders' data center that follows
    /// its session's causal update closely fails its data center a millisecond after it
    /// is sent (the aimed fault of scenario 7: without the commit's barrier, the strong
    /// transaction is certified while the causal one it depends on is lost).
    strong_then_fail: bool,
    /// A data center to fail at a time (the strong aimed fault, once armed).
    fail_at: Option<(u64, u32)>,
    /// Whether the next strong commit fails the leaders' first data center (0) a few
    /// milliseconds after it is sent (the aimed fault of scenario 20: certification in
    /// flight when its leaders fail, then carried on by the new leaders).
    leaders_then_fail: bool,
    /// Whether, with the leaders spread, the leaders' fault first stalls the links into
    /// data center 0's leaders from the others until it fails: its partitions vote but
    /// stay undecided while the others decide, so their new leaders ask about decisions
    /// the others may have forgotten.
    stall_leaders: bool,
    /// The stalled leaders' fault, armed: until when the links stay stalled, how long
    /// after data center 0's first vote out it fails, and the votes sent before it was
    /// armed.
    vote_watch: Option<(u64, u64, usize)>,
    /// Whether the run cuts a data center off, then fails another ([`cut_then_fail`]).
    cut_then_fail: bool,
}

/// The aimed fault that reaches collection while a data center is cut off (drawn in a
/// fifth of the runs with no other aimed fault, every such run of its control): data
/// center `i` is cut off; once the others suspect it, another one, `j`, fails; `i` comes
/// back later. What `i` lacks of `j`'s transactions it can get only from the third
/// data center, which must have kept them for it.
fn cut_then_fail(rng: &mut Rng, shape: &GeoShape, faults: &mut Faults, control: bool) {
    let aimed = faults.barrier_then_fail || faults.strong_then_fail || faults.leaders_then_fail;
    if aimed || !(control || rng.chance(200_000)) {
        return;
    }
    let dcs = u64::from(shape.dcs());
    let i = rng.below(dcs) as u32;
    let j = (i + 1 + rng.below(dcs - 1) as u32) % shape.dcs();
    let cut = rng.range(1_000_000_000, RUN_NS - 4_000_000_000);
    let fail = cut + rng.range(1_300_000_000, 2_500_000_000);
    faults.fails = vec![(fail, j)];
    let heal = fail + rng.range(500_000_000, 3_000_000_000);
    faults.isolations = vec![(cut, Some(i)), (heal, None)];
    faults.cut_then_fail = true;
}

/// Draws the cluster of a `general` run.
fn draw_shape(rng: &mut Rng, config: &GeoRunConfig) -> GeoShape {
    let (expose, rejoin_empty) = (config.expose_non_uniform, config.rejoin_empty);
    let controls_strong = config.certify_all
        || config.skip_strong_barrier
        || config.deliver_early
        || config.skip_recovery
        || config.forget_unsettled
        || config.central_certifier;
    // The control of forgetting runs on partitions whose leaders are spread (`f` = 1
    // and two partitions at least: its fault needs a transaction of two partitions).
    let aimed_forget = config.forget_unsettled;
    let f = if (rng.chance(400_000) || expose) && !aimed_forget { 2 } else { 1 };
    let partitions = if f == 2 { 1 } else { 1 + rng.below(3) as u32 };
    let partitions = if aimed_forget { partitions.max(2) } else { partitions };
    let dcs = 2 * f + 1;
    let mut wan_ns = BTreeMap::new();
    for a in 0..dcs {
        for b in a + 1..dcs {
            wan_ns.insert((a, b), rng.range(2_000_000, 100_000_000));
        }
    }
    let mut shape = GeoShape {
        f,
        partitions,
        wan_ns,
        loss_ppm: if rng.chance(500_000) { rng.below(30_000) as u32 } else { 0 },
        duplicate_ppm: if rng.chance(300_000) { rng.below(20_000) as u32 } else { 0 },
        jitter_ns: rng.range(1, 5_000_000),
        skew_ms: if rng.chance(500_000) { rng.below(3_000) } else { 0 },
        expose_non_uniform: expose,
        rejoin_empty,
        strong: controls_strong || rng.chance(600_000),
        central_certifier: false,
        certify_all: config.certify_all,
        skip_strong_barrier: config.skip_strong_barrier,
        deliver_early: config.deliver_early,
        skip_recovery: config.skip_recovery,
        forget_unsettled: config.forget_unsettled,
        collect_suspected: config.collect_suspected,
        remove_beyond_f: config.remove_beyond_f,
        unagreed_removal: config.unagreed_removal,
        notice_at_rest: config.notice_at_rest,
        removed_silent: config.removed_silent,
        promises_held: config.promises_held,
        abort_committed: config.abort_committed,
        cut_quorum: config.cut_quorum,
        no_freeze: config.no_freeze,
        no_cut: config.no_cut,
        no_life: config.no_life,
        no_earlier_cuts: config.no_earlier_cuts,
        no_hold: config.no_hold,
        // Replication batched over 5 ms (the default), 20 ms or 50 ms.
        propagate_ms: [5, 5, 5, 20, 50][rng.below(5) as usize],
        tx_timeout_ms: 0,
        spread_leaders: false,
    };
    // A quarter of the strong runs certify centrally (REDBLUE's baseline), drawn apart so
    // that a seed's other draws do not depend on it.
    let mut apart = Rng::new(config.seed ^ 0x6365_6e74_7261_6c00);
    shape.central_certifier = config.central_certifier || (shape.strong && apart.chance(250_000));
    // Half the runs time transactions out (and expire strong candidates) within 1.5 or 3
    // seconds, not 10, so that decided strong transactions are forgotten while others
    // are still in flight, and expiry passes during elections.
    shape.tx_timeout_ms = [0, 2_000, 1_000, 500][apart.below(4) as usize];
    if config.forget_unsettled {
        // The control's runs expire transactions before a new leader can ask.
        shape.tx_timeout_ms = shape.tx_timeout_ms.clamp(500, 1_000);
    }
    // Half the strong runs spread the partitions' leaders over the data centers, so that
    // a data center's failure (the leaders' fault fails data center 0) moves some
    // partitions' leaders while the others decide.
    shape.spread_leaders =
        shape.strong && shape.partitions > 1 && (config.forget_unsettled || apart.chance(500_000));
    shape
}

/// How long the stalled leaders' fault stalls the links into data center 0's leaders
/// at most (it fails data center 0 sooner, once one of them sent a vote out), ns.
const STALL_LEADERS_NS: u64 = 1_500_000_000;

/// Iterations of the session loop at one virtual instant, at most.
const SPINS_MAX: u64 = 1_000_000;

/// How long sessions run, ns.
const RUN_NS: u64 = 8_000_000_000;
/// How long sessions run at most, when a return is under way or just back, ns.
const RUN_NS_MAX: u64 = 16_000_000_000;
/// How long sessions have to finish their open transactions after `RUN_NS`, ns.
const DRAIN_NS: u64 = 3_000_000_000;
/// The quiet end's length, ns.
const QUIET_NS: u64 = 8_000_000_000;
/// How much longer the quiet end runs, at most, while a committed strong transaction is
/// not yet delivered everywhere (its leader's clock ran ahead of the others'), ns.
const STRONG_WAIT_NS: u64 = 30_000_000_000;

/// Runs one seed of `general`.
pub fn run_general(config: &GeoRunConfig) -> GeoReport {
    let mut rng = Rng::new(config.seed);
    let shape = draw_shape(&mut rng, config);
    let mut world = GeoWorld::new(shape, rng.next_u64());
    if world.shape.central_certifier {
        world.reach("central-certifier");
    }
    let dcs = world.shape.dcs();
    let mut faults = draw_faults(&mut rng, &world.shape, config.expose_non_uniform);
    // Drawn apart, so that a seed's other draws do not depend on them.
    let mut apart = Rng::new(config.seed ^ 0x7265_6d6f_7661_6c00);
    cut_then_fail(&mut apart, &world.shape, &mut faults, config.collect_suspected);
    let (mut removal, mut pair, mut back) = draw_changes(config.seed, &mut apart, &mut world);
    let mut log = Vec::new();
    let mut sessions: Vec<Session> = (0..2 + rng.below(5))
        .map(|i| Session {
            id: i + 1,
            dc: rng.below(u64::from(dcs)) as u32,
            past: Vector::zero(dcs as usize),
            rng: rng.fork(),
            waiting: Waiting::Nothing,
            open: None,
            plan: VecDeque::new(),
            next_value: 0,
            done: false,
            strong: None,
            last_update_at: None,
            not_before: 0,
        })
        .collect();
    let mut by_tag: BTreeMap<RequestTag, usize> = BTreeMap::new();
    // Sessions start work until RUN_NS (longer while a return is under way or just
    // back, to RUN_NS_MAX), then finish what they have open (a few seconds at most: a
    // commit never waits for another data center).
    let mut spins = (0, 0u64);
    let mut work_until = RUN_NS;
    while world.now() < work_until + DRAIN_NS {
        let now = world.now();
        // Requests answered at once (clients sit next to their replicas) must not be
        // sent again at once for ever: that is a replica refusing a session for good.
        spins = if spins.0 == now { (now, spins.1 + 1) } else { (now, 0) };
        assert!(
            spins.1 < SPINS_MAX,
            "sessions spin at {now} ns: a replica answers their requests at once, refusing, for ever"
        );
        inject(&mut world, &mut faults, &mut log, now);
        if let Some(back) = &mut back {
            back.tend_back(&mut world, &mut log);
        }
        if let Some(removal) = &mut removal {
            removal.drive(&mut world, &mut log, now);
            if let Some(back) = &mut back {
                back.tend(&mut world, &mut log, removal.target());
            }
            if let (Some(back), Some((dc, at))) = (&mut back, removal.made()) {
                back.drive(&mut world, &mut log, dc, at);
            }
        }
        if let Some(pair) = &mut pair {
            pair.drive(&mut world, &mut log, now);
        }
        if let Some(back) = back.as_ref().filter(|_| now < work_until) {
            work_until = back.work_until(work_until, now, RUN_NS_MAX);
        }
        for (i, session) in sessions.iter_mut().enumerate() {
            if now < work_until || session.open.is_some() {
                drive(&mut world, session, i, &mut by_tag, &mut faults);
            }
        }
        if !world.step_until(now + 1_000_000) {
            continue;
        }
        let replies: Vec<RequestTag> =
            world.replies.keys().filter(|t| by_tag.contains_key(t)).copied().collect();
        for tag in replies {
            let i = by_tag.remove(&tag).expect("listed");
            let (_, reply) = world.replies.remove(&tag).expect("listed");
            if let Some(next) =
                answered(&mut world, &mut sessions[i], reply.result, &mut faults, &mut log)
            {
                by_tag.insert(next, i);
            }
        }
    }
    for s in &mut sessions {
        abandon(&mut world, s);
    }
    if let Some(removal) = &mut removal {
        finish_changes(&mut world, removal, &mut back, &mut log);
    }
    world.quiesce(QUIET_NS);
    if world.await_strong_delivery(STRONG_WAIT_NS) {
        world.reach("quiet-extended");
    }
    let mut report = finish(world, config, log);
    report.violations.extend(removal.map(|r| r.violations).unwrap_or_default());
    report.violations.extend(pair.map(|p| p.violations).unwrap_or_default());
    report.violations.extend(back.map(|b| b.violations).unwrap_or_default());
    report
}

/// The operator's changes a run makes, each from a stream of its own: a removal (in half
/// the runs), two at once (in a third of the runs with no removal), and taking the
/// removed data center back (in half the runs with a removal), with the late survivor's
/// fault planned in half of those (`late.rs`): the removal is then of a live data center
/// early in the run, and no data center fails until the fault is over (the return needs
/// the acceptors of the three others).
fn draw_changes(
    seed: u64,
    apart: &mut Rng,
    world: &mut GeoWorld,
) -> (Option<Removal>, Option<Pair>, Option<Return>) {
    let mistakes = Rng::new(seed ^ 0x6d69_7374_616b_6500);
    let mut removal = Removal::draw(apart.fork(), mistakes, RUN_NS);
    let pair_rng = Rng::new(seed ^ 0x7061_6972_0000_0000);
    let pair = if removal.is_none() { Pair::draw(pair_rng, RUN_NS) } else { None };
    let return_rng = Rng::new(seed ^ 0x7265_7475_726e_0000);
    let split_rng = Rng::new(seed ^ 0x7370_6c69_7400_0000);
    let back = removal.as_ref().and_then(|_| Return::draw(return_rng, split_rng));
    if let (Some(removal), Some(back)) = (&mut removal, &back) {
        if back.plans_late(world) {
            world.failures_held = true;
            let mut early = Rng::new(seed ^ 0x6c61_7465_0000_0000);
            removal.live_at(early.range(1_000_000_000, 2_500_000_000));
        }
    }
    (removal, pair, back)
}

/// A removal not yet made goes on at the start of the quiet end (it was refused while a
/// data center was cut off, say), and so does taking it back once it is made.
fn finish_changes(
    world: &mut GeoWorld,
    removal: &mut Removal,
    back: &mut Option<Return>,
    log: &mut Vec<String>,
) {
    world.heal();
    let until = world.now() + QUIET_NS;
    let busy = |removal: &Removal, back: &Option<Return>, world: &GeoWorld| {
        !removal.finished(world)
            || removal.made().is_some() && back.as_ref().is_some_and(|b| !b.finished(world))
            || back.as_ref().is_some_and(|b| b.holding() || b.under_way())
    };
    while busy(removal, back, world) && world.now() < until {
        let now = world.now();
        if let Some(back) = back.as_mut() {
            back.tend_back(world, log);
        }
        removal.drive(world, log, now);
        if let Some(back) = back.as_mut() {
            back.tend(world, log, removal.target());
        }
        if let (Some(back), Some((dc, at))) = (back.as_mut(), removal.made()) {
            back.drive(world, log, dc, at);
        }
        let next = world.now() + 100_000_000;
        world.run_until(next);
    }
}

fn draw_faults(rng: &mut Rng, shape: &GeoShape, expose: bool) -> Faults {
    let dcs = shape.dcs();
    let mut fails = Vec::new();
    let strong_then_fail = shape.skip_strong_barrier || (shape.strong && rng.chance(300_000));
    let leaders_then_fail = !strong_then_fail
        && shape.strong
        && (shape.skip_recovery || shape.forget_unsettled || rng.chance(400_000));
    let aimed = expose || (!strong_then_fail && !leaders_then_fail && rng.chance(300_000));
    let may_fail = |_: u32| true;
    if !aimed && !strong_then_fail && !leaders_then_fail {
        for _ in 0..rng.below(u64::from(shape.f) + 1) {
            let dc = rng.below(u64::from(dcs)) as u32;
            if may_fail(dc) && !fails.iter().any(|&(_, d)| d == dc) {
                fails.push((rng.range(1_000_000_000, RUN_NS), dc));
            }
        }
    }
    let mut isolations = Vec::new();
    for _ in 0..rng.below(3) {
        let start = rng.range(500_000_000, RUN_NS);
        isolations.push((start, Some(rng.below(u64::from(dcs)) as u32)));
        isolations.push((start + rng.range(300_000_000, 4_000_000_000), None));
    }
    isolations.sort_by_key(|(at, _)| *at);
    // A replica restarts in half the runs (every run of the control): it crashes, comes
    // back a little later, and (unless the control) stays failed.
    let restart = (shape.rejoin_empty || (!aimed && !strong_then_fail && rng.chance(500_000)))
        .then(|| {
            let at = rng.range(1_000_000_000, RUN_NS - 2_000_000_000);
            let back = at + rng.range(100_000_000, 2_000_000_000);
            let dc = rng.below(u64::from(shape.dcs())) as u32;
            (at, back, dc, rng.below(u64::from(shape.partitions)) as u32)
        });
    let restart = restart.filter(|&(_, _, dc, _)| may_fail(dc));
    // Drawn last, and only for spread leaders, so that other runs keep their draws.
    let stall_leaders = leaders_then_fail
        && shape.spread_leaders
        && (shape.forget_unsettled || rng.chance(500_000));
    Faults {
        fails,
        isolations,
        barrier_then_fail: aimed,
        restart,
        down: None,
        strong_then_fail,
        fail_at: None,
        leaders_then_fail,
        stall_leaders,
        vote_watch: None,
        cut_then_fail: false,
    }
}

/// Injects the faults whose time has come.
fn inject(world: &mut GeoWorld, faults: &mut Faults, log: &mut Vec<String>, now: u64) {
    let due: Vec<u32> =
        faults.fails.iter().filter(|(at, _)| *at <= now).map(|(_, dc)| *dc).collect();
    faults.fails.retain(|(at, _)| *at > now);
    for dc in due {
        if world.may_fail() {
            world.fail_dc(dc);
            world.reach("dc-failed");
            if faults.cut_then_fail {
                world.reach("cut-then-fail");
            }
            log.push(format!("{}ms: data center {dc} fails", now / 1_000_000));
        }
    }
    if let Some((until, delay, since)) = faults.vote_watch {
        if let Some(voted) = world.vote_out_from(0, since) {
            faults.vote_watch = None;
            faults.fail_at = Some((voted + delay, 0));
            world.reach("leaders-stalled");
        } else if now >= until {
            faults.vote_watch = None;
            faults.fail_at = Some((now, 0));
        } else {
            // The votes seen so far are none of data center 0's: look past them next time.
            faults.vote_watch = Some((until, delay, world.votes_out()));
        }
    }
    if let Some((at, dc)) = faults.fail_at.filter(|(at, _)| *at <= now) {
        faults.fail_at = None;
        if world.may_fail() && !world.failed.contains(&dc) {
            world.fail_dc(dc);
            log.push(format!("{}ms: data center {dc} fails after a strong commit", at / 1_000_000));
            if dc == 0 && world.shape.strong {
                world.reach("leaders-failed");
            }
        }
    }
    restart(world, faults, log, now);
    while faults.isolations.first().is_some_and(|(at, _)| *at <= now) {
        let (_, cut) = faults.isolations.remove(0);
        match cut {
            Some(dc) => {
                world.isolate_dc(dc);
                world.reach("dc-isolated");
                log.push(format!("{}ms: data center {dc} cut off", now / 1_000_000));
            }
            None => {
                world.heal();
                log.push(format!("{}ms: links restored", now / 1_000_000));
            }
        }
    }
}

/// Crashes the replica to restart, and restarts it, when their times come. Under the
/// failure budget only (its data center counts as failed once it crashes), and never in
/// a data center that failed.
fn restart(world: &mut GeoWorld, faults: &mut Faults, log: &mut Vec<String>, now: u64) {
    if let Some((at, back, dc, partition)) = faults.restart {
        let budget = world.shape.rejoin_empty || world.may_fail();
        if at <= now {
            faults.restart = None;
            if budget && !world.failed.contains(&dc) {
                let node = world.crash_replica(dc, partition);
                faults.down = Some((back, node));
                world.reach("replica-crashed");
                log.push(format!("{}ms: {node} (data center {dc}) crashes", now / 1_000_000));
            }
        }
    }
    if let Some((back, node)) = faults.down.filter(|(back, _)| *back <= now) {
        faults.down = None;
        world.restart(node);
        // A node rebuilt for a return meanwhile runs already (joining): nothing restarts.
        let (lost, joining) =
            world.world.engine(node).map_or((false, false), |e| (e.is_lost(), e.status().joining));
        if !joining {
            world.reach(if lost { "replica-restarted-lost" } else { "replica-rejoined-empty" });
        }
        log.push(format!("{}ms: {node} restarts", back / 1_000_000));
    }
}

/// Sends a session's next request, if it waits for nothing.
fn drive(
    world: &mut GeoWorld,
    s: &mut Session,
    index: usize,
    by_tag: &mut BTreeMap<RequestTag, usize>,
    faults: &mut Faults,
) {
    if s.done || !matches!(s.waiting, Waiting::Nothing) || world.now() < s.not_before {
        return;
    }
    if world.failed.contains(&s.dc) && !serves_until_told(world, s.dc) {
        // Its data center is down or removed: the session waits (a removed one may be
        // taken back), what it had open abandoned.
        abandon(world, s);
        s.plan.clear();
        return;
    }
    let node = coordinator(world, s);
    let (tag, waiting) = if let Some(open) = &s.open {
        let tx = open.id;
        match s.plan.pop_front() {
            Some(Planned::Read(k, kind)) => {
                let tag = world.submit(node, s.id, GeoOp::Read { tx, key: k.clone(), kind });
                (tag, Waiting::Op(Planned::Read(k, kind), false))
            }
            Some(Planned::Update(k, u)) => {
                let op = GeoOp::Update { tx, key: k.clone(), update: u.clone() };
                let tag = world.submit(node, s.id, op);
                (tag, Waiting::Op(Planned::Update(k, u), false))
            }
            Some(Planned::Remove(k, e)) => {
                let op = GeoOp::Read { tx, key: k.clone(), kind: Kind::AwSet };
                let tag = world.submit(node, s.id, op);
                (tag, Waiting::Op(Planned::Remove(k, e), true))
            }
            None => {
                let tag = world.submit(node, s.id, GeoOp::Commit { tx });
                // With the leaders spread, up to 400 ms: long enough for data center 0's
                // partitions to make their votes durable while the others decide.
                let within = if world.shape.spread_leaders { 400_000_000 } else { 40_000_000 };
                let delay = if faults.leaders_then_fail { s.rng.below(within) } else { 0 };
                if let Some(open) = &mut s.open {
                    open.committing = true;
                    if open.record.strong {
                        let spans = spans_leaders(world, &open.record);
                        aim_strong_fault(world, s.dc, s.last_update_at, faults, delay, spans);
                    }
                }
                (tag, Waiting::Commit)
            }
        }
    } else if s.rng.chance(100_000) {
        let migrate =
            s.rng.chance(400_000).then(|| s.rng.below(u64::from(world.shape.dcs())) as u32);
        let migrate = migrate.filter(|&to| to != s.dc && !world.failed.contains(&to));
        let tag = world.submit(node, s.id, GeoOp::Barrier { past: s.past.clone() });
        (tag, Waiting::Barrier(migrate))
    } else {
        s.plan = s.plan_tx();
        let past = s.past.clone();
        // Armed for the strong aimed fault, a session follows a causal update with a
        // strong transaction.
        let recent = s.last_update_at.is_some_and(|at| world.now() < at + 20_000_000);
        let follow = faults.strong_then_fail && recent;
        s.strong = (world.shape.strong && (follow || s.rng.chance(300_000))).then(|| {
            match s.rng.below(4) {
                // The aimed fault's transaction conflicts only with unlabelled ones.
                _ if follow => Some("deposit".to_owned()),
                0 => None,
                1 => Some("deposit".to_owned()),
                _ => Some(super::world::WITHDRAW.to_owned()),
            }
        });
        let op = match &s.strong {
            Some(label) => GeoOp::BeginStrong { past, label: label.clone() },
            None => GeoOp::Begin { past },
        };
        let tag = world.submit(node, s.id, op);
        (tag, Waiting::Begin(node))
    };
    s.waiting = waiting;
    by_tag.insert(tag, index);
}

/// Whether data center `dc` is a live one being removed with a replica not yet told:
/// its sessions go on (their clients do not know of the removal), each request to a told
/// replica refused, until every replica there is told.
fn serves_until_told(world: &GeoWorld, dc: u32) -> bool {
    if !world.removed_live.contains(&dc) {
        return false;
    }
    world.nodes_of(dc).into_iter().any(|n| world.world.engine(n).is_some_and(|e| !e.is_removed()))
}

/// The node a session's next request goes to: its transaction's coordinator, or any
/// replica of its data center.
fn coordinator(world: &GeoWorld, s: &mut Session) -> NodeId {
    if let Some(open) = &s.open {
        return open.node;
    }
    let nodes = world.nodes_of(s.dc);
    nodes[s.rng.below(nodes.len() as u64) as usize]
}

/// A session's reply; the tag of the request it sent next, if it did.
fn answered(
    world: &mut GeoWorld,
    s: &mut Session,
    result: Result<GeoResult, keel_types::KeelError>,
    faults: &mut Faults,
    log: &mut Vec<String>,
) -> Option<RequestTag> {
    let waiting = std::mem::replace(&mut s.waiting, Waiting::Nothing);
    let result = match result {
        Ok(r) => r,
        Err(e) => {
            s.not_before = world.now() + BACKOFF_NS;
            // A commit that timed out may still finish: its outcome is unknown.
            let outcome = match (&waiting, e) {
                (_, keel_types::KeelError::SessionExpired) => {
                    // Its past names a data center's old life above the cut of its
                    // return (lost): the client starts a new session.
                    world.reach("session-restarted");
                    s.id += SESSION_IDS;
                    s.past = Vector::zero(world.shape.dcs() as usize);
                    if let Some(open) = s.open.take() {
                        world.close(open, Outcome::Aborted);
                    }
                    return None;
                }
                (Waiting::Commit, keel_types::KeelError::Timeout) => {
                    world.reach("commit-timed-out");
                    Outcome::Unknown
                }
                (Waiting::Commit, keel_types::KeelError::Conflict(_)) => {
                    world.reach("strong-conflict");
                    Outcome::Aborted
                }
                _ => {
                    world.reach("refused");
                    Outcome::Aborted
                }
            };
            // What it read on its snapshot is in the session's past, as the server
            // keeps it, whatever the outcome.
            if let Some(open) = s.open.take() {
                s.past.join(&open.snap);
                world.close(open, outcome);
            }
            return None;
        }
    };
    match (waiting, result) {
        (Waiting::Begin(node), GeoResult::Began { tx, snap }) => {
            let mut open = world.began(node, s.id, &s.past.clone(), tx, &snap);
            if let Some(label) = s.strong.take() {
                open.record.strong = true;
                open.record.label = label;
            }
            s.open = Some(open);
        }
        (Waiting::Op(planned, first_half), GeoResult::Object(object)) => {
            op_done(s, planned, first_half, &object);
        }
        (Waiting::Commit, GeoResult::Committed { vector }) => {
            let open = s.open.take().expect("a commit of an open transaction");
            let strong = open.record.strong;
            let open_updates = open.record.ops.iter().any(|op| matches!(op, TxOp::Update { .. }));
            world.close(open, Outcome::Committed { vector: super::sim::history_vector(&vector) });
            s.past = vector;
            if world.removed_live.contains(&s.dc) {
                world.reach("committed-while-removed");
            }
            if world.lives.iter().any(|l| l.dc == s.dc) && !world.failed.contains(&s.dc) {
                world.reach("new-life-committed");
            }
            if strong {
                world.reach("strong-committed");
            } else if open_updates {
                s.last_update_at = Some(world.now());
            }
        }
        (Waiting::Barrier(migrate), GeoResult::Synced) => {
            world.synced(s.id, s.dc, &s.past, true);
            aimed_fault(world, s, faults, log);
            if let Some(to) = migrate.filter(|to| !world.failed.contains(to)) {
                let nodes = world.nodes_of(to);
                let node = nodes[s.rng.below(nodes.len() as u64) as usize];
                let tag = world.submit(node, s.id, GeoOp::Attach { past: s.past.clone() });
                s.waiting = Waiting::Attach(to);
                world.reach("migrated");
                return Some(tag);
            }
        }
        (Waiting::Attach(to), GeoResult::Synced) => {
            s.dc = to;
            world.synced(s.id, to, &s.past, false);
        }
        (waiting, result) => panic!("reply {result:?} to {waiting:?}"),
    }
    None
}

/// Records an operation's object; the first half of a remove sends its second.
fn op_done(s: &mut Session, planned: Planned, first_half: bool, object: &Object) {
    let Some(open) = s.open.as_mut() else { return };
    match planned {
        Planned::Read(k, kind) => GeoWorld::record_op(open, &k, None, kind, object),
        Planned::Update(k, u) => GeoWorld::record_op(open, &k, Some(&u), u.kind(), object),
        Planned::Remove(k, e) if first_half => {
            GeoWorld::record_op(open, &k, None, Kind::AwSet, object);
            let seen = object.adds_of(&e);
            s.plan.push_front(Planned::Update(k, Update::SRem(e, seen)));
        }
        Planned::Remove(..) => unreachable!("a remove's second half is an update"),
    }
}

/// The aimed fault: right after a barrier, the barrier's data center and the one whose
/// transactions the session's past holds most recently fail together (as many as `f`
/// allows).
fn aimed_fault(world: &mut GeoWorld, s: &Session, faults: &mut Faults, log: &mut Vec<String>) {
    if !faults.barrier_then_fail || world.now() < 2_000_000_000 {
        return;
    }
    let remote = (0..world.shape.dcs())
        .filter(|&d| d != s.dc && s.past.dcs[d as usize] > 0 && !world.failed.contains(&d))
        .max_by_key(|&d| s.past.dcs[d as usize]);
    let Some(remote) = remote else { return };
    faults.barrier_then_fail = false;
    world.reach("barrier-then-fail");
    for dc in [s.dc, remote] {
        if world.may_fail() {
            world.fail_dc(dc);
            log.push(format!(
                "{}ms: data center {dc} fails after a barrier",
                world.now() / 1_000_000
            ));
        }
    }
}

/// Arms the strong aimed fault at a strong commit just sent from data center `dc`, if
/// its session's causal update committed moments ago; or the leaders' aimed fault, `delay`
/// after the commit; or, when it stalls the leaders, at a commit that `spans` them: it
/// stalls the links into data center 0's leaders now, and fails data center 0 `delay`
/// after one of them sent a vote out ([`inject`]).
fn aim_strong_fault(
    world: &mut GeoWorld,
    dc: u32,
    last_update_at: Option<u64>,
    f: &mut Faults,
    delay: u64,
    spans: bool,
) {
    let now = world.now();
    let recent = last_update_at.is_some_and(|at| now < at + 20_000_000);
    if f.strong_then_fail && recent && now >= 1_000_000_000 {
        f.strong_then_fail = false;
        f.fail_at = Some((now + 1_000_000, dc));
        world.reach("strong-then-fail");
    } else if f.leaders_then_fail
        && f.fail_at.is_none()
        && now >= 1_000_000_000
        && (spans || !f.stall_leaders)
    {
        f.leaders_then_fail = false;
        if f.stall_leaders {
            let until = now + STALL_LEADERS_NS;
            world.stall_into_leaders(0, until);
            f.vote_watch = Some((until, delay, world.votes_out()));
        } else {
            f.fail_at = Some((now + 1_000_000 + delay, 0));
        }
    }
}

/// Whether strong transaction `tx` updates partition 0 and votes at another partition
/// too (the stalled leaders' fault waits for one: partition 0 stays undecided while the
/// others decide, and its updates are lost if it then aborts).
fn spans_leaders(world: &GeoWorld, tx: &ClientTx) -> bool {
    let partition =
        |key: &str| keel_core::geo::key_partition(key.as_bytes(), world.shape.partitions);
    let updates_zero = tx.ops.iter().any(|op| match op {
        TxOp::Update { key, .. } => partition(key) == 0,
        TxOp::Read { .. } => false,
    });
    let elsewhere = tx.ops.iter().any(|op| match op {
        TxOp::Read { key, .. } | TxOp::Update { key, .. } => partition(key) != 0,
    });
    updates_zero && elsewhere
}

/// Closes what a session left open at the end or when its data center failed.
fn abandon(world: &mut GeoWorld, s: &mut Session) {
    if let Some(open) = s.open.take() {
        let outcome = if open.committing { Outcome::Unknown } else { Outcome::Aborted };
        world.close(open, outcome);
    }
}

/// The update transactions of `history` that committed (see [`GeoReport::updates`]).
fn committed_updates(history: &CausalHistory) -> usize {
    let updates = |t: &&keel_check::causal::history::ClientTx| {
        matches!(t.outcome, Outcome::Committed { .. })
            && t.ops.iter().any(|op| matches!(op, TxOp::Update { .. }))
    };
    history.txs.iter().filter(updates).count() + history.committed.len()
}

/// Once every failed data center was removed, and the quiet end ran, no replica still
/// holds a remote transaction for forwarding (every data center left reported storing
/// it); a removed data center's replicas that ran on learned they were removed.
fn held_after_removal(world: &mut GeoWorld) -> Vec<String> {
    let nodes: Vec<NodeId> = world.world.node_ids();
    let removed: Vec<NodeId> = nodes
        .iter()
        .copied()
        .filter(|&n| world.world.engine(n).is_some_and(|e| e.is_removed()))
        .collect();
    if !removed.is_empty() {
        world.reach("removed-told");
    }
    let gone: Vec<Vec<u32>> = nodes
        .iter()
        .filter_map(|&n| world.world.engine(n).map(|e| removed_for_good(&e.status())))
        .collect();
    // Every replica still running in a data center a survivor knows removed was told, by
    // the end of the quiet end (healed): a notice whose sends were spent while it was cut
    // off is sent again once it is heard. (Not a lost one, restarted without its state:
    // it takes no peer message, and refuses its clients already.)
    let mut out = Vec::new();
    // No acceptor still running holds a promise: one whose proposer failed before
    // deciding is asked about, and aborted, within a few suspicion time-outs.
    for &node in &nodes {
        let Some(engine) = world.world.engine(node).filter(|e| !e.is_removed() && !e.is_lost())
        else {
            continue;
        };
        if let Some(dc) = engine.status().removal_promised {
            out.push(format!(
                "promise-held: {node} still holds its promise of data center {dc}'s removal"
            ));
        }
    }
    let known_removed: BTreeSet<u32> = gone.iter().flatten().copied().collect();
    for &dc in &known_removed {
        for node in world.nodes_of(dc) {
            let untold = world
                .world
                .engine(node)
                .is_some_and(|e| !e.is_removed() && !e.is_lost() && !e.status().joining);
            if untold {
                out.push(format!("removed-untold: {node} of removed data center {dc} runs untold"));
            }
        }
    }
    let all_failed_removed = !world.failed.is_empty()
        && gone.iter().any(|r| world.failed.iter().all(|dc| r.contains(dc)));
    // A data center coming back freezes collection until its new replicas report.
    let coming_back = nodes
        .iter()
        .filter_map(|&n| world.world.engine(n))
        .any(|e| !e.is_removed() && !e.status().returning.is_empty());
    if !all_failed_removed || coming_back {
        return out;
    }
    world.reach("removal-collected");
    for dc in (0..world.shape.dcs()).filter(|dc| !world.failed.contains(dc)) {
        for node in world.nodes_of(dc) {
            let Some(status) = world.world.engine(node).map(|e| e.status()) else { continue };
            if status.forwardable > 0 {
                out.push(format!(
                    "held-after-removal: {node} holds {} remote transactions for forwarding after every failed data center {:?} was removed",
                    status.forwardable, world.failed
                ));
            }
            if world.failed.iter().any(|dc| !status.removed.contains(dc)) {
                out.push(format!("removal-unknown: {node} never learned of the removal"));
            }
        }
    }
    out
}

/// The data centers a replica knows removed, and not coming back (at an odd epoch: a
/// returning one counts as removed until it is back).
fn removed_for_good(status: &keel_core::geo::Status) -> Vec<u32> {
    let odd = |d: &u32| status.epochs.get(*d as usize).is_some_and(|e| e % 2 == 1);
    status.removed.iter().copied().filter(odd).collect()
}

/// A removal answered `TIMEOUT` (its commit round outlasted its deadline: the outcome
/// unknown) may have been made since, learned from the acceptors' votes. Every data
/// center some node knows removed counts as failed from then on (as a live one removed
/// does), and more than `f` of them is a violation.
fn removals_found(world: &mut GeoWorld) -> Vec<String> {
    let known: BTreeSet<u32> = world
        .world
        .node_ids()
        .into_iter()
        .filter_map(|n| world.world.engine(n).map(|e| removed_for_good(&e.status())))
        .flatten()
        .collect();
    let mut out = Vec::new();
    let unrecorded: Vec<u32> = known.into_iter().filter(|dc| !world.failed.contains(dc)).collect();
    for dc in unrecorded {
        world.reach("removal-outcome-found");
        world.remove_beyond_f(dc);
        if world.failed.len() > world.shape.f as usize {
            out.push(format!(
                "removal-beyond-f: data center {dc} found removed at the end with {:?} failed (f = {})",
                world.failed, world.shape.f
            ));
        }
    }
    out
}

/// Checks the run and builds its report.
pub fn finish(mut world: GeoWorld, config: &GeoRunConfig, faults: Vec<String>) -> GeoReport {
    let found = removals_found(&mut world);
    world.record_removed_unsent();
    let history = world.history(true);
    let mut violations: Vec<String> =
        world.violations().iter().map(|v| format!("{}: {}", v.kind, v.detail)).collect();
    violations.extend(found);
    violations.extend(held_after_removal(&mut world));
    violations.extend(super::back::changes_diverge(&world));
    violations.extend(super::back::returns_stalled(&mut world));
    let report = keel_check::causal::check(&history);
    let counts = report.counts.iter().map(|(k, n)| (k.to_string(), *n)).collect();
    violations.extend(report.violations.iter().map(|v| v.to_string()));
    if report.violations_total > report.violations.len() {
        violations.push(format!("... {} violations in all", report.violations_total));
    }
    let mut reached = world.reached.clone();
    for (path, count) in world.world.path_counts() {
        if count > 0 {
            reached.insert(path.to_string(), count);
        }
    }
    GeoReport {
        seed: config.seed,
        scenario: config.scenario.clone(),
        dcs: world.shape.dcs(),
        partitions: world.shape.partitions,
        txs: history.txs.len(),
        updates: committed_updates(&history),
        syncs: history.syncs.len(),
        failed: world.failed.clone(),
        virtual_ms: world.now() / 1_000_000,
        faults,
        violations,
        counts,
        panic: None,
        reached,
        replay: format!(
            "keel sim run --engine geo --scenario {} --seed {}",
            config.scenario, config.seed
        ),
        history: config.keep_history.then_some(history),
    }
}
