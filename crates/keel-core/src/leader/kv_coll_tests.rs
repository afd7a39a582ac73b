//! The state machine's collections: each family's writes and reads, `WRONGTYPE`, a key
//! leaving with its last element, and collections through rollback, snapshots, digests
//! and transfers.

use super::*;
use keel_types::coll::{
    Algebra, Answer, CollOp, CollRead, End, ScoreBound, ZAddFlags, ZBy, ZRangeSpec,
};
use keel_types::Durability;

fn write(index: u64, command: Command) -> Entry {
    let payload = EntryPayload::Write {
        client: ClientId(1),
        request: RequestId(index),
        durability: Durability::Memory,
        command,
    };
    Entry { epoch: Epoch(1), index: LogIndex(index), payload }
}

fn v(s: &str) -> Value {
    Value::copy_from_slice(s.as_bytes())
}

fn coll(key: &str, op: CollOp) -> Command {
    Command::Coll { key: v(key), op: Box::new(op) }
}

/// Applies `command` as the next entry; its answer.
fn run(kv: &mut Kv, command: Command) -> Result<Answer, KeelError> {
    let index = kv.applied_index().0 + 1;
    match kv.apply(&write(index, command)) {
        Applied::Write(Ok(CommandResult::Answer { answer, .. })) => Ok(answer),
        Applied::Write(Ok(other)) => panic!("{other:?}"),
        Applied::Write(Err(e)) => Err(e),
        Applied::Noop => panic!("a no-op"),
    }
}

fn read(kv: &Kv, key: &str, op: CollRead) -> Result<Answer, KeelError> {
    match kv.read_coll(&v(key), &op).0 {
        Ok(CommandResult::Answer { answer, .. }) => Ok(answer),
        Ok(other) => panic!("{other:?}"),
        Err(e) => Err(e),
    }
}

fn bulks(items: &[&str]) -> Answer {
    Answer::Array(items.iter().map(|s| Answer::Bulk(v(s))).collect())
}

#[test]
fn each_family_writes_and_reads_and_the_wrong_type_is_refused() {
    let mut kv = Kv::new(10);
    let pairs = vec![(v("f"), v("1")), (v("g"), v("2"))];
    assert_eq!(
        run(&mut kv, coll("h", CollOp::HSet { pairs, only_new: false })),
        Ok(Answer::Int(2))
    );
    let by = CollOp::HIncrBy { field: v("f"), delta: 41 };
    assert_eq!(run(&mut kv, coll("h", by)), Ok(Answer::Int(42)));
    let push =
        CollOp::Push { end: End::Back, values: vec![v("a"), v("b"), v("c")], only_existing: false };
    assert_eq!(run(&mut kv, coll("l", push)), Ok(Answer::Int(3)));
    assert_eq!(read(&kv, "l", CollRead::LRange(0, -1)), Ok(bulks(&["a", "b", "c"])));
    let moved = CollOp::LMove { to: v("l2"), from: End::Front, to_end: End::Back };
    assert_eq!(run(&mut kv, coll("l", moved)), Ok(Answer::Bulk(v("a"))));
    assert_eq!(
        run(&mut kv, coll("s", CollOp::SAdd { members: vec![v("x"), v("y"), v("x")] })),
        Ok(Answer::Int(2))
    );
    let flags = ZAddFlags::default();
    let zpairs =
        vec![(2.0f64.to_bits(), v("b")), (1.0f64.to_bits(), v("a")), (3.0f64.to_bits(), v("c"))];
    assert_eq!(run(&mut kv, coll("z", CollOp::ZAdd { flags, pairs: zpairs })), Ok(Answer::Int(3)));
    let low = ScoreBound { score: 1.0f64.to_bits(), open: true };
    let high = ScoreBound { score: f64::INFINITY.to_bits(), open: false };
    let spec = ZRangeSpec { by: ZBy::Score(low, high), rev: true, limit: None };
    assert_eq!(
        read(&kv, "z", CollRead::ZRange { spec, with_scores: false }),
        Ok(bulks(&["c", "b"]))
    );
    assert_eq!(read(&kv, "z", CollRead::ZRank { member: v("c"), rev: true }), Ok(Answer::Int(0)));
    // Every family refuses another's key; a string refuses them all, and they it.
    assert_eq!(read(&kv, "h", CollRead::LLen), Err(KeelError::WrongType));
    assert_eq!(
        run(&mut kv, coll("l", CollOp::SAdd { members: vec![v("m")] })),
        Err(KeelError::WrongType)
    );
    kv.apply(&write(kv.applied_index().0 + 1, Command::Put { key: v("str"), value: v("1") }));
    assert_eq!(read(&kv, "str", CollRead::ZCard), Err(KeelError::WrongType));
    assert!(matches!(kv.read_string(b"h"), Err(KeelError::WrongType)));
    let incr = Command::Incr { key: v("s"), delta: 1 };
    assert_eq!(
        kv.apply(&write(kv.applied_index().0 + 1, incr)),
        Applied::Write(Err(KeelError::WrongType))
    );
    assert_eq!(read(&kv, "s", CollRead::Type), Ok(Answer::Status("set".into())));
    // A key leaves with its last element.
    let pop = CollOp::Pop { end: End::Front, count: Some(10) };
    assert_eq!(run(&mut kv, coll("l", pop)), Ok(bulks(&["b", "c"])));
    assert_eq!(read(&kv, "l", CollRead::Type), Ok(Answer::Status("none".into())));
    assert_eq!(kv.count(0), 5, "h, l2, s, z, str, and not l");
    // A set combined into another key, in one entry.
    let store = CollOp::SStore { how: Algebra::Union, sources: vec![v("s"), v("nothing")] };
    assert_eq!(run(&mut kv, coll("u", store)), Ok(Answer::Int(2)));
    // With no source (no client sends one; the fuzzer made a peer's entry of it): refused
    // by validation, and an empty result if applied anyway, never a panic.
    for how in [Algebra::Inter, Algebra::Union, Algebra::Diff] {
        let store = CollOp::SStore { how, sources: vec![] };
        let limits = keel_types::Limits::default();
        assert!(store.validate(&limits).is_err(), "{how:?} with no source validated");
        assert_eq!(run(&mut kv, coll("none", store)), Ok(Answer::Int(0)), "{how:?}");
    }
}

