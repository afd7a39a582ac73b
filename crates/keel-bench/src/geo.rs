//! The geo suite: the ORCA paper's §5.2.3 (Figures 11–12) on one machine.
//!
//! Five Keel nodes stand for five replicas in three sites (nodes 1–2, 3–4 and 5). Peer
//! messages are delayed by the server's test-only `[geo] peer_delay_ms`
//! ([`PEER_ONE_WAY_MS_LOCAL`] inside a site, [`PEER_ONE_WAY_MS_WAN`] across). Each client
//! lives beside one node (client `i` beside node `i mod 5`); before each request it sleeps
//! the round trip from its site to the node it contacts ([`CLIENT_RTT_LOCAL`],
//! [`CLIENT_RTT_WAN`]); the latency it records is that round trip at its nominal length
//! plus the measured time from sending the request to its reply.
//! Reads go to the nearest node (to the leader for `strong`); writes go to the leader.
//!
//! Workloads ([`WORKLOADS`]): read-only, write-only, and two mixes (the paper's
//! Figure 12(c), (d), whose mixes it does not state): 95% reads and 5% writes, and
//! 50/50. In a mix each operation is drawn from the client's seeded stream
//! ([`is_write`]); reads and writes are recorded apart as well as together.
//!
//! Layout: [`Topology`] (pure: sites, delays, origins), [`run`] (clusters, clients,
//! histograms), [`markdown`], [`cdf_points`] and [`report`] (the report and its plots).

use crate::cli::SuiteArgs;
use crate::driver::resp::RespConn;
use crate::plot::{Plot, Series};
use crate::rng::Rng;
use hdrhistogram::Histogram;
use keel_server::local::LocalCluster;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

/// Nodes in the geo cluster.
pub const NODES: usize = 5;
/// Site of each node (index = node id − 1): two, two and one.
pub const SITES: [usize; NODES] = [0, 0, 1, 1, 2];
/// Clients in the suite (the paper's 24, about five beside each node).
pub const CLIENTS: usize = 24;
/// One-way peer delay inside a site, in ms.
pub const PEER_ONE_WAY_MS_LOCAL: u64 = keel_server::local::WAN_ONE_WAY_MS_LOCAL;
/// One-way peer delay across sites, in ms (the paper's WAN round trip is ~35 ms).
pub const PEER_ONE_WAY_MS_WAN: u64 = keel_server::local::WAN_ONE_WAY_MS;
/// Emulated client round trip to a node in its own site.
pub const CLIENT_RTT_LOCAL: Duration = Duration::from_millis(2);
/// Emulated client round trip to a node in another site.
pub const CLIENT_RTT_WAN: Duration = Duration::from_millis(35);
/// Keys loaded before the runs (every read finds one).
pub const KEYS: u64 = 1000;
/// Bytes per value.
pub const VALUE_BYTES: usize = 100;
/// Client origins, in report order (see [`Topology::origin`]).
pub const ORIGINS: [&str; 3] = ["leader", "follower-leader-site", "follower-other-site"];
/// Configurations: name, write durability, read level, reads at the leader.
pub const CONFIGS: [(&str, &str, &str, bool); 3] = [
    ("strong", "durable", "linearizable", true),
    ("weak", "memory", "any", false),
    ("cad", "memory", "monotonic", false),
];
/// Workloads, in run order: name, percent of operations that are writes, title.
pub const WORKLOADS: [(&str, u64, &str); 4] = [
    ("read-only", 0, "read-only"),
    ("write-only", 100, "write-only"),
    ("mixed-read-heavy", 5, "mixed, 95% reads / 5% writes"),
    ("mixed-write-heavy", 50, "mixed, 50% reads / 50% writes"),
];
/// Operation kinds a record may cover: reads, writes, or both (a mix's total).
pub const OPS: [&str; 3] = ["all", "read", "write"];

