//! Starting and stopping one node: recover the storage, start the engine loop, bind the
//! peer, client and HTTP listeners, run until told to stop or until the storage fails.

use crate::config::ServerConfig;
use crate::driver::{Driver, Event, NodeHandle};
use crate::metrics::Metrics;
use crate::peer::Jitter;
use crate::resp::FrontDoor;
use keel_core::leader::{LeaderEngine, PersistedState};
use keel_types::NodeId;
use std::collections::BTreeMap;
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
    /// The node could not start (a port in use, an unreadable data directory).
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

/// Runs a node until `shutdown` is set (`Ok`) or it fails. Call inside a tokio runtime.
pub async fn run(config: ServerConfig, shutdown: watch::Receiver<bool>) -> Result<(), NodeError> {
    config.validate()?;
    let engine_config = config.engine_config()?;
    let me = NodeId(config.node_id);
    let metrics = Arc::new(Metrics::default());
    let dir = config.data_dir.clone();
    let storage_metrics = metrics.clone();
    let fsync_delay = config.emulated_fsync_delay();
    let snapshot_bytes_max = crate::storage::snapshot_bytes_max(engine_config.state_bytes_max);
    let (recovered, storage) = tokio::task::spawn_blocking(move || {
        crate::storage::start(&dir, storage_metrics, fsync_delay, snapshot_bytes_max)
    })
    .await
    .map_err(|e| NodeError::Startup(e.to_string()))?
    .map_err(NodeError::Startup)?;
    tracing::info!(node = %me, entries = recovered.entries.len(), epoch = recovered.hard_state.epoch.0, "recovered");
    let persisted = PersistedState {
        hard_state: recovered.hard_state,
        snapshot: recovered.snapshot,
        entries: recovered.entries,
    };
    let seed = fresh_seed();
    let engine =
        LeaderEngine::new(engine_config.clone(), persisted, seed, crate::driver::monotonic_now())
            .map_err(|e| NodeError::Startup(e.to_string()))?;
    let bind = |addr| async move {
        TcpListener::bind(addr)
            .await
            .map_err(|e| NodeError::Startup(format!("cannot listen on {addr}: {e}")))
    };
    let peer_listener = bind(config.peer_addr()).await?;
    let client_listener = bind(config.client_addr).await?;
    let http_listener = match config.http_addr {
        Some(addr) => Some(bind(addr).await?),
        None => None,
    };
    let (events_tx, events_rx) = mpsc::channel::<Event>(config.input_queue_max as usize);
    // Peer messages have a queue of their own, served first: a backlog of client requests
    // must not hold back the heartbeats and acknowledgements that keep the leader.
    let (peer_events_tx, peer_events_rx) = mpsc::channel::<Event>(config.input_queue_max as usize);
    let mut peers = BTreeMap::new();
    for member in config.members.iter().filter(|m| m.id != me.0) {
        let (tx, rx) = mpsc::channel(config.peer_queue_max as usize);
        peers.insert(NodeId(member.id), tx);
        let batch = config.peer_batch_max as usize;
        tokio::spawn(crate::peer::sender(
            me,
            NodeId(member.id),
            member.peer_addr,
            rx,
            batch,
            config.peer_delay(member.id),
            metrics.clone(),
        ));
    }
    let members: Vec<NodeId> = config.members.iter().map(|m| NodeId(m.id)).collect();
    tokio::spawn(crate::peer::listener(
        me,
        peer_listener,
        peer_events_tx,
        members,
        metrics.clone(),
    ));
    let node = NodeHandle { events: events_tx, metrics: metrics.clone(), node_id: me };
    let door = Arc::new(FrontDoor {
        node: node.clone(),
        limits: engine_config.limits.clone(),
        pipeline_depth_max: config.pipeline_depth_max as usize,
        slots: Arc::new(Semaphore::new(config.connections_max as usize)),
        id_seed: std::sync::Mutex::new(Jitter::new(seed.rotate_left(17))),
    });
    tokio::spawn(crate::resp::serve(client_listener, door));
    if let Some(listener) = http_listener {
        tokio::spawn(crate::http::serve(listener, node.clone()));
    }
    tracing::info!(node = %me, clients = %config.client_addr, peers = %config.peer_addr(),
        http = ?config.http_addr, "serving");
    let driver = Driver::new(engine, storage, peers, metrics);
    let result = driver.run(events_rx, peer_events_rx, shutdown).await.map_err(NodeError::Storage);
    tracing::info!(node = %me, ok = result.is_ok(), "stopped");
    result
}
