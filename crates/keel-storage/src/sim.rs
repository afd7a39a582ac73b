//! The simulated disk: byte images in memory, with exact crash semantics.
//!
//! [`SimDisk`] keeps, for every file, the bytes the running process sees (`current`) and
//! the bytes that would survive a power loss (`durable`), and two directory maps (names
//! as seen now, names as they would survive). `sync` copies a file's current bytes to its
//! durable image; `sync_dir` copies the directory map. A crash throws away everything
//! else. [`SimStorage`] is the write-ahead log over this disk, so it recovers exactly as
//! the file storage does; its crash methods cover a power loss, a power loss that leaves
//! a torn tail, a process crash (the kernel keeps every write), and bit rot in a synced
//! record. Nothing here is random: every choice is an argument.

use crate::disk::Disk;
use crate::format::{RECORD_HEADER_BYTES, SEGMENT_HEADER_BYTES};
use crate::wal::Wal;
use std::collections::BTreeMap;
use std::io;

/// The write-ahead log over a simulated disk, for the deterministic simulator.
pub type SimStorage<R = keel_types::Entry> = Wal<SimDisk, R>;

/// Most files a simulated disk holds; a log that needs more has not been compacted.
pub const SIM_FILES_MAX: usize = 1 << 16;

/// An operation class a fault can be injected into.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SimFault {
    /// The next create, append, truncate, rename or removal fails.
    Write,
    /// The next file or directory fsync fails (and makes nothing durable).
    Sync,
}

/// One file's two images.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct SimFile {
    /// What survives a power loss.
    durable: Vec<u8>,
    /// What the process sees.
    current: Vec<u8>,
    /// `current[..dirty_from]` equals `durable[..dirty_from]`.
    dirty_from: usize,
}

impl SimFile {
    fn sync(&mut self) {
        let from = self.dirty_from.min(self.durable.len()).min(self.current.len());
        self.durable.truncate(from);
        self.durable.extend_from_slice(&self.current[from..]);
        self.dirty_from = self.current.len();
        debug_assert_eq!(self.durable, self.current);
    }

    fn revert(&mut self) {
        self.current.clone_from(&self.durable);
        self.dirty_from = self.current.len();
    }
}

/// A disk held in memory that loses what was not fsynced when it crashes.
#[derive(Clone, Debug, Default)]
pub struct SimDisk {
    /// Files by inode number.
    files: BTreeMap<u64, SimFile>,
    /// The directory as the process sees it.
    names_current: BTreeMap<String, u64>,
    /// The directory as it survives a power loss.
    names_durable: BTreeMap<String, u64>,
    next_inode: u64,
    /// A fault armed for the next operation of its class.
    fault: Option<SimFault>,
    /// Completed file and directory fsyncs (for the simulator's cost model and tests).
    sync_count: u64,
}

fn not_found(name: &str) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("no file {name}"))
}

impl SimDisk {
    /// An empty disk.
    pub fn new() -> SimDisk {
        SimDisk::default()
    }

    /// Makes the next operation of `kind` fail with an I/O error.
    pub fn fail_next(&mut self, kind: SimFault) {
        self.fault = Some(kind);
    }

    /// How many fsyncs (file and directory) have completed.
    pub fn sync_count(&self) -> u64 {
        self.sync_count
    }

    /// Whether any write is not yet durable (file bytes or directory changes).
    pub fn has_unsynced(&self) -> bool {
        self.names_current != self.names_durable
            || self.files.values().any(|file| file.current != file.durable)
    }

    /// A power loss: every write not fsynced is lost.
    pub fn crash(&mut self) {
        self.crash_torn(0);
    }