/// The workloads `--workloads` names (comma-separated; `None`: all four), in run order.
pub fn select_workloads(arg: Option<&str>) -> Result<Vec<(&'static str, u64)>, String> {
    let Some(arg) = arg else { return Ok(WORKLOADS.iter().map(|w| (w.0, w.1)).collect()) };
    let mut names = Vec::new();
    for name in arg.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if !WORKLOADS.iter().any(|w| w.0 == name) {
            let known: Vec<&str> = WORKLOADS.iter().map(|w| w.0).collect();
            return Err(format!("unknown geo workload {name:?}: expected {}", known.join(", ")));
        }
        names.push(name);
    }
    if names.is_empty() {
        return Err("--workloads names no geo workload".into());
    }
    Ok(WORKLOADS.iter().filter(|w| names.contains(&w.0)).map(|w| (w.0, w.1)).collect())
}

/// Whether the next operation of a stream with `write_pct` percent writes is a write.
/// Pure workloads (0 and 100) draw nothing from `rng`.
pub fn is_write(rng: &mut Rng, write_pct: u64) -> bool {
    match write_pct {
        0 => false,
        100.. => true,
        pct => rng.below(100) < pct,
    }
}

/// Follower lease past its last grant: the default 100 ms leaves a lease granted over a
/// 34 ms round trip little time, so the suite uses a WAN-sized one.
pub const MARK_OUT_TIMEOUT_MS: u64 = 300;
/// Lower bound of the election timeout (its upper bound is twice it).
pub const ELECTION_TIMEOUT_MS_MIN: u64 = 1000;
/// How long the cluster may take to elect a leader.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);

const _: () = assert!(CLIENTS >= NODES && PEER_ONE_WAY_MS_WAN <= 10_000);

/// Where the sites are and what each link costs.
#[derive(Clone, Copy, Debug)]
pub struct Topology;

impl Topology {
    /// `geo.peer_delay_ms` of node `id` (1-based): the one-way delay to every other member.
    pub fn peer_delays(id: u32) -> BTreeMap<String, u64> {
        assert!((1..=NODES as u32).contains(&id), "node {id} outside the geo cluster");
        let me = SITES[id as usize - 1];
        (1..=NODES as u32)
            .filter(|&to| to != id)
            .map(|to| {
                let local = SITES[to as usize - 1] == me;
                (to.to_string(), if local { PEER_ONE_WAY_MS_LOCAL } else { PEER_ONE_WAY_MS_WAN })
            })
            .collect()
    }

    /// The node (index) client `client` lives beside.
    pub fn home(client: usize) -> usize {
        client % NODES
    }

    /// The emulated round trip from client `client` to node `node` (index).
    pub fn client_rtt(client: usize, node: usize) -> Duration {
        assert!(node < NODES);
        if SITES[Self::home(client)] == SITES[node] {
            CLIENT_RTT_LOCAL
        } else {
            CLIENT_RTT_WAN
        }
    }

    /// Where client `client` lives relative to the leader: `"leader"` (beside it),
    /// `"follower-leader-site"` (beside a follower in the leader's site) or
    /// `"follower-other-site"` (beside a follower in another site).
    pub fn origin(client: usize, leader: usize) -> &'static str {
        assert!(leader < NODES);
        let home = Self::home(client);
        if home == leader {
            "leader"
        } else if SITES[home] == SITES[leader] {
            "follower-leader-site"
        } else {
            "follower-other-site"
        }
    }
}

/// One measured group: a configuration, a workload, an origin and an operation kind.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct GeoRecord {
    /// `strong`, `weak` or `cad`.
    pub config: String,
    /// One of [`WORKLOADS`].
    pub workload: String,
    /// Where the issuing clients live (one of [`ORIGINS`]).
    pub origin: String,
    /// `read`, `write` or (a mix's total) `all`; empty in files written before the mixes,
    /// which [`report`] reads as the pure workload's kind.
    #[serde(default)]
    pub op: String,
    /// Operations recorded.
    pub ops: u64,
    /// Operations that failed.
    pub errors: u64,
    /// Latency percentiles in µs: p50, p90, p99, p99.9, max.
    pub p50_us: u64,
    /// 90th percentile.
    pub p90_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
    /// Largest.
    pub max_us: u64,
    /// The CDF: (latency µs, cumulative fraction) at every percent.
    pub cdf: Vec<(u64, f64)>,
}

