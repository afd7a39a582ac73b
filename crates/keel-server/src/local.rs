//! A local cluster of `keel server` processes on loopback, for `keel up`, `keel demo`
//! and the black-box tests.
//!
//! Each node is a child process of the given binary, started as
//! `keel server --config <dir>/n<i>.toml --exit-with-stdin`, its log in `<dir>/n<i>.log`.
//! The parent holds each child's standard input open: when the parent exits, even by
//! SIGKILL, the pipes close and every node stops, so no node outlives its cluster.
//! Dropping a [`LocalCluster`] kills what is still running.

use crate::config::{local_addrs, machine_cores, ServerConfig, WORKER_THREADS_MIN};
use keel_types::NodeId;
use keel_wire::Frame;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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
    /// The user and password the cluster's own status queries authenticate with, when
    /// its configuration has `[[users]]`.
    pub credentials: Option<(String, String)>,
    /// The block of ports drawn for this cluster, held while it lives (`None` when the
    /// caller chose the base port).
    _ports: Option<PortBlock>,
}

/// Ports between two block bases: a block holds clients (`base + 1..`), peers
/// (`base + 101..`), HTTP (`base + 201..`) and TLS (`base + 301..`) for up to 99 nodes.
pub const PORT_BLOCK_SPAN: u16 = 400;
/// The first block's base. Blocks lie in 10000..32000, below Linux's ephemeral range
/// (32768 and up by default), so that no outgoing connection of this machine can be given
/// one of a block's ports as its source between the check and the nodes' bind.
pub const PORT_BLOCK_FIRST: u16 = 10_000;
/// How many blocks there are.
pub const PORT_BLOCKS: u16 = 55;

/// A block of ports reserved for one local cluster: free when it was drawn, and held
/// against every other process of this machine that draws blocks the same way, through
/// an advisory lock on a file named after the block in the temporary directory, until
/// the reservation is dropped (or its process exits).
///
/// Blocks are aligned, so two clusters either draw the same block, which the lock
/// refuses, or share no port: checking that ports are free is not enough on its own,
/// since two clusters started at once both find the same ports free before either binds
/// them (a test cluster once lost its peer ports to another test's cluster that way).
#[derive(Debug)]
pub struct PortBlock {
    base: u16,
    _lock: std::fs::File,
}

impl PortBlock {
    /// The block's base port (see [`local_addrs`]).
    pub fn base(&self) -> u16 {
        self.base
    }
}

/// Reserves a block of ports whose every port (clients, peers, HTTP and TLS for `nodes`
/// nodes) is free now, trying each block once from a pseudo-random start.
pub fn reserve_port_block(nodes: u32) -> Option<PortBlock> {
    let locks = std::env::temp_dir().join("keel-port-blocks");
    std::fs::create_dir_all(&locks).ok()?;
    let start = (crate::node::fresh_seed() % u64::from(PORT_BLOCKS)) as u16;
    (0..PORT_BLOCKS).find_map(|i| {
        let base = PORT_BLOCK_FIRST + ((start + i) % PORT_BLOCKS) * PORT_BLOCK_SPAN;
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(locks.join(format!("{base}.lock")))
            .ok()?;
        lock.try_lock().ok()?;
        let free = (1..=nodes).all(|id| {
            let (a, b, c) = local_addrs(base, id);
            // The TLS port tests and `keel up --secure` put 300 above the client port.
            let tls = std::net::SocketAddr::new(a.ip(), a.port() + 300);
            [a, b, c, tls].iter().all(|addr| TcpListener::bind(addr).is_ok())
        });
        free.then_some(PortBlock { base, _lock: lock })
    })
}

/// The cluster secret of a local cluster in `dir`: `dir/cluster.secret`, created (64
/// random hex digits, readable by its owner only) unless a restart finds it there.
pub fn ensure_cluster_secret(dir: &Path) -> std::io::Result<PathBuf> {
    use std::io::Write;
    let path = dir.join("cluster.secret");
    if path.exists() {
        return Ok(path);
    }
    let hex: String = crate::handshake::nonce().iter().map(|byte| format!("{byte:02x}")).collect();
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(&path)?;
    file.write_all(hex.as_bytes())?;
    file.write_all(b"\n")?;
    file.sync_all()?;
    Ok(path)
}

/// Options that create a file only its owner may read (an existing file keeps its mode).
fn private_options() -> std::fs::OpenOptions {
    let mut options = std::fs::OpenOptions::new();
    options.create(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options
}

/// Writes `bytes` to `path`, created only its owner may read, or made so if it exists.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut file = private_options().write(true).truncate(true).open(path)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    file.write_all(bytes)
}

