//! The general scenario against the real leader engine: every durability and read
//! level, every fault. Seeds that once failed are pinned here as regressions.

use keel_core::leader::LeaderEngine;
use keel_sim::scenario::{run_general, GeneralConfig, COVERAGE_GOALS};
use std::collections::BTreeMap;

fn assert_seed_passes(seed: u64) {
    let report = run_general::<LeaderEngine>(&GeneralConfig::new(seed));
    assert!(
        report.passed(),
        "seed {seed} failed: {:?} {:?}\nreplay: {}",
        report.violations,
        report.panic,
        report.replay()
    );
    assert!(report.converged, "seed {seed} did not converge");
}

#[test]
fn fault_free_runs_are_clean_and_busy() {
    for seed in 0..3 {
        let mut config = GeneralConfig::new(seed);
        config.faults = false;
        config.load_ns = 500_000_000;
        let report = run_general::<LeaderEngine>(&config);
        assert!(report.passed(), "seed {seed}: {:?} {:?}", report.violations, report.panic);
        assert!(report.converged && report.ok > 10, "seed {seed}: {report:?}");
        assert_eq!(report.crashes, 0);
    }
}

/// Seeds of the general scenario every test run covers (the CI floor is 2,000).
const GENERAL_SEEDS: u64 = 2_000;

/// Runs seeds `0..count` of the scenario `make` builds, spread over the cores (each
/// thread takes every `threads`-th seed, so the sweep costs wall time / cores); every
/// seed must pass and converge. Returns how many seeds reached each path.
fn sweep(count: u64, make: fn(u64) -> GeneralConfig) -> BTreeMap<String, u64> {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()) as u64;
    let workers: Vec<_> = (0..threads)
        .map(|first| {
            std::thread::spawn(move || {
                let mut reaching: BTreeMap<String, u64> = BTreeMap::new();
                for seed in (first..count).step_by(threads as usize) {
                    let report = run_general::<LeaderEngine>(&make(seed));
                    assert!(
                        report.passed() && report.converged,
                        "seed {seed}: {:?} {:?}\nreplay: {}",
                        report.violations,
                        report.panic,
                        report.replay()
                    );
                    for path in report.reached.keys() {
                        *reaching.entry(path.clone()).or_default() += 1;
                    }
                }
                reaching
            })
        })
        .collect();
    let mut reaching = BTreeMap::new();
    for worker in workers {
        for (path, seeds) in worker.join().expect("a seed failed; its replay line is printed above")
        {
            *reaching.entry(path).or_default() += seeds;
        }
    }
    reaching
}

/// Every path of [`COVERAGE_GOALS`] was reached by at least its share of `count` seeds.
fn assert_coverage(reaching: &BTreeMap<String, u64>, count: u64, scenario: &str) {
    let short: Vec<String> = COVERAGE_GOALS
        .iter()
        .filter_map(|(path, goal)| {
            let seeds = reaching.get(*path).copied().unwrap_or(0);
            (seeds * 100 < u64::from(*goal) * count)
                .then(|| format!("{path}: {seeds} of {count} seeds, goal {goal}%"))
        })
        .collect();
    assert!(short.is_empty(), "{scenario} seeds miss coverage goals: {short:?}");
}

#[test]
fn first_seeds_with_every_fault_pass() {
    let reaching = sweep(GENERAL_SEEDS, GeneralConfig::new);
    assert_coverage(&reaching, GENERAL_SEEDS, "general");
}

#[test]
fn correctables_seeds_pass_with_their_views_checked() {
    // Half the stronger reads invoked as Correctables, under every fault; the views
    // checker and the monotonic checker (over every view) run on each seed.
    let count = 300;
    let reaching = sweep(count, GeneralConfig::correctables);
    let invoked = reaching.get("invocation").copied().unwrap_or(0);
    assert!(invoked * 100 >= 90 * count, "{invoked} of {count} seeds invoked a read");
}

#[test]
fn expiry_seeds_pass_with_skewed_clocks_and_every_read_checked_against_the_log() {
    // Half the `m*` puts expire after 1 to 400 ms, wall clocks are skewed by up to 2 s;
    // most seeds see the leaders' expiry entries delete keys.
    let count = 100;
    let reaching = sweep(count, GeneralConfig::expiry);
    let expired = reaching.get("expiry:keys-expired").copied().unwrap_or(0);
    assert!(expired >= count / 2, "keys expired in only {expired} of {count} seeds");
    let writes = reaching.get("expiry:expiring-writes").copied().unwrap_or(0);
    assert!(writes * 100 >= 95 * count, "expiring writes in only {writes} of {count} seeds");
}

