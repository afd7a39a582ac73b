//! Agreeing on a change of the data centers: a removal, or the return of a removed data
//! center (`docs/geo.md`, *Removing a data center*, *Taking a data center back*). Each
//! change names the epoch it makes for its data center ([`Change`]), one above the one
//! the acceptor knows, and an acceptor promises one change at a time: changes are made
//! one at a time, each from the state the one before left. A return adds no failure, so
//! only removals are counted against `f`; the rounds below are the same for both.
//!
//! A removal declares a failure, and the keyspace tolerates `f`. One node can refuse a
//! removal beyond `f` that it asks itself, but two removals asked at once at two nodes
//! each pass their own node's count. So the node asked proposes the removal to every
//! data center's **acceptor** (its replica of partition 0), in two rounds:
//!
//! - **Promise.** An acceptor promises a proposal when the data centers removed, failed
//!   for some partition or committed (below), as it counts them, the proposed one
//!   included, are at most `f`, and it holds no promise for the removal of another data
//!   center. It reports what it counts.
//! - **Commit.** Once promises from a majority of the data centers came in, and what
//!   they report, with the proposer's own count and the proposed data center, is at most
//!   `f`, the proposer sends `Commit` to the acceptors whose promises it counted, and to
//!   no other. An acceptor records each proposal's vote: *promised*, then *committed* or
//!   *aborted*, and the first of those two it records stands. A `Commit` at an acceptor
//!   that does not hold the promise records it aborted. A committed vote releases the
//!   promise, but the data center counts as removed in the acceptor's later counts until
//!   the outcome is known.
//! - **Made** once a majority of the data centers' acceptors recorded the commit: the
//!   proposer learns it from their votes, and so may anyone who asks them.
//!
//! Why two removals made stay within `f`: their commit majorities share an acceptor,
//! which held their promises one after the other (a promise excludes another data
//! center's, and is released by the commit or the abort). So the later promise there
//! reported the earlier commit, and the later proposal's count held it, since commits go
//! only to the promisers counted. Each proposal's promises all come before its commits,
//! so "made after the other's commit was recorded" orders the removals made: the last
//! one's count held every other, and its proposer checked it against `f`.
//!
//! **No promise is held for ever.** A proposer that fails between its promises and its
//! decision, or whose own data center is removed meanwhile, never withdraws them. An
//! acceptor holding a vote undecided (promised, or committed with the outcome unknown)
//! for [`ASK_AFTER_SUSPECTS`] suspicion time-outs asks every acceptor to abort it. Each
//! records it aborted unless it recorded the commit, and answers its vote. A majority
//! aborted means the proposal can never be made, and the vote is released; a majority
//! committed means it was made, and the asker learns the removal. (While neither is
//! known, say an acceptor that recorded the commit failed with its data center, a
//! committed vote keeps counting the data center removed, and asks again.)

use super::super::types::{Body, Change, ChangeAnswer, ChangeRefusal, GeoResult};
use super::GeoEngine;
use crate::engine::RequestTag;
use crate::time::Time;
use keel_types::{KeelError, NodeId};
use std::collections::{BTreeMap, BTreeSet};

/// An acceptor asks every acceptor to abort a vote it held undecided for this many
/// suspicion time-outs (a live proposer decides or withdraws within two), and asks again
/// as often while the outcome is unknown.
pub(crate) const ASK_AFTER_SUSPECTS: u64 = 3;

/// The votes an acceptor keeps, at most. Removals are an operator's requests, so this
/// is reached only by a flood of them; past it, the oldest decided votes go, and their
/// proposer's lower-numbered proposals count as aborted (`Agreement::floors`).
pub(crate) const VOTES_MAX: usize = 256;

/// A proposal: its proposer and the number it gave it.
pub(crate) type Ballot = (NodeId, u64);

/// A change this node proposes.
#[derive(Debug)]
pub(crate) struct Proposal {
    /// The change.
    pub change: Change,
    /// The requests to answer.
    pub tags: Vec<RequestTag>,
    /// The acceptors asked.
    pub asked: Vec<NodeId>,
    /// Per data center whose acceptor promised: the data centers it knows removed (or
    /// committed) and those it counts failed.
    pub promised: BTreeMap<u32, Vec<u32>>,
    /// Once decided: the commit round.
    pub commit: Option<CommitRound>,
    /// When it is given up if not made (each round has its own).
    pub deadline: Time,
}

