//! `keel check`: reads history files, runs one checker on each, prints one verdict line per
//! file and exits with a code scripts can use (`docs/checkers.md`).
//!
//! ```text
//! keel check --model register|kv|keel --format jepsen-register|jepsen-kv|keel
//!            [--property linearizable|monotonic|views|transactions] [--budget STEPS]
//!            [--json] FILE...
//! keel check [--model rc] [--format keel-rc] [--json] FILE...
//! keel check --model causal|--format keel-causal [--json] FILE...
//! keel check --bench [--data-dir DIR] [--runs N]
//! ```
//!
//! `--model rc` checks release consistency (RC_Lin, [`crate::rc`]) on `keel-rc`
//! histories; either flag implies the other, and with neither `--model` nor `--format`
//! the file must be a `keel-rc` history (its header line says so). `--model causal`
//! checks causal consistency of geo transactions ([`crate::causal`]) on `keel-causal`
//! histories (one JSON document each); either flag implies the other.
//!
//! Output: `FILE<TAB>VERDICT<TAB>MILLISECONDS` per file on stdout (verdict `linearizable`,
//! `not-linearizable`, `ok`, `violation` or `unknown`; milliseconds rounded to an integer),
//! counterexamples and input errors on stderr; with `--json`, one JSON object per file on
//! stdout instead. A file that cannot be read gets verdict `unknown` and an error.
//!
//! Exit code: 2 if any file could not be read or got `unknown` (or the arguments are
//! wrong); otherwise 1 if any file does not hold; otherwise 0.
//!
//! Layout: [`CheckArgs`] (the flags), [`run`] (the command), [`check_file`] (one file,
//! no printing), and the `bench` submodule (`--bench`).

mod bench;

use crate::error::InputError;
use crate::linearizability::{self, Verdict, BUDGET_STEPS_DEFAULT};
use crate::model::{LinOp, Model};
use crate::{causal, history, jepsen, keel, monotonic, rc, txn, views};
use serde_json::json;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// The history formats `keel check` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Jepsen etcd register logs (`INFO  jepsen.util - 3 :invoke :cas [1 4]`).
    JepsenRegister,
    /// Jepsen kv EDN logs (`{:process 0, :type :ok, :f :get, :key "7", :value ""}`).
    JepsenKv,
    /// Keel histories (JSON Lines, `docs/history-format.md`).
    Keel,
    /// Release-consistency histories (JSON Lines, header `{"format":"keel-rc",...}`), for
    /// `--model rc`.
    KeelRc,
    /// Causal geo-transaction histories (one JSON document), for `--model causal`.
    KeelCausal,
}

/// What `--model` names: a sequential model for linearizability, release consistency, or
/// causal consistency of geo transactions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CheckModel {
    /// read / write / cas; starts absent (Jepsen's etcd register).
    Register,
    /// get / put / append; starts `""` (Jepsen's kv test).
    Kv,
    /// Keel: get / put / delete / cas / incr; starts absent; incr on absent counts from 0.
    Keel,
    /// Release consistency (RC_Lin, Kite's model) over `keel-rc` histories.
    Rc,
    /// Causal consistency of geo transactions over `keel-causal` histories.
    Causal,
}

impl CheckModel {
    /// The sequential model, for every choice but `rc` and `causal`.
    pub fn sequential(self) -> Option<Model> {
        match self {
            CheckModel::Register => Some(Model::Register),
            CheckModel::Kv => Some(Model::Kv),
            CheckModel::Keel => Some(Model::Keel),
            CheckModel::Rc | CheckModel::Causal => None,
        }
    }
}

/// The properties `keel check` checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Property {
    /// Linearizability against `--model`, key by key.
    Linearizable,
    /// Cross-client monotonic reads over reads and survivors (`--format keel` only);
    /// each preliminary view of a read counts as a read of its own.
    Monotonic,
    /// The views of reads invoked as Correctables: in level order, no final view older
    /// than a `monotonic` one, and each view's level checked (`--format keel` only).
    Views,
    /// Transactions, each all or nothing and isolated, against the final log's replay
    /// (`--format keel` only).
    Transactions,
}

