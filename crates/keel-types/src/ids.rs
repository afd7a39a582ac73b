//! Newtypes for identities and log positions. Widths are explicit because these values
//! travel on the wire and sit on disk; `usize` is never serialized.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A replica's identity within a cluster. Stable across restarts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NodeId(pub u32);

/// A period with at most one leader (Raft's term, ZAB's epoch).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Epoch(pub u64);

/// A position in the replicated log. Index 0 is "before the first entry"; entries start at 1.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct LogIndex(pub u64);

/// The identity of one write: the epoch of the leader that created it and its log index.
///
/// Within one log both components are non-decreasing, so comparing versions of entries
/// of the same log by `index` or by `(epoch, index)` agrees. Versions of writes that were
/// lost (never made it into the surviving log) are still unique: one leader per epoch.
/// Ordered as ORCA's zxid: epoch first, then index.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Version {
    /// The epoch of the leader that appended the write.
    pub epoch: Epoch,
    /// The write's log index.
    pub index: LogIndex,
}

/// A keyspace's identity within a cluster: what `SELECT n` picks and what peer frames
/// carry with each message. Keyspace 0 always exists.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct KeyspaceId(pub u32);

impl fmt::Display for KeyspaceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ks{}", self.0)
    }
}

/// A client's identity, used with [`RequestId`] to deduplicate retried writes.
///
/// Ids with [`ClientId::SESSION_BIT`] set name *sessions*: opened by a
/// [`crate::Command::OpenSession`] entry, and refused with
/// [`crate::KeelError::SessionExpired`] once the deduplication table no longer holds them,
/// so that a retry is never applied twice. Ids below it are best-effort: a client the
/// table has forgotten is taken for a new one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ClientId(pub u64);

impl ClientId {
    /// The bit that marks a session id.
    pub const SESSION_BIT: u64 = 1 << 63;

    /// Whether this id names a session (opened explicitly, refused once forgotten).
    pub fn is_session(self) -> bool {
        self.0 & Self::SESSION_BIT != 0
    }
}

/// A client's per-request sequence number; strictly increasing per client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RequestId(pub u64);

impl LogIndex {
    /// The index before the first entry.
    pub const ZERO: LogIndex = LogIndex(0);

    /// The next index.
    #[must_use]
    pub fn next(self) -> LogIndex {
        LogIndex(self.0.checked_add(1).expect("log index overflow"))
    }

    /// The previous index, saturating at zero.
    #[must_use]
    pub fn prev(self) -> LogIndex {
        LogIndex(self.0.saturating_sub(1))
    }
}

impl Epoch {
    /// The next epoch.
    #[must_use]
    pub fn next(self) -> Epoch {
        Epoch(self.0.checked_add(1).expect("epoch overflow"))
    }
}

impl Version {
    /// A version from its parts.
    pub const fn new(epoch: u64, index: u64) -> Version {
        Version { epoch: Epoch(epoch), index: LogIndex(index) }
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}", self.0)
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "e{}", self.0)
    }
}

impl fmt::Display for LogIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "i{}", self.0)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.epoch.0, self.index.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_orders_epoch_first() {
        assert!(Version::new(2, 1) > Version::new(1, 9));
        assert!(Version::new(1, 2) > Version::new(1, 1));
        assert_eq!(Version::new(3, 3), Version::new(3, 3));
    }

    #[test]
    fn version_serializes_with_named_fields() {
        let json = serde_json::to_string(&Version::new(2, 17)).unwrap();
        assert_eq!(json, r#"{"epoch":2,"index":17}"#);
    }

    #[test]
    fn log_index_prev_saturates() {
        assert_eq!(LogIndex::ZERO.prev(), LogIndex::ZERO);
        assert_eq!(LogIndex(5).next(), LogIndex(6));
    }
}
