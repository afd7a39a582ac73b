//! The small set of directory and file operations the log needs, and their real
//! implementation over one directory of the host file system.
//!
//! The write-ahead log ([`crate::Wal`]) does all its I/O through [`Disk`], by file name
//! within one directory. [`FileDisk`] maps the calls onto `std::fs`; the simulator's
//! [`crate::SimDisk`] keeps byte images in memory and models what survives a crash. One
//! log implementation over two disks is what makes the simulated storage recover exactly
//! as the file storage does.
//!
//! Reserved space (off unless [`FileDisk::reserving`]; `[storage] reserve_log_space`): a
//! log segment is extended with zeros, [`RESERVE_BYTES`] at a time, ahead of the appends
//! that will overwrite them. An fsync after an append that grew a file must also commit
//! the file's new size and blocks (a file-system journal commit); one after an append
//! into space already written commits the data alone, which on ext4 took 30-45% less
//! time with three logs syncing side by side (`docs/performance.md`, *Reserved log
//! space*). A segment then reads back with zeros after its last append; recovery takes a
//! remainder of zeros for the segment's clean end (`docs/format.md`, "Recovery"), with or
//! without reserving. Why it is off by default: `docs/format.md`, "Seals and damage".

use crate::format::parse_segment_name;
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Seek, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// Most files [`FileDisk`] keeps open for writing at once (the active segment, the one
/// before it until the next fsync, and a temporary file).
pub const WRITERS_OPEN_MAX: usize = 4;
/// Buffer size of each open writer: appends reach the kernel in chunks of this size or
/// at the next fsync, whichever is first.
pub const WRITER_BUFFER_BYTES: usize = 256 * 1024;

/// When reserving, a log segment grows by this many bytes of zeros at a time, written
/// ahead of the appends that will overwrite them (see the module documentation).
pub const RESERVE_BYTES: u64 = 1 << 20;

/// The zeros reserved space is written from.
static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];

/// Buffer size of each open writer while [`hold_unsynced_appends`] is on: appends stay in
/// the process until their file is synced (up to this much).
pub const HELD_BUFFER_BYTES: usize = 64 << 20;

/// Test-only (`[testing] power_loss_on_kill`): whether appends stay in the process until
/// their file is synced, so that killing the process loses them as a power loss would.
static HOLD_UNSYNCED: AtomicBool = AtomicBool::new(false);
/// Test-only (`[testing] eio_on_sigusr1`): whether the next fsync fails with `EIO`.
static FAIL_NEXT_SYNC: AtomicBool = AtomicBool::new(false);

/// Test-only, for fault harnesses: from now on, appends stay in the process until their
/// file is synced (or closed, read, cut or renamed), not only until the writer's buffer
/// fills, so that `SIGKILL` loses every unsynced append as a power loss would. Affects
/// writers opened after the call: call it before opening any storage.
pub fn hold_unsynced_appends() {
    HOLD_UNSYNCED.store(true, Ordering::Relaxed);
}

/// Test-only, for fault harnesses: the next [`Disk::sync`] of any [`FileDisk`] in this
/// process fails with `EIO` (the node must then stop, losing nothing it acknowledged).
pub fn fail_next_sync() {
    FAIL_NEXT_SYNC.store(true, Ordering::Relaxed);
}

/// File operations within one directory, by name. Names are plain file names (no path
/// separators). Durability follows POSIX: data is durable after [`Disk::sync`] of the
/// file; a creation, rename or removal is durable after [`Disk::sync_dir`].
pub trait Disk {
    /// The names of the files in the directory, sorted.
    fn list(&mut self) -> io::Result<Vec<String>>;
    /// The whole content of a file, including writes not yet synced; a log segment may
    /// end in zeros past its last append (space reserved ahead of appends).
    fn read(&mut self, name: &str) -> io::Result<Vec<u8>>;
    /// Creates an empty file, truncating any file of that name.
    fn create(&mut self, name: &str) -> io::Result<()>;
    /// Appends bytes after the last append to an existing file (or at its end when it was
    /// opened, cut or created since); may stay buffered until `sync`.
    fn append(&mut self, name: &str, bytes: &[u8]) -> io::Result<()>;
    /// Makes every byte written to the file durable (flush, then fsync).
    fn sync(&mut self, name: &str) -> io::Result<()>;
    /// Cuts the file to `len` bytes (pending appends are written first); the next append
    /// goes at `len`.
    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()>;
    /// Renames a file, replacing any file named `to`.
    fn rename(&mut self, from: &str, to: &str) -> io::Result<()>;
    /// Removes a file.
    fn remove(&mut self, name: &str) -> io::Result<()>;
    /// Makes creations, renames and removals in the directory durable.
    fn sync_dir(&mut self) -> io::Result<()>;
}

/// [`Disk`] over a directory of the host file system.
#[derive(Debug)]
pub struct FileDisk {
    dir: PathBuf,
    /// Open buffered writers by file name; at most [`WRITERS_OPEN_MAX`].
    writers: BTreeMap<String, Writer>,
    /// Where the next append goes in each file this disk reserved space in (its writer
    /// open or not): the file is longer, its remainder zeros. A file not named here is
    /// appended to at its end.
    ends: BTreeMap<String, u64>,
    /// Bytes a log segment grows by at a time, in zeros ahead of its appends (0: none).
    reserve: u64,
}

