//! `keel bench`: one run (`keel bench --system keel --config cad --workloads a`) or a
//! suite (`keel bench suite orca|geo|scale`). Prints a Markdown table, or JSON lines
//! with `--json`; suites also write `results/<suite>-<time>.jsonl`, `.md` and PNG plots,
//! which `keel bench report FILE.jsonl` redraws.

use crate::report::{markdown_header, markdown_row, RunLabel, RunRecord};
use crate::runner::{self, RunConfig};
use crate::systems::{self, Running, System};
use crate::workload::{WorkloadName, WorkloadSpec};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Flags of `keel bench`.
#[derive(Debug, Clone, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    /// A suite instead of a single run.
    #[command(subcommand)]
    pub suite: Option<SuiteCommand>,
    /// The system: keel, redis, etcd or zookeeper.
    #[arg(long, default_value = "keel")]
    pub system: String,
    /// The configuration (see docs/benchmarks.md), e.g. cad, immediate, eventual, linearizable.
    #[arg(long, default_value = "cad")]
    pub config: String,
    /// Where reads go: leader or all.
    #[arg(long, default_value = "leader")]
    pub reads: String,
    /// Workloads, comma-separated: a, b, c, d, e, f, w.
    #[arg(long, default_value = "a")]
    pub workloads: String,
    /// Client counts, comma-separated (closed loop unless --target-ops-s).
    #[arg(long, default_value = "10")]
    pub clients: String,
    /// Open loop at this total rate (operations per second).
    #[arg(long)]
    pub target_ops_s: Option<f64>,
    /// Common run flags.
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Flags every run and suite shares.
#[derive(Debug, Clone, clap::Args)]
pub struct CommonArgs {
    /// Recorded seconds per point.
    #[arg(long, default_value_t = 10)]
    pub duration: u64,
    /// Warm-up seconds per point (executed, not recorded).
    #[arg(long, default_value_t = 2)]
    pub warmup: u64,
    /// Records loaded (YCSB recordcount).
    #[arg(long, default_value_t = 10_000)]
    pub records: u64,
    /// Seed of the operation streams.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// JSON lines instead of a Markdown table.
    #[arg(long)]
    pub json: bool,
    /// Where suites write their results.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
    /// Keel only, test emulation: every Keel node waits this many microseconds after each
    /// log fsync (`[storage] emulated_fsync_delay_us`), as on a disk whose fsync costs
    /// that much more. 0 (the default): the disk as it is. Other systems are unaffected.
    #[arg(long, default_value_t = 0)]
    pub emulated_fsync_us: u64,
    /// Keel only: every node's background fsync period in milliseconds (`[engine]
    /// flush_interval_ms`); absent, the server's default. Other systems are unaffected.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub flush_interval_ms: Option<u64>,
    /// Keel only: the cluster hosts this many ORCA keyspaces (leaders spread over the
    /// nodes), every record is loaded into each, and client `i` works in keyspace
    /// `i mod N`. Other systems are unaffected.
    #[arg(long, default_value_t = 1)]
    pub keyspaces: u32,
}

/// `keel bench suite ...`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum SuiteCommand {
    /// Suites reproducing the ORCA paper's evaluation.
    Suite(SuiteArgs),
    /// Rewrites the Markdown table, ratios and PNG plots of a saved `.jsonl` file.
    Report {
        /// The JSON-lines file a suite wrote.
        file: PathBuf,
    },
}

