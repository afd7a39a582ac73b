//! From one decoded request to its reply: parsing (`keel_wire::command`), the
//! server-side `KEEL.REQ` and `KEEL.LOG` commands, submitting to the engine, and the
//! reply frames.
//!
//! Server-side commands (not in `keel_wire`):
//! - `KEEL.REQ <client> <seq> <command ...>`: runs a single-key command (or, inside
//!   `MULTI`, `EXEC`) with the given deduplication pair instead of the connection's. A
//!   retried write carries the same pair and is applied at most once. `<client>` is a non-zero u64: below 2^63 a plain
//!   id (taken for a new client once the deduplication table forgets it), else a session
//!   from `KEEL.SESSION`.
//! - `KEEL.SESSION`: opens a deduplication session and answers its id, for `KEEL.REQ`:
//!   a retry of a session's request is never applied twice; once the table has forgotten
//!   the session, its requests get `-SESSIONEXPIRED` instead.
//! - `KEEL.LOG <from> <count>`: up to `count` log entries from index `from`, each a bulk
//!   string of JSON (for recording which writes survived), preceded by the snapshot's
//!   last index as an integer: `[snapshot_index, entry, entry, ...]`.
//!
//! Reply shapes of Keel's commands:
//! - `GET k WITHVERSION` / `SET k v WITHVERSION`: `[reply, "epoch.index" | null]`;
//! - `KEEL.CAS`: `[swapped (1|0), current value | null, "epoch.index" | null]`;
//! - `KEEL.SCAN`: an array of `[key, value, "epoch.index"]`;
//! - `KEEL.STATUS`: a bulk string of JSON (the connection's keyspace's entry of the
//!   `/status` document);
//! - `KEEL.KEYSPACES`: an array of `[id, name, engine]`, one per keyspace.
//!
//! Keyspaces: a connection starts in keyspace 0; `SELECT n` moves it to keyspace `n`
//! (Redis's `-ERR DB index is out of range` if the node does not host it), and every
//! later command of the connection goes there.

use crate::acl::{category, Category, User, Users};
use crate::driver::{KeyspaceHandle, Keyspaces, Sent, Submit};
use crate::login::{Failure, Login, CONNECTION_FAILURES_MAX};
use bytes::Bytes;
use keel_core::engine::{ClientReply, EngineKind, OpMode};
use keel_types::{
    ClientId, Command, CommandResult, Durability, KeelError, Key, KeyspaceId, Limits, LogIndex,
    ReadLevel, RequestId, Value, Version,
};
use keel_wire::command::{ClientSubcommand, CommandQuery};
use keel_wire::reply::{error_frame, error_text, value_frame, version_frame, with_version_frame};
use keel_wire::resp::{Frame, Protocol};
use keel_wire::ClientCommand;
use std::collections::BTreeMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, OwnedSemaphorePermit};

/// How long a status or log query may wait for room in the engine's queue.
pub const QUERY_WAIT: Duration = Duration::from_secs(2);
/// The server name `HELLO` and `INFO` report.
pub const SERVER_NAME: &str = "keel";

/// A reply still being computed.
pub type ReplyFuture = Pin<Box<dyn Future<Output = Frame> + Send>>;

/// One reply in a connection's queue, in request order.
pub struct Pending {
    /// The protocol to encode it in (the one in force when the request was read).
    pub protocol: Protocol,
    /// Whether the connection closes after this reply.
    pub close: bool,
    body: Body,
    /// Its share of the node's budget of pipelined requests (`resp`), given back when
    /// the reply is resolved.
    charge: Option<OwnedSemaphorePermit>,
}

enum Body {
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
    fn note(&self, answer: &Result<ClientReply, KeelError>) {
        let written = answer.as_ref().ok().and_then(|r| r.result.as_ref().ok());
        if let Some(version) = written.and_then(CommandResult::written_version) {
            self.resolved.advance(self.keyspace, version.index);
        }
    }
}

/// How an engine reply becomes a frame: the function and its `WITHVERSION` flag.
type Finish = (fn(Result<ClientReply, KeelError>, bool) -> Frame, bool);

impl Pending {
    /// A reply known at once.
    pub fn ready(frame: Frame, protocol: Protocol) -> Pending {
        Pending { protocol, close: false, body: Body::Ready(frame), charge: None }
    }

    pub(crate) fn later(future: ReplyFuture, protocol: Protocol) -> Pending {
        Pending { protocol, close: false, body: Body::Later(future), charge: None }
    }

    fn engine(sent: Sent, finish: Finish, protocol: Protocol) -> Pending {
        Pending { protocol, close: false, body: Body::Engine(sent, finish, None), charge: None }
    }

    /// A write's reply, whose version advances the connection's session `floor`.
    fn write(sent: Sent, finish: Finish, protocol: Protocol, floor: Floor) -> Pending {
        Pending {
            protocol,
            close: false,
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
    client: ClientId,
    seq_next: u64,
    name: Option<Bytes>,
    keyspaces: Arc<Keyspaces>,
    /// The keyspace `SELECT` chose (keyspace 0 at first).
    node: KeyspaceHandle,
    limits: Limits,
    /// Replies the connection's writer has resolved so far (every reply, in order).
    resolved: Arc<Resolved>,
    /// Replies queued so far: the position of the next request.
    queued: u64,
    /// The kind and position of the last request sent to an engine.
    last_sent: Option<(Kind, u64)>,
    /// The position of the last request that went through an engine loop (not answered
    /// off it).
    last_looped: Option<u64>,
    /// Inside `MULTI`: the commands queued for `EXEC`.
    transaction: Option<Transaction>,
    /// What `WATCH` read, for the next `EXEC` (filled as its reads are answered).
    watched: Arc<std::sync::Mutex<Watched>>,
    /// The configured users (none: no authentication, protected mode).
    users: Arc<Users>,
    /// Checks passwords, off the runtime, with the node's delays for guessers.
    login: Arc<Login>,
    /// The address the connection comes from (the throttle counts failures by it).
    from: IpAddr,
    /// Failed attempts to authenticate on this connection.
    auth_failures: u32,
    /// The user this connection authenticated as.
    user: Option<Arc<User>>,
}

/// What may run concurrently within one connection's pipeline: requests of one kind
/// reach the engine in order without waiting for each other; a request of another kind
/// waits until every request before it has been answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Write(KeyspaceId),
    Read(KeyspaceId, Option<ReadLevel>),
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
            protocol: Protocol::Resp2,
            client: ClientId(client_id.max(1)),
            seq_next: 1,
            name: None,
            node: keyspaces.first().clone(),
            keyspaces,
            limits,
            resolved,
            queued: 0,
            last_sent: None,
            last_looped: None,
            transaction: None,
            watched: Arc::default(),
        }
    }

    /// Sets the address the connection comes from.
    pub fn set_from(&mut self, from: IpAddr) {
        self.from = from;
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
    async fn order(&mut self, kind: Kind) {
        let position = self.queued;
        if let Some((last, at)) = self.last_sent {
            if last != kind {
                // The writer stops only with the connection, and then nothing is sent.
                self.resolved.wait_past(at).await;
            }
        }
        self.last_sent = Some((kind, position));
    }

    /// Whether a read may be answered off the engine loop: every earlier request that
    /// went through a loop is answered. A read answered at once must not overtake one
    /// still waiting in the loop (a read waiting for a durability round is executed when
    /// served, and a pipeline's replies reflect its commands in order).
    fn loop_idle(&self) -> bool {
        self.last_looped.is_none_or(|at| self.resolved.count() > at)
    }

    /// The keyspace the connection's commands go to.
    pub fn keyspace(&self) -> KeyspaceId {
        self.node.id
    }

    fn next_pair(&mut self) -> (ClientId, RequestId) {
        let seq = self.seq_next;
        self.seq_next += 1;
        (self.client, RequestId(seq))
    }
}

/// The reply to an attempt to authenticate on a node without users.
const NO_AUTHENTICATION: &str = "ERR AUTH called without any password configured for the default user. Are you sure your configuration is correct?";
/// The reply to a command before authentication, on a node with users.
const NOAUTH: &str = "NOAUTH Authentication required.";
/// The reply to a failed authentication.
const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";

/// `AUTH [user] password`. Waits for the check (on the hashing thread, after the
/// throttle's delay) before the connection reads its next request.
async fn auth(conn: &mut Conn, words: &[Bytes]) -> Pending {
    let protocol = conn.protocol;
    let (name, password) = match words {
        [_, password] => (crate::acl::DEFAULT_USER.as_bytes(), password),
        [_, name, password] => (&name[..], password),
        _ => {
            let text = "ERR wrong number of arguments for 'auth' command";
            return Pending::ready(Frame::error(text), protocol);
        }
    };
    if !conn.users.required() {
        return Pending::ready(Frame::error(NO_AUTHENTICATION), protocol);
    }
    match login(conn, name, password).await {
        Ok(()) => Pending::ready(Frame::ok(), protocol),
        Err(refusal) => refusal,
    }
}

/// Authenticates the connection as `name`, or the refusal to queue: `WRONGPASS` (the
/// same for an unknown name), or an error saying to retry later when the attempt was
/// refused unchecked; closing the connection at its [`CONNECTION_FAILURES_MAX`]th failure.
async fn login(conn: &mut Conn, name: &[u8], password: &[u8]) -> Result<(), Pending> {
    let failure = match conn.login.authenticate(conn.from, name, password).await {
        Ok(user) => {
            conn.user = Some(user);
            return Ok(());
        }
        Err(failure) => failure,
    };
    conn.auth_failures += 1;
    let text = match failure {
        Failure::WrongPassword | Failure::UnknownUser => WRONGPASS,
        Failure::Throttled => "ERR too many failed authentications from this address; retry later",
        Failure::Busy => "BUSY too many authentications in progress; retry later",
    };
    let refusal = Pending::ready(Frame::error(text), conn.protocol);
    if conn.auth_failures >= CONNECTION_FAILURES_MAX {
        return Err(refusal.closing());
    }
    Err(refusal)
}

/// `ACL WHOAMI` (the only `ACL` subcommand Keel answers; users live in the configuration).
fn acl(conn: &Conn, words: &[Bytes]) -> Pending {
    let protocol = conn.protocol;
    match words {
        [_, sub] if sub.eq_ignore_ascii_case(b"whoami") => {
            let name = conn.user.as_ref().map_or(crate::acl::DEFAULT_USER, |u| u.name.as_str());
            Pending::ready(Frame::bulk(name), protocol)
        }
        _ => Pending::ready(
            Frame::error("ERR unknown ACL subcommand: Keel answers ACL WHOAMI; users are configured in [[users]]"),
            protocol,
        ),
    }
}

/// Whether the connection may run a command of `category` in its keyspace; the refusal.
fn permitted(conn: &Conn, category: Option<Category>) -> Result<(), Frame> {
    let (Some(user), Some(category)) = (&conn.user, category) else { return Ok(()) };
    if user.may(category, conn.keyspace()) {
        return Ok(());
    }
    let what = match category {
        Category::Read => "read",
        Category::Write => "write",
        Category::Admin => "admin",
    };
    Err(Frame::error(&format!(
        "NOPERM User {} has no permissions to run {what} commands in keyspace {}",
        user.name,
        conn.keyspace().0
    )))
}

