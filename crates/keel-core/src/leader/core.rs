//! [`Core`]: the state every role shares (configuration, clock, hard state, log, state
//! machine, local indexes, snapshots, election timer, counters, the step's outputs) and
//! the helpers every role calls: persistence requests, snapshot taking, replies.
//!
//! Role state lives beside it (`follower.rs`, `candidate.rs`, `leading/`); a handler
//! borrows the [`Core`] and its own role's state, never another role's.

use super::io::{ClientReply, Config, Message, Outputs};
use super::kv::Kv;
use super::log::Log;
use crate::engine::{Release, SnapshotBytes};
use crate::time::{Span, Time};
use keel_types::rng::SplitMix64;
use keel_types::{
    Command, CommandResult, Entry, Epoch, HardState, KeelError, LogIndex, Membership, NodeId,
    SnapshotMeta, Version,
};
use std::collections::BTreeSet;
use std::sync::Arc;

/// Where a request came from, so its reply goes back the same way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A client of this node.
    Local,
    /// A client of `NodeId`, forwarded here.
    Forwarded(NodeId),
}

/// Counters for metrics and the simulator's reports. Monotonic within one incarnation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Durability rounds started by this node as leader.
    pub durability_rounds: u64,
    /// Durability rounds this node finished as leader (a round cut short by losing
    /// leadership is started but not finished).
    pub durability_rounds_finished: u64,
    /// The finished rounds' time, each from its start to its end (engine time,
    /// nanoseconds).
    pub durability_round_nanos: u64,
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
    /// Peer messages the validation gate dropped.
    pub messages_rejected: u64,
    /// Writes at the leader that timed out before their durability point.
    pub writes_timed_out: u64,
    /// Active-set members this node (as leader) began to mark out (slow, or past the
    /// active-set target): `Lease::MarkOut` goes to them.
    pub forced_mark_outs: u64,
    /// Removals that followed a follower's acknowledgement of a mark-out (`released`),
    /// rather than its silence for the removal timeout.
    pub released_removals: u64,
    /// Writes answered from the deduplication table (a retry of a request already
    /// applied).
    pub retries_deduplicated: u64,
    /// Keys this node, as leader, expired by active expiry (its expiry entries).
    pub keys_expired: u64,
    /// Writes refused because their session was no longer in the deduplication table
    /// (`KeelError::SessionExpired`).
    pub sessions_expired: u64,
    /// Of those, opens refused as possibly late copies: stamped below the last use of a
    /// session the table evicted (`Kv::open_is_stale`).
    pub stale_opens_refused: u64,
    /// Active-set leases this node held as a follower that ran out without renewal.
    pub leases_expired: u64,
    /// Election timeouts at which this node did not campaign because its log is below
    /// its repair floor (damaged records cut at recovery, not yet re-replicated).
    pub campaigns_withheld: u64,
    /// Repair floors cleared: the log became durable again through the floor.
    pub logs_repaired: u64,
    /// Times a follower of a live leader (one it knows and heard within
    /// `election_timeout_min`) moved to a higher epoch without hearing its leader (a late
    /// reply or forward): it keeps refusing votes until its promise to the old leader runs
    /// out (`docs/protocol.md` §4).
    pub epochs_raised_under_live_leader: u64,
    /// Leadership transfers this node, as leader, handed over (`TimeoutNow` sent).
    pub transfers_handed_over: u64,
    /// Votes this node granted to a transfer's candidate while it had heard a leader
    /// too recently to vote for any other.
    pub transfer_votes: u64,
}

/// The answer owed to a leadership transfer's client: kept across the role change the
/// transfer asks for, and given when this node hears who leads the next epoch, or at
/// `deadline` (`docs/protocol.md` §16).
#[derive(Clone, Copy, Debug)]
pub(super) struct TransferWait {
    pub origin: Origin,
    pub tag: super::io::RequestTag,
    /// The voter asked to lead.
    pub target: NodeId,
    /// The epoch the transfer was asked in.
    pub epoch: Epoch,
    pub deadline: Time,
    /// Asked of this node as leader (else forwarded by it, in an epoch it may have known
    /// late: only the target's leadership, the leader's reply or the deadline answer it).
    pub asked_as_leader: bool,
}