/// Runtime threads for each of `nodes` nodes sharing this machine: its cores divided
/// among them, at least one each (three nodes on two cores: one each). A node alone on a
/// machine takes a thread per core; here that would run several times as many threads as
/// cores, which wake each other across cores for every message (`docs/performance.md`,
/// "One runtime thread per node's share of the cores" and "One thread per node again").
pub fn worker_threads_each(nodes: u32) -> u32 {
    (machine_cores() / nodes.max(1)).max(WORKER_THREADS_MIN)
}

/// `keyspaces` ORCA keyspaces (ids 0 up) for a cluster of `nodes`, each placed on a
/// replica group of `replicas` consecutive members (keyspace `k` from member
/// `k × replicas mod nodes + 1` on, wrapping), so that groups take turns over the
/// members; with `sharded`, the hash slots split evenly among them in id order. With
/// `replicas == nodes`, every keyspace is on every member (no `replicas` written).
pub fn placed_keyspaces(
    nodes: u32,
    keyspaces: u32,
    replicas: u32,
    sharded: bool,
) -> Vec<crate::config::KeyspaceSettings> {
    assert!(replicas <= nodes && keyspaces > 0, "{keyspaces} groups of {replicas} on {nodes}");
    (0..keyspaces)
        .map(|k| {
            let group = (0..replicas).map(|r| (k * replicas + r) % nodes + 1).collect();
            crate::config::KeyspaceSettings {
                replicas: (replicas < nodes).then_some(group),
                slots: sharded
                    .then(|| keel_wire::slots::SlotRanges::share(k, keyspaces).to_string()),
                ..crate::config::KeyspaceSettings::orca(k)
            }
        })
        .collect()
}

/// One-way peer delay inside an emulated site (data center), in ms: the geo suites'.
pub const WAN_ONE_WAY_MS_LOCAL: u64 = 1;
/// One-way peer delay across emulated sites, in ms (a ~35 ms round trip).
pub const WAN_ONE_WAY_MS: u64 = 17;

