//! Redis's string commands beyond `GET` and `SET`, against real `keel server` processes:
//! the in-place changes (`APPEND`, `SETRANGE`, `SETBIT`, `INCRBYFLOAT`, `GETDEL`, `GETEX`)
//! as one log entry each, the transfers (`RENAME`, `RENAMENX`, `COPY`) carrying the
//! expiry, the reads computed from a value (`STRLEN`, `GETRANGE`, `GETBIT`, `BITCOUNT`,
//! `TYPE`), `MSET`, `UNLINK` and `TOUCH`, answered as Redis answers them.

mod common;

use common::Conn;

/// A bulk reply's text (`None` for null).
fn bulk(conn: &mut Conn, words: &[&str]) -> Option<String> {
    match conn.call(words).as_str() {
        "$-1" => None,
        header if header.starts_with('$') => Some(conn.line().trim_end_matches("\r\n").to_string()),
        other => panic!("{words:?}: {other}"),
    }
}

#[test]
fn string_commands_answer_as_redis() {
    let (cluster, _) = common::cluster("strings", |_| {});
    let mut c = Conn::open(cluster.client_addrs()[2]);
    let settled =
        common::wait_until(common::LEADER_WAIT, || c.call(&["SET", "s", "Hello"]) == "+OK");
    assert!(settled, "the cluster never accepted a write");
    assert_eq!(c.call(&["APPEND", "s", " World"]), ":11");
    assert_eq!(c.call(&["STRLEN", "s"]), ":11");
    assert_eq!(bulk(&mut c, &["GETRANGE", "s", "0", "4"]).as_deref(), Some("Hello"));
    assert_eq!(bulk(&mut c, &["GETRANGE", "s", "-5", "-1"]).as_deref(), Some("World"));
    assert_eq!(bulk(&mut c, &["GETRANGE", "s", "20", "30"]).as_deref(), Some(""));
    assert_eq!(c.call(&["SETRANGE", "s", "6", "Redis"]), ":11");
    assert_eq!(bulk(&mut c, &["GET", "s"]).as_deref(), Some("Hello Redis"));
    assert_eq!(c.call(&["SETRANGE", "pad", "3", "x"]), ":4");
    assert_eq!(bulk(&mut c, &["GET", "pad"]).as_deref(), Some("\0\0\0x"));
    assert_eq!(c.call(&["SETRANGE", "none", "0", ""]), ":0");
    assert_eq!(c.call(&["EXISTS", "none"]), ":0", "an empty SETRANGE creates nothing");
    assert_eq!(c.call(&["SETBIT", "b", "7", "1"]), ":0");
    assert_eq!(c.call(&["SETBIT", "b", "7", "0"]), ":1");
    assert_eq!(c.call(&["SETBIT", "b", "1", "1"]), ":0");
    assert_eq!(c.call(&["GETBIT", "b", "1"]), ":1");
    assert_eq!(c.call(&["GETBIT", "b", "100"]), ":0");
    assert_eq!(c.call(&["BITCOUNT", "s"]), ":40");
    assert_eq!(c.call(&["BITCOUNT", "s", "0", "0"]), ":2");
    assert_eq!(c.call(&["BITCOUNT", "s", "1", "3", "BIT"]), ":1");
    assert_eq!(bulk(&mut c, &["INCRBYFLOAT", "f", "10.5"]).as_deref(), Some("10.5"));
    assert_eq!(bulk(&mut c, &["INCRBYFLOAT", "f", "0.1"]).as_deref(), Some("10.6"));
    assert_eq!(bulk(&mut c, &["INCRBYFLOAT", "f", "-5.0e3"]).as_deref(), Some("-4989.4"));
    assert!(c.call(&["INCRBYFLOAT", "s", "1"]).contains("not a valid float"));
    assert_eq!(c.call(&["TYPE", "s"]), "+string");
    assert_eq!(c.call(&["TYPE", "none"]), "+none");

    // GETEX and GETDEL.
    assert_eq!(bulk(&mut c, &["GETEX", "s", "EX", "100"]).as_deref(), Some("Hello Redis"));
    assert!((99..=100).contains(&c.call(&["TTL", "s"])[1..].parse::<i64>().unwrap()));
    assert_eq!(bulk(&mut c, &["GETEX", "s", "PERSIST"]).as_deref(), Some("Hello Redis"));
    assert_eq!(c.call(&["TTL", "s"]), ":-1");
    assert_eq!(bulk(&mut c, &["GETEX", "none"]), None);
    assert_eq!(bulk(&mut c, &["GETDEL", "pad"]).as_deref(), Some("\0\0\0x"));
    assert_eq!(bulk(&mut c, &["GETDEL", "pad"]), None);

    // Transfers carry the value and the expiry.
    assert_eq!(c.call(&["SET", "src", "v", "EX", "100"]), "+OK");
    assert_eq!(c.call(&["COPY", "src", "dst"]), ":1");
    assert_eq!(c.call(&["COPY", "src", "dst"]), ":0", "the destination exists");
    assert_eq!(c.call(&["COPY", "src", "dst", "REPLACE"]), ":1");
    assert!(c.call(&["TTL", "dst"]) != ":-1", "the expiry came along");
    assert_eq!(c.call(&["RENAME", "src", "moved"]), "+OK");
    assert_eq!(c.call(&["EXISTS", "src"]), ":0");
    assert!(c.call(&["RENAME", "src", "x"]).contains("no such key"));
    assert_eq!(c.call(&["RENAMENX", "moved", "dst"]), ":0");
    assert_eq!(c.call(&["RENAMENX", "moved", "fresh"]), ":1");
    assert_eq!(c.call(&["MSET", "m1", "a", "m2", "b"]), "+OK");
    assert_eq!(c.call(&["TOUCH", "m1", "m2", "nope"]), ":2");
    assert_eq!(c.call(&["UNLINK", "m1", "m2"]), ":2");
    assert_eq!(c.call(&["EXISTS", "m1", "m2"]), ":0");
    assert!(c.call(&["SETBIT", "b", "-1", "1"]).contains("bit offset"));
    assert!(c.call(&["SETBIT", "b", "1", "2"]).contains("bit is not"));
    common::finish(cluster);
}
