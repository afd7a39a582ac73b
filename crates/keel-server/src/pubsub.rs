//! Pub/sub on a node: who listens to which channel, pattern or shard channel
//! ([`Broker`]), each connection's queue of pushed frames ([`Outbox`]), messages
//! published here and at the other members, and keyspace notifications of what this
//! node's replicas apply.
//!
//! - **Publishing.** `PUBLISH` delivers to this node's listeners at once (on the
//!   publishing connection's task: its own work) and answers how many got it, as a Redis
//!   Cluster node does; it also sends the message to every other member, in an envelope
//!   of the reserved keyspace [`PUBSUB_KEYSPACE`] on the peer link, within the link's
//!   allowance for client values (past it, that member misses the message and
//!   `keel_pubsub_dropped` counts it). Messages from one node reach another in the order
//!   they were published there.
//! - **Delivery off the links and loops.** A message from a peer and the keyspace events
//!   an engine loop hands over are queued (bounded: [`DELIVERIES_MAX`] batches, past it
//!   dropped and counted) for the broker's own task, which matches patterns and fills
//!   outboxes: neither a peer receiver nor an engine loop does client work.
//! - **Keyspace notifications.** `notify-keyspace-events` (a node's setting, as in Redis)
//!   turns on the engines' recording of events; each node names what its own replicas
//!   apply, so a subscriber at any node hears every key's changes. The channel names the
//!   number `SELECT` reaches the key by: the database for keyspace 0, the keyspace's
//!   number otherwise. A subscriber hears only the keyspaces its user may use.
//! - **Bounds.** A connection's outbox holds at most [`OUTBOX_BYTES_MAX`] of frames not
//!   yet written (Redis's hard limit for pub/sub clients): past it, the connection is
//!   closed, as Redis closes a subscriber that does not keep up.

use crate::acl::User;
use crate::metrics::Metrics;
use crate::peer::{Delivery as PeerDelivery, Inbox, PeerQueues, WithBulk};
use bytes::Bytes;
use keel_core::engine::{EventClass, KeyEvent};
use keel_types::{KeyspaceId, NodeId};
use keel_wire::command::Space;
use keel_wire::peer::{PeerError, PeerLimits, PeerMessage};
use keel_wire::resp::{Frame, Protocol};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use tokio::sync::mpsc;

/// The keyspace id that names pub/sub on the peer links (no keyspace has it).
pub const PUBSUB_KEYSPACE: KeyspaceId = KeyspaceId(u32::MAX);
/// Most bytes of frames a connection's outbox holds before the connection is closed.
pub const OUTBOX_BYTES_MAX: usize = 32 << 20;
/// Most batches (a peer's message, a step's events) queued for the broker's task.
pub const DELIVERIES_MAX: usize = 4096;
/// Format byte of a published message on the peer link.
const PUBLISH_FORMAT_V1: u8 = 1;

/// One frame for a connection's writer, or the word to close it.
pub enum Pushed {
    /// A frame to write, in the protocol the connection had when it was queued.
    Frame(Frame, Protocol, usize),
    /// The outbox overflowed: close the connection.
    Overflow,
}

/// A connection's queue of pushed frames (pub/sub messages and confirmations), written by
/// its writer between replies.
#[derive(Debug)]
pub struct Outbox {
    tx: mpsc::UnboundedSender<Pushed>,
    bytes: Arc<AtomicUsize>,
    resp3: AtomicBool,
    overflowed: AtomicBool,
}

/// The writer's end of an [`Outbox`].
pub struct Pushes {
    /// The frames.
    pub rx: mpsc::UnboundedReceiver<Pushed>,
    /// Bytes queued, given back as each is written.
    pub bytes: Arc<AtomicUsize>,
}

impl Outbox {
    /// An outbox and the writer's end of it.
    pub fn new() -> (Arc<Outbox>, Pushes) {
        let (tx, rx) = mpsc::unbounded_channel();
        let bytes = Arc::new(AtomicUsize::new(0));
        let outbox = Outbox {
            tx,
            bytes: bytes.clone(),
            resp3: AtomicBool::new(false),
            overflowed: AtomicBool::new(false),
        };
        (Arc::new(outbox), Pushes { rx, bytes })
    }

    /// The connection's protocol from now on (`HELLO`).
    pub fn set_protocol(&self, protocol: Protocol) {
        self.resp3.store(protocol == Protocol::Resp3, Ordering::Relaxed);
    }

