//! [`LeaderEngine`]: the shared [`Core`] and one role's state, the `step` loop, message
//! dispatch with the validation gate, role changes, timers, invariants and the read-only
//! introspection drivers and the simulator use.
//!
//! ```text
//!             ┌──────────── higher epoch, or a leader of its epoch ────────────┐
//!             ▼                                                                │
//!   Follower(Following) ──pre-vote majority──► Candidate(Campaign) ──votes──► Leader(Leading)
//!             ▲                                                                │
//!             └──────────────── lost its majority (same epoch) ◄───────────────┘
//! ```
//!
//! A role's state is created fresh when the role is entered and dropped when it is left:
//! nothing of a follower's lease or forwards survives into candidacy, nothing of a
//! leader's progress into following.

use super::candidate::Campaign;
use super::core::{Core, Counters, Election, Origin, Snapshots};
use super::follower::{self, Following};
use super::gate;
use super::io::{ClientReply, Config, Input, Message, Outputs, PersistedState, Role, Status};
use super::kv::Kv;
use super::leading::{Leadership, Leading};
use super::log::Log;
use crate::engine::{BootError, Rejection};
use crate::time::Time;
use keel_types::rng::SplitMix64;
use keel_types::{
    ApplySettings, Entry, EntryPayload, Epoch, HardState, KeelError, LogIndex, Membership, NodeId,
    SnapshotMeta, Value, Version,
};

/// The role a node plays now, with that role's state.
#[derive(Debug)]
pub(super) enum RoleState {
    /// Follows a leader (or waits for one). Every node starts as one.
    Follower(Following),
    /// Asking for votes.
    Candidate(Campaign),
    /// Leads its epoch.
    Leader(Box<Leading>),
}

/// The leader engine (ORCA on a Raft-style log). See the module docs and
/// `docs/protocol.md`.
#[derive(Debug)]
pub struct LeaderEngine {
    pub(super) core: Core,
    pub(super) role: RoleState,
}

impl LeaderEngine {
    /// Starts a node from what its disk recovered. Applies the snapshot and every
    /// recovered entry (as followers do); the node starts as a follower outside any
    /// active set. Fails on an invalid configuration, or on persisted state the engine
    /// cannot have written (a snapshot that does not decode, entries out of order, epochs
    /// out of range): the node must not start on it.
    pub fn new(
        config: Config,
        persisted: PersistedState,
        seed: u64,
        now: Time,
    ) -> Result<Self, BootError> {
        config.validate()?;
        gate::check_persisted(&persisted).map_err(BootError::Persisted)?;
        let (meta, mut kv) = match &persisted.snapshot {
            Some((meta, data)) => {
                let at = Version { epoch: meta.last_epoch, index: meta.last_index };
                let kv = Kv::decode(data, at, config.dedup_clients_max).map_err(|e| {
                    let index = meta.last_index;
                    BootError::Persisted(format!("the snapshot at {index} does not decode: {e}"))
                })?;
                (*meta, kv)
            }
            None => (SnapshotMeta::default(), Kv::new(config.dedup_clients_max)),
        };
        kv.unsafe_skip_dedup = config.unsafe_skip_dedup;
        kv.unsafe_accept_expired_sessions = config.unsafe_accept_expired_sessions;
        kv.unsafe_accept_stale_opens = config.unsafe_accept_stale_opens;
        kv.unsafe_watch_ignores_deletes = config.unsafe_watch_ignores_deletes;
        kv.unsafe_serve_held = config.unsafe_slots_serve_held;
        kv.unsafe_fill_overwrites = config.unsafe_slots_fill_overwrites;
        kv.unsafe_take_unasked = config.unsafe_slots_take_unasked;
        let mut log = Log::new(meta, Vec::new());
        for entry in persisted.entries.into_iter().filter(|e| e.index > meta.last_index) {
            kv.apply(&entry);
            log.append(entry);
        }
        let core = Core {
            lease_span: config.leader_lease(),
            rng: SplitMix64::new(seed ^ u64::from(config.node_id.0).rotate_left(32)),
            now,
            hard: persisted.hard_state,
            log_synced: log.last_index(),
            sync_requested: log.last_index(),
            log,
            kv,
            install_pending: None,
            next_flush_at: now + config.flush_interval,
            durable_index: meta.last_index,
            commit_index: meta.last_index,
            // A restarted node neither votes nor accepts lease grants anchored before its
            // boot for a while: a vote it gave or a lease it held before the crash is
            // forgotten, and the leader lease and active-set arguments need both.
            election: Election { deadline: now, contact_at: Some(now), pre_votes: None },
            lease_floor: Some(now),
            snapshots: Snapshots { next_slice_at: now, ..Snapshots::default() },
            counters: Counters::default(),
            transfer_wait: None,
            out: Outputs::default(),
            boot_membership: Membership::of_voters(config.members.clone()),
            config,
        };
        let mut engine = LeaderEngine { core, role: RoleState::Follower(Following::default()) };
        engine.core.reset_election_deadline_at_boot();
        engine.check_invariants();
        Ok(engine)
    }

