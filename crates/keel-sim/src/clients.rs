//! Simulated clients: each runs one operation at a time against a chosen node, with a
//! chosen durability or read level, and records it in the history. A client that times
//! out records `unknown` (reads included); a write refused with a retryable error is also recorded
//! `unknown` (the refusal does not prove the write was not applied), a refused read
//! `fail` (a read has no effect).
//!
//! Keys come in three classes so each checker gets the histories it is valid on:
//! `d*` keys are written only `durable` (linearizability of `linearizable` reads),
//! `m*` keys with every durability (monotonic reads), `c*` keys are counters (`incr`).

use crate::engine::SimEngine;
use crate::history::{durability_of, Finding, Op, OpKind, Oracle, Outcome, OPS_MAX};
use crate::rng::Rng;
use crate::world::{Notice, World};
use keel_core::leader::{ClientReply, ClientRequest, RequestTag};
use keel_types::{
    ClientId, Command, CommandResult, Durability, KeelError, NodeId, ReadLevel, RequestId,
};
use std::collections::BTreeMap;

/// Timer ids carry their owner in the bits above this shift.
pub const TIMER_CLASS_SHIFT: u32 = 40;
/// Timer class: a client's think time ended.
pub const TIMER_CLIENT_WAKE: u64 = 1;
/// Timer class: a client's operation reached its deadline.
pub const TIMER_CLIENT_DEADLINE: u64 = 2;
/// Timer class: the nemesis acts.
pub const TIMER_NEMESIS: u64 = 3;
/// Most clients in one run.
pub const CLIENTS_MAX: u32 = 64;

/// The timer id for `class` and `payload`.
pub fn timer_id(class: u64, payload: u64) -> u64 {
    assert!(payload < 1 << TIMER_CLASS_SHIFT, "timer payload too large");
    class << TIMER_CLASS_SHIFT | payload
}

/// What clients do.
#[derive(Clone, Debug)]
pub struct WorkloadConfig {
    /// Number of clients.
    pub clients: u32,
    /// Keys per class (`d`, `m`, `c`).
    pub keys_per_class: u32,
    /// How long a client waits for a reply before recording `unknown`.
    pub op_timeout_ns: u64,
    /// Pause between a client's operations, uniform in `[0, think_ns_max)`.
    pub think_ns_max: u64,
    /// Share of reads, parts per million.
    pub read_ppm: u32,
    /// Durabilities `m` and `c` writes choose from.
    pub durabilities: Vec<Durability>,
    /// Levels reads choose from.
    pub levels: Vec<ReadLevel>,
}

struct Inflight {
    op: Op,
    tag: RequestTag,
    recorded: bool,
}

#[derive(Default)]
struct ClientState {
    next_request: u64,
    inflight: Option<Inflight>,
    /// The last value this client saw per key (cas arguments).
    last_seen: BTreeMap<String, Option<String>>,
}

/// Every client of a run, its history and its oracle.
pub struct Clients {
    config: WorkloadConfig,
    rng: Rng,
    clients: Vec<ClientState>,
    by_tag: BTreeMap<RequestTag, usize>,
    /// Completed operations, in completion order.
    pub ops: Vec<Op>,
    oracle: Oracle,
    /// What the oracle found.
    pub findings: Vec<Finding>,
    next_op_id: u64,
    stopped: bool,
}

impl Clients {
    /// Clients with their own PRNG stream.
    pub fn new(config: WorkloadConfig, rng: Rng) -> Clients {
        assert!((1..=CLIENTS_MAX).contains(&config.clients), "{} clients", config.clients);
        assert!(!config.durabilities.is_empty() && !config.levels.is_empty());
        let clients = (0..config.clients).map(|_| ClientState::default()).collect();
        Clients {
            config,
            rng,
            clients,
            by_tag: BTreeMap::new(),
            ops: Vec::new(),
            oracle: Oracle::default(),
            findings: Vec::new(),
            next_op_id: 0,
            stopped: false,
        }
    }

    /// Schedules every client's first operation.
    pub fn start<E: SimEngine>(&mut self, world: &mut World<E>) {
        for c in 0..self.clients.len() {
            self.schedule_wake(world, c);
        }
    }

