//! Tests of the causal checker: negative controls (each anomaly flagged with its kind,
//! its correct variant passing), and random valid histories from a tiny causal store on
//! which the checker and the saturation cross-check agree.

use super::history::*;
use super::{check, kind, parse, saturation, CausalReport};
use std::collections::{BTreeMap, BTreeSet};

// ----- building histories -----

fn id(node: u32, seq: u64) -> TxId {
    TxId { node, seq }
}

fn set(key: &str, value: &str) -> TxOp {
    TxOp::Update { key: key.into(), update: Update::Set { value: value.into() } }
}

fn add(key: &str, delta: i64) -> TxOp {
    TxOp::Update { key: key.into(), update: Update::Add { delta } }
}

fn s_add(key: &str, elem: &str) -> TxOp {
    TxOp::Update { key: key.into(), update: Update::SAdd { elem: elem.into() } }
}

fn s_rem(key: &str, elem: &str, seen: &[TxId]) -> TxOp {
    TxOp::Update {
        key: key.into(),
        update: Update::SRem { elem: elem.into(), seen: seen.to_vec() },
    }
}

fn read_reg(key: &str, value: Option<&str>) -> TxOp {
    TxOp::Read {
        key: key.into(),
        kind: Kind::Register,
        seen: Seen::Register { value: value.map(String::from) },
    }
}

fn read_counter(key: &str, value: i64) -> TxOp {
    TxOp::Read { key: key.into(), kind: Kind::Counter, seen: Seen::Counter { value } }
}

fn read_set(key: &str, kind: Kind, elems: &[&str]) -> TxOp {
    TxOp::Read {
        key: key.into(),
        kind,
        seen: Seen::Set { elems: elems.iter().map(|e| e.to_string()).collect() },
    }
}

fn done(vector: &[u64]) -> Outcome {
    Outcome::Committed { vector: vector.to_vec() }
}

/// A client transaction whose past is its snapshot.
fn tx(
    id: TxId,
    session: u64,
    dc: u32,
    snap: &[u64],
    at_ns: u64,
    ops: Vec<TxOp>,
    outcome: Outcome,
) -> ClientTx {
    let order = at_ns;
    ClientTx {
        id,
        session,
        dc,
        past: snap.to_vec(),
        snap: snap.to_vec(),
        at_ns,
        order,
        ops,
        outcome,
        strong: false,
        label: None,
    }
}

fn history(dcs: u32, f: u32, txs: Vec<ClientTx>) -> CausalHistory {
    CausalHistory { dcs, f, txs, ..CausalHistory::default() }
}

fn finals(dcs: &[u32], objects: &[(&str, Kind, Seen)]) -> Vec<FinalState> {
    dcs.iter()
        .map(|&dc| FinalState {
            dc,
            snap: None,
            objects: objects.iter().map(|(k, kind, s)| (k.to_string(), *kind, s.clone())).collect(),
        })
        .collect()
}

fn reg(value: &str) -> Seen {
    Seen::Register { value: Some(value.into()) }
}

const Z: [u64; 4] = [0; 4];

fn assert_holds(h: &CausalHistory) {
    let report = check(h);
    assert!(report.holds(), "expected ok, got {:#?}", report.violations);
}

fn assert_flags(h: &CausalHistory, expected: &str) -> CausalReport {
    let report = check(h);
    assert!(report.count(expected) > 0, "expected {expected}, got {:#?}", report.violations);
    report
}

// ----- negative controls -----

/// Alice deposits to Bob (u1), then notifies him (u2); Bob reads the note and his balance.
fn alice_bob(balance: i64) -> CausalHistory {
    history(
        3,
        1,
        vec![
            tx(id(0, 1), 1, 0, &Z, 10, vec![add("bob", 100)], done(&[1, 0, 0, 0])),
            tx(id(0, 2), 1, 0, &[1, 0, 0, 0], 20, vec![set("inbox", "note")], done(&[2, 0, 0, 0])),
            tx(
                id(1, 1),
                2,
                1,
                &[2, 0, 0, 0],
                30,
                vec![read_reg("inbox", Some("note")), read_counter("bob", balance)],
                done(&[2, 0, 0, 0]),
            ),
        ],
    )
}

#[test]
fn causal_alice_bob_sees_the_note_but_not_the_deposit() {
    assert_holds(&alice_bob(100));
    let report = assert_flags(&alice_bob(0), kind::RETURN_VALUE);
    assert_eq!(report.violations_total, 1, "{:#?}", report.violations);
}

/// The same with Bob's balance a register, which the saturation check sees.
fn alice_bob_register(balance: Option<&str>) -> CausalHistory {
    history(
        3,
        1,
        vec![
            tx(id(0, 1), 1, 0, &Z, 10, vec![set("bob", "100")], done(&[1, 0, 0, 0])),
            tx(id(0, 2), 1, 0, &[1, 0, 0, 0], 20, vec![set("inbox", "note")], done(&[2, 0, 0, 0])),
            tx(
                id(1, 1),
                2,
                1,
                &[2, 0, 0, 0],
                30,
                vec![read_reg("inbox", Some("note")), read_reg("bob", balance)],
                done(&[2, 0, 0, 0]),
            ),
        ],
    )
}

/// A transaction writes x and y; a reader sees x's new value and y's old one.
fn atomic(y: &str) -> CausalHistory {
    history(
        3,
        1,
        vec![
            tx(id(0, 1), 1, 0, &Z, 10, vec![set("x", "x0"), set("y", "y0")], done(&[1, 0, 0, 0])),
            tx(
                id(0, 2),
                1,
                0,
                &[1, 0, 0, 0],
                20,
                vec![set("x", "x1"), set("y", "y1")],
                done(&[2, 0, 0, 0]),
            ),
            tx(
                id(1, 1),
                2,
                1,
                &[2, 0, 0, 0],
                30,
                vec![read_reg("x", Some("x1")), read_reg("y", Some(y))],
                done(&[2, 0, 0, 0]),
            ),
        ],
    )
}

