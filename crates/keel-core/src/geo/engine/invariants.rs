//! `check_invariants`: what the engine's code relies on, checked after every step.

use super::super::types::PARTITION_BITS;
use super::{GeoEngine, Pending, Role};
use keel_types::NodeId;
use std::collections::BTreeSet;

impl GeoEngine {
    /// Panics if a rule of `docs/geo.md` (*Invariants*) is broken.
    pub fn check_invariants(&self) {
        self.check_partition();
        self.check_uniformity();
        self.check_coordinator();
        self.check_certifier();
        self.check_removed();
        self.check_agreement();
        assert!(
            self.catch_up.is_none() || self.joining.is_none() && !self.is_removed(),
            "a replica that is not back holds sessions for a catch-up"
        );
        for (peer, channel) in &self.channels {
            channel.check(*peer);
        }
    }

    /// A removed data center's members get only their notice, and nothing is forwarded
    /// to them (a replica whose own data center was removed keeps nothing but refusals
    /// and its last word to the members of the data centers not removed).
    fn check_removed(&self) {
        if self.is_removed() {
            for (&peer, channel) in &self.channels {
                let live = self.member(peer).is_some_and(|m| !self.removed[m.dc as usize]);
                assert!(
                    live && channel.is_notice() && !self.lost,
                    "a removed replica keeps a channel to {peer} other than its last word"
                );
            }
            assert!(self.coordinator.txs.is_empty(), "a removed replica keeps transactions");
            return;
        }
        for i in 0..self.dcs {
            let (epoch, returning) = (self.epochs[i], self.returning[i]);
            assert!(epoch <= 2 * super::remove::LIVES_MAX + 1, "data center {i} at epoch {epoch}");
            assert!(
                !returning || (epoch > 0 && epoch.is_multiple_of(2)),
                "{i} returning at {epoch}"
            );
            // Until it is back, a returning data center counts as removed, except at its
            // own new replicas.
            let own_join = i == self.me.dc as usize && self.joining.is_some();
            let removed = (epoch % 2 == 1 || returning) && !own_join;
            assert_eq!(self.removed[i], removed, "data center {i} removed out of its epoch");
        }
        let removed = (0..self.dcs).filter(|&i| self.removed[i] && !self.returning[i]);
        let nodes: BTreeSet<NodeId> =
            removed.flat_map(|i| self.replicas[i].iter().copied()).collect();
        assert_eq!(nodes, self.removed_nodes, "removed members out of step");
        for node in self.removed_nodes.iter().filter(|_| self.joining.is_none()) {
            let notice = self.channels.get(node).is_some_and(|c| c.is_notice());
            assert!(notice, "{node} is removed, but its channel is not its notice");
        }
        self.check_back();
        for &(i, _) in self.uniformity.forwarded.keys() {
            assert!(!self.removed[i as usize], "forwarding to removed data center {i}");
        }
    }

