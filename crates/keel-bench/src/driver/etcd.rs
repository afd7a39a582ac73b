//! The etcd driver over etcd's native gRPC API (`etcd-client`), as etcd's users run it:
//! puts at the leader, linearizable or serializable ranges at the leader or spread.
//!
//! [`leader`] asks each member, over the same API, which member leads (how the benchmark
//! waits for a new cluster and finds where writes go).
//!
//! Built with the `etcd` feature (`cargo build --release -p keel --features etcd`; the
//! gRPC client's build needs `protoc`). Without it, connecting fails with
//! [`DriverError::Unsupported`] saying how to build it, and [`leader`] finds none.

#[cfg(not(feature = "etcd"))]
use super::DriverError;
#[cfg(feature = "etcd")]
use super::{Driver, DriverError, REQUEST_TIMEOUT};
#[cfg(feature = "etcd")]
use etcd_client::{Client, GetOptions, KvClient};
#[cfg(feature = "etcd")]
use std::future::Future;
use std::net::SocketAddr;

/// etcd: linearizable or serializable reads, at the leader or spread.
#[derive(Clone, Debug)]
pub struct EtcdOptions {
    /// Serializable (local) reads rather than linearizable ones.
    pub serializable: bool,
    /// Reads spread over every node (client `i` reads at node `i % n`).
    pub reads_everywhere: bool,
}

/// One benchmark client of etcd (a build without the `etcd` feature has none).
#[cfg(not(feature = "etcd"))]
#[derive(Debug)]
pub struct EtcdDriver {
    _never: std::convert::Infallible,
}

#[cfg(not(feature = "etcd"))]
impl EtcdDriver {
    /// Fails: this build has no etcd client.
    pub async fn connect(
        _nodes: &[SocketAddr],
        _leader: usize,
        _client: usize,
        _options: EtcdOptions,
    ) -> Result<EtcdDriver, DriverError> {
        Err(DriverError::Unsupported(
            "this keel was built without the etcd driver: cargo build --release -p keel --features etcd (needs protoc)",
        ))
    }
}

/// The index in `members` of the member every member names as leader: `None` until they
/// agree (and always in a build without the `etcd` feature).
#[cfg(not(feature = "etcd"))]
pub async fn leader(_members: &[SocketAddr]) -> Option<usize> {
    None
}

#[cfg(not(feature = "etcd"))]
impl super::Driver for EtcdDriver {
    async fn read(&mut self, _key: &[u8]) -> Result<bool, DriverError> {
        match self._never {}
    }

    async fn write(&mut self, _key: &[u8], _value: &[u8]) -> Result<(), DriverError> {
        match self._never {}
    }

    async fn scan(&mut self, _start: &[u8], _count: u64) -> Result<u64, DriverError> {
        match self._never {}
    }
}

/// One benchmark client of etcd: a gRPC channel to the leader for writes, and one to the
/// node it reads at when that is another.
#[cfg(feature = "etcd")]
pub struct EtcdDriver {
    writer: KvClient,
    reader: Option<KvClient>,
    options: EtcdOptions,
}

#[cfg(feature = "etcd")]
impl std::fmt::Debug for EtcdDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdDriver").field("options", &self.options).finish_non_exhaustive()
    }
}

#[cfg(feature = "etcd")]
/// A gRPC failure as the runner treats it: a status from the server is retryable on the
/// same channel; anything else (transport, I/O) replaces the channel.
fn driver_error(error: etcd_client::Error) -> DriverError {
    match error {
        etcd_client::Error::GRpcStatus(status) => {
            DriverError::Server(format!("{:?}: {}", status.code(), status.message()))
        }
        other => DriverError::Io(std::io::Error::other(other.to_string())),
    }
}

#[cfg(feature = "etcd")]
/// `work` within [`REQUEST_TIMEOUT`].
async fn bounded<T>(
    work: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, DriverError> {
    match tokio::time::timeout(REQUEST_TIMEOUT, work).await {
        Ok(result) => result.map_err(driver_error),
        Err(_) => Err(DriverError::Timeout),
    }
}

#[cfg(feature = "etcd")]
async fn client(addr: SocketAddr) -> Result<Client, DriverError> {
    bounded(Client::connect([format!("http://{addr}")], None)).await
}

#[cfg(feature = "etcd")]
async fn connect(addr: SocketAddr) -> Result<KvClient, DriverError> {
    Ok(client(addr).await?.kv_client())
}

/// The index in `members` of the member every member names as leader (each asked with
/// the maintenance API's `Status`): `None` until they agree.
#[cfg(feature = "etcd")]
pub async fn leader(members: &[SocketAddr]) -> Option<usize> {
    let mut ids = Vec::with_capacity(members.len());
    let mut leader_id = None;
    for addr in members {
        let status = bounded(client(*addr).await.ok()?.status()).await.ok()?;
        let leader = status.leader();
        if leader == 0 || leader_id.is_some_and(|l| l != leader) {
            return None;
        }
        leader_id = Some(leader);
        ids.push(status.header()?.member_id());
    }
    let leader_id = leader_id?;
    ids.iter().position(|id| *id == leader_id)
}

#[cfg(feature = "etcd")]
impl EtcdDriver {
    /// Connects client `client`; writes go to `nodes[leader]`.
    pub async fn connect(
        nodes: &[SocketAddr],
        leader: usize,
        client: usize,
        options: EtcdOptions,
    ) -> Result<EtcdDriver, DriverError> {
        assert!(leader < nodes.len());
        let writer = connect(nodes[leader]).await?;
        let read_at = if options.reads_everywhere { client % nodes.len() } else { leader };
        let reader = if read_at == leader { None } else { Some(connect(nodes[read_at]).await?) };
        Ok(EtcdDriver { writer, reader, options })
    }

    fn read_options(&self) -> GetOptions {
        if self.options.serializable {
            GetOptions::new().with_serializable()
        } else {
            GetOptions::new()
        }
    }
}

#[cfg(feature = "etcd")]
impl Driver for EtcdDriver {
    async fn read(&mut self, key: &[u8]) -> Result<bool, DriverError> {
        let options = self.read_options();
        let kv = self.reader.as_mut().unwrap_or(&mut self.writer);
        let response = bounded(kv.get(key, Some(options))).await?;
        Ok(!response.kvs().is_empty())
    }

    async fn write(&mut self, key: &[u8], value: &[u8]) -> Result<(), DriverError> {
        bounded(self.writer.put(key, value, None)).await?;
        Ok(())
    }

    async fn scan(&mut self, start: &[u8], count: u64) -> Result<u64, DriverError> {
        // Every key at or after `start`, at most `count` of them.
        let limit = i64::try_from(count).unwrap_or(i64::MAX);
        let options = self.read_options().with_from_key().with_limit(limit);
        let kv = self.reader.as_mut().unwrap_or(&mut self.writer);
        let response = bounded(kv.get(start, Some(options))).await?;
        Ok(response.kvs().len() as u64)
    }
}
