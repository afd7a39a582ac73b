//! The geo engine on a perfect network: a small deterministic harness of whole nodes,
//! every message through a queue in send order, time moved by hand. The simulator
//! (`keel sim run --engine geo`) drives the same engine through the real host, codec and
//! faults; these tests pin the protocol's basic paths.

use super::types::{
    GeoOp, GeoReply, GeoRequest, GeoResult, Kind, Member, Object, TxId, Update, Vector,
};
use super::{Config, GeoEngine};
use crate::engine::{Input, RequestTag};
use crate::time::{Span, Time};
use keel_types::{Key, NodeId};
use std::collections::{BTreeMap, VecDeque};

struct Cluster {
    nodes: BTreeMap<NodeId, GeoEngine>,
    queue: VecDeque<(NodeId, NodeId, super::types::Message)>,
    replies: Vec<GeoReply>,
    now: Time,
    next_tag: u64,
    down: Vec<u32>,
    /// Links whose messages are dropped, (from, to).
    blocked: Vec<(NodeId, NodeId)>,
}

impl Cluster {
    /// `dcs` data centers of `partitions` nodes; node ids `dc * 10 + partition + 1`.
    fn new(f: u32, partitions: u32) -> Cluster {
        Cluster::with_strong(f, partitions, true)
    }

    /// As [`Cluster::new`], with strong transactions or without.
    fn with_strong(f: u32, partitions: u32, strong: bool) -> Cluster {
        let dcs = 2 * f + 1;
        let members: Vec<Member> = (0..dcs)
            .flat_map(|dc| {
                (0..partitions).map(move |p| Member {
                    node: NodeId(dc * 10 + p + 1),
                    dc,
                    partition: p,
                })
            })
            .collect();
        let mut nodes = BTreeMap::new();
        for m in &members {
            let mut config = Config::new(m.node, members.clone(), f);
            config.wall_clock_origin_us = 1_000_000;
            config.strong = strong;
            nodes.insert(m.node, GeoEngine::boot(config, Time(0)).unwrap());
        }
        Cluster {
            nodes,
            queue: VecDeque::new(),
            replies: Vec::new(),
            now: Time(0),
            next_tag: 1,
            down: Vec::new(),
            blocked: Vec::new(),
        }
    }

    fn dc_of(&self, node: NodeId) -> u32 {
        (node.0 - 1) / 10
    }

    fn step(&mut self, node: NodeId, input: Input<super::types::Message, GeoRequest>) {
        if self.down.contains(&self.dc_of(node)) {
            return;
        }
        let out = self.nodes.get_mut(&node).unwrap().step(self.now, input);
        for (to, m) in out.messages {
            self.queue.push_back((node, to, m));
        }
        self.replies.extend(out.replies);
    }

    /// Runs `ms` milliseconds in 1 ms ticks, delivering every message at once.
    fn run(&mut self, ms: u64) {
        for _ in 0..ms {
            self.now = Time(self.now.0 + 1_000_000);
            let ids: Vec<NodeId> = self.nodes.keys().copied().collect();
            for id in ids {
                self.step(id, Input::Tick);
            }
            while let Some((from, to, message)) = self.queue.pop_front() {
                if self.down.contains(&self.dc_of(from)) || self.blocked.contains(&(from, to)) {
                    continue;
                }
                self.step(to, Input::Message { from, message });
            }
        }
    }

    /// Sends `op` to `node` and runs until its reply comes (at most 5 s).
    fn call(&mut self, node: NodeId, session: u64, op: GeoOp) -> GeoResult {
        self.call_result(node, session, op).unwrap()
    }

    /// As [`Cluster::call`], an error too.
    fn call_result(
        &mut self,
        node: NodeId,
        session: u64,
        op: GeoOp,
    ) -> Result<GeoResult, keel_types::KeelError> {
        let tag = RequestTag(self.next_tag);
        self.next_tag += 1;
        self.step(node, Input::Client(GeoRequest { tag, session, op }));
        for _ in 0..5_000 {
            if let Some(i) = self.replies.iter().position(|r| r.tag == tag) {
                return self.replies.remove(i).result;
            }
            self.run(1);
        }
        panic!("no reply from {node}");
    }

    /// One transaction of `ops` at `node`; the session's new past vector and the objects.
    fn tx(
        &mut self,
        node: NodeId,
        session: u64,
        past: &Vector,
        ops: Vec<(Key, Option<Update>, Kind)>,
    ) -> (Vector, Vec<Object>) {
        let GeoResult::Began { tx, .. } =
            self.call(node, session, GeoOp::Begin { past: past.clone() })
        else {
            panic!()
        };
        let mut objects = Vec::new();
        for (key, update, kind) in ops {
            let op = match update {
                Some(update) => GeoOp::Update { tx, key, update },
                None => GeoOp::Read { tx, key, kind },
            };
            let GeoResult::Object(o) = self.call(node, session, op) else { panic!() };
            objects.push(o);
        }
        let GeoResult::Committed { vector } = self.call(node, session, GeoOp::Commit { tx }) else {
            panic!()
        };
        (vector, objects)
    }
}

fn key(k: &str) -> Key {
    Key::copy_from_slice(k.as_bytes())
}

#[test]
fn concurrent_deposits_at_every_data_center_converge_to_the_sum() {
    let mut c = Cluster::new(1, 2);
    let zero = Vector::zero(3);
    for (dc, amount) in [(0u32, 100), (1, 200), (2, 300)] {
        let node = NodeId(dc * 10 + 1);
        c.tx(
            node,
            u64::from(dc),
            &zero,
            vec![(key("acct"), Some(Update::Add(amount)), Kind::Counter)],
        );
    }
    c.run(200);
    for dc in 0..3u32 {
        let node = NodeId(dc * 10 + 2);
        let (_, objects) = c.tx(node, 9, &zero, vec![(key("acct"), None, Kind::Counter)]);
        assert_eq!(objects, vec![Object::Counter(600)], "data center {dc}");
    }
}