#[test]
fn membership_seeds_add_promote_remove_and_transfer_under_faults() {
    // An operator adds, promotes and removes nodes of keyspace 0 one at a time, and moves
    // its leadership, while the workload runs under every fault, with the aimed cuts,
    // stalls and deafness (`membership.rs`): every check of the general scenario holds,
    // over whatever membership and leadership result.
    let count = 300;
    let reaching = sweep(count, GeneralConfig::membership);
    let seeds = |path: &str| reaching.get(path).copied().unwrap_or(0);
    assert!(seeds("membership:added") * 100 >= 45 * count, "{reaching:?}");
    assert!(seeds("membership:promoted") * 100 >= 20 * count, "{reaching:?}");
    assert!(seeds("membership:removed") * 100 >= 60 * count, "{reaching:?}");
    assert!(seeds("membership:transferred") * 100 >= 50 * count, "{reaching:?}");
    assert!(seeds("fault:deaf-after-hand-over") * 100 >= 30 * count, "{reaching:?}");
    assert!(seeds("fault:removed-with-leader") * 100 >= 40 * count, "{reaching:?}");
}

#[test]
fn tickets_seeds_sell_under_faults_and_never_oversell() {
    // The Correctables paper's ticket selling on the replicated queue, beside the general
    // workload, under every fault: the queue checks (`tickets.rs`) run on every seed.
    let count = 1_000;
    let reaching = sweep(count, GeneralConfig::tickets);
    let seeds = |path: &str| reaching.get(path).copied().unwrap_or(0);
    assert!(seeds("ticket-sold") * 100 >= 90 * count, "{reaching:?}");
    assert!(seeds("ticket-sold-on-preliminary") * 100 >= 30 * count, "{reaching:?}");
    assert!(seeds("queue-found-empty") * 100 >= 50 * count, "{reaching:?}");
}

#[test]
fn jobs_seeds_pop_each_job_once_under_faults() {
    // A Redis list as a reliable job queue (`RPUSH`, `LMOVE`, `LREM`, every write
    // `durable`) beside the general workload, under every fault, half the partitions
    // isolating the leader: the queue checks run on every seed (`tickets.rs`).
    let count = 500;
    let reaching = sweep(count, GeneralConfig::jobs);
    let seeds = |path: &str| reaching.get(path).copied().unwrap_or(0);
    assert!(seeds("job-popped") * 100 >= 90 * count, "{reaching:?}");
    assert!(seeds("jobs-found-empty") * 100 >= 50 * count, "{reaching:?}");
    assert!(seeds("job-retry") * 100 >= 50 * count, "{reaching:?}");
}

/// A late copy of a producer's open, refused once its session was used and evicted
/// (`docs/simulation.md`, *Seed 892*).
#[test]
fn jobs_seed_892_applies_a_retried_push_once() {
    let report = run_general::<LeaderEngine>(&GeneralConfig::jobs(892));
    assert!(report.passed(), "{:?}", report.violations);
}

#[test]
fn one_seed_replays_identically() {
    let a = run_general::<LeaderEngine>(&GeneralConfig::new(11));
    let b = run_general::<LeaderEngine>(&GeneralConfig::new(11));
    assert_eq!(
        (a.events, a.ops, a.ok, a.unknown, a.crashes),
        (b.events, b.ops, b.ok, b.unknown, b.crashes)
    );
    assert_eq!(a.violations, b.violations);
}

/// Seeds that exposed simulator bugs: a tick deferred by a pause was dropped, so nodes
/// stopped flushing and never converged (69, 77, 159); a sync request covered by a
/// snapshot installed in the same step was flagged as a contract breach (115157, 115241);
/// a deposed leader still unaware of its successor was held to the successor's durable
/// prefix (208980).
#[test]
fn pinned_seeds_pass() {
    for seed in [69, 77, 159, 115157, 115241, 208980] {
        assert_seed_passes(seed);
    }
}

/// Seeds on which the engine used to panic with "durable beyond the leader's own disk": a
/// follower outside the active set adopted a durable index above its own fsynced index and
/// then won an election. The new leader now keeps that index, fsyncs its log at once and
/// serves reads above its own disk only after the fsync (docs/protocol.md §12 item 17).
#[test]
fn pinned_engine_seeds_pass() {
    for seed in [102391, 110721, 208284, 208922, 213640, 214501] {
        assert_seed_passes(seed);
    }
}

