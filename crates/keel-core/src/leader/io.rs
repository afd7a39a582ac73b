//! The leader engine's types: its peer [`Message`]s, its [`Config`], its [`Status`],
//! and its instances of the engine contract's [`Input`] and [`Outputs`] (see
//! `crate::engine` for the ordering contract every driver carries out).

use crate::time::{Span, Time};
use keel_types::{
    Durability, Entry, Epoch, Limits, LogIndex, NodeId, ReadLevel, SnapshotMeta, Version,
};
use serde::{Deserialize, Serialize};

pub use crate::engine::{
    ClientReply, ClientRequest, PersistedState, Release, RequestTag, SnapshotBytes,
};

/// An event given to the leader engine.
pub type Input = crate::engine::Input<Message, ClientRequest>;

/// What the leader engine asks its driver to do (see [`crate::engine::Outputs`]).
pub type Outputs = crate::engine::Outputs<Message, ClientReply>;

/// What an `Append` says of the receiver's active-set lease (`docs/protocol.md` §8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Lease {
    /// Grants (renews) the lease until `anchor + mark_out_timeout` on the receiver's clock.
    /// `anchor` is the `sent_at` of the latest `AppendReply` the leader received from the
    /// receiver (the receiver's own clock), so a delayed grant cannot stretch the lease.
    Granted {
        /// The anchor, on the receiver's clock.
        anchor: Time,
    },
    /// No grant: the receiver is outside the active set, has not applied the durable
    /// index, or the leader lacks its own lease. Ends any lease the receiver holds.
    Withheld,
    /// A forced mark-out: ends any lease the receiver holds, and asks it to promise, with a
    /// `released` reply, to ignore every grant anchored before that reply.
    MarkOut,
}

