//! What must hold between any two steps of a Kite node: the round bookkeeping, the
//! sessions and their phases, the read-modify-write bookkeeping, the rejoin's fence, and
//! the bounds. The simulator checks it after every step of every node (and a debug build
//! after every step); each check costs what the node has in flight (its rounds and its
//! sessions' operations), never what it stores.

use super::rmw::Sent;
use super::rounds::{reply_matches, reply_origin};
use super::{Active, Ballot, Barrier, Bit, KiteEngine, Message, Phase, RmwId, RmwRecord};
use super::{RmwStage, Round, RoundId, Session, TRACKED_MAX, TRANSIENT_IDS_MAX};
use keel_types::Key;

impl KiteEngine {
    /// Panics, naming the rule, if the node's state breaks an invariant.
    pub fn check_invariants(&self) {
        self.check_identity();
        for (&id, round) in self.rounds.iter() {
            self.check_round(id, round);
        }
        self.rounds.check_index();
        self.check_waits();
        assert!(self.sessions.len() <= self.config.sessions_max, "more sessions than allowed");
        for (&id, session) in &self.sessions {
            self.check_session(id, session);
        }
        for (key, &session) in &self.rmw_keys {
            let runs =
                self.sessions.get(&session).and_then(|s| s.active.as_ref()).is_some_and(|a| {
                    matches!(&a.phase, Phase::Rmw(rmw, stage)
                    if rmw.op.key() == key && !matches!(stage, RmwStage::Queued))
                });
            assert!(runs, "key {key:?} held for session {session}, which runs no RMW on it");
        }
        if self.rejoin.is_some() {
            // A rejoining node starts nothing: no operation runs, no round is open.
            assert!(self.rounds.is_empty(), "a round open while rejoining");
            assert!(self.sessions.values().all(|s| s.active.is_none()), "served while rejoining");
        }
    }

    /// The node's identity, bits and bounded tables.
    fn check_identity(&self) {
        let me = self.config.node;
        assert_eq!(self.incarnations.get(&me), Some(&self.config.incarnation), "own incarnation");
        assert!(
            self.incarnations.keys().all(|n| self.index_of(*n).is_some()),
            "view of a stranger"
        );
        assert!(self.view_told.values().all(|&g| g <= self.view_gen), "view told ahead of sent");
        self.check_membership();
        assert!(
            self.voters_disagree.is_empty()
                || (self.membership.epoch == 0
                    && self.voters_disagree.iter().all(|&n| n != me && self.index_of(n).is_some())),
            "configured voters compared past epoch 0, or with itself or a stranger"
        );
        assert!(self.config.incarnation == 0 || self.epoch >= 1, "a later incarnation's epoch");
        assert_eq!(self.bits.len(), self.config.members.len(), "one bit per member");
        for bit in self.bits.values() {
            if let Bit::Transient(ids) = bit {
                assert!(!ids.is_empty() && ids.len() <= TRANSIENT_IDS_MAX, "transient ids");
            }
        }
        assert!(self.outcomes.len() <= self.config.outcomes_max.max(1), "outcomes past bound");
    }

