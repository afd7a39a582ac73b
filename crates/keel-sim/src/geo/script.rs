//! The digest's test scenarios, scripted (`docs/geo.md`, *Testing*):
//! each builds a cluster, drives sessions through one situation, checks what the scenario
//! promises, and puts the run's history through the causal checker as every run does.
//! The seed still draws the network's jitter, loss and the clocks.

use super::scenario::{finish, GeoReport, GeoRunConfig};
use super::world::{GeoShape, GeoWorld, OpenTx, WITHDRAW};
use crate::rng::Rng;
use keel_check::causal::history::Outcome;
use keel_core::geo::{GeoOp, GeoResult, Kind, Object, Update, Vector};
use keel_types::{Key, NodeId};
use std::collections::BTreeMap;

/// A scripted scenario: its name and its run.
pub type Script = fn(&GeoRunConfig) -> GeoReport;

/// Every scripted scenario, by name (the digest's numbers in `docs/geo.md`).
pub static SCRIPTS: [(&str, Script); 19] = [
    ("causality", causality),
    ("atomic", atomic),
    ("sessions", sessions),
    ("convergence", convergence),
    ("forwarding", forwarding),
    ("barrier", barrier),
    ("migration", migration),
    ("unplanned", unplanned),
    ("idle-partition", idle_partition),
    ("skew", skew),
    ("f-failures", f_failures),
    ("collection", collection),
    ("overdraft", overdraft),
    ("liveness-trap", liveness_trap),
    ("no-false-conflicts", no_false_conflicts),
    ("isolated-dc", isolated_dc),
    ("leader-failover", leader_failover),
    ("strong-f-failures", strong_f_failures),
    ("all-strong", all_strong),
];

/// Runs every scripted scenario on `config`'s seed; the first failure's report, else the
/// last one's.
pub fn run_all(config: &GeoRunConfig) -> GeoReport {
    let mut last = GeoReport::default();
    for (name, script) in &SCRIPTS {
        let config = GeoRunConfig { scenario: (*name).to_string(), ..config.clone() };
        last = script(&config);
        if !last.passed() {
            return last;
        }
    }
    last
}

/// Runs the scripted scenario `name`.
pub fn run_named(name: &str, config: &GeoRunConfig) -> GeoReport {
    let (_, script) = SCRIPTS.iter().find(|(n, _)| *n == name).expect("a known scenario");
    script(config)
}

/// A cluster of `2f + 1` data centers of `partitions` replicas, wide-area delays of 20 to
/// 80 ms drawn from the seed, a little loss and jitter.
fn cluster(config: &GeoRunConfig, f: u32, partitions: u32) -> (GeoWorld, Rng) {
    cluster_with(config, f, partitions, |_| {})
}

/// [`cluster`], its shape adjusted by `tweak` first.
fn cluster_with(
    config: &GeoRunConfig,
    f: u32,
    partitions: u32,
    tweak: impl Fn(&mut GeoShape),
) -> (GeoWorld, Rng) {
    let mut rng = Rng::new(config.seed);
    let dcs = 2 * f + 1;
    let mut wan_ns = BTreeMap::new();
    for a in 0..dcs {
        for b in a + 1..dcs {
            wan_ns.insert((a, b), rng.range(20_000_000, 80_000_000));
        }
    }
    let shape = GeoShape {
        f,
        partitions,
        wan_ns,
        loss_ppm: rng.below(10_000) as u32,
        duplicate_ppm: rng.below(10_000) as u32,
        jitter_ns: rng.range(1, 2_000_000),
        skew_ms: rng.below(500),
        expose_non_uniform: config.expose_non_uniform,
        ..GeoShape::default()
    };
    let mut shape = shape;
    tweak(&mut shape);
    let world = GeoWorld::new(shape, rng.next_u64());
    (world, rng)
}

fn key(s: &str) -> Key {
    Key::copy_from_slice(s.as_bytes())
}

fn read(k: &str, kind: Kind) -> (Key, Option<Update>, Kind) {
    (key(k), None, kind)
}

fn write(k: &str, update: Update) -> (Key, Option<Update>, Kind) {
    let kind = update.kind();
    (key(k), Some(update), kind)
}

/// The node of partition 0 (or `p`) of data center `dc`.
fn node(world: &GeoWorld, dc: u32, p: usize) -> NodeId {
    world.nodes_of(dc)[p % world.nodes_of(dc).len()]
}

/// Ends a scripted run: quiet time, then the checks every run gets, plus `problems`.
fn end(mut world: GeoWorld, config: &GeoRunConfig, problems: Vec<String>) -> GeoReport {
    world.quiesce(10_000_000_000);
    let mut report = finish(world, config, Vec::new());
    report.violations.extend(problems.into_iter().map(|p| format!("scenario: {p}")));
    report
}

/// Polls `done` on a fresh read-only transaction every 10 ms until it holds or `within`
/// passes; whether it held.
fn eventually(
    world: &mut GeoWorld,
    at: NodeId,
    session: u64,
    ops: &[(Key, Option<Update>, Kind)],
    within_ns: u64,
    done: impl Fn(&[Object]) -> bool,
) -> bool {
    let until = world.now() + within_ns;
    while world.now() < until {
        if let Some((_, seen)) =
            world.tx(at, session, &Vector::zero(world.shape.dcs() as usize), ops)
        {
            if done(&seen) {
                return true;
            }
        }
        let next = world.now() + 10_000_000;
        world.run_until(next);
    }
    false
}

