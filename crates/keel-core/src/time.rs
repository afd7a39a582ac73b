//! Time as engines see it: a node-local monotonic clock in nanoseconds, passed in by the
//! driver. Engines never read a clock themselves.

use serde::{Deserialize, Serialize};
use std::ops::{Add, Sub};

/// A reading of a node's local monotonic clock, in nanoseconds since an arbitrary origin.
/// Different nodes' readings are not comparable; drift between them is bounded by
/// [`crate::leader::Config::clock_drift_ppm_max`]. Readings never go backwards while an
/// engine runs (it asserts so). Across a restart they may start over (a machine reboot
/// resets the server's `CLOCK_BOOTTIME`): the engine trusts no lease anchor from the future and
/// anchors grants at the latest reply, so safety does not depend on it.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Time(pub u64);

/// A span of time in nanoseconds.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Span(pub u64);

impl Span {
    /// A span of `ms` milliseconds.
    pub const fn from_millis(ms: u64) -> Span {
        Span(ms * 1_000_000)
    }

    /// A span of `us` microseconds.
    pub const fn from_micros(us: u64) -> Span {
        Span(us * 1_000)
    }

    /// The span in whole milliseconds.
    pub const fn as_millis(self) -> u64 {
        self.0 / 1_000_000
    }
}

impl Add<Span> for Time {
    type Output = Time;
    fn add(self, rhs: Span) -> Time {
        Time(self.0.saturating_add(rhs.0))
    }
}

impl Sub<Time> for Time {
    type Output = Span;
    /// The span from `rhs` to `self`, zero if `rhs` is later.
    fn sub(self, rhs: Time) -> Span {
        Span(self.0.saturating_sub(rhs.0))
    }
}