#[test]
fn a_session_reads_its_writes_and_a_multi_partition_transaction_is_atomic() {
    let mut c = Cluster::new(1, 3);
    let zero = Vector::zero(3);
    let writes: Vec<_> = ["a", "b", "c", "d"]
        .iter()
        .map(|k| (key(k), Some(Update::Set(key("v1"))), Kind::Register))
        .collect();
    let (past, _) = c.tx(NodeId(1), 1, &zero, writes);
    let reads: Vec<_> =
        ["a", "b", "c", "d"].iter().map(|k| (key(k), None, Kind::Register)).collect();
    let (_, seen) = c.tx(NodeId(2), 1, &past, reads.clone());
    assert!(
        seen.iter().all(|o| matches!(o, Object::Register(Some((v, _))) if v == "v1")),
        "{seen:?}"
    );
    // Another data center sees all four once uniform, or none before.
    for _ in 0..50 {
        c.run(1);
        let (_, seen) = c.tx(NodeId(11), 2, &zero, reads.clone());
        let set = seen.iter().filter(|o| matches!(o, Object::Register(Some(_)))).count();
        assert!(set == 0 || set == 4, "atomic visibility: {seen:?}");
    }
}

#[test]
fn a_barrier_makes_the_past_survive_its_data_center_and_attach_carries_the_session() {
    let mut c = Cluster::new(1, 2);
    let zero = Vector::zero(3);
    let (past, _) =
        c.tx(NodeId(1), 1, &zero, vec![(key("x"), Some(Update::GAdd(key("e"))), Kind::GSet)]);
    assert_eq!(c.call(NodeId(1), 1, GeoOp::Barrier { past: past.clone() }), GeoResult::Synced);
    c.down.push(0);
    assert_eq!(c.call(NodeId(21), 1, GeoOp::Attach { past: past.clone() }), GeoResult::Synced);
    let (_, seen) = c.tx(NodeId(22), 1, &past, vec![(key("x"), None, Kind::GSet)]);
    assert!(matches!(&seen[0], Object::GSet(s) if s.contains(&key("e"))), "{seen:?}");
}

#[test]
fn a_transaction_of_another_session_or_closed_is_refused() {
    let mut c = Cluster::new(0, 1);
    let GeoResult::Began { tx, .. } = c.call(NodeId(1), 1, GeoOp::Begin { past: Vector::zero(1) })
    else {
        panic!()
    };
    let tag = RequestTag(999);
    c.step(NodeId(1), Input::Client(GeoRequest { tag, session: 2, op: GeoOp::Commit { tx } }));
    assert!(c.replies.iter().any(|r| r.tag == tag && r.result.is_err()));
    let other = TxId { node: 1, seq: 0 };
    let tag = RequestTag(1000);
    c.step(
        NodeId(1),
        Input::Client(GeoRequest { tag, session: 1, op: GeoOp::Commit { tx: other } }),
    );
    assert!(c.replies.iter().any(|r| r.tag == tag && r.result.is_err()));
}

#[test]
fn a_value_over_the_limit_is_refused_at_the_coordinator_not_by_a_partitions_gate() {
    let mut c = Cluster::new(0, 2);
    for node in c.nodes.values_mut() {
        node.config.limits.value_bytes_max = 4;
    }
    let GeoResult::Began { tx, .. } = c.call(NodeId(1), 1, GeoOp::Begin { past: Vector::zero(1) })
    else {
        panic!()
    };
    let tag = RequestTag(77);
    let update = Update::Set(key("too long"));
    c.step(
        NodeId(1),
        Input::Client(GeoRequest {
            tag,
            session: 1,
            op: GeoOp::Update { tx, key: key("k"), update },
        }),
    );
    assert!(c.replies.iter().any(|r| r.tag == tag && r.result.is_err()), "{:?}", c.replies);
}

#[test]
fn a_replica_marks_that_it_ran_and_after_a_restart_stays_failed() {
    use crate::engine::{Engine, PersistedState};
    let members: Vec<Member> =
        (0..3).map(|dc| Member { node: NodeId(dc + 1), dc, partition: 0 }).collect();
    let config = Config::new(NodeId(1), members, 1);
    let mut fresh =
        <GeoEngine as Engine>::boot(config.clone(), PersistedState::default(), 7, Time(5)).unwrap();
    let first = Engine::step(&mut fresh, Time(6), Input::Tick);
    let mark = first.hard_state.expect("the first step marks that the replica ran");
    assert!(mark.epoch.0 > 0);
    assert!(Engine::step(&mut fresh, Time(7), Input::Tick).hard_state.is_none(), "once");
    let persisted = PersistedState { hard_state: mark, ..PersistedState::default() };
    let mut restarted = <GeoEngine as Engine>::boot(config, persisted, 8, Time(9)).unwrap();
    assert!(restarted.is_lost() && Engine::status(&restarted).lost);
    let begin =
        GeoRequest { tag: RequestTag(1), session: 1, op: GeoOp::Begin { past: Vector::default() } };
    let out = Engine::step(&mut restarted, Time(10), Input::Client(begin));
    assert!(
        matches!(
            &out.replies[..],
            [GeoReply { result: Err(keel_types::KeelError::Unavailable(_)), .. }]
        ),
        "{out:?}"
    );
    assert!(out.messages.is_empty() && out.wake_at.is_none(), "silent to its peers");
}

#[test]
fn a_read_from_a_partition_that_never_answers_fails_and_the_transaction_goes_on() {
    // One data center of two partitions; partition 1's replica never answers (lost).
    let members: Vec<Member> =
        (0..2).map(|p| Member { node: NodeId(p + 1), dc: 0, partition: p }).collect();
    let mut config = Config::new(NodeId(1), members, 0);
    config.tx_timeout = crate::time::Span::from_millis(100);
    let mut node = GeoEngine::boot(config, Time(0)).unwrap();
    let far = (0..100).map(|i| key(&format!("k{i}"))).find(|k| node.partition_of(k) == 1).unwrap();
    let call = |node: &mut GeoEngine, at_ms: u64, tag: u64, op: GeoOp| {
        let request = GeoRequest { tag: RequestTag(tag), session: 1, op };
        node.step(Time(at_ms * 1_000_000), Input::Client(request)).replies
    };
    let began = call(&mut node, 1, 1, GeoOp::Begin { past: Vector::default() });
    let Ok(GeoResult::Began { tx, .. }) = &began[0].result else { panic!("{began:?}") };
    let tx = *tx;
    assert!(
        call(&mut node, 2, 2, GeoOp::Read { tx, key: far.clone(), kind: Kind::Counter }).is_empty()
    );
    let mut late = Vec::new();
    for ms in 3..150 {
        late.extend(node.step(Time(ms * 1_000_000), Input::Tick).replies);
    }
    assert!(
        matches!(
            &late[..],
            [GeoReply {
                tag: RequestTag(2),
                result: Err(keel_types::KeelError::Unavailable(_)),
                ..
            }]
        ),
        "{late:?}"
    );
    // The transaction is idle again: it may go on (here, abort).
    let aborted = call(&mut node, 150, 3, GeoOp::Abort { tx });
    assert!(matches!(aborted[0].result, Ok(GeoResult::Aborted)), "{aborted:?}");
}

