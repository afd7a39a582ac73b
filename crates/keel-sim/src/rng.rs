//! The simulator's only source of randomness: Keel's splitmix64 generator. Every
//! simulated parameter derives from one seed through it, so one seed reproduces a run.

pub use keel_types::rng::SplitMix64 as Rng;
