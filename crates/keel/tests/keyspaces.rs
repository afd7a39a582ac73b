//! Several keyspaces on one cluster of real processes: each is served, isolated from the
//! others and has a leader (spread over the nodes), `SELECT` and the client's keyspace
//! reach them, the status shows each; and a forged peer message, well framed but
//! breaking the protocol's rules, is dropped and counted, not obeyed.

mod common;

use keel_client::{Client, ClientConfig};
use keel_server::config::KeyspaceSettings;
use keel_server::local::{keyspaces_at, status_in};
use keel_types::{Epoch, KeyspaceId, NodeId, ReadLevel};
use keel_wire::peer::{encode_frame, Outgoing, PeerFrame, PeerLimits};
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;

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

/// Sends one well-framed peer frame from member 2 to member 1 carrying `message` for
/// keyspace 0, as a forger who can reach the peer port would.
fn forge(addr: std::net::SocketAddr, message: keel_core::leader::Message) {
    let messages = [Outgoing { keyspace: KeyspaceId(0), message: Box::new(message) }];
    let frame = PeerFrame { from: NodeId(2), to: NodeId(1), messages: &messages };
    let mut bytes = Vec::new();
    encode_frame(&frame, &PeerLimits::default(), &mut bytes).unwrap();
    let mut stream = TcpStream::connect(addr).expect("the peer port accepts");
    stream.write_all(&bytes).unwrap();
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let mut rest = Vec::new();
    let _ = stream.read_to_end(&mut rest);
}

#[test]
fn a_forged_vote_with_an_epoch_past_the_limit_is_dropped_and_counted() {
    let (cluster, _) = common::cluster("forged", |_| {});
    let target = cluster.configs[0].clone();
    let before = status_in(target.client_addr, 0).expect("node 1 answers");
    let epoch = before["epoch"].as_u64().unwrap();
    forge(
        target.peer_addr(),
        keel_core::leader::Message::Vote { epoch: Epoch(u64::MAX), granted: true },
    );
    let http = target.http_addr.expect("local clusters serve HTTP");
    let counted = common::wait_until(common::CONVERGE_WAIT, || {
        common::scrape(http).contains(
            "keel_peer_messages_rejected_total{keyspace=\"0\",reason=\"epoch out of range\"} 1",
        )
    });
    assert!(counted, "the forged vote was not counted as rejected");
    let after = status_in(target.client_addr, 0).expect("node 1 is still up");
    assert_eq!(after["epoch"].as_u64(), Some(epoch), "the forged epoch was not adopted");
    assert!(cluster.wait_for_leader(common::LEADER_WAIT).is_some(), "the cluster still serves");
    common::finish(cluster);
}
