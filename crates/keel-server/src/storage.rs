//! The storage thread: owns the [`FileStorage`], carries out the engine's disk work in
//! the order it was asked for, and fsyncs with group commit.
//!
//! Why a thread and not a task: `Storage::sync` blocks for as long as the disk takes,
//! and a blocked tokio worker would stall every connection it serves.
//!
//! Group commit: the thread takes every operation waiting in its queue (at most
//! [`STORAGE_BATCH_MAX`]), carries them out in order, then fsyncs once if any of them
//! asked for it. The result is published on a `watch` channel, so a slow engine loop
//! sees only the newest synced index and the thread never waits for it.
//!
//! Failure: any storage error is fatal. The thread logs it, publishes it on the fatal
//! channel and stops; the node then stops accepting requests and exits non-zero.

use crate::metrics::Metrics;
use keel_core::leader::SnapshotBytes;
use keel_storage::{FileDisk, FileStorage, Recovered, Storage, StorageConfig};
use keel_types::{Entry, HardState, LogIndex, SnapshotMeta};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, watch};

/// Most operations carried out between two fsyncs.
pub const STORAGE_BATCH_MAX: usize = 4096;
/// Most operations waiting for the storage thread; the engine loop waits past it.
pub const STORAGE_QUEUE_MAX: usize = 8192;

const _: () = assert!(STORAGE_BATCH_MAX <= STORAGE_QUEUE_MAX);

/// One piece of disk work, tagged with a sequence number increasing in send order.
#[derive(Debug)]
pub enum StorageOp {
    /// Write and fsync the hard state, then answer on `done`.
    HardState {
        /// The new hard state.
        hard_state: HardState,
        /// Answered once it is durable.
        done: oneshot::Sender<()>,
    },
    /// Remove every entry after the index.
    TruncateAfter(LogIndex),
    /// Append entries (buffered).
    Append(Vec<Entry>),
    /// Fsync the log (coalesced with every other sync in the batch); carries when it was
    /// asked for, for the `keel_sync_wait_duration_seconds` histogram.
    Sync(Instant),
    /// Save a snapshot durably, report it, then compact the log below it.
    Snapshot(SnapshotMeta, SnapshotBytes),
    /// Put in place a snapshot file written off this thread
    /// ([`StorageHandle::prepare_snapshot`]) of that many data bytes; then as `Snapshot`.
    AdoptSnapshot(SnapshotMeta, u64),
}

/// A snapshot written and synced under its temporary name off the storage thread, with
/// its data length, or why that failed.
pub type Prepared = Result<(SnapshotMeta, u64), String>;

/// The newest fsync result: the log is durable through `index` as of the operation with
/// sequence number `seq` (every operation up to it was carried out before the fsync).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Synced {
    /// The last index on disk when the fsync returned.
    pub index: LogIndex,
    /// The sequence number of the last operation carried out before the fsync.
    pub seq: u64,
}

/// The engine loop's side of the storage thread.
pub struct StorageHandle {
    /// Operations with their sequence numbers.
    pub ops: mpsc::Sender<(u64, StorageOp)>,
    /// The newest fsync result.
    pub synced: watch::Receiver<Synced>,
    /// Snapshots saved, in order. Unbounded because the engine has at most one snapshot
    /// save in flight (and at most one install), so it never holds more than two.
    pub snapshots: mpsc::UnboundedReceiver<SnapshotMeta>,
    /// Set once the storage failed: the reason.
    pub fatal: watch::Receiver<Option<String>>,
    /// Snapshots written by [`StorageHandle::prepare_snapshot`], in completion order.
    pub prepared: mpsc::UnboundedReceiver<Prepared>,
    prepared_tx: mpsc::UnboundedSender<Prepared>,
    /// The directory snapshot files are written to off the storage thread (`None`: a
    /// storage that saves them on its thread only, as the simulated one in tests).
    prepare_dir: Option<PathBuf>,
}

