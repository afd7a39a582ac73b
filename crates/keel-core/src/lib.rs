//! Keel's deterministic protocol engines.
//!
//! An engine is a state machine with no I/O: time, messages, client requests and disk
//! completions come in as [`engine::Input`]s; messages, log writes, fsync requests,
//! replies and timers go out as [`engine::Outputs`]. The tokio server, the simulator and
//! the tests are its drivers; all of them carry the outputs out through one effect
//! executor (`keel-exec`), in the order written on [`engine::Outputs`].
//!
//! Layout:
//! - [`engine`]: the [`engine::Engine`] trait every engine kind implements, and the
//!   contract between an engine and its drivers.
//! - [`time`]: the virtual time type engines are given.
//! - [`leader`]: the leader engine (ORCA: consistency-aware durability, active set,
//!   cross-client monotonic reads).
//! - [`kite`]: the Kite engine (release consistency on a leaderless store).
//! - [`geo`]: the geo engine (UniStore's causal transactions across data centers).

pub mod engine;
mod fnv;
pub mod geo;
pub mod kite;
pub mod leader;
pub mod time;
