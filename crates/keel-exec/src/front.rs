//! [`Front`]: the executor's half on the engine loop. It turns each step's [`Outputs`]
//! into numbered storage operations and what may leave now, and each [`Completion`] into
//! the engine's next disk input and whatever it releases.
//!
//! The rules it carries out, from the contract on [`Outputs`]:
//! - **Hard state before messages.** A step with hard state queues it and raises a
//!   barrier: that step's messages and replies, and every later step's, are held until
//!   the hard state is durable ([`Completion::HardStateSaved`]), then released in order.
//!   The loop itself never waits.
//! - **Log order.** Truncation, appends, the sync request and an installed snapshot are
//!   queued in that order, numbered, and carried out by the worker in number order.
//! - **Truncation clamping.** An fsync reports the log's last index when it ran. A
//!   truncation queued after the fsync's last operation may have removed entries it
//!   covered, and the entries that replace them are not on disk yet: the index reported
//!   to the engine is clamped below every such truncation.
//! - **Snapshots.** One installed from a leader is saved in order (later appends build on
//!   it); one this node took lies inside the durable log, so the driver writes it off the
//!   worker ([`Effects::prepare`]) and the front queues its adoption when it is written.

use crate::op::{Completion, DiskInput, StorageOp};
use keel_core::engine::{Outputs, Rejection, Release, SnapshotBytes};
use keel_core::time::Time;
use keel_types::{Entry, LogIndex, NodeId, SnapshotMeta};
use std::collections::VecDeque;
use std::marker::PhantomData;

/// Most truncations remembered for clamping fsync reports (older ones are folded into
/// the next: only the lowest clamp matters).
pub const TRUNCATIONS_TRACKED_MAX: usize = 1024;

const _: () = assert!(TRUNCATIONS_TRACKED_MAX >= 2);

/// What the driver does now, after one step.
#[derive(Debug, PartialEq, Eq)]
pub struct Effects<M, R, L = Entry> {
    /// Storage operations to hand the worker, in order (numbered).
    pub ops: Vec<(u64, StorageOp<L>)>,
    /// A snapshot this node took, to write and sync under its temporary name off the
    /// worker; then call [`Front::prepared`].
    pub prepare: Option<(SnapshotMeta, SnapshotBytes)>,
    /// Memory to free, anywhere.
    pub release: Vec<Release<L>>,
    /// Messages that may leave now.
    pub messages: Vec<(NodeId, M)>,
    /// Replies that may leave now.
    pub replies: Vec<R>,
    /// Peer messages the gate dropped (count and log them).
    pub rejected: Vec<Rejection>,
    /// Messages dropped because more than `held_messages_max` waited behind an unsynced
    /// hard state (count them as a congested link's drops).
    pub messages_dropped: u64,
    /// When to tick the engine next.
    pub wake_at: Option<Time>,
}

/// What a completion gives back.
#[derive(Debug, PartialEq, Eq)]
pub struct Completed<M, R> {
    /// Messages released by the hard state becoming durable, in order.
    pub messages: Vec<(NodeId, M)>,
    /// Replies released with them.
    pub replies: Vec<R>,
    /// The engine's next input, if the completion is one (after the releases).
    pub input: Option<DiskInput>,
}

/// The executor's half on the engine loop, for engines whose messages are `M`, replies
/// `R` and log records `L`.
#[derive(Debug)]
pub struct Front<M, R, L = Entry> {
    seq_next: u64,
    /// Truncations queued and not yet covered by a reported fsync, `(seq, index)`.
    truncations: VecDeque<(u64, LogIndex)>,
    /// The newest hard-state operation not yet durable.
    barrier: Option<u64>,
    /// Messages waiting for the barrier, in send order.
    held_messages: Vec<(NodeId, M)>,
    /// Replies waiting for the barrier, in order (never dropped: each answers a request
    /// the driver tracks, and requests are bounded upstream).
    held_replies: Vec<R>,
    /// Most messages held behind one barrier; more are dropped, as a congested link
    /// drops them (the protocol retries).
    held_messages_max: usize,
    clamp_truncations: bool,
    record: PhantomData<fn() -> L>,
}

