//! The rejoin's fence: what a node knows of every member's incarnation, and how that
//! keeps a round from counting a reply a restarted node's memory lost.
//!
//! A rejoining node reads `n - q + 1` other nodes (`rejoin.rs`). That reaches a member of
//! every quorum that was complete *before* it read them, but a round still open when the
//! node restarted can go on to count the earlier incarnation's reply (sent before the
//! crash, still on its way or already recorded) together with a reply that another node
//! sends only *after* the new incarnation read that node's state. Such a round completes
//! on a quorum whose only members holding what it made are the round's coordinator and
//! nodes the rejoin read too early; the rejoin may have read neither, and the restarted
//! node then holds nothing of it (`docs/kite.md`, Restarts, names the three shapes).
//!
//! The fence makes that impossible:
//! 1. A node learns of a newer incarnation from the new incarnation's first state request
//!    (its **fence** at that node), from the new incarnation's replies, or from another
//!    node's view. It then takes every reply of the earlier incarnation out of its open
//!    rounds (they are asked again) and refuses the earlier incarnation's replies still
//!    on their way.
//! 2. Every reply carries the replier's incarnation and, until the asker acknowledged it
//!    ([`Message::ViewAck`]), the replier's whole view of incarnations. The asker merges
//!    that view before it counts the reply.
//!
//! So a reply a node sent after its fence reaches a round only together with the news of
//! the restart, and the round can no longer hold the earlier incarnation's reply. Every
//! reply a round counts beside the earlier incarnation's was sent before its sender's
//! fence, when the sender's state (which the rejoin then read, or will read) already
//! held what the reply vouches for.

use super::{KiteEngine, Message, NodeId};
use crate::kite::types::{Origin, View};

impl KiteEngine {
    /// Takes the news a reply of `from` carries before the reply is counted. `false`: the
    /// reply comes from an earlier incarnation of `from` than this node knows, and is
    /// refused (unless the fence is off, the negative control).
    pub(super) fn admit_reply(&mut self, from: NodeId, origin: &Origin) -> bool {
        if let Some(view) = &origin.view {
            for &(node, incarnation) in &view.incarnations {
                self.learn(node, incarnation);
            }
            self.compare_configured(from, &view.membership);
            self.take_membership(view.membership.clone());
            let ack = Message::ViewAck { incarnation: origin.incarnation, gen: view.gen };
            self.out.messages.push((from, ack));
        }
        self.learn(from, origin.incarnation);
        if !self.admit_epoch(from, origin.epoch) {
            return false;
        }
        let current = self.incarnations.get(&from) == Some(&origin.incarnation);
        // After learning from this very reply, `from` is known at least at its incarnation.
        debug_assert!(self.incarnations.get(&from).is_some_and(|&i| i >= origin.incarnation));
        if current || self.config.unsafe_unfenced_rejoin {
            return true;
        }
        self.counters.replies_stale += 1;
        false
    }

    /// Learns that `node` is at least at `incarnation`. A newer incarnation than the one
    /// known fences the earlier one's replies out of every open round.
    pub(super) fn learn(&mut self, node: NodeId, incarnation: u32) {
        if node == self.config.node || self.index_of(node).is_none() {
            return;
        }
        let known = self.incarnations.get(&node).copied();
        if known.is_some_and(|k| k >= incarnation) {
            return;
        }
        self.incarnations.insert(node, incarnation);
        // Incarnations only move up: a later life never reuses an earlier one's stamps.
        assert!(known.is_none_or(|k| k < incarnation), "an incarnation went back");
        self.view_gen += 1;
        if known.is_some() {
            self.counters.incarnations_learned += 1;
            self.fence(node);
        }
    }

    /// Takes `node`'s replies out of every open round: they came from an incarnation
    /// earlier than the one just learned. The rounds ask `node` again at once. (Counted,
    /// but left in place, under the negative control.)
    fn fence(&mut self, node: NodeId) {
        let Some(index) = self.index_of(node) else { return };
        assert_ne!(node, self.config.node, "a node fences itself");
        let (now, unfenced) = (self.now, self.config.unsafe_unfenced_rejoin);
        self.counters.replies_fenced += self.rounds.fence(index, node, now, unfenced);
    }

    /// The origin this node's replies to `to` carry: its incarnation, and its view until
    /// `to` acknowledged the current one.
    pub(super) fn origin_for(&self, to: NodeId) -> Origin {
        let told = self.view_told.get(&to).copied().unwrap_or(0);
        let view = (to != self.config.node && told < self.view_gen).then(|| {
            let incarnations = self.incarnations.iter().map(|(&n, &i)| (n, i)).collect();
            let membership = self.membership.clone();
            Box::new(View { gen: self.view_gen, incarnations, membership })
        });
        Origin { incarnation: self.config.incarnation, epoch: self.membership.epoch, view }
    }

    /// `from` merged the view of generation `gen` of this node's `incarnation` (an earlier
    /// incarnation's, whose generations were counted anew since, changes nothing).
    pub(super) fn on_view_ack(&mut self, from: NodeId, incarnation: u32, gen: u64) {
        if incarnation != self.config.incarnation {
            return;
        }
        // The gate refused acknowledgements of generations never sent.
        assert!(gen <= self.view_gen, "view {gen} acknowledged, {} sent", self.view_gen);
        let told = self.view_told.entry(from).or_default();
        *told = (*told).max(gen);
    }

    /// A new incarnation's state request: the fence at this node. Everything this node's
    /// state holds now, the rejoin reads (pages are cut from a state that only grows);
    /// what it acknowledges from now on reaches a round only with the news.
    pub(super) fn on_fence(&mut self, from: NodeId, rejoin: u64) {
        // The gate checked that the request names its sender.
        debug_assert_eq!(rejoin >> 32, u64::from(from.0));
        self.learn(from, rejoin as u32);
    }
}
