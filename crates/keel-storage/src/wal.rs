//! The segmented write-ahead log over any [`Disk`]: appends, syncs, truncation,
//! snapshots, compaction. Recovery lives in `recovery.rs`.
//!
//! In memory the log keeps no entries, only where each record ends (to cut a suffix) and
//! where each epoch starts (to check a snapshot against the log). State machine of one
//! instance: `new` → `recover` → operations; any I/O failure → poisoned (terminal).

use crate::config::StorageConfig;
use crate::disk::{Disk, FileDisk};
use crate::error::{StorageError, StorageResult};
use crate::format::{
    encode_hard_state_file, encode_record, encode_seal, segment_header, segment_name,
    snapshot_file_frame, snapshot_name, HARD_STATE_NAME, RECORD_HEADER_BYTES, SEAL_BYTES,
    SEGMENT_HEADER_BYTES, TEMP_SUFFIX,
};
use crate::storage::{Recovered, Storage};
use keel_types::{Entry, Epoch, HardState, LogIndex, LogRecord, SnapshotMeta, Version};
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::marker::PhantomData;
use std::path::Path;

/// The write-ahead log over the host file system, of records `R` (the engine's).
pub type FileStorage<R = Entry> = Wal<FileDisk, R>;

/// One segment file: its first index, the byte offset just past each of its records, and
/// its length (records and the seals between them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Segment {
    pub(crate) first: LogIndex,
    pub(crate) record_ends: Vec<u64>,
    pub(crate) len: u64,
    /// The file name, formatted once: every append names the file it writes to.
    name: String,
}

impl Segment {
    /// A segment whose first entry is `first`, with its records ending at `record_ends`,
    /// `len` bytes long.
    pub(crate) fn new(first: LogIndex, record_ends: Vec<u64>, len: u64) -> Segment {
        assert!(record_ends.last().is_none_or(|end| *end <= len));
        Segment { first, record_ends, len, name: segment_name(first) }
    }

    pub(crate) fn name(&self) -> String {
        debug_assert_eq!(self.name, segment_name(self.first));
        self.name.clone()
    }

    /// The segment's size in bytes (its header, if it holds no record yet).
    fn bytes(&self) -> u64 {
        self.len
    }

    /// The index of its last entry (`first - 1` when empty).
    fn last(&self) -> LogIndex {
        LogIndex(self.first.0 + self.record_ends.len() as u64).prev()
    }
}

/// What the log knows about itself after recovery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LogState {
    /// Segments by first index; contiguous; only the last may be empty.
    pub(crate) segments: BTreeMap<LogIndex, Segment>,
    /// First index of each run of entries of one epoch, over the segments' entries.
    pub(crate) epoch_runs: BTreeMap<LogIndex, Epoch>,
    pub(crate) last_index: LogIndex,
    pub(crate) last_epoch: Epoch,
    pub(crate) synced_index: LogIndex,
    pub(crate) snapshot: Option<SnapshotMeta>,
    /// Segments with appends not yet fsynced.
    pub(crate) dirty: BTreeSet<LogIndex>,
    /// Whether segment files were created since the last directory fsync.
    pub(crate) dir_dirty: bool,
    /// Whether the last record may lack a seal after it (`sync` writes one).
    pub(crate) unsealed: bool,
}

impl LogState {
    fn snapshot_index(&self) -> LogIndex {
        self.snapshot.map_or(LogIndex::ZERO, |meta| meta.last_index)
    }

    /// The epoch of the entry at `index`, if the log or the snapshot knows it.
    fn epoch_at(&self, index: LogIndex) -> Option<Epoch> {
        if index == LogIndex::ZERO {
            return Some(Epoch::default());
        }
        if let Some(meta) = self.snapshot.filter(|meta| meta.last_index == index) {
            return Some(meta.last_epoch);
        }
        let first = *self.segments.first_key_value()?.0;
        if index < first || index > self.last_index {
            return None;
        }
        self.epoch_runs.range(..=index).next_back().map(|(_, epoch)| *epoch)
    }
}

/// A segmented write-ahead log of records `R` with a hard-state file and snapshot files,
/// over a [`Disk`]. Implements [`Storage`]; see there for the contract and failure
/// behaviour.
#[derive(Clone, Debug)]
pub struct Wal<D: Disk, R = Entry> {
    disk: D,
    config: StorageConfig,
    /// `None` until `recover` ran.
    pub(crate) log: Option<LogState>,
    /// The first failure; once set, every call fails.
    poison: Option<String>,
    record: PhantomData<fn() -> R>,
}

