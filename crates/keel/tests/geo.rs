//! A geo keyspace on a cluster of real processes: sessions over RESP (transactions, read-your-writes, the past vector,
//! barrier and attach at another data center), the refusals that name the engine, a geo
//! keyspace beside an ORCA one, and `keel example bank` end to end (with the emulated
//! wide-area delays of `keel up --geo`) (concurrent deposits
//! converge; a session finds what it observed after its data center is killed), strong
//! withdrawals at every data center that never overdraw, and strong transactions that go
//! on once the certification leaders' node is killed. The protocol itself is
//! checked in the simulator (`keel sim run --engine geo`).

mod common;

use keel_server::config::KeyspaceSettings;
use std::process::Command;

const GEO: u32 = 1;

/// Three data centers of one node each, an ORCA keyspace 0 beside the geo keyspace 1
/// (without the wide-area delays, which ORCA's default timers are not set for).
fn geo_beside_orca(c: &mut keel_server::ServerConfig) {
    keel_server::local::geo_layout(c, 3, 1);
    c.geo.peer_delay_ms.clear();
    c.keyspaces = vec![KeyspaceSettings::orca(0), KeyspaceSettings::geo(GEO)];
}

/// Whether counter `c`, read in a transaction at `conn` again and again, reaches `want`
/// within the convergence wait.
fn counter_reaches(conn: &mut common::Conn, want: &str) -> bool {
    common::wait_until(common::CONVERGE_WAIT, || {
        assert_eq!(conn.call(&["KEEL.TX.BEGIN"]), "+OK");
        let seen = conn.call(&["KEEL.TX.READ", "counter", "c"]);
        let _ = conn.call(&["KEEL.TX.ABORT"]);
        seen == want
    })
}

fn open_geo(addr: std::net::SocketAddr) -> common::Conn {
    let mut conn = common::Conn::open(addr);
    assert_eq!(conn.call(&["SELECT", &GEO.to_string()]), "+OK");
    conn
}

/// The integers of an array reply whose header `call` returned.
fn integers(conn: &mut common::Conn, header: &str) -> Vec<String> {
    let n: usize = header.strip_prefix('*').and_then(|n| n.parse().ok()).expect(header);
    (0..n).map(|_| conn.line().trim_end().trim_start_matches(':').to_string()).collect()
}

