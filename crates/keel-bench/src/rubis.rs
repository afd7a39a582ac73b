//! `keel bench suite rubis`: UniStore's application benchmark (§8.1 of the paper, Figure
//! 3), the RUBiS auction site's bidding mix, on real processes across three emulated
//! data centers, in the paper's four modes side by side.
//!
//! **Cluster.** Three data centers of two nodes (two partitions each), named after the
//! paper's regions: `dc1` Virginia (the certification leaders'), `dc2` California, `dc3`
//! Frankfurt. Every peer message is delayed one way by half the round trip between its
//! regions ([`ONE_WAY_MS`]: Virginia–California 31 ms, the paper's 61 ms round trip;
//! Virginia–Frankfurt 44 ms and California–Frankfurt 73 ms, typical of those regions, as
//! the paper gives only their range), 1 ms inside a data center. `[geo] strong` is on,
//! with RUBiS's conflicts ([`CONFLICTS`]).
//!
//! **Workload.** The bidding mix: 85% read-only transactions (view an item, a user, a
//! bid history, a category of items), 5% causal updates (store a comment, register an
//! item) and 10% strong ones with the paper's four labels: `storeBid` (6%; raises the
//! item's highest bid), `storeBuyNow` (2%; one of the item's 10 units), `registerUser`
//! (1%; claims a nickname) and `closeAuction` (1%; sets the winner to the highest
//! bidder). Conflicts (the paper names the first; the other two are the ones its
//! invariants need): `storeBid` with `closeAuction` on the same item (the winner is the
//! highest bidder), `storeBuyNow` with itself (no unit sold twice), `registerUser` with
//! itself (no nickname taken twice). 33,000 items and 1,000,000 users, drawn uniformly.
//! A strong transaction aborted by a conflict runs again from the beginning; its latency
//! is the application's, retries included.
//!
//! **Modes**, one server build: the client chooses how each transaction runs, and
//! REDBLUE's cluster certifies centrally (`[geo] central_certifier`, `docs/geo.md`,
//! *Modes*):
//! - `unistore`: as above;
//! - `redblue`: the same transactions strong, but unlabelled, so every pair of strong
//!   transactions on a common key conflicts (the paper's RedBlue baseline declares
//!   conflicts between all strong transactions), all certified by one central certifier
//!   (the first partition's leader, replicated to one replica per data center), as the
//!   paper's baseline;
//! - `redblue-distributed`: RedBlue's conflicts with UniStore's distributed
//!   certification, which separates the cost of the relation from that of the central
//!   certifier;
//! - `strong`: every transaction strong, unlabelled (all pairs on a common key conflict):
//!   serializable;
//! - `causal`: every transaction causal (an upper bound; RUBiS's invariants do not hold).
//!
//! Closed-loop clients without think time (`--clients`, a list: each mode runs at each
//! count, the paper's throughput–latency curve; default [`CLIENTS`]), spread over the six
//! nodes, run each mode for `--duration` seconds after `--warmup`. Results go to
//! `<out>/rubis-<stamp>.{jsonl,md}`; the ratios compare each mode's largest throughput
//! (its saturation point, as the paper does) and the latencies at the largest client
//! count. Loopback TCP on two shared cores: the machine's CPU bounds throughput here,
//! before any certification service; the latencies over the emulated round trips are
//! the comparable part.

use crate::cli::SuiteArgs;
use crate::driver::resp::RespConn;
use crate::rng::Rng;
use keel_server::local::LocalCluster;
use keel_wire::resp::Frame;
use serde::Serialize;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

