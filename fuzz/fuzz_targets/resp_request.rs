//! The server's RESP decoder (arrays of bulk strings and inline commands) and the command
//! parser behind it, on whatever bytes a client sends: they never panic, every frame
//! decoded consumed bytes, and the parser answers each frame with a command or an error.
#![no_main]

use keel_types::Limits;
use keel_wire::command::parse_frame;
use keel_wire::resp::{DecodeMode, Decoder, RespLimits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = Limits::default();
    let mut decoder = Decoder::new(DecodeMode::Request, RespLimits::for_server(&limits));
    let mut start = 0;
    // Fed in two pieces, as a socket may split it, then as a whole.
    let cut = data.first().map_or(0, |b| *b as usize % (data.len() + 1));
    let mut buf = data[..cut].to_vec();
    loop {
        match decoder.decode(&buf[start..]) {
            Ok(Some((frame, used))) => {
                assert!(used > 0, "a frame takes bytes");
                start += used;
                let _ = parse_frame(frame, &limits);
            }
            Ok(None) if buf.len() < data.len() => buf.extend_from_slice(&data[buf.len()..]),
            Ok(None) | Err(_) => break,
        }
    }
});
