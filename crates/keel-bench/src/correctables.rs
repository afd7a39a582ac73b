//! `keel bench suite correctables`: the Correctables paper's measurements (§6.2) on Keel.
//!
//! Three Keel nodes, every peer message delayed [`PEER_ONE_WAY_MS`] (a wide-area
//! deployment; the engine timeouts of the geo suite); [`CLIENTS`] clients beside one
//! follower, so that a preliminary view (`any`, the follower's own state) costs no
//! wide-area round trip and the final one (`linearizable`, through the leader) costs one.
//! [`KEYS`] objects of [`VALUE_BYTES`] bytes.
//!
//! For YCSB A (50% updates) and B (5%), keys drawn zipfian or latest (skewed towards the
//! most recently updated keys), each client runs for `--duration` seconds (after
//! `--warmup`) in each mode:
//! - `invoke`: reads are `KEEL.INVOKE GET k LEVELS any linearizable` over RESP3, with
//!   confirmations (`+SAME` when the final view equals the preliminary one);
//! - `invoke-noconfirm`: the same with `NOCONFIRM`;
//! - `strong`: reads are `GET k LEVEL linearizable` (the strong-only baseline);
//! - `weak`: reads are `GET k LEVEL any`.
//!
//! Updates are `SET k v` at the follower (forwarded to the leader). Recorded per run:
//! read latency of the preliminary and the final view (or of the one reply), the share of
//! invocations whose preliminary view differs from the final one (divergence), bytes per
//! operation on the wire (requests and every frame of their replies, updates included),
//! and throughput.
//!
//! Then ad serving (§6.3.1), [`CLIENTS`] clients for `--duration` seconds per mode:
//! [`AD_PROFILES`] profiles each naming [`AD_REFS`] of [`AD_ADS`] ads, one profile's
//! references changed every [`AD_UPDATE_EVERY`]. `speculative`: the references invoked
//! (`any`, `linearizable`) and the ads fetched (`MGET ... LEVEL linearizable`, on a second
//! connection) as soon as the preliminary view arrives, refetched if the final view
//! differs; `strong-only`: the references at `linearizable`, then the ads. Recorded:
//! request latency, requests per second, refetches (misspeculations) and bytes per request.
//!
//! Results go to `<out>/correctables-<stamp>.{jsonl,md}`.

use crate::cli::SuiteArgs;
use crate::driver::resp::RespConn;
use crate::generator::Zipfian;
use crate::rng::Rng;
use hdrhistogram::Histogram;
use keel_server::local::LocalCluster;
use keel_wire::resp::Frame;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Nodes in the cluster.
pub const NODES: u32 = 3;
/// One-way delay of every peer message, in ms (the geo suite's wide-area delay).
pub const PEER_ONE_WAY_MS: u64 = crate::geo::PEER_ONE_WAY_MS_WAN;
/// Concurrent clients, all beside one follower.
pub const CLIENTS: usize = 8;
/// Objects (the paper's divergence experiment: 1,000).
pub const KEYS: u64 = 1000;
/// Bytes per value.
pub const VALUE_BYTES: usize = 100;
/// Recently updated keys the `latest` distribution draws from.
const RECENT_MAX: usize = 1000;
/// Workloads: name, percent of operations that are updates.
pub const WORKLOADS: [(&str, u64); 2] = [("a", 50), ("b", 5)];
/// Key distributions.
pub const DISTRIBUTIONS: [&str; 2] = ["zipfian", "latest"];
/// Read modes, in run order.
pub const MODES: [&str; 4] = ["invoke", "invoke-noconfirm", "strong", "weak"];

/// Profiles of the ad-serving runs.
pub const AD_PROFILES: u64 = 100;
/// Ads of the ad-serving runs.
pub const AD_ADS: u64 = 1000;
/// Ads each profile names.
pub const AD_REFS: u64 = 5;
/// How often one profile's references change during the ad-serving runs.
pub const AD_UPDATE_EVERY: Duration = Duration::from_millis(20);
/// Ad-serving modes.
pub const AD_MODES: [&str; 2] = ["speculative", "strong-only"];

