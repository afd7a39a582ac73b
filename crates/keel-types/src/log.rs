//! What the replicated log holds, shared by the engine (which produces entries) and the
//! storage (which persists them). The byte layout is `keel-storage`'s business
//! (`docs/format.md`); these are the values.

use crate::codec::{CodecError, Decode, Encode, Reader};
use crate::{ClientId, Command, Durability, Epoch, LogIndex, NodeId, RequestId, Version};
use serde::{Deserialize, Serialize};
use std::fmt;

/// One log entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The epoch of the leader that appended it.
    pub epoch: Epoch,
    /// Its position in the log.
    pub index: LogIndex,
    /// What it does when applied.
    pub payload: EntryPayload,
}

/// What an entry does when applied.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EntryPayload {
    /// A new leader's first entry, as leaders before [`EntryPayload::Settings`] wrote it;
    /// commits earlier epochs' entries (Raft §5.4.2). Still read, no longer written.
    Noop,
    /// A new leader's first entry: commits earlier epochs' entries (Raft §5.4.2), and
    /// states the settings every replica applies the log with from this index on, so that
    /// they are the cluster's, not each node's (`docs/protocol.md` §6, *Settings in the
    /// log*).
    Settings(ApplySettings),
    /// A client write. `(client, request)` deduplicates retries: applying the same pair
    /// twice returns the first result and changes nothing.
    Write {
        /// The writing client.
        client: ClientId,
        /// The client's sequence number for this request.
        request: RequestId,
        /// The durability the client asked for (recorded for recovery and metrics).
        durability: Durability,
        /// The operation; never a `Get` or `Scan`.
        command: Command,
    },
    /// The leader's expiry: deletes each of `keys` whose expiry is at or before `now_ms`
    /// (a key given a later expiry or none since is left alone). Expired keys leave the
    /// state only through these entries, so an expiry is ordered, replicated and made
    /// durable as every other write is (`docs/protocol.md` §6, *Expiry*).
    Reap {
        /// The leader's clock, unix milliseconds.
        now_ms: u64,
        /// The keys, in increasing order, 1 to [`crate::REAP_KEYS_MAX`].
        keys: Vec<crate::Key>,
    },
    /// The keyspace's membership from this entry on: it takes effect on every replica
    /// when the entry is appended (and so applied), and is undone with it if the log is
    /// cut (`docs/protocol.md` §15, *Membership changes*). Each differs from the one
    /// before by one node.
    Membership(Membership),
}

/// Who replicates a keyspace: the voters, whose majorities commit entries, elect leaders
/// and make writes durable, and the learners, which receive the log and count for none of
/// it, until promoted. Both lists are sorted and disjoint.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Membership {
    /// The voting members, in id order: [`Membership::VOTERS_MIN`] to
    /// [`Membership::VOTERS_MAX`].
    pub voters: Vec<NodeId>,
    /// The learners, in id order: at most [`Membership::LEARNERS_MAX`].
    pub learners: Vec<NodeId>,
}

impl Membership {
    /// Fewest voters a keyspace may have (one alone would elect itself without asking).
    pub const VOTERS_MIN: usize = 2;
    /// Most voters a keyspace may have.
    pub const VOTERS_MAX: usize = 7;
    /// Most learners a keyspace may have at once.
    pub const LEARNERS_MAX: usize = 2;

    /// The membership of `voters` and no learners.
    pub fn of_voters(mut voters: Vec<NodeId>) -> Membership {
        voters.sort();
        Membership { voters, learners: Vec::new() }
    }

    /// Whether both lists are sorted, free of duplicates, disjoint and within bounds (what
    /// a decoder and the engine's gate accept).
    pub fn valid(&self) -> bool {
        let sorted = |ids: &[NodeId]| ids.windows(2).all(|w| w[0] < w[1]);
        (Self::VOTERS_MIN..=Self::VOTERS_MAX).contains(&self.voters.len())
            && self.learners.len() <= Self::LEARNERS_MAX
            && sorted(&self.voters)
            && sorted(&self.learners)
            && self.learners.iter().all(|l| self.voters.binary_search(l).is_err())
    }

    /// Whether `node` votes.
    pub fn is_voter(&self, node: NodeId) -> bool {
        self.voters.binary_search(&node).is_ok()
    }

    /// Whether `node` is a voter or a learner.
    pub fn contains(&self, node: NodeId) -> bool {
        self.is_voter(node) || self.learners.binary_search(&node).is_ok()
    }

    /// A strict majority of the voters.
    pub fn majority(&self) -> usize {
        self.voters.len() / 2 + 1
    }

    /// Every node, voters then learners.
    pub fn nodes(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.voters.iter().chain(self.learners.iter()).copied()
    }

    /// The membership `op` leads to from this one, or why it may not be applied. `None`
    /// for a change already in effect (adding a learner that is one, promoting a voter,
    /// removing a node that is not a member), which is answered as done.
    pub fn changed(&self, op: crate::ClusterOp) -> Result<Option<Membership>, String> {
        let mut next = self.clone();
        match op {
            crate::ClusterOp::AddLearner(node) => {
                if self.is_voter(node) {
                    return Err(format!("node {} is already a voter", node.0));
                }
                if self.contains(node) {
                    return Ok(None);
                }
                if self.learners.len() >= Self::LEARNERS_MAX {
                    return Err(format!("at most {} learners at once", Self::LEARNERS_MAX));
                }
                next.learners.push(node);
                next.learners.sort();
            }
            crate::ClusterOp::Promote(node) => {
                if self.is_voter(node) {
                    return Ok(None);
                }
                if !self.contains(node) {
                    return Err(format!("node {} is not a learner: add it first", node.0));
                }
                if self.voters.len() >= Self::VOTERS_MAX {
                    return Err(format!("at most {} voters", Self::VOTERS_MAX));
                }
                next.learners.retain(|l| *l != node);
                next.voters.push(node);
                next.voters.sort();
            }
            crate::ClusterOp::Remove(node) => {
                if !self.contains(node) {
                    return Ok(None);
                }
                if self.is_voter(node) && self.voters.len() <= Self::VOTERS_MIN {
                    return Err(format!("a keyspace keeps at least {} voters", Self::VOTERS_MIN));
                }
                next.voters.retain(|v| *v != node);
                next.learners.retain(|l| *l != node);
            }
            crate::ClusterOp::TransferLeader(_) => {
                return Err("a leadership transfer changes no membership".into())
            }
            crate::ClusterOp::Return(_) => {
                return Err("KEEL.NODE RETURN takes a removed data center of a geo keyspace back; this keyspace has no data centers".into())
            }
        }
        assert!(next.valid(), "a change keeps the membership valid: {next:?}");
        Ok(Some(next))
    }
}

