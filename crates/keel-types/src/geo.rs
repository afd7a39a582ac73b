//! The client-facing vocabulary of geo keyspaces (UniStore's causal transactions,
//! `docs/geo.md`): vector clocks, transaction ids, the object kinds a key names and their
//! updates, the objects' merge rules, and a transaction's operations and results. The
//! geo engine (`keel_core::geo`) is built on these; the front door and keel-client speak
//! them too.
//!
//! The objects' merge rules (`docs/geo.md`, *Values*): an object's state on a snapshot is
//! its updates in that snapshot applied in arbitration order, a linear extension of the
//! causal order (by the sum of the commit vectors, then the origin, then the transaction);
//! a transaction's own updates come after them, in its order. Counters, max registers and
//! the sets commute, so every order gives them the same state; a register keeps the
//! arbitration's last write.

use crate::{Key, Value};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// A vector clock: one timestamp per data center and the strong entry (`commitVec`,
/// `snapVec`, `pastVec`, `knownVec`, `stableVec`; `uniformVec` leaves its strong entry
/// at 0). Compared entry by entry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Vector {
    /// One timestamp per data center, by index.
    pub dcs: Vec<u64>,
    /// The strong entry (strong transactions' timestamps; 0 while none exists).
    pub strong: u64,
}

impl Vector {
    /// The zero vector of `dcs` data centers.
    pub fn zero(dcs: usize) -> Vector {
        Vector { dcs: vec![0; dcs], strong: 0 }
    }

    /// Whether every entry of `self` is at most `other`'s (vectors of one keyspace have
    /// one length; of two lengths, never).
    pub fn le(&self, other: &Vector) -> bool {
        self.dcs.len() == other.dcs.len()
            && self.strong <= other.strong
            && self.dcs.iter().zip(&other.dcs).all(|(a, b)| a <= b)
    }

    /// Raises every entry to at least `other`'s.
    pub fn join(&mut self, other: &Vector) {
        debug_assert_eq!(self.dcs.len(), other.dcs.len());
        for (a, b) in self.dcs.iter_mut().zip(&other.dcs) {
            *a = (*a).max(*b);
        }
        self.strong = self.strong.max(other.strong);
    }

    /// The sum of every entry: strictly larger for a vector strictly above, so ordering
    /// by it extends the vector order (the arbitration of `docs/geo.md`, *Values*).
    pub fn sum(&self) -> u128 {
        self.dcs.iter().map(|&t| u128::from(t)).sum::<u128>() + u128::from(self.strong)
    }

    /// The entries as one list, the strong entry last (the history format's vectors).
    pub fn flat(&self) -> Vec<u64> {
        let mut out = self.dcs.clone();
        out.push(self.strong);
        out
    }
}

/// The longest label a strong transaction may carry, in bytes.
pub const LABEL_MAX: usize = 64;

/// A transaction's identity: the node that coordinated it and its number there.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct TxId {
    /// The coordinating node.
    pub node: u32,
    /// Its number at that node (numbers start past the node's boot time in µs, so that
    /// a restarted node never reuses one).
    pub seq: u64,
}

/// The type of an object: a key names one object per kind.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub enum Kind {
    /// A last-writer-wins register of bytes.
    #[default]
    Register,
    /// A counter (sum of its additions).
    Counter,
    /// A max register (the largest value set).
    Max,
    /// A grow-only set of byte strings.
    GSet,
    /// An add-wins set of byte strings: a remove removes only the adds it saw.
    AwSet,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 5] = [Kind::Register, Kind::Counter, Kind::Max, Kind::GSet, Kind::AwSet];
}

/// An update of one object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Update {
    /// Register: set the value.
    Set(Value),
    /// Counter: add (negative: subtract).
    Add(i64),
    /// Max register: raise to at least this.
    Max(i64),
    /// Grow-only set: add the element.
    GAdd(Value),
    /// Add-wins set: add the element.
    SAdd(Value),
    /// Add-wins set: remove the element's adds by these transactions (the ones the
    /// remover saw; the coordinator fills them in from the state it read).
    SRem(Value, Vec<TxId>),
}

