//! The Kite engine's types: stamps and ballots, client operations and results, peer
//! messages, configuration and status.

use crate::engine::RequestTag;
use crate::time::Span;
use keel_types::{KeelError, Key, NodeId, Value};
use serde::{Deserialize, Serialize};

/// A write's place in its key's total order: the paper's carstamp, a Lamport clock
/// ⟨version, writer⟩ extended with the number of read-modify-writes serialized after the
/// write that clock names. Compared lexicographically (version, writer, rmw).
///
/// `writer` names the node that created the clock: its id in the high 32 bits and its
/// incarnation in the low 32, so that a restarted node never reuses a clock its earlier
/// incarnation may have handed out.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Stamp {
    /// The Lamport version.
    pub version: u64,
    /// The creating node and incarnation (`node << 32 | incarnation`).
    pub writer: u64,
    /// Read-modify-writes serialized after the write ⟨version, writer⟩ names.
    pub rmw: u64,
}

impl Stamp {
    /// Every key's initial value (absent) carries this stamp.
    pub const ZERO: Stamp = Stamp { version: 0, writer: 0, rmw: 0 };

    /// The writer id of `node` in incarnation `incarnation`.
    pub fn writer_of(node: NodeId, incarnation: u32) -> u64 {
        (u64::from(node.0) << 32) | u64::from(incarnation)
    }

    /// A fresh write's stamp, ordered after `after`, created by `writer`.
    pub fn next_write(after: u64, writer: u64) -> Stamp {
        Stamp { version: after.saturating_add(1), writer, rmw: 0 }
    }

    /// The stamp of a read-modify-write serialized right after the write stamped `self`.
    pub fn next_rmw(self) -> Stamp {
        Stamp { rmw: self.rmw.saturating_add(1), ..self }
    }
}

/// A Paxos ballot for one key's read-modify-writes: a round and the proposing node.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Ballot {
    /// The round. A node never proposes two ballots with the same round.
    pub round: u64,
    /// The proposer's writer id (node and incarnation, as in [`Stamp::writer`]): breaks
    /// ties, and keeps a restarted node's ballots apart from its earlier life's.
    pub proposer: u64,
}

/// Names a read-modify-write for exactly-once execution: the node that took the request,
/// the session and the request's place in it; or, for a request the client named itself
/// (`KEEL.REQ`), [`RmwId::CLIENT`], the client's id and its request number, so that a
/// retry of the request at any node goes by the same id.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct RmwId {
    /// The node whose session issued it, as its writer id (node and incarnation, as in
    /// [`Stamp::writer`]): a restarted node's requests never match its earlier life's.
    pub node: u64,
    /// The session.
    pub session: u64,
    /// The request's sequence number within the session.
    pub seq: u64,
}

impl RmwId {
    /// The `node` of a request its client named: no node's writer id (node ids start at
    /// 1, so writer ids at 2^32).
    pub const CLIENT: u64 = 0;

    /// Whether the client named this request (and may retry it at another node).
    pub fn client_named(&self) -> bool {
        self.node == RmwId::CLIENT
    }

    /// Whether both requests come from one client (one session, or one named client).
    pub fn same_client(&self, other: &RmwId) -> bool {
        self.node == other.node && self.session == other.session
    }
}

/// The most records one record carries as applied before it.
pub const SKIPPED_MAX: usize = 16;

/// A read-modify-write accepted by a replica: what a later proposer must help finish.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RmwRecord {
    /// Which request.
    pub id: RmwId,
    /// The value it writes.
    pub value: Value,
    /// The stamp it writes (its base's stamp, `next_rmw`).
    pub stamp: Stamp,
    /// What the request does ([`KiteOp::rmw_digest`]).
    pub digest: u64,
    /// The value it read (its base), returned to its client.
    pub read: Option<Value>,
    /// The stamp of the value it read.
    pub read_stamp: Stamp,
    /// The read-modify-write that made the value it read, if one did, with its outcome:
    /// acceptors record it, so that a proposer that lost track of that request finds it
    /// done even after later writes covered it.
    pub base: Option<Box<(RmwId, RmwOutcome)>>,
    /// Records declared applied with this one: an accepted record its proposer found
    /// covered by a newer value, with what that record built on and carried (at most
    /// [`SKIPPED_MAX`]). The commit makes every receiver record them done.
    pub skipped: Vec<(RmwId, RmwOutcome)>,
    /// What the committed record this one builds on (`base`) carried as `skipped`:
    /// chosen with it, so acceptors record them done on Accept, as they record `base`
    /// (at most [`SKIPPED_MAX`]). Its commit may have reached only nodes since gone.
    pub settled: Vec<(RmwId, RmwOutcome)>,
}

impl RmwRecord {
    /// Whether `pred` holds for the request of this record, or for one it builds on or
    /// carries.
    pub fn involves(&self, pred: impl Fn(&RmwId) -> bool) -> bool {
        pred(&self.id)
            || self.base.as_ref().is_some_and(|b| pred(&b.0))
            || self.skipped.iter().chain(&self.settled).any(|(id, _)| pred(id))
    }
}

/// What a committed read-modify-write returned, kept per session by every replica so a
/// proposer that lost track of its own request learns it was done.
///
/// A request its client named that failed (a compare-and-swap whose comparison failed,
/// an FAA on a value that is not a number) is committed too, as a record that keeps the
/// value it read: `stamp == read_stamp`, nothing written. So a retry and the first
/// attempt agree on one outcome (see `docs/kite.md`, Retries).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RmwOutcome {
    /// The request's sequence number in its session.
    pub seq: u64,
    /// The value read.
    pub read: Option<Value>,
    /// The stamp read.
    pub read_stamp: Stamp,
    /// The value written.
    pub value: Value,
    /// The stamp written.
    pub stamp: Stamp,
    /// What the request did ([`KiteOp::rmw_digest`]).
    pub digest: u64,
}