/// A proposal's commit round at its proposer: by data center, the acceptors sent the
/// commit (the promisers counted) and what they recorded.
#[derive(Debug, Default)]
pub(crate) struct CommitRound {
    pub counted: BTreeSet<u32>,
    pub committed: BTreeSet<u32>,
    pub aborted: BTreeSet<u32>,
}

/// An acceptor's vote on one proposal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Vote {
    /// Promised: no other change is promised meanwhile.
    Promised,
    /// Committed, the outcome not yet known: a removal's data center counts as removed.
    Committed,
    /// Aborted: the proposal is never committed here.
    Aborted,
    /// Committed here, but a majority recorded it aborted: never made.
    Abandoned,
}

impl Vote {
    /// Whether the acceptor still waits to learn the outcome (and asks for it in time).
    fn undecided(self) -> bool {
        matches!(self, Vote::Promised | Vote::Committed)
    }

    /// What the acceptor answers of it.
    fn answer(self) -> ChangeAnswer {
        match self {
            Vote::Promised | Vote::Aborted => ChangeAnswer::Aborted,
            Vote::Committed | Vote::Abandoned => ChangeAnswer::Committed,
        }
    }
}

/// A vote an acceptor recorded.
#[derive(Debug)]
pub(crate) struct Recorded {
    /// The change proposed.
    pub change: Change,
    pub vote: Vote,
    /// When the acceptor asks every acceptor to abort it, while it is undecided.
    pub ask_at: Time,
    /// The answers to those asks, by the data center of the acceptor answering.
    pub committed: BTreeSet<u32>,
    pub aborted: BTreeSet<u32>,
}

/// The agreement's state: an acceptor's votes, a proposer's proposals.
#[derive(Debug, Default)]
pub(crate) struct Agreement {
    /// Acceptor: its votes, by proposal.
    pub votes: BTreeMap<Ballot, Recorded>,
    /// Acceptor: the undecided votes, by when it asks about them.
    pub asks: BTreeSet<(Time, Ballot)>,
    /// Acceptor: per proposer, the number below which a proposal it holds no vote on is
    /// aborted (raised when a vote is dropped past [`VOTES_MAX`]).
    pub floors: BTreeMap<NodeId, u64>,
    /// Proposer: its proposals, by number.
    pub proposals: BTreeMap<u64, Proposal>,
    /// The proposals, by deadline.
    pub deadlines: BTreeSet<(Time, u64)>,
    /// Numbers proposals.
    pub next_id: u64,
}

impl Agreement {
    /// The change the acceptor promised, if it holds a promise.
    pub(crate) fn promised(&self) -> Option<Change> {
        self.votes.values().find(|r| r.vote == Vote::Promised).map(|r| r.change)
    }

    /// The data centers whose removal the acceptor committed, the outcome unknown.
    pub(crate) fn committed_dcs(&self) -> Vec<u32> {
        let votes = self.votes.values();
        let dcs = votes.filter(|r| r.vote == Vote::Committed && r.change.removes());
        dcs.map(|r| r.change.dc).collect::<BTreeSet<u32>>().into_iter().collect()
    }

    /// The vote held on `ballot`: recorded, or aborted below its proposer's floor.
    fn vote(&self, ballot: Ballot) -> Option<Vote> {
        match self.votes.get(&ballot) {
            Some(r) => Some(r.vote),
            None if self.floors.get(&ballot.0).is_some_and(|&f| ballot.1 < f) => {
                Some(Vote::Aborted)
            }
            None => None,
        }
    }

    /// Records `vote` on `ballot` (of `change`), indexing when to ask about it.
    fn record(&mut self, ballot: Ballot, change: Change, vote: Vote, ask_at: Time) {
        // The answers to its asks so far stay: each is a vote recorded for good.
        let old = self.votes.remove(&ballot);
        if let Some(old) = &old {
            self.asks.remove(&(old.ask_at, ballot));
        }
        let (committed, aborted) = old.map(|o| (o.committed, o.aborted)).unwrap_or_default();
        let recorded = Recorded { change, vote, ask_at, committed, aborted };
        if vote.undecided() {
            self.asks.insert((ask_at, ballot));
        }
        self.votes.insert(ballot, recorded);
        self.evict();
    }

