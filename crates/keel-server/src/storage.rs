//! One keyspace's storage thread: the effect executor's [`Worker`] over the keyspace's
//! [`FileStorage`], carrying out the engine loop's operations in order with group commit.
//!
//! Why a thread and not a task: `Storage::sync` blocks for as long as the disk takes,
//! and a blocked tokio worker would stall every connection it serves.
//!
//! Group commit: the thread takes every operation waiting in its queue (at most
//! [`STORAGE_BATCH_MAX`]), carries them out in order, then fsyncs once if any of them
//! asked for it. Completions go back to the engine loop on a channel as they happen (a
//! hard state the moment it is durable, the fsync when it returns).
//!
//! Snapshots a node took are written off this thread ([`StorageHandle::prepare_snapshot`])
//! and adopted through it, so the log's fsyncs never queue behind a file as large as the
//! state.
//!
//! Failure: any storage error is fatal. The thread logs it, publishes it on the fatal
//! channel and stops; the node then stops accepting requests and exits non-zero.

use crate::metrics::KeyspaceMetrics;
use keel_core::engine::SnapshotBytes;
use keel_exec::{Completion, StorageOp, Worker};
use keel_storage::{FileDisk, FileStorage, Recovered, Storage, StorageConfig, StorageError};
use keel_types::{Entry, LogRecord, SnapshotMeta};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

/// Most operations carried out between two fsyncs.
pub const STORAGE_BATCH_MAX: usize = 4096;
/// Most operations waiting for the storage thread; the engine loop waits past it.
pub const STORAGE_QUEUE_MAX: usize = 8192;

const _: () = assert!(STORAGE_BATCH_MAX <= STORAGE_QUEUE_MAX);

/// A snapshot written and synced under its temporary name off the storage thread, with
/// its data length, or why that failed.
pub type Prepared = Result<(SnapshotMeta, u64), String>;

/// The engine loop's side of the storage thread, whose log holds records `R` (the
/// engine's).
pub struct StorageHandle<R = Entry> {
    /// Operations with their sequence numbers (from the executor's front).
    pub ops: mpsc::Sender<(u64, StorageOp<R>)>,
    /// Completions, in order. Unbounded because each operation yields at most one and the
    /// operations are bounded by `ops`.
    pub completions: mpsc::UnboundedReceiver<Completion>,
    /// Set once the storage failed: the reason.
    pub fatal: watch::Receiver<Option<String>>,
    /// Snapshots written by [`StorageHandle::prepare_snapshot`], in completion order.
    pub prepared: mpsc::UnboundedReceiver<Prepared>,
    prepared_tx: mpsc::UnboundedSender<Prepared>,
    /// The directory snapshot files are written to off the storage thread (`None`: a
    /// storage that saves them on its thread only, as the simulated one in tests).
    prepare_dir: Option<PathBuf>,
}

impl<R> StorageHandle<R> {
    /// Starts writing a snapshot this node took (one inside its durable log) on a blocking
    /// task of its own; [`StorageHandle::prepared`] yields it once synced, and the front
    /// then queues its adoption. Call inside the runtime. Returns the snapshot back if
    /// this storage cannot be written beside its thread (tests): then save it in order.
    pub fn prepare_snapshot(
        &self,
        meta: SnapshotMeta,
        data: SnapshotBytes,
    ) -> Option<(SnapshotMeta, SnapshotBytes)> {
        let Some(dir) = self.prepare_dir.clone() else { return Some((meta, data)) };
        let done = self.prepared_tx.clone();
        tokio::task::spawn_blocking(move || {
            let written = FileDisk::open(&dir)
                .and_then(|mut disk| keel_storage::wal::prepare_snapshot(&mut disk, meta, &data));
            let result = written
                .map(|()| (meta, data.len() as u64))
                .map_err(|e| format!("cannot write the snapshot at {}: {e}", meta.last_index));
            let _ = done.send(result);
        });
        None
    }
}

