//! Rounds: a broadcast waiting for answers. A round is sent to every member, this node
//! first (answered at once), and records one reply per member; it is sent again to the
//! members that have not answered at the retransmission pace (writes waiting for every
//! node back off, up to 64 times the pace). Its session reads it (a quorum's reads, a
//! quorum's acknowledgements) and closes it; a tracked write closes itself once every
//! node acknowledged it.
//!
//! The timers are indexed: [`Rounds`] keeps `(next_send, round)` for every round still
//! waiting for an answer, so a tick visits only the rounds due, and the next wake-up is
//! the first entry of this index, of the waiting operations' index (`sessions.rs`) and of
//! the rejoin's. The tracked writes sent again are indexed by the members they still wait
//! for, so that a member's answer hurries only those (`Rounds::hurry`). `check_index` (run
//! by `check_invariants`) holds both indexes to the rounds.

use super::{Flags, Found, KiteEngine, Message, NodeId, Origin, RoundId, Stamp};
use super::{RmwId, RmwOutcome, Value};
use crate::time::{Span, Time};
use keel_types::Key;
use std::collections::{BTreeMap, BTreeSet};

/// A write waiting for every node's acknowledgement is sent again after the
/// retransmission pace times 2^min(sends, this): up to 64 times the pace.
const WRITE_BACKOFF_SHIFT_MAX: u32 = 6;

/// A broadcast waiting for answers.
#[derive(Clone, Debug)]
pub(super) struct Round {
    pub(super) msg: Message,
    /// Members (by index) that have not answered.
    pub(super) pending: u64,
    pub(super) replies: Vec<(NodeId, Message)>,
    /// The members (by index) whose replies `replies` holds.
    pub(super) replies_bits: u64,
    pub(super) next_send: Time,
    pub(super) sends: u32,
    pub(super) session: u64,
    /// A write the session's next release needs acknowledged by every node.
    pub(super) tracked: bool,
}

/// The open rounds, with their resends indexed by time.
#[derive(Debug)]
pub(super) struct Rounds {
    open: BTreeMap<RoundId, Round>,
    /// `(next_send, id)` of every open round with a member yet to answer.
    resends: BTreeSet<(Time, RoundId)>,
    /// `(member index, id)` of every tracked write sent more than once, per member it
    /// still waits for: the writes a member's answer may hurry.
    backed_off: BTreeSet<(usize, RoundId)>,
    /// The id the next round takes.
    next: RoundId,
}

/// A quorum's read replies: the newest value (with its stamp and maker), how many
/// replies had that stamp, and the replicas that deemed this node delinquent.
pub(super) struct QuorumRead {
    pub(super) found: Found,
    /// The members (by index) whose replies had the newest stamp.
    pub(super) seen_by: u64,
    pub(super) flagged: Flags,
}

impl Rounds {
    /// No round open; the first takes `first`.
    pub(super) fn new(first: RoundId) -> Rounds {
        Rounds {
            open: BTreeMap::new(),
            resends: BTreeSet::new(),
            backed_off: BTreeSet::new(),
            next: first,
        }
    }

    pub(super) fn get(&self, id: RoundId) -> Option<&Round> {
        self.open.get(&id)
    }

    pub(super) fn contains(&self, id: RoundId) -> bool {
        self.open.contains_key(&id)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// The open rounds, by id.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&RoundId, &Round)> {
        self.open.iter()
    }

    /// The id of the next round.
    fn next_id(&mut self) -> RoundId {
        let id = self.next;
        self.next = id.checked_add(1).expect("round ids run out after 2^62 rounds");
        assert!(!self.open.contains_key(&id), "round id {id} reused");
        id
    }

    /// Opens round `id`.
    fn insert(&mut self, id: RoundId, round: Round) {
        assert!(id < self.next, "round {id} not given out");
        if round.pending != 0 {
            self.resends.insert((round.next_send, id));
        }
        index_backoff(&mut self.backed_off, id, &round);
        let old = self.open.insert(id, round);
        assert!(old.is_none(), "round {id} opened twice");
    }

    /// Closes round `id` (nothing if it is closed already).
    pub(super) fn remove(&mut self, id: RoundId) -> Option<Round> {
        let round = self.open.remove(&id)?;
        let indexed = self.resends.remove(&(round.next_send, id));
        assert_eq!(indexed, round.pending != 0, "round {id}'s resend index");
        unindex_backoff(&mut self.backed_off, id, &round);
        Some(round)
    }

