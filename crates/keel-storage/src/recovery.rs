//! Recovery: read the directory, keep the longest valid prefix of the log, join it to
//! the snapshot, repair the disk, rebuild the in-memory state.
//!
//! Steps (see `docs/format.md`, "Recovery"):
//! 1. remove temporary files (an interrupted atomic replace);
//! 2. read the hard state (a bad checksum stops recovery: the file held the node's vote,
//!    which only an operator can rebuild, `StorageError::HardStateDamaged`);
//! 3. read the newest snapshot, remove older ones; a damaged newest snapshot is set aside
//!    (renamed `*.damaged`) with the whole log, which cannot join anything without it:
//!    the greatest entry they held becomes the repair floor, and the node is repaired
//!    from a leader's snapshot;
//! 4. scan segments in index order; the first torn or corrupt record, bad header, empty
//!    segment or gap ends the log there; if intact records or seals lie past a bad record
//!    in its segment, it was written whole and synced, then damaged: the greatest entry
//!    they name becomes the hard state's repair floor, saved before anything is cut;
//! 5. join the log to the snapshot: entries at or below the snapshot are dropped; a log
//!    that ends before the snapshot or disagrees with it at the snapshot's index is
//!    discarded; a log that starts after `snapshot + 1` is corruption;
//! 6. cut the tail, remove dropped segments, fsync what is kept and the directory.

use crate::disk::Disk;
use crate::error::{StorageError, StorageResult};
use crate::format::{
    decode_hard_state_file, decode_snapshot_file, decode_snapshot_header, encode_hard_state_file,
    encode_seal, parse_segment_name, parse_snapshot_name, scan_segment, segment_name,
    snapshot_name, versions_past, DAMAGED_SUFFIX, HARD_STATE_NAME, SEAL_BYTES,
    SEGMENT_HEADER_BYTES, TEMP_SUFFIX,
};
use crate::storage::{LogDamage, Recovered};
use crate::wal::{write_synced, LogState, Segment, Wal};
use keel_types::{Epoch, HardState, LogIndex, LogRecord, SnapshotMeta, Version};
use std::collections::{BTreeMap, BTreeSet};

/// The valid prefix of the log as found on disk, before joining it to the snapshot.
#[derive(Debug)]
struct ScannedLog<R> {
    segments: Vec<Segment>,
    entries: Vec<R>,
    /// A segment to cut to a length (its tail is torn or corrupt).
    cut: Option<(LogIndex, u64)>,
    /// Segments to remove: after the end of the valid prefix.
    dropped: Vec<LogIndex>,
    /// Where a bad record ended the valid prefix: the first index lacking, and why.
    stop: Option<(LogIndex, String)>,
    /// The greatest entry intact records or seals past that stop name, in its segment.
    past: Option<Version>,
    /// The greatest entry intact records or seals of later segments name.
    later: Option<Version>,
    /// A damaged snapshot to rename, once the segments are gone: `(name, new name)`.
    set_aside: Option<(String, String)>,
}

impl<R: LogRecord> ScannedLog<R> {
    fn new() -> Self {
        ScannedLog {
            segments: Vec::new(),
            entries: Vec::new(),
            cut: None,
            dropped: Vec::new(),
            stop: None,
            past: None,
            later: None,
            set_aside: None,
        }
    }

    /// Damage, not a torn tail: something intact follows the bad record.
    fn damage(&self) -> Option<LogDamage> {
        let (at, reason) = self.stop.clone()?;
        let past = self.past.filter(|past| past.index >= at)?;
        Some(LogDamage { at, through: past.max(self.later.unwrap_or(past)), reason })
    }
}

/// The newest snapshot file as recovery found it.
enum FoundSnapshot {
    None,
    Intact(SnapshotMeta, Vec<u8>),
    Damaged(LostSnapshot),
}

/// A damaged newest snapshot: what its name and (if intact) its header still say.
struct LostSnapshot {
    name: String,
    index: LogIndex,
    epoch: Option<Epoch>,
    reason: String,
}

/// Whether the scanned log survives joining the snapshot.
#[derive(Debug, PartialEq, Eq)]
enum Join {
    Keep,
    Discard,
}

