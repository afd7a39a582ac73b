//! One pipelined RESP connection to one node.
//!
//! Two tasks own the socket: the writer takes requests from a bounded queue, registers
//! each reply slot with the reader *before* writing its bytes, and writes whatever is
//! queued in one go; the reader decodes replies and fills the slots in order. Many
//! callers share one connection; each waits only for its own reply. When the socket
//! fails, every waiting caller gets [`ConnError::Closed`] and the connection is dead
//! ([`Connection::is_closed`]); the pool opens a new one. Over TLS ([`ClientTls`]) the
//! handshake completes within the connect timeout, and the two tasks share the stream.
//!
//! RESP3 push frames (`KEEL.INVOKE`'s preliminary views) are not replies: the server
//! writes a request's pushes right before its reply, so the reader hands each push to the
//! request whose reply comes next, if it asked for them ([`Connection::call_with_pushes`]),
//! and drops it otherwise.

use crate::tls::ClientTls;
use keel_wire::resp::{DecodeMode, Decoder, Frame, RespLimits};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

/// Most requests queued or unanswered on one connection.
pub const INFLIGHT_MAX: usize = 1024;
/// Bytes read from the socket at a time.
pub const READ_CHUNK_BYTES: usize = 16 * 1024;

/// Why a call on a connection failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConnError {
    /// The connection could not be opened.
    #[error("cannot connect to {addr}: {reason}")]
    Connect {
        /// The address.
        addr: SocketAddr,
        /// Why.
        reason: String,
    },
    /// The connection closed before the reply came (the request may have run).
    #[error("connection closed")]
    Closed,
    /// No reply within the timeout (the request may have run).
    #[error("timed out")]
    Timeout,
}

/// Where a request's reply goes, and its push frames if it wants them.
struct Slot {
    reply: oneshot::Sender<Frame>,
    pushes: Option<mpsc::Sender<Frame>>,
}

/// A pipelined connection; cheap to clone (clones share the socket).
#[derive(Clone, Debug)]
pub struct Connection {
    requests: mpsc::Sender<(Vec<u8>, Slot)>,
    /// Calls sent or waiting to be, not yet answered (or given up on).
    in_flight: Arc<AtomicUsize>,
}

/// Counts a call in flight on its connection for as long as it lives.
struct InFlight<'a>(&'a AtomicUsize);

