//! Keel's one deterministic pseudo-random generator (splitmix64). Engines, the simulator
//! and the history generators take a seed and draw from this, so one seed reproduces a
//! run. It reads nothing from the environment. Not for cryptography.

/// A small, fast, deterministic PRNG (splitmix64). Not for cryptography.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator whose whole output is determined by `seed`.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value uniform in `[low, high)`; `high` must exceed `low`.
    pub fn range(&mut self, low: u64, high: u64) -> u64 {
        assert!(high > low, "empty range {low}..{high}");
        let width = high - low;
        // Multiply-shift maps 64 random bits onto the range without a division loop.
        let scaled = (u128::from(self.next_u64()) * u128::from(width)) >> 64;
        let value = low + scaled as u64;
        debug_assert!(value >= low && value < high);
        value
    }

    /// A value uniform in `[0, bound)`; `bound` must be positive.
    pub fn below(&mut self, bound: u64) -> u64 {
        self.range(0, bound)
    }

    /// An index uniform in `[0, len)`; `len` must be positive.
    pub fn index(&mut self, len: usize) -> usize {
        assert!(len > 0, "index into an empty collection");
        self.range(0, len as u64) as usize
    }

    /// Shuffles `items` in place (Fisher–Yates, one draw per position from the end).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.index(i + 1));
        }
    }

    /// True with probability `per_million` / 1,000,000.
    pub fn chance(&mut self, per_million: u32) -> bool {
        assert!(per_million <= 1_000_000, "probability {per_million} ppm above 1");
        self.range(0, 1_000_000) < u64::from(per_million)
    }

    /// A child generator for an independent stream (a node, a client, the network), so
    /// that adding draws to one stream does not shift the others.
    pub fn fork(&mut self) -> SplitMix64 {
        SplitMix64::new(self.next_u64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_different_seed_different_stream() {
        let mut a = SplitMix64::new(7);
        let mut b = SplitMix64::new(7);
        let mut c = SplitMix64::new(8);
        let xs: Vec<u64> = (0..16).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..16).map(|_| b.next_u64()).collect();
        let zs: Vec<u64> = (0..16).map(|_| c.next_u64()).collect();
        assert_eq!(xs, ys);
        assert_ne!(xs, zs);
    }

    #[test]
    fn range_stays_inside_and_covers_its_bounds() {
        let mut rng = SplitMix64::new(1);
        let mut seen = [false; 5];
        for _ in 0..1000 {
            let v = rng.range(10, 15);
            assert!((10..15).contains(&v));
            seen[(v - 10) as usize] = true;
        }
        assert!(seen.iter().all(|s| *s));
    }

    #[test]
    fn chance_respects_extremes() {
        let mut rng = SplitMix64::new(3);
        assert!((0..100).all(|_| !rng.chance(0)));
        assert!((0..100).all(|_| rng.chance(1_000_000)));
    }
}
