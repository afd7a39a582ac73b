//! Engine tests on a hand-driven network: every message is delivered in order unless a
//! test drops it. The simulator (`keel sim run --engine kite`) runs the same engine under
//! random faults; these pin single mechanisms.

use super::*;
use crate::engine::{Input, RequestTag};
use crate::time::{Span, Time};
use keel_types::{KeelError, Key, NodeId, Value};
use std::collections::VecDeque;

mod fence;

/// Which messages a test loses: `(from, to, message) -> lost?`.
type DropRule = Box<dyn FnMut(NodeId, NodeId, &Message) -> bool>;

struct Net {
    nodes: Vec<KiteEngine>,
    queue: VecDeque<(NodeId, NodeId, Message)>,
    replies: Vec<KiteReply>,
    now: Time,
    drop: DropRule,
    next_tag: u64,
}

fn k(s: &str) -> Key {
    Key::from(s.to_string())
}
fn v(s: &str) -> Value {
    Value::from(s.to_string())
}

impl Net {
    fn new(n: u32, tweak: impl Fn(&mut Config)) -> Net {
        let members: Vec<NodeId> = (1..=n).map(NodeId).collect();
        let nodes = members
            .iter()
            .map(|&m| {
                let mut c = Config::new(m, members.clone());
                c.release_timeout = Span::from_millis(1);
                tweak(&mut c);
                KiteEngine::boot(c, u64::from(m.0), Time(0)).unwrap()
            })
            .collect();
        Net {
            nodes,
            queue: VecDeque::new(),
            replies: Vec::new(),
            now: Time(0),
            drop: Box::new(|_, _, _| false),
            next_tag: 1,
        }
    }

    fn node(&mut self, id: u32) -> &mut KiteEngine {
        &mut self.nodes[id as usize - 1]
    }

    fn step(&mut self, id: u32, input: Input<Message, KiteRequest>) {
        let now = self.now;
        let out = self.node(id).step(now, input);
        self.node(id).check_invariants();
        assert!(out.rejected.is_empty(), "{:?}", out.rejected);
        self.replies.extend(out.replies);
        for (to, m) in out.messages {
            if !(self.drop)(NodeId(id), to, &m) {
                self.queue.push_back((NodeId(id), to, m));
            }
        }
    }

    /// Delivers messages until none are left, ticking every node each millisecond of
    /// virtual time while something waits on a timer, for at most `ms`.
    fn settle(&mut self, ms: u64) {
        let end = self.now + Span::from_millis(ms);
        loop {
            while let Some((from, to, message)) = self.queue.pop_front() {
                self.step(to.0, Input::Message { from, message });
            }
            if self.now >= end {
                return;
            }
            self.now = self.now + Span::from_millis(1);
            for id in 1..=self.nodes.len() as u32 {
                self.step(id, Input::Tick);
            }
        }
    }

    fn call(&mut self, id: u32, session: u64, op: KiteOp) -> KiteResult {
        self.call_named(id, session, op, None).expect("ok")
    }

    /// Sends `op` at node `id`, named by its client `session` as request `named` when
    /// given (`KEEL.REQ`), and waits for the reply.
    fn call_named(
        &mut self,
        id: u32,
        session: u64,
        op: KiteOp,
        named: Option<u64>,
    ) -> Result<KiteResult, KeelError> {
        let tag = RequestTag(self.next_tag);
        self.next_tag += 1;
        let form = Default::default();
        self.step(id, Input::Client(KiteRequest { tag, session, op, form, named }));
        for _ in 0..2_000 {
            if let Some(i) = self.replies.iter().position(|r| r.tag == tag) {
                return self.replies.remove(i).result;
            }
            self.settle(1);
        }
        panic!("no reply to request {}", tag.0);
    }
}

fn value_of(r: &KiteResult) -> Option<Value> {
    match r {
        KiteResult::Value { value, .. } => value.clone(),
        KiteResult::Rmw { read, .. } => read.clone(),
        other => panic!("not a read: {other:?}"),
    }
}

#[test]
fn a_relaxed_write_reaches_every_replica_and_reads_are_local() {
    let mut net = Net::new(3, |_| {});
    net.call(1, 1, KiteOp::Write { key: k("x"), value: v("1") });
    net.settle(5);
    for id in 1..=3 {
        assert_eq!(net.node(id).local(b"x").0, Some(v("1")));
    }
    let r = net.call(2, 2, KiteOp::Read { key: k("x") });
    assert_eq!(value_of(&r), Some(v("1")));
    assert_eq!(net.node(2).status().counters.reads_fast, 1);
}

#[test]
fn a_lost_write_makes_the_release_slow_and_the_reader_leaves_the_fast_path() {
    // F1 by hand: A's write of x never reaches B.
    let mut net = Net::new(3, |_| {});
    net.drop = Box::new(|from, to, m| {
        from == NodeId(1)
            && to == NodeId(2)
            && matches!(m, Message::Write { key, .. } if key == &k("x"))
    });
    net.call(1, 1, KiteOp::Write { key: k("x"), value: v("1") });
    net.call(1, 1, KiteOp::Release { key: k("f"), value: v("1") });
    assert_eq!(net.node(1).status().counters.releases_slow, 1);
    assert_eq!(net.node(2).local(b"x").0, None, "B missed the write");
    let r = net.call(2, 2, KiteOp::Acquire { key: k("f") });
    assert_eq!(value_of(&r), Some(v("1")));
    assert_eq!(net.node(2).status().epoch, 1, "the delinquent acquire raised B's epoch");
    let r = net.call(2, 2, KiteOp::Read { key: k("x") });
    assert_eq!(value_of(&r), Some(v("1")), "the slow read found the write at a quorum");
    net.call(2, 2, KiteOp::Read { key: k("x") });
    let c = net.node(2).status().counters;
    assert_eq!((c.reads_slow, c.reads_fast), (1, 1), "slow once, then back in epoch");
    net.settle(5);
    let bits = net.node(1).status().bits;
    assert!(bits.iter().all(|(_, b)| *b == Bit::Clear), "the reset cleared A's bit: {bits:?}");
}

#[test]
fn without_the_slow_path_the_reader_misses_the_write() {
    // The negative control of the test above.
    let mut net = Net::new(3, |c| c.unsafe_no_slow_path = true);
    net.drop = Box::new(|from, to, m| {
        from == NodeId(1)
            && to == NodeId(2)
            && matches!(m, Message::Write { key, .. } if key == &k("x"))
    });
    net.call(1, 1, KiteOp::Write { key: k("x"), value: v("1") });
    net.call(1, 1, KiteOp::Release { key: k("f"), value: v("1") });
    net.call(2, 2, KiteOp::Acquire { key: k("f") });
    let r = net.call(2, 2, KiteOp::Read { key: k("x") });
    assert_eq!(value_of(&r), None, "stale: the release never told B");
}

#[test]
fn faas_from_every_node_count_exactly_and_one_cas_from_absent_wins() {
    let mut net = Net::new(5, |_| {});
    for round in 0..4 {
        for id in 1..=5 {
            net.call(id, u64::from(id), KiteOp::Faa { key: k("c"), delta: 1 });
            let _ = round;
        }
    }
    let r = net.call(3, 9, KiteOp::Acquire { key: k("c") });
    assert_eq!(value_of(&r), Some(v("20")));
    let mut winners = 0;
    for id in 1..=5 {
        let r = net.call(
            id,
            100 + u64::from(id),
            KiteOp::Cas { key: k("lock"), expected: None, new: v(&format!("n{id}")), strong: true },
        );
        if matches!(r, KiteResult::Rmw { wrote: Some(_), .. }) {
            winners += 1;
        }
    }
    assert_eq!(winners, 1);
}

#[test]
fn a_weak_cas_fails_locally_and_a_strong_one_asks_a_quorum() {
    let mut net = Net::new(3, |_| {});
    net.call(1, 1, KiteOp::Release { key: k("x"), value: v("a") });
    net.settle(5);
    let r = net.call(
        2,
        2,
        KiteOp::Cas { key: k("x"), expected: Some(v("b")), new: v("c"), strong: false },
    );
    assert!(matches!(r, KiteResult::Rmw { wrote: None, local: true, .. }), "{r:?}");
    let r = net.call(
        2,
        2,
        KiteOp::Cas { key: k("x"), expected: Some(v("b")), new: v("c"), strong: true },
    );
    assert!(matches!(r, KiteResult::Rmw { wrote: None, local: false, .. }), "{r:?}");
    let r = net.call(
        2,
        2,
        KiteOp::Cas { key: k("x"), expected: Some(v("a")), new: v("c"), strong: false },
    );
    assert!(matches!(r, KiteResult::Rmw { wrote: Some(_), .. }), "{r:?}");
    let r = net.call(3, 3, KiteOp::Acquire { key: k("x") });
    assert_eq!(value_of(&r), Some(v("c")));
}

#[test]
fn a_restarted_incarnation_starts_out_of_epoch_with_fresh_stamps() {
    let members = vec![NodeId(1), NodeId(2), NodeId(3)];
    let mut c = Config::new(NodeId(2), members);
    c.incarnation = 3;
    let e = KiteEngine::boot(c, 1, Time(0)).unwrap();
    assert!(!e.in_epoch(b"anything"));
    assert_ne!(Stamp::writer_of(NodeId(2), 3), Stamp::writer_of(NodeId(2), 0));
}

