//! [`LeaderEngine`]: its state, the `step` loop, timers, elections, role changes,
//! snapshots and the read-only introspection drivers and the simulator use.
//!
//! Role-specific handlers live beside this file: `replication.rs` (the leader's side
//! of Append, the active set, durable index and rounds), `follower.rs` (the follower's
//! side of Append and InstallSnapshot, its lease) and `client.rs` (requests, reads,
//! writes, forwarding).

use super::config::ConfigError;
use super::io::{
    ClientReply, Config, Input, Message, Outputs, PersistedState, Release, Role, SnapshotBytes,
    Status,
};
use super::kv::Kv;
use super::log::Log;
use super::replication::Leading;
use crate::time::{Span, Time};
use keel_types::rng::SplitMix64;
use keel_types::{
    Entry, EntryPayload, Epoch, HardState, KeelError, LogIndex, NodeId, SnapshotMeta, Value,
    Version,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

pub(super) use super::client::Origin;

/// Counters for metrics and the simulator's reports. Monotonic within one incarnation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Durability rounds started by this node as leader.
    pub durability_rounds: u64,
    /// Reads that waited for a durability round.
    pub reads_with_round: u64,
    /// Requests this node forwarded to the leader.
    pub forwarded: u64,
    /// Elections this node started.
    pub elections: u64,
    /// Followers this node (as leader) removed from the active set.
    pub removals: u64,
    /// Entries rolled back after a log truncation.
    pub rolled_back_entries: u64,
    /// Snapshots installed from a leader.
    pub snapshots_installed: u64,
    /// Snapshots this node encoded and handed to its driver to save.
    pub snapshots_taken: u64,
    /// `InstallSnapshot` chunks this node accepted.
    pub snapshot_chunks_received: u64,
}

/// The leader engine (ORCA on a Raft-style log). See the module docs and
/// `docs/protocol.md`.
#[derive(Debug)]
pub struct LeaderEngine {
    pub(super) config: Config,
    pub(super) lease_span: Span,
    rng: SplitMix64,
    pub(super) now: Time,
    pub(super) hard: HardState,
    pub(super) role: Role,
    pub(super) leader: Option<NodeId>,
    pub(super) log: Log,
    pub(super) kv: Kv,
    /// Highest index the driver reported fsynced (clamped on truncation).
    pub(super) log_synced: LogIndex,
    /// Highest index this node asked the driver to fsync.
    pub(super) sync_requested: LogIndex,
    /// An installed snapshot not yet durable, and the log prefix kept below it.
    pub(super) install_pending: Option<(SnapshotMeta, SnapshotBytes, LogIndex)>,
    /// Follower: the snapshot being received from the leader, the bytes so far.
    pub(super) receiving: Option<(SnapshotMeta, Vec<u8>)>,
    pub(super) next_flush_at: Time,
    /// ORCA durable index as this node knows it (never decreases).
    pub(super) durable_index: LogIndex,
    /// Raft commit index as this node knows it (never decreases).
    pub(super) commit_index: LogIndex,
    /// Follower: highest index verified, in this epoch, to match the leader's log.
    pub(super) verified_index: LogIndex,
    pub(super) election_deadline: Time,
    /// When this node last heard from a live leader of its epoch (leader stickiness).
    pub(super) leader_contact_at: Option<Time>,
    pub(super) votes: BTreeSet<NodeId>,
    /// Pre-votes collected while probing for an election (`None`: not probing).
    pub(super) pre_votes: Option<BTreeSet<NodeId>>,
    /// Follower: the lease ends at this local time.
    pub(super) lease_until: Option<Time>,
    /// Follower: grants anchored before this time are ignored (mark-out acknowledged).
    pub(super) lease_floor: Option<Time>,
    /// Follower: the latest `Append` asked for a forced mark-out (`Lease::MarkOut`).
    pub(super) mark_out_asked: bool,
    /// Follower: the newest `sent_at` of an `Append` received in this epoch.
    pub(super) echo_sent_at: Time,
    pub(super) leading: Option<Leading>,
    /// Follower: requests forwarded to the leader, by tag.
    pub(super) forwards: BTreeMap<super::io::RequestTag, super::client::Forwarded>,
    /// The newest durable snapshot's encoding, held only while a follower the log no
    /// longer reaches needs it (one is taken when such a follower appears).
    pub(super) snapshot: Option<(SnapshotMeta, SnapshotBytes)>,
    /// A snapshot being encoded, a slice at a time (`Kv::continue_snapshot`) ...
    pub(super) snapshot_building: Option<(SnapshotMeta, Vec<u8>)>,
    /// ... at most one slice per `snapshot_slice_interval`: not before this time.
    pub(super) next_slice_at: Time,
    /// A snapshot handed to the driver, not yet saved.
    pub(super) snapshot_inflight: Option<(SnapshotMeta, SnapshotBytes)>,
    pub(super) counters: Counters,
    pub(super) out: Outputs,
}