impl RmwOutcome {
    /// The stamp the request wrote; `None` for a failure committed as a record that
    /// keeps the value it read.
    pub fn wrote(&self) -> Option<Stamp> {
        (self.stamp != self.read_stamp).then_some(self.stamp)
    }
}

impl RmwRecord {
    /// The stamp the record writes; `None` for a failure that keeps the value it read
    /// (see [`RmwOutcome`]).
    pub fn wrote(&self) -> Option<Stamp> {
        (self.stamp != self.read_stamp).then_some(self.stamp)
    }

    /// Whether the record writes right after its base, or is a failure of a named request
    /// that keeps the value it read (the validation gate drops any other).
    pub fn well_formed(&self) -> bool {
        let kept = self.stamp == self.read_stamp
            && self.id.client_named()
            && self.read.as_ref().map_or(self.value.is_empty(), |read| *read == self.value);
        self.stamp == self.read_stamp.next_rmw() || kept
    }
}

/// One operation of a session (the paper's Table 1).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum KiteOp {
    /// A relaxed read: local when the key is in-epoch.
    Read {
        /// The key.
        key: Key,
    },
    /// A relaxed write: applied locally and broadcast; completes at once.
    Write {
        /// The key.
        key: Key,
        /// The value.
        value: Value,
    },
    /// An acquire read (ABD, with the delinquency query).
    Acquire {
        /// The key.
        key: Key,
    },
    /// A release write (the release barrier, then ABD).
    Release {
        /// The key.
        key: Key,
        /// The value.
        value: Value,
    },
    /// Fetch-and-add on a decimal i64 (absent counts as 0): a read-modify-write.
    Faa {
        /// The key.
        key: Key,
        /// The amount added.
        delta: i64,
    },
    /// Compare-and-swap: a read-modify-write when the comparison holds. A weak one that
    /// fails against the local copy completes at once as a relaxed read would.
    Cas {
        /// The key.
        key: Key,
        /// The value required (`None`: absent).
        expected: Option<Value>,
        /// The value written when it holds.
        new: Value,
        /// Strong: always compares at a quorum. Weak: may fail locally.
        strong: bool,
    },
    /// One step of a membership change towards these voters (an operator's, never a
    /// client's): from a settled membership to the joint one, or, once a majority of the
    /// new voters read the old voters' state, from the joint one to the new voters alone
    /// (`engine/membership.rs`). Made by a compare-and-swap on [`MEMBERSHIP_KEY`]; the
    /// caller asks again until [`Status::membership`] shows the voters settled.
    Reconfigure {
        /// [`MEMBERSHIP_KEY`] (the key whose read-modify-writes the step queues behind).
        key: Key,
        /// The voters wanted.
        wanted: VotersWanted,
    },
}

/// The voters a membership change asks for: a list, or one node more or fewer than the
/// voters the membership moves to, which an operator asks by naming the node
/// (`KEEL.NODE ADD|REMOVE id`, `keel node`), so that asking again is the same request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum VotersWanted {
    /// Exactly these, sorted, without repeats.
    Exactly(Vec<NodeId>),
    /// `from` with this node.
    With(NodeId),
    /// `from` without this node.
    Without(NodeId),
}

impl VotersWanted {
    /// The voters wanted, starting from `from` (sorted).
    pub fn resolve(&self, from: &[NodeId]) -> Vec<NodeId> {
        let mut voters = match self {
            VotersWanted::Exactly(voters) => return voters.clone(),
            VotersWanted::With(node) => [from, &[*node]].concat(),
            VotersWanted::Without(node) => from.iter().copied().filter(|v| v != node).collect(),
        };
        voters.sort_unstable();
        voters.dedup();
        voters
    }

    /// Whether `m` is settled on what is wanted: no change under way, and the voters
    /// those wanted starting from themselves.
    pub fn met_by(&self, m: &Membership) -> bool {
        m.next.is_none() && self.resolve(&m.voters) == m.voters
    }
}

/// The reserved key under which a Kite keyspace keeps its membership, chosen by
/// compare-and-swaps as any key's value is (`engine/membership.rs`). No client request
/// reaches it: keys in `keel_types::RESERVED_KEY_PREFIX` are refused at admission.
pub const MEMBERSHIP_KEY: &[u8] = b"\xff\xffkeel\x00kite-membership";

/// A Kite keyspace's membership: its voters, and while a change is under way the voters it
/// moves to. While `next` is set every quorum is a majority of both.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Membership {
    /// Raised by every change: the value at [`MEMBERSHIP_KEY`] of epoch `e` is replaced
    /// only by one of epoch `e + 1`. Epoch 0 is the configured voters (the key absent).
    pub epoch: u64,
    /// The voters, sorted.
    pub voters: Vec<NodeId>,
    /// During a change: the voters it moves to, sorted.
    pub next: Option<Vec<NodeId>>,
}

impl Membership {
    /// The most voters a membership names on either side.
    pub const VOTERS_MAX: usize = 63;

    /// The bytes kept at [`MEMBERSHIP_KEY`].
    pub fn encode(&self) -> Value {
        Value::from(serde_json::to_vec(self).expect("a membership encodes"))
    }

