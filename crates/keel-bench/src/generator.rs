//! YCSB's number generators, ported from their published math (not their code).
//!
//! - [`fnv_hash64`]: FNV-1a over the eight little-endian bytes of a number, made
//!   non-negative as YCSB's `Utils.fnvhash64` does.
//! - [`UniformLong`]: uniform over `[lower, upper]`.
//! - [`Zipfian`]: Gray et al.'s "quickly generating billion-record synthetic databases"
//!   method, popular items first (item 0 the most popular), zipfian constant 0.99, with
//!   YCSB's incremental zeta when the item count grows.
//! - [`ScrambledZipfian`]: a zipfian over 10^10 items (precomputed zeta) hashed onto the
//!   key range, so popular keys are spread over the key space.
//! - [`SkewedLatest`]: zipfian over the distance from the newest acknowledged insert.
//! - [`Hotspot`]: a hot fraction of the range gets a fraction of the operations.
//! - [`AcknowledgedCounter`]: hands out insert key numbers and reports the highest number
//!   below which every insert has completed, over a bounded window.
//!
//! Every draw takes the caller's [`Rng`], so a seed fixes the stream.

use crate::rng::Rng;

/// YCSB's default zipfian constant.
pub const ZIPFIAN_CONSTANT: f64 = 0.99;
/// Items of the zipfian behind [`ScrambledZipfian`].
pub const SCRAMBLED_ITEM_COUNT: u64 = 10_000_000_000;
/// zeta(10^10, 0.99), as YCSB precomputes it.
pub const SCRAMBLED_ZETAN: f64 = 26.469_028_201_783_02;
/// Most items whose zeta this module computes term by term (bounds the loop).
pub const ZETA_ITEMS_MAX: u64 = 1 << 30;
/// Most inserts handed out and not yet acknowledged by an [`AcknowledgedCounter`].
pub const ACK_WINDOW_MAX: u64 = 1 << 20;

const FNV_OFFSET_BASIS_64: u64 = 0xCBF2_9CE4_8422_2325;
const FNV_PRIME_64: u64 = 1_099_511_628_211;

/// YCSB's `Utils.fnvhash64`: FNV-1a over the value's eight bytes, low byte first, then
/// made non-negative as a signed 64-bit number.
pub fn fnv_hash64(value: u64) -> u64 {
    let mut hash = FNV_OFFSET_BASIS_64;
    let mut rest = value;
    for _ in 0..8 {
        hash ^= rest & 0xFF;
        hash = hash.wrapping_mul(FNV_PRIME_64);
        rest >>= 8;
    }
    let result = (hash as i64).unsigned_abs();
    debug_assert!(result <= 1 << 63);
    result
}

/// Uniform over `[lower, upper]`.
#[derive(Clone, Debug)]
pub struct UniformLong {
    lower: u64,
    interval: u64,
}

impl UniformLong {
    /// Uniform over `[lower, upper]`; `lower <= upper`.
    pub fn new(lower: u64, upper: u64) -> UniformLong {
        assert!(lower <= upper, "empty uniform range {lower}..={upper}");
        UniformLong { lower, interval: upper - lower + 1 }
    }

    /// The next draw.
    pub fn next(&self, rng: &mut Rng) -> u64 {
        let value = self.lower + rng.below(self.interval);
        debug_assert!(value - self.lower < self.interval);
        value
    }
}

/// `sum_{i=start}^{end-1} 1 / (i+1)^theta`, added to `initial`.
fn zeta(start: u64, end: u64, theta: f64, initial: f64) -> f64 {
    assert!(start <= end, "zeta range goes backwards");
    assert!(end - start <= ZETA_ITEMS_MAX, "zeta over {} items is too slow", end - start);
    let mut sum = initial;
    for i in start..end {
        sum += 1.0 / ((i + 1) as f64).powf(theta);
    }
    sum
}

/// A zipfian over `[base, base + items)`: item `base` the most popular.
#[derive(Clone, Debug)]
pub struct Zipfian {
    base: u64,
    items: u64,
    theta: f64,
    zeta2theta: f64,
    alpha: f64,
    zetan: f64,
    eta: f64,
    /// The item count `zetan` was computed for.
    count_for_zeta: u64,
}

