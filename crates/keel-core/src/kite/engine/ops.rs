//! The operations other than read-modify-writes, each a small state machine over its
//! rounds: relaxed reads and writes (the Eventual Store fast path in-epoch, a quorum
//! otherwise), acquires and releases (ABD, with the barriers of `barrier.rs`), and the
//! flush that settles a session holding [`TRACKED_MAX`] unacknowledged writes.
//!
//! ```text
//! read     in epoch: local ─────────────────────────────────────────► value
//!          else: SlowRead (quorum read) ──────────────────────────────► value, key in epoch
//! write    in epoch: local + sent to all (tracked) ───────────────────► written
//!          else: SlowWrite (quorum's stamps) ─► local + sent to all ─► written
//! acquire  quorum read ─► seen by a quorum? ─ no ─► write back ─┐
//!                                └ yes ─────────────────────────┴─► bits reset ─► value
//! release  quorum's stamps ┐
//!          barrier ────────┴─► value sent to all (tracked) ─► quorum acks ─► written
//! ```

use super::{
    Barrier, Flags, Found, KiteEngine, KiteOp, KiteResult, Message, Phase, RmwId, RoundId, Stamp,
    TRACKED_MAX,
};
use keel_types::{Key, Value};

/// An acquire: a quorum read, a write-back when fewer than a quorum held what it read,
/// then its node's bits reset where it was deemed delinquent.
#[derive(Clone, Debug)]
pub(super) struct Acquire {
    pub(super) key: Key,
    /// The machine epoch when it started.
    pub(super) snapshot: u64,
    /// Its id, which its queries and resets carry.
    pub(super) id: u64,
    pub(super) round: RoundId,
    /// The write-back of what it read, once its read is done.
    pub(super) write_back: Option<(RoundId, Found)>,
    pub(super) delinquent: Flags,
}

/// A release: its version from a quorum's stamps and its barrier, then its value.
#[derive(Clone, Debug)]
pub(super) struct Release {
    pub(super) key: Key,
    pub(super) value: Value,
    /// The quorum read of stamps, open until `version` is known.
    pub(super) round: RoundId,
    pub(super) version: Option<u64>,
    pub(super) barrier: Barrier,
    /// The value's write and its stamp, once sent.
    pub(super) value_round: Option<(RoundId, Stamp)>,
}

impl KiteEngine {
    /// Starts an operation: its result at once (fast path), or the phase that will make it.
    pub(super) fn start(
        &mut self,
        session: u64,
        rid: RmwId,
        op: KiteOp,
    ) -> Result<KiteResult, Phase> {
        if let KiteOp::Read { key } = op {
            return self.start_read(session, key);
        }
        if self.sessions.get(&session).is_some_and(|s| s.tracked.len() >= TRACKED_MAX) {
            self.counters.flushes += 1;
            return Err(Phase::Flush { op, rid, barrier: self.new_barrier() });
        }
        match op {
            KiteOp::Read { .. } => unreachable!("started above"),
            KiteOp::Write { key, value } => self.start_write(session, key, value),
            KiteOp::Acquire { key } => Err(self.start_acquire(session, key)),
            KiteOp::Release { key, value } => Err(self.start_release(session, key, value)),
            KiteOp::Faa { .. } | KiteOp::Cas { .. } => self.rmw_start(session, rid, op),
            KiteOp::Reconfigure { wanted, .. } => self.reconfigure_start(session, rid, wanted),
        }
    }

    fn start_read(&mut self, session: u64, key: Key) -> Result<KiteResult, Phase> {
        let snapshot = self.epoch;
        if self.in_epoch(&key) {
            self.counters.reads_fast += 1;
            let (value, stamp) = self.local(&key);
            return Ok(KiteResult::Value { value, stamp });
        }
        self.counters.reads_slow += 1;
        let round = self.read_round(session, &key, None);
        Err(Phase::SlowRead { key, snapshot, round })
    }