/// Turns one decoded request into its reply; a request for an engine is sent to it before
/// this returns (after the earlier requests it must follow are answered).
pub async fn handle(conn: &mut Conn, frame: Frame) -> Pending {
    let words = match request_words(frame) {
        Ok(words) => words,
        Err(text) => return Pending::ready(Frame::error(&text), conn.protocol),
    };
    let first = words.first().map_or(&[][..], |w| &w[..]);
    if first.eq_ignore_ascii_case(b"auth") {
        return auth(conn, &words).await;
    }
    let words = match hello_auth(conn, words).await {
        Ok(words) => words,
        Err(refusal) => return refusal,
    };
    let first = words.first().map_or(&[][..], |w| &w[..]);
    let before_auth = [&b"hello"[..], b"quit"].iter().any(|w| first.eq_ignore_ascii_case(w));
    if conn.users.required() && conn.user.is_none() && !before_auth {
        return Pending::ready(Frame::error(NOAUTH), conn.protocol);
    }
    if conn.node.kind == EngineKind::Kite {
        let orca_only =
            ["multi", "exec", "discard", "watch", "keel.session", "keel.invoke", "keel.log"];
        if let Some(name) = orca_only.iter().find(|w| first.eq_ignore_ascii_case(w.as_bytes())) {
            let text = format!(
                "ERR {} has no meaning in a kite keyspace (keyspace {} runs kite)",
                name.to_ascii_uppercase(),
                conn.node.id.0
            );
            return Pending::ready(Frame::error(&text), conn.protocol);
        }
    }
    let words = match transaction(conn, words).await {
        Ok(reply) => return reply,
        Err(words) => words,
    };
    let first = words.first().map_or(&[][..], |w| &w[..]);
    match first {
        w if w.eq_ignore_ascii_case(b"acl") => acl(conn, &words),
        w if w.eq_ignore_ascii_case(b"keel.req") => keel_req(conn, words).await,
        w if w.eq_ignore_ascii_case(b"keel.session") => keel_session(conn, &words).await,
        w if w.eq_ignore_ascii_case(b"keel.invoke") => keel_invoke(conn, words).await,
        w if w.eq_ignore_ascii_case(b"keel.log") => match permitted(conn, Some(Category::Admin)) {
            Ok(()) => keel_log(conn, &words),
            Err(refusal) => Pending::ready(refusal, conn.protocol),
        },
        _ => match keel_wire::command::parse(words, &conn.limits) {
            Ok(command) => {
                let pair = conn.next_pair();
                dispatch(conn, command, pair, false).await
            }
            Err(e) => Pending::ready(e.reply_frame(), conn.protocol),
        },
    }
}

/// `HELLO ... AUTH <user> <password> ...` on a node with users: authenticates first (as
/// `AUTH`), then leaves the words to `HELLO` with its `AUTH` option answered. Other
/// requests pass through.
async fn hello_auth(conn: &mut Conn, words: Vec<Bytes>) -> Result<Vec<Bytes>, Pending> {
    let first = words.first().map_or(&[][..], |w| &w[..]);
    if !first.eq_ignore_ascii_case(b"hello") || !conn.users.required() {
        return Ok(words);
    }
    let parsed = keel_wire::command::parse(words.clone(), &conn.limits);
    let Ok(ClientCommand::Hello { protocol, auth: Some((name, password)), client_name }) = parsed
    else {
        return Ok(words); // without AUTH, or malformed: HELLO's own parse answers it
    };
    login(conn, &name, &password).await?;
    // The same HELLO without its AUTH option, now answered.
    let version = protocol.map_or(2, |p| p.version());
    let mut words = vec![Bytes::from_static(b"HELLO"), Bytes::from(version.to_string())];
    if let Some(client_name) = client_name {
        words.extend([Bytes::from_static(b"SETNAME"), client_name]);
    }
    Ok(words)
}

fn request_words(frame: Frame) -> Result<Vec<Bytes>, String> {
    let Frame::Array(items) = frame else {
        return Err("ERR Protocol error: expected an array of bulk strings".into());
    };
    // Pushed into a new vector, not collected in place: in place, the frames' buffer
    // was shrunk to the words' size, a reallocation per request.
    let mut words = Vec::with_capacity(items.len());
    for item in items {
        match item {
            Frame::Bulk(bytes) => words.push(bytes),
            _ => return Err("ERR Protocol error: expected an array of bulk strings".into()),
        }
    }
    Ok(words)
}

fn parse_u64(word: &[u8]) -> Option<u64> {
    std::str::from_utf8(word).ok()?.parse().ok()
}

/// The deduplication pair `KEEL.REQ <client> <seq> ...` names, as the engine sees it: an
/// authenticated user's ids are its own (derived from its name, so that no other user
/// can advance or replay them).
fn req_pair(conn: &Conn, words: &[Bytes]) -> Result<(ClientId, RequestId), Frame> {
    if words.len() < 4 {
        return Err(Frame::error("ERR wrong number of arguments for 'keel.req' command"));
    }
    let client = parse_u64(&words[1]).filter(|c| *c != 0 && *c != ClientId::SESSION_BIT);
    let seq = parse_u64(&words[2]).filter(|s| *s != 0);
    let (Some(client), Some(seq)) = (client, seq) else {
        return Err(Frame::error("ERR KEEL.REQ client and seq must be positive integers"));
    };
    let client = conn.user.as_ref().map_or(ClientId(client), |user| user.client_id(client));
    Ok((client, RequestId(seq)))
}

async fn keel_req(conn: &mut Conn, mut words: Vec<Bytes>) -> Pending {
    let protocol = conn.protocol;
    let (client, request) = match req_pair(conn, &words) {
        Ok(pair) => pair,
        Err(refusal) => return Pending::ready(refusal, protocol),
    };
    if words[3].eq_ignore_ascii_case(b"exec") {
        return Pending::ready(Frame::error("ERR EXEC without MULTI"), protocol);
    }
    let rest = words.split_off(3);
    let command = match keel_wire::command::parse(rest, &conn.limits) {
        Ok(command) => command,
        Err(e) => return Pending::ready(e.reply_frame(), protocol),
    };
    let single_key = matches!(
        &command,
        ClientCommand::Get { .. }
            | ClientCommand::Set { .. }
            | ClientCommand::Incr { .. }
            | ClientCommand::Cas { .. }
            | ClientCommand::Scan { .. }
            | ClientCommand::Enqueue { .. }
            | ClientCommand::Dequeue { .. }
            | ClientCommand::QueuePeek { .. }
    ) || matches!(&command, ClientCommand::Del { keys } if keys.len() == 1);
    if !single_key {
        let text = "ERR KEEL.REQ takes one single-key command (or EXEC inside MULTI)";
        return Pending::ready(Frame::error(text), protocol);
    }
    dispatch(conn, command, (client, request), true).await
}

/// `KEEL.SESSION`: opens a deduplication session in the connection's keyspace and
/// answers its id (a bulk string: a u64 with `ClientId::SESSION_BIT` set) for
/// `KEEL.REQ`. The id is drawn at random; for an authenticated user the engine sees it
/// mapped, as every `KEEL.REQ` id.
async fn keel_session(conn: &mut Conn, words: &[Bytes]) -> Pending {
    use ring::rand::SecureRandom;
    let protocol = conn.protocol;
    if words.len() != 1 {
        return Pending::ready(
            Frame::error("ERR wrong number of arguments for 'keel.session' command"),
            protocol,
        );
    }
    if let Err(refusal) = permitted(conn, Some(Category::Write)) {
        return Pending::ready(refusal, protocol);
    }
    let mut nonce = [0u8; 8];
    if ring::rand::SystemRandom::new().fill(&mut nonce).is_err() {
        return Pending::ready(Frame::error("ERR no random id available"), protocol);
    }
    let raw = u64::from_le_bytes(nonce) | ClientId::SESSION_BIT;
    let client = conn.user.as_ref().map_or(ClientId(raw), |user| user.client_id(raw));
    let ks = conn.node.id;
    conn.order(Kind::Write(ks)).await;
    conn.last_looped = Some(conn.queued);
    let sent = conn.node.send(Submit {
        client,
        request: RequestId(0),
        command: Command::OpenSession,
        durability: None,
        level: None,
        after: conn.resolved.floor(ks),
        mode: OpMode::Plain,
        named: false,
    });
    let reply = async move {
        match sent.answer().await.and_then(|r| r.result) {
            Ok(_) => Frame::bulk(raw.to_string()),
            Err(e) => error_frame(&e),
        }
    };
    Pending::later(Box::pin(reply), protocol)
}

/// One view of a `KEEL.INVOKE`, for the connection's writer.
#[derive(Debug)]
pub enum View {
    /// A preliminary view: a RESP3 push frame, written at once.
    Push(Frame),
    /// The final view: the command's reply.
    Final(Frame),
}

/// The reply when an invocation's views stop without a final one (the node stopping).
/// `TIMEOUT`, outcome unknown: an invoked enqueue or dequeue may have been applied.
pub const INVOKE_ENDED: &str = "TIMEOUT the invocation ended without a final view";

/// `KEEL.INVOKE GET <key> [LEVELS <level> ...] [NOCONFIRM] [WITHVERSION]`: a read as a
/// Correctable (`docs/correctables.md`). The node reads `key` at each level, weakest
/// first, one after the other: each view but the last goes out at once as a RESP3 push
/// `["invoke", tag, level, value, version]` (`tag`: the request's sequence number on the
/// connection), and the last is the ordinary reply of `GET` (with `WITHVERSION`, of
/// `GET ... WITHVERSION`). A view equal to the one before it (value and version) carries
/// `+SAME` instead of the value, unless `NOCONFIRM`; RESP2 connections get the final
/// reply only, whole.
///
/// `KEEL.INVOKE DEQUEUE <queue> [LEVELS <level> ...] [DURABILITY d] [NOCONFIRM]
/// [WITHVERSION]` and `KEEL.INVOKE ENQUEUE <queue> <value> ...`: a queue operation as a
/// Correctable. `LEVELS any` (the default; no other level is taken) gives a preliminary
/// view: the operation simulated on the queue as this node holds it (`KEEL.QPEEK`), shaped as
/// the operation's reply (`[seq, value, remaining]` or null; `[seq, length]`). The final
/// view is the operation itself, ordered through the log, labelled `linearizable`; its
/// `+SAME` stands for a view equal to the last preliminary one (versions aside: the
/// operation's entry is always newer than what it read).
async fn keel_invoke(conn: &mut Conn, words: Vec<Bytes>) -> Pending {
    let protocol = conn.protocol;
    let invocation = match parse_invoke(&words, &conn.limits) {
        Ok(invocation) => invocation,
        Err(text) => return Pending::ready(Frame::error(&text), protocol),
    };
    let category = if invocation.op.is_read() { Category::Read } else { Category::Write };
    if let Err(refusal) = permitted(conn, Some(category)) {
        return Pending::ready(refusal, protocol);
    }
    let ks = conn.node.id;
    if invocation.op.is_read() {
        let strongest = invocation.levels.last().copied();
        conn.order(Kind::Read(ks, strongest)).await;
    } else {
        conn.order(Kind::Write(ks)).await;
        conn.last_looped = Some(conn.queued);
    }
    let after = conn.resolved.floor(ks);
    let count = invocation.levels.len() + usize::from(!invocation.op.is_read());
    // RESP2 cannot receive the preliminary views: only the final step runs.
    let first = if protocol == Protocol::Resp3 { 0 } else { count - 1 };
    let mut steps = Vec::with_capacity(count - first);
    let mut tag = None;
    for i in first..count {
        let is_final = i == count - 1;
        let (client, request) = match invocation.req {
            // As `KEEL.REQ`: an authenticated user's ids are its own.
            Some((client, seq)) if is_final => {
                let client = conn.user.as_ref().map_or(ClientId(client), |u| u.client_id(client));
                (client, RequestId(seq))
            }
            _ => conn.next_pair(),
        };
        tag.get_or_insert(request.0);
        let level = invocation.levels.get(i).copied();
        let queue = || invocation.key.clone();
        if let InvokeOp::MGet(keys) = &invocation.op {
            let submits = keys
                .iter()
                .map(|key| get_submit(client, request, key.clone(), level, after))
                .collect();
            steps.push(Step::Keys(submits));
            continue;
        }
        let (command, durability) = match (&invocation.op, is_final) {
            (InvokeOp::Get, _) => (Command::Get { key: invocation.key.clone() }, None),
            (InvokeOp::Set(value), _) => {
                let command = Command::Put { key: invocation.key.clone(), value: value.clone() };
                (command, invocation.durability)
            }
            (InvokeOp::MGet(_), _) => unreachable!("stepped above"),
            (_, false) => (Command::QueuePeek { queue: queue() }, None),
            (InvokeOp::Dequeue, true) => {
                (Command::Dequeue { queue: queue() }, invocation.durability)
            }
            (InvokeOp::Enqueue(value), true) => {
                (Command::Enqueue { queue: queue(), value: value.clone() }, invocation.durability)
            }
        };
        let mode = OpMode::Plain;
        let submit =
            Submit { client, request, command, durability, level, after, mode, named: false };
        steps.push(match invocation.op {
            // A read's levels are asked one after the other, each once the one before
            // it is answered.
            InvokeOp::Get => Step::Later(submit),
            // A queue operation's steps are all sent now, in order: its write keeps its
            // place among the connection's writes (a later request's write must not reach
            // the log first), and the views read the queue before the write.
            _ => {
                match (!submit.command.is_write()).then(|| conn.node.read_now(&submit)).flatten() {
                    Some(reply) => Step::Ready(reply),
                    None => Step::Sent(conn.node.send(submit)),
                }
            }
        });
    }
    let tag = tag.expect("at least one step");
    let floor = Floor { resolved: conn.resolved.clone(), keyspace: ks };
    let (tx, rx) = mpsc::channel(steps.len());
    let last = steps.len() - 1;
    let resp3 = protocol == Protocol::Resp3;
    let mut views = Views { invocation, tag, first, resp3, previous: None };
    // A read's first view, when the node can answer it at once (off the loop), is made
    // here and handed to the writer directly, with no hop through a task.
    let mut done = 0;
    if views.invocation.op == InvokeOp::Get && last > 0 {
        if let Some(Step::Later(submit)) = steps.first() {
            if let Some(reply) = conn.node.read_now(submit) {
                let viewed = match reply.result {
                    Ok(result) => invoke_view(&views.invocation.op, result),
                    Err(e) => Err(error_frame(&e)),
                };
                if let Some(view) = views.make(0, false, viewed) {
                    let ends = matches!(view, View::Final(_));
                    let _ = tx.try_send(view);
                    if ends {
                        return Pending {
                            protocol,
                            close: false,
                            body: Body::Views(rx),
                            charge: None,
                        };
                    }
                }
                steps.remove(0);
                done = 1;
            }
        }
    }
    let node = conn.node.clone();
    tokio::spawn(async move {
        invoke_views(node, views, steps, done, last, floor, tx).await;
    });
    Pending { protocol, close: false, body: Body::Views(rx), charge: None }
}

