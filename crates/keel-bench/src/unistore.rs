//! `keel bench suite unistore`: UniStore's causal commit against a strong-only
//! configuration across the same emulated wide-area network, on real processes.
//!
//! Three nodes stand for three data centers (one partition each), every peer message
//! delayed [`WAN_ONE_WAY_MS`] one way (`keel up --geo`'s delay across data centers). The
//! cluster hosts a geo keyspace (0) and an ORCA keyspace (1) whose writes default to
//! `durable` and reads to `linearizable`, its leader timers sized for the wide area (the
//! geo suite's). [`CLIENTS`] closed-loop clients, spread over the nodes, run the same
//! transaction shape in each mode for `--duration` seconds after `--warmup`: read one
//! key, add to another.
//!
//! - `causal`: `KEEL.TX.BEGIN`, `KEEL.TX.READ counter a`, `INCRBY b n`, `KEEL.TX.COMMIT`
//!   on the geo keyspace; the commit's latency (the paper's "commit latency", about 1.2
//!   ms) and the whole transaction's;
//! - `strong`: `MULTI`, `GET a`, `INCRBY b n`, `EXEC` on the ORCA keyspace: one log entry,
//!   durable on a majority across the wide area before it is answered (the commit is
//!   `EXEC`);
//! - `causal-2p`: `causal` on a second cluster of three data centers of two nodes each
//!   (two partitions, [`keel_server::local::WAN_ONE_WAY_MS_LOCAL`] one way inside a data
//!   center): a transaction touching both partitions commits by two-phase commit inside
//!   its data center, as in the paper's deployment.
//!
//! Then the paper's Figure 5, what tracking uniformity costs in throughput: only causal
//! transactions, 15% of them updating three items and the rest reading three, from
//! [`CLIENTS_MIX`] closed-loop clients, on 3 and then 5 data centers of one node, each
//! once as it is (`uniform`) and once with remote transactions exposed as soon as they are
//! stored (`exposed`, the negative control `unsafe_geo_expose_non_uniform`, standing for
//! the paper's baseline without uniformity).
//!
//! Results go to `<out>/unistore-<stamp>.{jsonl,md}`. Loopback TCP on two shared cores:
//! the ratio between the modes, over one wide-area round trip, is the point.

use crate::cli::SuiteArgs;
use crate::driver::resp::RespConn;
use crate::rng::Rng;
use hdrhistogram::Histogram;
use keel_server::config::KeyspaceSettings;
use keel_server::local::{LocalCluster, WAN_ONE_WAY_MS};
use keel_wire::resp::Frame;
use serde::Serialize;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

/// Nodes, one per data center.
pub const NODES: u32 = 3;
/// Concurrent clients, spread over the nodes.
pub const CLIENTS: usize = 6;
/// Keys the transactions pick from.
pub const KEYS: u64 = 1000;
/// The modes, in table order.
pub const MODES: [&str; 3] = ["causal", "strong", "causal-2p"];
/// Clients of the throughput runs (Figure 5).
pub const CLIENTS_MIX: usize = 12;
/// Percent of the throughput runs' transactions that update.
pub const UPDATE_PERCENT: u64 = 15;
/// Items each transaction of the throughput runs reads or updates.
pub const MIX_ITEMS: usize = 3;
/// The geo keyspace.
const GEO: u32 = 0;
/// The ORCA keyspace.
const ORCA: u32 = 1;

/// One mode's figures.
#[derive(Clone, Debug, Serialize)]
pub struct Record {
    /// `causal` or `strong`.
    pub mode: String,
    /// Transactions per second, all clients.
    pub tx_s: f64,
    /// Commit latency quantiles, µs (`KEEL.TX.COMMIT`; `EXEC`).
    pub commit_p50_us: u64,
    /// 90th percentile.
    pub commit_p90_us: u64,
    /// 99th percentile.
    pub commit_p99_us: u64,
    /// Whole transaction, median, µs.
    pub tx_p50_us: u64,
    /// Whole transaction, 99th percentile, µs.
    pub tx_p99_us: u64,
    /// Failed transactions.
    pub errors: u64,
}

struct Tally {
    commit: Histogram<u64>,
    tx: Histogram<u64>,
    count: u64,
    errors: u64,
}