/// The election timer and what elections remember between roles.
#[derive(Clone, Debug)]
pub(super) struct Election {
    /// When a follower or candidate next probes for an election.
    pub deadline: Time,
    /// When this node last heard from a live leader (leader stickiness); kept when the
    /// epoch changes (`docs/protocol.md` §4).
    pub contact_at: Option<Time>,
    /// Pre-votes collected while probing for an election (`None`: not probing).
    pub pre_votes: Option<BTreeSet<NodeId>>,
}

/// Snapshots this node takes and holds.
#[derive(Clone, Debug, Default)]
pub(super) struct Snapshots {
    /// The newest durable snapshot's encoding, held only while a follower the log no
    /// longer reaches needs it (one is taken when such a follower appears).
    pub held: Option<(SnapshotMeta, SnapshotBytes)>,
    /// A snapshot being encoded, a slice at a time (`Kv::continue_snapshot`) ...
    pub building: Option<(SnapshotMeta, Vec<u8>)>,
    /// ... at most one slice per `snapshot_slice_interval`: not before this time.
    pub next_slice_at: Time,
    /// A snapshot handed to the driver, not yet saved.
    pub inflight: Option<(SnapshotMeta, SnapshotBytes)>,
}

/// State shared by every role.
#[derive(Debug)]
pub(super) struct Core {
    pub config: Config,
    /// The membership in force while the log names none: the configured voters.
    pub boot_membership: Membership,
    /// The leader lease derived from the configuration (`Config::leader_lease`).
    pub lease_span: Span,
    pub rng: SplitMix64,
    pub now: Time,
    pub hard: HardState,
    pub log: Log,
    pub kv: Kv,
    /// Highest index the driver reported fsynced (clamped on truncation).
    pub log_synced: LogIndex,
    /// Highest index this node asked the driver to fsync.
    pub sync_requested: LogIndex,
    /// An installed snapshot not yet durable, and the log prefix kept below it.
    pub install_pending: Option<(SnapshotMeta, SnapshotBytes, LogIndex)>,
    pub next_flush_at: Time,
    /// ORCA durable index as this node knows it (never decreases).
    pub durable_index: LogIndex,
    /// Raft commit index as this node knows it (never decreases).
    pub commit_index: LogIndex,
    pub election: Election,
    /// Lease grants anchored before this time (on this node's clock) are ignored: set at
    /// boot and whenever this node acknowledges a mark-out. Outlives roles and epochs.
    pub lease_floor: Option<Time>,
    pub snapshots: Snapshots,
    pub counters: Counters,
    /// A leadership transfer's client, waiting to hear who leads next.
    pub transfer_wait: Option<TransferWait>,
    pub out: Outputs,
}

impl Core {
    /// The membership in force: the one the log set last (it takes effect when its entry
    /// is appended, and is undone with it), else the configured voters.
    pub fn membership(&self) -> &Membership {
        self.kv.membership().map_or(&self.boot_membership, |(_, m)| m)
    }

    /// The version of the entry that set the membership in force (zero: none did).
    pub fn membership_version(&self) -> Version {
        self.kv.membership().map_or(Version::default(), |(v, _)| *v)
    }

    /// A strict majority of the voters in force.
    pub fn majority(&self) -> usize {
        self.membership().majority()
    }

    /// Whether `node` votes in the membership in force.
    pub fn is_voter(&self, node: NodeId) -> bool {
        self.membership().is_voter(node)
    }

    /// Every member (voter or learner) but this node.
    pub fn peers(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.membership().nodes().filter(|m| *m != self.config.node_id)
    }

    /// Every voter but this node: whom elections ask.
    pub fn voting_peers(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.membership().voters.iter().copied().filter(|m| *m != self.config.node_id)
    }

    /// How many members the leader keeps in its active set, itself included: the
    /// configured target when it names fewer than the configured voters (within a
    /// majority and every voter in force), else every voter in force.
    pub fn active_set_target(&self) -> usize {
        let (configured, voters) = (self.config.active_set_target, self.config.members.len());
        super::config::active_set_target(configured, voters, self.membership().voters.len())
    }

