//! Uniformity without a central component (Algorithm 2, 2:19–38): the stable vector (what
//! every partition of this data center stores), the uniform vector (what f+1 data centers
//! including this one store), suspicion of failed data centers and forwarding of their
//! transactions, and the collection of remote transactions every data center stores.

use super::super::types::{Body, Replicated, Vector};
use super::GeoEngine;
use keel_types::NodeId;

impl GeoEngine {
    /// `BROADCAST_VECS` (2:23–26): the known vector to the partitions of this data
    /// center, the stable and known vectors to the siblings.
    pub(crate) fn broadcast(&mut self) {
        let known = self.partition.known.clone();
        let row = self.reported_row();
        self.uniformity.local[self.me.partition as usize] = row.clone();
        self.recompute_stable();
        let me = self.me;
        let ballot = self.certifier.accepted;
        let suspected = self.suspected();
        for p in (0..self.partitions).filter(|&p| p != me.partition) {
            let to = self.replica(self.me.dc, p);
            let (known, suspected) = (row.clone(), suspected.clone());
            self.send(to, Body::KnownLocal { known, ballot, suspected });
        }
        let stable = self.uniformity.stable.clone();
        let ballot = self.certifier.ballot;
        let mut leaders = self.certifier.views.clone();
        leaders[me.partition as usize] = self.certifier.accepted;
        for dc in (0..self.dcs as u32).filter(|&i| i != me.dc) {
            let to = self.replica(dc, me.partition);
            let (stable, known, leaders) = (stable.clone(), known.clone(), leaders.clone());
            self.send(to, Body::Vectors { stable, known, ballot, leaders });
        }
    }

    /// `KNOWNVEC_LOCAL` (2:27–30) from another partition of this data center, with the
    /// data centers it suspects.
    pub(crate) fn known_local(
        &mut self,
        from: NodeId,
        known: Vector,
        ballot: u64,
        suspected: Vec<u32>,
    ) {
        let Some(member) = self.member(from) else { return };
        self.learn_ballot(member.partition, ballot);
        let p = member.partition as usize;
        self.uniformity.local_heard[p] = self.now;
        self.uniformity.local_suspected[p] = suspected;
        let slot = &mut self.uniformity.local[member.partition as usize];
        slot.join(&known);
        self.recompute_stable();
    }

    /// `STABLEVEC` and `KNOWNVEC_GLOBAL` (2:31–38) from the sibling in another data
    /// center, with the certification ballots it knows (`failover.rs`).
    pub(crate) fn vectors(&mut self, from: NodeId, stable: Vector, known: Vector, leaders: &[u64]) {
        let Some(member) = self.member(from) else { return };
        for (p, &ballot) in leaders.iter().enumerate() {
            if self.learn_ballot(p as u32, ballot) {
                self.counters.leaders_learned_from_siblings += 1;
            }
        }
        let h = member.dc as usize;
        self.uniformity.stable_matrix[h].join(&stable);
        self.uniformity.global[h].join(&known);
        self.recompute_uniform();
    }

    /// `stableVec`: the entry-wise minimum of the partitions' known vectors.
    fn recompute_stable(&mut self) {
        let u = &mut self.uniformity;
        let mut stable = u.local[0].clone();
        for v in &u.local[1..] {
            for (s, k) in stable.dcs.iter_mut().zip(&v.dcs) {
                *s = (*s).min(*k);
            }
            stable.strong = stable.strong.min(v.strong);
        }
        self.clamp_to_limits(&mut stable);
        self.hold_unknown_lives(&mut stable);
        let u = &mut self.uniformity;
        u.stable.join(&stable);
        let d = self.me.dc as usize;
        u.stable_matrix[d] = u.stable.clone();
        self.recompute_uniform();
    }

    /// `uniformVec` (2:33–36): per origin, the largest timestamp some group of f+1 data
    /// centers including this one all store; the closed form of `docs/geo.md` (the f-th
    /// largest of the other data centers' stable entries, capped by this one's) picks the
    /// best group without enumerating them.
    fn recompute_uniform(&mut self) {
        let d = self.me.dc as usize;
        let f = self.config.f as usize;
        let u = &mut self.uniformity;
        let mut raised = false;
        for j in 0..self.dcs {
            let mine = u.stable_matrix[d].dcs[j];
            let reach = if f == 0 {
                mine
            } else {
                let mut others: Vec<u64> =
                    (0..self.dcs).filter(|&h| h != d).map(|h| u.stable_matrix[h].dcs[j]).collect();
                others.sort_unstable_by(|a, b| b.cmp(a));
                mine.min(others[f - 1])
            };
            if reach > u.uniform.dcs[j] {
                u.uniform.dcs[j] = reach;
                raised = true;
            }
        }
        if raised {
            self.wake_syncs();
        }
    }

