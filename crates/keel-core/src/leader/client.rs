//! Client requests: validation and limits, writes at the leader (with deduplication),
//! reads at each level, forwarding from followers, and request deadlines.
//!
//! | level | at the leader | at a follower |
//! |---|---|---|
//! | `any` | applied state, at once | applied state, at once (if `follower_reads`) |
//! | `monotonic` | lease; then serve if `update_index ≤` the read point (`min(durable, persisted)`), wait for the own fsync if only `≤ durable_index`, else a round | serve if active and `update_index ≤` its read point, else forward |
//! | `linearizable` | lease and the epoch's no-op committed; then as `monotonic` | forward |

use super::engine::LeaderEngine;
use super::io::{ClientReply, ClientRequest, Message, RequestTag, Role};
use super::kv::{Applied, WriteResult};
use super::replication::{PendingRead, PendingWrite};
use crate::time::Time;
use keel_types::{
    Command, CommandResult, Durability, Entry, EntryPayload, Epoch, KeelError, LogIndex, NodeId,
    ReadLevel,
};

/// Where a request came from, so its reply goes back the same way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A client of this node.
    Local,
    /// A client of `NodeId`, forwarded here.
    Forwarded(NodeId),
}

/// A request this follower forwarded to the leader and still waits on.
#[derive(Clone, Copy, Debug)]
pub(super) struct Forwarded {
    /// When to give up with `Timeout`.
    pub deadline: Time,
    /// Writes that fail have an unknown outcome; reads just did not happen.
    pub is_write: bool,
}

impl LeaderEngine {
    /// Sends a reply to a local client or back to the forwarding node.
    pub(super) fn reply(&mut self, origin: Origin, reply: ClientReply) {
        match origin {
            Origin::Local => self.out.replies.push(reply),
            Origin::Forwarded(node) => {
                let message = Message::ForwardReply { epoch: self.hard.epoch, reply };
                self.out.messages.push((node, message));
            }
        }
    }

    fn reply_result(
        &mut self,
        origin: Origin,
        tag: RequestTag,
        result: WriteResult,
        durability_round: bool,
    ) {
        let reply = ClientReply { tag, served_by: self.config.node_id, result, durability_round };
        self.reply(origin, reply);
    }

    fn pending_len(&self) -> usize {
        self.forwards.len() + self.leading.as_ref().map_or(0, |l| l.pending_len())
    }

    pub(super) fn on_client(&mut self, origin: Origin, request: ClientRequest) {
        if let Err(error) = request.command.validate(&self.config.limits) {
            return self.reply_result(origin, request.tag, Err(error), false);
        }
        if self.pending_len() >= self.config.pending_requests_max {
            let error = KeelError::Busy(format!("{} requests pending", self.pending_len()));
            return self.reply_result(origin, request.tag, Err(error), false);
        }
        let is_leader = self.role == Role::Leader;
        if request.command.is_write() {
            return if is_leader {
                self.leader_write(origin, request)
            } else {
                self.forward(origin, request)
            };
        }
        let level = request.level.unwrap_or(self.config.read_level_default);
        match (level, is_leader) {
            (_, true) => self.leader_read(origin, request),
            (ReadLevel::Any, false) if self.config.follower_reads && origin == Origin::Local => {
                let (result, _) = self.execute_read(&request.command);
                self.reply_result(origin, request.tag, Ok(result), false);
            }
            (ReadLevel::Monotonic, false)
                if self.config.follower_reads && origin == Origin::Local =>
            {
                let (result, needed) = self.execute_read(&request.command);
                if self.follower_active() && needed <= self.read_point() {
                    self.reply_result(origin, request.tag, Ok(result), false);
                } else {
                    self.forward(origin, request);
                }
            }
            _ => self.forward(origin, request),
        }
    }

