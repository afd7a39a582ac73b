//! The geo engine's types: vectors, transaction ids, objects and their updates, client
//! operations and results, peer messages, configuration and status.

use crate::engine::RequestTag;
use crate::time::Span;
pub use keel_types::geo::{
    Arbitration, GeoOp, GeoResult, Kind, Object, TxId, Update, Vector, LABEL_MAX,
};
use keel_types::{KeelError, Key, Limits, NodeId};
use serde::{Deserialize, Serialize};

/// The most data centers a geo keyspace spans (`D = 2f + 1 ≤ 7`).
pub const DCS_MAX: usize = 7;
/// The most partitions a data center is cut into.
pub const PARTITIONS_MAX: u32 = 1 << PARTITION_BITS;
/// The low bits of a local timestamp that name the partition that issued it: two
/// partitions never issue the same timestamp, so a data center's commit timestamps (each
/// the largest of its participants' prepare timestamps) are unique (`docs/geo.md`,
/// *Timestamps*).
pub const PARTITION_BITS: u32 = 10;

/// A client request to a geo keyspace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GeoRequest {
    /// Returned with the reply.
    pub tag: RequestTag,
    /// The client connection (a session: one transaction at a time).
    pub session: u64,
    /// The operation.
    pub op: GeoOp,
}

/// The reply to one geo request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GeoReply {
    /// The request's tag.
    pub tag: RequestTag,
    /// This node.
    pub served_by: NodeId,
    /// The result.
    pub result: Result<GeoResult, KeelError>,
}

/// A member of a geo keyspace: the replica of one partition in one data center.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// The node.
    pub node: NodeId,
    /// Its data center, `0..D`.
    pub dc: u32,
    /// The partition it holds, `0..N`.
    pub partition: u32,
}