    /// One open round: who answered, how, and whose it is.
    fn check_round(&self, id: RoundId, round: &Round) {
        let n = self.config.members.len();
        let all = (1u64 << n) - 1;
        assert_eq!(round.pending & !all, 0, "round {id} waits for a non-member");
        // A round asks some members (the voters, or those named), so the ones answered
        // are those whose replies it holds, never one it still waits for.
        let answered = round.replies_bits.count_ones() as usize;
        assert_eq!(round.replies.len(), answered, "round {id}: one reply per member answered");
        assert_eq!(round.replies_bits & round.pending, 0, "round {id}: answered and pending");
        let me = self.index_of(self.config.node).expect("a member");
        // A round is served here first, in the step that opens it. A sync query is
        // answered only once synced, this node's own too: its answer is missing only while
        // this node has not synced for the query's membership (`membership.rs`).
        let own_later = match &round.msg {
            Message::SyncQuery { membership, .. } => {
                self.synced < membership.epoch && self.membership.epoch <= membership.epoch
            }
            _ => false,
        };
        assert!(
            own_later || round.pending & (1 << me) == 0,
            "round {id} lacks this node's own answer"
        );
        for (from, reply) in &round.replies {
            let index = self.index_of(*from).expect("replies come from members");
            assert_eq!(round.pending & (1 << index), 0, "round {id}: a reply from a pending node");
            assert_ne!(round.replies_bits & (1 << index), 0, "round {id}: a reply not marked");
            assert!(reply_matches(&round.msg, reply), "round {id}: a reply of another kind");
            let by = reply_origin(reply).expect("a reply");
            let known = self.incarnations.get(from).copied();
            // The fence: no open round holds a reply of an incarnation known to be gone.
            assert!(
                self.config.unsafe_unfenced_rejoin || known == Some(by.incarnation),
                "round {id} holds a reply of {from:?}'s incarnation {}, {known:?} known",
                by.incarnation
            );
        }
        let pending_all = round.tracked && round.pending & all == 0;
        assert!(!pending_all, "round {id}: a tracked round acknowledged by all stays open");
        let session = self.sessions.get(&round.session);
        // Every other round is one its session's operation waits on. (A slow release may
        // outlive its operation: a read-modify-write found done by a retry ends without
        // closing its barrier's round, which then waits only for the rest's answers.)
        if !round.tracked && round.msg.kind() != "slow-release" {
            let active = session.and_then(|s| s.active.as_ref());
            let waited = active.is_some_and(|a| waits_on(&a.phase, id));
            assert!(waited, "round {id} open with no operation of its session waiting on it");
        }
        if round.tracked {
            let listed = session.is_some_and(|s| s.tracked.contains(&id));
            assert!(listed, "tracked round {id} not listed by its session {}", round.session);
            assert!(matches!(round.msg, Message::Write { .. }), "tracked round {id} not a write");
        }
    }

    /// The waiting operations' timer index holds each parked operation's wake-up, and
    /// nothing else.
    fn check_waits(&self) {
        let mut waiting = 0;
        for (&id, session) in &self.sessions {
            let Some(at) = session.active.as_ref().and_then(|a| a.phase.wake()) else {
                continue;
            };
            waiting += 1;
            assert!(self.waits.contains(&(at, id)), "session {id} waits unindexed at {at:?}");
        }
        assert_eq!(self.waits.len(), waiting, "the timer index holds other sessions");
    }

    /// One session: its queue, its tracked writes, and the operation it runs.
    fn check_session(&self, id: u64, session: &Session) {
        assert!(session.queue.len() <= self.config.session_queue_max, "session {id} queue");
        // A session's next operation settles its writes once it holds the bound; writes an
        // operation makes on its own way (an acquire's spread, a commit) may pass it a little.
        assert!(session.tracked.len() <= TRACKED_MAX + 4, "session {id} tracks too many writes");
        for round in &session.tracked {
            let open = self.rounds.get(*round).is_some_and(|r| r.tracked && r.session == id);
            assert!(open, "session {id} tracks round {round}, which is not its open write");
        }
        if let Some(active) = &session.active {
            self.check_phase(id, active);
        }
    }

    /// The rounds an operation waits on are open, and what it holds is well formed.
    fn check_phase(&self, session: u64, active: &Active) {
        let open = |round: &RoundId, kind: &str| {
            let r = self.rounds.get(*round);
            assert!(
                r.is_some_and(|r| r.session == session && r.msg.kind() == kind),
                "session {session} waits on round {round}, not an open {kind} of its own"
            );
        };
        match &active.phase {
            Phase::SlowRead { round, snapshot, .. } | Phase::SlowWrite { round, snapshot, .. } => {
                open(round, "read");
                assert!(*snapshot <= self.epoch, "an epoch snapshot from the future");
            }
            Phase::Acquire(acquire) => {
                match &acquire.write_back {
                    None => open(&acquire.round, "read"),
                    Some((wb, _)) => open(wb, "write"),
                }
                assert!(acquire.snapshot <= self.epoch, "an epoch snapshot from the future");
                assert!(acquire.id < self.next_acquire, "an acquire id not given out");
            }
            Phase::Release(release) => {
                if release.version.is_none() {
                    open(&release.round, "read");
                } else {
                    assert!(!self.rounds.contains(release.round), "a release's read left open");
                }
                if release.value_round.is_some() {
                    let barrier = &release.barrier;
                    assert_eq!(*barrier, Barrier::Done, "a release's value before its barrier");
                    assert!(release.version.is_some(), "a release's value before its first round");
                }
                self.check_barrier(session, &release.barrier);
            }
            Phase::Flush { barrier, .. } => self.check_barrier(session, barrier),
            Phase::Rmw(rmw, stage) => {
                self.check_barrier(session, &rmw.barrier);
                assert!(
                    rmw.op.is_rmw(),
                    "session {session} runs a read-modify-write of a {}",
                    rmw.op.name()
                );
                assert!(rmw.id < self.next_acquire, "an acquire id not given out");
                self.check_rmw(session, rmw.op.key(), rmw.rid, rmw.ballot, stage);
            }
            Phase::SyncWait(wait) => open(&wait.round(), "sync-query"),
            Phase::Refused(_) => panic!("session {session} keeps a refused operation"),
        }
    }