    /// Past [`VOTES_MAX`], drops decided votes, lowest first, raising their proposers'
    /// floors: a proposal below a floor counts as aborted, which is always safe.
    fn evict(&mut self) {
        while self.votes.len() > VOTES_MAX {
            let decided = self.votes.iter().find(|(_, r)| !r.vote.undecided()).map(|(&b, _)| b);
            let Some(ballot) = decided else { return };
            self.votes.remove(&ballot);
            let floor = self.floors.entry(ballot.0).or_default();
            *floor = (*floor).max(ballot.1 + 1);
        }
    }

    /// Forgets every vote on a change of `change`'s data center up to its epoch (it was
    /// made).
    fn forget_made(&mut self, change: Change) {
        let made = |r: &Recorded| r.change.dc == change.dc && r.change.epoch <= change.epoch;
        let ballots: Vec<Ballot> =
            self.votes.iter().filter(|(_, r)| made(r)).map(|(&b, _)| b).collect();
        for ballot in ballots {
            let r = self.votes.remove(&ballot).expect("listed");
            self.asks.remove(&(r.ask_at, ballot));
        }
    }
}

impl GeoEngine {
    /// Proposes `change` (the request `tag` passed this node's own checks), or joins this
    /// node's proposal of it already out.
    pub(crate) fn propose_change(&mut self, tag: RequestTag, change: Change) {
        if self.config.unsafe_unagreed_removal && change.removes() {
            self.learn_change(change);
            return self.reply(tag, Ok(GeoResult::Synced));
        }
        let agreement = &mut self.agreement;
        if let Some(p) = agreement.proposals.values_mut().find(|p| p.change == change) {
            p.tags.push(tag);
            return;
        }
        let id = agreement.next_id;
        agreement.next_id += 1;
        let deadline = self.round_deadline();
        let asked = self.acceptors();
        if asked.len() < self.majority() {
            let why = "too few data centers remain to agree on a change".to_string();
            return self.reply(tag, Err(KeelError::Unavailable(why)));
        }
        let proposal = Proposal {
            change,
            tags: vec![tag],
            asked: asked.clone(),
            promised: BTreeMap::new(),
            commit: None,
            deadline,
        };
        self.agreement.proposals.insert(id, proposal);
        self.agreement.deadlines.insert((deadline, id));
        self.counters.removals_proposed += 1;
        for to in asked {
            self.send(to, Body::ChangePropose { id, change });
        }
    }

    /// The acceptors of the data centers not removed.
    fn acceptors(&self) -> Vec<NodeId> {
        (0..self.dcs as u32)
            .filter(|&i| !self.removed[i as usize])
            .map(|i| self.replica(i, 0))
            .collect()
    }

    /// A majority of the keyspace's data centers (removed ones included: a removal
    /// changes no quorum).
    fn majority(&self) -> usize {
        self.dcs / 2 + 1
    }

    /// When a round begun now is given up.
    fn round_deadline(&self) -> Time {
        Time(self.now.0.saturating_add(2 * self.config.suspect_after.0))
    }

    /// When an acceptor asks about a vote it recorded now, while undecided.
    fn ask_time(&self) -> Time {
        Time(self.now.0.saturating_add(ASK_AFTER_SUSPECTS * self.config.suspect_after.0))
    }

    /// Whether `change` is made, as this node knows: its data center is at its epoch or
    /// past it.
    pub(crate) fn is_made(&self, change: Change) -> bool {
        self.epochs[change.dc as usize] >= change.epoch
    }

    /// Why this acceptor would not promise `change` it holds no vote on (`None`: it
    /// would): another change promised, the data center at another epoch than the one
    /// below the change's, a removal beyond `f`, a return while another is under way.
    fn change_refusal(&self, change: Change, failed: &[u32]) -> Option<ChangeRefusal> {
        let epoch = self.epochs[change.dc as usize];
        if let Some(other) = self.agreement.promised().filter(|&c| c != change) {
            return Some(ChangeRefusal::Pending { change: other });
        }
        if epoch + 1 != change.epoch {
            return Some(ChangeRefusal::Epoch { epoch });
        }
        if !change.removes() {
            let other = (0..self.dcs as u32).find(|&d| self.returning[d as usize]);
            return other.map(|dc| ChangeRefusal::Returning { dc });
        }
        let mut gone = failed.to_vec();
        gone.extend(self.agreement.committed_dcs());
        let gone = with(gone, change.dc);
        self.beyond_f(&gone).then_some(ChangeRefusal::BeyondF { gone })
    }