impl Cluster {
    /// Opens a strong transaction labelled `label` at `node` and runs `ops`; its id.
    fn strong_ops(
        &mut self,
        node: NodeId,
        session: u64,
        label: Option<&str>,
        ops: Vec<(Key, Option<Update>, Kind)>,
    ) -> TxId {
        let label = label.map(str::to_owned);
        let op = GeoOp::BeginStrong { past: Vector::default(), label };
        let GeoResult::Began { tx, .. } = self.call(node, session, op) else { panic!() };
        for (key, update, kind) in ops {
            let op = match update {
                Some(update) => GeoOp::Update { tx, key, update },
                None => GeoOp::Read { tx, key, kind },
            };
            let GeoResult::Object(_) = self.call(node, session, op) else { panic!() };
        }
        tx
    }

    /// Sends the commits of `txs` (node, session, tx) at once and runs until all answer.
    fn commit_all(
        &mut self,
        txs: &[(NodeId, u64, TxId)],
    ) -> Vec<Result<GeoResult, keel_types::KeelError>> {
        let tags: Vec<RequestTag> = txs
            .iter()
            .map(|&(node, session, tx)| {
                let tag = RequestTag(self.next_tag);
                self.next_tag += 1;
                self.step(
                    node,
                    Input::Client(GeoRequest { tag, session, op: GeoOp::Commit { tx } }),
                );
                tag
            })
            .collect();
        for _ in 0..5_000 {
            if tags.iter().all(|t| self.replies.iter().any(|r| r.tag == *t)) {
                break;
            }
            self.run(1);
        }
        tags.iter()
            .map(|t| self.replies.iter().find(|r| r.tag == *t).expect("answered").result.clone())
            .collect()
    }

    fn declare(&mut self, a: &str, b: &str) {
        for node in self.nodes.values_mut() {
            node.config.conflicts.declare(a, b);
        }
    }
}

fn withdraw(amount: i64) -> Vec<(Key, Option<Update>, Kind)> {
    vec![
        (key("acct"), None, Kind::Counter),
        (key("acct"), Some(Update::Add(-amount)), Kind::Counter),
    ]
}

#[test]
fn a_strong_transaction_commits_and_reaches_every_data_center() {
    let mut c = Cluster::new(1, 2);
    let tx = c.strong_ops(NodeId(11), 1, None, withdraw(-100));
    let results = c.commit_all(&[(NodeId(11), 1, tx)]);
    let Ok(GeoResult::Committed { vector }) = &results[0] else { panic!("{results:?}") };
    assert!(vector.strong > 0, "a strong timestamp: {vector:?}");
    c.run(200);
    for dc in 0..3u32 {
        let node = NodeId(dc * 10 + 2);
        let (_, seen) = c.tx(node, 9, vector, vec![(key("acct"), None, Kind::Counter)]);
        assert_eq!(seen, vec![Object::Counter(100)], "data center {dc}");
    }
    for node in c.nodes.values() {
        assert!(node.certifier.undecided.is_empty() && node.certifier.ballots.is_empty());
    }
}

#[test]
fn concurrent_conflicting_withdrawals_commit_one_and_deposits_all() {
    let mut c = Cluster::new(1, 2);
    c.declare("withdraw", "withdraw");
    let a = c.strong_ops(NodeId(1), 1, Some("withdraw"), withdraw(100));
    let b = c.strong_ops(NodeId(11), 2, Some("withdraw"), withdraw(100));
    let d = c.strong_ops(NodeId(21), 3, Some("withdraw"), withdraw(100));
    let results = c.commit_all(&[(NodeId(1), 1, a), (NodeId(11), 2, b), (NodeId(21), 3, d)]);
    let committed = results.iter().filter(|r| r.is_ok()).count();
    let conflicts =
        results.iter().filter(|r| matches!(r, Err(keel_types::KeelError::Conflict(_)))).count();
    assert_eq!((committed, conflicts), (1, 2), "{results:?}");
    // Deposits do not conflict: all commit, concurrently.
    let deposits: Vec<(NodeId, u64, TxId)> = (0..3u32)
        .map(|dc| {
            let node = NodeId(dc * 10 + 1);
            let session = 10 + u64::from(dc);
            (node, session, c.strong_ops(node, session, Some("deposit"), withdraw(-50)))
        })
        .collect();
    let results = c.commit_all(&deposits);
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    c.run(200);
    let (_, seen) = c.tx(NodeId(22), 9, &Vector::zero(3), vec![(key("acct"), None, Kind::Counter)]);
    assert_eq!(seen, vec![Object::Counter(-100 + 150)]);
}

#[test]
fn a_retry_after_a_conflict_commits_once_it_sees_the_winner() {
    let mut c = Cluster::new(1, 2);
    let a = c.strong_ops(NodeId(1), 1, None, withdraw(10));
    let b = c.strong_ops(NodeId(12), 2, None, withdraw(10));
    let results = c.commit_all(&[(NodeId(1), 1, a), (NodeId(12), 2, b)]);
    assert!(results[0].is_ok() && results[1].is_err(), "{results:?}");
    let mut attempts = 0;
    loop {
        attempts += 1;
        assert!(attempts < 100, "the retry never committed");
        let b = c.strong_ops(NodeId(12), 2, None, withdraw(10));
        if c.commit_all(&[(NodeId(12), 2, b)])[0].is_ok() {
            break;
        }
        c.run(5);
    }
    c.run(200);
    let (_, seen) = c.tx(NodeId(2), 9, &Vector::zero(3), vec![(key("acct"), None, Kind::Counter)]);
    assert_eq!(seen, vec![Object::Counter(-20)]);
}