    /// The membership kept in `bytes`, if they hold a valid one.
    pub fn decode(bytes: &[u8]) -> Option<Membership> {
        let m: Membership = serde_json::from_slice(bytes).ok()?;
        m.valid().then_some(m)
    }

    /// Both sides sorted, without repeats, 1 to [`Membership::VOTERS_MAX`] voters.
    pub fn valid(&self) -> bool {
        let side = |v: &[NodeId]| {
            !v.is_empty() && v.len() <= Self::VOTERS_MAX && v.windows(2).all(|w| w[0] < w[1])
        };
        side(&self.voters) && self.next.as_deref().is_none_or(side)
    }

    /// The voters once the change under way (if any) is done.
    pub fn target(&self) -> &[NodeId] {
        self.next.as_deref().unwrap_or(&self.voters)
    }

    /// Whether `node` votes on either side.
    pub fn contains(&self, node: NodeId) -> bool {
        self.voters.contains(&node) || self.target().contains(&node)
    }
}

impl KiteOp {
    /// The key the operation touches.
    pub fn key(&self) -> &Key {
        match self {
            KiteOp::Read { key }
            | KiteOp::Write { key, .. }
            | KiteOp::Acquire { key }
            | KiteOp::Release { key, .. }
            | KiteOp::Faa { key, .. }
            | KiteOp::Cas { key, .. }
            | KiteOp::Reconfigure { key, .. } => key,
        }
    }

    /// A step of a membership change towards `voters` (sorted here).
    pub fn reconfigure(mut voters: Vec<NodeId>) -> KiteOp {
        voters.sort_unstable();
        voters.dedup();
        KiteOp::reconfigure_to(VotersWanted::Exactly(voters))
    }

    /// A step of a membership change towards the voters `wanted`.
    pub fn reconfigure_to(wanted: VotersWanted) -> KiteOp {
        KiteOp::Reconfigure { key: Key::from_static(MEMBERSHIP_KEY), wanted }
    }

    /// Whether it is a read-modify-write (FAA or CAS).
    pub fn is_rmw(&self) -> bool {
        matches!(self, KiteOp::Faa { .. } | KiteOp::Cas { .. })
    }

    /// A digest of what a read-modify-write does (its kind, key and arguments; not a
    /// CAS's strength, since a weak one is sent again as a strong one), kept with its
    /// outcome: a request number its client used again for another command is refused,
    /// not answered with the first command's outcome. FNV-1a, fixed across versions.
    pub fn rmw_digest(&self) -> u64 {
        let mut hash = crate::fnv::Fnv::new();
        match self {
            KiteOp::Faa { key, delta } => {
                hash.write_bytes(b"faa");
                hash.write_bytes(key);
                hash.write_bytes(&delta.to_le_bytes());
            }
            KiteOp::Cas { key, expected, new, .. } => {
                hash.write_bytes(b"cas");
                hash.write_bytes(key);
                match expected {
                    None => hash.write_bytes(b"absent"),
                    Some(e) => {
                        hash.write_bytes(b"value");
                        hash.write_bytes(e);
                    }
                }
                hash.write_bytes(new);
            }
            other => hash.write_bytes(other.name().as_bytes()),
        }
        hash.0
    }

    /// The operation's name, as reports and errors show it.
    pub fn name(&self) -> &'static str {
        match self {
            KiteOp::Read { .. } => "read",
            KiteOp::Write { .. } => "write",
            KiteOp::Acquire { .. } => "acquire",
            KiteOp::Release { .. } => "release",
            KiteOp::Faa { .. } => "faa",
            KiteOp::Cas { strong: true, .. } => "cas-strong",
            KiteOp::Cas { strong: false, .. } => "cas-weak",
            KiteOp::Reconfigure { .. } => "reconfigure",
        }
    }
}

/// How a reply is shown to the front door (which command asked), or why the request is
/// refused before it runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ReplyForm {
    /// As the engine's own result (the simulator and tests).
    #[default]
    Native,
    /// A get: the value.
    Value,
    /// A set: written.
    Written,
    /// An increment by `delta`: the value after it.
    Counter {
        /// The amount added.
        delta: i64,
    },
    /// A compare-and-swap: whether it swapped, and the value found.
    Cas,
    /// A membership change's step (`KEEL.NODE`): done once the membership it leaves is
    /// settled on the voters wanted; otherwise `BUSY`, and the caller asks again.
    Membership(VotersWanted),
}

/// A client request to a Kite keyspace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KiteRequest {
    /// Returned with the reply.
    pub tag: RequestTag,
    /// The session (a connection); requests of one session complete in the order given.
    pub session: u64,
    /// The operation.
    pub op: KiteOp,
    /// How the reply is shown, or why the request is refused.
    pub form: ReplyForm,
    /// The client's own number for the request, when the client named it (`KEEL.REQ`,
    /// the session then being the client's id): a read-modify-write goes by
    /// ⟨client, number⟩ on every node, so that a retry at any node is applied at most once.
    /// A client's numbers increase, and it retries only its latest request of a key's
    /// session; a retry of an earlier one is refused when a later one was done.
    pub named: Option<u64>,
}

/// What an operation returned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum KiteResult {
    /// A read or acquire: the value and the stamp of the write that made it.
    Value {
        /// The value (`None`: absent).
        value: Option<Value>,
        /// Its stamp ([`Stamp::ZERO`]: never written).
        stamp: Stamp,
    },
    /// A write or release, at this stamp.
    Written {
        /// The stamp created.
        stamp: Stamp,
    },
    /// A read-modify-write: what it read and, if it wrote, what it created.
    Rmw {
        /// The value read.
        read: Option<Value>,
        /// The stamp read.
        read_stamp: Stamp,
        /// The stamp written (`None`: a compare-and-swap whose comparison failed).
        wrote: Option<Stamp>,
        /// Whether the read happened only at this node (a weak compare-and-swap that
        /// failed locally: a relaxed read, no barrier).
        local: bool,
    },
}

