//! The network model: per-link latency, loss, duplication, reordering (from latency
//! jitter) and partitions, including asymmetric ones. Every draw comes from the
//! network's own PRNG stream, so one seed gives one schedule of deliveries.

use crate::rng::Rng;
use keel_types::NodeId;
use std::collections::{BTreeMap, BTreeSet};

/// How the network behaves, drawn once per run from the seed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetConfig {
    /// Shortest base one-way latency of a link.
    pub latency_ns_min: u64,
    /// Longest base one-way latency of a link (exclusive).
    pub latency_ns_max: u64,
    /// Extra random delay per message, uniform in `[0, jitter_ns_max)`; reorders messages.
    pub jitter_ns_max: u64,
    /// Probability that a message is lost, in parts per million.
    pub loss_ppm: u32,
    /// Probability that a message is delivered twice, in parts per million.
    pub duplicate_ppm: u32,
    /// Most messages in flight at once; past it new messages are dropped (a full queue).
    pub messages_in_flight_max: usize,
    /// Probability that a message stalls, in parts per million: it arrives
    /// [`STALL_NS_MIN`] to `stall_ns_max` late, as behind a TCP retransmission timeout or
    /// a paused sender, while later messages on the link overtake it.
    pub stall_ppm: u32,
    /// The longest stall.
    pub stall_ns_max: u64,
}

/// The shortest stall of a stalled message (100 ms: a retransmission timeout, far past
/// every latency and jitter the models draw).
pub const STALL_NS_MIN: u64 = 100_000_000;

impl NetConfig {
    /// A perfect network: zero latency, no loss, no duplication.
    pub fn perfect() -> NetConfig {
        NetConfig {
            latency_ns_min: 0,
            latency_ns_max: 1,
            jitter_ns_max: 1,
            loss_ppm: 0,
            duplicate_ppm: 0,
            messages_in_flight_max: 100_000,
            stall_ppm: 0,
            stall_ns_max: STALL_NS_MIN + 1,
        }
    }

    /// A LAN-like network with the given loss and duplication.
    pub fn lan(loss_ppm: u32, duplicate_ppm: u32) -> NetConfig {
        NetConfig {
            latency_ns_min: 100_000,
            latency_ns_max: 1_000_000,
            jitter_ns_max: 500_000,
            loss_ppm,
            duplicate_ppm,
            messages_in_flight_max: 100_000,
            stall_ppm: 0,
            stall_ns_max: STALL_NS_MIN + 1,
        }
    }
}

/// Counters for the run report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetStats {
    /// Messages handed to the network.
    pub sent: u64,
    /// Messages lost by the loss model or a full queue.
    pub dropped: u64,
    /// Extra copies delivered.
    pub duplicated: u64,
    /// Messages discarded because their link was cut when they arrived.
    pub partitioned: u64,
    /// Messages that stalled (arrived at least [`STALL_NS_MIN`] late).
    pub stalled: u64,
}

/// The simulated network between nodes.
#[derive(Clone, Debug)]
pub struct Network {
    config: NetConfig,
    rng: Rng,
    /// Base latency of each directed link, drawn on first use.
    link_latency_ns: BTreeMap<(NodeId, NodeId), u64>,
    /// Directed links that are cut: `(from, to)`.
    cut: BTreeSet<(NodeId, NodeId)>,
    /// Directed links that are stalled, and until when (virtual ns): what is sent on them
    /// meanwhile arrives only after, in order (a TCP connection waiting out a
    /// retransmission timeout).
    stalled_links: BTreeMap<(NodeId, NodeId), u64>,
    in_flight: usize,
    /// Counters.
    pub stats: NetStats,
}

