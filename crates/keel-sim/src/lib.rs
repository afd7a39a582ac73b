//! Keel's deterministic simulator: a whole cluster in one thread, on virtual time, from
//! one seed. See `docs/simulation.md` for the fault model, the invariants and what each
//! protects, the scenarios and the paper's tables.
//!
//! ```no_run
//! use keel_core::leader::LeaderEngine;
//! use keel_sim::scenario::{run_general, GeneralConfig};
//!
//! let report = run_general::<LeaderEngine>(&GeneralConfig::new(42));
//! assert!(report.passed(), "{:?}\nreplay: {}", report.violations, report.replay());
//! ```
//!
//! Layout:
//! - [`rng`]: the splitmix64 generator every random choice comes from.
//! - [`clock`]: node clocks that drift within the engine's stated bound, at rates that
//!   change during a run, faster or slower.
//! - [`net`]: the network model (latency, loss, duplication, reordering, partitions).
//! - [`disk`]: one node's disk: the real write-ahead log (`keel_storage::SimStorage`)
//!   over an in-memory disk; crashes, torn tails, bit rot.
//! - [`engine`]: the trait an engine implements to be driven ([`engine::SimEngine`]).
//! - [`world`]: the event loop that drives engines and asserts their output contract.
//! - [`invariants`]: invariants checked during a run.
//! - [`clients`], [`history`], [`survivors`]: simulated clients, the history they
//!   record, the per-key oracle, and the final log's surviving writes.
//! - [`nemesis`]: the fault schedule.
//! - [`race`]: the `lease-race` scenario's aimed fault sequence, which random seeds ride
//!   into the lease overlap that the negative control `forget_leader_contact` turns into
//!   two leader leases.
//! - [`scenario`]: randomized scenarios (`general`).
//! - [`lease_overlap`]: a scripted nemesis that drives five nodes into two leader leases
//!   under the negative control `forget_leader_contact` (`lease-overlap`).
//! - [`driver`]: synchronous requests over a world, for scripted scenarios.
//! - [`table3`], [`table4`]: the ORCA paper's experiments.
//! - [`bench`]: measurements, not tests.
//! - [`kite`]: the Kite engine's world, recorder, scenarios and `--engine kite`.
//! - [`geo`]: the geo engine's world, recorder, scenarios and `--engine geo`.
//! - [`toy`]: a deliberately simple engine used to test the simulator itself.
//! - [`seeds`]: seeds of a scenario on threads, shared by `--engine kite` and `geo`.
//! - [`cli`]: `keel sim`.

pub mod bench;
pub mod cli;
pub mod clients;
pub mod clock;
pub mod codec;
pub mod disk;
pub mod driver;
pub mod engine;
pub mod geo;
pub mod history;
pub mod invariants;
pub mod kite;
pub mod lease_overlap;
pub mod membership;
pub mod nemesis;
pub mod net;
pub mod race;
pub mod rng;
pub mod scale;
pub mod scenario;
pub mod seeds;
pub mod slot_moves;
pub mod survivors;
pub mod table3;
pub mod table4;
pub mod tickets;
pub mod toy;
pub mod txns;
pub mod world;
