//! Byte layouts of everything the storage writes, and the pure scan that recovery runs
//! over a segment's bytes. `docs/format.md` is the prose version of this module.
//!
//! Layout:
//! - file names: segments `wal-<first index, 20 digits>.log`, snapshots
//!   `snapshot-<last index, 20 digits>.snap`, the hard state `hard-state`, temporaries
//!   `<name>.tmp`;
//! - segment header (24 bytes) and log records (`len u32 | crc u32 | entry`);
//! - [`scan_segment`]: the longest valid prefix of a segment's records;
//! - the hard-state file and the snapshot file, each with its checksums.
//!
//! Everything here is pure: bytes in, values out. Both the file and the simulated
//! storage use it, so their recovery behaviour is the same by construction.

use keel_types::codec::{self, put_u32, put_u64, Reader};
use keel_types::{Epoch, HardState, LogIndex, LogRecord, SnapshotMeta, Version};

/// Magic bytes opening a segment file.
pub const SEGMENT_MAGIC: [u8; 4] = *b"KWAL";
/// Segment format version 1: records only.
pub const SEGMENT_FORMAT_V1: u32 = 1;
/// Segment format version 2 (written since): records and seals.
pub const SEGMENT_FORMAT_V2: u32 = 2;
/// Size of a segment header: magic, version, first index, reserved, crc.
pub const SEGMENT_HEADER_BYTES: u64 = 24;
/// Size of a record header: payload length and crc.
pub const RECORD_HEADER_BYTES: u64 = 8;
/// The length field that marks a seal instead of a record.
pub const SEAL_LEN: u32 = u32::MAX;
/// Size of a seal: the marker, a crc, and the epoch and index of the entry it follows.
pub const SEAL_BYTES: u64 = RECORD_HEADER_BYTES + 16;
/// Magic bytes opening the hard-state file.
pub const HARD_STATE_MAGIC: [u8; 4] = *b"KHST";
/// Hard-state file format version.
pub const HARD_STATE_FILE_V1: u32 = 1;
/// Largest hard-state payload the reader accepts.
pub const HARD_STATE_PAYLOAD_BYTES_MAX: u32 = 64;
/// Magic bytes opening a snapshot file.
pub const SNAPSHOT_MAGIC: [u8; 4] = *b"KSNP";
/// Snapshot file format version.
pub const SNAPSHOT_FILE_V1: u32 = 1;
/// Largest snapshot-meta payload the reader accepts.
pub const SNAPSHOT_META_BYTES_MAX: u32 = 64;
/// The hard-state file's name.
pub const HARD_STATE_NAME: &str = "hard-state";
/// Suffix of files being written before their atomic rename.
pub const TEMP_SUFFIX: &str = ".tmp";
/// Suffix recovery gives a snapshot file it found damaged (kept for inspection, never read).
pub const DAMAGED_SUFFIX: &str = ".damaged";

const SEGMENT_PREFIX: &str = "wal-";
const SEGMENT_SUFFIX: &str = ".log";
const SNAPSHOT_PREFIX: &str = "snapshot-";
const SNAPSHOT_SUFFIX: &str = ".snap";
const INDEX_DIGITS: usize = 20;

/// The name of the segment whose first entry is `first`.
pub fn segment_name(first: LogIndex) -> String {
    format!("{SEGMENT_PREFIX}{:0width$}{SEGMENT_SUFFIX}", first.0, width = INDEX_DIGITS)
}

/// The first index named by a segment file name, if it is one.
pub fn parse_segment_name(name: &str) -> Option<LogIndex> {
    parse_index(name, SEGMENT_PREFIX, SEGMENT_SUFFIX).map(LogIndex)
}

/// The name of the snapshot whose last included entry is `last`.
pub fn snapshot_name(last: LogIndex) -> String {
    format!("{SNAPSHOT_PREFIX}{:0width$}{SNAPSHOT_SUFFIX}", last.0, width = INDEX_DIGITS)
}

