//! `keel sim`: run scenarios by seed, reproduce the ORCA paper's Tables 3 and 4, and
//! measure the simulator. Every run prints the one-line command that replays it.

use crate::disk::HardStateMode;
use crate::scenario::{run_general, GeneralConfig, RunReport, COVERAGE_GOALS};
use crate::world::Corruption;
use clap::{Args, Subcommand};
use keel_core::leader::LeaderEngine;
use std::collections::BTreeMap;
use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Most seeds one invocation runs.
pub const SEEDS_MAX: u64 = 10_000_000;

/// `keel sim` arguments.
#[derive(Args, Debug)]
pub struct SimArgs {
    /// What to run.
    #[command(subcommand)]
    pub command: SimCommand,
}

/// The `keel sim` subcommands.
#[derive(Subcommand, Debug)]
pub enum SimCommand {
    /// Run seeds of a randomized scenario with every fault on and check every invariant.
    Run(RunArgs),
    /// Reproduce ORCA Table 3: crash/recover sequences with a delayed node.
    Table3(crate::table3::Table3Args),
    /// Reproduce ORCA Table 4: location tracking and a Retwis-like app under faults.
    Table4(crate::table4::Table4Args),
    /// Report engine throughput without I/O and simulated seeds per second.
    Bench(BenchArgs),
}

