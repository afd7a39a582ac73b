//! The barriers and the delinquency bits.
//!
//! - **Release barrier** (a release's, a read-modify-write's, a flush's): every earlier
//!   write of the session acknowledged by every node (fast); or, once the release
//!   time-out passed, by a quorum, and the nodes missing named delinquent by a slow
//!   release that a quorum acknowledged (slow).
//!
//!   ```text
//!   Waiting{deadline} ── all acked ───────────────────────────────► Done (fast)
//!        │ deadline passed
//!        ▼
//!   Slow{round: None} ── quorum acked each ─► Slow{round: Some} ── quorum acked ─► Done
//!   ```
//! - **Acquire end**: an acquire (or a read-modify-write's acquire half) that some
//!   replica answered "delinquent" raises the machine epoch (every key leaves the fast
//!   path until read from a quorum) and asks those replicas to reset its bit, naming the
//!   generation each answered with.
//! - **Queries**: a replica answers an acquire's query with its bit of the acquire's node;
//!   a set bit turns transient, naming the acquire, until that acquire's reset.

use super::{Barrier, Bit, Flags, Key, KiteEngine, Message, NodeId, Stamp, TRANSIENT_IDS_MAX};
use super::{Maker, RoundId, Value};

impl KiteEngine {
    /// A new acquire id (its queries and resets carry it).
    pub(super) fn new_acquire(&mut self) -> u64 {
        self.next_acquire += 1;
        // Ids of one incarnation never reach the next one's range (which starts above).
        debug_assert_eq!(self.next_acquire >> 32, u64::from(self.config.incarnation));
        self.next_acquire - 1
    }

    /// A release barrier starting now.
    pub(super) fn new_barrier(&self) -> Barrier {
        Barrier::Waiting { deadline: self.now + self.config.release_timeout }
    }

    /// The release barrier: every earlier write of the session acknowledged by every
    /// node, or, after the time-out, by a quorum and the slow release done.
    pub(super) fn barrier_progress(&mut self, session: u64, barrier: &mut Barrier, release: bool) {
        if self.config.unsafe_release_before_acks && *barrier != Barrier::Done {
            self.untrack_all(session);
            *barrier = Barrier::Done;
            return;
        }
        let tracked = self.sessions.get(&session).map(|s| s.tracked.clone()).unwrap_or_default();
        if let Barrier::Waiting { deadline } = *barrier {
            self.barrier_waiting(session, barrier, deadline, &tracked, release);
        }
        if let Barrier::Slow { .. } = barrier {
            self.barrier_slow(session, barrier, &tracked, release);
        }
    }

    /// The fast half: done once every node acknowledged every tracked write; past the
    /// deadline, slow, naming the nodes missing.
    fn barrier_waiting(
        &mut self,
        session: u64,
        barrier: &mut Barrier,
        deadline: crate::time::Time,
        tracked: &[RoundId],
        release: bool,
    ) {
        let all = self.voting_mask();
        let missing: u64 = tracked
            .iter()
            .filter_map(|r| self.rounds.get(*r))
            .fold(0, |m, r| m | (r.pending & all));
        if missing == 0 {
            self.untrack_all(session);
            if release {
                self.counters.releases_fast += 1;
            }
            *barrier = Barrier::Done;
            return;
        }
        if self.now < deadline {
            return;
        }
        let delinquent = self.members_of(missing);
        // This node acknowledges its own writes as it sends them.
        assert!(!delinquent.contains(&self.config.node), "a node delinquent to itself");
        assert!(!delinquent.is_empty() && delinquent.len() < self.config.members.len());
        assert!(missing & !all == 0, "a delinquent node that does not vote");
        *barrier = Barrier::Slow { delinquent, round: None };
    }