/// A geo node's configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// This node.
    pub node: NodeId,
    /// Every replica: each data center holds every partition once.
    pub members: Vec<Member>,
    /// Data-center failures tolerated: the keyspace spans `2f + 1` data centers.
    pub f: u32,
    /// The unix time, µs, at which the node's local clock read 0: timestamps are this
    /// plus the local clock, so they stay close across nodes and grow across restarts.
    pub wall_clock_origin_us: u64,
    /// How often local transactions are sent to the siblings (`PROPAGATE_LOCAL_TXS`).
    pub propagate_every: Span,
    /// How often the known and stable vectors are exchanged (`BROADCAST_VECS`).
    pub broadcast_every: Span,
    /// How long an unacknowledged channel message waits before it is sent again.
    pub retransmit: Span,
    /// How long a silent sibling data center goes before it is suspected to have failed
    /// (this node then forwards that data center's transactions).
    pub suspect_after: Span,
    /// How long a transaction may stay open before it is dropped.
    pub tx_timeout: Span,
    /// Most transactions open at once on this node.
    pub txs_max: usize,
    /// Most operations in one transaction.
    pub tx_ops_max: usize,
    /// Most bytes of updates one transaction buffers.
    pub tx_bytes_max: usize,
    /// Key and value bounds.
    pub limits: Limits,
    /// Negative control: remote transactions become visible once this data center
    /// stores them, not once they are uniform (`docs/geo.md`, *Controls*).
    pub unsafe_expose_non_uniform: bool,
    /// Negative control: a replica that restarted serves again, empty, as if it had
    /// never run, instead of staying failed (`docs/geo.md`, *Controls*).
    pub unsafe_rejoin_empty: bool,
    /// Whether the keyspace serves strong transactions. Off, nothing is certified and
    /// the strong entry stays 0. On, the strong entry advances by the leaders' strong
    /// heartbeats; when a leader's data center is suspected, a sibling takes over
    /// (`docs/geo.md`, *Strong transactions*, *Failover*).
    pub strong: bool,
    /// The data center whose replicas lead certification first, one leader per
    /// partition; ballot `b` is led by data center `leader_dc + b` modulo the data
    /// centers (`docs/geo.md`, *Failover*).
    pub leader_dc: u32,
    /// Partition `p`'s leaders start at data center `leader_dc + p` (modulo the data
    /// centers) rather than all at `leader_dc`: certification leadership spread over the
    /// data centers, so that one data center's failure moves only its partitions'.
    pub spread_leaders: bool,
    /// Which labelled strong transactions conflict.
    pub conflicts: Conflicts,
    /// REDBLUE's baseline (`docs/geo.md`, *Modes*): partition 0's certification leader
    /// certifies every strong transaction, on every key it read or updated, so all strong
    /// transactions pass one certifier, one replica per data center; the other
    /// partitions a transaction updates only propose timestamps and log its updates.
    /// Off, each partition certifies the keys it holds.
    pub central_certifier: bool,
    /// Negative control: a strong transaction is certified without waiting for its
    /// snapshot's local entry to be uniform (`docs/geo.md`, *Controls*).
    pub unsafe_skip_strong_barrier: bool,
    /// Negative control: certification commits every strong transaction, conflicting or
    /// not (`docs/geo.md`, *Controls*).
    pub unsafe_certify_all: bool,
    /// Negative control: delivery ignores undecided votes, so a strong transaction can
    /// be delivered, and `known.strong` pass it, before one with a smaller timestamp
    /// (`docs/geo.md`, *Controls*).
    pub unsafe_deliver_early: bool,
    /// Negative control: a candidate that a majority joined leads with its own log, not
    /// the most advanced of theirs (`docs/geo.md`, *Controls*).
    pub unsafe_skip_recovery: bool,
    /// Negative control: a certification leader forgets a committed transaction once its
    /// expiry passed, without waiting for every participant to decide it (`docs/geo.md`,
    /// *Controls*).
    pub unsafe_forget_unsettled: bool,
    /// Negative control: collection forgets remote transactions once every data center
    /// neither removed nor suspected stores them, as if suspicion removed a data center
    /// (`docs/geo.md`, *Removing a data center*).
    pub unsafe_collect_suspected: bool,
    /// Negative control: an operator's removal is not refused when the data centers
    /// removed or failed for some partition would be more than `f` (`docs/geo.md`,
    /// *Removing a data center*).
    pub unsafe_remove_beyond_f: bool,
    /// Negative control: the node asked removes a data center on its own, as if no
    /// other node could be asked at the same time, instead of once a majority of the
    /// data centers' acceptors promised it (`docs/geo.md`, *Removing a data center*).
    pub unsafe_unagreed_removal: bool,
    /// Negative control: a removal notice whose sends were spent is not sent again when
    /// its removed member is heard, so a member cut off through them runs on untold.
    pub unsafe_notice_at_rest: bool,
    /// Negative control: a replica whose data center was removed goes silent without
    /// telling the survivors, so a removal that only it learned stays unknown to them.
    pub unsafe_removed_silent: bool,
    /// Negative control: an acceptor never asks about a vote it holds undecided, so a
    /// promise whose proposer failed before deciding is held for ever.
    pub unsafe_promises_held: bool,
    /// Negative control: an acceptor asked to abort a proposal it committed records it
    /// aborted (the first of committed and aborted no longer stands).
    pub unsafe_abort_committed: bool,
    /// A new replica of a removed data center, booted to take it back: it serves no
    /// client and sends nothing until it learns the return of its data center, then
    /// joins (`docs/geo.md`, *Taking a data center back: the protocol*).
    pub joining: bool,
    /// Negative control: a new replica takes the cut from the first `N - f` survivors'
    /// answers, not every survivor's, so what only a late survivor stored of the old life
    /// is dropped.
    pub unsafe_cut_quorum: bool,
    /// Negative control: a survivor keeps the returning data center's old rows when it
    /// learns the return instead of forgetting them, so it goes on collecting what the old
    /// life stored and the new replicas may never receive.
    pub unsafe_no_freeze: bool,
    /// Negative control: a survivor records the cut of a return but neither drops the old
    /// life above it nor caps what arrives of it later, so the new life's stream shows a
    /// fragment whose other partitions were lost.
    pub unsafe_no_cut: bool,
    /// Negative control: a past naming a data center's old life above its cut is let
    /// through at begin, barrier and attach, and reads on such a snapshot are answered.
    pub unsafe_no_life: bool,
    /// Negative control: a return's cut is not lowered out of the ranges its data
    /// center's earlier returns lost, and a survivor does not apply the earlier cuts a
    /// later cut names (`docs/geo.md`, *Taken back again*).
    pub unsafe_no_earlier_cuts: bool,
    /// Negative control: a replica's stable entry for a removed data center follows its
    /// partitions' rows into a life whose return's cut this replica never applied.
    pub unsafe_no_hold: bool,
}

/// The conflict relation of strong transactions, by label: two strong transactions
/// conflict when they touch a common key and their labels conflict. A transaction with
/// no label conflicts with every strong transaction; two labelled ones conflict only if
/// their pair is declared (the paper's withdrawals conflict with withdrawals, deposits
/// with nothing).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Conflicts {
    /// Declared pairs, each with its smaller label first.
    pairs: std::collections::BTreeSet<(String, String)>,
}

impl Conflicts {
    /// Declares that transactions labelled `a` conflict with those labelled `b`.
    pub fn declare(&mut self, a: &str, b: &str) {
        let (a, b) = if a <= b { (a, b) } else { (b, a) };
        self.pairs.insert((a.to_owned(), b.to_owned()));
    }

    /// Whether transactions labelled `a` and `b` conflict (on a common key).
    pub fn conflict(&self, a: Option<&str>, b: Option<&str>) -> bool {
        match (a, b) {
            (Some(a), Some(b)) => {
                let (a, b) = if a <= b { (a, b) } else { (b, a) };
                self.pairs.contains(&(a.to_owned(), b.to_owned()))
            }
            _ => true,
        }
    }

    /// The declared pairs.
    pub fn pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        self.pairs.iter().map(|(a, b)| (a.as_str(), b.as_str()))
    }
}

