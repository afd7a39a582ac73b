//! The leader engine: ORCA's consistency-aware durability with cross-client monotonic
//! reads, on a Raft-style replicated log. See `docs/protocol.md` for the state diagram,
//! message table, invariants and resolved ambiguities.
//!
//! Layout:
//! - [`io`]: the engine's contract: [`Input`], [`Outputs`], [`Message`], [`Config`].

pub mod io;

pub use io::{
    ClientReply, ClientRequest, Config, Input, Message, Outputs, PersistedState, RequestTag, Role,
    Status,
};