#[test]
fn geo_sessions_barrier_attach_and_refusals_over_resp() {
    let (cluster, _) = common::cluster("geo-sessions", geo_beside_orca);
    assert!(cluster.wait_for_replicas(GEO, common::LEADER_WAIT), "the geo keyspace started");
    let addrs = cluster.client_addrs();
    let mut a = open_geo(addrs[0]);
    // Refusals that say what to use.
    let outside = a.call(&["GET", "k"]);
    assert!(outside.starts_with("-ERR GET outside a transaction"), "{outside}");
    assert!(outside.contains("KEEL.TX.BEGIN"), "{outside}");
    assert!(a.call(&["MULTI"]).contains("no meaning in a geo keyspace"));
    assert!(a.call(&["KEEL.TX.COMMIT"]).starts_with("-ERR KEEL.TX.COMMIT without KEEL.TX.BEGIN"));
    assert_eq!(a.call(&["KEEL.PAST"]), "*0", "a new session has no past");
    // A transaction: its own writes read back, then committed.
    assert_eq!(a.call(&["KEEL.TX.BEGIN", "CAUSAL"]), "+OK");
    assert!(a.call(&["KEEL.TX.BEGIN"]).contains("already open"));
    assert!(a.call(&["KEEL.BARRIER"]).contains("inside a transaction"));
    assert_eq!(a.call(&["SET", "greeting", "hello"]), "+OK");
    assert_eq!(a.call(&["INCRBY", "balance", "100"]), ":100");
    assert_eq!(a.call(&["DECRBY", "balance", "30"]), ":70");
    assert_eq!(a.call(&["SADD", "tags", "x", "y"]), ":2");
    assert_eq!(a.call(&["SADD", "tags", "x"]), ":0");
    assert_eq!(a.call(&["KEEL.TX.MAX", "high", "9"]), ":9");
    assert_eq!(a.call(&["GET", "greeting"]), "$5");
    assert_eq!(a.line(), "hello\r\n");
    let commit = a.call(&["KEEL.TX.COMMIT"]);
    let vector = integers(&mut a, &commit);
    assert_eq!(vector.len(), 4, "three data centers and the strong entry: {vector:?}");
    assert_eq!(vector[3], "0", "no strong transaction");
    let past = a.call(&["KEEL.PAST"]);
    assert_eq!(integers(&mut a, &past), vector, "the connection keeps the past");
    // The barrier, then the session moves to another data center with its past.
    assert_eq!(a.call(&["KEEL.BARRIER"]), "+OK");
    let mut b = open_geo(addrs[2]);
    let mut attach = vec!["KEEL.ATTACH"];
    attach.extend(vector.iter().map(String::as_str));
    assert_eq!(b.call(&attach), "+OK");
    assert_eq!(b.call(&["KEEL.TX.BEGIN"]), "+OK");
    assert_eq!(b.call(&["KEEL.TX.READ", "counter", "balance"]), ":70");
    assert_eq!(b.call(&["SISMEMBER", "tags", "y"]), ":1");
    assert_eq!(b.call(&["SREM", "tags", "y"]), ":1");
    assert_eq!(b.call(&["SCARD", "tags"]), ":1");
    assert_eq!(b.call(&["KEEL.TX.READ", "max", "high"]), ":9");
    let commit = b.call(&["KEEL.TX.COMMIT"]);
    assert_eq!(integers(&mut b, &commit).len(), 4);
    assert!(b.call(&["KEEL.ATTACH", "1", "x"]).starts_with("-ERR KEEL.ATTACH takes a past vector"));
    // A connection that closes with its transaction open drops it at once.
    let mut c = open_geo(addrs[1]);
    assert_eq!(c.call(&["KEEL.TX.BEGIN"]), "+OK");
    let open_txs = || keel_server::local::status_in(addrs[1], GEO).and_then(|s| s["open"].as_u64());
    assert_eq!(open_txs(), Some(1));
    drop(c);
    assert!(common::wait_until(std::time::Duration::from_secs(5), || open_txs() == Some(0)));
    // The ORCA keyspace beside it is untouched, and refuses the geo session commands.
    let mut orca = common::Conn::open(addrs[0]);
    let refused = orca.call(&["KEEL.TX.BEGIN"]);
    assert!(refused.contains("needs a geo keyspace (keyspace 0 runs orca)"), "{refused}");
    assert_eq!(orca.call(&["SET", "k", "v"]), "+OK");
    common::finish(cluster);
}

#[test]
fn a_restarted_geo_replica_stays_failed_and_the_others_go_on() {
    let (mut cluster, _) = common::cluster("geo-restart", geo_beside_orca);
    assert!(cluster.wait_for_replicas(GEO, common::LEADER_WAIT), "the geo keyspace started");
    let addrs = cluster.client_addrs();
    let mut a = open_geo(addrs[0]);
    assert_eq!(a.call(&["KEEL.TX.BEGIN"]), "+OK");
    assert_eq!(a.call(&["INCRBY", "c", "5"]), ":5");
    assert!(a.call(&["KEEL.TX.COMMIT"]).starts_with('*'));
    cluster.kill(2);
    cluster.restart(2).expect("the node restarts");
    let role = || {
        keel_server::local::status_in(addrs[2], GEO)
            .and_then(|s| s["role"].as_str().map(String::from))
    };
    assert!(common::wait_until(common::LEADER_WAIT, || role().as_deref() == Some("lost")));
    let refused = open_geo(addrs[2]).call(&["KEEL.TX.BEGIN"]);
    assert!(refused.contains("restarted and lost what it stored"), "{refused}");
    // The other data centers serve, and one sees the first's commit.
    let mut b = open_geo(addrs[1]);
    assert!(counter_reaches(&mut b, ":5"), "counter c never read :5");
    common::finish(cluster);
}