#[test]
fn the_gate_refuses_a_commit_without_a_strong_timestamp() {
    use super::types::{Body, Message, Record};
    let message =
        |body: Body| Message { boot: 1, peer_boot: 0, ack: 0, first: 0, bodies: vec![body] };
    let tx = TxId { node: 1, seq: 1 };
    let vote = |ok, ts| Body::Vote {
        tx,
        ok,
        ts,
        participants: vec![0],
        expiry: 9,
        ballot: 0,
        answer: false,
    };
    assert!(GeoEngine::check_message(&message(vote(true, 0))).is_err());
    assert!(GeoEngine::check_message(&message(vote(false, 0))).is_ok());
    assert!(GeoEngine::check_message(&message(vote(true, 7))).is_ok());
    let append = |commit, ts| Body::Append {
        ballot: 0,
        first: 0,
        records: vec![Record::Decide { tx, commit, ts }],
        durable: 1,
        everywhere: 0,
    };
    assert!(GeoEngine::check_message(&message(append(true, 0))).is_err());
    assert!(GeoEngine::check_message(&message(append(false, 0))).is_ok());
}

#[test]
fn the_leaders_data_center_fails_and_a_sibling_takes_certification_over() {
    let mut c = Cluster::new(1, 2);
    let a = c.strong_ops(NodeId(11), 1, None, withdraw(10));
    assert!(c.commit_all(&[(NodeId(11), 1, a)])[0].is_ok());
    // Data center 0 (the leaders of ballot 0) fails; after the suspicion time-out data
    // center 1 (ballot 1's) stands and a majority (itself and data center 2) elects it.
    c.down.push(0);
    let mut attempts = 0;
    loop {
        attempts += 1;
        assert!(attempts < 100, "no strong transaction committed after the failover");
        let b = c.strong_ops(NodeId(21), 2, None, withdraw(10));
        if c.commit_all(&[(NodeId(21), 2, b)])[0].is_ok() {
            break;
        }
        c.run(5);
    }
    for node in [NodeId(11), NodeId(12)] {
        let engine = &c.nodes[&node];
        assert!(engine.leads(), "{node} does not lead after the failover");
        assert_eq!(engine.certifier.ballot, 1);
        assert_eq!(engine.counters.takeovers, 1);
    }
    // Both withdrawals are delivered at the survivors.
    c.run(500);
    let (_, seen) = c.tx(NodeId(22), 3, &Vector::zero(3), vec![(key("acct"), None, Kind::Counter)]);
    assert_eq!(seen, vec![Object::Counter(-20)]);
}

#[test]
fn the_gate_refuses_a_ballot_out_of_bounds() {
    use super::types::{Body, Message};
    use super::BALLOT_MAX;
    let message =
        |body: Body| Message { boot: 1, peer_boot: 0, ack: 0, first: 0, bodies: vec![body] };
    assert!(GeoEngine::check_message(&message(Body::Outvoted { ballot: BALLOT_MAX })).is_ok());
    assert!(GeoEngine::check_message(&message(Body::Outvoted { ballot: u64::MAX })).is_err());
    let elect = Body::Elect { ballot: BALLOT_MAX + 1, from: 0 };
    assert!(GeoEngine::check_message(&message(elect)).is_err());
}

#[test]
fn decided_outcomes_are_forgotten_so_memory_follows_what_is_in_flight() {
    // Transactions expire 200 ms after certification; 1,000 strong transactions of both
    // partitions run back to back from every data center.
    const TXS: u64 = 1_000;
    let mut c = Cluster::new(1, 2);
    for node in c.nodes.values_mut() {
        node.config.tx_timeout = Span(200_000_000);
    }
    let both = |amount: i64| {
        vec![
            (key("k0"), Some(Update::Add(amount)), Kind::Counter),
            (key("k1"), Some(Update::Add(amount)), Kind::Counter),
        ]
    };
    let (mut committed, mut held_max) = (0, 0);
    for i in 0..TXS {
        let node = NodeId((i % 3) as u32 * 10 + 1 + (i % 2) as u32);
        let tx = c.strong_ops(node, 100 + i, Some("deposit"), both(1));
        if c.commit_all(&[(node, 100 + i, tx)])[0].is_ok() {
            committed += 1;
        }
        let held = c.nodes.values().map(|n| n.certifier.outcomes.len()).max().unwrap();
        held_max = held_max.max(held);
    }
    assert_eq!(committed, TXS);
    // Held at once, at most: what decides within an expiry, two settling rounds (a leader
    // asks once per retransmission period) and the `Forget` record's round.
    let config = &c.nodes[&NodeId(1)].config;
    let window_ms = (config.tx_timeout.0 + 2 * config.retransmit.0) / 1_000_000 + 20;
    let per_ms = TXS as f64 / (c.now.0 / 1_000_000) as f64;
    let bound = (per_ms * window_ms as f64).ceil() as usize;
    assert!(held_max <= bound, "held {held_max} outcomes at most, over {bound}");
    assert!(bound < TXS as usize / 2, "the run is too short to tell: bound {bound}");
    // Once every expiry passed and the participants settled, nothing is held.
    c.run(1_000);
    for (id, node) in &c.nodes {
        assert_eq!(node.certifier.outcomes.len(), 0, "{id} still holds outcomes");
        assert_eq!(node.counters.outcomes_forgotten, TXS, "{id}");
    }
    let (_, seen) = c.tx(NodeId(22), 9, &Vector::zero(3), vec![(key("k0"), None, Kind::Counter)]);
    assert_eq!(seen, vec![Object::Counter(TXS as i64)]);
}