    /// Handles one input at local time `now` and says what the driver must do, in the
    /// order written on [`Outputs`].
    pub fn step(&mut self, now: Time, input: Input) -> Outputs {
        assert!(
            now >= self.core.now,
            "the local clock went backwards: {now:?} < {:?}",
            self.core.now
        );
        assert!(self.core.out.is_empty(), "outputs left over from an earlier step");
        self.core.now = now;
        match input {
            Input::Tick => {}
            Input::Message { from, message } => self.on_message(from, message),
            Input::Client(request) => self.on_client(Origin::Local, request),
            Input::Clients(requests) => {
                for request in requests {
                    self.on_client(Origin::Local, request);
                }
            }
            Input::LogSynced { index } => self.on_log_synced(index),
            Input::SnapshotSaved { meta } => self.core.on_snapshot_saved(meta),
        }
        self.on_timers();
        self.after_step();
        self.check_invariants();
        self.core.out.wake_at = Some(self.wake_at());
        let rejected = self.core.out.rejected.len() as u64;
        self.core.counters.messages_rejected += rejected;
        self.core.out.events = self.core.kv.take_events();
        std::mem::take(&mut self.core.out)
    }

    /// The validation gate, then dispatch by message kind. Each handler either changes
    /// roles first (a higher epoch, a leader heard from) or runs in the role it finds.
    fn on_message(&mut self, from: NodeId, message: Message) {
        assert_ne!(from, self.core.config.node_id, "a message from self");
        // Any node the peer layer authenticated may write: membership changes, so a
        // node may hear from one it does not know yet (a new leader its log has not
        // made a voter) or no longer counts (a removed member, late). Nothing of one
        // outside the membership in force counts: votes and replies count only from
        // voters and followers the leader tracks.
        if let Err(reason) = gate::check(&message) {
            return self.core.reject(from, reason);
        }
        match message {
            Message::RequestVote { epoch, last_epoch, last_index, transfer } => {
                self.on_request_vote(from, epoch, (last_epoch, last_index), transfer)
            }
            Message::Vote { epoch, granted } => self.on_vote(from, epoch, granted),
            Message::PreVote { epoch, last_epoch, last_index } => {
                self.on_pre_vote(from, epoch, last_epoch, last_index)
            }
            Message::PreVoteReply { epoch, granted } => {
                self.on_pre_vote_reply(from, epoch, granted)
            }
            Message::Append { .. } => self.on_append(from, message),
            Message::AppendReply { .. } => self.on_append_reply(from, message),
            Message::InstallSnapshot { epoch, meta, offset, total, data } => {
                self.on_install_snapshot(from, epoch, meta, offset, total, data)
            }
            Message::InstallSnapshotReply { epoch, last_index, received } => {
                if self.adopt_epoch_or_ignore(epoch) {
                    if let RoleState::Leader(leading) = &mut self.role {
                        leading.on_install_snapshot_reply(
                            &mut self.core,
                            from,
                            last_index,
                            received,
                        );
                    }
                }
            }
            Message::TimeoutNow { epoch, last_epoch, last_index } => {
                self.on_timeout_now(from, epoch, (last_epoch, last_index))
            }
            Message::Forward { epoch, request } => self.on_forward(from, epoch, request),
            Message::ForwardReply { epoch: _, reply } => {
                let wait = self.core.transfer_wait;
                if wait.is_some_and(|w| w.origin == Origin::Local && w.tag == reply.tag) {
                    // A forwarded transfer's answer, whatever this node's role now.
                    self.core.settle_transfer(reply.result);
                } else if let RoleState::Follower(following) = &mut self.role {
                    following.on_forward_reply(&mut self.core, reply);
                }
            }
        }
    }

