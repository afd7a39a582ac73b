//! The server's configuration: a TOML file, overridden by command-line flags, validated
//! with errors that name the field.
//!
//! ```toml
//! node_id = 1
//! data_dir = "/var/lib/keel/n1"
//! client_addr = "127.0.0.1:7379"
//! http_addr = "127.0.0.1:7579"
//!
//! [[members]]
//! id = 1
//! peer_addr = "127.0.0.1:7479"
//! [[members]]
//! id = 2
//! peer_addr = "127.0.0.1:7480"
//! [[members]]
//! id = 3
//! peer_addr = "127.0.0.1:7481"
//!
//! [engine]
//! durability_default = "memory"
//! read_level_default = "monotonic"
//!
//! # Optional: several keyspaces, each an engine instance with its own log, storage
//! # directory, defaults and leader. Without this section there is one ORCA keyspace 0,
//! # stored in `data_dir` itself (so older configurations and data keep working).
//! [[keyspaces]]
//! id = 0
//! name = "default"
//! engine = "orca"
//! [[keyspaces]]
//! id = 1
//! name = "sessions"
//! engine = "orca"
//! durability_default = "durable"
//! read_level_default = "linearizable"
//! ```
//!
//! A test-only section, off by default, delays this node's outbound peer messages to
//! emulate a wide-area network (the geo benchmark uses it):
//!
//! ```toml
//! [geo]
//! peer_delay_ms = { "2" = 17, "3" = 1 }   # one-way delay to member 2 and member 3
//! ```
//!
//! Another, also off by default, adds a fixed delay to every log fsync, to emulate a disk
//! whose fsync costs more than this one's (the orca benchmark's `--emulated-fsync-us`):
//!
//! ```toml
//! [storage]
//! emulated_fsync_delay_us = 1500
//! ```
//!
//! `docs/operations.md` lists every field with its default.

use keel_core::engine::EngineKind;
use keel_core::leader::Config as EngineConfig;
use keel_core::time::Span;
use keel_types::{Durability, KeyspaceId, Limits, NodeId, ReadLevel};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Default most open client connections.
pub const CONNECTIONS_MAX_DEFAULT: u32 = 1024;
/// Default time a client connection may send nothing: 5 minutes (Redis's default, 0, is
/// never; a connection that never closes holds a slot forever).
pub const CLIENT_IDLE_TIMEOUT_MS_DEFAULT: u64 = 300_000;
/// Default time a client connection has to authenticate, with users configured.
pub const AUTH_TIMEOUT_MS_DEFAULT: u64 = 5_000;
/// Default most events waiting for the engine (client requests and peer messages).
pub const INPUT_QUEUE_MAX_DEFAULT: u32 = 16_384;
/// Default most messages queued for one peer; more are dropped (the protocol retries).
pub const PEER_QUEUE_MAX_DEFAULT: u32 = 8_192;
/// Default most messages in one peer frame.
pub const PEER_BATCH_MAX_DEFAULT: u32 = 512;
/// Default most pipelined requests one connection may have unanswered.
pub const PIPELINE_DEPTH_MAX_DEFAULT: u32 = 1024;
/// Ceiling on every configured queue length.
pub const QUEUE_CEILING: u32 = 1 << 20;
/// Longest emulated one-way peer delay (`geo.peer_delay_ms`).
pub const PEER_DELAY_MS_MAX: u64 = 10_000;
/// Longest emulated extra fsync time (`storage.emulated_fsync_delay_us`).
pub const EMULATED_FSYNC_DELAY_US_MAX: u64 = 1_000_000;
/// Most keyspaces one node hosts (each has an engine loop, a storage thread and files).
pub const KEYSPACES_MAX: usize = 64;
/// Most members of a cluster whose keyspaces are placed on replica groups (each node
/// keeps a peer link to every other).
pub const CLUSTER_MEMBERS_MAX: usize = 32;
/// Fewest runtime threads a node runs (`worker_threads`). One is enough since long
/// client flushes leave for the bulk runtime (before it, a flood of large replies held a
/// one-thread leader's peer links past the election timeout), and on a machine its nodes
/// share it is the fastest setting (`docs/performance.md`, *One thread per node again*).
pub const WORKER_THREADS_MIN: u32 = 1;
/// This machine's cores, as the runtime counts them (1 when it cannot tell).
pub fn machine_cores() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX))
}

/// Threads of a node's runtime: `worker_threads`, else one per core, at least
/// [`WORKER_THREADS_MIN`].
pub fn runtime_threads(worker_threads: Option<u32>) -> u32 {
    worker_threads.unwrap_or_else(machine_cores).max(WORKER_THREADS_MIN)
}

/// Threads of a node's bulk runtime (long client flushes): a quarter of its runtime's,
/// at least one.
pub fn bulk_threads(runtime_threads: u32) -> u32 {
    (runtime_threads / 4).max(1)
}
/// Highest keyspace id (what `SELECT` takes; Redis clients use small numbers).
pub const KEYSPACE_ID_MAX: u32 = 1023;
/// Longest keyspace name.
pub const KEYSPACE_NAME_BYTES_MAX: usize = 64;

const _: () = assert!(INPUT_QUEUE_MAX_DEFAULT <= QUEUE_CEILING);
const _: () = assert!(PEER_BATCH_MAX_DEFAULT <= PEER_QUEUE_MAX_DEFAULT);

/// A configuration the server refuses; names the field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema.
    #[error("config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message (names the field and line).
        message: String,
    },
    /// A field is missing or out of range.
    #[error("config field `{field}`: {reason}")]
    Invalid {
        /// The field.
        field: String,
        /// What is wrong.
        reason: String,
    },
}

fn invalid(field: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { field: field.to_string(), reason: reason.into() }
}

/// One cluster member and where its peers reach it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Member {
    /// Its node id (stable across restarts).
    pub id: u32,
    /// Its peer-to-peer address: where the others dial it.
    pub peer_addr: PeerAddr,
    /// Its data center's label (letters, digits, `-`, `_`), for geo keyspaces: members
    /// with one label are one data center, which holds every partition of a geo
    /// keyspace, one per member (`docs/geo.md`, *Deployment*).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dc: Option<String>,
    /// Where its clients connect (`host:port`): what a sharded cluster's `MOVED`
    /// redirects and `CLUSTER SLOTS` name. Needed by every member of a sharded cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_addr: Option<PeerAddr>,
}

/// Longest host name a [`PeerAddr`] may hold (DNS's limit).
pub const HOST_NAME_BYTES_MAX: usize = 253;

/// A member's peer address: an IP address and port, or a DNS name and port (Kubernetes'
/// `keel-0.keel.ns.svc.cluster.local:7479`). A name is resolved each time a link dials
/// it, so a member whose address changes across restarts is found again. A node listens
/// on its own entry's address when that is an IP address, and on every interface at its
/// port when it is a name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum PeerAddr {
    /// An IP address and port.
    Ip(SocketAddr),
    /// A host name and port.
    Name(String, u16),
}

impl PeerAddr {
    /// The IP address, when it is one.
    pub fn ip(&self) -> Option<std::net::IpAddr> {
        match self {
            PeerAddr::Ip(addr) => Some(addr.ip()),
            PeerAddr::Name(..) => None,
        }
    }

    /// The port.
    pub fn port(&self) -> u16 {
        match self {
            PeerAddr::Ip(addr) => addr.port(),
            PeerAddr::Name(_, port) => *port,
        }
    }

    /// Whether only this host can reach it: a loopback IP address, or `localhost`.
    pub fn is_loopback(&self) -> bool {
        match self {
            PeerAddr::Ip(addr) => addr.ip().is_loopback(),
            PeerAddr::Name(host, _) => host.eq_ignore_ascii_case("localhost"),
        }
    }

    /// Where a node with this address listens: the address itself, or every interface
    /// at its port for a name.
    pub fn listen_addr(&self) -> SocketAddr {
        match self {
            PeerAddr::Ip(addr) => *addr,
            PeerAddr::Name(_, port) => SocketAddr::from(([0, 0, 0, 0], *port)),
        }
    }

    /// Dials it (resolving a name now).
    pub async fn connect(&self) -> std::io::Result<tokio::net::TcpStream> {
        match self {
            PeerAddr::Ip(addr) => tokio::net::TcpStream::connect(addr).await,
            PeerAddr::Name(host, port) => {
                tokio::net::TcpStream::connect((host.as_str(), *port)).await
            }
        }
    }
}

impl From<SocketAddr> for PeerAddr {
    fn from(addr: SocketAddr) -> PeerAddr {
        PeerAddr::Ip(addr)
    }
}

impl std::fmt::Display for PeerAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerAddr::Ip(addr) => write!(f, "{addr}"),
            PeerAddr::Name(host, port) => write!(f, "{host}:{port}"),
        }
    }
}

impl From<PeerAddr> for String {
    fn from(addr: PeerAddr) -> String {
        addr.to_string()
    }
}

impl TryFrom<String> for PeerAddr {
    type Error = String;

    fn try_from(text: String) -> Result<PeerAddr, String> {
        text.parse()
    }
}

impl std::str::FromStr for PeerAddr {
    type Err = String;

    /// `IP:PORT` (`[IPv6]:PORT`) or `NAME:PORT`, a name of letters, digits, `-` and `.`
    /// (labels of 1 to 63, at most 253 bytes), a port other than 0.
    fn from_str(text: &str) -> Result<PeerAddr, String> {
        let addr = if let Ok(addr) = text.parse::<SocketAddr>() {
            PeerAddr::Ip(addr)
        } else {
            let (host, port) =
                text.rsplit_once(':').ok_or_else(|| format!("`{text}` is not HOST:PORT"))?;
            let port: u16 = port.parse().map_err(|_| format!("`{text}`: bad port"))?;
            let label_ok = |l: &str| {
                (1..=63).contains(&l.len())
                    && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            };
            if host.len() > HOST_NAME_BYTES_MAX || !host.split('.').all(label_ok) {
                return Err(format!("`{text}`: `{host}` is neither an IP address nor a host name"));
            }
            PeerAddr::Name(host.to_ascii_lowercase(), port)
        };
        if addr.port() == 0 {
            return Err(format!("`{text}`: port 0"));
        }
        Ok(addr)
    }
}

