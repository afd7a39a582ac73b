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
//! Every connection opens with the handshake of [`crate::handshake`]: the dialer proves
//! it is the member it names and knows the cluster secret, the acceptor proves the same
//! back, all within [`LinkSettings::handshake_timeout`]. Until then the acceptor reads
//! nothing but the handshake's fixed-size messages. A connection whose hello has not
//! verified waits in a shared pool of [`LinkSettings::pending_max`] for at most
//! [`slots::HELLO_TIMEOUT`], the oldest evicted when a new one arrives into a full pool
//! (a flood of connections cannot use up descriptors, nor keep a member's new one out);
//! a hello that verifies moves its connection into the slot of the member it names, one
//! per member, which a connection without that member's hello cannot take
//! ([`slots`]). Once authenticated, a member has one inbound connection: a newer one
//! replaces it. Refused connections are counted by reason and logged, at most one
//! summary line a second. A link that carries nothing for
//! [`LinkSettings::idle_timeout`] is closed; senders keep idle links open with empty
//! frames at a quarter of it.
//!
//! Inbound: each frame is checked (length limit, checksum, addressed to this node, from
//! the member that authenticated) and each envelope goes to its keyspace's [`Inbox`],
//! which decodes it with the keyspace's engine codec, runs the validation gate's
//! stateless half and queues it for the engine loop (dropped when its queue is full). A
//! message that does not decode, fails the gate or names a keyspace this node does not
//! host is dropped and counted with its reason; a malformed frame closes the connection
//! and the peer reconnects. The frame limit is the largest message the configuration
//! can send ([`LinkSettings::limits`]), not a fixed 256 MiB.

pub mod slots;

use crate::driver::PeerEvent;
use crate::handshake::{self, Acceptor, ClusterKey, Dialer, HandshakeError, VerifiedHello};
use crate::metrics::{LinkClosed, Metrics};
use keel_core::engine::Engine;
use keel_exec::{LinkAllowance, LinkHold, LINK_BULK_BYTES_MAX};
use keel_types::rng::SplitMix64;
use keel_types::{KeyspaceId, NodeId};
use keel_wire::peer::{
    decode_frame, encode_frame, Announce, Outgoing, PeerFrame, PeerLimits, PeerMessage,
    LINK_KEYSPACE, PEER_PROTOCOL_MIN,
};
use slots::{OnePerMember, Pool, RefusalLog, HELLO_TIMEOUT, REFUSAL_LOG_INTERVAL};
use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tokio::time::Instant;

/// First reconnect delay.
pub const BACKOFF_MIN: Duration = Duration::from_millis(20);
/// Longest reconnect delay.
pub const BACKOFF_MAX: Duration = Duration::from_millis(1000);
/// Bytes read from a peer socket at a time.
pub const READ_CHUNK_BYTES: usize = 64 * 1024;
/// How long a connection attempt may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// How peer links are secured and bounded; shared by the senders and the listener.
#[derive(Debug)]
pub struct LinkSettings {
    /// The cluster secret's key (or the public key of a cluster without one).
    pub key: ClusterKey,
    /// The frame limits, for sending (split past them) and receiving (close past them).
    pub limits: PeerLimits,
    /// How long a whole handshake may take, on either side.
    pub handshake_timeout: Duration,
    /// A link that carries nothing for this long is closed.
    pub idle_timeout: Duration,
    /// Most inbound connections waiting for their hello (the shared pool).
    pub pending_max: usize,
}

impl LinkSettings {
    /// How often a sender writes an empty frame on a link with nothing else to carry.
    pub fn keepalive(&self) -> Duration {
        self.idle_timeout / 4
    }
}

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
    /// Client values queued for each peer ([`PeerMessage::bulk_bytes`]), within
    /// [`LINK_BULK_BYTES_MAX`].
    bulk: BTreeMap<NodeId, LinkAllowance>,
}

impl PeerQueues {
    /// Queues for the given peers.
    pub fn new(queues: BTreeMap<NodeId, mpsc::Sender<Outgoing>>) -> PeerQueues {
        let bulk = queues.keys().map(|&to| (to, LinkAllowance::new(LINK_BULK_BYTES_MAX))).collect();
        PeerQueues { queues, bulk }
    }