#[test]
fn causal_atomic_visibility_a_reader_sees_half_a_transaction() {
    assert_holds(&atomic("y1"));
    assert_flags(&atomic("y0"), kind::RETURN_VALUE);
}

/// A session writes x, then its next transaction reads with snapshot `snap`.
fn read_your_writes(snap: &[u64], seen: Option<&str>) -> CausalHistory {
    history(
        3,
        1,
        vec![
            tx(id(0, 1), 1, 0, &Z, 10, vec![set("x", "a")], done(&[1, 0, 0, 0])),
            tx(id(0, 2), 1, 0, snap, 20, vec![read_reg("x", seen)], done(snap)),
        ],
    )
}

#[test]
fn causal_read_your_writes_across_transactions() {
    assert_holds(&read_your_writes(&[1, 0, 0, 0], Some("a")));
    let report = assert_flags(&read_your_writes(&Z, None), kind::SESSION);
    assert_eq!(report.count(kind::RETURN_VALUE), 0, "the read matches its own snapshot");
}

#[test]
fn causal_saturation_flags_the_register_controls_and_passes_their_correct_variants() {
    let controls = [
        (alice_bob_register(Some("100")), alice_bob_register(None)),
        (atomic("y1"), atomic("y0")),
        (read_your_writes(&[1, 0, 0, 0], Some("a")), read_your_writes(&Z, None)),
    ];
    for (good, bad) in &controls {
        assert!(saturation::applicable(good) && saturation::applicable(bad));
        assert_eq!(saturation::check(good), Ok(()));
        assert_holds(good);
        let violation = saturation::check(bad).expect_err("saturation flags the anomaly");
        assert_eq!(violation.kind, kind::NOT_CAUSAL);
        assert!(!check(bad).holds());
    }
}

/// Concurrent deposits of 100 and 200 at two data centers; every final state holds `value`.
fn counter_merge(value: i64) -> CausalHistory {
    let mut h = history(
        3,
        1,
        vec![
            tx(id(0, 1), 1, 0, &Z, 10, vec![add("acct", 100)], done(&[1, 0, 0, 0])),
            tx(id(1, 1), 2, 1, &Z, 10, vec![add("acct", 200)], done(&[0, 1, 0, 0])),
        ],
    );
    h.finals = finals(&[0, 1, 2], &[("acct", Kind::Counter, Seen::Counter { value })]);
    h
}

#[test]
fn causal_counter_merge_loses_no_update() {
    assert_holds(&counter_merge(300));
    assert_flags(&counter_merge(100), kind::CONVERGENCE);
}

/// Add-wins set: A adds e; then concurrently B adds e again and C removes the adds it
/// saw (only A's); a reader that saw all three, and the final states, hold `elems`.
fn add_wins(elems: &[&str]) -> CausalHistory {
    let mut h = history(
        3,
        1,
        vec![
            tx(id(0, 1), 1, 0, &Z, 10, vec![s_add("s", "e")], done(&[1, 0, 0, 0])),
            tx(id(0, 2), 1, 0, &[1, 0, 0, 0], 20, vec![s_add("s", "e")], done(&[2, 0, 0, 0])),
            tx(
                id(1, 1),
                2,
                1,
                &[1, 0, 0, 0],
                20,
                vec![s_rem("s", "e", &[id(0, 1)])],
                done(&[1, 1, 0, 0]),
            ),
            tx(
                id(2, 1),
                3,
                2,
                &[2, 1, 0, 0],
                30,
                vec![read_set("s", Kind::AwSet, elems)],
                done(&[2, 1, 0, 0]),
            ),
        ],
    );
    let seen = Seen::Set { elems: elems.iter().map(|e| e.to_string()).collect() };
    h.finals = finals(&[0, 1, 2], &[("s", Kind::AwSet, seen)]);
    h
}

#[test]
fn causal_add_wins_a_concurrent_add_survives_a_remove() {
    assert_holds(&add_wins(&["e"]));
    let report = assert_flags(&add_wins(&[]), kind::RETURN_VALUE);
    assert!(report.count(kind::CONVERGENCE) > 0);
}

#[test]
fn causal_add_wins_a_remove_that_saw_every_add_removes() {
    let h = |elems: &[&str]| {
        history(
            3,
            1,
            vec![
                tx(
                    id(0, 1),
                    1,
                    0,
                    &Z,
                    10,
                    vec![s_add("s", "e"), s_add("s", "f")],
                    done(&[1, 0, 0, 0]),
                ),
                tx(
                    id(1, 1),
                    2,
                    1,
                    &[1, 0, 0, 0],
                    20,
                    vec![s_add("s", "e"), s_rem("s", "e", &[id(0, 1), id(1, 1)])],
                    done(&[1, 1, 0, 0]),
                ),
                tx(
                    id(2, 1),
                    3,
                    2,
                    &[1, 1, 0, 0],
                    30,
                    vec![read_set("s", Kind::AwSet, elems)],
                    done(&[1, 1, 0, 0]),
                ),
            ],
        )
    };
    assert_holds(&h(&["f"]));
    assert_flags(&h(&["e", "f"]), kind::RETURN_VALUE);
}

/// Five data centers (f = 2): dc 1 reads a transaction of dc 0 that is stored at `at`.
fn uniform(stored_at: &[u32]) -> CausalHistory {
    let one = [1, 0, 0, 0, 0, 0];
    let mut h = history(
        5,
        2,
        vec![
            tx(id(0, 1), 1, 0, &[0; 6], 10, vec![set("x", "w")], done(&one)),
            tx(id(1, 1), 2, 1, &one, 100, vec![read_reg("x", Some("w"))], done(&one)),
        ],
    );
    h.stored = stored_at
        .iter()
        .map(|&dc| Stored { dc, origin: 0, through: 1, at_ns: 10 + 10 * u64::from(dc) })
        .collect();
    h
}

