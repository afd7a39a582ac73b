//! Simulated clients: each runs one operation at a time against a chosen node, with a
//! chosen durability or read level, and records it in the history. A client that times
//! out records `unknown` (reads included); a write refused with a retryable error is also recorded
//! `unknown` (the refusal does not prove the write was not applied), a refused read
//! `fail` (a read has no effect).
//!
//! Keys come in three classes so each checker gets the histories it is valid on:
//! `d*` keys are written only `durable` (linearizability of `linearizable` reads),
//! `m*` keys with every durability (monotonic reads), `c*` keys are counters (`incr`).
//!
//! With [`WorkloadConfig::txn_ppm`], a share of operations goes to a fourth class, `t*`
//! keys, written by transactions (`WATCH`, then `MULTI` ... `EXEC`; `txns.rs`) and by plain
//! reads, writes and deletes alike; each transaction is recorded as a `txn` record.
//!
//! With several keyspaces, each operation goes to a keyspace drawn at random, under the
//! same key names in every keyspace. Each keyspace has its own history and oracle (their
//! versions are independent), and every value written names its keyspace, so a read that
//! returns another keyspace's value is caught at once (`keyspace-isolation`).

use crate::engine::LeaderSim;
use crate::history::{durability_of, Finding, Op, OpKind, Oracle, Outcome, OPS_MAX};
use crate::rng::Rng;
use crate::world::{Keyspace, Notice, World};
use keel_check::history::View;
use keel_core::leader::{ClientReply, ClientRequest, RequestTag};
use keel_types::{
    ClientId, Command, CommandResult, Durability, KeelError, LogIndex, NodeId, ReadLevel, RequestId,
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
/// Timer class: a client's transaction is done watching and thinking; `EXEC` goes out.
pub const TIMER_TXN_EXEC: u64 = 4;
/// Most clients in one run.
pub const CLIENTS_MAX: u32 = 64;
/// Most writes with unknown outcome one `d*` key takes before clients move on to a fresh
/// key of the same slot (`d0`, then `d0g1`, `d0g2`, ...). Every unknown write stays
/// pending forever in the linearizability search, which is exponential in how many pile
/// up on one key; bounding them per key keeps the check decisive.
pub const UNKNOWN_WRITES_PER_KEY_MAX: u32 = 6;
/// Most items one simulated scan asks for.
pub const SCAN_LIMIT: u32 = 8;
/// Most key slots per class.
pub const KEYS_PER_CLASS_MAX: u32 = 16;

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
    /// Clients (the first ones) that only read: their session floor stays where it is, so
    /// a follower behind the others answers them itself, as a read-only service's
    /// clients are answered (the `membership` scenario has two or three). Four in five
    /// of their reads go to a node outside the voters, a learner if there is one: the
    /// read replica such a service is pointed at.
    pub readers: u32,
    /// Durabilities `m` and `c` writes choose from.
    pub durabilities: Vec<Durability>,
    /// Levels reads choose from.
    pub levels: Vec<ReadLevel>,
    /// Keyspaces operations spread over (uniformly).
    pub keyspaces: u32,
    /// The chance (ppm), each time a write reaches its deadline, that the client retries
    /// it with the same (client, request) pair at another node instead of giving up, at
    /// most [`RETRIES_MAX`] times; the op completes with whichever reply comes first.
    pub retry_ppm: u32,
    /// Seeds the retry draws, apart from the clients' other draws.
    pub retry_seed: u64,
    /// Writes go under deduplication sessions (`ClientId::SESSION_BIT`), one per client
    /// and keyspace, opened with `Command::OpenSession` before the first write and again
    /// after the engine answers `SessionExpired`; such a write is recorded `unknown`.
    pub sessions: bool,
    /// The chance (ppm) that a read at `monotonic` or `linearizable` is invoked as a
    /// Correctable: read at every level up to its own, weakest first, one after the
    /// other at the same node, each weaker answer recorded as a preliminary view
    /// (`Op::views`), as `KEEL.INVOKE` does.
    pub invoke_ppm: u32,
    /// Seeds the invocation draws, apart from the clients' other draws.
    pub invoke_seed: u64,
    /// Negative control: an invoked read's final view is recorded as its first
    /// preliminary view (a binding that never coordinated), so the final view can be
    /// stale; the views and monotonic checkers must catch it.
    pub unsafe_stale_final_view: bool,
    /// The share (ppm) of operations on `t*` keys: transactions (`txns.rs`) and plain
    /// reads, writes and deletes of those keys.
    pub txn_ppm: u32,
    /// Seeds the `t*` draws, apart from the clients' other draws.
    pub txn_seed: u64,
    /// The share (ppm) of `m*` puts sent as Redis's `SET ... PX ttl`, with a TTL of 1 to
    /// [`TTL_MS_MAX`] ms (recorded as puts: the value written; the key then leaves by the
    /// leader's expiry entry, which reads see as a delete at that entry's version).
    pub ttl_ppm: u32,
    /// Seeds the TTL draws, apart from the clients' other draws.
    pub ttl_seed: u64,
}

/// The longest TTL the clients' expiring writes ask for.
pub const TTL_MS_MAX: u64 = 400;

/// Most retries of one write.
pub const RETRIES_MAX: u32 = 3;

struct Inflight {
    op: Op,
    keyspace: Keyspace,
    /// Every attempt's tag (the first, then each retry's).
    tags: Vec<RequestTag>,
    recorded: bool,
    /// The request as first sent, for retries (writes only).
    request: Option<ClientRequest>,
    retries: u32,
    /// For an attempt to open a session (not an operation): the session's id.
    opening: Option<ClientId>,
    /// For a read invoked as a Correctable: the level being read now, the stronger ones
    /// still to read, and the node that serves them all.
    invocation: Option<(ReadLevel, Vec<ReadLevel>, NodeId)>,
    /// For a transaction: its record and the keys still to watch (`op` then only names
    /// it: its id and node).
    txn: Option<Box<TxnInflight>>,
}

