//! `keel bench suite kite`: the Kite paper's throughput figures, on Keel.
//!
//! Three nodes on loopback, hosting an ORCA keyspace (0) and a Kite keyspace (1).
//! [`CLIENTS`] closed-loop clients, spread evenly over the nodes, each one connection (a
//! Kite session), over [`KEYS`] keys holding decimal integers. For each write ratio of
//! `--workloads` (default [`WRITE_RATIOS`]), each mode runs `--duration` seconds after
//! `--warmup`:
//!
//! - `es`: every access relaxed (the Eventual Store alone);
//! - `abd`: reads are acquires, writes releases (ABD alone);
//! - `paxos`: reads are `KEEL.FAA k 0`, writes `KEEL.FAA k 1` (every access an RMW);
//! - `kite`: [`SYNC_PERCENT`]% of accesses synchronize (a read an acquire, a write a
//!   release), the rest relaxed (the paper's Kite with 5% synchronization);
//! - `orca-strong`: the ORCA keyspace, reads `LEVEL linearizable`, writes `DURABILITY
//!   durable` (the paper's ZAB-like strong baseline).
//!
//! Then the paper's Figures 8 and 9, write-only: `kite` with [`SYNC_SWEEP`] percent of the
//! writes releases (the rest relaxed), and with [`RMW_SWEEP`] percent of them `KEEL.FAA`
//! (the rest relaxed).
//!
//! Then the paper's Figure 11: `kite` at 5% writes for [`PAUSE_RUN`], node 3 frozen
//! (`SIGSTOP`) for [`PAUSE`] a third of the way in, the completions of the clients of
//! nodes 1 and 2 counted in [`BUCKET`] buckets: they stall at most about one release
//! time-out, then go on at their earlier pace.
//!
//! Loopback TCP on two shared cores is far from the paper's RDMA cluster: the ratios and
//! the shape are the point, not the absolute numbers. Results go to
//! `<out>/kite-<stamp>.{jsonl,md}`.

use crate::cli::SuiteArgs;
use crate::driver::resp::RespConn;
use crate::rng::Rng;
use hdrhistogram::Histogram;
use keel_server::config::KeyspaceSettings;
use keel_server::local::LocalCluster;
use keel_wire::resp::Frame;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Nodes in the cluster.
pub const NODES: u32 = 3;
/// Concurrent clients (sessions), spread over the nodes.
pub const CLIENTS: usize = 12;
/// Keys.
pub const KEYS: u64 = 1000;
/// Write ratios, in percent, measured by default.
pub const WRITE_RATIOS: [u64; 4] = [1, 5, 20, 50];
/// Share of synchronizing accesses in the `kite` mode, in percent.
pub const SYNC_PERCENT: u64 = 5;
/// The modes, in table order.
pub const MODES: [&str; 5] = ["es", "abd", "paxos", "kite", "orca-strong"];
/// Shares of releases among writes in the write-only sweep (Figure 8), in percent.
pub const SYNC_SWEEP: [u64; 5] = [0, 5, 20, 50, 100];
/// Shares of RMWs among writes in the write-only sweep (Figure 9), in percent.
pub const RMW_SWEEP: [u64; 4] = [5, 20, 50, 100];
/// The Figure 11 run's length.
pub const PAUSE_RUN: Duration = Duration::from_millis(1500);
/// How long node 3 is frozen.
pub const PAUSE: Duration = Duration::from_millis(400);
/// Throughput buckets of the pause run.
pub const BUCKET: Duration = Duration::from_millis(10);
/// The Kite keyspace.
const KITE: u32 = 1;

/// One measured point.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KiteRecord {
    /// The mode.
    pub mode: String,
    /// Writes among accesses, in percent.
    pub write_pct: u64,
    /// `kite`: accesses that synchronize, in percent.
    #[serde(default)]
    pub sync_pct: u64,
    /// `kite`: accesses that are RMWs (`KEEL.FAA`), in percent.
    #[serde(default)]
    pub rmw_pct: u64,
    /// Operations per second.
    pub ops_s: f64,
    /// Median latency, µs.
    pub p50_us: u64,
    /// 99th percentile latency, µs.
    pub p99_us: u64,
    /// Errors (refusals, broken connections).
    pub errors: u64,
}

/// One client's job.
#[derive(Clone)]
struct Job {
    addr: SocketAddr,
    mode: &'static str,
    write_pct: u64,
    sync_pct: u64,
    rmw_pct: u64,
    record_from: Instant,
    until: Instant,
    seed: u64,
    /// Completions per bucket since `record_from` (the pause run), if counted.
    buckets: Option<Arc<Vec<AtomicU64>>>,
}

/// What one client did while recording.
struct Tally {
    ops: u64,
    errors: u64,
    latency: Histogram<u64>,
}

