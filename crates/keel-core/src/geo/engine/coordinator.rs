//! Client transactions at their coordinator (Algorithm 1, 1:1–17 and 1:26–35): begin on
//! a snapshot, operations read through the partition that holds the key and the
//! transaction's own updates, causal commit by two-phase commit inside the data center
//! (it never aborts), and barriers and attaches (1:49–52).

use super::super::types::{
    refuse, Arbitration, Body, GeoResult, Kind, Object, Update, Vector, PARTITION_BITS,
};
use super::{GeoEngine, Pending, Tx};
use crate::engine::RequestTag;
use crate::time::Time;
use keel_types::{KeelError, Key};
use std::collections::BTreeSet;

/// How far ahead of this node's clock a session's local entry may be (clocks of one data
/// center disagree by less): a vector further ahead is refused, so that no client can push
/// a partition's timestamps far into the future.
const PAST_AHEAD_US_MAX: u64 = 60_000_000;

impl GeoEngine {
    /// The partition holding `key`.
    pub(crate) fn partition_of(&self, key: &[u8]) -> u32 {
        super::super::key_partition(key, self.partitions)
    }

    /// Refuses a vector of another shape, or whose local entry runs far ahead of this
    /// node's clock.
    fn check_past(&self, past: &Vector) -> Result<(), KeelError> {
        if past.dcs.len() != self.dcs {
            return Err(refuse(format!(
                "a vector of {} entries in a keyspace of {} data centers",
                past.dcs.len(),
                self.dcs
            )));
        }
        let ahead = self.clock().saturating_add(PAST_AHEAD_US_MAX << PARTITION_BITS);
        if past.dcs[self.me.dc as usize] > ahead {
            return Err(refuse("the vector's entry for this data center is ahead of its clocks"));
        }
        Ok(())
    }

    /// Refuses a vector checked by `check_past` that names a data center's old life above
    /// its cut (`copy.rs`): what it read is gone; the session starts over.
    fn check_fresh(&mut self, past: &Vector) -> Result<(), KeelError> {
        match self.stale_past(past) {
            Some(_) => Err(self.stale_error()),
            None => Ok(()),
        }
    }

    /// `START_TX(past)` (1:1–8). The remote entries come from the uniform vector and the
    /// session's past (per transaction: a session's vector never raises what other
    /// transactions see), the local one is the larger of the session's and the uniform
    /// one, the strong one the session's.
    pub(crate) fn begin(
        &mut self,
        tag: RequestTag,
        session: u64,
        past: Vector,
        strong: Option<Option<String>>,
    ) {
        if let Err(e) = self.check_past(&past).and_then(|()| self.check_fresh(&past)) {
            return self.reply(tag, Err(e));
        }
        if strong.is_some() && !self.config.strong {
            let why = "this keyspace serves no strong transactions (its `strong` setting is off)";
            return self.reply(tag, Err(refuse(why)));
        }
        if let Some(open) = self.coordinator.sessions.get(&session) {
            let e = refuse(format!("the session already has transaction {} open", open.seq));
            return self.reply(tag, Err(e));
        }
        if self.coordinator.txs.len() >= self.config.txs_max {
            return self.reply(tag, Err(KeelError::Busy("too many open transactions".into())));
        }
        let mut snap = self.visible();
        snap.join(&past);
        if let Err(e) = self.caught_up(&snap) {
            return self.reply(tag, Err(e));
        }
        let id = super::super::types::TxId { node: self.me.node.0, seq: self.coordinator.next_tx };
        self.coordinator.next_tx += 1;
        let deadline = Time(self.now.0 + self.config.tx_timeout.0);
        let tx = Tx {
            session,
            snap: snap.clone(),
            writes: Default::default(),
            ops: 0,
            bytes: 0,
            pending: Pending::Idle,
            deadline,
            strong,
            keys: Default::default(),
        };
        self.coordinator.txs.insert(id, tx);
        self.coordinator.sessions.insert(session, id);
        self.coordinator.deadlines.insert((deadline, id));
        self.counters.begun += 1;
        self.reply(tag, Ok(GeoResult::Began { tx: id, snap }));
    }

    /// What a new snapshot shows of other transactions: the uniform vector (remote
    /// transactions only once uniform, local ones once uniform too, strong ones once
    /// stored here); under the negative control, what this data center stores.
    fn visible(&self) -> Vector {
        let u = &self.uniformity;
        let mut snap = if self.config.unsafe_expose_non_uniform {
            u.stable.clone()
        } else {
            u.uniform.clone()
        };
        snap.strong = u.stable.strong;
        snap
    }

