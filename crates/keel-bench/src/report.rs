//! Results: one [`RunRecord`] per run, printed as a JSON line or a Markdown table row,
//! and the small Prometheus text parser used to read Keel's counters.

use crate::runner::RunOutcome;
use serde::{Deserialize, Serialize};

/// One run's result: the fields of `keel bench --json`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RunRecord {
    /// `keel`, `redis`, `etcd` or `zookeeper`.
    pub system: String,
    /// The configuration name (e.g. `cad`, `immediate`, `linearizable`).
    pub config: String,
    /// Where reads went: `leader` or `all`.
    pub reads: String,
    /// The YCSB workload letter.
    pub workload: String,
    /// Concurrent clients.
    pub clients: usize,
    /// Open-loop target rate; `None` for closed loop.
    pub target_ops_s: Option<f64>,
    /// Records loaded.
    pub records: u64,
    /// Recorded seconds (warm-up excluded).
    pub duration_s: f64,
    /// Successful recorded operations.
    pub ops: u64,
    /// Failed recorded operations.
    pub errors: u64,
    /// `ops / duration_s`.
    pub throughput_ops_s: f64,
    /// Mean latency.
    pub mean_us: f64,
    /// Median latency.
    pub p50_us: u64,
    /// 90th percentile.
    pub p90_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
    /// Largest latency.
    pub max_us: u64,
    /// Keel: percent of reads that started a durability round; `None` elsewhere.
    #[serde(default)]
    pub reads_with_durability_round_pct: Option<f64>,
    /// Largest resident memory of one server process at the end of the run, in KiB.
    #[serde(default)]
    pub server_rss_kib_max: Option<u64>,
    /// Keel: the emulated delay added to each log fsync (`--emulated-fsync-us`), when on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub emulated_fsync_us: Option<u64>,
    /// Keel: the background fsync period (`--flush-interval-ms`), when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flush_interval_ms: Option<u64>,
    /// Keel: the keyspaces the clients spread over (`--keyspaces`), when more than one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keyspaces: Option<u32>,
    /// The seed of the operation streams.
    pub seed: u64,
}

/// What identifies a run besides its measurements.
#[derive(Clone, Debug)]
pub struct RunLabel {
    /// System name.
    pub system: String,
    /// Configuration name.
    pub config: String,
    /// `leader` or `all`.
    pub reads: String,
    /// Workload letter.
    pub workload: String,
    /// Records loaded.
    pub records: u64,
    /// Keel: the emulated fsync delay, when on.
    pub emulated_fsync_us: Option<u64>,
    /// Keel: the background fsync period, when set.
    pub flush_interval_ms: Option<u64>,
    /// Keel: the keyspaces, when more than one.
    pub keyspaces: Option<u32>,
    /// Seed.
    pub seed: u64,
}

impl RunRecord {
    /// The record of `outcome` under `label`.
    pub fn new(
        label: &RunLabel,
        clients: usize,
        target: Option<f64>,
        outcome: &RunOutcome,
    ) -> RunRecord {
        let h = &outcome.latency_us;
        let q = |quantile: f64| if h.is_empty() { 0 } else { h.value_at_quantile(quantile) };
        RunRecord {
            system: label.system.clone(),
            config: label.config.clone(),
            reads: label.reads.clone(),
            workload: label.workload.clone(),
            clients,
            target_ops_s: target,
            records: label.records,
            duration_s: outcome.elapsed.as_secs_f64(),
            ops: outcome.ops,
            errors: outcome.errors,
            throughput_ops_s: round1(outcome.throughput_ops_s()),
            mean_us: if h.is_empty() { 0.0 } else { round1(h.mean()) },
            p50_us: q(0.5),
            p90_us: q(0.9),
            p99_us: q(0.99),
            p999_us: q(0.999),
            max_us: if h.is_empty() { 0 } else { h.max() },
            reads_with_durability_round_pct: None,
            server_rss_kib_max: None,
            emulated_fsync_us: label.emulated_fsync_us,
            flush_interval_ms: label.flush_interval_ms,
            keyspaces: label.keyspaces,
            seed: label.seed,
        }
    }

