//! A fast, deterministic hasher (FxHash-style multiply-rotate) for maps and sets that are
//! only ever asked for membership, never iterated: the checkers' models, and the requests
//! a server's engine loop holds by tag.

use std::hash::{BuildHasherDefault, Hasher};

/// The hasher (the seed is always 0: runs are reproducible).
#[derive(Default)]
pub struct FxHasher(u64);

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_u32(&mut self, word: u32) {
        self.write_u64(u64::from(word));
    }

    fn write_usize(&mut self, word: usize) {
        self.write_u64(word as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Maps and sets built with [`FxHasher`].
pub type FastHash = BuildHasherDefault<FxHasher>;
