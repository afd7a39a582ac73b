//! The node's metrics, rendered by `/metrics` in the OpenMetrics text format (which
//! Prometheus reads) through `prometheus-client`'s encoder.
//!
//! Two scopes: [`Metrics`] for the node (connections, peer links, messages the validation
//! gate dropped) and [`KeyspaceMetrics`] for each keyspace (requests, latencies, fsyncs),
//! rendered with a `keyspace` label. Engine state (epoch, role, indexes, rounds, ...) is
//! read from each keyspace's engine when a scrape asks (`keel_core::engine::Report`) and
//! rendered by [`render`] with the same label. Values live behind std mutexes held for a
//! few instructions, never across an await.

use keel_core::engine::{MetricKind, Report};
use keel_types::{KeyspaceId, NodeId};
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Upper bounds of the latency buckets, in seconds (a `+Inf` bucket follows).
pub const LATENCY_BUCKETS_SECONDS: [f64; 14] =
    [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0];
/// Most distinct label sets per metric family (a bound on memory if labels misbehave).
pub const LABEL_SETS_MAX: usize = 256;
/// At most one warning per rejection reason per this long (the counter counts them all).
pub const REJECTION_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// A Prometheus histogram with fixed buckets, in atomics: recording takes no lock (it is
/// on every request's path, from every connection task).
#[derive(Debug, Default)]
pub struct Histogram {
    /// Count per bucket of [`LATENCY_BUCKETS_SECONDS`], then `+Inf`; not cumulative.
    buckets: [AtomicU64; LATENCY_BUCKETS_SECONDS.len() + 1],
    /// The sum of the observations, in nanoseconds.
    sum_nanos: AtomicU64,
}

/// A histogram as one scrape shows it.
#[derive(Debug, Default, Clone)]
struct HistogramState {
    /// Count per bucket of [`LATENCY_BUCKETS_SECONDS`], then `+Inf`; not cumulative.
    buckets: [u64; LATENCY_BUCKETS_SECONDS.len() + 1],
    sum: f64,
    count: u64,
}

impl Histogram {
    /// Records one observation in seconds.
    pub fn observe(&self, seconds: f64) {
        let i = LATENCY_BUCKETS_SECONDS.iter().position(|b| seconds <= *b);
        self.buckets[i.unwrap_or(LATENCY_BUCKETS_SECONDS.len())].fetch_add(1, Ordering::Relaxed);
        let nanos = (seconds.max(0.0) * 1e9) as u64;
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    fn snapshot(&self) -> HistogramState {
        let buckets = std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed));
        // The count is the buckets' sum, so the two always agree within one scrape.
        let count = buckets.iter().sum();
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        HistogramState { buckets, sum, count }
    }
}

/// The commands and classes a request's labels take, in the order of [`RequestSlots`].
const OPS: [&str; 9] =
    ["get", "put", "delete", "cas", "incr", "scan", "enqueue", "dequeue", "queue-peek"];
const CLASSES: [&str; 7] =
    ["default", "any", "monotonic", "linearizable", "memory", "replicated", "durable"];

/// Per `(op, class)`: successful requests and latency, in atomics (the common path).
#[derive(Debug, Default)]
struct RequestSlots {
    ok: [[AtomicU64; CLASSES.len()]; OPS.len()],
    latency: [[Histogram; CLASSES.len()]; OPS.len()],
}

impl RequestSlots {
    fn slot(label: OpLabel) -> Option<(usize, usize)> {
        let op = OPS.iter().position(|o| *o == label.op)?;
        let class = CLASSES.iter().position(|c| *c == label.class)?;
        Some((op, class))
    }
}

/// What one client request was, for its labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct OpLabel {
    /// The command (`get`, `put`, `delete`, `cas`, `incr`, `scan`).
    pub op: &'static str,
    /// The read level or durability asked for, or `default`.
    pub class: &'static str,
}

/// A keyspace's hash slot states, by slot (`keel_types::slots`).
pub type SlotStates = BTreeMap<u16, keel_types::slots::SlotState>;