/// The words of one access in `mode` (`kite`: a synchronizing one, or an RMW).
fn access(
    mode: &str,
    write: bool,
    sync: bool,
    rmw: bool,
    key: &[u8],
    value: &[u8],
) -> Vec<Vec<u8>> {
    let words: Vec<&[u8]> = match (mode, write) {
        ("kite", _) if rmw => vec![b"KEEL.FAA", key, b"1"],
        ("es", false) => vec![b"GET", key],
        ("es", true) => vec![b"SET", key, value],
        ("abd", false) => vec![b"GET", key, b"ACQUIRE"],
        ("abd", true) => vec![b"SET", key, value, b"RELEASE"],
        ("paxos", false) => vec![b"KEEL.FAA", key, b"0"],
        ("paxos", true) => vec![b"KEEL.FAA", key, b"1"],
        ("kite", false) if sync => vec![b"GET", key, b"ACQUIRE"],
        ("kite", true) if sync => vec![b"SET", key, value, b"RELEASE"],
        ("kite", false) => vec![b"GET", key],
        ("kite", true) => vec![b"SET", key, value],
        (_, false) => vec![b"GET", key, b"LEVEL", b"linearizable"],
        (_, true) => vec![b"SET", key, value, b"DURABILITY", b"durable"],
    };
    words.into_iter().map(<[u8]>::to_vec).collect()
}

async fn client(job: Job) -> Result<Tally, String> {
    let mut conn = RespConn::connect(job.addr).await.map_err(|e| e.to_string())?;
    let keyspace = if job.mode == "orca-strong" { 0 } else { KITE };
    conn.select(keyspace).await.map_err(|e| e.to_string())?;
    let mut rng = Rng::new(job.seed);
    let mut tally = Tally {
        ops: 0,
        errors: 0,
        latency: Histogram::new_with_bounds(1, 60_000_000, 2).expect("bounds"),
    };
    loop {
        let now = Instant::now();
        if now >= job.until {
            return Ok(tally);
        }
        let key = format!("k{}", rng.below(KEYS)).into_bytes();
        let value = rng.below(1_000_000).to_string().into_bytes();
        let write = rng.below(100) < job.write_pct;
        let sync = rng.below(100) < job.sync_pct;
        let rmw = rng.below(100) < job.rmw_pct;
        let words = access(job.mode, write, sync, rmw, &key, &value);
        let refs: Vec<&[u8]> = words.iter().map(Vec::as_slice).collect();
        let reply = conn.call(&refs).await;
        let done = Instant::now();
        if done < job.record_from {
            continue;
        }
        match reply {
            Ok(Frame::Error(_)) | Err(_) => tally.errors += 1,
            Ok(_) => {
                tally.ops += 1;
                let us = u64::try_from(done.duration_since(now).as_micros()).unwrap_or(u64::MAX);
                let _ = tally.latency.record(us.max(1));
            }
        }
        if let (Some(buckets), Ok(_)) = (&job.buckets, &reply) {
            let at = done.duration_since(job.record_from).as_nanos() / BUCKET.as_nanos();
            if let Some(b) = buckets.get(at as usize) {
                b.fetch_add(1, Ordering::Relaxed);
            }
        }
        if reply.is_err() {
            // A broken connection (a frozen node's is not broken, only slow).
            conn = RespConn::connect(job.addr).await.map_err(|e| e.to_string())?;
            conn.select(keyspace).await.map_err(|e| e.to_string())?;
        }
    }
}

/// What to measure: a mode at a write ratio, and where to count completions.
struct Point {
    mode: &'static str,
    write_pct: u64,
    sync_pct: u64,
    rmw_pct: u64,
    warmup: Duration,
    duration: Duration,
    seed: u64,
    buckets: Option<Arc<Vec<AtomicU64>>>,
}

/// Runs `CLIENTS` clients of `point` and sums them.
fn measure(
    runtime: &tokio::runtime::Runtime,
    addrs: &[SocketAddr],
    point: Point,
) -> Result<KiteRecord, String> {
    let Point { mode, write_pct, sync_pct, rmw_pct, warmup, duration, seed, buckets } = point;
    let record_from = Instant::now() + warmup;
    let until = record_from + duration;
    let tallies = crate::runner::run_clients(runtime, CLIENTS, |c| {
        client(Job {
            addr: addrs[c % addrs.len()],
            mode,
            write_pct,
            sync_pct,
            rmw_pct,
            record_from,
            until,
            seed: seed ^ ((c as u64 + 1) << 20),
            // Only the clients of the nodes that stay up are counted (node 3's stall with
            // it).
            buckets: buckets.clone().filter(|_| c % addrs.len() != addrs.len() - 1),
        })
    })?;
    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 2).expect("bounds");
    for t in &tallies {
        latency.add(&t.latency).map_err(|e| e.to_string())?;
    }
    let ops: u64 = tallies.iter().map(|t| t.ops).sum();
    Ok(KiteRecord {
        mode: mode.into(),
        write_pct,
        sync_pct,
        rmw_pct,
        ops_s: ops as f64 / duration.as_secs_f64(),
        p50_us: latency.value_at_quantile(0.5),
        p99_us: latency.value_at_quantile(0.99),
        errors: tallies.iter().map(|t| t.errors).sum(),
    })
}

