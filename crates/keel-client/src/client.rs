//! [`Client`]: connection pools to every node, and [`Session`]: one logical client that
//! issues one operation at a time with its own deduplication id.
//!
//! Retries: an operation is retried (after a backoff that doubles, at most
//! `attempts_max` times) on a retryable error (`BUSY`, `NOTLEADER`, `NOTACTIVE`,
//! `TIMEOUT`, `UNAVAILABLE`) and on a lost or timed-out connection, moving to the next
//! node on connection failures and redirections. Every attempt of a write carries the
//! same `KEEL.REQ <client> <seq>`, so the engine applies it at most once. A call that
//! ends refused after an attempt that may have been applied ends with its outcome unknown
//! (`ClientError::after_attempts`): a refusal speaks for its own attempt only. A session
//! numbers its writes in order and never has two in flight: the engine refuses a request
//! older than the client's last applied one.
//!
//! Before its first write a [`Session`] opens a server session (`KEEL.SESSION`) and
//! writes under its id. If the cluster has forgotten it (`SESSIONEXPIRED`: idle while
//! `dedup_clients_max` other clients wrote), a write refused at its first attempt is sent
//! again under a new session; one refused after an earlier attempt fails with
//! [`keel_types::KeelError::SessionExpired`], its outcome unknown, and is never applied
//! twice.

use crate::conn::{ConnError, Connection};
use crate::error::ClientError;
use keel_types::{ClientId, Durability, KeelError, ReadLevel, Version};
use keel_wire::resp::Frame;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Most connections kept per node.
pub const CONNECTIONS_PER_NODE_MAX: usize = 64;

/// How many times an open refused with `SESSIONEXPIRED` is sent again before the error is
/// returned (waiting 10, 20, 40 ms between).
const OPEN_REFUSALS_MAX: u32 = 3;

/// Client settings.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Every node's client address (any node serves any command).
    pub nodes: Vec<SocketAddr>,
    /// Most connections per node. Sessions share them, pipelined; a call takes an idle
    /// one, opens another while fewer are open, and else the one with the fewest calls
    /// in flight (replies come back in order, so a call behind a slow one waits for it).
    pub connections_per_node: usize,
    /// How long one attempt may take.
    pub attempt_timeout: Duration,
    /// Most attempts per operation.
    pub attempts_max: u32,
    /// First retry delay (doubles per attempt, capped at 1 s).
    pub backoff: Duration,
    /// Read level when an operation names none (`None`: the server's default).
    pub read_level: Option<ReadLevel>,
    /// Durability when an operation names none (`None`: the server's default).
    pub durability: Option<Durability>,
    /// The keyspace every operation goes to (each connection sends `SELECT` first).
    pub keyspace: u32,
    /// Whether each connection selects `keyspace` (default); `false` leaves it in the
    /// node's first keyspace, for questions about the node itself (`KEEL.KEYSPACES` at a
    /// node of a placed cluster that does not host keyspace 0).
    pub select: bool,
    /// `(user, password)`: each connection sends `AUTH` first (nodes with `[[users]]`).
    pub credentials: Option<(String, String)>,
    /// TLS to every node (`nodes` are then their `client_tls_addr`s).
    pub tls: Option<crate::ClientTls>,
}

impl ClientConfig {
    /// Defaults for `nodes`: up to 8 connections per node, 2 s per attempt, 8 attempts.
    pub fn new(nodes: Vec<SocketAddr>) -> ClientConfig {
        ClientConfig {
            nodes,
            connections_per_node: 8,
            attempt_timeout: Duration::from_secs(2),
            attempts_max: 8,
            backoff: Duration::from_millis(20),
            read_level: None,
            durability: None,
            keyspace: 0,
            select: true,
            credentials: None,
            tls: None,
        }
    }
}

/// What a read returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadResult {
    /// The value (`None`: absent).
    pub value: Option<Vec<u8>>,
    /// The version of the write that produced it (`None`: never written).
    pub version: Option<Version>,
    /// The node that answered (an index into [`ClientConfig::nodes`]).
    pub node: usize,
}

/// What a write returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteResult {
    /// The version created.
    pub version: Option<Version>,
    /// The node that answered.
    pub node: usize,
}

/// What a compare-and-set returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CasResult {
    /// Whether it swapped.
    pub swapped: bool,
    /// The value found.
    pub current: Option<Vec<u8>>,
    /// The version created (swapped) or found.
    pub version: Option<Version>,
    /// The node that answered.
    pub node: usize,
}

/// Connection pools to a cluster. Cheap to share (`Arc`).
#[derive(Debug)]
pub struct Client {
    config: ClientConfig,
    pools: Vec<Mutex<Vec<Connection>>>,
    /// RESP3 connections (`HELLO 3`), for `KEEL.INVOKE`'s push frames.
    resp3_pools: Vec<Mutex<Vec<Connection>>>,
    round_robin: AtomicUsize,
    /// The node that answered last without redirecting: tried first.
    preferred: AtomicUsize,
    ids: AtomicU64,
}

impl Client {
    /// A client for `config.nodes` (connects lazily).
    pub fn new(config: ClientConfig) -> Arc<Client> {
        assert!(!config.nodes.is_empty(), "a client needs at least one node");
        assert!(config.attempts_max >= 1 && config.connections_per_node >= 1);
        let pools = config.nodes.iter().map(|_| Mutex::new(Vec::new())).collect();
        let resp3_pools = config.nodes.iter().map(|_| Mutex::new(Vec::new())).collect();
        let base = crate::fresh_id() & ((1 << 62) - 1) & !0xFFFF;
        Arc::new(Client {
            config,
            pools,
            resp3_pools,
            round_robin: AtomicUsize::new(0),
            preferred: AtomicUsize::new(0),
            ids: AtomicU64::new(base.max(1 << 16)),
        })
    }

