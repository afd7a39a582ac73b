//! What a quorum's promises decide. In order:
//!
//! 1. a nack: retry above the highest ballot seen (`mod.rs`);
//! 2. the request's number used for another command: refused;
//! 3. a later request of its client done (or started) and this one's outcome not found:
//!    a late retry, refused;
//! 4. the request found done (an outcome recorded, or the value it made in place):
//!    committed again as this session's own write;
//! 5. an accepted record to finish first (ours, one carrying ours, or another's newer
//!    than every value in the quorum, or one carrying more than a record may): accepted
//!    again at our ballot;
//! 6. otherwise our record, built on the newest value (carrying or settling what the
//!    adopted record did); or, for a comparison that fails, an acquire of that value.

use super::{KiteEngine, Rmw, RmwStage, Step};
use crate::kite::engine::{Found, Message, RmwId, RmwRecord, RoundId};
use crate::kite::types::{Ballot, KiteOp, RmwOutcome, SKIPPED_MAX};
use keel_types::{ClientId, KeelError, NodeId, RequestId, Value};

/// Requests a record carries along (`skipped`) or declares settled, with their outcomes.
type Carried = Vec<(RmwId, RmwOutcome)>;

/// A proposal's replies so far.
struct Promises {
    /// The members (by index) that granted.
    granted: u64,
    nacks: usize,
    /// The highest ballot any replica promised.
    highest: Ballot,
}

/// What the granted promises of a quorum tell of the request.
struct Findings {
    /// The highest-ballot record any replica of the quorum accepted.
    adopted: Option<RmwRecord>,
    /// The request's outcome, if a replica recorded it or holds the value it made.
    done: Option<RmwOutcome>,
    /// A later request of the same client was done or started.
    superseded: bool,
    /// The replicas (by index) that hold the newest value.
    seen_by: u64,
}

/// What the adopted record asks of this proposal.
enum Adoption {
    /// Finish it first (accepted at our ballot, then committed).
    Finish(RmwStage),
    /// Build ours, carrying (`skipped`) or settling (`settled`) what it did.
    Build { skipped: Carried, settled: Carried },
}

impl KiteEngine {
    /// The promises of `round`: wait, retry, or decide once a quorum granted.
    pub(super) fn rmw_promised(&mut self, session: u64, rmw: &mut Rmw, round: RoundId) -> Step {
        let tally = self.promises(session, rmw, round);
        if !self.is_quorum(tally.granted) {
            // A nack means a higher ballot is out: start over above it rather than wait
            // for nodes that may be down.
            if tally.nacks > 0 {
                self.close(round);
                return self.rmw_retry(rmw, tally.highest);
            }
            return Step::Wait(RmwStage::Proposing { round });
        }
        let round = self.rounds.remove(round).expect("an open proposal");
        let granted: Vec<(NodeId, Message)> = round
            .replies
            .into_iter()
            .filter(|(_, m)| matches!(m, Message::Promise { ok: true, .. }))
            .collect();
        assert!(self.is_quorum(self.replies_mask(&granted)), "a quorum's promises");
        let base = newest(granted.iter().map(|(_, m)| m));
        let found = self.findings(rmw, &granted, &base);
        self.decide(session, rmw, base, found)
    }

    /// Counts the promises so far; the granted ones' delinquency answers are kept.
    fn promises(&self, session: u64, rmw: &mut Rmw, round: RoundId) -> Promises {
        let r = self.rounds.get(round).expect("an open proposal");
        assert_eq!(r.session, session, "session {session} reads another's proposal");
        let mut tally = Promises { granted: 0, nacks: 0, highest: rmw.ballot };
        let bit = |from: &NodeId| self.index_of(*from).map_or(0, |i| 1u64 << i);
        for (from, m) in &r.replies {
            if let Message::Promise { ok: granted, promised, delinquent: flagged, .. } = m {
                tally.highest = tally.highest.max(*promised);
                if *granted {
                    if let Some(gen) = flagged {
                        rmw.delinquent.insert(*from, *gen);
                    }
                    tally.granted |= bit(from);
                } else {
                    tally.nacks += 1;
                }
            }
        }
        tally
    }