/// Flags of `keel bench suite`.
#[derive(Debug, Clone, clap::Args)]
pub struct SuiteArgs {
    /// orca (Table 2 and Figure 10), geo, scale (1..128 clients on A and B), keyspaces,
    /// correctables (preliminary and final views, bandwidth, divergence), kite (Kite's
    /// modes by write ratio, and a node frozen), unistore (causal commit against
    /// strong-only across an emulated wide area), or rubis (UniStore's RUBiS bidding mix
    /// in the UniStore, RedBlue, Strong and Causal modes).
    pub name: String,
    /// Systems to include, comma-separated.
    #[arg(long, default_value = "keel,etcd,zookeeper,redis")]
    pub systems: String,
    /// Workloads, comma-separated; default: the suite's own (orca: a,b,d,f; scale: a,b;
    /// geo: read-only,write-only,mixed-read-heavy,mixed-write-heavy; kite: write
    /// percentages, 1,5,20,50).
    #[arg(long)]
    pub workloads: Option<String>,
    /// Client counts, comma-separated, for the suites that sweep load (rubis: each mode
    /// at each count; default 12).
    #[arg(long)]
    pub clients: Option<String>,
    /// Common run flags.
    #[command(flatten)]
    pub common: CommonArgs,
}

/// One point to measure: a system configuration, a workload and client counts.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The system.
    pub system: System,
    /// Its configuration name.
    pub config: String,
    /// Reads spread over all nodes.
    pub reads_everywhere: bool,
    /// The workload.
    pub workload: WorkloadName,
    /// Client counts, each a run on the same loaded cluster.
    pub clients: Vec<usize>,
    /// Open-loop rate, if any.
    pub target_ops_s: Option<f64>,
    /// Keel: the keyspaces the cluster hosts and the clients spread over.
    pub keyspaces: u32,
}

fn parse_list<T: std::str::FromStr<Err = String>>(text: &str) -> Result<Vec<T>, String> {
    text.split(',').filter(|s| !s.trim().is_empty()).map(|s| s.parse()).collect()
}

pub(crate) fn parse_clients(text: &str) -> Result<Vec<usize>, String> {
    let clients: Vec<usize> = text
        .split(',')
        .map(|s| s.trim().parse::<usize>().map_err(|e| format!("bad client count {s:?}: {e}")))
        .collect::<Result<_, _>>()?;
    if clients.iter().any(|c| *c == 0 || *c > runner::CLIENTS_MAX) {
        return Err(format!("client counts must be in 1..={}", runner::CLIENTS_MAX));
    }
    Ok(clients)
}

/// Runs `keel bench`. `keel_exe`: the binary Keel nodes run (normally this one).
pub fn run(args: &BenchArgs) -> ExitCode {
    let exe = std::env::current_exe().expect("the running binary has a path");
    let keyspaces_max = keel_server::config::KEYSPACES_MAX as u32;
    let common = match &args.suite {
        Some(SuiteCommand::Suite(suite)) => &suite.common,
        _ => &args.common,
    };
    if common.keyspaces == 0 || common.keyspaces > keyspaces_max {
        eprintln!("keel bench: --keyspaces must be in 1..={keyspaces_max}");
        return ExitCode::from(2);
    }
    let result = match &args.suite {
        Some(SuiteCommand::Suite(suite)) => crate::suite::run(suite, &exe),
        Some(SuiteCommand::Report { file }) => crate::suite::report(file).map(|()| Vec::new()),
        None => single(args).and_then(|plans| execute(&plans, &args.common, &exe, None)),
    };
    match result {
        Ok(_) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("keel bench: {message}");
            ExitCode::from(2)
        }
    }
}

fn single(args: &BenchArgs) -> Result<Vec<Plan>, String> {
    let system: System = args.system.parse()?;
    let reads_everywhere = match args.reads.as_str() {
        "leader" => false,
        "all" => true,
        other => return Err(format!("--reads must be leader or all, not {other:?}")),
    };
    let clients = parse_clients(&args.clients)?;
    let workloads: Vec<WorkloadName> = parse_list(&args.workloads)?;
    Ok(workloads
        .into_iter()
        .map(|workload| Plan {
            system,
            config: args.config.clone(),
            reads_everywhere,
            workload,
            clients: clients.clone(),
            target_ops_s: args.target_ops_s,
            keyspaces: args.common.keyspaces,
        })
        .collect())
}