/// Engine settings a server exposes (milliseconds for times). Missing fields take the
/// engine's defaults (`keel_core::leader::Config::new`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineSettings {
    /// Durability of writes that name none.
    pub durability_default: Option<Durability>,
    /// Level of reads that name none.
    pub read_level_default: Option<ReadLevel>,
    /// Leader heartbeat period.
    pub heartbeat_interval_ms: Option<u64>,
    /// Follower mark-out timeout.
    pub mark_out_timeout_ms: Option<u64>,
    /// Leader's removal timeout.
    pub removal_timeout_ms: Option<u64>,
    /// Lower bound of the election timeout.
    pub election_timeout_min_ms: Option<u64>,
    /// Upper bound of the election timeout.
    pub election_timeout_max_ms: Option<u64>,
    /// Background fsync period.
    pub flush_interval_ms: Option<u64>,
    /// How long a request may wait inside the engine.
    pub request_timeout_ms: Option<u64>,
    /// Clients (and sessions) the deduplication table keeps, the least recently written
    /// leaving first.
    pub dedup_clients_max: Option<usize>,
    /// Whether followers serve `any` and `monotonic` reads.
    pub follower_reads: Option<bool>,
    /// Longest key.
    pub key_bytes_max: Option<u32>,
    /// Largest value.
    pub value_bytes_max: Option<u32>,
    /// Snapshot after this many durable entries ...
    pub snapshot_entries_threshold: Option<u64>,
    /// ... once the log since the last snapshot holds this percentage of the state's bytes.
    pub snapshot_log_percent: Option<u64>,
    /// Snapshot bytes encoded in one slice, and the size of one snapshot chunk sent.
    pub snapshot_chunk_bytes: Option<u64>,
    /// Most bytes of entries in one `Append` (past the first entry).
    pub append_bytes_max: Option<u64>,
    /// At most one snapshot slice per this many milliseconds.
    pub snapshot_slice_interval_ms: Option<u64>,
    /// Most bytes the state may hold (keys, values, 32 per key); writes past it fail.
    pub state_bytes_max: Option<u64>,
    /// Most requests waiting inside the engine.
    pub pending_requests_max: Option<usize>,
}

/// One keyspace: `[[keyspaces]]` in `keel.toml`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyspaceSettings {
    /// Its id (what `SELECT` and `--keyspace` take); 0 must exist.
    pub id: u32,
    /// Its name (letters, digits, `-` and `_`), shown in `/status` and `keel status`.
    pub name: String,
    /// The engine kind it runs.
    #[serde(default = "engine_kind_default")]
    pub engine: EngineKind,
    /// Durability of writes that name none (default: `[engine] durability_default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durability_default: Option<Durability>,
    /// Level of reads that name none (default: `[engine] read_level_default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_level_default: Option<ReadLevel>,
    /// The member that should lead it (default: with several keyspaces, each prefers
    /// the replica that leads the fewest keyspaces before it in id order, spreading
    /// leaders; with one, none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_leader: Option<u32>,
    /// The members that host it, its replica group (3, 5 or 7 of them); default every
    /// member. A node runs only the keyspaces whose group names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<Vec<u32>>,
    /// The hash slots it serves in a sharded cluster (`"0-8191"`, `"0-99,200-299"`): with
    /// slots, the cluster speaks the Redis Cluster protocol, and every keyspace names
    /// some, together each of the 16,384 once (`docs/operations.md`, *Sharding*).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots: Option<String>,
}

fn engine_kind_default() -> EngineKind {
    EngineKind::Orca
}

impl KeyspaceSettings {
    /// Keyspace `id` of kind ORCA with the node's defaults (what `keel up --keyspaces`
    /// writes): keyspace 0 is named `default`, the others `ks<id>`.
    pub fn orca(id: u32) -> KeyspaceSettings {
        let name = if id == 0 { "default".to_string() } else { format!("ks{id}") };
        KeyspaceSettings {
            id,
            name,
            engine: EngineKind::Orca,
            durability_default: None,
            read_level_default: None,
            preferred_leader: None,
            replicas: None,
            slots: None,
        }
    }
}

impl KeyspaceSettings {
    /// Keyspace `id` of kind geo, named `geo` (what `keel up --geo` adds).
    pub fn geo(id: u32) -> KeyspaceSettings {
        KeyspaceSettings { name: "geo".to_string(), engine: EngineKind::Geo, ..Self::kite(id) }
    }

    /// Keyspace `id` of kind Kite, named `kite` (what `keel up --kite` adds).
    pub fn kite(id: u32) -> KeyspaceSettings {
        KeyspaceSettings {
            id,
            name: "kite".to_string(),
            engine: EngineKind::Kite,
            durability_default: None,
            read_level_default: None,
            preferred_leader: None,
            replicas: None,
            slots: None,
        }
    }
}

/// A keyspace as a node runs it: its settings resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct KeyspaceSpec {
    /// Its id.
    pub id: KeyspaceId,
    /// Its name.
    pub name: String,
    /// Its engine kind.
    pub engine: EngineKind,
    /// Where its log, hard state and snapshots live.
    pub data_dir: PathBuf,
    /// The engine configuration (for ORCA).
    pub config: EngineConfig,
}

/// `[kite]`: the timers and bounds of Kite keyspaces (`docs/kite.md`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KiteSettings {
    /// How long a release waits for every node's acknowledgements of its session's
    /// earlier writes before it takes the slow path (1 to 60,000 ms).
    pub release_timeout_ms: u64,
    /// How long a round waits for answers before it asks again (1 to 60,000 ms).
    pub retransmit_ms: u64,
    /// The most sessions (connections) a node keeps per Kite keyspace.
    pub sessions_max: u32,
    /// The longest random pause, in microseconds, before a read-modify-write that lost to
    /// another proposer tries again (1 to 1,000,000).
    pub rmw_backoff_max_us: u64,
    /// The most committed read-modify-write outcomes a node keeps per Kite keyspace (one
    /// per session or client that made one; the oldest goes first): how far back a retry
    /// is still known done (`docs/kite.md`, Retries).
    pub outcomes_max: u32,
    /// The most megabytes those outcomes take (1 to 65,536).
    pub outcomes_mib_max: u32,
}

impl Default for KiteSettings {
    fn default() -> Self {
        KiteSettings {
            release_timeout_ms: 10,
            retransmit_ms: 100,
            sessions_max: 10_000,
            rmw_backoff_max_us: 1_000,
            outcomes_max: 100_000,
            outcomes_mib_max: 64,
        }
    }
}

impl KiteSettings {
    /// Whether every setting is the default (the section is then not written).
    pub fn is_default(&self) -> bool {
        *self == KiteSettings::default()
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        for (field, ms) in [
            ("kite.release_timeout_ms", self.release_timeout_ms),
            ("kite.retransmit_ms", self.retransmit_ms),
        ] {
            if !(1..=60_000).contains(&ms) {
                return Err(invalid(field, "must be between 1 and 60000 ms"));
            }
        }
        if self.sessions_max == 0 {
            return Err(invalid("kite.sessions_max", "must be positive"));
        }
        if !(1..=1_000_000).contains(&self.rmw_backoff_max_us) {
            return Err(invalid("kite.rmw_backoff_max_us", "must be between 1 and 1000000 us"));
        }
        if self.outcomes_max == 0 {
            return Err(invalid("kite.outcomes_max", "must be positive"));
        }
        if !(1..=65_536).contains(&self.outcomes_mib_max) {
            return Err(invalid("kite.outcomes_mib_max", "must be between 1 and 65536"));
        }
        Ok(())
    }
}

/// `[geo]`: strong transactions of geo keyspaces (`docs/geo.md`, *Strong transactions*),
/// and test-only wide-area emulation; off by default.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GeoSettings {
    /// Whether geo keyspaces serve strong transactions. Every node of the keyspace must
    /// say the same.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub strong: bool,
    /// The data center (a members' `dc` label) whose members lead certification first
    /// (default: the first label in byte order); when it is suspected, leadership moves
    /// to the next data center in label order (`docs/geo.md`, *Failover*).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_dc: Option<String>,
    /// Pairs of strong transaction labels that conflict (`[["withdraw", "withdraw"]]`);
    /// an unlabelled strong transaction conflicts with every strong transaction.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conflicts: Vec<[String; 2]>,
    /// REDBLUE's baseline, for comparisons: one certifier (the first partition's leader)
    /// certifies every strong transaction, instead of each partition the keys it holds
    /// (`docs/geo.md`, *Modes*). Needs `strong`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub central_certifier: bool,
    /// Spread the partitions' certification leaders over the data centers: partition
    /// `p`'s leader starts in the data center `p` places after `leader_dc` in label order
    /// (`docs/geo.md`, *Failover*). Needs `strong`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub spread_leaders: bool,
    /// This node is a new machine for a removed data center: its geo replicas boot
    /// joining (they serve nothing and wait for `keel node return`, then copy what
    /// survived and serve in a new life; `docs/geo.md`, *Taking a data center back*).
    /// Harmless once back: a geo replica that restarts is lost anyway.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub joining: bool,
    /// Test only: one-way delay in milliseconds of every message from this node to the
    /// member whose id is the key (a string in TOML: `{ "2" = 17 }`); members not named
    /// get none. Each message leaves no earlier than its enqueue time plus this delay, in
    /// order.
    #[serde(default)]
    pub peer_delay_ms: BTreeMap<String, u64>,
}

impl GeoSettings {
    /// Whether nothing is configured (the default; the section is then not written).
    pub fn is_off(&self) -> bool {
        self.peer_delay_ms.values().all(|&ms| ms == 0)
            && !self.strong
            && self.leader_dc.is_none()
            && self.conflicts.is_empty()
            && !self.central_certifier
            && !self.spread_leaders
            && !self.joining
    }
}

/// Test-only disk emulation (off by default; never for production).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageSettings {
    /// Extra time, in microseconds, the storage thread waits after every log fsync before
    /// reporting it, as if the disk's fsync took that much longer (0: none).
    #[serde(default)]
    pub emulated_fsync_delay_us: u64,
}

impl StorageSettings {
    /// Whether no emulation is configured (the default; the section is then not written).
    pub fn is_off(&self) -> bool {
        self.emulated_fsync_delay_us == 0
    }
}