/// The CDF of `h`: its value at each whole percent, 0..=100.
pub fn cdf_points(h: &Histogram<u64>) -> Vec<(u64, f64)> {
    let points: Vec<(u64, f64)> = (0..=100u32)
        .map(|p| (h.value_at_quantile(f64::from(p) / 100.0), f64::from(p) / 100.0))
        .collect();
    assert!(points.windows(2).all(|w| w[0].0 <= w[1].0), "a CDF never decreases");
    points
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

struct ClientJob {
    client: usize,
    addrs: Vec<SocketAddr>,
    leader: usize,
    write_pct: u64,
    durability: &'static str,
    level: &'static str,
    reads_at_leader: bool,
    record_from: Instant,
    until: Instant,
    seed: u64,
}

/// What one client measured.
struct ClientResult {
    reads: Histogram<u64>,
    writes: Histogram<u64>,
    errors: u64,
}

/// A connection to one node, opened on first use and again after a broken one.
struct Link {
    addr: SocketAddr,
    rtt: Duration,
    conn: Option<RespConn>,
}

/// One closed-loop client.
async fn client(job: ClientJob) -> ClientResult {
    let read_node = if job.reads_at_leader { job.leader } else { Topology::home(job.client) };
    let link = |node: usize| Link {
        addr: job.addrs[node],
        rtt: Topology::client_rtt(job.client, node),
        conn: None,
    };
    let (mut read_link, mut write_link) = (link(read_node), link(job.leader));
    let mut out = ClientResult { reads: histogram(), writes: histogram(), errors: 0 };
    let mut rng = Rng::new(job.seed ^ job.client as u64);
    let value = vec![b'v'; VALUE_BYTES];
    let ops_max = u64::MAX; // bounded by time: `until`
    for _ in 0..ops_max {
        let start = Instant::now();
        if start >= job.until {
            break;
        }
        let key = format!("geo{}", rng.below(KEYS));
        let write = is_write(&mut rng, job.write_pct);
        let link = if write { &mut write_link } else { &mut read_link };
        let conn = match &mut link.conn {
            Some(conn) => conn,
            None => match RespConn::connect(link.addr).await {
                Ok(conn) => link.conn.insert(conn),
                Err(_) => {
                    out.errors += 1;
                    break;
                }
            },
        };
        tokio::time::sleep(link.rtt).await; // the emulated network, before sending
                                            // Charged at its nominal length: tokio's timer rounds a 2 ms sleep up to about 3 ms,
                                            // an artefact of the emulator, not of the system measured.
        let sent = Instant::now();
        let reply = if write {
            conn.call(&[b"SET", key.as_bytes(), &value, b"DURABILITY", job.durability.as_bytes()])
                .await
        } else {
            conn.call(&[b"GET", key.as_bytes(), b"LEVEL", job.level.as_bytes()]).await
        };
        if start < job.record_from {
            continue;
        }
        match reply {
            Ok(_) => {
                let h = if write { &mut out.writes } else { &mut out.reads };
                h.saturating_record((link.rtt + sent.elapsed()).as_micros() as u64);
            }
            Err(e) => {
                out.errors += 1;
                if e.needs_reconnect() {
                    link.conn = None; // reopened before the next operation on this link
                }
            }
        }
    }
    out
}

async fn load(addr: SocketAddr, durability: &str) -> Result<(), String> {
    let mut conn = RespConn::connect(addr).await.map_err(|e| e.to_string())?;
    let value = vec![b'v'; VALUE_BYTES];
    for k in 0..KEYS {
        let key = format!("geo{k}");
        conn.call(&[b"SET", key.as_bytes(), &value, b"DURABILITY", durability.as_bytes()])
            .await
            .map_err(|e| format!("load: {e}"))?;
    }
    Ok(())
}

/// The records of one workload's client results: per origin, reads and writes apart
/// and, in a mix, together. Errors count towards `all` (a pure workload's only kind).
/// `leader` is the leader's node index.
fn group(
    config: &str,
    workload: &str,
    write_pct: u64,
    leader: usize,
    results: &[ClientResult],
) -> Vec<GeoRecord> {
    let mut records = Vec::new();
    for origin in ORIGINS {
        let mut by_op: BTreeMap<&str, Histogram<u64>> =
            OPS.iter().map(|op| (*op, histogram())).collect();
        let mut errors = 0;
        let mut clients = 0;
        for (c, result) in results.iter().enumerate() {
            if Topology::origin(c, leader) == origin {
                clients += 1;
                errors += result.errors;
                for (op, h) in [("read", &result.reads), ("write", &result.writes)] {
                    by_op.get_mut(op).expect("an op").add(h).expect("same bounds");
                    by_op.get_mut("all").expect("all").add(h).expect("same bounds");
                }
            }
        }
        if clients == 0 {
            continue; // no client beside such a node: the leader's site has one node
        }
        let ops: &[&str] = match write_pct {
            0 => &["read"],
            100.. => &["write"],
            _ => &OPS,
        };
        for &op in ops {
            let op_errors = if op == "all" || ops.len() == 1 { errors } else { 0 };
            records.push(record(config, workload, origin, op, &by_op[op], op_errors));
        }
    }
    records
}

/// Runs one configuration on a fresh cluster, each of `workloads` in turn.
fn run_config(
    exe: &Path,
    config: (&'static str, &'static str, &'static str, bool),
    workloads: &[(&'static str, u64)],
    args: &SuiteArgs,
) -> Result<Vec<GeoRecord>, String> {
    let (name, durability, level, reads_at_leader) = config;
    let dir = crate::cluster::temp_dir("keel-geo");
    let cluster = LocalCluster::start(exe, NODES as u32, &dir, None, |c| {
        c.geo.peer_delay_ms = Topology::peer_delays(c.node_id);
        c.engine.mark_out_timeout_ms = Some(MARK_OUT_TIMEOUT_MS);
        c.engine.removal_timeout_ms = Some(5 * MARK_OUT_TIMEOUT_MS);
        c.engine.election_timeout_min_ms = Some(ELECTION_TIMEOUT_MS_MIN);
        c.engine.election_timeout_max_ms = Some(2 * ELECTION_TIMEOUT_MS_MIN);
    })
    .map_err(|e| format!("cannot start the geo cluster: {e}"))?;
    let leader =
        cluster.wait_for_leader(READY_TIMEOUT).ok_or("the geo cluster elected no leader")?;
    let addrs = cluster.client_addrs();
    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    runtime.block_on(load(addrs[leader], "memory"))?; // fsynced in the background, during warm-up
    let mut records = Vec::new();
    for &(workload, write_pct) in workloads {
        let record_from = Instant::now() + Duration::from_secs(args.common.warmup);
        let until = record_from + Duration::from_secs(args.common.duration);
        let jobs: Vec<ClientJob> = (0..CLIENTS)
            .map(|client| ClientJob {
                client,
                addrs: addrs.clone(),
                leader,
                write_pct,
                durability,
                level,
                reads_at_leader,
                record_from,
                until,
                seed: args.common.seed,
            })
            .collect();
        let results = runtime.block_on(async {
            let tasks: Vec<_> = jobs.into_iter().map(|j| tokio::spawn(client(j))).collect();
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.expect("a client task does not panic"));
            }
            out
        });
        records.extend(group(name, workload, write_pct, leader, &results));
        eprintln!("keel bench geo: {name} {workload} done (leader n{})", leader + 1);
    }
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(records)
}

fn record(
    config: &str,
    workload: &str,
    origin: &str,
    op: &str,
    h: &Histogram<u64>,
    errors: u64,
) -> GeoRecord {
    GeoRecord {
        config: config.into(),
        workload: workload.into(),
        origin: origin.into(),
        op: op.into(),
        ops: h.len(),
        errors,
        p50_us: h.value_at_quantile(0.5),
        p90_us: h.value_at_quantile(0.9),
        p99_us: h.value_at_quantile(0.99),
        p999_us: h.value_at_quantile(0.999),
        max_us: h.max(),
        cdf: cdf_points(h),
    }
}

/// The record of `config`'s `op`s in `workload` from `origin`, if it measured any.
fn find<'a>(
    records: &'a [GeoRecord],
    config: &str,
    workload: &str,
    op: &str,
    origin: &str,
) -> Option<&'a GeoRecord> {
    records
        .iter()
        .find(|r| r.config == config && r.workload == workload && r.op == op && r.origin == origin)
        .filter(|r| r.ops > 0)
}

