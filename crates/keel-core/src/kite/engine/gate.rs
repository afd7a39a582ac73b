//! The validation gate: what a peer's message must satisfy before the replica sees it
//! (decoding checked its syntax). A message that breaks a rule is dropped with a reason
//! and counted, never a panic (`docs/protocol.md` §13).
//!
//! - [`KiteEngine::check_message`], stateless: what any Kite node would refuse (records
//!   not right after their base, stamps of no write, sets larger than any cluster).
//! - `check_state`, against this node's configuration and state: every stamp, ballot and
//!   request id names a member (or a client), counters far from saturating, keys and
//!   values within the limits, rejoin and view messages consistent with what this node
//!   sent.

use super::{Ballot, Cursor, KiteEngine, Message, NodeId, RmwId, RmwOutcome, RmwRecord};
use super::{SlotImage, Stamp, Value, MEMBERS_MAX, PAGE_ITEMS_MAX, SKIPPED_MAX};
use crate::engine::Rejection;
use crate::kite::types::Origin;
use keel_types::Limits;

/// Versions, rounds and read-modify-write counts far below where they would saturate: a
/// peer's huge value would otherwise pin this node's next ones at the ceiling, and make
/// them collide.
const COUNTER_MAX: u64 = 1 << 62;

/// What a failed check answers: the reason the message is dropped.
type Check = Result<(), &'static str>;

impl KiteEngine {
    /// The stateless half of the validation gate.
    pub fn check_message(message: &Message) -> Result<(), &'static str> {
        let record_ok = |r: &RmwRecord| r.well_formed();
        match message {
            Message::SlowRelease { delinquent, .. } if delinquent.len() > MEMBERS_MAX => {
                Err("delinquent set larger than any cluster")
            }
            Message::Accept { record, .. } if !record_ok(record) => {
                Err("read-modify-write not right after its base")
            }
            Message::Promise { accepted: Some((_, record)), .. } if !record_ok(record) => {
                Err("read-modify-write not right after its base")
            }
            // Only the commit of a failed read-modify-write of a key never written writes
            // the initial stamp: its record carries the stamp it read, and writes nothing.
            Message::Write { stamp, rmw, .. }
                if *stamp == Stamp::ZERO
                    && rmw.as_ref().is_none_or(|(_, o)| o.stamp != o.read_stamp) =>
            {
                Err("write with no stamp")
            }
            _ if super::rounds::reply_origin(message)
                .and_then(|o| o.view.as_ref())
                .is_some_and(|v| v.incarnations.len() > MEMBERS_MAX) =>
            {
                Err("view larger than any cluster")
            }
            _ => Ok(()),
        }
    }

    /// Drops a message, with the reason.
    pub(super) fn reject(&mut self, from: NodeId, reason: &'static str) {
        self.counters.rejected += 1;
        self.out.rejected.push(Rejection { from, reason });
    }

    /// The half of the gate that needs the configuration: sizes and members.
    pub(super) fn check_state(&self, from: NodeId, message: &Message) -> Check {
        let rules = Rules { engine: self, limits: &self.config.limits };
        if let Some(origin) = super::rounds::reply_origin(message) {
            rules.origin(origin)?;
        }
        match message {
            Message::Write { key, value, stamp, rmw, applied, .. } => {
                rules.sized(key, Some(value))?;
                rules.stamp(stamp)?;
                if applied.len() > SKIPPED_MAX + 1 {
                    return Err("too many records carried");
                }
                rmw.iter().chain(applied).try_for_each(|(i, o)| rules.carried(i, o))
            }
            Message::Read { key, .. } => rules.sized(key, None),
            Message::Propose { key, ballot, rmw, .. } => {
                rules.sized(key, None)?;
                rules.ballot(ballot)?;
                rules.id(rmw)
            }
            Message::Accept { key, record, ballot, .. } => {
                rules.sized(key, None)?;
                rules.ballot(ballot)?;
                rules.record(record)
            }
            Message::SlowRelease { delinquent, .. }
                if delinquent.iter().any(|d| self.index_of(*d).is_none()) =>
            {
                Err("delinquent set names a non-member")
            }
            Message::ReadReply { value, stamp, made_by, .. } => {
                rules.value_opt(value.as_ref())?;
                rules.stamp(stamp)?;
                made_by.as_ref().map_or(Ok(()), |m| rules.carried(&m.0, &m.1))
            }
            Message::Promise { .. } => rules.promise(message),
            Message::Accepted { promised, .. } if *promised != Ballot::default() => {
                rules.ballot(promised)
            }
            Message::StateRequest { rejoin, after, membership } => {
                if *rejoin >> 32 != u64::from(from.0) {
                    return Err("state request of another node's rejoin");
                }
                rules.membership(membership)?;
                rules.cursor(after)
            }
            Message::SyncQuery { membership, .. } | Message::MembershipNews { membership } => {
                rules.membership(membership)
            }
            Message::ViewAck { incarnation, gen } => self.check_view_ack(*incarnation, *gen),
            Message::StatePage { .. } => rules.state_page(message),
            _ => Ok(()),
        }
    }

    /// An acknowledgement of a view this node sent.
    fn check_view_ack(&self, incarnation: u32, gen: u64) -> Check {
        if incarnation > self.config.incarnation {
            return Err("acknowledges a view of a later incarnation");
        }
        if incarnation == self.config.incarnation && gen > self.view_gen {
            return Err("acknowledges a view never sent");
        }
        Ok(())
    }
}

