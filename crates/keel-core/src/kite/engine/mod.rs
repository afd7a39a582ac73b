//! [`KiteEngine`]: one Kite node, cut by protocol piece. Every piece is an `impl
//! KiteEngine` block in a file of its own over the state declared here; the cut follows
//! what a message or a step goes through, so that a reader follows one protocol piece in
//! one file:
//!
//! | file | piece | enters from |
//! |---|---|---|
//! | `replica.rs` | boot, `step`, the store (`apply`, epochs, outcomes), what the drivers read | the drivers |
//! | `gate.rs` | the validation gate: `check_message` (stateless), `check_state` (members, sizes, counters) | `serve.rs` |
//! | `serve.rs` | a peer's message in: the gate, a reply to a round, or a request answered (`Write`, `Read`, `SlowRelease`, `ResetBit`, `Propose`, `Accept`) | `step` |
//! | `rounds.rs` | rounds: a broadcast waiting for answers, replies recorded, quorum reads and acknowledgements, retransmission and the timer index behind `wake_at` | every operation |
//! | `sessions.rs` | admission, the session queue, `advance` (one operation at a time), the per-key queue of read-modify-writes, the timers of waiting operations | `step` |
//! | `ops.rs` | reads, writes, acquires, releases and flushes: start and progress (Eventual Store and ABD) | `sessions.rs` |
//! | `barrier.rs` | the release barrier (fast, then slow release), the end of an acquire (epoch raised, bits reset), delinquency queries | `ops.rs`, `rmw/`, `serve.rs` |
//! | `rmw/` | read-modify-writes: per-key leaderless Paxos, one function per stage (`mod.rs` takes the key and retries, `propose.rs` reads the promises, `accept.rs`, `commit.rs`) | `ops.rs` |
//! | `rejoin.rs` | a restarted node reading its peers' state before it serves (and a new voter's sync) | `boot`, `serve.rs` |
//! | `membership.rs` | membership changes: joint quorums, one epoch per round, the sync, the change's steps | `serve.rs`, `ops.rs`, `replica.rs` |
//! | `fence.rs` | incarnations on every reply, which keep a round from counting a restarted node's lost reply | `serve.rs` |
//! | `outcomes.rs` | the bounded table of committed read-modify-write outcomes (exactly once) | `replica.rs` |
//! | `invariants.rs` | `check_invariants`, run by the simulator after every step | the simulator |
//!
//! State that one piece alone moves is kept behind that piece: the rounds and their
//! resend index (`rounds::Rounds`), the outcome table, the rejoin, the waiting
//! operations' timers (`sessions.rs`, `waits`). What several pieces share (the store, the
//! bits, the sessions) is a field of [`KiteEngine`].

// `Result<KiteResult, Phase>` says "done, with this result" or "still going, in this
// phase": the `Err` side is the operation's state moved back into its session, not an
// error travelling up, so its size is not a cost.
#![allow(clippy::result_large_err)]

use super::types::{
    Ballot, Bit, Config, Counters, Cursor, KiteOp, KiteReply, KiteRequest, KiteResult, Message,
    Origin, RmwId, RmwOutcome, RmwRecord, RoundId, SlotImage, Stamp, Status, PAGE_ITEMS_MAX,
    SKIPPED_MAX,
};
use crate::engine::Outputs;
use crate::time::Time;
use keel_types::rng::SplitMix64;
use keel_types::{KeelError, Key, NoRecord, NodeId, Value};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

mod barrier;
mod fence;
mod gate;
mod invariants;
mod membership;
mod ops;
mod outcomes;
mod rejoin;
mod replica;
mod rmw;
mod rounds;
mod serve;
mod sessions;
use ops::{Acquire, Release};
use outcomes::Outcomes;
use rejoin::Rejoin;
use rmw::{Rmw, RmwStage};
use rounds::{Round, Rounds};

/// The replicas that deemed an acquire's node delinquent, each with the generation of
/// its bit it answered with: the acquire's resets name it, so that a reset never clears a
/// bit a later slow release set (or a query that arrived after the acquire ended moved).
type Flags = BTreeMap<NodeId, u64>;

