//! Scripts (`EVAL`, `EVALSHA`, `SCRIPT`) against real `keel server` processes: replies
//! converted as Redis converts them, a script's writes applied as one transaction that
//! no concurrent write interleaves with (checked by read-modify-write scripts racing on
//! one key from every node, which lose no update), `BUSY` past the threshold and
//! `SCRIPT KILL`, which leaves nothing of a killed script applied.

mod common;

use common::Conn;
use std::time::Duration;

#[test]
fn scripts_answer_as_redis_and_write_back_their_effects() {
    let (cluster, _) = common::cluster("scripting", |_| {});
    let mut c = Conn::open(cluster.client_addrs()[1]);
    let settled =
        common::wait_until(common::LEADER_WAIT, || c.call(&["SET", "s", "Hello"]) == "+OK");
    assert!(settled, "the cluster never accepted a write");
    let script = "redis.call('incrby', KEYS[1], ARGV[1]); return redis.call('get', KEYS[1])";
    assert_eq!(c.bulk(&["EVAL", script, "1", "n", "5"]).as_deref(), Some("5"));
    assert_eq!(c.bulk(&["EVAL", script, "1", "n", "5"]).as_deref(), Some("10"));
    assert_eq!(c.bulk(&["GET", "n"]).as_deref(), Some("10"), "written back");
    // Collections, and reads of what the script wrote before.
    let list =
        "redis.call('rpush', KEYS[1], 'a', 'b'); return redis.call('lrange', KEYS[1], 0, -1)";
    assert_eq!(c.call(&["EVAL", list, "1", "l"]), "*2");
    assert_eq!(
        (c.line(), c.line(), c.line(), c.line()),
        ("$1\r\n".into(), "a\r\n".into(), "$1\r\n".into(), "b\r\n".into())
    );
    assert_eq!(c.call(&["LLEN", "l"]), ":2");
    // Conversions: a number, a status, an error, a nested table, nil.
    assert_eq!(c.call(&["EVAL", "return 3.9", "0"]), ":3");
    assert_eq!(c.call(&["EVAL", "return redis.status_reply('FINE')", "0"]), "+FINE");
    assert_eq!(c.call(&["EVAL", "return redis.error_reply('MY error')", "0"]), "-MY error");
    assert_eq!(c.call(&["EVAL", "return nil", "0"]), "$-1");
    assert_eq!(c.call(&["EVAL", "return {1, {2, 'x'}}", "0"]), "*2");
    let nested: Vec<String> = (0..5).map(|_| c.line().trim_end().to_string()).collect();
    assert_eq!(nested, [":1", "*2", ":2", "$1", "x"]);
    // A command's error raises in call and is returned by pcall.
    let wrong = c.call(&["EVAL", "return redis.call('incr', KEYS[1])", "1", "l"]);
    assert!(wrong.starts_with("-WRONGTYPE"), "{wrong}");
    let caught = "local r = redis.pcall('incr', KEYS[1]); return r.err ~= nil";
    assert_eq!(c.call(&["EVAL", caught, "1", "l"]), ":1");
    // As Redis, a failing script keeps what it wrote before failing.
    let partial = "redis.call('set', KEYS[1], 'kept'); redis.call('incr', KEYS[2])";
    assert!(c.call(&["EVAL", partial, "2", "p", "l"]).starts_with("-WRONGTYPE"));
    assert_eq!(c.bulk(&["GET", "p"]).as_deref(), Some("kept"));
    // EVALSHA, SCRIPT EXISTS/FLUSH, the read-only form.
    let sha = c.bulk(&["SCRIPT", "LOAD", "return ARGV[1]"]).unwrap();
    assert_eq!(c.bulk(&["EVALSHA", &sha, "0", "hi"]).as_deref(), Some("hi"));
    assert_eq!(c.call(&["SCRIPT", "EXISTS", &sha, "0000"]), "*2");
    assert_eq!((c.line(), c.line()), (":1\r\n".into(), ":0\r\n".into()));
    assert_eq!(c.call(&["SCRIPT", "FLUSH"]), "+OK");
    assert!(c.call(&["EVALSHA", &sha, "0"]).starts_with("-NOSCRIPT"));
    let ro = c.call(&["EVAL_RO", "return redis.call('set', 'x', 1)", "0"]);
    assert!(ro.contains("not allowed from read-only scripts"), "{ro}");
    assert!(c.call(&["EVAL", "return 1", "-1"]).contains("can't be negative"));
    assert!(c.call(&["EVAL", "return 1", "3", "a"]).contains("greater than number of args"));
    let sub = c.call(&["EVAL", "return redis.call('subscribe', 'c')", "0"]);
    assert!(sub.contains("not allowed from script"), "{sub}");
    // The database the connection selected.
    assert_eq!(c.call(&["SELECT", "2"]), "+OK");
    assert_eq!(c.call(&["EVAL", "return redis.call('set', KEYS[1], 'two')", "1", "d"]), "+OK");
    assert_eq!(c.bulk(&["GET", "d"]).as_deref(), Some("two"));
    assert_eq!(c.call(&["SELECT", "0"]), "+OK");
    assert_eq!(c.call(&["EXISTS", "d"]), ":0");
    common::finish(cluster);
}

