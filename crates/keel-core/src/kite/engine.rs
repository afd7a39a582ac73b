//! [`KiteEngine`]: one Kite node. Replica handlers (what a node does with a peer's
//! request), rounds (a broadcast waiting for answers, sent again to whoever has not
//! answered), and sessions (one operation in progress at a time, each a small state
//! machine over its rounds).

// `Result<KiteResult, Phase>` says "done, with this result" or "still going, in this
// phase": the `Err` side is the operation's state moved back into its session, not an
// error travelling up, so its size is not a cost.
#![allow(clippy::result_large_err)]

use super::types::{
    Ballot, Bit, Config, Counters, Cursor, KiteOp, KiteReply, KiteRequest, KiteResult, Message,
    Origin, RmwId, RmwOutcome, RmwRecord, RoundId, SlotImage, Stamp, Status, PAGE_ITEMS_MAX,
    SKIPPED_MAX,
};
use crate::engine::{BootError, Input, Outputs, Rejection};
use crate::time::{Span, Time};
use keel_types::rng::SplitMix64;
use keel_types::{ClientId, KeelError, Key, NodeId, RequestId, Value};
use std::collections::{BTreeMap, VecDeque};

mod fence;
mod invariants;
mod outcomes;
mod rejoin;
use outcomes::Outcomes;
use rejoin::Rejoin;

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
/// A write waiting for every node's acknowledgement is sent again after the
/// retransmission pace times 2^min(sends, this): up to 64 times the pace.
const WRITE_BACKOFF_SHIFT_MAX: u32 = 6;

/// One key at this replica.
#[derive(Clone, Debug, Default)]
struct Slot {
    value: Option<Value>,
    stamp: Stamp,
    /// The key's epoch: the fast path serves it iff it equals the machine epoch.
    epoch: u64,
    promised: Ballot,
    accepted: Option<(Ballot, RmwRecord)>,
    /// Whether this incarnation accepted `accepted` itself: one copied from another node
    /// while rejoining is that node's acceptance, not this one's, and must not be counted
    /// again as this node's when its proposer's `Accept` arrives.
    accepted_here: bool,
    /// The read-modify-write whose commit made `value`, if one did.
    made_by: Option<Box<(RmwId, RmwOutcome)>>,
    /// The last record this incarnation finished for another (accepted again at its own
    /// ballot and committed with what it carries, acknowledged by a quorum): a quorum's
    /// outcome tables hold it and what it carried, so it need not be carried on.
    finished: Option<RmwId>,
}

/// A broadcast waiting for answers.
#[derive(Clone, Debug)]
struct Round {
    msg: Message,
    /// Members (by index) that have not answered.
    pending: u64,
    replies: Vec<(NodeId, Message)>,
    next_send: Time,
    sends: u32,
    session: u64,
    /// A write the session's next release needs acknowledged by every node.
    tracked: bool,
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

#[derive(Clone, Debug)]
enum RmwStage {
    /// Waits while another session of this node runs a read-modify-write on the same key:
    /// a node runs one at a time per key, so that its own sessions do not preempt each
    /// other's ballots (each new proposal would nack the one before).
    Queued,
    Proposing {
        round: RoundId,
    },
    /// A retry waits for its back-off.
    Backoff {
        until: Time,
    },
    Accepting {
        round: RoundId,
        record: RmwRecord,
        mine: bool,
    },
    /// A compare-and-swap that failed, writing back the value it read.
    WriteBack {
        round: RoundId,
        read: Option<Value>,
        read_stamp: Stamp,
        made_by: Maker,
    },
    Committing {
        round: RoundId,
        record: RmwRecord,
        mine: bool,
    },
    /// Waiting for the barrier before accepting its own record.
    Ready {
        record: RmwRecord,
    },
}

/// The operation a session has in progress. One per session, so the size of its largest
/// variant (a read-modify-write's) costs little.
#[derive(Clone, Debug)]
#[allow(clippy::large_enum_variant)]
enum Phase {
    SlowRead {
        key: Key,
        snapshot: u64,
        round: RoundId,
    },
    SlowWrite {
        key: Key,
        value: Value,
        snapshot: u64,
        round: RoundId,
    },
    Acquire {
        key: Key,
        snapshot: u64,
        id: u64,
        round: RoundId,
        write_back: Option<(RoundId, Option<Value>, Stamp, Maker)>,
        delinquent: Flags,
    },
    Release {
        key: Key,
        value: Value,
        round: RoundId,
        version: Option<u64>,
        barrier: Barrier,
        value_round: Option<(RoundId, Stamp)>,
    },
    Rmw {
        op: KiteOp,
        rid: RmwId,
        id: u64,
        ballot: Ballot,
        stage: RmwStage,
        barrier: Barrier,
        delinquent: Flags,
    },
    /// A write of a session that holds [`TRACKED_MAX`] writes not yet acknowledged by
    /// every node waits for a barrier (a release without a value) that settles them.
    Flush {
        op: KiteOp,
        rid: RmwId,
        barrier: Barrier,
    },
    /// Finished with an error (never kept: the session answers it at once).
    Refused(KeelError),
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
    quorum: usize,
    epoch: u64,
    keys: BTreeMap<Key, Slot>,
    bits: BTreeMap<NodeId, Bit>,
    /// Per node: how many slow releases named it here (its bit's generation).
    gens: BTreeMap<NodeId, u64>,
    /// The latest committed read-modify-write of each (node, session), with its key.
    outcomes: Outcomes,
    sessions: BTreeMap<u64, Session>,
    /// The session running a read-modify-write on each key, at this node.
    rmw_keys: BTreeMap<Key, u64>,
    /// The last request number given (node-wide; read-modify-write ids carry it).
    next_seq: u64,
    rounds: BTreeMap<RoundId, Round>,
    next_round: RoundId,
    next_acquire: u64,
    /// The highest ballot round this node proposed.
    last_round: u64,
    rng: SplitMix64,
    counters: Counters,
    now: Time,
    out: Outputs<Message, KiteReply>,
    /// While rejoining after a restart: whose state has been read.
    rejoin: Option<Rejoin>,
    /// The highest incarnation known of each member heard of, this node's own included
    /// (the rejoin's fence, `engine/fence.rs`).
    incarnations: BTreeMap<NodeId, u32>,
    /// How many times `incarnations` changed.
    view_gen: u64,
    /// The generation of this node's view each peer acknowledged having merged.
    view_told: BTreeMap<NodeId, u64>,
    /// The incarnation to make durable before the first message (server drivers).
    hard_state: Option<keel_types::HardState>,
}

impl KiteEngine {
    /// Starts a node with an empty store at local time `now`. A node of a later
    /// incarnation (one that lost its memory) starts with every key out of its epoch, so
    /// that nothing is served from the fast path before it was read from a quorum.
    pub fn boot(config: Config, seed: u64, now: Time) -> Result<KiteEngine, BootError> {
        config.validate()?;
        let n = config.members.len();
        let bits = config.members.iter().map(|&m| (m, Bit::Clear)).collect();
        let mut rng = SplitMix64::new(seed);
        let first_round = (rng.next_u64() >> 2).max(1);
        Ok(KiteEngine {
            writer: Stamp::writer_of(config.node, config.incarnation),
            quorum: n / 2 + 1,
            epoch: u64::from(config.incarnation > 0),
            keys: BTreeMap::new(),
            bits,
            gens: BTreeMap::new(),
            outcomes: Outcomes::new(config.outcomes_max, config.outcomes_bytes_max),
            sessions: BTreeMap::new(),
            rmw_keys: BTreeMap::new(),
            next_seq: 0,
            rounds: BTreeMap::new(),
            // Rounds start at a random place: a reply still in flight to an earlier
            // incarnation must not match a round of this one (it would answer another
            // key's round: found by restarts in the simulator).
            next_round: first_round,
            // Acquire ids of a later incarnation never match an earlier life's.
            next_acquire: (u64::from(config.incarnation) << 32) + 1,
            last_round: 0,
            rng,
            counters: Counters::default(),
            now,
            out: Outputs::default(),
            rejoin: None,
            incarnations: BTreeMap::from([(config.node, config.incarnation)]),
            view_gen: 0,
            view_told: BTreeMap::new(),
            hard_state: None,
            config,
        }
        .start_rejoin())
    }

    /// Asks that `hard_state` (the incarnation) be made durable before any message.
    pub(super) fn persist_first(&mut self, hard_state: keel_types::HardState) {
        self.hard_state = Some(hard_state);
    }

    /// This node.
    pub fn node_id(&self) -> NodeId {
        self.config.node
    }

