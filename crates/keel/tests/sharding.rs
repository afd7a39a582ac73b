//! Keyspaces placed on replica groups, and a sharded cluster speaking the Redis Cluster
//! protocol, with real processes: six nodes, two groups of three splitting the hash
//! slots (`keel up --nodes 6 --sharded`), and four keyspaces placed on groups of three
//! (`keel up --nodes 6 --keyspaces 4 --replicas 3`).

mod common;

use keel_server::local::{placed_keyspaces, LocalCluster};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

/// Six nodes, `groups` keyspaces of three replicas, sharded or not; waits for every
/// keyspace's leader.
fn six(name: &str, groups: u32, sharded: bool) -> LocalCluster {
    six_with(name, groups, sharded, |_| {})
}

/// [`six`] with `tweak` applied to every node's configuration.
fn six_with(
    name: &str,
    groups: u32,
    sharded: bool,
    tweak: impl Fn(&mut keel_server::ServerConfig),
) -> LocalCluster {
    let cluster = common::start_n(name, 6, |c| {
        c.keyspaces = placed_keyspaces(6, groups, 3, sharded);
        tweak(c);
    });
    for ks in 0..groups {
        if cluster.wait_for_leader_in(ks, common::LEADER_WAIT).is_none() {
            common::dump_logs(&cluster);
            panic!("no leader in keyspace {ks}");
        }
    }
    cluster
}

/// The lines of `redis-cli -p port args...`.
fn cli(port: u16, args: &[&str]) -> Vec<String> {
    let port = port.to_string();
    let mut all = vec!["-p", port.as_str()];
    all.extend_from_slice(args);
    common::run("redis-cli", &all).lines().map(str::to_string).collect()
}