/// A transaction in flight: watching its keys one after the other, thinking, then
/// waiting for `EXEC`'s reply.
struct TxnInflight {
    txn: keel_check::history::Txn,
    /// Keys still to watch, in order (the first is being read while `exec` is false).
    watch: Vec<String>,
    /// Whether `EXEC` was sent (or its timer set).
    exec: bool,
}

#[derive(Default)]
struct ClientState {
    next_request: u64,
    inflight: Option<Inflight>,
    /// The last value this client saw per keyspace and key (cas arguments).
    last_seen: BTreeMap<(Keyspace, String), Option<String>>,
    /// Per keyspace, the index of the latest write this client was answered for: its
    /// reads' session floor (`ClientRequest::after`).
    floor: BTreeMap<Keyspace, LogIndex>,
    /// Per keyspace, the open session its writes go under ([`WorkloadConfig::sessions`]).
    sessions: BTreeMap<Keyspace, ClientId>,
    /// Sessions this client has tried to open (each gets a new id).
    sessions_opened: u64,
}

/// One keyspace's history and what checks it as it grows.
#[derive(Default)]
struct KeyspaceState {
    /// Completed operations, in completion order.
    ops: Vec<Op>,
    /// Completed transactions, in completion order.
    txns: Vec<keel_check::history::Txn>,
    oracle: Oracle,
    /// Per `d*` key slot: its generation (which key name is current) and how many writes
    /// on that key ended `unknown`.
    durable_keys: Vec<(u32, u32)>,
}

/// Every client of a run, its histories and their oracles.
pub struct Clients {
    config: WorkloadConfig,
    rng: Rng,
    /// Retry draws ([`WorkloadConfig::retry_seed`]).
    retry_rng: Rng,
    /// Invocation draws ([`WorkloadConfig::invoke_seed`]).
    invoke_rng: Rng,
    /// `t*` draws ([`WorkloadConfig::txn_seed`]).
    txn_rng: Rng,
    /// Where read-only clients read ([`WorkloadConfig::readers`]).
    reader_rng: Rng,
    /// TTL draws ([`WorkloadConfig::ttl_seed`]).
    ttl_rng: Rng,
    /// Writes sent with a TTL.
    pub expiring_writes: u64,
    /// Transactions by how they ended (`txn-committed`, `txn-aborted`, `txn-failed`,
    /// `txn-unknown`), for the run's coverage.
    pub txn_outcomes: BTreeMap<&'static str, u64>,
    /// Writes retried with the same pair.
    pub retries: u64,
    /// Reads invoked as Correctables that completed with at least one preliminary view.
    pub invocations: u64,
    clients: Vec<ClientState>,
    by_tag: BTreeMap<RequestTag, usize>,
    keyspaces: Vec<KeyspaceState>,
    /// What the oracles found.
    pub findings: Vec<Finding>,
    next_op_id: u64,
    stopped: bool,
    /// The `tickets` scenario's organizer and retailers, beside the clients above.
    pub tickets: Option<crate::tickets::Tickets>,
    /// The `membership` scenario's operator, beside the clients above.
    pub membership: Option<crate::membership::Reconfigurer>,
    /// The `slots` scenario's mover and its clients, beside the clients above.
    pub slot_moves: Option<crate::slot_moves::SlotMoves>,
}

impl Clients {
    /// Clients with their own PRNG stream.
    pub fn new(config: WorkloadConfig, rng: Rng) -> Clients {
        // None when another workload takes their place (the `slots` scenario's).
        assert!(config.clients <= CLIENTS_MAX, "{} clients", config.clients);
        assert!(!config.durabilities.is_empty() && !config.levels.is_empty());
        assert!((1..=KEYS_PER_CLASS_MAX).contains(&config.keys_per_class.max(1)));
        assert!(config.keyspaces >= 1, "clients need a keyspace");
        let clients = (0..config.clients).map(|_| ClientState::default()).collect();
        let keyspaces = (0..config.keyspaces)
            .map(|_| KeyspaceState {
                durable_keys: vec![(0, 0); config.keys_per_class.max(1) as usize],
                ..KeyspaceState::default()
            })
            .collect();
        Clients {
            retry_rng: Rng::new(config.retry_seed),
            invoke_rng: Rng::new(config.invoke_seed),
            txn_rng: Rng::new(config.txn_seed),
            reader_rng: Rng::new(config.retry_seed ^ 0x5EAD_E500_0000_0001),
            ttl_rng: Rng::new(config.ttl_seed),
            expiring_writes: 0,
            txn_outcomes: BTreeMap::new(),
            retries: 0,
            invocations: 0,
            config,
            rng,
            clients,
            by_tag: BTreeMap::new(),
            keyspaces,
            findings: Vec::new(),
            next_op_id: 0,
            stopped: false,
            tickets: None,
            membership: None,
            slot_moves: None,
        }
    }

    /// Keyspace `ks`'s completed operations, in completion order.
    pub fn history(&self, ks: Keyspace) -> &[Op] {
        &self.keyspaces[ks as usize].ops
    }

    /// Keyspace `ks`'s completed transactions, in completion order.
    pub fn txns(&self, ks: Keyspace) -> &[keel_check::history::Txn] {
        &self.keyspaces[ks as usize].txns
    }

    /// Completed operations over every keyspace.
    pub fn ops_total(&self) -> usize {
        self.keyspaces.iter().map(|k| k.ops.len()).sum()
    }

