//! The client front door: RESP2, or RESP3 after `HELLO 3`, on TCP.
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
//! another connection carries the same pair (see [`crate::commands`]).

use crate::budget::ByteBudget;
use crate::commands::{self, Conn, Pending, Resolved};
use crate::driver::Keyspaces;
use crate::login::Login;
use crate::unauthenticated::{Admission, Unauthenticated};
use bytes::Bytes;
use keel_types::Limits;
use keel_wire::resp::{encode_shared, DecodeMode, Decoder, Frame, Protocol, RespLimits};
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
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

/// How often a connection waiting for the pipeline budget looks again whether its own
/// replies are all written (then it reads one request without).
const PIPELINE_RECHECK: std::time::Duration = std::time::Duration::from_millis(10);

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
    /// The node's bulk runtime, which writes flushes longer than [`BULK_WRITE_MIN`]
    /// (`None`: every write on the connection's own task).
    pub bulk: Option<tokio::runtime::Handle>,
}

/// What one connection holds of the request buffers' budget (a connection growing its
/// buffer for a large request reserves the growth; one that cannot is answered with an
/// error and closed); gives it back when dropped.
struct Reserved<'a> {
    budget: &'a ByteBudget,
    bytes: usize,
}

impl Reserved<'_> {
    /// Holds what a buffer of `capacity` needs; `false` when the budget cannot cover it.
    fn cover(&mut self, capacity: usize) -> bool {
        let need = capacity.saturating_sub(READ_CHUNK_BYTES);
        if need > self.bytes {
            if !self.budget.take(need - self.bytes) {
                return false;
            }
        } else {
            self.budget.give(self.bytes - need);
        }
        self.bytes = need;
        true
    }
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        self.budget.give(self.bytes);
    }
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
            let arrival = Arrival { from: from.ip(), accepted, ticket };
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

impl FrontDoor {
    /// A request's share of the pipeline budget ([`FrontDoor::pipelined`]): at once if
    /// free. If not, a connection with replies still to write stops reading until one
    /// is free, as past `pipeline_depth_max` (a client that reads nothing is closed by
    /// `output_timeout` meanwhile); one whose replies are all written reads its request
    /// without, so that a client waiting for each reply is never held by others' budget.
    async fn pipeline_charge(&self, queue: &mpsc::Sender<Pending>) -> Option<OwnedSemaphorePermit> {
        loop {
            if let Ok(charge) = self.pipelined.clone().try_acquire_owned() {
                return Some(charge);
            }
            if queue.capacity() == queue.max_capacity() {
                return None;
            }
            let wait = self.pipelined.clone().acquire_owned();
            if let Ok(Ok(charge)) = tokio::time::timeout(PIPELINE_RECHECK, wait).await {
                return Some(charge);
            }
        }
    }
}

impl Ticket {
    /// Resolves when the connection must close to make room for a newer one.
    async fn evicted(&self) {
        match self {
            Ticket::Waiting(admission) => admission.evicted.notified().await,
            Ticket::Slot(_) => std::future::pending().await,
        }
    }
}

/// An accepted connection: where from, when, and its slot.
struct Arrival {
    from: std::net::IpAddr,
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
    connection(reader, writer, arrival, door).await;
    metrics.connections_active.fetch_sub(1, Ordering::Relaxed);
}

/// What ended a connection's wait for its next bytes.
enum Woken {
    /// `n` bytes were read.
    Read(usize),
    /// The client closed, the read failed, or the writer gave up on the client.
    Closed,
    /// Nothing came within the idle or partial-request timeout.
    TimedOut,
    /// Not authenticated by the deadline (`auth_timeout_ms`).
    AuthDeadline,
    /// Closed to make room for a newer unauthenticated connection.
    Evicted,
}

