//! The `slots` scenario: hash slots move between the keyspaces of a sharded world while
//! clients read and write their keys, under every fault, through the engines' own slot
//! checks (`keel_core::leader::kv_slots`).
//!
//! - **The mover** moves one slot at a time from the keyspace serving it to another,
//!   by the steps `keel slots move` sends (import, migrate, then hold, fill and release
//!   batch by batch, then own and give), each to a random node of the keyspace's group
//!   (which forwards it to its leader), asked again with the same request number at
//!   another node when its answer does not come. Every move has a new, higher id.
//! - **The clients** each keep a slot map, starting from the configured owners, and
//!   follow what the engines answer as a Redis Cluster client does: `MOVED` (a
//!   [`KeelError::Redirect`] to stay) updates the map and sends the request there,
//!   `ASK` sends it once, as [`Command::Asking`], to the keyspace named, `TRYAGAIN`
//!   sends it again a little later. Writes are `durable` puts of unique values, reads
//!   `linearizable`. An attempt whose answer does not come ends its operation
//!   (`unknown` for a write).
//!
//! **Checked** at the end: the keys' history as one, whichever keyspaces served it,
//! linearizable (every acknowledged write kept, none applied twice, no read of an
//! overwritten value), with a read of every key after healing; and each moving slot
//! served by exactly one keyspace.

use crate::clients::{timer_id, TIMER_CLASS_SHIFT};
use crate::engine::LeaderSim;
use crate::history::{Op, OpKind, Outcome};
use crate::rng::Rng;
use crate::world::{Keyspace, Notice, World};
use keel_core::leader::{ClientReply, ClientRequest, RequestTag};
use keel_types::slots::{key_slot, SlotOp, SlotState};
use keel_types::{
    ClientId, Command, CommandResult, Durability, KeelError, Key, KeyspaceId, LogIndex, ReadLevel,
    RequestId,
};
use std::collections::BTreeMap;

/// Timer class of the scenario (above `membership.rs`'s).
pub const TIMER_SLOTS: u64 = 7;
/// The payload bit of the mover's timers (its clients' are their index).
const MOVER_BIT: u64 = 1 << 38;
/// The payload bit of an attempt's deadline (the attempt's number below it).
const DEADLINE_BIT: u64 = 1 << 37;
/// The payload bit of a pause before sending again (a client's index below it, or the
/// mover's step).
const AGAIN_BIT: u64 = 1 << 36;
/// The client id of the mover's requests.
const MOVER: ClientId = ClientId(0x5107_0000);
/// The first client id of the late copies of its steps (each a mover restarted, whose
/// deduplication pair is new: a copy the table cannot tell from a new request).
const LATE_BASE: u64 = 0x5107_0100;
/// The payload bit of a late copy's send (its index in the list below it).
const LATE_BIT: u64 = 1 << 35;
/// Chance (ppm) that an answered step is sent again later by a restarted mover; a
/// copy of the keys' images (`Fill`) more often, since it is what could undo writes.
const LATE_STEP_PPM: u32 = 150_000;
const LATE_FILL_PPM: u32 = 600_000;
/// The first client id of the scenario's clients.
const CLIENT_BASE: u64 = 0x5107_1000;
/// Keys of each moving slot, and most unknown writes one key takes before clients move
/// on to a fresh key of the slot (the linearizability search is exponential in them).
const KEYS_PER_SLOT: usize = 2;
const UNKNOWN_WRITES_PER_KEY_MAX: u32 = 6;
/// Most redirects and `TRYAGAIN`s one operation follows.
const HOPS_MAX: u32 = 40;

/// What the scenario does (drawn from its seed).
#[derive(Clone, Debug)]
pub struct SlotMovesConfig {
    /// Keyspaces the slots move between.
    pub keyspaces: u32,
    /// The slots that move: of the hash tags `{mv0}`, `{mv1}`, ...
    pub slots: usize,
    /// Clients.
    pub clients: usize,
    /// How long an attempt waits for its answer.
    pub attempt_timeout_ns: u64,
    /// Pause between a client's operations, uniform below it.
    pub think_ns_max: u64,
    /// Pause between one move and the next, uniform in `[0, gap_ns_max)`.
    pub gap_ns_max: u64,
    /// Keys the mover holds per batch.
    pub batch: u32,
}