/// Decides how the log joins the snapshot (step 5).
fn join<R: LogRecord>(entries: &[R], snapshot: Option<SnapshotMeta>) -> Result<Join, String> {
    let (Some(first), Some(last)) = (entries.first(), entries.last()) else {
        return Ok(Join::Keep);
    };
    let (first, last) = (first.version(), last.version());
    let floor = snapshot.map_or(LogIndex::ZERO, |meta| meta.last_index);
    if first.index > floor.next() {
        return Err(format!("log starts at {} but the snapshot ends at {floor}", first.index));
    }
    let Some(meta) = snapshot else { return Ok(Join::Keep) };
    if last.index < meta.last_index {
        return Ok(Join::Discard);
    }
    if first.index <= meta.last_index {
        let at = entries[(meta.last_index.0 - first.index.0) as usize].version();
        assert_eq!(at.index, meta.last_index);
        if at.epoch != meta.last_epoch {
            return Ok(Join::Discard);
        }
    }
    Ok(Join::Keep)
}

/// Sets aside a damaged snapshot and the whole log with it (step 3): renames the
/// snapshot `*.damaged`, drops every segment, and returns the damage, through the
/// greatest entry either held. Without the snapshot's epoch (its header is damaged
/// too) and with no log entry past it, the hard state's epoch stands in for it: at
/// least the epoch of every entry the node held, so the floor only errs upward.
fn set_aside<R: LogRecord>(
    scanned: &mut ScannedLog<R>,
    lost: LostSnapshot,
    hard_epoch: Epoch,
) -> LogDamage {
    let held = Version { epoch: lost.epoch.unwrap_or(hard_epoch), index: lost.index };
    let past = [scanned.entries.last().map(R::version), scanned.past, scanned.later];
    let through = past.into_iter().flatten().fold(held, Version::max);
    let aside = format!("{}{DAMAGED_SUFFIX}", lost.name);
    scanned.set_aside = Some((lost.name.clone(), aside.clone()));
    scanned.dropped.extend(scanned.segments.drain(..).map(|s| s.first));
    scanned.entries.clear();
    scanned.cut = None;
    let reason = format!("{}: {}; set aside as {aside} with the log", lost.name, lost.reason);
    LogDamage { at: LogIndex::ZERO.next(), through, reason }
}

impl<D: Disk, R: LogRecord> Wal<D, R> {
    /// [`crate::Storage::recover`]'s implementation.
    pub(crate) fn recover_from_disk(&mut self) -> StorageResult<Recovered<R>> {
        assert!(self.log.is_none(), "recover runs once, before any other call");
        let names = self.io("list", "directory", |d| d.list())?;
        for temp in names.iter().filter(|name| name.ends_with(TEMP_SUFFIX)) {
            self.io("remove", temp, |d| d.remove(temp))?;
        }
        let mut hard_state = self.recover_hard_state(&names)?;
        let (snapshot, lost) = match self.recover_snapshot(&names)? {
            FoundSnapshot::None => (None, None),
            FoundSnapshot::Intact(meta, data) => (Some((meta, data)), None),
            FoundSnapshot::Damaged(lost) => (None, Some(lost)),
        };
        let meta = snapshot.as_ref().map(|(meta, _)| *meta);
        let mut scanned = self.scan_log(&names)?;
        let damage = match lost {
            Some(lost) => Some(set_aside(&mut scanned, lost, hard_state.epoch)),
            None => scanned.damage(),
        };
        let floor = meta.map_or(LogIndex::ZERO, |meta| meta.last_index);
        if let Some(damage) = damage.as_ref().filter(|damage| damage.through.index > floor) {
            // The promise first: once the floor is durable, the cut below may happen.
            if hard_state.repair_floor.is_none_or(|old| old < damage.through) {
                hard_state.repair_floor = Some(damage.through);
                self.save_recovered_hard_state(&hard_state)?;
            }
        }
        let decision = match join(&scanned.entries, meta) {
            Ok(decision) => decision,
            Err(reason) => {
                let name = segment_name(scanned.segments[0].first);
                return self.fail(StorageError::Corrupt { name, reason });
            }
        };
        if decision == Join::Discard {
            scanned.dropped.extend(scanned.segments.drain(..).map(|s| s.first));
            scanned.entries.clear();
            scanned.cut = None;
        }
        self.repair(&mut scanned)?;
        let entries = self.install(scanned, meta);
        let floor = meta.map_or(LogIndex::ZERO, |meta| meta.last_index);
        assert!(entries.first().is_none_or(|entry| entry.version().index == floor.next()));
        assert!(entries
            .windows(2)
            .all(|pair| pair[1].version().index == pair[0].version().index.next()));
        Ok(Recovered { hard_state, snapshot, entries, damage })
    }

