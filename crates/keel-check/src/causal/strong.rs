//! The `conflict-order` rule: of two committed strong transactions that update, touch a
//! common key and whose labels conflict, one sees the other (its commit vector is in the
//! other's snapshot), and their strong timestamps are in that order (Property 5 of the
//! paper: the strong order is the causal order on conflicting strong transactions).

use super::history::{vector_le, CausalHistory, ClientTx, Outcome, TxOp};
use super::{has_updates, kind, Sink};
use std::collections::{BTreeMap, BTreeSet, HashSet};

/// One committed strong update transaction.
struct Strong<'a> {
    tx: &'a ClientTx,
    commit: &'a [u64],
}

/// Whether labels `a` and `b` conflict under `pairs` (an unlabelled transaction
/// conflicts with every strong one).
fn conflict(pairs: &HashSet<(&str, &str)>, a: Option<&str>, b: Option<&str>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => pairs.contains(&(a, b)) || pairs.contains(&(b, a)),
        _ => true,
    }
}

fn key_of(op: &TxOp) -> &str {
    match op {
        TxOp::Read { key, .. } | TxOp::Update { key, .. } => key,
    }
}

/// Checks every conflicting pair of committed strong update transactions.
pub(crate) fn check(history: &CausalHistory, sink: &mut Sink) {
    let pairs: HashSet<(&str, &str)> =
        history.conflicts.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    let strong: Vec<Strong<'_>> = history
        .txs
        .iter()
        .filter(|t| t.strong && has_updates(t))
        .filter_map(|tx| match &tx.outcome {
            Outcome::Committed { vector } => Some(Strong { tx, commit: vector }),
            _ => None,
        })
        .collect();
    let mut by_key: BTreeMap<&str, BTreeSet<usize>> = BTreeMap::new();
    for (i, s) in strong.iter().enumerate() {
        for op in &s.tx.ops {
            by_key.entry(key_of(op)).or_default().insert(i);
        }
    }
    let mut seen = HashSet::new();
    for (key, txs) in by_key {
        let txs: Vec<usize> = txs.into_iter().collect();
        for (n, &i) in txs.iter().enumerate() {
            for &j in &txs[n + 1..] {
                let (a, b) = (&strong[i], &strong[j]);
                if !conflict(&pairs, a.tx.label.as_deref(), b.tx.label.as_deref())
                    || !seen.insert((i, j))
                {
                    continue;
                }
                judge(a, b, key, sink);
            }
        }
    }
}

/// One conflicting pair on `key`.
fn judge(a: &Strong<'_>, b: &Strong<'_>, key: &str, sink: &mut Sink) {
    let strong_ts = |v: &[u64]| v.last().copied().unwrap_or(0);
    let a_in_b = vector_le(a.commit, &b.tx.snap);
    let b_in_a = vector_le(b.commit, &a.tx.snap);
    let (first, then) = match (a_in_b, b_in_a) {
        (true, false) => (a, b),
        (false, true) => (b, a),
        _ => {
            return sink.report(kind::CONFLICT_ORDER, || {
                format!(
                    "strong txs {} and {} conflict on {key:?} and {}",
                    a.tx.id,
                    b.tx.id,
                    if a_in_b { "each sees the other" } else { "neither sees the other" }
                )
            });
        }
    };
    if strong_ts(first.commit) >= strong_ts(then.commit) {
        sink.report(kind::CONFLICT_ORDER, || {
            format!(
                "strong tx {} sees {} (they conflict on {key:?}) but its strong timestamp {} is \
                 not above {}",
                then.tx.id,
                first.tx.id,
                strong_ts(then.commit),
                strong_ts(first.commit)
            )
        });
    }
}