    /// The machine epoch and whether the node is still rejoining: what the driver reads
    /// after every step, without building the status (which walks every key).
    pub fn epoch_and_rejoining(&self) -> (u64, bool) {
        (self.epoch, self.rejoin.is_some())
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The typed status.
    pub fn status(&self) -> Status {
        Status {
            node: self.config.node,
            epoch: self.epoch,
            incarnation: self.config.incarnation,
            rejoining: self.rejoin.is_some(),
            keys: self.keys.len(),
            keys_in_epoch: self.keys.values().filter(|s| s.epoch == self.epoch).count(),
            sessions: self.sessions.len(),
            outcomes: self.outcomes.len(),
            outcomes_bytes: self.outcomes.bytes(),
            bits: self.bits.iter().map(|(&n, b)| (n, b.clone())).collect(),
            counters: self.counters.clone(),
        }
    }

    /// The local copy of `key`: its value and stamp (for tests and the simulator's
    /// convergence check).
    pub fn local(&self, key: &[u8]) -> (Option<Value>, Stamp) {
        self.keys.get(key).map_or((None, Stamp::ZERO), |s| (s.value.clone(), s.stamp))
    }

    /// Every key held, with its value and stamp, in key order.
    pub fn contents(&self) -> Vec<(Key, Option<Value>, Stamp)> {
        self.keys.iter().map(|(k, s)| (k.clone(), s.value.clone(), s.stamp)).collect()
    }

    /// Whether this replica holds an accepted read-modify-write of `key` it has not seen
    /// committed.
    pub fn accepted_rmw(&self, key: &[u8]) -> bool {
        self.keys.get(key).is_some_and(|s| s.accepted.is_some())
    }

    /// The reply a relaxed read would get at once, alone in a step: when it is a relaxed
    /// read of a key in its epoch, its session has nothing before it, and the node is not
    /// rejoining (`None` otherwise). Changes nothing.
    pub fn read_now(&self, request: &KiteRequest) -> Option<KiteReply> {
        let KiteOp::Read { key } = &request.op else { return None };
        let idle = self
            .sessions
            .get(&request.session)
            .is_none_or(|s| s.active.is_none() && s.queue.is_empty());
        if self.rejoin.is_some() || !idle || !self.in_epoch(key) {
            return None;
        }
        if self.config.limits.check_key(key).is_err()
            || matches!(request.form, super::types::ReplyForm::Refused(_))
        {
            return None;
        }
        let (value, stamp) = self.local(key);
        Some(KiteReply {
            tag: request.tag,
            session: request.session,
            served_by: self.config.node,
            form: request.form.clone(),
            result: Ok(KiteResult::Value { value, stamp }),
        })
    }

    /// The read-modify-writes in progress, by request tag, with the id each goes by (for
    /// the simulator, which matches a request left without a reply to its commit).
    pub fn rmws_in_progress(&self) -> Vec<(crate::engine::RequestTag, RmwId)> {
        let mut out = Vec::new();
        for s in self.sessions.values() {
            if let Some(Active {
                tag,
                phase: Phase::Rmw { rid, .. } | Phase::Flush { rid, .. },
                ..
            }) = &s.active
            {
                out.push((*tag, *rid));
            }
        }
        out
    }

    /// The keys of read-modify-writes whose proposals wait for a quorum's promises: their
    /// accepts go out once the promises come. For the simulator's targeted faults.
    pub fn proposals_in_flight(&self) -> Vec<&Key> {
        self.rounds
            .values()
            .filter(|r| r.replies.len() < self.quorum)
            .filter_map(|r| match &r.msg {
                Message::Propose { key, .. } => Some(key),
                _ => None,
            })
            .collect()
    }

    /// Whether a relaxed access to `key` would take the fast path now.
    pub fn in_epoch(&self, key: &[u8]) -> bool {
        self.keys.get(key).map_or(0, |s| s.epoch) == self.epoch
    }

    /// Handles one input at local time `now`.
    pub fn step(
        &mut self,
        now: Time,
        input: Input<Message, KiteRequest>,
    ) -> Outputs<Message, KiteReply> {
        assert!(now >= self.now, "time went backwards: {:?} after {:?}", now, self.now);
        self.now = now;
        self.out.hard_state = self.hard_state.take();
        let mut touched: Vec<u64> = Vec::new();
        let rejoining = self.rejoin.is_some();
        match input {
            Input::Tick => {
                self.resend_due();
                self.rejoin_resend_due();
                self.finish_rejoin_if_complete();
                touched.extend(self.sessions.keys().copied());
            }
            Input::Message { from, message } => {
                if let Some(session) = self.on_message(from, message) {
                    touched.push(session);
                }
            }
            Input::Client(request) => touched.push(self.admit(request)),
            Input::Clients(requests) => {
                for request in requests {
                    touched.push(self.admit(request));
                }
            }
            Input::LogSynced { .. } | Input::SnapshotSaved { .. } => {}
        }
        if rejoining && self.rejoin.is_none() {
            // Rejoined in this step: every session held back may start.
            touched.extend(self.sessions.keys().copied());
        }
        touched.sort_unstable();
        touched.dedup();
        for session in touched {
            self.advance(session);
        }
        self.out.wake_at = self.next_wake();
        // The simulator checks every step of every node; a debug build checks here too.
        #[cfg(debug_assertions)]
        self.check_invariants();
        std::mem::take(&mut self.out)
    }

    /// The stateless half of the validation gate.
    pub fn check_message(message: &Message) -> Result<(), &'static str> {
        let record_ok = |r: &RmwRecord| r.well_formed();
        match message {
            Message::SlowRelease { delinquent, .. } if delinquent.len() > 63 => {
                Err("delinquent set larger than any cluster")
            }
            Message::Accept { record, .. } if !record_ok(record) => {
                Err("read-modify-write not right after its base")
            }
            Message::Promise { accepted: Some((_, record)), .. } if !record_ok(record) => {
                Err("read-modify-write not right after its base")
            }
            // Only the commit of a failed read-modify-write of a key never written writes
            // the initial stamp: its record carries the stamp it read, and writes nothing.
            Message::Write { stamp, rmw, .. }
                if *stamp == Stamp::ZERO
                    && rmw.as_ref().is_none_or(|(_, o)| o.stamp != o.read_stamp) =>
            {
                Err("write with no stamp")
            }
            _ if reply_origin(message)
                .and_then(|o| o.view.as_ref())
                .is_some_and(|v| v.incarnations.len() > 63) =>
            {
                Err("view larger than any cluster")
            }
            _ => Ok(()),
        }
    }

    // ----- admission and sessions -----

    fn admit(&mut self, request: KiteRequest) -> u64 {
        let session = request.session;
        if let super::types::ReplyForm::Refused(reason) = &request.form {
            let err = KeelError::InvalidArgument(reason.clone());
            self.reply(&request, Err(err));
            return session;
        }
        if let Err(err) = self.check_request(&request.op) {
            self.reply(&request, Err(err));
            return session;
        }
        if !self.sessions.contains_key(&session) && self.sessions.len() >= self.config.sessions_max
        {
            let err = KeelError::Busy(format!("{} sessions open", self.sessions.len()));
            self.reply(&request, Err(err));
            return session;
        }
        let queue_max = self.config.session_queue_max;
        let s = self.sessions.entry(session).or_default();
        if s.queue.len() >= queue_max {
            let err = KeelError::Busy(format!("{} requests waiting in the session", s.queue.len()));
            self.reply(&request, Err(err));
            return session;
        }
        s.queue.push_back(request);
        session
    }

    fn check_request(&self, op: &KiteOp) -> Result<(), KeelError> {
        let limits = &self.config.limits;
        limits.check_key(op.key())?;
        match op {
            KiteOp::Write { value, .. } | KiteOp::Release { value, .. } => {
                limits.check_value(value)
            }
            KiteOp::Cas { expected, new, .. } => {
                if let Some(e) = expected {
                    limits.check_value(e)?;
                }
                limits.check_value(new)
            }
            _ => Ok(()),
        }
    }

    fn reply(&mut self, request: &KiteRequest, result: Result<KiteResult, KeelError>) {
        self.out.replies.push(KiteReply {
            tag: request.tag,
            session: request.session,
            served_by: self.config.node,
            form: request.form.clone(),
            result,
        });
    }

    /// Runs a session as far as it goes: the operation in progress, then queued ones.
    /// A rejoining node starts nothing (its requests wait in their sessions).
    fn advance(&mut self, session: u64) {
        if self.rejoin.is_some() {
            return;
        }
        loop {
            let Some(s) = self.sessions.get_mut(&session) else { return };
            if let Some(active) = s.active.take() {
                let rmw_key = match &active.phase {
                    Phase::Rmw { op, .. } | Phase::Flush { op, .. } if op.is_rmw() => {
                        Some(op.key().clone())
                    }
                    _ => None,
                };
                let outcome = self.progress(session, active.phase);
                if let (Some(key), Ok(_) | Err(Phase::Refused(_))) = (&rmw_key, &outcome) {
                    self.rmw_key_free(key, session);
                }
                match outcome {
                    Ok(result) => {
                        self.out.replies.push(KiteReply {
                            tag: active.tag,
                            session,
                            served_by: self.config.node,
                            form: active.form,
                            result: Ok(result),
                        });
                    }
                    Err(Phase::Refused(error)) => {
                        self.out.replies.push(KiteReply {
                            tag: active.tag,
                            session,
                            served_by: self.config.node,
                            form: active.form,
                            result: Err(error),
                        });
                    }
                    Err(phase) => {
                        let s = self.sessions.get_mut(&session).expect("session exists");
                        s.active = Some(Active { tag: active.tag, form: active.form, phase });
                        return;
                    }
                }
                continue;
            }
            let Some(request) = s.queue.pop_front() else {
                if s.idle() {
                    self.sessions.remove(&session);
                }
                return;
            };
            // Numbered node-wide, so a session forgotten and begun again never reuses a
            // read-modify-write's id; or by the client, which names it for every node.
            let rid = match request.named {
                Some(seq) => RmwId { node: RmwId::CLIENT, session, seq },
                None => {
                    self.next_seq += 1;
                    RmwId { node: self.writer, session, seq: self.next_seq }
                }
            };
            let started = self.start(session, rid, request.op.clone());
            if request.op.is_rmw() && matches!(started, Ok(_) | Err(Phase::Refused(_))) {
                self.rmw_key_free(request.op.key(), session);
            }
            match started {
                Ok(result) => self.reply(&request, Ok(result)),
                Err(Phase::Refused(error)) => self.reply(&request, Err(error)),
                Err(phase) => {
                    let s = self.sessions.get_mut(&session).expect("session exists");
                    s.active = Some(Active { tag: request.tag, form: request.form, phase });
                }
            }
        }
    }

