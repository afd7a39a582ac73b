//! `MULTI` ... `EXEC` against real `keel server` processes: the queued commands apply as
//! one log entry, all or none; `WATCH` aborts a transaction whose key changed, a delete
//! included; `KEEL.REQ <client> <seq> EXEC` makes a transaction retried on a new
//! connection apply once; and redis-py's transaction pipeline, `WatchError` and
//! `transaction()` helper work unmodified (skipped without Python's `redis` package,
//! unless `KEEL_REQUIRE_REDIS_PY=1`).

mod common;

use common::Conn;
use std::process::Command;

/// Sends `words` and reads the reply's lines until `lines` are in: the reply of a
/// transaction spans several.
fn exec(conn: &mut Conn, lines: usize) -> Vec<String> {
    conn.send(b"*1\r\n$4\r\nEXEC\r\n");
    (0..lines).map(|_| conn.line().trim_end_matches("\r\n").to_string()).collect()
}

#[test]
fn transactions_apply_all_or_nothing_and_watch_aborts_them() {
    let (cluster, _) = common::cluster("transactions", |_| {});
    // A follower: the transaction is forwarded to the leader as one request.
    let addr = cluster.client_addrs()[1];
    let mut a = Conn::open(addr);
    let settled = common::wait_until(common::LEADER_WAIT, || a.call(&["SET", "t:a", "0"]) == "+OK");
    assert!(settled, "the cluster never accepted a write");

    assert_eq!(a.call(&["MULTI"]), "+OK");
    assert_eq!(a.call(&["SET", "t:a", "1"]), "+QUEUED");
    assert_eq!(a.call(&["INCR", "t:n"]), "+QUEUED");
    assert_eq!(a.call(&["GET", "t:a"]), "+QUEUED");
    assert_eq!(a.call(&["DEL", "t:a", "t:none"]), "+QUEUED");
    assert_eq!(exec(&mut a, 6), ["*4", "+OK", ":1", "$1", "1", ":1"]);
    assert_eq!(a.call(&["EXISTS", "t:a"]), ":0");

    // A failing command applies none of the others.
    assert_eq!(a.call(&["SET", "t:s", "text"]), "+OK");
    assert_eq!(a.call(&["MULTI"]), "+OK");
    assert_eq!(a.call(&["SET", "t:a", "2"]), "+QUEUED");
    assert_eq!(a.call(&["INCR", "t:s"]), "+QUEUED");
    let failed = exec(&mut a, 1);
    assert!(failed[0].starts_with("-ERR"), "{failed:?}");
    assert_eq!(a.call(&["EXISTS", "t:a"]), ":0", "the SET before the failing INCR is undone");
    // A command refused while queuing discards the transaction.
    assert_eq!(a.call(&["MULTI"]), "+OK");
    assert_eq!(a.call(&["SET", "t:a", "3"]), "+QUEUED");
    assert!(a.call(&["SET", "t:a"]).starts_with("-ERR wrong number of arguments"));
    assert!(exec(&mut a, 1)[0].starts_with("-EXECABORT"));
    assert_eq!(a.call(&["EXISTS", "t:a"]), ":0");

    // WATCH: another client's write in between aborts the transaction (a null reply).
    let mut b = Conn::open(cluster.client_addrs()[2]);
    assert_eq!(a.call(&["WATCH", "t:w"]), "+OK");
    assert_eq!(b.call(&["SET", "t:w", "theirs"]), "+OK");
    assert_eq!(a.call(&["MULTI"]), "+OK");
    assert_eq!(a.call(&["SET", "t:w", "mine"]), "+QUEUED");
    assert_eq!(exec(&mut a, 1), ["*-1"]);
    assert_eq!(a.call(&["GET", "t:w"]), "$6");
    assert_eq!(a.line(), "theirs\r\n");
    // Unchanged since WATCH: applied.
    assert_eq!(a.call(&["WATCH", "t:w"]), "+OK");
    assert_eq!(a.call(&["MULTI"]), "+OK");
    assert_eq!(a.call(&["SET", "t:w", "mine"]), "+QUEUED");
    assert_eq!(exec(&mut a, 2), ["*1", "+OK"]);
    assert_eq!(b.call(&["GET", "t:w", "LEVEL", "linearizable"]), "$4");

    redis_py(cluster.client_addrs()[0].port());
    common::finish(cluster);
}