impl Config {
    /// A configuration for `node` among `members`, tolerating `f` failed data centers,
    /// with the defaults of `docs/geo.md`.
    pub fn new(node: NodeId, members: Vec<Member>, f: u32) -> Config {
        Config {
            node,
            members,
            f,
            wall_clock_origin_us: 0,
            propagate_every: Span::from_millis(5),
            broadcast_every: Span::from_millis(5),
            retransmit: Span::from_millis(200),
            suspect_after: Span::from_millis(2_000),
            tx_timeout: Span::from_millis(30_000),
            txs_max: 10_000,
            tx_ops_max: 1_000,
            tx_bytes_max: 16 << 20,
            limits: Limits::default(),
            unsafe_expose_non_uniform: false,
            unsafe_rejoin_empty: false,
            strong: false,
            leader_dc: 0,
            spread_leaders: false,
            conflicts: Conflicts::default(),
            central_certifier: false,
            unsafe_skip_strong_barrier: false,
            unsafe_certify_all: false,
            unsafe_deliver_early: false,
            unsafe_skip_recovery: false,
            unsafe_forget_unsettled: false,
            unsafe_collect_suspected: false,
            unsafe_remove_beyond_f: false,
            unsafe_unagreed_removal: false,
            unsafe_notice_at_rest: false,
            unsafe_removed_silent: false,
            unsafe_promises_held: false,
            unsafe_abort_committed: false,
            joining: false,
            unsafe_cut_quorum: false,
            unsafe_no_freeze: false,
            unsafe_no_cut: false,
            unsafe_no_life: false,
            unsafe_no_earlier_cuts: false,
            unsafe_no_hold: false,
        }
    }
}

