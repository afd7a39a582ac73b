//! Redis's string commands beyond `GET` and `SET`, against real `keel server` processes:
//! the in-place changes (`APPEND`, `SETRANGE`, `SETBIT`, `INCRBYFLOAT`, `GETDEL`, `GETEX`)
//! as one log entry each, the transfers (`RENAME`, `RENAMENX`, `COPY`) carrying the
//! expiry, the reads computed from a value (`STRLEN`, `GETRANGE`, `GETBIT`, `BITCOUNT`,
//! `TYPE`), `MSET`, `UNLINK` and `TOUCH`, answered as Redis answers them; and the rest of
//! Redis's key and server commands (`MSETNX`, `LCS`, `BITPOS`, `OBJECT`, `MOVE`,
//! `RANDOMKEY`, `TIME`, `CONFIG`), what `MULTI` queues, and values of several MiB.

mod common;

use common::Conn;

#[test]
fn string_commands_answer_as_redis() {
    let (cluster, _) = common::cluster("strings", |_| {});
    let mut c = Conn::open(cluster.client_addrs()[2]);
    let settled =
        common::wait_until(common::LEADER_WAIT, || c.call(&["SET", "s", "Hello"]) == "+OK");
    assert!(settled, "the cluster never accepted a write");
    assert_eq!(c.call(&["APPEND", "s", " World"]), ":11");
    assert_eq!(c.call(&["STRLEN", "s"]), ":11");
    assert_eq!(c.bulk(&["GETRANGE", "s", "0", "4"]).as_deref(), Some("Hello"));
    assert_eq!(c.bulk(&["GETRANGE", "s", "-5", "-1"]).as_deref(), Some("World"));
    assert_eq!(c.bulk(&["GETRANGE", "s", "20", "30"]).as_deref(), Some(""));
    assert_eq!(c.call(&["SETRANGE", "s", "6", "Redis"]), ":11");
    assert_eq!(c.bulk(&["GET", "s"]).as_deref(), Some("Hello Redis"));
    assert_eq!(c.call(&["SETRANGE", "pad", "3", "x"]), ":4");
    assert_eq!(c.bulk(&["GET", "pad"]).as_deref(), Some("\0\0\0x"));
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
    assert_eq!(c.bulk(&["INCRBYFLOAT", "f", "10.5"]).as_deref(), Some("10.5"));
    assert_eq!(c.bulk(&["INCRBYFLOAT", "f", "0.1"]).as_deref(), Some("10.6"));
    assert_eq!(c.bulk(&["INCRBYFLOAT", "f", "-5.0e3"]).as_deref(), Some("-4989.4"));
    assert!(c.call(&["INCRBYFLOAT", "s", "1"]).contains("not a valid float"));
    assert_eq!(c.call(&["TYPE", "s"]), "+string");
    assert_eq!(c.call(&["TYPE", "none"]), "+none");

    // GETEX and GETDEL.
    assert_eq!(c.bulk(&["GETEX", "s", "EX", "100"]).as_deref(), Some("Hello Redis"));
    assert!((99..=100).contains(&c.call(&["TTL", "s"])[1..].parse::<i64>().unwrap()));
    assert_eq!(c.bulk(&["GETEX", "s", "PERSIST"]).as_deref(), Some("Hello Redis"));
    assert_eq!(c.call(&["TTL", "s"]), ":-1");
    assert_eq!(c.bulk(&["GETEX", "none"]), None);
    assert_eq!(c.bulk(&["GETDEL", "pad"]).as_deref(), Some("\0\0\0x"));
    assert_eq!(c.bulk(&["GETDEL", "pad"]), None);

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

/// The next `n` lines of a reply, without their CRLF.
fn lines(conn: &mut Conn, n: usize) -> Vec<String> {
    (0..n).map(|_| conn.line().trim_end_matches("\r\n").to_string()).collect()
}

#[test]
fn key_and_server_commands_answer_as_redis() {
    let (cluster, _) = common::cluster("keys-server", |_| {});
    let mut c = Conn::open(cluster.client_addrs()[1]);
    let settled = common::wait_until(common::LEADER_WAIT, || c.call(&["SET", "x1", "a"]) == "+OK");
    assert!(settled, "the cluster never accepted a write");

    // MSETNX: all or nothing, as one transaction.
    assert_eq!(c.call(&["MSETNX", "x1", "b", "y1", "c"]), ":0", "x1 exists: nothing set");
    assert_eq!(c.call(&["EXISTS", "y1"]), ":0");
    assert_eq!(c.call(&["MSETNX", "y1", "c", "z1", "d", "y1", "e"]), ":1");
    assert_eq!(c.bulk(&["GET", "y1"]).as_deref(), Some("e"), "the last pair wins");
    assert_eq!(c.call(&["DEL", "y1"]), ":1");
    assert_eq!(c.call(&["MSETNX", "y1", "f"]), ":1", "a deleted key is absent");
    assert!(c.call(&["MSETNX", "y1"]).contains("wrong number of arguments"));

    // LCS, in its three forms.
    assert_eq!(c.call(&["MSET", "l1", "ohmytext", "l2", "mynewtext"]), "+OK");
    assert_eq!(c.bulk(&["LCS", "l1", "l2"]).as_deref(), Some("mytext"));
    assert_eq!(c.call(&["LCS", "l1", "l2", "LEN"]), ":6");
    assert_eq!(c.call(&["LCS", "l1", "l2", "IDX", "MINMATCHLEN", "4", "WITHMATCHLEN"]), "*4");
    let idx = lines(&mut c, 14).join(" ");
    assert_eq!(idx, "$7 matches *1 *3 *2 :4 :7 *2 :5 :8 :4 $3 len :6");
    assert!(c.call(&["LCS", "l1", "l2", "LEN", "IDX"]).contains("just use IDX"));

    // BITPOS and OBJECT.
    assert_eq!(c.call(&["SET", "bits", "\x00\x0f"]), "+OK");
    assert_eq!(c.call(&["BITPOS", "bits", "1"]), ":12");
    assert_eq!(c.call(&["BITPOS", "bits", "0", "1"]), ":8");
    assert_eq!(c.call(&["BITPOS", "nobits", "0"]), ":0");
    assert_eq!(c.call(&["BITPOS", "nobits", "1"]), ":-1");
    assert_eq!(c.call(&["SET", "n", "1234"]), "+OK");
    assert_eq!(c.bulk(&["OBJECT", "ENCODING", "n"]).as_deref(), Some("int"));
    assert_eq!(c.bulk(&["OBJECT", "ENCODING", "l2"]).as_deref(), Some("embstr"));
    assert_eq!(c.bulk(&["OBJECT", "ENCODING", "nope"]), None);
    assert_eq!(c.call(&["OBJECT", "REFCOUNT", "n"]), ":1");
    assert!(c.call(&["OBJECT", "FREQ", "n"]).contains("LFU"));

    // MOVE to another database, RANDOMKEY, TIME.
    assert_eq!(c.call(&["MOVE", "n", "3"]), ":1");
    assert_eq!(c.call(&["MOVE", "n", "3"]), ":0", "gone from this database");
    assert_eq!(c.call(&["SELECT", "3"]), "+OK");
    assert_eq!(c.bulk(&["GET", "n"]).as_deref(), Some("1234"));
    assert_eq!(c.bulk(&["RANDOMKEY"]).as_deref(), Some("n"), "the only key of db 3");
    assert_eq!(c.call(&["SET", "n2", "x"]), "+OK");
    assert_eq!(c.call(&["MOVE", "n2", "0"]), ":1");
    assert!(c.call(&["MOVE", "n", "3"]).contains("the same"));
    // KEEL.INVOKE reads the connection's database too.
    let invoked = c.bulk(&["KEEL.INVOKE", "GET", "n", "LEVELS", "linearizable"]);
    assert_eq!(invoked.as_deref(), Some("1234"));
    assert_eq!(c.call(&["SELECT", "4"]), "+OK");
    assert_eq!(c.bulk(&["RANDOMKEY"]), None, "db 4 has no keys");
    assert_eq!(c.call(&["SELECT", "0"]), "+OK");
    assert_eq!(c.call(&["EXISTS", "n2"]), ":1");
    // SET ... GET and GETSET refuse a collection and leave it, as Redis's.
    assert_eq!(c.call(&["HSET", "hh", "f", "v"]), ":1");
    assert!(c.call(&["SET", "hh", "x", "GET"]).starts_with("-WRONGTYPE"));
    assert!(c.call(&["GETSET", "hh", "x"]).starts_with("-WRONGTYPE"));
    assert_eq!(c.call(&["TYPE", "hh"]), "+hash");
    assert_eq!(c.bulk(&["SET", "sg", "1", "GET"]), None);
    assert_eq!(c.bulk(&["SET", "sg", "2", "GET"]).as_deref(), Some("1"));
    assert_eq!(c.call(&["DEL", "hh", "sg"]), ":2");
    // SWAPDB: database 0 holds n2 (and more), database 3 holds n.
    assert_eq!(c.call(&["SWAPDB", "0", "3"]), "+OK");
    assert_eq!(c.call(&["EXISTS", "n2"]), ":0", "database 0 now holds database 3's keys");
    assert_eq!(c.bulk(&["GET", "n"]).as_deref(), Some("1234"));
    assert_eq!(c.call(&["SELECT", "3"]), "+OK");
    assert_eq!(c.call(&["EXISTS", "n2"]), ":1");
    assert_eq!(c.call(&["SWAPDB", "3", "0"]), "+OK", "and back");
    assert_eq!(c.call(&["EXISTS", "n2"]), ":0");
    assert_eq!(c.call(&["SELECT", "0"]), "+OK");
    assert_eq!(c.call(&["EXISTS", "n2"]), ":1");
    assert!(c.call(&["SWAPDB", "0", "16"]).contains("out of range"));
    assert!(c.call(&["SWAPDB", "zero", "1"]).contains("invalid first DB index"));
    assert_eq!(c.call(&["TIME"]), "*2");
    let now = lines(&mut c, 4);
    let seconds: u64 = now[1].parse().unwrap();
    let unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    assert!(seconds.abs_diff(unix.as_secs()) < 5, "{now:?}");

    // CONFIG: layout knobs accepted and read back, Keel's own settings refused, all or none.
    assert_eq!(c.call(&["CONFIG", "SET", "hash-max-listpack-entries", "7"]), "+OK");
    assert_eq!(c.call(&["CONFIG", "GET", "hash-max-listpack-*"]), "*4");
    let got = lines(&mut c, 8).join(" ");
    assert_eq!(got, "$25 hash-max-listpack-entries $1 7 $23 hash-max-listpack-value $2 64");
    assert!(c.call(&["CONFIG", "SET", "maxmemory", "1"]).contains("CONFIG SET failed"));
    let mixed = c.call(&["CONFIG", "SET", "hz", "50", "no-such-thing", "1"]);
    assert!(mixed.contains("Unknown option"), "{mixed}");
    assert_eq!(c.call(&["CONFIG", "GET", "hz"]), "*2");
    assert_eq!(lines(&mut c, 4)[3], "10", "nothing of a refused CONFIG SET applies");
    assert_eq!(c.call(&["CONFIG", "GET", "proto-max-bulk-len"]), "*2");
    assert_eq!(lines(&mut c, 4)[3], "16777216");
    assert_eq!(c.call(&["CONFIG", "RESETSTAT"]), "+OK");

    // COMMAND from Keel's table; CLIENT LIST, INFO and KILL; DEBUG SLEEP.
    let count: i64 = c.call(&["COMMAND", "COUNT"])[1..].parse().unwrap();
    assert!(count > 50, "{count}");
    assert_eq!(c.call(&["COMMAND", "GETKEYS", "MSET", "a", "1", "b", "2"]), "*2");
    assert_eq!(lines(&mut c, 4).join(" "), "$1 a $1 b");
    assert!(c.call(&["COMMAND", "GETKEYS", "PING"]).contains("no key arguments"));
    assert_eq!(c.call(&["COMMAND", "INFO", "get", "nosuch"]), "*2");
    assert_eq!(lines(&mut c, 5).join(" "), "*10 $3 get :2 *2");
    let rest: Vec<String> = lines(&mut c, 12);
    assert_eq!(rest.last().map(String::as_str), Some("*-1"), "{rest:?}");
    assert_eq!(c.call(&["CLIENT", "SETNAME", "tester"]), "+OK");
    let mut other = Conn::open(cluster.client_addrs()[1]);
    assert_eq!(other.call(&["CLIENT", "SETNAME", "victim"]), "+OK");
    let other_id = other.call(&["CLIENT", "ID"])[1..].to_string();
    let info = c.bulk(&["CLIENT", "INFO"]).unwrap();
    assert!(info.contains(" name=tester ") && info.contains(" db=0 "), "{info}");
    assert!(c.call(&["CLIENT", "LIST"]).starts_with('$'));
    let all = c.line(); // the lines end in LF, the bulk string in CRLF
    assert!(all.contains("name=victim") && all.contains("name=tester"), "{all}");
    assert_eq!(c.call(&["CLIENT", "KILL", "ID", &other_id]), ":1");
    assert!(other.closed(), "the killed connection is closed");
    let left = std::time::Duration::from_secs(5);
    let gone = common::wait_until(left, || c.call(&["CLIENT", "KILL", "ID", &other_id]) == ":0");
    assert!(gone, "it left the list");
    assert_eq!(c.call(&["CLIENT", "KILL", "127.0.0.1:1"]), "-ERR No such client");
    assert!(c.call(&["CLIENT", "TRACKING", "on"]).contains("not supported"));
    assert_eq!(c.call(&["CLIENT", "NO-EVICT", "on"]), "+OK");
    let slept = std::time::Instant::now();
    assert_eq!(c.call(&["DEBUG", "SLEEP", "0.2"]), "+OK");
    assert!(slept.elapsed() >= std::time::Duration::from_millis(200));

    // MULTI: a watch checked with nothing but PING queued; in-place changes queued.
    assert_eq!(c.call(&["WATCH", "x1"]), "+OK");
    assert_eq!(c.call(&["SET", "x1", "changed"]), "+OK");
    assert_eq!(c.call(&["MULTI"]), "+OK");
    assert_eq!(c.call(&["PING"]), "+QUEUED");
    assert_eq!(c.call(&["EXEC"]), "*-1", "the watched key changed");
    assert_eq!(c.call(&["WATCH", "x1"]), "+OK");
    assert_eq!(c.call(&["MULTI"]), "+OK");
    for words in [
        &["PING"][..],
        &["INCRBYFLOAT", "fl", "1.5"],
        &["APPEND", "x1", "!"],
        &["STRLEN", "x1"],
        &["CONFIG", "SET", "hz", "20"],
        &["SAVE"],
    ] {
        let reply = c.call(words);
        if words[0] == "SAVE" {
            assert!(reply.contains("not allowed inside a transaction"), "{reply}");
        } else {
            assert_eq!(reply, "+QUEUED", "{words:?}");
        }
    }
    assert!(c.call(&["EXEC"]).starts_with("-EXECABORT"), "SAVE discarded it");
    assert_eq!(c.call(&["CONFIG", "GET", "hz"]), "*2");
    assert_eq!(lines(&mut c, 4)[3], "10", "a discarded CONFIG SET never applies");
    assert_eq!(c.call(&["MULTI"]), "+OK");
    for words in [&["INCRBYFLOAT", "fl", "1.5"][..], &["APPEND", "x1", "!"], &["STRLEN", "x1"]] {
        assert_eq!(c.call(words), "+QUEUED");
    }
    assert_eq!(c.call(&["EXEC"]), "*3");
    assert_eq!(lines(&mut c, 4).join(" "), "$3 1.5 :8 :8");
    assert_eq!(
        c.call(&["INCRBYFLOAT", "fl", "+inf"]),
        "-ERR increment would produce NaN or Infinity"
    );

    // Keel's options after the Redis arguments: DURABILITY on writes, LEVEL on reads.
    assert_eq!(c.call(&["APPEND", "x1", "?", "DURABILITY", "durable"]), ":9");
    assert_eq!(c.call(&["STRLEN", "x1", "LEVEL", "any"]), ":9");
    let tail = c.bulk(&["GETRANGE", "x1", "-2", "-1", "LEVEL", "monotonic"]);
    assert_eq!(tail.as_deref(), Some("!?"));
    assert_eq!(c.call(&["EXPIRE", "x1", "100", "DURABILITY", "replicated"]), ":1");
    assert_eq!(c.call(&["COPY", "x1", "x2", "DURABILITY", "durable"]), ":1");
    assert_eq!(c.call(&["APPEND", "durability", "memory"]), ":6", "a key named durability");
    assert!(c.call(&["STRLEN", "x1", "LEVEL", "sometimes"]).starts_with("-ERR"));
    assert_eq!(c.call(&["SET", "k", "v", "EX", "100"]), "+OK");
    assert_eq!(c.call(&["EXPIRE", "k", "200", "LT", "XX"]), ":0", "XX LT: not later");
    assert_eq!(c.call(&["EXPIRE", "k", "50", "LT", "XX"]), ":1");
    assert_eq!(c.call(&["SET", "p", "v"]), "+OK");
    assert_eq!(c.call(&["EXPIRE", "p", "50", "LT", "XX"]), ":0", "XX LT: none to shorten");

    // A value of 4 MB, as Redis's suite sends, written and read back whole.
    let big = "abcd".repeat(1_000_000);
    assert_eq!(c.call(&["SET", "big", &big]), "+OK");
    assert_eq!(c.call(&["GET", "big"]), "$4000000");
    assert_eq!(c.line().len(), 4_000_002);
    assert!(c.call(&["SETRANGE", "big", "536870000", "x"]).contains("maximum allowed size"));
    common::finish(cluster);
}
