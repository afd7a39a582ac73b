//! Damaged files on real disks (`docs/operations.md`, "Failure behaviour"):
//! - a follower whose newest snapshot file rotted starts anyway: recovery sets the
//!   snapshot aside with its log under a repair floor, the leader sends it a snapshot,
//!   the floor clears, and the node serves every acknowledged write and can elect;
//! - a node whose hard-state file rotted refuses to start (exit code 3) and names
//!   `keel repair-hard-state` with its keyspace's directory; after the repair it starts,
//!   rejoins and serves with nothing lost. Also for a Kite keyspace, whose hard state is
//!   the node's incarnation.

mod common;

use keel_client::{Client, ClientConfig};
use keel_server::config::KeyspaceSettings;
use keel_server::local::{status_in, LocalCluster};
use keel_types::{Durability, ReadLevel};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// Flips every bit of the byte in the middle of `path`.
fn flip_middle_byte(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    assert!(bytes.len() > 16, "{} has {} bytes", path.display(), bytes.len());
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(path, bytes).unwrap();
}

/// The files in `dir` whose names start with `prefix` and end with `suffix`, sorted.
fn files(dir: &Path, prefix: &str, suffix: &str) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with(prefix) && name.ends_with(suffix)
        })
        .collect();
    found.sort();
    found
}

fn status_u64(cluster: &LocalCluster, i: usize, field: &str) -> Option<u64> {
    cluster.status(i).and_then(|s| s[field].as_u64())
}

/// Writes `k{i} = v{i}` for `range` through a client of `addrs`, every 25th `durable`, the
/// rest `memory`; panics on a failed write (each one is acknowledged).
fn write_keys(addrs: Vec<std::net::SocketAddr>, range: std::ops::Range<u32>) {
    let client = Client::new(ClientConfig::new(addrs));
    runtime().block_on(async {
        let mut session = client.session();
        for i in range {
            let durability = if i % 25 == 0 { Durability::Durable } else { Durability::Memory };
            let (key, value) = (format!("k{i}"), format!("v{i}"));
            session
                .put(key.as_bytes(), value.as_bytes(), Some(durability))
                .await
                .unwrap_or_else(|e| panic!("write {key}: {e}"));
        }
    });
}

/// Reads `k{i}` for `range` at `level` through a client of `addrs` alone and checks each
/// holds `v{i}`; with one address, every read is answered by that node.
fn check_keys(addrs: Vec<std::net::SocketAddr>, range: std::ops::Range<u32>, level: ReadLevel) {
    let only = (addrs.len() == 1).then_some(0);
    let client = Client::new(ClientConfig::new(addrs));
    runtime().block_on(async {
        let mut session = client.session();
        for i in range {
            let key = format!("k{i}");
            let read = session
                .get(key.as_bytes(), Some(level))
                .await
                .unwrap_or_else(|e| panic!("read {key} at {level:?}: {e}"));
            let value = read.value.map(|v| String::from_utf8_lossy(&v).into_owned());
            assert_eq!(value, Some(format!("v{i}")), "{key} read at {level:?}");
            if let Some(node) = only {
                assert_eq!(read.node, node, "answered by the node asked");
            }
        }
    });
}

/// Waits until node `i` has applied at least what the leader `leader` has committed now.
fn wait_caught_up(cluster: &LocalCluster, i: usize, leader: usize) -> bool {
    let target = status_u64(cluster, leader, "commit_index").expect("the leader answers");
    common::wait_until(common::CONVERGE_WAIT, || {
        status_u64(cluster, i, "applied_index").is_some_and(|applied| applied >= target)
    })
}

/// Waits for node `i` to exit on its own; its exit code.
fn wait_exit(cluster: &mut LocalCluster, i: usize, timeout: Duration) -> Option<i32> {
    let mut exited = None;
    common::wait_until(timeout, || {
        exited = exited.or_else(|| cluster.exited());
        exited.is_some()
    });
    let (node, status) = exited?;
    assert_eq!(node, i, "only the damaged node exits");
    status.code()
}

