//! The command parser on arbitrary words (a request already split into arguments): any
//! arity, any option in any order, any number; it answers a command or an error.
#![no_main]

use bytes::Bytes;
use keel_types::Limits;
use keel_wire::command::parse;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let words: Vec<Bytes> = data.split(|b| *b == 0).map(Bytes::copy_from_slice).collect();
    let limits = Limits { key_bytes_max: 16, value_bytes_max: 64, scan_items_max: 10 };
    if let Ok(command) = parse(words, &limits) {
        let _ = command.name();
        let _ = command.into_operations();
    }
});