/// Scenario 1: Alice deposits to Bob, then posts a notification (on another partition); Bob, at
/// another data center, who sees the notification sees the deposit.
fn causality(config: &GeoRunConfig) -> GeoReport {
    let (mut world, _) = cluster(config, 1, 2);
    let zero = Vector::zero(3);
    let mut problems = Vec::new();
    let (past, _) =
        world.tx(node(&world, 0, 0), 1, &zero, &[write("bob", Update::Add(100))]).expect("deposit");
    world
        .tx(node(&world, 0, 1), 1, &past, &[write("inbox", Update::Set(key("paid")))])
        .expect("note");
    let probe = [read("inbox", Kind::Register), read("bob", Kind::Counter)];
    for _ in 0..300 {
        let Some((_, seen)) = world.tx(node(&world, 1, 0), 2, &zero, &probe) else { continue };
        if matches!(&seen[0], Object::Register(Some(_))) {
            if seen[1] != Object::Counter(100) {
                problems.push(format!("the note without the deposit: {seen:?}"));
            }
            break;
        }
        let next = world.now() + 2_000_000;
        world.run_until(next);
    }
    end(world, config, problems)
}

/// Scenario 2: A transaction over three partitions is seen whole or not at all, everywhere.
fn atomic(config: &GeoRunConfig) -> GeoReport {
    let (mut world, _) = cluster(config, 1, 3);
    let zero = Vector::zero(3);
    let keys = ["x", "y", "z", "w", "v"];
    let writes: Vec<_> = keys.iter().map(|k| write(k, Update::Set(key("1")))).collect();
    let reads: Vec<_> = keys.iter().map(|k| read(k, Kind::Register)).collect();
    world.tx(node(&world, 0, 0), 1, &zero, &writes).expect("the write");
    let mut problems = Vec::new();
    for i in 0..200u64 {
        let dc = (i % 3) as u32;
        let Some((_, seen)) = world.tx(node(&world, dc, i as usize), 2 + i % 3, &zero, &reads)
        else {
            continue;
        };
        let set = seen.iter().filter(|o| matches!(o, Object::Register(Some(_)))).count();
        if set != 0 && set != keys.len() {
            problems.push(format!("data center {dc} saw {set} of {} writes", keys.len()));
        }
        let next = world.now() + 1_000_000;
        world.run_until(next);
    }
    end(world, config, problems)
}

/// Scenario 3: A session reads its own writes within a transaction, in the next one (on another
/// replica of its data center, at once), and after a barrier and an attach elsewhere.
fn sessions(config: &GeoRunConfig) -> GeoReport {
    let (mut world, _) = cluster(config, 1, 2);
    let mut past = Vector::zero(3);
    let mut problems = Vec::new();
    for i in 0..20 {
        let value = key(&format!("v{i}"));
        let ops = [write("mine", Update::Set(value.clone())), read("mine", Kind::Register)];
        let (next, seen) = world.tx(node(&world, 0, i), 1, &past, &ops).expect("a write");
        if !matches!(&seen[1], Object::Register(Some((v, _))) if *v == value) {
            problems.push(format!("read-your-writes inside a transaction: {seen:?}"));
        }
        past = next;
        let (next, seen) = world
            .tx(node(&world, 0, i + 1), 1, &past, &[read("mine", Kind::Register)])
            .expect("a read");
        if !matches!(&seen[0], Object::Register(Some((v, _))) if *v == value) {
            problems.push(format!("read-your-writes across transactions: {seen:?}"));
        }
        past = next;
    }
    let synced =
        world.call(node(&world, 0, 0), 1, GeoOp::Barrier { past: past.clone() }, 10_000_000_000);
    world.synced(1, 0, &past, true);
    let attached =
        world.call(node(&world, 2, 0), 1, GeoOp::Attach { past: past.clone() }, 10_000_000_000);
    world.synced(1, 2, &past, false);
    if synced != Some(GeoResult::Synced) || attached != Some(GeoResult::Synced) {
        problems.push("the barrier or the attach did not return".into());
    }
    let (_, seen) =
        world.tx(node(&world, 2, 1), 1, &past, &[read("mine", Kind::Register)]).expect("a read");
    if !matches!(&seen[0], Object::Register(Some((v, _))) if *v == "v19") {
        problems.push(format!("read-your-writes after the move: {seen:?}"));
    }
    end(world, config, problems)
}

/// Scenario 5: Concurrent deposits of 100 and 200 at two data centers (and 300 at the third) are
/// 600 everywhere, whatever the arrival order, forwarded duplicates included.
fn convergence(config: &GeoRunConfig) -> GeoReport {
    let (mut world, _) = cluster(config, 1, 1);
    let zero = Vector::zero(3);
    for (dc, amount) in [(0, 100), (1, 200), (2, 300)] {
        let n = node(&world, dc, 0);
        let tag = world.submit(n, 10 + u64::from(dc), GeoOp::Begin { past: zero.clone() });
        world.replies.remove(&tag);
        world
            .tx(n, u64::from(dc), &zero, &[write("acct", Update::Add(amount))])
            .expect("a deposit");
    }
    let mut problems = Vec::new();
    for dc in 0..3 {
        let n = node(&world, dc, 0);
        if !eventually(
            &mut world,
            n,
            20 + u64::from(dc),
            &[read("acct", Kind::Counter)],
            5_000_000_000,
            |s| s[0] == Object::Counter(600),
        ) {
            problems.push(format!("data center {dc} never reached 600"));
        }
    }
    end(world, config, problems)
}