impl SlotMovesConfig {
    /// A configuration drawn from `rng` for `keyspaces` keyspaces.
    pub fn draw(rng: &mut Rng, keyspaces: u32) -> SlotMovesConfig {
        SlotMovesConfig {
            keyspaces,
            slots: rng.range(2, 5) as usize,
            clients: rng.range(3, 7) as usize,
            attempt_timeout_ns: 1_000_000_000,
            think_ns_max: rng.range(1_000_000, 15_000_000),
            gap_ns_max: rng.range(1_000_000, 100_000_000),
            batch: rng.range(1, 4) as u32,
        }
    }
}

/// One attempt in flight: where it went, and how to send the next.
#[derive(Clone, Debug)]
struct Attempt {
    tag: RequestTag,
    keyspace: Keyspace,
    /// The attempt's number (its deadline's payload).
    number: u64,
}

/// A client of the scenario.
struct SlotClient {
    next_request: u64,
    /// Its slot map.
    map: BTreeMap<u16, Keyspace>,
    /// The operation in flight: its index in the history, its command, and its attempt.
    inflight: Option<(usize, Command, Attempt, u32)>,
    writes: u64,
}

/// A move in progress.
#[derive(Clone, Debug)]
struct Move {
    slot: u16,
    from: Keyspace,
    to: Keyspace,
    id: u64,
    /// What the batch held answered (keys and images), while it is being copied.
    batch: Vec<(Key, keel_types::Value)>,
}

/// The mover's step in flight.
#[derive(Clone, Debug)]
struct Step {
    keyspace: Keyspace,
    request: ClientRequest,
    attempt: Attempt,
    /// Waiting to be sent again (after a refusal that a later attempt may not get).
    paused: bool,
}

/// The scenario's clients, mover and checks.
pub struct SlotMoves {
    config: SlotMovesConfig,
    rng: Rng,
    /// The slots that move, with their keys' names (and each key's generation).
    slots: Vec<u16>,
    keys: Vec<Vec<(String, u32, u32)>>,
    /// The keyspace each slot is configured to (the world's keyspaces split them).
    configured: BTreeMap<u16, Keyspace>,
    /// Where the mover last moved each slot (its owner once that move is done).
    owner: BTreeMap<u16, Keyspace>,
    clients: Vec<SlotClient>,
    by_tag: BTreeMap<RequestTag, usize>,
    ops: Vec<Op>,
    moving: Option<Move>,
    step: Option<Step>,
    mover_requests: u64,
    moves: u64,
    attempts: u64,
    /// Late copies of answered steps, to be sent (`LATE_BIT`), and the tags of those sent
    /// (their answers are nobody's).
    late: Vec<(Keyspace, SlotOp)>,
    late_tags: std::collections::BTreeSet<RequestTag>,
    stopped: bool,
    /// Paths taken, for `--coverage` (`slots:*`).
    pub counts: BTreeMap<&'static str, u64>,
}

impl SlotMoves {
    /// The scenario for `config`, drawing from `rng`.
    pub fn new(config: SlotMovesConfig, rng: Rng) -> SlotMoves {
        let mut slots = Vec::new();
        let mut keys = Vec::new();
        let mut tag = 0;
        while slots.len() < config.slots {
            let slot = key_slot(format!("{{mv{tag}}}").as_bytes());
            if !slots.contains(&slot) {
                slots.push(slot);
                let names = (0..KEYS_PER_SLOT).map(|k| (format!("{{mv{tag}}}{k}"), 0, 0));
                keys.push(names.collect());
            }
            tag += 1;
        }
        let configured: BTreeMap<u16, Keyspace> =
            slots.iter().enumerate().map(|(i, s)| (*s, i as u32 % config.keyspaces)).collect();
        let clients = (0..config.clients)
            .map(|_| SlotClient {
                next_request: 1,
                map: configured.clone(),
                inflight: None,
                writes: 0,
            })
            .collect();
        SlotMoves {
            owner: configured.clone(),
            configured,
            config,
            rng,
            slots,
            keys,
            clients,
            by_tag: BTreeMap::new(),
            ops: Vec::new(),
            moving: None,
            step: None,
            mover_requests: 0,
            moves: 0,
            attempts: 0,
            late: Vec::new(),
            late_tags: Default::default(),
            stopped: false,
            counts: BTreeMap::new(),
        }
    }

    fn count(&mut self, path: &'static str) {
        *self.counts.entry(path).or_default() += 1;
    }