    /// `session`'s read-modify-write on `key` is over: the next session of this node
    /// waiting to run one on the key starts it.
    fn rmw_key_free(&mut self, key: &Key, session: u64) {
        if self.rmw_keys.get(key) != Some(&session) {
            return;
        }
        self.rmw_keys.remove(key);
        let waiting = self.sessions.iter().find_map(|(&s, state)| match &state.active {
            Some(Active { phase: Phase::Rmw { op, stage: RmwStage::Queued, .. }, .. })
                if op.key() == key =>
            {
                Some(s)
            }
            _ => None,
        });
        if let Some(next) = waiting {
            self.advance(next);
        }
    }

    /// Starts an operation: its result at once (fast path), or the phase that will make it.
    fn start(&mut self, session: u64, rid: RmwId, op: KiteOp) -> Result<KiteResult, Phase> {
        let snapshot = self.epoch;
        match op {
            KiteOp::Read { key } => {
                if self.in_epoch(&key) {
                    self.counters.reads_fast += 1;
                    let (value, stamp) = self.local(&key);
                    return Ok(KiteResult::Value { value, stamp });
                }
                self.counters.reads_slow += 1;
                let round = self.broadcast(
                    session,
                    Message::Read { round: 0, key: key.clone(), query: None },
                    false,
                );
                Err(Phase::SlowRead { key, snapshot, round })
            }
            KiteOp::Write { .. }
            | KiteOp::Release { .. }
            | KiteOp::Acquire { .. }
            | KiteOp::Faa { .. }
            | KiteOp::Cas { .. }
                if self.sessions.get(&session).is_some_and(|s| s.tracked.len() >= TRACKED_MAX) =>
            {
                self.counters.flushes += 1;
                Err(Phase::Flush { op, rid, barrier: self.new_barrier() })
            }
            KiteOp::Write { key, value } => {
                if self.in_epoch(&key) {
                    self.counters.writes_fast += 1;
                    let version = self.local(&key).1.version;
                    let stamp = Stamp::next_write(version, self.writer);
                    self.write_tracked(session, key, value, stamp, None);
                    return Ok(KiteResult::Written { stamp });
                }
                self.counters.writes_slow += 1;
                let round = self.broadcast(
                    session,
                    Message::Read { round: 0, key: key.clone(), query: None },
                    false,
                );
                Err(Phase::SlowWrite { key, value, snapshot, round })
            }
            KiteOp::Acquire { key } => {
                let id = self.new_acquire();
                let round = self.broadcast(
                    session,
                    Message::Read { round: 0, key: key.clone(), query: Some(id) },
                    false,
                );
                Err(Phase::Acquire {
                    key,
                    snapshot,
                    id,
                    round,
                    write_back: None,
                    delinquent: Flags::new(),
                })
            }
            KiteOp::Release { key, value } => {
                // The first round (stamps from a quorum) overlaps the barrier's wait.
                let round = self.broadcast(
                    session,
                    Message::Read { round: 0, key: key.clone(), query: None },
                    false,
                );
                let barrier = self.new_barrier();
                Err(Phase::Release { key, value, round, version: None, barrier, value_round: None })
            }
            KiteOp::Faa { .. } | KiteOp::Cas { .. } => {
                // A retry of a weak one is sent as a strong one (docs/kite.md, Retries):
                // the local value may be its own first attempt's swap.
                if let KiteOp::Cas { key, expected, strong: false, .. } = &op {
                    let (value, stamp) = self.local(key);
                    if self.in_epoch(key) && value != *expected {
                        self.counters.cas_local_failures += 1;
                        return Ok(KiteResult::Rmw {
                            read: value,
                            read_stamp: stamp,
                            wrote: None,
                            local: true,
                        });
                    }
                }
                let id = self.new_acquire();
                let barrier = self.new_barrier();
                if self.rmw_keys.get(op.key()).is_some_and(|&s| s != session) {
                    self.counters.rmws_queued += 1;
                }
                self.rmw_progress(
                    session,
                    op,
                    rid,
                    id,
                    Ballot::default(),
                    RmwStage::Queued,
                    barrier,
                    Flags::new(),
                )
            }
        }
    }

    fn new_acquire(&mut self) -> u64 {
        self.next_acquire += 1;
        self.next_acquire - 1
    }

    fn new_barrier(&self) -> Barrier {
        Barrier::Waiting { deadline: self.now + self.config.release_timeout }
    }

