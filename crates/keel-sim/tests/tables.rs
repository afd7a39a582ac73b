//! The paper's tables as assertions on small runs: the weak configurations show
//! non-monotonic reads, `strong` and `cad` never do.

use keel_sim::table3::{run_table, Baseline, Table3Config};
use keel_sim::table4::{run_once, Table4Row, CONFIGS};

#[test]
fn table3_strong_and_cad_stay_monotonic_and_weak_ones_do_not() {
    for seed in [0, 1] {
        let rows = run_table(30, seed, 2);
        assert_eq!(rows.len(), 8);
        for row in &rows {
            assert_eq!(row.sequences, 30);
            assert_eq!(row.correct + row.non_monotonic, 30);
            match row.config {
                Table3Config::Strong | Table3Config::Cad => {
                    assert_eq!(row.non_monotonic, 0, "seed {seed}: {row:?}")
                }
                Table3Config::Weak | Table3Config::SyncAll => {
                    assert!(row.non_monotonic > 0, "seed {seed}: {row:?}")
                }
            }
        }
        let weak_b = rows
            .iter()
            .find(|r| r.config == Table3Config::Weak && r.baseline == Baseline::AsyncReplication);
        assert!(weak_b.is_some_and(|r| r.non_monotonic > 0));
    }
}

#[test]
fn table4_only_weak_reads_are_inconsistent_and_strong_reads_are_latest() {
    for workload in ["location", "retwis"] {
        for (i, (name, _, _)) in CONFIGS.iter().enumerate() {
            let mut row = Table4Row::default();
            for seed in 0..6 {
                run_once(workload, i, seed, &mut row);
            }
            assert!(row.reads > 100, "{workload}/{name}: {row:?}");
            assert_eq!(row.inconsistent + row.old + row.latest, row.reads);
            match *name {
                "weak" => assert!(row.inconsistent > 0, "{workload}/{name}: {row:?}"),
                "strong" => assert_eq!(row.latest, row.reads, "{workload}/{name}: {row:?}"),
                _ => assert_eq!(row.inconsistent, 0, "{workload}/{name}: {row:?}"),
            }
        }
    }
}