#[test]
fn causal_remote_transactions_are_visible_only_once_uniform() {
    assert_holds(&uniform(&[0, 1, 2]));
    assert_flags(&uniform(&[0, 1]), kind::NOT_UNIFORM);
    // Stored at three data centers, but not at the reader's.
    assert_flags(&uniform(&[0, 2, 3]), kind::NOT_UNIFORM);
    // Stored at three, but the third only after the read.
    let mut late = uniform(&[0, 1, 2]);
    late.stored[2].at_ns = 101;
    assert_flags(&late, kind::NOT_UNIFORM);
}

/// dc 0 commits w, a barrier returns with w in its past, dc 0 fails; the finals of dcs 1
/// and 2 hold x = w or not.
fn barrier(kept: bool, barrier: bool) -> CausalHistory {
    let mut h =
        history(3, 1, vec![tx(id(0, 1), 1, 0, &Z, 10, vec![set("x", "w")], done(&[1, 0, 0, 0]))]);
    h.syncs =
        vec![Sync { session: 1, dc: 0, past: vec![1, 0, 0, 0], barrier, at_ns: 20, order: 20 }];
    h.failed = vec![0];
    let x = [("x", Kind::Register, reg("w"))];
    h.finals = finals(&[1, 2], if kept { &x } else { &[] });
    h
}

#[test]
fn causal_lost_after_barrier() {
    assert_holds(&barrier(true, true));
    assert_flags(&barrier(false, true), kind::LOST_AFTER_BARRIER);
    // An attach promised it too (only a barrier names the violation).
    assert_flags(&barrier(false, false), kind::CONVERGENCE);
    // Without any sync, a failed origin's transaction may survive or not.
    for kept in [true, false] {
        let mut h = barrier(kept, true);
        h.syncs.clear();
        assert_holds(&h);
    }
}

#[test]
fn causal_remote_visible_before_uniform_then_lost_after_a_barrier() {
    // w of dc 0 is stored only there, but a reader at dc 1 sees it; its barrier at dc 1
    // returns (its own entry is uniform); dc 0 fails and the survivors never get w.
    let mut h = history(
        3,
        1,
        vec![
            tx(id(0, 1), 1, 0, &Z, 10, vec![set("x", "w")], done(&[1, 0, 0, 0])),
            tx(
                id(1, 1),
                2,
                1,
                &[1, 0, 0, 0],
                15,
                vec![read_reg("x", Some("w"))],
                done(&[1, 0, 0, 0]),
            ),
        ],
    );
    h.stored = vec![Stored { dc: 0, origin: 0, through: 1, at_ns: 5 }];
    h.syncs = vec![Sync {
        session: 2,
        dc: 1,
        past: vec![1, 0, 0, 0],
        barrier: true,
        at_ns: 20,
        order: 20,
    }];
    h.failed = vec![0];
    h.finals = finals(&[1, 2], &[]);
    let report = assert_flags(&h, kind::LOST_AFTER_BARRIER);
    assert!(report.count(kind::NOT_UNIFORM) > 0);
    // Had a survivor stored w (uniform before visible), the finals must hold it: its
    // absence is still a barrier's past lost.
    h.stored.push(Stored { dc: 1, origin: 0, through: 1, at_ns: 6 });
    assert_flags(&h, kind::LOST_AFTER_BARRIER);
    h.finals = finals(&[1, 2], &[("x", Kind::Register, reg("w"))]);
    assert_holds(&h);
}

/// dc 0's old life adds 1 (stored at dc 1) and 2 (stored nowhere else, shown to no
/// one); dc 0 is removed and taken back: its new life, from `1 << 62`, adds 4; dc 1's
/// stable entry for dc 0 then reaches the new life. The finals hold `value`.
fn new_life(value: i64, with_life: bool) -> CausalHistory {
    const LIFE: u64 = 1 << 62;
    let mut h = history(
        3,
        1,
        vec![
            tx(id(0, 1), 1, 0, &Z, 10, vec![add("x", 1)], done(&[1, 0, 0, 0])),
            tx(id(0, 2), 1, 0, &[1, 0, 0, 0], 20, vec![add("x", 2)], done(&[2, 0, 0, 0])),
            tx(id(0, 3), 2, 0, &[1, 0, 0, 0], 60, vec![add("x", 4)], done(&[LIFE + 5, 0, 0, 0])),
        ],
    );
    h.stored = vec![
        Stored { dc: 1, origin: 0, through: 1, at_ns: 15 },
        Stored { dc: 1, origin: 0, through: LIFE + 5, at_ns: 70 },
    ];
    if with_life {
        h.lives = vec![Life { dc: 0, from_ts: LIFE, since_ns: 50, cut: 1 }];
    }
    h.finals = finals(&[0, 1, 2], &[("x", Kind::Counter, Seen::Counter { value })]);
    h
}

#[test]
fn causal_a_data_center_taken_back_loses_only_its_old_life_unstored() {
    // The old life's transaction nobody else stored may be lost; the new life's may not.
    assert_holds(&new_life(5, true));
    assert_flags(&new_life(3, true), kind::CONVERGENCE);
    // What survived of the old life must stay.
    assert_flags(&new_life(4, true), kind::CONVERGENCE);
    // Without the life, the new life's stable entry claims the old one whole.
    assert_flags(&new_life(5, false), kind::CONVERGENCE);
}

