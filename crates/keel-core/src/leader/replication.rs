//! The leader's side: replication to each follower, the commit, persisted-majority and
//! durable indexes, the active set with its leases, durability rounds, and the leader
//! lease.
//!
//! Per follower the leader keeps a [`Progress`]; the active set is the followers in
//! [`Leading::active`] plus the leader. A follower is granted a lease (`active: true`
//! with `lease_anchor`) only while it is in the set, has persisted and applied the
//! durable index, is not being marked out, and the leader holds its own lease.

use super::client::Origin;
use super::engine::LeaderEngine;
use super::io::{ClientRequest, Lease, Message, RequestTag, Role};
use super::kv::WriteResult;
use crate::time::Time;
use keel_types::{Durability, Epoch, KeelError, LogIndex, NodeId, SnapshotMeta};
use std::collections::{BTreeMap, BTreeSet};

/// What the leader knows about one follower.
#[derive(Clone, Debug)]
pub(super) struct Progress {
    /// The next index to send.
    pub next: LogIndex,
    /// Highest index known to match the leader's log.
    pub match_index: LogIndex,
    /// Appends carrying entries not yet answered.
    pub inflight: usize,
    /// When (leader clock) the follower last answered.
    pub last_heard: Option<Time>,
    /// The newest leader `sent_at` the follower echoed (for the leader lease).
    pub acked_sent_at: Option<Time>,
    /// The newest follower `sent_at` received (follower clock; the next lease anchor).
    pub reply_anchor: Option<Time>,
    /// The newest anchor granted to the follower.
    pub granted_anchor: Option<Time>,
    /// max over replies of min(persisted, applied, match): durable-index contribution.
    pub acked_point: LogIndex,
    /// max over replies of min(persisted, match): `durable` write acknowledgements.
    pub persisted_point: LogIndex,
    /// The leader stopped granting and waits for the follower to acknowledge.
    pub marking_out: bool,
    /// Since when the follower's persisted index lags too far.
    pub lagging_since: Option<Time>,
    /// When a snapshot chunk was last sent (resent after `mark_out_timeout` unanswered).
    pub snapshot_sent_at: Option<Time>,
    /// The snapshot being sent and the offset the follower acknowledged holding.
    pub snapshot_sending: Option<(SnapshotMeta, u64)>,
    /// When `match_index` last advanced (or sending last restarted from it).
    pub progress_at: Time,
}

/// A write waiting for its acknowledgement point.
#[derive(Clone, Debug)]
pub(super) struct PendingWrite {
    pub origin: Origin,
    pub tag: RequestTag,
    pub index: LogIndex,
    pub durability: Durability,
    pub result: WriteResult,
}

/// A read waiting for the lease, the no-op, or a durability round.
#[derive(Clone, Debug)]
pub(super) struct PendingRead {
    pub origin: Origin,
    pub request: ClientRequest,
    pub deadline: Time,
    pub round: bool,
}

/// Leader-only state, dropped on stepping down.
#[derive(Clone, Debug)]
pub(super) struct Leading {
    pub progress: BTreeMap<NodeId, Progress>,
    /// Followers in the active set (the leader is always in it).
    pub active: BTreeSet<NodeId>,
    /// This epoch's no-op.
    pub noop_index: LogIndex,
    pub next_heartbeat_at: Time,
    pub writes: Vec<PendingWrite>,
    pub reads: Vec<PendingRead>,
    /// The log tail a durability round in flight makes durable.
    pub round: Option<LogIndex>,
    /// Highest current-epoch index persisted on a majority.
    pub persisted_majority: LogIndex,
    /// Highest index a waiting `durable` write needs fsynced (asked of every follower).
    pub flush_for_writes: LogIndex,
    /// When this node became leader.
    pub since: Time,
}

