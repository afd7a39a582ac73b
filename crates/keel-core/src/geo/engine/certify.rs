//! Strong transactions (Algorithm 3; §6.2–6.3 of the paper; `docs/geo.md`, *Strong
//! transactions*).
//!
//! - **Coordinator.** A strong transaction runs like a causal one. Its commit first
//!   waits for its snapshot's local entry to be uniform (3:2), then sends its part at
//!   each partition it touched to that partition's certification leader, and waits for
//!   their durable votes: it commits, at the largest proposed strong timestamp, if all
//!   vote commit.
//! - **Leader** (the partition's replica in `Config::leader_dc`). It votes commit if no
//!   conflicting strong transaction is undecided here and every committed conflicting
//!   one is in the candidate's snapshot. It appends the vote to the partition's
//!   certification log, and sends it, once durable, to the coordinator and the other
//!   participants' leaders. Each leader decides (commit iff every vote is commit) and
//!   logs the decision. A leader that has a ballot but no candidate by the candidate's
//!   expiry votes abort, so a coordinator that failed halfway leaves nothing undecided.
//! - **Log.** Replicated from the leader to the partition's siblings over the
//!   channels; a record is durable once a majority of data centers store it. Every
//!   replica applies the durable prefix to its delivery state.
//! - **Delivery** (3:4–8). Committed transactions' updates enter the operation log in
//!   strong-timestamp order, up to the delivery watermark: below every undecided
//!   proposal and at most the last strong heartbeat (a `Promise`). `known.strong`
//!   follows the watermark.

use super::super::types::{Body, Candidate, GeoResult, Record, TxId, Vector, PARTITION_BITS};
use super::{Ballot, GeoEngine, Pending, Voted};
use crate::engine::RequestTag;
use keel_types::KeelError;
use std::sync::Arc;

impl GeoEngine {
    /// Whether this replica leads its partition's certification (in a keyspace that
    /// serves strong transactions).
    pub(crate) fn leads(&self) -> bool {
        self.config.strong && self.me.dc == self.config.leader_dc
    }

    /// `COMMIT_STRONG` (3:1–3) of the idle strong transaction `id`.
    pub(crate) fn commit_strong(&mut self, tag: RequestTag, id: TxId) {
        let d = self.me.dc as usize;
        let uniform = self.uniformity.uniform.dcs[d];
        let skip = self.config.unsafe_skip_strong_barrier;
        let tx = self.coordinator.txs.get_mut(&id).expect("an idle transaction");
        if tx.keys.is_empty() {
            let vector = tx.snap.clone();
            self.close(id);
            self.counters.strong_committed += 1;
            return self.reply(tag, Ok(GeoResult::Committed { vector }));
        }
        let need = tx.snap.dcs[d];
        if need > uniform && !skip {
            tx.pending = Pending::Uniforming { tag: Some(tag) };
            self.coordinator.certify_waits.insert((need, id));
            self.counters.strong_barriers_waited += 1;
            return;
        }
        self.certify(id, Some(tag));
    }

    /// Certification waits the uniform vector now satisfies.
    pub(crate) fn wake_certify(&mut self) {
        let local = self.uniformity.uniform.dcs[self.me.dc as usize];
        while let Some(&(need, id)) = self.coordinator.certify_waits.first() {
            if need > local {
                break;
            }
            self.coordinator.certify_waits.pop_first();
            let tx = self.coordinator.txs.get(&id).expect("a certify wait has its transaction");
            let Pending::Uniforming { tag } = tx.pending else {
                unreachable!("a certify wait of a transaction not waiting for it")
            };
            self.certify(id, tag);
        }
    }

