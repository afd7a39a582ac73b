//! `keel check --bench`: times the checkers; a benchmark, not a test (figures go to
//! `docs/performance.md`, section "Checkers").
//!
//! Items: every history listed in `DIR/*/verdicts.tsv` (read + check,
//! verdict compared with the listed one), then a generated Keel history of 100,000
//! operations over 1,000 keys by 10 clients: writing and reading it back, the
//! linearizability check and the monotonic-reads check. Each item runs `--runs` times;
//! the median is printed as `bench<TAB>ITEM<TAB>OPS<TAB>VERDICT<TAB>MEDIAN_MS`.

use super::{lin_result, monotonic_result, CheckArgs};
use crate::generate::{keel_history, Shape};
use crate::history::{parse_history, write_history};
use crate::jepsen::{parse_kv_log, parse_register_log};
use crate::keel::lin_ops;
use crate::model::Model;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// The most runs per item.
const RUNS_MAX: usize = 101;

/// The generated history's shape.
pub const GENERATED: Shape = Shape {
    seed: 20_261_121,
    ops: 100_000,
    keys: 1000,
    clients: 10,
    unknown_percent: 5,
    window_max: 40,
};

pub(super) fn run(args: &CheckArgs) -> ExitCode {
    let runs = args.runs.clamp(1, RUNS_MAX);
    let base = &args.data_dir;
    if !base.is_dir() {
        eprintln!("keel check --bench: {} is not a folder (give --data-dir)", base.display());
        return ExitCode::from(2);
    }
    let mut all_agree = true;
    let mut shared_max = Duration::ZERO;
    for (folder, model) in [("etcd-jepsen", Model::Register), ("kv", Model::Kv)] {
        let listing = base.join(folder).join("verdicts.tsv");
        let Ok(text) = std::fs::read_to_string(&listing) else {
            eprintln!("keel check --bench: cannot read {}", listing.display());
            return ExitCode::from(2);
        };
        for row in text.lines().skip(1).filter(|l| !l.trim().is_empty()) {
            let Some((name, expected)) = row.split_once('\t') else { continue };
            let path = base.join(folder).join(name);
            let (median, ops, verdict) = time_shared(&path, model, args.budget, runs);
            shared_max = shared_max.max(median);
            all_agree &= verdict == expected.trim();
            print_item(&format!("{folder}/{name}"), ops, verdict, median);
        }
    }
    println!("bench\tshared-max\t-\t-\t{:.3}", ms(shared_max));
    all_agree &= bench_generated(args.budget, runs);
    ExitCode::from(if all_agree { 0 } else { 1 })
}

fn time_shared(
    path: &Path,
    model: Model,
    budget: u64,
    runs: usize,
) -> (Duration, usize, &'static str) {
    let mut times = Vec::with_capacity(runs);
    let mut outcome = (0, "unknown");
    for _ in 0..runs {
        let started = Instant::now();
        let name = path.display().to_string();
        let ops = std::fs::File::open(path)
            .map_err(|e| crate::error::InputError::new(&name, 0, e.to_string()))
            .and_then(|f| {
                let reader = std::io::BufReader::new(f);
                if model == Model::Register {
                    parse_register_log(reader, &name)
                } else {
                    parse_kv_log(reader, &name)
                }
            });
        outcome = match ops
            .and_then(|ops| lin_result(model, &ops, budget, &name).map(|r| (ops.len(), r)))
        {
            Ok((n, r)) => (n, r.verdict),
            Err(e) => {
                eprintln!("{e}");
                (0, "unknown")
            }
        };
        times.push(started.elapsed());
    }
    (median(times), outcome.0, outcome.1)
}

fn bench_generated(budget: u64, runs: usize) -> bool {
    let history = keel_history(&GENERATED);
    let ops = history.ops.len();
    let mut io_times = Vec::new();
    let mut lin_times = Vec::new();
    let mut mono_times = Vec::new();
    let mut verdicts = ("unknown", "unknown");
    for _ in 0..runs {
        let started = Instant::now();
        let bytes = write_history(Vec::new(), &history).expect("writing to memory");
        let read_back =
            parse_history(&bytes[..], "<generated>").expect("a generated history is valid");
        io_times.push(started.elapsed());
        assert_eq!(read_back.ops.len(), ops);

        let started = Instant::now();
        let lin = lin_result(Model::Keel, &lin_ops(&read_back.ops), budget, "<generated>")
            .expect("keel ops fit the keel model");
        lin_times.push(started.elapsed());

        let started = Instant::now();
        let mono = monotonic_result(&read_back);
        mono_times.push(started.elapsed());
        verdicts = (lin.verdict, mono.verdict);
    }
    print_item("generated/write+read", ops, "-", median(io_times));
    print_item("generated/linearizable", ops, verdicts.0, median(lin_times));
    print_item("generated/monotonic", ops, verdicts.1, median(mono_times));
    verdicts == ("linearizable", "ok")
}

fn print_item(item: &str, ops: usize, verdict: &str, median: Duration) {
    println!("bench\t{item}\t{ops}\t{verdict}\t{:.3}", ms(median));
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn median(mut times: Vec<Duration>) -> Duration {
    assert!(!times.is_empty(), "at least one run");
    times.sort_unstable();
    times[times.len() / 2]
}