#[test]
fn the_gate_drops_forged_messages_with_a_reason() {
    let mut net = Net::new(3, |_| {});
    let forged = Message::Accept {
        round: 1,
        key: k("x"),
        ballot: Ballot { round: 1, proposer: 2 << 32 },
        record: RmwRecord {
            id: RmwId::default(),
            value: v("1"),
            stamp: Stamp { version: 9, writer: 1 << 32, rmw: 0 },
            digest: 0,
            read: None,
            read_stamp: Stamp::ZERO,
            base: None,
            skipped: vec![],
            settled: vec![],
        },
        query: None,
    };
    let out = net.node(1).step(Time(0), Input::Message { from: NodeId(2), message: forged });
    assert_eq!(out.rejected.len(), 1);
    let stranger = Message::ResetBit { acquire: 1, gen: 0 };
    let out = net.node(1).step(Time(0), Input::Message { from: NodeId(9), message: stranger });
    assert_eq!(out.rejected[0].reason, "sender is not a peer");
    let huge = Message::Write {
        round: 1,
        key: Key::from(vec![0u8; 5_000]),
        value: v("1"),
        stamp: Stamp { version: 1, writer: 2 << 32, rmw: 0 },
        rmw: None,
        applied: vec![],
        query: None,
    };
    let out = net.node(1).step(Time(0), Input::Message { from: NodeId(2), message: huge });
    assert_eq!(out.rejected[0].reason, "key too large");
    // An outcome no record makes: written four read-modify-writes past what it read.
    let read_stamp = Stamp { version: 1, writer: 2 << 32, rmw: 5 };
    let outcome = RmwOutcome {
        seq: 1,
        read: None,
        read_stamp,
        value: v("1"),
        stamp: Stamp { rmw: 9, ..read_stamp },
        digest: 0,
    };
    let promise = Message::Promise {
        round: 1,
        by: Origin { incarnation: 0, epoch: 0, view: None },
        ok: true,
        promised: Ballot { round: 1, proposer: 1 << 32 },
        accepted: None,
        value: None,
        stamp: Stamp::ZERO,
        outcome: Some(outcome),
        made_by: None,
        delinquent: None,
    };
    let out = net.node(1).step(Time(0), Input::Message { from: NodeId(2), message: promise });
    assert_eq!(out.rejected[0].reason, "outcome not written after what it read");
    assert!(net.node(1).status().keys == 0, "nothing applied");
}

#[test]
fn a_session_completes_in_order_and_refuses_past_its_queue_bound() {
    let mut net = Net::new(3, |c| c.session_queue_max = 2);
    let reqs: Vec<KiteRequest> = (0..4)
        .map(|i| KiteRequest {
            tag: RequestTag(100 + i),
            session: 1,
            op: KiteOp::Acquire { key: k("x") },
            form: Default::default(),
            named: None,
        })
        .collect();
    net.step(1, Input::Clients(reqs));
    net.settle(20);
    let tags: Vec<(u64, bool)> = net.replies.iter().map(|r| (r.tag.0, r.result.is_ok())).collect();
    assert!(
        tags.contains(&(102, false)) && tags.contains(&(103, false)),
        "past the bound: {tags:?}"
    );
    let ok: Vec<u64> = tags.iter().filter(|(_, ok)| *ok).map(|(t, _)| *t).collect();
    assert_eq!(ok, vec![100, 101], "completed in session order");
}

#[test]
fn a_session_past_its_unacknowledged_writes_bound_settles_them_with_a_barrier() {
    // Node 3 never hears anything: every write of node 1 stays unacknowledged by it.
    let mut net = Net::new(3, |_| {});
    net.drop = Box::new(|_, to, _| to == NodeId(3));
    for i in 0..1_100u32 {
        net.call(1, 1, KiteOp::Write { key: k("x"), value: v(&i.to_string()) });
    }
    let c = net.node(1).status().counters;
    assert_eq!(c.flushes, 1, "one barrier at the bound, then room again");
    assert!(net.node(1).status().bits.iter().any(|(n, b)| *n == NodeId(3) && *b == Bit::Set));
}

mod hostile {
    //! Any message from a member, however it breaks the protocol, never panics a node:
    //! it is applied, answered, ignored or dropped by the gate with a reason.
    use super::*;
    use proptest::prelude::*;

    fn stamp() -> impl Strategy<Value = Stamp> {
        (
            any::<u64>(),
            prop_oneof![Just(0u64), Just(1u64 << 32), Just(2u64 << 32), any::<u64>()],
            any::<u64>(),
        )
            .prop_map(|(version, writer, rmw)| Stamp { version, writer, rmw })
    }

    fn bytes() -> impl Strategy<Value = Value> {
        prop::collection::vec(any::<u8>(), 0..8).prop_map(Value::from)
    }

    fn record() -> impl Strategy<Value = RmwRecord> {
        (any::<u32>(), any::<u64>(), any::<u64>(), bytes(), stamp(), prop::option::of(bytes()))
            .prop_map(|(node, session, seq, value, read_stamp, read)| RmwRecord {
                id: RmwId { node: u64::from(node), session, seq },
                value,
                stamp: read_stamp.next_rmw(),
                digest: seq.rotate_left(17),
                read,
                read_stamp,
                base: None,
                skipped: vec![],
                settled: vec![],
            })
    }

    fn origin() -> impl Strategy<Value = super::super::types::Origin> {
        use super::super::types::{Origin, View};
        let node = prop_oneof![
            Just(NodeId(1)),
            Just(NodeId(2)),
            Just(NodeId(9)),
            any::<u32>().prop_map(NodeId)
        ];
        let view = (any::<u64>(), prop::collection::vec((node, 0u32..3), 0..70)).prop_map(
            |(gen, incarnations)| {
                Box::new(View { gen, incarnations, membership: Default::default() })
            },
        );
        (prop_oneof![Just(0u32), Just(1), any::<u32>()], prop::option::of(view))
            .prop_map(|(incarnation, view)| Origin { incarnation, epoch: 0, view })
    }

