//! Keyspace events: each command's name per key, `new` and `del` around it, nothing for
//! a command that changed nothing, a failed transaction's events dropped, expiry's
//! `expired`, and nothing recorded while off.

use super::*;
use keel_types::coll::{CollOp, End};
use keel_types::Durability;

fn entry(index: u64, payload: EntryPayload) -> Entry {
    Entry { epoch: Epoch(1), index: LogIndex(index), payload }
}

fn v(s: &str) -> Value {
    Value::copy_from_slice(s.as_bytes())
}

fn coll(key: &str, op: CollOp) -> Command {
    Command::Coll { key: v(key), op: Box::new(op) }
}

/// Applies `command` as the next entry and returns the events it recorded, as
/// `event key` lines.
fn run(kv: &mut Kv, command: Command) -> Vec<String> {
    let index = kv.applied_index().0 + 1;
    let payload = EntryPayload::Write {
        client: ClientId(1),
        request: RequestId(index),
        durability: Durability::Memory,
        command,
    };
    kv.apply(&entry(index, payload));
    taken(kv)
}

fn taken(kv: &mut Kv) -> Vec<String> {
    kv.take_events()
        .into_iter()
        .map(|e| format!("{} {}", e.event, String::from_utf8_lossy(&e.key)))
        .collect()
}

fn set(key: &str, ttl: Ttl) -> Command {
    Command::Set { key: v(key), value: v("x"), cond: SetCond::Always, ttl, now_ms: 1_000 }
}

#[test]
fn each_change_is_named_with_new_and_del_around_it() {
    let mut kv = Kv::new(10);
    kv.record_events(true);
    assert_eq!(run(&mut kv, set("foo", Ttl::Clear)), ["new foo", "set foo"]);
    assert_eq!(run(&mut kv, set("foo", Ttl::Clear)), ["set foo"], "not new the second time");
    let push = |values: &[&str]| CollOp::Push {
        end: End::Front,
        values: values.iter().map(|s| v(s)).collect(),
        only_existing: false,
    };
    assert_eq!(run(&mut kv, coll("l", push(&["a"]))), ["new l", "lpush l"]);
    let pop = CollOp::Pop { end: End::Back, count: None };
    assert_eq!(run(&mut kv, coll("l", pop.clone())), ["rpop l", "del l"], "its last element");
    assert!(run(&mut kv, coll("l", pop)).is_empty(), "nothing popped, nothing said");
    let members = |m: &[&str]| m.iter().map(|s| v(s)).collect::<Vec<_>>();
    assert_eq!(run(&mut kv, coll("s", CollOp::SAdd { members: members(&["a"]) })).len(), 2);
    assert!(run(&mut kv, coll("s", CollOp::SAdd { members: members(&["a"]) })).is_empty());
    assert!(run(&mut kv, coll("s", CollOp::SRem { members: members(&["x"]) })).is_empty());
    run(&mut kv, coll("dst", push(&["z"])));
    let lmove = CollOp::LMove { to: v("dst"), from: End::Front, to_end: End::Back };
    run(&mut kv, coll("src", push(&["a", "b"])));
    assert_eq!(run(&mut kv, coll("src", lmove)), ["lpop src", "rpush dst"]);
    let rename =
        Command::Transfer { from: v("foo"), to: v("bar"), replace: true, remove_source: true };
    assert_eq!(run(&mut kv, rename), ["new bar", "rename_to bar", "rename_from foo"]);
    let expire = Command::Expire {
        key: v("bar"),
        ttl: Ttl::After(10),
        cond: keel_types::ExpireCond::Always,
        now_ms: 1_000,
    };
    assert_eq!(run(&mut kv, expire), ["expire bar"]);
    assert_eq!(run(&mut kv, Command::Delete { key: v("bar") }), ["del bar"]);
    assert!(run(&mut kv, Command::Flush { db: None }).is_empty(), "FLUSHALL says nothing");
}

#[test]
fn a_failed_transaction_records_nothing_and_expiry_records_expired() {
    let mut kv = Kv::new(10);
    kv.record_events(true);
    run(
        &mut kv,
        coll("l", CollOp::Push { end: End::Back, values: vec![v("a")], only_existing: false }),
    );
    let ops = vec![set("k", Ttl::Clear), Command::Incr { key: v("l"), delta: 1 }];
    assert!(
        run(&mut kv, Command::Multi { ops, watch: vec![] }).is_empty(),
        "WRONGTYPE: all undone"
    );
    let ops = vec![set("k", Ttl::Clear), Command::Incr { key: v("n"), delta: 1 }];
    let events = run(&mut kv, Command::Multi { ops, watch: vec![] });
    assert_eq!(events, ["new k", "set k", "new n", "incrby n"]);
    assert_eq!(run(&mut kv, set("t", Ttl::After(5))), ["new t", "set t", "expire t"]);
    let index = kv.applied_index().0 + 1;
    kv.apply(&entry(index, EntryPayload::Reap { now_ms: 2_000, keys: vec![v("t")] }));
    assert_eq!(taken(&mut kv), ["expired t"]);
}

#[test]
fn nothing_is_recorded_while_off_and_a_database_key_keeps_its_prefix() {
    let mut kv = Kv::new(10);
    assert!(run(&mut kv, set("a", Ttl::Clear)).is_empty());
    kv.record_events(true);
    let key = keel_types::db_key(9, b"a");
    let command = Command::Set {
        key: key.clone(),
        value: v("x"),
        cond: SetCond::Always,
        ttl: Ttl::Clear,
        now_ms: 0,
    };
    run(&mut kv, command);
    kv.record_events(false);
    assert!(kv.take_events().is_empty(), "turned off: what was not taken is gone");
    kv.record_events(true);
    let index = kv.applied_index().0 + 1;
    let payload = EntryPayload::Write {
        client: ClientId(1),
        request: RequestId(index),
        durability: Durability::Memory,
        command: Command::Delete { key: key.clone() },
    };
    kv.apply(&entry(index, payload));
    let events = kv.take_events();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].key, key, "the host strips the prefix and names database 9");
}