    /// The settings.
    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// A new session with a fresh client id.
    pub fn session(self: &Arc<Client>) -> Session {
        Session { client: self.clone(), id: self.fresh_session_id(), seq: 0, server_session: None }
    }

    /// A client id no other session of this client has.
    pub(crate) fn fresh_session_id(&self) -> u64 {
        self.ids.fetch_add(1, Ordering::Relaxed)
    }

    /// Reads `key` as a [`Correctable`](crate::Correctable): one view per level of `levels`, weakest first
    /// (duplicates dropped; an empty list means every level), the strongest closing it.
    /// Returns at once; the reads run in a task of their own, one after the other, each a
    /// plain `GET ... LEVEL l` (a client-side binding: each view is its own request, so a
    /// stronger view is asked for only after the weaker one came back).
    pub fn invoke_get(
        self: &Arc<Client>,
        key: &[u8],
        levels: &[ReadLevel],
    ) -> crate::Correctable<Option<Vec<u8>>> {
        let (correctable, resolver) = crate::correctable();
        let levels = invoked_levels(levels);
        let (client, key) = (self.clone(), key.to_vec());
        tokio::spawn(async move {
            let last = levels.len() - 1;
            for (i, level) in levels.into_iter().enumerate() {
                let words: [&[u8]; 5] =
                    [b"GET", &key, b"LEVEL", level.as_str().as_bytes(), b"WITHVERSION"];
                let read = client.call(&words).await.and_then(|(frame, _)| {
                    let (value, version) = pair(frame)?;
                    Ok(crate::View {
                        level,
                        value: value_of(&value)?,
                        version: version_of(&version),
                    })
                });
                match read {
                    Ok(view) if i == last => {
                        resolver.close(view);
                        return;
                    }
                    Ok(view) => {
                        resolver.update(view);
                    }
                    Err(error) => {
                        resolver.fail(error);
                        return;
                    }
                }
            }
        });
        correctable
    }

    async fn connection(&self, node: usize) -> Result<Connection, ConnError> {
        self.connection_in(node, false).await
    }

    /// A connection to `node` from the RESP3 pool (`resp3`) or the plain one.
    async fn connection_in(&self, node: usize, resp3: bool) -> Result<Connection, ConnError> {
        let pools = if resp3 { &self.resp3_pools } else { &self.pools };
        let pick = self.round_robin.fetch_add(1, Ordering::Relaxed);
        {
            let mut pool = pools[node].lock().expect("pool lock");
            pool.retain(|c| !c.is_closed());
            let most = self.config.connections_per_node.min(CONNECTIONS_PER_NODE_MAX);
            // Idle first (from a rotating start, so idle connections share the load).
            let n = pool.len();
            let idle = (0..n).map(|i| &pool[(pick + i) % n]).find(|c| c.in_flight() == 0);
            if let Some(conn) = idle {
                return Ok(conn.clone());
            }
            if n >= most {
                let least = pool.iter().min_by_key(|c| c.in_flight()).expect("at least one");
                return Ok(least.clone());
            }
        }
        let conn = self.dial(node, resp3).await?;
        pools[node].lock().expect("pool lock").push(conn.clone());
        Ok(conn)
    }

    /// A connection of its own to `node`, in no pool, authenticated and in the
    /// configured keyspace: for a session whose state the server keeps per connection (a
    /// geo session's past vector and open transaction).
    pub async fn dedicated_connection(&self, node: usize) -> Result<Connection, ConnError> {
        self.dial(node, false).await
    }

    /// Opens a connection to `node` (RESP3 when `resp3`), authenticates it and selects
    /// the configured keyspace.
    async fn dial(&self, node: usize, resp3: bool) -> Result<Connection, ConnError> {
        let addr = self.config.nodes[node];
        let (timeout, tls) = (self.config.attempt_timeout, self.config.tls.as_ref());
        let conn = if resp3 {
            Connection::connect_resp3(addr, timeout, tls).await?
        } else {
            Connection::connect(addr, timeout, tls).await?
        };
        if let Some((user, password)) = &self.config.credentials {
            let words: [&[u8]; 3] = [b"AUTH", user.as_bytes(), password.as_bytes()];
            if let Frame::Error(line) = conn.call(&words, self.config.attempt_timeout).await? {
                let reason = String::from_utf8_lossy(&line).into_owned();
                return Err(ConnError::Connect { addr, reason });
            }
        }
        if self.config.select {
            // Pipelined in order: every later call on this connection goes to the keyspace.
            // Keyspace 0 too: a node of a placed cluster that does not host it refuses,
            // naming where it lives, where a connection left in the node's first keyspace
            // would act on another.
            let index = self.config.keyspace.to_string();
            let words: [&[u8]; 2] = [b"SELECT", index.as_bytes()];
            if let Frame::Error(line) = conn.call(&words, self.config.attempt_timeout).await? {
                let reason = String::from_utf8_lossy(&line).into_owned();
                return Err(ConnError::Connect { addr, reason });
            }
        }
        Ok(conn)
    }

    /// [`Client::invoke`] at `any` alone: a Correctable that closes with one weak view.
    pub fn invoke_weak(self: &Arc<Client>, key: &[u8]) -> crate::Correctable<Option<Vec<u8>>> {
        self.invoke(key, &[ReadLevel::Any])
    }

    /// [`Client::invoke`] at `linearizable` alone: one strong view, no preliminary one.
    pub fn invoke_strong(self: &Arc<Client>, key: &[u8]) -> crate::Correctable<Option<Vec<u8>>> {
        self.invoke(key, &[ReadLevel::Linearizable])
    }