    /// `CHANGE_PROPOSE` at an acceptor: promised unless it holds another change's
    /// promise, aborted the proposal, or `change_refusal` says why not. A change made
    /// here already is promised without a vote: its commit is answered `Made`.
    pub(crate) fn change_proposed(&mut self, from: NodeId, id: u64, change: Change) {
        let failed = self.failed_anywhere();
        let mut removed = self.removed_list();
        if !self.is_made(change) {
            let ballot = (from, id);
            let held = self.agreement.vote(ballot);
            let refusal = match held {
                Some(Vote::Promised) => None,
                Some(_) => Some(ChangeRefusal::Aborted),
                None => self.change_refusal(change, &failed),
            };
            if let Some(why) = refusal {
                if matches!(why, ChangeRefusal::Pending { .. }) {
                    self.counters.removals_refused_pending += 1;
                }
                self.send(from, Body::ChangeRefused { id, why });
                return;
            }
            if held.is_none() {
                let ask_at = self.ask_time();
                self.agreement.record(ballot, change, Vote::Promised, ask_at);
                self.counters.removals_promised += 1;
            }
            removed.extend(self.agreement.committed_dcs());
        }
        self.send(from, Body::ChangePromised { id, removed, failed });
    }

    /// `CHANGE_PROMISED` at the proposer: once a majority of the data centers promised,
    /// the change is committed (a removal: if the count they report stays within `f`). A
    /// promise that comes after is not counted: it is withdrawn.
    pub(crate) fn change_promised(
        &mut self,
        from: NodeId,
        id: u64,
        removed: Vec<u32>,
        failed: Vec<u32>,
    ) {
        let Some(acceptor) = self.member(from) else { return };
        let majority = self.majority();
        let Some(proposal) = self.agreement.proposals.get_mut(&id) else { return };
        let change = proposal.change;
        if proposal.commit.is_some() {
            self.send(from, Body::ChangeWithdrawn { id, change });
            return;
        }
        let mut seen = removed;
        seen.extend(failed);
        proposal.promised.insert(acceptor.dc, seen);
        if proposal.promised.len() < majority {
            return;
        }
        if change.removes() {
            let mut gone: Vec<u32> = proposal.promised.values().flatten().copied().collect();
            gone.extend(self.failed_anywhere());
            let gone = with(gone, change.dc);
            if self.beyond_f(&gone) {
                return self.give_up(id, self.beyond_f_refusal(change.dc, &gone));
            }
        }
        self.begin_commit(id);
    }

    /// Sends proposal `id`'s commit to the acceptors whose promises it counted.
    fn begin_commit(&mut self, id: u64) {
        let deadline = self.round_deadline();
        let proposal = self.agreement.proposals.get_mut(&id).expect("looked up");
        let counted: BTreeSet<u32> = proposal.promised.keys().copied().collect();
        let change = proposal.change;
        proposal.commit = Some(CommitRound { counted: counted.clone(), ..Default::default() });
        self.agreement.deadlines.remove(&(proposal.deadline, id));
        proposal.deadline = deadline;
        self.agreement.deadlines.insert((deadline, id));
        self.counters.removals_committing += 1;
        for i in counted {
            let to = self.replica(i, 0);
            self.send(to, Body::ChangeCommit { id, change });
        }
    }

    /// `CHANGE_COMMIT` at an acceptor: recorded committed if it holds the promise, else
    /// aborted; the vote goes back to the proposer.
    pub(crate) fn change_commit(&mut self, from: NodeId, id: u64, change: Change) {
        let vote = if self.is_made(change) {
            ChangeAnswer::Made
        } else {
            let ballot = (from, id);
            let vote = match self.agreement.vote(ballot) {
                Some(Vote::Promised) => Vote::Committed,
                Some(vote) => vote,
                None => Vote::Aborted,
            };
            let ask_at = self.ask_time();
            self.agreement.record(ballot, change, vote, ask_at);
            vote.answer()
        };
        self.send(from, Body::ChangeVote { proposer: from, id, change, vote });
    }