#[test]
fn bank_deposits_converge_and_a_migrated_session_finds_what_it_saw() {
    let out = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["example", "bank", "--deposits", "30", "--json"])
        .output()
        .expect("keel example bank runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "keel example bank failed:\n{stdout}\n{stderr}");
    let report: serde_json::Value =
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(report["deposits"], 180, "30 at each of 6 nodes: {report}");
    let converged = report["convergence"].as_array().expect("per node");
    assert_eq!(converged.len(), 6);
    assert!(converged.iter().all(|c| c["converged_ms"].is_u64()), "{report}");
    assert_eq!(report["migration"]["accounts_differing"], serde_json::json!([]), "{report}");
}

/// The geo keyspace beside ORCA, with strong transactions on and withdrawals conflicting.
fn geo_strong(c: &mut keel_server::ServerConfig) {
    geo_beside_orca(c);
    c.geo.strong = true;
    c.geo.conflicts = vec![["withdraw".into(), "withdraw".into()]];
}

/// `words` as one RESP command.
fn command(words: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", words.len()).into_bytes();
    for w in words {
        out.extend_from_slice(format!("${}\r\n{w}\r\n", w.len()).as_bytes());
    }
    out
}

/// The balance `conn` reads in a causal transaction.
fn balance(conn: &mut common::Conn) -> String {
    assert_eq!(conn.call(&["KEEL.TX.BEGIN"]), "+OK");
    let seen = conn.call(&["KEEL.TX.READ", "counter", "alice"]);
    assert_eq!(conn.call(&["KEEL.TX.ABORT"]), "+OK");
    seen
}

#[test]
fn concurrent_strong_withdrawals_of_the_whole_balance_commit_once() {
    let (cluster, _) = common::cluster("geo-strong", geo_strong);
    assert!(cluster.wait_for_replicas(GEO, common::LEADER_WAIT), "the geo keyspace started");
    let addrs = cluster.client_addrs();
    let mut conns: Vec<common::Conn> = addrs.iter().map(|a| open_geo(*a)).collect();
    // A causal deposit, made uniform, then seen at every data center.
    assert_eq!(conns[0].call(&["KEEL.TX.BEGIN"]), "+OK");
    assert_eq!(conns[0].call(&["INCRBY", "alice", "100"]), ":100");
    assert!(conns[0].call(&["KEEL.TX.COMMIT"]).starts_with('*'));
    for _ in 0..4 {
        conns[0].line();
    }
    assert_eq!(conns[0].call(&["KEEL.BARRIER"]), "+OK");
    for conn in &mut conns {
        assert!(common::wait_until(common::CONVERGE_WAIT, || balance(conn) == ":100"));
    }
    // Each data center withdraws the whole balance, concurrently: exactly one commits.
    for conn in &mut conns {
        assert_eq!(conn.call(&["KEEL.TX.BEGIN", "STRONG", "LABEL", "withdraw"]), "+OK");
        assert_eq!(conn.call(&["KEEL.TX.READ", "counter", "alice"]), ":100");
        assert_eq!(conn.call(&["DECRBY", "alice", "100"]), ":0");
    }
    for conn in &mut conns {
        conn.send(&command(&["KEEL.TX.COMMIT"]));
    }
    let mut committed = 0;
    for conn in &mut conns {
        let reply = conn.line();
        if reply.starts_with('*') {
            committed += 1;
            let strong: Vec<String> = (0..4).map(|_| conn.line()).collect();
            assert_ne!(strong[3], ":0\r\n", "a strong timestamp: {strong:?}");
        } else {
            assert!(reply.starts_with("-CONFLICT"), "{reply}");
        }
    }
    assert_eq!(committed, 1, "exactly one withdrawal of the whole balance");
    // Every data center comes to show the one withdrawal, and a retry now sees it.
    for conn in &mut conns {
        assert!(common::wait_until(common::CONVERGE_WAIT, || balance(conn) == ":0"));
    }
    let retry = &mut conns[2];
    assert_eq!(retry.call(&["KEEL.TX.BEGIN", "STRONG", "LABEL", "withdraw"]), "+OK");
    assert_eq!(retry.call(&["KEEL.TX.READ", "counter", "alice"]), ":0");
    assert!(retry.call(&["KEEL.TX.COMMIT"]).starts_with('*'), "a read-only strong transaction");
    common::finish(cluster);
}

