//! Expiry against real `keel server` processes: `SET` with its options, `SETEX`,
//! `GETSET`, `EXPIRE` and its conditions, `PERSIST`, `TTL` and its kin, answered as Redis
//! answers them; a key leaves at its time on every node (the leader's expiry entry, read
//! at a follower); and a leader's death neither loses an expiry nor brings a key back.

mod common;

use common::Conn;
use std::thread::sleep;
use std::time::{Duration, Instant};

/// An integer reply's value.
fn int(reply: &str) -> i64 {
    reply.strip_prefix(':').and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{reply}"))
}

/// The value `GET key` reads, `None` for a null reply.
fn get(conn: &mut Conn, key: &str) -> Option<String> {
    match conn.call(&["GET", key]).as_str() {
        "$-1" => None,
        _ => Some(conn.line().trim_end_matches("\r\n").to_string()),
    }
}

#[test]
fn redis_expiry_commands_answer_as_redis_and_keys_leave_at_their_time() {
    let (mut cluster, _) = common::cluster("expiry", |_| {});
    let leader = cluster.wait_for_leader(common::LEADER_WAIT).expect("a leader");
    let follower = (leader + 1) % 3;
    let mut c = Conn::open(cluster.client_addrs()[follower]);
    let settled = common::wait_until(common::LEADER_WAIT, || c.call(&["SET", "x", "0"]) == "+OK");
    assert!(settled, "the cluster never accepted a write");

    // SET's options.
    assert_eq!(c.call(&["SET", "k", "v", "PX", "400"]), "+OK");
    let pttl = int(&c.call(&["PTTL", "k"]));
    assert!((1..=400).contains(&pttl), "{pttl}");
    assert_eq!(c.call(&["SET", "k", "w", "NX"]), "$-1", "NX on a present key: null");
    assert_eq!(c.call(&["SET", "nx", "w", "XX"]), "$-1", "XX on an absent key: null");
    assert_eq!(c.call(&["SET", "k", "w", "XX", "GET", "KEEPTTL"]), "$1");
    assert_eq!(c.line(), "v\r\n");
    assert!(int(&c.call(&["PTTL", "k"])) > 0, "KEEPTTL kept it");
    assert_eq!(int(&c.call(&["TTL", "x"])), -1);
    assert_eq!(int(&c.call(&["TTL", "none"])), -2);
    assert_eq!(int(&c.call(&["SETNX", "x", "1"])), 0);
    assert_eq!(int(&c.call(&["SETNX", "n", "1"])), 1);
    assert_eq!(c.call(&["GETSET", "n", "2"]), "$1");
    assert_eq!(c.line(), "1\r\n");
    assert!(c.call(&["SET", "k", "v", "EX", "0"]).starts_with("-ERR invalid expire time"));

    // The key leaves at its time, read at the follower at the default level.
    let deadline = Instant::now() + Duration::from_secs(5);
    while get(&mut c, "k").is_some() {
        assert!(Instant::now() < deadline, "k outlived its expiry by seconds");
        sleep(Duration::from_millis(20));
    }
    assert_eq!(int(&c.call(&["EXISTS", "k"])), 0);
    assert_eq!(int(&c.call(&["PTTL", "k"])), -2);

    // EXPIRE and its conditions, PERSIST, and an expiry in the past.
    assert_eq!(int(&c.call(&["EXPIRE", "none", "10"])), 0);
    assert_eq!(int(&c.call(&["EXPIRE", "x", "100", "XX"])), 0);
    assert_eq!(int(&c.call(&["EXPIRE", "x", "100", "NX"])), 1);
    assert_eq!(int(&c.call(&["EXPIRE", "x", "50", "GT"])), 0);
    assert_eq!(int(&c.call(&["EXPIRE", "x", "50", "LT"])), 1);
    let ttl = int(&c.call(&["TTL", "x"]));
    assert!((49..=50).contains(&ttl), "{ttl}");
    let at = int(&c.call(&["EXPIRETIME", "x"]));
    assert!(int(&c.call(&["PEXPIRETIME", "x"])) / 1000 == at);
    assert_eq!(int(&c.call(&["PERSIST", "x"])), 1);
    assert_eq!(int(&c.call(&["PERSIST", "x"])), 0);
    assert_eq!(int(&c.call(&["EXPIRE", "x", "-1"])), 1);
    assert_eq!(get(&mut c, "x"), None, "an expiry in the past deletes at once");
    assert_eq!(c.call(&["SETEX", "s", "100", "v"]), "+OK");
    assert_eq!(c.call(&["PSETEX", "p", "100000", "v"]), "+OK");
    assert!((99..=100).contains(&int(&c.call(&["TTL", "s"]))));

    // The leader dies: the expiry it appended survives with the key, and the key still
    // leaves at its time under the next leader; one already expired stays gone.
    assert_eq!(c.call(&["SET", "later", "v", "PX", "1500", "DURABILITY", "durable"]), "+OK");
    assert_eq!(c.call(&["SET", "gone", "v", "PX", "1", "DURABILITY", "durable"]), "+OK");
    let gone = common::wait_until(Duration::from_secs(5), || get(&mut c, "gone").is_none());
    assert!(gone, "gone never left");
    let started = Instant::now();
    cluster.kill(leader);
    let next = cluster.wait_for_leader(common::LEADER_WAIT).expect("a new leader");
    assert_ne!(next, leader);
    let survivor = if follower == next { follower } else { next };
    let mut d = Conn::open(cluster.client_addrs()[survivor]);
    let settled = common::wait_until(common::LEADER_WAIT, || d.call(&["SET", "y", "0"]) == "+OK");
    assert!(settled, "the new leader never accepted a write");
    assert_eq!(get(&mut d, "gone"), None, "an expired key came back");
    if started.elapsed() < Duration::from_millis(1200) {
        assert_eq!(get(&mut d, "later").as_deref(), Some("v"), "the key was lost early");
    }
    let expired = common::wait_until(Duration::from_secs(10), || get(&mut d, "later").is_none());
    assert!(expired, "the new leader never expired the key");
    assert!(started.elapsed() >= Duration::from_millis(1400), "expired before its time");
    common::finish(cluster);
}