    /// Every keyspace's operations, keyspace by keyspace; with several keyspaces each key
    /// carries its keyspace (`m0@2`), for a history file a person reads.
    pub fn combined_history(&self) -> Vec<Op> {
        let several = self.keyspaces.len() > 1;
        let mut all = Vec::with_capacity(self.ops_total());
        for (ks, state) in self.keyspaces.iter().enumerate() {
            for op in &state.ops {
                let mut op = op.clone();
                if several {
                    op.kind.rename_key(format!("{}@{ks}", op.kind.key()));
                }
                all.push(op);
            }
        }
        all
    }

    /// Every keyspace's transactions, keys renamed as [`Clients::combined_history`] does.
    pub fn combined_txns(&self) -> Vec<keel_check::history::Txn> {
        let several = self.keyspaces.len() > 1;
        let mut all = Vec::new();
        for (ks, state) in self.keyspaces.iter().enumerate() {
            for txn in &state.txns {
                let mut txn = txn.clone();
                if several {
                    crate::txns::rename_keys(&mut txn, &format!("@{ks}"));
                }
                all.push(txn);
            }
        }
        all
    }

    /// Schedules every client's first operation.
    pub fn start<E: LeaderSim>(&mut self, world: &mut World<E>) {
        for c in 0..self.clients.len() {
            self.schedule_wake(world, c);
        }
        if let Some(tickets) = &mut self.tickets {
            tickets.start(world);
        }
        if let Some(membership) = &mut self.membership {
            membership.start(world);
        }
        if let Some(slot_moves) = &mut self.slot_moves {
            slot_moves.start(world);
        }
    }

    /// No new operations after this; those in flight still complete or time out.
    pub fn stop(&mut self) {
        self.stopped = true;
        if let Some(tickets) = &mut self.tickets {
            tickets.stop();
        }
        if let Some(membership) = &mut self.membership {
            membership.stop();
        }
        if let Some(slot_moves) = &mut self.slot_moves {
            slot_moves.stop();
        }
    }

    /// Operations still in flight.
    pub fn in_flight(&self) -> usize {
        self.clients.iter().filter(|c| c.inflight.is_some()).count()
            + self.tickets.as_ref().map_or(0, |t| t.in_flight())
            + self.slot_moves.as_ref().map_or(0, |s| s.in_flight())
    }

    fn schedule_wake<E: LeaderSim>(&mut self, world: &mut World<E>, c: usize) {
        let at = world.now_ns() + self.rng.range(0, self.config.think_ns_max.max(1));
        world.set_timer(at, timer_id(TIMER_CLIENT_WAKE, c as u64));
    }

    /// Handles a notice meant for clients; returns false if it is not theirs.
    pub fn handle<E: LeaderSim>(&mut self, world: &mut World<E>, notice: &Notice) -> bool {
        if self.tickets.as_mut().is_some_and(|t| t.handle(world, notice)) {
            return true;
        }
        if self.membership.as_mut().is_some_and(|m| m.handle(world, notice)) {
            return true;
        }
        if self.slot_moves.as_mut().is_some_and(|m| m.handle(world, notice)) {
            return true;
        }
        match notice {
            Notice::Reply { reply, .. } => self.on_reply(world, reply),
            Notice::Timer { id } => match id >> TIMER_CLASS_SHIFT {
                TIMER_CLIENT_WAKE => {
                    self.on_wake(world, (id & ((1 << TIMER_CLASS_SHIFT) - 1)) as usize)
                }
                TIMER_CLIENT_DEADLINE => {
                    self.on_deadline(world, id & ((1 << TIMER_CLASS_SHIFT) - 1))
                }
                TIMER_TXN_EXEC => {
                    self.send_exec(world, (id & ((1 << TIMER_CLASS_SHIFT) - 1)) as usize)
                }
                _ => return false,
            },
        }
        true
    }

    fn on_wake<E: LeaderSim>(&mut self, world: &mut World<E>, c: usize) {
        if self.stopped || self.ops_total() >= OPS_MAX {
            return;
        }
        assert!(self.clients[c].inflight.is_none(), "client {c} woke with an op in flight");
        let t_class = self.config.txn_ppm > 0 && self.txn_rng.chance(self.config.txn_ppm);
        // The node first, then the keyspace (the draws every seed was run with), unless
        // keyspaces are placed on groups: then the keyspace first, and a node of its group.
        let placed = world.group(0).len() < world.node_ids().len();
        let keyspaces = self.config.keyspaces as usize;
        let draw_keyspace = |rng: &mut Rng| match keyspaces {
            1 => 0,
            n => rng.index(n) as Keyspace,
        };
        let (node, ks) = if placed {
            let ks = draw_keyspace(&mut self.rng);
            let nodes = world.group(ks);
            (nodes[self.rng.index(nodes.len())], ks)
        } else {
            let nodes = world.node_ids();
            let node = nodes[self.rng.index(nodes.len())];
            (node, draw_keyspace(&mut self.rng))
        };
        let mut node = node;
        let nodes = world.group(ks);
        if c < self.config.readers as usize && self.reader_rng.chance(800_000) {
            let outside = crate::membership::outside_voters(world);
            if !outside.is_empty() && nodes.len() == world.node_ids().len() {
                node = outside[self.reader_rng.index(outside.len())];
            }
        }
        if t_class && self.txn_rng.chance(crate::txns::TXN_SHARE_PPM) {
            return self.start_txn(world, c, node, ks);
        }
        let (kind, command, recorded) = match t_class {
            true => self.next_t_operation(c, ks),
            false => self.next_operation(c, ks),
        };
        let write = !matches!(kind, OpKind::Get { .. });
        let state = &mut self.clients[c];
        state.next_request += 1;
        let client = match (self.config.sessions && write, state.sessions.get(&ks)) {
            (true, Some(session)) => *session,
            // Open a session first; the drawn write is dropped.
            (true, None) => return self.open_session(world, c, node, ks, durability_of(&kind)),
            (false, _) => ClientId(c as u64 + 1),
        };
        let invocation = match &kind {
            OpKind::Get { level, .. }
                if recorded
                    && *level > ReadLevel::Any
                    && self.config.invoke_ppm > 0
                    && self.invoke_rng.chance(self.config.invoke_ppm) =>
            {
                let stronger =
                    ReadLevel::ALL.into_iter().filter(|l| l > &ReadLevel::Any && l <= level);
                Some((ReadLevel::Any, stronger.collect::<Vec<_>>(), node))
            }
            _ => None,
        };
        let request = ClientRequest {
            tag: RequestTag(0),
            client,
            request: RequestId(state.next_request),
            durability: durability_of(&kind),
            level: match (&kind, &invocation) {
                (_, Some((first, _, _))) => Some(*first),
                (OpKind::Get { level, .. }, None) => Some(*level),
                _ => None,
            },
            command,
            after: state.floor.get(&ks).copied().unwrap_or(LogIndex::ZERO),
            mode: Default::default(),
            named: false,
        };
        let retained = write.then(|| request.clone());
        let tag = world.submit_to(node, ks, request);
        let begun = self.begin(world, c, node, ks, kind, Some(tag));
        self.clients[c].inflight =
            Some(Inflight { recorded, request: retained, invocation, ..begun });
    }

