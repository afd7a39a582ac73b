//! Geo peer messages up to the engine: bytes decoded as a geo message (raw, or a valid
//! message of each body kind with bytes overwritten), put through the stateless gate and
//! stepped into a node with a transaction open. No input panics a node (`docs/geo.md`,
//! the validation gate).
#![no_main]

use bytes::Bytes;
use keel_core::engine::{Engine, Input, RequestTag};
use keel_core::geo::{
    Body, Candidate, Config, GeoEngine, GeoOp, GeoRequest, Kind, Member, Message, Object, Record,
    Change, ChangeRefusal, Replicated, TxId, Update, Vector,
};
use keel_core::time::Time;
use keel_types::NodeId;
use keel_wire::peer::{PeerLimits, PeerMessage};
use libfuzzer_sys::fuzz_target;

const MS: u64 = 1_000_000;

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

/// Three data centers of two partitions: nodes 1, 2 in dc 0; 3, 4 in dc 1; 5, 6 in dc 2.
fn members() -> Vec<Member> {
    (0..6u32).map(|i| Member { node: NodeId(i + 1), dc: i / 2, partition: i % 2 }).collect()
}

/// One valid message carrying a body of each kind, to mutate.
fn message(which: u8) -> Message {
    let v = Vector { dcs: vec![5 << 10, 7 << 10, 1 << 10], strong: 0 };
    let tx = TxId { node: 3, seq: 9 };
    let writes = vec![(b("k"), Update::Add(3)), (b("k"), Update::SRem(b("e"), vec![tx]))];
    let candidate = Candidate {
        tx,
        origin: 1,
        label: Some("l".into()),
        keys: vec![b("k")],
        writes: writes.clone(),
        updates: true,
        snap: v.clone(),
        participants: vec![0, 1],
        expiry: 900 * MS,
    };
    let records = vec![
        Record::Vote { candidate: Box::new(candidate.clone()), ok: true, ts: 9 << 10 },
        Record::Decide { tx, commit: true, ts: 9 << 10 },
        Record::Promise { ts: 10 << 10 },
        Record::Forget { below: 800 * MS },
    ];
    let body = match which % 25 {
        0 => Body::GetVersion { read: 1, key: b("k"), kind: Kind::Counter, snap: v.clone() },
        1 => Body::Version { read: 1, object: Object::Counter(4) },
        2 => Body::Prepare { tx, writes: writes.clone(), snap: v.clone() },
        3 => Body::PrepareAck { tx, ts: 9 << 10 },
        4 => Body::Commit { tx, commit: v.clone() },
        5 => Body::Replicate { origin: 1, txs: vec![Replicated { tx, commit: v.clone(), writes }] },
        6 => Body::Heartbeat { origin: 1, ts: 8 << 10 },
        7 => Body::KnownLocal { known: v.clone(), ballot: 1, suspected: vec![2] },
        8 => Body::Vectors { stable: v.clone(), known: v, ballot: 1, leaders: vec![0, 1] },
        9 => Body::Certify(Box::new(candidate)),
        10 => Body::Vote {
            tx,
            ok: true,
            ts: 9 << 10,
            participants: vec![0, 1],
            expiry: 900 * MS,
            ballot: 1,
            answer: false,
        },
        11 => Body::Append { ballot: 1, first: 0, records, durable: 1, everywhere: 0 },
        12 => Body::Appended { ballot: 1, through: 2, ok: true },
        13 => Body::Elect { ballot: 2, from: 0 },
        14 => Body::Elected { ballot: 2, accepted: 1, durable: 1, first: 0, records },
        15 => Body::Outvoted { ballot: 3 },
        16 => Body::Settle { txs: vec![(tx, 900 * MS)] },
        17 => Body::Settled { txs: vec![tx] },
        18 => Body::Forgotten { tx },
        19 => Body::Changed { change: Change { dc: 2, epoch: 1 } },
        20 => Body::ChangePropose { id: 1, change: Change { dc: 2, epoch: 2 } },
        21 => Body::ChangePromised { id: 1, removed: vec![], failed: vec![2] },
        22 => Body::ChangeRefused {
            id: 1,
            why: ChangeRefusal::Pending { change: Change { dc: 1, epoch: 1 } },
        },
        23 => Body::ChangeRefused { id: 1, why: ChangeRefusal::BeyondF { gone: vec![1, 2] } },
        _ => Body::ChangeWithdrawn { id: 1, change: Change { dc: 2, epoch: 3 } },
    };
    Message { boot: 3, peer_boot: 0, ack: 0, first: 0, bodies: vec![body] }
}

/// Node 1 (dc 0, partition 0) with a transaction open.
fn node() -> GeoEngine {
    let config = Config::new(NodeId(1), members(), 1);
    let mut engine = <GeoEngine as Engine>::boot(config, Default::default(), 5, Time(0)).unwrap();
    let begin = GeoOp::Begin { past: Vector::zero(3) };
    engine.step(Time(MS), Input::Client(GeoRequest { tag: RequestTag(1), session: 1, op: begin }));
    engine
}

fuzz_target!(|data: &[u8]| {
    let limits = PeerLimits::default();
    let Some((&mode, rest)) = data.split_first() else { return };
    let Some((&sender, rest)) = rest.split_first() else { return };
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
    if <GeoEngine as Engine>::check_message(&message).is_err() {
        return;
    }
    let mut engine = node();
    let from = NodeId(u32::from(sender % 7));
    engine.step(Time(2 * MS), Input::Message { from, message });
    engine.step(Time(500 * MS), Input::Tick);
});