    /// A power loss that leaves, of each file's unsynced appended bytes, the first
    /// `keep_bytes_max` (a torn tail). Rewrites and truncations still revert wholly.
    pub fn crash_torn(&mut self, keep_bytes_max: u64) {
        for file in self.files.values_mut() {
            let durable_len = file.durable.len();
            if file.dirty_from >= durable_len && file.current.len() > durable_len {
                let keep = (file.current.len() - durable_len).min(keep_bytes_max as usize);
                let torn = &file.current[durable_len..durable_len + keep];
                file.durable.extend_from_slice(torn);
            }
            file.revert();
        }
        self.names_current.clone_from(&self.names_durable);
        self.fault = None;
        self.collect_garbage();
        assert!(!self.has_unsynced());
    }

    /// A process crash: the kernel keeps every write, so everything becomes durable.
    pub fn crash_process(&mut self) {
        for file in self.files.values_mut() {
            file.sync();
        }
        self.names_durable.clone_from(&self.names_current);
        self.fault = None;
        self.collect_garbage();
        assert!(!self.has_unsynced());
    }

    /// Flips one bit of byte `offset` of `name`, in both images (bit rot). Returns whether
    /// the file exists and is that long.
    pub fn corrupt(&mut self, name: &str, offset: u64) -> bool {
        let Some(inode) = self.names_current.get(name) else { return false };
        let file = self.files.get_mut(inode).expect("named files exist");
        let offset = offset as usize;
        let mut hit = false;
        for image in [&mut file.durable, &mut file.current] {
            if let Some(byte) = image.get_mut(offset) {
                *byte ^= 0x10;
                hit = true;
            }
        }
        hit
    }

    /// The bytes of `name` that would survive a power loss now (empty if none would).
    pub fn durable_bytes(&self, name: &str) -> Vec<u8> {
        match self.names_durable.get(name) {
            Some(inode) => self.files[inode].durable.clone(),
            None => Vec::new(),
        }
    }

    fn collect_garbage(&mut self) {
        let names_current = &self.names_current;
        let names_durable = &self.names_durable;
        self.files.retain(|inode, _| {
            names_current.values().any(|i| i == inode) || names_durable.values().any(|i| i == inode)
        });
    }

    fn fault(&mut self, kind: SimFault) -> io::Result<()> {
        if self.fault == Some(kind) {
            self.fault = None;
            return Err(io::Error::other(format!("injected {kind:?} fault")));
        }
        Ok(())
    }

    fn file_mut(&mut self, name: &str) -> io::Result<&mut SimFile> {
        let inode = self.names_current.get(name).ok_or_else(|| not_found(name))?;
        Ok(self.files.get_mut(inode).expect("named files exist"))
    }
}

impl Disk for SimDisk {
    fn list(&mut self) -> io::Result<Vec<String>> {
        Ok(self.names_current.keys().cloned().collect())
    }

    fn read(&mut self, name: &str) -> io::Result<Vec<u8>> {
        Ok(self.file_mut(name)?.current.clone())
    }

    fn create(&mut self, name: &str) -> io::Result<()> {
        self.fault(SimFault::Write)?;
        if let Ok(file) = self.file_mut(name) {
            file.current.clear();
            file.dirty_from = 0;
            return Ok(());
        }
        assert!(self.files.len() < SIM_FILES_MAX, "simulated disk holds too many files");
        let inode = self.next_inode;
        self.next_inode += 1;
        self.files.insert(inode, SimFile::default());
        self.names_current.insert(name.to_string(), inode);
        Ok(())
    }

    fn append(&mut self, name: &str, bytes: &[u8]) -> io::Result<()> {
        self.fault(SimFault::Write)?;
        self.file_mut(name)?.current.extend_from_slice(bytes);
        Ok(())
    }

    fn sync(&mut self, name: &str) -> io::Result<()> {
        self.fault(SimFault::Sync)?;
        self.file_mut(name)?.sync();
        self.sync_count += 1;
        Ok(())
    }

    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()> {
        self.fault(SimFault::Write)?;
        let file = self.file_mut(name)?;
        let len = (len as usize).min(file.current.len());
        file.current.truncate(len);
        file.dirty_from = file.dirty_from.min(len);
        Ok(())
    }