    /// A return under way (`back.rs`): a survivor welcomes each returning data center
    /// once, reports no more of its old life than it answered until the cut, and after
    /// the cut nothing of the old life above it is held or stable; a joining replica
    /// holds no data and hears only joined members of its own data center.
    fn check_back(&self) {
        let d = self.me.dc as usize;
        for r in 0..self.dcs {
            let w = self.welcomes[r].as_ref();
            let survivor_side = self.returning[r] && r != d;
            assert_eq!(w.is_some(), survivor_side, "data center {r}: a welcome out of its return");
            if let Some(w) = w {
                assert_eq!(w.epoch, self.epochs[r], "data center {r}: a welcome of another epoch");
                assert!(w.cut.is_some() || !w.settled, "data center {r}: settled before the cut");
                let row = self.uniformity.local[self.me.partition as usize].dcs[r];
                assert!(
                    w.cut.is_some() || row <= w.stored,
                    "data center {r}: the row reported past the answer before the cut"
                );
            }
            let limits = &self.limits[r];
            assert!(limits.len() <= super::remove::LIVES_MAX as usize, "data center {r}: limits");
            assert!(limits.windows(2).all(|w| w[0].epoch < w[1].epoch), "limits out of order");
            let p = &self.partition;
            let stable = self.uniformity.stable.dcs[r];
            let top = p.remote_commits[r].last_key_value().map_or(0, |(&ts, _)| ts);
            for limit in limits {
                assert!(
                    !limit.loses(stable),
                    "data center {r}: stable entry {stable} past {limit:?}"
                );
                let known = p.known.dcs[r];
                assert!(!limit.loses(known), "data center {r}: known entry {known} past {limit:?}");
                assert!(!limit.loses(top), "data center {r}: an old-life transaction above a cut");
            }
        }
        for node in self.joined.keys() {
            let dc = self.member(*node).expect("a member joined").dc as usize;
            let own = dc == d && self.joining.is_some();
            let back = self.epochs[dc] >= 2 && !self.removed[dc];
            assert!(self.returning[dc] || own || back, "{node} heard as joined, out of a return");
        }
        for (r, sending) in self.sending.iter().enumerate() {
            let settled = self.welcomes[r].as_ref().is_some_and(|w| w.settled && w.copy.is_none());
            assert!(sending.is_none() || settled, "data center {r}: a copy sent unsettled");
        }
        if let Some(j) = &self.joining {
            let p = &self.partition;
            assert!(p.log.is_empty() && p.local_commits.is_empty(), "a joining replica holds data");
            assert!(self.coordinator.txs.is_empty(), "a joining replica runs transactions");
            assert_eq!(j.epoch.is_some(), self.returning[d], "a join out of its return");
            assert!(j.epoch.is_some() || j.held.is_empty(), "held before the return");
            assert!(self.me.partition == 0 || j.partials.is_empty(), "partials off partition 0");
            assert!(j.partials.len() <= self.partitions as usize, "partials of unknown partitions");
            assert!(j.source.is_none() || j.cut.is_some(), "a copy asked before the cut");
            assert!(j.source.is_some() || j.chunks.is_empty(), "a copy taken unasked");
        }
    }

    fn check_partition(&self) {
        let p = &self.partition;
        let d = self.me.dc as usize;
        assert!(p.known.dcs[d] <= self.clock(), "known[d] ahead of the clock");
        if let Some(&(ts, _)) = p.prepared_ts.first() {
            assert!(p.known.dcs[d] < ts, "known[d] reaches a prepared transaction's timestamp");
        }
        assert_eq!(p.prepared.len(), p.prepared_ts.len(), "prepared index out of step");
        for (ts, tx) in p.commit_waits.keys() {
            let prepared = p.prepared.get(tx).expect("a waiting commit is prepared");
            assert!(*ts >= prepared.ts, "a commit timestamp below its prepare timestamp");
            assert!(prepared.committing, "a waiting commit not marked");
        }
        let marked = p.prepared.values().filter(|t| t.committing).count();
        assert_eq!(marked, p.commit_waits.len(), "a commit marked but not waiting");
        assert!(
            p.last_ts & ((1 << PARTITION_BITS) - 1) == u64::from(self.me.partition)
                || p.last_ts == 0,
            "a timestamp not of this partition"
        );
        for (&ts, tx) in &p.local_commits {
            assert_eq!(tx.commit.dcs[d], ts, "a local commit filed under another timestamp");
        }
        for (j, commits) in p.remote_commits.iter().enumerate() {
            if let Some((&ts, _)) = commits.last_key_value() {
                assert!(ts <= p.known.dcs[j], "a remote transaction above known[{j}]");
            }
        }
        for (&(ts, _), wait) in &p.waiting {
            assert!(
                ts == u64::MAX || ts > p.known.dcs[d],
                "a read waits on a timestamp already stored"
            );
            assert!(!wait.snap.le(&p.known), "a read waits on a snapshot already stored");
        }
    }

