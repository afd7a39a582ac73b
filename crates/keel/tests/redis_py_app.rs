//! An application's use of Redis through redis-py, against a 3-node cluster whose leader
//! is killed mid-run: sessions with TTLs, rate limiting with `INCR` and `EXPIRE`, a cache
//! filled with `SET ... EX ... NX`, and `SCAN` over 100,000 keys while the leader dies.
//! Nothing acknowledged is lost, nothing expired comes back, and the scan sees every key.
//! Skipped without Python's `redis` package, unless `KEEL_REQUIRE_REDIS_PY=1`.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

const SCRIPT: &str = r#"
import sys, time, redis
port = int(sys.argv[1])
r = redis.Redis(port=port, socket_timeout=10)

def retry(f):
    # A request that meets the election answers a retryable error: try again.
    for attempt in range(200):
        try:
            return f()
        except (redis.ResponseError, redis.ConnectionError, redis.TimeoutError) as e:
            text = str(e)
            if not any(w in text for w in ("TIMEOUT", "BUSY", "UNAVAILABLE", "NOTLEADER", "Timeout", "onnection")):
                raise
            time.sleep(0.05)
    raise SystemExit("never answered")

# Sessions: 200 with a 1.5 s TTL, 200 without.
for i in range(200):
    retry(lambda: r.set(f"session:short:{i}", "user", ex=None, px=1500))
    retry(lambda: r.set(f"session:long:{i}", "user"))
assert 0 < retry(lambda: r.pttl("session:short:0")) <= 1500
# Rate limiting: 5 requests in a window of 60 s.
for i in range(5):
    n = retry(lambda: r.incr("rate:alice"))
    retry(lambda: r.expire("rate:alice", 60, nx=True))
    assert n == i + 1, n
assert 0 < retry(lambda: r.ttl("rate:alice")) <= 60
# Cache: the first fill wins.
assert retry(lambda: r.set("cache:page", "v1", ex=30, nx=True)) is True
assert retry(lambda: r.set("cache:page", "v2", ex=30, nx=True)) is None
# 100,000 keys, a thousand per MSET.
for batch in range(100):
    retry(lambda: r.mset({f"item:{batch * 1000 + i:06}": "x" for i in range(1000)}))
print("written", flush=True)
assert sys.stdin.readline().strip() == "killed"
# SCAN while the cluster elects a new leader: a page that fails is asked again with the
# same cursor.
seen, cursor, pages = set(), 0, 0
while True:
    cursor, keys = retry(lambda: r.scan(cursor=cursor, match="item:*", count=1000))
    seen.update(keys)
    pages += 1
    if cursor == 0:
        break
assert len(seen) == 100000, len(seen)
# Nothing lost, nothing resurrected: wait (bounded) for the short sessions' expiry.
deadline = time.time() + 10
while retry(lambda: r.exists(*[f"session:short:{i}" for i in range(200)])) > 0:
    assert time.time() < deadline, "short sessions outlived their TTL by seconds"
    time.sleep(0.05)
for i in range(200):
    assert retry(lambda: r.get(f"session:short:{i}")) is None, i
    assert retry(lambda: r.get(f"session:long:{i}")) == b"user", i
assert retry(lambda: r.get("rate:alice")) == b"5"
assert retry(lambda: r.get("cache:page")) == b"v1"
assert retry(lambda: r.incr("rate:alice")) == 6
print(f"ok {pages} pages", flush=True)
"#;

#[test]
fn a_redis_py_application_survives_a_leader_kill() {
    if !common::redis_py() {
        return;
    }
    let (mut cluster, _) = common::cluster("redis-py-app", |_| {});
    let leader = cluster.wait_for_leader(common::LEADER_WAIT).expect("a leader");
    let follower = (leader + 1) % 3;
    let port = cluster.client_addrs()[follower].port().to_string();
    let mut child = Command::new("python3")
        .args(["-c", SCRIPT, &port])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let first = lines.next().and_then(Result::ok).unwrap_or_default();
    if first == "written" {
        cluster.kill(leader);
        let stdin = child.stdin.as_mut().expect("piped");
        writeln!(stdin, "killed").expect("the script reads");
    }
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let out = child.wait_with_output().expect("the script ends");
    assert!(
        first == "written" && out.status.success() && rest.iter().any(|l| l.starts_with("ok")),
        "redis-py application: {first} {rest:?} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{}", rest.join("\n"));
    common::finish(cluster);
}
