//! Causal consistency of geo-replicated transactions in the style of UniStore (Bravo,
//! Gotsman, de Régil and Wei, "UniStore: A fault-tolerant marriage of causal and strong
//! consistency", USENIX ATC 2021): the `keel-causal` history format ([`history`]) and its
//! checker ([`check`]), with a cross-check by saturation ([`saturation`]).
//!
//! # Terms
//!
//! - Vectors have one entry per data center, then the strong entry; `a ≤ b` entry by
//!   entry. A committed transaction `w` is in the snapshot of `t` iff `w.commit ≤ t.snap`.
//! - *Committed transactions*: `history.committed`, merged by id with every client
//!   transaction whose outcome is `committed` and that has at least one update (its
//!   origin is its `dc`, its commit vector the vector it returned).
//! - *Arbitration order*: committed transactions sorted by (sum of the commit vector's
//!   entries, origin, id); a linear extension of the vector order. Updates are applied
//!   in this order (last-writer-wins registers take the last `set`); a transaction's own
//!   updates come after its snapshot's, in its op order.
//! - *Objects*: a key names one object per [`history::Kind`]; only updates of that kind
//!   change it. Counters sum (an `overflow` when a value read does not fit an `i64`), max
//!   registers keep the highest value, grow-only sets the union, add-wins sets tag each
//!   add with its transaction and a remove drops only the tags it names.
//!
//! # Checks (the names of [`kind`])
//!
//! 0. `malformed`: vectors of `dcs + 1` entries, data centers in range (at most
//!    [`DCS_MAX`]), unique ids, reads and final states of the kind they name. When this
//!    fails nothing else is checked.
//! 1. `committed-mismatch`: a transaction both the client and the cluster recorded has
//!    the same origin, commit vector and writes (each key's in the same order; the
//!    cluster gathers them partition by partition), and an aborted one never committed.
//!    `commit-vector`: a committed update transaction's vector is at least its snapshot,
//!    and above it in its own data center's entry or in the strong entry (a strong
//!    transaction copies the per-data-center entries); a read-only one returned at least
//!    its snapshot.
//! 2. `return-value`: every read of a transaction not aborted returns the state of its
//!    object after the updates of the committed transactions in its snapshot (arbitration
//!    order), then the transaction's own earlier updates. Atomic visibility and causality
//!    follow: a snapshot is a down-closed set of whole transactions.
//! 3. `session` and `snapshot-below-past`: in a session (its transactions and syncs by
//!    `order`, which times cannot replace: they tie), each snapshot is at least the session's past (the vector the
//!    last commit returned, or the snapshot of an unknown one; an aborted transaction
//!    changes nothing); a move to another data center keeps the past only through an
//!    `ATTACH` there (without one the session restarted); a barrier's or attach's past is
//!    at least the session's past; every snapshot is at least the transaction's own
//!    `past`.
//! 4. `not-uniform` (when `stored` is not empty): every transaction of a remote origin in
//!    a snapshot was stored at `f + 1` data centers, the reader's among them, by the time
//!    the reader started (a data center stored it once a `stored` record of its origin
//!    reached its timestamp; the origin counts only through its own records).
//! 5. `convergence` (when `finals` is not empty): the final states are equal (an object
//!    missing from one is its empty state), and equal the evaluation over the committed
//!    transactions that must survive: those of origins that did not fail, and those of
//!    failed origins that a surviving transaction depends on, that a data center that did
//!    not fail stored, that a barrier or attach made uniform, or that a snapshot taken at
//!    a data center that did not fail showed (remote transactions are visible only once
//!    uniform). Any other transaction of a failed origin may or may not survive; when
//!    `stored` is empty, each failed origin's prefix of them (in timestamp order) is
//!    tried.
//! 6. `lost-after-barrier`: a final state that matches only without some transactions of
//!    a failed origin, one of which was in the past of a barrier that returned (stored by
//!    a survivor or not).
//!
//! # Cost (n transactions, u updates, r reads, D data centers)
//!
//! - Merge and arbitration: O(n log n).
//! - Reads, answered offline: each object's writers in arbitration order with their
//!   prefix maxima of commit vectors; a read's snapshot covers the longest prefix whose
//!   maximum it bounds (binary search), plus those writers after it whose vector sum does
//!   not exceed its own and whose vector it bounds (the concurrent fringe, scanned);
//!   reads are sorted by prefix, and each object's state is advanced once. In all
//!   O((u + r) · D · log u), plus the fringes, plus the size of the states read.
//! - Sessions: O(n log n).
//! - Uniformity, per reader and origin: the latest visible transaction of that origin
//!   (binary search and a fringe scan), then a binary search in each data center's step
//!   function. In all O(n · D² · log n).
//! - Convergence: whether a transaction must survive is decided against the maximal
//!   elements of the vectors that protect transactions; then one evaluation per object.
//!
//! Violations are all counted; the first [`VIOLATIONS_KEPT`] are described.

