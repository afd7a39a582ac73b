//! `keel torture`: real faults on real processes. Each schedule starts a fresh cluster of
//! containers (the `keel:local` image `deploy/build-image.sh` builds) on a private Docker
//! network, runs the recorded workload of `keel demo` against it from the host (every
//! durability and read level, CAS, Correctables reads), and injects faults drawn from the
//! schedule's seed:
//!
//! - `docker kill -s KILL` of the leader, a follower, a majority, or every node, each
//!   started again after a hold;
//! - `docker pause` of the leader or a follower (the freezer cgroup: the node's clock keeps
//!   running while it is frozen), then unpause;
//! - network faults from the host inside each container's network namespace (`nsenter
//!   --net=/proc/PID/ns/net iptables`): the leader isolated, a minority split from the
//!   majority, a bridge node that alone hears both halves, one-way cuts, and flaky links
//!   that drop a share of packets at random (`-m statistic`);
//! - a rolling restart of every node (`docker restart`, SIGTERM first), each node answering
//!   `KEEL.STATUS` again before the next goes.
//!
//! Beside it, every cluster runs a Kite keyspace with `keel_client::kite_workload`
//! (releases and acquires in message-passing pairs, FAAs on counters).
//!
//! At the end of the workload every fault is healed, the cluster must agree on a leader
//! and catch up, the queues are drained, the leader's log gives the writes that survived,
//! and the history is checked (`keel_client::workload::check`): cross-client monotonic
//! reads, the Correctables views, linearizability of the `durable` keys read
//! `linearizable`, no acknowledged `durable` write lost, no value read at `monotonic`
//! lost, and the queues (`keel_check::queue`). Kite's checks apply when the schedule
//! stopped at most one node (Kite keeps its data in memory only). Each schedule
//! prints one line, or one JSON object with `--json`; a schedule replays with `--seed` and
//! `--schedules 1` (the same faults in the same order at the same offsets; the real
//! interleaving differs from run to run).
//!
//! Everything a run creates carries the label `keel.torture=<run>` and is removed at the
//! end, on failure and on Ctrl-C.

use anyhow::{bail, Context};
use keel_client::history::{fetch_survivors, Recorder};
use keel_client::kite_workload::{self, KiteConfig};
use keel_client::workload::{self, Progress, Rng, Verdicts, WorkloadConfig};
use keel_client::{Client, ClientConfig};
use serde_json::json;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The client port inside each container.
const CLIENT_PORT: u16 = 7379;
/// The peer port inside each container.
const PEER_PORT: u16 = 7479;
/// How long one docker command may take.
const DOCKER_TIMEOUT: Duration = Duration::from_secs(90);
/// How long a cluster has to elect a leader (after start, and after the final heal).
const LEADER_WAIT: Duration = Duration::from_secs(60);
/// How long the nodes have to apply the same log after the final heal.
const CATCH_UP_WAIT: Duration = Duration::from_secs(30);
/// How long a restarted node has to answer `KEEL.STATUS` in a rolling restart.
const RESTART_WAIT: Duration = Duration::from_secs(30);
/// The Kite keyspace every schedule's cluster also runs (keyspace 0 runs the leader
/// engine).
const KITE_KEYSPACE: u32 = 1;
/// Kite sessions per node (the first of each writes its message-passing pair).
const KITE_SESSIONS_PER_NODE: usize = 2;
/// The share of packets a flaky link drops.
const FLAKY_DROP: f64 = 0.3;

/// The most a schedule of `seconds` may take, start to verdict: its workload, then the
/// waits above with room to spare (the longest schedule of the soaks so far took twice
/// its workload). One that takes longer is ended with the verdict `error`, naming the
/// stage it was in (a harness or cluster that hangs must not stall a run of hundreds).
fn schedule_bound(seconds: u64) -> Duration {
    Duration::from_secs(3 * seconds + 240)
}

/// Where a schedule is, for the report of one that overran [`schedule_bound`].
#[derive(Debug)]
struct Stage(std::sync::Mutex<&'static str>);

impl Stage {
    fn new() -> Stage {
        Stage(std::sync::Mutex::new("starting the cluster"))
    }

    fn set(&self, stage: &'static str) {
        *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = stage;
    }

    fn get(&self) -> &'static str {
        *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A spawned task aborted when dropped: a schedule ended by its bound leaves no workload
/// running into the next one.
struct Aborting<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for Aborting<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Flags of `keel torture`.
#[derive(Debug, Clone, clap::Args)]
pub struct TortureArgs {
    /// `ci`: 28 schedules of 10 s (every fault kind twice first, about 6 minutes);
    /// `soak`: 1,000 schedules of 15 s (about 5 hours).
    #[arg(long, value_enum, default_value_t = Profile::Ci)]
    pub profile: Profile,
    /// The first schedule's seed; schedule k has seed SEED + k (default: random).
    #[arg(long)]
    pub seed: Option<u64>,
    /// How many schedules (default: the profile's).
    #[arg(long)]
    pub schedules: Option<u64>,
    /// Seconds of workload per schedule (default: the profile's).
    #[arg(long)]
    pub seconds: Option<u64>,
    /// Nodes per cluster: 3 or 5.
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// Concurrent client sessions.
    #[arg(long, default_value_t = 8)]
    pub sessions: usize,
    /// One JSON object per schedule on standard output.
    #[arg(long)]
    pub json: bool,
    /// The image to run.
    #[arg(long, default_value = "keel:local")]
    pub image: String,
    /// Where configurations and histories go (default: a fresh temporary directory; kept
    /// when a schedule fails).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Keep every schedule's history, not only failing ones'.
    #[arg(long)]
    pub keep: bool,
    /// A negative control that the checks must catch: `any-as-monotonic` records reads
    /// made at `any` as `monotonic` reads; `durable-before-fsync` and
    /// `kite-no-slow-path` break the server's promises (`[testing]`).
    #[arg(long, value_enum)]
    pub control: Option<Control>,
    /// The most one schedule may take, in seconds, before it is ended with the verdict
    /// `error` naming the stage it was in (default: 3 × its workload's seconds + 240).
    #[arg(long)]
    pub schedule_bound: Option<u64>,
}

/// A run's length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Profile {
    /// 28 schedules of 10 s.
    Ci,
    /// 1,000 schedules of 15 s.
    Soak,
}

impl Profile {
    fn schedules(self) -> u64 {
        match self {
            Profile::Ci => 28,
            Profile::Soak => 1000,
        }
    }

    fn seconds(self) -> u64 {
        match self {
            Profile::Ci => 10,
            Profile::Soak => 15,
        }
    }
}

/// A negative control.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Control {
    /// Reads at `any` recorded as `monotonic`.
    AnyAsMonotonic,
    /// Every node acknowledges `durable` writes before any fsync
    /// (`[testing] unsafe_ack_durable_before_fsync`).
    DurableBeforeFsync,
    /// Kite releases that time out go ahead without the slow path
    /// (`[testing] unsafe_kite_no_slow_path`).
    KiteNoSlowPath,
}