/// The reply to one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KiteReply {
    /// The request's tag.
    pub tag: RequestTag,
    /// The request's session.
    pub session: u64,
    /// The node that answered.
    pub served_by: NodeId,
    /// The request's form.
    pub form: ReplyForm,
    /// The result or a typed error.
    pub result: Result<KiteResult, KeelError>,
}

/// Every Kite node serves its own clients' requests (none is forwarded): a reply holds no
/// other node's value.
impl crate::engine::HeldValue for KiteReply {
    fn forwarded_value(&mut self, _node: NodeId) -> Option<&mut keel_types::Value> {
        None
    }

    fn refuse_busy(&mut self, why: &str) {
        self.result = Err(KeelError::Busy(why.into()));
    }
}

/// Identifies one round of one operation at its origin (the sender of the request
/// message): replies carry it back.
pub type RoundId = u64;

/// What Kite nodes send each other. Every request names a round; replies echo it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Message {
    /// A write to apply if its stamp is newer: a relaxed write, a release's value round,
    /// an acquire's write-back, a read-modify-write's commit (`rmw` set).
    Write {
        /// The round.
        round: RoundId,
        /// The key.
        key: Key,
        /// The value.
        value: Value,
        /// Its stamp.
        stamp: Stamp,
        /// A read-modify-write's commit: its id and outcome.
        rmw: Option<(RmwId, RmwOutcome)>,
        /// With a commit: records its proposer declared applied before it (covered by
        /// a newer value), now chosen with it: every receiver records them done.
        applied: Vec<(RmwId, RmwOutcome)>,
        /// An acquire's delinquency query: the acquire's id.
        query: Option<u64>,
    },
    /// Acknowledges a write; `delinquent` answers the query.
    WriteAck {
        /// The round.
        round: RoundId,
        /// Who answered (see [`Origin`]).
        by: Origin,
        /// The query's answer: when the sender deems the asker delinquent, the
        /// generation of its bit (how many slow releases named the asker there).
        delinquent: Option<u64>,
    },
    /// Asks for a key's value and stamp (acquires, out-of-epoch reads, the first round of
    /// releases and out-of-epoch writes).
    Read {
        /// The round.
        round: RoundId,
        /// The key.
        key: Key,
        /// An acquire's delinquency query.
        query: Option<u64>,
    },
    /// A key's value and stamp.
    ReadReply {
        /// The round.
        round: RoundId,
        /// Who answered (see [`Origin`]).
        by: Origin,
        /// The value.
        value: Option<Value>,
        /// Its stamp.
        stamp: Stamp,
        /// The read-modify-write that made the value, if one did.
        made_by: Option<Box<(RmwId, RmwOutcome)>>,
        /// The query's answer (the bit's generation when delinquent).
        delinquent: Option<u64>,
    },
    /// A slow release: the sender's release found these nodes slow; mark them delinquent.
    SlowRelease {
        /// The round.
        round: RoundId,
        /// The delinquent nodes.
        delinquent: Vec<NodeId>,
    },
    /// Acknowledges a slow release.
    SlowReleaseAck {
        /// The round.
        round: RoundId,
        /// Who answered (see [`Origin`]).
        by: Origin,
    },
    /// The sender's acquire `acquire` bumped its epoch: clear its bit if that acquire
    /// moved it to transient and no slow release named the sender since (`gen` is the
    /// generation the receiver answered that acquire with). Best effort, never
    /// acknowledged.
    ResetBit {
        /// The acquire's id.
        acquire: u64,
        /// The generation of the receiver's bit the acquire was answered with.
        gen: u64,
    },
    /// Paxos phase 1 for one key.
    Propose {
        /// The round.
        round: RoundId,
        /// The key.
        key: Key,
        /// The ballot.
        ballot: Ballot,
        /// The read-modify-write proposed (for its committed outcome).
        rmw: RmwId,
        /// The delinquency query.
        query: Option<u64>,
    },
    /// Phase 1's answer.
    Promise {
        /// The round.
        round: RoundId,
        /// Who answered (see [`Origin`]).
        by: Origin,
        /// Whether the ballot was promised.
        ok: bool,
        /// The highest ballot the sender has promised.
        promised: Ballot,
        /// The read-modify-write the sender accepted and has not seen committed.
        accepted: Option<(Ballot, RmwRecord)>,
        /// The sender's value.
        value: Option<Value>,
        /// Its stamp.
        stamp: Stamp,
        /// The proposing session's latest committed read-modify-write on the key.
        outcome: Option<RmwOutcome>,
        /// The read-modify-write that made the sender's value, if one did.
        made_by: Option<Box<(RmwId, RmwOutcome)>>,
        /// The query's answer (the bit's generation when delinquent).
        delinquent: Option<u64>,
    },
    /// Paxos phase 2.
    Accept {
        /// The round.
        round: RoundId,
        /// The key.
        key: Key,
        /// The ballot.
        ballot: Ballot,
        /// The read-modify-write.
        record: RmwRecord,
        /// The delinquency query.
        query: Option<u64>,
    },
    /// Phase 2's answer.
    Accepted {
        /// The round.
        round: RoundId,
        /// Who answered (see [`Origin`]).
        by: Origin,
        /// Whether the sender accepted.
        ok: bool,
        /// The highest ballot the sender has promised.
        promised: Ballot,
        /// The query's answer (the bit's generation when delinquent).
        delinquent: Option<u64>,
    },
    /// The sender merged the view of generation `gen` that a reply of the receiver
    /// carried: the receiver's replies to the sender need not carry it any more.
    ViewAck {
        /// The incarnation of the receiver whose view was merged (a restarted node
        /// counts its generations anew).
        incarnation: u32,
        /// The generation merged.
        gen: u64,
    },
    /// A rejoining node (a new incarnation) asks for the sender's state from `after` on.
    /// The first one a node receives from an incarnation is that incarnation's fence at
    /// the node (see [`Origin`]).
    StateRequest {
        /// The rejoin (the asker's incarnation's writer id); the page echoes it.
        rejoin: u64,
        /// Where the page starts.
        after: Cursor,
        /// The asker's membership, taken by the node asked before it cuts the page (the
        /// fence of a membership change, `engine/membership.rs`).
        membership: Membership,
    },
    /// One page of a node's state, in cursor order: keys, then committed outcomes.
    StatePage {
        /// The rejoin asked for.
        rejoin: u64,
        /// The cursor asked for (a page answers one request).
        after: Cursor,
        /// The sender is rejoining itself: it has nothing to vouch for (and the rest of the
        /// page is empty).
        rejoining: bool,
        /// Keys, in key order after the cursor.
        slots: Vec<SlotImage>,
        /// Committed read-modify-writes, in (node, session) order after the cursor.
        outcomes: Vec<(RmwId, Key, RmwOutcome)>,
        /// With the first page: the sender's delinquency bits, as (node, set or transient,
        /// generation).
        bits: Vec<(NodeId, bool, u64)>,
        /// Where the next page starts; `None`: this was the last.
        next: Option<Cursor>,
        /// The sender's membership, taken by the asker before it counts the page.
        membership: Membership,
    },
    /// Asks a voter of the membership under way whether it read the old voters' state.
    SyncQuery {
        /// The round.
        round: RoundId,
        /// The asker's membership (a change under way), taken by the node asked.
        membership: Membership,
    },
    /// Answers a [`Message::SyncQuery`] once the sender read the old voters' state.
    Synced {
        /// The round.
        round: RoundId,
        /// Who answered (see [`Origin`]).
        by: Origin,
    },
    /// A node's membership, sent to a peer found behind it (or ahead of it).
    MembershipNews {
        /// The sender's membership.
        membership: Membership,
    },
}