    /// Reads the granted promises for the request's fate and the record to adopt.
    fn findings(&self, rmw: &Rmw, granted: &[(NodeId, Message)], base: &Found) -> Findings {
        let me = rmw.rid;
        let mut found = Findings { adopted: None, done: None, superseded: false, seen_by: 0 };
        let mut adopted: Option<(Ballot, &RmwRecord)> = None;
        for (from, m) in granted {
            let Message::Promise { accepted, stamp, outcome, made_by, .. } = m else {
                continue;
            };
            if *stamp == base.stamp {
                found.seen_by |= self.index_of(*from).map_or(0, |i| 1u64 << i);
            }
            if self.config.unsafe_forget_outcomes {
                continue;
            }
            // Our request is done if a replica recorded its outcome or holds the value it
            // made.
            match outcome {
                Some(o) if o.seq == me.seq => found.done = Some(o.clone()),
                Some(o) if o.seq > me.seq => found.superseded = true,
                _ => {}
            }
            if let Some(made) = made_by.as_ref().filter(|m| m.0 == me) {
                found.done = Some(made.1.clone());
            }
            // A later request of the same client started: its node ran this one first (a
            // session runs one request at a time), so this is a late retry too, even
            // before that request's outcome is recorded.
            let later = |id: &RmwId| id.same_client(&me) && id.seq > me.seq;
            found.superseded |= made_by.as_ref().is_some_and(|m| later(&m.0));
            found.superseded |= accepted.as_ref().is_some_and(|(_, rec)| rec.involves(later));
            if let Some((b, rec)) = accepted {
                if adopted.is_none_or(|(bb, _)| *b > bb) {
                    adopted = Some((*b, rec));
                }
            }
        }
        assert!(found.seen_by != 0, "the newest unseen");
        found.adopted = adopted.map(|(_, r)| r.clone());
        found
    }

    /// Steps 2 to 6 of the module's list.
    fn decide(&mut self, session: u64, rmw: &mut Rmw, base: Found, found: Findings) -> Step {
        let me = rmw.rid;
        let digest = rmw.op.rmw_digest();
        let reused = found.done.as_ref().is_some_and(|o| o.digest != digest)
            || found.adopted.as_ref().is_some_and(|a| a.id == me && a.digest != digest);
        if reused {
            // The client numbered another command with this request's number: not a
            // retry, so neither answered with that outcome nor done.
            self.counters.rmws_reused += 1;
            self.drop_barrier(&rmw.barrier);
            let (client, request) = (ClientId(me.session), RequestId(me.seq));
            return Step::Done(Err(crate::engine::reused_request(client, request)));
        }
        if found.done.is_none() && found.superseded {
            // A later request of the same client was done: this one is a late retry whose
            // own outcome is no longer kept. It may have been done, so it is not done again.
            self.counters.rmws_superseded += 1;
            self.drop_barrier(&rmw.barrier);
            return Step::Done(Err(KeelError::SessionExpired));
        }
        if let Some(outcome) = found.done {
            return Step::Next(self.commit_found(session, rmw, outcome));
        }
        match self.adopt(session, rmw, found.adopted, &base) {
            Adoption::Finish(stage) => Step::Next(stage),
            Adoption::Build { skipped, settled } => {
                self.build(session, rmw, base, (skipped, settled), found.seen_by)
            }
        }
    }

    /// Our request, committed by us or a helper: committed again as this session's own
    /// write, since the session's next release must find it acknowledged by every node,
    /// and the helper may have reached fewer than a quorum.
    fn commit_found(&mut self, session: u64, rmw: &Rmw, o: RmwOutcome) -> RmwStage {
        self.counters.rmws_found_done += 1;
        let me = rmw.rid;
        let record = RmwRecord {
            id: me,
            value: o.value.clone(),
            stamp: o.stamp,
            digest: o.digest,
            read: o.read.clone(),
            read_stamp: o.read_stamp,
            base: None,
            skipped: Vec::new(),
            settled: Vec::new(),
        };
        let (value, stamp, key) = (o.value.clone(), o.stamp, rmw.op.key().clone());
        let rmw_done = Some((me, o));
        let applied = Vec::new();
        let msg =
            Message::Write { round: 0, key, value, stamp, rmw: rmw_done, applied, query: None };
        let round = self.broadcast(session, msg, true);
        RmwStage::Committing(super::Sent { round, record, mine: true })
    }

