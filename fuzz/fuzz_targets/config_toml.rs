//! The server configuration parser and its validation on any text: an error names what
//! is wrong; nothing panics.
#![no_main]

use keel_server::ServerConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(config) = ServerConfig::from_toml(text) {
        if config.validate().is_ok() {
            let _ = config.keyspace_specs();
            let _ = config.to_toml();
        }
    }
});