/// The largest snapshot file a node with a state of at most `state_bytes_max` writes or
/// accepts at recovery: the items take at most `state_bytes_max`; the rest is room for
/// the dedup table.
pub fn snapshot_bytes_max(state_bytes_max: u64) -> u64 {
    state_bytes_max.saturating_mul(2).saturating_add(256 << 20)
}

/// The limits a keyspace's storage runs with: the defaults, with the snapshot size limit
/// of its state (see [`snapshot_bytes_max`]). `keel repair-hard-state` opens a keyspace's
/// directory with these too.
pub fn storage_config(snapshot_bytes_max: u64) -> StorageConfig {
    StorageConfig { snapshot_bytes_max, ..StorageConfig::default() }
}

/// What a started storage hands its keyspace: what recovery found, and the thread's handle.
pub type Started<R> = Result<(Recovered<R>, StorageHandle<R>), StartError>;

/// Why a keyspace's storage did not start.
#[derive(Debug)]
pub enum StartError {
    /// Recovery failed (the storage's own error, so the caller can explain a damaged
    /// hard state with the keyspace's directory and engine).
    Recovery(StorageError),
    /// Anything else: the directory or the thread.
    Other(String),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Recovery(e) => write!(f, "recovery failed: {e}"),
            StartError::Other(reason) => f.write_str(reason),
        }
    }
}

/// Opens the storage in `dir`, recovers it (blocking: call before the runtime serves),
/// and starts the storage thread. `fsync_delay`: test-only extra time per log fsync
/// (`[storage] emulated_fsync_delay_us`; zero in production).
pub fn start<R: LogRecord>(
    dir: &Path,
    metrics: Arc<KeyspaceMetrics>,
    fsync_delay: Duration,
    snapshot_bytes_max: u64,
) -> Started<R> {
    keel_storage::disk::create_private_dir(dir).map_err(|e| {
        StartError::Other(format!("cannot create data directory {}: {e}", dir.display()))
    })?;
    let storage = FileStorage::<R>::open(dir, storage_config(snapshot_bytes_max))
        .map_err(|e| StartError::Other(format!("cannot open storage in {}: {e}", dir.display())))?;
    let (recovered, mut handle) = start_with(storage, metrics, fsync_delay)?;
    handle.prepare_dir = Some(dir.to_path_buf());
    Ok((recovered, handle))
}

/// Recovers `storage` and starts the storage thread over it (any [`Storage`]: the file
/// one in a server, a simulated one in tests).
pub fn start_with<S: Storage + Send + 'static>(
    mut storage: S,
    metrics: Arc<KeyspaceMetrics>,
    fsync_delay: Duration,
) -> Started<S::Record> {
    let recovered = storage.recover().map_err(StartError::Recovery)?;
    let (ops_tx, ops_rx) = mpsc::channel(STORAGE_QUEUE_MAX);
    let (completions_tx, completions_rx) = mpsc::unbounded_channel();
    let (fatal_tx, fatal_rx) = watch::channel(None);
    let thread = StorageThread {
        worker: Worker::new(storage),
        ops: ops_rx,
        completions: completions_tx,
        metrics,
        fsync_delay,
    };
    std::thread::Builder::new()
        .name("keel-storage".into())
        .spawn(move || thread.run(fatal_tx))
        .map_err(|e| StartError::Other(format!("cannot start the storage thread: {e}")))?;
    let (prepared_tx, prepared) = mpsc::unbounded_channel();
    let handle = StorageHandle {
        ops: ops_tx,
        completions: completions_rx,
        fatal: fatal_rx,
        prepared,
        prepared_tx,
        prepare_dir: None,
    };
    Ok((recovered, handle))
}

