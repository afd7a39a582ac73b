//! The `lease-overlap` scenario: a scripted nemesis, in the manner of a Jepsen targeted
//! nemesis, that drives five nodes of the real world (network, clocks, disks, engines)
//! into the lease overlap of `docs/protocol.md` §4, which no random seed reaches.
//!
//! The overlap needs a follower `V` of a live leader `L` moved to a higher epoch by a late
//! reply while `L`'s lease still counts on `V`'s promise not to vote. The script builds
//! it from partitions, two directed link stalls and a rule on vote traffic; roles are
//! drawn from the seed, timers, latencies, clocks and disks come from the seed as in
//! every scenario. Phases (`e0` is the first leader's epoch; election timeouts are 2 to
//! 2.1 s, so the leader lease is about 1.87 s):
//!
//! 0. **warm-up**: the general workload runs for a second under the first leader, `V`,
//!    then stops, and the cluster converges.
//! 1. **stall**: the link `V → W` stalls for 11 to 12 s (everything `V` sends `W`
//!    arrives after, in order), and `V` is cut from `L`, `A` and `C`: a leaderless period.
//! 2. **W climbs**: only `W`'s pre-votes pass and its vote requests are lost, so `W`
//!    campaigns twice, unheard, and ends in `e0 + 2`.
//! 3. **L is elected**: `W` is cut from `L`, `A` and `C`; only `L`'s pre-votes pass, and
//!    `A` and `C` elect it in `e0 + 1`. Then `V` rejoins and follows `L`.
//! 4. **C is cut** from `L` and `A` (it still reaches `V` and `W`), 2.6 to 3.6 s before
//!    the stall ends: its election timer runs, and its first pre-vote is refused by `W`
//!    with `e0 + 2`, which moves `C` there.
//! 5. **V → L stalls** for about 3 s, 5 to 50 ms before the `V → W` stall ends.
//!    `V`'s stalled `Append`s of `e0` then reach `W`, whose replies in `e0 + 2` move `V`
//!    there while `L`'s lease counts on it (`lease-overlap:setup`). `V`'s answers to `L`
//!    are held back, so `L` keeps leading.
//! 6. **C campaigns again** about 2 s after its first pre-vote, while `L`'s lease runs.
//!    `W` grants. `V` refuses until `election_timeout_min` after it last heard `L`; under
//!    the negative control `forget_leader_contact` it has forgotten that and grants, `C`
//!    leads in `e0 + 3` with a valid lease beside `L`'s, and the world's one-lease check
//!    records `one-leader-lease`.
//! 7. **heal**: every cut and rule ends; the cluster must converge, every follower must
//!    hold a lease again, and the history is checked as in the general scenario.

use crate::clients::Clients;
use crate::disk::HardStateMode;
use crate::nemesis::{Nemesis, NemesisConfig};
use crate::net::NetConfig;
use crate::rng::Rng;
use crate::scenario::{
    await_leases, converge, engine_config, finish, general_workload, panic_text, reached,
    world_config, GeneralConfig, RunReport,
};
use crate::world::{Fate, World};
use keel_core::leader::{LeaderEngine, Message, Role};
use keel_core::time::Span;
use keel_types::{Epoch, NodeId};
use std::panic::{catch_unwind, AssertUnwindSafe};

const MS: u64 = 1_000_000;

/// How long the warm-up workload runs.
const WARM_UP_NS: u64 = 1_000_000_000;
/// The shortest stall of the link from the first leader to `W`; up to a second more is
/// drawn. It must outlast `W`'s two campaigns (4.2 s at most after the stall starts: two
/// election timeouts), `L`'s election (2.1 s more at most) and the 2.6 to 3.6 s `C` is
/// cut before the stall ends.
const W_STALL_NS: u64 = 11_000_000_000;
/// How long the link from `V` to `L` stalls.
const L_STALL_NS: u64 = 3_000_000_000;

type Sim = World<LeaderEngine>;

/// The scenario's reports of what it reached, by name (in [`RunReport::reached`]).
pub mod reached_names {
    /// `V` moved to a higher epoch by a late reply while `L` led with a valid lease.
    pub const SETUP: &str = "lease-overlap:setup";
    /// Another node led while `L` still held a valid lease (only under the control).
    pub const SECOND_LEADER: &str = "lease-overlap:second-leader";
    /// A phase did not happen in time, so the seed could not reach the setup.
    pub const GAVE_UP: &str = "lease-overlap:gave-up";
}

/// Steps the world one event at a time (clients take their notices) until `cond` holds
/// (true), `deadline_ns` passes or a violation is found (false).
fn run_until(
    world: &mut Sim,
    clients: &mut Clients,
    deadline_ns: u64,
    mut cond: impl FnMut(&Sim) -> bool,
) -> bool {
    loop {
        if cond(world) {
            return true;
        }
        if !world.violations().is_empty() {
            return false;
        }
        match world.next_event_ns() {
            Some(t) if t <= deadline_ns => {
                if let Some(notice) = world.step() {
                    assert!(clients.handle(world, &notice), "notice nobody handles: {notice:?}");
                }
            }
            _ => {
                world.advance_to(deadline_ns);
                return cond(world);
            }
        }
    }
}