    fn check_uniformity(&self) {
        let u = &self.uniformity;
        let d = self.me.dc as usize;
        assert!(u.stable.le(&self.partition.known), "stable above this partition's known");
        assert_eq!(u.stable_matrix[d], u.stable, "this data center's row is its stable vector");
        for j in 0..self.dcs {
            assert!(u.uniform.dcs[j] <= u.stable.dcs[j], "uniform[{j}] above what is stored here");
        }
    }

    fn check_coordinator(&self) {
        let c = &self.coordinator;
        assert_eq!(c.txs.len(), c.deadlines.len(), "a deadline per transaction");
        for (session, id) in &c.sessions {
            let tx = c.txs.get(id).expect("a session's transaction is open");
            assert_eq!(tx.session, *session, "session index out of step");
        }
        for (id, tx) in &c.txs {
            // A commit answered with a time-out goes on without its session.
            let orphan = matches!(
                tx.pending,
                Pending::Committing { tag: None, .. }
                    | Pending::Uniforming { tag: None }
                    | Pending::Certifying { tag: None, .. }
            );
            if !orphan {
                assert_eq!(c.sessions.get(&tx.session), Some(id), "session index out of step");
            }
            assert!(c.deadlines.contains(&(tx.deadline, *id)), "deadline index out of step");
        }
        for id in c.reads.values() {
            assert!(c.txs.contains_key(id), "a read of a closed transaction");
        }
        let d = self.me.dc as usize;
        if let Some(((need, _), _)) = c.barriers.first_key_value() {
            assert!(*need > self.uniformity.uniform.dcs[d], "a satisfied barrier still waits");
        }
        if let Some((need, _)) = c.certify_waits.first() {
            assert!(*need > self.uniformity.uniform.dcs[d], "a satisfied certify wait");
        }
        let uniforming = c.txs.values().filter(|t| matches!(t.pending, Pending::Uniforming { .. }));
        assert_eq!(uniforming.count(), c.certify_waits.len(), "certify waits out of step");
        for (need, id) in &c.certify_waits {
            let tx = c.txs.get(id).expect("a certify wait has its transaction");
            assert!(matches!(tx.pending, Pending::Uniforming { .. }), "a wait not uniforming");
            assert_eq!(tx.snap.dcs[d], *need, "a certify wait on another entry");
            assert!(tx.strong.is_some(), "a causal transaction waits for certification");
        }
    }

