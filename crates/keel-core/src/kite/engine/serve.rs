//! A peer's message in, and what this node answers.
//!
//! Every message goes through the gate (`gate.rs`) first. A reply then goes through the
//! fence (`fence.rs`) into its round (`rounds.rs`); the rejoin's messages go to
//! `rejoin.rs`; a request is answered by [`KiteEngine::serve`] (also what a round asks of
//! this node itself):
//!
//! | request | what the replica does | answer |
//! |---|---|---|
//! | `Write` | applies the value if its stamp is newer, records the outcomes it carries | `WriteAck` (with the query's answer) |
//! | `Read` | reads its copy | `ReadReply` (value, stamp, maker, query's answer) |
//! | `SlowRelease` | sets the bits of the delinquent nodes, a generation up | `SlowReleaseAck` |
//! | `ResetBit` | clears the sender's bit if the reset names the generation and the acquire | none |
//! | `Propose` | promises a higher ballot; tells what it accepted, holds and recorded | `Promise` |
//! | `Accept` | accepts at a ballot not below its promise; records what the record settles | `Accepted` |

use super::{Ballot, Bit, KiteEngine, Message, NodeId, RmwId, RmwOutcome, RmwRecord, Stamp};
use super::{Key, Value};

impl KiteEngine {
    /// A peer's message: gated, then recorded (a reply), merged (the rejoin's), or
    /// answered (a request). Answers the session whose round a reply answered.
    pub(super) fn on_message(&mut self, from: NodeId, message: Message) -> Option<u64> {
        if self.index_of(from).is_none() || from == self.config.node {
            self.reject(from, "sender is not a peer");
            return None;
        }
        if let Err(reason) =
            Self::check_message(&message).and_then(|()| self.check_state(from, &message))
        {
            self.reject(from, reason);
            return None;
        }
        if let Some(origin) = super::rounds::reply_origin(&message) {
            let origin = origin.clone();
            if !self.admit_reply(from, &origin) {
                return None;
            }
            return self.record_reply(from, message);
        }
        match message {
            Message::ViewAck { incarnation, gen } => self.on_view_ack(from, incarnation, gen),
            Message::StateRequest { rejoin, after, membership } => {
                self.on_fence(from, rejoin);
                self.compare_configured(from, &membership);
                // The asker's membership first: what this node acknowledges from now on
                // reaches a round only under it (a change's fence, `membership.rs`).
                self.take_membership(membership);
                let page = self.state_page(rejoin, after);
                self.out.messages.push((from, page));
            }
            Message::StatePage { .. } => self.on_state_page(from, message),
            Message::MembershipNews { membership } => self.on_membership_news(from, membership),
            _ if self.rejoin.is_some() && !self.answers_while_rejoining(&message) => {
                self.counters.unanswered_rejoining += 1;
            }
            _ => {
                if let Some(reply) = self.serve(from, message) {
                    self.out.messages.push((from, reply));
                }
            }
        }
        None
    }

    /// What this node does with a peer's (or its own) request; `None` for messages that
    /// are not answered.
    pub(super) fn serve(&mut self, from: NodeId, message: Message) -> Option<Message> {
        match message {
            Message::Write { round, key, value, stamp, rmw, applied, query } => {
                self.serve_write(&key, value, stamp, rmw, applied);
                let delinquent = self.query(from, query);
                Some(Message::WriteAck { round, by: self.origin_for(from), delinquent })
            }
            Message::Read { round, key, query } => {
                let delinquent = self.query(from, query);
                let slot = self.keys.get(&key);
                let (value, stamp) =
                    slot.map_or((None, Stamp::ZERO), |s| (s.value.clone(), s.stamp));
                let made_by = slot.and_then(|s| s.made_by.clone());
                let by = self.origin_for(from);
                Some(Message::ReadReply { round, by, value, stamp, made_by, delinquent })
            }
            Message::SlowRelease { round, delinquent } => {
                self.serve_slow_release(delinquent);
                Some(Message::SlowReleaseAck { round, by: self.origin_for(from) })
            }
            Message::ResetBit { acquire, gen } => {
                self.serve_reset(from, acquire, gen);
                None
            }
            Message::Propose { round, key, ballot, rmw, query } => {
                Some(self.serve_propose(from, round, key, ballot, rmw, query))
            }
            Message::Accept { round, key, ballot, record, query } => {
                Some(self.serve_accept(from, round, key, ballot, record, query))
            }
            Message::SyncQuery { round, membership } => {
                self.serve_sync_query(from, round, membership)
            }
            Message::WriteAck { .. }
            | Message::ReadReply { .. }
            | Message::SlowReleaseAck { .. }
            | Message::Promise { .. }
            | Message::Accepted { .. }
            | Message::ViewAck { .. }
            | Message::StateRequest { .. }
            | Message::StatePage { .. }
            | Message::Synced { .. }
            | Message::MembershipNews { .. } => None,
        }
    }

    /// A write: applied if newer; the outcomes it carries recorded.
    fn serve_write(
        &mut self,
        key: &Key,
        value: Value,
        stamp: Stamp,
        rmw: Option<(RmwId, RmwOutcome)>,
        applied: Vec<(RmwId, RmwOutcome)>,
    ) {
        // A failure kept as a record (nothing written) did not make the value it carries
        // back.
        let maker = rmw.clone().filter(|(_, o)| o.wrote().is_some()).map(Box::new);
        self.apply(key, Some(value), stamp, maker);
        // An accepted record stays: a later proposer ignores it once its quorum holds a
        // value at least as new, and until then it is evidence that the request may have
        // been chosen.
        for (id, outcome) in rmw.into_iter().chain(applied) {
            self.record_outcome(key, id, outcome);
        }
    }

