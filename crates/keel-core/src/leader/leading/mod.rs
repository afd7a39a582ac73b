//! The leader role: [`Leading`], its state, and its handlers.
//!
//! Per follower the leader keeps a [`Progress`]; the active set is the followers in
//! [`Leading::active`] plus the leader. A follower is granted a lease (`Lease::Granted`)
//! only while it is in the set, has persisted and applied the durable index, is not being
//! marked out, and the leader holds its own lease.
//!
//! Layout:
//! - this file: the state, the leader lease, the leader's timers and the active set;
//! - `replication`: `Append`s and snapshot chunks to followers, their replies, and the
//!   commit, persisted-majority and durable indexes;
//! - `requests`: writes and reads at the leader, durability rounds, deadlines.
//!
//! Every handler borrows the [`Core`] and this role's state only; one that ends the
//! leadership says so in its return value and the engine steps down.

mod expiry;
mod membership;
mod replication;
mod requests;
mod transfer;
mod waitlist;

pub use self::expiry::stamp_time;
pub(crate) use self::expiry::timeless;
use self::transfer::Transfer;
pub(super) use self::transfer::TransferDue;
use self::waitlist::Waitlist;
use super::config::MEMBERS_MAX;
use super::core::{Core, Origin};
use super::io::{ClientRequest, RequestTag};
use super::kv::WriteResult;
use crate::time::Time;
use keel_types::{KeelError, LogIndex, NodeId, SnapshotMeta};
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
    /// When (leader clock) the last grant was sent to the follower.
    pub granted_at: Option<Time>,
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

/// A write waiting for its acknowledgement point (the index of its [`Waitlist`]). At
/// its deadline it is answered `Timeout`: the write stays in the log, and a retry with the
/// same `(client, request)` is answered from it.
#[derive(Clone, Debug)]
pub(super) struct PendingWrite {
    pub origin: Origin,
    pub tag: RequestTag,
    pub result: WriteResult,
}

/// A read waiting for the lease, the no-op, or a durability round.
#[derive(Clone, Debug)]
pub(super) struct PendingRead {
    pub origin: Origin,
    pub request: ClientRequest,
    /// Whether it waited for a durability round (for metrics).
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
    /// `replicated` writes, by the index the commit index must reach.
    pub writes_replicated: Waitlist<PendingWrite>,
    /// `durable` writes, by the index a majority must have persisted.
    pub writes_durable: Waitlist<PendingWrite>,
    /// Reads not yet executed: waiting for the leader lease, by the index the commit
    /// index must reach first (this epoch's no-op for `linearizable` reads, else 0).
    pub reads_unplaced: Waitlist<PendingRead>,
    /// Reads executed, by the update index the read point must reach.
    pub reads_placed: Waitlist<PendingRead>,
    /// Entries were appended in this step and are not yet sent (one broadcast per step).
    pub append_due: bool,
    /// The log tail a durability round in flight makes durable, and when it started.
    pub round: Option<(LogIndex, Time)>,
    /// Highest current-epoch index persisted on a majority.
    pub persisted_majority: LogIndex,
    /// Highest index a waiting `durable` write needs fsynced (asked of every follower).
    pub flush_for_writes: LogIndex,
    /// When this node became leader.
    pub since: Time,
    /// A leadership transfer under way (`transfer.rs`).
    pub transfer: Option<Transfer>,
    /// This leader handed its leadership over: it holds no lease for the rest of its
    /// epoch (a transfer's vote may reach a voter of this epoch at any later time).
    pub lease_given_up: bool,
}

/// Whether the leader keeps leading after its timers ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Leadership {
    /// Still leading.
    Kept,
    /// No majority heard from within an election timeout: step down (same epoch).
    Lost,
    /// A transfer's target did not take over in time: step down and campaign in the
    /// next epoch as the transfer's candidate would.
    HandedOver,
}

impl Progress {
    /// A follower the leader knows nothing of yet: sending starts at `next`.
    fn fresh(next: LogIndex, now: Time) -> Progress {
        Progress {
            next,
            match_index: LogIndex::ZERO,
            inflight: 0,
            last_heard: None,
            acked_sent_at: None,
            reply_anchor: None,
            granted_anchor: None,
            granted_at: None,
            acked_point: LogIndex::ZERO,
            persisted_point: LogIndex::ZERO,
            marking_out: false,
            lagging_since: None,
            snapshot_sent_at: None,
            snapshot_sending: None,
            progress_at: now,
        }
    }
}

