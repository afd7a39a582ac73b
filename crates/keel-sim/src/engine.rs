//! What the simulator needs from a protocol engine: the contract of
//! `keel_core::leader` (boot from persisted state, `step(now, input) -> Outputs`,
//! `status()`), behind a trait so the driver is written once for every engine.

use keel_core::leader::{Config, Input, Outputs, PersistedState, Status};
use keel_core::time::Time;

/// An engine the simulator can drive.
pub trait SimEngine {
    /// Starts a node from what its disk recovered; `seed` feeds its randomness.
    fn boot(config: Config, persisted: PersistedState, seed: u64, now: Time) -> Self
    where
        Self: Sized;

    /// Handles one input at local time `now` and says what the driver must do.
    fn step(&mut self, now: Time, input: Input) -> Outputs;

    /// The engine's externally visible state.
    fn status(&self) -> Status;

    /// A digest of the applied state at `status().applied_index`, when the engine
    /// offers one (used by the applied-agreement invariant).
    fn applied_digest(&self) -> Option<u64> {
        None
    }
}

impl SimEngine for keel_core::leader::LeaderEngine {
    fn boot(config: Config, persisted: PersistedState, seed: u64, now: Time) -> Self {
        keel_core::leader::LeaderEngine::new(config, persisted, seed, now)
            .expect("the simulator builds valid configurations")
    }

    fn step(&mut self, now: Time, input: Input) -> Outputs {
        keel_core::leader::LeaderEngine::step(self, now, input)
    }

    fn status(&self) -> Status {
        keel_core::leader::LeaderEngine::status(self)
    }

    fn applied_digest(&self) -> Option<u64> {
        Some(keel_core::leader::LeaderEngine::applied_digest(self))
    }
}