/// The last index named by a snapshot file name, if it is one.
pub fn parse_snapshot_name(name: &str) -> Option<LogIndex> {
    parse_index(name, SNAPSHOT_PREFIX, SNAPSHOT_SUFFIX).map(LogIndex)
}

fn parse_index(name: &str, prefix: &str, suffix: &str) -> Option<u64> {
    let digits = name.strip_prefix(prefix)?.strip_suffix(suffix)?;
    if digits.len() != INDEX_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The 24-byte header that opens the segment whose first entry is `first`.
pub fn segment_header(first: LogIndex) -> Vec<u8> {
    segment_header_of(SEGMENT_FORMAT_V2, first)
}

fn segment_header_of(format: u32, first: LogIndex) -> Vec<u8> {
    let mut out = Vec::with_capacity(SEGMENT_HEADER_BYTES as usize);
    out.extend_from_slice(&SEGMENT_MAGIC);
    put_u32(&mut out, format);
    put_u64(&mut out, first.0);
    put_u32(&mut out, 0); // reserved
    let crc = crc32c::crc32c(&out);
    put_u32(&mut out, crc);
    assert_eq!(out.len() as u64, SEGMENT_HEADER_BYTES);
    out
}

/// Checks a segment header against the first index its name promises.
pub fn check_segment_header(bytes: &[u8], first: LogIndex) -> Result<(), String> {
    let header = bytes.get(..SEGMENT_HEADER_BYTES as usize).ok_or("header cut short")?;
    let known = [SEGMENT_FORMAT_V2, SEGMENT_FORMAT_V1];
    if !known.iter().any(|format| header == segment_header_of(*format, first).as_slice()) {
        return Err(format!("header does not match a version-1 or 2 segment starting at {first}"));
    }
    Ok(())
}

/// The seal written after the last record of a batch, just before its fsync: it names
/// that record's entry. A record whose checksum fails but that a later seal or record
/// follows was written whole and synced, then damaged: corruption, not a torn write.
pub fn encode_seal(last: Version) -> [u8; SEAL_BYTES as usize] {
    let mut out = [0u8; SEAL_BYTES as usize];
    out[..4].copy_from_slice(&SEAL_LEN.to_le_bytes());
    out[8..16].copy_from_slice(&last.epoch.0.to_le_bytes());
    out[16..24].copy_from_slice(&last.index.0.to_le_bytes());
    let crc = record_crc(SEAL_LEN.to_le_bytes(), &out[8..]);
    out[4..8].copy_from_slice(&crc.to_le_bytes());
    out
}

/// Whether the bytes after a damaged seal at the start of `rest` hold the record the
/// scan expects next (so the seal can be stepped over).
fn seal_skippable<R: LogRecord>(
    rest: &[u8],
    expected: LogIndex,
    epoch_floor: Epoch,
    max: u32,
) -> bool {
    let Some(after) = rest.get(SEAL_BYTES as usize..) else { return false };
    read_record::<R>(after, max).is_ok_and(|(record, _)| {
        let version = record.version();
        version.index == expected && version.epoch >= epoch_floor
    })
}

/// Reads the seal at the start of `rest`: the entry it names.
fn read_seal(rest: &[u8]) -> Result<Version, ScanStop> {
    let Some(seal) = rest.get(..SEAL_BYTES as usize) else { return Err(ScanStop::TornRecord) };
    let crc = u32::from_le_bytes(seal[4..8].try_into().expect("4 bytes"));
    if record_crc(SEAL_LEN.to_le_bytes(), &seal[8..]) != crc {
        return Err(ScanStop::BadChecksum);
    }
    let epoch = Epoch(u64::from_le_bytes(seal[8..16].try_into().expect("8 bytes")));
    let index = LogIndex(u64::from_le_bytes(seal[16..24].try_into().expect("8 bytes")));
    Ok(Version { epoch, index })
}

/// Appends one log record for `record` (an engine's log record: the leader engine's
/// entry); returns the record's size in bytes.
pub fn encode_record<R: LogRecord>(record: &R, out: &mut Vec<u8>) -> u64 {
    let start = out.len();
    out.extend_from_slice(&[0; RECORD_HEADER_BYTES as usize]);
    codec::encode(record, out);
    let payload_len = u32::try_from(out.len() - start - RECORD_HEADER_BYTES as usize)
        .expect("an entry's encoding fits a u32 (values are capped by the limits)");
    let len_bytes = payload_len.to_le_bytes();
    let crc = record_crc(len_bytes, &out[start + RECORD_HEADER_BYTES as usize..]);
    out[start..start + 4].copy_from_slice(&len_bytes);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    (out.len() - start) as u64
}

fn record_crc(len_bytes: [u8; 4], payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&len_bytes), payload)
}