    /// Sends strong transaction `id`'s part at each partition it touched to that
    /// partition's leader.
    fn certify(&mut self, id: TxId, tag: Option<RequestTag>) {
        let timeout_us = self.config.tx_timeout.0 / 1_000;
        let expiry = self.clock().saturating_add(timeout_us << PARTITION_BITS);
        let (origin, leader_dc) = (self.me.dc, self.config.leader_dc);
        self.counters.certifying += 1;
        let tx = self.coordinator.txs.get_mut(&id).expect("certifying an open transaction");
        let participants: Vec<u32> = tx.keys.keys().copied().collect();
        tx.pending =
            Pending::Certifying { tag, waiting: participants.iter().copied().collect(), ts: 0 };
        let updates = !tx.writes.is_empty();
        let label = tx.strong.clone().flatten();
        let candidates: Vec<Candidate> = participants
            .iter()
            .map(|p| Candidate {
                tx: id,
                origin,
                label: label.clone(),
                keys: tx.keys[p].iter().cloned().collect(),
                writes: tx.writes.get(p).cloned().unwrap_or_default(),
                updates,
                snap: tx.snap.clone(),
                participants: participants.clone(),
                expiry,
            })
            .collect();
        for (p, candidate) in participants.into_iter().zip(candidates) {
            let to = self.replica(leader_dc, p);
            self.send(to, Body::Certify(Box::new(candidate)));
        }
    }

    /// A participant's durable vote, at the coordinator: an abort ends the transaction at
    /// once; the last commit vote commits it.
    fn coordinator_vote(&mut self, partition: u32, id: TxId, ok: bool, ts: u64) {
        let Some(tx) = self.coordinator.txs.get_mut(&id) else { return };
        let Pending::Certifying { tag, waiting, ts: top } = &mut tx.pending else { return };
        if !waiting.remove(&partition) {
            return;
        }
        *top = (*top).max(ts);
        if ok && !waiting.is_empty() {
            return;
        }
        let tag = *tag;
        let mut vector = tx.snap.clone();
        let broken = ok && !tx.writes.is_empty() && *top <= vector.strong;
        if ok && !tx.writes.is_empty() {
            vector.strong = *top;
        }
        self.close(id);
        if broken {
            // A leader proposed no timestamp above the snapshot: it broke the protocol,
            // and what its partition decided is not known here.
            self.counters.rejected += 1;
            if let Some(tag) = tag {
                self.reply(tag, Err(KeelError::Timeout));
            }
            return;
        }
        let result = if ok {
            self.counters.strong_committed += 1;
            Ok(GeoResult::Committed { vector })
        } else {
            self.counters.strong_aborted += 1;
            Err(KeelError::Conflict(format!(
                "strong transaction {} conflicts with a strong transaction its snapshot does \
                 not include; run it again",
                id.seq
            )))
        };
        if let Some(tag) = tag {
            self.reply(tag, result);
        }
    }

    /// A `VOTE` body: for the coordinator, and for this leader if it is a participant.
    pub(crate) fn vote_in(
        &mut self,
        from: keel_types::NodeId,
        id: TxId,
        ok: bool,
        ts: u64,
        participants: Vec<u32>,
        expiry: u64,
    ) {
        let Some(member) = self.member(from) else { return };
        if id.node == self.me.node.0 {
            self.coordinator_vote(member.partition, id, ok, ts);
        }
        if from != self.me.node && self.leads() && participants.contains(&self.me.partition) {
            self.leader_vote(member.partition, id, ok, ts, participants, expiry);
        }
    }

    /// Another participant's durable vote, at this leader.
    fn leader_vote(
        &mut self,
        partition: u32,
        id: TxId,
        ok: bool,
        ts: u64,
        participants: Vec<u32>,
        expiry: u64,
    ) {
        let past = self.clock() > expiry;
        let c = &mut self.certifier;
        match c.ballots.get_mut(&id) {
            Some(ballot) => {
                ballot.votes.insert(partition, (ok, ts));
            }
            // Decided here already, or to be aborted when its candidate comes.
            None if past && !ok => return,
            None => {
                let mut ballot = Ballot { participants, expiry, ..Ballot::default() };
                ballot.votes.insert(partition, (ok, ts));
                c.ballots.insert(id, ballot);
                c.expiries.insert((expiry, id));
            }
        }
        self.try_decide(id);
    }

