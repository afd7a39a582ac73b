//! Snapshots on real disks: with a small snapshot threshold, a follower that was down
//! while the others wrote (and compacted their logs) catches up on restart, by snapshot
//! if its log is too far behind, and then serves what was written meanwhile.

mod common;

use keel_client::{Client, ClientConfig};
use keel_types::{Durability, ReadLevel};
use std::time::Duration;

const WRITES: u32 = 1500;

#[test]
fn a_restarted_follower_catches_up_past_compacted_logs() {
    let (mut cluster, leader) = common::cluster("snapshot", |c| {
        c.engine.snapshot_entries_threshold = Some(200);
    });
    let follower = (0..3).find(|i| *i != leader).unwrap();
    let behind = cluster.status(follower).and_then(|s| s["last_index"].as_u64());
    let behind = behind.expect("the follower answers before it is killed");
    cluster.kill(follower);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let others: Vec<_> =
        (0..3).filter(|i| *i != follower).map(|i| cluster.client_addrs()[i]).collect();
    let client = Client::new(ClientConfig::new(others));
    runtime.block_on(async {
        let mut session = client.session();
        for i in 0..WRITES {
            let durability = if i % 100 == 0 { Durability::Durable } else { Durability::Memory };
            session.put(format!("k{i}").as_bytes(), b"v", Some(durability)).await.expect("a write");
        }
    });
    // Both live nodes, not only the first leader: leadership may move between them, and
    // a leader whose log still reaches the follower's would catch it up with entries
    // (CI, 2026-11-28: a follower caught up without a snapshot although the first leader
    // had compacted; only a leader whose log still reached the follower's could do that).
    let live: Vec<usize> = (0..3).filter(|i| *i != follower).collect();
    let compacted = common::wait_until(Duration::from_secs(30), || {
        live.iter().all(|&i| {
            let at = cluster.status(i).and_then(|s| s["snapshot_index"].as_u64());
            at.is_some_and(|at| at > behind)
        })
    });
    assert!(compacted, "the live nodes never compacted their logs past the follower's");
    cluster.restart(follower).unwrap();
    let caught_up = common::wait_until(common::CONVERGE_WAIT, || {
        let applied = |i: usize| cluster.status(i).and_then(|s| s["applied_index"].as_u64());
        matches!((applied(follower), applied(leader)), (Some(f), Some(l)) if f >= l && l >= u64::from(WRITES))
    });
    if !caught_up {
        common::dump_logs(&cluster);
    }
    assert!(caught_up, "the restarted follower did not catch up");
    let installed =
        cluster.status(follower).and_then(|s| s["counters"]["snapshots_installed"].as_u64());
    let by_snapshot = installed.is_some_and(|n| n >= 1);
    if !by_snapshot {
        for i in 0..3 {
            eprintln!("--- n{} status: {:?}", i + 1, cluster.status(i));
        }
        common::dump_logs(&cluster);
    }
    // At least one: the leader may take and compact past a newer snapshot (its snapshot
    // saves run in the background) while the follower is installing the first.
    assert!(
        by_snapshot,
        "the follower caught up by installing the leader's snapshot: {installed:?}"
    );
    let direct = Client::new(ClientConfig::new(vec![cluster.client_addrs()[follower]]));
    let read = runtime.block_on(async {
        direct.session().get(b"k0", Some(ReadLevel::Any)).await.expect("a read")
    });
    assert_eq!(read.value.as_deref(), Some(&b"v"[..]), "written while the follower was down");
    common::finish(cluster);
}