/// Why a segment scan stopped before the end of the bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScanStop {
    /// The segment header is missing or wrong; the segment holds nothing valid.
    BadHeader(String),
    /// The last record is cut short (a torn write).
    TornRecord,
    /// A record's length is zero or past `record_bytes_max`.
    BadLength(u32),
    /// A record's checksum does not match.
    BadChecksum,
    /// A record's payload does not decode as an entry.
    BadPayload(String),
    /// A record holds the wrong index, or an epoch lower than its predecessor's.
    OutOfOrder {
        /// The index the scan expected.
        expected: LogIndex,
        /// The index found.
        found: LogIndex,
    },
}

/// The longest valid prefix of one segment (of records `R`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentScan<R> {
    /// The valid records, in order.
    pub entries: Vec<R>,
    /// For each valid entry, the byte offset just past its record.
    pub record_ends: Vec<u64>,
    /// Bytes of the valid prefix (header included; 0 if the header is bad).
    pub valid_bytes: u64,
    /// Why the scan stopped early, if it did.
    pub stop: Option<ScanStop>,
}

/// Scans the records of a segment named for `first`, keeping the longest valid prefix.
///
/// `epoch_floor` is the epoch of the entry before `first` (entries never go back in epoch).
pub fn scan_segment<R: LogRecord>(
    bytes: &[u8],
    first: LogIndex,
    epoch_floor: Epoch,
    record_bytes_max: u32,
) -> SegmentScan<R> {
    let mut scan =
        SegmentScan { entries: Vec::new(), record_ends: Vec::new(), valid_bytes: 0, stop: None };
    if let Err(reason) = check_segment_header(bytes, first) {
        scan.stop = Some(ScanStop::BadHeader(reason));
        return scan;
    }
    scan.valid_bytes = SEGMENT_HEADER_BYTES;
    let mut expected = first;
    let mut epoch_floor = epoch_floor;
    // Each pass consumes at least RECORD_HEADER_BYTES, so the loop is bounded by the input.
    while scan.valid_bytes < bytes.len() as u64 {
        let rest = &bytes[scan.valid_bytes as usize..];
        if rest.get(..4) == Some(&SEAL_LEN.to_le_bytes()[..]) {
            let names = Version { epoch: epoch_floor, index: expected.prev() };
            match read_seal(rest) {
                Ok(sealed) if sealed == names && expected > first => {
                    scan.valid_bytes += SEAL_BYTES;
                    continue;
                }
                // A damaged seal costs no entry when the record it precedes is intact.
                Err(_) if seal_skippable::<R>(rest, expected, epoch_floor, record_bytes_max) => {
                    scan.valid_bytes += SEAL_BYTES;
                    continue;
                }
                Ok(sealed) => {
                    scan.stop = Some(ScanStop::OutOfOrder { expected, found: sealed.index });
                }
                Err(stop) => scan.stop = Some(stop),
            }
            break;
        }
        let (entry, record_bytes) = match read_record::<R>(rest, record_bytes_max) {
            Ok(read) => read,
            Err(stop) => {
                scan.stop = Some(stop);
                break;
            }
        };
        let version = entry.version();
        if version.index != expected || version.epoch < epoch_floor {
            scan.stop = Some(ScanStop::OutOfOrder { expected, found: version.index });
            break;
        }
        scan.valid_bytes += record_bytes;
        scan.record_ends.push(scan.valid_bytes);
        epoch_floor = version.epoch;
        expected = expected.next();
        scan.entries.push(entry);
    }
    assert!(scan.valid_bytes <= bytes.len() as u64);
    assert_eq!(scan.entries.len(), scan.record_ends.len());
    scan
}

