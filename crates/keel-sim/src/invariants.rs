//! Invariants checked while a run proceeds, from what the driver sees: the log writes
//! each node's engine asks for and each engine's [`Status`] after every step.
//!
//! - **One leader per epoch** (election safety).
//! - **Log matching**: two logs holding an entry with the same `(index, epoch)` hold the
//!   same entry and the same prefix before it. Checked with a chain hash per position.
//! - **Durable prefix never lost**: every entry at or below a durable index a leader has
//!   published stays in every later leader's log, and a node's own durable index never
//!   points at an entry that differs from the durable prefix.
//! - **Applied agreement**: engines that report a digest of their applied state agree on
//!   it at every index of the durable prefix.
//!
//! A breach is recorded as a [`Violation`]; the run stops at the first one.

use keel_core::leader::{Role, Status};
use keel_types::{Command, Entry, EntryPayload, Epoch, LogIndex, NodeId, SnapshotMeta};
use std::collections::BTreeMap;

/// Most violations kept per run (the first is the one that matters).
pub const VIOLATIONS_MAX: usize = 16;

/// A broken invariant: which one, and the evidence.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{kind} at {at_ns} ns: {detail}")]
pub struct Violation {
    /// The invariant's short name.
    pub kind: &'static str,
    /// Virtual time of detection.
    pub at_ns: u64,
    /// What was seen.
    pub detail: String,
}

/// One node's log as the driver sees it: the epoch and chain hash of every position.
#[derive(Clone, Debug, Default)]
pub struct LogModel {
    /// `(epoch, chain)` of index `i` at position `i - 1`.
    positions: Vec<(Epoch, u64)>,
}

impl LogModel {
    /// The last index held.
    pub fn last_index(&self) -> LogIndex {
        LogIndex(self.positions.len() as u64)
    }

    /// The epoch of the entry at `index`, if held.
    pub fn epoch_at(&self, index: LogIndex) -> Option<Epoch> {
        self.position(index).map(|p| p.0)
    }

    /// The chain hash through `index` (0 for index 0), if held.
    pub fn chain_at(&self, index: LogIndex) -> Option<u64> {
        if index == LogIndex::ZERO {
            return Some(0);
        }
        self.position(index).map(|p| p.1)
    }

    fn position(&self, index: LogIndex) -> Option<(Epoch, u64)> {
        let i = usize::try_from(index.0).ok()?.checked_sub(1)?;
        self.positions.get(i).copied()
    }
}

/// What the checker remembers about one `(index, epoch)` ever appended anywhere.
#[derive(Clone, Debug)]
struct Known {
    chain: u64,
    prev_epoch: Epoch,
    entry: Entry,
}

/// The invariant checker for one run.
#[derive(Debug, Default)]
pub struct Checker {
    logs: BTreeMap<NodeId, LogModel>,
    known: BTreeMap<(LogIndex, Epoch), Known>,
    leader_by_epoch: BTreeMap<Epoch, NodeId>,
    /// Chain hashes of the durable prefix, position `i - 1` for index `i`.
    durable_chain: Vec<u64>,
    /// `(epoch, index)`: the durable prefix reached `index` when a leader of `epoch`
    /// published it. A leader of an older epoch (deposed, not yet aware) may lack it.
    durable_marks: Vec<(Epoch, LogIndex)>,
    /// Applied-state digests per index of the durable prefix.
    applied_digest: BTreeMap<LogIndex, (u64, NodeId)>,
    /// The nodes whose last status said leader, with their epoch.
    leading: BTreeMap<NodeId, Epoch>,
    /// How often each invariant's precondition held (what makes its check more than
    /// vacuous), by coverage name.
    preconditions: BTreeMap<&'static str, u64>,
    violations: Vec<Violation>,
}

impl Checker {
    /// A checker with no history.
    pub fn new() -> Checker {
        Checker::default()
    }

    /// Violations found so far, first first.
    pub fn violations(&self) -> &[Violation] {
        &self.violations
    }

