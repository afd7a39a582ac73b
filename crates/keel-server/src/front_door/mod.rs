//! The client front door: RESP connections, and each request to its reply.
//!
//! Layout, by what a reader looks for:
//! - `connection`: the RESP side, apart from every command: accepting connections
//!   (slots, protected mode, TLS, unauthenticated ones), the reader (decoding, budgets,
//!   pipelining) and the writer (replies in order, few writes). It knows a request only
//!   as a frame in and a [`Pending`] reply out.
//! - `conn`: one connection's state ([`Conn`]), how its requests are ordered among
//!   themselves, and its queue of replies ([`Pending`], [`Resolved`]).
//! - `clients`: the node's open connections, for `CLIENT LIST`, `INFO` and `KILL`.
//! - `dispatch`: [`handle`], one request to its family; `AUTH` first, the engine's
//!   terms, the transaction being queued, then the command.
//! - what the front door asks of a keyspace's engine kind (whether a request has a
//!   meaning there, how it is ordered) is in the server's registry of engine packs,
//!   `crate::engines`.
//! - `commands`: one file per family of commands (strings, keys, queues, transactions,
//!   sessions, Correctables, server, acl), each with its commands' parsing where
//!   `keel_wire` does not parse them, permission check, mapping onto the engine's
//!   commands, replies and tests.
//!
//! Why this cut: as mini-redis keeps a command to a file, a command is read, changed and
//! tested in one place, its family's; what every command shares (the connection's state
//! and ordering, the dispatch, the engine check) sits once beside them, and the bytes on
//! the socket (which change for other reasons: budgets, timeouts, TLS, write sizes) sit
//! apart. A family rather than a command per file: Keel's commands of one family share
//! their reply shapes and engine mapping (`GET` and `MGET`, `DEL` and `EXISTS`), and a
//! file per command would repeat them.

mod clients;
mod commands;
mod conn;
mod connection;
mod dispatch;
#[cfg(test)]
mod tests;

pub use clients::Clients;
pub use commands::correctables::{View, INVOKE_ENDED};
pub use commands::server::{QUERY_WAIT, SERVER_NAME};
pub use conn::{Conn, Pending, ReplyFuture, Resolved};
pub use connection::{
    serve, FrontDoor, BULK_WRITE_MIN, PIPELINED_REQUEST_BYTES, READ_CHUNK_BYTES,
    WRITE_BUFFER_BYTES_MAX, WRITE_SLICE_BYTES,
};
pub use dispatch::handle;