/// `keel sim run` arguments.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// The engine: `orca` (the leader engine), `kite` or `geo`.
    #[arg(long, default_value = "orca", value_parser = ["orca", "kite", "geo"])]
    pub engine: String,
    /// The scenario. With `--engine kite`: `general`, `litmus` (the paper's litmus tests
    /// L1 to L11 under random delays and loss) or `faults` (its fault scenarios F1 and F5
    /// to F12 with L12, and F13, scripted). With the leader engine: `general` (all
    /// durabilities, read levels and faults), `wide-area`
    /// (the same with peer round trips of 20 to 80 ms and WAN engine timeouts),
    /// `keyspaces` (the general scenario on 2 to 4 keyspaces at once), `sharded` (2 or 3
    /// keyspaces, each on a replica group of its own three nodes), `slots` (the sharded
    /// world with hash slots moving between its keyspaces while clients follow
    /// redirects), `lease-race`
    /// (five nodes, bridge partitions, long stalls and the lease race, an aimed fault
    /// sequence started at random: two leader leases under `--forget-leader-contact`),
    /// `lease-overlap` (a scripted nemesis that drives five nodes into the lease overlap
    /// `--forget-leader-contact` reopens), `correctables` (half the stronger reads invoked
    /// as Correctables, views checked), `jobs` (a Redis list as a job queue: `RPUSH`,
    /// `LMOVE`, `LREM`), `tickets` (ticket selling on a replicated queue
    /// beside the general workload), `expiry` (half the `m*` puts with a TTL of 1 to
    /// 400 ms, wall clocks skewed by up to 2 s, every read checked against the final log)
    /// or `membership` (two nodes outside the voters, and an operator adding, promoting
    /// and removing nodes one at a time under every fault).
    #[arg(long, default_value = "general")]
    pub scenario: String,
    /// How many seeds to run, starting at `--seed`.
    #[arg(long)]
    pub seeds: Option<u64>,
    /// The (first) seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// One JSON object per seed instead of text.
    #[arg(long)]
    pub json: bool,
    /// Write the history of a single-seed run to this file (Keel history format).
    #[arg(long)]
    pub history: Option<std::path::PathBuf>,
    /// Worker threads (default: available cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Negative control: buffer the hard state instead of fsyncing it.
    #[arg(long)]
    pub skip_hard_state_sync: bool,
    /// Negative control: the engine removes followers before they mark out (implies
    /// `--partitioned-reads`).
    #[arg(long)]
    pub hasty_removal: bool,
    /// Aim the run at partitioned followers: `memory` writes, `monotonic` reads,
    /// partitions only (the positive control of `--hasty-removal`).
    #[arg(long)]
    pub partitioned_reads: bool,
    /// Opt-in fault: a crash may flip a bit in the crashing node's last fsynced records
    /// (at most once per run). `guarded`: only when a majority of the other nodes hold
    /// those entries (must pass); `unguarded`: whatever they hold (may lose writes).
    /// `hard-states`: every crash damages the hard-state file, which is rebuilt as an
    /// operator would, and a fifth of the voters crash right after voting (must pass).
    #[arg(long, value_parser = ["guarded", "unguarded", "hard-states"])]
    pub corrupt: Option<String>,
    /// Negative control: the effect executor reports each fsync without clamping it below
    /// the truncations queued after it.
    #[arg(long)]
    pub no_truncation_clamp: bool,
    /// Negative control: every read is offered off the engine loop, which serves it
    /// without the read-point check (data not yet durable on the active set).
    #[arg(long)]
    pub unchecked_view_reads: bool,
    /// Negative control: a node that moves to a higher epoch forgets when it last heard
    /// a leader, so a late reply can free its vote while that leader's lease runs
    /// (caught by `--scenario lease-race` and `--scenario lease-overlap`).
    #[arg(long)]
    pub forget_leader_contact: bool,
    /// After the sweep, print the share of seeds that reached each rare path and fault
    /// kind, against the shares the default scenario must reach.
    #[arg(long)]
    pub coverage: bool,
    /// Power losses never reboot the host's clock (by default a third of them do: a new
    /// reading and rate).
    #[arg(long)]
    pub no_clock_reboots: bool,
    /// Negative control: every drift change during a run speeds the clock up to 90% fast,
    /// far past the engine's drift bound (changes within it go both ways).
    #[arg(long)]
    pub fast_clocks: bool,
    /// Negative control: writes skip the deduplication table, so a retried or duplicated
    /// write is applied twice.
    #[arg(long)]
    pub skip_dedup: bool,
    /// Negative control: links refuse no client values, so a node queues them to a peer
    /// without bound (caught by the check of what each link holds).
    #[arg(long)]
    pub unbounded_links: bool,
    /// Negative control: a session the deduplication table forgot is taken for a new
    /// one, so a retry after its eviction is applied twice.
    #[arg(long)]
    pub accept_expired_sessions: bool,
    /// Negative control: the leader appends an open stamped below the last use of an
    /// evicted session, so a late copy of an open reopens a session whose retried
    /// request then applies again.
    #[arg(long)]
    pub accept_stale_opens: bool,
    /// Negative control: `WATCH` ignores deletes (a watched key deleted since it was
    /// read counts as unchanged), so a transaction commits over a delete.
    #[arg(long)]
    pub watch_ignores_deletes: bool,
    /// Negative control (with `--scenario slots`): a slot's source serves writes to the
    /// keys it holds for copying, so a write between the copy and the release is lost.
    #[arg(long)]
    pub slots_serve_held: bool,
    /// Negative control (with `--scenario slots`): a slot's target takes requests its
    /// source did not send on (`ASKING`), so a client whose map points there early
    /// writes a key the source still holds.
    #[arg(long)]
    pub slots_take_unasked: bool,
    /// Negative control (with `--scenario slots`): a slot's target writes every copy it
    /// is sent, over keys written since the import began.
    #[arg(long)]
    pub slots_fill_overwrites: bool,
    /// Negative control (with `--scenario expiry`): every node treats a key past its
    /// time on its own clock as absent, before the leader's expiry entry deletes it.
    #[arg(long)]
    pub local_expiry: bool,
    /// Negative control (with `--scenario jobs`): workers' pops are acknowledged at
    /// `memory`, before they are durable, so a crash can give a job out twice.
    #[arg(long)]
    pub pop_before_durable: bool,
    /// Negative control (with `--scenario membership`): the leader counts a voter it
    /// removed toward commits and `durable` writes while it is still in the active set.
    #[arg(long)]
    pub count_removed: bool,
    /// Negative control (with `--scenario membership`): learners join the active set
    /// and serve `monotonic` reads before they hold the durable index.
    #[arg(long)]
    pub learner_reads_early: bool,
    /// Negative control (with `--scenario membership`): a leader that hands its
    /// leadership over (`KEEL.NODE TRANSFER-LEADER`) keeps serving under its lease.
    #[arg(long)]
    pub transfer_keeps_lease: bool,
    /// Negative control: nodes ignore the repair floor recovery sets when it cuts
    /// damaged records, so `--corrupt unguarded` loses acknowledged writes again.
    #[arg(long)]
    pub ignore_repair_floor: bool,
    /// Chance, in parts per million, that a partition isolates the leader.
    #[arg(long, default_value_t = 0)]
    pub aim_leader_ppm: u32,
    /// Negative control (`--engine kite`): a release that times out goes on without the
    /// slow release, so a node that missed a write is never told.
    #[arg(long)]
    pub no_slow_path: bool,
    /// Negative control (`--engine kite`): a release (or read-modify-write) sends its
    /// value before any acknowledgement of its session's earlier writes, so another node
    /// can see it before them (caught by the `general` scenario's histories).
    #[arg(long)]
    pub release_before_acks: bool,
    /// Negative control (`--engine kite`): a release's value and a read-modify-write's
    /// commit count as done once sent, without a quorum's acknowledgements (caught by the
    /// `general` scenario's histories).
    #[arg(long)]
    pub complete_without_quorum: bool,
    /// Negative control (`--engine kite`): an out-of-epoch access puts its key in the
    /// machine's current epoch, not the one it started in.
    #[arg(long)]
    pub no_epoch_snapshot: bool,
    /// Negative control (`--engine kite`): the paper's reset-bit, sent to every node and
    /// naming only the acquire (caught by the `faults` scenario's F13).
    #[arg(long)]
    pub paper_reset: bool,
    /// Negative control (`--engine kite`): a restarted node serves at once with an empty
    /// memory, without rejoining (caught by the `faults` scenario's F14).
    #[arg(long)]
    pub no_rejoin: bool,
    /// Negative control (`--engine kite`): the rejoin without its fence, the rule before
    /// it: a round may count a reply the restarted node's memory lost together with one
    /// sent after the rejoin read its sender (caught by the `general` scenario's late
    /// acknowledgements on 5 and 7 nodes).
    #[arg(long)]
    pub unfenced_rejoin: bool,
    /// Negative control (`--engine kite`): a client whose connection broke sends its
    /// read-modify-writes again as new requests, not under the numbers it gave them, so
    /// one can be applied twice (caught by the `general` scenario's client cuts).
    #[arg(long)]
    pub unnamed_retries: bool,
    /// Negative control (`--engine kite`): a read-modify-write its client named that fails
    /// answers at once without committing its failure, so its first attempt, still
    /// running at the node the client left, can swap after the retry answered that it
    /// failed (caught by the `general` scenario's client cuts).
    #[arg(long)]
    pub uncommitted_failures: bool,
    /// Negative control (`--engine kite`): proposers ignore the outcomes and makers a
    /// quorum shows, so a request done already is done again under its id (caught by the
    /// simulator's watch on commits: one request committed at two stamps).
    #[arg(long)]
    pub forget_outcomes: bool,
    /// Negative control (Kite, `--scenario membership`): during a membership change a
    /// quorum is a majority of the new voters alone.
    #[arg(long)]
    pub new_quorum_only: bool,
    /// Negative control (Kite, `--scenario membership`): a change settles on the new
    /// voters without a majority of them having read the old voters' state.
    #[arg(long)]
    pub unsynced_change: bool,
    /// Negative control (Kite, `--scenario membership`): a round keeps the replies it
    /// counted under a membership just replaced.
    #[arg(long)]
    pub mixed_epoch_rounds: bool,
    /// Negative control (with `--scenario correctables`): an invoked read records its
    /// first preliminary view as its final one, so the final view can be stale.
    #[arg(long)]
    pub stale_final_view: bool,
    /// Negative control (`--engine geo`): remote transactions become visible once the
    /// reading data center stores them, before they are uniform, so a barrier's past can
    /// be lost when two data centers fail (caught by the causal checker's
    /// `lost-after-barrier`; every run aims the fault).
    #[arg(long)]
    pub expose_non_uniform: bool,
    /// Negative control (`--engine geo`): a replica that restarts serves again, empty,
    /// instead of staying failed; every run restarts one, and its data center's
    /// sessions go on using it (caught by the causal checker: reads miss what their
    /// session saw).
    #[arg(long)]
    pub rejoin_empty: bool,
    /// Negative control (`--engine geo`): certification commits every strong
    /// transaction, conflicting or not (caught by the causal checker's
    /// `conflict-order`: two withdrawals that neither saw the other).
    #[arg(long)]
    pub certify_all: bool,
    /// Negative control (`--engine geo`): a strong commit is certified without waiting
    /// for its snapshot's local entry to be uniform; every run fails a data center right
    /// after a strong commit there (caught by `convergence`: the strong transaction
    /// depends on a lost one, so it never becomes visible at the survivors).
    #[arg(long)]
    pub skip_strong_barrier: bool,
    /// Negative control (`--engine geo`): strong delivery ignores undecided votes, so a
    /// partition's strong entry passes a transaction not yet delivered there (caught by
    /// `return-value`: a read on a snapshot that includes it misses its updates).
    #[arg(long)]
    pub deliver_early: bool,
    /// Negative control (`--engine geo`): a certification candidate that a majority
    /// joined leads with its own log, not the most advanced of theirs (caught by
    /// `conflict-order` and `convergence`: a new leader that lacks durable votes and
    /// decisions commits a conflicting transaction, or never delivers a committed one).
    #[arg(long)]
    pub skip_recovery: bool,
    /// Negative control (`--engine geo`): a certification leader forgets a committed
    /// transaction once its expiry passed, before every participant decided it (caught
    /// when a participant's new leader still waits on its vote: it takes `FORGOTTEN` as
    /// an abort, and the transaction's updates there are never delivered).
    #[arg(long)]
    pub forget_unsettled: bool,
    /// Negative control (`--engine geo`): collection forgets remote transactions once
    /// every data center neither removed nor suspected stores them, as if suspicion
    /// removed a data center (caught when a data center cut off comes back after
    /// another failed: nobody holds that one's transactions for it any more).
    #[arg(long)]
    pub collect_suspected: bool,
    /// Negative control (`--engine geo`): an operator's removal of a data center is not
    /// refused when the data centers removed or failed for some partition would be more
    /// than `f` (caught when the simulator's mistaken removal of a live data center, asked
    /// once `f` have failed, is made).
    #[arg(long)]
    pub remove_beyond_f: bool,
    /// Negative control (`--engine geo`): the node an operator asks removes a data center
    /// on its own, without the promises of a majority of the data centers' acceptors
    /// (caught when the simulator asks two removals at once, at two nodes, where `f`
    /// tolerates one).
    #[arg(long)]
    pub unagreed_removal: bool,
    /// Negative control (`--engine geo`): a removal notice whose sends were spent while its
    /// removed member was cut off is not sent again when that member is heard (caught by
    /// `removed-untold`: the member runs on, untold, to the end).
    #[arg(long)]
    pub notice_at_rest: bool,
    /// Negative control (`--engine geo`): a replica whose data center was removed goes
    /// silent without telling the survivors (caught by `removal-unknown` when it was the
    /// only one that learned the removal).
    #[arg(long)]
    pub removed_silent: bool,
    /// Negative control (`--engine geo`): an acceptor never asks about a removal vote it
    /// holds undecided, so a promise whose proposer failed before deciding is held for
    /// ever (caught by `promise-held` when the node asked fails with its data center).
    #[arg(long)]
    pub promises_held: bool,
    /// Negative control (`--engine geo`): an acceptor asked to abort a removal it
    /// committed records it aborted, so a removal made whose news was cut off is undone
    /// at the acceptors (caught by `removal-beyond-f` when the node that made it is cut
    /// off with its data center and the operator removes that data center too).
    #[arg(long)]
    pub abort_committed: bool,
    /// Negative control (`--engine geo`): the cut of a return is taken from the first
    /// `N - f` survivors' answers, not every survivor's, so what only a late survivor
    /// stored of the old life is dropped (caught by the causal checker's convergence:
    /// a transaction a surviving data center stored is missing).
    #[arg(long)]
    pub cut_quorum: bool,
    /// Negative control (`--engine geo`): a survivor keeps a returning data center's old
    /// rows instead of forgetting them when it learns the return, so its collection goes
    /// on counting what the old life stored (caught when the new replicas lack what the
    /// survivors collected: a gap never filled, a read missing a write).
    #[arg(long)]
    pub no_freeze: bool,
    /// Negative control (`--engine geo`): a survivor records a return's cut but keeps the
    /// old life above it and takes what arrives of it later, so the new life's stream
    /// moves its entries past a fragment whose other partitions were lost (caught by the
    /// causal checker: a transaction shown in part, or final states that differ).
    #[arg(long)]
    pub no_cut: bool,
    /// Negative control (`--engine geo`): a past naming a data center's old life above
    /// its cut is let through at begin, barrier and attach (caught when a session parked
    /// while its data center was down goes on, its old tail lost, after the return).
    #[arg(long)]
    pub no_life: bool,
    /// Negative control (`--engine geo`): a return's cut is not lowered out of the ranges
    /// its data center's earlier returns lost, and a survivor that never applied an
    /// earlier cut (its return abandoned first) does not apply it with the next one.
    #[arg(long)]
    pub no_earlier_cuts: bool,
    /// Negative control (`--engine geo`): a replica's stable entry for a removed data
    /// center follows its partitions' rows into a life whose return's cut the replica
    /// never applied, so its data center reports storing what its siblings dropped.
    #[arg(long)]
    pub no_hold: bool,
    /// `--engine geo`: every run serves strong transactions, certified by one central
    /// certifier (REDBLUE's baseline, `docs/geo.md`, *Modes*); without it a quarter of
    /// the strong runs are.
    #[arg(long)]
    pub central_certifier: bool,
}