    /// Sends `message` to every other voter, in id order (elections).
    pub fn broadcast(&mut self, message: &Message) {
        let peers: Vec<NodeId> = self.voting_peers().collect();
        assert!(!peers.contains(&self.config.node_id), "a node never messages itself");
        for peer in peers {
            self.out.messages.push((peer, message.clone()));
        }
    }

    pub fn reset_election_deadline(&mut self) {
        let (low, high) = self.config.election_timeout_range();
        self.election.deadline = self.now + Span(self.rng.range(low, high));
    }

    /// The first election deadline after boot (see `Config::election_timeout_range_at_boot`).
    pub fn reset_election_deadline_at_boot(&mut self) {
        let (low, high) = self.config.election_timeout_range_at_boot();
        self.election.deadline = self.now + Span(self.rng.range(low, high));
    }

    /// Whether `(last_epoch, last_index)` is behind this node's log.
    ///
    /// A node with a repair floor compares against the floor when it lies above its log:
    /// it votes as if it still held the entries that recovery had to cut (it may have
    /// acknowledged them), so no candidate that lacks them wins its vote.
    pub fn log_is_behind(&self, last_epoch: Epoch, last_index: LogIndex) -> bool {
        let own = Version { epoch: self.log.last_epoch(), index: self.log.last_index() };
        let floor = self.hard.repair_floor.filter(|_| !self.config.unsafe_ignore_repair_floor);
        let own = floor.map_or(own, |floor| own.max(floor));
        Version { epoch: last_epoch, index: last_index } < own
    }

    /// Clears the repair floor once the durable log is at least as up to date as the
    /// floor (Raft's order: epoch, then index): through the floor's index again, or
    /// holding an entry of a later epoch, which only a leader elected after the damaged
    /// entries could have sent. Either way the log now says at least what the floor did,
    /// and came from a leader (appends or a snapshot), fsynced.
    pub fn clear_repair_floor_if_repaired(&mut self) {
        let Some(floor) = self.hard.repair_floor else { return };
        let persisted = self.persisted_index();
        let epoch = self.log.epoch_at(persisted).unwrap_or_default();
        let durable = Version { epoch, index: persisted };
        if durable >= floor || persisted >= floor.index {
            self.set_hard_state(HardState { repair_floor: None, ..self.hard });
            self.counters.logs_repaired += 1;
        }
    }

    // ----- replies ------------------------------------------------------------------

    /// Sends a reply to a local client or back to the forwarding node.
    pub fn reply(&mut self, origin: Origin, reply: ClientReply) {
        match origin {
            Origin::Local => self.out.replies.push(reply),
            Origin::Forwarded(node) => {
                let message = Message::ForwardReply { epoch: self.hard.epoch, reply };
                self.out.messages.push((node, message));
            }
        }
    }

    /// When a leadership transfer asked now is answered at the latest: the request
    /// timeout, but no sooner than the transfer's own bound (its target's catch-up, then
    /// its election).
    pub fn transfer_deadline(&self) -> Time {
        let bound = self.config.election_timeout_max.0 + self.config.election_timeout_min.0;
        self.now + Span(self.config.request_timeout.0.max(bound))
    }

    /// Answers a leadership transfer's client, if one waits.
    pub fn settle_transfer(&mut self, result: super::kv::WriteResult) {
        if let Some(wait) = self.transfer_wait.take() {
            self.reply_result(wait.origin, wait.tag, result, false);
        }
    }

    /// Answers a waiting transfer once a leader of a later epoch than the one it was
    /// asked in is known: done if it is the target, else (asked as leader) refused,
    /// saying who leads; and at its deadline, with an unknown outcome.
    pub fn settle_transfer_if_known(&mut self, leader: Option<NodeId>) {
        let Some(wait) = self.transfer_wait else { return };
        let result = match leader {
            _ if self.now >= wait.deadline => Err(KeelError::Timeout),
            Some(_) if self.hard.epoch <= wait.epoch => return,
            Some(leader) if leader == wait.target => {
                let version = Version { epoch: self.hard.epoch, index: LogIndex::ZERO };
                Ok(CommandResult::Written { version })
            }
            // Asked as leader, or this node leads the later epoch itself: not the target.
            Some(leader) if wait.asked_as_leader || leader == self.config.node_id => {
                Err(KeelError::Busy(format!(
                    "node {} does not lead; node {} leads",
                    wait.target.0, leader.0
                )))
            }
            Some(_) => return,
            None => return,
        };
        self.settle_transfer(result);
    }