impl Leading {
    pub fn new(followers: &[NodeId], next: LogIndex, now: Time) -> Leading {
        let progress = Progress {
            next,
            match_index: LogIndex::ZERO,
            inflight: 0,
            last_heard: None,
            acked_sent_at: None,
            reply_anchor: None,
            granted_anchor: None,
            acked_point: LogIndex::ZERO,
            persisted_point: LogIndex::ZERO,
            marking_out: false,
            lagging_since: None,
            snapshot_sent_at: None,
            snapshot_sending: None,
            progress_at: now,
        };
        Leading {
            progress: followers.iter().map(|f| (*f, progress.clone())).collect(),
            // ORCA digest §7.10: start with every member; non-responders leave after rt.
            active: followers.iter().copied().collect(),
            noop_index: next,
            next_heartbeat_at: now,
            writes: Vec::new(),
            reads: Vec::new(),
            round: None,
            persisted_majority: LogIndex::ZERO,
            flush_for_writes: LogIndex::ZERO,
            since: now,
        }
    }

    pub fn deadline_min(&self) -> Option<Time> {
        self.reads.iter().map(|r| r.deadline).min()
    }

    pub fn pending_len(&self) -> usize {
        self.writes.len() + self.reads.len()
    }

    /// Every waiting request with the error its client gets when leadership ends:
    /// writes have an unknown outcome, reads did nothing.
    pub fn fail_all(self, leader: Option<NodeId>) -> Vec<(Origin, RequestTag, WriteResult)> {
        let writes = self.writes.into_iter().map(|w| (w.origin, w.tag, Err(KeelError::Timeout)));
        let reads = self
            .reads
            .into_iter()
            .map(move |r| (r.origin, r.request.tag, Err(KeelError::NotLeader { leader })));
        writes.chain(reads).collect()
    }
}

impl LeaderEngine {
    fn leading(&self) -> &Leading {
        self.leading.as_ref().expect("leader state")
    }

    fn leading_mut(&mut self) -> &mut Leading {
        self.leading.as_mut().expect("leader state")
    }

    /// The leader-clock time from which the leader lease runs: the newest `sent_at` a
    /// majority (this node counting as `now`) has acknowledged.
    fn lease_start(&self) -> Option<Time> {
        let leading = self.leading.as_ref()?;
        let mut times: Vec<Time> =
            leading.progress.values().filter_map(|p| p.acked_sent_at).collect();
        times.push(self.now);
        times.sort_by(|a, b| b.cmp(a));
        times.get(self.config.majority() - 1).copied()
    }

    /// Whether this node leads and a majority acknowledged it recently enough that no
    /// other leader can exist yet (see `Config::leader_lease`).
    pub fn leader_lease_valid(&self) -> bool {
        self.role == Role::Leader
            && self.lease_start().is_some_and(|start| self.now < start + self.lease_span)
    }

    pub(super) fn leader_timers(&mut self) {
        let now = self.now;
        let since = self.leading().since;
        let quorum_lost = match self.lease_start() {
            Some(start) => now >= start + self.config.election_timeout_min,
            None => now >= since + self.config.election_timeout_min,
        };
        if quorum_lost && now >= since + self.config.election_timeout_min {
            self.step_down_same_epoch();
            return;
        }
        self.remove_silent_followers();
        self.mark_out_slow_followers();
        if now >= self.leading().next_heartbeat_at {
            let next = now + self.config.heartbeat_interval;
            self.leading_mut().next_heartbeat_at = next;
            self.rewind_stalled_followers();
            self.broadcast_append(true);
        }
    }

    /// Entries sent but not acknowledged within `mark_out_timeout` were lost (or the
    /// follower lost them in a crash): send again from the last known match.
    fn rewind_stalled_followers(&mut self) {
        let now = self.now;
        let patience = self.config.mark_out_timeout;
        for p in self.leading_mut().progress.values_mut() {
            if p.next > p.match_index.next() && now >= p.progress_at + patience {
                p.next = p.match_index.next();
                p.inflight = 0;
                p.progress_at = now;
            }
            assert!(p.next > p.match_index || p.next == LogIndex(1));
        }
    }

