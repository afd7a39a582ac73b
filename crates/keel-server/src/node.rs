//! Starting and stopping one node: for each keyspace recover its storage, boot its engine
//! and start its engine loop; bind the peer, client and HTTP listeners; run until told to
//! stop or until a keyspace's storage fails.
//!
//! Tasks and threads of a node with `k` keyspaces: `k` engine loops (tasks, so several
//! keyspaces use several cores), `k` storage threads, one sender task per peer and one
//! receiver task per inbound peer connection (every keyspace's messages share them), the
//! client and HTTP listeners, a pair of tasks per client connection, and the bulk
//! runtime's threads.
//!
//! Everything runs on one tokio runtime with a worker thread per core (`keel-worker`;
//! `worker_threads` sets how many, at least one, and a local cluster gives each node its
//! share of the cores, one each for three nodes on two cores):
//! a write's path (connection, engine loop, peer links, reply) crosses no runtime. So that
//! client work does not hold back the loops' heartbeats, no client task runs long between
//! two yields: a reply is written at most `front_door::WRITE_SLICE_BYTES` at a time, reads
//! of a socket yield under tokio's cooperative budget, and a flush longer than
//! `front_door::BULK_WRITE_MIN` is written from a small runtime of its own ([`BulkRuntime`],
//! `keel-bulk`), so that a flood of large replies does not queue ahead of the loops
//! (with slices alone it deposed a leader in 1 run of 9; `docs/performance.md`). (With
//! the loops and peer links on a runtime of their own, as until 2026-11-28, a leader under `SET` made 0.75 context
//! switches per write against 0.29 on one runtime; `docs/performance.md`.)

use crate::config::{KeyspaceSpec, ServerConfig};
use crate::driver::{monotonic_now, Driver, KeyspaceHandle, Keyspaces, Wiring};
use crate::front_door::FrontDoor;
use crate::handshake::ClusterKey;
use crate::metrics::{KeyspaceMetrics, Metrics};
use crate::peer::{Inbox, Inboxes, Jitter, LinkSettings, PeerQueues, TypedInbox};
use crate::storage::StartError;
use crate::unauthenticated::Unauthenticated;
use keel_core::engine::{Engine, PersistedState};
use keel_storage::StorageError;
use keel_types::NodeId;
use keel_wire::peer::{PeerLimits, PeerMessage};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, Semaphore};

/// Why a node stopped other than by request.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The configuration is invalid (fix it; not retryable).
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The node could not start (a port in use, an unreadable data directory, persisted
    /// state the engine refuses).
    #[error("startup failed: {0}")]
    Startup(String),
    /// The storage failed: the node stopped to protect the data (restart it to recover).
    #[error("storage failure, node stopped: {0}")]
    Storage(String),
}

impl NodeError {
    /// The process exit code for this error: 1 config, 3 startup, 4 storage.
    pub fn exit_code(&self) -> u8 {
        match self {
            NodeError::Config(_) => 1,
            NodeError::Startup(_) => 3,
            NodeError::Storage(_) => 4,
        }
    }
}

/// A seed nobody else has: wall-clock nanoseconds mixed with the process id. Used for
/// election timeouts, client ids and jitter, which need spread, not secrecy.
pub fn fresh_seed() -> u64 {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    Jitter::new(nanos ^ (u64::from(std::process::id()) << 32)).next_u64()
}

/// The runtime that writes clients' long flushes (`front_door::BULK_WRITE_MIN`), apart from
/// the runtime of the engine loops, peer links and connections: a quarter of the node's
/// runtime threads, at least one. Shut down without waiting when the node stops (a
/// runtime may not be dropped from another's task).
struct BulkRuntime(Option<tokio::runtime::Runtime>);

