//! The node's metrics, rendered in the Prometheus text format by `/metrics`.
//!
//! Counters and histograms recorded by the server live here behind std mutexes (held for
//! a few instructions, never across an await). Engine state (epoch, role, indexes,
//! durability rounds, forwards, active-set removals) is read from the engine when a
//! scrape asks, and rendered by [`render_engine`].

use keel_core::leader::{Counters, Role, Status};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Upper bounds of the latency buckets, in seconds (a `+Inf` bucket follows).
pub const LATENCY_BUCKETS_SECONDS: [f64; 14] =
    [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0];
/// Most distinct label sets per metric family (a bound on memory if labels misbehave).
pub const LABEL_SETS_MAX: usize = 256;

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
}

/// What one client request was, for its labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct OpLabel {
    /// The command (`get`, `put`, `delete`, `cas`, `incr`, `scan`).
    pub op: &'static str,
    /// The read level or durability asked for, or `default`.
    pub class: &'static str,
}

/// Every metric the server itself records.
#[derive(Debug, Default)]
pub struct Metrics {
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
    /// Peer messages handed to a connection.
    pub peer_sent: AtomicU64,
    /// Peer messages received and given to the engine.
    pub peer_received: AtomicU64,
    /// Peer messages dropped (full queue, broken connection).
    pub peer_dropped: AtomicU64,
    /// Client connections open now.
    pub connections_active: AtomicU64,
    /// Client connections refused (over `connections_max`).
    pub connections_refused: AtomicU64,
    /// Requests refused with `BUSY` because the engine's input queue was full.
    pub busy_refusals: AtomicU64,
}

impl Metrics {
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

    /// Renders the server's own metrics.
    pub fn render(&self, out: &mut String) {
        let _ = writeln!(out, "# HELP keel_requests_total Client requests finished, by op, level or durability, and outcome.");
        let _ = writeln!(out, "# TYPE keel_requests_total counter");
        for ((label, outcome), n) in self.requests.lock().expect("metrics lock").iter() {
            let _ = writeln!(
                out,
                "keel_requests_total{{op=\"{}\",class=\"{}\",outcome=\"{outcome}\"}} {n}",
                label.op, label.class
            );
        }
        let _ = writeln!(
            out,
            "# HELP keel_request_duration_seconds Client request latency inside the node, from the input queue to the reply."
        );
        let _ = writeln!(out, "# TYPE keel_request_duration_seconds histogram");
        let latency = self.latency.lock().expect("metrics lock").clone();
        for (label, h) in &latency {
            let labels = format!("op=\"{}\",class=\"{}\"", label.op, label.class);
            h.render(out, "keel_request_duration_seconds", &labels);
        }
        let _ =
            writeln!(out, "# HELP keel_fsync_duration_seconds Log fsync latency (group commit).");
        let _ = writeln!(out, "# TYPE keel_fsync_duration_seconds histogram");
        let fsync = self.fsync_seconds.inner.lock().expect("metrics lock").clone();
        fsync.render(out, "keel_fsync_duration_seconds", "");
        let histograms = [
            (
                "keel_sync_wait_duration_seconds",
                "From an fsync asked for to its end, queueing behind other disk work included.",
                &self.sync_wait_seconds,
            ),
            (
                "keel_round_read_duration_seconds",
                "Latency inside the node of reads that waited for a durability round.",
                &self.round_read_seconds,
            ),
            (
                "keel_input_wait_duration_seconds",
                "From a client request entering the engine's input queue to the loop taking it.",
                &self.input_wait_seconds,
            ),
        ];
        for (name, help, histogram) in histograms {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} histogram");
            let state = histogram.inner.lock().expect("metrics lock").clone();
            state.render(out, name, "");
        }
        let counters = [
            ("keel_peer_messages_sent_total", "counter", &self.peer_sent),
            ("keel_peer_messages_received_total", "counter", &self.peer_received),
            ("keel_peer_messages_dropped_total", "counter", &self.peer_dropped),
            ("keel_connections_active", "gauge", &self.connections_active),
            ("keel_connections_refused_total", "counter", &self.connections_refused),
            ("keel_busy_refusals_total", "counter", &self.busy_refusals),
        ];
        for (name, kind, value) in counters {
            let _ = writeln!(out, "# TYPE {name} {kind}\n{name} {}", value.load(Ordering::Relaxed));
        }
    }
}

/// Renders the engine's gauges and counters.
pub fn render_engine(out: &mut String, status: &Status, counters: &Counters) {
    let role = match status.role {
        Role::Leader => "leader",
        Role::Follower => "follower",
        Role::Candidate => "candidate",
    };
    for r in ["leader", "follower", "candidate"] {
        let v = u8::from(r == role);
        let _ = writeln!(out, "keel_role{{role=\"{r}\"}} {v}");
    }
    let gauges = [
        ("keel_epoch", status.epoch.0),
        ("keel_last_index", status.last_index.0),
        ("keel_commit_index", status.commit_index.0),
        ("keel_durable_index", status.durable_index.0),
        ("keel_persisted_index", status.persisted_index.0),
        ("keel_applied_index", status.applied_index.0),
        ("keel_snapshot_index", status.snapshot_index.0),
        ("keel_snapshot_held_bytes", status.snapshot_held_bytes),
        ("keel_active_set_size", status.active_set.len() as u64),
        ("keel_active", u64::from(status.active)),
        ("keel_leader_lease_valid", u64::from(status.leader_lease_valid)),
    ];
    for (name, value) in gauges {
        let _ = writeln!(out, "# TYPE {name} gauge\n{name} {value}");
    }
    let totals = [
        ("keel_durability_rounds_total", counters.durability_rounds),
        ("keel_reads_with_durability_round_total", counters.reads_with_round),
        ("keel_forwarded_total", counters.forwarded),
        ("keel_elections_total", counters.elections),
        ("keel_active_set_removals_total", counters.removals),
        ("keel_rolled_back_entries_total", counters.rolled_back_entries),
        ("keel_snapshots_installed_total", counters.snapshots_installed),
        ("keel_snapshots_taken_total", counters.snapshots_taken),
        ("keel_snapshot_chunks_received_total", counters.snapshot_chunks_received),
    ];
    for (name, value) in totals {
        let _ = writeln!(out, "# TYPE {name} counter\n{name} {value}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_and_counted() {
        let metrics = Metrics::default();
        let label = OpLabel { op: "get", class: "monotonic" };
        metrics.record(label, "ok", 0.0002);
        metrics.record(label, "ok", 10.0);
        let mut out = String::new();
        metrics.render(&mut out);
        assert!(
            out.contains("keel_requests_total{op=\"get\",class=\"monotonic\",outcome=\"ok\"} 2")
        );
        assert!(out.contains("le=\"0.00025\"} 1"), "{out}");
        assert!(out.contains("le=\"+Inf\"} 2"));
        assert!(!out.contains("le=\"0.0001\"} 1"));
    }

    #[test]
    fn label_sets_are_bounded() {
        let metrics = Metrics::default();
        let ops: Vec<&'static str> = (0..LABEL_SETS_MAX + 10)
            .map(|i| &*Box::leak(format!("op{i}").into_boxed_str()))
            .collect();
        for op in ops {
            metrics.record(OpLabel { op, class: "x" }, "ok", 0.001);
        }
        assert_eq!(metrics.requests.lock().unwrap().len(), LABEL_SETS_MAX);
    }
}