    /// Removes followers not heard from for `removal_timeout` (never below a majority).
    fn remove_silent_followers(&mut self) {
        let now = self.now;
        let rt = self.config.removal_timeout;
        let leading = self.leading();
        let silent: Vec<NodeId> = leading
            .active
            .iter()
            .copied()
            .filter(|f| {
                let p = &leading.progress[f];
                let heard = p.last_heard.unwrap_or(leading.since);
                now >= heard + rt
            })
            .collect();
        for follower in silent {
            self.remove_from_active_set(follower);
        }
    }

    pub(super) fn remove_from_active_set(&mut self, follower: NodeId) {
        let majority = self.config.majority();
        let leading = self.leading_mut();
        if leading.active.len() < majority || !leading.active.contains(&follower) {
            return; // never below a majority (the leader counts itself)
        }
        leading.active.remove(&follower);
        let progress = leading.progress.get_mut(&follower).expect("a member");
        progress.marking_out = false;
        assert!(leading.active.len() + 1 >= majority);
        self.counters.removals += 1;
    }

    /// Forced mark-out (ORCA §4.4.2): a follower whose persisted index lags the log by
    /// more than `slow_follower_lag_max` for `slow_follower_timeout`, or one past the
    /// active-set target. The leader stops granting; removal follows the follower's
    /// acknowledgement (an `active: false` reply sent after the last grant) or `rt`.
    fn mark_out_slow_followers(&mut self) {
        let now = self.now;
        let last = self.log.last_index();
        let lag_max = self.config.slow_follower_lag_max;
        let timeout = self.config.slow_follower_timeout;
        let target = self.config.active_set_target;
        let leading = self.leading.as_mut().expect("leader");
        for (id, p) in leading.progress.iter_mut() {
            let lagging = last.0.saturating_sub(p.persisted_point.0) > lag_max;
            p.lagging_since = if lagging { Some(p.lagging_since.unwrap_or(now)) } else { None };
            let slow = p.lagging_since.is_some_and(|since| now >= since + timeout);
            if slow && leading.active.contains(id) {
                p.marking_out = true;
            }
        }
        // Past the target: mark out the members furthest behind first.
        let mut staying: Vec<(LogIndex, NodeId)> = leading
            .active
            .iter()
            .filter(|f| !leading.progress[f].marking_out)
            .map(|f| (leading.progress[f].acked_point, *f))
            .collect();
        staying.sort();
        let excess = (staying.len() + 1).saturating_sub(target);
        for (_, id) in staying.into_iter().take(excess) {
            leading.progress.get_mut(&id).expect("a member").marking_out = true;
        }
        let members =
            1 + leading.active.iter().filter(|f| !leading.progress[f].marking_out).count();
        assert!(members <= target.max(1), "more members kept than the target");
    }

    /// Admits followers that have persisted and applied the durable index (ORCA §4.4.2
    /// re-admission), are not slow, and answered within `mark_out_timeout`, up to the
    /// target size.
    fn admit_followers(&mut self) {
        let now = self.now;
        let durable = self.durable_index;
        let recent = self.config.mark_out_timeout;
        let target = self.config.active_set_target;
        let leading = self.leading.as_mut().expect("leader");
        for (id, p) in leading.progress.iter_mut() {
            if leading.active.len() + 1 >= target {
                break;
            }
            let heard = p.last_heard.is_some_and(|t| now < t + recent);
            if !leading.active.contains(id)
                && heard
                && p.acked_point >= durable
                && p.lagging_since.is_none()
            {
                assert!(!p.marking_out);
                leading.active.insert(*id);
            }
        }
    }

    pub(super) fn broadcast_append(&mut self, heartbeat: bool) {
        let peers: Vec<NodeId> = self.peers().collect();
        for peer in peers {
            self.send_append(peer, heartbeat);
        }
    }

