//! A small seeded pseudo-random generator (xoshiro256**, seeded through SplitMix64).
//!
//! Every generator of the workload draws from one of these, so a seed fixes the whole
//! operation stream of a client. Not cryptographic; never reads the clock or the OS.

/// The state of one stream of pseudo-random numbers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rng {
    state: [u64; 4],
}

impl Rng {
    /// A stream fixed by `seed`; two streams with the same seed are equal.
    pub fn new(seed: u64) -> Rng {
        let mut seeder = keel_types::rng::SplitMix64::new(seed);
        let state = [seeder.next_u64(), seeder.next_u64(), seeder.next_u64(), seeder.next_u64()];
        assert!(state.iter().any(|w| *w != 0), "xoshiro needs a non-zero state");
        Rng { state }
    }

    /// The next 64 uniformly distributed bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.state;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// A double uniformly distributed in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        let value = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        debug_assert!((0.0..1.0).contains(&value));
        value
    }

    /// An integer uniformly distributed in `[0, bound)`; `bound` must be positive.
    pub fn below(&mut self, bound: u64) -> u64 {
        assert!(bound > 0, "an empty range has no element");
        // Multiply-shift: bias below 2^-64 * bound, negligible for benchmark key spaces.
        ((u128::from(self.next_u64()) * u128::from(bound)) >> 64) as u64
    }

    /// Fills `out` with pseudo-random printable bytes (as YCSB's values are printable).
    pub fn fill_printable(&mut self, out: &mut [u8]) {
        for chunk in out.chunks_mut(8) {
            let bits = self.next_u64();
            for (i, byte) in chunk.iter_mut().enumerate() {
                // 64 printable characters, 6 bits each: ' '..='_'.
                *byte = b' ' + ((bits >> (i * 6)) & 0x3F) as u8;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_different_seed_different_stream() {
        let (mut a, mut b, mut c) = (Rng::new(7), Rng::new(7), Rng::new(8));
        let xs: Vec<u64> = (0..16).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..16).map(|_| b.next_u64()).collect();
        let zs: Vec<u64> = (0..16).map(|_| c.next_u64()).collect();
        assert_eq!(xs, ys);
        assert_ne!(xs, zs);
    }

    #[test]
    fn below_stays_in_range_and_covers_it() {
        let mut rng = Rng::new(1);
        let mut seen = [false; 10];
        for _ in 0..1000 {
            let x = rng.below(10);
            assert!(x < 10);
            seen[x as usize] = true;
        }
        assert!(seen.iter().all(|s| *s));
    }

    #[test]
    fn printable_bytes_are_printable() {
        let mut rng = Rng::new(3);
        let mut buf = [0u8; 100];
        rng.fill_printable(&mut buf);
        assert!(buf.iter().all(|b| (b' '..=b'_').contains(b)));
    }
}