/// One message of the protocol (`docs/geo.md`, *Messages*), carried in order on the
/// channel between two replicas.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Body {
    /// `GET_VERSION`: the object of `key` of `kind` on `snap` (coordinator → partition).
    GetVersion {
        /// The coordinator's number for the read.
        read: u64,
        /// The key.
        key: Key,
        /// Which object.
        kind: Kind,
        /// The snapshot.
        snap: Vector,
    },
    /// `VERSION`: the object read (partition → coordinator).
    Version {
        /// The read answered.
        read: u64,
        /// The object on the snapshot.
        object: Object,
    },
    /// `PREPARE`: the transaction's updates of the receiver's partition.
    Prepare {
        /// The transaction.
        tx: TxId,
        /// Its updates there, in order.
        writes: Vec<(Key, Update)>,
        /// Its snapshot.
        snap: Vector,
    },
    /// `PREPARE_ACK`: the partition's prepare timestamp.
    PrepareAck {
        /// The transaction.
        tx: TxId,
        /// The prepare timestamp.
        ts: u64,
    },
    /// `COMMIT`: the transaction's commit vector.
    Commit {
        /// The transaction.
        tx: TxId,
        /// Its commit vector.
        commit: Vector,
    },
    /// `REPLICATE`: transactions of data center `origin`, in its timestamp order.
    Replicate {
        /// Their data center.
        origin: u32,
        /// The transactions, with their updates of this partition.
        txs: Vec<Replicated>,
    },
    /// `HEARTBEAT`: data center `origin` has no transaction for this partition up to
    /// `ts` beyond those sent.
    Heartbeat {
        /// The data center.
        origin: u32,
        /// The timestamp.
        ts: u64,
    },
    /// `KNOWNVEC_LOCAL`: the sender's known vector (to the partitions of its data center),
    /// and the ballot of the certification leader whose log it follows (so that
    /// coordinators find each partition's leader: a candidate's ballot counts only once it
    /// leads).
    KnownLocal {
        /// Its known vector.
        known: Vector,
        /// The ballot its partition's certification log follows.
        ballot: u64,
        /// The data centers it suspects (or knows removed): a data center fails
        /// partition by partition (a lost replica), and an operator's removal must count
        /// every partition's failures, not only the asked node's (`remove.rs`).
        suspected: Vec<u32>,
    },
    /// `STABLEVEC` and `KNOWNVEC_GLOBAL` (to the siblings): the sender's stable and
    /// known vectors.
    Vectors {
        /// Its stable vector.
        stable: Vector,
        /// Its known vector.
        known: Vector,
        /// The largest certification ballot it joined (a sibling that missed an election
        /// joins it, so that it suspects a dead candidate and elects past it).
        ballot: u64,
        /// Per partition, the largest ballot it knows that partition's certification
        /// leader to lead (its own partition: the ballot its log follows). A replica whose
        /// data center lost a partition's replica learns where that partition's leader
        /// moved from its siblings, rather than send its votes to a stepped-down leader
        /// for ever.
        leaders: Vec<u64>,
    },
    /// `CERTIFY`: a strong transaction's part at the receiver's partition (coordinator
    /// → the partition's certification leader).
    Certify(Box<Candidate>),
    /// A partition's durable certification vote (its leader → the coordinator and the
    /// other participants' leaders).
    Vote {
        /// The transaction.
        tx: TxId,
        /// Commit (no conflict) or abort.
        ok: bool,
        /// The partition's proposed strong timestamp (0 with an abort).
        ts: u64,
        /// Every participant.
        participants: Vec<u32>,
        /// The clock reading past which the transaction aborts if undecided.
        expiry: u64,
        /// The ballot the sender leads in.
        ballot: u64,
        /// An answer to a vote that found the transaction decided here (the vote is
        /// then the decision: commit at the final timestamp, or abort); not answered.
        answer: bool,
    },
    /// The certification log from `first` on (leader of `ballot` → its siblings), and
    /// how far it is durable (stored at a majority of the data centers).
    Append {
        /// The leader's ballot.
        ballot: u64,
        /// The index of `records[0]`.
        first: u64,
        /// Records, in log order.
        records: Vec<Record>,
        /// Records below this index are durable.
        durable: u64,
        /// Records below this index are stored at every data center (a sibling may
        /// forget those it applied).
        everywhere: u64,
    },
    /// The sibling stores the certification log of `ballot`'s leader below `through`
    /// (`ok`), or could not take the last append and asks for the log from `through`,
    /// its durable index (sibling → leader).
    Appended {
        /// The leader's ballot.
        ballot: u64,
        /// Its log's length, or where it needs the log from.
        through: u64,
        /// Whether the append was taken.
        ok: bool,
    },
    /// A candidate for the leadership of its partition's certification in `ballot`
    /// asks its siblings to join it and to send their logs from `from` (its durable
    /// index) on (the first phase of Paxos).
    Elect {
        /// The ballot.
        ballot: u64,
        /// The candidate's durable index.
        from: u64,
    },
    /// A sibling joins `ballot`: it follows no leader of a smaller ballot any more,
    /// and sends its log from `first` on, with the ballot of the leader it was last
    /// following and its durable index.
    Elected {
        /// The ballot joined.
        ballot: u64,
        /// The ballot of the leader whose log this sibling's log follows.
        accepted: u64,
        /// Its durable index.
        durable: u64,
        /// The index of `records[0]`.
        first: u64,
        /// Its records from `first` to the end of its log.
        records: Vec<Record>,
    },
    /// A sibling is in a larger ballot than the message it answers (sibling → a stale
    /// leader or candidate, which steps down).
    Outvoted {
        /// The sibling's ballot.
        ballot: u64,
    },
    /// Has the receiver's partition decided these committed transactions, each with its
    /// expiry (a leader → another participant's leader, before it forgets them)?
    Settle {
        /// The transactions and their expiries.
        txs: Vec<(TxId, u64)>,
    },
    /// The receiver's partition applied a decision of each of these transactions
    /// (answers `SETTLE`).
    Settled {
        /// The transactions.
        txs: Vec<TxId>,
    },
    /// The sender's partition forgot the transaction (its expiry is below the horizon
    /// of its log's last applied `Forget`): it voted on it and every participant decided
    /// it, or it never voted and never will. A participant still undecided takes it as
    /// an abort; a coordinator, as an unknown outcome (leader → the sender of a
    /// candidate or a vote).
    Forgotten {
        /// The transaction.
        tx: TxId,
    },
    /// A change of a data center was made (an operator's `KEEL.NODE REMOVE`, or the
    /// return of a removed data center): every replica that learns it tells every other
    /// one once (to any node). A removal is also the notice its members get.
    Changed {
        /// The change.
        change: Change,
    },
    /// A step of a removed data center's return (`engine/back.rs`, `docs/geo.md`,
    /// *Taking a data center back: the protocol*).
    Back(Back),
    /// The node an operator asked proposes a change of a data center (→ each data
    /// center's acceptor, its replica of partition 0): changes are agreed, so that two
    /// removals asked at once at different nodes never remove more than `f` together,
    /// and changes are made one at a time (`engine/agree.rs`).
    ChangePropose {
        /// The proposal, numbered by its proposer.
        id: u64,
        /// The change.
        change: Change,
    },
    /// The acceptor promised proposal `id`: it promises no other change until this one
    /// is made or withdrawn. With the data centers it knows removed and those it counts
    /// failed for some partition (acceptor → proposer).
    ChangePromised {
        /// The proposal.
        id: u64,
        /// The data centers the acceptor knows removed (returning ones included).
        removed: Vec<u32>,
        /// The data centers it counts failed for some partition.
        failed: Vec<u32>,
    },
    /// The acceptor refused proposal `id` (acceptor → proposer).
    ChangeRefused {
        /// The proposal.
        id: u64,
        /// Why.
        why: ChangeRefusal,
    },
    /// The proposer gave proposal `id` up, or counted the acceptor's promise out: a
    /// promise held is recorded aborted (proposer → the acceptors it asked).
    ChangeWithdrawn {
        /// The proposal.
        id: u64,
        /// The change it would have made.
        change: Change,
    },
    /// A majority promised proposal `id` (a removal: within `f`): the acceptor records it
    /// committed if it holds the promise, else aborted (proposer → the promisers it
    /// counted).
    ChangeCommit {
        /// The proposal.
        id: u64,
        /// The change.
        change: Change,
    },
    /// An acceptor held its vote on `proposer`'s proposal `id` undecided too long: the
    /// acceptor asked records it aborted unless it committed it, and answers its vote
    /// (acceptor → every acceptor).
    ChangeAbort {
        /// The proposer.
        proposer: NodeId,
        /// The proposal.
        id: u64,
        /// The change it would make.
        change: Change,
    },
    /// An acceptor's vote on `proposer`'s proposal `id`, as it recorded it (acceptor →
    /// the proposer, for a commit; → the asker, for an abort).
    ChangeVote {
        /// The proposer.
        proposer: NodeId,
        /// The proposal.
        id: u64,
        /// The change it would make.
        change: Change,
        /// The vote.
        vote: ChangeAnswer,
    },
}

