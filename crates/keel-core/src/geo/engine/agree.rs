//! Agreeing on a removal (`docs/geo.md`, *Removing a data center*).
//!
//! A removal declares a failure, and the keyspace tolerates `f`. One node can refuse a
//! removal beyond `f` that it asks itself, but two removals asked at once at two nodes
//! each pass their own node's count. So the node asked proposes the removal to every
//! data center's **acceptor** (its replica of partition 0) and makes it only once a
//! majority of the data centers' acceptors promised it:
//!
//! - An acceptor promises a proposal when the data centers removed or failed for some
//!   partition, as it counts them, the proposed one included, are at most `f`, and it
//!   holds no promise for the removal of another data center. A promise holds until the
//!   acceptor learns the removal was made or its proposer withdraws it.
//! - The proposer makes the removal once promises from a majority of the data centers
//!   came in and the data centers they know removed or count failed, with its own count
//!   and the proposed one, are at most `f`. Otherwise (a refusal, or no majority in
//!   time) it withdraws the proposal and refuses the request.
//!
//! Why two removals made at once stay within `f`: take the last removal made, `z`, and
//! any other made, `x`. Their majorities share an acceptor. Had it promised `z` first, it
//! would have refused `x` while `z`'s promise held, and that holds until `z` is made,
//! which is after `x` was: so it promised `x` first, and when `z`'s proposal came, it
//! refused it unless it knew `x` made, which it then reported. So `z`'s count held every
//! other removal made, and `z`'s proposer checked it against `f`.
//!
//! The price: a proposer that fails between the promises and its decision leaves them
//! held; the acceptors then refuse any other data center's removal until the same
//! removal is asked again (at any node: it is promised again, and made).

use super::super::types::{Body, GeoResult, RemovalRefusal};
use super::GeoEngine;
use crate::engine::RequestTag;
use crate::time::Time;
use keel_types::{KeelError, NodeId};
use std::collections::{BTreeMap, BTreeSet};

/// A removal this node proposes.
#[derive(Debug)]
pub(crate) struct Proposal {
    /// The data center to remove.
    pub dc: u32,
    /// The requests to answer.
    pub tags: Vec<RequestTag>,
    /// The acceptors asked.
    pub asked: Vec<NodeId>,
    /// Per data center whose acceptor promised: the data centers it knows removed and
    /// those it counts failed.
    pub promised: BTreeMap<u32, Vec<u32>>,
    /// When it is given up if not made.
    pub deadline: Time,
}

/// The agreement's state: an acceptor's promises, a proposer's proposals.
#[derive(Debug, Default)]
pub(crate) struct Agreement {
    /// Acceptor: the data center whose removal it promised, with the proposals, by
    /// proposer and number, that hold the promise.
    pub promised: Option<(u32, BTreeSet<(NodeId, u64)>)>,
    /// Proposer: its proposals, by number.
    pub proposals: BTreeMap<u64, Proposal>,
    /// The proposals, by deadline.
    pub deadlines: BTreeSet<(Time, u64)>,
    /// Numbers proposals.
    pub next_id: u64,
}

impl GeoEngine {
    /// Proposes removing data center `dc` (the request `tag` passed this node's own
    /// count), or joins this node's proposal of it already out.
    pub(crate) fn propose_removal(&mut self, tag: RequestTag, dc: u32) {
        if self.config.unsafe_unagreed_removal {
            self.learn_removed(dc);
            return self.reply(tag, Ok(GeoResult::Synced));
        }
        let agreement = &mut self.agreement;
        if let Some(p) = agreement.proposals.values_mut().find(|p| p.dc == dc) {
            p.tags.push(tag);
            return;
        }
        let id = agreement.next_id;
        agreement.next_id += 1;
        let deadline = Time(self.now.0.saturating_add(2 * self.config.suspect_after.0));
        let asked: Vec<NodeId> = (0..self.dcs as u32)
            .filter(|&i| !self.removed[i as usize])
            .map(|i| self.replica(i, 0))
            .collect();
        if asked.len() < self.dcs / 2 + 1 {
            let why = "too few data centers remain to agree on a removal".to_string();
            return self.reply(tag, Err(KeelError::Unavailable(why)));
        }
        let proposal = Proposal {
            dc,
            tags: vec![tag],
            asked: asked.clone(),
            promised: BTreeMap::new(),
            deadline,
        };
        self.agreement.proposals.insert(id, proposal);
        self.agreement.deadlines.insert((deadline, id));
        self.counters.removals_proposed += 1;
        for to in asked {
            self.send(to, Body::RemovePropose { id, dc });
        }
    }

    /// `REMOVE_PROPOSE` at an acceptor: promised unless it holds another data center's
    /// promise, or the count would pass `f`.
    pub(crate) fn removal_proposed(&mut self, from: NodeId, id: u64, dc: u32) {
        let failed = self.failed_anywhere();
        let removed = self.removed_list();
        if !self.removed[dc as usize] {
            let refusal = match &self.agreement.promised {
                Some((other, _)) if *other != dc => Some(RemovalRefusal::Pending { dc: *other }),
                _ => {
                    let gone = with(failed.clone(), dc);
                    self.beyond_f(&gone).then_some(RemovalRefusal::BeyondF { gone })
                }
            };
            if let Some(why) = refusal {
                if matches!(why, RemovalRefusal::Pending { .. }) {
                    self.counters.removals_refused_pending += 1;
                }
                self.send(from, Body::RemoveRefused { id, why });
                return;
            }
            let (_, holders) = self.agreement.promised.get_or_insert_with(|| (dc, BTreeSet::new()));
            holders.insert((from, id));
            self.counters.removals_promised += 1;
        }
        self.send(from, Body::RemovePromised { id, removed, failed });
    }