/// A strong transaction at `conn` that withdraws 10, run again after each conflict until
/// it commits or `common::CONVERGE_WAIT` passes; whether it committed.
fn withdraw_until_committed(conn: &mut common::Conn) -> bool {
    common::wait_until(common::CONVERGE_WAIT, || {
        assert_eq!(conn.call(&["KEEL.TX.BEGIN", "STRONG", "LABEL", "withdraw"]), "+OK");
        let _ = conn.call(&["KEEL.TX.READ", "counter", "alice"]);
        let _ = conn.call(&["DECRBY", "alice", "10"]);
        let reply = conn.call(&["KEEL.TX.COMMIT"]);
        if reply.starts_with('*') {
            for _ in 0..4 {
                conn.line();
            }
            return true;
        }
        assert!(reply.starts_with("-CONFLICT") || reply.starts_with("-TIMEOUT"), "{reply}");
        false
    })
}

#[test]
fn strong_transactions_go_on_after_the_leaders_node_is_killed() {
    let (mut cluster, _) = common::cluster("geo-failover", geo_strong);
    assert!(cluster.wait_for_replicas(GEO, common::LEADER_WAIT), "the geo keyspace started");
    let addrs = cluster.client_addrs();
    let mut b = open_geo(addrs[1]);
    let mut c = open_geo(addrs[2]);
    assert!(withdraw_until_committed(&mut b), "a strong withdrawal before the failure");
    // Node 1 is data center dc1, the first label: the leader of ballot 0.
    cluster.kill(0);
    assert!(withdraw_until_committed(&mut b), "a strong withdrawal at dc2 after the failover");
    assert!(withdraw_until_committed(&mut c), "a strong withdrawal at dc3 after the failover");
    let takeovers = keel_server::local::status_in(addrs[1], GEO)
        .and_then(|s| s["counters"]["takeovers"].as_u64())
        .unwrap_or(0);
    assert_eq!(takeovers, 1, "dc2 (ballot 1) leads certification");
    for conn in [&mut b, &mut c] {
        assert!(common::wait_until(common::CONVERGE_WAIT, || balance(conn) == ":-30"));
    }
    common::finish(cluster);
}

/// Sends `signal` (`STOP`, `CONT`) to the process `pid`.
fn signal(signal: &str, pid: u32) {
    let status = Command::new("kill").args([&format!("-{signal}"), &pid.to_string()]).status();
    assert!(status.is_ok_and(|s| s.success()), "kill -{signal} {pid}");
}

/// `keel node remove id` at `at` in the geo keyspace, asked once: its output.
fn remove(at: std::net::SocketAddr, id: u32) -> std::process::Output {
    node_change(at, "remove", id, 0)
}

/// `keel node <change> id` at `at` in the geo keyspace, asked for `wait` seconds.
fn node_change(at: std::net::SocketAddr, change: &str, id: u32, wait: u32) -> std::process::Output {
    let (geo, id, wait) = (GEO.to_string(), id.to_string(), wait.to_string());
    Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["node", change, &id, "--keyspace", &geo, "--wait", &wait, "--node"])
        .arg(at.to_string())
        .output()
        .expect("the CLI runs")
}

