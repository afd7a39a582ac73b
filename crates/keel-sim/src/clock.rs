//! Node clocks: each node's local clock runs at its own rate off virtual time,
//! `local = offset + virtual × (1 + drift_ppm / 10⁶)`, with drift within the bound the
//! engine's configuration states (`Config::clock_drift_ppm_max`).

use keel_core::time::Time;

/// Parts per million in one.
const PPM_ONE: i128 = 1_000_000;
/// The largest drift a clock may have, either way (90%).
pub const DRIFT_PPM_LIMIT: i32 = 900_000;

/// One node's local clock as a function of virtual time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeClock {
    /// The local reading at virtual time zero.
    pub offset_ns: u64,
    /// How fast the clock runs relative to virtual time, in parts per million
    /// (positive: fast). Bounded well below 10⁶ so the clock stays strictly increasing.
    pub drift_ppm: i32,
}

impl NodeClock {
    /// A clock; `drift_ppm` must be within ±900,000 (90%), far beyond any real bound
    /// (negative tests use the extremes).
    pub fn new(offset_ns: u64, drift_ppm: i32) -> NodeClock {
        assert!(drift_ppm.abs() <= DRIFT_PPM_LIMIT, "drift {drift_ppm} ppm is not a clock");
        NodeClock { offset_ns, drift_ppm }
    }

    /// The same clock from virtual time `now_ns` on, running at `drift_ppm` instead: the
    /// reading at `now_ns` is unchanged, so the clock stays monotonic. The new rate may
    /// not be faster than the old one (the offset would have to go negative).
    pub fn with_drift_from(&self, now_ns: u64, drift_ppm: i32) -> NodeClock {
        assert!(drift_ppm <= self.drift_ppm, "a clock may only be slowed down");
        let reading = self.local(now_ns).0;
        let scaled = i128::from(now_ns) + i128::from(now_ns) * i128::from(drift_ppm) / PPM_ONE;
        let offset = i128::from(reading) - scaled;
        assert!(offset >= 0, "offset went negative");
        let clock = NodeClock::new(offset as u64, drift_ppm);
        debug_assert_eq!(clock.local(now_ns), self.local(now_ns));
        clock
    }

    /// The node's local reading at virtual time `virtual_ns`.
    pub fn local(&self, virtual_ns: u64) -> Time {
        let v = i128::from(virtual_ns);
        let scaled = v + v * i128::from(self.drift_ppm) / PPM_ONE;
        let local = i128::from(self.offset_ns) + scaled;
        assert!(local >= 0 && local <= i128::from(u64::MAX), "clock overflow");
        Time(local as u64)
    }

    /// The earliest virtual time at which the local clock reads at least `local`.
    pub fn virtual_at(&self, local: Time) -> u64 {
        let target = i128::from(local.0) - i128::from(self.offset_ns);
        if target <= 0 {
            return 0;
        }
        let rate = PPM_ONE + i128::from(self.drift_ppm);
        // The exact inverse, then correct the integer rounding of `local()` by stepping.
        let mut v = (target * PPM_ONE / rate).max(0) as u64;
        // A slow clock reads the same value for up to 10⁶/rate virtual nanoseconds.
        let steps_max = PPM_ONE / rate + 8;
        let mut steps = 0;
        while v > 0 && self.local(v - 1) >= local {
            v -= 1;
            steps += 1;
            assert!(steps <= steps_max, "clock inverse off by more than rounding");
        }
        while self.local(v) < local {
            v += 1;
            steps += 1;
            assert!(steps <= steps_max, "clock inverse off by more than rounding");
        }
        debug_assert!(v == 0 || self.local(v - 1) < local);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clocks_drift_by_their_rate() {
        let fast = NodeClock::new(0, 100);
        let slow = NodeClock::new(0, -100);
        let one_s = 1_000_000_000;
        assert_eq!(fast.local(one_s), Time(one_s + 100_000));
        assert_eq!(slow.local(one_s), Time(one_s - 100_000));
        assert_eq!(NodeClock::new(5, 0).local(10), Time(15));
    }

    #[test]
    fn slowing_a_clock_keeps_its_reading_and_changes_its_rate() {
        let clock = NodeClock::new(1_000, 50);
        let slow = clock.with_drift_from(2_000_000, -500_000);
        assert_eq!(slow.local(2_000_000), clock.local(2_000_000));
        let later = slow.local(4_000_000).0 - slow.local(2_000_000).0;
        assert_eq!(later, 1_000_000);
    }

    #[test]
    fn inverse_is_the_earliest_virtual_time_reaching_the_reading() {
        let clocks = [
            NodeClock::new(17, 30),
            NodeClock::new(0, -77),
            NodeClock::new(999, 0),
            NodeClock::new(5, -900_000),
            NodeClock::new(5, 900_000),
        ];
        for clock in clocks {
            for local in [0u64, 1, 1_000, 123_456_789, 5_000_000_000] {
                let v = clock.virtual_at(Time(local));
                assert!(clock.local(v) >= Time(local));
                assert!(v == 0 || clock.local(v - 1) < Time(local));
            }
        }
    }
}
