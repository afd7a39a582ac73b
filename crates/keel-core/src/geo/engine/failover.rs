//! The certification log's leadership and its replication (`docs/geo.md`, *Failover*):
//! Multi-Paxos for each partition's certification log, across its replicas in the data
//! centers.
//!
//! - **Ballots.** Ballot `b` is led by data center `leader_dc + b` (modulo the data
//!   centers); ballot 0 by `Config::leader_dc`, which leads from boot. A replica joins
//!   larger ballots only, and answers a smaller one's messages with `OUTVOTED`, which
//!   makes its sender step down.
//! - **Election.** A follower that suspects its leader's data center (silent for
//!   `suspect_after`) and is the first unsuspected data center after it in ballot order
//!   stands in that ballot: it sends `ELECT` with its durable index, and each sibling that
//!   joins answers `ELECTED` with the ballot of the leader its log follows and its records
//!   from there.
//! - **Recovery.** With a majority joined (itself included), the candidate takes the log
//!   of the sibling that follows the largest ballot, the longest of those: a durable
//!   record is stored at a majority, which meets every other majority, and the leader of
//!   a larger ballot held every record durable before it, so that log holds every durable
//!   record. The candidate leads: it re-indexes its votes, rebuilds their ballots, sends
//!   each follower the log from the follower's durable index (a follower drops what it
//!   had past that point at a new leader's first append), and once the recovered log is
//!   durable again sends its open votes out again.
//! - **The conflict index** (`open`, `outcomes`, `pending`, `committed`) follows the log:
//!   votes on a leader as they are appended, on a follower as they are applied;
//!   decisions on every replica as they are applied (until then a decided transaction
//!   still counts as pending, which only aborts conflicting transactions that could not
//!   have seen it yet). A leader that steps down takes its unapplied votes back out.
//!   A decision counts only durable votes, so every later leader reaches it too, and a
//!   new leader decides again the votes of its log with no decision after them.
//! - **Routing.** Every node keeps the largest ballot it knows a leader of each partition
//!   to lead (its own partition: its ballot; others: from the partitions of its data
//!   center by `KNOWNVEC_LOCAL`, which tell the ballot their log follows, and from votes;
//!   a candidate that dies before it leads so misleads no one); when
//!   one grows, a coordinator sends its waiting candidates to the new leader, and a
//!   leader its durable votes. A leader answers a candidate or a vote of a transaction it
//!   decided with the decision, so nothing waits on a vote its old leader sent once.

use super::super::types::{Body, Record, TxId};
use super::{Ballot, Election, GeoEngine, Joined, OpenVote, Outcome, Pending, Role};
use keel_types::NodeId;

impl GeoEngine {
    /// The data center that leads partition `p`'s ballot `ballot`.
    pub(crate) fn leader_dc_of(&self, p: u32, ballot: u64) -> u32 {
        let dcs = self.dcs as u64;
        let first = u64::from(self.config.leader_dc)
            + if self.config.spread_leaders { u64::from(p) % dcs } else { 0 };
        ((first + ballot % dcs) % dcs) as u32
    }

    /// The data center that leads this partition's ballot `ballot`.
    pub(crate) fn own_leader_dc(&self, ballot: u64) -> u32 {
        self.leader_dc_of(self.me.partition, ballot)
    }

    /// The replica this node believes leads partition `p`'s certification.
    pub(crate) fn leader_of_partition(&self, p: u32) -> NodeId {
        let ballot = if p == self.me.partition {
            self.certifier.ballot
        } else {
            self.certifier.views[p as usize]
        };
        self.replica(self.leader_dc_of(p, ballot), p)
    }

    /// Partition `p` (another one) is in `ballot` at least; whether that is news.
    pub(crate) fn learn_ballot(&mut self, p: u32, ballot: u64) -> bool {
        if p == self.me.partition || ballot <= self.certifier.views[p as usize] {
            return false;
        }
        self.certifier.views[p as usize] = ballot;
        self.leader_moved(p);
        true
    }

