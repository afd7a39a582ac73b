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
use super::super::types::{Body, GeoResult};
use super::agree::with;
use super::{GeoEngine, Pending};
use crate::engine::RequestTag;
use keel_types::{KeelError, NodeId};

impl GeoEngine {
    /// `GeoOp::RemoveDc`: an operator removes the data center of `member`. Refused for
    /// this node's own data center (a member of another one must ask) and when the data
    /// centers removed or failed for some partition, as this node can tell
    /// (`failed_anywhere`), would be more than `f`; otherwise proposed to the
    /// acceptors, and made once a majority promised it (`agree.rs`). Asking again is the
    /// same request; once the removal is known here, it answers at once.
    pub(crate) fn remove_asked(&mut self, tag: RequestTag, member: NodeId) {
        let Some(dc) = self.member(member).map(|m| m.dc) else {
            self.counters.removals_refused += 1;
            let why = format!("{member} is not a member of this keyspace");
            return self.reply(tag, Err(KeelError::InvalidArgument(why)));
        };
        if self.removed[dc as usize] {
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
        self.propose_removal(tag, dc);
    }

    /// Data center `dc` is removed (asked here, or told by another node): tells every
    /// other node once, its members on a fresh channel that carries only that; drops
    /// what was queued for them, and what was held until they report.
    pub(crate) fn learn_removed(&mut self, dc: u32) {
        if self.removed[dc as usize] {
            return;
        }
        self.removed[dc as usize] = true;
        self.counters.removals += 1;
        self.agreement_learns_removed(dc);
        if dc == self.me.dc {
            return self.stop_removed();
        }
        let gone: Vec<NodeId> = self.replicas[dc as usize].clone();
        self.removed_nodes.extend(gone.iter().copied());
        for &node in &gone {
            self.channels.insert(node, Channel::notice(Body::Removed { dc }));
        }
        let others: Vec<NodeId> = (0..self.dcs)
            .filter(|&i| !self.removed[i])
            .flat_map(|i| self.replicas[i].clone())
            .filter(|&n| n != self.me.node)
            .collect();
        for node in others {
            self.send(node, Body::Removed { dc });
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
    fn stop_removed(&mut self) {
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
        self.agreement =
            super::agree::Agreement { next_id: self.agreement.next_id, ..Default::default() };
        for tag in proposals.into_values().flat_map(|p| p.tags) {
            self.reply(tag, Err(removed_error()));
        }
        let next_tx = self.coordinator.next_tx;
        self.coordinator = super::Coordinator { next_tx, ..Default::default() };
        self.channels.clear();
        self.loopback.clear();
    }
}

/// The refusal of a replica whose data center was removed.
pub(crate) fn removed_error() -> KeelError {
    KeelError::Unavailable(
        "this geo replica's data center was removed from the keyspace: attach at another data center"
            .into(),
    )
}