/// Reads the record at the start of `rest`: the entry and the record's size in bytes.
fn read_record<R: LogRecord>(rest: &[u8], record_bytes_max: u32) -> Result<(R, u64), ScanStop> {
    if (rest.len() as u64) < RECORD_HEADER_BYTES {
        return Err(ScanStop::TornRecord);
    }
    let len_bytes: [u8; 4] = rest[..4].try_into().expect("4 bytes");
    let len = u32::from_le_bytes(len_bytes);
    if len == 0 || len > record_bytes_max {
        return Err(ScanStop::BadLength(len));
    }
    let crc = u32::from_le_bytes(rest[4..8].try_into().expect("4 bytes"));
    let payload = &rest[RECORD_HEADER_BYTES as usize..];
    let Some(payload) = payload.get(..len as usize) else {
        return Err(ScanStop::TornRecord);
    };
    if record_crc(len_bytes, payload) != crc {
        return Err(ScanStop::BadChecksum);
    }
    let entry = codec::decode::<R>(payload).map_err(|e| ScanStop::BadPayload(e.to_string()))?;
    Ok((entry, RECORD_HEADER_BYTES + u64::from(len)))
}

/// Where the record of `index` starts in the segment `bytes` named for `first`, stepping
/// over seals (`None` if the segment does not hold it intact).
pub fn record_start(bytes: &[u8], first: LogIndex, index: LogIndex) -> Option<u64> {
    let mut offset = SEGMENT_HEADER_BYTES;
    let mut at = first;
    while let Some(rest) = bytes.get(offset as usize..).filter(|rest| rest.len() >= 8) {
        let len = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes"));
        if len == SEAL_LEN {
            offset += SEAL_BYTES;
            continue;
        }
        if at == index {
            return Some(offset);
        }
        offset += RECORD_HEADER_BYTES + u64::from(len);
        at = at.next();
    }
    None
}

/// The greatest entry that intact records or seals name in `bytes` from `offset` on,
/// skipping damaged records by their length while it is plausible: what the log held
/// past a damaged record (`None` if nothing intact follows it).
pub fn versions_past<R: LogRecord>(
    bytes: &[u8],
    offset: u64,
    record_bytes_max: u32,
) -> Option<Version> {
    let mut best = None;
    let from = offset;
    let mut offset = offset;
    // Each pass moves on by at least RECORD_HEADER_BYTES, so the loop is bounded.
    while let Some(rest) = bytes.get(offset as usize..) {
        let Some(len_bytes) = rest.get(..4) else { break };
        let len = u32::from_le_bytes(len_bytes.try_into().expect("4 bytes"));
        let size = match len {
            SEAL_LEN => SEAL_BYTES,
            0 => break,
            len if len > record_bytes_max => break,
            len => RECORD_HEADER_BYTES + u64::from(len),
        };
        let Some(item) = rest.get(..size as usize) else { break };
        let found = match len {
            SEAL_LEN => read_seal(item).ok(),
            _ => read_record::<R>(item, record_bytes_max).ok().map(|(record, _)| record.version()),
        };
        best = best.max(found);
        offset += size;
    }
    // A damaged length field misleads the walk above: look for seals at every offset
    // past the bad record too (each synced batch ends with one; a seal is found by its
    // marker and checked by its checksum, so this costs one pass over the bytes).
    let start = from as usize;
    let marker = SEAL_LEN.to_le_bytes();
    let mut at = start;
    while let Some(found) =
        bytes.get(at..).and_then(|rest| rest.windows(4).position(|w| w == marker))
    {
        at += found;
        if let Ok(seal) = read_seal(&bytes[at..]) {
            best = best.max(Some(seal));
        }
        at += 1;
    }
    best
}

