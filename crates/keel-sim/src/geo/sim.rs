//! The geo engine in the one simulated world (`crate::world::World`): what the world
//! needs of a geo engine ([`SimEngine`]) and what it watches of a geo keyspace
//! ([`GeoWatch`]): every transaction the replicas exchanged, and when each data center
//! came to store each origin's transactions, for the causal checker's history.

use crate::engine::{MessageFacts, SimEngine, Watch};
use crate::invariants::Violation;
use keel_check::causal::history::{Committed, Stored};
use keel_core::engine::{OutputsOf, RequestTag};
use keel_core::geo::{
    Body, Config, GeoEngine, GeoReply, GeoRequest, Member, Message, Record, Replicated, TxId,
    Update, Vector,
};
use keel_types::{LogIndex, NoRecord, NodeId};
use std::collections::{BTreeMap, BTreeSet};

/// A strong transaction as the certification logs showed it.
#[derive(Debug, Default)]
pub struct StrongSeen {
    /// Its data center.
    origin: u32,
    /// Its snapshot.
    snap: Option<Vector>,
    /// Each partition's updates, by the partition's first key.
    parts: BTreeMap<keel_types::Key, Vec<(keel_types::Key, Update)>>,
    /// Its strong timestamp, once some leader logged it committed.
    ts: Option<u64>,
}

/// What the world watches of a geo keyspace.
#[derive(Debug, Default)]
pub struct GeoWatch {
    /// Every strong transaction some certification log voted to commit.
    pub strong: BTreeMap<TxId, StrongSeen>,
    /// Every update transaction some replica replicated or forwarded, its updates of each
    /// partition merged.
    pub committed: BTreeMap<TxId, Committed>,
    /// The partitions whose updates of each transaction were merged, by their first key.
    merged: BTreeMap<TxId, BTreeSet<keel_types::Key>>,
    /// Per (data center, origin): the highest timestamp it was seen to store.
    reached: BTreeMap<(u32, u32), u64>,
    /// When each data center came to store each origin's transactions.
    pub stored: Vec<Stored>,
    /// How some partition decided each strong transaction (commit or abort).
    decided: BTreeMap<TxId, bool>,
    /// Decisions that disagree.
    violations: Vec<Violation>,
    /// `(at_ns, sender)` of each vote to commit a transaction of several participants
    /// that a leader sent another participant's leader (the stalled leaders' fault fails
    /// data center 0 once one of its leaders sent one).
    pub votes_out: Vec<(u64, NodeId)>,
    /// Whether to keep every node's stable and uniform entries as they rise (the
    /// benchmark of visibility; off in ordinary runs).
    pub per_node: bool,
    /// Per node: `(origin, through, at_ns)` each time its stable entry rose.
    pub node_stable: BTreeMap<NodeId, Vec<(u32, u64, u64)>>,
    /// Per node: `(origin, through, at_ns)` each time its uniform entry rose.
    pub node_uniform: BTreeMap<NodeId, Vec<(u32, u64, u64)>>,
    /// Per node: the last stable and uniform vectors seen.
    last: BTreeMap<NodeId, (Vector, Vector)>,
}

impl GeoWatch {
    fn per_node_rises(&mut self, node: NodeId, stable: &Vector, uniform: &Vector, at_ns: u64) {
        let zero = || (Vector::zero(stable.dcs.len()), Vector::zero(stable.dcs.len()));
        let (last_stable, last_uniform) = self.last.entry(node).or_insert_with(zero);
        for (o, (&now, was)) in stable.dcs.iter().zip(&mut last_stable.dcs).enumerate() {
            if now > *was {
                *was = now;
                self.node_stable.entry(node).or_default().push((o as u32, now, at_ns));
            }
        }
        for (o, (&now, was)) in uniform.dcs.iter().zip(&mut last_uniform.dcs).enumerate() {
            if now > *was {
                *was = now;
                self.node_uniform.entry(node).or_default().push((o as u32, now, at_ns));
            }
        }
    }
}