    /// `REMOVE_PROMISED` at the proposer: once a majority of the data centers promised,
    /// the removal is made if the count they report stays within `f`.
    pub(crate) fn removal_promised(
        &mut self,
        from: NodeId,
        id: u64,
        removed: Vec<u32>,
        failed: Vec<u32>,
    ) {
        let Some(acceptor) = self.member(from) else { return };
        let Some(proposal) = self.agreement.proposals.get_mut(&id) else { return };
        let mut seen = removed;
        seen.extend(failed);
        proposal.promised.insert(acceptor.dc, seen);
        if proposal.promised.len() < self.dcs / 2 + 1 {
            return;
        }
        let dc = proposal.dc;
        let mut gone: Vec<u32> = proposal.promised.values().flatten().copied().collect();
        gone.extend(self.failed_anywhere());
        let gone = with(gone, dc);
        if self.beyond_f(&gone) {
            return self.give_up(id, self.beyond_f_refusal(dc, &gone));
        }
        let proposal = self.forget_proposal(id).expect("looked up");
        self.learn_removed(dc);
        for tag in proposal.tags {
            self.reply(tag, Ok(GeoResult::Synced));
        }
    }

    /// `REMOVE_REFUSED` at the proposer: the proposal is given up at once, and its
    /// promises withdrawn, so that two proposals crossing leave none held (one that went
    /// on while a majority might still promise would hold its promises until it is made
    /// or given up, and a proposer stopped meanwhile never withdraws them).
    pub(crate) fn removal_refused(&mut self, from: NodeId, id: u64, why: RemovalRefusal) {
        let Some(dc) = self.agreement.proposals.get(&id).map(|p| p.dc) else { return };
        let error = match why {
            RemovalRefusal::Pending { dc: other } => {
                KeelError::Busy(format!(
                    "{from} holds a promise for the removal of data center {other} (counted from 0), not yet made or withdrawn: that removal is under way, or its asker failed before deciding it; asking it again finishes it if it is within f"
                ))
            }
            RemovalRefusal::BeyondF { gone } => self.beyond_f_refusal(dc, &gone),
        };
        self.give_up(id, error);
    }

    /// `REMOVE_WITHDRAWN` at an acceptor: the proposal no longer holds its promise.
    pub(crate) fn removal_withdrawn(&mut self, from: NodeId, id: u64, dc: u32) {
        if let Some((promised, holders)) = &mut self.agreement.promised {
            if *promised == dc {
                holders.remove(&(from, id));
                if holders.is_empty() {
                    self.agreement.promised = None;
                }
            }
        }
    }

    /// Gives proposal `id` up: its promises are withdrawn and its requests refused.
    fn give_up(&mut self, id: u64, error: KeelError) {
        let Some(proposal) = self.forget_proposal(id) else { return };
        self.counters.removals_refused += 1;
        for to in proposal.asked {
            self.send(to, Body::RemoveWithdrawn { id, dc: proposal.dc });
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

    /// Gives up the proposals whose deadline passed (too few acceptors answered).
    pub(crate) fn expire_proposals(&mut self) {
        while let Some(&(deadline, id)) = self.agreement.deadlines.first() {
            if deadline > self.now {
                break;
            }
            let dc = self.agreement.proposals[&id].dc;
            let why = format!(
                "too few data centers answered the removal of data center {dc} (counted from 0): a majority must promise it; ask again"
            );
            self.give_up(id, KeelError::Unavailable(why));
        }
    }

    /// Data center `dc` was removed: its promise is kept no longer, and this node's
    /// proposals of it are answered.
    pub(crate) fn agreement_learns_removed(&mut self, dc: u32) {
        if self.agreement.promised.as_ref().is_some_and(|(d, _)| *d == dc) {
            self.agreement.promised = None;
        }
        let ids: Vec<u64> = self
            .agreement
            .proposals
            .iter()
            .filter(|(_, p)| p.dc == dc)
            .map(|(&id, _)| id)
            .collect();
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
        if let Some((dc, holders)) = &a.promised {
            assert!(self.me.partition == 0, "a promise held by a replica of another partition");
            assert!(!holders.is_empty(), "a promise with no proposal holding it");
            assert!(!self.removed[*dc as usize], "a promise of a data center already removed");
        }
        assert_eq!(a.deadlines.len(), a.proposals.len(), "proposals and their deadlines differ");
        for (&id, p) in &a.proposals {
            assert!(a.deadlines.contains(&(p.deadline, id)), "proposal {id}'s deadline unindexed");
            assert!(!self.removed[p.dc as usize], "a proposal of a data center already removed");
            assert!(id < a.next_id, "a proposal numbered ahead");
            assert!(p.promised.len() <= self.dcs / 2, "a proposal promised by a majority, unmade");
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