    /// `CERTIFY` at this partition's leader: the vote, appended to the log.
    pub(crate) fn certify_here(&mut self, candidate: Candidate) {
        let id = candidate.tx;
        if self.certifier.ballots.get(&id).is_some_and(|b| b.mine.is_some()) {
            return;
        }
        let clock = self.clock();
        let told_abort =
            self.certifier.ballots.get(&id).is_some_and(|b| b.votes.values().any(|(ok, _)| !ok));
        let ok = !told_abort
            && clock <= candidate.expiry
            && (self.config.unsafe_certify_all || !self.conflicts(&candidate));
        let ts = if ok { self.propose(&candidate.snap) } else { 0 };
        let c = &mut self.certifier;
        let ballot = c.ballots.entry(id).or_default();
        c.expiries.remove(&(ballot.expiry, id));
        ballot.participants.clone_from(&candidate.participants);
        ballot.expiry = candidate.expiry;
        ballot.mine = Some((ok, ts));
        ballot.label.clone_from(&candidate.label);
        ballot.keys.clone_from(&candidate.keys);
        ballot.updates = candidate.updates;
        ballot.snap.clone_from(&candidate.snap);
        if ok && candidate.updates {
            for key in &candidate.keys {
                c.pending.entry(key.clone()).or_default().insert(id, candidate.label.clone());
            }
        }
        self.counters.votes += 1;
        self.append_record(Record::Vote { candidate: Box::new(candidate), ok, ts });
        self.try_decide(id);
    }

    /// Whether a conflicting strong transaction is undecided here, or committed and not
    /// in the candidate's snapshot.
    fn conflicts(&self, candidate: &Candidate) -> bool {
        let label = candidate.label.as_deref();
        let rel = &self.config.conflicts;
        candidate.keys.iter().any(|key| {
            let pending = self.certifier.pending.get(key).into_iter().flatten();
            let committed = self.certifier.committed.get(key).into_iter().flatten();
            pending
                .into_iter()
                .any(|(tx, other)| *tx != candidate.tx && rel.conflict(label, other.as_deref()))
                || committed.into_iter().any(|(other, joined)| {
                    rel.conflict(label, other.as_deref()) && !joined.le(&candidate.snap)
                })
        })
    }

    /// A strong timestamp of this partition above the clock, every earlier proposal and
    /// promise, and the snapshot's strong entry.
    fn propose(&mut self, snap: &Vector) -> u64 {
        let floor = self.certifier.last_proposal.max(snap.strong);
        let ts = self.clock().max(self.partition_ts_above(floor));
        self.certifier.last_proposal = ts;
        ts
    }

    /// Decides `id` once a vote is abort or every participant's vote is in (this
    /// partition's own, durable, among them), and forgets its ballot.
    fn try_decide(&mut self, id: TxId) {
        let c = &mut self.certifier;
        let Some(ballot) = c.ballots.get(&id) else { return };
        let Some((mine_ok, _)) = ballot.mine else { return };
        let aborted = ballot.votes.values().any(|(ok, _)| !ok) || !mine_ok;
        let all_in = ballot.participants.iter().all(|p| ballot.votes.contains_key(p));
        if !aborted && !all_in {
            return;
        }
        let ballot = c.ballots.remove(&id).expect("looked up");
        c.expiries.remove(&(ballot.expiry, id));
        if !mine_ok {
            return;
        }
        let commit = !aborted;
        let ts = ballot.votes.values().map(|(_, ts)| *ts).max().unwrap_or(0);
        if ballot.updates {
            for key in &ballot.keys {
                if let Some(txs) = c.pending.get_mut(key) {
                    txs.remove(&id);
                    if txs.is_empty() {
                        c.pending.remove(key);
                    }
                }
                if commit {
                    let mut vector = ballot.snap.clone();
                    vector.strong = ts;
                    let by_label = c.committed.entry(key.clone()).or_default();
                    match by_label.get_mut(&ballot.label) {
                        Some(joined) => joined.join(&vector),
                        None => {
                            by_label.insert(ballot.label.clone(), vector);
                        }
                    }
                }
            }
        }
        self.append_record(Record::Decide { tx: id, commit, ts });
        if commit && ts > self.certifier.last_proposal {
            // The decision is at another partition's larger proposal: this leader's
            // clock catches up with it (a hybrid clock's receive rule), so that its next
            // promise does not hold the transaction back by the clocks' skew.
            self.certifier.last_proposal = ts;
            self.append_record(Record::Promise { ts });
        }
    }