    /// Records `from`'s reply (member `index`) in round `id`: its session, whether a
    /// tracked write was acknowledged by every node (and closed), and whether the round
    /// was a tracked write sent again; `None` if the round is closed, `from` answered
    /// already, or the reply is of another kind.
    fn record(
        &mut self,
        id: RoundId,
        index: usize,
        from: NodeId,
        reply: Message,
    ) -> Option<(u64, bool, bool)> {
        let r = self.open.get_mut(&id)?;
        let bit = 1u64 << index;
        if r.pending & bit == 0 || !reply_matches(&r.msg, &reply) {
            return None;
        }
        let resent_write = r.tracked && r.sends > 1;
        if resent_write {
            let indexed = self.backed_off.remove(&(index, id));
            assert!(indexed, "round {id} backed off unindexed for member {index}");
        }
        r.pending &= !bit;
        r.replies.push((from, reply));
        r.replies_bits |= bit;
        assert!(r.replies.len() <= super::MEMBERS_MAX, "round {id}: more replies than members");
        let (session, answered) = (r.session, r.pending == 0);
        if answered {
            let indexed = self.resends.remove(&(r.next_send, id));
            assert!(indexed, "round {id} waited unindexed");
        }
        let settled = answered && r.tracked;
        if settled {
            self.open.remove(&id);
        }
        Some((session, settled, resent_write))
    }

    /// Member `index` answered a write sent to it again: it is reachable now, so the other
    /// tracked writes still waiting for it, backed off while it was not, are due at `now`
    /// with their back-off started over. Answers how many were hurried. (Without this, a
    /// node that came back while several writes had backed off to the cap took one write
    /// per cap interval through a link that passes one at a time: membership seed
    /// 740001403 of the simulator, a completed write 4.5 s late at two nodes.) It visits
    /// only the writes the back-off index holds for that member.
    fn hurry(&mut self, index: usize, now: Time) -> u64 {
        let waiting: Vec<RoundId> =
            self.backed_off.range((index, 0)..=(index, RoundId::MAX)).map(|&(_, id)| id).collect();
        let mut hurried = 0;
        for id in waiting {
            let round = self.open.get_mut(&id).expect("a backed-off write is open");
            let waits = round.tracked && round.sends > 1 && round.pending & (1u64 << index) != 0;
            assert!(waits, "round {id} indexed as backed off for member {index}");
            if round.next_send <= now {
                continue; // due already
            }
            let indexed = self.resends.remove(&(round.next_send, id));
            assert!(indexed, "round {id} waited unindexed");
            unindex_backoff(&mut self.backed_off, id, round);
            round.next_send = now;
            round.sends = 1;
            self.resends.insert((now, id));
            hurried += 1;
        }
        hurried
    }

    /// The rounds due to be sent again at `now`, by id.
    fn due(&self, now: Time) -> Vec<RoundId> {
        let mut due: Vec<RoundId> =
            self.resends.range(..=(now, RoundId::MAX)).map(|&(_, id)| id).collect();
        due.sort_unstable();
        due
    }

    /// Round `id` sent again at `now`: whom to, and what.
    fn resend(&mut self, id: RoundId, now: Time, pace: Span) -> (u64, Message) {
        let r = self.open.get_mut(&id).expect("a due round is open");
        assert!(r.pending != 0 && r.next_send <= now, "round {id} is not due");
        let indexed = self.resends.remove(&(r.next_send, id));
        assert!(indexed, "round {id} due unindexed");
        unindex_backoff(&mut self.backed_off, id, r);
        r.sends += 1;
        index_backoff(&mut self.backed_off, id, r);
        // Quorum rounds resend at a fixed pace; writes waiting for every node back off (a
        // node down for long costs little), up to 2^WRITE_BACKOFF_SHIFT_MAX times the pace.
        let factor = if r.tracked { 1u64 << r.sends.min(WRITE_BACKOFF_SHIFT_MAX) } else { 1 };
        r.next_send = now + Span(pace.0.saturating_mul(factor));
        assert!(r.next_send > now, "a resend due at once");
        self.resends.insert((r.next_send, id));
        (r.pending, r.msg.clone())
    }

