//! The paper's litmus tests (digest §5.2: L1 to L11; L12 runs with the faults, where a
//! node really is on the slow path) and fault scenarios (§5.3: F1 and F5 to F12, and F13 found in review; F2 to
//! F4 are what the `general` scenario's sleeps, crashes and partitions do), scripted on
//! sessions on different nodes. Every run's history also goes through the release
//! consistency checker.

use super::recorder::{key, value, Recorder};
use super::scenario::{panic_message, reached, template, KiteReport, KiteRunConfig};
use super::script::{done, read, run, Program, Results, Step};
use super::world::{Fate, KiteWorld, NetConfig};
use crate::rng::Rng;
use keel_core::kite::{Bit, KiteOp, Message};
use keel_core::time::Span;
use keel_types::NodeId;
use std::cell::Cell;
use std::rc::Rc;

const MS: u64 = 1_000_000;

/// A litmus test's forbidden-outcome check: a description of what it saw, if forbidden.
type Check = Box<dyn Fn(&Results, &KiteWorld) -> Option<String>>;

fn w(k: u64, v: u64) -> Step {
    Step::Op(KiteOp::Write { key: key(k), value: value(v) })
}
fn rel(k: u64, v: u64) -> Step {
    Step::Op(KiteOp::Release { key: key(k), value: value(v) })
}
fn r(k: u64) -> Step {
    Step::Op(KiteOp::Read { key: key(k) })
}
fn acq(k: u64) -> Step {
    Step::Op(KiteOp::Acquire { key: key(k) })
}
fn faa(k: u64, delta: i64) -> Step {
    Step::Op(KiteOp::Faa { key: key(k), delta })
}
fn await_acq(k: u64, v: u64) -> Step {
    Step::AwaitAcquire { key: k, value: v }
}

/// Runs `f` catching panics into the report.
fn guarded(config: &KiteRunConfig, f: impl FnOnce(&mut KiteReport)) -> KiteReport {
    let mut report = KiteReport {
        seed: config.seed,
        scenario: config.scenario.clone(),
        replay: config.replay(),
        ..KiteReport::default()
    };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut inner = report.clone();
        f(&mut inner);
        inner
    }));
    match result {
        Ok(inner) => inner,
        Err(panic) => {
            report.panic = Some(panic_message(&panic));
            report
        }
    }
}

/// Checks a history and adds what the run reached.
fn finish(report: &mut KiteReport, world: &KiteWorld, recorder: &mut Recorder, label: &str) {
    recorder.settle_rmws(world.watch().commits(), world.watch().rmw_ids());
    let history = recorder.history();
    let verdict = keel_check::rc::check(&history);
    report.ops += recorder.started();
    report.ok += recorder.completed();
    report.sync_ops += verdict.sync_ops;
    for v in &verdict.violations {
        report.violations.push(format!("{label}: rc {}: {} (ops {:?})", v.rule, v.message, v.ops));
    }
    // The world's checks: the contract's, the codec's, the gate's, the links', and the
    // watch's (every request committed at one stamp).
    for violation in world.violations() {
        report.violations.push(format!("{label}: {violation}"));
    }
    reached(world, report);
    report.virtual_ms += world.now() / MS;
}

/// `--scenario litmus`: L1 to L11, each on its own keys, all at once, on a cluster of 3
/// or 5 nodes with random delays, loss, stalls and release time-outs (from about 0 up),
/// and sometimes one node asleep for a while.
pub fn run_litmus(config: &KiteRunConfig) -> KiteReport {
    guarded(config, |report| litmus(config, report))
}

fn litmus(config: &KiteRunConfig, report: &mut KiteReport) {
    let mut rng = Rng::new(config.seed ^ 0x6c69_746d_7573);
    let n: u32 = if rng.below(2) == 0 { 3 } else { 5 };
    report.nodes = n;
    let timeout = [Span(1), Span::from_micros(300), Span::from_millis(2), Span::from_millis(10)]
        [rng.below(4) as usize];
    let net = NetConfig {
        delay_min: 50_000,
        delay_max: [300_000, 2_000_000][rng.below(2) as usize],
        drop_ppm: [0, 5_000, 30_000][rng.below(3) as usize],
        stall_ppm: if rng.below(3) == 0 { 3_000 } else { 0 },
        stall_max: 100 * MS,
        dup_ppm: [0, 2_000, 20_000][rng.below(3) as usize],
        link_bulk_bytes_max: keel_exec::LINK_BULK_BYTES_MAX,
        unsafe_unbounded_links: false,
        reads_off_loop_ppm: 0,
    };
    let mut world = KiteWorld::new(n, &template(config, timeout), rng.next_u64(), net, true);
    world.settle_boot();
    let mut tests = Litmus::new(world.members(), rng);
    if tests.rng.below(3) == 0 {
        let node = tests.pick(&[]);
        let at = tests.rng.below(20 * MS);
        let len = tests.rng.range(10, 200) * MS;
        report.faults.push(format!("node {} asleep {}ms from {}ms", node.0, len / MS, at / MS));
        world.pause_later(node, at, at + len);
    }
    tests.l1_message_passing();
    tests.l2_many_fields();
    tests.l3_transitive_chain();
    tests.l4_release_orders_reads();
    tests.l5_store_buffering();
    tests.l6_iriw();
    tests.l7_real_time();
    tests.l8_coherence();
    tests.l9_faa_and_cas();
    tests.l10_rmw_flags();
    tests.l11_mixed_key();
    let Litmus { programs, checks, .. } = tests;

    let mut recorder = Recorder::new();
    let (results, finished) = run(&mut world, &mut recorder, programs, 20_000 * MS);
    if !finished {
        report
            .violations
            .push("litmus: the programs did not finish in 20 s of virtual time".into());
    }
    for check in &checks {
        if let Some(v) = check(&results, &world) {
            report.violations.push(v);
        }
    }
    // Quiet: the network reliable, every write delivered; replicas agree (L8, L11).
    world.heal();
    world.calm_network();
    world.run_until(world.now() + 3_000 * MS);
    for k in [800u64, 1100] {
        let copies: Vec<_> =
            world.live().iter().map(|&n| world.engine(n).expect("live").local(&key(k))).collect();
        if copies.windows(2).any(|p| p[0] != p[1]) {
            report
                .violations
                .push(format!("L8/L11: replicas disagree on k{k} once quiet: {copies:?}"));
        }
    }
    finish(report, &world, &mut recorder, "litmus");
    if config.keep_history {
        report.history = Some(recorder.history());
    }
}