impl fmt::Display for Membership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ids =
            |ids: &[NodeId]| ids.iter().map(|n| n.0.to_string()).collect::<Vec<_>>().join(",");
        write!(f, "voters [{}] learners [{}]", ids(&self.voters), ids(&self.learners))
    }
}

/// The settings that decide how a replica applies the log: every replica must apply an
/// entry with the same ones, so they travel in the log ([`EntryPayload::Settings`]) and in
/// snapshots, never from a node's own configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplySettings {
    /// Most clients whose last write result is kept for deduplication (oldest out): which
    /// retry is answered from the table and which is applied again depends on it. In
    /// `1..=`[`crate::limits::DEDUP_CLIENTS_CEILING`].
    pub dedup_clients_max: u32,
}

impl ApplySettings {
    /// Whether every setting is in range (what a decoder and the engine's gate accept).
    pub fn valid(&self) -> bool {
        (1..=crate::limits::DEDUP_CLIENTS_CEILING).contains(&self.dedup_clients_max)
    }
}

impl Entry {
    /// The entry's version.
    pub fn version(&self) -> Version {
        Version { epoch: self.epoch, index: self.index }
    }
}

/// A record of an engine's durable log: what storage appends, syncs, recovers in order and
/// compacts under a snapshot, whatever the engine puts in it. Each engine kind names its
/// own (`Engine::Record`): the leader engine's is [`Entry`]; an engine that keeps no log
/// names [`NoRecord`].
///
/// Storage relies on the version alone: records are appended at consecutive indexes from
/// the snapshot's end, their epochs never decrease along the log, and a seal names the
/// version of the record it follows. Everything else is the engine's.
pub trait LogRecord:
    Clone + fmt::Debug + PartialEq + Eq + Encode + Decode + Serialize + Send + Sync + 'static
{
    /// Whether the engine keeps a log at all: storage of an engine that keeps none refuses
    /// a directory holding log segments (another engine kind's) rather than reading them.
    const KEEPS_LOG: bool = true;

    /// Its position in the log and the epoch it was written in.
    fn version(&self) -> Version;

    /// The bytes of client keys and values it carries (what bounds a page of the log a
    /// node hands out for inspection).
    fn payload_bytes(&self) -> usize {
        0
    }
}

impl LogRecord for Entry {
    fn version(&self) -> Version {
        Entry::version(self)
    }

    fn payload_bytes(&self) -> usize {
        match &self.payload {
            EntryPayload::Write { command, .. } => command.payload_bytes(),
            EntryPayload::Reap { keys, .. } => keys.iter().map(|key| key.len()).sum(),
            EntryPayload::Noop | EntryPayload::Settings(_) | EntryPayload::Membership(_) => 0,
        }
    }
}

/// The record of an engine that keeps no log: there is none. Its storage holds the hard
/// state (and snapshots, if the engine takes them) and an always-empty log; a record that
/// claims to be one never decodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NoRecord {}

impl LogRecord for NoRecord {
    const KEEPS_LOG: bool = false;

    fn version(&self) -> Version {
        match *self {}
    }
}

impl Encode for NoRecord {
    fn encode_to(&self, _out: &mut Vec<u8>) {
        match *self {}
    }
}

impl Decode for NoRecord {
    fn decode_from(reader: &mut Reader<'_>) -> Result<Self, CodecError> {
        let tag = reader.u8("record")?;
        Err(CodecError::UnknownTag { what: "record of an engine without a log", tag })
    }
}

/// State that must be on disk before any message that depends on it is sent: the epoch a
/// node has seen and whom it voted for in it (`docs/protocol.md` §12 item 8).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HardState {
    /// The highest epoch this node has seen.
    pub epoch: Epoch,
    /// The candidate this node voted for in `epoch`, if any.
    pub voted_for: Option<NodeId>,
    /// Set when recovery found damaged records inside the log (corruption, not a torn
    /// tail) and had to cut the log before them: the last entry the log held before the
    /// damage, as far as the disk still shows it. Until the log is durable again through
    /// that index (repaired from a leader), the node votes as if it still held those
    /// entries and never campaigns (`docs/protocol.md` §12 item 18).
    #[serde(default)]
    pub repair_floor: Option<Version>,
    /// Kite keyspaces: the epoch of the newest membership this node took (0: never
    /// changed). A restarted node rejoins only once it learned a membership at least this
    /// new (`docs/kite.md`, Membership changes). Leader engines keep 0.
    #[serde(default)]
    pub members_epoch: u64,
}

/// Describes a snapshot: the state after applying every entry up to `last_index`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotMeta {
    /// The last entry the snapshot includes.
    pub last_index: LogIndex,
    /// That entry's epoch (to check log matching at the snapshot boundary).
    pub last_epoch: Epoch,
}