/// Median latency of `config`'s `op`s in `workload` from `origin`, if measured.
fn median(
    records: &[GeoRecord],
    config: &str,
    workload: &str,
    op: &str,
    origin: &str,
) -> Option<u64> {
    find(records, config, workload, op, origin).map(|r| r.p50_us)
}

/// `top / bottom` as `12.3x`, or `n/a`.
fn ratio(top: Option<u64>, bottom: Option<u64>) -> String {
    match (top, bottom) {
        (Some(t), Some(b)) if b > 0 => format!("{:.1}x", t as f64 / b as f64),
        _ => "n/a".into(),
    }
}

/// The workloads of `records`, in run order.
fn workloads_of(records: &[GeoRecord]) -> Vec<&'static str> {
    WORKLOADS.iter().map(|w| w.0).filter(|w| records.iter().any(|r| r.workload == *w)).collect()
}

/// The Markdown report: a percentile table, the paper's ratios, and how reads in the
/// mixes compare with reads alone.
pub fn markdown(records: &[GeoRecord], command: &str) -> String {
    let mut md = String::from("# Geo (ORCA §5.2.3)\n\n");
    let _ = writeln!(md, "Command: `{command}`\n");
    let mixes: Vec<String> = WORKLOADS
        .iter()
        .filter(|w| w.1 > 0 && w.1 < 100)
        .map(|w| format!("`{}`: {}", w.0, w.2))
        .collect();
    let _ = writeln!(
        md,
        "Workloads: {}. In a mix, `op` is `read`, `write` or `all` (both); errors count \
         under `all`.\n",
        mixes.join("; ")
    );
    md.push_str("| config | workload | origin | op | ops | errors | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms |\n");
    md.push_str("|---|---|---|---|---|---|---|---|---|---|---|\n");
    let ms = |us: u64| us as f64 / 1000.0;
    for r in records {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
            r.config,
            r.workload,
            r.origin,
            r.op,
            r.ops,
            r.errors,
            ms(r.p50_us),
            ms(r.p90_us),
            ms(r.p99_us),
            ms(r.p999_us),
            ms(r.max_us)
        );
    }
    md.push_str("\n## Median ratios (strong / other)\n\n| workload | op | origin | strong / weak | strong / cad |\n|---|---|---|---|---|\n");
    for workload in workloads_of(records) {
        for op in OPS {
            if !records.iter().any(|r| r.workload == workload && r.op == op) {
                continue;
            }
            for origin in ORIGINS {
                let m = |config: &str| median(records, config, workload, op, origin);
                let (weak, cad) = (ratio(m("strong"), m("weak")), ratio(m("strong"), m("cad")));
                if weak == "n/a" && cad == "n/a" {
                    continue; // no such origin in this run (the leader's site has one node)
                }
                let _ = writeln!(md, "| {workload} | {op} | {origin} | {weak} | {cad} |");
            }
        }
    }
    let mixed: Vec<&str> = workloads_of(records)
        .into_iter()
        .filter(|w| records.iter().any(|r| r.workload == *w && r.op == "all"))
        .collect();
    if !mixed.is_empty() && records.iter().any(|r| r.workload == "read-only") {
        md.push_str(
            "\n## Reads beside writes (read latency in the mix / in read-only)\n\n\
             | config | origin | workload | p50 | p90 | p99 |\n|---|---|---|---|---|---|\n",
        );
        for (config, ..) in CONFIGS {
            for origin in ORIGINS {
                let Some(alone) = find(records, config, "read-only", "read", origin) else {
                    continue;
                };
                for workload in &mixed {
                    let Some(mix) = find(records, config, workload, "read", origin) else {
                        continue;
                    };
                    let q = |f: fn(&GeoRecord) -> u64| ratio(Some(f(mix)), Some(f(alone)));
                    let (p50, p90, p99) = (q(|r| r.p50_us), q(|r| r.p90_us), q(|r| r.p99_us));
                    let _ = writeln!(
                        md,
                        "| {config} | {origin} | {workload} | {p50} | {p90} | {p99} |"
                    );
                }
            }
        }
    }
    md
}

