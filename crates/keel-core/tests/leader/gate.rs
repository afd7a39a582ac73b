//! The validation gate under arbitrary input: messages with every field drawn from edge
//! values (zero, the current epoch and its neighbours, the limits and past them,
//! `u64::MAX`), entries contiguous or not, reads inside log entries, snapshot chunks that
//! lie, from members and non-members, fed to a leader, a follower and a candidate of a
//! running cluster. No engine may panic, then or while the cluster goes on.

use super::*;
use keel_core::leader::kv::Kv;
use keel_types::limits::EPOCH_MAX;
use keel_types::{EntryPayload, Epoch, SnapshotMeta};
use proptest::collection::vec;
use proptest::prelude::*;

fn edge_u64(small: u64) -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 0..small,
        1 => Just(EPOCH_MAX),
        1 => Just(EPOCH_MAX + 1),
        1 => Just(u64::MAX),
        1 => any::<u64>(),
    ]
}

fn epoch() -> impl Strategy<Value = Epoch> {
    edge_u64(8).prop_map(Epoch)
}

fn index() -> impl Strategy<Value = LogIndex> {
    edge_u64(60).prop_map(LogIndex)
}

/// Times near the harness's clocks (nodes start about 5 s in) and far from them.
fn time() -> impl Strategy<Value = Time> {
    prop_oneof![4 => 0u64..20_000 * MS, 1 => Just(u64::MAX), 1 => any::<u64>()].prop_map(Time)
}

fn key() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![Just(b"k".to_vec()), Just(b"d0".to_vec()), vec(any::<u8>(), 0..4)]
}

fn command() -> impl Strategy<Value = Command> {
    prop_oneof![
        (key(), vec(any::<u8>(), 0..8))
            .prop_map(|(key, value)| Command::Put { key: key.into(), value: value.into() }),
        key().prop_map(|key| Command::Delete { key: key.into() }),
        (key(), any::<i64>()).prop_map(|(key, delta)| Command::Incr { key: key.into(), delta }),
        (key(), proptest::option::of(vec(any::<u8>(), 0..4)), vec(any::<u8>(), 0..4)).prop_map(
            |(key, expected, new)| Command::Cas {
                key: key.into(),
                expected: expected.map(Into::into),
                new: new.into()
            }
        ),
        key().prop_map(|key| Command::Get { key: key.into() }),
        (key(), any::<u32>()).prop_map(|(start, limit)| Command::Scan {
            start: start.into(),
            end: None,
            limit
        }),
    ]
}

fn payload() -> impl Strategy<Value = EntryPayload> {
    prop_oneof![
        1 => Just(EntryPayload::Noop),
        1 => (1..=keel_types::limits::DEDUP_CLIENTS_CEILING).prop_map(|dedup_clients_max| {
            EntryPayload::Settings(keel_types::ApplySettings { dedup_clients_max })
        }),
        3 => (any::<u64>(), any::<u64>(), command()).prop_map(|(client, request, command)| {
            EntryPayload::Write {
                client: ClientId(client),
                request: RequestId(request),
                durability: Durability::Memory,
                command,
            }
        }),
    ]
}

/// Entries that pass the stateless rules (contiguous, epochs rising slowly) so that the
/// stateful ones and the engine behind them are reached, or anything at all.
fn entries() -> impl Strategy<Value = (Epoch, LogIndex, Vec<Entry>)> {
    let contiguous =
        (0u64..8, 0u64..50, vec((0u64..2, payload()), 0..6)).prop_map(|(epoch, prev, steps)| {
            let mut e = epoch;
            let entries = steps
                .into_iter()
                .enumerate()
                .map(|(i, (bump, payload))| {
                    e += bump;
                    Entry { epoch: Epoch(e), index: LogIndex(prev + 1 + i as u64), payload }
                })
                .collect();
            (Epoch(epoch), LogIndex(prev), entries)
        });
    let anything = (epoch(), index(), vec((epoch(), index(), payload()), 0..4)).prop_map(
        |(prev_epoch, prev, raw)| {
            let entries =
                raw.into_iter().map(|(epoch, index, payload)| Entry { epoch, index, payload });
            (prev_epoch, prev, entries.collect())
        },
    );
    prop_oneof![3 => contiguous, 1 => anything]
}

fn lease() -> impl Strategy<Value = Lease> {
    prop_oneof![
        Just(Lease::Withheld),
        Just(Lease::MarkOut),
        time().prop_map(|anchor| Lease::Granted { anchor }),
    ]
}