    /// Executes a read on applied state; returns the result and the index that must be
    /// durable before it may be served at `monotonic` or above.
    fn execute_read(&self, command: &Command) -> (CommandResult, LogIndex) {
        match command {
            Command::Get { key } => {
                let (value, version) = self.kv.get(key);
                (CommandResult::Value { value, version }, self.kv.update_index(key))
            }
            Command::Scan { start, end, limit } => {
                let (items, needed) = self.kv.scan(start, end.as_deref(), *limit);
                (CommandResult::Items { items }, needed)
            }
            _ => panic!("execute_read on a write"),
        }
    }

    fn forward(&mut self, origin: Origin, request: ClientRequest) {
        let leader = self.leader.filter(|l| *l != self.config.node_id);
        match (origin, leader) {
            (Origin::Local, Some(leader)) => {
                if self.forwards.contains_key(&request.tag) {
                    let error = KeelError::InvalidArgument("request tag already pending".into());
                    return self.reply_result(origin, request.tag, Err(error), false);
                }
                let deadline = self.now + self.config.request_timeout;
                let is_write = request.command.is_write();
                self.forwards.insert(request.tag, Forwarded { deadline, is_write });
                self.counters.forwarded += 1;
                let message = Message::Forward { epoch: self.hard.epoch, request };
                self.out.messages.push((leader, message));
            }
            _ => {
                let error = self.not_leader_error();
                self.reply_result(origin, request.tag, Err(error), false);
            }
        }
    }

    pub(super) fn on_forward(&mut self, from: NodeId, epoch: Epoch, request: ClientRequest) {
        if epoch > self.hard.epoch {
            self.become_follower(epoch, None);
        }
        if self.role != Role::Leader {
            let error = self.not_leader_error();
            return self.reply_result(Origin::Forwarded(from), request.tag, Err(error), false);
        }
        self.on_client(Origin::Forwarded(from), request);
    }

    pub(super) fn on_forward_reply(&mut self, _epoch: Epoch, reply: ClientReply) {
        if self.forwards.remove(&reply.tag).is_some() {
            self.out.replies.push(reply);
        }
    }

    fn leader_write(&mut self, origin: Origin, request: ClientRequest) {
        assert_eq!(self.role, Role::Leader);
        let durability = request.durability.unwrap_or(self.config.durability_default);
        if let Some(slot) = self.kv.dedup(request.client) {
            if slot.request == request.request {
                // A retry of an applied write: answer it once its entry reaches the point.
                let (index, result) = (slot.index, slot.result.clone());
                return self.await_write(origin, request.tag, index, durability, result);
            }
            if slot.request > request.request {
                let error = KeelError::InvalidArgument(
                    "request id older than the client's last write".into(),
                );
                return self.reply_result(origin, request.tag, Err(error), false);
            }
        }
        let grows = match &request.command {
            Command::Put { key, value } | Command::Cas { key, new: value, .. } => {
                (key.len() + value.len()) as u64
            }
            Command::Incr { key, .. } => key.len() as u64 + 20,
            _ => 0,
        };
        if grows > 0
            && self.kv.state_bytes() + grows + super::kv::ITEM_OVERHEAD_BYTES
                > self.config.state_bytes_max
        {
            let error = KeelError::Unavailable(format!(
                "the state holds {} bytes, the limit",
                self.kv.state_bytes()
            ));
            return self.reply_result(origin, request.tag, Err(error), false);
        }
        let backlog = self.log.last_index().0.saturating_sub(self.durable_index.0);
        if backlog >= self.config.undurable_entries_max {
            let error = KeelError::Busy(format!("{backlog} entries not yet durable"));
            return self.reply_result(origin, request.tag, Err(error), false);
        }
        let index = self.log.last_index().next();
        let payload = EntryPayload::Write {
            client: request.client,
            request: request.request,
            durability,
            command: request.command,
        };
        let entry = Entry { epoch: self.hard.epoch, index, payload };
        let Applied::Write(result) = self.append_entry(entry) else {
            unreachable!("a write entry yields a write result")
        };
        if durability == Durability::Durable {
            // Immediate durability: fsync here and ask every follower to, now.
            self.request_sync(index);
            let leading = self.leading.as_mut().expect("leader");
            leading.flush_for_writes = leading.flush_for_writes.max(index);
        }
        self.broadcast_append(false);
        self.await_write(origin, request.tag, index, durability, result);
    }

