//! Client authentication and access control against real `keel server` processes: with
//! users configured, nothing runs before `AUTH` (`NOAUTH`), a wrong password is refused,
//! each user runs only its categories in its keyspaces (`NOPERM`), `KEEL.LOG` is for
//! admins, and one user's deduplication ids are not another's. Without users, a node
//! listening beyond loopback serves loopback clients only (protected mode).

mod common;

use keel_server::acl::{hash_password, Category, UserSettings};
use std::io::Read;
use std::net::SocketAddr;

use common::Conn;

fn user(
    name: &str,
    password: &str,
    permissions: &[Category],
    keyspaces: Option<Vec<u32>>,
) -> UserSettings {
    UserSettings {
        name: name.into(),
        password_hash: hash_password(password.as_bytes(), 1_000),
        permissions: permissions.to_vec(),
        keyspaces,
    }
}

#[test]
fn users_authenticate_and_run_only_what_they_may() {
    use Category::{Admin, Read, Write};
    let users = vec![
        user("admin", "admin-pass", &[Read, Write, Admin], None),
        user("writer", "writer-pass", &[Read, Write], Some(vec![0])),
        user("reader", "reader-pass", &[Read], Some(vec![0])),
    ];
    let mut cluster = common::start("client-auth", |c| {
        c.users = users.clone();
        // Keyspace 1 exists, so `SELECT 1` names it (not database 1 of keyspace 0).
        c.keyspaces = (0..2).map(keel_server::config::KeyspaceSettings::orca).collect();
    });
    cluster.credentials = Some(("admin".into(), "admin-pass".into()));
    let leader = cluster.wait_for_leader(common::LEADER_WAIT).expect("a leader");
    let addr = cluster.client_addrs()[leader];

    let mut anonymous = Conn::open(addr);
    assert_eq!(anonymous.call(&["SET", "a", "1"]), "-NOAUTH Authentication required.");
    assert_eq!(anonymous.call(&["PING"]), "-NOAUTH Authentication required.");
    assert!(anonymous.call(&["AUTH", "writer", "wrong"]).starts_with("-WRONGPASS"));
    assert!(anonymous.call(&["AUTH", "nobody", "writer-pass"]).starts_with("-WRONGPASS"));
    assert!(anonymous.call(&["HELLO", "3"]).starts_with("-NOAUTH"));

    let mut writer = Conn::open(addr);
    assert_eq!(writer.call(&["AUTH", "writer", "writer-pass"]), "+OK");
    assert_eq!(writer.call(&["ACL", "WHOAMI"]), "$6");
    assert_eq!(writer.line(), "writer\r\n");
    assert_eq!(writer.call(&["SET", "a", "1"]), "+OK");
    assert!(writer.call(&["KEEL.LOG", "1", "10"]).starts_with("-NOPERM"), "admin only");
    assert!(writer.call(&["SELECT", "1"]).starts_with("-NOPERM"), "not its keyspace");
    assert_eq!(writer.call(&["SELECT", "2"]), "+OK", "database 2 of keyspace 0, which it may use");
    assert_eq!(writer.call(&["SELECT", "0"]), "+OK");

    let mut reader = Conn::open(addr);
    // HELLO 3 AUTH authenticates and switches to RESP3 in one command.
    assert!(reader.call(&["HELLO", "3", "AUTH", "reader", "reader-pass"]).starts_with('%'));
    // Skip the rest of HELLO's map: a PING after it marks its end.
    reader.send(b"PING\r\n");
    while reader.line() != "+PONG\r\n" {}
    assert!(reader.call(&["SET", "a", "2"]).starts_with("-NOPERM"), "a reader cannot write");
    assert_eq!(reader.call(&["GET", "a", "LEVEL", "linearizable"]), "$1");
    assert_eq!(reader.line(), "1\r\n", "and nothing was written");
    // A write queued by the writer does not run once the connection has become the reader:
    // EXEC checks permissions again.
    let mut switcher = Conn::open(addr);
    assert_eq!(switcher.call(&["AUTH", "writer", "writer-pass"]), "+OK");
    assert_eq!(switcher.call(&["MULTI"]), "+OK");
    assert_eq!(switcher.call(&["SET", "a", "4"]), "+QUEUED");
    assert_eq!(switcher.call(&["AUTH", "reader", "reader-pass"]), "+OK");
    assert!(switcher.call(&["EXEC"]).starts_with("-NOPERM"), "the queued write is refused");
    assert_eq!(reader.call(&["GET", "a", "LEVEL", "linearizable"]), "$1");
    assert_eq!(reader.line(), "1\r\n", "and it was not written");

    let mut admin = Conn::open(addr);
    assert_eq!(admin.call(&["AUTH", "admin", "admin-pass"]), "+OK");
    assert!(admin.call(&["KEEL.LOG", "1", "1"]).starts_with('*'));

    // Deduplication ids are per user: the admin's (77, 1) is not the writer's (77, 1).
    let mut writer = Conn::open(addr);
    assert_eq!(writer.call(&["AUTH", "writer", "writer-pass"]), "+OK");
    assert_eq!(writer.call(&["KEEL.REQ", "77", "1", "INCRBY", "n", "1"]), ":1");
    let mut admin = Conn::open(addr);
    assert_eq!(admin.call(&["AUTH", "admin", "admin-pass"]), "+OK");
    assert_eq!(admin.call(&["KEEL.REQ", "77", "1", "INCRBY", "n", "10"]), ":11", "applied");
    assert_eq!(admin.call(&["KEEL.REQ", "77", "2", "INCRBY", "n", "100"]), ":111");
    // The writer's retry is still answered from its own slot, which the admin's
    // requests neither advanced nor replaced.
    assert_eq!(writer.call(&["KEEL.REQ", "77", "1", "INCRBY", "n", "1"]), ":1");

    // Keel's own client authenticates too (`--user`, the password in KEEL_PASSWORD).
    let keel = |user: &str, password: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_keel"))
            .args(["get", "a", "--node", &addr.to_string(), "--user", user])
            .env("KEEL_PASSWORD", password)
            .output()
            .unwrap()
    };
    let out = keel("writer", "writer-pass");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains('1'));
    assert!(!keel("writer", "wrong").status.success());

    if let Some(cli) = common::tool("redis-cli") {
        let port = addr.port().to_string();
        let run = |args: &[&str]| {
            let out = std::process::Command::new(cli).args(args).output().unwrap();
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        };
        let base = ["-p", port.as_str(), "--no-auth-warning"];
        let with = |more: &[&str]| run(&[&base[..], more].concat());
        assert!(with(&["GET", "a"]).contains("NOAUTH"));
        assert_eq!(with(&["--user", "writer", "--pass", "writer-pass", "GET", "a"]), "1");
        assert!(with(&["--user", "reader", "--pass", "reader-pass", "SET", "a", "3"])
            .contains("NOPERM"));
    }
    common::finish(cluster);
}

#[test]
fn without_users_only_loopback_clients_are_served() {
    let Some(ip) = common::non_loopback_ip() else {
        eprintln!("skipping: this machine has no address but loopback");
        return;
    };
    let (cluster, leader) = common::cluster("protected-mode", |c| {
        let port = c.client_addr.port();
        c.client_addr = SocketAddr::from(([0, 0, 0, 0], port));
    });
    let port = cluster.configs[leader].client_addr.port();
    let mut local = Conn::open(SocketAddr::from(([127, 0, 0, 1], port)));
    assert_eq!(local.call(&["PING"]), "+PONG", "loopback is served");
    let mut remote = Conn::open(SocketAddr::new(ip, port));
    let mut refusal = String::new();
    let _ = remote.0.read_to_string(&mut refusal);
    assert!(refusal.starts_with("-DENIED Keel is running in protected mode"), "{refusal}");
    common::finish(cluster);
}
