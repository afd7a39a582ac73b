//! `CLIENT UNBLOCK` against real `keel server` processes: a blocking pop ends as a
//! time-out or with `UNBLOCKED`, and a connection that is not blocked is answered 0.

mod common;

use common::Conn;
use std::time::Duration;

#[test]
fn client_unblock_ends_a_blocking_pop() {
    let (cluster, _) = common::cluster("blocking", |_| {});
    let addr = cluster.client_addrs()[0];
    let mut c = Conn::open(addr);
    let settled = common::wait_until(common::LEADER_WAIT, || c.call(&["SET", "s", "1"]) == "+OK");
    assert!(settled, "the cluster never accepted a write");
    let mut blocked = Conn::open(addr);
    let id = blocked.call(&["CLIENT", "ID"])[1..].to_string();
    assert_eq!(c.call(&["CLIENT", "UNBLOCK", &id]), ":0", "not blocked yet");
    for (how, answer) in
        [("TIMEOUT", "*-1"), ("ERROR", "-UNBLOCKED client unblocked via CLIENT UNBLOCK")]
    {
        let mut waiting = Conn(blocked.0.try_clone().unwrap());
        let pop = std::thread::spawn(move || waiting.call(&["BLPOP", "empty", "0"]));
        let ended = common::wait_until(Duration::from_secs(10), || {
            c.call(&["CLIENT", "UNBLOCK", &id, how]) == ":1"
        });
        assert!(ended, "the pop never counted as blocked");
        assert_eq!(pop.join().unwrap(), answer, "{how}");
    }
    assert!(c.call(&["CLIENT", "UNBLOCK", "x"]).contains("not an integer"));
    // The connection still pops what comes.
    let mut waiting = Conn(blocked.0.try_clone().unwrap());
    let pop = std::thread::spawn(move || {
        let header = waiting.call(&["BLPOP", "l", "5"]);
        (header, (0..4).map(|_| waiting.line()).collect::<String>())
    });
    // Pushed before or after the pop blocks, the element is the pop's.
    assert_eq!(c.call(&["RPUSH", "l", "x"]), ":1");
    assert_eq!(pop.join().unwrap(), ("*2".to_string(), "$1\r\nl\r\n$1\r\nx\r\n".to_string()));
    common::finish(cluster);
}
