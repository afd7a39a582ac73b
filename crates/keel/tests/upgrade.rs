//! A rolling upgrade with real processes under a recorded workload: three nodes of the
//! previous peer protocol are stopped and started again as this version one at a time,
//! the leader among them; while the versions are mixed, a leadership transfer (which
//! the previous protocol lacks) is refused, naming the older member; once every member
//! speaks this version's protocol, the leadership moves on request. The history passes
//! every check the levels promise.
//!
//! The previous version is this build speaking peer protocol 1 (`testing.peer_protocol`:
//! it announces nothing and refuses the messages protocol 2 added, as the previous build
//! does), or, with `KEEL_PREVIOUS_BIN` naming one, the previous build itself.

mod common;

use keel_server::local::LocalCluster;
use std::path::PathBuf;
use std::time::Duration;

/// Operations that must finish between two restarts.
const OPS_BETWEEN_STEPS: u64 = 300;

#[test]
fn a_cluster_of_the_previous_protocol_upgrades_one_node_at_a_time_keeping_every_promise() {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_keel"));
    let previous = std::env::var_os("KEEL_PREVIOUS_BIN").map(PathBuf::from);
    let dir = common::test_dir("upgrade");
    let emulated = previous.is_none();
    let mut cluster = LocalCluster::start(previous.as_ref().unwrap_or(&exe), 3, &dir, None, |c| {
        if emulated {
            c.testing.peer_protocol = Some(1);
        }
    })
    .expect("the cluster starts");
    let first = common::leader(&cluster);
    let mut load = common::Workload::start(&cluster, Duration::from_secs(300), 13);
    let mut pace = common::Pace::new(OPS_BETWEEN_STEPS);

    // Followers first, the leader last (no transfer in the previous protocol: its
    // restart costs an election).
    let order: Vec<usize> = (0..3).filter(|i| *i != first).chain([first]).collect();
    cluster.set_exe(&exe);
    for (n, i) in order.iter().copied().enumerate() {
        pace.step(&load, &cluster, "upgrading a node");
        eprintln!("upgrading node {}", i + 1);
        cluster.kill(i);
        cluster.configs[i].testing.peer_protocol = None;
        cluster.rewrite_config(i).expect("its configuration is written");
        cluster.restart(i).expect("it starts as this version");
        if n == 0 {
            pace.step(&load, &cluster, "asking for a transfer while mixed");
            let refused = common::wait_until(Duration::from_secs(30), || {
                let reply = common::Conn::open(cluster.configs[i].client_addr).call(&[
                    "KEEL.NODE",
                    "TRANSFER-LEADER",
                    &(i + 1).to_string(),
                ]);
                eprintln!("  mixed: {reply}");
                reply.contains("speaks peer protocol 1")
            });
            assert!(refused, "a transfer was not refused while a member is older");
        }
    }

    // Every member speaks this version's protocol: the leadership moves on request.
    pace.step(&load, &cluster, "moving the leadership");
    let at = common::leader(&cluster);
    let to = (at + 1) % 3;
    common::change_retrying(&cluster, "TRANSFER-LEADER", to as u32 + 1, true);
    common::assert_leads(&cluster, to);
    pace.step(&load, &cluster, "stopping the workload");
    load.stop();

    let converged = common::wait_until(common::CONVERGE_WAIT, || {
        let applied: Vec<u64> =
            (0..3).filter_map(|i| cluster.status(i)?["applied_index"].as_u64()).collect();
        applied.len() == 3 && applied.iter().all(|a| *a == applied[0])
    });
    assert!(converged, "the nodes did not converge");
    common::check_history(&cluster, &load.runtime, &load.client, &load.recorder, to, "upgrade");
    common::finish(cluster);
}
