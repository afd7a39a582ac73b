//! Keel's storage: segmented write-ahead log, snapshots, and the Storage trait.