#[test]
fn causal_a_session_let_go_on_past_its_lost_old_life_is_flagged() {
    // Session 1 committed x + 2 in data center 0's old life above the cut (1); after the
    // return, a transaction of the same session in the new life has a snapshot whose
    // entry is larger but does not cover what the session wrote: it was lost.
    const LIFE: u64 = 1 << 62;
    let after = |session| {
        let mut h = new_life(5, true);
        h.txs.push(tx(id(0, 4), session, 0, &[LIFE + 5, 0, 0, 0], 65, vec![], Outcome::Aborted));
        h
    };
    assert_flags(&after(1), kind::SESSION);
    // The same session started over (the engine refused its past): nothing to flag.
    assert_holds(&after(3));
}

/// Concurrent sets of x at dcs 0 and 1 (dc 1's wins: equal sums, higher origin).
fn divergence(at_dc2: &str) -> CausalHistory {
    let mut h = history(
        3,
        1,
        vec![
            tx(id(0, 1), 1, 0, &Z, 10, vec![set("x", "a")], done(&[1, 0, 0, 0])),
            tx(id(1, 1), 2, 1, &Z, 10, vec![set("x", "b")], done(&[0, 1, 0, 0])),
        ],
    );
    h.finals = finals(&[0, 1], &[("x", Kind::Register, reg("b"))]);
    h.finals.extend(finals(&[2], &[("x", Kind::Register, reg(at_dc2))]));
    h
}

#[test]
fn causal_divergent_final_states() {
    assert_holds(&divergence("b"));
    assert_flags(&divergence("a"), kind::CONVERGENCE);
}

// ----- the other rules -----

#[test]
fn causal_client_and_cluster_records_must_agree() {
    let mut h = alice_bob(100);
    h.committed = vec![Committed {
        strong: false,
        id: id(0, 1),
        origin: 0,
        commit: vec![1, 0, 0, 0],
        writes: vec![("bob".into(), Update::Add { delta: 100 })],
    }];
    assert_holds(&h);
    h.committed[0].writes[0].1 = Update::Add { delta: 99 };
    assert_flags(&h, kind::COMMITTED_MISMATCH);
    // An aborted transaction that committed.
    let mut h = alice_bob(100);
    h.committed = vec![Committed {
        id: id(7, 7),
        origin: 2,
        commit: vec![0, 0, 1, 0],
        writes: vec![],
        strong: false,
    }];
    h.txs.push(tx(id(7, 7), 9, 2, &Z, 5, vec![], Outcome::Aborted));
    assert_flags(&h, kind::COMMITTED_MISMATCH);
}

#[test]
fn causal_commit_vectors_follow_snapshots() {
    let mut h = alice_bob(100);
    h.txs[1].outcome = done(&[1, 0, 0, 0]); // u2's commit is its snapshot: it sees itself
    assert_flags(&h, kind::COMMIT_VECTOR);
    // A strong transaction copies the per-data-center entries and raises the strong one.
    let h = history(
        3,
        1,
        vec![
            tx(id(0, 1), 1, 0, &Z, 10, vec![set("x", "s")], done(&[0, 0, 0, 1])),
            tx(
                id(1, 1),
                2,
                1,
                &[0, 0, 0, 1],
                20,
                vec![read_reg("x", Some("s"))],
                done(&[0, 0, 0, 1]),
            ),
        ],
    );
    assert_holds(&h);
}

#[test]
fn causal_sessions_move_through_attach() {
    let moved = |attach: Option<&[u64]>, snap: &[u64]| {
        let mut h = history(
            3,
            1,
            vec![
                tx(id(0, 1), 1, 0, &Z, 10, vec![set("x", "a")], done(&[1, 0, 0, 0])),
                tx(id(1, 1), 1, 1, snap, 30, vec![], done(snap)),
            ],
        );
        if let Some(past) = attach {
            h.syncs.push(Sync {
                session: 1,
                dc: 0,
                past: past.to_vec(),
                barrier: true,
                at_ns: 15,
                order: 15,
            });
            h.syncs.push(Sync {
                session: 1,
                dc: 1,
                past: past.to_vec(),
                barrier: false,
                at_ns: 20,
                order: 20,
            });
        }
        h
    };
    assert_holds(&moved(None, &Z)); // no attach: the session restarted
    assert_holds(&moved(Some(&[1, 0, 0, 0]), &[1, 0, 0, 0]));
    assert_flags(&moved(Some(&[1, 0, 0, 0]), &Z), kind::SESSION);
    assert_flags(&moved(Some(&Z), &Z), kind::SESSION); // the syncs dropped the past
    let mut h = read_your_writes(&[1, 0, 0, 0], Some("a"));
    h.txs[1].past = vec![2, 0, 0, 0];
    assert_flags(&h, kind::SNAPSHOT_BELOW_PAST);
}

/// One session's three steps at one instant (the simulator answers local work without
/// advancing time): an update at dc 0, an attach at dc 1 carrying its commit, a
/// transaction at dc 1 with snapshot `snap`. Only `order` tells which came first.
fn same_instant(snap: &[u64]) -> CausalHistory {
    let mut h = history(
        3,
        1,
        vec![
            tx(id(0, 1), 1, 0, &Z, 10, vec![set("x", "a")], done(&[1, 0, 0, 0])),
            tx(id(1, 1), 1, 1, snap, 10, vec![], done(snap)),
        ],
    );
    h.txs[1].past = Z.to_vec();
    h.txs[1].order = 12;
    let past = vec![1, 0, 0, 0];
    h.syncs.push(Sync { session: 1, dc: 1, past, barrier: false, at_ns: 10, order: 11 });
    h
}

#[test]
fn causal_session_order_not_time_orders_a_session() {
    assert_holds(&same_instant(&[1, 0, 0, 0]));
    assert_flags(&same_instant(&Z), kind::SESSION);
    let mut h = same_instant(&[1, 0, 0, 0]);
    h.syncs[0].order = 10;
    assert_flags(&h, kind::MALFORMED); // order used twice
    let mut h = same_instant(&[1, 0, 0, 0]);
    h.syncs[0].at_ns = 5;
    assert_flags(&h, kind::MALFORMED); // time went back along the session
}

