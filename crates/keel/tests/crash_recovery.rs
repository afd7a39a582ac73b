//! A 3-node cluster of real processes under a recorded workload survives `kill -9` of
//! the leader and of a follower, and their restarts; the history passes every check the
//! levels promise: cross-client monotonic reads for every monotonic and linearizable
//! read, and linearizability for `durable` writes read `linearizable`.

mod common;

use keel_client::history::Recorder;
use keel_client::workload::{self, Progress, WorkloadConfig};
use keel_client::{Client, ClientConfig};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Operations that must finish between two faults (progress, not time, paces the test).
const OPS_BETWEEN_FAULTS: u64 = 400;

fn wait_ops(progress: &Progress, target: u64) -> bool {
    common::wait_until(Duration::from_secs(60), || progress.ops.load(Ordering::Relaxed) >= target)
}

#[test]
fn kill_9_of_leader_and_follower_keeps_every_promise() {
    let (mut cluster, leader) = common::cluster("crash", |c| {
        c.engine.snapshot_entries_threshold = Some(10_000_000);
    });
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let client = Client::new(ClientConfig::new(cluster.client_addrs()));
    let recorder = Arc::new(Recorder::default());
    let progress = Arc::new(Progress::default());
    let config = WorkloadConfig {
        sessions: 6,
        keys: 4,
        duration: Duration::from_secs(120),
        seed: 7,
        any_as_monotonic: false,
    };
    let work =
        runtime.spawn(workload::run(client.clone(), recorder.clone(), config, progress.clone()));

    let mut target = OPS_BETWEEN_FAULTS;
    let mut step = |cluster: &mut keel_server::local::LocalCluster, what: &str| {
        if !wait_ops(&progress, target) {
            common::dump_logs(cluster);
            panic!("no progress before: {what} ({} ops)", progress.ops.load(Ordering::Relaxed));
        }
        target = progress.ops.load(Ordering::Relaxed) + OPS_BETWEEN_FAULTS;
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
    progress.stop.store(true, Ordering::Relaxed);
    runtime.block_on(work).unwrap();

    let leader = cluster.wait_for_leader(common::LEADER_WAIT).expect("a leader at the end");
    let converged = common::wait_until(common::CONVERGE_WAIT, || {
        let applied: Vec<u64> =
            (0..3).filter_map(|i| cluster.status(i)?["applied_index"].as_u64()).collect();
        applied.len() == 3 && applied.iter().all(|a| *a == applied[0])
    });
    assert!(converged, "the nodes did not converge");
    let verdicts = common::check_history(&cluster, &runtime, &client, &recorder, leader, "crash");
    assert!(verdicts.queue.taken > 10, "too few dequeues: {:?}", verdicts.queue);
    common::finish(cluster);
}
