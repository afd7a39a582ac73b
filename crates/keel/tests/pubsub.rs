//! Pub/sub across a real 3-node cluster: a message published at one node reaches the
//! subscribers of every node, in order, by channel and by pattern; keyspace
//! notifications come from what each node applies, so a subscriber at a follower hears
//! the leader's writes and its expiries.

mod common;

use common::Conn;

/// Reads one RESP2 array of bulk strings and integers (a pushed message), as text.
fn pushed(conn: &mut Conn) -> Vec<String> {
    let header = conn.line();
    let n: usize = header.trim_end().strip_prefix('*').and_then(|n| n.parse().ok()).expect(&header);
    (0..n)
        .map(|_| {
            let line = conn.line().trim_end_matches("\r\n").to_string();
            match line.strip_prefix('$') {
                Some("-1") => "(nil)".to_string(),
                Some(_) => conn.line().trim_end_matches("\r\n").to_string(),
                None => line,
            }
        })
        .collect()
}

/// Sends `words` without reading the reply.
fn send(conn: &mut Conn, words: &[&str]) {
    let mut out = format!("*{}\r\n", words.len()).into_bytes();
    for w in words {
        out.extend_from_slice(format!("${}\r\n{w}\r\n", w.len()).as_bytes());
    }
    conn.send(&out);
}

#[test]
fn a_message_published_at_one_node_reaches_every_nodes_subscribers_in_order() {
    let (cluster, _) = common::cluster("pubsub-messages", |_| {});
    let addrs = cluster.client_addrs();
    let mut subscribers: Vec<Conn> = addrs.iter().map(|a| Conn::open(*a)).collect();
    for sub in &mut subscribers {
        send(sub, &["SUBSCRIBE", "news"]);
        assert_eq!(pushed(sub), ["subscribe", "news", ":1"]);
        send(sub, &["PSUBSCRIBE", "n*"]);
        assert_eq!(pushed(sub), ["psubscribe", "n*", ":2"]);
    }
    let mut publisher = Conn::open(addrs[1]);
    // A subscription is in place at its node once confirmed. A message sent while a
    // peer link is still being dialed is lost (at most once, as Redis's pub/sub), so the
    // first is sent three times and the copies drained at a marker.
    for _ in 0..3 {
        assert_eq!(publisher.call(&["PUBLISH", "news", "m0"]), ":2", "this node's two");
    }
    // Drain the copies of the first, then 100 numbered messages in order at every node.
    assert_eq!(publisher.call(&["PUBLISH", "news", "marker"]), ":2");
    for sub in &mut subscribers {
        loop {
            let message = pushed(sub);
            if message.last().map(String::as_str) == Some("marker") {
                assert_eq!(pushed(sub), ["pmessage", "n*", "news", "marker"]);
                break;
            }
        }
    }
    for i in 0..100 {
        assert_eq!(publisher.call(&["PUBLISH", "news", &format!("m{i}")]), ":2");
    }
    for (n, sub) in subscribers.iter_mut().enumerate() {
        for i in 0..100 {
            let body = format!("m{i}");
            assert_eq!(pushed(sub), ["message", "news", body.as_str()], "node {n}");
            assert_eq!(pushed(sub), ["pmessage", "n*", "news", body.as_str()], "node {n}");
        }
    }
    let mut other = Conn::open(addrs[2]);
    assert_eq!(other.call(&["PUBSUB", "NUMSUB", "news"]), "*2");
    assert_eq!(other.line(), "$4\r\n");
    assert_eq!(other.line(), "news\r\n");
    assert_eq!(other.line(), ":1\r\n", "this node's subscriber");
    assert_eq!(other.call(&["PUBSUB", "NUMPAT"]), ":1");
    common::finish(cluster);
}

#[test]
fn keyspace_notifications_at_a_follower_name_the_leaders_writes_and_expiries() {
    let (cluster, leader) = common::cluster("pubsub-keyspace", |_| {});
    let addrs = cluster.client_addrs();
    let follower = (leader + 1) % addrs.len();
    let mut config = Conn::open(addrs[follower]);
    assert_eq!(config.call(&["CONFIG", "SET", "notify-keyspace-events", "KEA"]), "+OK");
    assert_eq!(config.call(&["CONFIG", "GET", "notify-keyspace-events"]), "*2");
    assert_eq!(config.line(), "$22\r\n");
    assert_eq!(config.line(), "notify-keyspace-events\r\n");
    assert_eq!(config.line(), "$3\r\n");
    assert_eq!(config.line(), "AKE\r\n", "Redis's order: classes, then K and E");
    let mut sub = Conn::open(addrs[follower]);
    send(&mut sub, &["PSUBSCRIBE", "__key*__:*"]);
    assert_eq!(pushed(&mut sub), ["psubscribe", "__key*__:*", ":1"]);
    let mut writer = Conn::open(addrs[leader]);
    assert_eq!(writer.call(&["SET", "foo", "bar"]), "+OK");
    assert_eq!(pushed(&mut sub), ["pmessage", "__key*__:*", "__keyspace@0__:foo", "set"]);
    assert_eq!(pushed(&mut sub), ["pmessage", "__key*__:*", "__keyevent@0__:set", "foo"]);
    assert_eq!(writer.call(&["SELECT", "9"]), "+OK");
    assert_eq!(writer.call(&["RPUSH", "jobs", "a", "b"]), ":2");
    assert_eq!(pushed(&mut sub)[2..], ["__keyspace@9__:jobs", "rpush"], "database 9's number");
    assert_eq!(pushed(&mut sub)[2..], ["__keyevent@9__:rpush", "jobs"]);
    assert_eq!(writer.call(&["SET", "t", "v", "PX", "100"]), "+OK");
    assert_eq!(pushed(&mut sub)[2..], ["__keyspace@9__:t", "set"]);
    assert_eq!(pushed(&mut sub)[2..], ["__keyevent@9__:set", "t"]);
    assert_eq!(pushed(&mut sub)[2..], ["__keyspace@9__:t", "expire"]);
    assert_eq!(pushed(&mut sub)[2..], ["__keyevent@9__:expire", "t"]);
    // The leader's expiry entry removes it; the follower applies it and says so.
    assert_eq!(pushed(&mut sub)[2..], ["__keyspace@9__:t", "expired"]);
    assert_eq!(pushed(&mut sub)[2..], ["__keyevent@9__:expired", "t"]);
    // A node whose own setting is off says nothing: the leader's subscribers hear none.
    let mut quiet = Conn::open(addrs[leader]);
    send(&mut quiet, &["PSUBSCRIBE", "__key*__:*"]);
    assert_eq!(pushed(&mut quiet), ["psubscribe", "__key*__:*", ":1"]);
    assert_eq!(writer.call(&["DEL", "jobs"]), ":1");
    assert_eq!(pushed(&mut sub)[2..], ["__keyspace@9__:jobs", "del"]);
    quiet.0.set_read_timeout(Some(std::time::Duration::from_millis(300))).unwrap();
    assert!(quiet.closed(), "nothing arrived (read timed out)");
    common::finish(cluster);
}