/// Test-only behaviours that break a promise on purpose, for negative controls (off by
/// default; a node with one on logs it as an error at start).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TestingSettings {
    /// `KEEL.INVOKE GET`'s final view is read at `any` on the contacted node, without
    /// coordinating, yet labelled with the strongest level asked for: histories recorded
    /// against it must fail `keel check`.
    #[serde(default)]
    pub unsafe_stale_invoke: bool,
    /// A script's write-back watches none of the keys it read (`EVAL`): scripts racing on
    /// a key then lose updates, which the scripting tests' race must find.
    #[serde(default)]
    pub unsafe_script_skip_watch: bool,
    /// A sharded cluster's keyspaces take requests for keys of any slot (no slot guard):
    /// a script's key of another keyspace is then written where no client finds it,
    /// which the sharding tests must see.
    #[serde(default)]
    pub unsafe_no_slot_guard: bool,
    /// `durable` writes are acknowledged as `replicated` ones (before any fsync), yet
    /// answered as durable: a fault harness must find them lost.
    #[serde(default)]
    pub unsafe_ack_durable_before_fsync: bool,
    /// Kite keyspaces' releases that time out waiting for every node go ahead without
    /// marking the nodes that missed writes delinquent (no slow path): an acquire there
    /// can then miss what the release covered, which a fault harness must find.
    #[serde(default)]
    pub unsafe_kite_no_slow_path: bool,
    /// Geo keyspaces show remote transactions once this data center stores them, not
    /// once they are uniform: a session that moves after a barrier, when a data center
    /// fails, can then miss what it observed (`docs/geo.md`, *Controls*).
    #[serde(default)]
    pub unsafe_geo_expose_non_uniform: bool,
    /// Fault injection, safe in itself: appends stay in the process until their file is
    /// synced, so that killing the process loses what a power loss would.
    #[serde(default)]
    pub power_loss_on_kill: bool,
    /// Upgrade tests: the peer protocol this node speaks, below this build's own
    /// (`keel_wire::peer::PEER_PROTOCOL`): it announces nothing at protocol 1 and refuses
    /// the messages a later protocol added, as a node of the previous version does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_protocol: Option<u8>,
    /// Fault injection, safe in itself: `SIGUSR1` makes the next fsync fail with `EIO`
    /// (the node stops, as on a real storage error).
    #[serde(default)]
    pub eio_on_sigusr1: bool,
    /// Fault injection, safe in itself: the node's clock runs this many parts per million
    /// fast (negative: slow), within the engine's drift bound (`CLOCK_RATE_PPM_MAX`).
    #[serde(default)]
    pub clock_rate_ppm: i32,
    /// Fault injection, safe in itself: the node's clock starts this many milliseconds
    /// ahead of the host's (`CLOCK_OFFSET_MS_MAX`; never behind: it counts since boot).
    #[serde(default)]
    pub clock_offset_ms: u64,
}

/// Largest `testing.clock_rate_ppm`, either way: the engine's default drift bound.
pub const CLOCK_RATE_PPM_MAX: i32 = 100;
/// Largest `testing.clock_offset_ms` (a day).
pub const CLOCK_OFFSET_MS_MAX: u64 = 86_400_000;

impl TestingSettings {
    /// Whether nothing is on (the default; the section is then not written).
    pub fn is_off(&self) -> bool {
        *self == TestingSettings::default()
    }
}

/// The whole server configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// This node's id; must be one of `members`.
    pub node_id: u32,
    /// Directory of the write-ahead log, hard state and snapshots.
    pub data_dir: PathBuf,
    /// Where clients connect (RESP2/RESP3).
    pub client_addr: SocketAddr,
    /// Where `/metrics` and `/status` are served; `None`: no HTTP endpoint.
    #[serde(default)]
    pub http_addr: Option<SocketAddr>,
    /// Every member, this node included: 3, 5 or 7 (up to 9 with `voters`; up to
    /// [`CLUSTER_MEMBERS_MAX`] when every ORCA keyspace names its `replicas`): the nodes
    /// this node knows the addresses of and connects to.
    pub members: Vec<Member>,
    /// The voters of ORCA keyspaces while their logs name none (a new cluster): these
    /// members (3, 5 or 7 of them); default every member. A member left out starts
    /// outside the membership and joins once an operator adds it (`keel node add`,
    /// `docs/operations.md`, *Membership*). Once a keyspace's log holds a membership
    /// entry, the log decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub voters: Option<Vec<u32>>,
    /// Most open client connections; more are refused with `-BUSY`.
    #[serde(default = "connections_max_default")]
    pub connections_max: u32,
    /// Most events waiting for the engine; past it requests get `-BUSY`.
    #[serde(default = "input_queue_max_default")]
    pub input_queue_max: u32,
    /// Most messages queued per peer; past it messages are dropped.
    #[serde(default = "peer_queue_max_default")]
    pub peer_queue_max: u32,
    /// Most messages per peer frame.
    #[serde(default = "peer_batch_max_default")]
    pub peer_batch_max: u32,
    /// Most unanswered pipelined requests per connection (reading pauses past it).
    #[serde(default = "pipeline_depth_max_default")]
    pub pipeline_depth_max: u32,
    /// A client connection holding part of a request for this long is closed (ms; a
    /// request that never completes must not hold a connection slot).
    #[serde(default = "partial_request_timeout_ms_default")]
    pub partial_request_timeout_ms: u64,
    /// A client connection that sends nothing for this long is closed (ms; 0: never, as
    /// Redis's `timeout 0`, which is not Keel's default: an idle connection holds a slot
    /// of `connections_max`).
    #[serde(default = "client_idle_timeout_ms_default")]
    pub client_idle_timeout_ms: u64,
    /// With users configured, a client connection that has not authenticated this long
    /// after it was accepted is closed (ms).
    #[serde(default = "auth_timeout_ms_default")]
    pub auth_timeout_ms: u64,
    /// With users configured, most client connections not yet authenticated; one more
    /// closes the oldest of them. Below `connections_max`, so that slots stay free for
    /// clients that authenticate; `None`: `connections_max` less an eighth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unauthenticated_connections_max: Option<u32>,
    /// A client connection whose replies cannot be written (the client does not read
    /// them) for this long is closed (ms).
    #[serde(default = "client_output_timeout_ms_default")]
    pub client_output_timeout_ms: u64,
    /// Bytes all client connections' request buffers may hold together past 16 KiB each
    /// (large requests, whole or partial); a connection that would go past it is answered
    /// with an error and closed.
    #[serde(default = "client_request_buffers_bytes_max_default")]
    pub client_request_buffers_bytes_max: u64,
    /// Bytes the unanswered pipelined requests of all client connections may hold
    /// together, each counted as [`crate::front_door::PIPELINED_REQUEST_BYTES`]; past it a
    /// connection with replies still to write stops being read until some are written (a
    /// connection with none always has one request read).
    #[serde(default = "pipelined_requests_bytes_max_default")]
    pub pipelined_requests_bytes_max: u64,
    /// The send buffer of each client socket (bytes; 0: the kernel sizes it, on Linux up
    /// to `net.ipv4.tcp_wmem`'s maximum, 4 MiB by default). Each client that reads
    /// nothing costs the node this much copying before its writes stall.
    #[serde(default = "client_send_buffer_bytes_default")]
    pub client_send_buffer_bytes: u64,
    /// Bytes of values in replies another node served (requests forwarded to the
    /// leader) this node may hold together until their clients read them; a reply that
    /// would go past it is answered with `BUSY` instead.
    #[serde(default = "forwarded_replies_bytes_max_default")]
    pub forwarded_replies_bytes_max: u64,
    /// Threads of the node's runtime, which runs its engine loops, peer links and client
    /// connections, at least [`WORKER_THREADS_MIN`]; `None`: one per core. Nodes sharing a
    /// machine (a local cluster) each take their share of its cores: more threads than
    /// cores cost wake-ups across them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_threads: Option<u32>,
    /// Whether connections answer reads that need no step themselves, off the engine
    /// loop (`docs/protocol.md` §7); `false` sends every request through the loop.
    #[serde(default = "reads_off_loop_default")]
    pub reads_off_loop: bool,
    /// A file holding the cluster secret: the same bytes on every member (at least 16
    /// after trimming surrounding whitespace), readable by its owner only. Every peer
    /// link opens with a handshake in which both nodes prove they know it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_secret_file: Option<PathBuf>,
    /// Also serves clients over TLS on this address (as Redis's `tls-port`); needs
    /// `tls_cert_file` and `tls_key_file`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_tls_addr: Option<SocketAddr>,
    /// The certificate chain (PEM) `client_tls_addr` presents, its own certificate first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_cert_file: Option<PathBuf>,
    /// The private key (PEM) of `tls_cert_file`, readable by its owner only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_key_file: Option<PathBuf>,
    /// When set, clients of `client_tls_addr` must present a certificate signed by this
    /// authority (PEM): mutual TLS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_client_ca_file: Option<PathBuf>,
    /// Serve `client_addr` (plain TCP); `false` serves clients over TLS only.
    #[serde(default = "client_plaintext_default", skip_serializing_if = "is_true")]
    pub client_plaintext: bool,
    /// A file holding the bearer token `/metrics` and `/status` then require
    /// (`Authorization: Bearer <token>`; 16 to 4096 bytes after trimming, readable by its
    /// owner only). Required when `http_addr` is not a loopback address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_token_file: Option<PathBuf>,
    /// Serve `/metrics` and `/status` over HTTPS with `tls_cert_file` and `tls_key_file`.
    /// Required when `http_addr` is not a loopback address.
    #[serde(default, skip_serializing_if = "is_false")]
    pub http_tls: bool,
    /// Runs without `cluster_secret_file` although a member's peer address is not a
    /// loopback address: anyone who reaches a peer port can then act as a member.
    #[serde(default, skip_serializing_if = "is_false")]
    pub allow_unauthenticated_peers: bool,
    /// How long a peer link's handshake may take (ms).
    #[serde(default = "peer_handshake_timeout_ms_default")]
    pub peer_handshake_timeout_ms: u64,
    /// A peer link that carries nothing for this long is closed (ms); senders keep idle
    /// links open with empty frames at a quarter of it.
    #[serde(default = "peer_idle_timeout_ms_default")]
    pub peer_idle_timeout_ms: u64,
    /// Most inbound peer connections whose hello has not verified, held at once; a new
    /// one into a full pool evicts the oldest. More of them give a member whose hello is
    /// late (its node is busy) longer before a flood's connections evict it.
    #[serde(default = "peer_pending_max_default")]
    pub peer_pending_max: u32,
    /// Engine settings.
    #[serde(default)]
    pub engine: EngineSettings,
    /// Settings of Kite keyspaces (`engine = "kite"`).
    #[serde(default, skip_serializing_if = "KiteSettings::is_default")]
    pub kite: KiteSettings,
    /// Test-only wide-area emulation (off by default).
    #[serde(default, skip_serializing_if = "GeoSettings::is_off")]
    pub geo: GeoSettings,
    /// Test-only disk emulation (off by default).
    #[serde(default, skip_serializing_if = "StorageSettings::is_off")]
    pub storage: StorageSettings,
    /// Test-only broken behaviours for negative controls (off by default).
    #[serde(default, skip_serializing_if = "TestingSettings::is_off")]
    pub testing: TestingSettings,
    /// Without any `[[users]]`, serve only clients connecting from a loopback address
    /// (Redis's protected mode); `false` serves anyone who reaches `client_addr`.
    #[serde(default = "protected_mode_default")]
    pub protected_mode: bool,
    /// The users clients authenticate as (`AUTH`, `HELLO ... AUTH`); none: clients do not
    /// authenticate (and `protected_mode` applies).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<crate::acl::UserSettings>,
    /// The keyspaces; empty: one ORCA keyspace 0 in `data_dir`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keyspaces: Vec<KeyspaceSettings>,
}