/// Who answered a round: the replier's incarnation and, until the asker acknowledged it,
/// every member's incarnation as the replier knows it.
///
/// This is the rejoin's fence (`docs/kite.md`, Restarts). A node that restarted lost what
/// its earlier incarnation acknowledged, and replies that incarnation sent before it
/// crashed may still be on their way. A round must never count such a reply together
/// with a reply sent by a node after the new incarnation read that node's state: the
/// reply then vouches for something the rejoin did not see. So a node that learns of a
/// newer incarnation (from the new incarnation's state request, its replies, or another
/// node's view) takes the earlier incarnation's replies out of its open rounds and
/// refuses those still on their way; and every reply carries the replier's view until
/// the asker has merged it, so that the asker learns of every incarnation the replier
/// knows before it counts the reply.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origin {
    /// The replier's incarnation.
    pub incarnation: u32,
    /// The epoch of the replier's membership: a round counts only replies of its own
    /// node's epoch (`engine/membership.rs`).
    pub epoch: u64,
    /// The replier's view, while the asker may not have merged it (boxed: rare, and
    /// replies stay small).
    pub view: Option<Box<View>>,
}

/// Every member's incarnation as one node knows it, with the node's count of changes to
/// it in its current incarnation (its generation), which the receiver acknowledges with
/// [`Message::ViewAck`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct View {
    /// How many times the sender's view changed.
    pub gen: u64,
    /// The highest incarnation the sender knows of each member it has heard of.
    pub incarnations: Vec<(NodeId, u32)>,
    /// The sender's membership.
    pub membership: Membership,
}

/// Where a page of a node's state starts.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Cursor {
    /// The first page.
    Start,
    /// Keys after this one.
    Key(Key),
    /// Keys are done; outcomes after this (node, session).
    Outcome(u64, u64),
}

/// One key as a node holds it, for a rejoining node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotImage {
    /// The key.
    pub key: Key,
    /// Its value.
    pub value: Option<Value>,
    /// Its stamp.
    pub stamp: Stamp,
    /// The highest ballot promised on it.
    pub promised: Ballot,
    /// The read-modify-write accepted on it and not seen committed.
    pub accepted: Option<(Ballot, RmwRecord)>,
    /// The read-modify-write that made its value, if one did.
    pub made_by: Option<Box<(RmwId, RmwOutcome)>>,
}

/// The most keys and outcomes one state page carries.
pub const PAGE_ITEMS_MAX: usize = 256;

