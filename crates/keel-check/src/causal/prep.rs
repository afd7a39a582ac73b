//! The committed transactions (the cluster's record merged with the clients'), in
//! arbitration order, and each object's writers; the `committed-mismatch` and
//! `commit-vector` rules.

use super::history::{vector_le, CausalHistory, ClientTx, Kind, Outcome, TxId, TxOp, Update};
use super::{has_updates, kind, Sink};
use crate::fasthash::FastHash;
use std::collections::HashMap;

/// A committed transaction.
pub(crate) struct Tx<'a> {
    /// Its identity.
    pub id: TxId,
    /// The data center where it committed.
    pub origin: u32,
    /// Its commit vector.
    pub commit: &'a [u64],
    /// The sum of the commit vector's entries (the first arbitration key).
    pub sum: u128,
    /// Its updates in order.
    pub writes: Vec<(&'a str, &'a Update)>,
    /// Whether it is strong (certified: it survives any `f` failed data centers).
    pub strong: bool,
}

/// One update of an object by a committed transaction.
pub(crate) struct Write<'a> {
    /// The transaction's place in the arbitration order (an index of
    /// [`Prepared::txs`]).
    pub rank: usize,
    /// The update.
    pub update: &'a Update,
}

/// The committed transactions and the objects they write.
pub(crate) struct Prepared<'a> {
    /// Committed transactions in arbitration order.
    pub txs: Vec<Tx<'a>>,
    /// Each committed transaction's rank.
    pub rank: HashMap<TxId, usize, FastHash>,
    /// Each written object's index.
    pub objects: HashMap<(&'a str, Kind), usize, FastHash>,
    /// Each object's key and kind, by index.
    pub names: Vec<(&'a str, Kind)>,
    /// Each object's updates in arbitration order (a transaction's in its op order).
    pub writers: Vec<Vec<Write<'a>>>,
}

/// The sum of a vector's entries.
pub(crate) fn vector_sum(v: &[u64]) -> u128 {
    v.iter().map(|&x| u128::from(x)).sum()
}

/// A client transaction's updates in op order.
fn client_writes(t: &ClientTx) -> Vec<(&str, &Update)> {
    t.ops
        .iter()
        .filter_map(|op| match op {
            TxOp::Update { key, update } => Some((key.as_str(), update)),
            TxOp::Read { .. } => None,
        })
        .collect()
}

/// Whether two records of one transaction's writes agree: each key's updates the same,
/// in the same order. The order between keys may differ: the cluster's record gathers a
/// transaction's updates partition by partition.
fn same_writes(a: &[(&str, &Update)], b: &[(&str, &Update)]) -> bool {
    fn by_key<'w>(w: &[(&'w str, &'w Update)]) -> Vec<(&'w str, &'w Update)> {
        let mut w = w.to_vec();
        w.sort_by_key(|(k, _)| *k);
        w
    }
    a.len() == b.len() && by_key(a) == by_key(b)
}