pub mod history;
pub mod saturation;

mod converge;
mod eval;
mod prep;
mod reads;
mod serial;
mod session;
mod strong;
mod uniform;

#[cfg(test)]
mod tests;

use crate::error::InputError;
use history::{CausalHistory, ClientTx, Outcome, TxOp};
use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::io::Read;

/// The names of violations ([`Violation::kind`]).
pub mod kind {
    /// The history is not well formed (nothing else is checked).
    pub const MALFORMED: &str = "malformed";
    /// A read did not return its snapshot's state (atomic visibility, causality).
    pub const RETURN_VALUE: &str = "return-value";
    /// Client and cluster recorded one transaction differently.
    pub const COMMITTED_MISMATCH: &str = "committed-mismatch";
    /// A commit vector does not follow its snapshot.
    pub const COMMIT_VECTOR: &str = "commit-vector";
    /// A snapshot below the session's past.
    pub const SESSION: &str = "session";
    /// A snapshot below the transaction's own past.
    pub const SNAPSHOT_BELOW_PAST: &str = "snapshot-below-past";
    /// A remote transaction visible before it was stored at `f + 1` data centers.
    pub const NOT_UNIFORM: &str = "not-uniform";
    /// Final states differ from each other or from the committed transactions.
    pub const CONVERGENCE: &str = "convergence";
    /// A transaction in a returned barrier's past missing from the final states.
    pub const LOST_AFTER_BARRIER: &str = "lost-after-barrier";
    /// A counter's value does not fit an `i64`.
    pub const OVERFLOW: &str = "overflow";
    /// The saturation cross-check found the history not causally consistent.
    pub const NOT_CAUSAL: &str = "not-causal";
    /// Two conflicting strong transactions not ordered by visibility and strong
    /// timestamp alike.
    pub const CONFLICT_ORDER: &str = "conflict-order";
    /// A history of strong transactions that all conflict, replayed in strong-timestamp
    /// order, where a read does not return what the transactions before it wrote.
    pub const NOT_SERIALIZABLE: &str = "not-serializable";
}

/// The most data centers a history may have.
pub const DCS_MAX: u32 = 256;

/// The largest file [`parse`] reads, in bytes.
pub const FILE_BYTES_MAX: u64 = 1 << 30;

/// Violations described in a [`CausalReport`] (all are counted).
pub const VIOLATIONS_KEPT: usize = 100;

/// One violation: its kind (a constant of [`kind`]) and what was wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The rule broken.
    pub kind: &'static str,
    /// The transactions, keys and vectors involved.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.detail)
    }
}

/// What [`check`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CausalReport {
    /// Client transactions in the history.
    pub txs: usize,
    /// Committed transactions (after the merge).
    pub committed: usize,
    /// The first [`VIOLATIONS_KEPT`] violations.
    pub violations: Vec<Violation>,
    /// All violations.
    pub violations_total: usize,
    /// All violations by kind.
    pub counts: BTreeMap<&'static str, usize>,
}

