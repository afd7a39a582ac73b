//! Keel's shared vocabulary. Every other crate speaks in these types.
//!
//! Layout:
//! - [`ids`]: newtypes for node ids, keyspace ids, epochs, log indexes, versions and
//!   client ids.
//! - [`level`]: the user-visible write durabilities and read levels.
//! - [`command`]: the operations a client asks for and what they return.
//! - [`geo`]: geo keyspaces' vectors, transaction ids, objects with their merge rules,
//!   and a transaction's operations and results.
//! - [`coll`]: Redis's collections (hashes, lists, sets, sorted sets): their commands
//!   and answers.
//! - [`limits`]: every named limit on keys, values, batches and queues.
//! - [`log`]: log entries, hard state and snapshot metadata shared by engine and storage.
//! - [`codec`]: the explicit-width binary encoding of log entries and hard state (`docs/format.md`).
//! - [`rng`]: the deterministic PRNG every seeded component draws from.
//! - [`error`]: the typed errors a client can see, split into retryable and fatal.
//!
//! Nothing here does I/O, reads a clock or draws randomness.

pub mod codec;
pub mod coll;
pub mod command;
pub mod error;
pub mod fasthash;
pub mod geo;
pub mod ids;
pub mod level;
pub mod limits;
pub mod log;
pub mod rng;
pub mod slots;

pub use command::{
    check_not_reserved, db_key, db_of, db_range, ClusterOp, Command, CommandResult, ExpireCond,
    Key, Modify, SetCond, Ttl, Value, DB_KEYS_END, DB_KEY_PREFIX, MULTI_OPS_MAX, REAP_KEYS_MAX,
    RESERVED_KEY_END, RESERVED_KEY_PREFIX, STRING_BYTES_MAX,
};
pub use error::{KeelError, KeelResult};
pub use ids::{ClientId, Epoch, KeyspaceId, LogIndex, NodeId, RequestId, Version};
pub use level::{Durability, ReadLevel};
pub use limits::Limits;
pub use log::{
    ApplySettings, Entry, EntryPayload, HardState, LogRecord, Membership, NoRecord, SnapshotMeta,
};
