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
use keel_core::kite::{Config, KiteEngine, KiteOp, KiteReply, KiteRequest, Message, RmwId, Stamp};
use keel_types::{Epoch, LogIndex, NoRecord, NodeId, SnapshotMeta};
use std::collections::BTreeMap;

/// What the world checks of a Kite keyspace: a read-modify-write is committed at one
/// stamp, whichever node commits it and however often (a commit at a second stamp is a
/// request applied twice, the exactly-once rule of `docs/kite.md`, Retries).
#[derive(Debug, Default)]
pub struct KiteWatch {
    /// The stamp each request was first committed at.
    commits: BTreeMap<RmwId, Stamp>,
    violations: Vec<Violation>,
    /// Kite has no leaders: always empty.
    leading: BTreeMap<NodeId, Epoch>,
    preconditions: BTreeMap<&'static str, u64>,
}

impl KiteWatch {
    /// Requests committed so far.
    pub fn commits(&self) -> usize {
        self.commits.len()
    }

    fn committed(&mut self, node: NodeId, id: RmwId, stamp: Stamp, at_ns: u64) {
        let first = *self.commits.entry(id).or_insert(stamp);
        if first != stamp && self.violations.len() < VIOLATIONS_MAX {
            let detail = format!("{node} commits {id:?} at {stamp:?}, committed at {first:?}");
            self.violations.push(Violation { kind: "exactly-once", at_ns, detail });
        }
    }
}

impl Watch<KiteEngine> for KiteWatch {
    type Seen = ();

    fn new() -> KiteWatch {
        KiteWatch::default()
    }

    fn see(_engine: &KiteEngine) {}

    fn stepped(&mut self, node: NodeId, out: &OutputsOf<KiteEngine>, at_ns: u64) {
        for (_, message) in &out.messages {
            if let Message::Write { rmw: Some(commit), applied, .. } = message {
                for (id, outcome) in std::iter::once(commit).chain(applied) {
                    self.committed(node, *id, outcome.stamp, at_ns);
                }
            }
        }
    }

    fn observe(&mut self, _node: NodeId, _seen: &(), _synced: LogIndex, _at_ns: u64) {}

    fn recover(&mut self, _node: NodeId, _snapshot: Option<SnapshotMeta>, _entries: &[NoRecord]) {}

    fn epoch_at(&self, _node: NodeId, _index: LogIndex) -> Option<Epoch> {
        None
    }

    fn leading(&self) -> &BTreeMap<NodeId, Epoch> {
        &self.leading
    }

    fn preconditions(&self) -> &BTreeMap<&'static str, u64> {
        &self.preconditions
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
        MessageFacts {
            epoch: Epoch(0),
            grants_vote: false,
            asks_vote: false,
            asks_pre_vote: false,
            claims_persisted: None,
            entries: &[],
        }
    }

    fn across(message: &Message) -> Result<(Message, usize), String> {
        crate::codec::across::<Self>(message)
    }

    /// Kite's safety reads no clock; its timeouts (retransmission, release) tolerate any
    /// drift the world draws. The leader engine's ceiling keeps the clocks comparable.
    fn drift_bound_ppm(_config: &Config) -> u32 {
        100_000
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