/// The kinds of fault, in the order the `ci` profile starts its schedules with them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// SIGKILL of the leader, started again after the hold.
    KillLeader,
    /// SIGKILL of a follower.
    KillFollower,
    /// SIGKILL of a majority (the leader among them).
    KillMajority,
    /// SIGKILL of every node.
    KillAll,
    /// The leader frozen.
    PauseLeader,
    /// A follower frozen.
    PauseFollower,
    /// The leader cut off from every peer, both ways.
    IsolateLeader,
    /// A minority cut off from the majority, both ways.
    SplitMinority,
    /// Two halves cut from each other; one node hears both.
    Bridge,
    /// The leader's packets to its peers dropped, or theirs to it (one way).
    OneWay,
    /// Every peer link drops packets at random.
    Flaky,
    /// Every node restarted in turn, each serving before the next.
    RollingRestart,
    /// The next fsync of the leader or of a follower fails with `EIO`: the node stops.
    DiskEio,
    /// The leader's or a follower's file system fills up: its next write fails.
    DiskFull,
}

impl Kind {
    /// How many of `nodes` nodes it stops, losing what they held in memory only (a Kite
    /// keyspace's data).
    pub fn nodes_stopped(self, nodes: usize) -> usize {
        match self {
            Kind::KillLeader | Kind::KillFollower | Kind::DiskEio | Kind::DiskFull => 1,
            Kind::KillMajority => nodes / 2 + 1,
            Kind::KillAll | Kind::RollingRestart => nodes,
            _ => 0,
        }
    }

    /// Every kind.
    pub const ALL: [Kind; 14] = [
        Kind::KillLeader,
        Kind::KillFollower,
        Kind::KillMajority,
        Kind::KillAll,
        Kind::PauseLeader,
        Kind::PauseFollower,
        Kind::IsolateLeader,
        Kind::SplitMinority,
        Kind::Bridge,
        Kind::OneWay,
        Kind::Flaky,
        Kind::RollingRestart,
        Kind::DiskEio,
        Kind::DiskFull,
    ];

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Kind::KillLeader => "kill-leader",
            Kind::KillFollower => "kill-follower",
            Kind::KillMajority => "kill-majority",
            Kind::KillAll => "kill-all",
            Kind::PauseLeader => "pause-leader",
            Kind::PauseFollower => "pause-follower",
            Kind::IsolateLeader => "isolate-leader",
            Kind::SplitMinority => "split-minority",
            Kind::Bridge => "bridge",
            Kind::OneWay => "one-way",
            Kind::Flaky => "flaky",
            Kind::RollingRestart => "rolling-restart",
            Kind::DiskEio => "disk-eio",
            Kind::DiskFull => "disk-full",
        }
    }
}

/// One fault of a plan: what, when (from the workload's start) and for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    /// The kind.
    pub kind: Kind,
    /// When it starts.
    pub at: Duration,
    /// How long it holds before it is healed (a rolling restart takes what it takes).
    pub hold: Duration,
    /// The draw that picks its nodes among the candidates.
    pub pick: u64,
}

/// The faults of the schedule with `seed`, within `seconds` of workload: the first of kind
/// `Kind::ALL[seed % 14]`, then as many as fit, drawn at random, each healed before the
/// next starts.
pub fn plan(seed: u64, seconds: u64) -> Vec<Planned> {
    let mut rng = Rng(seed ^ 0x7047_7572_6521_u64);
    let end = Duration::from_secs(seconds.saturating_sub(1));
    let first = Kind::ALL[(seed % Kind::ALL.len() as u64) as usize];
    let mut at = Duration::from_millis(1000 + rng.below(1500));
    let mut faults = Vec::new();
    let mut kind = first;
    loop {
        let hold = Duration::from_millis(1500 + rng.below(2500));
        if !faults.is_empty() && at + hold > end {
            break;
        }
        faults.push(Planned { kind, at, hold, pick: rng.draw() });
        // Rolling restarts take a few seconds per node: leave room after one.
        let after = if kind == Kind::RollingRestart { 6000 } else { 500 };
        at += hold + Duration::from_millis(after + rng.below(1500));
        kind = Kind::ALL[rng.below(Kind::ALL.len() as u64) as usize];
    }
    faults
}

