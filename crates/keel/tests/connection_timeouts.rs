//! Client connections that hold a slot without finishing a request are closed: part of a
//! request waits at most `partial_request_timeout_ms`, an idle connection at most
//! `client_idle_timeout_ms` when it is set; a connection that keeps talking is not.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Whether the server closes `stream` within `within` (reads until end of stream).
fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    stream.set_read_timeout(Some(within)).unwrap();
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).is_ok()
}

#[test]
fn stalled_and_idle_connections_are_closed_and_busy_ones_are_not() {
    let (cluster, _) = common::cluster("conn-timeouts", |c| {
        c.partial_request_timeout_ms = 300;
        c.client_idle_timeout_ms = 600;
    });
    let addr = cluster.client_addrs()[0];

    let mut stalled = TcpStream::connect(addr).unwrap();
    stalled.write_all(b"*2\r\n$3\r\nGET\r\n$1").unwrap(); // never finished
    let started = Instant::now();
    assert!(closed_within(&mut stalled, Duration::from_secs(10)), "a stalled request is cut off");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());

    let mut idle = TcpStream::connect(addr).unwrap();
    assert!(closed_within(&mut idle, Duration::from_secs(10)), "an idle connection is closed");

    let mut busy = TcpStream::connect(addr).unwrap();
    for _ in 0..6 {
        std::thread::sleep(Duration::from_millis(200));
        busy.write_all(b"*1\r\n$4\r\nPING\r\n").unwrap();
        let mut reply = [0u8; 7];
        busy.read_exact(&mut reply).unwrap();
        assert_eq!(&reply, b"+PONG\r\n", "a connection that keeps talking stays open");
    }
    common::finish(cluster);
}