/// Flags of `keel check`.
#[derive(Clone, Debug, clap::Args)]
pub struct CheckArgs {
    /// The sequential model (needed for `--property linearizable`), `rc` for release
    /// consistency, or `causal` for causal consistency of geo transactions.
    #[arg(long, value_enum)]
    pub model: Option<CheckModel>,
    /// The format of the files (`keel-rc` goes with `--model rc`, and is assumed when
    /// neither flag is given; `keel-causal` goes with `--model causal`).
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// What to check.
    #[arg(long, value_enum, default_value_t = Property::Linearizable)]
    pub property: Property,
    /// Search steps allowed per key before the verdict is `unknown`.
    #[arg(long, default_value_t = BUDGET_STEPS_DEFAULT)]
    pub budget: u64,
    /// One JSON object per file on stdout instead of tab-separated lines.
    #[arg(long)]
    pub json: bool,
    /// Time the checkers on the shared reference histories and a generated
    /// 100,000-operation Keel history, instead of checking FILEs.
    #[arg(long)]
    pub bench: bool,
    /// The folder holding the reference histories, `etcd-jepsen/` and `kv/` (for
    /// `--bench`; the default is the repository's copy, from the repository's root).
    #[arg(long, default_value = "crates/keel-check/tests/data/linearizability")]
    pub data_dir: PathBuf,
    /// Runs per benchmark item; the median is reported (for `--bench`).
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// History files.
    pub files: Vec<PathBuf>,
}

/// What one file's check found.
#[derive(Clone, Debug)]
pub struct FileResult {
    /// The verdict's name.
    pub verdict: &'static str,
    /// `Some(true)` holds, `Some(false)` does not, `None` unknown.
    pub holds: Option<bool>,
    /// Operations checked.
    pub ops: usize,
    /// Search steps taken (linearizability only; 0 otherwise).
    pub steps: u64,
    /// Counterexample or violations for `--json` (`null` when it holds).
    pub details: serde_json::Value,
    /// Counterexample or violations for humans (empty when it holds).
    pub human: String,
}

/// Runs `keel check`.
pub fn run(args: &CheckArgs) -> ExitCode {
    if args.bench {
        return bench::run(args);
    }
    if let Err(message) = validate(args) {
        eprintln!("keel check: {message}");
        return ExitCode::from(2);
    }
    let mut code = 0u8;
    for path in &args.files {
        let started = Instant::now();
        let result = check_file(args, path);
        let elapsed = started.elapsed();
        let ms = elapsed.as_millis();
        let file = path.display().to_string();
        let line = match &result {
            Ok(r) => {
                code = code.max(match r.holds {
                    Some(true) => 0,
                    Some(false) => 1,
                    None => 2,
                });
                if !args.json && !r.human.is_empty() {
                    eprint!("{file}: {}", r.human);
                }
                json!({"file": file, "verdict": r.verdict, "ms": ms, "us": elapsed.as_micros() as u64,
                       "ops": r.ops, "steps": r.steps, "details": r.details})
            }
            Err(e) => {
                code = 2;
                if !args.json {
                    eprintln!("{e}");
                }
                json!({"file": file, "verdict": "unknown", "ms": ms, "us": elapsed.as_micros() as u64,
                       "error": {"file": e.file, "line": e.line, "message": e.message}})
            }
        };
        let printed = if args.json {
            line.to_string()
        } else {
            format!("{file}\t{}\t{ms}", line["verdict"].as_str().expect("set above"))
        };
        let mut out = std::io::stdout().lock();
        if writeln!(out, "{printed}").and_then(|()| out.flush()).is_err() {
            return ExitCode::from(2);
        }
    }
    ExitCode::from(code)
}

/// The format and model `args` ask for, defaults applied: `--model rc` and `--format
/// keel-rc` imply each other, and with neither flag the files are `keel-rc` histories
/// (the reader checks their header); `--model causal` and `--format keel-causal` imply
/// each other.
fn resolve(args: &CheckArgs) -> Result<(Format, Option<CheckModel>), String> {
    match (args.format, args.model) {
        (None | Some(Format::KeelCausal), Some(CheckModel::Causal))
        | (Some(Format::KeelCausal), None) => Ok((Format::KeelCausal, Some(CheckModel::Causal))),
        (Some(Format::KeelCausal), Some(model)) => Err(format!(
            "--format keel-causal is checked with --model causal, not --model {}",
            model.sequential().map_or("rc", Model::as_str)
        )),
        (Some(_), Some(CheckModel::Causal)) => {
            Err("--model causal needs --format keel-causal".to_string())
        }
        (None | Some(Format::KeelRc), None | Some(CheckModel::Rc)) => {
            Ok((Format::KeelRc, Some(CheckModel::Rc)))
        }
        (None, Some(_)) => Err("--format is required".to_string()),
        (Some(Format::KeelRc), Some(model)) => Err(format!(
            "--format keel-rc is checked with --model rc, not --model {}",
            model.sequential().map_or("rc", Model::as_str)
        )),
        (Some(_), Some(CheckModel::Rc)) => Err("--model rc needs --format keel-rc".to_string()),
        (Some(format), model) => Ok((format, model)),
    }
}

