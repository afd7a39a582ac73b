//! Peer transport: every keyspace's engine messages over TCP in `keel_wire::peer`
//! frames, each message in an envelope naming its keyspace.
//!
//! Each node keeps one outbound connection per peer (it writes, never reads) and accepts
//! one inbound connection from each peer (it reads, never writes); every keyspace shares
//! them. Outbound:
//! - a bounded queue per peer ([`crate::config::ServerConfig::peer_queue_max`]) shared by
//!   the keyspaces' engine loops ([`PeerQueues`]); a loop drops a message when the queue
//!   is full (the protocol retries what was lost); the sender task encodes each message
//!   with its engine's codec, off the loops;
//! - batching: the sender takes every message waiting (at most `peer_batch_max`) and
//!   writes them as one frame, so a busy link pipelines without waiting for replies;
//! - reconnect with exponential backoff and jitter ([`BACKOFF_MIN`]..[`BACKOFF_MAX`]);
//!   messages queued while the link is down are dropped: they are stale by then;
//! - a test-only one-way delay per link (`[geo] peer_delay_ms`, off by default): a
//!   [`DelayLine`] stamps each message when the sender takes it from the queue and
//!   releases it no earlier than stamp + delay, in order, holding at most
//!   `peer_queue_max` messages (more are dropped, as when the queue is full).
//!
//! Inbound: each frame is checked (length limit, checksum, addressed to this node, from a
//! member) and each envelope goes to its keyspace's [`Inbox`], which decodes it with the
//! keyspace's engine codec, runs the validation gate's stateless half and queues it for
//! the engine loop (dropped when its queue is full). A message that does not decode,
//! fails the gate or names a keyspace this node does not host is dropped and counted
//! with its reason; a malformed frame closes the connection and the peer reconnects.

use crate::driver::PeerEvent;
use crate::metrics::Metrics;
use keel_core::engine::Engine;
use keel_types::rng::SplitMix64;
use keel_types::{KeyspaceId, NodeId};
use keel_wire::peer::{decode_frame, encode_frame, Outgoing, PeerFrame, PeerLimits, PeerMessage};
use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// First reconnect delay.
pub const BACKOFF_MIN: Duration = Duration::from_millis(20);
/// Longest reconnect delay.
pub const BACKOFF_MAX: Duration = Duration::from_millis(1000);
/// Bytes read from a peer socket at a time.
pub const READ_CHUNK_BYTES: usize = 64 * 1024;
/// How long a connection attempt may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// Randomness for reconnect jitter and connection ids: Keel's splitmix64, seeded by the
/// caller. Jitter needs spread, not quality.
#[derive(Debug)]
pub struct Jitter(SplitMix64);

impl Jitter {
    /// Seeded from `seed`.
    pub fn new(seed: u64) -> Jitter {
        Jitter(SplitMix64::new(seed))
    }

    /// The next pseudo-random number.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// `base` stretched by a random factor in `[1, 1.5)`.
    pub fn spread(&mut self, base: Duration) -> Duration {
        let extra = base.as_micros() as u64 * self.0.below(500) / 1000;
        base + Duration::from_micros(extra)
    }
}

/// A FIFO that holds each item until its stamp plus a fixed delay: the emulated one-way
/// latency of a link. Pure: time is passed in. Release order is push order, because
/// stamps never go backwards and the delay is the same for every item.
#[derive(Debug)]
pub struct DelayLine<T> {
    delay: Duration,
    held: VecDeque<(Instant, T)>,
    held_max: usize,
}

impl<T> DelayLine<T> {
    /// A line delaying by `delay` and holding at most `held_max` items.
    pub fn new(delay: Duration, held_max: usize) -> DelayLine<T> {
        assert!(held_max >= 1, "a delay line holds at least one item");
        DelayLine { delay, held: VecDeque::new(), held_max }
    }

    /// Holds `item`, stamped `now`; gives it back when the line is full (drop it).
    pub fn push(&mut self, now: Instant, item: T) -> Result<(), T> {
        if self.held.len() >= self.held_max {
            return Err(item);
        }
        let last = self.held.back().map(|(stamp, _)| *stamp);
        let now = last.map_or(now, |last| last.max(now)); // stamps never go backwards
        self.held.push_back((now, item));
        assert!(self.held.len() <= self.held_max);
        Ok(())
    }

    /// When the oldest held item is due, if any item is held.
    pub fn next_due(&self) -> Option<Instant> {
        self.held.front().map(|(stamp, _)| *stamp + self.delay)
    }

    /// Moves into `out`, in order, up to `count_max` items due at `now`.
    pub fn take_due(&mut self, now: Instant, count_max: usize, out: &mut Vec<T>) {
        let before = out.len();
        while out.len() - before < count_max && self.next_due().is_some_and(|due| due <= now) {
            let (_, item) = self.held.pop_front().expect("next_due saw it");
            out.push(item);
        }
        assert!(out.len() - before <= count_max);
    }