/// Two strong withdrawals of 10 from `acct` labelled `label` (declared to conflict with
/// itself): a at dc 0, then b at dc 1 on snapshot `b_snap`, reading `b_read`, committing
/// `b_commit`.
fn withdrawals(label: &str, b_snap: &[u64], b_read: i64, b_commit: &[u64]) -> CausalHistory {
    let strong = |mut t: ClientTx| {
        t.strong = true;
        t.label = Some(label.to_owned());
        t
    };
    let mut h = history(
        3,
        1,
        vec![
            strong(tx(
                id(0, 1),
                1,
                0,
                &Z,
                10,
                vec![read_counter("acct", 0), add("acct", -10)],
                done(&[0, 0, 0, 1]),
            )),
            strong(tx(
                id(1, 1),
                2,
                1,
                b_snap,
                20,
                vec![read_counter("acct", b_read), add("acct", -10)],
                done(b_commit),
            )),
        ],
    );
    h.conflicts = vec![("w".into(), "w".into())];
    h
}

#[test]
fn causal_conflicting_strong_transactions_see_each_other_in_strong_order() {
    assert_holds(&withdrawals("w", &[0, 0, 0, 1], -10, &[0, 0, 0, 2]));
    // Neither sees the other: both withdrew from 0 (the overdraft).
    assert_flags(&withdrawals("w", &Z, 0, &[0, 0, 0, 2]), kind::CONFLICT_ORDER);
    // Labels that do not conflict (deposits, say) may run so.
    assert_holds(&withdrawals("d", &Z, 0, &[0, 0, 0, 2]));
    // b sees a but commits at a's strong timestamp (it advanced only its own entry).
    assert_flags(&withdrawals("w", &[0, 0, 0, 1], -10, &[0, 1, 0, 1]), kind::CONFLICT_ORDER);
}

#[test]
fn causal_all_strong_conflicting_histories_are_serializable_in_strong_order() {
    // a withdraws at strong timestamp 1, b after it at 2: serializable.
    assert_holds(&withdrawals("w", &[0, 0, 0, 1], -10, &[0, 0, 0, 2]));
    // The overdraft: b read 0 at strong timestamp 2, after a's withdrawal at 1.
    assert_flags(&withdrawals("w", &Z, 0, &[0, 0, 0, 2]), kind::NOT_SERIALIZABLE);
    // A read-only strong transaction at strong timestamp 3 that misses a's withdrawal
    // (at 1; not in its snapshot by a's other entries): its read matches its snapshot,
    // and conflict-order judges only updating pairs, but replayed in strong order it
    // should have read -10.
    let reader = |seen: i64| {
        let mut h = withdrawals("w", &[0, 0, 0, 1], -10, &[0, 0, 0, 2]);
        h.txs[0].outcome = done(&[7, 0, 0, 1]);
        h.txs[1].snap = vec![7, 0, 0, 1];
        h.txs[1].past = vec![7, 0, 0, 1];
        h.txs[1].outcome = done(&[7, 0, 0, 2]);
        let mut r = tx(
            id(2, 1),
            3,
            2,
            &[0, 0, 0, 2],
            30,
            vec![read_counter("acct", seen)],
            done(&[0, 0, 0, 2]),
        );
        r.strong = true;
        r.label = Some("w".into());
        h.txs.push(r);
        h
    };
    let report = assert_flags(&reader(0), kind::NOT_SERIALIZABLE);
    assert_eq!(report.count(kind::RETURN_VALUE), 0, "{:#?}", report.violations);
    assert_eq!(report.count(kind::CONFLICT_ORDER), 0, "{:#?}", report.violations);
    // Labels that do not all conflict (deposits): the rule does not apply.
    assert_eq!(check(&withdrawals("d", &Z, 0, &[0, 0, 0, 2])).count(kind::NOT_SERIALIZABLE), 0);
    // Nor does it with a causal transaction in the history.
    let mut h = withdrawals("w", &Z, 0, &[0, 0, 0, 2]);
    h.txs[1].strong = false;
    h.txs[1].label = None;
    assert_eq!(check(&h).count(kind::NOT_SERIALIZABLE), 0);
}

#[test]
fn causal_a_committed_strong_transaction_survives_its_data_center() {
    let lost = |strong: bool| {
        let mut h = history(
            3,
            1,
            vec![tx(id(0, 1), 1, 0, &Z, 10, vec![set("x", "s")], done(&[0, 0, 0, 1]))],
        );
        h.txs[0].strong = strong;
        h.failed = vec![0];
        h.finals = finals(&[1, 2], &[]);
        h
    };
    // A causal transaction of a failed data center that nothing stored may be lost.
    assert_holds(&lost(false));
    // A strong one was certified at a majority of data centers: it may not.
    assert_flags(&lost(true), kind::CONVERGENCE);
    // Known final snapshots name it even when no object shows the loss (here a register
    // a later write overwrote).
    let mut h = lost(true);
    h.txs.push(tx(id(1, 1), 2, 1, &Z, 20, vec![set("x", "t")], done(&[0, 1, 0, 0])));
    h.txs[1].outcome = done(&[0, 9, 0, 0]);
    let snap = Some(vec![0, 9, 0, 0]);
    h.finals = (1..3)
        .map(|dc| FinalState {
            dc,
            objects: vec![("x".into(), Kind::Register, reg("t"))],
            snap: snap.clone(),
        })
        .collect();
    let report = assert_flags(&h, kind::CONVERGENCE);
    assert!(
        report.violations.iter().any(|v| v.detail.contains("final snapshot")),
        "{:?}",
        report.violations
    );
}

