//! Peer transport: engine messages over TCP in `keel_wire::peer` frames.
//!
//! Each node keeps one outbound connection per peer (it writes, never reads) and accepts
//! one inbound connection from each peer (it reads, never writes). Outbound:
//! - a bounded queue per peer ([`crate::config::ServerConfig::peer_queue_max`]); the engine
//!   loop drops a message when the queue is full (the protocol retries what was lost);
//! - batching: the sender takes every message waiting (at most `peer_batch_max`) and
//!   writes them as one frame, so a busy link pipelines without waiting for replies;
//! - reconnect with exponential backoff and jitter ([`BACKOFF_MIN`]..[`BACKOFF_MAX`]);
//!   messages queued while the link is down are dropped: they are stale by then.
//!
//! Inbound: each frame is checked (length limit, checksum, addressed to this node) and
//! its messages go to the engine loop, dropped when its queue is full. A malformed frame
//! closes the connection; the peer reconnects.

use crate::driver::Event;
use crate::metrics::Metrics;
use keel_core::leader::Message;
use keel_types::NodeId;
use keel_wire::peer::{decode_frame, encode_frame, PeerFrame, PeerLimits};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// First reconnect delay.
pub const BACKOFF_MIN: Duration = Duration::from_millis(20);
/// Longest reconnect delay.
pub const BACKOFF_MAX: Duration = Duration::from_millis(1000);
/// Bytes read from a peer socket at a time.
pub const READ_CHUNK_BYTES: usize = 64 * 1024;
/// How long a connection attempt may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// A tiny PRNG for jitter (SplitMix64): jitter needs spread, not quality.
#[derive(Debug)]
pub struct Jitter(u64);

impl Jitter {
    /// Seeded from `seed`.
    pub fn new(seed: u64) -> Jitter {
        Jitter(seed)
    }

    /// The next pseudo-random number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// `base` stretched by a random factor in `[1, 1.5)`.
    pub fn spread(&mut self, base: Duration) -> Duration {
        let extra = base.as_micros() as u64 * (self.next_u64() % 500) / 1000;
        base + Duration::from_micros(extra)
    }
}

/// Sends the messages queued for `to` to its address, forever (until the queue closes).
pub async fn sender(
    me: NodeId,
    to: NodeId,
    addr: SocketAddr,
    mut queue: mpsc::Receiver<Message>,
    batch_max: usize,
    metrics: Arc<Metrics>,
) {
    assert!(batch_max >= 1, "a frame carries at least one message");
    let limits = PeerLimits::default();
    let mut jitter =
        Jitter::new(u64::from(me.0) << 32 | u64::from(to.0) ^ std::process::id() as u64);
    let mut backoff = BACKOFF_MIN;
    loop {
        let stream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => stream,
            _ => {
                drop_queued(&mut queue, &metrics);
                if queue.is_closed() {
                    return;
                }
                tokio::time::sleep(jitter.spread(backoff)).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        tracing::debug!(%to, %addr, "peer link up");
        backoff = BACKOFF_MIN;
        if !send_frames(me, to, stream, &mut queue, batch_max, &limits, &metrics).await {
            return; // the queue closed: the node is stopping
        }
        tracing::debug!(%to, "peer link down; reconnecting");
    }
}

/// Writes batches until the connection fails (`true`) or the queue closes (`false`).
async fn send_frames(
    me: NodeId,
    to: NodeId,
    mut stream: TcpStream,
    queue: &mut mpsc::Receiver<Message>,
    batch_max: usize,
    limits: &PeerLimits,
    metrics: &Metrics,
) -> bool {
    let mut buf = Vec::new();
    let mut batch = Vec::with_capacity(batch_max);
    loop {
        if queue.recv_many(&mut batch, batch_max).await == 0 {
            return false;
        }
        buf.clear();
        let count = batch.len() as u64;
        let frame = PeerFrame::Link { from: me, to, messages: std::mem::take(&mut batch) };
        if let Err(e) = encode_frame(&frame, limits, &mut buf) {
            // Too large as one frame: send each message alone (a snapshot may be big).
            tracing::debug!(%e, "splitting a peer batch");
            let PeerFrame::Link { messages, .. } = frame else { unreachable!("built above") };
            for message in messages {
                let single = PeerFrame::Link { from: me, to, messages: vec![message] };
                if encode_frame(&single, limits, &mut buf).is_err() {
                    metrics.peer_dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        if stream.write_all(&buf).await.is_err() {
            metrics.peer_dropped.fetch_add(count, Ordering::Relaxed);
            return true;
        }
        metrics.peer_sent.fetch_add(count, Ordering::Relaxed);
    }
}

fn drop_queued(queue: &mut mpsc::Receiver<Message>, metrics: &Metrics) {
    let mut dropped = 0;
    while queue.try_recv().is_ok() {
        dropped += 1;
    }
    metrics.peer_dropped.fetch_add(dropped, Ordering::Relaxed);
}

/// Accepts peer connections and feeds their messages to the engine loop.
pub async fn listener(
    me: NodeId,
    listener: TcpListener,
    events: mpsc::Sender<Event>,
    members: Vec<NodeId>,
    metrics: Arc<Metrics>,
) {
    loop {
        let Ok((stream, from_addr)) = listener.accept().await else {
            tokio::time::sleep(BACKOFF_MIN).await; // out of descriptors: pause, retry
            continue;
        };
        let _ = stream.set_nodelay(true);
        let events = events.clone();
        let members = members.clone();
        let metrics = metrics.clone();
        tokio::spawn(async move {
            if let Err(reason) = receive(me, stream, &events, &members, &metrics).await {
                tracing::warn!(%from_addr, %reason, "closing peer connection");
            }
        });
    }
}

async fn receive(
    me: NodeId,
    mut stream: TcpStream,
    events: &mpsc::Sender<Event>,
    members: &[NodeId],
    metrics: &Metrics,
) -> Result<(), String> {
    let limits = PeerLimits::default();
    let mut buf: Vec<u8> = Vec::with_capacity(READ_CHUNK_BYTES);
    let mut chunk = vec![0u8; READ_CHUNK_BYTES];
    loop {
        let n = stream.read(&mut chunk).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut start = 0;
        while let Some((frame, used)) =
            decode_frame(&buf[start..], &limits).map_err(|e| e.to_string())?
        {
            start += used;
            let PeerFrame::Link { from, to, messages } = frame else {
                return Err("a batch frame on a peer link".into());
            };
            if to != me || !members.contains(&from) || from == me {
                return Err(format!("frame from {from} to {to} on {me}'s link"));
            }
            for message in messages {
                if events.try_send(Event::Peer { from, message }).is_err() {
                    metrics.peer_dropped.fetch_add(1, Ordering::Relaxed);
                } else {
                    metrics.peer_received.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        buf.drain(..start);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_half_again() {
        let mut jitter = Jitter::new(7);
        for _ in 0..1000 {
            let d = jitter.spread(Duration::from_millis(100));
            assert!(d >= Duration::from_millis(100) && d < Duration::from_millis(150));
        }
        assert_ne!(Jitter::new(1).next_u64(), Jitter::new(2).next_u64());
    }
}
