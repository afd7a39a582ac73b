//! `keel sim bench --engine kite`: the Kite paper's throughput figures in virtual time.
//!
//! `keel bench suite kite` measures real servers on loopback TCP, where the clients and
//! three servers share two cores, so every message's cost lands on everyone. Here the
//! same modes run on the simulator's Kite cluster with a processor per node
//! ([`CpuCost`]: a cost per step and per message sent, the step's output leaving when it
//! is over) and a network of a few microseconds, closer to the paper's RDMA cluster. The
//! results do not depend on the machine that computes them: a run is a function of its
//! parameters and seed.
//!
//! Modes, as in `keel bench suite kite` (`crates/keel-bench/src/kite.rs`):
//! - `es`: every access relaxed;
//! - `abd`: reads are acquires, writes releases;
//! - `paxos`: reads are `FAA k 0`, writes `FAA k 1`;
//! - `kite`: 5% of accesses synchronize (a read an acquire, a write a release), the rest
//!   relaxed; and the write-only sweeps of Figures 8 (releases among writes) and 9 (FAAs
//!   among writes).

use super::world::{CpuCost, KiteWorld, NetConfig};
use crate::rng::Rng;
use keel_core::kite::{Config, KiteOp};
use keel_core::time::Span;
use keel_types::{Key, NodeId, Value};
use std::collections::BTreeMap;

/// Nodes.
pub const NODES: u32 = 3;
/// Closed-loop sessions per node (enough to keep every processor busy).
pub const SESSIONS_PER_NODE: u64 = 24;
/// Keys accessed, uniformly.
pub const KEYS: u64 = 1_000;
/// Share of synchronizing accesses in `kite`, percent.
pub const SYNC_PERCENT: u64 = 5;
/// The modes of the Figure 7 sweep.
pub const MODES: [&str; 4] = ["es", "abd", "paxos", "kite"];
/// Write shares of the Figure 7 sweep, percent.
pub const WRITE_SWEEP: [u64; 4] = [1, 5, 20, 50];
/// Shares of releases (Figure 8) and of FAAs (Figure 9) among writes, percent.
pub const WRITE_ONLY_SWEEP: [u64; 5] = [0, 5, 20, 50, 100];

/// One measured point.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Point {
    /// `es`, `abd`, `paxos` or `kite`.
    pub mode: &'static str,
    /// Writes among accesses, percent.
    pub write_pct: u64,
    /// `kite`: accesses that synchronize, percent.
    pub sync_pct: u64,
    /// `kite`: accesses that are FAAs, percent.
    pub rmw_pct: u64,
    /// Completed operations per second of virtual time.
    pub ops_per_s: f64,
    /// Messages sent per completed operation.
    pub messages_per_op: f64,
}

/// The model's parameters.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Model {
    /// Processor cost of a step, ns.
    pub step_ns: u64,
    /// Processor cost of each message sent, ns.
    pub message_ns: u64,
    /// One-way network delay, uniform in `[delay_min_ns, delay_max_ns)`.
    pub delay_min_ns: u64,
    /// See `delay_min_ns`.
    pub delay_max_ns: u64,
    /// Virtual time measured, after `warmup_ns`.
    pub measure_ns: u64,
    /// Virtual time run before measuring.
    pub warmup_ns: u64,
}

impl Default for Model {
    /// 1 µs per step and 0.5 µs per message sent; one-way delays of 2 to 4 µs (an RDMA
    /// network's order); 20 ms measured after 5 ms.
    fn default() -> Model {
        Model {
            step_ns: 1_000,
            message_ns: 500,
            delay_min_ns: 2_000,
            delay_max_ns: 4_000,
            measure_ns: 20_000_000,
            warmup_ns: 5_000_000,
        }
    }
}

/// The access a session makes next.
fn access(
    rng: &mut Rng,
    mode: &str,
    write_pct: u64,
    sync_pct: u64,
    rmw_pct: u64,
    serial: u64,
) -> KiteOp {
    let key = Key::from(format!("k{}", rng.below(KEYS)));
    let write = rng.below(100) < write_pct;
    let value = || Value::from(serial.to_string());
    let sync = rng.below(100) < sync_pct;
    let rmw = rng.below(100) < rmw_pct;
    match (mode, write) {
        ("es", false) => KiteOp::Read { key },
        ("es", true) => KiteOp::Write { key, value: value() },
        ("abd", false) => KiteOp::Acquire { key },
        ("abd", true) => KiteOp::Release { key, value: value() },
        ("paxos", w) => KiteOp::Faa { key, delta: i64::from(w) },
        (_, true) if rmw => KiteOp::Faa { key, delta: 1 },
        (_, false) if sync => KiteOp::Acquire { key },
        (_, true) if sync => KiteOp::Release { key, value: value() },
        (_, false) => KiteOp::Read { key },
        (_, true) => KiteOp::Write { key, value: value() },
    }
}

