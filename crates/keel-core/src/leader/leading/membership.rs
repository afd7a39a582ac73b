//! Membership changes at the leader (`docs/protocol.md` §15): one node at a time, each a
//! membership entry that takes effect on every replica when appended and is answered
//! once committed; the next waits for it.
//!
//! | change | refused while |
//! |---|---|
//! | any | this epoch's first entry or the last change is not yet committed |
//! | add a learner | already a voter; two learners already |
//! | promote | not a learner; it lacks a committed entry; seven voters already |
//! | remove | it is this leader (transfer first); two voters left |
//!
//! and every change while the active set would then miss a majority of the new voters.

use super::{Leading, PendingWrite};
use crate::leader::core::{Core, Origin};
use crate::leader::io::RequestTag;
use keel_types::{ClusterOp, CommandResult, Entry, EntryPayload, KeelError, Membership, NodeId};

impl Leading {
    /// A change of membership asked by a client (or forwarded): appended if it may be
    /// made now, answered once committed; answered at once if already in effect.
    pub fn change_membership(
        &mut self,
        core: &mut Core,
        origin: Origin,
        tag: RequestTag,
        op: ClusterOp,
    ) {
        let next = match self.admit_change(core, op) {
            Ok(next) => next,
            Err(error) => return core.reply_result(origin, tag, Err(error), false),
        };
        let Some(next) = next else {
            // Already in effect: answered as done once the entry that made it commits.
            let version = core.membership_version();
            let done = Ok(CommandResult::Written { version });
            if version.index <= core.commit_index {
                return core.reply_result(origin, tag, done, false);
            }
            let deadline = core.now + core.config.request_timeout;
            let write = PendingWrite { origin, tag, result: done };
            return self.writes_replicated.push(version.index, deadline, write);
        };
        let index = core.log.last_index().next();
        let entry =
            Entry { epoch: core.hard.epoch, index, payload: EntryPayload::Membership(next) };
        let version = entry.version();
        core.append_entry(entry);
        self.sync_membership(core);
        self.append_due = true;
        let deadline = core.now + core.config.request_timeout;
        let write = PendingWrite { origin, tag, result: Ok(CommandResult::Written { version }) };
        self.writes_replicated.push(index, deadline, write);
    }

    /// The membership `op` leads to (`None`: already in effect), or why not now.
    fn admit_change(&self, core: &Core, op: ClusterOp) -> Result<Option<Membership>, KeelError> {
        let me = core.config.node_id;
        if core.commit_index < self.noop_index {
            return Err(KeelError::Busy("this leader's first entry is not yet committed".into()));
        }
        let pending = core.membership_version().index;
        if pending > core.commit_index {
            let why = format!("the membership change at index {pending} is not yet committed");
            return Err(KeelError::Busy(why));
        }
        if !core.log_has_room() {
            return Err(KeelError::Busy("the log's undurable entries are at their bound".into()));
        }
        if let ClusterOp::Remove(node) = op {
            if node == me {
                let why = format!("node {} leads: transfer its leadership first", me.0);
                return Err(KeelError::InvalidArgument(why));
            }
        }
        let next = core.membership().changed(op).map_err(KeelError::InvalidArgument)?;
        let Some(next) = next else { return Ok(None) };
        if let ClusterOp::Promote(node) = op {
            self.caught_up(core, node)?;
        }
        // The durable index counts on the active set meeting every majority of voters.
        let active = 1 + self.active.iter().filter(|f| next.is_voter(**f)).count();
        let needed = next.voters.len() - next.majority() + 1;
        if active < needed {
            return Err(KeelError::Busy(format!(
                "the active set holds {active} of the new voters, the change needs {needed}"
            )));
        }
        Ok(Some(next))
    }

    /// Whether a learner holds every committed entry (a voter that lacks them would at
    /// once hold back commits and elections).
    fn caught_up(&self, core: &Core, node: NodeId) -> Result<(), KeelError> {
        let matched = self.progress.get(&node).map_or(Default::default(), |p| p.match_index);
        if matched < core.commit_index {
            return Err(KeelError::Busy(format!(
                "node {} holds the log through {matched}, the commit index is {}: let it catch up",
                node.0, core.commit_index
            )));
        }
        Ok(())
    }
}