impl GeoWatch {
    /// Merges one partition's updates of committed transactions of data center `origin`
    /// into the record of what committed.
    pub fn merge_committed(&mut self, origin: u32, txs: &[Replicated]) {
        for tx in txs {
            // A partition's updates of a transaction are the same wherever they are sent
            // from, and its keys are no other partition's: the first key names them.
            let Some((first, _)) = tx.writes.first() else { continue };
            if !self.merged.entry(tx.tx).or_default().insert(first.clone()) {
                continue;
            }
            let entry = self.committed.entry(tx.tx).or_insert_with(|| Committed {
                id: history_tx(tx.tx),
                origin,
                commit: history_vector(&tx.commit),
                writes: Vec::new(),
                strong: false,
            });
            entry.writes.extend(
                tx.writes.iter().map(|(k, u)| {
                    (crate::geo::world::text(k), crate::geo::world::history_update(u))
                }),
            );
        }
    }

    /// Notes the strong transactions' votes to commit and decisions in `records`, and
    /// checks that every partition decides a transaction the same way (two-phase
    /// commit's agreement: a decision needs every vote to commit, or one vote to abort,
    /// and a vote sent is durable; so even a leader's decision lost with it agrees).
    fn strong_records(&mut self, records: &[Record], at_ns: u64) {
        for record in records {
            if let Record::Decide { tx, commit, .. } = record {
                let first = *self.decided.entry(*tx).or_insert(*commit);
                if first != *commit {
                    self.violations.push(Violation {
                        kind: "strong-agreement",
                        at_ns,
                        detail: format!("strong transaction {tx:?} decided both commit and abort"),
                    });
                }
            }
            match record {
                Record::Vote { candidate, ok: true, .. } => {
                    let Some((first, _)) = candidate.writes.first() else { continue };
                    let seen = self.strong.entry(candidate.tx).or_default();
                    seen.origin = candidate.origin;
                    seen.snap = Some(candidate.snap.clone());
                    seen.parts.entry(first.clone()).or_insert_with(|| candidate.writes.clone());
                }
                Record::Decide { tx, commit: true, ts } => {
                    self.strong.entry(*tx).or_default().ts = Some(*ts);
                }
                _ => {}
            }
        }
    }

    /// The largest strong timestamp of an update transaction some leader logged
    /// committed (0: none).
    pub fn last_strong_commit(&self) -> u64 {
        let updates = self.strong.values().filter(|seen| seen.snap.is_some());
        updates.filter_map(|seen| seen.ts).max().unwrap_or(0)
    }

    /// The strong update transactions the certification logs show committed.
    pub fn strong_committed(&self) -> Vec<Committed> {
        self.strong
            .iter()
            .filter_map(|(tx, seen)| {
                let (ts, snap) = (seen.ts?, seen.snap.as_ref()?);
                let mut commit = snap.clone();
                commit.strong = ts;
                let writes = seen
                    .parts
                    .values()
                    .flatten()
                    .map(|(k, u)| {
                        (crate::geo::world::text(k), crate::geo::world::history_update(u))
                    })
                    .collect();
                Some(Committed {
                    id: history_tx(*tx),
                    origin: seen.origin,
                    commit: history_vector(&commit),
                    writes,
                    strong: true,
                })
            })
            .collect()
    }
}

/// A geo transaction id in the history's terms.
pub fn history_tx(tx: TxId) -> keel_check::causal::history::TxId {
    keel_check::causal::history::TxId { node: tx.node, seq: tx.seq }
}

/// A vector in the history's terms: the data centers' entries, then the strong one.
pub fn history_vector(v: &Vector) -> Vec<u64> {
    v.flat()
}

impl Watch<GeoEngine> for GeoWatch {
    type Seen = (Member, Vector, Vector);

    fn new() -> GeoWatch {
        GeoWatch::default()
    }

    fn see(engine: &GeoEngine) -> Self::Seen {
        let status = engine.status();
        (engine.place(), status.stable, status.uniform)
    }

    fn stepped(&mut self, node: NodeId, out: &OutputsOf<GeoEngine>, at_ns: u64) {
        for (_, message) in &out.messages {
            for body in &message.bodies {
                if let Body::Append { records, .. } = body {
                    self.strong_records(records, at_ns);
                }
                if let Body::Vote { ok: true, answer: false, participants, .. } = body {
                    if participants.len() > 1 {
                        self.votes_out.push((at_ns, node));
                    }
                }
                let Body::Replicate { origin, txs } = body else { continue };
                self.merge_committed(*origin, txs);
            }
        }
    }

