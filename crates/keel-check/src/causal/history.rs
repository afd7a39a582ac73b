//! The `keel-causal` history format: what a geo keyspace's clients and the simulator's
//! watch record for `keel check --model causal` (`docs/geo.md`, *Checking*).
//!
//! A history is what clients saw (each transaction's snapshot vector, its operations with
//! their results, the vector its commit returned, each barrier and attach) and what the
//! cluster did (every update transaction that committed, with its commit vector and
//! writes, as replicas exchanged it; when each data center came to store each origin's
//! transactions). Vectors have one entry per data center and then the strong entry: a
//! vector of `D + 1` entries, compared entry by entry.

use serde::{Deserialize, Serialize};

/// A transaction's identity: the node that coordinated it and its number there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TxId {
    /// The coordinating node.
    pub node: u32,
    /// Its number at that node.
    pub seq: u64,
}

impl std::fmt::Display for TxId {
    /// `node:seq`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.node, self.seq)
    }
}

/// A vector of `D` per-data-center timestamps followed by the strong entry.
pub type Vector = Vec<u64>;

/// Whether `a ≤ b` entry by entry (vectors of one history all have the same length).
pub fn vector_le(a: &[u64], b: &[u64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x <= y)
}

/// An update of one object, as its type defines it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Update {
    /// Last-writer-wins register: set the value.
    Set {
        /// The new value.
        value: String,
    },
    /// Counter: add `delta` (negative to subtract).
    Add {
        /// The amount added.
        delta: i64,
    },
    /// Max register: raise to `value` (a lower value changes nothing).
    Max {
        /// The value raised to.
        value: i64,
    },
    /// Grow-only set: add `elem`.
    GAdd {
        /// The element added.
        elem: String,
    },
    /// Add-wins set: add `elem`.
    SAdd {
        /// The element added (tagged with the adding transaction).
        elem: String,
    },
    /// Add-wins set: remove `elem`'s adds by the transactions in `seen` (the adds the
    /// remover's snapshot and its own transaction showed); concurrent adds survive.
    SRem {
        /// The element removed.
        elem: String,
        /// The adding transactions whose tags it removes.
        seen: Vec<TxId>,
    },
}

/// The kind of object an operation reads: a key names one object per kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Last-writer-wins register.
    Register,
    /// Counter.
    Counter,
    /// Max register.
    Max,
    /// Grow-only set.
    GSet,
    /// Add-wins set.
    AwSet,
}

impl Update {
    /// The kind of object it updates.
    pub fn kind(&self) -> Kind {
        match self {
            Update::Set { .. } => Kind::Register,
            Update::Add { .. } => Kind::Counter,
            Update::Max { .. } => Kind::Max,
            Update::GAdd { .. } => Kind::GSet,
            Update::SAdd { .. } | Update::SRem { .. } => Kind::AwSet,
        }
    }
}

/// What a read returned: the object's state as the transaction saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Seen {
    /// A register's value (`None`: never set).
    Register {
        /// The value.
        value: Option<String>,
    },
    /// A counter's value (0 when never updated).
    Counter {
        /// The value.
        value: i64,
    },
    /// A max register's value (`None`: never raised).
    Max {
        /// The value.
        value: Option<i64>,
    },
    /// A set's elements, sorted (either set kind).
    Set {
        /// The elements, sorted.
        elems: Vec<String>,
    },
}

/// One operation of a transaction, in the order the transaction ran them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum TxOp {
    /// A read of `key`'s object of `kind`, and what it returned.
    Read {
        /// The key.
        key: String,
        /// The object's kind.
        kind: Kind,
        /// What the read returned.
        seen: Seen,
    },
    /// An update of `key` (buffered in the transaction until it commits).
    Update {
        /// The key.
        key: String,
        /// The update.
        update: Update,
    },
}

/// How a transaction ended, as its client learned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// Committed; the vector the commit returned (the snapshot for a read-only one).
    Committed {
        /// The vector the commit returned.
        vector: Vector,
    },
    /// The client never learned (its data center failed, its connection broke): the
    /// updates may or may not have committed.
    Unknown,
    /// Abandoned before its commit (nothing of it may be seen).
    Aborted,
}

/// One client transaction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientTx {
    /// Its identity.
    pub id: TxId,
    /// The client session that ran it (one transaction at a time).
    pub session: u64,
    /// The data center of its coordinator.
    pub dc: u32,
    /// The session's past vector it started from.
    pub past: Vector,
    /// Its snapshot vector.
    pub snap: Vector,
    /// When it started (virtual or wall time, ns).
    pub at_ns: u64,
    /// Its place in its session: strictly increasing over the session's transactions and
    /// syncs together (times can tie; this cannot).
    pub order: u64,
    /// Its operations.
    pub ops: Vec<TxOp>,
    /// Whether it is a strong transaction (absent: causal).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub strong: bool,
    /// A strong transaction's label in the conflict relation (absent: it conflicts with
    /// every strong transaction on a common key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// How it ended.
    pub outcome: Outcome,
}

/// An update transaction that committed, as the cluster exchanged it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Committed {
    /// Its identity.
    pub id: TxId,
    /// The data center where it committed.
    pub origin: u32,
    /// Its commit vector.
    pub commit: Vector,
    /// Its updates, in the transaction's order.
    pub writes: Vec<(String, Update)>,
    /// Whether it is a strong transaction (absent: causal).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub strong: bool,
}