    /// Rebuilds a damaged hard-state file (the operator's repair, `keel repair-hard-state`;
    /// `docs/operations.md`, "Damaged hard state"). `seen` is the greatest epoch any other
    /// member reports: every vote this node may have cast is in an epoch at most `seen`, or
    /// in one only this node reached (a campaign of its own nobody answered). The new hard
    /// state takes the epoch after `seen` (or the log's or snapshot's last epoch, if later)
    /// with no vote, so the node votes only in epochs it cannot have voted in before.
    /// Its repair floor, if it had one, is gone with the file: the log it guarded is kept
    /// as recovery finds it. Call instead of [`crate::Storage::recover`], before it.
    pub fn rebuild_hard_state(&mut self, seen: Epoch) -> StorageResult<HardState> {
        assert!(self.log.is_none(), "the hard state is rebuilt before recovery");
        let names = self.io("list", "directory", |d| d.list())?;
        let scanned = self.scan_log(&names)?;
        let mut epoch = Epoch(seen.0.saturating_add(1));
        if let Some(last) = scanned.entries.last() {
            epoch = epoch.max(last.version().epoch);
        }
        let newest = names.iter().filter_map(|name| parse_snapshot_name(name)).max();
        if let Some(newest) = newest {
            let name = snapshot_name(newest);
            let bytes = self.io("read", &name, |d| d.read(&name))?;
            if let Ok((meta, ..)) = decode_snapshot_header(&bytes) {
                epoch = epoch.max(meta.last_epoch);
            }
        }
        let hard_state = HardState { epoch, voted_for: None, repair_floor: None, members_epoch: 0 };
        self.save_recovered_hard_state(&hard_state)?;
        Ok(hard_state)
    }

    /// Replaces the hard state during recovery (before the log state exists).
    fn save_recovered_hard_state(&mut self, hard_state: &HardState) -> StorageResult<()> {
        let temp = format!("{HARD_STATE_NAME}{TEMP_SUFFIX}");
        let bytes = encode_hard_state_file(hard_state);
        self.io("write", &temp, |d| write_synced(d, &temp, &[&bytes]))?;
        self.io("rename", &temp, |d| d.rename(&temp, HARD_STATE_NAME))?;
        self.io("fsync", "directory", |d| d.sync_dir())
    }

    fn recover_hard_state(&mut self, names: &[String]) -> StorageResult<HardState> {
        if !names.iter().any(|name| name == HARD_STATE_NAME) {
            // An engine saves its epoch before the first entry or snapshot of it: a log or
            // snapshot without a hard state means the file was lost, and the vote with it.
            let written =
                |n: &String| parse_segment_name(n).is_some() || parse_snapshot_name(n).is_some();
            if names.iter().any(written) {
                let name = HARD_STATE_NAME.to_string();
                let reason = "missing beside a log or snapshot".to_string();
                return self.fail(StorageError::HardStateDamaged { name, reason });
            }
            return Ok(HardState::default());
        }
        let bytes = self.io("read", HARD_STATE_NAME, |d| d.read(HARD_STATE_NAME))?;
        decode_hard_state_file(&bytes).or_else(|reason| {
            self.fail(StorageError::HardStateDamaged { name: HARD_STATE_NAME.to_string(), reason })
        })
    }

