//! Three-node clusters of each system on loopback, started and stopped by the benchmark.
//!
//! Every cluster lives in a fresh temporary directory on free ports. Keel runs through
//! `keel_server::local::LocalCluster`. Peers run as children of a small `sh` guard that
//! holds the child's standard input: when the benchmark exits, even by SIGKILL, the pipe
//! closes, the guard's `cat` returns and it kills the server, so no process outlives a run.
//!
//! Configurations (also in docs/benchmarks.md):
//! - Redis 7: one primary and two replicas (`replicaof`), `appendonly yes`,
//!   `appendfsync always|everysec`, no RDB snapshots.
//! - etcd 3.4: three members, default snapshot and heartbeat settings, fsync on commit.

use crate::driver::resp::RespConn;
use crate::driver::{DriverError, REPLY_BYTES_MAX, REQUEST_TIMEOUT};
use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use keel_server::local::LocalCluster;
use keel_wire::Frame;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a cluster may take to become ready.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Pause between two readiness polls.
pub const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// How long a stopping peer's guard may take (its own grace period is five seconds).
pub const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// Nodes in every benchmark cluster.
pub const NODES: usize = 3;

/// Why a cluster did not start.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A process could not be started or a directory written; not retryable.
    #[error("cannot start {what}: {source}")]
    Spawn {
        /// What was being started.
        what: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The cluster did not become ready in time; retryable, see the logs in `dir`.
    #[error("{what} not ready after {READY_TIMEOUT:?}; logs in {dir}")]
    NotReady {
        /// Which system.
        what: String,
        /// Its directory.
        dir: String,
    },
}

/// A free loopback port now (the kernel picks it; it may be taken again before use).
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A fresh temporary directory for one cluster.
pub fn temp_dir(system: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    std::env::temp_dir().join(format!("keel-bench-{system}-{}-{nanos}", std::process::id()))
}

/// Peer server processes, each under its guard; stopped on drop.
#[derive(Debug)]
pub struct Guarded {
    children: Vec<Child>,
    dir: PathBuf,
    /// Keep `dir` (and its logs) after stopping: set when the cluster failed to start.
    keep_dir: bool,
}

impl Guarded {
    fn spawn(&mut self, program: &str, args: &[String], log: &Path) -> Result<(), ClusterError> {
        let what = format!("{program} ({})", log.display());
        let wrap = |source| ClusterError::Spawn { what: what.clone(), source };
        let log_file = std::fs::File::create(log).map_err(wrap)?;
        let err_file = log_file.try_clone().map_err(wrap)?;
        // `$0` is the program, `$@` its arguments. When stdin closes the guard sends
        // SIGTERM, waits up to five seconds, then SIGKILL: the server never outlives it.
        let script = "\"$0\" \"$@\" & pid=$!; cat >/dev/null; kill $pid 2>/dev/null; \
                      for i in $(seq 50); do kill -0 $pid 2>/dev/null || exit 0; sleep 0.1; done; \
                      kill -9 $pid 2>/dev/null; wait $pid";
        let child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(log_file)
            .stderr(err_file)
            .spawn()
            .map_err(wrap)?;
        self.children.push(child);
        Ok(())
    }

    /// The directory holding the processes' data and logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The resident memory, in KiB, of each server (the children of the guards).
    pub fn server_rss_kib(&self) -> Vec<u64> {
        let mut sizes = Vec::new();
        for child in &self.children {
            let guard = child.id();
            let path = format!("/proc/{guard}/task/{guard}/children");
            let children = std::fs::read_to_string(path).unwrap_or_default();
            sizes.extend(children.split_whitespace().filter_map(|p| rss_kib(p.parse().ok()?)));
        }
        sizes
    }