    fn start_write(&mut self, session: u64, key: Key, value: Value) -> Result<KiteResult, Phase> {
        let snapshot = self.epoch;
        if self.in_epoch(&key) {
            self.counters.writes_fast += 1;
            let held = self.local(&key).1;
            let stamp = Stamp::next_write(held.version, self.writer);
            assert!(stamp > held, "a write's stamp not above the one it follows");
            self.write_tracked(session, key, value, stamp, None);
            return Ok(KiteResult::Written { stamp });
        }
        self.counters.writes_slow += 1;
        let round = self.read_round(session, &key, None);
        Err(Phase::SlowWrite { key, value, snapshot, round })
    }

    fn start_acquire(&mut self, session: u64, key: Key) -> Phase {
        let snapshot = self.epoch;
        let id = self.new_acquire();
        let round = self.read_round(session, &key, Some(id));
        let delinquent = Flags::new();
        Phase::Acquire(Acquire { key, snapshot, id, round, write_back: None, delinquent })
    }

    fn start_release(&mut self, session: u64, key: Key, value: Value) -> Phase {
        // The first round (stamps from a quorum) overlaps the barrier's wait.
        let round = self.read_round(session, &key, None);
        let barrier = self.new_barrier();
        Phase::Release(Release { key, value, round, version: None, barrier, value_round: None })
    }

    /// Moves an operation on. `Ok`: it completed with this result; `Err`: still going.
    pub(super) fn progress(&mut self, session: u64, phase: Phase) -> Result<KiteResult, Phase> {
        match phase {
            Phase::Refused(error) => Err(Phase::Refused(error)),
            Phase::SlowRead { key, snapshot, round } => {
                self.slow_read_progress(session, key, snapshot, round)
            }
            Phase::SlowWrite { key, value, snapshot, round } => {
                self.slow_write_progress(session, key, value, snapshot, round)
            }
            Phase::Acquire(acquire) if acquire.write_back.is_none() => {
                self.acquire_read_progress(session, acquire)
            }
            Phase::Acquire(acquire) => self.acquire_write_back_progress(session, acquire),
            Phase::Release(release) => self.release_progress(session, release),
            Phase::Flush { op, rid, mut barrier } => {
                self.barrier_progress(session, &mut barrier, false);
                if barrier != Barrier::Done {
                    return Err(Phase::Flush { op, rid, barrier });
                }
                self.start(session, rid, op)
            }
            Phase::SyncWait(wait) => self.sync_wait_progress(session, wait),
            Phase::Rmw(mut rmw, stage) => {
                self.barrier_progress(session, &mut rmw.barrier, false);
                self.rmw_progress(session, rmw, stage)
            }
        }
    }

    fn slow_read_progress(
        &mut self,
        session: u64,
        key: Key,
        snapshot: u64,
        round: RoundId,
    ) -> Result<KiteResult, Phase> {
        let Some(read) = self.quorum_read(session, round) else {
            return Err(Phase::SlowRead { key, snapshot, round });
        };
        self.close(round);
        self.apply(&key, read.found.value, read.found.stamp, read.found.made_by);
        self.settle_epoch(&key, snapshot);
        let (value, stamp) = self.local(&key);
        Ok(KiteResult::Value { value, stamp })
    }

    fn slow_write_progress(
        &mut self,
        session: u64,
        key: Key,
        value: Value,
        snapshot: u64,
        round: RoundId,
    ) -> Result<KiteResult, Phase> {
        let Some(read) = self.quorum_read(session, round) else {
            return Err(Phase::SlowWrite { key, value, snapshot, round });
        };
        self.close(round);
        let held = self.local(&key).1;
        let version = read.found.stamp.version.max(held.version);
        let stamp = Stamp::next_write(version, self.writer);
        assert!(stamp > held && stamp > read.found.stamp, "a write's stamp not above a quorum's");
        self.write_tracked(session, key.clone(), value, stamp, None);
        self.settle_epoch(&key, snapshot);
        Ok(KiteResult::Written { stamp })
    }