/// A geo deployment of `dcs` data centers of `per_dc` nodes each on one machine: node
/// `id` (1-based) is in data center `dc<(id - 1) / per_dc + 1>`, every keyspace is
/// replaced by one geo keyspace 0, and peer messages are delayed as across a wide-area
/// network ([`WAN_ONE_WAY_MS_LOCAL`] inside a data center, [`WAN_ONE_WAY_MS`] across).
/// For `keel up --geo`, its example and its tests.
pub fn geo_layout(config: &mut ServerConfig, dcs: u32, per_dc: u32) {
    assert_eq!(config.members.len() as u32, dcs * per_dc, "every node in a data center");
    let dc_of = |id: u32| (id - 1) / per_dc;
    for member in &mut config.members {
        member.dc = Some(format!("dc{}", dc_of(member.id) + 1));
    }
    let me = dc_of(config.node_id);
    config.geo.peer_delay_ms = config
        .members
        .iter()
        .filter(|m| m.id != config.node_id)
        .map(|m| {
            let delay = if dc_of(m.id) == me { WAN_ONE_WAY_MS_LOCAL } else { WAN_ONE_WAY_MS };
            (m.id.to_string(), delay)
        })
        .collect();
    config.keyspaces = vec![crate::config::KeyspaceSettings::geo(0)];
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
        let most = crate::config::CLUSTER_MEMBERS_MAX as u32;
        assert!((1..=most).contains(&nodes), "a local cluster has at most {most} nodes");
        // Configurations (password hashes), logs (keys and values) and data: the
        // cluster's owner's only.
        keel_storage::disk::create_private_dir(dir)?;
        let mut ports = None;
        let base = match base_port {
            Some(base) => {
                // A port already taken (another cluster on the same ports) would let the
                // wait for a leader reach that cluster: refuse before starting anything.
                for id in 1..=nodes {
                    let (a, b, c) = local_addrs(base, id);
                    for addr in [a, b, c] {
                        if let Err(e) = TcpListener::bind(addr) {
                            return Err(std::io::Error::new(
                                e.kind(),
                                format!("{addr} is not free ({e}): is another cluster on these ports? (--base-port)"),
                            ));
                        }
                    }
                }
                base
            }
            None => {
                let block = reserve_port_block(nodes)
                    .ok_or_else(|| std::io::Error::other("no free block of ports"))?;
                let base = block.base();
                ports = Some(block);
                base
            }
        };
        let secret = ensure_cluster_secret(dir)?;
        let workers = worker_threads_each(nodes);
        let configs: Vec<ServerConfig> = (1..=nodes)
            .map(|id| {
                let mut config = ServerConfig::local(nodes, id, base, dir);
                config.cluster_secret_file = Some(secret.clone());
                config.worker_threads = Some(workers);
                tweak(&mut config);
                config
            })
            .collect();
        let mut cluster = LocalCluster {
            exe: exe.to_path_buf(),
            dir: dir.to_path_buf(),
            configs,
            children: Vec::new(),
            credentials: None,
            _ports: ports,
        };
        for i in 0..nodes as usize {
            let path = cluster.config_path(i);
            write_private(&path, cluster.configs[i].to_toml().as_bytes())?;
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
        let log = private_options().append(true).open(self.log_path(i))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            log.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        }
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

    /// The process id of node index `i`, if running.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.children[i].as_ref().map(|child| child.id())
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

    /// The `keel` executable the next [`LocalCluster::restart`] starts (a rolling
    /// upgrade's next version).
    pub fn set_exe(&mut self, exe: &Path) {
        self.exe = exe.to_path_buf();
    }

    /// Starts node index `i` again (after [`LocalCluster::kill`]).
    pub fn restart(&mut self, i: usize) -> std::io::Result<()> {
        self.spawn(i)
    }

    /// Writes node index `i`'s configuration (changed in [`LocalCluster::configs`]) to its
    /// file, for its next start.
    pub fn rewrite_config(&self, i: usize) -> std::io::Result<()> {
        write_private(&self.config_path(i), self.configs[i].to_toml().as_bytes())
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

    /// The `KEEL.STATUS` document of node index `i` in keyspace 0, if it answers within a
    /// second.
    pub fn status(&self, i: usize) -> Option<serde_json::Value> {
        status_in_as(self.configs[i].client_addr, 0, self.credentials.as_ref())
    }

    /// The ids of the keyspaces every node hosts.
    pub fn keyspace_ids(&self) -> Vec<u32> {
        match self.configs[0].keyspaces.as_slice() {
            [] => vec![0],
            keyspaces => keyspaces.iter().map(|k| k.id).collect(),
        }
    }

    /// The index of the node every running node agrees leads keyspace 0, once one holds
    /// a valid lease; waits at most `timeout`.
    pub fn wait_for_leader(&self, timeout: Duration) -> Option<usize> {
        self.wait_for_leader_in(0, timeout)
    }

    /// Whether keyspace `keyspace` runs a leaderless engine kind, Kite or geo (as the
    /// first node is configured).
    pub fn is_leaderless(&self, keyspace: u32) -> bool {
        let leaderless =
            |k: &crate::config::KeyspaceSettings| !crate::engines::pack(k.engine).leader;
        self.configs[0].keyspaces.iter().any(|k| k.id == keyspace && leaderless(k))
    }

    /// The engine kind of keyspace `keyspace` (as the first node is configured).
    pub fn engine_of(&self, keyspace: u32) -> keel_core::engine::EngineKind {
        let listed = self.configs[0].keyspaces.iter().find(|k| k.id == keyspace);
        listed.map_or(keel_core::engine::EngineKind::Orca, |k| k.engine)
    }

    /// Waits until every running node serves leaderless keyspace `keyspace` (Kite: none
    /// is still rejoining); whether they all did within `timeout`.
    pub fn wait_for_replicas(&self, keyspace: u32, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let creds = self.credentials.as_ref();
        while Instant::now() < deadline {
            let ready =
                self.hosting(keyspace).into_iter().filter(|i| self.is_running(*i)).all(|i| {
                    status_in_as(self.configs[i].client_addr, keyspace, creds)
                        .is_some_and(|s| s.get("role").and_then(|r| r.as_str()) == Some("replica"))
                });
            if ready {
                return true;
            }
            std::thread::sleep(POLL_INTERVAL);
        }
        false
    }

    /// As [`LocalCluster::wait_for_leader`], for keyspace `keyspace`.
    pub fn wait_for_leader_in(&self, keyspace: u32, timeout: Duration) -> Option<usize> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(leader) = self.agreed_leader(keyspace) {
                return Some(leader);
            }
            std::thread::sleep(POLL_INTERVAL);
        }
        None
    }

    /// The nodes (indices) that host keyspace `keyspace`: its replicas, as the first
    /// node is configured.
    pub fn hosting(&self, keyspace: u32) -> Vec<usize> {
        let config = &self.configs[0];
        let settings = config.keyspace_settings();
        let Some(ks) = settings.iter().find(|k| k.id == keyspace) else { return Vec::new() };
        let replicas = config.replicas_of(ks);
        (0..self.configs.len()).filter(|i| replicas.contains(&NodeId(*i as u32 + 1))).collect()
    }

    fn agreed_leader(&self, keyspace: u32) -> Option<usize> {
        let creds = self.credentials.as_ref();
        let mut statuses = vec![None; self.configs.len()];
        for i in self.hosting(keyspace).into_iter().filter(|i| self.is_running(*i)) {
            // Every running node must answer.
            statuses[i] = Some(status_in_as(self.configs[i].client_addr, keyspace, creds)?);
        }
        agreed_leader(&statuses)
    }
}

