//! The partition replica (Algorithm 1, 1:18–48; Algorithm 2, 2:1–18): its operation log
//! and the reads on a snapshot, prepare and commit, the known vector, and geo-replication
//! of local transactions in timestamp order.

use super::super::types::{
    Arbitration, Body, Kind, Object, Replicated, TxId, Update, Vector, PARTITION_BITS,
};
use super::{GeoEngine, LogEntry, Prepared, WaitingRead};
use keel_types::{Key, NodeId};
use std::sync::Arc;

/// One step of a partition's timestamps: two timestamps of one partition differ by a
/// multiple of it, and the low bits name the partition.
const TICK: u64 = 1 << PARTITION_BITS;

impl GeoEngine {
    /// `GET_VERSION` (1:18–25): the object on `snap`, once this partition stores the
    /// snapshot; until then the read waits, indexed by the entry it waits on.
    pub(crate) fn get_version(
        &mut self,
        from: NodeId,
        read: u64,
        key: Key,
        kind: Kind,
        snap: Vector,
    ) {
        let wait = WaitingRead { from, read, key, kind, snap };
        if self.drop_lost_read(&wait) {
            return;
        }
        match self.first_unmet(&wait.snap) {
            None => self.answer_read(wait),
            Some(ts) => {
                self.counters.reads_waited += 1;
                let n = self.partition.next_wait;
                self.partition.next_wait += 1;
                self.partition.waiting.insert((ts, n), wait);
            }
        }
    }

    /// An entry of `snap` this partition's known vector does not reach yet, as the
    /// timestamp to wait for (`None`: the snapshot is stored here). Only the local and
    /// strong entries can be short for a snapshot a coordinator built (1:21); the remote
    /// ones can be for a session's past vector that came from a faster coordinator, and
    /// the read waits for them too rather than trust it.
    fn first_unmet(&self, snap: &Vector) -> Option<u64> {
        let known = &self.partition.known;
        let d = self.me.dc as usize;
        if snap.dcs[d] > known.dcs[d] {
            return Some(snap.dcs[d]);
        }
        if snap.strong > known.strong {
            return Some(u64::MAX);
        }
        snap.dcs.iter().zip(&known.dcs).any(|(s, k)| s > k).then_some(u64::MAX)
    }

    /// Drops a read on a snapshot that names a data center's old life above its cut:
    /// that snapshot is never stored here again (`copy.rs`), so the read is not answered
    /// and its transaction times out. Checked on arrival and at each wake, since a cut
    /// can come while the read waits.
    fn drop_lost_read(&mut self, wait: &WaitingRead) -> bool {
        let lost = self.stale_past(&wait.snap).is_some();
        if lost {
            self.counters.lost_reads_dropped += 1;
        }
        lost
    }

    fn answer_read(&mut self, wait: WaitingRead) {
        let object = self.object_at(&wait.key, wait.kind, &wait.snap);
        self.send(wait.from, Body::Version { read: wait.read, object });
    }

    /// The object of `key` of `kind` on `snap`: its log's updates within the snapshot, in
    /// arbitration order (`super::super::crdt`).
    pub(crate) fn object_at(&self, key: &Key, kind: Kind, snap: &Vector) -> Object {
        let mut object = Object::empty(kind);
        let Some(entries) = self.partition.log.get(&(key.clone(), kind)) else { return object };
        let mut visible: Vec<(Arbitration, &LogEntry)> = entries
            .iter()
            .filter(|e| e.commit.le(snap))
            .map(|e| (Arbitration { sum: e.commit.sum(), origin: e.origin, tx: e.tx }, e))
            .collect();
        visible.sort_by_key(|(arb, _)| *arb);
        for (arb, entry) in visible {
            object.apply(&entry.update, arb);
        }
        object
    }