fn validate(args: &CheckArgs) -> Result<(), String> {
    let (format, model) = resolve(args)?;
    if args.files.is_empty() {
        return Err("no FILE given".to_string());
    }
    if args.budget == 0 {
        return Err("--budget must be at least 1".to_string());
    }
    match args.property {
        Property::Linearizable if model.is_none() => {
            Err("--model is required for --property linearizable".to_string())
        }
        Property::Monotonic | Property::Views | Property::Transactions
            if format != Format::Keel =>
        {
            Err("--property monotonic, views and transactions need --format keel".to_string())
        }
        _ => Ok(()),
    }
}

/// Reads and checks one file as `args` say (no printing). Arguments must be valid.
pub fn check_file(args: &CheckArgs, path: &Path) -> Result<FileResult, InputError> {
    let (format, model) = resolve(args).expect("validated: flags resolve");
    let name = path.display().to_string();
    let file = std::fs::File::open(path)
        .map_err(|e| InputError::new(&name, 0, format!("cannot open: {e}")))?;
    let reader = std::io::BufReader::new(file);
    if args.property == Property::Monotonic {
        let history = history::parse_history(reader, &name)?;
        return Ok(monotonic_result(&views::expand(&history)));
    }
    if args.property == Property::Views {
        let history = history::parse_history(reader, &name)?;
        return Ok(views_result(&history));
    }
    if args.property == Property::Transactions {
        let history = history::parse_history(reader, &name)?;
        return Ok(txn_result(&history));
    }
    if format == Format::KeelCausal {
        return Ok(causal_result(&causal::parse(reader, &name)?));
    }
    let Some(model) = model.expect("validated: --model given").sequential() else {
        return Ok(rc_result(&rc::parse_jsonl(reader, &name)?));
    };
    let ops = match format {
        Format::JepsenRegister => jepsen::parse_register_log(reader, &name)?,
        Format::JepsenKv => jepsen::parse_kv_log(reader, &name)?,
        Format::Keel => keel::lin_ops(&history::parse_history(reader, &name)?.ops),
        Format::KeelRc | Format::KeelCausal => {
            unreachable!("validated: keel-rc and keel-causal go with their models")
        }
    };
    lin_result(model, &ops, args.budget, &name)
}

/// Checks `ops` for release consistency (RC_Lin, [`crate::rc`]).
pub fn rc_result(ops: &[rc::RcOp]) -> FileResult {
    let verdict = rc::check(ops);
    let holds = verdict.holds();
    let mut human = String::new();
    let details = if holds {
        serde_json::Value::Null
    } else {
        human.push_str(&format!(
            "{} violation(s) of release consistency (RC_Lin) in {} ops ({} synchronization)\n",
            verdict.violation_count, verdict.ops, verdict.sync_ops
        ));
        for violation in &verdict.violations {
            human.push_str(&format!("{violation}\n"));
        }
        if verdict.violation_count > verdict.violations.len() {
            human.push_str(&format!(
                "... and {} more\n",
                verdict.violation_count - verdict.violations.len()
            ));
        }
        json!({
            "ops": verdict.ops,
            "sync_ops": verdict.sync_ops,
            "violations_total": verdict.violation_count,
            "violations": verdict.violations.iter().map(|v| json!({
                "rule": v.rule,
                "message": v.message,
                "ops": v.ops,
            })).collect::<Vec<_>>(),
        })
    };
    FileResult {
        verdict: verdict.verdict(),
        holds: Some(holds),
        ops: verdict.ops,
        steps: 0,
        details,
        human,
    }
}

/// Checks a `keel-causal` history for causal consistency ([`crate::causal`]).
pub fn causal_result(history: &causal::history::CausalHistory) -> FileResult {
    let report = causal::check(history);
    let holds = report.holds();
    let mut human = String::new();
    let details = if holds {
        serde_json::Value::Null
    } else {
        human.push_str(&format!(
            "{} violation(s) of causal consistency in {} transactions ({} committed)\n",
            report.violations_total, report.txs, report.committed
        ));
        for violation in &report.violations {
            human.push_str(&format!("{violation}\n"));
        }
        if report.violations_total > report.violations.len() {
            human.push_str(&format!(
                "... and {} more\n",
                report.violations_total - report.violations.len()
            ));
        }
        json!({
            "txs": report.txs,
            "committed": report.committed,
            "violations_total": report.violations_total,
            "counts": report.counts,
            "violations": report.violations.iter().map(|v| json!({
                "kind": v.kind,
                "detail": v.detail,
            })).collect::<Vec<_>>(),
        })
    };
    FileResult {
        verdict: report.verdict(),
        holds: Some(holds),
        ops: report.txs,
        steps: 0,
        details,
        human,
    }
}

