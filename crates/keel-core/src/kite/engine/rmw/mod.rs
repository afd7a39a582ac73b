//! Read-modify-writes (FAA, CAS): per-key leaderless Paxos, as in CASPaxos, with the
//! release barrier before a record that writes, and the acquire's delinquency answers.
//!
//! A read-modify-write is an [`Rmw`] (what every stage carries) and a [`RmwStage`]; each
//! stage is one function answering a [`Step`]: go on at once to the next stage, wait (for
//! replies, the back-off or the barrier) in a stage, or be done.
//!
//! ```text
//!  Queued ─(key free: take it, first ballot)─► Proposing ─(a quorum's promises)─┐
//!    ▲                                            ▲   │ a nack: retry above it    │
//!    │                               Backoff ─────┘◄──┘                            │
//!    │                                                                             ▼
//!    │        found done ─► Committing(its outcome again, ours)        read the quorum
//!    │        another's record newer ─► Accepting(it, not ours) ─► Committing ─► Proposing
//!    │        ours to build ─► Ready ─(barrier)─► Accepting(ours) ─► Committing ─► done
//!    │        failed, seen by a quorum ─► done;  failed, not yet ─► WriteBack ─► done
//!    └ another session of this node holds the key
//! ```
//!
//! Files: `mod.rs` (the stage loop, the key, ballots and retries), `propose.rs` (what a
//! quorum's promises decide), `accept.rs` (the accept round and the commit it sends),
//! `commit.rs` (the commit's and the write-back's end, the results).

use super::{Ballot, Key, Message, RmwId, RmwRecord, Stamp, Value};
use super::{Barrier, Flags, KiteEngine, KiteOp, KiteResult, Phase, RoundId};
use crate::time::Span;
use keel_types::KeelError;

mod accept;
mod commit;
mod propose;

/// What every stage of a read-modify-write carries.
#[derive(Clone, Debug)]
pub(super) struct Rmw {
    pub(super) op: KiteOp,
    /// The id it goes by (its node's and session's, or its client's).
    pub(super) rid: RmwId,
    /// Its acquire id, which its queries and resets carry.
    pub(super) id: u64,
    /// The ballot of its proposals and accepts.
    pub(super) ballot: Ballot,
    /// The release barrier a record that writes waits for.
    pub(super) barrier: Barrier,
    /// The replicas that deemed this node delinquent so far.
    pub(super) delinquent: Flags,
}

impl Rmw {
    fn key(&self) -> &Key {
        self.op.key()
    }
}

#[derive(Clone, Debug)]
pub(super) enum RmwStage {
    /// Waits while another session of this node runs a read-modify-write on the same key:
    /// a node runs one at a time per key, so that its own sessions do not preempt each
    /// other's ballots (each new proposal would nack the one before).
    Queued,
    Proposing {
        round: RoundId,
    },
    /// A retry waits for its back-off.
    Backoff {
        until: crate::time::Time,
    },
    Accepting(Sent),
    /// A compare-and-swap that failed, writing back the value it read.
    WriteBack {
        round: RoundId,
        read: Option<Value>,
        read_stamp: Stamp,
        made_by: super::Maker,
    },
    Committing(Sent),
    /// Waiting for the barrier before accepting its own record.
    Ready {
        record: RmwRecord,
    },
}

/// A record out for acceptance or commit, and whether it is this request's own (or
/// another's, finished first).
#[derive(Clone, Debug)]
pub(super) struct Sent {
    pub(super) round: RoundId,
    pub(super) record: RmwRecord,
    pub(super) mine: bool,
}

/// What one stage did.
enum Step {
    /// Go on at once with this stage.
    Next(RmwStage),
    /// Wait in this stage (for replies, the back-off or the barrier).
    Wait(RmwStage),
    /// Finished: the result, or the refusal.
    Done(Result<KiteResult, KeelError>),
}

impl KiteEngine {
    /// Starts a read-modify-write: a weak CAS that fails against the local copy at once,
    /// every other in its key's queue.
    pub(super) fn rmw_start(
        &mut self,
        session: u64,
        rid: RmwId,
        op: KiteOp,
    ) -> Result<KiteResult, Phase> {
        assert!(op.is_rmw(), "a read-modify-write");
        // A retry of a weak one is sent as a strong one (docs/kite.md, Retries): the
        // local value may be its own first attempt's swap.
        if let KiteOp::Cas { key, expected, strong: false, .. } = &op {
            let (value, stamp) = self.local(key);
            if self.in_epoch(key) && value != *expected {
                self.counters.cas_local_failures += 1;
                let (read, read_stamp) = (value, stamp);
                return Ok(KiteResult::Rmw { read, read_stamp, wrote: None, local: true });
            }
        }
        let id = self.new_acquire();
        let barrier = self.new_barrier();
        if self.rmw_keys.get(op.key()).is_some_and(|&s| s != session) {
            self.counters.rmws_queued += 1;
        }
        let (ballot, delinquent) = (Ballot::default(), Flags::new());
        let rmw = Rmw { op, rid, id, ballot, barrier, delinquent };
        self.rmw_progress(session, rmw, RmwStage::Queued)
    }

