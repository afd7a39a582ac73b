//! Reads off the engine loop on real processes: a `GET` of a durable key is answered by
//! the connection between engine steps (and counted), with the value the loop would
//! give; with `reads_off_loop = false` every read goes through the loop.

mod common;

use keel_client::{Client, ClientConfig};
use keel_types::{Durability, ReadLevel};

const READS: usize = 50;

/// Writes `k` durably, reads it `READS` times at the leader at each level that may be
/// answered at once; returns how many reads the leader answered off its loop.
fn reads_off_loop_at_leader(enabled: bool) -> f64 {
    let name = if enabled { "off-loop" } else { "off-loop-disabled" };
    let (cluster, leader) = common::cluster(name, |c| c.reads_off_loop = enabled);
    let addrs = cluster.client_addrs();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let client = Client::new(ClientConfig::new(vec![addrs[leader]]));
        let mut session = client.session();
        session.put(b"k", b"v1", Some(Durability::Durable)).await.expect("a durable write");
        for level in [ReadLevel::Any, ReadLevel::Monotonic, ReadLevel::Linearizable] {
            for _ in 0..READS {
                let read = session.get(b"k", Some(level)).await.expect("a read");
                assert_eq!(read.value.as_deref(), Some(&b"v1"[..]), "{level:?}");
            }
        }
        session.put(b"k", b"v2", Some(Durability::Memory)).await.expect("a memory write");
        let read = session.get(b"k", Some(ReadLevel::Monotonic)).await.expect("a read");
        assert_eq!(read.value.as_deref(), Some(&b"v2"[..]), "a read sees the write before it");
    });
    let http = cluster.configs[leader].http_addr.expect("local clusters serve HTTP");
    let page = common::scrape(http);
    let counted = common::sample(&page, "keel_reads_off_loop_total{keyspace=\"0\"}");
    common::finish(cluster);
    counted.expect("the metric is exported")
}

#[test]
fn durable_reads_are_answered_off_the_loop_and_the_switch_turns_it_off() {
    let on = reads_off_loop_at_leader(true);
    // A read right after a step (or during one) goes through the loop; most do not.
    assert!(on >= READS as f64, "only {on} of {} reads answered off the loop", 3 * READS);
    assert_eq!(reads_off_loop_at_leader(false), 0.0, "the switch is off");
}
