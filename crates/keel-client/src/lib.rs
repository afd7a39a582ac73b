//! Keel's async Rust client. Filled in by the server issue.
