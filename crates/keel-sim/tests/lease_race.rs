//! The `lease-race` scenario (`crates/keel-sim/src/race.rs`): random seeds, every fault
//! of the general scenario, bridges and long stalls, and the lease race started at a
//! random time. With the engine's kept leader contact every seed must pass; the race must
//! reach its setup (a follower of a live leader moved to a higher epoch by a late reply)
//! in a good share of them; and with the negative control `forget_leader_contact` the
//! same seeds must fail with two valid leader leases in at least 1% of them (31 of these
//! 300 and 127 of 2,000 when written, `docs/simulation.md`).

use keel_sim::scenario::{GeneralConfig, RunReport};

/// Seeds each test runs (`0..SEEDS`).
const SEEDS: u64 = 300;

/// Runs seeds `0..SEEDS`, with or without the control, over the cores.
fn run_seeds(forget_leader_contact: bool) -> Vec<RunReport> {
    keel_sim::cli::sweep(0, SEEDS, |seed| GeneralConfig {
        forget_leader_contact,
        ..GeneralConfig::lease_race(seed)
    })
}

fn seeds_reaching(reports: &[RunReport], path: &str) -> u64 {
    reports.iter().filter(|r| r.reached.get(path).is_some_and(|n| *n > 0)).count() as u64
}

#[test]
fn lease_race_seeds_pass_and_reach_the_setup() {
    let reports = run_seeds(false);
    for report in &reports {
        assert!(
            report.passed() && report.converged,
            "seed {}: {:?} {:?}\nreplay: {}",
            report.seed,
            report.violations,
            report.panic,
            report.replay()
        );
    }
    let reached = |path| seeds_reaching(&reports, path);
    // When written: the race started in 99% of seeds, the setup reached in 60% (181).
    assert!(reached("fault:lease-race") * 100 >= 95 * SEEDS);
    assert!(reached("lease-race:setup") * 100 >= 40 * SEEDS, "{}", reached("lease-race:setup"));
    assert!(reached("fault:bridge") * 100 >= 60 * SEEDS);
    assert!(reached("fault:link-stall") * 100 >= 80 * SEEDS);
}

#[test]
fn forgetting_the_leader_contact_gives_two_leases_on_random_lease_race_seeds() {
    let reports = run_seeds(true);
    let failed: Vec<&RunReport> = reports.iter().filter(|r| !r.passed()).collect();
    for report in &failed {
        assert!(
            report.found("one-leader-lease") && report.panic.is_none(),
            "seed {}: {:?} {:?}",
            report.seed,
            report.violations,
            report.panic
        );
    }
    // At least 1% of the sweep; the same seeds pass without the control (the test above).
    assert!(failed.len() as u64 * 100 >= SEEDS, "{} of {SEEDS} seeds failed", failed.len());
}
