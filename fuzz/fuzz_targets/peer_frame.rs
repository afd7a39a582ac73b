//! Peer frames and the leader engine's messages inside them, up to the engine: the frame
//! decoder on raw bytes (with the link's own envelopes, announcements and leader
//! notices), and valid messages of every kind with bytes flipped, each put through the
//! stateless gate and stepped into a follower, a candidate and a leader. No input panics
//! a node (what the validation gate promises, `docs/protocol.md` §13).
#![no_main]

use keel_core::engine::{Engine, Input};
use keel_core::leader::{Config, LeaderEngine, Lease, Message};
use keel_core::time::Time;
use keel_types::{
    ClientId, Command, Durability, Entry, EntryPayload, Epoch, LogIndex, NodeId, RequestId,
    SnapshotMeta,
};
use keel_wire::peer::{decode_frame, Announce, LeaderNotice, PeerEncode, PeerLimits, PeerMessage};
use libfuzzer_sys::fuzz_target;

const SECOND: u64 = 1_000_000_000;

/// One valid message of each kind, to mutate.
fn message(which: u8) -> Message {
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
    match which % 8 {
        0 => Message::PreVote { epoch: Epoch(1), last_epoch: Epoch(1), last_index: LogIndex(3) },
        1 => Message::RequestVote {
            epoch: Epoch(2),
            last_epoch: Epoch(1),
            last_index: LogIndex(3),
            transfer: false,
        },
        2 => Message::Append {
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
        3 => Message::AppendReply {
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
        4 => Message::InstallSnapshot {
            epoch: Epoch(2),
            meta: SnapshotMeta { last_index: LogIndex(5), last_epoch: Epoch(1) },
            offset: 0,
            total: 4,
            data: vec![1, 2, 3, 4],
        },
        5 => Message::RequestVote {
            epoch: Epoch(2),
            last_epoch: Epoch(1),
            last_index: LogIndex(3),
            transfer: true,
        },
        6 => Message::TimeoutNow { epoch: Epoch(1), last_epoch: Epoch(1), last_index: LogIndex(3) },
        _ => Message::Vote { epoch: Epoch(2), granted: true },
    }
}

/// Node 1 of three in `role` (0 follower, 1 candidate, 2 leader).
fn engine_in(role: u8) -> LeaderEngine {
    let config = Config::new(NodeId(1), vec![NodeId(1), NodeId(2), NodeId(3)]);
    let mut engine = LeaderEngine::boot(config, Default::default(), 5, Time(0)).unwrap();
    let now = Time(2 * SECOND);
    engine.step(now, Input::Tick);
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

fuzz_target!(|data: &[u8]| {
    let limits = PeerLimits::default();
    let Some((&mode, rest)) = data.split_first() else { return };
    if mode >= 128 {
        // Raw frame bytes.
        if let Ok(Some((view, used))) = decode_frame(rest, &limits) {
            assert!(used <= rest.len());
            for (_, bytes) in view.envelopes {
                if let Ok(message) = Message::decode(bytes, &limits) {
                    let _ = LeaderEngine::check_message(&message);
                }
                // The link's own envelopes: an announcement, a leader notice.
                let _ = Announce::decode(bytes);
                if let Some(notice) = LeaderNotice::decode(bytes) {
                    let mut again = Vec::new();
                    notice.encode_to(&mut again);
                    assert_eq!(again, bytes, "a leader notice's encoding is canonical");
                }
            }
        }
        return;
    }
    // A valid message with bytes overwritten: (position, byte) pairs from the input.
    let mut body = Vec::new();
    message(mode).encode(&mut body);
    for pair in rest.chunks_exact(3) {
        let at = u16::from_le_bytes([pair[0], pair[1]]) as usize % body.len();
        body[at] = pair[2];
    }
    let Ok(message) = Message::decode(&body, &limits) else { return };
    let _ = LeaderEngine::check_message(&message);
    let mut engine = engine_in(mode / 8 % 3);
    engine.step(Time(2 * SECOND + 1), Input::Message { from: NodeId(2), message });
    engine.step(Time(3 * SECOND), Input::Tick);
});
