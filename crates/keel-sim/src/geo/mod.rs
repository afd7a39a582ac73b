//! The geo engine's simulation (`keel sim run --engine geo`): UniStore's causal half in
//! the one simulated world, every history checked by `keel check --model causal`'s
//! checker.
//!
//! - `sim`: [`keel_core::geo::GeoEngine`] as a `crate::engine::SimEngine`, and its watch.
//! - `world`: data centers over wide-area links, failing and cut off; the recorder.
//! - `scenario`: the `general` scenario (random sessions, migrations, faults).
//! - `removal`: an operator removing a data center during `general`.
//! - `back`: an operator taking the removed data center back.
//! - `late`: a survivor that learns of a removal and a return late (the cap's fault).
//! - `split`: a return's cut applied by some survivors, then the return abandoned.
//! - `script`: the digest's scenarios, scripted.
//! - `bench`: what uniformity costs, in virtual time (`keel sim bench --engine geo`).
//! - `cli`: `--engine geo`.

pub mod back;
pub mod bench;
pub mod cli;
pub mod late;
pub mod removal;
pub mod scenario;
pub mod script;
pub mod sim;
pub mod split;
pub mod world;