#[test]
fn a_sharded_cluster_routes_by_slot_and_describes_its_map() {
    let Some(_) = common::tool("redis-cli") else { return };
    let cluster = six("sharded-protocol", 2, true);
    let addrs = cluster.client_addrs();
    let (n1, n4) = (addrs[0], addrs[3]);
    let mut c = common::Conn::open(n1);
    // `foo` is in slot 12182 (keyspace 1, on n4..n6); `bar` in 5061 (keyspace 0, here).
    assert_eq!(c.call(&["CLUSTER", "KEYSLOT", "foo"]), ":12182");
    assert_eq!(c.call(&["SET", "foo", "1"]), format!("-MOVED 12182 {n4}"));
    assert_eq!(c.call(&["SET", "bar", "1"]), "+OK");
    assert_eq!(
        c.call(&["MSET", "a", "1", "b", "2"]),
        "-CROSSSLOT Keys in request don't hash to the same slot"
    );
    assert_eq!(c.call(&["MSET", "{bar}a", "1", "{bar}b", "2"]), "+OK");
    assert_eq!(c.call(&["SELECT", "0"]), "+OK");
    assert!(c.call(&["SELECT", "5"]).starts_with("-ERR SELECT is not allowed in cluster mode"));
    // A transaction with a key served elsewhere is discarded at EXEC.
    assert_eq!(c.call(&["MULTI"]), "+OK");
    assert_eq!(c.call(&["SET", "bar", "2"]), "+QUEUED");
    assert_eq!(c.call(&["SET", "foo", "2"]), format!("-MOVED 12182 {n4}"));
    assert!(c.call(&["EXEC"]).starts_with("-EXECABORT"));
    assert_eq!(c.bulk(&["GET", "bar"]).as_deref(), Some("1"), "nothing of it applied");
    // Keel's own options after the keys, and commands whose keys Redis's positions miss.
    assert_eq!(c.call(&["GET", "foo", "WITHVERSION"]), format!("-MOVED 12182 {n4}"));
    assert_eq!(c.call(&["GET", "foo", "LEVEL", "linearizable"]), format!("-MOVED 12182 {n4}"));
    assert_eq!(c.call(&["OBJECT", "ENCODING", "foo"]), format!("-MOVED 12182 {n4}"));
    assert_eq!(c.call(&["MGET", "bar", "{bar}a", "LEVEL", "any"]), "*2");
    let _ = (c.line(), c.line(), c.line(), c.line());
    // A script reaches no key of another keyspace, whatever keys it declared.
    let script = "return redis.call('get', 'foo')";
    let refused = c.call(&["EVAL", script, "0"]);
    assert!(refused.starts_with('-') && refused.contains("MOVED"), "{refused}");
    // Transactions of one slot run; other databases do not exist.
    assert_eq!(c.call(&["MULTI"]), "+OK");
    assert_eq!(c.call(&["SET", "bar", "2"]), "+QUEUED");
    assert_eq!(c.call(&["SET", "{bar}c", "3"]), "+QUEUED");
    assert_eq!(c.call(&["EXEC"]), "*2");
    let _ = (c.line(), c.line());
    assert_eq!(c.bulk(&["GET", "{bar}c"]).as_deref(), Some("3"));
    assert!(c
        .call(&["SWAPDB", "0", "1"])
        .starts_with("-ERR SWAPDB is not allowed in cluster mode"));
    assert!(c.call(&["MOVE", "bar", "1"]).starts_with("-ERR MOVE is not allowed in cluster mode"));
    let copy = c.call(&["COPY", "bar", "{bar}2", "DB", "1"]);
    assert!(copy.starts_with("-ERR"), "{copy}");
    assert_eq!(c.call(&["SET", "bar", "1"]), "+OK");
    // At the other group, `foo` is served and `bar` sent back; keyspace notifications
    // name database 0, the only one a cluster client knows.
    let mut d = common::Conn::open(n4);
    let mut listener = common::Conn::open(n4);
    assert_eq!(listener.call(&["CONFIG", "SET", "notify-keyspace-events", "KA"]), "+OK");
    assert_eq!(listener.call(&["SUBSCRIBE", "__keyspace@0__:foo"]), "*3");
    let _ = (0..5).map(|_| listener.line()).count(); // subscribe, the channel, 1
    assert_eq!(d.call(&["SET", "foo", "1"]), "+OK");
    let pushed: Vec<String> = (0..7).map(|_| listener.line()).collect();
    assert_eq!(pushed[4].trim_end(), "__keyspace@0__:foo", "{pushed:?}");
    assert_eq!(pushed[6].trim_end(), "set", "{pushed:?}");
    assert_eq!(d.call(&["GET", "bar"]), format!("-MOVED 5061 {n1}"));
    // The map, as every node describes it.
    for (i, addr) in addrs.iter().enumerate() {
        let info = cli(addr.port(), &["CLUSTER", "INFO"]);
        assert!(info.contains(&"cluster_state:ok".to_string()), "n{}: {info:?}", i + 1);
        assert!(info.contains(&"cluster_size:2".to_string()), "n{}: {info:?}", i + 1);
        let nodes = cli(addr.port(), &["CLUSTER", "NODES"]);
        assert_eq!(nodes.len(), 6, "n{}: {nodes:?}", i + 1);
        let masters: Vec<&String> = nodes.iter().filter(|l| l.contains("master")).collect();
        assert_eq!(masters.len(), 2, "n{}: {nodes:?}", i + 1);
        assert!(masters.iter().any(|l| l.ends_with(" 0-8191")), "n{}: {nodes:?}", i + 1);
        assert!(masters.iter().any(|l| l.ends_with(" 8192-16383")), "n{}: {nodes:?}", i + 1);
        assert_eq!(nodes.iter().filter(|l| l.contains("myself")).count(), 1);
        let info = cli(addr.port(), &["INFO", "cluster"]);
        assert!(info.contains(&"cluster_enabled:1".to_string()), "{info:?}");
    }
    let slots = cli(n1.port(), &["CLUSTER", "SLOTS"]);
    assert_eq!(slots.iter().filter(|l| *l == "127.0.0.1").count(), 6, "{slots:?}");
    // redis-cli follows the redirects itself.
    for i in 0..50 {
        let key = format!("key:{i}");
        assert_eq!(cli(n1.port(), &["-c", "SET", &key, &i.to_string()]), ["OK"]);
    }
    for i in 0..50 {
        let key = format!("key:{i}");
        assert_eq!(cli(addrs[5].port(), &["-c", "GET", &key]), [i.to_string()]);
    }
    common::finish(cluster);
}

