//! Seeds of a scenario run on threads, each seed's report printed as it ends (failures
//! only, with `--coverage`), then the count, the rate and, with `--coverage`, the share of
//! seeds that reached each path: what `--engine kite` and `--engine geo` share.

use crate::cli::RunArgs;
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// One seed's report, as the runner needs it.
pub trait SeedReport: Send {
    /// Whether nothing was violated.
    fn passed(&self) -> bool;
    /// The paths the run reached.
    fn paths(&self) -> Vec<String>;
    /// Prints the report (one JSON object with `json`; its faults too when `verbose`).
    fn print(&self, json: bool, verbose: bool);
}

/// What a sweep found: its failures, and the history one seed kept.
pub struct Swept<H> {
    /// Seeds that failed.
    pub failures: u64,
    /// The history the single seed kept, if it kept one.
    pub history: Option<H>,
}

/// Runs `args.seeds` seeds (one when not given) from `args.seed` through `run`, on
/// `args.threads` threads; `keep` takes a report's history. `Err`: bad arguments, with
/// the exit code.
pub fn sweep<R: SeedReport, H: Send>(
    args: &RunArgs,
    run: impl Fn(u64) -> R + Sync,
    keep: impl Fn(&mut R) -> Option<H> + Sync,
) -> Result<Swept<H>, ExitCode> {
    let count = args.seeds.unwrap_or(1);
    if count == 0 || count > crate::cli::SEEDS_MAX {
        eprintln!("--seeds must be in 1..={}", crate::cli::SEEDS_MAX);
        return Err(ExitCode::from(2));
    }
    let single = args.seeds.is_none();
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
                let mut report = run(args.seed.wrapping_add(i));
                if !report.passed() {
                    failures.fetch_add(1, Ordering::Relaxed);
                }
                {
                    let mut r = reaching.lock().unwrap_or_else(|e| e.into_inner());
                    for path in report.paths() {
                        *r.entry(path).or_default() += 1;
                    }
                }
                if let Some(h) = keep(&mut report) {
                    *history.lock().unwrap_or_else(|e| e.into_inner()) = Some(h);
                }
                let _guard = out.lock().unwrap_or_else(|e| e.into_inner());
                if !args.coverage || !report.passed() {
                    report.print(args.json, single);
                }
            });
        }
    });
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
    let history = history.into_inner().unwrap_or_else(|e| e.into_inner());
    Ok(Swept { failures, history })
}

/// The exit code of a sweep with `failures`.
pub fn exit(failures: u64) -> ExitCode {
    if failures == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