    /// Takes the replies of member `index` (`node`) out of every open round, which then
    /// ask it again at `now`; answers how many rounds held one. (Counted, but left in
    /// place, when `unfenced`: the negative control.)
    pub(super) fn fence(&mut self, index: usize, node: NodeId, now: Time, unfenced: bool) -> u64 {
        let bit = 1u64 << index;
        let mut fenced = 0;
        for (&id, round) in self.open.iter_mut() {
            let counted = round.replies.iter().filter(|(from, _)| *from == node).count();
            // A member answers a round at most once, and its bit is pending until it has.
            assert!(counted <= 1, "{counted} replies of {node:?} in one round");
            // (A node that was not a voter when the round opened is neither asked nor
            // answered: its bit is clear with no reply.)
            assert!(counted == 0 || round.pending & bit == 0, "pending bit of {node:?}");
            assert_eq!(counted == 1, round.replies_bits & bit != 0, "replies mask of {node:?}");
            if counted == 0 {
                continue;
            }
            fenced += 1;
            if unfenced {
                continue;
            }
            if round.pending != 0 {
                let indexed = self.resends.remove(&(round.next_send, id));
                assert!(indexed, "round {id} waited unindexed");
            }
            unindex_backoff(&mut self.backed_off, id, round);
            round.replies.retain(|(from, _)| *from != node);
            round.replies_bits &= !bit;
            round.pending |= bit;
            index_backoff(&mut self.backed_off, id, round);
            round.next_send = round.next_send.min(now);
            self.resends.insert((round.next_send, id));
        }
        fenced
    }

    /// Forgets every open round's replies: they were counted under a membership just
    /// replaced, and a round counts replies of one membership only (`membership.rs`).
    /// Everyone asked before, and the members of `added` (voters just learned), are asked
    /// again at `now`. Answers the rounds, with their requests.
    /// (Under the negative control, `mixed`, replies stay and only `added` is asked.)
    pub(super) fn ask_again(
        &mut self,
        added: u64,
        now: Time,
        mixed: bool,
    ) -> Vec<(RoundId, Message)> {
        let mut again = Vec::new();
        for (&id, round) in self.open.iter_mut() {
            if mixed {
                let new = added & !round.replies_bits & !round.pending;
                if new != 0 {
                    if round.pending != 0 {
                        let indexed = self.resends.remove(&(round.next_send, id));
                        assert!(indexed, "round {id} waited unindexed");
                    }
                    unindex_backoff(&mut self.backed_off, id, round);
                    round.pending |= new;
                    index_backoff(&mut self.backed_off, id, round);
                    round.next_send = round.next_send.min(now);
                    self.resends.insert((round.next_send, id));
                }
                continue;
            }
            if round.pending != 0 {
                let indexed = self.resends.remove(&(round.next_send, id));
                assert!(indexed, "round {id} waited unindexed");
            }
            unindex_backoff(&mut self.backed_off, id, round);
            round.pending |= round.replies_bits | added;
            index_backoff(&mut self.backed_off, id, round);
            round.replies.clear();
            round.replies_bits = 0;
            round.next_send = round.next_send.min(now);
            self.resends.insert((round.next_send, id));
            again.push((id, round.msg.clone()));
        }
        again
    }

    /// When the first round is due to be sent again.
    pub(super) fn next_resend(&self) -> Option<Time> {
        self.resends.first().map(|&(at, _)| at)
    }

    /// Panics unless the resend index holds exactly the open rounds with a member yet to
    /// answer, at their times, the back-off index exactly the tracked writes sent again
    /// by the members they wait for, and every round's id was given out.
    pub(super) fn check_index(&self) {
        let waiting = self.open.values().filter(|r| r.pending != 0).count();
        assert_eq!(self.resends.len(), waiting, "the resend index holds other rounds");
        let mut backed_off = BTreeSet::new();
        for (&id, round) in &self.open {
            index_backoff(&mut backed_off, id, round);
        }
        assert!(backed_off == self.backed_off, "the back-off index holds other rounds");
        for (&id, round) in &self.open {
            assert!(id < self.next, "round {id} not given out");
            if round.pending != 0 {
                let indexed = self.resends.contains(&(round.next_send, id));
                assert!(indexed, "round {id} waits unindexed at {:?}", round.next_send);
            }
        }
    }
}

impl KiteEngine {
    /// Sends `msg` (its round field filled in) to every member, this node first (handled
    /// at once), and opens a round for the answers.
    pub(super) fn broadcast(&mut self, session: u64, msg: Message, tracked: bool) -> RoundId {
        let voting = self.voting_mask();
        self.open_round(session, msg, tracked, voting)
    }

    /// Sends `msg` to the members of `to` (this node first, if among them) and opens a
    /// round for the answers.
    pub(super) fn broadcast_to(&mut self, session: u64, msg: Message, to: u64) -> RoundId {
        self.open_round(session, msg, false, to)
    }

