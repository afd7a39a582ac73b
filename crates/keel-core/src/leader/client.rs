//! Client requests as they enter the engine: validation and limits, then to the role that
//! serves them. The leader writes and reads (`leading/requests.rs`); a follower serves
//! `any` reads and `monotonic` reads it may serve, and forwards the rest
//! (`follower.rs`); a candidate knows no leader.
//!
//! | level | at a follower |
//! |---|---|
//! | `any` | applied state, at once (if `follower_reads`) |
//! | `monotonic` | serve if active and `update_index ≤` its read point, else forward |
//! | `linearizable` | forward |

use super::core::Origin;
use super::engine::{LeaderEngine, RoleState};
use super::io::{ClientReply, ClientRequest};
use crate::time::Time;
use keel_types::{Command, Epoch, KeelError, NodeId, ReadLevel, Version};

impl LeaderEngine {
    /// A read this node would answer at once from its applied state if it arrived, alone,
    /// in a step at local time `now`; `None` for anything else (writes, reads that wait
    /// for the lease, the no-op or a durability round, reads to forward, and invalid
    /// requests, whose error the step gives). Changes nothing: drivers call it off the
    /// engine loop, between steps (`docs/protocol.md` §7, reads off the loop).
    ///
    /// The same rules as [`LeaderEngine::on_client`] and `answer_reads`: `any` at once
    /// (a follower only if `follower_reads`); `monotonic` at the leader under its lease,
    /// at an active follower (if `follower_reads`); a follower only once it has applied
    /// the request's session floor (`after`); when the key's update index is at or
    /// below the read point; `linearizable` at the leader under its lease once this
    /// epoch's no-op is committed, likewise.
    pub fn read_now(&self, request: &ClientRequest, now: Time) -> Option<ClientReply> {
        let core = &self.core;
        let now = now.max(core.now);
        if request.command.is_write() || request.command.validate(&core.config.limits).is_err() {
            return None;
        }
        let level = request.level.unwrap_or(core.config.read_level_default);
        // Elsewhere than at the leader, not before the client's own writes are applied.
        let caught_up = core.kv.applied_index() >= request.after;
        let may_serve = match (&self.role, level) {
            (RoleState::Leader(_), ReadLevel::Any) => true,
            (RoleState::Leader(leading), ReadLevel::Monotonic) => leading.lease_valid_at(core, now),
            (RoleState::Leader(leading), ReadLevel::Linearizable) => {
                leading.noop_index <= core.commit_index && leading.lease_valid_at(core, now)
            }
            (_, ReadLevel::Any) => core.config.follower_reads && caught_up,
            (RoleState::Follower(following), ReadLevel::Monotonic) => {
                core.config.follower_reads && following.active_at(now) && caught_up
            }
            _ => false,
        };
        if !may_serve {
            return None;
        }
        let (result, needed) = core.execute_read(&request.command);
        let checked = level != ReadLevel::Any && !core.config.unsafe_view_reads_unchecked;
        if checked && needed > core.read_point() {
            return None;
        }
        Some(ClientReply {
            tag: request.tag,
            served_by: core.config.node_id,
            result,
            durability_round: false,
        })
    }

    fn pending_len(&self) -> usize {
        match &self.role {
            RoleState::Follower(following) => following.forwards.len(),
            RoleState::Leader(leading) => leading.pending_len(),
            RoleState::Candidate(_) => 0,
        }
    }

    pub(super) fn on_client(&mut self, origin: Origin, mut request: ClientRequest) {
        let core = &mut self.core;
        if let (Origin::Local, Command::OpenSession { seen }) = (origin, &mut request.command) {
            // Stamped where it arrives, once (`Kv::open_is_stale`); a forwarded copy
            // keeps the stamp of the node its client sent it to.
            *seen = Some(Version { epoch: core.log.last_epoch(), index: core.log.last_index() });
        }
        if let Err(error) = request.command.validate(&core.config.limits) {
            return core.reply_result(origin, request.tag, Err(error), false);
        }
        let pending = self.pending_len();
        let core = &mut self.core;
        if pending >= core.config.pending_requests_max {
            let error = KeelError::Busy(format!("{pending} requests pending"));
            return core.reply_result(origin, request.tag, Err(error), false);
        }
        let level = request.level.unwrap_or(core.config.read_level_default);
        // A follower reads for its own clients only, once it has applied the client's
        // own writes (its session floor); else the leader answers.
        let local_reads = core.config.follower_reads
            && origin == Origin::Local
            && core.kv.applied_index() >= request.after;
        let is_write = request.command.is_write();
        match &mut self.role {
            RoleState::Leader(leading) if is_write => leading.write(core, origin, request),
            RoleState::Leader(leading) => leading.read(core, origin, request),
            RoleState::Follower(_) | RoleState::Candidate(_)
                if !is_write && local_reads && level == ReadLevel::Any =>
            {
                let (result, _) = core.execute_read(&request.command);
                core.reply_result(origin, request.tag, result, false);
            }
            RoleState::Follower(following) if is_write => following.forward(core, origin, request),
            RoleState::Follower(following) if local_reads && level == ReadLevel::Monotonic => {
                let (result, needed) = core.execute_read(&request.command);
                if following.active(core) && needed <= core.read_point() {
                    core.reply_result(origin, request.tag, result, false);
                } else {
                    following.forward(core, origin, request);
                }
            }
            RoleState::Follower(following) => following.forward(core, origin, request),
            RoleState::Candidate(_) => {
                let error = KeelError::NotLeader { leader: None };
                core.reply_result(origin, request.tag, Err(error), false);
            }
        }
    }

    /// A request a follower forwarded here: served if this node leads, else refused with
    /// the leader it knows.
    pub(super) fn on_forward(&mut self, from: NodeId, epoch: Epoch, request: ClientRequest) {
        if epoch > self.core.hard.epoch {
            self.become_follower(epoch, None);
        }
        if !matches!(self.role, RoleState::Leader(_)) {
            let error = self.not_leader_error();
            let origin = Origin::Forwarded(from);
            return self.core.reply_result(origin, request.tag, Err(error), false);
        }
        self.on_client(Origin::Forwarded(from), request);
    }
}