    /// The open transaction `id` of `session`, idle, or the refusal.
    fn idle_tx(
        &mut self,
        session: u64,
        id: super::super::types::TxId,
    ) -> Result<&mut Tx, KeelError> {
        match self.coordinator.txs.get_mut(&id) {
            Some(tx) if tx.session == session && tx.pending == Pending::Idle => Ok(tx),
            Some(tx) if tx.session == session => {
                Err(refuse("the transaction is still running its last operation"))
            }
            _ => Err(refuse(format!(
                "{} (transaction {}: dropped after {} ms idle, or never begun)",
                keel_types::geo::TX_GONE,
                id.seq,
                self.config.tx_timeout.0 / 1_000_000
            ))),
        }
    }

    /// `DO_OP` (1:9–17): the object from its partition on the snapshot, then the
    /// transaction's own updates of it; an update is buffered and its result is the
    /// object after it.
    pub(crate) fn operate(
        &mut self,
        tag: RequestTag,
        session: u64,
        id: super::super::types::TxId,
        key: Key,
        kind: Kind,
        update: Option<Update>,
    ) {
        // What a partition's gate refuses must be refused here: a refused message would
        // hold its channel (it is sent again, and refused again, for ever).
        if let Err(e) = self.config.limits.check_key(&key).and_then(|()| match &update {
            Some(Update::Set(v) | Update::GAdd(v) | Update::SAdd(v) | Update::SRem(v, _)) => {
                self.config.limits.check_value(v)
            }
            _ => Ok(()),
        }) {
            return self.reply(tag, Err(e));
        }
        let read = self.coordinator.next_read;
        let partition = self.partition_of(&key);
        let (ops_max, bytes_max) = (self.config.tx_ops_max, self.config.tx_bytes_max);
        let added = update.as_ref().map_or(0, |u| u.bytes() + key.len());
        let tx = match self.idle_tx(session, id) {
            Ok(tx) => tx,
            Err(e) => return self.reply(tag, Err(e)),
        };
        if tx.ops >= ops_max || tx.bytes + added > bytes_max {
            return self.reply(tag, Err(refuse("the transaction is over its size limit")));
        }
        tx.ops += 1;
        tx.bytes += added;
        if tx.strong.is_some() {
            tx.keys.entry(partition).or_default().insert(key.clone());
        }
        let snap = tx.snap.clone();
        tx.pending = Pending::Op { tag, read, key: key.clone(), kind, update };
        self.coordinator.next_read += 1;
        self.coordinator.reads.insert(read, id);
        let to = self.replica(self.me.dc, partition);
        self.send(to, Body::GetVersion { read, key, kind, snap });
    }

    /// `VERSION`: the object on the snapshot arrived; the transaction's own updates go
    /// on top (they come after everything in its snapshot), and the operation ends.
    pub(crate) fn version(&mut self, read: u64, mut object: Object) {
        let Some(id) = self.coordinator.reads.remove(&read) else { return };
        let partition_of = |e: &GeoEngine, k: &Key| e.partition_of(k);
        let Some(tx) = self.coordinator.txs.get(&id) else { return };
        let Pending::Op { tag, key, kind, update, .. } = tx.pending.clone() else { return };
        if object.kind() != kind {
            // A partition that breaks the protocol: the operation fails, the transaction
            // goes on (it would otherwise wait for ever: only idle ones time out).
            self.counters.rejected += 1;
            self.coordinator.txs.get_mut(&id).expect("looked up").pending = Pending::Idle;
            let why = "a partition answered with an object of another type";
            return self.reply(tag, Err(KeelError::Unavailable(why.into())));
        }
        let own = Arbitration { sum: u128::MAX, origin: self.me.dc, tx: id };
        let partition = partition_of(self, &key);
        let tx = self.coordinator.txs.get_mut(&id).expect("looked up");
        for (k, u) in tx.writes.get(&partition).into_iter().flatten() {
            if *k == key && u.kind() == kind {
                object.apply(u, own);
            }
        }
        if let Some(mut update) = update {
            if let Update::SRem(elem, seen) = &mut update {
                *seen = object.adds_of(elem);
            }
            object.apply(&update, own);
            tx.writes.entry(partition).or_default().push((key, update));
        }
        tx.pending = Pending::Idle;
        self.reply(tag, Ok(GeoResult::Object(object)));
    }