/// Runs every plan, printing each record as it completes; also appends each to `sink`.
pub fn execute(
    plans: &[Plan],
    common: &CommonArgs,
    exe: &std::path::Path,
    mut sink: Option<&mut Vec<RunRecord>>,
) -> Result<Vec<RunRecord>, String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    if !common.json {
        println!("{}", markdown_header());
    }
    let mut records = Vec::new();
    for plan in plans {
        let outcome = runtime.block_on(execute_plan(plan, common, exe));
        match outcome {
            Ok(plan_records) => {
                for record in plan_records {
                    if common.json {
                        println!("{}", record.to_json_line());
                    } else {
                        println!("{}", markdown_row(&record));
                    }
                    if let Some(sink) = sink.as_deref_mut() {
                        sink.push(record.clone());
                    }
                    records.push(record);
                }
            }
            Err(message) => eprintln!(
                "keel bench: {} {} workload {}: {message}",
                plan.system.name(),
                plan.config,
                plan.workload.letter()
            ),
        }
    }
    Ok(records)
}

async fn execute_plan(
    plan: &Plan,
    common: &CommonArgs,
    exe: &std::path::Path,
) -> Result<Vec<RunRecord>, String> {
    let mut spec = WorkloadSpec::core(plan.workload, common.records, common.records);
    spec.operation_count = common.records;
    if spec.scans() && matches!(plan.system, System::Redis | System::Zookeeper) {
        return Err("skipped: no ordered range reads (YCSB E), as in the ORCA paper".into());
    }
    eprintln!(
        "keel bench: starting {} ({}, reads at {}{})",
        plan.system.name(),
        plan.config,
        if plan.reads_everywhere { "all" } else { "leader" },
        if plan.keyspaces > 1 { format!(", {} keyspaces", plan.keyspaces) } else { String::new() }
    );
    let keel = systems::KeelSettings {
        emulated_fsync_us: common.emulated_fsync_us,
        flush_interval_ms: common.flush_interval_ms,
        keyspaces: plan.keyspaces,
    };
    let (running, target) =
        systems::start(plan.system, &plan.config, plan.reads_everywhere, exe, &keel)
            .await
            .map_err(|e| e.to_string())?;
    eprintln!(
        "keel bench: loading {} records for workload {}",
        spec.record_count,
        plan.workload.letter()
    );
    runner::load(&target, &spec, common.seed).await.map_err(|e| format!("load failed: {e}"))?;
    let label = RunLabel {
        system: plan.system.name().into(),
        config: plan.config.clone(),
        reads: if plan.reads_everywhere { "all" } else { "leader" }.into(),
        workload: plan.workload.letter().into(),
        records: spec.record_count,
        emulated_fsync_us: Some(common.emulated_fsync_us)
            .filter(|us| *us > 0 && plan.system == System::Keel),
        flush_interval_ms: common.flush_interval_ms.filter(|_| plan.system == System::Keel),
        keyspaces: Some(plan.keyspaces).filter(|k| *k > 1 && plan.system == System::Keel),
        seed: common.seed,
    };
    let mut records = Vec::new();
    for &clients in &plan.clients {
        let config = RunConfig {
            clients,
            warmup: Duration::from_secs(common.warmup),
            duration: Duration::from_secs(common.duration),
            target_ops_s: plan.target_ops_s,
            seed: common.seed,
        };
        records.push(measure(&running, &target, &spec, &config, &label).await?);
    }
    drop(running);
    Ok(records)
}