    fn message() -> impl Strategy<Value = Message> {
        let key = prop_oneof![Just(k("x")), Just(k("y")), bytes()];
        let ballot = (any::<u64>(), prop_oneof![Just(1u64 << 32), Just(3u64 << 32), any::<u64>()])
            .prop_map(|(round, proposer)| Ballot { round, proposer });
        prop_oneof![
            (any::<u64>(), key.clone(), bytes(), stamp(), prop::option::of(any::<u64>())).prop_map(
                |(round, key, value, stamp, query)| Message::Write {
                    round,
                    key,
                    value,
                    stamp,
                    rmw: None,
                    applied: vec![],
                    query
                }
            ),
            (any::<u64>(), origin(), prop::option::of(any::<u64>()))
                .prop_map(|(round, by, delinquent)| Message::WriteAck { round, by, delinquent }),
            (any::<u64>(), key.clone(), prop::option::of(any::<u64>()))
                .prop_map(|(round, key, query)| Message::Read { round, key, query }),
            (
                any::<u64>(),
                origin(),
                prop::option::of(bytes()),
                stamp(),
                prop::option::of(any::<u64>())
            )
                .prop_map(|(round, by, value, stamp, delinquent)| {
                    Message::ReadReply { round, by, value, stamp, made_by: None, delinquent }
                }),
            (any::<u64>(), prop::collection::vec(any::<u32>().prop_map(NodeId), 0..70))
                .prop_map(|(round, delinquent)| Message::SlowRelease { round, delinquent }),
            (any::<u64>(), origin()).prop_map(|(round, by)| Message::SlowReleaseAck { round, by }),
            (0u32..3, any::<u64>())
                .prop_map(|(incarnation, gen)| Message::ViewAck { incarnation, gen }),
            (any::<u64>(), any::<u64>())
                .prop_map(|(acquire, gen)| Message::ResetBit { acquire, gen }),
            (
                any::<u64>(),
                key.clone(),
                ballot.clone(),
                any::<u64>(),
                prop::option::of(any::<u64>())
            )
                .prop_map(|(round, key, ballot, session, query)| Message::Propose {
                    round,
                    key,
                    ballot,
                    rmw: RmwId { node: session % 3, session, seq: session / 3 },
                    query
                }),
            (
                (any::<u64>(), origin()),
                any::<bool>(),
                ballot.clone(),
                prop::option::of((ballot.clone(), record())),
                stamp()
            )
                .prop_map(|((round, by), ok, promised, accepted, stamp)| {
                    Message::Promise {
                        round,
                        by,
                        ok,
                        promised,
                        accepted,
                        value: None,
                        stamp,
                        outcome: None,
                        made_by: None,
                        delinquent: None,
                    }
                }),
            (any::<u64>(), key, ballot.clone(), record(), prop::option::of(any::<u64>())).prop_map(
                |(round, key, ballot, record, query)| Message::Accept {
                    round,
                    key,
                    ballot,
                    record,
                    query
                }
            ),
            (any::<u64>(), origin(), any::<bool>(), ballot).prop_map(
                |(round, by, ok, promised)| {
                    Message::Accepted { round, by, ok, promised, delinquent: Some(0) }
                }
            ),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn forged_messages_never_panic_a_node(
            forged in prop::collection::vec((1u32..=3, message()), 1..60),
        ) {
            let mut net = Net::new(3, |_| {});
            // Real work in flight, so forged replies can meet open rounds.
            net.step(1, Input::Client(KiteRequest { tag: RequestTag(1), session: 1, op: KiteOp::Release { key: k("x"), value: v("1") }, form: Default::default(), named: None }));
            net.step(1, Input::Client(KiteRequest { tag: RequestTag(2), session: 2, op: KiteOp::Faa { key: k("y"), delta: 1 }, form: Default::default(), named: None }));
            for (from, message) in forged {
                if from == 1 {
                    continue;
                }
                let now = net.now;
                let _ = net.node(1).step(now, Input::Message { from: NodeId(from), message });
            }
            net.settle(30);
            let _ = net.node(1).status();
        }
    }
}

#[test]
fn a_restarted_node_rejoins_over_several_pages_and_serves_only_then() {
    // Enough keys and committed read-modify-writes that the state spans several pages.
    let mut net = Net::new(3, |_| {});
    let keys = super::types::PAGE_ITEMS_MAX * 2 + 7;
    for i in 0..keys {
        net.call(1, 1, KiteOp::Write { key: k(&format!("k{i:04}")), value: v(&i.to_string()) });
    }
    for s in 0..(super::types::PAGE_ITEMS_MAX as u64 + 3) {
        net.call(2, 100 + s, KiteOp::Faa { key: k("counter"), delta: 1 });
    }
    net.call(1, 1, KiteOp::Release { key: k("flag"), value: v("done") });
    net.settle(20);
    // Node 3 restarts with an empty memory: a new incarnation that rejoins.
    let mut config = net.node(3).config().clone();
    config.incarnation = 1;
    config.rejoin = true;
    net.nodes[2] = KiteEngine::boot(config, 99, net.now).unwrap();
    assert!(net.node(3).status().rejoining);
    // A request that arrives while it rejoins waits; so does a quorum request to it.
    let tag = RequestTag(9_999);
    net.step(
        3,
        Input::Client(KiteRequest {
            tag,
            session: 7,
            op: KiteOp::Read { key: k("k0003") },
            form: Default::default(),
            named: None,
        }),
    );
    assert!(net.replies.iter().all(|r| r.tag != tag), "no answer while rejoining");
    net.step(
        3,
        Input::Message {
            from: NodeId(1),
            message: Message::Read { round: 1, key: k("x"), query: None },
        },
    );
    net.settle(50);
    let status = net.node(3).status();
    assert!(!status.rejoining);
    assert!(
        status.counters.rejoin_pages >= 4,
        "several pages per peer: {}",
        status.counters.rejoin_pages
    );
    assert_eq!(status.counters.unanswered_rejoining, 1);
    assert_eq!(status.keys, keys + 2, "every key came back");
    assert_eq!(status.keys_in_epoch, 1, "only the key read since (from a quorum) is in epoch");
    let answered = net.replies.iter().find(|r| r.tag == tag).expect("served once rejoined");
    assert_eq!(value_of(answered.result.as_ref().unwrap()), Some(v("3")));
    for id in 1..=2 {
        assert_eq!(net.node(3).local(b"counter"), net.node(id).local(b"counter"));
    }
    assert_eq!(
        net.node(3).status().outcomes,
        net.node(1).status().outcomes,
        "committed outcomes came back"
    );
    // The new incarnation's own read-modify-writes build on what it rejoined with.
    let r = net.call(3, 8, KiteOp::Faa { key: k("counter"), delta: 1 });
    assert_eq!(value_of(&r), Some(v(&(super::types::PAGE_ITEMS_MAX + 3).to_string())));
}

#[test]
fn a_cluster_that_boots_rejoining_everywhere_starts_empty() {
    // Every node rejoining answers "rejoining too", which counts: a new cluster starts.
    let mut net = Net::new(3, |c| {
        c.rejoin = true;
        c.incarnation = 1;
    });
    for id in 1..=3 {
        net.step(id, Input::Tick);
    }
    net.settle(10);
    for id in 1..=3 {
        assert!(!net.node(id).status().rejoining, "node {id} rejoined");
    }
    let r = net.call(2, 1, KiteOp::Acquire { key: k("x") });
    assert_eq!(value_of(&r), None);
}

#[test]
fn two_nodes_restarting_together_do_not_vouch_for_each_other() {
    // A release reaches only {3, 4, 5} (a quorum of five). Nodes 4 and 5 restart together:
    // each must read three nodes that kept their memory ({1, 2, 3}), not count the other.
    let mut net = Net::new(5, |_| {});
    net.drop = Box::new(|from, to, _| from == NodeId(3) && (to == NodeId(1) || to == NodeId(2)));
    net.call(3, 1, KiteOp::Release { key: k("x"), value: v("released") });
    net.settle(5);
    // Node 3's first pages are lost: a rejoin that counted the other restarted node would
    // finish on {1, 2, and the other} before node 3 answers again.
    let mut lost = 0;
    net.drop = Box::new(move |from, _, m| {
        let first = from == NodeId(3) && matches!(m, Message::StatePage { .. }) && lost < 2;
        lost += usize::from(first);
        first
    });
    net.queue.clear();
    for id in [4, 5] {
        let mut config = net.node(id).config().clone();
        config.incarnation = 1;
        config.rejoin = true;
        net.nodes[id as usize - 1] = KiteEngine::boot(config, u64::from(id), net.now).unwrap();
    }
    for id in [4, 5] {
        net.step(id, Input::Tick);
    }
    net.settle(20);
    for id in [4, 5] {
        assert!(!net.node(id).status().rejoining, "node {id} rejoined");
        assert_eq!(net.node(id).local(b"x").0, Some(v("released")), "node {id} read node 3");
    }
    // Node 3 and node 5 gone: node 1's acquire on {1, 2, 4} must still see the release.
    net.drop =
        Box::new(|from, to, _| [from, to].iter().any(|n| *n == NodeId(3) || *n == NodeId(5)));
    let r = net.call(1, 2, KiteOp::Acquire { key: k("x") });
    assert_eq!(value_of(&r), Some(v("released")));
}

#[test]
fn a_majority_without_memory_rejoins_after_the_grace_even_with_a_node_gone() {
    // Nodes 1 and 2 of three restart together; node 3 is gone for good.
    let mut net = Net::new(3, |c| {
        c.rejoin = true;
        c.incarnation = 1;
    });
    net.drop = Box::new(|from, to, _| from == NodeId(3) || to == NodeId(3));
    for id in 1..=2 {
        net.step(id, Input::Tick);
    }
    net.settle(5);
    assert!(net.node(1).status().rejoining, "waits for node 3 a while");
    net.settle(30 * 20);
    for id in 1..=2 {
        assert!(!net.node(id).status().rejoining, "node {id} rejoined after the grace");
    }
}

#[test]
fn a_reply_to_an_earlier_incarnation_does_not_answer_a_later_ones_round() {
    // Node 3 proposes on key a; its promises are held back. It restarts (a new incarnation)
    // and proposes on key b; the held promises, answering the old round, then arrive. They
    // name another key's value and must not be taken for the new round's answers.
    let mut net = Net::new(3, |_| {});
    net.call(1, 1, KiteOp::Write { key: k("a"), value: v("7") });
    net.settle(5);
    let held: std::rc::Rc<std::cell::RefCell<Vec<(NodeId, Message)>>> = Default::default();
    let keep = held.clone();
    net.drop = Box::new(move |from, to, m| {
        let promise = to == NodeId(3) && matches!(m, Message::Promise { .. });
        if promise {
            keep.borrow_mut().push((from, m.clone()));
        }
        promise
    });
    let tag = RequestTag(5_000);
    let faa = KiteOp::Faa { key: k("a"), delta: 1 };
    net.step(
        3,
        Input::Client(KiteRequest {
            tag,
            session: 1,
            op: faa,
            form: Default::default(),
            named: None,
        }),
    );
    net.settle(2);
    let held: Vec<(NodeId, Message)> = held.borrow().clone();
    assert!(held.len() >= 2, "the old round's promises were held: {}", held.len());
    let mut config = net.node(3).config().clone();
    config.incarnation = 1;
    config.rejoin = false;
    net.nodes[2] = KiteEngine::boot(config, 99, net.now).unwrap();
    net.queue.retain(|(_, to, _)| *to != NodeId(3));
    net.drop = Box::new(|_, _, _| false);
    let tag = RequestTag(5_001);
    let faa = KiteOp::Faa { key: k("b"), delta: 1 };
    net.step(
        3,
        Input::Client(KiteRequest {
            tag,
            session: 2,
            op: faa,
            form: Default::default(),
            named: None,
        }),
    );
    for (from, message) in held {
        net.step(3, Input::Message { from, message });
    }
    net.settle(20);
    let reply = net.replies.iter().find(|r| r.tag == tag).expect("the FAA on b answered");
    assert_eq!(value_of(reply.result.as_ref().unwrap()), None, "b was never written");
    assert_eq!(net.node(3).local(b"b").0, Some(v("1")));
}

#[test]
fn a_request_its_client_named_is_done_once_wherever_it_is_sent_again() {
    let mut net = Net::new(3, |_| {});
    let faa = |delta| KiteOp::Faa { key: k("c"), delta };
    // Client 77's request 1, done at node 1; say its reply was lost with the connection.
    let first = net.call_named(1, 77, faa(5), Some(1)).expect("ok");
    // Others count on after it, so the value no longer shows who made it.
    net.call(3, 5, faa(1));
    net.call(2, 6, faa(1));
    net.settle(5);
    // The client sends request 1 again, at node 2: the same answer, not a second add.
    let again = net.call_named(2, 77, faa(5), Some(1)).expect("ok");
    assert_eq!(again, first);
    assert_eq!(net.node(2).status().counters.rmws_found_done, 1);
    let total = net.call(3, 7, KiteOp::Acquire { key: k("c") });
    assert_eq!(value_of(&total), Some(v("7")), "5 + 1 + 1, the 5 once");

    // Unnamed, the same retry is a new request: the negative control of the numbering.
    net.call(2, 77, faa(5));
    let total = net.call(3, 7, KiteOp::Acquire { key: k("c") });
    assert_eq!(value_of(&total), Some(v("12")));
}

#[test]
fn a_weak_cas_sent_again_as_a_strong_one_reports_the_swap_its_first_attempt_made() {
    let mut net = Net::new(3, |_| {});
    net.call(1, 1, KiteOp::Write { key: k("l"), value: v("free") });
    net.settle(5);
    let cas =
        |strong| KiteOp::Cas { key: k("l"), expected: Some(v("free")), new: v("mine"), strong };
    let first = net.call_named(1, 77, cas(false), Some(4)).expect("ok");
    assert!(matches!(first, KiteResult::Rmw { wrote: Some(_), .. }), "{first:?}");
    net.settle(5);
    // At node 2 the local value is now "mine", not "free". Sent again as it was, the weak
    // CAS fails against that copy, telling the client it did not take the lock it holds:
    // why a retry goes as a strong one.
    let weak = net.call_named(2, 77, cas(false), Some(4)).expect("ok");
    assert!(matches!(weak, KiteResult::Rmw { wrote: None, local: true, .. }), "{weak:?}");
    let again = net.call_named(3, 77, cas(true), Some(4)).expect("ok");
    assert_eq!(again, first);
}

#[test]
fn a_late_retry_after_a_later_request_of_its_client_is_refused_not_done_again() {
    let mut net = Net::new(3, |_| {});
    let faa = |key: &str| KiteOp::Faa { key: k(key), delta: 1 };
    net.call_named(1, 77, faa("a"), Some(1)).expect("ok");
    net.call_named(1, 77, faa("b"), Some(2)).expect("ok");
    net.call(2, 5, faa("a"));
    net.settle(5);
    // Request 1's own outcome gave way to request 2's: whether 1 was done is not known
    // from what is kept, so it is refused rather than done again.
    let late = net.call_named(3, 77, faa("a"), Some(1));
    assert_eq!(late, Err(KeelError::SessionExpired));
    assert_eq!(net.node(3).status().counters.rmws_superseded, 1);
    let a = net.call(2, 7, KiteOp::Acquire { key: k("a") });
    assert_eq!(value_of(&a), Some(v("2")));
}

#[test]
fn a_retry_that_finds_a_later_request_of_its_client_accepted_is_refused() {
    // Client 77 pipelined request 1 (a weak CAS, failed locally: no trace anywhere) and
    // request 2 (a strong CAS) at node 1, whose connection broke. Request 2 was accepted,
    // but its commit never left node 1; then a newer value covered it. (Seed 46002379 of
    // `keel sim run --engine kite`, in small.)
    let mut net = Net::new(3, |_| {});
    net.call(1, 1, KiteOp::Write { key: k("l"), value: v("x") });
    net.settle(5);
    net.drop = Box::new(|from, _, m| {
        from == NodeId(1) && matches!(m, Message::Write { rmw: Some(_), .. })
    });
    let cas =
        |strong| KiteOp::Cas { key: k("l"), expected: Some(v("free")), new: v("mine"), strong };
    let tag = RequestTag(9_000);
    let form = Default::default();
    let request = KiteRequest { tag, session: 77, op: cas(true), form, named: Some(2) };
    net.step(1, Input::Client(request));
    net.settle(5);
    assert!(net.replies.iter().all(|r| r.tag != tag), "request 2 was not committed");
    // Node 1, which knows request 2's outcome, is cut off from now on.
    net.drop = Box::new(|from, to, _| from == NodeId(1) || to == NodeId(1));
    net.call(2, 5, KiteOp::Write { key: k("l"), value: v("y") });
    net.settle(5);
    // Request 2 started, so its node had finished request 1 (a session runs one request
    // at a time): request 1, sent again, is a late retry and is not done a second time,
    // which would read "y" after request 2 read "x".
    let late = net.call_named(3, 77, cas(true), Some(1));
    assert_eq!(late, Err(KeelError::SessionExpired));
    assert_eq!(net.node(3).status().counters.rmws_superseded, 1);
    let again = net.call_named(3, 77, cas(true), Some(2)).expect("ok");
    assert!(matches!(&again, KiteResult::Rmw { wrote: None, .. }), "{again:?}");
    assert_eq!(value_of(&again), Some(v("x")), "request 2's own outcome");
}

#[test]
fn outcomes_past_their_bound_are_dropped_and_counted() {
    let mut net = Net::new(3, |c| c.outcomes_max = 4);
    for session in 1..=10 {
        net.call(1 + (session % 3) as u32, session, KiteOp::Faa { key: k("c"), delta: 1 });
    }
    net.settle(5);
    for id in 1..=3 {
        let status = net.node(id).status();
        assert_eq!(status.outcomes, 4);
        assert!(status.counters.outcomes_dropped >= 6, "{:?}", status.counters);
    }
}

/// Node `n`'s first read-modify-write record, of value "1".
fn first_record_of(n: u32) -> RmwRecord {
    RmwRecord {
        id: RmwId { node: Stamp::writer_of(NodeId(n), 0), session: 1, seq: 1 },
        value: v("1"),
        stamp: Stamp::ZERO.next_rmw(),
        digest: 0,
        read: None,
        read_stamp: Stamp::ZERO,
        base: None,
        skipped: Vec::new(),
        settled: Vec::new(),
    }
}

/// An `Accept` of `record` for key "c" at `ballot`, in round `round`.
fn accept_of(round: u64, ballot: Ballot, record: &RmwRecord) -> Message {
    Message::Accept { round, key: k("c"), ballot, record: record.clone(), query: None }
}

/// The `Accepted` answers queued from node `from` to node `to`, whether each accepted;
/// the queue is emptied.
fn accepted_answers(net: &mut Net, from: u32, to: u32) -> Vec<bool> {
    let found = net
        .queue
        .iter()
        .filter_map(|(f, t, m)| match m {
            Message::Accepted { ok, .. } if *f == NodeId(from) && *t == NodeId(to) => Some(*ok),
            _ => None,
        })
        .collect();
    net.queue.clear();
    found
}

#[test]
fn an_acceptance_copied_while_rejoining_is_not_counted_as_the_rejoined_nodes_own() {
    // Node 1 accepted its record at ballot 126, then promised node 3's ballot 140. Node 2
    // rejoins and copies node 1's slot. When node 1's Accept(126) reaches node 2, it must
    // be refused: answering "accepted again" would count node 1's acceptance twice and
    // give ballot 126 a quorum next to 140's (seed 5005170: two FAAs on one base).
    let mut net = Net::new(3, |_| {});
    let writer = |n: u32| Stamp::writer_of(NodeId(n), 0);
    let record = first_record_of(1);
    let low = Ballot { round: 126, proposer: writer(1) };
    let high = Ballot { round: 140, proposer: writer(3) };
    let accept = |round| accept_of(round, low, &record);
    // (Delivered as if relayed by node 3: a node takes no message from itself.)
    net.step(1, Input::Message { from: NodeId(3), message: accept(1) });
    let rmw = RmwId { node: writer(3), session: 3, seq: 9 };
    let propose = Message::Propose { round: 2, key: k("c"), ballot: high, rmw, query: None };
    net.step(1, Input::Message { from: NodeId(3), message: propose });
    net.queue.clear();

    let mut config = net.node(2).config().clone();
    config.incarnation = 1;
    config.rejoin = true;
    net.nodes[1] = KiteEngine::boot(config, 7, net.now).unwrap();
    net.settle(50);
    assert!(!net.node(2).status().rejoining);
    net.queue.clear();
    net.step(2, Input::Message { from: NodeId(1), message: accept(3) });
    let answers = accepted_answers(&mut net, 2, 1);
    assert_eq!(answers, vec![false], "refused: node 2 promised 140 and accepted nothing itself");
}

#[test]
fn an_acceptance_is_answered_again_only_under_the_membership_it_was_made_in() {
    // Node 5 accepted node 1's record at ballot 103, then promised node 2's ballot 115.
    // Node 1's Accept(103) sent again (its answer lost) is answered `ok` again under the
    // same membership: 103 then counts node 5 once, as it did. Once node 5 took a later
    // membership, it is refused: under the later voters, 103's old acceptances may make
    // a quorum that 115's promisers of the earlier membership never saw, and both CASes
    // would be chosen on one read (membership seed 740000321).
    let mut net = Net::new(5, |_| {});
    let writer = |n: u32| Stamp::writer_of(NodeId(n), 0);
    let record = first_record_of(1);
    let low = Ballot { round: 103, proposer: writer(1) };
    let high = Ballot { round: 115, proposer: writer(2) };
    let accept = |round| accept_of(round, low, &record);
    let answers = |net: &mut Net| accepted_answers(net, 5, 1);
    net.step(5, Input::Message { from: NodeId(1), message: accept(1) });
    assert_eq!(answers(&mut net), vec![true], "accepted at first");
    let rmw = RmwId { node: writer(2), session: 2, seq: 9 };
    let propose = Message::Propose { round: 2, key: k("c"), ballot: high, rmw, query: None };
    net.step(5, Input::Message { from: NodeId(2), message: propose });
    net.queue.clear();
    net.step(5, Input::Message { from: NodeId(1), message: accept(1) });
    assert_eq!(answers(&mut net), vec![true], "the same acceptance, the same membership");

    let later = Membership {
        epoch: 1,
        voters: (1..=5).map(NodeId).collect(),
        next: Some(vec![NodeId(3), NodeId(4), NodeId(5)]),
    };
    net.step(
        5,
        Input::Message { from: NodeId(3), message: Message::MembershipNews { membership: later } },
    );
    assert_eq!(net.node(5).membership().epoch, 1, "the later membership taken");
    net.queue.clear();
    net.step(5, Input::Message { from: NodeId(1), message: accept(1) });
    assert_eq!(answers(&mut net), vec![false], "refused: made under epoch 0, promised 115 since");
}

#[test]
fn sessions_of_one_node_run_their_read_modify_writes_on_a_key_one_at_a_time() {
    // Four sessions of node 1 add to one key at once. Run together, each new proposal
    // would nack the one before (ballots above the highest seen); the node runs them one
    // after another instead, so none is retried and each is done once.
    let mut net = Net::new(3, |_| {});
    for session in 1..=4 {
        let request = KiteRequest {
            tag: RequestTag(100 + session),
            session,
            op: KiteOp::Faa { key: k("c"), delta: 1 },
            form: Default::default(),
            named: None,
        };
        net.step(1, Input::Client(request));
    }
    net.settle(20);
    let mut before: Vec<Option<Value>> = (1..=4)
        .map(|s| {
            net.replies
                .iter()
                .find(|r| r.tag == RequestTag(100 + s))
                .map(|r| value_of(r.result.as_ref().unwrap()))
        })
        .map(|v| v.expect("answered"))
        .collect();
    before.sort();
    assert_eq!(before, vec![None, Some(v("1")), Some(v("2")), Some(v("3"))]);
    let counters = net.node(1).status().counters;
    assert_eq!((counters.rmws_queued, counters.rmw_retries), (3, 0), "{counters:?}");
}

/// Client 77's strong CAS x: "a" -> "b" (request 1) starts at node 1, whose proposals are
/// held back; x becomes "c"; the client, its connection gone, sends the request again at
/// node 2, where it fails; x becomes "a" again; then node 1's proposals go out. Returns
/// the first attempt's answer, the retry's, x at the end, and how many failures node 2
/// committed as records.
fn cas_retry_race(uncommitted: bool) -> (KiteResult, KiteResult, Option<Value>, u64) {
    let mut net = Net::new(3, |c| c.unsafe_uncommitted_failures = uncommitted);
    net.call(3, 1, KiteOp::Write { key: k("x"), value: v("a") });
    net.settle(5);
    let held: std::rc::Rc<std::cell::RefCell<Vec<(NodeId, Message)>>> = Default::default();
    let keep = held.clone();
    net.drop = Box::new(move |from, to, m| {
        let proposal = from == NodeId(1) && matches!(m, Message::Propose { .. });
        if proposal {
            keep.borrow_mut().push((to, m.clone()));
        }
        proposal
    });
    let cas = KiteOp::Cas { key: k("x"), expected: Some(v("a")), new: v("b"), strong: true };
    let first = RequestTag(9_000);
    let form = Default::default();
    net.step(
        1,
        Input::Client(KiteRequest {
            tag: first,
            session: 77,
            op: cas.clone(),
            form,
            named: Some(1),
        }),
    );
    net.settle(1);
    assert!(!held.borrow().is_empty(), "the first attempt's proposals are held");
    net.drop = Box::new(|_, _, _| false);
    net.call(3, 2, KiteOp::Release { key: k("x"), value: v("c") });
    let retry = net.call_named(2, 77, cas, Some(1)).expect("ok");
    net.call(3, 2, KiteOp::Release { key: k("x"), value: v("a") });
    for (to, message) in held.borrow_mut().drain(..) {
        net.step(to.0, Input::Message { from: NodeId(1), message });
    }
    net.settle(100);
    let i = net.replies.iter().position(|r| r.tag == first).expect("the first attempt answered");
    let first = net.replies.remove(i).result.expect("ok");
    let x = value_of(&net.call(2, 3, KiteOp::Acquire { key: k("x") }));
    (first, retry, x, net.node(2).status().counters.failures_committed)
}

#[test]
fn a_named_request_that_fails_is_committed_so_its_first_attempt_cannot_swap_later() {
    let (first, retry, x, kept) = cas_retry_race(false);
    assert_eq!(kept, 1, "the retry's failure was committed as a record");
    assert!(matches!(retry, KiteResult::Rmw { wrote: None, .. }), "the retry failed: {retry:?}");
    assert_eq!(value_of(&retry), Some(v("c")));
    assert_eq!(first, retry, "the first attempt finds the retry's outcome");
    assert_eq!(x, Some(v("a")), "nobody swapped");

    // Negative control: uncommitted, the failure leaves nothing for the first attempt to
    // find, and it swaps after the client was told that the request failed.
    let (first, retry, x, kept) = cas_retry_race(true);
    assert_eq!(kept, 0);
    assert!(matches!(retry, KiteResult::Rmw { wrote: None, .. }), "{retry:?}");
    assert!(matches!(first, KiteResult::Rmw { wrote: Some(_), .. }), "{first:?}");
    assert_eq!(x, Some(v("b")), "the request failed and swapped");
}

#[test]
fn a_request_number_used_again_for_another_command_is_refused() {
    let mut net = Net::new(3, |_| {});
    let faa = |key: &str, delta| KiteOp::Faa { key: k(key), delta };
    assert_eq!(value_of(&net.call_named(1, 77, faa("a", 5), Some(1)).unwrap()), None);
    net.settle(5);
    let reused = |r: Result<KiteResult, KeelError>| matches!(r, Err(KeelError::InvalidArgument(ref m)) if m.contains("another command"));
    // Another delta, another key, another kind: not retries of request 1.
    assert!(reused(net.call_named(2, 77, faa("a", 7), Some(1))));
    assert!(reused(net.call_named(3, 77, faa("b", 5), Some(1))));
    let cas = KiteOp::Cas { key: k("a"), expected: Some(v("5")), new: v("0"), strong: true };
    assert!(reused(net.call_named(2, 77, cas, Some(1))));
    assert_eq!(net.node(2).status().counters.rmws_reused, 2);
    // The same command is a retry, answered as the first time.
    assert_eq!(value_of(&net.call_named(3, 77, faa("a", 5), Some(1)).unwrap()), None);
    let a = net.call(1, 9, KiteOp::Acquire { key: k("a") });
    assert_eq!(value_of(&a), Some(v("5")), "done once, the others not at all");
    let b = net.call(1, 9, KiteOp::Acquire { key: k("b") });
    assert_eq!(value_of(&b), None);
}

// ----- exactly-once across deep chains -----

/// Every id a `Write` carries as committed (`rmw` or `applied`), with the stamp it carries
/// it at, and the sending node; shared with the drop rules that record it.
type CommitLog = std::rc::Rc<std::cell::RefCell<Vec<(RmwId, Stamp, NodeId)>>>;

/// A drop rule that first writes down every commit it sees (sent or lost: the sender has
/// applied it to itself either way), then applies `rule`.
fn watching(
    log: &CommitLog,
    mut rule: impl FnMut(NodeId, NodeId, &Message) -> bool + 'static,
) -> DropRule {
    let log = log.clone();
    Box::new(move |from, to, m| {
        if let Message::Write { rmw, applied, .. } = m {
            for (id, o) in rmw.iter().chain(applied) {
                log.borrow_mut().push((*id, o.stamp, from));
            }
        }
        rule(from, to, m)
    })
}

/// The distinct stamps `id` was committed at, as far as `log` saw.
fn commit_stamps(log: &CommitLog, id: RmwId) -> Vec<Stamp> {
    let mut stamps: Vec<Stamp> =
        log.borrow().iter().filter(|(i, _, _)| *i == id).map(|(_, s, _)| *s).collect();
    stamps.sort();
    stamps.dedup();
    stamps
}

/// Whether `m` is a commit that carries `id` (as its own, or as applied before it).
fn carries(m: &Message, id: RmwId) -> bool {
    matches!(m, Message::Write { rmw, applied, .. }
        if rmw.iter().chain(applied).any(|(i, _)| *i == id))
}

/// Node `id` crashes and comes back as incarnation `incarnation`, rejoining: what was in
/// flight from or to its earlier life is lost.
fn crash_and_rejoin(net: &mut Net, id: u32, incarnation: u32) {
    let mut config = net.node(id).config().clone();
    config.incarnation = incarnation;
    config.rejoin = true;
    net.nodes[id as usize - 1] = KiteEngine::boot(config, 1_000 + u64::from(id), net.now).unwrap();
    net.queue.retain(|(from, to, _)| from.0 != id && to.0 != id);
    net.step(id, Input::Tick);
    net.settle(10);
    assert!(!net.node(id).status().rejoining, "node {id} rejoined");
}

/// Shape (a) of the deep chain on a five-node cluster, with a chosen request R (client
/// 77's request 1, `first`) whose only lasting trace is another record's `skipped` list:
///
/// 1. `setup` runs. Then R runs at node 1. A quorum, {1, 2, 3}, accepts it, so R is
///    chosen. Its commit reaches node 1 only, then node 1 crashes and rejoins (crash 1).
///    Nobody left has R's outcome. Nodes 2 and 3 hold R as their accepted record.
/// 2. `cover` runs: afterwards R's stamp is no newer than the key's value, and R did not
///    make that value.
/// 3. R2 (`second`, at node 2) adopts R. It finds R covered and not the value's maker,
///    so it carries R in `skipped`. {2, 3, 4} accept R2. R2's commit would record R done
///    everywhere through `applied`, but it reaches node 2 only. Acceptors record a
///    record's `base` on Accept, never its `skipped`. R's trace is now R2's accepted
///    record at {2, 3, 4} and node 2's outcome table.
/// 4. R3 (`third`, at node 3) gets promises from {1, 2, 3}. The newest value is node 2's,
///    made by R2, and R2 is also the highest-ballot accepted record. So R2 is "known":
///    R3's base is R2, and R2's `skipped` becomes R3's `settled`, which R3's acceptors
///    record done (before that fix it was dropped, and R's last trace with it). R3 is
///    accepted and committed everywhere, replacing R2 as every acceptor's record.
/// 5. Node 2 crashes and rejoins (crash 2) from nodes that never had R's outcome.
/// 6. The client sends request 1 again, at node 5, and every node answers. No promise
///    shows R: no outcome, no maker, and the adopted record R3 carries only R2.
///
/// Returns the network, the commits seen, R's id, and the retry's answer.
fn skipped_chain(
    setup: impl FnOnce(&mut Net),
    first: KiteOp,
    cover: impl FnOnce(&mut Net),
    second: KiteOp,
    third: KiteOp,
) -> (Net, CommitLog, RmwId, KiteResult) {
    let mut net = Net::new(5, |_| {});
    let log: CommitLog = Default::default();
    let r = RmwId { node: RmwId::CLIENT, session: 77, seq: 1 };
    net.drop = watching(&log, |_, _, _| false);
    setup(&mut net);
    net.settle(3);

    // 1. R chosen at {1, 2, 3}, committed at node 1 alone; node 1 crashes.
    net.drop = watching(&log, move |from, to, m| {
        carries(m, r)
            || (from == NodeId(1)
                && (to == NodeId(4) || to == NodeId(5))
                && matches!(m, Message::Accept { .. }))
    });
    let request = KiteRequest {
        tag: RequestTag(7_000),
        session: 77,
        op: first.clone(),
        form: Default::default(),
        named: Some(1),
    };
    net.step(1, Input::Client(request));
    net.settle(3);
    assert_eq!(commit_stamps(&log, r).len(), 1, "node 1 committed R, to itself");
    assert!(net.node(2).accepted_rmw(b"c") && net.node(3).accepted_rmw(b"c"));
    crash_and_rejoin(&mut net, 1, 1);

    // 2. R covered by something it did not make.
    net.drop = watching(&log, move |_, _, m| carries(m, r));
    cover(&mut net);
    net.settle(3);

    // 3. R2 at node 2 carries R as skipped; {2, 3, 4} accept it; committed at node 2 only.
    net.drop = watching(&log, move |from, to, m| {
        carries(m, r)
            || (from == NodeId(2)
                && (to == NodeId(1) || to == NodeId(5))
                && matches!(m, Message::Accept { .. }))
    });
    let request = KiteRequest {
        tag: RequestTag(7_001),
        session: 20,
        op: second,
        form: Default::default(),
        named: None,
    };
    net.step(2, Input::Client(request));
    net.settle(3);
    assert!(net.replies.iter().all(|reply| reply.tag != RequestTag(7_001)), "R2 waits");
    assert!(net.node(2).local(b"c").1 > net.node(3).local(b"c").1, "R2 committed at node 2");

    // 4. R3 at node 3, promised by {1, 2, 3}: R2's value, R2 its base.
    net.drop = watching(&log, move |from, to, m| {
        carries(m, r)
            || (to == NodeId(3)
                && (from == NodeId(4) || from == NodeId(5))
                && matches!(m, Message::Promise { .. }))
    });
    net.call(3, 30, third);
    net.settle(3);

    // 5. Node 2 crashes, R2's commit with it.
    crash_and_rejoin(&mut net, 2, 1);

    // 6. The client's retry at node 5.
    net.drop = watching(&log, |_, _, _| false);
    let again = net.call_named(5, 77, first, Some(1)).expect("ok");
    net.settle(5);
    (net, log, r, again)
}

/// The deep chain of `skipped_chain` with an FAA and a relaxed write that covers it.
/// Before R3's acceptors recorded what R2 carried (`settled`), the retry built R again on
/// R3's value and committed it at a second stamp ((0,0,1) and (1,w4,3)), answering 102
/// rather than the first attempt's nothing. Recording every record's `skipped` on Accept
/// would be wrong: a record's `skipped` are chosen only if the record is, and one that
/// only a minority accepted would declare done a request that is never applied. A record
/// whose value is in place was committed, so what it carried was chosen.
#[test]
fn a_chosen_faa_carried_only_as_skipped_is_not_applied_again_after_two_crashes() {
    let faa = |delta| KiteOp::Faa { key: k("c"), delta };
    let cover = |net: &mut Net| {
        net.call(4, 10, KiteOp::Write { key: k("c"), value: v("100") });
    };
    let (mut net, log, r, again) = skipped_chain(|_| {}, faa(5), cover, faa(1), faa(1));
    let stamps = commit_stamps(&log, r);
    assert_eq!(stamps.len(), 1, "request 1 committed at two stamps: {stamps:?}");
    assert_eq!(value_of(&again), None, "the retry answers as the first attempt: it read nothing");
    let total = net.call(1, 9, KiteOp::Acquire { key: k("c") });
    assert_eq!(value_of(&total), Some(v("102")), "R applied once, before the 100");
}

/// The same chain with read-modify-writes only: no write covers R. Client 77's strong CAS
/// c: "c" -> "y" fails against "a". As a named request, its failure is committed as a
/// record that keeps the value it read, so its stamp equals its base's. A failure is
/// therefore always covered, and the next proposer always carries it as `skipped`. Two
/// CASes later (a -> b -> c) the retry finds no trace of it and swaps: the client is told
/// the request swapped, though it was chosen as a failure (before `settled`: commits at
/// (0,0,1), the failure, and (0,0,4), the swap).
#[test]
fn a_chosen_failure_carried_only_as_skipped_is_not_turned_into_a_swap_after_two_crashes() {
    let cas = |expected: Option<&str>, new: &str| KiteOp::Cas {
        key: k("c"),
        expected: expected.map(v),
        new: v(new),
        strong: true,
    };
    let setup = move |net: &mut Net| {
        net.call(4, 10, cas(None, "a"));
    };
    let (mut net, log, r, again) =
        skipped_chain(setup, cas(Some("c"), "y"), |_| {}, cas(Some("a"), "b"), cas(Some("b"), "c"));
    let stamps = commit_stamps(&log, r);
    assert_eq!(stamps.len(), 1, "request 1 committed at two stamps: {stamps:?}");
    assert!(matches!(again, KiteResult::Rmw { wrote: None, .. }), "failed: {again:?}");
    assert_eq!(value_of(&again), Some(v("a")), "the first attempt read a");
    let c = net.call(1, 9, KiteOp::Acquire { key: k("c") });
    assert_eq!(value_of(&c), Some(v("c")), "nobody swapped c for y");
}

/// Shape (c): more than `SKIPPED_MAX` records, through the `!known` branch alone (each
/// carrier adds the record it adopts and everything that record carried). Only nodes 1 and
/// 2 ever crash, one at a time.
///
/// Client 77's FAA (request 1, R1) runs at node 1. Every node accepts it; its commit
/// reaches node 1 only, and node 1 crashes and rejoins. Then, 17 times, a relaxed write
/// at node 4 covers the newest record, and R_k (an FAA at node 1 or 2, taking turns)
/// adopts it. R_k finds it covered and not the value's maker, and carries it as skipped
/// along with everything it carried. Every node accepts R_k; its commit reaches its
/// proposer only, and the proposer crashes and rejoins. R_k's `skipped` grows by one a
/// level. At R_18 it is truncated at 16 and R1 falls off the end. The retry at node 5
/// then builds R1 again. Each level needs one crash (a proposer whose commit went
/// nowhere stays in Committing and proposes nothing more on the key), so 17 crashes,
/// spread over two nodes.
///
/// Before the fix, R1 was truncated out of `skipped` at R_18 and the retry built it again
/// (committed at (17,w4,2)). `settled` does not close this, since no record here is built
/// on its carrier's value. Now a proposer that would carry more than `SKIPPED_MAX` records
/// finishes the covered record instead: accepted at its ballot and committed with what it
/// carries, acknowledged by a quorum, whose outcome tables then hold all of it; the
/// proposer remembers the record it finished (`Slot::finished`), so it does not finish it
/// again when it finds it once more as the highest-ballot record.
/// Runs shape (c) with `levels` records in all (R1 and the carriers after it), then the
/// retry at node 5. Returns the stamps request 1 was committed at, and the retry's answer.
fn covered_carriers(levels: u64) -> (Vec<Stamp>, KiteResult) {
    let mut net = Net::new(5, |_| {});
    let log: CommitLog = Default::default();
    let r1 = RmwId { node: RmwId::CLIENT, session: 77, seq: 1 };
    let faa = |delta| KiteOp::Faa { key: k("c"), delta };
    // Every read-modify-write's commit reaches its proposer only.
    net.drop = watching(&log, |_, _, m| matches!(m, Message::Write { rmw: Some(_), .. }));
    let mut incarnation = [0u32; 2];
    let mut ops = vec![(1u32, faa(5), Some(1))];
    for level in 2..=levels {
        ops.push((2 - (level % 2) as u32, faa(1), None));
    }
    for (level, (at, op, named)) in ops.into_iter().enumerate() {
        if level > 0 {
            let value = v(&(1_000 * level).to_string());
            net.call(4, 10, KiteOp::Write { key: k("c"), value });
            net.settle(3);
        }
        let tag = RequestTag(8_000 + level as u64);
        let session = if named.is_some() { 77 } else { 100 + level as u64 };
        let form = Default::default();
        net.step(at, Input::Client(KiteRequest { tag, session, op, form, named }));
        net.settle(3);
        assert!(net.replies.iter().all(|reply| reply.tag != tag), "level {level} waits");
        for id in 1..=5 {
            assert!(net.node(id).accepted_rmw(b"c"), "level {level} accepted at node {id}");
        }
        incarnation[at as usize - 1] += 1;
        crash_and_rejoin(&mut net, at, incarnation[at as usize - 1]);
    }
    assert_eq!(commit_stamps(&log, r1).len(), 1, "R1 was committed, at node 1 only");
    net.drop = watching(&log, |_, _, _| false);
    let again = net.call_named(5, 77, faa(5), Some(1)).expect("ok");
    net.settle(5);
    (commit_stamps(&log, r1), again)
}

#[test]
fn a_chosen_request_carried_through_skipped_max_covered_carriers_is_found_done() {
    // The control of the test below: 16 carriers after R1 (R17 carries R16 to R1, 16
    // records, the bound), every one committed at its crashed proposer only. The retry
    // finds R1 in the adopted record's `skipped`, finishes that record, and is answered
    // with R1's outcome.
    let (stamps, again) = covered_carriers(17);
    assert_eq!(stamps.len(), 1, "request 1 committed at two stamps: {stamps:?}");
    assert_eq!(value_of(&again), None, "the retry answers as the first attempt: it read nothing");
}

#[test]
fn a_chosen_request_is_not_lost_past_skipped_max_covered_carriers() {
    let (stamps, again) = covered_carriers(18);
    assert_eq!(stamps.len(), 1, "request 1 committed at two stamps: {stamps:?}");
    assert_eq!(value_of(&again), None, "the retry answers as the first attempt: it read nothing");
}

#[test]
fn a_chosen_request_carried_as_a_base_is_found_done_three_records_down_after_two_crashes() {
    // Shape (a) through `base`, the evidence acceptors record. Client 77's FAA c += 5 (R)
    // is chosen at {1, 2, 3} and committed at node 1 only. R2 (node 2, promised by
    // {1, 2, 3}) builds on node 1's 5, made by R, so its base is R. {2, 3, 4} accept R2
    // and record R done; R2's commit reaches node 2 only. Node 1 crashes. R3 and R4
    // build on (R2, R3) and are committed everywhere; neither carries R. Node 2 crashes.
    // The retry at node 5 hears only from {1, 2, 5}: the two rejoined nodes and one that
    // never had R. They have R only from what they read while rejoining. The retry must
    // find R done, answer the first attempt's outcome, and commit nothing new.
    let mut net = Net::new(5, |_| {});
    let log: CommitLog = Default::default();
    let r = RmwId { node: RmwId::CLIENT, session: 77, seq: 1 };
    let faa = |delta| KiteOp::Faa { key: k("c"), delta };
    let accept_from_to = |m: &Message, from: NodeId, to: NodeId, p: u32, q: [u32; 2]| {
        from == NodeId(p) && q.contains(&to.0) && matches!(m, Message::Accept { .. })
    };

    net.drop =
        watching(&log, move |from, to, m| carries(m, r) || accept_from_to(m, from, to, 1, [4, 5]));
    let form = Default::default();
    let request =
        KiteRequest { tag: RequestTag(7_100), session: 77, op: faa(5), form, named: Some(1) };
    net.step(1, Input::Client(request));
    net.settle(3);
    let first = commit_stamps(&log, r);
    assert_eq!(first.len(), 1, "node 1 committed R, to itself");
    assert_eq!(net.node(1).local(b"c").0, Some(v("5")));

    net.drop =
        watching(&log, move |from, to, m| carries(m, r) || accept_from_to(m, from, to, 2, [1, 5]));
    let form = Default::default();
    let request =
        KiteRequest { tag: RequestTag(7_101), session: 20, op: faa(1), form, named: None };
    net.step(2, Input::Client(request));
    net.settle(3);
    assert_eq!(net.node(2).local(b"c").0, Some(v("6")), "R2 on R's value, at node 2 only");
    assert_eq!(net.node(3).local(b"c").0, None);
    crash_and_rejoin(&mut net, 1, 1);

    net.drop = watching(&log, move |from, to, m| {
        carries(m, r)
            || (to == NodeId(3)
                && (from == NodeId(4) || from == NodeId(5))
                && matches!(m, Message::Promise { .. }))
    });
    assert_eq!(value_of(&net.call(3, 30, faa(1))), Some(v("6")), "R3 on R2's value");
    net.drop = watching(&log, move |_, _, m| carries(m, r));
    assert_eq!(value_of(&net.call(4, 40, faa(1))), Some(v("7")), "R4 on R3's value");
    net.settle(3);
    crash_and_rejoin(&mut net, 2, 1);

    net.drop = watching(&log, |from, to, m| {
        to == NodeId(5)
            && (from == NodeId(3) || from == NodeId(4))
            && matches!(m, Message::Promise { .. })
    });
    let again = net.call_named(5, 77, faa(5), Some(1)).expect("ok");
    assert_eq!(
        again,
        KiteResult::Rmw {
            read: None,
            read_stamp: Stamp::ZERO,
            wrote: Some(first[0]),
            local: false
        },
        "answered with the first attempt's outcome"
    );
    assert_eq!(net.node(5).status().counters.rmws_found_done, 1);
    net.drop = watching(&log, |_, _, _| false);
    net.settle(5);
    assert_eq!(commit_stamps(&log, r), first, "request 1 committed at one stamp only");
    let total = net.call(5, 9, KiteOp::Acquire { key: k("c") });
    assert_eq!(value_of(&total), Some(v("8")), "5 + 1 + 1 + 1, the 5 once");
}

#[test]
fn a_chosen_request_whose_helpers_crash_is_finished_not_built_upon() {
    // Shape (b): can chosen records left uncommitted pile up, each adopted by the next
    // proposer? Not when nothing covers them. Client 77's FAA (R) is chosen at
    // {1, 2, 3} and committed at node 1 only, and node 1 crashes. Nodes 2, 1 and 2 again
    // in turn adopt R, newer than any value they see. Each one finishes R: accepts it at
    // its own ballot, every node agreeing, and commits it, but the commit reaches the
    // helper only, and the helper crashes. Nobody builds on R without committing it at a
    // quorum, so the retry at node 5 adopts its own record, finishes it at the same stamp,
    // and gets the first attempt's outcome.
    let mut net = Net::new(5, |_| {});
    let log: CommitLog = Default::default();
    let r = RmwId { node: RmwId::CLIENT, session: 77, seq: 1 };
    let faa = |delta| KiteOp::Faa { key: k("c"), delta };
    net.drop = watching(&log, move |from, to, m| {
        carries(m, r)
            || (from == NodeId(1)
                && (to == NodeId(4) || to == NodeId(5))
                && matches!(m, Message::Accept { .. }))
    });
    let form = Default::default();
    let request =
        KiteRequest { tag: RequestTag(7_200), session: 77, op: faa(5), form, named: Some(1) };
    net.step(1, Input::Client(request));
    net.settle(3);
    crash_and_rejoin(&mut net, 1, 1);
    net.drop = watching(&log, move |_, _, m| carries(m, r));
    for (i, (at, incarnation)) in [(2u32, 1u32), (1, 2), (2, 2)].into_iter().enumerate() {
        let tag = RequestTag(7_201 + i as u64);
        let form = Default::default();
        let session = 20 + i as u64;
        net.step(at, Input::Client(KiteRequest { tag, session, op: faa(1), form, named: None }));
        net.settle(3);
        assert!(net.replies.iter().all(|reply| reply.tag != tag), "helper {i} waits");
        assert!((1..=5).all(|id| net.node(id).accepted_rmw(b"c")), "R accepted everywhere");
        crash_and_rejoin(&mut net, at, incarnation);
    }
    net.drop = watching(&log, |_, _, _| false);
    let again = net.call_named(5, 77, faa(5), Some(1)).expect("ok");
    net.settle(5);
    let stamps = commit_stamps(&log, r);
    assert_eq!(stamps, vec![Stamp::ZERO.next_rmw()], "request 1 committed at one stamp");
    assert_eq!(value_of(&again), None, "answered with the first attempt's outcome");
    let total = net.call(5, 9, KiteOp::Acquire { key: k("c") });
    assert_eq!(value_of(&total), Some(v("5")), "the helpers' own FAAs died with them");
}

/// The front door's request becomes an engine's by a conversion that refuses what the
/// engine kind gives no meaning to, before any step.
#[test]
fn requests_of_another_engine_kind_are_refused_before_any_step() {
    use crate::engine::{ClientRequest, FromClient, OpMode};
    use keel_types::{ClientId, Command, Durability, RequestId};
    let get = |mode: OpMode, durability: Option<Durability>| ClientRequest {
        tag: RequestTag(9),
        client: ClientId(3),
        request: RequestId(1),
        command: Command::Get { key: Key::from_static(b"k") },
        durability,
        level: None,
        after: keel_types::LogIndex::ZERO,
        mode,
        named: false,
    };
    let acquire = KiteRequest::from_client(get(OpMode::Acquire, None)).expect("an acquire");
    assert!(matches!(acquire.op, KiteOp::Acquire { .. }));
    assert_eq!((acquire.tag, acquire.session), (RequestTag(9), 3));
    let refused = KiteRequest::from_client(get(OpMode::Plain, Some(Durability::Durable)));
    assert!(
        matches!(&refused, Err(KeelError::InvalidArgument(why)) if why.contains("DURABILITY")),
        "{refused:?}"
    );
    let plain = ClientRequest::from_client(get(OpMode::Plain, None)).expect("the leader's own");
    assert_eq!(plain, get(OpMode::Plain, None));
    let orca = ClientRequest::from_client(get(OpMode::Acquire, None));
    assert!(
        matches!(&orca, Err(KeelError::InvalidArgument(why)) if why.contains("ACQUIRE")),
        "{orca:?}"
    );
}

/// A hard state that says the last incarnation was the last one there can be (a damaged
/// disk) refuses to boot instead of starting over at incarnation 0.
#[test]
fn a_persisted_incarnation_with_no_successor_refuses_to_boot() {
    use crate::engine::{BootError, Engine, PersistedState};
    let members = vec![NodeId(1), NodeId(2), NodeId(3)];
    for last in [u64::from(u32::MAX), u64::MAX] {
        let hard_state =
            keel_types::HardState { epoch: keel_types::Epoch(last), ..Default::default() };
        let persisted = PersistedState { hard_state, ..Default::default() };
        let config = Config::new(NodeId(1), members.clone());
        let booted = <KiteEngine as Engine>::boot(config, persisted, 7, Time(0));
        assert!(matches!(booted, Err(BootError::Persisted(_))), "{last}");
    }
    // A snapshot is another engine kind's: Kite takes none.
    let snapshot = Some((keel_types::SnapshotMeta::default(), vec![1]));
    let persisted = PersistedState { snapshot, ..Default::default() };
    let booted =
        <KiteEngine as Engine>::boot(Config::new(NodeId(1), members), persisted, 7, Time(0));
    assert!(matches!(&booted, Err(BootError::Persisted(why)) if why.contains("snapshot")));
}

/// Sends `op` at node `id` and settles for `ms`: its reply, if one came.
fn try_call(
    net: &mut Net,
    id: u32,
    session: u64,
    op: KiteOp,
    ms: u64,
) -> Option<Result<KiteResult, KeelError>> {
    let tag = RequestTag(net.next_tag);
    net.next_tag += 1;
    let form = Default::default();
    net.step(id, Input::Client(KiteRequest { tag, session, op, form, named: None }));
    net.settle(ms);
    let i = net.replies.iter().position(|r| r.tag == tag)?;
    Some(net.replies.remove(i).result)
}

/// Five members; nodes 1 to 3 configured with voters 1, 2, 3 and nodes 4 and 5 with 3,
/// 4, 5 (a misconfiguration): each side holds a majority of its own voters, so two
/// compare-and-swaps from absent, one on each side, would both swap. The nodes tell each
/// other their membership as they boot, and every node that hears a member of the other
/// list refuses its clients instead, naming it, until the lists agree.
#[test]
fn nodes_configured_with_other_voters_refuse_clients_rather_than_count_other_quorums() {
    let mut net = Net::new(5, |c| {
        let voters = if c.node.0 <= 3 { [1, 2, 3] } else { [3, 4, 5] };
        c.voters = voters.into_iter().map(NodeId).collect();
    });
    for id in 1..=5 {
        net.step(id, Input::Tick);
    }
    net.settle(2);
    let cas = |new: &str| KiteOp::Cas { key: k("x"), expected: None, new: v(new), strong: true };
    let first = try_call(&mut net, 1, 1, cas("a"), 50);
    let second = try_call(&mut net, 4, 4, cas("b"), 50);
    let swapped = [&first, &second]
        .iter()
        .filter(|r| matches!(r, Some(Ok(KiteResult::Rmw { wrote: Some(_), .. }))))
        .count();
    assert_eq!(swapped, 0, "a side swapped: {first:?} {second:?}");
    for (id, others) in [(1, vec![4, 5]), (3, vec![4, 5]), (4, vec![1, 2, 3]), (5, vec![1, 2, 3])] {
        let status = net.node(id).status();
        assert_eq!(status.voters_disagree, others.into_iter().map(NodeId).collect::<Vec<_>>());
    }
    let Some(Err(err)) = second else { panic!("{second:?}") };
    assert!(err.to_string().contains("configured with other voters"), "{err}");
    // Once the lists agree (nodes 4 and 5 restarted with 1, 2, 3, say, and their news
    // came), node 1 serves again.
    let agreed = Membership { epoch: 0, voters: vec![NodeId(1), NodeId(2), NodeId(3)], next: None };
    for from in [4, 5] {
        let message = Message::MembershipNews { membership: agreed.clone() };
        net.step(1, Input::Message { from: NodeId(from), message });
    }
    assert!(net.node(1).status().voters_disagree.is_empty());
    let r = try_call(&mut net, 1, 1, cas("a"), 50);
    assert!(matches!(r, Some(Ok(KiteResult::Rmw { wrote: Some(_), .. }))), "{r:?}");
}

/// Voters 1 to 4 remove node 4, then node 3 (each step asked until done): the removed
/// nodes, which no round reaches, are sent each membership taken, so their own shows the
/// one in force.
#[test]
fn a_removed_node_learns_the_memberships_taken_after_it_left() {
    let mut net = Net::new(4, |_| {});
    let key = Key::from(MEMBERSHIP_KEY.to_vec());
    let settled = |net: &mut Net, id: u32, voters: &[u32]| {
        let m = net.node(id).status().membership;
        m.next.is_none() && m.voters == voters.iter().copied().map(NodeId).collect::<Vec<_>>()
    };
    for (gone, left) in [(4, [1, 2, 3].as_slice()), (3, [1, 2].as_slice())] {
        let wanted = VotersWanted::Exactly(left.iter().copied().map(NodeId).collect());
        for _ in 0..4 {
            if settled(&mut net, 1, left) {
                break;
            }
            let op = KiteOp::Reconfigure { key: key.clone(), wanted: wanted.clone() };
            let _ = try_call(&mut net, 1, 1, op, 50);
        }
        assert!(settled(&mut net, 1, left), "node {gone} removed");
    }
    net.settle(50);
    for id in 1..=4 {
        assert!(
            settled(&mut net, id, &[1, 2]),
            "node {id}: {:?}",
            net.node(id).status().membership
        );
    }
}