impl<M, R, L> Front<M, R, L> {
    /// A front whose first operation is numbered 1. `held_messages_max` bounds how many
    /// messages wait behind an unsynced hard state (more are dropped, as a lossy network
    /// would: the protocol retries).
    pub fn new(held_messages_max: usize) -> Front<M, R, L> {
        assert!(held_messages_max >= 1);
        Front {
            seq_next: 1,
            truncations: VecDeque::new(),
            barrier: None,
            held_messages: Vec::new(),
            held_replies: Vec::new(),
            held_messages_max,
            clamp_truncations: true,
            record: PhantomData,
        }
    }

    /// For negative-control tests only: report fsyncs unclamped by the truncations that
    /// followed them, so a simulator can show that the clamp is needed. Never in a server.
    pub fn unsafe_skip_truncation_clamp(mut self) -> Front<M, R, L> {
        self.clamp_truncations = false;
        self
    }

    fn number(&mut self, op: StorageOp<L>, ops: &mut Vec<(u64, StorageOp<L>)>) -> u64 {
        let seq = self.seq_next;
        self.seq_next += 1;
        ops.push((seq, op));
        seq
    }

    /// Turns one step's outputs into what the driver does now.
    pub fn carry_out(&mut self, out: Outputs<M, R, L>) -> Effects<M, R, L> {
        let mut ops = Vec::new();
        if let Some(hard_state) = out.hard_state {
            let seq = self.number(StorageOp::HardState(hard_state), &mut ops);
            self.barrier = Some(seq);
        }
        if let Some(index) = out.truncate_after {
            let seq = self.number(StorageOp::TruncateAfter(index), &mut ops);
            self.track_truncation(seq, index);
        }
        if !out.append.is_empty() {
            self.number(StorageOp::Append(out.append), &mut ops);
        }
        if out.sync_through.is_some() {
            self.number(StorageOp::Sync, &mut ops);
        }
        let mut prepare = None;
        if let Some((meta, data)) = out.snapshot {
            if out.snapshot_installed {
                self.number(StorageOp::Snapshot(meta, data), &mut ops);
            } else {
                prepare = Some((meta, data));
            }
        }
        let (messages, replies, messages_dropped) = self.hold_or_pass(out.messages, out.replies);
        assert!(ops.windows(2).all(|w| w[0].0 < w[1].0), "operations are numbered in order");
        Effects {
            ops,
            prepare,
            release: out.release,
            messages,
            replies,
            rejected: out.rejected,
            messages_dropped,
            wake_at: out.wake_at,
        }
    }

    /// Messages and replies leave now unless a hard state is not yet durable; returns
    /// them with how many messages were dropped for want of room behind the barrier.
    fn hold_or_pass(
        &mut self,
        messages: Vec<(NodeId, M)>,
        replies: Vec<R>,
    ) -> (Vec<(NodeId, M)>, Vec<R>, u64) {
        if self.barrier.is_none() {
            assert!(self.held_messages.is_empty() && self.held_replies.is_empty());
            return (messages, replies, 0);
        }
        let room = self.held_messages_max.saturating_sub(self.held_messages.len());
        let dropped = messages.len().saturating_sub(room) as u64;
        self.held_messages.extend(messages.into_iter().take(room));
        self.held_replies.extend(replies);
        assert!(self.held_messages.len() <= self.held_messages_max);
        (Vec::new(), Vec::new(), dropped)
    }

    fn track_truncation(&mut self, seq: u64, index: LogIndex) {
        if self.truncations.len() == TRUNCATIONS_TRACKED_MAX {
            // Keep the lowest clamp: fold the oldest into the next one.
            let (_, oldest) = self.truncations.pop_front().expect("full");
            let next = self.truncations.front_mut().expect("the limit is above one");
            next.1 = next.1.min(oldest);
        }
        self.truncations.push_back((seq, index));
    }

