//! The `not-serializable` rule, for histories whose transactions are all strong and all
//! conflict (the paper's STRONG special case, §5: serializability): replayed one at a
//! time in the recorded certification order, every committed transaction's reads return
//! what the transactions before it wrote.
//!
//! The certification order is the strong timestamp: a committed update transaction's is
//! its commit vector's strong entry; a read-only one commits at its snapshot's, after
//! every update transaction at or below it (certification aborted it if a conflicting
//! update it missed was undecided or committed). A transaction's reads see its own
//! earlier updates. Transactions the cluster recorded committed whose clients never
//! learned the outcome are replayed too.

use super::eval::{show, State};
use super::history::{CausalHistory, ClientTx, Kind, Outcome, TxId, TxOp, Update};
use super::prep::Prepared;
use super::{has_updates, kind, Sink};
use std::collections::{BTreeSet, HashMap};

/// Whether every transaction of `history` is strong and every pair conflicts (no labels,
/// or every pair of the labels used declared).
pub(crate) fn applies(history: &CausalHistory) -> bool {
    if history.txs.is_empty() || history.txs.iter().any(|t| !t.strong) {
        return false;
    }
    if history.committed.iter().any(|c| !c.strong) {
        return false;
    }
    let labels: BTreeSet<&str> = history.txs.iter().filter_map(|t| t.label.as_deref()).collect();
    let declared = |a: &str, b: &str| {
        history.conflicts.iter().any(|(x, y)| (x == a && y == b) || (x == b && y == a))
    };
    labels.iter().all(|a| labels.iter().all(|b| declared(a, b)))
}

/// One transaction in the replay: its place, and what it reads and writes.
struct Step<'a> {
    /// The strong timestamp, then 0 for an update transaction and 1 for a read-only one.
    place: (u64, u8),
    /// The client's record, if the client learned it committed or the cluster recorded it.
    client: Option<&'a ClientTx>,
    /// Its updates (the cluster's record, or the client's).
    writes: Vec<(&'a str, &'a Update)>,
    /// Its id.
    id: TxId,
}

/// Checks `history` if the rule applies to it.
pub(crate) fn check(history: &CausalHistory, prep: &Prepared<'_>, sink: &mut Sink) {
    if !applies(history) {
        return;
    }
    let clients: HashMap<_, &ClientTx> = history.txs.iter().map(|t| (t.id, t)).collect();
    let strong_of = |v: &[u64]| v.last().copied().unwrap_or(0);
    let mut steps: Vec<Step<'_>> = prep
        .txs
        .iter()
        .map(|t| Step {
            place: (strong_of(t.commit), 0),
            client: clients.get(&t.id).copied(),
            writes: t.writes.clone(),
            id: t.id,
        })
        .collect();
    for t in &history.txs {
        if let Outcome::Committed { vector } = &t.outcome {
            if !has_updates(t) {
                let place = (strong_of(vector), 1);
                steps.push(Step { place, client: Some(t), writes: vec![], id: t.id });
            }
        }
    }
    steps.sort_by_key(|s| s.place);
    let mut states: HashMap<(&str, Kind), State<'_>> = HashMap::new();
    for step in &steps {
        if let Some(t) = step.client {
            judge(t, step, &states, sink);
        }
        for &(key, update) in &step.writes {
            for kind in KINDS {
                let state = states.entry((key, kind)).or_insert_with(|| State::empty(kind));
                state.apply(update, step.id);
            }
        }
    }
}

/// Every object kind (an update changes only its own; the others ignore it).
const KINDS: [Kind; 5] = [Kind::Register, Kind::Counter, Kind::Max, Kind::GSet, Kind::AwSet];

/// Judges each read of `t` against `states` and `t`'s own earlier updates.
fn judge(
    t: &ClientTx,
    step: &Step<'_>,
    states: &HashMap<(&str, Kind), State<'_>>,
    sink: &mut Sink,
) {
    for (i, op) in t.ops.iter().enumerate() {
        let TxOp::Read { key, kind: object_kind, seen } = op else { continue };
        let mut state = states
            .get(&(key.as_str(), *object_kind))
            .cloned()
            .unwrap_or(State::empty(*object_kind));
        for earlier in &t.ops[..i] {
            if let TxOp::Update { key: k, update } = earlier {
                if k == key {
                    state.apply(update, t.id);
                }
            }
        }
        if !matches!(state.matches(seen), Ok(true)) {
            sink.report(kind::NOT_SERIALIZABLE, || {
                format!(
                    "strong tx {} (strong timestamp {}) read {key:?} as {}, but replayed in \
                     strong-timestamp order it is {}",
                    step.id,
                    step.place.0,
                    show(seen),
                    show(&state.seen())
                )
            });
        }
    }
}
