//! The `convergence` and `lost-after-barrier` rules: the final states of the data centers
//! that did not fail agree with each other and with the committed transactions that must
//! survive.

use super::eval::{self, State};
use super::history::{CausalHistory, Kind, Seen};
use super::prep::{vector_sum, Prepared, Write};
use super::uniform::Steps;
use super::{kind, Sink};
use std::collections::{BTreeMap, BTreeSet, HashSet};

/// Combinations of optional transactions tried per object and final state (when
/// `stored` is empty) before giving up.
const OPTIONAL_COMBINATIONS_MAX: usize = 4096;

/// What the final states must show of a committed transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    /// It survives: its origin did not fail, a data center that did not fail stored it,
    /// or a transaction that survives depends on it.
    Sure,
    /// Its origin failed and no survivor stored it, but it was promised durable: in the
    /// past of a barrier (`barrier`) or attach, or in a snapshot taken at a data center
    /// that did not fail.
    Promised { barrier: bool },
    /// Its origin failed before anything made it durable: it may or may not survive.
    Optional,
}

/// A final state's objects.
type Objects<'a> = BTreeMap<(&'a str, Kind), &'a Seen>;

/// The maximal vectors of a set: a vector is below one of the set iff it is below one of
/// these.
struct Cover<'h, 'a> {
    history: &'h CausalHistory,
    maxima: Vec<&'a [u64]>,
}

impl<'h, 'a> Cover<'h, 'a> {
    /// The cover of `vectors`, an entry in a data center's new life covering its old
    /// life only up to the cut (`CausalHistory::covered`, transitive as `vector_le`).
    fn new(history: &'h CausalHistory, mut vectors: Vec<&'a [u64]>) -> Cover<'h, 'a> {
        vectors.sort_unstable_by_key(|v| std::cmp::Reverse(vector_sum(v)));
        let mut maxima: Vec<&'a [u64]> = Vec::new();
        for v in vectors {
            if !maxima.iter().any(|m| history.covered(v, m)) {
                maxima.push(v);
            }
        }
        Cover { history, maxima }
    }

    fn covers(&self, v: &[u64]) -> bool {
        self.maxima.iter().any(|m| self.history.covered(v, m))
    }
}

