//! The Kite engine: release consistency (relaxed accesses, releases, acquires and
//! read-modify-writes) on a leaderless, fully replicated, in-memory store, after
//! Gavrielatos et al., "Kite: Efficient and Available Release Consistency for the
//! Datacenter" (PPoPP 2020). See `docs/kite.md` for the model users get, the protocol,
//! restarts and how each of the paper's open points is resolved.
//!
//! Layout:
//! - [`types`]: stamps and ballots, operations and results, messages, configuration and
//!   status.
//! - `adapter`: the platform's `Engine` interface: front-door requests and replies, the
//!   incarnation kept on disk, the report.
//! - `engine`: [`KiteEngine`], cut by protocol piece (its `mod.rs` has the table): the
//!   replica and its step (`replica.rs`), the validation gate (`gate.rs`), answering peers
//!   (`serve.rs`), rounds with retransmission and their timer index (`rounds.rs`),
//!   sessions running one operation at a time (`sessions.rs`), the Eventual Store fast
//!   path and ABD for releases and acquires (`ops.rs`), the release and acquire barriers
//!   with the delinquency bits and epochs (`barrier.rs`), per-key leaderless Paxos for
//!   read-modify-writes (`rmw/`), restarts (`rejoin.rs`, `fence.rs`), the outcome table
//!   (`outcomes.rs`) and the invariants (`invariants.rs`).
//!
//! Like the leader engine it is a deterministic state machine driven by
//! [`crate::engine::Input`]s; it asks for no disk work, only messages, replies and
//! wake-ups.

mod adapter;
mod engine;
#[cfg(test)]
mod tests;
pub mod types;

pub use engine::KiteEngine;
pub use types::{
    Ballot, Bit, Config, Counters, Cursor, KiteOp, KiteReply, KiteRequest, KiteResult, Membership,
    Message, Origin, ReplyForm, RmwId, RmwOutcome, RmwRecord, SlotImage, Stamp, Status, View,
    VotersWanted, MEMBERSHIP_KEY,
};