    /// Re-examines reads waiting on timestamps the known vector now reaches.
    /// Reads waiting on the local entry are visited in timestamp order up to the known
    /// one; reads short of a remote or strong entry (a past from a faster coordinator,
    /// rare) are each looked at again, since replication moves them in any order.
    pub(crate) fn wake_reads(&mut self) {
        let d = self.me.dc as usize;
        while let Some((&(ts, n), _)) = self.partition.waiting.first_key_value() {
            if ts == u64::MAX || ts > self.partition.known.dcs[d] {
                break;
            }
            let wait = self.partition.waiting.remove(&(ts, n)).expect("the first key");
            self.wake_read(n, wait);
        }
        self.wake_reads_on_remote();
    }

    /// A woken read: answered, dropped as lost, or filed again under what it now waits on.
    fn wake_read(&mut self, n: u64, wait: WaitingRead) {
        if self.drop_lost_read(&wait) {
            return;
        }
        match self.first_unmet(&wait.snap) {
            None => self.answer_read(wait),
            Some(ts) => {
                self.partition.waiting.insert((ts, n), wait);
            }
        }
    }

    /// `PREPARE` (1:36–41): a prepare timestamp above the clock, the snapshot's local
    /// entry, the known vector's and every earlier one of this partition.
    pub(crate) fn prepare(
        &mut self,
        from: NodeId,
        tx: TxId,
        writes: Vec<(Key, Update)>,
        snap: &Vector,
    ) {
        if let Some(p) = self.partition.prepared.get(&tx) {
            let ts = p.ts;
            self.send(from, Body::PrepareAck { tx, ts });
            return;
        }
        let d = self.me.dc as usize;
        let floor = self.partition.last_ts.max(snap.dcs[d]).max(self.partition.known.dcs[d]);
        let ts = self.clock().max(self.partition_ts_above(floor));
        self.partition.last_ts = ts;
        self.partition.prepared_ts.insert((ts, tx));
        self.partition.prepared.insert(tx, Prepared { ts, writes, committing: false });
        self.send(from, Body::PrepareAck { tx, ts });
    }

    /// The smallest timestamp of this partition above `floor`.
    pub(crate) fn partition_ts_above(&self, floor: u64) -> u64 {
        let p = u64::from(self.me.partition);
        let candidate = (floor & !(TICK - 1)) | p;
        if candidate > floor {
            candidate
        } else {
            candidate + TICK
        }
    }

    /// `COMMIT` (1:42–48): applied once the clock reaches the commit timestamp; meanwhile
    /// the transaction stays prepared and holds the known vector below it.
    pub(crate) fn commit(&mut self, tx: TxId, commit: Vector) {
        let ts = commit.dcs[self.me.dc as usize];
        let Some(prepared) = self.partition.prepared.get(&tx) else { return };
        // A commit timestamp is the largest prepare timestamp, this one's included, and a
        // data center's commit timestamps are unique: a commit that says otherwise (or
        // comes again) is dropped.
        if ts < prepared.ts || prepared.committing || self.partition.local_commits.contains_key(&ts)
        {
            self.counters.rejected += 1;
            return;
        }
        self.partition.prepared.get_mut(&tx).expect("looked up").committing = true;
        if ts > self.clock() {
            self.counters.commits_waited += 1;
        }
        self.partition.commit_waits.insert((ts, tx), commit);
        self.apply_due_commits();
    }

    /// Applies the waiting commits whose timestamp the clock has reached.
    pub(crate) fn apply_due_commits(&mut self) {
        let clock = self.clock();
        while let Some(entry) = self.partition.commit_waits.first_entry() {
            if entry.key().0 > clock {
                break;
            }
            let ((ts, tx), commit) = entry.remove_entry();
            let prepared = self.partition.prepared.remove(&tx).expect("a commit waits prepared");
            self.partition.prepared_ts.remove(&(prepared.ts, tx));
            let commit = Arc::new(commit);
            self.append(tx, self.me.dc, &commit, &prepared.writes);
            let replicated = Replicated { tx, commit: (*commit).clone(), writes: prepared.writes };
            let previous = self.partition.local_commits.insert(ts, replicated);
            assert!(previous.is_none(), "two local commits at timestamp {ts}");
        }
    }