    /// For replies to a leader: a higher epoch deposes this node (`false`); an older one
    /// is ignored (`false`); this epoch's go on to the leader's handler (`true`).
    fn adopt_epoch_or_ignore(&mut self, epoch: Epoch) -> bool {
        if epoch > self.core.hard.epoch {
            self.become_follower(epoch, None);
            return false;
        }
        epoch == self.core.hard.epoch && matches!(self.role, RoleState::Leader(_))
    }

    fn on_append(&mut self, from: NodeId, message: Message) {
        let Message::Append { epoch, prev_index, entries, .. } = &message else {
            unreachable!("dispatched on the variant")
        };
        let epoch = *epoch;
        if epoch < self.core.hard.epoch {
            // Tells a stale leader our epoch.
            let following = match &mut self.role {
                RoleState::Follower(following) => Some(following),
                _ => None,
            };
            return follower::send_append_reply(&mut self.core, following, from, false);
        }
        if let Err(reason) = self.leader_of_epoch_may_be(from, epoch) {
            return self.core.reject(from, reason);
        }
        let floor = self.conflict_floor(epoch);
        if let Err(reason) =
            gate::check_entries_against_log(&self.core, floor, *prev_index, entries)
        {
            return self.core.reject(from, reason);
        }
        self.heard_from_leader(from, epoch);
        let RoleState::Follower(following) = &mut self.role else {
            unreachable!("heard_from_leader made this node a follower")
        };
        following.on_append(&mut self.core, message);
    }

    /// The highest index below which the leader of `epoch` may not replace this node's
    /// log: the durable index, or, following that epoch's leader already, the prefix
    /// verified to match its log.
    fn conflict_floor(&self, epoch: Epoch) -> LogIndex {
        let verified = match &self.role {
            RoleState::Follower(f) if epoch == self.core.hard.epoch => f.verified_index,
            _ => LogIndex::ZERO,
        };
        self.core.durable_index.max(verified)
    }

