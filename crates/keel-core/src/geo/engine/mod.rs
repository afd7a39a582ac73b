//! [`GeoEngine`]: one replica of one partition in one data center of a geo keyspace
//! (UniStore's causal half, `docs/geo.md`). Its state is cut by protocol piece, each an
//! `impl GeoEngine` block in a file of its own:
//!
//! | file | piece | state |
//! |---|---|---|
//! | `step.rs` | boot, `step`, the channels, timers and `wake_at` | [`GeoEngine`]'s own fields |
//! | `partition.rs` | the partition replica: the operation log, reads on a snapshot and their wait (1:18–25), prepare and commit (1:36–48), the known vector, geo-replication in timestamp order and heartbeats (2:1–18) | [`Partition`] |
//! | `coordinator.rs` | client transactions: begin (1:1–8), operations (1:9–17), commit by two-phase commit in the data center (1:26–35), barriers and attaches (1:49–52), timeouts | [`Coordinator`] |
//! | `uniform.rs` | the stable and uniform vectors (2:23–38), suspicion of failed data centers, forwarding (2:19–22), collection of remote transactions stored everywhere | [`Uniformity`] |
//! | `certify.rs` | strong transactions (Algorithm 3, §6.3): the coordinator's barrier and certification, each partition's certification log replicated from its leader to a majority of data centers, the leader's votes and decisions, delivery in strong-timestamp order, strong heartbeats | [`Certifier`] |
//! | `failover.rs` | the certification leader's election by ballot when its data center is suspected (Paxos's first phase), a new leader's recovery of the log and its ballots, following a leader's log, the conflict index | [`Certifier`]'s role |
//! | `settle.rs` | forgetting decided strong transactions once every participant decided them and their expiry passed: `SETTLE`, `Forget` records, `FORGOTTEN` answers | [`Certifier`]'s outcomes |
//! | `remove.rs` | removing a data center for good (an operator's), and the first step of taking one back | [`GeoEngine`]'s `removed`, `epochs`, `returning` |
//! | `back.rs` | taking a removed data center back once its return is agreed: the survivors' caps and answers, the new replicas' join, the cut, settling | [`back::Welcome`], [`back::Limit`], [`back::Joining`] |
//! //! | `copy.rs` | a return's copy from a settled survivor, the install, the new replica back, stale pasts refused | [`copy::Sending`] |
//! | `agree.rs` | agreeing on a change (a removal, a return): the node asked proposes it, each data center's acceptor (partition 0) promises it, a majority's promises make it | [`agree::Agreement`] |
//! | `gate.rs` | the validation gate | none |
//! | `invariants.rs` | `check_invariants` | none |

use super::channel::Channel;
use super::types::{
    Config, Counters, GeoReply, Kind, Member, Record, Replicated, TxId, Update, Vector,
};
use crate::engine::{Outputs, RequestTag};
use crate::time::Time;
use keel_types::{Key, NoRecord, NodeId};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

pub(crate) mod agree;
mod back;
mod certify;
mod coordinator;
mod copy;
mod failover;
mod gate;
pub use gate::BALLOT_MAX;
mod invariants;
mod partition;
mod remove;
mod settle;
mod step;
mod uniform;

/// One entry of an object's operation log: an update of a committed transaction.
#[derive(Clone, Debug)]
pub(crate) struct LogEntry {
    /// The transaction.
    pub tx: TxId,
    /// Its data center.
    pub origin: u32,
    /// Its commit vector (shared by its entries).
    pub commit: Arc<Vector>,
    /// The update.
    pub update: Update,
}

/// A transaction prepared on this partition, not yet committed.
#[derive(Clone, Debug)]
pub(crate) struct Prepared {
    /// Its prepare timestamp.
    pub ts: u64,
    /// Its updates of this partition.
    pub writes: Vec<(Key, Update)>,
    /// Whether its commit arrived (it waits in `commit_waits`).
    pub committing: bool,
}

/// A read waiting for the partition to store its snapshot (1:21).
#[derive(Clone, Debug)]
pub(crate) struct WaitingRead {
    /// The coordinator.
    pub from: NodeId,
    /// Its number for the read.
    pub read: u64,
    /// The object.
    pub key: Key,
    /// Its kind.
    pub kind: Kind,
    /// The snapshot.
    pub snap: Vector,
}

