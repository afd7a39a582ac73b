//! The Kite engine in the simulator: its own world (no disks: Kite keeps its store in
//! memory), a recorder of `keel-rc` histories, the randomized `general` scenario, and
//! the paper's litmus tests and fault scenarios, scripted.
//!
//! - [`world`]: the cluster on virtual time, the network, sleeps, crashes, scripted drops.
//! - [`sim`]: Kite in the one world every engine runs in (`crate::world::World`): its
//!   `SimEngine` and its watch. The scenarios below still run in [`world`].
//! - [`recorder`]: sessions' requests and replies as a history for `keel_check::rc`.
//! - [`scenario`]: the `general` scenario.
//! - [`script`]: scripted sessions.
//! - [`litmus`]: `litmus` (L1 to L11) and `faults` (F1, F5 to F13, with L12).
//! - [`cli`]: `keel sim run --engine kite`.
//! - [`bench`]: `keel sim bench --engine kite`, the paper's throughput figures in virtual
//!   time, with a processor per node.

pub mod bench;
pub mod cli;
pub mod litmus;
pub mod recorder;
pub mod scenario;
pub mod script;
pub mod sim;
pub mod world;