    /// Schedules every client's first operation and the first move.
    pub fn start<E: LeaderSim>(&mut self, world: &mut World<E>) {
        for c in 0..self.clients.len() {
            self.think(world, c);
        }
        let at = world.now_ns() + self.rng.range(0, self.config.gap_ns_max);
        world.set_timer(at, timer_id(TIMER_SLOTS, MOVER_BIT));
    }

    /// No new operations or moves (those in flight go on).
    pub fn stop(&mut self) {
        self.stopped = true;
    }

    /// Operations and steps in flight.
    pub fn in_flight(&self) -> usize {
        self.clients.iter().filter(|c| c.inflight.is_some()).count()
            + usize::from(self.step.is_some())
    }

    fn think<E: LeaderSim>(&mut self, world: &mut World<E>, c: usize) {
        let at = world.now_ns() + self.rng.range(0, self.config.think_ns_max);
        world.set_timer(at, timer_id(TIMER_SLOTS, c as u64));
    }

    /// Takes its own timers and replies; false for anything else.
    pub fn handle<E: LeaderSim>(&mut self, world: &mut World<E>, notice: &Notice) -> bool {
        match notice {
            Notice::Reply { reply, .. } => {
                if self.late_tags.remove(&reply.tag) {
                    return true;
                }
                if self.step.as_ref().is_some_and(|s| s.attempt.tag == reply.tag) {
                    self.on_step_reply(world, reply);
                    return true;
                }
                let Some(c) = self.by_tag.remove(&reply.tag) else { return false };
                self.on_reply(world, c, reply);
                true
            }
            Notice::Timer { id } if id >> TIMER_CLASS_SHIFT == TIMER_SLOTS => {
                let payload = id & ((1 << TIMER_CLASS_SHIFT) - 1);
                let (mover, deadline, again) = (
                    payload & MOVER_BIT != 0,
                    payload & DEADLINE_BIT != 0,
                    payload & AGAIN_BIT != 0,
                );
                if payload & LATE_BIT != 0 {
                    self.send_late(world, (payload & !LATE_BIT) as usize);
                    return true;
                }
                let rest = payload & !(MOVER_BIT | DEADLINE_BIT | AGAIN_BIT);
                match (mover, deadline, again) {
                    (true, true, _) => self.on_step_deadline(world, rest),
                    (true, false, true) if self.step.as_ref().is_some_and(|s| s.paused) => {
                        self.resend_step(world)
                    }
                    (true, false, true) => {} // answered meanwhile
                    (true, false, false) => self.next_step(world),
                    (false, true, _) => self.on_deadline(world, rest),
                    (false, false, true) => self.send_again(world, rest as usize),
                    (false, false, false) => self.next_op(world, rest as usize),
                }
                true
            }
            Notice::Timer { .. } => false,
        }
    }

    /// Sends `command` to a node of keyspace `ks`; the attempt.
    fn send<E: LeaderSim>(
        &mut self,
        world: &mut World<E>,
        ks: Keyspace,
        request: ClientRequest,
        mover: bool,
    ) -> Attempt {
        let group = world.group(ks);
        let node = group[self.rng.index(group.len())];
        let tag = world.submit_to(node, ks, request);
        self.attempts += 1;
        let number = self.attempts;
        let payload = DEADLINE_BIT | number | if mover { MOVER_BIT } else { 0 };
        let deadline = world.now_ns() + self.config.attempt_timeout_ns;
        world.set_timer(deadline, timer_id(TIMER_SLOTS, payload));
        Attempt { tag, keyspace: ks, number }
    }

    fn request(client: ClientId, request: u64, command: Command) -> ClientRequest {
        let write = command.is_write();
        ClientRequest {
            tag: RequestTag(0),
            client,
            request: RequestId(request),
            command,
            durability: write.then_some(Durability::Durable),
            level: (!write).then_some(ReadLevel::Linearizable),
            after: LogIndex::ZERO,
            mode: Default::default(),
            named: false,
        }
    }

    // The clients.

    /// Client `c`'s next operation: a read or a unique write of a key of a moving slot.
    fn next_op<E: LeaderSim>(&mut self, world: &mut World<E>, c: usize) {
        if self.stopped || self.clients[c].inflight.is_some() {
            return;
        }
        let s = self.rng.index(self.slots.len());
        let k = self.rng.index(KEYS_PER_SLOT);
        let read = self.rng.chance(400_000);
        self.begin(world, c, s, k, read);
    }