/// Seeds that found engine bugs through the faults added with deduplication sessions:
/// a follower whose clock restarted lower was never removed after its mark-out (general
/// 9404171 and 9405523 fail without the removal `rt` after the last grant), and a restarted leader granted a lease to a follower that
/// lacked a durable write (keyspaces 9820328, a non-monotonic read).
#[test]
fn pinned_clock_and_storage_seeds_pass() {
    assert_seed_passes(9_404_171);
    assert_seed_passes(9_405_523);
    let report = run_general::<LeaderEngine>(&GeneralConfig::keyspaces(9_820_328));
    assert!(report.passed(), "{:?} {:?}", report.violations, report.panic);
}

#[test]
fn recorded_history_is_valid_keel_format_and_passes_the_checkers() {
    let mut config = GeneralConfig::new(3);
    config.keep_history = true;
    let report = run_general::<LeaderEngine>(&config);
    assert!(report.passed(), "{:?}", report.violations);
    let history = report.history.expect("kept");
    assert!(!history.ops.is_empty() && !history.survivors.is_empty());
    let bytes = keel_sim::history::to_jsonl(&history);
    let parsed =
        keel_check::history::parse_history(bytes.as_slice(), "seed-3").expect("valid history");
    assert_eq!(parsed.ops.len(), history.ops.len());
    assert_eq!(parsed.survivors, history.survivors);
    assert_eq!(keel_check::monotonic::check(&parsed).verdict(), "ok");
    // Its transactions and their entries in the final log, read back and judged.
    assert!(!history.txns.is_empty() && !history.txn_entries.is_empty());
    assert_eq!(
        (parsed.txns.len(), &parsed.txn_entries),
        (history.txns.len(), &history.txn_entries)
    );
    let txns = keel_check::txn::check(&parsed);
    assert!(txns.committed > 0 && txns.verdict() == "ok", "{txns:?}");
}

/// Seeds of the wide-area scenario every test run covers: peer round trips of 20 to 80 ms,
/// longer than the heartbeat interval (a lease grant always echoes an old reply).
const WIDE_AREA_SEEDS: u64 = 500;

#[test]
fn wide_area_seeds_with_every_fault_pass() {
    let reaching = sweep(WIDE_AREA_SEEDS, GeneralConfig::wide_area);
    assert_coverage(&reaching, WIDE_AREA_SEEDS, "wide-area");
}

/// Wide-area seeds that found engine bugs: a late, reordered rejection raised a follower's
/// match index above the index its leader had backed off to, tripping the leader's
/// progress assertion (504138).
#[test]
fn pinned_wide_area_seeds_pass() {
    let seeds: &[u64] = &[504138];
    for &seed in seeds {
        let report = run_general::<LeaderEngine>(&GeneralConfig::wide_area(seed));
        assert!(
            report.passed() && report.converged,
            "seed {seed}: {:?} {:?}",
            report.violations,
            report.panic
        );
    }
}

/// Seeds of the keyspaces scenario every test run covers: 2 to 4 keyspaces on one
/// cluster, each checked on its own, with values that name their keyspace.
const KEYSPACES_SEEDS: u64 = 300;

#[test]
fn several_keyspaces_at_once_with_every_fault_pass() {
    let reaching = sweep(KEYSPACES_SEEDS, GeneralConfig::keyspaces);
    let committed = reaching.get("txn-committed").copied().unwrap_or(0);
    assert!(committed * 100 >= 90 * KEYSPACES_SEEDS, "{reaching:?}");
}

/// Seeds of the sharded scenario every test run covers: 2 or 3 keyspaces, each on a
/// replica group of its own three nodes, clients at the nodes of each keyspace's group.
const SHARDED_SEEDS: u64 = 200;

#[test]
fn keyspaces_on_groups_of_their_own_with_every_fault_pass() {
    let reaching = sweep(SHARDED_SEEDS, GeneralConfig::sharded);
    let committed = reaching.get("txn-committed").copied().unwrap_or(0);
    assert!(committed * 100 >= 90 * SHARDED_SEEDS, "{reaching:?}");
}

/// Seeds of the slots scenario every test run covers: hash slots moving between the
/// keyspaces of a sharded world while clients follow `MOVED`, `ASK` and `TRYAGAIN`.
const SLOTS_SEEDS: u64 = 300;

#[test]
fn slots_moving_between_keyspaces_under_every_fault_pass() {
    let reaching = sweep(SLOTS_SEEDS, GeneralConfig::slots);
    for (path, percent) in [
        ("slots:moves-done", 95),
        ("slots:keys-copied", 90),
        ("slots:ask", 80),
        ("slots:moved", 80),
        ("slots:tryagain", 50),
        ("fault:late-fill-copy", 80),
        ("fault:late-step-copy", 80),
    ] {
        let n = reaching.get(path).copied().unwrap_or(0);
        assert!(n * 100 >= percent * SLOTS_SEEDS, "{path}: {n} of {SLOTS_SEEDS}: {reaching:?}");
    }
}