#[test]
fn a_removed_data_center_is_dropped_its_live_members_stop_and_nothing_is_held_for_it() {
    let mut c = Cluster::new(1, 2);
    let zero = Vector::zero(3);
    let deposit = || vec![(key("acct"), Some(Update::Add(1)), Kind::Counter)];
    // Data center 2 goes silent while data center 0 commits: what 0 sends 2 waits
    // unacknowledged, and 1 keeps 0's transactions until 2 reports storing them.
    c.down.push(2);
    let mut past = zero.clone();
    for _ in 0..20 {
        past = c.tx(NodeId(1), 1, &past, deposit()).0;
    }
    c.run(2_500);
    let status = |c: &Cluster, n: u32| c.nodes[&NodeId(n)].status();
    assert!(status(&c, 11).forwardable > 0, "data center 1 holds 0's transactions for 2");
    assert!(status(&c, 1).unacked > 0, "data center 0 has a backlog for 2");
    let remove = |member: u32| GeoOp::RemoveDc { member: NodeId(member) };
    let refused = |r: Result<GeoResult, keel_types::KeelError>| match r {
        Err(keel_types::KeelError::InvalidArgument(why)) => why,
        other => panic!("not refused: {other:?}"),
    };
    let why = refused(c.call_result(NodeId(1), 0, remove(2)));
    assert!(why.contains("own data center"), "{why}");
    assert!(refused(c.call_result(NodeId(1), 0, remove(99))).contains("not a member"));
    // Data center 2 is suspected: removing 1 too would be two of the one tolerated.
    let why = refused(c.call_result(NodeId(1), 0, remove(11)));
    assert!(why.contains("removed or suspected"), "{why}");
    assert_eq!(c.call(NodeId(1), 0, remove(21)), GeoResult::Synced);
    c.run(200);
    for n in [1, 2, 11, 12] {
        let s = status(&c, n);
        assert_eq!(s.removed, vec![2], "{n} learned of the removal");
        assert_eq!(s.forwardable, 0, "{n} still holds transactions for the removed one");
        // The removed members' channels hold their notice only; what else is unacknowledged
        // is a vector or two in flight, not the 20 transactions queued for data center 2.
        for member in [21, 22] {
            let channel = &c.nodes[&NodeId(n)].channels[&NodeId(member)];
            assert!(
                channel.is_notice() && channel.unacked() == 1,
                "{n} keeps a backlog for {member}"
            );
        }
        assert!(s.unacked <= 4, "{n} keeps a backlog beyond its two notices: {}", s.unacked);
    }
    // Asking again, anywhere, is the same request.
    assert_eq!(c.call(NodeId(12), 0, remove(22)), GeoResult::Synced);
    // Data center 2 runs again: its members are told, stop serving, and are not heard.
    c.down.clear();
    c.run(10_000);
    for n in [21, 22] {
        assert!(c.nodes[&NodeId(n)].is_removed(), "{n} was not told");
        let why = match c.call_result(NodeId(n), 5, GeoOp::Begin { past: zero.clone() }) {
            Err(keel_types::KeelError::Unavailable(why)) => why,
            other => panic!("{n} serves: {other:?}"),
        };
        assert!(why.contains("removed"), "{why}");
    }
    assert!(status(&c, 1).counters.dropped_removed > 0, "nothing from 2 was dropped");
    // The survivors go on, barriers included (uniform with one another).
    let (past, _) = c.tx(NodeId(1), 1, &past, deposit());
    assert_eq!(c.call(NodeId(1), 1, GeoOp::Barrier { past: past.clone() }), GeoResult::Synced);
    let (_, seen) = c.tx(NodeId(12), 2, &past, vec![(key("acct"), None, Kind::Counter)]);
    assert_eq!(seen, vec![Object::Counter(21)]);
}

#[test]
fn two_removals_asked_at_once_at_two_nodes_make_at_most_one_where_f_is_one() {
    let mut c = Cluster::new(1, 2);
    c.run(50);
    // Data center 1's removal asked at node 1, data center 2's at node 12, in the same
    // instant: each passes its own node's count (nothing is suspected yet).
    let ask = |c: &mut Cluster, node: u32, member: u32| {
        let tag = RequestTag(c.next_tag);
        c.next_tag += 1;
        let op = GeoOp::RemoveDc { member: NodeId(member) };
        c.step(NodeId(node), Input::Client(GeoRequest { tag, session: 0, op }));
        tag
    };
    let tags = [ask(&mut c, 1, 11), ask(&mut c, 12, 21)];
    c.run(100);
    let answers: Vec<_> = tags
        .iter()
        .map(|tag| c.replies.iter().find(|r| r.tag == *tag).expect("answered").result.clone())
        .collect();
    let made = answers.iter().filter(|a| a.is_ok()).count();
    assert!(made <= 1, "two removals made where one is tolerated: {answers:?}");
    let removed: std::collections::BTreeSet<u32> =
        c.nodes.values().flat_map(|n| n.status().removed).collect();
    assert_eq!(removed.len(), made, "{removed:?} {answers:?}");
    for answer in answers.iter().filter(|a| a.is_err()) {
        let why = format!("{answer:?}");
        assert!(
            why.contains("holds a promise for the removal") || why.contains("removed or suspected"),
            "{why}"
        );
    }
    // No promise is left held: a removal asked again is decided.
    let promised: Vec<_> = c.nodes.values().filter_map(|n| n.status().removal_promised).collect();
    assert!(promised.is_empty(), "promises still held: {promised:?}");
    if made == 0 {
        assert_eq!(c.call(NodeId(1), 0, GeoOp::RemoveDc { member: NodeId(11) }), GeoResult::Synced);
    }
    // With one removed, a second is refused wherever it is asked.
    let gone = c.nodes[&NodeId(1)].status().removed;
    let gone = *gone.first().or(c.nodes[&NodeId(12)].status().removed.first()).expect("one");
    let live: Vec<u32> = (0..3).filter(|&d| d != gone).collect();
    for (at, dc) in [(live[0], live[1]), (live[1], live[0])] {
        let asked = NodeId(at * 10 + 2);
        let member = NodeId(dc * 10 + 1);
        match c.call_result(asked, 0, GeoOp::RemoveDc { member }) {
            Err(keel_types::KeelError::InvalidArgument(why)) => {
                assert!(why.contains("removed or suspected"), "{why}")
            }
            other => panic!("a second removal at {asked}: {other:?}"),
        }
    }
}

/// Sends `KEEL.NODE REMOVE member` to `node` and delivers what it sends at once, but no
/// answer back: then `node`'s data center fails, before its proposal is decided.
fn ask_then_fail(c: &mut Cluster, node: u32, member: u32, deliver_commits: bool) {
    let tag = RequestTag(c.next_tag);
    c.next_tag += 1;
    let op = GeoOp::RemoveDc { member: NodeId(member) };
    c.step(NodeId(node), Input::Client(GeoRequest { tag, session: 0, op }));
    // The proposals reach the acceptors; if the commit round is to go out, their
    // promises come back and the commits reach the acceptors too. No answer after that
    // reaches `node`.
    for _ in 0..if deliver_commits { 3 } else { 1 } {
        let queued: Vec<_> = c.queue.drain(..).collect();
        for (from, to, message) in queued {
            c.step(to, Input::Message { from, message });
        }
    }
    c.queue.retain(|(_, to, _)| *to != NodeId(node));
    c.down.push(c.dc_of(NodeId(node)));
}

fn removal_promised(c: &Cluster) -> Vec<(u32, u32)> {
    let up = c.nodes.iter().filter(|(id, _)| !c.down.contains(&c.dc_of(**id)));
    up.filter_map(|(id, n)| n.status().removal_promised.map(|dc| (id.0, dc))).collect()
}

