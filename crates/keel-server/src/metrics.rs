//! The node's metrics, rendered in the Prometheus text format by `/metrics`.
//!
//! Two scopes: [`Metrics`] for the node (connections, peer links, messages the validation
//! gate dropped) and [`KeyspaceMetrics`] for each keyspace (requests, latencies, fsyncs),
//! rendered with a `keyspace` label. Engine state (epoch, role, indexes, rounds, ...) is
//! read from each keyspace's engine when a scrape asks (`keel_core::engine::Report`) and
//! rendered by [`render`] with the same label. Values live behind std mutexes held for a
//! few instructions, never across an await.

use keel_core::engine::{MetricKind, Report};
use keel_types::{KeyspaceId, NodeId};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Upper bounds of the latency buckets, in seconds (a `+Inf` bucket follows).
pub const LATENCY_BUCKETS_SECONDS: [f64; 14] =
    [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0];
/// Most distinct label sets per metric family (a bound on memory if labels misbehave).
pub const LABEL_SETS_MAX: usize = 256;
/// At most one warning per rejection reason per this long (the counter counts them all).
pub const REJECTION_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// A Prometheus histogram with fixed buckets.
#[derive(Debug, Default)]
pub struct Histogram {
    inner: Mutex<HistogramState>,
}

#[derive(Debug, Default, Clone)]
struct HistogramState {
    /// Count per bucket of [`LATENCY_BUCKETS_SECONDS`], then `+Inf`; not cumulative.
    buckets: [u64; LATENCY_BUCKETS_SECONDS.len() + 1],
    sum: f64,
    count: u64,
}

impl HistogramState {
    fn observe(&mut self, seconds: f64) {
        let i = LATENCY_BUCKETS_SECONDS.iter().position(|b| seconds <= *b);
        self.buckets[i.unwrap_or(LATENCY_BUCKETS_SECONDS.len())] += 1;
        self.sum += seconds;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (i, bound) in LATENCY_BUCKETS_SECONDS.iter().enumerate() {
            cumulative += self.buckets[i];
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {cumulative}");
        }
        cumulative += self.buckets[LATENCY_BUCKETS_SECONDS.len()];
        assert_eq!(cumulative, self.count, "every observation is in one bucket");
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {cumulative}");
        let braces = if labels.is_empty() { String::new() } else { format!("{{{labels}}}") };
        let _ = writeln!(out, "{name}_sum{braces} {}", self.sum);
        let _ = writeln!(out, "{name}_count{braces} {}", self.count);
    }
}

impl Histogram {
    /// Records one observation in seconds.
    pub fn observe(&self, seconds: f64) {
        self.inner.lock().expect("metrics lock").observe(seconds);
    }