    /// What the next `Append` to `follower` says of its lease.
    fn lease_for(&self, follower: NodeId) -> Lease {
        let leading = self.leading();
        let p = &leading.progress[&follower];
        let member = leading.active.contains(&follower);
        if member && p.marking_out {
            return Lease::MarkOut;
        }
        let eligible = member && p.acked_point >= self.durable_index;
        match p.reply_anchor {
            Some(anchor) if eligible && self.leader_lease_valid() => Lease::Granted { anchor },
            _ => Lease::Withheld,
        }
    }

    /// Sends entries (or, for a heartbeat, possibly none) to `to`.
    pub(super) fn send_append(&mut self, to: NodeId, heartbeat: bool) {
        let snapshot_index = self.log.snapshot().last_index;
        let p = self.leading().progress[&to].clone();
        if p.next <= snapshot_index {
            self.send_snapshot(to);
            return;
        }
        let last = self.log.last_index();
        let window_open = p.inflight < self.config.inflight_appends_max;
        let entries: Vec<_> = if window_open && p.next <= last {
            let to_index = LogIndex(p.next.0 + self.config.append_entries_max as u64 - 1).min(last);
            self.log.range(p.next, to_index).cloned().collect()
        } else {
            Vec::new()
        };
        if entries.is_empty() && !heartbeat {
            return;
        }
        assert!(entries.len() <= self.config.append_entries_max);
        // Entries continue from `next`; a bare heartbeat checks only what is known to match.
        let prev_index = if entries.is_empty() {
            p.match_index.max(snapshot_index).min(p.next.prev())
        } else {
            p.next.prev()
        };
        let prev_epoch = self.log.epoch_at(prev_index).expect("prev entry is held");
        let lease = self.lease_for(to);
        let in_set = self.leading().active.contains(&to);
        let round = self.leading().round.filter(|_| in_set);
        let writes = Some(self.leading().flush_for_writes).filter(|i| *i > p.persisted_point);
        let flush_through = round.max(writes);
        let progress = self.leading_mut().progress.get_mut(&to).expect("a member");
        if let Some(last_entry) = entries.last() {
            progress.next = last_entry.index.next();
            progress.inflight += 1;
        }
        if let Lease::Granted { anchor } = lease {
            progress.granted_anchor =
                Some(progress.granted_anchor.map_or(anchor, |g| g.max(anchor)));
        }
        let message = Message::Append {
            epoch: self.hard.epoch,
            prev_epoch,
            prev_index,
            entries,
            commit_index: self.commit_index,
            durable_index: self.durable_index,
            lease,
            flush_through,
            sent_at: self.now,
        };
        self.out.messages.push((to, message));
    }

    /// Sends the next chunk of the newest snapshot to `to`, from the offset it last
    /// acknowledged (one chunk in flight; resent if unanswered for `mark_out_timeout`).
    fn send_snapshot(&mut self, to: NodeId) {
        let now = self.now;
        let resend_after = self.config.mark_out_timeout;
        let chunk = self.config.snapshot_chunk_bytes;
        let Some((meta, data)) = self.snapshot.clone() else {
            return; // none held: one is being taken (`maybe_snapshot`)
        };
        let p = self.leading_mut().progress.get_mut(&to).expect("a member");
        if p.snapshot_sent_at.is_some_and(|at| now < at + resend_after) {
            return;
        }
        let total = data.len() as u64;
        let offset = match p.snapshot_sending {
            Some((sending, offset)) if sending == meta && offset < total => offset,
            _ => 0,
        };
        p.snapshot_sending = Some((meta, offset));
        p.snapshot_sent_at = Some(now);
        let end = total.min(offset + chunk);
        let range = usize::try_from(offset).expect("fits")..usize::try_from(end).expect("fits");
        let data = data[range].to_vec();
        let message =
            Message::InstallSnapshot { epoch: self.hard.epoch, meta, offset, total, data };
        self.out.messages.push((to, message));
    }