fn epoch(world: &Sim, node: NodeId) -> Epoch {
    world.status(node).map_or(Epoch(0), |s| s.epoch)
}

fn role(world: &Sim, node: NodeId) -> Role {
    world.status(node).map_or(Role::Follower, |s| s.role)
}

/// Replaces every cut with `cuts`: each node with each of its list, both ways, and `W`'s
/// link to `V` one way (`V → W` is never cut: it carries the stalled `Append`s).
fn set_cuts(world: &mut Sim, cuts: &[(NodeId, &[NodeId])], w_to_v: Option<(NodeId, NodeId)>) {
    world.net.heal();
    for (node, others) in cuts {
        world.net.partition(&[*node], others);
    }
    if let Some((w, v)) = w_to_v {
        world.net.cut_one_way(&[w], &[v]);
    }
}

/// What the script reached in one seed.
#[derive(Clone, Copy, Debug, Default)]
struct Outcome {
    /// `V` moved to a higher epoch by a late reply while `L` led with a valid lease.
    setup: bool,
    /// Another node led while `L`'s lease was valid.
    second_leader: bool,
    /// A phase did not come in time.
    gave_up: bool,
    /// Directed links stalled.
    link_stalls: u64,
    /// Sets of cuts put in place.
    partitions: u64,
}

/// Runs one seed of the scenario, catching panics into the report.
pub fn run(config: &GeneralConfig) -> RunReport {
    let mut report =
        RunReport { scenario: "lease-overlap".into(), seed: config.seed, ..RunReport::default() };
    let outcome = catch_unwind(AssertUnwindSafe(|| body(config, &mut report)));
    if let Err(panic) = outcome {
        report.panic = Some(panic_text(panic.as_ref()));
    }
    report
}

fn body(config: &GeneralConfig, report: &mut RunReport) {
    let mut rng = Rng::new(config.seed);
    let mut wc = world_config(&mut rng, HardStateMode::Sync);
    wc.nodes = 5;
    wc.engine = engine_config(5);
    wc.engine.election_timeout_min = Span::from_millis(2_000);
    wc.engine.election_timeout_max = Span::from_millis(2_100);
    wc.engine.unsafe_forget_leader_contact = config.forget_leader_contact;
    // The script relies on its messages arriving: no loss or duplication.
    wc.net = NetConfig { loss_ppm: 0, duplicate_ppm: 0, ..wc.net };
    let active_set_target = wc.engine.active_set_target;
    let mut world: Sim = World::new(wc, rng.next_u64());
    let mut clients = Clients::new(general_workload(&mut rng), rng.fork());
    // Never started, so it injects nothing; the general scenario's phases take one.
    let mut nemesis = Nemesis::new(NemesisConfig::all(), rng.fork());
    let mut script = Vec::new();
    let outcome = drive(&mut world, &mut clients, &mut nemesis, &mut rng, &mut script);
    // Phase 7: heal, converge, leases back, and the general scenario's checks.
    world.set_message_rule(None);
    nemesis.heal_all(&mut world);
    clients.stop();
    let converged =
        world.violations().is_empty() && converge(&mut world, &mut clients, &mut nemesis);
    if converged {
        await_leases(&mut world, &mut clients, &mut nemesis, active_set_target);
    }
    finish(&mut world, &clients, converged, config.keep_history, report);
    report.faults = script;
    report.reached = reached(&world, &nemesis, clients.retries);
    report.reached.insert("fault:link-stall".into(), outcome.link_stalls);
    report.reached.insert("fault:partition".into(), outcome.partitions);
    report.reached.insert("scripted-drops".into(), world.stats.scripted_drops);
    report.reached.insert(reached_names::SETUP.into(), u64::from(outcome.setup));
    report.reached.insert(reached_names::SECOND_LEADER.into(), u64::from(outcome.second_leader));
    report.reached.insert(reached_names::GAVE_UP.into(), u64::from(outcome.gave_up));
    report.reached.retain(|_, n| *n > 0);
}