impl Message {
    /// The message's kind, for reports.
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Write { .. } => "write",
            Message::WriteAck { .. } => "write-ack",
            Message::Read { .. } => "read",
            Message::ReadReply { .. } => "read-reply",
            Message::SlowRelease { .. } => "slow-release",
            Message::SlowReleaseAck { .. } => "slow-release-ack",
            Message::ResetBit { .. } => "reset-bit",
            Message::Propose { .. } => "propose",
            Message::Promise { .. } => "promise",
            Message::Accept { .. } => "accept",
            Message::Accepted { .. } => "accepted",
            Message::ViewAck { .. } => "view-ack",
            Message::StateRequest { .. } => "state-request",
            Message::StatePage { .. } => "state-page",
            Message::SyncQuery { .. } => "sync-query",
            Message::Synced { .. } => "synced",
            Message::MembershipNews { .. } => "membership-news",
        }
    }

    /// The bytes of client values the message carries (values, values read, outcomes'
    /// and records' values): what a link's allowance charges it. Every message carrying
    /// any is one the protocol sends again when it is lost (a round's request or reply, a
    /// state page asked for again), so a host may shed it as a lossy link would.
    pub fn value_bytes(&self) -> usize {
        let outcome = |o: &RmwOutcome| o.value.len() + o.read.as_ref().map_or(0, |r| r.len());
        let pair = |p: &(RmwId, RmwOutcome)| outcome(&p.1);
        let made = |m: &Option<Box<(RmwId, RmwOutcome)>>| m.as_deref().map_or(0, pair);
        let record = |r: &RmwRecord| {
            r.value.len()
                + r.read.as_ref().map_or(0, |v| v.len())
                + made(&r.base)
                + r.skipped.iter().chain(&r.settled).map(pair).sum::<usize>()
        };
        let value = |v: &Option<Value>| v.as_ref().map_or(0, |v| v.len());
        match self {
            Message::Write { value, rmw, applied, .. } => {
                value.len() + rmw.as_ref().map_or(0, pair) + applied.iter().map(pair).sum::<usize>()
            }
            Message::ReadReply { value: v, made_by, .. } => value(v) + made(made_by),
            Message::Promise { accepted, value: v, outcome: o, made_by, .. } => {
                accepted.as_ref().map_or(0, |(_, r)| record(r))
                    + value(v)
                    + o.as_ref().map_or(0, outcome)
                    + made(made_by)
            }
            Message::Accept { record: r, .. } => record(r),
            Message::StatePage { slots, outcomes, .. } => {
                let slot = |s: &SlotImage| {
                    value(&s.value)
                        + s.accepted.as_ref().map_or(0, |(_, r)| record(r))
                        + made(&s.made_by)
                };
                slots.iter().map(slot).sum::<usize>()
                    + outcomes.iter().map(|(_, _, o)| outcome(o)).sum::<usize>()
            }
            Message::WriteAck { .. }
            | Message::Read { .. }
            | Message::SlowRelease { .. }
            | Message::SyncQuery { .. }
            | Message::Synced { .. }
            | Message::MembershipNews { .. }
            | Message::SlowReleaseAck { .. }
            | Message::ResetBit { .. }
            | Message::Propose { .. }
            | Message::Accepted { .. }
            | Message::ViewAck { .. }
            | Message::StateRequest { .. } => 0,
        }
    }
}

/// A Kite node's configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// This node.
    pub node: NodeId,
    /// Every node that may vote, this node included (1 to 63): whom messages may come
    /// from. The voters are a subset, changed online (`engine/membership.rs`).
    pub members: Vec<NodeId>,
    /// The voters while the keyspace's membership was never changed (epoch 0); empty:
    /// every member.
    pub voters: Vec<NodeId>,
    /// This node's incarnation: a new one after every restart that lost memory.
    pub incarnation: u32,
    /// The epoch of the newest membership this node's disk recorded: a restarted node
    /// rejoins only once it learned a membership at least this new.
    pub members_epoch: u64,
    /// How long a release waits for every node's acknowledgements of the session's
    /// earlier writes before it takes the slow path.
    pub release_timeout: Span,
    /// How long a round waits before it sends its request again to the nodes that have
    /// not answered.
    pub retransmit: Span,
    /// The longest random pause before a read-modify-write tries again after another
    /// proposer's ballot won (dueling proposers draw different pauses).
    pub rmw_backoff_max: Span,
    /// The most sessions a node keeps; a request of a new session beyond it is refused.
    pub sessions_max: usize,
    /// The most requests waiting in one session.
    pub session_queue_max: usize,
    /// The most committed read-modify-write outcomes kept (one per session; the one
    /// recorded longest ago goes first): how far back a retry is known done.
    pub outcomes_max: usize,
    /// The most bytes those outcomes take.
    pub outcomes_bytes_max: usize,
    /// Limits on keys and values.
    pub limits: keel_types::Limits,
    /// Boot by reading the state of enough other nodes that every quorum this node's
    /// earlier incarnations took part in is covered, before serving a client or answering
    /// a quorum request: what a node that lost its memory does (`docs/kite.md`, Restarts).
    /// Off only for the first boot of a whole new cluster in the simulator.
    pub rejoin: bool,
    /// Checks the node's invariants after every step (`engine/invariants.rs`): the
    /// simulator sets it; a debug build checks whatever it says. Off in servers, where a
    /// step must cost what it answers, not the sessions and rounds in flight.
    pub check_invariants: bool,
    /// Negative control: a rejoining node serves and answers at once, as if it had not
    /// lost its memory. Unsafe; for tests and `keel sim` only.
    pub unsafe_no_rejoin: bool,
    /// Negative control: the rejoin without its fence (the rule before it): rounds keep
    /// and accept replies of an earlier incarnation after learning of a later one, so a
    /// round may count a reply the restarted node's memory lost together with one sent
    /// after the rejoin read its sender. Unsafe; for tests and `keel sim` only.
    pub unsafe_unfenced_rejoin: bool,
    /// Negative control: a release that times out goes on without the slow release (no
    /// delinquent set is broadcast). Unsafe; for tests and `keel sim` only.
    pub unsafe_no_slow_path: bool,
    /// Negative control: a release (or read-modify-write) goes on at once, before any
    /// acknowledgement of the session's earlier writes: its value can be seen before
    /// them. Unsafe; for tests and `keel sim` only.
    pub unsafe_release_before_acks: bool,
    /// Negative control: a release's value round and a read-modify-write's commit count
    /// as done once sent, without a quorum's acknowledgements. Unsafe; for tests and
    /// `keel sim` only.
    pub unsafe_complete_without_quorum: bool,
    /// Negative control: an out-of-epoch access puts its key back in the machine's
    /// current epoch, not the epoch it started in. Unsafe; for tests and `keel sim` only.
    pub unsafe_no_epoch_snapshot: bool,
    /// Negative control: the paper's reset, sent to every node and naming only the
    /// acquire, so a query that arrives after the acquire ended lets it erase a later
    /// slow release. Unsafe; for tests and `keel sim` only.
    pub unsafe_paper_reset: bool,
    /// Negative control: a named request that fails (its comparison, or an FAA on a value
    /// that is not a number) answers at once without committing its failure, so a first
    /// attempt still running elsewhere can swap after its retry answered that it failed.
    /// Unsafe; for tests and `keel sim` only.
    pub unsafe_uncommitted_failures: bool,
    /// Negative control: a proposer ignores the outcomes and makers a quorum shows, so a
    /// request done already (by an earlier attempt, or a helper) is done again under the
    /// same id. Unsafe; for tests and `keel sim` only.
    pub unsafe_forget_outcomes: bool,
    /// Negative control: during a membership change a quorum is a majority of the new
    /// voters alone, not of both the old and the new. Unsafe; for tests and `keel sim` only.
    pub unsafe_new_quorum_only: bool,
    /// Negative control: a change settles on the new voters without their reading the
    /// old voters' state (no sync, and no wait for one). Unsafe; for tests and `keel sim`
    /// only.
    pub unsafe_unsynced_change: bool,
    /// Negative control: a round keeps the replies it counted under a membership just
    /// replaced (it only asks the voters just learned). Unsafe; for tests and `keel sim`
    /// only.
    pub unsafe_mixed_epoch_rounds: bool,
}

