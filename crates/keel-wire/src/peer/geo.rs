//! The encoding of `keel_core::geo::Message`: a format byte, then the message in the
//! postcard format (as Kite's, `super::kite`), so that the encoding follows the geo
//! message types as they change without a hand-kept twin.
//!
//! Decoding hostile bytes: every length is bounded by the bytes present; the message's
//! shapes against the keyspace (its vectors' length, the sender's place, each key's
//! partition, the keyspace's key and value limits) are checked by the engine's
//! validation gate after decoding.

use super::{PeerError, PeerLimits};
use keel_core::geo::Message;

/// The only geo message format this version writes and reads.
pub const GEO_FORMAT_V1: u8 = 1;

impl super::PeerMessage for Message {
    fn encode(&self, out: &mut Vec<u8>) {
        super::postcard_encode(GEO_FORMAT_V1, self, out);
    }

    fn decode(bytes: &[u8], limits: &PeerLimits) -> Result<Message, PeerError> {
        super::postcard_decode(GEO_FORMAT_V1, "geo message", bytes, limits)
    }
}

#[cfg(test)]
mod tests {
    use super::super::PeerMessage;
    use super::*;
    use bytes::Bytes;
    use keel_core::geo::{
        Body, Change, ChangeAnswer, ChangeRefusal, Kind, Object, Replicated, TxId, Update, Vector,
    };
    use keel_types::NodeId;
    use proptest::prelude::*;

    fn vector() -> impl Strategy<Value = Vector> {
        (proptest::collection::vec(any::<u64>(), 1..6), any::<u64>())
            .prop_map(|(dcs, strong)| Vector { dcs, strong })
    }

    fn change() -> impl Strategy<Value = Change> {
        (any::<u32>(), any::<u32>()).prop_map(|(dc, epoch)| Change { dc, epoch })
    }

    fn bytes() -> impl Strategy<Value = Bytes> {
        proptest::collection::vec(any::<u8>(), 0..8).prop_map(Bytes::from)
    }

    fn tx() -> impl Strategy<Value = TxId> {
        (any::<u32>(), any::<u64>()).prop_map(|(node, seq)| TxId { node, seq })
    }

    fn update() -> impl Strategy<Value = Update> {
        prop_oneof![
            bytes().prop_map(Update::Set),
            any::<i64>().prop_map(Update::Add),
            any::<i64>().prop_map(Update::Max),
            bytes().prop_map(Update::GAdd),
            bytes().prop_map(Update::SAdd),
            (bytes(), proptest::collection::vec(tx(), 0..3)).prop_map(|(e, s)| Update::SRem(e, s)),
        ]
    }

    fn writes() -> impl Strategy<Value = Vec<(Bytes, Update)>> {
        proptest::collection::vec((bytes(), update()), 0..3)
    }

    fn object() -> impl Strategy<Value = Object> {
        prop_oneof![
            any::<i64>().prop_map(Object::Counter),
            proptest::option::of(any::<i64>()).prop_map(Object::Max),
            proptest::collection::btree_set(bytes(), 0..3).prop_map(Object::GSet),
            Just(Object::Register(None)),
        ]
    }

