//! Correctables through keel-client against real `keel server` processes: a read invoked
//! at several levels returns one view per level, weakest first, the strongest closing
//! it, and no view is older than the one before it.

mod common;

use common::Conn;
use keel_client::{Client, ClientConfig, State};
use keel_types::{Durability, ReadLevel};

#[test]
fn a_read_invoked_at_every_level_gives_a_view_per_level_in_order() {
    let (cluster, _) = common::cluster("correctables", |_| {});
    let mut conn = Conn::open(cluster.client_addrs()[0]);
    let settled =
        common::wait_until(common::LEADER_WAIT, || conn.call(&["SET", "c:ready", "1"]) == "+OK");
    assert!(settled, "the cluster never accepted a write");
    let client = Client::new(ClientConfig::new(cluster.client_addrs().to_vec()));
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let mut session = client.session();
        session.put(b"c:k", b"v1", Some(Durability::Durable)).await.expect("a durable write");
        let read = client.invoke_get(b"c:k", &[]);
        let mut views = read.views();
        let mut seen = Vec::new();
        while let Some(view) = views.next().await {
            seen.push(view.expect("every view of a healthy cluster"));
        }
        let levels: Vec<ReadLevel> = seen.iter().map(|v| v.level).collect();
        assert_eq!(levels, ReadLevel::ALL, "one view per level, weakest first");
        assert_eq!(read.state(), State::Final);
        assert!(seen.windows(2).all(|w| w[0].version <= w[1].version), "{seen:?}");
        let last = seen.last().expect("a final view");
        assert_eq!(last.value.as_deref(), Some(&b"v1"[..]), "the final view has the write");

        // Two levels: one preliminary view, then the final one; speculation on it.
        let read = client.invoke_get(b"c:k", &[ReadLevel::Linearizable, ReadLevel::Any]);
        let derived = read.speculate(|value| value.as_ref().map(Vec::len), |_| {});
        let final_view = derived.final_view().await.expect("a final view");
        assert_eq!((final_view.level, final_view.value), (ReadLevel::Linearizable, Some(2)));
        assert_eq!(read.preliminary().len(), 1);
    });
    common::finish(cluster);
}