/// One run's figures.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Record {
    /// `a` or `b`.
    pub workload: String,
    /// `zipfian` or `latest`.
    pub distribution: String,
    /// One of [`MODES`].
    pub mode: String,
    /// Operations recorded.
    pub ops: u64,
    /// Reads recorded.
    pub reads: u64,
    /// Operations per second over every client.
    pub ops_s: f64,
    /// Median latency of the first view (the only one outside `invoke*`), ms.
    pub first_p50_ms: f64,
    /// 99th percentile of the first view, ms.
    pub first_p99_ms: f64,
    /// Median latency of the final view (`invoke*` only; else the read's), ms.
    pub final_p50_ms: f64,
    /// 99th percentile of the final view, ms.
    pub final_p99_ms: f64,
    /// Invocations whose preliminary view's value differs from the final one's, percent.
    pub divergence_pct: f64,
    /// Bytes on the wire per operation (reads and updates, both directions).
    pub bytes_per_op: f64,
    /// Operations that failed.
    pub errors: u64,
}

struct Job {
    addr: SocketAddr,
    workload: (&'static str, u64),
    distribution: &'static str,
    mode: &'static str,
    record_from: Instant,
    until: Instant,
    seed: u64,
    recent: Arc<Mutex<VecDeque<u64>>>,
}

#[derive(Default)]
struct Tally {
    ops: u64,
    reads: u64,
    diverged: u64,
    invocations: u64,
    bytes: u64,
    errors: u64,
    first: Vec<u64>,
    last: Vec<u64>,
}

fn histogram_of(values: &[u64]) -> Histogram<u64> {
    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid bounds");
    for v in values {
        let _ = h.record((*v).max(1));
    }
    h
}

/// The key of the next operation.
fn next_key(job: &Job, rng: &mut Rng, zipf: &mut Zipfian, latest: &mut Zipfian) -> u64 {
    if job.distribution == "latest" {
        let recent = job.recent.lock().expect("recent keys");
        if !recent.is_empty() {
            let back = latest.next(rng).min(recent.len() as u64 - 1) as usize;
            return recent[recent.len() - 1 - back];
        }
    }
    zipf.next(rng) % KEYS
}

async fn client(job: Job) -> Result<Tally, String> {
    let mut conn = RespConn::connect(job.addr).await.map_err(|e| e.to_string())?;
    conn.call(&[b"HELLO", b"3"]).await.map_err(|e| e.to_string())?;
    let mut rng = Rng::new(job.seed);
    let mut zipf = Zipfian::new(0, KEYS - 1, crate::generator::ZIPFIAN_CONSTANT);
    let mut latest = Zipfian::new(0, RECENT_MAX as u64 - 1, crate::generator::ZIPFIAN_CONSTANT);
    let mut tally = Tally::default();
    let mut value = vec![b'v'; VALUE_BYTES];
    while Instant::now() < job.until {
        let recording = Instant::now() >= job.record_from;
        let key_index = next_key(&job, &mut rng, &mut zipf, &mut latest);
        let key = format!("c{key_index}");
        let update = rng.below(100) < job.workload.1;
        let words: Vec<&[u8]> = if update {
            rng.fill_printable(&mut value);
            vec![b"SET", key.as_bytes(), &value]
        } else {
            match job.mode {
                "invoke" => {
                    vec![b"KEEL.INVOKE", b"GET", key.as_bytes(), b"LEVELS", b"any", b"linearizable"]
                }
                "invoke-noconfirm" => vec![
                    b"KEEL.INVOKE",
                    b"GET",
                    key.as_bytes(),
                    b"LEVELS",
                    b"any",
                    b"linearizable",
                    b"NOCONFIRM",
                ],
                "strong" => vec![b"GET", key.as_bytes(), b"LEVEL", b"linearizable"],
                _ => vec![b"GET", key.as_bytes(), b"LEVEL", b"any"],
            }
        };
        let exchange = match conn.call_with_pushes(&words).await {
            Ok(exchange) => exchange,
            Err(_) => {
                tally.errors += u64::from(recording);
                continue;
            }
        };
        if update {
            let mut recent = job.recent.lock().expect("recent keys");
            recent.push_back(key_index);
            if recent.len() > RECENT_MAX {
                recent.pop_front();
            }
        }
        if !recording {
            continue;
        }
        tally.ops += 1;
        tally.bytes += exchange.bytes_out + exchange.bytes_in;
        if update {
            continue;
        }
        tally.reads += 1;
        let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let last = micros(exchange.reply_at);
        let first = exchange.pushes.first().map_or(last, |(_, at)| micros(*at));
        tally.first.push(first);
        tally.last.push(last);
        if let Some((Frame::Push(items), _)) = exchange.pushes.first() {
            tally.invocations += 1;
            let same = matches!(&exchange.reply, Frame::Simple(word) if word == b"SAME");
            if !same && items.get(3) != Some(&exchange.reply) {
                tally.diverged += 1;
            }
        }
    }
    Ok(tally)
}

async fn load(addr: SocketAddr) -> Result<(), String> {
    let mut conn = RespConn::connect(addr).await.map_err(|e| e.to_string())?;
    let value = vec![b'v'; VALUE_BYTES];
    for k in 0..KEYS {
        let key = format!("c{k}");
        conn.call(&[b"SET", key.as_bytes(), &value]).await.map_err(|e| format!("load: {e}"))?;
    }
    Ok(())
}

/// Profile `p`'s references in generation `g`.
fn ad_refs(p: u64, g: u64) -> String {
    (0..AD_REFS)
        .map(|k| {
            let mut z = (p << 32 ^ g << 8 ^ k).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            z ^= z >> 29;
            format!("ad{}", z % AD_ADS)
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// `MGET` of the ads a reference list names, at `linearizable`.
fn ads_request(refs: &[u8]) -> Vec<Vec<u8>> {
    let mut words = vec![b"MGET".to_vec()];
    words.extend(refs.split(|b| *b == b',').map(<[u8]>::to_vec));
    words.extend([b"LEVEL".to_vec(), b"linearizable".to_vec()]);
    words
}

fn as_words(words: &[Vec<u8>]) -> Vec<&[u8]> {
    words.iter().map(Vec::as_slice).collect()
}

/// One ad request in `mode`: its bytes and whether the speculation was refetched.
async fn serve_ads(
    refs_conn: &mut RespConn,
    ads_conn: &mut RespConn,
    profile: &[u8],
    mode: &str,
) -> Result<(u64, bool), crate::driver::DriverError> {
    let bad = |f: &Frame| crate::driver::DriverError::Protocol(format!("unexpected {f:?}"));
    let bulk = |f: &Frame| match f {
        Frame::Bulk(b) => Some(b.to_vec()),
        _ => None,
    };
    if mode == "strong-only" {
        let exchange =
            refs_conn.call_with_pushes(&[b"GET", profile, b"LEVEL", b"linearizable"]).await?;
        let refs = bulk(&exchange.reply).ok_or_else(|| bad(&exchange.reply))?;
        let ads = ads_conn.call_with_pushes(&as_words(&ads_request(&refs))).await?;
        return Ok((exchange.bytes_out + exchange.bytes_in + ads.bytes_out + ads.bytes_in, false));
    }
    let mut bytes = refs_conn
        .send(&[b"KEEL.INVOKE", b"GET", profile, b"LEVELS", b"any", b"linearizable"])
        .await?;
    let (first, n) = refs_conn.recv().await?;
    bytes += n;
    let (speculated, final_frame) = match first {
        Frame::Push(items) => {
            let refs =
                items.get(3).and_then(bulk).ok_or_else(|| bad(&Frame::Push(items.clone())))?;
            bytes += ads_conn.send(&as_words(&ads_request(&refs))).await?;
            let (last, n) = refs_conn.recv().await?;
            bytes += n;
            (Some(refs), last)
        }
        reply => (None, reply),
    };
    if let Some(refs) = &speculated {
        let (_, n) = ads_conn.recv().await?;
        bytes += n;
        let confirmed = matches!(&final_frame, Frame::Simple(w) if w == b"SAME")
            || bulk(&final_frame).as_ref() == Some(refs);
        if confirmed {
            return Ok((bytes, false));
        }
    }
    let refs = bulk(&final_frame).ok_or_else(|| bad(&final_frame))?;
    let ads = ads_conn.call_with_pushes(&as_words(&ads_request(&refs))).await?;
    Ok((bytes + ads.bytes_out + ads.bytes_in, speculated.is_some()))
}

async fn ads_client(
    addr: SocketAddr,
    mode: &'static str,
    record_from: Instant,
    until: Instant,
    seed: u64,
) -> Result<Tally, String> {
    let mut refs_conn = RespConn::connect(addr).await.map_err(|e| e.to_string())?;
    refs_conn.call(&[b"HELLO", b"3"]).await.map_err(|e| e.to_string())?;
    let mut ads_conn = RespConn::connect(addr).await.map_err(|e| e.to_string())?;
    let mut rng = Rng::new(seed);
    let mut tally = Tally::default();
    while Instant::now() < until {
        let recording = Instant::now() >= record_from;
        let profile = format!("p{}", rng.below(AD_PROFILES));
        let started = Instant::now();
        match serve_ads(&mut refs_conn, &mut ads_conn, profile.as_bytes(), mode).await {
            Ok((bytes, refetched)) if recording => {
                tally.ops += 1;
                tally.reads += 1;
                tally.bytes += bytes;
                tally.invocations += u64::from(mode == "speculative");
                tally.diverged += u64::from(refetched);
                let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
                tally.first.push(micros);
                tally.last.push(micros);
            }
            Ok(_) => {}
            Err(_) => {
                tally.errors += u64::from(recording);
                // A connection out of step with its replies is replaced.
                refs_conn = RespConn::connect(addr).await.map_err(|e| e.to_string())?;
                refs_conn.call(&[b"HELLO", b"3"]).await.map_err(|e| e.to_string())?;
                ads_conn = RespConn::connect(addr).await.map_err(|e| e.to_string())?;
            }
        }
    }
    Ok(tally)
}

/// Loads the profiles and ads through `addr`.
async fn load_ads(addr: SocketAddr) -> Result<(), String> {
    let mut conn = RespConn::connect(addr).await.map_err(|e| e.to_string())?;
    let ad = vec![b'a'; VALUE_BYTES];
    for j in 0..AD_ADS {
        let key = format!("ad{j}");
        conn.call(&[b"SET", key.as_bytes(), &ad]).await.map_err(|e| format!("load: {e}"))?;
    }
    for p in 0..AD_PROFILES {
        let key = format!("p{p}");
        conn.call(&[b"SET", key.as_bytes(), ad_refs(p, 0).as_bytes()])
            .await
            .map_err(|e| format!("load: {e}"))?;
    }
    Ok(())
}

/// Changes one profile's references every [`AD_UPDATE_EVERY`] until `until`.
async fn update_profiles(addr: SocketAddr, until: Instant) -> Result<(), String> {
    let mut conn = RespConn::connect(addr).await.map_err(|e| e.to_string())?;
    let mut generation = 0;
    while Instant::now() < until {
        generation += 1;
        let p = generation % AD_PROFILES;
        let key = format!("p{p}");
        let _ = conn.call(&[b"SET", key.as_bytes(), ad_refs(p, generation).as_bytes()]).await;
        tokio::time::sleep(AD_UPDATE_EVERY).await;
    }
    Ok(())
}

/// Runs the suite and writes its report.
pub fn run(args: &SuiteArgs, exe: &Path) -> Result<(), String> {
    let dir = crate::cluster::temp_dir("keel-correctables");
    let cluster = LocalCluster::start(exe, NODES, &dir, None, |c| {
        for other in (1..=NODES).filter(|id| *id != c.node_id) {
            c.geo.peer_delay_ms.insert(other.to_string(), PEER_ONE_WAY_MS);
        }
        c.engine.mark_out_timeout_ms = Some(crate::geo::MARK_OUT_TIMEOUT_MS);
        c.engine.removal_timeout_ms = Some(5 * crate::geo::MARK_OUT_TIMEOUT_MS);
        c.engine.election_timeout_min_ms = Some(crate::geo::ELECTION_TIMEOUT_MS_MIN);
        c.engine.election_timeout_max_ms = Some(2 * crate::geo::ELECTION_TIMEOUT_MS_MIN);
    })
    .map_err(|e| format!("cannot start the cluster: {e}"))?;
    let leader = cluster
        .wait_for_leader(crate::geo::READY_TIMEOUT)
        .ok_or("the cluster elected no leader")?;
    let addrs = cluster.client_addrs();
    let follower = addrs[(leader + 1) % addrs.len()];
    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    runtime.block_on(load(addrs[leader]))?;
    // `--workloads`: any of `a`, `b`, `ads` (default: all three).
    let chosen = args.workloads.clone().unwrap_or_else(|| "a,b,ads".into());
    let chosen: Vec<&str> = chosen.split(',').map(str::trim).collect();
    if let Some(unknown) = chosen.iter().find(|w| !["a", "b", "ads"].contains(w)) {
        return Err(format!("unknown workload {unknown:?} (expected a, b or ads)"));
    }
    let mut records = Vec::new();
    for workload in WORKLOADS.into_iter().filter(|(name, _)| chosen.contains(name)) {
        for distribution in DISTRIBUTIONS {
            for mode in MODES {
                let record_from = Instant::now() + Duration::from_secs(args.common.warmup);
                let until = record_from + Duration::from_secs(args.common.duration);
                let recent = Arc::new(Mutex::new(VecDeque::new()));
                let tallies = crate::runner::run_clients(&runtime, CLIENTS, |c| {
                    client(Job {
                        addr: follower,
                        workload,
                        distribution,
                        mode,
                        record_from,
                        until,
                        seed: args.common.seed ^ (c as u64 + 1) << 20,
                        recent: recent.clone(),
                    })
                })?;
                let record = record(workload.0, distribution, mode, &tallies, args.common.duration);
                eprintln!(
                    "keel bench correctables: {} {} {}: {:.0} ops/s, first p50 {:.1} ms, final p50 {:.1} ms, divergence {:.2}%, {:.0} B/op",
                    record.workload, record.distribution, record.mode, record.ops_s,
                    record.first_p50_ms, record.final_p50_ms, record.divergence_pct, record.bytes_per_op
                );
                records.push(record);
            }
        }
    }
    if chosen.contains(&"ads") {
        runtime.block_on(load_ads(addrs[leader]))?;
    }
    for mode in AD_MODES.into_iter().filter(|_| chosen.contains(&"ads")) {
        let record_from = Instant::now() + Duration::from_secs(args.common.warmup);
        let until = record_from + Duration::from_secs(args.common.duration);
        let tallies = runtime.block_on(async {
            let updater = tokio::spawn(update_profiles(follower, until));
            let tasks: Vec<_> = (0..CLIENTS)
                .map(|c| {
                    let seed = args.common.seed ^ (c as u64 + 1) << 24;
                    tokio::spawn(ads_client(follower, mode, record_from, until, seed))
                })
                .collect();
            let mut tallies = Vec::new();
            for task in tasks {
                tallies.push(task.await.map_err(|e| e.to_string())??);
            }
            updater.await.map_err(|e| e.to_string())??;
            Ok::<_, String>(tallies)
        })?;
        let record = record("ads", "uniform", mode, &tallies, args.common.duration);
        eprintln!(
            "keel bench correctables: ads {}: {:.0} requests/s, p50 {:.1} ms, p99 {:.1} ms, refetched {:.2}%, {:.0} B/request",
            record.mode, record.ops_s, record.final_p50_ms, record.final_p99_ms, record.divergence_pct, record.bytes_per_op
        );
        records.push(record);
    }
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
    let out = &args.common.out;
    let (stem, command) = crate::geo::write_jsonl(out, "correctables", &records)?;
    let md = markdown(&records, &command);
    std::fs::write(out.join(format!("{stem}.md")), &md).map_err(|e| e.to_string())?;
    print!("{md}");
    eprintln!("keel bench: wrote {}.jsonl and .md", out.join(&stem).display());
    Ok(())
}

fn record(
    workload: &str,
    distribution: &str,
    mode: &str,
    tallies: &[Tally],
    seconds: u64,
) -> Record {
    let sum = |f: fn(&Tally) -> u64| tallies.iter().map(f).sum::<u64>();
    let all =
        |f: fn(&Tally) -> &Vec<u64>| tallies.iter().flat_map(f).copied().collect::<Vec<u64>>();
    let (first, last) = (histogram_of(&all(|t| &t.first)), histogram_of(&all(|t| &t.last)));
    let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    let ops = sum(|t| t.ops);
    let invocations = sum(|t| t.invocations);
    Record {
        workload: workload.into(),
        distribution: distribution.into(),
        mode: mode.into(),
        ops,
        reads: sum(|t| t.reads),
        ops_s: ops as f64 / seconds.max(1) as f64,
        first_p50_ms: ms(&first, 0.5),
        first_p99_ms: ms(&first, 0.99),
        final_p50_ms: ms(&last, 0.5),
        final_p99_ms: ms(&last, 0.99),
        divergence_pct: if invocations == 0 {
            0.0
        } else {
            100.0 * sum(|t| t.diverged) as f64 / invocations as f64
        },
        bytes_per_op: if ops == 0 { 0.0 } else { sum(|t| t.bytes) as f64 / ops as f64 },
        errors: sum(|t| t.errors),
    }
}

/// The report: one table per workload and distribution, and the bandwidth overheads of
/// invoking against the strong-only baseline.
pub fn markdown(records: &[Record], command: &str) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# keel bench suite correctables\n");
    let _ = writeln!(
        md,
        "Command: `{command}`. Three nodes, every peer message delayed {PEER_ONE_WAY_MS} ms one way; {CLIENTS} clients beside one follower; {KEYS} objects of {VALUE_BYTES} bytes.\n"
    );
    let _ = writeln!(
        md,
        "| workload | keys | mode | ops/s | first view p50 / p99 ms | final view p50 / p99 ms | divergence | bytes/op | vs strong | errors |"
    );
    let _ = writeln!(md, "|---|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in records.iter().filter(|r| r.workload != "ads") {
        let strong = records.iter().find(|s| {
            s.workload == r.workload && s.distribution == r.distribution && s.mode == "strong"
        });
        let overhead = strong.filter(|s| s.bytes_per_op > 0.0).map_or("-".into(), |s| {
            format!("{:+.0}%", 100.0 * (r.bytes_per_op / s.bytes_per_op - 1.0))
        });
        let divergence = if r.mode.starts_with("invoke") {
            format!("{:.2}%", r.divergence_pct)
        } else {
            "-".into()
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.0} | {:.1} / {:.1} | {:.1} / {:.1} | {} | {:.0} | {} | {} |",
            r.workload.to_uppercase(),
            r.distribution,
            r.mode,
            r.ops_s,
            r.first_p50_ms,
            r.first_p99_ms,
            r.final_p50_ms,
            r.final_p99_ms,
            divergence,
            r.bytes_per_op,
            overhead,
            r.errors
        );
    }
    let ads: Vec<&Record> = records.iter().filter(|r| r.workload == "ads").collect();
    if !ads.is_empty() {
        let _ = writeln!(
            md,
            "\nAd serving ({AD_PROFILES} profiles of {AD_REFS} references to {AD_ADS} ads, one profile changed every {} ms; {CLIENTS} clients beside the follower):\n",
            AD_UPDATE_EVERY.as_millis()
        );
        let _ = writeln!(
            md,
            "| mode | requests/s | latency p50 / p99 ms | refetched | bytes/request | errors |"
        );
        let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|");
        for r in ads {
            let refetched = if r.mode == "speculative" {
                format!("{:.2}%", r.divergence_pct)
            } else {
                "-".into()
            };
            let _ = writeln!(
                md,
                "| {} | {:.0} | {:.1} / {:.1} | {} | {:.0} | {} |",
                r.mode,
                r.ops_s,
                r.final_p50_ms,
                r.final_p99_ms,
                refetched,
                r.bytes_per_op,
                r.errors
            );
        }
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(mode: &str, bytes_per_op: f64, divergence_pct: f64) -> Record {
        Record {
            workload: "a".into(),
            distribution: "zipfian".into(),
            mode: mode.into(),
            ops: 10,
            reads: 5,
            ops_s: 1.0,
            first_p50_ms: 0.2,
            first_p99_ms: 0.5,
            final_p50_ms: 37.0,
            final_p99_ms: 90.0,
            divergence_pct,
            bytes_per_op,
            errors: 0,
        }
    }

    #[test]
    fn the_report_gives_bandwidth_against_the_strong_only_baseline() {
        let md = markdown(&[rec("invoke", 130.0, 4.0), rec("strong", 100.0, 0.0)], "cmd");
        assert!(
            md.contains(
                "| A | zipfian | invoke | 1 | 0.2 / 0.5 | 37.0 / 90.0 | 4.00% | 130 | +30% | 0 |"
            ),
            "{md}"
        );
        assert!(
            md.contains(
                "| A | zipfian | strong | 1 | 0.2 / 0.5 | 37.0 / 90.0 | - | 100 | +0% | 0 |"
            ),
            "{md}"
        );
        let tally =
            Tally { ops: 4, reads: 2, diverged: 1, invocations: 2, bytes: 400, ..Tally::default() };
        let r = record("b", "latest", "invoke", &[tally], 2);
        assert_eq!((r.ops_s, r.divergence_pct, r.bytes_per_op), (2.0, 50.0, 100.0));
    }
}