    /// Runs a read-modify-write's stages until one waits or it is done.
    pub(super) fn rmw_progress(
        &mut self,
        session: u64,
        mut rmw: Rmw,
        mut stage: RmwStage,
    ) -> Result<KiteResult, Phase> {
        loop {
            match self.rmw_step(session, &mut rmw, stage) {
                Step::Next(next) => stage = next,
                Step::Wait(waiting) => return Err(Phase::Rmw(rmw, waiting)),
                Step::Done(Ok(result)) => return Ok(result),
                Step::Done(Err(error)) => return Err(Phase::Refused(error)),
            }
        }
    }

    /// One stage.
    fn rmw_step(&mut self, session: u64, rmw: &mut Rmw, stage: RmwStage) -> Step {
        match stage {
            RmwStage::Queued => self.rmw_take_key(session, rmw),
            RmwStage::Backoff { until } if self.now < until => {
                Step::Wait(RmwStage::Backoff { until })
            }
            // One that backed off holds the key and its ballot already.
            RmwStage::Backoff { .. } => Step::Next(self.propose(session, rmw)),
            RmwStage::Proposing { round } => self.rmw_promised(session, rmw, round),
            RmwStage::Ready { record } => self.rmw_ready(session, rmw, record),
            RmwStage::Accepting(sent) => self.rmw_accepted(session, rmw, sent),
            RmwStage::WriteBack { round, read, read_stamp, made_by } => {
                self.rmw_written_back(session, rmw, round, read, read_stamp, made_by)
            }
            RmwStage::Committing(sent) => self.rmw_committed(session, rmw, sent),
        }
    }

    /// A queued request takes the key (unless another session of this node holds it)
    /// and its first ballot, and proposes.
    fn rmw_take_key(&mut self, session: u64, rmw: &mut Rmw) -> Step {
        if self.rmw_keys.get(rmw.key()).is_some_and(|&s| s != session) {
            return Step::Wait(RmwStage::Queued);
        }
        let held = self.rmw_keys.insert(rmw.key().clone(), session);
        assert!(held.is_none(), "session {session} takes a key it holds");
        rmw.ballot = self.next_ballot(rmw.key(), rmw.ballot);
        Step::Next(self.propose(session, rmw))
    }

    /// A nack: a higher ballot is out. Starts over above it after a random back-off.
    fn rmw_retry(&mut self, rmw: &mut Rmw, highest: Ballot) -> Step {
        self.counters.rmw_retries += 1;
        rmw.ballot = self.next_ballot(rmw.key(), highest);
        let backoff = self.rng.below(self.config.rmw_backoff_max.0.max(1) + 1);
        let until = self.now + Span(backoff);
        Step::Wait(RmwStage::Backoff { until })
    }

    /// A ballot above `above` and above what this replica promised, never one this node
    /// used before (two sessions of one node may propose on one key at once).
    fn next_ballot(&mut self, key: &[u8], above: Ballot) -> Ballot {
        let promised = self.keys.get(key).map_or(Ballot::default(), |s| s.promised);
        let round = above.round.max(promised.round).max(self.last_round).saturating_add(1);
        assert!(round > self.last_round, "ballot rounds run out");
        self.last_round = round;
        let ballot = Ballot { round, proposer: self.writer };
        assert!(ballot > above && ballot > promised, "a ballot not above the ones it follows");
        ballot
    }

    /// Proposes `rmw` at its ballot: the stage that waits for the promises.
    fn propose(&mut self, session: u64, rmw: &Rmw) -> RmwStage {
        assert_eq!(rmw.ballot.proposer, self.writer, "a proposal under another's ballot");
        assert_eq!(self.rmw_keys.get(rmw.key()), Some(&session), "a proposal without its key");
        let (key, ballot, rmw_id, query) = (rmw.key().clone(), rmw.ballot, rmw.rid, Some(rmw.id));
        let msg = Message::Propose { round: 0, key, ballot, rmw: rmw_id, query };
        RmwStage::Proposing { round: self.broadcast(session, msg, false) }
    }

    /// Asks a quorum to accept `record` at `rmw`'s ballot: the stage that waits for them.
    fn accept(&mut self, session: u64, rmw: &Rmw, record: RmwRecord, mine: bool) -> RmwStage {
        assert!(record.well_formed(), "a record not right after its base");
        assert!(!mine || record.id == rmw.rid, "another's record accepted as ours");
        let (key, ballot, query) = (rmw.key().clone(), rmw.ballot, Some(rmw.id));
        let msg = Message::Accept { round: 0, key, ballot, record: record.clone(), query };
        let round = self.broadcast(session, msg, false);
        RmwStage::Accepting(Sent { round, record, mine })
    }
}
