//! A synchronous driver over a [`World`] for scripted scenarios: issue one request,
//! run the world until its reply or a deadline, and return the reply. Used by the
//! paper's tables, the figure tests and the benchmarks.

use crate::engine::LeaderSim;
use crate::world::{Notice, World};
use keel_core::leader::{ClientReply, ClientRequest, RequestTag, Role};
use keel_types::{
    ClientId, Command, CommandResult, Durability, KeelError, Key, NodeId, ReadLevel, RequestId,
    Value, Version,
};

/// Polling period while waiting for a condition.
pub const POLL_NS: u64 = 5_000_000;

/// Scripted access to a simulated cluster.
pub struct Driver<E: LeaderSim> {
    /// The cluster.
    pub world: World<E>,
    next_request: u64,
}

/// A read's answer: the value and the version that wrote it.
pub type ReadResult = (Option<String>, Option<Version>);

impl<E: LeaderSim> Driver<E> {
    /// Wraps a world.
    pub fn new(world: World<E>) -> Driver<E> {
        Driver { world, next_request: 0 }
    }

    /// Sends one request from client `client` to `node` and runs the world until the
    /// reply arrives or `timeout_ns` passes (`None`). Other notices are dropped.
    pub fn request(
        &mut self,
        client: u64,
        node: NodeId,
        command: Command,
        durability: Option<Durability>,
        level: Option<ReadLevel>,
        timeout_ns: u64,
    ) -> Option<ClientReply> {
        self.next_request += 1;
        let request = ClientRequest {
            tag: RequestTag(0),
            client: ClientId(client),
            request: RequestId(self.next_request),
            command,
            durability,
            level,
            after: keel_types::LogIndex::ZERO,
            mode: Default::default(),
            named: false,
        };
        let tag = self.world.submit(node, request);
        let deadline = self.world.now_ns() + timeout_ns;
        while let Some(t) = self.world.next_event_ns() {
            if t > deadline {
                break;
            }
            if let Some(Notice::Reply { reply, .. }) = self.world.step() {
                if reply.tag == tag {
                    return Some(reply);
                }
            }
        }
        self.world.advance_to(deadline);
        None
    }

    /// Writes `key = value` through `node`; the version on success.
    pub fn put(
        &mut self,
        node: NodeId,
        key: &str,
        value: &str,
        durability: Durability,
        timeout_ns: u64,
    ) -> Option<Version> {
        let command = Command::Put {
            key: Key::copy_from_slice(key.as_bytes()),
            value: Value::copy_from_slice(value.as_bytes()),
        };
        match self.request(1, node, command, Some(durability), None, timeout_ns)?.result {
            Ok(CommandResult::Written { version }) => Some(version),
            _ => None,
        }
    }

    /// Reads `key` at `node`: the value and version, the engine's error, or `Timeout`
    /// if no reply came.
    pub fn get(
        &mut self,
        node: NodeId,
        key: &str,
        level: ReadLevel,
        timeout_ns: u64,
    ) -> Result<ReadResult, KeelError> {
        let command = Command::Get { key: Key::copy_from_slice(key.as_bytes()) };
        let reply = self
            .request(2, node, command, None, Some(level), timeout_ns)
            .ok_or(KeelError::Timeout)?;
        match reply.result? {
            CommandResult::Value { value, version } => {
                Ok((value.map(|v| String::from_utf8_lossy(&v).into_owned()), version))
            }
            other => panic!("a get answered {other:?}"),
        }
    }

    /// Runs the world for `span_ns`.
    pub fn run_for(&mut self, span_ns: u64) {
        let until = self.world.now_ns() + span_ns;
        self.world.run_until(until);
    }

    /// Runs until a running leader holds a valid lease, at most `timeout_ns`.
    pub fn wait_for_leader(&mut self, timeout_ns: u64) -> Option<NodeId> {
        let deadline = self.world.now_ns() + timeout_ns;
        loop {
            let leader = self.world.node_ids().into_iter().find(|id| {
                self.world
                    .status(*id)
                    .is_some_and(|s| s.role == Role::Leader && s.leader_lease_valid)
            });
            if leader.is_some() || self.world.now_ns() >= deadline {
                return leader;
            }
            self.run_for(POLL_NS);
        }
    }
}