    /// Reads `key` as a [`crate::Correctable`] with one request, `KEEL.INVOKE` over RESP3:
    /// the node pushes each preliminary view as soon as it has read it and answers with
    /// the final one, confirmations (`+SAME`) standing for a value equal to the previous
    /// view's. Levels as [`Client::invoke_get`]. Returns at once; one attempt, at the node
    /// that last answered (an error fails the Correctable, after any preliminary views).
    pub fn invoke(
        self: &Arc<Client>,
        key: &[u8],
        levels: &[ReadLevel],
    ) -> crate::Correctable<Option<Vec<u8>>> {
        let levels = invoked_levels(levels);
        let mut words: Vec<Vec<u8>> = vec![b"KEEL.INVOKE".to_vec(), b"GET".to_vec(), key.to_vec()];
        words.push(b"LEVELS".to_vec());
        words.extend(levels.iter().map(|level| level.as_str().as_bytes().to_vec()));
        let last = *levels.last().expect("at least one level");
        self.invoke_words(words, levels.len(), last, value_of, false)
    }

    /// Reads `keys` as one [`crate::Correctable`] (`KEEL.INVOKE MGET`): a view per level
    /// (weakest first; none given: every level), each the keys' values in order read at
    /// that level. As [`Client::invoke`] otherwise.
    pub fn invoke_mget(
        self: &Arc<Client>,
        keys: &[&[u8]],
        levels: &[ReadLevel],
    ) -> crate::Correctable<Vec<Option<Vec<u8>>>> {
        let levels = invoked_levels(levels);
        let mut words: Vec<Vec<u8>> =
            vec![b"KEEL.INVOKE".to_vec(), b"MGET".to_vec(), keys.len().to_string().into_bytes()];
        words.extend(keys.iter().map(|key| key.to_vec()));
        words.push(b"LEVELS".to_vec());
        words.extend(levels.iter().map(|level| level.as_str().as_bytes().to_vec()));
        let last = *levels.last().expect("at least one level");
        self.invoke_words(words, levels.len(), last, values_of, false)
    }

    /// Dequeues from `queue` as a [`crate::Correctable`] (`KEEL.INVOKE DEQUEUE`): a
    /// preliminary view per level of `levels` (none given: `any`), each the dequeue
    /// simulated on the queue as the contacted node reads it at that level, then the
    /// final view, the dequeue ordered through the log (labelled `linearizable`). `None`:
    /// the queue was (or looked) empty. One attempt, as [`Client::invoke`]: an error
    /// fails the Correctable, and the dequeue may or may not have taken effect.
    pub fn invoke_dequeue(
        self: &Arc<Client>,
        queue: &[u8],
        levels: &[ReadLevel],
        durability: Option<Durability>,
    ) -> crate::Correctable<Option<QueueItem>> {
        let words = queue_invocation(b"DEQUEUE", queue, None, levels, durability);
        let levels = queue_views(levels);
        self.invoke_words(words, levels, ReadLevel::Linearizable, queue_item_of, false)
    }

    /// Enqueues `value` as a [`crate::Correctable`] (`KEEL.INVOKE ENQUEUE`): preliminary
    /// views predict `(seq, length)` from the contacted node's queue, the final one is
    /// the enqueue's. As [`Client::invoke_dequeue`] otherwise.
    pub fn invoke_enqueue(
        self: &Arc<Client>,
        queue: &[u8],
        value: &[u8],
        levels: &[ReadLevel],
        durability: Option<Durability>,
    ) -> crate::Correctable<(u64, u64)> {
        let words = queue_invocation(b"ENQUEUE", queue, Some(value), levels, durability);
        let levels = queue_views(levels);
        self.invoke_words(words, levels, ReadLevel::Linearizable, enqueued_of, false)
    }

