//! Errors a client can see. Each says whether retrying (possibly elsewhere) can help.
//! Storage failures are not here: they stop the node (see `keel-storage`).

use crate::{KeyspaceId, NodeId};
use serde::{Deserialize, Serialize};

/// Result of a client-visible operation.
pub type KeelResult<T> = Result<T, KeelError>;

/// An operating error returned to a client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum KeelError {
    /// This node is not the leader; `leader` is its best guess.
    #[error("not the leader (leader: {leader:?})")]
    NotLeader {
        /// The node believed to lead, if known.
        leader: Option<NodeId>,
    },
    /// This follower is not in the active set and may not serve monotonic reads now.
    #[error("not in the active set; retry later or at another node")]
    NotActive,
    /// A queue or limit is full; retry after a pause.
    #[error("busy: {0}")]
    Busy(String),
    /// The operation did not complete in time; its outcome is unknown for writes.
    #[error("timed out; outcome unknown")]
    Timeout,
    /// The node is not accepting writes (disk full, read-only or failed fsync).
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The key is longer than the configured limit.
    #[error("key of {len} bytes exceeds the limit of {max} bytes")]
    KeyTooLarge {
        /// The key's length.
        len: u64,
        /// The limit.
        max: u32,
    },
    /// The value is larger than the configured limit.
    #[error("value of {len} bytes exceeds the maximum allowed size of {max} bytes")]
    ValueTooLarge {
        /// The value's length.
        len: u64,
        /// The limit.
        max: u32,
    },
    /// `incr` on a value that is not a decimal i64, or an increment that overflows.
    #[error("value is not an integer or out of range")]
    NotAnInteger,
    /// A malformed or out-of-range argument.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A request of a session the deduplication table no longer holds (it was idle while
    /// `dedup_clients_max` other clients wrote): refused, since an earlier attempt may have
    /// been applied. Open a new session; the outcome of the request's earlier attempts is
    /// unknown.
    #[error("session expired; open a new session (earlier attempts' outcome unknown)")]
    SessionExpired,
    /// A command of one type's family on a key holding another type (a list command on a
    /// string, `GET` on a hash), as Redis words it.
    #[error("Operation against a key holding the wrong kind of value")]
    WrongType,
    /// A strong transaction's certification found a conflicting strong transaction its
    /// snapshot does not include: it did not commit; run it again from its beginning.
    #[error("conflict: {0}")]
    Conflict(String),
    /// A sharded cluster's key whose hash slot another keyspace serves: ask `addr`
    /// (`host:port`), as Redis Cluster's `MOVED` says.
    #[error("{slot} {addr}")]
    Moved {
        /// The key's hash slot.
        slot: u16,
        /// Where a replica of the keyspace serving it takes clients.
        addr: String,
    },
    /// A key of a slot moving to another keyspace that this one no longer holds: ask
    /// `addr` once, with `ASKING` first (Redis Cluster's `ASK`).
    #[error("{slot} {addr}")]
    Ask {
        /// The key's hash slot.
        slot: u16,
        /// Where a replica of the keyspace the slot moves to takes clients.
        addr: String,
    },
    /// The engine's answer for a key of a slot its log moved away (`ask`: moving now,
    /// and the key is no longer here; else moved): the node turns it into [`Self::Ask`]
    /// or [`Self::Moved`], naming where `keyspace` takes clients.
    #[error("slot {slot} is served by keyspace {keyspace} (ask in move: {ask:?})")]
    Redirect {
        /// The key's hash slot.
        slot: u16,
        /// The keyspace to ask.
        keyspace: KeyspaceId,
        /// To ask once (`ASK`), sent on in the move of this id, rather than for good
        /// (`MOVED`, `None`).
        ask: Option<u64>,
    },
    /// Keys of a slot being moved, some of them being copied now or some of them moved
    /// already: retry in a moment (Redis Cluster's `TRYAGAIN`).
    #[error("{0}")]
    TryAgain(String),
}

impl KeelError {
    /// Whether the same request may succeed if retried (after a pause or elsewhere).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            KeelError::NotLeader { .. }
                | KeelError::NotActive
                | KeelError::Busy(_)
                | KeelError::Timeout
                | KeelError::Unavailable(_)
                | KeelError::Conflict(_)
                | KeelError::Moved { .. }
                | KeelError::Ask { .. }
                | KeelError::Redirect { .. }
                | KeelError::TryAgain(_)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_errors_are_told_from_fatal_ones() {
        assert!(KeelError::NotLeader { leader: Some(NodeId(2)) }.is_retryable());
        assert!(KeelError::Busy("queue full".into()).is_retryable());
        assert!(!KeelError::NotAnInteger.is_retryable());
        assert!(!KeelError::InvalidArgument("x".into()).is_retryable());
    }
}