/// The CDF plot of `workload` (every operation of a mix together): one series per
/// configuration and origin, x in ms.
pub fn cdf_plot(records: &[GeoRecord], workload: &str) -> Plot {
    let title = WORKLOADS.iter().find(|w| w.0 == workload).map_or(workload, |w| w.2);
    let series = records
        .iter()
        .filter(|r| r.workload == workload && (r.op == "all" || !is_mixed(workload)) && r.ops > 0)
        .map(|r| Series {
            name: format!("{}, {}", r.config, r.origin),
            points: r.cdf.iter().map(|&(us, f)| (us as f64 / 1000.0, f)).collect(),
        })
        .take(crate::plot::SERIES_MAX)
        .collect();
    Plot {
        title: format!("Geo, {title}: latency CDF by config and client origin"),
        x_title: "latency (ms)".into(),
        y_title: "cumulative fraction".into(),
        log_y: false,
        x_labels: None,
        series,
    }
}

fn is_mixed(workload: &str) -> bool {
    WORKLOADS.iter().any(|w| w.0 == workload && w.1 > 0 && w.1 < 100)
}

/// Writes `<dir>/<stem>.md` and a CDF PNG per workload; returns the Markdown.
fn write_report(
    dir: &Path,
    stem: &str,
    records: &[GeoRecord],
    command: &str,
) -> Result<String, String> {
    let mut md = markdown(records, command);
    for workload in workloads_of(records) {
        let png = cdf_plot(records, workload).to_png();
        let file = format!("{stem}-cdf-{workload}.png");
        std::fs::write(dir.join(&file), png).map_err(|e| e.to_string())?;
        let what = if is_mixed(workload) { "reads and writes together; " } else { "" };
        let _ = write!(
            md,
            "\n## CDF, {workload}\n\n![{workload}]({file})\n\nx: latency (ms), y: cumulative \
             fraction ({what}the legend in the plot names each configuration and client origin).\n"
        );
    }
    std::fs::write(dir.join(format!("{stem}.md")), &md).map_err(|e| e.to_string())?;
    Ok(md)
}

