//! Negative controls: deliberately broken configurations the simulator must catch
//! within a bounded number of seeds. A simulator that finds nothing here is blind.

use keel_core::leader::LeaderEngine;
use keel_sim::disk::HardStateMode;
use keel_sim::scenario::{run_general, GeneralConfig};

/// Seeds searched before a control counts as missed.
const SEEDS_MAX: u64 = 200;

fn first_failing_seed(configure: impl Fn(&mut GeneralConfig)) -> Option<(u64, Vec<String>)> {
    first_failing_seed_within(SEEDS_MAX, configure)
}

fn first_failing_seed_within(
    seeds: u64,
    configure: impl Fn(&mut GeneralConfig),
) -> Option<(u64, Vec<String>)> {
    (0..seeds).find_map(|seed| {
        let mut config = GeneralConfig::new(seed);
        configure(&mut config);
        let report = run_general::<LeaderEngine>(&config);
        let mut found = report.violations.clone();
        found.extend(report.panic);
        (!found.is_empty()).then_some((seed, found))
    })
}

#[test]
fn skipping_the_hard_state_fsync_lets_a_node_vote_twice() {
    // Voters crash right after voting (the scenario turns this on with the skip), forget
    // the vote, and vote again in the same epoch: two leaders in one epoch.
    // About 2% of seeds catch it (a voter must crash between voting and the next fsync
    // and the second vote must win): search further than the other controls.
    let found =
        first_failing_seed_within(5 * SEEDS_MAX, |c| c.hard_state_mode = HardStateMode::SkipSync);
    let (seed, violations) = found.expect("the forgotten vote went unnoticed");
    assert!(
        // Or the node notices on restart that its hard state is older than what it
        // saved after it (a snapshot of a later epoch), and refuses to start.
        violations.iter().any(|v| v.contains("one-leader-per-epoch")
            || v.contains("durable")
            || v.contains("log-matching")
            || v.contains("newer than the hard state")),
        "seed {seed}: {violations:?}"
    );
}

#[test]
fn the_same_seeds_with_the_hard_state_fsynced_are_clean() {
    // Positive control for the test above: the honest driver on the seeds it searches.
    for seed in 0..20 {
        let report = run_general::<LeaderEngine>(&GeneralConfig::new(seed));
        assert!(report.passed(), "seed {seed}: {:?} {:?}", report.violations, report.panic);
    }
}

#[test]
fn hasty_removal_lets_partitioned_followers_serve_old_data() {
    // The engine's unsafe test flag: removal timeout below the mark-out timeout.
    let found = first_failing_seed(|c| {
        c.hasty_removal = true;
        c.partitioned_reads = true;
    });
    let (seed, violations) = found.expect("hasty removal went unnoticed");
    assert!(violations.iter().any(|v| v.contains("monotonic")), "seed {seed}: {violations:?}");
}

#[test]
fn followers_releasing_leases_unasked_are_left_without_leases_over_a_wan() {
    // The engine's unsafe test flag: a follower without a lease acknowledges a mark-out on
    // every reply, so once round trips exceed the heartbeat interval each grant it gets is
    // anchored below its floor and it never holds a lease (a liveness failure).
    let found = (0..SEEDS_MAX).find_map(|seed| {
        let mut config = GeneralConfig::wide_area(seed);
        config.release_unasked = true;
        let report = run_general::<LeaderEngine>(&config);
        (!report.passed()).then_some((seed, report.violations, report.panic))
    });
    let (seed, violations, panic) = found.expect("followers without leases went unnoticed");
    assert!(panic.is_none(), "seed {seed}: {panic:?}");
    assert!(violations.iter().any(|v| v.contains("lease-liveness")), "seed {seed}: {violations:?}");
}

#[test]
fn the_same_aimed_runs_with_safe_removal_are_clean() {
    for seed in 0..30 {
        let mut config = GeneralConfig::new(seed);
        config.partitioned_reads = true;
        let report = run_general::<LeaderEngine>(&config);
        assert!(report.passed(), "seed {seed}: {:?} {:?}", report.violations, report.panic);
    }
}