    /// Runs `words` (a `KEEL.INVOKE` without `WITHVERSION`) on the RESP3 pool and turns
    /// its pushes and reply into views with `parse`; `pushes` bounds the preliminary
    /// views taken, `last` labels the final view. With `retry` (an invocation named by a
    /// deduplication pair, so never applied twice), a failed attempt that may be retried
    /// is sent again, to another node when the error says so.
    fn invoke_words<T: Clone + PartialEq + Send + 'static>(
        self: &Arc<Client>,
        mut words: Vec<Vec<u8>>,
        pushes: usize,
        last: ReadLevel,
        parse: fn(&Frame) -> Result<T, ClientError>,
        retry: bool,
    ) -> crate::Correctable<T> {
        let (correctable, resolver) = crate::correctable();
        words.push(b"WITHVERSION".to_vec());
        let client = self.clone();
        tokio::spawn(async move {
            let mut node = client.preferred.load(Ordering::Relaxed) % client.config.nodes.len();
            let attempts = if retry { client.config.attempts_max.max(1) } else { 1 };
            let mut backoff = client.config.backoff;
            let mut failed = None;
            let mut maybe_applied = false;
            for attempt in 0..attempts {
                if attempt > 0 {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
                let outcome =
                    client.invoke_attempt(node, &words, pushes, last, parse, &resolver).await;
                match outcome {
                    Ok(view) => {
                        client.preferred.store(node, Ordering::Relaxed);
                        resolver.close(view);
                        return;
                    }
                    Err(e) if attempts > 1 && e.is_retryable() => {
                        if e.moves_on() {
                            node = (node + 1) % client.config.nodes.len();
                        }
                        maybe_applied |= e.outcome_unknown();
                        failed = Some(e);
                    }
                    Err(e) => {
                        resolver.fail(e.after_attempts(maybe_applied, attempt + 1));
                        return;
                    }
                }
            }
            let last = Box::new(failed.expect("an attempt failed"));
            resolver.fail(ClientError::Exhausted { attempts, last });
        });
        correctable
    }

    /// One attempt of an invocation at `node`: its preliminary views go to `resolver` as
    /// they come; returns the final view.
    async fn invoke_attempt<T: Clone + PartialEq + Send + 'static>(
        &self,
        node: usize,
        words: &[Vec<u8>],
        pushes: usize,
        last: ReadLevel,
        parse: fn(&Frame) -> Result<T, ClientError>,
        resolver: &crate::Resolver<T>,
    ) -> Result<crate::View<T>, ClientError> {
        let conn = self.connection_in(node, true).await.map_err(ClientError::Connection)?;
        let words: Vec<&[u8]> = words.iter().map(Vec::as_slice).collect();
        let (pushes_tx, mut pushes) = tokio::sync::mpsc::channel(pushes.max(1));
        let call = conn.call_with_pushes(&words, self.config.attempt_timeout, pushes_tx);
        tokio::pin!(call);
        // What `+SAME` stands for: the previous view of this attempt.
        let mut previous: Option<T> = None;
        let malformed = || ClientError::Unexpected("a malformed KEEL.INVOKE push".into());
        let reply = loop {
            tokio::select! {
                biased;
                Some(push) = pushes.recv() => {
                    let view = preliminary_view(push, &previous, parse).ok_or_else(malformed)?;
                    previous = Some(view.value.clone());
                    // A retry's views may repeat a level already shown: refused, counted.
                    resolver.update(view);
                }
                reply = &mut call => break reply,
            }
        };
        // Pushes written before the reply but not yet taken.
        while let Ok(push) = pushes.try_recv() {
            if let Some(view) = preliminary_view(push, &previous, parse) {
                previous = Some(view.value.clone());
                resolver.update(view);
            }
        }
        match reply.map_err(ClientError::Connection)? {
            Frame::Error(line) => Err(ClientError::Keel(keel_wire::reply::error_from_line(&line))),
            frame => final_view(frame, last, &previous, parse),
        }
    }

    /// Sends `words` to `node` once; an error frame becomes a [`keel_types::KeelError`].
    pub async fn call_node(&self, node: usize, words: &[&[u8]]) -> Result<Frame, ClientError> {
        let conn = self.connection(node).await.map_err(ClientError::Connection)?;
        match conn.call(words, self.config.attempt_timeout).await {
            Ok(Frame::Error(line)) => {
                Err(ClientError::Keel(keel_wire::reply::error_from_line(&line)))
            }
            Ok(frame) => Ok(frame),
            Err(e) => Err(ClientError::Connection(e)),
        }
    }

    /// Sends `words` with retries; returns the frame and the node that answered.
    pub async fn call(&self, words: &[&[u8]]) -> Result<(Frame, usize), ClientError> {
        self.call_counted(words).await.0
    }

    /// As [`Client::call`], with the number of attempts made.
    async fn call_counted(&self, words: &[&[u8]]) -> (Result<(Frame, usize), ClientError>, u32) {
        let mut node = self.preferred.load(Ordering::Relaxed) % self.config.nodes.len();
        let mut backoff = self.config.backoff;
        let mut last = None;
        // Whether an earlier attempt may have been applied.
        let mut maybe_applied = false;
        for attempt in 0..self.config.attempts_max {
            if attempt > 0 {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
            match self.call_node(node, words).await {
                Ok(frame) => {
                    self.preferred.store(node, Ordering::Relaxed);
                    return (Ok((frame, node)), attempt + 1);
                }
                Err(e) if !e.is_retryable() => {
                    return (Err(e.after_attempts(maybe_applied, attempt + 1)), attempt + 1);
                }
                Err(e) => {
                    if e.moves_on() {
                        node = (node + 1) % self.config.nodes.len();
                    }
                    maybe_applied |= e.outcome_unknown();
                    last = Some(e);
                }
            }
        }
        let attempts = self.config.attempts_max;
        (Err(ClientError::Exhausted { attempts, last: Box::new(last.expect("tried")) }), attempts)
    }
}

/// One logical client: operations one at a time, writes deduplicated by
/// `(id, sequence number)` across retries.
#[derive(Debug)]
pub struct Session {
    client: Arc<Client>,
    id: u64,
    seq: u64,
    /// The server session its writes go under (`KEEL.SESSION`), once opened.
    server_session: Option<u64>,
}

/// The levels an invocation reads: weakest first, each once; every level if none given.
fn invoked_levels(levels: &[ReadLevel]) -> Vec<ReadLevel> {
    let mut levels = if levels.is_empty() { ReadLevel::ALL.to_vec() } else { levels.to_vec() };
    levels.sort();
    levels.dedup();
    levels
}

/// A `KEEL.INVOKE` push `["invoke", tag, level, value or +SAME, version]` as a view;
/// `+SAME` stands for the `previous` view's value.
fn preliminary_view<T: Clone>(
    push: Frame,
    previous: &Option<T>,
    parse: fn(&Frame) -> Result<T, ClientError>,
) -> Option<crate::View<T>> {
    let Frame::Push(items) = push else { return None };
    let [kind, _tag, level, value, version] = <[Frame; 5]>::try_from(items).ok()?;
    if kind != Frame::bulk("invoke") {
        return None;
    }
    let Frame::Bulk(level) = level else { return None };
    let level: ReadLevel = std::str::from_utf8(&level).ok()?.parse().ok()?;
    let value = same_or_value(&value, previous, parse).ok()?;
    Some(crate::View { level, value, version: version_of(&version) })
}