    /// One JSON object on one line.
    pub fn to_json_line(&self) -> String {
        serde_json::to_string(self).expect("a record always serializes")
    }
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// The Markdown header of [`markdown_row`]s.
pub fn markdown_header() -> String {
    "| system | config | reads | workload | clients | ops/s | p50 µs | p99 µs | p99.9 µs | errors | reads with durability round |\n\
     |---|---|---|---|---:|---:|---:|---:|---:|---:|---:|"
        .to_string()
}

/// One Markdown table row.
pub fn markdown_row(r: &RunRecord) -> String {
    let rounds =
        r.reads_with_durability_round_pct.map_or("—".to_string(), |p| format!("{p:.2}%"));
    let system = match r.keyspaces {
        Some(k) => format!("{} ({k} keyspaces)", r.system),
        None => r.system.clone(),
    };
    format!(
        "| {} | {} | {} | {} | {} | {:.0} | {} | {} | {} | {} | {} |",
        system,
        r.config,
        r.reads,
        r.workload,
        r.clients,
        r.throughput_ops_s,
        r.p50_us,
        r.p99_us,
        r.p999_us,
        r.errors,
        rounds
    )
}

/// The sum of counter or gauge `name` over its label sets (a node's keyspaces) in
/// Prometheus text; `None` if the text has no sample of it.
pub fn prometheus_sum(text: &str, name: &str) -> Option<u64> {
    let samples: Vec<u64> = text
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (metric, value) = line.rsplit_once(' ')?;
            let base = metric.split('{').next()?;
            (base == name).then(|| value.trim().parse::<f64>().ok().map(|v| v as u64))?
        })
        .collect();
    (!samples.is_empty()).then(|| samples.iter().sum())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn outcome() -> RunOutcome {
        let mut h = hdrhistogram::Histogram::new_with_bounds(1, 60_000_000, 3).unwrap();
        for us in 1..=1000u64 {
            h.record(us).unwrap();
        }
        RunOutcome {
            latency_us: h,
            ops: 1000,
            errors: 2,
            reads_total: 500,
            elapsed: Duration::from_secs(10),
            first_error: None,
        }
    }

    fn label() -> RunLabel {
        RunLabel {
            system: "keel".into(),
            config: "cad".into(),
            reads: "leader".into(),
            workload: "a".into(),
            records: 1000,
            emulated_fsync_us: None,
            flush_interval_ms: None,
            keyspaces: None,
            seed: 1,
        }
    }

    #[test]
    fn json_line_has_the_required_fields() {
        let record = RunRecord::new(&label(), 10, None, &outcome());
        let line = record.to_json_line();
        assert!(!line.contains('\n'));
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        for field in [
            "system",
            "config",
            "workload",
            "clients",
            "ops",
            "throughput_ops_s",
            "p50_us",
            "p90_us",
            "p99_us",
            "p999_us",
            "max_us",
            "errors",
        ] {
            assert!(value.get(field).is_some(), "missing {field}");
        }
        assert_eq!(value["throughput_ops_s"], 100.0);
        assert!((499..=501).contains(&value["p50_us"].as_u64().unwrap()));
        assert!((989..=991).contains(&value["p99_us"].as_u64().unwrap()));
        assert_eq!(value["errors"], 2);
    }

    #[test]
    fn markdown_rows_match_the_header_columns() {
        let mut record = RunRecord::new(&label(), 10, None, &outcome());
        record.reads_with_durability_round_pct = Some(1.234);
        let row = markdown_row(&record);
        let header = markdown_header();
        let columns = |s: &str| s.lines().next().unwrap().matches('|').count();
        assert_eq!(columns(&row), columns(&header));
        assert!(row.contains("1.23%"));
    }

    #[test]
    fn prometheus_values_are_found_by_exact_name_and_summed_over_labels() {
        let text = "# TYPE keel_durability_rounds_total counter\nkeel_durability_rounds_total{keyspace=\"0\"} 7\n\
                    keel_durability_rounds_total{keyspace=\"1\"} 2\n\
                    keel_reads_with_durability_round_total 3\nkeel_requests_total_x{op=\"get\"} 9\n";
        assert_eq!(prometheus_sum(text, "keel_reads_with_durability_round_total"), Some(3));
        assert_eq!(
            prometheus_sum(text, "keel_durability_rounds_total"),
            Some(9),
            "summed over keyspaces"
        );
        assert_eq!(prometheus_sum(text, "keel_requests_total"), None);
    }
}
