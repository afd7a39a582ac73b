//! Sessions of a geo keyspace (`docs/geo.md`): causal transactions at one data center,
//! the uniform barrier, and moving the session to another data center with its past
//! vector.
//!
//! A [`GeoSession`] holds a connection of its own to one node (the server keeps the
//! session's past vector and open transaction per connection) and a copy of its past
//! vector, raised by every commit and attach: [`GeoSession::past`] exposes it, and
//! [`GeoSession::attach`] carries it to a node of another data center (`KEEL.ATTACH`),
//! which answers once everything the session observed is visible there.
//!
//! No request is retried: a connection that fails mid-transaction loses the transaction
//! (a commit whose reply was lost may or may not have committed:
//! [`ClientError::outcome_unknown`]); the session then attaches elsewhere or begins again.

use crate::conn::Connection;
use crate::{Client, ClientError};
use keel_wire::resp::Frame;
use std::sync::Arc;
use std::time::Duration;

/// How long a barrier or an attach may wait: until what the session observed is uniform
/// (stored at f + 1 data centers), which a failed data center can hold up until it is
/// suspected.
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(60);

/// One session of a geo keyspace, on one node at a time. The client's `keyspace` must be
/// a geo keyspace.
#[derive(Debug)]
pub struct GeoSession {
    client: Arc<Client>,
    node: usize,
    conn: Option<Connection>,
    past: Vec<u64>,
    /// Whether the open transaction is strong (its commit waits on other data centers).
    strong: bool,
}

impl Client {
    /// A new geo session on node `node` (an index into the configured nodes), with no
    /// past.
    pub fn geo_session(self: &Arc<Client>, node: usize) -> GeoSession {
        assert!(node < self.config().nodes.len(), "node {node} is not configured");
        GeoSession { client: self.clone(), node, conn: None, past: Vec::new(), strong: false }
    }
}

impl GeoSession {
    /// The node it runs on (an index into the configured nodes).
    pub fn node(&self) -> usize {
        self.node
    }

    /// Its past vector: one entry per data center, the strong entry last (empty: the
    /// session has committed nothing yet).
    pub fn past(&self) -> &[u64] {
        &self.past
    }

    /// Sends `words` on the session's connection (opened first if need be) and waits
    /// at most `timeout` for the reply; an error reply becomes a [`ClientError::Keel`].
    pub async fn call(&mut self, words: &[&[u8]], timeout: Duration) -> Result<Frame, ClientError> {
        if self.conn.as_ref().is_none_or(Connection::is_closed) {
            let conn = self.client.dedicated_connection(self.node).await;
            self.conn = Some(conn.map_err(ClientError::Connection)?);
        }
        let conn = self.conn.as_ref().expect("opened above");
        match conn.call(words, timeout).await.map_err(ClientError::Connection)? {
            Frame::Error(line) => Err(ClientError::Keel(keel_wire::reply::error_from_line(&line))),
            frame => Ok(frame),
        }
    }

    async fn step(&mut self, words: &[&[u8]]) -> Result<Frame, ClientError> {
        let timeout = self.client.config().attempt_timeout;
        self.call(words, timeout).await
    }

