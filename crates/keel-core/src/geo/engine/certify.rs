//! Strong transactions (Algorithm 3; §6.2–6.3 of the paper; `docs/geo.md`, *Strong
//! transactions*).
//!
//! - **Coordinator.** A strong transaction runs like a causal one. Its commit first
//!   waits for its snapshot's local entry to be uniform (3:2), then sends its part at
//!   each partition it touched to that partition's certification leader, and waits for
//!   their durable votes: it commits, at the largest proposed strong timestamp, if all
//!   vote commit.
//! - **Leader** (the partition's replica in the data center of its ballot,
//!   `failover.rs`). It votes commit if no
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
use super::{Ballot, GeoEngine, Pending, Role, Voted};
use crate::engine::RequestTag;
use keel_types::KeelError;
use std::sync::Arc;

/// A `VOTE` body's fields.
#[derive(Clone, Debug)]
pub(crate) struct VoteIn {
    pub tx: TxId,
    pub ok: bool,
    pub ts: u64,
    pub participants: Vec<u32>,
    pub expiry: u64,
    pub ballot: u64,
    pub answer: bool,
}

impl VoteIn {
    fn body(self) -> Body {
        let VoteIn { tx, ok, ts, participants, expiry, ballot, answer } = self;
        Body::Vote { tx, ok, ts, participants, expiry, ballot, answer }
    }
}

impl GeoEngine {
    /// Whether this replica leads its partition's certification (in a keyspace that
    /// serves strong transactions).
    pub(crate) fn leads(&self) -> bool {
        matches!(self.certifier.role, Role::Leader)
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
        self.counters.certifying += 1;
        let participants = self.participants(id);
        let tx = self.coordinator.txs.get_mut(&id).expect("certifying an open transaction");
        let waiting = participants.iter().copied().collect();
        tx.pending = Pending::Certifying { tag, waiting, ts: 0, expiry };
        for p in participants {
            self.send_candidate(id, p, expiry);
        }
    }

    /// The partitions that vote on open strong transaction `id`: those it touched, and
    /// with a central certifier, partition 0.
    fn participants(&self, id: TxId) -> Vec<u32> {
        let tx = &self.coordinator.txs[&id];
        let mut participants: Vec<u32> = tx.keys.keys().copied().collect();
        if self.config.central_certifier && participants.first() != Some(&0) {
            participants.insert(0, 0);
        }
        participants
    }

    /// Sends open strong transaction `id`'s part at partition `p` to that partition's
    /// leader (as this node knows it): the keys it read or updated there (with a central
    /// certifier, partition 0's part has every key) and its updates there.
    pub(crate) fn send_candidate(&mut self, id: TxId, p: u32, expiry: u64) {
        let participants = self.participants(id);
        let tx = &self.coordinator.txs[&id];
        let keys = if self.config.central_certifier && p == 0 {
            tx.keys.values().flatten().cloned().collect()
        } else {
            tx.keys.get(&p).into_iter().flatten().cloned().collect()
        };
        let candidate = Candidate {
            tx: id,
            origin: self.me.dc,
            label: tx.strong.clone().flatten(),
            keys,
            writes: tx.writes.get(&p).cloned().unwrap_or_default(),
            updates: !tx.writes.is_empty(),
            snap: tx.snap.clone(),
            participants,
            expiry,
        };
        let to = self.leader_of_partition(p);
        self.send(to, Body::Certify(Box::new(candidate)));
    }