impl Network {
    /// A network with its own PRNG stream.
    pub fn new(config: NetConfig, rng: Rng) -> Network {
        assert!(config.latency_ns_max > config.latency_ns_min, "empty latency range");
        assert!(config.jitter_ns_max > 0, "jitter range must be non-empty");
        assert!(config.stall_ns_max > STALL_NS_MIN, "empty stall range");
        Network {
            config,
            rng,
            link_latency_ns: BTreeMap::new(),
            cut: BTreeSet::new(),
            stalled_links: BTreeMap::new(),
            in_flight: 0,
            stats: NetStats::default(),
        }
    }

    /// Decides the fate of one message sent `from` → `to`: returns the delays after which
    /// copies arrive (none: lost; two: duplicated). The caller schedules the deliveries
    /// and calls [`Network::arrived`] once per copy.
    pub fn send(&mut self, from: NodeId, to: NodeId) -> Vec<u64> {
        assert_ne!(from, to, "a node does not message itself");
        self.stats.sent += 1;
        if self.in_flight >= self.config.messages_in_flight_max
            || self.rng.chance(self.config.loss_ppm)
        {
            self.stats.dropped += 1;
            return Vec::new();
        }
        let copies = if self.rng.chance(self.config.duplicate_ppm) { 2 } else { 1 };
        self.stats.duplicated += copies - 1;
        let base = self.link_latency(from, to);
        let mut delays: Vec<u64> =
            (0..copies).map(|_| base + self.rng.range(0, self.config.jitter_ns_max)).collect();
        // Drawn only where stalls are on, so runs without them keep their schedules.
        if self.config.stall_ppm > 0 && self.rng.chance(self.config.stall_ppm) {
            delays[0] += self.rng.range(STALL_NS_MIN, self.config.stall_ns_max);
            self.stats.stalled += 1;
        }
        self.in_flight += delays.len();
        delays
    }

    /// One more copy on its way, scheduled by the caller (a targeted fault's late copy);
    /// it calls [`Network::arrived`] for it as for any other.
    pub fn add_copy(&mut self) {
        self.in_flight += 1;
        self.stats.duplicated += 1;
    }

    /// A copy reached the far end; whether it may be delivered (its link is not cut).
    pub fn arrived(&mut self, from: NodeId, to: NodeId) -> bool {
        assert!(self.in_flight > 0, "arrival without a message in flight");
        self.in_flight -= 1;
        if self.cut.contains(&(from, to)) {
            self.stats.partitioned += 1;
            return false;
        }
        true
    }

    /// Cuts every link from a node of `from` to a node of `to` (one direction only).
    pub fn cut_one_way(&mut self, from: &[NodeId], to: &[NodeId]) {
        for a in from {
            for b in to {
                if a != b {
                    self.cut.insert((*a, *b));
                }
            }
        }
    }

    /// Cuts both directions between the two groups.
    pub fn partition(&mut self, side_a: &[NodeId], side_b: &[NodeId]) {
        self.cut_one_way(side_a, side_b);
        self.cut_one_way(side_b, side_a);
    }

    /// Isolates `node` from every node in `all`, both ways.
    pub fn isolate(&mut self, node: NodeId, all: &[NodeId]) {
        self.partition(&[node], all);
    }

    /// Restores the one directed link `from -> to`.
    pub fn uncut(&mut self, from: NodeId, to: NodeId) {
        self.cut.remove(&(from, to));
    }

    /// A message's ordinary delay on `from -> to` (the link's latency and a jitter), for
    /// one the network already took and delivers whatever happens to the link meanwhile
    /// (a held link's, let go: bytes already in the receiver's socket).
    pub fn delay(&mut self, from: NodeId, to: NodeId) -> u64 {
        self.link_latency(from, to) + self.rng.range(0, self.config.jitter_ns_max)
    }

    /// Loses nothing and stalls nothing more from now on (a run's quiet end, before its
    /// final reads); duplication and latency stay.
    pub fn calm(&mut self) {
        self.config.loss_ppm = 0;
        self.config.stall_ppm = 0;
    }