/// The litmus tests as they are laid out: their programs, each on its own keys
/// (L`n` on keys `100n` and up), and their forbidden-outcome checks.
struct Litmus {
    members: Vec<NodeId>,
    rng: Rng,
    programs: Vec<Program>,
    checks: Vec<Check>,
    next_session: u64,
    next_value: u64,
}

impl Litmus {
    fn new(members: Vec<NodeId>, rng: Rng) -> Litmus {
        let (programs, checks) = (Vec::new(), Vec::new());
        Litmus { members, rng, programs, checks, next_session: 1, next_value: 1 << 40 }
    }

    /// A random node, not one of `avoid` unless every node is.
    fn pick(&mut self, avoid: &[NodeId]) -> NodeId {
        loop {
            let node = self.members[self.rng.below(self.members.len() as u64) as usize];
            if !avoid.contains(&node) || avoid.len() >= self.members.len() {
                return node;
            }
        }
    }

    /// A value no other write writes.
    fn fresh(&mut self) -> u64 {
        self.next_value += 1;
        self.next_value
    }

    /// A program of a new session at `node`; its index.
    fn add(&mut self, node: NodeId, steps: Vec<Step>) -> usize {
        self.programs.push(Program { node, session: self.next_session, steps });
        self.next_session += 1;
        self.programs.len() - 1
    }

    /// L1: message passing.
    fn l1_message_passing(&mut self) {
        let (x, f) = (100, 101);
        let (vx, vf) = (self.fresh(), self.fresh());
        let a = self.pick(&[]);
        let b = self.pick(&[a]);
        self.add(a, vec![w(x, vx), rel(f, vf)]);
        let p = self.add(b, vec![await_acq(f, vf), r(x)]);
        self.checks.push(Box::new(move |res, _| {
            (done(res, p, 1) && read(res, p, 1) != Some(vx)).then(|| {
                format!("L1: acquired the flag, then read x={:?}, not {vx}", read(res, p, 1))
            })
        }));
    }

    /// L2: message passing with many fields.
    fn l2_many_fields(&mut self) {
        let f = 240;
        let fields: Vec<(u64, u64)> = (200..220).map(|k| (k, self.fresh())).collect();
        let vf = self.fresh();
        let a = self.pick(&[]);
        let b = self.pick(&[a]);
        let mut writer: Vec<Step> = fields.iter().map(|&(k, v)| w(k, v)).collect();
        writer.push(rel(f, vf));
        self.add(a, writer);
        let mut reader = vec![await_acq(f, vf)];
        reader.extend(fields.iter().map(|&(k, _)| r(k)));
        let p = self.add(b, reader);
        self.checks.push(Box::new(move |res, _| {
            fields
                .iter()
                .enumerate()
                .find(|(i, (_, v))| done(res, p, i + 1) && read(res, p, i + 1) != Some(*v))
                .map(|(i, (k, v))| {
                    format!("L2: field k{k} read {:?} after the flag, not {v}", read(res, p, i + 1))
                })
        }));
    }

    /// L3: a transitive chain over three nodes.
    fn l3_transitive_chain(&mut self) {
        let (x, f1, f2) = (300, 301, 302);
        let (vx, v1, v2) = (self.fresh(), self.fresh(), self.fresh());
        let a = self.pick(&[]);
        let b = self.pick(&[a]);
        let c = self.pick(&[a, b]);
        self.add(a, vec![w(x, vx), rel(f1, v1)]);
        self.add(b, vec![await_acq(f1, v1), rel(f2, v2)]);
        let p = self.add(c, vec![await_acq(f2, v2), r(x)]);
        self.checks.push(Box::new(move |res, _| {
            (done(res, p, 1) && read(res, p, 1) != Some(vx))
                .then(|| format!("L3: end of the chain read x={:?}, not {vx}", read(res, p, 1)))
        }));
    }