#[test]
fn reporting_fsyncs_unclamped_lets_a_node_claim_entries_a_truncation_removed() {
    // The effect executor's rule that only a server used to apply: an fsync reports the
    // log's last index when it ran; a truncation queued after it may have replaced those
    // entries with ones not yet on disk. Without the clamp, a follower reports them
    // persisted. (The general sweep runs the same seeds with the clamp, clean.)
    let found = first_failing_seed_within(2 * SEEDS_MAX, |c| c.skip_truncation_clamp = true);
    let (seed, violations) = found.expect("unclamped fsync reports went unnoticed");
    assert!(
        violations
            .iter()
            .any(|v| v.contains("claims persisted") || v.contains("contract-persisted")),
        "seed {seed}: {violations:?}"
    );
}

#[test]
fn reads_off_the_loop_without_the_read_point_check_serve_what_a_crash_loses() {
    // Reads answered between steps must pass the same check as reads in a step: their
    // key's update index at or below the read point. Without it they serve writes not
    // yet durable on the active set, which a crash can lose or a new leader can replace.
    // About 2% of seeds fail; the first is seed 238 (since followers stopped asking for an
    // fsync per `Append` of a round, which moved the schedules), so search past it.
    let found = first_failing_seed_within(400, |c| c.unchecked_view_reads = true);
    let (seed, violations) = found.expect("unchecked reads off the loop went unnoticed");
    assert!(
        violations.iter().any(|v| v.contains("monotonic") || v.contains("read-lost")),
        "seed {seed}: {violations:?}"
    );
}

#[test]
fn reads_off_the_loop_are_reached_and_clean() {
    // Positive control: the honest check on the seeds the control above searches, and
    // the path is taken in each.
    for seed in 0..20 {
        let report = run_general::<LeaderEngine>(&GeneralConfig::new(seed));
        assert!(report.passed(), "seed {seed}: {:?} {:?}", report.violations, report.panic);
        assert!(report.reads_off_loop > 0, "seed {seed}: no read was answered off the loop");
    }
}

#[test]
fn clocks_sped_up_past_the_drift_bound_give_two_leader_leases() {
    // Negative control: each drift change (one at every crash) sets a clock 3.4 times as
    // fast as virtual time, so a voter's `election_timeout_min` passes inside the lease of
    // a leader whose clock keeps time, and a successor can be elected while that lease
    // runs. About 1 to 2% of seeds show two valid leases (`docs/simulation.md`); the same
    // seed with drift changes within the bound, faster or slower, passes.
    let found = (0..5 * SEEDS_MAX).find(|seed| {
        let config = GeneralConfig { fast_clocks: true, ..GeneralConfig::new(*seed) };
        run_general::<LeaderEngine>(&config).found("one-leader-lease")
    });
    let seed = found.expect("clocks faster than the bound went unnoticed");
    let report = run_general::<LeaderEngine>(&GeneralConfig::new(seed));
    assert!(report.passed(), "seed {seed}: {:?} {:?}", report.violations, report.panic);
    assert!(report.reached.contains_key("fault:drift-faster"), "seed {seed} sped no clock up");
}

#[test]
fn taking_a_forgotten_session_for_a_new_one_applies_late_retries_twice() {
    // The engine's unsafe test flag: in the seeds that write under sessions with a table
    // of 1 to 4 clients, a retry that arrives after its session left the table is applied
    // again instead of refused. About 1.5% of seeds fail (seed 14 first), through the
    // monotonic-reads checker (seed 14 also through linearizability); without the flag
    // those seeds pass.
    let found = first_failing_seed(|c| c.accept_expired_sessions = true);
    let (seed, violations) = found.expect("retries applied after expiry went unnoticed");
    assert!(violations.iter().any(|v| v.contains("checker")), "seed {seed}: {violations:?}");
    let report = run_general::<LeaderEngine>(&GeneralConfig::new(seed));
    assert!(report.passed(), "seed {seed} fails without the flag: {:?}", report.violations);
}

