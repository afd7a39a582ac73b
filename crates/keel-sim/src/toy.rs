//! A deliberately simple engine used to test the simulator itself: node 1 leads epoch 1
//! forever (no elections), acknowledges `memory` writes at once and every other write
//! once a majority has fsynced it, applies on append, and serves reads from its applied
//! state. Followers refuse clients with `NotLeader`.
//!
//! It keeps the driver's contract (hard state before messages, `LogSynced` after
//! fsync), so a fault-free run is clean; under crashes it loses acknowledged `memory`
//! writes it has served to readers, which the simulator's checkers must catch.

use crate::engine::SimEngine;
use keel_core::engine::{BootError, Engine, Report, RoleView};
use keel_core::leader::{
    ClientReply, ClientRequest, Config, Input, Lease, Message, Outputs, PersistedState, Role,
    Status,
};
use keel_core::time::{Span, Time};
use keel_types::{
    Command, CommandResult, Durability, Entry, EntryPayload, Epoch, HardState, KeelError, Key,
    LogIndex, NodeId, Value, Version,
};
use std::collections::BTreeMap;

/// Heartbeat and replication period of the toy leader.
const HEARTBEAT: Span = Span::from_millis(10);
/// Most entries in one toy `Append`.
const APPEND_MAX: usize = 64;
/// The toy's fixed epoch.
const EPOCH: Epoch = Epoch(1);
/// The toy's fixed leader.
const LEADER: NodeId = NodeId(1);

/// The toy engine.
pub struct ToyEngine {
    config: Config,
    log: Vec<Entry>,
    persisted: LogIndex,
    commit: LogIndex,
    hard_state_written: bool,
    kv: BTreeMap<Key, (Option<Value>, Version)>,
    follower_persisted: BTreeMap<NodeId, LogIndex>,
    follower_last: BTreeMap<NodeId, LogIndex>,
    waiting: Vec<(LogIndex, ClientRequest, CommandResult)>,
}

impl ToyEngine {
    fn last(&self) -> LogIndex {
        LogIndex(self.log.len() as u64)
    }

    fn is_leader(&self) -> bool {
        self.config.node_id == LEADER
    }

    fn apply(&mut self, command: &Command, version: Version) -> CommandResult {
        match command {
            Command::Put { key, value } => {
                self.kv.insert(key.clone(), (Some(value.clone()), version));
            }
            Command::Delete { key } => {
                self.kv.insert(key.clone(), (None, version)); // a tombstone
            }
            Command::Restore { key, image } => {
                let item = keel_core::leader::kv_image::decode(image, version);
                let value = item.ok().and_then(|item| item.value);
                self.kv.insert(key.clone(), (value, version));
            }
            Command::Incr { key, delta } => {
                let current = self
                    .kv
                    .get(key)
                    .and_then(|(v, _)| v.as_ref())
                    .and_then(|v| String::from_utf8_lossy(v).parse::<i64>().ok());
                let value = current.unwrap_or(0) + delta;
                self.kv.insert(key.clone(), (Some(value.to_string().into()), version));
                return CommandResult::Counter { value, version };
            }
            Command::Cas { key, expected, new } => {
                let current = self.kv.get(key).and_then(|(v, _)| v.clone());
                if current != *expected {
                    let found = self.kv.get(key).map(|(_, v)| *v);
                    return CommandResult::Cas { swapped: false, current, version: found };
                }
                self.kv.insert(key.clone(), (Some(new.clone()), version));
                return CommandResult::Cas { swapped: true, current, version: Some(version) };
            }
            Command::Get { .. }
            | Command::Fetch { .. }
            | Command::Scan { .. }
            | Command::QueuePeek { .. } => {
                unreachable!("reads are not logged")
            }
            Command::Enqueue { .. } | Command::Dequeue { .. } => {
                unreachable!("the toy engine runs no queues")
            }
            Command::Set { .. }
            | Command::Expire { .. }
            | Command::Inspect { .. }
            | Command::Flush { .. }
            | Command::SwapDb { .. }
            | Command::Count { .. }
            | Command::Modify { .. }
            | Command::Transfer { .. }
            | Command::Coll { .. }
            | Command::CollRead { .. } => unreachable!("the toy engine runs no Redis commands"),
            Command::Geo(_) => unreachable!("the toy engine runs no geo operations"),
            Command::Cluster(_) => unreachable!("the toy engine has a fixed membership"),
            Command::Slot(_) | Command::Asking(..) => {
                unreachable!("the toy engine serves no slots")
            }
            Command::OpenSession { .. } => {}
            Command::Multi { ops, watch } => return self.apply_multi(ops, watch, version),
        }
        CommandResult::Written { version }
    }

