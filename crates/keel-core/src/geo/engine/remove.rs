//! Removing a data center for good (`KEEL.NODE REMOVE id`, `docs/geo.md`, *Removing a data
//! center*).
//!
//! A removed data center is a failed one that an operator has declared will never come
//! back. The protocol already tolerates it failing, so removal changes no quorum: it counts
//! toward the `f` failures, its last reports (stable rows, acknowledged certification
//! records) stay what they were, and its transactions that reached a survivor are
//! forwarded to the others as for any suspected data center. What removal adds is that
//! the survivors stop keeping things only it could need: the backlog of messages queued
//! for its members, the remote transactions held until it reports storing them, the
//! certification records held until it acknowledges them. That is safe only because it
//! never counts again: survivors drop what its members send, and tell them once, on a
//! fresh channel, so that a member still running stops serving its clients.

use super::super::channel::Channel;
use super::super::types::{Body, Change, GeoResult, Message};
use super::agree::with;
use super::{GeoEngine, Pending};
use crate::engine::RequestTag;
use keel_types::{KeelError, NodeId};

/// The lives a data center may have after its first: a timestamp's two top bits name its
/// life (`docs/geo.md`, *Taking a data center back*).
pub(crate) const LIVES_MAX: u32 = 3;

impl GeoEngine {
    /// `GeoOp::RemoveDc`: an operator removes the data center of `member`. Refused for
    /// this node's own data center (a member of another one must ask) and when the data
    /// centers removed or failed for some partition, as this node can tell
    /// (`failed_anywhere`), would be more than `f`; otherwise proposed to the
    /// acceptors, and made once a majority promised it (`agree.rs`). Asking again is the
    /// same request; once the removal is known here, it answers at once. A data center
    /// returning is removed again (its return abandoned) the same way.
    pub(crate) fn remove_asked(&mut self, tag: RequestTag, member: NodeId) {
        let Some(dc) = self.asked_dc(tag, member) else { return };
        let epoch = self.epochs[dc as usize];
        if epoch % 2 == 1 {
            return self.reply(tag, Ok(GeoResult::Synced));
        }
        let refusal = if dc == self.me.dc {
            let why = format!(
                "{member} is in this node's own data center: ask a node of another data center"
            );
            Some(KeelError::InvalidArgument(why))
        } else {
            let gone = with(self.failed_anywhere(), dc);
            self.beyond_f(&gone).then(|| self.beyond_f_refusal(dc, &gone))
        };
        if let Some(error) = refusal {
            self.counters.removals_refused += 1;
            return self.reply(tag, Err(error));
        }
        self.propose_change(tag, Change { dc, epoch: epoch + 1 });
    }

    /// `GeoOp::ReturnDc`: an operator takes the removed data center of `member` back.
    /// Refused for a data center that is not removed, in a keyspace with strong
    /// transactions, and past the last life timestamps can name; otherwise proposed to
    /// the acceptors as a removal is. Only the agreement is built: a return made leaves
    /// the data center removed meanwhile (`docs/geo.md`, *Taking a data center back*).
    pub(crate) fn return_asked(&mut self, tag: RequestTag, member: NodeId) {
        let Some(dc) = self.asked_dc(tag, member) else { return };
        let next = Change { dc, epoch: self.epochs[dc as usize] + 1 };
        let refusal = if self.returning[dc as usize] {
            return self.reply(tag, Ok(GeoResult::Synced));
        } else if next.removes() {
            Some(format!("the data center of {member} is not removed: only a removed one returns"))
        } else if self.config.strong {
            Some(
                "taking a data center back is not built for keyspaces with strong transactions yet"
                    .into(),
            )
        } else if next.life() > LIVES_MAX {
            Some(format!(
                "the data center of {member} came back {LIVES_MAX} times already, as many as timestamps can tell apart"
            ))
        } else {
            None
        };
        if let Some(why) = refusal {
            self.counters.removals_refused += 1;
            return self.reply(tag, Err(KeelError::InvalidArgument(why)));
        }
        self.propose_change(tag, next);
    }

    /// The data center of `member`, or the refusal of `tag` if it is not a member.
    fn asked_dc(&mut self, tag: RequestTag, member: NodeId) -> Option<u32> {
        let dc = self.member(member).map(|m| m.dc);
        if dc.is_none() {
            self.counters.removals_refused += 1;
            let why = format!("{member} is not a member of this keyspace");
            self.reply(tag, Err(KeelError::InvalidArgument(why)));
        }
        dc
    }

    /// `change` was made (asked here, or told by another node): a node that learns a
    /// change tells every other node once; one that skipped a change of the data center
    /// (a removal it never heard of, before a return) makes it too.
    pub(crate) fn learn_change(&mut self, change: Change) {
        let dc = change.dc as usize;
        if self.epochs[dc] >= change.epoch {
            return;
        }
        self.epochs[dc] = change.epoch;
        self.agreement_learns(change);
        let first = !self.removed[dc];
        let abandoned = self.returning[dc];
        self.returning[dc] = !change.removes();
        if first {
            self.learn_removed(change);
        }
        if self.is_removed() {
            return;
        }
        if !change.removes() {
            self.welcome_return(change);
        } else if abandoned {
            self.abandon_welcome(change);
        }
        if change.removes() {
            self.counters.removals += 1;
        } else {
            self.counters.returns += 1;
        }
        if !first {
            let others = self.live_others();
            for node in others {
                self.send(node, Body::Changed { change });
            }
        }
    }