/// Waits for the next bytes of a connection, at most `wait`, and until `deadline` if it
/// must authenticate by then.
async fn next_read<R: AsyncRead + Unpin>(
    reader: &mut R,
    chunk: &mut [u8],
    queue: &mpsc::Sender<Pending>,
    wait: Option<std::time::Duration>,
    deadline: Option<Instant>,
    ticket: &Ticket,
) -> Woken {
    if deadline.is_some_and(|at| Instant::now() >= at) {
        return Woken::AuthDeadline; // even for a client that keeps sending
    }
    let timeout = async {
        match wait {
            Some(wait) => tokio::time::sleep(wait).await,
            None => std::future::pending().await,
        }
    };
    let deadline = async {
        match deadline {
            Some(at) => tokio::time::sleep_until(at.into()).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        read = reader.read(chunk) => match read {
            Ok(0) | Err(_) => Woken::Closed,
            Ok(n) => Woken::Read(n),
        },
        () = queue.closed() => Woken::Closed,
        () = timeout => Woken::TimedOut,
        () = deadline => Woken::AuthDeadline,
        () = ticket.evicted() => Woken::Evicted,
    }
}

async fn connection<R, W>(mut reader: R, writer: W, arrival: Arrival, door: &Arc<FrontDoor>)
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (queue, pending) = mpsc::channel(door.pipeline_depth_max);
    let resolved = Arc::new(Resolved::default());
    let sink = Sink { writer: Some(writer), bulk: door.bulk.clone() };
    let write_task =
        tokio::spawn(write_replies(sink, pending, resolved.clone(), door.output_timeout));
    let mut conn = door.conn(resolved, arrival.from);
    let full_limits = RespLimits::for_server(&door.limits);
    // Until it authenticates (on a node with users): small requests, a deadline, a place
    // in the registry of unauthenticated connections.
    let mut deadline = door.login.users().required().then(|| arrival.accepted + door.auth_timeout);
    let first_limits =
        if deadline.is_some() { RespLimits::unauthenticated() } else { full_limits.clone() };
    let mut decoder = Decoder::new(DecodeMode::Request, first_limits);
    let mut ticket = arrival.ticket;
    let mut buf: Vec<u8> = Vec::with_capacity(READ_CHUNK_BYTES);
    let mut chunk = vec![0u8; READ_CHUNK_BYTES];
    let mut reserved = Reserved { budget: &door.request_buffers, bytes: 0 };
    'read: loop {
        // Part of a request waits at most `partial_request_timeout`; a connection with
        // nothing pending, `idle_timeout`; one not authenticated, its deadline.
        let wait =
            if buf.is_empty() { door.idle_timeout } else { Some(door.partial_request_timeout) };
        let n = match next_read(&mut reader, &mut chunk, &queue, wait, deadline, &ticket).await {
            Woken::Read(n) => n,
            Woken::Closed | Woken::TimedOut => break,
            woken @ (Woken::AuthDeadline | Woken::Evicted) => {
                let _ = queue.send(door.unproven_closed(&woken, conn.protocol)).await;
                break;
            }
        };
        if !reserved.grow_for(&mut buf, n) {
            door.keyspaces.node_metrics.request_budget_refused.fetch_add(1, Ordering::Relaxed);
            let text = "ERR request buffers of all connections are full; retry later";
            let _ = queue.send(Pending::ready(Frame::error(text), conn.protocol).closing()).await;
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut start = 0;
        loop {
            match decoder.decode(&buf[start..]) {
                Ok(None) => break,
                Ok(Some((frame, used))) => {
                    start += used;
                    let charge = door.pipeline_charge(&queue).await;
                    let reply = commands::handle(&mut conn, frame).await.charged(charge);
                    let close = reply.close;
                    if queue.send(reply).await.is_err() || close {
                        break 'read;
                    }
                    conn.queued_one();
                    if deadline.is_some() && conn.authenticated() {
                        // Proven: full limits from the next request, no deadline, its own slot.
                        let Some(slot) = ticket.proven(door) else { break 'read };
                        (ticket, deadline) = (slot, None);
                        decoder.set_limits(full_limits.clone());
                    }
                }
                Err(e) => {
                    let frame = door.protocol_error(&e, deadline.is_some());
                    let _ = queue.send(Pending::ready(frame, conn.protocol).closing()).await;
                    break 'read;
                }
            }
        }
        buf.drain(..start);
        if buf.capacity() > 4 * READ_CHUNK_BYTES && buf.len() <= READ_CHUNK_BYTES {
            buf.shrink_to(READ_CHUNK_BYTES); // a large request passed: give its memory back
            let _ = reserved.cover(buf.capacity()); // gives back: cannot fail
        }
    }
    drop(queue);
    let _ = write_task.await;
}

impl Ticket {
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

impl FrontDoor {
    /// A fresh connection's state.
    fn conn(&self, resolved: Arc<Resolved>, from: std::net::IpAddr) -> Conn {
        let client_id = self.id_seed.lock().expect("id lock").next_u64() >> 1;
        let (keyspaces, limits) = (self.keyspaces.clone(), self.limits.clone());
        let mut conn = Conn::new(client_id, keyspaces, limits, resolved, self.login.clone());
        conn.set_from(from);
        conn
    }

    /// The last reply of a connection closed before it authenticated.
    fn unproven_closed(&self, woken: &Woken, protocol: Protocol) -> Pending {
        let metrics = &self.keyspaces.node_metrics;
        let text = if matches!(woken, Woken::AuthDeadline) {
            metrics.auth_timeouts.fetch_add(1, Ordering::Relaxed);
            "ERR closed: not authenticated within auth_timeout_ms"
        } else {
            "ERR closed: too many unauthenticated connections"
        };
        Pending::ready(Frame::error(text), protocol).closing()
    }

    /// The reply to malformed or oversized RESP; before authentication, a request past
    /// its limits is refused in Redis's words.
    fn protocol_error(&self, e: &keel_wire::resp::ProtocolError, unproven: bool) -> Frame {
        use keel_wire::resp::ProtocolError as E;
        let text = match e {
            E::AggregateTooLong { .. } if unproven => "unauthenticated multibulk length",
            E::BulkTooLong { .. } | E::FrameTooLarge { .. } if unproven => {
                "unauthenticated bulk length"
            }
            _ => return e.reply_frame(),
        };
        Frame::error(&format!("ERR Protocol error: {text}"))
    }
}

impl Reserved<'_> {
    /// Grows `buf` for `n` more bytes, reserving from the budget first so that it bounds
    /// what is held; `false` when the budget cannot cover it.
    fn grow_for(&mut self, buf: &mut Vec<u8>, n: usize) -> bool {
        let needed = buf.len() + n;
        if needed <= buf.capacity() {
            return true;
        }
        let target = needed.max(buf.capacity() * 2);
        if !self.cover(target) {
            return false;
        }
        buf.reserve_exact(target - buf.len());
        true
    }
}

/// Replies encoded and not yet written: bytes of their own, and the large values they
/// share with the store, each due at an offset of those bytes.
struct Output {
    own: Vec<u8>,
    shared: Vec<(usize, Bytes)>,
    shared_bytes: usize,
    /// How long a write may make no progress.
    stall: std::time::Duration,
}

impl Output {
    /// Nothing to write (allocates nothing).
    fn empty(stall: std::time::Duration) -> Output {
        Output { own: Vec::new(), shared: Vec::new(), shared_bytes: 0, stall }
    }

    fn len(&self) -> usize {
        self.own.len() + self.shared_bytes
    }

    fn push(&mut self, frame: &Frame, protocol: Protocol) {
        let before = self.shared.len();
        encode_shared(frame, protocol, &mut self.own, &mut self.shared);
        self.shared_bytes += self.shared[before..].iter().map(|(_, b)| b.len()).sum::<usize>();
    }

    /// Writes everything; `false` when the connection failed or stalled.
    async fn flush<W: AsyncWrite + Unpin>(&mut self, writer: &mut W) -> bool {
        let mut at = 0;
        let mut ok = true;
        for (offset, bytes) in &self.shared {
            ok = ok
                && write_within(writer, &self.own[at..*offset], self.stall).await
                && write_within(writer, bytes, self.stall).await;
            at = *offset;
        }
        ok = ok && write_within(writer, &self.own[at..], self.stall).await;
        // A TLS stream may hold the last record until flushed (TCP: nothing to do).
        ok = ok && matches!(tokio::time::timeout(self.stall, writer.flush()).await, Ok(Ok(())));
        self.own.clear();
        self.shared.clear();
        self.shared_bytes = 0;
        if self.own.capacity() > 2 * WRITE_BUFFER_BYTES_MAX {
            self.own.shrink_to(WRITE_BUFFER_BYTES_MAX);
        }
        ok
    }
}

/// Writes `bytes` whole; `false` when the connection failed or no byte could be written
/// for `stall` (a client that does not read its replies).
async fn write_within<W: AsyncWrite + Unpin>(
    writer: &mut W,
    mut bytes: &[u8],
    stall: std::time::Duration,
) -> bool {
    while !bytes.is_empty() {
        let slice = &bytes[..bytes.len().min(WRITE_SLICE_BYTES)];
        match tokio::time::timeout(stall, writer.write(slice)).await {
            Ok(Ok(n)) if n > 0 => bytes = &bytes[n..],
            _ => return false,
        }
        if !bytes.is_empty() {
            // The engine loops share the runtime: let them in between slices.
            tokio::task::yield_now().await;
        }
    }
    true
}

/// Where a connection's replies go: its socket's write half, written from the
/// connection's task, or from the bulk runtime for a flush longer than
/// [`BULK_WRITE_MIN`].
struct Sink<W> {
    /// `None` only after a bulk write was lost with the bulk runtime (the node stops).
    writer: Option<W>,
    bulk: Option<tokio::runtime::Handle>,
}

impl<W: AsyncWrite + Unpin + Send + 'static> Sink<W> {
    /// Writes everything in `out`; `false` when the connection failed or stalled.
    async fn flush(&mut self, out: &mut Output) -> bool {
        let Some(writer) = self.writer.as_mut() else { return false };
        let bulk = match &self.bulk {
            Some(bulk) if out.len() > BULK_WRITE_MIN => bulk,
            _ => return out.flush(writer).await,
        };
        let Some(mut writer) = self.writer.take() else { return false };
        let mut taken = std::mem::replace(out, Output::empty(out.stall));
        // The task gives the writer and the buffers back. If this connection's task is
        // dropped meanwhile it still ends: once written, or when a write stalls.
        let written = bulk.spawn(async move {
            let ok = taken.flush(&mut writer).await;
            (writer, taken, ok)
        });
        match written.await {
            Ok((writer, taken, ok)) => {
                self.writer = Some(writer);
                *out = taken;
                ok
            }
            Err(_) => false, // the bulk runtime is shutting down with the node
        }
    }

    async fn shutdown(self) {
        if let Some(mut writer) = self.writer {
            let _ = writer.shutdown().await;
        }
    }
}