    /// How often each invariant's precondition held, by coverage name:
    /// - `inv:divergent-logs`: two logs held different entries at one index (what log
    ///   matching is about);
    /// - `inv:two-leaders-at-once`: two nodes said leader at once, in different epochs
    ///   (one per epoch is checked; the world checks that one lease at most is valid);
    /// - `inv:new-leader-over-durable`: a leader was checked against a durable prefix an
    ///   earlier epoch published;
    /// - `inv:applied-compared`: two nodes' applied states were compared at one index.
    pub fn preconditions(&self) -> &BTreeMap<&'static str, u64> {
        &self.preconditions
    }

    /// The nodes whose last status said leader, with their epoch.
    pub fn leading(&self) -> &BTreeMap<NodeId, Epoch> {
        &self.leading
    }

    fn reached(&mut self, precondition: &'static str) {
        *self.preconditions.entry(precondition).or_default() += 1;
    }

    /// Takes the violations found so far (the world gathers every keyspace's).
    pub fn take_violations(&mut self) -> Vec<Violation> {
        std::mem::take(&mut self.violations)
    }

    /// A node's log model.
    pub fn log(&self, node: NodeId) -> &LogModel {
        static EMPTY: LogModel = LogModel { positions: Vec::new() };
        self.logs.get(&node).unwrap_or(&EMPTY)
    }

    /// The highest index published durable by a leader.
    pub fn durable_index(&self) -> LogIndex {
        LogIndex(self.durable_chain.len() as u64)
    }

    /// Records a violation (keeps the first [`VIOLATIONS_MAX`]).
    pub fn violate(&mut self, kind: &'static str, at_ns: u64, detail: String) {
        if self.violations.len() < VIOLATIONS_MAX {
            self.violations.push(Violation { kind, at_ns, detail });
        }
    }

    /// The entries of `node`'s log in order, as far as they are known.
    pub fn entries(&self, node: NodeId) -> Vec<Entry> {
        let log = self.log(node);
        let mut out = Vec::with_capacity(log.positions.len());
        for (i, (epoch, _)) in log.positions.iter().enumerate() {
            let index = LogIndex(i as u64 + 1);
            if let Some(known) = self.known.get(&(index, *epoch)) {
                out.push(known.entry.clone());
            }
        }
        out
    }

    /// A node's log was truncated after `index`.
    pub fn truncate(&mut self, node: NodeId, index: LogIndex) {
        let log = self.logs.entry(node).or_default();
        log.positions.truncate(usize::try_from(index.0).expect("index fits usize"));
    }

    /// A node appended `entry` (its index follows the model's last index).
    pub fn append(&mut self, node: NodeId, entry: &Entry, at_ns: u64) {
        let log = self.logs.entry(node).or_default();
        assert_eq!(entry.index, log.last_index().next(), "model append not contiguous");
        let prev_chain = log.chain_at(log.last_index()).expect("last index is held");
        let prev_epoch = log.epoch_at(log.last_index()).unwrap_or_default();
        let chain = mix(prev_chain, entry_hash(entry));
        log.positions.push((entry.epoch, chain));
        let key = (entry.index, entry.epoch);
        match self.known.get(&key) {
            Some(known) if known.chain != chain || known.entry != *entry => {
                let detail = format!(
                    "{node} holds {:?} at ({}, {}) differing from another log's entry or prefix",
                    entry.payload, entry.index, entry.epoch
                );
                self.violate("log-matching", at_ns, detail);
            }
            Some(_) => {}
            None => {
                self.known.insert(key, Known { chain, prev_epoch, entry: entry.clone() });
                let at_index = (entry.index, Epoch(0))..=(entry.index, Epoch(u64::MAX));
                if self.known.range(at_index).nth(1).is_some() {
                    self.reached("inv:divergent-logs");
                }
            }
        }
    }

    /// A node's log became what a restart recovered: `entries` after an optional snapshot.
    pub fn recover(&mut self, node: NodeId, snapshot: Option<SnapshotMeta>, entries: &[Entry]) {
        self.logs.insert(node, LogModel::default());
        self.leading.remove(&node);
        if let Some(meta) = snapshot {
            self.reset_to_snapshot(node, meta);
        }
        for entry in entries {
            self.append(node, entry, 0);
        }
    }

    /// A node's log now starts with a snapshot. If the log holds the snapshot's last
    /// entry this is compaction and nothing changes; otherwise rebuild the prefix from
    /// the entry the snapshot ends at, walking back through what is known (log matching makes the
    /// prefix unique).
    pub fn reset_to_snapshot(&mut self, node: NodeId, meta: SnapshotMeta) {
        let log = self.logs.entry(node).or_default();
        if log.epoch_at(meta.last_index) == Some(meta.last_epoch) {
            return; // compaction of a log that holds the snapshot's last entry
        }
        let mut chain_rev = Vec::new();
        let (mut index, mut epoch) = (meta.last_index, meta.last_epoch);
        while index > LogIndex::ZERO {
            let known = self.known.get(&(index, epoch)).expect("snapshot of an unknown entry");
            chain_rev.push((epoch, known.chain));
            epoch = known.prev_epoch;
            index = index.prev();
        }
        chain_rev.reverse();
        self.logs.insert(node, LogModel { positions: chain_rev });
    }

    /// Checks a node's status after a step; `digest` is the engine's applied-state
    /// digest at `status.applied_index`, when it offers one.
    pub fn observe(&mut self, status: &Status, digest: Option<u64>, at_ns: u64) {
        let node = status.node_id;
        if status.role == Role::Leader {
            self.leading.insert(node, status.epoch);
            if self.leading.len() > 1 {
                self.reached("inv:two-leaders-at-once");
            }
            self.check_one_leader(node, status.epoch, at_ns);
            self.check_leader_holds_durable_prefix(node, status.epoch, at_ns);
            self.extend_durable_prefix(node, status.epoch, status.durable_index, at_ns);
        } else {
            self.leading.remove(&node);
        }
        self.check_durable_index(node, status.durable_index, at_ns);
        if let Some(digest) = digest {
            self.check_applied(node, status.applied_index, digest, at_ns);
        }
    }

    fn check_one_leader(&mut self, node: NodeId, epoch: Epoch, at_ns: u64) {
        let first = *self.leader_by_epoch.entry(epoch).or_insert(node);
        if first != node {
            let detail = format!("{first} and {node} both lead epoch {epoch}");
            self.violate("one-leader-per-epoch", at_ns, detail);
        }
    }

    fn check_leader_holds_durable_prefix(&mut self, node: NodeId, epoch: Epoch, at_ns: u64) {
        // Everything published durable in this epoch or an earlier one must be held.
        let marks = self.durable_marks.iter().filter(|(e, _)| *e <= epoch);
        let durable = marks.clone().map(|(_, i)| *i).max().unwrap_or(LogIndex::ZERO);
        if durable == LogIndex::ZERO {
            return;
        }
        if marks.clone().any(|(e, _)| *e < epoch) {
            self.reached("inv:new-leader-over-durable");
        }
        debug_assert!(durable <= self.durable_index());
        let expected = self.durable_chain[usize::try_from(durable.0 - 1).expect("fits")];
        if self.log(node).chain_at(durable) != Some(expected) {
            let detail =
                format!("leader {node} of {epoch} lacks the durable prefix through {durable}");
            self.violate("durable-prefix-lost", at_ns, detail);
        }
    }

    fn extend_durable_prefix(
        &mut self,
        node: NodeId,
        epoch: Epoch,
        durable_index: LogIndex,
        at_ns: u64,
    ) {
        if durable_index > self.log(node).last_index() {
            let detail = format!("leader {node} publishes durable {durable_index} beyond its log");
            self.violate("durable-beyond-log", at_ns, detail);
            return;
        }
        // Borrow the log, don't copy it: this runs on every step of every leader.
        let from = self.durable_chain.len() as u64 + 1;
        let log = self.log(node);
        let chains: Vec<u64> = (from..=durable_index.0)
            .map(|i| log.chain_at(LogIndex(i)).expect("checked against last index"))
            .collect();
        self.durable_chain.extend(chains);
        if durable_index.0 >= from {
            self.durable_marks.push((epoch, durable_index));
        }
        debug_assert!(self.durable_index() >= durable_index);
    }

    fn check_durable_index(&mut self, node: NodeId, durable_index: LogIndex, at_ns: u64) {
        let upto = durable_index.min(self.durable_index());
        if upto == LogIndex::ZERO {
            return;
        }
        let expected = self.durable_chain[usize::try_from(upto.0 - 1).expect("fits")];
        let held = self.log(node).chain_at(upto);
        if held != Some(expected) {
            let detail =
                format!("{node} reports durable {durable_index} but its log differs at {upto}");
            self.violate("durable-index-mismatch", at_ns, detail);
        }
    }

    fn check_applied(&mut self, node: NodeId, applied: LogIndex, digest: u64, at_ns: u64) {
        if applied > self.durable_index() || applied == LogIndex::ZERO {
            return;
        }
        // A replica may have applied entries that are not durable and conflict with the
        // durable prefix (ORCA applies before durability); those roll back later. Only a
        // replica whose log matches the durable prefix at `applied` must agree.
        let expected = self.durable_chain[usize::try_from(applied.0 - 1).expect("fits")];
        if self.log(node).chain_at(applied) != Some(expected) {
            return;
        }
        let (first, by) = *self.applied_digest.entry(applied).or_insert((digest, node));
        if by != node {
            self.reached("inv:applied-compared");
        }
        if first != digest {
            let detail = format!("{node} and {by} applied different states at {applied}");
            self.violate("applied-agreement", at_ns, detail);
        }
    }
}

