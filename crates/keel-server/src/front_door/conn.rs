//! One connection's state ([`Conn`]): its protocol, keyspace, user, deduplication
//! numbering, the transaction it is queuing and what it watched; how its requests are
//! ordered against each other ([`Conn::order`], [`Kind`]); its queue of replies
//! ([`Pending`]) and the count of those its writer has resolved, with the session floors
//! its writes raised ([`Resolved`], [`Floor`]).

use super::commands::correctables::{View, INVOKE_ENDED};
use super::commands::transactions::{Transaction, Watched};
use crate::acl::{User, Users};
use crate::driver::{KeyspaceHandle, Keyspaces, Sent};
use crate::login::Login;
use bytes::Bytes;
use keel_core::engine::ClientReply;
use keel_types::{
    ClientId, CommandResult, KeelError, KeyspaceId, Limits, LogIndex, ReadLevel, RequestId,
};
use keel_wire::resp::{Frame, Protocol};
use std::collections::BTreeMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::{mpsc, OwnedSemaphorePermit};

/// A reply still being computed.
pub type ReplyFuture = Pin<Box<dyn Future<Output = Frame> + Send>>;

/// One reply in a connection's queue, in request order.
pub struct Pending {
    /// The protocol to encode it in (the one in force when the request was read).
    pub protocol: Protocol,
    /// Whether the connection closes after this reply.
    pub close: bool,
    /// Whether the reply is resolved but not written (`CLIENT REPLY OFF`, a subscription
    /// whose confirmations were pushed).
    pub silent: bool,
    pub(super) body: Body,
    /// Its share of the node's budget of pipelined requests (`connection`), given back
    /// when the reply is resolved.
    charge: Option<OwnedSemaphorePermit>,
}

pub(super) enum Body {
    Ready(Frame),
    Later(ReplyFuture),
    /// `KEEL.INVOKE`: preliminary views to push as they come, then the final reply.
    Views(mpsc::Receiver<View>),
    /// One engine reply, turned into its frame when it comes (no boxed future: the common
    /// case of a single-key request); a write's version advances its connection's floor.
    Engine(Sent, Finish, Option<Floor>),
}

/// Where a write's reply advances its connection's session floor in its keyspace.
pub struct Floor {
    resolved: Arc<Resolved>,
    keyspace: KeyspaceId,
}

impl Floor {
    /// Advances the floor to the version a write `answer` carries, if any.
    pub(super) fn note(&self, answer: &Result<ClientReply, KeelError>) {
        let written = answer.as_ref().ok().and_then(|r| r.result.as_ref().ok());
        if let Some(version) = written.and_then(CommandResult::written_version) {
            self.resolved.advance(self.keyspace, version.index);
        }
    }
}

/// How an engine reply becomes a frame: the function and its `WITHVERSION` flag.
pub(super) type Finish = (fn(Result<ClientReply, KeelError>, bool) -> Frame, bool);

impl Pending {
    /// A reply known at once.
    pub fn ready(frame: Frame, protocol: Protocol) -> Pending {
        Pending { protocol, close: false, silent: false, body: Body::Ready(frame), charge: None }
    }

    pub(crate) fn later(future: ReplyFuture, protocol: Protocol) -> Pending {
        Pending { protocol, close: false, silent: false, body: Body::Later(future), charge: None }
    }

    pub(super) fn engine(sent: Sent, finish: Finish, protocol: Protocol) -> Pending {
        let body = Body::Engine(sent, finish, None);
        Pending { protocol, close: false, silent: false, body, charge: None }
    }

    /// A `KEEL.INVOKE`'s reply: its views as they come, the last one the reply.
    pub(super) fn views(views: mpsc::Receiver<View>, protocol: Protocol) -> Pending {
        Pending { protocol, close: false, silent: false, body: Body::Views(views), charge: None }
    }

    /// A write's reply, whose version advances the connection's session `floor`.
    pub(super) fn write(sent: Sent, finish: Finish, protocol: Protocol, floor: Floor) -> Pending {
        Pending {
            protocol,
            close: false,
            silent: false,
            body: Body::Engine(sent, finish, Some(floor)),
            charge: None,
        }
    }

    /// The views of a `KEEL.INVOKE`, if this is one: the writer pushes each preliminary
    /// view as it comes and takes the final one as the reply (the body is left empty).
    pub fn take_views(&mut self) -> Option<mpsc::Receiver<View>> {
        match std::mem::replace(&mut self.body, Body::Ready(Frame::Null)) {
            Body::Views(views) => Some(views),
            other => {
                self.body = other;
                None
            }
        }
    }

    /// The same reply, holding `charge` until it is resolved.
    pub fn charged(mut self, charge: Option<OwnedSemaphorePermit>) -> Pending {
        self.charge = charge;
        self
    }

    /// A reply that is resolved but never written.
    pub fn nothing(protocol: Protocol) -> Pending {
        Pending::ready(Frame::Null, protocol).silenced()
    }