    /// A slow release: every node it names is delinquent here, a generation up.
    fn serve_slow_release(&mut self, delinquent: Vec<NodeId>) {
        for node in delinquent {
            if node == self.config.node {
                self.counters.self_delinquent += 1;
            }
            self.bits.insert(node, Bit::Set);
            let gen = self.gens.entry(node).or_default();
            *gen = gen.saturating_add(1);
        }
        assert_eq!(self.bits.len(), self.config.members.len(), "a bit of a non-member");
    }

    /// A reset of `from`'s bit by its acquire `acquire`: cleared if the bit names the
    /// acquire and no slow release set it again since (its generation is `gen`).
    fn serve_reset(&mut self, from: NodeId, acquire: u64, gen: u64) {
        let current = self.gens.get(&from).copied().unwrap_or(0);
        let paper = self.config.unsafe_paper_reset && gen == u64::MAX;
        let Some(bit) = self.bits.get_mut(&from) else { return };
        let named = matches!(bit, Bit::Transient(ids) if ids.contains(&acquire));
        if named && (gen == current || paper) {
            *bit = Bit::Clear;
            self.counters.resets += 1;
        }
    }

    /// A proposal: promised if its ballot is above every promise; answered with what the
    /// replica accepted, holds, and recorded of the request's session.
    fn serve_propose(
        &mut self,
        from: NodeId,
        round: u64,
        key: Key,
        ballot: Ballot,
        rmw: RmwId,
        query: Option<u64>,
    ) -> Message {
        let by = self.origin_for(from);
        let delinquent = self.query(from, query);
        // The request's outcome if it was done here, or a later one of its session (which
        // tells the proposer that its own is no longer kept). (On another key with the
        // same number: the client used the number for another command, which the proposer
        // tells by the digest.)
        let outcome = self
            .outcomes
            .get(&(rmw.node, rmw.session))
            .filter(|(_, o)| o.seq >= rmw.seq)
            .map(|(_, o)| o.clone());
        let slot = self.keys.entry(key).or_default();
        let held = slot.promised;
        // This node's own proposal asked again (its rounds are asked again when it takes a
        // membership) is granted again: a proposer's own promise is in every quorum it
        // counts, which is how its session's earlier writes of the key reach its read.
        let again = from == self.config.node && ballot == slot.promised;
        let ok = ballot > slot.promised || again;
        if ok {
            slot.promised = ballot;
        }
        assert!(slot.promised >= held, "a promise went back");
        assert!(!ok || slot.promised == ballot, "a promise not the ballot granted");
        Message::Promise {
            round,
            by,
            ok,
            promised: slot.promised,
            accepted: slot.accepted.clone(),
            value: slot.value.clone(),
            stamp: slot.stamp,
            outcome,
            made_by: slot.made_by.clone(),
            delinquent,
        }
    }

    /// An accept: taken if its ballot is not below the promise (or it is this replica's
    /// own acceptance again); what the record builds on and settles recorded done.
    fn serve_accept(
        &mut self,
        from: NodeId,
        round: u64,
        key: Key,
        ballot: Ballot,
        record: RmwRecord,
        query: Option<u64>,
    ) -> Message {
        let by = self.origin_for(from);
        let members = self.membership.epoch;
        let slot = self.keys.entry(key.clone()).or_default();
        let held = slot.promised;
        // Memberships only move forward: an acceptance was made under one taken already.
        assert!(
            slot.accepted_here.is_none_or(|made| made <= members),
            "an acceptance made under membership {:?}, ahead of {members}",
            slot.accepted_here
        );
        // The same acceptance again (its answer was lost): answered as before, even after
        // a higher promise, if this node made it, and made it under the membership in
        // force. One made under an earlier membership, answered again under a later one,
        // would count towards a quorum of the later one, though a higher proposal may
        // have been promised since by a quorum of the earlier one that holds neither the
        // acceptance nor its proposer (the straddling change, seed 740000321: two CASes
        // chosen on one read).
        let again = slot.accepted_here == Some(members)
            && slot.accepted.as_ref().is_some_and(|(b, r)| *b == ballot && *r == record);
        let ok = ballot >= slot.promised || again;
        let base = record.base.clone();
        let settled = record.settled.clone();
        if ok && !again {
            slot.promised = ballot;
            slot.accepted = Some((ballot, record));
            slot.accepted_here = Some(members);
        }
        let promised = slot.promised;
        assert!(promised >= held, "a promise went back");
        if ok {
            // The record builds on a committed read-modify-write: committed means chosen,
            // so remember it done here too (its commit may so far have reached only the
            // replica the proposer read it from).
            if let Some(base) = base {
                let (id, outcome) = *base;
                self.record_outcome(&key, id, outcome);
            }
            // So are the records that one carried: chosen with it (the record names them
            // as `settled`).
            for (id, outcome) in settled {
                self.record_outcome(&key, id, outcome);
            }
        }
        let delinquent = if ok { self.query(from, query) } else { None };
        Message::Accepted { round, by, ok, promised, delinquent }
    }
}
