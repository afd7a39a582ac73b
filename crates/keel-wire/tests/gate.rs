//! The validation gate behind the codec: whatever message bytes a well-formed frame can
//! carry, once they decode with an engine kind's codec, the engine's stateless gate and
//! the engine itself (a follower, a candidate, a leader) must take them without
//! panicking. The bytes are valid encodings of every message kind, mutated.

use keel_core::engine::{Engine, Input};
use keel_core::leader::{ClientReply, Config, LeaderEngine, Lease, Message, RequestTag};
use keel_core::time::Time;
use keel_types::{
    ClientId, Command, Durability, Entry, EntryPayload, Epoch, KeelError, KeyspaceId, LogIndex,
    NodeId, RequestId, SnapshotMeta,
};
use keel_wire::peer::{decode_frame, encode_frame, Outgoing, PeerFrame, PeerLimits, PeerMessage};
use proptest::collection::vec;
use proptest::prelude::*;

const SECOND: u64 = 1_000_000_000;

/// One valid message of every kind, to mutate.
fn corpus() -> Vec<Message> {
    let put = Entry {
        epoch: Epoch(2),
        index: LogIndex(2),
        payload: EntryPayload::Write {
            client: ClientId(1),
            request: RequestId(1),
            durability: Durability::Memory,
            command: Command::Put { key: b"k".to_vec().into(), value: b"v".to_vec().into() },
        },
    };
    let noop = Entry { epoch: Epoch(2), index: LogIndex(1), payload: EntryPayload::Noop };
    vec![
        Message::PreVote { epoch: Epoch(1), last_epoch: Epoch(1), last_index: LogIndex(3) },
        Message::PreVoteReply { epoch: Epoch(1), granted: true },
        Message::RequestVote {
            epoch: Epoch(2),
            last_epoch: Epoch(1),
            last_index: LogIndex(3),
            transfer: false,
        },
        Message::TimeoutNow { epoch: Epoch(2), last_epoch: Epoch(1), last_index: LogIndex(3) },
        Message::Vote { epoch: Epoch(2), granted: true },
        Message::Append {
            epoch: Epoch(2),
            prev_epoch: Epoch(0),
            prev_index: LogIndex(0),
            entries: vec![noop, put],
            commit_index: LogIndex(1),
            durable_index: LogIndex(1),
            lease: Lease::Granted { anchor: Time(SECOND) },
            flush_through: Some(LogIndex(2)),
            sent_at: Time(SECOND),
        },
        Message::AppendReply {
            epoch: Epoch(2),
            success: true,
            last_index: LogIndex(2),
            persisted_index: LogIndex(2),
            applied_index: LogIndex(2),
            match_index: LogIndex(1),
            released: false,
            echo_sent_at: Time(SECOND),
            sent_at: Time(SECOND),
        },
        Message::InstallSnapshot {
            epoch: Epoch(2),
            meta: SnapshotMeta { last_index: LogIndex(5), last_epoch: Epoch(1) },
            offset: 0,
            total: 4,
            data: vec![1, 2, 3, 4],
        },
        Message::InstallSnapshotReply { epoch: Epoch(2), last_index: LogIndex(5), received: 4 },
        Message::ForwardReply {
            epoch: Epoch(2),
            reply: ClientReply {
                tag: RequestTag(9),
                served_by: NodeId(2),
                result: Err(KeelError::Timeout),
                durability_round: false,
            },
        },
    ]
}

/// Node 1 of three, stepped into `role` (0 follower, 1 candidate, 2 leader) with forged
/// replies, at about 2 s on its clock.
fn engine_in(role: u8) -> LeaderEngine {
    let config = Config::new(NodeId(1), vec![NodeId(1), NodeId(2), NodeId(3)]);
    let mut engine = LeaderEngine::boot(config, Default::default(), 5, Time(0)).unwrap();
    let now = Time(2 * SECOND);
    engine.step(now, Input::Tick); // the election timer fired: pre-votes out
    if role >= 1 {
        let granted = Message::PreVoteReply { epoch: Epoch(0), granted: true };
        engine.step(now, Input::Message { from: NodeId(2), message: granted });
    }
    if role >= 2 {
        let vote = Message::Vote { epoch: Epoch(1), granted: true };
        engine.step(now, Input::Message { from: NodeId(2), message: vote });
    }
    engine
}

/// The frame bytes carrying `body` in one envelope, as a peer would send them.
fn framed(body: &[u8]) -> Vec<u8> {
    struct Raw(Vec<u8>);
    impl keel_wire::peer::PeerEncode for Raw {
        fn encode_to(&self, out: &mut Vec<u8>) {
            out.extend_from_slice(&self.0);
        }
    }
    let messages = [Outgoing { keyspace: KeyspaceId(0), message: Box::new(Raw(body.to_vec())) }];
    let frame = PeerFrame { from: NodeId(2), to: NodeId(1), messages: &messages };
    let mut bytes = Vec::new();
    encode_frame(&frame, &PeerLimits::default(), &mut bytes).unwrap();
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_message_a_frame_carries_never_panics_an_engine(
        which in 0usize..9,
        flips in vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        role in 0u8..3,
        from in 2u32..5,
    ) {
        let mut body = Vec::new();
        corpus()[which].encode(&mut body);
        for (at, byte) in flips {
            let at = at.index(body.len());
            body[at] = byte;
        }
        let limits = PeerLimits::default();
        let bytes = framed(&body);
        let (view, _) = decode_frame(&bytes, &limits).unwrap().expect("a whole frame");
        let (_, envelope) = view.envelopes[0];
        let Ok(message) = Message::decode(envelope, &limits) else { return Ok(()) };
        let mut engine = engine_in(role);
        // What a server does: the stateless gate on the connection's task, then the
        // engine (which checks again, then against its state).
        let _ = LeaderEngine::check_message(&message);
        engine.step(Time(2 * SECOND + 1), Input::Message { from: NodeId(from), message });
        engine.step(Time(3 * SECOND), Input::Tick);
    }
}

#[test]
fn the_roles_the_property_uses_are_reached() {
    use keel_core::leader::Role;
    assert_eq!(engine_in(0).role_kind(), Role::Follower);
    assert_eq!(engine_in(1).role_kind(), Role::Candidate);
    assert_eq!(engine_in(2).role_kind(), Role::Leader);
}
