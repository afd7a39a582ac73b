//! The leader engine: ORCA's consistency-aware durability with cross-client monotonic
//! reads, on a Raft-style replicated log. See `docs/protocol.md` for the state diagram,
//! message table, invariants and resolved ambiguities, and `docs/consistency.md` for
//! what each durability and read level promises.
//!
//! Layout:
//! - [`io`]: the engine's contract: [`Input`], [`Outputs`], [`Message`], [`Config`].
//! - [`config`]: configuration defaults, validation and the derived timing bounds.
//! - `engine`: [`LeaderEngine`]: state, the `step` loop, timers, elections, snapshots,
//!   invariants and introspection.
//! - `replication`: the leader's side (progress, active set, durable index, rounds).
//! - `follower`: the follower's side (log matching, rollback, lease, snapshots).
//! - `client`: requests, reads at each level, writes, forwarding.
//! - [`kv`]: the key-value state machine with undo records and its snapshot format.
//! - [`log`]: the in-memory log.
//!
//! Driving loop (the server and the simulator both do this):
//!
//! ```
//! use keel_core::leader::{Config, Input, LeaderEngine, PersistedState};
//! use keel_core::time::Time;
//! use keel_types::NodeId;
//!
//! let members = vec![NodeId(1), NodeId(2), NodeId(3)];
//! let config = Config::new(NodeId(1), members);
//! let mut engine = LeaderEngine::new(config, PersistedState::default(), 42, Time(0)).unwrap();
//! let out = engine.step(Time(1_000_000_000), Input::Tick);
//! // 1. persist out.hard_state; 2. truncate/append the log; 3. fsync through
//! // out.sync_through and later feed Input::LogSynced; 4. save out.snapshot;
//! // 5. send out.messages; 6. return out.replies; 7. tick again by out.wake_at.
//! assert!(out.hard_state.is_none(), "the election timer fired: a pre-vote changes no state");
//! assert_eq!(out.messages.len(), 2, "pre-vote requests to both peers");
//! ```

mod client;
pub mod config;
mod engine;
mod follower;
pub mod io;
pub mod kv;
pub mod log;
mod replication;
#[cfg(test)]
mod tests;

pub use client::Origin;
pub use config::ConfigError;
pub use engine::{Counters, LeaderEngine};
pub use io::{
    ClientReply, ClientRequest, Config, Input, Lease, Message, Outputs, PersistedState, Release,
    RequestTag, Role, SnapshotBytes, Status,
};