/// Scenario 6: Figure 1: t1 commits at d1 and reaches d2 only; d1 fails; a session at d2 that saw
/// t1 commits t2; both become visible at d3 (t1 forwarded by d2), once each.
fn forwarding(config: &GeoRunConfig) -> GeoReport {
    let (mut world, _) = cluster(config, 1, 1);
    let zero = Vector::zero(3);
    let (d1, d2, d3) = (node(&world, 0, 0), node(&world, 1, 0), node(&world, 2, 0));
    world.world.net.cut_one_way(&[d1], &[d3]);
    world.tx(d1, 1, &zero, &[write("t1", Update::Add(1))]).expect("t1");
    let seen_t1 = eventually(&mut world, d2, 2, &[read("t1", Kind::Counter)], 5_000_000_000, |s| {
        s[0] == Object::Counter(1)
    });
    world.fail_dc(0);
    let mut problems = Vec::new();
    if !seen_t1 {
        problems.push("t1 never became visible at d2".into());
    }
    let past = world.tx(d2, 2, &zero, &[read("t1", Kind::Counter)]).expect("a read").0;
    world.tx(d2, 2, &past, &[write("t2", Update::Add(1))]).expect("t2");
    let both = [read("t1", Kind::Counter), read("t2", Kind::Counter)];
    if !eventually(&mut world, d3, 3, &both, 10_000_000_000, |s| {
        s[0] == Object::Counter(1) && s[1] == Object::Counter(1)
    }) {
        problems.push("t1 and t2 never became visible at d3".into());
    }
    world.reach("script-forwarding");
    end(world, config, problems)
}

/// Scenario 8: Causal transactions at d, a barrier, d fails at once: everything the session
/// observed (another data center's transactions included) reaches every correct one.
/// With `f = 2`, under the negative control, the session's past can be lost.
fn barrier(config: &GeoRunConfig) -> GeoReport {
    let (mut world, _) = cluster(config, 2, 1);
    let zero = Vector::zero(5);
    let (d, e) = (node(&world, 0, 0), node(&world, 1, 0));
    // e's transaction reaches d quickly, and no other data center before both fail.
    for other in 2..5 {
        let far = node(&world, other, 0);
        world.world.net.cut_one_way(&[e], &[far]);
    }
    world.world.net.set_latency(e, d, 1_000_000);
    world.tx(e, 2, &zero, &[write("remote", Update::GAdd(key("r")))]).expect("e's write");
    let mut past = zero.clone();
    for i in 0..30 {
        let ops = [read("remote", Kind::GSet), write("local", Update::Add(1))];
        past = world.tx(d, 1, &past, &ops).expect("d's write").0;
        let next = world.now() + 1_000_000 + 200_000 * i;
        world.run_until(next);
    }
    let synced = world.call(d, 1, GeoOp::Barrier { past: past.clone() }, 10_000_000_000);
    world.synced(1, 0, &past, true);
    world.fail_dc(0);
    world.fail_dc(1);
    let mut problems = Vec::new();
    if synced != Some(GeoResult::Synced) {
        problems.push("the barrier did not return".into());
    }
    world.reach("script-barrier");
    end(world, config, problems)
}

/// Scenario 9: Planned migration: a barrier at d, an attach at i, reads at i include everything
/// the session saw at d; again with d failing right after the barrier.
fn migration(config: &GeoRunConfig) -> GeoReport {
    let (mut world, _) = cluster(config, 1, 2);
    let zero = Vector::zero(3);
    let mut problems = Vec::new();
    for (session, fail) in [(1u64, false), (2, true)] {
        let src = if fail { 1 } else { 0 };
        let mut past = zero.clone();
        for i in 0..5 {
            let k = format!("m{session}-{i}");
            past = world
                .tx(node(&world, src, i), session, &past, &[write(&k, Update::Set(key("x")))])
                .expect("a write")
                .0;
        }
        let synced = world.call(
            node(&world, src, 0),
            session,
            GeoOp::Barrier { past: past.clone() },
            10_000_000_000,
        );
        world.synced(session, src, &past, true);
        if fail {
            world.fail_dc(src);
        }
        let attached = world.call(
            node(&world, 2, 0),
            session,
            GeoOp::Attach { past: past.clone() },
            20_000_000_000,
        );
        world.synced(session, 2, &past, false);
        if synced != Some(GeoResult::Synced) || attached != Some(GeoResult::Synced) {
            problems.push(format!("session {session}: the barrier or the attach did not return"));
            continue;
        }
        let reads: Vec<_> =
            (0..5).map(|i| read(&format!("m{session}-{i}"), Kind::Register)).collect();
        let (_, seen) = world.tx(node(&world, 2, 1), session, &past, &reads).expect("reads");
        if seen.iter().any(|o| matches!(o, Object::Register(None))) {
            problems.push(format!("session {session} lost its writes in the move: {seen:?}"));
        }
    }
    end(world, config, problems)
}

