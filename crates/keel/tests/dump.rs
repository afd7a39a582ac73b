//! `DUMP` and `RESTORE` against real `keel server` processes: a key of each type moves
//! whole (value or elements, and expiry as `RESTORE` asks) through another node, an
//! existing key is kept without `REPLACE`, and payloads not of `DUMP` are refused.

mod common;

use common::Conn;
use std::io::{Read, Write};

/// Sends `words`, any bytes.
fn send(c: &mut Conn, words: &[&[u8]]) {
    let mut out = format!("*{}\r\n", words.len()).into_bytes();
    for w in words {
        out.extend_from_slice(format!("${}\r\n", w.len()).as_bytes());
        out.extend_from_slice(w);
        out.extend_from_slice(b"\r\n");
    }
    c.0.write_all(&out).unwrap();
}

/// Sends `words` and reads a bulk reply whole (`None`: null).
fn bulk_bytes(c: &mut Conn, words: &[&[u8]]) -> Option<Vec<u8>> {
    send(c, words);
    let header = c.line();
    let len: i64 = header.trim_end()[1..].parse().unwrap_or_else(|_| panic!("{header}"));
    if len < 0 {
        return None;
    }
    let mut body = vec![0u8; len as usize + 2];
    c.0.read_exact(&mut body).unwrap();
    body.truncate(len as usize);
    Some(body)
}

/// Sends `words` and reads the first line of the reply.
fn line(c: &mut Conn, words: &[&[u8]]) -> String {
    send(c, words);
    c.line().trim_end().to_string()
}

#[test]
fn dump_and_restore_move_keys_whole() {
    let (cluster, _) = common::cluster("dump", |_| {});
    let addrs = cluster.client_addrs();
    let mut a = Conn::open(addrs[0]);
    let mut b = Conn::open(addrs[1]);
    let settled = common::wait_until(common::LEADER_WAIT, || {
        a.call(&["SET", "s", "v", "EX", "100"]) == "+OK"
    });
    assert!(settled, "the cluster never accepted a write");
    assert_eq!(a.call(&["HSET", "h", "f", "1", "g", "2"]), ":2");
    assert_eq!(a.call(&["RPUSH", "l", "x", "y"]), ":2");
    assert_eq!(a.call(&["ZADD", "z", "1.5", "m"]), ":1");
    for key in ["s", "h", "l", "z"] {
        let payload = bulk_bytes(&mut a, &[b"DUMP", key.as_bytes()]).expect("a payload");
        assert!(payload.starts_with(b"KEEL\x01"), "{key}");
        let copy = format!("{key}2");
        assert_eq!(line(&mut b, &[b"RESTORE", copy.as_bytes(), b"0", &payload]), "+OK", "{key}");
        if key != "s" {
            // (s had an expiry, which a ttl of 0 leaves out.)
            assert_eq!(bulk_bytes(&mut b, &[b"DUMP", copy.as_bytes()]), Some(payload.clone()));
        }
        // Without REPLACE an existing key stays; with it, it is replaced.
        let busy = line(&mut b, &[b"RESTORE", copy.as_bytes(), b"0", &payload]);
        assert_eq!(busy, "-BUSYKEY Target key name already exists.");
        let replaced = line(&mut b, &[b"RESTORE", copy.as_bytes(), b"0", &payload, b"REPLACE"]);
        assert_eq!(replaced, "+OK");
    }
    assert_eq!(a.call(&["TTL", "s2"]), ":-1", "a ttl of 0: no expiry, whatever the dump held");
    assert_eq!(a.call(&["HLEN", "h2"]), ":2");
    assert_eq!(a.call(&["LLEN", "l2"]), ":2");
    assert_eq!(a.call(&["ZSCORE", "z2", "m"]), "$3");
    assert_eq!(a.line(), "1.5\r\n");
    let payload = bulk_bytes(&mut a, &[b"DUMP", b"s"]).unwrap();
    assert_eq!(line(&mut a, &[b"RESTORE", b"t", b"50000", &payload]), "+OK");
    let ttl: i64 = a.call(&["PTTL", "t"])[1..].parse().unwrap();
    // The leader stamped the expiry with its clock; node 1, perhaps a follower, counts
    // what is left on its own, which may read a millisecond or so behind.
    assert!((40_000..=50_100).contains(&ttl), "{ttl}");
    assert_eq!(line(&mut a, &[b"RESTORE", b"past", b"1000", &payload, b"ABSTTL"]), "+OK");
    assert_eq!(a.call(&["EXISTS", "past"]), ":0", "an absolute time passed long ago");
    // Payloads not of DUMP.
    let redis_like = line(&mut a, &[b"RESTORE", b"r", b"0", b"\x00\x03foo\x0a\x00junkjunk"]);
    assert_eq!(redis_like, "-ERR DUMP payload version or checksum are wrong");
    // A set (flag 3, type 3) of two members, the same one twice (little-endian counts).
    let twice = b"KEEL\x01\x03\x03\x02\0\0\0\0\0\0\0\x01\0\0\0m\x01\0\0\0m";
    assert_eq!(line(&mut a, &[b"RESTORE", b"r", b"0", twice]), "-ERR Bad data format");
    assert_eq!(a.call(&["EXISTS", "r"]), ":0");
    assert_eq!(bulk_bytes(&mut a, &[b"DUMP", b"nope"]), None);
    assert!(a.call(&["RESTORE", "r", "-1", "x"]).contains("must be >= 0"));
    common::finish(cluster);
}