    /// Another's record newer than every value in the quorum: finish it first (accepted
    /// at our ballot, its acceptors record what it builds on; then committed, every
    /// replica of a quorum records it done), then start over. One covered by a newer
    /// value is carried along as applied before it, with what it built on and carried.
    /// One whose value is in place was committed: ours builds on it (its base), and what
    /// it carried is settled by ours: committed with it, so chosen, but perhaps recorded
    /// only by nodes its commit reached, which may be gone. Our acceptors record both.
    fn adopt(&mut self, session: u64, rmw: &Rmw, a: Option<RmwRecord>, base: &Found) -> Adoption {
        let me = rmw.rid;
        let build = |skipped, settled| Adoption::Build { skipped, settled };
        let Some(a) = a else { return build(Vec::new(), Vec::new()) };
        let known = base.made_by.as_ref().is_some_and(|m| m.0 == a.id);
        let carries_ours =
            a.base.as_ref().is_some_and(|b| b.0 == me) || a.skipped.iter().any(|(i, _)| *i == me);
        if a.id == me || carries_ours || a.stamp > base.stamp {
            // Our own record, one that carries ours, or another's newer than every value
            // in the quorum: finish it (accepted again at our ballot, then committed; a
            // newer value in place keeps it, applied before). Ours is then done, never
            // built a second time.
            let mine = a.id == me;
            return Adoption::Finish(self.accept(session, rmw, a, mine));
        }
        let finished = self.keys.get(rmw.op.key()).is_some_and(|s| s.finished == Some(a.id));
        if known {
            return build(Vec::new(), a.skipped.clone());
        }
        if finished {
            return build(Vec::new(), Vec::new());
        }
        let carried = carried_by(&a);
        if carried.len() > SKIPPED_MAX {
            // More than a record may carry: finish it instead (accepted at our ballot,
            // committed with what it carries, acknowledged by a quorum), so that nothing
            // it carries is dropped.
            self.counters.rmws_finished_covered += 1;
            return Adoption::Finish(self.accept(session, rmw, a, false));
        }
        build(carried, Vec::new())
    }

    /// Our record on the newest value: ready for the barrier; or, for a comparison that
    /// fails (unnamed), an acquire of that value, written back unless a quorum holds it.
    fn build(
        &mut self,
        session: u64,
        rmw: &mut Rmw,
        base: Found,
        (skipped, settled): (Carried, Carried),
        seen_by: u64,
    ) -> Step {
        let me = rmw.rid;
        let Found { value: read, stamp: read_stamp, made_by } = base;
        let new = new_value(&rmw.op, read.as_ref());
        // A request its client named that fails is chosen like one that writes, as a
        // record keeping the value it read: a first attempt still running elsewhere must
        // not swap after its retry answered that it failed.
        let keep = me.client_named() && !self.config.unsafe_uncommitted_failures;
        let failure_kept =
            (new.is_none() && keep).then(|| (read.clone().unwrap_or_default(), read_stamp));
        if let Some((value, stamp)) = new.map(|v| (v, read_stamp.next_rmw())).or(failure_kept) {
            let digest = rmw.op.rmw_digest();
            let base = made_by;
            let record = RmwRecord {
                id: me,
                value,
                stamp,
                digest,
                read,
                read_stamp,
                base,
                skipped,
                settled,
            };
            assert!(record.well_formed(), "our record not right after its base");
            return Step::Next(RmwStage::Ready { record });
        }
        if self.is_quorum(seen_by) {
            let key = rmw.op.key().clone();
            self.apply(&key, read.clone(), read_stamp, made_by.clone());
            let voting = self.voting_mask();
            if seen_by & voting != voting {
                self.spread_acquired(session, &key, &read, read_stamp, made_by);
            }
            self.acquired(rmw.id, std::mem::take(&mut rmw.delinquent));
            self.counters.rmws += 1;
            return Step::Done(Ok(self.rmw_failed(&rmw.barrier, read, read_stamp)));
        }
        self.counters.write_backs += 1;
        let found = Found { value: read, stamp: read_stamp, made_by };
        let round = self.write_back(session, rmw.op.key(), &found, rmw.id);
        let Found { value: read, stamp: read_stamp, made_by } = found;
        Step::Next(RmwStage::WriteBack { round, read, read_stamp, made_by })
    }
}

/// The newest value in the quorum, and who made it.
fn newest<'a>(granted: impl Iterator<Item = &'a Message>) -> Found {
    let mut base = Found { value: None, stamp: super::Stamp::ZERO, made_by: None };
    for m in granted {
        let Message::Promise { value, stamp, made_by, .. } = m else {
            continue;
        };
        if *stamp > base.stamp {
            base = Found { value: value.clone(), stamp: *stamp, made_by: made_by.clone() };
        }
    }
    base
}

/// What an adopted record carries, each request once (a run of failures kept as records
/// all name the same base).
fn carried_by(a: &RmwRecord) -> Carried {
    let mut carried: Carried = Vec::new();
    let all = std::iter::once((a.id, super::commit::outcome_of(a)))
        .chain(a.base.as_deref().cloned())
        .chain(a.skipped.iter().cloned());
    for (i, o) in all {
        if !carried.iter().any(|(c, _)| *c == i) {
            carried.push((i, o));
        }
    }
    carried
}

/// The value a read-modify-write writes on `read`; `None` when it fails (a comparison
/// that fails, or an FAA on a value that is not a number, which fails as an acquire).
fn new_value(op: &KiteOp, read: Option<&Value>) -> Option<Value> {
    match op {
        KiteOp::Faa { delta, .. } => super::commit::faa(read, *delta).ok(),
        KiteOp::Cas { expected, new, .. } => (read == expected.as_ref()).then(|| new.clone()),
        _ => unreachable!("a read-modify-write"),
    }
}