    /// Partition `p`'s leader changed: candidates waiting on it go to the new one, and so
    /// do this leader's durable votes of transactions that wait on it.
    fn leader_moved(&mut self, p: u32) {
        let waiting: Vec<(TxId, u64)> = self
            .coordinator
            .txs
            .iter()
            .filter_map(|(id, tx)| match &tx.pending {
                Pending::Certifying { waiting, expiry, .. } if waiting.contains(&p) => {
                    Some((*id, *expiry))
                }
                _ => None,
            })
            .collect();
        for (id, expiry) in waiting {
            self.counters.resent_to_new_leader += 1;
            self.send_candidate(id, p, expiry);
        }
        if !self.leads() || p == self.me.partition {
            return;
        }
        let me = self.me.partition;
        let votes: Vec<(TxId, bool, u64, Vec<u32>, u64)> = self
            .certifier
            .ballots
            .iter()
            .filter(|(_, b)| b.participants.contains(&p))
            .filter_map(|(id, b)| {
                let (ok, ts) = b.votes.get(&me)?;
                Some((*id, *ok, *ts, b.participants.clone(), b.expiry))
            })
            .collect();
        let to = self.leader_of_partition(p);
        let ballot = self.certifier.accepted;
        for (tx, ok, ts, participants, expiry) in votes {
            self.counters.resent_to_new_leader += 1;
            let answer = false;
            let body = Body::Vote { tx, ok, ts, participants, expiry, ballot, answer };
            self.send(to, body);
        }
    }

    /// A certification body for a leader, at a replica that does not lead: a candidate
    /// keeps it for when it leads; a follower drops it (its sender sends it again to
    /// the leader once it learns the new ballot).
    pub(crate) fn hold(&mut self, from: NodeId, body: Body) {
        if let Role::Candidate(election) = &mut self.certifier.role {
            election.held.push((from, body));
        }
    }

    /// Each broadcast period, on a follower: if its leader's data center is suspected
    /// and this one is the first unsuspected data center in ballot order after it, it
    /// stands for leader.
    pub(crate) fn elect_if_leader_suspected(&mut self) {
        if !self.config.strong || !matches!(self.certifier.role, Role::Follower) {
            return;
        }
        let ballot = self.certifier.ballot;
        let suspected = self.suspected();
        if !suspected.contains(&self.own_leader_dc(ballot)) {
            return;
        }
        // This data center is never suspected by itself, so the walk ends.
        let mut next = ballot + 1;
        while suspected.contains(&self.own_leader_dc(next)) {
            next += 1;
        }
        if self.own_leader_dc(next) == self.me.dc {
            self.stand(next);
        }
    }

    /// Stands for leader in `ballot`.
    fn stand(&mut self, ballot: u64) {
        debug_assert!(ballot > self.certifier.ballot, "a candidate in an old ballot");
        self.certifier.ballot = ballot;
        self.certifier.role = Role::Candidate(Election::default());
        self.counters.elections += 1;
        self.leader_moved(self.me.partition);
        if self.config.f == 0 {
            return self.take_over();
        }
        let from = self.certifier.durable;
        let me = self.me;
        for dc in (0..self.dcs as u32).filter(|&dc| dc != me.dc) {
            let to = self.replica(dc, me.partition);
            self.send(to, Body::Elect { ballot, from });
        }
    }

    /// `ELECT` at a sibling: it joins a larger ballot (or answers its own again) with its
    /// log from the candidate's durable index; a smaller ballot is outvoted.
    pub(crate) fn elect_in(&mut self, from: NodeId, ballot: u64, index: u64) {
        let c = &self.certifier;
        if ballot < c.ballot {
            let ballot = c.ballot;
            self.send(from, Body::Outvoted { ballot });
            return;
        }
        if ballot > c.ballot {
            self.step_down(ballot);
        }
        let c = &self.certifier;
        let end = self.log_end();
        let first = index.max(c.base).min(end);
        let records = c.log.range((first - c.base) as usize..).cloned().collect();
        let (accepted, durable) = (c.accepted, c.durable);
        self.send(from, Body::Elected { ballot, accepted, durable, first, records });
    }