/// One step of an invocation: its request, still to send, or sent.
enum Step {
    Later(Submit),
    /// An `MGET` view: a get per key, all at one level, sent when the step comes.
    Keys(Vec<Submit>),
    Ready(ClientReply),
    Sent(Sent),
}

/// Reads of one `MGET` view: sent together, the values in key order and the greatest
/// version among them.
async fn keys_view(
    node: &KeyspaceHandle,
    submits: Vec<Submit>,
) -> Result<(Frame, Option<Version>), Frame> {
    let mut sent = Vec::with_capacity(submits.len());
    for submit in submits {
        sent.push(match node.read_now(&submit) {
            Some(reply) => Step::Ready(reply),
            None => Step::Sent(node.send(submit)),
        });
    }
    let (mut values, mut newest) = (Vec::with_capacity(sent.len()), None);
    for step in sent {
        let answer = match step {
            Step::Ready(reply) => Ok(reply),
            Step::Sent(sent) => sent.answer().await,
            Step::Later(_) | Step::Keys(_) => unreachable!("sent above"),
        };
        match answer.and_then(|reply| reply.result) {
            Ok(CommandResult::Value { value, version }) => {
                values.push(value_frame(value.as_ref()));
                newest = newest.max(version);
            }
            Ok(_) => return Err(mismatched("get")),
            Err(e) => return Err(error_frame(&e)),
        }
    }
    Ok((Frame::Array(values), newest))
}

/// Turns an invocation's step results into the views the connection writes: pushes for
/// the preliminary ones, the reply for the final one, confirmations in place of values
/// equal to the view before.
struct Views {
    invocation: Invocation,
    /// The request's tag in its pushes.
    tag: u64,
    /// The level of step `i` is `invocation.levels[first + i]`.
    first: usize,
    resp3: bool,
    /// The last view made: its value and version.
    previous: Option<(Frame, Option<Version>)>,
}

impl Views {
    /// The view of step `i` (`None`: left out, a queue operation's failed preliminary
    /// view), or the final view an error ends the invocation with.
    fn make(
        &mut self,
        i: usize,
        is_final: bool,
        viewed: Result<(Frame, Option<Version>), Frame>,
    ) -> Option<View> {
        let op = &self.invocation.op;
        let (value, version) = match viewed {
            Ok(view) => view,
            // A queue operation's write is already sent: a preliminary view that failed
            // is left out, and the final view still tells how the operation ended.
            Err(_) if !is_final && !op.is_read() => return None,
            Err(frame) => return Some(View::Final(frame)),
        };
        // A read's view is the same when value and version are; a queue operation's final
        // view is always at a newer version than what its preliminary ones read.
        let same = self.invocation.confirm
            && self.resp3
            && self
                .previous
                .as_ref()
                .is_some_and(|p| p.0 == value && (p.1 == version || !op.is_read()));
        let shown = if same { Frame::Simple(b"SAME".to_vec()) } else { value.clone() };
        let view = if is_final {
            View::Final(if self.invocation.with_version {
                with_version_frame(shown, version)
            } else {
                shown
            })
        } else {
            let level =
                self.invocation.levels.get(self.first + i).expect("a preliminary view has a level");
            View::Push(Frame::Push(vec![
                Frame::bulk("invoke"),
                Frame::Integer(i64::try_from(self.tag).unwrap_or(i64::MAX)),
                Frame::bulk(level.as_str()),
                shown,
                version.map_or(Frame::Null, version_frame),
            ]))
        };
        self.previous = Some((value, version));
        Some(view)
    }
}

/// Produces the views of `steps` (the invocation's steps from `done` on), in order, into
/// `tx`.
async fn invoke_views(
    node: KeyspaceHandle,
    mut views: Views,
    steps: Vec<Step>,
    done: usize,
    last: usize,
    floor: Floor,
    tx: mpsc::Sender<View>,
) {
    for (i, step) in steps.into_iter().enumerate().map(|(i, s)| (i + done, s)) {
        let is_final = i == last;
        let viewed = match step {
            Step::Keys(mut submits) => {
                if is_final && node.unsafe_stale_invoke {
                    submits.iter_mut().for_each(|s| s.level = Some(ReadLevel::Any));
                }
                keys_view(&node, submits).await
            }
            one => {
                let reply = match one {
                    Step::Later(mut submit) => {
                        if is_final && node.unsafe_stale_invoke {
                            submit.level = Some(ReadLevel::Any);
                        }
                        match node.read_now(&submit) {
                            Some(reply) => Ok(reply),
                            None => node.send(submit).answer().await,
                        }
                    }
                    Step::Ready(reply) => Ok(reply),
                    Step::Sent(sent) => sent.answer().await,
                    Step::Keys(_) => unreachable!("matched above"),
                };
                if is_final && !views.invocation.op.is_read() {
                    floor.note(&reply);
                }
                match reply.and_then(|reply| reply.result) {
                    Ok(result) => invoke_view(&views.invocation.op, result),
                    Err(e) => Err(error_frame(&e)),
                }
            }
        };
        let Some(view) = views.make(i, is_final, viewed) else { continue };
        let ends = matches!(view, View::Final(_));
        if tx.send(view).await.is_err() || ends {
            return; // the connection went away, or the invocation ended
        }
    }
}

/// One step's result as a view: the frame the operation's reply would carry, and its
/// version; a result of another kind becomes an error frame.
fn invoke_view(op: &InvokeOp, result: CommandResult) -> Result<(Frame, Option<Version>), Frame> {
    let count = |n: u64| Frame::Integer(i64::try_from(n).unwrap_or(i64::MAX));
    match (op, result) {
        (InvokeOp::Get, CommandResult::Value { value, version }) => {
            Ok((value_frame(value.as_ref()), version))
        }
        // What a dequeue applied to the queue as read would return.
        (InvokeOp::Dequeue, CommandResult::Queue { head, length, version, .. }) => {
            let frame = match head {
                Some((seq, value)) => Frame::Array(vec![
                    count(seq),
                    Frame::Bulk(value),
                    count(length.saturating_sub(1)),
                ]),
                None => Frame::Null,
            };
            Ok((frame, version))
        }
        // What an enqueue applied to the queue as read would return.
        (InvokeOp::Enqueue(_), CommandResult::Queue { length, next, version, .. }) => {
            Ok((Frame::Array(vec![count(next), count(length + 1)]), version))
        }
        (InvokeOp::Set(_), CommandResult::Written { version }) => Ok((Frame::ok(), Some(version))),
        (_, result @ (CommandResult::Dequeued { .. } | CommandResult::Enqueued { .. })) => {
            let version = result.written_version();
            Ok((keel_wire::reply::result_frame(&result, false), version))
        }
        (InvokeOp::Get | InvokeOp::MGet(_), _) => Err(mismatched("get")),
        (InvokeOp::Set(_), _) => Err(mismatched("set")),
        (_, _) => Err(mismatched("queue operation")),
    }
}

/// The operation a `KEEL.INVOKE` runs.
#[derive(Debug, PartialEq, Eq)]
enum InvokeOp {
    Get,
    /// With every key read, in order.
    MGet(Vec<Bytes>),
    /// A write: one final view, its reply. With the value written.
    Set(Bytes),
    Dequeue,
    /// With the element enqueued.
    Enqueue(Bytes),
}

impl InvokeOp {
    /// Reads: a view per level, each read one after the other.
    fn is_read(&self) -> bool {
        matches!(self, InvokeOp::Get | InvokeOp::MGet(_))
    }
}

/// What a `KEEL.INVOKE` asks for.
#[derive(Debug, PartialEq, Eq)]
struct Invocation {
    op: InvokeOp,
    /// The key read, or the queue's name.
    key: Bytes,
    /// Weakest first, without repeats; never empty. For a queue operation: the levels
    /// of its preliminary views (its final view is the operation itself).
    levels: Vec<ReadLevel>,
    confirm: bool,
    with_version: bool,
    /// A queue operation's durability (`None`: the keyspace default).
    durability: Option<Durability>,
    /// A queue operation's deduplication pair, as `KEEL.REQ` names it (`REQ <client>
    /// <seq>`): a retry of the invocation with the same pair is answered from the
    /// deduplication table, never applied twice.
    req: Option<(u64, u64)>,
}

