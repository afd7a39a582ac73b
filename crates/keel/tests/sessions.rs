//! Deduplication sessions against real `keel server` processes: `KEEL.SESSION` opens one,
//! a retry inside it is answered once, and once the deduplication table (here 4 clients)
//! has forgotten it, its requests are refused with `-SESSIONEXPIRED` rather than applied
//! again; keel-client opens a new session by itself when a write was refused at its first
//! attempt.

mod common;

use common::Conn;
use keel_client::{Client, ClientConfig};
use keel_types::ClientId;

/// Opens a session on `conn`; returns its id.
fn open(conn: &mut Conn) -> String {
    let header = conn.call(&["KEEL.SESSION"]);
    assert!(header.starts_with('$'), "KEEL.SESSION answered {header}");
    let id = conn.line().trim_end_matches("\r\n").to_string();
    let raw: u64 = id.parse().expect("a u64 id");
    assert!(ClientId(raw).is_session(), "{id} has the session bit");
    id
}

/// Writes from `n` plain clients, enough to push every older client out of a table of 4.
fn crowd_out(conn: &mut Conn, n: u64) {
    for client in 1..=n {
        let id = (1000 + client).to_string();
        assert_eq!(conn.call(&["KEEL.REQ", &id, "1", "SET", "s:other", &id]), "+OK");
    }
}

#[test]
fn a_forgotten_session_is_refused_and_a_retry_never_applies_twice() {
    let (cluster, _) = common::cluster("sessions", |c| c.engine.dedup_clients_max = Some(4));
    // A follower: the session's requests are forwarded to the leader.
    let mut conn = Conn::open(cluster.client_addrs()[1]);
    let settled =
        common::wait_until(common::LEADER_WAIT, || conn.call(&["SET", "s:ready", "1"]) == "+OK");
    assert!(settled, "the cluster never accepted a write");

    // Never opened: refused.
    let unknown = (ClientId::SESSION_BIT | 12_345).to_string();
    let refused = conn.call(&["KEEL.REQ", &unknown, "1", "INCR", "s:n"]);
    assert!(refused.starts_with("-SESSIONEXPIRED"), "{refused}");

    let id = open(&mut conn);
    assert_eq!(conn.call(&["KEEL.REQ", &id, "1", "INCR", "s:n"]), ":1");
    assert_eq!(conn.call(&["KEEL.REQ", &id, "1", "INCR", "s:n"]), ":1", "a retry, answered once");
    assert_eq!(conn.call(&["KEEL.REQ", &id, "2", "INCR", "s:n"]), ":2");

    crowd_out(&mut conn, 5);
    let late = conn.call(&["KEEL.REQ", &id, "2", "INCR", "s:n"]);
    assert!(late.starts_with("-SESSIONEXPIRED"), "a retry after the session left: {late}");
    let next = conn.call(&["KEEL.REQ", &id, "3", "INCR", "s:n"]);
    assert!(next.starts_with("-SESSIONEXPIRED"), "and its next request: {next}");
    assert_eq!(conn.call(&["GET", "s:n", "LEVEL", "linearizable"]), "$1");
    assert_eq!(conn.line(), "2\r\n", "each request applied once");

    // keel-client: a write refused at its first attempt goes again under a new session.
    let client = Client::new(ClientConfig::new(cluster.client_addrs().to_vec()));
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let mut session = client.session();
        assert_eq!(session.incr(b"s:c", 1).await.expect("an incr"), 1);
        let first = session.server_session().expect("opened before the first write");
        crowd_out(&mut conn, 5);
        assert_eq!(session.incr(b"s:c", 1).await.expect("an incr in a new session"), 2);
        let second = session.server_session().expect("reopened");
        assert_ne!(first, second, "a new session");
    });
    common::finish(cluster);
}