impl Zipfian {
    /// A zipfian over `[min, max]` with constant `theta` (YCSB: 0.99).
    pub fn new(min: u64, max: u64, theta: f64) -> Zipfian {
        assert!(min <= max);
        let items = max - min + 1;
        let zetan = zeta(0, items, theta, 0.0);
        Zipfian::with_zetan(min, max, theta, zetan)
    }

    /// As [`Zipfian::new`] with `zetan` (zeta of the item count) given, for huge counts.
    pub fn with_zetan(min: u64, max: u64, theta: f64, zetan: f64) -> Zipfian {
        assert!(min <= max && theta > 0.0 && theta < 1.0, "zipfian constant must be in (0, 1)");
        assert!(zetan >= 1.0, "zeta of at least one item is at least 1");
        let items = max - min + 1;
        let zeta2theta = zeta(0, 2, theta, 0.0);
        let eta = (1.0 - (2.0 / items as f64).powf(1.0 - theta)) / (1.0 - zeta2theta / zetan);
        Zipfian {
            base: min,
            items,
            theta,
            zeta2theta,
            alpha: 1.0 / (1.0 - theta),
            zetan,
            eta,
            count_for_zeta: items,
        }
    }

    /// The next draw over the full range.
    pub fn next(&mut self, rng: &mut Rng) -> u64 {
        self.next_of(rng, self.items)
    }

    /// The next draw over the first `item_count` items; zeta follows a changed count
    /// (incrementally when it grows, as YCSB does for the "latest" distribution).
    pub fn next_of(&mut self, rng: &mut Rng, item_count: u64) -> u64 {
        assert!(item_count > 0, "a zipfian needs at least one item");
        if item_count != self.count_for_zeta {
            self.zetan = if item_count > self.count_for_zeta {
                zeta(self.count_for_zeta, item_count, self.theta, self.zetan)
            } else {
                zeta(0, item_count, self.theta, 0.0)
            };
            self.count_for_zeta = item_count;
            // YCSB recomputes eta with the original item count; kept for fidelity.
            self.eta = (1.0 - (2.0 / self.items as f64).powf(1.0 - self.theta))
                / (1.0 - self.zeta2theta / self.zetan);
        }
        let u = rng.next_f64();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return self.base;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return self.base + 1;
        }
        let offset = (item_count as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        self.base + offset.min(item_count - 1)
    }
}

/// A zipfian whose popular items are scattered over `[min, max]` by [`fnv_hash64`].
#[derive(Clone, Debug)]
pub struct ScrambledZipfian {
    min: u64,
    item_count: u64,
    zipfian: Zipfian,
}

impl ScrambledZipfian {
    /// Over `[min, max]` with YCSB's constant 0.99 (and its precomputed zeta).
    pub fn new(min: u64, max: u64) -> ScrambledZipfian {
        assert!(min <= max);
        let zipfian =
            Zipfian::with_zetan(0, SCRAMBLED_ITEM_COUNT, ZIPFIAN_CONSTANT, SCRAMBLED_ZETAN);
        ScrambledZipfian { min, item_count: max - min + 1, zipfian }
    }

    /// The next draw.
    pub fn next(&mut self, rng: &mut Rng) -> u64 {
        let raw = self.zipfian.next(rng);
        let value = self.min + fnv_hash64(raw) % self.item_count;
        debug_assert!(value - self.min < self.item_count);
        value
    }
}

/// Recent items most popular: `last - zipfian(last)`.
#[derive(Clone, Debug)]
pub struct SkewedLatest {
    zipfian: Zipfian,
}

impl SkewedLatest {
    /// For a counter whose last acknowledged value is `last` now (`last >= 1`).
    pub fn new(last: u64) -> SkewedLatest {
        assert!(last >= 1, "the latest distribution needs at least one loaded record");
        SkewedLatest { zipfian: Zipfian::new(0, last - 1, ZIPFIAN_CONSTANT) }
    }

    /// The next draw, given the counter's last acknowledged value now.
    pub fn next(&mut self, rng: &mut Rng, last: u64) -> u64 {
        let back = self.zipfian.next_of(rng, last.max(1));
        assert!(back <= last, "the zipfian drew beyond its item count");
        last - back
    }
}

/// A hot set `[lower, lower + hot)` drawn with probability `hot_operations`.
#[derive(Clone, Debug)]
pub struct Hotspot {
    lower: u64,
    hot_interval: u64,
    cold_interval: u64,
    hot_operations: f64,
}