    /// L4: a release orders earlier reads, an acquire later writes.
    fn l4_release_orders_reads(&mut self) {
        let (x, f) = (400, 401);
        let (vx, vf) = (self.fresh(), self.fresh());
        let a = self.pick(&[]);
        let b = self.pick(&[a]);
        let p = self.add(a, vec![r(x), rel(f, vf)]);
        self.add(b, vec![await_acq(f, vf), w(x, vx)]);
        self.checks.push(Box::new(move |res, _| {
            (read(res, p, 0) == Some(vx))
                .then(|| "L4: a read before the release saw a write after the acquire".to_string())
        }));
    }

    /// L5: store buffering on synchronization.
    fn l5_store_buffering(&mut self) {
        let (x, y) = (500, 501);
        let (vx, vy) = (self.fresh(), self.fresh());
        let a = self.pick(&[]);
        let b = self.pick(&[a]);
        let p = self.add(a, vec![rel(x, vx), acq(y)]);
        let q = self.add(b, vec![rel(y, vy), acq(x)]);
        self.checks.push(Box::new(move |res, _| {
            (done(res, p, 1)
                && done(res, q, 1)
                && read(res, p, 1).is_none()
                && read(res, q, 1).is_none())
            .then(|| "L5: both acquires read the initial value".to_string())
        }));
    }

    /// L6: IRIW on releases and acquires.
    fn l6_iriw(&mut self) {
        let (x, y) = (600, 601);
        let (vx, vy) = (self.fresh(), self.fresh());
        let nodes: Vec<NodeId> = (0..4).map(|_| self.pick(&[])).collect();
        self.add(nodes[0], vec![rel(x, vx)]);
        self.add(nodes[1], vec![rel(y, vy)]);
        let p = self.add(nodes[2], vec![acq(x), acq(y)]);
        let q = self.add(nodes[3], vec![acq(y), acq(x)]);
        self.checks.push(Box::new(move |res, _| {
            let all = done(res, p, 1) && done(res, q, 1);
            let p_saw = read(res, p, 0) == Some(vx) && read(res, p, 1).is_none();
            let q_saw = read(res, q, 0) == Some(vy) && read(res, q, 1).is_none();
            (all && p_saw && q_saw)
                .then(|| "L6: the two readers disagree on the order of the releases".to_string())
        }));
    }

    /// L7: real time between releases and acquires.
    fn l7_real_time(&mut self) {
        let x = 700;
        let vx = self.fresh();
        let a = self.pick(&[]);
        let b = self.pick(&[a]);
        let writer = self.add(a, vec![rel(x, vx)]);
        let p = self.add(b, vec![Step::After { program: writer, step: 0 }, acq(x)]);
        self.checks.push(Box::new(move |res, _| {
            (done(res, p, 1) && read(res, p, 1) != Some(vx)).then(|| {
                format!("L7: an acquire after the release completed read {:?}", read(res, p, 1))
            })
        }));
    }

    /// L8: per-key coherence, and convergence once quiet (checked after the run).
    fn l8_coherence(&mut self) {
        let x = 800;
        let values: Vec<u64> = (0..4).map(|_| self.fresh()).collect();
        let a = self.pick(&[]);
        let b = self.pick(&[a]);
        self.add(a, values.iter().map(|&v| w(x, v)).collect());
        self.add(b, (0..6).map(|_| r(x)).collect());
    }

    /// L9: FAA totals, and one winner among CASes from absent.
    fn l9_faa_and_cas(&mut self) {
        let (c, lock) = (900, 901);
        let per = 4;
        let mut faas = Vec::new();
        let mut cases = Vec::new();
        for node in self.members.clone() {
            faas.push(self.add(node, (0..per).map(|_| faa(c, 1)).collect()));
            let v = self.fresh();
            let cas = KiteOp::Cas { key: key(lock), expected: None, new: value(v), strong: true };
            cases.push(self.add(node, vec![Step::Op(cas)]));
        }
        let total = per * self.members.len() as u64;
        let check_node = self.members[0];
        let reader = self.add(check_node, {
            let mut steps: Vec<Step> =
                faas.iter().map(|&p| Step::After { program: p, step: per as usize - 1 }).collect();
            steps.push(acq(c));
            steps
        });
        self.checks.push(Box::new(move |res, _| {
            let final_step = faas.len();
            if done(res, reader, final_step) && read(res, reader, final_step) != Some(total) {
                return Some(format!(
                    "L9: {total} FAAs, counter reads {:?}",
                    read(res, reader, final_step)
                ));
            }
            let winners = cases
                .iter()
                .filter(|&&p| res[p][0].as_ref().is_some_and(|s| s.wrote.is_some()))
                .count();
            let all = cases.iter().all(|&p| done(res, p, 0));
            (all && winners != 1).then(|| format!("L9: {winners} CASes from absent succeeded"))
        }));
    }

    /// L10: message passing with RMWs as the release and the acquire.
    fn l10_rmw_flags(&mut self) {
        let (x, f) = (1000, 1001);
        let vx = self.fresh();
        let a = self.pick(&[]);
        let b = self.pick(&[a]);
        self.add(a, vec![w(x, vx), faa(f, 1)]);
        let p = self.add(b, vec![Step::AwaitFaa { key: f, at_least: 1 }, r(x)]);
        self.checks.push(Box::new(move |res, _| {
            (done(res, p, 1) && read(res, p, 1) != Some(vx))
                .then(|| format!("L10: after the FAA flag, x={:?}, not {vx}", read(res, p, 1)))
        }));
    }

