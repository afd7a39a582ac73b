//! Keel's benchmark harness: YCSB workloads and drivers for Keel and its peers. Filled in by the benchmark issue.
