//! Several keyspaces on one cluster of real processes: each is served, isolated from the
//! others and has a leader (spread over the nodes), `SELECT` and the client's keyspace
//! reach them, the status shows each. (Forged peer messages: `peer_attacks.rs`.)

mod common;

use keel_client::{Client, ClientConfig};
use keel_server::config::KeyspaceSettings;
use keel_server::local::{keyspaces_at, status_in};
use keel_types::ReadLevel;
use std::collections::BTreeSet;

const KEYSPACES: u32 = 3;

#[test]
fn three_keyspaces_are_served_isolated_and_led_by_different_nodes() {
    let (cluster, _) = common::cluster("keyspaces", |c| {
        c.keyspaces = (0..KEYSPACES).map(KeyspaceSettings::orca).collect();
    });
    let mut leaders = BTreeSet::new();
    for id in 0..KEYSPACES {
        let Some(leader) = cluster.wait_for_leader_in(id, common::LEADER_WAIT) else {
            common::dump_logs(&cluster);
            panic!("keyspace {id} has no leader");
        };
        leaders.insert(leader);
    }
    // Each keyspace prefers another node, whose first election comes earlier.
    assert_eq!(leaders.len(), KEYSPACES as usize, "leaders are spread over the nodes");
    let addrs = cluster.client_addrs();
    let listed = keyspaces_at(addrs[0]).expect("KEEL.KEYSPACES answers");
    let ids: Vec<u32> = listed.iter().map(|k| k.id).collect();
    assert_eq!(ids, [0, 1, 2]);
    assert!(listed.iter().all(|k| k.engine == "orca"));
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let in_keyspace = |id: u32| {
            let mut config = ClientConfig::new(addrs.clone());
            config.keyspace = id;
            Client::new(config)
        };
        let two = in_keyspace(2);
        two.session().put(b"k", b"two", None).await.expect("a write in keyspace 2");
        in_keyspace(1).session().put(b"k", b"one", None).await.expect("a write in keyspace 1");
        for (id, expected) in [(0, None), (1, Some(&b"one"[..])), (2, Some(&b"two"[..]))] {
            let read = in_keyspace(id)
                .session()
                .get(b"k", Some(ReadLevel::Linearizable))
                .await
                .expect("a read");
            assert_eq!(read.value.as_deref(), expected, "keyspace {id}");
        }
    });
    for id in 0..KEYSPACES {
        let status = status_in(addrs[1], id).expect("KEEL.STATUS in each keyspace");
        assert_eq!(status["keyspace"], id);
        assert_eq!(status["engine"], "orca");
    }
    if let Some(cli) = common::tool("redis-cli") {
        // `redis-cli -n` sends SELECT: as the user of the issue would type it.
        let port = addrs[0].port().to_string();
        let cli = |args: &[&str]| {
            let full: Vec<&str> =
                ["-p", port.as_str()].iter().copied().chain(args.iter().copied()).collect();
            common::run(cli, &full).trim().to_string()
        };
        assert_eq!(cli(&["-n", "2", "SET", "redis", "cli"]), "OK");
        assert_eq!(cli(&["-n", "2", "GET", "redis"]), "cli");
        assert_eq!(cli(&["-n", "1", "GET", "redis"]), "", "absent from keyspace 1");
        assert_eq!(cli(&["GET", "redis"]), "", "absent from keyspace 0");
    }
    common::finish(cluster);
}