/// One keyspace's metrics.
#[derive(Debug, Default)]
pub struct KeyspaceMetrics {
    /// Successful requests and latency by label (labels of known ops and classes).
    slots: RequestSlots,
    /// Requests by label and outcome when not counted in `slots` (errors, by their
    /// prefix; labels outside the known ops and classes).
    requests: Mutex<BTreeMap<(OpLabel, &'static str), u64>>,
    /// Latency by label, for labels outside the known ops and classes.
    latency: Mutex<BTreeMap<OpLabel, Histogram>>,
    /// Fsync latency on the storage thread.
    pub fsync_seconds: Histogram,
    /// From the engine asking for an fsync to that fsync's end (queueing included).
    pub sync_wait_seconds: Histogram,
    /// Latency inside the node of reads that waited for a durability round.
    pub round_read_seconds: Histogram,
    /// From a client request entering the engine's input queue to the loop taking it.
    pub input_wait_seconds: Histogram,
    /// Requests refused with `BUSY` because the engine's input queue was full.
    pub busy_refusals: AtomicU64,
    /// Reads answered off the engine loop (`docs/protocol.md` §7).
    pub reads_off_loop: AtomicU64,
    /// The leader this node's replica believes in and the epoch, kept together by the
    /// engine loop at each role change: where a placed cluster's redirects point, and
    /// what its leader notices say.
    role: Mutex<(Option<NodeId>, u64)>,
    /// The hash slot states this node's replica applied (`keel_types::slots`), and their
    /// generation: published by the engine loop after each step that changed them.
    hash_slots: Mutex<(u64, Arc<SlotStates>)>,
    /// What `calls_by_op` counted at the last `CONFIG RESETSTAT`, subtracted from what it
    /// shows since (the Prometheus counters never go back).
    stats_baseline: Mutex<BTreeMap<&'static str, (u64, u64)>>,
}

impl KeyspaceMetrics {
    /// The leader this node's replica believes in, if any.
    pub fn known_leader(&self) -> Option<NodeId> {
        self.known_role().0
    }

    /// The slot states this node's replica applied last (the loop publishes them).
    pub fn slot_states(&self) -> Arc<SlotStates> {
        self.hash_slots.lock().unwrap_or_else(|e| e.into_inner()).1.clone()
    }

    /// The generation of [`Self::slot_states`].
    pub fn slot_generation(&self) -> u64 {
        self.hash_slots.lock().unwrap_or_else(|e| e.into_inner()).0
    }

    /// Publishes the slot states the replica applied, at `generation`.
    pub fn set_slot_states(
        &self,
        generation: u64,
        states: Vec<(u16, keel_types::slots::SlotState)>,
    ) {
        let states = Arc::new(states.into_iter().collect());
        *self.hash_slots.lock().unwrap_or_else(|e| e.into_inner()) = (generation, states);
    }

