//! Kite peer messages up to the engine: bytes decoded as a Kite message (raw, or a valid
//! message of each kind with bytes overwritten), put through the stateless gate and
//! stepped into a serving node and a rejoining one. No input panics a node
//! (`docs/kite.md`, Bounds and hostile input).
#![no_main]

use bytes::Bytes;
use keel_core::engine::{Engine, Input, RequestTag};
use keel_core::kite::{
    Ballot, Config, Cursor, KiteEngine, KiteOp, KiteRequest, Message, Origin, RmwId, RmwOutcome,
    RmwRecord, SlotImage, Stamp, View,
};
use keel_core::time::Time;
use keel_types::NodeId;
use keel_wire::peer::{PeerLimits, PeerMessage};
use libfuzzer_sys::fuzz_target;

const MS: u64 = 1_000_000;

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

/// One valid message of each kind, to mutate.
fn message(which: u8) -> Message {
    let stamp = Stamp { version: 3, writer: 2 << 32, rmw: 0 };
    let id = RmwId { node: 2 << 32, session: 1, seq: 1 };
    let outcome = RmwOutcome { seq: 1, read: None, read_stamp: Stamp::ZERO, value: b("1"), stamp: Stamp::ZERO.next_rmw(), digest: 9 };
    let record = RmwRecord {
        id,
        value: b("2"),
        stamp: stamp.next_rmw(),
        digest: 9,
        read: Some(b("1")),
        read_stamp: stamp,
        base: Some(Box::new((id, outcome.clone()))),
        skipped: vec![(id, outcome.clone())],
        settled: vec![(id, outcome.clone())],
    };
    let ballot = Ballot { round: 2, proposer: 2 << 32 };
    let view = View { gen: 3, incarnations: vec![(NodeId(2), 1), (NodeId(3), 0)], membership: Default::default() };
    let by = Origin { incarnation: 1, epoch: 0, view: Some(Box::new(view)) };
    match which % 11 {
        0 => Message::Write { round: 1, key: b("k"), value: b("v"), stamp, rmw: Some((id, outcome.clone())), applied: vec![], query: Some(7) },
        1 => Message::Read { round: 1, key: b("k"), query: Some(7) },
        2 => Message::SlowRelease { round: 1, delinquent: vec![NodeId(1), NodeId(3)] },
        3 => Message::Propose { round: 1, key: b("k"), ballot, rmw: id, query: None },
        4 => Message::Accept { round: 1, key: b("k"), ballot, record, query: None },
        5 => Message::ResetBit { acquire: 7, gen: 1 },
        6 => Message::StateRequest { rejoin: 2 << 32 | 1, after: Cursor::Key(b("a")), membership: Default::default() },
        8 => Message::WriteAck { round: 1, by, delinquent: Some(1) },
        9 => Message::Accepted { round: 1, by, ok: true, promised: ballot, delinquent: None },
        10 => Message::ViewAck { incarnation: 0, gen: 1 },
        7 => Message::StatePage {
            rejoin: 1 << 32 | 1,
            after: Cursor::Start,
            rejoining: false,
            slots: vec![SlotImage { key: b("k"), value: Some(b("v")), stamp, promised: ballot, accepted: Some((ballot, record)), made_by: None }],
            outcomes: vec![(id, b("k"), outcome)],
            bits: vec![(NodeId(3), true, 2)],
            next: Some(Cursor::Outcome(2 << 32, 1)),
            membership: Default::default(),
        },
        _ => unreachable!("which % 11"),
    }
}

/// Node 1 of three, serving (with a key and a session) or rejoining.
fn node(rejoining: bool) -> KiteEngine {
    let mut config = Config::new(NodeId(1), vec![NodeId(1), NodeId(2), NodeId(3)]);
    if rejoining {
        config.incarnation = 1;
        config.rejoin = true;
    }
    let mut engine = KiteEngine::boot(config, 5, Time(0)).unwrap();
    let write = KiteOp::Write { key: b("k"), value: b("0") };
    let request = KiteRequest { tag: RequestTag(1), session: 1, op: write, form: Default::default(), named: None };
    engine.step(Time(MS), Input::Client(request));
    engine
}

fuzz_target!(|data: &[u8]| {
    let limits = PeerLimits::default();
    let Some((&mode, rest)) = data.split_first() else { return };
    let body = if mode >= 128 {
        rest.to_vec()
    } else {
        let mut body = Vec::new();
        message(mode).encode(&mut body);
        for pair in rest.chunks_exact(3) {
            let at = u16::from_le_bytes([pair[0], pair[1]]) as usize % body.len();
            body[at] = pair[2];
        }
        body
    };
    let Ok(message) = Message::decode(&body, &limits) else { return };
    if <KiteEngine as Engine>::check_message(&message).is_err() {
        return;
    }
    let mut engine = node(mode % 2 == 1);
    engine.step(Time(2 * MS), Input::Message { from: NodeId(2), message });
    engine.step(Time(500 * MS), Input::Tick);
});
