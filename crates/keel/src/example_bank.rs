//! `keel example bank`: UniStore's bank on a geo keyspace (`docs/geo.md`, *Using it*).
//!
//! A local geo cluster of `--dcs` data centers of `--per-dc` nodes each, with the
//! emulated wide-area delays of `keel up --geo`. Then:
//!
//! 1. **Deposits.** One client per node makes `--deposits` deposits, each a causal
//!    transaction adding an amount to one of `--accounts` account counters, all at once
//!    at every data center (a deposit commits locally and never aborts).
//! 2. **Convergence.** At every node, a session reads every account until each holds
//!    the exact sum of its deposits, from every data center.
//! 3. **Migration.** A session at the first data center deposits, reads every account,
//!    and calls `KEEL.BARRIER`; every node of its data center is then killed, and the
//!    session attaches at the next data center (`KEEL.ATTACH` with its past vector),
//!    where it must find everything it observed.
//!
//! Exits 0 when every balance converged and the migrated session found what it saw.

use anyhow::Context;
use keel_client::{Client, ClientConfig, GeoSession};
use keel_server::local::LocalCluster;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// How long balances may take to converge everywhere.
const CONVERGE_WAIT: Duration = Duration::from_secs(30);

/// Flags of `keel example bank`.
#[derive(Debug, Clone, clap::Args)]
pub struct BankArgs {
    /// Data centers: 3 (tolerating one failure) or 5 (two).
    #[arg(long, default_value_t = 3)]
    pub dcs: u32,
    /// Nodes per data center (each holds one partition).
    #[arg(long, default_value_t = 2)]
    pub per_dc: u32,
    /// Account counters the deposits go to.
    #[arg(long, default_value_t = 8)]
    pub accounts: u32,
    /// Deposits per client (one client per node).
    #[arg(long, default_value_t = 50)]
    pub deposits: u32,
    /// Seed of the amounts and accounts drawn.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print one JSON object at the end instead of text.
    #[arg(long)]
    pub json: bool,
    /// Where to put the local cluster (default: a fresh temporary directory, removed).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// Runs `keel example bank`.
pub fn run(args: &BankArgs) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    match runtime.block_on(example(args)) {
        Ok(report) => {
            let ok = report["ok"] == true;
            if args.json {
                println!("{}", serde_json::to_string(&report).expect("json"));
            } else {
                println!("{}", serde_json::to_string_pretty(&report).expect("json"));
            }
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("keel example bank: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn account(i: u32) -> Vec<u8> {
    format!("account:{i}").into_bytes()
}

async fn example(args: &BankArgs) -> anyhow::Result<serde_json::Value> {
    let nodes = args.dcs * args.per_dc;
    anyhow::ensure!(
        matches!(args.dcs, 3 | 5) && args.per_dc >= 1 && nodes <= 7,
        "--dcs must be 3 or 5, and --dcs × --per-dc at most 7"
    );
    anyhow::ensure!(args.accounts >= 1 && args.deposits >= 1, "at least one account and deposit");
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("keel-bank-{}", std::process::id())));
    let exe = std::env::current_exe().context("locating the keel binary")?;
    let (dcs, per_dc) = (args.dcs, args.per_dc);
    let mut cluster = LocalCluster::start(&exe, nodes, &dir, None, |c| {
        keel_server::local::geo_layout(c, dcs, per_dc);
    })
    .context("starting the cluster")?;
    let result = if cluster.wait_for_replicas(0, Duration::from_secs(30)) {
        drive(args, &mut cluster).await
    } else {
        Err(anyhow::anyhow!("the geo keyspace did not start; see the node logs"))
    };
    cluster.stop();
    if args.dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

async fn drive(args: &BankArgs, cluster: &mut LocalCluster) -> anyhow::Result<serde_json::Value> {
    let client = Client::new(ClientConfig::new(cluster.client_addrs()));
    let nodes = cluster.client_addrs().len();
    let started = Instant::now();
    let mut clients = Vec::new();
    for node in 0..nodes {
        let (client, args) = (client.clone(), args.clone());
        clients.push(tokio::spawn(async move { deposits(client, node, &args).await }));
    }
    let mut expected: BTreeMap<u32, i64> = BTreeMap::new();
    let mut latencies = Vec::new();
    for task in clients {
        let (sums, took) = task.await.context("a depositor panicked")??;
        for (account, sum) in sums {
            *expected.entry(account).or_default() += sum;
        }
        latencies.extend(took);
    }
    let deposit_secs = started.elapsed().as_secs_f64();
    let mut converged = Vec::new();
    for node in 0..nodes {
        let mut session = client.geo_session(node);
        let waited = converge(&mut session, &expected, args.accounts).await?;
        converged.push(serde_json::json!({
            "node": node + 1,
            "dc": node as u32 / args.per_dc + 1,
            "converged_ms": waited.map(|d| d.as_millis() as u64),
        }));
    }
    let all_converged = converged.iter().all(|c| !c["converged_ms"].is_null());
    let migration = migrate(&client, cluster, args).await?;
    latencies.sort_unstable();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e3;
    let total: i64 = expected.values().sum();
    Ok(serde_json::json!({
        "ok": all_converged && migration["ok"] == true,
        "data_centers": args.dcs,
        "nodes": nodes,
        "deposits": latencies.len(),
        "deposit_seconds": deposit_secs,
        "commit_ms": { "p50": at(0.5), "p90": at(0.9), "p99": at(0.99) },
        "total_expected": total,
        "convergence": converged,
        "migration": migration,
    }))
}

/// One depositor at node `node`: its sums per account, and each deposit's time from
/// begin to commit.
async fn deposits(
    client: std::sync::Arc<Client>,
    node: usize,
    args: &BankArgs,
) -> anyhow::Result<(BTreeMap<u32, i64>, Vec<Duration>)> {
    let mut session = client.geo_session(node);
    let mut rng =
        keel_types::rng::SplitMix64::new(args.seed ^ (node as u64 + 1).wrapping_mul(0x9E37));
    let mut sums = BTreeMap::new();
    let mut took = Vec::with_capacity(args.deposits as usize);
    for _ in 0..args.deposits {
        let account_id = rng.below(u64::from(args.accounts)) as u32;
        let amount = 1 + rng.below(100) as i64;
        let start = Instant::now();
        session.begin().await?;
        session.add(&account(account_id), amount).await?;
        session.commit().await.with_context(|| format!("a deposit at node {}", node + 1))?;
        took.push(start.elapsed());
        *sums.entry(account_id).or_insert(0) += amount;
    }
    Ok((sums, took))
}

/// Every account's balance, read in one transaction.
async fn balances(session: &mut GeoSession, accounts: u32) -> anyhow::Result<BTreeMap<u32, i64>> {
    session.begin().await?;
    let mut out = BTreeMap::new();
    for i in 0..accounts {
        out.insert(i, session.counter(&account(i)).await?);
    }
    session.commit().await?;
    Ok(out)
}

/// Reads the balances at the session's node until they are `expected`; how long that
/// took (`None`: not within [`CONVERGE_WAIT`]).
async fn converge(
    session: &mut GeoSession,
    expected: &BTreeMap<u32, i64>,
    accounts: u32,
) -> anyhow::Result<Option<Duration>> {
    let start = Instant::now();
    let want: BTreeMap<u32, i64> =
        (0..accounts).map(|i| (i, expected.get(&i).copied().unwrap_or(0))).collect();
    while start.elapsed() < CONVERGE_WAIT {
        if balances(session, accounts).await? == want {
            return Ok(Some(start.elapsed()));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(None)
}

/// The migration: deposit and read at the first data center, barrier, lose that data
/// center, attach at the next one, and read there.
async fn migrate(
    client: &std::sync::Arc<Client>,
    cluster: &mut LocalCluster,
    args: &BankArgs,
) -> anyhow::Result<serde_json::Value> {
    let mut session = client.geo_session(0);
    session.begin().await?;
    session.add(&account(0), 7).await?;
    let mut observed = BTreeMap::new();
    for i in 0..args.accounts {
        observed.insert(i, session.counter(&account(i)).await?);
    }
    session.commit().await?;
    let start = Instant::now();
    session.barrier().await.context("the barrier")?;
    let barrier_ms = start.elapsed().as_secs_f64() * 1e3;
    for node in 0..args.per_dc as usize {
        cluster.kill(node);
    }
    let moved_to = args.per_dc as usize;
    let start = Instant::now();
    session.attach(moved_to).await.context("the attach")?;
    let attach_ms = start.elapsed().as_secs_f64() * 1e3;
    let found = balances(&mut session, args.accounts).await?;
    let lost: Vec<u32> =
        observed.iter().filter(|(i, v)| found.get(i) != Some(v)).map(|(i, _)| *i).collect();
    Ok(serde_json::json!({
        "ok": lost.is_empty(),
        "killed_dc": 1,
        "attached_at_node": moved_to + 1,
        "barrier_ms": barrier_ms,
        "attach_ms": attach_ms,
        "observed": observed.values().collect::<Vec<_>>(),
        "found": found.values().collect::<Vec<_>>(),
        "accounts_differing": lost,
    }))
}