    /// `ELECTED` at a candidate (or at the leader it became, from a late sibling).
    pub(crate) fn elected_in(&mut self, from: NodeId, ballot: u64, joined: Joined) {
        let Some(member) = self.member(from) else { return };
        if ballot != self.certifier.ballot {
            return;
        }
        let end = self.log_end();
        let base = self.certifier.base;
        match &mut self.certifier.role {
            Role::Candidate(election) => {
                election.joined.insert(member.dc, joined);
                if election.joined.len() >= self.config.f as usize {
                    self.take_over();
                }
            }
            Role::Leader => {
                let slot = &mut self.certifier.sent[member.dc as usize];
                if slot.is_none() {
                    *slot = Some(joined.durable.max(base).min(end));
                }
            }
            Role::Follower => {}
        }
    }

    /// The candidate won: it recovers the log, re-indexes it, rebuilds its ballots and
    /// leads.
    fn take_over(&mut self) {
        let Role::Candidate(election) = std::mem::take(&mut self.certifier.role) else {
            unreachable!("only a candidate takes over")
        };
        let Election { joined, held } = election;
        if !self.recover(&joined) {
            // The best log does not meet this one's: it is not safe to lead with either.
            self.counters.rejected += 1;
            self.certifier.role = Role::Candidate(Election { joined, held });
            return;
        }
        let end = self.log_end();
        let c = &mut self.certifier;
        c.role = Role::Leader;
        c.accepted = c.ballot;
        c.acked.iter_mut().for_each(|a| *a = 0);
        c.told.iter_mut().for_each(|t| *t = 0);
        let base = c.base;
        for (dc, sent) in c.sent.iter_mut().enumerate() {
            *sent = joined.get(&(dc as u32)).map(|j| j.durable.max(base).min(end));
        }
        // The votes past the applied prefix go into the conflict index; the decisions
        // there are the leader's to apply.
        let mut at = c.indexed;
        while at < end {
            let record = self.certifier.log[(at - base) as usize].clone();
            self.index_record(&record);
            if let Record::Decide { tx, commit, ts } = record {
                self.certifier.deciding.insert(tx, (commit, ts));
            }
            at += 1;
        }
        let c = &mut self.certifier;
        c.indexed = end;
        c.last_proposal = c.last_proposal.max(c.top);
        for (id, open) in c.open.iter().filter(|(id, _)| !c.deciding.contains_key(id)) {
            let ballot = Ballot {
                participants: open.participants.clone(),
                expiry: open.expiry,
                votes: Default::default(),
                mine: Some((open.ok, open.ts)),
            };
            c.ballots.insert(*id, ballot);
        }
        let recovered =
            c.ballots.iter().map(|(id, b)| (*id, b.participants.clone(), b.expiry)).collect();
        c.reannounce = Some((end, recovered));
        self.counters.takeovers += 1;
        self.apply_durable();
        self.maybe_reannounce();
        for (from, body) in held {
            self.handle(from, body);
        }
    }

    /// Recovery: this candidate's log becomes the log, among its own and those of the
    /// siblings that joined, that follows the largest ballot, the longest of those; the
    /// durable index, the largest any of them knew. False if that log's records start
    /// past this one's end or below what it applied.
    fn recover(&mut self, joined: &std::collections::BTreeMap<u32, Joined>) -> bool {
        if self.config.unsafe_skip_recovery {
            return true;
        }
        let end = self.log_end();
        let c = &self.certifier;
        let mine = (c.accepted, end);
        let end_of = |j: &Joined| j.first.saturating_add(j.records.len() as u64);
        let best = joined
            .values()
            .filter(|j| (j.accepted, end_of(j)) > mine)
            .max_by_key(|j| (j.accepted, end_of(j)));
        let durable = joined.values().map(|j| j.durable).max().unwrap_or(0).max(c.durable);
        if let Some(best) = best {
            if best.first > end || best.first < c.applied {
                return false;
            }
            let c = &mut self.certifier;
            while c.base + (c.log.len() as u64) > best.first {
                c.log.pop_back();
            }
            for record in best.records.iter().cloned() {
                self.store_record(record);
            }
        }
        let end = self.log_end();
        self.certifier.durable = durable.min(end);
        true
    }