/// A snapshot's bytes: random, or a real encoding of a state at `index` (so that chunks
/// reassemble into something that decodes).
fn snapshot_data(index: u64) -> Vec<u8> {
    let mut kv = Kv::new(16);
    for i in 1..=index.min(64) {
        kv.apply(&Entry { epoch: Epoch(1), index: LogIndex(i), payload: EntryPayload::Noop });
    }
    kv.encode_at(LogIndex(index.min(64)))
}

fn install_snapshot() -> impl Strategy<Value = Message> {
    (epoch(), 1u64..60, any::<bool>(), vec(any::<u8>(), 0..64), 0u64..80, edge_u64(200)).prop_map(
        |(epoch, at, real, noise, offset, total)| {
            let meta = SnapshotMeta { last_index: LogIndex(at), last_epoch: Epoch(epoch.0.min(1)) };
            let (offset, total, data) = if real {
                let data = snapshot_data(at);
                (0, data.len() as u64, data)
            } else {
                (offset, total, noise)
            };
            Message::InstallSnapshot { epoch, meta, offset, total, data }
        },
    )
}

fn request() -> impl Strategy<Value = ClientRequest> {
    (any::<u64>(), any::<u64>(), any::<u64>(), command()).prop_map(
        |(tag, client, request, command)| ClientRequest {
            tag: RequestTag(tag),
            client: ClientId(client),
            request: RequestId(request),
            command,
            durability: Some(Durability::Durable),
            level: Some(ReadLevel::Linearizable),
            after: LogIndex(tag % 7),
            mode: Default::default(),
            named: false,
        },
    )
}

fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        (epoch(), epoch(), index(), any::<bool>()).prop_map(
            |(epoch, last_epoch, last_index, transfer)| Message::RequestVote {
                epoch,
                last_epoch,
                last_index,
                transfer
            }
        ),
        (epoch(), epoch(), index()).prop_map(|(epoch, last_epoch, last_index)| {
            Message::TimeoutNow { epoch, last_epoch, last_index }
        }),
        (epoch(), epoch(), index()).prop_map(|(epoch, last_epoch, last_index)| {
            Message::PreVote { epoch, last_epoch, last_index }
        }),
        (epoch(), any::<bool>()).prop_map(|(epoch, granted)| Message::Vote { epoch, granted }),
        (epoch(), any::<bool>())
            .prop_map(|(epoch, granted)| Message::PreVoteReply { epoch, granted }),
        (epoch(), entries(), index(), index(), lease(), proptest::option::of(index()), time())
            .prop_map(
                |(epoch, (prev_epoch, prev_index, entries), commit, durable, lease, flush, at)| {
                    Message::Append {
                        epoch,
                        prev_epoch,
                        prev_index,
                        entries,
                        commit_index: commit,
                        durable_index: durable,
                        lease,
                        flush_through: flush,
                        sent_at: at,
                    }
                }
            ),
        (
            epoch(),
            any::<bool>(),
            (index(), index(), index(), index()),
            any::<bool>(),
            time(),
            time()
        )
            .prop_map(
                |(epoch, success, (last, persisted, applied, matched), released, echo, at)| {
                    Message::AppendReply {
                        epoch,
                        success,
                        last_index: last,
                        persisted_index: persisted,
                        applied_index: applied,
                        match_index: matched,
                        released,
                        echo_sent_at: echo,
                        sent_at: at,
                    }
                }
            ),
        install_snapshot(),
        (epoch(), index(), edge_u64(300)).prop_map(|(epoch, last_index, received)| {
            Message::InstallSnapshotReply { epoch, last_index, received }
        }),
        (epoch(), request()).prop_map(|(epoch, request)| Message::Forward { epoch, request }),
        (epoch(), any::<u64>()).prop_map(|(epoch, tag)| Message::ForwardReply {
            epoch,
            reply: ClientReply {
                tag: RequestTag(tag),
                served_by: NodeId(1),
                result: Err(KeelError::Timeout),
                durability_round: false,
            },
        }),
    ]
}