#[test]
fn an_operator_removes_a_silent_data_center_and_its_member_stops_once_it_hears() {
    let (cluster, _) = common::cluster("geo-remove", geo_beside_orca);
    assert!(cluster.wait_for_replicas(GEO, common::LEADER_WAIT), "the geo keyspace started");
    let addrs = cluster.client_addrs();
    let status = |i: usize| keel_server::local::status_in(addrs[i], GEO).unwrap_or_default();
    // Data center 2 (node 3) goes silent while data center 0 commits: node 1's messages to
    // it wait unacknowledged, and node 2 keeps node 1's transactions until node 3 reports
    // storing them.
    let paused = cluster.pid(2).expect("node 3 runs");
    signal("STOP", paused);
    let paused_at = std::time::Instant::now();
    let mut a = open_geo(addrs[0]);
    for _ in 0..20 {
        assert_eq!(a.call(&["KEEL.TX.BEGIN"]), "+OK");
        assert!(a.call(&["INCRBY", "c", "1"]).starts_with(':'));
        let commit = a.call(&["KEEL.TX.COMMIT"]);
        integers(&mut a, &commit);
    }
    let holding = common::wait_until(common::CONVERGE_WAIT, || {
        let (one, two) = (status(0), status(1));
        one["suspected"] == serde_json::json!([2]) && two["forwardable"].as_u64() > Some(0)
    });
    assert!(holding, "no backlog for the silent data center: {} {}", status(0), status(1));
    // Refused: this node's own data center, and a second one while the first is suspected.
    let out = remove(addrs[0], 1);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("own data center"), "{stderr}");
    let out = remove(addrs[0], 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("removed or suspected"), "{stderr}");
    let out = remove(addrs[0], 3);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "OK");
    // Both survivors know, and keep nothing for it but the one notice each: what else is
    // unacknowledged is a vector or two in flight between them, not the 20 transactions
    // queued for node 3.
    let released = common::wait_until(common::CONVERGE_WAIT, || {
        (0..2).all(|i| {
            let s = status(i);
            s["removed"] == serde_json::json!([2])
                && s["forwardable"] == 0
                && s["unacked"].as_u64() < Some(8)
        })
    });
    assert!(released, "held for a removed data center: {} {}", status(0), status(1));
    let page = common::scrape(cluster.configs[0].http_addr.expect("an HTTP endpoint"));
    assert_eq!(common::sample(&page, "keel_geo_removed_dcs{keyspace=\"1\"}"), Some(1.0), "{page}");
    // Node 3 resumes: told it was removed, it refuses its clients.
    signal("CONT", paused);
    let told = common::wait_until(common::CONVERGE_WAIT, || status(2)["role"] == "removed");
    assert!(told, "node 3 was not told: {}", status(2));
    let refused = open_geo(addrs[2]).call(&["KEEL.TX.BEGIN"]);
    assert!(refused.contains("was removed from the keyspace"), "{refused}");
    let mut status_cli = Command::new(env!("CARGO_BIN_EXE_keel"));
    status_cli.arg("status");
    for addr in &addrs {
        status_cli.args(["--node", &addr.to_string()]);
    }
    let shown = status_cli.output().expect("the CLI runs");
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains("leaderless (geo)  removed: data center 3"), "{shown}");
    let row = |i: usize| {
        let addr = addrs[i].to_string();
        shown.lines().find(|l| l.starts_with(&addr) && l.contains("ms ")).map(str::to_owned)
    };
    assert!(row(2).is_some_and(|r| r.contains(" removed ")), "{shown}");
    // A survivor's uniform lag leaves the removed data center's frozen entry out: it is
    // the lag behind the other survivor, not the time since node 3 was paused.
    let lag_ms = |r: &str| -> u64 {
        let cell = r.split_whitespace().find(|w| w.ends_with("ms")).expect("a lag cell");
        cell.trim_end_matches("ms").parse().expect("milliseconds")
    };
    let paused_ms = paused_at.elapsed().as_millis() as u64;
    assert!(paused_ms > 2_000, "node 3 was paused for {paused_ms} ms only");
    for i in 0..2 {
        let lag = lag_ms(&row(i).expect("a survivor's row"));
        assert!(lag < paused_ms / 2, "uniform lag {lag} ms of {paused_ms} paused: {shown}");
    }
    // The survivors go on, barriers included.
    assert_eq!(a.call(&["KEEL.TX.BEGIN"]), "+OK");
    assert_eq!(a.call(&["INCRBY", "c", "1"]), ":21");
    let commit = a.call(&["KEEL.TX.COMMIT"]);
    integers(&mut a, &commit);
    assert_eq!(a.call(&["KEEL.BARRIER"]), "+OK");
    let mut b = open_geo(addrs[1]);
    assert!(counter_reaches(&mut b, ":21"), "counter c never read :21");
    // Node 3 restarted with its geo directory wiped boots as a new, empty replica: the
    // survivors' notice, resent for ever, stops it before it serves.
    let mut cluster = cluster;
    cluster.kill(2);
    let geo_dir = cluster.configs[2].data_dir.join(format!("keyspace-{GEO}"));
    std::fs::remove_dir_all(&geo_dir).expect("the geo keyspace's directory");
    cluster.restart(2).expect("node 3 starts again");
    let told = common::wait_until(common::CONVERGE_WAIT, || status(2)["role"] == "removed");
    assert!(told, "node 3, wiped, was not told: {}", status(2));
    let refused = open_geo(addrs[2]).call(&["KEEL.TX.BEGIN"]);
    assert!(refused.contains("was removed from the keyspace"), "{refused}");
    common::finish(cluster);
}

