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
    /// Recovery found damage that is not a torn log tail: a bad hard-state or snapshot
    /// checksum, or a log that does not join its snapshot.
    #[error("storage corrupt: {name}: {reason}")]
    Corrupt {
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
