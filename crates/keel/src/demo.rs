//! `keel demo`: a 3-node cluster on loopback, a mixed workload over every durability and
//! read level, a SIGKILL and restart of the leader part-way, and the recorded history
//! checked: cross-client monotonic reads everywhere, linearizability for `durable`
//! writes read `linearizable`. Exits 1 when a promise is broken.

use anyhow::{bail, Context};
use keel_check::history::{Op, Outcome};
use keel_client::history::{fetch_survivors, Recorder};
use keel_client::workload::{self, Progress, Verdicts, WorkloadConfig};
use keel_client::{Client, ClientConfig};
use keel_server::local::LocalCluster;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long to wait for a leader after start and after the restart.
pub const LEADER_WAIT: Duration = Duration::from_secs(30);
/// How long to wait for the restarted node to catch up before reading the log.
pub const CATCH_UP_WAIT: Duration = Duration::from_secs(20);

/// Flags of `keel demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Seconds of workload.
    #[arg(long, default_value_t = 8)]
    pub seconds: u64,
    /// Concurrent client sessions.
    #[arg(long, default_value_t = 8)]
    pub sessions: usize,
    /// Keep the data directory, node logs and history (printed at the end).
    #[arg(long)]
    pub keep: bool,
    /// Where to put the cluster (default: a fresh temporary directory).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Seed of the workload's choices (default: random).
    #[arg(long)]
    pub seed: Option<u64>,
}

/// Runs `keel demo`.
pub fn run(args: &DemoArgs) -> ExitCode {
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("keel-demo-{}", std::process::id())));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let result = runtime.block_on(demo(args, &dir));
    let code = match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("keel demo: {e:#}");
            eprintln!("node logs: {}", dir.display());
            return ExitCode::from(2);
        }
    };
    if args.keep {
        println!("data, node logs and history kept in {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    code
}

async fn demo(args: &DemoArgs, dir: &Path) -> anyhow::Result<bool> {
    let exe = std::env::current_exe().context("locating the keel binary")?;
    // No snapshots during the demo: the whole log is read back to find the survivors.
    let mut cluster = LocalCluster::start(&exe, 3, dir, None, |c| {
        c.engine.snapshot_entries_threshold = Some(10_000_000);
    })
    .context("starting the cluster")?;
    println!("keel demo: 3 nodes on {}", addrs(&cluster));
    let leader = wait_leader(&cluster).await.context("no leader elected")?;
    println!("leader: n{}", leader + 1);
    let progress = Arc::new(Progress::default());
    let stop = progress.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            stop.stop.store(true, Ordering::Relaxed);
        }
    });
    let recorder = Arc::new(Recorder::default());
    let client = Client::new(ClientConfig::new(cluster.client_addrs()));
    let seed = args.seed.unwrap_or_else(keel_client::fresh_id);
    let config = WorkloadConfig {
        sessions: args.sessions,
        keys: 5,
        duration: Duration::from_secs(args.seconds),
        seed,
        any_as_monotonic: false,
    };
    let work =
        tokio::spawn(workload::run(client.clone(), recorder.clone(), config, progress.clone()));
    drive_faults(&mut cluster, leader, args.seconds, &progress).await?;
    work.await.context("the workload panicked")?;
    if progress.stop.load(Ordering::Relaxed) {
        bail!("interrupted");
    }
    let leader = wait_leader(&cluster).await.context("no leader after the restart")?;
    wait_caught_up(&cluster).await;
    workload::drain(&client, &recorder).await.context("draining the queues")?;
    let survivors = fetch_survivors(&client, leader).await.context("reading the final log")?;
    let ops = recorder.ops();
    let queue = recorder.queue_ops();
    let history = dir.join("history.jsonl");
    recorder.write(&history, &survivors).context("writing the history")?;
    let verdicts = tokio::task::spawn_blocking({
        let ops = ops.clone();
        move || workload::check(&ops, &survivors, &queue)
    })
    .await?;
    let rounds = (0..3)
        .filter_map(|i| cluster.status(i))
        .map(|s| s["counters"]["reads_with_round"].as_u64().unwrap_or(0))
        .sum();
    print_table(&ops, rounds, &verdicts);
    let dropped = recorder.dropped();
    if dropped > 0 {
        // A history missing operations cannot be judged either way.
        println!("history incomplete: {dropped} operations past the recorder's bound were not recorded; the verdicts above do not stand");
    }
    if args.keep {
        println!(
            "history: {} (check it again: keel check --model keel --format keel FILE)",
            history.display()
        );
    }
    cluster.stop();
    Ok(verdicts.violations() == 0 && dropped == 0)
}