/// Writes a `KEEL.INVOKE`'s preliminary views as they come, each flushed at once (the
/// point is to show them before the final one), and returns the final reply; `None` if
/// the client went away.
async fn relay_views<W: AsyncWrite + Unpin + Send + 'static>(
    mut views: mpsc::Receiver<commands::View>,
    out: &mut Output,
    sink: &mut Sink<W>,
    protocol: Protocol,
) -> Option<Frame> {
    loop {
        match views.recv().await {
            Some(commands::View::Push(frame)) => {
                out.push(&frame, protocol);
                if !sink.flush(out).await {
                    return None;
                }
            }
            Some(commands::View::Final(frame)) => return Some(frame),
            None => return Some(Frame::error(commands::INVOKE_ENDED)),
        }
    }
}

/// Resolves replies in order and writes them, flushing whenever the next reply is not
/// ready: when none is queued, and before waiting for one still being computed (a read
/// waiting for a durability round), so that the replies before it leave at once.
async fn write_replies<W: AsyncWrite + Unpin + Send + 'static>(
    mut sink: Sink<W>,
    mut pending: mpsc::Receiver<Pending>,
    resolved: Arc<Resolved>,
    stall: std::time::Duration,
) {
    struct Stopped(Arc<Resolved>);
    impl Drop for Stopped {
        fn drop(&mut self) {
            self.0.stopped();
        }
    }
    let resolved = Stopped(resolved);
    let mut out = Output {
        own: Vec::with_capacity(WRITE_BUFFER_BYTES_MAX),
        shared: Vec::new(),
        shared_bytes: 0,
        stall,
    };
    loop {
        let next = match pending.try_recv() {
            Ok(next) => next,
            Err(mpsc::error::TryRecvError::Empty) => {
                if out.len() > 0 && !sink.flush(&mut out).await {
                    return;
                }
                match pending.recv().await {
                    Some(next) => next,
                    None => return,
                }
            }
            Err(mpsc::error::TryRecvError::Disconnected) => break,
        };
        let protocol: Protocol = next.protocol;
        let close = next.close;
        let mut next = next;
        let frame: Frame = match next.take_views() {
            Some(views) => match relay_views(views, &mut out, &mut sink, protocol).await {
                Some(frame) => frame,
                None => return,
            },
            None => {
                let mut reply = std::pin::pin!(next.resolve());
                let polled = std::future::poll_fn(|cx| Poll::Ready(reply.as_mut().poll(cx)));
                match polled.await {
                    Poll::Ready(frame) => frame,
                    Poll::Pending => {
                        if out.len() > 0 && !sink.flush(&mut out).await {
                            return;
                        }
                        reply.await
                    }
                }
            }
        };
        resolved.0.one_more();
        out.push(&frame, protocol);
        if close {
            break;
        }
        if out.len() >= WRITE_BUFFER_BYTES_MAX && !sink.flush(&mut out).await {
            return;
        }
    }
    let _ = sink.flush(&mut out).await;
    sink.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::Pin;
    use std::task::Context;

    /// Takes every byte offered and records how many each write offered, on which
    /// thread, and the bytes (shared, for a test to read while the writer runs; `wrote` is
    /// notified per write).
    #[derive(Default)]
    struct Recording {
        offered: Vec<usize>,
        threads: Vec<String>,
        written: Arc<std::sync::Mutex<Vec<u8>>>,
        wrote: Arc<tokio::sync::Notify>,
    }

    impl AsyncWrite for Recording {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            self.offered.push(buf.len());
            let thread = std::thread::current().name().unwrap_or_default().to_string();
            self.threads.push(thread);
            self.written.lock().expect("not poisoned").extend_from_slice(buf);
            self.wrote.notify_one();
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn a_large_reply_is_written_in_slices_a_small_one_whole() {
        let stall = std::time::Duration::from_secs(1);
        let mut writer = Recording::default();
        let large = vec![b'v'; 2 * WRITE_SLICE_BYTES + 10];
        assert!(write_within(&mut writer, &large, stall).await);
        assert_eq!(writer.offered, [WRITE_SLICE_BYTES, WRITE_SLICE_BYTES, 10]);
        let mut writer = Recording::default();
        assert!(write_within(&mut writer, b"+OK\r\n", stall).await);
        assert_eq!(writer.offered, [5]);
    }

    #[test]
    fn a_flush_longer_than_a_slice_is_written_on_the_bulk_runtime_a_short_one_in_place() {
        let bulk = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("test-bulk")
            .enable_all()
            .build()
            .expect("a runtime");
        let main =
            tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        main.block_on(async {
            let stall = std::time::Duration::from_secs(1);
            let mut sink =
                Sink { writer: Some(Recording::default()), bulk: Some(bulk.handle().clone()) };
            let mut out = Output::empty(stall);
            out.push(&Frame::ok(), Protocol::Resp2);
            assert!(sink.flush(&mut out).await);
            assert_eq!(out.len(), 0, "flushed");
            let here = std::thread::current().name().unwrap_or_default().to_string();
            assert_eq!(sink.writer.as_ref().expect("kept").threads, [here]);
            let large = Frame::Bulk(Bytes::from(vec![b'v'; BULK_WRITE_MIN + 1]));
            out.push(&large, Protocol::Resp2);
            assert!(sink.flush(&mut out).await);
            assert_eq!(out.len(), 0, "flushed");
            let threads = &sink.writer.as_ref().expect("given back").threads;
            assert!(threads.len() > 2, "{threads:?}");
            assert!(threads[1..].iter().all(|t| t == "test-bulk"), "{threads:?}");
            // Once the bulk runtime is gone, a long flush fails instead of hanging.
            let mut sink =
                Sink { writer: Some(Recording::default()), bulk: Some(bulk.handle().clone()) };
            bulk.shutdown_background();
            out.push(&large, Protocol::Resp2);
            assert!(!sink.flush(&mut out).await);
        });
    }

    #[tokio::test]
    async fn replies_ready_leave_before_the_writer_waits_for_a_later_one() {
        let writer = Recording::default();
        let (written, wrote) = (writer.written.clone(), writer.wrote.clone());
        let (queue, pending) = mpsc::channel(8);
        let task = tokio::spawn(write_replies(
            Sink { writer: Some(writer), bulk: None },
            pending,
            Arc::new(Resolved::default()),
            std::time::Duration::from_secs(5),
        ));
        // A reply that is ready, then one that never comes (a read waiting for a round),
        // queued together as a pipeline's reader queues them.
        queue.send(Pending::ready(Frame::ok(), Protocol::Resp2)).await.expect("open");
        let never: commands::ReplyFuture = Box::pin(std::future::pending());
        queue.send(Pending::later(never, Protocol::Resp2)).await.expect("open");
        let bound = std::time::Duration::from_secs(2);
        tokio::time::timeout(bound, wrote.notified()).await.expect("the ready reply was held back");
        assert_eq!(written.lock().expect("not poisoned").as_slice(), b"+OK\r\n");
        task.abort();
    }
}