/// The bytes of the hard-state file: `magic | version u32 | len u32 | payload | crc u32`,
/// the crc covering everything before it.
pub fn encode_hard_state_file(hard_state: &HardState) -> Vec<u8> {
    let mut payload = Vec::new();
    codec::encode(hard_state, &mut payload);
    let mut out = Vec::with_capacity(payload.len() + 16);
    out.extend_from_slice(&HARD_STATE_MAGIC);
    put_u32(&mut out, HARD_STATE_FILE_V1);
    put_u32(&mut out, payload.len() as u32);
    out.extend_from_slice(&payload);
    let crc = crc32c::crc32c(&out);
    put_u32(&mut out, crc);
    out
}

/// Reads the hard-state file; any damage is an error (the file is replaced atomically,
/// so a torn hard-state file means the disk lies).
pub fn decode_hard_state_file(bytes: &[u8]) -> Result<HardState, String> {
    let body_len = bytes.len().checked_sub(4).ok_or("file shorter than its checksum")?;
    let (body, crc) = bytes.split_at(body_len);
    if crc32c::crc32c(body).to_le_bytes() != crc {
        return Err("checksum mismatch".into());
    }
    let mut reader = Reader::new(body);
    read_magic(&mut reader, HARD_STATE_MAGIC, HARD_STATE_FILE_V1)?;
    let payload =
        reader.slice("hard state", HARD_STATE_PAYLOAD_BYTES_MAX).map_err(|e| e.to_string())?;
    reader.finish().map_err(|e| e.to_string())?;
    codec::decode(payload).map_err(|e| e.to_string())
}

fn read_magic(reader: &mut Reader<'_>, magic: [u8; 4], version: u32) -> Result<(), String> {
    let found = reader.take("magic", 4).map_err(|e| e.to_string())?;
    if found != magic {
        return Err("bad magic".into());
    }
    let found = reader.u32("format version").map_err(|e| e.to_string())?;
    if found != version {
        return Err(format!("unknown format version {found}"));
    }
    Ok(())
}

/// The bytes of a snapshot file:
/// `magic | version u32 | meta_len u32 | meta | data_len u64 | header_crc u32 | data |
/// data_crc u32`; `header_crc` covers every byte before it, `data_crc` the data alone.
pub fn encode_snapshot_file(meta: &SnapshotMeta, data: &[u8]) -> Vec<u8> {
    let (header, trailer) = snapshot_file_frame(meta, data);
    let mut out = Vec::with_capacity(header.len() + data.len() + trailer.len());
    out.extend_from_slice(&header);
    out.extend_from_slice(data);
    out.extend_from_slice(&trailer);
    out
}

/// The bytes a snapshot file puts around its data: the header (through `header_crc`) and
/// the trailer (`data_crc`). Header, data and trailer written in turn are the bytes of
/// [`encode_snapshot_file`], without a second copy of the data in memory.
pub fn snapshot_file_frame(meta: &SnapshotMeta, data: &[u8]) -> (Vec<u8>, [u8; 4]) {
    let mut meta_bytes = Vec::new();
    codec::encode(meta, &mut meta_bytes);
    let mut header = Vec::with_capacity(meta_bytes.len() + 32);
    header.extend_from_slice(&SNAPSHOT_MAGIC);
    put_u32(&mut header, SNAPSHOT_FILE_V1);
    put_u32(&mut header, meta_bytes.len() as u32);
    header.extend_from_slice(&meta_bytes);
    put_u64(&mut header, data.len() as u64);
    let crc = crc32c::crc32c(&header);
    put_u32(&mut header, crc);
    (header, crc32c::crc32c(data).to_le_bytes())
}