/// Read-modify-write scripts racing on one key from every node, beside plain `INCR`s:
/// the updates of the counter lost, and whether the list of the values the scripts read
/// lacks one (a push lost, or two scripts that read the same value).
fn race(name: &str, broken: bool) -> (usize, bool) {
    let (cluster, _) = common::cluster(name, |c| c.testing.unsafe_script_skip_watch = broken);
    let addrs = cluster.client_addrs();
    let mut c = Conn::open(addrs[0]);
    let settled = common::wait_until(common::LEADER_WAIT, || c.call(&["SET", "n", "0"]) == "+OK");
    assert!(settled, "the cluster never accepted a write");
    // Read, then write what was read plus one: without isolation two scripts read the
    // same value and one update is lost. Plain INCRs from other clients race with them.
    let script = "local v = tonumber(redis.call('get', KEYS[1])) \
                  redis.call('set', KEYS[1], v + 1) \
                  redis.call('rpush', KEYS[2], v) \
                  return v";
    let (scripts, each) = (3, 60);
    let mut threads = Vec::new();
    for t in 0..scripts {
        let addr = addrs[t % addrs.len()];
        threads.push(std::thread::spawn(move || {
            let mut c = Conn::open(addr);
            for _ in 0..each {
                let reply = c.call(&["EVAL", script, "2", "n", "seen"]);
                assert!(reply.starts_with(':'), "{reply}");
            }
        }));
    }
    let incrs = std::thread::spawn(move || {
        let mut c = Conn::open(addrs[2]);
        for _ in 0..each {
            assert!(c.call(&["INCR", "n"]).starts_with(':'));
        }
    });
    for thread in threads {
        thread.join().unwrap();
    }
    incrs.join().unwrap();
    let total = scripts * each + each;
    let n: usize = c.bulk(&["GET", "n"]).unwrap().parse().unwrap();
    let seen = c.call(&["EVAL", "return redis.call('lrange', KEYS[1], 0, -1)", "1", "seen"]);
    let len: usize = seen[1..].parse().unwrap();
    let mut values: Vec<u64> = (0..len)
        .map(|_| {
            c.line();
            c.line().trim_end().parse().unwrap()
        })
        .collect();
    values.sort_unstable();
    values.dedup();
    common::finish(cluster);
    // Every script pushed the value it read: fewer values, or the same one twice, is an
    // update lost or two scripts that read alike.
    (total - n, values.len() < scripts * each)
}

#[test]
fn racing_read_modify_write_scripts_lose_no_update() {
    let (lost, short) = race("scripting-race", false);
    assert_eq!(lost, 0, "no update lost");
    assert!(!short, "each script read a value of its own, and its push stayed");
}

/// The negative control: with the write-back's watch off, the same race loses updates.
#[test]
fn without_the_watch_racing_scripts_lose_updates() {
    let (lost, short) = race("scripting-race-control", true);
    eprintln!("without the watch: {lost} of the counter's 240 updates lost");
    assert!(lost > 0 && short, "the control changed nothing: lost {lost}, short {short}");
}

#[test]
fn a_runaway_script_makes_the_node_busy_until_it_is_killed_and_nothing_of_it_applies() {
    let (cluster, _) = common::cluster("scripting-busy", |_| {});
    let addr = cluster.client_addrs()[0];
    let mut c = Conn::open(addr);
    let settled = common::wait_until(common::LEADER_WAIT, || c.call(&["SET", "k", "1"]) == "+OK");
    assert!(settled, "the cluster never accepted a write");
    assert_eq!(c.call(&["CONFIG", "SET", "lua-time-limit", "50"]), "+OK");
    assert_eq!(c.call(&["SCRIPT", "KILL"]), "-NOTBUSY No scripts in execution right now.");
    let runaway = std::thread::spawn(move || {
        let mut r = Conn::open(addr);
        r.call(&["EVAL", "redis.call('set', KEYS[1], 'written') while true do end", "1", "k"])
    });
    let busy = common::wait_until(Duration::from_secs(10), || {
        let reply = c.call(&["GET", "k"]);
        if reply.starts_with('$') && reply != "$-1" {
            c.line();
        }
        reply.starts_with("-BUSY")
    });
    assert!(busy, "the node never answered BUSY");
    assert_eq!(c.call(&["MULTI"]), "+OK", "MULTI runs on a busy node, as on Redis");
    assert!(c.call(&["INCR", "k"]).starts_with("-BUSY"));
    assert!(c.call(&["EXEC"]).starts_with("-EXECABORT Transaction discarded because of: BUSY"));
    assert_eq!(c.call(&["SCRIPT", "KILL"]), "+OK");
    let killed = runaway.join().unwrap();
    assert!(killed.contains("killed by user"), "{killed}");
    assert_eq!(
        c.bulk(&["GET", "k"]).as_deref(),
        Some("1"),
        "the killed script's write was never applied"
    );
    assert_eq!(c.call(&["CONFIG", "GET", "busy-reply-threshold"]), "*2");
    assert_eq!(
        (c.line(), c.line(), c.line()),
        ("$20\r\n".into(), "busy-reply-threshold\r\n".into(), "$2\r\n".into())
    );
    common::finish(cluster);
}
