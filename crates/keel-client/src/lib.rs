//! Keel's async Rust client.
//!
//! Layout:
//! - [`conn`]: [`conn::Connection`], one pipelined RESP connection to one node.
//! - [`client`]: [`Client`] (connection pools to every node, retries across nodes and
//!   retryable errors) and [`Session`] (one logical client: operations one at a time,
//!   writes deduplicated with `KEEL.REQ <client> <seq>` so a retry is applied at most
//!   once).
//! - [`correctable`](mod@crate::correctable): [`Correctable`], one operation's views of increasing strength (a
//!   fast preliminary one, then the final one), with callbacks, a stream of views and
//!   speculation; [`Client::invoke`] reads a key that way with one request
//!   (`KEEL.INVOKE`), [`Client::invoke_get`] with one request per level.
//! - [`kite`]: [`KiteSession`] and [`BlockingKiteSession`], sessions of a Kite keyspace
//!   (relaxed reads and writes, acquires, releases, FAA, CAS), each pinned to one node.
//! - [`geo`]: [`GeoSession`], a session of a geo keyspace: causal transactions, the
//!   uniform barrier, and attach at another data center with the session's past vector.
//! - [`tls`]: [`ClientTls`], TLS to nodes' `client_tls_addr` (a cluster CA, optionally a
//!   client certificate).
//! - [`error`]: [`ClientError`], which says whether to retry and whether a failed write
//!   may still have taken effect.
//! - [`history`]: recording histories in the keel-check format, and the survivors of a
//!   node's log.
//! - [`workload`]: a mixed recorded workload over every level and durability, and the
//!   checks its history must pass (used by `keel demo` and the black-box tests).
//!
//! ```no_run
//! # async fn demo() -> Result<(), keel_client::ClientError> {
//! use keel_client::{Client, ClientConfig};
//! use keel_types::{Durability, ReadLevel};
//!
//! let client = Client::new(ClientConfig::new(vec!["127.0.0.1:7379".parse().unwrap()]));
//! let mut session = client.session();
//! session.put(b"greeting", b"hello", Some(Durability::Durable)).await?;
//! let read = session.get(b"greeting", Some(ReadLevel::Linearizable)).await?;
//! assert_eq!(read.value.as_deref(), Some(&b"hello"[..]));
//! # Ok(())
//! # }
//! ```

pub mod client;
pub mod conn;
pub mod correctable;
pub mod error;
pub mod geo;
pub mod history;
pub mod kite;
pub mod kite_workload;
pub mod tls;
pub mod workload;

pub use client::{CasResult, Client, ClientConfig, QueueItem, ReadResult, Session, WriteResult};
pub use correctable::{correctable, Correctable, Resolver, State, View, Views};
pub use error::ClientError;
pub use geo::GeoSession;
pub use kite::{BlockingKiteSession, KiteSession};
pub use tls::ClientTls;

/// A fresh 64-bit id: wall-clock nanoseconds mixed with the process id (SplitMix64).
pub fn fresh_id() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut z = nanos ^ (u64::from(std::process::id()) << 40);
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