impl Config {
    /// Defaults for `node` in a cluster of `members`.
    pub fn new(node: NodeId, members: Vec<NodeId>) -> Config {
        Config {
            node,
            members,
            voters: Vec::new(),
            incarnation: 0,
            members_epoch: 0,
            release_timeout: Span::from_millis(5),
            retransmit: Span::from_millis(20),
            rmw_backoff_max: Span::from_millis(10),
            sessions_max: 10_000,
            session_queue_max: 1_000,
            outcomes_max: 100_000,
            outcomes_bytes_max: 64 << 20,
            limits: keel_types::Limits::default(),
            rejoin: false,
            check_invariants: false,
            unsafe_no_rejoin: false,
            unsafe_unfenced_rejoin: false,
            unsafe_no_slow_path: false,
            unsafe_release_before_acks: false,
            unsafe_complete_without_quorum: false,
            unsafe_no_epoch_snapshot: false,
            unsafe_paper_reset: false,
            unsafe_uncommitted_failures: false,
            unsafe_forget_outcomes: false,
            unsafe_new_quorum_only: false,
            unsafe_unsynced_change: false,
            unsafe_mixed_epoch_rounds: false,
        }
    }

    /// The membership of epoch 0: `voters`, or every member.
    pub fn initial_membership(&self) -> Membership {
        let mut voters =
            if self.voters.is_empty() { self.members.clone() } else { self.voters.clone() };
        voters.sort_unstable();
        Membership { epoch: 0, voters, next: None }
    }

    /// Checks ranges: 1 to 63 members with no duplicates, this node among them, positive
    /// timers and bounds.
    pub fn validate(&self) -> Result<(), crate::engine::ConfigError> {
        use crate::engine::ConfigError;
        let err = |field, reason: &str| Err(ConfigError { field, reason: reason.to_string() });
        let mut sorted = self.members.clone();
        sorted.sort();
        sorted.dedup();
        if sorted.len() != self.members.len() {
            return err("members", "duplicate member");
        }
        if self.members.is_empty() || self.members.len() > 63 {
            return err("members", "between 1 and 63 members");
        }
        if !self.members.contains(&self.node) {
            return err("node", "this node is not a member");
        }
        let initial = self.initial_membership();
        if !initial.valid() || initial.voters.iter().any(|v| !self.members.contains(v)) {
            return err("voters", "sorted, without repeats, and members");
        }
        if self.release_timeout.0 == 0 {
            return err("release_timeout", "must be positive");
        }
        if self.retransmit.0 == 0 {
            return err("retransmit", "must be positive");
        }
        if self.sessions_max == 0 || self.session_queue_max == 0 {
            return err("sessions_max", "session bounds must be positive");
        }
        if self.outcomes_max == 0 || self.outcomes_bytes_max == 0 {
            return err("outcomes_max", "outcome bounds must be positive");
        }
        Ok(())
    }
}

/// A delinquency bit: what this node knows of one node's missed writes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Bit {
    /// Up to date (as far as this node knows).
    #[default]
    Clear,
    /// A release found the node slow: its next acquire must leave the fast path.
    Set,
    /// Reported to these acquires of the node; cleared only by a reset naming one of
    /// them (a slow release sets it back to [`Bit::Set`]).
    Transient(Vec<u64>),
}