/// The rules `check_state` applies to a message's parts, in the order it applies them
/// (the first broken one names the reason).
struct Rules<'a> {
    engine: &'a KiteEngine,
    limits: &'a Limits,
}

impl Rules<'_> {
    /// Whether a writer id (or a ballot's proposer) names a member.
    fn member(&self, writer: u64) -> bool {
        self.engine.index_of(NodeId((writer >> 32) as u32)).is_some()
    }

    /// A stamp names a member, or is the initial one (writer 0, version 0), which
    /// read-modify-writes of a never-written key build on.
    fn stamp(&self, s: &Stamp) -> Check {
        if s.version >= COUNTER_MAX || s.rmw >= COUNTER_MAX {
            return Err("counter out of range");
        }
        if (s.writer == 0 && s.version == 0) || self.member(s.writer) {
            Ok(())
        } else {
            Err("stamp of a non-member")
        }
    }

    fn id(&self, i: &RmwId) -> Check {
        if i.client_named() || self.member(i.node) {
            Ok(())
        } else {
            Err("request of a non-member")
        }
    }

    fn value(&self, v: &Value) -> Check {
        self.limits.check_value(v).map_err(|_| "value too large")
    }

    fn value_opt(&self, v: Option<&Value>) -> Check {
        v.map_or(Ok(()), |v| self.value(v))
    }

    fn sized(&self, key: &[u8], value: Option<&Value>) -> Check {
        self.limits.check_key(key).map_err(|_| "key too large")?;
        self.value_opt(value)
    }

    fn cursor(&self, cursor: &Cursor) -> Check {
        match cursor {
            Cursor::Key(key) => self.sized(key, None),
            _ => Ok(()),
        }
    }

    /// An outcome as a record makes it ([`RmwRecord::well_formed`]): written right after
    /// the stamp it read, or keeping it (a failure).
    fn outcome(&self, o: &RmwOutcome) -> Check {
        self.stamp(&o.stamp)?;
        self.stamp(&o.read_stamp)?;
        if o.stamp != o.read_stamp && o.stamp != o.read_stamp.next_rmw() {
            return Err("outcome not written after what it read");
        }
        self.value(&o.value)?;
        self.value_opt(o.read.as_ref())
    }

    /// A request's id with its outcome (carried by a write, a record, a maker).
    fn carried(&self, i: &RmwId, o: &RmwOutcome) -> Check {
        self.id(i)?;
        self.outcome(o)
    }

    fn record(&self, r: &RmwRecord) -> Check {
        self.stamp(&r.stamp)?;
        self.stamp(&r.read_stamp)?;
        self.value(&r.value)?;
        self.value_opt(r.read.as_ref())?;
        if r.skipped.len() > SKIPPED_MAX || r.settled.len() > SKIPPED_MAX {
            return Err("too many records carried");
        }
        self.id(&r.id)?;
        let carried = r.skipped.iter().chain(&r.settled);
        carried.chain(r.base.iter().map(|b| &**b)).try_for_each(|(i, o)| self.carried(i, o))
    }

    fn ballot(&self, b: &Ballot) -> Check {
        match (self.member(b.proposer), b.round < COUNTER_MAX) {
            (false, _) => Err("ballot of a non-member"),
            (true, false) => Err("counter out of range"),
            (true, true) => Ok(()),
        }
    }

    /// A ballot that is either the initial one or a member's.
    fn ballot_if_set(&self, b: &Ballot) -> Check {
        if *b == Ballot::default() {
            return Ok(());
        }
        self.ballot(b)
    }

    /// A reply's view names members only.
    fn origin(&self, origin: &Origin) -> Check {
        let Some(view) = &origin.view else { return Ok(()) };
        if view.incarnations.iter().any(|(node, _)| self.engine.index_of(*node).is_none()) {
            return Err("view names a non-member");
        }
        self.membership(&view.membership)
    }

    /// A membership: well formed, and its voters members.
    fn membership(&self, m: &crate::kite::types::Membership) -> Check {
        if !m.valid() {
            return Err("a membership not sorted, with repeats, or empty");
        }
        if m.voters.iter().chain(m.target()).any(|v| self.engine.index_of(*v).is_none()) {
            return Err("a membership names a non-member");
        }
        Ok(())
    }

    fn promise(&self, message: &Message) -> Check {
        let Message::Promise { value, stamp, accepted, promised, outcome, made_by, .. } = message
        else {
            unreachable!("a promise")
        };
        self.value_opt(value.as_ref())?;
        self.stamp(stamp)?;
        for o in outcome.iter().chain(made_by.iter().map(|m| &m.1)) {
            self.outcome(o)?;
        }
        if let Some(m) = made_by {
            self.id(&m.0)?;
        }
        self.ballot_if_set(promised)?;
        if let Some((b, r)) = accepted {
            self.ballot(b)?;
            self.record(r)?;
        }
        Ok(())
    }

    fn state_page(&self, message: &Message) -> Check {
        let Message::StatePage { after, slots, outcomes, bits, next, membership, .. } = message
        else {
            unreachable!("a state page")
        };
        self.membership(membership)?;
        if slots.len() + outcomes.len() > PAGE_ITEMS_MAX || bits.len() > MEMBERS_MAX {
            return Err("state page too large");
        }
        std::iter::once(after).chain(next.iter()).try_for_each(|c| self.cursor(c))?;
        slots.iter().try_for_each(|s| self.slot(s))?;
        for (id, key, o) in outcomes {
            self.sized(key, None)?;
            self.carried(id, o)?;
        }
        let stranger = |(node, _, gen): &(NodeId, bool, u64)| {
            self.engine.index_of(*node).is_none() || *gen >= COUNTER_MAX
        };
        if bits.iter().any(stranger) {
            return Err("bit of a non-member");
        }
        Ok(())
    }

    fn slot(&self, s: &SlotImage) -> Check {
        self.sized(&s.key, s.value.as_ref())?;
        self.stamp(&s.stamp)?;
        self.ballot_if_set(&s.promised)?;
        if let Some((b, r)) = &s.accepted {
            self.ballot(b)?;
            self.record(r)?;
            if !r.well_formed() {
                return Err("read-modify-write not right after its base");
            }
        }
        s.made_by.as_ref().map_or(Ok(()), |m| self.carried(&m.0, &m.1))
    }
}