/// A change of one data center, agreed by the acceptors (`engine/agree.rs`): the epoch
/// it makes. Every data center starts at epoch 0; an odd epoch removes it, the even one
/// after takes it back with fresh replicas, in life `epoch / 2` (`docs/geo.md`,
/// *Taking a data center back*).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Change {
    /// The data center.
    pub dc: u32,
    /// The epoch it makes.
    pub epoch: u32,
}

impl Change {
    /// Whether it removes the data center (else it takes it back).
    pub fn removes(self) -> bool {
        self.epoch % 2 == 1
    }

    /// The life a return starts.
    pub fn life(self) -> u32 {
        self.epoch / 2
    }
}

/// The bodies of a return (`Body::Back`): between the survivors' replicas and the new
/// replicas of the data center taken back, each naming the epoch of the return.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Back {
    /// The first body of every channel a new replica opens: a member of a returning
    /// data center is heard only from the boot whose channel opened with it (the old
    /// life never sends one).
    Join {
        /// The return's epoch.
        epoch: u32,
    },
    /// A survivor's answer to the return (survivor → the new replica of its partition,
    /// right after the `Changed` of the return): what it stores of the returning data
    /// center's old life (its known entry), its own known entry as far as it propagated
    /// it, and the epochs it knows.
    Answer {
        /// The return's epoch.
        epoch: u32,
        /// Its known entry for the returning data center.
        stored: u64,
        /// Its own known entry at its last propagation.
        own: u64,
        /// Each data center's epoch, as it knows it.
        epochs: Vec<u32>,
        /// The cuts of the returning data center's earlier returns it applied, `(cut,
        /// epoch)`: the ranges they lost are lost for this return's cut too.
        cuts: Vec<(u64, u32)>,
    },
    /// The largest entry the survivors store, among a new replica's answers, one from
    /// every survivor (new replica → the new replica of partition 0).
    Partial {
        /// The return's epoch.
        epoch: u32,
        /// The largest entry.
        stored: u64,
        /// The earlier cuts its answers named (`Answer::cuts`).
        cuts: Vec<(u64, u32)>,
    },
    /// The cut: what survives of the old life, the smallest partial (the new replica of
    /// partition 0 → every replica of every survivor and of the data center).
    Cut {
        /// The return's epoch.
        epoch: u32,
        /// The cut.
        cut: u64,
        /// The earlier returns' cuts the partials named, `(cut, epoch)`: a survivor that
        /// never applied one (its return was abandoned first) applies it before this one.
        earlier: Vec<(u64, u32)>,
    },
    /// The survivor applied the cut and its known entry reached it (survivor → the new
    /// replica of its partition).
    Settled {
        /// The return's epoch.
        epoch: u32,
    },
    /// A new replica asks the source (a survivor's replica of its partition, settled)
    /// for its copy, once the source's known vector covers `need` (each survivor's
    /// propagated entry, from its answer: the survivors' streams held since then connect).
    CopyAsk {
        /// The return's epoch.
        epoch: u32,
        /// Per data center, the known entry the copy must cover.
        need: Vec<u64>,
    },
    /// A chunk of the copy: transactions the source stores, each with its data center
    /// (source → the new replica).
    Chunk {
        /// The return's epoch.
        epoch: u32,
        /// The transactions, by origin.
        txs: Vec<(u32, Replicated)>,
    },
    /// The copy's end: the known vector it covers, and per data center the entry above
    /// which the source still held the transactions for forwarding.
    Copied {
        /// The return's epoch.
        epoch: u32,
        /// The source's known vector when it copied.
        known: Vector,
        /// Per data center, the transactions above it are kept for forwarding.
        kept: Vec<u64>,
        /// The cuts of earlier returns the source keeps (data center, cut, epoch).
        limits: Vec<(u32, u64, u32)>,
    },
    /// The new replica installed its copy and is back (new replica → every survivor's
    /// replica of its partition): it is heard as any sibling from then on.
    Installed {
        /// The return's epoch.
        epoch: u32,
        /// Its known vector when it installed.
        known: Vector,
    },
}

impl Back {
    /// The epoch of the return it belongs to.
    pub fn epoch(&self) -> u32 {
        match self {
            Back::Join { epoch }
            | Back::Answer { epoch, .. }
            | Back::Partial { epoch, .. }
            | Back::Cut { epoch, .. }
            | Back::Settled { epoch }
            | Back::CopyAsk { epoch, .. }
            | Back::Chunk { epoch, .. }
            | Back::Copied { epoch, .. }
            | Back::Installed { epoch, .. } => *epoch,
        }
    }
}