    fn begin<E: LeaderSim>(
        &mut self,
        world: &mut World<E>,
        c: usize,
        s: usize,
        k: usize,
        read: bool,
    ) {
        let slot = self.slots[s];
        let (base, generation, _) = &self.keys[s][k];
        let key = match generation {
            0 => base.clone(),
            g => format!("{base}.g{g}"),
        };
        self.clients[c].writes += u64::from(!read);
        let writes = self.clients[c].writes;
        let (kind, command) = match read {
            true => {
                let kind =
                    OpKind::Get { key: key.clone(), level: ReadLevel::Linearizable, result: None };
                (kind, Command::Get { key: Key::from(key.clone()) })
            }
            false => {
                let value = format!("c{c}w{writes}");
                let kind = OpKind::Put {
                    key: key.clone(),
                    value: value.clone(),
                    durability: Durability::Durable,
                };
                (kind, Command::Put { key: Key::from(key.clone()), value: value.into() })
            }
        };
        let ks = self.clients[c].map[&slot];
        let request = self.clients[c].next_request;
        self.clients[c].next_request += 1;
        let op = Op {
            id: self.ops.len() as u64 + 1,
            client: client_id(c).0,
            kind,
            invoke_ns: world.now_ns(),
            complete_ns: None,
            outcome: Outcome::Unknown,
            node: None,
            version: None,
            views: Vec::new(),
        };
        self.ops.push(op);
        let index = self.ops.len() - 1;
        let attempt =
            self.send(world, ks, Self::request(client_id(c), request, command.clone()), false);
        self.by_tag.insert(attempt.tag, c);
        self.clients[c].inflight = Some((index, command, attempt, 0));
    }

    /// Ends client `c`'s operation with `outcome` (a read's value, if it has one).
    fn end<E: LeaderSim>(
        &mut self,
        world: &mut World<E>,
        c: usize,
        outcome: Outcome,
        value: Option<Option<String>>,
    ) {
        let Some((index, _, attempt, _)) = self.clients[c].inflight.take() else { return };
        self.by_tag.remove(&attempt.tag);
        let op = &mut self.ops[index];
        op.outcome = outcome;
        if outcome != Outcome::Unknown {
            op.complete_ns = Some(world.now_ns());
        }
        if let (OpKind::Get { result, .. }, Some(value)) = (&mut op.kind, value) {
            *result = value;
        }
        if outcome == Outcome::Unknown && matches!(op.kind, OpKind::Put { .. }) {
            let key = op.kind.key().to_string();
            self.retire(&key);
        }
        if !self.stopped {
            self.think(world, c);
        }
    }

    /// Counts an unknown write of `key`; past the bound, its slot's clients move on to
    /// a fresh key.
    fn retire(&mut self, key: &str) {
        for keys in &mut self.keys {
            for (base, generation, unknown) in keys.iter_mut() {
                let name = match *generation {
                    0 => base.clone(),
                    g => format!("{base}.g{g}"),
                };
                if name == key {
                    *unknown += 1;
                    if *unknown >= UNKNOWN_WRITES_PER_KEY_MAX {
                        *generation += 1;
                        *unknown = 0;
                    }
                }
            }
        }
    }

    fn on_reply<E: LeaderSim>(&mut self, world: &mut World<E>, c: usize, reply: &ClientReply) {
        let Some((index, command, attempt, hops)) = self.clients[c].inflight.clone() else {
            return;
        };
        if attempt.tag != reply.tag {
            return;
        }
        let read = !command.is_write();
        match &reply.result {
            Ok(CommandResult::Value { value, .. }) if read => {
                let value = value.as_ref().map(|v| String::from_utf8_lossy(v).into_owned());
                self.ops[index].node = Some(reply.served_by.0);
                self.end(world, c, Outcome::Ok, Some(value));
            }
            Ok(CommandResult::Written { .. }) if !read => {
                self.ops[index].node = Some(reply.served_by.0);
                self.end(world, c, Outcome::Ok, None);
            }
            Ok(other) => {
                let detail = format!("client {c}: {command:?} answered {other:?}");
                world.violate("slots-answer", detail);
            }
            Err(KeelError::Redirect { keyspace, ask, slot }) if hops < HOPS_MAX => {
                let ks = keyspace.0;
                let command = match ask {
                    Some(id) => {
                        self.count("slots:ask");
                        Command::Asking(*id, Box::new(command.unasked().0.clone()))
                    }
                    None => {
                        self.count("slots:moved");
                        self.clients[c].map.insert(*slot, ks);
                        command.unasked().0.clone()
                    }
                };
                self.resend(world, c, ks, command, hops + 1);
            }
            Err(KeelError::TryAgain(_)) if hops < HOPS_MAX => {
                self.count("slots:tryagain");
                // Again at the same keyspace, a little later (`send_again`).
                if let Some(inflight) = self.clients[c].inflight.as_mut() {
                    inflight.3 = hops + 1;
                    inflight.2.number = 0; // its deadline no longer counts
                }
                let at = world.now_ns() + self.rng.range(2_000_000, 20_000_000);
                world.set_timer(at, timer_id(TIMER_SLOTS, AGAIN_BIT | c as u64));
            }
            // A refused write may still have been applied (a forwarded copy): unknown.
            Err(_) if !read => self.end(world, c, Outcome::Unknown, None),
            Err(_) => self.end(world, c, Outcome::Fail, None),
        }
    }

