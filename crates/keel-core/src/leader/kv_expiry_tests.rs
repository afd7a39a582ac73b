//! The state machine's expiry: `SET` with its options, `EXPIRE` and its conditions, the
//! leader's expiry entries, and expiry through rollback, snapshots and digests.

use super::*;
use keel_types::Durability;

const NOW: u64 = 1_000_000;

fn entry(index: u64, payload: EntryPayload) -> Entry {
    Entry { epoch: Epoch(1), index: LogIndex(index), payload }
}

fn write(index: u64, command: Command) -> Entry {
    let payload = EntryPayload::Write {
        client: ClientId(1),
        request: RequestId(index),
        durability: Durability::Memory,
        command,
    };
    entry(index, payload)
}

fn reap(index: u64, now_ms: u64, keys: &[&str]) -> Entry {
    let keys = keys.iter().map(|k| Key::copy_from_slice(k.as_bytes())).collect();
    entry(index, EntryPayload::Reap { now_ms, keys })
}

fn set(key: &str, value: &str, cond: SetCond, ttl: Ttl) -> Command {
    let (key, value) =
        (Key::copy_from_slice(key.as_bytes()), Value::copy_from_slice(value.as_bytes()));
    Command::Set { key, value, cond, ttl, now_ms: NOW }
}

fn expire(key: &str, ttl: Ttl, cond: ExpireCond) -> Command {
    Command::Expire { key: Key::copy_from_slice(key.as_bytes()), ttl, cond, now_ms: NOW }
}

/// Applies `command` at `index`; whether it wrote (or set the expiry), and the value before.
fn run(kv: &mut Kv, index: u64, command: Command) -> (bool, Option<Value>) {
    match kv.apply(&write(index, command)) {
        Applied::Write(Ok(CommandResult::Cas { swapped, current, .. })) => (swapped, current),
        other => panic!("{other:?}"),
    }
}

fn value(kv: &Kv, key: &str) -> Option<String> {
    kv.get(key.as_bytes()).0.map(|v| String::from_utf8_lossy(&v).into_owned())
}

#[test]
fn set_options_write_by_their_condition_and_resolve_the_expiry_at_the_commands_time() {
    let mut kv = Kv::new(10);
    assert_eq!(run(&mut kv, 1, set("k", "a", SetCond::IfPresent, Ttl::Clear)), (false, None));
    assert_eq!(run(&mut kv, 2, set("k", "a", SetCond::IfAbsent, Ttl::After(500))), (true, None));
    assert_eq!(kv.expires_at(b"k"), Some(NOW + 500));
    assert_eq!(kv.next_expiry(), Some(NOW + 500));
    let found = run(&mut kv, 3, set("k", "b", SetCond::IfAbsent, Ttl::Clear));
    assert_eq!(found, (false, Some("a".into())), "NX on a present key");
    // KEEPTTL keeps it; a plain SET and a put clear it; an increment keeps it.
    run(&mut kv, 4, set("k", "c", SetCond::IfPresent, Ttl::Keep));
    assert_eq!((value(&kv, "k").as_deref(), kv.expires_at(b"k")), (Some("c"), Some(NOW + 500)));
    run(&mut kv, 5, set("n", "1", SetCond::Always, Ttl::At(NOW + 9)));
    kv.apply(&write(6, Command::Incr { key: Key::from_static(b"n"), delta: 2 }));
    assert_eq!((value(&kv, "n").as_deref(), kv.expires_at(b"n")), (Some("3"), Some(NOW + 9)));
    run(&mut kv, 7, set("k", "d", SetCond::Always, Ttl::Clear));
    assert_eq!(kv.expires_at(b"k"), None);
    kv.apply(&write(
        8,
        Command::Put { key: Key::from_static(b"n"), value: Value::from_static(b"x") },
    ));
    assert_eq!(kv.next_expiry(), None, "every expiry was cleared");
    // An expiry already past leaves a tombstone: written and expired at once.
    assert_eq!(run(&mut kv, 9, set("p", "v", SetCond::Always, Ttl::At(NOW))), (true, None));
    assert_eq!(kv.get(b"p"), (None, Some(Version::new(1, 9))));
}