    async fn ok(&mut self, words: &[&[u8]], timeout: Duration) -> Result<(), ClientError> {
        match self.call(words, timeout).await? {
            Frame::Simple(word) if word == b"OK" => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    async fn integer(&mut self, words: &[&[u8]]) -> Result<i64, ClientError> {
        match self.step(words).await? {
            Frame::Integer(n) => Ok(n),
            other => Err(unexpected(other)),
        }
    }

    /// Opens a causal transaction on a snapshot that includes the session's past.
    pub async fn begin(&mut self) -> Result<(), ClientError> {
        let timeout = self.client.config().attempt_timeout;
        self.strong = false;
        self.ok(&[b"KEEL.TX.BEGIN", b"CAUSAL"], timeout).await
    }

    /// Opens a strong transaction labelled `label` (`None`: it conflicts with every strong
    /// transaction on a common key). Its commit fails with
    /// [`keel_types::KeelError::Conflict`] if it missed a conflicting strong transaction:
    /// run it again from here.
    pub async fn begin_strong(&mut self, label: Option<&str>) -> Result<(), ClientError> {
        let timeout = self.client.config().attempt_timeout;
        self.strong = true;
        match label {
            Some(label) => {
                let words: [&[u8]; 4] = [b"KEEL.TX.BEGIN", b"STRONG", b"LABEL", label.as_bytes()];
                self.ok(&words, timeout).await
            }
            None => self.ok(&[b"KEEL.TX.BEGIN", b"STRONG"], timeout).await,
        }
    }

    /// Reads `key`'s register in the open transaction (`None`: never set).
    pub async fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, ClientError> {
        match self.step(&[b"GET", key]).await? {
            Frame::Bulk(bytes) => Ok(Some(bytes.to_vec())),
            Frame::Null => Ok(None),
            other => Err(unexpected(other)),
        }
    }

    /// Sets `key`'s register in the open transaction.
    pub async fn set(&mut self, key: &[u8], value: &[u8]) -> Result<(), ClientError> {
        let timeout = self.client.config().attempt_timeout;
        self.ok(&[b"SET", key, value], timeout).await
    }

    /// Adds `delta` to `key`'s counter in the open transaction; the counter's value after
    /// it, as the transaction sees it.
    pub async fn add(&mut self, key: &[u8], delta: i64) -> Result<i64, ClientError> {
        let delta = delta.to_string();
        self.integer(&[b"INCRBY", key, delta.as_bytes()]).await
    }

    /// Reads `key`'s counter in the open transaction.
    pub async fn counter(&mut self, key: &[u8]) -> Result<i64, ClientError> {
        self.integer(&[b"KEEL.TX.READ", b"counter", key]).await
    }

    /// Adds `member` to `key`'s add-wins set; whether it was absent.
    pub async fn sadd(&mut self, key: &[u8], member: &[u8]) -> Result<bool, ClientError> {
        Ok(self.integer(&[b"SADD", key, member]).await? == 1)
    }

    /// Removes `member` from `key`'s add-wins set (the adds the transaction saw); whether
    /// it was present.
    pub async fn srem(&mut self, key: &[u8], member: &[u8]) -> Result<bool, ClientError> {
        Ok(self.integer(&[b"SREM", key, member]).await? == 1)
    }

    /// `key`'s add-wins set's members, in byte order.
    pub async fn smembers(&mut self, key: &[u8]) -> Result<Vec<Vec<u8>>, ClientError> {
        match self.step(&[b"SMEMBERS", key]).await? {
            Frame::Array(items) | Frame::Set(items) => items
                .into_iter()
                .map(|item| match item {
                    Frame::Bulk(bytes) => Ok(bytes.to_vec()),
                    other => Err(unexpected(other)),
                })
                .collect(),
            other => Err(unexpected(other)),
        }
    }

    /// Commits the open transaction (a causal commit never aborts; a strong one may fail
    /// with a conflict); the session's past vector after it.
    pub async fn commit(&mut self) -> Result<Vec<u64>, ClientError> {
        let frame = match std::mem::take(&mut self.strong) {
            // Certified across data centers, after a barrier.
            true => self.call(&[b"KEEL.TX.COMMIT"], SYNC_TIMEOUT).await?,
            false => self.step(&[b"KEEL.TX.COMMIT"]).await?,
        };
        self.past = vector(frame)?;
        Ok(self.past.clone())
    }

    /// Drops the open transaction.
    pub async fn abort(&mut self) -> Result<(), ClientError> {
        let timeout = self.client.config().attempt_timeout;
        self.ok(&[b"KEEL.TX.ABORT"], timeout).await
    }

    /// Waits until everything the session observed is uniform: it then survives the
    /// failure of any f data centers, and [`GeoSession::attach`] finds it elsewhere.
    pub async fn barrier(&mut self) -> Result<(), ClientError> {
        self.ok(&[b"KEEL.BARRIER"], SYNC_TIMEOUT).await
    }

    /// Moves the session to node `node` (of another data center, typically after its own
    /// failed): answers once everything in the session's past is visible there.
    pub async fn attach(&mut self, node: usize) -> Result<(), ClientError> {
        assert!(node < self.client.config().nodes.len(), "node {node} is not configured");
        self.node = node;
        self.conn = None;
        if self.past.is_empty() {
            return Ok(());
        }
        let entries: Vec<String> = self.past.iter().map(u64::to_string).collect();
        let mut words: Vec<&[u8]> = vec![b"KEEL.ATTACH"];
        words.extend(entries.iter().map(String::as_bytes));
        self.ok(&words, SYNC_TIMEOUT).await
    }
}

fn unexpected(frame: Frame) -> ClientError {
    ClientError::Unexpected(format!("{frame:?}"))
}

/// A vector reply: an array of non-negative integers.
fn vector(frame: Frame) -> Result<Vec<u64>, ClientError> {
    let Frame::Array(items) = frame else { return Err(unexpected(frame)) };
    items
        .into_iter()
        .map(|item| match item {
            Frame::Integer(n) if n >= 0 => Ok(n as u64),
            other => Err(unexpected(other)),
        })
        .collect()
}