impl<'a> InFlight<'a> {
    fn new(count: &'a AtomicUsize) -> InFlight<'a> {
        count.fetch_add(1, Ordering::Relaxed);
        InFlight(count)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Connection {
    /// Opens a connection to `addr` within `timeout`, over TLS when `tls` is given (the
    /// handshake within the same timeout).
    pub async fn connect(
        addr: SocketAddr,
        timeout: Duration,
        tls: Option<&ClientTls>,
    ) -> Result<Connection, ConnError> {
        let failed = |reason: String| ConnError::Connect { addr, reason };
        let open = async {
            let stream = TcpStream::connect(addr).await.map_err(|e| failed(e.to_string()))?;
            let _ = stream.set_nodelay(true);
            let (requests, queue) = mpsc::channel(INFLIGHT_MAX);
            let (slots_tx, slots_rx) = mpsc::channel(INFLIGHT_MAX);
            match tls {
                None => {
                    let (reader, writer) = stream.into_split();
                    tokio::spawn(write_requests(writer, queue, slots_tx));
                    tokio::spawn(read_replies(reader, slots_rx));
                }
                Some(tls) => {
                    let stream = tls
                        .handshake(stream)
                        .await
                        .map_err(|e| failed(format!("TLS handshake: {e}")))?;
                    let (reader, writer) = tokio::io::split(stream);
                    tokio::spawn(write_requests(writer, queue, slots_tx));
                    tokio::spawn(read_replies(reader, slots_rx));
                }
            }
            Ok(Connection { requests, in_flight: Arc::new(AtomicUsize::new(0)) })
        };
        tokio::time::timeout(timeout, open)
            .await
            .unwrap_or_else(|_| Err(failed("timed out".into())))
    }

    /// Calls on this connection not yet answered: a reply waits behind every earlier
    /// one (RESP answers in order), so the pool prefers a connection with none.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Whether the connection has failed (calls on it fail at once).
    pub fn is_closed(&self) -> bool {
        self.requests.is_closed()
    }

    /// Sends one request (its words) and waits at most `timeout` for the reply.
    pub async fn call(&self, words: &[&[u8]], timeout: Duration) -> Result<Frame, ConnError> {
        self.call_slot(words, timeout, None).await
    }

    /// As [`Connection::call`], handing the push frames that come before the reply to
    /// `pushes` as they arrive (a RESP3 connection: see [`Connection::connect_resp3`]).
    /// Pushes that find `pushes` full are dropped: a server cannot make the client hold
    /// more than its capacity.
    pub async fn call_with_pushes(
        &self,
        words: &[&[u8]],
        timeout: Duration,
        pushes: mpsc::Sender<Frame>,
    ) -> Result<Frame, ConnError> {
        self.call_slot(words, timeout, Some(pushes)).await
    }

    /// Opens a connection as [`Connection::connect`] does and switches it to RESP3
    /// (`HELLO 3`) before anything else, within the same timeout.
    pub async fn connect_resp3(
        addr: SocketAddr,
        timeout: Duration,
        tls: Option<&ClientTls>,
    ) -> Result<Connection, ConnError> {
        let connection = Connection::connect(addr, timeout, tls).await?;
        match connection.call(&[b"HELLO", b"3"], timeout).await? {
            Frame::Map(_) => Ok(connection),
            other => {
                Err(ConnError::Connect { addr, reason: format!("HELLO 3 answered {other:?}") })
            }
        }
    }

    async fn call_slot(
        &self,
        words: &[&[u8]],
        timeout: Duration,
        pushes: Option<mpsc::Sender<Frame>>,
    ) -> Result<Frame, ConnError> {
        let _counted = InFlight::new(&self.in_flight);
        let (reply_tx, reply) = oneshot::channel();
        let slot = Slot { reply: reply_tx, pushes };
        let bytes = encode_request(words);
        let work = async {
            self.requests.send((bytes, slot)).await.map_err(|_| ConnError::Closed)?;
            reply.await.map_err(|_| ConnError::Closed)
        };
        tokio::time::timeout(timeout, work).await.unwrap_or(Err(ConnError::Timeout))
    }
}

/// A request as a RESP array of bulk strings.
pub fn encode_request(words: &[&[u8]]) -> Vec<u8> {
    assert!(!words.is_empty(), "a request has a command name");
    let mut out = Vec::with_capacity(16 + words.iter().map(|w| w.len() + 16).sum::<usize>());
    out.extend_from_slice(format!("*{}\r\n", words.len()).as_bytes());
    for word in words {
        out.extend_from_slice(format!("${}\r\n", word.len()).as_bytes());
        out.extend_from_slice(word);
        out.extend_from_slice(b"\r\n");
    }
    out
}

async fn write_requests(
    mut writer: impl AsyncWrite + Unpin,
    mut queue: mpsc::Receiver<(Vec<u8>, Slot)>,
    slots: mpsc::Sender<Slot>,
) {
    let mut batch = Vec::with_capacity(64);
    let mut out = Vec::new();
    loop {
        if queue.recv_many(&mut batch, 64).await == 0 {
            return;
        }
        out.clear();
        for (bytes, slot) in batch.drain(..) {
            // The slot goes to the reader before the bytes leave, so no reply can
            // arrive for a request the reader does not know about.
            if slots.send(slot).await.is_err() {
                return;
            }
            out.extend_from_slice(&bytes);
        }
        if writer.write_all(&out).await.is_err() || writer.flush().await.is_err() {
            return;
        }
    }
}

async fn read_replies(mut reader: impl AsyncRead + Unpin, mut slots: mpsc::Receiver<Slot>) {
    let mut decoder = Decoder::new(DecodeMode::Reply, RespLimits::default());
    let mut buf = Vec::with_capacity(READ_CHUNK_BYTES);
    let mut chunk = vec![0u8; READ_CHUNK_BYTES];
    // The request whose reply comes next, once a frame has come for it.
    let mut front: Option<Slot> = None;
    loop {
        let Ok(n) = reader.read(&mut chunk).await else { return };
        if n == 0 {
            return;
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut start = 0;
        loop {
            match decoder.decode(&buf[start..]) {
                Ok(Some((frame, used))) => {
                    start += used;
                    if front.is_none() {
                        let Some(slot) = slots.recv().await else { return };
                        front = Some(slot);
                    }
                    if let Frame::Push(_) = frame {
                        // For the request whose reply comes next; dropped if unasked.
                        let pushes = front.as_ref().and_then(|slot| slot.pushes.as_ref());
                        if let Some(pushes) = pushes {
                            let _ = pushes.try_send(frame);
                        }
                        continue;
                    }
                    let slot = front.take().expect("taken above");
                    let _ = slot.reply.send(frame);
                }
                Ok(None) => break,
                Err(_) => return, // the stream is out of step: drop the connection
            }
        }
        buf.drain(..start);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_arrays_of_bulk_strings() {
        let bytes = encode_request(&[b"GET", b"k"]);
        assert_eq!(bytes, b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n");
        assert_ne!(encode_request(&[b"PING"]), b"PING\r\n");
    }
}