/// `keel sim bench` arguments.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Operations to drive through the in-process cluster.
    #[arg(long, default_value_t = 200_000)]
    pub ops: u64,
    /// Seeds of the general scenario to time.
    #[arg(long, default_value_t = 50)]
    pub seeds: u64,
    /// One JSON object per measurement.
    #[arg(long)]
    pub json: bool,
    /// `orca` (engine steps per second and seeds per second, on this machine) or `kite`
    /// (the Kite paper's throughput figures in virtual time, which do not depend on the
    /// machine).
    /// `geo`: the visibility delay uniformity adds and causal commit latency, in virtual
    /// time (the paper's Figures 5 and 6).
    #[arg(long, default_value = "orca", value_parser = ["orca", "kite", "geo"])]
    pub engine: String,
    /// The seed of the `kite` model's network delays and accesses.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// With `orca`: how writes scale with the replica groups of a sharded cluster (1, 2,
    /// 4 and 8 groups of three, each node a processor of its own), in virtual time.
    #[arg(long)]
    pub scale: bool,
}

/// Runs `keel sim`; exit 0 when everything held, 1 when something failed, 2 on bad input.
pub fn run(args: &SimArgs) -> ExitCode {
    match &args.command {
        SimCommand::Run(run) => run_seeds(run),
        SimCommand::Table3(t) => crate::table3::run_cli(t),
        SimCommand::Table4(t) => crate::table4::run_cli(t),
        SimCommand::Bench(b) if b.engine == "kite" => crate::kite::bench::run_cli(b.json, b.seed),
        SimCommand::Bench(b) if b.engine == "geo" => crate::geo::bench::run_cli(b.json, b.seed),
        SimCommand::Bench(b) if b.scale => crate::scale::run_cli(b.json, b.seed),
        SimCommand::Bench(b) => crate::bench::run_cli(b),
    }
}