impl Hotspot {
    /// Over `[lower, upper]`: a `hot_data` fraction of the range takes a
    /// `hot_operations` fraction of the draws.
    pub fn new(lower: u64, upper: u64, hot_data: f64, hot_operations: f64) -> Hotspot {
        assert!(lower <= upper && (0.0..=1.0).contains(&hot_data));
        assert!((0.0..=1.0).contains(&hot_operations));
        let interval = upper - lower + 1;
        let hot_interval = (interval as f64 * hot_data) as u64;
        Hotspot { lower, hot_interval, cold_interval: interval - hot_interval, hot_operations }
    }

    /// The next draw.
    pub fn next(&self, rng: &mut Rng) -> u64 {
        let hot = rng.next_f64() < self.hot_operations;
        if (hot && self.hot_interval > 0) || self.cold_interval == 0 {
            self.lower + rng.below(self.hot_interval)
        } else {
            self.lower + self.hot_interval + rng.below(self.cold_interval)
        }
    }
}

/// Insert key numbers: handed out in order, acknowledged in any order; `last()` is the
/// highest number at and below which every handed-out number is acknowledged.
#[derive(Clone, Debug)]
pub struct AcknowledgedCounter {
    next: u64,
    limit: u64,
    /// `window[n % ACK_WINDOW_MAX]`: number `n` (above `limit`) is acknowledged.
    window: Vec<bool>,
}

/// Too many inserts are outstanding: the caller must wait for acknowledgements.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("more than {ACK_WINDOW_MAX} inserts are unacknowledged; retry after some complete")]
pub struct WindowFull;

impl AcknowledgedCounter {
    /// Counting from `start`: numbers below `start` count as loaded (`start >= 1`).
    pub fn new(start: u64) -> AcknowledgedCounter {
        assert!(start >= 1, "the counter needs at least one loaded record");
        AcknowledgedCounter {
            next: start,
            limit: start - 1,
            window: vec![false; ACK_WINDOW_MAX as usize],
        }
    }

    /// The next insert key number.
    pub fn hand_out(&mut self) -> Result<u64, WindowFull> {
        if self.next - self.limit > ACK_WINDOW_MAX {
            return Err(WindowFull);
        }
        let value = self.next;
        self.next += 1;
        Ok(value)
    }

    /// Marks `value` (handed out by [`Self::hand_out`]) complete and advances `last()`.
    pub fn acknowledge(&mut self, value: u64) {
        assert!(value > self.limit && value < self.next, "acknowledged {value} never handed out");
        let slot = (value % ACK_WINDOW_MAX) as usize;
        assert!(!self.window[slot], "insert {value} acknowledged twice");
        self.window[slot] = true;
        // Bounded: at most ACK_WINDOW_MAX slots are set.
        loop {
            let next_slot = ((self.limit + 1) % ACK_WINDOW_MAX) as usize;
            if !self.window[next_slot] || self.limit + 1 >= self.next {
                break;
            }
            self.window[next_slot] = false;
            self.limit += 1;
        }
    }