    /// L11: RMWs, relaxed writes and releases on one key (replicas agree; checked after).
    fn l11_mixed_key(&mut self) {
        let k = 1100;
        let a = self.pick(&[]);
        let b = self.pick(&[a]);
        let c = self.pick(&[a, b]);
        self.add(a, vec![faa(k, 1), faa(k, 1), faa(k, 1)]);
        let (v1, v2, v3) = (self.fresh(), self.fresh(), self.fresh());
        self.add(b, vec![w(k, v1), rel(k, v2), w(k, v3)]);
        self.add(c, vec![faa(k, 1), faa(k, 1)]);
    }
}

/// `--scenario faults`: F1 (with L12), F5 to F13 (F13 from review, not in the paper), and
/// F14 (a restart: Keel's nodes restart, the paper's crash-stop), each on a fresh cluster.
pub fn run_faults(config: &KiteRunConfig) -> KiteReport {
    guarded(config, |report| {
        let mut rng = Rng::new(config.seed ^ 0x6661_756c_7473);
        type Scenario = fn(&KiteRunConfig, &mut Rng, &mut KiteReport);
        let scenarios: [(&str, Scenario); 11] = [
            ("F1", f1),
            ("F5", f5),
            ("F6", f6),
            ("F7", f7),
            ("F8", f8),
            ("F9", f9),
            ("F10", f10),
            ("F11", f11),
            ("F12", f12),
            ("F13", f13),
            ("F14", f14),
        ];
        for (name, scenario) in scenarios {
            *report.reached.entry(format!("scenario:{name}")).or_default() += 1;
            scenario(config, &mut rng, report);
        }
    })
}

fn cluster(config: &KiteRunConfig, rng: &mut Rng, n: u32, timeout: Span) -> KiteWorld {
    let net = NetConfig {
        delay_min: 50_000,
        delay_max: rng.range(100_000, 1_000_000),
        drop_ppm: 0,
        stall_ppm: 0,
        stall_max: 0,
        dup_ppm: 0,
        link_bulk_bytes_max: keel_exec::LINK_BULK_BYTES_MAX,
        unsafe_unbounded_links: false,
        reads_off_loop_ppm: 0,
    };
    let mut world = KiteWorld::new(n, &template(config, timeout), rng.next_u64(), net, true);
    world.settle_boot();
    world
}

fn is_write_to(message: &Message, k: u64) -> bool {
    matches!(message, Message::Write { key: kk, rmw: None, query: None, .. } if *kk == key(k))
}

/// Drops `from`'s relaxed writes of key `k` to `to` (and their resends).
fn drop_writes(from: NodeId, to: NodeId, k: u64) -> impl FnMut(NodeId, NodeId, &Message) -> Fate {
    move |f, t, m| if f == from && t == to && is_write_to(m, k) { Fate::Drop } else { Fate::Pass }
}

fn expect(report: &mut KiteReport, name: &str, ok: bool, what: String) {
    if !ok {
        report.violations.push(format!("{name}: {what}"));
    }
}

fn counters(world: &KiteWorld, node: NodeId) -> keel_core::kite::Counters {
    world.engine(node).map(|e| e.status().counters).unwrap_or_default()
}

/// F1: a lost relaxed write. A's release times out, names B; B's acquire finds itself
/// delinquent, raises its epoch; B's next read of x is slow and sees the write, the one
/// after it is fast; an untouched key stays out of epoch. Then L12: B's own write read
/// back while its keys are out of epoch.
fn f1(config: &KiteRunConfig, rng: &mut Rng, report: &mut KiteReport) {
    let n = if rng.below(2) == 0 { 3 } else { 5 };
    let mut world = cluster(config, rng, n, Span::from_millis(2));
    let (a, b) = (NodeId(1), NodeId(2));
    let (x, f, z, y) = (1, 2, 3, 4);
    let mut recorder = Recorder::new();
    let setup = vec![Program { node: a, session: 1, steps: vec![w(z, 10)] }];
    run(&mut world, &mut recorder, setup, 200 * MS);
    world.run_until(world.now() + 100 * MS);
    world.set_drop_rule(Some(Box::new(drop_writes(a, b, x))));
    let programs = vec![
        Program { node: a, session: 2, steps: vec![w(x, 11), rel(f, 12)] },
        Program { node: b, session: 3, steps: vec![await_acq(f, 12), r(x), r(x), w(y, 13), r(y)] },
    ];
    let before = counters(&world, b);
    let (res, finished) = run(&mut world, &mut recorder, programs, 2_000 * MS);
    let after = counters(&world, b);
    expect(report, "F1", finished, "did not finish".into());
    expect(
        report,
        "F1",
        counters(&world, a).releases_slow >= 1,
        "the release did not take the slow path".into(),
    );
    expect(
        report,
        "F1",
        after.acquires_slow > before.acquires_slow,
        "B's acquire did not find B delinquent".into(),
    );
    expect(
        report,
        "F1",
        read(&res, 1, 1) == Some(11),
        format!("B read x={:?} after the acquire", read(&res, 1, 1)),
    );
    expect(
        report,
        "F1",
        read(&res, 1, 2) == Some(11),
        format!("B's second read of x={:?}", read(&res, 1, 2)),
    );
    expect(
        report,
        "F1",
        after.reads_slow > before.reads_slow && after.reads_fast > before.reads_fast,
        "B's reads of x were not one slow then one fast".into(),
    );
    expect(
        report,
        "F1",
        world.engine(b).is_some_and(|e| !e.in_epoch(&key(z))),
        "an untouched key came back in epoch".into(),
    );
    expect(
        report,
        "F1",
        read(&res, 1, 4) == Some(13),
        format!("L12: B wrote y=13 out of epoch and read {:?}", read(&res, 1, 4)),
    );
    finish(report, &world, &mut recorder, "F1");
}

