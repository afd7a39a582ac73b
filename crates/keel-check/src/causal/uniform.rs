//! The `not-uniform` rule: a remote transaction is visible only once stored at `f + 1`
//! data centers, the reader's among them.

use super::history::{vector_le, CausalHistory, ClientTx};
use super::prep::Prepared;
use super::{kind, Sink};
use std::collections::BTreeMap;

/// When each data center stored each origin's transactions: per `(dc, origin)`, the
/// records sorted by `through`, each with the earliest time of any record reaching at
/// least as far (a step function of the timestamp).
pub(crate) struct Steps {
    by: BTreeMap<(u32, u32), Vec<(u64, u64)>>,
}

impl Steps {
    /// The step functions of `history.stored`.
    pub(crate) fn new(history: &CausalHistory) -> Steps {
        let mut by: BTreeMap<(u32, u32), Vec<(u64, u64)>> = BTreeMap::new();
        for s in &history.stored {
            by.entry((s.dc, s.origin)).or_default().push((s.through, s.at_ns));
        }
        for records in by.values_mut() {
            records.sort_unstable();
            let mut earliest = u64::MAX;
            for r in records.iter_mut().rev() {
                earliest = earliest.min(r.1);
                r.1 = earliest;
            }
        }
        Steps { by }
    }

    /// When `dc` had stored `origin`'s transactions up to timestamp `ts` (`u64::MAX`:
    /// never; 0 for timestamp 0, which no transaction of `origin` has: a strong
    /// transaction that depends on none of its origin's causal ones).
    pub(crate) fn stored_at(&self, dc: u32, origin: u32, ts: u64) -> u64 {
        if ts == 0 {
            return 0;
        }
        let Some(records) = self.by.get(&(dc, origin)) else { return u64::MAX };
        let i = records.partition_point(|&(through, _)| through < ts);
        records.get(i).map_or(u64::MAX, |&(_, at)| at)
    }

    /// Per life of `origin`, the highest of its timestamps that some data center not
    /// failed stored (in a life not failed): an entry of a later life covers an earlier
    /// life only up to its cut, so each life's highest is kept apart.
    pub(crate) fn highest_stored_by(&self, origin: u32, history: &CausalHistory) -> Vec<u64> {
        let life =
            |ts: u64| history.lives.iter().filter(|l| l.dc == origin && ts >= l.from_ts).count();
        let mut highest: BTreeMap<usize, u64> = BTreeMap::new();
        for (&(dc, o), records) in &self.by {
            if o != origin {
                continue;
            }
            for &(through, _) in records.iter().filter(|&&(_, at)| !history.failed_at(dc, at)) {
                let top = highest.entry(life(through)).or_insert(through);
                *top = (*top).max(through);
            }
        }
        highest.into_values().collect()
    }
}

/// One origin's committed transactions sorted by their own timestamp, with prefix maxima
/// of their commit vectors (flattened).
struct Origin {
    ranks: Vec<usize>,
    maxima: Vec<u64>,
}

/// Checks every snapshot's remote transactions (nothing when `stored` is empty).
pub(crate) fn check(history: &CausalHistory, prep: &Prepared<'_>, sink: &mut Sink) {
    if history.stored.is_empty() {
        return;
    }
    let steps = Steps::new(history);
    let width = history.dcs as usize + 1;
    let origins: Vec<Origin> = (0..history.dcs).map(|o| origin(prep, o, width)).collect();
    for t in &history.txs {
        for (o, list) in origins.iter().enumerate() {
            let o = o as u32;
            if o == t.dc {
                continue;
            }
            let Some(r) = latest_visible(history, prep, list, o, width, t) else { continue };
            check_one(history, &steps, prep, r, t, sink);
        }
    }
}

fn origin(prep: &Prepared<'_>, o: u32, width: usize) -> Origin {
    let mut ranks: Vec<usize> = (0..prep.txs.len()).filter(|&r| prep.txs[r].origin == o).collect();
    ranks.sort_by_key(|&r| (prep.txs[r].commit[o as usize], r));
    let mut maxima = Vec::with_capacity(ranks.len() * width);
    let mut max = vec![0u64; width];
    for &r in &ranks {
        for (m, &x) in max.iter_mut().zip(prep.txs[r].commit) {
            *m = (*m).max(x);
        }
        maxima.extend_from_slice(&max);
    }
    Origin { ranks, maxima }
}

/// The transaction of origin `o` in `t`'s snapshot with the highest timestamp of `o`
/// (its rank), if any: every other one of `o` in the snapshot is stored no later.
fn latest_visible(
    history: &CausalHistory,
    prep: &Prepared<'_>,
    list: &Origin,
    o: u32,
    width: usize,
    t: &ClientTx,
) -> Option<usize> {
    if history.past_a_lost_tail(&t.snap) {
        // Past a data center's lost tail: the latest covered, each judged on its own.
        return list
            .ranks
            .iter()
            .rev()
            .find(|&&r| history.covered(prep.txs[r].commit, &t.snap))
            .copied();
    }
    let ts = |r: usize| prep.txs[r].commit[o as usize];
    let below = list.ranks.partition_point(|&r| ts(r) <= t.snap[o as usize]);
    let (mut lo, mut hi) = (0, below);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if vector_le(&list.maxima[mid * width..(mid + 1) * width], &t.snap) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    let covered = lo;
    list.ranks[covered..below]
        .iter()
        .rev()
        .find(|&&r| vector_le(prep.txs[r].commit, &t.snap))
        .or_else(|| covered.checked_sub(1).map(|i| &list.ranks[i]))
        .copied()
}

/// Whether committed transaction `r` in `t`'s snapshot was stored at `f + 1` data
/// centers including `t`'s by the time `t` started.
fn check_one(
    history: &CausalHistory,
    steps: &Steps,
    prep: &Prepared<'_>,
    r: usize,
    t: &ClientTx,
    sink: &mut Sink,
) {
    let w = &prep.txs[r];
    let ts = w.commit[w.origin as usize];
    let storing: Vec<u32> =
        (0..history.dcs).filter(|&dc| steps.stored_at(dc, w.origin, ts) <= t.at_ns).collect();
    if storing.contains(&t.dc) && storing.len() > history.f as usize {
        return;
    }
    sink.report(kind::NOT_UNIFORM, || {
        format!(
            "tx {} at dc {} (at {} ns, snapshot {:?}) sees tx {} of dc {} (timestamp {ts}), \
             stored by then only at {storing:?}: needs {} data centers including dc {}",
            t.id,
            t.dc,
            t.at_ns,
            t.snap,
            w.id,
            w.origin,
            history.f + 1,
            t.dc
        )
    });
}