    /// Whether `from` may be the leader of `epoch` (at least this node's epoch): not when
    /// this node leads that epoch, nor when it already follows another leader of it
    /// (one leader per epoch).
    fn leader_of_epoch_may_be(&self, from: NodeId, epoch: Epoch) -> Result<(), &'static str> {
        if epoch > self.core.hard.epoch {
            return Ok(());
        }
        match &self.role {
            RoleState::Leader(_) => Err("a second leader of this node's epoch"),
            RoleState::Follower(f) if f.leader.is_some_and(|l| l != from) => {
                Err("a second leader of this node's epoch")
            }
            _ => Ok(()),
        }
    }

    fn on_append_reply(&mut self, from: NodeId, message: Message) {
        let Message::AppendReply { epoch, .. } = message else {
            unreachable!("dispatched on the variant")
        };
        if !self.adopt_epoch_or_ignore(epoch) {
            return;
        }
        let RoleState::Leader(leading) = &mut self.role else { unreachable!("checked") };
        leading.on_append_reply(&mut self.core, from, message);
    }

    fn on_install_snapshot(
        &mut self,
        from: NodeId,
        epoch: Epoch,
        meta: SnapshotMeta,
        offset: u64,
        total: u64,
        data: Vec<u8>,
    ) {
        if epoch < self.core.hard.epoch {
            let reply = Message::InstallSnapshotReply {
                epoch: self.core.hard.epoch,
                last_index: LogIndex::ZERO,
                received: 0,
            };
            return self.core.out.messages.push((from, reply));
        }
        if let Err(reason) = self.leader_of_epoch_may_be(from, epoch) {
            return self.core.reject(from, reason);
        }
        if total > self.core.snapshot_bytes_max() {
            return self.core.reject(from, "snapshot larger than this node's state may be");
        }
        let floor = self.conflict_floor(epoch);
        if let Err(reason) = gate::check_snapshot_against_log(&self.core, floor, &meta) {
            return self.core.reject(from, reason);
        }
        self.heard_from_leader(from, epoch);
        let RoleState::Follower(following) = &mut self.role else {
            unreachable!("heard_from_leader made this node a follower")
        };
        following.on_install_snapshot(&mut self.core, from, meta, offset, total, data);
    }

    /// Accepts `from` as the leader of `epoch` (already checked ≥ ours).
    fn heard_from_leader(&mut self, from: NodeId, epoch: Epoch) {
        assert!(epoch >= self.core.hard.epoch);
        let follower = matches!(self.role, RoleState::Follower(_));
        if epoch > self.core.hard.epoch || !follower {
            let leading = matches!(self.role, RoleState::Leader(_));
            assert!(!leading || epoch > self.core.hard.epoch, "two leaders in {epoch}");
            self.become_follower(epoch, Some(from));
        }
        let RoleState::Follower(following) = &mut self.role else {
            unreachable!("just became a follower")
        };
        following.leader = Some(from);
        let core = &mut self.core;
        core.settle_transfer_if_known(Some(from));
        core.election.pre_votes = None;
        core.election.contact_at = Some(core.now);
        core.reset_election_deadline();
    }

    fn on_log_synced(&mut self, index: LogIndex) {
        let advanced = self.core.on_log_synced(index);
        if let (true, RoleState::Follower(following)) = (advanced, &mut self.role) {
            following.send_reply(&mut self.core, true);
        }
    }

    // ----- role changes ---------------------------------------------------------------

    /// Moves to `epoch` as a follower of `leader` (if known), failing whatever the node
    /// was waiting on as leader. Clears the vote only when the epoch changes.
    ///
    /// The time of the last contact with a leader is kept across the epoch change: it is
    /// a promise made to that leader (its lease counts on this node refusing votes until
    /// `election_timeout_min` after it), and a higher epoch can arrive in a late reply or
    /// forward without any leader of it having been heard (`docs/protocol.md` §4).
    pub(super) fn become_follower(&mut self, epoch: Epoch, leader: Option<NodeId>) {
        assert!(epoch >= self.core.hard.epoch, "stepping back to an older epoch");
        if matches!(self.role, RoleState::Leader(_)) {
            self.step_down();
        }
        if epoch > self.core.hard.epoch {
            // A follower of a known leader, not a leader that just stepped down (whose
            // own contact time may still look live) nor a follower without a leader.
            let following = matches!(&self.role, RoleState::Follower(f) if f.leader.is_some());
            if following && leader.is_none() && self.leader_is_live() {
                // A higher epoch from a reply or forward while a live leader's lease may
                // still count on this node: the case the kept contact is for.
                self.core.counters.epochs_raised_under_live_leader += 1;
            }
            if let RoleState::Follower(following) = &mut self.role {
                following.fail_forwards(&mut self.core);
            }
            self.core.set_hard_state(HardState { epoch, voted_for: None, ..self.core.hard });
            if self.core.config.unsafe_forget_leader_contact {
                self.core.election.contact_at = None;
            }
            self.role = RoleState::Follower(Following::default());
        } else if !matches!(self.role, RoleState::Follower(_)) {
            self.role = RoleState::Follower(Following::default());
        }
        let RoleState::Follower(following) = &mut self.role else { unreachable!("set above") };
        following.leader = leader;
        self.core.election.pre_votes = None;
    }

    /// Leaves leadership: every waiting request is failed, the node follows nobody.
    fn step_down(&mut self) {
        let RoleState::Leader(leading) =
            std::mem::replace(&mut self.role, RoleState::Follower(Following::default()))
        else {
            panic!("stepping down without leading")
        };
        for (origin, tag, result) in leading.fail_all() {
            let reply = ClientReply {
                tag,
                served_by: self.core.config.node_id,
                result,
                durability_round: false,
            };
            self.core.reply(origin, reply);
        }
        self.core.reset_election_deadline();
    }

    pub(super) fn become_leader(&mut self) {
        assert!(matches!(self.role, RoleState::Candidate(_)));
        let core = &mut self.core;
        assert!(core.is_voter(core.config.node_id), "only a voter leads");
        let next = core.log.last_index().next();
        let mut leading = Leading::new(core, next, core.now);
        leading.next_heartbeat_at = core.now + core.config.heartbeat_interval;
        // The epoch's first entry states the settings every replica applies the log with
        // from here on (`docs/protocol.md` §6, *Settings in the log*).
        let dedup_clients_max =
            u32::try_from(core.config.dedup_clients_max).expect("validated under its ceiling");
        let settings = ApplySettings { dedup_clients_max };
        let payload = EntryPayload::Settings(settings);
        let entry = Entry { epoch: core.hard.epoch, index: next, payload };
        core.append_entry(entry);
        leading.noop_index = next;
        // An inherited durable index may lie above this node's own disk (learned outside
        // the active set): fsync the whole log at once, no-op included (§12 item 17).
        core.request_sync(next);
        assert!(core.sync_requested >= core.durable_index || core.persisted_index() >= next);
        leading.broadcast_append(core, true);
        core.settle_transfer_if_known(Some(core.config.node_id));
        self.role = RoleState::Leader(Box::new(leading));
    }

    // ----- timers and the end of a step ---------------------------------------------

    /// Fires whatever timers are due (every step, so any input may serve as a tick).
    fn on_timers(&mut self) {
        let now = self.core.now;
        let leading = matches!(self.role, RoleState::Leader(_));
        if let RoleState::Follower(following) = &mut self.role {
            // Counted, and forgotten (no reader looks at an expired lease).
            if following.lease_until.is_some_and(|until| until <= now) {
                following.lease_until = None;
                self.core.counters.leases_expired += 1;
            }
        }
        self.core.clear_repair_floor_if_repaired();
        if !leading && now >= self.core.election.deadline {
            if !self.core.is_voter(self.core.config.node_id) {
                // A learner, a node joining, or one removed: it never campaigns.
                self.core.reset_election_deadline();
            } else if self.core.hard.repair_floor.is_some()
                && !self.core.config.unsafe_ignore_repair_floor
            {
                // A log cut below what this node may have acknowledged must not lead:
                // wait for a leader to re-replicate it (`docs/protocol.md` §12 item 18).
                self.core.reset_election_deadline();
                self.core.counters.campaigns_withheld += 1;
            } else {
                self.start_pre_vote();
            }
        }
        if let RoleState::Leader(leading) = &mut self.role {
            match leading.on_timers(&mut self.core) {
                Leadership::Kept => {}
                Leadership::Lost => self.step_down(),
                Leadership::HandedOver => {
                    // The target did not take over; this leader gave up its lease for
                    // good, so it campaigns as the transfer's candidate would.
                    self.step_down();
                    self.start_election(true);
                }
            }
        }
        self.core.settle_transfer_if_known(None);
        self.core.flush_if_due();
        self.expire_requests();
    }

    fn expire_requests(&mut self) {
        match &mut self.role {
            RoleState::Follower(following) => following.expire_forwards(&mut self.core),
            RoleState::Leader(leading) => leading.expire_requests(&mut self.core),
            RoleState::Candidate(_) => {}
        }
    }

    fn after_step(&mut self) {
        if let RoleState::Leader(leading) = &mut self.role {
            leading.on_progress(&mut self.core);
            leading.hand_over_if_caught_up(&mut self.core);
        }
        let core = &mut self.core;
        core.kv.forget_undo_through(core.durable_index);
        // An encoding as large as the state is held only while a follower needs it.
        let wanted = match &self.role {
            RoleState::Leader(leading) => leading.snapshot_wanted(core),
            _ => false,
        };
        core.release_unwanted_snapshot(wanted);
        core.maybe_snapshot(wanted);
    }

    fn wake_at(&self) -> Time {
        let core = &self.core;
        let mut at = core.next_flush_at;
        match &self.role {
            RoleState::Leader(leading) => {
                at = at.min(leading.next_heartbeat_at);
                // The next key's time; one already due waits for room in the log (at the
                // next heartbeat) rather than waking the engine at once, again and again.
                // None while a transfer is under way (nothing is appended then).
                let expiry = leading.next_expiry_at(core).filter(|_| leading.transfer.is_none());
                if let Some(expiry) = expiry.filter(|t| *t > core.now || core.log_has_room()) {
                    at = at.min(expiry);
                }
                if let Some(deadline) = leading.deadline_min() {
                    at = at.min(deadline);
                }
            }
            RoleState::Follower(following) => {
                at = at.min(core.election.deadline);
                if let Some(until) = following.lease_until.filter(|t| *t > core.now) {
                    at = at.min(until); // so that `status().active` turns false on time
                }
                if let Some(deadline) = following.deadline_min() {
                    at = at.min(deadline);
                }
            }
            RoleState::Candidate(_) => at = at.min(core.election.deadline),
        }
        if core.snapshots.building.is_some() {
            at = at.min(core.snapshots.next_slice_at);
        }
        if let Some(wait) = &core.transfer_wait {
            at = at.min(wait.deadline);
        }
        at.max(core.now)
    }

    // ----- invariants ----------------------------------------------------------------

    fn check_invariants(&self) {
        let core = &self.core;
        let last = core.log.last_index();
        assert_eq!(core.kv.applied_index(), last, "every entry is applied as it is appended");
        assert!(
            core.durable_index <= last,
            "durable index {} past the log end {last}",
            core.durable_index
        );
        assert!(
            core.durable_index >= core.log.snapshot().last_index,
            "the snapshot is past the durable index"
        );
        assert!(core.persisted_index() <= last);
        assert!(core.kv.undo_floor() <= core.durable_index.max(core.log.snapshot().last_index));
        assert!(core.hard.epoch >= core.log.last_epoch(), "log entry from a future epoch");
        core.kv.check_slots();
        match &self.role {
            RoleState::Leader(leading) => {
                // What the durable index needs: the active set meets every majority of
                // the voters in force (a majority of them, but transiently after a
                // promotion to an even count, when half of them do).
                let voters = core.membership().voters.len();
                assert!(
                    leading.active_voters(core) > voters - core.majority(),
                    "the active set misses a majority of the voters"
                );
                assert!(core.is_voter(core.config.node_id), "a leader that does not vote");
                for id in &leading.active {
                    assert!(leading.progress.contains_key(id), "an active member untracked");
                    let learner = core.membership().contains(*id) && !core.is_voter(*id);
                    let leaving = leading.progress[id].marking_out;
                    let early = core.config.unsafe_learner_reads_early;
                    assert!(!learner || leaving || early, "a learner active, not leaving");
                }
                for id in core.peers() {
                    assert!(leading.progress.contains_key(&id), "a member untracked");
                }
                for (id, p) in &leading.progress {
                    let removed = !core.membership().contains(*id);
                    let kept = core.config.unsafe_count_removed;
                    assert!(
                        !removed || kept || self_marking(p, leading, *id),
                        "a removed member kept"
                    );
                }
                assert_eq!(core.hard.voted_for, Some(core.config.node_id));
                if let Some(transfer) = &leading.transfer {
                    assert!(core.is_voter(transfer.target), "a transfer to a non-voter");
                    assert_ne!(transfer.target, core.config.node_id, "a transfer to itself");
                }
                let handed_over = leading.transfer.is_some_and(|t| t.handed_over);
                let kept = core.config.unsafe_transfer_keeps_lease;
                assert!(handed_over || !leading.lease_given_up, "a lease given up for nothing");
                assert!(
                    !handed_over || leading.lease_given_up || kept,
                    "a transfer handed over with the lease kept"
                );
                assert!(!leading.lease_given_up || !leading.lease_valid(core));
            }
            RoleState::Candidate(campaign) => {
                assert_eq!(core.hard.voted_for, Some(core.config.node_id));
                assert!(campaign.votes.contains(&core.config.node_id));
            }
            RoleState::Follower(following) => {
                assert!(following.verified_index <= last, "verified past the log end");
                assert_ne!(following.leader, Some(core.config.node_id), "following itself");
            }
        }
    }

    // ----- introspection ---------------------------------------------------------------

    /// The node's role.
    pub fn role_kind(&self) -> Role {
        match self.role {
            RoleState::Follower(_) => Role::Follower,
            RoleState::Candidate(_) => Role::Candidate,
            RoleState::Leader(_) => Role::Leader,
        }
    }

    /// The leader this node believes in (itself when it leads).
    pub fn leader(&self) -> Option<NodeId> {
        match &self.role {
            RoleState::Follower(following) => following.leader,
            RoleState::Candidate(_) => None,
            RoleState::Leader(_) => Some(self.core.config.node_id),
        }
    }

    /// Whether this node, as follower, holds a valid active-set lease.
    pub fn follower_active(&self) -> bool {
        match &self.role {
            RoleState::Follower(following) => following.active(&self.core),
            _ => false,
        }
    }

    /// Whether this node leads and a majority acknowledged it recently enough that no
    /// other leader can exist yet (see `Config::leader_lease`).
    pub fn leader_lease_valid(&self) -> bool {
        self.leader_lease_valid_at(self.core.now)
    }

    /// [`Self::leader_lease_valid`] at local time `now` (not before the last step's): what
    /// the node would answer if it stepped now. The simulator checks it on every node at
    /// once.
    pub fn leader_lease_valid_at(&self, now: Time) -> bool {
        match &self.role {
            RoleState::Leader(leading) => {
                leading.lease_valid_at(&self.core, now.max(self.core.now))
            }
            _ => false,
        }
    }

    /// The node's externally visible state.
    pub fn status(&self) -> Status {
        let core = &self.core;
        let (active_set, transfer) = match &self.role {
            RoleState::Leader(leading) => (leading.active_set(core), leading.transfer),
            _ => (Vec::new(), None),
        };
        let role = self.role_kind();
        Status {
            node_id: core.config.node_id,
            role,
            epoch: core.hard.epoch,
            leader: self.leader(),
            last_index: core.log.last_index(),
            commit_index: core.commit_index,
            durable_index: core.durable_index,
            persisted_index: core.persisted_index(),
            applied_index: core.kv.applied_index(),
            active: role == Role::Leader || self.follower_active(),
            active_set,
            snapshot_index: core.log.snapshot().last_index,
            snapshot_held_bytes: core.snapshots.held.as_ref().map_or(0, |(_, d)| d.len() as u64),
            leader_lease_valid: self.leader_lease_valid(),
            repair_floor: self.core.hard.repair_floor,
            dedup_clients_max: core.kv.dedup_clients_max(),
            voters: core.membership().voters.clone(),
            learners: core.membership().learners.clone(),
            membership_index: core.membership_version().index,
            transfer_to: transfer.map(|t| t.target),
            handed_over: transfer.is_some_and(|t| t.handed_over),
        }
    }

    /// The configuration the engine runs with.
    pub fn config(&self) -> &Config {
        &self.core.config
    }

    /// Counters for metrics.
    pub fn counters(&self) -> Counters {
        self.core.counters
    }

    /// The entry at `index`, if the log holds it (not compacted, not past the end).
    pub fn entry(&self, index: LogIndex) -> Option<&Entry> {
        self.core.log.entry(index)
    }

    /// The held entries from `from` to `to`, both inclusive.
    pub fn log_entries(&self, from: LogIndex, to: LogIndex) -> impl Iterator<Item = &Entry> {
        self.core.log.range(from, to)
    }

    /// The epoch of the entry at `index` (also known at the snapshot boundary).
    pub fn term_at(&self, index: LogIndex) -> Option<Epoch> {
        self.core.log.epoch_at(index)
    }

    /// A key's applied value and the version that set it; `None` if never written.
    /// (`Some((None, v))` is a tombstone.)
    pub fn read_applied(&self, key: &[u8]) -> Option<(Option<Value>, Version)> {
        match self.core.kv.get(key) {
            (value, Some(version)) => Some((value, version)),
            (_, None) => None,
        }
    }

    /// Whether `key` is live in the applied state (a string or a collection, not expired
    /// by an applied expiry entry).
    pub fn key_live(&self, key: &[u8]) -> bool {
        self.core.kv.item(key).is_some_and(super::kv::Item::live)
    }

    /// A deterministic digest of the applied state (at the applied index).
    pub fn applied_digest(&self) -> u64 {
        self.core.kv.applied_digest()
    }

    /// A deterministic digest of the state as of `index`, if this node can still build
    /// it: between its undo floor (about its durable index) and its applied index. Two
    /// nodes' digests at the same durable index must agree.
    pub fn digest_at(&self, index: LogIndex) -> Option<u64> {
        let kv = &self.core.kv;
        let reachable = index >= kv.undo_floor() && index <= kv.applied_index();
        reachable.then(|| kv.digest_at(index))
    }

    /// The error a request gets at a node that cannot serve it and knows no other leader.
    pub(super) fn not_leader_error(&self) -> KeelError {
        KeelError::NotLeader { leader: self.leader().filter(|l| *l != self.core.config.node_id) }
    }
}