    /// Sends client `c`'s operation again, as `command`, to keyspace `ks`, under a new
    /// request number: the refused attempt is final for its own (a redirect is
    /// remembered under it; `TRYAGAIN` changed nothing).
    fn resend<E: LeaderSim>(
        &mut self,
        world: &mut World<E>,
        c: usize,
        ks: Keyspace,
        command: Command,
        hops: u32,
    ) {
        let Some((index, _, old, _)) = self.clients[c].inflight.take() else { return };
        self.by_tag.remove(&old.tag);
        let request = self.clients[c].next_request;
        self.clients[c].next_request += 1;
        let attempt =
            self.send(world, ks, Self::request(client_id(c), request, command.clone()), false);
        self.by_tag.insert(attempt.tag, c);
        self.clients[c].inflight = Some((index, command, attempt, hops));
    }

    /// Client `c`'s operation again, at the keyspace that answered `TRYAGAIN`.
    fn send_again<E: LeaderSim>(&mut self, world: &mut World<E>, c: usize) {
        let Some((_, command, attempt, hops)) = self.clients[c].inflight.clone() else { return };
        self.resend(world, c, attempt.keyspace, command, hops);
    }

    fn on_deadline<E: LeaderSim>(&mut self, world: &mut World<E>, number: u64) {
        let timed_out = self
            .clients
            .iter()
            .position(|cl| cl.inflight.as_ref().is_some_and(|(_, _, a, _)| a.number == number));
        let Some(c) = timed_out else { return };
        let read = !self.clients[c].inflight.as_ref().expect("found").1.is_write();
        self.count("slots:client-timeout");
        let outcome = if read { Outcome::Fail } else { Outcome::Unknown };
        self.end(world, c, outcome, None);
    }

    /// After healing: every key read once more (its latest generation), so that a write
    /// lost at the end is caught.
    pub fn final_reads<E: LeaderSim>(&mut self, world: &mut World<E>) {
        let mut c = 0;
        for s in 0..self.slots.len() {
            for k in 0..KEYS_PER_SLOT {
                while self.clients[c % self.clients.len()].inflight.is_some() && c < 1000 {
                    c += 1;
                }
                let client = c % self.clients.len();
                if self.clients[client].inflight.is_none() {
                    self.begin(world, client, s, k, true);
                }
                c += 1;
            }
        }
    }

    // The mover.

    /// Starts the next move, or sends the next step of the one in progress.
    fn next_step<E: LeaderSim>(&mut self, world: &mut World<E>) {
        if self.step.is_some() {
            return;
        }
        let Some(current) = self.moving.clone() else {
            if self.stopped {
                return;
            }
            let slot = self.slots[self.rng.index(self.slots.len())];
            let from = self.owner[&slot];
            let others: Vec<Keyspace> = (0..self.config.keyspaces).filter(|k| *k != from).collect();
            let to = others[self.rng.index(others.len())];
            self.moves += 1;
            let id = self.moves;
            self.moving = Some(Move { slot, from, to, id, batch: Vec::new() });
            let import = SlotOp::Import { first: slot, last: slot, from: KeyspaceId(from), id };
            return self.send_step(world, to, import);
        };
        // A move is in progress: its steps follow each other's answers.
        let _ = current;
    }