/// Scenario 10: Unplanned migration: the session's data center fails before any barrier; at
/// another, its vector's transactions are not there, and its reads wait rather than
/// answer without them (the session must start over: `docs/geo.md`, *Migration*).
fn unplanned(config: &GeoRunConfig) -> GeoReport {
    let (mut world, _) = cluster(config, 1, 1);
    let zero = Vector::zero(3);
    let d = node(&world, 0, 0);
    for other in [1, 2] {
        world.world.net.cut_one_way(&[d], &world.nodes_of(other));
    }
    let past = world.tx(d, 1, &zero, &[write("lost", Update::Set(key("x")))]).expect("a write").0;
    world.fail_dc(0);
    let mut problems = Vec::new();
    let i = node(&world, 1, 0);
    if world.call(i, 1, GeoOp::Attach { past: past.clone() }, 3_000_000_000).is_some() {
        problems.push("an attach returned for a past no correct data center holds".into());
    }
    let Some(GeoResult::Began { tx, .. }) =
        world.call(i, 3, GeoOp::Begin { past: past.clone() }, 1_000_000_000)
    else {
        problems.push("the begin did not answer".into());
        return end(world, config, problems);
    };
    let read = GeoOp::Read { tx, key: key("lost"), kind: Kind::Register };
    if let Some(answer) = world.call(i, 3, read, 3_000_000_000) {
        problems.push(format!("a read answered without the session's past: {answer:?}"));
    }
    world.reach("script-unplanned");
    end(world, config, problems)
}

/// Scenario 16: Writes to one partition only: the others' heartbeats keep the stable and uniform
/// vectors moving, so remote visibility and barriers do not stall.
fn idle_partition(config: &GeoRunConfig) -> GeoReport {
    let (mut world, _) = cluster(config, 1, 3);
    let zero = Vector::zero(3);
    let mut past = zero.clone();
    for _ in 0..10 {
        past = world
            .tx(node(&world, 0, 0), 1, &past, &[write("hot", Update::Add(1))])
            .expect("a write")
            .0;
    }
    let mut problems = Vec::new();
    if world.call(node(&world, 0, 0), 1, GeoOp::Barrier { past: past.clone() }, 5_000_000_000)
        != Some(GeoResult::Synced)
    {
        problems.push("the barrier stalled".into());
    }
    world.synced(1, 0, &past, true);
    let far = node(&world, 2, 0);
    if !eventually(&mut world, far, 2, &[read("hot", Kind::Counter)], 5_000_000_000, |s| {
        s[0] == Object::Counter(10)
    }) {
        problems.push("remote visibility stalled".into());
    }
    end(world, config, problems)
}

/// Scenarios 17 and 18: wall clocks up to half a second apart and drifting up to 1% either
/// way, so that they grow apart over the run: commits wait for the slower partitions'
/// clocks (1:43), nothing is exposed early, and everything converges; only latency
/// suffers (a remote transaction becomes visible once the slowest clock of its data
/// center passes its timestamp, so drift without bound would delay visibility without
/// bound: clocks are assumed kept close, as NTP keeps them).
fn skew(config: &GeoRunConfig) -> GeoReport {
    let (mut world, mut rng) = cluster(config, 1, 3);
    for n in world.world.node_ids() {
        world.world.set_clock_drift(n, (rng.below(20_000) as i32) - 10_000);
    }
    let zero = Vector::zero(3);
    let mut problems = Vec::new();
    let mut pasts = [zero.clone(), zero.clone(), zero.clone()];
    for i in 0..60u64 {
        let dc = (i % 3) as u32;
        let s = i % 3;
        let ops = [
            read("a", Kind::Counter),
            write("a", Update::Add(1)),
            write("b", Update::Add(1)),
            read("b", Kind::Counter),
        ];
        match world.tx(node(&world, dc, i as usize), s, &pasts[s as usize], &ops) {
            Some((past, _)) => pasts[s as usize] = past,
            None => problems.push(format!("transaction {i} did not finish")),
        }
    }
    let reader = node(&world, 1, 2);
    if !eventually(&mut world, reader, 9, &[read("a", Kind::Counter)], 10_000_000_000, |s| {
        s[0] == Object::Counter(60)
    }) {
        problems.push("the counters never converged".into());
    }
    end(world, config, problems)
}

/// Scenario 21: f data centers fail, one with transactions in flight: every transaction of the
/// survivors becomes visible at every survivor.
fn f_failures(config: &GeoRunConfig) -> GeoReport {
    let (mut world, _) = cluster(config, 2, 1);
    let zero = Vector::zero(5);
    for dc in 0..5 {
        let k = format!("from{dc}");
        world
            .tx(node(&world, dc, 0), u64::from(dc), &zero, &[write(&k, Update::Add(1))])
            .expect("a write");
    }
    world.fail_dc(0);
    world.fail_dc(3);
    let mut problems = Vec::new();
    let reads: Vec<_> =
        [1, 2, 4].iter().map(|dc| read(&format!("from{dc}"), Kind::Counter)).collect();
    for dc in [1, 2, 4] {
        let reader = node(&world, dc, 0);
        if !eventually(&mut world, reader, 10 + u64::from(dc), &reads, 10_000_000_000, |s| {
            s.iter().all(|o| *o == Object::Counter(1))
        }) {
            problems.push(format!("data center {dc} misses a survivor's transaction"));
        }
    }
    end(world, config, problems)
}