    /// A transaction: nothing if a watched key's version changed or an increment meets a
    /// value that is no integer (the toy reports both as an abort); else every operation.
    fn apply_multi(
        &mut self,
        ops: &[Command],
        watch: &[(Key, Option<Version>)],
        version: Version,
    ) -> CommandResult {
        let changed = watch.iter().any(|(key, seen)| self.kv.get(key).map(|(_, v)| *v) != *seen);
        let before = self.kv.clone();
        let mut results = Vec::with_capacity(ops.len());
        for op in ops.iter().filter(|_| !changed) {
            if let Command::Incr { key, .. } = op {
                let word = self.kv.get(key).and_then(|(v, _)| v.as_ref());
                if word.is_some_and(|v| String::from_utf8_lossy(v).parse::<i64>().is_err()) {
                    self.kv = before;
                    return CommandResult::Multi { results: None };
                }
            }
            results.push(match op {
                Command::Get { key } => {
                    let (value, version) =
                        self.kv.get(key).cloned().map_or((None, None), |(v, ver)| (v, Some(ver)));
                    CommandResult::Value { value, version }
                }
                write => self.apply(write, version),
            });
        }
        CommandResult::Multi { results: (!changed).then_some(results) }
    }

    fn client(&mut self, request: ClientRequest, out: &mut Outputs) {
        let node = self.config.node_id;
        let reply = |result| ClientReply {
            tag: request.tag,
            served_by: node,
            result,
            durability_round: false,
        };
        if !self.is_leader() {
            out.replies.push(reply(Err(KeelError::NotLeader { leader: Some(LEADER) })));
            return;
        }
        let result = match &request.command {
            Command::Get { key } => {
                let (value, version) =
                    self.kv.get(key).cloned().map_or((None, None), |(v, ver)| (v, Some(ver)));
                Ok(CommandResult::Value { value, version })
            }
            Command::Fetch { key } => {
                let (value, version) =
                    self.kv.get(key).cloned().map_or((None, None), |(v, ver)| (v, Some(ver)));
                let image = value.map(|v| keel_core::leader::kv_image::string(&v));
                Ok(CommandResult::Image { image, version })
            }
            Command::Scan { .. } => Ok(CommandResult::Items { items: Vec::new() }),
            command => {
                let index = self.last().next();
                let durability = request.durability.unwrap_or(Durability::Memory);
                let entry = Entry {
                    epoch: EPOCH,
                    index,
                    payload: EntryPayload::Write {
                        client: request.client,
                        request: request.request,
                        durability,
                        command: command.clone(),
                    },
                };
                self.log.push(entry.clone());
                out.append.push(entry);
                let result = self.apply(&command.clone(), Version { epoch: EPOCH, index });
                if durability != Durability::Memory {
                    self.waiting.push((index, request, result));
                    return;
                }
                Ok(result)
            }
        };
        out.replies.push(reply(result));
    }

    fn replicate(&self, now: Time, out: &mut Outputs) {
        for &to in self.config.members.iter().filter(|m| **m != LEADER) {
            let from = self.follower_last.get(&to).copied().unwrap_or_default();
            let from = from.min(self.last());
            let entries: Vec<Entry> =
                self.log.iter().skip(from.0 as usize).take(APPEND_MAX).cloned().collect();
            let prev_epoch = if from.0 == 0 { Epoch(0) } else { EPOCH };
            out.messages.push((
                to,
                Message::Append {
                    epoch: EPOCH,
                    prev_epoch,
                    prev_index: from,
                    entries,
                    commit_index: self.commit,
                    durable_index: self.commit,
                    lease: Lease::Granted { anchor: now },
                    flush_through: None,
                    sent_at: now,
                },
            ));
        }
    }