#[test]
fn causal_reads_judge_the_fringe_own_updates_and_outcomes() {
    // Sorted by sum: b (1), a (2), c (3); a snapshot of [3,0,0,0] covers b, not a, and c.
    let h = |seen: i64, outcome: Outcome| {
        history(
            3,
            1,
            vec![
                tx(id(0, 1), 1, 0, &Z, 10, vec![add("n", 1)], done(&[1, 0, 0, 0])),
                tx(id(1, 1), 2, 1, &Z, 10, vec![add("n", 10)], done(&[0, 2, 0, 0])),
                tx(id(0, 2), 1, 0, &[1, 0, 0, 0], 20, vec![add("n", 100)], done(&[3, 0, 0, 0])),
                tx(
                    id(2, 1),
                    3,
                    0,
                    &[3, 0, 0, 0],
                    30,
                    vec![read_counter("n", seen), add("n", 1000), read_counter("n", seen + 1000)],
                    outcome,
                ),
            ],
        )
    };
    assert_holds(&h(101, done(&[4, 0, 0, 0])));
    assert_flags(&h(111, done(&[4, 0, 0, 0])), kind::RETURN_VALUE);
    assert_flags(&h(111, Outcome::Unknown), kind::RETURN_VALUE);
    assert_holds(&h(111, Outcome::Aborted));
}

#[test]
fn causal_counter_overflow_is_a_violation() {
    let h = history(
        3,
        1,
        vec![
            tx(id(0, 1), 1, 0, &Z, 10, vec![add("n", i64::MAX), add("n", 1)], done(&[1, 0, 0, 0])),
            tx(
                id(0, 2),
                1,
                0,
                &[1, 0, 0, 0],
                20,
                vec![read_counter("n", i64::MIN)],
                done(&[1, 0, 0, 0]),
            ),
        ],
    );
    assert_flags(&h, kind::OVERFLOW);
}

#[test]
fn causal_malformed_histories_are_rejected() {
    let mut h = alice_bob(100);
    h.txs[2].snap = vec![2, 0, 0];
    let report = check(&h);
    assert!(report.count(kind::MALFORMED) == report.violations_total && !report.holds());
    let json = serde_json::to_string(&h).expect("serializes");
    assert!(parse(json.as_bytes(), "h.json").is_err());
    let json = serde_json::to_string(&alice_bob(0)).expect("serializes");
    assert_eq!(parse(json.as_bytes(), "h.json").expect("well formed"), alice_bob(0));
    let e = parse(&b"{\"dcs\": 3,\n \"f\": }"[..], "h.json").expect_err("not JSON");
    assert_eq!((e.file.as_str(), e.line), ("h.json", 2));
    let mut h = alice_bob(100);
    h.dcs = 100_000;
    assert!(!check(&h).holds());
}

// ----- random valid histories from a tiny causal store -----

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// An object's state in the model, written independently of the checker's.
#[derive(Debug)]
enum ModelState {
    Register(Option<String>),
    Counter(i64),
    Max(Option<i64>),
    Set(BTreeMap<String, BTreeSet<TxId>>),
}

/// The state of `key`'s object of `kind` after the committed transactions in `snap`
/// (sorted by sum, origin, id), then `own` updates by `me`.
fn model_state(
    all: &[Committed],
    snap: &[u64],
    own: &[TxOp],
    me: TxId,
    key: &str,
    kind: Kind,
) -> ModelState {
    let mut visible: Vec<&Committed> = all.iter().filter(|c| vector_le(&c.commit, snap)).collect();
    visible
        .sort_by_key(|c| (c.commit.iter().map(|&x| u128::from(x)).sum::<u128>(), c.origin, c.id));
    let mut updates: Vec<(TxId, &Update)> = Vec::new();
    for c in visible {
        updates.extend(
            c.writes.iter().filter(|(k, u)| k == key && u.kind() == kind).map(|(_, u)| (c.id, u)),
        );
    }
    for op in own {
        if let TxOp::Update { key: k, update } = op {
            if k == key && update.kind() == kind {
                updates.push((me, update));
            }
        }
    }
    let mut state = match kind {
        Kind::Register => ModelState::Register(None),
        Kind::Counter => ModelState::Counter(0),
        Kind::Max => ModelState::Max(None),
        Kind::GSet | Kind::AwSet => ModelState::Set(BTreeMap::new()),
    };
    for (by, u) in updates {
        match (&mut state, u) {
            (ModelState::Register(v), Update::Set { value }) => *v = Some(value.clone()),
            (ModelState::Counter(n), Update::Add { delta }) => *n += delta,
            (ModelState::Max(m), Update::Max { value }) => {
                *m = Some((*m).unwrap_or(i64::MIN).max(*value))
            }
            (ModelState::Set(s), Update::GAdd { elem } | Update::SAdd { elem }) => {
                s.entry(elem.clone()).or_default().insert(by);
            }
            (ModelState::Set(s), Update::SRem { elem, seen }) => {
                let tags = s.entry(elem.clone()).or_default();
                tags.retain(|t| !seen.contains(t));
                if tags.is_empty() {
                    s.remove(elem);
                }
            }
            _ => unreachable!("updates filtered by kind"),
        }
    }
    state
}

fn model_seen(state: &ModelState) -> Seen {
    match state {
        ModelState::Register(value) => Seen::Register { value: value.clone() },
        ModelState::Counter(value) => Seen::Counter { value: *value },
        ModelState::Max(value) => Seen::Max { value: *value },
        ModelState::Set(s) => Seen::Set { elems: s.keys().cloned().collect() },
    }
}

const KEYS: [&str; 3] = ["x", "y", "z"];
const KINDS: [Kind; 5] = [Kind::Register, Kind::Counter, Kind::Max, Kind::GSet, Kind::AwSet];