#[test]
fn two_removals_asked_at_once_at_two_nodes_remove_at_most_one_data_center() {
    // Three data centers of one node each, f = 1, nothing failed: removing data center 1
    // at node 1 and data center 2 at node 2, at once, each passes its own node's count.
    // The acceptors' promises let at most one through. Whether the two requests meet
    // depends on timing, so the test runs ten rounds, each on a new cluster.
    for round in 0..10 {
        two_removals_at_once(round);
    }
}

fn two_removals_at_once(round: u32) {
    let (cluster, _) = common::cluster(&format!("geo-remove-two-{round}"), geo_beside_orca);
    assert!(cluster.wait_for_replicas(GEO, common::LEADER_WAIT), "the geo keyspace started");
    let addrs = cluster.client_addrs();
    // Both requests wait in the sockets of two paused nodes, which resume together: each
    // takes its request before it could hear of the other's removal.
    let (mut a, mut b) = (open_geo(addrs[0]), open_geo(addrs[1]));
    let pids = [cluster.pid(0).expect("node 1 runs"), cluster.pid(1).expect("node 2 runs")];
    pids.iter().for_each(|&pid| signal("STOP", pid));
    let encode = |id: &str| format!("*3\r\n$9\r\nKEEL.NODE\r\n$6\r\nREMOVE\r\n$1\r\n{id}\r\n");
    let (to_a, to_b) = (encode("2"), encode("3"));
    a.send(to_a.as_bytes());
    b.send(to_b.as_bytes());
    let resumed =
        Command::new("kill").args(["-CONT", &pids[0].to_string(), &pids[1].to_string()]).status();
    assert!(resumed.is_ok_and(|s| s.success()), "kill -CONT {pids:?}");
    let answers = [a.line(), b.line()];
    let made = answers.iter().filter(|l| l.starts_with("+OK")).count();
    assert!(made <= 1, "round {round}: both removals made where f = 1: {answers:?}");
    for why in answers.iter().filter(|l| !l.starts_with("+OK")) {
        // Refused by the acceptors, or its asker's own data center went first.
        let named = ["holds a promise for the removal", "removed or suspected", "was removed from"]
            .iter()
            .any(|w| why.contains(w));
        assert!(named, "refused without saying why: {why}");
    }
    // Every node agrees on what was removed, and no promise stays held.
    let status = |i: usize| keel_server::local::status_in(addrs[i], GEO).unwrap_or_default();
    let settled = common::wait_until(common::CONVERGE_WAIT, || {
        let removed: Vec<_> = (0..3).map(|i| status(i)["removed"].clone()).collect();
        let sizes: Vec<usize> = removed.iter().filter_map(|r| r.as_array().map(Vec::len)).collect();
        let held = (0..3).any(|i| !status(i)["removal_promised"].is_null());
        !held && sizes.len() == 3 && sizes.iter().all(|&n| n == made)
    });
    assert!(settled, "{} {} {}", status(0), status(1), status(2));
    // With one removed, a second is refused wherever it is asked.
    let gone: Vec<u64> = (0..3)
        .filter_map(|i| status(i)["removed"].as_array().cloned())
        .flatten()
        .filter_map(|d| d.as_u64())
        .collect();
    let live: Vec<usize> = (0..3).filter(|&d| !gone.contains(&(d as u64))).collect();
    if made == 1 {
        let out = remove(addrs[live[0]], live[1] as u32 + 1);
        let why = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && why.contains("removed or suspected"), "{why}");
    }
    common::finish(cluster);
}

