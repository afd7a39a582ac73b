//! The follower role: [`Following`], its state, and its handlers: log matching with
//! conflicting-suffix truncation and rollback, honouring the leader's commit and durable
//! indexes only up to the verified prefix (`docs/protocol.md` §7), the active-set lease,
//! flush requests, snapshot chunks and their installation, and requests forwarded to the
//! leader.
//!
//! Every handler here runs after the engine made this node a follower of the sender's
//! epoch (`LeaderEngine::heard_from_leader`), and borrows the [`Core`] and this role's
//! state only.

use super::core::{Core, Origin, TransferWait};
use super::io::{ClientRequest, Lease, Message, RequestTag};
use crate::engine::ClientReply;
use crate::time::Time;
use keel_types::{ClusterOp, Command, Entry, Epoch, KeelError, LogIndex, NodeId, SnapshotMeta};
use std::collections::{BTreeMap, BTreeSet};

/// A request this follower forwarded to the leader and still waits on.
#[derive(Clone, Copy, Debug)]
pub(super) struct Forwarded {
    /// When to give up with `Timeout`.
    pub deadline: Time,
    /// Writes that fail have an unknown outcome; reads just did not happen.
    pub is_write: bool,
}

/// A follower's state; a fresh one at every epoch and every change of role.
#[derive(Clone, Debug, Default)]
pub(super) struct Following {
    /// The leader of this epoch, once heard from.
    pub leader: Option<NodeId>,
    /// The highest index verified, in this epoch, to match the leader's log.
    pub verified_index: LogIndex,
    /// The active-set lease ends at this local time.
    pub lease_until: Option<Time>,
    /// The latest `Append` asked for a forced mark-out (`Lease::MarkOut`).
    pub mark_out_asked: bool,
    /// The newest `sent_at` of an `Append` received in this epoch.
    pub echo_sent_at: Time,
    /// Requests forwarded to the leader, by tag.
    pub forwards: BTreeMap<RequestTag, Forwarded>,
    /// The same requests by deadline (a step touches only those that expire).
    pub forward_deadlines: BTreeSet<(Time, RequestTag)>,
    /// The leader's snapshot being received, the bytes so far.
    pub receiving: Option<(SnapshotMeta, Vec<u8>)>,
}

impl Following {
    /// Whether this follower holds a valid active-set lease now.
    pub fn active(&self, core: &Core) -> bool {
        self.active_at(core.now)
    }

    /// Whether this follower holds a valid active-set lease at local time `now`.
    pub fn active_at(&self, now: Time) -> bool {
        self.lease_until.is_some_and(|t| now < t)
    }

    /// An `Append` from the leader of this epoch.
    pub fn on_append(&mut self, core: &mut Core, append: Message) {
        let Message::Append {
            epoch: _,
            prev_epoch,
            prev_index,
            entries,
            commit_index,
            durable_index,
            lease,
            flush_through,
            sent_at,
        } = append
        else {
            unreachable!("dispatched on the variant")
        };
        self.echo_sent_at = self.echo_sent_at.max(sent_at);
        self.mark_out_asked = lease == Lease::MarkOut;
        if !matches!(lease, Lease::Granted { .. }) {
            self.lease_until = None; // forced mark-out, or not (yet) granted
        }
        let Some(matched) = match_and_append(core, prev_epoch, prev_index, entries) else {
            return self.send_reply(core, false);
        };
        self.verified_index = self.verified_index.max(matched);
        let verified = self.verified_index;
        assert!(verified <= core.log.last_index());
        core.durable_index = core.durable_index.max(durable_index.min(verified));
        core.commit_index = core.commit_index.max(commit_index.min(verified));
        if let Lease::Granted { anchor } = lease {
            self.accept_grant(core, anchor);
        }
        // An fsync through `through` (it flushes everything written before it). Every
        // `Append` of a round carries the same `through`: one already asked for covers
        // it, and `request_sync` asks no second one behind it.
        if let Some(through) = flush_through {
            core.request_sync(through);
        }
        self.send_reply(core, true);
    }

    /// Renews the lease from a grant anchored at `anchor` (this node's clock), unless a
    /// mark-out was acknowledged after it (`docs/protocol.md` §8).
    fn accept_grant(&mut self, core: &Core, anchor: Time) {
        // An anchor from the future cannot be one of this incarnation's replies (a
        // driver whose clock restarted): never trust it.
        if core.lease_floor.is_some_and(|floor| anchor < floor) || anchor > core.now {
            return;
        }
        let until = anchor + core.config.mark_out_timeout;
        self.lease_until = Some(self.lease_until.map_or(until, |t| t.max(until)));
        assert!(self.lease_until.is_some_and(|t| t <= core.now + core.config.mark_out_timeout));
    }

