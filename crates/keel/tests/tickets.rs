//! `keel example tickets` end to end (the Correctables paper's ticket selling): 500
//! tickets, 4 retailers, threshold 20, on a fault-free cluster and through a SIGKILL of
//! the leader part-way: every ticket sold once, none oversold, and most sales made on the
//! preliminary view.

use std::process::Command;

fn sale(extra: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["example", "tickets", "--tickets", "500", "--retailers", "4"])
        .args(["--threshold", "20", "--json"])
        .args(extra)
        .output()
        .expect("keel example tickets runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "keel example tickets failed:\n{stdout}\n{stderr}");
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

fn assert_sold_out_once(report: &serde_json::Value) {
    assert_eq!(report["oversold"], 0, "{report}");
    assert_eq!(report["duplicates"], 0, "{report}");
    assert_eq!(report["sold"], 500, "every ticket sold: {report}");
    assert_eq!(report["left"], 0, "{report}");
    let on_preliminary = report["sold_on_preliminary"].as_u64().unwrap();
    assert!(on_preliminary >= 400, "the guard band alone waits for the final view: {report}");
    assert!(report["revoked"].as_u64().unwrap() <= 4, "one per retailer at most: {report}");
    assert_eq!(report["revoked_sales"], 0, "no sale inside the guard band: {report}");
}

#[test]
fn every_ticket_is_sold_once_and_none_oversold() {
    let report = sale(&[]);
    assert_eq!(report["leader_killed"], false);
    assert_sold_out_once(&report);
}

#[test]
fn a_leader_killed_during_the_sale_loses_and_oversells_nothing() {
    let report = sale(&["--kill-leader"]);
    assert_eq!(report["leader_killed"], true, "{report}");
    assert_sold_out_once(&report);
}
