//! Keel's deterministic simulator: one thread, virtual time, one seed.
