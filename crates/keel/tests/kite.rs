//! A Kite keyspace on a cluster of real processes: the commands of release consistency
//! over RESP, the refusals that name the engine, and a node killed and restarted (a new
//! incarnation that rejoins before it serves). The protocol itself is checked in the
//! simulator (`keel sim run --engine kite`).

mod common;

use keel_server::config::KeyspaceSettings;
use keel_server::local::{status_in, LocalCluster};

const KITE: u32 = 1;

fn kite_keyspaces(c: &mut keel_server::ServerConfig) {
    c.keyspaces = vec![KeyspaceSettings::orca(0), KeyspaceSettings::kite(KITE)];
}

/// A connection in the Kite keyspace.
fn open(addr: std::net::SocketAddr) -> common::Conn {
    let mut conn = common::Conn::open(addr);
    assert_eq!(conn.call(&["SELECT", &KITE.to_string()]), "+OK");
    conn
}

#[test]
fn kite_commands_barriers_and_refusals_over_resp() {
    let (cluster, _) = common::cluster("kite-commands", kite_keyspaces);
    assert!(cluster.wait_for_replicas(KITE, common::LEADER_WAIT), "every node rejoined");
    let addrs = cluster.client_addrs();
    let (mut a, mut b) = (open(addrs[0]), open(addrs[1]));
    // Message passing: a relaxed write, then a release; an acquire elsewhere sees both.
    assert_eq!(a.call(&["SET", "data", "42"]), "+OK");
    assert_eq!(a.call(&["SET", "flag", "1", "RELEASE"]), "+OK");
    assert_eq!(b.call(&["GET", "flag", "ACQUIRE"]), "$1");
    assert_eq!(b.line(), "1\r\n");
    assert_eq!(b.call(&["GET", "data"]), "$2");
    assert_eq!(b.line(), "42\r\n");
    // Read-modify-writes: FAA answers the value before, INCR the value after.
    assert_eq!(a.call(&["KEEL.FAA", "c", "5"]), ":0");
    assert_eq!(b.call(&["INCR", "c"]), ":6");
    assert_eq!(b.call(&["KEEL.FAA", "c", "-1"]), ":6");
    assert_eq!(a.call(&["KEEL.CAS", "c", "5", "9", "STRONG"]), "*3");
    assert_eq!(a.line(), ":1\r\n", "swapped");
    assert_eq!(a.line(), "$1\r\n");
    assert_eq!(a.line(), "5\r\n");
    assert_eq!(a.line(), "$-1\r\n", "no log version in a kite keyspace");
    assert_eq!(b.call(&["KEEL.CAS", "c", "5", "7", "WEAK"]), "*3");
    assert_eq!(b.line(), ":0\r\n", "not swapped: c is 9");
    assert_eq!(b.line(), "$1\r\n");
    assert_eq!(b.line(), "9\r\n");
    assert_eq!(b.line(), "$-1\r\n");
    assert_eq!(b.call(&["EXISTS", "c", "data", "nope"]), ":2");
    // A named CAS that failed is committed as failed: sent again after c came to hold
    // what it expects, it is answered as the first time and swaps nothing.
    let cas_failed = |conn: &mut common::Conn| {
        assert_eq!(
            conn.call(&["KEEL.REQ", "4243", "1", "KEEL.CAS", "c", "5", "7", "STRONG"]),
            "*3"
        );
        assert_eq!(conn.line(), ":0\r\n", "not swapped: c is 9");
        assert_eq!(conn.line(), "$1\r\n");
        assert_eq!(conn.line(), "9\r\n");
        assert_eq!(conn.line(), "$-1\r\n");
    };
    cas_failed(&mut a);
    assert_eq!(b.call(&["KEEL.CAS", "c", "9", "5", "STRONG"]), "*3");
    assert_eq!(b.line(), ":1\r\n");
    for _ in 0..3 {
        b.line();
    }
    cas_failed(&mut b);
    assert_eq!(b.call(&["GET", "c", "ACQUIRE"]), "$1");
    assert_eq!(b.line(), "5\r\n", "the retry swapped nothing");
    // A request its client named (KEEL.REQ), sent again at another node, is done once and
    // answered as the first time; a late retry after a later request was done is refused.
    assert_eq!(a.call(&["KEEL.REQ", "4242", "1", "KEEL.FAA", "once", "5"]), ":0");
    assert_eq!(b.call(&["KEEL.REQ", "4242", "1", "KEEL.FAA", "once", "5"]), ":0");
    assert_eq!(b.call(&["KEEL.FAA", "once", "0"]), ":5", "added once");
    let reused = b.call(&["KEEL.REQ", "4242", "1", "KEEL.FAA", "once", "6"]);
    assert!(reused.contains("already used for another command"), "{reused}");
    assert_eq!(a.call(&["KEEL.REQ", "4242", "2", "KEEL.FAA", "twice", "1"]), ":0");
    // (A node that has not yet heard of request 2's commit may still show request 1's
    // outcome, and the retry is then answered with it; either way it is not done again.)
    let late = b.call(&["KEEL.REQ", "4242", "1", "KEEL.FAA", "once", "5"]);
    assert!(late.starts_with("-SESSIONEXPIRED") || late == ":0", "{late}");
    assert_eq!(b.call(&["KEEL.FAA", "once", "0"]), ":5");
    // What has no meaning here is refused, naming the engine.
    for words in [
        &["DEL", "c"][..],
        &["GET", "c", "LEVEL", "linearizable"],
        &["SET", "c", "1", "DURABILITY", "durable"],
        &["GET", "c", "WITHVERSION"],
        &["KEEL.SCAN", "a", "+inf"],
        &["KEEL.ENQUEUE", "q", "v"],
        &["MULTI"],
        &["KEEL.SESSION"],
    ] {
        let reply = a.call(words);
        assert!(reply.starts_with("-ERR") && reply.contains("runs kite"), "{words:?}: {reply}");
    }
    // And in an ORCA keyspace, the barriers are refused the other way round.
    let mut orca = common::Conn::open(addrs[0]);
    let reply = orca.call(&["GET", "x", "ACQUIRE"]);
    assert!(reply.contains("needs a kite keyspace") && reply.contains("runs orca"), "{reply}");
    assert_eq!(orca.call(&["KEEL.FAA", "n", "2"]), ":0", "FAA works on ORCA too");
    assert_eq!(orca.call(&["KEEL.FAA", "n", "2"]), ":2");
    let status = status_in(addrs[2], KITE).expect("KEEL.STATUS in the kite keyspace");
    assert_eq!(status["engine"], "kite");
    assert_eq!(status["role"], "replica");
    // Relaxed reads of in-epoch keys are answered off the engine loop (when the loop is not
    // in the middle of a step).
    let http = cluster.configs[1].http_addr.expect("local clusters serve HTTP");
    let name = format!("keel_reads_off_loop_total{{keyspace=\"{KITE}\"}}");
    let before = common::sample(&common::scrape(http), &name).expect("the metric is exported");
    for _ in 0..50 {
        assert_eq!(b.call(&["GET", "data"]), "$2");
        assert_eq!(b.line(), "42\r\n");
    }
    let after = common::sample(&common::scrape(http), &name).expect("the metric is exported");
    assert!(after - before >= 25.0, "{} of 50 relaxed reads answered off the loop", after - before);
    common::finish(cluster);
}