#[test]
fn a_promise_whose_proposer_failed_before_deciding_is_aborted_and_blocks_nothing() {
    for held in [false, true] {
        // Three data centers of one node (1, 11, 21), f = 1. Node 1 is asked to remove
        // live data center 2; the acceptors 11 and 21 promise it, and node 1's data
        // center fails before it hears them.
        let mut c = Cluster::new(1, 1);
        for node in c.nodes.values_mut() {
            node.config.unsafe_promises_held = held;
        }
        c.run(50);
        ask_then_fail(&mut c, 1, 21, false);
        assert_eq!(removal_promised(&c), vec![(11, 2), (21, 2)]);
        // Data center 0 is suspected after 2 s. Removing it is within f (2's removal was
        // never made), but the acceptors hold their promise for 2: refused, naming it.
        c.run(2_500);
        match c.call_result(NodeId(11), 0, GeoOp::RemoveDc { member: NodeId(1) }) {
            Err(keel_types::KeelError::Busy(why)) => {
                assert!(why.contains("promise for the removal of data center 2"), "{why}")
            }
            other => panic!("not refused while the promise is held: {other:?}"),
        }
        // Three suspicion time-outs after promising, each acceptor asks the others to
        // abort; both record it aborted, a majority: released.
        c.run(4_000);
        if held {
            assert_eq!(removal_promised(&c), vec![(11, 2), (21, 2)], "the control released it");
            let r = c.call_result(NodeId(11), 0, GeoOp::RemoveDc { member: NodeId(1) });
            assert!(matches!(r, Err(keel_types::KeelError::Busy(_))), "{r:?}");
            continue;
        }
        assert_eq!(removal_promised(&c), vec![], "a promise still held");
        let counters = [11, 21].map(|n| c.nodes[&NodeId(n)].status().counters);
        assert!(counters.iter().all(|c| c.removal_asks >= 1), "an acceptor never asked");
        assert_eq!(c.call(NodeId(11), 0, GeoOp::RemoveDc { member: NodeId(1) }), GeoResult::Synced);
        c.run(100);
        for n in [11, 21] {
            assert_eq!(c.nodes[&NodeId(n)].status().removed, vec![0], "{n}");
        }
        // Data center 0 was cut off, not down: back, it learns it was removed, and its
        // old proposal of 2's removal, never made, stays unmade.
        c.down.clear();
        c.run(10_000);
        assert!(c.nodes[&NodeId(1)].is_removed(), "node 1 was not told");
        for n in [11, 21] {
            assert_eq!(c.nodes[&NodeId(n)].status().removed, vec![0], "{n}");
        }
    }
}

/// Whether a majority of the acceptors recorded the commit of some proposal of `dc`'s
/// removal (it was made, known to anyone or not).
fn made_by_votes(c: &Cluster, dc: u32) -> bool {
    let mut by: BTreeMap<(NodeId, u64), usize> = BTreeMap::new();
    for n in c.nodes.values() {
        for (ballot, r) in &n.agreement.votes {
            if r.change.dc == dc && matches!(r.vote, super::engine::agree::Vote::Committed) {
                *by.entry(*ballot).or_default() += 1;
            }
        }
    }
    by.values().any(|&v| v > n_dcs(c) / 2)
}

fn n_dcs(c: &Cluster) -> usize {
    c.nodes.keys().map(|n| c.dc_of(*n)).collect::<std::collections::BTreeSet<_>>().len()
}

#[test]
fn a_commit_recorded_stands_against_later_asks_so_a_removal_made_unseen_still_counts() {
    for control in [false, true] {
        // Node 1 is asked to remove data center 2; 1 and 11 promise and record the
        // commit (a majority: the removal is made), and data center 0 fails before node
        // 1 hears the votes. Nobody knows it made.
        let mut c = Cluster::new(1, 1);
        for node in c.nodes.values_mut() {
            node.config.unsafe_abort_committed = control;
        }
        c.run(50);
        c.down.push(2);
        ask_then_fail(&mut c, 1, 21, true);
        c.down.retain(|&d| d != 2);
        let votes: Vec<_> = c.nodes.values().map(|n| format!("{:?}", n.agreement.votes)).collect();
        assert!(made_by_votes(&c, 2), "the commit did not reach a majority: {votes:?}");
        assert_eq!(c.nodes[&NodeId(11)].status().removal_committed, vec![2]);
        // 11 asks about its committed vote: 21 aborts it (it never heard of it), 1 is
        // down. Undecided, 11 counts 2 removed, so removing 0 as well is refused.
        c.run(8_000);
        let r = c.call_result(NodeId(21), 0, GeoOp::RemoveDc { member: NodeId(1) });
        if control {
            // The control lets 11 abort its own commit: released, and 0 is removed too.
            assert_eq!(r, Ok(GeoResult::Synced), "the control refused");
            assert!(made_by_votes(&c, 2) || c.nodes[&NodeId(11)].status().removed.contains(&0));
            continue;
        }
        match r {
            Err(keel_types::KeelError::InvalidArgument(why)) => {
                assert!(why.contains("removed or suspected"), "{why}")
            }
            other => panic!("a second removal where one was made: {other:?}"),
        }
        assert_eq!(c.nodes[&NodeId(11)].status().removal_committed, vec![2]);
        // Data center 0 back: 11's vote reaches node 1, which learns the removal made,
        // and everyone with it.
        c.down.clear();
        c.run(10_000);
        for n in [1, 11] {
            assert_eq!(c.nodes[&NodeId(n)].status().removed, vec![2], "{n}");
        }
        assert!(c.nodes[&NodeId(21)].is_removed(), "21 was not told");
    }
}

