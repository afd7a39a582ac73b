//! Elections: the candidate role ([`Campaign`]), the pre-vote probe that precedes it, and
//! the voter's rules (leader stickiness, up-to-date logs, one vote per epoch).
//!
//! ```text
//!   follower ──election timeout──► pre-vote probe ──majority would vote──► candidate (epoch+1)
//!      ▲                                                                       │
//!      └──── hears a leader of its epoch or a higher epoch ◄────── majority of votes: leader
//! ```
//!
//! These handlers change roles, so they are the engine's; the candidate's own state is
//! only the votes it collected.

use super::core::Core;
use super::engine::{LeaderEngine, RoleState};
use super::io::Message;
use keel_types::{Epoch, HardState, LogIndex, NodeId};
use std::collections::BTreeSet;

/// A candidate's state: the votes collected in its epoch (its own included).
#[derive(Clone, Debug, Default)]
pub(super) struct Campaign {
    pub votes: BTreeSet<NodeId>,
}

impl Campaign {
    /// Counts a vote; returns whether it makes a majority.
    fn count(&mut self, core: &Core, from: NodeId) -> bool {
        if core.is_voter(from) {
            self.votes.insert(from);
        }
        self.votes.len() >= core.majority()
    }
}

impl LeaderEngine {
    /// Whether this node heard from a live leader too recently to vote (stickiness).
    pub(super) fn leader_is_live(&self) -> bool {
        if matches!(self.role, RoleState::Leader(_)) {
            return true;
        }
        let core = &self.core;
        core.election.contact_at.is_some_and(|at| core.now < at + core.config.election_timeout_min)
    }

    /// Asks every peer whether it would vote for this node (no state changes anywhere).
    pub(super) fn start_pre_vote(&mut self) {
        assert!(!matches!(self.role, RoleState::Leader(_)));
        if let RoleState::Follower(following) = &mut self.role {
            following.leader = None;
        }
        let core = &mut self.core;
        core.reset_election_deadline();
        core.election.pre_votes = Some(BTreeSet::from([core.config.node_id]));
        let request = Message::PreVote {
            epoch: core.hard.epoch,
            last_epoch: core.log.last_epoch(),
            last_index: core.log.last_index(),
        };
        core.broadcast(&request);
    }

    pub(super) fn on_pre_vote(
        &mut self,
        from: NodeId,
        epoch: Epoch,
        last_epoch: Epoch,
        last_index: LogIndex,
    ) {
        let core = &self.core;
        let leader_heard = self.leader_is_live() && !core.config.unsafe_pre_vote_ignores_leader;
        let granted = !leader_heard
            && epoch >= core.hard.epoch
            && !core.log_is_behind(last_epoch, last_index);
        let reply = Message::PreVoteReply { epoch: self.core.hard.epoch, granted };
        self.core.out.messages.push((from, reply));
    }

    /// As [`Self::on_vote`]: only a node that is asking for pre-votes acts on a reply.
    pub(super) fn on_pre_vote_reply(&mut self, from: NodeId, epoch: Epoch, granted: bool) {
        let leading = matches!(self.role, RoleState::Leader(_));
        if self.core.election.pre_votes.is_none() || leading {
            return;
        }
        if epoch > self.core.hard.epoch {
            self.become_follower(epoch, None);
            return;
        }
        let majority = self.core.majority();
        let ours = epoch <= self.core.hard.epoch && self.core.is_voter(from);
        let Some(pre_votes) = self.core.election.pre_votes.as_mut().filter(|_| granted && ours)
        else {
            return;
        };
        pre_votes.insert(from);
        if pre_votes.len() >= majority {
            self.start_election(false);
        }
    }

    /// Moves to the next epoch as a candidate, votes for itself and asks for votes; as a
    /// leadership transfer's candidate (`TimeoutNow`, or a leader whose target did not
    /// take over) when `transfer`.
    pub(super) fn start_election(&mut self, transfer: bool) {
        assert!(!matches!(self.role, RoleState::Leader(_)));
        let next = self.core.hard.epoch.next();
        self.become_follower(next, None);
        let core = &mut self.core;
        core.set_hard_state(HardState {
            epoch: core.hard.epoch,
            voted_for: Some(core.config.node_id),
            ..core.hard
        });
        core.election.pre_votes = None;
        core.reset_election_deadline();
        core.counters.elections += 1;
        let campaign = Campaign { votes: BTreeSet::from([core.config.node_id]) };
        assert!(core.is_voter(core.config.node_id), "only a voter campaigns");
        assert!(campaign.votes.len() < core.majority(), "one vote never wins");
        self.role = RoleState::Candidate(campaign);
        let request = Message::RequestVote {
            epoch: core.hard.epoch,
            last_epoch: core.log.last_epoch(),
            last_index: core.log.last_index(),
            transfer,
        };
        core.broadcast(&request);
    }