    /// Appends a committed transaction's updates to the operation log.
    pub(crate) fn append(
        &mut self,
        tx: TxId,
        origin: u32,
        commit: &Arc<Vector>,
        writes: &[(Key, Update)],
    ) {
        for (key, update) in writes {
            let entry = LogEntry { tx, origin, commit: Arc::clone(commit), update: update.clone() };
            self.partition.log.entry((key.clone(), update.kind())).or_default().push(entry);
            self.partition.entries += 1;
        }
    }

    /// Advances `known[d]` (2:2–3): to the clock when nothing is prepared, else to just
    /// below the smallest prepare timestamp; then wakes the reads it satisfies. Done at
    /// every step rather than only when propagating, so that a session's next read does
    /// not wait for the propagation period (`docs/geo.md`, *Ambiguities*).
    pub(crate) fn advance_known(&mut self) {
        let d = self.me.dc as usize;
        let bound = match self.partition.prepared_ts.first() {
            None => self.clock(),
            Some(&(ts, _)) => self.clock().min(ts - 1),
        };
        if bound > self.partition.known.dcs[d] {
            self.partition.known.dcs[d] = bound;
            self.wake_reads();
        }
    }

    /// `PROPAGATE_LOCAL_TXS` (2:1–8): the local commits the known vector covers, in
    /// timestamp order, to every sibling; a heartbeat when there are none.
    pub(crate) fn propagate(&mut self) {
        let d = self.me.dc;
        let known = self.partition.known.dcs[d as usize];
        self.partition.propagated = known;
        let rest = self.partition.local_commits.split_off(&known.saturating_add(1));
        let txs: Vec<Replicated> =
            std::mem::replace(&mut self.partition.local_commits, rest).into_values().collect();
        for dc in (0..self.dcs as u32).filter(|&i| i != d) {
            let to = self.replica(dc, self.me.partition);
            let body = if txs.is_empty() {
                Body::Heartbeat { origin: d, ts: known }
            } else {
                Body::Replicate { origin: d, txs: txs.clone() }
            };
            self.send(to, body);
        }
    }

    /// `REPLICATE` (2:9–15): remote transactions in their origin's timestamp order; one
    /// already stored (sent directly and forwarded) is dropped.
    pub(crate) fn replicate(&mut self, origin: u32, txs: Vec<Replicated>) {
        let i = origin as usize;
        for tx in txs {
            let ts = tx.commit.dcs[i];
            if ts <= self.partition.known.dcs[i] {
                self.counters.duplicates += 1;
                continue;
            }
            if let Some(cut) = self.lost_above(origin, ts) {
                // Of a returning data center's old life, above its cut: never visible,
                // and dropped everywhere (`back.rs`). What the sender held below it came
                // first, so the known entry reaches the cut, as a heartbeat's would: a
                // sender whose last transactions below the cut lie below its answer sends
                // no heartbeat after them (sweep seed 1130006640, a survivor never settled).
                self.counters.old_life_dropped += 1;
                let known = &mut self.partition.known.dcs[i];
                *known = (*known).max(cut);
                continue;
            }
            let commit = Arc::new(tx.commit.clone());
            self.append(tx.tx, origin, &commit, &tx.writes);
            self.partition.known.dcs[i] = ts;
            self.partition.remote_commits[i].insert(ts, tx);
            self.counters.replicated_in += 1;
        }
        self.wake_reads_on_remote();
    }

    /// `HEARTBEAT` (2:16–18).
    pub(crate) fn heartbeat(&mut self, origin: u32, ts: u64) {
        let ts = self.lost_above(origin, ts).unwrap_or(ts);
        let known = &mut self.partition.known.dcs[origin as usize];
        if ts > *known {
            *known = ts;
            self.wake_reads_on_remote();
        }
    }

    /// Re-examines the reads that wait on a remote or strong entry (only a session's
    /// vector from a faster coordinator makes one).
    pub(crate) fn wake_reads_on_remote(&mut self) {
        let waiting: Vec<(u64, u64)> =
            self.partition.waiting.range((u64::MAX, 0)..).map(|(k, _)| *k).collect();
        for key in waiting {
            let wait = self.partition.waiting.remove(&key).expect("listed");
            self.wake_read(key.1, wait);
        }
    }
}
