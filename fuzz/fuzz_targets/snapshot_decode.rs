//! Snapshot decoding on a valid snapshot with bytes overwritten, and on raw bytes: a
//! snapshot the state machine cannot have written is an error, never a panic or a state
//! that breaks its own invariants.
#![no_main]

use keel_core::leader::kv::Kv;
use keel_types::{
    ClientId, Command, Durability, Entry, EntryPayload, Epoch, LogIndex, RequestId, Version,
};
use libfuzzer_sys::fuzz_target;

fn valid() -> Vec<u8> {
    let mut kv = Kv::new(4);
    for i in 1..=6u64 {
        let key = format!("k{}", i % 4).into_bytes();
        let command = if i % 3 == 0 {
            Command::Incr { key: key.into(), delta: 5 }
        } else {
            Command::Put { key: key.into(), value: vec![b'v'; i as usize].into() }
        };
        let payload = EntryPayload::Write {
            client: ClientId(i % 3),
            request: RequestId(i),
            durability: Durability::Memory,
            command,
        };
        kv.apply(&Entry { epoch: Epoch(1), index: LogIndex(i), payload });
    }
    kv.encode_at(LogIndex(6))
}

fuzz_target!(|data: &[u8]| {
    let at = Version::new(1, 6);
    let Some((&mode, rest)) = data.split_first() else { return };
    let bytes = if mode >= 128 {
        rest.to_vec()
    } else {
        let mut bytes = valid();
        for pair in rest.chunks_exact(3) {
            let at = u16::from_le_bytes([pair[0], pair[1]]) as usize % bytes.len();
            bytes[at] = pair[2];
        }
        bytes
    };
    if let Ok(kv) = Kv::decode(&bytes, at, 4) {
        // What decoded encodes again, and decodes to the same state.
        let again = kv.encode_at(LogIndex(6));
        let kv2 = Kv::decode(&again, at, 4).expect("a state's own encoding decodes");
        assert_eq!(kv2.encode_at(LogIndex(6)), again);
    }
});