impl<R: LogRecord> Wal<FileDisk, R> {
    /// Opens (creating if needed) the storage directory `dir`. Call
    /// [`Storage::recover`] before anything else.
    pub fn open(dir: impl AsRef<Path>, config: StorageConfig) -> StorageResult<FileStorage<R>> {
        let name = dir.as_ref().display().to_string();
        let disk =
            FileDisk::open(dir).map_err(|source| StorageError::Io { op: "open", name, source })?;
        Ok(Wal::new(disk, config))
    }
}

impl<D: Disk, R: LogRecord> Wal<D, R> {
    /// A log over `disk`; call [`Storage::recover`] before anything else.
    pub fn new(disk: D, config: StorageConfig) -> Wal<D, R> {
        config.assert_valid();
        Wal { disk, config, log: None, poison: None, record: PhantomData }
    }

    /// The limits this log enforces.
    pub fn config(&self) -> &StorageConfig {
        &self.config
    }

    /// Whether an earlier failure poisoned the storage.
    pub fn is_poisoned(&self) -> bool {
        self.poison.is_some()
    }

    /// The saved snapshot's metadata, if any. Panics before `recover`.
    pub fn snapshot_meta(&self) -> Option<SnapshotMeta> {
        self.log().snapshot
    }

    /// How many segment files the log has now. Panics before `recover`.
    pub fn segment_count(&self) -> usize {
        self.log().segments.len()
    }

    pub(crate) fn disk_mut_unchecked(&mut self) -> &mut D {
        &mut self.disk
    }

    pub(crate) fn config_ref(&self) -> &StorageConfig {
        &self.config
    }

    /// Drops all in-memory state, as a restart does; `recover` must run next.
    pub(crate) fn forget(&mut self) {
        self.log = None;
        self.poison = None;
    }

    /// Refuses a snapshot larger than the limit (poisoning the storage) and panics on one
    /// older than the saved one.
    fn check_snapshot(&mut self, meta: SnapshotMeta, len: u64) -> StorageResult<()> {
        let max = self.config.snapshot_bytes_max;
        if len > max {
            return self.fail(StorageError::TooLarge { what: "snapshot", len, max });
        }
        let previous = self.log().snapshot;
        assert!(previous.is_none_or(|p| p.last_index <= meta.last_index), "snapshot goes back");
        Ok(())
    }

    /// Where the record of `index` sits: segment name and byte offset.
    /// (Tests and the simulator's bit rot: it reads the segment, stepping over seals.)
    pub(crate) fn record_offset(&mut self, index: LogIndex) -> Option<(String, u64)> {
        let (first, segment) = self.log.as_ref()?.segments.range(..=index).next_back()?;
        let (first, name) = (*first, segment.name());
        if index > segment.last() {
            return None;
        }
        let bytes = self.disk.read(&name).ok()?;
        crate::format::record_start(&bytes, first, index).map(|start| (name, start))
    }

    pub(crate) fn log(&self) -> &LogState {
        self.log.as_ref().expect("storage used before recover")
    }

    fn log_mut(&mut self) -> &mut LogState {
        self.log.as_mut().expect("storage used before recover")
    }

    /// Fails if poisoned; panics if `recover` has not run.
    fn ready(&self) -> StorageResult<()> {
        if let Some(cause) = &self.poison {
            return Err(StorageError::Poisoned { cause: cause.clone() });
        }
        assert!(self.log.is_some(), "storage used before recover");
        Ok(())
    }

    /// Runs one disk operation; a failure poisons the storage.
    pub(crate) fn io<T>(
        &mut self,
        op: &'static str,
        name: &str,
        run: impl FnOnce(&mut D) -> io::Result<T>,
    ) -> StorageResult<T> {
        if let Some(cause) = &self.poison {
            return Err(StorageError::Poisoned { cause: cause.clone() });
        }
        run(&mut self.disk).map_err(|source| {
            self.poison = Some(format!("{op} {name}: {source}"));
            StorageError::Io { op, name: name.to_string(), source }
        })
    }

    /// Poisons the storage with `error`.
    pub(crate) fn fail<T>(&mut self, error: StorageError) -> StorageResult<T> {
        self.poison = Some(error.to_string());
        Err(error)
    }