impl LeaderEngine {
    /// Starts a node from what its disk recovered. Applies the snapshot and every
    /// recovered entry (as followers do); the node starts as a follower outside any
    /// active set. Panics if the snapshot bytes are corrupt (a storage failure).
    pub fn new(
        config: Config,
        persisted: PersistedState,
        seed: u64,
        now: Time,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        let (meta, mut kv) = match &persisted.snapshot {
            Some((meta, data)) => {
                let at = Version { epoch: meta.last_epoch, index: meta.last_index };
                let kv = Kv::decode(data, at, config.dedup_clients_max)
                    .unwrap_or_else(|e| panic!("corrupt snapshot at {}: {e}", meta.last_index));
                (*meta, kv)
            }
            None => (SnapshotMeta::default(), Kv::new(config.dedup_clients_max)),
        };
        let mut log = Log::new(meta, Vec::new());
        for entry in persisted.entries.into_iter().filter(|e| e.index > meta.last_index) {
            kv.apply(&entry);
            log.append(entry);
        }
        assert!(
            persisted.hard_state.epoch >= log.last_epoch(),
            "log holds an epoch newer than the hard state"
        );
        let mut engine = LeaderEngine {
            lease_span: config.leader_lease(),
            rng: SplitMix64::new(seed ^ u64::from(config.node_id.0).rotate_left(32)),
            now,
            hard: persisted.hard_state,
            role: Role::Follower,
            leader: None,
            log_synced: log.last_index(),
            sync_requested: log.last_index(),
            log,
            kv,
            install_pending: None,
            receiving: None,
            next_flush_at: now + config.flush_interval,
            durable_index: meta.last_index,
            commit_index: meta.last_index,
            verified_index: LogIndex::ZERO,
            election_deadline: now,
            leader_contact_at: None,
            votes: BTreeSet::new(),
            pre_votes: None,
            lease_until: None,
            lease_floor: None,
            mark_out_asked: false,
            echo_sent_at: Time::default(),
            leading: None,
            forwards: BTreeMap::new(),
            snapshot: None,
            snapshot_building: None,
            next_slice_at: now,
            snapshot_inflight: None,
            counters: Counters::default(),
            out: Outputs::default(),
            config,
        };
        // A restarted node neither votes nor accepts lease grants anchored before its
        // boot for a while: a vote it gave or a lease it held before the crash is
        // forgotten, and the leader lease and active-set arguments need both.
        engine.leader_contact_at = Some(now);
        engine.lease_floor = Some(now);
        engine.reset_election_deadline();
        engine.check_invariants();
        Ok(engine)
    }

    /// Handles one input at local time `now` and says what the driver must do, in the
    /// order written on [`Outputs`].
    pub fn step(&mut self, now: Time, input: Input) -> Outputs {
        assert!(now >= self.now, "the local clock went backwards: {now:?} < {:?}", self.now);
        assert_eq!(self.out, Outputs::default(), "outputs left over from an earlier step");
        self.now = now;
        match input {
            Input::Tick => {}
            Input::Message { from, message } => self.on_message(from, message),
            Input::Client(request) => self.on_client(Origin::Local, request),
            Input::LogSynced { index } => self.on_log_synced(index),
            Input::SnapshotSaved { meta } => self.on_snapshot_saved(meta),
        }
        self.on_timers();
        self.after_step();
        self.check_invariants();
        self.out.wake_at = Some(self.wake_at());
        std::mem::take(&mut self.out)
    }