    /// Replies to the current leader (after an Append, or unsolicited after an fsync).
    pub fn send_reply(&mut self, core: &mut Core, success: bool) {
        if let Some(leader) = self.leader.filter(|l| *l != core.config.node_id) {
            send_append_reply(core, Some(self), leader, success);
        }
    }

    /// A chunk of the leader's snapshot: kept if it continues the bytes held (a chunk at
    /// offset 0 starts a new snapshot), installed once all `total` bytes are held. The
    /// reply says how far the follower got. A snapshot that conflicts with the durable
    /// prefix or does not decode is dropped with a reason.
    pub fn on_install_snapshot(
        &mut self,
        core: &mut Core,
        from: NodeId,
        meta: SnapshotMeta,
        offset: u64,
        total: u64,
        data: Vec<u8>,
    ) {
        let s = meta.last_index;
        let covered =
            s <= core.log.snapshot().last_index || core.log.epoch_at(s) == Some(meta.last_epoch);
        // The engine's gate rejected a snapshot that conflicts with the durable or verified
        // prefix (`gate::check_snapshot_against_log`).
        let mut received = 0;
        if covered {
            self.verified_index = self.verified_index.max(s);
            self.receiving = None;
            received = total;
        } else if core.install_pending.is_none() {
            received = self.receive_chunk(core, meta, offset, total, data);
            if received == total && total > 0 {
                let (meta, data) = self.receiving.take().expect("held");
                match core.decode_snapshot(meta, data.as_slice()) {
                    Ok(kv) => {
                        core.install(meta, data, kv);
                        self.verified_index = s;
                    }
                    Err(_) => {
                        core.reject(from, "snapshot does not decode");
                        received = 0;
                    }
                }
            }
        }
        let reply = Message::InstallSnapshotReply {
            epoch: core.hard.epoch,
            last_index: self.verified_index.min(s),
            received,
        };
        core.out.messages.push((from, reply));
    }

    /// Keeps a snapshot chunk if it continues the bytes held (a chunk at offset 0 starts
    /// a new snapshot); returns how many bytes of `meta`'s encoding are held now.
    fn receive_chunk(
        &mut self,
        core: &mut Core,
        meta: SnapshotMeta,
        offset: u64,
        total: u64,
        data: Vec<u8>,
    ) -> u64 {
        if offset == 0 && self.receiving.as_ref().is_none_or(|(m, _)| *m != meta) {
            self.receiving = Some((meta, Vec::new()));
        }
        let Some((held_meta, held)) = &mut self.receiving else { return 0 };
        if *held_meta != meta {
            return 0;
        }
        let fits = offset.checked_add(data.len() as u64).is_some_and(|end| end <= total);
        if offset == held.len() as u64 && fits {
            held.extend_from_slice(&data);
            core.counters.snapshot_chunks_received += 1;
        }
        held.len() as u64
    }

    // ----- forwarding ---------------------------------------------------------------

    /// Sends a request this node may not serve to the leader, or fails it when no leader
    /// is known.
    pub fn forward(&mut self, core: &mut Core, origin: Origin, request: ClientRequest) {
        let leader = self.leader.filter(|l| *l != core.config.node_id);
        match (origin, leader) {
            (Origin::Local, Some(leader)) => {
                if self.forwards.contains_key(&request.tag) {
                    let error = KeelError::InvalidArgument("request tag already pending".into());
                    return core.reply_result(origin, request.tag, Err(error), false);
                }
                let deadline = core.now + core.config.request_timeout;
                if let Command::Cluster(ClusterOp::TransferLeader(target)) = request.command {
                    return forward_transfer(core, leader, request, target);
                }
                let is_write = request.command.is_write();
                self.forwards.insert(request.tag, Forwarded { deadline, is_write });
                self.forward_deadlines.insert((deadline, request.tag));
                core.counters.forwarded += 1;
                let message = Message::Forward { epoch: core.hard.epoch, request };
                core.out.messages.push((leader, message));
            }
            _ => {
                let error = KeelError::NotLeader { leader };
                core.reply_result(origin, request.tag, Err(error), false);
            }
        }
    }

    /// The leader answered a forwarded request.
    pub fn on_forward_reply(&mut self, core: &mut Core, reply: ClientReply) {
        if let Some(forwarded) = self.forwards.remove(&reply.tag) {
            self.forward_deadlines.remove(&(forwarded.deadline, reply.tag));
            core.out.replies.push(reply);
        }
    }

    /// Answers every forwarded request at once: the leader they went to is deposed.
    /// Writes get `Timeout` (outcome unknown), reads `NotLeader`.
    pub fn fail_forwards(&mut self, core: &mut Core) {
        let forwards = std::mem::take(&mut self.forwards);
        self.forward_deadlines.clear();
        for (tag, forwarded) in forwards {
            let error = if forwarded.is_write {
                KeelError::Timeout
            } else {
                KeelError::NotLeader { leader: None }
            };
            core.reply_result(Origin::Local, tag, Err(error), false);
        }
        assert!(self.forwards.is_empty());
    }