/// Writes `records` to `<out>/<prefix>-<unix time>.jsonl`, one JSON object a line;
/// returns the file's stem and the command line that ran (for the report).
pub fn write_jsonl<R: serde::Serialize>(
    out: &Path,
    prefix: &str,
    records: &[R],
) -> Result<(String, String), String> {
    std::fs::create_dir_all(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let stem = format!("{prefix}-{stamp}");
    let jsonl: String = records
        .iter()
        .map(|r| serde_json::to_string(r).expect("a record serializes") + "\n")
        .collect();
    std::fs::write(out.join(format!("{stem}.jsonl")), jsonl).map_err(|e| e.to_string())?;
    Ok((stem, std::env::args().collect::<Vec<_>>().join(" ")))
}

/// Runs `keel bench suite geo`: every configuration on the workloads `--workloads` names
/// (default: all four), then writes `<out>/geo-<time>.{jsonl,md}` and a CDF PNG per
/// workload.
pub fn run(args: &SuiteArgs, exe: &Path) -> Result<(), String> {
    let workloads = select_workloads(args.workloads.as_deref())?;
    let mut records = Vec::new();
    for config in CONFIGS {
        records.extend(run_config(exe, config, &workloads, args)?);
    }
    let out = &args.common.out;
    let (stem, command) = write_jsonl(out, "geo", &records)?;
    let md = write_report(out, &stem, &records, &command)?;
    print!("{md}");
    eprintln!("keel bench: wrote {}.jsonl and .md", out.join(&stem).display());
    Ok(())
}

/// Reads a geo `.jsonl`; records written before the mixes get their pure workload's `op`.
pub fn parse_records(text: &str) -> Result<Vec<GeoRecord>, String> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let mut r: GeoRecord = serde_json::from_str(l).map_err(|e| e.to_string())?;
            if r.op.is_empty() {
                r.op = if r.workload == "write-only" { "write" } else { "read" }.into();
            }
            Ok(r)
        })
        .collect()
}