/// What a node that found keyspace directory `dir`'s hard-state file damaged says: what
/// is wrong and the command that repairs it, with the directory filled in (absolute, and
/// quoted for a shell when it needs to be). The epoch to give differs by engine: the
/// greatest epoch the other members report for a leader keyspace; for a Kite keyspace,
/// whose hard state holds only this node's incarnation, its last incarnation
/// (`docs/operations.md`, "Damaged hard state").
pub fn hard_state_damaged(dir: &Path, name: &str, reason: &str, kite: bool) -> String {
    let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
    let file = dir.join(name);
    let (read, epoch) = if kite {
        (
            "find this node's last incarnation in this Kite keyspace (the `incarnation` of \
             its last `booted as incarnation` log line for this keyspace, or of its last \
             `keel status`)",
            "<that incarnation>",
        )
    } else {
        (
            "read the epoch every other member reports for this keyspace (`keel status`; all of \
             them, started if they are down)",
            "<the greatest of them>",
        )
    };
    format!(
        "recovery failed: the hard-state file {} is damaged ({reason}); the node may have lost \
         its vote and will not start. Leave it stopped, {read}, then run `keel \
         repair-hard-state --dir {} --epoch {epoch}` and start it again (docs/operations.md, \
         \"Damaged hard state\")",
        file.display(),
        shell_word(&dir.display().to_string()),
    )
}

/// `word` as one shell word: as is when it holds only characters no shell treats
/// specially, in single quotes otherwise.
fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-+:,@%=".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

struct StorageThread<S: Storage> {
    worker: Worker<S>,
    ops: mpsc::Receiver<(u64, StorageOp<S::Record>)>,
    completions: mpsc::UnboundedSender<Completion>,
    metrics: Arc<KeyspaceMetrics>,
    /// Test-only emulation of a slower disk: slept after every log fsync.
    fsync_delay: Duration,
}

impl<S: Storage> StorageThread<S> {
    fn run(mut self, fatal: watch::Sender<Option<String>>) {
        let mut batch = Vec::with_capacity(STORAGE_BATCH_MAX);
        loop {
            let Some(first) = self.ops.blocking_recv() else {
                return; // the engine loop ended: the node is shutting down
            };
            batch.push(first);
            while batch.len() < STORAGE_BATCH_MAX {
                match self.ops.try_recv() {
                    Ok(op) => batch.push(op),
                    Err(_) => break,
                }
            }
            if let Err(reason) = self.carry_out(&mut batch) {
                tracing::error!(%reason, "storage failed; the node stops");
                let _ = fatal.send(Some(reason));
                return;
            }
            assert!(batch.is_empty(), "every operation of the batch was carried out");
        }
    }