    /// Joins the larger ballot `ballot`: a leader takes its unapplied votes out of the
    /// conflict index and forgets its ballots; a candidate gives up.
    pub(crate) fn step_down(&mut self, ballot: u64) {
        debug_assert!(ballot > self.certifier.ballot, "stepping down to an old ballot");
        self.certifier.ballot = ballot;
        match std::mem::take(&mut self.certifier.role) {
            Role::Leader => {
                self.unindex_tail();
                let c = &mut self.certifier;
                c.ballots.clear();
                c.expiries.clear();
                c.deciding.clear();
                c.reannounce = None;
                c.acked.iter_mut().for_each(|a| *a = 0);
                c.sent.iter_mut().for_each(|s| *s = None);
                c.told.iter_mut().for_each(|t| *t = 0);
                self.counters.stepped_down += 1;
            }
            Role::Candidate(_) => self.counters.stepped_down += 1,
            Role::Follower => {}
        }
        self.leader_moved(self.me.partition);
    }

    /// A sibling joined `ballot`: a replica in a smaller one joins it too. A replica that
    /// missed an election (cut off while it ran) so learns of it from any sibling, and
    /// once it suspects that ballot's leader it elects past it, rather than follow, for
    /// ever, a leader that stepped down.
    pub(crate) fn join_larger_ballot(&mut self, ballot: u64) {
        if self.config.strong && ballot > self.certifier.ballot {
            self.step_down(ballot);
        }
    }

    /// `OUTVOTED`: a sibling is in a larger ballot.
    pub(crate) fn outvoted(&mut self, ballot: u64) {
        if ballot > self.certifier.ballot {
            self.step_down(ballot);
        }
    }

    /// Sibling: the leader's records from `first` on, its durable index and what every
    /// data center stores. The first append of a new leader replaces what this log held
    /// past `first` (never what it applied).
    pub(crate) fn append_in(
        &mut self,
        from: NodeId,
        ballot: u64,
        first: u64,
        records: Vec<super::super::types::Record>,
        durable: u64,
        everywhere: u64,
    ) {
        if ballot < self.certifier.ballot {
            let ballot = self.certifier.ballot;
            self.send(from, Body::Outvoted { ballot });
            return;
        }
        if ballot > self.certifier.ballot || !matches!(self.certifier.role, Role::Follower) {
            self.step_down(ballot);
        }
        let end = self.log_end();
        let c = &mut self.certifier;
        if ballot != c.accepted {
            if first > end || first < c.applied {
                let through = c.durable;
                self.send(from, Body::Appended { ballot, through, ok: false });
                return;
            }
            while c.base + (c.log.len() as u64) > first {
                c.log.pop_back();
            }
            c.accepted = ballot;
        } else if first > end {
            // A gap: the channel delivers in order, so the leader lost track of this log.
            self.send(from, Body::Appended { ballot, through: end, ok: false });
            return;
        }
        let skip = (self.log_end() - first) as usize;
        for record in records.into_iter().skip(skip) {
            self.store_record(record);
        }
        let end = self.log_end();
        let c = &mut self.certifier;
        c.durable = c.durable.max(durable.min(end));
        c.everywhere = c.everywhere.max(everywhere.min(end));
        self.apply_durable();
        self.trim_log();
        self.send(from, Body::Appended { ballot, through: end, ok: true });
    }

    /// Leader: sibling `from` stores this leader's log below `through`, or needs it from
    /// `through` on.
    pub(crate) fn appended(&mut self, from: NodeId, ballot: u64, through: u64, ok: bool) {
        if ballot > self.certifier.ballot {
            return self.step_down(ballot);
        }
        let Some(member) = self.member(from) else { return };
        if !self.leads() || ballot != self.certifier.ballot {
            return;
        }
        let i = member.dc as usize;
        let (base, end) = (self.certifier.base, self.log_end());
        let c = &mut self.certifier;
        if !ok {
            if through < base || through > end {
                // It needs records every data center stored, which it cannot have lost.
                self.counters.rejected += 1;
                c.sent[i] = None;
            } else {
                c.sent[i] = Some(through);
            }
            return;
        }
        let Some(sent) = c.sent[i] else { return };
        let c = &mut self.certifier;
        c.acked[i] = c.acked[i].max(through.min(sent));
        self.advance_durable();
        self.trim_log();
    }