/// A peer-to-peer message. All carry the sender's epoch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Message {
    /// Pre-vote (asked before a real election so that a node cut off from the majority
    /// does not raise its epoch and depose a healthy leader when it returns): "would you
    /// vote for me in `epoch + 1`?" Changes no state at the receiver.
    PreVote {
        /// The asker's current epoch (it would campaign in the next one).
        epoch: Epoch,
        /// The asker's last log entry `(epoch, index)`.
        last_epoch: Epoch,
        /// See `last_epoch`.
        last_index: LogIndex,
    },
    /// Reply to `PreVote`.
    PreVoteReply {
        /// The replier's current epoch.
        epoch: Epoch,
        /// Whether the replier would vote for the asker in the asker's next epoch.
        granted: bool,
    },
    /// Vote request.
    RequestVote {
        /// The candidate's epoch.
        epoch: Epoch,
        /// The candidate's last log entry `(epoch, index)`.
        last_epoch: Epoch,
        /// See `last_epoch`.
        last_index: LogIndex,
        /// A leadership transfer: the leader of `epoch - 1` told the candidate to campaign
        /// and serves no lease read from then on, so a voter of that epoch may vote
        /// although it heard that leader recently (`docs/protocol.md` §16).
        transfer: bool,
    },
    /// The leader hands its leadership to a caught-up voter: "campaign now, in the epoch
    /// after `epoch`". Sent once the leader holds no lease for the rest of its epoch.
    TimeoutNow {
        /// The leader's epoch.
        epoch: Epoch,
        /// The leader's last log entry `(epoch, index)`: the target campaigns only if its
        /// own log ends there too (a crash since its last reply may have cut its log).
        last_epoch: Epoch,
        /// See `last_epoch`.
        last_index: LogIndex,
    },
    /// Vote reply.
    Vote {
        /// The voter's epoch.
        epoch: Epoch,
        /// Whether the vote was granted.
        granted: bool,
    },
    /// Replication, heartbeat, lease renewal and durability-round request in one.
    Append {
        /// The leader's epoch.
        epoch: Epoch,
        /// The entry before `entries` (log matching).
        prev_epoch: Epoch,
        /// See `prev_epoch`.
        prev_index: LogIndex,
        /// Entries to append (may be empty for a heartbeat).
        entries: Vec<Entry>,
        /// The leader's commit index (replicated on a majority).
        commit_index: LogIndex,
        /// The leader's durable index (ORCA: persisted and applied on the whole active
        /// set; never decreases within an epoch).
        durable_index: LogIndex,
        /// The receiver's active-set lease: granted (renewed), withheld, or a forced
        /// mark-out the receiver must acknowledge.
        lease: Lease,
        /// A durability round or a `durable` write: when set, the follower fsyncs its log
        /// at once (not at its next flush interval) and, when the fsync completes, sends an
        /// `AppendReply` with the new persisted index.
        flush_through: Option<LogIndex>,
        /// The leader's send time on its own clock, echoed back to anchor the lease.
        sent_at: Time,
    },
    /// Reply to `Append`.
    AppendReply {
        /// The follower's epoch.
        epoch: Epoch,
        /// Whether log matching held and the entries were accepted.
        success: bool,
        /// The follower's last log index after handling the request (a hint on failure).
        last_index: LogIndex,
        /// The highest index the follower has fsynced.
        persisted_index: LogIndex,
        /// The highest index the follower has applied.
        applied_index: LogIndex,
        /// The highest index verified, in this epoch, to match the leader's log. Entries
        /// above it may belong to an older epoch and are not counted by the leader.
        match_index: LogIndex,
        /// Acknowledges a forced mark-out ([`Lease::MarkOut`]): the follower holds no lease
        /// and ignores every lease grant anchored before `sent_at` (`docs/protocol.md` §8).
        released: bool,
        /// The `sent_at` of the newest `Append` of this epoch the follower has received.
        echo_sent_at: Time,
        /// The follower's send time on its own clock; the leader echoes it as the next
        /// grant's `lease_anchor`.
        sent_at: Time,
    },
    /// The leader sends its snapshot to a follower too far behind, one chunk at a time
    /// (the next chunk once the previous one is acknowledged).
    InstallSnapshot {
        /// The leader's epoch.
        epoch: Epoch,
        /// What the snapshot covers.
        meta: SnapshotMeta,
        /// Where `data` starts in the snapshot's encoding.
        offset: u64,
        /// The length of the whole encoding.
        total: u64,
        /// Up to `snapshot_chunk_bytes` bytes of the engine's encoding of the state machine, from `offset`.
        data: Vec<u8>,
    },
    /// Reply to `InstallSnapshot`.
    InstallSnapshotReply {
        /// The follower's epoch.
        epoch: Epoch,
        /// The index through which the follower's log now matches the leader's (the
        /// snapshot's last index when it was installed or already covered).
        last_index: LogIndex,
        /// How many bytes of the snapshot being received the follower holds, in order
        /// from the start (where the leader continues).
        received: u64,
    },
    /// A follower forwards a client request it may not serve to the leader.
    Forward {
        /// The follower's epoch.
        epoch: Epoch,
        /// The request, with the follower's tag.
        request: ClientRequest,
    },
    /// The leader's answer to a forwarded request.
    ForwardReply {
        /// The leader's epoch.
        epoch: Epoch,
        /// The reply, carrying the follower's tag.
        reply: ClientReply,
    },
}