impl Update {
    /// The kind of object it updates.
    pub fn kind(&self) -> Kind {
        match self {
            Update::Set(_) => Kind::Register,
            Update::Add(_) => Kind::Counter,
            Update::Max(_) => Kind::Max,
            Update::GAdd(_) => Kind::GSet,
            Update::SAdd(_) | Update::SRem(..) => Kind::AwSet,
        }
    }

    /// Bytes of client data it carries.
    pub fn bytes(&self) -> usize {
        match self {
            Update::Set(v) | Update::GAdd(v) | Update::SAdd(v) => v.len(),
            Update::SRem(v, seen) => v.len() + 12 * seen.len(),
            Update::Add(_) | Update::Max(_) => 8,
        }
    }
}

/// Where a register's value stands in the arbitration order: later wins.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Arbitration {
    /// The sum of the writer's commit vector (larger for every causal successor).
    pub sum: u128,
    /// The writer's data center.
    pub origin: u32,
    /// The writer.
    pub tx: TxId,
}

/// An object's state, as a partition rebuilds it from its operation log for a snapshot
/// and a coordinator extends it with the transaction's own updates.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Object {
    /// A register: its value and the write that set it (`None`: never set).
    Register(Option<(Value, Arbitration)>),
    /// A counter.
    Counter(i64),
    /// A max register (`None`: never raised).
    Max(Option<i64>),
    /// A grow-only set.
    GSet(BTreeSet<Value>),
    /// An add-wins set: each element with the transactions whose adds are still in.
    AwSet(BTreeMap<Value, BTreeSet<TxId>>),
}

/// How a geo keyspace's refusal of an operation on a transaction it no longer holds
/// begins (dropped after its idle time-out, or never begun): the front door then forgets
/// the connection's transaction too.
pub const TX_GONE: &str = "no such transaction is open on this connection";

/// A client's operation in a geo keyspace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GeoOp {
    /// `START_TX(past)`: open a transaction on a snapshot that includes `past`.
    Begin {
        /// The session's past vector (empty, in this and the other operations that carry
        /// one: a session with no past yet).
        past: Vector,
    },
    /// Read `key`'s object of `kind` in transaction `tx`.
    Read {
        /// The transaction.
        tx: TxId,
        /// The key.
        key: Key,
        /// Which of its objects.
        kind: Kind,
    },
    /// Buffer `update` of `key` in transaction `tx`; the reply is the object after it.
    Update {
        /// The transaction.
        tx: TxId,
        /// The key.
        key: Key,
        /// The update.
        update: Update,
    },
    /// `COMMIT_CAUSAL(tx)`.
    Commit {
        /// The transaction.
        tx: TxId,
    },
    /// Drop transaction `tx` without committing it.
    Abort {
        /// The transaction.
        tx: TxId,
    },
    /// `UNIFORM_BARRIER(past)`: answer once everything in `past` is uniform.
    Barrier {
        /// The session's past vector.
        past: Vector,
    },
    /// `ATTACH(past)`: answer once this data center's uniform snapshot covers `past`'s
    /// entries of the other data centers (a session that came from another one).
    Attach {
        /// The past vector the session brought.
        past: Vector,
    },
    /// `START_TX(past)` of a strong transaction: its commit is certified against the
    /// strong transactions it conflicts with, and aborts if it missed one.
    BeginStrong {
        /// The session's past vector.
        past: Vector,
        /// Its label in the conflict relation (`None`: it conflicts with every strong
        /// transaction on a common key).
        label: Option<String>,
    },
    /// Remove the data center of `member` from the keyspace for good (`KEEL.NODE REMOVE
    /// id`, an operator's): it counts as failed from then on, its members stop serving
    /// once told, and the others stop keeping anything for it.
    RemoveDc {
        /// Any member of the data center.
        member: crate::NodeId,
    },
    /// Take the removed data center of `member` back, with fresh replicas (an
    /// operator's). Only the agreement is built: the return is recorded, and the data
    /// center stays removed meanwhile (`docs/geo.md`, *Taking a data center back*).
    ReturnDc {
        /// Any member of the data center.
        member: crate::NodeId,
    },
}