/// An acceptor's vote on a proposed change (`Body::ChangeVote`), recorded for good.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChangeAnswer {
    /// Committed: it counts toward the majority that makes the change.
    Committed,
    /// Aborted: it never commits.
    Aborted,
    /// The acceptor knows the change made (by this proposal or another).
    Made,
}

/// Why an acceptor refused a proposed change (`Body::ChangeRefused`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChangeRefusal {
    /// It promised another change, not yet made or withdrawn.
    Pending {
        /// That change.
        change: Change,
    },
    /// The data centers removed or failed for some partition, as it counts them, the
    /// proposed one included, would be more than `f`.
    BeyondF {
        /// Those data centers.
        gone: Vec<u32>,
    },
    /// It recorded this proposal aborted (another acceptor asked it to, the proposal's
    /// promises having been held too long) before the proposal reached it.
    Aborted,
    /// The data center is at another epoch there than the one below the change's (the
    /// proposer or the acceptor has not heard of the last change yet).
    Epoch {
        /// The data center's epoch at the acceptor.
        epoch: u32,
    },
    /// Another data center's return is under way there: changes that take a data
    /// center back are made one at a time, until each is back.
    Returning {
        /// That data center.
        dc: u32,
    },
}

/// A strong transaction's part at one partition, as certification judges it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Candidate {
    /// The transaction.
    pub tx: TxId,
    /// Its data center.
    pub origin: u32,
    /// Its label (`None`: it conflicts with every strong transaction).
    pub label: Option<String>,
    /// The keys of the partition it read or updated.
    pub keys: Vec<Key>,
    /// Its updates of the partition, in order.
    pub writes: Vec<(Key, Update)>,
    /// Whether it updates any partition (a read-only one need not be seen by later
    /// conflicting transactions).
    pub updates: bool,
    /// Its snapshot.
    pub snap: Vector,
    /// Every partition it touched (each votes).
    pub participants: Vec<u32>,
    /// The timestamp (its coordinator's clock plus the transaction time-out) past which
    /// a participant that has not voted votes abort: a coordinator that failed halfway
    /// leaves no transaction undecided for ever.
    pub expiry: u64,
}

/// One record of a partition's certification log, replicated from its leader to its
/// siblings; a durable record is at a majority of data centers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Record {
    /// The partition's vote on a candidate (with its updates when it votes commit).
    Vote {
        /// The candidate.
        candidate: Box<Candidate>,
        /// Commit or abort.
        ok: bool,
        /// Its proposed strong timestamp.
        ts: u64,
    },
    /// The outcome: committed at strong timestamp `ts` (the largest proposal) or not.
    Decide {
        /// The transaction.
        tx: TxId,
        /// Committed.
        commit: bool,
        /// Its strong timestamp.
        ts: u64,
    },
    /// `HEARTBEAT_STRONG`: no vote to come proposes a timestamp at or below `ts`.
    Promise {
        /// The timestamp.
        ts: u64,
    },
    /// The partition never votes to commit a transaction it has not voted on whose
    /// expiry is at or below `below`, and every participant decided each transaction it
    /// decided with such an expiry: replicas forget those outcomes.
    Forget {
        /// The horizon.
        below: u64,
    },
}

/// A committed transaction's updates of one partition, as replicated.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replicated {
    /// The transaction.
    pub tx: TxId,
    /// Its commit vector.
    pub commit: Vector,
    /// Its updates of the partition, in order.
    pub writes: Vec<(Key, Update)>,
}

/// What one replica sends another: the channel's numbered bodies and its
/// acknowledgement of what it received (`docs/geo.md`, *Channels*).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// The sender's boot (the channel starts over with each): the receiver drops a
    /// message of an earlier boot, and starts its receiving side over at a later one.
    pub boot: u64,
    /// The boot of the receiver this message acknowledges (`ack` counts its messages).
    pub peer_boot: u64,
    /// Every body numbered below this, of the receiver's boot `peer_boot`, arrived.
    pub ack: u64,
    /// The number of `bodies[0]`.
    pub first: u64,
    /// Bodies numbered `first..`.
    pub bodies: Vec<Body>,
}

/// A joining replica's progress (`Status::join`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinStatus {
    /// The return's epoch, once learned.
    pub epoch: Option<u32>,
    /// The survivor data centers whose answers it took.
    pub answered: Vec<u32>,
    /// The cut, once known.
    pub cut: Option<u64>,
    /// The survivor data centers settled for its partition.
    pub settled: Vec<u32>,
    /// The survivor data center asked for the copy, once asked.
    #[serde(default)]
    pub source: Option<u32>,
}