/// Runs one point: [`SESSIONS_PER_NODE`] closed-loop sessions on each node.
pub fn measure(
    model: &Model,
    mode: &'static str,
    write_pct: u64,
    sync_pct: u64,
    rmw_pct: u64,
    seed: u64,
) -> Point {
    let members: Vec<NodeId> = (1..=NODES).map(NodeId).collect();
    let mut template = Config::new(NodeId(1), members);
    template.release_timeout = Span::from_millis(1);
    template.retransmit = Span::from_millis(5);
    let net = NetConfig {
        delay_min: model.delay_min_ns,
        delay_max: model.delay_max_ns,
        drop_ppm: 0,
        stall_ppm: 0,
        stall_max: 0,
        dup_ppm: 0,
        link_bulk_bytes_max: keel_exec::LINK_BULK_BYTES_MAX,
        unsafe_unbounded_links: false,
        reads_off_loop_ppm: 0,
    };
    let mut world = KiteWorld::new(NODES, &template, seed, net, false);
    world.settle_boot();
    world.set_cpu(CpuCost { step_ns: model.step_ns, message_ns: model.message_ns });
    let mut rng = Rng::new(seed ^ 0xB3_4C4E);
    // Each session's node, by session id.
    let mut node_of: BTreeMap<u64, NodeId> = BTreeMap::new();
    let mut session_of = BTreeMap::new();
    let mut serial = 0;
    for node in world.members() {
        for s in 0..SESSIONS_PER_NODE {
            let session = u64::from(node.0) * 1_000 + s;
            node_of.insert(session, node);
            serial += 1;
            let op = access(&mut rng, mode, write_pct, sync_pct, rmw_pct, serial);
            let tag = world.submit_at(0, node, session, op);
            session_of.insert(tag, session);
        }
    }
    let end = model.warmup_ns + model.measure_ns;
    let (mut done, mut sent_at_start) = (0u64, None);
    let mut t = 0;
    while t < end {
        t += 10_000;
        world.run_until(t);
        if sent_at_start.is_none() && t >= model.warmup_ns {
            sent_at_start = Some(world.stats().1.sent);
        }
        for (at, _, reply) in world.take_replies() {
            let Some(session) = session_of.remove(&reply.tag) else { continue };
            if reply.result.is_ok() && at >= model.warmup_ns && at < end {
                done += 1;
            }
            serial += 1;
            let op = access(&mut rng, mode, write_pct, sync_pct, rmw_pct, serial);
            let tag = world.submit_at(at, node_of[&session], session, op);
            session_of.insert(tag, session);
        }
    }
    let messages = world.stats().1.sent - sent_at_start.unwrap_or(0);
    Point {
        mode,
        write_pct,
        sync_pct,
        rmw_pct,
        ops_per_s: done as f64 * 1e9 / model.measure_ns as f64,
        messages_per_op: messages as f64 / done.max(1) as f64,
    }
}

/// Figure 7 (each mode by write share) and the write-only sweeps of Figures 8 and 9.
pub fn suite(model: &Model, seed: u64) -> Vec<Point> {
    let mut points = Vec::new();
    for write_pct in WRITE_SWEEP {
        for mode in MODES {
            let sync = if mode == "kite" { SYNC_PERCENT } else { 0 };
            points.push(measure(model, mode, write_pct, sync, 0, seed));
        }
    }
    for pct in WRITE_ONLY_SWEEP {
        points.push(measure(model, "kite", 100, pct, 0, seed));
    }
    for pct in WRITE_ONLY_SWEEP.into_iter().filter(|p| *p > 0) {
        points.push(measure(model, "kite", 100, 0, pct, seed));
    }
    points
}

/// `keel sim bench --engine kite`: the suite, as a table or one JSON object per point.
pub fn run_cli(json: bool, seed: u64) -> std::process::ExitCode {
    let model = Model::default();
    let points = suite(&model, seed);
    if json {
        for p in &points {
            let line = serde_json::json!({"model": model, "seed": seed, "point": p});
            println!("{line}");
        }
        return std::process::ExitCode::SUCCESS;
    }
    let ops = |mode: &str, w: u64, s: u64, r: u64| {
        points
            .iter()
            .find(|p| p.mode == mode && p.write_pct == w && p.sync_pct == s && p.rmw_pct == r)
            .map_or(0.0, |p| p.ops_per_s)
    };
    println!(
        "Kite in virtual time: {NODES} nodes, {SESSIONS_PER_NODE} sessions each, {} ns per step, {} ns per message sent, one-way delay {}-{} ns",
        model.step_ns, model.message_ns, model.delay_min_ns, model.delay_max_ns
    );
    println!("| writes | es | abd | paxos | kite ({SYNC_PERCENT}% sync) | kite / es |");
    println!("|---|---:|---:|---:|---:|---:|");
    for w in WRITE_SWEEP {
        let es = ops("es", w, 0, 0);
        let kite = ops("kite", w, SYNC_PERCENT, 0);
        println!(
            "| {w}% | {es:.0} | {:.0} | {:.0} | {kite:.0} | {:.2}x |",
            ops("abd", w, 0, 0),
            ops("paxos", w, 0, 0),
            kite / es.max(1.0)
        );
    }
    let base = ops("kite", 100, 0, 0);
    let sweep = |sync: bool| {
        let shares: Vec<String> = WRITE_ONLY_SWEEP
            .into_iter()
            .filter(|p| *p > 0)
            .map(|p| {
                let v = if sync { ops("kite", 100, p, 0) } else { ops("kite", 100, 0, p) };
                format!("{p}% {:.2}x", v / base.max(1.0))
            })
            .collect();
        shares.join(", ")
    };
    println!("write-only, relative to all-relaxed writes ({base:.0} ops/s):");
    println!("  releases among writes (Figure 8): {}", sweep(true));
    println!("  FAAs among writes (Figure 9): {}", sweep(false));
    println!("replay: keel sim bench --engine kite --seed {seed}");
    std::process::ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_point_is_a_function_of_its_parameters_and_relaxed_accesses_cost_least() {
        let model = Model { measure_ns: 2_000_000, warmup_ns: 500_000, ..Model::default() };
        let es = measure(&model, "es", 5, 0, 0, 7);
        let again = measure(&model, "es", 5, 0, 0, 7);
        assert_eq!(es.ops_per_s, again.ops_per_s, "virtual time: the same point twice");
        let abd = measure(&model, "abd", 5, 0, 0, 7);
        assert!(es.ops_per_s > abd.ops_per_s, "{es:?} {abd:?}");
        assert!(es.messages_per_op < abd.messages_per_op);
    }
}
