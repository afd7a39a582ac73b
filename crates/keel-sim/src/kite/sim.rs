//! Kite in the one simulated world (`crate::world::World`): what the world needs of a
//! Kite engine ([`SimEngine`]) and what it checks of a Kite keyspace ([`KiteWatch`]).
//!
//! In that world a Kite keyspace runs exactly as a leader keyspace does: the loop body
//! (`keel_exec::Replica`) over the write-ahead log on a simulated disk (its incarnation
//! is the hard state), every message through the Kite codec, the network's delays, loss,
//! duplication, stalls and partitions, the nodes' drifting clocks, crashes of every kind
//! and restarts as the next incarnation, link allowances and off-loop reads. The
//! engine's own `check_invariants` runs after every step; the watch adds what only the
//! whole cluster shows.

use crate::engine::{MessageFacts, SimEngine, Watch};
use crate::invariants::{Violation, VIOLATIONS_MAX};
use keel_core::engine::{OutputsOf, RequestTag};
use keel_core::kite::{
    Config, KiteEngine, KiteOp, KiteReply, KiteRequest, Message, RmwId, RmwOutcome,
};
use keel_types::{LogIndex, NoRecord, NodeId};
use std::collections::{BTreeMap, BTreeSet};

/// What the world checks of a Kite keyspace: a read-modify-write is committed at one
/// stamp, whichever node commits it and however often (a commit at a second stamp is a
/// request applied twice, the exactly-once rule of `docs/kite.md`, Retries). It also
/// keeps what the scenarios' histories need: every commit sent, and the id each started
/// request went by.
#[derive(Debug, Default)]
pub struct KiteWatch {
    /// Every read-modify-write some node committed (a commit is sent only once the record
    /// was chosen), as first committed: what a request whose node crashed before it could
    /// answer did.
    commits: BTreeMap<RmwId, RmwOutcome>,
    /// Requests found committed at a second stamp (applied twice), each reported once.
    double_commits: BTreeSet<RmwId>,
    /// The id each read-modify-write request went by, once started.
    rmw_ids: BTreeMap<RequestTag, RmwId>,
    violations: Vec<Violation>,
}

impl KiteWatch {
    /// Every request committed so far, as first committed.
    pub fn commits(&self) -> &BTreeMap<RmwId, RmwOutcome> {
        &self.commits
    }

    /// The id each started read-modify-write request went by.
    pub fn rmw_ids(&self) -> &BTreeMap<RequestTag, RmwId> {
        &self.rmw_ids
    }

    fn committed(&mut self, node: NodeId, id: RmwId, outcome: &RmwOutcome, at_ns: u64) {
        let first = self.commits.entry(id).or_insert_with(|| outcome.clone()).stamp;
        if first == outcome.stamp || !self.double_commits.insert(id) {
            return;
        }
        if self.violations.len() < VIOLATIONS_MAX {
            let stamp = outcome.stamp;
            let detail = format!("request {id:?} committed at {first:?} and at {stamp:?} ({node})");
            self.violations.push(Violation { kind: "exactly-once", at_ns, detail });
        }
    }
}

impl Watch<KiteEngine> for KiteWatch {
    type Seen = Vec<(RequestTag, RmwId)>;

    fn new() -> KiteWatch {
        KiteWatch::default()
    }

    fn see(engine: &KiteEngine) -> Self::Seen {
        engine.rmws_in_progress()
    }

    fn stepped(&mut self, node: NodeId, out: &OutputsOf<KiteEngine>, at_ns: u64) {
        for (_, message) in &out.messages {
            if let Message::Write { rmw: Some(commit), applied, .. } = message {
                for (id, outcome) in std::iter::once(commit).chain(applied) {
                    self.committed(node, *id, outcome, at_ns);
                }
            }
        }
    }

    fn observe(&mut self, _node: NodeId, seen: &Self::Seen, _synced: LogIndex, _at_ns: u64) {
        self.rmw_ids.extend(seen.iter().copied());
    }

    fn take_violations(&mut self) -> Vec<Violation> {
        std::mem::take(&mut self.violations)
    }
}

impl SimEngine for KiteEngine {
    type Watch = KiteWatch;

    fn configure(
        template: &Config,
        node: NodeId,
        members: Vec<NodeId>,
        _keyspace: u32,
        _spread_leaders: bool,
    ) -> Config {
        let mut config = template.clone();
        config.node = node;
        config.members = members;
        config
    }

    /// Kite's messages carry no epoch, vote or log: its incarnation (the hard state) is
    /// checked by the rejoin's fence, not by the world.
    fn facts(_message: &Message) -> MessageFacts<'_, NoRecord> {
        MessageFacts::none()
    }

    fn across(message: &Message) -> Result<(Message, usize), String> {
        crate::codec::across::<Self>(message)
    }

    /// Kite's safety reads no clock; its timeouts (retransmission, release) run on
    /// clocks within 200 ppm of true time (so within 400 ppm of each other), as crystal
    /// oscillators are.
    fn drift_bound_ppm(_config: &Config) -> u32 {
        400
    }

    fn set_tag(request: &mut KiteRequest, tag: RequestTag) {
        request.tag = tag;
    }

    fn request_tag(request: &KiteRequest) -> RequestTag {
        request.tag
    }

    fn reply_tag(reply: &KiteReply) -> RequestTag {
        reply.tag
    }

    fn writes(request: &KiteRequest) -> bool {
        !matches!(request.op, KiteOp::Read { .. })
    }

    fn connection(request: &KiteRequest) -> Option<u64> {
        Some(request.session)
    }

    fn answers(message: &Message) -> bool {
        matches!(
            message,
            Message::WriteAck { .. }
                | Message::ReadReply { .. }
                | Message::SlowReleaseAck { .. }
                | Message::Promise { .. }
                | Message::Accepted { .. }
        )
    }

    fn path_counts(&self) -> Vec<(&'static str, u64)> {
        let c = self.status().counters;
        vec![
            ("rejoin", c.rejoins),
            ("retransmit", c.retransmits),
            ("rmw", c.rmws),
            ("release-slow", c.releases_slow),
            ("rejoin-round-in-flight", c.replies_fenced),
        ]
    }
}
