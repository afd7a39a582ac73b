//! `MULTI` ... `EXEC` against real `keel server` processes: the queued commands apply as
//! one log entry, all or none; `WATCH` aborts a transaction whose key changed; and
//! redis-py's transaction pipeline, `WatchError` and `transaction()` helper work
//! unmodified (skipped without Python's `redis` package, unless `KEEL_REQUIRE_REDIS_PY=1`).

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
    let has_redis_py = Command::new("python3")
        .args(["-c", "import redis"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_redis_py {
        let required = std::env::var("KEEL_REQUIRE_REDIS_PY").is_ok_and(|v| v == "1");
        assert!(!required, "python3 with redis-py is missing and KEEL_REQUIRE_REDIS_PY=1");
        eprintln!("skipping redis-py: python3 -c 'import redis' fails (pip install redis)");
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