#[test]
fn collections_roll_back_round_trip_through_snapshots_and_keep_the_digest() {
    let mut kv = Kv::new(10);
    let push = |values: &[&str]| {
        coll(
            "l",
            CollOp::Push {
                end: End::Back,
                values: values.iter().map(|s| v(s)).collect(),
                only_existing: false,
            },
        )
    };
    run(&mut kv, push(&["a", "b"])).unwrap();
    run(
        &mut kv,
        coll(
            "z",
            CollOp::ZAdd { flags: ZAddFlags::default(), pairs: vec![(1.5f64.to_bits(), v("m"))] },
        ),
    )
    .unwrap();
    let digest = kv.digest_at(LogIndex(2));
    let bytes = kv.encode_at(LogIndex(2));
    let state = kv.state_bytes();
    run(&mut kv, push(&["c"])).unwrap();
    run(&mut kv, coll("z", CollOp::ZRem { members: vec![v("m")] })).unwrap();
    assert_eq!(kv.encode_at(LogIndex(2)), bytes, "the state as of 2 through the undo records");
    kv.rollback_after(LogIndex(2), Epoch(1));
    assert_eq!((kv.digest_at(LogIndex(2)), kv.state_bytes()), (digest, state));
    assert_eq!(read(&kv, "l", CollRead::LRange(0, -1)), Ok(bulks(&["a", "b"])));
    let restored = Kv::decode(&bytes, Version::new(1, 2), 10).unwrap();
    assert_eq!((restored.digest_at(LogIndex(2)), restored.state_bytes()), (digest, state));
    assert_eq!(
        read(&restored, "z", CollRead::ZScore { members: vec![v("m")], many: false }),
        Ok(Answer::Double(1.5f64.to_bits()))
    );
    // A rename moves the collection; a copy shares it.
    let rename =
        Command::Transfer { from: v("l"), to: v("l3"), replace: true, remove_source: true };
    kv.apply(&write(3, rename));
    assert_eq!(read(&kv, "l3", CollRead::LLen), Ok(Answer::Int(2)));
    assert_eq!(read(&kv, "l", CollRead::Type), Ok(Answer::Status("none".into())));
}

