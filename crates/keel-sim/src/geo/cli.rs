//! `keel sim run --engine geo`: seeds of the geo scenarios, with coverage.

use super::scenario::{run_general, GeoReport, GeoRunConfig};
use crate::cli::RunArgs;
use std::io::Write;
use std::process::ExitCode;

/// The scenarios `--engine geo` runs: `general`, and each scripted one of `script.rs`
/// (`scripted` runs them all).
pub fn scenarios() -> Vec<&'static str> {
    let mut names = vec!["general", "scripted"];
    names.extend(super::script::SCRIPTS.iter().map(|(name, _)| *name));
    names
}

/// Runs one seed of the configured scenario; a panic becomes the report's failure.
pub fn run_one(config: &GeoRunConfig) -> GeoReport {
    let run = std::panic::catch_unwind(|| match config.scenario.as_str() {
        "general" => run_general(config),
        "scripted" => super::script::run_all(config),
        name => super::script::run_named(name, config),
    });
    run.unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic".into());
        GeoReport {
            seed: config.seed,
            scenario: config.scenario.clone(),
            panic: Some(message),
            replay: format!(
                "keel sim run --engine geo --scenario {} --seed {}",
                config.scenario, config.seed
            ),
            ..GeoReport::default()
        }
    })
}

/// Runs `keel sim run --engine geo`.
pub fn run_seeds(args: &RunArgs) -> ExitCode {
    if !scenarios().contains(&args.scenario.as_str()) {
        eprintln!(
            "unknown geo scenario '{}' (expected: {})",
            args.scenario,
            scenarios().join(", ")
        );
        return ExitCode::from(2);
    }
    let single = args.seeds.is_none();
    let config = |seed: u64| GeoRunConfig {
        seed,
        scenario: args.scenario.clone(),
        expose_non_uniform: args.expose_non_uniform,
        rejoin_empty: args.rejoin_empty,
        certify_all: args.certify_all,
        skip_strong_barrier: args.skip_strong_barrier,
        deliver_early: args.deliver_early,
        skip_recovery: args.skip_recovery,
        forget_unsettled: args.forget_unsettled,
        collect_suspected: args.collect_suspected,
        remove_beyond_f: args.remove_beyond_f,
        unagreed_removal: args.unagreed_removal,
        notice_at_rest: args.notice_at_rest,
        removed_silent: args.removed_silent,
        promises_held: args.promises_held,
        abort_committed: args.abort_committed,
        cut_quorum: args.cut_quorum,
        no_freeze: args.no_freeze,
        no_cut: args.no_cut,
        no_life: args.no_life,
        no_earlier_cuts: args.no_earlier_cuts,
        no_hold: args.no_hold,
        central_certifier: args.central_certifier,
        keep_history: single && args.history.is_some(),
    };
    let swept = match crate::seeds::sweep(args, |seed| run_one(&config(seed)), |r| r.history.take())
    {
        Ok(swept) => swept,
        Err(code) => return code,
    };
    if let (Some(path), Some(h)) = (&args.history, swept.history) {
        let written = std::fs::File::create(path).and_then(|f| {
            let mut w = std::io::BufWriter::new(f);
            serde_json::to_writer(&mut w, &h)?;
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

impl crate::seeds::SeedReport for GeoReport {
    fn passed(&self) -> bool {
        GeoReport::passed(self)
    }

    fn paths(&self) -> Vec<String> {
        self.reached.keys().cloned().collect()
    }

    fn print(&self, json: bool, verbose: bool) {
        print_report(self, json, verbose);
    }
}

fn print_report(report: &GeoReport, json: bool, verbose: bool) {
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
        "{status} seed {} {} dcs={} partitions={} txs={} updates={} syncs={} failed={:?} virtual={}ms",
        report.seed,
        report.scenario,
        report.dcs,
        report.partitions,
        report.txs,
        report.updates,
        report.syncs,
        report.failed,
        report.virtual_ms
    );
    if !report.counts.is_empty() {
        let _ = writeln!(stdout, "     by kind: {:?}", report.counts);
    }
    for v in report.violations.iter().take(10) {
        let _ = writeln!(stdout, "     violation: {v}");
    }
    if let Some(panic) = &report.panic {
        let _ = writeln!(stdout, "     panic: {panic}");
    }
    let _ = writeln!(stdout, "     replay: {}", report.replay);
}
