//! The encoding of `keel_core::kite::Message`: a format byte, then the message in the
//! postcard format (a compact, serde-derived binary encoding), so that the encoding
//! follows the Kite message types as they change without a hand-kept twin.
//!
//! Decoding hostile bytes: every length is bounded by the bytes present (postcard reads
//! from the slice, and serde never reserves more than a small bound ahead of the items
//! it has read); the message's sizes against the keyspace's limits, and its stamps,
//! ballots and members, are checked by the engine's validation gate after decoding.

use super::{PeerError, PeerLimits};
use keel_core::kite::Message;

/// The only Kite message format this version writes and reads (4: memberships change
/// online: replies carry their sender's membership epoch, views and state pages its
/// membership, and sync queries and membership news exist; 3: replies carry who
/// answered, its incarnation and view, and `ViewAck` exists, for the rejoin's fence; 2:
/// read-modify-write records and outcomes carry the digest of their command, and records
/// what they settle; 1 had neither). A node refuses every other format by name, so a
/// cluster never mixes nodes with and without the fence.
pub const KITE_FORMAT_V4: u8 = 4;

impl super::PeerMessage for Message {
    fn encode(&self, out: &mut Vec<u8>) {
        super::postcard_encode(KITE_FORMAT_V4, self, out);
    }

    fn decode(bytes: &[u8], limits: &PeerLimits) -> Result<Message, PeerError> {
        super::postcard_decode(KITE_FORMAT_V4, "kite message", bytes, limits)
    }