/// The final view from `KEEL.INVOKE ... WITHVERSION`'s reply `[value or +SAME, version]`.
fn final_view<T: Clone>(
    frame: Frame,
    level: ReadLevel,
    previous: &Option<T>,
    parse: fn(&Frame) -> Result<T, ClientError>,
) -> Result<crate::View<T>, ClientError> {
    let (value, version) = pair(frame)?;
    let value = same_or_value(&value, previous, parse)?;
    Ok(crate::View { level, value, version: version_of(&version) })
}

/// A view's value: `+SAME` means the previous view's.
fn same_or_value<T: Clone>(
    frame: &Frame,
    previous: &Option<T>,
    parse: fn(&Frame) -> Result<T, ClientError>,
) -> Result<T, ClientError> {
    match (frame, previous) {
        (Frame::Simple(word), Some(previous)) if word == b"SAME" => Ok(previous.clone()),
        (Frame::Simple(_), _) => Err(ClientError::Unexpected(format!("{frame:?}"))),
        _ => parse(frame),
    }
}

/// How many preliminary views a queue operation's invocation at `levels` gives (none
/// given: one, at `any`).
fn queue_views(levels: &[ReadLevel]) -> usize {
    if levels.is_empty() {
        1
    } else {
        invoked_levels(levels).len()
    }
}

/// The words of a queue operation's `KEEL.INVOKE` (without `WITHVERSION`).
fn queue_invocation(
    op: &[u8],
    queue: &[u8],
    value: Option<&[u8]>,
    levels: &[ReadLevel],
    durability: Option<Durability>,
) -> Vec<Vec<u8>> {
    let mut words = vec![b"KEEL.INVOKE".to_vec(), op.to_vec(), queue.to_vec()];
    words.extend(value.map(<[u8]>::to_vec));
    if !levels.is_empty() {
        words.push(b"LEVELS".to_vec());
        words.extend(invoked_levels(levels).iter().map(|l| l.as_str().as_bytes().to_vec()));
    }
    if let Some(durability) = durability {
        words.push(b"DURABILITY".to_vec());
        words.push(durability.as_str().as_bytes().to_vec());
    }
    words
}

/// An element a dequeue removed (or would remove).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueItem {
    /// Its sequence number in the queue (the first element enqueued has 1).
    pub seq: u64,
    /// The element.
    pub value: Vec<u8>,
    /// Elements left after it.
    pub remaining: u64,
}

fn count_of(frame: &Frame) -> Result<u64, ClientError> {
    match frame {
        Frame::Integer(n) => u64::try_from(*n).map_err(|_| ClientError::Unexpected(format!("{n}"))),
        other => Err(ClientError::Unexpected(format!("{other:?}"))),
    }
}

/// An `MGET` reply: the values in key order.
fn values_of(frame: &Frame) -> Result<Vec<Option<Vec<u8>>>, ClientError> {
    match frame {
        Frame::Array(items) => items.iter().map(value_of).collect(),
        other => Err(ClientError::Unexpected(format!("{other:?}"))),
    }
}

/// A dequeue's reply: `[seq, value, remaining]`, or null for an empty queue.
fn queue_item_of(frame: &Frame) -> Result<Option<QueueItem>, ClientError> {
    match frame {
        Frame::Null | Frame::NullArray => Ok(None),
        Frame::Array(items) if items.len() == 3 => {
            let Frame::Bulk(value) = &items[1] else {
                return Err(ClientError::Unexpected(format!("{frame:?}")));
            };
            Ok(Some(QueueItem {
                seq: count_of(&items[0])?,
                value: value.to_vec(),
                remaining: count_of(&items[2])?,
            }))
        }
        other => Err(ClientError::Unexpected(format!("{other:?}"))),
    }
}

/// An enqueue's reply: `[seq, length]`.
fn enqueued_of(frame: &Frame) -> Result<(u64, u64), ClientError> {
    match frame {
        Frame::Array(items) if items.len() == 2 => Ok((count_of(&items[0])?, count_of(&items[1])?)),
        other => Err(ClientError::Unexpected(format!("{other:?}"))),
    }
}

fn version_of(frame: &Frame) -> Option<Version> {
    let Frame::Bulk(bytes) = frame else { return None };
    let text = std::str::from_utf8(bytes).ok()?;
    let (epoch, index) = text.split_once('.')?;
    Some(Version::new(epoch.parse().ok()?, index.parse().ok()?))
}

fn value_of(frame: &Frame) -> Result<Option<Vec<u8>>, ClientError> {
    match frame {
        Frame::Bulk(bytes) => Ok(Some(bytes.to_vec())),
        Frame::Null | Frame::NullArray => Ok(None),
        other => Err(ClientError::Unexpected(format!("{other:?}"))),
    }
}

fn pair(frame: Frame) -> Result<(Frame, Frame), ClientError> {
    match frame {
        Frame::Array(mut items) if items.len() == 2 => {
            let second = items.pop().expect("two");
            Ok((items.pop().expect("two"), second))
        }
        other => Err(ClientError::Unexpected(format!("{other:?}"))),
    }
}

impl Session {
    /// This session's local id (names it in histories; its writes go under
    /// [`Session::server_session`]).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The client this session uses.
    pub fn client(&self) -> &Arc<Client> {
        &self.client
    }

    /// The server session its writes go under, if one is open.
    pub fn server_session(&self) -> Option<u64> {
        self.server_session
    }