/// Runs `keel torture`.
pub fn run(args: &TortureArgs) -> ExitCode {
    if args.nodes != 3 && args.nodes != 5 {
        eprintln!("keel torture: --nodes must be 3 or 5");
        return ExitCode::from(2);
    }
    if !(1..=workload::SESSIONS_MAX).contains(&args.sessions) {
        eprintln!("keel torture: --sessions must be in 1..={}", workload::SESSIONS_MAX);
        return ExitCode::from(2);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let run_id = format!("kt{}", std::process::id());
    let dir = args.dir.clone().unwrap_or_else(|| std::env::temp_dir().join(&run_id));
    let stop = Arc::new(AtomicBool::new(false));
    let guard = Cleanup { run: run_id.clone(), dir: dir.clone() };
    let result = runtime.block_on(torture(args, &run_id, &dir, stop));
    drop(guard);
    match result {
        Ok(summary) => {
            eprintln!(
                "keel torture: {} schedules, {} held, {} failed{}",
                summary.run,
                summary.run - summary.failed,
                summary.failed,
                if summary.interrupted { " (interrupted)" } else { "" }
            );
            if summary.failed > 0 || summary.keep {
                eprintln!("histories and configurations kept in {}", dir.display());
            } else {
                let _ = std::fs::remove_dir_all(&dir);
            }
            if summary.interrupted {
                ExitCode::from(130)
            } else if summary.failed > 0 {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("keel torture: {e:#}");
            eprintln!("configurations and histories: {}", dir.display());
            ExitCode::from(2)
        }
    }
}

struct Summary {
    run: u64,
    failed: u64,
    interrupted: bool,
    keep: bool,
}

async fn torture(
    args: &TortureArgs,
    run_id: &str,
    dir: &Path,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<Summary> {
    docker(&["image", "inspect", "--format", "{{.Id}}", &args.image])
        .await
        .with_context(|| format!("no image {}: build it with deploy/build-image.sh", args.image))?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    {
        let stop = stop.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!("keel torture: interrupted; cleaning up");
                stop.store(true, Ordering::Relaxed);
            }
        });
    }
    let subnet = create_network(run_id).await?;
    let first = args.seed.unwrap_or_else(|| keel_client::fresh_id() % 1_000_000_000);
    let schedules = args.schedules.unwrap_or(args.profile.schedules());
    let seconds = args.seconds.unwrap_or(args.profile.seconds()).max(3);
    if !args.json {
        println!(
            "keel torture: {schedules} schedules of {seconds} s on {} nodes, seeds {first}..{}",
            args.nodes,
            first + schedules - 1
        );
    }
    let mut summary = Summary { run: 0, failed: 0, interrupted: false, keep: args.keep };
    for k in 0..schedules {
        if stop.load(Ordering::Relaxed) {
            summary.interrupted = true;
            break;
        }
        let seed = first + k;
        let schedule_dir = dir.join(format!("schedule-{seed}"));
        let mut cluster = Cluster::new(
            run_id,
            &subnet,
            seed,
            args.nodes,
            &args.image,
            &schedule_dir,
            args.control,
        )?;
        // A disk that can fill up: each node's /data on a small file system of its own.
        // Without root or loop devices the schedule runs with its disk-full faults skipped,
        // and its report says so.
        if plan(seed, seconds).iter().any(|f| f.kind == Kind::DiskFull) {
            if let Err(e) = cluster.mount_disks().await {
                cluster.unmount_disks().await;
                cluster.disks = None;
                cluster.disk_error = Some(format!("{e:#}"));
            }
        }
        let stage = Stage::new();
        let bound = args.schedule_bound.map_or(schedule_bound(seconds), Duration::from_secs);
        let timed = schedule(args, &cluster, seed, seconds, &stop, &stage);
        let (report, overrun) = match tokio::time::timeout(bound, timed).await {
            Ok(report) => (report, false),
            Err(_) => (Ok(overran(&cluster, seed, bound, stage.get()).await), true),
        };
        cluster.remove().await;
        if overrun {
            // A `docker run` cut short may still create its container after the removal
            // above; it would hold an address the next schedule's nodes use.
            let run = run_id.to_string();
            let _ = tokio::task::spawn_blocking(move || remove_late_containers(&run)).await;
        }
        if stop.load(Ordering::Relaxed) {
            summary.interrupted = true;
            break;
        }
        // A harness error (docker, or the log unreadable) fails the schedule, not the run.
        let report = report.unwrap_or_else(
            |e| json!({"seed": seed, "verdict": "error", "counterexample": format!("{e:#}")}),
        );
        summary.run += 1;
        let failed = report["verdict"] != "ok";
        summary.failed += u64::from(failed);
        if !failed && !args.keep {
            let _ = std::fs::remove_dir_all(&schedule_dir);
        }
        if args.json {
            println!("{report}");
        } else {
            print_line(&report);
        }
    }
    Ok(summary)
}

fn print_line(report: &serde_json::Value) {
    let faults: Vec<String> = report["faults"]
        .as_array()
        .map(|faults| {
            faults
                .iter()
                .map(|f| format!("{}{}", f["kind"].as_str().unwrap_or("?"), f["nodes"]))
                .collect()
        })
        .unwrap_or_default();
    println!(
        "seed {:<10} {:<10} ops {:>6} (ok {:>6})  {}",
        report["seed"],
        report["verdict"].as_str().unwrap_or("?"),
        report["ops"],
        report["ok"],
        faults.join(" ")
    );
    if let Some(why) = report.get("counterexample").filter(|c| !c.is_null()) {
        println!("  {why}");
    }
}