#[test]
fn writes_that_skip_deduplication_are_applied_twice_and_the_checkers_notice() {
    // The engine's unsafe test flag: retries (the clients retry timed-out writes with the
    // same pair) and duplicated forwards are applied again. About a quarter of seeds fail,
    // nearly all through the monotonic-reads checker.
    let found = first_failing_seed(|c| c.skip_dedup = true);
    let (seed, violations) = found.expect("writes applied twice went unnoticed");
    assert!(violations.iter().any(|v| v.contains("checker")), "seed {seed}: {violations:?}");
}

#[test]
fn a_stale_final_view_of_an_invoked_read_is_caught() {
    // The `correctables` scenario's negative control: an invoked read records its first
    // (`any`) view as its final one, as a binding that never coordinated would. About a
    // third of seeds fail, through the views checker's freshness rule or the
    // monotonic-reads checker; the same seed passes honestly.
    let found = first_failing_seed(|c| {
        c.correctables = true;
        c.stale_final_view = true;
    });
    let (seed, violations) = found.expect("stale final views went unnoticed");
    let caught = violations.iter().any(|v| v.contains("views-checker") || v.contains("monotonic"));
    assert!(caught, "seed {seed}: {violations:?}");
    let report = run_general::<LeaderEngine>(&GeneralConfig::correctables(seed));
    assert!(report.passed(), "seed {seed} fails honestly: {:?}", report.violations);
    assert!(report.reached.contains_key("invocation"), "seed {seed} invoked nothing");
}

#[test]
fn ticket_writes_that_skip_deduplication_are_caught_by_the_queue_checks() {
    // The `tickets` scenario with the engine's dedup skip: a retried enqueue puts a ticket
    // in twice (under two sequence numbers), a retried dequeue takes two. About a third of
    // seeds fail, most through the queue checks (`queue-phantom`, `tickets-oversold`),
    // some first through the monotonic-reads checker (the general workload beside).
    let queue_violation = |v: &String| v.contains("queue-") || v.contains("tickets-");
    let found = (0..SEEDS_MAX).find(|seed| {
        let config = GeneralConfig { skip_dedup: true, ..GeneralConfig::tickets(*seed) };
        let report = run_general::<LeaderEngine>(&config);
        report.violations.iter().any(queue_violation)
    });
    let seed = found.expect("ticket writes applied twice went unnoticed by the queue checks");
    let report = run_general::<LeaderEngine>(&GeneralConfig::tickets(seed));
    assert!(report.passed(), "seed {seed} fails honestly: {:?}", report.violations);
}

#[test]
fn job_pops_acknowledged_before_they_are_durable_give_a_job_out_twice() {
    // The `jobs` scenario with pops acknowledged at `memory`: a leader cut off from the
    // others answers pops until its lease ends, its successor never had them, and the
    // jobs go out again. About 8% of seeds fail (80 of 1,000 from 441000000), each with
    // `job-popped-twice`, on an ordinary sweep; every one passes with `durable` pops.
    let count = 200;
    let failing: Vec<(u64, Vec<String>)> = (0..count)
        .filter_map(|seed| {
            let config = GeneralConfig { pop_before_durable: true, ..GeneralConfig::jobs(seed) };
            let report = run_general::<LeaderEngine>(&config);
            (!report.violations.is_empty()).then_some((seed, report.violations))
        })
        .collect();
    assert!(failing.len() >= 4, "only {} of {count} seeds failed", failing.len());
    for (seed, violations) in &failing {
        assert!(
            violations.iter().any(|v| v.contains("job-popped-twice")),
            "{seed}: {violations:?}"
        );
        let clean = run_general::<LeaderEngine>(&GeneralConfig::jobs(*seed));
        assert!(clean.passed(), "seed {seed} fails with durable pops: {:?}", clean.violations);
    }
}

#[test]
fn a_late_copy_of_an_open_let_through_reopens_a_forgotten_session_and_a_push_applies_twice() {
    // Seed 892 of `jobs`: a producer's first open, late, reaches the leader after its
    // session pushed a job and was evicted; let through, it reopens the session, and the
    // push's retry is applied again. Random seeds reach this rarely (2 of 1,000 from 0):
    // the pinned seed is the test (`docs/simulation.md`, *Seed 892*).
    let config = GeneralConfig { accept_stale_opens: true, ..GeneralConfig::jobs(892) };
    let report = run_general::<LeaderEngine>(&config);
    assert!(
        report.violations.iter().any(|v| v.contains("job-popped-twice")),
        "{:?}",
        report.violations
    );
}

