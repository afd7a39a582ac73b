//! Keel's server: the tokio runtime that drives the engines over real sockets and files. Filled in by the server issue.