    fn rename(&mut self, from: &str, to: &str) -> io::Result<()> {
        self.fault(SimFault::Write)?;
        let inode = self.names_current.remove(from).ok_or_else(|| not_found(from))?;
        self.names_current.insert(to.to_string(), inode);
        Ok(())
    }

    fn remove(&mut self, name: &str) -> io::Result<()> {
        self.fault(SimFault::Write)?;
        self.names_current.remove(name).ok_or_else(|| not_found(name))?;
        Ok(())
    }

    fn sync_dir(&mut self) -> io::Result<()> {
        self.fault(SimFault::Sync)?;
        self.names_durable.clone_from(&self.names_current);
        self.collect_garbage();
        self.sync_count += 1;
        Ok(())
    }
}

impl<R: keel_types::LogRecord> Wal<SimDisk, R> {
    /// A fresh simulated storage with the given limits; call [`crate::Storage::recover`]
    /// before anything else.
    pub fn new_sim(config: crate::StorageConfig) -> SimStorage<R> {
        Wal::new(SimDisk::new(), config)
    }

    /// A power loss: loses every write not fsynced. Call `recover` afterwards.
    pub fn crash(&mut self) {
        self.disk_mut_unchecked().crash();
        self.forget();
    }

    /// A power loss leaving up to `keep_bytes_max` unsynced appended bytes of each file
    /// (a torn tail that recovery must cut off). Call `recover` afterwards.
    pub fn crash_torn(&mut self, keep_bytes_max: u64) {
        self.disk_mut_unchecked().crash_torn(keep_bytes_max);
        self.forget();
    }

    /// A process crash: every write reached the kernel and survives. Call `recover`.
    pub fn crash_process(&mut self) {
        self.disk_mut_unchecked().crash_process();
        self.forget();
    }

    /// Flips a bit inside the record of entry `index` (bit rot; the record's checksum no
    /// longer matches). Returns false if the log does not hold that entry.
    pub fn corrupt_entry(&mut self, index: keel_types::LogIndex) -> bool {
        self.corrupt_record_byte(index, RECORD_HEADER_BYTES + 1)
    }

    /// Flips a bit in byte `byte` of the record of entry `index` (0 to 3: its length
    /// field, 4 to 7: its checksum, 8 on: its payload). Returns false if the log does not
    /// hold that entry.
    pub fn corrupt_record_byte(&mut self, index: keel_types::LogIndex, byte: u64) -> bool {
        let Some((name, offset)) = self.record_offset(index) else { return false };
        assert!(offset >= SEGMENT_HEADER_BYTES);
        self.disk_mut_unchecked().corrupt(&name, offset + byte)
    }

    /// Flips a bit in the seal that follows the record of entry `index`, if one does (bit
    /// rot of a seal). Returns whether it found one.
    pub fn corrupt_seal_after(&mut self, index: keel_types::LogIndex, byte: u64) -> bool {
        let Some((name, start)) = self.record_offset(index) else { return false };
        let bytes = self.disk_mut_unchecked().durable_bytes(&name);
        let Some(len) = bytes.get(start as usize..start as usize + 4) else { return false };
        let len = u32::from_le_bytes(len.try_into().expect("4 bytes"));
        let seal = start + RECORD_HEADER_BYTES + u64::from(len);
        let marker = bytes.get(seal as usize..seal as usize + 4);
        if marker != Some(&crate::format::SEAL_LEN.to_le_bytes()[..]) {
            return false;
        }
        self.disk_mut_unchecked().corrupt(&name, seal + byte % crate::format::SEAL_BYTES)
    }

    /// Flips a bit in byte `byte` (modulo its length) of the newest snapshot file.
    /// Returns false if there is none.
    pub fn corrupt_snapshot(&mut self, byte: u64) -> bool {
        let Some(meta) = self.log.as_ref().and_then(|log| log.snapshot) else { return false };
        let name = crate::format::snapshot_name(meta.last_index);
        let len = self.disk_mut_unchecked().durable_bytes(&name).len() as u64;
        len > 0 && self.disk_mut_unchecked().corrupt(&name, byte % len)
    }