/// Runs the suite and writes its report.
pub fn run(args: &SuiteArgs, exe: &Path) -> Result<(), String> {
    let mut records = Vec::new();
    let leader = on_cluster(exe, NODES, beside_orca, |cluster| {
        if !cluster.wait_for_replicas(GEO, crate::geo::READY_TIMEOUT) {
            return Err("the geo keyspace did not start".into());
        }
        let leader = cluster
            .wait_for_leader_in(ORCA, crate::geo::READY_TIMEOUT)
            .ok_or("the ORCA keyspace elected no leader")?;
        records.push(measure(args, cluster, "causal", GEO)?);
        records.push(measure(args, cluster, "strong", ORCA)?);
        Ok(leader)
    })?;
    on_cluster(
        exe,
        2 * NODES,
        |c| keel_server::local::geo_layout(c, NODES, 2),
        |cluster| {
            if !cluster.wait_for_replicas(GEO, crate::geo::READY_TIMEOUT) {
                return Err("the geo keyspace did not start".into());
            }
            records.push(measure(args, cluster, "causal-2p", GEO)?);
            Ok(())
        },
    )?;
    for dcs in [3, 5] {
        for exposed in [false, true] {
            let tweak = |c: &mut keel_server::ServerConfig| {
                keel_server::local::geo_layout(c, dcs, 1);
                c.testing.unsafe_geo_expose_non_uniform = exposed;
            };
            let mode = match (dcs, exposed) {
                (3, false) => "mix-uniform-3",
                (3, true) => "mix-exposed-3",
                (_, false) => "mix-uniform-5",
                (_, true) => "mix-exposed-5",
            };
            on_cluster(exe, dcs, tweak, |cluster| {
                if !cluster.wait_for_replicas(GEO, crate::geo::READY_TIMEOUT) {
                    return Err("the geo keyspace did not start".into());
                }
                records.push(measure(args, cluster, mode, GEO)?);
                Ok(())
            })?;
        }
    }
    write(&args.common.out, &records, leader)
}

/// Three data centers of one node, a geo keyspace and a strong-only ORCA keyspace whose
/// leader timers suit the wide area.
fn beside_orca(c: &mut keel_server::ServerConfig) {
    keel_server::local::geo_layout(c, NODES, 1);
    let mut orca = KeyspaceSettings::orca(ORCA);
    orca.durability_default = Some(keel_types::Durability::Durable);
    orca.read_level_default = Some(keel_types::ReadLevel::Linearizable);
    c.keyspaces = vec![KeyspaceSettings::geo(GEO), orca];
    let mark_out = crate::geo::MARK_OUT_TIMEOUT_MS;
    c.engine.mark_out_timeout_ms = Some(mark_out);
    c.engine.removal_timeout_ms = Some(5 * mark_out);
    c.engine.election_timeout_min_ms = Some(crate::geo::ELECTION_TIMEOUT_MS_MIN);
    c.engine.election_timeout_max_ms = Some(2 * crate::geo::ELECTION_TIMEOUT_MS_MIN);
}

/// Starts a cluster of `nodes` configured by `tweak`, runs `body` on it, and stops it.
fn on_cluster<T>(
    exe: &Path,
    nodes: u32,
    tweak: impl Fn(&mut keel_server::ServerConfig),
    body: impl FnOnce(&LocalCluster) -> Result<T, String>,
) -> Result<T, String> {
    let dir = crate::cluster::temp_dir("keel-unistore-bench");
    let mut cluster = LocalCluster::start(exe, nodes, &dir, None, tweak)
        .map_err(|e| format!("cannot start the cluster: {e}"))?;
    let result = body(&cluster);
    cluster.stop();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// One mode on `cluster`, in `keyspace`.
fn measure(
    args: &SuiteArgs,
    cluster: &LocalCluster,
    mode: &'static str,
    keyspace: u32,
) -> Result<Record, String> {
    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let duration = Duration::from_secs(args.common.duration);
    let record_from = Instant::now() + Duration::from_secs(args.common.warmup);
    let until = record_from + duration;
    let (seed, addrs) = (args.common.seed, cluster.client_addrs());
    let clients = if mode.starts_with("mix") { CLIENTS_MIX } else { CLIENTS };
    let tallies = crate::runner::run_clients(&runtime, clients, move |c| {
        let addr = addrs[c % addrs.len()];
        client(mode, keyspace, addr, record_from, until, seed ^ ((c as u64 + 1) << 20))
    })?;
    let record = summarize(mode, &tallies, duration)?;
    eprintln!(
        "keel bench unistore: {:<9} {:>7.0} tx/s  commit p50 {:>6} µs p99 {:>7} µs  tx p50 {:>6} µs  errors {}",
        record.mode, record.tx_s, record.commit_p50_us, record.commit_p99_us, record.tx_p50_us, record.errors
    );
    Ok(record)
}

fn summarize(mode: &str, tallies: &[Tally], duration: Duration) -> Result<Record, String> {
    let mut commit = histogram();
    let mut tx = histogram();
    for t in tallies {
        commit.add(&t.commit).map_err(|e| e.to_string())?;
        tx.add(&t.tx).map_err(|e| e.to_string())?;
    }
    let count: u64 = tallies.iter().map(|t| t.count).sum();
    Ok(Record {
        mode: mode.into(),
        tx_s: count as f64 / duration.as_secs_f64(),
        commit_p50_us: commit.value_at_quantile(0.5),
        commit_p90_us: commit.value_at_quantile(0.9),
        commit_p99_us: commit.value_at_quantile(0.99),
        tx_p50_us: tx.value_at_quantile(0.5),
        tx_p99_us: tx.value_at_quantile(0.99),
        errors: tallies.iter().map(|t| t.errors).sum(),
    })
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, crate::runner::LATENCY_US_MAX, 2).expect("bounds")
}

