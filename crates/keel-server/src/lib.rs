//! Keel's server: the tokio runtime that hosts a node's keyspaces (each an engine of some
//! kind) over real sockets and files, carrying out every engine's outputs through the
//! effect executor (`keel-exec`).
//!
//! Layout:
//! - [`acl`]: client users, password hashes, permissions by command category and
//!   keyspace, per-user deduplication ids.
//! - [`config`]: [`ServerConfig`], read from TOML and flags, validated field by field;
//!   the keyspaces it resolves to.
//! - [`node`]: [`node::run`]: per keyspace recover, boot and start the loop; shared peer
//!   links; run until stopped or failed.
//! - [`driver`]: a keyspace's engine loop (one task owns the engine and the executor's
//!   front), [`KeyspaceHandle`] (how connections submit requests to it) and
//!   [`Keyspaces`].
//! - [`storage`]: a keyspace's storage thread (the executor's worker over the files,
//!   group-commit fsync).
//! - [`handshake`]: the peer handshake (mutual proof of the cluster secret).
//! - [`peer`]: peer links shared by the keyspaces: batched frames of keyspace envelopes,
//!   bounded queues, reconnect with backoff; per-keyspace inboxes that decode and gate.
//! - [`front_door`]: the client front door: RESP2/RESP3 connections (pipelining, budgets,
//!   connection limit) in `front_door/connection/`, and one request to one reply by
//!   command family in `front_door/commands/` (strings, keys, queues, transactions,
//!   sessions and `KEEL.REQ`, Correctables' `KEEL.INVOKE`, server commands such as
//!   `SELECT`, `INFO` and `KEEL.LOG`, `AUTH` and `ACL`).
//! - [`pubsub`]: channels, patterns and shard channels, messages forwarded to the other
//!   members, keyspace notifications from what the replicas apply, each connection's
//!   bounded outbox of pushed frames.
//! - [`login`]: password checks on a hashing thread of their own, the delays that slow
//!   a party guessing passwords, and their counts and log.
//! - [`unauthenticated`]: the connections not yet authenticated, at most a share of
//!   `connections_max`, the oldest closed first to make room.
//! - [`http`]: `/metrics` and `/status`.
//! - [`metrics`]: counters and histograms in the Prometheus text format.
//! - [`local`]: a local cluster of `keel server` processes (`keel up`, `keel demo`, tests).
//! - [`cli`]: `keel server`'s flags, logging, signals and exit codes.
//!
//! Threads: the tokio runtime (a worker per core, or `worker_threads`) runs every keyspace's
//! engine loop, the peer senders and receivers, the listeners and a pair of tasks per
//! connection; each keyspace's storage thread blocks in fsync so that no worker does.
//! `docs/operations.md` is the operator's guide.

pub mod acl;
pub mod cli;
pub mod config;
pub mod driver;
pub mod engines;
pub mod front_door;
pub mod handshake;
pub mod http;
pub mod leaders;
pub mod local;
pub mod login;
pub mod metrics;
pub mod node;
pub mod peer;
pub mod placement;
pub mod pubsub;
pub mod storage;
pub mod tls;
pub mod unauthenticated;

pub use config::ServerConfig;
pub use driver::{KeyspaceHandle, Keyspaces};