    /// No new operations after this; those in flight still complete or time out.
    pub fn stop(&mut self) {
        self.stopped = true;
    }

    /// Operations still in flight.
    pub fn in_flight(&self) -> usize {
        self.clients.iter().filter(|c| c.inflight.is_some()).count()
    }

    fn schedule_wake<E: SimEngine>(&mut self, world: &mut World<E>, c: usize) {
        let at = world.now_ns() + self.rng.range(0, self.config.think_ns_max.max(1));
        world.set_timer(at, timer_id(TIMER_CLIENT_WAKE, c as u64));
    }

    /// Handles a notice meant for clients; returns false if it is not theirs.
    pub fn handle<E: SimEngine>(&mut self, world: &mut World<E>, notice: &Notice) -> bool {
        match notice {
            Notice::Reply { node, reply } => self.on_reply(world, *node, reply),
            Notice::Timer { id } => match id >> TIMER_CLASS_SHIFT {
                TIMER_CLIENT_WAKE => {
                    self.on_wake(world, (id & ((1 << TIMER_CLASS_SHIFT) - 1)) as usize)
                }
                TIMER_CLIENT_DEADLINE => {
                    self.on_deadline(world, id & ((1 << TIMER_CLASS_SHIFT) - 1))
                }
                _ => return false,
            },
        }
        true
    }

    fn on_wake<E: SimEngine>(&mut self, world: &mut World<E>, c: usize) {
        if self.stopped || self.ops.len() >= OPS_MAX {
            return;
        }
        assert!(self.clients[c].inflight.is_none(), "client {c} woke with an op in flight");
        let nodes = world.node_ids();
        let node = nodes[self.rng.index(nodes.len())];
        let (kind, command, recorded) = self.next_operation(c);
        let state = &mut self.clients[c];
        state.next_request += 1;
        let request = ClientRequest {
            tag: RequestTag(0),
            client: ClientId(c as u64 + 1),
            request: RequestId(state.next_request),
            durability: durability_of(&kind),
            level: match &kind {
                OpKind::Get { level, .. } => Some(*level),
                _ => None,
            },
            command,
        };
        let tag = world.submit(node, request);
        let op = Op {
            id: self.next_op_id,
            client: c as u64 + 1,
            kind,
            invoke_ns: world.now_ns(),
            complete_ns: None,
            outcome: Outcome::Unknown,
            node: Some(node.0),
            version: None,
        };
        let deadline = world.now_ns() + self.config.op_timeout_ns;
        world.set_timer(deadline, timer_id(TIMER_CLIENT_DEADLINE, self.next_op_id));
        self.next_op_id += 1;
        self.by_tag.insert(tag, c);
        self.clients[c].inflight = Some(Inflight { op, tag, recorded });
    }

    /// Draws the next operation: its history form, its command, whether it is recorded.
    fn next_operation(&mut self, c: usize) -> (OpKind, Command, bool) {
        let class = self.rng.index(3);
        let key = format!(
            "{}{}",
            ["d", "m", "c"][class],
            self.rng.range(0, u64::from(self.config.keys_per_class.max(1)))
        );
        let request = self.clients[c].next_request + 1;
        if self.rng.chance(self.config.read_ppm) {
            let level = self.config.levels[self.rng.index(self.config.levels.len())];
            if self.rng.chance(20_000) {
                let scan = Command::Scan { start: key.clone().into_bytes(), end: None, limit: 8 };
                return (OpKind::Get { key, level, result: None }, scan, false);
            }
            let command = Command::Get { key: key.clone().into_bytes() };
            return (OpKind::Get { key, level, result: None }, command, true);
        }
        let durability = if class == 0 {
            Durability::Durable
        } else {
            self.config.durabilities[self.rng.index(self.config.durabilities.len())]
        };
        if class == 2 {
            let delta = self.rng.range(1, 6) as i64;
            let command = Command::Incr { key: key.clone().into_bytes(), delta };
            return (OpKind::Incr { key, delta, durability, result: None }, command, true);
        }
        let value = format!("c{}r{request}", c + 1);
        match self.rng.index(4) {
            0 => {
                let command = Command::Delete { key: key.clone().into_bytes() };
                (OpKind::Delete { key, durability }, command, true)
            }
            1 => {
                let expected = self.clients[c].last_seen.get(&key).cloned().flatten();
                let command = Command::Cas {
                    key: key.clone().into_bytes(),
                    expected: expected.clone().map(String::into_bytes),
                    new: value.clone().into_bytes(),
                };
                (OpKind::Cas { key, expected, value, durability }, command, true)
            }
            _ => {
                let command = Command::Put {
                    key: key.clone().into_bytes(),
                    value: value.clone().into_bytes(),
                };
                (OpKind::Put { key, value, durability }, command, true)
            }
        }
    }

