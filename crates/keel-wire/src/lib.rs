//! Keel's wire codecs. Pure and fuzzable: bytes in, frames out. Filled in by the server issue.