    /// A participant's durable vote, at the coordinator: an abort ends the transaction at
    /// once; the last commit vote commits it.
    fn coordinator_vote(&mut self, partition: u32, id: TxId, ok: bool, ts: u64) {
        let Some(tx) = self.coordinator.txs.get_mut(&id) else { return };
        let Pending::Certifying { tag, waiting, ts: top, .. } = &mut tx.pending else { return };
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
    pub(crate) fn vote_in(&mut self, from: keel_types::NodeId, vote: VoteIn) {
        let Some(member) = self.member(from) else { return };
        self.learn_ballot(member.partition, vote.ballot);
        if vote.tx.node == self.me.node.0 {
            self.coordinator_vote(member.partition, vote.tx, vote.ok, vote.ts);
        }
        if from != self.me.node && vote.participants.contains(&self.me.partition) {
            if self.leads() {
                self.leader_vote(from, member.partition, vote);
            } else {
                self.hold(from, vote.body());
            }
        }
    }

    /// Another participant's durable vote, at this leader.
    fn leader_vote(&mut self, from: keel_types::NodeId, partition: u32, vote: VoteIn) {
        let VoteIn { tx: id, ok, ts, participants, expiry, answer, .. } = vote;
        let past = self.clock() > expiry;
        if let Some((commit, final_ts)) = self.certifier.outcome(id) {
            // Decided here: a sender that still votes lacks this partition's vote (it is
            // a new leader); the decision answers for it.
            if !answer {
                self.counters.resent_to_new_leader += 1;
                let ballot = self.certifier.accepted;
                let body = Body::Vote {
                    tx: id,
                    ok: commit,
                    ts: final_ts,
                    participants,
                    expiry,
                    ballot,
                    answer: true,
                };
                self.send(from, body);
            }
            return;
        }
        if self.answer_forgotten(from, id, expiry, answer) {
            return;
        }
        let c = &mut self.certifier;
        match c.ballots.get_mut(&id) {
            Some(ballot) => {
                ballot.votes.insert(partition, (ok, ts));
            }
            // To be aborted when its candidate comes.
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

    /// `CERTIFY` at this partition's leader: the vote, appended to the log. A candidate
    /// voted on already (sent again to a new leader) gets the vote again, or the
    /// decision.
    pub(crate) fn certify_here(&mut self, from: keel_types::NodeId, candidate: Candidate) {
        if !self.leads() {
            return self.hold(from, Body::Certify(Box::new(candidate)));
        }
        let id = candidate.tx;
        if self.answer_forgotten(from, id, candidate.expiry, false) {
            return;
        }
        let me = self.me.partition;
        let known = match self.certifier.outcome(id) {
            Some((commit, ts)) => Some(Some((commit, ts))),
            None => match self.certifier.ballots.get(&id) {
                Some(b) if b.mine.is_some() => Some(b.votes.get(&me).copied()),
                _ => None,
            },
        };
        if let Some(vote) = known {
            if let Some((ok, ts)) = vote {
                self.counters.resent_to_new_leader += 1;
                let ballot = self.certifier.accepted;
                let participants = candidate.participants;
                let expiry = candidate.expiry;
                let answer = true;
                let body = Body::Vote { tx: id, ok, ts, participants, expiry, ballot, answer };
                self.send(from, body);
            }
            return;
        }
        let clock = self.clock();
        let told_abort =
            self.certifier.ballots.get(&id).is_some_and(|b| b.votes.values().any(|(ok, _)| !ok));
        // With a central certifier, only partition 0 judges conflicts.
        let judges = !self.config.central_certifier || self.me.partition == 0;
        // Below a `Forget` horizon, only aborts (`settle.rs`).
        let ok = !told_abort
            && clock <= candidate.expiry
            && candidate.expiry > self.certifier.forgetting
            && (self.config.unsafe_certify_all || !judges || !self.conflicts(&candidate));
        let ts = if ok { self.propose(&candidate.snap) } else { 0 };
        let c = &mut self.certifier;
        let ballot = c.ballots.entry(id).or_default();
        c.expiries.remove(&(ballot.expiry, id));
        ballot.participants.clone_from(&candidate.participants);
        ballot.expiry = candidate.expiry;
        ballot.mine = Some((ok, ts));
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

    /// Decides `id` once this partition's own vote is durable and some vote is abort or
    /// every participant's is in, and forgets its ballot. Every vote counted is durable,
    /// so the decision is one every later leader reaches too, logged or not.
    pub(crate) fn try_decide(&mut self, id: TxId) {
        let c = &mut self.certifier;
        let Some(ballot) = c.ballots.get(&id) else { return };
        if !ballot.votes.contains_key(&self.me.partition) {
            return;
        }
        let aborted = ballot.votes.values().any(|(ok, _)| !ok);
        let all_in = ballot.participants.iter().all(|p| ballot.votes.contains_key(p));
        if !aborted && !all_in {
            return;
        }
        let ballot = c.ballots.remove(&id).expect("looked up");
        c.expiries.remove(&(ballot.expiry, id));
        let commit = !aborted;
        let ts =
            if commit { ballot.votes.values().map(|(_, ts)| *ts).max().unwrap_or(0) } else { 0 };
        c.deciding.insert(id, (commit, ts));
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
            self.certify_here(self.me.node, candidate);
        }
    }

    /// Appends `record` to this leader's log and its conflict index.
    pub(crate) fn append_record(&mut self, record: Record) {
        debug_assert_eq!(self.certifier.indexed, self.log_end(), "a leader indexes its log");
        self.index_record(&record);
        self.certifier.indexed += 1;
        self.store_record(record);
        self.advance_durable();
    }

    /// The log's length.
    pub(crate) fn log_end(&self) -> u64 {
        self.certifier.base + self.certifier.log.len() as u64
    }

    /// Leader: the durable index is the largest stored at `f + 1` data centers (this one
    /// and the `f` best siblings); newly durable votes go out, and the delivery state
    /// follows.
    pub(crate) fn advance_durable(&mut self) {
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
            self.maybe_reannounce();
            return;
        }
        self.certifier.durable = durable;
        for i in from..durable {
            let at = (i - self.certifier.base) as usize;
            if let Record::Vote { candidate, ok, ts } = &self.certifier.log[at] {
                let (id, ok, ts) = (candidate.tx, *ok, *ts);
                let (participants, expiry) = (candidate.participants.clone(), candidate.expiry);
                self.send_vote(id, ok, ts, participants, expiry, false);
            }
        }
        self.apply_durable();
        self.maybe_reannounce();
    }

    /// A durable vote of this partition (`answer`: its decision): to the coordinator and
    /// the other participants' leaders, and into this leader's own ballot.
    pub(crate) fn send_vote(
        &mut self,
        id: TxId,
        ok: bool,
        ts: u64,
        participants: Vec<u32>,
        expiry: u64,
        answer: bool,
    ) {
        let me = self.me.partition;
        let ballot = self.certifier.accepted;
        let coordinator = keel_types::NodeId(id.node);
        let vote = |participants: &Vec<u32>| Body::Vote {
            tx: id,
            ok,
            ts,
            participants: participants.clone(),
            expiry,
            ballot,
            answer,
        };
        if self.member(coordinator).is_some() {
            self.send(coordinator, vote(&participants));
        }
        for &p in participants.iter().filter(|&&p| p != me) {
            let to = self.leader_of_partition(p);
            if to != coordinator {
                self.send(to, vote(&participants));
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

    /// Applies the durable records not yet applied to the delivery state (and, on a
    /// follower, to the conflict index), then delivers.
    pub(crate) fn apply_durable(&mut self) {
        while self.certifier.applied < self.certifier.durable {
            let at = (self.certifier.applied - self.certifier.base) as usize;
            let record = self.certifier.log[at].clone();
            if self.certifier.indexed == self.certifier.applied {
                self.index_record(&record);
                self.certifier.indexed += 1;
            }
            self.index_decision(&record);
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
            Record::Forget { .. } => {}
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