/// Scenario 22: remote transactions kept for forwarding are forgotten once every data
/// center stores them; while a data center is down for good, they stay (`docs/geo.md`,
/// *Failures*).
fn collection(config: &GeoRunConfig) -> GeoReport {
    let (mut world, _) = cluster(config, 1, 2);
    let zero = Vector::zero(3);
    let kept = |world: &GeoWorld| -> usize {
        world
            .world
            .node_ids()
            .into_iter()
            .filter_map(|n| world.world.engine(n).map(|e| e.status().forwardable))
            .sum()
    };
    for i in 0..10 {
        let dc = i % 3;
        let k = format!("c{i}");
        world
            .tx(node(&world, dc, i as usize), 100 + i as u64, &zero, &[write(&k, Update::Add(1))])
            .expect("a write");
    }
    let quiet = world.now() + 2_000_000_000;
    world.run_until(quiet);
    let mut problems = Vec::new();
    if kept(&world) != 0 {
        problems.push(format!(
            "{} transactions kept though every data center stores them",
            kept(&world)
        ));
    }
    world.fail_dc(2);
    for i in 0..10 {
        let dc = i % 2;
        let k = format!("d{i}");
        world
            .tx(node(&world, dc, i as usize), 200 + i as u64, &zero, &[write(&k, Update::Add(1))])
            .expect("a write");
    }
    let quiet = world.now() + 2_000_000_000;
    world.run_until(quiet);
    if kept(&world) == 0 {
        problems.push("transactions forgotten that a data center never stored".into());
    }
    world.reach("script-collection");
    end(world, config, problems)
}

/// A strong transaction labelled `label` at `at` for `session` from `past`, its `ops` run
/// and recorded; `None` if a reply never came.
fn strong_ops(
    world: &mut GeoWorld,
    at: NodeId,
    session: u64,
    past: &Vector,
    label: Option<&str>,
    ops: &[(Key, Option<Update>, Kind)],
) -> Option<OpenTx> {
    let strong = Some(label.map(str::to_owned));
    world.open_tx(at, session, past, strong, ops).map(|(open, _)| open)
}

/// Sends the commits of `open` (each at its node, for its session) at once, runs until
/// each is answered or `within_ns` passes, and closes their records: committed, aborted
/// (a conflict) or unknown. Each one's commit vector, if it committed.
fn commit_all(world: &mut GeoWorld, open: Vec<OpenTx>, within_ns: u64) -> Vec<Option<Vector>> {
    let tags: Vec<_> = open
        .iter()
        .map(|o| world.submit(o.node, o.record.session, GeoOp::Commit { tx: o.id }))
        .collect();
    let until = world.now() + within_ns;
    while tags.iter().any(|t| !world.replies.contains_key(t)) && world.step_until(until) {}
    open.into_iter()
        .zip(tags)
        .map(|(mut o, tag)| {
            o.committing = true;
            match world.replies.remove(&tag).map(|(_, r)| r.result) {
                Some(Ok(GeoResult::Committed { vector })) => {
                    let flat = super::sim::history_vector(&vector);
                    world.close(o, Outcome::Committed { vector: flat });
                    Some(vector)
                }
                Some(Err(keel_types::KeelError::Conflict(_))) => {
                    world.close(o, Outcome::Aborted);
                    None
                }
                _ => {
                    world.close(o, Outcome::Unknown);
                    None
                }
            }
        })
        .collect()
}

/// Strong transactions on, withdrawals conflicting with each other.
fn strong_cluster(config: &GeoRunConfig, partitions: u32, propagate_ms: u64) -> (GeoWorld, Rng) {
    strong_cluster_f(config, 1, partitions, propagate_ms)
}

/// [`strong_cluster`] of `2f + 1` data centers.
fn strong_cluster_f(
    config: &GeoRunConfig,
    f: u32,
    partitions: u32,
    propagate_ms: u64,
) -> (GeoWorld, Rng) {
    cluster_with(config, f, partitions, |shape| {
        shape.strong = true;
        shape.skip_strong_barrier = config.skip_strong_barrier;
        shape.certify_all = config.certify_all;
        shape.skip_recovery = config.skip_recovery;
        shape.propagate_ms = propagate_ms;
    })
}

/// Runs strong transaction `ops` at `at` (on the empty past), again after each abort,
/// until it commits or `within_ns` passes: its commit vector, and how many runs it took.
fn strong_until_committed(
    world: &mut GeoWorld,
    at: NodeId,
    session: u64,
    label: Option<&str>,
    ops: &[(Key, Option<Update>, Kind)],
    within_ns: u64,
) -> Option<(Vector, u32)> {
    let zero = Vector::zero(world.shape.dcs() as usize);
    let until = world.now() + within_ns;
    let mut runs = 0;
    while world.now() < until {
        runs += 1;
        if let Some(open) = strong_ops(world, at, session, &zero, label, ops) {
            let left = until.saturating_sub(world.now()).max(1);
            if let Some(vector) = commit_all(world, vec![open], left).remove(0) {
                return Some((vector, runs));
            }
        }
        let next = world.now() + 50_000_000;
        world.run_until(next);
    }
    None
}

