//! Forgetting decided strong transactions (`docs/geo.md`, *Forgetting decisions*): a
//! leader answers a vote or a candidate of a transaction it decided with the decision, so
//! every replica remembers each outcome; this bounds that memory by what is in flight.
//!
//! - **When an outcome may go.** A vote or a candidate of a decided transaction comes
//!   only from a participant still undecided (a new leader that lacks this partition's
//!   vote), or from a coordinator still waiting. An abort may go once its expiry passed;
//!   a commit also once every other participant decided it: the leader asks them
//!   (`SETTLE`, answered `SETTLED` from their applied decisions) for its commits past
//!   their expiry.
//! - **The horizon.** The leader logs `Forget(below)` with `below` under the expiry of
//!   every transaction open or unsettled here and under its clock; every replica forgets
//!   the outcomes it covers when it applies it. Once `Forget` is in its log, a leader
//!   votes commit on no transaction with an expiry at or below it.
//! - **Forgotten.** A vote or a candidate of a transaction at or below the applied
//!   horizon that this partition neither has open nor decided is answered `FORGOTTEN`:
//!   this partition decided it and every participant did, or it never voted on it and
//!   never will. A participant's leader still undecided takes it as an abort (a commit is
//!   forgotten only once every participant decided it); a coordinator still waiting, as
//!   an unknown outcome.

use super::super::types::{Body, Record, TxId};
use super::{GeoEngine, Pending};
use crate::time::Time;
use keel_types::{KeelError, NodeId};
use std::collections::BTreeMap;

/// Transactions one `SETTLE` asks about, at most.
pub const SETTLE_MAX: usize = 4_096;

impl GeoEngine {
    /// Leader, each broadcast period: logs `Forget` up to the settled outcomes past their
    /// expiry, and (each retransmission period) asks the other participants about the
    /// commits still unsettled.
    pub(crate) fn settle_and_forget(&mut self) {
        if !self.leads() {
            return;
        }
        let ask = self.now >= self.certifier.next_settle;
        if ask {
            self.certifier.next_settle = Time(self.now.0 + self.config.retransmit.0);
        }
        let c = &self.certifier;
        let open = c.open.values().map(|o| o.expiry);
        let unvoted = c.expiries.first().map(|&(expiry, _)| expiry);
        let first_held = open.chain(unvoted).min().unwrap_or(u64::MAX);
        let unsafe_forget = self.config.unsafe_forget_unsettled;
        let horizon = first_held.min(self.clock()).saturating_sub(1);
        let mut below = c.forgetting;
        let mut blocked = false;
        let mut asks: BTreeMap<u32, Vec<(TxId, u64)>> = BTreeMap::new();
        let start = (c.forgetting.saturating_add(1), TxId { node: 0, seq: 0 });
        for &(expiry, id) in c.remembered.range(start..) {
            if expiry > horizon {
                break;
            }
            let unsettled = &c.outcomes[&id].unsettled;
            if unsettled.is_empty() || unsafe_forget {
                if !blocked {
                    below = expiry;
                }
                continue;
            }
            if !blocked {
                blocked = true;
                // An outcome of the same expiry as this one stays too.
                below = below.min(expiry - 1).max(c.forgetting);
            }
            if !ask {
                break;
            }
            for &p in unsettled {
                asks.entry(p).or_default().push((id, expiry));
            }
            if asks.values().map(Vec::len).sum::<usize>() >= SETTLE_MAX {
                break;
            }
        }
        if below > self.certifier.forgetting {
            self.append_record(Record::Forget { below });
        }
        for (p, mut txs) in asks {
            txs.truncate(SETTLE_MAX);
            let to = self.leader_of_partition(p);
            self.send(to, Body::Settle { txs });
        }
    }

    /// `SETTLE`: the transactions this replica applied a decision of (the forgotten
    /// ones included: a transaction committed elsewhere was voted on here).
    pub(crate) fn settle_in(&mut self, from: NodeId, txs: Vec<(TxId, u64)>) {
        let c = &self.certifier;
        let decided: Vec<TxId> = txs
            .into_iter()
            .filter(|&(id, expiry)| c.outcomes.contains_key(&id) || c.is_forgotten(id, expiry))
            .map(|(id, _)| id)
            .collect();
        if !decided.is_empty() {
            self.send(from, Body::Settled { txs: decided });
        }
    }

    /// `SETTLED`: the sender's partition decided these transactions.
    pub(crate) fn settled_in(&mut self, from: NodeId, txs: Vec<TxId>) {
        let Some(member) = self.member(from) else { return };
        for id in txs {
            if let Some(outcome) = self.certifier.outcomes.get_mut(&id) {
                outcome.unsettled.retain(|&p| p != member.partition);
            }
        }
    }

    /// Applies `Forget(below)`: forgets the outcomes it covers.
    pub(crate) fn forget(&mut self, below: u64) {
        let c = &mut self.certifier;
        c.forgotten = c.forgotten.max(below);
        c.forgetting = c.forgetting.max(below);
        while let Some(&(expiry, id)) = c.remembered.first() {
            if expiry > c.forgotten {
                break;
            }
            c.remembered.pop_first();
            c.outcomes.remove(&id);
            self.counters.outcomes_forgotten += 1;
        }
    }

    /// Answers `FORGOTTEN` to a candidate or a vote (`answer`: one that needs none) of
    /// transaction `id` if this partition forgot it; whether it did.
    pub(crate) fn answer_forgotten(
        &mut self,
        from: NodeId,
        id: TxId,
        expiry: u64,
        answer: bool,
    ) -> bool {
        if !self.certifier.is_forgotten(id, expiry) {
            return false;
        }
        if !answer {
            self.counters.answered_forgotten += 1;
            self.send(from, Body::Forgotten { tx: id });
        }
        true
    }

    /// `FORGOTTEN` from a leader of partition `p`: its coordinator takes the outcome as
    /// unknown; this leader, if undecided, as `p`'s abort.
    pub(crate) fn forgotten_in(&mut self, from: NodeId, id: TxId) {
        let Some(member) = self.member(from) else { return };
        let p = member.partition;
        if id.node == self.me.node.0 {
            let waits = self.coordinator.txs.get(&id).and_then(|tx| match &tx.pending {
                Pending::Certifying { tag, waiting, .. } if waiting.contains(&p) => Some(*tag),
                _ => None,
            });
            if let Some(tag) = waits {
                self.counters.forgotten_taken += 1;
                self.close(id);
                if let Some(tag) = tag {
                    self.reply(tag, Err(KeelError::Timeout));
                }
            }
        }
        if !self.leads() {
            return self.hold(from, Body::Forgotten { tx: id });
        }
        let Some(ballot) = self.certifier.ballots.get_mut(&id) else { return };
        if ballot.votes.contains_key(&p) || !ballot.participants.contains(&p) {
            return;
        }
        ballot.votes.insert(p, (false, 0));
        self.counters.forgotten_taken += 1;
        self.try_decide(id);
    }
}