/// The read-modify-write that made a value (its id and outcome), when one did.
type Maker = Option<Box<(RmwId, RmwOutcome)>>;

/// The most writes a session keeps waiting for every node's acknowledgement; its next
/// write first runs a barrier that settles them (acknowledged by all, or by a quorum and
/// the rest named delinquent), which bounds the memory a session holds.
const TRACKED_MAX: usize = 1_024;

/// The most acquire ids a transient bit keeps (older ones are forgotten, which keeps the
/// bit transient: safe, and costs at most one more slow acquire).
const TRANSIENT_IDS_MAX: usize = 64;

/// The most members a cluster has: a round's pending members are the bits of a `u64`.
const MEMBERS_MAX: usize = 63;

const _: () = assert!(TRACKED_MAX > 0 && TRANSIENT_IDS_MAX > 0 && MEMBERS_MAX < 64);

/// One key at this replica.
#[derive(Clone, Debug, Default)]
struct Slot {
    value: Option<Value>,
    stamp: Stamp,
    /// The key's epoch: the fast path serves it iff it equals the machine epoch.
    epoch: u64,
    promised: Ballot,
    accepted: Option<(Ballot, RmwRecord)>,
    /// The membership epoch under which this incarnation accepted `accepted` itself
    /// (`None`: copied from another node while rejoining, that node's acceptance, not
    /// this one's, which must not be counted again as this node's when its proposer's
    /// `Accept` arrives). An acceptance is answered again after a higher promise only
    /// under the membership it was made in (`serve_accept`).
    accepted_here: Option<u64>,
    /// The read-modify-write whose commit made `value`, if one did.
    made_by: Option<Box<(RmwId, RmwOutcome)>>,
    /// The last record this incarnation finished for another (accepted again at its own
    /// ballot and committed with what it carries, acknowledged by a quorum): a quorum's
    /// outcome tables hold it and what it carried, so it need not be carried on.
    finished: Option<RmwId>,
}

/// A value read, with its stamp and the read-modify-write that made it.
#[derive(Clone, Debug)]
struct Found {
    value: Option<Value>,
    stamp: Stamp,
    made_by: Maker,
}

/// A release's (or read-modify-write's) wait for the session's earlier writes.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Barrier {
    /// Waiting for every node's acknowledgements until the deadline.
    Waiting { deadline: Time },
    /// Timed out: waiting for a quorum's acknowledgements, then the slow release.
    Slow { delinquent: Vec<NodeId>, round: Option<RoundId> },
    /// The value may become visible.
    Done,
}

/// The operation a session has in progress. One per session, so the size of its largest
/// variant (a read-modify-write's) costs little.
#[derive(Clone, Debug)]
#[allow(clippy::large_enum_variant)]
enum Phase {
    /// A relaxed read of a key out of its epoch, from a quorum.
    SlowRead {
        key: Key,
        snapshot: u64,
        round: RoundId,
    },
    /// A relaxed write of a key out of its epoch, after reading a quorum's stamps.
    SlowWrite {
        key: Key,
        value: Value,
        snapshot: u64,
        round: RoundId,
    },
    Acquire(Acquire),
    Release(Release),
    Rmw(Rmw, RmwStage),
    /// A write of a session that holds [`TRACKED_MAX`] writes not yet acknowledged by
    /// every node waits for a barrier (a release without a value) that settles them.
    Flush {
        op: KiteOp,
        rid: RmwId,
        barrier: Barrier,
    },
    /// Finished with an error (never kept: the session answers it at once).
    Refused(KeelError),
    /// A membership change waiting for a majority of its new voters to have synced.
    SyncWait(membership::SyncWait),
}