/// `keel bench report geo-*.jsonl`: rewrites the Markdown and the CDF PNGs beside the
/// file, keeping the command an earlier Markdown names.
pub fn report(file: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let records = parse_records(&text).map_err(|e| format!("{}: {e}", file.display()))?;
    let stem = file.file_stem().map_or("geo".into(), |s| s.to_string_lossy().into_owned());
    let dir = file.parent().unwrap_or(Path::new("."));
    let command = crate::suite::recorded_command(dir, &stem);
    write_report(dir, &stem, &records, &command)?;
    eprintln!("keel bench: wrote {}", dir.join(format!("{stem}.md")).display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topology_has_three_sites_and_no_majority_site() {
        let d = Topology::peer_delays(1);
        assert_eq!(d.len(), NODES - 1);
        assert_eq!(d["2"], PEER_ONE_WAY_MS_LOCAL);
        assert_eq!(d["5"], PEER_ONE_WAY_MS_WAN);
        assert!(!d.contains_key("1"));
        for site in 0..3 {
            assert!(SITES.iter().filter(|&&s| s == site).count() <= NODES / 2);
        }
        assert_eq!(Topology::client_rtt(0, 1), CLIENT_RTT_LOCAL);
        assert_eq!(Topology::client_rtt(0, 4), CLIENT_RTT_WAN);
        let near_leader = (0..CLIENTS).filter(|&c| Topology::origin(c, 2) == "leader").count();
        assert_eq!(near_leader, 5);
        assert_eq!(Topology::origin(3, 2), "follower-leader-site");
        assert_eq!(Topology::origin(0, 2), "follower-other-site");
    }

    #[test]
    fn cdf_and_ratios_follow_the_histograms() {
        let mut fast = histogram();
        let mut slow = histogram();
        for v in 1..=100u64 {
            fast.record(2000 + v).unwrap();
            slow.record(35_000 + v).unwrap();
        }
        let cdf = cdf_points(&slow);
        assert_eq!(cdf.len(), 101);
        assert!(cdf[0].0 >= 34_900 && cdf[0].0 <= cdf[50].0 && cdf[100].1 == 1.0);
        let records = vec![
            record("strong", "read-only", "follower-other-site", "read", &slow, 0),
            record("cad", "read-only", "follower-other-site", "read", &fast, 0),
        ];
        let md = markdown(&records, "keel bench suite geo");
        assert!(md.contains("| read-only | read | follower-other-site | n/a | 17.1x |"), "{md}");
        assert!(!md.contains("Reads beside writes"), "no mix, no mix table");
    }

    #[test]
    fn workloads_are_selected_by_name_in_run_order() {
        let all = select_workloads(None).unwrap();
        assert_eq!(all.len(), 4);
        assert_eq!(all[2], ("mixed-read-heavy", 5));
        let two = select_workloads(Some("mixed-write-heavy,read-only")).unwrap();
        assert_eq!(two, [("read-only", 0), ("mixed-write-heavy", 50)]);
        assert!(select_workloads(Some("a")).unwrap_err().contains("mixed-read-heavy"));
        assert!(select_workloads(Some(",")).is_err());
    }

    #[test]
    fn mixes_draw_their_share_of_writes_and_pure_workloads_draw_nothing() {
        for (pct, lo, hi) in [(5u64, 400, 600), (50, 4_800, 5_200)] {
            let mut rng = Rng::new(7);
            let writes = (0..10_000).filter(|_| is_write(&mut rng, pct)).count();
            assert!((lo..=hi).contains(&writes), "{pct}%: {writes} writes in 10000");
        }
        let (mut a, mut b) = (Rng::new(3), Rng::new(3));
        assert!(!is_write(&mut a, 0) && is_write(&mut a, 100));
        assert_eq!(a.next_u64(), b.next_u64(), "a pure workload keeps the key stream");
    }

    fn result(read_us: u64, write_us: u64, errors: u64) -> ClientResult {
        let (mut reads, mut writes) = (histogram(), histogram());
        reads.record(read_us).unwrap();
        writes.record(write_us).unwrap();
        ClientResult { reads, writes, errors }
    }

    #[test]
    fn a_mix_is_split_by_origin_and_by_operation() {
        // Leader n3 (index 2): five clients beside it, five beside n4 (its site), the
        // other fourteen beside n1, n2 and n5 in other sites.
        let results: Vec<ClientResult> = (0..CLIENTS)
            .map(|c| match Topology::origin(c, 2) {
                "leader" => result(2_000, 40_000, 0),
                "follower-leader-site" => result(3_000, 41_000, 1),
                _ => result(4_000, 75_000, 0),
            })
            .collect();
        let records = group("strong", "mixed-write-heavy", 50, 2, &results);
        assert_eq!(records.len(), ORIGINS.len() * OPS.len());
        let find = |origin: &str, op: &str| {
            records.iter().find(|r| r.origin == origin && r.op == op).expect("a record")
        };
        let leader = find("leader", "read");
        assert_eq!((leader.ops, leader.p50_us / 100), (5, 20));
        let far = find("follower-other-site", "all");
        assert_eq!(far.ops, 2 * 14, "fourteen clients, a read and a write each");
        assert_eq!(find("follower-other-site", "write").p50_us / 1000, 75);
        assert_eq!(find("follower-leader-site", "all").errors, 5);
        assert_eq!(find("follower-leader-site", "read").errors, 0);
        // A pure workload keeps one kind; the lone node's site has no second origin.
        let pure = group("cad", "read-only", 0, 4, &results);
        assert_eq!(pure.iter().map(|r| r.op.as_str()).collect::<Vec<_>>(), ["read", "read"]);
    }

    #[test]
    fn the_report_compares_reads_in_a_mix_with_reads_alone() {
        let h = |us: u64| {
            let mut h = histogram();
            h.record(us).unwrap();
            h
        };
        let leader = "leader";
        let records = vec![
            record("strong", "read-only", leader, "read", &h(2_000), 0),
            record("strong", "mixed-read-heavy", leader, "all", &h(6_000), 0),
            record("strong", "mixed-read-heavy", leader, "read", &h(5_000), 0),
            record("strong", "mixed-read-heavy", leader, "write", &h(40_000), 0),
            record("cad", "mixed-read-heavy", leader, "read", &h(2_500), 0),
        ];
        let md = markdown(&records, "keel bench suite geo");
        assert!(md.contains("| mixed-read-heavy | read | leader | n/a | 2.0x |"), "{md}");
        assert!(md.contains("| strong | leader | mixed-read-heavy | 2.5x | 2.5x | 2.5x |"), "{md}");
        assert!(!md.contains("| cad | leader |"), "cad has no read-only run: {md}");
        assert!(!md.contains("follower-leader-site"), "no such origin, no rows: {md}");
        let plot = cdf_plot(&records, "mixed-read-heavy");
        let names: Vec<&str> = plot.series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["strong, leader"], "a mix's CDF plots all operations");
        assert!(plot.title.contains("95% reads"));
    }

    #[test]
    fn files_from_before_the_mixes_read_as_pure_workloads() {
        let line = r#"{"config":"weak","workload":"write-only","origin":"leader","ops":1,
            "errors":0,"p50_us":1,"p90_us":1,"p99_us":1,"p999_us":1,"max_us":1,"cdf":[[1,1.0]]}"#;
        let records = parse_records(&line.replace('\n', "")).unwrap();
        assert_eq!(records[0].op, "write");
    }
}