impl BulkRuntime {
    fn start(config: &ServerConfig) -> BulkRuntime {
        let threads =
            crate::config::bulk_threads(crate::config::runtime_threads(config.worker_threads));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads as usize)
            .thread_name("keel-bulk")
            .enable_all()
            .build();
        match runtime {
            Ok(runtime) => BulkRuntime(Some(runtime)),
            Err(e) => {
                // Long flushes are then written from the connections' own tasks.
                tracing::warn!(reason = %e, "no bulk runtime");
                BulkRuntime(None)
            }
        }
    }

    fn handle(&self) -> Option<tokio::runtime::Handle> {
        self.0.as_ref().map(|runtime| runtime.handle().clone())
    }
}

impl Drop for BulkRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// File descriptors a node keeps beyond one per client connection: listeners, the
/// runtime, logs, snapshots being written and read, and slack.
pub const DESCRIPTORS_RESERVED: u64 = 256;

/// File descriptors `config` may need at once: every client connection it admits, peer
/// links both ways and the peer port's pool of connections without a verified hello,
/// and each keyspace's log segments and snapshot files.
pub fn descriptors_needed(config: &ServerConfig) -> u64 {
    let keyspaces = config.keyspaces.len().max(1) as u64;
    u64::from(config.connections_max)
        + 4 * config.members.len() as u64
        + u64::from(config.peer_pending_max)
        + 16 * keyspaces
        + DESCRIPTORS_RESERVED
}

/// Raises the soft limit on open files to what `config` needs, or refuses a
/// configuration the hard limit cannot meet (naming `connections_max`): a node that runs
/// out of descriptors stops accepting clients and fails its next snapshot.
fn ensure_descriptors(config: &ServerConfig) -> Result<(), NodeError> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource, RLIM_INFINITY};
    let needed = descriptors_needed(config);
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)
        .map_err(|e| NodeError::Startup(format!("cannot read the open-files limit: {e}")))?;
    if soft >= needed {
        return Ok(());
    }
    if hard != RLIM_INFINITY && hard < needed {
        let reason = format!(
            "{} connections need about {needed} file descriptors, and this process may open at most {hard} (ulimit -Hn): lower connections_max or raise the limit",
            config.connections_max
        );
        return Err(NodeError::Config(crate::config::ConfigError::Invalid {
            field: "connections_max".into(),
            reason,
        }));
    }
    setrlimit(Resource::RLIMIT_NOFILE, needed, hard)
        .map_err(|e| NodeError::Startup(format!("cannot raise the open-files limit: {e}")))?;
    tracing::info!(from = soft, to = needed, "raised the open-files limit");
    Ok(())
}

/// A keyspace's engine loop, ready to run.
type Loop = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// What starting one keyspace produced.
pub(crate) struct Started {
    handle: KeyspaceHandle,
    inbox: Box<dyn Inbox>,
    run: Loop,
}

/// What every keyspace of a node shares.
pub(crate) struct Shared<'a> {
    pub(crate) config: &'a ServerConfig,
    peers: Arc<PeerQueues>,
    limits: PeerLimits,
    node_metrics: Arc<Metrics>,
    forwarded_replies: Arc<keel_exec::ByteBudget>,
    broker: Arc<crate::pubsub::Broker>,
    shutdown: watch::Receiver<bool>,
}

/// Peer frames no larger than this are accepted whatever the configuration: room for a
/// forwarded reply (a scan's values), which the engine's own bound does not cover.
const PEER_FRAME_BYTES_FLOOR: u64 = 64 << 20;

/// The peer links' settings: the cluster key, the frame limit (the largest message any
/// keyspace's configuration can send, at least [`PEER_FRAME_BYTES_FLOOR`]) and the
/// handshake, idle and pending bounds.
fn link_settings(
    config: &ServerConfig,
    specs: &[crate::config::KeyspaceSpec],
) -> Result<LinkSettings, NodeError> {
    let key = match config.cluster_secret()? {
        Some(secret) => ClusterKey::new(&secret),
        None => ClusterKey::none(),
    };
    let largest = specs.iter().map(|spec| spec.config.peer_message_bytes_max()).max();
    let frame = largest.unwrap_or(0).max(PEER_FRAME_BYTES_FLOOR);
    let limits = PeerLimits {
        frame_bytes_max: u32::try_from(frame).unwrap_or(u32::MAX),
        protocol: config.testing.peer_protocol.unwrap_or(keel_wire::peer::PEER_PROTOCOL),
        ..PeerLimits::default()
    };
    let ms = std::time::Duration::from_millis;
    Ok(LinkSettings {
        key,
        limits,
        handshake_timeout: ms(config.peer_handshake_timeout_ms),
        idle_timeout: ms(config.peer_idle_timeout_ms),
        pending_max: config.peer_pending_max as usize,
    })
}