    fn on_message(&mut self, from: NodeId, message: Message) {
        assert_ne!(from, self.config.node_id, "a message from self");
        if !self.config.members.contains(&from) {
            return; // not a member: ignore (misrouted)
        }
        match message {
            Message::RequestVote { epoch, last_epoch, last_index } => {
                self.on_request_vote(from, epoch, last_epoch, last_index)
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
                self.on_install_snapshot_reply(from, epoch, last_index, received)
            }
            Message::Forward { epoch, request } => self.on_forward(from, epoch, request),
            Message::ForwardReply { epoch, reply } => self.on_forward_reply(epoch, reply),
        }
    }

    fn on_log_synced(&mut self, index: LogIndex) {
        let before = self.persisted_index();
        self.log_synced = self.log_synced.max(index.min(self.log.last_index()));
        assert!(self.persisted_index() >= before, "persisted index went backwards");
        if self.role == Role::Follower && self.persisted_index() > before {
            self.send_append_reply(true);
        }
    }

    fn on_snapshot_saved(&mut self, meta: SnapshotMeta) {
        if self.install_pending.as_ref().is_some_and(|(pending, _, _)| *pending == meta) {
            let (meta, data, _) = self.install_pending.take().expect("checked");
            self.log_synced = self.log_synced.max(meta.last_index);
            self.out.release.push(Release::Snapshot(data)); // a follower sends no snapshots
            return;
        }
        if let Some((inflight, data)) = self.snapshot_inflight.take() {
            assert_eq!(inflight, meta, "a snapshot saved that was not asked for");
            if meta.last_index >= self.log.snapshot().last_index && self.install_pending.is_none() {
                let compacted = self.log.compact_through(meta);
                self.out.release.push(Release::Entries(compacted));
                if let Some((_, held)) = self.snapshot.replace((meta, data)) {
                    self.out.release.push(Release::Snapshot(held));
                }
            } else {
                self.out.release.push(Release::Snapshot(data));
            }
        }
    }

    /// Whether a follower needs a snapshot: this node leads and its log no longer reaches
    /// the follower's next index.
    fn snapshot_wanted(&self) -> bool {
        let base = self.log.snapshot().last_index;
        self.leading.as_ref().is_some_and(|l| l.progress.values().any(|p| p.next <= base))
    }

    /// Fires whatever timers are due (every step, so any input may serve as a tick).
    fn on_timers(&mut self) {
        let now = self.now;
        if self.role != Role::Leader && now >= self.election_deadline {
            self.start_pre_vote();
        }
        if self.role == Role::Leader {
            self.leader_timers();
        }
        if now >= self.next_flush_at {
            self.next_flush_at = now + self.config.flush_interval;
            // Ask again even if asked before: a sync overtaken by a truncation may have
            // been reported short, and asking twice costs one fsync.
            self.sync_requested = self.sync_requested.min(self.persisted_index());
            self.request_sync(self.log.last_index());
        }
        self.expire_requests();
    }

    fn after_step(&mut self) {
        if self.role == Role::Leader {
            self.leader_progress();
        }
        self.kv.forget_undo_through(self.durable_index);
        // An encoding as large as the state is held only while a follower needs it.
        let wanted = self.snapshot_wanted();
        if self.snapshot.is_some() && !wanted {
            let (_, held) = self.snapshot.take().expect("checked");
            self.out.release.push(Release::Snapshot(held));
        }
        self.maybe_snapshot(wanted);
    }

    fn wake_at(&self) -> Time {
        let mut at = self.next_flush_at;
        if self.role == Role::Leader {
            if let Some(leading) = &self.leading {
                at = at.min(leading.next_heartbeat_at);
            }
        } else {
            at = at.min(self.election_deadline);
        }
        if let Some(until) = self.lease_until.filter(|t| *t > self.now) {
            at = at.min(until); // so that `status().active` turns false on time
        }
        if let Some(deadline) = self.forwards.values().map(|f| f.deadline).min() {
            at = at.min(deadline);
        }
        if let Some(deadline) = self.leading.as_ref().and_then(|l| l.deadline_min()) {
            at = at.min(deadline);
        }
        if self.snapshot_building.is_some() {
            at = at.min(self.next_slice_at);
        }
        at.max(self.now)
    }

    // ----- persistence helpers --------------------------------------------------------