    /// The same reply, resolved in its turn but not written.
    pub fn silenced(mut self) -> Pending {
        self.silent = true;
        self
    }

    /// The same reply, closing the connection after it.
    pub fn closing(mut self) -> Pending {
        self.close = true;
        self
    }

    /// Waits for the reply frame.
    pub async fn resolve(self) -> Frame {
        match self.body {
            Body::Ready(frame) => frame,
            Body::Later(future) => future.await,
            Body::Views(mut views) => loop {
                // Not through the writer (which relays pushes): only the final one counts.
                match views.recv().await {
                    Some(View::Final(frame)) => break frame,
                    Some(View::Push(_)) => continue,
                    None => break Frame::error(INVOKE_ENDED),
                }
            },
            Body::Engine(sent, (finish, flag), floor) => {
                let answer = sent.answer().await;
                if let Some(floor) = floor {
                    floor.note(&answer);
                }
                finish(answer, flag)
            }
        }
    }
}

/// How many replies a connection's writer has resolved, for its reader to wait on (one
/// waiter: the reader; an atomic and a permit per reply, no lock).
#[derive(Debug, Default)]
pub struct Resolved {
    count: AtomicU64,
    notify: tokio::sync::Notify,
    /// Per keyspace, the log index of the latest write answered on this connection: the
    /// session floor its reads carry (`Submit::after`), so that they see its writes even
    /// at a follower that has not applied them yet. Advanced by the writer before it
    /// counts the write's reply resolved, so a read sent after waiting for it sees it.
    floors: std::sync::Mutex<BTreeMap<KeyspaceId, LogIndex>>,
}

impl Resolved {
    /// One more reply resolved.
    pub fn one_more(&self) {
        self.count.fetch_add(1, Ordering::Release);
        self.notify.notify_one();
    }

    /// The writer stopped: nothing will be resolved any more, and no one need wait.
    pub fn stopped(&self) {
        self.count.store(u64::MAX, Ordering::Release);
        self.notify.notify_one();
    }

    /// Raises the session floor of `keyspace` to `index`.
    pub fn advance(&self, keyspace: KeyspaceId, index: LogIndex) {
        let mut floors = self.floors.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let floor = floors.entry(keyspace).or_insert(LogIndex::ZERO);
        *floor = (*floor).max(index);
    }

    /// The session floor of `keyspace`.
    pub fn floor(&self, keyspace: KeyspaceId) -> LogIndex {
        let floors = self.floors.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        floors.get(&keyspace).copied().unwrap_or(LogIndex::ZERO)
    }

    /// Replies resolved so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Acquire)
    }

    /// Waits until the reply at position `at` (from 0) is resolved.
    pub async fn wait_past(&self, at: u64) {
        // A permit left by `one_more` before this waits makes `notified` return at once.
        while self.count() <= at {
            self.notify.notified().await;
        }
    }
}

/// One connection's state.
#[derive(Debug)]
pub struct Conn {
    /// The protocol replies are written in.
    pub protocol: Protocol,
    pub(super) client: ClientId,
    pub(super) seq_next: u64,
    pub(super) name: Option<Bytes>,
    pub(super) keyspaces: Arc<Keyspaces>,
    /// The keyspace `SELECT` chose (keyspace 0 at first).
    pub(super) node: KeyspaceHandle,
    /// The database of that keyspace `SELECT` chose (`commands::databases`).
    pub(super) db: u8,
    /// `ASKING` was the last request: the next one may run in a keyspace importing its
    /// slot (`commands::cluster`).
    pub(super) asking: bool,
    pub(super) limits: Limits,
    /// Replies the connection's writer has resolved so far (every reply, in order).
    pub(super) resolved: Arc<Resolved>,
    /// Replies queued so far: the position of the next request.
    pub(super) queued: u64,
    /// The kind and position of the last request sent to an engine.
    pub(super) last_sent: Option<(Kind, u64)>,
    /// The position of the last request that went through an engine loop (not answered
    /// off it).
    pub(super) last_looped: Option<u64>,
    /// Inside `MULTI`: the commands queued for `EXEC`.
    pub(super) transaction: Option<Transaction>,
    /// What `WATCH` read, for the next `EXEC` (filled as its reads are answered).
    pub(super) watched: Arc<std::sync::Mutex<Watched>>,
    /// The geo session: past vectors and the open geo transaction.
    pub(super) geo: super::commands::geo::GeoSession,
    /// The configured users (none: no authentication, protected mode).
    pub(super) users: Arc<Users>,
    /// Checks passwords, off the runtime, with the node's delays for guessers.
    pub(super) login: Arc<Login>,
    /// The address the connection comes from (the throttle counts failures by it).
    pub(super) from: IpAddr,
    /// Failed attempts to authenticate on this connection.
    pub(super) auth_failures: u32,
    /// The user this connection authenticated as.
    pub(super) user: Option<Arc<User>>,
    /// The node's open connections and this one's entry among them (`None` in unit
    /// tests of the commands).
    pub(super) registered: Option<(Arc<super::Clients>, Arc<super::clients::Client>)>,
    /// Where frames pushed to the connection go (pub/sub), written between replies.
    pub(crate) outbox: Arc<crate::pubsub::Outbox>,
    /// What the connection subscribed to.
    pub(super) subs: super::commands::pubsub::Subscriptions,
    /// `CLIENT REPLY`'s mode.
    pub(super) reply: keel_wire::command::ReplyMode,
}