    /// Replaces `name` atomically: temporary file, fsync, rename, directory fsync.
    /// Writes `parts` in turn to a temporary file, syncs it and renames it to `name`.
    fn write_atomic(&mut self, name: &str, parts: &[&[u8]]) -> StorageResult<()> {
        let temp = format!("{name}{TEMP_SUFFIX}");
        self.io("write", &temp, |d| write_synced(d, &temp, parts))?;
        self.io("rename", &temp, |d| d.rename(&temp, name))?;
        self.sync_dir()
    }

    fn sync_dir(&mut self) -> StorageResult<()> {
        self.io("fsync", "directory", |d| d.sync_dir())?;
        self.log_mut().dir_dirty = false;
        Ok(())
    }

    fn create_segment(&mut self, first: LogIndex) -> StorageResult<()> {
        let name = segment_name(first);
        self.io("create", &name, |d| d.create(&name))?;
        self.io("write", &name, |d| d.append(&name, &segment_header(first)))?;
        let log = self.log_mut();
        assert!(log.segments.last_key_value().is_none_or(|(last, _)| *last < first));
        log.segments.insert(first, Segment::new(first, Vec::new(), SEGMENT_HEADER_BYTES));
        log.dirty.insert(first);
        log.dir_dirty = true;
        Ok(())
    }

    /// Removes segment files; the caller fsyncs the directory.
    fn remove_segments(&mut self, firsts: &[LogIndex]) -> StorageResult<()> {
        for first in firsts {
            let name = segment_name(*first);
            self.io("remove", &name, |d| d.remove(&name))?;
            let log = self.log_mut();
            assert!(log.segments.remove(first).is_some(), "removing an unknown segment");
            log.dirty.remove(first);
        }
        Ok(())
    }

    fn append_record(&mut self, entry: &R, record: &[u8]) -> StorageResult<()> {
        let entry = entry.version();
        let log = self.log();
        assert_eq!(entry.index, log.last_index.next(), "appends must continue the log");
        assert!(entry.epoch >= log.last_epoch, "epochs never decrease along the log");
        let roll = match log.segments.last_key_value() {
            None => true,
            Some((_, segment)) => {
                !segment.record_ends.is_empty()
                    && segment.bytes() + record.len() as u64 > self.config.segment_bytes_max
            }
        };
        if roll {
            // The full segment's last record gets its seal in its own file.
            self.seal()?;
            self.create_segment(entry.index)?;
        }
        let (first, name) = {
            let (first, segment) = self.log().segments.last_key_value().expect("a segment");
            (*first, segment.name())
        };
        self.io("write", &name, |d| d.append(&name, record))?;
        let log = self.log_mut();
        let segment = log.segments.get_mut(&first).expect("the active segment");
        let end = segment.bytes() + record.len() as u64;
        segment.record_ends.push(end);
        segment.len = end;
        log.unsealed = true;
        if log.epoch_runs.last_key_value().map(|(_, epoch)| *epoch) != Some(entry.epoch) {
            log.epoch_runs.insert(entry.index, entry.epoch);
        }
        log.last_index = entry.index;
        log.last_epoch = entry.epoch;
        log.dirty.insert(first);
        Ok(())
    }

    /// Writes a seal after the last record if it has none yet (`docs/format.md`): it goes
    /// to disk with the records in the same fsync, and lets recovery tell a damaged
    /// record from a torn one.
    fn seal(&mut self) -> StorageResult<()> {
        let log = self.log();
        let Some((first, segment)) = log.segments.last_key_value() else { return Ok(()) };
        if !log.unsealed || segment.record_ends.is_empty() {
            return Ok(());
        }
        let (first, name) = (*first, segment.name());
        let seal = encode_seal(Version { epoch: log.last_epoch, index: log.last_index });
        self.io("write", &name, |d| d.append(&name, &seal))?;
        let log = self.log_mut();
        log.segments.get_mut(&first).expect("the active segment").len += SEAL_BYTES;
        log.dirty.insert(first);
        log.unsealed = false;
        Ok(())
    }

    /// Discards every segment (a snapshot replaced the log); the caller fsyncs the
    /// directory.
    fn discard_log(&mut self, meta: SnapshotMeta) -> StorageResult<()> {
        let firsts: Vec<LogIndex> = self.log().segments.keys().copied().collect();
        self.remove_segments(&firsts)?;
        let log = self.log_mut();
        assert!(log.segments.is_empty() && log.dirty.is_empty());
        log.epoch_runs.clear();
        log.last_index = meta.last_index;
        log.last_epoch = meta.last_epoch;
        log.synced_index = meta.last_index;
        Ok(())
    }
}