/// The partition replica's state (`partition.rs`).
#[derive(Debug, Default)]
pub(crate) struct Partition {
    /// Every object's operation log, by key and kind.
    pub log: BTreeMap<(Key, Kind), Vec<LogEntry>>,
    /// Entries in the log.
    pub entries: usize,
    /// `knownVec`: per origin, the prefix of its transactions stored here.
    pub known: Vector,
    /// Prepared transactions.
    pub prepared: BTreeMap<TxId, Prepared>,
    /// Their prepare timestamps, ordered (the smallest holds `known[d]` back).
    pub prepared_ts: BTreeSet<(u64, TxId)>,
    /// Commits waiting for the clock to reach their timestamp (1:43), by timestamp.
    pub commit_waits: BTreeMap<(u64, TxId), Vector>,
    /// `committedCausal[d]`: local commits not yet sent to the siblings, by timestamp.
    pub local_commits: BTreeMap<u64, Replicated>,
    /// `committedCausal[i]`, `i ≠ d`: remote transactions kept for forwarding, by origin
    /// and timestamp.
    pub remote_commits: Vec<BTreeMap<u64, Replicated>>,
    /// Reads waiting for `known` to cover their snapshot, by the entry they wait on.
    pub waiting: BTreeMap<(u64, u64), WaitingRead>,
    /// Numbers the waiting reads.
    pub next_wait: u64,
    /// The last timestamp this partition issued.
    pub last_ts: u64,
    /// `known[d]` at the last propagation: its own transactions up to it went to the
    /// siblings (a return's answer names it).
    pub propagated: u64,
}

/// One open transaction at its coordinator.
#[derive(Clone, Debug)]
pub(crate) struct Tx {
    /// The session that opened it.
    pub session: u64,
    /// Its snapshot.
    pub snap: Vector,
    /// Its updates, by partition, in order (`wbuff`).
    pub writes: BTreeMap<u32, Vec<(Key, Update)>>,
    /// Operations so far.
    pub ops: usize,
    /// Bytes of updates buffered.
    pub bytes: usize,
    /// What it waits for.
    pub pending: Pending,
    /// When it is dropped if still open.
    pub deadline: Time,
    /// A strong transaction's label (`Some(None)`: strong, unlabelled; `None`: causal).
    pub strong: Option<Option<String>>,
    /// The keys it read or updated, by partition (`rset`; kept for strong ones only).
    pub keys: BTreeMap<u32, BTreeSet<Key>>,
}

/// What an open transaction waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Pending {
    /// Nothing: the next operation may come.
    Idle,
    /// A partition's version of an object, for an operation (`update`: `None`, a read).
    Op {
        /// The request to answer.
        tag: RequestTag,
        /// The read's number.
        read: u64,
        /// The key.
        key: Key,
        /// Its kind.
        kind: Kind,
        /// The update, if the operation updates.
        update: Option<Update>,
    },
    /// The participants' prepare timestamps.
    Committing {
        /// The request to answer (`None`: answered already, outcome unknown, when the
        /// commit outlasted the time-out; it still finishes).
        tag: Option<RequestTag>,
        /// Participants yet to answer.
        waiting: BTreeSet<u32>,
        /// The commit vector so far.
        commit: Vector,
    },
    /// A strong transaction's commit waits for its snapshot's local entry to be uniform
    /// (3:2), indexed in `Coordinator::certify_waits`.
    Uniforming {
        /// The request to answer (`None`: answered already, outcome unknown).
        tag: Option<RequestTag>,
    },
    /// A strong transaction waits for the participants' durable votes.
    Certifying {
        /// The request to answer (`None`: answered already, outcome unknown).
        tag: Option<RequestTag>,
        /// Participants yet to vote.
        waiting: BTreeSet<u32>,
        /// The largest proposed strong timestamp so far.
        ts: u64,
        /// Its candidates' expiry (a candidate sent again to a new leader keeps it).
        expiry: u64,
    },
}

/// The coordinator's state (`coordinator.rs`).
#[derive(Debug, Default)]
pub(crate) struct Coordinator {
    /// Open transactions.
    pub txs: BTreeMap<TxId, Tx>,
    /// Each open transaction's session.
    pub sessions: BTreeMap<u64, TxId>,
    /// Open transactions by deadline.
    pub deadlines: BTreeSet<(Time, TxId)>,
    /// Reads sent to partitions, by number.
    pub reads: BTreeMap<u64, TxId>,
    /// Numbers reads.
    pub next_read: u64,
    /// Numbers transactions.
    pub next_tx: u64,
    /// Barriers waiting for `uniform[d]`, by the timestamp they need.
    pub barriers: BTreeMap<(u64, RequestTag), ()>,
    /// Attaches waiting, by the data center whose entry they wait on and the timestamp
    /// they need there; each with its whole vector.
    pub attaches: BTreeMap<(u32, u64, RequestTag), Vector>,
    /// Strong transactions waiting for `uniform[d]` before certification, by the
    /// timestamp they need.
    pub certify_waits: BTreeSet<(u64, TxId)>,
}