fn parse_invoke(words: &[Bytes], limits: &Limits) -> Result<Invocation, String> {
    let usage = "ERR usage: KEEL.INVOKE GET <key> | MGET <numkeys> <key> ... | SET <key> <value> \
                 | DEQUEUE <queue> | ENQUEUE <queue> <value> \
                 [LEVELS <level> ...] [DURABILITY <d>] [REQ <client> <seq>] [NOCONFIRM] [WITHVERSION]";
    let (Some(command), Some(key)) = (words.get(1), words.get(2)) else {
        return Err(usage.into());
    };
    let (op, options) = if command.eq_ignore_ascii_case(b"get") {
        (InvokeOp::Get, 3)
    } else if command.eq_ignore_ascii_case(b"mget") {
        let count = parse_u64(key)
            .filter(|n| (1..=keel_types::MULTI_OPS_MAX as u64).contains(n))
            .ok_or_else(|| {
            format!("ERR KEEL.INVOKE MGET takes 1 to {} keys", keel_types::MULTI_OPS_MAX)
        })?;
        let keys = words.get(3..3 + count as usize).ok_or_else(|| usage.to_string())?;
        for key in keys {
            limits.check_key(key).map_err(|e| error_text(&e))?;
        }
        (InvokeOp::MGet(keys.to_vec()), 3 + count as usize)
    } else if command.eq_ignore_ascii_case(b"set") {
        let value = words.get(3).ok_or_else(|| usage.to_string())?;
        limits.check_value(value).map_err(|e| error_text(&e))?;
        (InvokeOp::Set(value.clone()), 4)
    } else if command.eq_ignore_ascii_case(b"dequeue") {
        (InvokeOp::Dequeue, 3)
    } else if command.eq_ignore_ascii_case(b"enqueue") {
        let value = words.get(3).ok_or_else(|| usage.to_string())?;
        limits.check_value(value).map_err(|e| error_text(&e))?;
        (InvokeOp::Enqueue(value.clone()), 4)
    } else {
        return Err("ERR KEEL.INVOKE supports GET, MGET, SET, DEQUEUE and ENQUEUE".into());
    };
    let key = match &op {
        InvokeOp::MGet(keys) => keys[0].clone(),
        _ => {
            limits.check_key(key).map_err(|e| error_text(&e))?;
            key.clone()
        }
    };
    let mut invocation = Invocation {
        op,
        key,
        levels: Vec::new(),
        confirm: true,
        with_version: false,
        durability: None,
        req: None,
    };
    let mut in_levels = false;
    let mut words = words[options..].iter();
    while let Some(word) = words.next() {
        let text = std::str::from_utf8(word).map_err(|_| usage.to_string())?;
        match text.to_ascii_lowercase().as_str() {
            "levels" => in_levels = true,
            "noconfirm" => (invocation.confirm, in_levels) = (false, false),
            "withversion" => (invocation.with_version, in_levels) = (true, false),
            "durability" if !invocation.op.is_read() => {
                in_levels = false;
                let word = words.next().ok_or_else(|| usage.to_string())?;
                let name = std::str::from_utf8(word).map_err(|_| usage.to_string())?;
                let durability = name.parse::<Durability>().map_err(|e| format!("ERR {e}"))?;
                invocation.durability = Some(durability);
            }
            "req" if !invocation.op.is_read() => {
                in_levels = false;
                let mut number = || words.next().and_then(|w| parse_u64(w));
                let client = number().filter(|c| *c != 0 && *c != ClientId::SESSION_BIT);
                let seq = number().filter(|s| *s != 0);
                let (Some(client), Some(seq)) = (client, seq) else {
                    return Err(
                        "ERR KEEL.INVOKE REQ client and seq must be positive integers".into()
                    );
                };
                invocation.req = Some((client, seq));
            }
            name if in_levels => {
                let level = name.parse::<ReadLevel>().map_err(|e| format!("ERR {e}"))?;
                invocation.levels.push(level);
            }
            _ => return Err(usage.into()),
        }
    }
    // A queue operation's write is sent with its views' reads: a read that waits (for a
    // durability round, or the leader) could see the operation's own effect. Its views
    // are the local replica's, as the paper's peek at the closest replica.
    let queue = matches!(invocation.op, InvokeOp::Dequeue | InvokeOp::Enqueue(_));
    if queue && invocation.levels.iter().any(|l| *l != ReadLevel::Any) {
        return Err("ERR a queue operation's preliminary views are read at level any".into());
    }
    if matches!(invocation.op, InvokeOp::Set(_)) && !invocation.levels.is_empty() {
        return Err("ERR a write answers with one final view: no LEVELS".into());
    }
    if invocation.levels.is_empty() {
        invocation.levels = match invocation.op {
            InvokeOp::Get | InvokeOp::MGet(_) => ReadLevel::ALL.to_vec(),
            InvokeOp::Set(_) => Vec::new(),
            InvokeOp::Dequeue | InvokeOp::Enqueue(_) => vec![ReadLevel::Any],
        };
    }
    invocation.levels.sort();
    invocation.levels.dedup();
    Ok(invocation)
}

fn keel_log(conn: &Conn, words: &[Bytes]) -> Pending {
    let protocol = conn.protocol;
    let (Some(from), Some(count)) =
        (words.get(1).and_then(|w| parse_u64(w)), words.get(2).and_then(|w| parse_u64(w)))
    else {
        return Pending::ready(Frame::error("ERR usage: KEEL.LOG <from> <count>"), protocol);
    };
    if words.len() != 3 {
        return Pending::ready(
            Frame::error("ERR wrong number of arguments for 'keel.log' command"),
            protocol,
        );
    }
    let node = conn.node.clone();
    let count = u32::try_from(count).unwrap_or(u32::MAX);
    Pending::later(
        Box::pin(async move {
            match node.log(LogIndex(from), count, QUERY_WAIT).await {
                Ok(page) => log_page_frame(&page),
                Err(e) => error_frame(&e),
            }
        }),
        protocol,
    )
}

/// A page of the log as `KEEL.LOG` answers it: the snapshot's index, then the entries
/// as JSON while their JSON stays within [`crate::driver::LOG_PAGE_BYTES_MAX`] (at least
/// one). The bound is on the bytes sent: JSON writes a value's bytes as an array of
/// numbers, up to four times its size, so the driver's count of value bytes is not it.
fn log_page_frame(page: &crate::driver::LogPage) -> Frame {
    let mut items = vec![Frame::Integer(page.snapshot_index.0 as i64)];
    let mut bytes = 0usize;
    for entry in &page.entries {
        let json = serde_json::to_vec(entry).expect("entries serialize");
        bytes += json.len();
        if bytes > crate::driver::LOG_PAGE_BYTES_MAX && items.len() > 1 {
            break;
        }
        items.push(Frame::Bulk(json.into()));
    }
    Frame::Array(items)
}

/// Runs a parsed command with the deduplication pair `pair` (`named`: chosen by the
/// client, `KEEL.REQ`): sends it to the engine now and returns the future of its reply.
async fn dispatch(
    conn: &mut Conn,
    command: ClientCommand,
    pair: (ClientId, RequestId),
    named: bool,
) -> Pending {
    let protocol = conn.protocol;
    if let Err(refusal) = permitted(conn, category(&command)) {
        return Pending::ready(refusal, protocol);
    }
    let ks = conn.node.id;
    if let Err(refusal) = engine_permits(conn.node.kind, ks, &command) {
        return Pending::ready(Frame::error(&refusal), protocol);
    }
    let mode = command.mode();
    let kind = match &command {
        // A Kite session orders its requests itself: every one is sent at once.
        ClientCommand::Get { .. }
        | ClientCommand::Set { .. }
        | ClientCommand::Incr { .. }
        | ClientCommand::Cas { .. }
        | ClientCommand::Exists { .. }
        | ClientCommand::MGet { .. }
            if conn.node.kind == EngineKind::Kite =>
        {
            Kind::Write(ks)
        }
        ClientCommand::Get { level, .. }
        | ClientCommand::Scan { level, .. }
        | ClientCommand::MGet { level, .. }
        | ClientCommand::QueuePeek { level, .. } => Kind::Read(ks, *level),
        ClientCommand::Exists { .. } => Kind::Read(ks, None),
        ClientCommand::Set { .. }
        | ClientCommand::Incr { .. }
        | ClientCommand::Cas { .. }
        | ClientCommand::Del { .. }
        | ClientCommand::Enqueue { .. }
        | ClientCommand::Dequeue { .. } => Kind::Write(ks),
        other => return admin(conn, other.clone()),
    };
    conn.order(kind).await;
    let loop_idle = conn.loop_idle();
    let looped_before = conn.last_looped.replace(conn.queued);
    // After `order`: every write before this request on the connection is answered.
    let after = conn.resolved.floor(ks);
    let floor = || Floor { resolved: conn.resolved.clone(), keyspace: ks };
    let submit = |command: Command| Submit {
        client: pair.0,
        request: pair.1,
        command,
        durability: None,
        level: None,
        after,
        mode,
        named,
    };
    let later = |future: ReplyFuture| Pending::later(future, protocol);
    match command {
        ClientCommand::Get { key, level, with_version, .. } => {
            let submit = Submit { level, ..submit(Command::Get { key }) };
            if let Some(reply) = loop_idle.then(|| conn.node.read_now(&submit)).flatten() {
                conn.last_looped = looped_before;
                return Pending::ready(get_reply(Ok(reply), with_version), protocol);
            }
            let sent = conn.node.send(submit);
            Pending::engine(sent, (get_reply, with_version), protocol)
        }
        ClientCommand::Set { key, value, durability, with_version, .. } => {
            let sent = conn.node.send(Submit { durability, ..submit(Command::Put { key, value }) });
            Pending::write(sent, (set_reply, with_version), protocol, floor())
        }
        ClientCommand::Incr { key, delta, fetch: false } => {
            let sent = conn.node.send(submit(Command::Incr { key, delta }));
            Pending::write(sent, (result_reply, false), protocol, floor())
        }
        ClientCommand::Incr { key, delta, fetch: true } => {
            let sent = conn.node.send(submit(Command::Incr { key, delta }));
            let floor = floor();
            later(Box::pin(async move {
                let answer = sent.answer().await;
                floor.note(&answer);
                faa_reply(answer, delta)
            }))
        }
        ClientCommand::Cas { key, expected, new, durability, .. } => {
            let sent = conn
                .node
                .send(Submit { durability, ..submit(Command::Cas { key, expected, new }) });
            Pending::write(sent, (result_reply, false), protocol, floor())
        }
        ClientCommand::Scan { start, end, count, level } => {
            let sent = conn
                .node
                .send(Submit { level, ..submit(Command::Scan { start, end, limit: count }) });
            Pending::engine(sent, (result_reply, false), protocol)
        }
        ClientCommand::Enqueue { queue, value, durability } => {
            let sent =
                conn.node.send(Submit { durability, ..submit(Command::Enqueue { queue, value }) });
            Pending::write(sent, (result_reply, false), protocol, floor())
        }
        ClientCommand::Dequeue { queue, durability } => {
            let sent = conn.node.send(Submit { durability, ..submit(Command::Dequeue { queue }) });
            Pending::write(sent, (result_reply, false), protocol, floor())
        }
        ClientCommand::QueuePeek { queue, level } => {
            let sent = conn.node.send(Submit { level, ..submit(Command::QueuePeek { queue }) });
            Pending::engine(sent, (result_reply, false), protocol)
        }
        ClientCommand::Del { keys } => {
            let floor = floor();
            let subs = multi(conn, pair, keys);
            later(Box::pin(del(&conn.node, subs, after, floor)))
        }
        ClientCommand::Exists { keys } => {
            let subs = multi(conn, pair, keys);
            let node = &conn.node;
            later(Box::pin(values_reply(node, subs, None, after, exists_frame)))
        }
        ClientCommand::MGet { keys, level } => {
            let subs = multi(conn, pair, keys);
            let node = &conn.node;
            later(Box::pin(values_reply(node, subs, level, after, mget_frame)))
        }
        _ => unreachable!("admin commands returned above"),
    }
}

/// One `(client, request, key)` per key: the first key takes `pair`, the rest fresh
/// sequence numbers of the connection.
fn multi(
    conn: &mut Conn,
    pair: (ClientId, RequestId),
    keys: Vec<Bytes>,
) -> Vec<(ClientId, RequestId, Bytes)> {
    let mut out = Vec::with_capacity(keys.len());
    for (i, key) in keys.into_iter().enumerate() {
        let (client, request) = if i == 0 { pair } else { conn.next_pair() };
        out.push((client, request, key));
    }
    out
}

