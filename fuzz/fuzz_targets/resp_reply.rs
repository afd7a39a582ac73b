//! The client's RESP decoder (RESP2 and RESP3 replies, nested aggregates, attributes) on
//! whatever bytes a server sends: it never panics and never loops without consuming.
#![no_main]

use keel_wire::resp::{DecodeMode, Decoder, RespLimits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut decoder = Decoder::new(DecodeMode::Reply, RespLimits::default());
    let mut start = 0;
    while let Ok(Some((frame, used))) = decoder.decode(&data[start..]) {
        assert!(used > 0, "a frame takes bytes");
        start += used;
        // Encoding what was decoded never panics either.
        let _ = keel_wire::resp::encode::to_bytes(&frame, keel_wire::resp::Protocol::Resp3);
    }
});