/// Whether a removed member the leader still tracks is on its way out: in the active set,
/// being marked out.
fn self_marking(p: &super::leading::Progress, leading: &Leading, id: NodeId) -> bool {
    leading.active.contains(&id) && p.marking_out
}

impl Core {
    /// Drops a peer message that broke the protocol's rules, saying why.
    pub(super) fn reject(&mut self, from: NodeId, reason: &'static str) {
        self.out.rejected.push(Rejection { from, reason });
    }

    /// The largest snapshot encoding this node accepts: every item of a state at its
    /// limit, and room for the dedup table.
    pub(super) fn snapshot_bytes_max(&self) -> u64 {
        self.config.state_bytes_max.saturating_mul(2).saturating_add(256 << 20)
    }
}

/// The leader engine takes the front door's request as it is, but for a synchronization
/// (Kite's `ACQUIRE`, `RELEASE`, `STRONG`, `WEAK`) and a geo keyspace's operation, which
/// it has no meaning for.
impl crate::engine::FromClient for super::io::ClientRequest {
    fn from_client(request: Self) -> Result<Self, KeelError> {
        if let keel_types::Command::Geo(op) = &request.command {
            return Err(KeelError::InvalidArgument(format!(
                "{} has no meaning in an orca keyspace: it needs a geo keyspace",
                op.name()
            )));
        }
        if request.mode != crate::engine::OpMode::Plain {
            let word = request.mode.word();
            return Err(KeelError::InvalidArgument(format!(
                "{word} has no meaning in an orca keyspace"
            )));
        }
        Ok(request)
    }
}