    /// Carries out `batch` in order, then fsyncs once if any operation asked for it.
    fn carry_out(&mut self, batch: &mut Vec<(u64, StorageOp<S::Record>)>) -> Result<(), String> {
        let completions = &self.completions;
        let mut report = |completion| {
            let _ = completions.send(completion); // the loop is gone: shutting down
        };
        let applied = self.worker.apply(batch.drain(..), &mut report).map_err(|e| e.to_string())?;
        if applied.sync_wanted {
            let started = Instant::now();
            let synced =
                self.worker.sync(applied.seq_last).map_err(|e| format!("fsync failed: {e}"))?;
            if !self.fsync_delay.is_zero() {
                std::thread::sleep(self.fsync_delay); // emulation only: see `start`
            }
            self.metrics.fsync_seconds.observe(started.elapsed().as_secs_f64());
            report(synced);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_storage::{SimFault, SimStorage, StorageResult};
    use keel_types::{Entry, EntryPayload, Epoch, HardState, LogIndex};

    /// A simulated storage whose first log fsync after recovery fails.
    struct FailingSync(SimStorage);

    impl Storage for FailingSync {
        type Record = Entry;

        fn recover(&mut self) -> StorageResult<Recovered> {
            let recovered = self.0.recover();
            self.0.sim_disk().fail_next(SimFault::Sync);
            recovered
        }
        fn append(&mut self, entries: &[Entry]) -> StorageResult<()> {
            self.0.append(entries)
        }
        fn truncate_after(&mut self, index: LogIndex) -> StorageResult<()> {
            self.0.truncate_after(index)
        }
        fn sync(&mut self) -> StorageResult<LogIndex> {
            self.0.sync()
        }
        fn adopt_snapshot(&mut self, meta: SnapshotMeta, len: u64) -> StorageResult<bool> {
            self.0.adopt_snapshot(meta, len)
        }
        fn save_hard_state(&mut self, hard_state: &HardState) -> StorageResult<()> {
            self.0.save_hard_state(hard_state)
        }
        fn save_snapshot(&mut self, meta: SnapshotMeta, data: &[u8]) -> StorageResult<()> {
            self.0.save_snapshot(meta, data)
        }
        fn compact_through(&mut self, index: LogIndex) -> StorageResult<()> {
            self.0.compact_through(index)
        }
        fn last_index(&self) -> LogIndex {
            self.0.last_index()
        }
        fn synced_index(&self) -> LogIndex {
            self.0.synced_index()
        }
    }

    fn entry(index: u64) -> Entry {
        Entry { epoch: Epoch(1), index: LogIndex(index), payload: EntryPayload::Noop }
    }

    fn metrics() -> Arc<KeyspaceMetrics> {
        Arc::new(KeyspaceMetrics::default())
    }

    #[test]
    fn syncs_are_coalesced_and_completions_come_back_in_order() {
        let storage = SimStorage::new_sim(StorageConfig::default());
        let (_, mut handle) = start_with(storage, metrics(), Duration::ZERO).unwrap();
        let ops = [
            StorageOp::HardState(HardState {
                epoch: Epoch(1),
                voted_for: None,
                repair_floor: None,
                members_epoch: 0,
            }),
            StorageOp::Append(vec![entry(1)]),
            StorageOp::Sync,
            StorageOp::Append(vec![entry(2)]),
            StorageOp::Sync,
        ];
        for (seq, op) in ops.into_iter().enumerate() {
            handle.ops.blocking_send((seq as u64 + 1, op)).unwrap();
        }
        let mut seen = Vec::new();
        while seen.last().is_none_or(|c| !matches!(c, Completion::Synced { seq: 5, .. })) {
            seen.push(handle.completions.blocking_recv().expect("the thread runs"));
        }
        assert_eq!(seen.first(), Some(&Completion::HardStateSaved { seq: 1 }));
        assert_eq!(seen.last(), Some(&Completion::Synced { index: LogIndex(2), seq: 5 }));
        assert!(handle.fatal.borrow().is_none());
    }

    #[test]
    fn a_damaged_hard_state_names_the_repair_with_the_keyspace_directory() {
        let text = hard_state_damaged(Path::new("/data/keyspace-2"), "hard-state", "bad", false);
        assert!(text.contains("keel repair-hard-state --dir /data/keyspace-2 --epoch"), "{text}");
        assert!(text.contains("/data/keyspace-2/hard-state is damaged (bad)"), "{text}");
        assert!(text.contains("every other member"), "{text}");
        let text = hard_state_damaged(Path::new("/my data/it's"), "hard-state", "bad", true);
        assert!(text.contains("--dir '/my data/it'\\''s' --epoch <that incarnation>"), "{text}");
        assert!(text.contains("booted as incarnation"), "{text}");
        let relative = hard_state_damaged(Path::new("n1"), "hard-state", "bad", false);
        let absolute = std::env::current_dir().unwrap().join("n1");
        assert!(relative.contains(&format!("--dir {}", absolute.display())), "{relative}");
    }

    #[test]
    fn a_failed_fsync_is_fatal_and_nothing_more_is_reported() {
        let storage = FailingSync(SimStorage::new_sim(StorageConfig::default()));
        let (_, mut handle) = start_with(storage, metrics(), Duration::ZERO).unwrap();
        handle.ops.blocking_send((1, StorageOp::Append(vec![entry(1)]))).unwrap();
        handle.ops.blocking_send((2, StorageOp::Sync)).unwrap();
        assert_eq!(
            handle.completions.blocking_recv(),
            None,
            "the thread stopped, reporting nothing"
        );
        let reason = handle.fatal.borrow().clone().unwrap();
        assert!(reason.contains("fsync failed"), "{reason}");
    }
}