    /// The slow half: once a quorum acknowledged every tracked write, the slow release
    /// naming the delinquent nodes; done once a quorum acknowledged it.
    fn barrier_slow(
        &mut self,
        session: u64,
        barrier: &mut Barrier,
        tracked: &[RoundId],
        release: bool,
    ) {
        let Barrier::Slow { delinquent, round } = barrier else { unreachable!("a slow barrier") };
        if round.is_none() {
            let all_quorum = tracked.iter().all(|r| self.acked_by_quorum(*r));
            if !all_quorum {
                return;
            }
            if self.config.unsafe_no_slow_path {
                self.untrack_all(session);
                *barrier = Barrier::Done;
                return;
            }
            let msg = Message::SlowRelease { round: 0, delinquent: delinquent.clone() };
            *round = Some(self.broadcast(session, msg, false));
        }
        let r = round.expect("the slow release is out");
        if self.acked_by_quorum(r) {
            self.close(r);
            self.untrack_all(session);
            if release {
                self.counters.releases_slow += 1;
            }
            *barrier = Barrier::Done;
        }
    }

    /// Drops a read-modify-write's release barrier unfinished: the request ends without
    /// publishing anything, so its slow release round, if one is out, is closed.
    pub(super) fn drop_barrier(&mut self, barrier: &Barrier) {
        if let Barrier::Slow { round: Some(r), .. } = barrier {
            self.close(*r);
        }
    }

    /// What an acquire read may be held by only a quorum (a release's value round, a
    /// write-back, an RMW's commit wait for no more). The session sends it on to every
    /// node as its own write, so its next release covers it: a chain Rel x → Acq x →
    /// Rel f → Acq f on a node that missed x then finds that node delinquent, and its
    /// relaxed read of x goes to a quorum (not in the paper, whose lemmas cover only the
    /// writes before a release, not the release's own value).
    pub(super) fn spread_acquired(
        &mut self,
        session: u64,
        key: &Key,
        value: &Option<Value>,
        stamp: Stamp,
        made_by: Maker,
    ) {
        if let (Some(value), true) = (value, stamp != Stamp::ZERO) {
            self.write_tracked(session, key.clone(), value.clone(), stamp, made_by.map(|m| *m));
        }
    }

    /// The end of an acquire (or a read-modify-write's acquire half): a delinquent node
    /// raises its epoch first, then asks for its bits to be reset.
    pub(super) fn acquired(&mut self, id: u64, delinquent: Flags) {
        if delinquent.is_empty() {
            self.counters.acquires_fast += 1;
            return;
        }
        self.counters.acquires_slow += 1;
        let epoch = self.epoch;
        self.epoch += 1;
        assert!(self.epoch > epoch, "the machine epoch moves up");
        // Each replica that answered "delinquent" gets a reset naming the generation
        // it answered with; one whose answer came too late keeps its bit transient.
        let resets: Vec<(NodeId, u64)> = if self.config.unsafe_paper_reset {
            self.config.members.iter().map(|&n| (n, u64::MAX)).collect()
        } else {
            delinquent.into_iter().collect()
        };
        for (node, gen) in resets {
            assert!(self.index_of(node).is_some(), "a reset for a non-member");
            let msg = Message::ResetBit { acquire: id, gen };
            if node == self.config.node {
                let _ = self.serve(node, msg);
            } else {
                self.out.messages.push((node, msg));
            }
        }
    }

    /// Answers the delinquency query of `from`'s acquire `id`.
    /// `Some(generation)` when delinquent.
    pub(super) fn query(&mut self, from: NodeId, id: Option<u64>) -> Option<u64> {
        let id = id?;
        let gen = self.gens.get(&from).copied().unwrap_or(0);
        let bit = self.bits.get_mut(&from)?;
        match bit {
            Bit::Clear => None,
            Bit::Set => {
                *bit = Bit::Transient(vec![id]);
                Some(gen)
            }
            Bit::Transient(ids) => {
                if !ids.contains(&id) {
                    if ids.len() >= TRANSIENT_IDS_MAX {
                        ids.remove(0);
                    }
                    ids.push(id);
                }
                assert!(ids.len() <= TRANSIENT_IDS_MAX, "a transient bit past its bound");
                Some(gen)
            }
        }
    }
}