/// One open file: its buffered writer, positioned at the file's end of appends.
#[derive(Debug)]
struct Writer {
    out: BufWriter<File>,
    /// Where the next append goes (bytes still in `out` included).
    end: u64,
    /// The file's length: `end`, or past it with reserved zeros.
    len: u64,
    /// Bytes the file grows by at a time, in zeros ahead of its appends (0: as they come).
    reserve: u64,
}

impl FileDisk {
    /// Opens `dir`, creating it (and its parents) if missing.
    pub fn open(dir: impl AsRef<Path>) -> io::Result<FileDisk> {
        let dir = dir.as_ref().to_path_buf();
        fs::create_dir_all(&dir)?;
        Ok(FileDisk { dir, writers: BTreeMap::new(), ends: BTreeMap::new(), reserve: 0 })
    }

    /// From now on, log segments grow by `bytes` of zeros at a time ahead of their
    /// appends (0: not at all; see the module documentation).
    pub fn reserving(mut self, bytes: u64) -> FileDisk {
        self.reserve = bytes;
        self
    }

    /// The directory this disk works in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, name: &str) -> PathBuf {
        assert!(!name.is_empty() && !name.contains(['/', '\\']), "bad file name {name:?}");
        self.dir.join(name)
    }

    /// Flushes and closes the writer of `name`, if open (where its appends end is kept).
    fn close(&mut self, name: &str) -> io::Result<()> {
        if let Some(mut writer) = self.writers.remove(name) {
            writer.out.flush()?;
            if writer.len > writer.end {
                self.ends.insert(name.to_string(), writer.end);
            }
        }
        Ok(())
    }

    fn writer(&mut self, name: &str) -> io::Result<&mut Writer> {
        if !self.writers.contains_key(name) {
            if self.writers.len() >= WRITERS_OPEN_MAX {
                let names: Vec<String> = self.writers.keys().cloned().collect();
                for other in names {
                    self.close(&other)?;
                }
            }
            let mut file = OpenOptions::new().write(true).open(self.path(name))?;
            let len = file.metadata()?.len();
            let end = self.ends.remove(name).unwrap_or(len).min(len);
            file.seek(io::SeekFrom::Start(end))?;
            let capacity = if HOLD_UNSYNCED.load(Ordering::Relaxed) {
                HELD_BUFFER_BYTES
            } else {
                WRITER_BUFFER_BYTES
            };
            let out = BufWriter::with_capacity(capacity, file);
            let reserve = if parse_segment_name(name).is_some() { self.reserve } else { 0 };
            self.writers.insert(name.to_string(), Writer { out, end, len, reserve });
        }
        assert!(self.writers.len() <= WRITERS_OPEN_MAX);
        Ok(self.writers.get_mut(name).expect("inserted above"))
    }
}

impl Writer {
    /// Appends `bytes` at the end of appends, first extending a reserving file with zeros
    /// past them when they would reach beyond its length.
    fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        let end = self.end + bytes.len() as u64;
        if self.reserve > 0 && end > self.len {
            // Zeros from the end of these bytes to the next multiple of `reserve` (the
            // bytes themselves fill the part before, through the buffer).
            let target = end.div_ceil(self.reserve) * self.reserve;
            let file = self.out.get_ref();
            let mut at = end;
            while at < target {
                let n = (target - at).min(ZEROS.len() as u64);
                file.write_all_at(&ZEROS[..n as usize], at)?;
                at += n;
            }
            self.len = target;
        }
        self.out.write_all(bytes)?;
        self.end = end;
        self.len = self.len.max(end);
        Ok(())
    }
}