/// F5: a slow release naming B lands between B's acquire marking A's bit transient and
/// B's reset reaching A: the bit ends set, and B's next acquire is slow again.
fn f5(config: &KiteRunConfig, rng: &mut Rng, report: &mut KiteReport) {
    let mut world = cluster(config, rng, 3, Span::from_millis(2));
    let (a, b, c) = (NodeId(1), NodeId(2), NodeId(3));
    let (x, f, y, g) = (1, 2, 3, 4);
    let hold_resets = Rc::new(Cell::new(true));
    let hold = hold_resets.clone();
    world.set_drop_rule(Some(Box::new(move |from, to, m| {
        if (from == a && to == b && is_write_to(m, x))
            || (from == c && to == b && is_write_to(m, y))
        {
            return Fate::Drop;
        }
        if hold.get() && from == b && matches!(m, Message::ResetBit { .. }) {
            return Fate::Delay(200 * MS);
        }
        Fate::Pass
    })));
    let mut recorder = Recorder::new();
    let programs = vec![
        Program { node: a, session: 1, steps: vec![w(x, 11), rel(f, 12)] },
        Program { node: b, session: 2, steps: vec![await_acq(f, 12)] },
    ];
    run(&mut world, &mut recorder, programs, 1_000 * MS);
    let slow_before = counters(&world, b).acquires_slow;
    // While B's resets are held back, C's release names B again.
    let programs = vec![Program { node: c, session: 3, steps: vec![w(y, 21), rel(g, 22)] }];
    run(&mut world, &mut recorder, programs, 1_000 * MS);
    hold_resets.set(false);
    world.run_until(world.now() + 300 * MS);
    let bit = world
        .engine(a)
        .and_then(|e| e.status().bits.into_iter().find(|(n, _)| *n == b))
        .map(|(_, bit)| bit);
    expect(
        report,
        "F5",
        bit == Some(Bit::Set),
        format!("A's bit for B after the late reset: {bit:?}"),
    );
    let programs = vec![Program { node: b, session: 4, steps: vec![await_acq(g, 22), r(y)] }];
    let (res, finished) = run(&mut world, &mut recorder, programs, 1_000 * MS);
    expect(report, "F5", finished, "did not finish".into());
    expect(
        report,
        "F5",
        counters(&world, b).acquires_slow > slow_before,
        "B's next acquire did not find B delinquent again".into(),
    );
    expect(report, "F5", read(&res, 0, 1) == Some(21), format!("B read y={:?}", read(&res, 0, 1)));
    finish(report, &world, &mut recorder, "F5");
}

/// F6: two sessions of the delinquent node acquire at once; neither reads stale data.
fn f6(config: &KiteRunConfig, rng: &mut Rng, report: &mut KiteReport) {
    let mut world = cluster(config, rng, 3, Span::from_millis(2));
    let (a, b) = (NodeId(1), NodeId(2));
    let (x, f) = (1, 2);
    world.set_drop_rule(Some(Box::new(drop_writes(a, b, x))));
    let mut recorder = Recorder::new();
    let programs = vec![
        Program { node: a, session: 1, steps: vec![w(x, 11), rel(f, 12)] },
        Program { node: b, session: 2, steps: vec![await_acq(f, 12), r(x)] },
        Program { node: b, session: 3, steps: vec![await_acq(f, 12), r(x)] },
    ];
    let (res, finished) = run(&mut world, &mut recorder, programs, 2_000 * MS);
    expect(report, "F6", finished, "did not finish".into());
    for p in [1, 2] {
        expect(
            report,
            "F6",
            read(&res, p, 1) == Some(11),
            format!("session {} read x={:?}", p + 1, read(&res, p, 1)),
        );
    }
    finish(report, &world, &mut recorder, "F6");
}