    /// Leader: each sibling's missing records and the durable index, if either moved.
    pub(crate) fn replicate_log(&mut self) {
        let end = self.log_end();
        let (durable, ballot) = (self.certifier.durable, self.certifier.ballot);
        let everywhere = self.everywhere();
        let me = self.me.dc;
        for dc in (0..self.dcs as u32).filter(|&i| i != me) {
            let i = dc as usize;
            let Some(sent) = self.certifier.sent[i] else { continue };
            if sent == end && self.certifier.told[i] == durable {
                continue;
            }
            let base = self.certifier.base;
            let records: Vec<Record> =
                self.certifier.log.range((sent - base) as usize..).cloned().collect();
            let to = self.replica(dc, self.me.partition);
            let first = sent;
            self.send(to, Body::Append { ballot, first, records, durable, everywhere });
            self.certifier.sent[i] = Some(end);
            self.certifier.told[i] = durable;
        }
    }

    /// Leader: the log length every sibling acknowledged in this ballot (a removed data
    /// center's is needed by nobody).
    fn everywhere(&self) -> u64 {
        let me = self.me.dc as usize;
        let c = &self.certifier;
        let others = c.acked.iter().enumerate().filter(|(i, _)| *i != me && !self.removed[*i]);
        let acked = others.map(|(_, a)| *a);
        acked.min().unwrap_or_else(|| self.log_end())
    }

    /// Forgets the records this replica applied that every data center stores.
    pub(crate) fn trim_log(&mut self) {
        let everywhere = match self.certifier.role {
            Role::Leader => self.everywhere(),
            Role::Follower => self.certifier.everywhere,
            Role::Candidate(_) => return,
        };
        let c = &mut self.certifier;
        let below = c.applied.min(everywhere);
        while c.base < below {
            c.log.pop_front();
            c.base += 1;
        }
    }

    /// Stores `record` at the end of the log.
    pub(crate) fn store_record(&mut self, record: Record) {
        let ts = match &record {
            Record::Vote { ts, .. } | Record::Decide { ts, .. } | Record::Promise { ts } => *ts,
            Record::Forget { .. } => 0,
        };
        let c = &mut self.certifier;
        c.top = c.top.max(ts);
        c.log.push_back(record);
    }

    /// Adds the record at `indexed`, if a vote, to the conflict index (a vote of a
    /// transaction decided or voted already adds nothing); if a `Forget`, raises the
    /// horizon below which no vote to come commits.
    pub(crate) fn index_record(&mut self, record: &Record) {
        let c = &mut self.certifier;
        match record {
            Record::Vote { candidate, ok, ts } => {
                let id = candidate.tx;
                if c.outcomes.contains_key(&id) || c.open.contains_key(&id) {
                    return;
                }
                if *ok && candidate.updates {
                    for key in &candidate.keys {
                        let label = candidate.label.clone();
                        c.pending.entry(key.clone()).or_default().insert(id, label);
                    }
                }
                let open = OpenVote {
                    ok: *ok,
                    ts: *ts,
                    label: candidate.label.clone(),
                    keys: candidate.keys.clone(),
                    updates: candidate.updates,
                    snap: candidate.snap.clone(),
                    participants: candidate.participants.clone(),
                    expiry: candidate.expiry,
                };
                c.open.insert(id, open);
            }
            Record::Forget { below } => c.forgetting = c.forgetting.max(*below),
            Record::Decide { .. } | Record::Promise { .. } => {}
        }
    }