    /// How many items are held.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Whether no item is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

/// The send queue of every other member, shared by the node's keyspaces.
#[derive(Debug, Default)]
pub struct PeerQueues {
    queues: BTreeMap<NodeId, mpsc::Sender<Outgoing>>,
}

impl PeerQueues {
    /// Queues for the given peers.
    pub fn new(queues: BTreeMap<NodeId, mpsc::Sender<Outgoing>>) -> PeerQueues {
        PeerQueues { queues }
    }

    /// Whether `node` has a queue (a node has none to itself).
    pub fn contains(&self, node: NodeId) -> bool {
        self.queues.contains_key(&node)
    }

    /// Queues a message for `to`; `false` when the queue is full or closed (dropped).
    /// Panics on a non-member: engines only address members.
    pub fn send(&self, to: NodeId, outgoing: Outgoing) -> bool {
        let queue = self.queues.get(&to).unwrap_or_else(|| panic!("message to non-member {to}"));
        queue.try_send(outgoing).is_ok()
    }
}

/// What became of one message handed to an [`Inbox`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// Queued for the engine loop.
    Queued,
    /// The loop's queue was full: dropped.
    Full,
    /// Dropped: the message breaks a rule (named).
    Rejected(&'static str),
}

/// Where one keyspace's peer messages go.
pub trait Inbox: Send + Sync {
    /// Decodes `bytes` with the keyspace's engine codec, checks the result with the
    /// gate's stateless half, and queues it for the engine loop.
    fn deliver(&self, from: NodeId, bytes: &[u8]) -> Delivery;
}

/// The inbox of a keyspace running engine kind `E`.
pub struct TypedInbox<E: Engine> {
    /// The engine loop's peer queue.
    pub queue: mpsc::Sender<PeerEvent<E::Message>>,
    /// The limits the codec checks.
    pub limits: PeerLimits,
}

impl<E: Engine> Inbox for TypedInbox<E>
where
    E::Message: PeerMessage + Send + Sync,
{
    fn deliver(&self, from: NodeId, bytes: &[u8]) -> Delivery {
        let Ok(message) = E::Message::decode(bytes, &self.limits) else {
            return Delivery::Rejected("message does not decode");
        };
        if let Err(reason) = E::check_message(&message) {
            return Delivery::Rejected(reason);
        }
        match self.queue.try_send(PeerEvent { from, message }) {
            Ok(()) => Delivery::Queued,
            Err(_) => Delivery::Full,
        }
    }
}

/// Every keyspace's inbox, by id.
pub type Inboxes = BTreeMap<KeyspaceId, Box<dyn Inbox>>;

/// Sends the messages queued for `to` to its address, forever (until the queue closes),
/// each no earlier than `delay` after the sender took it from the queue.
#[allow(clippy::too_many_arguments)] // each is a distinct setting of the link
pub async fn sender(
    me: NodeId,
    to: NodeId,
    addr: SocketAddr,
    mut queue: mpsc::Receiver<Outgoing>,
    batch_max: usize,
    delay: Duration,
    metrics: Arc<Metrics>,
) {
    assert!(batch_max >= 1, "a frame carries at least one message");
    let held_max = queue.max_capacity();
    let mut line = DelayLine::new(delay, held_max);
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
        let link = Link { me, to, batch_max, limits: &limits, metrics: &metrics };
        let open = if delay.is_zero() {
            send_frames(&link, stream, &mut queue).await
        } else {
            send_delayed(&link, stream, &mut queue, &mut line).await
        };
        if !open {
            return; // the queue closed: the node is stopping
        }
        line = DelayLine::new(delay, held_max); // what was held is stale now
        tracing::debug!(%to, "peer link down; reconnecting");
    }
}

/// What a sender needs to write frames to one peer.
struct Link<'a> {
    me: NodeId,
    to: NodeId,
    batch_max: usize,
    limits: &'a PeerLimits,
    metrics: &'a Metrics,
}

/// Writes batches until the connection fails (`true`) or the queue closes (`false`).
async fn send_frames(
    link: &Link<'_>,
    mut stream: TcpStream,
    queue: &mut mpsc::Receiver<Outgoing>,
) -> bool {
    let mut buf = Vec::new();
    let mut batch = Vec::with_capacity(link.batch_max);
    loop {
        if queue.recv_many(&mut batch, link.batch_max).await == 0 {
            return false;
        }
        if !write_batch(link, &mut stream, &mut batch, &mut buf).await {
            return true;
        }
    }
}