/// F7: B's epoch rises while its slow read of x is in flight; x must stay out of epoch,
/// so B's read after the acquire that raised it goes to a quorum and sees x's new value.
fn f7(config: &KiteRunConfig, rng: &mut Rng, report: &mut KiteReport) {
    let mut world = cluster(config, rng, 3, Span::from_millis(2));
    let (a, b) = (NodeId(1), NodeId(2));
    let (x, y, g, h) = (1, 2, 3, 4);
    let hold_replies = Rc::new(Cell::new(false));
    let drop_x2 = Rc::new(Cell::new(false));
    let (hold, dx) = (hold_replies.clone(), drop_x2.clone());
    world.set_drop_rule(Some(Box::new(move |from, to, m| {
        if from == a && to == b && (is_write_to(m, y) || (dx.get() && is_write_to(m, x))) {
            return Fate::Drop;
        }
        // Answers about x (values 1 and 5) to B are slow, resent ones included, so B's
        // slow read of x finishes after its epoch rose.
        let about_x = |v: &Option<keel_types::Value>| *v == Some(value(1)) || *v == Some(value(5));
        if hold.get() && to == b && matches!(m, Message::ReadReply { value, .. } if about_x(value))
        {
            return Fate::Delay(150 * MS);
        }
        Fate::Pass
    })));
    let mut recorder = Recorder::new();
    // x = 1 everywhere; then B becomes delinquent (a lost write of y) and raises its
    // epoch, so x is out of epoch at B.
    let programs = vec![
        Program {
            node: a,
            session: 1,
            steps: vec![w(x, 1), Step::Pause(50 * MS), w(y, 2), rel(g, 3)],
        },
        Program { node: b, session: 2, steps: vec![await_acq(g, 3)] },
    ];
    run(&mut world, &mut recorder, programs, 1_000 * MS);
    world.run_until(world.now() + 50 * MS);
    expect(
        report,
        "F7",
        world.engine(b).is_some_and(|e| !e.in_epoch(&key(x))),
        "x not out of epoch at B before the test".into(),
    );
    // B's slow read of x: its answers are held back.
    hold_replies.set(true);
    let dx = drop_x2.clone();
    let programs = vec![
        Program { node: b, session: 3, steps: vec![r(x)] },
        Program {
            node: a,
            session: 4,
            steps: vec![
                Step::Pause(5 * MS),
                Step::Call(Box::new(move |_| dx.set(true))),
                w(x, 5),
                rel(h, 6),
            ],
        },
        // Acquires h (finding B delinquent: the epoch rises while the read above is still
        // out), waits for that read to finish, then reads x.
        Program {
            node: b,
            session: 5,
            steps: vec![
                Step::Pause(8 * MS),
                await_acq(h, 6),
                Step::After { program: 0, step: 0 },
                r(x),
            ],
        },
    ];
    let (res, finished) = run(&mut world, &mut recorder, programs, 2_000 * MS);
    expect(report, "F7", finished, "did not finish".into());
    expect(
        report,
        "F7",
        read(&res, 2, 3) == Some(5),
        format!("after the acquire that raised B's epoch, B read x={:?}, not 5", read(&res, 2, 3)),
    );
    finish(report, &world, &mut recorder, "F7");
}

/// F8: every reset is lost: only performance suffers (B stays transient and its next
/// acquire is slow again); reads stay right.
fn f8(config: &KiteRunConfig, rng: &mut Rng, report: &mut KiteReport) {
    let mut world = cluster(config, rng, 3, Span::from_millis(2));
    let (a, b) = (NodeId(1), NodeId(2));
    let (x, f) = (1, 2);
    world.set_drop_rule(Some(Box::new(move |from, to, m| {
        if matches!(m, Message::ResetBit { .. }) || (from == a && to == b && is_write_to(m, x)) {
            Fate::Drop
        } else {
            Fate::Pass
        }
    })));
    let mut recorder = Recorder::new();
    let programs = vec![
        Program { node: a, session: 1, steps: vec![w(x, 11), rel(f, 12)] },
        Program { node: b, session: 2, steps: vec![await_acq(f, 12), r(x), acq(f), r(x)] },
    ];
    let (res, finished) = run(&mut world, &mut recorder, programs, 2_000 * MS);
    expect(report, "F8", finished, "did not finish".into());
    expect(
        report,
        "F8",
        counters(&world, b).acquires_slow >= 2,
        "with resets lost, B's second acquire was fast".into(),
    );
    expect(
        report,
        "F8",
        read(&res, 1, 1) == Some(11) && read(&res, 1, 3) == Some(11),
        "B read a stale x".into(),
    );
    finish(report, &world, &mut recorder, "F8");
}

/// F9: a time-out of about 0 (every release slow) keeps L1 right; a long one costs a
/// release about its length when a node is cut off.
fn f9(config: &KiteRunConfig, rng: &mut Rng, report: &mut KiteReport) {
    let mut world = cluster(config, rng, 3, Span(1));
    let (a, b, c) = (NodeId(1), NodeId(2), NodeId(3));
    let mut recorder = Recorder::new();
    let programs = vec![
        Program { node: a, session: 1, steps: vec![w(1, 11), rel(2, 12), w(1, 13), rel(2, 14)] },
        Program { node: b, session: 2, steps: vec![await_acq(2, 14), r(1)] },
    ];
    let (res, finished) = run(&mut world, &mut recorder, programs, 2_000 * MS);
    expect(report, "F9", finished, "did not finish (time-out 0)".into());
    expect(
        report,
        "F9",
        read(&res, 1, 1) == Some(13),
        format!("time-out 0: read x={:?}", read(&res, 1, 1)),
    );
    expect(
        report,
        "F9",
        counters(&world, a).releases_slow >= 1,
        "time-out 0: no slow release".into(),
    );
    finish(report, &world, &mut recorder, "F9");

    let long = 300 * MS;
    let mut world = cluster(config, rng, 3, Span(long));
    world.isolate(c);
    let mut recorder = Recorder::new();
    let programs = vec![Program { node: a, session: 1, steps: vec![w(1, 21), rel(2, 22)] }];
    let start = world.now();
    let (_, finished) = run(&mut world, &mut recorder, programs, 2_000 * MS);
    let took = world.now() - start;
    expect(report, "F9", finished, "did not finish (long time-out)".into());
    expect(
        report,
        "F9",
        took >= long,
        format!(
            "a release with a node cut off took {}ms, less than the {}ms time-out",
            took / MS,
            long / MS
        ),
    );
    finish(report, &world, &mut recorder, "F9-long");
}

