//! Membership changes with real processes under a recorded workload: a keyspace of three
//! voters grows to five (two nodes added as learners and promoted) and shrinks back to
//! three (the leader removed first: its leadership moves on its own), then a voter whose disk is wiped is replaced by the same node, empty, added
//! again and promoted; the leadership moves on request twice (asked at the leader, then
//! with the CLI at a follower); the history passes every check the levels promise (cross-client
//! monotonic reads, no acknowledged `durable` write lost, linearizability for `durable`
//! writes read `linearizable`).

mod common;

use keel_server::local::LocalCluster;
use std::time::Duration;

/// Operations that must finish between two changes (progress, not time, paces the test).
const OPS_BETWEEN_CHANGES: u64 = 300;

/// The voters and learners node index `i` reports.
fn membership(cluster: &LocalCluster, i: usize) -> Option<(Vec<u64>, Vec<u64>)> {
    let status = cluster.status(i)?;
    let ids = |field: &str| -> Option<Vec<u64>> {
        status[field].as_array()?.iter().map(|v| v.as_u64()).collect()
    };
    Some((ids("voters")?, ids("learners")?))
}

#[test]
fn a_keyspace_grows_shrinks_replaces_a_wiped_voter_and_moves_its_leader_keeping_every_promise() {
    let exe = std::path::PathBuf::from(env!("CARGO_BIN_EXE_keel"));
    let dir = common::test_dir("membership");
    let mut cluster = LocalCluster::start(&exe, 5, &dir, None, |c| {
        c.voters = Some(vec![1, 2, 3]);
        // The whole log stays, for the survivors' check (the wiped node replays it).
        c.engine.snapshot_entries_threshold = Some(10_000_000);
    })
    .expect("the cluster starts");
    let first = common::leader(&cluster);
    assert!(first < 3, "a voter leads");
    assert_eq!(membership(&cluster, 3), Some((vec![1, 2, 3], vec![])), "4 starts outside");
    let mut load = common::Workload::start(&cluster, Duration::from_secs(300), 11);
    let mut pace = common::Pace::new(OPS_BETWEEN_CHANGES);

    // Grow: 3 → 5 voters.
    for id in [4, 5] {
        pace.step(&load, &cluster, "adding a learner");
        common::change(&cluster, "ADD", id);
        pace.step(&load, &cluster, "promoting it");
        common::change(&cluster, "PROMOTE", id);
    }
    let at = common::leader(&cluster);
    assert_eq!(membership(&cluster, at), Some((vec![1, 2, 3, 4, 5], vec![])));

    // Shrink: 5 → 3, removing the leader with the CLI (which asks again while the
    // leadership moves first), then a voter that does not lead.
    pace.step(&load, &cluster, "removing the leader");
    let asked = (at + 1) % 5;
    let out = std::process::Command::new(&exe)
        .args(["node", "remove", &(at + 1).to_string(), "--node"])
        .arg(cluster.configs[asked].client_addr.to_string())
        .output()
        .expect("the CLI runs");
    eprintln!("keel node remove {} (the leader): {out:?}", at + 1);
    assert!(out.status.success(), "the leader's removal failed");
    let next = common::leader(&cluster);
    assert_ne!(next, at, "the removed leader still leads");
    let other = (0..5).find(|i| ![at, next].contains(i)).expect("a voter that does not lead");
    pace.step(&load, &cluster, "removing a voter");
    common::change(&cluster, "REMOVE", other as u32 + 1);
    let at = common::leader(&cluster);
    let (voters, _) = membership(&cluster, at).expect("the leader answers");
    assert_eq!(voters.len(), 3, "back to three voters: {voters:?}");

    // Replace a wiped voter: kill it, remove it, wipe its disk, start it outside the
    // membership, add it again and promote it.
    let wiped = voters.iter().map(|v| *v as usize - 1).find(|i| *i != at).expect("a follower");
    pace.step(&load, &cluster, "killing a voter");
    cluster.kill(wiped);
    common::change(&cluster, "REMOVE", wiped as u32 + 1);
    std::fs::remove_dir_all(&cluster.configs[wiped].data_dir).expect("the disk is wiped");
    let rest: Vec<u32> =
        voters.iter().map(|v| *v as u32).filter(|v| *v != wiped as u32 + 1).collect();
    cluster.configs[wiped].voters = Some(rest);
    cluster.rewrite_config(wiped).expect("its configuration is written");
    cluster.restart(wiped).expect("it starts empty");
    pace.step(&load, &cluster, "adding the wiped node back");
    common::change(&cluster, "ADD", wiped as u32 + 1);
    pace.step(&load, &cluster, "promoting it");
    common::change(&cluster, "PROMOTE", wiped as u32 + 1);

    // Move the leadership on request: to the replaced node, asked at the leader; then to
    // another voter with the CLI, asked at a follower, which forwards it.
    pace.step(&load, &cluster, "moving the leadership");
    common::change(&cluster, "TRANSFER-LEADER", wiped as u32 + 1);
    common::assert_leads(&cluster, wiped);
    pace.step(&load, &cluster, "moving it with the CLI");
    let (voters, _) = membership(&cluster, wiped).expect("the new leader answers");
    let next = voters.iter().map(|v| *v as usize - 1).find(|i| *i != wiped).expect("a voter");
    let asked = voters.iter().map(|v| *v as usize - 1).find(|i| ![wiped, next].contains(i));
    let asked = asked.expect("a third voter");
    let moved = common::wait_until(Duration::from_secs(60), || {
        let out = std::process::Command::new(&exe)
            .args(["node", "transfer-leader", &(next + 1).to_string(), "--node"])
            .arg(cluster.configs[asked].client_addr.to_string())
            .output()
            .expect("the CLI runs");
        eprintln!("keel node transfer-leader {}: {out:?}", next + 1);
        out.status.success()
    });
    assert!(moved, "the CLI never moved the leadership");
    common::assert_leads(&cluster, next);
    pace.step(&load, &cluster, "stopping the workload");
    load.stop();

    let at = common::leader(&cluster);
    let (voters, learners) = membership(&cluster, at).expect("the leader answers");
    assert_eq!(voters.len(), 3, "{voters:?}");
    assert!(voters.contains(&(wiped as u64 + 1)) && learners.is_empty(), "{voters:?}");
    let members: Vec<usize> = voters.iter().map(|v| *v as usize - 1).collect();
    let converged = common::wait_until(common::CONVERGE_WAIT, || {
        let applied: Vec<u64> =
            members.iter().filter_map(|i| cluster.status(*i)?["applied_index"].as_u64()).collect();
        applied.len() == members.len() && applied.iter().all(|a| *a == applied[0])
    });
    assert!(converged, "the members did not converge");
    common::check_history(&cluster, &load.runtime, &load.client, &load.recorder, at, "membership");
    common::finish(cluster);
}
