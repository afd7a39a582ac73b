//! Node clocks: each node's local clock runs at its own rate off virtual time, piecewise
//! linear: from an anchor `(virtual, local)` on, `local = anchor_local + (virtual −
//! anchor_virtual) × (1 + drift_ppm / 10⁶)`. A clock's rate may change during a run, either
//! way, from its reading at that moment (the new piece starts there), so it stays
//! monotonic; the world keeps rates within the bound the engine's configuration states
//! (`Config::clock_drift_ppm_max`) except in negative controls.

use keel_core::time::Time;

/// Parts per million in one.
const PPM_ONE: i128 = 1_000_000;
/// The largest drift a clock may have, either way (90%): a slow clock still advances.
pub const DRIFT_PPM_LIMIT: i32 = 900_000;
/// The largest drift a fast clock may have (ten times as fast as virtual time), for
/// negative controls that speed clocks up past the engine's bound.
pub const FAST_DRIFT_PPM_LIMIT: i32 = 9_000_000;

/// One node's local clock as a function of virtual time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeClock {
    /// The virtual time at which the current rate took effect (0 for a clock's first).
    anchor_virtual_ns: u64,
    /// The local reading at `anchor_virtual_ns`.
    anchor_local_ns: u64,
    /// How fast the clock runs relative to virtual time, in parts per million
    /// (positive: fast). Bounded well below 10⁶ so the clock stays strictly increasing.
    pub drift_ppm: i32,
}

impl NodeClock {
    /// A clock reading `offset_ns` at virtual time zero; `drift_ppm` must be within
    /// −900,000 (a tenth of the speed) and +9,000,000 (ten times it), far beyond any real
    /// bound (negative tests use the extremes).
    pub fn new(offset_ns: u64, drift_ppm: i32) -> NodeClock {
        let range = -DRIFT_PPM_LIMIT..=FAST_DRIFT_PPM_LIMIT;
        assert!(range.contains(&drift_ppm), "drift {drift_ppm} ppm is not a clock");
        NodeClock { anchor_virtual_ns: 0, anchor_local_ns: offset_ns, drift_ppm }
    }

    /// The same clock from virtual time `now_ns` on, running at `drift_ppm` instead,
    /// faster or slower: the reading at `now_ns` is unchanged, so the clock stays
    /// monotonic. `now_ns` may not precede the current rate's start.
    pub fn with_drift_from(&self, now_ns: u64, drift_ppm: i32) -> NodeClock {
        assert!(now_ns >= self.anchor_virtual_ns, "a rate change before the current one");
        let clock = NodeClock {
            anchor_virtual_ns: now_ns,
            anchor_local_ns: self.local(now_ns).0,
            ..NodeClock::new(0, drift_ppm)
        };
        debug_assert_eq!(clock.local(now_ns), self.local(now_ns));
        clock
    }

    /// The node's local reading at virtual time `virtual_ns`. Before the current rate's
    /// start the reading is extrapolated back at that rate (floored at zero): only the
    /// inverse, [`NodeClock::virtual_at`], looks there.
    pub fn local(&self, virtual_ns: u64) -> Time {
        let elapsed = i128::from(virtual_ns) - i128::from(self.anchor_virtual_ns);
        let scaled = elapsed + elapsed * i128::from(self.drift_ppm) / PPM_ONE;
        let local = (i128::from(self.anchor_local_ns) + scaled).max(0);
        assert!(local <= i128::from(u64::MAX), "clock overflow");
        Time(local as u64)
    }

    /// The earliest virtual time at which the local clock reads at least `local`.
    pub fn virtual_at(&self, local: Time) -> u64 {
        if self.local(0) >= local {
            return 0;
        }
        let target = i128::from(local.0) - i128::from(self.anchor_local_ns);
        let rate = PPM_ONE + i128::from(self.drift_ppm);
        // The exact inverse, then correct the integer rounding of `local()` by stepping.
        let mut v = (i128::from(self.anchor_virtual_ns) + target * PPM_ONE / rate).max(0) as u64;
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
    fn speeding_a_clock_up_keeps_its_reading_even_from_offset_zero() {
        // With a single offset this could not be expressed: the offset would go negative.
        let clock = NodeClock::new(0, -50);
        let now = 5_000_000_000;
        let fast = clock.with_drift_from(now, 50);
        assert_eq!(fast.local(now), clock.local(now));
        assert_eq!(fast.local(now + 1_000_000_000).0 - fast.local(now).0, 1_000_050_000);
        // Back and forth: each piece starts at the reading where the one before ends, so
        // the clock's readings over the whole run never go down.
        let slow = fast.with_drift_from(now + 1_000_000_000, -900_000);
        let again = slow.with_drift_from(now + 2_000_000_000, 900_000);
        let pieces =
            [(0, clock), (now, fast), (now + 1_000_000_000, slow), (now + 2_000_000_000, again)];
        let reading = |v: u64| pieces.iter().rev().find(|(from, _)| v >= *from).unwrap().1.local(v);
        let mut last = Time(0);
        for v in (0..now + 3_000_000_000).step_by(7_777_777) {
            assert!(reading(v) >= last, "the clock went back at {v}");
            last = reading(v);
        }
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
        let changed = [
            NodeClock::new(17, 30).with_drift_from(3_000_000_000, 900_000),
            NodeClock::new(0, 50).with_drift_from(3_000_000_000, -900_000),
        ];
        for clock in clocks.into_iter().chain(changed) {
            for local in [0u64, 1, 1_000, 123_456_789, 5_000_000_000, 9_000_000_000] {
                let v = clock.virtual_at(Time(local));
                assert!(clock.local(v) >= Time(local));
                assert!(v == 0 || clock.local(v - 1) < Time(local));
            }
        }
    }
}
