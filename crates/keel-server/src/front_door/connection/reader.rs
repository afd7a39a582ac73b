//! A connection's reader: reads up to [`READ_CHUNK_BYTES`] at a time into a buffer the
//! request buffers' budget covers ([`Reserved`]), decodes requests, takes each one's share
//! of the pipeline budget and queues its reply for the writer; closes the connection on a
//! timeout, a protocol error, an authentication deadline or an eviction.

use super::writer::{write_replies, Replies, Sink};
use super::{Arrival, FrontDoor, Ticket, READ_CHUNK_BYTES};
use crate::front_door::conn::{Conn, Pending, Resolved};
use crate::front_door::dispatch::handle;
use crate::pubsub::Outbox;
use keel_exec::ByteBudget;
use keel_wire::resp::{DecodeMode, Decoder, Frame, Protocol, RespLimits};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::sync::{mpsc, OwnedSemaphorePermit};

/// How often a connection waiting for the pipeline budget looks again whether its own
/// replies are all written (then it reads one request without).
const PIPELINE_RECHECK: std::time::Duration = std::time::Duration::from_millis(10);

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
    killed: &tokio::sync::Notify,
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
        () = killed.notified() => Woken::Closed,
    }
}

pub(super) async fn connection<R, W>(
    mut reader: R,
    writer: W,
    arrival: Arrival,
    door: &Arc<FrontDoor>,
) where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (queue, write_task, resolved, outbox) = start_writer(writer, door);
    let mut conn = door.conn(resolved, arrival.from);
    conn.outbox = outbox;
    let registered = door.clients.register(conn.client.0, arrival.peer);
    conn.registered = Some((door.clients.clone(), registered.entry.clone()));
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
        // A subscriber waits for messages, not requests: no idle time-out (as Redis).
        let idle = if conn.subscribed() { None } else { door.idle_timeout };
        let wait = if buf.is_empty() { idle } else { Some(door.partial_request_timeout) };
        let killed = &registered.entry.kill;
        let woken = next_read(&mut reader, &mut chunk, &queue, wait, deadline, &ticket, killed);
        let n = match woken.await {
            Woken::Read(n) => n,
            Woken::Closed | Woken::TimedOut => break,
            woken @ (Woken::AuthDeadline | Woken::Evicted) => {
                let _ = queue.send(door.unproven_closed(&woken, conn.protocol)).await;
                break;
            }
        };
        if !reserved.grow_for(&mut buf, n) {
            let _ = queue.send(door.buffers_full(conn.protocol)).await;
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
                    let reply = handle(&mut conn, frame).await.charged(charge);
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
        reserved.served(&mut buf, start);
    }
    drop(queue);
    let _ = write_task.await;
}

/// Starts a connection's writer on `writer`: the queue of its replies, its task, the
/// count of the replies it resolved, and the outbox of its pushed frames.
#[allow(clippy::type_complexity)]
fn start_writer<W>(
    writer: W,
    door: &FrontDoor,
) -> (mpsc::Sender<Pending>, tokio::task::JoinHandle<()>, Arc<Resolved>, Arc<Outbox>)
where
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (queue, pending) = mpsc::channel(door.pipeline_depth_max);
    let resolved = Arc::new(Resolved::default());
    let (outbox, pushes) = Outbox::new();
    let sink = Sink::new(writer, door.bulk.clone());
    let metrics = door.keyspaces.node_metrics.clone();
    let replies = Replies { pending, pushes, resolved: resolved.clone(), metrics };
    let write_task = tokio::spawn(write_replies(sink, replies, door.output_timeout));
    (queue, write_task, resolved, outbox)
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

    /// The last reply of a connection whose request buffer the node's budget cannot grow.
    fn buffers_full(&self, protocol: Protocol) -> Pending {
        self.keyspaces.node_metrics.request_budget_refused.fetch_add(1, Ordering::Relaxed);
        let text = "ERR request buffers of all connections are full; retry later";
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

    /// Drops the `used` bytes served from the front of `buf`; gives a large request's
    /// memory back once it has passed.
    fn served(&mut self, buf: &mut Vec<u8>, used: usize) {
        buf.drain(..used);
        if buf.capacity() > 4 * READ_CHUNK_BYTES && buf.len() <= READ_CHUNK_BYTES {
            buf.shrink_to(READ_CHUNK_BYTES);
            let _ = self.cover(buf.capacity()); // gives back: cannot fail
        }
    }
}