/// A placed or sharded cluster's placement and the leaders this node hears of (`None`:
/// every keyspace is on every member, and nothing is sharded).
struct Placed(Option<(Arc<crate::placement::Placement>, Arc<crate::leaders::HeardLeaders>)>);

impl Placed {
    fn new(config: &ServerConfig) -> Placed {
        let placement = crate::placement::Placement::new(config);
        let partial = placement.groups.values().any(|g| g.replicas.len() < config.members.len());
        let heard = Arc::new(crate::leaders::HeardLeaders::default());
        Placed((partial || placement.sharded()).then(|| (Arc::new(placement), heard)))
    }

    /// In a sharded cluster, gives every keyspace of `handles` its slot guard (none under
    /// `[testing] unsafe_no_slot_guard`), and makes `broker`'s notifications name
    /// database 0.
    fn guard(
        &self,
        config: &ServerConfig,
        handles: &mut [KeyspaceHandle],
        node_metrics: &Arc<Metrics>,
        broker: &Arc<crate::pubsub::Broker>,
    ) {
        let Some((placement, heard)) = self.0.as_ref().filter(|(p, _)| p.sharded()) else {
            return;
        };
        broker.set_sharded();
        if config.testing.unsafe_no_slot_guard {
            tracing::error!(
                "[testing] unsafe_no_slot_guard is on: keyspaces take keys of slots they do NOT serve (negative-control mode, never for real use)"
            );
            return;
        }
        let hosted: Vec<_> = handles.iter().map(|h| (h.id, h.metrics.clone())).collect();
        for handle in handles {
            let (placement, metrics) = (placement.clone(), node_metrics.clone());
            let guard = crate::placement::SlotGuard::new(
                handle.id,
                placement,
                metrics,
                heard.clone(),
                hosted.clone(),
            );
            handle.guard = Some(Arc::new(guard));
        }
    }

    /// `keyspaces` with the node's pub/sub `broker`, and the placement, if any.
    fn keyspaces(self, keyspaces: Keyspaces, broker: Arc<crate::pubsub::Broker>) -> Keyspaces {
        let keyspaces = keyspaces.with_broker(broker);
        match self.0 {
            Some((placement, heard)) => keyspaces.with_placement(placement).with_heard(heard),
            None => keyspaces,
        }
    }
}

