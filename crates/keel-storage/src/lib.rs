//! Keel's storage: a segmented write-ahead log, the hard state and snapshots, behind one
//! small [`Storage`] trait with a file implementation and a simulated one.
//!
//! Layout:
//! - [`storage`]: the [`Storage`] trait drivers persist through, and [`Recovered`].
//! - [`error`]: [`StorageError`]; every storage failure is fatal and poisons the storage.
//! - [`config`]: the named limits ([`StorageConfig`]: `segment_bytes_max`,
//!   `record_bytes_max`, ...).
//! - [`format`](mod@format): byte layouts (segment header, records, hard-state and snapshot files)
//!   and the pure scan recovery runs; `docs/format.md` describes them.
//! - [`disk`]: the [`Disk`] trait (file operations by name in one directory) and
//!   [`FileDisk`] over the host file system.
//! - [`wal`]: [`Wal`], the log over any [`Disk`]; [`FileStorage`] is `Wal<FileDisk>`.
//! - `recovery`: the recovery algorithm (longest valid prefix, join with the snapshot).
//! - [`sim`]: [`SimDisk`], an in-memory disk with exact crash semantics (lose what was
//!   not fsynced, torn tails, bit rot, injected faults); [`SimStorage`] is
//!   `Wal<SimDisk>`, so simulated recovery is the file recovery, byte for byte.
//!
//! A driver opens a storage, calls [`Storage::recover`] once, hands the result to the
//! engine, then carries out each step's outputs:
//!
//! ```
//! use keel_storage::{SimStorage, Storage, StorageConfig};
//! use keel_types::{Entry, EntryPayload, Epoch, HardState, LogIndex};
//!
//! let mut storage = <SimStorage>::new_sim(StorageConfig::default());
//! let recovered = storage.recover().unwrap();
//! assert!(recovered.entries.is_empty());
//! storage.save_hard_state(&HardState { epoch: Epoch(1), voted_for: None, repair_floor: None , members_epoch: 0 }).unwrap();
//! let entry = Entry { epoch: Epoch(1), index: LogIndex(1), payload: EntryPayload::Noop };
//! storage.append(&[entry.clone()]).unwrap();
//! assert_eq!(storage.sync().unwrap(), LogIndex(1)); // now report LogSynced { index: 1 }
//! storage.crash(); // a power loss: only fsynced writes survive
//! assert_eq!(storage.recover().unwrap().entries, vec![entry]);
//! ```

pub mod config;
pub mod disk;
pub mod error;
pub mod format;
mod recovery;
pub mod sim;
pub mod storage;
pub mod wal;

pub use config::StorageConfig;
pub use disk::{Disk, FileDisk};
pub use error::{StorageError, StorageResult};
pub use sim::{SimDisk, SimFault, SimStorage};
pub use storage::{LogDamage, Recovered, Storage};
pub use wal::{FileStorage, Wal};