/// One schedule on a fresh cluster: its report.
async fn schedule(
    args: &TortureArgs,
    cluster: &Cluster,
    seed: u64,
    seconds: u64,
    stop: &Arc<AtomicBool>,
    stage: &Stage,
) -> anyhow::Result<serde_json::Value> {
    let started = Instant::now();
    cluster.start().await?;
    stage.set("waiting for a leader at the start");
    if wait_leader(cluster, stop).await.is_none() {
        bail!("schedule {seed}: no leader within {} s of the start", LEADER_WAIT.as_secs());
    }
    let recorder = Arc::new(Recorder::default());
    let client = Client::new(ClientConfig::new(cluster.client_addrs()));
    let progress = Arc::new(Progress::default());
    let config = WorkloadConfig {
        sessions: args.sessions,
        keys: 5,
        duration: Duration::from_secs(seconds),
        seed,
        any_as_monotonic: args.control == Some(Control::AnyAsMonotonic),
    };
    stage.set("running the workloads and the faults");
    let mut work = Aborting(tokio::spawn(workload::run(
        client.clone(),
        recorder.clone(),
        config,
        progress.clone(),
    )));
    let kite_client = Client::new(ClientConfig {
        keyspace: KITE_KEYSPACE,
        ..ClientConfig::new(cluster.client_addrs())
    });
    let kite_config = KiteConfig {
        sessions_per_node: KITE_SESSIONS_PER_NODE,
        duration: Duration::from_secs(seconds),
        seed,
    };
    let mut kite_work = Aborting(tokio::spawn(kite_workload::run(
        kite_client.clone(),
        kite_config,
        progress.clone(),
    )));
    let plan = plan(seed, seconds);
    // Kite keeps its data in memory only: its checks apply when at most one node lost
    // its memory (kite_workload's module doc).
    let stopped: usize = plan.iter().map(|f| f.kind.nodes_stopped(cluster.nodes.len())).sum();
    let kite_judged = stopped <= 1;
    let nemesis = Nemesis { cluster, rng: Rng(seed ^ 0x006E_656D_6573_6973) };
    let faults = nemesis.run(&plan, stop, &progress).await;
    stage.set("waiting for the workloads to end");
    // Stops the workloads early on Ctrl-C.
    while !work.0.is_finished() || !kite_work.0.is_finished() {
        if stop.load(Ordering::Relaxed) {
            progress.stop.store(true, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (&mut work.0).await.context("the workload panicked")?;
    let kite_log = (&mut kite_work.0).await.context("the kite workload panicked")?;
    let faults = faults?;
    stage.set("healing");
    cluster.heal_all().await?;
    let ops = recorder.ops();
    let count = |outcome| ops.iter().filter(|op| op.outcome == outcome).count();
    let mut report = json!({
        "schedule": seed - args.seed.unwrap_or(seed),
        "seed": seed,
        "nodes": cluster.nodes.len(),
        "seconds": seconds,
        "faults": faults,
        "clocks": cluster.clocks.iter().map(|(rate, offset)| json!({"rate_ppm": rate, "offset_ms": offset})).collect::<Vec<_>>(),
        "ops": ops.len(),
        "ok": count(keel_check::history::Outcome::Ok),
        "failed": count(keel_check::history::Outcome::Fail),
        "unknown": count(keel_check::history::Outcome::Unknown),
    });
    if let Some(control) = args.control {
        report["control"] = json!(format!("{control:?}"));
    }
    stage.set("waiting for a leader after the heal");
    let Some(leader) = wait_leader(cluster, stop).await else {
        report["verdict"] = json!("unavailable");
        report["counterexample"] =
            json!(format!("no leader within {} s of the heal", LEADER_WAIT.as_secs()));
        return Ok(report);
    };
    stage.set("waiting for the nodes to apply the same log");
    if !wait_caught_up(cluster, stop).await {
        report["verdict"] = json!("unavailable");
        report["counterexample"] = json!(format!(
            "the nodes had not applied the same log {} s after the heal",
            CATCH_UP_WAIT.as_secs()
        ));
        return Ok(report);
    }
    // What could not be done after the heal makes the verdict `unavailable`, unless a
    // check found a violation in what was recorded: nothing hides one.
    let mut incomplete: Vec<String> = Vec::new();
    stage.set("draining the queues");
    if let Err(e) = workload::drain(&client, &recorder).await {
        incomplete.push(format!("the queues could not be drained: {e}"));
    }
    report["queue_drained"] = json!(incomplete.is_empty());
    let queue = recorder.queue_ops();
    let kite = if kite_judged {
        stage.set("reading the kite counters");
        let finals = match kite_workload::finals(&kite_client).await {
            Ok(finals) => finals,
            Err(e) => {
                incomplete.push(format!("the kite counters could not be read after the heal: {e}"));
                // The checks that need no final values still run.
                std::collections::BTreeMap::new()
            }
        };
        Some(kite_workload::check(&kite_log, &finals))
    } else {
        None
    };
    if kite.as_ref().is_some_and(|k| k.violations_total > 0) || args.keep {
        kite_log.write_faas(&cluster.dir.join("kite-faas.jsonl")).context("writing the FAAs")?;
    }
    report["kite"] = json!({
        "judged": kite_judged,
        "nodes_stopped": stopped,
        "ops": kite_log.ops,
        "failed": kite_log.failed,
        "faas": kite.as_ref().map(|k| k.faas),
        "swaps": kite.as_ref().map(|k| k.swaps),
        "pairs": kite.as_ref().map(|k| k.pairs),
        "violations": kite.as_ref().map(|k| k.violations_total),
        "faas_refused": kite_log.faa_refused.0,
        "faas_refused_first": kite_log.faa_refused.1,
    });
    stage.set("reading the leader's log");
    let survivors = survivors(cluster, leader).await?;
    recorder
        .write(&cluster.dir.join("history.jsonl"), &survivors)
        .context("writing the history")?;
    stage.set("checking the histories");
    let verdicts = tokio::task::spawn_blocking({
        let (ops, queue) = (ops.clone(), queue.clone());
        move || workload::check(&ops, &survivors, &queue)
    })
    .await?;
    if verdicts.queue.violations_total > 0 || args.keep {
        queue.write(&cluster.dir.join("queue.jsonl")).context("writing the queue operations")?;
    }
    report["checks"] = checks(&verdicts);
    let kite_violations = kite.as_ref().map_or(0, |k| k.violations_total);
    let dropped = recorder.dropped();
    report["dropped_ops"] = json!(dropped);
    if dropped > 0 {
        // A history missing operations cannot be judged either way; the Kite checks keep
        // their own complete log, so a Kite violation still stands.
        incomplete
            .push(format!("{dropped} operations past the recorder's bound were not recorded"));
    }
    report["verdict"] = json!(if kite_violations > 0 {
        "violation"
    } else if dropped > 0 {
        "unknown"
    } else if verdicts.violations() > 0 {
        "violation"
    } else if !incomplete.is_empty() {
        "unavailable"
    } else if verdicts.hold() {
        "ok"
    } else {
        "unknown"
    });
    report["counterexample"] = match kite.as_ref().and_then(|k| k.violations.first()) {
        Some(first) if verdicts.violations() == 0 || dropped > 0 => json!(first),
        _ if dropped > 0 => json!(incomplete.join("; ")),
        _ if verdicts.violations() == 0 && !incomplete.is_empty() => json!(incomplete.join("; ")),
        _ => counterexample(&verdicts),
    };
    report["elapsed_s"] = json!((started.elapsed().as_secs_f64() * 10.0).round() / 10.0);
    Ok(report)
}

/// Removes the containers of run `run` until none has been there for two checks in a
/// row, half a second apart (at most ten seconds).
fn remove_late_containers(run: &str) {
    let mut quiet = 0;
    for _ in 0..20 {
        quiet = if remove_run_containers(run) == 0 { quiet + 1 } else { 0 };
        if quiet == 2 {
            return;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Lists `docker ARGS`'s output words (none if docker fails).
fn docker_words(args: &[&str]) -> Vec<String> {
    std::process::Command::new("docker")
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).split_whitespace().map(String::from).collect())
        .unwrap_or_default()
}

/// Removes every container of run `run` (by its label), with its volumes; how many there
/// were.
fn remove_run_containers(run: &str) -> usize {
    let label = format!("label=keel.torture={run}");
    let containers = docker_words(&["ps", "-aq", "--filter", &label]);
    if !containers.is_empty() {
        let _ = std::process::Command::new("docker")
            .args(["rm", "-f", "-v"])
            .args(&containers)
            .output();
    }
    containers.len()
}

/// The report of a schedule that overran its `bound`: verdict `error`, the stage it was
/// in, and what each node said of itself then (its directory is kept, as for any failure).
async fn overran(
    cluster: &Cluster,
    seed: u64,
    bound: Duration,
    stage: &'static str,
) -> serde_json::Value {
    let nodes: Vec<serde_json::Value> = cluster
        .statuses()
        .await
        .iter()
        .map(|status| match status {
            Some(s) => json!({
                "role": s["role"],
                "leader": s["leader"],
                "epoch": s["epoch"],
                "applied_index": s["applied_index"],
            }),
            None => json!(null),
        })
        .collect();
    json!({
        "seed": seed,
        "nodes": cluster.nodes.len(),
        "verdict": "error",
        "stage": stage,
        "statuses": nodes,
        "counterexample": format!(
            "the schedule took over {} s (its bound) and was ended while {stage}",
            bound.as_secs()
        ),
    })
}

/// The writes that survived, from the leader's log, over fresh connections (the
/// workload's may have been cut by the faults); a few tries.
async fn survivors(
    cluster: &Cluster,
    leader: usize,
) -> anyhow::Result<Vec<keel_check::history::Survivor>> {
    let mut last = None;
    for _ in 0..5 {
        let client = Client::new(ClientConfig::new(cluster.client_addrs()));
        match fetch_survivors(&client, leader).await {
            Ok(survivors) => return Ok(survivors),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(last.expect("tried")).context("reading the leader's log")
}

fn checks(v: &Verdicts) -> serde_json::Value {
    json!({
        "monotonic_reads": v.monotonic.reads,
        "monotonic_violations": v.monotonic.violations_total,
        "views": v.views.views,
        "views_violations": v.views.violations_total,
        "linearizable_ops": v.linearizable.ops,
        "linearizability": v.linearizable.verdict.name(),
        "durable_writes_lost": v.durable_lost.0,
        "queue_enqueued": v.queue.enqueued,
        "queue_taken": v.queue.taken,
        "queue_violations": v.queue.violations_total,
    })
}

fn counterexample(v: &Verdicts) -> serde_json::Value {
    if let Some(first) = v.monotonic.violations.first() {
        return json!(format!("{}: {}", first.rule.name(), first.message));
    }
    if v.durable_lost.0 > 0 {
        return json!(format!(
            "{} acknowledged durable writes lost: {}",
            v.durable_lost.0,
            v.durable_lost.1.join(" ")
        ));
    }
    if let Some(first) = v.views.violations.first() {
        return json!(first);
    }
    if let Some(first) = v.queue.violations.first() {
        return json!(first);
    }
    match &v.linearizable.verdict {
        keel_check::linearizability::Verdict::NotLinearizable(c) => json!(c.to_string()),
        keel_check::linearizability::Verdict::Unknown { key, budget_steps } => {
            json!(format!("key {key}: the search ran out of its {budget_steps} steps"))
        }
        keel_check::linearizability::Verdict::Linearizable => serde_json::Value::Null,
    }
}

/// Waits for the nodes that answer to agree on a leader holding its lease; its index.
async fn wait_leader(cluster: &Cluster, stop: &AtomicBool) -> Option<usize> {
    let deadline = Instant::now() + LEADER_WAIT;
    while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
        if let Some(leader) = cluster.agreed_leader().await {
            return Some(leader);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// Waits until every node has applied the same index.
async fn wait_caught_up(cluster: &Cluster, stop: &AtomicBool) -> bool {
    let deadline = Instant::now() + CATCH_UP_WAIT;
    while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
        let statuses = cluster.statuses().await;
        let applied: Vec<u64> =
            statuses.iter().filter_map(|s| s.as_ref()?["applied_index"].as_u64()).collect();
        if applied.len() == cluster.nodes.len() && applied.iter().all(|a| *a == applied[0]) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// One container.
#[derive(Debug, Clone)]
struct Node {
    name: String,
    ip: Ipv4Addr,
}

/// A schedule's cluster of containers.
struct Cluster {
    run: String,
    network: String,
    image: String,
    dir: PathBuf,
    nodes: Vec<Node>,
    /// Each node's clock: (rate in ppm, offset in ms).
    clocks: Vec<(i32, u64)>,
    /// The size of each node's own file system, when they have one (`disk-full`).
    disks: Option<u64>,
    /// Why they could not have one (`disk-full` then skipped).
    disk_error: Option<String>,
}

/// The file system each node gets in a schedule with `disk-full`.
const DISK_BYTES: u64 = 256 << 20;
/// What `disk-full` leaves free: less than a segment, so the log soon needs more.
const DISK_LEFT_BYTES: u64 = 16 << 10;
/// The file that fills a node's file system.
const FILLER: &str = "torture-filler";

impl Cluster {
    /// Writes the configurations for `nodes` nodes on `subnet` (its first three octets).
    fn new(
        run: &str,
        subnet: &[u8; 3],
        seed: u64,
        nodes: usize,
        image: &str,
        dir: &Path,
        control: Option<Control>,
    ) -> anyhow::Result<Cluster> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let nodes: Vec<Node> = (1..=nodes)
            .map(|i| Node {
                name: format!("{run}-{seed}-n{i}"),
                ip: Ipv4Addr::new(subnet[0], subnet[1], subnet[2], 10 + i as u8),
            })
            .collect();
        let members: String = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                format!("[[members]]\nid = {}\npeer_addr = \"{}:{PEER_PORT}\"\n", i + 1, n.ip)
            })
            .collect();
        let secret: String = (0..4).map(|_| format!("{:016x}", keel_client::fresh_id())).collect();
        write_private(&dir.join("cluster.secret"), &secret)?;
        // Every node's clock runs fast or slow within the engine's drift bound, from an
        // offset of its own; every kill is a power loss; SIGUSR1 fails the next fsync.
        let mut rng = Rng(seed ^ 0x636C_6F63_6B73);
        let clocks: Vec<(i32, u64)> = (0..nodes.len())
            .map(|_| {
                let bound = keel_server::config::CLOCK_RATE_PPM_MAX;
                let rate = rng.below(2 * bound as u64 + 1) as i32 - bound;
                (rate, rng.below(10_000))
            })
            .collect();
        let control_line = match control {
            Some(Control::DurableBeforeFsync) => "unsafe_ack_durable_before_fsync = true\n",
            Some(Control::KiteNoSlowPath) => "unsafe_kite_no_slow_path = true\n",
            _ => "",
        };
        for i in 1..=nodes.len() {
            let (rate, offset) = clocks[i - 1];
            // Client ports are reached only on the run's private network (from the host);
            // nothing is published, so no users are needed. No snapshots: the whole log
            // is read back at the end to find the writes that survived.
            let config = format!(
                "node_id = {i}\ndata_dir = \"/data\"\nclient_addr = \"0.0.0.0:{CLIENT_PORT}\"\n\
                 cluster_secret_file = \"/etc/keel/cluster.secret\"\nprotected_mode = false\n\n\
                 {members}\n[[keyspaces]]\nid = 0\nname = \"default\"\nengine = \"orca\"\n\n\
                 [[keyspaces]]\nid = {KITE_KEYSPACE}\nname = \"kite\"\nengine = \"kite\"\n\n\
                 [engine]\nsnapshot_entries_threshold = 10000000\n\n\
                 [testing]\npower_loss_on_kill = true\neio_on_sigusr1 = true\n\
                 clock_rate_ppm = {rate}\nclock_offset_ms = {offset}\n{control_line}"
            );
            std::fs::write(dir.join(format!("node{i}.toml")), config)?;
        }
        Ok(Cluster {
            run: run.to_string(),
            network: run.to_string(),
            image: image.to_string(),
            dir: dir.to_path_buf(),
            nodes,
            clocks,
            disks: None,
            disk_error: None,
        })
    }

    fn client_addrs(&self) -> Vec<SocketAddr> {
        self.nodes.iter().map(|n| SocketAddr::from((n.ip, CLIENT_PORT))).collect()
    }

    async fn start(&self) -> anyhow::Result<()> {
        for (i, node) in self.nodes.iter().enumerate() {
            let label = format!("keel.torture={}", self.run);
            let ip = node.ip.to_string();
            let config = format!(
                "{}:/etc/keel/keel.toml:ro",
                self.dir.join(format!("node{}.toml", i + 1)).display()
            );
            let secret = format!(
                "{}:/etc/keel/cluster.secret:ro",
                self.dir.join("cluster.secret").display()
            );
            let data = match &self.disks {
                Some(_) => format!("{}:/data", self.data_dir(i).display()),
                None => "/data".to_string(), // a volume of its own
            };
            docker(&[
                "run",
                "-d",
                "--name",
                &node.name,
                "--label",
                &label,
                "--network",
                &self.network,
                "--ip",
                &ip,
                "--hostname",
                &node.name,
                "-v",
                &data,
                "-v",
                &config,
                "-v",
                &secret,
                &self.image,
            ])
            .await?;
        }
        Ok(())
    }

    /// Removes the containers and their volumes (and unmounts their file systems).
    async fn remove(&self) {
        let names: Vec<&str> = self.nodes.iter().map(|n| n.name.as_str()).collect();
        let mut argv = vec!["rm", "-f", "-v"];
        argv.extend(names);
        let _ = docker(&argv).await;
        if self.disks.is_some() {
            self.unmount_disks().await;
        }
    }

    /// Unmounts the nodes' own file systems (those mounted).
    async fn unmount_disks(&self) {
        for i in 0..self.nodes.len() {
            let _ = command("umount", &[&self.data_dir(i).display().to_string()]).await;
        }
    }

    fn data_dir(&self, node: usize) -> PathBuf {
        self.dir.join(format!("data{}", node + 1))
    }

    /// Gives each node a data directory on a file system of its own, [`DISK_BYTES`] in a
    /// sparse file mounted through a loop device (needs root and `mkfs.ext4`), so that
    /// `disk-full` can fill it.
    async fn mount_disks(&mut self) -> anyhow::Result<()> {
        for i in 0..self.nodes.len() {
            let image = self.dir.join(format!("disk{}.img", i + 1));
            std::fs::File::create(&image)?.set_len(DISK_BYTES)?;
            let image = image.display().to_string();
            // No blocks reserved for root: the node runs as root in its container.
            command("mkfs.ext4", &["-q", "-F", "-m", "0", &image])
                .await
                .context("disk-full needs mkfs.ext4")?;
            let dir = self.data_dir(i);
            std::fs::create_dir_all(&dir)?;
            command("mount", &["-o", "loop", &image, &dir.display().to_string()])
                .await
                .context("disk-full needs root, to mount a loop device")?;
            self.disks = Some(DISK_BYTES);
        }
        Ok(())
    }

    /// Fills node `node`'s file system but for [`DISK_LEFT_BYTES`].
    async fn fill_disk(&self, node: usize) -> anyhow::Result<String> {
        let dir = self.data_dir(node).display().to_string();
        let avail = command("df", &["--output=avail", "-B1", &dir]).await?;
        let avail: u64 = avail.lines().nth(1).and_then(|l| l.trim().parse().ok()).unwrap_or(0);
        let fill = avail.saturating_sub(DISK_LEFT_BYTES).max(1);
        let filler = format!("{dir}/{FILLER}");
        command("fallocate", &["-l", &fill.to_string(), &filler]).await?;
        Ok(format!("{} MiB of {} MiB filled", fill >> 20, DISK_BYTES >> 20))
    }

    /// Frees what [`Cluster::fill_disk`] took.
    fn empty_disk(&self, node: usize) {
        let _ = std::fs::remove_file(self.data_dir(node).join(FILLER));
    }

    /// Each node's `KEEL.STATUS`, `None` where it did not answer.
    async fn statuses(&self) -> Vec<Option<serde_json::Value>> {
        let addrs = self.client_addrs();
        tokio::task::spawn_blocking(move || {
            addrs
                .into_iter()
                .map(|a| keel_server::local::status_in_as(a, 0, None))
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default()
    }

    /// The leader every answering node names, if it says it leads with a valid lease.
    async fn agreed_leader(&self) -> Option<usize> {
        keel_server::local::agreed_leader(&self.statuses().await)
    }

    /// The leader some node names (without waiting for agreement), else `None`.
    async fn named_leader(&self) -> Option<usize> {
        let statuses = self.statuses().await;
        statuses
            .iter()
            .flatten()
            .find(|s| s.get("role").and_then(|r| r.as_str()) == Some("leader"))
            .and_then(|s| s.get("node_id")?.as_u64())
            .and_then(|id| (id as usize).checked_sub(1))
            .filter(|i| *i < self.nodes.len())
    }

    async fn pid(&self, node: usize) -> Option<u32> {
        let out = docker(&["inspect", "--format", "{{.State.Pid}}", &self.nodes[node].name])
            .await
            .ok()?;
        out.trim().parse().ok().filter(|pid| *pid > 0)
    }

    /// Runs `iptables ARGS` inside node `node`'s network namespace (nothing when it is not
    /// running: its rules went with it).
    async fn iptables(&self, node: usize, args: &[&str]) -> anyhow::Result<()> {
        let Some(pid) = self.pid(node).await else { return Ok(()) };
        let net = format!("--net=/proc/{pid}/ns/net");
        let mut argv = vec![net.as_str(), "iptables", "-w"];
        argv.extend_from_slice(args);
        command("nsenter", &argv).await.map(drop)
    }

    /// Drops, at `to`, what arrives from `from` (with `probability`, or all of it).
    async fn drop_from(
        &self,
        to: usize,
        from: usize,
        probability: Option<f64>,
    ) -> anyhow::Result<()> {
        let source = self.nodes[from].ip.to_string();
        let p = probability.map(|p| format!("{p:.2}"));
        let mut args = vec!["-A", "INPUT", "-s", source.as_str()];
        if let Some(p) = &p {
            args.extend(["-m", "statistic", "--mode", "random", "--probability", p.as_str()]);
        }
        args.extend(["-j", "DROP"]);
        self.iptables(to, &args).await
    }

    /// Cuts every link between `a` and `b`, both ways.
    async fn cut(&self, a: &[usize], b: &[usize]) -> anyhow::Result<()> {
        for &x in a {
            for &y in b {
                self.drop_from(x, y, None).await?;
                self.drop_from(y, x, None).await?;
            }
        }
        Ok(())
    }

    /// Removes every rule this harness added, on every running node.
    async fn heal_network(&self) -> anyhow::Result<()> {
        for i in 0..self.nodes.len() {
            self.iptables(i, &["-F", "INPUT"]).await?;
        }
        Ok(())
    }

    /// Unfreezes, starts and reconnects every node.
    async fn heal_all(&self) -> anyhow::Result<()> {
        for i in 0..self.nodes.len() {
            if self.disks.is_some() {
                self.empty_disk(i);
            }
            self.start_if_stopped(i).await?;
        }
        self.heal_network().await
    }

    /// Unfreezes node `node` if frozen, starts it if stopped.
    async fn start_if_stopped(&self, node: usize) -> anyhow::Result<()> {
        let name = &self.nodes[node].name;
        let state = docker(&["inspect", "--format", "{{.State.Status}}", name]).await?;
        match state.trim() {
            "paused" => drop(docker(&["unpause", name]).await?),
            "exited" | "created" | "dead" => drop(docker(&["start", name]).await?),
            _ => {}
        }
        Ok(())
    }
}

/// Draws each fault's nodes and carries the plan out.
struct Nemesis<'c> {
    cluster: &'c Cluster,
    rng: Rng,
}

impl Nemesis<'_> {
    /// Carries out `plan` (stopping early on Ctrl-C); what was done, for the report.
    async fn run(
        mut self,
        plan: &[Planned],
        stop: &AtomicBool,
        progress: &Progress,
    ) -> anyhow::Result<Vec<serde_json::Value>> {
        let started = Instant::now();
        let mut done = Vec::new();
        for fault in plan {
            while started.elapsed() < fault.at {
                if stop.load(Ordering::Relaxed) || progress.stop.load(Ordering::Relaxed) {
                    return Ok(done);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let at = started.elapsed();
            let (nodes, mut detail) = self.inject(fault).await?;
            if fault.kind != Kind::RollingRestart {
                let until = started.elapsed() + fault.hold;
                while started.elapsed() < until && !stop.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                if let Some(healed) = self.heal(fault.kind, &nodes).await? {
                    detail = format!("{detail}; {healed}");
                }
            }
            done.push(json!({
                "kind": fault.kind.name(),
                "nodes": nodes.iter().map(|n| n + 1).collect::<Vec<_>>(),
                "detail": detail,
                "at_ms": at.as_millis() as u64,
                "healed_ms": started.elapsed().as_millis() as u64,
            }));
        }
        Ok(done)
    }

    /// The leader now (one node's word), else a node at random.
    async fn leader(&mut self) -> usize {
        match self.cluster.named_leader().await {
            Some(leader) => leader,
            None => self.rng.below(self.cluster.nodes.len() as u64) as usize,
        }
    }

    /// Nodes other than `leader`, shuffled by `pick`.
    fn others(&self, leader: usize, pick: u64) -> Vec<usize> {
        let mut others: Vec<usize> =
            (0..self.cluster.nodes.len()).filter(|i| *i != leader).collect();
        let mut rng = Rng(pick);
        for i in (1..others.len()).rev() {
            others.swap(i, rng.below(i as u64 + 1) as usize);
        }
        others
    }

    /// Starts `fault`; the nodes it touched and how.
    async fn inject(&mut self, fault: &Planned) -> anyhow::Result<(Vec<usize>, String)> {
        let c = self.cluster;
        let n = c.nodes.len();
        let leader = self.leader().await;
        let others = self.others(leader, fault.pick);
        let names = |nodes: &[usize]| -> Vec<String> {
            nodes.iter().map(|i| c.nodes[*i].name.clone()).collect()
        };
        Ok(match fault.kind {
            Kind::KillLeader | Kind::KillFollower | Kind::KillMajority | Kind::KillAll => {
                let nodes = match fault.kind {
                    Kind::KillLeader => vec![leader],
                    Kind::KillFollower => vec![others[0]],
                    Kind::KillMajority => std::iter::once(leader)
                        .chain(others.iter().copied())
                        .take(n / 2 + 1)
                        .collect(),
                    _ => (0..n).collect(),
                };
                // One command for all of them: as close to one power loss as docker gets.
                let names = names(&nodes);
                let mut argv = vec!["kill", "-s", "KILL"];
                argv.extend(names.iter().map(String::as_str));
                docker(&argv).await?;
                (nodes, "SIGKILL".into())
            }
            Kind::PauseLeader | Kind::PauseFollower => {
                let node = if fault.kind == Kind::PauseLeader { leader } else { others[0] };
                docker(&["pause", &c.nodes[node].name]).await?;
                (vec![node], "frozen".into())
            }
            Kind::IsolateLeader => {
                c.cut(&[leader], &others).await?;
                (vec![leader], "cut from every peer, both ways".into())
            }
            Kind::SplitMinority => {
                // A minority of n / 2 nodes, the leader among them half the time.
                let mut all: Vec<usize> = std::iter::once(leader).chain(others).collect();
                if fault.pick % 2 == 1 {
                    all.rotate_left(1);
                }
                let (minority, majority) = all.split_at(n / 2);
                c.cut(minority, majority).await?;
                (minority.to_vec(), format!("minority cut from {:?}", plus_one(majority)))
            }
            Kind::Bridge => {
                // The bridge hears both halves; the halves do not hear each other.
                let bridge = if fault.pick.is_multiple_of(2) { leader } else { others[0] };
                let rest: Vec<usize> = (0..n).filter(|i| *i != bridge).collect();
                let (left, right) = rest.split_at(rest.len() / 2);
                c.cut(left, right).await?;
                (
                    vec![bridge],
                    format!("bridge between {:?} and {:?}", plus_one(left), plus_one(right)),
                )
            }
            Kind::OneWay => {
                if fault.pick.is_multiple_of(2) {
                    for &o in &others {
                        c.drop_from(o, leader, None).await?;
                    }
                    (vec![leader], "its packets to its peers dropped".into())
                } else {
                    for &o in &others {
                        c.drop_from(leader, o, None).await?;
                    }
                    (vec![leader], "its peers' packets to it dropped".into())
                }
            }
            Kind::Flaky => {
                for a in 0..n {
                    for b in (0..n).filter(|b| *b != a) {
                        c.drop_from(a, b, Some(FLAKY_DROP)).await?;
                    }
                }
                ((0..n).collect(), format!("every peer link drops {:.0}%", FLAKY_DROP * 100.0))
            }
            Kind::DiskFull => {
                if let Some(why) = &c.disk_error {
                    return Ok((Vec::new(), format!("SKIPPED: {why}")));
                }
                let node = if fault.pick.is_multiple_of(2) { leader } else { others[0] };
                let filled = c.fill_disk(node).await?;
                (vec![node], filled)
            }
            Kind::DiskEio => {
                let node = if fault.pick.is_multiple_of(2) { leader } else { others[0] };
                docker(&["kill", "-s", "USR1", &c.nodes[node].name]).await?;
                (vec![node], "its next fsync fails with EIO".into())
            }
            Kind::RollingRestart => {
                let order: Vec<usize> =
                    others.iter().copied().chain(std::iter::once(leader)).collect();
                for &node in &order {
                    docker(&["restart", "-t", "10", &c.nodes[node].name]).await?;
                    let addr = SocketAddr::from((c.nodes[node].ip, CLIENT_PORT));
                    let deadline = Instant::now() + RESTART_WAIT;
                    while Instant::now() < deadline {
                        let up = tokio::task::spawn_blocking(move || {
                            keel_server::local::status_in_as(addr, 0, None).is_some()
                        })
                        .await
                        .unwrap_or(false);
                        if up {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
                (order, "SIGTERM and start, one at a time, followers first".into())
            }
        })
    }

    /// Ends a fault; what was found on the way, if worth reporting.
    async fn heal(&mut self, kind: Kind, nodes: &[usize]) -> anyhow::Result<Option<String>> {
        let c = self.cluster;
        match kind {
            Kind::KillLeader | Kind::KillFollower | Kind::KillMajority | Kind::KillAll => {
                for &node in nodes {
                    docker(&["start", &c.nodes[node].name]).await?;
                }
            }
            Kind::PauseLeader | Kind::PauseFollower => {
                docker(&["unpause", &c.nodes[nodes[0]].name]).await?;
            }
            Kind::IsolateLeader
            | Kind::SplitMinority
            | Kind::Bridge
            | Kind::OneWay
            | Kind::Flaky => c.heal_network().await?,
            Kind::DiskFull if nodes.is_empty() => {} // skipped
            Kind::DiskEio | Kind::DiskFull => {
                // The node stops at its next fsync or write (exit code 4); start it again.
                if kind == Kind::DiskFull {
                    c.empty_disk(nodes[0]);
                }
                let name = &c.nodes[nodes[0]].name;
                let state =
                    docker(&["inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", name])
                        .await?;
                c.start_if_stopped(nodes[0]).await?;
                return Ok(Some(match state.split_whitespace().collect::<Vec<_>>()[..] {
                    ["exited", code] => format!("it had stopped with exit code {code}"),
                    [state, ..] => format!("it was still {state}"),
                    [] => "its state was unknown".to_string(),
                }));
            }
            Kind::RollingRestart => {}
        }
        Ok(None)
    }
}

fn plus_one(nodes: &[usize]) -> Vec<usize> {
    nodes.iter().map(|n| n + 1).collect()
}

/// Creates the run's network on a free private /24; its first three octets.
async fn create_network(run: &str) -> anyhow::Result<[u8; 3]> {
    let label = format!("keel.torture={run}");
    let start = (std::process::id() % 200) as u8;
    let mut last = None;
    for k in 0..20u8 {
        let octets = [172, 29, start.wrapping_add(k * 7) % 250 + 1];
        let subnet = format!("{}.{}.{}.0/24", octets[0], octets[1], octets[2]);
        match docker(&["network", "create", "--label", &label, "--subnet", &subnet, run]).await {
            Ok(_) => return Ok(octets),
            Err(e) => last = Some(e),
        }
    }
    Err(last.expect("tried").context("creating the run's network"))
}

fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    file.write_all(text.as_bytes())?;
    Ok(())
}

/// Runs `docker ARGS`: its standard output, or an error with its standard error.
async fn docker(args: &[&str]) -> anyhow::Result<String> {
    command("docker", args).await
}

async fn command(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let child = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(DOCKER_TIMEOUT, child)
        .await
        .with_context(|| {
            format!("{program} {} took over {} s", args.join(" "), DOCKER_TIMEOUT.as_secs())
        })?
        .with_context(|| format!("running {program}"))?;
    if !output.status.success() {
        bail!("{program} {}: {}", args.join(" "), String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Removes every container, volume and network of the run when dropped (also after an
/// error or Ctrl-C).
struct Cleanup {
    run: String,
    dir: PathBuf,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let label = format!("label=keel.torture={}", self.run);
        remove_run_containers(&self.run);
        for network in docker_words(&["network", "ls", "-q", "--filter", &label]) {
            let _ = std::process::Command::new("docker").args(["network", "rm", &network]).output();
        }
        // The nodes' file systems of `disk-full` schedules still mounted (after an error).
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        let dir = self.dir.display().to_string();
        for point in mounts.lines().filter_map(|l| l.split_whitespace().nth(1)) {
            if point.starts_with(&dir) {
                let _ = std::process::Command::new("umount").args(["-l", point]).output();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_repeats_from_its_seed_starts_with_its_kind_and_fits_the_run() {
        for seed in 0..200 {
            let plan = plan(seed, 10);
            assert_eq!(plan, super::plan(seed, 10));
            assert_eq!(plan[0].kind, Kind::ALL[(seed % 14) as usize]);
            for pair in plan.windows(2) {
                assert!(pair[0].at + pair[0].hold < pair[1].at, "{plan:?}");
            }
            let last = plan.last().expect("one fault at least");
            assert!(plan.len() == 1 || last.at + last.hold <= Duration::from_secs(9));
        }
        let kinds: std::collections::BTreeSet<&str> =
            (0..28).map(|seed| plan(seed, 10)[0].kind.name()).collect();
        assert_eq!(kinds.len(), Kind::ALL.len(), "28 seeds start with every kind");
    }
}