/// Runs a node until `shutdown` is set (`Ok`) or it fails. Call inside a multi-threaded
/// tokio runtime: every task of the node is spawned on it.
pub async fn run(config: ServerConfig, shutdown: watch::Receiver<bool>) -> Result<(), NodeError> {
    config.validate()?;
    ensure_descriptors(&config)?;
    let specs = config.keyspace_specs()?;
    let me = NodeId(config.node_id);
    let node_metrics = Arc::new(Metrics::default());
    let links = Arc::new(link_settings(&config, &specs)?);
    node_metrics.peer_protocol_seen(me, Metrics::OWN_LINK, links.limits.protocol);
    let tls = config.tls_acceptor()?;
    let http_access =
        crate::http::Access::new(config.http_token()?.as_deref(), config.http_tls_acceptor()?);
    apply_testing(&config.testing);
    if config.testing.unsafe_stale_invoke {
        tracing::error!(
            "[testing] unsafe_stale_invoke is on: KEEL.INVOKE final views are NOT coordinated (negative-control mode, never for real use)"
        );
    }
    if config.testing.unsafe_script_skip_watch {
        tracing::error!(
            "[testing] unsafe_script_skip_watch is on: scripts' write-backs are NOT checked against what they read (negative-control mode, never for real use)"
        );
    }
    if !links.key.is_secret() {
        tracing::warn!("no cluster_secret_file: peer links are not authenticated");
    }
    let peers = Arc::new(start_peer_senders(&config, me, &links, &node_metrics));
    let broker = crate::pubsub::Broker::start(Some(peers.clone()), node_metrics.clone());
    let shared = Shared {
        config: &config,
        peers: peers.clone(),
        limits: links.limits.clone(),
        node_metrics: node_metrics.clone(),
        forwarded_replies: Arc::new(keel_exec::ByteBudget::new(
            usize::try_from(config.forwarded_replies_bytes_max).unwrap_or(usize::MAX),
        )),
        broker: broker.clone(),
        shutdown,
    };
    let mut handles = Vec::new();
    let mut inboxes: Inboxes = BTreeMap::new();
    let mut loops = Vec::new();
    for spec in specs {
        let started = (crate::engines::pack(spec.engine).start)(spec.clone(), &shared).await?;
        inboxes.insert(spec.id, started.inbox);
        handles.push(started.handle);
        loops.push(started.run);
    }
    let pubsub_inbox = crate::pubsub::PubSubInbox {
        broker: Arc::downgrade(&broker),
        limits: links.limits.clone(),
    };
    inboxes.insert(crate::pubsub::PUBSUB_KEYSPACE, Box::new(pubsub_inbox));
    let placed = Placed::new(&config);
    let notices = links.limits.protocol >= keel_wire::peer::LEADER_NOTICES_PROTOCOL;
    if let Some((placement, heard)) = placed.0.as_ref().filter(|_| notices) {
        let inbox =
            crate::leaders::LeadersInbox { heard: heard.clone(), placement: placement.clone() };
        inboxes.insert(keel_wire::peer::LEADERS_KEYSPACE, Box::new(inbox));
    }
    let bind = |addr| async move {
        TcpListener::bind(addr)
            .await
            .map_err(|e| NodeError::Startup(format!("cannot listen on {addr}: {e}")))
    };
    let peer_listener = bind(config.peer_listen_addr()).await?;
    let client_listener = match config.client_plaintext {
        true => Some(bind(config.client_addr).await?),
        false => None,
    };
    let tls_listener = match (config.client_tls_addr, &tls) {
        (Some(addr), Some(_)) => Some(bind(addr).await?),
        _ => None,
    };
    let http_listener = match config.http_addr {
        Some(addr) => Some(bind(addr).await?),
        None => None,
    };
    let members: Vec<NodeId> = config.members.iter().map(|m| NodeId(m.id)).collect();
    let inboxes = Arc::new(inboxes);
    let metrics = node_metrics.clone();
    tokio::spawn(crate::peer::listener(me, peer_listener, inboxes, members, links, metrics));
    placed.guard(&config, &mut handles, &node_metrics, &broker);
    let keyspaces = Arc::new(placed.keyspaces(Keyspaces::new(handles, node_metrics, me), broker));
    if keyspaces.placement().is_some() && notices {
        tokio::spawn(crate::leaders::announce(Arc::downgrade(&keyspaces), peers));
    }
    let bulk = BulkRuntime::start(&config);
    let door = front_door(&config, &keyspaces, bulk.handle())?;
    if let Some(listener) = client_listener {
        tokio::spawn(crate::front_door::serve(listener, door.clone(), None));
    }
    if let Some(listener) = tls_listener {
        tokio::spawn(crate::front_door::serve(listener, door, tls));
    }
    if let Some(listener) = http_listener {
        tokio::spawn(crate::http::serve(listener, keyspaces.clone(), http_access));
    }
    tracing::info!(node = %me, clients = ?config.client_plaintext.then_some(config.client_addr), tls = ?config.client_tls_addr, peers = %config.peer_addr(),
        http = ?config.http_addr, keyspaces = keyspaces.iter().count(), "serving");
    let result = tokio::spawn(run_loops(loops))
        .await
        .unwrap_or_else(|e| Err(format!("the engine loops ended abnormally: {e}")))
        .map_err(NodeError::Storage);
    tracing::info!(node = %me, ok = result.is_ok(), "stopped");
    result
}