impl Leading {
    /// Leader state for a new leader whose no-op goes at `next`: a progress for every
    /// other member, and every other voter in the active set (learners join it only as
    /// voters, once caught up).
    pub fn new(core: &Core, next: LogIndex, now: Time) -> Leading {
        let progress = Progress::fresh(next, now);
        Leading {
            progress: core.peers().map(|f| (f, progress.clone())).collect(),
            // ORCA §4.4.2: start with every voter; non-responders leave after rt.
            active: core.voting_peers().collect(),
            noop_index: next,
            next_heartbeat_at: now,
            writes_replicated: Waitlist::default(),
            writes_durable: Waitlist::default(),
            reads_unplaced: Waitlist::default(),
            reads_placed: Waitlist::default(),
            append_due: false,
            round: None,
            persisted_majority: LogIndex::ZERO,
            flush_for_writes: LogIndex::ZERO,
            since: now,
            transfer: None,
            lease_given_up: false,
        }
    }

    /// The earliest deadline of a waiting request.
    pub fn deadline_min(&self) -> Option<Time> {
        [
            self.writes_replicated.deadline_min(),
            self.writes_durable.deadline_min(),
            self.reads_unplaced.deadline_min(),
            self.reads_placed.deadline_min(),
            self.transfer.map(|t| t.deadline),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    pub fn pending_len(&self) -> usize {
        self.writes_replicated.len()
            + self.writes_durable.len()
            + self.reads_unplaced.len()
            + self.reads_placed.len()
    }

    /// Every waiting request with the error its client gets when leadership ends:
    /// writes have an unknown outcome, reads did nothing.
    pub fn fail_all(self) -> Vec<(Origin, RequestTag, WriteResult)> {
        let writes = self.writes_replicated.into_items().chain(self.writes_durable.into_items());
        let writes = writes.map(|w| (w.origin, w.tag, Err(KeelError::Timeout)));
        let reads = self.reads_unplaced.into_items().chain(self.reads_placed.into_items());
        let reads =
            reads.map(|r| (r.origin, r.request.tag, Err(KeelError::NotLeader { leader: None })));
        writes.chain(reads).collect()
    }

    /// Whether a follower needs a snapshot: the log no longer reaches its next index.
    pub fn snapshot_wanted(&self, core: &Core) -> bool {
        let base = core.log.snapshot().last_index;
        self.progress.values().any(|p| p.next <= base)
    }

    /// The leader-clock time from which the leader lease runs at `now`: the newest
    /// `sent_at` a majority (this node counting as `now`) has acknowledged. On the stack
    /// (at most [`MEMBERS_MAX`] times), so asking every `Append` costs no allocation.
    fn lease_start(&self, core: &Core, now: Time) -> Option<Time> {
        let mut times = [Time(0); MEMBERS_MAX];
        let mut len = 0;
        let voters = self.progress.iter().filter(|(id, _)| core.is_voter(**id));
        for at in std::iter::once(now).chain(voters.filter_map(|(_, p)| p.acked_sent_at)) {
            times[len] = at;
            len += 1;
        }
        let times = &mut times[..len];
        times.sort_unstable_by(|a, b| b.cmp(a));
        times.get(core.majority() - 1).copied()
    }

    /// Whether a majority acknowledged this leader recently enough that no other leader
    /// can exist yet (see `Config::leader_lease`).
    pub fn lease_valid(&self, core: &Core) -> bool {
        self.lease_valid_at(core, core.now)
    }

    /// [`Leading::lease_valid`] at local time `now` (not before the last step's).
    pub fn lease_valid_at(&self, core: &Core, now: Time) -> bool {
        !self.lease_given_up
            && self.lease_start(core, now).is_some_and(|start| now < start + core.lease_span)
    }

    /// Fires the leader's timers: quorum loss, removals, mark-outs, heartbeats.
    pub fn on_timers(&mut self, core: &mut Core) -> Leadership {
        let now = core.now;
        let since = self.since;
        let quorum_lost = match self.lease_start(core, now) {
            Some(start) => now >= start + core.config.election_timeout_min,
            None => now >= since + core.config.election_timeout_min,
        };
        if quorum_lost && now >= since + core.config.election_timeout_min {
            return Leadership::Lost;
        }
        if self.transfer_due(core) == TransferDue::Campaign {
            return Leadership::HandedOver;
        }
        self.remove_silent_followers(core);
        core.counters.forced_mark_outs += self.mark_out_slow_followers(core);
        if now >= self.next_heartbeat_at {
            self.next_heartbeat_at = now + core.config.heartbeat_interval;
            self.rewind_stalled_followers(core);
            self.broadcast_append(core, true);
        }
        if self.transfer.is_none() {
            // A transfer's target must come to hold the log's end: nothing is appended.
            self.reap_due(core);
        }
        Leadership::Kept
    }

    /// Entries sent but not acknowledged within `mark_out_timeout` were lost (or the
    /// follower lost them in a crash): send again from the last known match.
    fn rewind_stalled_followers(&mut self, core: &Core) {
        let now = core.now;
        let patience = core.config.mark_out_timeout;
        for p in self.progress.values_mut() {
            if p.next > p.match_index.next() && now >= p.progress_at + patience {
                p.next = p.match_index.next();
                p.inflight = 0;
                p.progress_at = now;
            }
            assert!(p.next > p.match_index || p.next == LogIndex(1));
        }
    }

    /// Removes followers not heard from for `removal_timeout`, and followers being marked
    /// out that were last granted a lease `removal_timeout` ago (never below a majority).
    ///
    /// The second rule needs nothing from the follower's clock: a grant's anchor is the
    /// send time of a reply the leader had already received, so every lease the follower
    /// draws from the grants sent by `granted_at` ends, on the drift bound, before
    /// `granted_at + rt`; a member being marked out gets no further grant. It removes a
    /// follower whose `released` reply never counts, such as one whose clock restarted
    /// lower (its replies' `sent_at` stay below the anchor granted before the reboot).
    fn remove_silent_followers(&mut self, core: &mut Core) {
        let now = core.now;
        let rt = core.config.removal_timeout;
        let silent: Vec<NodeId> = self
            .active
            .iter()
            .copied()
            .filter(|f| {
                let p = &self.progress[f];
                let heard = p.last_heard.unwrap_or(self.since);
                let granted = p.granted_at.unwrap_or(self.since);
                now >= heard + rt || (p.marking_out && now >= granted + rt)
            })
            .collect();
        for follower in silent {
            self.remove_from_active_set(core, follower);
        }
    }

    pub fn remove_from_active_set(&mut self, core: &mut Core, follower: NodeId) {
        let majority = core.majority();
        let voter = core.is_voter(follower);
        if !self.active.contains(&follower) || (voter && self.active_voters(core) <= majority) {
            return; // never below a majority of voters (the leader counts itself)
        }
        self.active.remove(&follower);
        let progress = self.progress.get_mut(&follower).expect("a member");
        progress.marking_out = false;
        if !core.membership().contains(follower) && !core.config.unsafe_count_removed {
            // A removed member left the active set: the leader forgets it.
            self.progress.remove(&follower);
        }
        assert!(self.active_voters(core) >= majority || !voter);
        core.counters.removals += 1;
    }

    /// The voters in the active set, the leader included.
    pub fn active_voters(&self, core: &Core) -> usize {
        1 + self.active.iter().filter(|f| core.is_voter(**f)).count()
    }

    /// Brings the followers in line with the membership in force, after this leader
    /// appended a membership entry: a new member gets a progress (sending starts from the
    /// log's end and backs off); a removed one leaves the active set as any member marked
    /// out does (its acknowledgement, or `rt`), and is forgotten then, or at once if it
    /// was not in the set. Until then it still counts toward the durable index, never
    /// toward a commit or a `durable` write.
    pub fn sync_membership(&mut self, core: &Core) {
        let next = core.log.last_index();
        for peer in core.peers() {
            self.progress.entry(peer).or_insert_with(|| Progress::fresh(next, core.now));
        }
        let membership = core.membership();
        let not_voting: Vec<NodeId> =
            self.progress.keys().copied().filter(|id| !membership.is_voter(*id)).collect();
        let keep_removed = core.config.unsafe_count_removed;
        for id in not_voting {
            // A member removed, or removed and added again as a learner at once.
            match (self.active.contains(&id), membership.contains(id) || keep_removed) {
                (true, _) => self.progress.get_mut(&id).expect("tracked").marking_out = true,
                (false, false) => drop(self.progress.remove(&id)),
                (false, true) => {}
            }
        }
    }

    /// Forced mark-out (ORCA §4.4.2): a follower whose persisted index lags the log by
    /// more than `slow_follower_lag_max` for `slow_follower_timeout`, or one past the
    /// active-set target. The leader stops granting; removal follows the follower's
    /// acknowledgement (a `released` reply sent after the last grant) or `rt`.
    /// Returns how many members it began to mark out.
    fn mark_out_slow_followers(&mut self, core: &Core) -> u64 {
        let marking = |leading: &Leading| {
            leading.active.iter().filter(|f| leading.progress[f].marking_out).count() as u64
        };
        let before = marking(self);
        let now = core.now;
        let last = core.log.last_index();
        let lag_max = core.config.slow_follower_lag_max;
        let timeout = core.config.slow_follower_timeout;
        let target = core.active_set_target();
        for (id, p) in self.progress.iter_mut() {
            let lagging = last.0.saturating_sub(p.persisted_point.0) > lag_max;
            p.lagging_since = if lagging { Some(p.lagging_since.unwrap_or(now)) } else { None };
            let early = core.config.unsafe_learner_reads_early && core.membership().contains(*id);
            // (The control keeps a learner whatever its lag, as it admits it.)
            let kept_early = early && !core.is_voter(*id);
            let slow = p.lagging_since.is_some_and(|since| now >= since + timeout) && !kept_early;
            let voting = core.is_voter(*id) || early;
            if (slow || !voting) && self.active.contains(id) {
                p.marking_out = true;
            }
        }
        // Past the target: mark out the members furthest behind first.
        let mut staying: Vec<(LogIndex, NodeId)> = self
            .active
            .iter()
            .filter(|f| !self.progress[f].marking_out && core.is_voter(**f))
            .map(|f| (self.progress[f].acked_point, *f))
            .collect();
        staying.sort();
        let excess = (staying.len() + 1).saturating_sub(target);
        for (_, id) in staying.into_iter().take(excess) {
            self.progress.get_mut(&id).expect("a member").marking_out = true;
        }
        // A member is marked out only to be removed, and removals stop at a majority: if
        // the members kept (the leader counting itself) fall short of one, the most
        // caught-up of those being marked out stay, and go on getting leases. Otherwise
        // a slow member of a majority-sized active set would be refused leases for good
        // (found by the simulator with an active-set target of a bare majority).
        let majority = core.majority();
        let kept = |leading: &Leading| {
            let staying = |f: &&NodeId| !leading.progress[f].marking_out && core.is_voter(**f);
            1 + leading.active.iter().filter(staying).count()
        };
        if kept(self) < majority {
            let mut leaving: Vec<(LogIndex, NodeId)> = self
                .active
                .iter()
                .filter(|f| self.progress[f].marking_out && core.is_voter(**f))
                .map(|f| (self.progress[f].acked_point, *f))
                .collect();
            leaving.sort();
            // Short of a majority only just after a promotion to an even count, while
            // the new voter is not yet admitted (`Leading::sync_membership`).
            while kept(self) < majority {
                let Some((_, id)) = leaving.pop() else { break };
                self.progress.get_mut(&id).expect("a member").marking_out = false;
            }
        }
        let members = kept(self);
        assert!(members <= target.max(1), "more members kept than the target");
        marking(self).saturating_sub(before)
    }

    /// Admits followers that have persisted and applied the durable index (ORCA §4.4.2
    /// re-admission), are not slow, and answered within `mark_out_timeout`, up to the
    /// target size.
    ///
    /// Only voters are admitted: a learner counts for nothing, so it serves no
    /// `monotonic` read until it is promoted and holds the durable index as any member.
    fn admit_followers(&mut self, core: &Core) {
        let now = core.now;
        let durable = core.durable_index;
        let recent = core.config.mark_out_timeout;
        let target = core.active_set_target();
        let early = core.config.unsafe_learner_reads_early;
        for (id, p) in self.progress.iter_mut() {
            let voter = core.is_voter(*id);
            let staying = self.active.iter().filter(|f| core.is_voter(**f)).count();
            if voter && staying + 1 >= target {
                continue;
            }
            let heard = p.last_heard.is_some_and(|t| now < t + recent);
            let learner_early = early && !voter && core.membership().contains(*id);
            if !self.active.contains(id)
                && heard
                && ((voter && p.acked_point >= durable && p.lagging_since.is_none())
                    || learner_early)
            {
                assert!(!p.marking_out);
                self.active.insert(*id);
            }
        }
    }

    /// The active set, this node included, in id order.
    pub fn active_set(&self, core: &Core) -> Vec<NodeId> {
        let mut set: Vec<NodeId> = self.active.iter().copied().collect();
        set.push(core.config.node_id);
        set.sort();
        set
    }
}
