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
//! Layout: [`Topology`] (pure: sites, delays, origins), [`run`] (clusters, clients,
//! histograms), [`markdown`] and [`cdf_points`] (the report).

use crate::cli::SuiteArgs;
use crate::driver::resp::RespConn;
use crate::plot::{line_plot, PALETTE};
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
pub const PEER_ONE_WAY_MS_LOCAL: u64 = 1;
/// One-way peer delay across sites, in ms (the paper's WAN round trip is ~35 ms).
pub const PEER_ONE_WAY_MS_WAN: u64 = 17;
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

/// One measured group: a configuration, a workload and an origin.
#[derive(Clone, Debug, serde::Serialize)]
pub struct GeoRecord {
    /// `strong`, `weak` or `cad`.
    pub config: String,
    /// `read-only` or `write-only`.
    pub workload: String,
    /// Where the issuing clients live (one of [`ORIGINS`]).
    pub origin: String,
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
    write: bool,
    durability: &'static str,
    level: &'static str,
    reads_at_leader: bool,
    record_from: Instant,
    until: Instant,
    seed: u64,
}

/// One closed-loop client; returns its histogram and error count.
async fn client(job: ClientJob) -> (Histogram<u64>, u64) {
    let node =
        if job.write || job.reads_at_leader { job.leader } else { Topology::home(job.client) };
    let rtt = Topology::client_rtt(job.client, node);
    let mut h = histogram();
    let mut errors = 0u64;
    let Ok(mut conn) = RespConn::connect(job.addrs[node]).await else { return (h, 1) };
    let mut rng = Rng::new(job.seed ^ job.client as u64);
    let value = vec![b'v'; VALUE_BYTES];
    let ops_max = u64::MAX; // bounded by time: `until`
    for _ in 0..ops_max {
        let start = Instant::now();
        if start >= job.until {
            break;
        }
        let key = format!("geo{}", rng.below(KEYS));
        tokio::time::sleep(rtt).await; // the emulated network, before sending
        // Charged at its nominal length: tokio's timer rounds a 2 ms sleep up to about 3 ms,
        // an artefact of the emulator, not of the system measured.
        let sent = Instant::now();
        let reply = if job.write {
            conn.call(&[b"SET", key.as_bytes(), &value, b"DURABILITY", job.durability.as_bytes()])
                .await
        } else {
            conn.call(&[b"GET", key.as_bytes(), b"LEVEL", job.level.as_bytes()]).await
        };
        if start < job.record_from {
            continue;
        }
        match reply {
            Ok(_) => h.saturating_record((rtt + sent.elapsed()).as_micros() as u64),
            Err(e) => {
                errors += 1;
                if e.needs_reconnect() {
                    match RespConn::connect(job.addrs[node]).await {
                        Ok(c) => conn = c,
                        Err(_) => break,
                    }
                }
            }
        }
    }
    (h, errors)
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

/// Runs one configuration on a fresh cluster: read-only, then write-only.
fn run_config(
    exe: &Path,
    config: (&'static str, &'static str, &'static str, bool),
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
    for (workload, write) in [("read-only", false), ("write-only", true)] {
        let record_from = Instant::now() + Duration::from_secs(args.common.warmup);
        let until = record_from + Duration::from_secs(args.common.duration);
        let jobs: Vec<ClientJob> = (0..CLIENTS)
            .map(|client| ClientJob {
                client,
                addrs: addrs.clone(),
                leader,
                write,
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
        for origin in ORIGINS {
            let mut h = histogram();
            let mut errors = 0;
            for (c, (ch, e)) in results.iter().enumerate() {
                if Topology::origin(c, leader) == origin {
                    h.add(ch).expect("same bounds");
                    errors += e;
                }
            }
            if !h.is_empty() || errors > 0 {
                records.push(record(name, workload, origin, &h, errors)); // a group may be empty
            }
        }
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
    h: &Histogram<u64>,
    errors: u64,
) -> GeoRecord {
    GeoRecord {
        config: config.into(),
        workload: workload.into(),
        origin: origin.into(),
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

/// Median latency of `config`'s `workload` from `origin`, if measured.
fn median(records: &[GeoRecord], config: &str, workload: &str, origin: &str) -> Option<u64> {
    records
        .iter()
        .find(|r| r.config == config && r.workload == workload && r.origin == origin)
        .map(|r| r.p50_us)
}

/// The Markdown report: a percentile table and the paper's ratios.
pub fn markdown(records: &[GeoRecord], command: &str) -> String {
    let mut md = String::from("# Geo (ORCA §5.2.3)\n\n");
    let _ = writeln!(md, "Command: `{command}`\n");
    md.push_str("| config | workload | origin | ops | errors | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms |\n");
    md.push_str("|---|---|---|---|---|---|---|---|---|---|\n");
    let ms = |us: u64| us as f64 / 1000.0;
    for r in records {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
            r.config,
            r.workload,
            r.origin,
            r.ops,
            r.errors,
            ms(r.p50_us),
            ms(r.p90_us),
            ms(r.p99_us),
            ms(r.p999_us),
            ms(r.max_us)
        );
    }
    md.push_str("\n## Median ratios (strong / other)\n\n| workload | origin | strong / weak | strong / cad |\n|---|---|---|---|\n");
    for workload in ["read-only", "write-only"] {
        for origin in ORIGINS {
            let strong = median(records, "strong", workload, origin);
            let ratio = |other: &str| match (strong, median(records, other, workload, origin)) {
                (Some(s), Some(o)) if o > 0 => format!("{:.1}x", s as f64 / o as f64),
                _ => "n/a".into(),
            };
            let _ =
                writeln!(md, "| {workload} | {origin} | {} | {} |", ratio("weak"), ratio("cad"));
        }
    }
    md
}

/// A CDF plot of `workload`: one series per configuration and origin, x in ms.
fn cdf_png(records: &[GeoRecord], workload: &str) -> (Vec<u8>, String) {
    let mut series = Vec::new();
    let mut legend = String::new();
    for r in records.iter().filter(|r| r.workload == workload) {
        let color = PALETTE[series.len()];
        let _ =
            writeln!(legend, "- rgb{color:?}: {} from clients beside the {}", r.config, r.origin);
        series.push(r.cdf.iter().map(|&(us, f)| (us as f64 / 1000.0, f)).collect());
    }
    (line_plot(&series, false, None).to_png(), legend)
}

/// Runs `keel bench suite geo`: every configuration, then writes
/// `<out>/geo-<time>.{jsonl,md}` and a CDF PNG per workload.
pub fn run(args: &SuiteArgs, exe: &Path) -> Result<(), String> {
    let mut records = Vec::new();
    for config in CONFIGS {
        records.extend(run_config(exe, config, args)?);
    }
    let out = &args.common.out;
    std::fs::create_dir_all(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let base = out.join(format!("geo-{stamp}"));
    let jsonl: String = records
        .iter()
        .map(|r| serde_json::to_string(r).expect("a record serializes") + "\n")
        .collect();
    std::fs::write(base.with_extension("jsonl"), jsonl).map_err(|e| e.to_string())?;
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let mut md = markdown(&records, &command);
    for workload in ["read-only", "write-only"] {
        let (png, legend) = cdf_png(&records, workload);
        let file = format!("geo-{stamp}-cdf-{workload}.png");
        std::fs::write(out.join(&file), png).map_err(|e| e.to_string())?;
        let _ = write!(md, "\n## CDF, {workload}\n\n![{workload}]({file})\n\nx: latency (ms), y: cumulative fraction from 0 to 1 (tick labels are rounded to whole numbers).\n\n{legend}");
    }
    std::fs::write(base.with_extension("md"), &md).map_err(|e| e.to_string())?;
    print!("{md}");
    eprintln!("keel bench: wrote {}.jsonl and .md", base.display());
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
            record("strong", "read-only", "follower-other-site", &slow, 0),
            record("cad", "read-only", "follower-other-site", &fast, 0),
        ];
        let md = markdown(&records, "keel bench suite geo");
        assert!(md.contains("| read-only | follower-other-site | n/a | 17.1x |"), "{md}");
    }
}