#[test]
fn returns_are_agreed_one_at_a_time_from_a_removed_data_center_only() {
    let mut strong = Cluster::new(1, 1);
    assert_eq!(
        strong.call(NodeId(1), 0, GeoOp::RemoveDc { member: NodeId(21) }),
        GeoResult::Synced
    );
    match strong.call_result(NodeId(1), 0, GeoOp::ReturnDc { member: NodeId(21) }) {
        Err(keel_types::KeelError::InvalidArgument(why)) => {
            assert!(why.contains("strong"), "{why}")
        }
        other => panic!("a return in a strong keyspace: {other:?}"),
    }
    let mut c = Cluster::with_strong(2, 1, false);
    c.run(50);
    let remove = |member: u32| GeoOp::RemoveDc { member: NodeId(member) };
    let back = |member: u32| GeoOp::ReturnDc { member: NodeId(member) };
    let refused = |r: Result<GeoResult, keel_types::KeelError>| match r {
        Err(keel_types::KeelError::InvalidArgument(why) | keel_types::KeelError::Busy(why)) => why,
        other => panic!("not refused: {other:?}"),
    };
    let why = refused(c.call_result(NodeId(1), 0, back(41)));
    assert!(why.contains("not removed"), "{why}");
    assert_eq!(c.call(NodeId(1), 0, remove(41)), GeoResult::Synced);
    assert_eq!(c.call(NodeId(1), 0, remove(31)), GeoResult::Synced);
    c.run(200);
    // Both returns asked at once, at two nodes: one is made, the other refused (a promise
    // for the first held, or the first under way), never both.
    let ask = |c: &mut Cluster, node: u32, member: u32| {
        let tag = RequestTag(c.next_tag);
        c.next_tag += 1;
        c.step(NodeId(node), Input::Client(GeoRequest { tag, session: 0, op: back(member) }));
        tag
    };
    let tags = [ask(&mut c, 1, 31), ask(&mut c, 21, 41)];
    c.run(200);
    let answers: Vec<_> = tags
        .iter()
        .map(|tag| c.replies.iter().find(|r| r.tag == *tag).expect("answered").result.clone())
        .collect();
    assert!(answers.iter().filter(|a| a.is_ok()).count() <= 1, "{answers:?}");
    let live = [1, 11, 21];
    let returning = |c: &Cluster| -> Vec<Vec<u32>> {
        live.iter().map(|n| c.nodes[&NodeId(*n)].status().returning).collect()
    };
    if answers.iter().all(|a| a.is_err()) {
        assert_eq!(c.call(NodeId(11), 0, back(41)), GeoResult::Synced);
        c.run(200);
    }
    let made = returning(&c)[0].clone();
    assert_eq!(made.len(), 1, "{:?} {answers:?}", returning(&c));
    assert_eq!(returning(&c), vec![made.clone(); 3], "every survivor learns the return");
    let (dc, other) = if made == [3] { (3, 4) } else { (4, 3) };
    for n in live {
        let s = c.nodes[&NodeId(n)].status();
        let mut epochs = vec![0; 5];
        epochs[dc as usize] = 2;
        epochs[other as usize] = 1;
        assert_eq!(s.epochs, epochs, "{n}");
        assert_eq!(s.removed, vec![3, 4], "{n}: a returning data center stays removed for now");
        assert_eq!(s.return_promised, None, "{n} holds a promise");
    }
    // Asking again is the same request; the other data center waits for this one.
    assert_eq!(c.call(NodeId(21), 0, back(dc * 10 + 1)), GeoResult::Synced);
    let why = refused(c.call_result(NodeId(21), 0, back(other * 10 + 1)));
    assert!(why.contains("one at a time"), "{why}");
    // A returning data center still counts as removed: removing a third is beyond f.
    let why = refused(c.call_result(NodeId(1), 0, remove(11)));
    assert!(why.contains("removed or suspected"), "{why}");
    // Removing it again abandons the return; then the other may come back.
    assert_eq!(c.call(NodeId(11), 0, remove(dc * 10 + 1)), GeoResult::Synced);
    c.run(200);
    assert_eq!(c.call(NodeId(11), 0, back(other * 10 + 1)), GeoResult::Synced);
    c.run(200);
    for n in live {
        let s = c.nodes[&NodeId(n)].status();
        assert_eq!(s.returning, vec![other], "{n}");
        assert_eq!((s.epochs[dc as usize], s.epochs[other as usize]), (3, 2), "{n}");
    }
}

#[test]
fn a_returning_data_center_joins_cuts_copies_and_comes_back_in_a_new_life() {
    let mut c = Cluster::with_strong(1, 2, false);
    let zero = Vector::zero(3);
    let deposit = |k: &str| vec![(key(k), Some(Update::Add(1)), Kind::Counter)];
    // Every data center writes; data center 2's transactions reach the others, then it
    // fails and is removed.
    let mut pasts = vec![zero.clone(); 3];
    for _ in 0..5 {
        for dc in 0..3u32 {
            let node = NodeId(dc * 10 + 1);
            pasts[dc as usize] = c.tx(node, u64::from(dc) + 1, &pasts[dc as usize], deposit("a")).0;
        }
    }
    c.run(100);
    c.down.push(2);
    c.run(2_500);
    assert_eq!(c.call(NodeId(1), 0, GeoOp::RemoveDc { member: NodeId(21) }), GeoResult::Synced);
    c.run(200);
    // New replicas of data center 2 boot joining, wiped: silent, refusing clients.
    let members = c.nodes[&NodeId(1)].config.members.clone();
    for n in [21, 22] {
        let mut config = Config::new(NodeId(n), members.clone(), 1);
        config.wall_clock_origin_us = 1_000_000;
        config.strong = false;
        config.joining = true;
        c.nodes.insert(NodeId(n), GeoEngine::boot(config, c.now).unwrap());
    }
    c.down.clear();
    c.run(100);
    match c.call_result(NodeId(21), 9, GeoOp::Begin { past: zero.clone() }) {
        Err(keel_types::KeelError::Unavailable(why)) => assert!(why.contains("joining"), "{why}"),
        other => panic!("a joining replica serves: {other:?}"),
    }
    assert!(c.nodes[&NodeId(21)].joining.as_ref().unwrap().epoch.is_none());
    // The return is made: the survivors answer, the new replicas cut, the survivors
    // apply the cut and settle.
    assert_eq!(c.call(NodeId(11), 0, GeoOp::ReturnDc { member: NodeId(22) }), GeoResult::Synced);
    for _ in 0..500 {
        c.run(1);
        if !c.nodes[&NodeId(21)].status().joining {
            break;
        }
    }
    // Just back, its view is still below what survived: a new session waits for it.
    match c.call_result(NodeId(21), 9, GeoOp::Begin { past: zero.clone() }) {
        Err(keel_types::KeelError::Unavailable(why)) => {
            assert!(why.contains("catching up"), "{why}")
        }
        other => panic!("a new replica just back serves an old view: {other:?}"),
    }
    c.run(500);
    let cut = c.nodes[&NodeId(21)].status().cuts.first().expect("the cut was made").1;
    for n in [1, 2, 11, 12] {
        let e = &c.nodes[&NodeId(n)];
        let s = e.status();
        assert_eq!(s.cuts, vec![(2, cut, 2)], "{n} applied the cut");
        let life = 1 << 62;
        let within = |v: u64| v <= cut || v >= life;
        assert!(within(s.uniform.dcs[2]), "{n} showed data center 2's old life above the cut");
        assert!(s.known.dcs[2] >= life, "{n} never heard data center 2's new life");
        assert!(s.removed.is_empty(), "{n}: data center 2 is back");
        assert!(s.counters.returns_back == 1, "{n} heard its new sibling back");
    }
    // Each new replica copied its partition from a settled survivor and is back.
    for n in [21, 22] {
        let e = &c.nodes[&NodeId(n)];
        let s = e.status();
        assert!(!s.joining && s.counters.copies_installed == 1, "{n} is not back");
        assert_eq!(s.epochs, vec![0, 0, 2]);
        assert_eq!(s.cuts, vec![(2, cut, 2)], "{n} keeps its own cut");
        assert!(e.clock() >= 1 << 62, "{n}: its clock runs in the old life");
    }
    // Data center 2's five transactions survive at the cut: its old life is below it.
    assert!(cut >= pasts[2].dcs[2], "the cut {cut} drops a transaction every survivor had");
    // The survivors go on, and the new life serves what survived, then its own writes.
    let (_, seen) = c.tx(NodeId(12), 7, &pasts[0], vec![(key("a"), None, Kind::Counter)]);
    assert_eq!(seen, vec![Object::Counter(15)]);
    let (_, seen) = c.tx(NodeId(21), 8, &pasts[2], vec![(key("a"), None, Kind::Counter)]);
    assert_eq!(seen, vec![Object::Counter(15)], "the copy lacks what survived");
    let (_, seen) = c.tx(NodeId(22), 11, &zero, vec![(key("a"), None, Kind::Counter)]);
    assert_eq!(seen, vec![Object::Counter(15)], "a new session's first view lacks what survived");
    assert!(c.nodes[&NodeId(21)].status().counters.begins_held >= 1);
    let (after, _) = c.tx(NodeId(21), 8, &pasts[2], deposit("a"));
    assert!(after.dcs[2] >= 1 << 62, "a new-life commit below the new life: {after:?}");
    c.run(500);
    let (_, seen) = c.tx(NodeId(1), 9, &after, vec![(key("a"), None, Kind::Counter)]);
    assert_eq!(seen, vec![Object::Counter(16)], "the new life's write did not reach a survivor");
    stale_pasts_expire(&mut c, &pasts[2], cut);
}