    /// The snapshot handed out in [`Effects::prepare`] is written and synced under its
    /// temporary name (`len` data bytes): the operation that puts it in place.
    pub fn prepared(&mut self, meta: SnapshotMeta, len: u64) -> (u64, StorageOp<L>) {
        let mut ops = Vec::with_capacity(1);
        self.number(StorageOp::Adopt(meta, len), &mut ops);
        ops.pop().expect("one operation")
    }

    /// A completion from the worker.
    pub fn complete(&mut self, completion: Completion) -> Completed<M, R> {
        match completion {
            Completion::HardStateSaved { seq } => {
                let (messages, replies) = self.release_held(seq);
                Completed { messages, replies, input: None }
            }
            Completion::Synced { index, seq } => {
                let index = self.clamp(index, seq);
                Completed {
                    messages: Vec::new(),
                    replies: Vec::new(),
                    input: Some(DiskInput::LogSynced(index)),
                }
            }
            Completion::SnapshotSaved { meta } => Completed {
                messages: Vec::new(),
                replies: Vec::new(),
                input: Some(DiskInput::SnapshotSaved(meta)),
            },
        }
    }

    fn release_held(&mut self, seq: u64) -> (Vec<(NodeId, M)>, Vec<R>) {
        assert!(seq < self.seq_next, "a completion for an operation never queued");
        if self.barrier.is_none_or(|barrier| seq < barrier) {
            return (Vec::new(), Vec::new()); // an older save; a newer one still holds
        }
        self.barrier = None;
        (std::mem::take(&mut self.held_messages), std::mem::take(&mut self.held_replies))
    }

    /// The index to report as synced: `index`, clamped below every truncation queued
    /// after the fsync's last operation `seq`. Forgets truncations the fsync covers.
    fn clamp(&mut self, index: LogIndex, seq: u64) -> LogIndex {
        while self.truncations.front().is_some_and(|(queued, _)| *queued <= seq) {
            self.truncations.pop_front();
        }
        if !self.clamp_truncations {
            return index;
        }
        let clamp = self.truncations.iter().map(|(_, index)| *index).min();
        let reported = clamp.map_or(index, |c| c.min(index));
        assert!(reported <= index, "never report more than was synced");
        reported
    }

    /// Whether messages wait for a hard state.
    pub fn holding(&self) -> bool {
        self.barrier.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_types::{Epoch, HardState};

    type TestFront = Front<&'static str, u32>;

    fn outputs() -> Outputs<&'static str, u32> {
        Outputs::default()
    }

    #[test]
    fn messages_and_replies_wait_for_the_hard_state_then_leave_in_order() {
        let mut front = TestFront::new(8);
        let mut out = outputs();
        out.hard_state = Some(HardState {
            epoch: Epoch(2),
            voted_for: None,
            repair_floor: None,
            members_epoch: 0,
        });
        out.messages = vec![(NodeId(2), "vote")];
        out.replies = vec![1];
        let fx = front.carry_out(out);
        assert!(fx.messages.is_empty() && fx.replies.is_empty(), "held behind the hard state");
        let seq = fx.ops[0].0;
        let mut later = outputs();
        later.messages = vec![(NodeId(3), "append")];
        let fx = front.carry_out(later);
        assert!(fx.messages.is_empty(), "later steps' messages wait too");
        let done = front.complete(Completion::HardStateSaved { seq });
        assert_eq!(done.messages, vec![(NodeId(2), "vote"), (NodeId(3), "append")]);
        assert_eq!(done.replies, vec![1]);
        assert!(!front.holding());
        let mut free = outputs();
        free.messages = vec![(NodeId(2), "heartbeat")];
        assert_eq!(front.carry_out(free).messages.len(), 1, "no barrier: sent at once");
    }

