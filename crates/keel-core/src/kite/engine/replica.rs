//! The replica: boot, the step every input goes through, and the store (values by stamp,
//! key epochs, the outcome table), with what the drivers read of it.
//!
//! A step: the input is taken (a tick resends what is due, a peer's message goes through
//! `serve.rs`, a client's request is admitted into its session), then every session the
//! input touched moves on as far as it goes (`sessions.rs`), then the next wake-up is
//! read from the timer indexes. Nothing here waits: every wait is a round or a timer.

use super::{
    Active, Bit, Config, Counters, KiteEngine, KiteOp, KiteReply, KiteRequest, KiteResult, Maker,
    Message, Outcomes, Phase, RmwId, RmwOutcome, Rounds, Stamp, Status, MEMBERS_MAX,
};
use crate::engine::{BootError, Input, Outputs};
use crate::time::Time;
use keel_types::rng::SplitMix64;
use keel_types::{Key, NoRecord, NodeId, Value};
use std::collections::{BTreeMap, BTreeSet};

impl KiteEngine {
    /// Starts a node with an empty store at local time `now`. A node of a later
    /// incarnation (one that lost its memory) starts with every key out of its epoch, so
    /// that nothing is served from the fast path before it was read from a quorum.
    pub fn boot(config: Config, seed: u64, now: Time) -> Result<KiteEngine, BootError> {
        config.validate()?;
        let n = config.members.len();
        assert!((1..=MEMBERS_MAX).contains(&n), "validated: 1 to {MEMBERS_MAX} members");
        let bits = config.members.iter().map(|&m| (m, Bit::Clear)).collect();
        let mut rng = SplitMix64::new(seed);
        // Rounds start at a random place: a reply still in flight to an earlier
        // incarnation must not match a round of this one (it would answer another key's
        // round: found by restarts in the simulator).
        let first_round = (rng.next_u64() >> 2).max(1);
        let membership = config.initial_membership();
        let mut engine = KiteEngine {
            writer: Stamp::writer_of(config.node, config.incarnation),
            epoch: u64::from(config.incarnation > 0),
            membership,
            voters_mask: 0,
            next_mask: 0,
            synced: 0,
            sync: None,
            keys: BTreeMap::new(),
            bits,
            gens: BTreeMap::new(),
            outcomes: Outcomes::new(config.outcomes_max, config.outcomes_bytes_max),
            sessions: BTreeMap::new(),
            waits: BTreeSet::new(),
            rmw_keys: BTreeMap::new(),
            next_seq: 0,
            rounds: Rounds::new(first_round),
            // Acquire ids of a later incarnation never match an earlier life's.
            next_acquire: (u64::from(config.incarnation) << 32) + 1,
            last_round: 0,
            rng,
            counters: Counters::default(),
            now,
            out: Outputs::default(),
            rejoin: None,
            incarnations: BTreeMap::from([(config.node, config.incarnation)]),
            // One, so that the first reply to every peer carries the view, and with it
            // the membership a peer compares with its own configured voters before it
            // counts the reply.
            view_gen: 1,
            view_told: BTreeMap::new(),
            voters_disagree: BTreeSet::new(),
            hard_state: None,
            config,
        };
        engine.voters_mask = engine.mask_of(&engine.membership.voters);
        Ok(engine.start_rejoin())
    }

    /// Asks that `hard_state` (the incarnation) be made durable before any message.
    pub(in crate::kite) fn persist_first(&mut self, hard_state: keel_types::HardState) {
        self.hard_state = Some(hard_state);
    }

    /// This node.
    pub fn node_id(&self) -> NodeId {
        self.config.node
    }

