//! Client requests at the leader: writes (appended, deduplicated, acknowledged at their
//! durability point), reads at each level (lease, no-op, durability check, rounds), and
//! their deadlines.
//!
//! | level | at the leader |
//! |---|---|
//! | `any` | applied state, at once |
//! | `monotonic` | lease; then serve if `update_index ≤` the read point (`min(durable, persisted)`), wait for the own fsync if only `≤ durable_index`, else a round |
//! | `linearizable` | lease and the epoch's no-op committed; then as `monotonic` |

use super::{expiry, Leading, PendingRead, PendingWrite};
use crate::engine::reused_request;
use crate::leader::coll::ELEMENT_OVERHEAD_BYTES;
use crate::leader::core::{Core, Origin};
use crate::leader::io::{ClientReply, ClientRequest, RequestTag};
use crate::leader::kv::{command_digest, item_bytes, Applied, WriteResult, ITEM_OVERHEAD_BYTES};
use keel_types::{
    ClusterOp, Command, Durability, Entry, EntryPayload, KeelError, LogIndex, ReadLevel,
};

impl Leading {
    /// A write: refused past the limits, answered from the dedup table when it is a
    /// retry, else appended and acknowledged at its durability point.
    pub fn write(&mut self, core: &mut Core, origin: Origin, request: ClientRequest) {
        if let Command::Cluster(ClusterOp::TransferLeader(target)) = request.command {
            return self.transfer_leadership(core, origin, request.tag, target);
        }
        if let Some(refusal) = self.transfer_refusal() {
            return core.reply_result(origin, request.tag, Err(refusal), false);
        }
        if let Command::Cluster(op) = request.command {
            return self.change_membership(core, origin, request.tag, op);
        }
        let mut durability = request.durability.unwrap_or(core.config.durability_default);
        if matches!(request.command, Command::Slot(_)) {
            // A slot's move rests on every step it was answered for: none may be lost
            // (`kv_slots`), whatever the request asked.
            durability = Durability::Durable;
        }
        if let Err(error) = core.kv.session_open(request.client, &request.command) {
            core.counters.sessions_expired += 1;
            return core.reply_result(origin, request.tag, Err(error), false);
        }
        if core.kv.open_is_stale(request.client, &request.command) {
            core.counters.sessions_expired += 1;
            core.counters.stale_opens_refused += 1;
            return core.reply_result(origin, request.tag, Err(KeelError::SessionExpired), false);
        }
        // A slot's step is idempotent and never deduplicated (`Kv::apply_write`).
        let skip = core.config.unsafe_skip_dedup || matches!(request.command, Command::Slot(_));
        if let Some(slot) = core.kv.dedup(request.client).filter(|_| !skip) {
            if slot.request == request.request {
                let digest = command_digest(request.command.unasked().0);
                if slot.digest.is_some_and(|d| d != digest) {
                    let error = reused_request(request.client, request.request);
                    return core.reply_result(origin, request.tag, Err(error), false);
                }
                // A retry of an applied write: answer it once its entry reaches the point.
                let (index, result) = (slot.index, slot.result.clone());
                core.counters.retries_deduplicated += 1;
                return self.await_write(core, origin, request.tag, index, durability, result);
            }
            if slot.request > request.request {
                let error = KeelError::InvalidArgument(
                    "request id older than the client's last write".into(),
                );
                return core.reply_result(origin, request.tag, Err(error), false);
            }
        }
        if let Err(error) = admit_write(core, &request.command) {
            return core.reply_result(origin, request.tag, Err(error), false);
        }
        self.reap_touched(core, &request.command);
        let index = core.log.last_index().next();
        let payload = EntryPayload::Write {
            client: request.client,
            request: request.request,
            durability,
            command: expiry::stamp_time(request.command, core.wall_ms()),
        };
        let entry = Entry { epoch: core.hard.epoch, index, payload };
        let Applied::Write(result) = core.append_entry(entry) else {
            unreachable!("a write entry yields a write result")
        };
        if durability == Durability::Durable {
            // Immediate durability: fsync here and ask every follower to, now.
            core.request_sync(index);
            self.flush_for_writes = self.flush_for_writes.max(index);
        }
        // Sent at the end of the step, with every other entry the step appended.
        self.append_due = true;
        self.await_write(core, origin, request.tag, index, durability, result);
    }