/// Writes `parts` in turn to a new file `name` and syncs it.
pub(crate) fn write_synced(disk: &mut impl Disk, name: &str, parts: &[&[u8]]) -> io::Result<()> {
    disk.create(name)?;
    for bytes in parts {
        disk.append(name, bytes)?;
    }
    disk.sync(name)
}

/// The first half of saving a snapshot in two steps: writes the snapshot file for `meta`
/// under its temporary name and syncs it. Run it on a [`crate::FileDisk`] of its own over
/// the storage's directory, on any thread, while the log goes on being written; then
/// [`Storage::adopt_snapshot`] puts the file in place. A crash in between leaves a
/// temporary file, which recovery removes. Header, data and trailer go out in turn: the
/// data is not copied into a file image. The data is synced every
/// [`SNAPSHOT_SYNC_BYTES`] as it is written, so that the disk never holds a large state's
/// worth of dirty pages at once: on a file system that orders data before its journal
/// commits (ext4), a log fsync would otherwise wait for all of them.
pub fn prepare_snapshot(disk: &mut impl Disk, meta: SnapshotMeta, data: &[u8]) -> io::Result<()> {
    let (header, trailer) = snapshot_file_frame(&meta, data);
    let temp = format!("{}{TEMP_SUFFIX}", snapshot_name(meta.last_index));
    disk.create(&temp)?;
    disk.append(&temp, &header)?;
    for part in data.chunks(SNAPSHOT_SYNC_BYTES) {
        disk.append(&temp, part)?;
        disk.sync(&temp)?;
    }
    disk.append(&temp, &trailer)?;
    disk.sync(&temp)
}

/// How many snapshot bytes [`prepare_snapshot`] writes between two syncs.
pub const SNAPSHOT_SYNC_BYTES: usize = 8 << 20;

impl<D: Disk, R: LogRecord> Storage for Wal<D, R> {
    type Record = R;

    fn recover(&mut self) -> StorageResult<Recovered<R>> {
        self.recover_from_disk()
    }

    fn append(&mut self, entries: &[R]) -> StorageResult<()> {
        self.ready()?;
        let record_bytes_max = u64::from(self.config.record_bytes_max);
        let mut record = Vec::new();
        for entry in entries {
            record.clear();
            let record_bytes = encode_record(entry, &mut record);
            let payload_bytes = record_bytes - RECORD_HEADER_BYTES;
            if payload_bytes > record_bytes_max {
                let what = "log record";
                return self.fail(StorageError::TooLarge {
                    what,
                    len: payload_bytes,
                    max: record_bytes_max,
                });
            }
            self.append_record(entry, &record)?;
        }
        assert!(entries.last().is_none_or(|e| e.version().index == self.log().last_index));
        Ok(())
    }

    fn truncate_after(&mut self, index: LogIndex) -> StorageResult<()> {
        self.ready()?;
        let log = self.log();
        assert!(index >= log.snapshot_index(), "cannot truncate into the snapshot");
        if index >= log.last_index {
            return Ok(());
        }
        let doomed: Vec<LogIndex> = log.segments.range(index.next()..).map(|(f, _)| *f).collect();
        let cut = log.segments.range(..=index).next_back().filter(|(_, s)| s.last() > index);
        let cut = cut.map(|(first, segment)| {
            let keep = (index.0 - first.0 + 1) as usize;
            (*first, keep, segment.record_ends[keep - 1])
        });
        self.remove_segments(&doomed)?;
        if let Some((first, keep, len)) = cut {
            let name = segment_name(first);
            self.io("truncate", &name, |d| d.truncate(&name, len))?;
            // The cut took the seal after the kept record with it: seal it again, in the
            // same fsync, so that damage to it later is told from a torn write.
            let epoch = self.log().epoch_at(index).expect("the epoch of a kept entry is known");
            let seal = encode_seal(Version { epoch, index });
            self.io("write", &name, |d| d.append(&name, &seal))?;
            self.io("fsync", &name, |d| d.sync(&name))?;
            let log = self.log_mut();
            let segment = log.segments.get_mut(&first).expect("cut segment");
            segment.record_ends.truncate(keep);
            segment.len = len + SEAL_BYTES;
            log.dirty.remove(&first);
        }
        if !doomed.is_empty() {
            self.sync_dir()?;
        }
        let log = self.log_mut();
        log.epoch_runs.split_off(&index.next());
        log.last_index = index;
        log.synced_index = log.synced_index.min(index);
        log.last_epoch = log.epoch_at(index).expect("the epoch of a kept entry is known");
        assert!(log.segments.values().next_back().is_none_or(|s| s.last() == index));
        Ok(())
    }

