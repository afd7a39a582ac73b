//! The one error type of the storage layer.
//!
//! Every storage error is fatal to the node: none is retryable. After any failed write or
//! fsync the storage is poisoned and every later call returns [`StorageError::Poisoned`];
//! the node must stop and recover from disk on restart. Retrying an fsync is unsafe (the
//! kernel may have dropped the dirty pages and report success the second time).

use std::io;

/// Result of a storage operation.
pub type StorageResult<T> = Result<T, StorageError>;

/// Why a storage operation failed. Never retryable; see the module docs.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The operating system refused a read, write, fsync, rename or removal.
    #[error("storage i/o failed: {op} {name}: {source}")]
    Io {
        /// The operation (`write`, `fsync`, `rename`, ...).
        op: &'static str,
        /// The file (or directory) it concerned.
        name: String,
        /// The operating system's error.
        source: io::Error,
    },
    /// An earlier operation failed; the storage accepts no more calls.
    #[error("storage poisoned by an earlier failure: {cause}")]
    Poisoned {
        /// The first failure, as text.
        cause: String,
    },
    /// Recovery found damage it cannot repair by itself that is not the hard state's: a
    /// log that starts after its snapshot's end.
    #[error("storage corrupt: {name}: {reason}")]
    Corrupt {
        /// The damaged file.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The hard-state file is damaged. It held the node's vote, which nothing else on the
    /// disk records: a node that started without it could vote twice in one epoch. The
    /// node must not start until an operator rebuilds the file from what the other
    /// members know (`docs/operations.md`, "Damaged hard state").
    #[error(
        "storage corrupt: {name}: {reason}; the node may have lost its vote and will not \
         start. Stop it, read the greatest epoch every other member reports for this keyspace \
         (`keel status`), then run `keel repair-hard-state --dir <this keyspace's directory> \
         --epoch <that epoch>` and start it again (docs/operations.md, \"Damaged hard state\")"
    )]
    HardStateDamaged {
        /// The damaged file.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An entry or snapshot is larger than the configured limit.
    #[error("{what} of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// What was too large.
        what: &'static str,
        /// Its size.
        len: u64,
        /// The limit.
        max: u64,
    },
}

impl StorageError {
    /// Whether retrying could help: never. Storage failures stop the node.
    pub fn is_retryable(&self) -> bool {
        false
    }
}
