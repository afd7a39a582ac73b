//! Black-box RESP tests: bytes in, bytes out, against a real node of a 3-node cluster.
//! Bad input gets an error reply and the connection stays usable; malformed RESP gets
//! an error and the connection closes; the node carries on; past `connections_max` a
//! connection is refused with `-BUSY`.

mod common;

use std::net::SocketAddr;

const CONNECTIONS_MAX: u32 = 6;

use common::Conn;

fn req(words: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", words.len()).into_bytes();
    for w in words {
        out.extend_from_slice(format!("${}\r\n", w.len()).as_bytes());
        out.extend_from_slice(w);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Retries a write until the cluster serves it (the first may meet a leader change).
fn settle(addr: SocketAddr) {
    let accepted = common::wait_until(common::LEADER_WAIT, || {
        let mut c = Conn::open(addr);
        c.send(&req(&[b"SET", b"warm", b"up"]));
        c.line() == "+OK\r\n"
    });
    assert!(accepted, "the cluster never accepted a write");
}

#[test]
fn resp_bytes_in_bytes_out() {
    let (cluster, _) = common::cluster("resp", |c| c.connections_max = CONNECTIONS_MAX);
    let addr = cluster.client_addrs()[0];
    settle(addr);
    let mut c = Conn::open(addr);

    c.send(b"*1\r\n$4\r\nPING\r\n");
    c.expect(b"+PONG\r\n");
    c.send(b"PING\r\n"); // inline
    c.expect(b"+PONG\r\n");

    // Pipelined: three requests in one write, answered in order.
    let mut pipeline = req(&[b"SET", b"k", b"v1"]);
    pipeline.extend(req(&[b"GET", b"k"]));
    pipeline.extend(req(&[b"GET", b"absent-key"]));
    c.send(&pipeline);
    c.expect(b"+OK\r\n$2\r\nv1\r\n$-1\r\n");

    // Deduplication: a retry of (client, request) is answered from the first; the same
    // pair with another command is refused and applies nothing.
    c.send(&req(&[b"KEEL.REQ", b"77", b"1", b"INCRBY", b"dedup", b"5"]));
    c.expect(b":5\r\n");
    c.send(&req(&[b"KEEL.REQ", b"77", b"1", b"INCRBY", b"dedup", b"5"]));
    c.expect(b":5\r\n");
    c.send(&req(&[b"KEEL.REQ", b"77", b"1", b"INCRBY", b"dedup", b"6"]));
    assert!(c.line().contains("already used for another command"));
    c.send(&req(&[b"GET", b"dedup", b"LEVEL", b"linearizable"]));
    c.expect(b"$1\r\n5\r\n");

    // Keel options.
    c.send(&req(&[b"SET", b"k", b"v2", b"DURABILITY", b"durable"]));
    c.expect(b"+OK\r\n");
    c.send(&req(&[b"GET", b"k", b"LEVEL", b"linearizable"]));
    c.expect(b"$2\r\nv2\r\n");
    c.send(&req(&[b"INCRBY", b"n", b"5"]));
    c.expect(b":5\r\n");
    c.send(&req(&[b"KEEL.CAS", b"k", b"v2", b"v3"]));
    assert_eq!(c.line(), "*3\r\n");
    c.expect(b":1\r\n$2\r\nv2\r\n");
    assert!(c.line().starts_with('$'), "a version");
    let _version = c.line();

    // Bad input: an error reply, and the connection stays usable.
    c.send(&req(&[b"FOO", b"bar"]));
    c.expect(b"-ERR unknown command 'FOO', with args beginning with: 'bar' \r\n");
    c.send(&req(&[b"GET"]));
    c.expect(b"-ERR wrong number of arguments for 'get' command\r\n");
    c.send(&req(&[b"GET", b"k", b"LEVEL", b"strong"]));
    assert!(c.line().starts_with("-ERR unknown read level 'strong'"));
    let big_key = vec![b'x'; 1025];
    c.send(&req(&[b"GET", &big_key]));
    assert!(c.line().starts_with("-ERR key of 1025 bytes exceeds the limit of 1024 bytes"));
    c.send(&req(&[b"INCR", b"k"]));
    c.expect(b"-ERR value is not an integer or out of range\r\n");
    c.send(b"*1\r\n$4\r\nPING\r\n");
    c.expect(b"+PONG\r\n");

    // RESP3 after HELLO 3: nulls are `_`.
    c.send(&req(&[b"HELLO", b"3"]));
    assert!(c.line().starts_with('%'), "HELLO 3 answers a map");
    let mut hello = String::new();
    while !hello.contains("modules") {
        hello.push_str(&c.line());
    }
    let _modules = c.line();
    c.send(&req(&[b"GET", b"absent-key"]));
    c.expect(b"_\r\n");
    // ... and KEEL.CAS says whether it swapped as a boolean (`:1` above under RESP2).
    c.send(&req(&[b"KEEL.CAS", b"k", b"v3", b"v4"]));
    assert_eq!(c.line(), "*3\r\n");
    c.expect(b"#t\r\n$2\r\nv3\r\n");
    let _version = c.line();
    let _version = c.line();

    // Malformed RESP: an error, then the connection closes; the node carries on.
    let mut bad = Conn::open(addr);
    bad.send(b"*1\r\n$x\r\n");
    assert!(bad.line().starts_with("-ERR Protocol error"));
    assert!(bad.closed(), "the connection closes after a protocol error");
    c.send(b"*1\r\n$4\r\nPING\r\n");
    c.expect(b"+PONG\r\n");

    // Too many connections: `-BUSY`, and the connection is closed.
    drop(bad);
    let mut held = Vec::new();
    let refused = (0..CONNECTIONS_MAX * 2).find_map(|_| {
        let mut extra = Conn::open(addr);
        extra.send(b"*1\r\n$4\r\nPING\r\n");
        let line = extra.line();
        held.push(extra);
        line.starts_with("-BUSY").then_some(line)
    });
    assert_eq!(refused.as_deref(), Some("-BUSY too many connections\r\n"));
    drop(held);
    common::finish(cluster);
}