/// A Kite node's externally visible state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Status {
    /// This node.
    pub node: NodeId,
    /// The machine epoch.
    pub epoch: u64,
    /// The incarnation.
    pub incarnation: u32,
    /// Still reading the other nodes' state after a restart (serves no client yet).
    pub rejoining: bool,
    /// Clients' keys held (the reserved membership key not counted).
    pub keys: usize,
    /// Keys whose epoch is the machine's (fast path).
    pub keys_in_epoch: usize,
    /// Sessions open.
    pub sessions: usize,
    /// Committed read-modify-write outcomes kept (one per session that made one).
    pub outcomes: usize,
    /// The bytes they take (roughly).
    pub outcomes_bytes: usize,
    /// The delinquency bits, by node.
    pub bits: Vec<(NodeId, Bit)>,
    /// The membership this node knows.
    pub membership: Membership,
    /// The epoch of the last change for which this node read the old voters' state.
    pub synced: u64,
    /// While the membership was never changed (epoch 0): the members configured with other
    /// `voters` than this node: while one is, it counts no reply and refuses its clients
    /// (`docs/kite.md`).
    pub voters_disagree: Vec<NodeId>,
    /// Counters.
    pub counters: Counters,
}

/// What a Kite node has done, for metrics and the simulator's coverage.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    /// Memberships taken (each newer one learned, by a commit, a view, a page or news).
    pub memberships: u64,
    /// Reads of the old voters' state finished for a membership change.
    pub syncs: u64,
    /// Sync queries of this node's own answered once it synced (it could not when they
    /// opened).
    pub own_sync_queries_answered: u64,
    /// Replies not counted because their sender's membership was of another epoch.
    pub replies_other_epoch: u64,
    /// Replies not counted because, at epoch 0, a member was known configured with other
    /// voters.
    pub replies_other_voters: u64,
    /// Peers found configured with other voters than this node while both were at epoch 0
    /// (each time one started to disagree).
    pub voters_disagreements: u64,
    /// Relaxed reads served locally.
    pub reads_fast: u64,
    /// Relaxed reads that read a quorum (out-of-epoch key).
    pub reads_slow: u64,
    /// Relaxed writes on the fast path.
    pub writes_fast: u64,
    /// Relaxed writes that read stamps from a quorum first (out-of-epoch key).
    pub writes_slow: u64,
    /// Releases that found every earlier write acknowledged by all.
    pub releases_fast: u64,
    /// Releases that timed out and broadcast a delinquent set.
    pub releases_slow: u64,
    /// Acquires (and read-modify-writes) no replica deemed delinquent.
    pub acquires_fast: u64,
    /// Acquires that found this node delinquent and raised its epoch.
    pub acquires_slow: u64,
    /// Acquires that needed the write-back round.
    pub write_backs: u64,
    /// Read-modify-writes completed.
    pub rmws: u64,
    /// Paxos rounds started again (a nack or a helped record).
    pub rmw_retries: u64,
    /// Read-modify-writes that waited for another session of this node to finish one on
    /// the same key.
    pub rmws_queued: u64,
    /// Accepted read-modify-writes of others this node finished.
    pub rmw_helped: u64,
    /// Records covered by a newer value that carried too much to be carried on (more
    /// than `SKIPPED_MAX` records), which this node set out to finish instead.
    pub rmws_finished_covered: u64,
    /// Read-modify-writes a quorum showed already done (by a helper, or by an earlier
    /// attempt of a request its client retried), answered with that outcome.
    pub rmws_found_done: u64,
    /// Failures of requests their clients named (a comparison that failed, an FAA on a
    /// value that is not a number) this node completed as committed records that keep the
    /// value they read (a retry that found one committed counts it again).
    pub failures_committed: u64,
    /// Requests refused because their client had used their number for another command.
    pub rmws_reused: u64,
    /// Read-modify-writes refused because a later request of their session was done:
    /// late retries, whose own outcome is no longer kept.
    pub rmws_superseded: u64,
    /// Committed outcomes dropped to stay within `outcomes_max` and `outcomes_bytes_max`.
    pub outcomes_dropped: u64,
    /// Weak compare-and-swaps that failed locally.
    pub cas_local_failures: u64,
    /// Requests sent again after the retransmission timer.
    pub retransmits: u64,
    /// Tracked writes made due at once, their back-off started over, because the node
    /// they waited for answered another write sent again.
    pub writes_hurried: u64,
    /// Slow releases received that named this node.
    pub self_delinquent: u64,
    /// Reset-bit messages that cleared a bit.
    pub resets: u64,
    /// Writes that first ran a barrier because their session held too many writes not
    /// yet acknowledged by every node.
    pub flushes: u64,
    /// Peer messages dropped by the validation gate.
    pub rejected: u64,
    /// State pages merged while rejoining.
    pub rejoin_pages: u64,
    /// Rejoins completed (0 or 1 per incarnation).
    pub rejoins: u64,
    /// Requests a rejoining node left unanswered (quorum requests it cannot vouch for).
    pub unanswered_rejoining: u64,
    /// Replies of an earlier incarnation taken out of open rounds on learning of a later
    /// one (the rejoin's fence at work: a round was in flight across a restart).
    pub replies_fenced: u64,
    /// Replies of an earlier incarnation refused on arrival (late replies from a node
    /// that has restarted since).
    pub replies_stale: u64,
    /// Newer incarnations of other nodes learned (from their state requests, their
    /// replies, or another node's view).
    pub incarnations_learned: u64,
}