/// The node (an index into `statuses`, one `KEEL.STATUS` per node, `None` for a node
/// that did not answer or is not asked) that every answering member names as leader, if
/// it says it leads and holds a valid lease. A node outside the membership it reports (one
/// not added yet, or removed) hears from no leader, and is not asked.
pub fn agreed_leader(statuses: &[Option<serde_json::Value>]) -> Option<usize> {
    let member = |status: &serde_json::Value| {
        let Some(id) = status.get("node_id").and_then(|v| v.as_u64()) else { return true };
        let listed = |field: &str| {
            status
                .get(field)
                .and_then(|v| v.as_array())
                .map(|ids| ids.iter().any(|v| v.as_u64() == Some(id)))
        };
        match (listed("voters"), listed("learners")) {
            (Some(voter), Some(learner)) => voter || learner,
            _ => true, // an engine that names no membership
        }
    };
    let mut leader = None;
    for status in statuses.iter().flatten().filter(|s| member(s)) {
        let says = status.get("leader")?.as_u64()? as usize;
        if leader.is_some_and(|l| l != says) {
            return None;
        }
        leader = Some(says);
    }
    let index = leader?.checked_sub(1)?;
    let status = statuses.get(index)?.as_ref()?;
    let valid = status.get("leader_lease_valid")?.as_bool()?;
    (valid && status.get("role")?.as_str()? == "leader").then_some(index)
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for i in 0..self.children.len() {
            self.kill(i);
        }
    }
}

/// How long each blocking status query may take.
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(1);

/// A blocking RESP connection for status queries (`keel status`, `keel up`, tests).
struct StatusConn {
    stream: TcpStream,
    decoder: keel_wire::Decoder,
    buf: Vec<u8>,
}

impl StatusConn {
    fn open(addr: SocketAddr) -> Option<StatusConn> {
        let stream = TcpStream::connect_timeout(&addr, STATUS_TIMEOUT).ok()?;
        stream.set_read_timeout(Some(STATUS_TIMEOUT)).ok()?;
        stream.set_write_timeout(Some(STATUS_TIMEOUT)).ok()?;
        let limits = keel_wire::RespLimits { frame_bytes_max: 1 << 20, ..Default::default() };
        let decoder = keel_wire::Decoder::new(keel_wire::DecodeMode::Reply, limits);
        Some(StatusConn { stream, decoder, buf: Vec::new() })
    }

