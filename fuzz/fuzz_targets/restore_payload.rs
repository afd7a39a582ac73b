//! `RESTORE`'s payload as a client may forge it: the item image decodes to an item or is
//! refused, never a panic; and an item that decodes encodes to an image that decodes to
//! the same item (fields, members and scores in the collection's own order).
#![no_main]

use keel_core::leader::kv_image::{decode, encode};
use keel_types::Version;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let version = Version::new(1, 1);
    if let Ok(item) = decode(data, version) {
        assert!(item.live(), "an image is of a live item");
        let again = decode(&encode(&item), version).expect("an encoded item decodes");
        assert_eq!(again, item, "an image decodes to what encodes to it");
    }
});