fn addrs(cluster: &LocalCluster) -> String {
    cluster.client_addrs().iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

/// Waits up to [`LEADER_WAIT`] for a leader; its index.
pub(crate) async fn wait_leader(cluster: &LocalCluster) -> Option<usize> {
    let deadline = Instant::now() + LEADER_WAIT;
    while Instant::now() < deadline {
        if let Some(leader) = cluster.wait_for_leader(Duration::from_millis(1)) {
            return Some(leader);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// Waits until every node has applied what the leader had committed when we started.
async fn wait_caught_up(cluster: &LocalCluster) {
    let deadline = Instant::now() + CATCH_UP_WAIT;
    while Instant::now() < deadline {
        let applied: Vec<u64> =
            (0..3).filter_map(|i| cluster.status(i)?["applied_index"].as_u64()).collect();
        if applied.len() == 3 && applied.iter().all(|a| *a == applied[0]) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Shows progress; SIGKILLs the leader at 30% of the run and restarts it at 60%.
async fn drive_faults(
    cluster: &mut LocalCluster,
    leader: usize,
    seconds: u64,
    progress: &Progress,
) -> anyhow::Result<()> {
    let total = Duration::from_secs(seconds);
    let bar = indicatif::ProgressBar::new(total.as_millis() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {elapsed:>3} {msg}")
            .expect("a valid template"),
    );
    let started = Instant::now();
    let (mut killed, mut restarted) = (false, false);
    while started.elapsed() < total && !progress.stop.load(Ordering::Relaxed) {
        let elapsed = started.elapsed();
        if !killed && elapsed >= total * 3 / 10 {
            cluster.kill(leader);
            say(
                &bar,
                format!("{:>5.1}s  SIGKILL n{} (the leader)", elapsed.as_secs_f64(), leader + 1),
            );
            killed = true;
        }
        if killed && !restarted && elapsed >= total * 6 / 10 {
            cluster.restart(leader).context("restarting the killed node")?;
            say(&bar, format!("{:>5.1}s  restarted n{}", elapsed.as_secs_f64(), leader + 1));
            restarted = true;
        }
        let ops = progress.ops.load(Ordering::Relaxed);
        let errors = progress.errors.load(Ordering::Relaxed);
        bar.set_position(elapsed.as_millis() as u64);
        bar.set_message(format!("{ops} ops, {errors} retried or failed"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if killed && !restarted {
        cluster.restart(leader).context("restarting the killed node")?;
    }
    bar.finish_and_clear();
    Ok(())
}

/// A line above the progress bar, or on its own when the bar is hidden (not a terminal).
fn say(bar: &indicatif::ProgressBar, line: String) {
    if bar.is_hidden() {
        println!("{line}");
    } else {
        bar.println(line);
    }
}

fn print_table(ops: &[Op], rounds: u64, verdicts: &Verdicts) {
    let mut by_label: BTreeMap<String, (u64, u64, hdrhistogram::Histogram<u64>)> = BTreeMap::new();
    for op in ops {
        let entry = by_label.entry(workload::label(op)).or_insert_with(|| {
            (0, 0, hdrhistogram::Histogram::new(3).expect("3 significant digits"))
        });
        entry.0 += 1;
        if let (Outcome::Ok | Outcome::Fail, Some(complete)) = (op.outcome, op.complete_ns) {
            entry.1 += u64::from(op.outcome == Outcome::Ok);
            let _ = entry.2.record((complete - op.invoke_ns) / 1_000);
        }
    }
    println!("\n{:<22} {:>8} {:>8} {:>10} {:>10}", "operation", "count", "ok", "p50 ms", "p99 ms");
    for (label, (count, ok, h)) in &by_label {
        let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        println!("{label:<22} {count:>8} {ok:>8} {:>10.2} {:>10.2}", ms(0.5), ms(0.99));
    }
    println!("\nreads that had to make data durable first: {rounds}");
    let m = &verdicts.monotonic;
    println!(
        "monotonic reads ({} checked): {} ({} violations)",
        m.reads,
        m.verdict(),
        m.violations_total
    );
    for v in &m.violations {
        println!("  {}: {}", v.rule.name(), v.message);
    }
    let v = &verdicts.views;
    println!(
        "views of invoked reads ({} reads, {} preliminary views): {} ({} violations)",
        v.invocations,
        v.views,
        v.verdict(),
        v.violations_total
    );
    for violation in &v.violations {
        println!("  {violation}");
    }
    let (lost, named) = &verdicts.durable_lost;
    println!("acknowledged durable writes lost: {lost} {}", named.join(" "));
    let q = &verdicts.queue;
    println!(
        "queues ({} enqueues, {} acknowledged; {} dequeues took, {} found empty, {} unknown): {} ({} violations)",
        q.enqueues,
        q.enqueued,
        q.taken,
        q.empty,
        q.unknown,
        q.verdict(),
        q.violations_total
    );
    for violation in &q.violations {
        println!("  {violation}");
    }
    let l = &verdicts.linearizable;
    println!("linearizability of durable keys ({} ops): {}", l.ops, l.verdict.name());
}
