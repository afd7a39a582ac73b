//! The geo engine: UniStore's causal transactions across data centers (`docs/geo.md`;
//! Bravo, Gotsman, de Régil and Wei, "UniStore: A fault-tolerant marriage of causal and
//! strong consistency", USENIX ATC 2021).
//!
//! A geo keyspace spans `D = 2f + 1` data centers; each holds every partition, one
//! replica per partition ([`Member`]), and a node is one such replica, which also
//! coordinates its clients' transactions. Transactions are causal: they read a snapshot
//! that includes the session's past, commit inside the data center without aborting, and
//! replicate asynchronously; a remote transaction becomes visible only once it is
//! *uniform* (stored at f+1 data centers with its dependencies), so that a data-center
//! failure never loses what a session depended on after a barrier.
//!
//! Layout:
//! - [`types`]: vectors, ids, objects and updates, requests, replies, messages,
//!   configuration and status.
//! - the objects' merge rules are `keel_types::geo`'s, with the vocabulary clients share.
//! - `channel`: the reliable FIFO channels between replicas.
//! - `engine`: [`GeoEngine`], cut by protocol piece.
//! - `adapter`: the engine behind the platform's engine interface.

mod adapter;
mod channel;
mod engine;
pub mod types;

pub use engine::{GeoEngine, BALLOT_MAX};
pub use types::*;

/// The partition of `partitions` that holds `key`.
pub fn key_partition(key: &[u8], partitions: u32) -> u32 {
    let mut h = crate::fnv::Fnv::new();
    h.write_bytes(key);
    (h.0 % u64::from(partitions)) as u32
}

#[cfg(test)]
mod tests;