    /// Flips a bit in byte `byte` (modulo its length) of the hard-state file. Returns
    /// false if there is none.
    pub fn corrupt_hard_state(&mut self, byte: u64) -> bool {
        let name = crate::format::HARD_STATE_NAME;
        let len = self.disk_mut_unchecked().durable_bytes(name).len() as u64;
        len > 0 && self.disk_mut_unchecked().corrupt(name, byte % len)
    }

    /// Forgets a failed recovery (a storage error poisons it), to run it again after an
    /// operator's repair ([`Wal::rebuild_hard_state`]).
    pub fn reset(&mut self) {
        self.forget();
    }

    /// The simulated disk, to arm faults or inspect it.
    pub fn sim_disk(&mut self) -> &mut SimDisk {
        self.disk_mut_unchecked()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsynced_bytes_and_names_are_lost_in_a_crash() {
        let mut disk = SimDisk::new();
        disk.create("a").unwrap();
        disk.append("a", b"xy").unwrap();
        disk.sync("a").unwrap();
        disk.crash();
        assert!(disk.list().unwrap().is_empty(), "creation was not made durable");
        disk.create("a").unwrap();
        disk.append("a", b"xy").unwrap();
        disk.sync("a").unwrap();
        disk.sync_dir().unwrap();
        disk.append("a", b"z").unwrap();
        disk.crash();
        assert_eq!(disk.read("a").unwrap(), b"xy");
    }

    #[test]
    fn torn_crash_keeps_a_prefix_of_appends_only() {
        let mut disk = SimDisk::new();
        disk.create("a").unwrap();
        disk.sync_dir().unwrap();
        disk.append("a", b"abc").unwrap();
        disk.sync("a").unwrap();
        disk.append("a", b"defg").unwrap();
        disk.crash_torn(2);
        assert_eq!(disk.read("a").unwrap(), b"abcde");
        disk.truncate("a", 1).unwrap();
        disk.append("a", b"ZZZZ").unwrap();
        disk.crash_torn(2);
        assert_eq!(disk.read("a").unwrap(), b"abcde", "a rewrite reverts wholly");
    }

    #[test]
    fn renames_and_removals_need_a_directory_sync() {
        let mut disk = SimDisk::new();
        disk.create("t").unwrap();
        disk.append("t", b"1").unwrap();
        disk.sync("t").unwrap();
        disk.rename("t", "f").unwrap();
        disk.crash();
        assert!(disk.list().unwrap().is_empty());
        disk.create("t").unwrap();
        disk.append("t", b"1").unwrap();
        disk.sync("t").unwrap();
        disk.rename("t", "f").unwrap();
        disk.sync_dir().unwrap();
        disk.remove("f").unwrap();
        disk.crash();
        assert_eq!(disk.list().unwrap(), vec!["f".to_string()]);
        assert_eq!(disk.read("f").unwrap(), b"1");
    }

    #[test]
    fn injected_faults_fail_once_and_make_nothing_durable() {
        let mut disk = SimDisk::new();
        disk.create("a").unwrap();
        disk.append("a", b"1").unwrap();
        disk.fail_next(SimFault::Sync);
        assert!(disk.sync("a").is_err());
        assert!(disk.has_unsynced());
        disk.fail_next(SimFault::Write);
        assert!(disk.append("a", b"2").is_err());
        disk.append("a", b"3").unwrap();
        assert_eq!(disk.read("a").unwrap(), b"13");
    }

    #[test]
    fn process_crash_keeps_everything() {
        let mut disk = SimDisk::new();
        disk.create("a").unwrap();
        disk.append("a", b"12").unwrap();
        disk.crash_process();
        assert_eq!(disk.read("a").unwrap(), b"12");
        assert!(disk.corrupt("a", 1));
        assert!(!disk.corrupt("a", 2));
        assert_eq!(disk.durable_bytes("a"), b"1\x22".to_vec());
    }
}