/// Scenario 4: the overdraft. A balance of 100, made uniform; a withdrawal of the whole
/// balance at each data center, strong and conflicting, all committed at once while the
/// leaders' data center fails: at most one commits, and the balance never goes below
/// zero. The same withdrawals as causal transactions both commit (the label matters).
fn overdraft(config: &GeoRunConfig) -> GeoReport {
    let (mut world, _) = strong_cluster(config, 2, 0);
    let zero = Vector::zero(3);
    let mut problems = Vec::new();
    let deposit = [write("alice", Update::Add(100))];
    let (past, _) = world.tx(node(&world, 0, 0), 1, &zero, &deposit).expect("the deposit");
    world.call(node(&world, 0, 0), 1, GeoOp::Barrier { past: past.clone() }, 10_000_000_000);
    world.synced(1, 0, &past, true);
    let balance = [read("alice", Kind::Counter)];
    for dc in 0..3 {
        let at = node(&world, dc, 1);
        let seen = |s: &[Object]| s[0] == Object::Counter(100);
        if !eventually(&mut world, at, 10 + u64::from(dc), &balance, 5_000_000_000, seen) {
            problems.push(format!("data center {dc} never showed the deposit"));
        }
    }
    let withdraw = [read("alice", Kind::Counter), write("alice", Update::Add(-100))];
    let open: Vec<OpenTx> = (0..3u32)
        .filter_map(|dc| {
            let at = node(&world, dc, 0);
            strong_ops(&mut world, at, 20 + u64::from(dc), &zero, Some(WITHDRAW), &withdraw)
        })
        .collect();
    let tags: Vec<_> = open.iter().map(|o| o.id).collect();
    world.fail_dc(0);
    let committed = commit_all(&mut world, open, 30_000_000_000);
    let n = committed.iter().filter(|c| c.is_some()).count();
    if n > 1 {
        problems.push(format!("{n} of {} withdrawals of the whole balance committed", tags.len()));
    }
    let settled = |s: &[Object]| matches!(s[0], Object::Counter(b) if b >= 0);
    let at = node(&world, 1, 1);
    if !eventually(&mut world, at, 30, &balance, 1_000_000_000, settled) {
        problems.push("the balance went below zero".into());
    }
    // As causal transactions, two withdrawals at two data centers both commit.
    let causal: Vec<bool> = (1..3u32)
        .map(|dc| world.tx(node(&world, dc, 0), 40 + u64::from(dc), &zero, &withdraw).is_some())
        .collect();
    if causal != [true, true] {
        problems.push(format!("causal withdrawals did not both commit: {causal:?}"));
    }
    world.reach("script-overdraft");
    end(world, config, problems)
}

/// Scenario 7 (Figure 2): t1 causal, then t2 strong on t1's key, at data center 1, which
/// fails as soon as the leader voted on t2. t2 could commit only once t1 was uniform;
/// a later strong t3 at data center 2 that conflicts with t2 commits after retries.
/// With the barrier skipped (`--skip-strong-barrier`), t2 commits on a t1 that dies with
/// data center 1, and t3 aborts for ever. One partition per data center (t2 runs on its
/// coordinator's own partition, at once) and replication batched over 500 ms, so t1 has
/// seldom left data center 1 when it fails.
fn liveness_trap(config: &GeoRunConfig) -> GeoReport {
    let (mut world, _) = strong_cluster(config, 1, 500);
    let zero = Vector::zero(3);
    let mut problems = Vec::new();
    let d1 = node(&world, 1, 0);
    // Links up and vectors exchanged first.
    world.run_until(1_000_000_000);
    let (past, _) = world.tx(d1, 1, &zero, &[write("x", Update::Add(1))]).expect("t1");
    let t2_ops = [read("x", Kind::Counter), write("y", Update::Add(1))];
    let t2 = strong_ops(&mut world, d1, 1, &past, None, &t2_ops).expect("t2 runs");
    // Data center 1 fails once the leader voted on t2: in flight, t2's certification
    // reached the leaders' data center.
    let leader = node(&world, 0, 0);
    let votes = |w: &GeoWorld| w.world.engine(leader).expect("up").status().counters.votes;
    let before = votes(&world);
    world.submit(t2.node, 1, GeoOp::Commit { tx: t2.id });
    let until = world.now() + 5_000_000_000;
    while votes(&world) == before && world.step_until(until) {}
    world.close(OpenTx { committing: true, ..t2 }, Outcome::Unknown);
    world.fail_dc(1);
    let d3 = node(&world, 2, 0);
    let t3_ops = [read("y", Kind::Counter), write("y", Update::Add(10))];
    let mut committed = false;
    for attempt in 0..50u64 {
        let Some(t3) = strong_ops(&mut world, d3, 2, &zero, None, &t3_ops) else { continue };
        if commit_all(&mut world, vec![t3], 10_000_000_000)[0].is_some() {
            committed = true;
            break;
        }
        let next = world.now() + 100_000_000 * (1 + attempt.min(5));
        world.run_until(next);
    }
    if !committed {
        problems.push("t3 aborted on every retry for 10 s and more".into());
    }
    world.reach("script-liveness-trap");
    end(world, config, problems)
}

