//! The history readers of `keel check` on any input: Keel's JSON-lines histories and the
//! Jepsen EDN logs (register and key-value); errors name the line, nothing panics.
#![no_main]

use keel_check::history::parse_history;
use keel_check::jepsen::{parse_edn_value, parse_kv_log, parse_register_log};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = parse_history(data, "fuzz");
    let _ = parse_register_log(data, "fuzz");
    let _ = parse_kv_log(data, "fuzz");
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = parse_edn_value(text);
    }
});
