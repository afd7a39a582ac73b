//! The client front door's connections: RESP2, or RESP3 after `HELLO 3`, on TCP.
//!
//! One connection is two tasks. The reader decodes requests and turns each into a
//! [`Pending`] reply (a frame already known, or a future waiting on the engine) and queues
//! it, at most `pipeline_depth_max` deep (reading pauses past it). A request for an engine
//! is sent to the keyspace's engine loop as soon as it is decoded, so a pipeline reaches
//! the engine whole and one step takes it in a batch; only a request of another kind than
//! the one before it (a read after writes, a write after reads, another read level or
//! keyspace) first waits until everything before it is answered, so that a pipeline's
//! replies are those of its commands run one after another. The writer resolves the
//! queue front to back, so pipelined requests are answered in order, and flushes when the
//! queue runs dry, so a pipeline's replies leave in few writes.
//!
//! Errors: a request Keel refuses (unknown command, wrong arity, oversized key or value,
//! bad level) gets an error reply and the connection stays usable; malformed RESP gets
//! `-ERR Protocol error: ...` and the connection closes. Over `connections_max`, a new
//! connection gets `-BUSY` and is closed; a full engine queue answers `-BUSY`.
//!
//! Before authentication (on a node with users) a connection is held tighter: requests of
//! at most 10 words and 16 KiB (`RespLimits::unauthenticated`; a larger header is a
//! protocol error, in Redis's words), `auth_timeout_ms` from its arrival to authenticate,
//! and a place among at most `unauthenticated_connections_max` such connections, the
//! oldest closed to make room (`crate::unauthenticated`). `AUTH` waits for its check
//! (`crate::login`: a thread of its own, after the throttle's delay) before the next
//! request is read.
//!
//! Memory and time: the reader holds at most one partial request (bounded by the RESP
//! limits) and pauses past `pipeline_depth_max` unanswered requests. The writer copies
//! no large value: a bulk string of 16 KiB or more is written from the shared bytes it
//! came in (`encode_shared`), so its buffer stays near [`WRITE_BUFFER_BYTES_MAX`] however
//! large a reply is, and both buffers shrink back after a large request or reply. A client
//! that stops reading its replies stops being read (the pipeline fills) and, once a write
//! makes no progress for `client_output_timeout_ms`, is disconnected.
//!
//! Deduplication: each connection has a random client id and numbers its requests; the
//! Keel client instead sends `KEEL.REQ <client> <seq> <command ...>` so that a retry on
//! another connection carries the same pair (see `commands::sessions`).
//!
//! Layout: this file accepts connections (the slot, protected mode, TLS, the registry of
//! unauthenticated ones); [`reader`] reads, decodes and hands each request to
//! `dispatch::handle`, within the request buffers' and the pipeline's budgets; [`writer`]
//! resolves the replies in order and writes them.

mod reader;
mod writer;

use crate::driver::Keyspaces;
use crate::login::Login;
use crate::unauthenticated::{Admission, Unauthenticated};
use keel_exec::ByteBudget;
use keel_types::Limits;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;

/// Bytes read from a client socket at a time.
pub const READ_CHUNK_BYTES: usize = 16 * 1024;
/// Reply bytes buffered before a write even if more replies are ready.
pub const WRITE_BUFFER_BYTES_MAX: usize = 64 * 1024;

/// The most of a reply written in one go before the writer yields to the runtime's other
/// tasks. The engine loops and peer links share the runtime with the connections (see
/// `node`): without a bound, 300 connections each writing 1 MiB replies into loopback
/// sockets kept both worker threads busy past a 300 ms election timeout and the leader was
/// deposed (`docs/performance.md`, *One runtime, replies written in slices*).
pub const WRITE_SLICE_BYTES: usize = 256 * 1024;

/// A flush of more bytes than this (a large value, or several) is written from the
/// node's bulk runtime, not from the connection's task: the engine loops and peer links
/// share the connections' runtime, and a flood of large replies queued ahead of them
/// there held a leader's heartbeats past the election timeout.
pub const BULK_WRITE_MIN: usize = WRITE_SLICE_BYTES;

