//! The follower's side: log matching with conflicting-suffix truncation and rollback,
//! honouring the leader's commit and durable indexes only up to the verified prefix
//! (digest §7.6), the active-set lease, flush requests, and snapshot installation.

use super::engine::LeaderEngine;
use super::io::{Lease, Message, Role};
use super::kv::Kv;
use super::log::Log;
use crate::time::Time;
use keel_types::{Entry, Epoch, LogIndex, NodeId, SnapshotMeta, Version};
use std::sync::Arc;

impl LeaderEngine {
    /// Accepts `from` as the leader of `epoch` (already checked ≥ ours).
    fn heard_from_leader(&mut self, from: NodeId, epoch: Epoch) {
        assert!(epoch >= self.hard.epoch);
        if epoch > self.hard.epoch || self.role != Role::Follower {
            assert!(self.role != Role::Leader || epoch > self.hard.epoch, "two leaders in {epoch}");
            self.become_follower(epoch, Some(from));
        }
        self.leader = Some(from);
        self.pre_votes = None;
        self.leader_contact_at = Some(self.now);
        self.reset_election_deadline();
    }

    pub(super) fn on_append(&mut self, from: NodeId, message: Message) {
        let Message::Append {
            epoch,
            prev_epoch,
            prev_index,
            entries,
            commit_index,
            durable_index,
            lease,
            flush_through,
            sent_at,
        } = message
        else {
            unreachable!("dispatched on the variant")
        };
        if epoch < self.hard.epoch {
            return self.send_append_reply_to(from, false); // tells a stale leader our epoch
        }
        self.heard_from_leader(from, epoch);
        self.echo_sent_at = self.echo_sent_at.max(sent_at);
        self.mark_out_asked = lease == Lease::MarkOut;
        if !matches!(lease, Lease::Granted { .. }) {
            self.lease_until = None; // forced mark-out, or not (yet) granted
        }
        let Some(matched) = self.match_and_append(prev_epoch, prev_index, entries) else {
            return self.send_append_reply(false);
        };
        self.verified_index = self.verified_index.max(matched);
        let verified = self.verified_index;
        assert!(verified <= self.log.last_index());
        self.durable_index = self.durable_index.max(durable_index.min(verified));
        self.commit_index = self.commit_index.max(commit_index.min(verified));
        if let Lease::Granted { anchor } = lease {
            self.accept_grant(anchor);
        }
        if let Some(through) = flush_through {
            if through > self.persisted_index() {
                self.request_sync(self.log.last_index());
            }
        }
        self.send_append_reply(true);
    }

    /// Log matching: returns the highest index now known to match the leader's log, or
    /// `None` if `prev` does not match.
    fn match_and_append(
        &mut self,
        prev_epoch: Epoch,
        prev_index: LogIndex,
        entries: Vec<Entry>,
    ) -> Option<LogIndex> {
        let snapshot = self.log.snapshot();
        let matched_end = LogIndex(prev_index.0 + entries.len() as u64);
        let (prev_epoch, prev_index, entries) = if prev_index < snapshot.last_index {
            // Entries up to our snapshot are durable, hence the leader's too; skip them.
            let rest = entries.into_iter().filter(|e| e.index > snapshot.last_index).collect();
            (snapshot.last_epoch, snapshot.last_index, rest)
        } else {
            (prev_epoch, prev_index, entries)
        };
        if self.log.epoch_at(prev_index) != Some(prev_epoch) {
            return None;
        }
        for entry in entries {
            assert!(entry.epoch >= prev_epoch, "leader's entries go back in epoch");
            match self.log.epoch_at(entry.index) {
                Some(epoch) if epoch == entry.epoch => continue,
                Some(_) => self.truncate_after(entry.index.prev()),
                None => {}
            }
            self.append_entry(entry);
        }
        let matched = matched_end.max(prev_index);
        assert!(matched <= self.log.last_index());
        Some(matched)
    }

    /// Renews the lease from a grant anchored at `anchor` (this node's clock), unless a
    /// mark-out was acknowledged after it (ORCA digest §7.9).
    fn accept_grant(&mut self, anchor: Time) {
        // An anchor from the future cannot be one of this incarnation's replies (a
        // driver whose clock restarted): never trust it.
        if self.lease_floor.is_some_and(|floor| anchor < floor) || anchor > self.now {
            return;
        }
        let until = anchor + self.config.mark_out_timeout;
        self.lease_until = Some(self.lease_until.map_or(until, |t| t.max(until)));
        assert!(self.lease_until.is_some_and(|t| t <= self.now + self.config.mark_out_timeout));
    }

    /// Replies to the current leader (after an Append, or unsolicited after an fsync).
    pub(super) fn send_append_reply(&mut self, success: bool) {
        if let Some(leader) = self.leader.filter(|l| *l != self.config.node_id) {
            self.send_append_reply_to(leader, success);
        }
    }