    fn await_write(
        &mut self,
        core: &mut Core,
        origin: Origin,
        tag: RequestTag,
        index: LogIndex,
        durability: Durability,
        result: WriteResult,
    ) {
        assert!(index <= core.log.last_index());
        if durability == Durability::Memory {
            return core.reply_result(origin, tag, result, false);
        }
        let deadline = core.now + core.config.request_timeout;
        let write = PendingWrite { origin, tag, result };
        match durability {
            Durability::Memory => unreachable!("answered above"),
            Durability::Replicated => self.writes_replicated.push(index, deadline, write),
            Durability::Durable => self.writes_durable.push(index, deadline, write),
        }
    }

    /// A read: `any` at once; other levels wait in `answer_reads` at the end of the step.
    pub fn read(&mut self, core: &mut Core, origin: Origin, request: ClientRequest) {
        let level = request.level.unwrap_or(core.config.read_level_default);
        if level == ReadLevel::Any {
            let (result, _) = core.execute_read(&request.command);
            return core.reply_result(origin, request.tag, result, false);
        }
        let deadline = core.now + core.config.request_timeout;
        // Executed once the lease holds (and, for `linearizable`, this epoch's no-op is
        // committed), at the end of the step at the earliest.
        let after = if level == ReadLevel::Linearizable { self.noop_index } else { LogIndex::ZERO };
        self.reads_unplaced.push(after, deadline, PendingRead { origin, request, round: false });
    }

    /// Acknowledges writes whose durability point has been reached (only those: the
    /// waiting writes are indexed by their point).
    pub(super) fn answer_writes(&mut self, core: &mut Core) {
        let replicated = self.writes_replicated.pop_through(core.commit_index);
        let durable = self.writes_durable.pop_through(self.persisted_majority);
        for (_, write) in replicated.into_iter().chain(durable) {
            let reply = ClientReply {
                tag: write.tag,
                served_by: core.config.node_id,
                result: write.result,
                durability_round: false,
            };
            core.reply(write.origin, reply);
        }
    }

    /// Serves every waiting read that may be served now and starts the round or the
    /// fsync the others need. Touches only reads that became servable: reads wait
    /// unexecuted for the lease (and the no-op), then by the update index they need at
    /// the read point. A read is executed again when it is served: a newer write to its
    /// key may since have raised what it needs.
    pub(super) fn answer_reads(&mut self, core: &mut Core) {
        if !self.lease_valid(core) {
            return;
        }
        let read_point = core.read_point();
        let arrived = self.reads_unplaced.pop_through(core.commit_index);
        let due = self.reads_placed.pop_through(read_point);
        for (deadline, mut read) in arrived.into_iter().chain(due) {
            let (result, needed) = core.execute_read(&read.request.command);
            if needed <= read_point {
                if read.round {
                    core.counters.reads_with_round += 1;
                }
                core.reply_result(read.origin, read.request.tag, result, read.round);
                continue;
            }
            read.round |= needed > core.durable_index;
            self.reads_placed.push(needed, deadline, read);
        }
        let Some(needed) = self.reads_placed.index_max() else { return };
        if needed <= read_point {
            return;
        }
        // Durable on the active set, not yet on this new leader's own disk: wait for the
        // fsync asked for on election (asked again here, idempotently).
        let own = needed.min(core.durable_index);
        if own > read_point {
            core.request_sync(own);
        }
        if needed > core.durable_index && self.round.is_none_or(|(target, _)| target < needed) {
            self.ensure_round(core, needed);
        }
    }