/// redis-py's transactions against the node on `port`.
fn redis_py(port: u16) {
    if !common::redis_py() {
        return;
    }
    let script = r#"
import sys, redis
port = int(sys.argv[1])
r = redis.Redis(port=port)
other = redis.Redis(port=port)
p = r.pipeline(transaction=True)
p.set("py:a", "1").incr("py:n").get("py:a")
assert p.execute() == [True, 1, b"1"], "pipeline results"
r.set("py:s", "text")
p = r.pipeline(transaction=True)
p.set("py:a", "2").incr("py:s")
try:
    p.execute()
    raise SystemExit("a failing transaction raised nothing")
except redis.ResponseError:
    pass
assert r.get("py:a") == b"1", "a failing transaction applies nothing"
with r.pipeline() as p:
    p.watch("py:w")
    other.set("py:w", "theirs")
    p.multi()
    p.set("py:w", "mine")
    try:
        p.execute()
        raise SystemExit("WATCH did not abort")
    except redis.WatchError:
        pass
assert r.get("py:w") == b"theirs"
def add_two(pipe):
    value = int(pipe.get("py:c") or 0)
    pipe.multi()
    pipe.set("py:c", value + 2)
r.transaction(add_two, "py:c")
r.transaction(add_two, "py:c")
assert r.get("py:c") == b"4", r.get("py:c")
print("redis-py transactions ok")
"#;
    let out = Command::new("python3")
        .args(["-c", script, &port.to_string()])
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "redis-py: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Queues `INCR key` in a new transaction on `conn` and runs it as `KEEL.REQ <client> 1
/// EXEC`, reading the reply if `read`.
fn named_incr(conn: &mut Conn, key: &str, client: &str, read: bool) -> Option<Vec<String>> {
    assert_eq!(conn.call(&["MULTI"]), "+OK");
    assert_eq!(conn.call(&["INCR", key]), "+QUEUED");
    let words = ["KEEL.REQ", client, "1", "EXEC"];
    let mut out = format!("*{}\r\n", words.len()).into_bytes();
    for w in words {
        out.extend_from_slice(format!("${}\r\n{w}\r\n", w.len()).as_bytes());
    }
    conn.send(&out);
    read.then(|| (0..2).map(|_| conn.line().trim_end_matches("\r\n").to_string()).collect())
}

/// The value of `key` read at `linearizable` on `conn`.
fn linearizable(conn: &mut Conn, key: &str) -> String {
    let header = conn.call(&["GET", key, "LEVEL", "linearizable"]);
    assert!(header.starts_with('$'), "{header}");
    conn.line().trim_end_matches("\r\n").to_string()
}

#[test]
fn a_delete_aborts_a_watch_and_a_retried_exec_is_applied_once() {
    let (cluster, _) = common::cluster("transactions-retry", |_| {});
    let addrs = cluster.client_addrs();
    let mut a = Conn::open(addrs[0]);
    let settled = common::wait_until(common::LEADER_WAIT, || a.call(&["SET", "r:a", "0"]) == "+OK");
    assert!(settled, "the cluster never accepted a write");

    // WATCH of a key never written; another client sets it and deletes it: the key is
    // absent again, and still EXEC applies nothing (Redis's rule: any write aborts).
    let mut b = Conn::open(addrs[1]);
    assert_eq!(a.call(&["WATCH", "r:w"]), "+OK");
    assert_eq!(b.call(&["SET", "r:w", "theirs"]), "+OK");
    assert_eq!(b.call(&["DEL", "r:w"]), ":1");
    assert_eq!(a.call(&["MULTI"]), "+OK");
    assert_eq!(a.call(&["SET", "r:w", "mine"]), "+QUEUED");
    assert_eq!(exec(&mut a, 1), ["*-1"]);
    assert_eq!(a.call(&["EXISTS", "r:w"]), ":0");

    // A transaction under `KEEL.REQ`, answered; its retry on another connection at
    // another node (after a timeout, say), watching again: the first result, not applied
    // again.
    assert_eq!(named_incr(&mut a, "r:n", "9001", true).unwrap(), ["*1", ":1"]);
    assert_eq!(b.call(&["WATCH", "r:n"]), "+OK");
    assert_eq!(named_incr(&mut b, "r:n", "9001", true).unwrap(), ["*1", ":1"]);
    assert_eq!(linearizable(&mut a, "r:n"), "1");

    // The client gives up on its connection before the reply; a retry on a new one, at
    // yet another node, applies it once whichever of the two the cluster saw first.
    let mut gone = Conn::open(addrs[2]);
    named_incr(&mut gone, "r:m", "9002", false);
    drop(gone);
    let mut again = Conn::open(addrs[1]);
    assert_eq!(named_incr(&mut again, "r:m", "9002", true).unwrap(), ["*1", ":1"]);
    assert_eq!(linearizable(&mut a, "r:m"), "1");
    // Other commands under the same pair are another request: refused, nothing applied.
    assert_eq!(again.call(&["MULTI"]), "+OK");
    assert_eq!(again.call(&["INCR", "r:other"]), "+QUEUED");
    let reused = again.call(&["KEEL.REQ", "9002", "1", "EXEC"]);
    assert!(reused.contains("request 1 of client 9002 was already used"), "{reused}");
    assert_eq!(a.call(&["EXISTS", "r:other"]), ":0");
    // A plain EXEC sent twice is two transactions: what `KEEL.REQ` prevents.
    for _ in 0..2 {
        assert_eq!(a.call(&["MULTI"]), "+OK");
        assert_eq!(a.call(&["INCR", "r:plain"]), "+QUEUED");
        exec(&mut a, 2);
    }
    assert_eq!(linearizable(&mut a, "r:plain"), "2");
    common::finish(cluster);
}