/// Runs `keel repair-hard-state --dir dir --epoch epoch`: exit code, stdout, stderr.
fn repair(dir: &Path, epoch: u64) -> (Option<i32>, String, String) {
    repair_with(dir, epoch, &[])
}

fn repair_with(dir: &Path, epoch: u64, flags: &[&str]) -> (Option<i32>, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("repair-hard-state")
        .arg("--dir")
        .arg(dir)
        .args(["--epoch", &epoch.to_string()])
        .args(flags)
        .output()
        .expect("keel runs");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

fn log_of(cluster: &LocalCluster, i: usize) -> String {
    std::fs::read_to_string(cluster.log_path(i)).unwrap_or_default()
}

#[test]
fn a_follower_whose_newest_snapshot_rotted_is_repaired_from_the_leader() {
    const WRITES: u32 = 600;
    const WHILE_DOWN: u32 = 100;
    let (mut cluster, leader) = common::cluster("damaged-snapshot", |c| {
        c.engine.snapshot_entries_threshold = Some(100);
    });
    let addrs = cluster.client_addrs();
    write_keys(addrs.clone(), 0..WRITES);
    let snapshots = common::wait_until(common::CONVERGE_WAIT, || {
        (0..3).all(|i| status_u64(&cluster, i, "snapshot_index").is_some_and(|s| s > 0))
    });
    assert!(snapshots, "every node took a snapshot");
    let follower = (0..3).find(|i| *i != leader).unwrap();
    assert!(wait_caught_up(&cluster, follower, leader), "the follower applied every write");
    cluster.kill(follower);
    let dir = cluster.configs[follower].data_dir.clone();
    let snaps = files(&dir, "snapshot-", ".snap");
    let newest = snaps.last().expect("the follower has a snapshot file").clone();
    flip_middle_byte(&newest);
    let others: Vec<_> = (0..3).filter(|i| *i != follower).map(|i| addrs[i]).collect();
    write_keys(others, WRITES..WRITES + WHILE_DOWN);

    cluster.restart(follower).unwrap();
    let first = common::wait_until(Duration::from_secs(20), || cluster.status(follower).is_some());
    assert!(first, "the damaged follower starts and answers (no crash loop)");
    let first_floor = cluster.status(follower).unwrap()["repair_floor"].clone();
    let leader = cluster.wait_for_leader(common::LEADER_WAIT).expect("a leader");
    let repaired = common::wait_until(common::CONVERGE_WAIT, || {
        cluster.status(follower).is_some_and(|s| {
            s["repair_floor"].is_null() && s["counters"]["logs_repaired"].as_u64() >= Some(1)
        })
    });
    if !repaired {
        common::dump_logs(&cluster);
    }
    assert!(repaired, "the floor cleared (first status showed {first_floor})");
    assert!(wait_caught_up(&cluster, follower, leader), "the repaired follower caught up");
    let status = cluster.status(follower).unwrap();
    assert!(status["repair_floor"].is_null(), "{status}");
    assert!(status["counters"]["snapshots_installed"].as_u64() >= Some(1), "{status}");
    let http = cluster.configs[follower].http_addr.expect("local clusters serve HTTP");
    let page = common::scrape(http);
    let repairs = common::sample(&page, "keel_logs_repaired_total{keyspace=\"0\"}");
    assert!(repairs >= Some(1.0), "keel_logs_repaired_total: {repairs:?}");
    let log = log_of(&cluster, follower);
    assert!(log.contains("damaged data found at recovery"), "the error line is logged");
    assert!(log.contains("set aside as"), "the line says the snapshot was set aside");
    let aside =
        newest.with_file_name(format!("{}.damaged", newest.file_name().unwrap().to_string_lossy()));
    assert!(aside.exists(), "{} is kept", aside.display());

    // Every acknowledged write, at the repaired node itself and linearizably.
    check_keys(vec![addrs[follower]], 0..WRITES + WHILE_DOWN, ReadLevel::Any);
    check_keys(addrs.clone(), 0..WRITES + WHILE_DOWN, ReadLevel::Linearizable);

    // With the leader gone, the two left can elect only if the repaired node votes.
    cluster.kill(leader);
    let survivors: Vec<_> = (0..3).filter(|i| *i != leader).map(|i| addrs[i]).collect();
    let next = cluster.wait_for_leader(common::LEADER_WAIT);
    if next.is_none() {
        common::dump_logs(&cluster);
    }
    assert!(next.is_some(), "the repaired node took part in an election");
    write_keys(survivors.clone(), WRITES + WHILE_DOWN..WRITES + WHILE_DOWN + 20);
    check_keys(survivors, 0..WRITES + WHILE_DOWN + 20, ReadLevel::Linearizable);
    common::finish(cluster);
}

#[test]
fn a_node_whose_hard_state_rotted_refuses_to_start_until_repaired() {
    let (mut cluster, leader) = common::cluster("damaged-hard-state", |_| {});
    let addrs = cluster.client_addrs();
    write_keys(addrs.clone(), 0..200);
    let node = (0..3).find(|i| *i != leader).unwrap();
    assert!(wait_caught_up(&cluster, node, leader), "the node applied every write");
    cluster.kill(node);
    let dir = cluster.configs[node].data_dir.clone();
    flip_middle_byte(&dir.join("hard-state"));
    let others: Vec<usize> = (0..3).filter(|i| *i != node).collect();
    write_keys(others.iter().map(|&i| addrs[i]).collect(), 200..300);

    // It refuses, naming the command and this keyspace's directory.
    cluster.restart(node).unwrap();
    let code = wait_exit(&mut cluster, node, Duration::from_secs(20));
    assert_eq!(code, Some(3), "a startup failure");
    let log = log_of(&cluster, node);
    let command =
        format!("keel repair-hard-state --dir {}", std::path::absolute(&dir).unwrap().display());
    assert!(log.contains(&command), "the log names `{command}`:\n{log}");

    // The repair refuses what is not a keyspace directory; then rebuilds.
    let empty = cluster.dir().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let (code, _, stderr) = repair(&empty, 1);
    assert_eq!(code, Some(2), "no keel files: {stderr}");
    assert!(stderr.contains("no keel files"), "{stderr}");
    let epochs: Vec<u64> =
        others.iter().map(|&i| status_u64(&cluster, i, "epoch").expect("epoch")).collect();
    let seen = *epochs.iter().max().unwrap();
    let (code, stdout, stderr) = repair(&dir, seen);
    assert_eq!(code, Some(0), "the repair succeeds:\n{stdout}\n{stderr}");
    assert!(stdout.contains(&format!("epoch {}", seen + 1)), "{stdout}");
    let (code, _, stderr) = repair(&dir, seen);
    assert_eq!(code, Some(2), "an intact hard state is left alone: {stderr}");
    assert!(stderr.contains("intact"), "{stderr}");

    // It starts, rejoins (one election: its epoch is past the leader's) and serves.
    cluster.restart(node).unwrap();
    let leader = cluster.wait_for_leader(common::LEADER_WAIT);
    if leader.is_none() {
        common::dump_logs(&cluster);
    }
    let leader = leader.expect("a leader with the repaired node back");
    let epoch = status_u64(&cluster, leader, "epoch").unwrap();
    assert!(epoch > seen, "the cluster moved past epoch {seen}: {epoch}");
    assert!(wait_caught_up(&cluster, node, leader), "the repaired node caught up");
    check_keys(vec![addrs[node]], 0..300, ReadLevel::Any);
    check_keys(addrs.clone(), 0..300, ReadLevel::Linearizable);
    assert!(cluster.exited().is_none(), "every node runs");
    common::finish(cluster);
}

/// The Kite keyspace of the clusters below.
const KITE: u32 = 1;

/// A cluster with an ORCA and a Kite keyspace, `kept` written in the Kite one, and node
/// `node` stopped: the cluster, client addresses, the node's last incarnation, and its
/// Kite keyspace's directory.
fn kite_node_stopped(name: &str, node: usize) -> (LocalCluster, Vec<SocketAddr>, u64, PathBuf) {
    let (mut cluster, _) = common::cluster(name, |c| {
        c.keyspaces = vec![KeyspaceSettings::orca(0), KeyspaceSettings::kite(KITE)];
    });
    assert!(cluster.wait_for_replicas(KITE, common::LEADER_WAIT), "every node rejoined");
    let addrs = cluster.client_addrs();
    let last = status_in(addrs[node], KITE).expect("status")["incarnation"].as_u64().unwrap();
    let mut conn = common::Conn::open(addrs[0]);
    assert_eq!(conn.call(&["SELECT", &KITE.to_string()]), "+OK");
    assert_eq!(conn.call(&["SET", "kept", "1", "RELEASE"]), "+OK");
    cluster.kill(node);
    let dir = cluster.configs[node].data_dir.join(format!("keyspace-{KITE}"));
    (cluster, addrs, last, dir)
}

/// Checks the node at `addr` came back past incarnation `last` and reads `kept`; returns
/// a connection to it in the Kite keyspace.
fn kite_node_back(addr: SocketAddr, last: u64) -> common::Conn {
    let status = status_in(addr, KITE).expect("status");
    assert_eq!(status["incarnation"].as_u64(), Some(last + 2), "past every earlier one");
    let mut conn = common::Conn::open(addr);
    assert_eq!(conn.call(&["SELECT", &KITE.to_string()]), "+OK");
    assert_eq!(conn.call(&["GET", "kept", "ACQUIRE"]), "$1");
    assert_eq!(conn.line(), "1\r\n");
    conn
}

#[test]
fn a_kite_node_whose_hard_state_rotted_is_repaired_with_its_last_incarnation() {
    let (mut cluster, addrs, last, dir) = kite_node_stopped("damaged-kite-hard-state", 2);
    let node = 2;
    flip_middle_byte(&dir.join("hard-state"));
    cluster.restart(node).unwrap();
    assert_eq!(wait_exit(&mut cluster, node, Duration::from_secs(20)), Some(3));
    let log = log_of(&cluster, node);
    let command =
        format!("keel repair-hard-state --dir {}", std::path::absolute(&dir).unwrap().display());
    assert!(log.contains(&command), "the log names `{command}`:\n{log}");
    assert!(log.contains(&format!("booted as incarnation {last}")), "the log has the incarnation");
    let (code, stdout, stderr) = repair(&dir, last);
    assert_eq!(code, Some(0), "the repair succeeds:\n{stdout}\n{stderr}");
    cluster.restart(node).unwrap();
    assert!(cluster.wait_for_replicas(KITE, common::CONVERGE_WAIT), "the node rejoined");
    let mut conn = kite_node_back(addrs[node], last);
    // Its writes are taken by the others: their fence admits the new incarnation.
    assert_eq!(conn.call(&["SET", "after", "2", "RELEASE"]), "+OK");
    let mut other = common::Conn::open(addrs[0]);
    assert_eq!(other.call(&["SELECT", &KITE.to_string()]), "+OK");
    assert_eq!(other.call(&["GET", "after", "ACQUIRE"]), "$1");
    assert_eq!(other.line(), "2\r\n");
    common::finish(cluster);
}

#[test]
fn a_kite_node_on_a_new_disk_starts_past_its_last_incarnation() {
    let (mut cluster, addrs, last, dir) = kite_node_stopped("new-disk-kite", 1);
    let node = 1;
    std::fs::remove_dir_all(&dir).unwrap();
    // Without --new-disk an empty directory is refused; with it, the hard state is written.
    std::fs::create_dir_all(&dir).unwrap();
    assert_eq!(repair(&dir, last).0, Some(2), "an empty directory is not repaired by default");
    let (code, stdout, stderr) = repair_with(&dir, last, &["--new-disk"]);
    assert_eq!(code, Some(0), "the new disk's hard state is written:\n{stdout}\n{stderr}");
    assert_eq!(repair_with(&dir, last, &["--new-disk"]).0, Some(2), "not twice");
    cluster.restart(node).unwrap();
    assert!(cluster.wait_for_replicas(KITE, common::CONVERGE_WAIT), "the node rejoined");
    let mut conn = kite_node_back(addrs[node], last);
    assert_eq!(conn.call(&["SET", "after", "2", "RELEASE"]), "+OK");
    common::finish(cluster);
}
