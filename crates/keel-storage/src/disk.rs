//! The small set of directory and file operations the log needs, and their real
//! implementation over one directory of the host file system.
//!
//! The write-ahead log ([`crate::Wal`]) does all its I/O through [`Disk`], by file name
//! within one directory. [`FileDisk`] maps the calls onto `std::fs`; the simulator's
//! [`crate::SimDisk`] keeps byte images in memory and models what survives a crash. One
//! log implementation over two disks is what makes the simulated storage recover exactly
//! as the file storage does.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// Most files [`FileDisk`] keeps open for writing at once (the active segment, the one
/// before it until the next fsync, and a temporary file).
pub const WRITERS_OPEN_MAX: usize = 4;
/// Buffer size of each open writer: appends reach the kernel in chunks of this size or
/// at the next fsync, whichever is first.
pub const WRITER_BUFFER_BYTES: usize = 256 * 1024;

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
    /// The whole content of a file, including writes not yet synced.
    fn read(&mut self, name: &str) -> io::Result<Vec<u8>>;
    /// Creates an empty file, truncating any file of that name.
    fn create(&mut self, name: &str) -> io::Result<()>;
    /// Appends bytes at the end of an existing file; may stay buffered until `sync`.
    fn append(&mut self, name: &str, bytes: &[u8]) -> io::Result<()>;
    /// Makes every byte written to the file durable (flush, then fsync).
    fn sync(&mut self, name: &str) -> io::Result<()>;
    /// Cuts the file to `len` bytes (pending appends are written first).
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
    writers: BTreeMap<String, BufWriter<File>>,
}

/// Creates `dir` and any missing parents with mode 0700 (an existing directory keeps its
/// mode: the operator chose it).
pub fn create_private_dir(dir: &Path) -> io::Result<()> {
    fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

impl FileDisk {
    /// Opens `dir`, creating it (and its parents) if missing, readable by its owner only
    /// (0700; its files are 0600): it holds every stored value.
    pub fn open(dir: impl AsRef<Path>) -> io::Result<FileDisk> {
        let dir = dir.as_ref().to_path_buf();
        create_private_dir(&dir)?;
        Ok(FileDisk { dir, writers: BTreeMap::new() })
    }

    /// The directory this disk works in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, name: &str) -> PathBuf {
        assert!(!name.is_empty() && !name.contains(['/', '\\']), "bad file name {name:?}");
        self.dir.join(name)
    }

    /// Flushes and closes the writer of `name`, if open.
    fn close(&mut self, name: &str) -> io::Result<()> {
        if let Some(mut writer) = self.writers.remove(name) {
            writer.flush()?;
        }
        Ok(())
    }

    fn writer(&mut self, name: &str) -> io::Result<&mut BufWriter<File>> {
        if !self.writers.contains_key(name) {
            if self.writers.len() >= WRITERS_OPEN_MAX {
                let names: Vec<String> = self.writers.keys().cloned().collect();
                for other in names {
                    self.close(&other)?;
                }
            }
            let file = OpenOptions::new().append(true).open(self.path(name))?;
            let capacity = if HOLD_UNSYNCED.load(Ordering::Relaxed) {
                HELD_BUFFER_BYTES
            } else {
                WRITER_BUFFER_BYTES
            };
            let writer = BufWriter::with_capacity(capacity, file);
            self.writers.insert(name.to_string(), writer);
        }
        assert!(self.writers.len() <= WRITERS_OPEN_MAX);
        Ok(self.writers.get_mut(name).expect("inserted above"))
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
        let mut options = OpenOptions::new();
        options.write(true).create(true).truncate(true).mode(0o600);
        options.open(self.path(name))?;
        Ok(())
    }

    fn append(&mut self, name: &str, bytes: &[u8]) -> io::Result<()> {
        self.writer(name)?.write_all(bytes)
    }

    fn sync(&mut self, name: &str) -> io::Result<()> {
        // A load first: the swap, a write, only when armed (every fsync passes here).
        if FAIL_NEXT_SYNC.load(Ordering::Relaxed) && FAIL_NEXT_SYNC.swap(false, Ordering::Relaxed) {
            return Err(io::Error::from_raw_os_error(5)); // EIO, injected
        }
        match self.writers.get_mut(name) {
            Some(writer) => {
                writer.flush()?;
                writer.get_ref().sync_data()
            }
            None => File::open(self.path(name))?.sync_data(),
        }
    }

    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()> {
        self.close(name)?;
        OpenOptions::new().write(true).open(self.path(name))?.set_len(len)
    }

    fn rename(&mut self, from: &str, to: &str) -> io::Result<()> {
        self.close(from)?;
        self.close(to)?;
        fs::rename(self.path(from), self.path(to))
    }

    fn remove(&mut self, name: &str) -> io::Result<()> {
        if let Some(writer) = self.writers.remove(name) {
            // Discard the buffer: the file is going away.
            let _ = writer.into_parts();
        }
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
    fn a_new_data_directory_and_its_files_are_its_owners_alone() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("keel-storage-mode-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let nested = dir.join("keyspace-1");
        let mut disk = FileDisk::open(&nested).unwrap();
        disk.create("hard-state.tmp").unwrap();
        disk.append("hard-state.tmp", b"x").unwrap();
        disk.sync("hard-state.tmp").unwrap();
        let mode = |path: &Path| fs::metadata(path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700, "a parent it created");
        assert_eq!(mode(&nested), 0o700);
        assert_eq!(mode(&nested.join("hard-state.tmp")), 0o600);
        fs::remove_dir_all(&dir).unwrap();
    }

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
    #[should_panic(expected = "bad file name")]
    fn paths_are_not_file_names() {
        let mut disk = FileDisk::open(std::env::temp_dir()).unwrap();
        let _ = disk.create("../escape");
    }
}