#[test]
fn a_killed_node_restarts_as_a_new_incarnation_that_rejoins_before_it_serves() {
    let (mut cluster, _) = common::cluster("kite-restart", kite_keyspaces);
    assert!(cluster.wait_for_replicas(KITE, common::LEADER_WAIT), "every node rejoined");
    let addrs = cluster.client_addrs();
    let before = status_in(addrs[2], KITE).expect("status")["incarnation"].as_u64().unwrap();
    // keel-client sessions on node 3: one that wrote nothing since its last barrier, one
    // that did.
    let mut config = keel_client::ClientConfig::new(addrs.clone());
    config.keyspace = KITE;
    let session = |config: &keel_client::ClientConfig| {
        keel_client::BlockingKiteSession::new(config.clone(), 2).expect("a session")
    };
    let (mut clean, mut dirty) = (session(&config), session(&config));
    let mut locker = session(&config);
    assert_eq!(clean.faa(b"moved", 1).unwrap(), 0);
    dirty.write(b"w", b"1").unwrap();
    cluster.kill(2);
    // The clean one's FAA is sent again at the next node under its number; the other's
    // fails (its write may be lost with node 3), and the session goes on at node 1.
    assert_eq!(clean.faa(b"moved", 1).unwrap(), 1);
    assert_eq!(clean.node(), 0);
    let failed = dirty.faa(b"moved", 10);
    assert!(matches!(failed, Err(keel_client::ClientError::Connection(_))), "{failed:?}");
    assert_eq!(dirty.node(), 0);
    assert_eq!(dirty.faa(b"moved", 100).unwrap(), 2);
    // A weak CAS is sent again at the next node as a strong one.
    let taken = locker.cas(b"lock", None, b"mine", false).unwrap();
    assert!(taken.swapped, "{taken:?}");
    assert_eq!(locker.node(), 0);
    // With a node down, a release times out, takes the slow path and completes.
    let mut a = open(addrs[0]);
    for i in 0..20 {
        assert_eq!(a.call(&["SET", &format!("k{i}"), &i.to_string()]), "+OK");
        assert_eq!(a.call(&["KEEL.FAA", "total", "1"]), format!(":{i}"));
    }
    assert_eq!(a.call(&["SET", "flag", "done", "RELEASE"]), "+OK");
    let slow = status_in(addrs[0], KITE).unwrap()["counters"]["releases_slow"].as_u64().unwrap();
    assert!(slow >= 1, "the release named the dead node");
    cluster.restart(2).expect("restart");
    assert!(cluster.wait_for_replicas(KITE, common::CONVERGE_WAIT), "the new incarnation rejoined");
    let status = status_in(addrs[2], KITE).expect("status");
    assert_eq!(status["incarnation"].as_u64().unwrap(), before + 1, "one past the last on disk");
    assert!(status["counters"]["rejoin_pages"].as_u64().unwrap() >= 1);
    // The restarted node sees what was released while it was down.
    let mut c = open(addrs[2]);
    assert_eq!(c.call(&["GET", "flag", "ACQUIRE"]), "$4");
    assert_eq!(c.line(), "done\r\n");
    for i in 0..20 {
        assert_eq!(c.call(&["GET", &format!("k{i}")]), format!("${}", i.to_string().len()));
        assert_eq!(c.line(), format!("{i}\r\n"));
    }
    assert_eq!(c.call(&["KEEL.FAA", "total", "1"]), ":20", "no increment lost or repeated");
    common::finish(cluster);
}