    /// Highest index durable on this node's disk (reported to the leader).
    pub(super) fn persisted_index(&self) -> LogIndex {
        let synced = self.log_synced.min(self.log.last_index());
        match &self.install_pending {
            Some((_, _, kept)) => synced.min(*kept),
            None => synced,
        }
    }

    /// Highest index this node may serve a `monotonic` read at: durable on the active set
    /// **and** on this node's own disk.
    ///
    /// The durable index a node learned from a leader may lie above its own persisted
    /// index when it was not in that leader's active set: the entries are durable on that
    /// set (a majority, so in every later leader's log), but not yet here. Such a node, as
    /// a new leader, fsyncs its log at once (`become_leader`) and serves only up to this
    /// point meanwhile, so that what it serves is on every active member's disk, its own
    /// included (ORCA §4.5; `docs/protocol.md` §12 item 17).
    pub(super) fn read_point(&self) -> LogIndex {
        let point = self.durable_index.min(self.persisted_index());
        assert!(point <= self.durable_index && point <= self.log.last_index());
        point
    }

    /// Asks the driver to fsync through `index` unless already asked.
    pub(super) fn request_sync(&mut self, index: LogIndex) {
        let index = index.min(self.log.last_index());
        if index <= self.persisted_index() || index <= self.sync_requested {
            return;
        }
        self.sync_requested = index;
        self.out.sync_through = Some(self.out.sync_through.map_or(index, |i| i.max(index)));
    }

    pub(super) fn set_hard_state(&mut self, hard: HardState) {
        assert!(hard.epoch >= self.hard.epoch, "epoch goes backwards");
        assert!(
            hard.epoch > self.hard.epoch
                || self.hard.voted_for.is_none()
                || hard.voted_for == self.hard.voted_for
        );
        if hard != self.hard {
            self.hard = hard;
            self.out.hard_state = Some(hard);
        }
    }

    /// Appends and applies one entry (any role); returns what applying it produced.
    pub(super) fn append_entry(&mut self, entry: Entry) -> super::kv::Applied {
        let applied = self.kv.apply(&entry);
        self.log.append(entry.clone());
        self.out.append.push(entry);
        applied
    }

    /// Removes entries after `index` and rolls their effects back (ORCA digest §7.5).
    pub(super) fn truncate_after(&mut self, index: LogIndex) {
        assert!(index >= self.durable_index, "truncating durable entries at {index}");
        assert!(
            self.out.truncate_after.is_none() && self.out.append.is_empty(),
            "one truncation per step, first"
        );
        let removed = self.log.last_index().0.saturating_sub(index.0);
        let epoch = self.log.epoch_at(index).expect("truncation point is held");
        self.log.truncate_after(index);
        self.kv.rollback_after(index, epoch);
        self.log_synced = self.log_synced.min(index);
        self.sync_requested = self.sync_requested.min(index);
        self.counters.rolled_back_entries += removed;
        self.out.truncate_after = Some(index);
    }

    /// Starts a snapshot when one is due, and encodes the next slice of the one being
    /// taken; a complete one goes to the driver to save. A snapshot is due once the
    /// durable index is `snapshot_entries_threshold` entries past the last one and the
    /// log holds `snapshot_log_percent` of the state's bytes, or at once when a follower
    /// needs one (`wanted`) and none is held.
    fn maybe_snapshot(&mut self, wanted: bool) {
        if self.snapshot_building.is_none() {
            let base = self.log.snapshot().last_index;
            let at = self.durable_index.min(self.kv.applied_index());
            let entries_due = at.0.saturating_sub(base.0) >= self.config.snapshot_entries_threshold;
            let bytes_due = u128::from(self.log.bytes()) * 100
                >= u128::from(self.kv.state_bytes()) * u128::from(self.config.snapshot_log_percent);
            // A follower needs one and none is held: take one now, whatever its size.
            let wanted = wanted && self.snapshot.is_none();
            if !(entries_due && bytes_due || wanted)
                || self.snapshot_inflight.is_some()
                || self.install_pending.is_some()
            {
                return;
            }
            let epoch = self.log.epoch_at(at).expect("the durable entry is held");
            let meta = SnapshotMeta { last_index: at, last_epoch: epoch };
            // Reserved, not touched: pages the encoding never reaches are never resident.
            let mut data = Vec::with_capacity(
                usize::try_from(self.kv.state_bytes()).expect("fits") + (1 << 16),
            );
            data.extend_from_slice(&self.kv.begin_snapshot(at));
            self.snapshot_building = Some((meta, data));
        }
        if self.now < self.next_slice_at {
            return;
        }
        // Paced in time, not per step: under load a node takes thousands of steps a
        // second, and encoding a slice in each would stall its replies to the leader
        // behind the whole encoding.
        self.next_slice_at = self.now + self.config.snapshot_slice_interval;
        let (meta, mut data) = self.snapshot_building.take().expect("checked");
        assert_eq!(self.kv.snapshot_in_progress(), Some(meta.last_index));
        assert!(
            meta.last_index <= self.durable_index,
            "snapshots are taken at or below the durable index"
        );
        let budget = usize::try_from(self.config.snapshot_chunk_bytes).expect("fits");
        if !self.kv.continue_snapshot(budget, &mut data) {
            self.snapshot_building = Some((meta, data));
            return;
        }
        let data = Arc::new(data);
        self.out.snapshot = Some((meta, Arc::clone(&data)));
        self.snapshot_inflight = Some((meta, data));
        self.counters.snapshots_taken += 1;
    }

