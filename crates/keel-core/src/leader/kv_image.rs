//! A key's item as bytes: what [`keel_types::Command::Fetch`] reads and
//! [`keel_types::Command::Restore`] writes, so that a script (`EVAL`) can run commands on a
//! private copy of the keys it reads and hand back what they became.
//!
//! The image is the item's snapshot encoding after its key and version (`docs/protocol.md`,
//! *Snapshot bytes*): a flag, the value or collection, and the expiry if it has one. Only a
//! live item has an image; the version is the writer's, given when it is decoded.

use super::kv::{encode_body, Item};
use keel_types::codec::Reader;
use keel_types::{KeelError, Value, Version};

/// The image of a live item.
pub fn encode(item: &Item) -> Value {
    debug_assert!(item.live(), "a tombstone has no image");
    let mut out = Vec::new();
    encode_body(&mut out, item);
    out.into()
}

/// The item `image` describes, at `version`; an image that is not one live item, whole,
/// is refused.
pub fn decode(image: &[u8], version: Version) -> Result<Item, KeelError> {
    let invalid = |reason: String| KeelError::InvalidArgument(format!("item image: {reason}"));
    let mut reader = Reader::new(image);
    let err = |e: keel_types::codec::CodecError| invalid(e.to_string());
    let (mut value, mut coll, mut expires_at) = (None, None, None);
    match reader.u8("item flag").map_err(err)? {
        1 => value = Some(reader.bytes("value", u32::MAX).map_err(err)?),
        2 => {
            value = Some(reader.bytes("value", u32::MAX).map_err(err)?);
            expires_at = Some(reader.u64("expiry").map_err(err)?);
        }
        flag @ (3 | 4) => {
            coll = Some(super::coll::Coll::decode(&mut reader).map_err(invalid)?);
            if flag == 4 {
                expires_at = Some(reader.u64("expiry").map_err(err)?);
            }
        }
        flag => return Err(invalid(format!("flag {flag}"))),
    }
    reader.finish().map_err(err)?;
    Ok(Item { value, coll, version, expires_at })
}

/// The image of a string `value` with no expiry (what a `Restore` that acts as a put
/// carries).
pub fn string(value: &[u8]) -> Value {
    encode(&Item::string(Some(Value::copy_from_slice(value)), Version::new(0, 0), None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_decodes_to_the_item_it_was_made_of_and_nothing_else_decodes() {
        let version = Version::new(3, 9);
        let item = Item { value: Some("v".into()), coll: None, version, expires_at: Some(77) };
        assert_eq!(decode(&encode(&item), version), Ok(item.clone()));
        let plain = Item { expires_at: None, ..item };
        let image = encode(&plain);
        assert_eq!(decode(&image, version), Ok(plain));
        assert!(decode(&image[..image.len() - 1], version).is_err(), "cut short");
        let mut longer = image.to_vec();
        longer.push(0);
        assert!(decode(&longer, version).is_err(), "bytes left over");
        assert!(decode(&[0], version).is_err(), "a tombstone has no image");
        assert!(decode(&[], version).is_err());
    }
}
