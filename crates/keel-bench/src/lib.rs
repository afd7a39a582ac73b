//! Keel's benchmark harness: YCSB's core workloads, drivers for Keel and its peers
//! (Redis, etcd, ZooKeeper), three-node clusters on loopback, and reports.
//!
//! Layout:
//! - [`rng`], [`generator`], [`workload`]: YCSB's generators and workloads A–F and W,
//!   deterministic given a seed (pure; unit-tested for their distributions).
//! - [`driver`]: one async trait over every system; RESP (Keel, Redis), gRPC (etcd) and
//!   jute (ZooKeeper).
//! - [`cluster`], [`systems`]: starting and stopping each system's cluster, and the
//!   named configurations (`cad`, `immediate`, `linearizable`, ...).
//! - [`runner`]: load phase, closed-loop and open-loop run phases, HdrHistogram latency.
//! - [`report`], [`plot`], [`progress`]: JSON lines, Markdown tables, PNG plots, the
//!   progress bar.
//! - [`cli`], [`suite`]: `keel bench` and `keel bench suite orca|geo|scale`; [`geo`]: the
//!   geo suite (five nodes in three emulated sites, latency CDFs); [`kite`]: Kite's
//!   modes; [`unistore`]: a geo keyspace's causal commit against strong-only across an
//!   emulated wide area; [`rubis`]: UniStore's RUBiS bidding mix in the paper's four
//!   modes.
//!
//! Benchmarks measure; only the deterministic parts are tested.

pub mod cli;
pub mod cluster;
pub mod correctables;
pub mod driver;
pub mod generator;
pub mod geo;
pub mod kite;
pub mod plot;
pub mod progress;
pub mod report;
pub mod rng;
pub mod rubis;
pub mod runner;
pub mod suite;
pub mod systems;
pub mod unistore;
pub mod workload;