/// Scenario 14: strong transactions that do not conflict under the relation do not abort
/// each other: deposits (which conflict with nothing) of one balance at every data
/// center at once, and unlabelled strong transactions on distinct keys, all commit.
fn no_false_conflicts(config: &GeoRunConfig) -> GeoReport {
    let (mut world, _) = strong_cluster(config, 2, 0);
    let zero = Vector::zero(3);
    let mut problems = Vec::new();
    world.run_until(1_000_000_000);
    let deposit = [read("bob", Kind::Counter), write("bob", Update::Add(10))];
    let open: Vec<OpenTx> = (0..3u32)
        .filter_map(|dc| {
            let at = node(&world, dc, 0);
            strong_ops(&mut world, at, 1 + u64::from(dc), &zero, Some("deposit"), &deposit)
        })
        .collect();
    let n = commit_all(&mut world, open, 10_000_000_000).iter().filter(|c| c.is_some()).count();
    if n != 3 {
        problems.push(format!("{n} of 3 concurrent strong deposits committed"));
    }
    let open: Vec<OpenTx> = (0..3u32)
        .filter_map(|dc| {
            let k = format!("item{dc}");
            let ops = [read(&k, Kind::Counter), write(&k, Update::Add(1))];
            let at = node(&world, dc, 1);
            strong_ops(&mut world, at, 10 + u64::from(dc), &zero, None, &ops)
        })
        .collect();
    let n = commit_all(&mut world, open, 10_000_000_000).iter().filter(|c| c.is_some()).count();
    if n != 3 {
        problems
            .push(format!("{n} of 3 unlabelled strong transactions on distinct keys committed"));
    }
    let at = node(&world, 2, 0);
    let seen = |s: &[Object]| s[0] == Object::Counter(30);
    if !eventually(&mut world, at, 20, &[read("bob", Kind::Counter)], 5_000_000_000, seen) {
        problems.push("the three deposits are not all visible".into());
    }
    world.reach("script-no-false-conflicts");
    end(world, config, problems)
}

/// Scenario 19: a data center cut off keeps committing causal transactions; its strong
/// transactions (which need the leaders) wait or time out; once the links are back,
/// its strong transactions commit again and every replica converges.
fn isolated_dc(config: &GeoRunConfig) -> GeoReport {
    let (mut world, _) = strong_cluster(config, 1, 0);
    let zero = Vector::zero(3);
    let mut problems = Vec::new();
    world.run_until(1_000_000_000);
    world.isolate_dc(2);
    let at = node(&world, 2, 0);
    let mut past = zero.clone();
    for i in 0..5u64 {
        let ops = [write("local", Update::Add(1))];
        match world.tx(at, 1, &past, &ops) {
            Some((commit, _)) => past = commit,
            None => {
                problems.push(format!("causal transaction {i} at the cut-off data center failed"))
            }
        }
    }
    let strong = [read("acct", Kind::Counter), write("acct", Update::Add(1))];
    if let Some(open) = strong_ops(&mut world, at, 2, &zero, Some(WITHDRAW), &strong) {
        if commit_all(&mut world, vec![open], 1_000_000_000)[0].is_some() {
            problems.push("a strong transaction committed without reaching the leaders".into());
        }
    }
    world.heal();
    match strong_until_committed(&mut world, at, 3, Some(WITHDRAW), &strong, 20_000_000_000) {
        Some(_) => {}
        None => problems.push("no strong transaction committed after the links came back".into()),
    }
    let seen = |s: &[Object]| s[0] == Object::Counter(5);
    let reader = node(&world, 0, 0);
    if !eventually(&mut world, reader, 4, &[read("local", Kind::Counter)], 10_000_000_000, seen) {
        problems.push("the cut-off data center's causal transactions never arrived".into());
    }
    world.reach("script-isolated-dc");
    end(world, config, problems)
}

/// Scenario 20: the leaders' data center (0) fails while a strong transaction of data
/// center 1 that touches both partitions is in certification. The siblings elect new
/// leaders; conflicting strong withdrawals at data centers 1 and 2 then commit one after
/// another, and every committed transaction (the one in flight, if it committed) becomes
/// visible at both survivors.
fn leader_failover(config: &GeoRunConfig) -> GeoReport {
    let (mut world, _) = strong_cluster(config, 2, 0);
    let zero = Vector::zero(3);
    let mut problems = Vec::new();
    let (past, _) = world
        .tx(node(&world, 1, 0), 1, &zero, &[write("acct", Update::Add(100))])
        .expect("the deposit");
    world.call(node(&world, 1, 0), 1, GeoOp::Barrier { past }, 10_000_000_000);
    // In flight: certification at both partitions' leaders when they fail.
    let both = [
        read("acct", Kind::Counter),
        write("acct", Update::Add(-10)),
        write("bob", Update::Add(10)),
    ];
    let at = node(&world, 1, 0);
    if let Some(open) = strong_ops(&mut world, at, 2, &zero, Some(WITHDRAW), &both) {
        let tag = world.submit(open.node, open.record.session, GeoOp::Commit { tx: open.id });
        let next = world.now() + 1_000_000 + world.shape.wan_ns[&(0, 1)] / 2;
        world.run_until(next);
        world.fail_dc(0);
        let until = world.now() + 30_000_000_000;
        while !world.replies.contains_key(&tag) && world.step_until(until) {}
        let outcome = match world.replies.remove(&tag).map(|(_, r)| r.result) {
            Some(Ok(GeoResult::Committed { vector })) => {
                Outcome::Committed { vector: super::sim::history_vector(&vector) }
            }
            Some(Err(keel_types::KeelError::Conflict(_))) => Outcome::Aborted,
            Some(_) => Outcome::Unknown,
            None => {
                problems.push("the strong transaction in flight got no answer in 30 s".into());
                Outcome::Unknown
            }
        };
        world.close(OpenTx { committing: true, ..open }, outcome);
    }
    let withdraw = [read("acct", Kind::Counter), write("acct", Update::Add(-30))];
    for round in 0..3u64 {
        for dc in [1u32, 2] {
            let at = node(&world, dc, 0);
            let session = 10 + round * 2 + u64::from(dc);
            if strong_until_committed(
                &mut world,
                at,
                session,
                Some(WITHDRAW),
                &withdraw,
                20_000_000_000,
            )
            .is_none()
            {
                problems.push(format!(
                    "round {round}: no strong withdrawal at data center {dc} committed"
                ));
            }
        }
    }
    // 100, less the six withdrawals of 30, less 10 if the one in flight committed.
    let settled = |s: &[Object]| matches!(s[0], Object::Counter(-80 | -90));
    let reader = node(&world, 2, 0);
    if !eventually(&mut world, reader, 30, &[read("acct", Kind::Counter)], 10_000_000_000, settled)
    {
        problems.push("the six withdrawals after the failover are not all visible".into());
    }
    world.reach("script-leader-failover");
    end(world, config, problems)
}

