//! The Kite engine in the simulator, in the world every engine runs in
//! (`crate::world::World`): its `SimEngine`, a recorder of `keel-rc` histories, the
//! randomized `general` scenario, and the paper's litmus tests and fault scenarios,
//! scripted.
//!
//! - [`sim`]: Kite's `SimEngine` and its watch (every request committed at one stamp).
//! - [`world`]: the scenarios' view of `World<KiteEngine>`: sessions' requests at a time
//!   to come, replies with their time, sleeps, crashes, held links, scripted drops.
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