impl GeoOp {
    /// The key it reads or updates, if any.
    pub fn key(&self) -> Option<&Key> {
        match self {
            GeoOp::Read { key, .. } | GeoOp::Update { key, .. } => Some(key),
            _ => None,
        }
    }

    /// Bytes of client data it carries.
    pub fn payload_bytes(&self) -> usize {
        match self {
            GeoOp::Read { key, .. } => key.len(),
            GeoOp::Update { key, update, .. } => key.len() + update.bytes(),
            GeoOp::Begin { past } | GeoOp::Barrier { past } | GeoOp::Attach { past } => {
                8 * (past.dcs.len() + 1)
            }
            GeoOp::BeginStrong { past, label } => {
                8 * (past.dcs.len() + 1) + label.as_ref().map_or(0, String::len)
            }
            GeoOp::Commit { .. }
            | GeoOp::Abort { .. }
            | GeoOp::RemoveDc { .. }
            | GeoOp::ReturnDc { .. } => 0,
        }
    }

    /// Whether it changes state (an update, a commit).
    pub fn is_write(&self) -> bool {
        matches!(
            self,
            GeoOp::Update { .. }
                | GeoOp::Commit { .. }
                | GeoOp::RemoveDc { .. }
                | GeoOp::ReturnDc { .. }
        )
    }

    /// Its name as users and metrics see it.
    pub fn name(&self) -> &'static str {
        match self {
            GeoOp::Begin { .. } => "tx-begin",
            GeoOp::BeginStrong { .. } => "tx-begin-strong",
            GeoOp::Read { .. } => "tx-read",
            GeoOp::Update { .. } => "tx-update",
            GeoOp::Commit { .. } => "tx-commit",
            GeoOp::Abort { .. } => "tx-abort",
            GeoOp::Barrier { .. } => "barrier",
            GeoOp::Attach { .. } => "attach",
            GeoOp::RemoveDc { .. } => "remove-dc",
            GeoOp::ReturnDc { .. } => "return-dc",
        }
    }

    /// Checks its key and value against `limits` (the engine checks the rest: vectors
    /// against its data centers, transactions against its own).
    pub fn validate(&self, limits: &crate::Limits) -> Result<(), crate::KeelError> {
        if let Some(key) = self.key() {
            limits.check_key(key)?;
        }
        if let GeoOp::BeginStrong { label: Some(label), .. } = self {
            if label.is_empty() || label.len() > LABEL_MAX {
                return Err(crate::KeelError::InvalidArgument(format!(
                    "a transaction label of 1 to {LABEL_MAX} bytes"
                )));
            }
        }
        match self {
            GeoOp::Update {
                update: Update::Set(v) | Update::GAdd(v) | Update::SAdd(v) | Update::SRem(v, _),
                ..
            } => limits.check_value(v),
            _ => Ok(()),
        }
    }
}

/// What a geo operation returns.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GeoResult {
    /// A transaction began on snapshot `snap`.
    Began {
        /// Its identity.
        tx: TxId,
        /// Its snapshot vector.
        snap: Vector,
    },
    /// An object's state (after the update, for an update).
    Object(Object),
    /// Committed; the session's new past vector (the snapshot, for a read-only one).
    Committed {
        /// The vector.
        vector: Vector,
    },
    /// The transaction was dropped.
    Aborted,
    /// The barrier or attach holds.
    Synced,
}