    /// Opens a server session (`KEEL.SESSION`) and numbers writes from 1 in it. An open
    /// refused with `SESSIONEXPIRED` (stamped at a node that lagged the last use of a
    /// session the table evicted: `docs/protocol.md` §6) opened nothing and is sent again,
    /// a few times.
    async fn open(&mut self) -> Result<u64, ClientError> {
        let mut refused = 0;
        let (frame, _) = loop {
            match self.client.call(&[b"KEEL.SESSION"]).await {
                Err(ClientError::Keel(KeelError::SessionExpired))
                    if refused < OPEN_REFUSALS_MAX =>
                {
                    refused += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(5 << refused)).await;
                }
                other => break other?,
            }
        };
        let id = match &frame {
            Frame::Bulk(bytes) => std::str::from_utf8(bytes).ok().and_then(|t| t.parse().ok()),
            _ => None,
        };
        let id = id
            .filter(|id| ClientId(*id).is_session())
            .ok_or_else(|| ClientError::Unexpected(format!("{frame:?}")))?;
        self.server_session = Some(id);
        self.seq = 0;
        Ok(id)
    }

    /// Sends `KEEL.REQ <session> <seq> command...` with retries, under a server session
    /// (opened first if need be); see the module doc for `SESSIONEXPIRED`.
    async fn write(&mut self, command: &[&[u8]]) -> Result<(Frame, usize), ClientError> {
        let mut reopened = false;
        loop {
            let session = match self.server_session {
                Some(id) => id,
                None => self.open().await?,
            };
            self.seq += 1;
            let (id, seq) = (session.to_string(), self.seq.to_string());
            let mut words: Vec<&[u8]> = vec![b"KEEL.REQ", id.as_bytes(), seq.as_bytes()];
            words.extend_from_slice(command);
            let (result, attempts) = self.client.call_counted(&words).await;
            if result == Err(ClientError::Keel(KeelError::SessionExpired)) {
                self.server_session = None;
                // Refused at its first attempt, this request was never applied: it may be
                // sent again under a new session.
                if attempts == 1 && !reopened {
                    reopened = true;
                    continue;
                }
            }
            return result;
        }
    }

    /// Reads `key` at `level` (or the configured default).
    pub async fn get(
        &mut self,
        key: &[u8],
        level: Option<ReadLevel>,
    ) -> Result<ReadResult, ClientError> {
        let level = level.or(self.client.config.read_level);
        let mut words: Vec<&[u8]> = vec![b"GET", key];
        if let Some(level) = level {
            words.extend([b"LEVEL".as_slice(), level.as_str().as_bytes()]);
        }
        words.push(b"WITHVERSION");
        let (frame, node) = self.client.call(&words).await?;
        let (value, version) = pair(frame)?;
        Ok(ReadResult { value: value_of(&value)?, version: version_of(&version), node })
    }

    /// Writes `key = value` with `durability` (or the configured default).
    pub async fn put(
        &mut self,
        key: &[u8],
        value: &[u8],
        durability: Option<Durability>,
    ) -> Result<WriteResult, ClientError> {
        let durability = durability.or(self.client.config.durability);
        let mut words: Vec<&[u8]> = vec![b"SET", key, value];
        if let Some(d) = durability {
            words.extend([b"DURABILITY".as_slice(), d.as_str().as_bytes()]);
        }
        words.push(b"WITHVERSION");
        let (frame, node) = self.write(&words).await?;
        let (_, version) = pair(frame)?;
        Ok(WriteResult { version: version_of(&version), node })
    }

    /// Deletes `key` (the server's default durability).
    pub async fn delete(&mut self, key: &[u8]) -> Result<bool, ClientError> {
        let (frame, _) = self.write(&[b"DEL", key]).await?;
        Ok(matches!(frame, Frame::Integer(n) if n > 0))
    }

    /// Sets `key` to `new` if it holds `expected` (`None`: absent).
    pub async fn cas(
        &mut self,
        key: &[u8],
        expected: Option<&[u8]>,
        new: &[u8],
        durability: Option<Durability>,
    ) -> Result<CasResult, ClientError> {
        let durability = durability.or(self.client.config.durability);
        let expected = escape_cas(expected);
        let mut words: Vec<&[u8]> = vec![b"KEEL.CAS", key, &expected, new];
        if let Some(d) = durability {
            words.extend([b"DURABILITY".as_slice(), d.as_str().as_bytes()]);
        }
        let (frame, node) = self.write(&words).await?;
        match frame {
            Frame::Array(items) if items.len() == 3 => Ok(CasResult {
                swapped: matches!(items[0], Frame::Integer(1) | Frame::Boolean(true)),
                current: value_of(&items[1])?,
                version: version_of(&items[2]),
                node,
            }),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Appends `value` to `queue` (deduplicated across retries); returns the element's
    /// sequence number and the queue's length after it.
    pub async fn enqueue(
        &mut self,
        queue: &[u8],
        value: &[u8],
        durability: Option<Durability>,
    ) -> Result<(u64, u64), ClientError> {
        let durability = durability.or(self.client.config.durability);
        let mut words: Vec<&[u8]> = vec![b"KEEL.ENQUEUE", queue, value];
        if let Some(d) = durability {
            words.extend([b"DURABILITY".as_slice(), d.as_str().as_bytes()]);
        }
        let (frame, _) = self.write(&words).await?;
        enqueued_of(&frame)
    }

    /// Removes `queue`'s head (deduplicated across retries: a retried dequeue never takes
    /// a second element); `None` when the queue is empty.
    pub async fn dequeue(
        &mut self,
        queue: &[u8],
        durability: Option<Durability>,
    ) -> Result<Option<QueueItem>, ClientError> {
        let durability = durability.or(self.client.config.durability);
        let mut words: Vec<&[u8]> = vec![b"KEEL.DEQUEUE", queue];
        if let Some(d) = durability {
            words.extend([b"DURABILITY".as_slice(), d.as_str().as_bytes()]);
        }
        let (frame, _) = self.write(&words).await?;
        queue_item_of(&frame)
    }

    /// [`Client::invoke_dequeue`] under this session's deduplication: the dequeue is named
    /// by the session and a sequence number (`KEEL.INVOKE ... REQ`), so a failed attempt is
    /// retried (at another node if need be) without ever taking a second element.
    /// Opens the server session first if none is open.
    pub async fn invoke_dequeue(
        &mut self,
        queue: &[u8],
        levels: &[ReadLevel],
        durability: Option<Durability>,
    ) -> Result<crate::Correctable<Option<QueueItem>>, ClientError> {
        let session = match self.server_session {
            Some(id) => id,
            None => self.open().await?,
        };
        self.seq += 1;
        let durability = durability.or(self.client.config.durability);
        let mut words = queue_invocation(b"DEQUEUE", queue, None, levels, durability);
        words.extend([b"REQ".to_vec(), session.to_string().into(), self.seq.to_string().into()]);
        let pushes = queue_views(levels);
        Ok(self.client.invoke_words(words, pushes, ReadLevel::Linearizable, queue_item_of, true))
    }

    /// Adds `delta` to the integer at `key`; returns the new value.
    pub async fn incr(&mut self, key: &[u8], delta: i64) -> Result<i64, ClientError> {
        let delta = delta.to_string().into_bytes();
        let (frame, _) = self.write(&[b"INCRBY", key, &delta]).await?;
        match frame {
            Frame::Integer(n) => Ok(n),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }
}

/// `KEEL.CAS`'s spelling of the expected value: `-nil` for absent; a value starting
/// with `-` gets one more `-` in front.
pub fn escape_cas(expected: Option<&[u8]>) -> Vec<u8> {
    match expected {
        None => b"-nil".to_vec(),
        Some(v) if v.starts_with(b"-") => [b"-".as_slice(), v].concat(),
        Some(v) => v.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_from_epoch_dot_index() {
        assert_eq!(version_of(&Frame::bulk("2.17")), Some(Version::new(2, 17)));
        assert_eq!(version_of(&Frame::Null), None);
        assert_eq!(version_of(&Frame::bulk("x")), None);
    }

    #[test]
    fn invoke_pushes_and_replies_parse_and_malformed_ones_are_refused() {
        let push = |items: Vec<Frame>| Frame::Push(items);
        let good = push(vec![
            Frame::bulk("invoke"),
            Frame::Integer(4),
            Frame::bulk("any"),
            Frame::bulk("v"),
            Frame::bulk("1.2"),
        ]);
        let view = preliminary_view(good, &None, value_of).expect("a view");
        assert_eq!((view.level, view.value.as_deref()), (ReadLevel::Any, Some(&b"v"[..])));
        assert_eq!(view.version, Some(Version::new(1, 2)));
        let same = |level: &str| {
            push(vec![
                Frame::bulk("invoke"),
                Frame::Integer(4),
                Frame::bulk(level),
                Frame::Simple(b"SAME".to_vec()),
                Frame::Null,
            ])
        };
        let previous = Some(Some(b"v".to_vec()));
        assert_eq!(
            preliminary_view(same("monotonic"), &previous, value_of).unwrap().value,
            Some(b"v".to_vec())
        );
        assert!(
            preliminary_view(same("monotonic"), &None, value_of).is_none(),
            "SAME with nothing before"
        );
        assert!(
            preliminary_view(same("strong"), &previous, value_of).is_none(),
            "an unknown level"
        );
        assert!(preliminary_view(push(vec![Frame::bulk("invoke")]), &previous, value_of).is_none());
        assert!(preliminary_view(Frame::bulk("x"), &previous, value_of).is_none());
        let reply = Frame::Array(vec![Frame::Simple(b"SAME".to_vec()), Frame::bulk("1.2")]);
        let last = final_view(reply, ReadLevel::Linearizable, &previous, value_of).unwrap();
        assert_eq!((last.value, last.version), (Some(b"v".to_vec()), Some(Version::new(1, 2))));
        assert!(
            final_view(Frame::Integer(1), ReadLevel::Linearizable, &previous, value_of).is_err()
        );
    }

    #[test]
    fn queue_replies_parse_and_malformed_ones_are_refused() {
        let item = Frame::Array(vec![Frame::Integer(7), Frame::bulk("t"), Frame::Integer(3)]);
        let expected = QueueItem { seq: 7, value: b"t".to_vec(), remaining: 3 };
        assert_eq!(queue_item_of(&item).unwrap(), Some(expected.clone()));
        assert_eq!(queue_item_of(&Frame::Null).unwrap(), None);
        assert!(queue_item_of(&Frame::Array(vec![
            Frame::Integer(-1),
            Frame::bulk("t"),
            Frame::Integer(0)
        ]))
        .is_err());
        assert!(queue_item_of(&Frame::bulk("t")).is_err());
        assert_eq!(
            enqueued_of(&Frame::Array(vec![Frame::Integer(4), Frame::Integer(1)])).unwrap(),
            (4, 1)
        );
        assert!(enqueued_of(&Frame::Integer(4)).is_err());
        // A confirmation of a dequeue's preliminary view rebuilds the element.
        let reply = Frame::Array(vec![Frame::Simple(b"SAME".to_vec()), Frame::bulk("2.9")]);
        let previous = Some(Some(expected.clone()));
        let last = final_view(reply, ReadLevel::Linearizable, &previous, queue_item_of).unwrap();
        assert_eq!(last.value, Some(expected));
        let words = queue_invocation(b"DEQUEUE", b"q", None, &[], Some(Durability::Durable));
        assert_eq!(words, [&b"KEEL.INVOKE"[..], b"DEQUEUE", b"q", b"DURABILITY", b"durable"]);
    }

    #[test]
    fn cas_expected_values_are_escaped() {
        assert_eq!(escape_cas(None), b"-nil");
        assert_eq!(escape_cas(Some(b"-nil")), b"--nil");
        assert_eq!(escape_cas(Some(b"v")), b"v");
    }

    #[test]
    fn sessions_get_distinct_ids() {
        let client = Client::new(ClientConfig::new(vec!["127.0.0.1:1".parse().unwrap()]));
        let (a, b) = (client.session(), client.session());
        assert_ne!(a.id(), b.id());
        assert!(a.id() > 0 && a.id() < 1 << 63);
    }

    #[tokio::test]
    async fn an_invocation_returns_before_any_reply_and_fails_when_none_comes() {
        // A server that accepts and never answers.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        let mut config = ClientConfig::new(vec![addr]);
        config.attempt_timeout = Duration::from_millis(200);
        let client = Client::new(config);
        let read = client.invoke(b"k", &[ReadLevel::Any, ReadLevel::Linearizable]);
        let dequeue = client.invoke_dequeue(b"q", &[], None);
        assert_eq!(
            (read.state(), dequeue.state()),
            (crate::State::Updating, crate::State::Updating)
        );
        // Still open on return: the call did not wait for the attempt (which fails).
        assert!(read.preliminary().is_empty(), "returned before any storage reply");
        assert!(read.final_view().await.is_err(), "an attempt that never answers fails");
        assert!(dequeue.final_view().await.is_err());
        assert_eq!(read.state(), crate::State::Error);
    }

    /// A server that answers `+PONG` to every request except those naming `HANG`, which
    /// it never answers (and, RESP being in order, nothing after them on that connection).
    async fn hanging_server() -> SocketAddr {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    let mut hung = false;
                    while let Ok(n) = stream.read(&mut buf).await {
                        if n == 0 {
                            return;
                        }
                        hung |= buf[..n].windows(4).any(|w| w == b"HANG");
                        if !hung && stream.write_all(b"+PONG\r\n").await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    /// A server that opens sessions (`KEEL.SESSION` answers a session id) and answers
    /// the `n`-th `KEEL.REQ` it receives with `req_replies[n]`; it records what it was
    /// sent, one command name per request.
    async fn scripted_server(
        req_replies: Vec<&'static str>,
    ) -> (SocketAddr, Arc<Mutex<Vec<&'static str>>>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let (log, replies) = (log.clone(), req_replies.clone());
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = stream.read(&mut buf).await {
                        if n == 0 {
                            return;
                        }
                        // One request per read: the client sends one and waits.
                        let request = &buf[..n];
                        let reply = if request.windows(6).any(|w| w == b"SELECT") {
                            "+OK\r\n".to_string() // each connection selects its keyspace
                        } else if request.windows(12).any(|w| w == b"KEEL.SESSION") {
                            log.lock().unwrap().push("KEEL.SESSION");
                            let id = ((1u64 << 63) + 7).to_string();
                            format!("${}\r\n{id}\r\n", id.len())
                        } else {
                            let mut log = log.lock().unwrap();
                            log.push("KEEL.REQ");
                            let n = log.iter().filter(|w| **w == "KEEL.REQ").count();
                            replies.get(n - 1).copied().unwrap_or("+OK").to_string()
                        };
                        if stream.write_all(reply.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (addr, seen)
    }

    #[tokio::test]
    async fn a_write_refused_after_an_earlier_attempt_is_not_sent_again() {
        // The first attempt timed out (it may have been applied); its retry finds the
        // session expired: the outcome is unknown, and a new session must not apply it.
        let (addr, seen) =
            scripted_server(vec!["-TIMEOUT timed out\r\n", "-SESSIONEXPIRED expired\r\n"]).await;
        let mut config = ClientConfig::new(vec![addr]);
        config.backoff = Duration::from_millis(1);
        let client = Client::new(config);
        let mut session = client.session();
        let result = session.delete(b"k").await;
        assert_eq!(result, Err(ClientError::Keel(KeelError::SessionExpired)));
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen, ["KEEL.SESSION", "KEEL.REQ", "KEEL.REQ"], "not sent a third time");
        assert_eq!(session.server_session(), None, "the next write opens a new session");
    }

    #[tokio::test]
    async fn a_write_refused_at_its_first_attempt_is_sent_again_under_a_new_session() {
        let (addr, seen) = scripted_server(vec!["-SESSIONEXPIRED expired\r\n", ":1\r\n"]).await;
        let client = Client::new(ClientConfig::new(vec![addr]));
        let mut session = client.session();
        assert_eq!(session.delete(b"k").await, Ok(true));
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen, ["KEEL.SESSION", "KEEL.REQ", "KEEL.SESSION", "KEEL.REQ"]);
    }

    #[tokio::test]
    async fn a_call_does_not_wait_behind_a_slow_call_of_another_session() {
        let addr = hanging_server().await;
        let mut config = ClientConfig::new(vec![addr]);
        config.connections_per_node = 2;
        config.attempt_timeout = Duration::from_secs(30);
        let client = Client::new(config);
        // A slow call (a read waiting for a durability round, say) holds one connection.
        let slow = {
            let client = client.clone();
            tokio::spawn(async move { client.call_node(0, &[b"HANG"]).await })
        };
        while client.pools[0].lock().unwrap().iter().all(|c| c.in_flight() == 0) {
            tokio::task::yield_now().await;
        }
        // Every later call takes the idle connection, never the one behind the slow call.
        for _ in 0..4 {
            let quick = client.call_node(0, &[b"PING"]);
            let reply = tokio::time::timeout(Duration::from_secs(5), quick).await;
            assert!(matches!(reply, Ok(Ok(Frame::Simple(_)))), "{reply:?}");
        }
        assert_eq!(client.pools[0].lock().unwrap().len(), 2);
        slow.abort();
    }
}