    /// Applies the record being applied, if a decision, to the conflict index; if a
    /// `Forget`, forgets the outcomes it covers.
    pub(crate) fn index_decision(&mut self, record: &Record) {
        let me = self.me.partition;
        let c = &mut self.certifier;
        match record {
            Record::Forget { below } => self.forget(*below),
            Record::Decide { tx, commit, ts } => {
                c.deciding.remove(tx);
                let mut remembered = None;
                if let Some(open) = c.open.remove(tx) {
                    let unsettled = match commit {
                        true => open.participants.iter().copied().filter(|&p| p != me).collect(),
                        false => Vec::new(),
                    };
                    remembered = Some((open.expiry, unsettled));
                    if open.ok && open.updates {
                        for key in &open.keys {
                            unpend(&mut c.pending, key, tx);
                            if *commit {
                                let mut vector = open.snap.clone();
                                vector.strong = *ts;
                                let by_label = c.committed.entry(key.clone()).or_default();
                                match by_label.get_mut(&open.label) {
                                    Some(joined) => joined.join(&vector),
                                    None => {
                                        by_label.insert(open.label.clone(), vector);
                                    }
                                }
                            }
                        }
                    }
                }
                // A decision whose vote this replica never indexed (only a leader that
                // broke the protocol logs one) is remembered until the next `Forget`.
                if remembered.is_some() || !c.outcomes.contains_key(tx) {
                    let (expiry, unsettled) = remembered.unwrap_or_default();
                    let outcome = Outcome { commit: *commit, ts: *ts, expiry, unsettled };
                    if let Some(old) = c.outcomes.insert(*tx, outcome) {
                        c.remembered.remove(&(old.expiry, *tx));
                    }
                    c.remembered.insert((expiry, *tx));
                }
            }
            Record::Vote { .. } | Record::Promise { .. } => {}
        }
    }

    /// A leader stepping down: the votes it logged past what it applied may not survive,
    /// so they leave the conflict index (its decisions there were never in it).
    fn unindex_tail(&mut self) {
        let c = &mut self.certifier;
        for at in c.applied..c.indexed {
            let Record::Vote { candidate, .. } = &c.log[(at - c.base) as usize] else {
                continue;
            };
            let id = candidate.tx;
            if let Some(open) = c.open.remove(&id) {
                for key in open.keys.iter().filter(|_| open.ok && open.updates) {
                    unpend(&mut c.pending, key, &id);
                }
            }
        }
        c.indexed = c.applied;
        c.forgetting = c.forgotten;
    }

    /// A new leader: once the recovered log is durable again, the votes it recovered
    /// with no decision go out again, to the coordinators and the other participants'
    /// leaders (not the votes it cast since, which go out as each becomes durable). Of
    /// those decided since (with another participant's vote that reached it), the
    /// decision goes out instead: a participant whose leader sent its vote once, to this
    /// one, still waits for this partition's.
    pub(crate) fn maybe_reannounce(&mut self) {
        let recovered = match self.certifier.reannounce.take() {
            Some((end, recovered)) if self.certifier.durable >= end => recovered,
            waiting => {
                self.certifier.reannounce = waiting;
                return;
            }
        };
        for (id, participants, expiry) in recovered {
            let c = &self.certifier;
            let vote = match c.ballots.contains_key(&id) {
                true => c.open.get(&id).map(|o| (o.ok, o.ts, false)),
                false => c.outcome(id).map(|(commit, ts)| (commit, ts, true)),
            };
            let Some((ok, ts, answer)) = vote else { continue };
            if answer {
                self.counters.decisions_reannounced += 1;
            }
            self.send_vote(id, ok, ts, participants, expiry, answer);
        }
    }
}

/// Takes `tx` out of `key`'s pending transactions.
fn unpend(
    pending: &mut std::collections::BTreeMap<
        keel_types::Key,
        std::collections::BTreeMap<TxId, Option<String>>,
    >,
    key: &keel_types::Key,
    tx: &TxId,
) {
    if let Some(txs) = pending.get_mut(key) {
        txs.remove(tx);
        if txs.is_empty() {
            pending.remove(key);
        }
    }
}