    /// `COMMIT_CAUSAL` (1:26–35): a read-only transaction returns its snapshot; an update
    /// transaction is prepared at every partition it updates and commits at the largest
    /// prepare timestamp.
    pub(crate) fn commit_tx(
        &mut self,
        tag: RequestTag,
        session: u64,
        id: super::super::types::TxId,
    ) {
        let tx = match self.idle_tx(session, id) {
            Ok(tx) => tx,
            Err(e) => return self.reply(tag, Err(e)),
        };
        if tx.strong.is_some() {
            return self.commit_strong(tag, id);
        }
        if tx.writes.is_empty() {
            let vector = tx.snap.clone();
            self.close(id);
            self.counters.committed_read_only += 1;
            return self.reply(tag, Ok(GeoResult::Committed { vector }));
        }
        let waiting: BTreeSet<u32> = tx.writes.keys().copied().collect();
        let snap = tx.snap.clone();
        let prepares: Vec<(u32, Vec<(Key, Update)>)> =
            tx.writes.iter().map(|(p, w)| (*p, w.clone())).collect();
        tx.pending = Pending::Committing { tag: Some(tag), waiting, commit: snap.clone() };
        for (partition, writes) in prepares {
            let to = self.replica(self.me.dc, partition);
            self.send(to, Body::Prepare { tx: id, writes, snap: snap.clone() });
        }
    }

    /// `PREPARE_ACK` from the replica of one participant.
    pub(crate) fn prepare_ack(
        &mut self,
        from: keel_types::NodeId,
        id: super::super::types::TxId,
        ts: u64,
    ) {
        let Some(member) = self.member(from) else { return };
        let d = self.me.dc as usize;
        let Some(tx) = self.coordinator.txs.get_mut(&id) else { return };
        let Pending::Committing { tag, waiting, commit } = &mut tx.pending else { return };
        if !waiting.remove(&member.partition) {
            return;
        }
        commit.dcs[d] = commit.dcs[d].max(ts);
        if !waiting.is_empty() {
            return;
        }
        let (tag, commit) = (*tag, commit.clone());
        let participants: Vec<u32> = tx.writes.keys().copied().collect();
        for partition in participants {
            let to = self.replica(self.me.dc, partition);
            self.send(to, Body::Commit { tx: id, commit: commit.clone() });
        }
        self.close(id);
        self.counters.committed += 1;
        if let Some(tag) = tag {
            self.reply(tag, Ok(GeoResult::Committed { vector: commit }));
        }
    }

    /// Drops transaction `id` unless it is committing (a commit, once prepares are out,
    /// finishes: it never aborts).
    pub(crate) fn abort(&mut self, tag: RequestTag, session: u64, id: super::super::types::TxId) {
        match self.idle_tx(session, id) {
            Ok(_) => {
                self.close(id);
                self.counters.dropped += 1;
                self.reply(tag, Ok(GeoResult::Aborted));
            }
            Err(e) => self.reply(tag, Err(e)),
        }
    }

    /// Forgets transaction `id`.
    pub(crate) fn close(&mut self, id: super::super::types::TxId) {
        if let Some(tx) = self.coordinator.txs.remove(&id) {
            if matches!(tx.pending, Pending::Uniforming { .. }) {
                self.coordinator.certify_waits.remove(&(tx.snap.dcs[self.me.dc as usize], id));
            }
            // A commit that timed out freed its session already (`expire_txs`).
            self.unbind_session(tx.session, id);
            self.coordinator.deadlines.remove(&(tx.deadline, id));
        }
    }

    /// Frees `session` for its next transaction, if `id` is the one it has open.
    fn unbind_session(&mut self, session: u64, id: super::super::types::TxId) {
        if self.coordinator.sessions.get(&session) == Some(&id) {
            self.coordinator.sessions.remove(&session);
        }
    }

    /// Drops the idle transactions past their deadline (a transaction waiting for a
    /// partition or committing finishes first: its deadline moves on by a timeout).
    pub(crate) fn expire_txs(&mut self) {
        while let Some(&(deadline, id)) = self.coordinator.deadlines.first() {
            if deadline > self.now {
                break;
            }
            self.coordinator.deadlines.pop_first();
            let tx = self.coordinator.txs.get_mut(&id).expect("a deadline has its transaction");
            tx.deadline = Time(self.now.0 + self.config.tx_timeout.0);
            // A partition of this data center that does not answer (its replica lost)
            // fails the operation, or leaves the commit's outcome unknown to its client;
            // the commit itself goes on (it never aborts).
            let late = match &mut tx.pending {
                Pending::Idle => {
                    self.coordinator
                        .txs
                        .remove(&id)
                        .map(|tx| self.coordinator.sessions.remove(&tx.session));
                    self.counters.dropped += 1;
                    continue;
                }
                Pending::Op { tag, read, .. } => {
                    let (tag, read) = (*tag, *read);
                    tx.pending = Pending::Idle;
                    self.coordinator.reads.remove(&read);
                    let why = "a partition of this data center did not answer: its replica may be lost (docs/geo.md, Failures)";
                    Some((tag, KeelError::Unavailable(why.into())))
                }
                Pending::Committing { tag, .. }
                | Pending::Uniforming { tag }
                | Pending::Certifying { tag, .. } => {
                    tag.take().map(|tag| (tag, KeelError::Timeout))
                }
            };
            // A commit answered with a time-out goes on, but its session may begin the
            // next transaction (whose snapshot includes this one's).
            let (session, deadline) = (tx.session, tx.deadline);
            if !matches!(tx.pending, Pending::Idle | Pending::Op { .. }) {
                self.unbind_session(session, id);
            }
            self.coordinator.deadlines.insert((deadline, id));
            if let Some((tag, error)) = late {
                self.reply(tag, Err(error));
            }
        }
    }