    pub fn reply_result(
        &mut self,
        origin: Origin,
        tag: super::io::RequestTag,
        result: super::kv::WriteResult,
        durability_round: bool,
    ) {
        let reply = ClientReply { tag, served_by: self.config.node_id, result, durability_round };
        self.reply(origin, reply);
    }

    /// Executes a read on applied state; returns the result and the index that must be
    /// durable before it may be served at `monotonic` or above.
    pub fn execute_read(&self, command: &Command) -> (super::kv::WriteResult, LogIndex) {
        // A slot moved away, or moving: the answer rests on the states and the keys'
        // presence, so on everything applied.
        if let Err(refusal) = self.kv.slot_check(command) {
            return (Err(refusal), self.kv.applied_index());
        }
        let (result, needed) = match command.unasked().0 {
            Command::Get { key } if self.expired_here(key) => {
                let version = self.kv.get(key).1;
                (CommandResult::Value { value: None, version }, self.kv.update_index(key))
            }
            Command::Get { key } => return (self.kv.read_string(key), self.kv.update_index(key)),
            Command::CollRead { key, op } => return self.kv.read_coll(key, op),
            Command::Inspect { key } => {
                let (mut value, version) = self.kv.get(key);
                if self.kv.holds_collection(key) {
                    // Presence and expiry are what an inspection asks of a collection.
                    value = Some(keel_types::Value::new());
                }
                let mut expires_at = self.kv.expires_at(key);
                if self.expired_here(key) {
                    (value, expires_at) = (None, None);
                }
                (CommandResult::Held { value, version, expires_at }, self.kv.update_index(key))
            }
            Command::Scan { start, end, limit } => {
                let (items, needed) = self.kv.scan(start, end.as_deref(), *limit);
                (CommandResult::Items { items }, needed)
            }
            Command::QueuePeek { queue } => self.kv.queue_peek(queue),
            Command::Fetch { key } if self.expired_here(key) => {
                let version = self.kv.get(key).1;
                (CommandResult::Image { image: None, version }, self.kv.update_index(key))
            }
            Command::Fetch { key } => (self.kv.fetch(key), self.kv.update_index(key)),
            // Counted over the applied state: what must be durable is all of it.
            Command::Count { db } => {
                (CommandResult::Count { keys: self.kv.count(*db) }, self.kv.applied_index())
            }
            _ => panic!("execute_read on a write"),
        };
        (Ok(result), needed)
    }

    /// Whether the log above the durable index has room for another entry
    /// ([`super::Config::undurable_entries_max`]).
    pub fn log_has_room(&self) -> bool {
        let backlog = self.log.last_index().0.saturating_sub(self.durable_index.0);
        backlog < self.config.undurable_entries_max
    }

    /// This node's wall clock, unix milliseconds ([`super::Config::wall_clock_origin_ms`]).
    pub fn wall_ms(&self) -> u64 {
        self.config.wall_clock_origin_ms.saturating_add(self.now.0 / 1_000_000)
    }

    /// Negative control only ([`super::Config::unsafe_expire_on_local_clock`]): whether
    /// `key`'s expiry has passed on this node's own clock. Always false otherwise: a key
    /// is present until the leader's expiry entry deletes it.
    fn expired_here(&self, key: &[u8]) -> bool {
        self.config.unsafe_expire_on_local_clock
            && self.kv.expires_at(key).is_some_and(|at| at <= self.wall_ms())
    }

    // ----- persistence --------------------------------------------------------------