    fn open_round(&mut self, session: u64, mut msg: Message, tracked: bool, to: u64) -> RoundId {
        assert!(self.rejoin.is_none(), "a round opened while rejoining");
        assert!(self.sessions.contains_key(&session), "a round of a session not open");
        assert!(!tracked || matches!(msg, Message::Write { .. }), "a tracked round not a write");
        let id = self.rounds.next_id();
        set_round(&mut msg, id);
        let me = self.config.node;
        let mine = self.index_of(me).map_or(0, |i| 1u64 << i);
        let round = Round {
            msg: msg.clone(),
            pending: to | mine,
            replies: Vec::new(),
            replies_bits: 0,
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
        if let Some(reply) = self.serve(me, msg.clone()) {
            self.record_reply(me, reply);
        }
        for peer in self.members_of(to) {
            if peer != me {
                self.out.messages.push((peer, msg.clone()));
            }
        }
        id
    }

    /// A write applied here and sent to all, tracked for the session's next release.
    pub(super) fn write_tracked(
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

    /// Forgets the session's tracked writes (its barrier settled them).
    /// A round still short of a quorum stays: it may be a read-modify-write's own commit,
    /// tracked after the barrier began, whose completion waits for a quorum
    /// ([`KiteEngine::written`] counts a missing round as written). Seed 93508577 of the
    /// membership scenario: a failed CAS's commit, removed here when its own barrier
    /// ended, completed while only its proposer held the value it read.
    pub(super) fn untrack_all(&mut self, session: u64) {
        let Some(s) = self.sessions.get_mut(&session) else { return };
        let tracked = std::mem::take(&mut s.tracked);
        let mut short = Vec::new();
        for round in tracked {
            match self.rounds.get(round) {
                Some(r) if !self.is_quorum(r.replies_bits) => short.push(round),
                _ => {
                    self.rounds.remove(round);
                }
            }
        }
        if let Some(s) = self.sessions.get_mut(&session) {
            s.tracked = short;
        }
    }

    pub(super) fn close(&mut self, round: RoundId) {
        self.rounds.remove(round);
    }

    /// Whether a write's round has a quorum's acknowledgements. A tracked round is
    /// removed once every node acknowledged it, so a missing round counts as written.
    pub(super) fn written(&self, round: RoundId) -> bool {
        let unsafe_done = self.config.unsafe_complete_without_quorum;
        unsafe_done || self.rounds.get(round).is_none_or(|r| self.is_quorum(r.replies_bits))
    }

    /// Whether a quorum acknowledged `round`, still open.
    pub(super) fn acked_by_quorum(&self, round: RoundId) -> bool {
        self.rounds.get(round).is_some_and(|r| self.is_quorum(r.replies_bits))
    }

    /// `session`'s open round `round`, if it is open.
    fn round_of(&self, session: u64, round: RoundId) -> Option<&super::Round> {
        let r = self.rounds.get(round)?;
        assert_eq!(r.session, session, "session {session} reads round {round} of another");
        Some(r)
    }

    /// A quorum's acknowledgements, with the replicas that deemed this node delinquent.
    pub(super) fn quorum_acks(&self, session: u64, round: RoundId) -> Option<Flags> {
        let r = self.round_of(session, round)?;
        if !self.is_quorum(r.replies_bits) {
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
    pub(super) fn quorum_read(&self, session: u64, round: RoundId) -> Option<QuorumRead> {
        let r = self.round_of(session, round)?;
        if !self.is_quorum(r.replies_bits) {
            return None;
        }
        let mut best = Found { value: None, stamp: Stamp::ZERO, made_by: None };
        let mut flagged = Flags::new();
        for (from, m) in &r.replies {
            if let Message::ReadReply { value, stamp, delinquent, made_by, .. } = m {
                if let Some(gen) = delinquent {
                    flagged.insert(*from, *gen);
                }
                if *stamp > best.stamp || (*stamp == best.stamp && best.made_by.is_none()) {
                    best = Found { value: value.clone(), stamp: *stamp, made_by: made_by.clone() };
                }
            }
        }
        let newest =
            |m: &Message| matches!(m, Message::ReadReply { stamp, .. } if *stamp == best.stamp);
        let seen_by = r
            .replies
            .iter()
            .filter(|(_, m)| newest(m))
            .filter_map(|(from, _)| self.index_of(*from))
            .fold(0u64, |mask, i| mask | 1 << i);
        assert!(seen_by != 0 && seen_by & !r.replies_bits == 0, "round {round}: the newest unseen");
        Some(QuorumRead { found: best, seen_by, flagged })
    }

    /// Records a reply in its round; answers the round's session.
    pub(super) fn record_reply(&mut self, from: NodeId, reply: Message) -> Option<u64> {
        let round_id = reply_round(&reply)?;
        let index = self.index_of(from)?;
        let (session, settled, resent_write) = self.rounds.record(round_id, index, from, reply)?;
        if resent_write {
            let now = self.now;
            self.counters.writes_hurried += self.rounds.hurry(index, now);
        }
        if settled {
            // Acknowledged by every node: the next release need not wait for it.
            if let Some(s) = self.sessions.get_mut(&session) {
                s.tracked.retain(|&t| t != round_id);
            }
        }
        Some(session)
    }

    /// Sends again the rounds due, to the members that have not answered.
    pub(super) fn resend_due(&mut self) {
        let (now, pace) = (self.now, self.config.retransmit);
        let sends: Vec<(u64, Message)> =
            self.rounds.due(now).into_iter().map(|id| self.rounds.resend(id, now, pace)).collect();
        for (pending, msg) in sends {
            for peer in self.members_of(pending) {
                if peer != self.config.node {
                    self.counters.retransmits += 1;
                    self.out.messages.push((peer, msg.clone()));
                }
            }
        }
    }

    /// The next time a step is due: the first resend, operation timer or rejoin timer.
    pub(super) fn next_wake(&self) -> Option<Time> {
        let wait = self.waits.first().map(|&(at, _)| at);
        [self.rejoin_wake(), self.rounds.next_resend(), wait].into_iter().flatten().min()
    }
}

/// Indexes `round` (`id`) in `backed_off` by each member it waits for, if it is a tracked
/// write sent more than once.
fn index_backoff(backed_off: &mut BTreeSet<(usize, RoundId)>, id: RoundId, round: &Round) {
    if round.tracked && round.sends > 1 {
        backed_off.extend(members(round.pending).map(|i| (i, id)));
    }
}

/// Takes `round` (`id`) out of `backed_off` (its entries as `index_backoff` made them).
fn unindex_backoff(backed_off: &mut BTreeSet<(usize, RoundId)>, id: RoundId, round: &Round) {
    if round.tracked && round.sends > 1 {
        for i in members(round.pending) {
            let indexed = backed_off.remove(&(i, id));
            assert!(indexed, "round {id} backed off unindexed for member {i}");
        }
    }
}

/// The member indexes set in `mask`.
fn members(mask: u64) -> impl Iterator<Item = usize> {
    (0..64).filter(move |i| mask & (1u64 << i) != 0)
}

fn set_round(msg: &mut Message, id: RoundId) {
    match msg {
        Message::Write { round, .. }
        | Message::Read { round, .. }
        | Message::SlowRelease { round, .. }
        | Message::Propose { round, .. }
        | Message::Accept { round, .. }
        | Message::SyncQuery { round, .. } => *round = id,
        _ => unreachable!("only requests open rounds"),
    }
}

/// The round a reply answers (`None` for requests).
fn reply_round(msg: &Message) -> Option<RoundId> {
    match msg {
        Message::WriteAck { round, .. }
        | Message::ReadReply { round, .. }
        | Message::SlowReleaseAck { round, .. }
        | Message::Promise { round, .. }
        | Message::Accepted { round, .. }
        | Message::Synced { round, .. } => Some(*round),
        _ => None,
    }
}

/// Who sent a reply (`None` for requests).
pub(super) fn reply_origin(msg: &Message) -> Option<&Origin> {
    match msg {
        Message::WriteAck { by, .. }
        | Message::ReadReply { by, .. }
        | Message::SlowReleaseAck { by, .. }
        | Message::Promise { by, .. }
        | Message::Accepted { by, .. }
        | Message::Synced { by, .. } => Some(by),
        _ => None,
    }
}

/// Whether `reply` is the kind of answer `request` gets (a forged reply of another kind
/// is ignored).
pub(super) fn reply_matches(request: &Message, reply: &Message) -> bool {
    matches!(
        (request, reply),
        (Message::Write { .. }, Message::WriteAck { .. })
            | (Message::Read { .. }, Message::ReadReply { .. })
            | (Message::SlowRelease { .. }, Message::SlowReleaseAck { .. })
            | (Message::Propose { .. }, Message::Promise { .. })
            | (Message::Accept { .. }, Message::Accepted { .. })
            | (Message::SyncQuery { .. }, Message::Synced { .. })
    )
}