    /// `CHANGE_ABORT` at an acceptor (`from` asks): the proposal is recorded aborted
    /// unless it was committed here; the vote goes back to the asker.
    pub(crate) fn change_abort(&mut self, from: NodeId, proposer: NodeId, id: u64, change: Change) {
        let vote = if self.is_made(change) {
            ChangeAnswer::Made
        } else {
            let ballot = (proposer, id);
            let held = self.agreement.vote(ballot);
            let vote = match held {
                Some(Vote::Committed) if self.config.unsafe_abort_committed => Vote::Aborted,
                Some(Vote::Promised) | None => Vote::Aborted,
                Some(vote) => vote,
            };
            if held.is_some_and(Vote::undecided) && vote == Vote::Aborted {
                self.counters.removals_aborted += 1;
            }
            let ask_at = self.ask_time();
            self.agreement.record(ballot, change, vote, ask_at);
            vote.answer()
        };
        self.send(from, Body::ChangeVote { proposer, id, change, vote });
    }

    /// `CHANGE_VOTE`: an acceptor's vote on a proposal, at its proposer (an answer to the
    /// commit) or at an acceptor that asked about it.
    pub(crate) fn change_vote(
        &mut self,
        from: NodeId,
        proposer: NodeId,
        id: u64,
        change: Change,
        vote: ChangeAnswer,
    ) {
        let Some(acceptor) = self.member(from) else { return };
        if vote == ChangeAnswer::Made {
            return self.learn_change(change);
        }
        if proposer == self.me.node {
            self.commit_vote(id, acceptor.dc, vote);
        }
        self.asked_vote((proposer, id), acceptor.dc, vote);
    }

    /// An acceptor's vote on this node's proposal `id` in its commit round: made at a
    /// majority committed, given up once that can no longer be.
    fn commit_vote(&mut self, id: u64, from_dc: u32, vote: ChangeAnswer) {
        let majority = self.majority();
        let Some(proposal) = self.agreement.proposals.get_mut(&id) else { return };
        let Some(round) = proposal.commit.as_mut().filter(|r| r.counted.contains(&from_dc)) else {
            return;
        };
        match vote {
            ChangeAnswer::Committed => round.committed.insert(from_dc),
            _ => round.aborted.insert(from_dc),
        };
        if round.committed.len() >= majority {
            let proposal = self.forget_proposal(id).expect("looked up");
            self.learn_change(proposal.change);
            for tag in proposal.tags {
                self.reply(tag, Ok(GeoResult::Synced));
            }
        } else if round.counted.len() - round.aborted.len() < majority {
            let aborted: Vec<u32> = round.aborted.iter().copied().collect();
            let why = format!(
                "the acceptors of data centers {aborted:?} (counted from 0) aborted the {} before it was committed (its promises were held too long): ask again",
                describe(proposal.change)
            );
            self.give_up(id, KeelError::Unavailable(why));
        }
    }

    /// An acceptor's answer to this acceptor's ask about `ballot`: a majority committed
    /// means the change was made, a majority aborted that it never will be.
    fn asked_vote(&mut self, ballot: Ballot, from_dc: u32, vote: ChangeAnswer) {
        let majority = self.majority();
        let Some(r) = self.agreement.votes.get_mut(&ballot).filter(|r| r.vote.undecided()) else {
            return;
        };
        match vote {
            ChangeAnswer::Committed => r.committed.insert(from_dc),
            _ => r.aborted.insert(from_dc),
        };
        let change = r.change;
        if r.committed.len() >= majority {
            self.counters.removals_found_made += 1;
            self.learn_change(change);
        } else if r.aborted.len() >= majority {
            self.counters.removals_aborted += 1;
            let vote = if r.vote == Vote::Committed { Vote::Abandoned } else { Vote::Aborted };
            self.agreement.record(ballot, change, vote, Time(0));
        }
    }