    /// The leader this node's replica believes in, and the epoch it was reported in.
    pub fn known_role(&self) -> (Option<NodeId>, u64) {
        *self.role.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records the leader this node's replica believes in, in `epoch`.
    pub fn set_leader(&self, leader: Option<NodeId>, epoch: u64) {
        *self.role.lock().unwrap_or_else(|e| e.into_inner()) = (leader, epoch);
    }

    /// Per operation (`get`, `put`, ...): requests that succeeded and those that failed,
    /// over every class (what `INFO commandstats` shows).
    pub fn calls_by_op(&self) -> Vec<(&'static str, u64, u64)> {
        let baseline = self.stats_baseline.lock().expect("metrics lock");
        self.calls_since_start()
            .into_iter()
            .map(|(op, ok, failed)| {
                let (ok0, failed0) = baseline.get(op).copied().unwrap_or_default();
                (op, ok.saturating_sub(ok0), failed.saturating_sub(failed0))
            })
            .filter(|(_, ok, failed)| ok + failed > 0)
            .collect()
    }

    /// `CONFIG RESETSTAT`: `calls_by_op` counts from now on.
    pub fn reset_stats(&self) {
        let now = self.calls_since_start();
        let mut baseline = self.stats_baseline.lock().expect("metrics lock");
        *baseline = now.into_iter().map(|(op, ok, failed)| (op, (ok, failed))).collect();
    }

    fn calls_since_start(&self) -> Vec<(&'static str, u64, u64)> {
        let mut calls: BTreeMap<&'static str, (u64, u64)> = BTreeMap::new();
        for (op, row) in OPS.iter().zip(&self.slots.ok) {
            let ok: u64 = row.iter().map(|n| n.load(Ordering::Relaxed)).sum();
            calls.entry(op).or_default().0 += ok;
        }
        for ((label, outcome), n) in self.requests.lock().expect("metrics lock").iter() {
            let entry = calls.entry(label.op).or_default();
            if *outcome == "ok" {
                entry.0 += n;
            } else {
                entry.1 += n;
            }
        }
        calls
            .into_iter()
            .filter(|(_, (ok, failed))| ok + failed > 0)
            .map(|(op, (ok, failed))| (op, ok, failed))
            .collect()
    }

    /// Records a finished request.
    pub fn record(&self, label: OpLabel, outcome: &'static str, seconds: f64) {
        let slot = RequestSlots::slot(label);
        if let Some((op, class)) = slot {
            self.slots.latency[op][class].observe(seconds);
            if outcome == "ok" {
                self.slots.ok[op][class].fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        let mut requests = self.requests.lock().expect("metrics lock");
        if requests.len() < LABEL_SETS_MAX || requests.contains_key(&(label, outcome)) {
            *requests.entry((label, outcome)).or_default() += 1;
        }
        drop(requests);
        if slot.is_some() {
            return;
        }
        let mut latency = self.latency.lock().expect("metrics lock");
        if latency.len() < LABEL_SETS_MAX || latency.contains_key(&label) {
            latency.entry(label).or_default().observe(seconds);
        }
    }
}

/// Why a peer connection was closed or refused (`keel_peer_connections_closed_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkClosed {
    /// Its first bytes were not a Keel peer handshake.
    NotAHandshake,
    /// Another handshake version.
    HandshakeVersion,
    /// The hello named another receiver or a sender that is not a member.
    WrongNodes,
    /// A MAC did not verify: the other side does not know the cluster secret.
    BadProof,
    /// The connection failed during the handshake.
    HandshakeIo,
    /// The handshake took longer than `peer_handshake_timeout_ms`.
    HandshakeTimeout,
    /// Evicted from the full pool of `peer_pending_max` connections waiting for their
    /// hello, the oldest, when a new one arrived.
    TooManyPending,
    /// A newer connection with a verified hello from the same member displaced this one,
    /// still in its handshake.
    Displaced,
    /// A newer authenticated connection from the same member replaced it.
    Replaced,
    /// Nothing arrived for `peer_idle_timeout_ms`.
    Idle,
    /// A frame broke the framing rules (length, checksum, addresses).
    BadFrame,
}

impl LinkClosed {
    /// Every reason, in the order of the metric's samples.
    pub const ALL: [LinkClosed; 11] = [
        LinkClosed::NotAHandshake,
        LinkClosed::HandshakeVersion,
        LinkClosed::WrongNodes,
        LinkClosed::BadProof,
        LinkClosed::HandshakeIo,
        LinkClosed::HandshakeTimeout,
        LinkClosed::TooManyPending,
        LinkClosed::Displaced,
        LinkClosed::Replaced,
        LinkClosed::Idle,
        LinkClosed::BadFrame,
    ];

    /// The reason's label.
    pub fn as_str(self) -> &'static str {
        match self {
            LinkClosed::NotAHandshake => "not a handshake",
            LinkClosed::HandshakeVersion => "handshake version",
            LinkClosed::WrongNodes => "wrong nodes",
            LinkClosed::BadProof => "bad proof",
            LinkClosed::HandshakeIo => "handshake io",
            LinkClosed::HandshakeTimeout => "handshake timeout",
            LinkClosed::TooManyPending => "too many pending",
            LinkClosed::Displaced => "displaced",
            LinkClosed::Replaced => "replaced",
            LinkClosed::Idle => "idle",
            LinkClosed::BadFrame => "bad frame",
        }
    }
}

// The counters are indexed by `why as usize`: `ALL` lists the reasons in declaration order.
const _: () = {
    let mut i = 0;
    while i < LinkClosed::ALL.len() {
        assert!(LinkClosed::ALL[i] as usize == i, "LinkClosed::ALL is in declaration order");
        i += 1;
    }
};

impl From<crate::handshake::HandshakeError> for LinkClosed {
    fn from(e: crate::handshake::HandshakeError) -> Self {
        use crate::handshake::HandshakeError as E;
        match e {
            E::NotAHandshake => LinkClosed::NotAHandshake,
            E::Version => LinkClosed::HandshakeVersion,
            E::WrongNodes => LinkClosed::WrongNodes,
            E::BadProof => LinkClosed::BadProof,
        }
    }
}

/// The node's own metrics (beyond any keyspace).
#[derive(Debug, Default)]
pub struct Metrics {
    /// Peer messages handed to a connection.
    pub peer_sent: AtomicU64,
    /// Peer messages received and given to an engine.
    pub peer_received: AtomicU64,
    /// Peer messages dropped (full queue, broken connection, unknown keyspace).
    pub peer_dropped: AtomicU64,
    /// Client connections open now.
    pub connections_active: AtomicU64,
    /// Client connections refused (over `connections_max`).
    pub connections_refused: AtomicU64,
    /// Client connections closed because the request buffer budget was spent.
    pub request_budget_refused: AtomicU64,
    /// Replies from the leader answered `BUSY` instead: the forwarded replies' budget
    /// was spent.
    pub forwarded_replies_refused: AtomicU64,
    /// Peer messages carrying client values not queued (or sent as a short error reply
    /// instead): the link already held its bulk allowance.
    pub peer_bulk_shed: AtomicU64,
    /// Pub/sub messages or keyspace events not delivered: a peer link's allowance or the
    /// broker's queue was full.
    pub pubsub_dropped: AtomicU64,
    /// Pub/sub connections closed for not reading their messages (past the outbox bound).
    pub pubsub_overflows: AtomicU64,
    /// Client TLS handshakes that failed or took too long.
    pub tls_handshakes_failed: AtomicU64,
    /// Client connections closed for not authenticating within `auth_timeout_ms`.
    pub auth_timeouts: AtomicU64,
    /// Unauthenticated client connections closed to make room for a newer one (over
    /// `unauthenticated_connections_max`).
    pub unauthenticated_evicted: AtomicU64,
    /// Failed attempts to authenticate, by [`crate::login::Failure`] reason.
    auth_failures: [AtomicU64; crate::login::Failure::ALL.len()],
    /// Peer connections closed or refused, by [`LinkClosed`] reason.
    links_closed: [AtomicU64; LinkClosed::ALL.len()],
    /// Peer messages the validation gate dropped, by keyspace and reason.
    rejected: Mutex<BTreeMap<(KeyspaceId, &'static str), u64>>,
    /// When each reason was last logged.
    rejection_logged: Mutex<BTreeMap<&'static str, Instant>>,
    /// The peer protocol each member's open inbound link announced, with the link's id
    /// (1: none, a node of the previous protocol; absent: no link open), and this node's.
    peer_protocols: Mutex<BTreeMap<NodeId, (u64, u8)>>,
}

impl Metrics {
    /// Counts a failed attempt to authenticate.
    pub fn auth_failed(&self, failure: crate::login::Failure) {
        self.auth_failures[failure.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Failed attempts to authenticate for `failure` so far.
    pub fn auth_failures(&self, failure: crate::login::Failure) -> u64 {
        self.auth_failures[failure.index()].load(Ordering::Relaxed)
    }

    /// Counts a peer message the validation gate dropped, and logs it unless the same
    /// reason was logged within [`REJECTION_LOG_INTERVAL`].
    pub fn rejected(&self, keyspace: KeyspaceId, from: NodeId, reason: &'static str) {
        let mut rejected = self.rejected.lock().expect("metrics lock");
        if rejected.len() < LABEL_SETS_MAX || rejected.contains_key(&(keyspace, reason)) {
            *rejected.entry((keyspace, reason)).or_default() += 1;
        }
        drop(rejected);
        let now = Instant::now();
        let mut logged = self.rejection_logged.lock().expect("metrics lock");
        let due = logged.get(reason).is_none_or(|at| now >= *at + REJECTION_LOG_INTERVAL);
        if due && (logged.len() < LABEL_SETS_MAX || logged.contains_key(reason)) {
            logged.insert(reason, now);
            drop(logged);
            tracing::warn!(%keyspace, %from, reason, "peer message dropped by the validation gate");
        }
    }

    /// Counts a peer connection closed or refused for `why`.
    pub fn link_closed(&self, why: LinkClosed) {
        self.links_closed[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Notes the peer protocol `from`'s inbound link `link` speaks (this node's own with
    /// [`Metrics::OWN_LINK`]).
    pub fn peer_protocol_seen(&self, from: NodeId, link: u64, protocol: u8) {
        self.peer_protocols.lock().expect("metrics lock").insert(from, (link, protocol));
    }

    /// Forgets what `from`'s inbound link `link` announced, once it closed (unless a newer
    /// link of `from` announced since).
    pub fn peer_link_closed(&self, from: NodeId, link: u64) {
        let mut protocols = self.peer_protocols.lock().expect("metrics lock");
        if protocols.get(&from).is_some_and(|(l, _)| *l == link) {
            protocols.remove(&from);
        }
    }

    /// The link id of this node's own entry in [`Metrics::peer_protocols`].
    pub const OWN_LINK: u64 = u64::MAX;

    /// The peer protocol of this node and of each member whose inbound link is open.
    pub fn peer_protocols(&self) -> BTreeMap<NodeId, u8> {
        let protocols = self.peer_protocols.lock().expect("metrics lock");
        protocols.iter().map(|(node, (_, protocol))| (*node, *protocol)).collect()
    }

    /// How many peer connections were closed or refused for `why`.
    pub fn links_closed_count(&self, why: LinkClosed) -> u64 {
        self.links_closed[why as usize].load(Ordering::Relaxed)
    }

    /// How many messages the gate dropped for `reason` in `keyspace` (for tests).
    pub fn rejected_count(&self, keyspace: KeyspaceId, reason: &str) -> u64 {
        let rejected = self.rejected.lock().expect("metrics lock");
        rejected.iter().filter(|((k, r), _)| *k == keyspace && *r == reason).map(|(_, n)| n).sum()
    }
}

/// One keyspace as `/metrics` shows it.
pub struct KeyspaceView<'a> {
    /// Its id (the `keyspace` label).
    pub id: KeyspaceId,
    /// Its request, latency and fsync metrics.
    pub metrics: &'a KeyspaceMetrics,
    /// Its engine's report (gauges and counters).
    pub report: &'a Report,
}

/// Picks one histogram of a keyspace's metrics.
type HistogramOf = fn(&KeyspaceMetrics) -> &Histogram;

/// The `/metrics` page's content type (OpenMetrics text, which Prometheus reads).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Renders the node's metrics and every keyspace's, each family once, in the OpenMetrics
/// text format (`prometheus-client`'s encoder: names, escaping, `_total` suffixes,
/// cumulative buckets, the closing `# EOF`).
pub fn render(out: &mut String, node: &Metrics, keyspaces: &[KeyspaceView<'_>]) {
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(Box::new(Page::of(node, keyspaces)));
    prometheus_client::encoding::text::encode(out, &registry).expect("writing to a String");
}

/// One sample: its labels (the keyspace's first) and value.
type Labels = Vec<(&'static str, String)>;

/// An engine metric's help, kind and samples over the keyspaces.
type EngineFamily = (&'static str, MetricKind, Vec<(Labels, u64)>);

/// One family as scraped: name (without a counter's `_total`), help, type, samples.
#[derive(Debug)]
struct Family {
    name: &'static str,
    help: &'static str,
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    Counter(Vec<(Labels, u64)>),
    Gauge(Vec<(Labels, u64)>),
    Histogram(Vec<(Labels, HistogramState)>),
}

/// Everything one scrape shows, copied out of the live metrics (so the encoder holds no
/// lock).
#[derive(Debug)]
struct Page {
    families: Vec<Family>,
}

fn keyspace_label(id: KeyspaceId) -> Labels {
    vec![("keyspace", id.0.to_string())]
}

/// A counter's name without the `_total` the encoder adds back.
fn counter_name(name: &'static str) -> &'static str {
    name.strip_suffix("_total").unwrap_or(name)
}

impl Page {
    fn of(node: &Metrics, keyspaces: &[KeyspaceView<'_>]) -> Page {
        let mut families = Vec::new();
        let (mut requests, mut latency) = (Vec::new(), Vec::new());
        for ks in keyspaces {
            let slots = &ks.metrics.slots;
            for (op, class) in (0..OPS.len()).flat_map(|o| (0..CLASSES.len()).map(move |c| (o, c)))
            {
                let label = [("op", OPS[op].to_string()), ("class", CLASSES[class].to_string())];
                let ok = slots.ok[op][class].load(Ordering::Relaxed);
                if ok > 0 {
                    let mut labels = keyspace_label(ks.id);
                    labels.extend(label.clone());
                    labels.push(("outcome", "ok".to_string()));
                    requests.push((labels, ok));
                }
                let h = slots.latency[op][class].snapshot();
                if h.count > 0 {
                    let mut labels = keyspace_label(ks.id);
                    labels.extend(label);
                    latency.push((labels, h));
                }
            }
            for ((label, outcome), n) in ks.metrics.requests.lock().expect("metrics lock").iter() {
                let mut labels = keyspace_label(ks.id);
                labels.extend([
                    ("op", label.op.to_string()),
                    ("class", label.class.to_string()),
                    ("outcome", outcome.to_string()),
                ]);
                requests.push((labels, *n));
            }
            for (label, h) in ks.metrics.latency.lock().expect("metrics lock").iter() {
                let mut labels = keyspace_label(ks.id);
                labels.extend([("op", label.op.to_string()), ("class", label.class.to_string())]);
                latency.push((labels, h.snapshot()));
            }
        }
        families.push(Family {
            name: "keel_requests",
            help: "Client requests finished, by op, level or durability, and outcome.",
            kind: Kind::Counter(requests),
        });
        families.push(Family {
            name: "keel_request_duration_seconds",
            help: "Client request latency inside the node, from the input queue to the reply.",
            kind: Kind::Histogram(latency),
        });
        let histograms: [(&'static str, &'static str, HistogramOf); 4] = [
            ("keel_fsync_duration_seconds", "Log fsync latency (group commit).", |m| {
                &m.fsync_seconds
            }),
            (
                "keel_sync_wait_duration_seconds",
                "From an fsync asked for to its end, queueing behind other disk work included.",
                |m| &m.sync_wait_seconds,
            ),
            (
                "keel_round_read_duration_seconds",
                "Latency inside the node of reads that waited for a durability round.",
                |m| &m.round_read_seconds,
            ),
            (
                "keel_input_wait_duration_seconds",
                "From a client request entering the engine's input queue to the loop taking it.",
                |m| &m.input_wait_seconds,
            ),
        ];
        for (name, help, histogram) in histograms {
            let samples = keyspaces
                .iter()
                .map(|ks| (keyspace_label(ks.id), histogram(ks.metrics).snapshot()))
                .collect();
            families.push(Family { name, help, kind: Kind::Histogram(samples) });
        }
        let per_keyspace = |value: fn(&KeyspaceMetrics) -> &AtomicU64| {
            keyspaces
                .iter()
                .map(|ks| (keyspace_label(ks.id), value(ks.metrics).load(Ordering::Relaxed)))
                .collect()
        };
        families.push(Family {
            name: "keel_busy_refusals",
            help: "Requests refused with BUSY: the input queue was full.",
            kind: Kind::Counter(per_keyspace(|m| &m.busy_refusals)),
        });
        families.push(Family {
            name: "keel_reads_off_loop",
            help: "Reads answered by the connection between engine steps, off the engine loop.",
            kind: Kind::Counter(per_keyspace(|m| &m.reads_off_loop)),
        });
        Self::engines(&mut families, keyspaces);
        Self::node(&mut families, node);
        Page { families }
    }

    /// Every keyspace's engine metrics, grouped by family in name order.
    fn engines(families: &mut Vec<Family>, keyspaces: &[KeyspaceView<'_>]) {
        let mut grouped: BTreeMap<&'static str, EngineFamily> = BTreeMap::new();
        for ks in keyspaces {
            for metric in &ks.report.metrics {
                let mut labels = keyspace_label(ks.id);
                labels.extend(metric.label.map(|(k, v)| (k, v.to_string())));
                let entry =
                    grouped.entry(metric.name).or_insert((metric.help, metric.kind, vec![]));
                entry.2.push((labels, metric.value));
            }
        }
        for (name, (help, kind, samples)) in grouped {
            let kind = match kind {
                MetricKind::Counter => Kind::Counter(samples),
                MetricKind::Gauge => Kind::Gauge(samples),
            };
            let name = if matches!(kind, Kind::Counter(_)) { counter_name(name) } else { name };
            families.push(Family { name, help, kind });
        }
    }

    fn node(families: &mut Vec<Family>, node: &Metrics) {
        let values: [(&'static str, &'static str, bool, &AtomicU64); 13] = [
            (
                "keel_peer_messages_sent",
                "Peer messages handed to a connection.",
                true,
                &node.peer_sent,
            ),
            (
                "keel_peer_messages_received",
                "Peer messages given to an engine.",
                true,
                &node.peer_received,
            ),
            (
                "keel_peer_messages_dropped",
                "Peer messages dropped (full queue, broken link).",
                true,
                &node.peer_dropped,
            ),
            (
                "keel_connections_active",
                "Client connections open now.",
                false,
                &node.connections_active,
            ),
            (
                "keel_connections_refused",
                "Client connections refused (over connections_max).",
                true,
                &node.connections_refused,
            ),
            (
                "keel_request_budget_refused",
                "Client connections closed: the request buffers of all connections were full.",
                true,
                &node.request_budget_refused,
            ),
            (
                "keel_forwarded_replies_refused",
                "Replies from the leader answered BUSY: the values held for clients reached forwarded_replies_bytes_max.",
                true,
                &node.forwarded_replies_refused,
            ),
            (
                "keel_peer_bulk_shed",
                "Peer messages carrying client values shed (an error reply sent instead, or dropped): the link's bulk allowance was full.",
                true,
                &node.peer_bulk_shed,
            ),
            (
                "keel_pubsub_dropped",
                "Pub/sub messages or keyspace event batches not delivered: a peer link's allowance for client values or the broker's queue was full.",
                true,
                &node.pubsub_dropped,
            ),
            (
                "keel_pubsub_overflows",
                "Subscribed connections closed for not reading their messages (more than 32 MiB queued).",
                true,
                &node.pubsub_overflows,
            ),
            (
                "keel_tls_handshakes_failed",
                "Client TLS handshakes that failed (no common protocol, a certificate refused) or did not finish within partial_request_timeout_ms.",
                true,
                &node.tls_handshakes_failed,
            ),
            (
                "keel_client_auth_timeouts",
                "Client connections closed for not authenticating within auth_timeout_ms.",
                true,
                &node.auth_timeouts,
            ),
            (
                "keel_client_unauthenticated_evicted",
                "Unauthenticated client connections closed, oldest first, to make room for a newer one (over unauthenticated_connections_max).",
                true,
                &node.unauthenticated_evicted,
            ),
        ];
        for (name, help, counter, value) in values {
            let sample = vec![(Labels::new(), value.load(Ordering::Relaxed))];
            let kind = if counter { Kind::Counter(sample) } else { Kind::Gauge(sample) };
            families.push(Family { name, help, kind });
        }
        let rejected = node.rejected.lock().expect("metrics lock");
        let samples = rejected
            .iter()
            .map(|((keyspace, reason), n)| {
                let mut labels = keyspace_label(*keyspace);
                labels.push(("reason", reason.to_string()));
                (labels, *n)
            })
            .collect();
        let closed = LinkClosed::ALL
            .iter()
            .map(|why| {
                let labels = vec![("reason", why.as_str().to_string())];
                (labels, node.links_closed_count(*why))
            })
            .collect();
        let auth = crate::login::Failure::ALL
            .iter()
            .map(|why| (vec![("reason", why.as_str().to_string())], node.auth_failures(*why)))
            .collect();
        families.push(Family {
            name: "keel_client_auth_failures",
            help: "Failed attempts to authenticate (AUTH, HELLO ... AUTH), by reason: wrong_password, unknown_user, throttled (refused unchecked: the address had too many attempts waiting), busy (refused unchecked: the hashing queue was full).",
            kind: Kind::Counter(auth),
        });
        families.push(peer_protocol_family(node));
        families.push(Family {
            name: "keel_peer_connections_closed",
            help: "Peer connections closed or refused, by reason.",
            kind: Kind::Counter(closed),
        });
        families.push(Family {
            name: "keel_peer_messages_rejected",
            help: "Peer messages the validation gate dropped, by keyspace and reason.",
            kind: Kind::Counter(samples),
        });
    }
}

impl prometheus_client::collector::Collector for Page {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        for family in &self.families {
            let kind = match family.kind {
                Kind::Counter(_) => MetricType::Counter,
                Kind::Gauge(_) => MetricType::Gauge,
                Kind::Histogram(_) => MetricType::Histogram,
            };
            let mut metric = encoder.encode_descriptor(family.name, family.help, None, kind)?;
            match &family.kind {
                // A node-wide value: one sample, no labels (not even `{}`).
                Kind::Counter(samples) if samples.len() == 1 && samples[0].0.is_empty() => {
                    ConstCounter::new(samples[0].1).encode(metric)?;
                }
                Kind::Gauge(samples) if samples.len() == 1 && samples[0].0.is_empty() => {
                    ConstGauge::new(i64::try_from(samples[0].1).unwrap_or(i64::MAX))
                        .encode(metric)?;
                }
                Kind::Counter(samples) => {
                    for (labels, value) in samples {
                        let counter = ConstCounter::new(*value);
                        counter.encode(metric.encode_family(labels)?)?;
                    }
                }
                Kind::Gauge(samples) => {
                    for (labels, value) in samples {
                        let gauge = ConstGauge::new(i64::try_from(*value).unwrap_or(i64::MAX));
                        gauge.encode(metric.encode_family(labels)?)?;
                    }
                }
                Kind::Histogram(samples) => {
                    for (labels, h) in samples {
                        let mut buckets: Vec<(f64, u64)> =
                            LATENCY_BUCKETS_SECONDS.iter().copied().zip(h.buckets).collect();
                        buckets.push((f64::MAX, h.buckets[LATENCY_BUCKETS_SECONDS.len()]));
                        metric
                            .encode_family(labels)?
                            .encode_histogram::<NoLabelSet>(h.sum, h.count, &buckets, None)?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// `keel_peer_protocol{peer}`: the peer protocol of each member's open inbound link and
/// of this node.
fn peer_protocol_family(node: &Metrics) -> Family {
    let protocols = node
        .peer_protocols()
        .into_iter()
        .map(|(peer, protocol)| (vec![("peer", peer.0.to_string())], u64::from(protocol)))
        .collect();
    Family {
        name: "keel_peer_protocol",
        help: "The peer protocol each member's open inbound link announced, and this node's own (1: a node of the previous protocol, which announces none); watch it reach the new protocol on every member during a rolling upgrade.",
        kind: Kind::Gauge(protocols),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_core::engine::Metric;

    #[test]
    fn histograms_are_cumulative_and_counted_per_keyspace() {
        let metrics = KeyspaceMetrics::default();
        let label = OpLabel { op: "get", class: "monotonic" };
        metrics.record(label, "ok", 0.0002);
        metrics.record(label, "ok", 10.0);
        let report = Report { status: serde_json::json!({}), metrics: Vec::new() };
        let mut out = String::new();
        let views = [KeyspaceView { id: KeyspaceId(2), metrics: &metrics, report: &report }];
        render(&mut out, &Metrics::default(), &views);
        assert!(out.contains(
            "keel_requests_total{keyspace=\"2\",op=\"get\",class=\"monotonic\",outcome=\"ok\"} 2"
        ));
        let bucket = |le: &str| {
            format!("_bucket{{le=\"{le}\",keyspace=\"2\",op=\"get\",class=\"monotonic\"}}")
        };
        assert!(out.contains(&format!("{} 0\n", bucket("0.0001"))), "{out}");
        assert!(out.contains(&format!("{} 1\n", bucket("0.00025"))), "{out}");
        assert!(out.contains(&format!("{} 1\n", bucket("5.0"))), "{out}");
        assert!(out.contains(&format!("{} 2\n", bucket("+Inf"))), "{out}");
        assert!(out.contains(
            "keel_request_duration_seconds_count{keyspace=\"2\",op=\"get\",class=\"monotonic\"} 2"
        ));
        assert!(out.ends_with("# EOF\n"), "{out}");
    }

    #[test]
    fn errors_are_counted_by_outcome_and_timed_with_the_rest() {
        let metrics = KeyspaceMetrics::default();
        let label = OpLabel { op: "put", class: "durable" };
        metrics.record(label, "ok", 0.001);
        metrics.record(label, "TIMEOUT", 2.0);
        metrics.record(OpLabel { op: "put", class: "odd" }, "ok", 0.001);
        let report = Report { status: serde_json::json!({}), metrics: Vec::new() };
        let mut out = String::new();
        let views = [KeyspaceView { id: KeyspaceId(0), metrics: &metrics, report: &report }];
        render(&mut out, &Metrics::default(), &views);
        let count = |class: &str, outcome: &str| {
            format!("keel_requests_total{{keyspace=\"0\",op=\"put\",class=\"{class}\",outcome=\"{outcome}\"}} 1\n")
        };
        assert!(out.contains(&count("durable", "ok")), "{out}");
        assert!(out.contains(&count("durable", "TIMEOUT")), "{out}");
        assert!(out.contains(&count("odd", "ok")), "a label outside the table: {out}");
        assert!(out.contains(
            "keel_request_duration_seconds_count{keyspace=\"0\",op=\"put\",class=\"durable\"} 2\n"
        ));
        assert!(out.contains(
            "keel_request_duration_seconds_sum{keyspace=\"0\",op=\"put\",class=\"durable\"} 2.001\n"
        ), "{out}");
    }

    #[test]
    fn node_counters_and_rejections_are_rendered() {
        let node = Metrics::default();
        node.peer_sent.fetch_add(7, Ordering::Relaxed);
        node.rejected(KeyspaceId(0), NodeId(2), "epoch out of range");
        let mut out = String::new();
        render(&mut out, &node, &[]);
        assert!(out.contains("# TYPE keel_peer_messages_sent counter\n"), "{out}");
        assert!(out.contains("keel_peer_messages_sent_total 7\n"), "{out}");
        assert!(out.contains(
            "keel_peer_messages_rejected_total{keyspace=\"0\",reason=\"epoch out of range\"} 1\n"
        ));
        assert!(out.contains("keel_connections_active 0\n"), "{out}");
    }

    #[test]
    fn engine_metrics_of_several_keyspaces_are_one_family_each() {
        let metric = |value| Metric {
            name: "keel_epoch",
            help: "The current epoch.",
            kind: MetricKind::Gauge,
            label: None,
            value,
        };
        let a = Report { status: serde_json::json!({}), metrics: vec![metric(3)] };
        let b = Report { status: serde_json::json!({}), metrics: vec![metric(5)] };
        let (ma, mb) = (KeyspaceMetrics::default(), KeyspaceMetrics::default());
        let views = [
            KeyspaceView { id: KeyspaceId(0), metrics: &ma, report: &a },
            KeyspaceView { id: KeyspaceId(1), metrics: &mb, report: &b },
        ];
        let mut out = String::new();
        render(&mut out, &Metrics::default(), &views);
        assert_eq!(out.matches("# TYPE keel_epoch gauge").count(), 1);
        assert!(
            out.contains("keel_epoch{keyspace=\"0\"} 3\nkeel_epoch{keyspace=\"1\"} 5\n"),
            "{out}"
        );
    }

    #[test]
    fn label_sets_are_bounded_and_rejections_counted() {
        let metrics = KeyspaceMetrics::default();
        let ops: Vec<&'static str> = (0..LABEL_SETS_MAX + 10)
            .map(|i| &*Box::leak(format!("op{i}").into_boxed_str()))
            .collect();
        for op in ops {
            metrics.record(OpLabel { op, class: "x" }, "ok", 0.001);
        }
        assert_eq!(metrics.requests.lock().unwrap().len(), LABEL_SETS_MAX);
        let node = Metrics::default();
        node.rejected(KeyspaceId(1), NodeId(2), "epoch out of range");
        node.rejected(KeyspaceId(1), NodeId(2), "epoch out of range");
        assert_eq!(node.rejected_count(KeyspaceId(1), "epoch out of range"), 2);
    }
}