    /// Sends one command and reads its reply (an error reply is `None`).
    fn call(&mut self, words: &[&str]) -> Option<Frame> {
        let frame = Frame::Array(words.iter().map(|w| Frame::bulk(w.as_bytes())).collect());
        let mut bytes = Vec::new();
        keel_wire::resp::encode(&frame, keel_wire::Protocol::Resp2, &mut bytes);
        self.stream.write_all(&bytes).ok()?;
        let mut chunk = [0u8; 4096];
        loop {
            if let Some((reply, used)) = self.decoder.decode(&self.buf).ok()? {
                self.buf.drain(..used);
                return (!matches!(reply, Frame::Error(_))).then_some(reply);
            }
            let n = self.stream.read(&mut chunk).ok()?;
            if n == 0 {
                return None;
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// `KEEL.STATUS` in the connection's keyspace, parsed.
    fn status(&mut self) -> Option<serde_json::Value> {
        match self.call(&["KEEL.STATUS"])? {
            Frame::Bulk(json) => serde_json::from_slice(&json).ok(),
            _ => None,
        }
    }
}

/// One keyspace as `KEEL.KEYSPACES` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyspaceEntry {
    /// Its id.
    pub id: u32,
    /// Its name.
    pub name: String,
    /// Its engine kind.
    pub engine: String,
}

/// Asks `addr` for `KEEL.STATUS` of keyspace 0 over a plain blocking socket (one second
/// at most per call).
pub fn status_at(addr: SocketAddr) -> Option<serde_json::Value> {
    StatusConn::open(addr)?.status()
}

/// The keyspaces `addr` hosts (`KEEL.KEYSPACES`).
pub fn keyspaces_at(addr: SocketAddr) -> Option<Vec<KeyspaceEntry>> {
    keyspace_entries(&StatusConn::open(addr)?.call(&["KEEL.KEYSPACES"])?)
}

/// The keyspaces a `KEEL.KEYSPACES` reply lists (`None`: not such a reply).
pub fn keyspace_entries(reply: &Frame) -> Option<Vec<KeyspaceEntry>> {
    let Frame::Array(rows) = reply else {
        return None;
    };
    let text = |f: &Frame| match f {
        Frame::Bulk(b) => Some(String::from_utf8_lossy(b).into_owned()),
        _ => None,
    };
    rows.iter()
        .map(|row| match row {
            Frame::Array(cells) => match cells.as_slice() {
                [Frame::Integer(id), name, engine] => Some(KeyspaceEntry {
                    id: u32::try_from(*id).ok()?,
                    name: text(name)?,
                    engine: text(engine)?,
                }),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// `KEEL.STATUS` of keyspace `keyspace` at `addr` (`SELECT` first).
pub fn status_in(addr: SocketAddr, keyspace: u32) -> Option<serde_json::Value> {
    status_in_as(addr, keyspace, None)
}

/// As [`status_in`], authenticating first as `credentials` (user, password) if given.
pub fn status_in_as(
    addr: SocketAddr,
    keyspace: u32,
    credentials: Option<&(String, String)>,
) -> Option<serde_json::Value> {
    let mut conn = StatusConn::open(addr)?;
    if let Some((user, password)) = credentials {
        conn.call(&["AUTH", user, password])?;
    }
    conn.call(&["SELECT", &keyspace.to_string()])?;
    conn.status()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reserved_block_is_not_drawn_again_while_it_is_held() {
        let blocks: Vec<PortBlock> =
            (0..4).map(|_| reserve_port_block(7).expect("a free block")).collect();
        let mut bases: Vec<u16> = blocks.iter().map(PortBlock::base).collect();
        assert!(
            bases.iter().all(|b| (b - PORT_BLOCK_FIRST).is_multiple_of(PORT_BLOCK_SPAN)),
            "{bases:?}"
        );
        bases.sort_unstable();
        bases.dedup();
        assert_eq!(bases.len(), 4, "four held reservations, four blocks");
        let first = blocks[0].base();
        let lock_path = std::env::temp_dir().join("keel-port-blocks").join(format!("{first}.lock"));
        let lock = std::fs::OpenOptions::new()
            .write(true)
            .open(&lock_path)
            .expect("the block's lock file");
        assert!(lock.try_lock().is_err(), "a held block is locked against other draws");
        drop(blocks);
        assert!(lock.try_lock().is_ok(), "a dropped reservation frees its block");
    }

    #[test]
    fn nodes_sharing_a_machine_divide_its_cores_each_keeping_one() {
        let cores = machine_cores();
        for nodes in [3, 5, 7] {
            let each = worker_threads_each(nodes);
            assert!(each >= WORKER_THREADS_MIN, "{nodes} nodes");
            assert!(
                each * nodes <= cores.max(WORKER_THREADS_MIN * nodes),
                "{nodes} nodes, {each} each, {cores} cores"
            );
            assert!((each + 1) * nodes > cores, "no core left over");
        }
    }

    #[test]
    fn a_cluster_on_taken_ports_is_refused_before_anything_starts() {
        let block = reserve_port_block(3).expect("a free block");
        let base = block.base();
        let (client, _, _) = local_addrs(base, 2);
        let _taken = TcpListener::bind(client).expect("the port is free");
        let dir = std::env::temp_dir().join(format!("keel-local-taken-{}", std::process::id()));
        let err = LocalCluster::start(Path::new("/nonexistent"), 3, &dir, Some(base), |_| {})
            .expect_err("a taken port is refused");
        assert!(err.to_string().contains(&format!("{client} is not free")), "{err}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