#[test]
fn expire_conditions_follow_redis() {
    let mut kv = Kv::new(10);
    assert!(!run(&mut kv, 1, expire("k", Ttl::After(10), ExpireCond::Always)).0, "absent");
    run(&mut kv, 2, set("k", "v", SetCond::Always, Ttl::Clear));
    assert!(!run(&mut kv, 3, expire("k", Ttl::Clear, ExpireCond::IfSome)).0, "PERSIST, none set");
    assert!(!run(&mut kv, 4, expire("k", Ttl::After(10), ExpireCond::IfLater)).0, "GT vs none");
    assert!(run(&mut kv, 5, expire("k", Ttl::After(100), ExpireCond::IfEarlier)).0, "LT vs none");
    assert!(!run(&mut kv, 6, expire("k", Ttl::After(10), ExpireCond::IfNone)).0);
    assert!(!run(&mut kv, 7, expire("k", Ttl::After(200), ExpireCond::IfEarlier)).0);
    assert!(run(&mut kv, 8, expire("k", Ttl::After(200), ExpireCond::IfLater)).0);
    assert_eq!(kv.expires_at(b"k"), Some(NOW + 200));
    assert!(run(&mut kv, 9, expire("k", Ttl::Clear, ExpireCond::IfSome)).0, "PERSIST");
    assert_eq!(kv.expires_at(b"k"), None);
    // An expiry in the past deletes the key, and says so.
    assert!(run(&mut kv, 10, expire("k", Ttl::At(0), ExpireCond::Always)).0);
    assert_eq!(value(&kv, "k"), None);
    assert_eq!(kv.update_index(b"k"), LogIndex(10), "a tombstone at the expiry");
    // `XX LT`: only a key with an expiry, only to an earlier one.
    let xx_lt = ExpireCond::IfSomeEarlier;
    run(&mut kv, 11, set("k", "v", SetCond::Always, Ttl::Clear));
    assert!(!run(&mut kv, 12, expire("k", Ttl::After(100), xx_lt)).0, "XX LT vs none");
    run(&mut kv, 13, expire("k", Ttl::After(200), ExpireCond::Always));
    assert!(!run(&mut kv, 14, expire("k", Ttl::After(300), xx_lt)).0, "XX LT, later");
    assert!(run(&mut kv, 15, expire("k", Ttl::After(150), xx_lt)).0, "XX LT, earlier");
    assert_eq!(kv.expires_at(b"k"), Some(NOW + 150));
}

#[test]
fn an_expiry_entry_deletes_only_keys_still_due_and_rolls_back() {
    let mut kv = Kv::new(10);
    run(&mut kv, 1, set("a", "1", SetCond::Always, Ttl::At(NOW + 10)));
    run(&mut kv, 2, set("b", "2", SetCond::Always, Ttl::At(NOW + 20)));
    run(&mut kv, 3, set("c", "3", SetCond::Always, Ttl::Clear));
    assert_eq!(kv.due_keys(NOW + 15, 64), vec![Key::from_static(b"a")]);
    let digest = kv.applied_digest();
    // `b` is not due at the entry's time and `c` has no expiry: only `a` goes.
    kv.apply(&reap(4, NOW + 15, &["a", "b", "c"]));
    assert_eq!(
        (value(&kv, "a"), value(&kv, "b"), value(&kv, "c")),
        (None, Some("2".into()), Some("3".into()))
    );
    assert_eq!(kv.next_expiry(), Some(NOW + 20));
    kv.rollback_after(LogIndex(3), Epoch(1));
    assert_eq!(value(&kv, "a").as_deref(), Some("1"));
    assert_eq!(kv.next_expiry(), Some(NOW + 10), "the expiry index is rolled back with the items");
    assert_eq!(kv.applied_digest(), digest);
}