    /// A message carrying client values is charged to its link's allowance; past it, it
    /// is shed without a stand-in: the protocol sends it again, as after a loss.
    fn bulk_bytes(&self) -> usize {
        self.value_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::super::PeerMessage;
    use super::*;
    use bytes::Bytes;
    use keel_core::kite::{
        Ballot, Cursor, Membership, Origin, RmwId, RmwOutcome, RmwRecord, SlotImage, Stamp, View,
    };
    use keel_types::NodeId;
    use proptest::prelude::*;

    fn stamp() -> impl Strategy<Value = Stamp> {
        (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(version, writer, rmw)| Stamp {
            version,
            writer,
            rmw,
        })
    }

    fn bytes() -> impl Strategy<Value = Bytes> {
        proptest::collection::vec(any::<u8>(), 0..8).prop_map(Bytes::from)
    }

    fn outcome() -> impl Strategy<Value = (RmwId, RmwOutcome)> {
        let id = any::<(u64, u64, u64, u64)>();
        (id, proptest::option::of(bytes()), stamp(), bytes(), stamp()).prop_map(
            |((node, session, seq, digest), read, read_stamp, value, stamp)| {
                let outcome = RmwOutcome { seq, read, read_stamp, value, stamp, digest };
                (RmwId { node, session, seq }, outcome)
            },
        )
    }

    fn record() -> impl Strategy<Value = RmwRecord> {
        let carried = || proptest::collection::vec(outcome(), 0..3);
        (outcome(), proptest::option::of(outcome()), carried(), carried()).prop_map(
            |((id, o), base, skipped, settled)| RmwRecord {
                id,
                value: o.value,
                stamp: o.stamp,
                digest: o.digest,
                read: o.read,
                read_stamp: o.read_stamp,
                base: base.map(Box::new),
                skipped,
                settled,
            },
        )
    }

    fn ballot() -> impl Strategy<Value = Ballot> {
        (any::<u64>(), any::<u64>()).prop_map(|(round, proposer)| Ballot { round, proposer })
    }

    fn origin() -> impl Strategy<Value = Origin> {
        let entry = (any::<u32>(), any::<u32>()).prop_map(|(n, i)| (NodeId(n), i));
        let view = (any::<u64>(), proptest::collection::vec(entry, 0..4), membership()).prop_map(
            |(gen, incarnations, membership)| Box::new(View { gen, incarnations, membership }),
        );
        (any::<u32>(), any::<u64>(), proptest::option::of(view))
            .prop_map(|(incarnation, epoch, view)| Origin { incarnation, epoch, view })
    }

    fn membership() -> impl Strategy<Value = Membership> {
        let side = proptest::collection::vec(any::<u32>().prop_map(NodeId), 1..5);
        (any::<u64>(), side.clone(), proptest::option::of(side))
            .prop_map(|(epoch, voters, next)| Membership { epoch, voters, next })
    }

    /// Every message kind: the store's and barriers', Paxos's, the rejoin's, in proportion
    /// to how many kinds each family has.
    fn message() -> impl Strategy<Value = Message> {
        prop_oneof![8 => store_message(), 4 => paxos_message(), 2 => rejoin_message()]
    }

    /// Writes, reads, their answers, and the release barrier's messages.
    fn store_message() -> impl Strategy<Value = Message> {
        let gen = proptest::option::of(any::<u64>());
        prop_oneof![
            (
                any::<u64>(),
                bytes(),
                bytes(),
                stamp(),
                proptest::option::of(outcome()),
                proptest::collection::vec(outcome(), 0..2),
                gen.clone()
            )
                .prop_map(|(round, key, value, stamp, rmw, applied, query)| {
                    Message::Write { round, key, value, stamp, rmw, applied, query }
                }),
            (any::<u64>(), origin(), gen.clone())
                .prop_map(|(round, by, delinquent)| Message::WriteAck { round, by, delinquent }),
            (any::<u64>(), bytes(), gen.clone()).prop_map(|(round, key, query)| Message::Read {
                round,
                key,
                query
            }),
            (
                (any::<u64>(), origin()),
                proptest::option::of(bytes()),
                stamp(),
                proptest::option::of(outcome()),
                gen.clone()
            )
                .prop_map(|((round, by), value, stamp, made_by, delinquent)| {
                    Message::ReadReply {
                        round,
                        by,
                        value,
                        stamp,
                        made_by: made_by.map(Box::new),
                        delinquent,
                    }
                }),
            (any::<u64>(), proptest::collection::vec(any::<u32>(), 0..4)).prop_map(|(round, d)| {
                Message::SlowRelease { round, delinquent: d.into_iter().map(NodeId).collect() }
            }),
            (any::<u64>(), origin()).prop_map(|(round, by)| Message::SlowReleaseAck { round, by }),
            (any::<u32>(), any::<u64>())
                .prop_map(|(incarnation, gen)| Message::ViewAck { incarnation, gen }),
            (any::<u64>(), any::<u64>())
                .prop_map(|(acquire, gen)| Message::ResetBit { acquire, gen }),
        ]
    }

    /// A read-modify-write's Paxos stages.
    fn paxos_message() -> impl Strategy<Value = Message> {
        let gen = proptest::option::of(any::<u64>());
        prop_oneof![
            (any::<u64>(), bytes(), ballot(), any::<u64>(), gen.clone()).prop_map(
                |(round, key, ballot, session, query)| Message::Propose {
                    round,
                    key,
                    ballot,
                    rmw: RmwId { node: session >> 32, session, seq: session.rotate_left(7) },
                    query
                }
            ),
            (
                (any::<(u64, bool)>(), origin()),
                ballot(),
                proptest::option::of((ballot(), record())),
                proptest::option::of(bytes()),
                stamp(),
                proptest::option::of(outcome()),
                gen.clone()
            )
                .prop_map(
                    |(((round, ok), by), promised, accepted, value, stamp, o, delinquent)| {
                        Message::Promise {
                            round,
                            by,
                            ok,
                            promised,
                            accepted,
                            value,
                            stamp,
                            outcome: o.clone().map(|(_, o)| o),
                            made_by: o.map(Box::new),
                            delinquent,
                        }
                    }
                ),
            (any::<u64>(), bytes(), ballot(), record(), gen.clone()).prop_map(
                |(round, key, ballot, record, query)| Message::Accept {
                    round,
                    key,
                    ballot,
                    record,
                    query
                }
            ),
            (any::<(u64, bool)>(), origin(), ballot(), gen.clone()).prop_map(
                |((round, ok), by, promised, delinquent)| Message::Accepted {
                    round,
                    by,
                    ok,
                    promised,
                    delinquent
                }
            ),
        ]
    }

    /// A rejoining node's requests for state and their pages.
    fn rejoin_message() -> impl Strategy<Value = Message> {
        prop_oneof![
            (any::<u64>(), bytes()).prop_map(|(rejoin, k)| Message::StateRequest {
                rejoin,
                after: Cursor::Key(k),
                membership: Membership::default(),
            }),
            (any::<u64>(), membership())
                .prop_map(|(round, membership)| Message::SyncQuery { round, membership }),
            (any::<u64>(), origin()).prop_map(|(round, by)| Message::Synced { round, by }),
            membership().prop_map(|membership| Message::MembershipNews { membership }),
            (
                any::<(u64, bool)>(),
                bytes(),
                stamp(),
                ballot(),
                proptest::option::of((ballot(), record())),
                proptest::collection::vec(outcome(), 0..2)
            )
                .prop_map(
                    |((rejoin, rejoining), key, stamp, promised, accepted, outs)| {
                        Message::StatePage {
                            membership: Membership::default(),
                            rejoin,
                            after: Cursor::Outcome(1, 2),
                            rejoining,
                            slots: vec![SlotImage {
                                key: key.clone(),
                                value: Some(key.clone()),
                                stamp,
                                promised,
                                accepted,
                                made_by: None,
                            }],
                            outcomes: outs
                                .into_iter()
                                .map(|(id, o)| (id, key.clone(), o))
                                .collect(),
                            bits: vec![(NodeId(2), true, 3)],
                            next: Some(Cursor::Start),
                        }
                    }
                ),
        ]
    }

    proptest! {
        #[test]
        fn every_message_round_trips_and_no_prefix_or_extension_decodes(message in message(), cut in any::<prop::sample::Index>()) {
            let limits = PeerLimits::default();
            let mut out = Vec::new();
            message.encode(&mut out);
            prop_assert_eq!(Message::decode(&out, &limits).unwrap(), message);
            let short = &out[..cut.index(out.len())];
            prop_assert!(Message::decode(short, &limits).is_err(), "a strict prefix is refused");
            out.push(0);
            prop_assert!(Message::decode(&out, &limits).is_err(), "trailing bytes are refused");
        }

        #[test]
        fn hostile_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = Message::decode(&bytes, &PeerLimits::default());
        }
    }