#[test]
fn an_answer_past_the_bound_is_refused_before_it_is_built() {
    let mut kv = Kv::new(10);
    run(&mut kv, coll("s", CollOp::SAdd { members: vec![v("x")] })).unwrap();
    let huge = CollRead::SRandMember(Some(-(1 << 40)));
    assert!(matches!(read(&kv, "s", huge), Err(KeelError::InvalidArgument(_))));
    let huge = CollRead::HRandField { count: Some(i64::MIN + 1), with_values: true };
    run(&mut kv, coll("h", CollOp::HSet { pairs: vec![(v("f"), v("1"))], only_new: false }))
        .unwrap();
    assert!(matches!(read(&kv, "h", huge), Err(KeelError::InvalidArgument(_))));
}

#[test]
fn smove_of_a_member_the_destination_holds_leaves_the_destination_unchanged() {
    let mut kv = Kv::new(10);
    let members = |m: &[&str]| m.iter().map(|s| v(s)).collect::<Vec<_>>();
    run(&mut kv, coll("src", CollOp::SAdd { members: members(&["a", "b"]) })).unwrap();
    run(&mut kv, coll("dst", CollOp::SAdd { members: members(&["a"]) })).unwrap();
    let before = kv.item(b"dst").expect("there").version;
    let moved = run(&mut kv, coll("src", CollOp::SMove { to: v("dst"), member: v("a") }));
    assert_eq!(moved, Ok(Answer::Int(1)));
    assert_eq!(kv.item(b"dst").expect("there").version, before, "a WATCH of it holds");
    assert_eq!(read(&kv, "src", CollRead::SCard), Ok(Answer::Int(1)), "left the source");
}

#[test]
fn sort_orders_by_number_or_bytes_and_store_replaces_the_destination() {
    use keel_types::coll::SortSpec;
    let mut kv = Kv::new(4);
    let push = |values: &[&str]| CollOp::Push {
        end: End::Back,
        values: values.iter().map(|s| v(s)).collect(),
        only_existing: false,
    };
    run(&mut kv, coll("l", push(&["3", "1", "10", "2", "1.5"]))).unwrap();
    let bulks =
        |values: &[&str]| Answer::Array(values.iter().map(|s| Answer::Bulk(v(s))).collect());
    let sort = |spec: SortSpec| CollRead::Sort(spec);
    assert_eq!(read(&kv, "l", sort(SortSpec::default())), Ok(bulks(&["1", "1.5", "2", "3", "10"])));
    let alpha = SortSpec { alpha: true, desc: true, limit: Some((1, 2)), ..SortSpec::default() };
    assert_eq!(read(&kv, "l", sort(alpha)), Ok(bulks(&["2", "10"])), "by bytes, highest first");
    let unsorted = SortSpec { unsorted: true, limit: Some((3, -1)), ..SortSpec::default() };
    assert_eq!(read(&kv, "l", sort(unsorted)), Ok(bulks(&["2", "1.5"])));
    run(&mut kv, coll("w", push(&["x"]))).unwrap();
    assert!(read(&kv, "w", sort(SortSpec::default())).is_err(), "no number");
    assert_eq!(read(&kv, "none", sort(SortSpec::default())), Ok(bulks(&[])));
    // STORE: the destination becomes the list, whatever it held; none deletes it.
    let store = |source: &str| CollOp::SortStore { source: v(source), spec: SortSpec::default() };
    let index = kv.applied_index().0 + 1;
    kv.apply(&write(index, Command::Put { key: v("d"), value: v("string") }));
    assert_eq!(run(&mut kv, coll("d", store("l"))), Ok(Answer::Int(5)));
    let all = CollRead::LRange(0, -1);
    assert_eq!(read(&kv, "d", all.clone()), Ok(bulks(&["1", "1.5", "2", "3", "10"])));
    assert_eq!(run(&mut kv, coll("d", store("none"))), Ok(Answer::Int(0)));
    assert_eq!(kv.get(b"d").0, None, "an empty result deletes the destination");
    assert!(run(&mut kv, coll("d", store("w"))).is_err(), "no number: nothing stored");
}
