//! Sessions of a Kite keyspace (release consistency, `docs/kite.md`): relaxed reads and
//! writes, acquires and releases, FAA and CAS.
//!
//! A Kite session lives on one node: the node orders its operations, and a release waits
//! for the session's earlier writes there. So a [`KiteSession`] is pinned to the node it
//! was opened on and names itself in every request (`KEEL.REQ <id> <seq> ...`, the id
//! being the session on that node), whichever pooled connection carries it. It never
//! moves to another node: if its node fails, its relaxed writes may be lost with it (as in
//! the paper, where a session dies with its machine), and the caller opens a new session.
//!
//! Nothing is retried but a refusal that says nothing was applied (`BUSY`): a retried
//! FAA or CAS after a broken connection could be applied twice.
//!
//! [`BlockingKiteSession`] is the same for code without an async runtime.

use crate::client::{escape_cas, CasResult, Client};
use crate::error::ClientError;
use keel_types::KeelError;
use keel_wire::resp::Frame;
use std::sync::Arc;
use std::time::Duration;

/// How many times a request refused with `BUSY` is sent again (with back-off).
const BUSY_ATTEMPTS: u32 = 5;

/// One session of a Kite keyspace on one node. The client's `keyspace` must be a Kite
/// keyspace.
#[derive(Debug)]
pub struct KiteSession {
    client: Arc<Client>,
    node: usize,
    id: u64,
    seq: u64,
}

impl Client {
    /// A new Kite session on node `node` (an index into the configured nodes).
    pub fn kite_session(self: &Arc<Client>, node: usize) -> KiteSession {
        assert!(node < self.config().nodes.len(), "node {node} is not configured");
        KiteSession { client: self.clone(), node, id: self.fresh_session_id(), seq: 0 }
    }
}

impl KiteSession {
    /// The node it runs on (an index into the configured nodes).
    pub fn node(&self) -> usize {
        self.node
    }

    /// Its id (the session's name on its node).
    pub fn id(&self) -> u64 {
        self.id
    }

    async fn call(&mut self, command: &[&[u8]]) -> Result<Frame, ClientError> {
        self.seq += 1;
        let (id, seq) = (self.id.to_string(), self.seq.to_string());
        let mut words: Vec<&[u8]> = vec![b"KEEL.REQ", id.as_bytes(), seq.as_bytes()];
        words.extend_from_slice(command);
        let mut backoff = Duration::from_millis(5);
        let mut attempt = 1;
        loop {
            match self.client.call_node(self.node, &words).await {
                Err(ClientError::Keel(KeelError::Busy(_))) if attempt < BUSY_ATTEMPTS => {
                    tokio::time::sleep(backoff).await;
                    backoff *= 2;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn value(&mut self, command: &[&[u8]]) -> Result<Option<Vec<u8>>, ClientError> {
        match self.call(command).await? {
            Frame::Bulk(bytes) => Ok(Some(bytes.to_vec())),
            Frame::Null => Ok(None),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    async fn ok(&mut self, command: &[&[u8]]) -> Result<(), ClientError> {
        match self.call(command).await? {
            Frame::Simple(word) if word == b"OK" => Ok(()),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// A relaxed read: the node's copy (a quorum's, if the key is out of the node's epoch).
    pub async fn read(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, ClientError> {
        self.value(&[b"GET", key]).await
    }

    /// An acquire: linearizable; the session's later reads see what came before the
    /// release it read.
    pub async fn acquire(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, ClientError> {
        self.value(&[b"GET", key, b"ACQUIRE"]).await
    }

    /// A relaxed write: applied on the node and sent to all; answered at once.
    pub async fn write(&mut self, key: &[u8], value: &[u8]) -> Result<(), ClientError> {
        self.ok(&[b"SET", key, value]).await
    }

    /// A release: visible only after every earlier write of the session.
    pub async fn release(&mut self, key: &[u8], value: &[u8]) -> Result<(), ClientError> {
        self.ok(&[b"SET", key, value, b"RELEASE"]).await
    }

    /// Fetch-and-add on a decimal i64 (absent: 0); returns the value before.
    pub async fn faa(&mut self, key: &[u8], delta: i64) -> Result<i64, ClientError> {
        let delta = delta.to_string();
        match self.call(&[b"KEEL.FAA", key, delta.as_bytes()]).await? {
            Frame::Integer(before) => Ok(before),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Compare-and-swap: `new` if the key holds `expected` (`None`: absent). A weak one
    /// (`strong == false`) may fail against the node's copy without a barrier.
    pub async fn cas(
        &mut self,
        key: &[u8],
        expected: Option<&[u8]>,
        new: &[u8],
        strong: bool,
    ) -> Result<CasResult, ClientError> {
        let expected = escape_cas(expected);
        let strength: &[u8] = if strong { b"STRONG" } else { b"WEAK" };
        let node = self.node;
        match self.call(&[b"KEEL.CAS", key, &expected, new, strength]).await? {
            Frame::Array(items) if items.len() == 3 => Ok(CasResult {
                swapped: matches!(items[0], Frame::Integer(1) | Frame::Boolean(true)),
                current: match &items[1] {
                    Frame::Bulk(bytes) => Some(bytes.to_vec()),
                    Frame::Null => None,
                    other => return Err(ClientError::Unexpected(format!("{other:?}"))),
                },
                version: None,
                node,
            }),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }
}

/// A [`KiteSession`] for code without an async runtime: each call blocks until its reply.
#[derive(Debug)]
pub struct BlockingKiteSession {
    runtime: tokio::runtime::Runtime,
    session: KiteSession,
}

impl BlockingKiteSession {
    /// A Kite session on node `node` of a client made from `config`, with a runtime of
    /// its own (one thread). Do not call it from inside an async runtime.
    pub fn new(config: crate::ClientConfig, node: usize) -> std::io::Result<BlockingKiteSession> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let session = Client::new(config).kite_session(node);
        Ok(BlockingKiteSession { runtime, session })
    }

    /// [`KiteSession::read`].
    pub fn read(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, ClientError> {
        self.runtime.block_on(self.session.read(key))
    }

    /// [`KiteSession::acquire`].
    pub fn acquire(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, ClientError> {
        self.runtime.block_on(self.session.acquire(key))
    }

    /// [`KiteSession::write`].
    pub fn write(&mut self, key: &[u8], value: &[u8]) -> Result<(), ClientError> {
        self.runtime.block_on(self.session.write(key, value))
    }

    /// [`KiteSession::release`].
    pub fn release(&mut self, key: &[u8], value: &[u8]) -> Result<(), ClientError> {
        self.runtime.block_on(self.session.release(key, value))
    }

    /// [`KiteSession::faa`].
    pub fn faa(&mut self, key: &[u8], delta: i64) -> Result<i64, ClientError> {
        self.runtime.block_on(self.session.faa(key, delta))
    }

    /// [`KiteSession::cas`].
    pub fn cas(
        &mut self,
        key: &[u8],
        expected: Option<&[u8]>,
        new: &[u8],
        strong: bool,
    ) -> Result<CasResult, ClientError> {
        self.runtime.block_on(self.session.cas(key, expected, new, strong))
    }
}