/// A cluster with a leader, a log past a snapshot, and one node in the role `target`
/// picks (0 leader, 1 follower, 2 candidate when one can be caught, else a follower).
fn prepared(seed: u64, target: u8) -> (Cluster, NodeId) {
    let mut c = Cluster::new(3, seed, |config| config.snapshot_entries_threshold = 8);
    c.check = false;
    let leader = c.await_leader();
    for i in 0..12 {
        c.put(leader, &format!("k{i}"), "v", Durability::Replicated);
        c.run_for(2);
    }
    c.run_for(300);
    let follower = c.nodes.keys().copied().find(|n| *n != leader).expect("three nodes");
    let id = match target {
        0 => leader,
        1 => follower,
        _ => {
            c.crash(leader);
            let candidate = |c: &Cluster| {
                c.nodes.iter().find_map(|(id, n)| {
                    let status = n.replica.as_ref()?.engine().status();
                    (status.role == Role::Candidate).then_some(*id)
                })
            };
            c.run_until_cond(3_000, |c| candidate(c).is_some());
            candidate(&c).unwrap_or(follower)
        }
    };
    (c, id)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn arbitrary_messages_never_panic_an_engine_in_any_role(
        seed in 0u64..3,
        target in 0u8..3,
        script in vec((1u32..=4, message()), 1..10),
    ) {
        let (mut c, id) = prepared(seed, target);
        for (from, message) in script {
            let from = NodeId(from); // 4 is not a member
            if from == id || c.nodes[&id].replica.is_none() {
                continue;
            }
            c.step(id, Input::Message { from, message });
            c.run_for(3);
        }
        c.run_for(1_000);
    }
}

#[test]
fn each_panic_found_before_the_gate_is_now_a_named_rejection() {
    let (mut c, leader) = prepared(1, 0);
    let follower = c.nodes.keys().copied().find(|n| *n != leader).unwrap();
    let epoch = c.status(leader).epoch;
    let last = c.status(leader).last_index;
    let now = c.local(leader);
    let reply = |match_index: LogIndex, echo: Time| Message::AppendReply {
        epoch,
        success: true,
        last_index: LogIndex(u64::MAX),
        persisted_index: match_index,
        applied_index: match_index,
        match_index,
        released: false,
        echo_sent_at: echo,
        sent_at: Time(0),
    };
    let cases = [
        (leader, reply(last, now), "log index out of range"),
        (
            leader,
            Message::RequestVote {
                epoch: Epoch(u64::MAX),
                last_epoch: epoch,
                last_index: last,
                transfer: false,
            },
            "epoch out of range",
        ),
        (
            follower,
            Message::Append {
                epoch,
                prev_epoch: epoch,
                prev_index: last,
                entries: vec![Entry {
                    epoch,
                    index: last.next(),
                    payload: EntryPayload::Write {
                        client: ClientId(1),
                        request: RequestId(1),
                        durability: Durability::Memory,
                        command: Command::Get { key: b"k".to_vec().into() },
                    },
                }],
                commit_index: last,
                durable_index: last,
                lease: Lease::Withheld,
                flush_through: None,
                sent_at: Time(0),
            },
            "a read inside a log entry",
        ),
    ];
    for (to, message, reason) in cases {
        let from = if to == leader { follower } else { leader };
        assert_eq!(deliver(&mut c, to, from, message), vec![reason]);
    }
    // Stateful: a reply matching past the leader's log, one echoing the future.
    let now = c.local(leader);
    let future = Time(now.0 + 10 * MS);
    let rejected_before = c.engine(leader).counters().messages_rejected;
    for (message, reason) in [
        (reply(LogIndex(last.0 + 5), now), "append reply matches past the leader's log"),
        (reply(last, future), "append reply echoes a send time from the future"),
    ] {
        let mut message = message;
        if let Message::AppendReply { last_index, .. } = &mut message {
            *last_index = last;
        }
        assert_eq!(deliver(&mut c, leader, follower, message), vec![reason]);
    }
    assert_eq!(c.engine(leader).counters().messages_rejected, rejected_before + 2);
    assert_eq!(c.engine(leader).role_kind(), Role::Leader, "rejections change nothing");
    assert_eq!(c.status(leader).epoch, epoch);
}

fn noop(epoch: Epoch, index: u64) -> Entry {
    Entry { epoch, index: LogIndex(index), payload: EntryPayload::Noop }
}

fn forged_append(epoch: Epoch, prev: (Epoch, LogIndex), entries: Vec<Entry>) -> Message {
    Message::Append {
        epoch,
        prev_epoch: prev.0,
        prev_index: prev.1,
        entries,
        commit_index: LogIndex::ZERO,
        durable_index: LogIndex::ZERO,
        lease: Lease::Withheld,
        flush_through: None,
        sent_at: Time(0),
    }
}