/// Scenario 21 with strong transactions: five data centers (f = 2); the leaders' one and
/// the origin of a strong transaction in flight fail together. Strong transactions of the
/// survivors commit after the failover, and every transaction of the survivors, and the
/// one in flight if it committed, becomes visible at every survivor.
fn strong_f_failures(config: &GeoRunConfig) -> GeoReport {
    let (mut world, _) = strong_cluster_f(config, 2, 1, 0);
    let zero = Vector::zero(5);
    let mut problems = Vec::new();
    world.run_until(1_000_000_000);
    for dc in 0..5 {
        let k = format!("from{dc}");
        world
            .tx(node(&world, dc, 0), u64::from(dc), &zero, &[write(&k, Update::Add(1))])
            .expect("a write");
    }
    let ops = [read("acct", Kind::Counter), write("acct", Update::Add(1))];
    let origin = node(&world, 3, 0);
    if let Some(open) = strong_ops(&mut world, origin, 10, &zero, None, &ops) {
        world.submit(open.node, open.record.session, GeoOp::Commit { tx: open.id });
        let next = world.now() + 2_000_000 + world.shape.wan_ns[&(0, 3)] / 2;
        world.run_until(next);
        world.close(OpenTx { committing: true, ..open }, Outcome::Unknown);
    }
    world.fail_dc(0);
    world.fail_dc(3);
    for dc in [1u32, 2, 4] {
        let at = node(&world, dc, 0);
        let session = 20 + u64::from(dc);
        if strong_until_committed(&mut world, at, session, None, &ops, 20_000_000_000).is_none() {
            problems.push(format!("no strong transaction at data center {dc} committed"));
        }
    }
    let reads: Vec<_> =
        [1, 2, 4].iter().map(|dc| read(&format!("from{dc}"), Kind::Counter)).collect();
    for dc in [1, 2, 4] {
        let reader = node(&world, dc, 0);
        if !eventually(&mut world, reader, 30 + u64::from(dc), &reads, 10_000_000_000, |s| {
            s.iter().all(|o| *o == Object::Counter(1))
        }) {
            problems.push(format!("data center {dc} misses a survivor's transaction"));
        }
    }
    world.reach("script-strong-f-failures");
    end(world, config, problems)
}

/// Scenario 15: every transaction strong and unlabelled (the paper's STRONG: all
/// conflict), concurrent at the three data centers over two keys on two partitions,
/// reading then updating both, the leaders' data center failing halfway. The history is
/// then checked for serializability in strong-timestamp order (`not-serializable`), and
/// at least one transaction per round commits.
fn all_strong(config: &GeoRunConfig) -> GeoReport {
    let (mut world, _) = strong_cluster(config, 2, 0);
    let zero = Vector::zero(3);
    let mut problems = Vec::new();
    world.run_until(1_000_000_000);
    let mut committed = 0;
    for round in 0..12u64 {
        if round == 6 {
            world.fail_dc(0);
        }
        let up: Vec<u32> = (0..3u32).filter(|dc| !world.failed.contains(dc)).collect();
        let open: Vec<OpenTx> = up
            .into_iter()
            .filter_map(|dc| {
                let value = format!("r{round}d{dc}");
                let ops = [
                    read("a", Kind::Counter),
                    read("b", Kind::Register),
                    write("a", Update::Add(1)),
                    write("b", Update::Set(key(&value))),
                ];
                let at = node(&world, dc, 0);
                strong_ops(&mut world, at, round * 10 + u64::from(dc), &zero, None, &ops)
            })
            .collect();
        let n = commit_all(&mut world, open, 30_000_000_000).iter().filter(|c| c.is_some()).count();
        if n == 0 && round != 6 {
            // Round 6 may lose every transaction to the failure.
            let until = world.now() + 500_000_000;
            world.run_until(until);
        }
        committed += n;
    }
    if committed < 6 {
        problems
            .push(format!("only {committed} of the strong transactions committed in 12 rounds"));
    }
    world.reach("script-all-strong");
    end(world, config, problems)
}