impl CausalReport {
    /// Whether nothing was violated.
    pub fn holds(&self) -> bool {
        self.violations_total == 0
    }

    /// `ok` or `violation`.
    pub fn verdict(&self) -> &'static str {
        crate::verdict(self.holds())
    }

    /// The violations of `kind` (all, not only those kept).
    pub fn count(&self, kind: &str) -> usize {
        self.counts.get(kind).copied().unwrap_or(0)
    }
}

/// Collects violations; details are built only for those kept.
pub(crate) struct Sink {
    report: CausalReport,
}

impl Sink {
    fn new() -> Sink {
        Sink { report: CausalReport::default() }
    }

    /// Records a violation of `kind`; `detail` is called only if it is kept.
    pub(crate) fn report(&mut self, kind: &'static str, detail: impl FnOnce() -> String) {
        let r = &mut self.report;
        r.violations_total += 1;
        *r.counts.entry(kind).or_default() += 1;
        if r.violations.len() < VIOLATIONS_KEPT {
            r.violations.push(Violation { kind, detail: detail() });
        }
    }
}

/// Checks `history` (module documentation, *Checks*).
pub fn check(history: &CausalHistory) -> CausalReport {
    let mut sink = Sink::new();
    sink.report.txs = history.txs.len();
    let problems = malformed(history);
    if !problems.is_empty() {
        for problem in problems {
            sink.report(kind::MALFORMED, || problem);
        }
        return sink.report;
    }
    let prep = prep::Prepared::build(history, &mut sink);
    sink.report.committed = prep.txs.len();
    prep::check_commit_vectors(history, &prep, &mut sink);
    reads::check(history, &prep, &mut sink);
    session::check(history, &mut sink);
    uniform::check(history, &prep, &mut sink);
    converge::check(history, &prep, &mut sink);
    strong::check(history, &mut sink);
    serial::check(history, &prep, &mut sink);
    sink.report
}

/// Reads a `keel-causal` history: one JSON document of [`CausalHistory`]
/// (`docs/history-format.md`), at most [`FILE_BYTES_MAX`] bytes, well formed (as
/// [`check`]'s `malformed` rule says). Errors name `file` and, for JSON errors, the line.
pub fn parse(reader: impl Read, file: &str) -> Result<CausalHistory, InputError> {
    let mut bytes = Vec::new();
    reader
        .take(FILE_BYTES_MAX + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| InputError::new(file, 0, format!("cannot read: {e}")))?;
    if bytes.len() as u64 > FILE_BYTES_MAX {
        return Err(InputError::new(file, 0, format!("larger than {FILE_BYTES_MAX} bytes")));
    }
    let history: CausalHistory = serde_json::from_slice(&bytes).map_err(|e| {
        InputError::new(file, e.line() as u64, format!("not a keel-causal history: {e}"))
    })?;
    match malformed(&history).into_iter().next() {
        Some(problem) => Err(InputError::new(file, 0, problem)),
        None => Ok(history),
    }
}