impl StorageHandle {
    /// Starts writing a snapshot this node took (one inside its durable log) on a blocking
    /// task of its own, so that the log's appends and fsyncs do not queue behind a file
    /// as large as the state; [`StorageHandle::prepared`] yields it once synced, to be
    /// queued as [`StorageOp::AdoptSnapshot`]. Call inside the runtime. Returns the
    /// snapshot back if this storage saves snapshots on its thread only.
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

/// Opens the storage in `dir`, recovers it (blocking: call before the runtime serves),
/// and starts the storage thread. `fsync_delay`: test-only extra time per log fsync
/// (`[storage] emulated_fsync_delay_us`; zero in production).
pub fn start(
    dir: &Path,
    metrics: Arc<Metrics>,
    fsync_delay: Duration,
    snapshot_bytes_max: u64,
) -> Result<(Recovered, StorageHandle), String> {
    std::fs::create_dir_all(dir)
        .map_err(|e| format!("cannot create data_dir {}: {e}", dir.display()))?;
    let config = StorageConfig { snapshot_bytes_max, ..StorageConfig::default() };
    let storage = FileStorage::open(dir, config)
        .map_err(|e| format!("cannot open storage in {}: {e}", dir.display()))?;
    let (recovered, mut handle) = start_with(storage, metrics, fsync_delay)?;
    handle.prepare_dir = Some(dir.to_path_buf());
    Ok((recovered, handle))
}

/// Recovers `storage` and starts the storage thread over it (any [`Storage`]: the file
/// one in a server, a simulated one in tests).
pub fn start_with<S: Storage + Send + 'static>(
    mut storage: S,
    metrics: Arc<Metrics>,
    fsync_delay: Duration,
) -> Result<(Recovered, StorageHandle), String> {
    let recovered = storage.recover().map_err(|e| format!("recovery failed: {e}"))?;
    let (ops_tx, ops_rx) = mpsc::channel(STORAGE_QUEUE_MAX);
    let (synced_tx, synced_rx) = watch::channel(Synced { index: storage.synced_index(), seq: 0 });
    let (snap_tx, snap_rx) = mpsc::unbounded_channel();
    let (fatal_tx, fatal_rx) = watch::channel(None);
    let thread = StorageThread {
        storage,
        ops: ops_rx,
        synced: synced_tx,
        snapshots: snap_tx,
        metrics,
        fsync_delay,
    };
    std::thread::Builder::new()
        .name("keel-storage".into())
        .spawn(move || thread.run(fatal_tx))
        .map_err(|e| format!("cannot start the storage thread: {e}"))?;
    let (prepared_tx, prepared) = mpsc::unbounded_channel();
    let handle = StorageHandle {
        ops: ops_tx,
        synced: synced_rx,
        snapshots: snap_rx,
        fatal: fatal_rx,
        prepared,
        prepared_tx,
        prepare_dir: None,
    };
    Ok((recovered, handle))
}

