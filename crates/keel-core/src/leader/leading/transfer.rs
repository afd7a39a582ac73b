//! Leadership transfer at the leader (`docs/protocol.md` §16): on an operator's request
//! the leader stops taking writes, waits until the target's log matches its own, then
//! gives up its leader lease for the rest of its epoch and tells the target to campaign
//! at once (`TimeoutNow`). Voters of this epoch may vote for that candidate although
//! they heard this leader recently: the stickiness they would keep protects only this
//! leader's lease, which it no longer uses.
//!
//! ```text
//!   asked ──target's log matches──► lease given up, TimeoutNow sent ──target leads──► answered
//!     │                                        │
//!     └─ election timeout: given up ◄─┘ election timeout: this node campaigns itself
//! ```
//!
//! The lease is given up for good: a vote request for the next epoch marked as a
//! transfer may reach a voter of this epoch at any time later, so a lease this leader
//! earned again would not be safe. If the target does not take over in time, this node
//! steps down and campaigns in the next epoch the same way.

use super::Leading;
use crate::leader::core::{Core, Origin, TransferWait};
use crate::leader::io::{Message, RequestTag};
use crate::time::Time;
use keel_types::{CommandResult, KeelError, NodeId, Version};

/// A transfer this leader is making.
#[derive(Clone, Copy, Debug)]
pub(in crate::leader) struct Transfer {
    /// The voter that is to lead.
    pub target: NodeId,
    /// Catching up: when the transfer is given up. Handed over: when this node
    /// campaigns itself.
    pub deadline: Time,
    /// `TimeoutNow` went out: this leader holds no lease for the rest of its epoch.
    pub handed_over: bool,
}

/// What a transfer's deadline asks of the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::leader) enum TransferDue {
    /// Nothing, or a transfer given up before the hand-over (this node goes on leading).
    Nothing,
    /// The target did not take over: step down and campaign in the next epoch.
    Campaign,
}

impl Leading {
    /// A transfer asked by a client (or forwarded): refused if one is under way or this
    /// epoch's first entry is not committed; answered at once if `target` is this node.
    pub fn transfer_leadership(
        &mut self,
        core: &mut Core,
        origin: Origin,
        tag: RequestTag,
        target: NodeId,
    ) {
        let me = core.config.node_id;
        let same = self.transfer.is_some_and(|t| t.target == target);
        if same && matches!(origin, Origin::Forwarded(_)) {
            // Another copy (the network duplicates) or another node's: the node that
            // forwarded it answers it once it hears who leads next.
            return;
        }
        let refusal = if self.transfer.is_some() || core.transfer_wait.is_some() {
            KeelError::Busy("a leadership transfer is under way".into())
        } else if target == me {
            let version = Version { epoch: core.hard.epoch, index: Default::default() };
            return core.reply_result(origin, tag, Ok(CommandResult::Written { version }), false);
        } else if !core.is_voter(target) {
            KeelError::InvalidArgument(format!("node {} does not vote here", target.0))
        } else if core.commit_index < self.noop_index {
            KeelError::Busy("this leader's first entry is not yet committed".into())
        } else {
            let deadline = core.now + core.config.election_timeout_max;
            self.transfer = Some(Transfer { target, deadline, handed_over: false });
            core.transfer_wait = Some(TransferWait {
                origin,
                tag,
                target,
                epoch: core.hard.epoch,
                deadline: core.transfer_deadline(),
                asked_as_leader: true,
            });
            return self.hand_over_if_caught_up(core);
        };
        core.reply_result(origin, tag, Err(refusal), false);
    }

    /// Why writes wait: a transfer is under way (its target must catch up and then hold
    /// the log's end).
    pub fn transfer_refusal(&self) -> Option<KeelError> {
        let transfer = self.transfer.as_ref()?;
        Some(KeelError::Busy(format!("leadership is moving to node {}", transfer.target.0)))
    }

    /// Sends `TimeoutNow` once the target's log matches this leader's, giving up the
    /// lease first. Called after every step while a transfer is under way.
    pub fn hand_over_if_caught_up(&mut self, core: &mut Core) {
        let Some(transfer) = self.transfer.as_mut().filter(|t| !t.handed_over) else { return };
        let matched = self.progress.get(&transfer.target).map(|p| p.match_index);
        if matched != Some(core.log.last_index()) {
            return;
        }
        transfer.handed_over = true;
        transfer.deadline = core.now + core.config.election_timeout_min;
        self.lease_given_up = !core.config.unsafe_transfer_keeps_lease;
        core.counters.transfers_handed_over += 1;
        let message = Message::TimeoutNow {
            epoch: core.hard.epoch,
            last_epoch: core.log.last_epoch(),
            last_index: core.log.last_index(),
        };
        core.out.messages.push((transfer.target, message));
    }

    /// The transfer's deadline, if it passed.
    pub fn transfer_due(&mut self, core: &mut Core) -> TransferDue {
        let Some(transfer) = self.transfer.filter(|t| core.now >= t.deadline) else {
            return TransferDue::Nothing;
        };
        if transfer.handed_over {
            return TransferDue::Campaign;
        }
        self.transfer = None;
        let why = format!("node {} did not catch up in time", transfer.target.0);
        core.settle_transfer(Err(KeelError::Busy(why)));
        TransferDue::Nothing
    }
}
