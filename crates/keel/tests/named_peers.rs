//! Members named by host name (`peer_addr = "localhost:PORT"`), as a Kubernetes
//! StatefulSet names its pods: the links resolve the name when they dial, the nodes elect
//! a leader and replicate, and a restarted leader is found again by name.

mod common;

use keel_client::{Client, ClientConfig};
use keel_server::config::PeerAddr;
use keel_types::{Durability, ReadLevel};
use std::time::Duration;

#[test]
fn members_named_by_host_name_elect_replicate_and_find_a_restarted_node_again() {
    let (mut cluster, leader) = common::cluster("named-peers", |c| {
        for m in &mut c.members {
            m.peer_addr = PeerAddr::Name("localhost".into(), m.peer_addr.port());
        }
    });
    assert!(
        cluster.configs.iter().all(|c| matches!(c.peer_addr(), PeerAddr::Name(..))),
        "every member is named"
    );
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let client = Client::new(ClientConfig::new(cluster.client_addrs()));
    runtime.block_on(async {
        let mut session = client.session();
        session.put(b"before", b"1", Some(Durability::Durable)).await.expect("a durable write");
    });
    cluster.kill(leader);
    cluster.restart(leader).unwrap();
    let follower = (0..3).find(|i| *i != leader).unwrap();
    let converged = common::wait_until(common::CONVERGE_WAIT, || {
        let applied = |i: usize| cluster.status(i).and_then(|s| s["applied_index"].as_u64());
        cluster.wait_for_leader(Duration::from_millis(1)).is_some()
            && matches!((applied(leader), applied(follower)), (Some(a), Some(b)) if a == b && a > 0)
    });
    if !converged {
        common::dump_logs(&cluster);
    }
    assert!(converged, "the restarted node rejoined through its name");
    runtime.block_on(async {
        let mut session = client.session();
        session.put(b"after", b"2", Some(Durability::Durable)).await.expect("a durable write");
        let direct = Client::new(ClientConfig::new(vec![cluster.client_addrs()[leader]]));
        let mut probe = direct.session();
        for (key, value) in [(&b"before"[..], &b"1"[..]), (b"after", b"2")] {
            let read = probe.get(key, Some(ReadLevel::Monotonic)).await.expect("a read");
            assert_eq!(read.value.as_deref(), Some(value), "served by the restarted node");
        }
    });
    common::finish(cluster);
}