/// A strong transaction delivered or to be delivered to this partition.
#[derive(Clone, Debug)]
pub(crate) struct Voted {
    /// Its data center.
    pub origin: u32,
    /// Its proposed (while undecided) or final strong timestamp.
    pub ts: u64,
    /// Its snapshot.
    pub snap: Vector,
    /// Its updates of this partition.
    pub writes: Vec<(Key, Update)>,
}

/// What a certification leader knows of one strong transaction it certifies, until it
/// decides.
#[derive(Clone, Debug, Default)]
pub(crate) struct Ballot {
    /// Every participant (known from the candidate or a vote).
    pub participants: Vec<u32>,
    /// The clock reading past which the transaction is aborted if undecided.
    pub expiry: u64,
    /// Durable votes received, by partition (this one's own once durable).
    pub votes: BTreeMap<u32, (bool, u64)>,
    /// This partition's vote, once cast (durable or not).
    pub mine: Option<(bool, u64)>,
}

/// A vote in the certification log with no decision after it yet (the conflict index).
#[derive(Clone, Debug)]
pub(crate) struct OpenVote {
    /// Commit or abort.
    pub ok: bool,
    /// The proposed strong timestamp.
    pub ts: u64,
    /// The candidate's label.
    pub label: Option<String>,
    /// Its keys here.
    pub keys: Vec<Key>,
    /// Whether it updates some partition (only then later transactions must see it).
    pub updates: bool,
    /// Its snapshot.
    pub snap: Vector,
    /// Every participant.
    pub participants: Vec<u32>,
    /// Its expiry.
    pub expiry: u64,
}

/// A replica's part in its partition's certification (`docs/geo.md`, *Failover*).
#[derive(Clone, Debug, Default)]
pub(crate) enum Role {
    /// It stores the log of its ballot's leader.
    #[default]
    Follower,
    /// It stands for leader in its ballot and gathers its siblings' logs.
    Candidate(Election),
    /// It leads its ballot: it certifies, logs and replicates.
    Leader,
}

/// A candidate's election: the siblings that joined its ballot, with their logs.
#[derive(Clone, Debug, Default)]
pub(crate) struct Election {
    /// Per data center that joined: the ballot its log follows, its durable index, and
    /// its log from `first` on.
    pub joined: BTreeMap<u32, Joined>,
    /// Certification bodies that came while the election ran, handled once it is won.
    pub held: Vec<(NodeId, super::types::Body)>,
}

/// One sibling's answer to an election.
#[derive(Clone, Debug)]
pub(crate) struct Joined {
    /// The ballot of the leader whose log it follows.
    pub accepted: u64,
    /// Its durable index.
    pub durable: u64,
    /// The index of `records[0]`.
    pub first: u64,
    /// Its log from `first` to its end.
    pub records: Vec<Record>,
}