/// Problems that make `history` unfit for checking (at most 20).
pub fn malformed(history: &CausalHistory) -> Vec<String> {
    let mut problems = Vec::new();
    let dcs = history.dcs;
    if dcs == 0 || dcs > DCS_MAX {
        problems.push(format!("dcs is {dcs}: must be 1 to {DCS_MAX}"));
        return problems;
    }
    if history.f >= dcs {
        problems.push(format!("f is {}: must be below dcs ({dcs})", history.f));
    }
    let width = dcs as usize + 1;
    let mut need = |ok: bool, what: &dyn Fn() -> String| {
        if !ok && problems.len() < 20 {
            problems.push(what());
        }
    };
    for &dc in &history.failed {
        need(dc < dcs, &|| format!("failed data center {dc} out of range"));
    }
    malformed_txs(history, width, &mut need);
    let mut ids = HashSet::new();
    for c in &history.committed {
        need(ids.insert(c.id), &|| format!("committed {} listed twice", c.id));
        need(c.origin < dcs, &|| format!("committed {}: origin {} out of range", c.id, c.origin));
        need(c.commit.len() == width, &|| {
            format!("committed {}: commit vector of {} entries, not {width}", c.id, c.commit.len())
        });
    }
    for s in &history.syncs {
        need(s.dc < dcs, &|| format!("sync of session {}: dc {} out of range", s.session, s.dc));
        need(s.past.len() == width, &|| {
            format!("sync of session {}: past of {} entries, not {width}", s.session, s.past.len())
        });
    }
    malformed_sessions(history, &mut need);
    for s in &history.stored {
        need(s.dc < dcs && s.origin < dcs, &|| format!("stored record {s:?} out of range"));
    }
    for f in &history.finals {
        need(f.snap.as_ref().is_none_or(|s| s.len() == width), &|| {
            format!("final state of dc {}: snapshot not of {width} entries", f.dc)
        });
        need(f.dc < dcs && !history.failed.contains(&f.dc), &|| {
            format!("final state of dc {}: not a data center that did not fail", f.dc)
        });
        let mut objects = HashSet::new();
        for (key, kind, seen) in &f.objects {
            need(objects.insert((key, *kind)), &|| {
                format!(
                    "final state of dc {}: {key:?} ({}) listed twice",
                    f.dc,
                    eval::kind_name(*kind)
                )
            });
            need(eval::seen_fits(*kind, seen), &|| {
                format!(
                    "final state of dc {}: {key:?} ({}) holds {}",
                    f.dc,
                    eval::kind_name(*kind),
                    eval::show(seen)
                )
            });
        }
    }
    problems
}

fn malformed_txs(
    history: &CausalHistory,
    width: usize,
    need: &mut impl FnMut(bool, &dyn Fn() -> String),
) {
    let mut ids = HashSet::new();
    for t in &history.txs {
        need(ids.insert(t.id), &|| format!("client tx {} listed twice", t.id));
        need(t.dc < history.dcs, &|| format!("tx {}: dc {} out of range", t.id, t.dc));
        need(t.past.len() == width && t.snap.len() == width, &|| {
            format!("tx {}: past or snapshot not of {width} entries", t.id)
        });
        if let Outcome::Committed { vector } = &t.outcome {
            need(vector.len() == width, &|| {
                format!("tx {}: commit vector of {} entries, not {width}", t.id, vector.len())
            });
        }
        for op in &t.ops {
            if let TxOp::Read { key, kind, seen } = op {
                need(eval::seen_fits(*kind, seen), &|| {
                    format!(
                        "tx {}: read of {key:?} ({}) returned {}",
                        t.id,
                        eval::kind_name(*kind),
                        eval::show(seen)
                    )
                });
            }
        }
    }
}

/// Each session's `order` values are distinct, and its times never go back along them (a
/// transaction's time is its start, a sync's its return, and a session runs one thing at a
/// time).
fn malformed_sessions(history: &CausalHistory, need: &mut impl FnMut(bool, &dyn Fn() -> String)) {
    for (session, events) in session::sessions(history) {
        for pair in events.windows(2) {
            let (a, b) = (pair[0].place(), pair[1].place());
            need(a.0 != b.0, &|| format!("session {session}: order {} used twice", a.0));
            need(a.1 <= b.1, &|| {
                format!(
                    "session {session}: order {} at {} ns comes after order {} at {} ns",
                    b.0, b.1, a.0, a.1
                )
            });
        }
    }
}

/// Whether `t` has at least one update.
pub(crate) fn has_updates(t: &ClientTx) -> bool {
    t.ops.iter().any(|op| matches!(op, TxOp::Update { .. }))
}
