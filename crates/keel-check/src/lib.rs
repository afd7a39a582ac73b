//! Keel's history format and consistency checkers.
//!
//! Layout:
//! - [`history`]: the Keel history format (versioned JSON Lines, `docs/history-format.md`).
pub mod history;