    /// `UNIFORM_BARRIER(past)` (1:49–50): answered once `uniform[d] ≥ past[d]`.
    pub(crate) fn barrier(&mut self, tag: RequestTag, past: Vector) {
        if let Err(e) = self.check_past(&past).and_then(|()| self.check_fresh(&past)) {
            return self.reply(tag, Err(e));
        }
        let need = past.dcs[self.me.dc as usize];
        if self.uniformity.uniform.dcs[self.me.dc as usize] >= need {
            return self.reply(tag, Ok(GeoResult::Synced));
        }
        if self.syncs_full() {
            return self.reply(tag, Err(KeelError::Busy("too many barriers and attaches".into())));
        }
        self.counters.barriers_waited += 1;
        self.coordinator.barriers.insert((need, tag), ());
    }

    /// `ATTACH(past)` (1:51–52): answered once `uniform[i] ≥ past[i]` for every other
    /// data center `i`.
    pub(crate) fn attach(&mut self, tag: RequestTag, past: Vector) {
        if past.dcs.len() != self.dcs {
            return self.reply(tag, Err(refuse("a vector of another keyspace's shape")));
        }
        if let Err(e) = self.check_fresh(&past) {
            return self.reply(tag, Err(e));
        }
        match self.attach_unmet(&past) {
            None => self.reply(tag, Ok(GeoResult::Synced)),
            Some(_) if self.syncs_full() => {
                self.reply(tag, Err(KeelError::Busy("too many barriers and attaches".into())))
            }
            Some((dc, need)) => {
                self.counters.attaches_waited += 1;
                self.coordinator.attaches.insert((dc, need, tag), past);
            }
        }
    }

    /// Whether as many barriers and attaches wait as transactions may be open: a client
    /// that sends a vector no data center will reach waits, and is not let pile them up.
    fn syncs_full(&self) -> bool {
        self.coordinator.barriers.len() + self.coordinator.attaches.len() >= self.config.txs_max
    }

    /// The first other data center whose uniform entry is below `past`'s.
    fn attach_unmet(&self, past: &Vector) -> Option<(u32, u64)> {
        let u = &self.uniformity.uniform;
        (0..self.dcs as u32)
            .filter(|&i| i != self.me.dc)
            .find(|&i| u.dcs[i as usize] < past.dcs[i as usize])
            .map(|i| (i, past.dcs[i as usize]))
    }

    /// Answers the barriers and attaches the uniform vector now satisfies.
    pub(crate) fn wake_syncs(&mut self) {
        self.wake_certify();
        let d = self.me.dc as usize;
        let local = self.uniformity.uniform.dcs[d];
        while let Some(entry) = self.coordinator.barriers.first_entry() {
            if entry.key().0 > local {
                break;
            }
            let (_, tag) = entry.remove_entry().0;
            self.reply(tag, Ok(GeoResult::Synced));
        }
        let me = self.me.dc;
        for dc in (0..self.dcs as u32).filter(|&i| i != me) {
            let reached = self.uniformity.uniform.dcs[dc as usize];
            let due: Vec<(u32, u64, RequestTag)> = self
                .coordinator
                .attaches
                .range((dc, 0, RequestTag(0))..=(dc, reached, RequestTag(u64::MAX)))
                .map(|(k, _)| *k)
                .collect();
            for key in due {
                let past = self.coordinator.attaches.remove(&key).expect("listed");
                match self.attach_unmet(&past) {
                    None => self.reply(key.2, Ok(GeoResult::Synced)),
                    Some((dc, need)) => {
                        self.coordinator.attaches.insert((dc, need, key.2), past);
                    }
                }
            }
        }
    }
}