    fn await_write(
        &mut self,
        origin: Origin,
        tag: RequestTag,
        index: LogIndex,
        durability: Durability,
        result: WriteResult,
    ) {
        assert!(index <= self.log.last_index());
        if durability == Durability::Memory {
            return self.reply_result(origin, tag, result, false);
        }
        let write = PendingWrite { origin, tag, index, durability, result };
        self.leading.as_mut().expect("leader").writes.push(write);
    }

    fn leader_read(&mut self, origin: Origin, request: ClientRequest) {
        let level = request.level.unwrap_or(self.config.read_level_default);
        if level == ReadLevel::Any {
            let (result, _) = self.execute_read(&request.command);
            return self.reply_result(origin, request.tag, Ok(result), false);
        }
        let deadline = self.now + self.config.request_timeout;
        let read = PendingRead { origin, request, deadline, round: false };
        self.leading.as_mut().expect("leader").reads.push(read);
        // Served (or a round started) in `answer_reads` at the end of the step.
    }

    /// Serves every waiting read that may be served now; starts a round for those that
    /// need one. Re-checks each read's update index at serve time.
    pub(super) fn answer_reads(&mut self) {
        let lease = self.leader_lease_valid();
        let leading = self.leading.as_mut().expect("leader");
        let noop_committed = self.commit_index >= leading.noop_index;
        let reads = std::mem::take(&mut leading.reads);
        let mut waiting = Vec::new();
        let mut round_needed = None;
        let round_in_flight = leading.round;
        for mut read in reads {
            let level = read.request.level.unwrap_or(self.config.read_level_default);
            if !lease || (level == ReadLevel::Linearizable && !noop_committed) {
                waiting.push(read);
                continue;
            }
            let (result, needed) = self.execute_read(&read.request.command);
            if needed <= self.read_point() {
                if read.round {
                    self.counters.reads_with_round += 1;
                }
                self.reply_result(read.origin, read.request.tag, Ok(result), read.round);
                continue;
            }
            if needed <= self.durable_index {
                // Durable on the active set, not yet on this new leader's own disk: wait
                // for the fsync asked for on election (asked again here, idempotently).
                self.request_sync(needed);
                waiting.push(read);
                continue;
            }
            read.round = true;
            if round_in_flight.is_none_or(|target| target < needed) {
                round_needed = Some(round_needed.map_or(needed, |n: LogIndex| n.max(needed)));
            }
            waiting.push(read);
        }
        self.leading.as_mut().expect("leader").reads = waiting;
        if let Some(needed) = round_needed {
            self.ensure_round(needed);
        }
    }

    /// Answers every forwarded request at once when the epoch changes: the leader they
    /// went to is deposed. Writes get `Timeout` (outcome unknown), reads `NotLeader`.
    pub(super) fn fail_forwards(&mut self) {
        let forwards = std::mem::take(&mut self.forwards);
        for (tag, forwarded) in forwards {
            let error = if forwarded.is_write {
                KeelError::Timeout
            } else {
                KeelError::NotLeader { leader: None }
            };
            self.reply_result(Origin::Local, tag, Err(error), false);
        }
        assert!(self.forwards.is_empty());
    }

    /// Times out forwarded requests and reads that waited too long.
    pub(super) fn expire_requests(&mut self) {
        let now = self.now;
        let expired: Vec<RequestTag> =
            self.forwards.iter().filter(|(_, f)| now >= f.deadline).map(|(t, _)| *t).collect();
        for tag in expired {
            self.forwards.remove(&tag);
            self.reply_result(Origin::Local, tag, Err(KeelError::Timeout), false);
        }
        let Some(leading) = self.leading.as_mut() else { return };
        let (expired, waiting): (Vec<PendingRead>, Vec<PendingRead>) =
            std::mem::take(&mut leading.reads).into_iter().partition(|r| now >= r.deadline);
        leading.reads = waiting;
        for read in expired {
            self.reply_result(read.origin, read.request.tag, Err(KeelError::Timeout), read.round);
        }
    }
}