/// The negative control of the slot guard: without it, a script at a node of one group
/// writes a key of the other group's slot into its own keyspace, where no client finds
/// it (the guarded cluster answers `MOVED`: above).
#[test]
fn without_the_slot_guard_a_script_writes_where_no_client_finds_it() {
    let cluster = six_with("sharded-unguarded", 2, true, |c| {
        c.testing.unsafe_no_slot_guard = true;
    });
    let addrs = cluster.client_addrs();
    let mut c = common::Conn::open(addrs[0]);
    // `foo` is in slot 12182, keyspace 1's (n4 to n6); the script runs at n1.
    let script = "return redis.call('set', 'foo', 'stray')";
    assert_eq!(c.call(&["EVAL", script, "0"]), "+OK", "the write is taken");
    let mut owner = common::Conn::open(addrs[3]);
    assert_eq!(owner.bulk(&["GET", "foo"]), None, "and lost to every client");
    common::finish(cluster);
}

/// A node configured with another placement is named by the others' `/status`.
#[test]
fn a_member_configured_otherwise_is_named_as_disagreeing() {
    let cluster = six_with("sharded-disagreeing", 2, true, |c| {
        if c.node_id == 6 {
            c.keyspaces[0].slots = Some("0-8190".into());
            c.keyspaces[1].slots = Some("8191-16383".into());
        }
    });
    let named = common::wait_until(std::time::Duration::from_secs(10), || {
        status(&cluster, 0)["placement"]["disagreeing"] == serde_json::json!([6])
    });
    assert!(named, "{}", status(&cluster, 0));
    let digest = |i: usize| status(&cluster, i)["placement"]["digest"].clone();
    assert_eq!(digest(1), digest(0));
    assert_ne!(digest(5), digest(0));
    common::finish(cluster);
}