/// Data centers.
pub const DCS: u32 = 3;
/// Nodes (partitions) per data center.
pub const PER_DC: u32 = 2;
/// The data centers' regions, in label order.
pub const REGIONS: [&str; 3] = ["Virginia", "California", "Frankfurt"];
/// One-way delays between data centers, ms, by pair of indexes.
pub const ONE_WAY_MS: [[u64; 3]; 3] = [[0, 31, 44], [31, 0, 73], [44, 73, 0]];
/// One-way delay inside a data center, ms.
pub const LOCAL_ONE_WAY_MS: u64 = 1;
/// Closed-loop clients, spread over the nodes.
pub const CLIENTS: usize = 12;
/// Items for sale.
pub const ITEMS: u64 = 33_000;
/// Registered users.
pub const USERS: u64 = 1_000_000;
/// Units of an item sold by buy-now.
pub const UNITS: i64 = 10;
/// The modes, in table order.
pub const MODES: [&str; 5] = ["unistore", "redblue", "redblue-distributed", "strong", "causal"];
/// The conflict relation, by label.
pub const CONFLICTS: [[&str; 2]; 3] = [
    ["storeBid", "closeAuction"],
    ["storeBuyNow", "storeBuyNow"],
    ["registerUser", "registerUser"],
];
/// One mode's figures.
#[derive(Clone, Debug, Serialize)]
pub struct Record {
    /// The mode.
    pub mode: String,
    /// Closed-loop clients.
    pub clients: usize,
    /// Transactions committed per second, all clients.
    pub tx_s: f64,
    /// Average latency of every transaction, µs (retries included).
    pub avg_us: u64,
    /// Average latency of the strong transactions, µs.
    pub strong_avg_us: u64,
    /// Average latency of the causal transactions, µs.
    pub causal_avg_us: u64,
    /// Average latency of the strong transactions by the client's data center, µs.
    pub strong_avg_us_by_dc: Vec<u64>,
    /// Strong transactions committed.
    pub strong: u64,
    /// Strong runs aborted by a conflict (each then ran again).
    pub aborts: u64,
    /// Transactions that failed otherwise.
    pub errors: u64,
}

#[derive(Default)]
struct Tally {
    all: (u64, u64),
    strong: (u64, u64),
    causal: (u64, u64),
    strong_by_dc: [(u64, u64); 3],
    aborts: u64,
    errors: u64,
    first_error: Option<String>,
}

impl Tally {
    fn add(&mut self, other: &Tally) {
        let sum = |a: &mut (u64, u64), b: (u64, u64)| {
            a.0 += b.0;
            a.1 += b.1;
        };
        sum(&mut self.all, other.all);
        sum(&mut self.strong, other.strong);
        sum(&mut self.causal, other.causal);
        for (a, b) in self.strong_by_dc.iter_mut().zip(other.strong_by_dc) {
            sum(a, b);
        }
        self.aborts += other.aborts;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error.clone_from(&other.first_error);
        }
    }
}

fn avg((n, total): (u64, u64)) -> u64 {
    total.checked_div(n).unwrap_or(0)
}

/// Runs the suite and writes its report: the modes of distributed certification on one
/// cluster, then REDBLUE on a cluster with a central certifier, each mode at each client
/// count.
pub fn run(args: &SuiteArgs, exe: &Path) -> Result<(), String> {
    let clients = match &args.clients {
        Some(text) => crate::cli::parse_clients(text)?,
        None => vec![CLIENTS],
    };
    let distributed: Vec<&'static str> = MODES.into_iter().filter(|m| *m != "redblue").collect();
    let mut records = Vec::new();
    for (central, modes) in [(false, distributed), (true, vec!["redblue"])] {
        records.extend(on_cluster(args, exe, central, &modes, &clients)?);
    }
    let rank = |r: &Record| MODES.iter().position(|m| *m == r.mode);
    records.sort_by_key(|r| (rank(r), r.clients));
    write(&args.common.out, &records)
}