    /// Begins client `c`'s operation `kind` at `node`: its history record and, if a
    /// request went out (`tag`), its deadline. The caller fills in the rest.
    fn begin<E: LeaderSim>(
        &mut self,
        world: &mut World<E>,
        c: usize,
        node: NodeId,
        ks: Keyspace,
        kind: OpKind,
        tag: Option<RequestTag>,
    ) -> Inflight {
        let op = Op {
            id: self.next_op_id,
            client: c as u64 + 1,
            kind,
            invoke_ns: world.now_ns(),
            complete_ns: None,
            outcome: Outcome::Unknown,
            node: Some(node.0),
            version: None,
            views: Vec::new(),
        };
        if let Some(tag) = tag {
            let deadline = world.now_ns() + self.config.op_timeout_ns;
            world.set_timer(deadline, timer_id(TIMER_CLIENT_DEADLINE, self.next_op_id));
            self.by_tag.insert(tag, c);
        }
        self.next_op_id += 1;
        Inflight {
            op,
            keyspace: ks,
            tags: tag.into_iter().collect(),
            recorded: false,
            request: None,
            retries: 0,
            opening: None,
            invocation: None,
            txn: None,
        }
    }

    /// A plain operation on a `t*` key, drawn from the `t*` generator: a read at a drawn
    /// level, a write or a delete (the keys transactions watch change under them).
    fn next_t_operation(&mut self, c: usize, ks: Keyspace) -> (OpKind, Command, bool) {
        let rng = &mut self.txn_rng;
        let key = crate::txns::key_name(rng.range(0, u64::from(self.config.keys_per_class.max(1))));
        let bytes = key.clone().into_bytes().into();
        let durability = self.config.durabilities[rng.index(self.config.durabilities.len())];
        match rng.range(0, 3) {
            0 => {
                let level = self.config.levels[rng.index(self.config.levels.len())];
                (OpKind::Get { key, level, result: None }, Command::Get { key: bytes }, true)
            }
            1 => (OpKind::Delete { key, durability }, Command::Delete { key: bytes }, true),
            _ => {
                let request = self.clients[c].next_request + 1;
                let several = self.config.keyspaces > 1;
                let value = format!("c{}r{request}t{}", c + 1, keyspace_suffix(several, ks));
                let command = Command::Put { key: bytes, value: value.clone().into_bytes().into() };
                (OpKind::Put { key, value, durability }, command, true)
            }
        }
    }

    /// Starts a transaction: its `WATCH` reads one after the other (or, watching nothing,
    /// `EXEC` after a think). Under sessions, a client without one opens it first and
    /// drops the transaction, as it does a write.
    fn start_txn<E: LeaderSim>(
        &mut self,
        world: &mut World<E>,
        c: usize,
        node: NodeId,
        ks: Keyspace,
    ) {
        let state = &mut self.clients[c];
        state.next_request += 1;
        if self.config.sessions && !state.sessions.contains_key(&ks) {
            return self.open_session(world, c, node, ks, None);
        }
        let several = self.config.keyspaces > 1;
        let suffix = keyspace_suffix(several, ks);
        let keys = u64::from(self.config.keys_per_class.max(1));
        let plan = crate::txns::draw(
            &mut self.txn_rng,
            c as u64 + 1,
            state.next_request,
            keys,
            &self.config.durabilities,
            &suffix,
        );
        let mut txn = plan.txn;
        txn.id = self.next_op_id;
        txn.invoke_ns = world.now_ns();
        txn.node = Some(node.0);
        let key = txn.ops[0].key().to_string();
        let kind = OpKind::Get { key, level: ReadLevel::Linearizable, result: None };
        let begun = self.begin(world, c, node, ks, kind, None);
        let pending = TxnInflight { txn, watch: plan.watch, exec: false };
        self.clients[c].inflight = Some(Inflight { txn: Some(Box::new(pending)), ..begun });
        self.watch_next(world, c);
    }