fn run_seeds(args: &RunArgs) -> ExitCode {
    if args.engine == "kite" {
        return crate::kite::cli::run_seeds(args);
    }
    if args.engine == "geo" {
        return crate::geo::cli::run_seeds(args);
    }
    if GeneralConfig::named(&args.scenario, 0).is_none() {
        eprintln!(
            "unknown scenario '{}' (expected: general, wide-area, keyspaces, lease-race, lease-overlap, correctables, tickets, jobs, expiry or membership)",
            args.scenario
        );
        return ExitCode::from(2);
    }
    let count = args.seeds.unwrap_or(1);
    if count == 0 || count > SEEDS_MAX {
        eprintln!("--seeds must be in 1..={SEEDS_MAX}");
        return ExitCode::from(2);
    }
    let single = args.seeds.is_none();
    let base = |seed| {
        let mut config = GeneralConfig::named(&args.scenario, seed).expect("checked above");
        config.skip_truncation_clamp = args.no_truncation_clamp;
        config.unchecked_view_reads = args.unchecked_view_reads;
        config.forget_leader_contact = args.forget_leader_contact;
        config.clock_reboots = !args.no_clock_reboots;
        config.fast_clocks = args.fast_clocks;
        config.skip_dedup = args.skip_dedup;
        config.unbounded_links = args.unbounded_links;
        config.accept_expired_sessions = args.accept_expired_sessions;
        config.accept_stale_opens = args.accept_stale_opens;
        config.watch_ignores_deletes = args.watch_ignores_deletes;
        config.slots_serve_held = args.slots_serve_held;
        config.slots_take_unasked = args.slots_take_unasked;
        config.slots_fill_overwrites = args.slots_fill_overwrites;
        config.local_expiry = args.local_expiry;
        config.pop_before_durable = args.pop_before_durable;
        config.count_removed = args.count_removed;
        config.learner_reads_early = args.learner_reads_early;
        config.transfer_keeps_lease = args.transfer_keeps_lease;
        config.ignore_repair_floor = args.ignore_repair_floor;
        if args.aim_leader_ppm > 0 {
            config.aim_leader_ppm = args.aim_leader_ppm;
        }
        config.stale_final_view = args.stale_final_view;
        config.keep_history = single && args.history.is_some();
        if args.skip_hard_state_sync {
            config.hard_state_mode = HardStateMode::SkipSync;
        }
        config.hasty_removal = args.hasty_removal;
        config.partitioned_reads = args.hasty_removal || args.partitioned_reads;
        config.corruption = match args.corrupt.as_deref() {
            Some("guarded") => Corruption::Guarded,
            Some("unguarded") => Corruption::Unguarded,
            Some("hard-states") => Corruption::HardStates,
            _ => Corruption::Off,
        };
        config
    };
    if !single {
        // Panics are reported per seed; the default hook's backtraces would bury them.
        std::panic::set_hook(Box::new(|_| {}));
    }
    let started = std::time::Instant::now();
    let threads =
        args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let seeds_reaching: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());
    let failures = for_each_seed(args.seed, count, threads, base, |report| {
        let mut reaching = seeds_reaching.lock().unwrap_or_else(|e| e.into_inner());
        for path in report.reached.keys() {
            *reaching.entry(path.clone()).or_default() += 1;
        }
        drop(reaching);
        if !args.coverage || !report.passed() {
            print_report(report, args.json, single)
        }
    });
    if let (true, Some(path)) = (single, &args.history) {
        if let Err(e) = write_history(path, args.seed, base(args.seed)) {
            eprintln!("cannot write {}: {e}", path.display());
            return ExitCode::from(2);
        }
    }
    if !args.json {
        let secs = started.elapsed().as_secs_f64();
        println!(
            "{count} seeds, {failures} failed, {secs:.1}s ({:.1} seeds/s)",
            count as f64 / secs.max(1e-9)
        );
    }
    if args.coverage {
        let reaching = seeds_reaching.into_inner().unwrap_or_else(|e| e.into_inner());
        print_coverage(&reaching, count);
    }
    if failures == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// The share of `count` seeds that reached each path, beside the goal for it.
