//! FNV-1a over length-prefixed fields: the stable, dependency-free hash of the digest a
//! Kite read-modify-write keeps with its outcome (a leader write's command digest is
//! FNV-1a too, over the command's log encoding, in `leader::kv`). Fixed across versions:
//! such digests are persisted and compared by nodes of one cluster.
//!
//! [`WordHash`]: a faster hash, a word at a time, for the applied-state digest, which is
//! never persisted or sent (the simulator and tests compare it between nodes of one
//! build). Every replica updates it on every write; FNV-1a multiplies once per byte
//! (`docs/performance.md`, *Work per request*).

use keel_types::fasthash::FxHasher;
use std::hash::Hasher;

/// An FNV-1a hash being built.
pub(crate) struct Fnv(pub(crate) u64);

impl Fnv {
    /// The FNV-1a offset basis.
    pub(crate) fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    /// A field: its length (a u64, little-endian), then its bytes.
    pub(crate) fn write_bytes(&mut self, bytes: &[u8]) {
        self.write_u64(bytes.len() as u64);
        self.write_raw(bytes);
    }

    /// A u64, little-endian.
    pub(crate) fn write_u64(&mut self, value: u64) {
        self.write_raw(&value.to_le_bytes());
    }

    fn write_raw(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// A 64-bit hash over length-prefixed fields: `keel_types::fasthash::FxHasher`'s word at a
/// time, finished with MurmurHash3's 64-bit mix so that every input bit reaches every
/// output bit (the digest of a state is a sum of these, which must not cancel out for
/// near-equal items).
pub(crate) struct WordHash(FxHasher);

impl WordHash {
    pub(crate) fn new() -> WordHash {
        WordHash(FxHasher::default())
    }

    /// A field: its length, then its bytes, the last word zero-padded (the length
    /// tells `a` + `b\0` from `a\0` + `b`).
    pub(crate) fn write_bytes(&mut self, bytes: &[u8]) {
        self.0.write_u64(bytes.len() as u64);
        self.0.write(bytes);
    }

    pub(crate) fn write_u64(&mut self, value: u64) {
        self.0.write_u64(value);
    }

    pub(crate) fn finish(&self) -> u64 {
        let mut h = self.0.finish();
        h ^= h >> 33;
        h = h.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
        h ^= h >> 33;
        h = h.wrapping_mul(0xC4CE_B9FE_1A85_EC53);
        h ^ (h >> 33)
    }
}

#[cfg(test)]
mod tests {
    use super::WordHash;

    fn hash(fields: &[&[u8]]) -> u64 {
        let mut h = WordHash::new();
        fields.iter().for_each(|f| h.write_bytes(f));
        h.finish()
    }

    #[test]
    fn fields_and_lengths_count() {
        assert_ne!(hash(&[b"a", b"b"]), hash(&[b"ab"]));
        assert_ne!(hash(&[b"a", b"b"]), hash(&[b"a\0", b"b"]));
        assert_ne!(hash(&[b""]), hash(&[b"\0"]));
        assert_ne!(hash(&[b"12345678"]), hash(&[b"12345678\0"]));
        assert_eq!(hash(&[b"key", b"value"]), hash(&[b"key", b"value"]));
    }

    #[test]
    fn one_bit_changes_about_half_the_output() {
        // Every bit of a 20-byte field flipped in turn moves 20 to 44 of the 64 output
        // bits: the finishing mix spreads each input bit (summed digests rely on it).
        let base = *b"key:000000000001abcd";
        let h0 = hash(&[&base]);
        for bit in 0..base.len() * 8 {
            let mut flipped = base;
            flipped[bit / 8] ^= 1 << (bit % 8);
            let moved = (hash(&[&flipped]) ^ h0).count_ones();
            assert!((20..=44).contains(&moved), "bit {bit} moved {moved} output bits");
        }
    }
}