fn get_submit(
    client: ClientId,
    request: RequestId,
    key: Bytes,
    level: Option<ReadLevel>,
    after: LogIndex,
) -> Submit {
    let command = Command::Get { key };
    let mode = OpMode::Plain;
    Submit { client, request, command, durability: None, level, after, mode, named: false }
}

/// Whether a keyspace of engine `kind` gives `command` a meaning; `Err` is the error
/// text, naming the engine. Kite keyspaces take single-key reads, writes and
/// read-modify-writes with their barriers (and `EXISTS`, `MGET` as relaxed reads); ORCA
/// keyspaces refuse the barriers and strengths, which only Kite defines.
fn engine_permits(kind: EngineKind, ks: KeyspaceId, command: &ClientCommand) -> Result<(), String> {
    // The refusals' words are built only for a refusal: this runs for every request.
    let runs = || format!("(keyspace {} runs {kind})", ks.0);
    match kind {
        EngineKind::Orca => match command.mode() {
            OpMode::Plain => Ok(()),
            mode => Err(format!("ERR {} needs a kite keyspace {}", mode.word(), runs())),
        },
        EngineKind::Kite => {
            let option = match command {
                ClientCommand::Get { level: Some(_), .. }
                | ClientCommand::MGet { level: Some(_), .. } => Some("LEVEL"),
                ClientCommand::Get { with_version: true, .. }
                | ClientCommand::Set { with_version: true, .. } => Some("WITHVERSION"),
                ClientCommand::Set { durability: Some(_), .. }
                | ClientCommand::Cas { durability: Some(_), .. } => Some("DURABILITY"),
                _ => None,
            };
            if let Some(option) = option {
                return Err(format!(
                    "ERR {option} has no meaning in a kite keyspace {}: use ACQUIRE, RELEASE, WEAK or STRONG",
                    runs()
                ));
            }
            match command {
                ClientCommand::Get { .. }
                | ClientCommand::Set { .. }
                | ClientCommand::Incr { .. }
                | ClientCommand::Cas { .. }
                | ClientCommand::Exists { .. }
                | ClientCommand::MGet { .. } => Ok(()),
                ClientCommand::Del { .. }
                | ClientCommand::Scan { .. }
                | ClientCommand::Enqueue { .. }
                | ClientCommand::Dequeue { .. }
                | ClientCommand::QueuePeek { .. } => {
                    let name = command.name().to_ascii_uppercase();
                    Err(format!("ERR {name} has no meaning in a kite keyspace {}", runs()))
                }
                _ => Ok(()),
            }
        }
    }
}

/// `KEEL.FAA`: the value before the addition (the engine answers the value after it).
fn faa_reply(reply: Result<ClientReply, KeelError>, delta: i64) -> Frame {
    match reply.and_then(|r| r.result) {
        Ok(CommandResult::Counter { value, .. }) => match value.checked_sub(delta) {
            Some(before) => Frame::Integer(before),
            None => mismatched("fetch-and-add"),
        },
        Ok(_) => mismatched("fetch-and-add"),
        Err(e) => error_frame(&e),
    }
}

/// `DEL`: reads each key at level `any` to count the ones that existed, then deletes it;
/// every read and delete is sent at once, in that order. The count is advisory under
/// concurrent writers; the deletes are not.
fn del(
    node: &KeyspaceHandle,
    keys: Vec<(ClientId, RequestId, Bytes)>,
    after: LogIndex,
    floor: Floor,
) -> impl Future<Output = Frame> + Send + 'static {
    let mut sent = Vec::with_capacity(keys.len());
    for (client, request, key) in keys {
        // The read shares the delete's pair: reads never enter the dedup table.
        let any = Some(ReadLevel::Any);
        let read = node.send(get_submit(client, request, key.clone(), any, after));
        let command = Command::Delete { key };
        let (level, mode) = (None, OpMode::Plain);
        let named = false;
        let delete = node.send(Submit {
            client,
            request,
            command,
            durability: None,
            level,
            after,
            mode,
            named,
        });
        sent.push((read, delete));
    }
    async move {
        let mut existed = 0;
        let mut failed = None;
        for (read, delete) in sent {
            if let Ok(ClientReply {
                result: Ok(CommandResult::Value { value: Some(_), .. }), ..
            }) = read.answer().await
            {
                existed += 1;
            }
            let answer = delete.answer().await;
            floor.note(&answer);
            if let Err(e) = answer.and_then(|r| r.result) {
                failed.get_or_insert(e);
            }
        }
        match failed {
            Some(e) => error_frame(&e),
            None => Frame::Integer(existed),
        }
    }
}

/// Sends a get per key at once; the values in key order, or the first error.
fn values(
    node: &KeyspaceHandle,
    keys: Vec<(ClientId, RequestId, Bytes)>,
    level: Option<ReadLevel>,
    after: LogIndex,
) -> impl Future<Output = Result<Vec<Option<Bytes>>, KeelError>> + Send + 'static {
    let sent: Vec<_> = keys
        .into_iter()
        .map(|(client, request, key)| node.send(get_submit(client, request, key, level, after)))
        .collect();
    async move {
        let mut values = Vec::with_capacity(sent.len());
        for one in sent {
            match one.answer().await.and_then(|r| r.result)? {
                CommandResult::Value { value, .. } => values.push(value),
                // A reply of another kind (a peer's forwarded answer that breaks the
                // protocol) is refused, not trusted.
                other => {
                    let kind = format!("a get was answered with {other:?}");
                    return Err(KeelError::Unavailable(kind));
                }
            }
        }
        Ok(values)
    }
}

/// `EXISTS` and `MGET`: a get per key, sent at once, and `frame` of their values.
fn values_reply(
    node: &KeyspaceHandle,
    keys: Vec<(ClientId, RequestId, Bytes)>,
    level: Option<ReadLevel>,
    after: LogIndex,
    frame: fn(&[Option<Value>]) -> Frame,
) -> impl Future<Output = Frame> + Send + 'static {
    let values = values(node, keys, level, after);
    async move {
        match values.await {
            Ok(values) => frame(&values),
            Err(e) => error_frame(&e),
        }
    }
}

fn exists_frame(values: &[Option<Value>]) -> Frame {
    Frame::Integer(values.iter().filter(|v| v.is_some()).count() as i64)
}

fn mget_frame(values: &[Option<Value>]) -> Frame {
    Frame::Array(values.iter().map(|v| value_frame(v.as_ref())).collect())
}

/// A reply of another kind than the request's (only a forwarded answer from a peer that
/// breaks the protocol can be one): an error for the client, never a panic.
fn mismatched(op: &str) -> Frame {
    Frame::error(&format!("ERR internal: a {op} was answered with another kind of result"))
}

fn get_reply(reply: Result<ClientReply, KeelError>, with_version: bool) -> Frame {
    match reply.and_then(|r| r.result) {
        Ok(CommandResult::Value { value, version }) => {
            let frame = value_frame(value.as_ref());
            if with_version {
                with_version_frame(frame, version)
            } else {
                frame
            }
        }
        Ok(_) => mismatched("get"),
        Err(e) => error_frame(&e),
    }
}

fn set_reply(reply: Result<ClientReply, KeelError>, with_version: bool) -> Frame {
    match reply.and_then(|r| r.result) {
        Ok(CommandResult::Written { version }) => {
            if with_version {
                with_version_frame(Frame::ok(), Some(version))
            } else {
                Frame::ok()
            }
        }
        Ok(_) => mismatched("put"),
        Err(e) => error_frame(&e),
    }
}

/// The reply of `INCR`, `KEEL.CAS`, `KEEL.SCAN`, the queue commands (and any result,
/// by its kind).
fn result_reply(reply: Result<ClientReply, KeelError>, _: bool) -> Frame {
    match reply.and_then(|r| r.result) {
        Ok(CommandResult::Counter { value, .. }) => Frame::Integer(value),
        Ok(CommandResult::Cas { swapped, current, version }) => Frame::Array(vec![
            Frame::Boolean(swapped),
            value_frame(current.as_ref()),
            version.map_or(Frame::Null, version_frame),
        ]),
        Ok(CommandResult::Items { items }) => Frame::Array(
            items
                .into_iter()
                .map(|(k, v, version)| {
                    Frame::Array(vec![Frame::Bulk(k), Frame::Bulk(v), version_frame(version)])
                })
                .collect(),
        ),
        Ok(CommandResult::Written { .. }) => Frame::ok(),
        Ok(CommandResult::Value { value, .. }) => value_frame(value.as_ref()),
        Ok(
            result @ (CommandResult::Enqueued { .. }
            | CommandResult::Dequeued { .. }
            | CommandResult::Queue { .. }),
        ) => keel_wire::reply::result_frame(&result, false),
        Ok(CommandResult::Multi { .. }) => mismatched("command"),
        Err(e) => error_frame(&e),
    }
}

/// Connection and introspection commands.
fn admin(conn: &mut Conn, command: ClientCommand) -> Pending {
    let protocol = conn.protocol;
    let ready = |frame: Frame| Pending::ready(frame, protocol);
    match command {
        ClientCommand::Ping { message: None } => ready(Frame::simple("PONG")),
        ClientCommand::Ping { message: Some(m) } | ClientCommand::Echo { message: m } => {
            ready(Frame::Bulk(m))
        }
        ClientCommand::Hello { protocol: asked, client_name, auth } => {
            match auth {
                // No user is configured: a password cannot be checked, so it is not
                // accepted (as Redis answers AUTH when no password is set).
                Some(_) if !conn.users.required() => {
                    return ready(Frame::error(NO_AUTHENTICATION));
                }
                // `hello_auth` answers a plain `HELLO ... AUTH` before this (on the hashing
                // thread); one reaching here came another way (inside `KEEL.REQ`).
                Some(_) => {
                    return ready(Frame::error("ERR HELLO with AUTH must be sent on its own"))
                }
                None if conn.users.required() && conn.user.is_none() => {
                    return ready(Frame::error(NOAUTH));
                }
                None => {}
            }
            if let Some(asked) = asked {
                conn.protocol = asked;
            }
            if client_name.is_some() {
                conn.name = client_name;
            }
            Pending::ready(hello_frame(conn), conn.protocol)
        }
        ClientCommand::Status => {
            let node = conn.node.clone();
            Pending::later(Box::pin(async move { status_frame(&node).await }), protocol)
        }
        ClientCommand::Keyspaces => ready(keyspaces_frame(&conn.keyspaces)),
        ClientCommand::Info { sections } => {
            let node = conn.node.clone();
            Pending::later(Box::pin(async move { info_frame(&node, &sections).await }), protocol)
        }
        ClientCommand::Client(sub) => ready(client_frame(conn, sub)),
        ClientCommand::Command(query) => ready(match query {
            CommandQuery::All => Frame::Array(Vec::new()),
            CommandQuery::Count => Frame::Integer(0),
            CommandQuery::Docs(_) => Frame::Map(Vec::new()),
            CommandQuery::Info(names) => {
                Frame::Array(names.iter().map(|_| Frame::NullArray).collect())
            }
        }),
        ClientCommand::ConfigGet { .. } => ready(Frame::Map(Vec::new())),
        ClientCommand::Select { index }
            if conn.user.as_ref().is_some_and(|u| !u.may_use(KeyspaceId(index))) =>
        {
            let text = format!("NOPERM this user has no permissions to use keyspace {index}");
            ready(Frame::error(&text))
        }
        ClientCommand::Select { index } => match conn.keyspaces.get(KeyspaceId(index)) {
            Some(handle) => {
                conn.node = handle.clone();
                ready(Frame::ok())
            }
            None => ready(keel_wire::CommandError::DbIndexOutOfRange.reply_frame()),
        },
        ClientCommand::Quit => ready(Frame::ok()).closing(),
        data => unreachable!("data command {} reached admin", data.name()),
    }
}