/// Whether a file holding a secret is private enough: no permission for others, and for
/// its group at most reading, and that only when root owns it (how Kubernetes mounts a
/// Secret for a non-root process: owned by root, group-readable by the pod's `fsGroup`).
pub(crate) fn private_file(meta: &std::fs::Metadata) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let mode = meta.permissions().mode();
        mode & 0o077 == 0 || (meta.uid() == 0 && mode & 0o037 == 0)
    }
    #[cfg(not(unix))]
    {
        let _ = meta;
        true
    }
}

/// Reads a secret from `path` (the `field`'s file): readable by its owner only, and
/// [`crate::handshake::SECRET_BYTES_MIN`] to [`crate::handshake::SECRET_BYTES_MAX`] bytes
/// once surrounding whitespace is trimmed.
fn read_secret_file(field: &str, path: &std::path::Path) -> Result<Vec<u8>, ConfigError> {
    use crate::handshake::{SECRET_BYTES_MAX, SECRET_BYTES_MIN};
    let meta = std::fs::metadata(path)
        .map_err(|e| invalid(field, format!("cannot read {}: {e}", path.display())))?;
    if meta.len() > SECRET_BYTES_MAX as u64 * 2 {
        return Err(invalid(field, format!("{} is too large for a secret", path.display())));
    }
    if !private_file(&meta) {
        let reason = format!("{} is readable by others (chmod 600 it)", path.display());
        return Err(invalid(field, reason));
    }
    let bytes = std::fs::read(path)
        .map_err(|e| invalid(field, format!("cannot read {}: {e}", path.display())))?;
    let secret = bytes.trim_ascii();
    if secret.len() < SECRET_BYTES_MIN || secret.len() > SECRET_BYTES_MAX {
        let reason = format!("the secret must have {SECRET_BYTES_MIN} to {SECRET_BYTES_MAX} bytes");
        return Err(invalid(field, reason));
    }
    Ok(secret.to_vec())
}

fn client_plaintext_default() -> bool {
    true
}
fn is_true(value: &bool) -> bool {
    *value
}
fn client_request_buffers_bytes_max_default() -> u64 {
    256 << 20
}
fn client_send_buffer_bytes_default() -> u64 {
    256 << 10
}
fn pipelined_requests_bytes_max_default() -> u64 {
    32 << 20
}
fn forwarded_replies_bytes_max_default() -> u64 {
    keel_exec::FORWARDED_REPLIES_BYTES_MAX as u64
}
fn client_output_timeout_ms_default() -> u64 {
    60_000
}
fn protected_mode_default() -> bool {
    true
}
fn is_false(value: &bool) -> bool {
    !*value
}
fn peer_handshake_timeout_ms_default() -> u64 {
    2_000
}
fn peer_idle_timeout_ms_default() -> u64 {
    30_000
}
fn peer_pending_max_default() -> u32 {
    64
}
fn connections_max_default() -> u32 {
    CONNECTIONS_MAX_DEFAULT
}
fn partial_request_timeout_ms_default() -> u64 {
    10_000
}
fn client_idle_timeout_ms_default() -> u64 {
    CLIENT_IDLE_TIMEOUT_MS_DEFAULT
}
fn auth_timeout_ms_default() -> u64 {
    AUTH_TIMEOUT_MS_DEFAULT
}

fn reads_off_loop_default() -> bool {
    true
}

fn input_queue_max_default() -> u32 {
    INPUT_QUEUE_MAX_DEFAULT
}
fn peer_queue_max_default() -> u32 {
    PEER_QUEUE_MAX_DEFAULT
}
fn peer_batch_max_default() -> u32 {
    PEER_BATCH_MAX_DEFAULT
}
fn pipeline_depth_max_default() -> u32 {
    PIPELINE_DEPTH_MAX_DEFAULT
}

/// The addresses of node `id` (1-based) in a local cluster laid out from `base_port`:
/// clients at `base_port + id - 1`, peers 100 higher, HTTP 200 higher.
pub fn local_addrs(base_port: u16, id: u32) -> (SocketAddr, SocketAddr, SocketAddr) {
    assert!((1..=99).contains(&id), "local clusters have ids 1..=99 (100 ports apart)");
    let port = |offset: u32| -> SocketAddr {
        let p = u32::from(base_port) + offset + id - 1;
        let p = u16::try_from(p).expect("base port leaves room for 3 × 100 ports");
        SocketAddr::from(([127, 0, 0, 1], p))
    };
    (port(0), port(100), port(200))
}

impl ServerConfig {
    /// Most connections not yet authenticated: `unauthenticated_connections_max`, or
    /// `connections_max` less an eighth (at least one).
    pub fn unauthenticated_max(&self) -> u32 {
        let reserve = (self.connections_max / 8).max(1);
        self.unauthenticated_connections_max
            .unwrap_or_else(|| self.connections_max.saturating_sub(reserve).max(1))
    }

    /// The configuration of node `id` of a local `nodes`-node cluster (see
    /// [`local_addrs`]), its data under `dir/n<id>`.
    pub fn local(nodes: u32, id: u32, base_port: u16, dir: &Path) -> ServerConfig {
        assert!(id >= 1 && id <= nodes, "node {id} outside 1..={nodes}");
        let members = (1..=nodes)
            .map(|m| {
                let (client, peer, _) = local_addrs(base_port, m);
                Member { id: m, peer_addr: peer.into(), dc: None, client_addr: Some(client.into()) }
            })
            .collect();
        let (client_addr, _, http_addr) = local_addrs(base_port, id);
        ServerConfig {
            node_id: id,
            data_dir: dir.join(format!("n{id}")),
            client_addr,
            http_addr: Some(http_addr),
            members,
            voters: None,
            connections_max: CONNECTIONS_MAX_DEFAULT,
            input_queue_max: INPUT_QUEUE_MAX_DEFAULT,
            peer_queue_max: PEER_QUEUE_MAX_DEFAULT,
            peer_batch_max: PEER_BATCH_MAX_DEFAULT,
            pipeline_depth_max: PIPELINE_DEPTH_MAX_DEFAULT,
            partial_request_timeout_ms: partial_request_timeout_ms_default(),
            client_idle_timeout_ms: CLIENT_IDLE_TIMEOUT_MS_DEFAULT,
            auth_timeout_ms: AUTH_TIMEOUT_MS_DEFAULT,
            unauthenticated_connections_max: None,
            client_output_timeout_ms: client_output_timeout_ms_default(),
            client_request_buffers_bytes_max: client_request_buffers_bytes_max_default(),
            pipelined_requests_bytes_max: pipelined_requests_bytes_max_default(),
            client_send_buffer_bytes: client_send_buffer_bytes_default(),
            forwarded_replies_bytes_max: forwarded_replies_bytes_max_default(),
            worker_threads: None,
            reads_off_loop: true,
            protected_mode: true,
            users: Vec::new(),
            cluster_secret_file: None,
            client_tls_addr: None,
            tls_cert_file: None,
            tls_key_file: None,
            tls_client_ca_file: None,
            client_plaintext: true,
            http_token_file: None,
            http_tls: false,
            allow_unauthenticated_peers: false,
            peer_handshake_timeout_ms: peer_handshake_timeout_ms_default(),
            peer_idle_timeout_ms: peer_idle_timeout_ms_default(),
            peer_pending_max: peer_pending_max_default(),
            engine: EngineSettings::default(),
            kite: KiteSettings::default(),
            geo: GeoSettings::default(),
            storage: StorageSettings::default(),
            testing: TestingSettings::default(),
            keyspaces: Vec::new(),
        }
    }

    /// Reads a TOML file. One that holds password hashes (`[[users]]`) must be readable
    /// by its owner only, as a key is ([`private_file`]): a hash lets whoever reads it
    /// guess passwords offline, at no cost to the node.
    pub fn from_file(path: &Path) -> Result<ServerConfig, ConfigError> {
        let read = |source| ConfigError::Read { path: path.to_path_buf(), source };
        let text = std::fs::read_to_string(path).map_err(read)?;
        let config = Self::from_toml(&text).map_err(|e| match e {
            ConfigError::Parse { message, .. } => {
                ConfigError::Parse { path: path.to_path_buf(), message }
            }
            other => other,
        })?;
        if !config.users.is_empty() && !private_file(&std::fs::metadata(path).map_err(read)?) {
            let reason = format!(
                "{} holds password hashes and is readable by others (chmod 600 it)",
                path.display()
            );
            return Err(invalid("users", reason));
        }
        Ok(config)
    }

    /// Parses TOML text (the path in errors is empty).
    pub fn from_toml(text: &str) -> Result<ServerConfig, ConfigError> {
        toml::from_str(text)
            .map_err(|e| ConfigError::Parse { path: PathBuf::new(), message: e.to_string() })
    }