    /// Restores every link (stalled links run out by themselves).
    pub fn heal(&mut self) {
        self.cut.clear();
    }

    /// Stalls the directed link until `until_ns`.
    pub fn stall_link(&mut self, from: NodeId, to: NodeId, until_ns: u64) {
        let until = self.stalled_links.entry((from, to)).or_default();
        *until = (*until).max(until_ns);
    }

    /// Until when the directed link is stalled, if it is at `now_ns`.
    pub fn link_stalled_until(&self, from: NodeId, to: NodeId, now_ns: u64) -> Option<u64> {
        self.stalled_links.get(&(from, to)).copied().filter(|until| *until > now_ns)
    }

    /// Whether the directed link is cut now.
    pub fn is_cut(&self, from: NodeId, to: NodeId) -> bool {
        self.cut.contains(&(from, to))
    }

    /// Messages in flight now.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Sets the base one-way latency of the directed link `from -> to` (a wide-area
    /// link between data centers, say), in place of a draw.
    pub fn set_latency(&mut self, from: NodeId, to: NodeId, ns: u64) {
        self.link_latency_ns.insert((from, to), ns);
    }

    fn link_latency(&mut self, from: NodeId, to: NodeId) -> u64 {
        let (low, high) = (self.config.latency_ns_min, self.config.latency_ns_max);
        let rng = &mut self.rng;
        *self.link_latency_ns.entry((from, to)).or_insert_with(|| rng.range(low, high))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stalled_link_holds_one_direction_until_its_end() {
        let mut net = Network::new(NetConfig::perfect(), Rng::new(1));
        let (a, b) = (NodeId(1), NodeId(2));
        net.stall_link(a, b, 500);
        net.stall_link(a, b, 300); // a shorter stall does not cut the longer one short
        assert_eq!(net.link_stalled_until(a, b, 100), Some(500));
        assert_eq!(net.link_stalled_until(b, a, 100), None, "the other direction flows");
        assert_eq!(net.link_stalled_until(a, b, 500), None, "over at its end");
        net.heal();
        assert_eq!(net.link_stalled_until(a, b, 100), Some(500), "healing ends cuts only");
    }

    #[test]
    fn lossy_network_loses_and_duplicates_some_messages() {
        let mut net = Network::new(NetConfig::lan(200_000, 200_000), Rng::new(9));
        let mut copies = 0;
        for _ in 0..1000 {
            let delays = net.send(NodeId(1), NodeId(2));
            for d in &delays {
                assert!(*d >= 100_000 && *d < 1_500_000);
            }
            copies += delays.len();
        }
        assert!(net.stats.dropped > 100 && net.stats.duplicated > 100);
        assert_eq!(net.in_flight(), copies);
    }

    #[test]
    fn one_way_cut_blocks_only_its_direction_until_healed() {
        let mut net = Network::new(NetConfig::perfect(), Rng::new(1));
        net.cut_one_way(&[NodeId(1)], &[NodeId(2)]);
        assert_eq!(net.send(NodeId(1), NodeId(2)).len(), 1);
        assert!(!net.arrived(NodeId(1), NodeId(2)));
        assert_eq!(net.send(NodeId(2), NodeId(1)).len(), 1);
        assert!(net.arrived(NodeId(2), NodeId(1)));
        net.heal();
        assert!(!net.is_cut(NodeId(1), NodeId(2)));
        assert_eq!(net.stats.partitioned, 1);
    }

    #[test]
    fn full_queue_drops_new_messages() {
        let mut config = NetConfig::perfect();
        config.messages_in_flight_max = 2;
        let mut net = Network::new(config, Rng::new(1));
        assert_eq!(net.send(NodeId(1), NodeId(2)).len(), 1);
        assert_eq!(net.send(NodeId(1), NodeId(2)).len(), 1);
        assert!(net.send(NodeId(1), NodeId(2)).is_empty());
        assert_eq!(net.stats.dropped, 1);
    }
}