/// The tiny store: three data centers (f = 1), sessions pinned to one each.
struct Store {
    rng: Rng,
    registers_only: bool,
    all: Vec<Committed>,
    clock: Vec<u64>,
    strong: u64,
    now: u64,
    values: u64,
    h: CausalHistory,
}

impl Store {
    fn new(seed: u64, registers_only: bool) -> Store {
        Store {
            rng: Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1),
            registers_only,
            all: Vec::new(),
            clock: vec![0; 3],
            strong: 0,
            now: 0,
            values: 0,
            h: history(3, 1, Vec::new()),
        }
    }

    /// One transaction `me` of `session` at `dc` from `past`; returns the session's new past.
    fn transaction(&mut self, session: u64, dc: u32, me: TxId, past: &[u64]) -> Vec<u64> {
        self.now += 1 + self.rng.below(3);
        let mut snap = past.to_vec();
        for _ in 0..self.rng.below(4) {
            if self.all.is_empty() {
                break;
            }
            let c = &self.all[self.rng.below(self.all.len() as u64) as usize];
            for (s, &x) in snap.iter_mut().zip(&c.commit) {
                *s = (*s).max(x);
            }
        }
        let mut ops = Vec::new();
        for _ in 0..1 + self.rng.below(4) {
            let key = KEYS[self.rng.below(3) as usize];
            let kind = if self.registers_only {
                Kind::Register
            } else {
                KINDS[self.rng.below(5) as usize]
            };
            let state = model_state(&self.all, &snap, &ops, me, key, kind);
            let op = if self.rng.chance(50) {
                TxOp::Read { key: key.into(), kind, seen: model_seen(&state) }
            } else {
                TxOp::Update { key: key.into(), update: self.update(kind, &state) }
            };
            ops.push(op);
        }
        let vector = self.commit(dc, &snap, me, &ops);
        let outcome = Outcome::Committed { vector: vector.clone() };
        let at_ns = self.now;
        self.h.txs.push(ClientTx {
            id: me,
            session,
            dc,
            past: past.to_vec(),
            snap,
            at_ns,
            order: at_ns,
            ops,
            outcome,
            strong: false,
            label: None,
        });
        vector
    }

    fn update(&mut self, kind: Kind, state: &ModelState) -> Update {
        self.values += 1;
        let elem = format!("e{}", self.rng.below(3));
        match kind {
            Kind::Register => Update::Set { value: format!("v{}", self.values) },
            Kind::Counter => Update::Add { delta: self.rng.below(11) as i64 - 5 },
            Kind::Max => Update::Max { value: self.rng.below(20) as i64 },
            Kind::GSet => Update::GAdd { elem },
            Kind::AwSet => match state {
                ModelState::Set(s) if self.rng.chance(40) => {
                    let seen =
                        s.get(&elem).map_or(Vec::new(), |tags| tags.iter().copied().collect());
                    Update::SRem { elem, seen }
                }
                _ => Update::SAdd { elem },
            },
        }
    }

    /// Commits: a causal transaction takes its data center's next timestamp (stored
    /// everywhere at once), a strong one (one in ten) the next strong timestamp; a
    /// read-only one returns its snapshot. The cluster records seven in ten.
    fn commit(&mut self, dc: u32, snap: &[u64], me: TxId, ops: &[TxOp]) -> Vec<u64> {
        let writes: Vec<(String, Update)> = ops
            .iter()
            .filter_map(|op| match op {
                TxOp::Update { key, update } => Some((key.clone(), update.clone())),
                TxOp::Read { .. } => None,
            })
            .collect();
        if writes.is_empty() {
            return snap.to_vec();
        }
        let d = dc as usize;
        let mut commit = snap.to_vec();
        if self.rng.chance(10) {
            self.strong = self.strong.max(snap[3]) + 1;
            commit[3] = self.strong;
        } else {
            self.clock[d] = self.clock[d].max(snap[d]) + 1;
            commit[d] = self.clock[d];
            for h in 0..3 {
                self.h.stored.push(Stored {
                    dc: h,
                    origin: dc,
                    through: self.clock[d],
                    at_ns: self.now,
                });
            }
        }
        let c = Committed { id: me, origin: dc, commit: commit.clone(), writes, strong: false };
        if self.rng.chance(70) {
            self.h.committed.push(c.clone());
        }
        self.all.push(c);
        commit
    }

    /// Every data center's final state: every object after every committed transaction.
    fn finals(&mut self) {
        let mut objects = BTreeSet::new();
        for c in &self.all {
            objects.extend(c.writes.iter().map(|(k, u)| (k.clone(), u.kind())));
        }
        let everything = [u64::MAX; 4];
        let states: Vec<(String, Kind, Seen)> = objects
            .into_iter()
            .map(|(k, kind)| {
                let seen =
                    model_seen(&model_state(&self.all, &everything, &[], id(0, 0), &k, kind));
                (k, kind, seen)
            })
            .collect();
        self.h.finals =
            (0..3).map(|dc| FinalState { dc, objects: states.clone(), snap: None }).collect();
    }
}