/// The client front door of a node serving `keyspaces`: its users and logins, its bounds
/// on connections, requests and replies, and the runtime (`bulk`) large replies are
/// encoded on.
fn front_door(
    config: &ServerConfig,
    keyspaces: &Arc<Keyspaces>,
    bulk: Option<tokio::runtime::Handle>,
) -> Result<Arc<FrontDoor>, NodeError> {
    let limits = shared_limits(config)?;
    let users = Arc::new(crate::acl::Users::new(&config.users).map_err(|reason| {
        NodeError::Config(crate::config::ConfigError::Invalid { field: "users".into(), reason })
    })?);
    let loopback_only = config.protected_mode && !users.required();
    if loopback_only && !config.client_addr.ip().is_loopback() {
        tracing::warn!("protected mode: no [[users]], so only loopback clients are served");
    }
    let login = Arc::new(crate::login::Login::new(users.clone(), keyspaces.node_metrics.clone()));
    tokio::spawn(crate::login::log_failures(Arc::downgrade(&login)));
    let unauthenticated = users.required().then(|| {
        let max = config.unauthenticated_max() as usize;
        Arc::new(Unauthenticated::new(max, keyspaces.node_metrics.clone()))
    });
    Ok(Arc::new(FrontDoor {
        bulk,
        login,
        auth_timeout: std::time::Duration::from_millis(config.auth_timeout_ms),
        unauthenticated,
        loopback_only,
        keyspaces: keyspaces.clone(),
        limits,
        pipeline_depth_max: config.pipeline_depth_max as usize,
        partial_request_timeout: std::time::Duration::from_millis(
            config.partial_request_timeout_ms,
        ),
        output_timeout: std::time::Duration::from_millis(config.client_output_timeout_ms),
        request_buffers: Arc::new(keel_exec::ByteBudget::new(
            usize::try_from(config.client_request_buffers_bytes_max).unwrap_or(usize::MAX),
        )),
        idle_timeout: (config.client_idle_timeout_ms > 0)
            .then(|| std::time::Duration::from_millis(config.client_idle_timeout_ms)),
        slots: Arc::new(Semaphore::new(config.connections_max as usize)),
        send_buffer_bytes: usize::try_from(config.client_send_buffer_bytes).unwrap_or(usize::MAX),
        pipelined: Arc::new(Semaphore::new(
            usize::try_from(
                config.pipelined_requests_bytes_max / crate::front_door::PIPELINED_REQUEST_BYTES,
            )
            .unwrap_or(usize::MAX)
            .min(Semaphore::MAX_PERMITS),
        )),
        id_seed: std::sync::Mutex::new(Jitter::new(fresh_seed().rotate_left(17))),
        clients: Arc::new(crate::front_door::Clients::default()),
    }))
}

/// The Kite engine's configuration for keyspace `spec` on this node: the members, the
/// node's key and value limits and its Kite timers. Every boot is a new incarnation that
/// rejoins (the engine reads its last incarnation from the keyspace's hard state).
/// Turns on the `[testing]` fault injections and controls the configuration asks for,
/// each logged as an error (none is for real use).
fn apply_testing(testing: &crate::config::TestingSettings) {
    if testing.unsafe_ack_durable_before_fsync {
        crate::driver::ack_durable_before_fsync();
        tracing::error!("[testing] unsafe_ack_durable_before_fsync is on: durable writes are acknowledged before any fsync (negative-control mode, never for real use)");
    }
    if testing.unsafe_kite_no_slow_path {
        tracing::error!("[testing] unsafe_kite_no_slow_path is on: Kite releases skip the slow path (negative-control mode, never for real use)");
    }
    if testing.power_loss_on_kill {
        keel_storage::disk::hold_unsynced_appends();
        tracing::error!("[testing] power_loss_on_kill is on: unsynced appends stay in this process (fault injection, never for real use)");
    }
    if testing.clock_rate_ppm != 0 || testing.clock_offset_ms != 0 {
        crate::driver::skew_clock(testing.clock_rate_ppm, testing.clock_offset_ms);
        tracing::error!(
            rate_ppm = testing.clock_rate_ppm,
            offset_ms = testing.clock_offset_ms,
            "[testing] this node's clock is skewed (fault injection, never for real use)"
        );
    }
    if testing.eio_on_sigusr1 {
        tracing::error!("[testing] eio_on_sigusr1 is on: SIGUSR1 fails the next fsync with EIO (fault injection, never for real use)");
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1()) {
            Ok(mut usr1) => {
                tokio::spawn(async move {
                    while usr1.recv().await.is_some() {
                        tracing::error!("[testing] SIGUSR1: the next fsync fails with EIO");
                        keel_storage::disk::fail_next_sync();
                    }
                });
            }
            Err(e) => tracing::error!("[testing] eio_on_sigusr1: cannot listen for SIGUSR1: {e}"),
        }
    }
}

