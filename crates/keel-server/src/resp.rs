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
//! Deduplication: each connection has a random client id and numbers its requests; the
//! Keel client instead sends `KEEL.REQ <client> <seq> <command ...>` so that a retry on
//! another connection carries the same pair (see [`crate::commands`]).

use crate::commands::{self, Conn, Pending, Resolved};
use crate::driver::Keyspaces;
use keel_types::Limits;
use keel_wire::resp::{encode, DecodeMode, Decoder, Frame, Protocol, RespLimits};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};

/// Bytes read from a client socket at a time.
pub const READ_CHUNK_BYTES: usize = 16 * 1024;
/// Reply bytes buffered before a write even if more replies are ready.
pub const WRITE_BUFFER_BYTES_MAX: usize = 64 * 1024;

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
    /// Free connection slots (`connections_max` in all).
    pub slots: Arc<Semaphore>,
    /// Seeds client ids.
    pub id_seed: std::sync::Mutex<crate::peer::Jitter>,
}

/// Accepts client connections forever.
pub async fn serve(listener: TcpListener, door: Arc<FrontDoor>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(crate::peer::BACKOFF_MIN).await; // out of descriptors
            continue;
        };
        let _ = stream.set_nodelay(true);
        let door = door.clone();
        tokio::spawn(async move {
            let Ok(slot) = door.slots.clone().try_acquire_owned() else {
                door.keyspaces.node_metrics.connections_refused.fetch_add(1, Ordering::Relaxed);
                let mut stream = stream;
                let _ = stream.write_all(b"-BUSY too many connections\r\n").await;
                return;
            };
            let metrics = &door.keyspaces.node_metrics;
            metrics.connections_active.fetch_add(1, Ordering::Relaxed);
            connection(stream, &door).await;
            metrics.connections_active.fetch_sub(1, Ordering::Relaxed);
            drop(slot);
        });
    }
}

async fn connection(stream: TcpStream, door: &Arc<FrontDoor>) {
    let (mut reader, writer) = stream.into_split();
    let (queue, pending) = mpsc::channel(door.pipeline_depth_max);
    let resolved = Arc::new(Resolved::default());
    let write_task = tokio::spawn(write_replies(writer, pending, resolved.clone()));
    let client_id = door.id_seed.lock().expect("id lock").next_u64() >> 1;
    let mut conn = Conn::new(client_id, door.keyspaces.clone(), door.limits.clone(), resolved);
    let mut decoder = Decoder::new(DecodeMode::Request, RespLimits::for_server(&door.limits));
    let mut buf: Vec<u8> = Vec::with_capacity(READ_CHUNK_BYTES);
    let mut chunk = vec![0u8; READ_CHUNK_BYTES];
    'read: loop {
        // Part of a request waits at most `partial_request_timeout`; a connection with
        // nothing pending, `idle_timeout`.
        let wait =
            if buf.is_empty() { door.idle_timeout } else { Some(door.partial_request_timeout) };
        let read = reader.read(&mut chunk);
        let n = match wait {
            Some(wait) => match tokio::time::timeout(wait, read).await {
                Ok(Ok(n)) => n,
                Ok(Err(_)) | Err(_) => break,
            },
            None => match read.await {
                Ok(n) => n,
                Err(_) => break,
            },
        };
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut start = 0;
        loop {
            match decoder.decode(&buf[start..]) {
                Ok(None) => break,
                Ok(Some((frame, used))) => {
                    start += used;
                    let reply = commands::handle(&mut conn, frame).await;
                    let close = reply.close;
                    if queue.send(reply).await.is_err() || close {
                        break 'read;
                    }
                    conn.queued_one();
                }
                Err(e) => {
                    let reply = Pending::ready(e.reply_frame(), conn.protocol).closing();
                    let _ = queue.send(reply).await;
                    break 'read;
                }
            }
        }
        buf.drain(..start);
    }
    drop(queue);
    let _ = write_task.await;
}

/// Resolves replies in order and writes them, flushing when no reply is ready.
async fn write_replies(
    mut writer: OwnedWriteHalf,
    mut pending: mpsc::Receiver<Pending>,
    resolved: Arc<Resolved>,
) {
    struct Stopped(Arc<Resolved>);
    impl Drop for Stopped {
        fn drop(&mut self) {
            self.0.stopped();
        }
    }
    let resolved = Stopped(resolved);
    let mut out = Vec::with_capacity(WRITE_BUFFER_BYTES_MAX);
    loop {
        let next = match pending.try_recv() {
            Ok(next) => next,
            Err(mpsc::error::TryRecvError::Empty) => {
                if !out.is_empty() && writer.write_all(&out).await.is_err() {
                    return;
                }
                out.clear();
                match pending.recv().await {
                    Some(next) => next,
                    None => return,
                }
            }
            Err(mpsc::error::TryRecvError::Disconnected) => break,
        };
        let protocol: Protocol = next.protocol;
        let close = next.close;
        let frame: Frame = next.resolve().await;
        resolved.0.one_more();
        encode(&frame, protocol, &mut out);
        if close {
            break;
        }
        if out.len() >= WRITE_BUFFER_BYTES_MAX {
            if writer.write_all(&out).await.is_err() {
                return;
            }
            out.clear();
        }
    }
    let _ = writer.write_all(&out).await;
    let _ = writer.shutdown().await;
}