/// The leader engine's configuration. Times are on the node's own clock. Build one with
/// [`Config::new`] and check it with [`Config::validate`] (the engine does both).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    /// This node.
    pub node_id: NodeId,
    /// The keyspace's voters when its log names none (a new cluster's, or a log written
    /// before membership entries): 3, 5 or 7, this node included unless it is `joining`.
    /// Once the log holds a membership entry, the log's membership is in force
    /// (`docs/protocol.md` §15).
    pub members: Vec<NodeId>,
    /// This node joins a running keyspace: it is not among `members`, never campaigns
    /// until the log makes it a voter, and takes the log (or a snapshot) from the leader
    /// once an operator has added it as a learner.
    #[serde(default)]
    pub joining: bool,
    /// How often the leader sends `Append` (heartbeat, lease renewal) to each follower.
    /// Several per `mark_out_timeout` so that one late message does not mark a follower
    /// out: at most `mark_out_timeout / 3`.
    pub heartbeat_interval: Span,
    /// The follower's mark-out timeout `mt` (ORCA §4.4.2; the paper's "heartbeat
    /// interval", 100 ms): a follower's lease lasts `mt` past the anchor of its last grant.
    pub mark_out_timeout: Span,
    /// The leader's removal timeout `rt`: a follower not heard from for this long leaves
    /// the active set. At least 5 × `mark_out_timeout` (see [`Config::validate`]).
    pub removal_timeout: Span,
    /// Election timeout is drawn uniformly from `[min, max)` (randomness is an input);
    /// with a `preferred_leader`, from its first quarter on that node and from its second
    /// half on the others.
    pub election_timeout_min: Span,
    /// See `election_timeout_min`.
    pub election_timeout_max: Span,
    /// Period of background fsync on every node.
    pub flush_interval: Span,
    /// Worst-case clock drift between nodes, in parts per million.
    pub clock_drift_ppm_max: u32,
    /// Target active-set size (a majority to all members).
    pub active_set_target: usize,
    /// The member that should lead when every member is healthy: its elections start
    /// earlier than the others' (only timing changes: safety holds with or without it).
    /// A server spreads the leaders of its keyspaces over the members this way. After a
    /// failure another member may lead, and keeps leading (there is no hand-back).
    pub preferred_leader: Option<NodeId>,
    /// Whether followers serve `any` and `monotonic` reads.
    pub follower_reads: bool,
    /// Durability of writes that do not name one.
    pub durability_default: Durability,
    /// Level of reads that do not name one.
    pub read_level_default: ReadLevel,
    /// Key and value limits.
    pub limits: Limits,
    /// Most entries in one `Append`.
    pub append_entries_max: usize,
    /// Most bytes of entries in one `Append` (about: keys, values and a fixed overhead
    /// each), past the first entry: with `append_entries_max` it bounds a peer message.
    pub append_bytes_max: u64,
    /// Most `Append`s carrying entries in flight (unacknowledged) to one follower.
    pub inflight_appends_max: usize,
    /// Most client requests waiting inside the engine (durability rounds, commits,
    /// forwards); past it new requests get a retryable `Busy`.
    pub pending_requests_max: usize,
    /// Most log entries the leader holds above its durable index; past it new writes get
    /// a retryable `Busy`. Bounds the undo records kept for rollback.
    pub undurable_entries_max: u64,
    /// Most bytes the applied state may hold (keys, values and a fixed overhead per key);
    /// past it writes that add bytes get `Unavailable`. A node holds about three times
    /// this at most: the state, its newest snapshot, and the log since that snapshot.
    pub state_bytes_max: u64,
    /// Most clients whose last write result is kept for deduplication (oldest out), as
    /// this node proposes it: which retry is deduplicated is part of the replicated state,
    /// so the bound in force is the cluster's, stated in the log by each leader's first
    /// entry of its epoch ([`keel_types::EntryPayload::Settings`]) and carried in
    /// snapshots. This node's value takes effect when it next becomes leader; before the
    /// log states one (an empty log, or one written before settings entries), it applies.
    pub dedup_clients_max: usize,
    /// Snapshot once the durable index is this many entries past the last snapshot ...
    pub snapshot_entries_threshold: u64,
    /// ... and the log since it holds at least this percentage of the state's bytes (a
    /// large state is not encoded again for a small log).
    pub snapshot_log_percent: u64,
    /// Bytes of snapshot encoded in one slice (a snapshot is taken a slice at a time
    /// while the node goes on serving), and the size of one `InstallSnapshot` chunk.
    pub snapshot_chunk_bytes: u64,
    /// At most one slice per this interval (so that encoding takes a bounded share of
    /// the node's time: a 1 MiB slice costs about a millisecond).
    pub snapshot_slice_interval: Span,
    /// A follower whose persisted index lags the leader's log by more than this many
    /// entries ...
    pub slow_follower_lag_max: u64,
    /// ... for longer than this is forced out of the active set (ORCA §4.4.2).
    pub slow_follower_timeout: Span,
    /// How long a client request may wait inside the engine before `Timeout`.
    pub request_timeout: Span,
    /// For negative-control tests only: lets `removal_timeout` be shorter than the bound
    /// [`Config::validate`] enforces, so a simulator can show the stale reads a hasty
    /// removal causes (ORCA Fig. 5(i)). Never set it in a real deployment.
    pub unsafe_allow_hasty_removal: bool,
    /// For negative-control tests only: a follower without a lease acknowledges a
    /// mark-out on every reply, asked or not (raising its lease floor each time), so that
    /// over round trips longer than the heartbeat interval it never accepts a grant. Shows
    /// that the simulator's lease-liveness check catches followers left without leases.
    pub unsafe_release_unasked: bool,
    /// For negative-control tests only: reads off the engine loop
    /// ([`super::LeaderEngine::read_now`]) skip the read-point check and serve data not
    /// yet durable on the active set. Shows that the simulator's checkers catch reads of
    /// state a crash can lose.
    pub unsafe_view_reads_unchecked: bool,
    /// For negative-control tests only: moving to a higher epoch forgets when a leader was
    /// last heard (as Keel once did), so a late reply of a higher epoch frees a follower
    /// to vote while the leader it just acknowledged still holds its lease. Shows that the
    /// simulator's one-lease invariant catches two leader leases at once.
    pub unsafe_forget_leader_contact: bool,
    /// For negative-control tests only: writes skip the deduplication table, so a retry
    /// or a duplicated forward is applied again. Shows that the simulator's checkers
    /// catch a write applied twice.
    pub unsafe_skip_dedup: bool,
    /// For negative-control tests only: a session the deduplication table has forgotten
    /// is taken for a new one, so a retry after its eviction is applied again. Shows that
    /// the simulator's checkers catch what session expiry prevents.
    pub unsafe_accept_expired_sessions: bool,
    /// Negative control only: the leader appends an open stamped below the last use of a
    /// session the deduplication table evicted, which may reopen a session whose
    /// requests were applied and forgotten (so a retry of one is applied again).
    pub unsafe_accept_stale_opens: bool,
    /// For negative-control tests only: `WATCH` ignores deletes (a watched key deleted
    /// since it was read counts as unchanged), so a transaction commits over a delete.
    /// Shows that the simulator's transaction checker catches it.
    pub unsafe_watch_ignores_deletes: bool,
    /// For negative-control tests only: a slot's source serves writes to the keys it
    /// holds for copying (no `TRYAGAIN`), so a write between the copy and the release is
    /// lost. Shows that the simulator's `slots` checkers catch it.
    pub unsafe_slots_serve_held: bool,
    /// For negative-control tests only: a slot's target writes every copy it is sent,
    /// even over a key written since the import began, so a late copy of a copying step
    /// undoes a client's write.
    pub unsafe_slots_fill_overwrites: bool,
    /// For negative-control tests only: a slot's target takes requests its source did
    /// not send on (no `ASKING`), so a client whose map points there early writes a key
    /// the source still holds.
    pub unsafe_slots_take_unasked: bool,
    /// For negative-control tests only: the repair floor is ignored (a node whose
    /// recovery cut damaged records votes by its cut log and campaigns). Shows that the
    /// simulator catches the acknowledged writes damage then loses.
    pub unsafe_ignore_repair_floor: bool,
    /// For negative-control tests only: a node grants pre-votes while it still hears from
    /// a live leader, so a node cut off from the leader alone wins a pre-vote, raises the
    /// epoch and deposes a leader the rest of the cluster still follows. Shows that the
    /// pre-vote trace pins the rule.
    pub unsafe_pre_vote_ignores_leader: bool,
    /// The unix time, in milliseconds, at which this node's clock read 0: the engine's
    /// wall clock is this plus its clock (the host sets it at boot: a server from the
    /// system clock, the simulator from each node's skewed clock). Only the leader reads
    /// it, to put times in the log: relative expiries become absolute there, and a key
    /// leaves the state by an expiry entry the leader appends once its time has passed.
    #[serde(default)]
    pub wall_clock_origin_ms: u64,
    /// For negative-control tests only: the leader goes on replicating to a voter it
    /// removed from the membership and counts its acknowledgements toward commits and
    /// `durable` writes, as if the removal had not happened (for the rest of its epoch).
    /// Shows that the simulator's checkers catch the acknowledged writes a removed
    /// member's copy cannot keep.
    #[serde(default)]
    pub unsafe_count_removed: bool,
    /// For negative-control tests only: a learner is admitted to the active set (and so
    /// granted leases and served `monotonic` reads) as soon as the leader hears it,
    /// before it holds the durable index, and kept there however far it lags. Shows that the simulator's checkers catch the
    /// stale reads a learner that has not caught up serves.
    #[serde(default)]
    pub unsafe_learner_reads_early: bool,
    /// For negative-control tests only: a leader that hands its leadership over
    /// (`TimeoutNow`) keeps its leader lease, serving lease reads and granting follower
    /// leases while its successor, elected past the voters' stickiness, already leads.
    /// Shows that the simulator's one-lease check catches the overlap.
    #[serde(default)]
    pub unsafe_transfer_keeps_lease: bool,
    /// For negative-control tests only: every node's reads treat a key whose expiry has
    /// passed on the node's own clock as absent, before any expiry entry deletes it
    /// (each node expiring on its own clock, as some replicated Redis stores do).
    #[serde(default)]
    pub unsafe_expire_on_local_clock: bool,
}