    /// Stops every process: closes each guard's stdin, waits, kills what remains.
    pub fn stop(&mut self) {
        for child in &mut self.children {
            drop(child.stdin.take());
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        for child in &mut self.children {
            while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        self.children.clear();
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        self.stop();
        if !self.keep_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A running three-node Redis deployment: `addrs[0]` the primary.
#[derive(Debug)]
pub struct RedisCluster {
    /// Client addresses, primary first.
    pub addrs: Vec<SocketAddr>,
    processes: Guarded,
}

impl RedisCluster {
    /// The cluster's directory.
    pub fn dir(&self) -> &Path {
        self.processes.dir()
    }

    /// Each server's resident memory, in KiB.
    pub fn server_rss_kib(&self) -> Vec<u64> {
        self.processes.server_rss_kib()
    }
}

/// Starts a Redis primary and two replicas; `fsync_always`: `appendfsync always`.
pub async fn start_redis(fsync_always: bool) -> Result<RedisCluster, ClusterError> {
    let dir = temp_dir("redis");
    let spawn_err = |source| ClusterError::Spawn { what: "redis dirs".into(), source };
    let mut processes = Guarded { children: Vec::new(), dir: dir.clone(), keep_dir: false };
    let mut addrs = Vec::new();
    for i in 0..NODES {
        let node_dir = dir.join(format!("n{}", i + 1));
        std::fs::create_dir_all(&node_dir).map_err(spawn_err)?;
        let port = free_port().map_err(spawn_err)?;
        let mut args: Vec<String> = [
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--dir",
            &node_dir.to_string_lossy(),
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            if fsync_always { "always" } else { "everysec" },
            "--protected-mode",
            "no",
            "--daemonize",
            "no",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if let Some(primary) = addrs.first() {
            let primary: &SocketAddr = primary;
            args.extend(["--replicaof".into(), "127.0.0.1".into(), primary.port().to_string()]);
        }
        processes.spawn("redis-server", &args, &dir.join(format!("n{}.log", i + 1)))?;
        addrs.push(loopback(port));
    }
    let ready = wait_until(|| redis_ready(addrs.clone())).await;
    if !ready {
        processes.keep_dir = true;
        return Err(ClusterError::NotReady {
            what: "redis".into(),
            dir: dir.display().to_string(),
        });
    }
    Ok(RedisCluster { addrs, processes })
}

async fn redis_ready(addrs: Vec<SocketAddr>) -> bool {
    let info = |addr| async move {
        let mut conn = RespConn::connect(addr).await?;
        match conn.call(&[b"INFO", b"replication"]).await? {
            Frame::Bulk(text) => Ok(String::from_utf8_lossy(&text).into_owned()),
            other => Err(DriverError::Protocol(format!("INFO replied {other:?}"))),
        }
    };
    let Ok(primary) = info(addrs[0]).await else { return false };
    if !primary.contains(&format!("connected_slaves:{}", NODES - 1)) {
        return false;
    }
    for addr in &addrs[1..] {
        match info(*addr).await {
            Ok(text) if text.contains("master_link_status:up") => {}
            _ => return false,
        }
    }
    true
}

async fn wait_until<F, Fut>(mut ready: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + READY_TIMEOUT;
    while Instant::now() < deadline {
        if ready().await {
            return true;
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    false
}

/// A running three-member etcd cluster.
#[derive(Debug)]
pub struct EtcdCluster {
    /// Client (gRPC) addresses.
    pub addrs: Vec<SocketAddr>,
    /// Index of the leader when the cluster became ready.
    pub leader: usize,
    processes: Guarded,
}

impl EtcdCluster {
    /// The cluster's directory.
    pub fn dir(&self) -> &Path {
        self.processes.dir()
    }

    /// Each server's resident memory, in KiB.
    pub fn server_rss_kib(&self) -> Vec<u64> {
        self.processes.server_rss_kib()
    }
}

/// Starts three etcd members and waits until they agree on a leader (asked over gRPC,
/// so a build without the `etcd` feature never sees them agree: `systems::start` refuses
/// etcd in such a build before coming here).
pub async fn start_etcd() -> Result<EtcdCluster, ClusterError> {
    let dir = temp_dir("etcd");
    let spawn_err = |source| ClusterError::Spawn { what: "etcd dirs".into(), source };
    std::fs::create_dir_all(&dir).map_err(spawn_err)?;
    let mut processes = Guarded { children: Vec::new(), dir: dir.clone(), keep_dir: false };
    let ports: Vec<(u16, u16)> = (0..NODES)
        .map(|_| Ok((free_port()?, free_port()?)))
        .collect::<std::io::Result<_>>()
        .map_err(spawn_err)?;
    let initial: Vec<String> = ports
        .iter()
        .enumerate()
        .map(|(i, (_, p))| format!("n{}=http://127.0.0.1:{p}", i + 1))
        .collect();
    for (i, (client, peer)) in ports.iter().enumerate() {
        let name = format!("n{}", i + 1);
        let args: Vec<String> = vec![
            "--name".into(),
            name.clone(),
            "--data-dir".into(),
            dir.join(&name).to_string_lossy().into_owned(),
            "--listen-client-urls".into(),
            format!("http://127.0.0.1:{client}"),
            "--advertise-client-urls".into(),
            format!("http://127.0.0.1:{client}"),
            "--listen-peer-urls".into(),
            format!("http://127.0.0.1:{peer}"),
            "--initial-advertise-peer-urls".into(),
            format!("http://127.0.0.1:{peer}"),
            "--initial-cluster".into(),
            initial.join(","),
            "--initial-cluster-state".into(),
            "new".into(),
            "--initial-cluster-token".into(),
            "keel-bench".into(),
        ];
        processes.spawn("etcd", &args, &dir.join(format!("{name}.log")))?;
    }
    let addrs: Vec<SocketAddr> = ports.iter().map(|(c, _)| loopback(*c)).collect();
    let deadline = Instant::now() + READY_TIMEOUT;
    while Instant::now() < deadline {
        if let Some(leader) = crate::driver::etcd::leader(&addrs).await {
            return Ok(EtcdCluster { addrs, leader, processes });
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    processes.keep_dir = true;
    Err(ClusterError::NotReady { what: "etcd".into(), dir: dir.display().to_string() })
}

/// A running Keel cluster and its leaders.
#[derive(Debug)]
pub struct KeelCluster {
    /// The nodes' client addresses.
    pub addrs: Vec<SocketAddr>,
    /// The nodes' HTTP addresses (for `/metrics`).
    pub http_addrs: Vec<SocketAddr>,
    /// Each keyspace and the index of its leader.
    pub leaders: Vec<(u32, usize)>,
    cluster: LocalCluster,
}

impl KeelCluster {
    /// The cluster's directory.
    pub fn dir(&self) -> &Path {
        self.cluster.dir()
    }
}

impl Drop for KeelCluster {
    fn drop(&mut self) {
        self.cluster.stop();
        let _ = std::fs::remove_dir_all(self.cluster.dir());
    }
}

/// Writes `settings` into one node's configuration.
fn apply(settings: &crate::systems::KeelSettings, config: &mut keel_server::config::ServerConfig) {
    config.storage.emulated_fsync_delay_us = settings.emulated_fsync_us;
    config.engine.flush_interval_ms =
        settings.flush_interval_ms.or(config.engine.flush_interval_ms);
    if settings.keyspaces > 1 {
        config.keyspaces =
            (0..settings.keyspaces).map(keel_server::config::KeyspaceSettings::orca).collect();
    }
}

/// Starts a three-node Keel cluster from the binary `exe` with `settings` and waits for
/// its leader.
pub fn start_keel(
    exe: &Path,
    settings: &crate::systems::KeelSettings,
) -> Result<KeelCluster, ClusterError> {
    let dir = temp_dir("keel");
    let tweak = |config: &mut keel_server::config::ServerConfig| apply(settings, config);
    let cluster = LocalCluster::start(exe, NODES as u32, &dir, None, tweak)
        .map_err(|source| ClusterError::Spawn { what: "keel".into(), source })?;
    let mut leaders = Vec::new();
    for keyspace in cluster.keyspace_ids() {
        let Some(leader) = cluster.wait_for_leader_in(keyspace, READY_TIMEOUT) else {
            let dir = dir.display().to_string();
            return Err(ClusterError::NotReady { what: "keel".into(), dir });
        };
        leaders.push((keyspace, leader));
    }
    let addrs = cluster.client_addrs();
    let http_addrs = cluster.configs.iter().filter_map(|c| c.http_addr).collect();
    Ok(KeelCluster { addrs, http_addrs, leaders, cluster })
}

/// Most `/proc` entries scanned when looking for a cluster's processes.
pub const PROC_ENTRIES_MAX: usize = 1 << 20;

/// The resident memory, in KiB, of each server process whose command line names `dir`
/// (every cluster's processes carry their temporary directory in their arguments; the
/// `sh` guards are left out). Linux only; empty elsewhere.
pub fn rss_kib_under(dir: &Path) -> Vec<u64> {
    let needle = dir.to_string_lossy().into_owned();
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut sizes = Vec::new();
    for entry in entries.take(PROC_ENTRIES_MAX).flatten() {
        let path = entry.path();
        let Ok(cmdline) = std::fs::read(path.join("cmdline")) else { continue };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if !cmdline.contains(&needle) || cmdline.starts_with("sh ") {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(path.join("status")) else { continue };
        let rss = status.lines().find_map(|line| {
            line.strip_prefix("VmRSS:")?.trim().trim_end_matches("kB").trim().parse::<u64>().ok()
        });
        sizes.extend(rss);
    }
    sizes
}

/// The resident memory, in KiB, of process `pid` (Linux `/proc`).
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|line| {
        line.strip_prefix("VmRSS:")?.trim().trim_end_matches("kB").trim().parse::<u64>().ok()
    })
}

/// The sum over `addrs` of the counter `name` in each node's `/metrics`.
pub async fn metric_sum(addrs: &[SocketAddr], name: &str) -> Option<u64> {
    let mut sum = 0;
    for addr in addrs {
        let page = http_get(*addr, "/metrics").await.ok()?;
        sum += crate::report::prometheus_sum(&String::from_utf8_lossy(&page), name)?;
    }
    Some(sum)
}

/// The body of `GET path` at `addr` (hyper's HTTP/1 client, one connection a request),
/// within [`REQUEST_TIMEOUT`] and [`REPLY_BYTES_MAX`]; a status other than 200 is an error.
pub async fn http_get(addr: SocketAddr, path: &str) -> Result<Bytes, DriverError> {
    let exchange = async {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(protocol)?;
        // The connection does the socket I/O; it ends when `sender` is dropped.
        tokio::spawn(connection);
        let request = hyper::Request::get(path)
            .header(hyper::header::HOST, addr.to_string())
            .body(Empty::<Bytes>::new())
            .map_err(protocol)?;
        let response = sender.send_request(request).await.map_err(protocol)?;
        if response.status() != hyper::StatusCode::OK {
            return Err(DriverError::Server(format!("GET {path}: {}", response.status())));
        }
        let body = Limited::new(response.into_body(), REPLY_BYTES_MAX);
        Ok(body.collect().await.map_err(protocol)?.to_bytes())
    };
    tokio::time::timeout(REQUEST_TIMEOUT, exchange).await.map_err(|_| DriverError::Timeout)?
}

fn protocol(error: impl std::fmt::Display) -> DriverError {
    DriverError::Protocol(error.to_string())
}

/// Where the Debian package puts ZooKeeper's jar (its manifest names its dependencies).
pub const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";

/// A running three-server ZooKeeper ensemble.
#[derive(Debug)]
pub struct ZkCluster {
    /// Client addresses.
    pub addrs: Vec<SocketAddr>,
    /// Index of the leader when the ensemble became ready.
    pub leader: usize,
    processes: Guarded,
}

impl ZkCluster {
    /// The cluster's directory.
    pub fn dir(&self) -> &Path {
        self.processes.dir()
    }

    /// Each server's resident memory, in KiB.
    pub fn server_rss_kib(&self) -> Vec<u64> {
        self.processes.server_rss_kib()
    }
}

/// Starts three ZooKeeper servers; `force_sync`: fsync the transaction log before acking.
pub async fn start_zookeeper(force_sync: bool) -> Result<ZkCluster, ClusterError> {
    let dir = temp_dir("zookeeper");
    let spawn_err = |source| ClusterError::Spawn { what: "zookeeper dirs".into(), source };
    let mut processes = Guarded { children: Vec::new(), dir: dir.clone(), keep_dir: false };
    let ports: Vec<(u16, u16, u16)> = (0..NODES)
        .map(|_| Ok((free_port()?, free_port()?, free_port()?)))
        .collect::<std::io::Result<_>>()
        .map_err(spawn_err)?;
    let servers: String = ports
        .iter()
        .enumerate()
        .map(|(i, (_, quorum, election))| {
            format!("server.{}=127.0.0.1:{quorum}:{election}\n", i + 1)
        })
        .collect();
    for (i, (client, _, _)) in ports.iter().enumerate() {
        let node_dir = dir.join(format!("n{}", i + 1));
        std::fs::create_dir_all(&node_dir).map_err(spawn_err)?;
        std::fs::write(node_dir.join("myid"), format!("{}\n", i + 1)).map_err(spawn_err)?;
        let config = format!(
            "tickTime=2000\ninitLimit=10\nsyncLimit=5\ndataDir={}\nclientPort={client}\n\
             clientPortAddress=127.0.0.1\nadmin.enableServer=false\n\
             4lw.commands.whitelist=srvr\nmaxClientCnxns=0\n{servers}",
            node_dir.display()
        );
        let config_path = dir.join(format!("n{}.cfg", i + 1));
        std::fs::write(&config_path, config).map_err(spawn_err)?;
        let args: Vec<String> = vec![
            "-Xmx1g".into(),
            format!("-Dzookeeper.forceSync={}", if force_sync { "yes" } else { "no" }),
            "-cp".into(),
            ZOOKEEPER_JAR.into(),
            "org.apache.zookeeper.server.quorum.QuorumPeerMain".into(),
            config_path.to_string_lossy().into_owned(),
        ];
        processes.spawn("java", &args, &dir.join(format!("n{}.log", i + 1)))?;
    }
    let addrs: Vec<SocketAddr> = ports.iter().map(|(c, _, _)| loopback(*c)).collect();
    let deadline = Instant::now() + READY_TIMEOUT;
    while Instant::now() < deadline {
        if let Some(leader) = zk_leader(&addrs).await {
            return Ok(ZkCluster { addrs, leader, processes });
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    processes.keep_dir = true;
    Err(ClusterError::NotReady { what: "zookeeper".into(), dir: dir.display().to_string() })
}

/// The index of the leader once every server reports a mode.
async fn zk_leader(addrs: &[SocketAddr]) -> Option<usize> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut leader = None;
    for (i, addr) in addrs.iter().enumerate() {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        stream.write_all(b"srvr").await.ok()?;
        let mut text = String::new();
        let read = stream.read_to_string(&mut text);
        tokio::time::timeout(Duration::from_secs(1), read).await.ok()?.ok()?;
        if text.contains("Mode: leader") {
            leader = Some(i);
        } else if !text.contains("Mode: follower") {
            return None;
        }
    }
    leader
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A server on loopback that answers one connection with `reply` (whatever is asked).
    async fn answering(reply: &'static [u8]) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 1024];
            let _ = stream.read(&mut request).await;
            stream.write_all(reply).await.unwrap();
            let _ = stream.shutdown().await;
        });
        addr
    }

    #[test]
    fn settings_reach_every_node_configuration_and_its_engine() {
        let mut config =
            keel_server::config::ServerConfig::local(3, 1, 7379, Path::new("/tmp/keel"));
        let defaults = config.engine_config().unwrap().flush_interval;
        let keyspaces = config.keyspaces.clone();
        apply(&crate::systems::KeelSettings::default(), &mut config);
        assert_eq!(config.engine_config().unwrap().flush_interval, defaults, "unset: default");
        assert_eq!(config.keyspaces, keyspaces, "one keyspace: as configured");
        let settings = crate::systems::KeelSettings {
            emulated_fsync_us: 1500,
            flush_interval_ms: Some(20),
            keyspaces: 3,
        };
        apply(&settings, &mut config);
        let period_ns = config.engine_config().unwrap().flush_interval.0;
        assert_eq!(period_ns, 20_000_000, "20 ms");
        assert_eq!(config.storage.emulated_fsync_delay_us, 1500);
        assert_eq!(config.keyspaces.len(), 3);
    }

    #[tokio::test]
    async fn scrapes_read_chunked_pages_and_sum_a_counter() {
        let page = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
            25\r\nkeel_forwarded_total{keyspace=\"0\"} 4\n\r\n\
            25\r\nkeel_forwarded_total{keyspace=\"1\"} 5\n\r\n0\r\n\r\n";
        let addr = answering(page).await;
        let body = http_get(addr, "/metrics").await.expect("a page");
        assert_eq!(body.len(), 74, "{body:?}");
        let addr = answering(page).await;
        assert_eq!(metric_sum(&[addr], "keel_forwarded_total").await, Some(9));
    }

    #[tokio::test]
    async fn a_scrape_answered_with_another_status_fails() {
        let addr = answering(b"HTTP/1.1 404 Not Found\r\nContent-Length: 3\r\n\r\nno\n").await;
        let error = http_get(addr, "/metrics").await.expect_err("404 is no page");
        assert!(matches!(error, DriverError::Server(ref m) if m.contains("404")), "{error}");
        let addr = answering(b"garbage\r\n\r\n").await;
        assert!(matches!(http_get(addr, "/metrics").await, Err(DriverError::Protocol(_))));
    }
}
