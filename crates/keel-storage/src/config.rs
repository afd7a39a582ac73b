//! The storage's named limits, in one place.

use keel_types::limits::VALUE_BYTES_CEILING;

/// Default segment size: a segment rolls once the next record would take it past 64 MiB.
pub const SEGMENT_BYTES_MAX_DEFAULT: u64 = 64 * 1024 * 1024;
/// Default largest log record: a `cas` carries a key and two values of at most
/// [`VALUE_BYTES_CEILING`] each, plus a few bytes of framing.
pub const RECORD_BYTES_MAX_DEFAULT: u32 = 3 * VALUE_BYTES_CEILING + 4096;
/// Default largest snapshot (its bytes are held in memory while written and recovered).
pub const SNAPSHOT_BYTES_MAX_DEFAULT: u64 = 1024 * 1024 * 1024;
/// Most entries held in memory for one [`crate::Recovered`]; with the defaults above a
/// log longer than this has not been compacted for a very long time.
pub const RECOVERED_ENTRIES_MAX_DEFAULT: u64 = 16 * 1024 * 1024;

const _: () = assert!(RECORD_BYTES_MAX_DEFAULT as u64 > 3 * VALUE_BYTES_CEILING as u64);
const _: () = assert!(SEGMENT_BYTES_MAX_DEFAULT >= 1024 * 1024);

/// Limits of one storage instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StorageConfig {
    /// A segment rolls once the next record would take it past this size. A single record
    /// larger than this gets a segment of its own, so a segment holds at most
    /// `max(segment_bytes_max, header + record_bytes_max)` bytes.
    pub segment_bytes_max: u64,
    /// Largest encoded log record (length field excluded). Larger appends fail; a larger
    /// length found at recovery ends the valid log there.
    pub record_bytes_max: u32,
    /// Largest snapshot payload.
    pub snapshot_bytes_max: u64,
    /// Most entries one recovery may return.
    pub recovered_entries_max: u64,
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            segment_bytes_max: SEGMENT_BYTES_MAX_DEFAULT,
            record_bytes_max: RECORD_BYTES_MAX_DEFAULT,
            snapshot_bytes_max: SNAPSHOT_BYTES_MAX_DEFAULT,
            recovered_entries_max: RECOVERED_ENTRIES_MAX_DEFAULT,
        }
    }
}

impl StorageConfig {
    /// A configuration with small segments, for tests and the simulator (many rolls).
    pub fn small_segments(segment_bytes_max: u64) -> StorageConfig {
        StorageConfig { segment_bytes_max, ..StorageConfig::default() }
    }

    /// Checks the limits themselves; panics on nonsense (a programmer error).
    pub fn assert_valid(&self) {
        assert!(self.segment_bytes_max > 0, "segment_bytes_max must be positive");
        assert!(self.record_bytes_max > 0, "record_bytes_max must be positive");
        assert!(self.recovered_entries_max > 0, "recovered_entries_max must be positive");
    }
}