/// Node `i`'s `/status` document.
fn status(cluster: &LocalCluster, i: usize) -> serde_json::Value {
    let http = cluster.configs[i].http_addr.expect("an HTTP port");
    let mut stream = std::net::TcpStream::connect(http).expect("the HTTP port accepts");
    stream.write_all(b"GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut page = String::new();
    let _ = std::io::Read::read_to_string(&mut stream, &mut page);
    let body = page.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str(body).expect("a JSON document")
}

#[test]
fn keyspaces_placed_on_groups_serve_where_they_live_and_say_where_elsewhere() {
    let cluster = six("placed", 4, false);
    let addrs = cluster.client_addrs();
    // Keyspace k on nodes 3k mod 6 + 1 .. + 3: n1 hosts 0 and 2, n4 hosts 1 and 3.
    let mut leaders = std::collections::BTreeSet::new();
    for ks in 0..4u32 {
        let hosts = cluster.hosting(ks);
        let leader = cluster.wait_for_leader_in(ks, common::LEADER_WAIT).expect("a leader");
        assert!(hosts.contains(&leader), "keyspace {ks}: leader n{} of {hosts:?}", leader + 1);
        leaders.insert(leader);
        for i in hosts {
            let mut c = common::Conn::open(addrs[i]);
            assert_eq!(c.call(&["SELECT", &ks.to_string()]), "+OK");
            let key = format!("k{ks}n{i}");
            assert_eq!(c.call(&["SET", &key, "v"]), "+OK");
            assert_eq!(c.bulk(&["GET", &key]).as_deref(), Some("v"));
        }
    }
    eprintln!("leaders: {leaders:?}");
    let mut c = common::Conn::open(addrs[0]);
    let refusal = c.call(&["SELECT", "1"]);
    assert!(refusal.starts_with("-ERR keyspace 1 is not on this node"), "{refusal}");
    assert!(refusal.contains(&addrs[3].to_string()), "{refusal}");
    assert!(c
        .call(&["CLUSTER", "INFO"])
        .starts_with("-ERR This instance has cluster support disabled"));
    // A membership change names a replica of the keyspace, or is refused.
    assert_eq!(c.call(&["SELECT", "0"]), "+OK");
    let refused = c.call(&["KEEL.NODE", "ADD", "5"]);
    assert!(refused.starts_with("-ERR node 5 is not a replica of keyspace 0"), "{refused}");
    // `/status` shows the whole placement, beside the keyspaces the node hosts.
    let doc = status(&cluster, 0);
    assert_eq!(doc["placement"]["disagreeing"], serde_json::json!([]));
    assert_eq!(doc["keyspaces"].as_array().map(Vec::len), Some(2), "n1 hosts two");
    let placed = doc["placement"]["keyspaces"].as_array().expect("the placement");
    assert_eq!(placed.len(), 4);
    assert_eq!(placed[1]["replicas"], serde_json::json!([4, 5, 6]));
    assert_eq!(placed[1]["preferred_leader"], 4);
    // Each node's status lists the keyspaces it hosts.
    for (i, config) in cluster.configs.iter().enumerate() {
        let hosted: Vec<u32> = config.keyspace_specs().unwrap().iter().map(|s| s.id.0).collect();
        let expected: Vec<u32> = if i < 3 { vec![0, 2] } else { vec![1, 3] };
        assert_eq!(hosted, expected, "n{}", i + 1);
    }
    common::finish(cluster);
}

/// A checked workload through redis-py's `RedisCluster`: each of four writers owns its
/// keys (spread over both groups) and writes each an increasing number, `durable` by the
/// keyspaces' default (a `memory` write that a killed leader acknowledged alone may be
/// lost, by its contract); it reads each back after its write at the default level,
/// `monotonic`, and no read returns less than a read of that key before it. After the
/// run, every key holds its last acknowledged number, or the one after it when that
/// write's outcome was unknown. (A `monotonic` read at another replica than the write's,
/// where a client's slot map may send it after a failover, need not see that write yet:
/// reads that must see the client's own writes ask `linearizable`.)
const WORKLOAD: &str = r#"
import sys, time, threading, redis
from redis.cluster import RedisCluster, ClusterNode
ports = [int(p) for p in sys.argv[1].split(",")]
seconds = float(sys.argv[2])
startup = [ClusterNode("127.0.0.1", p) for p in ports]

def client():
    return RedisCluster(startup_nodes=startup, socket_timeout=5, cluster_error_retry_attempts=10)

RETRYABLE = ("TIMEOUT", "BUSY", "UNAVAILABLE", "NOTLEADER", "Timeout", "onnection", "MOVED", "TRYAGAIN", "CLUSTERDOWN")

def retry(rc, f):
    for attempt in range(400):
        try:
            return f()
        except (redis.ConnectionError, redis.TimeoutError, redis.exceptions.ClusterError):
            time.sleep(0.05)
        except redis.ResponseError as e:
            if not any(w in str(e) for w in RETRYABLE):
                raise
            time.sleep(0.05)
    raise SystemExit("never answered")

acked, unknown, errors, ops, read = {}, {}, [], [0], {}
lock = threading.Lock()

def writer(w):
    rc = client()
    keys = [f"w{w}:k{i}" for i in range(32)]
    n = 0
    deadline = time.time() + seconds
    while time.time() < deadline:
        n += 1
        for key in keys:
            try:
                rc.set(key, n)
            except Exception as e:
                with lock:
                    unknown[key] = n
                time.sleep(0.05)
                continue
            with lock:
                acked[key] = n
                unknown.pop(key, None)
                ops[0] += 1
            got = retry(rc, lambda: rc.get(key))
            got = -1 if got is None else int(got)
            if got < read.get(key, -1):
                errors.append(f"{key}: read {got} after reading {read[key]}")
            read[key] = max(read.get(key, -1), got)

threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
for t in threads: t.start()
time.sleep(1.0)
print("running", flush=True)
for t in threads: t.join()
rc = client()
groups = set()
for key, n in acked.items():
    got = int(retry(rc, lambda: rc.get(key)))
    allowed = {n, unknown.get(key, n)}
    if got not in allowed:
        errors.append(f"{key}: holds {got}, last acknowledged {n}, unknown {unknown.get(key)}")
    groups.add(rc.keyslot(key) >= 8192)
assert groups == {False, True}, groups
if errors:
    print("FAILED " + "; ".join(errors[:10]), flush=True)
    sys.exit(1)
print(f"ok {ops[0]} writes, {len(acked)} keys", flush=True)
"#;

/// `keel slots move` of `slots` from keyspace `from` (hosted by nodes `sources`, indexes)
/// to `to` (nodes `targets`), started now.
fn move_slots(
    cluster: &LocalCluster,
    slots: &str,
    (from, sources): (u32, &[usize]),
    (to, targets): (u32, &[usize]),
) -> std::process::Child {
    let addrs = cluster.client_addrs();
    let mut args = vec!["slots".to_string(), "move".into(), "--slots".into(), slots.into()];
    args.extend(["--from".into(), from.to_string(), "--to".into(), to.to_string()]);
    args.extend(["--batch".into(), "4".into()]);
    for &i in sources {
        args.extend(["--source".into(), addrs[i].to_string()]);
    }
    for &i in targets {
        args.extend(["--target".into(), addrs[i].to_string()]);
    }
    Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("keel runs")
}

/// Waits for a `keel slots move` and returns its output; panics (with the cluster's logs)
/// if it failed.
fn moved(cluster: &LocalCluster, child: std::process::Child) -> String {
    let out = child.wait_with_output().expect("keel slots move ends");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        common::dump_logs(cluster);
        panic!("keel slots move failed: {text}\n{}", String::from_utf8_lossy(&out.stderr));
    }
    text
}