    fn send_step<E: LeaderSim>(&mut self, world: &mut World<E>, ks: Keyspace, op: SlotOp) {
        self.mover_requests += 1;
        let request = Self::request(MOVER, self.mover_requests, Command::Slot(op));
        let attempt = self.send(world, ks, request.clone(), true);
        self.step = Some(Step { keyspace: ks, request, attempt, paused: false });
    }

    /// The same step again (same request number) at another node of its keyspace.
    fn resend_step<E: LeaderSim>(&mut self, world: &mut World<E>) {
        let Some(step) = self.step.take() else { return };
        let attempt = self.send(world, step.keyspace, step.request.clone(), true);
        self.step = Some(Step { attempt, paused: false, ..step });
    }

    /// Perhaps schedules a late copy of the answered step `op` (see [`LATE_STEP_PPM`]),
    /// 5 to 300 ms later: after the steps that follow it, and the clients' writes.
    fn aim_late_copy<E: LeaderSim>(&mut self, world: &mut World<E>, ks: Keyspace, op: &SlotOp) {
        let fill = matches!(op, SlotOp::Fill { .. });
        if !self.rng.chance(if fill { LATE_FILL_PPM } else { LATE_STEP_PPM }) {
            return;
        }
        self.late.push((ks, op.clone()));
        let at = world.now_ns() + self.rng.range(5_000_000, 300_000_000);
        world.set_timer(at, timer_id(TIMER_SLOTS, LATE_BIT | (self.late.len() - 1) as u64));
        self.count(if fill { "fault:late-fill-copy" } else { "fault:late-step-copy" });
    }

    /// Sends late copy `i`, as a restarted mover would.
    fn send_late<E: LeaderSim>(&mut self, world: &mut World<E>, i: usize) {
        let (ks, op) = self.late[i].clone();
        let client = ClientId(LATE_BASE + i as u64);
        let request = Self::request(client, 1, Command::Slot(op));
        let group = world.group(ks);
        let node = group[self.rng.index(group.len())];
        let tag = world.submit_to(node, ks, request);
        self.late_tags.insert(tag);
    }

    fn on_step_deadline<E: LeaderSim>(&mut self, world: &mut World<E>, number: u64) {
        if self.step.as_ref().is_some_and(|s| s.attempt.number == number) {
            self.count("slots:step-timeout");
            self.resend_step(world);
        }
    }

    fn on_step_reply<E: LeaderSim>(&mut self, world: &mut World<E>, reply: &ClientReply) {
        let step = self.step.take().expect("the caller matched it");
        let Command::Slot(op) = &step.request.command else {
            unreachable!("the mover sends steps")
        };
        let op = op.clone();
        let result = match &reply.result {
            Ok(result) => result.clone(),
            Err(
                error @ (KeelError::NotLeader { .. }
                | KeelError::Busy(_)
                | KeelError::Timeout
                | KeelError::Unavailable(_)
                | KeelError::NotActive),
            ) => {
                self.count(match error {
                    KeelError::NotLeader { .. } => "slots:step-no-leader",
                    KeelError::Busy(_) => "slots:step-busy",
                    _ => "slots:step-retried",
                });
                // The same step, a little later, at another node.
                let attempt = Attempt { number: 0, ..step.attempt };
                self.step = Some(Step { attempt, paused: true, ..step });
                let at = world.now_ns() + self.rng.range(5_000_000, 30_000_000);
                return world.set_timer(at, timer_id(TIMER_SLOTS, MOVER_BIT | AGAIN_BIT));
            }
            Err(error) => {
                let detail = format!("move {:?}: {} refused: {error}", self.moving, op.name());
                return world.violate("slots-move-refused", detail);
            }
        };
        self.aim_late_copy(world, step.keyspace, &op);
        let mut current = self.moving.clone().expect("a step belongs to a move");
        let (slot, id) = (current.slot, current.id);
        let next = match (&op, result) {
            (SlotOp::Import { .. }, _) => Some((
                current.from,
                SlotOp::Migrate { first: slot, last: slot, to: KeyspaceId(current.to), id },
            )),
            (SlotOp::Migrate { .. } | SlotOp::Release { .. }, _) => {
                Some((current.from, SlotOp::Hold { slot, count: self.config.batch, id }))
            }
            (SlotOp::Hold { .. }, CommandResult::Items { items }) if items.is_empty() => {
                Some((current.to, SlotOp::Own { first: slot, last: slot, id }))
            }
            (SlotOp::Hold { .. }, CommandResult::Items { items }) => {
                current.batch = items.into_iter().map(|(k, image, _)| (k, image)).collect();
                *self.counts.entry("slots:keys-copied").or_default() += current.batch.len() as u64;
                Some((current.to, SlotOp::Fill { slot, items: current.batch.clone(), id }))
            }
            (SlotOp::Fill { .. }, _) => {
                let keys = current.batch.iter().map(|(k, _)| k.clone()).collect();
                Some((current.from, SlotOp::Release { slot, keys, id }))
            }
            (SlotOp::Own { .. }, _) => {
                Some((current.from, SlotOp::Give { first: slot, last: slot, id }))
            }
            (SlotOp::Give { .. }, _) => {
                self.owner.insert(slot, current.to);
                self.count("slots:moves-done");
                None
            }
            (op, result) => {
                let detail = format!("{} answered {result:?}", op.name());
                return world.violate("slots-answer", detail);
            }
        };
        match next {
            Some((ks, op)) => {
                self.moving = Some(current);
                self.send_step(world, ks, op);
            }
            None => {
                self.moving = None;
                let at = world.now_ns() + self.rng.range(0, self.config.gap_ns_max);
                world.set_timer(at, timer_id(TIMER_SLOTS, MOVER_BIT));
            }
        }
    }