    /// Sends the next `WATCH` read of client `c`'s transaction, or, all read, sets the
    /// timer after which `EXEC` goes out.
    fn watch_next<E: LeaderSim>(&mut self, world: &mut World<E>, c: usize) {
        let inflight = self.clients[c].inflight.as_mut().expect("a transaction in flight");
        let pending = inflight.txn.as_mut().expect("a transaction");
        let Some(key) = pending.watch.first().cloned() else {
            pending.exec = true;
            let at = world.now_ns() + self.txn_rng.range(0, self.config.think_ns_max.max(1));
            world.set_timer(at, timer_id(TIMER_TXN_EXEC, c as u64));
            return;
        };
        let ks = inflight.keyspace;
        let node = NodeId(inflight.op.node.expect("set"));
        let command = match pending.txn.client % 2 {
            1 => Command::Fetch { key: key.into_bytes().into() },
            _ => Command::Get { key: key.into_bytes().into() },
        };
        let request = ClientRequest {
            tag: RequestTag(0),
            client: ClientId(c as u64 + 1),
            request: RequestId(self.clients[c].next_request),
            durability: None,
            level: Some(ReadLevel::Linearizable),
            command,
            after: self.clients[c].floor.get(&ks).copied().unwrap_or(LogIndex::ZERO),
            mode: Default::default(),
            named: false,
        };
        let tag = world.submit_to(node, ks, request);
        self.by_tag.insert(tag, c);
        let inflight = self.clients[c].inflight.as_mut().expect("checked");
        inflight.tags.push(tag);
        let deadline = world.now_ns() + self.config.op_timeout_ns;
        world.set_timer(deadline, timer_id(TIMER_CLIENT_DEADLINE, inflight.op.id));
    }

    /// `EXEC`: client `c`'s transaction as one `Command::Multi` under a new op id (so the
    /// watch phase's deadline no longer applies), retried like any write.
    fn send_exec<E: LeaderSim>(&mut self, world: &mut World<E>, c: usize) {
        let state = &self.clients[c];
        let Some(inflight) = state.inflight.as_ref() else { return };
        let thinking = inflight.txn.as_ref().is_some_and(|p| p.exec) && inflight.request.is_none();
        if !thinking {
            return; // a timer of a transaction given up on
        }
        let ks = inflight.keyspace;
        let client = match self.config.sessions {
            true => *state.sessions.get(&ks).expect("a transaction starts with a session"),
            false => ClientId(c as u64 + 1),
        };
        let (request, after) = (state.next_request, state.floor.get(&ks).copied());
        let id = self.next_op_id;
        self.next_op_id += 1;
        let inflight = self.clients[c].inflight.as_mut().expect("checked");
        let pending = inflight.txn.as_mut().expect("checked");
        let request = ClientRequest {
            tag: RequestTag(0),
            client,
            request: RequestId(request),
            durability: Some(pending.txn.durability),
            level: None,
            command: crate::txns::command(&pending.txn),
            after: after.unwrap_or(LogIndex::ZERO),
            mode: Default::default(),
            named: false,
        };
        pending.txn.id = id;
        inflight.op.id = id;
        inflight.request = Some(request.clone());
        let node = NodeId(inflight.op.node.expect("set"));
        let tag = world.submit_to(node, ks, request);
        self.by_tag.insert(tag, c);
        self.clients[c].inflight.as_mut().expect("checked").tags.push(tag);
        let deadline = world.now_ns() + self.config.op_timeout_ns;
        world.set_timer(deadline, timer_id(TIMER_CLIENT_DEADLINE, id));
    }

    /// A reply to client `c`'s transaction: a `WATCH` read (its version recorded, or the
    /// transaction dropped if it failed: nothing was sent that could apply) or `EXEC`'s.
    fn on_txn_reply<E: LeaderSim>(
        &mut self,
        world: &mut World<E>,
        c: usize,
        mut inflight: Inflight,
        reply: &ClientReply,
    ) {
        let ks = inflight.keyspace;
        let mut pending = inflight.txn.take().expect("a transaction");
        if inflight.request.is_none() {
            let (Ok(CommandResult::Value { version, .. })
            | Ok(CommandResult::Image { version, .. })) = &reply.result
            else {
                return self.schedule_wake(world, c); // no watch, no transaction
            };
            let key = pending.watch.remove(0);
            pending.txn.watch.push(crate::txns::watched(key, *version));
            inflight.txn = Some(pending);
            inflight.tags.clear();
            self.clients[c].inflight = Some(inflight);
            return self.watch_next(world, c);
        }
        if reply.result == Err(KeelError::SessionExpired) {
            self.clients[c].sessions.remove(&ks);
        }
        if let Some(version) = reply.result.as_ref().ok().and_then(|r| r.written_version()) {
            let floor = self.clients[c].floor.entry(ks).or_insert(LogIndex::ZERO);
            *floor = (*floor).max(version.index);
        }
        let mut txn = pending.txn;
        txn.complete_ns = Some(world.now_ns());
        txn.node = Some(reply.served_by.0);
        let outcome = crate::txns::complete(&mut txn, &reply.result);
        self.record_txn(world, ks, txn, outcome);
        self.schedule_wake(world, c);
    }

    /// Records a transaction that ended (`outcome`: how, for the coverage counts).
    fn record_txn<E: LeaderSim>(
        &mut self,
        world: &mut World<E>,
        ks: Keyspace,
        mut txn: keel_check::history::Txn,
        outcome: &'static str,
    ) {
        *self.txn_outcomes.entry(outcome).or_default() += 1;
        if txn.outcome == Outcome::Unknown {
            txn.complete_ns = None;
        }
        let state = &mut self.keyspaces[ks as usize];
        for (kind, detail) in state.oracle.complete_txn(&txn) {
            let detail =
                if self.config.keyspaces > 1 { format!("keyspace {ks}: {detail}") } else { detail };
            world.violate(kind, detail.clone());
            self.findings.push((kind, detail));
        }
        state.txns.push(txn);
    }

