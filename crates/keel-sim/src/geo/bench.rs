//! `keel sim bench --engine geo`: what uniformity costs, in virtual time (the paper's
//! Figures 5 and 6, `docs/geo.md`, *Measurements*), and the latency of causal commits.
//!
//! Data centers sit where the paper's did (Virginia, California, Frankfurt; then Ireland
//! and Brazil), with one-way delays of half the round trips in [`RTT_MS`]. Sessions at
//! every data center run update transactions back to back. For each committed
//! transaction and each other data center, the run notes when that data center came to
//! store it (its stable entry reached the transaction) and when it became visible there
//! (its uniform entry did): the extra delay is the difference. With f = 1 a transaction
//! stored at one other data center besides its origin is uniform as soon as it is
//! stored; with f = 2 the reader waits to learn that a third data center stores it.
//!
//! A run is a function of its parameters and seed, not of the machine: engines' steps
//! take no virtual time, so a causal commit costs its messages inside the data center
//! (the prepare round, 0.1 to 0.5 ms a way) and the wait for the slower clock.

use super::world::{GeoShape, GeoWorld};
use crate::rng::Rng;
use keel_core::engine::RequestTag;
use keel_core::geo::{GeoOp, GeoResult, TxId, Update, Vector};
use keel_types::{Key, NodeId};
use std::collections::BTreeMap;

/// The data centers, in the order they are added.
pub const REGIONS: [&str; 5] = ["virginia", "california", "frankfurt", "ireland", "brazil"];
/// Round trips between them, ms: Virginia–California is the paper's 61 ms; the others are
/// typical public figures between those regions, within the paper's 26 to 202 ms.
pub const RTT_MS: [[u64; 5]; 5] = [
    [0, 61, 88, 75, 115],
    [61, 0, 147, 140, 180],
    [88, 147, 0, 26, 202],
    [75, 140, 26, 0, 185],
    [115, 180, 202, 185, 0],
];
/// Sessions per data center.
const SESSIONS: u64 = 4;
/// Virtual time measured, after a second of warm-up.
const MEASURE_NS: u64 = 20_000_000_000;

/// Percentiles of a sample, ms.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Spread {
    /// Values.
    pub count: usize,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Mean.
    pub mean: f64,
}

impl Spread {
    fn of(mut ns: Vec<u64>) -> Spread {
        if ns.is_empty() {
            return Spread::default();
        }
        ns.sort_unstable();
        let at = |q: f64| ns[((ns.len() - 1) as f64 * q).round() as usize] as f64 / 1e6;
        let mean = ns.iter().sum::<u64>() as f64 / ns.len() as f64 / 1e6;
        Spread { count: ns.len(), p50: at(0.5), p90: at(0.9), p99: at(0.99), mean }
    }
}

/// One configuration's measurements.
#[derive(Clone, Debug, serde::Serialize)]
pub struct GeoPoint {
    /// Failures tolerated.
    pub f: u32,
    /// The data centers.
    pub regions: Vec<&'static str>,
    /// Partitions per data center.
    pub partitions: u32,
    /// Causal commits (commit request to its reply).
    pub commit: Spread,
    /// From commit to stored at another data center.
    pub stored: Spread,
    /// From stored to visible there: what uniformity adds.
    pub extra: Spread,
    /// The extra delay's 90th percentile by (origin, reader).
    pub extra_p90_by_pair: Vec<PairP90>,
}

/// One session's place in its loop.
struct Session {
    dc: u32,
    node: NodeId,
    past: Vector,
    tx: Option<TxId>,
    ops_left: u32,
    commit_sent: u64,
    next_at: u64,
}

/// Measures one configuration.
pub fn measure(f: u32, partitions: u32, seed: u64) -> GeoPoint {
    let dcs = 2 * f + 1;
    let mut wan_ns = BTreeMap::new();
    for a in 0..dcs {
        for b in a + 1..dcs {
            wan_ns.insert((a, b), RTT_MS[a as usize][b as usize] * 1_000_000 / 2);
        }
    }
    let shape = GeoShape {
        f,
        partitions,
        wan_ns,
        loss_ppm: 0,
        duplicate_ppm: 0,
        jitter_ns: 500_000,
        skew_ms: 0,
        ..GeoShape::default()
    };
    let mut rng = Rng::new(seed);
    let mut world = GeoWorld::new(shape, rng.next_u64());
    world.world.checker_mut().per_node = true;
    for n in world.world.node_ids() {
        world.world.set_clock_drift(n, 0);
    }
    let (commits, committed) = run_sessions(&mut world, &mut rng, dcs);
    let (stored, extra, by_pair) = visibility(&world, &committed, dcs);
    GeoPoint {
        f,
        regions: REGIONS[..dcs as usize].to_vec(),
        partitions,
        commit: Spread::of(commits),
        stored: Spread::of(stored),
        extra: Spread::of(extra),
        extra_p90_by_pair: by_pair,
    }
}