impl crate::engine::Engine for LeaderEngine {
    type Config = Config;
    type Message = Message;
    type Request = super::io::ClientRequest;
    type Reply = ClientReply;
    type Status = Status;
    type Record = keel_types::Entry;

    fn boot(
        config: Config,
        persisted: PersistedState,
        seed: u64,
        now: Time,
    ) -> Result<Self, BootError> {
        LeaderEngine::new(config, persisted, seed, now)
    }

    fn step(&mut self, now: Time, input: Input) -> Outputs {
        LeaderEngine::step(self, now, input)
    }

    fn check_message(message: &Message) -> Result<(), &'static str> {
        gate::check(message)
    }

    fn check_invariants(&self) {
        LeaderEngine::check_invariants(self)
    }

    fn node_id(&self) -> NodeId {
        self.core.config.node_id
    }

    fn read_now(&self, request: &super::io::ClientRequest, now: Time) -> Option<ClientReply> {
        LeaderEngine::read_now(self, request, now)
    }

    fn record_events(&mut self, on: bool) {
        self.core.kv.record_events(on);
    }

    fn slot_states(&self, since: u64) -> Option<(u64, Vec<(u16, keel_types::slots::SlotState)>)> {
        let generation = self.core.kv.slot_generation();
        (generation != since).then(|| (generation, self.core.kv.slot_states()))
    }

    fn status(&self) -> Status {
        LeaderEngine::status(self)
    }

    fn role(&self) -> crate::engine::RoleView {
        crate::engine::RoleView {
            role: self.role_kind().name(),
            leader: self.leader(),
            epoch: self.core.hard.epoch.0,
        }
    }

    fn report(&self) -> crate::engine::Report {
        super::report::report(&self.status(), &self.core.counters)
    }

    fn log_page(&self, from: LogIndex, count: usize) -> (Vec<Entry>, LogIndex) {
        let count = u64::try_from(count.max(1)).unwrap_or(u64::MAX);
        let to = LogIndex(from.0.saturating_add(count - 1));
        let entries = self.core.log.range(from, to).cloned().collect();
        (entries, self.core.log.snapshot().last_index)
    }
}