    /// Opens a deduplication session for client `c` in keyspace `ks` at `node`, at
    /// `durability` (the operation drawn is dropped).
    fn open_session<E: LeaderSim>(
        &mut self,
        world: &mut World<E>,
        c: usize,
        node: NodeId,
        ks: Keyspace,
        durability: Option<Durability>,
    ) {
        let state = &mut self.clients[c];
        state.sessions_opened += 1;
        let id = ClientId(ClientId::SESSION_BIT | state.sessions_opened << 8 | (c as u64 + 1));
        let request = ClientRequest {
            tag: RequestTag(0),
            client: id,
            request: RequestId(0),
            durability,
            level: None,
            command: Command::OpenSession { seen: None },
            after: state.floor.get(&ks).copied().unwrap_or(LogIndex::ZERO),
            mode: Default::default(),
            named: false,
        };
        let tag = world.submit_to(node, ks, request);
        let kind = OpKind::Get { key: String::new(), level: ReadLevel::Any, result: None };
        let begun = self.begin(world, c, node, ks, kind, Some(tag));
        self.clients[c].inflight = Some(Inflight { opening: Some(id), ..begun });
    }

    /// Draws the next operation in keyspace `ks`: its history form, its command, whether
    /// it is recorded.
    fn next_operation(&mut self, c: usize, ks: Keyspace) -> (OpKind, Command, bool) {
        let class = self.rng.index(3);
        let slot = self.rng.range(0, u64::from(self.config.keys_per_class.max(1))) as usize;
        let key = match class {
            0 => durable_key_name(slot, self.keyspaces[ks as usize].durable_keys[slot].0),
            _ => format!("{}{slot}", ["d", "m", "c"][class]),
        };
        let request = self.clients[c].next_request + 1;
        if self.rng.chance(self.config.read_ppm) || c < self.config.readers as usize {
            let level = self.config.levels[self.rng.index(self.config.levels.len())];
            if self.rng.chance(20_000) {
                let scan = Command::Scan {
                    start: key.clone().into_bytes().into(),
                    end: None,
                    limit: SCAN_LIMIT,
                };
                return (OpKind::Get { key, level, result: None }, scan, false);
            }
            let command = Command::Get { key: key.clone().into_bytes().into() };
            return (OpKind::Get { key, level, result: None }, command, true);
        }
        let durability = if class == 0 {
            Durability::Durable
        } else {
            self.config.durabilities[self.rng.index(self.config.durabilities.len())]
        };
        if class == 2 {
            let delta = self.rng.range(1, 6) as i64;
            let command = Command::Incr { key: key.clone().into_bytes().into(), delta };
            return (OpKind::Incr { key, delta, durability, result: None }, command, true);
        }
        let value = if self.config.keyspaces > 1 {
            format!("c{}r{request}k{ks}", c + 1)
        } else {
            format!("c{}r{request}", c + 1)
        };
        match self.rng.index(4) {
            0 => {
                let command = Command::Delete { key: key.clone().into_bytes().into() };
                (OpKind::Delete { key, durability }, command, true)
            }
            1 => {
                let seen = self.clients[c].last_seen.get(&(ks, key.clone()));
                let expected = seen.cloned().flatten();
                let command = Command::Cas {
                    key: key.clone().into_bytes().into(),
                    expected: expected.clone().map(Into::into),
                    new: value.clone().into_bytes().into(),
                };
                (OpKind::Cas { key, expected, value, durability }, command, true)
            }
            _ if class == 1 && self.ttl_rng.chance(self.config.ttl_ppm) => {
                self.expiring_writes += 1;
                let command = Command::Set {
                    key: key.clone().into_bytes().into(),
                    value: value.clone().into_bytes().into(),
                    cond: keel_types::SetCond::Always,
                    ttl: keel_types::Ttl::After(self.ttl_rng.range(1, TTL_MS_MAX + 1)),
                    now_ms: 0,
                };
                (OpKind::Put { key, value, durability }, command, true)
            }
            _ => {
                let command = Command::Put {
                    key: key.clone().into_bytes().into(),
                    value: value.clone().into_bytes().into(),
                };
                (OpKind::Put { key, value, durability }, command, true)
            }
        }
    }