/// What one unanswered pipelined request is counted as against
/// `pipelined_requests_bytes_max`: its decoded frame, the request on its way to the
/// engine and the reply's channel, about half a KiB as measured
/// (`crates/keel/tests/client_memory.rs`).
pub const PIPELINED_REQUEST_BYTES: u64 = 512;

/// What every connection shares.
#[derive(Debug)]
pub struct FrontDoor {
    /// The keyspaces (each connection starts in keyspace 0; `SELECT` moves it).
    pub keyspaces: Arc<Keyspaces>,
    /// Key and value limits (checked while parsing).
    pub limits: Limits,
    /// Most unanswered requests per connection.
    pub pipeline_depth_max: usize,
    /// How long a connection may hold part of a request.
    pub partial_request_timeout: std::time::Duration,
    /// How long a connection may send nothing (`None`: forever).
    pub idle_timeout: Option<std::time::Duration>,
    /// How long a write to a client may make no progress before it is disconnected.
    pub output_timeout: std::time::Duration,
    /// Checks passwords (the users clients authenticate as; none: no authentication).
    pub login: Arc<Login>,
    /// How long a connection may take to authenticate (on a node with users).
    pub auth_timeout: std::time::Duration,
    /// Connections not yet authenticated, at most `unauthenticated_connections_max`
    /// (`None`: a node without users).
    pub unauthenticated: Option<Arc<Unauthenticated>>,
    /// Serve loopback clients only (protected mode: no users configured).
    pub loopback_only: bool,
    /// Bytes every connection's request buffer may hold together past its first
    /// [`READ_CHUNK_BYTES`] (`client_request_buffers_bytes_max`).
    pub request_buffers: Arc<ByteBudget>,
    /// Free connection slots (`connections_max` in all).
    pub slots: Arc<Semaphore>,
    /// Each client socket's send buffer (`client_send_buffer_bytes`; 0: the kernel's own
    /// sizing).
    pub send_buffer_bytes: usize,
    /// Unanswered pipelined requests all connections may hold together
    /// (`pipelined_requests_bytes_max` / [`PIPELINED_REQUEST_BYTES`]).
    pub pipelined: Arc<Semaphore>,
    /// Seeds client ids.
    pub id_seed: std::sync::Mutex<crate::peer::Jitter>,
    /// The open connections (`CLIENT LIST`, `CLIENT KILL`).
    pub clients: Arc<super::Clients>,
    /// The node's bulk runtime, which writes flushes longer than [`BULK_WRITE_MIN`]
    /// (`None`: every write on the connection's own task).
    pub bulk: Option<tokio::runtime::Handle>,
}

/// The refusal of a non-loopback client in protected mode.
const PROTECTED_MODE: &str = "-DENIED Keel is running in protected mode because no users are configured: only clients on loopback are served. Configure [[users]] (docs/security.md) or set protected_mode = false.\r\n";

/// Accepts client connections forever; over TLS when `tls` is given (`client_tls_addr`).
pub async fn serve(listener: TcpListener, door: Arc<FrontDoor>, tls: Option<TlsAcceptor>) {
    loop {
        let Ok((stream, from)) = listener.accept().await else {
            tokio::time::sleep(crate::peer::BACKOFF_MIN).await; // out of descriptors
            continue;
        };
        let accepted = Instant::now();
        let _ = stream.set_nodelay(true);
        if door.send_buffer_bytes > 0 {
            // What a client that reads nothing costs in copying before its writes stall.
            let _ = socket2::SockRef::from(&stream).set_send_buffer_size(door.send_buffer_bytes);
        }
        // A slot first, so that handshakes in progress count against `connections_max`
        // too; taken (and the registry of unauthenticated connections made room in)
        // here, before the next accept, so that a flood never holds more than its share.
        let ticket = door.slots.clone().try_acquire_owned().ok().map(|slot| door.ticket(slot));
        let (door, tls) = (door.clone(), tls.clone());
        tokio::spawn(async move {
            let Some(ticket) = ticket else {
                door.keyspaces.node_metrics.connections_refused.fetch_add(1, Ordering::Relaxed);
                if tls.is_none() {
                    let mut stream = stream;
                    let _ = tokio::time::timeout(
                        REFUSAL_WRITE_TIMEOUT,
                        stream.write_all(b"-BUSY too many connections\r\n"),
                    )
                    .await;
                }
                return;
            };
            let arrival = Arrival { from: from.ip(), peer: from, accepted, ticket };
            match tls {
                None => {
                    let (reader, writer) = stream.into_split();
                    admit(reader, writer, arrival, &door).await;
                }
                Some(acceptor) => handshake(acceptor, stream, arrival, &door).await,
            }
        });
    }
}