    /// A leader's `TimeoutNow`: its follower campaigns at once, skipping the pre-vote,
    /// if that leader is the one it follows in this epoch (a late one from an earlier
    /// epoch's leader is ignored), it may lead, and its log ends where the leader's does.
    /// The leader judged the last from this node's replies, which a crash since may have
    /// made stale: a log cut by the crash would lose committed entries if it led.
    pub(super) fn on_timeout_now(
        &mut self,
        from: NodeId,
        epoch: Epoch,
        (last_epoch, last_index): (Epoch, LogIndex),
    ) {
        let core = &self.core;
        let following = matches!(&self.role, RoleState::Follower(f) if f.leader == Some(from));
        let may_lead = core.is_voter(core.config.node_id) && core.hard.repair_floor.is_none();
        let whole = core.log.last_epoch() == last_epoch && core.log.last_index() == last_index;
        if epoch == core.hard.epoch && following && may_lead && whole {
            self.start_election(true);
        }
    }

    /// Whether a vote request may pass this voter's stickiness: a transfer's candidate
    /// of exactly the next epoch, whose leader (the only one whose lease this voter's
    /// stickiness protects) gave its lease up before sending `TimeoutNow`. Leading, this
    /// node knows whether it did.
    fn handed_over_to(&self, epoch: Epoch, transfer: bool) -> bool {
        let given_up = match &self.role {
            RoleState::Leader(leading) => leading.lease_given_up,
            _ => true,
        };
        transfer && epoch == self.core.hard.epoch.next() && given_up
    }

    pub(super) fn on_request_vote(
        &mut self,
        from: NodeId,
        epoch: Epoch,
        (last_epoch, last_index): (Epoch, LogIndex),
        transfer: bool,
    ) {
        let live = self.leader_is_live();
        if live && !self.handed_over_to(epoch, transfer) {
            // Stickiness: keep the epoch, refuse (ORCA §4.4.2; the leader lease needs it).
            let reply = Message::Vote { epoch: self.core.hard.epoch, granted: false };
            self.core.out.messages.push((from, reply));
            return;
        }
        if epoch > self.core.hard.epoch {
            self.become_follower(epoch, None);
        }
        let core = &mut self.core;
        let up_to_date = !core.log_is_behind(last_epoch, last_index);
        let free = core.hard.voted_for.is_none_or(|v| v == from);
        // Not in the epoch of the membership entry in force or before: a node that became
        // a voter there (perhaps a new incarnation of a removed one, its vote of that
        // epoch forgotten) votes only in later ones; that epoch already has its leader.
        let after_change = epoch > core.membership_version().epoch;
        let granted = epoch == core.hard.epoch && up_to_date && free && after_change;
        if granted {
            core.set_hard_state(HardState { epoch, voted_for: Some(from), ..core.hard });
            core.reset_election_deadline();
            core.counters.transfer_votes += u64::from(live); // past stickiness: a transfer's
        }
        assert!(!granted || core.hard.voted_for == Some(from));
        core.out.messages.push((from, Message::Vote { epoch: core.hard.epoch, granted }));
    }

    /// A vote answers this node's own campaign: only a candidate acts on one. Anyone else
    /// ignores it, whatever its epoch, so that a vote nobody asked for (late, or forged by
    /// a member) cannot depose a leader; a real higher epoch still arrives with the next
    /// append reply or vote request.
    pub(super) fn on_vote(&mut self, from: NodeId, epoch: Epoch, granted: bool) {
        if !matches!(self.role, RoleState::Candidate(_)) {
            return;
        }
        if epoch > self.core.hard.epoch {
            self.become_follower(epoch, None);
            return;
        }
        let RoleState::Candidate(campaign) = &mut self.role else { return };
        if epoch != self.core.hard.epoch || !granted {
            return;
        }
        if campaign.count(&self.core, from) {
            self.become_leader();
        }
    }
}