    fn send_append_reply_to(&mut self, to: NodeId, success: bool) {
        // Acknowledges a forced mark-out: grants anchored before now are ignored from here
        // on. Only when asked: raising the floor on every reply of a follower without a
        // lease would reject every grant once the round trip exceeds the heartbeat interval
        // (each grant echoes a reply at least a round trip old).
        let asked = self.mark_out_asked || self.config.unsafe_release_unasked;
        let released = asked && !self.follower_active();
        if released {
            self.lease_floor = Some(self.now);
            self.lease_until = None;
        }
        let hint = self.log.last_index().min(if success {
            self.log.last_index()
        } else {
            self.mismatch_hint()
        });
        let reply = Message::AppendReply {
            epoch: self.hard.epoch,
            success,
            last_index: hint,
            persisted_index: self.persisted_index(),
            applied_index: self.kv.applied_index(),
            match_index: self.verified_index,
            released,
            echo_sent_at: self.echo_sent_at,
            sent_at: self.now,
        };
        self.out.messages.push((to, reply));
    }

    /// Where the leader should resume after a mismatch: our durable index (never in
    /// conflict) or the verified prefix, whichever is higher, capped by the log end.
    fn mismatch_hint(&self) -> LogIndex {
        self.durable_index.max(self.verified_index).max(self.log.snapshot().last_index)
    }

    /// A chunk of the leader's snapshot: kept if it continues the bytes held (a chunk at
    /// offset 0 starts a new snapshot), installed once all `total` bytes are held. The
    /// reply says how far the follower got.
    pub(super) fn on_install_snapshot(
        &mut self,
        from: NodeId,
        epoch: Epoch,
        meta: SnapshotMeta,
        offset: u64,
        total: u64,
        data: Vec<u8>,
    ) {
        if epoch < self.hard.epoch {
            let reply = Message::InstallSnapshotReply {
                epoch: self.hard.epoch,
                last_index: LogIndex::ZERO,
                received: 0,
            };
            return self.out.messages.push((from, reply));
        }
        self.heard_from_leader(from, epoch);
        let s = meta.last_index;
        let covered =
            s <= self.log.snapshot().last_index || self.log.epoch_at(s) == Some(meta.last_epoch);
        let mut received = 0;
        if covered {
            self.verified_index = self.verified_index.max(s);
            self.receiving = None;
            received = total;
        } else if self.install_pending.is_none() {
            if offset == 0 && self.receiving.as_ref().is_none_or(|(m, _)| *m != meta) {
                self.receiving = Some((meta, Vec::new()));
            }
            if let Some((held_meta, held)) = &mut self.receiving {
                if *held_meta == meta {
                    let fits =
                        offset.checked_add(data.len() as u64).is_some_and(|end| end <= total);
                    if offset == held.len() as u64 && fits {
                        held.extend_from_slice(&data);
                        self.counters.snapshot_chunks_received += 1;
                    }
                    received = held.len() as u64;
                }
            }
            if received == total && total > 0 {
                let (meta, data) = self.receiving.take().expect("held");
                self.install(meta, data);
                self.verified_index = s;
            }
        }
        let reply = Message::InstallSnapshotReply {
            epoch: self.hard.epoch,
            last_index: self.verified_index.min(s),
            received,
        };
        self.out.messages.push((from, reply));
    }

    /// Replaces the state with a leader's snapshot (taken at or below its durable index,
    /// so never rolled back). Keeps the durable log prefix on disk until it is saved.
    fn install(&mut self, meta: SnapshotMeta, data: Vec<u8>) {
        assert!(meta.last_index > self.durable_index, "installing a snapshot we already cover");
        let at = Version { epoch: meta.last_epoch, index: meta.last_index };
        let kv = Kv::decode(&data, at, self.config.dedup_clients_max).unwrap_or_else(|e| {
            panic!("leader sent a corrupt snapshot at {}: {e}", meta.last_index)
        });
        let kept = self.durable_index.max(self.log.snapshot().last_index);
        if self.log.last_index() > kept {
            self.truncate_after(kept);
        }
        self.kv = kv;
        self.log = Log::new(meta, Vec::new());
        self.log_synced = self.log_synced.min(kept);
        self.sync_requested = self.sync_requested.min(kept);
        self.durable_index = meta.last_index;
        self.commit_index = self.commit_index.max(meta.last_index);
        let data = Arc::new(data);
        self.install_pending = Some((meta, Arc::clone(&data), kept));
        self.snapshot_building = None;
        self.snapshot_inflight = None;
        self.out.snapshot = Some((meta, data));
        self.out.snapshot_installed = true;
        self.counters.snapshots_installed += 1;
        assert_eq!(self.kv.applied_index(), self.log.last_index());
    }
}