struct StorageThread<S> {
    storage: S,
    ops: mpsc::Receiver<(u64, StorageOp)>,
    synced: watch::Sender<Synced>,
    snapshots: mpsc::UnboundedSender<SnapshotMeta>,
    metrics: Arc<Metrics>,
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
    fn carry_out(&mut self, batch: &mut Vec<(u64, StorageOp)>) -> Result<(), String> {
        let mut sync_wanted: Option<Instant> = None;
        let mut seq_last = 0;
        for (seq, op) in batch.drain(..) {
            assert!(seq > seq_last, "operations arrive in sequence order");
            seq_last = seq;
            match op {
                StorageOp::HardState { hard_state, done } => {
                    self.storage.save_hard_state(&hard_state).map_err(|e| e.to_string())?;
                    let _ = done.send(());
                }
                StorageOp::TruncateAfter(index) => {
                    self.storage.truncate_after(index).map_err(|e| e.to_string())?;
                }
                StorageOp::Append(entries) => {
                    self.storage.append(&entries).map_err(|e| e.to_string())?;
                }
                StorageOp::Sync(asked) => {
                    sync_wanted = Some(sync_wanted.map_or(asked, |a| a.min(asked)));
                }
                StorageOp::Snapshot(meta, data) => self.save_snapshot(meta, &data)?,
                StorageOp::AdoptSnapshot(meta, len) => self.adopt_snapshot(meta, len)?,
            }
        }
        if let Some(asked) = sync_wanted {
            let started = Instant::now();
            let index = self.storage.sync().map_err(|e| format!("fsync failed: {e}"))?;
            if !self.fsync_delay.is_zero() {
                std::thread::sleep(self.fsync_delay); // emulation only: see `start`
            }
            self.metrics.fsync_seconds.observe(started.elapsed().as_secs_f64());
            // From the oldest request of the batch to its fsync's end: the fsync itself plus
            // whatever it queued behind (an fsync in progress, appends, a snapshot).
            self.metrics.sync_wait_seconds.observe(asked.elapsed().as_secs_f64());
            let before = *self.synced.borrow();
            assert!(seq_last > before.seq, "sync results advance");
            self.synced.send_replace(Synced { index, seq: seq_last });
        }
        Ok(())
    }

    fn save_snapshot(&mut self, meta: SnapshotMeta, data: &[u8]) -> Result<(), String> {
        self.storage.save_snapshot(meta, data).map_err(|e| e.to_string())?;
        self.saved(meta)
    }

    fn adopt_snapshot(&mut self, meta: SnapshotMeta, len: u64) -> Result<(), String> {
        if self.storage.adopt_snapshot(meta, len).map_err(|e| e.to_string())? {
            self.saved(meta)?;
        }
        Ok(())
    }

    /// Reports a saved snapshot and compacts the log below it.
    fn saved(&mut self, meta: SnapshotMeta) -> Result<(), String> {
        let _ = self.snapshots.send(meta);
        self.storage.compact_through(meta.last_index).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_storage::{SimFault, SimStorage, StorageResult};
    use keel_types::{EntryPayload, Epoch};

    /// A simulated storage whose first log fsync after recovery fails.
    struct FailingSync(SimStorage);

    impl Storage for FailingSync {
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

    #[test]
    fn syncs_are_coalesced_and_reported_with_the_last_sequence_number() {
        let storage = SimStorage::new_sim(StorageConfig::default());
        let (_, handle) =
            start_with(storage, Arc::new(Metrics::default()), Duration::ZERO).unwrap();
        let ops = [
            StorageOp::Append(vec![entry(1)]),
            StorageOp::Sync(Instant::now()),
            StorageOp::Append(vec![entry(2)]),
            StorageOp::Sync(Instant::now()),
        ];
        for (seq, op) in ops.into_iter().enumerate() {
            handle.ops.blocking_send((seq as u64 + 1, op)).unwrap();
        }
        poll_until("the storage thread never synced", || handle.synced.borrow().seq >= 4);
        assert_eq!(*handle.synced.borrow(), Synced { index: LogIndex(2), seq: 4 });
        assert!(handle.fatal.borrow().is_none());
    }

    /// Polls `condition` every 5 ms; fails the test with `what` after 10 s.
    fn poll_until(what: &str, condition: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !condition() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_failed_fsync_is_fatal_and_nothing_more_is_reported() {
        let storage = FailingSync(SimStorage::new_sim(StorageConfig::default()));
        let (_, handle) =
            start_with(storage, Arc::new(Metrics::default()), Duration::ZERO).unwrap();
        handle.ops.blocking_send((1, StorageOp::Append(vec![entry(1)]))).unwrap();
        handle.ops.blocking_send((2, StorageOp::Sync(Instant::now()))).unwrap();
        poll_until("the failure was never reported", || handle.fatal.borrow().is_some());
        let reason = handle.fatal.borrow().clone().unwrap();
        assert!(reason.contains("fsync failed"), "{reason}");
        assert_eq!(handle.synced.borrow().index, LogIndex(0), "nothing is reported durable");
    }
}
