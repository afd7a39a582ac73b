//! Redis's databases on a default (one-keyspace) cluster: `SELECT 0..15` as namespaces
//! of keyspace 0, `DBSIZE`, `KEYS`, `FLUSHDB`, `FLUSHALL`, `FUNCTION FLUSH`; and
//! `MULTI` queuing `PING`, `ECHO`, `UNWATCH`, `SET` with options and `EXPIRE`, as Redis's
//! own test harness does.

mod common;

use common::Conn;

/// An array reply's element lines, after its header.
fn array(conn: &mut Conn, header: &str) -> Vec<String> {
    let n: usize = header.strip_prefix('*').and_then(|n| n.parse().ok()).expect(header);
    let mut out = Vec::new();
    for _ in 0..n {
        let line = conn.line().trim_end_matches("\r\n").to_string();
        if line.starts_with('$') && line != "$-1" {
            out.push(conn.line().trim_end_matches("\r\n").to_string());
        } else {
            out.push(line);
        }
    }
    out
}

#[test]
fn databases_are_namespaces_and_whole_database_commands_answer_as_redis() {
    let (cluster, _) = common::cluster("databases", |_| {});
    let mut c = Conn::open(cluster.client_addrs()[1]);
    let settled = common::wait_until(common::LEADER_WAIT, || c.call(&["SET", "a", "0"]) == "+OK");
    assert!(settled, "the cluster never accepted a write");
    assert_eq!(c.call(&["SELECT", "9"]), "+OK");
    assert_eq!(c.call(&["FLUSHALL"]), "+OK");
    assert_eq!(c.call(&["FUNCTION", "FLUSH"]), "+OK");
    assert_eq!(c.call(&["DBSIZE"]), ":0");
    for key in ["k1", "k2", "other"] {
        assert_eq!(c.call(&["SET", key, "v"]), "+OK");
    }
    assert_eq!(c.call(&["DBSIZE"]), ":3");
    let header = c.call(&["KEYS", "k*"]);
    let mut keys = array(&mut c, &header);
    keys.sort();
    assert_eq!(keys, ["k1", "k2"]);
    // Database 0 holds none of them, and its own key is unseen from 9.
    assert_eq!(c.call(&["SELECT", "0"]), "+OK");
    assert_eq!(c.call(&["GET", "k1"]), "$-1");
    assert_eq!(c.call(&["SET", "k1", "zero"]), "+OK");
    assert_eq!(c.call(&["DBSIZE"]), ":1");
    let header = c.call(&["KEYS", "*"]);
    assert_eq!(array(&mut c, &header), ["k1"]);
    assert_eq!(c.call(&["SELECT", "9"]), "+OK");
    assert_eq!(c.call(&["FLUSHDB"]), "+OK");
    assert_eq!(c.call(&["DBSIZE"]), ":0");
    assert_eq!(c.call(&["SELECT", "0"]), "+OK");
    assert_eq!(c.call(&["DBSIZE"]), ":1", "FLUSHDB of 9 left 0 alone");
    assert_eq!(c.call(&["SELECT", "16"]), "-ERR DB index is out of range");
    // COPY ... DB between two databases of the keyspace: one entry.
    assert_eq!(c.call(&["SELECT", "9"]), "+OK");
    assert_eq!(c.call(&["SET", "orig", "v"]), "+OK");
    assert_eq!(c.call(&["COPY", "orig", "copied", "DB", "10"]), ":1");
    assert_eq!(c.call(&["EXISTS", "copied"]), ":0");
    assert_eq!(c.call(&["SELECT", "10"]), "+OK");
    assert_eq!(c.call(&["GET", "copied"]), "$1");
    assert_eq!(c.line(), "v\r\n");
    assert!(c.call(&["COPY", "copied", "x", "DB", "16"]).contains("out of range"));
    assert_eq!(c.call(&["SELECT", "0"]), "+OK");
    assert_eq!(c.call(&["FLUSHALL", "ASYNC"]), "+OK");
    assert_eq!(c.call(&["DBSIZE"]), ":0");

    // MULTI queues what Redis's harness sends inside one.
    assert_eq!(c.call(&["SELECT", "9"]), "+OK");
    assert_eq!(c.call(&["MULTI"]), "+OK");
    for words in [
        &["PING"][..],
        &["SET", "t", "v", "EX", "100", "GET"],
        &["SET", "t", "w", "NX"],
        &["EXPIRE", "t", "50", "LT"],
        &["UNWATCH"],
        &["ECHO", "hi"],
    ] {
        assert_eq!(c.call(words), "+QUEUED", "{words:?}");
    }
    let header = c.call(&["EXEC"]);
    assert_eq!(array(&mut c, &header), ["+PONG", "$-1", "$-1", ":1", "+OK", "hi"]);
    let ttl: i64 = c.call(&["TTL", "t"]).trim_start_matches(':').parse().unwrap();
    assert!((49..=50).contains(&ttl), "{ttl}");
    assert_eq!(c.call(&["MULTI"]), "+OK");
    assert_eq!(c.call(&["PING"]), "+QUEUED");
    let header = c.call(&["EXEC"]);
    assert_eq!(array(&mut c, &header), ["+PONG"], "a transaction with nothing for the engine");
    common::finish(cluster);
}