    /// Asks every acceptor to abort each vote this acceptor held undecided too long.
    pub(crate) fn ask_about_votes(&mut self) {
        while let Some(&(at, ballot)) = self.agreement.asks.first() {
            if at > self.now {
                break;
            }
            let Recorded { change, vote, .. } = self.agreement.votes[&ballot];
            let again = self.ask_time();
            self.agreement.record(ballot, change, vote, again);
            if self.config.unsafe_promises_held {
                continue;
            }
            self.counters.removal_asks += 1;
            let (proposer, id) = ballot;
            for to in self.acceptors() {
                self.send(to, Body::ChangeAbort { proposer, id, change });
            }
        }
    }

    /// `CHANGE_REFUSED` at the proposer: the proposal is given up at once, and its
    /// promises withdrawn, so that two proposals crossing leave none held (one that went
    /// on while a majority might still promise would hold its promises until it is made
    /// or given up, and a proposer stopped meanwhile never withdraws them).
    pub(crate) fn change_refused(&mut self, from: NodeId, id: u64, why: ChangeRefusal) {
        let Some(p) = self.agreement.proposals.get(&id) else { return };
        if p.commit.is_some() {
            return;
        }
        let change = p.change;
        let what = describe(change);
        let error = match why {
            ChangeRefusal::Pending { change: other } => {
                KeelError::Busy(format!(
                    "{from} holds a promise for the {}, not yet made or withdrawn: that change is under way, or its asker failed before deciding it (the promise is released within a few suspicion time-outs); asking it again finishes it if it can be made",
                    describe(other)
                ))
            }
            ChangeRefusal::BeyondF { gone } => self.beyond_f_refusal(change.dc, &gone),
            ChangeRefusal::Aborted => KeelError::Unavailable(format!(
                "{from} aborted this {what} before it was promised there: ask again"
            )),
            ChangeRefusal::Epoch { epoch } => KeelError::Unavailable(format!(
                "{from} knows data center {} (counted from 0) at epoch {epoch}, not the one before the {what}: a change of it is not known everywhere yet; ask again",
                change.dc
            )),
            ChangeRefusal::Returning { dc } => KeelError::Busy(format!(
                "{from} knows data center {dc} (counted from 0) returning: data centers are taken back one at a time"
            )),
        };
        self.give_up(id, error);
    }

    /// `CHANGE_WITHDRAWN` at an acceptor: the proposal will not commit here; a vote still
    /// promised is recorded aborted.
    pub(crate) fn change_withdrawn(&mut self, from: NodeId, id: u64, change: Change) {
        let ballot = (from, id);
        if self.agreement.vote(ballot) == Some(Vote::Promised) {
            self.agreement.record(ballot, change, Vote::Aborted, Time(0));
        }
    }

    /// Gives proposal `id` up: its promises are withdrawn and its requests refused.
    fn give_up(&mut self, id: u64, error: KeelError) {
        let Some(proposal) = self.forget_proposal(id) else { return };
        self.counters.removals_refused += 1;
        for to in proposal.asked {
            self.send(to, Body::ChangeWithdrawn { id, change: proposal.change });
        }
        for tag in proposal.tags {
            self.reply(tag, Err(error.clone()));
        }
    }

    fn forget_proposal(&mut self, id: u64) -> Option<Proposal> {
        let proposal = self.agreement.proposals.remove(&id)?;
        self.agreement.deadlines.remove(&(proposal.deadline, id));
        Some(proposal)
    }

    /// Gives up the proposals whose round's deadline passed: too few acceptors
    /// promised, or (committing) answered.
    pub(crate) fn expire_proposals(&mut self) {
        while let Some(&(deadline, id)) = self.agreement.deadlines.first() {
            if deadline > self.now {
                break;
            }
            let p = &self.agreement.proposals[&id];
            let error = if p.commit.is_some() {
                KeelError::Timeout
            } else {
                KeelError::Unavailable(format!(
                    "too few data centers answered the {}: a majority must promise it; ask again",
                    describe(p.change)
                ))
            };
            self.give_up(id, error);
        }
    }

    /// `change` was made: every vote on it and on the changes of its data center before
    /// it is forgotten (anything asked of them later is answered `Made`), and this node's
    /// proposals of them are answered.
    pub(crate) fn agreement_learns(&mut self, change: Change) {
        self.agreement.forget_made(change);
        let made = |p: &Proposal| p.change.dc == change.dc && p.change.epoch <= change.epoch;
        let ids: Vec<u64> =
            self.agreement.proposals.iter().filter(|(_, p)| made(p)).map(|(&id, _)| id).collect();
        for id in ids {
            let proposal = self.forget_proposal(id).expect("listed");
            for tag in proposal.tags {
                self.reply(tag, Ok(GeoResult::Synced));
            }
        }
    }