    /// Every other member, in order.
    pub fn members(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.queues.keys().copied()
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

    /// A hold on `bytes` of `to`'s bulk allowance, given back when dropped (with the
    /// message it travels with, once written or dropped); `None` when the link already
    /// holds [`LINK_BULK_BYTES_MAX`] (one value alone always fits).
    pub fn hold_bulk(&self, to: NodeId, bytes: usize) -> Option<LinkHold> {
        let link = self.bulk.get(&to).unwrap_or_else(|| panic!("message to non-member {to}"));
        link.hold(bytes)
    }
}

/// A message queued with its hold on the link's bulk allowance.
pub struct WithBulk<M> {
    /// The message.
    pub message: M,
    /// Its hold, given back when the message is dropped.
    pub hold: LinkHold,
}

impl<M: PeerMessage + Send + Sync> keel_wire::peer::PeerEncode for WithBulk<M> {
    fn encode_to(&self, out: &mut Vec<u8>) {
        self.message.encode(out);
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
    addr: crate::config::PeerAddr,
    mut queue: mpsc::Receiver<Outgoing>,
    batch_max: usize,
    delay: Duration,
    settings: Arc<LinkSettings>,
    metrics: Arc<Metrics>,
) {
    assert!(batch_max >= 1, "a frame carries at least one message");
    let held_max = queue.max_capacity();
    let mut line = DelayLine::new(delay, held_max);
    let mut jitter =
        Jitter::new(u64::from(me.0) << 32 | u64::from(to.0) ^ std::process::id() as u64);
    let mut backoff = BACKOFF_MIN;
    loop {
        let connected = match tokio::time::timeout(CONNECT_TIMEOUT, addr.connect()).await {
            Ok(Ok(mut stream)) => {
                let _ = stream.set_nodelay(true);
                let dialed = dial(&settings.key, me, to, &mut stream);
                match tokio::time::timeout(settings.handshake_timeout, dialed).await {
                    Ok(Ok(())) => Some(stream),
                    Ok(Err(DialError::Io(e))) => {
                        metrics.link_closed(LinkClosed::HandshakeIo);
                        tracing::debug!(%to, %addr, reason = %e, "peer handshake broke off");
                        None
                    }
                    Ok(Err(DialError::Handshake(e))) => {
                        // The acceptor does not know our secret (or is not a Keel peer).
                        metrics.link_closed(LinkClosed::from(e));
                        tracing::warn!(%to, %addr, reason = %e, "peer handshake failed");
                        None
                    }
                    Err(_) => {
                        metrics.link_closed(LinkClosed::HandshakeTimeout);
                        None
                    }
                }
            }
            _ => None,
        };
        let stream = match connected {
            Some(stream) => stream,
            None => {
                drop_queued(&mut queue, &metrics);
                if queue.is_closed() {
                    return;
                }
                tokio::time::sleep(jitter.spread(backoff)).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        tracing::debug!(%to, %addr, "peer link up");
        backoff = BACKOFF_MIN;
        let link = Link { me, to, batch_max, settings: &settings, metrics: &metrics };
        let mut stream = stream;
        if !announce(&link, &mut stream).await {
            continue;
        }
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

/// The dialer's half of the handshake on a fresh connection (the caller bounds its time).
async fn dial(
    key: &ClusterKey,
    me: NodeId,
    to: NodeId,
    stream: &mut TcpStream,
) -> Result<(), DialError> {
    let (dialer, hello) = Dialer::new(key, me, to, handshake::nonce());
    stream.write_all(&hello).await?;
    let mut challenge = [0u8; handshake::CHALLENGE_BYTES];
    stream.read_exact(&mut challenge).await?;
    let proof = dialer.answer(&challenge)?;
    stream.write_all(&proof).await?;
    Ok(())
}

/// Why dialing a peer failed after the connection was made.
#[derive(Debug)]
enum DialError {
    Io(std::io::Error),
    Handshake(HandshakeError),
}

impl From<std::io::Error> for DialError {
    fn from(e: std::io::Error) -> Self {
        DialError::Io(e)
    }
}

impl From<HandshakeError> for DialError {
    fn from(e: HandshakeError) -> Self {
        DialError::Handshake(e)
    }
}

impl std::fmt::Display for DialError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DialError::Io(e) => write!(f, "{e}"),
            DialError::Handshake(e) => write!(f, "{e}"),
        }
    }
}

/// What a sender needs to write frames to one peer.
struct Link<'a> {
    me: NodeId,
    to: NodeId,
    batch_max: usize,
    settings: &'a LinkSettings,
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
    let keepalive = link.settings.keepalive();
    loop {
        tokio::select! {
            count = queue.recv_many(&mut batch, link.batch_max) => {
                if count == 0 {
                    return false;
                }
                if !write_batch(link, &mut stream, &mut batch, &mut buf).await {
                    return true;
                }
            }
            () = tokio::time::sleep(keepalive) => {
                if !write_keepalive(link, &mut stream, &mut buf).await {
                    return true;
                }
            }
        }
    }
}

/// Writes the link's first frame: the peer protocol this node speaks (`keel_wire::peer`'s
/// `link`), unless it speaks protocol 1, which announced nothing; `false` when the
/// connection failed.
async fn announce(link: &Link<'_>, stream: &mut TcpStream) -> bool {
    let protocol = link.settings.limits.protocol;
    if protocol <= PEER_PROTOCOL_MIN {
        return true;
    }
    let message: Box<dyn keel_wire::peer::PeerEncode> = Box::new(Announce(protocol));
    let outgoing = [Outgoing { keyspace: LINK_KEYSPACE, message }];
    let frame = PeerFrame { from: link.me, to: link.to, messages: &outgoing };
    let mut buf = Vec::new();
    encode_frame(&frame, &link.settings.limits, &mut buf).expect("an announcement fits");
    stream.write_all(&buf).await.is_ok()
}

/// Writes an empty frame, so that the receiver does not close an idle link; `false`
/// when the connection failed.
async fn write_keepalive(link: &Link<'_>, stream: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    buf.clear();
    let frame = PeerFrame { from: link.me, to: link.to, messages: &[] };
    encode_frame(&frame, &link.settings.limits, buf).expect("an empty frame fits");
    stream.write_all(buf).await.is_ok()
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
    let mut last_write = Instant::now();
    loop {
        let due = line.next_due();
        let keepalive_at = last_write + link.settings.keepalive();
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
            () = tokio::time::sleep_until(keepalive_at) => {
                if !write_keepalive(link, &mut stream, &mut buf).await {
                    return true;
                }
                last_write = Instant::now();
            }
        }
        line.take_due(Instant::now(), link.batch_max, &mut batch);
        if !batch.is_empty() {
            if !write_batch(link, &mut stream, &mut batch, &mut buf).await {
                return true;
            }
            last_write = Instant::now();
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
    let (me, to, metrics, limits) = (link.me, link.to, link.metrics, &link.settings.limits);
    buf.clear();
    let count = batch.len() as u64;
    let frame = PeerFrame { from: me, to, messages: batch };
    if let Err(e) = encode_frame(&frame, limits, buf) {
        // Too large as one frame: send each message alone (a snapshot chunk may be big).
        tracing::debug!(%e, "splitting a peer batch");
        for message in batch.iter() {
            let single = PeerFrame { from: me, to, messages: std::slice::from_ref(message) };
            if encode_frame(&single, limits, buf).is_err() {
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

/// What the listener and its connections' tasks share.
struct Accepting {
    me: NodeId,
    inboxes: Arc<Inboxes>,
    members: Vec<NodeId>,
    settings: Arc<LinkSettings>,
    metrics: Arc<Metrics>,
    /// The handshakes past a verified hello, one per member: a newer one displaces the
    /// older (the member gave up on it, or it was a copied hello).
    unfinished: Mutex<OnePerMember<(AbortHandle, SocketAddr)>>,
    /// The authenticated link of each member: a newer one aborts the older (a peer that
    /// reconnects after a network fault must not wait for the dead connection to time
    /// out, and no member may hold more than one).
    inbound: Mutex<OnePerMember<AbortHandle>>,
    refusals: Mutex<RefusalLog>,
}

impl Accepting {
    /// Counts a connection from `from` closed before it authenticated, and writes the
    /// summary of such refusals when one is due.
    fn refuse(&self, why: LinkClosed, from: SocketAddr) {
        self.metrics.link_closed(why);
        let summary = self.refusals.lock().expect("refusals lock").note(why, from, Instant::now());
        if let Some(summary) = summary {
            tracing::warn!("{summary}");
        }
    }

    /// Writes the summary of the refusals held, if one is due.
    fn flush_refusals(&self) {
        let summary = self.refusals.lock().expect("refusals lock").flush(Instant::now());
        if let Some(summary) = summary {
            tracing::warn!("{summary}");
        }
    }

    /// Makes connection `id` (`task`) the link of `from`, aborting the one it replaces.
    fn adopt(&self, from: NodeId, id: u64, task: AbortHandle) {
        let old = self.inbound.lock().expect("inbound lock").put(from, id, task);
        if let Some(old) = old {
            tracing::info!(%from, "a newer connection from this member replaces its link");
            old.abort();
            self.metrics.link_closed(LinkClosed::Replaced);
        }
    }
}

/// A connection in the pool, and what of its hello has arrived.
struct Pending {
    id: u64,
    stream: TcpStream,
    from: SocketAddr,
    accepted: Instant,
    hello: [u8; handshake::HELLO_BYTES],
    filled: usize,
}

/// What reading a pooled connection's hello came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HelloRead {
    /// Not all of it has arrived.
    Waiting,
    /// All of it is in.
    Complete,
    /// The connection ended, failed, or its first bytes are not a hello.
    Refused(LinkClosed),
}

impl Pending {
    /// Reads what has arrived of the hello, without waiting; never past the hello.
    fn read_hello(&mut self) -> HelloRead {
        while self.filled < handshake::HELLO_BYTES {
            match self.stream.try_read(&mut self.hello[self.filled..]) {
                Ok(0) => return HelloRead::Refused(LinkClosed::HandshakeIo),
                Ok(n) => self.filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return HelloRead::Waiting,
                Err(_) => return HelloRead::Refused(LinkClosed::HandshakeIo),
            }
            let start: &[u8; 8] = self.hello[..8].try_into().expect("8 bytes");
            if self.filled >= 8 && !handshake::opens_hello(start) {
                return HelloRead::Refused(LinkClosed::NotAHandshake);
            }
        }
        assert_eq!(self.filled, handshake::HELLO_BYTES);
        HelloRead::Complete
    }
}

/// When a pooled connection's hello was read in full (for the debug log).
#[derive(Clone, Copy, Debug)]
enum ReadAt {
    Accept,
    Readable,
    Eviction,
    Deadline,
}

/// What woke the listener.
enum PortEvent {
    Readable(usize),
    Expired,
    Tick,
    Accepted(std::io::Result<(TcpStream, SocketAddr)>),
}

/// Accepts peer connections and feeds their messages to the keyspaces' engine loops.
///
/// One task holds every connection that has not yet sent a verified hello (the [`Pool`],
/// `pending_max` of them, each for at most [`HELLO_TIMEOUT`]), and reads each as soon as
/// it is readable, before it accepts the next connection: so a connection is evicted
/// only after its hello had its chance to be read (and it is read once more then). A
/// verified hello moves its connection into a task of its own, in its member's slot.
pub async fn listener(
    me: NodeId,
    listener: TcpListener,
    inboxes: Arc<Inboxes>,
    members: Vec<NodeId>,
    settings: Arc<LinkSettings>,
    metrics: Arc<Metrics>,
) {
    let mut pool = Pool::new(settings.pending_max, HELLO_TIMEOUT.min(settings.handshake_timeout));
    let accepting = Arc::new(Accepting {
        me,
        inboxes,
        members,
        settings,
        metrics,
        unfinished: Mutex::new(OnePerMember::default()),
        inbound: Mutex::new(OnePerMember::default()),
        refusals: Mutex::new(RefusalLog::default()),
    });
    let mut tick = tokio::time::interval(REFUSAL_LOG_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut next_id = 0u64;
    loop {
        let deadline = pool.deadline();
        let event = tokio::select! {
            biased; // what has arrived first, then what is due, then newcomers
            index = readable(&pool) => PortEvent::Readable(index),
            () = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)),
                if deadline.is_some() => PortEvent::Expired,
            _ = tick.tick() => PortEvent::Tick,
            accepted = listener.accept() => PortEvent::Accepted(accepted),
        };
        match event {
            PortEvent::Readable(index) => {
                let read = pool.get_mut(index).read_hello();
                if read != HelloRead::Waiting {
                    let pending = pool.take(index);
                    settle(&accepting, pending, read, ReadAt::Readable);
                }
            }
            PortEvent::Expired => {
                while let Some(mut pending) = pool.expire(Instant::now()) {
                    let read = pending.read_hello(); // a last read before it is closed
                    settle(&accepting, pending, read, ReadAt::Deadline);
                }
            }
            PortEvent::Tick => accepting.flush_refusals(),
            PortEvent::Accepted(Ok((stream, from))) => {
                next_id += 1;
                let pending = Pending {
                    id: next_id,
                    stream,
                    from,
                    accepted: Instant::now(),
                    hello: [0; handshake::HELLO_BYTES],
                    filled: 0,
                };
                admit(&accepting, &mut pool, pending);
            }
            // Out of descriptors: pause, retry.
            PortEvent::Accepted(Err(_)) => tokio::time::sleep(BACKOFF_MIN).await,
        }
    }
}

/// The index of a pooled connection with bytes (or its end) to read; pending while
/// none has.
fn readable(pool: &Pool<Pending>) -> impl std::future::Future<Output = usize> + '_ {
    std::future::poll_fn(move |cx| {
        for (index, pending) in pool.iter().enumerate() {
            if pending.stream.poll_read_ready(cx).is_ready() {
                return std::task::Poll::Ready(index);
            }
        }
        std::task::Poll::Pending
    })
}

/// Takes a new connection in: reads its hello at once (a member's is often there
/// already), else pools it, evicting the oldest pooled connection if the pool is full
/// (after a last read of it).
fn admit(accepting: &Arc<Accepting>, pool: &mut Pool<Pending>, mut pending: Pending) {
    let _ = pending.stream.set_nodelay(true);
    let read = pending.read_hello();
    if read != HelloRead::Waiting {
        return settle(accepting, pending, read, ReadAt::Accept);
    }
    if let Some(mut evicted) = pool.admit(pending.accepted, pending) {
        let read = evicted.read_hello();
        settle(accepting, evicted, read, ReadAt::Eviction);
    }
}

/// Ends a connection's time in the pool: a verified hello moves it into its member's
/// slot; anything else closes it, counted and logged.
fn settle(accepting: &Arc<Accepting>, pending: Pending, read: HelloRead, at: ReadAt) {
    let why = match (read, at) {
        (HelloRead::Complete, _) => {
            let (me, members, key) = (accepting.me, &accepting.members, &accepting.settings.key);
            match handshake::verify_hello(key, me, members, &pending.hello) {
                Ok(hello) => {
                    let waited_us = pending.accepted.elapsed().as_micros() as u64;
                    let (from, member) = (pending.from, hello.from());
                    tracing::debug!(%from, %member, waited_us, ?at, "peer hello verified");
                    return start_handshake(accepting, pending, hello);
                }
                Err(e) => LinkClosed::from(e),
            }
        }
        (HelloRead::Refused(why), _) => why,
        (HelloRead::Waiting, ReadAt::Eviction) => LinkClosed::TooManyPending,
        (HelloRead::Waiting, _) => LinkClosed::HandshakeTimeout,
    };
    // Closed with a reset: the node keeps no socket in `TIME_WAIT` (a minute each) for
    // each connection of a flood.
    let _ = pending.stream.set_zero_linger();
    accepting.refuse(why, pending.from);
}

/// Runs the rest of a verified hello's handshake, then the link, in a task of its own
/// that holds the slot of the member the hello names (displacing the one that did).
fn start_handshake(accepting: &Arc<Accepting>, pending: Pending, hello: VerifiedHello) {
    let (id, from, member) = (pending.id, pending.from, hello.from());
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<AbortHandle>();
    let task_accepting = accepting.clone();
    let task = tokio::spawn(async move {
        let Ok(own) = ready_rx.await else { return };
        handshake_then_receive(&task_accepting, pending, hello, own).await;
    });
    let mut unfinished = accepting.unfinished.lock().expect("unfinished lock");
    let displaced = unfinished.put(member, id, (task.abort_handle(), from));
    drop(unfinished);
    if let Some((displaced, displaced_from)) = displaced {
        displaced.abort();
        accepting.refuse(LinkClosed::Displaced, displaced_from);
    }
    let _ = ready_tx.send(task.abort_handle());
}

/// The challenge and proof of a verified hello's connection (within the handshake's
/// deadline from its accept), then its frames until it closes.
async fn handshake_then_receive(
    accepting: &Accepting,
    pending: Pending,
    hello: VerifiedHello,
    own: AbortHandle,
) {
    let Pending { id, mut stream, from: from_addr, accepted, .. } = pending;
    let from = hello.from();
    let deadline = accepted + accepting.settings.handshake_timeout;
    let shake = tokio::time::timeout_at(deadline, challenge(accepting, &mut stream, hello)).await;
    accepting.unfinished.lock().expect("unfinished lock").forget(from, id);
    match shake {
        Ok(Ok(())) => {}
        Ok(Err(why)) => return accepting.refuse(why, from_addr),
        Err(_) => return accepting.refuse(LinkClosed::HandshakeTimeout, from_addr),
    }
    accepting.adopt(from, id, own);
    let result = receive(accepting, from, id, stream).await;
    accepting.inbound.lock().expect("inbound lock").forget(from, id);
    accepting.metrics.peer_link_closed(from, id);
    if let Err(reason) = result {
        tracing::warn!(%from_addr, %from, %reason, "closing peer connection");
    }
}

/// The acceptor's half of the handshake after the hello: the challenge out, the proof in.
async fn challenge(
    accepting: &Accepting,
    stream: &mut TcpStream,
    hello: VerifiedHello,
) -> Result<(), LinkClosed> {
    let io = |_| LinkClosed::HandshakeIo;
    let from = hello.from();
    let (acceptor, challenge) = Acceptor::new(&accepting.settings.key, hello, handshake::nonce());
    stream.write_all(&challenge).await.map_err(io)?;
    let mut proof = [0u8; handshake::PROOF_BYTES];
    stream.read_exact(&mut proof).await.map_err(io)?;
    let proved = acceptor.finish(&proof)?;
    assert_eq!(proved, from, "the proof is of the hello's member");
    Ok(())
}

/// Reads frames from authenticated member `from` until the connection closes, breaks a
/// rule or stays idle past the limit.
async fn receive(
    accepting: &Accepting,
    from: NodeId,
    link: u64,
    mut stream: TcpStream,
) -> Result<(), String> {
    let (me, settings, metrics) = (accepting.me, &accepting.settings, &accepting.metrics);
    let mut buf: Vec<u8> = Vec::with_capacity(READ_CHUNK_BYTES);
    let mut chunk = vec![0u8; READ_CHUNK_BYTES];
    // A node of protocol 1 announces nothing; a later one says so in its first frame.
    let speaks = settings.limits.protocol;
    metrics.peer_protocol_seen(from, link, PEER_PROTOCOL_MIN);
    loop {
        let read = tokio::time::timeout(settings.idle_timeout, stream.read(&mut chunk)).await;
        let Ok(read) = read else {
            metrics.link_closed(LinkClosed::Idle);
            return Err("idle past peer_idle_timeout_ms".into());
        };
        let n = read.map_err(|e| e.to_string())?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut start = 0;
        while let Some((frame, used)) =
            decode_frame(&buf[start..], &settings.limits).map_err(|e| {
                metrics.link_closed(LinkClosed::BadFrame);
                e.to_string()
            })?
        {
            start += used;
            if frame.to != me || frame.from != from {
                metrics.link_closed(LinkClosed::BadFrame);
                return Err(format!("frame from {} to {} on {from}'s link", frame.from, frame.to));
            }
            for (keyspace, bytes) in frame.envelopes {
                if keyspace == LINK_KEYSPACE && speaks > PEER_PROTOCOL_MIN {
                    if let Some(Announce(protocol)) = Announce::decode(bytes) {
                        metrics.peer_protocol_seen(from, link, protocol);
                    }
                    continue;
                }
                route(&accepting.inboxes, metrics, from, keyspace, bytes);
            }
        }
        buf.drain(..start);
        if buf.capacity() > 4 * READ_CHUNK_BYTES && buf.len() < READ_CHUNK_BYTES {
            buf.shrink_to(READ_CHUNK_BYTES); // a large frame passed: give its memory back
        }
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

    /// A listener of node 1 of {1, 2, 3} with a pool of `pending_max`, its address and
    /// its metrics.
    async fn listening(pending_max: usize) -> (SocketAddr, Arc<LinkSettings>, Arc<Metrics>) {
        let socket = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        let settings = Arc::new(LinkSettings {
            key: ClusterKey::new(b"a cluster secret of enough bytes"),
            limits: PeerLimits::default(),
            handshake_timeout: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(30),
            pending_max,
        });
        let metrics = Arc::new(Metrics::default());
        let members = vec![NodeId(1), NodeId(2), NodeId(3)];
        let inboxes = Arc::new(Inboxes::new());
        let (s, m) = (settings.clone(), metrics.clone());
        tokio::spawn(listener(NodeId(1), socket, inboxes, members, s, m));
        (addr, settings, metrics)
    }

    /// Waits (at most 10 s) until `metrics` counted `count` closes for `why`.
    async fn counted(metrics: &Metrics, why: LinkClosed, count: u64) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while metrics.links_closed_count(why) < count && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        metrics.links_closed_count(why) >= count
    }

    #[tokio::test]
    async fn a_members_handshake_finishes_through_a_flood_of_silent_and_forged_connections() {
        let (addr, settings, metrics) = listening(4).await;
        let mut flood = Vec::new();
        for _ in 0..32 {
            flood.push(TcpStream::connect(addr).await.unwrap()); // silent
        }
        // Member 2 dials: its hello takes it out of the full pool, its handshake finishes.
        let mut member = TcpStream::connect(addr).await.unwrap();
        dial(&settings.key, NodeId(2), NodeId(1), &mut member).await.expect("accepted");
        for _ in 0..32 {
            flood.push(TcpStream::connect(addr).await.unwrap());
        }
        // A hello claiming member 3 made with another key, and garbage: refused at once.
        let other = ClusterKey::new(b"another secret, of enough bytes!");
        let (_, forged) = Dialer::new(&other, NodeId(3), NodeId(1), handshake::nonce());
        let mut forger = TcpStream::connect(addr).await.unwrap();
        forger.write_all(&forged).await.unwrap();
        let mut garbage = TcpStream::connect(addr).await.unwrap();
        garbage.write_all(&[0x5a; 16]).await.unwrap();
        assert!(counted(&metrics, LinkClosed::TooManyPending, 60).await, "the oldest evicted");
        assert!(counted(&metrics, LinkClosed::BadProof, 1).await);
        assert!(counted(&metrics, LinkClosed::NotAHandshake, 1).await);
        let mut byte = [0u8; 1];
        assert_eq!(forger.read(&mut byte).await.map_or(0, |n| n), 0, "the forger is closed");
        // The member's link stays open: a keepalive goes through and nothing closes it.
        write_keepalive_to(&settings, &mut member).await;
        let read = tokio::time::timeout(Duration::from_millis(200), member.read(&mut byte)).await;
        assert!(read.is_err(), "the acceptor neither writes nor closes: {read:?}");
        assert_eq!(metrics.links_closed_count(LinkClosed::HandshakeIo), 0);
        assert_eq!(metrics.links_closed_count(LinkClosed::HandshakeTimeout), 0);
        drop(flood);
    }

    #[tokio::test]
    async fn a_members_newer_verified_hello_displaces_its_unfinished_handshake() {
        let (addr, settings, metrics) = listening(4).await;
        // A verified hello of member 2 that never answers the challenge (a stalled dial,
        // or a copied hello)...
        let (_, hello) = Dialer::new(&settings.key, NodeId(2), NodeId(1), handshake::nonce());
        let mut stalled = TcpStream::connect(addr).await.unwrap();
        stalled.write_all(&hello).await.unwrap();
        let mut challenge = [0u8; handshake::CHALLENGE_BYTES];
        stalled.read_exact(&mut challenge).await.expect("its hello verified: a challenge");
        // ...is displaced by member 2's next connection, which finishes.
        let mut member = TcpStream::connect(addr).await.unwrap();
        dial(&settings.key, NodeId(2), NodeId(1), &mut member).await.expect("accepted");
        assert!(counted(&metrics, LinkClosed::Displaced, 1).await);
        let mut byte = [0u8; 1];
        assert_eq!(stalled.read(&mut byte).await.map_or(0, |n| n), 0, "closed");
    }

    #[tokio::test]
    async fn a_link_records_the_peer_protocol_its_member_announces_until_it_closes() {
        let (addr, settings, metrics) = listening(4).await;
        let seen = |id: u32| metrics.peer_protocols().get(&NodeId(id)).copied();
        let wait_for = |id: u32, protocol: u8| {
            let deadline = Instant::now() + Duration::from_secs(10);
            async move {
                while seen(id) != Some(protocol) && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                seen(id) == Some(protocol)
            }
        };
        // Member 2 announces this build's protocol, as `sender` does.
        let mut member = TcpStream::connect(addr).await.unwrap();
        dial(&settings.key, NodeId(2), NodeId(1), &mut member).await.expect("accepted");
        let link = Link {
            me: NodeId(2),
            to: NodeId(1),
            batch_max: 1,
            settings: &settings,
            metrics: &metrics,
        };
        assert!(announce(&link, &mut member).await);
        assert!(
            wait_for(2, keel_wire::peer::PEER_PROTOCOL).await,
            "{:?}",
            metrics.peer_protocols()
        );
        // Member 3 is of protocol 1: it announces nothing; a keepalive passes and it
        // counts as 1. A forged announcement below 2 changes nothing.
        let mut older = TcpStream::connect(addr).await.unwrap();
        dial(&settings.key, NodeId(3), NodeId(1), &mut older).await.expect("accepted");
        let mut buf = Vec::new();
        let message: Box<dyn keel_wire::peer::PeerEncode> = Box::new(Announce(1));
        let outgoing = [Outgoing { keyspace: LINK_KEYSPACE, message }];
        let frame = PeerFrame { from: NodeId(3), to: NodeId(1), messages: &outgoing };
        encode_frame(&frame, &settings.limits, &mut buf).unwrap();
        older.write_all(&buf).await.unwrap();
        assert!(wait_for(3, 1).await, "{:?}", metrics.peer_protocols());
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(seen(3), Some(1));
        assert_eq!(seen(2), Some(keel_wire::peer::PEER_PROTOCOL), "member 2's link kept");
        // Member 3's link closes (it stops, to start again perhaps as another version):
        // nothing is claimed for it until it dials again.
        drop(older);
        let deadline = Instant::now() + Duration::from_secs(10);
        while seen(3).is_some() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(seen(3), None, "{:?}", metrics.peer_protocols());
    }

    /// Writes an empty frame from member 2 to node 1.
    async fn write_keepalive_to(settings: &LinkSettings, stream: &mut TcpStream) {
        let mut buf = Vec::new();
        let frame = PeerFrame { from: NodeId(2), to: NodeId(1), messages: &[] };
        encode_frame(&frame, &settings.limits, &mut buf).unwrap();
        stream.write_all(&buf).await.unwrap();
    }
}