#[test]
fn redis_py_cluster_client_keeps_every_write_while_slots_move_and_a_leader_dies() {
    if !common::redis_py() {
        return;
    }
    let mut cluster = six_with("sharded-redis-py", 2, true, |c| {
        c.engine.durability_default = Some(keel_types::Durability::Durable);
    });
    let ports: Vec<String> = cluster.client_addrs().iter().map(|a| a.port().to_string()).collect();
    let mut child = Command::new("python3")
        .args(["-c", WORKLOAD, &ports.join(","), "20"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let first = lines.next().and_then(Result::ok).unwrap_or_default();
    assert_eq!(first, "running");
    // Move every slot of keyspace 0 to keyspace 1 while the workload runs; kill keyspace
    // 1's leader mid-move, and start it again later.
    let (group0, group1): (&[usize], &[usize]) = (&[0, 1, 2], &[3, 4, 5]);
    let mover = move_slots(&cluster, "0-8191", (0, group0), (1, group1));
    let leader = cluster.wait_for_leader_in(1, common::LEADER_WAIT).expect("a leader");
    // Killed once the move is under way: the source (node 1's keyspace) migrating.
    let n1 = cluster.client_addrs()[0].port();
    if common::tool("redis-cli").is_some() {
        let migrating = common::wait_until(std::time::Duration::from_secs(20), || {
            cli(n1, &["KEEL.SLOTS", "STATE"]).iter().any(|l| l == "migrating")
        });
        assert!(migrating, "the move never began");
    }
    cluster.kill(leader);
    eprintln!("killed n{}", leader + 1);
    let next = cluster.wait_for_leader_in(1, common::LEADER_WAIT).expect("a new leader");
    assert_ne!(next, leader);
    let out = moved(&cluster, mover);
    eprintln!("{out}");
    assert!(out.contains("moved 8192 slots"), "{out}");
    cluster.restart(leader).expect("restarts");
    // And half of them back, the workload still running.
    let out = moved(&cluster, move_slots(&cluster, "0-4095", (1, group1), (0, group0)));
    assert!(out.contains("moved 4096 slots"), "{out}");
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = child.wait().expect("the workload ends");
    let mut stderr = String::new();
    let _ = std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr);
    let _ = std::io::stdout().flush();
    eprintln!("{rest:?}");
    if !status.success() {
        common::dump_logs(&cluster);
        panic!("the workload failed: {rest:?}\n{stderr}");
    }
    assert!(rest.last().is_some_and(|l| l.starts_with("ok ")), "{rest:?}");
    // Every node's map shows the slots where they went.
    if common::tool("redis-cli").is_some() {
        for addr in cluster.client_addrs() {
            let slots = cli(addr.port(), &["CLUSTER", "SLOTS"]);
            let after = |start: &str| {
                let at = slots.iter().position(|l| l == start)?;
                slots.get(at + 1).cloned()
            };
            assert_eq!(after("0").as_deref(), Some("4095"), "{addr}: {slots:?}");
            assert_eq!(after("4096").as_deref(), Some("16383"), "{addr}: {slots:?}");
        }
    }
    // The old leader is back, a follower, and still keyspace 1's preferred leader: node 1,
    // which hosts keyspace 0 only, names the leader it heard of, not the preferred one.
    if common::tool("redis-cli").is_some() {
        let leader = cluster.wait_for_leader_in(1, common::LEADER_WAIT).expect("a leader");
        let port = cluster.client_addrs()[leader].port().to_string();
        let n1 = cluster.client_addrs()[0].port();
        let named = || {
            let slots = cli(n1, &["CLUSTER", "SLOTS"]);
            let at = slots.iter().position(|l| l == "4096");
            at.and_then(|i| slots.get(i + 3)).cloned()
        };
        let heard = common::wait_until(std::time::Duration::from_secs(10), || {
            named().as_deref() == Some(port.as_str())
        });
        assert!(heard, "n1 names {:?} for keyspace 1, led by n{}", named(), leader + 1);
    }
    common::finish(cluster);
}