/// The membership node index `i` reports for the Kite keyspace.
fn kite_membership(cluster: &LocalCluster, i: usize) -> Option<serde_json::Value> {
    Some(status_in(cluster.configs[i].client_addr, KITE)?["membership"].clone())
}

/// Kite operations that must finish between two steps of the test (progress, not time,
/// paces it).
const KITE_OPS_BETWEEN_CHANGES: u64 = 400;

/// Waits until the workload has finished `ops` more operations, failing the test if it
/// stalls for a minute.
fn kite_pace(progress: &keel_client::workload::Progress, ops: u64, what: &str) {
    let from = progress.ops.load(std::sync::atomic::Ordering::Relaxed);
    let moved = common::wait_until(std::time::Duration::from_secs(60), || {
        progress.ops.load(std::sync::atomic::Ordering::Relaxed) >= from + ops
    });
    assert!(moved, "the workload stalled before {what}");
    eprintln!("{what}");
}

#[test]
fn a_kite_keyspace_grows_from_three_voters_to_five_and_shrinks_to_three_others_under_a_checked_workload(
) {
    let exe = std::path::PathBuf::from(env!("CARGO_BIN_EXE_keel"));
    let dir = common::test_dir("kite-membership");
    let cluster = LocalCluster::start(&exe, 5, &dir, None, |c| {
        kite_keyspaces(c);
        c.voters = Some(vec![1, 2, 3]);
    })
    .expect("the cluster starts");
    assert!(cluster.wait_for_replicas(KITE, common::LEADER_WAIT), "every node rejoined");
    let addrs = cluster.client_addrs();
    let voters = |m: &serde_json::Value| m["voters"].clone();
    let settled_on =
        |m: &serde_json::Value, want: serde_json::Value| m["next"].is_null() && m["voters"] == want;
    let m = kite_membership(&cluster, 4).expect("node 5 answers");
    assert_eq!(voters(&m), serde_json::json!([1, 2, 3]), "4 and 5 start outside: {m}");
    let mut outside = open(addrs[3]);
    let refused = outside.call(&["GET", "x"]);
    assert!(refused.starts_with("-UNAVAILABLE node 4 is not a voter"), "{refused}");

    // The checked workload: sessions on every node (those on a node that does not vote
    // move to the next one).
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let mut config = keel_client::ClientConfig::new(addrs.clone());
    config.keyspace = KITE;
    let client = keel_client::Client::new(config);
    let progress = std::sync::Arc::new(keel_client::workload::Progress::default());
    let kite = keel_client::kite_workload::KiteConfig {
        sessions_per_node: 2,
        duration: std::time::Duration::from_secs(600),
        seed: 45,
    };
    let work =
        runtime.spawn(keel_client::kite_workload::run(client.clone(), kite, progress.clone()));

    // 3 → 5 voters, then 5 → 3 others: each with the CLI at node 3, which votes throughout
    // (it asks again while the change is under way).
    let steps = [("add", 4), ("add", 5), ("remove", 1), ("remove", 2)];
    for (i, (change, id)) in steps.iter().enumerate() {
        kite_pace(&progress, KITE_OPS_BETWEEN_CHANGES, &format!("keel node {change} {id}"));
        let out = std::process::Command::new(&exe)
            .args(["node", change, &id.to_string(), "--keyspace", &KITE.to_string(), "--node"])
            .arg(addrs[2].to_string())
            .output()
            .expect("the CLI runs");
        eprintln!("keel node {change} {id}: {out:?}");
        assert!(out.status.success(), "keel node {change} {id} failed");
        let epoch = 2 * (i as u64 + 1);
        let stepped = common::wait_until(common::CONVERGE_WAIT, || {
            kite_membership(&cluster, 2).is_some_and(|m| m["epoch"] == epoch)
        });
        assert!(stepped, "two steps per change: {:?}", kite_membership(&cluster, 2));
    }
    let want = serde_json::json!([3, 4, 5]);
    // The voters learn it; a removed node needs to learn only that it stopped voting.
    let known = common::wait_until(common::CONVERGE_WAIT, || {
        let voters_know = (2..5)
            .all(|i| kite_membership(&cluster, i).is_some_and(|m| settled_on(&m, want.clone())));
        let removed_know = (0..2).all(|i| {
            kite_membership(&cluster, i).is_some_and(|m| {
                let me = serde_json::json!(i + 1);
                m["next"].is_null() && m["voters"].as_array().is_some_and(|v| !v.contains(&me))
            })
        });
        voters_know && removed_know
    });
    let seen: Vec<_> = (0..5).map(|i| kite_membership(&cluster, i)).collect();
    assert!(known, "the voters 3, 4, 5 in force: {seen:?}");
    let mut status = std::process::Command::new(&exe);
    status.arg("status");
    for addr in &addrs {
        status.args(["--node", &addr.to_string()]);
    }
    let status = status.output().expect("the CLI runs");
    let shown = String::from_utf8_lossy(&status.stdout);
    assert!(shown.contains("leaderless (kite)  membership 8: voters 3,4,5"), "{shown}");
    let kite_table = shown.split("leaderless (kite)").nth(1).expect("the kite keyspace's table");
    let row =
        |id: u32| kite_table.lines().find(|l| l.contains(&format!("{} ", addrs[id as usize - 1])));
    assert!(row(1).is_some_and(|r| r.contains(" no ")), "{shown}");
    assert!(row(4).is_some_and(|r| r.contains(" yes ")), "{shown}");
    // The metrics say the same: node 3 votes in membership 8, settled; node 1 does not.
    let metric = |i: usize, name: &str| {
        let page = common::scrape(cluster.configs[i].http_addr.expect("an HTTP endpoint"));
        common::sample(&page, &format!("{name}{{keyspace=\"{KITE}\"}}"))
    };
    assert_eq!(metric(2, "keel_kite_membership_epoch"), Some(8.0));
    assert_eq!(metric(2, "keel_kite_voter"), Some(1.0));
    assert_eq!(metric(2, "keel_kite_membership_changing"), Some(0.0));
    assert!(metric(2, "keel_kite_memberships_total").is_some_and(|n| n >= 1.0));
    assert_eq!(metric(0, "keel_kite_voter"), Some(0.0));
    let mut removed = open(addrs[0]);
    let refused = removed.call(&["KEEL.FAA", "k0", "1"]);
    assert!(refused.starts_with("-UNAVAILABLE node 1 is not a voter"), "{refused}");
    let refused = removed.call(&["KEEL.NODE", "TRANSFER-LEADER", "3"]);
    assert!(refused.starts_with("-ERR"), "{refused}");

    kite_pace(&progress, KITE_OPS_BETWEEN_CHANGES, "stopping the workload");
    progress.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let log = runtime.block_on(work).expect("the workload ends");
    let finals = runtime
        .block_on(keel_client::kite_workload::finals(&client))
        .expect("the counters are read");
    let report = keel_client::kite_workload::check(&log, &finals);
    eprintln!("{report:?}");
    assert_eq!(report.violations, Vec::<String>::new(), "{report:?}");
    assert_eq!(report.violations_total, 0);
    assert!(report.faas >= 100 && report.swaps >= 20 && report.pairs >= 100, "{report:?}");
    common::finish(cluster);
}