    /// Times out reads and writes that waited too long. A write that times out stays in
    /// the log (its outcome is unknown to the client, which retries with the same
    /// `(client, request)` and is answered from the dedup table, never applied twice).
    pub fn expire_requests(&mut self, core: &mut Core) {
        let now = core.now;
        let mut writes = self.writes_replicated.pop_expired(now);
        writes.extend(self.writes_durable.pop_expired(now));
        for write in writes {
            core.counters.writes_timed_out += 1;
            core.reply_result(write.origin, write.tag, Err(KeelError::Timeout), false);
        }
        let mut reads = self.reads_unplaced.pop_expired(now);
        reads.extend(self.reads_placed.pop_expired(now));
        for read in reads {
            core.reply_result(read.origin, read.request.tag, Err(KeelError::Timeout), read.round);
        }
    }
}

/// Whether the leader may append a write now: the state has room for what it adds, and
/// the log above the durable index (whose undo records are kept) is not too long.
fn admit_write(core: &Core, command: &Command) -> Result<(), KeelError> {
    let command = command.unasked().0;
    let grows = match command {
        Command::Put { key, value }
        | Command::Cas { key, new: value, .. }
        | Command::Set { key, value, .. } => (key.len() + value.len()) as u64,
        Command::Incr { key, .. } => key.len() as u64 + 20,
        // What an in-place change may add: its bytes, or the zeros before its offset.
        Command::Modify { key, op, .. } => {
            key.len() as u64
                + match op {
                    keel_types::Modify::Append(value) => value.len() as u64,
                    keel_types::Modify::SetRange { offset, value } => {
                        offset.saturating_add(value.len() as u64)
                    }
                    keel_types::Modify::SetBit { offset, .. } => offset / 8 + 1,
                    _ => 32,
                }
        }
        // A copy of a collection adds all of it.
        Command::Transfer { from, to, .. } => {
            to.len() as u64 + core.kv.item(from).map_or(0, |item| item_bytes(from, item))
        }
        // Its elements with their overhead, and for the forms that build a collection
        // from others (`SUNIONSTORE`, `ZRANGESTORE`, ...), at most all of those.
        Command::Coll { key, op } => {
            let copied: u64 = match **op {
                keel_types::coll::CollOp::SStore { .. }
                | keel_types::coll::CollOp::ZStore { .. }
                | keel_types::coll::CollOp::ZRangeStore { .. } => op
                    .other_keys()
                    .iter()
                    .map(|k| core.kv.item(k).map_or(0, |item| item_bytes(k, item)))
                    .sum(),
                _ => 0,
            };
            let elements = op.elements() as u64 * ELEMENT_OVERHEAD_BYTES;
            key.len() as u64 + op.payload_bytes() as u64 + elements + copied
        }
        // The element's key (reserved prefix, name, sequence) and value, and the meta
        // key of a new queue.
        Command::Enqueue { queue, value } => 2 * queue.len() as u64 + value.len() as u64 + 64,
        Command::Multi { ops, .. } => ops.iter().map(|op| op.payload_bytes() as u64 + 20).sum(),
        _ => 0,
    };
    if let Command::Modify { key, op, .. } = command {
        // A value changed in place stays within the value limit, as a written one does.
        let len = core.kv.get(key).0.map_or(0, |v| v.len() as u64);
        let grown = match op {
            keel_types::Modify::Append(more) => len + more.len() as u64,
            keel_types::Modify::SetRange { offset, value } if !value.is_empty() => {
                len.max(offset.saturating_add(value.len() as u64))
            }
            keel_types::Modify::SetBit { offset, .. } => len.max(offset / 8 + 1),
            _ => 0,
        };
        let max = core.config.limits.value_bytes_max;
        if grown > u64::from(max) {
            return Err(KeelError::ValueTooLarge { len: grown, max });
        }
    }
    if grows > 0
        && core.kv.state_bytes() + grows + ITEM_OVERHEAD_BYTES > core.config.state_bytes_max
    {
        return Err(KeelError::Unavailable(format!(
            "the state holds {} bytes, the limit",
            core.kv.state_bytes()
        )));
    }
    let backlog = core.log.last_index().0.saturating_sub(core.durable_index.0);
    if backlog >= core.config.undurable_entries_max {
        return Err(KeelError::Busy(format!("{backlog} entries not yet durable")));
    }
    Ok(())
}