impl Object {
    /// The state of an object of `kind` no update touched.
    pub fn empty(kind: Kind) -> Object {
        match kind {
            Kind::Register => Object::Register(None),
            Kind::Counter => Object::Counter(0),
            Kind::Max => Object::Max(None),
            Kind::GSet => Object::GSet(BTreeSet::new()),
            Kind::AwSet => Object::AwSet(BTreeMap::new()),
        }
    }

    /// Its kind.
    pub fn kind(&self) -> Kind {
        match self {
            Object::Register(_) => Kind::Register,
            Object::Counter(_) => Kind::Counter,
            Object::Max(_) => Kind::Max,
            Object::GSet(_) => Kind::GSet,
            Object::AwSet(_) => Kind::AwSet,
        }
    }

    /// Applies `update` by the transaction `arb` names. An update of another kind
    /// changes nothing (callers only apply an object's own kind). A counter saturates.
    pub fn apply(&mut self, update: &Update, arb: Arbitration) {
        match (self, update) {
            (Object::Register(slot), Update::Set(value))
                if slot.as_ref().is_none_or(|(_, at)| *at <= arb) =>
            {
                *slot = Some((value.clone(), arb));
            }
            (Object::Counter(n), Update::Add(delta)) => *n = n.saturating_add(*delta),
            (Object::Max(m), Update::Max(v)) => *m = Some(m.map_or(*v, |m| m.max(*v))),
            (Object::GSet(set), Update::GAdd(elem)) => {
                set.insert(elem.clone());
            }
            (Object::AwSet(set), Update::SAdd(elem)) => {
                set.entry(elem.clone()).or_default().insert(arb.tx);
            }
            (Object::AwSet(set), Update::SRem(elem, seen)) => {
                if let Some(tags) = set.get_mut(elem) {
                    for tx in seen {
                        tags.remove(tx);
                    }
                    if tags.is_empty() {
                        set.remove(elem);
                    }
                }
            }
            _ => {}
        }
    }

    /// The adds of `elem` this add-wins set holds (what a remove of it removes).
    pub fn adds_of(&self, elem: &[u8]) -> Vec<TxId> {
        match self {
            Object::AwSet(set) => {
                set.get(elem).map(|tags| tags.iter().copied().collect()).unwrap_or_default()
            }
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Value as Bytes;

    fn arb(sum: u128, node: u32) -> Arbitration {
        Arbitration { sum, origin: node, tx: TxId { node, seq: 1 } }
    }

    #[test]
    fn concurrent_deposits_sum_in_any_order() {
        let (a, b) = (Update::Add(100), Update::Add(200));
        let mut one = Object::empty(Kind::Counter);
        one.apply(&a, arb(1, 1));
        one.apply(&b, arb(2, 2));
        let mut two = Object::empty(Kind::Counter);
        two.apply(&b, arb(2, 2));
        two.apply(&a, arb(1, 1));
        assert_eq!(one, Object::Counter(300));
        assert_eq!(one, two);
    }

    #[test]
    fn a_register_keeps_the_last_write_in_arbitration_order_whatever_the_arrival() {
        let mut r = Object::empty(Kind::Register);
        r.apply(&Update::Set(Bytes::from_static(b"late")), arb(9, 1));
        r.apply(&Update::Set(Bytes::from_static(b"early")), arb(3, 2));
        assert!(matches!(&r, Object::Register(Some((v, _))) if v == "late"));
    }

    #[test]
    fn a_remove_takes_only_the_adds_it_saw() {
        let x = Bytes::from_static(b"x");
        let mut s = Object::empty(Kind::AwSet);
        s.apply(&Update::SAdd(x.clone()), arb(1, 1));
        let seen = s.adds_of(&x);
        s.apply(&Update::SAdd(x.clone()), arb(2, 2));
        s.apply(&Update::SRem(x.clone(), seen), arb(3, 3));
        assert_eq!(s.adds_of(&x), vec![TxId { node: 2, seq: 1 }], "the concurrent add wins");
    }
}