    /// Highest index durable on this node's disk (reported to the leader).
    pub fn persisted_index(&self) -> LogIndex {
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
    pub fn read_point(&self) -> LogIndex {
        let point = self.durable_index.min(self.persisted_index());
        assert!(point <= self.durable_index && point <= self.log.last_index());
        point
    }

    /// Asks the driver to fsync through `index` unless already asked.
    pub fn request_sync(&mut self, index: LogIndex) {
        let index = index.min(self.log.last_index());
        if index <= self.persisted_index() || index <= self.sync_requested {
            return;
        }
        self.sync_requested = index;
        self.out.sync_through = Some(self.out.sync_through.map_or(index, |i| i.max(index)));
    }

    pub fn set_hard_state(&mut self, hard: HardState) {
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
    pub fn append_entry(&mut self, entry: Entry) -> super::kv::Applied {
        let applied = self.kv.apply(&entry);
        self.log.append(entry.clone());
        self.out.append.push(entry);
        applied
    }

    /// Removes entries after `index` and rolls their effects back (undo records reach
    /// every entry above the durable index, which is never truncated).
    pub fn truncate_after(&mut self, index: LogIndex) {
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

    /// The background flush: every `flush_interval`, fsync whatever the log holds.
    pub fn flush_if_due(&mut self) {
        if self.now < self.next_flush_at {
            return;
        }
        self.next_flush_at = self.now + self.config.flush_interval;
        // Ask again even if asked before: a sync overtaken by a truncation may have
        // been reported short, and asking twice costs one fsync.
        self.sync_requested = self.sync_requested.min(self.persisted_index());
        self.request_sync(self.log.last_index());
    }

    /// The driver fsynced the log through `index` (clamped to the log as it is now).
    /// Returns whether the persisted index advanced.
    pub fn on_log_synced(&mut self, index: LogIndex) -> bool {
        let before = self.persisted_index();
        self.log_synced = self.log_synced.max(index.min(self.log.last_index()));
        assert!(self.persisted_index() >= before, "persisted index went backwards");
        self.persisted_index() > before
    }

    // ----- snapshots ----------------------------------------------------------------

    /// A snapshot this node handed out is durable: an installed one ends the install; a
    /// taken one compacts the log and is held (to send) in place of the older one.
    pub fn on_snapshot_saved(&mut self, meta: SnapshotMeta) {
        if self.install_pending.as_ref().is_some_and(|(pending, _, _)| *pending == meta) {
            let (meta, data, _) = self.install_pending.take().expect("checked");
            self.log_synced = self.log_synced.max(meta.last_index);
            self.out.release.push(Release::Snapshot(data)); // a follower sends no snapshots
            return;
        }
        if let Some((inflight, data)) = self.snapshots.inflight.take() {
            assert_eq!(inflight, meta, "a snapshot saved that was not asked for");
            if meta.last_index >= self.log.snapshot().last_index && self.install_pending.is_none() {
                let compacted = self.log.compact_through(meta);
                self.out.release.push(Release::Entries(compacted));
                if let Some((_, held)) = self.snapshots.held.replace((meta, data)) {
                    self.out.release.push(Release::Snapshot(held));
                }
            } else {
                self.out.release.push(Release::Snapshot(data));
            }
        }
    }

    /// Lets go of the held encoding when no follower needs it (`wanted` is false).
    pub fn release_unwanted_snapshot(&mut self, wanted: bool) {
        if self.snapshots.held.is_some() && !wanted {
            let (_, held) = self.snapshots.held.take().expect("checked");
            self.out.release.push(Release::Snapshot(held));
        }
    }

    /// Starts a snapshot when one is due, and encodes the next slice of the one being
    /// taken; a complete one goes to the driver to save. A snapshot is due once the
    /// durable index is `snapshot_entries_threshold` entries past the last one and the
    /// log holds `snapshot_log_percent` of the state's bytes, or at once when a follower
    /// needs one (`wanted`) and none is held.
    pub fn maybe_snapshot(&mut self, wanted: bool) {
        if self.snapshots.building.is_none() && !self.begin_snapshot_if_due(wanted) {
            return;
        }
        if self.now < self.snapshots.next_slice_at {
            return;
        }
        // Paced in time, not per step: under load a node takes thousands of steps a
        // second, and encoding a slice in each would stall its replies to the leader
        // behind the whole encoding.
        self.snapshots.next_slice_at = self.now + self.config.snapshot_slice_interval;
        let (meta, mut data) = self.snapshots.building.take().expect("checked");
        assert_eq!(self.kv.snapshot_in_progress(), Some(meta.last_index));
        assert!(
            meta.last_index <= self.durable_index,
            "snapshots are taken at or below the durable index"
        );
        let budget = usize::try_from(self.config.snapshot_chunk_bytes).expect("fits");
        if !self.kv.continue_snapshot(budget, &mut data) {
            self.snapshots.building = Some((meta, data));
            return;
        }
        let data = Arc::new(data);
        self.out.snapshot = Some((meta, Arc::clone(&data)));
        self.snapshots.inflight = Some((meta, data));
        self.counters.snapshots_taken += 1;
    }

    /// Begins encoding a snapshot at the durable index when one is due; returns whether
    /// one is being built now.
    fn begin_snapshot_if_due(&mut self, wanted: bool) -> bool {
        let base = self.log.snapshot().last_index;
        let at = self.durable_index.min(self.kv.applied_index());
        let entries_due = at.0.saturating_sub(base.0) >= self.config.snapshot_entries_threshold;
        let bytes_due = u128::from(self.log.bytes()) * 100
            >= u128::from(self.kv.state_bytes()) * u128::from(self.config.snapshot_log_percent);
        // A follower needs one and none is held: take one now, whatever its size.
        let wanted = wanted && self.snapshots.held.is_none();
        if !(entries_due && bytes_due || wanted)
            || self.snapshots.inflight.is_some()
            || self.install_pending.is_some()
        {
            return false;
        }
        let epoch = self.log.epoch_at(at).expect("the durable entry is held");
        let meta = SnapshotMeta { last_index: at, last_epoch: epoch };
        // Reserved, not touched: pages the encoding never reaches are never resident.
        let mut data =
            Vec::with_capacity(usize::try_from(self.kv.state_bytes()).expect("fits") + (1 << 16));
        data.extend_from_slice(&self.kv.begin_snapshot(at));
        self.snapshots.building = Some((meta, data));
        true
    }

    /// Replaces the state with a leader's snapshot (taken at or below its durable index,
    /// so never rolled back), already decoded into `kv`. Keeps the durable log prefix on
    /// disk until the snapshot is saved.
    pub fn install(&mut self, meta: SnapshotMeta, data: Vec<u8>, kv: Kv) {
        assert!(meta.last_index > self.durable_index, "installing a snapshot we already cover");
        assert_eq!(kv.applied_index(), meta.last_index, "the state is as of the snapshot");
        let kept = self.durable_index.max(self.log.snapshot().last_index);
        if self.log.last_index() > kept {
            self.truncate_after(kept);
        }
        let recording = self.kv.recording_events();
        self.kv = kv;
        self.kv.record_events(recording);
        self.log = Log::new(meta, Vec::new());
        self.log_synced = self.log_synced.min(kept);
        self.sync_requested = self.sync_requested.min(kept);
        self.durable_index = meta.last_index;
        self.commit_index = self.commit_index.max(meta.last_index);
        let data = Arc::new(data);
        self.install_pending = Some((meta, Arc::clone(&data), kept));
        self.snapshots.building = None;
        self.snapshots.inflight = None;
        self.out.snapshot = Some((meta, data));
        self.out.snapshot_installed = true;
        self.counters.snapshots_installed += 1;
        assert_eq!(self.kv.applied_index(), self.log.last_index());
    }

    /// Decodes a snapshot's bytes as of `meta`, for installing.
    pub fn decode_snapshot(&self, meta: SnapshotMeta, data: &[u8]) -> Result<Kv, String> {
        let at = Version { epoch: meta.last_epoch, index: meta.last_index };
        let mut kv = Kv::decode(data, at, self.config.dedup_clients_max)?;
        kv.unsafe_skip_dedup = self.config.unsafe_skip_dedup;
        kv.unsafe_accept_expired_sessions = self.config.unsafe_accept_expired_sessions;
        kv.unsafe_accept_stale_opens = self.config.unsafe_accept_stale_opens;
        kv.unsafe_watch_ignores_deletes = self.config.unsafe_watch_ignores_deletes;
        kv.unsafe_serve_held = self.config.unsafe_slots_serve_held;
        kv.unsafe_fill_overwrites = self.config.unsafe_slots_fill_overwrites;
        kv.unsafe_take_unasked = self.config.unsafe_slots_take_unasked;
        Ok(kv)
    }
}