    /// The highest number at and below which everything is acknowledged.
    pub fn last(&self) -> u64 {
        self.limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_hash64_matches_reference_values() {
        // FNV-1a over eight zero bytes, computed by hand from the published constants.
        let mut hash = FNV_OFFSET_BASIS_64;
        for _ in 0..8 {
            hash = hash.wrapping_mul(FNV_PRIME_64);
        }
        assert_eq!(fnv_hash64(0), (hash as i64).unsigned_abs());
        assert_ne!(fnv_hash64(1), fnv_hash64(2));
        assert!(fnv_hash64(u64::MAX) <= 1 << 63);
    }

    #[test]
    fn zipfian_top_item_frequency_matches_theory() {
        // P(item 0) = 1 / zeta(n, 0.99); for n = 1000, zeta is about 7.4.
        let n = 1000;
        let expected = 1.0 / zeta(0, n, ZIPFIAN_CONSTANT, 0.0);
        let mut zipfian = Zipfian::new(0, n - 1, ZIPFIAN_CONSTANT);
        let mut rng = Rng::new(42);
        let draws = 200_000;
        let mut counts = vec![0u64; n as usize];
        for _ in 0..draws {
            counts[zipfian.next(&mut rng) as usize] += 1;
        }
        let top = counts[0] as f64 / draws as f64;
        assert!((top - expected).abs() < 0.01, "top frequency {top}, expected {expected}");
        // Popularity decreases: item 0 beats item 1 beats item 10 beats item 500.
        assert!(counts[0] > counts[1] && counts[1] > counts[10] && counts[10] > counts[500]);
    }

    #[test]
    fn zipfian_second_item_frequency_matches_theory() {
        let n = 100;
        let z = zeta(0, n, ZIPFIAN_CONSTANT, 0.0);
        let expected = 1.0 / 2f64.powf(ZIPFIAN_CONSTANT) / z;
        let mut zipfian = Zipfian::new(0, n - 1, ZIPFIAN_CONSTANT);
        let mut rng = Rng::new(5);
        let draws = 200_000;
        let hits = (0..draws).filter(|_| zipfian.next(&mut rng) == 1).count();
        let got = hits as f64 / draws as f64;
        assert!((got - expected).abs() < 0.01, "second item {got}, expected {expected}");
    }

    #[test]
    fn scrambled_zipfian_stays_in_range_and_is_skewed() {
        let mut gen = ScrambledZipfian::new(100, 1099);
        let mut rng = Rng::new(9);
        let mut counts = vec![0u64; 1000];
        for _ in 0..100_000 {
            let v = gen.next(&mut rng);
            assert!((100..=1099).contains(&v));
            counts[(v - 100) as usize] += 1;
        }
        counts.sort_unstable_by(|a, b| b.cmp(a));
        // The most popular key takes several percent; a uniform draw would give 0.1%.
        assert!(counts[0] > 2_000, "top key drew {}", counts[0]);
        // And the popular key is not key 0: the hash scatters it (fixed by the seedless hash).
        let top_raw = fnv_hash64(0) % 1000;
        assert!(top_raw < 1000);
    }

    #[test]
    fn skewed_latest_prefers_recent_items() {
        let mut gen = SkewedLatest::new(1000);
        let mut rng = Rng::new(11);
        let recent = (0..10_000).filter(|_| gen.next(&mut rng, 1000) >= 990).count();
        assert!(recent > 4_000, "only {recent} draws among the 10 newest");
        // Growing the count moves the mass with it. Theory gives about 36% among the ten
        // newest; YCSB's eta (kept from the original count) lowers that to about 30%.
        let newer = (0..10_000).filter(|_| gen.next(&mut rng, 2000) >= 1990).count();
        assert!(newer > 2_500, "only {newer} draws among the 10 newest after growth");
        assert!((0..1000).all(|_| gen.next(&mut rng, 2000) <= 2000));
    }

    #[test]
    fn uniform_is_flat() {
        let gen = UniformLong::new(1, 100);
        let mut rng = Rng::new(2);
        let mut counts = [0u32; 101];
        for _ in 0..100_000 {
            counts[gen.next(&mut rng) as usize] += 1;
        }
        assert_eq!(counts[0], 0);
        assert!(counts[1..].iter().all(|c| (800..1200).contains(c)));
    }

    #[test]
    fn hotspot_sends_the_hot_fraction_to_the_hot_set() {
        let gen = Hotspot::new(0, 999, 0.2, 0.8);
        let mut rng = Rng::new(4);
        let hot = (0..100_000).filter(|_| gen.next(&mut rng) < 200).count();
        assert!((78_000..82_000).contains(&hot), "hot draws {hot}");
    }

    #[test]
    fn acknowledged_counter_advances_only_over_contiguous_acks() {
        let mut counter = AcknowledgedCounter::new(10);
        assert_eq!(counter.last(), 9);
        let (a, b, c) =
            (counter.hand_out().unwrap(), counter.hand_out().unwrap(), counter.hand_out().unwrap());
        assert_eq!((a, b, c), (10, 11, 12));
        counter.acknowledge(b);
        assert_eq!(counter.last(), 9, "11 done but 10 not: last must not move");
        counter.acknowledge(a);
        assert_eq!(counter.last(), 11);
        counter.acknowledge(c);
        assert_eq!(counter.last(), 12);
    }

    #[test]
    fn acknowledged_counter_refuses_beyond_its_window() {
        let mut counter = AcknowledgedCounter::new(1);
        for _ in 0..ACK_WINDOW_MAX {
            counter.hand_out().unwrap();
        }
        assert_eq!(counter.hand_out(), Err(WindowFull));
        counter.acknowledge(1);
        assert!(counter.hand_out().is_ok());
    }
}