/// F10: an older write that arrives late never overwrites a newer one.
fn f10(config: &KiteRunConfig, rng: &mut Rng, report: &mut KiteReport) {
    let mut world = cluster(config, rng, 3, Span::from_millis(2));
    let (a, b) = (NodeId(1), NodeId(2));
    let first = Rc::new(Cell::new(true));
    let flag = first.clone();
    world.set_drop_rule(Some(Box::new(move |from, to, m| {
        if from == a && to == b && is_write_to(m, 1) && flag.get() {
            flag.set(false);
            return Fate::Delay(100 * MS);
        }
        Fate::Pass
    })));
    let mut recorder = Recorder::new();
    let programs = vec![Program { node: a, session: 1, steps: vec![w(1, 11), w(1, 12)] }];
    run(&mut world, &mut recorder, programs, 500 * MS);
    world.run_until(world.now() + 300 * MS);
    let copy = world.engine(b).map(|e| e.local(&key(1)).0);
    expect(
        report,
        "F10",
        copy == Some(Some(value(12))),
        format!("B holds {copy:?} after the late older write"),
    );
    finish(report, &world, &mut recorder, "F10");
}

/// F11: the delinquent node is in the quorum that acknowledged the slow release naming
/// it, and its acquire's quorum is itself and a node that never heard of it: it must
/// still find itself delinquent (its own bit).
fn f11(config: &KiteRunConfig, rng: &mut Rng, report: &mut KiteReport) {
    let mut world = cluster(config, rng, 3, Span::from_millis(2));
    let (a, b, c) = (NodeId(1), NodeId(2), NodeId(3));
    let (x, f) = (1, 2);
    world.set_drop_rule(Some(Box::new(move |from, to, m| {
        let lost_write = from == a && to == b && is_write_to(m, x);
        let lost_slow_release = to == c && matches!(m, Message::SlowRelease { .. });
        let slow_reply = from == a
            && to == b
            && matches!(m, Message::ReadReply { .. } | Message::WriteAck { .. });
        if lost_write || lost_slow_release {
            Fate::Drop
        } else if slow_reply {
            Fate::Delay(400 * MS)
        } else {
            Fate::Pass
        }
    })));
    let mut recorder = Recorder::new();
    let programs = vec![
        Program { node: a, session: 1, steps: vec![w(x, 11), rel(f, 12)] },
        Program { node: b, session: 2, steps: vec![await_acq(f, 12), r(x)] },
    ];
    let (res, finished) = run(&mut world, &mut recorder, programs, 3_000 * MS);
    expect(report, "F11", finished, "did not finish".into());
    expect(
        report,
        "F11",
        counters(&world, b).self_delinquent >= 1,
        "B never acknowledged a slow release naming itself".into(),
    );
    expect(report, "F11", read(&res, 1, 1) == Some(11), format!("B read x={:?}", read(&res, 1, 1)));
    finish(report, &world, &mut recorder, "F11");
}

/// F12: a proposer crashes after its accept reached a quorum but before any commit left;
/// the next RMW on the key finishes it, and it counts once. Then concurrent proposers.
fn f12(config: &KiteRunConfig, rng: &mut Rng, report: &mut KiteReport) {
    let mut world = cluster(config, rng, 3, Span::from_millis(2));
    let (a, b, c) = (NodeId(1), NodeId(2), NodeId(3));
    let k = 1;
    world.set_drop_rule(Some(Box::new(move |from, _, m| {
        if from == a && matches!(m, Message::Write { rmw: Some(_), .. }) {
            Fate::Drop
        } else {
            Fate::Pass
        }
    })));
    let mut recorder = Recorder::new();
    let programs = vec![Program { node: a, session: 1, steps: vec![faa(k, 1)] }];
    // Run until A's accept has a quorum, then crash A.
    let tag = recorder.submit(&mut world, a, 1, KiteOp::Faa { key: key(k), delta: 1 });
    let _ = (programs, tag);
    let accepted = world.run_while(world.now() + 500 * MS, |w| {
        [b, c]
            .iter()
            .filter(|&&n| {
                w.engine(n)
                    .is_some_and(|e| e.status().counters.rmws == 0 && e.accepted_rmw(&key(k)))
            })
            .count()
            >= 1
    });
    expect(report, "F12", accepted, "A's accept never reached another node".into());
    world.crash(a);
    world.set_drop_rule(None);
    let per = 5;
    let programs = vec![
        Program { node: b, session: 2, steps: (0..per).map(|_| faa(k, 1)).collect() },
        Program { node: c, session: 3, steps: (0..per).map(|_| faa(k, 1)).collect() },
    ];
    let (_, finished) = run(&mut world, &mut recorder, programs, 3_000 * MS);
    let programs = vec![Program { node: b, session: 4, steps: vec![acq(k)] }];
    let (res, _) = run(&mut world, &mut recorder, programs, 1_000 * MS);
    expect(report, "F12", finished, "did not finish".into());
    let total = read(&res, 0, 0);
    expect(
        report,
        "F12",
        total == Some(1 + 2 * per),
        format!("counter {total:?} after A's accepted FAA and {} more", 2 * per),
    );
    let helped: u64 = [b, c].iter().map(|&n| counters(&world, n).rmw_helped).sum();
    expect(report, "F12", helped >= 1, "nobody finished A's accepted FAA".into());
    finish(report, &world, &mut recorder, "F12");
}