    pub(super) fn on_append_reply(&mut self, from: NodeId, message: Message) {
        let Message::AppendReply {
            epoch,
            success,
            last_index,
            persisted_index,
            applied_index,
            match_index,
            released,
            echo_sent_at,
            sent_at,
        } = message
        else {
            unreachable!("dispatched on the variant")
        };
        if epoch > self.hard.epoch {
            self.become_follower(epoch, None);
            return;
        }
        if epoch < self.hard.epoch || self.role != Role::Leader {
            return;
        }
        let now = self.now;
        let p = self.leading_mut().progress.get_mut(&from).expect("a member");
        p.last_heard = Some(now);
        p.acked_sent_at = Some(p.acked_sent_at.map_or(echo_sent_at, |t| t.max(echo_sent_at)));
        // The anchor of the next grant: the latest reply to arrive. A reordered older
        // one only shortens the lease it grants, and a follower whose clock restarted
        // lower (a machine reboot) is granted leases again at once.
        p.reply_anchor = Some(sent_at);
        if match_index > p.match_index {
            p.match_index = match_index;
            p.progress_at = now;
        }
        p.acked_point = p.acked_point.max(persisted_index.min(applied_index).min(match_index));
        p.persisted_point = p.persisted_point.max(persisted_index.min(match_index));
        if success {
            p.inflight = p.inflight.saturating_sub(1);
            p.next = p.next.max(p.match_index.next());
        } else {
            // The follower lacks `prev`: back off to its hint (it may have lost unsynced
            // entries in a crash, so `match_index` may go down too; a reordered old
            // rejection costs only a resend).
            p.next = last_index.next().min(p.next).max(LogIndex(1));
            p.match_index = p.match_index.min(last_index);
            p.inflight = 0;
        }
        // Safe in any arrival order: the follower ignores grants anchored before `sent_at`,
        // and every grant sent so far was anchored at or before `granted_anchor`.
        let acknowledged_out = released && p.granted_anchor.is_none_or(|g| sent_at > g);
        if acknowledged_out && p.marking_out {
            self.remove_from_active_set(from);
        }
        self.send_append(from, false);
    }

    pub(super) fn on_install_snapshot_reply(
        &mut self,
        from: NodeId,
        epoch: Epoch,
        last_index: LogIndex,
        received: u64,
    ) {
        if epoch > self.hard.epoch {
            self.become_follower(epoch, None);
            return;
        }
        if epoch < self.hard.epoch || self.role != Role::Leader {
            return;
        }
        let now = self.now;
        let sending = self.snapshot.as_ref().map(|(meta, _)| *meta);
        let p = self.leading_mut().progress.get_mut(&from).expect("a member");
        p.last_heard = Some(now);
        if let Some(meta) = sending.filter(|meta| last_index < meta.last_index) {
            // Still receiving: continue from what the follower holds, at once if it got
            // further (a reply that shows no progress waits for the resend timer).
            let acked = match p.snapshot_sending {
                Some((m, offset)) if m == meta => offset,
                _ => 0,
            };
            p.snapshot_sending = Some((meta, received));
            if received > acked {
                p.snapshot_sent_at = None;
                self.send_snapshot(from);
            }
            return;
        }
        p.match_index = p.match_index.max(last_index);
        p.next = p.next.max(last_index.next());
        p.inflight = 0;
        p.snapshot_sent_at = None;
        p.snapshot_sending = None;
        self.send_append(from, true);
    }

    /// The `k`-th highest (1-based) of `values` (this node's included).
    fn kth_highest(mut values: Vec<LogIndex>, k: usize) -> LogIndex {
        assert!(k >= 1 && k <= values.len(), "quorum of {k} out of {}", values.len());
        values.sort_by(|a, b| b.cmp(a));
        values[k - 1]
    }