    /// Queues `frame`; `false` if the connection is gone or past its bound (closed then).
    pub fn push(&self, frame: Frame) -> bool {
        if self.overflowed.load(Ordering::Relaxed) {
            return false;
        }
        let size = frame_bytes(&frame);
        let held = self.bytes.fetch_add(size, Ordering::Relaxed) + size;
        if held > OUTBOX_BYTES_MAX {
            self.overflowed.store(true, Ordering::Relaxed);
            let _ = self.tx.send(Pushed::Overflow);
            return false;
        }
        let protocol = match self.resp3.load(Ordering::Relaxed) {
            true => Protocol::Resp3,
            false => Protocol::Resp2,
        };
        self.tx.send(Pushed::Frame(frame, protocol, size)).is_ok()
    }
}

/// About what a pushed frame takes queued: its strings and a little per element.
fn frame_bytes(frame: &Frame) -> usize {
    match frame {
        Frame::Push(items) | Frame::Array(items) => {
            16 + items.iter().map(frame_bytes).sum::<usize>()
        }
        Frame::Bulk(bytes) => 16 + bytes.len(),
        _ => 16,
    }
}

/// One connection as a listener: its outbox and its user (which keyspaces' events it may
/// hear).
#[derive(Debug)]
pub struct Listener {
    /// The connection's id.
    pub id: u64,
    /// Where its frames go.
    pub outbox: Arc<Outbox>,
    /// Its user (`None`: a node without users).
    pub user: Option<Arc<User>>,
}

type Listeners = BTreeMap<u64, Arc<Listener>>;

/// What is subscribed to on the node, by space and name.
#[derive(Debug, Default)]
pub struct Registry {
    spaces: [HashMap<Bytes, Listeners>; 3],
}

impl Registry {
    /// Adds `listener` to `name` in `space`.
    pub fn add(&mut self, space: Space, name: &Bytes, listener: &Arc<Listener>) {
        let listeners = self.spaces[space.at()].entry(name.clone()).or_default();
        listeners.insert(listener.id, listener.clone());
    }

    /// Removes connection `id` from `name` in `space`.
    pub fn remove(&mut self, space: Space, name: &[u8], id: u64) {
        let map = &mut self.spaces[space.at()];
        if let Some(listeners) = map.get_mut(name) {
            listeners.remove(&id);
            if listeners.is_empty() {
                map.remove(name);
            }
        }
    }

    /// The names of `space` with listeners (those `pattern` matches, if given).
    pub fn names(&self, space: Space, pattern: Option<&[u8]>) -> Vec<Bytes> {
        let mut names: Vec<Bytes> = self.spaces[space.at()]
            .keys()
            .filter(|name| pattern.is_none_or(|p| keel_wire::glob::matches(p, name)))
            .cloned()
            .collect();
        names.sort();
        names
    }

    /// How many listen to `name` in `space`.
    pub fn count(&self, space: Space, name: &[u8]) -> usize {
        self.spaces[space.at()].get(name).map_or(0, BTreeMap::len)
    }

    /// How many distinct names `space` has.
    pub fn distinct(&self, space: Space) -> usize {
        self.spaces[space.at()].len()
    }

    /// Delivers `message` on `channel` (a shard channel if `shard`) to every listener of
    /// it and of a pattern matching it, those `may` lets hear it; how many received it.
    fn deliver(
        &self,
        shard: bool,
        channel: &Bytes,
        message: &Bytes,
        may: impl Fn(&Listener) -> bool,
    ) -> usize {
        let mut received = 0;
        let (space, kind) = match shard {
            true => (Space::Shard, "smessage"),
            false => (Space::Channel, "message"),
        };
        for listener in self.spaces[space.at()].get(channel).into_iter().flat_map(|l| l.values()) {
            let frame = Frame::Push(vec![
                Frame::bulk(kind),
                Frame::Bulk(channel.clone()),
                Frame::Bulk(message.clone()),
            ]);
            if may(listener) && listener.outbox.push(frame) {
                received += 1;
            }
        }
        if shard {
            return received;
        }
        for (pattern, listeners) in &self.spaces[Space::Pattern.at()] {
            if !keel_wire::glob::matches(pattern, channel) {
                continue;
            }
            for listener in listeners.values().filter(|l| may(l)) {
                let frame = Frame::Push(vec![
                    Frame::bulk("pmessage"),
                    Frame::Bulk(pattern.clone()),
                    Frame::Bulk(channel.clone()),
                    Frame::Bulk(message.clone()),
                ]);
                if listener.outbox.push(frame) {
                    received += 1;
                }
            }
        }
        received
    }
}