fn hello_frame(conn: &Conn) -> Frame {
    let pair = |k: &str, v: Frame| (Frame::bulk(k), v);
    Frame::Map(vec![
        pair("server", Frame::bulk(SERVER_NAME)),
        pair("version", Frame::bulk(env!("CARGO_PKG_VERSION"))),
        pair("proto", Frame::Integer(i64::from(conn.protocol.version()))),
        pair("id", Frame::Integer(conn.client.0 as i64)),
        pair("mode", Frame::bulk("cluster")),
        pair("role", Frame::bulk("master")),
        pair("modules", Frame::Array(Vec::new())),
    ])
}

/// Most characters of an unknown subcommand quoted back in its error.
const ERROR_NAME_CHARS_MAX: usize = 64;

fn client_frame(conn: &mut Conn, sub: ClientSubcommand) -> Frame {
    match sub {
        ClientSubcommand::SetName(name) => {
            conn.name = Some(name);
            Frame::ok()
        }
        ClientSubcommand::GetName => conn.name.clone().map_or(Frame::Null, Frame::Bulk),
        ClientSubcommand::Id => Frame::Integer(conn.client.0 as i64),
        ClientSubcommand::SetInfo { .. } => Frame::ok(),
        // Not pretended: `CLIENT LIST`, `KILL` and the rest are refused as Redis refuses
        // a subcommand it does not know.
        ClientSubcommand::Other(sub) => {
            let shown: String = sub.chars().take(ERROR_NAME_CHARS_MAX).collect();
            Frame::error(&format!("ERR unknown subcommand '{shown}'. Try CLIENT HELP."))
        }
    }
}

async fn status_frame(node: &KeyspaceHandle) -> Frame {
    match node.report(QUERY_WAIT).await {
        Ok(report) => {
            let doc = crate::http::keyspace_status(node, &report);
            Frame::Bulk(doc.to_string().into_bytes().into())
        }
        Err(e) => error_frame(&e),
    }
}

/// `KEEL.KEYSPACES`: `[id, name, engine]` per keyspace, by id.
fn keyspaces_frame(keyspaces: &Keyspaces) -> Frame {
    let rows = keyspaces.iter().map(|k| {
        Frame::Array(vec![
            Frame::Integer(i64::from(k.id.0)),
            Frame::bulk(k.name.as_bytes()),
            Frame::bulk(k.kind.name()),
        ])
    });
    Frame::Array(rows.collect())
}

/// The sections of an `INFO` reply asked for (none, `all`, `everything` or `default`: every
/// section; names Keel does not have: nothing, as Redis answers them).
fn info_text(asked: &[String], sections: &[(&str, String)]) -> String {
    let every = asked.is_empty()
        || asked.iter().any(|a| matches!(a.as_str(), "all" | "everything" | "default"));
    let chosen: Vec<String> = sections
        .iter()
        .filter(|(name, _)| every || asked.iter().any(|a| a == &name.to_ascii_lowercase()))
        .map(|(name, body)| format!("# {name}\r\n{body}"))
        .collect();
    chosen.join("\r\n")
}