    /// Ballots past their expiry with no vote here: this partition votes abort.
    pub(crate) fn expire_ballots(&mut self) {
        let clock = self.clock();
        while let Some(&(expiry, id)) = self.certifier.expiries.first() {
            if expiry >= clock {
                break;
            }
            self.certifier.expiries.pop_first();
            let participants = self.certifier.ballots[&id].participants.clone();
            let candidate = Candidate {
                tx: id,
                origin: 0,
                label: None,
                keys: Vec::new(),
                writes: Vec::new(),
                updates: false,
                snap: Vector::zero(self.dcs),
                participants,
                expiry,
            };
            self.certify_here(candidate);
        }
    }

    /// Appends `record` to this leader's log.
    fn append_record(&mut self, record: Record) {
        self.certifier.log.push_back(record);
        self.advance_durable();
    }

    /// The log's length.
    pub(crate) fn log_end(&self) -> u64 {
        self.certifier.base + self.certifier.log.len() as u64
    }

    /// Leader: the durable index is the largest stored at `f + 1` data centers (this one
    /// and the `f` best siblings); newly durable votes go out, and the delivery state
    /// follows.
    fn advance_durable(&mut self) {
        let end = self.log_end();
        let f = self.config.f as usize;
        let mut others: Vec<u64> = (0..self.dcs)
            .filter(|&i| i != self.me.dc as usize)
            .map(|i| self.certifier.acked[i])
            .collect();
        others.sort_unstable_by(|a, b| b.cmp(a));
        let durable = if f == 0 { end } else { others[f - 1].min(end) };
        let from = self.certifier.durable;
        if durable <= from {
            return;
        }
        self.certifier.durable = durable;
        for i in from..durable {
            let at = (i - self.certifier.base) as usize;
            if let Record::Vote { candidate, ok, ts } = &self.certifier.log[at] {
                let (id, ok, ts) = (candidate.tx, *ok, *ts);
                let (participants, expiry) = (candidate.participants.clone(), candidate.expiry);
                self.send_vote(id, ok, ts, participants, expiry);
            }
        }
        self.apply_durable();
    }

    /// A durable vote of this partition: to the coordinator and the other participants'
    /// leaders, and into this leader's own ballot.
    fn send_vote(&mut self, id: TxId, ok: bool, ts: u64, participants: Vec<u32>, expiry: u64) {
        let me = self.me.partition;
        let coordinator = keel_types::NodeId(id.node);
        if self.member(coordinator).is_some() {
            let body = Body::Vote { tx: id, ok, ts, participants: participants.clone(), expiry };
            self.send(coordinator, body);
        }
        for &p in participants.iter().filter(|&&p| p != me) {
            let to = self.replica(self.config.leader_dc, p);
            if to != coordinator {
                let body =
                    Body::Vote { tx: id, ok, ts, participants: participants.clone(), expiry };
                self.send(to, body);
            }
        }
        if let Some(ballot) = self.certifier.ballots.get_mut(&id) {
            ballot.votes.insert(me, (ok, ts));
            self.try_decide(id);
        }
    }

    /// Leader, each broadcast period (`HEARTBEAT_STRONG`, 3:9–10): promises that no vote
    /// to come proposes a timestamp at or below the clock's last tick.
    pub(crate) fn promise(&mut self) {
        let ts = self.clock().saturating_sub(1);
        if ts > self.certifier.last_proposal {
            self.certifier.last_proposal = ts;
            self.append_record(Record::Promise { ts });
        }
    }

    /// Leader: each sibling's missing records and the durable index, if either moved.
    pub(crate) fn replicate_log(&mut self) {
        let end = self.log_end();
        let durable = self.certifier.durable;
        let me = self.me.dc;
        for dc in (0..self.dcs as u32).filter(|&i| i != me) {
            let i = dc as usize;
            let (sent, told) = (self.certifier.sent[i], self.certifier.told[i]);
            if sent == end && told == durable {
                continue;
            }
            let base = self.certifier.base;
            let records: Vec<Record> =
                self.certifier.log.range((sent - base) as usize..).cloned().collect();
            let to = self.replica(dc, self.me.partition);
            self.send(to, Body::Append { first: sent, records, durable });
            self.certifier.sent[i] = end;
            self.certifier.told[i] = durable;
        }
    }

