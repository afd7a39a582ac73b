//! Every reference history in `tests/data/linearizability/*/verdicts.tsv` (copies of
//! Porcupine's test data, with their source and licence in the folder's README) gets the
//! verdict listed there.

use keel_check::cli::lin_result;
use keel_check::jepsen::{parse_kv_log, parse_register_log};
use keel_check::linearizability::BUDGET_STEPS_DEFAULT;
use keel_check::model::Model;
use std::path::{Path, PathBuf};

fn shared_data() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/linearizability");
    assert!(dir.is_dir(), "reference histories not found at {}", dir.display());
    dir
}

/// Checks every file listed in `folder/verdicts.tsv`; returns how many were checked.
fn check_folder(folder: &str, model: Model) -> usize {
    let dir = shared_data().join(folder);
    let listing = std::fs::read_to_string(dir.join("verdicts.tsv")).expect("verdicts.tsv readable");
    let mut checked = 0;
    let mut wrong = Vec::new();
    for row in listing.lines().skip(1).filter(|l| !l.trim().is_empty()) {
        let (name, expected) = row.split_once('\t').expect("file<TAB>verdict");
        let path = dir.join(name);
        let label = path.display().to_string();
        let reader =
            std::io::BufReader::new(std::fs::File::open(&path).expect("listed file exists"));
        let ops = match model {
            Model::Register => parse_register_log(reader, &label),
            _ => parse_kv_log(reader, &label),
        }
        .unwrap_or_else(|e| panic!("{e}"));
        let result =
            lin_result(model, &ops, BUDGET_STEPS_DEFAULT, &label).expect("ops fit the model");
        if result.verdict != expected.trim() {
            wrong.push(format!("{name}: expected {expected}, got {}", result.verdict));
        }
        checked += 1;
    }
    assert!(wrong.is_empty(), "wrong verdicts:\n{}", wrong.join("\n"));
    checked
}

#[test]
fn etcd_jepsen_verdicts() {
    let checked = check_folder("etcd-jepsen", Model::Register);
    assert!(checked >= 60, "only {checked} etcd histories listed");
    assert!(!shared_data().join("etcd-jepsen/etcd_095.log").exists(), "etcd_095 is absent");
}

#[test]
fn kv_verdicts() {
    assert_eq!(check_folder("kv", Model::Kv), 4);
}