/// One closed-loop client until `until`, recording from `record_from`.
async fn client(
    mode: &'static str,
    keyspace: u32,
    addr: SocketAddr,
    record_from: Instant,
    until: Instant,
    seed: u64,
) -> Result<Tally, String> {
    let mut conn = RespConn::connect(addr).await.map_err(|e| e.to_string())?;
    conn.select(keyspace).await.map_err(|e| e.to_string())?;
    let mut rng = Rng::new(seed);
    let mut tally = Tally { commit: histogram(), tx: histogram(), count: 0, errors: 0 };
    while Instant::now() < until {
        let (a, b) = (format!("k{}", rng.below(KEYS)), format!("k{}", rng.below(KEYS)));
        let amount = (1 + rng.below(100)).to_string();
        let begin = Instant::now();
        let committed = match mode {
            "strong" => strong(&mut conn, &a, &b, &amount).await,
            mix if mix.starts_with("mix") => {
                let update = rng.below(100) < UPDATE_PERCENT;
                let keys: Vec<String> =
                    (0..MIX_ITEMS).map(|_| format!("k{}", rng.below(KEYS))).collect();
                mixed(&mut conn, &keys, update.then_some(amount.as_str())).await
            }
            _ => causal(&mut conn, &a, &b, &amount).await,
        };
        let done = Instant::now();
        if begin < record_from {
            continue;
        }
        match committed {
            Ok(commit_started) => {
                let us = |d: Duration| (d.as_micros() as u64).max(1);
                let _ = tally.commit.record(us(done - commit_started));
                let _ = tally.tx.record(us(done - begin));
                tally.count += 1;
            }
            Err(_) => tally.errors += 1,
        }
    }
    Ok(tally)
}

/// Whether `frame` is an error.
fn check(frame: Frame) -> Result<Frame, String> {
    match frame {
        Frame::Error(line) => Err(String::from_utf8_lossy(&line).into_owned()),
        other => Ok(other),
    }
}

/// One causal transaction; when its commit was sent.
async fn causal(conn: &mut RespConn, a: &str, b: &str, amount: &str) -> Result<Instant, String> {
    let call = |r: Result<Frame, crate::driver::DriverError>| r.map_err(|e| e.to_string());
    check(call(conn.call(&[b"KEEL.TX.BEGIN"]).await)?)?;
    check(call(conn.call(&[b"KEEL.TX.READ", b"counter", a.as_bytes()]).await)?)?;
    check(call(conn.call(&[b"INCRBY", b.as_bytes(), amount.as_bytes()]).await)?)?;
    let commit = Instant::now();
    check(call(conn.call(&[b"KEEL.TX.COMMIT"]).await)?)?;
    Ok(commit)
}

/// One transaction of the throughput runs: three counters read, or (`add`) three
/// increments; when its commit was sent.
async fn mixed(conn: &mut RespConn, keys: &[String], add: Option<&str>) -> Result<Instant, String> {
    let call = |r: Result<Frame, crate::driver::DriverError>| r.map_err(|e| e.to_string());
    check(call(conn.call(&[b"KEEL.TX.BEGIN"]).await)?)?;
    for key in keys {
        let frame = match add {
            Some(amount) => conn.call(&[b"INCRBY", key.as_bytes(), amount.as_bytes()]).await,
            None => conn.call(&[b"KEEL.TX.READ", b"counter", key.as_bytes()]).await,
        };
        check(call(frame)?)?;
    }
    let commit = Instant::now();
    check(call(conn.call(&[b"KEEL.TX.COMMIT"]).await)?)?;
    Ok(commit)
}

