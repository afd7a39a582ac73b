//! Data-driven interaction traces over `keel_exec::Replica`, in the spirit of etcd-raft's
//! `testdata/*.txt`: each file under `src/leader/testdata/` (ORCA) and
//! `src/kite/testdata/` (Kite) is a script of commands, each followed by the output it
//! must print (`docs/testing.md`, *Interaction traces*).
//!
//! - `traces_match`: every trace prints what it says it prints.
//!   `KEEL_TRACES_REWRITE=1` writes the outputs instead of comparing them.
//! - `controls_break_every_trace`: every trace names a fault switch (`# breaks-with:`)
//!   and prints something else with it on: each trace is shown to catch its fault.

mod kite;
mod orca;
mod script;
mod world;

use keel_core::kite::KiteEngine;
use keel_core::leader::LeaderEngine;
use script::{Cmd, Script};
use std::path::{Path, PathBuf};
use world::{Controls, Traced, World};

/// A world of any engine kind.
trait Run {
    fn run(&mut self, cmd: &Cmd) -> Result<String, String>;
}

impl<E: Traced> Run for World<E> {
    fn run(&mut self, cmd: &Cmd) -> Result<String, String> {
        World::run(self, cmd)
    }
}

fn start<E: Traced>(cmd: &Cmd, controls: &Controls) -> Result<(Box<dyn Run>, String), String> {
    let (world, printed) = World::<E>::new(cmd, controls.clone())?;
    Ok((Box::new(world), printed))
}

/// Runs a script's commands in order; returns each one's output.
fn run_script(script: &Script, controls: &Controls) -> Result<Vec<String>, String> {
    let mut world: Option<Box<dyn Run>> = None;
    let mut outputs = Vec::new();
    for block in script.blocks() {
        let cmd = Cmd::parse(&block.command);
        let at = |e: String| format!("line {}: {}: {e}", block.line, block.command);
        let output = if cmd.name == "cluster" {
            let (w, printed) = match cmd.args.get("engine").map(String::as_str) {
                Some("orca") => start::<LeaderEngine>(&cmd, controls),
                Some("kite") => start::<KiteEngine>(&cmd, controls),
                _ => Err("engine=orca or engine=kite".to_string()),
            }
            .map_err(at)?;
            world = Some(w);
            printed
        } else {
            let w = world.as_mut().ok_or_else(|| at("no cluster yet".into()))?;
            w.run(&cmd).map_err(at)?
        };
        outputs.push(output);
    }
    Ok(outputs)
}

/// Every trace, or those whose path contains `KEEL_TRACES_ONLY`.
fn traces() -> Vec<PathBuf> {
    let only = std::env::var("KEEL_TRACES_ONLY").unwrap_or_default();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    for dir in ["leader/testdata", "kite/testdata"] {
        let entries = std::fs::read_dir(root.join(dir)).expect("a testdata directory");
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            let chosen = path.to_string_lossy().contains(&only);
            if chosen && path.extension().is_some_and(|e| e == "txt") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

fn load(path: &Path) -> Script {
    let text = std::fs::read_to_string(path).expect("a readable trace");
    Script::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn name(path: &Path) -> String {
    let parent = path.parent().and_then(Path::parent).and_then(Path::file_name);
    format!(
        "{}/{}",
        parent.unwrap_or_default().to_string_lossy(),
        path.file_name().unwrap_or_default().to_string_lossy()
    )
}

#[test]
fn traces_match() {
    let rewrite = std::env::var_os("KEEL_TRACES_REWRITE").is_some_and(|v| v != "0");
    let mut failures = Vec::new();
    let files = traces();
    if !rewrite && std::env::var_os("KEEL_TRACES_ONLY").is_none() {
        assert!(files.len() >= 12, "at least 12 traces, found {}", files.len());
    }
    for path in files {
        let script = load(&path);
        let outputs = match run_script(&script, &Controls::default()) {
            Ok(outputs) => outputs,
            Err(e) => {
                failures.push(format!("{}: {e}", name(&path)));
                continue;
            }
        };
        if rewrite {
            std::fs::write(&path, script.render(&outputs)).expect("a writable trace");
            continue;
        }
        for (block, got) in script.blocks().zip(&outputs) {
            if *got != block.expected {
                failures.push(format!(
                    "{}:{}: {}\n--- expected\n{}\n--- got\n{}\n",
                    name(&path),
                    block.line,
                    block.command,
                    block.expected,
                    got
                ));
                break;
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} trace(s) differ (KEEL_TRACES_REWRITE=1 rewrites them):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn controls_break_every_trace() {
    let mut failures = Vec::new();
    for path in traces() {
        let script = load(&path);
        let Some(control) = script.header("breaks-with") else {
            failures.push(format!("{}: names no `# breaks-with:` control", name(&path)));
            continue;
        };
        let controls = Controls([control.clone()].into());
        let run = std::panic::catch_unwind(|| run_script(&script, &controls));
        let same = match run {
            Ok(Ok(outputs)) => script.blocks().zip(&outputs).all(|(b, got)| *got == b.expected),
            Ok(Err(e)) if e.contains("no control named") => {
                failures.push(format!("{}: {e}", name(&path)));
                continue;
            }
            Ok(Err(_)) | Err(_) => false,
        };
        if same {
            failures.push(format!("{}: unchanged with {control} on", name(&path)));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