#[test]
fn watch_ignoring_deletes_commits_over_a_delete_and_the_transaction_checker_notices() {
    // The engine's unsafe flag: a watched key deleted since `WATCH` counts as unchanged.
    // About a quarter of general seeds commit a transaction over a delete; the final
    // log's replay aborts it, and the transaction checker rejects the commit.
    let found = first_failing_seed(|c| c.watch_ignores_deletes = true);
    let (seed, violations) = found.expect("a commit over a delete went unnoticed");
    assert!(violations.iter().any(|v| v.contains("txn-checker")), "seed {seed}: {violations:?}");
    let clean = run_general::<LeaderEngine>(&GeneralConfig::new(seed));
    assert!(clean.passed(), "seed {seed} without the flag: {:?}", clean.violations);
}

/// Searches `membership` seeds from `first` on, within `within`, for one that fails with
/// `control`; requires one, caught by a check named in `caught`, that passes without it.
fn membership_control_caught(
    first: u64,
    within: u64,
    control: impl Fn(&mut GeneralConfig),
    caught: &[&str],
) {
    let found = (first..first + within).find_map(|seed| {
        let mut config = GeneralConfig::membership(seed);
        control(&mut config);
        let report = run_general::<LeaderEngine>(&config);
        (!report.violations.is_empty()).then_some((seed, report.violations))
    });
    let (seed, violations) = found.expect("the control went unnoticed");
    assert!(
        violations.iter().any(|v| caught.iter().any(|c| v.contains(c))),
        "{seed}: {violations:?}"
    );
    let clean = run_general::<LeaderEngine>(&GeneralConfig::membership(seed));
    assert!(clean.passed(), "seed {seed} without the flag: {:?}", clean.violations);
}

#[test]
fn a_leader_that_counts_a_removed_voter_loses_acknowledged_writes() {
    // `Config::unsafe_count_removed`: the leader keeps replicating to a voter it removed
    // and counts its acknowledgements toward commits and `durable` writes. Cut off with
    // it (the aimed fault after a removal), it acknowledges writes the new majority never
    // got, which the other side's leader then lacks: about 3% of seeds.
    let caught = ["durable-write-lost", "txn-checker", "stale-linearizable-read", "linearizab"];
    membership_control_caught(0, 5 * SEEDS_MAX, |c| c.count_removed = true, &caught);
}

#[test]
fn a_learner_serving_reads_before_it_caught_up_is_caught() {
    // `Config::unsafe_learner_reads_early`: learners join the active set, and get leases,
    // before they hold the durable index. One reading what was durable before it joined,
    // still behind, serves an older value than a client already read: about one seed
    // in a hundred, so the search starts where one is known within reach.
    let caught = ["monotonic", "durable-prefix-lost"];
    let early = |c: &mut GeneralConfig| c.learner_reads_early = true;
    membership_control_caught(531_000_000, 5 * SEEDS_MAX, early, &caught);
}

#[test]
fn a_leader_keeping_its_lease_after_handing_over_is_caught() {
    // `Config::unsafe_transfer_keeps_lease`: a leader that sent `TimeoutNow` goes on
    // serving under its lease while voters, past their stickiness for the transfer's
    // candidate, elect its successor. Deaf for a while after the hand-over (the aimed
    // fault), it still holds its lease when the successor holds one: about a third of
    // seeds.
    let keeps = |c: &mut GeneralConfig| c.transfer_keeps_lease = true;
    membership_control_caught(0, SEEDS_MAX, keeps, &["one-leader-lease"]);
}