    /// An acquire's quorum read: done if a quorum holds what it read, else written back.
    fn acquire_read_progress(
        &mut self,
        session: u64,
        mut acquire: Acquire,
    ) -> Result<KiteResult, Phase> {
        let Some(read) = self.quorum_read(session, acquire.round) else {
            return Err(Phase::Acquire(acquire));
        };
        self.close(acquire.round);
        acquire.delinquent.extend(read.flagged);
        if !self.is_quorum(read.seen_by) {
            // Not yet seen by a quorum: write it back, asking again, so the answers come
            // after the value was visible (the delinquent set of the release it may come
            // from has reached a quorum).
            self.counters.write_backs += 1;
            let round = self.write_back(session, &acquire.key, &read.found, acquire.id);
            acquire.write_back = Some((round, read.found));
            return Err(Phase::Acquire(acquire));
        }
        let voting = self.voting_mask();
        let everywhere = read.seen_by & voting == voting;
        Ok(self.finish_acquire(session, acquire, read.found, everywhere))
    }

    /// An acquire's write-back: done once a quorum acknowledged it.
    fn acquire_write_back_progress(
        &mut self,
        session: u64,
        mut acquire: Acquire,
    ) -> Result<KiteResult, Phase> {
        let (round, _) = acquire.write_back.as_ref().expect("a write-back under way");
        let round = *round;
        let Some(flagged) = self.quorum_acks(session, round) else {
            return Err(Phase::Acquire(acquire));
        };
        self.close(round);
        acquire.delinquent.extend(flagged);
        let (_, found) = acquire.write_back.take().expect("a write-back under way");
        Ok(self.finish_acquire(session, acquire, found, false))
    }

    /// An acquire's end: what it read applied (and spread, unless every node held it),
    /// its bits reset, its key in the epoch it started in.
    fn finish_acquire(
        &mut self,
        session: u64,
        acquire: Acquire,
        found: Found,
        everywhere: bool,
    ) -> KiteResult {
        let Found { value, stamp, made_by } = found;
        let Acquire { key, snapshot, id, delinquent, .. } = acquire;
        self.apply(&key, value.clone(), stamp, made_by.clone());
        if !everywhere {
            self.spread_acquired(session, &key, &value, stamp, made_by);
        }
        self.acquired(id, delinquent);
        self.settle_epoch(&key, snapshot);
        KiteResult::Value { value, stamp }
    }

    /// A release: its version and its barrier, then its value, then a quorum's acks.
    fn release_progress(
        &mut self,
        session: u64,
        mut release: Release,
    ) -> Result<KiteResult, Phase> {
        if let Some((round, stamp)) = release.value_round {
            assert_eq!(release.barrier, Barrier::Done, "a release's value before its barrier");
            if self.written(round) {
                return Ok(KiteResult::Written { stamp });
            }
            return Err(Phase::Release(release));
        }
        if release.version.is_none() {
            if let Some(read) = self.quorum_read(session, release.round) {
                self.close(release.round);
                release.version = Some(read.found.stamp.version);
            }
        }
        self.barrier_progress(session, &mut release.barrier, true);
        let (Some(version), Barrier::Done) = (release.version, &release.barrier) else {
            return Err(Phase::Release(release));
        };
        let held = self.local(&release.key).1;
        let stamp = Stamp::next_write(version.max(held.version), self.writer);
        assert!(stamp > held, "a release's stamp not above the one it follows");
        let (key, value) = (release.key.clone(), release.value.clone());
        let round = self.write_tracked(session, key, value, stamp, None);
        release.value_round = Some((round, stamp));
        self.release_progress(session, release)
    }

    /// Opens a quorum read of `key` (an acquire's, with its id as the query).
    fn read_round(&mut self, session: u64, key: &Key, query: Option<u64>) -> RoundId {
        self.broadcast(session, Message::Read { round: 0, key: key.clone(), query }, false)
    }

    /// Writes back what a quorum read found, asking again (`id`) for the delinquency.
    pub(super) fn write_back(
        &mut self,
        session: u64,
        key: &Key,
        found: &Found,
        id: u64,
    ) -> RoundId {
        let msg = Message::Write {
            round: 0,
            key: key.clone(),
            value: found.value.clone().unwrap_or_default(),
            stamp: found.stamp,
            rmw: found.made_by.clone().map(|m| *m),
            applied: Vec::new(),
            query: Some(id),
        };
        self.broadcast(session, msg, false)
    }
}