/// Checks the final states (nothing when there are none).
pub(crate) fn check(history: &CausalHistory, prep: &Prepared<'_>, sink: &mut Sink) {
    if history.finals.is_empty() {
        return;
    }
    let finals: Vec<(u32, Objects<'_>)> = history
        .finals
        .iter()
        .map(|f| (f.dc, f.objects.iter().map(|(k, kind, s)| ((k.as_str(), *kind), s)).collect()))
        .collect();
    pairwise(&finals, sink);
    let classes = classify(history, prep);
    visible(history, prep, &classes, sink);
    let mut objects: BTreeSet<(&str, Kind)> = prep.names.iter().copied().collect();
    for (_, f) in &finals {
        objects.extend(f.keys().copied());
    }
    for object in objects {
        let mut groups: Vec<(Option<&Seen>, Vec<u32>)> = Vec::new();
        for (dc, f) in &finals {
            let got = f.get(&object).copied();
            match groups.iter_mut().find(|(g, _)| *g == got) {
                Some((_, dcs)) => dcs.push(*dc),
                None => groups.push((got, vec![*dc])),
            }
        }
        for (got, dcs) in groups {
            judge_object(history, prep, &classes, object, got, &dcs, sink);
        }
    }
}

/// Reports, for final states whose snapshot is known, each transaction that must
/// survive and is not in the snapshot (whatever its updates did to the objects).
fn visible(history: &CausalHistory, prep: &Prepared<'_>, classes: &[Class], sink: &mut Sink) {
    for f in &history.finals {
        let Some(snap) = &f.snap else { continue };
        for (t, class) in prep.txs.iter().zip(classes) {
            if *class == Class::Sure && !history.covered(t.commit, snap) {
                sink.report(kind::CONVERGENCE, || {
                    format!(
                        "tx {} (commit {:?}{}) must survive, but dc {}'s final snapshot {snap:?} \
                         lacks it",
                        t.id,
                        t.commit,
                        if t.strong { ", strong" } else { "" },
                        f.dc
                    )
                });
            }
        }
    }
}

/// Reports objects on which a final state differs from the first one.
fn pairwise(finals: &[(u32, Objects<'_>)], sink: &mut Sink) {
    let Some(((dc0, first), rest)) = finals.split_first() else { return };
    for (dc, other) in rest {
        for object in first.keys().chain(other.keys()).collect::<BTreeSet<_>>() {
            let (a, b) = (first.get(object).copied(), other.get(object).copied());
            let same = match (a, b) {
                (Some(x), Some(y)) => x == y,
                (Some(x), None) | (None, Some(x)) => eval::seen_is_empty(x),
                (None, None) => true,
            };
            if !same {
                sink.report(kind::CONVERGENCE, || {
                    format!(
                        "final states differ on {:?} ({}): dc {dc0} holds {}, dc {dc} holds {}",
                        object.0,
                        eval::kind_name(object.1),
                        a.map_or("nothing".to_string(), eval::show),
                        b.map_or("nothing".to_string(), eval::show)
                    )
                });
            }
        }
    }
}

/// The class of each committed transaction (by rank).
fn classify(history: &CausalHistory, prep: &Prepared<'_>) -> Vec<Class> {
    let failed_tx =
        |t: &super::prep::Tx<'_>| history.failed_origin(t.origin, t.commit[t.origin as usize]);
    if history.failed.is_empty() && history.lives.is_empty() {
        return vec![Class::Sure; prep.txs.len()];
    }
    let steps = Steps::new(history);
    let stored: Vec<Vec<u64>> =
        (0..history.dcs).map(|o| steps.highest_stored_by(o, history)).collect();
    let stored_covers = |t: &super::prep::Tx<'_>| {
        let ts = t.commit[t.origin as usize];
        stored[t.origin as usize].iter().any(|&c| history.entry_covers(t.origin, ts, c))
    };
    let sure = Cover::new(
        history,
        prep.txs
            .iter()
            .filter(|t| !failed_tx(t) || t.strong || stored_covers(t))
            .map(|t| t.commit)
            .collect(),
    );
    let promised = Cover::new(
        history,
        history
            .syncs
            .iter()
            .map(|s| s.past.as_slice())
            .chain(
                history
                    .txs
                    .iter()
                    .filter(|t| !history.failed_at(t.dc, t.at_ns))
                    .map(|t| t.snap.as_slice()),
            )
            .collect(),
    );
    let barrier = Cover::new(
        history,
        history.syncs.iter().filter(|s| s.barrier).map(|s| s.past.as_slice()).collect(),
    );
    prep.txs
        .iter()
        .map(|t| {
            if !failed_tx(t) || t.strong {
                // A strong transaction's certification stored it at a majority of data
                // centers before its commit.
                Class::Sure
            } else if barrier.covers(t.commit) {
                // Stored by a survivor or not, a failed data center's transaction a
                // barrier made durable is named as such when the final states lack it.
                Class::Promised { barrier: true }
            } else if sure.covers(t.commit) {
                Class::Sure
            } else if promised.covers(t.commit) {
                Class::Promised { barrier: barrier.covers(t.commit) }
            } else {
                Class::Optional
            }
        })
        .collect()
}

/// The state of an object of `kind` after the `writers` whose transaction `include`
/// accepts.
fn evaluate<'a>(
    prep: &Prepared<'a>,
    writers: &[Write<'a>],
    kind: Kind,
    include: impl Fn(usize) -> bool,
) -> State<'a> {
    let mut state = State::empty(kind);
    for w in writers.iter().filter(|w| include(w.rank)) {
        state.apply(w.update, prep.txs[w.rank].id);
    }
    state
}

/// Judges the final state `got` of `object` at data centers `dcs`.
fn judge_object(
    history: &CausalHistory,
    prep: &Prepared<'_>,
    classes: &[Class],
    object: (&str, Kind),
    got: Option<&Seen>,
    dcs: &[u32],
    sink: &mut Sink,
) {
    let writers = prep.objects.get(&object).map_or(&[][..], |&o| &prep.writers[o]);
    let expected = evaluate(prep, writers, object.1, |r| classes[r] != Class::Optional);
    let name = eval::kind_name(object.1);
    match expected.matches_listed(got) {
        Ok(true) => return,
        Ok(false) => {}
        Err(sum) => {
            sink.report(kind::OVERFLOW, || {
                format!("final counter {:?}: value {sum} does not fit an i64", object.0)
            });
            return;
        }
    }
    let shown = got.map_or("nothing".to_string(), eval::show);
    if let Some((lost, barrier)) = lost(prep, writers, classes, object.1, got) {
        let kind = if barrier { kind::LOST_AFTER_BARRIER } else { kind::CONVERGENCE };
        let ids: Vec<String> = lost.iter().map(|&r| prep.txs[r].id.to_string()).collect();
        sink.report(kind, || {
            format!(
                "final state of {:?} ({name}) at dcs {dcs:?} is {shown}: it lacks txs {ids:?} of \
                 failed data centers that a barrier, an attach or a snapshot at a surviving \
                 data center had shown",
                object.0
            )
        });
        return;
    }
    if history.stored.is_empty() && optional_explains(prep, writers, classes, object.1, got) {
        return;
    }
    sink.report(kind::CONVERGENCE, || {
        format!(
            "final state of {:?} ({name}) at dcs {dcs:?} is {shown}, but the transactions that \
             must survive give {}",
            object.0,
            eval::show(&expected.seen())
        )
    });
}

/// The promised writers whose loss explains `got`, and whether a barrier covered one.
fn lost(
    prep: &Prepared<'_>,
    writers: &[Write<'_>],
    classes: &[Class],
    kind: Kind,
    got: Option<&Seen>,
) -> Option<(Vec<usize>, bool)> {
    let promised: BTreeSet<usize> = writers
        .iter()
        .map(|w| w.rank)
        .filter(|&r| matches!(classes[r], Class::Promised { .. }))
        .collect();
    if promised.is_empty() {
        return None;
    }
    let without = evaluate(prep, writers, kind, |r| classes[r] == Class::Sure);
    if without.matches_listed(got) != Ok(true) {
        return None;
    }
    let barrier = promised.iter().any(|&r| classes[r] == Class::Promised { barrier: true });
    Some((promised.into_iter().collect(), barrier))
}

/// Whether some prefix (in its own timestamps) of each failed origin's optional writers,
/// with the transactions that must survive, gives `got`.
fn optional_explains(
    prep: &Prepared<'_>,
    writers: &[Write<'_>],
    classes: &[Class],
    kind: Kind,
    got: Option<&Seen>,
) -> bool {
    let mut by_origin: BTreeMap<u32, BTreeSet<(u64, usize)>> = BTreeMap::new();
    for w in writers.iter().filter(|w| classes[w.rank] == Class::Optional) {
        let t = &prep.txs[w.rank];
        by_origin.entry(t.origin).or_default().insert((t.commit[t.origin as usize], w.rank));
    }
    let lists: Vec<Vec<usize>> =
        by_origin.into_values().map(|s| s.into_iter().map(|(_, r)| r).collect()).collect();
    if lists.is_empty() {
        return false;
    }
    let combinations = lists.iter().try_fold(1usize, |n, l| n.checked_mul(l.len() + 1));
    if combinations.is_none_or(|n| n > OPTIONAL_COMBINATIONS_MAX) {
        return false;
    }
    let mut choice = vec![0usize; lists.len()];
    loop {
        let included: HashSet<usize> =
            lists.iter().zip(&choice).flat_map(|(l, &k)| l[..k].iter().copied()).collect();
        let state = evaluate(prep, writers, kind, |r| {
            classes[r] != Class::Optional || included.contains(&r)
        });
        if state.matches_listed(got) == Ok(true) {
            return true;
        }
        let mut i = 0;
        loop {
            let Some(c) = choice.get_mut(i) else { return false };
            *c += 1;
            if *c <= lists[i].len() {
                break;
            }
            *c = 0;
            i += 1;
        }
    }
}