#[test]
fn nodes_expiring_keys_on_their_own_clocks_are_caught_by_the_read_checks() {
    // `Config::unsafe_expire_on_local_clock`: each node hides a key once its own clock
    // passes the key's time, before the leader's expiry entry. With wall clocks skewed by
    // up to 2 s, about a quarter of `expiry` seeds read a key absent at the version of a
    // write that left it present; they pass without the flag.
    let found = (0..SEEDS_MAX).find_map(|seed| {
        let config = GeneralConfig { local_expiry: true, ..GeneralConfig::expiry(seed) };
        let report = run_general::<LeaderEngine>(&config);
        (!report.violations.is_empty()).then_some((seed, report.violations))
    });
    let (seed, violations) = found.expect("nodes expiring on their own clocks went unnoticed");
    let caught = ["read-value-mismatch", "read-against-log", "monotonic"];
    assert!(
        violations.iter().any(|v| caught.iter().any(|c| v.contains(c))),
        "{seed}: {violations:?}"
    );
    let clean = run_general::<LeaderEngine>(&GeneralConfig::expiry(seed));
    assert!(clean.passed(), "seed {seed} without the flag: {:?}", clean.violations);
}

#[test]
fn links_that_refuse_no_client_values_are_caught_holding_past_their_allowance() {
    // `keel_exec::LinkAllowance::unsafe_unbounded`: a link counts the values it holds but
    // sheds none, so a node queues client values to a slow peer without bound. The world
    // checks every hold against the allowance; about 13% of general seeds (those drawing a
    // tight allowance, with two values meeting on a link) fail, and pass without the flag.
    let found = first_failing_seed(|c| c.unbounded_links = true);
    let (seed, violations) = found.expect("links past their allowance went unnoticed");
    assert!(violations.iter().any(|v| v.contains("link-over-allowance")), "{seed}: {violations:?}");
    let report = run_general::<LeaderEngine>(&GeneralConfig::new(seed));
    assert!(report.passed(), "seed {seed} fails without the flag: {:?}", report.violations);
    assert!(report.reached.contains_key("exec:bulk-shed"), "seed {seed} shed nothing");
}

/// How many of `seeds` seeds of the `slots` scenario, from `first`, fail with
/// `control` on; each that does must pass with it off, and name one of `caught`.
fn slots_control_failures(
    first: u64,
    seeds: u64,
    control: impl Fn(&mut GeneralConfig),
    caught: &[&str],
) -> u64 {
    let mut failed = 0;
    for seed in first..first + seeds {
        let mut config = GeneralConfig::slots(seed);
        control(&mut config);
        let report = run_general::<LeaderEngine>(&config);
        if report.passed() {
            continue;
        }
        failed += 1;
        let mut found = report.violations.clone();
        found.extend(report.panic);
        assert!(found.iter().any(|v| caught.iter().any(|c| v.contains(c))), "{seed}: {found:?}");
        let clean = run_general::<LeaderEngine>(&GeneralConfig::slots(seed));
        assert!(clean.passed(), "seed {seed} without the control: {:?}", clean.violations);
    }
    failed
}

#[test]
fn each_guard_of_a_slot_move_is_caught_without_it_on_random_seeds() {
    const SEEDS: u64 = 200;
    // A source serving writes to the keys it holds for copying loses the writes made
    // between the copy and the release: about 40% of seeds.
    let held = slots_control_failures(0, SEEDS, |c| c.slots_serve_held = true, &["slots-"]);
    assert!(held * 100 >= 20 * SEEDS, "serving held keys failed {held} of {SEEDS}");
    // A target taking requests its source did not send on lets a client whose map
    // points there early write a key the source still holds: about a third of seeds.
    let unasked = slots_control_failures(0, SEEDS, |c| c.slots_take_unasked = true, &["slots-"]);
    assert!(unasked * 100 >= 20 * SEEDS, "taking unasked failed {unasked} of {SEEDS}");
    // A target writing every copy it is sent lets a restarted mover's late copy undo
    // clients' writes (the aimed late copies of `Fill`): about 5% of seeds.
    let over = slots_control_failures(0, SEEDS, |c| c.slots_fill_overwrites = true, &["slots-"]);
    assert!(over * 100 >= SEEDS, "copies overwriting failed {over} of {SEEDS}");
}