    fn check_barrier(&self, session: u64, barrier: &Barrier) {
        if let Barrier::Slow { round: Some(round), delinquent } = barrier {
            let r = self.rounds.get(*round);
            let ok = r.is_some_and(|r| r.session == session && r.msg.kind() == "slow-release");
            assert!(ok, "session {session}'s slow release {round} is not open");
            assert!(!delinquent.is_empty(), "a slow release names nobody");
        }
    }

    /// A read-modify-write's stage: its round is open and of the right kind, its ballot
    /// is this node's own, its record well formed.
    fn check_rmw(&self, session: u64, key: &Key, rid: RmwId, ballot: Ballot, stage: &RmwStage) {
        let holds_key = self.rmw_keys.get(key) == Some(&session);
        let round_of = |round: &RoundId, kind: &str| {
            let r = self.rounds.get(*round);
            assert!(
                r.is_some_and(|r| r.session == session && r.msg.kind() == kind),
                "session {session}'s read-modify-write waits on round {round}, not its open {kind}"
            );
            r.expect("checked")
        };
        let record_ok = |record: &RmwRecord, mine: bool| {
            assert!(record.well_formed(), "a record not right after its base");
            assert!(
                !mine || record.id == rid,
                "session {session} finishes another's record as its own"
            );
        };
        if !matches!(stage, RmwStage::Queued) {
            assert!(holds_key, "session {session} runs a read-modify-write without its key");
            assert_eq!(ballot.proposer, self.writer, "a ballot of another node");
            assert!(ballot.round <= self.last_round, "a ballot above the highest proposed");
        }
        match stage {
            RmwStage::Queued | RmwStage::Backoff { .. } => {}
            RmwStage::Proposing { round } => {
                let r = round_of(round, "propose");
                let ok = matches!(&r.msg, Message::Propose { ballot: b, rmw, .. } if *b == ballot && *rmw == rid);
                assert!(ok, "session {session} proposes under another ballot or id");
            }
            RmwStage::Accepting(Sent { round, record, mine }) => {
                let r = round_of(round, "accept");
                let ok = matches!(&r.msg, Message::Accept { ballot: b, record: sent, .. } if *b == ballot && sent == record);
                assert!(ok, "session {session} accepts another record or ballot");
                record_ok(record, *mine);
            }
            RmwStage::WriteBack { round, .. } => {
                round_of(round, "write");
            }
            RmwStage::Committing(Sent { round, record, mine }) => {
                // Its own commit is tracked, and gone once every node acknowledged it.
                if !*mine || self.rounds.contains(*round) {
                    round_of(round, "write");
                }
                record_ok(record, *mine);
            }
            RmwStage::Ready { record } => record_ok(record, true),
        }
    }
}

/// Whether `phase` waits on round `id` (a quorum read or write, its barrier's slow
/// release, a read-modify-write's stage).
fn waits_on(phase: &Phase, id: RoundId) -> bool {
    let slow =
        |barrier: &Barrier| matches!(barrier, Barrier::Slow { round: Some(r), .. } if *r == id);
    match phase {
        Phase::SlowRead { round, .. } | Phase::SlowWrite { round, .. } => *round == id,
        Phase::Acquire(acquire) => match &acquire.write_back {
            None => acquire.round == id,
            Some((wb, _)) => *wb == id,
        },
        Phase::Release(release) => {
            (release.version.is_none() && release.round == id) || slow(&release.barrier)
        }
        Phase::Flush { barrier, .. } => slow(barrier),
        Phase::Rmw(rmw, stage) => {
            let staged = match stage {
                RmwStage::Proposing { round } | RmwStage::WriteBack { round, .. } => *round == id,
                RmwStage::Accepting(sent) | RmwStage::Committing(sent) => sent.round == id,
                RmwStage::Queued | RmwStage::Backoff { .. } | RmwStage::Ready { .. } => false,
            };
            staged || slow(&rmw.barrier)
        }
        Phase::SyncWait(wait) => wait.waits_on(id),
        Phase::Refused(_) => false,
    }
}