    /// Moves an operation on. `Ok`: it completed with this result; `Err`: still going.
    fn progress(&mut self, session: u64, phase: Phase) -> Result<KiteResult, Phase> {
        match phase {
            Phase::Refused(error) => Err(Phase::Refused(error)),
            Phase::SlowRead { key, snapshot, round } => {
                let Some((value, stamp, _, _, made_by)) = self.quorum_read(round) else {
                    return Err(Phase::SlowRead { key, snapshot, round });
                };
                self.close(round);
                self.apply(&key, value, stamp, made_by);
                self.settle_epoch(&key, snapshot);
                let (value, stamp) = self.local(&key);
                Ok(KiteResult::Value { value, stamp })
            }
            Phase::SlowWrite { key, value, snapshot, round } => {
                let Some((_, seen, _, _, _)) = self.quorum_read(round) else {
                    return Err(Phase::SlowWrite { key, value, snapshot, round });
                };
                self.close(round);
                let version = seen.version.max(self.local(&key).1.version);
                let stamp = Stamp::next_write(version, self.writer);
                self.write_tracked(session, key.clone(), value, stamp, None);
                self.settle_epoch(&key, snapshot);
                Ok(KiteResult::Written { stamp })
            }
            Phase::Acquire { key, snapshot, id, round, write_back, mut delinquent } => {
                match write_back {
                    None => {
                        let Some((value, stamp, seen_by, flagged, made_by)) =
                            self.quorum_read(round)
                        else {
                            return Err(Phase::Acquire {
                                key,
                                snapshot,
                                id,
                                round,
                                write_back,
                                delinquent,
                            });
                        };
                        self.close(round);
                        delinquent.extend(flagged);
                        if seen_by < self.quorum {
                            // Not yet seen by a quorum: write it back, asking again, so the
                            // answers come after the value was visible (the delinquent set
                            // of the release it may come from has reached a quorum).
                            self.counters.write_backs += 1;
                            let rmw = made_by.clone().map(|m| *m);
                            let msg = Message::Write {
                                round: 0,
                                key: key.clone(),
                                value: value.clone().unwrap_or_default(),
                                stamp,
                                rmw,
                                applied: Vec::new(),
                                query: Some(id),
                            };
                            let wb = self.broadcast(session, msg, false);
                            return Err(Phase::Acquire {
                                key,
                                snapshot,
                                id,
                                round,
                                write_back: Some((wb, value, stamp, made_by)),
                                delinquent,
                            });
                        }
                        let everywhere = seen_by == self.config.members.len();
                        Ok(self.finish_acquire(
                            session,
                            &key,
                            snapshot,
                            id,
                            delinquent,
                            (value, stamp, made_by),
                            everywhere,
                        ))
                    }
                    Some((wb, value, stamp, made_by)) => {
                        let Some(flagged) = self.quorum_acks(wb) else {
                            return Err(Phase::Acquire {
                                key,
                                snapshot,
                                id,
                                round,
                                write_back: Some((wb, value, stamp, made_by)),
                                delinquent,
                            });
                        };
                        self.close(wb);
                        delinquent.extend(flagged);
                        Ok(self.finish_acquire(
                            session,
                            &key,
                            snapshot,
                            id,
                            delinquent,
                            (value, stamp, made_by),
                            false,
                        ))
                    }
                }
            }
            Phase::Release { key, value, round, mut version, mut barrier, value_round } => {
                if let Some((vr, stamp)) = value_round {
                    if self.written(vr) {
                        return Ok(KiteResult::Written { stamp });
                    }
                    return Err(Phase::Release {
                        key,
                        value,
                        round,
                        version,
                        barrier,
                        value_round,
                    });
                }
                if version.is_none() {
                    if let Some((_, seen, _, _, _)) = self.quorum_read(round) {
                        self.close(round);
                        version = Some(seen.version);
                    }
                }
                self.barrier_progress(session, &mut barrier, true);
                match (version, &barrier) {
                    (Some(v), Barrier::Done) => {
                        let v = v.max(self.local(&key).1.version);
                        let stamp = Stamp::next_write(v, self.writer);
                        let vr =
                            self.write_tracked(session, key.clone(), value.clone(), stamp, None);
                        let phase = Phase::Release {
                            key,
                            value,
                            round,
                            version,
                            barrier,
                            value_round: Some((vr, stamp)),
                        };
                        self.progress(session, phase)
                    }
                    _ => Err(Phase::Release { key, value, round, version, barrier, value_round }),
                }
            }
            Phase::Flush { op, rid, mut barrier } => {
                self.barrier_progress(session, &mut barrier, false);
                if barrier != Barrier::Done {
                    return Err(Phase::Flush { op, rid, barrier });
                }
                self.start(session, rid, op)
            }
            Phase::Rmw { op, rid, id, ballot, stage, mut barrier, delinquent } => {
                self.barrier_progress(session, &mut barrier, false);
                self.rmw_progress(session, op, rid, id, ballot, stage, barrier, delinquent)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn finish_acquire(
        &mut self,
        session: u64,
        key: &Key,
        snapshot: u64,
        id: u64,
        delinquent: Flags,
        read: (Option<Value>, Stamp, Maker),
        everywhere: bool,
    ) -> KiteResult {
        let (value, stamp, made_by) = read;
        self.apply(key, value.clone(), stamp, made_by.clone());
        if !everywhere {
            self.spread_acquired(session, key, &value, stamp, made_by);
        }
        self.acquired(id, delinquent);
        self.settle_epoch(key, snapshot);
        KiteResult::Value { value, stamp }
    }

    /// What an acquire read may be held by only a quorum (a release's value round, a
    /// write-back, an RMW's commit wait for no more). The session sends it on to every
    /// node as its own write, so its next release covers it: a chain Rel x → Acq x →
    /// Rel f → Acq f on a node that missed x then finds that node delinquent, and its
    /// relaxed read of x goes to a quorum (not in the paper, whose lemmas cover only the
    /// writes before a release, not the release's own value).
    fn spread_acquired(
        &mut self,
        session: u64,
        key: &Key,
        value: &Option<Value>,
        stamp: Stamp,
        made_by: Maker,
    ) {
        if let (Some(value), true) = (value, stamp != Stamp::ZERO) {
            self.write_tracked(session, key.clone(), value.clone(), stamp, made_by.map(|m| *m));
        }
    }

    /// The end of an acquire (or a read-modify-write's acquire half): a delinquent node
    /// raises its epoch first, then asks for its bits to be reset.
    fn acquired(&mut self, id: u64, delinquent: Flags) {
        if !delinquent.is_empty() {
            self.counters.acquires_slow += 1;
            self.epoch += 1;
            // Each replica that answered "delinquent" gets a reset naming the generation
            // it answered with; one whose answer came too late keeps its bit transient.
            let resets: Vec<(NodeId, u64)> = if self.config.unsafe_paper_reset {
                self.config.members.iter().map(|&n| (n, u64::MAX)).collect()
            } else {
                delinquent.into_iter().collect()
            };
            for (node, gen) in resets {
                let msg = Message::ResetBit { acquire: id, gen };
                if node == self.config.node {
                    let _ = self.serve(node, msg);
                } else {
                    self.out.messages.push((node, msg));
                }
            }
        } else {
            self.counters.acquires_fast += 1;
        }
    }

    /// An out-of-epoch access that read a quorum puts its key in the epoch it started in.
    fn settle_epoch(&mut self, key: &Key, snapshot: u64) {
        let epoch = if self.config.unsafe_no_epoch_snapshot { self.epoch } else { snapshot };
        let slot = self.keys.entry(key.clone()).or_default();
        slot.epoch = slot.epoch.max(epoch);
    }

    /// The release barrier: every earlier write of the session acknowledged by every
    /// node, or, after the time-out, by a quorum and the slow release done.
    fn barrier_progress(&mut self, session: u64, barrier: &mut Barrier, release: bool) {
        if self.config.unsafe_release_before_acks && *barrier != Barrier::Done {
            self.untrack_all(session);
            *barrier = Barrier::Done;
            return;
        }
        let tracked = self.sessions.get(&session).map(|s| s.tracked.clone()).unwrap_or_default();
        if let Barrier::Waiting { deadline } = *barrier {
            let all = (1u64 << self.config.members.len()) - 1;
            let missing: u64 = tracked
                .iter()
                .filter_map(|r| self.rounds.get(r))
                .fold(0, |m, r| m | (r.pending & all));
            if missing == 0 {
                self.untrack_all(session);
                if release {
                    self.counters.releases_fast += 1;
                }
                *barrier = Barrier::Done;
                return;
            }
            if self.now < deadline {
                return;
            }
            let delinquent = self.members_of(missing);
            *barrier = Barrier::Slow { delinquent, round: None };
        }
        if let Barrier::Slow { delinquent, round } = barrier {
            match round {
                None => {
                    let all_quorum = tracked.iter().all(|r| self.acks(*r) >= self.quorum);
                    if !all_quorum {
                        return;
                    }
                    if self.config.unsafe_no_slow_path {
                        self.untrack_all(session);
                        *barrier = Barrier::Done;
                        return;
                    }
                    let msg = Message::SlowRelease { round: 0, delinquent: delinquent.clone() };
                    *round = Some(self.broadcast(session, msg, false));
                    self.barrier_progress(session, barrier, release);
                }
                Some(r) => {
                    let r = *r;
                    if self.acks(r) >= self.quorum {
                        self.close(r);
                        self.untrack_all(session);
                        if release {
                            self.counters.releases_slow += 1;
                        }
                        *barrier = Barrier::Done;
                    }
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn rmw_progress(
        &mut self,
        session: u64,
        op: KiteOp,
        rid: RmwId,
        id: u64,
        mut ballot: Ballot,
        stage: RmwStage,
        barrier: Barrier,
        mut delinquent: Flags,
    ) -> Result<KiteResult, Phase> {
        let key = op.key().clone();
        let me = rid;
        let pending = |stage, ballot, barrier, delinquent| {
            Err(Phase::Rmw { op: op.clone(), rid, id, ballot, stage, barrier, delinquent })
        };
        match stage {
            RmwStage::Queued if self.rmw_keys.get(&key).is_some_and(|&s| s != session) => {
                pending(RmwStage::Queued, ballot, barrier, delinquent)
            }
            RmwStage::Backoff { until } if self.now < until => {
                pending(RmwStage::Backoff { until }, ballot, barrier, delinquent)
            }
            RmwStage::Queued | RmwStage::Backoff { .. } => {
                // A queued request takes the key and its first ballot; one that backed off
                // holds the key and its ballot already.
                let ballot = if matches!(stage, RmwStage::Queued) {
                    self.rmw_keys.insert(key.clone(), session);
                    self.next_ballot(&key, ballot)
                } else {
                    ballot
                };
                let round = self.propose(session, key, ballot, id, rid);
                self.rmw_progress(
                    session,
                    op,
                    rid,
                    id,
                    ballot,
                    RmwStage::Proposing { round },
                    barrier,
                    delinquent,
                )
            }
            RmwStage::Proposing { round } => {
                let Some(r) = self.rounds.get(&round) else { unreachable!("open round") };
                let mut ok = Vec::new();
                let mut nacks = 0;
                let mut highest = ballot;
                for (from, m) in &r.replies {
                    if let Message::Promise { ok: granted, promised, delinquent: flagged, .. } = m {
                        highest = highest.max(*promised);
                        if *granted {
                            if let Some(gen) = flagged {
                                delinquent.insert(*from, *gen);
                            }
                            ok.push(m.clone());
                        } else {
                            nacks += 1;
                        }
                    }
                }
                if ok.len() < self.quorum {
                    // A nack means a higher ballot is out: start over above it rather
                    // than wait for nodes that may be down.
                    if nacks > 0 {
                        self.close(round);
                        return self.rmw_retry(op, rid, id, highest, barrier, delinquent);
                    }
                    return pending(RmwStage::Proposing { round }, ballot, barrier, delinquent);
                }
                self.close(round);
                // The newest value in the quorum, who made it, and how many hold it.
                let mut base: (Option<Value>, Stamp, Maker) = (None, Stamp::ZERO, None);
                for m in &ok {
                    let Message::Promise { value, stamp, made_by, .. } = m else {
                        continue;
                    };
                    if *stamp > base.1 {
                        base = (value.clone(), *stamp, made_by.clone());
                    }
                }
                // The highest-ballot record any replica of the quorum accepted. As in
                // CASPaxos, it is adopted as applied: a record chosen earlier is this one
                // or one it builds on (a later proposer saw it), so no other record of its
                // slot can have been chosen. When the quorum holds a newer value (a blind
                // write covered it), it is applied before that value.
                let mut adopted: Option<(Ballot, RmwRecord)> = None;
                let mut done: Option<RmwOutcome> = None;
                let mut superseded = false;
                let mut seen_by = 0;
                let digest = op.rmw_digest();
                for m in &ok {
                    let Message::Promise { accepted, stamp, outcome, made_by, .. } = m else {
                        continue;
                    };
                    seen_by += usize::from(*stamp == base.1);
                    if self.config.unsafe_forget_outcomes {
                        continue;
                    }
                    // Our request is done if a replica recorded its outcome or holds the
                    // value it made.
                    match outcome {
                        Some(o) if o.seq == me.seq => done = Some(o.clone()),
                        Some(o) if o.seq > me.seq => superseded = true,
                        _ => {}
                    }
                    if let Some(made) = made_by.as_ref().filter(|m| m.0 == me) {
                        done = Some(made.1.clone());
                    }
                    // A later request of the same client started: its node ran this one
                    // first (a session runs one request at a time), so this is a late
                    // retry too, even before that request's outcome is recorded.
                    let later = |id: &RmwId| id.same_client(&me) && id.seq > me.seq;
                    superseded |= made_by.as_ref().is_some_and(|m| later(&m.0));
                    superseded |= accepted.as_ref().is_some_and(|(_, rec)| rec.involves(later));
                    if let Some((b, rec)) = accepted {
                        if adopted.as_ref().is_none_or(|(bb, _)| b > bb) {
                            adopted = Some((*b, rec.clone()));
                        }
                    }
                }
                let adopted = adopted.map(|(_, r)| r);
                let reused = done.as_ref().is_some_and(|o| o.digest != digest)
                    || adopted.as_ref().is_some_and(|a| a.id == me && a.digest != digest);
                if reused {
                    // The client numbered another command with this request's number: not
                    // a retry, so neither answered with that outcome nor done.
                    self.counters.rmws_reused += 1;
                    self.drop_barrier(&barrier);
                    let (client, request) = (ClientId(me.session), RequestId(me.seq));
                    return Err(Phase::Refused(crate::engine::reused_request(client, request)));
                }
                if done.is_none() && superseded {
                    // A later request of the same client was done: this one is a late
                    // retry whose own outcome is no longer kept. It may have been done,
                    // so it is not done again.
                    self.counters.rmws_superseded += 1;
                    self.drop_barrier(&barrier);
                    return Err(Phase::Refused(KeelError::SessionExpired));
                }
                if let Some(o) = done {
                    self.counters.rmws_found_done += 1;
                    // Committed, by us or a helper. Commit it again as this session's own
                    // write: the session's next release must find it acknowledged by
                    // every node, and the helper may have reached fewer than a quorum.
                    let record = RmwRecord {
                        id: me,
                        value: o.value.clone(),
                        stamp: o.stamp,
                        digest: o.digest,
                        read: o.read.clone(),
                        read_stamp: o.read_stamp,
                        base: None,
                        skipped: Vec::new(),
                        settled: Vec::new(),
                    };
                    let msg = Message::Write {
                        round: 0,
                        key,
                        value: o.value.clone(),
                        stamp: o.stamp,
                        rmw: Some((me, o)),
                        applied: Vec::new(),
                        query: None,
                    };
                    let round = self.broadcast(session, msg, true);
                    return self.rmw_progress(
                        session,
                        op,
                        rid,
                        id,
                        ballot,
                        RmwStage::Committing { round, record, mine: true },
                        barrier,
                        delinquent,
                    );
                }
                // Another's record newer than every value in the quorum: finish it first
                // (accepted at our ballot, its acceptors record what it builds on; then
                // committed, every replica of a quorum records it done), then start over.
                // One covered by a newer value is carried along as applied before it,
                // with what it built on and carried. One whose value is in place was
                // committed: ours builds on it (its base), and what it carried is settled
                // by ours: committed with it, so chosen, but perhaps recorded only by
                // nodes its commit reached, which may be gone. Our acceptors record both.
                let mut skipped = Vec::new();
                let mut settled = Vec::new();
                if let Some(a) = adopted {
                    let known = base.2.as_ref().is_some_and(|m| m.0 == a.id);
                    let carries_ours = a.base.as_ref().is_some_and(|b| b.0 == me)
                        || a.skipped.iter().any(|(i, _)| *i == me);
                    if a.id == me || carries_ours || a.stamp > base.1 {
                        // Our own record, one that carries ours, or another's newer than
                        // every value in the quorum: finish it (accepted again at our
                        // ballot, then committed; a newer value in place keeps it, applied
                        // before). Ours is then done, never built a second time.
                        let mine = a.id == me;
                        let round = self.accept(session, key, ballot, a.clone(), id);
                        let stage = RmwStage::Accepting { round, record: a, mine };
                        return self.rmw_progress(
                            session, op, rid, id, ballot, stage, barrier, delinquent,
                        );
                    }
                    let finished = self.keys.get(&key).is_some_and(|s| s.finished == Some(a.id));
                    if known {
                        settled = a.skipped.clone();
                    } else if !finished {
                        // What it carries, each request once (a run of failures kept as
                        // records all name the same base).
                        let mut carried: Vec<(RmwId, RmwOutcome)> = Vec::new();
                        let all = std::iter::once((a.id, outcome_of(&a)))
                            .chain(a.base.as_deref().cloned())
                            .chain(a.skipped.iter().cloned());
                        for (i, o) in all {
                            if !carried.iter().any(|(c, _)| *c == i) {
                                carried.push((i, o));
                            }
                        }
                        if carried.len() > SKIPPED_MAX {
                            // More than a record may carry: finish it instead (accepted at
                            // our ballot, committed with what it carries, acknowledged by a
                            // quorum), so that nothing it carries is dropped.
                            self.counters.rmws_finished_covered += 1;
                            let round = self.accept(session, key, ballot, a.clone(), id);
                            let stage = RmwStage::Accepting { round, record: a, mine: false };
                            return self.rmw_progress(
                                session, op, rid, id, ballot, stage, barrier, delinquent,
                            );
                        }
                        skipped = carried;
                    }
                }
                let (read, read_stamp, made_by) = base;
                let new = match &op {
                    KiteOp::Faa { delta, .. } => match faa(read.as_ref(), *delta) {
                        Ok(v) => Some(v),
                        Err(err) => {
                            // Not a number: fails as an acquire that read it.
                            let _ = err;
                            None
                        }
                    },
                    KiteOp::Cas { expected, new, .. } => (read == *expected).then(|| new.clone()),
                    _ => unreachable!("a read-modify-write"),
                };
                // A request its client named that fails is chosen like one that writes,
                // as a record keeping the value it read: a first attempt still running
                // elsewhere must not swap after its retry answered that it failed.
                let keep = me.client_named() && !self.config.unsafe_uncommitted_failures;
                let failure_kept =
                    (new.is_none() && keep).then(|| (read.clone().unwrap_or_default(), read_stamp));
                match new.map(|value| (value, read_stamp.next_rmw())).or(failure_kept) {
                    Some((value, stamp)) => {
                        let record = RmwRecord {
                            id: me,
                            value,
                            stamp,
                            digest,
                            read,
                            read_stamp,
                            base: made_by,
                            skipped,
                            settled,
                        };
                        self.rmw_progress(
                            session,
                            op,
                            rid,
                            id,
                            ballot,
                            RmwStage::Ready { record },
                            barrier,
                            delinquent,
                        )
                    }
                    None if seen_by >= self.quorum => {
                        self.apply(&key, read.clone(), read_stamp, made_by.clone());
                        if seen_by < self.config.members.len() {
                            self.spread_acquired(session, &key, &read, read_stamp, made_by);
                        }
                        self.acquired(id, delinquent);
                        self.counters.rmws += 1;
                        Ok(self.rmw_failed(&barrier, read, read_stamp))
                    }
                    None => {
                        self.counters.write_backs += 1;
                        let rmw = made_by.clone().map(|m| *m);
                        let msg = Message::Write {
                            round: 0,
                            key,
                            value: read.clone().unwrap_or_default(),
                            stamp: read_stamp,
                            rmw,
                            applied: Vec::new(),
                            query: Some(id),
                        };
                        let round = self.broadcast(session, msg, false);
                        self.rmw_progress(
                            session,
                            op,
                            rid,
                            id,
                            ballot,
                            RmwStage::WriteBack { round, read, read_stamp, made_by },
                            barrier,
                            delinquent,
                        )
                    }
                }
            }
            RmwStage::WriteBack { round, read, read_stamp, made_by } => {
                let Some(flagged) = self.quorum_acks(round) else {
                    return pending(
                        RmwStage::WriteBack { round, read, read_stamp, made_by },
                        ballot,
                        barrier,
                        delinquent,
                    );
                };
                self.close(round);
                delinquent.extend(flagged);
                self.apply(&key, read.clone(), read_stamp, made_by.clone());
                self.spread_acquired(session, &key, &read, read_stamp, made_by);
                self.acquired(id, delinquent);
                self.counters.rmws += 1;
                Ok(self.rmw_failed(&barrier, read, read_stamp))
            }
            RmwStage::Ready { record } => {
                // A failure kept as a record publishes nothing: it does not wait for the
                // release barrier (it is an acquire only, as any failed comparison).
                if barrier != Barrier::Done && record.wrote().is_some() {
                    return pending(RmwStage::Ready { record }, ballot, barrier, delinquent);
                }
                let round = self.accept(session, key, ballot, record.clone(), id);
                self.rmw_progress(
                    session,
                    op,
                    rid,
                    id,
                    ballot,
                    RmwStage::Accepting { round, record, mine: true },
                    barrier,
                    delinquent,
                )
            }
            RmwStage::Accepting { round, record, mine } => {
                let Some(r) = self.rounds.get(&round) else { unreachable!("open round") };
                let mut oks = 0;
                let mut nacks = 0;
                let mut highest = ballot;
                let mut flags = Flags::new();
                for (from, m) in &r.replies {
                    if let Message::Accepted { ok, promised, delinquent: flagged, .. } = m {
                        highest = highest.max(*promised);
                        if *ok {
                            oks += 1;
                            if let Some(gen) = flagged {
                                flags.insert(*from, *gen);
                            }
                        } else {
                            nacks += 1;
                        }
                    }
                }
                delinquent.extend(flags);
                if oks >= self.quorum {
                    self.close(round);
                    let outcome = outcome_of(&record);
                    // The commit also declares what the record built on done: that value
                    // may be held, so far, by the one replica its proposer read it from.
                    let mut applied = record.skipped.clone();
                    applied.extend(record.base.as_deref().cloned());
                    let msg = Message::Write {
                        round: 0,
                        key,
                        value: record.value.clone(),
                        stamp: record.stamp,
                        rmw: Some((record.id, outcome)),
                        applied,
                        query: None,
                    };
                    // Our own commit is tracked for the session's next release.
                    let round = self.broadcast(session, msg, mine);
                    return self.rmw_progress(
                        session,
                        op,
                        rid,
                        id,
                        ballot,
                        RmwStage::Committing { round, record, mine },
                        barrier,
                        delinquent,
                    );
                }
                if nacks > 0 {
                    self.close(round);
                    return self.rmw_retry(op, rid, id, highest, barrier, delinquent);
                }
                pending(RmwStage::Accepting { round, record, mine }, ballot, barrier, delinquent)
            }
            RmwStage::Committing { round, record, mine } => {
                if !self.written(round) {
                    return pending(
                        RmwStage::Committing { round, record, mine },
                        ballot,
                        barrier,
                        delinquent,
                    );
                }
                if !mine {
                    self.close(round);
                    self.counters.rmw_helped += 1;
                    if let Some(slot) = self.keys.get_mut(&key) {
                        slot.finished = Some(record.id);
                    }
                    ballot = self.next_ballot(&key, ballot);
                    let round = self.propose(session, key, ballot, id, rid);
                    return self.rmw_progress(
                        session,
                        op,
                        rid,
                        id,
                        ballot,
                        RmwStage::Proposing { round },
                        barrier,
                        delinquent,
                    );
                }
                self.acquired(id, delinquent);
                self.counters.rmws += 1;
                let Some(wrote) = record.wrote() else {
                    // A failure kept as a record: its release barrier is dropped.
                    self.counters.failures_committed += 1;
                    return Ok(self.rmw_failed(&barrier, record.read, record.read_stamp));
                };
                Ok(KiteResult::Rmw {
                    wrote: Some(wrote),
                    read: record.read,
                    read_stamp: record.read_stamp,
                    local: false,
                })
            }
        }
    }

    /// A compare-and-swap (or an FAA on a value that is not a number) that wrote nothing:
    /// an acquire, whose release barrier is dropped unfinished (its slow release round,
    /// if one is out, closed).
    fn rmw_failed(
        &mut self,
        barrier: &Barrier,
        read: Option<Value>,
        read_stamp: Stamp,
    ) -> KiteResult {
        self.drop_barrier(barrier);
        KiteResult::Rmw { read, read_stamp, wrote: None, local: false }
    }

    /// Drops a read-modify-write's release barrier unfinished: the request ends without
    /// publishing anything, so its slow release round, if one is out, is closed.
    fn drop_barrier(&mut self, barrier: &Barrier) {
        if let Barrier::Slow { round: Some(r), .. } = barrier {
            self.close(*r);
        }
    }

    fn rmw_retry(
        &mut self,
        op: KiteOp,
        rid: RmwId,
        id: u64,
        highest: Ballot,
        barrier: Barrier,
        delinquent: Flags,
    ) -> Result<KiteResult, Phase> {
        self.counters.rmw_retries += 1;
        let ballot = self.next_ballot(op.key(), highest);
        let backoff = self.rng.below(self.config.rmw_backoff_max.0.max(1) + 1);
        let until = self.now + Span(backoff);
        Err(Phase::Rmw {
            op,
            rid,
            id,
            ballot,
            stage: RmwStage::Backoff { until },
            barrier,
            delinquent,
        })
    }

    /// A ballot above `above` and above what this replica promised, never one this node
    /// used before (two sessions of one node may propose on one key at once).
    fn next_ballot(&mut self, key: &[u8], above: Ballot) -> Ballot {
        let promised = self.keys.get(key).map_or(Ballot::default(), |s| s.promised);
        let round = above.round.max(promised.round).max(self.last_round).saturating_add(1);
        self.last_round = round;
        Ballot { round, proposer: self.writer }
    }

    fn propose(&mut self, session: u64, key: Key, ballot: Ballot, id: u64, rmw: RmwId) -> RoundId {
        self.broadcast(
            session,
            Message::Propose { round: 0, key, ballot, rmw, query: Some(id) },
            false,
        )
    }

    fn accept(
        &mut self,
        session: u64,
        key: Key,
        ballot: Ballot,
        record: RmwRecord,
        id: u64,
    ) -> RoundId {
        self.broadcast(
            session,
            Message::Accept { round: 0, key, ballot, record, query: Some(id) },
            false,
        )
    }

    /// A write applied here and sent to all, tracked for the session's next release.
    fn write_tracked(
        &mut self,
        session: u64,
        key: Key,
        value: Value,
        stamp: Stamp,
        rmw: Option<(RmwId, RmwOutcome)>,
    ) -> RoundId {
        let msg =
            Message::Write { round: 0, key, value, stamp, rmw, applied: Vec::new(), query: None };
        self.broadcast(session, msg, true)
    }

    fn untrack_all(&mut self, session: u64) {
        let Some(s) = self.sessions.get_mut(&session) else { return };
        for round in std::mem::take(&mut s.tracked) {
            self.rounds.remove(&round);
        }
    }

    // ----- rounds -----

    fn index_of(&self, node: NodeId) -> Option<usize> {
        self.config.members.iter().position(|&m| m == node)
    }

    fn members_of(&self, mask: u64) -> Vec<NodeId> {
        self.config
            .members
            .iter()
            .enumerate()
            .filter(|(i, _)| mask & (1 << i) != 0)
            .map(|(_, &m)| m)
            .collect()
    }

    /// Sends `msg` (its round field filled in) to every member, this node first (handled
    /// at once), and opens a round for the answers.
    fn broadcast(&mut self, session: u64, mut msg: Message, tracked: bool) -> RoundId {
        let id = self.next_round;
        self.next_round += 1;
        set_round(&mut msg, id);
        let n = self.config.members.len();
        let round = Round {
            msg: msg.clone(),
            pending: (1u64 << n) - 1,
            replies: Vec::new(),
            next_send: self.now + self.config.retransmit,
            sends: 1,
            session,
            tracked,
        };
        self.rounds.insert(id, round);
        if tracked {
            // The session's next release waits for it (until every node acknowledged).
            if let Some(s) = self.sessions.get_mut(&session) {
                s.tracked.push(id);
            }
        }
        let me = self.config.node;
        if let Some(reply) = self.serve(me, msg.clone()) {
            self.record_reply(me, reply);
        }
        for &peer in &self.config.members {
            if peer != me {
                self.out.messages.push((peer, msg.clone()));
            }
        }
        id
    }

    fn close(&mut self, round: RoundId) {
        self.rounds.remove(&round);
    }

    fn acks(&self, round: RoundId) -> usize {
        self.rounds.get(&round).map_or(0, |r| r.replies.len())
    }

    /// Whether a write's round has a quorum's acknowledgements. A tracked round is
    /// removed once every node acknowledged it, so a missing round counts as written.
    fn written(&self, round: RoundId) -> bool {
        let unsafe_done = self.config.unsafe_complete_without_quorum;
        unsafe_done || self.rounds.get(&round).is_none_or(|r| r.replies.len() >= self.quorum)
    }

    /// A quorum's acknowledgements, with the replicas that deemed this node delinquent.
    fn quorum_acks(&self, round: RoundId) -> Option<Flags> {
        let r = self.rounds.get(&round)?;
        if r.replies.len() < self.quorum {
            return None;
        }
        Some(
            r.replies
                .iter()
                .filter_map(|(from, m)| match m {
                    Message::WriteAck { delinquent: Some(gen), .. } => Some((*from, *gen)),
                    _ => None,
                })
                .collect(),
        )
    }

    /// A quorum's read replies: the newest value and stamp, how many replies had that
    /// stamp, and whether any deemed this node delinquent.
    fn quorum_read(&self, round: RoundId) -> Option<(Option<Value>, Stamp, usize, Flags, Maker)> {
        let r = self.rounds.get(&round)?;
        if r.replies.len() < self.quorum {
            return None;
        }
        let mut best: (Option<Value>, Stamp, Maker) = (None, Stamp::ZERO, None);
        let mut flagged = Flags::new();
        for (from, m) in &r.replies {
            if let Message::ReadReply { value, stamp, delinquent, made_by, .. } = m {
                if let Some(gen) = delinquent {
                    flagged.insert(*from, *gen);
                }
                if *stamp > best.1 || (*stamp == best.1 && best.2.is_none()) {
                    best = (value.clone(), *stamp, made_by.clone());
                }
            }
        }
        let seen_by = r
            .replies
            .iter()
            .filter(|(_, m)| matches!(m, Message::ReadReply { stamp, .. } if *stamp == best.1))
            .count();
        Some((best.0, best.1, seen_by, flagged, best.2))
    }

    fn record_reply(&mut self, from: NodeId, reply: Message) -> Option<u64> {
        let round_id = reply_round(&reply)?;
        let index = self.index_of(from)?;
        let all = (1u64 << self.config.members.len()) - 1;
        let r = self.rounds.get_mut(&round_id)?;
        if r.pending & (1 << index) == 0 {
            return None;
        }
        if !reply_matches(&r.msg, &reply) {
            return None;
        }
        r.pending &= !(1 << index);
        r.replies.push((from, reply));
        let session = r.session;
        if r.tracked && r.pending & all == 0 {
            // Acknowledged by every node: the next release need not wait for it.
            self.rounds.remove(&round_id);
            if let Some(s) = self.sessions.get_mut(&session) {
                s.tracked.retain(|&t| t != round_id);
            }
        }
        Some(session)
    }

    fn resend_due(&mut self) {
        let now = self.now;
        let retransmit = self.config.retransmit;
        let mut sends = Vec::new();
        for r in self.rounds.values_mut() {
            if r.pending == 0 || r.next_send > now {
                continue;
            }
            r.sends += 1;
            // Quorum rounds resend at a fixed pace; writes waiting for every node back
            // off (a node down for long costs little), up to `WRITE_BACKOFF_MAX` times the pace.
            let factor = if r.tracked { 1u64 << r.sends.min(WRITE_BACKOFF_SHIFT_MAX) } else { 1 };
            r.next_send = now + Span(retransmit.0.saturating_mul(factor));
            sends.push((r.pending, r.msg.clone()));
        }
        for (pending, msg) in sends {
            for peer in self.members_of(pending) {
                if peer != self.config.node {
                    self.counters.retransmits += 1;
                    self.out.messages.push((peer, msg.clone()));
                }
            }
        }
    }

    fn next_wake(&self) -> Option<Time> {
        let mut wake: Option<Time> = None;
        let mut at = |t: Time| wake = Some(wake.map_or(t, |w: Time| w.min(t)));
        if let Some(t) = self.rejoin_wake() {
            at(t);
        }
        for r in self.rounds.values() {
            if r.pending != 0 {
                at(r.next_send);
            }
        }
        for s in self.sessions.values() {
            match &s.active {
                Some(Active {
                    phase: Phase::Release { barrier: Barrier::Waiting { deadline }, .. },
                    ..
                })
                | Some(Active {
                    phase: Phase::Rmw { barrier: Barrier::Waiting { deadline }, .. },
                    ..
                })
                | Some(Active {
                    phase: Phase::Flush { barrier: Barrier::Waiting { deadline }, .. },
                    ..
                }) => at(*deadline),
                _ => {}
            }
            if let Some(Active {
                phase: Phase::Rmw { stage: RmwStage::Backoff { until }, .. },
                ..
            }) = &s.active
            {
                at(*until);
            }
        }
        wake
    }

    // ----- the replica: peer messages -----

    fn on_message(&mut self, from: NodeId, message: Message) -> Option<u64> {
        if self.index_of(from).is_none() || from == self.config.node {
            self.reject(from, "sender is not a peer");
            return None;
        }
        if let Err(reason) =
            Self::check_message(&message).and_then(|()| self.check_state(from, &message))
        {
            self.reject(from, reason);
            return None;
        }
        if let Some(origin) = reply_origin(&message) {
            let origin = origin.clone();
            if !self.admit_reply(from, &origin) {
                return None;
            }
            return self.record_reply(from, message);
        }
        match message {
            Message::ViewAck { incarnation, gen } => {
                self.on_view_ack(from, incarnation, gen);
                return None;
            }
            Message::StateRequest { rejoin, after } => {
                self.on_fence(from, rejoin);
                let page = self.state_page(rejoin, after);
                self.out.messages.push((from, page));
                return None;
            }
            Message::StatePage { .. } => {
                self.on_state_page(from, message);
                return None;
            }
            _ => {}
        }
        if self.rejoin.is_some() && !self.answers_while_rejoining(&message) {
            self.counters.unanswered_rejoining += 1;
            return None;
        }
        if let Some(reply) = self.serve(from, message) {
            self.out.messages.push((from, reply));
        }
        None
    }

    fn reject(&mut self, from: NodeId, reason: &'static str) {
        self.counters.rejected += 1;
        self.out.rejected.push(Rejection { from, reason });
    }

    /// The half of the gate that needs the configuration: sizes and members.
    fn check_state(&self, from: NodeId, message: &Message) -> Result<(), &'static str> {
        let limits = &self.config.limits;
        let member = |writer: u64| self.index_of(NodeId((writer >> 32) as u32)).is_some();
        // A stamp names a member, or is the initial one (writer 0, version 0), which
        // read-modify-writes of a never-written key build on.
        // Versions, rounds and read-modify-write counts far below where they would
        // saturate: a peer's huge value would otherwise pin this node's next ones at the
        // ceiling, and make them collide.
        const COUNTER_MAX: u64 = 1 << 62;
        let stamp_ok = |s: &Stamp| {
            if s.version >= COUNTER_MAX || s.rmw >= COUNTER_MAX {
                return Err("counter out of range");
            }
            if (s.writer == 0 && s.version == 0) || member(s.writer) {
                Ok(())
            } else {
                Err("stamp of a non-member")
            }
        };
        let id_ok = |i: &RmwId| {
            if i.client_named() || member(i.node) {
                Ok(())
            } else {
                Err("request of a non-member")
            }
        };
        let outcome_ok = |o: &RmwOutcome| -> Result<(), &'static str> {
            stamp_ok(&o.stamp)?;
            limits.check_value(&o.value).map_err(|_| "value too large")?;
            if let Some(v) = &o.read {
                limits.check_value(v).map_err(|_| "value too large")?;
            }
            Ok(())
        };
        let record_ok = |r: &RmwRecord| -> Result<(), &'static str> {
            stamp_ok(&r.stamp)?;
            limits.check_value(&r.value).map_err(|_| "value too large")?;
            if let Some(v) = &r.read {
                limits.check_value(v).map_err(|_| "value too large")?;
            }
            if r.skipped.len() > SKIPPED_MAX || r.settled.len() > SKIPPED_MAX {
                return Err("too many records carried");
            }
            id_ok(&r.id)?;
            let carried = r.skipped.iter().chain(&r.settled);
            for (i, o) in carried.chain(r.base.iter().map(|b| &**b)) {
                id_ok(i)?;
                outcome_ok(o)?;
            }
            Ok(())
        };
        let ballot_ok = |b: &Ballot| match (member(b.proposer), b.round < COUNTER_MAX) {
            (false, _) => Err("ballot of a non-member"),
            (true, false) => Err("counter out of range"),
            (true, true) => Ok(()),
        };
        let sized = |key: &[u8], value: Option<&Value>| {
            limits.check_key(key).map_err(|_| "key too large")?;
            value.map_or(Ok(()), |v| limits.check_value(v).map_err(|_| "value too large"))
        };
        if let Some(view) = reply_origin(message).and_then(|o| o.view.as_ref()) {
            if view.incarnations.iter().any(|(node, _)| self.index_of(*node).is_none()) {
                return Err("view names a non-member");
            }
        }
        match message {
            Message::Write { key, value, stamp, rmw, applied, .. } => {
                sized(key, Some(value))?;
                stamp_ok(stamp)?;
                if applied.len() > SKIPPED_MAX + 1 {
                    return Err("too many records carried");
                }
                for (i, o) in rmw.iter().chain(applied) {
                    id_ok(i)?;
                    outcome_ok(o)?;
                }
            }
            Message::Read { key, .. } => sized(key, None)?,
            Message::Propose { key, ballot, rmw, .. } => {
                sized(key, None)?;
                ballot_ok(ballot)?;
                id_ok(rmw)?;
            }
            Message::Accept { key, record, ballot, .. } => {
                sized(key, None)?;
                ballot_ok(ballot)?;
                record_ok(record)?;
            }
            Message::SlowRelease { delinquent, .. }
                if delinquent.iter().any(|d| self.index_of(*d).is_none()) =>
            {
                return Err("delinquent set names a non-member");
            }
            Message::ReadReply { value, stamp, made_by, .. } => {
                if let Some(v) = value {
                    limits.check_value(v).map_err(|_| "value too large")?;
                }
                stamp_ok(stamp)?;
                if let Some(m) = made_by {
                    id_ok(&m.0)?;
                    outcome_ok(&m.1)?;
                }
            }
            Message::Promise { value, stamp, accepted, promised, outcome, made_by, .. } => {
                if let Some(v) = value {
                    limits.check_value(v).map_err(|_| "value too large")?;
                }
                stamp_ok(stamp)?;
                for o in outcome.iter().chain(made_by.iter().map(|m| &m.1)) {
                    outcome_ok(o)?;
                }
                if let Some(m) = made_by {
                    id_ok(&m.0)?;
                }
                if *promised != Ballot::default() {
                    ballot_ok(promised)?;
                }
                if let Some((b, r)) = accepted {
                    ballot_ok(b)?;
                    record_ok(r)?;
                }
            }
            Message::Accepted { promised, .. } if *promised != Ballot::default() => {
                ballot_ok(promised)?
            }
            Message::StateRequest { rejoin, after } => {
                if *rejoin >> 32 != u64::from(from.0) {
                    return Err("state request of another node's rejoin");
                }
                if let Cursor::Key(key) = after {
                    sized(key, None)?;
                }
            }
            Message::ViewAck { incarnation, gen } => {
                if *incarnation > self.config.incarnation {
                    return Err("acknowledges a view of a later incarnation");
                }
                if *incarnation == self.config.incarnation && *gen > self.view_gen {
                    return Err("acknowledges a view never sent");
                }
            }
            Message::StatePage { after, slots, outcomes, bits, next, .. } => {
                if slots.len() + outcomes.len() > PAGE_ITEMS_MAX || bits.len() > 63 {
                    return Err("state page too large");
                }
                for cursor in std::iter::once(after).chain(next.iter()) {
                    if let Cursor::Key(key) = cursor {
                        sized(key, None)?;
                    }
                }
                for s in slots {
                    sized(&s.key, s.value.as_ref())?;
                    stamp_ok(&s.stamp)?;
                    if s.promised != Ballot::default() {
                        ballot_ok(&s.promised)?;
                    }
                    if let Some((b, r)) = &s.accepted {
                        ballot_ok(b)?;
                        record_ok(r)?;
                        if !r.well_formed() {
                            return Err("read-modify-write not right after its base");
                        }
                    }
                    if let Some(m) = &s.made_by {
                        id_ok(&m.0)?;
                        outcome_ok(&m.1)?;
                    }
                }
                for (id, key, o) in outcomes {
                    sized(key, None)?;
                    id_ok(id)?;
                    outcome_ok(o)?;
                }
                if bits
                    .iter()
                    .any(|(node, _, gen)| self.index_of(*node).is_none() || *gen >= COUNTER_MAX)
                {
                    return Err("bit of a non-member");
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Answers the delinquency query of `from`'s acquire `id`.
    /// `Some(generation)` when delinquent.
    fn query(&mut self, from: NodeId, id: Option<u64>) -> Option<u64> {
        let id = id?;
        let gen = self.gens.get(&from).copied().unwrap_or(0);
        let bit = self.bits.get_mut(&from)?;
        match bit {
            Bit::Clear => None,
            Bit::Set => {
                *bit = Bit::Transient(vec![id]);
                Some(gen)
            }
            Bit::Transient(ids) => {
                if !ids.contains(&id) {
                    if ids.len() >= TRANSIENT_IDS_MAX {
                        ids.remove(0);
                    }
                    ids.push(id);
                }
                Some(gen)
            }
        }
    }

    fn apply(&mut self, key: &Key, value: Option<Value>, stamp: Stamp, made_by: Maker) {
        let slot = self.keys.entry(key.clone()).or_default();
        if stamp > slot.stamp {
            slot.value = value;
            slot.stamp = stamp;
            slot.made_by = made_by;
        } else if stamp == slot.stamp && slot.made_by.is_none() {
            slot.made_by = made_by;
        }
    }

    /// Remembers that `id` was committed on `key` (the latest per session).
    fn record_outcome(&mut self, key: &Key, id: RmwId, outcome: RmwOutcome) {
        self.counters.outcomes_dropped += self.outcomes.record((id.node, id.session), key, outcome);
    }

    /// What this node does with a peer's (or its own) request; `None` for messages that
    /// are not answered.
    fn serve(&mut self, from: NodeId, message: Message) -> Option<Message> {
        let by = self.origin_for(from);
        match message {
            Message::Write { round, key, value, stamp, rmw, applied, query } => {
                let slot = self.keys.entry(key.clone()).or_default();
                // A failure kept as a record (nothing written) did not make the value it
                // carries back.
                let maker = rmw.clone().filter(|(_, o)| o.wrote().is_some()).map(Box::new);
                if stamp > slot.stamp {
                    slot.value = Some(value);
                    slot.stamp = stamp;
                    slot.made_by = maker;
                } else if stamp == slot.stamp && slot.made_by.is_none() {
                    slot.made_by = maker;
                }
                // An accepted record stays: a later proposer ignores it once its quorum
                // holds a value at least as new, and until then it is evidence that the
                // request may have been chosen.
                for (id, outcome) in rmw.into_iter().chain(applied) {
                    self.record_outcome(&key, id, outcome);
                }
                let delinquent = self.query(from, query);
                Some(Message::WriteAck { round, by, delinquent })
            }
            Message::Read { round, key, query } => {
                let delinquent = self.query(from, query);
                let slot = self.keys.get(&key);
                let (value, stamp) =
                    slot.map_or((None, Stamp::ZERO), |s| (s.value.clone(), s.stamp));
                let made_by = slot.and_then(|s| s.made_by.clone());
                Some(Message::ReadReply { round, by, value, stamp, made_by, delinquent })
            }
            Message::SlowRelease { round, delinquent } => {
                for node in delinquent {
                    if node == self.config.node {
                        self.counters.self_delinquent += 1;
                    }
                    self.bits.insert(node, Bit::Set);
                    let gen = self.gens.entry(node).or_default();
                    *gen = gen.saturating_add(1);
                }
                Some(Message::SlowReleaseAck { round, by })
            }
            Message::ResetBit { acquire, gen } => {
                let current = self.gens.get(&from).copied().unwrap_or(0);
                if let Some(bit) = self.bits.get_mut(&from) {
                    let named = matches!(bit, Bit::Transient(ids) if ids.contains(&acquire));
                    let paper = self.config.unsafe_paper_reset && gen == u64::MAX;
                    if named && (gen == current || paper) {
                        *bit = Bit::Clear;
                        self.counters.resets += 1;
                    }
                }
                None
            }
            Message::Propose { round, key, ballot, rmw, query } => {
                let delinquent = self.query(from, query);
                // The request's outcome if it was done here, or a later one of its session
                // (which tells the proposer that its own is no longer kept).
                // (On another key with the same number: the client used the number for
                // another command, which the proposer tells by the digest.)
                let outcome = self
                    .outcomes
                    .get(&(rmw.node, rmw.session))
                    .filter(|(_, o)| o.seq >= rmw.seq)
                    .map(|(_, o)| o.clone());
                let slot = self.keys.entry(key).or_default();
                let ok = ballot > slot.promised;
                if ok {
                    slot.promised = ballot;
                }
                Some(Message::Promise {
                    round,
                    by,
                    ok,
                    promised: slot.promised,
                    accepted: slot.accepted.clone(),
                    value: slot.value.clone(),
                    stamp: slot.stamp,
                    outcome,
                    made_by: slot.made_by.clone(),
                    delinquent,
                })
            }
            Message::Accept { round, key, ballot, record, query } => {
                let slot = self.keys.entry(key.clone()).or_default();
                // The same acceptance again (its answer was lost): answered as before, even
                // after a higher promise, if this node made it.
                let again = slot.accepted_here
                    && slot.accepted.as_ref().is_some_and(|(b, r)| *b == ballot && *r == record);
                let ok = ballot >= slot.promised || again;
                let base = record.base.clone();
                let settled = record.settled.clone();
                if ok && !again {
                    slot.promised = ballot;
                    slot.accepted = Some((ballot, record));
                    slot.accepted_here = true;
                }
                let promised = slot.promised;
                if ok {
                    // The record builds on a committed read-modify-write: committed means
                    // chosen, so remember it done here too (its commit may so far have
                    // reached only the replica the proposer read it from).
                    if let Some(base) = base {
                        let (id, outcome) = *base;
                        self.record_outcome(&key, id, outcome);
                    }
                    // So are the records that one carried: chosen with it (the record
                    // names them as `settled`).
                    for (id, outcome) in settled {
                        self.record_outcome(&key, id, outcome);
                    }
                }
                let delinquent = if ok { self.query(from, query) } else { None };
                Some(Message::Accepted { round, by, ok, promised, delinquent })
            }
            Message::WriteAck { .. }
            | Message::ReadReply { .. }
            | Message::SlowReleaseAck { .. }
            | Message::Promise { .. }
            | Message::Accepted { .. }
            | Message::ViewAck { .. }
            | Message::StateRequest { .. }
            | Message::StatePage { .. } => None,
        }
    }
}

/// What a read-modify-write's record returns, once applied.
fn outcome_of(record: &RmwRecord) -> RmwOutcome {
    RmwOutcome {
        seq: record.id.seq,
        read: record.read.clone(),
        read_stamp: record.read_stamp,
        value: record.value.clone(),
        stamp: record.stamp,
        digest: record.digest,
    }
}

/// FAA on a decimal i64 value (absent: 0).
fn faa(value: Option<&Value>, delta: i64) -> Result<Value, KeelError> {
    let current = match value {
        None => 0,
        Some(v) => std::str::from_utf8(v)
            .ok()
            .and_then(|s| s.parse::<i64>().ok())
            .ok_or(KeelError::NotAnInteger)?,
    };
    let next = current.checked_add(delta).ok_or(KeelError::NotAnInteger)?;
    Ok(Value::from(next.to_string()))
}

fn set_round(msg: &mut Message, id: RoundId) {
    match msg {
        Message::Write { round, .. }
        | Message::Read { round, .. }
        | Message::SlowRelease { round, .. }
        | Message::Propose { round, .. }
        | Message::Accept { round, .. } => *round = id,
        _ => {}
    }
}

/// The round a reply answers (`None` for requests).
fn reply_round(msg: &Message) -> Option<RoundId> {
    match msg {
        Message::WriteAck { round, .. }
        | Message::ReadReply { round, .. }
        | Message::SlowReleaseAck { round, .. }
        | Message::Promise { round, .. }
        | Message::Accepted { round, .. } => Some(*round),
        _ => None,
    }
}

/// Who sent a reply (`None` for requests).
fn reply_origin(msg: &Message) -> Option<&Origin> {
    match msg {
        Message::WriteAck { by, .. }
        | Message::ReadReply { by, .. }
        | Message::SlowReleaseAck { by, .. }
        | Message::Promise { by, .. }
        | Message::Accepted { by, .. } => Some(by),
        _ => None,
    }
}

/// Whether `reply` is the kind of answer `request` gets (a forged reply of another kind
/// is ignored).
fn reply_matches(request: &Message, reply: &Message) -> bool {
    matches!(
        (request, reply),
        (Message::Write { .. }, Message::WriteAck { .. })
            | (Message::Read { .. }, Message::ReadReply { .. })
            | (Message::SlowRelease { .. }, Message::SlowReleaseAck { .. })
            | (Message::Propose { .. }, Message::Promise { .. })
            | (Message::Accept { .. }, Message::Accepted { .. })
    )
}
