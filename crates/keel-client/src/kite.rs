//! Sessions of a Kite keyspace (release consistency, `docs/kite.md`): relaxed reads and
//! writes, acquires and releases, FAA and CAS.
//!
//! A Kite session lives on one node: the node orders its operations, and a release waits
//! for the session's earlier writes there. So a [`KiteSession`] runs on one node at a
//! time and names itself and each request in every request (`KEEL.REQ <id> <seq> ...`),
//! whichever pooled connection carries it.
//!
//! When its node cannot be reached (the connection failed or timed out) or refuses as a
//! node that does not vote (`UNAVAILABLE`: it was left out of the keyspace's voters, or
//! a membership change removed it), the call fails and the session goes on at the next
//! node, under the same id and numbering. As far as
//! ordering goes, that is a new session: what the old node had not passed on may be lost
//! with it (relaxed writes are answered before they leave their node, as in the paper,
//! where a session dies with its machine).
//!
//! An FAA or CAS whose node failed is sent again at the next node under the same number,
//! which the nodes know it by: it is done once, and the answer is that of the attempt
//! that did it (a failed comparison included: the nodes commit it like a write, so a
//! first attempt still running at the old node finds it and cannot swap afterwards). A
//! weak CAS goes again as a strong one, since a weak one could fail against the new
//! node's copy without learning that its first attempt swapped. This is done only when
//! the session wrote nothing since its last barrier (a release, or a read-modify-write
//! that wrote): otherwise the retry could make the new node publish a value whose earlier
//! writes were lost with the old one, and the call fails instead (its outcome unknown). A
//! late retry whose own outcome the nodes no longer keep fails with `SESSIONEXPIRED`.
//! Otherwise only a refusal that says nothing was applied (`BUSY`) is retried.
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
    /// A relaxed write was sent since the last barrier that completed.
    dirty: bool,
}

impl Client {
    /// A new Kite session on node `node` (an index into the configured nodes).
    pub fn kite_session(self: &Arc<Client>, node: usize) -> KiteSession {
        assert!(node < self.config().nodes.len(), "node {node} is not configured");
        KiteSession {
            client: self.clone(),
            node,
            id: self.fresh_session_id(),
            seq: 0,
            dirty: false,
        }
    }
}

impl KiteSession {
    /// The node it runs on now (an index into the configured nodes).
    pub fn node(&self) -> usize {
        self.node
    }

    /// Its id: the client id its requests carry (`KEEL.REQ`), the same on every node it
    /// runs on.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Sends `command` as the session's next request. `again`: for a read-modify-write,
    /// what is sent at the next nodes when its node cannot be reached, if the session
    /// holds no write since its last barrier.
    async fn call(
        &mut self,
        command: &[&[u8]],
        again: Option<&[&[u8]]>,
    ) -> Result<Frame, ClientError> {
        self.seq += 1;
        let (id, seq) = (self.id.to_string(), self.seq.to_string());
        let mut words: Vec<&[u8]> = vec![b"KEEL.REQ", id.as_bytes(), seq.as_bytes()];
        words.extend_from_slice(command);
        let nodes = self.client.config().nodes.len();
        let mut backoff = Duration::from_millis(5);
        let mut attempt = 1;
        let mut moves = 0;
        // Whether an earlier attempt may have been applied.
        let mut maybe_applied = false;
        loop {
            match self.client.call_node(self.node, &words).await {
                Err(ClientError::Keel(KeelError::Busy(_))) if attempt < BUSY_ATTEMPTS => {
                    tokio::time::sleep(backoff).await;
                    backoff *= 2;
                    attempt += 1;
                }
                // Or a node that does not vote (left out, or removed by a membership
                // change) refused it, or a node stopping dropped it (which may have
                // been after it was applied: counted as unknown).
                Err(
                    e @ (ClientError::Connection(_) | ClientError::Keel(KeelError::Unavailable(_))),
                ) => {
                    // Goes on at the next node, a new session as far as ordering goes.
                    self.node = (self.node + 1) % nodes;
                    let Some(again) = again.filter(|_| !self.dirty && moves + 1 < nodes) else {
                        return Err(e.after_attempts(maybe_applied, attempt + moves as u32));
                    };
                    maybe_applied |= e.outcome_unknown()
                        || matches!(e, ClientError::Keel(KeelError::Unavailable(_)));
                    words.truncate(3);
                    words.extend_from_slice(again);
                    moves += 1;
                }
                Err(e) => return Err(e.after_attempts(maybe_applied, attempt + moves as u32)),
                ok => return ok,
            }
        }
    }

    async fn value(&mut self, command: &[&[u8]]) -> Result<Option<Vec<u8>>, ClientError> {
        match self.call(command, None).await? {
            Frame::Bulk(bytes) => Ok(Some(bytes.to_vec())),
            Frame::Null => Ok(None),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    async fn ok(&mut self, command: &[&[u8]]) -> Result<(), ClientError> {
        match self.call(command, None).await? {
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
        self.dirty = true;
        self.ok(&[b"SET", key, value]).await
    }

    /// A release: visible only after every earlier write of the session.
    pub async fn release(&mut self, key: &[u8], value: &[u8]) -> Result<(), ClientError> {
        self.ok(&[b"SET", key, value, b"RELEASE"]).await?;
        self.dirty = false;
        Ok(())
    }

    /// Fetch-and-add on a decimal i64 (absent: 0); returns the value before.
    pub async fn faa(&mut self, key: &[u8], delta: i64) -> Result<i64, ClientError> {
        let delta = delta.to_string();
        let command: &[&[u8]] = &[b"KEEL.FAA", key, delta.as_bytes()];
        match self.call(command, Some(command)).await? {
            Frame::Integer(before) => {
                self.dirty = false;
                Ok(before)
            }
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
        // Sent again as a strong one when its node fails (see the module documentation).
        let command: &[&[u8]] = &[b"KEEL.CAS", key, &expected, new, strength];
        let again: &[&[u8]] = &[b"KEEL.CAS", key, &expected, new, b"STRONG"];
        let result = match self.call(command, Some(again)).await? {
            Frame::Array(items) if items.len() == 3 => CasResult {
                swapped: matches!(items[0], Frame::Integer(1) | Frame::Boolean(true)),
                current: match &items[1] {
                    Frame::Bulk(bytes) => Some(bytes.to_vec()),
                    Frame::Null => None,
                    other => return Err(ClientError::Unexpected(format!("{other:?}"))),
                },
                version: None,
                node: self.node,
            },
            other => return Err(ClientError::Unexpected(format!("{other:?}"))),
        };
        // A swap is a barrier for the session's earlier writes; a failed one is not.
        if result.swapped {
            self.dirty = false;
        }
        Ok(result)
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

    /// [`KiteSession::node`].
    pub fn node(&self) -> usize {
        self.session.node()
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