    /// Reads the newest snapshot and removes older ones (a log compacted through the
    /// newest cannot join them).
    fn recover_snapshot(&mut self, names: &[String]) -> StorageResult<FoundSnapshot> {
        let indexes: BTreeSet<LogIndex> =
            names.iter().filter_map(|name| parse_snapshot_name(name)).collect();
        let Some(newest) = indexes.last().copied() else { return Ok(FoundSnapshot::None) };
        let name = snapshot_name(newest);
        let bytes = self.io("read", &name, |d| d.read(&name))?;
        let decoded = decode_snapshot_file(&bytes, self.config_ref().snapshot_bytes_max);
        let found = match decoded {
            Ok((meta, data)) if meta.last_index == newest => FoundSnapshot::Intact(meta, data),
            Ok((meta, _)) => FoundSnapshot::Damaged(LostSnapshot {
                name,
                index: newest,
                epoch: None,
                reason: format!("names index {newest} but holds {}", meta.last_index),
            }),
            Err(reason) => {
                // A header whose checksum holds still says the snapshot's last epoch.
                let header = decode_snapshot_header(&bytes).ok();
                let epoch = header.filter(|(meta, ..)| meta.last_index == newest);
                let epoch = epoch.map(|(meta, ..)| meta.last_epoch);
                FoundSnapshot::Damaged(LostSnapshot { name, index: newest, epoch, reason })
            }
        };
        for older in indexes.range(..newest) {
            let name = snapshot_name(*older);
            self.io("remove", &name, |d| d.remove(&name))?;
        }
        Ok(found)
    }

    /// Scans segments in index order, keeping the longest valid prefix (step 4).
    fn scan_log(&mut self, names: &[String]) -> StorageResult<ScannedLog<R>> {
        let firsts: BTreeSet<LogIndex> =
            names.iter().filter_map(|n| parse_segment_name(n)).collect();
        if let Some(first) = firsts.first().filter(|_| !R::KEEPS_LOG) {
            let name = segment_name(*first);
            let reason = "a log segment in the directory of an engine that keeps no log: it \
                          belongs to another engine kind"
                .to_string();
            return self.fail(StorageError::Corrupt { name, reason });
        }
        let mut scanned = ScannedLog::new();
        let mut expected: Option<LogIndex> = None;
        let mut epoch_floor = Epoch::default();
        let mut stopped = false;
        let record_bytes_max = self.config_ref().record_bytes_max;
        for first in firsts {
            if stopped || expected.is_some_and(|expected| expected != first) {
                // Later segments prove no damage (a crash can keep a later file's unsynced
                // writes and lose an earlier one's, and a truncation fsyncs only the
                // segment it cuts; so each segment is sealed when it rolls). But once the
                // damaged segment proves it, what they hold may have been acknowledged
                // too: the floor covers it.
                if scanned.stop.is_some() {
                    let name = segment_name(first);
                    let bytes = self.io("read", &name, |d| d.read(&name))?;
                    let past = versions_past::<R>(&bytes, SEGMENT_HEADER_BYTES, record_bytes_max);
                    scanned.later = scanned.later.max(past);
                }
                stopped = true;
                scanned.dropped.push(first);
                continue;
            }
            let name = segment_name(first);
            let bytes = self.io("read", &name, |d| d.read(&name))?;
            let scan = scan_segment::<R>(&bytes, first, epoch_floor, record_bytes_max);
            stopped = scan.valid_bytes < bytes.len() as u64;
            if stopped {
                let at = scan.entries.last().map_or(first, |last| last.version().index.next());
                let reason = format!("{name} at byte {}: {:?}", scan.valid_bytes, scan.stop);
                scanned.stop = Some((at, reason));
                // Within one file, writes reach the disk in order up to the first one
                // lost (a torn tail keeps a prefix): what is intact past a bad record
                // was written after it, and synced with or after it.
                let from = scan.valid_bytes.max(SEGMENT_HEADER_BYTES);
                scanned.past = versions_past::<R>(&bytes, from, record_bytes_max);
            }
            let Some(last) = scan.entries.last() else {
                stopped = true; // nothing may follow an empty segment: its index is taken
                scanned.dropped.push(first);
                continue;
            };
            if stopped {
                scanned.cut = Some((first, scan.valid_bytes));
            }
            let last = last.version();
            epoch_floor = last.epoch;
            expected = Some(last.index.next());
            scanned.entries.extend(scan.entries);
            scanned.segments.push(Segment::new(first, scan.record_ends, scan.valid_bytes));
            let max = self.config_ref().recovered_entries_max;
            if scanned.entries.len() as u64 > max {
                let len = scanned.entries.len() as u64;
                return self.fail(StorageError::TooLarge { what: "recovered log", len, max });
            }
        }
        Ok(scanned)
    }