    fn advance_commit(&mut self, out: &mut Outputs) {
        let mut persisted: Vec<LogIndex> = self.follower_persisted.values().copied().collect();
        persisted.push(self.persisted);
        persisted.resize(self.config.members.len().max(persisted.len()), LogIndex::ZERO);
        persisted.sort_unstable_by(|a, b| b.cmp(a));
        let majority = self.config.members.len() / 2 + 1;
        self.commit = self.commit.max(persisted[majority - 1].min(self.last()));
        let commit = self.commit;
        let node = self.config.node_id;
        let (done, waiting): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.waiting).into_iter().partition(|(i, _, _)| *i <= commit);
        self.waiting = waiting;
        for (_, request, result) in done {
            out.replies.push(ClientReply {
                tag: request.tag,
                served_by: node,
                result: Ok(result),
                durability_round: false,
            });
        }
    }

    fn on_append(
        &mut self,
        prev_index: LogIndex,
        entries: Vec<Entry>,
        sent_at: Time,
        out: &mut Outputs,
    ) {
        if prev_index <= self.last() {
            for entry in entries {
                let i = entry.index.0 as usize;
                if i <= self.log.len() {
                    if self.log[i - 1] == entry {
                        continue;
                    }
                    self.log.truncate(i - 1);
                    self.persisted = self.persisted.min(self.last());
                    out.truncate_after =
                        Some(out.truncate_after.map_or(self.last(), |t| t.min(self.last())));
                    out.append.retain(|e| (e.index.0 as usize) < i);
                }
                self.log.push(entry.clone());
                out.append.push(entry);
            }
            out.sync_through = Some(self.last());
        }
        out.messages.push((LEADER, self.append_reply(sent_at)));
    }

    fn append_reply(&self, echo_sent_at: Time) -> Message {
        Message::AppendReply {
            epoch: EPOCH,
            success: true,
            last_index: self.last(),
            persisted_index: self.persisted,
            applied_index: self.last(),
            match_index: self.last(),
            released: false,
            echo_sent_at,
            sent_at: echo_sent_at,
        }
    }
}

impl SimEngine for ToyEngine {
    type Watch = crate::invariants::Checker;

    fn set_tag(request: &mut ClientRequest, tag: keel_core::engine::RequestTag) {
        request.tag = tag;
    }

    fn request_tag(request: &ClientRequest) -> keel_core::engine::RequestTag {
        request.tag
    }

    fn reply_tag(reply: &ClientReply) -> keel_core::engine::RequestTag {
        reply.tag
    }

    fn writes(request: &ClientRequest) -> bool {
        request.command.is_write()
    }

    fn across(message: &Message) -> Result<(Message, usize), String> {
        crate::codec::across::<Self>(message)
    }

    fn configure(
        template: &Config,
        node: NodeId,
        members: Vec<NodeId>,
        keyspace: u32,
        _spread_leaders: bool,
    ) -> Config {
        crate::engine::configure_leader(template, node, members, keyspace, false)
    }

    fn facts(message: &Message) -> crate::engine::MessageFacts<'_> {
        crate::engine::leader_facts(message)
    }

    fn drift_bound_ppm(config: &Config) -> u32 {
        config.clock_drift_ppm_max.min(100_000)
    }
}

impl Engine for ToyEngine {
    type Config = Config;
    type Message = Message;
    type Request = ClientRequest;
    type Reply = ClientReply;
    type Status = Status;
    type Record = Entry;

