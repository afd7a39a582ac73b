//! Keel's deterministic protocol engines.
//!
//! An engine is a state machine with no I/O: time, messages, client requests and disk
//! completions come in as [`leader::Input`]s; messages, log writes, fsync requests,
//! replies and timers go out as [`leader::Outputs`]. The tokio server and the simulator
//! are its two drivers, and both obey the ordering contract written on
//! [`leader::Outputs`].
//!
//! Layout:
//! - [`time`]: the virtual time type engines are given.
//! - [`leader`]: the leader engine (ORCA: consistency-aware durability, active set,
//!   cross-client monotonic reads). Kite and geo engines will sit beside it.

pub mod leader;
pub mod time;