    fn on_reply<E: SimEngine>(&mut self, world: &mut World<E>, node: NodeId, reply: &ClientReply) {
        let Some(c) = self.by_tag.remove(&reply.tag) else {
            return; // the client gave up on it already
        };
        let inflight =
            self.clients[c].inflight.take().expect("a tagged client has an op in flight");
        assert_eq!(inflight.tag, reply.tag, "reply routed to the wrong client");
        let mut op = inflight.op;
        op.complete_ns = Some(world.now_ns());
        op.node = Some(reply.served_by.0);
        let _ = node;
        self.fill_result(c, &mut op, &reply.result);
        if inflight.recorded {
            self.record(world, op);
        }
        self.schedule_wake(world, c);
    }

    fn fill_result(&mut self, c: usize, op: &mut Op, result: &Result<CommandResult, KeelError>) {
        let key = op.kind.key().to_string();
        let text =
            |v: &Option<Vec<u8>>| v.as_ref().map(|b| String::from_utf8_lossy(b).into_owned());
        op.outcome = match (result, &mut op.kind) {
            (Ok(CommandResult::Value { value, version }), OpKind::Get { result, .. }) => {
                *result = text(value);
                op.version = *version;
                self.clients[c].last_seen.insert(key, text(value));
                Outcome::Ok
            }
            (Ok(CommandResult::Items { .. }), OpKind::Get { .. }) => Outcome::Ok,
            (
                Ok(CommandResult::Written { version }),
                OpKind::Put { .. } | OpKind::Delete { .. },
            ) => {
                op.version = Some(*version);
                Outcome::Ok
            }
            (Ok(CommandResult::Cas { swapped, current, version }), OpKind::Cas { value, .. }) => {
                op.version = *version;
                let seen = if *swapped { Some(value.clone()) } else { text(current) };
                self.clients[c].last_seen.insert(key, seen);
                if *swapped {
                    Outcome::Ok
                } else {
                    Outcome::Fail
                }
            }
            (Ok(CommandResult::Counter { value, version }), OpKind::Incr { result, .. }) => {
                *result = Some(*value);
                op.version = Some(*version);
                Outcome::Ok
            }
            (Ok(other), kind) => panic!("result {other:?} does not answer {kind:?}"),
            (Err(KeelError::Timeout), _) => Outcome::Unknown,
            (Err(e), OpKind::Get { .. }) if e.is_retryable() => Outcome::Fail,
            (Err(e), _) if e.is_retryable() => Outcome::Unknown,
            (Err(_), _) => Outcome::Fail,
        };
        if op.outcome == Outcome::Unknown {
            op.complete_ns = None;
        }
    }

    fn on_deadline<E: SimEngine>(&mut self, world: &mut World<E>, op_id: u64) {
        let Some(c) =
            self.clients.iter().position(|s| s.inflight.as_ref().is_some_and(|i| i.op.id == op_id))
        else {
            return; // completed in time
        };
        let inflight = self.clients[c].inflight.take().expect("found above");
        self.by_tag.remove(&inflight.tag);
        if inflight.recorded {
            debug_assert_eq!(inflight.op.outcome, Outcome::Unknown);
            self.record(world, inflight.op);
        }
        self.schedule_wake(world, c);
    }

    fn record<E: SimEngine>(&mut self, world: &mut World<E>, op: Op) {
        for (kind, detail) in self.oracle.complete(&op) {
            world.violate(kind, detail.clone());
            self.findings.push((kind, detail));
        }
        self.ops.push(op);
    }
}