    /// Advances `current` to `candidate` only over an entry of this epoch (digest §7.4).
    fn advance_in_epoch(&self, current: LogIndex, candidate: LogIndex) -> LogIndex {
        if candidate > current && self.log.epoch_at(candidate) == Some(self.hard.epoch) {
            candidate
        } else {
            current
        }
    }

    /// Recomputes the commit, persisted-majority and durable indexes, admits followers,
    /// finishes and starts durability rounds, and answers whatever became answerable.
    pub(super) fn leader_progress(&mut self) {
        let majority = self.config.majority();
        let leading = self.leading();
        let mut matches: Vec<LogIndex> = leading.progress.values().map(|p| p.match_index).collect();
        matches.push(self.log.last_index());
        let mut persisted: Vec<LogIndex> =
            leading.progress.values().map(|p| p.persisted_point).collect();
        persisted.push(self.persisted_index());
        let commit = Self::kth_highest(matches, majority);
        let persisted_majority = Self::kth_highest(persisted, majority);
        let durable_point = leading
            .active
            .iter()
            .map(|f| leading.progress[f].acked_point)
            .fold(self.persisted_index().min(self.kv.applied_index()), LogIndex::min);
        let before = self.durable_index;
        self.commit_index = self.advance_in_epoch(self.commit_index, commit);
        let pm = self.advance_in_epoch(self.leading().persisted_majority, persisted_majority);
        self.leading_mut().persisted_majority = pm;
        self.durable_index = self.advance_in_epoch(self.durable_index, durable_point);
        assert!(self.durable_index >= before, "the durable index never decreases");
        // The leader advances the durable index only to its own persisted index; above
        // it may lie only a durable index inherited from an earlier epoch (durable on
        // that leader's active set), which this node is already fsyncing (§12 item 17).
        let inherited = self.log.epoch_at(self.durable_index).is_none_or(|e| e < self.hard.epoch);
        assert!(
            self.durable_index <= self.persisted_index()
                || (inherited && self.sync_requested >= self.durable_index),
            "durable beyond the leader's own disk and not inherited or not being fsynced"
        );
        self.admit_followers();
        self.finish_round();
        self.answer_writes();
        self.answer_reads();
    }

    fn finish_round(&mut self) {
        let durable = self.durable_index;
        let leading = self.leading_mut();
        if leading.round.is_some_and(|target| target <= durable) {
            leading.round = None;
        }
    }

    /// Joins the round in flight if it covers `needed`, else starts one up to the log
    /// tail when none is in flight (a round in flight that falls short is followed by
    /// the next one as soon as it finishes: digest §7.12).
    pub(super) fn ensure_round(&mut self, needed: LogIndex) {
        assert!(needed <= self.log.last_index(), "a read needs an index past the log");
        assert!(needed > self.durable_index, "a round for what is already durable");
        if self.leading().round.is_some() {
            return;
        }
        let target = self.log.last_index();
        self.leading_mut().round = Some(target);
        self.counters.durability_rounds += 1;
        self.request_sync(target);
        self.broadcast_append(true);
    }

    /// Acknowledges writes whose durability point has been reached.
    fn answer_writes(&mut self) {
        let commit = self.commit_index;
        let persisted_majority = self.leading().persisted_majority;
        let (ready, waiting): (Vec<PendingWrite>, Vec<PendingWrite>) =
            std::mem::take(&mut self.leading_mut().writes).into_iter().partition(|w| {
                match w.durability {
                    Durability::Memory => true,
                    Durability::Replicated => w.index <= commit,
                    Durability::Durable => w.index <= persisted_majority,
                }
            });
        self.leading_mut().writes = waiting;
        for write in ready {
            let reply = super::io::ClientReply {
                tag: write.tag,
                served_by: self.config.node_id,
                result: write.result,
                durability_round: false,
            };
            self.reply(write.origin, reply);
        }
    }
}