    fn body() -> impl Strategy<Value = Body> {
        let kind = prop_oneof![Just(Kind::Register), Just(Kind::Counter), Just(Kind::AwSet)];
        prop_oneof![
            (any::<u64>(), bytes(), kind, vector())
                .prop_map(|(read, key, kind, snap)| Body::GetVersion { read, key, kind, snap }),
            (any::<u64>(), object()).prop_map(|(read, object)| Body::Version { read, object }),
            (tx(), writes(), vector()).prop_map(|(tx, writes, snap)| Body::Prepare {
                tx,
                writes,
                snap
            }),
            (tx(), any::<u64>()).prop_map(|(tx, ts)| Body::PrepareAck { tx, ts }),
            (tx(), vector()).prop_map(|(tx, commit)| Body::Commit { tx, commit }),
            (any::<u32>(), proptest::collection::vec((tx(), vector(), writes()), 0..3)).prop_map(
                |(origin, txs)| Body::Replicate {
                    origin,
                    txs: txs
                        .into_iter()
                        .map(|(tx, commit, writes)| Replicated { tx, commit, writes })
                        .collect(),
                }
            ),
            (any::<u32>(), any::<u64>()).prop_map(|(origin, ts)| Body::Heartbeat { origin, ts }),
            (vector(), any::<u64>(), proptest::collection::vec(any::<u32>(), 0..3)).prop_map(
                |(known, ballot, suspected)| Body::KnownLocal { known, ballot, suspected }
            ),
            (any::<u64>(), any::<u64>()).prop_map(|(ballot, from)| Body::Elect { ballot, from }),
            any::<u64>().prop_map(|ballot| Body::Outvoted { ballot }),
            change().prop_map(|change| Body::Changed { change }),
            (any::<u64>(), change()).prop_map(|(id, change)| Body::ChangePropose { id, change }),
            (any::<u64>(), change()).prop_map(|(id, change)| Body::ChangeWithdrawn { id, change }),
            (any::<u64>(), change()).prop_map(|(id, change)| Body::ChangeCommit { id, change }),
            (any::<u32>(), any::<u64>(), change()).prop_map(|(p, id, change)| Body::ChangeAbort {
                proposer: NodeId(p),
                id,
                change
            }),
            (any::<u32>(), any::<u64>(), change(), 0..3u8).prop_map(|(p, id, change, v)| {
                let vote = [ChangeAnswer::Committed, ChangeAnswer::Aborted, ChangeAnswer::Made]
                    [v as usize];
                Body::ChangeVote { proposer: NodeId(p), id, change, vote }
            }),
            any::<u64>().prop_map(|id| Body::ChangeRefused { id, why: ChangeRefusal::Aborted }),
            (
                any::<u64>(),
                proptest::collection::vec(any::<u32>(), 0..3),
                proptest::collection::vec(any::<u32>(), 0..3)
            )
                .prop_map(|(id, removed, failed)| Body::ChangePromised {
                    id,
                    removed,
                    failed
                }),
            (any::<u64>(), change()).prop_map(|(id, change)| Body::ChangeRefused {
                id,
                why: ChangeRefusal::Pending { change }
            }),
            (any::<u64>(), proptest::collection::vec(any::<u32>(), 0..3)).prop_map(|(id, gone)| {
                Body::ChangeRefused { id, why: ChangeRefusal::BeyondF { gone } }
            }),
            (any::<u64>(), any::<u32>(), any::<bool>()).prop_map(|(id, n, epoch)| {
                let why = match epoch {
                    true => ChangeRefusal::Epoch { epoch: n },
                    false => ChangeRefusal::Returning { dc: n },
                };
                Body::ChangeRefused { id, why }
            }),
            (any::<u64>(), any::<u64>(), any::<bool>())
                .prop_map(|(ballot, through, ok)| Body::Appended { ballot, through, ok }),
            (vector(), vector(), any::<u64>(), proptest::collection::vec(any::<u64>(), 0..4))
                .prop_map(|(stable, known, ballot, leaders)| Body::Vectors {
                    stable,
                    known,
                    ballot,
                    leaders
                }),
        ]
    }

    fn message() -> impl Strategy<Value = Message> {
        (any::<(u64, u64, u64, u64)>(), proptest::collection::vec(body(), 0..4)).prop_map(
            |((boot, peer_boot, ack, first), bodies)| Message {
                boot,
                peer_boot,
                ack,
                first,
                bodies,
            },
        )
    }

    proptest! {
        #[test]
        fn every_message_round_trips(message in message()) {
            let mut bytes = Vec::new();
            message.encode(&mut bytes);
            prop_assert_eq!(Message::decode(&bytes, &PeerLimits::default()).unwrap(), message);
        }

        #[test]
        fn hostile_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = Message::decode(&bytes, &PeerLimits::default());
        }
    }

    #[test]
    fn another_format_is_refused_by_number() {
        assert!(matches!(
            Message::decode(&[9, 0], &PeerLimits::default()),
            Err(PeerError::UnknownVersion(9))
        ));
    }
}
