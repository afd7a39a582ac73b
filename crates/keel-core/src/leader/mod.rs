//! The leader engine: ORCA's consistency-aware durability with cross-client monotonic
//! reads, on a Raft-style replicated log. See `docs/protocol.md` for the state diagram,
//! message table, invariants and resolved ambiguities, and `docs/consistency.md` for
//! what each durability and read level promises.
//!
//! Layout:
//! - [`io`]: the engine's types: [`Message`], [`Config`], [`Status`], and its
//!   [`Input`] and [`Outputs`] (the contract itself is in [`crate::engine`]).
//! - [`config`]: configuration defaults, validation and the derived timing bounds.
//! - `engine`: [`LeaderEngine`]: the shared state and one role's, the `step` loop,
//!   dispatch, role changes, timers, invariants and introspection.
//! - `core`: the state every role shares, and persistence and snapshot helpers.
//! - `follower`: the follower role (log matching, rollback, lease, snapshots, forwards).
//! - `candidate`: elections: the pre-vote probe, the candidate role, the voter's rules.
//! - `leading`: the leader role (replication, active set and leases, durability rounds,
//!   writes and reads).
//! - `client`: requests as they enter the engine, to the role that serves them.
//! - `gate`: the validation gate for peer messages and recovered state.
//! - `report`: the status document and metrics.
//! - [`kv`]: the key-value state machine with undo records and its snapshot format.
//! - [`log`]: the in-memory log.
//!
//! Driving loop: see [`crate::engine::Engine`]; the server, the simulator and the tests
//! all run it through the effect executor.

mod candidate;
mod client;
pub(crate) mod coll;
pub mod config;
mod core;
mod engine;
mod follower;
mod gate;
pub mod io;
pub mod kv;
mod kv_coll;
mod kv_events;
pub mod kv_image;
mod kv_slots;
mod kv_strings;
mod leading;
pub mod log;
mod report;

pub use self::core::Counters;
pub use self::core::Origin;
pub use self::leading::stamp_time;
pub use config::ConfigError;
pub use engine::LeaderEngine;
pub use io::{
    ClientReply, ClientRequest, Config, Input, Lease, Message, Outputs, PersistedState, Release,
    RequestTag, Role, SnapshotBytes, Status,
};
