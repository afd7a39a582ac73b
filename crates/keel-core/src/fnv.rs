//! FNV-1a over length-prefixed fields: the stable, dependency-free hash the engines use
//! for digests that nodes compare (the applied state's digest, a Kite command's digest).
//! Fixed across versions: nodes of one cluster must agree on it.

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