/// What the broker's task delivers.
enum Delivery {
    /// A message published at another member.
    Remote { shard: bool, channel: Bytes, message: Bytes },
    /// Keyspace events one of this node's replicas applied.
    Events(KeyspaceId, Vec<KeyEvent>),
}

/// The node's pub/sub: its listeners, the peers it forwards to, and its keyspace
/// notification flags.
#[derive(Debug)]
pub struct Broker {
    registry: Mutex<Registry>,
    peers: Option<Arc<PeerQueues>>,
    deliveries: mpsc::Sender<Delivery>,
    /// `notify-keyspace-events` as Redis's flag bits ([`Flags`]).
    flags: AtomicU32,
    metrics: Arc<Metrics>,
    /// A sharded cluster's node: keyspace notifications name database 0, the only one
    /// a cluster client knows, whichever keyspace the key is in.
    sharded: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Delivery::Remote { channel, .. } => write!(f, "Remote({channel:?})"),
            Delivery::Events(ks, events) => write!(f, "Events({ks}, {})", events.len()),
        }
    }
}

impl Broker {
    /// A broker forwarding to `peers` (`None`: this node alone), with its delivery task
    /// spawned on the current runtime if there is one.
    pub fn start(peers: Option<Arc<PeerQueues>>, metrics: Arc<Metrics>) -> Arc<Broker> {
        let (deliveries, rx) = mpsc::channel(DELIVERIES_MAX);
        let broker = Arc::new(Broker {
            registry: Mutex::default(),
            peers,
            deliveries,
            flags: AtomicU32::new(0),
            metrics,
            sharded: Default::default(),
        });
        if tokio::runtime::Handle::try_current().is_ok() {
            tokio::spawn(deliver(Arc::downgrade(&broker), rx));
        }
        broker
    }