fn print_coverage(reaching: &BTreeMap<String, u64>, count: u64) {
    println!("{:<30} {:>8} {:>7} {:>6}", "path", "seeds", "share", "goal");
    let mut names: Vec<&str> = COVERAGE_GOALS.iter().map(|(name, _)| *name).collect();
    for name in reaching.keys() {
        if !names.contains(&name.as_str()) {
            names.push(name);
        }
    }
    for name in names {
        let seeds = reaching.get(name).copied().unwrap_or(0);
        let share = 100.0 * seeds as f64 / count as f64;
        let goal = COVERAGE_GOALS.iter().find(|(n, _)| *n == name).map(|(_, g)| *g);
        let (goal, mark) = match goal {
            Some(g) if share < f64::from(g) => (format!("{g}%"), "  below"),
            Some(g) => (format!("{g}%"), ""),
            None => ("-".to_string(), ""),
        };
        println!("{name:<30} {seeds:>8} {share:>6.1}% {goal:>6}{mark}");
    }
}

fn write_history(path: &std::path::Path, seed: u64, config: GeneralConfig) -> std::io::Result<()> {
    let report = run_general::<LeaderEngine>(&config);
    let history = report.history.unwrap_or_default();
    std::fs::write(path, crate::history::to_jsonl(&history))?;
    eprintln!("history of seed {seed} written to {}", path.display());
    Ok(())
}

