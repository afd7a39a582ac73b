//! The geo engine in the one simulated world (`crate::world::World`): what the world
//! needs of a geo engine ([`SimEngine`]) and what it watches of a geo keyspace
//! ([`GeoWatch`]): every transaction the replicas exchanged, and when each data center
//! came to store each origin's transactions, for the causal checker's history.

use crate::engine::{MessageFacts, SimEngine, Watch};
use crate::invariants::Violation;
use keel_check::causal::history::{Committed, Stored};
use keel_core::engine::{OutputsOf, RequestTag};
use keel_core::geo::{
    Body, Config, GeoEngine, GeoReply, GeoRequest, Member, Message, TxId, Vector,
};
use keel_types::{Epoch, LogIndex, NoRecord, NodeId};
use std::collections::{BTreeMap, BTreeSet};

/// What the world watches of a geo keyspace.
#[derive(Debug, Default)]
pub struct GeoWatch {
    /// Every update transaction some replica replicated or forwarded, its updates of each
    /// partition merged.
    pub committed: BTreeMap<TxId, Committed>,
    /// The partitions whose updates of each transaction were merged, by their first key.
    merged: BTreeMap<TxId, BTreeSet<keel_types::Key>>,
    /// Per (data center, origin): the highest timestamp it was seen to store.
    reached: BTreeMap<(u32, u32), u64>,
    /// When each data center came to store each origin's transactions.
    pub stored: Vec<Stored>,
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
    type Seen = (Member, Vector);

    fn new() -> GeoWatch {
        GeoWatch::default()
    }

    fn see(engine: &GeoEngine) -> Self::Seen {
        (engine.place(), engine.status().stable)
    }

    fn stepped(&mut self, _node: NodeId, out: &OutputsOf<GeoEngine>, _at_ns: u64) {
        for (_, message) in &out.messages {
            for body in &message.bodies {
                let Body::Replicate { origin, txs } = body else { continue };
                for tx in txs {
                    // A partition's updates of a transaction are the same wherever they
                    // are sent from, and its keys are no other partition's: the first
                    // key names them.
                    let Some((first, _)) = tx.writes.first() else { continue };
                    if !self.merged.entry(tx.tx).or_default().insert(first.clone()) {
                        continue;
                    }
                    let entry = self.committed.entry(tx.tx).or_insert_with(|| Committed {
                        id: history_tx(tx.tx),
                        origin: *origin,
                        commit: history_vector(&tx.commit),
                        writes: Vec::new(),
                    });
                    entry.writes.extend(tx.writes.iter().map(|(k, u)| {
                        (crate::geo::world::text(k), crate::geo::world::history_update(u))
                    }));
                }
            }
        }
    }

    fn observe(&mut self, _node: NodeId, seen: &Self::Seen, _synced: LogIndex, at_ns: u64) {
        let (member, stable) = seen;
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
        Vec::new()
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
        ]
    }
}
