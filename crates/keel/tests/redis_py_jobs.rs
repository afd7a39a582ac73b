//! The reliable-queue pattern through redis-py against a 3-node cluster whose leader is
//! killed and restarted twice: producers `LPUSH` jobs, workers `BLMOVE` one to a
//! processing list and `LREM` it when done, every write `DURABILITY durable`. Every job
//! is processed, none twice, and none is left behind. Skipped without Python's `redis`
//! package, unless `KEEL_REQUIRE_REDIS_PY=1`.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

/// The application: `argv[1]` a port, `argv[2]` the jobs. It prints `phase N` as it goes
/// (the test kills and restarts the leader then, and answers `go`), and `ok ...` at the
/// end.
pub const SCRIPT: &str = r#"
import sys, threading, time, redis
port, total = int(sys.argv[1]), int(sys.argv[2])
PRODUCERS, WORKERS = 4, 6
RETRYABLE = ("TIMEOUT", "BUSY", "UNAVAILABLE", "NOTLEADER", "Timeout", "onnection", "closed")

def client():
    # No retries inside redis-py (it sends a command again after a connection error):
    # every retry is the script's own, so a push that may have been applied is known.
    from redis.retry import Retry
    from redis.backoff import NoBackoff
    return redis.Redis(port=port, socket_timeout=10, retry=Retry(NoBackoff(), 0))

def retry(f):
    for attempt in range(400):
        try:
            return f()
        except (redis.ResponseError, redis.ConnectionError, redis.TimeoutError) as e:
            if not any(w in str(e) for w in RETRYABLE):
                raise
            time.sleep(0.05)
    raise SystemExit("never answered")

lock = threading.Lock()
pushed, uncertain, processed, lost_in_flight = set(), set(), [], set()

def produce(k):
    r = client()
    for i in range(k, total, PRODUCERS):
        job = f"job:{i:06}"
        for attempt in range(400):
            try:
                r.execute_command("LPUSH", "jobs", job, "DURABILITY", "durable")
                break
            except (redis.ResponseError, redis.ConnectionError, redis.TimeoutError) as e:
                if not any(w in str(e) for w in RETRYABLE):
                    raise
                # The push may have been applied: the job may then be there twice.
                with lock:
                    uncertain.add(job)
                time.sleep(0.05)
        with lock:
            pushed.add(job)

done = threading.Event()

def work():
    r = client()
    while True:
        try:
            job = r.execute_command("BLMOVE", "jobs", "processing", "RIGHT", "LEFT", "0.2", "DURABILITY", "durable")
        except (redis.ResponseError, redis.ConnectionError, redis.TimeoutError) as e:
            if not any(w in str(e) for w in RETRYABLE):
                raise
            # The move may have been applied: the job then waits in `processing`.
            time.sleep(0.05)
            continue
        if job is None:
            if done.is_set():
                return
            continue
        job = job.decode()
        with lock:
            processed.append(job)
        retry(lambda: r.execute_command("LREM", "processing", "1", job, "DURABILITY", "durable"))

start = time.time()
producers = [threading.Thread(target=produce, args=(k,)) for k in range(PRODUCERS)]
workers = [threading.Thread(target=work) for _ in range(WORKERS)]
for t in producers + workers:
    t.start()
for phase in (1, 2):
    while True:
        with lock:
            if len(processed) >= total * phase // 3:
                break
        time.sleep(0.01)
    print(f"phase {phase}", flush=True)
    assert sys.stdin.readline().strip() == "go"
for t in producers:
    t.join()
# Every job in: the workers stop once the list is found empty.
while retry(lambda: client().llen("jobs")) > 0:
    time.sleep(0.05)
done.set()
for t in workers:
    t.join()
elapsed = time.time() - start
r = client()
left = [j.decode() for j in retry(lambda: r.lrange("processing", 0, -1))]
queued = [j.decode() for j in retry(lambda: r.lrange("jobs", 0, -1))]
counts = {}
for job in processed:
    counts[job] = counts.get(job, 0) + 1
twice = [j for j, n in counts.items() if n > 1 and j not in uncertain]
assert not twice, f"processed twice: {twice[:10]} (uncertain pushes: {sorted(uncertain)[:10]})"
missing = sorted(pushed - set(processed) - set(left) - set(queued))
assert not missing, f"lost: {missing[:10]} of {len(missing)}"
assert not queued, f"left in jobs: {queued[:10]}"
print(f"ok {len(processed)} processed of {total} in {elapsed:.2f}s, {len(left)} left in processing, {len(uncertain)} uncertain pushes", flush=True)
"#;

#[test]
fn a_reliable_job_queue_survives_two_leader_kills() {
    if !common::redis_py() {
        return;
    }
    let (mut cluster, _) = common::cluster("redis-py-jobs", |_| {});
    let leader = cluster.wait_for_leader(common::LEADER_WAIT).expect("a leader");
    // Connected to a node that stays up through both kills (the leader changes).
    let kills = [leader, (leader + 1) % 3];
    let stays = (0..3).find(|n| !kills.contains(n)).expect("three nodes");
    let port = cluster.client_addrs()[stays].port().to_string();
    let mut child = Command::new("python3")
        .args(["-c", SCRIPT, &port, "3000"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let mut seen = Vec::new();
    for victim in kills {
        let line = lines.next().and_then(Result::ok).unwrap_or_default();
        seen.push(line.clone());
        if !line.starts_with("phase") {
            break;
        }
        let current = cluster.wait_for_leader(common::LEADER_WAIT).unwrap_or(victim);
        cluster.kill(current);
        let down = common::wait_until(common::LEADER_WAIT, || !cluster.is_running(current));
        assert!(down, "node {current} still runs after the kill");
        cluster.restart(current).expect("the killed node restarts");
        let stdin = child.stdin.as_mut().expect("piped");
        writeln!(stdin, "go").expect("the script reads");
    }
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let out = child.wait_with_output().expect("the script ends");
    assert!(
        out.status.success() && rest.iter().any(|l| l.starts_with("ok")),
        "redis-py job queue: {seen:?} {rest:?} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{}", rest.join("\n"));
    common::finish(cluster);
}