    /// Times out forwarded requests past their deadline.
    pub fn expire_forwards(&mut self, core: &mut Core) {
        let now = core.now;
        while let Some(&(deadline, tag)) = self.forward_deadlines.first() {
            if deadline > now {
                break;
            }
            self.forward_deadlines.remove(&(deadline, tag));
            self.forwards.remove(&tag);
            core.reply_result(Origin::Local, tag, Err(KeelError::Timeout), false);
        }
    }

    /// The earliest deadline of a forwarded request.
    pub fn deadline_min(&self) -> Option<Time> {
        self.forward_deadlines.first().map(|(t, _)| *t)
    }
}

/// Forwards a leadership transfer: answered by the leader's reply, or by this node once
/// it hears who leads the next epoch (the change the transfer asks for, which would fail
/// an ordinary forward), whatever role it holds then (`Core::settle_transfer_if_known`).
fn forward_transfer(core: &mut Core, leader: NodeId, request: ClientRequest, target: NodeId) {
    if core.transfer_wait.is_some() {
        let error = KeelError::Busy("a leadership transfer is under way".into());
        return core.reply_result(Origin::Local, request.tag, Err(error), false);
    }
    let (origin, tag, epoch) = (Origin::Local, request.tag, core.hard.epoch);
    let deadline = core.transfer_deadline();
    let wait = TransferWait { origin, tag, target, epoch, deadline, asked_as_leader: false };
    core.transfer_wait = Some(wait);
    core.counters.forwarded += 1;
    core.out.messages.push((leader, Message::Forward { epoch, request }));
}

/// Log matching: returns the highest index now known to match the leader's log, or
/// `None` if `prev` does not match.
fn match_and_append(
    core: &mut Core,
    prev_epoch: Epoch,
    prev_index: LogIndex,
    entries: Vec<Entry>,
) -> Option<LogIndex> {
    let snapshot = core.log.snapshot();
    let matched_end = LogIndex(prev_index.0 + entries.len() as u64);
    let (prev_epoch, prev_index, entries) = if prev_index < snapshot.last_index {
        // Entries up to our snapshot are durable, hence the leader's too; skip them.
        let rest = entries.into_iter().filter(|e| e.index > snapshot.last_index).collect();
        (snapshot.last_epoch, snapshot.last_index, rest)
    } else {
        (prev_epoch, prev_index, entries)
    };
    if core.log.epoch_at(prev_index) != Some(prev_epoch) {
        return None;
    }
    for entry in entries {
        assert!(entry.epoch >= prev_epoch, "leader's entries go back in epoch");
        match core.log.epoch_at(entry.index) {
            Some(epoch) if epoch == entry.epoch => continue,
            Some(_) => core.truncate_after(entry.index.prev()),
            None => {}
        }
        core.append_entry(entry);
    }
    let matched = matched_end.max(prev_index);
    assert!(matched <= core.log.last_index());
    Some(matched)
}

/// Sends an `AppendReply` to `to`: a follower's (with its state), or any role's answer to
/// an `Append` of a stale epoch (`follower` is `None`: nothing verified, no lease).
pub(super) fn send_append_reply(
    core: &mut Core,
    follower: Option<&mut Following>,
    to: NodeId,
    success: bool,
) {
    let (verified, echo, asked, active) = match &follower {
        Some(f) => (f.verified_index, f.echo_sent_at, f.mark_out_asked, f.active(core)),
        None => (LogIndex::ZERO, Time::default(), false, false),
    };
    // Acknowledges a forced mark-out: grants anchored before now are ignored from here
    // on. Only when asked: raising the floor on every reply of a follower without a
    // lease would reject every grant once the round trip exceeds the heartbeat interval
    // (each grant echoes a reply at least a round trip old).
    let asked = asked || core.config.unsafe_release_unasked;
    let released = asked && !active;
    if released {
        core.lease_floor = Some(core.now);
        if let Some(f) = follower {
            f.lease_until = None;
        }
    }
    let last = core.log.last_index();
    // Where the leader should resume after a mismatch: our durable index (never in
    // conflict) or the verified prefix, whichever is higher, capped by the log end.
    let hint = if success {
        last
    } else {
        core.durable_index.max(verified).max(core.log.snapshot().last_index).min(last)
    };
    let reply = Message::AppendReply {
        epoch: core.hard.epoch,
        success,
        last_index: hint,
        persisted_index: core.persisted_index(),
        applied_index: core.kv.applied_index(),
        match_index: verified,
        released,
        echo_sent_at: echo,
        sent_at: core.now,
    };
    core.out.messages.push((to, reply));
}