    // The checks.

    /// The history of the moving keys.
    pub fn history(&self) -> &[Op] {
        &self.ops
    }

    /// The end-of-run checks (module docs): the history linearizable, and each moving
    /// slot served by one keyspace, as the keyspaces' leaders' applied states say.
    pub fn check<E: LeaderSim>(&mut self, world: &mut World<E>) {
        let ops = keel_check::keel::lin_ops(&self.ops);
        let config =
            keel_check::linearizability::Config { budget_steps: crate::scenario::LIN_BUDGET_STEPS };
        let report =
            keel_check::linearizability::check(keel_check::model::Model::Keel, &ops, config);
        match report.verdict {
            keel_check::linearizability::Verdict::NotLinearizable(counterexample) => {
                world.violate("slots-linearizability", counterexample.to_string());
            }
            keel_check::linearizability::Verdict::Unknown { key, budget_steps } => {
                let detail = format!("key {key}: search budget of {budget_steps} steps exhausted");
                world.violate("linearizability-unknown", detail);
            }
            _ => {}
        }
        for &slot in &self.slots.clone() {
            let mut serving = Vec::new();
            for ks in 0..self.config.keyspaces {
                let Some(node) = most_applied(world, ks) else { continue };
                let Some(states) = world.slot_states_in(node, ks) else { continue };
                let state = states.into_iter().find(|(s, _)| *s == slot).map(|(_, st)| st);
                let serves = match state {
                    None => self.configured[&slot] == ks,
                    Some(SlotState::Owned { .. } | SlotState::Migrating { .. }) => true,
                    Some(SlotState::Importing { .. } | SlotState::Released { .. }) => false,
                };
                if serves {
                    serving.push(ks);
                }
            }
            if serving.len() != 1 {
                let seen: Vec<String> = (0..self.config.keyspaces)
                    .map(|ks| {
                        let node = most_applied(world, ks);
                        let state = node
                            .and_then(|n| world.slot_states_in(n, ks))
                            .and_then(|all| all.into_iter().find(|(s, _)| *s == slot));
                        format!("{ks}: at {node:?} {state:?}")
                    })
                    .collect();
                let detail =
                    format!("slot {slot} served by keyspaces {serving:?} ({})", seen.join("; "));
                world.violate("slots-served-once", detail);
            }
        }
        *self.counts.entry("slots:ops").or_default() += self.ops.len() as u64;
    }
}

/// The running replica of keyspace `ks` that applied the most (after converging, every
/// replica applied the whole durable log: any of them), if one runs.
fn most_applied<E: LeaderSim>(world: &World<E>, ks: Keyspace) -> Option<keel_types::NodeId> {
    let running = world.group(ks).into_iter().filter_map(|n| Some((n, world.status_in(n, ks)?)));
    running.max_by_key(|(_, status)| status.applied_index).map(|(n, _)| n)
}

/// Client `c`'s id.
fn client_id(c: usize) -> ClientId {
    ClientId(CLIENT_BASE + c as u64)
}