    /// The certification log, the delivery state and (on a leader) the ballots and the
    /// conflict index.
    fn check_certifier(&self) {
        let c = &self.certifier;
        let end = self.log_end();
        assert!(c.base <= c.applied && c.applied <= c.durable && c.durable <= end, "log indexes");
        assert_eq!(c.undecided.len(), c.undecided_ts.len(), "undecided index out of step");
        for (ts, id) in &c.undecided_ts {
            assert_eq!(c.undecided.get(id).map(|v| v.ts), Some(*ts), "undecided index entry");
        }
        let known = self.partition.known.strong;
        if let Some((ts, _)) = c.undecided_ts.first() {
            let early = self.config.unsafe_deliver_early;
            assert!(known < *ts || early, "known.strong reaches an undecided proposal");
        }
        if let Some(((ts, _), _)) = c.decided.first_key_value() {
            assert!(*ts > known, "a committed transaction below known.strong undelivered");
        }
        assert!(known <= c.promise, "known.strong above the strong heartbeats");
        assert!(c.accepted <= c.ballot, "a log following a ballot not joined");
        assert_eq!(
            c.views[self.me.partition as usize], 0,
            "a view of this partition (its ballot stands for it)"
        );
        self.check_conflict_index();
        if !self.leads() {
            assert_eq!(
                c.indexed, c.applied,
                "a replica that does not lead indexes what it applied"
            );
            assert!(c.ballots.is_empty() && c.expiries.is_empty(), "a ballot off the leader");
            assert!(c.reannounce.is_none(), "a replica that does not lead announces");
            assert!(c.deciding.is_empty(), "a replica that does not lead decides");
            if matches!(c.role, Role::Follower) {
                assert_eq!(c.applied, c.durable, "a follower behind its durable index");
            }
            return;
        }
        assert_eq!(self.own_leader_dc(c.ballot), self.me.dc, "a leader of another's ballot");
        assert_eq!(c.accepted, c.ballot, "a leader's log follows an old ballot");
        assert_eq!(c.indexed, end, "a leader indexes its whole log");
        for i in (0..self.dcs).filter(|&i| i != self.me.dc as usize) {
            if let Some(sent) = c.sent[i] {
                assert!(c.base <= sent && sent <= end, "a sibling sent past the log");
                assert!(c.acked[i] <= sent, "a sibling acked past what it was sent");
            }
            assert!(c.told[i] <= c.durable, "a sibling told of more than is durable");
        }
        for (expiry, id) in &c.expiries {
            let ballot = c.ballots.get(id).expect("an expiry has its ballot");
            assert!(ballot.mine.is_none() && ballot.expiry == *expiry, "an expiry of a vote cast");
        }
        for (id, ballot) in &c.ballots {
            match ballot.mine {
                None => {
                    assert!(c.expiries.contains(&(ballot.expiry, *id)), "a ballot without expiry");
                    assert!(!c.open.contains_key(id), "a vote logged but not in its ballot");
                }
                Some((ok, ts)) => {
                    let open = c.open.get(id).expect("a ballot's vote is in the conflict index");
                    assert_eq!(
                        (open.ok, open.ts),
                        (ok, ts),
                        "a ballot's vote is not the logged one"
                    );
                }
            }
            assert!(!c.outcomes.contains_key(id), "a decided transaction's ballot");
        }
        for id in c.open.keys() {
            let balloted = c.ballots.get(id).is_some_and(|b| b.mine.is_some());
            assert!(
                balloted != c.deciding.contains_key(id),
                "an open vote neither in its ballot nor being decided, or both"
            );
        }
        for id in c.deciding.keys() {
            assert!(!c.outcomes.contains_key(id), "a decision applied and still deciding");
        }
    }

    /// The conflict index: pending transactions are open commit votes that update, and
    /// no transaction is both open and decided.
    fn check_conflict_index(&self) {
        let c = &self.certifier;
        for txs in c.pending.values() {
            assert!(!txs.is_empty(), "an empty pending entry");
            for id in txs.keys() {
                let open = c.open.get(id).expect("a pending transaction is open");
                assert!(open.ok && open.updates, "pending without an updating commit vote");
            }
        }
        for id in c.open.keys() {
            assert!(!c.outcomes.contains_key(id), "a transaction open and decided");
        }
        self.check_outcomes();
    }

    /// The remembered outcomes: indexed by expiry, only commits wait on participants,
    /// and the applied horizon never passes the indexed one (a replica that does not
    /// lead indexes what it applied).
    fn check_outcomes(&self) {
        let c = &self.certifier;
        assert_eq!(c.outcomes.len(), c.remembered.len(), "an outcome not indexed by expiry");
        for &(expiry, id) in &c.remembered {
            let outcome = c.outcomes.get(&id).expect("an expiry without its outcome");
            assert_eq!(outcome.expiry, expiry, "an outcome under another expiry");
            assert!(outcome.commit || outcome.unsettled.is_empty(), "an abort waits to settle");
            assert!(
                !outcome.unsettled.contains(&self.me.partition),
                "an outcome waits on its own partition"
            );
        }
        assert!(c.forgotten <= c.forgetting, "a horizon applied and not indexed");
        if !self.leads() {
            assert_eq!(c.forgotten, c.forgetting, "a horizon indexed and not applied");
        }
    }
}