/// Runs the sessions; the commit latencies, and each committed transaction's origin,
/// timestamp and commit time.
fn run_sessions(world: &mut GeoWorld, rng: &mut Rng, dcs: u32) -> (Vec<u64>, Vec<(u32, u64, u64)>) {
    let mut sessions: Vec<Session> = (0..dcs)
        .flat_map(|dc| (0..SESSIONS).map(move |i| (dc, i)))
        .map(|(dc, i)| {
            let nodes = world.nodes_of(dc);
            Session {
                dc,
                node: nodes[i as usize % nodes.len()],
                past: Vector::zero(dcs as usize),
                tx: None,
                ops_left: 0,
                commit_sent: 0,
                next_at: 0,
            }
        })
        .collect();
    let mut waiting: BTreeMap<RequestTag, usize> = BTreeMap::new();
    let (mut commits, mut committed) = (Vec::new(), Vec::new());
    let warm = 1_000_000_000;
    let end = warm + MEASURE_NS;
    while world.now() < end {
        let now = world.now();
        for (i, s) in sessions.iter_mut().enumerate() {
            if s.next_at > now || waiting.values().any(|&w| w == i) {
                continue;
            }
            let op = match s.tx {
                None => GeoOp::Begin { past: s.past.clone() },
                Some(tx) if s.ops_left > 0 => {
                    s.ops_left -= 1;
                    let key = Key::from(format!("k{}", rng.below(1_000)));
                    GeoOp::Update { tx, key, update: Update::Add(1) }
                }
                Some(tx) => {
                    s.commit_sent = now;
                    GeoOp::Commit { tx }
                }
            };
            let tag = world.submit(s.node, i as u64 + 1, op);
            waiting.insert(tag, i);
        }
        world.step_until(now + 100_000);
        let done: Vec<RequestTag> =
            world.replies.keys().filter(|t| waiting.contains_key(t)).copied().collect();
        for tag in done {
            let i = waiting.remove(&tag).expect("listed");
            let (at, reply) = world.replies.remove(&tag).expect("listed");
            let s = &mut sessions[i];
            match reply.result {
                Ok(GeoResult::Began { tx, .. }) => {
                    s.tx = Some(tx);
                    s.ops_left = 3;
                }
                Ok(GeoResult::Committed { vector }) => {
                    if at > warm {
                        commits.push(at - s.commit_sent);
                        committed.push((s.dc, vector.dcs[s.dc as usize], at));
                    }
                    s.past = vector;
                    s.tx = None;
                    s.next_at = at + 2_000_000;
                }
                Ok(_) => {}
                Err(e) => panic!("a benchmark request failed: {e}"),
            }
        }
    }
    (commits, committed)
}

/// An (origin, reader) pair's 90th percentile, ms.
type PairP90 = (&'static str, &'static str, f64);

/// The first time `samples` (ascending) reach `ts` for `origin`.
fn reached(samples: &[(u32, u64, u64)], origin: u32, ts: u64) -> Option<u64> {
    samples.iter().find(|(o, through, _)| *o == origin && *through >= ts).map(|(_, _, at)| *at)
}

/// Per committed transaction and other data center: commit to stored, stored to
/// visible, and the latter's 90th percentile by pair.
fn visibility(
    world: &GeoWorld,
    committed: &[(u32, u64, u64)],
    dcs: u32,
) -> (Vec<u64>, Vec<u64>, Vec<PairP90>) {
    let watch = world.world.checker();
    let (mut stored, mut extra) = (Vec::new(), Vec::new());
    let mut by_pair: BTreeMap<(u32, u32), Vec<u64>> = BTreeMap::new();
    for &(origin, ts, at) in committed.iter().step_by(7) {
        for reader in (0..dcs).filter(|&d| d != origin) {
            let node = world.nodes_of(reader)[0];
            let empty = Vec::new();
            let stable = watch.node_stable.get(&node).unwrap_or(&empty);
            let uniform = watch.node_uniform.get(&node).unwrap_or(&empty);
            let (Some(s), Some(u)) = (reached(stable, origin, ts), reached(uniform, origin, ts))
            else {
                continue;
            };
            stored.push(s.saturating_sub(at));
            extra.push(u.saturating_sub(s));
            by_pair.entry((origin, reader)).or_default().push(u.saturating_sub(s));
        }
    }
    let pairs = by_pair
        .into_iter()
        .map(|((o, r), v)| (REGIONS[o as usize], REGIONS[r as usize], Spread::of(v).p90))
        .collect();
    (stored, extra, pairs)
}

/// Runs the benchmark: f = 1 over three data centers and f = 2 over five.
pub fn run_cli(json: bool, seed: u64) -> std::process::ExitCode {
    let points = [measure(1, 2, seed), measure(2, 1, seed)];
    for p in &points {
        if json {
            println!("{}", serde_json::to_string(p).expect("points serialize"));
            continue;
        }
        println!(
            "f={} {} partitions={}: causal commit p50 {:.2} ms p90 {:.2} ms mean {:.2} ms ({} commits)",
            p.f,
            p.regions.join("+"),
            p.partitions,
            p.commit.p50,
            p.commit.p90,
            p.commit.mean,
            p.commit.count
        );
        println!(
            "  commit to stored elsewhere: p50 {:.1} ms p90 {:.1} ms; stored to visible (uniformity): p50 {:.1} ms p90 {:.1} ms p99 {:.1} ms",
            p.stored.p50, p.stored.p90, p.extra.p50, p.extra.p90, p.extra.p99
        );
        for (o, r, p90) in &p.extra_p90_by_pair {
            println!("  {o:>10} -> {r:<10} extra p90 {p90:6.1} ms");
        }
    }
    std::process::ExitCode::SUCCESS
}