/// A prepared cluster's follower (which took a snapshot) and its leader.
fn follower_and_leader() -> (Cluster, NodeId, NodeId) {
    let (c, follower) = prepared(1, 1);
    let leader = c.leader().expect("the prepared cluster has a leader");
    assert_ne!(leader, follower);
    (c, follower, leader)
}

/// Steps `to` with a message from `from` at its current time; returns what it rejected.
fn deliver(c: &mut Cluster, to: NodeId, from: NodeId, message: Message) -> Vec<&'static str> {
    c.rejected.clear();
    c.step(to, Input::Message { from, message });
    assert!(c.rejected.iter().all(|r| r.from == from));
    c.rejected.drain(..).map(|r| r.reason).collect()
}

#[test]
fn entries_replacing_the_verified_prefix_of_the_same_epoch_are_rejected() {
    // The prefix verified against this epoch's leader may lie above the durable index;
    // an append that truncated it used to leave the follower having verified more than
    // its log holds (an engine assertion).
    let (mut c, follower, leader) = follower_and_leader();
    let status = c.status(follower);
    let (old, last) = (status.epoch, status.last_index);
    let next = Epoch(old.0 + 1);
    let grow = forged_append(
        next,
        (old, last),
        vec![noop(old, last.0 + 1), noop(next, last.0 + 2), noop(next, last.0 + 3)],
    );
    assert_eq!(deliver(&mut c, follower, leader, grow), Vec::<&str>::new());
    assert_eq!(c.status(follower).last_index, LogIndex(last.0 + 3));
    assert!(c.status(follower).durable_index < LogIndex(last.0 + 2), "above the durable index");
    let shrink =
        forged_append(next, (old, last), vec![noop(old, last.0 + 1), noop(old, last.0 + 2)]);
    let rejected = deliver(&mut c, follower, leader, shrink);
    assert_eq!(rejected, vec!["entries conflict with the durable or verified prefix"]);
    assert_eq!(c.status(follower).last_index, LogIndex(last.0 + 3), "nothing truncated");
    // From a new epoch's leader, the same entries may replace what is not durable.
    let newer = Epoch(next.0 + 1);
    let replace =
        forged_append(newer, (old, last), vec![noop(old, last.0 + 1), noop(old, last.0 + 2)]);
    assert_eq!(deliver(&mut c, follower, leader, replace), Vec::<&str>::new());
    assert_eq!(c.status(follower).last_index, LogIndex(last.0 + 2));
}

#[test]
fn entries_above_the_snapshot_older_than_it_are_rejected() {
    let (mut c, follower, leader) = follower_and_leader();
    let status = c.status(follower);
    let base = status.snapshot_index;
    assert!(base > LogIndex::ZERO, "the prepared cluster took a snapshot");
    let entries = (1..=base.0 + 1).map(|i| noop(Epoch(0), i)).collect();
    let append = forged_append(status.epoch, (Epoch(0), LogIndex::ZERO), entries);
    assert_eq!(deliver(&mut c, follower, leader, append), vec!["entries older than the snapshot"]);
    assert_eq!(c.status(follower).last_index, status.last_index);
}

#[test]
fn a_snapshot_conflicting_with_the_verified_prefix_is_rejected_before_contact() {
    let (mut c, follower, leader) = follower_and_leader();
    let status = c.status(follower);
    let (old, last) = (status.epoch, status.last_index);
    let next = Epoch(old.0 + 1);
    let grow =
        forged_append(next, (old, last), vec![noop(next, last.0 + 1), noop(next, last.0 + 2)]);
    assert_eq!(deliver(&mut c, follower, leader, grow), Vec::<&str>::new());
    let data = snapshot_data(last.0 + 1);
    let meta = SnapshotMeta { last_index: LogIndex(last.0 + 1), last_epoch: old };
    let snapshot =
        Message::InstallSnapshot { epoch: next, meta, offset: 0, total: data.len() as u64, data };
    // From a third node claiming the same epoch: a second leader of it.
    let third = c.nodes.keys().copied().find(|n| *n != leader && *n != follower).unwrap();
    let rejected = deliver(&mut c, follower, third, snapshot.clone());
    assert_eq!(rejected, vec!["a second leader of this node's epoch"]);
    let rejected = deliver(&mut c, follower, leader, snapshot);
    assert_eq!(rejected, vec!["snapshot conflicts with the durable or verified prefix"]);
    assert_eq!(c.status(follower).last_index, LogIndex(last.0 + 2), "nothing replaced");
}