/// Combines two hashes (splitmix64 finalizer over their mix); deterministic everywhere.
pub fn mix(a: u64, b: u64) -> u64 {
    let mut z = a.rotate_left(17) ^ b.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Hashes bytes (FNV-1a, then mixed).
pub fn bytes_hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for b in bytes {
        h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01B3);
    }
    mix(h, bytes.len() as u64)
}

/// A hash of everything in an entry.
pub fn entry_hash(entry: &Entry) -> u64 {
    let head = mix(entry.epoch.0, entry.index.0);
    match &entry.payload {
        EntryPayload::Noop => mix(head, 1),
        EntryPayload::Settings(settings) => {
            mix(head, mix(2, u64::from(settings.dedup_clients_max)))
        }
        EntryPayload::Write { client, request, durability, command } => {
            let h = mix(mix(head, client.0), mix(request.0, *durability as u64));
            mix(h, command_hash(command))
        }
        EntryPayload::Reap { now_ms, keys } => {
            keys.iter().fold(mix(head, mix(3, *now_ms)), |h, key| mix(h, bytes_hash(key)))
        }
        EntryPayload::Membership(m) => {
            let h = m.voters.iter().fold(mix(head, 4), |h, n| mix(h, u64::from(n.0)));
            m.learners.iter().fold(mix(h, 5), |h, n| mix(h, u64::from(n.0)))
        }
    }
}