    /// The registry, locked (subscriptions change under it, so a confirmation and the
    /// first message after it are queued in that order).
    pub fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `PUBLISH`: delivers here and sends to every other member; how many listeners of
    /// this node received it.
    pub fn publish(&self, shard: bool, channel: Bytes, message: Bytes) -> usize {
        let received = self.lock().deliver(shard, &channel, &message, |_| true);
        let Some(peers) = &self.peers else { return received };
        let bytes = channel.len() + message.len();
        for to in peers.members() {
            let sent = peers.hold_bulk(to, bytes).is_some_and(|hold| {
                let message =
                    Published { shard, channel: channel.clone(), message: message.clone() };
                let message = Box::new(WithBulk { message, hold });
                peers.send(to, keel_wire::peer::Outgoing { keyspace: PUBSUB_KEYSPACE, message })
            });
            if !sent {
                self.metrics.pubsub_dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
        received
    }

    /// The keyspace events a replica of `keyspace` applied, for the broker's task (called
    /// on the engine loop: a queue push, no more).
    pub fn applied(&self, keyspace: KeyspaceId, events: Vec<KeyEvent>) {
        if self.deliveries.try_send(Delivery::Events(keyspace, events)).is_err() {
            self.metrics.pubsub_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Whether engines should record keyspace events (some class and `K` or `E` set).
    pub fn recording(&self) -> bool {
        Flags(self.flags.load(Ordering::Relaxed)).active()
    }

    /// `notify-keyspace-events` now.
    pub fn flags(&self) -> Flags {
        Flags(self.flags.load(Ordering::Relaxed))
    }

    /// Makes keyspace notifications name database 0 (a sharded cluster's node).
    pub fn set_sharded(&self) {
        self.sharded.store(true, Ordering::Relaxed);
    }

    /// Sets `notify-keyspace-events`.
    pub fn set_flags(&self, flags: Flags) {
        self.flags.store(flags.0, Ordering::Relaxed);
    }

    /// Delivers keyspace events of `keyspace` (on the broker's task).
    fn notify(&self, keyspace: KeyspaceId, events: &[KeyEvent]) {
        let flags = self.flags();
        let registry = self.lock();
        if registry.spaces[Space::Channel.at()].is_empty()
            && registry.spaces[Space::Pattern.at()].is_empty()
        {
            return; // no one to tell: no channel names to build
        }
        let may = |l: &Listener| l.user.as_ref().is_none_or(|u| u.may_use(keyspace));
        for event in events.iter().filter(|e| flags.selects(e.class)) {
            let Some((db, key)) = keel_types::db_of(&event.key) else { continue };
            let number = match (self.sharded.load(Ordering::Relaxed), keyspace.0) {
                (true, _) => 0,
                (false, 0) => u32::from(db),
                (false, k) => k,
            };
            let key = Bytes::copy_from_slice(key);
            let name = Bytes::from_static(event.event.as_bytes());
            if flags.has(Flags::KEYSPACE) {
                let channel = channel(b"__keyspace@", number, &key);
                registry.deliver(false, &channel, &name, may);
            }
            if flags.has(Flags::KEYEVENT) {
                let channel = channel(b"__keyevent@", number, &name);
                registry.deliver(false, &channel, &key, may);
            }
        }
    }
}

/// `__keyspace@<number>__:<tail>` and its kin.
fn channel(head: &[u8], number: u32, tail: &[u8]) -> Bytes {
    let mut name = head.to_vec();
    name.extend_from_slice(number.to_string().as_bytes());
    name.extend_from_slice(b"__:");
    name.extend_from_slice(tail);
    Bytes::from(name)
}

/// The broker's task: delivers what came from peers and engine loops until the broker
/// is gone.
async fn deliver(broker: Weak<Broker>, mut rx: mpsc::Receiver<Delivery>) {
    while let Some(delivery) = rx.recv().await {
        let Some(broker) = broker.upgrade() else { return };
        match delivery {
            Delivery::Remote { shard, channel, message } => {
                broker.lock().deliver(shard, &channel, &message, |_| true);
            }
            Delivery::Events(keyspace, events) => broker.notify(keyspace, &events),
        }
    }
}

/// `notify-keyspace-events` as flag bits, with Redis's letters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flags(pub u32);

impl Flags {
    const GENERIC: u32 = 1 << 2;
    const STRING: u32 = 1 << 3;
    const LIST: u32 = 1 << 4;
    const SET: u32 = 1 << 5;
    const HASH: u32 = 1 << 6;
    const ZSET: u32 = 1 << 7;
    const EXPIRED: u32 = 1 << 8;
    const EVICTED: u32 = 1 << 9;
    const STREAM: u32 = 1 << 10;
    const KEY_MISS: u32 = 1 << 11;
    const MODULE: u32 = 1 << 12;
    const NEW: u32 = 1 << 13;
    /// `K`: `__keyspace@...` channels.
    pub const KEYSPACE: u32 = 1 << 0;
    /// `E`: `__keyevent@...` channels.
    pub const KEYEVENT: u32 = 1 << 1;
    /// `A`: every class but `m`, `n` and `d`.
    const ALL: u32 = Self::GENERIC
        | Self::STRING
        | Self::LIST
        | Self::SET
        | Self::HASH
        | Self::ZSET
        | Self::EXPIRED
        | Self::EVICTED
        | Self::STREAM;
    const LETTERS: [(char, u32); 11] = [
        ('g', Self::GENERIC),
        ('$', Self::STRING),
        ('l', Self::LIST),
        ('s', Self::SET),
        ('h', Self::HASH),
        ('z', Self::ZSET),
        ('x', Self::EXPIRED),
        ('e', Self::EVICTED),
        ('t', Self::STREAM),
        ('d', Self::MODULE),
        ('n', Self::NEW),
    ];

    /// Parses Redis's letters; `None` for any other character.
    pub fn parse(text: &[u8]) -> Option<Flags> {
        let mut bits = 0;
        for &c in text {
            bits |= match c {
                b'A' => Self::ALL,
                b'K' => Self::KEYSPACE,
                b'E' => Self::KEYEVENT,
                b'm' => Self::KEY_MISS,
                c => Self::LETTERS.iter().find(|(l, _)| *l as u8 == c)?.1,
            };
        }
        Some(Flags(bits))
    }

    /// Redis's letters for these flags (`CONFIG GET`).
    pub fn letters(self) -> String {
        let mut out = String::new();
        if self.0 & Self::ALL == Self::ALL {
            out.push('A');
        } else {
            for (letter, bit) in Self::LETTERS {
                if self.0 & bit != 0 {
                    out.push(letter);
                }
            }
        }
        if self.0 & Self::ALL == Self::ALL {
            for (letter, bit) in [('d', Self::MODULE), ('n', Self::NEW)] {
                if self.0 & bit != 0 {
                    out.push(letter);
                }
            }
        }
        for (letter, bit) in [('K', Self::KEYSPACE), ('E', Self::KEYEVENT), ('m', Self::KEY_MISS)] {
            if self.0 & bit != 0 {
                out.push(letter);
            }
        }
        out
    }

    fn has(self, bit: u32) -> bool {
        self.0 & bit != 0
    }

    /// Whether events of `class` are selected.
    fn selects(self, class: EventClass) -> bool {
        self.has(match class {
            EventClass::Generic => Self::GENERIC,
            EventClass::String => Self::STRING,
            EventClass::List => Self::LIST,
            EventClass::Set => Self::SET,
            EventClass::Hash => Self::HASH,
            EventClass::ZSet => Self::ZSET,
            EventClass::Expired => Self::EXPIRED,
            EventClass::New => Self::NEW,
        })
    }

    /// Whether any event would be sent: a channel kind and a class the engines record.
    fn active(self) -> bool {
        let classes = Self::ALL | Self::NEW;
        self.has(Self::KEYSPACE | Self::KEYEVENT) && self.0 & classes != 0
    }
}

/// A message published at a member, as it travels to the others.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Published {
    /// A shard channel's.
    pub shard: bool,
    /// The channel.
    pub channel: Bytes,
    /// The message.
    pub message: Bytes,
}

impl PeerMessage for Published {
    fn encode(&self, out: &mut Vec<u8>) {
        out.push(PUBLISH_FORMAT_V1);
        out.push(u8::from(self.shard));
        keel_types::codec::put_u32(out, self.channel.len() as u32);
        out.extend_from_slice(&self.channel);
        keel_types::codec::put_u32(out, self.message.len() as u32);
        out.extend_from_slice(&self.message);
    }

    fn decode(bytes: &[u8], limits: &PeerLimits) -> Result<Published, PeerError> {
        let malformed = |what: &str| PeerError::Malformed(format!("published message: {what}"));
        if bytes.len() as u64 > u64::from(limits.frame_bytes_max) {
            return Err(malformed("too long"));
        }
        let (&format, rest) = bytes.split_first().ok_or_else(|| malformed("empty"))?;
        if format != PUBLISH_FORMAT_V1 {
            return Err(PeerError::UnknownVersion(format));
        }
        let (&shard, rest) = rest.split_first().ok_or_else(|| malformed("no shard flag"))?;
        if shard > 1 {
            return Err(malformed("shard flag not 0 or 1"));
        }
        let (channel, rest) = take(rest).ok_or_else(|| malformed("channel"))?;
        let (message, rest) = take(rest).ok_or_else(|| malformed("message"))?;
        if !rest.is_empty() {
            return Err(malformed("bytes after the message"));
        }
        let copy = Bytes::copy_from_slice;
        Ok(Published { shard: shard == 1, channel: copy(channel), message: copy(message) })
    }

    fn bulk_bytes(&self) -> usize {
        self.channel.len() + self.message.len()
    }
}

/// A `u32` length, then that many bytes (within what is left).
fn take(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let (len, rest) = bytes.split_first_chunk::<4>()?;
    let len = u32::from_le_bytes(*len) as usize;
    (rest.len() >= len).then(|| rest.split_at(len))
}

/// Where the peer links hand messages published at other members.
pub struct PubSubInbox {
    /// The broker (weak: the links outlive nothing).
    pub broker: Weak<Broker>,
    /// The limits the codec checks.
    pub limits: PeerLimits,
}

impl Inbox for PubSubInbox {
    fn deliver(&self, _from: NodeId, bytes: &[u8]) -> PeerDelivery {
        let Ok(Published { shard, channel, message }) = Published::decode(bytes, &self.limits)
        else {
            return PeerDelivery::Rejected("published message does not decode");
        };
        let Some(broker) = self.broker.upgrade() else { return PeerDelivery::Full };
        match broker.deliveries.try_send(Delivery::Remote { shard, channel, message }) {
            Ok(()) => PeerDelivery::Queued,
            Err(_) => {
                broker.metrics.pubsub_dropped.fetch_add(1, Ordering::Relaxed);
                PeerDelivery::Full
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_read_and_print_as_redis_does() {
        let text = |s: &str| Flags::parse(s.as_bytes()).expect("valid").letters();
        assert_eq!(text("gKE"), "gKE");
        assert_eq!(text("$lshzxeKE"), "$lshzxeKE");
        assert_eq!(text("KA"), "AK");
        assert_eq!(text("EA"), "AE");
        assert_eq!(text(""), "");
        assert!(Flags::parse(b"Kq").is_none());
        assert!(!Flags::parse(b"A").expect("valid").active(), "no channel kind");
        assert!(!Flags::parse(b"K").expect("valid").active(), "no class");
        assert!(Flags::parse(b"Kn").expect("valid").active());
    }

    #[test]
    fn a_published_message_round_trips_and_a_forged_one_is_refused() {
        let limits = PeerLimits::default();
        let message = Published { shard: true, channel: "c".into(), message: "hello".into() };
        let mut bytes = Vec::new();
        message.encode(&mut bytes);
        assert_eq!(Published::decode(&bytes, &limits).expect("decodes"), message);
        for cut in 0..bytes.len() {
            assert!(Published::decode(&bytes[..cut], &limits).is_err(), "cut at {cut}");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(Published::decode(&long, &limits).is_err(), "trailing bytes");
        let mut huge = bytes.clone();
        huge[2..6].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(Published::decode(&huge, &limits).is_err(), "a length past the end");
    }

    #[tokio::test]
    async fn patterns_and_channels_deliver_and_an_outbox_past_its_bound_closes() {
        let broker = Broker::start(None, Arc::new(Metrics::default()));
        let (outbox, mut pushes) = Outbox::new();
        let listener = Arc::new(Listener { id: 1, outbox: outbox.clone(), user: None });
        broker.lock().add(Space::Channel, &Bytes::from("news"), &listener);
        broker.lock().add(Space::Pattern, &Bytes::from("n*"), &listener);
        assert_eq!(broker.publish(false, "news".into(), "hi".into()), 2);
        assert_eq!(broker.publish(true, "news".into(), "hi".into()), 0, "shard channels apart");
        let kinds: Vec<String> = (0..2)
            .map(|_| match pushes.rx.try_recv() {
                Ok(Pushed::Frame(Frame::Push(items), ..)) => format!("{:?}", items[0]),
                _ => "none".into(),
            })
            .collect();
        assert_eq!(kinds, [r#"Bulk(b"message")"#, r#"Bulk(b"pmessage")"#], "the channel's first");
        let big = Bytes::from(vec![b'x'; OUTBOX_BYTES_MAX]);
        assert_eq!(broker.publish(false, "news".into(), big), 0, "past the bound");
        assert!(matches!(pushes.rx.try_recv(), Ok(Pushed::Overflow)));
        assert!(!outbox.push(Frame::ok()), "closed for good");
        broker.lock().remove(Space::Channel, b"news", 1);
        assert_eq!(broker.lock().count(Space::Channel, b"news"), 0);
        assert_eq!(broker.lock().distinct(Space::Pattern), 1);
    }

    #[test]
    fn keyspace_events_reach_only_listeners_whose_user_may_use_the_keyspace() {
        use crate::acl::{hash_password, Category, UserSettings, Users};
        let settings = UserSettings {
            name: "one".into(),
            password_hash: hash_password(b"p", 1_000),
            permissions: vec![Category::Read],
            keyspaces: Some(vec![1]),
        };
        let users = Users::new(&[settings]).expect("valid");
        let user = users.authenticate(b"one", b"p").expect("the password");
        let broker = Broker::start(None, Arc::new(Metrics::default()));
        broker.set_flags(Flags::parse(b"KA").expect("valid"));
        let (outbox, mut pushes) = Outbox::new();
        let listener = Arc::new(Listener { id: 1, outbox, user: Some(user) });
        broker.lock().add(Space::Pattern, &Bytes::from("*"), &listener);
        let event = |key: &str| KeyEvent {
            class: EventClass::String,
            event: "set",
            key: key.as_bytes().to_vec().into(),
        };
        broker.notify(KeyspaceId(0), &[event("a")]);
        assert!(pushes.rx.try_recv().is_err(), "keyspace 0 is not the user's");
        broker.notify(KeyspaceId(1), &[event("b")]);
        let Ok(Pushed::Frame(Frame::Push(items), ..)) = pushes.rx.try_recv() else {
            panic!("keyspace 1's event")
        };
        assert_eq!(items[2], Frame::bulk("__keyspace@1__:b"), "named by the keyspace's number");
    }
}