    fn snapshot(&self) -> HistogramState {
        self.inner.lock().expect("metrics lock").clone()
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

/// One keyspace's metrics.
#[derive(Debug, Default)]
pub struct KeyspaceMetrics {
    /// Requests by label and outcome (`ok` or the error prefix).
    requests: Mutex<BTreeMap<(OpLabel, &'static str), u64>>,
    /// Latency by label.
    latency: Mutex<BTreeMap<OpLabel, HistogramState>>,
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
}

impl KeyspaceMetrics {
    /// Records a finished request.
    pub fn record(&self, label: OpLabel, outcome: &'static str, seconds: f64) {
        let mut requests = self.requests.lock().expect("metrics lock");
        if requests.len() < LABEL_SETS_MAX || requests.contains_key(&(label, outcome)) {
            *requests.entry((label, outcome)).or_default() += 1;
        }
        drop(requests);
        let mut latency = self.latency.lock().expect("metrics lock");
        if latency.len() < LABEL_SETS_MAX || latency.contains_key(&label) {
            latency.entry(label).or_default().observe(seconds);
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
    /// Peer messages the validation gate dropped, by keyspace and reason.
    rejected: Mutex<BTreeMap<(KeyspaceId, &'static str), u64>>,
    /// When each reason was last logged.
    rejection_logged: Mutex<BTreeMap<&'static str, Instant>>,
}

impl Metrics {
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

fn family(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Renders the node's metrics and every keyspace's, each family once.
pub fn render(out: &mut String, node: &Metrics, keyspaces: &[KeyspaceView<'_>]) {
    render_requests(out, keyspaces);
    let histograms: [(&str, &str, HistogramOf); 4] = [
        ("keel_fsync_duration_seconds", "Log fsync latency (group commit).", |m| &m.fsync_seconds),
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
        family(out, name, help, "histogram");
        for ks in keyspaces {
            histogram(ks.metrics).snapshot().render(
                out,
                name,
                &format!("keyspace=\"{}\"", ks.id.0),
            );
        }
    }
    family(
        out,
        "keel_busy_refusals_total",
        "Requests refused with BUSY: the input queue was full.",
        "counter",
    );
    for ks in keyspaces {
        let value = ks.metrics.busy_refusals.load(Ordering::Relaxed);
        let _ = writeln!(out, "keel_busy_refusals_total{{keyspace=\"{}\"}} {value}", ks.id.0);
    }
    family(
        out,
        "keel_reads_off_loop_total",
        "Reads answered by the connection between engine steps, off the engine loop.",
        "counter",
    );
    for ks in keyspaces {
        let value = ks.metrics.reads_off_loop.load(Ordering::Relaxed);
        let _ = writeln!(out, "keel_reads_off_loop_total{{keyspace=\"{}\"}} {value}", ks.id.0);
    }
    render_engines(out, keyspaces);
    render_node(out, node);
}

fn render_requests(out: &mut String, keyspaces: &[KeyspaceView<'_>]) {
    family(
        out,
        "keel_requests_total",
        "Client requests finished, by op, level or durability, and outcome.",
        "counter",
    );
    for ks in keyspaces {
        for ((label, outcome), n) in ks.metrics.requests.lock().expect("metrics lock").iter() {
            let _ = writeln!(
                out,
                "keel_requests_total{{keyspace=\"{}\",op=\"{}\",class=\"{}\",outcome=\"{outcome}\"}} {n}",
                ks.id.0, label.op, label.class
            );
        }
    }
    let name = "keel_request_duration_seconds";
    family(
        out,
        name,
        "Client request latency inside the node, from the input queue to the reply.",
        "histogram",
    );
    for ks in keyspaces {
        let latency = ks.metrics.latency.lock().expect("metrics lock").clone();
        for (label, h) in &latency {
            let labels =
                format!("keyspace=\"{}\",op=\"{}\",class=\"{}\"", ks.id.0, label.op, label.class);
            h.render(out, name, &labels);
        }
    }
}

/// Every keyspace's engine metrics, grouped by family.
fn render_engines(out: &mut String, keyspaces: &[KeyspaceView<'_>]) {
    let mut families: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut heads: BTreeMap<&str, (&str, MetricKind)> = BTreeMap::new();
    for ks in keyspaces {
        for metric in &ks.report.metrics {
            heads.entry(metric.name).or_insert((metric.help, metric.kind));
            let extra = metric.label.map_or(String::new(), |(k, v)| format!(",{k}=\"{v}\""));
            let line =
                format!("{}{{keyspace=\"{}\"{extra}}} {}", metric.name, ks.id.0, metric.value);
            families.entry(metric.name).or_default().push(line);
        }
    }
    for (name, lines) in families {
        let (help, kind) = heads[name];
        let kind = match kind {
            MetricKind::Counter => "counter",
            MetricKind::Gauge => "gauge",
        };
        family(out, name, help, kind);
        for line in lines {
            let _ = writeln!(out, "{line}");
        }
    }
}

fn render_node(out: &mut String, node: &Metrics) {
    let counters = [
        (
            "keel_peer_messages_sent_total",
            "counter",
            "Peer messages handed to a connection.",
            &node.peer_sent,
        ),
        (
            "keel_peer_messages_received_total",
            "counter",
            "Peer messages given to an engine.",
            &node.peer_received,
        ),
        (
            "keel_peer_messages_dropped_total",
            "counter",
            "Peer messages dropped (full queue, broken link).",
            &node.peer_dropped,
        ),
        (
            "keel_connections_active",
            "gauge",
            "Client connections open now.",
            &node.connections_active,
        ),
        (
            "keel_connections_refused_total",
            "counter",
            "Client connections refused (over connections_max).",
            &node.connections_refused,
        ),
    ];
    for (name, kind, help, value) in counters {
        family(out, name, help, kind);
        let _ = writeln!(out, "{name} {}", value.load(Ordering::Relaxed));
    }
    let name = "keel_peer_messages_rejected_total";
    family(
        out,
        name,
        "Peer messages the validation gate dropped, by keyspace and reason.",
        "counter",
    );
    for ((keyspace, reason), n) in node.rejected.lock().expect("metrics lock").iter() {
        let _ = writeln!(out, "{name}{{keyspace=\"{}\",reason=\"{reason}\"}} {n}", keyspace.0);
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
        assert!(out.contains("le=\"0.00025\"} 1"), "{out}");
        assert!(out.contains("le=\"+Inf\"} 2"));
        assert!(!out.contains("le=\"0.0001\"} 1"));
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
