//! A message `PUBLISH` sends to the other members (`keel_server::pubsub::Published`), as
//! raw bytes from a peer: it decodes or is refused, never panics, and what decodes
//! encodes back to the same bytes.
#![no_main]

use keel_server::pubsub::Published;
use keel_wire::peer::{PeerLimits, PeerMessage};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = PeerLimits { frame_bytes_max: 1 << 16, ..PeerLimits::default() };
    if let Ok(message) = Published::decode(data, &limits) {
        let mut again = Vec::new();
        message.encode(&mut again);
        assert_eq!(again, data, "a decoded message encodes to its bytes");
    }
});
