//! The `return-value` rule: each read against its snapshot, answered offline (reads
//! sorted by the prefix of their object's writers that their snapshot covers, each
//! object's state advanced once).

use super::eval::{self, State};
use super::history::{vector_le, CausalHistory, Outcome, TxOp, Update};
use super::prep::{sees_itself, vector_sum, Prepared, Write};
use super::{kind, Sink};
use std::borrow::Cow;

/// A read whose object has writers.
struct Query {
    /// The object.
    object: usize,
    /// How many of its writers, in arbitration order, the snapshot surely covers.
    prefix: usize,
    /// The client transaction (index in `history.txs`).
    tx: usize,
    /// The read (index in its ops).
    op: usize,
}

/// What every query needs.
struct Cx<'h, 'p> {
    history: &'h CausalHistory,
    prep: &'p Prepared<'h>,
    width: usize,
}

/// Checks every read of every transaction not aborted.
pub(crate) fn check(history: &CausalHistory, prep: &Prepared<'_>, sink: &mut Sink) {
    let width = history.dcs as usize + 1;
    let cx = Cx { history, prep, width };
    let maxima: Vec<Vec<u64>> = prep.writers.iter().map(|w| prefix_maxima(&cx, w)).collect();
    let mut queries = Vec::new();
    for (ti, t) in history.txs.iter().enumerate() {
        if t.outcome == Outcome::Aborted || sees_itself(t, prep) {
            continue;
        }
        for (oi, op) in t.ops.iter().enumerate() {
            let TxOp::Read { key, kind, .. } = op else { continue };
            match prep.objects.get(&(key.as_str(), *kind)) {
                None => judge(&cx, ti, oi, &State::empty(*kind), &[], sink),
                Some(&object) if history.past_a_lost_tail(&t.snap) => {
                    // Past a data center's lost tail: each writer judged on its own.
                    let visible: Vec<&Write<'_>> = prep.writers[object]
                        .iter()
                        .filter(|w| {
                            let c = &prep.txs[w.rank];
                            c.id != t.id && history.covered(c.commit, &t.snap)
                        })
                        .collect();
                    judge(&cx, ti, oi, &State::empty(*kind), &visible, sink);
                }
                Some(&object) => {
                    let prefix = covered_prefix(&maxima[object], width, &t.snap);
                    queries.push(Query { object, prefix, tx: ti, op: oi });
                }
            }
        }
    }
    queries.sort_unstable_by_key(|q| (q.object, q.prefix));
    for group in queries.chunk_by(|a, b| a.object == b.object) {
        let object = group[0].object;
        let writers = &prep.writers[object];
        let mut state = State::empty(prep.names[object].1);
        let mut applied = 0;
        for q in group {
            for w in &writers[applied..q.prefix] {
                state.apply(w.update, prep.txs[w.rank].id);
            }
            applied = q.prefix;
            let fringe = fringe(&cx, writers, q);
            judge(&cx, q.tx, q.op, &state, &fringe, sink);
        }
    }
}

/// The entry-wise maxima of the commit vectors of `writers[..=i]`, for each `i`,
/// flattened (`width` entries each).
fn prefix_maxima(cx: &Cx<'_, '_>, writers: &[Write<'_>]) -> Vec<u64> {
    let mut out = Vec::with_capacity(writers.len() * cx.width);
    let mut max = vec![0u64; cx.width];
    for w in writers {
        for (m, &x) in max.iter_mut().zip(cx.prep.txs[w.rank].commit) {
            *m = (*m).max(x);
        }
        out.extend_from_slice(&max);
    }
    out
}

/// How many writers, from the first, have their prefix maximum within `snap` (each of
/// them is then in the snapshot).
fn covered_prefix(maxima: &[u64], width: usize, snap: &[u64]) -> usize {
    let (mut lo, mut hi) = (0, maxima.len() / width);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if vector_le(&maxima[mid * width..(mid + 1) * width], snap) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// The writers after the query's prefix that are in its snapshot: only those whose
/// vector sum is at most the snapshot's can be.
fn fringe<'w, 'h>(cx: &Cx<'h, '_>, writers: &'w [Write<'h>], q: &Query) -> Vec<&'w Write<'h>> {
    let t = &cx.history.txs[q.tx];
    let bound = vector_sum(&t.snap);
    let txs = &cx.prep.txs;
    let rest = &writers[q.prefix..];
    let end = rest.partition_point(|w| txs[w.rank].sum <= bound);
    rest[..end]
        .iter()
        .filter(|w| txs[w.rank].id != t.id && cx.history.covered(txs[w.rank].commit, &t.snap))
        .collect()
}

/// Judges read `op` of transaction `tx`: `base` is its object's state after the covered
/// prefix, `fringe` the further writers in its snapshot.
fn judge(
    cx: &Cx<'_, '_>,
    tx: usize,
    op: usize,
    base: &State<'_>,
    fringe: &[&Write<'_>],
    sink: &mut Sink,
) {
    let t = &cx.history.txs[tx];
    let TxOp::Read { key, kind: object_kind, seen } = &t.ops[op] else { return };
    let own: Vec<&Update> = t.ops[..op]
        .iter()
        .filter_map(|o| match o {
            TxOp::Update { key: k, update } if k == key && update.kind() == *object_kind => {
                Some(update)
            }
            _ => None,
        })
        .collect();
    let state = if fringe.is_empty() && own.is_empty() {
        Cow::Borrowed(base)
    } else {
        let mut s = base.clone();
        for w in fringe {
            s.apply(w.update, cx.prep.txs[w.rank].id);
        }
        for u in own {
            s.apply(u, t.id);
        }
        Cow::Owned(s)
    };
    let name = eval::kind_name(*object_kind);
    match state.matches(seen) {
        Ok(true) => {}
        Ok(false) => sink.report(kind::RETURN_VALUE, || {
            format!(
                "tx {} (session {}, dc {}, snapshot {:?}) read {key:?} ({name}) as {}, but its \
                 snapshot and own updates give {}",
                t.id,
                t.session,
                t.dc,
                t.snap,
                eval::show(seen),
                eval::show(&state.seen())
            )
        }),
        Err(sum) => sink.report(kind::OVERFLOW, || {
            format!("tx {} read counter {key:?}, whose value {sum} does not fit an i64", t.id)
        }),
    }
}