/// One partition's certification (`certify.rs`, `failover.rs`): the replicated log,
/// the delivery and the conflict index it drives, on every replica; the ballots, on the
/// leader.
#[derive(Debug, Default)]
pub(crate) struct Certifier {
    /// This replica's part.
    pub role: Role,
    /// The largest ballot this replica joined (its leader: `leader_of(ballot)`).
    pub ballot: u64,
    /// The ballot of the leader whose log this replica's log follows (from the first
    /// append of that leader taken on).
    pub accepted: u64,
    /// Per partition, the largest ballot known (whose leader coordinators and leaders
    /// send to); this partition's is `ballot`.
    pub views: Vec<u64>,
    /// The votes below this index are in the conflict index (the leader's whole log; a
    /// follower's applied prefix). Decisions enter it when they are applied, on every
    /// replica.
    pub indexed: u64,
    /// The conflict index: votes with no applied decision yet, by transaction.
    pub open: BTreeMap<TxId, OpenVote>,
    /// The conflict index: each transaction's applied outcome, for a new leader of
    /// another partition that asks again, until a `Forget` record forgets it.
    pub outcomes: BTreeMap<TxId, Outcome>,
    /// The outcomes, by expiry (the order in which they are forgotten).
    pub remembered: BTreeSet<(u64, TxId)>,
    /// The horizon of the last `Forget` applied: a transaction with an expiry at or
    /// below it that is neither open nor decided here is forgotten, or was never voted
    /// on here and never will be.
    pub forgotten: u64,
    /// The largest horizon of a `Forget` in the indexed log (on a leader, its whole
    /// log): no vote to come commits a transaction with an expiry at or below it.
    pub forgetting: u64,
    /// Leader: when it next asks the other participants whether they decided the
    /// committed transactions past their expiry it has not heard them decide.
    pub next_settle: Time,
    /// Leader: decisions logged and not yet applied, with their outcomes.
    pub deciding: BTreeMap<TxId, (bool, u64)>,
    /// The largest timestamp in any record this replica stored.
    pub top: u64,
    /// Records below this index are stored at every data center (as the leader last
    /// said): a follower forgets those it applied.
    pub everywhere: u64,
    /// Leader: once the log is durable to this index, these votes of the recovered log
    /// go out again (a new leader's, whose predecessor may not have sent them all).
    pub reannounce: Option<(u64, Vec<Reannounce>)>,
    /// The log from index `base` on.
    pub log: VecDeque<Record>,
    /// The index of `log[0]`.
    pub base: u64,
    /// Records below this index are durable (at a majority of data centers).
    pub durable: u64,
    /// Records below this index have been applied to the delivery state.
    pub applied: u64,
    /// Delivery state: transactions voted to commit here, undecided, by id.
    pub undecided: BTreeMap<TxId, Voted>,
    /// Their proposed timestamps (the smallest holds delivery back).
    pub undecided_ts: BTreeSet<(u64, TxId)>,
    /// Committed transactions waiting for delivery, by final timestamp.
    pub decided: BTreeMap<(u64, TxId), Voted>,
    /// The largest strong heartbeat applied.
    pub promise: u64,
    /// Leader: per data center, the log length its sibling stores.
    pub acked: Vec<u64>,
    /// Leader: per data center, the log length sent to its sibling (`None`: not known
    /// yet, until the sibling joins the ballot).
    pub sent: Vec<Option<u64>>,
    /// Leader: the durable index last told to each sibling.
    pub told: Vec<u64>,
    /// Leader: transactions certified here and not yet decided.
    pub ballots: BTreeMap<TxId, Ballot>,
    /// Leader: ballots with no vote of this partition yet, by expiry.
    pub expiries: BTreeSet<(u64, TxId)>,
    /// The conflict index: per key, the undecided updating transactions voted to commit
    /// here, with their labels.
    pub pending: BTreeMap<Key, BTreeMap<TxId, Option<String>>>,
    /// The conflict index: per key and label, the join of the commit vectors of the
    /// committed updating transactions (a snapshot includes them all iff it is above the
    /// join).
    pub committed: BTreeMap<Key, BTreeMap<Option<String>, Vector>>,
    /// Leader: the largest timestamp proposed or promised.
    pub last_proposal: u64,
}

/// A vote a new leader recovered with no decision after it: its transaction, every
/// participant and its expiry (`maybe_reannounce`).
pub(crate) type Reannounce = (TxId, Vec<u32>, u64);

/// A decided transaction's outcome, as a replica remembers it.
#[derive(Clone, Debug)]
pub(crate) struct Outcome {
    /// Committed.
    pub commit: bool,
    /// Its final strong timestamp (0 if aborted).
    pub ts: u64,
    /// Its expiry (it is forgotten after it).
    pub expiry: u64,
    /// Of a commit, the other participants not yet heard to have decided it (on a
    /// leader; a follower keeps them all): it is forgotten only once none is left, so
    /// that a `FORGOTTEN` answer never reaches an undecided participant of a commit.
    pub unsettled: Vec<u32>,
}

impl Certifier {
    /// The outcome of `id` here: applied, or (on a leader) logged.
    pub(crate) fn outcome(&self, id: TxId) -> Option<(bool, u64)> {
        match self.outcomes.get(&id) {
            Some(o) => Some((o.commit, o.ts)),
            None => self.deciding.get(&id).copied(),
        }
    }

    /// Whether `id`, with expiry `expiry`, is forgotten here: below the applied horizon,
    /// neither open nor decided (nor balloted, on a leader).
    pub(crate) fn is_forgotten(&self, id: TxId, expiry: u64) -> bool {
        expiry <= self.forgotten
            && !self.outcomes.contains_key(&id)
            && !self.open.contains_key(&id)
            && !self.deciding.contains_key(&id)
            && !self.ballots.contains_key(&id)
    }
}