    fn on_reply<E: LeaderSim>(&mut self, world: &mut World<E>, reply: &ClientReply) {
        let Some(c) = self.by_tag.remove(&reply.tag) else {
            return; // the client gave up on it already
        };
        let inflight =
            self.clients[c].inflight.take().expect("a tagged client has an op in flight");
        assert!(inflight.tags.contains(&reply.tag), "reply routed to the wrong client");
        for tag in &inflight.tags {
            self.by_tag.remove(tag);
        }
        let ks = inflight.keyspace;
        let mut inflight = inflight;
        if inflight.txn.is_some() {
            return self.on_txn_reply(world, c, inflight, reply);
        }
        if let Some((level, mut stronger, node)) = inflight.invocation.take() {
            if let (Ok(CommandResult::Value { value, version }), false) =
                (&reply.result, stronger.is_empty())
            {
                // A preliminary view: record it, read the next level at the same node.
                let text = value.as_ref().map(|b| String::from_utf8_lossy(b).into_owned());
                let at_ns = world.now_ns();
                inflight.op.views.push(View {
                    level,
                    result: text,
                    version: version.to_owned(),
                    at_ns,
                });
                let next = stronger.remove(0);
                let after = self.clients[c].floor.get(&ks).copied().unwrap_or(LogIndex::ZERO);
                let request = ClientRequest {
                    tag: RequestTag(0),
                    client: ClientId(c as u64 + 1),
                    request: RequestId(self.clients[c].next_request),
                    durability: None,
                    level: Some(next),
                    command: Command::Get {
                        key: inflight.op.kind.key().as_bytes().to_vec().into(),
                    },
                    after,
                    mode: Default::default(),
                    named: false,
                };
                let tag = world.submit_to(node, ks, request);
                self.by_tag.insert(tag, c);
                inflight.tags.push(tag);
                inflight.invocation = Some((next, stronger, node));
                self.clients[c].inflight = Some(inflight);
                return;
            }
        }
        if let Some(session) = inflight.opening {
            if reply.result.is_ok() {
                self.clients[c].sessions.insert(ks, session);
            }
            return self.schedule_wake(world, c);
        }
        if reply.result == Err(KeelError::SessionExpired) {
            self.clients[c].sessions.remove(&ks);
        }
        if let Some(version) = reply.result.as_ref().ok().and_then(|r| r.written_version()) {
            let floor = self.clients[c].floor.entry(ks).or_insert(LogIndex::ZERO);
            *floor = (*floor).max(version.index);
        }
        let mut op = inflight.op;
        op.complete_ns = Some(world.now_ns());
        op.node = Some(reply.served_by.0);
        self.fill_result(c, ks, &mut op, &reply.result);
        if let (Some(first), Outcome::Ok) = (op.views.first(), op.outcome) {
            self.invocations += 1;
            if self.config.unsafe_stale_final_view {
                let (result, version) = (first.result.clone(), first.version);
                if let OpKind::Get { result: final_result, .. } = &mut op.kind {
                    *final_result = result;
                }
                op.version = version;
            }
        }
        self.check_isolation(world, ks, &reply.result);
        if inflight.recorded {
            self.record(world, ks, op);
        } else if let Ok(CommandResult::Items { items }) = &reply.result {
            self.check_scan(world, ks, &op, items);
        }
        self.schedule_wake(world, c);
    }

    /// With several keyspaces every value names the keyspace it was written in: a read
    /// in `ks` that returns another keyspace's value breaks isolation.
    fn check_isolation<E: LeaderSim>(
        &mut self,
        world: &mut World<E>,
        ks: Keyspace,
        result: &Result<CommandResult, KeelError>,
    ) {
        if self.config.keyspaces == 1 {
            return;
        }
        let values: Vec<&[u8]> = match result {
            Ok(CommandResult::Value { value: Some(value), .. }) => vec![value.as_ref()],
            Ok(CommandResult::Items { items }) => {
                items.iter().map(|(_, v, _)| v.as_ref()).collect()
            }
            Ok(CommandResult::Cas { current: Some(value), .. }) => vec![value.as_ref()],
            _ => Vec::new(),
        };
        let suffix = format!("k{ks}");
        for value in values {
            let text = String::from_utf8_lossy(value);
            // Counters hold numbers, written by `incr`: they carry no keyspace.
            if text.parse::<i64>().is_err() && !text.ends_with(&suffix) {
                let detail = format!("a read in keyspace {ks} returned {text:?}");
                world.violate("keyspace-isolation", detail.clone());
                self.findings.push(("keyspace-isolation", detail));
            }
        }
    }

    /// Scans are not in the history (its format has no scan op); the oracle checks
    /// each returned item as a read at the scan's level instead.
    fn check_scan<E: LeaderSim>(
        &mut self,
        world: &mut World<E>,
        ks: Keyspace,
        scan: &Op,
        items: &[(keel_types::Key, keel_types::Value, keel_types::Version)],
    ) {
        assert!(items.len() <= SCAN_LIMIT as usize, "a scan returned more than its limit");
        for (key, value, version) in items {
            let key = String::from_utf8_lossy(key);
            let value = Some(String::from_utf8_lossy(value).into_owned());
            let oracle = &self.keyspaces[ks as usize].oracle;
            for (kind, detail) in oracle.check_scan_item(scan, &key, value, *version) {
                world.violate(kind, format!("scan: {detail}"));
                self.findings.push((kind, detail));
            }
        }
    }