/// As [`send_frames`], but each message waits in `line` until it is due.
async fn send_delayed(
    link: &Link<'_>,
    mut stream: TcpStream,
    queue: &mut mpsc::Receiver<Outgoing>,
    line: &mut DelayLine<Outgoing>,
) -> bool {
    let mut buf = Vec::new();
    let mut incoming = Vec::with_capacity(link.batch_max);
    let mut batch = Vec::with_capacity(link.batch_max);
    loop {
        let due = line.next_due();
        tokio::select! {
            count = queue.recv_many(&mut incoming, link.batch_max) => {
                if count == 0 {
                    return false;
                }
                let now = Instant::now();
                for message in incoming.drain(..) {
                    if line.push(now, message).is_err() {
                        link.metrics.peer_dropped.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            () = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {}
        }
        line.take_due(Instant::now(), link.batch_max, &mut batch);
        if !batch.is_empty() && !write_batch(link, &mut stream, &mut batch, &mut buf).await {
            return true;
        }
    }
}

/// Writes `batch` (emptied) as one frame, or one frame per message when too large;
/// `false` when the connection failed.
async fn write_batch(
    link: &Link<'_>,
    stream: &mut TcpStream,
    batch: &mut Vec<Outgoing>,
    buf: &mut Vec<u8>,
) -> bool {
    assert!(!batch.is_empty() && batch.len() <= link.batch_max);
    let (me, to, metrics) = (link.me, link.to, link.metrics);
    buf.clear();
    let count = batch.len() as u64;
    let frame = PeerFrame { from: me, to, messages: batch };
    if let Err(e) = encode_frame(&frame, link.limits, buf) {
        // Too large as one frame: send each message alone (a snapshot chunk may be big).
        tracing::debug!(%e, "splitting a peer batch");
        for message in batch.iter() {
            let single = PeerFrame { from: me, to, messages: std::slice::from_ref(message) };
            if encode_frame(&single, link.limits, buf).is_err() {
                metrics.peer_dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    batch.clear();
    if stream.write_all(buf).await.is_err() {
        metrics.peer_dropped.fetch_add(count, Ordering::Relaxed);
        return false;
    }
    metrics.peer_sent.fetch_add(count, Ordering::Relaxed);
    true
}

fn drop_queued(queue: &mut mpsc::Receiver<Outgoing>, metrics: &Metrics) {
    let mut dropped = 0;
    while queue.try_recv().is_ok() {
        dropped += 1;
    }
    metrics.peer_dropped.fetch_add(dropped, Ordering::Relaxed);
}

/// Accepts peer connections and feeds their messages to the keyspaces' engine loops.
pub async fn listener(
    me: NodeId,
    listener: TcpListener,
    inboxes: Arc<Inboxes>,
    members: Vec<NodeId>,
    metrics: Arc<Metrics>,
) {
    loop {
        let Ok((stream, from_addr)) = listener.accept().await else {
            tokio::time::sleep(BACKOFF_MIN).await; // out of descriptors: pause, retry
            continue;
        };
        let _ = stream.set_nodelay(true);
        let inboxes = inboxes.clone();
        let members = members.clone();
        let metrics = metrics.clone();
        tokio::spawn(async move {
            if let Err(reason) = receive(me, stream, &inboxes, &members, &metrics).await {
                tracing::warn!(%from_addr, %reason, "closing peer connection");
            }
        });
    }
}

async fn receive(
    me: NodeId,
    mut stream: TcpStream,
    inboxes: &Inboxes,
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
            let (from, to) = (frame.from, frame.to);
            if to != me || !members.contains(&from) || from == me {
                return Err(format!("frame from {from} to {to} on {me}'s link"));
            }
            for (keyspace, bytes) in frame.envelopes {
                route(inboxes, metrics, from, keyspace, bytes);
            }
        }
        buf.drain(..start);
    }
}

/// Hands one envelope to its keyspace's inbox and counts what became of it.
fn route(inboxes: &Inboxes, metrics: &Metrics, from: NodeId, keyspace: KeyspaceId, bytes: &[u8]) {
    let delivery = match inboxes.get(&keyspace) {
        Some(inbox) => inbox.deliver(from, bytes),
        None => Delivery::Rejected("a keyspace this node does not host"),
    };
    match delivery {
        Delivery::Queued => metrics.peer_received.fetch_add(1, Ordering::Relaxed),
        Delivery::Full => metrics.peer_dropped.fetch_add(1, Ordering::Relaxed),
        Delivery::Rejected(reason) => {
            metrics.rejected(keyspace, from, reason);
            0
        }
    };
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

    #[test]
    fn delay_line_holds_each_item_for_the_delay_in_order_and_bounded() {
        let base = Instant::now(); // only offsets from it matter
        let ms = Duration::from_millis;
        let mut line = DelayLine::new(ms(17), 3);
        assert_eq!(line.next_due(), None);
        line.push(base, 'a').unwrap();
        line.push(base + ms(5), 'b').unwrap();
        line.push(base + ms(2), 'c').unwrap(); // an earlier stamp cannot overtake 'b'
        assert_eq!(line.push(base + ms(6), 'd'), Err('d'), "full: dropped");
        assert_eq!(line.next_due(), Some(base + ms(17)));
        let mut out = Vec::new();
        line.take_due(base + ms(16), 10, &mut out);
        assert!(out.is_empty(), "nothing leaves before stamp + delay");
        line.take_due(base + ms(17), 10, &mut out);
        assert_eq!(out, ['a']);
        line.take_due(base + ms(30), 1, &mut out);
        assert_eq!(out, ['a', 'b'], "count_max bounds one take");
        assert_eq!(line.len(), 1);
        assert_eq!(line.next_due(), Some(base + ms(22)), "'c' restamped at 'b''s time");
        line.take_due(base + ms(22), 10, &mut out);
        assert_eq!(out, ['a', 'b', 'c']);
        assert!(line.is_empty());
    }
}
