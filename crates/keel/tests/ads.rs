//! `keel example ads` end to end (the Correctables paper's ad serving): a client beside a
//! follower, peers 20 ms apart; each request serves the ads of the references its final
//! view gave, speculative or not. (Latencies are printed, not asserted: benchmarks live
//! apart from tests.)

use std::process::Command;

#[test]
fn speculative_ad_serving_serves_the_final_references_ads() {
    let out = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["example", "ads", "--requests", "20", "--update-every-ms", "5", "--json"])
        .output()
        .expect("keel example ads runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "keel example ads failed:\n{stdout}\n{stderr}");
    let report: serde_json::Value =
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(report["mismatched"], 0, "{report}");
    assert_eq!(report["requests"], 20, "{report}");
    assert!(report["aborted"].as_u64().unwrap() <= 20, "{report}");
    for field in ["speculative_p50_ms", "strong_p50_ms", "speculative_per_s", "strong_per_s"] {
        assert!(report[field].as_f64().is_some_and(|v| v > 0.0), "{field}: {report}");
    }
}