    /// Cuts the torn tail, removes dropped segments, fsyncs what is kept (step 6).
    fn repair(&mut self, scanned: &mut ScannedLog<R>) -> StorageResult<()> {
        if let Some((first, len)) = scanned.cut {
            let name = segment_name(first);
            self.io("truncate", &name, |d| d.truncate(&name, len))?;
        }
        // What is kept is reported synced once fsynced below, so seal its last record in
        // the same fsync (it may have had none: a torn tail cut, or unsynced records a
        // process crash kept): damage to it later is then told from a torn write.
        if let (Some(segment), Some(last)) = (scanned.segments.last_mut(), scanned.entries.last()) {
            let name = segment.name();
            let seal = encode_seal(last.version());
            self.io("write", &name, |d| d.append(&name, &seal))?;
            segment.len += SEAL_BYTES;
        }
        for first in &scanned.dropped {
            let name = segment_name(*first);
            self.io("remove", &name, |d| d.remove(&name))?;
        }
        // A damaged snapshot goes last, once the log it compacted is gone for good: a
        // crash before then finds it again (and the floor already saved).
        if let Some((name, aside)) = scanned.set_aside.take() {
            self.io("fsync", "directory", |d| d.sync_dir())?;
            self.io("rename", &name, |d| d.rename(&name, &aside))?;
        }
        // Bytes read back may have been in the page cache only (a process crash): make
        // them durable before reporting them synced.
        for segment in &scanned.segments {
            let name = segment.name();
            self.io("fsync", &name, |d| d.sync(&name))?;
        }
        self.io("fsync", "directory", |d| d.sync_dir())
    }

    /// Builds the in-memory state; returns the entries after the snapshot.
    fn install(&mut self, scanned: ScannedLog<R>, meta: Option<SnapshotMeta>) -> Vec<R> {
        let floor = meta.map_or(LogIndex::ZERO, |meta| meta.last_index);
        let mut epoch_runs = BTreeMap::new();
        let mut run_epoch = None;
        for entry in scanned.entries.iter().map(R::version) {
            if run_epoch != Some(entry.epoch) {
                epoch_runs.insert(entry.index, entry.epoch);
                run_epoch = Some(entry.epoch);
            }
        }
        let (last_index, last_epoch) = match scanned.entries.last().map(R::version) {
            Some(last) => (last.index, last.epoch),
            None => (floor, meta.map_or(Epoch::default(), |meta| meta.last_epoch)),
        };
        assert!(last_index >= floor, "a kept log reaches the snapshot");
        let segments = scanned.segments.into_iter().map(|s| (s.first, s)).collect();
        self.log = Some(LogState {
            segments,
            epoch_runs,
            last_index,
            last_epoch,
            synced_index: last_index,
            snapshot: meta,
            dirty: BTreeSet::new(),
            dir_dirty: false,
            unsealed: true,
        });
        let mut entries = scanned.entries;
        let skip = entries.iter().take_while(|entry| entry.version().index <= floor).count();
        entries.drain(..skip);
        entries
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_types::{Entry, EntryPayload};

    fn log(first: u64, last: u64, epoch: u64) -> Vec<Entry> {
        (first..=last)
            .map(|i| Entry { epoch: Epoch(epoch), index: LogIndex(i), payload: EntryPayload::Noop })
            .collect()
    }

    fn meta(index: u64, epoch: u64) -> Option<SnapshotMeta> {
        Some(SnapshotMeta { last_index: LogIndex(index), last_epoch: Epoch(epoch) })
    }

    #[test]
    fn join_keeps_a_log_that_matches_or_starts_right_after_the_snapshot() {
        assert_eq!(join(&log(1, 5, 1), None), Ok(Join::Keep));
        assert_eq!(join(&log(1, 5, 1), meta(3, 1)), Ok(Join::Keep));
        assert_eq!(join(&log(4, 5, 1), meta(3, 1)), Ok(Join::Keep));
        assert_eq!(join::<Entry>(&[], meta(3, 1)), Ok(Join::Keep));
    }

    #[test]
    fn join_discards_a_stale_or_conflicting_log_and_refuses_a_gap() {
        assert_eq!(join(&log(1, 2, 1), meta(3, 1)), Ok(Join::Discard));
        assert_eq!(join(&log(1, 5, 1), meta(3, 2)), Ok(Join::Discard));
        assert!(join(&log(5, 6, 1), meta(3, 1)).is_err());
        assert!(join(&log(2, 6, 1), None).is_err());
    }
}
