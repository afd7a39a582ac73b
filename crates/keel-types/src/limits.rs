//! Every limit Keel enforces, named in one place (`*_max`). Defaults are conservative;
//! a server's configuration may change the ones marked configurable.

use crate::KeelError;
use serde::{Deserialize, Serialize};

/// Default longest key: 1 KiB.
pub const KEY_BYTES_MAX_DEFAULT: u32 = 1024;
/// Default largest value: 16 MiB. Redis's default (`proto-max-bulk-len`) is 512 MB; a
/// Keel value travels whole in one log entry and one peer message, and a request of one
/// is held up to four times over in the request buffers (`docs/redis-compatibility.md`).
pub const VALUE_BYTES_MAX_DEFAULT: u32 = 16 * 1024 * 1024;
/// Default most items one scan returns.
pub const SCAN_ITEMS_MAX_DEFAULT: u32 = 10_000;
/// Hard ceiling on any configured value size: a log record must fit a u32 length.
pub const VALUE_BYTES_CEILING: u32 = 64 * 1024 * 1024;

/// Highest epoch a node adopts or persists: a peer message naming a higher one is refused,
/// so that no input can bring an epoch near overflow (one election a millisecond would
/// take 146 million years to reach it).
pub const EPOCH_MAX: u64 = 1 << 62;
/// Highest log index a node accepts in a message or on disk (same reasoning).
pub const LOG_INDEX_MAX: u64 = 1 << 62;

/// Ceiling on the deduplication table's bound (`dedup_clients_max`): a leader's settings
/// entry or a snapshot naming more is refused, so no input makes a replica keep more.
pub const DEDUP_CLIENTS_CEILING: u32 = 1 << 20;

const _: () = assert!(KEY_BYTES_MAX_DEFAULT <= VALUE_BYTES_CEILING);
const _: () = assert!(EPOCH_MAX < u64::MAX / 2 && LOG_INDEX_MAX < u64::MAX / 2);
const _: () = assert!(VALUE_BYTES_MAX_DEFAULT <= VALUE_BYTES_CEILING);

/// The configurable limits on what a client may send.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Longest key in bytes (configurable).
    pub key_bytes_max: u32,
    /// Largest value in bytes (configurable, at most [`VALUE_BYTES_CEILING`]).
    pub value_bytes_max: u32,
    /// Most items one scan may return (configurable).
    pub scan_items_max: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            key_bytes_max: KEY_BYTES_MAX_DEFAULT,
            value_bytes_max: VALUE_BYTES_MAX_DEFAULT,
            scan_items_max: SCAN_ITEMS_MAX_DEFAULT,
        }
    }
}

impl Limits {
    /// Refuses an empty or oversized key.
    pub fn check_key(&self, key: &[u8]) -> Result<(), KeelError> {
        if key.len() as u64 > u64::from(self.key_bytes_max) {
            return Err(KeelError::KeyTooLarge { len: key.len() as u64, max: self.key_bytes_max });
        }
        Ok(())
    }

    /// Refuses an oversized value.
    pub fn check_value(&self, value: &[u8]) -> Result<(), KeelError> {
        if value.len() as u64 > u64::from(self.value_bytes_max) {
            return Err(KeelError::ValueTooLarge {
                len: value.len() as u64,
                max: self.value_bytes_max,
            });
        }
        Ok(())
    }

    /// Checks the limits themselves, naming the field that is out of range.
    pub fn validate(&self) -> Result<(), String> {
        if self.key_bytes_max == 0 || self.key_bytes_max > VALUE_BYTES_CEILING {
            return Err(format!("key_bytes_max must be in 1..={VALUE_BYTES_CEILING}"));
        }
        if self.value_bytes_max > VALUE_BYTES_CEILING {
            return Err(format!("value_bytes_max must be at most {VALUE_BYTES_CEILING}"));
        }
        if self.scan_items_max == 0 {
            return Err("scan_items_max must be at least 1".to_string());
        }
        Ok(())
    }
}