    #[test]
    fn messages_carrying_client_values_are_charged_their_bytes_and_the_others_nothing() {
        let outcome = RmwOutcome {
            seq: 1,
            read: Some(Bytes::from_static(b"old")),
            read_stamp: Stamp::default(),
            value: Bytes::from_static(b"new!"),
            stamp: Stamp::default(),
            digest: 0,
        };
        let id = RmwId { node: 1, session: 1, seq: 1 };
        let write = Message::Write {
            round: 1,
            key: Bytes::from_static(b"k"),
            value: Bytes::from(vec![7u8; 10]),
            stamp: Stamp::default(),
            rmw: Some((id, outcome.clone())),
            applied: vec![(id, outcome)],
            query: None,
        };
        // The value, and each outcome's value and value read (keys are not client values).
        assert_eq!(write.bulk_bytes(), 10 + 2 * (4 + 3));
        let ack = Message::Read { round: 1, key: Bytes::from(vec![1u8; 100]), query: None };
        assert_eq!(ack.bulk_bytes(), 0, "a read carries a key, no value");
        assert!(write.shed().is_none(), "shed like a loss: the round sends it again");
    }

    #[test]
    fn an_unknown_format_is_refused_by_name() {
        let err = Message::decode(&[9, 0], &PeerLimits::default()).unwrap_err();
        assert_eq!(err, PeerError::UnknownVersion(9));
    }
}