    /// Leader: sibling `from` stores the log below `through`.
    pub(crate) fn appended(&mut self, from: keel_types::NodeId, through: u64) {
        let Some(member) = self.member(from) else { return };
        let acked = &mut self.certifier.acked[member.dc as usize];
        *acked = (*acked).max(through.min(self.certifier.sent[member.dc as usize]));
        self.advance_durable();
        self.trim_log();
    }

    /// Sibling: the leader's records from `first` on, and its durable index.
    pub(crate) fn append_in(&mut self, first: u64, records: Vec<Record>, durable: u64) {
        let end = self.log_end();
        if first > end {
            // A gap: the channel delivers in order, so only a broken leader makes one.
            self.counters.rejected += 1;
            return;
        }
        let skip = (end - first) as usize;
        self.certifier.log.extend(records.into_iter().skip(skip));
        let end = self.log_end();
        self.certifier.durable = self.certifier.durable.max(durable.min(end));
        self.apply_durable();
        self.trim_log();
        let to = self.replica(self.config.leader_dc, self.me.partition);
        self.send(to, Body::Appended { through: end });
    }

    /// Forgets the records every replica that needs them has: on the leader, those every
    /// sibling stores and this one applied; on a sibling, those it applied.
    fn trim_log(&mut self) {
        let c = &mut self.certifier;
        let mut below = c.applied;
        if self.me.dc == self.config.leader_dc {
            let me = self.me.dc as usize;
            let least = c.acked.iter().enumerate().filter(|(i, _)| *i != me).map(|(_, a)| *a);
            below = below.min(least.min().unwrap_or(below));
        }
        while c.base < below {
            c.log.pop_front();
            c.base += 1;
        }
    }

    /// Applies the durable records not yet applied to the delivery state, then delivers.
    fn apply_durable(&mut self) {
        while self.certifier.applied < self.certifier.durable {
            let at = (self.certifier.applied - self.certifier.base) as usize;
            let record = self.certifier.log[at].clone();
            self.certifier.applied += 1;
            self.apply_record(record);
        }
        self.deliver();
    }

    fn apply_record(&mut self, record: Record) {
        let c = &mut self.certifier;
        match record {
            Record::Vote { candidate, ok: true, ts } if !candidate.writes.is_empty() => {
                let Candidate { tx, origin, snap, writes, .. } = *candidate;
                c.undecided_ts.insert((ts, tx));
                c.undecided.insert(tx, Voted { origin, ts, snap, writes });
            }
            Record::Vote { .. } => {}
            Record::Decide { tx, commit, ts } => {
                if let Some(voted) = c.undecided.remove(&tx) {
                    c.undecided_ts.remove(&(voted.ts, tx));
                    if commit {
                        // A decision is at the largest proposal, this partition's
                        // included: a leader that says otherwise broke the protocol, and
                        // the transaction goes at its proposal here.
                        let ts = ts.max(voted.ts);
                        c.decided.insert((ts, tx), Voted { ts, ..voted });
                    }
                }
            }
            Record::Promise { ts } => c.promise = c.promise.max(ts),
        }
    }

    /// `DELIVER_UPDATES` (3:4–8): the committed transactions below the watermark, in
    /// strong-timestamp order, into the operation log; `known.strong` to the watermark.
    fn deliver(&mut self) {
        let early = self.config.unsafe_deliver_early;
        let c = &mut self.certifier;
        let held = match c.undecided_ts.first() {
            Some(&(ts, _)) if !early => ts.saturating_sub(1),
            _ => u64::MAX,
        };
        let watermark = c.promise.min(held);
        let mut delivered = Vec::new();
        while let Some(entry) = c.decided.first_entry() {
            if entry.key().0 > watermark {
                break;
            }
            let ((_, tx), voted) = entry.remove_entry();
            delivered.push((tx, voted));
        }
        for (tx, voted) in delivered {
            let mut commit = voted.snap;
            commit.strong = voted.ts;
            self.append(tx, voted.origin, &Arc::new(commit), &voted.writes);
            self.counters.strong_delivered += 1;
        }
        if watermark > self.partition.known.strong {
            self.partition.known.strong = watermark;
            self.wake_reads_on_remote();
        }
    }
}
