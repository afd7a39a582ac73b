//! Drivers: one async trait, [`Driver`], over every system a benchmark can target.
//!
//! Layout: [`resp`] holds a RESP connection (over `keel_wire`'s codec) and the Keel and
//! Redis drivers built on it; [`etcd`] the etcd driver on etcd's gRPC API (`etcd-client`);
//! [`zk`] a minimal jute client and the ZooKeeper driver.
//! [`AnyDriver`] dispatches over them without boxing, so the runner is one generic loop.

pub mod etcd;
pub mod resp;
pub mod zk;

use std::future::Future;

/// Largest reply a driver accepts, in bytes (a 100-record scan of 1 KiB records fits).
pub const REPLY_BYTES_MAX: usize = 16 << 20;
/// How long one request may take before it counts as an error.
pub const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The connection failed; retryable after reconnecting.
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    /// The server answered with an error; retryable (e.g. no leader yet).
    #[error("server error: {0}")]
    Server(String),
    /// The server's bytes made no sense; the connection is out of step. Reconnect.
    #[error("protocol: {0}")]
    Protocol(String),
    /// The request took longer than [`REQUEST_TIMEOUT`]; reconnect and retry.
    #[error("timed out")]
    Timeout,
    /// The system cannot do this operation (e.g. range scans on Redis); not retryable.
    #[error("unsupported: {0}")]
    Unsupported(&'static str),
}

impl DriverError {
    /// Whether the connection must be replaced before the next request.
    pub fn needs_reconnect(&self) -> bool {
        matches!(self, DriverError::Io(_) | DriverError::Protocol(_) | DriverError::Timeout)
    }
}

/// One client's connection(s) to a system under test.
pub trait Driver: Send {
    /// Reads `key`; `Ok(true)` if it was found.
    fn read(&mut self, key: &[u8]) -> impl Future<Output = Result<bool, DriverError>> + Send;
    /// Writes `key` (update or insert: both overwrite).
    fn write(
        &mut self,
        key: &[u8],
        value: &[u8],
    ) -> impl Future<Output = Result<(), DriverError>> + Send;
    /// Reads up to `count` keys from `start` on; returns how many came back.
    fn scan(
        &mut self,
        start: &[u8],
        count: u64,
    ) -> impl Future<Output = Result<u64, DriverError>> + Send;
}

/// Every driver, dispatched by `match`.
#[derive(Debug)]
pub enum AnyDriver {
    /// Keel over RESP.
    Keel(resp::KeelDriver),
    /// Redis over RESP.
    Redis(resp::RedisDriver),
    /// etcd over its gRPC API.
    Etcd(etcd::EtcdDriver),
    /// ZooKeeper over jute.
    Zk(zk::ZkDriver),
}

impl Driver for AnyDriver {
    async fn read(&mut self, key: &[u8]) -> Result<bool, DriverError> {
        match self {
            AnyDriver::Keel(d) => d.read(key).await,
            AnyDriver::Redis(d) => d.read(key).await,
            AnyDriver::Etcd(d) => d.read(key).await,
            AnyDriver::Zk(d) => d.read(key).await,
        }
    }

    async fn write(&mut self, key: &[u8], value: &[u8]) -> Result<(), DriverError> {
        match self {
            AnyDriver::Keel(d) => d.write(key, value).await,
            AnyDriver::Redis(d) => d.write(key, value).await,
            AnyDriver::Etcd(d) => d.write(key, value).await,
            AnyDriver::Zk(d) => d.write(key, value).await,
        }
    }

    async fn scan(&mut self, start: &[u8], count: u64) -> Result<u64, DriverError> {
        match self {
            AnyDriver::Keel(d) => d.scan(start, count).await,
            AnyDriver::Redis(d) => d.scan(start, count).await,
            AnyDriver::Etcd(d) => d.scan(start, count).await,
            AnyDriver::Zk(d) => d.scan(start, count).await,
        }
    }
}
