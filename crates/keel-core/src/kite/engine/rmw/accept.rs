//! The accept round: our record once the release barrier allows it, or another's record
//! finished; on a quorum's acceptance, the commit (a write to every node carrying the
//! record's outcome and what it settles).

use super::{KiteEngine, Rmw, RmwStage, Sent, Step};
use crate::kite::engine::{Barrier, Flags, Message, RoundId};
use crate::kite::types::RmwRecord;

/// An accept round's replies so far.
struct Acceptances {
    /// The members (by index) that accepted.
    accepted: u64,
    nacks: usize,
    /// The highest ballot any replica promised.
    highest: crate::kite::types::Ballot,
    /// The accepting replicas that deemed this node delinquent.
    flags: Flags,
}

impl KiteEngine {
    /// Our record waits for the release barrier, unless it publishes nothing (a failure
    /// kept as a record is an acquire only, as any failed comparison).
    pub(super) fn rmw_ready(&mut self, session: u64, rmw: &mut Rmw, record: RmwRecord) -> Step {
        assert_eq!(record.id, rmw.rid, "our record names our request");
        if rmw.barrier != Barrier::Done && record.wrote().is_some() {
            return Step::Wait(RmwStage::Ready { record });
        }
        Step::Next(self.accept(session, rmw, record, true))
    }

    /// The acceptances of `round`: commit once a quorum accepted; retry on a nack.
    pub(super) fn rmw_accepted(&mut self, session: u64, rmw: &mut Rmw, sent: Sent) -> Step {
        let Sent { round, record, mine } = sent;
        let tally = self.acceptances(session, rmw, round);
        rmw.delinquent.extend(tally.flags);
        if self.is_quorum(tally.accepted) {
            self.close(round);
            return Step::Next(self.commit(session, rmw, record, mine));
        }
        if tally.nacks > 0 {
            self.close(round);
            return self.rmw_retry(rmw, tally.highest);
        }
        Step::Wait(RmwStage::Accepting(Sent { round, record, mine }))
    }

    fn acceptances(&self, session: u64, rmw: &Rmw, round: RoundId) -> Acceptances {
        let r = self.rounds.get(round).expect("an open accept");
        assert_eq!(r.session, session, "session {session} reads another's accept");
        let mut tally =
            Acceptances { accepted: 0, nacks: 0, highest: rmw.ballot, flags: Flags::new() };
        for (from, m) in &r.replies {
            if let Message::Accepted { ok, promised, delinquent: flagged, .. } = m {
                tally.highest = tally.highest.max(*promised);
                if *ok {
                    tally.accepted |= self.index_of(*from).map_or(0, |i| 1u64 << i);
                    if let Some(gen) = flagged {
                        tally.flags.insert(*from, *gen);
                    }
                } else {
                    tally.nacks += 1;
                }
            }
        }
        tally
    }

    /// The commit of a record a quorum accepted. It also declares what the record built
    /// on done: that value may be held, so far, by the one replica its proposer read it
    /// from. Our own commit is tracked for the session's next release.
    fn commit(&mut self, session: u64, rmw: &Rmw, record: RmwRecord, mine: bool) -> RmwStage {
        let outcome = super::commit::outcome_of(&record);
        let mut applied = record.skipped.clone();
        applied.extend(record.base.as_deref().cloned());
        let msg = Message::Write {
            round: 0,
            key: rmw.op.key().clone(),
            value: record.value.clone(),
            stamp: record.stamp,
            rmw: Some((record.id, outcome)),
            applied,
            query: None,
        };
        let round = self.broadcast(session, msg, mine);
        RmwStage::Committing(Sent { round, record, mine })
    }
}
