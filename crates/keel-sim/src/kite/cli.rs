//! `keel sim run --engine kite`: seeds of the Kite scenarios, with coverage.

use super::scenario::{run_general, KiteReport, KiteRunConfig};
use crate::cli::RunArgs;
use std::io::Write;
use std::process::ExitCode;

/// The scenarios `--engine kite` runs.
pub const SCENARIOS: [&str; 4] = ["general", "litmus", "faults", "membership"];

/// Runs one seed of `scenario`.
pub fn run_one(config: &KiteRunConfig) -> KiteReport {
    match config.scenario.as_str() {
        "litmus" => super::litmus::run_litmus(config),
        "faults" => super::litmus::run_faults(config),
        _ => run_general(config),
    }
}

/// Runs `keel sim run --engine kite`.
pub fn run_seeds(args: &RunArgs) -> ExitCode {
    if !SCENARIOS.contains(&args.scenario.as_str()) {
        eprintln!("unknown kite scenario '{}' (expected: {})", args.scenario, SCENARIOS.join(", "));
        return ExitCode::from(2);
    }
    let single = args.seeds.is_none();
    let config = |seed: u64| KiteRunConfig {
        seed,
        scenario: args.scenario.clone(),
        no_slow_path: args.no_slow_path,
        release_before_acks: args.release_before_acks,
        complete_without_quorum: args.complete_without_quorum,
        no_epoch_snapshot: args.no_epoch_snapshot,
        paper_reset: args.paper_reset,
        no_rejoin: args.no_rejoin,
        unfenced_rejoin: args.unfenced_rejoin,
        unnamed_retries: args.unnamed_retries,
        uncommitted_failures: args.uncommitted_failures,
        forget_outcomes: args.forget_outcomes,
        unbounded_links: args.unbounded_links,
        new_quorum_only: args.new_quorum_only,
        unsynced_change: args.unsynced_change,
        mixed_epoch_rounds: args.mixed_epoch_rounds,
        keep_history: single && args.history.is_some(),
    };
    let swept = match crate::seeds::sweep(args, |seed| run_one(&config(seed)), |r| r.history.take())
    {
        Ok(swept) => swept,
        Err(code) => return code,
    };
    if let (Some(path), Some(ops)) = (&args.history, swept.history) {
        let written = std::fs::File::create(path).and_then(|f| {
            let mut w = std::io::BufWriter::new(f);
            keel_check::rc::write_jsonl(&mut w, &ops)?;
            w.flush()
        });
        if let Err(e) = written {
            eprintln!("cannot write {}: {e}", path.display());
            return ExitCode::from(2);
        }
        eprintln!("history of seed {} written to {}", args.seed, path.display());
    }
    crate::seeds::exit(swept.failures)
}

impl crate::seeds::SeedReport for KiteReport {
    fn passed(&self) -> bool {
        KiteReport::passed(self)
    }

    fn paths(&self) -> Vec<String> {
        self.reached.keys().cloned().collect()
    }

    fn print(&self, json: bool, verbose: bool) {
        print_report(self, json, verbose);
    }
}

fn print_report(report: &KiteReport, json: bool, verbose: bool) {
    let mut stdout = std::io::stdout().lock();
    if json {
        let mut value = serde_json::to_value(report).expect("reports serialize");
        value["passed"] = serde_json::Value::Bool(report.passed());
        let _ = writeln!(stdout, "{value}");
        return;
    }
    if verbose {
        for fault in &report.faults {
            let _ = writeln!(stdout, "  fault {fault}");
        }
    }
    let status = if report.passed() { "ok  " } else { "FAIL" };
    let _ = writeln!(
        stdout,
        "{status} seed {} nodes={} ops={} ok={} sync={} virtual={}ms",
        report.seed, report.nodes, report.ops, report.ok, report.sync_ops, report.virtual_ms
    );
    for v in report.violations.iter().take(10) {
        let _ = writeln!(stdout, "     violation: {v}");
    }
    if let Some(panic) = &report.panic {
        let _ = writeln!(stdout, "     panic: {panic}");
    }
    let _ = writeln!(stdout, "     replay: {}", report.replay);
}