/// A valid history of `txs` transactions of four sessions, with barriers and moves
/// (barrier, then attach at the new data center).
fn random_history(seed: u64, txs: usize, registers_only: bool) -> CausalHistory {
    let mut store = Store::new(seed, registers_only);
    let mut sessions: Vec<(u32, Vec<u64>, u64)> = (0..4).map(|s| (s % 3, vec![0; 4], 0)).collect();
    for _ in 0..txs {
        let s = store.rng.below(4) as usize;
        let (dc, past, seq) = sessions[s].clone();
        let past = store.transaction(s as u64, dc, id(s as u32, seq), &past);
        let mut dc_next = dc;
        if store.rng.chance(15) {
            store.now += 1;
            let at_ns = store.now;
            store.h.syncs.push(Sync {
                session: s as u64,
                dc,
                past: past.clone(),
                barrier: true,
                at_ns,
                order: at_ns,
            });
            if store.rng.chance(50) {
                dc_next = (dc + 1 + store.rng.below(2) as u32) % 3;
                store.now += 1;
                let at_ns = store.now;
                store.h.syncs.push(Sync {
                    session: s as u64,
                    dc: dc_next,
                    past: past.clone(),
                    barrier: false,
                    at_ns,
                    order: at_ns,
                });
            }
        }
        sessions[s] = (dc_next, past, seq + 1);
    }
    store.finals();
    store.h
}

#[test]
fn causal_random_valid_histories_pass_both_checkers() {
    for seed in 0..300 {
        let registers_only = seed % 2 == 0;
        let h = random_history(seed, 40, registers_only);
        let report = check(&h);
        assert!(report.holds(), "seed {seed}: {:#?}", report.violations);
        if registers_only {
            assert!(saturation::applicable(&h), "seed {seed}");
            assert_eq!(saturation::check(&h), Ok(()), "seed {seed}");
        }
    }
    let h = random_history(7, 2000, false);
    let json = serde_json::to_string(&h).expect("serializes");
    let back = parse(json.as_bytes(), "random.json").expect("parses");
    assert_eq!(back, h);
    let report = check(&back);
    assert!(report.holds(), "{:#?}", report.violations);
    assert!(!saturation::applicable(&back), "too large for the cross-check");
}

/// Changes one register read of `h` to another value of its key (or absent).
fn mutate_read(rng: &mut Rng, h: &mut CausalHistory) -> bool {
    let mut reads = Vec::new();
    let mut values: BTreeMap<String, BTreeSet<Option<String>>> = BTreeMap::new();
    for (ti, t) in h.txs.iter().enumerate() {
        for (oi, op) in t.ops.iter().enumerate() {
            match op {
                TxOp::Read { kind: Kind::Register, .. } => reads.push((ti, oi)),
                TxOp::Update { key, update: Update::Set { value } } => {
                    values.entry(key.clone()).or_default().insert(Some(value.clone()));
                }
                _ => {}
            }
        }
    }
    if reads.is_empty() {
        return false;
    }
    let (ti, oi) = reads[rng.below(reads.len() as u64) as usize];
    let TxOp::Read { key, seen: Seen::Register { value }, .. } = &mut h.txs[ti].ops[oi] else {
        return false;
    };
    let mut options: Vec<Option<String>> =
        values.get(key.as_str()).into_iter().flatten().cloned().collect();
    options.push(None);
    options.retain(|v| v != value);
    if options.is_empty() {
        return false;
    }
    *value = options.swap_remove(rng.below(options.len() as u64) as usize);
    true
}

#[test]
fn causal_random_mutated_reads_flagged_by_saturation_are_flagged_by_the_checker() {
    let mut rng = Rng(99);
    let (mut mutated, mut by_saturation) = (0, 0);
    for seed in 0..400 {
        let mut h = random_history(seed, 30, true);
        if !mutate_read(&mut rng, &mut h) {
            continue;
        }
        mutated += 1;
        let report = check(&h);
        assert!(
            report.count(kind::RETURN_VALUE) > 0,
            "seed {seed}: a changed read must be flagged"
        );
        if saturation::check(&h).is_err() {
            by_saturation += 1;
        }
    }
    println!("saturation flagged {by_saturation} of {mutated} mutated histories");
    assert!(mutated > 300 && by_saturation > mutated / 10, "{by_saturation} of {mutated}");
}

/// The checker on a large generated history ends in bounded time (`--nocapture` prints
/// it: about 0.7 s in a release build); its reads are arbitrary, so it does not hold.
#[test]
fn causal_scale_100k_transactions() {
    let mut rng = Rng(5);
    let (dcs, n) = (5u32, 100_000u64);
    let mut h = history(dcs, 2, Vec::new());
    let mut latest = vec![vec![0u64; 6]; dcs as usize];
    let mut pasts = vec![vec![0u64; 6]; 50];
    for i in 0..n {
        let s = rng.below(50) as usize;
        let dc = (s % dcs as usize) as u32;
        let mut snap = pasts[s].clone();
        for l in latest.iter().filter(|_| rng.chance(50)) {
            for (a, &b) in snap.iter_mut().zip(l) {
                *a = (*a).max(b);
            }
        }
        let key = format!("k{}", rng.below(1000));
        let ops = vec![
            read_counter(&key, 0),
            add(&key, 1),
            read_reg(&key, None),
            set(&key, &format!("v{i}")),
        ];
        let mut commit = snap.clone();
        commit[dc as usize] = latest[dc as usize][dc as usize].max(snap[dc as usize]) + 1;
        for h2 in 0..dcs {
            h.stored.push(Stored {
                dc: h2,
                origin: dc,
                through: commit[dc as usize],
                at_ns: i * 10 + 5,
            });
        }
        h.txs.push(tx(id(s as u32, i), s as u64, dc, &snap, i * 10, ops, done(&commit)));
        latest[dc as usize] = commit.clone();
        pasts[s] = commit;
    }
    h.finals = finals(&[0, 1, 2], &[]);
    let started = std::time::Instant::now();
    let report = check(&h);
    println!(
        "{} txs: {:?}, {} violations {:?}",
        n,
        started.elapsed(),
        report.violations_total,
        report.counts
    );
    assert_eq!(report.txs, n as usize);
    // Release builds take under a second; the bound leaves room for a debug build and a
    // loaded machine, and catches a checker gone quadratic.
    assert!(started.elapsed() < std::time::Duration::from_secs(120), "{:?}", started.elapsed());
}