/// A session's barrier or attach that returned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sync {
    /// The session.
    pub session: u64,
    /// Where it was called.
    pub dc: u32,
    /// The session's past vector it made uniform (a barrier) or brought (an attach).
    pub past: Vector,
    /// `true`: `UNIFORM_BARRIER`; `false`: `ATTACH`.
    pub barrier: bool,
    /// When it returned.
    pub at_ns: u64,
    /// Its place in its session (as a transaction's `order`).
    pub order: u64,
}

/// From `at_ns` on, data center `dc` stored every transaction of `origin` with a local
/// timestamp up to `through` (its `stableVec[origin]` reached it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stored {
    /// The storing data center.
    pub dc: u32,
    /// The origin data center.
    pub origin: u32,
    /// Its timestamps up to this one.
    pub through: u64,
    /// Since when.
    pub at_ns: u64,
}

/// A data center taken back after its removal: its earlier life failed. Its transactions
/// stamped below `from_ts` (its own entry), its clients' transactions begun before
/// `since_ns`, and what it stored before `since_ns` are of the failed life; the rest are
/// of the new one, which runs as any data center not failed (what happened at `since_ns`
/// itself is of the old life: its replicas' last reports as they were replaced).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Life {
    /// The data center.
    pub dc: u32,
    /// The first timestamp of the new life.
    pub from_ts: u64,
    /// When the new life's replicas started.
    pub since_ns: u64,
    /// What survived of the old life (its own entry): an entry in the new life covers
    /// the old life's transactions only up to it.
    pub cut: u64,
}

impl Life {
    /// Whether an entry `covering` covers timestamp `ts` of this data center: by value,
    /// except that a new-life entry does not cover the old life's lost tail.
    fn covers(&self, ts: u64, covering: u64) -> bool {
        ts <= covering && !(covering >= self.from_ts && ts > self.cut && ts < self.from_ts)
    }
}

/// What a data center's objects held at the end of a run, read after the cluster went
/// quiet (for the convergence check): `(key, kind, seen)`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalState {
    /// The data center (a correct one: it did not fail).
    pub dc: u32,
    /// Every object's state there.
    pub objects: Vec<(String, Kind, Seen)>,
    /// The snapshot the states were read on (absent: not known): every transaction that
    /// must survive is in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snap: Option<Vec<u64>>,
}

impl CausalHistory {
    /// Whether a transaction of `origin` stamped `ts` there is of a failed data center or
    /// of a failed life of one.
    pub fn failed_origin(&self, origin: u32, ts: u64) -> bool {
        self.failed.contains(&origin) || self.lives.iter().any(|l| l.dc == origin && ts < l.from_ts)
    }

    /// Whether an entry `covering` of data center `dc` covers its timestamp `ts`: by
    /// value, a new-life entry covering the old life only up to the cut.
    pub fn entry_covers(&self, dc: u32, ts: u64, covering: u64) -> bool {
        ts <= covering && self.lives.iter().filter(|l| l.dc == dc).all(|l| l.covers(ts, covering))
    }

    /// `a ≤ b` entry-wise, an entry of `b` in a data center's new life covering its old
    /// life only up to the cut (`vector_le` when no data center was taken back).
    pub fn covered(&self, a: &[u64], b: &[u64]) -> bool {
        if !vector_le(a, b) {
            return false;
        }
        self.lives.iter().all(|l| {
            let i = l.dc as usize;
            i >= a.len() || i >= b.len() || l.covers(a[i], b[i])
        })
    }

    /// Whether `snap` is in a new life of a data center whose old life lost a tail: the
    /// writers it covers are then not a prefix of their arbitration order's maxima.
    pub fn past_a_lost_tail(&self, snap: &[u64]) -> bool {
        self.lives.iter().any(|l| snap.get(l.dc as usize).is_some_and(|&e| e >= l.from_ts))
    }

    /// Whether what happened at data center `dc` at `at_ns` happened in a failed data
    /// center or a failed life of one.
    pub fn failed_at(&self, dc: u32, at_ns: u64) -> bool {
        self.failed.contains(&dc) || self.lives.iter().any(|l| l.dc == dc && at_ns <= l.since_ns)
    }
}

/// A whole history.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CausalHistory {
    /// Data centers `0..dcs`.
    pub dcs: u32,
    /// Data-center failures tolerated (`dcs = 2f + 1`).
    pub f: u32,
    /// The data centers that failed during the run.
    pub failed: Vec<u32>,
    /// The data centers taken back, each with the life it started (absent: none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lives: Vec<Life>,
    /// Client transactions.
    pub txs: Vec<ClientTx>,
    /// Update transactions that committed.
    pub committed: Vec<Committed>,
    /// Barriers and attaches that returned.
    pub syncs: Vec<Sync>,
    /// When data centers came to store each origin's transactions.
    pub stored: Vec<Stored>,
    /// The final states of the correct data centers (empty: no convergence check).
    pub finals: Vec<FinalState>,
    /// The conflict relation of strong transactions: pairs of labels (absent: only
    /// unlabelled strong transactions conflict).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conflicts: Vec<(String, String)>,
}