    // ----- elections ---------------------------------------------------------------

    pub(super) fn reset_election_deadline(&mut self) {
        let min = self.config.election_timeout_min.0;
        let max = self.config.election_timeout_max.0;
        self.election_deadline = self.now + Span(self.rng.range(min, max));
    }

    /// Whether this node heard from a live leader too recently to vote (stickiness).
    fn leader_is_live(&self) -> bool {
        if self.role == Role::Leader {
            return true;
        }
        self.leader_contact_at.is_some_and(|at| self.now < at + self.config.election_timeout_min)
    }

    /// Asks every peer whether it would vote for this node (no state changes anywhere).
    fn start_pre_vote(&mut self) {
        assert_ne!(self.role, Role::Leader);
        self.leader = None;
        self.reset_election_deadline();
        self.pre_votes = Some(BTreeSet::from([self.config.node_id]));
        let request = Message::PreVote {
            epoch: self.hard.epoch,
            last_epoch: self.log.last_epoch(),
            last_index: self.log.last_index(),
        };
        self.broadcast(&request);
    }

    /// Sends `message` to every other member, in member order.
    fn broadcast(&mut self, message: &Message) {
        let peers: Vec<NodeId> = self.peers().collect();
        assert!(!peers.contains(&self.config.node_id), "a node never messages itself");
        for peer in peers {
            self.out.messages.push((peer, message.clone()));
        }
    }

    fn log_is_behind(&self, last_epoch: Epoch, last_index: LogIndex) -> bool {
        (last_epoch, last_index) < (self.log.last_epoch(), self.log.last_index())
    }

    fn on_pre_vote(&mut self, from: NodeId, epoch: Epoch, last_epoch: Epoch, last_index: LogIndex) {
        let granted = !self.leader_is_live()
            && epoch >= self.hard.epoch
            && !self.log_is_behind(last_epoch, last_index);
        self.out.messages.push((from, Message::PreVoteReply { epoch: self.hard.epoch, granted }));
    }

    fn on_pre_vote_reply(&mut self, from: NodeId, epoch: Epoch, granted: bool) {
        if epoch > self.hard.epoch && self.role != Role::Leader {
            self.become_follower(epoch, None);
            return;
        }
        let majority = self.config.majority();
        let Some(pre_votes) =
            self.pre_votes.as_mut().filter(|_| granted && epoch <= self.hard.epoch)
        else {
            return;
        };
        pre_votes.insert(from);
        if pre_votes.len() >= majority && self.role != Role::Leader {
            self.start_election();
        }
    }

    fn start_election(&mut self) {
        assert_ne!(self.role, Role::Leader);
        self.become_follower(self.hard.epoch.next(), None);
        self.set_hard_state(HardState {
            epoch: self.hard.epoch,
            voted_for: Some(self.config.node_id),
        });
        self.role = Role::Candidate;
        self.pre_votes = None;
        self.reset_election_deadline();
        self.votes.insert(self.config.node_id);
        self.counters.elections += 1;
        let request = Message::RequestVote {
            epoch: self.hard.epoch,
            last_epoch: self.log.last_epoch(),
            last_index: self.log.last_index(),
        };
        self.broadcast(&request);
        assert!(self.votes.len() < self.config.majority(), "one vote never wins");
    }