    /// The data centers this node suspects: their sibling has been silent for
    /// `suspect_after`, or they were removed.
    pub(crate) fn suspected(&self) -> Vec<u32> {
        let after = self.config.suspect_after.0;
        (0..self.dcs as u32)
            .filter(|&j| j != self.me.dc)
            .filter(|&j| {
                self.removed[j as usize]
                    || self.now.0 >= self.uniformity.heard[j as usize].0.saturating_add(after)
            })
            .collect()
    }

    /// The data centers failed for some partition, as far as this node can tell: removed,
    /// suspected by this replica or by another partition of its data center (as it last
    /// reported), and its own data center when another of its partitions has been silent
    /// for `suspect_after` (a lost replica). What an operator's removal counts (`remove.rs`).
    pub(crate) fn failed_anywhere(&self) -> Vec<u32> {
        let after = self.config.suspect_after.0;
        let u = &self.uniformity;
        let mut failed = self.suspected();
        let others = (0..self.partitions as usize).filter(|&p| p != self.me.partition as usize);
        for p in others {
            failed.extend(&u.local_suspected[p]);
            if self.now.0 >= u.local_heard[p].0.saturating_add(after) {
                failed.push(self.me.dc);
            }
        }
        failed.sort_unstable();
        failed.dedup();
        failed
    }

    /// `FORWARD_REMOTE_TXS(i, j)` (2:19–22) for every suspected `j` and every other data
    /// center `i`: what this node holds of `j`'s transactions past what `i` is known to
    /// have and past what was forwarded there already; a heartbeat of `j`'s known entry
    /// when nothing is left.
    pub(crate) fn forward_for_suspected(&mut self) {
        let me = self.me.dc;
        for j in self.suspected() {
            let to = (0..self.dcs as u32).filter(|&i| i != j && i != me);
            for i in to.filter(|&i| !self.removed[i as usize]).collect::<Vec<_>>() {
                self.forward(i, j);
            }
        }
    }

    fn forward(&mut self, i: u32, j: u32) {
        let sent = self.uniformity.forwarded.get(&(i, j)).copied().unwrap_or(0);
        let floor = self.uniformity.global[i as usize].dcs[j as usize].max(sent);
        let txs: Vec<Replicated> = self.partition.remote_commits[j as usize]
            .range(floor.saturating_add(1)..)
            .map(|(_, tx)| tx.clone())
            .collect();
        let known = self.partition.known.dcs[j as usize];
        let to = self.replica(i, self.me.partition);
        if let Some(last) = txs.last() {
            let top = last.commit.dcs[j as usize];
            self.counters.forwarded += txs.len() as u64;
            self.send(to, Body::Replicate { origin: j, txs });
            self.uniformity.forwarded.insert((i, j), top);
        } else if known > floor && self.send(to, Body::Heartbeat { origin: j, ts: known }) {
            self.uniformity.forwarded.insert((i, j), known);
        }
    }

    /// Forgets the remote transactions every data center stores (`globalMatrix`): none
    /// is needed for forwarding any more. A data center that never reports keeps them
    /// until it is removed (`docs/geo.md`, *Failures*, *Removing a data center*).
    pub(crate) fn collect(&mut self) {
        let d = self.me.dc as usize;
        // A returning data center is not gone: its rows were forgotten, so nothing is
        // collected until its new replicas report storing it (`back.rs`).
        let mut gone: Vec<bool> =
            (0..self.dcs).map(|i| self.removed[i] && !self.returning[i]).collect();
        if self.config.unsafe_collect_suspected {
            self.suspected().into_iter().for_each(|j| gone[j as usize] = true);
        }
        for j in (0..self.dcs).filter(|&j| j != d) {
            let everywhere = (0..self.dcs)
                .filter(|&i| i != j && !gone[i])
                .map(|i| {
                    if i == d {
                        self.partition.known.dcs[j]
                    } else {
                        self.uniformity.global[i].dcs[j]
                    }
                })
                .min()
                .unwrap_or(0);
            let commits = &mut self.partition.remote_commits[j];
            let keep = commits.split_off(&everywhere.saturating_add(1));
            let gone = std::mem::replace(commits, keep).len();
            self.counters.collected += gone as u64;
        }
    }
}