#[test]
fn an_operator_takes_a_removed_data_center_back_on_a_new_machine_and_it_serves() {
    let (mut cluster, _) = common::cluster("geo-return", geo_beside_orca);
    assert!(cluster.wait_for_replicas(GEO, common::LEADER_WAIT), "the geo keyspace started");
    let addrs = cluster.client_addrs();
    let status = |i: usize| keel_server::local::status_in(addrs[i], GEO).unwrap_or_default();
    let mut a = open_geo(addrs[0]);
    let add = |conn: &mut common::Conn, n: &str| {
        assert_eq!(conn.call(&["KEEL.TX.BEGIN"]), "+OK");
        assert!(conn.call(&["INCRBY", "c", n]).starts_with(':'));
        let commit = conn.call(&["KEEL.TX.COMMIT"]);
        integers(conn, &commit);
    };
    for _ in 0..10 {
        add(&mut a, "1");
    }
    assert_eq!(a.call(&["KEEL.BARRIER"]), "+OK");
    // Data center 2's machine dies; the operator removes it, then brings a new machine up
    // under the same identity, wiped and joining: it serves nothing until taken back.
    cluster.kill(2);
    let out = remove(addrs[0], 3);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let removed = common::wait_until(common::CONVERGE_WAIT, || {
        (0..2).all(|i| status(i)["removed"] == serde_json::json!([2]))
    });
    assert!(removed, "the removal is not known: {} {}", status(0), status(1));
    add(&mut a, "5");
    let geo_dir = cluster.configs[2].data_dir.join(format!("keyspace-{GEO}"));
    std::fs::remove_dir_all(&geo_dir).expect("the geo keyspace's directory");
    cluster.configs[2].geo.joining = true;
    cluster.rewrite_config(2).expect("node 3's configuration");
    cluster.restart(2).expect("node 3 starts again");
    let joining = common::wait_until(common::CONVERGE_WAIT, || status(2)["role"] == "joining");
    assert!(joining, "node 3 does not join: {}", status(2));
    let refused = open_geo(addrs[2]).call(&["KEEL.TX.BEGIN"]);
    assert!(refused.contains("joining"), "{refused}");
    // Asked at a survivor: made, then node 3 copies what survived and serves.
    let out = node_change(addrs[1], "return", 3, 30);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let back = common::wait_until(common::CONVERGE_WAIT, || {
        status(2)["role"] == "replica"
            && (0..3).all(|i| status(i)["epochs"] == serde_json::json!([0, 0, 2]))
            && (0..2).all(|i| status(i)["removed"] == serde_json::json!([]))
    });
    assert!(back, "not back: {} {} {}", status(0), status(1), status(2));
    assert_eq!(status(2)["counters"]["copies_installed"], 1, "{}", status(2));
    // The new life serves what survived from its first view on: it holds new sessions
    // (`-UNAVAILABLE ... catching up`) until its view covers it. What it commits reaches
    // the others.
    let mut c = open_geo(addrs[2]);
    let began = common::wait_until(common::CONVERGE_WAIT, || {
        let reply = c.call(&["KEEL.TX.BEGIN"]);
        assert!(reply == "+OK" || reply.contains("catching up"), "{reply}");
        reply == "+OK"
    });
    assert!(began, "the new life never served");
    assert_eq!(
        c.call(&["KEEL.TX.READ", "counter", "c"]),
        ":15",
        "its first view lacks what survived"
    );
    let _ = c.call(&["KEEL.TX.ABORT"]);
    add(&mut c, "100");
    assert_eq!(c.call(&["KEEL.BARRIER"]), "+OK");
    let mut b = open_geo(addrs[1]);
    assert!(counter_reaches(&mut b, ":115"), "counter c never read :115");
    common::finish(cluster);
}