/// How a connection holds its slot: registered as unauthenticated (on a node with users,
/// until it authenticates), or on its own.
enum Ticket {
    Waiting(Admission),
    Slot(#[allow(dead_code)] OwnedSemaphorePermit), // held, never read
}

/// An accepted connection: where from, when, and its slot.
struct Arrival {
    from: std::net::IpAddr,
    /// Its address and port (`CLIENT LIST`).
    peer: std::net::SocketAddr,
    accepted: Instant,
    ticket: Ticket,
}

impl FrontDoor {
    fn ticket(&self, slot: OwnedSemaphorePermit) -> Ticket {
        match &self.unauthenticated {
            Some(registry) => Ticket::Waiting(registry.admit(slot)),
            None => Ticket::Slot(slot),
        }
    }
}

/// Serves a TLS connection once its handshake is done; one that does not finish it in
/// time (or is closed to make room) is cut off.
async fn handshake(
    acceptor: TlsAcceptor,
    stream: tokio::net::TcpStream,
    arrival: Arrival,
    door: &Arc<FrontDoor>,
) {
    let metrics = &door.keyspaces.node_metrics;
    // With users, the deadline to authenticate counts from the arrival: the handshake too.
    let mut limit = door.partial_request_timeout;
    if door.login.users().required() {
        limit = limit.min(door.auth_timeout);
    }
    let handshake = tokio::time::timeout(limit, acceptor.accept(stream));
    let done = tokio::select! {
        done = handshake => done,
        () = arrival.ticket.evicted() => return,
    };
    match done {
        Ok(Ok(stream)) => {
            let (reader, writer) = tokio::io::split(stream);
            admit(reader, writer, arrival, door).await;
        }
        Ok(Err(e)) => {
            metrics.tls_handshakes_failed.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(from = %arrival.from, reason = %e, "client TLS handshake failed");
        }
        Err(_) => {
            metrics.tls_handshakes_failed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// How long the one-line refusal of a connection may take to write.
const REFUSAL_WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// Serves one accepted connection (its TLS handshake done), or refuses it in protected
/// mode.
async fn admit<R, W>(reader: R, mut writer: W, arrival: Arrival, door: &Arc<FrontDoor>)
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let metrics = &door.keyspaces.node_metrics;
    if door.loopback_only && !arrival.from.is_loopback() {
        metrics.connections_refused.fetch_add(1, Ordering::Relaxed);
        let refusal = async {
            writer.write_all(PROTECTED_MODE.as_bytes()).await?;
            writer.flush().await
        };
        let _ = tokio::time::timeout(REFUSAL_WRITE_TIMEOUT, refusal).await;
        return;
    }
    metrics.connections_active.fetch_add(1, Ordering::Relaxed);
    reader::connection(reader, writer, arrival, door).await;
    metrics.connections_active.fetch_sub(1, Ordering::Relaxed);
}

impl Ticket {
    /// Resolves when the connection must close to make room for a newer one.
    async fn evicted(&self) {
        match self {
            Ticket::Waiting(admission) => admission.evicted.notified().await,
            Ticket::Slot(_) => std::future::pending().await,
        }
    }

    /// The connection's own slot once it authenticated; `None` if it was closed
    /// meanwhile to make room for a newer one.
    fn proven(self, door: &FrontDoor) -> Option<Ticket> {
        match (self, &door.unauthenticated) {
            (Ticket::Waiting(admission), Some(registry)) => {
                registry.authenticated(admission).map(Ticket::Slot)
            }
            (ticket, _) => Some(ticket),
        }
    }
}
