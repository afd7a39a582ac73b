//! The `lease-overlap` scenario (`crates/keel-sim/src/lease_overlap.rs`): a scripted
//! nemesis that drives five nodes into the lease overlap of `docs/protocol.md` §4. With
//! the engine's kept leader contact it must pass; with the negative control
//! `forget_leader_contact` (the old `become_follower`) the world's one-lease check must
//! catch two valid leader leases.

use keel_core::leader::LeaderEngine;
use keel_sim::lease_overlap::reached_names::{GAVE_UP, SECOND_LEADER, SETUP};
use keel_sim::scenario::{run_general, GeneralConfig, RunReport};

/// Seeds each test runs (`0..SEEDS`); 2,000 seeds reach the setup and fail under the
/// control alike (`docs/simulation.md`).
const SEEDS: u64 = 200;

/// Runs seeds `0..SEEDS`, with or without the control, over the cores.
fn run_seeds(forget_leader_contact: bool) -> Vec<RunReport> {
    keel_sim::cli::sweep(0, SEEDS, |seed| GeneralConfig {
        forget_leader_contact,
        ..GeneralConfig::lease_overlap(seed)
    })
}

fn reached(report: &RunReport, path: &str) -> bool {
    report.reached.get(path).is_some_and(|n| *n > 0)
}

#[test]
fn the_scripted_overlap_passes_with_the_kept_leader_contact() {
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
        assert!(!reached(report, SECOND_LEADER), "seed {}: a second leader", report.seed);
        assert!(report.ok > 0, "seed {}: the warm-up workload did nothing", report.seed);
    }
    // The precondition: `V` moved to a higher epoch by a late reply while `L` leads with
    // a valid lease (all 200 seeds when written).
    let setup = reports.iter().filter(|r| reached(r, SETUP)).count();
    let gave_up: Vec<u64> =
        reports.iter().filter(|r| reached(r, GAVE_UP)).map(|r| r.seed).collect();
    assert!(setup >= 190, "only {setup} of {SEEDS} seeds reached the setup; gave up: {gave_up:?}");
    assert!(reports
        .iter()
        .all(|r| reached(r, "epoch-raised-under-live-leader") || !reached(r, SETUP)));
}

#[test]
fn forgetting_the_leader_contact_is_caught_by_the_one_lease_check() {
    let reports = run_seeds(true);
    let caught: Vec<&RunReport> = reports.iter().filter(|r| r.found("one-leader-lease")).collect();
    // Every seed that reaches the setup ends with two valid leader leases (all 200 seeds
    // when written); nothing else fails.
    assert!(caught.len() >= 190, "only {} of {SEEDS} seeds caught", caught.len());
    for report in &reports {
        assert!(report.panic.is_none(), "seed {}: {:?}", report.seed, report.panic);
        assert!(
            report.violations.iter().all(|v| v.starts_with("one-leader-lease")),
            "seed {}: {:?}",
            report.seed,
            report.violations
        );
        if reached(report, SETUP) {
            assert!(report.found("one-leader-lease"), "seed {} reached the setup", report.seed);
        }
    }
}

#[test]
fn a_scripted_seed_replays_identically() {
    let run = || run_general::<LeaderEngine>(&GeneralConfig::lease_overlap(7));
    let (a, b) = (run(), run());
    assert_eq!((a.events, a.ops, a.ok, a.virtual_ms), (b.events, b.ops, b.ok, b.virtual_ms));
    assert_eq!(a.faults, b.faults);
}