#[test]
fn snapshots_keep_expiries_and_digests_count_them() {
    let mut kv = Kv::new(10);
    run(&mut kv, 1, set("a", "1", SetCond::Always, Ttl::At(NOW + 10)));
    run(&mut kv, 2, set("b", "2", SetCond::Always, Ttl::Clear));
    let bytes = kv.encode_at(LogIndex(2));
    assert_eq!(&bytes[..8], SNAPSHOT_MAGIC);
    let back = Kv::decode(&bytes, Version::new(1, 2), 10).expect("decodes");
    assert_eq!(back.expires_at(b"a"), Some(NOW + 10));
    assert_eq!(back.next_expiry(), Some(NOW + 10));
    assert_eq!(back.applied_digest(), kv.applied_digest());
    // The same items without the expiry digest differently.
    let mut plain = Kv::new(10);
    run(&mut plain, 1, set("a", "1", SetCond::Always, Ttl::Clear));
    run(&mut plain, 2, set("b", "2", SetCond::Always, Ttl::Clear));
    assert_ne!(plain.applied_digest(), kv.applied_digest());
    // An item with an expiry in a snapshot of the format before them is refused.
    let mut old = bytes.clone();
    old[..8].copy_from_slice(SNAPSHOT_MAGIC_V3);
    assert!(Kv::decode(&old, Version::new(1, 2), 10).unwrap_err().contains("item flag 2"));
    // One without: decodes as it always did.
    let v3 = plain.encode_at(LogIndex(2));
    let mut v3 = v3.clone();
    v3[..8].copy_from_slice(SNAPSHOT_MAGIC_V3);
    v3.truncate(v3.len() - 17); // v6's last field and v7's
    assert_eq!(
        Kv::decode(&v3, Version::new(1, 2), 10).unwrap().applied_digest(),
        plain.applied_digest()
    );
}

fn modify(key: &str, op: keel_types::Modify) -> Command {
    Command::Modify { key: Key::copy_from_slice(key.as_bytes()), op, now_ms: NOW }
}

/// Applies `command` at `index`; its `Modified` result as `(value, number, changed)`.
fn changed(kv: &mut Kv, index: u64, command: Command) -> (Option<String>, i64, bool) {
    match kv.apply(&write(index, command)) {
        Applied::Write(Ok(CommandResult::Modified { value, number, version })) => {
            let text = value.map(|v| String::from_utf8_lossy(&v).into_owned());
            (text, number, version.is_some())
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn in_place_changes_keep_the_expiry_and_transfers_carry_it() {
    use keel_types::Modify;
    let mut kv = Kv::new(10);
    run(&mut kv, 1, set("k", "ab", SetCond::Always, Ttl::At(NOW + 50)));
    let append = modify("k", Modify::Append(Value::from_static(b"cd")));
    assert_eq!(changed(&mut kv, 2, append), (None, 4, true));
    assert_eq!(kv.expires_at(b"k"), Some(NOW + 50), "APPEND keeps the expiry");
    let bit = modify("k", Modify::SetBit { offset: 39, on: true });
    assert_eq!(changed(&mut kv, 3, bit), (None, 0, true));
    assert_eq!(kv.get(b"k").0.unwrap().len(), 5, "grown by a zero byte, then the bit set");
    let getex = modify("k", Modify::GetEx(Ttl::After(10)));
    assert!(changed(&mut kv, 4, getex).2);
    assert_eq!(kv.expires_at(b"k"), Some(NOW + 10));
    let float = modify("f", Modify::IncrByFloat(2.5f64.to_bits()));
    assert_eq!(changed(&mut kv, 5, float), (Some("2.5".into()), 0, true));
    let rename = Command::Transfer {
        from: Key::from_static(b"k"),
        to: Key::from_static(b"r"),
        replace: true,
        remove_source: true,
    };
    let digest = kv.applied_digest();
    assert_eq!(changed(&mut kv, 6, rename), (None, 1, true));
    assert_eq!(kv.expires_at(b"r"), Some(NOW + 10), "the expiry moved with the value");
    assert_eq!((kv.get(b"k").0, kv.next_expiry()), (None, Some(NOW + 10)));
    kv.rollback_after(LogIndex(5), Epoch(1));
    assert_eq!(kv.applied_digest(), digest, "a rolled-back rename leaves no trace");
    assert_eq!(kv.get(b"r").0, None);
    let getdel = modify("k", Modify::GetDel);
    assert!(changed(&mut kv, 6, getdel).0.is_some());
    assert_eq!(kv.next_expiry(), None);
}