/// `modes` at each client count on a fresh cluster, certifying centrally or not.
fn on_cluster(
    args: &SuiteArgs,
    exe: &Path,
    central: bool,
    modes: &[&'static str],
    clients: &[usize],
) -> Result<Vec<Record>, String> {
    let dir = crate::cluster::temp_dir("keel-rubis-bench");
    let layout = move |c: &mut keel_server::ServerConfig| layout(c, central);
    let mut cluster = LocalCluster::start(exe, DCS * PER_DC, &dir, None, layout)
        .map_err(|e| format!("cannot start the cluster: {e}"))?;
    let result = (|| {
        if !cluster.wait_for_replicas(0, crate::geo::READY_TIMEOUT) {
            return Err("the geo keyspace did not start".to_string());
        }
        let mut records = Vec::new();
        for mode in modes {
            for &n in clients {
                records.push(measure(args, &cluster, mode, n)?);
            }
        }
        Ok(records)
    })();
    cluster.stop();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// Three data centers of two nodes, the regions' delays, strong transactions with
/// RUBiS's conflicts, certified by one central certifier or by each partition.
fn layout(c: &mut keel_server::ServerConfig, central: bool) {
    keel_server::local::geo_layout(c, DCS, PER_DC);
    let dc_of = |id: u32| ((id - 1) / PER_DC) as usize;
    let me = dc_of(c.node_id);
    c.geo.peer_delay_ms = c
        .members
        .iter()
        .filter(|m| m.id != c.node_id)
        .map(|m| {
            let them = dc_of(m.id);
            let ms = if them == me { LOCAL_ONE_WAY_MS } else { ONE_WAY_MS[me][them] };
            (m.id.to_string(), ms)
        })
        .collect();
    c.geo.strong = true;
    c.geo.central_certifier = central;
    c.geo.conflicts = CONFLICTS.iter().map(|[a, b]| [(*a).to_owned(), (*b).to_owned()]).collect();
}

/// One mode with `clients` clients on `cluster`.
fn measure(
    args: &SuiteArgs,
    cluster: &LocalCluster,
    mode: &'static str,
    clients: usize,
) -> Result<Record, String> {
    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let duration = Duration::from_secs(args.common.duration);
    let record_from = Instant::now() + Duration::from_secs(args.common.warmup);
    let until = record_from + duration;
    let (seed, addrs) = (args.common.seed, cluster.client_addrs());
    let tallies = crate::runner::run_clients(&runtime, clients, move |c| {
        let node = c % addrs.len();
        let dc = node / PER_DC as usize;
        client(mode, addrs[node], dc, record_from, until, seed ^ ((c as u64 + 1) << 24))
    })?;
    let mut total = Tally::default();
    for t in &tallies {
        total.add(t);
    }
    let record = Record {
        mode: mode.into(),
        clients,
        tx_s: total.all.0 as f64 / duration.as_secs_f64(),
        avg_us: avg(total.all),
        strong_avg_us: avg(total.strong),
        causal_avg_us: avg(total.causal),
        strong_avg_us_by_dc: total.strong_by_dc.iter().map(|s| avg(*s)).collect(),
        strong: total.strong.0,
        aborts: total.aborts,
        errors: total.errors,
    };
    eprintln!(
        "keel bench rubis: {:<19} {:>3} clients {:>6.0} tx/s  avg {:>6} µs  strong avg {:>6} µs  causal avg {:>5} µs  aborts {} errors {}",
        record.mode, record.clients, record.tx_s, record.avg_us, record.strong_avg_us, record.causal_avg_us, record.aborts, record.errors
    );
    if let Some(e) = &total.first_error {
        eprintln!("keel bench rubis: {mode}: first error: {e}");
    }
    Ok(record)
}

/// One RUBiS interaction: its label if the application marks it strong, and its
/// operations.
struct Interaction {
    label: Option<&'static str>,
    ops: Vec<Op>,
}

/// One operation of an interaction.
enum Op {
    Read(&'static str, String),
    Incr(String, i64),
    Max(String, u64),
    Set(String, String),
    Add(String, String),
}

/// Draws the next interaction of the bidding mix.
fn interaction(rng: &mut Rng) -> Interaction {
    let item = rng.below(ITEMS);
    let user = rng.below(USERS);
    let (label, ops) = match rng.below(1000) {
        // Strong: 10%.
        0..60 => {
            let bid = 1 + rng.below(1_000_000);
            let ops = vec![
                Op::Read("register", format!("item:{item}:winner")),
                Op::Read("max", format!("item:{item}:max")),
                Op::Max(format!("item:{item}:max"), bid),
                Op::Incr(format!("item:{item}:bids"), 1),
            ];
            (Some("storeBid"), ops)
        }
        60..80 => {
            let ops = vec![
                Op::Read("counter", format!("item:{item}:sold")),
                Op::Incr(format!("item:{item}:sold"), 1),
            ];
            (Some("storeBuyNow"), ops)
        }
        80..90 => {
            let nick = format!("nick:{}", rng.below(USERS));
            let ops = vec![Op::Read("register", nick.clone()), Op::Set(nick, user.to_string())];
            (Some("registerUser"), ops)
        }
        90..100 => {
            let ops = vec![
                Op::Read("max", format!("item:{item}:max")),
                Op::Set(format!("item:{item}:winner"), user.to_string()),
            ];
            (Some("closeAuction"), ops)
        }
        // Causal updates: 5%.
        100..125 => {
            let ops = vec![
                Op::Incr(format!("user:{user}:rating"), 1),
                Op::Add(format!("user:{user}:comments"), rng.below(1 << 20).to_string()),
            ];
            (None, ops)
        }
        125..150 => (None, vec![Op::Set(format!("item:{item}"), format!("item {item}"))]),
        // Read-only: 85%.
        150..500 => {
            let ops = vec![
                Op::Read("register", format!("item:{item}")),
                Op::Read("max", format!("item:{item}:max")),
                Op::Read("counter", format!("item:{item}:bids")),
            ];
            (None, ops)
        }
        500..700 => {
            let ops = vec![
                Op::Read("register", format!("user:{user}")),
                Op::Read("counter", format!("user:{user}:rating")),
            ];
            (None, ops)
        }
        700..800 => {
            let ops = vec![
                Op::Read("counter", format!("item:{item}:bids")),
                Op::Read("max", format!("item:{item}:max")),
                Op::Read("register", format!("item:{item}:winner")),
            ];
            (None, ops)
        }
        _ => {
            let first = rng.below(ITEMS - 5);
            let ops =
                (first..first + 5).map(|i| Op::Read("register", format!("item:{i}"))).collect();
            (None, ops)
        }
    };
    Interaction { label, ops }
}

/// How `mode` runs an interaction: causal (`None`), or strong with a label (`Some`).
fn begin_args(mode: &str, label: Option<&'static str>) -> Option<Option<&'static str>> {
    match (mode, label) {
        ("causal", _) => None,
        ("strong", _) => Some(None),
        ("redblue" | "redblue-distributed", Some(_)) => Some(None),
        (_, Some(label)) => Some(Some(label)),
        (_, None) => None,
    }
}

/// One closed-loop client until `until`, recording from `record_from`.
async fn client(
    mode: &'static str,
    addr: SocketAddr,
    dc: usize,
    record_from: Instant,
    until: Instant,
    seed: u64,
) -> Result<Tally, String> {
    let mut conn = RespConn::connect(addr).await.map_err(|e| e.to_string())?;
    let mut rng = Rng::new(seed);
    let mut tally = Tally::default();
    while Instant::now() < until {
        let it = interaction(&mut rng);
        let how = begin_args(mode, it.label);
        let begin = Instant::now();
        let mut aborts = 0;
        let outcome = loop {
            match run_once(&mut conn, how, &it.ops).await {
                Err(e) if e.contains("CONFLICT") => aborts += 1,
                other => break other,
            }
            if Instant::now() >= until {
                break Err("the run ended".into());
            }
        };
        if begin < record_from {
            continue;
        }
        tally.aborts += aborts;
        let us = (begin.elapsed().as_micros() as u64).max(1);
        match outcome {
            Ok(()) => {
                tally.all.0 += 1;
                tally.all.1 += us;
                let (kind, by_dc) = match how {
                    Some(_) => (&mut tally.strong, Some(&mut tally.strong_by_dc[dc])),
                    None => (&mut tally.causal, None),
                };
                kind.0 += 1;
                kind.1 += us;
                if let Some(slot) = by_dc {
                    slot.0 += 1;
                    slot.1 += us;
                }
            }
            Err(e) => {
                tally.errors += 1;
                tally.first_error.get_or_insert(e);
            }
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

/// Runs an interaction once: begin (`how`), its operations, commit. A conflict is an
/// error that names `CONFLICT`.
async fn run_once(
    conn: &mut RespConn,
    how: Option<Option<&'static str>>,
    ops: &[Op],
) -> Result<(), String> {
    let call = |r: Result<Frame, crate::driver::DriverError>| r.map_err(|e| e.to_string());
    let begin: Vec<&[u8]> = match how {
        None => vec![b"KEEL.TX.BEGIN"],
        Some(None) => vec![b"KEEL.TX.BEGIN", b"STRONG"],
        Some(Some(label)) => vec![b"KEEL.TX.BEGIN", b"STRONG", b"LABEL", label.as_bytes()],
    };
    check(call(conn.call(&begin).await)?)?;
    for op in ops {
        let frame = match op {
            Op::Read(kind, key) => {
                conn.call(&[b"KEEL.TX.READ", kind.as_bytes(), key.as_bytes()]).await
            }
            Op::Incr(key, n) => {
                conn.call(&[b"INCRBY", key.as_bytes(), n.to_string().as_bytes()]).await
            }
            Op::Max(key, n) => {
                conn.call(&[b"KEEL.TX.MAX", key.as_bytes(), n.to_string().as_bytes()]).await
            }
            Op::Set(key, v) => conn.call(&[b"SET", key.as_bytes(), v.as_bytes()]).await,
            Op::Add(key, e) => conn.call(&[b"SADD", key.as_bytes(), e.as_bytes()]).await,
        };
        if let Err(e) = call(frame).and_then(check) {
            let _ = conn.call(&[b"KEEL.TX.ABORT"]).await;
            return Err(e);
        }
    }
    check(call(conn.call(&[b"KEEL.TX.COMMIT"]).await)?).map(|_| ())
}

fn write(out: &Path, records: &[Record]) -> Result<(), String> {
    let (stem, command) = crate::geo::write_jsonl(out, "rubis", records)?;
    let mut md = String::new();
    let _ = writeln!(md, "# RUBiS on Keel's geo keyspace: UniStore, RedBlue, Strong, Causal\n");
    let _ = writeln!(md, "`{command}`\n");
    let _ = writeln!(
        md,
        "{DCS} data centers ({}) of {PER_DC} nodes, one way {} ms (Virginia–California), {} ms (Virginia–Frankfurt), {} ms (California–Frankfurt), {LOCAL_ONE_WAY_MS} ms inside; leaders in Virginia. Closed-loop clients without think time over the {} nodes; the bidding mix (10% strong). `redblue` runs on a cluster with one central certifier. Latencies in µs, averages, retries of aborted transactions included.\n",
        REGIONS.join(", "),
        ONE_WAY_MS[0][1],
        ONE_WAY_MS[0][2],
        ONE_WAY_MS[1][2],
        DCS * PER_DC
    );
    let _ = writeln!(
        md,
        "| mode | clients | tx/s | avg | strong avg | causal avg | strong avg at {} | strong committed | aborts | errors |",
        REGIONS.join(" / ")
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|");
    for r in records {
        let by_dc: Vec<String> = r.strong_avg_us_by_dc.iter().map(u64::to_string).collect();
        let _ = writeln!(
            md,
            "| {} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} |",
            r.mode,
            r.clients,
            r.tx_s,
            r.avg_us,
            r.strong_avg_us,
            r.causal_avg_us,
            by_dc.join(" / "),
            r.strong,
            r.aborts,
            r.errors
        );
    }
    if let Some(line) = ratios(records) {
        let _ = writeln!(md, "\n{line}");
    }
    let base = out.join(stem);
    std::fs::write(base.with_extension("md"), md).map_err(|e| e.to_string())?;
    eprintln!("keel bench: wrote {}.jsonl and .md", base.display());
    Ok(())
}

/// The paper's comparisons: throughput at each mode's saturation point (its largest
/// over the client counts), latency at the largest client count.
fn ratios(records: &[Record]) -> Option<String> {
    let most = records.iter().map(|r| r.clients).max()?;
    let peak = |mode: &str| {
        records
            .iter()
            .filter(|r| r.mode == mode)
            .map(|r| r.tx_s)
            .fold(None, |a: Option<f64>, t| Some(a.map_or(t, |a| a.max(t))))
    };
    let at_most = |mode: &str| records.iter().find(|r| r.mode == mode && r.clients == most);
    let (u, s, rb, c) = (peak("unistore")?, peak("strong")?, peak("redblue")?, peak("causal")?);
    let (lu, ls) = (at_most("unistore")?, at_most("strong")?);
    let ratio = |a: f64, b: f64| a / b.max(f64::MIN_POSITIVE);
    let gain = |a: f64, b: f64| 100.0 * (ratio(a, b) - 1.0);
    Some(format!(
        "Average latency at {most} clients, STRONG / UniStore: {:.1}x (paper: 4.9x at its reported averages, 3.7x in its abstract). Throughput at saturation (each mode's largest), UniStore / REDBLUE: {:+.0}% (paper: +72%); UniStore / STRONG: {:+.0}% (paper: +183%); UniStore / CAUSAL: {:+.0}% (paper: -45%).",
        ratio(ls.avg_us as f64, lu.avg_us as f64),
        gain(u, rb),
        gain(u, s),
        gain(u, c),
    ))
}