    #[test]
    fn messages_past_the_bound_behind_a_barrier_are_dropped_and_counted() {
        let mut front = TestFront::new(2);
        let mut out = outputs();
        out.hard_state = Some(HardState {
            epoch: Epoch(2),
            voted_for: None,
            repair_floor: None,
            members_epoch: 0,
        });
        out.messages = vec![(NodeId(2), "a"), (NodeId(3), "b"), (NodeId(2), "c")];
        let fx = front.carry_out(out);
        assert_eq!(fx.messages_dropped, 1);
        let seq = fx.ops[0].0;
        let mut later = outputs();
        later.messages = vec![(NodeId(3), "d")];
        assert_eq!(front.carry_out(later).messages_dropped, 1, "still full");
        let done = front.complete(Completion::HardStateSaved { seq });
        assert_eq!(done.messages, vec![(NodeId(2), "a"), (NodeId(3), "b")], "the first kept");
    }

    #[test]
    fn an_older_hard_state_does_not_release_what_a_newer_one_holds() {
        let mut front = TestFront::new(8);
        let mut first = outputs();
        first.hard_state = Some(HardState {
            epoch: Epoch(2),
            voted_for: None,
            repair_floor: None,
            members_epoch: 0,
        });
        let first_seq = front.carry_out(first).ops[0].0;
        let mut second = outputs();
        second.hard_state = Some(HardState {
            epoch: Epoch(3),
            voted_for: None,
            repair_floor: None,
            members_epoch: 0,
        });
        second.messages = vec![(NodeId(2), "vote")];
        let second_seq = front.carry_out(second).ops[0].0;
        assert!(front.complete(Completion::HardStateSaved { seq: first_seq }).messages.is_empty());
        let done = front.complete(Completion::HardStateSaved { seq: second_seq });
        assert_eq!(done.messages.len(), 1);
    }

    #[test]
    fn fsyncs_are_clamped_below_truncations_queued_after_them() {
        let mut front = TestFront::new(8);
        let mut out = outputs();
        out.append = vec![keel_types::Entry {
            epoch: Epoch(1),
            index: LogIndex(1),
            payload: keel_types::EntryPayload::Noop,
        }];
        out.sync_through = Some(LogIndex(1));
        let fx = front.carry_out(out);
        let sync_seq = fx.ops.last().unwrap().0;
        let mut truncate = outputs();
        truncate.truncate_after = Some(LogIndex(0));
        front.carry_out(truncate);
        let done = front.complete(Completion::Synced { index: LogIndex(10), seq: sync_seq });
        assert_eq!(done.input, Some(DiskInput::LogSynced(LogIndex(0))), "clamped");
        let later = front.complete(Completion::Synced { index: LogIndex(9), seq: sync_seq + 1 });
        assert_eq!(later.input, Some(DiskInput::LogSynced(LogIndex(9))), "covered: no clamp");
        let mut unclamped = TestFront::new(8).unsafe_skip_truncation_clamp();
        let mut truncate = outputs();
        truncate.truncate_after = Some(LogIndex(0));
        unclamped.carry_out(truncate);
        let done = unclamped.complete(Completion::Synced { index: LogIndex(10), seq: 0 });
        assert_eq!(done.input, Some(DiskInput::LogSynced(LogIndex(10))), "the negative control");
    }

    #[test]
    fn installed_snapshots_are_queued_and_taken_ones_prepared_off_the_worker() {
        let meta = SnapshotMeta { last_index: LogIndex(5), last_epoch: Epoch(1) };
        let data: SnapshotBytes = std::sync::Arc::new(vec![1, 2, 3]);
        let mut front = TestFront::new(8);
        let mut installed = outputs();
        installed.snapshot = Some((meta, data.clone()));
        installed.snapshot_installed = true;
        let fx = front.carry_out(installed);
        assert!(matches!(fx.ops[..], [(_, StorageOp::Snapshot(..))]) && fx.prepare.is_none());
        let mut taken = outputs();
        taken.snapshot = Some((meta, data));
        let fx = front.carry_out(taken);
        assert!(fx.ops.is_empty() && fx.prepare.is_some());
        let (seq, op) = front.prepared(meta, 3);
        assert_eq!(op, StorageOp::Adopt(meta, 3));
        assert!(seq > 1);
    }
}