    /// The configuration as TOML (what `keel up` writes for each node).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a server config always serializes")
    }

    /// This node's peer address, as its peers dial it.
    pub fn peer_addr(&self) -> &PeerAddr {
        let me = self.members.iter().find(|m| m.id == self.node_id);
        &me.expect("validated: node_id is a member").peer_addr
    }

    /// Where this node listens for peers ([`PeerAddr::listen_addr`]).
    pub fn peer_listen_addr(&self) -> SocketAddr {
        self.peer_addr().listen_addr()
    }

    /// Checks every field, then the engine configuration it produces.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.members.iter().all(|m| m.id != self.node_id) {
            return Err(invalid("node_id", format!("{} is not in members", self.node_id)));
        }
        if let Some(voters) = &self.voters {
            if let Some(v) = voters.iter().find(|v| self.members.iter().all(|m| m.id != **v)) {
                return Err(invalid("voters", format!("{v} is not in members")));
            }
        }
        if self.members.len() > CLUSTER_MEMBERS_MAX {
            return Err(invalid("members", format!("at most {CLUSTER_MEMBERS_MAX}")));
        }
        if self.data_dir.as_os_str().is_empty() {
            return Err(invalid("data_dir", "must not be empty"));
        }
        let queues = [
            ("connections_max", self.connections_max),
            ("input_queue_max", self.input_queue_max),
            ("peer_queue_max", self.peer_queue_max),
            ("peer_batch_max", self.peer_batch_max),
            ("pipeline_depth_max", self.pipeline_depth_max),
        ];
        for (field, value) in queues {
            if value == 0 || value > QUEUE_CEILING {
                return Err(invalid(field, format!("must be in 1..={QUEUE_CEILING}")));
            }
        }
        self.validate_peer_security()?;
        crate::acl::Users::new(&self.users).map_err(|reason| invalid("users", reason))?;
        if self.client_output_timeout_ms < 100 {
            return Err(invalid("client_output_timeout_ms", "must be at least 100"));
        }
        if self.partial_request_timeout_ms < 100 {
            return Err(invalid("partial_request_timeout_ms", "must be at least 100"));
        }
        if self.auth_timeout_ms < 100 {
            return Err(invalid("auth_timeout_ms", "must be at least 100"));
        }
        if let Some(max) = self.unauthenticated_connections_max {
            if max == 0 || max >= self.connections_max {
                let reason = "must be at least 1 and below connections_max (the rest are kept for clients that authenticate)";
                return Err(invalid("unauthenticated_connections_max", reason));
            }
        }
        let mut addrs: Vec<&PeerAddr> = self.members.iter().map(|m| &m.peer_addr).collect();
        addrs.sort();
        addrs.dedup();
        if addrs.len() != self.members.len() {
            return Err(invalid("members", "two members share a peer_addr"));
        }
        for member in &self.members {
            let label = member.dc.as_deref().unwrap_or("dc");
            let fine = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
            if label.is_empty() || label.len() > 64 || !label.chars().all(fine) {
                let reason = "a data center label is 1 to 64 letters, digits, '-' or '_'";
                return Err(invalid(&format!("members.{}.dc", member.id), reason));
            }
        }
        self.validate_geo()?;
        self.validate_keyspaces()?;
        self.validate_testing()?;
        self.keyspace_specs()?;
        let limits = self.engine_config()?.limits;
        let request_max = keel_wire::resp::RespLimits::for_server(&limits).frame_bytes_max;
        if self.client_request_buffers_bytes_max < request_max {
            let reason = format!("must hold at least one largest request ({request_max} bytes)");
            return Err(invalid("client_request_buffers_bytes_max", reason));
        }
        if self.pipelined_requests_bytes_max < 1 << 20 {
            return Err(invalid("pipelined_requests_bytes_max", "must be at least 1048576"));
        }
        self.validate_tls()?;
        let value_max = u64::from(limits.value_bytes_max);
        if self.forwarded_replies_bytes_max < value_max {
            let reason = format!("must hold at least one largest value ({value_max} bytes)");
            return Err(invalid("forwarded_replies_bytes_max", reason));
        }
        Ok(())
    }

    /// Checks the settings for tests and measurements (`[testing]`, the emulated fsync
    /// delay).
    fn validate_testing(&self) -> Result<(), ConfigError> {
        if self.testing.clock_rate_ppm.abs() > CLOCK_RATE_PPM_MAX {
            return Err(invalid(
                "testing.clock_rate_ppm",
                format!("must be within ±{CLOCK_RATE_PPM_MAX}"),
            ));
        }
        let (oldest, newest) = (keel_wire::peer::PEER_PROTOCOL_MIN, keel_wire::peer::PEER_PROTOCOL);
        if self.testing.peer_protocol.is_some_and(|p| !(oldest..=newest).contains(&p)) {
            return Err(invalid(
                "testing.peer_protocol",
                format!("this build speaks peer protocols {oldest} to {newest}"),
            ));
        }
        if self.testing.clock_offset_ms > CLOCK_OFFSET_MS_MAX {
            return Err(invalid(
                "testing.clock_offset_ms",
                format!("must be at most {CLOCK_OFFSET_MS_MAX}"),
            ));
        }
        if self.storage.emulated_fsync_delay_us > EMULATED_FSYNC_DELAY_US_MAX {
            return Err(invalid(
                "storage.emulated_fsync_delay_us",
                format!("must be at most {EMULATED_FSYNC_DELAY_US_MAX}"),
            ));
        }
        Ok(())
    }

    /// Checks the peer links' security settings: a secret wherever a peer port is
    /// reachable from another host (unless explicitly waived), and bounded timeouts.
    fn validate_peer_security(&self) -> Result<(), ConfigError> {
        let exposed = self.members.iter().any(|m| !m.peer_addr.is_loopback());
        if exposed && self.cluster_secret_file.is_none() && !self.allow_unauthenticated_peers {
            return Err(invalid(
                "cluster_secret_file",
                "required when a member's peer_addr is not a loopback address (or set \
                 allow_unauthenticated_peers = true to accept any peer)",
            ));
        }
        if !(100..=60_000).contains(&self.peer_handshake_timeout_ms) {
            return Err(invalid("peer_handshake_timeout_ms", "must be in 100..=60000"));
        }
        if !(1_000..=3_600_000).contains(&self.peer_idle_timeout_ms) {
            return Err(invalid("peer_idle_timeout_ms", "must be in 1000..=3600000"));
        }
        if self.peer_pending_max == 0 || self.peer_pending_max > 1024 {
            return Err(invalid("peer_pending_max", "must be in 1..=1024"));
        }
        if self.worker_threads.is_some_and(|n| !(WORKER_THREADS_MIN..=1024).contains(&n)) {
            return Err(invalid(
                "worker_threads",
                format!("must be in {WORKER_THREADS_MIN}..=1024"),
            ));
        }
        Ok(())
    }

    /// Checks that the TLS and HTTP access settings go together (the files themselves
    /// are read when the node starts, [`ServerConfig::tls_acceptor`]).
    fn validate_tls(&self) -> Result<(), ConfigError> {
        let files = self.tls_cert_file.is_some() && self.tls_key_file.is_some();
        if let Some(addr) = self.client_tls_addr {
            if !files {
                return Err(invalid("client_tls_addr", "needs tls_cert_file and tls_key_file"));
            }
            let others = [Some(self.client_addr), Some(self.peer_listen_addr()), self.http_addr];
            if others.contains(&Some(addr)) {
                return Err(invalid("client_tls_addr", "is another listener's address"));
            }
        }
        if self.http_tls && !files {
            return Err(invalid("http_tls", "needs tls_cert_file and tls_key_file"));
        }
        let any_file = self.tls_cert_file.is_some()
            || self.tls_key_file.is_some()
            || self.tls_client_ca_file.is_some();
        if any_file && self.client_tls_addr.is_none() && !self.http_tls {
            let reason = "TLS files are set but neither client_tls_addr nor http_tls is";
            return Err(invalid("client_tls_addr", reason));
        }
        if self.tls_client_ca_file.is_some() && self.client_tls_addr.is_none() {
            return Err(invalid("tls_client_ca_file", "needs client_tls_addr"));
        }
        if !self.client_plaintext && self.client_tls_addr.is_none() {
            let reason = "client_plaintext = false needs client_tls_addr";
            return Err(invalid("client_plaintext", reason));
        }
        if let Some(addr) = self.http_addr {
            let guarded = self.http_tls && self.http_token_file.is_some();
            if !(addr.ip().is_loopback() || guarded) {
                let reason = format!(
                    "{addr} is not a loopback address: /metrics and /status then need http_tls and http_token_file"
                );
                return Err(invalid("http_addr", reason));
            }
        }
        Ok(())
    }

    /// The acceptor for `client_tls_addr` (`None` when TLS is not configured); an error
    /// names the file at fault.
    pub fn tls_acceptor(&self) -> Result<Option<tokio_rustls::TlsAcceptor>, ConfigError> {
        self.acceptor(self.tls_client_ca_file.as_deref())
    }

    /// The acceptor for HTTPS on `http_addr` (`None` without `http_tls`): the same
    /// certificate, no client certificates (the token authenticates).
    pub fn http_tls_acceptor(&self) -> Result<Option<tokio_rustls::TlsAcceptor>, ConfigError> {
        if !self.http_tls {
            return Ok(None);
        }
        self.acceptor(None)
    }

    fn acceptor(
        &self,
        client_ca: Option<&std::path::Path>,
    ) -> Result<Option<tokio_rustls::TlsAcceptor>, ConfigError> {
        let (Some(cert), Some(key)) = (&self.tls_cert_file, &self.tls_key_file) else {
            return Ok(None);
        };
        let files = crate::tls::TlsFiles { cert, key, client_ca };
        crate::tls::acceptor(&files).map(Some).map_err(|reason| invalid("tls", reason))
    }

    /// Reads the HTTP bearer token (`None` when none is configured), with the rules of
    /// the cluster secret.
    pub fn http_token(&self) -> Result<Option<Vec<u8>>, ConfigError> {
        match &self.http_token_file {
            None => Ok(None),
            Some(path) => read_secret_file("http_token_file", path).map(Some),
        }
    }

    /// Reads the cluster secret (`None` when none is configured). Refuses a file that
    /// others may read, or whose secret is shorter than
    /// [`crate::handshake::SECRET_BYTES_MIN`] or longer than
    /// [`crate::handshake::SECRET_BYTES_MAX`].
    pub fn cluster_secret(&self) -> Result<Option<Vec<u8>>, ConfigError> {
        match &self.cluster_secret_file {
            None => Ok(None),
            Some(path) => read_secret_file("cluster_secret_file", path).map(Some),
        }
    }

    /// Checks `keyspaces`: at most [`KEYSPACES_MAX`], ids unique, at most
    /// [`KEYSPACE_ID_MAX`], 0 among them; names unique and well formed; preferred leaders
    /// are members.
    fn validate_keyspaces(&self) -> Result<(), ConfigError> {
        if self.keyspaces.is_empty() {
            return Ok(());
        }
        if self.keyspaces.len() > KEYSPACES_MAX {
            return Err(invalid("keyspaces", format!("at most {KEYSPACES_MAX}")));
        }
        let mut ids = std::collections::BTreeSet::new();
        let mut names = std::collections::BTreeSet::new();
        for ks in &self.keyspaces {
            let field = |f: &str| format!("keyspaces.{}.{f}", ks.id);
            if ks.id > KEYSPACE_ID_MAX {
                return Err(invalid(&field("id"), format!("must be at most {KEYSPACE_ID_MAX}")));
            }
            if !ids.insert(ks.id) {
                return Err(invalid(&field("id"), "two keyspaces share this id"));
            }
            let well_formed = !ks.name.is_empty()
                && ks.name.len() <= KEYSPACE_NAME_BYTES_MAX
                && ks.name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            if !well_formed {
                let reason = format!("1 to {KEYSPACE_NAME_BYTES_MAX} letters, digits, '-' or '_'");
                return Err(invalid(&field("name"), reason));
            }
            if !names.insert(ks.name.as_str()) {
                return Err(invalid(&field("name"), "two keyspaces share this name"));
            }
            if ks.preferred_leader.is_some_and(|p| self.members.iter().all(|m| m.id != p)) {
                return Err(invalid(&field("preferred_leader"), "not a member"));
            }
            self.validate_placement(ks)?;
        }
        if !ids.contains(&0) {
            return Err(invalid("keyspaces", "keyspace 0 must exist (connections start there)"));
        }
        if !self.keyspaces.iter().any(|ks| self.hosts(ks)) {
            let reason = format!("node {} is among no keyspace's replicas", self.node_id);
            return Err(invalid("keyspaces", reason));
        }
        self.validate_slots()
    }

    /// Checks one keyspace's `replicas`: members, each once, of a leader engine's
    /// keyspace, its preferred leader among them (their count is the engine's to check).
    fn validate_placement(&self, ks: &KeyspaceSettings) -> Result<(), ConfigError> {
        let field = |f: &str| format!("keyspaces.{}.{f}", ks.id);
        let leader = crate::engines::pack(ks.engine).leader;
        if ks.slots.is_some() && !leader {
            return Err(invalid(&field("slots"), "only ORCA keyspaces are sharded"));
        }
        let Some(replicas) = &ks.replicas else { return Ok(()) };
        if !leader {
            let reason =
                "only ORCA keyspaces are placed on replica groups (the others run on every member)";
            return Err(invalid(&field("replicas"), reason));
        }
        if replicas.is_empty() {
            // A group this node does not host is not checked by its engine's validation.
            return Err(invalid(&field("replicas"), "names no member"));
        }
        if let Some(r) = replicas.iter().find(|r| self.members.iter().all(|m| m.id != **r)) {
            return Err(invalid(&field("replicas"), format!("{r} is not a member")));
        }
        let mut unique = replicas.clone();
        unique.sort_unstable();
        unique.dedup();
        if unique.len() != replicas.len() {
            return Err(invalid(&field("replicas"), "a member named twice"));
        }
        if ks.preferred_leader.is_some_and(|p| !replicas.contains(&p)) {
            return Err(invalid(&field("preferred_leader"), "not one of its replicas"));
        }
        Ok(())
    }

    /// Checks the slots of a sharded cluster: when a keyspace names slots, every one
    /// does, together each slot once, and every member says where its clients connect.
    fn validate_slots(&self) -> Result<(), ConfigError> {
        if self.keyspaces.iter().all(|ks| ks.slots.is_none()) {
            return Ok(());
        }
        let mut seen = keel_wire::slots::SlotRanges::default();
        for ks in &self.keyspaces {
            let field = format!("keyspaces.{}.slots", ks.id);
            let Some(text) = &ks.slots else {
                return Err(invalid(&field, "in a sharded cluster every keyspace names its slots"));
            };
            let slots =
                keel_wire::slots::SlotRanges::parse(text).map_err(|r| invalid(&field, r))?;
            if !slots.disjoint(&seen) {
                return Err(invalid(&field, "a slot another keyspace serves"));
            }
            seen = keel_wire::slots::SlotRanges::from_ranges(
                seen.ranges().iter().chain(slots.ranges()).copied(),
            );
        }
        if seen != keel_wire::slots::SlotRanges::all() {
            let reason = format!(
                "the keyspaces' slots leave some of the {} unserved (served: {seen})",
                keel_wire::slots::SLOTS
            );
            return Err(invalid("keyspaces", reason));
        }
        if let Some(m) = self.members.iter().find(|m| m.client_addr.is_none()) {
            let reason = "needed in a sharded cluster (MOVED and CLUSTER SLOTS name it)";
            return Err(invalid(&format!("members.{}.client_addr", m.id), reason));
        }
        Ok(())
    }

    /// The keyspaces as configured: `keyspaces`, or one ORCA keyspace 0 without them.
    pub fn keyspace_settings(&self) -> Vec<KeyspaceSettings> {
        match self.keyspaces.is_empty() {
            true => vec![KeyspaceSettings::orca(0)],
            false => self.keyspaces.clone(),
        }
    }

    /// The members that host keyspace `ks`, in id order: its `replicas`, else every
    /// member.
    pub fn replicas_of(&self, ks: &KeyspaceSettings) -> Vec<NodeId> {
        let mut ids: Vec<NodeId> = match &ks.replicas {
            Some(replicas) => replicas.iter().copied().map(NodeId).collect(),
            None => self.members.iter().map(|m| NodeId(m.id)).collect(),
        };
        ids.sort_unstable();
        ids
    }

    /// Whether this node hosts keyspace `ks`.
    pub fn hosts(&self, ks: &KeyspaceSettings) -> bool {
        ks.replicas.as_ref().is_none_or(|r| r.contains(&self.node_id))
    }

    /// The voters keyspace `ks` starts with while its log names none: its replicas that
    /// are `voters` (all of them without `voters`); without replicas, [`Self::voter_ids`].
    fn keyspace_voters(&self, ks: &KeyspaceSettings) -> Vec<NodeId> {
        match &ks.replicas {
            None => self.voter_ids(),
            Some(_) => self
                .replicas_of(ks)
                .into_iter()
                .filter(|id| self.voters.as_ref().is_none_or(|v| v.contains(&id.0)))
                .collect(),
        }
    }

    /// The member each leader-engine keyspace prefers as its leader, by keyspace id: its
    /// `preferred_leader`, else, with several such keyspaces, the replica preferred by
    /// the fewest keyspaces before it in id order (the lowest id among equals), which
    /// spreads leaders over the members; with one, none.
    pub fn preferred_leaders(&self) -> BTreeMap<u32, NodeId> {
        let mut settings = self.keyspace_settings();
        settings.retain(|k| crate::engines::pack(k.engine).leader);
        settings.sort_by_key(|k| k.id);
        let several = settings.len() > 1;
        let mut load: BTreeMap<NodeId, usize> = BTreeMap::new();
        let mut out = BTreeMap::new();
        for ks in &settings {
            let chosen = match ks.preferred_leader {
                Some(p) => Some(NodeId(p)),
                None if several => {
                    let voters = self.keyspace_voters(ks);
                    voters.into_iter().min_by_key(|id| (load.get(id).copied().unwrap_or(0), *id))
                }
                None => None,
            };
            if let Some(leader) = chosen {
                *load.entry(leader).or_default() += 1;
                out.insert(ks.id, leader);
            }
        }
        out
    }

    /// The keyspaces this node runs, resolved: ids, kinds, storage directories (keyspace
    /// 0 in `data_dir` itself, keyspace `k` in `data_dir/keyspace-k`) and engine
    /// configurations (the `[engine]` settings with each keyspace's defaults, and leaders
    /// spread over the members when there are several leader-engine keyspaces: a Kite
    /// keyspace, leaderless, does not make one ORCA keyspace prefer a leader).
    pub fn keyspace_specs(&self) -> Result<Vec<KeyspaceSpec>, ConfigError> {
        let leaders = self.preferred_leaders();
        let settings = self.keyspace_settings();
        let mut specs = Vec::with_capacity(settings.len());
        for ks in settings.into_iter().filter(|ks| self.hosts(ks)) {
            let mut config = self.engine_config_for(self.keyspace_voters(&ks), false)?;
            let field = |f: &str| format!("keyspaces.{}.{f}", ks.id);
            (crate::engines::pack(ks.engine).check_settings)(self, &ks)?;
            config.durability_default = ks.durability_default.unwrap_or(config.durability_default);
            config.read_level_default = ks.read_level_default.unwrap_or(config.read_level_default);
            config.preferred_leader = leaders.get(&ks.id).copied();
            let checked = match crate::engines::pack(ks.engine).leader {
                true => config.validate(),
                false => config.validate_settings(),
            };
            checked.map_err(|e| invalid(&field(e.field), e.reason.clone()))?;
            let data_dir = if ks.id == 0 {
                self.data_dir.clone()
            } else {
                self.data_dir.join(format!("keyspace-{}", ks.id))
            };
            specs.push(KeyspaceSpec {
                id: KeyspaceId(ks.id),
                name: ks.name,
                engine: ks.engine,
                data_dir,
                config,
            });
        }
        specs.sort_by_key(|s| s.id);
        Ok(specs)
    }

    /// Checks `geo.peer_delay_ms`: keys are other members' ids, delays at most
    /// [`PEER_DELAY_MS_MAX`].
    fn validate_geo(&self) -> Result<(), ConfigError> {
        for (i, pair) in self.geo.conflicts.iter().enumerate() {
            if pair.iter().any(|l| l.is_empty() || l.len() > keel_types::geo::LABEL_MAX) {
                let why = format!("labels of 1 to {} bytes", keel_types::geo::LABEL_MAX);
                return Err(invalid(&format!("geo.conflicts[{i}]"), why));
            }
        }
        if self.geo.central_certifier && !self.geo.strong {
            return Err(invalid("geo.central_certifier", "needs geo.strong = true"));
        }
        if self.geo.spread_leaders && !self.geo.strong {
            return Err(invalid("geo.spread_leaders", "needs geo.strong = true"));
        }
        if let Some(dc) = &self.geo.leader_dc {
            if self.members.iter().all(|m| m.dc.as_ref() != Some(dc)) {
                return Err(invalid("geo.leader_dc", format!("no member has dc = {dc:?}")));
            }
        }
        for (key, &ms) in &self.geo.peer_delay_ms {
            let field = format!("geo.peer_delay_ms.{key}");
            let id: u32 = key.parse().map_err(|_| invalid(&field, "key is not a member id"))?;
            if id == self.node_id || self.members.iter().all(|m| m.id != id) {
                return Err(invalid(&field, format!("{id} is not another member")));
            }
            if ms > PEER_DELAY_MS_MAX {
                return Err(invalid(&field, format!("must be at most {PEER_DELAY_MS_MAX} ms")));
            }
        }
        Ok(())
    }

    /// The extra time added to every log fsync (zero unless
    /// `storage.emulated_fsync_delay_us` is set).
    pub fn emulated_fsync_delay(&self) -> std::time::Duration {
        std::time::Duration::from_micros(self.storage.emulated_fsync_delay_us)
    }

    /// The one-way delay of messages from this node to member `to` (zero unless
    /// `geo.peer_delay_ms` names it).
    pub fn peer_delay(&self, to: u32) -> std::time::Duration {
        let ms = self.geo.peer_delay_ms.get(&to.to_string()).copied().unwrap_or(0);
        assert!(ms <= PEER_DELAY_MS_MAX, "validated: delays are bounded");
        std::time::Duration::from_millis(ms)
    }

    /// The engine configuration, validated by the engine's own rules.
    pub fn engine_config(&self) -> Result<EngineConfig, ConfigError> {
        self.engine_config_for(self.voter_ids(), self.voters_matter())
    }

    /// [`Self::engine_config`] for a keyspace whose voters are `voters`, with them
    /// checked (`members`: a count the engine accepts) or not.
    fn engine_config_for(
        &self,
        voters: Vec<NodeId>,
        members: bool,
    ) -> Result<EngineConfig, ConfigError> {
        let mut config = EngineConfig::new(NodeId(self.node_id), voters.clone());
        config.joining = !voters.contains(&NodeId(self.node_id));
        let e = &self.engine;
        let ms = |v: Option<u64>, d: Span| v.map_or(d, Span::from_millis);
        config.heartbeat_interval = ms(e.heartbeat_interval_ms, config.heartbeat_interval);
        config.mark_out_timeout = ms(e.mark_out_timeout_ms, config.mark_out_timeout);
        config.removal_timeout = ms(e.removal_timeout_ms, config.removal_timeout);
        config.election_timeout_min = ms(e.election_timeout_min_ms, config.election_timeout_min);
        config.election_timeout_max = ms(e.election_timeout_max_ms, config.election_timeout_max);
        config.flush_interval = ms(e.flush_interval_ms, config.flush_interval);
        config.request_timeout = ms(e.request_timeout_ms, config.request_timeout);
        config.dedup_clients_max = e.dedup_clients_max.unwrap_or(config.dedup_clients_max);
        config.durability_default = e.durability_default.unwrap_or(config.durability_default);
        config.read_level_default = e.read_level_default.unwrap_or(config.read_level_default);
        config.follower_reads = e.follower_reads.unwrap_or(config.follower_reads);
        config.limits = Limits {
            key_bytes_max: e.key_bytes_max.unwrap_or(config.limits.key_bytes_max),
            value_bytes_max: e.value_bytes_max.unwrap_or(config.limits.value_bytes_max),
            ..config.limits
        };
        config.snapshot_entries_threshold =
            e.snapshot_entries_threshold.unwrap_or(config.snapshot_entries_threshold);
        config.snapshot_log_percent = e.snapshot_log_percent.unwrap_or(config.snapshot_log_percent);
        config.snapshot_chunk_bytes = e.snapshot_chunk_bytes.unwrap_or(config.snapshot_chunk_bytes);
        config.append_bytes_max = e.append_bytes_max.unwrap_or(config.append_bytes_max);
        config.state_bytes_max = e.state_bytes_max.unwrap_or(config.state_bytes_max);
        config.snapshot_slice_interval =
            ms(e.snapshot_slice_interval_ms, config.snapshot_slice_interval);
        config.pending_requests_max = e.pending_requests_max.unwrap_or(config.pending_requests_max);
        config.wall_clock_origin_ms = crate::driver::wall_clock_origin_ms();
        // The members matter to leader-engine keyspaces only: a node of geo or Kite
        // keyspaces alone may have any number of them (a geo deployment: 2f + 1 data
        // centers of any size).
        let checked = match members {
            true => config.validate(),
            false => config.validate_settings(),
        };
        checked.map_err(|e| invalid(&format!("engine.{}", e.field), e.reason.clone()))?;
        Ok(config)
    }

    /// Whether the cluster-wide voters make a leader-engine keyspace's membership: one
    /// runs on every member (no `replicas`). Placed keyspaces take their replicas'.
    fn voters_matter(&self) -> bool {
        self.keyspace_settings()
            .iter()
            .any(|k| crate::engines::pack(k.engine).leader && k.replicas.is_none())
    }

    /// The configured voters of ORCA keyspaces (`voters`, else every member), in id order.
    pub fn voter_ids(&self) -> Vec<NodeId> {
        let mut ids: Vec<NodeId> = match &self.voters {
            Some(voters) => voters.iter().copied().map(NodeId).collect(),
            None => self.members.iter().map(|m| NodeId(m.id)).collect(),
        };
        ids.sort_unstable();
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn a_secret_file_is_private_to_its_owner_or_group_readable_under_root() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let path = std::env::temp_dir().join(format!("keel-private-{}", std::process::id()));
        std::fs::write(&path, "secret").unwrap();
        let with_mode = |mode: u32| {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            std::fs::metadata(&path).unwrap()
        };
        assert!(private_file(&with_mode(0o600)));
        assert!(private_file(&with_mode(0o400)));
        assert!(!private_file(&with_mode(0o604)), "others may read");
        assert!(!private_file(&with_mode(0o660)), "the group may write");
        let meta = with_mode(0o640);
        assert_eq!(private_file(&meta), meta.uid() == 0, "group-readable only under root");
        std::fs::remove_file(&path).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn a_configuration_with_password_hashes_readable_by_others_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("keel-config-{}", std::process::id()));
        let mut config = ServerConfig::local(3, 1, 7000, &dir);
        let path = std::env::temp_dir().join(format!("keel-users-{}.toml", std::process::id()));
        let write = |config: &ServerConfig, mode: u32| {
            std::fs::write(&path, config.to_toml()).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        write(&config, 0o644);
        assert!(ServerConfig::from_file(&path).is_ok(), "no secret in it");
        config.users.push(crate::acl::UserSettings {
            name: "admin".into(),
            password_hash: "pbkdf2-sha256$1000$00$00".into(),
            permissions: vec![crate::acl::Category::Admin],
            keyspaces: None,
        });
        write(&config, 0o644);
        let refused = ServerConfig::from_file(&path).unwrap_err().to_string();
        assert!(refused.contains("readable by others (chmod 600 it)"), "{refused}");
        write(&config, 0o600);
        assert_eq!(ServerConfig::from_file(&path).unwrap().users.len(), 1);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_central_certifier_needs_strong_transactions_and_round_trips() {
        let mut config = ServerConfig::local(3, 1, 7379, Path::new("/tmp/keel"));
        crate::local::geo_layout(&mut config, 3, 1);
        config.geo.central_certifier = true;
        let refused = config.validate().unwrap_err().to_string();
        assert!(refused.contains("geo.central_certifier"), "{refused}");
        config.geo.strong = true;
        config.validate().unwrap();
        assert!(config.to_toml().contains("central_certifier = true"));
        assert_eq!(ServerConfig::from_toml(&config.to_toml()).unwrap(), config);
    }

    #[test]
    fn spread_leaders_need_strong_transactions_and_round_trip() {
        let mut config = ServerConfig::local(3, 1, 7379, Path::new("/tmp/keel"));
        crate::local::geo_layout(&mut config, 3, 1);
        config.geo.spread_leaders = true;
        let refused = config.validate().unwrap_err().to_string();
        assert!(refused.contains("geo.spread_leaders"), "{refused}");
        config.geo.strong = true;
        config.validate().unwrap();
        assert!(config.to_toml().contains("spread_leaders = true"));
        assert_eq!(ServerConfig::from_toml(&config.to_toml()).unwrap(), config);
    }

    #[test]
    fn a_peer_address_is_an_ip_or_a_dns_name_with_a_port() {
        let parse = |t: &str| t.parse::<PeerAddr>();
        let named = parse("keel-0.keel.default.svc.cluster.local:7479").unwrap();
        assert_eq!(named, PeerAddr::Name("keel-0.keel.default.svc.cluster.local".into(), 7479));
        assert_eq!(named.ip(), None);
        assert_eq!(named.listen_addr(), "0.0.0.0:7479".parse().unwrap());
        assert!(!named.is_loopback() && parse("LocalHost:1").unwrap().is_loopback());
        let ip = parse("[::1]:7479").unwrap();
        assert_eq!(ip, PeerAddr::Ip("[::1]:7479".parse().unwrap()));
        assert_eq!(ip.listen_addr(), "[::1]:7479".parse().unwrap());
        for bad in ["keel-0", "keel-0:", "keel-0:0", "-keel:1", "ke_el:1", "a..b:1", "a/b:1", ":1"]
        {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert!(parse(&format!("{}:1", "a".repeat(64))).is_err(), "a label past 63 bytes");
        // Named members: the secret is required (they are not loopback), and the
        // configuration round-trips through TOML.
        let mut config = ServerConfig::local(3, 1, 7379, Path::new("/tmp/keel"));
        for m in &mut config.members {
            m.peer_addr = parse(&format!("keel-{}.keel:7479", m.id)).unwrap();
        }
        assert!(config.validate().unwrap_err().to_string().contains("cluster_secret_file"));
        config.cluster_secret_file = Some("/etc/keel/cluster.secret".into());
        config.validate().unwrap();
        assert_eq!(ServerConfig::from_toml(&config.to_toml()).unwrap(), config);
        assert!(config.to_toml().contains("peer_addr = \"keel-1.keel:7479\""));
    }

    #[test]
    fn the_bulk_runtime_has_a_quarter_of_the_runtime_threads_and_at_least_one() {
        assert_eq!(runtime_threads(Some(8)), 8);
        assert_eq!(runtime_threads(Some(1)), 1);
        assert!(runtime_threads(None) >= machine_cores().max(WORKER_THREADS_MIN));
        assert_eq!(bulk_threads(2), 1);
        assert_eq!(bulk_threads(8), 2);
        assert_eq!(bulk_threads(16), 4);
    }

    #[test]
    fn worker_threads_are_one_per_core_unless_set_and_at_least_one() {
        let mut config = ServerConfig::local(3, 1, 7379, Path::new("/tmp/keel"));
        assert_eq!(config.worker_threads, None);
        assert!(!config.to_toml().contains("worker_threads"), "absent: one per core");
        config.cluster_secret_file = Some("/etc/keel/cluster.secret".into());
        for bad in [0, 1025] {
            config.worker_threads = Some(bad);
            assert!(config.validate().unwrap_err().to_string().contains("worker_threads"));
        }
        for good in [1, 2] {
            config.worker_threads = Some(good);
            config.validate().unwrap();
        }
        assert_eq!(ServerConfig::from_toml(&config.to_toml()).unwrap(), config);
    }

    #[test]
    fn a_test_clock_outside_the_drift_bound_is_refused() {
        let mut config = ServerConfig::local(3, 1, 7379, Path::new("/tmp/keel"));
        config.testing.clock_rate_ppm = -CLOCK_RATE_PPM_MAX;
        config.testing.clock_offset_ms = CLOCK_OFFSET_MS_MAX;
        config.validate().unwrap();
        assert!(!config.testing.is_off());
        config.testing.clock_rate_ppm = CLOCK_RATE_PPM_MAX + 1;
        assert!(config.validate().unwrap_err().to_string().contains("clock_rate_ppm"));
        config.testing.clock_rate_ppm = 0;
        config.testing.clock_offset_ms = CLOCK_OFFSET_MS_MAX + 1;
        assert!(config.validate().unwrap_err().to_string().contains("clock_offset_ms"));
    }

    #[test]
    fn local_config_round_trips_through_toml_and_validates() {
        let config = ServerConfig::local(3, 2, 7379, Path::new("/tmp/keel"));
        config.validate().unwrap();
        let back = ServerConfig::from_toml(&config.to_toml()).unwrap();
        assert_eq!(back, config);
        assert_eq!(config.peer_addr().port(), 7480);
    }

    #[test]
    fn connections_before_authentication_are_bounded_below_connections_max() {
        let mut config = ServerConfig::local(3, 1, 7379, Path::new("/tmp/keel"));
        assert_eq!(config.unauthenticated_max(), 1024 - 128, "an eighth kept for the others");
        assert_eq!(config.client_idle_timeout_ms, 300_000, "idle connections are not kept forever");
        config.unauthenticated_connections_max = Some(config.connections_max);
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("unauthenticated_connections_max"), "{err}");
        config.unauthenticated_connections_max = Some(10);
        assert_eq!(config.unauthenticated_max(), 10);
        config.auth_timeout_ms = 10;
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("auth_timeout_ms"), "{err}");
        config.auth_timeout_ms = AUTH_TIMEOUT_MS_DEFAULT;
        config.validate().unwrap();
        config.connections_max = 1;
        config.unauthenticated_connections_max = None;
        assert_eq!(config.unauthenticated_max(), 1, "never none");
    }

    #[test]
    fn tls_and_http_access_settings_go_together() {
        let base = || ServerConfig::local(3, 1, 7379, Path::new("/tmp/keel"));
        let field = |config: &ServerConfig| config.validate().unwrap_err().to_string();
        let mut config = base();
        config.http_addr = Some("0.0.0.0:7579".parse().unwrap());
        assert!(field(&config).contains("`http_addr`"), "{}", field(&config));
        config.http_tls = true;
        assert!(field(&config).contains("`http_tls`"), "{}", field(&config));
        config.tls_cert_file = Some("/etc/keel/node.pem".into());
        config.tls_key_file = Some("/etc/keel/node.key".into());
        assert!(field(&config).contains("`http_addr`"), "no token yet: {}", field(&config));
        config.http_token_file = Some("/etc/keel/http.token".into());
        config.validate().unwrap();
        let mut config = base();
        config.tls_cert_file = Some("/etc/keel/node.pem".into());
        config.tls_key_file = Some("/etc/keel/node.key".into());
        assert!(field(&config).contains("neither client_tls_addr nor http_tls"));
        config.client_tls_addr = Some(config.client_addr);
        assert!(field(&config).contains("another listener's address"));
        config.client_tls_addr = Some("127.0.0.1:7679".parse().unwrap());
        config.client_plaintext = false;
        config.validate().unwrap();
        let mut config = base();
        config.client_plaintext = false;
        assert!(field(&config).contains("`client_plaintext`"));
        let back = ServerConfig::from_toml(&base().to_toml()).unwrap();
        assert!(back.client_plaintext && !back.http_tls);
    }

    #[test]
    fn errors_name_the_field() {
        let mut config = ServerConfig::local(3, 1, 7379, Path::new("/tmp/keel"));
        config.node_id = 9;
        assert!(config.validate().unwrap_err().to_string().contains("`node_id`"));
        let mut config = ServerConfig::local(3, 1, 7379, Path::new("/tmp/keel"));
        config.peer_queue_max = 0;
        assert!(config.validate().unwrap_err().to_string().contains("`peer_queue_max`"));
        let mut config = ServerConfig::local(3, 1, 7379, Path::new("/tmp/keel"));
        config.engine.heartbeat_interval_ms = Some(1000);
        let text = config.validate().unwrap_err().to_string();
        assert!(text.contains("engine.heartbeat_interval"), "{text}");
    }

    #[test]
    fn emulated_fsync_delay_parses_validates_and_defaults_off() {
        let config = ServerConfig::local(3, 1, 7379, Path::new("/tmp/keel"));
        assert!(config.storage.is_off());
        assert_eq!(config.emulated_fsync_delay(), std::time::Duration::ZERO);
        assert!(!config.to_toml().contains("storage"), "off by default, not written");
        let text = format!("{}\n[storage]\nemulated_fsync_delay_us = 1500\n", config.to_toml());
        let config = ServerConfig::from_toml(&text).unwrap();
        config.validate().unwrap();
        assert_eq!(config.emulated_fsync_delay(), std::time::Duration::from_micros(1500));
        assert_eq!(ServerConfig::from_toml(&config.to_toml()).unwrap(), config);
        let mut bad = config.clone();
        bad.storage.emulated_fsync_delay_us = EMULATED_FSYNC_DELAY_US_MAX + 1;
        let err = bad.validate().unwrap_err().to_string();
        assert!(err.contains("`storage.emulated_fsync_delay_us`"), "{err}");
    }

    #[test]
    fn geo_delays_parse_validate_and_default_off() {
        let config = ServerConfig::local(5, 1, 7379, Path::new("/tmp/keel"));
        assert!(config.geo.is_off());
        assert!(!config.to_toml().contains("geo"), "off by default, not written");
        let text =
            format!("{}\n[geo]\npeer_delay_ms = {{ \"2\" = 1, \"3\" = 17 }}\n", config.to_toml());
        let config = ServerConfig::from_toml(&text).unwrap();
        config.validate().unwrap();
        assert_eq!(config.peer_delay(3), std::time::Duration::from_millis(17));
        assert_eq!(config.peer_delay(4), std::time::Duration::ZERO);
        assert_eq!(ServerConfig::from_toml(&config.to_toml()).unwrap(), config);
        for (key, ms) in [("3", PEER_DELAY_MS_MAX + 1), ("1", 5), ("9", 5), ("x", 5)] {
            let mut bad = config.clone();
            bad.geo.peer_delay_ms.insert(key.to_string(), ms);
            let err = bad.validate().unwrap_err().to_string();
            assert!(err.contains(&format!("`geo.peer_delay_ms.{key}`")), "{err}");
        }
    }

    #[test]
    fn keyspaces_resolve_with_their_defaults_directories_and_spread_leaders() {
        let mut config = ServerConfig::local(3, 1, 7379, Path::new("/tmp/keel"));
        let specs = config.keyspace_specs().unwrap();
        assert_eq!(specs.len(), 1, "without the section: one keyspace");
        assert_eq!(specs[0].data_dir, Path::new("/tmp/keel/n1"), "keyspace 0 keeps the old place");
        assert_eq!(specs[0].config.preferred_leader, None, "one keyspace prefers no leader");
        let text = format!(
            "{}\n[[keyspaces]]\nid = 0\nname = \"default\"\n[[keyspaces]]\nid = 2\nname = \"sessions\"\n\
             durability_default = \"durable\"\n[[keyspaces]]\nid = 1\nname = \"ks1\"\nengine = \"orca\"\n",
            config.to_toml()
        );
        config = ServerConfig::from_toml(&text).unwrap();
        config.validate().unwrap();
        let specs = config.keyspace_specs().unwrap();
        let ids: Vec<u32> = specs.iter().map(|s| s.id.0).collect();
        assert_eq!(ids, [0, 1, 2]);
        assert_eq!(specs[2].data_dir, Path::new("/tmp/keel/n1/keyspace-2"));
        assert_eq!(specs[2].config.durability_default, Durability::Durable);
        assert_eq!(specs[1].config.durability_default, Durability::Memory);
        let leaders: Vec<Option<NodeId>> =
            specs.iter().map(|s| s.config.preferred_leader).collect();
        assert_eq!(leaders, [Some(NodeId(1)), Some(NodeId(2)), Some(NodeId(3))]);
        assert_eq!(ServerConfig::from_toml(&config.to_toml()).unwrap(), config);
        // One leader-engine keyspace beside a Kite one: still no preferred leader.
        config.keyspaces = vec![KeyspaceSettings::orca(0), KeyspaceSettings::kite(1)];
        let specs = config.keyspace_specs().unwrap();
        assert_eq!(specs[0].config.preferred_leader, None, "kite does not count");
    }

    #[test]
    fn bad_keyspaces_are_refused_naming_the_field() {
        let base = ServerConfig::local(3, 1, 7379, Path::new("/tmp/keel"));
        let cases: [(Vec<KeyspaceSettings>, &str); 4] = [
            (vec![KeyspaceSettings::orca(1)], "`keyspaces`"),
            (vec![KeyspaceSettings::orca(0), KeyspaceSettings::orca(0)], "`keyspaces.0.id`"),
            (
                vec![
                    KeyspaceSettings::orca(0),
                    KeyspaceSettings { name: "a b".into(), ..KeyspaceSettings::orca(3) },
                ],
                "`keyspaces.3.name`",
            ),
            (
                vec![KeyspaceSettings { preferred_leader: Some(9), ..KeyspaceSettings::orca(0) }],
                "`keyspaces.0.preferred_leader`",
            ),
        ];
        for (keyspaces, field) in cases {
            let mut config = base.clone();
            config.keyspaces = keyspaces;
            let err = config.validate().unwrap_err().to_string();
            assert!(err.contains(field), "{err}");
        }
        let text =
            format!("{}\n[[keyspaces]]\nid = 0\nname = \"x\"\nengine = \"raft\"\n", base.to_toml());
        assert!(ServerConfig::from_toml(&text).is_err(), "an unknown engine kind is refused");
    }

    #[test]
    fn unknown_fields_are_refused() {
        let config = ServerConfig::local(3, 1, 7379, Path::new("/tmp/keel"));
        let text = format!("{}\nbogus = 1\n", config.to_toml());
        let err = ServerConfig::from_toml(&text).unwrap_err().to_string();
        assert!(err.contains("bogus"), "{err}");
    }
}
