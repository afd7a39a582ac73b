//! A local cluster of `keel server` processes on loopback, for `keel up`, `keel demo`
//! and the black-box tests.
//!
//! Each node is a child process of the given binary, started as
//! `keel server --config <dir>/n<i>.toml --exit-with-stdin`, its log in `<dir>/n<i>.log`.
//! The parent holds each child's standard input open: when the parent exits, even by
//! SIGKILL, the pipes close and every node stops, so no node outlives its cluster.
//! Dropping a [`LocalCluster`] kills what is still running.

use crate::config::{local_addrs, ServerConfig};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Most attempts at finding a free block of ports.
pub const PORT_SEARCH_ATTEMPTS_MAX: u32 = 64;
/// How long a graceful stop may take before the node is killed.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause between two polls of a condition.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// A running local cluster.
#[derive(Debug)]
pub struct LocalCluster {
    exe: PathBuf,
    dir: PathBuf,
    /// Each node's configuration (node `i + 1` at index `i`).
    pub configs: Vec<ServerConfig>,
    children: Vec<Option<Child>>,
}

/// A base port whose whole block (clients, peers, HTTP for `nodes` nodes) is free now,
/// drawn from a pseudo-random start in 20000..50000.
pub fn free_base_port(nodes: u32) -> Option<u16> {
    let mut seed = crate::node::fresh_seed();
    for _ in 0..PORT_SEARCH_ATTEMPTS_MAX {
        seed = seed.rotate_left(13) ^ 0x9E37_79B9_7F4A_7C15;
        let base = 20_000 + (seed % 30_000) as u16;
        let free = (1..=nodes).all(|id| {
            let (a, b, c) = local_addrs(base, id);
            [a, b, c].iter().all(|addr| TcpListener::bind(addr).is_ok())
        });
        if free {
            return Some(base);
        }
    }
    None
}

impl LocalCluster {
    /// Writes a configuration per node under `dir` (tweaked by `tweak`) and starts
    /// every node. `base_port`: `None` finds a free block.
    pub fn start(
        exe: &Path,
        nodes: u32,
        dir: &Path,
        base_port: Option<u16>,
        tweak: impl Fn(&mut ServerConfig),
    ) -> std::io::Result<LocalCluster> {
        assert!(matches!(nodes, 3 | 5 | 7), "clusters have 3, 5 or 7 nodes");
        std::fs::create_dir_all(dir)?;
        let base = match base_port {
            Some(base) => base,
            None => free_base_port(nodes).ok_or_else(|| std::io::Error::other("no free ports"))?,
        };
        let configs: Vec<ServerConfig> = (1..=nodes)
            .map(|id| {
                let mut config = ServerConfig::local(nodes, id, base, dir);
                tweak(&mut config);
                config
            })
            .collect();
        let mut cluster = LocalCluster {
            exe: exe.to_path_buf(),
            dir: dir.to_path_buf(),
            configs,
            children: Vec::new(),
        };
        for i in 0..nodes as usize {
            let path = cluster.config_path(i);
            std::fs::write(&path, cluster.configs[i].to_toml())?;
            cluster.children.push(None);
            cluster.spawn(i)?;
        }
        Ok(cluster)
    }

    fn config_path(&self, i: usize) -> PathBuf {
        self.dir.join(format!("n{}.toml", i + 1))
    }

    /// The log file of node index `i`.
    pub fn log_path(&self, i: usize) -> PathBuf {
        self.dir.join(format!("n{}.log", i + 1))
    }