impl Disk for FileDisk {
    fn list(&mut self) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for dir_entry in fs::read_dir(&self.dir)? {
            let dir_entry = dir_entry?;
            if !dir_entry.file_type()?.is_file() {
                continue;
            }
            if let Ok(name) = dir_entry.file_name().into_string() {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }

    fn read(&mut self, name: &str) -> io::Result<Vec<u8>> {
        self.close(name)?;
        fs::read(self.path(name))
    }

    fn create(&mut self, name: &str) -> io::Result<()> {
        self.close(name)?;
        self.ends.remove(name);
        File::create(self.path(name))?;
        Ok(())
    }

    fn append(&mut self, name: &str, bytes: &[u8]) -> io::Result<()> {
        self.writer(name)?.append(bytes)
    }

    fn sync(&mut self, name: &str) -> io::Result<()> {
        // A load first: the swap, a write, only when armed (every fsync passes here).
        if FAIL_NEXT_SYNC.load(Ordering::Relaxed) && FAIL_NEXT_SYNC.swap(false, Ordering::Relaxed) {
            return Err(io::Error::from_raw_os_error(5)); // EIO, injected
        }
        match self.writers.get_mut(name) {
            Some(writer) => {
                writer.out.flush()?;
                writer.out.get_ref().sync_data()
            }
            None => File::open(self.path(name))?.sync_data(),
        }
    }

    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()> {
        self.close(name)?;
        self.ends.remove(name); // no reserved space is left
        OpenOptions::new().write(true).open(self.path(name))?.set_len(len)
    }

    fn rename(&mut self, from: &str, to: &str) -> io::Result<()> {
        self.close(from)?;
        self.close(to)?;
        self.ends.remove(to);
        if let Some(end) = self.ends.remove(from) {
            self.ends.insert(to.to_string(), end);
        }
        fs::rename(self.path(from), self.path(to))
    }

    fn remove(&mut self, name: &str) -> io::Result<()> {
        if let Some(writer) = self.writers.remove(name) {
            // Discard the buffer: the file is going away.
            let _ = writer.out.into_parts();
        }
        self.ends.remove(name);
        fs::remove_file(self.path(name))
    }

    fn sync_dir(&mut self) -> io::Result<()> {
        File::open(&self.dir)?.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_disk_buffers_truncates_renames_and_lists_files_only() {
        let dir = std::env::temp_dir().join(format!("keel-storage-disk-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let mut disk = FileDisk::open(&dir).unwrap();
        fs::create_dir(dir.join("not-a-file")).unwrap();
        let names: Vec<String> = (0..WRITERS_OPEN_MAX + 2).map(|n| format!("f{n}")).collect();
        for name in &names {
            disk.create(name).unwrap();
            disk.append(name, name.as_bytes()).unwrap();
            assert!(disk.writers.len() <= WRITERS_OPEN_MAX);
        }
        for name in &names {
            disk.append(name, b"+").unwrap();
            assert_eq!(disk.read(name).unwrap(), format!("{name}+").into_bytes());
        }
        let segment = crate::format::segment_name(keel_types::LogIndex(1));
        disk.create(&segment).unwrap();
        disk.append(&segment, b"s").unwrap();
        assert_eq!(disk.read(&segment).unwrap(), b"s", "not reserving: no zeros");
        disk.remove(&segment).unwrap();
        disk.sync("f0").unwrap();
        disk.truncate("f0", 1).unwrap();
        disk.append("f0", b"x").unwrap();
        disk.rename("f0", "g").unwrap();
        disk.remove("f1").unwrap();
        disk.sync_dir().unwrap();
        assert_eq!(disk.read("g").unwrap(), b"fx");
        let listed = disk.list().unwrap();
        assert_eq!(listed.first().map(String::as_str), Some("f2"));
        assert!(listed.contains(&"g".to_string()) && !listed.contains(&"f1".to_string()));
        assert!(!listed.contains(&"not-a-file".to_string()));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_segment_grows_by_reserved_zeros_that_its_appends_overwrite() {
        let dir = std::env::temp_dir().join(format!("keel-storage-reserve-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let mut disk = FileDisk::open(&dir).unwrap().reserving(RESERVE_BYTES);
        let segment = crate::format::segment_name(keel_types::LogIndex(1));
        let len = |name: &str| fs::metadata(dir.join(name)).unwrap().len();
        disk.create(&segment).unwrap();
        disk.append(&segment, b"head").unwrap();
        disk.sync(&segment).unwrap();
        assert_eq!(len(&segment), RESERVE_BYTES, "reserved ahead of the appends");
        // Past the reserved space: the appends continue and the next space is reserved.
        let large = vec![b'x'; RESERVE_BYTES as usize];
        disk.append(&segment, &large).unwrap();
        disk.sync(&segment).unwrap();
        assert_eq!(len(&segment), 2 * RESERVE_BYTES);
        // A read closes the writer; the next append still follows the last one, not the
        // zeros, and so does one after the writer was closed to open others.
        let mut expected = [b"head".as_slice(), &large].concat();
        expected.resize(2 * RESERVE_BYTES as usize, 0);
        assert_eq!(disk.read(&segment).unwrap(), expected);
        disk.append(&segment, b"tail").unwrap();
        for other in 0..WRITERS_OPEN_MAX {
            disk.create(&format!("f{other}")).unwrap();
            disk.append(&format!("f{other}"), b"y").unwrap();
        }
        assert!(!disk.writers.contains_key(&segment), "closed to open the others");
        disk.append(&segment, b"!").unwrap();
        let written = [b"head".as_slice(), &large, b"tail!"].concat();
        let read = disk.read(&segment).unwrap();
        assert_eq!(read[..written.len()], written[..]);
        assert!(read[written.len()..].iter().all(|b| *b == 0));
        // A cut leaves no reserved space: the next append goes at the cut.
        disk.truncate(&segment, 4).unwrap();
        disk.append(&segment, b"+").unwrap();
        assert_eq!(disk.read(&segment).unwrap()[..6], *b"head+\0");
        // Other files are not reserved.
        assert_eq!(disk.read("f0").unwrap(), b"y");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    #[should_panic(expected = "bad file name")]
    fn paths_are_not_file_names() {
        let mut disk = FileDisk::open(std::env::temp_dir()).unwrap();
        let _ = disk.create("../escape");
    }
}
