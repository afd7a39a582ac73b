//! A 3-node cluster of real processes under a recorded workload survives `kill -9` of
//! the leader and of a follower, and their restarts; the history passes every check the
//! levels promise: cross-client monotonic reads for every monotonic and linearizable
//! read, and linearizability for `durable` writes read `linearizable`.

mod common;

use std::time::Duration;

/// Operations that must finish between two faults (progress, not time, paces the test).
const OPS_BETWEEN_FAULTS: u64 = 400;

fn wait_ops(load: &common::Workload, target: u64) -> bool {
    common::wait_until(Duration::from_secs(60), || load.ops() >= target)
}

#[test]
fn kill_9_of_leader_and_follower_keeps_every_promise() {
    let (mut cluster, leader) = common::cluster("crash", |c| {
        c.engine.snapshot_entries_threshold = Some(10_000_000);
    });
    let mut load = common::Workload::start(&cluster, Duration::from_secs(120), 7);

    let mut target = OPS_BETWEEN_FAULTS;
    let mut step = |cluster: &mut keel_server::local::LocalCluster, what: &str| {
        if !wait_ops(&load, target) {
            common::dump_logs(cluster);
            panic!("no progress before: {what} ({} ops)", load.ops());
        }
        target = load.ops() + OPS_BETWEEN_FAULTS;
    };
    step(&mut cluster, "killing the leader");
    cluster.kill(leader);
    step(&mut cluster, "restarting the old leader");
    cluster.restart(leader).unwrap();
    let new_leader =
        cluster.wait_for_leader(common::LEADER_WAIT).expect("a leader after the restart");
    let follower = (0..3).find(|i| *i != new_leader).unwrap();
    step(&mut cluster, "killing a follower");
    cluster.kill(follower);
    step(&mut cluster, "restarting the follower");
    cluster.restart(follower).unwrap();
    step(&mut cluster, "stopping the workload");
    load.stop();

    let leader = cluster.wait_for_leader(common::LEADER_WAIT).expect("a leader at the end");
    let converged = common::wait_until(common::CONVERGE_WAIT, || {
        let applied: Vec<u64> =
            (0..3).filter_map(|i| cluster.status(i)?["applied_index"].as_u64()).collect();
        applied.len() == 3 && applied.iter().all(|a| *a == applied[0])
    });
    assert!(converged, "the nodes did not converge");
    let verdicts = common::check_history(
        &cluster,
        &load.runtime,
        &load.client,
        &load.recorder,
        leader,
        "crash",
    );
    assert!(verdicts.queue.taken > 10, "too few dequeues: {:?}", verdicts.queue);
    common::finish(cluster);
}