/// How often each path of the protocol was taken.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Transactions begun.
    pub begun: u64,
    /// Update transactions committed (as coordinator).
    pub committed: u64,
    /// Read-only transactions committed.
    pub committed_read_only: u64,
    /// Transactions dropped: aborted, timed out, or their coordinator's limits.
    pub dropped: u64,
    /// Reads that waited for the partition's known vector (1:21).
    pub reads_waited: u64,
    /// Commits that waited for the partition's clock (1:43).
    pub commits_waited: u64,
    /// Remote transactions applied.
    pub replicated_in: u64,
    /// Remote transactions received again and dropped (forwarded duplicates).
    pub duplicates: u64,
    /// Remote transactions forwarded for a suspected data center.
    pub forwarded: u64,
    /// Barriers that waited.
    pub barriers_waited: u64,
    /// Attaches that waited.
    pub attaches_waited: u64,
    /// Channel messages sent again.
    pub retransmits: u64,
    /// Remote transactions forgotten once stored everywhere.
    pub collected: u64,
    /// Peer messages the gate dropped.
    pub rejected: u64,
    /// Peer messages a lost replica (one that restarted) dropped.
    #[serde(default)]
    pub dropped_lost: u64,
    /// Peer messages dropped because their sender's data center was removed.
    #[serde(default)]
    pub dropped_removed: u64,
    /// Notices of removal sent again because their removed peer was heard after their
    /// sends were spent.
    #[serde(default)]
    pub notices_rearmed: u64,
    /// Removals this replica learned from the removed data center's own member, which
    /// tells them as it stops (`GeoEngine::last_word`).
    #[serde(default)]
    pub removals_told: u64,
    /// Data centers this replica learned were removed.
    #[serde(default)]
    pub removals: u64,
    /// Returns of a removed data center this replica learned were made.
    #[serde(default)]
    pub returns: u64,
    /// Returns this survivor learned and answered (`engine/back.rs`).
    #[serde(default)]
    pub returns_welcomed: u64,
    /// Returns whose cut this survivor applied.
    #[serde(default)]
    pub cuts_applied: u64,
    /// Cuts this new replica of partition 0 made.
    #[serde(default)]
    pub cuts_made: u64,
    /// Returns this survivor said it settled.
    #[serde(default)]
    pub returns_settled: u64,
    /// Channels of a returning member heard once they opened with `Join`.
    #[serde(default)]
    pub joins_heard: u64,
    /// Joins this new replica started over: the return it joined was abandoned, and it
    /// waits, as a wiped one, for the next (`GeoEngine::rejoin`).
    #[serde(default)]
    pub joins_restarted: u64,
    /// Transactions a new replica just back refused to begin: what they would see was
    /// still below what survived (`CatchUp`).
    #[serde(default)]
    pub begins_held: u64,
    /// Catch-ups that ended at their time-out rather than with the view caught up.
    #[serde(default)]
    pub catch_ups_expired: u64,
    /// Operation-log entries of a returning data center's old life dropped above its cut,
    /// and old-life transactions dropped on arrival after it.
    #[serde(default)]
    pub old_life_dropped: u64,
    /// Bodies a joining replica dropped (it takes only the return's).
    #[serde(default)]
    pub dropped_joining: u64,
    /// Copies this survivor sent a new replica of a returning data center.
    #[serde(default)]
    pub copies_sent: u64,
    /// Copies this new replica installed (it is back).
    #[serde(default)]
    pub copies_installed: u64,
    /// Survivors' streams a new replica replayed on installing.
    #[serde(default)]
    pub streams_replayed: u64,
    /// Survivors' streams a new replica dropped on installing, as they did not connect to
    /// its copy (their data center was removed meanwhile: forwarding brings them).
    #[serde(default)]
    pub streams_dropped: u64,
    /// New replicas this survivor heard back (`Installed`).
    #[serde(default)]
    pub returns_back: u64,
    /// Requests refused for a past naming a data center's old life above its cut.
    #[serde(default)]
    pub stale_pasts_refused: u64,
    /// Reads dropped for a snapshot naming a data center's old life above its cut (their
    /// transactions time out).
    #[serde(default)]
    pub lost_reads_dropped: u64,
    /// Earlier returns' cuts a survivor applied late, from a later return's cut.
    #[serde(default)]
    pub earlier_cuts_taken: u64,
    /// Removals refused (this replica's own data center, or more than f removed or
    /// suspected).
    #[serde(default)]
    pub removals_refused: u64,
    /// Removals this replica proposed to the acceptors (as the node asked).
    #[serde(default)]
    pub removals_proposed: u64,
    /// Proposed removals this replica's acceptor promised.
    #[serde(default)]
    pub removals_promised: u64,
    /// Proposed removals this replica's acceptor refused, another being promised.
    #[serde(default)]
    pub removals_refused_pending: u64,
    /// Proposed removals this replica committed (a majority promised within `f`).
    #[serde(default)]
    pub removals_committing: u64,
    /// Asks this replica's acceptor sent about a vote it held undecided too long.
    #[serde(default)]
    pub removal_asks: u64,
    /// Votes this replica's acceptor released as aborted: promises an ask aborted, and
    /// commits a majority answered aborted.
    #[serde(default)]
    pub removals_aborted: u64,
    /// Removals this replica's acceptor learned were made from a majority's votes.
    #[serde(default)]
    pub removals_found_made: u64,
    /// Strong transactions committed (as coordinator).
    #[serde(default)]
    pub strong_committed: u64,
    /// Strong transactions certification aborted (as coordinator).
    #[serde(default)]
    pub strong_aborted: u64,
    /// Strong transactions that waited for their snapshot to be uniform.
    #[serde(default)]
    pub strong_barriers_waited: u64,
    /// Strong transactions sent to certification (as coordinator).
    #[serde(default)]
    pub certifying: u64,
    /// Votes this replica cast as a certification leader.
    #[serde(default)]
    pub votes: u64,
    /// Strong transactions delivered to this partition's log.
    #[serde(default)]
    pub strong_delivered: u64,
    /// Elections this replica started for its partition's certification.
    #[serde(default)]
    pub elections: u64,
    /// Elections this replica won: it leads its partition's certification.
    #[serde(default)]
    pub takeovers: u64,
    /// Times this replica stopped leading or standing for a larger ballot.
    #[serde(default)]
    pub stepped_down: u64,
    /// Candidates and votes sent again to a partition's new leader.
    #[serde(default)]
    pub resent_to_new_leader: u64,
    /// Times a sibling's vectors told this replica of a partition's leader it did not
    /// know of.
    #[serde(default)]
    pub leaders_learned_from_siblings: u64,
    /// Decisions a new leader sent the other participants in place of a vote it
    /// recovered (decided before the recovered log was durable again).
    #[serde(default)]
    pub decisions_reannounced: u64,
    /// Decided transactions this replica forgot, once settled (`Record::Forget`).
    #[serde(default)]
    pub outcomes_forgotten: u64,
    /// Candidates and votes this leader answered `FORGOTTEN`.
    #[serde(default)]
    pub answered_forgotten: u64,
    /// `FORGOTTEN` answers that decided a transaction here (as its coordinator, an
    /// unknown outcome; as a participant, an abort).
    #[serde(default)]
    pub forgotten_taken: u64,
}