/// Runs `keel example <name>` with a node killed and restarted mid-run; its JSON report.
fn example(name: &str) -> serde_json::Value {
    let dir = common::test_dir(name);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["example", name, "--workers", "2", "--ops", "60", "--json", "--dir"])
        .arg(&dir)
        .output()
        .expect("keel example runs");
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "keel example {name} failed:\n{stdout}\n{stderr}");
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

#[test]
fn the_papers_data_structures_keep_their_invariants_through_a_node_killed_and_restarted() {
    for name in ["kite-stack", "kite-queue", "kite-list"] {
        let report = example(name);
        assert_eq!(report["violations"], serde_json::json!([]), "{report}");
        assert_eq!(report["node_killed"], true, "{report}");
        assert!(report["operations"].as_u64().unwrap() >= 200, "most operations ran: {report}");
    }
}

/// Five nodes whose `keel.toml` disagree on the voters of a never-changed Kite keyspace:
/// nodes 1 to 3 say 1, 2, 3, nodes 4 and 5 say 3, 4, 5, and each side holds a majority of
/// its own list. The nodes compare what they announce as they boot and every one refuses
/// its clients, naming the other list; `keel status` and `/metrics` show it.
#[test]
fn nodes_configured_with_other_kite_voters_refuse_clients_and_say_why() {
    let exe = std::path::PathBuf::from(env!("CARGO_BIN_EXE_keel"));
    let dir = common::test_dir("kite-voters-disagree");
    let cluster = LocalCluster::start(&exe, 5, &dir, None, |c| {
        kite_keyspaces(c);
        c.voters = Some(if c.node_id <= 3 { vec![1, 2, 3] } else { vec![3, 4, 5] });
    })
    .expect("the cluster starts");
    let addrs = cluster.client_addrs();
    let disagree = |i: usize| -> Option<serde_json::Value> {
        Some(status_in(cluster.configs[i].client_addr, KITE)?["voters_disagree"].clone())
    };
    let expected = |i: usize| {
        if i < 3 {
            serde_json::json!([4, 5])
        } else {
            serde_json::json!([1, 2, 3])
        }
    };
    let seen = common::wait_until(common::LEADER_WAIT, || {
        (0..5).all(|i| disagree(i).is_some_and(|d| d == expected(i)))
    });
    assert!(seen, "{:?}", (0..5).map(disagree).collect::<Vec<_>>());
    for (i, mine) in [(0, "[1, 2, 3]"), (3, "[3, 4, 5]")] {
        let refused = open(addrs[i]).call(&["KEEL.CAS", "x", "", "a", "STRONG"]);
        let want = format!("voters than node {}'s {mine}", i + 1);
        assert!(refused.starts_with("-UNAVAILABLE node ") && refused.contains(&want), "{refused}");
    }
    let page = common::scrape(cluster.configs[0].http_addr.expect("an HTTP endpoint"));
    let gauge = format!("keel_kite_voters_disagree{{keyspace=\"{KITE}\"}}");
    assert_eq!(common::sample(&page, &gauge), Some(2.0));
    let mut status = std::process::Command::new(&exe);
    status.arg("status");
    for addr in &addrs {
        status.args(["--node", &addr.to_string()]);
    }
    let shown = String::from_utf8_lossy(&status.output().expect("the CLI runs").stdout).to_string();
    let warning = format!("{}: configured with other voters than node(s) 4,5", addrs[0]);
    assert!(shown.contains(&warning), "{shown}");
}