    fn on_request_vote(
        &mut self,
        from: NodeId,
        epoch: Epoch,
        last_epoch: Epoch,
        last_index: LogIndex,
    ) {
        if self.leader_is_live() {
            // Stickiness: keep the epoch, refuse (ORCA §4.4.2; the leader lease needs it).
            self.out
                .messages
                .push((from, Message::Vote { epoch: self.hard.epoch, granted: false }));
            return;
        }
        if epoch > self.hard.epoch {
            self.become_follower(epoch, None);
        }
        let up_to_date = !self.log_is_behind(last_epoch, last_index);
        let free = self.hard.voted_for.is_none_or(|v| v == from);
        let granted = epoch == self.hard.epoch && up_to_date && free;
        if granted {
            self.set_hard_state(HardState { epoch, voted_for: Some(from) });
            self.reset_election_deadline();
        }
        assert!(!granted || self.hard.voted_for == Some(from));
        self.out.messages.push((from, Message::Vote { epoch: self.hard.epoch, granted }));
    }

    fn on_vote(&mut self, from: NodeId, epoch: Epoch, granted: bool) {
        if epoch > self.hard.epoch {
            self.become_follower(epoch, None);
            return;
        }
        if self.role != Role::Candidate || epoch != self.hard.epoch || !granted {
            return;
        }
        self.votes.insert(from);
        if self.votes.len() >= self.config.majority() {
            self.become_leader();
        }
    }

    /// Moves to `epoch` as a follower of `leader` (if known), failing whatever the node
    /// was waiting on as leader. Clears the vote only when the epoch changes.
    pub(super) fn become_follower(&mut self, epoch: Epoch, leader: Option<NodeId>) {
        assert!(epoch >= self.hard.epoch, "stepping back to an older epoch");
        if self.role == Role::Leader {
            self.step_down();
        }
        if epoch > self.hard.epoch {
            self.fail_forwards();
            self.set_hard_state(HardState { epoch, voted_for: None });
            self.verified_index = LogIndex::ZERO;
            self.lease_until = None;
            self.mark_out_asked = false;
            self.echo_sent_at = Time::default();
            self.leader_contact_at = None;
        }
        self.role = Role::Follower;
        self.leader = leader;
        self.votes.clear();
        self.pre_votes = None;
        assert!(self.leading.is_none());
    }

    fn step_down(&mut self) {
        let leading = self.leading.take().expect("a leader has leader state");
        for (origin, tag, result) in leading.fail_all(self.leader) {
            let reply = ClientReply {
                tag,
                served_by: self.config.node_id,
                result,
                durability_round: false,
            };
            self.reply(origin, reply);
        }
        self.role = Role::Follower;
        self.leader = None;
        self.reset_election_deadline();
    }

    /// Steps down from leadership without changing epoch (lost its majority).
    pub(super) fn step_down_same_epoch(&mut self) {
        self.step_down();
        assert!(self.role == Role::Follower && self.leading.is_none());
    }

    fn become_leader(&mut self) {
        assert_eq!(self.role, Role::Candidate);
        self.role = Role::Leader;
        self.leader = Some(self.config.node_id);
        self.votes.clear();
        self.receiving = None;
        self.lease_until = None;
        let followers: Vec<NodeId> = self.peers().collect();
        let next = self.log.last_index().next();
        let mut leading = Leading::new(&followers, next, self.now);
        leading.next_heartbeat_at = self.now + self.config.heartbeat_interval;
        self.leading = Some(leading);
        let entry = Entry { epoch: self.hard.epoch, index: next, payload: EntryPayload::Noop };
        self.append_entry(entry);
        self.leading.as_mut().expect("just set").noop_index = next;
        // An inherited durable index may lie above this node's own disk (learned outside
        // the active set): fsync the whole log at once, no-op included (§12 item 17).
        self.request_sync(next);
        assert!(self.sync_requested >= self.durable_index || self.persisted_index() >= next);
        self.broadcast_append(true);
    }

