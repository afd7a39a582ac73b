//! Keel's history format and consistency checkers.
//!
//! Layout:
//! - [`history`]: the Keel history format (versioned JSON Lines, `docs/history-format.md`),
//!   its writer for recorders and its streaming reader.
//! - [`jepsen`]: readers for Jepsen's etcd register logs and kv EDN logs.
//! - [`model`]: the sequential models (`register`, `kv`, `keel`) and the op shape checked.
//! - [`linearizability`]: the per-key WGL/Lowe search with memoization and a budget.
//! - [`keel`]: turns a Keel history into the ops the linearizability check uses.
//! - [`monotonic`]: the cross-client monotonic-reads checker over reads and survivors.
//! - [`views`]: the rules for the views of reads invoked as Correctables, and the
//!   expansion that lets the other checkers judge each view as a read.
//! - [`txn`]: transactions, each all or nothing and isolated, against the final log's
//!   replay.
//! - [`queue`]: the replicated queue's checker (at-most-once, no phantoms, FIFO in real
//!   time, nothing acknowledged lost) on a client-recorded history.
//! - [`rc`]: release consistency (RC_Lin, Kite's model): the `keel-rc` history format and
//!   its checker (happens-before, load value, RMW atomicity, per-key coherence,
//!   linearizability and one order of synchronization ops).
//! - [`causal`]: causal consistency of UniStore-style geo transactions: the `keel-causal`
//!   history format and its checker (snapshots' return values, sessions, uniformity of
//!   remote visibility, convergence of the final states), with a saturation cross-check.
//! - [`generate`]: deterministic generator of valid Keel histories (tests, benchmark).
//! - [`cli`]: `keel check` (arguments, verdict lines, exit codes, `--bench`).
//! - [`error`]: input errors naming file and line.
//!
//! Checkers are pure: no I/O, no clock, no randomness; only [`cli`] reads files and times.
pub mod causal;
pub mod cli;
pub mod error;
pub use keel_types::fasthash;
pub mod generate;
pub mod history;
pub mod jepsen;
pub mod keel;
pub mod linearizability;
pub mod model;
pub mod monotonic;
pub mod queue;
pub mod rc;
pub mod txn;
pub mod views;

/// A checker's verdict word: `ok` when nothing was violated, else `violation`.
pub fn verdict(holds: bool) -> &'static str {
    if holds {
        "ok"
    } else {
        "violation"
    }
}