    /// The machine epoch and whether the node is still rejoining: what the driver reads
    /// after every step, without building the status (which walks every key).
    pub fn epoch_and_rejoining(&self) -> (u64, bool) {
        (self.epoch, self.rejoin.is_some())
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The clients' keys' slots (not the reserved membership key's).
    fn client_keys(&self) -> impl Iterator<Item = &super::Slot> {
        let reserved = crate::kite::types::MEMBERSHIP_KEY;
        self.keys.iter().filter(move |(k, _)| k.as_ref() != reserved).map(|(_, s)| s)
    }

    /// The typed status.
    pub fn status(&self) -> Status {
        Status {
            node: self.config.node,
            epoch: self.epoch,
            incarnation: self.config.incarnation,
            rejoining: self.rejoin.is_some(),
            keys: self.client_keys().count(),
            keys_in_epoch: if self.fast_path() {
                self.client_keys().filter(|s| s.epoch == self.epoch).count()
            } else {
                0
            },
            sessions: self.sessions.len(),
            outcomes: self.outcomes.len(),
            outcomes_bytes: self.outcomes.bytes(),
            bits: self.bits.iter().map(|(&n, b)| (n, b.clone())).collect(),
            membership: self.membership.clone(),
            synced: self.synced,
            voters_disagree: self.voters_disagree.iter().copied().collect(),
            counters: self.counters.clone(),
        }
    }

    /// The local copy of `key`: its value and stamp (for tests and the simulator's
    /// convergence check).
    pub fn local(&self, key: &[u8]) -> (Option<Value>, Stamp) {
        self.keys.get(key).map_or((None, Stamp::ZERO), |s| (s.value.clone(), s.stamp))
    }

    /// Every key held, with its value and stamp, in key order.
    pub fn contents(&self) -> Vec<(Key, Option<Value>, Stamp)> {
        self.keys.iter().map(|(k, s)| (k.clone(), s.value.clone(), s.stamp)).collect()
    }

    /// Whether this replica holds an accepted read-modify-write of `key` it has not seen
    /// committed.
    pub fn accepted_rmw(&self, key: &[u8]) -> bool {
        self.keys.get(key).is_some_and(|s| s.accepted.is_some())
    }

    /// The reply a relaxed read would get at once, alone in a step: when it is a relaxed
    /// read of a key in its epoch, its session has nothing before it, and the node is not
    /// rejoining (`None` otherwise). Changes nothing.
    pub fn read_now(&self, request: &KiteRequest) -> Option<KiteReply> {
        let KiteOp::Read { key } = &request.op else { return None };
        let idle = self
            .sessions
            .get(&request.session)
            .is_none_or(|s| s.active.is_none() && s.queue.is_empty());
        if self.rejoin.is_some() || !idle || !self.in_epoch(key) {
            return None;
        }
        if self.config.limits.check_key(key).is_err() {
            return None;
        }
        let (value, stamp) = self.local(key);
        Some(KiteReply {
            tag: request.tag,
            session: request.session,
            served_by: self.config.node,
            form: request.form.clone(),
            result: Ok(KiteResult::Value { value, stamp }),
        })
    }

    /// The read-modify-writes in progress, by request tag, with the id each goes by (for
    /// the simulator, which matches a request left without a reply to its commit).
    pub fn rmws_in_progress(&self) -> Vec<(crate::engine::RequestTag, RmwId)> {
        let mut out = Vec::new();
        for s in self.sessions.values() {
            match &s.active {
                Some(Active { tag, phase: Phase::Rmw(rmw, _), .. }) => out.push((*tag, rmw.rid)),
                Some(Active { tag, phase: Phase::Flush { rid, .. }, .. }) => out.push((*tag, *rid)),
                _ => {}
            }
        }
        out
    }

    /// The keys of read-modify-writes whose proposals wait for a quorum's promises: their
    /// accepts go out once the promises come. For the simulator's targeted faults.
    pub fn proposals_in_flight(&self) -> Vec<&Key> {
        self.rounds
            .iter()
            .map(|(_, r)| r)
            .filter(|r| !self.is_quorum(r.replies_bits))
            .filter_map(|r| match &r.msg {
                Message::Propose { key, .. } => Some(key),
                _ => None,
            })
            .collect()
    }

    /// Whether a relaxed access to `key` would take the fast path now.
    pub fn in_epoch(&self, key: &[u8]) -> bool {
        self.fast_path() && self.keys.get(key).map_or(0, |s| s.epoch) == self.epoch
    }

    /// Handles one input at local time `now`.
    pub fn step(
        &mut self,
        now: Time,
        input: Input<Message, KiteRequest>,
    ) -> Outputs<Message, KiteReply, NoRecord> {
        assert!(now >= self.now, "time went backwards: {:?} after {:?}", now, self.now);
        let epoch = self.epoch;
        self.now = now;
        self.out.hard_state = self.hard_state.take();
        let (rejoining, synced, members) =
            (self.rejoin.is_some(), self.synced, self.membership.epoch);
        let mut touched = self.take_input(input);
        let changed = synced != self.synced || members != self.membership.epoch;
        if (rejoining && self.rejoin.is_none()) || changed {
            // Rejoined in this step: every session held back may start. (A membership
            // taken or synced: rounds were asked again, and a change waiting for this
            // node's own sync may go on.)
            touched.extend(self.sessions.keys().copied());
        }
        touched.sort_unstable();
        touched.dedup();
        for session in touched {
            self.advance(session);
        }
        self.out.wake_at = self.next_wake();
        assert!(self.epoch >= epoch, "the machine epoch went back");
        // The simulator checks every step of every node; a debug build checks too.
        if cfg!(debug_assertions) || self.config.check_invariants {
            self.check_invariants();
        }
        std::mem::take(&mut self.out)
    }

    /// Takes one input; answers the sessions it touched (in any order, repeats allowed).
    fn take_input(&mut self, input: Input<Message, KiteRequest>) -> Vec<u64> {
        let mut touched: Vec<u64> = Vec::new();
        match input {
            Input::Tick => {
                self.resend_due();
                self.rejoin_resend_due();
                self.finish_rejoin_if_complete();
                // Only the operations that wait for the time (a barrier's deadline, a
                // back-off) move on with it: the timer index names those now due. (A
                // rejoin finished here opens every session: see `step`.)
                let due = self.waits.range(..=(self.now, u64::MAX));
                touched.extend(due.map(|&(_, session)| session));
            }
            Input::Message { from, message } => {
                touched.extend(self.on_message(from, message));
            }
            Input::Client(request) => touched.push(self.admit(request)),
            Input::Clients(requests) => {
                for request in requests {
                    touched.push(self.admit(request));
                }
            }
            Input::LogSynced { .. } | Input::SnapshotSaved { .. } => {}
        }
        touched
    }

    /// Applies a value read or written, if its stamp is newer than the one held
    /// (last-writer-wins by stamp): a late, older write never overwrites a newer one.
    pub(super) fn apply(&mut self, key: &Key, value: Option<Value>, stamp: Stamp, made_by: Maker) {
        let slot = self.keys.entry(key.clone()).or_default();
        let held = slot.stamp;
        let newer = stamp > slot.stamp;
        if newer {
            slot.value = value;
            slot.stamp = stamp;
            slot.made_by = made_by;
        } else if stamp == slot.stamp && slot.made_by.is_none() {
            slot.made_by = made_by;
        }
        assert!(slot.stamp >= held && slot.stamp >= stamp, "a key's stamp went back");
        if newer {
            self.adopt_from_key(key);
        }
    }

    /// An out-of-epoch access that read a quorum puts its key in the epoch it started in.
    pub(super) fn settle_epoch(&mut self, key: &Key, snapshot: u64) {
        assert!(snapshot <= self.epoch, "an epoch snapshot from the future");
        let epoch = if self.config.unsafe_no_epoch_snapshot { self.epoch } else { snapshot };
        let slot = self.keys.entry(key.clone()).or_default();
        slot.epoch = slot.epoch.max(epoch);
        assert!(slot.epoch <= self.epoch, "a key in an epoch the machine has not reached");
    }

    /// Remembers that `id` was committed on `key` (the latest per session).
    pub(super) fn record_outcome(&mut self, key: &Key, id: RmwId, outcome: RmwOutcome) {
        self.counters.outcomes_dropped += self.outcomes.record((id.node, id.session), key, outcome);
    }

    /// The index of `node` among the members.
    pub(super) fn index_of(&self, node: NodeId) -> Option<usize> {
        self.config.members.iter().position(|&m| m == node)
    }

    /// The members whose bits `mask` sets.
    pub(super) fn members_of(&self, mask: u64) -> Vec<NodeId> {
        assert_eq!(mask & !self.all_members(), 0, "a mask naming a non-member");
        self.config
            .members
            .iter()
            .enumerate()
            .filter(|(i, _)| mask & (1 << i) != 0)
            .map(|(_, &m)| m)
            .collect()
    }

    /// The mask of every member.
    pub(super) fn all_members(&self) -> u64 {
        (1u64 << self.config.members.len()) - 1
    }

    /// The mask of the members that sent `replies`.
    pub(super) fn replies_mask(&self, replies: &[(NodeId, Message)]) -> u64 {
        replies.iter().filter_map(|(from, _)| self.index_of(*from)).fold(0, |m, i| m | 1 << i)
    }
}
