//! The leader's side of replication: `Append`s (entries, heartbeats, lease grants,
//! durability-round flush requests) and snapshot chunks to each follower, their replies,
//! and the commit, persisted-majority and durable indexes they advance.

use super::Leading;
use crate::leader::core::Core;
use crate::leader::io::{Lease, Message};
use keel_types::{Epoch, LogIndex, NodeId};

impl Leading {
    /// Sends to every follower the leader tracks: the members, and removed members still
    /// being marked out of the active set.
    pub fn broadcast_append(&mut self, core: &mut Core, heartbeat: bool) {
        let peers: Vec<NodeId> = self.progress.keys().copied().collect();
        for peer in peers {
            self.send_append(core, peer, heartbeat);
        }
    }

    /// What the next `Append` to `follower` says of its lease.
    fn lease_for(&self, core: &Core, follower: NodeId) -> Lease {
        let p = &self.progress[&follower];
        let member = self.active.contains(&follower);
        if member && p.marking_out {
            return Lease::MarkOut;
        }
        // Only a follower holding every durable entry may serve `monotonic` reads. The
        // leader's own durable index can lag the true one (learned late from the previous
        // leader, or reset to the snapshot by a restart), but its log holds every entry
        // durable in an earlier epoch: a follower that persisted and applied this epoch's
        // no-op holds them too (keyspaces seed 9820328: a restarted leader granted a lease
        // to a follower that lacked a durable write, which it then read as absent).
        let caught_up = p.acked_point >= core.durable_index.max(self.noop_index);
        let early = core.config.unsafe_learner_reads_early && !core.is_voter(follower);
        let eligible = member && (caught_up || early);
        match p.reply_anchor {
            Some(anchor) if eligible && self.lease_valid(core) => Lease::Granted { anchor },
            _ => Lease::Withheld,
        }
    }

    /// Sends entries (or, for a heartbeat, possibly none) to `to`.
    pub fn send_append(&mut self, core: &mut Core, to: NodeId, heartbeat: bool) {
        let snapshot_index = core.log.snapshot().last_index;
        let p = self.progress[&to].clone();
        if p.next <= snapshot_index {
            self.send_snapshot(core, to);
            return;
        }
        let last = core.log.last_index();
        let window_open = p.inflight < core.config.inflight_appends_max;
        let entries: Vec<_> = if window_open && p.next <= last {
            let to_index = LogIndex(p.next.0 + core.config.append_entries_max as u64 - 1).min(last);
            let mut budget = core.config.append_bytes_max;
            let mut entries = Vec::new();
            for entry in core.log.range(p.next, to_index) {
                let size = crate::leader::log::entry_bytes(entry);
                if !entries.is_empty() && size > budget {
                    break; // the first entry always goes, whatever its size
                }
                budget = budget.saturating_sub(size);
                entries.push(entry.clone());
            }
            entries
        } else {
            Vec::new()
        };
        if entries.is_empty() && !heartbeat {
            return;
        }
        assert!(entries.len() <= core.config.append_entries_max);
        // Entries continue from `next`; a bare heartbeat checks only what is known to match.
        let prev_index = if entries.is_empty() {
            p.match_index.max(snapshot_index).min(p.next.prev())
        } else {
            p.next.prev()
        };
        let prev_epoch = core.log.epoch_at(prev_index).expect("prev entry is held");
        let lease = self.lease_for(core, to);
        let in_set = self.active.contains(&to);
        let round = self.round.map(|(target, _)| target).filter(|_| in_set);
        let writes = Some(self.flush_for_writes).filter(|i| *i > p.persisted_point);
        let flush_through = round.max(writes);
        let progress = self.progress.get_mut(&to).expect("a member");
        if let Some(last_entry) = entries.last() {
            progress.next = last_entry.index.next();
            progress.inflight += 1;
        }
        if let Lease::Granted { anchor } = lease {
            progress.granted_anchor =
                Some(progress.granted_anchor.map_or(anchor, |g| g.max(anchor)));
            progress.granted_at = Some(core.now);
        }
        let message = Message::Append {
            epoch: core.hard.epoch,
            prev_epoch,
            prev_index,
            entries,
            commit_index: core.commit_index,
            durable_index: core.durable_index,
            lease,
            flush_through,
            sent_at: core.now,
        };
        core.out.messages.push((to, message));
    }