/// Runs seeds `first..first+count` on `threads` workers; `emit` sees each report (in
/// completion order). Returns how many failed.
pub fn for_each_seed(
    first: u64,
    count: u64,
    threads: usize,
    config: impl Fn(u64) -> GeneralConfig + Sync,
    emit: impl Fn(&RunReport) + Sync,
) -> u64 {
    let next = AtomicU64::new(0);
    let failures = AtomicU64::new(0);
    let out = Mutex::new(());
    std::thread::scope(|scope| {
        for _ in 0..threads.clamp(1, 64) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    break;
                }
                let report = run_general::<LeaderEngine>(&config(first.wrapping_add(i)));
                if !report.passed() {
                    failures.fetch_add(1, Ordering::Relaxed);
                }
                let _guard = out.lock().unwrap_or_else(|e| e.into_inner());
                emit(&report);
            });
        }
    });
    failures.into_inner()
}

/// Runs seeds `first..first + count` over every core and returns their reports in seed
/// order (what the test suite's sweeps share).
pub fn sweep(
    first: u64,
    count: u64,
    config: impl Fn(u64) -> GeneralConfig + Sync,
) -> Vec<RunReport> {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let reports = Mutex::new(Vec::new());
    for_each_seed(first, count, threads, config, |report| {
        reports.lock().unwrap_or_else(|e| e.into_inner()).push(report.clone());
    });
    let mut reports = reports.into_inner().unwrap_or_else(|e| e.into_inner());
    reports.sort_by_key(|r| r.seed);
    reports
}

fn print_report(report: &RunReport, json: bool, verbose: bool) {
    let mut stdout = std::io::stdout().lock();
    if json {
        let mut value = serde_json::to_value(report).expect("reports serialize");
        value["replay"] = serde_json::Value::String(report.replay());
        value["passed"] = serde_json::Value::Bool(report.passed());
        let _ = writeln!(stdout, "{value}");
        return;
    }
    if verbose {
        for fault in &report.faults {
            let _ = writeln!(stdout, "  fault {fault}");
        }
    }
    let status = if report.passed() { "ok  " } else { "FAIL" };
    let _ = writeln!(
        stdout,
        "{status} seed {} ops={} ok={} unknown={} crashes={} batches={} off-loop={} stalled={} events={} virtual={}ms converged={} lin={}",
        report.seed, report.ops, report.ok, report.unknown, report.crashes, report.client_batches, report.reads_off_loop, report.stalled, report.events, report.virtual_ms, report.converged,
        report.linearizability
    );
    for v in &report.violations {
        let _ = writeln!(stdout, "     violation: {v}");
    }
    if let Some(panic) = &report.panic {
        let _ = writeln!(stdout, "     panic: {panic}");
    }
    let _ = writeln!(stdout, "     replay: {}", report.replay());
}