async fn measure(
    running: &Running,
    target: &runner::Target,
    spec: &WorkloadSpec,
    config: &RunConfig,
    label: &RunLabel,
) -> Result<RunRecord, String> {
    let http = running.keel_http_addrs();
    let metric = "keel_reads_with_durability_round_total";
    let rounds_before = crate::cluster::metric_sum(&http, metric).await;
    // Printed per run, summed over the nodes, per 100 reads issued (warm-up included):
    // where the reads went and how many fsyncs they cost.
    let shares =
        ["keel_forwarded_total", "keel_reads_off_loop_total", "keel_fsync_duration_seconds_count"];
    let mut shares_before = Vec::new();
    for name in shares {
        shares_before.push(crate::cluster::metric_sum(&http, name).await);
    }
    let progress =
        crate::progress::Progress::start(config.warmup + config.duration, label, config.clients);
    let outcome = runner::run(target, spec, config).await.map_err(|e| format!("run failed: {e}"));
    progress.finish();
    let outcome = outcome?;
    if let Some(error) = &outcome.first_error {
        eprintln!("keel bench: first error of the run: {error}");
    }
    let mut record = RunRecord::new(label, config.clients, config.target_ops_s, &outcome);
    record.server_rss_kib_max = running.server_rss_kib().into_iter().max();
    if !http.is_empty() {
        let rounds_after = crate::cluster::metric_sum(&http, metric).await;
        for (name, before) in shares.iter().zip(shares_before) {
            let after = crate::cluster::metric_sum(&http, name).await;
            if let (Some(before), Some(after), true) = (before, after, outcome.reads_total > 0) {
                let pct = after.saturating_sub(before) as f64 * 100.0 / outcome.reads_total as f64;
                eprintln!("keel bench: {name}: {pct:.2} per 100 reads issued");
            }
        }
        if let (Some(before), Some(after)) = (rounds_before, rounds_after) {
            if outcome.reads_total > 0 {
                let pct = after.saturating_sub(before) as f64 * 100.0 / outcome.reads_total as f64;
                record.reads_with_durability_round_pct = Some((pct * 100.0).round() / 100.0);
            }
        }
    }
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        args: BenchArgs,
    }

    #[test]
    fn single_run_flags_parse_into_plans() {
        let w = Wrapper::try_parse_from([
            "keel",
            "--system",
            "redis",
            "--config",
            "eventual",
            "--workloads",
            "a,b",
            "--clients",
            "1,10",
            "--reads",
            "all",
            "--json",
        ])
        .unwrap();
        let plans = single(&w.args).unwrap();
        assert_eq!(plans.len(), 2);
        assert_eq!(plans[1].workload, WorkloadName::B);
        assert_eq!(plans[0].clients, vec![1, 10]);
        assert!(plans[0].reads_everywhere && w.args.common.json);
    }

    #[test]
    fn bad_flags_are_refused() {
        assert!(parse_clients("0").is_err());
        assert!(parse_clients("1,x").is_err());
        assert!(parse_list::<WorkloadName>("a,q").is_err());
        let w = Wrapper::try_parse_from(["keel", "--reads", "nowhere"]).unwrap();
        assert!(single(&w.args).is_err());
    }

    #[test]
    fn suite_subcommand_parses() {
        let w = Wrapper::try_parse_from([
            "keel",
            "suite",
            "orca",
            "--systems",
            "keel,redis",
            "--duration",
            "5",
        ])
        .unwrap();
        let Some(SuiteCommand::Suite(suite)) = w.args.suite else { panic!("no suite") };
        assert_eq!(suite.name, "orca");
        assert_eq!(suite.common.duration, 5);
        assert_eq!(suite.common.emulated_fsync_us, 0, "off by default");
        let w = Wrapper::try_parse_from(["keel", "suite", "orca", "--emulated-fsync-us", "1500"])
            .unwrap();
        let Some(SuiteCommand::Suite(suite)) = w.args.suite else { panic!("no suite") };
        assert_eq!(suite.common.emulated_fsync_us, 1500);
        assert_eq!(suite.common.flush_interval_ms, None, "the server's default");
        let w = Wrapper::try_parse_from(["keel", "suite", "orca", "--flush-interval-ms", "20"])
            .unwrap();
        let Some(SuiteCommand::Suite(suite)) = w.args.suite else { panic!("no suite") };
        assert_eq!(suite.common.flush_interval_ms, Some(20));
        let zero = ["keel", "suite", "orca", "--flush-interval-ms", "0"];
        assert!(Wrapper::try_parse_from(zero).is_err(), "a zero period is refused");
    }
}
