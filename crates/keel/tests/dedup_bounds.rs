//! Nodes given different deduplication bounds (`engine.dedup_clients_max`), as real
//! `keel server` processes: the bound in force is the cluster's, stated in the log by
//! the leader of each epoch, so every node reports the same one and a retry that one
//! replica would answer from its table and another apply again (replicas diverging) cannot
//! happen; a node configured for fewer slots installs, and restarts from, a snapshot
//! holding more (it used to refuse such a snapshot forever, and to fail to start from
//! one).

mod common;

use common::Conn;
use keel_server::local::LocalCluster;
use keel_server::ServerConfig;
use std::time::Duration;

/// Every running node's bound in force, once they all report `expected`.
fn agree_on(cluster: &LocalCluster, nodes: &[usize], expected: u64) -> bool {
    common::wait_until(common::CONVERGE_WAIT, || {
        nodes.iter().all(|&i| {
            cluster.status(i).and_then(|s| s["dedup_clients_max"].as_u64()) == Some(expected)
        })
    })
}

/// Waits until every node of `nodes` has applied the leader's whole log.
fn caught_up(cluster: &LocalCluster, leader: usize, nodes: &[usize]) -> bool {
    common::wait_until(common::CONVERGE_WAIT, || {
        let last = cluster.status(leader).and_then(|s| s["last_index"].as_u64());
        let applied = |i: usize| cluster.status(i).and_then(|s| s["applied_index"].as_u64());
        last.is_some_and(|last| nodes.iter().all(|&i| applied(i).is_some_and(|a| a >= last)))
    })
}

/// The value of `key` on node `i`'s own state (`LEVEL any`).
fn local_value(cluster: &LocalCluster, i: usize, key: &str) -> String {
    let mut conn = Conn::open(cluster.client_addrs()[i]);
    let header = conn.call(&["GET", key, "LEVEL", "any"]);
    assert!(header.starts_with('$'), "n{}: {header}", i + 1);
    conn.line().trim_end_matches("\r\n").to_string()
}

/// Node index 0 leads: it is preferred, and leadership is moved to it if another node won
/// the first election anyway.
fn lead_with_first(cluster: &mut LocalCluster) {
    for _ in 0..10 {
        let leader = cluster.wait_for_leader(common::LEADER_WAIT).expect("a leader");
        if leader == 0 {
            return;
        }
        cluster.kill(leader);
        let moved = common::wait_until(common::LEADER_WAIT, || {
            cluster.wait_for_leader(Duration::from_secs(1)).is_some_and(|l| l != leader)
        });
        assert!(moved, "no leader after n{} stopped", leader + 1);
        cluster.restart(leader).unwrap();
    }
    panic!("n1 never led");
}

#[test]
fn nodes_with_other_dedup_bounds_agree_on_the_leaders_and_install_its_snapshots() {
    let tweak = |c: &mut ServerConfig| {
        c.engine.dedup_clients_max = Some(if c.node_id == 1 { 2 } else { 1000 });
        c.engine.snapshot_entries_threshold = Some(30);
        // One entry per `Append`: the few a leader sends a node that is down (queued on
        // the link until it returns) do not catch it up, so it needs the snapshot.
        c.engine.append_bytes_max = Some(1);
        c.keyspaces = vec![keel_server::config::KeyspaceSettings {
            preferred_leader: Some(1),
            ..keel_server::config::KeyspaceSettings::orca(0)
        }];
    };
    let mut cluster = common::start("dedup-bounds", tweak);
    lead_with_first(&mut cluster);
    let all = [0, 1, 2];
    assert!(agree_on(&cluster, &all, 2), "the nodes do not all apply n1's bound of 2");

    // Client 5000's write, then two other clients': under a bound of 2 client 5000 is
    // forgotten on every node alike, so its retry is a new write everywhere (a plain id is
    // taken for a new client once forgotten). With each node's own bound, n1 applied it
    // again while n2 and n3 answered it from their tables: the counter diverged.
    let mut leader = Conn::open(cluster.client_addrs()[0]);
    assert_eq!(leader.call(&["KEEL.REQ", "5000", "1", "INCR", "d:n"]), ":1");
    for other in ["6001", "6002"] {
        assert_eq!(leader.call(&["KEEL.REQ", other, "1", "SET", "d:o", other]), "+OK");
    }
    assert_eq!(leader.call(&["KEEL.REQ", "5000", "1", "INCR", "d:n"]), ":2");
    assert!(caught_up(&cluster, 0, &all));
    for i in all {
        assert_eq!(local_value(&cluster, i, "d:n"), "2", "n{} diverged", i + 1);
    }

    // n1 stops; the next leader states its bound of 1000, and every node applies it.
    let behind = cluster.status(0).and_then(|s| s["last_index"].as_u64()).expect("n1 answers");
    cluster.kill(0);
    let next = cluster.wait_for_leader(common::LEADER_WAIT).expect("a new leader");
    assert_ne!(next, 0);
    assert!(agree_on(&cluster, &[1, 2], 1000));
    // Forty clients write while n1 is down and the others compact their logs: the
    // snapshot n1 needs holds forty slots, more than the two it is configured for.
    let mut conn = Conn::open(cluster.client_addrs()[next]);
    for client in 7001..=7040 {
        let client = client.to_string();
        assert_eq!(
            conn.call(&["KEEL.REQ", &client, "1", "SET", &format!("d:{client}"), "v"]),
            "+OK"
        );
    }
    let compacted = common::wait_until(common::CONVERGE_WAIT, || {
        [1, 2].iter().all(|&i| {
            let at = cluster.status(i).and_then(|s| s["snapshot_index"].as_u64());
            at.is_some_and(|at| at > behind)
        })
    });
    assert!(compacted, "the live nodes never compacted their logs");
    cluster.restart(0).unwrap();
    let installed = common::wait_until(common::CONVERGE_WAIT, || {
        let status = cluster.status(0);
        status.as_ref().and_then(|s| s["counters"]["snapshots_installed"].as_u64()) >= Some(1)
    });
    if !installed {
        common::dump_logs(&cluster);
        for i in all {
            eprintln!("--- n{} status: {:?}", i + 1, cluster.status(i));
        }
    }
    assert!(installed, "n1 (configured for 2 slots) never installed the snapshot of 40");
    assert!(caught_up(&cluster, next, &all));
    assert!(agree_on(&cluster, &all, 1000));
    assert_eq!(local_value(&cluster, 0, "d:7040"), "v");
    // A restart from that snapshot.
    cluster.kill(0);
    cluster.restart(0).unwrap();
    assert!(caught_up(&cluster, next, &all), "n1 did not start again from its snapshot");
    assert!(cluster.exited().is_none(), "a node exited");
    common::finish(cluster);
}