    fn fill_result(
        &mut self,
        c: usize,
        ks: Keyspace,
        op: &mut Op,
        result: &Result<CommandResult, KeelError>,
    ) {
        let key = op.kind.key().to_string();
        let text = |v: &Option<keel_types::Value>| {
            v.as_ref().map(|b| String::from_utf8_lossy(b).into_owned())
        };
        op.outcome = match (result, &mut op.kind) {
            (Ok(CommandResult::Value { value, version }), OpKind::Get { result, .. }) => {
                *result = text(value);
                op.version = *version;
                self.clients[c].last_seen.insert((ks, key), text(value));
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
            // An expiring put (Redis's `SET`, which answers as a cas; it always writes).
            (Ok(CommandResult::Cas { swapped: true, version, .. }), OpKind::Put { .. }) => {
                op.version = *version;
                Outcome::Ok
            }
            (Ok(CommandResult::Cas { swapped, current, version }), OpKind::Cas { value, .. }) => {
                op.version = *version;
                let seen = if *swapped { Some(value.clone()) } else { text(current) };
                self.clients[c].last_seen.insert((ks, key), seen);
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
            // A session the table forgot: an earlier attempt (or a duplicated forward)
            // may have been applied.
            (Err(KeelError::Timeout | KeelError::SessionExpired), _) => Outcome::Unknown,
            (Err(e), OpKind::Get { .. }) if e.is_retryable() => Outcome::Fail,
            (Err(e), _) if e.is_retryable() => Outcome::Unknown,
            (Err(_), _) => Outcome::Fail,
        };
        if op.outcome == Outcome::Unknown {
            op.complete_ns = None;
        }
    }

    fn on_deadline<E: LeaderSim>(&mut self, world: &mut World<E>, op_id: u64) {
        let Some(c) =
            self.clients.iter().position(|s| s.inflight.as_ref().is_some_and(|i| i.op.id == op_id))
        else {
            return; // completed in time
        };
        let mut inflight = self.clients[c].inflight.take().expect("found above");
        if inflight.txn.as_ref().is_some_and(|t| inflight.request.is_none() || !t.exec) {
            // Watching, or thinking: nothing was sent that could apply.
            for tag in &inflight.tags {
                self.by_tag.remove(tag);
            }
            return self.schedule_wake(world, c);
        }
        let retry = !self.stopped
            && inflight.retries < RETRIES_MAX
            && self.retry_rng.chance(self.config.retry_ppm);
        if let (true, Some(request)) = (retry, inflight.request.clone()) {
            // Again, with the same pair, at another node: the engine must not apply it
            // twice, and the op completes with whichever attempt answers first.
            let nodes = world.group(inflight.keyspace);
            let node = nodes[self.retry_rng.index(nodes.len())];
            let tag = world.submit_to(node, inflight.keyspace, request);
            self.by_tag.insert(tag, c);
            inflight.tags.push(tag);
            inflight.retries += 1;
            self.retries += 1;
            let deadline = world.now_ns() + self.config.op_timeout_ns;
            world.set_timer(deadline, timer_id(TIMER_CLIENT_DEADLINE, op_id));
            self.clients[c].inflight = Some(inflight);
            return;
        }
        for tag in &inflight.tags {
            self.by_tag.remove(tag);
        }
        if let Some(pending) = inflight.txn {
            let mut txn = pending.txn;
            txn.outcome = Outcome::Unknown;
            self.record_txn(world, inflight.keyspace, txn, "txn-unknown");
        } else if inflight.recorded {
            debug_assert_eq!(inflight.op.outcome, Outcome::Unknown);
            self.record(world, inflight.keyspace, inflight.op);
        }
        self.schedule_wake(world, c);
    }

    fn record<E: LeaderSim>(&mut self, world: &mut World<E>, ks: Keyspace, op: Op) {
        if op.outcome == Outcome::Unknown && !matches!(op.kind, OpKind::Get { .. }) {
            self.count_unknown_write(ks, op.kind.key());
        }
        let state = &mut self.keyspaces[ks as usize];
        for (kind, detail) in state.oracle.complete(&op) {
            let detail =
                if self.config.keyspaces > 1 { format!("keyspace {ks}: {detail}") } else { detail };
            world.violate(kind, detail.clone());
            self.findings.push((kind, detail));
        }
        state.ops.push(op);
    }
}

impl Clients {
    /// Counts an unknown write on `key`; a `d*` key that reached
    /// [`UNKNOWN_WRITES_PER_KEY_MAX`] is retired and its slot moves to a fresh key.
    fn count_unknown_write(&mut self, ks: Keyspace, key: &str) {
        let durable_keys = &mut self.keyspaces[ks as usize].durable_keys;
        let slot = durable_keys
            .iter()
            .enumerate()
            .position(|(slot, (generation, _))| durable_key_name(slot, *generation) == key);
        let Some(slot) = slot else { return }; // not a `d*` key, or an already retired one
        let (generation, unknown) = &mut durable_keys[slot];
        *unknown += 1;
        assert!(*unknown <= UNKNOWN_WRITES_PER_KEY_MAX, "a full key was not retired");
        if *unknown == UNKNOWN_WRITES_PER_KEY_MAX {
            *generation += 1;
            *unknown = 0;
        }
    }
}

/// What ends every value written in keyspace `ks` (`k<ks>`) when there are several.
fn keyspace_suffix(several: bool, ks: Keyspace) -> String {
    if several {
        format!("k{ks}")
    } else {
        String::new()
    }
}

/// The name of generation `generation` of `d*` key slot `slot`: `d0`, `d0g1`, ...
fn durable_key_name(slot: usize, generation: u32) -> String {
    if generation == 0 {
        format!("d{slot}")
    } else {
        format!("d{slot}g{generation}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload() -> WorkloadConfig {
        WorkloadConfig {
            retry_ppm: 0,
            retry_seed: 0,
            sessions: false,
            clients: 2,
            keys_per_class: 2,
            op_timeout_ns: 1_000_000,
            think_ns_max: 1_000_000,
            read_ppm: 500_000,
            durabilities: Durability::ALL.to_vec(),
            levels: ReadLevel::ALL.to_vec(),
            keyspaces: 1,
            invoke_ppm: 0,
            invoke_seed: 0,
            unsafe_stale_final_view: false,
            txn_ppm: 0,
            txn_seed: 0,
            ttl_ppm: 0,
            ttl_seed: 0,
            readers: 0,
        }
    }

    #[test]
    fn a_durable_key_is_retired_after_its_unknown_writes() {
        let mut clients = Clients::new(workload(), Rng::new(1));
        assert_eq!(durable_key_name(1, 0), "d1");
        for _ in 0..UNKNOWN_WRITES_PER_KEY_MAX - 1 {
            clients.count_unknown_write(0, "d1");
        }
        let keys = |clients: &Clients| clients.keyspaces[0].durable_keys.clone();
        assert_eq!(keys(&clients)[1], (0, UNKNOWN_WRITES_PER_KEY_MAX - 1));
        clients.count_unknown_write(0, "d1");
        assert_eq!(keys(&clients)[1], (1, 0));
        // The retired name and other classes no longer count.
        clients.count_unknown_write(0, "d1");
        clients.count_unknown_write(0, "m1");
        assert_eq!(keys(&clients), vec![(0, 0), (1, 0)]);
        clients.count_unknown_write(0, "d1g1");
        assert_eq!(keys(&clients)[1], (1, 1));
    }
}