/// Checks `ops` for linearizability under `model`.
pub fn lin_result(
    model: Model,
    ops: &[LinOp],
    budget: u64,
    file: &str,
) -> Result<FileResult, InputError> {
    if let Some(op) = ops.iter().find(|op| !model.allows(&op.action)) {
        return Err(InputError::new(
            file,
            0,
            format!("op #{}: model {model} has no {} operation", op.id, op.action.name()),
        ));
    }
    let report =
        linearizability::check(model, ops, linearizability::Config { budget_steps: budget });
    let verdict = report.verdict.name();
    let (holds, details, human) = match &report.verdict {
        Verdict::Linearizable => (Some(true), serde_json::Value::Null, String::new()),
        Verdict::NotLinearizable(c) => (Some(false), counterexample_json(c), c.to_string()),
        Verdict::Unknown { key, budget_steps } => (
            None,
            json!({"key": key, "budget_steps": budget_steps}),
            format!("key {key:?}: search budget of {budget_steps} steps exhausted\n"),
        ),
    };
    Ok(FileResult { verdict, holds, ops: ops.len(), steps: report.steps, details, human })
}

fn counterexample_json(c: &linearizability::Counterexample) -> serde_json::Value {
    json!({
        "key": c.key,
        "prefix_len": c.prefix_len,
        "prefix_tail": c.prefix_tail.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "state": c.state,
        "stuck": c.stuck.iter().map(|(op, why)| json!({"op": op.to_string(), "why": why})).collect::<Vec<_>>(),
    })
}

/// Checks the views of `history`'s invoked reads: the order and freshness rules, and
/// the monotonic-reads checker over every view as a read.
pub fn views_result(history: &history::KeelHistory) -> FileResult {
    let report = views::check(history);
    let monotonic = monotonic_result(&views::expand(history));
    let holds = report.violations_total == 0 && monotonic.holds == Some(true);
    let mut human = String::new();
    for violation in &report.violations {
        human.push_str(violation);
        human.push('\n');
    }
    human.push_str(&monotonic.human);
    let details = if holds {
        serde_json::Value::Null
    } else {
        json!({
            "invocations": report.invocations,
            "views": report.views,
            "violations_total": report.violations_total,
            "violations": report.violations,
            "monotonic": monotonic.details,
        })
    };
    FileResult {
        verdict: if holds { "ok" } else { "violation" },
        holds: Some(holds),
        ops: history.ops.len(),
        steps: 0,
        details,
        human,
    }
}

/// Checks the transactions of a Keel history ([`crate::txn`]).
pub fn txn_result(history: &history::KeelHistory) -> FileResult {
    let report = txn::check(history);
    let holds = report.violations_total == 0;
    let details = if holds {
        serde_json::Value::Null
    } else {
        json!({
            "txns": report.txns,
            "violations_total": report.violations_total,
            "violations": report.violations.iter().map(|v| json!({
                "rule": v.rule.name(),
                "txn": v.txn,
                "message": v.message,
            })).collect::<Vec<_>>(),
        })
    };
    let mut human = String::new();
    if !holds {
        human.push_str(&format!(
            "{} violations in {} transactions\n",
            report.violations_total, report.txns
        ));
        for v in &report.violations {
            human.push_str(&format!("{v}\n"));
        }
    }
    FileResult {
        verdict: report.verdict(),
        holds: Some(holds),
        ops: report.txns,
        steps: 0,
        details,
        human,
    }
}

/// Checks cross-client monotonic reads of `history`.
pub fn monotonic_result(history: &history::KeelHistory) -> FileResult {
    let report = monotonic::check(history);
    let holds = report.violations_total == 0;
    let details = if holds {
        serde_json::Value::Null
    } else {
        json!({
            "reads": report.reads,
            "violations_total": report.violations_total,
            "violations": report.violations.iter().map(|v| json!({
                "rule": v.rule.name(),
                "message": v.message,
                "read": monotonic::describe(&v.read),
                "earlier": v.earlier.as_ref().map(monotonic::describe),
            })).collect::<Vec<_>>(),
        })
    };
    let mut human = String::new();
    if !holds {
        human.push_str(&format!(
            "{} of {} reads break monotonic reads\n",
            report.violations_total, report.reads
        ));
        for v in &report.violations {
            human.push_str(&v.to_string());
        }
    }
    FileResult {
        verdict: report.verdict(),
        holds: Some(holds),
        ops: history.ops.len(),
        steps: 0,
        details,
        human,
    }
}