async fn info_frame(node: &KeyspaceHandle, asked: &[String]) -> Frame {
    match node.report(QUERY_WAIT).await {
        Ok(report) => {
            let s = &report.status;
            let field = |name: &str| s.get(name).and_then(|v| v.as_u64()).unwrap_or(0);
            let role = if s.get("role").and_then(|v| v.as_str()) == Some("leader") {
                "master"
            } else {
                "slave"
            };
            let server = format!(
                "redis_version:7.0.0\r\nkeel_version:{}\r\nkeel_node:{}\r\nkeel_keyspace:{}\r\n",
                env!("CARGO_PKG_VERSION"),
                node.node_id.0,
                node.id.0,
            );
            let replication = format!(
                "role:{role}\r\nkeel_epoch:{}\r\nkeel_leader:{}\r\nkeel_durable_index:{}\r\nkeel_applied_index:{}\r\n",
                field("epoch"),
                field("leader"),
                field("durable_index"),
                field("applied_index"),
            );
            let sections = [("Server", server), ("Replication", replication)];
            Frame::bulk(info_text(asked, &sections))
        }
        Err(e) => error_frame(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::Event;
    use tokio::sync::mpsc;

    fn conn() -> (Conn, mpsc::Receiver<Event>, Arc<Resolved>) {
        let (events, rx) = mpsc::channel(8);
        let handle = |id: u32, events| KeyspaceHandle {
            id: KeyspaceId(id),
            name: format!("ks{id}"),
            kind: keel_core::engine::EngineKind::Orca,
            events,
            view: None,
            metrics: Arc::new(crate::metrics::KeyspaceMetrics::default()),
            node_id: keel_types::NodeId(1),
            unsafe_stale_invoke: false,
        };
        let (other, _) = mpsc::channel(8);
        let keyspaces = Keyspaces::new(
            vec![handle(0, events), handle(2, other)],
            Arc::new(crate::metrics::Metrics::default()),
            keel_types::NodeId(1),
        );
        let resolved = Arc::new(Resolved::default());
        let metrics = Arc::new(crate::metrics::Metrics::default());
        let login = Arc::new(Login::new(Arc::new(Users::default()), metrics));
        (
            Conn::new(42, Arc::new(keyspaces), Limits::default(), resolved.clone(), login),
            rx,
            resolved,
        )
    }

    fn words(ws: &[&str]) -> Frame {
        Frame::Array(ws.iter().map(|w| Frame::bulk(w.as_bytes())).collect())
    }

    fn ready_text(pending: Pending) -> String {
        match pending.body {
            Body::Ready(Frame::Error(text)) => String::from_utf8(text).unwrap(),
            Body::Ready(other) => format!("{other:?}"),
            Body::Later(_) | Body::Engine(..) | Body::Views(_) => "later".into(),
        }
    }

    #[test]
    fn invocations_parse_with_levels_sorted_and_options_anywhere() {
        let parse = |ws: &[&str]| {
            let words: Vec<Bytes> = ws.iter().map(|w| Bytes::from(w.to_string())).collect();
            parse_invoke(&words, &Limits::default())
        };
        let all = parse(&["KEEL.INVOKE", "get", "k"]).unwrap();
        assert_eq!(
            (all.levels, all.confirm, all.with_version),
            (ReadLevel::ALL.to_vec(), true, false)
        );
        let some = parse(&[
            "KEEL.INVOKE",
            "GET",
            "k",
            "LEVELS",
            "linearizable",
            "any",
            "any",
            "NOCONFIRM",
        ]);
        let some = some.unwrap();
        assert_eq!(some.levels, [ReadLevel::Any, ReadLevel::Linearizable]);
        assert!(!some.confirm);
        let late =
            parse(&["KEEL.INVOKE", "GET", "k", "WITHVERSION", "LEVELS", "monotonic"]).unwrap();
        assert_eq!((late.levels, late.with_version), (vec![ReadLevel::Monotonic], true));
        assert!(parse(&["KEEL.INVOKE", "GET"]).is_err());
        assert!(parse(&["KEEL.INVOKE", "DEL", "k"]).is_err());
        let set = parse(&["KEEL.INVOKE", "SET", "k", "v", "DURABILITY", "durable"]).unwrap();
        assert_eq!((set.levels.len(), set.durability), (0, Some(Durability::Durable)));
        assert!(parse(&["KEEL.INVOKE", "SET", "k", "v", "LEVELS", "any"]).is_err());
        let mget = parse(&["KEEL.INVOKE", "MGET", "2", "levels", "b", "LEVELS", "any"]).unwrap();
        let keys = vec![Bytes::from("levels"), Bytes::from("b")];
        assert_eq!((mget.op, mget.levels), (InvokeOp::MGet(keys), vec![ReadLevel::Any]));
        assert!(parse(&["KEEL.INVOKE", "MGET", "3", "a", "b"]).is_err(), "fewer keys than said");
        assert!(parse(&["KEEL.INVOKE", "MGET", "0"]).is_err());
        assert!(parse(&["KEEL.INVOKE", "DEQUEUE", "q", "LEVELS", "monotonic"]).is_err());
        assert!(parse(&["KEEL.INVOKE", "GET", "k", "DURABILITY", "durable"]).is_err());
        assert!(parse(&["KEEL.INVOKE", "GET", "k", "any"]).is_err(), "a level without LEVELS");
        assert!(parse(&["KEEL.INVOKE", "GET", "k", "LEVELS", "strong"]).is_err());
        let long = "k".repeat(Limits::default().key_bytes_max as usize + 1);
        assert!(parse(&["KEEL.INVOKE", "GET", &long]).is_err());
    }

    async fn submitted(rx: &mut mpsc::Receiver<Event>) -> Submit {
        match rx.recv().await.expect("a request was submitted") {
            Event::Client { submit, .. } => submit,
            other => panic!("not a client request: {other:?}"),
        }
    }

    #[tokio::test]
    async fn authentication_is_not_pretended() {
        let (mut c, _rx, _resolved) = conn();
        for ws in [
            &["AUTH", "secret"][..],
            &["AUTH", "user", "secret"],
            &["HELLO", "3", "AUTH", "u", "p"],
        ] {
            let text = ready_text(handle(&mut c, words(ws)).await);
            assert!(text.starts_with("ERR AUTH called without any password"), "{ws:?}: {text}");
        }
        assert_eq!(c.protocol, Protocol::Resp2, "a refused HELLO changes nothing");
        let hello = handle(&mut c, words(&["HELLO", "3"])).await;
        assert!(matches!(hello.body, Body::Ready(Frame::Map(_))), "HELLO without AUTH works");
    }

    #[tokio::test]
    async fn a_transaction_queues_at_most_what_one_entry_holds() {
        let (mut c, mut rx, _resolved) = conn();
        let simple = |text: &str| format!("{:?}", Frame::Simple(text.as_bytes().to_vec()));
        assert_eq!(ready_text(handle(&mut c, words(&["MULTI"])).await), simple("OK"));
        for _ in 0..keel_types::MULTI_OPS_MAX {
            let text = ready_text(handle(&mut c, words(&["INCR", "n"])).await);
            assert_eq!(text, simple("QUEUED"));
        }
        let text = ready_text(handle(&mut c, words(&["INCR", "n"])).await);
        assert_eq!(
            text,
            format!("ERR a transaction holds at most {} commands", keel_types::MULTI_OPS_MAX)
        );
        let text = ready_text(handle(&mut c, words(&["EXEC"])).await);
        assert!(text.starts_with("EXECABORT"), "{text}");
        assert!(rx.try_recv().is_err(), "nothing reached the engine");
    }

    #[tokio::test]
    async fn a_transaction_is_queued_and_sent_as_one_command_or_not_at_all() {
        let (mut c, mut rx, _resolved) = conn();
        let simple = |text: &str| format!("{:?}", Frame::Simple(text.as_bytes().to_vec()));
        let (ok, queued) = (simple("OK"), simple("QUEUED"));
        assert_eq!(ready_text(handle(&mut c, words(&["MULTI"])).await), ok);
        for ws in [&["SET", "k", "v"][..], &["INCR", "n"], &["GET", "k"], &["DEL", "a", "b"]] {
            assert_eq!(ready_text(handle(&mut c, words(ws)).await), queued, "{ws:?}");
        }
        assert!(rx.try_recv().is_err(), "nothing reaches the engine before EXEC");
        let text = ready_text(handle(&mut c, words(&["MULTI"])).await);
        assert_eq!(text, "ERR MULTI calls can not be nested");
        let _exec = handle(&mut c, words(&["exec"])).await;
        match rx.try_recv() {
            Ok(crate::driver::Event::Client { submit, .. }) => match submit.command {
                Command::Multi { ops, watch } => {
                    let names: Vec<&str> = ops.iter().map(Command::name).collect();
                    assert_eq!(names, ["put", "incr", "get", "get", "delete", "get", "delete"]);
                    assert!(watch.is_empty());
                }
                other => panic!("not a transaction: {other:?}"),
            },
            _ => panic!("EXEC sends one request"),
        }
        assert!(rx.try_recv().is_err(), "and only one");
        // A refused command discards the whole transaction at EXEC.
        assert_eq!(ready_text(handle(&mut c, words(&["MULTI"])).await), ok);
        assert_eq!(ready_text(handle(&mut c, words(&["SET", "k", "v"])).await), queued);
        let text = ready_text(handle(&mut c, words(&["SELECT", "1"])).await);
        assert!(text.starts_with("ERR SELECT is not allowed inside MULTI"), "{text}");
        let text = ready_text(handle(&mut c, words(&["NOSUCH"])).await);
        assert!(text.starts_with("ERR unknown command"), "{text}");
        let text = ready_text(handle(&mut c, words(&["EXEC"])).await);
        assert!(text.starts_with("EXECABORT"), "{text}");
        assert!(rx.try_recv().is_err(), "nothing of it reached the engine");
        assert_eq!(ready_text(handle(&mut c, words(&["EXEC"])).await), "ERR EXEC without MULTI");
        assert_eq!(ready_text(handle(&mut c, words(&["MULTI"])).await), ok);
        assert_eq!(ready_text(handle(&mut c, words(&["DISCARD"])).await), ok);
        let text = ready_text(handle(&mut c, words(&["DISCARD"])).await);
        assert_eq!(text, "ERR DISCARD without MULTI");
        let _later = handle(&mut c, words(&["SET", "k", "v"])).await;
        assert!(rx.try_recv().is_ok(), "after DISCARD, commands run again");
    }

    #[tokio::test]
    async fn keel_req_exec_sends_the_transaction_under_the_named_pair() {
        let (mut c, mut rx, _resolved) = conn();
        let text = ready_text(handle(&mut c, words(&["KEEL.REQ", "7", "3", "EXEC"])).await);
        assert_eq!(text, "ERR EXEC without MULTI");
        let ok = format!("{:?}", Frame::Simple(b"OK".to_vec()));
        assert_eq!(ready_text(handle(&mut c, words(&["MULTI"])).await), ok);
        let _ = handle(&mut c, words(&["INCR", "n"])).await;
        let text = ready_text(handle(&mut c, words(&["KEEL.REQ", "0", "3", "EXEC"])).await);
        assert!(text.starts_with("ERR KEEL.REQ client and seq"), "{text}");
        let text = ready_text(handle(&mut c, words(&["EXEC", "now"])).await);
        assert!(text.starts_with("ERR wrong number of arguments"), "{text}");
        assert!(rx.try_recv().is_err(), "still queuing");
        let _exec = handle(&mut c, words(&["keel.req", "7", "3", "exec"])).await;
        let s = submitted(&mut rx).await;
        assert_eq!((s.client, s.request), (ClientId(7), RequestId(3)));
        assert!(matches!(s.command, Command::Multi { .. }));
        let text = ready_text(handle(&mut c, words(&["EXEC"])).await);
        assert_eq!(text, "ERR EXEC without MULTI", "the transaction was sent");
    }

    #[test]
    fn a_log_page_holds_at_most_its_cap_in_the_bytes_it_sends() {
        use keel_types::{ClientId, Durability, EntryPayload, Epoch, LogIndex, RequestId};
        let write = |index: u64| keel_types::Entry {
            epoch: Epoch(1),
            index: LogIndex(index),
            payload: EntryPayload::Write {
                client: ClientId(1),
                request: RequestId(index),
                durability: Durability::Memory,
                command: Command::Put { key: "k".into(), value: vec![200u8; 300 << 10].into() },
            },
        };
        // Six values of 300 KiB: 1.8 MiB of values, within the driver's count, but about
        // 1.2 MB of JSON each: three fit in 4 MiB.
        let entries = (1..=6).map(write).collect();
        let page = crate::driver::LogPage { entries, snapshot_index: LogIndex(0) };
        let Frame::Array(items) = log_page_frame(&page) else { panic!("an array") };
        assert_eq!(items.len(), 1 + 3, "the snapshot index and three entries");
        let sent: usize =
            items.iter().map(|f| keel_wire::resp::encode::to_bytes(f, Protocol::Resp2).len()).sum();
        assert!(sent <= crate::driver::LOG_PAGE_BYTES_MAX + 64, "{sent}");
        let small = (1..=3).map(|i| keel_types::Entry {
            epoch: Epoch(1),
            index: LogIndex(i),
            payload: EntryPayload::Noop,
        });
        let page = crate::driver::LogPage { entries: small.collect(), snapshot_index: LogIndex(0) };
        let Frame::Array(items) = log_page_frame(&page) else { panic!("an array") };
        assert_eq!(items.len(), 4, "small entries all go");
    }

    #[test]
    fn info_answers_the_sections_asked_for() {
        let sections = [("Server", "a:1\r\n".to_string()), ("Replication", "b:2\r\n".to_string())];
        let ask = |names: &[&str]| {
            let asked: Vec<String> = names.iter().map(|n| n.to_string()).collect();
            info_text(&asked, &sections)
        };
        let every = "# Server\r\na:1\r\n\r\n# Replication\r\nb:2\r\n";
        assert_eq!(ask(&[]), every);
        assert_eq!(ask(&["all"]), every);
        assert_eq!(ask(&["replication"]), "# Replication\r\nb:2\r\n");
        assert_eq!(ask(&["server", "replication"]), every);
        assert_eq!(ask(&["keyspace"]), "", "a section Keel does not have: nothing");
    }

    #[tokio::test]
    async fn client_subcommands_keel_does_not_have_are_refused_not_pretended() {
        let (mut c, _rx, _resolved) = conn();
        for sub in ["LIST", "KILL", "NO-EVICT"] {
            let text = ready_text(handle(&mut c, words(&["CLIENT", sub])).await);
            let want = format!("ERR unknown subcommand '{}'. Try CLIENT HELP.", sub.to_lowercase());
            assert_eq!(text, want);
        }
        let ok = ready_text(handle(&mut c, words(&["CLIENT", "SETINFO", "LIB-NAME", "x"])).await);
        assert_eq!(ok, format!("{:?}", Frame::ok()), "what client libraries send at start");
    }

    #[tokio::test]
    async fn keel_req_carries_the_given_pair_and_plain_requests_number_themselves() {
        let (mut c, mut rx, _resolved) = conn();
        let pending = handle(&mut c, words(&["KEEL.REQ", "7", "3", "SET", "k", "v"])).await;
        let writer = tokio::spawn(pending.resolve());
        let s = submitted(&mut rx).await;
        assert_eq!((s.client, s.request), (ClientId(7), RequestId(3)));
        writer.abort();
        _resolved.one_more(); // the SET was answered: the GETs need not wait
        let first = tokio::spawn(handle(&mut c, words(&["GET", "k"])).await.resolve());
        let second = tokio::spawn(handle(&mut c, words(&["GET", "k"])).await.resolve());
        let a = submitted(&mut rx).await;
        let b = submitted(&mut rx).await;
        assert_eq!(a.client, ClientId(42));
        assert!(b.request > a.request, "sequence numbers increase");
        first.abort();
        second.abort();
    }

    #[tokio::test]
    async fn a_pipeline_reaches_the_engine_whole_and_a_read_after_writes_waits_for_them() {
        let (mut c, mut rx, resolved) = conn();
        for key in ["a", "b"] {
            let pending = handle(&mut c, words(&["SET", key, "v"])).await;
            c.queued_one();
            drop(pending);
        }
        let (a, b) = (submitted(&mut rx).await, submitted(&mut rx).await);
        assert!(a.command.is_write() && b.command.is_write(), "both writes sent unanswered");
        let mut get = Box::pin(handle(&mut c, words(&["GET", "a"])));
        let early = futures_poll(&mut get).await;
        assert!(early.is_none(), "a read after unanswered writes waits");
        assert!(rx.try_recv().is_err(), "and is not sent");
        resolved.one_more();
        assert!(futures_poll(&mut get).await.is_none(), "the second write is not answered yet");
        resolved.one_more();
        let _pending = get.await;
        assert!(
            !submitted(&mut rx).await.command.is_write(),
            "the read is sent once both are answered"
        );
    }

    /// Polls `future` once (after letting other tasks run): `Some` if it finished.
    async fn futures_poll<F: Future + Unpin>(future: &mut F) -> Option<F::Output> {
        tokio::task::yield_now().await;
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        match Pin::new(future).poll(&mut cx) {
            std::task::Poll::Ready(out) => Some(out),
            std::task::Poll::Pending => None,
        }
    }

    #[tokio::test]
    async fn keel_req_refuses_bad_pairs_and_multi_key_commands() {
        let (mut c, _rx, _resolved) = conn();
        let text =
            ready_text(handle(&mut c, words(&["KEEL.REQ", "0", "1", "SET", "k", "v"])).await);
        assert!(text.starts_with("ERR KEEL.REQ client and seq"), "{text}");
        let text =
            ready_text(handle(&mut c, words(&["KEEL.REQ", "1", "1", "DEL", "a", "b"])).await);
        assert!(text.contains("one single-key command"), "{text}");
        let text = ready_text(handle(&mut c, words(&["KEEL.REQ", "1"])).await);
        assert!(text.contains("wrong number of arguments"), "{text}");
    }

    #[tokio::test]
    async fn select_moves_the_connection_to_a_hosted_keyspace_only() {
        let (mut c, _rx, _resolved) = conn();
        assert_eq!(c.keyspace(), KeyspaceId(0));
        let text = ready_text(handle(&mut c, words(&["SELECT", "1"])).await);
        assert_eq!(text, "ERR DB index is out of range");
        assert_eq!(c.keyspace(), KeyspaceId(0));
        assert_eq!(ready_text(handle(&mut c, words(&["SELECT", "2"])).await), "Simple([79, 75])");
        assert_eq!(c.keyspace(), KeyspaceId(2));
        let listed = ready_text(handle(&mut c, words(&["KEEL.KEYSPACES"])).await);
        assert!(listed.contains("Integer(2)"), "{listed}");
    }

    #[tokio::test]
    async fn hello_switches_the_protocol_for_its_own_reply() {
        let (mut c, _rx, _resolved) = conn();
        let pending = handle(&mut c, words(&["HELLO", "3"])).await;
        assert_eq!(pending.protocol, Protocol::Resp3);
        assert_eq!(c.protocol, Protocol::Resp3);
        let quit = handle(&mut c, words(&["QUIT"])).await;
        assert!(quit.close, "QUIT closes after its reply");
    }
}

// ----- transactions: MULTI, EXEC, DISCARD, WATCH, UNWATCH -----------------------------

/// The commands queued since `MULTI`, and whether one was refused (then `EXEC` aborts, as
/// Redis's `EXECABORT`).
#[derive(Debug, Default)]
struct Transaction {
    commands: Vec<ClientCommand>,
    refused: bool,
}

/// The keys `WATCH` read and the versions it found; `failed` when a read failed (then
/// `EXEC` aborts, since nothing says the keys are unchanged).
#[derive(Debug, Default)]
pub struct Watched {
    keyspace: Option<KeyspaceId>,
    keys: Vec<(Key, Option<Version>)>,
    failed: bool,
}

/// `MULTI` ... `EXEC` as one log entry: the queued commands become one
/// [`Command::Multi`] whose operations apply in order, all or none, and not at all if a
/// key `WATCH` read has another version by then. `Err(words)`: the request is not a
/// transaction's concern.
async fn transaction(conn: &mut Conn, words: Vec<Bytes>) -> Result<Pending, Vec<Bytes>> {
    let protocol = conn.protocol;
    let first = words.first().map_or(&[][..], |w| &w[..]);
    let is = |word: &str| first.eq_ignore_ascii_case(word.as_bytes());
    let ready = |frame: Frame| Ok(Pending::ready(frame, protocol));
    if conn.transaction.is_some() {
        if is("exec") {
            if words.len() != 1 {
                return ready(Frame::error("ERR wrong number of arguments for 'exec' command"));
            }
            let queued = conn.transaction.take().expect("checked");
            return Ok(exec(conn, queued, None).await);
        }
        // `KEEL.REQ <client> <seq> EXEC`: the transaction under a pair the client chose,
        // so that a retry (on a new connection, after a timeout) is applied once.
        if is("keel.req") && words.len() == 4 && words[3].eq_ignore_ascii_case(b"exec") {
            let pair = match req_pair(conn, &words) {
                Ok(pair) => pair,
                Err(refusal) => return ready(refusal),
            };
            let queued = conn.transaction.take().expect("checked");
            return Ok(exec(conn, queued, Some(pair)).await);
        }
        if is("discard") {
            conn.transaction = None;
            unwatch(conn);
            return ready(Frame::ok());
        }
        let tx = conn.transaction.as_mut().expect("checked");
        if is("multi") {
            return ready(Frame::error("ERR MULTI calls can not be nested"));
        }
        if is("watch") {
            return ready(Frame::error("ERR WATCH inside MULTI is not allowed"));
        }
        let name = String::from_utf8_lossy(first).to_ascii_uppercase();
        let command = match keel_wire::command::parse(words, &conn.limits) {
            Ok(command) => command,
            Err(e) => {
                tx.refused = true;
                return ready(e.reply_frame());
            }
        };
        let allowed = matches!(
            command,
            ClientCommand::Get { .. }
                | ClientCommand::MGet { .. }
                | ClientCommand::Exists { .. }
                | ClientCommand::Set { .. }
                | ClientCommand::Del { .. }
                | ClientCommand::Incr { fetch: false, .. }
                | ClientCommand::Cas { .. }
        ) && command.mode() == OpMode::Plain;
        if !allowed {
            tx.refused = true;
            let text = format!(
                "ERR {name} is not allowed inside MULTI (Keel's transactions read and write keys)"
            );
            return ready(Frame::error(&text));
        }
        if let Err(refusal) = permitted(conn, category(&command)) {
            conn.transaction.as_mut().expect("checked").refused = true;
            return ready(refusal);
        }
        let tx = conn.transaction.as_mut().expect("checked");
        if tx.commands.len() >= keel_types::MULTI_OPS_MAX {
            // One log entry holds at most this many operations; a longer queue is refused
            // here, not grown without bound until `EXEC`.
            tx.refused = true;
            let max = keel_types::MULTI_OPS_MAX;
            return ready(Frame::error(&format!("ERR a transaction holds at most {max} commands")));
        }
        tx.commands.push(command);
        return ready(Frame::Simple(b"QUEUED".to_vec()));
    }
    if is("multi") {
        conn.transaction = Some(Transaction::default());
        return ready(Frame::ok());
    }
    if is("exec") {
        return ready(Frame::error("ERR EXEC without MULTI"));
    }
    if is("discard") {
        return ready(Frame::error("ERR DISCARD without MULTI"));
    }
    if is("unwatch") {
        unwatch(conn);
        return ready(Frame::ok());
    }
    if is("watch") {
        return Ok(watch(conn, words).await);
    }
    Err(words)
}

fn unwatch(conn: &mut Conn) {
    *conn.watched.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Watched::default();
}

/// `WATCH key [key ...]`: reads each key's version at `linearizable` (the leader's latest),
/// for `EXEC` to compare. The versions are recorded when the reads are answered, which
/// `EXEC` (a write) waits for.
async fn watch(conn: &mut Conn, words: Vec<Bytes>) -> Pending {
    let protocol = conn.protocol;
    if words.len() < 2 {
        return Pending::ready(
            Frame::error("ERR wrong number of arguments for 'watch' command"),
            protocol,
        );
    }
    if let Err(refusal) = permitted(conn, Some(Category::Read)) {
        return Pending::ready(refusal, protocol);
    }
    let ks = conn.node.id;
    let level = Some(ReadLevel::Linearizable);
    conn.order(Kind::Read(ks, level)).await;
    conn.last_looped = Some(conn.queued);
    let after = conn.resolved.floor(ks);
    let keys: Vec<Bytes> = words.into_iter().skip(1).collect();
    let sent: Vec<_> = keys
        .iter()
        .map(|key| {
            let (client, request) = conn.next_pair();
            (key.clone(), conn.node.send(get_submit(client, request, key.clone(), level, after)))
        })
        .collect();
    let watched = conn.watched.clone();
    Pending::later(
        Box::pin(async move {
            let mut found = Vec::with_capacity(sent.len());
            let mut failed = None;
            for (key, one) in sent {
                match one.answer().await.and_then(|r| r.result) {
                    Ok(CommandResult::Value { version, .. }) => found.push((key, version)),
                    Ok(_) => {
                        failed = Some(KeelError::Unavailable("a watch read another kind".into()))
                    }
                    Err(e) => failed = Some(e),
                }
            }
            let mut watched = watched.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if watched.keyspace.is_some_and(|other| other != ks) {
                watched.failed = true; // keys of two keyspaces: no transaction can hold both
            }
            watched.keyspace = Some(ks);
            watched.keys.extend(found);
            match failed {
                Some(e) => {
                    watched.failed = true;
                    error_frame(&e)
                }
                None => Frame::ok(),
            }
        }),
        protocol,
    )
}

/// How one queued command's reply is made from its operations' results.
#[derive(Clone, Copy, Debug)]
enum Shape {
    /// `GET`: the value (with its version if asked).
    Value { with_version: bool },
    /// `SET`: `OK` (with the version if asked).
    Written { with_version: bool },
    /// `INCR`: the integer.
    Counter,
    /// `KEEL.CAS`: `[swapped, current, version]`.
    Cas,
    /// `DEL` of `n` keys (a read and a delete each): how many existed.
    Del(usize),
    /// `EXISTS` of `n` keys: how many exist.
    Exists(usize),
    /// `MGET` of `n` keys: their values.
    MGet(usize),
}

impl Shape {
    /// How many operations the command took.
    fn ops(self) -> usize {
        match self {
            Shape::Del(n) => 2 * n,
            Shape::Exists(n) | Shape::MGet(n) => n,
            _ => 1,
        }
    }

    /// The command's reply from its operations' results.
    fn frame(self, results: &[CommandResult]) -> Frame {
        let value = |r: &CommandResult| match r {
            CommandResult::Value { value, .. } => value.clone(),
            _ => None,
        };
        match self {
            Shape::Value { with_version } | Shape::Written { with_version } => {
                keel_wire::reply::result_frame(&results[0], with_version)
            }
            Shape::Counter | Shape::Cas => keel_wire::reply::result_frame(&results[0], false),
            Shape::Del(_) => Frame::Integer(
                results.iter().step_by(2).filter(|r| value(r).is_some()).count() as i64,
            ),
            Shape::Exists(_) => {
                Frame::Integer(results.iter().filter(|r| value(r).is_some()).count() as i64)
            }
            Shape::MGet(_) => {
                Frame::Array(results.iter().map(|r| value_frame(value(r).as_ref())).collect())
            }
        }
    }
}

/// `EXEC`: the queued commands as one transaction, sent as one write with the strongest
/// durability any of them asked for, under the connection's next pair or (`KEEL.REQ
/// <client> <seq> EXEC`) the one the client named: its retry with the same pair and the
/// same commands, wherever it is sent, is answered with the first attempt's result and
/// not applied again (the engine's deduplication compares a transaction's operations,
/// not what its `WATCH` read).
/// What `EXEC` answers without the engine, if anything: a transaction refused while
/// queuing, a queued command the connection's user may no longer run (`AUTH` inside
/// `MULTI` switches users at once), a watch that failed or spans keyspaces (as if a
/// watched key changed), or nothing queued.
fn exec_answered_here(conn: &Conn, queued: &Transaction, watched: &Watched) -> Option<Frame> {
    if queued.refused {
        let text = "EXECABORT Transaction discarded because of previous errors.";
        return Some(Frame::error(text));
    }
    for command in &queued.commands {
        if let Err(refusal) = permitted(conn, category(command)) {
            return Some(refusal);
        }
    }
    if watched.failed || watched.keyspace.is_some_and(|other| other != conn.node.id) {
        return Some(Frame::NullArray);
    }
    queued.commands.is_empty().then(|| Frame::Array(Vec::new()))
}

async fn exec(
    conn: &mut Conn,
    queued: Transaction,
    pair: Option<(ClientId, RequestId)>,
) -> Pending {
    let protocol = conn.protocol;
    let ks = conn.node.id;
    // After the watch reads: `EXEC` is a write, so `order` waits for them.
    conn.order(Kind::Write(ks)).await;
    conn.last_looped = Some(conn.queued);
    let watched = std::mem::take(
        &mut *conn.watched.lock().unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    if let Some(answer) = exec_answered_here(conn, &queued, &watched) {
        return Pending::ready(answer, protocol);
    }
    let mut ops = Vec::new();
    let mut shapes = Vec::with_capacity(queued.commands.len());
    let mut durability: Option<Durability> = None;
    let mut strongest = |d: Option<Durability>| {
        durability = match (durability, d) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    };
    for command in queued.commands {
        let shape = match command {
            ClientCommand::Get { key, with_version, .. } => {
                ops.push(Command::Get { key });
                Shape::Value { with_version }
            }
            ClientCommand::Set { key, value, durability, with_version, .. } => {
                strongest(durability);
                ops.push(Command::Put { key, value });
                Shape::Written { with_version }
            }
            ClientCommand::Incr { key, delta, .. } => {
                ops.push(Command::Incr { key, delta });
                Shape::Counter
            }
            ClientCommand::Cas { key, expected, new, durability, .. } => {
                strongest(durability);
                ops.push(Command::Cas { key, expected, new });
                Shape::Cas
            }
            ClientCommand::Del { keys } => {
                let n = keys.len();
                for key in keys {
                    ops.push(Command::Get { key: key.clone() });
                    ops.push(Command::Delete { key });
                }
                Shape::Del(n)
            }
            ClientCommand::Exists { keys } => {
                let n = keys.len();
                ops.extend(keys.into_iter().map(|key| Command::Get { key }));
                Shape::Exists(n)
            }
            ClientCommand::MGet { keys, .. } => {
                let n = keys.len();
                ops.extend(keys.into_iter().map(|key| Command::Get { key }));
                Shape::MGet(n)
            }
            other => unreachable!("refused when queued: {other:?}"),
        };
        shapes.push(shape);
    }
    let command = Command::Multi { ops, watch: watched.keys };
    if let Err(e) = command.validate(&conn.limits) {
        return Pending::ready(error_frame(&e), protocol);
    }
    let named = pair.is_some();
    let (client, request) = pair.unwrap_or_else(|| conn.next_pair());
    let after = conn.resolved.floor(ks);
    let mode = OpMode::Plain;
    let submit = Submit { client, request, command, durability, level: None, after, mode, named };
    let sent = conn.node.send(submit);
    let floor = Floor { resolved: conn.resolved.clone(), keyspace: ks };
    Pending::later(
        Box::pin(async move {
            let answer = sent.answer().await;
            floor.note(&answer);
            match answer.and_then(|r| r.result) {
                Ok(CommandResult::Multi { results: Some(results) }) => {
                    let mut frames = Vec::with_capacity(shapes.len());
                    let mut at = 0;
                    for shape in shapes {
                        let Some(part) = results.get(at..at + shape.ops()) else {
                            return mismatched("transaction");
                        };
                        frames.push(shape.frame(part));
                        at += shape.ops();
                    }
                    Frame::Array(frames)
                }
                Ok(CommandResult::Multi { results: None }) => Frame::NullArray,
                Ok(_) => mismatched("transaction"),
                Err(e) => error_frame(&e),
            }
        }),
        protocol,
    )
}