    fn boot(
        config: Config,
        persisted: PersistedState,
        _seed: u64,
        _now: Time,
    ) -> Result<Self, BootError> {
        let mut engine = ToyEngine {
            config,
            log: persisted.entries,
            persisted: LogIndex::ZERO,
            commit: LogIndex::ZERO,
            hard_state_written: persisted.hard_state.epoch == EPOCH,
            kv: BTreeMap::new(),
            follower_persisted: BTreeMap::new(),
            follower_last: BTreeMap::new(),
            waiting: Vec::new(),
        };
        engine.persisted = engine.last();
        for entry in engine.log.clone() {
            if let EntryPayload::Write { command, .. } = &entry.payload {
                engine.apply(command, entry.version());
            }
        }
        Ok(engine)
    }

    fn check_message(_message: &Message) -> Result<(), &'static str> {
        Ok(()) // the toy trusts its peers
    }

    fn check_invariants(&self) {
        assert!(self.persisted <= self.last(), "fsynced past the log's end");
        assert!(self.commit <= self.last(), "committed past the log's end");
        assert!(self.log.iter().enumerate().all(|(i, e)| e.index.0 == i as u64 + 1));
    }

    fn node_id(&self) -> NodeId {
        self.config.node_id
    }

    fn role(&self) -> RoleView {
        let role = if self.is_leader() { "leader" } else { "follower" };
        RoleView { role, leader: Some(LEADER), epoch: EPOCH.0 }
    }

    fn report(&self) -> Report {
        let status = serde_json::to_value(self.status()).expect("status serializes");
        Report { status, metrics: Vec::new() }
    }

    fn step(&mut self, now: Time, input: Input) -> Outputs {
        let mut out = Outputs::default();
        if !self.hard_state_written {
            let voted_for = self.is_leader().then_some(LEADER);
            out.hard_state =
                Some(HardState { epoch: EPOCH, voted_for, repair_floor: None, members_epoch: 0 });
            self.hard_state_written = true;
        }
        match input {
            Input::Tick if self.is_leader() => {
                // The leader fsyncs lazily, once per heartbeat (its writes are at risk).
                if self.persisted < self.last() {
                    out.sync_through = Some(self.last());
                }
                self.replicate(now, &mut out);
                out.wake_at = Some(now + HEARTBEAT);
            }
            Input::Tick | Input::SnapshotSaved { .. } => {}
            Input::Client(request) => self.client(request, &mut out),
            Input::Clients(requests) => {
                for request in requests {
                    self.client(request, &mut out);
                }
            }
            Input::LogSynced { index } => {
                self.persisted = self.persisted.max(index.min(self.last()));
                if self.is_leader() {
                    self.advance_commit(&mut out);
                }
            }
            Input::Message { from, message } => match message {
                Message::Append { prev_index, entries, sent_at, .. } if !self.is_leader() => {
                    self.on_append(prev_index, entries, sent_at, &mut out);
                }
                Message::AppendReply { last_index, persisted_index, .. } if self.is_leader() => {
                    self.follower_last.insert(from, last_index);
                    let p = self.follower_persisted.entry(from).or_default();
                    *p = (*p).max(persisted_index);
                    self.advance_commit(&mut out);
                }
                _ => {}
            },
        }
        self.check_invariants();
        out
    }

    fn status(&self) -> Status {
        Status {
            node_id: self.config.node_id,
            role: if self.is_leader() { Role::Leader } else { Role::Follower },
            epoch: EPOCH,
            leader: Some(LEADER),
            last_index: self.last(),
            commit_index: self.commit,
            durable_index: if self.is_leader() { self.commit } else { LogIndex::ZERO },
            persisted_index: self.persisted,
            applied_index: self.last(),
            active: true,
            active_set: Vec::new(),
            snapshot_index: LogIndex::ZERO,
            snapshot_held_bytes: 0,
            leader_lease_valid: self.is_leader(),
            repair_floor: None,
            dedup_clients_max: self.config.dedup_clients_max,
            voters: self.config.members.clone(),
            learners: Vec::new(),
            membership_index: LogIndex::ZERO,
            transfer_to: None,
            handed_over: false,
        }
    }
}
