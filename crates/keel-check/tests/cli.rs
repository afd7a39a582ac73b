//! `keel check` end to end through `cli::run` and `cli::check_file`: verdicts, exit codes
//! and input errors.

use clap::Parser;
use keel_check::cli::{check_file, run, CheckArgs};
use keel_check::generate::{keel_history, Shape};
use keel_check::history::write_history;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: CheckArgs,
}

fn args(words: &[&str]) -> CheckArgs {
    let mut all = vec!["check"];
    all.extend_from_slice(words);
    Cli::try_parse_from(all).expect("valid flags").args
}

/// A file under the target's temporary folder, unique per test name.
fn temp_file(name: &str, contents: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("keel-check-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(name);
    std::fs::write(&path, contents).expect("write temp file");
    path
}

fn code(c: ExitCode) -> String {
    format!("{c:?}")
}

const LINEARIZABLE: &str = "INFO  jepsen.util - 0\t:invoke\t:write\t1\n\
                            INFO  jepsen.util - 0\t:ok\t:write\t1\n\
                            INFO  jepsen.util - 1\t:invoke\t:read\tnil\n\
                            INFO  jepsen.util - 1\t:ok\t:read\t1\n";
const NOT_LINEARIZABLE: &str = "INFO  jepsen.util - 0\t:invoke\t:write\t1\n\
                                INFO  jepsen.util - 0\t:ok\t:write\t1\n\
                                INFO  jepsen.util - 1\t:invoke\t:read\tnil\n\
                                INFO  jepsen.util - 1\t:ok\t:read\tnil\n";

#[test]
fn exit_codes_follow_the_verdicts() {
    let good = temp_file("good.log", LINEARIZABLE.as_bytes());
    let bad = temp_file("bad.log", NOT_LINEARIZABLE.as_bytes());
    let broken = temp_file("broken.log", b"INFO  jepsen.util - 0\t:invoke\t:read\tnil\nnonsense\n");
    let flags = ["--model", "register", "--format", "jepsen-register"];
    let with = |files: &[&PathBuf]| {
        let mut words: Vec<String> = flags.iter().map(|s| s.to_string()).collect();
        words.extend(files.iter().map(|p| p.display().to_string()));
        let refs: Vec<&str> = words.iter().map(String::as_str).collect();
        code(run(&args(&refs)))
    };
    assert_eq!(with(&[&good]), code(ExitCode::from(0)));
    assert_eq!(with(&[&good, &bad]), code(ExitCode::from(1)));
    assert_eq!(with(&[&bad, &broken]), code(ExitCode::from(2)));
    let absent = good.with_file_name("absent.log");
    assert_eq!(with(&[&absent]), code(ExitCode::from(2)));
}

#[test]
fn malformed_input_names_file_and_line() {
    let broken =
        temp_file("broken2.log", b"INFO  jepsen.util - 0\t:invoke\t:read\tnil\nnonsense\n");
    let a = args(&["--model", "register", "--format", "jepsen-register", "x"]);
    let e = check_file(&a, &broken).unwrap_err();
    assert_eq!(e.line, 2);
    assert_eq!(e.file, broken.display().to_string());
}

#[test]
fn bad_flag_combinations_exit_2() {
    let good = temp_file("good3.log", LINEARIZABLE.as_bytes());
    let file = good.display().to_string();
    let monotonic_jepsen = args(&["--format", "jepsen-register", "--property", "monotonic", &file]);
    assert_eq!(code(run(&monotonic_jepsen)), code(ExitCode::from(2)));
    let no_model = args(&["--format", "jepsen-register", &file]);
    assert_eq!(code(run(&no_model)), code(ExitCode::from(2)));
    let cas = temp_file(
        "cas.log",
        b"INFO  jepsen.util - 0\t:invoke\t:cas\t[1 2]\nINFO  jepsen.util - 0\t:fail\t:cas\t[1 2]\n",
    );
    let cas = cas.display().to_string();
    let wrong_model = args(&["--model", "kv", "--format", "jepsen-register", &cas]);
    assert_eq!(code(run(&wrong_model)), code(ExitCode::from(2)), "the kv model has no cas");
    let right_model = args(&["--model", "register", "--format", "jepsen-register", &cas]);
    assert_eq!(code(run(&right_model)), code(ExitCode::from(0)));
}

#[test]
fn keel_histories_check_both_properties() {
    let history = keel_history(&Shape { ops: 500, ..Shape::default() });
    let path = temp_file("h.jsonl", &write_history(Vec::new(), &history).unwrap());
    let file = path.display().to_string();
    let lin = check_file(&args(&["--model", "keel", "--format", "keel", &file]), &path).unwrap();
    assert_eq!(lin.verdict, "linearizable");
    let mono =
        check_file(&args(&["--format", "keel", "--property", "monotonic", &file]), &path).unwrap();
    assert_eq!(mono.verdict, "ok");
    assert_eq!(mono.ops, 500);
}

#[test]
fn transactions_are_checked_from_a_file_and_a_commit_over_a_delete_is_rejected() {
    // `a` set at 1 and deleted at 2; a transaction watched it never written and wrote
    // `b`: committed at 3 is a violation, aborted is not.
    let lines = |outcome: &str, applied: bool| {
        let txn = format!(
            r#"{{"type":"txn","id":5,"client":2,"watch":[{{"key":"a","version":null}}],"ops":[{{"op":"put","key":"b","value":"x"}}],"durability":"memory","invoke_ns":1,"complete_ns":9,{outcome}}}"#
        );
        let mut text = vec![
            r#"{"type":"header","format":"keel-history","version":2}"#.to_string(),
            txn,
            r#"{"type":"survivor","version":{"epoch":1,"index":1},"key":"a","value":"v"}"#.into(),
            r#"{"type":"survivor","version":{"epoch":1,"index":2},"key":"a","value":null}"#.into(),
            format!(
                r#"{{"type":"txn-entry","version":{{"epoch":1,"index":3}},"applied":{applied}}}"#
            ),
        ];
        if applied {
            text.push(
                r#"{"type":"survivor","version":{"epoch":1,"index":3},"key":"b","value":"x"}"#
                    .into(),
            );
        }
        text.join("\n")
    };
    let committed = r#""outcome":"ok","version":{"epoch":1,"index":3}"#;
    let bad = temp_file("txn-bad.jsonl", lines(committed, true).as_bytes());
    let good =
        temp_file("txn-good.jsonl", lines(r#""outcome":"fail","aborted":true"#, false).as_bytes());
    let check = |path: &PathBuf| {
        let file = path.display().to_string();
        let a = args(&["--format", "keel", "--property", "transactions", &file]);
        (check_file(&a, path).unwrap(), code(run(&a)))
    };
    let (result, exit) = check(&bad);
    assert_eq!((result.verdict, exit), ("violation", code(ExitCode::from(1))));
    assert!(result.human.contains("txn-watch"), "{}", result.human);
    let (result, exit) = check(&good);
    assert_eq!((result.verdict, result.ops, exit), ("ok", 1, code(ExitCode::from(0))));
    let wrong = args(&["--format", "jepsen-kv", "--property", "transactions", "x"]);
    assert_eq!(code(run(&wrong)), code(ExitCode::from(2)));
}

#[test]
fn a_tiny_budget_gives_unknown_and_exit_2() {
    let history = keel_history(&Shape { ops: 500, keys: 1, ..Shape::default() });
    let path = temp_file("h2.jsonl", &write_history(Vec::new(), &history).unwrap());
    let a = args(&[
        "--model",
        "keel",
        "--format",
        "keel",
        "--budget",
        "5",
        &path.display().to_string(),
    ]);
    assert_eq!(check_file(&a, &path).unwrap().verdict, "unknown");
    assert_eq!(code(run(&a)), code(ExitCode::from(2)));
}

/// A Keel history: a durable write of `v2`, then a read invoked at `any`, `monotonic`
/// and `linearizable` whose monotonic view shows `v2` and whose final view shows
/// `final_index` (1: the older write, a stale final view).
fn invoked_history(final_index: u64) -> String {
    let header = r#"{"type":"header","format":"keel-history","version":1}"#;
    let w1 = r#"{"type":"op","id":0,"client":1,"op":"put","key":"k","value":"v1","durability":"durable","invoke_ns":0,"complete_ns":5,"outcome":"ok","version":{"epoch":1,"index":1}}"#;
    let w2 = r#"{"type":"op","id":1,"client":1,"op":"put","key":"k","value":"v2","durability":"durable","invoke_ns":10,"complete_ns":15,"outcome":"ok","version":{"epoch":1,"index":2}}"#;
    let read = format!(
        r#"{{"type":"op","id":2,"client":2,"op":"get","key":"k","level":"linearizable","invoke_ns":20,"complete_ns":40,"outcome":"ok","result":"v{final_index}","version":{{"epoch":1,"index":{final_index}}},"views":[{{"level":"any","result":"v1","version":{{"epoch":1,"index":1}},"at_ns":25}},{{"level":"monotonic","result":"v2","version":{{"epoch":1,"index":2}},"at_ns":30}}]}}"#
    );
    let s1 = r#"{"type":"survivor","version":{"epoch":1,"index":1},"key":"k","value":"v1"}"#;
    let s2 = r#"{"type":"survivor","version":{"epoch":1,"index":2},"key":"k","value":"v2"}"#;
    [header, w1, w2, &read, s1, s2].join("\n") + "\n"
}

#[test]
fn views_are_checked_and_a_stale_final_view_exits_1() {
    let good = temp_file("views-good.jsonl", invoked_history(2).as_bytes());
    let stale = temp_file("views-stale.jsonl", invoked_history(1).as_bytes());
    for (path, verdict) in [(&good, "ok"), (&stale, "violation")] {
        let file = path.display().to_string();
        let result =
            check_file(&args(&["--format", "keel", "--property", "views", &file]), path).unwrap();
        assert_eq!(result.verdict, verdict, "{}", result.human);
    }
    let file = stale.display().to_string();
    let views = args(&["--format", "keel", "--property", "views", &file]);
    assert_eq!(code(run(&views)), code(ExitCode::from(1)), "negative control: exit 1");
    let jepsen = args(&["--format", "jepsen-register", "--property", "views", &file]);
    assert_eq!(code(run(&jepsen)), code(ExitCode::from(2)));
}

/// A `keel-rc` history of message passing: S1 writes x and releases f; S2 acquires f
/// and reads x (`x_stamp` 0: the initial value, a stale read).
fn rc_history_text(x_stamp: u64) -> String {
    let stamp = |v: u64, w: u64| format!(r#"{{"version":{v},"writer":{w},"rmw":0}}"#);
    let x_read = if x_stamp == 0 { "null".to_string() } else { "1".to_string() };
    let lines = [
        keel_check::rc::HEADER.to_string(),
        format!(
            r#"{{"id":0,"session":1,"machine":0,"seq":0,"kind":"write","key":1,"invoke":0,"complete":1,"wrote":[{},1],"arg":1}}"#,
            stamp(1, 0)
        ),
        format!(
            r#"{{"id":1,"session":1,"machine":0,"seq":1,"kind":"release","key":2,"invoke":2,"complete":3,"wrote":[{},1],"arg":1}}"#,
            stamp(1, 0)
        ),
        format!(
            r#"{{"id":2,"session":2,"machine":1,"seq":0,"kind":"acquire","key":2,"invoke":4,"complete":5,"read":[{},1]}}"#,
            stamp(1, 0)
        ),
        format!(
            r#"{{"id":3,"session":2,"machine":1,"seq":1,"kind":"read","key":1,"invoke":6,"complete":7,"read":[{},{x_read}]}}"#,
            stamp(x_stamp, 0)
        ),
    ];
    lines.join("\n") + "\n"
}

#[test]
fn rc_histories_exit_0_1_2() {
    let good = temp_file("rc-good.jsonl", rc_history_text(1).as_bytes());
    let stale = temp_file("rc-stale.jsonl", rc_history_text(0).as_bytes());
    let broken = temp_file(
        "rc-broken.jsonl",
        format!("{}\n{{\"id\":0}}\n", keel_check::rc::HEADER).as_bytes(),
    );
    let (good_s, stale_s, broken_s) =
        (good.display().to_string(), stale.display().to_string(), broken.display().to_string());
    for flags in [
        &["--model", "rc"][..],
        &["--format", "keel-rc"],
        &["--model", "rc", "--format", "keel-rc"],
        &[],
    ] {
        let with = |file: &str| {
            let mut words = flags.to_vec();
            words.push(file);
            args(&words)
        };
        assert_eq!(code(run(&with(&good_s))), code(ExitCode::from(0)), "{flags:?}");
        assert_eq!(code(run(&with(&stale_s))), code(ExitCode::from(1)), "{flags:?}");
        assert_eq!(code(run(&with(&broken_s))), code(ExitCode::from(2)), "{flags:?}");
    }
    let result = check_file(&args(&["--model", "rc", &stale_s]), &stale).unwrap();
    assert_eq!((result.verdict, result.holds, result.ops), ("violation", Some(false), 4));
    assert!(result.human.contains("stale-read"), "{}", result.human);
    assert_eq!(result.details["violations"][0]["rule"], "stale-read");
    assert_eq!(result.details["violations"][0]["ops"], serde_json::json!([0, 1, 2, 3]));
    let e = check_file(&args(&["--model", "rc", &broken_s]), &broken).unwrap_err();
    assert_eq!((e.file.as_str(), e.line), (broken_s.as_str(), 2));
}

#[test]
fn rc_flags_must_agree() {
    let good = temp_file("rc-good2.jsonl", rc_history_text(1).as_bytes());
    let file = good.display().to_string();
    for words in [
        &["--model", "rc", "--format", "keel", &file][..],
        &["--model", "keel", "--format", "keel-rc", &file],
        &["--model", "rc", "--property", "monotonic", &file],
        &["--model", "keel", &file],
    ] {
        assert_eq!(code(run(&args(words))), code(ExitCode::from(2)), "{words:?}");
    }
    // A Keel history given with no flags is not a keel-rc history: input error, exit 2.
    let history = keel_history(&Shape { ops: 20, ..Shape::default() });
    let keel = temp_file("not-rc.jsonl", &write_history(Vec::new(), &history).unwrap());
    let e = check_file(&args(&[&keel.display().to_string()]), &keel).unwrap_err();
    assert!(e.message.contains("keel-history"), "{}", e.message);
}

/// A `keel-causal` history: Alice deposits to Bob, then notifies him; Bob, at another data
/// center, reads the note and his balance (`balance`: 100 is right, 0 breaks causality).
fn causal_history_text(balance: i64) -> String {
    let tx = |node: u32,
              seq: u64,
              session: u64,
              dc: u32,
              snap: [u64; 4],
              at: u64,
              ops: serde_json::Value,
              vector: [u64; 4]| {
        serde_json::json!({
            "id": {"node": node, "seq": seq}, "session": session, "dc": dc, "past": snap,
            "snap": snap, "at_ns": at, "order": at, "ops": ops,
            "outcome": {"outcome": "committed", "vector": vector},
        })
    };
    serde_json::json!({
        "dcs": 3, "f": 1, "failed": [],
        "txs": [
            tx(0, 1, 1, 0, [0, 0, 0, 0], 10,
               serde_json::json!([{"op": "update", "key": "bob", "update": {"type": "add", "delta": 100}}]),
               [1, 0, 0, 0]),
            tx(0, 2, 1, 0, [1, 0, 0, 0], 20,
               serde_json::json!([{"op": "update", "key": "inbox", "update": {"type": "set", "value": "note"}}]),
               [2, 0, 0, 0]),
            tx(1, 1, 2, 1, [2, 0, 0, 0], 30,
               serde_json::json!([
                   {"op": "read", "key": "inbox", "kind": "register", "seen": {"type": "register", "value": "note"}},
                   {"op": "read", "key": "bob", "kind": "counter", "seen": {"type": "counter", "value": balance}},
               ]),
               [2, 0, 0, 0]),
        ],
        "committed": [], "syncs": [],
        "stored": [
            {"dc": 0, "origin": 0, "through": 2, "at_ns": 21},
            {"dc": 1, "origin": 0, "through": 2, "at_ns": 25},
        ],
        "finals": [],
    })
    .to_string()
}

#[test]
fn causal_histories_exit_0_1_2() {
    let good = temp_file("causal-good.json", causal_history_text(100).as_bytes());
    let bad = temp_file("causal-bad.json", causal_history_text(0).as_bytes());
    let broken = temp_file("causal-broken.json", b"{\"dcs\": 3,\n\"f\": 1,\n\"txs\": 7}");
    let (good_s, bad_s, broken_s) =
        (good.display().to_string(), bad.display().to_string(), broken.display().to_string());
    for flags in [
        &["--model", "causal"][..],
        &["--format", "keel-causal"],
        &["--model", "causal", "--format", "keel-causal"],
    ] {
        let with = |file: &str| {
            let mut words = flags.to_vec();
            words.push(file);
            args(&words)
        };
        assert_eq!(code(run(&with(&good_s))), code(ExitCode::from(0)), "{flags:?}");
        assert_eq!(code(run(&with(&bad_s))), code(ExitCode::from(1)), "{flags:?}");
        assert_eq!(code(run(&with(&broken_s))), code(ExitCode::from(2)), "{flags:?}");
    }
    let result = check_file(&args(&["--model", "causal", &bad_s]), &bad).unwrap();
    assert_eq!((result.verdict, result.holds, result.ops), ("violation", Some(false), 3));
    assert!(result.human.contains("return-value"), "{}", result.human);
    assert_eq!(result.details["violations"][0]["kind"], "return-value");
    assert_eq!(result.details["counts"]["return-value"], 1);
    let e = check_file(&args(&["--model", "causal", &broken_s]), &broken).unwrap_err();
    assert_eq!((e.file.as_str(), e.line), (broken_s.as_str(), 3));
    for words in [
        &["--model", "causal", "--format", "keel", &good_s][..],
        &["--model", "rc", "--format", "keel-causal", &good_s],
        &["--model", "causal", "--property", "monotonic", &good_s],
    ] {
        assert_eq!(code(run(&args(words))), code(ExitCode::from(2)), "{words:?}");
    }
    // With no flags a file is read as keel-rc: this one is not.
    assert!(check_file(&args(&[&good_s]), &good).is_err());
}