    /// Sends the next chunk of the newest snapshot to `to`, from the offset it last
    /// acknowledged (one chunk in flight; resent if unanswered for `mark_out_timeout`).
    fn send_snapshot(&mut self, core: &mut Core, to: NodeId) {
        let now = core.now;
        let resend_after = core.config.mark_out_timeout;
        let chunk = core.config.snapshot_chunk_bytes;
        let Some((meta, data)) = core.snapshots.held.clone() else {
            return; // none held: one is being taken (`Core::maybe_snapshot`)
        };
        let p = self.progress.get_mut(&to).expect("a member");
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
            Message::InstallSnapshot { epoch: core.hard.epoch, meta, offset, total, data };
        core.out.messages.push((to, message));
    }

    /// A follower's reply to an `Append` of this epoch.
    pub fn on_append_reply(&mut self, core: &mut Core, from: NodeId, reply: Message) {
        let Message::AppendReply {
            epoch: _,
            success,
            last_index,
            persisted_index,
            applied_index,
            match_index,
            released,
            echo_sent_at,
            sent_at,
        } = reply
        else {
            unreachable!("dispatched on the variant")
        };
        // The gate: a follower matches at most what this leader sent it (the log only
        // grows within an epoch), and echoes only send times this leader has reached.
        if match_index > core.log.last_index() {
            return core.reject(from, "append reply matches past the leader's log");
        }
        if echo_sent_at > core.now {
            return core.reject(from, "append reply echoes a send time from the future");
        }
        let now = core.now;
        let Some(p) = self.progress.get_mut(&from) else {
            return; // a member removed since, or a node never added: nothing to track
        };
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
            // rejection costs only a resend). What it verified in this epoch matches:
            // never resume at or below it (a late rejection carrying a verified index
            // above an earlier back-off would leave `next` below `match_index`; wide-area
            // seed 504138).
            p.next = last_index.next().min(p.next).max(LogIndex(1));
            p.match_index = p.match_index.min(last_index);
            p.next = p.next.max(p.match_index.next());
            p.inflight = 0;
        }
        assert!(p.next > p.match_index, "resuming at or below the verified prefix");
        // Safe in any arrival order: the follower ignores grants anchored before `sent_at`,
        // and every grant sent so far was anchored at or before `granted_anchor`.
        let acknowledged_out = released && p.granted_anchor.is_none_or(|g| sent_at > g);
        if acknowledged_out && p.marking_out {
            core.counters.released_removals += 1;
            self.remove_from_active_set(core, from);
        }
        if self.progress.contains_key(&from) {
            self.send_append(core, from, false); // unless it was a removed member, now gone
        }
    }

    /// A follower's reply to a snapshot chunk of this epoch.
    pub fn on_install_snapshot_reply(
        &mut self,
        core: &mut Core,
        from: NodeId,
        last_index: LogIndex,
        received: u64,
    ) {
        if last_index > core.log.last_index() {
            return core.reject(from, "snapshot reply matches past the leader's log");
        }
        let now = core.now;
        let sending = core.snapshots.held.as_ref().map(|(meta, _)| *meta);
        let Some(p) = self.progress.get_mut(&from) else { return };
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
                self.send_snapshot(core, from);
            }
            return;
        }
        p.match_index = p.match_index.max(last_index);
        p.next = p.next.max(last_index.next());
        p.inflight = 0;
        p.snapshot_sent_at = None;
        p.snapshot_sending = None;
        self.send_append(core, from, true);
    }

    /// The `k`-th highest (1-based) of `values` (this node's included).
    fn kth_highest(mut values: Vec<LogIndex>, k: usize) -> LogIndex {
        assert!(k >= 1 && k <= values.len(), "quorum of {k} out of {}", values.len());
        values.sort_by(|a, b| b.cmp(a));
        values[k - 1]
    }

    /// Recomputes the commit, persisted-majority and durable indexes, admits followers,
    /// finishes and starts durability rounds, and answers whatever became answerable.
    pub fn on_progress(&mut self, core: &mut Core) {
        if std::mem::take(&mut self.append_due) {
            self.broadcast_append(core, false);
        }
        // Commits and `durable` writes count the voters in force only: a learner counts
        // for nothing, a removed member no longer (`Config::unsafe_count_removed` keeps
        // counting it while it is tracked, the negative control).
        let majority = core.majority();
        let counted = |id: &NodeId| {
            core.is_voter(*id)
                || (core.config.unsafe_count_removed && !core.membership().contains(*id))
        };
        let voters = || self.progress.iter().filter(|(id, _)| counted(id)).map(|(_, p)| p);
        let mut matches: Vec<LogIndex> = voters().map(|p| p.match_index).collect();
        matches.push(core.log.last_index());
        let mut persisted: Vec<LogIndex> = voters().map(|p| p.persisted_point).collect();
        persisted.push(core.persisted_index());
        let commit = Self::kth_highest(matches, majority);
        let persisted_majority = Self::kth_highest(persisted, majority);
        let own_point = core.persisted_index().min(core.kv.applied_index());
        let durable_point =
            self.active.iter().map(|f| self.progress[f].acked_point).fold(own_point, LogIndex::min);
        let before = core.durable_index;
        core.commit_index = advance_in_epoch(core, core.commit_index, commit);
        self.persisted_majority =
            advance_in_epoch(core, self.persisted_majority, persisted_majority);
        core.durable_index = advance_in_epoch(core, core.durable_index, durable_point);
        assert!(core.durable_index >= before, "the durable index never decreases");
        // The leader advances the durable index only to its own persisted index; above
        // it may lie only a durable index inherited from an earlier epoch (durable on
        // that leader's active set), which this node is already fsyncing (§12 item 17).
        let inherited = core.log.epoch_at(core.durable_index).is_none_or(|e| e < core.hard.epoch);
        assert!(
            core.durable_index <= core.persisted_index()
                || (inherited && core.sync_requested >= core.durable_index),
            "durable beyond the leader's own disk and not inherited or not being fsynced"
        );
        self.admit_followers(core);
        self.finish_round(core);
        self.answer_writes(core);
        self.answer_reads(core);
    }

    fn finish_round(&mut self, core: &mut Core) {
        let Some((target, started)) = self.round else { return };
        if target <= core.durable_index {
            self.round = None;
            core.counters.durability_rounds_finished += 1;
            core.counters.durability_round_nanos += (core.now - started).0;
        }
    }

    /// Joins the round in flight if it covers `needed`, else starts one up to the log
    /// tail when none is in flight (a round in flight that falls short is followed by
    /// the next one as soon as it finishes: `docs/protocol.md` §9).
    pub fn ensure_round(&mut self, core: &mut Core, needed: LogIndex) {
        assert!(needed <= core.log.last_index(), "a read needs an index past the log");
        assert!(needed > core.durable_index, "a round for what is already durable");
        if self.round.is_some() {
            return;
        }
        let target = core.log.last_index();
        self.round = Some((target, core.now));
        core.counters.durability_rounds += 1;
        core.request_sync(target);
        self.broadcast_append(core, true);
    }
}

/// Advances `current` to `candidate` only over an entry of this epoch (Raft §5.4.2: a
/// leader counts replicas only of its own epoch's entries).
fn advance_in_epoch(core: &Core, current: LogIndex, candidate: LogIndex) -> LogIndex {
    let epoch: Epoch = core.hard.epoch;
    if candidate > current && core.log.epoch_at(candidate) == Some(epoch) {
        candidate
    } else {
        current
    }
}