/// Freezes or thaws a process.
fn signal(pid: u32, which: &str) -> Result<(), String> {
    let status = std::process::Command::new("kill")
        .args([which, &pid.to_string()])
        .status()
        .map_err(|e| format!("kill {which}: {e}"))?;
    status.success().then_some(()).ok_or(format!("kill {which} {pid} failed"))
}

/// Runs the suite and writes its report.
pub fn run(args: &SuiteArgs, exe: &Path) -> Result<(), String> {
    let ratios: Vec<u64> = match &args.workloads {
        Some(list) => list
            .split(',')
            .map(|w| {
                w.trim()
                    .trim_end_matches('%')
                    .parse()
                    .map_err(|_| format!("bad write ratio {w:?} (percent)"))
            })
            .collect::<Result<_, _>>()?,
        None => WRITE_RATIOS.to_vec(),
    };
    if ratios.iter().any(|r| *r > 100) {
        return Err("write ratios are percentages, 0 to 100".into());
    }
    let dir = crate::cluster::temp_dir("keel-kite-bench");
    let mut cluster = LocalCluster::start(exe, NODES, &dir, None, |c| {
        c.keyspaces = vec![KeyspaceSettings::orca(0), KeyspaceSettings::kite(KITE)];
    })
    .map_err(|e| format!("cannot start the cluster: {e}"))?;
    let result = suite(args, &ratios, &mut cluster);
    cluster.stop();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn suite(args: &SuiteArgs, ratios: &[u64], cluster: &mut LocalCluster) -> Result<(), String> {
    cluster
        .wait_for_leader(crate::geo::READY_TIMEOUT)
        .ok_or("the ORCA keyspace elected no leader")?;
    if !cluster.wait_for_replicas(KITE, crate::geo::READY_TIMEOUT) {
        return Err("the Kite keyspace did not start".into());
    }
    let addrs = cluster.client_addrs();
    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let warmup = Duration::from_secs(args.common.warmup);
    let duration = Duration::from_secs(args.common.duration);
    let point = |mode, write_pct, sync_pct, rmw_pct| Point {
        mode,
        write_pct,
        sync_pct,
        rmw_pct,
        warmup,
        duration,
        seed: args.common.seed,
        buckets: None,
    };
    let mut records = Vec::new();
    for &write_pct in ratios {
        for mode in MODES {
            let sync_pct = if mode == "kite" { SYNC_PERCENT } else { 0 };
            let record = measure(&runtime, &addrs, point(mode, write_pct, sync_pct, 0))?;
            eprintln!(
                "keel bench kite: {:>3}% writes {:<12} {:>8.0} ops/s  p50 {:>6} µs  p99 {:>7} µs  errors {}",
                record.write_pct, record.mode, record.ops_s, record.p50_us, record.p99_us, record.errors
            );
            records.push(record);
        }
    }
    // Figures 8 and 9: write-only, by share of releases and of RMWs.
    let mut sweeps = Vec::new();
    let shares = SYNC_SWEEP.iter().map(|&s| (s, 0)).chain(RMW_SWEEP.iter().map(|&r| (0, r)));
    for (sync_pct, rmw_pct) in shares {
        let record = measure(&runtime, &addrs, point("kite", 100, sync_pct, rmw_pct))?;
        eprintln!(
            "keel bench kite: write-only, {:>3}% releases {:>3}% RMWs {:>8.0} ops/s  p50 {:>6} µs",
            sync_pct, rmw_pct, record.ops_s, record.p50_us
        );
        sweeps.push(record);
    }
    // Figure 11: node 3 frozen for PAUSE a third of the way into the run.
    let count = (PAUSE_RUN.as_nanos() / BUCKET.as_nanos()) as usize;
    let buckets: Arc<Vec<AtomicU64>> = Arc::new((0..count).map(|_| AtomicU64::new(0)).collect());
    let pid = cluster.pid(2).ok_or("node 3 has no process")?;
    let pause_at = warmup + PAUSE_RUN / 3;
    let freezer = std::thread::spawn(move || {
        std::thread::sleep(pause_at);
        let stopped = signal(pid, "-STOP");
        std::thread::sleep(PAUSE);
        stopped.and(signal(pid, "-CONT"))
    });
    let frozen = Point {
        duration: PAUSE_RUN,
        buckets: Some(buckets.clone()),
        ..point("kite", 5, SYNC_PERCENT, 0)
    };
    let paused = measure(&runtime, &addrs, frozen)?;
    freezer.join().map_err(|_| "the freezer thread panicked")??;
    let series: Vec<u64> = buckets.iter().map(|b| b.load(Ordering::Relaxed)).collect();
    let summary = pause_summary(&series);
    eprintln!("keel bench kite: node 3 frozen for {} ms: {summary}", PAUSE.as_millis());
    write(&args.common.out, &records, &sweeps, &paused, &series, &summary)
}

/// Before the pause, the lowest bucket during it, and how long after it froze until a
/// bucket reached 90% of the level before (the others' stall).
fn pause_summary(series: &[u64]) -> String {
    let start = series.len() / 3;
    let end = start + (PAUSE.as_nanos() / BUCKET.as_nanos()) as usize;
    let before = &series[..start];
    let mean = before.iter().sum::<u64>() as f64 / before.len().max(1) as f64;
    let during = &series[start..end.min(series.len())];
    let lowest = during.iter().copied().min().unwrap_or(0);
    let back = during
        .iter()
        .skip(1)
        .position(|&b| b as f64 >= 0.9 * mean)
        .map(|i| (i + 1) * BUCKET.as_millis() as usize);
    let after = &series[end.min(series.len())..];
    let after_mean = after.iter().sum::<u64>() as f64 / after.len().max(1) as f64;
    format!(
        "{mean:.0} ops per {} ms before, lowest {lowest} while frozen, back to 90% {} after the freeze began, {after_mean:.0} after it ended",
        BUCKET.as_millis(),
        back.map_or("not within the freeze".to_string(), |ms| format!("{ms} ms"))
    )
}

fn write(
    out: &Path,
    records: &[KiteRecord],
    sweeps: &[KiteRecord],
    paused: &KiteRecord,
    series: &[u64],
    summary: &str,
) -> Result<(), String> {
    std::fs::create_dir_all(out).map_err(|e| e.to_string())?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let base = out.join(format!("kite-{stamp}"));
    let mut jsonl = String::new();
    for r in records.iter().chain(sweeps) {
        jsonl.push_str(&serde_json::to_string(r).map_err(|e| e.to_string())?);
        jsonl.push('\n');
    }
    let pause = serde_json::json!({"pause_ms": PAUSE.as_millis() as u64, "bucket_ms": BUCKET.as_millis() as u64, "ops_s": paused.ops_s, "series": series, "summary": summary});
    jsonl.push_str(&pause.to_string());
    jsonl.push('\n');
    std::fs::write(base.with_extension("jsonl"), jsonl).map_err(|e| e.to_string())?;
    let mut md = String::new();
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let _ = writeln!(md, "# Kite on Keel: throughput by mode and write ratio\n\n`{command}`\n");
    let _ = writeln!(md, "{CLIENTS} closed-loop clients over {NODES} nodes, {KEYS} keys; operations per second (p50 µs).\n");
    let _ = write!(md, "| writes |");
    for mode in MODES {
        let _ = write!(md, " {mode} |");
    }
    let _ = writeln!(md, " kite / es | kite / orca-strong |");
    let _ = writeln!(md, "|---|{}---|---|", "---|".repeat(MODES.len()));
    let mut pcts: Vec<u64> = records.iter().map(|r| r.write_pct).collect();
    pcts.dedup();
    for pct in pcts {
        let of = |mode: &str| records.iter().find(|r| r.write_pct == pct && r.mode == mode);
        let _ = write!(md, "| {pct}% |");
        for mode in MODES {
            match of(mode) {
                Some(r) => {
                    let _ = write!(md, " {:.0} ({}) |", r.ops_s, r.p50_us);
                }
                None => {
                    let _ = write!(md, " - |");
                }
            }
        }
        let ratio = |a: Option<&KiteRecord>, b: Option<&KiteRecord>| match (a, b) {
            (Some(a), Some(b)) if b.ops_s > 0.0 => format!("{:.2}x", a.ops_s / b.ops_s),
            _ => "-".into(),
        };
        let _ = writeln!(
            md,
            " {} | {} |",
            ratio(of("kite"), of("es")),
            ratio(of("kite"), of("orca-strong"))
        );
    }
    let _ = writeln!(
        md,
        "\n## Node 3 frozen for {} ms (Figure 11)\n\n`kite`, 5% writes: {summary}.\n",
        PAUSE.as_millis()
    );
    let _ = writeln!(md, "Completions per {} ms bucket: {series:?}", BUCKET.as_millis());
    std::fs::write(base.with_extension("md"), md).map_err(|e| e.to_string())?;
    eprintln!("keel bench: wrote {}.jsonl and .md", base.display());
    Ok(())
}