impl<'a> Prepared<'a> {
    /// Merges the committed transactions of `history` (reporting disagreements) and
    /// orders them.
    pub(crate) fn build(history: &'a CausalHistory, sink: &mut Sink) -> Prepared<'a> {
        let mut txs: Vec<Tx<'a>> = history
            .committed
            .iter()
            .map(|c| Tx {
                id: c.id,
                origin: c.origin,
                commit: &c.commit,
                sum: vector_sum(&c.commit),
                writes: c.writes.iter().map(|(k, u)| (k.as_str(), u)).collect(),
                strong: c.strong,
            })
            .collect();
        let mut index: HashMap<TxId, usize, FastHash> =
            txs.iter().enumerate().map(|(i, t)| (t.id, i)).collect();
        for t in &history.txs {
            merge_client(t, &mut txs, &mut index, sink);
        }
        txs.sort_unstable_by_key(|t| (t.sum, t.origin, t.id));
        let rank = txs.iter().enumerate().map(|(i, t)| (t.id, i)).collect();
        let mut objects: HashMap<(&'a str, Kind), usize, FastHash> = HashMap::default();
        let mut names = Vec::new();
        let mut writers: Vec<Vec<Write<'a>>> = Vec::new();
        for (r, t) in txs.iter().enumerate() {
            for &(key, update) in &t.writes {
                let object = (key, update.kind());
                let o = *objects.entry(object).or_insert_with(|| {
                    names.push(object);
                    writers.push(Vec::new());
                    names.len() - 1
                });
                writers[o].push(Write { rank: r, update });
            }
        }
        Prepared { txs, rank, objects, names, writers }
    }

    /// The committed transaction a client transaction is, if any.
    pub(crate) fn committed(&self, t: &ClientTx) -> Option<&Tx<'a>> {
        self.rank.get(&t.id).map(|&r| &self.txs[r])
    }
}

/// Adds client transaction `t` to the committed ones if it committed updates, or checks
/// that it agrees with the cluster's record of it.
fn merge_client<'a>(
    t: &'a ClientTx,
    txs: &mut Vec<Tx<'a>>,
    index: &mut HashMap<TxId, usize, FastHash>,
    sink: &mut Sink,
) {
    let vector = match &t.outcome {
        Outcome::Aborted => {
            if index.contains_key(&t.id) {
                sink.report(kind::COMMITTED_MISMATCH, || {
                    format!(
                        "tx {} (session {}) aborted but is among the committed",
                        t.id, t.session
                    )
                });
            }
            return;
        }
        Outcome::Unknown => return,
        Outcome::Committed { vector } => vector,
    };
    if !has_updates(t) {
        return;
    }
    let writes = client_writes(t);
    match index.get(&t.id) {
        Some(&i) => {
            let c = &txs[i];
            if c.origin != t.dc
                || c.commit != vector.as_slice()
                || !same_writes(&c.writes, &writes)
                || c.strong != t.strong
            {
                sink.report(kind::COMMITTED_MISMATCH, || {
                    format!(
                        "tx {}: the client recorded dc {}, commit {vector:?} and writes {writes:?}; \
                         the cluster dc {}, commit {:?} and writes {:?}",
                        t.id, t.dc, c.origin, c.commit, c.writes
                    )
                });
            }
        }
        None => {
            index.insert(t.id, txs.len());
            txs.push(Tx {
                id: t.id,
                origin: t.dc,
                commit: vector,
                sum: vector_sum(vector),
                writes,
                strong: t.strong,
            });
        }
    }
}

/// Whether `commit` follows snapshot `snap` of a transaction at `dc`: at least it, and
/// above it in `dc`'s entry or the strong entry.
fn advances(commit: &[u64], snap: &[u64], dc: u32) -> bool {
    let strong = snap.len() - 1;
    let dc = dc as usize;
    vector_le(snap, commit) && (commit[dc] > snap[dc] || commit[strong] > snap[strong])
}

/// Whether client transaction `t` committed and its own commit is in its snapshot (a
/// `commit-vector` violation; its reads are then not judged).
pub(crate) fn sees_itself(t: &ClientTx, prep: &Prepared<'_>) -> bool {
    prep.committed(t).is_some_and(|c| vector_le(c.commit, &t.snap))
}

/// The `commit-vector` rule for every client transaction not aborted.
pub(crate) fn check_commit_vectors(history: &CausalHistory, prep: &Prepared<'_>, sink: &mut Sink) {
    for t in &history.txs {
        if t.outcome == Outcome::Aborted {
            continue;
        }
        if let Some(c) = prep.committed(t) {
            if !advances(c.commit, &t.snap, t.dc) {
                sink.report(kind::COMMIT_VECTOR, || {
                    format!(
                        "tx {} at dc {}: commit {:?} does not follow its snapshot {:?} (at least \
                         it, and above it at dc {} or in the strong entry)",
                        t.id, t.dc, c.commit, t.snap, t.dc
                    )
                });
            }
        } else if let Outcome::Committed { vector } = &t.outcome {
            if !vector_le(&t.snap, vector) {
                sink.report(kind::COMMIT_VECTOR, || {
                    format!(
                        "read-only tx {} returned {vector:?}, below its snapshot {:?}",
                        t.id, t.snap
                    )
                });
            }
        }
    }
}