/// The uniformity tracker's state (`uniform.rs`).
#[derive(Debug, Default)]
pub(crate) struct Uniformity {
    /// `localMatrix`: each partition of this data center's last known vector.
    pub local: Vec<Vector>,
    /// `stableVec`: what every partition of this data center stores.
    pub stable: Vector,
    /// `stableMatrix`: each data center's (this one's included) last stable vector.
    pub stable_matrix: Vec<Vector>,
    /// `globalMatrix`: each sibling's last known vector (this node's own at its data
    /// center's index).
    pub global: Vec<Vector>,
    /// `uniformVec`: per origin, what is stored at f+1 data centers including this one.
    pub uniform: Vector,
    /// When each sibling was last heard from.
    pub heard: Vec<Time>,
    /// Per (destination, suspected origin): the highest timestamp forwarded there.
    pub forwarded: BTreeMap<(u32, u32), u64>,
    /// When each partition of this data center was last heard from (`KNOWNVEC_LOCAL`).
    pub local_heard: Vec<Time>,
    /// The data centers each partition of this data center last said it suspects.
    pub local_suspected: Vec<Vec<u32>>,
}

/// One geo node. See the module's documentation.
#[derive(Debug)]
pub struct GeoEngine {
    pub(crate) config: Config,
    /// This replica.
    pub(crate) me: Member,
    /// Data centers.
    pub(crate) dcs: usize,
    /// Partitions per data center.
    pub(crate) partitions: u32,
    /// `replicas[dc][partition]`: the node holding it.
    pub(crate) replicas: Vec<Vec<NodeId>>,
    /// This boot's number (the channels start over with each).
    pub(crate) boot: u64,
    /// The latest local time seen.
    pub(crate) now: Time,
    pub(crate) partition: Partition,
    pub(crate) coordinator: Coordinator,
    pub(crate) uniformity: Uniformity,
    pub(crate) certifier: Certifier,
    /// Each peer's channel.
    pub(crate) channels: BTreeMap<NodeId, Channel>,
    /// Bodies this node sent itself, handled before the step ends.
    pub(crate) loopback: VecDeque<super::types::Body>,
    /// When local transactions are next sent to the siblings.
    pub(crate) next_propagate: Time,
    /// When vectors are next exchanged.
    pub(crate) next_broadcast: Time,
    pub(crate) counters: Counters,
    pub(crate) out: Outputs<super::types::Message, GeoReply, NoRecord>,
    /// A replica that restarted: it held its partition in memory, so what it stored is
    /// gone, and it stays failed (silent, refusing clients) rather than serve or report
    /// a state it lost (`docs/geo.md`, *Failures*).
    pub(crate) lost: bool,
    /// Per data center, whether it was removed from the keyspace for good (`remove.rs`);
    /// this replica's own: it stopped serving.
    pub(crate) removed: Vec<bool>,
    /// Per data center, its epoch: the changes made of it (`agree.rs`); odd while it is
    /// removed.
    pub(crate) epochs: Vec<u32>,
    /// Per data center, whether a return of it was made and it is not back yet (it
    /// counts as removed meanwhile: `docs/geo.md`, *Taking a data center back*).
    pub(crate) returning: Vec<bool>,
    /// The members of the removed data centers (nothing is queued for them, and what they
    /// send is dropped).
    pub(crate) removed_nodes: BTreeSet<NodeId>,
    /// Removals proposed here, promised here (`agree.rs`).
    pub(crate) agreement: agree::Agreement,
    /// Per data center, this survivor's part in its return under way (`back.rs`).
    pub(crate) welcomes: Vec<Option<back::Welcome>>,
    /// Per data center, the limit of each of its old lives kept for good, by epoch
    /// (`back.rs`).
    pub(crate) limits: Vec<Vec<back::Limit>>,
    /// The members of returning data centers heard, with the boot that opened its
    /// channel with `Join` (`back.rs`).
    pub(crate) joined: BTreeMap<NodeId, u64>,
    /// A new replica's join, until it is back (`back.rs`).
    pub(crate) joining: Option<back::Joining>,
    /// A new replica that is back: what its new sessions' first snapshots must show
    /// before it serves them, and until when it waits for that (`copy.rs`).
    pub(crate) catch_up: Option<copy::CatchUp>,
    /// Per data center, the copy this source is sending its new replica (`copy.rs`).
    pub(crate) sending: Vec<Option<copy::Sending>>,
    /// The hard state to make durable at the first step: the mark that this replica ran,
    /// which a restart finds.
    pub(crate) first_hard_state: Option<keel_types::HardState>,
}