/// Runs every keyspace's loop until all stop (`Ok`) or one fails (its error).
async fn run_loops(loops: Vec<Loop>) -> Result<(), String> {
    let mut set = tokio::task::JoinSet::new();
    for run in loops {
        set.spawn(run);
    }
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok(Ok(())) => {}
            Ok(Err(reason)) => return Err(reason),
            Err(e) => return Err(format!("an engine loop ended abnormally: {e}")),
        }
    }
    Ok(())
}

/// The key and value limits the front door parses with: every keyspace's engine takes
/// them from the node's `[engine]` settings.
fn shared_limits(config: &ServerConfig) -> Result<keel_types::Limits, NodeError> {
    Ok(config.engine_config()?.limits)
}

/// One bounded send queue and sender task per other member.
fn start_peer_senders(
    config: &ServerConfig,
    me: NodeId,
    links: &Arc<LinkSettings>,
    metrics: &Arc<Metrics>,
) -> PeerQueues {
    let mut queues = BTreeMap::new();
    for member in config.members.iter().filter(|m| m.id != me.0) {
        let (tx, rx) = mpsc::channel(config.peer_queue_max as usize);
        queues.insert(NodeId(member.id), tx);
        tokio::spawn(crate::peer::sender(
            me,
            NodeId(member.id),
            member.peer_addr.clone(),
            rx,
            config.peer_batch_max as usize,
            config.peer_delay(member.id),
            links.clone(),
            metrics.clone(),
        ));
    }
    PeerQueues::new(queues)
}