/// A geo node's state, as `/status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// This node.
    pub node: NodeId,
    /// Its data center.
    pub dc: u32,
    /// Its partition.
    pub partition: u32,
    /// Its known vector.
    pub known: Vector,
    /// Its stable vector.
    pub stable: Vector,
    /// Its uniform vector.
    pub uniform: Vector,
    /// Keys in its operation log.
    pub keys: usize,
    /// Operation-log entries.
    pub entries: usize,
    /// Transactions open here.
    pub open: usize,
    /// Prepared transactions not yet committed.
    pub prepared: usize,
    /// Data centers this node suspects.
    pub suspected: Vec<u32>,
    /// Messages sent to peers and not yet acknowledged (what a failed or cut-off data
    /// center has yet to receive).
    pub unacked: usize,
    /// Remote transactions kept for forwarding (until every data center stores them).
    pub forwardable: usize,
    /// Whether this replica restarted and lost what it stored: it stays failed, silent to
    /// its peers and refusing clients (`docs/geo.md`, *Failures*).
    #[serde(default)]
    pub lost: bool,
    /// Data centers removed from the keyspace, as this node knows (its own among them:
    /// it stopped serving).
    #[serde(default)]
    pub removed: Vec<u32>,
    /// The data center whose removal this replica's acceptor (partition 0) promised and
    /// has not yet seen made or withdrawn: it promises no other change meanwhile.
    #[serde(default)]
    pub removal_promised: Option<u32>,
    /// The data centers whose removal this replica's acceptor committed, the outcome not
    /// yet known: it counts them removed meanwhile.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removal_committed: Vec<u32>,
    /// The data center whose return this replica's acceptor promised and has not yet seen
    /// made or withdrawn: it promises no other change meanwhile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub return_promised: Option<u32>,
    /// Data centers taken back and not back yet, as this node knows (they count as
    /// removed meanwhile: `docs/geo.md`, *Taking a data center back*).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub returning: Vec<u32>,
    /// Each data center's epoch: the changes made of it, as this node knows (odd while it
    /// is removed).
    #[serde(default)]
    pub epochs: Vec<u32>,
    /// A new replica of a data center coming back, not back yet: it serves no client.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub joining: bool,
    /// A joining replica's progress: the return's epoch once learned, the survivors
    /// that answered, the cut once known, the survivors settled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub join: Option<JoinStatus>,
    /// The cuts applied here, by returning data center: what survives of its old life,
    /// with the epoch of the return that made it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cuts: Vec<(u32, u64, u32)>,
    /// Its part in its partition's certification, in a keyspace with strong transactions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certification: Option<Certification>,
    /// How often each path was taken.
    pub counters: Counters,
}

/// A replica's part in its partition's certification (`docs/geo.md`, *Failover*).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Certification {
    /// The largest ballot it joined.
    pub ballot: u64,
    /// That ballot's data center.
    pub leader_dc: u32,
    /// Whether it leads.
    pub leads: bool,
    /// Records held in its certification log.
    pub log: usize,
    /// Its durable index.
    pub durable: u64,
    /// Votes in its log with no decision yet.
    pub open_votes: usize,
    /// Decided transactions it remembers (until every participant decided them and
    /// their expiry passed).
    #[serde(default)]
    pub outcomes: usize,
}

/// Refusal for an operation a geo keyspace cannot serve.
pub fn refuse(why: impl Into<String>) -> KeelError {
    KeelError::InvalidArgument(why.into())
}
