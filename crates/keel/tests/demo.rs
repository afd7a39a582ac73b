//! `keel demo` end to end: it starts its cluster, runs the checked workload through a
//! leader crash, prints the table and verdicts, exits 0, and leaves no directory behind.

use std::process::Command;

#[test]
fn keel_demo_runs_checks_and_cleans_up() {
    let dir = std::env::temp_dir().join(format!("keel-test-demo-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["demo", "--seconds", "3", "--sessions", "4", "--seed", "11", "--dir"])
        .arg(&dir)
        .output()
        .expect("keel demo runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "keel demo failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("SIGKILL"), "{stdout}");
    assert!(stdout.contains("monotonic reads") && stdout.contains("(0 violations)"), "{stdout}");
    assert!(stdout.contains("durable keys") && stdout.contains(": linearizable"), "{stdout}");
    for label in [
        "get/any",
        "get/monotonic",
        "get/linearizable",
        "put/memory",
        "put/replicated",
        "put/durable",
    ] {
        assert!(stdout.contains(label), "no {label} row:\n{stdout}");
    }
    assert!(!dir.exists(), "the demo's directory was removed");
}