/// Recovers a keyspace's storage, boots its engine of kind `E`, and builds its loop,
/// handle and inbox.
pub(crate) async fn start_keyspace<E: Engine + Sync>(
    engine_config: E::Config,
    spec: KeyspaceSpec,
    shared: &Shared<'_>,
) -> Result<Started, NodeError>
where
    E::Message: PeerMessage + Send + Sync,
{
    let config = shared.config;
    let metrics = Arc::new(KeyspaceMetrics::default());
    let dir = spec.data_dir.clone();
    let storage_metrics = metrics.clone();
    let fsync_delay = config.emulated_fsync_delay();
    let snapshot_bytes_max = crate::storage::snapshot_bytes_max(spec.config.state_bytes_max);
    let (recovered, storage) = tokio::task::spawn_blocking(move || {
        crate::storage::start(&dir, storage_metrics, fsync_delay, snapshot_bytes_max)
    })
    .await
    .map_err(|e| NodeError::Startup(e.to_string()))?
    .map_err(|e| {
        let reason = match e {
            StartError::Recovery(StorageError::HardStateDamaged { name, reason }) => {
                let kite = !crate::engines::pack(spec.engine).leader;
                crate::storage::hard_state_damaged(&spec.data_dir, &name, &reason, kite)
            }
            e => e.to_string(),
        };
        NodeError::Startup(format!("keyspace {} ({}): {reason}", spec.id, spec.name))
    })?;
    tracing::info!(keyspace = %spec.id, name = %spec.name, engine = %spec.engine,
        entries = recovered.entries.len(), epoch = recovered.hard_state.epoch.0, "recovered");
    if let Some(damage) = &recovered.damage {
        // Damaged log records cut, or a damaged snapshot set aside with the whole log: the
        // reason says which.
        tracing::error!(keyspace = %spec.id, at = damage.at.0, through_epoch = damage.through.epoch.0,
            through = damage.through.index.0, reason = %damage.reason,
            "damaged data found at recovery and dropped; repairing from the leader");
    }
    if let Some(floor) = recovered.hard_state.repair_floor {
        tracing::warn!(keyspace = %spec.id, floor_epoch = floor.epoch.0, floor_index = floor.index.0,
            "until the log is durable again through the repair floor, this node votes as if \
             it held it and does not campaign");
    }
    let persisted = PersistedState {
        hard_state: recovered.hard_state,
        snapshot: recovered.snapshot,
        entries: recovered.entries,
    };
    let engine = E::boot(engine_config, persisted, fresh_seed(), monotonic_now())
        .map_err(|e| NodeError::Startup(format!("keyspace {}: {e}", spec.id)))?;
    if let Some(incarnation) = engine.report().status.get("incarnation") {
        // Kite: what a damaged hard state's repair needs (`docs/operations.md`).
        tracing::info!(keyspace = %spec.id, "booted as incarnation {incarnation}");
    }
    let queue_max = config.input_queue_max as usize;
    let (events_tx, events_rx) = mpsc::channel(queue_max);
    // Peer messages have a queue of their own, served first: a backlog of client requests
    // must not hold back the heartbeats and acknowledgements that keep the leader.
    let (peer_tx, peer_rx) = mpsc::channel(queue_max);
    let inbox: Box<dyn Inbox> =
        Box::new(TypedInbox::<E> { queue: peer_tx, limits: shared.limits.clone() });
    let wiring = Wiring {
        keyspace: spec.id,
        storage,
        peers: shared.peers.clone(),
        metrics: metrics.clone(),
        node_metrics: shared.node_metrics.clone(),
        node_id: NodeId(config.node_id),
        forwarded_replies: shared.forwarded_replies.clone(),
        broker: shared.broker.clone(),
    };
    let driver = Driver::new(engine, wiring);
    let view: Arc<dyn crate::driver::ReadView> = driver.view();
    let handle = KeyspaceHandle {
        id: spec.id,
        name: spec.name.clone(),
        kind: spec.engine,
        events: events_tx,
        view: config.reads_off_loop.then_some(view),
        metrics,
        node_id: NodeId(config.node_id),
        unsafe_stale_invoke: config.testing.unsafe_stale_invoke,
        unsafe_script_skip_watch: config.testing.unsafe_script_skip_watch,
        asking: None,
        guard: None,
    };
    let run = Box::pin(driver.run(events_rx, peer_rx, shared.shutdown.clone()));
    Ok(Started { handle, inbox, run })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_limit_the_descriptor_limit_cannot_meet_is_refused_by_name() {
        use nix::sys::resource::{getrlimit, Resource, RLIM_INFINITY};
        let dir = std::env::temp_dir().join(format!("keel-fd-limit-{}", std::process::id()));
        let mut config = ServerConfig::local(3, 1, 20_000, &dir);
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        config.connections_max = u32::MAX;
        let result = ensure_descriptors(&config);
        if hard == RLIM_INFINITY {
            assert!(result.is_ok(), "no hard limit: the soft one is raised");
        } else {
            let err = result.expect_err("more descriptors than the hard limit allows");
            let text = err.to_string();
            assert!(text.contains("connections_max") && text.contains("ulimit"), "{text}");
            assert_eq!(err.exit_code(), 1, "a configuration error");
        }
        config.connections_max = 16;
        assert!(ensure_descriptors(&config).is_ok(), "a small limit fits");
        assert!(descriptors_needed(&config) >= 16 + DESCRIPTORS_RESERVED);
    }
}