/// A past naming data center 2's old life above its cut `cut` is gone: at a survivor and
/// at the new life, its session starts over.
fn stale_pasts_expire(c: &mut Cluster, past: &Vector, cut: u64) {
    let mut stale = past.clone();
    stale.dcs[2] = cut + 1;
    for n in [1, 21] {
        for op in [
            GeoOp::Begin { past: stale.clone() },
            GeoOp::Barrier { past: stale.clone() },
            GeoOp::Attach { past: stale.clone() },
        ] {
            match c.call_result(NodeId(n), 10, op.clone()) {
                Err(keel_types::KeelError::SessionExpired) => {}
                other => panic!("{n} took a stale past in {op:?}: {other:?}"),
            }
        }
    }
}

#[test]
fn a_return_abandoned_starts_the_new_replicas_over_and_the_next_return_takes_them() {
    let mut c = Cluster::with_strong(1, 1, false);
    c.run(50);
    c.down.push(2);
    c.run(2_500);
    assert_eq!(c.call(NodeId(1), 0, GeoOp::RemoveDc { member: NodeId(21) }), GeoResult::Synced);
    let members = c.nodes[&NodeId(1)].config.members.clone();
    let mut config = Config::new(NodeId(21), members, 1);
    config.wall_clock_origin_us = 1_000_000;
    config.strong = false;
    config.joining = true;
    c.nodes.insert(NodeId(21), GeoEngine::boot(config, c.now).unwrap());
    c.down.clear();
    c.run(100);
    // Before the return, the survivors' notices of the removal reach it: it records them
    // and goes on waiting.
    assert!(c.nodes[&NodeId(21)].status().joining);
    // Data center 1's answer never reaches it: the return waits for its cut.
    c.blocked.push((NodeId(11), NodeId(21)));
    assert_eq!(c.call(NodeId(1), 0, GeoOp::ReturnDc { member: NodeId(21) }), GeoResult::Synced);
    c.run(300);
    assert_eq!(c.nodes[&NodeId(21)].status().join.unwrap().epoch, Some(2));
    assert!(c.nodes[&NodeId(1)].status().counters.joins_heard > 0);
    // Removed again: the return is abandoned, the new replica starts over as a wiped one
    // (a new boot, the epochs kept), and the survivors drop what it sends.
    let boot = c.nodes[&NodeId(21)].boot;
    assert_eq!(c.call(NodeId(11), 0, GeoOp::RemoveDc { member: NodeId(21) }), GeoResult::Synced);
    c.run(300);
    let e = &c.nodes[&NodeId(21)];
    assert!(!e.is_removed() && e.boot > boot, "the new replica did not start over");
    let s = e.status();
    assert_eq!(s.join.unwrap().epoch, None, "it still joins the abandoned return");
    assert_eq!((s.epochs.clone(), s.counters.joins_restarted), (vec![0, 0, 3], 1));
    for n in [1, 11] {
        let e = &c.nodes[&NodeId(n)];
        assert_eq!(e.status().epochs, vec![0, 0, 3], "{n}");
        assert!(e.welcomes[2].is_none() && e.removed_nodes.contains(&NodeId(21)), "{n}");
        assert!(e.channels[&NodeId(21)].is_notice(), "{n}");
    }
    // Taken back again, the same machine joins and comes back, data center 1's answer
    // through.
    c.blocked.clear();
    assert_eq!(c.call(NodeId(1), 0, GeoOp::ReturnDc { member: NodeId(21) }), GeoResult::Synced);
    c.run(1_000);
    let s = c.nodes[&NodeId(21)].status();
    assert!(!s.joining && s.counters.copies_installed == 1, "not back: {:?}", s.join);
    for n in [1, 11] {
        let s = c.nodes[&NodeId(n)].status();
        assert_eq!((s.epochs, s.returning), (vec![0, 0, 4], vec![]), "{n}");
    }
}