/// What may run concurrently within one connection's pipeline: requests of one kind
/// reach the engine in order without waiting for each other; a request of another kind
/// waits until every request before it has been answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Write(KeyspaceId),
    Read(KeyspaceId, Option<ReadLevel>),
    /// A request nothing overtakes and that overtakes nothing (a blocking pop): unequal
    /// to every other by its position in the connection.
    Alone(KeyspaceId, u64),
}

impl Drop for Conn {
    /// A geo transaction left open is dropped now rather than at its time-out; the
    /// connection's subscriptions end.
    fn drop(&mut self) {
        super::commands::pubsub::forget(self);
        if let Some((ks, tx)) = self.geo.open() {
            if let Some(handle) = self.keyspaces.get(ks) {
                super::commands::geo::abandon(handle, self.client, tx);
            }
        }
    }
}

impl Conn {
    /// A fresh connection with client id `client_id` (random, from the accept loop), in
    /// keyspace 0.
    /// `resolved` counts the replies the connection's writer has resolved.
    pub fn new(
        client_id: u64,
        keyspaces: Arc<Keyspaces>,
        limits: Limits,
        resolved: Arc<Resolved>,
        login: Arc<Login>,
    ) -> Conn {
        Conn {
            users: login.users().clone(),
            login,
            from: IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
            auth_failures: 0,
            user: None,
            registered: None,
            protocol: Protocol::Resp2,
            client: ClientId(client_id.max(1)),
            seq_next: 1,
            name: None,
            node: keyspaces.first().clone(),
            db: 0,
            asking: false,
            keyspaces,
            limits,
            resolved,
            queued: 0,
            last_sent: None,
            last_looped: None,
            transaction: None,
            watched: Arc::default(),
            geo: Default::default(),
            outbox: crate::pubsub::Outbox::new().0,
            subs: Default::default(),
            reply: keel_wire::command::ReplyMode::On,
        }
    }

    /// Whether the connection is subscribed to anything.
    pub fn subscribed(&self) -> bool {
        self.subs.any()
    }

    /// Sets the address the connection comes from.
    pub fn set_from(&mut self, from: IpAddr) {
        self.from = from;
    }

    /// This connection's entry among the node's open connections, if registered.
    pub(super) fn entry(&self) -> Option<&super::clients::Client> {
        self.registered.as_ref().map(|(_, entry)| &**entry)
    }

    /// Whether the connection has authenticated (always false on a node without users).
    pub fn authenticated(&self) -> bool {
        self.user.is_some()
    }

    /// Counts a reply queued for the writer.
    pub fn queued_one(&mut self) {
        self.queued += 1;
    }

    /// Waits, before a request of `kind` goes to an engine, until every earlier request
    /// is answered if the last one sent was of another kind: so a pipeline's replies are
    /// those of its commands run one after another (a read sees the writes before it and
    /// none after it), while runs of one kind are sent at once.
    pub(super) async fn order(&mut self, kind: Kind) {
        let position = self.queued;
        if let Some((last, at)) = self.last_sent {
            if last != kind {
                // The writer stops only with the connection, and then nothing is sent.
                self.resolved.wait_past(at).await;
            }
        }
        self.last_sent = Some((kind, position));
    }

    /// [`Conn::order`] for a request that always goes through the engine loop (never
    /// answered off it): later reads must not overtake it.
    pub(super) async fn order_through_loop(&mut self, kind: Kind) {
        self.order(kind).await;
        self.last_looped = Some(self.queued);
    }

    /// Whether a read may be answered off the engine loop: every earlier request that
    /// went through a loop is answered. A read answered at once must not overtake one
    /// still waiting in the loop (a read waiting for a durability round is executed when
    /// served, and a pipeline's replies reflect its commands in order).
    pub(super) fn loop_idle(&self) -> bool {
        self.last_looped.is_none_or(|at| self.resolved.count() > at)
    }

    /// The keyspace the connection's commands go to.
    pub fn keyspace(&self) -> KeyspaceId {
        self.node.id
    }

    /// Where a write's reply advances the connection's session floor (in its keyspace).
    pub(super) fn floor(&self) -> Floor {
        Floor { resolved: self.resolved.clone(), keyspace: self.node.id }
    }

    /// The connection's next deduplication pair.
    pub(super) fn next_pair(&mut self) -> (ClientId, RequestId) {
        let seq = self.seq_next;
        self.seq_next += 1;
        (self.client, RequestId(seq))
    }
}
