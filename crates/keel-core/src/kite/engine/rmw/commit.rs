//! The end of a read-modify-write: its commit acknowledged by a quorum (ours: the
//! result; another's that we finished: propose again), or its failed comparison's
//! write-back acknowledged by a quorum.

use super::{KiteEngine, Rmw, RmwStage, Sent, Step};
use crate::kite::engine::{Barrier, Maker, RoundId};
use crate::kite::types::{KiteResult, RmwOutcome, RmwRecord, Stamp};
use keel_types::{KeelError, Value};

impl KiteEngine {
    /// A commit: once a quorum holds it, ours is done (an acquire and a release), and
    /// another's that we finished lets ours be proposed again above it.
    pub(super) fn rmw_committed(&mut self, session: u64, rmw: &mut Rmw, sent: Sent) -> Step {
        if !self.written(sent.round) {
            return Step::Wait(RmwStage::Committing(sent));
        }
        let Sent { round, record, mine } = sent;
        if !mine {
            self.close(round);
            self.counters.rmw_helped += 1;
            if let Some(slot) = self.keys.get_mut(rmw.op.key()) {
                slot.finished = Some(record.id);
            }
            rmw.ballot = self.next_ballot(rmw.op.key(), rmw.ballot);
            return Step::Next(self.propose(session, rmw));
        }
        assert_eq!(record.id, rmw.rid, "another's record committed as ours");
        self.acquired(rmw.id, std::mem::take(&mut rmw.delinquent));
        self.counters.rmws += 1;
        let Some(wrote) = record.wrote() else {
            // A failure kept as a record: its release barrier is dropped.
            self.counters.failures_committed += 1;
            return Step::Done(Ok(self.rmw_failed(&rmw.barrier, record.read, record.read_stamp)));
        };
        Step::Done(Ok(KiteResult::Rmw {
            wrote: Some(wrote),
            read: record.read,
            read_stamp: record.read_stamp,
            local: false,
        }))
    }

    /// A failed comparison's write-back: once a quorum holds the value read, the
    /// read-modify-write ends as the acquire of that value.
    pub(super) fn rmw_written_back(
        &mut self,
        session: u64,
        rmw: &mut Rmw,
        round: RoundId,
        read: Option<Value>,
        read_stamp: Stamp,
        made_by: Maker,
    ) -> Step {
        let Some(flagged) = self.quorum_acks(session, round) else {
            return Step::Wait(RmwStage::WriteBack { round, read, read_stamp, made_by });
        };
        self.close(round);
        rmw.delinquent.extend(flagged);
        let key = rmw.op.key().clone();
        self.apply(&key, read.clone(), read_stamp, made_by.clone());
        self.spread_acquired(session, &key, &read, read_stamp, made_by);
        self.acquired(rmw.id, std::mem::take(&mut rmw.delinquent));
        self.counters.rmws += 1;
        Step::Done(Ok(self.rmw_failed(&rmw.barrier, read, read_stamp)))
    }

    /// A compare-and-swap (or an FAA on a value that is not a number) that wrote nothing:
    /// an acquire, whose release barrier is dropped unfinished (its slow release round,
    /// if one is out, closed).
    pub(super) fn rmw_failed(
        &mut self,
        barrier: &Barrier,
        read: Option<Value>,
        read_stamp: Stamp,
    ) -> KiteResult {
        self.drop_barrier(barrier);
        KiteResult::Rmw { read, read_stamp, wrote: None, local: false }
    }
}

/// What a read-modify-write's record returns, once applied.
pub(super) fn outcome_of(record: &RmwRecord) -> RmwOutcome {
    RmwOutcome {
        seq: record.id.seq,
        read: record.read.clone(),
        read_stamp: record.read_stamp,
        value: record.value.clone(),
        stamp: record.stamp,
        digest: record.digest,
    }
}

/// FAA on a decimal i64 value (absent: 0).
pub(super) fn faa(value: Option<&Value>, delta: i64) -> Result<Value, KeelError> {
    let current = match value {
        None => 0,
        Some(v) => std::str::from_utf8(v)
            .ok()
            .and_then(|s| s.parse::<i64>().ok())
            .ok_or(KeelError::NotAnInteger)?,
    };
    let next = current.checked_add(delta).ok_or(KeelError::NotAnInteger)?;
    Ok(Value::from(next.to_string()))
}
