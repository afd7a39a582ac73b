//! Release-consistency checker on generated histories: valid sequential executions are
//! accepted (at every shape, and at 100,000 ops), RMWs moved off their read are rejected,
//! and the `keel-rc` reader never panics on random input.

use keel_check::generate::{rc_history, Shape};
use keel_check::rc::{check, read_jsonl, rule, write_jsonl, RcKind, Stamp};
use proptest::prelude::*;
use std::time::Instant;

fn shapes() -> impl Strategy<Value = Shape> {
    (any::<u64>(), 1usize..300, 1usize..6, 1usize..8, 0u32..30, 5u64..60).prop_map(
        |(seed, ops, keys, clients, unknown_percent, window_max)| Shape {
            seed,
            ops,
            keys,
            clients,
            unknown_percent,
            window_max,
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn generated_histories_hold(shape in shapes()) {
        let ops = rc_history(&shape);
        let verdict = check(&ops);
        prop_assert!(verdict.holds(), "{:#?}", verdict.violations);
        prop_assert_eq!(verdict.ops, ops.len());
    }

    #[test]
    fn generated_histories_round_trip(shape in shapes()) {
        let ops = rc_history(&shape);
        let mut bytes = Vec::new();
        write_jsonl(&mut bytes, &ops).unwrap();
        prop_assert_eq!(read_jsonl(&bytes[..]).unwrap(), ops);
    }

    #[test]
    fn an_rmw_that_read_an_older_write_is_rejected(shape in shapes(), pick in any::<prop::sample::Index>()) {
        let mut ops = rc_history(&shape);
        let completed_write = |key: u64, stamp: Stamp| {
            ops.iter().any(|o| o.key == key && o.complete.is_some() && o.wrote.is_some_and(|(s, _)| s == stamp))
        };
        // Completed FAAs that read a completed write: make them read the completed write
        // before it (or the initial value), so that write sits between their read and
        // their write.
        let candidates: Vec<usize> = (0..ops.len())
            .filter(|&i| ops[i].kind == RcKind::Faa && ops[i].complete.is_some())
            .filter(|&i| ops[i].read.is_some_and(|(s, _)| s != Stamp::ZERO && completed_write(ops[i].key, s)))
            .collect();
        prop_assume!(!candidates.is_empty());
        let i = candidates[pick.index(candidates.len())];
        let (stamp, _) = ops[i].read.unwrap();
        let key = ops[i].key;
        let older = ops
            .iter()
            .filter(|o| o.key == key && o.complete.is_some())
            .filter_map(|o| o.wrote)
            .filter(|&(s, _)| s < stamp)
            .max_by_key(|&(s, _)| s)
            .map_or((Stamp::ZERO, None), |(s, v)| (s, Some(v)));
        ops[i].read = Some(older);
        let verdict = check(&ops);
        let rules: Vec<&str> = verdict.violations.iter().map(|v| v.rule).collect();
        prop_assert!(
            rules.contains(&rule::RMW_ATOMICITY) || rules.contains(&rule::TWO_RMWS_ON_ONE_READ),
            "{:?}", rules
        );
    }

    #[test]
    fn a_read_of_an_unknown_stamp_is_a_phantom(shape in shapes(), pick in any::<prop::sample::Index>()) {
        let mut ops = rc_history(&shape);
        let reads: Vec<usize> = (0..ops.len())
            .filter(|&i| ops[i].kind == RcKind::Read && ops[i].read.is_some())
            .collect();
        prop_assume!(!reads.is_empty());
        let i = reads[pick.index(reads.len())];
        ops[i].read = Some((Stamp { version: u64::MAX, writer: 0, rmw: 0 }, Some(u64::MAX)));
        let verdict = check(&ops);
        prop_assert!(verdict.violations.iter().any(|v| v.rule == rule::PHANTOM_READ));
    }

    #[test]
    fn the_reader_never_panics(lines in prop::collection::vec("[ -~]{0,120}", 0..6)) {
        let text = format!("{{\"format\":\"keel-rc\",\"version\":1}}\n{}", lines.join("\n"));
        let _ = read_jsonl(text.as_bytes());
        let _ = read_jsonl(lines.join("\n").as_bytes());
    }
}

#[test]
fn a_history_of_100_000_ops_on_300_keys_checks_in_seconds() {
    let shape = Shape {
        seed: 20_260_501,
        ops: 100_000,
        keys: 300,
        clients: 64,
        unknown_percent: 2,
        window_max: 200,
    };
    let ops = rc_history(&shape);
    let started = Instant::now();
    let verdict = check(&ops);
    let elapsed = started.elapsed();
    eprintln!(
        "rc check: {} ops ({} sync) on {} keys in {:?}",
        verdict.ops, verdict.sync_ops, shape.keys, elapsed
    );
    assert!(verdict.holds(), "{:#?}", verdict.violations);
    // The time is printed, not asserted: tests make no timing claims (the figure in
    // docs/checkers.md comes from a release build on an idle machine).
}
