//! Client requests at the leader: writes (appended, deduplicated, acknowledged at their
//! durability point), reads at each level (lease, no-op, durability check, rounds), and
//! their deadlines.
//!
//! | level | at the leader |
//! |---|---|
//! | `any` | applied state, at once |
//! | `monotonic` | lease; then serve if `update_index ≤` the read point (`min(durable, persisted)`), wait for the own fsync if only `≤ durable_index`, else a round |
//! | `linearizable` | lease and the epoch's no-op committed; then as `monotonic` |

use super::{Leading, PendingRead, PendingWrite};
use crate::leader::core::{Core, Origin};
use crate::leader::io::{ClientReply, ClientRequest, RequestTag};
use crate::leader::kv::{Applied, WriteResult, ITEM_OVERHEAD_BYTES};
use keel_types::{Command, Durability, Entry, EntryPayload, KeelError, LogIndex, ReadLevel};

impl Leading {
    /// A write: refused past the limits, answered from the dedup table when it is a
    /// retry, else appended and acknowledged at its durability point.
    pub fn write(&mut self, core: &mut Core, origin: Origin, request: ClientRequest) {
        let durability = request.durability.unwrap_or(core.config.durability_default);
        if let Some(slot) = core.kv.dedup(request.client) {
            if slot.request == request.request {
                // A retry of an applied write: answer it once its entry reaches the point.
                let (index, result) = (slot.index, slot.result.clone());
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
        let index = core.log.last_index().next();
        let payload = EntryPayload::Write {
            client: request.client,
            request: request.request,
            durability,
            command: request.command,
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
        self.broadcast_append(core, false);
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
        self.writes.push(PendingWrite { origin, tag, index, durability, result, deadline });
    }

    /// A read: `any` at once; other levels wait in `answer_reads` at the end of the step.
    pub fn read(&mut self, core: &mut Core, origin: Origin, request: ClientRequest) {
        let level = request.level.unwrap_or(core.config.read_level_default);
        if level == ReadLevel::Any {
            let (result, _) = core.execute_read(&request.command);
            return core.reply_result(origin, request.tag, Ok(result), false);
        }
        let deadline = core.now + core.config.request_timeout;
        self.reads.push(PendingRead { origin, request, deadline, round: false });
    }

    /// Acknowledges writes whose durability point has been reached.
    pub(super) fn answer_writes(&mut self, core: &mut Core) {
        let commit = core.commit_index;
        let persisted_majority = self.persisted_majority;
        let (ready, waiting): (Vec<PendingWrite>, Vec<PendingWrite>) =
            std::mem::take(&mut self.writes).into_iter().partition(|w| match w.durability {
                Durability::Memory => true,
                Durability::Replicated => w.index <= commit,
                Durability::Durable => w.index <= persisted_majority,
            });
        self.writes = waiting;
        for write in ready {
            let reply = ClientReply {
                tag: write.tag,
                served_by: core.config.node_id,
                result: write.result,
                durability_round: false,
            };
            core.reply(write.origin, reply);
        }
    }

    /// Serves every waiting read that may be served now; starts a round for those that
    /// need one. Re-checks each read's update index at serve time.
    pub(super) fn answer_reads(&mut self, core: &mut Core) {
        let lease = self.lease_valid(core);
        let noop_committed = core.commit_index >= self.noop_index;
        let reads = std::mem::take(&mut self.reads);
        let mut waiting = Vec::new();
        let mut round_needed = None;
        let round_in_flight = self.round;
        for mut read in reads {
            let level = read.request.level.unwrap_or(core.config.read_level_default);
            if !lease || (level == ReadLevel::Linearizable && !noop_committed) {
                waiting.push(read);
                continue;
            }
            let (result, needed) = core.execute_read(&read.request.command);
            if needed <= core.read_point() {
                if read.round {
                    core.counters.reads_with_round += 1;
                }
                core.reply_result(read.origin, read.request.tag, Ok(result), read.round);
                continue;
            }
            if needed <= core.durable_index {
                // Durable on the active set, not yet on this new leader's own disk: wait
                // for the fsync asked for on election (asked again here, idempotently).
                core.request_sync(needed);
                waiting.push(read);
                continue;
            }
            read.round = true;
            if round_in_flight.is_none_or(|target| target < needed) {
                round_needed = Some(round_needed.map_or(needed, |n: LogIndex| n.max(needed)));
            }
            waiting.push(read);
        }
        self.reads = waiting;
        if let Some(needed) = round_needed {
            self.ensure_round(core, needed);
        }
    }

    /// Times out reads and writes that waited too long. A write that times out stays in
    /// the log (its outcome is unknown to the client, which retries with the same
    /// `(client, request)` and is answered from the dedup table, never applied twice).
    pub fn expire_requests(&mut self, core: &mut Core) {
        let now = core.now;
        if self.writes.iter().any(|w| now >= w.deadline) {
            let (expired, waiting): (Vec<PendingWrite>, Vec<PendingWrite>) =
                std::mem::take(&mut self.writes).into_iter().partition(|w| now >= w.deadline);
            self.writes = waiting;
            for write in expired {
                core.counters.writes_timed_out += 1;
                core.reply_result(write.origin, write.tag, Err(KeelError::Timeout), false);
            }
        }
        let (expired, waiting): (Vec<PendingRead>, Vec<PendingRead>) =
            std::mem::take(&mut self.reads).into_iter().partition(|r| now >= r.deadline);
        self.reads = waiting;
        for read in expired {
            core.reply_result(read.origin, read.request.tag, Err(KeelError::Timeout), read.round);
        }
    }
}

/// Whether the leader may append a write now: the state has room for what it adds, and
/// the log above the durable index (whose undo records are kept) is not too long.
fn admit_write(core: &Core, command: &Command) -> Result<(), KeelError> {
    let grows = match command {
        Command::Put { key, value } | Command::Cas { key, new: value, .. } => {
            (key.len() + value.len()) as u64
        }
        Command::Incr { key, .. } => key.len() as u64 + 20,
        _ => 0,
    };
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