    /// The members of the data centers not removed or coming back, this node's own
    /// included, but not itself.
    fn live_others(&self) -> Vec<NodeId> {
        (0..self.dcs)
            .filter(|&i| !self.removed[i] || self.returning[i])
            .flat_map(|i| self.replicas[i].clone())
            .filter(|&n| n != self.me.node)
            .collect()
    }

    /// Data center `dc` of `change` is removed: tells every other node once, its members
    /// on a fresh channel that carries only that; drops what was queued for them, and
    /// what was held until they report.
    fn learn_removed(&mut self, change: Change) {
        let dc = change.dc;
        self.removed[dc as usize] = true;
        if dc == self.me.dc {
            return self.stop_removed();
        }
        let gone: Vec<NodeId> = self.replicas[dc as usize].clone();
        self.removed_nodes.extend(gone.iter().copied());
        for node in &gone {
            self.joined.remove(node);
        }
        let notice = match change.removes() {
            true => change,
            false => Change { dc, epoch: change.epoch - 1 },
        };
        for &node in &gone {
            self.channels.insert(node, Channel::notice(Body::Changed { change: notice }));
        }
        for node in self.live_others() {
            self.send(node, Body::Changed { change });
        }
        self.uniformity.forwarded.retain(|&(i, _), _| i != dc);
        self.collect();
    }

    /// Whether this replica's own data center was removed: it stops serving, as a lost
    /// one does.
    pub fn is_removed(&self) -> bool {
        self.removed[self.me.dc as usize]
    }

    /// This replica's data center was removed: every request waiting here is answered
    /// (a commit's outcome unknown), and from now on it refuses clients and stays
    /// silent (`step_lost`).
    pub(crate) fn stop_removed(&mut self) {
        self.catch_up = None;
        let txs = std::mem::take(&mut self.coordinator.txs);
        for tx in txs.into_values() {
            let answer = match tx.pending {
                Pending::Idle => None,
                Pending::Op { tag, .. } => Some((tag, removed_error())),
                Pending::Committing { tag, .. }
                | Pending::Uniforming { tag }
                | Pending::Certifying { tag, .. } => tag.map(|tag| (tag, KeelError::Timeout)),
            };
            if let Some((tag, error)) = answer {
                self.reply(tag, Err(error));
            }
        }
        let barriers = std::mem::take(&mut self.coordinator.barriers);
        let attaches = std::mem::take(&mut self.coordinator.attaches);
        let tags =
            barriers.into_keys().map(|(_, tag)| tag).chain(attaches.into_keys().map(|k| k.2));
        for tag in tags.collect::<Vec<_>>() {
            self.reply(tag, Err(removed_error()));
        }
        let proposals = std::mem::take(&mut self.agreement.proposals);
        self.returning = vec![false; self.dcs];
        self.agreement =
            super::agree::Agreement { next_id: self.agreement.next_id, ..Default::default() };
        for tag in proposals.into_values().flat_map(|p| p.tags) {
            self.reply(tag, Err(removed_error()));
        }
        let next_tx = self.coordinator.next_tx;
        self.coordinator = super::Coordinator { next_tx, ..Default::default() };
        self.channels.clear();
        self.loopback.clear();
        self.last_word();
    }

    /// This replica's data center was removed: it tells the members of every data center
    /// not removed, each on a notice channel, before it goes silent. It may be the only
    /// one that knows: an acceptor that found its own removal made by asking stops, and
    /// the other acceptors' asks about the votes they committed can then never reach a
    /// majority (it answers none).
    fn last_word(&mut self) {
        if self.config.unsafe_removed_silent {
            return;
        }
        let change = Change { dc: self.me.dc, epoch: self.removal_epoch() };
        let live = (0..self.dcs).filter(|&i| !self.removed[i]);
        let nodes: Vec<NodeId> = live.flat_map(|i| self.replicas[i].clone()).collect();
        for node in nodes {
            self.channels.insert(node, Channel::notice(Body::Changed { change }));
        }
    }

    /// The epoch of this replica's own data center's removal (the one before a return
    /// it learned without the removal).
    fn removal_epoch(&self) -> u32 {
        let epoch = self.epochs[self.me.dc as usize];
        epoch - u32::from(epoch.is_multiple_of(2))
    }

    /// A removed replica heard `from`: a member that tells it of its removal knows it, and
    /// needs no last word; one that does not is told again ([`Channel::rearm_notice`]).
    pub(crate) fn last_word_heard(&mut self, from: NodeId, message: &Message) {
        let removal = self.removal_epoch();
        if Self::told_removed(message, self.me.dc).is_some_and(|c| c.epoch >= removal) {
            self.channels.remove(&from);
        } else if self.channels.get_mut(&from).is_some_and(Channel::rearm_notice) {
            self.counters.notices_rearmed += 1;
        }
    }

    /// A removed data center's member's last word (`last_word`), taken whatever its
    /// channel's state: `message` from a member of `dc` that says `dc` was removed (the
    /// latest such removal it names).
    pub(crate) fn told_removed(message: &Message, dc: u32) -> Option<Change> {
        let removals = message.bodies.iter().filter_map(|body| match *body {
            Body::Changed { change } if change.dc == dc && change.removes() => Some(change),
            _ => None,
        });
        removals.max_by_key(|change| change.epoch)
    }
}

/// The refusal of a replica whose data center was removed.
pub(crate) fn removed_error() -> KeelError {
    KeelError::Unavailable(
        "this geo replica's data center was removed from the keyspace: attach at another data center"
            .into(),
    )
}