    fn sync(&mut self) -> StorageResult<LogIndex> {
        self.ready()?;
        self.seal()?;
        let dirty = std::mem::take(&mut self.log_mut().dirty);
        for first in dirty {
            let name = segment_name(first);
            self.io("fsync", &name, |d| d.sync(&name))?;
        }
        if self.log().dir_dirty {
            self.sync_dir()?;
        }
        let log = self.log_mut();
        assert!(log.dirty.is_empty() && !log.dir_dirty);
        log.synced_index = log.last_index;
        Ok(log.synced_index)
    }

    fn save_hard_state(&mut self, hard_state: &HardState) -> StorageResult<()> {
        self.ready()?;
        self.write_atomic(HARD_STATE_NAME, &[&encode_hard_state_file(hard_state)])
    }

    fn save_snapshot(&mut self, meta: SnapshotMeta, data: &[u8]) -> StorageResult<()> {
        self.ready()?;
        self.check_snapshot(meta, data.len() as u64)?;
        let temp = format!("{}{TEMP_SUFFIX}", snapshot_name(meta.last_index));
        self.io("write", &temp, |d| prepare_snapshot(d, meta, data))?;
        let adopted = self.adopt_snapshot(meta, data.len() as u64)?;
        assert!(adopted, "checked not to go back");
        Ok(())
    }

    fn adopt_snapshot(&mut self, meta: SnapshotMeta, len: u64) -> StorageResult<bool> {
        self.ready()?;
        let previous = self.log().snapshot;
        let name = snapshot_name(meta.last_index);
        let temp = format!("{name}{TEMP_SUFFIX}");
        if previous.is_some_and(|p| p.last_index > meta.last_index) {
            self.io("remove", &temp, |d| d.remove(&temp))?;
            return Ok(false);
        }
        self.check_snapshot(meta, len)?;
        self.io("rename", &temp, |d| d.rename(&temp, &name))?;
        self.sync_dir()?;
        let mut removed = false;
        if let Some(previous) = previous.filter(|p| p.last_index != meta.last_index) {
            let name = snapshot_name(previous.last_index);
            self.io("remove", &name, |d| d.remove(&name))?;
            removed = true;
        }
        let log = self.log();
        let joins = log.last_index >= meta.last_index
            && log.epoch_at(meta.last_index) == Some(meta.last_epoch);
        if !joins {
            removed |= !log.segments.is_empty();
            self.discard_log(meta)?;
        }
        let log = self.log_mut();
        log.snapshot = Some(meta);
        log.synced_index = log.synced_index.max(meta.last_index);
        if removed {
            self.sync_dir()?;
        }
        Ok(true)
    }

    fn compact_through(&mut self, index: LogIndex) -> StorageResult<()> {
        self.ready()?;
        let log = self.log();
        assert!(index <= log.snapshot_index(), "compaction may not pass the snapshot");
        let active = log.segments.last_key_value().map(|(first, _)| *first);
        let doomed: Vec<LogIndex> = log
            .segments
            .values()
            .take_while(|s| Some(s.first) != active && s.last() <= index)
            .map(|s| s.first)
            .collect();
        if doomed.is_empty() {
            return Ok(());
        }
        self.remove_segments(&doomed)?;
        self.sync_dir()?;
        let log = self.log_mut();
        let first = *log.segments.first_key_value().expect("the active segment stays").0;
        let run_start = *log.epoch_runs.range(..=first).next_back().expect("a run covers").0;
        log.epoch_runs = log.epoch_runs.split_off(&run_start);
        assert!(log.epoch_runs.keys().next() <= Some(&first));
        Ok(())
    }

    fn last_index(&self) -> LogIndex {
        self.log().last_index
    }

    fn synced_index(&self) -> LogIndex {
        self.log().synced_index
    }
}

#[cfg(test)]
#[path = "wal_tests.rs"]
mod tests;