/// Drives phases 0 to 6.
fn drive(
    world: &mut Sim,
    clients: &mut Clients,
    nemesis: &mut Nemesis,
    rng: &mut Rng,
    script: &mut Vec<String>,
) -> Outcome {
    let mut outcome = Outcome::default();
    // A phase that did not come in time; a violation is not the script giving up.
    let give_up = |world: &Sim, mut outcome: Outcome| {
        outcome.gave_up = world.violations().is_empty();
        outcome
    };
    let mut note = |world: &Sim, what: String| {
        if world.trace {
            eprintln!("{:>12} script: {what}", world.now_ns());
        }
        script.push(format!("{:.3}s {what}", world.now_ns() as f64 / 1e9));
    };
    let all = world.node_ids();
    // Phase 0: a first leader, V, under the general workload for a second.
    if !run_until(world, clients, world.now_ns() + 10_000 * MS, |w| w.leader().is_some()) {
        note(world, "gave up: no first leader".into());
        return give_up(world, outcome);
    }
    clients.start(world);
    let stop_at = world.now_ns() + WARM_UP_NS;
    run_until(world, clients, stop_at, |_| false);
    clients.stop();
    // Every operation answered, one leader, every log durable and applied everywhere.
    if !converge(world, clients, nemesis) {
        note(world, "gave up: no convergence after the warm-up".into());
        return give_up(world, outcome);
    }
    let v = world.leader().expect("converged");
    let settle = world.now_ns() + 200 * MS;
    run_until(world, clients, settle, |_| false);
    if !world.violations().is_empty() {
        return outcome;
    }
    let e0 = epoch(world, v);
    let mut others: Vec<NodeId> = all.iter().copied().filter(|n| *n != v).collect();
    let w = others.remove(rng.index(others.len()));
    let rest = others.clone();
    let l = others.remove(rng.index(others.len()));
    let c = others.remove(rng.index(others.len()));
    let a = others[0];
    // Phase 1: V's link to W stalls; V is cut from the rest.
    let t1 = world.now_ns();
    let stall_end = t1 + W_STALL_NS + rng.range(0, 1_000 * MS);
    world.net.stall_link(v, w, stall_end);
    outcome.link_stalls += 1;
    outcome.partitions += 1;
    set_cuts(world, &[(v, &rest)], Some((w, v)));
    note(world, format!("V={v} (leader in {e0:?}) W={w} L={l} C={c} A={a}"));
    note(
        world,
        format!("stall {v}->{w} until {:.3}s; cut {v} from {rest:?}", stall_end as f64 / 1e9),
    );
    // Phase 2: only W's pre-votes pass, and its vote requests are lost: W climbs twice.
    world.set_message_rule(Some(Box::new(move |from, _to, m: &Message| match m {
        Message::PreVote { .. } if from != w => Fate::Drop,
        Message::RequestVote { .. } if from == w => Fate::Drop,
        _ => Fate::Pass,
    })));
    let target = Epoch(e0.0 + 2);
    if !run_until(world, clients, stall_end - 4_000 * MS, |x| epoch(x, w) >= target) {
        note(world, "gave up: W did not reach e0+2".into());
        return give_up(world, outcome);
    }
    note(world, format!("{w} in {target:?} after two campaigns nobody heard"));
    // Phase 3: W is cut off; only L's pre-votes pass, and A and C elect it in e0 + 1; then
    // V rejoins. (W's vote requests wait behind its vote's fsync: they stay lost.)
    world.set_message_rule(Some(Box::new(move |from, _to, m: &Message| match m {
        Message::PreVote { .. } if from != l => Fate::Drop,
        Message::RequestVote { .. } if from == w => Fate::Drop,
        _ => Fate::Pass,
    })));
    outcome.partitions += 1;
    set_cuts(world, &[(v, &rest), (w, &rest)], Some((w, v)));
    note(world, format!("cut {w} from {rest:?}; only {l} may pre-vote"));
    if !run_until(world, clients, stall_end - 3_700 * MS, |x| role(x, l) == Role::Leader) {
        note(world, "gave up: L was not elected in time".into());
        return give_up(world, outcome);
    }
    let e_l = epoch(world, l);
    world.set_message_rule(Some(Box::new(move |from, _to, m: &Message| match m {
        Message::RequestVote { .. } if from == w => Fate::Drop,
        _ => Fate::Pass,
    })));
    outcome.partitions += 1;
    set_cuts(world, &[(w, &rest)], Some((w, v)));
    note(world, format!("{l} leads in {e_l:?}; {v} rejoins"));
    // Phase 4: C is cut from L and A (it reaches V and W) so that its election timer runs.
    let t_c = stall_end - rng.range(2_600 * MS, 3_600 * MS);
    run_until(world, clients, t_c, |_| false);
    outcome.partitions += 1;
    set_cuts(world, &[(w, &[l, a]), (c, &[l, a])], None);
    note(world, format!("cut {c} from {l} and {a}; {c} and {w} reach each other, {w} reaches {v}"));
    // Phase 5: V's link to L stalls just before V's stalled Appends reach W.
    let t_s = stall_end - rng.range(5 * MS, 50 * MS);
    run_until(world, clients, t_s, |_| false);
    world.net.stall_link(v, l, t_s + L_STALL_NS);
    outcome.link_stalls += 1;
    note(world, format!("stall {v}->{l} until {:.3}s", (t_s + L_STALL_NS) as f64 / 1e9));
    // Phase 6: watch while L's lease runs.
    let (mut setup, mut second) = (false, false);
    let raised =
        |x: &Sim| x.engine(v).is_some_and(|e| e.counters().epochs_raised_under_live_leader > 0);
    run_until(world, clients, t_s + L_STALL_NS + 500 * MS, |x| {
        let lease = x.status(l).is_some_and(|s| s.role == Role::Leader && s.leader_lease_valid);
        setup |= lease && epoch(x, v) > e_l && raised(x);
        second |= lease && all.iter().any(|n| *n != l && role(x, *n) == Role::Leader);
        false
    });
    note(world, format!("setup reached: {setup}; a second leader beside L's lease: {second}"));
    Outcome { setup, second_leader: second, ..outcome }
}