    /// Every member but this node.
    pub(super) fn peers(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.config.members.iter().copied().filter(|m| *m != self.config.node_id)
    }

    /// Whether this node, as follower, holds a valid active-set lease.
    pub(super) fn follower_active(&self) -> bool {
        self.role == Role::Follower && self.lease_until.is_some_and(|t| self.now < t)
    }

    // ----- invariants ----------------------------------------------------------------

    fn check_invariants(&self) {
        let last = self.log.last_index();
        assert_eq!(self.kv.applied_index(), last, "every entry is applied as it is appended");
        assert!(
            self.durable_index <= last,
            "durable index {} past the log end {last}",
            self.durable_index
        );
        assert!(
            self.durable_index >= self.log.snapshot().last_index,
            "the snapshot is past the durable index"
        );
        assert!(self.persisted_index() <= last);
        assert!(self.kv.undo_floor() <= self.durable_index.max(self.log.snapshot().last_index));
        assert!(self.hard.epoch >= self.log.last_epoch(), "log entry from a future epoch");
        match self.role {
            Role::Leader => {
                let leading = self.leading.as_ref().expect("leader state");
                assert!(
                    leading.active.len() + 1 >= self.config.majority(),
                    "active set below a majority"
                );
                assert_eq!(self.hard.voted_for, Some(self.config.node_id));
                assert!(self.lease_until.is_none());
            }
            Role::Follower | Role::Candidate => assert!(self.leading.is_none()),
        }
    }

    // ----- introspection ---------------------------------------------------------------

    /// The node's externally visible state.
    pub fn status(&self) -> Status {
        let active_set = match &self.leading {
            Some(leading) => {
                let mut set: Vec<NodeId> = leading.active.iter().copied().collect();
                set.push(self.config.node_id);
                set.sort();
                set
            }
            None => Vec::new(),
        };
        Status {
            node_id: self.config.node_id,
            role: self.role,
            epoch: self.hard.epoch,
            leader: self.leader,
            last_index: self.log.last_index(),
            commit_index: self.commit_index,
            durable_index: self.durable_index,
            persisted_index: self.persisted_index(),
            applied_index: self.kv.applied_index(),
            active: self.role == Role::Leader || self.follower_active(),
            active_set,
            snapshot_index: self.log.snapshot().last_index,
            snapshot_held_bytes: self.snapshot.as_ref().map_or(0, |(_, data)| data.len() as u64),
            leader_lease_valid: self.leader_lease_valid(),
        }
    }

    /// The configuration the engine runs with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Counters for metrics.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// The entry at `index`, if the log holds it (not compacted, not past the end).
    pub fn entry(&self, index: LogIndex) -> Option<&Entry> {
        self.log.entry(index)
    }

    /// The held entries from `from` to `to`, both inclusive.
    pub fn log_entries(&self, from: LogIndex, to: LogIndex) -> impl Iterator<Item = &Entry> {
        self.log.range(from, to)
    }

    /// The epoch of the entry at `index` (also known at the snapshot boundary).
    pub fn term_at(&self, index: LogIndex) -> Option<Epoch> {
        self.log.epoch_at(index)
    }

    /// A key's applied value and the version that set it; `None` if never written.
    /// (`Some((None, v))` is a tombstone.)
    pub fn read_applied(&self, key: &[u8]) -> Option<(Option<Value>, Version)> {
        match self.kv.get(key) {
            (value, Some(version)) => Some((value, version)),
            (_, None) => None,
        }
    }

    /// A deterministic digest of the applied state (at the applied index).
    pub fn applied_digest(&self) -> u64 {
        self.kv.applied_digest()
    }

    /// A deterministic digest of the state as of `index`, if this node can still build
    /// it: between its undo floor (about its durable index) and its applied index. Two
    /// nodes' digests at the same durable index must agree.
    pub fn digest_at(&self, index: LogIndex) -> Option<u64> {
        let reachable = index >= self.kv.undo_floor() && index <= self.kv.applied_index();
        reachable.then(|| self.kv.digest_at(index))
    }

    pub(super) fn not_leader_error(&self) -> KeelError {
        KeelError::NotLeader { leader: self.leader.filter(|l| *l != self.config.node_id) }
    }
}