/// F13 (found in review): an acquire's query that reaches a replica only after the
/// acquire ended must not let the acquire's reset clear a bit a later slow release set.
/// C's acquire finishes on {C, A}; its query to B is late, and so would be its reset. In
/// between, A's release names C at B. When the late query reaches B the bit goes
/// transient; C's next acquire (on {C, B}) must still find C delinquent, so its read of x
/// goes to a quorum.
fn f13(config: &KiteRunConfig, rng: &mut Rng, report: &mut KiteReport) {
    let mut world = cluster(config, rng, 3, Span::from_millis(2));
    let (a, b, c) = (NodeId(1), NodeId(2), NodeId(3));
    let (x, y, h, f) = (1, 2, 3, 4);
    let phase = Rc::new(Cell::new(0u8));
    let p = phase.clone();
    world.set_drop_rule(Some(Box::new(move |from, to, m| {
        match p.get() {
            // Setup: A's write of y misses C, and A's slow release naming C misses B.
            0 => {
                if from == a && to == c && is_write_to(m, y) {
                    return Fate::Drop;
                }
                if to == b && matches!(m, Message::SlowRelease { .. }) {
                    return Fate::Drop;
                }
            }
            // C's first acquire: its query to B and its reset to B are late.
            1 => {
                if from == c && to == b && matches!(m, Message::Read { .. }) {
                    return Fate::Delay(300 * MS);
                }
            }
            // A's write of x and everything else from A to C are lost.
            _ => {
                if from == a && to == c {
                    return Fate::Drop;
                }
            }
        }
        if from == c && to == b && matches!(m, Message::ResetBit { .. }) {
            return Fate::Delay(400 * MS);
        }
        Fate::Pass
    })));
    let mut recorder = Recorder::new();
    let setup = vec![Program { node: a, session: 1, steps: vec![w(y, 11), rel(h, 12)] }];
    run(&mut world, &mut recorder, setup, 1_000 * MS);
    world.run_until(world.now() + 50 * MS);
    phase.set(1);
    let p2 = phase.clone();
    let programs = vec![
        Program {
            node: c,
            session: 2,
            steps: vec![
                await_acq(h, 12),
                r(x),
                Step::Call(Box::new(move |_| p2.set(2))),
                Step::Pause(450 * MS),
                await_acq(f, 14),
                r(x),
            ],
        },
        Program { node: a, session: 3, steps: vec![Step::Pause(20 * MS), w(x, 13), rel(f, 14)] },
    ];
    let (res, finished) = run(&mut world, &mut recorder, programs, 3_000 * MS);
    expect(report, "F13", finished, "did not finish".into());
    expect(
        report,
        "F13",
        read(&res, 0, 5) == Some(13),
        format!("C read x={:?} after acquiring the release that followed it", read(&res, 0, 5)),
    );
    finish(report, &world, &mut recorder, "F13");
}

/// F14 (restarts, not in the paper): a node that lost its memory must not vouch for what
/// its earlier incarnation acknowledged. A's release of x reaches only A and C (B hears
/// nothing from A). C restarts with an empty memory and rejoins; then A is cut off, and
/// B's acquire of x can only use B and the new C. It must read A's release, which only
/// C's rejoin (reading A before A was cut off) brought back.
fn f14(config: &KiteRunConfig, rng: &mut Rng, report: &mut KiteReport) {
    let mut world = cluster(config, rng, 3, Span::from_millis(2));
    let (a, b, c) = (NodeId(1), NodeId(2), NodeId(3));
    let x = 1;
    let phase = Rc::new(Cell::new(0u8));
    let p = phase.clone();
    world.set_drop_rule(Some(Box::new(move |from, to, _| match p.get() {
        0 if from == a && to == b => Fate::Drop,
        2 if from == a || to == a => Fate::Drop,
        _ => Fate::Pass,
    })));
    let mut recorder = Recorder::new();
    let setup = vec![Program { node: a, session: 1, steps: vec![rel(x, 21)] }];
    let (_, released) = run(&mut world, &mut recorder, setup, 1_000 * MS);
    expect(report, "F14", released, "A's release did not complete on {A, C}".into());
    world.crash(c);
    world.run_until(world.now() + 5 * MS);
    world.restart(c);
    phase.set(1);
    let rejoined = world.run_while(world.now() + 2_000 * MS, |w| {
        w.engine(c).is_some_and(|e| !e.status().rejoining)
    });
    expect(report, "F14", rejoined, "the restarted node never rejoined".into());
    phase.set(2);
    let programs = vec![Program { node: b, session: 2, steps: vec![acq(x)] }];
    let (res, finished) = run(&mut world, &mut recorder, programs, 2_000 * MS);
    expect(report, "F14", finished, "B's acquire did not finish on {B, C}".into());
    expect(
        report,
        "F14",
        read(&res, 0, 0) == Some(21),
        format!("B acquired x={:?} after A's release of 21 completed", read(&res, 0, 0)),
    );
    world.set_drop_rule(None);
    finish(report, &world, &mut recorder, "F14");
}