/// A node's role.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// Follows a leader (or waits for one). Every node starts as one.
    #[default]
    Follower,
    /// Asking for votes.
    Candidate,
    /// Leads its epoch.
    Leader,
}

/// A snapshot of an engine's externally visible state, for `/status`, `keel status`
/// and the simulator's invariant checks. Cheap to build. `Status::default()` (node 0, a
/// follower of epoch 0 with empty indexes) lets tests set only the fields they check.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// This node.
    pub node_id: NodeId,
    /// Its role.
    pub role: Role,
    /// Its current epoch.
    pub epoch: Epoch,
    /// The leader it believes in, if any.
    pub leader: Option<NodeId>,
    /// Last index in its log.
    pub last_index: LogIndex,
    /// Highest index known replicated on a majority.
    pub commit_index: LogIndex,
    /// Highest index known durable (ORCA durable-index).
    pub durable_index: LogIndex,
    /// Highest index fsynced locally.
    pub persisted_index: LogIndex,
    /// Highest index applied locally.
    pub applied_index: LogIndex,
    /// Whether this node considers itself in the active set (followers) / always true for
    /// the leader.
    pub active: bool,
    /// The leader's view of the active set, itself included (empty on followers).
    pub active_set: Vec<NodeId>,
    /// The last index covered by the node's snapshot (0: none).
    pub snapshot_index: LogIndex,
    /// Bytes of snapshot encoding the node holds to send to followers (0 unless one
    /// needs it).
    pub snapshot_held_bytes: u64,
    /// Whether the node (as leader) holds a valid leader lease.
    pub leader_lease_valid: bool,
    /// The repair floor, while recovery's cut of damaged records is not yet repaired:
    /// the node votes as if its log reached it and does not campaign.
    pub repair_floor: Option<Version>,
    /// The deduplication bound in force at the applied index: the cluster's, from the
    /// log's latest settings entry (`Config::dedup_clients_max` is what this node
    /// proposes when it leads).
    pub dedup_clients_max: usize,
    /// The voters in force on this node (its log's last membership entry, else the
    /// configured members).
    #[serde(default)]
    pub voters: Vec<NodeId>,
    /// The learners in force on this node.
    #[serde(default)]
    pub learners: Vec<NodeId>,
    /// The index of the membership entry in force (0: none; the configured members).
    #[serde(default)]
    pub membership_index: LogIndex,
    /// Leading: the voter a leadership transfer under way hands over to.
    #[serde(default)]
    pub transfer_to: Option<NodeId>,
    /// Leading: the transfer was handed over (`TimeoutNow` sent); this node holds no
    /// lease for the rest of its epoch.
    #[serde(default)]
    pub handed_over: bool,
}

impl Default for Status {
    /// Node 0 (a placeholder id), a follower of epoch 0 knowing no leader, with
    /// every index 0 and no lease.
    fn default() -> Status {
        Status {
            node_id: NodeId(0),
            role: Role::Follower,
            epoch: Epoch::default(),
            leader: None,
            last_index: LogIndex::ZERO,
            commit_index: LogIndex::ZERO,
            durable_index: LogIndex::ZERO,
            persisted_index: LogIndex::ZERO,
            applied_index: LogIndex::ZERO,
            active: false,
            active_set: Vec::new(),
            snapshot_index: LogIndex::ZERO,
            snapshot_held_bytes: 0,
            leader_lease_valid: false,
            repair_floor: None,
            dedup_clients_max: 0,
            voters: Vec::new(),
            learners: Vec::new(),
            membership_index: LogIndex::ZERO,
            transfer_to: None,
            handed_over: false,
        }
    }
}