fn ttl_hash(ttl: keel_types::Ttl) -> u64 {
    match ttl {
        keel_types::Ttl::Keep => 1,
        keel_types::Ttl::Clear => 2,
        keel_types::Ttl::After(ms) => mix(3, ms),
        keel_types::Ttl::At(ms) => mix(4, ms),
    }
}

fn command_hash(command: &Command) -> u64 {
    match command {
        Command::Get { key } => mix(10, bytes_hash(key)),
        Command::Put { key, value } => mix(mix(11, bytes_hash(key)), bytes_hash(value)),
        Command::Delete { key } => mix(12, bytes_hash(key)),
        Command::Cas { key, expected, new } => {
            let e = expected.as_deref().map_or(0, bytes_hash);
            mix(mix(mix(13, bytes_hash(key)), e), bytes_hash(new))
        }
        Command::Incr { key, delta } => mix(mix(14, bytes_hash(key)), *delta as u64),
        Command::Scan { start, end, limit } => {
            let e = end.as_deref().map_or(0, bytes_hash);
            mix(mix(mix(15, bytes_hash(start)), e), u64::from(*limit))
        }
        Command::OpenSession { .. } => 17,
        Command::Cluster(op) => mix(29, u64::from(op.node().0)),
        Command::Geo(_) => unreachable!("no log holds a geo operation"),
        Command::Enqueue { queue, value } => mix(mix(18, bytes_hash(queue)), bytes_hash(value)),
        Command::Dequeue { queue } => mix(19, bytes_hash(queue)),
        Command::QueuePeek { queue } => mix(20, bytes_hash(queue)),
        Command::Set { key, value, cond, ttl, now_ms } => {
            let h = mix(mix(21, bytes_hash(key)), bytes_hash(value));
            mix(mix(h, *cond as u64), mix(ttl_hash(*ttl), *now_ms))
        }
        Command::Expire { key, ttl, cond, now_ms } => {
            let h = mix(mix(22, bytes_hash(key)), *cond as u64);
            mix(h, mix(ttl_hash(*ttl), *now_ms))
        }
        Command::Inspect { key } => mix(23, bytes_hash(key)),
        Command::Flush { db } => mix(24, db.map_or(256, u64::from)),
        Command::Count { db } => mix(25, u64::from(*db)),
        Command::SwapDb { a, b } => mix(mix(26, u64::from(*a)), u64::from(*b)),
        Command::Fetch { key } => mix(27, bytes_hash(key)),
        Command::Restore { key, image } => mix(mix(28, bytes_hash(key)), bytes_hash(image)),
        // The encoding's digest stands for the rest (as deduplication compares commands).
        Command::Modify { .. }
        | Command::Transfer { .. }
        | Command::Coll { .. }
        | Command::Slot(_)
        | Command::Asking(..)
        | Command::CollRead { .. } => mix(26, keel_core::leader::kv::command_digest(command)),
        Command::Multi { ops, watch } => {
            let ops = ops.iter().fold(16, |h, op| mix(h, command_hash(op)));
            watch.iter().fold(ops, |h, (key, version)| {
                let v = version.map_or(0, |v| mix(v.epoch.0, v.index.0));
                mix(mix(h, bytes_hash(key)), v)
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noop(epoch: u64, index: u64) -> Entry {
        Entry { epoch: Epoch(epoch), index: LogIndex(index), payload: EntryPayload::Noop }
    }

    fn status(node: u32, role: Role, epoch: u64, durable: u64) -> Status {
        Status {
            node_id: NodeId(node),
            role,
            epoch: Epoch(epoch),
            leader: None,
            last_index: LogIndex(0),
            commit_index: LogIndex(0),
            durable_index: LogIndex(durable),
            persisted_index: LogIndex(0),
            applied_index: LogIndex(0),
            active: true,
            active_set: vec![],
            snapshot_index: LogIndex(0),
            snapshot_held_bytes: 0,
            leader_lease_valid: false,
            repair_floor: None,
            dedup_clients_max: 1,
            ..Status::default()
        }
    }

    #[test]
    fn two_leaders_in_one_epoch_are_caught() {
        let mut checker = Checker::new();
        checker.observe(&status(1, Role::Leader, 2, 0), None, 5);
        checker.observe(&status(1, Role::Leader, 2, 0), None, 6);
        assert!(checker.violations().is_empty());
        checker.observe(&status(2, Role::Leader, 2, 0), None, 7);
        assert_eq!(checker.violations()[0].kind, "one-leader-per-epoch");
    }

    #[test]
    fn different_prefixes_under_the_same_entry_id_break_log_matching() {
        let mut checker = Checker::new();
        checker.append(NodeId(1), &noop(1, 1), 0);
        checker.append(NodeId(1), &noop(2, 2), 0);
        checker.append(NodeId(2), &noop(1, 1), 0);
        checker.append(NodeId(2), &noop(2, 2), 0);
        assert!(checker.violations().is_empty());
        checker.append(NodeId(3), &noop(3, 1), 0);
        checker.append(NodeId(3), &noop(2, 2), 0);
        assert_eq!(checker.violations()[0].kind, "log-matching");
    }

    #[test]
    fn a_leader_without_the_durable_prefix_is_caught() {
        let mut checker = Checker::new();
        checker.append(NodeId(1), &noop(1, 1), 0);
        checker.append(NodeId(1), &noop(1, 2), 0);
        checker.observe(&status(1, Role::Leader, 1, 2), None, 1);
        assert_eq!(checker.durable_index(), LogIndex(2));
        checker.append(NodeId(2), &noop(1, 1), 0);
        checker.observe(&status(2, Role::Leader, 2, 0), None, 2);
        assert_eq!(checker.violations()[0].kind, "durable-prefix-lost");
    }

    #[test]
    fn a_deposed_leader_may_lack_what_its_successor_made_durable() {
        let mut checker = Checker::new();
        checker.append(NodeId(1), &noop(1, 1), 0);
        checker.append(NodeId(2), &noop(1, 1), 0);
        checker.append(NodeId(2), &noop(2, 2), 0);
        checker.observe(&status(2, Role::Leader, 2, 2), None, 1);
        // n1 still believes it leads epoch 1: it lacks index 2, and that is allowed.
        checker.observe(&status(1, Role::Leader, 1, 0), None, 2);
        assert!(checker.violations().is_empty(), "{:?}", checker.violations());
        // A leader of a later epoch must hold it.
        checker.observe(&status(1, Role::Leader, 3, 0), None, 3);
        assert_eq!(checker.violations()[0].kind, "durable-prefix-lost");
    }

    #[test]
    fn snapshot_reset_rebuilds_the_prefix_and_entries_survive() {
        let mut checker = Checker::new();
        for i in 1..=3 {
            checker.append(NodeId(1), &noop(1, i), 0);
        }
        checker.reset_to_snapshot(
            NodeId(2),
            SnapshotMeta { last_index: LogIndex(3), last_epoch: Epoch(1) },
        );
        assert_eq!(
            checker.log(NodeId(2)).chain_at(LogIndex(3)),
            checker.log(NodeId(1)).chain_at(LogIndex(3))
        );
        assert_eq!(checker.entries(NodeId(2)).len(), 3);
        checker.truncate(NodeId(2), LogIndex(1));
        assert_eq!(checker.log(NodeId(2)).last_index(), LogIndex(1));
    }

    #[test]
    fn applied_digests_must_agree_on_the_durable_prefix() {
        let mut checker = Checker::new();
        for node in 1..=3 {
            checker.append(NodeId(node), &noop(1, 1), 0);
        }
        checker.observe(&status(1, Role::Leader, 1, 1), None, 0);
        let mut s = status(2, Role::Follower, 1, 0);
        s.applied_index = LogIndex(1);
        checker.observe(&s, Some(7), 0);
        s.node_id = NodeId(3);
        checker.observe(&s, Some(8), 0);
        assert_eq!(checker.violations()[0].kind, "applied-agreement");
    }
}