/// Reads a snapshot file's header: its meta, the data length and where the data starts.
/// A header whose checksum holds is trusted even when the data after it is damaged.
pub fn decode_snapshot_header(bytes: &[u8]) -> Result<(SnapshotMeta, u64, usize), String> {
    let mut reader = Reader::new(bytes);
    read_magic(&mut reader, SNAPSHOT_MAGIC, SNAPSHOT_FILE_V1)?;
    let meta_bytes =
        reader.slice("snapshot meta", SNAPSHOT_META_BYTES_MAX).map_err(|e| e.to_string())?;
    let data_len = reader.u64("snapshot length").map_err(|e| e.to_string())?;
    let header_len = bytes.len() as u64 - reader.remaining();
    let header_crc = reader.u32("header checksum").map_err(|e| e.to_string())?;
    if crc32c::crc32c(&bytes[..header_len as usize]) != header_crc {
        return Err("header checksum mismatch".into());
    }
    let meta: SnapshotMeta = codec::decode(meta_bytes).map_err(|e| e.to_string())?;
    Ok((meta, data_len, bytes.len() - reader.remaining() as usize))
}

/// Reads a snapshot file; any damage is an error. `data_bytes_max` bounds the data
/// length, checked before allocating.
pub fn decode_snapshot_file(
    bytes: &[u8],
    data_bytes_max: u64,
) -> Result<(SnapshotMeta, Vec<u8>), String> {
    let (meta, data_len, data_at) = decode_snapshot_header(bytes)?;
    if data_len > data_bytes_max {
        return Err(format!("snapshot of {data_len} bytes exceeds the limit of {data_bytes_max}"));
    }
    let mut reader = Reader::new(&bytes[data_at..]);
    let data = reader.take("snapshot data", data_len).map_err(|e| e.to_string())?;
    let data_crc = reader.u32("data checksum").map_err(|e| e.to_string())?;
    reader.finish().map_err(|e| e.to_string())?;
    if crc32c::crc32c(data) != data_crc {
        return Err("data checksum mismatch".into());
    }
    Ok((meta, data.to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_types::{Entry, EntryPayload};

    fn noop(epoch: u64, index: u64) -> Entry {
        Entry { epoch: Epoch(epoch), index: LogIndex(index), payload: EntryPayload::Noop }
    }

    fn segment(first: u64, entries: &[Entry]) -> Vec<u8> {
        let mut bytes = segment_header(LogIndex(first));
        for entry in entries {
            encode_record(entry, &mut bytes);
        }
        bytes
    }

    #[test]
    fn names_round_trip_and_sort_by_index() {
        assert_eq!(parse_segment_name(&segment_name(LogIndex(42))), Some(LogIndex(42)));
        assert_eq!(parse_snapshot_name(&snapshot_name(LogIndex(7))), Some(LogIndex(7)));
        assert!(segment_name(LogIndex(9)) < segment_name(LogIndex(10)));
        assert_eq!(parse_segment_name("wal-12.log"), None);
        assert_eq!(parse_segment_name(&format!("{}.tmp", segment_name(LogIndex(1)))), None);
    }

    #[test]
    fn a_clean_segment_scans_whole() {
        let entries = [noop(1, 5), noop(1, 6), noop(2, 7)];
        let bytes = segment(5, &entries);
        let scan = scan_segment::<Entry>(&bytes, LogIndex(5), Epoch(1), 1024);
        assert_eq!(scan.entries, entries);
        assert_eq!(scan.valid_bytes, bytes.len() as u64);
        assert_eq!(scan.stop, None);
    }

    #[test]
    fn a_cut_at_every_byte_of_the_last_record_keeps_the_prefix() {
        let entries = [noop(1, 1), noop(1, 2)];
        let bytes = segment(1, &entries);
        let whole_first =
            scan_segment::<Entry>(&segment(1, &entries[..1]), LogIndex(1), Epoch(0), 1024);
        for cut in whole_first.valid_bytes as usize..bytes.len() {
            let scan = scan_segment::<Entry>(&bytes[..cut], LogIndex(1), Epoch(0), 1024);
            assert_eq!(scan.entries, entries[..1], "cut at {cut}");
            assert_eq!(scan.valid_bytes, whole_first.valid_bytes);
            assert!(cut == whole_first.valid_bytes as usize || scan.stop.is_some());
        }
    }

    #[test]
    fn a_flipped_bit_ends_the_valid_prefix_there() {
        let entries = [noop(1, 1), noop(1, 2), noop(1, 3)];
        let mut bytes = segment(1, &entries);
        let ends = scan_segment::<Entry>(&bytes, LogIndex(1), Epoch(0), 1024).record_ends;
        bytes[ends[0] as usize + 9] ^= 0x40;
        let scan = scan_segment::<Entry>(&bytes, LogIndex(1), Epoch(0), 1024);
        assert_eq!(scan.entries, entries[..1]);
        assert_eq!(scan.stop, Some(ScanStop::BadChecksum));
    }

    #[test]
    fn wrong_index_lower_epoch_and_bad_header_stop_the_scan() {
        let bytes = segment(1, &[noop(1, 1), noop(1, 3)]);
        let scan = scan_segment::<Entry>(&bytes, LogIndex(1), Epoch(0), 1024);
        assert_eq!(scan.entries.len(), 1);
        assert!(matches!(scan.stop, Some(ScanStop::OutOfOrder { .. })));
        let bytes = segment(1, &[noop(2, 1), noop(1, 2)]);
        assert_eq!(scan_segment::<Entry>(&bytes, LogIndex(1), Epoch(0), 1024).entries.len(), 1);
        let scan = scan_segment::<Entry>(&bytes, LogIndex(2), Epoch(0), 1024);
        assert!(matches!(scan.stop, Some(ScanStop::BadHeader(_))));
        assert_eq!(scan.valid_bytes, 0);
    }

    #[test]
    fn zeroed_tail_and_oversized_lengths_stop_the_scan() {
        let mut bytes = segment(1, &[noop(1, 1)]);
        bytes.extend_from_slice(&[0; 32]);
        let scan = scan_segment::<Entry>(&bytes, LogIndex(1), Epoch(0), 1024);
        assert_eq!((scan.entries.len(), scan.stop), (1, Some(ScanStop::BadLength(0))));
        let bytes = segment(1, &[noop(1, 1)]);
        let scan = scan_segment::<Entry>(&bytes, LogIndex(1), Epoch(0), 4);
        assert!(matches!(scan.stop, Some(ScanStop::BadLength(_))));
    }

    #[test]
    fn hard_state_file_round_trips_and_detects_damage() {
        let hard_state = HardState {
            epoch: Epoch(4),
            voted_for: Some(keel_types::NodeId(2)),
            repair_floor: None,
            members_epoch: 0,
        };
        let bytes = encode_hard_state_file(&hard_state);
        assert_eq!(decode_hard_state_file(&bytes), Ok(hard_state));
        for at in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[at] ^= 1;
            assert!(decode_hard_state_file(&damaged).is_err(), "flip at {at}");
            assert!(decode_hard_state_file(&bytes[..at]).is_err(), "cut at {at}");
        }
    }

    #[test]
    fn snapshot_file_frame_around_the_data_is_the_file() {
        let meta = SnapshotMeta { last_index: LogIndex(7), last_epoch: Epoch(3) };
        let data = b"the state".as_slice();
        let (header, trailer) = snapshot_file_frame(&meta, data);
        assert_eq!([&header[..], data, &trailer[..]].concat(), encode_snapshot_file(&meta, data));
    }

    #[test]
    fn snapshot_file_round_trips_and_detects_damage() {
        let meta = SnapshotMeta { last_index: LogIndex(9), last_epoch: Epoch(2) };
        let bytes = encode_snapshot_file(&meta, b"state");
        assert_eq!(decode_snapshot_file(&bytes, 1024), Ok((meta, b"state".to_vec())));
        assert!(decode_snapshot_file(&bytes, 4).is_err());
        for at in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[at] ^= 1;
            assert!(decode_snapshot_file(&damaged, 1024).is_err(), "flip at {at}");
            assert!(decode_snapshot_file(&bytes[..at], 1024).is_err(), "cut at {at}");
        }
    }
}
