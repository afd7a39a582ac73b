//! `keel sim run --engine geo`: seeds of the geo scenarios, with coverage.

use super::scenario::{run_general, GeoReport, GeoRunConfig};
use crate::cli::RunArgs;
use std::collections::BTreeMap;
use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

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
    let count = args.seeds.unwrap_or(1);
    if count == 0 || count > crate::cli::SEEDS_MAX {
        eprintln!("--seeds must be in 1..={}", crate::cli::SEEDS_MAX);
        return ExitCode::from(2);
    }
    let single = args.seeds.is_none();
    let config = |seed: u64| GeoRunConfig {
        seed,
        scenario: args.scenario.clone(),
        expose_non_uniform: args.expose_non_uniform,
        keep_history: single && args.history.is_some(),
    };
    if !single {
        std::panic::set_hook(Box::new(|_| {}));
    }
    let started = std::time::Instant::now();
    let threads =
        args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let next = AtomicU64::new(0);
    let failures = AtomicU64::new(0);
    let reaching: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());
    let out = Mutex::new(());
    let history = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..threads.clamp(1, 64) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    break;
                }
                let mut report = run_one(&config(args.seed.wrapping_add(i)));
                if !report.passed() {
                    failures.fetch_add(1, Ordering::Relaxed);
                }
                {
                    let mut r = reaching.lock().unwrap_or_else(|e| e.into_inner());
                    for path in report.reached.keys() {
                        *r.entry(path.clone()).or_default() += 1;
                    }
                }
                if let Some(h) = report.history.take() {
                    *history.lock().unwrap_or_else(|e| e.into_inner()) = Some(h);
                }
                let _guard = out.lock().unwrap_or_else(|e| e.into_inner());
                if !args.coverage || !report.passed() {
                    print_report(&report, args.json, single);
                }
            });
        }
    });
    if let (Some(path), Some(h)) =
        (&args.history, history.into_inner().unwrap_or_else(|e| e.into_inner()))
    {
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
    let failures = failures.into_inner();
    if !args.json {
        let secs = started.elapsed().as_secs_f64();
        println!(
            "{count} seeds, {failures} failed, {secs:.1}s ({:.1} seeds/s)",
            count as f64 / secs.max(1e-9)
        );
    }
    if args.coverage {
        let reaching = reaching.into_inner().unwrap_or_else(|e| e.into_inner());
        println!("{:<24} {:>8} {:>7}", "path", "seeds", "share");
        for (name, seeds) in &reaching {
            println!("{name:<24} {seeds:>8} {:>6.1}%", 100.0 * *seeds as f64 / count as f64);
        }
    }
    if failures == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
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
    for v in report.violations.iter().take(10) {
        let _ = writeln!(stdout, "     violation: {v}");
    }
    if let Some(panic) = &report.panic {
        let _ = writeln!(stdout, "     panic: {panic}");
    }
    let _ = writeln!(stdout, "     replay: {}", report.replay);
}