    /// The data centers removed, as this node knows.
    pub(crate) fn removed_list(&self) -> Vec<u32> {
        (0..self.dcs as u32).filter(|&i| self.removed[i as usize]).collect()
    }

    /// Whether `gone`, data centers removed or failed, are more than this keyspace
    /// tolerates (unless the negative control lets it through).
    pub(crate) fn beyond_f(&self, gone: &[u32]) -> bool {
        gone.len() > self.config.f as usize && !self.config.unsafe_remove_beyond_f
    }

    /// The refusal of a removal that would leave `gone` removed or failed.
    pub(crate) fn beyond_f_refusal(&self, dc: u32, gone: &[u32]) -> KeelError {
        let member = self.replica(dc, 0);
        KeelError::InvalidArgument(format!(
            "removing the data center of {member} would leave {} of the {} data centers removed or suspected (numbers {gone:?}, counted from 0 as /status does), more than the {} this keyspace tolerates",
            gone.len(),
            self.dcs,
            self.config.f
        ))
    }

    /// Checks the agreement's own rules.
    pub(crate) fn check_agreement(&self) {
        let a = &self.agreement;
        let majority = self.majority();
        assert!(
            a.votes.is_empty() || self.me.partition == 0,
            "votes at a replica of another partition"
        );
        assert!(a.votes.len() <= VOTES_MAX, "{} votes kept, over {VOTES_MAX}", a.votes.len());
        let promised: BTreeSet<Change> =
            a.votes.values().filter(|r| r.vote == Vote::Promised).map(|r| r.change).collect();
        assert!(promised.len() <= 1, "promises held for {promised:?}");
        let undecided = a.votes.values().filter(|r| r.vote.undecided()).count();
        assert_eq!(a.asks.len(), undecided, "undecided votes and their asks differ");
        for (ballot, r) in &a.votes {
            assert!(!self.is_made(r.change), "a vote on a change already made");
            if r.vote.undecided() {
                assert!(a.asks.contains(&(r.ask_at, *ballot)), "vote {ballot:?}'s ask unindexed");
                assert!(r.committed.len() < majority, "vote {ballot:?} found made, kept");
                assert!(r.aborted.len() < majority, "vote {ballot:?} found aborted, undecided");
            }
        }
        assert_eq!(a.deadlines.len(), a.proposals.len(), "proposals and their deadlines differ");
        for (&id, p) in &a.proposals {
            assert!(a.deadlines.contains(&(p.deadline, id)), "proposal {id}'s deadline unindexed");
            assert!(!self.is_made(p.change), "a proposal of a change already made");
            assert!(id < a.next_id, "a proposal numbered ahead");
            match &p.commit {
                None => assert!(
                    p.promised.len() < majority,
                    "a proposal promised by a majority, undecided"
                ),
                Some(round) => {
                    assert!(round.counted.len() >= majority, "a commit round of a minority");
                    assert!(
                        round.committed.is_subset(&round.counted),
                        "a commit from one not counted"
                    );
                    assert!(
                        round.aborted.is_subset(&round.counted),
                        "an abort from one not counted"
                    );
                    assert!(
                        round.committed.is_disjoint(&round.aborted),
                        "an acceptor both committed and aborted"
                    );
                    assert!(
                        round.committed.len() < majority,
                        "a change committed by a majority, unmade"
                    );
                    assert!(
                        round.counted.len() - round.aborted.len() >= majority,
                        "a commit round that can no longer succeed, kept"
                    );
                }
            }
        }
    }
}

/// `gone` with `dc`, sorted, each once.
pub(crate) fn with(mut gone: Vec<u32>, dc: u32) -> Vec<u32> {
    gone.push(dc);
    gone.sort_unstable();
    gone.dedup();
    gone
}

/// How a message names `change`.
pub(crate) fn describe(change: Change) -> String {
    let what = if change.removes() { "removal" } else { "return" };
    format!("{what} of data center {} (counted from 0, epoch {})", change.dc, change.epoch)
}