impl Phase {
    /// When the operation waits for the time alone (a barrier's deadline, a back-off):
    /// the waiting operations' timer index holds it.
    fn wake(&self) -> Option<Time> {
        let deadline = |barrier: &Barrier| match barrier {
            Barrier::Waiting { deadline } => Some(*deadline),
            _ => None,
        };
        match self {
            Phase::Release(release) => deadline(&release.barrier),
            Phase::Flush { barrier, .. } => deadline(barrier),
            Phase::Rmw(rmw, stage) => {
                let until = match stage {
                    RmwStage::Backoff { until } => Some(*until),
                    _ => None,
                };
                deadline(&rmw.barrier).into_iter().chain(until).min()
            }
            _ => None,
        }
    }

    /// The key of the read-modify-write it runs (or waits to run), if any.
    fn rmw_key(&self) -> Option<&Key> {
        match self {
            Phase::Rmw(rmw, _) => Some(rmw.op.key()),
            Phase::Flush { op, .. } if op.is_rmw() => Some(op.key()),
            _ => None,
        }
    }
}

#[derive(Clone, Debug)]
struct Active {
    tag: crate::engine::RequestTag,
    form: super::types::ReplyForm,
    phase: Phase,
}

#[derive(Clone, Debug, Default)]
struct Session {
    queue: VecDeque<KiteRequest>,
    active: Option<Active>,
    /// Rounds of writes not yet acknowledged by every node.
    tracked: Vec<RoundId>,
}

impl Session {
    /// Whether the session holds nothing: no request, no write its next release would
    /// wait for. Such a session is forgotten; coming back it starts as a new one, which
    /// is the same thing.
    fn idle(&self) -> bool {
        self.active.is_none() && self.queue.is_empty() && self.tracked.is_empty()
    }
}

/// A Kite node: release consistency on a leaderless, fully replicated, in-memory store.
#[derive(Debug)]
pub struct KiteEngine {
    config: Config,
    writer: u64,
    epoch: u64,
    /// The membership this node knows (`membership.rs`), and its two sides as masks of
    /// member indexes (`next_mask` 0 when no change is under way).
    membership: super::types::Membership,
    voters_mask: u64,
    next_mask: u64,
    /// The epoch of the last change for which this node read the old voters' state.
    synced: u64,
    /// While reading the old voters' state for a change (serving meanwhile).
    sync: Option<Rejoin>,
    keys: BTreeMap<Key, Slot>,
    bits: BTreeMap<NodeId, Bit>,
    /// Per node: how many slow releases named it here (its bit's generation).
    gens: BTreeMap<NodeId, u64>,
    /// The latest committed read-modify-write of each (node, session), with its key.
    outcomes: Outcomes,
    sessions: BTreeMap<u64, Session>,
    /// The sessions whose operation waits for a time, by that time ([`Phase::wake`]);
    /// kept in step with the sessions' phases by `sessions.rs` (`park`, `take_active`).
    waits: BTreeSet<(Time, u64)>,
    /// The session running a read-modify-write on each key, at this node.
    rmw_keys: BTreeMap<Key, u64>,
    /// The last request number given (node-wide; read-modify-write ids carry it).
    next_seq: u64,
    rounds: Rounds,
    next_acquire: u64,
    /// The highest ballot round this node proposed.
    last_round: u64,
    rng: SplitMix64,
    counters: Counters,
    now: Time,
    out: Outputs<Message, KiteReply, NoRecord>,
    /// While rejoining after a restart: whose state has been read.
    rejoin: Option<Rejoin>,
    /// The highest incarnation known of each member heard of, this node's own included
    /// (the rejoin's fence, `engine/fence.rs`).
    incarnations: BTreeMap<NodeId, u32>,
    /// How many times `incarnations` changed.
    view_gen: u64,
    /// The generation of this node's view each peer acknowledged having merged.
    view_told: BTreeMap<NodeId, u64>,
    /// While this node's membership is the configured one (epoch 0): the peers whose own
    /// configured voters differ, as their last view, page, state request or news showed.
    /// While one is known, no reply counts and clients are refused
    /// (`engine/membership.rs`, `compare_configured`).
    voters_disagree: BTreeSet<NodeId>,
    /// The incarnation to make durable before the first message (server drivers).
    hard_state: Option<keel_types::HardState>,
}