    fn observe(&mut self, node: NodeId, seen: &Self::Seen, _synced: LogIndex, at_ns: u64) {
        let (member, stable, uniform) = seen;
        if self.per_node {
            self.per_node_rises(node, stable, uniform, at_ns);
        }
        for (origin, &through) in stable.dcs.iter().enumerate() {
            let key = (member.dc, origin as u32);
            let reached = self.reached.entry(key).or_default();
            if through > *reached {
                *reached = through;
                self.stored.push(Stored { dc: member.dc, origin: origin as u32, through, at_ns });
            }
        }
    }

    fn take_violations(&mut self) -> Vec<Violation> {
        std::mem::take(&mut self.violations)
    }
}

impl SimEngine for GeoEngine {
    type Watch = GeoWatch;

    fn configure(
        template: &Config,
        node: NodeId,
        _members: Vec<NodeId>,
        _keyspace: u32,
        _spread_leaders: bool,
    ) -> Config {
        let mut config = template.clone();
        config.node = node;
        config
    }

    fn set_wall_clock(config: &mut Config, origin_ms: u64) {
        config.wall_clock_origin_us = origin_ms.saturating_mul(1_000);
    }

    /// Geo messages carry no epoch, vote or log.
    fn facts(_message: &Message) -> MessageFacts<'_, NoRecord> {
        MessageFacts::none()
    }

    fn across(message: &Message) -> Result<(Message, usize), String> {
        crate::codec::across::<Self>(message)
    }

    /// Correctness reads no clock (`docs/geo.md`, *Timestamps*): clocks may drift far
    /// apart, which only slows visibility.
    fn drift_bound_ppm(_config: &Config) -> u32 {
        200_000
    }

    fn set_tag(request: &mut GeoRequest, tag: RequestTag) {
        request.tag = tag;
    }

    fn request_tag(request: &GeoRequest) -> RequestTag {
        request.tag
    }

    fn reply_tag(reply: &GeoReply) -> RequestTag {
        reply.tag
    }

    fn writes(_request: &GeoRequest) -> bool {
        true
    }

    fn path_counts(&self) -> Vec<(&'static str, u64)> {
        let c = self.status().counters;
        vec![
            ("read-waited", c.reads_waited),
            ("commit-waited", c.commits_waited),
            ("duplicate-dropped", c.duplicates),
            ("forwarded", c.forwarded),
            ("barrier-waited", c.barriers_waited),
            ("attach-waited", c.attaches_waited),
            ("retransmit", c.retransmits),
            ("collected", c.collected),
            ("tx-dropped", c.dropped),
            ("strong-aborted", c.strong_aborted),
            ("strong-barrier-waited", c.strong_barriers_waited),
            ("strong-delivered", c.strong_delivered),
            ("certification-election", c.elections),
            ("certification-takeover", c.takeovers),
            ("certification-stepped-down", c.stepped_down),
            ("resent-to-new-leader", c.resent_to_new_leader),
            ("leader-learned-from-sibling", c.leaders_learned_from_siblings),
            ("decision-reannounced", c.decisions_reannounced),
            ("outcome-forgotten", c.outcomes_forgotten),
            ("answered-forgotten", c.answered_forgotten),
            ("forgotten-taken", c.forgotten_taken),
            ("notice-rearmed", c.notices_rearmed),
            ("removal-told", c.removals_told),
            ("removal-committing", c.removals_committing),
            ("promise-asked", c.removal_asks),
            ("promise-aborted", c.removals_aborted),
            ("removal-found-made", c.removals_found_made),
            ("return-welcomed", c.returns_welcomed),
            ("join-heard", c.joins_heard),
            ("join-restarted", c.joins_restarted),
            ("begin-held", c.begins_held),
            ("catch-up-expired", c.catch_ups_expired),
            ("cut-made", c.cuts_made),
            ("cut-applied", c.cuts_applied),
            ("return-settled", c.returns_settled),
            ("old-life-dropped", c.old_life_dropped),
            ("copy-sent", c.copies_sent),
            ("copy-installed", c.copies_installed),
            ("stream-replayed", c.streams_replayed),
            ("stream-dropped", c.streams_dropped),
            ("back-heard", c.returns_back),
            ("stale-past-refused", c.stale_pasts_refused),
            ("lost-read-dropped", c.lost_reads_dropped),
            ("earlier-cut-taken", c.earlier_cuts_taken),
        ]
    }
}