    fn spawn(&mut self, i: usize) -> std::io::Result<()> {
        assert!(self.children[i].is_none(), "node {} is already running", i + 1);
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.log_path(i))?;
        let child = Command::new(&self.exe)
            .arg("server")
            .arg("--config")
            .arg(self.config_path(i))
            .arg("--exit-with-stdin")
            .stdin(Stdio::piped())
            .stdout(log.try_clone()?)
            .stderr(log)
            .env("KEEL_LOG", std::env::var("KEEL_LOG").unwrap_or_else(|_| "info".into()))
            .spawn()?;
        self.children[i] = Some(child);
        Ok(())
    }

    /// The cluster's directory (configurations, logs, data).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every node's client address.
    pub fn client_addrs(&self) -> Vec<SocketAddr> {
        self.configs.iter().map(|c| c.client_addr).collect()
    }

    /// Whether node index `i` is running (as far as this cluster started it).
    pub fn is_running(&self, i: usize) -> bool {
        self.children[i].is_some()
    }

    /// Kills node index `i` with SIGKILL and reaps it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.children[i].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts node index `i` again (after [`LocalCluster::kill`]).
    pub fn restart(&mut self, i: usize) -> std::io::Result<()> {
        self.spawn(i)
    }

    /// Checks whether any node exited on its own; returns `(index, exit status)`.
    pub fn exited(&mut self) -> Option<(usize, std::process::ExitStatus)> {
        for (i, slot) in self.children.iter_mut().enumerate() {
            if let Some(child) = slot {
                if let Ok(Some(status)) = child.try_wait() {
                    *slot = None;
                    return Some((i, status));
                }
            }
        }
        None
    }

    /// Stops every node gracefully (closes its standard input), killing any that is
    /// still running after [`STOP_TIMEOUT`].
    pub fn stop(&mut self) {
        for child in self.children.iter_mut().flatten() {
            drop(child.stdin.take());
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        for slot in &mut self.children {
            let Some(mut child) = slot.take() else { continue };
            while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(POLL_INTERVAL);
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The `KEEL.STATUS` document of node index `i`, if it answers within a second.
    pub fn status(&self, i: usize) -> Option<serde_json::Value> {
        status_at(self.configs[i].client_addr)
    }

    /// The index of the node every running node agrees leads, once one holds a valid
    /// lease; waits at most `timeout`.
    pub fn wait_for_leader(&self, timeout: Duration) -> Option<usize> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(leader) = self.agreed_leader() {
                return Some(leader);
            }
            std::thread::sleep(POLL_INTERVAL);
        }
        None
    }

    fn agreed_leader(&self) -> Option<usize> {
        let mut leader = None;
        for i in (0..self.configs.len()).filter(|i| self.is_running(*i)) {
            let status = self.status(i)?;
            let says = status.get("leader")?.as_u64()? as usize;
            if leader.is_some_and(|l| l != says) {
                return None;
            }
            leader = Some(says);
        }
        let index = leader?.checked_sub(1)?;
        let status = self.status(index)?;
        let valid = status.get("leader_lease_valid")?.as_bool()?;
        (valid && status.get("role")?.as_str()? == "leader").then_some(index)
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for i in 0..self.children.len() {
            self.kill(i);
        }
    }
}

/// Asks `addr` for `KEEL.STATUS` over a plain blocking socket (one second at most).
pub fn status_at(addr: SocketAddr) -> Option<serde_json::Value> {
    let timeout = Duration::from_secs(1);
    let mut stream = TcpStream::connect_timeout(&addr, timeout).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    stream.write_all(b"*1\r\n$11\r\nKEEL.STATUS\r\n").ok()?;
    let mut reply = Vec::new();
    let mut chunk = [0u8; 4096];
    // `$<len>\r\n<json>\r\n`: read until the whole bulk string is in.
    loop {
        let n = stream.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        reply.extend_from_slice(&chunk[..n]);
        if reply.first() != Some(&b'$') {
            return None;
        }
        let header_end = reply.windows(2).position(|w| w == b"\r\n")?;
        let len: usize = std::str::from_utf8(&reply[1..header_end]).ok()?.parse().ok()?;
        if reply.len() >= header_end + 2 + len {
            return serde_json::from_slice(&reply[header_end + 2..header_end + 2 + len]).ok();
        }
        if reply.len() > 1 << 20 {
            return None;
        }
    }
}