/// One strong transaction (`MULTI` ... `EXEC`, durable and linearizable); when its `EXEC`
/// was sent.
async fn strong(conn: &mut RespConn, a: &str, b: &str, amount: &str) -> Result<Instant, String> {
    let call = |r: Result<Frame, crate::driver::DriverError>| r.map_err(|e| e.to_string());
    check(call(conn.call(&[b"MULTI"]).await)?)?;
    check(call(conn.call(&[b"GET", a.as_bytes()]).await)?)?;
    check(call(conn.call(&[b"INCRBY", b.as_bytes(), amount.as_bytes()]).await)?)?;
    let commit = Instant::now();
    match check(call(conn.call(&[b"EXEC"]).await)?)? {
        Frame::Array(_) => Ok(commit),
        other => Err(format!("EXEC answered {other:?}")),
    }
}

fn write(out: &Path, records: &[Record], leader: usize) -> Result<(), String> {
    std::fs::create_dir_all(out).map_err(|e| e.to_string())?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let base = out.join(format!("unistore-{stamp}"));
    let mut jsonl = String::new();
    for r in records {
        jsonl.push_str(&serde_json::to_string(r).map_err(|e| e.to_string())?);
        jsonl.push('\n');
    }
    std::fs::write(base.with_extension("jsonl"), jsonl).map_err(|e| e.to_string())?;
    let mut md = String::new();
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let _ = writeln!(md, "# UniStore on Keel: causal commit against strong-only, one wide area\n");
    let _ = writeln!(md, "`{command}`\n");
    let _ = writeln!(
        md,
        "{NODES} data centers, {WAN_ONE_WAY_MS} ms one way between them; {CLIENTS} closed-loop clients spread over the nodes. `causal` and `strong`: one node per data center, the ORCA leader at node {}; `causal-2p`: two nodes per data center, {} ms one way between them. Latencies in µs.\n",
        leader + 1,
        keel_server::local::WAN_ONE_WAY_MS_LOCAL
    );
    let _ =
        writeln!(md, "| mode | tx/s | commit p50 | p90 | p99 | transaction p50 | p99 | errors |");
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
    let (latency, mix): (Vec<&Record>, Vec<&Record>) =
        records.iter().partition(|r| !r.mode.starts_with("mix"));
    for r in &latency {
        let _ = writeln!(
            md,
            "| {} | {:.0} | {} | {} | {} | {} | {} | {} |",
            r.mode,
            r.tx_s,
            r.commit_p50_us,
            r.commit_p90_us,
            r.commit_p99_us,
            r.tx_p50_us,
            r.tx_p99_us,
            r.errors
        );
    }
    if let [causal, strong, two] = latency[..] {
        let ratio = |c: &Record| strong.commit_p50_us as f64 / c.commit_p50_us.max(1) as f64;
        let _ = writeln!(
            md,
            "\nStrong commit / causal commit at the median: {:.0}x (one partition), {:.0}x (two).",
            ratio(causal),
            ratio(two)
        );
    }
    let _ = writeln!(
        md,
        "\n## Throughput (Figure 5)\n\n{CLIENTS_MIX} clients, causal transactions only, {UPDATE_PERCENT}% updating {MIX_ITEMS} counters, the rest reading {MIX_ITEMS}; one node per data center.\n"
    );
    let _ = writeln!(md, "| data centers | uniform tx/s | exposed tx/s | cost of uniformity |");
    let _ = writeln!(md, "|---|---|---|---|");
    for dcs in [3, 5] {
        let of = |name: &str| mix.iter().find(|r| r.mode == format!("mix-{name}-{dcs}"));
        if let (Some(u), Some(e)) = (of("uniform"), of("exposed")) {
            let cost = 100.0 * (1.0 - u.tx_s / e.tx_s.max(f64::MIN_POSITIVE));
            let _ = writeln!(md, "| {dcs} | {:.0} | {:.0} | {cost:.1}% |", u.tx_s, e.tx_s);
        }
    }
    std::fs::write(base.with_extension("md"), md).map_err(|e| e.to_string())?;
    eprintln!("keel bench: wrote {}.jsonl and .md", base.display());
    Ok(())
}
