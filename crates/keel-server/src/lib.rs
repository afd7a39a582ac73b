//! Keel's server: the tokio runtime that drives the leader engine over real sockets and
//! files.
//!
//! Layout:
//! - [`config`]: [`ServerConfig`], read from TOML and flags, validated field by field.
//! - [`node`]: [`node::run`]: recover, start every task, run until stopped or failed.
//! - [`driver`]: the engine loop (one task owns the engine) and [`NodeHandle`], how
//!   connections submit requests to it.
//! - [`storage`]: the storage thread (ordered disk work, group-commit fsync).
//! - [`peer`]: peer links: batched frames, bounded queues, reconnect with backoff.
//! - [`resp`]: the client front door (RESP2/RESP3, pipelining, connection limit).
//! - [`commands`]: one request to one reply; `KEEL.REQ` and `KEEL.LOG`.
//! - [`http`]: `/metrics` and `/status`.
//! - [`metrics`]: counters and histograms in the Prometheus text format.
//! - [`local`]: a local cluster of `keel server` processes (`keel up`, `keel demo`, tests).
//! - [`cli`]: `keel server`'s flags, logging, signals and exit codes.
//!
//! Threads: the tokio runtime (two workers) runs the engine loop, the listeners and one
//! pair of tasks per connection; the storage thread blocks in fsync so that no worker
//! does. `docs/operations.md` is the operator's guide.

pub mod cli;
pub mod commands;
pub mod config;
pub mod driver;
pub mod http;
pub mod local;
pub mod metrics;
pub mod node;
pub mod peer;
pub mod resp;
pub mod storage;

pub use config::ServerConfig;
pub use driver::{KeyspaceHandle, Keyspaces};
