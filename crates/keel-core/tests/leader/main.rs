//! Scenario tests of the leader engine over a small cluster harness: N engines, each
//! driven by the loop body the server and the simulator run (`keel_exec::Replica`, with
//! no append hold) onto a virtual-time disk over
//! the real write-ahead log on a simulated disk (`keel_exec::VirtualDisk<SimStorage>`),
//! as the simulator and the server drive them, and a network with fixed latency and
//! partitionable links. Time is virtual; every wait is for a condition with a bound.

use keel_core::leader::*;
use keel_core::time::{Span, Time};
use keel_exec::{AppendHold, Completion, Front, Io, Replica, VirtualDisk};
use keel_storage::{SimStorage, Storage, StorageConfig};
use keel_types::{
    ClientId, ClusterOp, Command, CommandResult, Durability, Entry, EntryPayload, Epoch, HardState,
    KeelError, Key, LogIndex, Membership, NodeId, ReadLevel, RequestId, Value, Version,
};
use std::collections::{BTreeMap, BTreeSet};

mod gate;

const MS: u64 = 1_000_000;

enum Event {
    Deliver { from: NodeId, to: NodeId, message: Message },
    Disk { node: NodeId, incarnation: u64 },
    Prepared { node: NodeId, incarnation: u64, meta: keel_types::SnapshotMeta, data: SnapshotBytes },
}

struct Node {
    replica: Option<Replica<LeaderEngine>>,
    disk: VirtualDisk<SimStorage>,
    incarnation: u64,
    wake_at: Option<Time>,
    offset: u64,
    /// Log fsyncs its disk completed.
    log_syncs: u64,
}

/// A blank disk; `Cluster::boot` recovers it.
fn fresh_disk() -> VirtualDisk<SimStorage> {
    VirtualDisk::new(SimStorage::new_sim(StorageConfig::small_segments(64 * 1024)))
}

/// What leaves a replica during one call, in order.
enum Left {
    Send(NodeId, Message),
    Reply(ClientReply),
    Prepare(keel_types::SnapshotMeta, SnapshotBytes),
}

/// The harness's side of a replica's outputs: collected, carried out after the call.
#[derive(Default)]
struct Collect {
    left: Vec<Left>,
    log_syncs: u64,
    rejected: Vec<keel_core::engine::Rejection>,
}

impl Io<LeaderEngine> for Collect {
    fn send(&mut self, to: NodeId, message: Message) {
        self.left.push(Left::Send(to, message));
    }

    fn reply(&mut self, reply: ClientReply) {
        self.left.push(Left::Reply(reply));
    }

    fn prepare(&mut self, meta: keel_types::SnapshotMeta, data: SnapshotBytes) {
        self.left.push(Left::Prepare(meta, data));
    }

    fn rejected(&mut self, rejection: keel_core::engine::Rejection) {
        self.rejected.push(rejection);
    }

    fn completed(&mut self, completion: &Completion) {
        if matches!(completion, Completion::Synced { .. }) {
            self.log_syncs += 1;
        }
    }
}

struct Cluster {
    nodes: BTreeMap<NodeId, Node>,
    config: Config,
    now: u64,
    seq: u64,
    queue: BTreeMap<(u64, u64), Event>,
    blocked: BTreeSet<(NodeId, NodeId)>,
    latency: u64,
    fsync: u64,
    /// Per-node fsync latency overriding `fsync` (a slow disk).
    fsync_of: BTreeMap<NodeId, u64>,
    replies: Vec<(NodeId, ClientReply)>,
    next_tag: u64,
    seed: u64,
    /// Whether every step checks the cross-node invariants (off where forged messages
    /// are fed on purpose: they may break what only authentication protects).
    check: bool,
    /// Entries and value bytes of the largest `Append` sent, by value bytes.
    largest_append: (usize, usize),
    /// The session floor requests carry (`ClientRequest::after`).
    after: LogIndex,
    /// Nodes to which every `Append` carrying entries is lost (bare heartbeats pass).
    entries_lost_to: BTreeSet<NodeId>,
    /// Messages the nodes' gates dropped, in order.
    rejected: Vec<keel_core::engine::Rejection>,
}

fn ids(n: u32) -> Vec<NodeId> {
    (1..=n).map(NodeId).collect()
}

impl Cluster {
    fn new(n: u32, seed: u64, tweak: impl Fn(&mut Config)) -> Cluster {
        let mut config = Config::new(NodeId(1), ids(n));
        tweak(&mut config);
        let mut cluster = Cluster {
            nodes: BTreeMap::new(),
            config,
            now: 0,
            seq: 0,
            queue: BTreeMap::new(),
            blocked: BTreeSet::new(),
            latency: MS,
            fsync: 2 * MS,
            fsync_of: BTreeMap::new(),
            replies: Vec::new(),
            next_tag: 1,
            seed,
            check: true,
            largest_append: (0, 0),
            after: LogIndex::ZERO,
            entries_lost_to: BTreeSet::new(),
            rejected: Vec::new(),
        };
        for id in ids(n) {
            let node = Node {
                replica: None,
                disk: fresh_disk(),
                incarnation: 0,
                wake_at: None,
                offset: 5_000 * MS + u64::from(id.0) * 7 * MS,
                log_syncs: 0,
            };
            cluster.nodes.insert(id, node);
            cluster.boot(id);
        }
        cluster
    }

    fn local(&self, id: NodeId) -> Time {
        Time(self.now + self.nodes[&id].offset)
    }

    fn fsync_of(&self, id: NodeId) -> u64 {
        self.fsync_of.get(&id).copied().unwrap_or(self.fsync)
    }

    /// Starts a crashed (or new) node from what its disk recovers.
    fn boot(&mut self, id: NodeId) {
        let mut config = self.config.clone();
        config.node_id = id;
        let now = self.local(id);
        let seed = self.seed.wrapping_mul(31).wrapping_add(u64::from(id.0));
        let node = self.nodes.get_mut(&id).unwrap();
        let recovered = node.disk.storage_mut().recover().expect("the simulated WAL recovers");
        let persisted = PersistedState {
            hard_state: recovered.hard_state,
            snapshot: recovered.snapshot,
            entries: recovered.entries,
        };
        let engine = LeaderEngine::new(config, persisted, seed, now).expect("valid config");
        node.replica = Some(Replica::new(engine, Front::new(4096), AppendHold::new(0, 1)));
        node.incarnation += 1;
        node.wake_at = Some(now);
    }

    /// A power loss: the engine, queued disk work and every unsynced write are lost.
    fn crash(&mut self, id: NodeId) {
        let node = self.nodes.get_mut(&id).unwrap();
        node.replica = None;
        node.wake_at = None;
        node.disk.crash();
        node.disk.storage_mut().crash();
        node.incarnation += 1;
    }

    fn push(&mut self, at: u64, event: Event) {
        self.seq += 1;
        self.queue.insert((at, self.seq), event);
    }

    fn engine(&self, id: NodeId) -> std::sync::RwLockReadGuard<'_, LeaderEngine> {
        self.nodes[&id].replica.as_ref().expect("running").engine()
    }

    fn status(&self, id: NodeId) -> Status {
        self.engine(id).status()
    }

    fn counters(&self, id: NodeId) -> Counters {
        self.engine(id).counters()
    }

    fn step(&mut self, id: NodeId, input: Input) {
        self.drive(id, |replica, now, io| {
            replica.step(now, input, io);
        });
    }

    /// Runs one call into a running replica, then carries out what left it: its disk
    /// operations, snapshots to write, messages and replies; then checks the cluster.
    fn drive(
        &mut self,
        id: NodeId,
        call: impl FnOnce(&mut Replica<LeaderEngine>, Time, &mut Collect),
    ) {
        let (now, local, fsync) = (self.now, self.local(id), self.fsync_of(id));
        let node = self.nodes.get_mut(&id).unwrap();
        let Some(replica) = node.replica.as_mut() else { return };
        let mut io = Collect::default();
        call(replica, local, &mut io);
        let mut ops = Vec::new();
        replica.take_ready(&mut ops);
        node.wake_at = replica.wake_at();
        node.log_syncs += io.log_syncs;
        self.rejected.extend(io.rejected);
        node.disk.submit(ops, now, fsync).expect("the simulated WAL does not fail");
        let incarnation = node.incarnation;
        self.schedule_disk(id);
        for left in io.left {
            match left {
                Left::Send(to, message) => self.send(id, to, message),
                Left::Reply(reply) => self.replies.push((id, reply)),
                Left::Prepare(meta, data) => {
                    self.push(now + fsync, Event::Prepared { node: id, incarnation, meta, data });
                }
            }
        }
        if self.check {
            self.check_global();
        }
    }

    fn send(&mut self, id: NodeId, to: NodeId, message: Message) {
        let now = self.now;
        if !self.nodes.contains_key(&to) {
            return; // an answer to a forged sender outside the cluster
        }
        {
            assert_ne!(to, id);
            if let Message::Append { entries, .. } = &message {
                if !entries.is_empty() && self.entries_lost_to.contains(&to) {
                    return;
                }
                let bytes = entries.iter().map(|e| match &e.payload {
                    EntryPayload::Write { command: Command::Put { value, .. }, .. } => value.len(),
                    _ => 0,
                });
                let sized = (entries.len(), bytes.sum::<usize>());
                if sized.1 > self.largest_append.1 {
                    self.largest_append = sized;
                }
            }
            self.push(now + self.latency, Event::Deliver { from: id, to, message });
        }
    }

    fn schedule_disk(&mut self, id: NodeId) {
        let node = &self.nodes[&id];
        if let Some(at) = node.disk.next_due_ns() {
            let incarnation = node.incarnation;
            self.push(at.max(self.now), Event::Disk { node: id, incarnation });
        }
    }

    /// Cross-node invariants: one leader per epoch; at most one valid leader lease; logs
    /// agree on every index both nodes know to be durable.
    fn check_global(&self) {
        let engines: Vec<_> = self.nodes.values().filter_map(|n| n.replica.as_ref()).collect();
        let engines: Vec<_> = engines.iter().map(|r| r.engine()).collect();
        for (i, a) in engines.iter().enumerate() {
            for b in &engines[i + 1..] {
                let (sa, sb) = (a.status(), b.status());
                let durable = sa.durable_index.min(sb.durable_index);
                let from = sa.snapshot_index.max(sb.snapshot_index);
                for index in (from.0..=durable.0).map(LogIndex) {
                    assert_eq!(
                        a.term_at(index),
                        b.term_at(index),
                        "durable logs disagree at {index}"
                    );
                }
            }
        }
        let mut leaders: BTreeMap<u64, NodeId> = BTreeMap::new();
        let mut leased = Vec::new();
        for (id, node) in &self.nodes {
            let Some(replica) = &node.replica else { continue };
            let engine = replica.engine();
            let status = engine.status();
            if status.role == Role::Leader {
                if let Some(other) = leaders.insert(status.epoch.0, *id) {
                    panic!("two leaders {other} and {id} in epoch {}", status.epoch.0);
                }
            }
            if status.leader_lease_valid {
                leased.push(*id);
            }
        }
        assert!(leased.len() <= 1, "several valid leader leases: {leased:?}");
    }

    /// Runs events until virtual time `until_ms` past now.
    fn run_for(&mut self, ms: u64) {
        let until = self.now + ms * MS;
        self.run_until(until, |_| false);
    }

    /// Runs until `cond` holds (checked after every event) or `limit_ms` pass; returns
    /// whether it held.
    fn run_until_cond(&mut self, limit_ms: u64, cond: impl Fn(&Cluster) -> bool) -> bool {
        let until = self.now + limit_ms * MS;
        self.run_until(until, cond)
    }

    fn run_until(&mut self, until: u64, cond: impl Fn(&Cluster) -> bool) -> bool {
        for _ in 0..5_000_000 {
            if cond(self) {
                return true;
            }
            let next_event = self.queue.keys().next().map(|k| k.0);
            let next_wake = self
                .nodes
                .iter()
                .filter_map(|(id, n)| n.wake_at.map(|w| (w.0.saturating_sub(n.offset), *id)))
                .min();
            let event_first = match (next_event, next_wake) {
                (Some(e), Some((w, _))) => e <= w,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => return cond(self),
            };
            let at = if event_first { next_event.unwrap() } else { next_wake.unwrap().0 };
            if at > until {
                self.now = until;
                return cond(self);
            }
            self.now = self.now.max(at);
            if event_first {
                let key = *self.queue.keys().next().unwrap();
                let event = self.queue.remove(&key).unwrap();
                self.handle(event);
            } else {
                let id = next_wake.unwrap().1;
                self.nodes.get_mut(&id).unwrap().wake_at = None;
                self.step(id, Input::Tick);
            }
        }
        panic!("event budget exhausted");
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Deliver { from, to, message } => {
                if self.blocked.contains(&(from, to)) {
                    return;
                }
                self.step(to, Input::Message { from, message });
            }
            Event::Disk { node, incarnation } => {
                if self.nodes[&node].incarnation != incarnation {
                    return;
                }
                let fsync = self.fsync_of(node);
                let now = self.now;
                let n = self.nodes.get_mut(&node).unwrap();
                let completions = n.disk.poll(now, fsync).expect("the simulated WAL does not fail");
                if !completions.is_empty() {
                    self.drive(node, |replica, local, io| {
                        replica.complete(local, &completions, io);
                    });
                }
                self.schedule_disk(node);
            }
            Event::Prepared { node, incarnation, meta, data } => {
                if self.nodes[&node].incarnation != incarnation {
                    return;
                }
                let (now, fsync) = (self.now, self.fsync_of(node));
                let n = self.nodes.get_mut(&node).unwrap();
                keel_storage::wal::prepare_snapshot(n.disk.storage_mut().sim_disk(), meta, &data)
                    .expect("the simulated disk does not fail");
                let Some(replica) = n.replica.as_mut() else { return };
                replica.prepared(Time(now), meta, data.len() as u64);
                let mut ops = Vec::new();
                replica.take_ready(&mut ops);
                n.disk.submit(ops, now, fsync).expect("the simulated WAL does not fail");
                self.schedule_disk(node);
            }
        }
    }

    fn isolate(&mut self, group: &[NodeId]) {
        let all: Vec<NodeId> = self.nodes.keys().copied().collect();
        for a in group {
            for b in &all {
                if !group.contains(b) {
                    self.blocked.insert((*a, *b));
                    self.blocked.insert((*b, *a));
                }
            }
        }
    }

    fn heal(&mut self) {
        self.blocked.clear();
    }

    fn leader(&self) -> Option<NodeId> {
        self.nodes
            .iter()
            .filter_map(|(id, n)| n.replica.as_ref().map(|r| (*id, r.engine().status())))
            .filter(|(_, s)| s.role == Role::Leader && s.leader_lease_valid)
            .max_by_key(|(_, s)| s.epoch)
            .map(|(id, _)| id)
    }

    fn await_leader(&mut self) -> NodeId {
        assert!(self.run_until_cond(5_000, |c| c.leader().is_some()), "no leader elected");
        self.leader().unwrap()
    }

    fn request(
        &mut self,
        node: NodeId,
        command: Command,
        durability: Option<Durability>,
        level: Option<ReadLevel>,
        client: u64,
        request: u64,
    ) -> RequestTag {
        let tag = RequestTag(self.next_tag);
        self.next_tag += 1;
        let req = ClientRequest {
            tag,
            client: ClientId(client),
            request: RequestId(request),
            command,
            durability,
            level,
            after: self.after,
            mode: Default::default(),
            named: false,
        };
        self.step(node, Input::Client(req));
        tag
    }

    fn put(&mut self, node: NodeId, key: &str, value: &str, durability: Durability) -> RequestTag {
        let request = self.next_tag;
        self.request(
            node,
            Command::Put {
                key: Key::copy_from_slice(key.as_bytes()),
                value: Value::copy_from_slice(value.as_bytes()),
            },
            Some(durability),
            None,
            1,
            request,
        )
    }

    fn get(&mut self, node: NodeId, key: &str, level: ReadLevel) -> RequestTag {
        self.request(
            node,
            Command::Get { key: Key::copy_from_slice(key.as_bytes()) },
            None,
            Some(level),
            2,
            0,
        )
    }

    fn reply(&self, tag: RequestTag) -> Option<&ClientReply> {
        self.replies.iter().map(|(_, r)| r).find(|r| r.tag == tag)
    }

    fn await_reply(&mut self, tag: RequestTag, limit_ms: u64) -> ClientReply {
        assert!(self.run_until_cond(limit_ms, |c| c.reply(tag).is_some()), "no reply to {tag:?}");
        self.reply(tag).unwrap().clone()
    }

    fn value_of(reply: &ClientReply) -> Option<Value> {
        match &reply.result {
            Ok(CommandResult::Value { value, .. }) => value.clone(),
            other => panic!("not a value: {other:?}"),
        }
    }
}

fn cluster3(seed: u64) -> Cluster {
    Cluster::new(3, seed, |_| {})
}

#[test]
fn a_follower_behind_a_clients_own_write_sends_its_read_to_the_leader() {
    let mut c = cluster3(41);
    assert!(c.run_until_cond(5_000, |c| c.leader().is_some()), "a leader");
    let leader = c.leader().unwrap();
    let follower = *c.nodes.keys().find(|&&n| n != leader).unwrap();
    // The follower hears nothing from the leader: it will not have the write.
    c.blocked.insert((leader, follower));
    let put = c.put(leader, "k", "mine", Durability::Memory);
    let written = match c.await_reply(put, 1_000).result {
        Ok(CommandResult::Written { version }) => version,
        other => panic!("not written: {other:?}"),
    };
    // Without a floor the follower answers from its own state, which lacks the write
    // (what a client reading its own write there saw before the floor).
    let stale = c.get(follower, "k", ReadLevel::Any);
    let reply = c.reply(stale).expect("answered at once, locally").clone();
    assert_eq!((reply.served_by, Cluster::value_of(&reply)), (follower, None));
    // Off the loop likewise: without the floor at once, with it not at all.
    let mut request = ClientRequest {
        tag: RequestTag(999),
        client: ClientId(2),
        request: RequestId(0),
        command: Command::Get { key: "k".into() },
        durability: None,
        level: Some(ReadLevel::Any),
        after: LogIndex::ZERO,
        mode: Default::default(),
        named: false,
    };
    let now = c.local(follower);
    assert!(c.engine(follower).read_now(&request, now).is_some());
    request.after = written.index;
    assert!(c.engine(follower).read_now(&request, now).is_none());
    // With the client's floor the follower may not answer it: the read goes to the leader.
    c.after = written.index;
    let own = c.get(follower, "k", ReadLevel::Any);
    assert!(c.reply(own).is_none(), "not answered from a state without the write");
    c.blocked.clear();
    let reply = c.await_reply(own, 1_000);
    assert_eq!((reply.served_by, Cluster::value_of(&reply)), (leader, Some("mine".into())));
    // Once the follower has applied the write, it answers such reads itself again.
    let applied = |c: &Cluster| c.engine(follower).status().applied_index >= written.index;
    assert!(c.run_until_cond(1_000, applied), "the follower catches up");
    let local = c.get(follower, "k", ReadLevel::Any);
    let reply = c.await_reply(local, 1_000);
    assert_eq!((reply.served_by, Cluster::value_of(&reply)), (follower, Some("mine".into())));
}

#[test]
fn a_leader_is_elected_and_replaced_after_a_crash() {
    let mut c = cluster3(1);
    let first = c.await_leader();
    let epoch = c.status(first).epoch;
    c.run_for(300);
    assert_eq!(c.leader(), Some(first), "a healthy leader keeps its epoch");
    assert_eq!(c.status(first).epoch, epoch);
    c.crash(first);
    let second = c.await_leader();
    assert_ne!(second, first);
    assert!(c.status(second).epoch > epoch);
    c.boot(first);
    assert!(c.run_until_cond(2_000, |c| c.status(first).leader == Some(second)));
}

#[test]
fn votes_are_refused_to_a_candidate_whose_log_is_behind() {
    let config = Config::new(NodeId(1), ids(3));
    let entry = |i| Entry {
        epoch: keel_types::Epoch(1),
        index: LogIndex(i),
        payload: keel_types::EntryPayload::Noop,
    };
    let persisted = PersistedState {
        hard_state: HardState {
            epoch: keel_types::Epoch(1),
            voted_for: None,
            repair_floor: None,
            members_epoch: 0,
        },
        snapshot: None,
        entries: vec![entry(1), entry(2)],
    };
    let mut engine = LeaderEngine::new(config, persisted, 3, Time(0)).unwrap();
    let behind = Message::RequestVote {
        epoch: keel_types::Epoch(2),
        last_epoch: keel_types::Epoch(1),
        last_index: LogIndex(1),
        transfer: false,
    };
    let boot_quiet = 300 * MS; // a restarted node does not vote for election_timeout_min
    let out = engine.step(Time(boot_quiet), Input::Message { from: NodeId(2), message: behind });
    assert!(out
        .messages
        .iter()
        .any(|(to, m)| *to == NodeId(2) && matches!(m, Message::Vote { granted: false, .. })));
    let level = Message::RequestVote {
        epoch: keel_types::Epoch(2),
        last_epoch: keel_types::Epoch(1),
        last_index: LogIndex(2),
        transfer: false,
    };
    let out = engine.step(Time(boot_quiet + 1), Input::Message { from: NodeId(3), message: level });
    assert!(out
        .messages
        .iter()
        .any(|(to, m)| *to == NodeId(3) && matches!(m, Message::Vote { granted: true, .. })));
    assert_eq!(
        out.hard_state.unwrap().voted_for,
        Some(NodeId(3)),
        "the vote is persisted with the grant"
    );
}

#[test]
fn a_node_below_its_repair_floor_votes_by_the_floor_withholds_campaigns_and_clears_it() {
    // Recovery cut damaged records 3..=5 (epoch 1): the floor keeps what they promised.
    let epoch = Epoch;
    let entry = |i| Entry { epoch: epoch(1), index: LogIndex(i), payload: EntryPayload::Noop };
    let floor = Version { epoch: epoch(1), index: LogIndex(5) };
    let persisted = PersistedState {
        hard_state: HardState {
            epoch: epoch(1),
            voted_for: None,
            repair_floor: Some(floor),
            members_epoch: 0,
        },
        snapshot: None,
        entries: vec![entry(1), entry(2)],
    };
    let config = Config::new(NodeId(1), ids(3));
    let mut engine = LeaderEngine::new(config.clone(), persisted, 3, Time(0)).unwrap();
    assert_eq!(engine.status().repair_floor, Some(floor));
    let vote = |last_index| Message::RequestVote {
        epoch: epoch(2),
        last_epoch: epoch(1),
        last_index: LogIndex(last_index),
        transfer: false,
    };
    let granted = |out: &Outputs, to: NodeId| {
        out.messages
            .iter()
            .any(|(t, m)| *t == to && matches!(m, Message::Vote { granted: true, .. }))
    };
    // Level with the cut log, below the floor: refused.
    let mut now = 300 * MS;
    let out = engine.step(Time(now), Input::Message { from: NodeId(2), message: vote(2) });
    assert!(!granted(&out, NodeId(2)), "a candidate lacking the cut entries won a vote");
    // At the floor: granted.
    now += 1;
    let out = engine.step(Time(now), Input::Message { from: NodeId(3), message: vote(5) });
    assert!(granted(&out, NodeId(3)));
    assert_eq!(out.hard_state.unwrap().repair_floor, Some(floor), "a vote keeps the floor");
    // Election timeouts pass without a campaign.
    for _ in 0..10 {
        now += 500 * MS;
        let out = engine.step(Time(now), Input::Tick);
        assert!(out.messages.iter().all(|(_, m)| !matches!(m, Message::PreVote { .. })));
    }
    assert!(engine.counters().campaigns_withheld > 0);
    // The leader of epoch 2 re-replicates 3..=5; once they are fsynced the floor goes.
    now += 1;
    let append = Message::Append {
        epoch: epoch(2),
        prev_index: LogIndex(2),
        prev_epoch: epoch(1),
        entries: vec![entry(3), entry(4), Entry { epoch: epoch(2), ..entry(5) }],
        commit_index: LogIndex(2),
        durable_index: LogIndex(2),
        lease: Lease::Withheld,
        flush_through: None,
        sent_at: Time(now),
    };
    let out = engine.step(Time(now), Input::Message { from: NodeId(3), message: append });
    assert_eq!(out.append.len(), 3);
    assert_eq!(engine.status().repair_floor, Some(floor), "not before the fsync");
    now += 1;
    let out = engine.step(Time(now), Input::LogSynced { index: LogIndex(5) });
    assert_eq!(out.hard_state.and_then(|h| h.repair_floor), None);
    assert_eq!(engine.status().repair_floor, None);
    assert_eq!(engine.counters().logs_repaired, 1);
}

#[test]
fn a_durable_entry_of_a_later_epoch_clears_the_repair_floor_before_its_index() {
    // The floor names (1, 9); a leader of epoch 2 sends entries 3 and 4 of its epoch.
    let epoch = Epoch;
    let entry = |i, e| Entry { epoch: epoch(e), index: LogIndex(i), payload: EntryPayload::Noop };
    let floor = Version { epoch: epoch(1), index: LogIndex(9) };
    let persisted = PersistedState {
        hard_state: HardState {
            epoch: epoch(1),
            voted_for: None,
            repair_floor: Some(floor),
            members_epoch: 0,
        },
        snapshot: None,
        entries: vec![entry(1, 1), entry(2, 1)],
    };
    let mut engine =
        LeaderEngine::new(Config::new(NodeId(1), ids(3)), persisted, 3, Time(0)).unwrap();
    let append = Message::Append {
        epoch: epoch(2),
        prev_index: LogIndex(2),
        prev_epoch: epoch(1),
        entries: vec![entry(3, 2), entry(4, 2)],
        commit_index: LogIndex(2),
        durable_index: LogIndex(2),
        lease: Lease::Withheld,
        flush_through: None,
        sent_at: Time(300 * MS),
    };
    engine.step(Time(300 * MS), Input::Message { from: NodeId(3), message: append });
    assert_eq!(engine.status().repair_floor, Some(floor), "not before the fsync");
    let out = engine.step(Time(300 * MS + 1), Input::LogSynced { index: LogIndex(4) });
    assert_eq!(out.hard_state.and_then(|h| h.repair_floor), None, "(2, 4) is past (1, 9)");
}

#[test]
fn a_follower_that_hears_from_a_live_leader_refuses_votes() {
    let mut c = cluster3(2);
    let leader = c.await_leader();
    let follower = c.nodes.keys().copied().find(|n| *n != leader).unwrap();
    let epoch = c.status(follower).epoch;
    let request = Message::RequestVote {
        epoch: epoch.next(),
        last_epoch: epoch,
        last_index: LogIndex(100),
        transfer: false,
    };
    let other = c.nodes.keys().copied().find(|n| *n != leader && *n != follower).unwrap();
    c.step(follower, Input::Message { from: other, message: request });
    assert_eq!(c.status(follower).epoch, epoch, "stickiness: the epoch does not move");
}

/// Blocks both directions between every node of `a` and every node of `b`.
fn cut(c: &mut Cluster, a: &[NodeId], b: &[NodeId]) {
    for x in a {
        for y in b {
            c.blocked.insert((*x, *y));
            c.blocked.insert((*y, *x));
        }
    }
}

#[test]
fn a_higher_epoch_from_a_reply_does_not_free_a_followers_vote_early() {
    late_higher_epoch_scenario(false);
}

#[test]
fn forgetting_the_leader_contact_on_a_new_epoch_gives_two_leader_leases() {
    // Negative control: with the old behaviour the same schedule ends with two leaders
    // holding valid leases, which the harness's invariant check catches.
    let outcome = std::panic::catch_unwind(|| late_higher_epoch_scenario(true));
    let panic = outcome.expect_err("the old behaviour must break the one-lease invariant");
    let text = panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    assert!(text.contains("several valid leader leases"), "{text}");
}

fn late_higher_epoch_scenario(forget_contact: bool) {
    // Five nodes, leader L. C and W lose L and A; V reaches everyone. V acknowledges L's
    // heartbeats, so L's lease counts on V's promise not to vote for election_timeout_min.
    // Then a late reply of a higher epoch reaches V and C (an `AppendReply` to an `Append`
    // each sent in an old leadership, answered by a node that has since moved on), and V's
    // answers to L are held back. V must still refuse to help elect C until its promise
    // to L runs out; otherwise C leads with a valid lease while L's is still valid (the
    // invariant `check_global` asserts after every step). Long timeouts make L's lease
    // outlast C's election timeout.
    let mut c = Cluster::new(5, 11, |config| {
        config.election_timeout_min = Span::from_millis(2_000);
        config.election_timeout_max = Span::from_millis(2_100);
        config.unsafe_forget_leader_contact = forget_contact;
    });
    let leader = c.await_leader();
    let others: Vec<NodeId> = c.nodes.keys().copied().filter(|n| *n != leader).collect();
    let (v, a, cand, w) = (others[0], others[1], others[2], others[3]);
    c.run_for(50);
    cut(&mut c, &[cand, w], &[leader, a]);
    c.run_for(1_900);
    let epoch = c.status(leader).epoch;
    assert_eq!(c.status(leader).role, Role::Leader);
    assert!(c.status(leader).leader_lease_valid, "the leader holds its lease through V and A");
    let late = |epoch: Epoch| Message::AppendReply {
        epoch,
        success: false,
        last_index: LogIndex::ZERO,
        persisted_index: LogIndex::ZERO,
        applied_index: LogIndex::ZERO,
        match_index: LogIndex::ZERO,
        released: false,
        echo_sent_at: Time(0),
        sent_at: Time(0),
    };
    c.blocked.insert((v, leader));
    c.step(v, Input::Message { from: w, message: late(epoch.next()) });
    c.step(cand, Input::Message { from: w, message: late(epoch.next()) });
    assert_eq!(c.status(v).epoch, epoch.next(), "a reply of a higher epoch moves V's epoch");
    // C's election timeout comes while L's lease still runs.
    c.run_for(600);
    let leaders: Vec<(NodeId, Status)> = c
        .nodes
        .keys()
        .map(|id| (*id, c.status(*id)))
        .filter(|(_, s)| s.role == Role::Leader)
        .collect();
    assert!(
        leaders.iter().all(|(id, _)| *id == leader),
        "no second leader while V's promise to L holds: {:?}",
        leaders.iter().map(|(id, s)| (*id, s.epoch)).collect::<Vec<_>>()
    );
    // Once the promise runs out, C is elected with V's and W's votes.
    c.run_for(3_000);
    assert!(
        c.nodes.keys().any(|id| *id != leader && c.status(*id).role == Role::Leader),
        "C's side elects a leader once L's lease has run out"
    );
}

#[test]
fn votes_nobody_asked_for_change_nothing() {
    // A member's forged (or late) `Vote` or `PreVoteReply` of a far higher epoch, sent to
    // the leader and to a follower, neither deposes the leader nor moves any epoch.
    let mut c = cluster3(5);
    let leader = c.await_leader();
    let epoch = c.status(leader).epoch;
    let follower = c.nodes.keys().copied().find(|n| *n != leader).unwrap();
    let other = c.nodes.keys().copied().find(|n| *n != leader && *n != follower).unwrap();
    let high = Epoch(epoch.0 + 1000);
    for to in [leader, follower] {
        for message in [
            Message::Vote { epoch: high, granted: true },
            Message::PreVoteReply { epoch: high, granted: true },
        ] {
            c.step(to, Input::Message { from: other, message });
            assert_eq!(c.status(to).epoch, epoch, "{to}: the epoch does not move");
        }
    }
    assert_eq!(c.status(leader).role, Role::Leader, "the leader keeps leading");
}

#[test]
fn each_durability_is_acknowledged_at_its_point() {
    let mut c = cluster3(3);
    let leader = c.await_leader();
    c.run_for(100);
    c.fsync = 50 * MS;
    let start = c.now;
    let memory = c.put(leader, "m", "1", Durability::Memory);
    assert!(c.reply(memory).is_some(), "memory writes are acknowledged in the same step");
    let replicated = c.put(leader, "r", "1", Durability::Replicated);
    assert!(c.reply(replicated).is_none());
    c.await_reply(replicated, 100);
    assert!(c.now - start < 10 * MS, "replicated waits for a majority's memory, not fsync");
    let start = c.now;
    let durable = c.put(leader, "d", "1", Durability::Durable);
    let reply = c.await_reply(durable, 500);
    assert!(reply.result.is_ok());
    assert!(c.now - start >= 50 * MS, "durable waits for a majority's fsync");
}

#[test]
fn reads_at_each_level_and_forwarding() {
    let mut c = cluster3(4);
    let leader = c.await_leader();
    c.run_for(100);
    let follower = c.nodes.keys().copied().find(|n| *n != leader).unwrap();
    c.fsync = 40 * MS;
    c.put(leader, "k", "v1", Durability::Memory);
    c.run_for(3);
    let any = c.get(follower, "k", ReadLevel::Any);
    let any = c.reply(any).expect("any is served at once").clone();
    assert_eq!(any.served_by, follower);
    assert_eq!(Cluster::value_of(&any), Some(Value::from_static(b"v1")));
    // Not yet durable: the follower forwards, the leader runs a round.
    let mono = c.get(follower, "k", ReadLevel::Monotonic);
    assert!(c.reply(mono).is_none());
    let mono = c.await_reply(mono, 500);
    assert_eq!(mono.served_by, leader);
    assert!(mono.durability_round);
    assert_eq!(Cluster::value_of(&mono), Some(Value::from_static(b"v1")));
    // Now durable: the follower serves it itself once its durable index catches up.
    c.run_for(100);
    let mono = c.get(follower, "k", ReadLevel::Monotonic);
    let mono = c.await_reply(mono, 10);
    assert_eq!(mono.served_by, follower);
    assert!(!mono.durability_round);
    let lin = c.get(follower, "k", ReadLevel::Linearizable);
    let lin = c.await_reply(lin, 100);
    assert_eq!(lin.served_by, leader);
    let missing = c.get(follower, "never", ReadLevel::Monotonic);
    let missing = c.await_reply(missing, 10);
    assert_eq!(missing.served_by, follower, "a never-written key counts as durable");
    assert_eq!(Cluster::value_of(&missing), None);
}

#[test]
fn concurrent_reads_share_one_durability_round() {
    let mut c = cluster3(5);
    let leader = c.await_leader();
    c.run_for(100);
    c.fsync = 30 * MS;
    for key in ["a", "b", "c"] {
        c.put(leader, key, "1", Durability::Memory);
    }
    let before = c.engine(leader).counters();
    let start = c.now;
    let tags: Vec<RequestTag> =
        ["a", "b", "c"].iter().map(|k| c.get(leader, k, ReadLevel::Monotonic)).collect();
    for tag in &tags {
        let reply = c.await_reply(*tag, 500);
        assert!(reply.durability_round);
    }
    let after = c.engine(leader).counters();
    assert_eq!(after.durability_rounds - before.durability_rounds, 1, "one round for all three");
    assert_eq!(after.durability_rounds_finished - before.durability_rounds_finished, 1);
    // The round's time counts from its start, after the reads arrived, to its end: at
    // least the fsyncs (30 ms, the followers' in parallel with the leader's), at most the
    // time since the reads were sent.
    let round = after.durability_round_nanos - before.durability_round_nanos;
    assert!((30 * MS..=c.now - start).contains(&round), "round took {round} ns");
    let again = c.get(leader, "c", ReadLevel::Monotonic);
    assert!(!c.reply(again).expect("served at once").durability_round, "only the first read pays");
}

#[test]
fn a_round_cut_short_by_losing_leadership_adds_no_time() {
    let mut c = cluster3(7);
    let leader = c.await_leader();
    c.run_for(100);
    c.fsync = 30 * MS;
    c.put(leader, "a", "1", Durability::Memory);
    let before = c.engine(leader).counters();
    c.get(leader, "a", ReadLevel::Monotonic);
    c.isolate(&[leader]);
    c.run_for(2_000);
    assert_ne!(c.status(leader).role, Role::Leader, "stepped down, cut off from the others");
    let after = c.engine(leader).counters();
    assert_eq!(after.durability_rounds - before.durability_rounds, 1, "the read started one");
    assert_eq!(after.durability_rounds_finished, before.durability_rounds_finished);
    assert_eq!(after.durability_round_nanos, before.durability_round_nanos);
}

#[test]
fn a_follower_fsyncs_once_for_a_round_not_once_per_append_during_it() {
    // No background flush in the window: every fsync counted is the round's.
    let mut c = Cluster::new(3, 5, |config| config.flush_interval = Span::from_millis(60_000));
    let leader = c.await_leader();
    c.run_for(100);
    c.fsync = 30 * MS;
    c.put(leader, "a", "1", Durability::Memory);
    let followers: Vec<NodeId> = ids(3).into_iter().filter(|id| *id != leader).collect();
    let syncs =
        |c: &Cluster| -> Vec<u64> { followers.iter().map(|f| c.nodes[f].log_syncs).collect() };
    let before = syncs(&c);
    let read = c.get(leader, "a", ReadLevel::Monotonic);
    // While the round's fsyncs are under way, more writes reach the followers, each in an
    // `Append` that carries the round's `flush_through`.
    for i in 0..5 {
        c.run_for(3);
        c.put(leader, &format!("k{i}"), "1", Durability::Memory);
    }
    assert!(c.await_reply(read, 500).durability_round);
    c.run_for(100);
    let after = syncs(&c);
    for (f, (b, a)) in followers.iter().zip(before.iter().zip(&after)) {
        assert_eq!(a - b, 1, "follower {f}: one fsync for the round");
    }
}

#[test]
fn a_partitioned_follower_marks_itself_out_before_the_leader_removes_it() {
    let mut c = cluster3(6);
    let leader = c.await_leader();
    c.run_for(300);
    let follower = c.nodes.keys().copied().find(|n| *n != leader).unwrap();
    assert!(c.status(follower).active, "a healthy follower holds a lease");
    assert_eq!(c.status(leader).active_set.len(), 3);
    c.isolate(&[follower]);
    let cut = c.now;
    assert!(c.run_until_cond(1_000, |c| !c.status(follower).active));
    let marked_out = c.now - cut;
    assert!(c.status(leader).active_set.contains(&follower), "not removed before rt");
    // A non-durable read at the leader waits while the removal is pending.
    c.put(leader, "x", "1", Durability::Memory);
    let read = c.get(leader, "x", ReadLevel::Monotonic);
    assert!(c.run_until_cond(1_000, |c| !c.status(leader).active_set.contains(&follower)));
    let removed = c.now - cut;
    assert!(
        removed >= 500 * MS && marked_out <= 100 * MS + 30 * MS,
        "mt {marked_out} then rt {removed}"
    );
    let reply = c.await_reply(read, 100);
    assert!(c.now - cut >= 500 * MS, "served only after the removal");
    assert!(reply.durability_round);
    // A durable read is not blocked by a pending removal: read "x" again at once.
    let again = c.get(leader, "x", ReadLevel::Monotonic);
    assert!(c.reply(again).is_some());
    c.heal();
    let ok = c.run_until_cond(2_000, |c| c.status(leader).active_set.contains(&follower));
    assert!(ok, "re-admitted");
    assert!(c.run_until_cond(500, |c| c.status(follower).active));
    assert!(c.status(follower).applied_index >= c.status(leader).durable_index);
}

#[test]
fn a_deposed_leader_in_a_minority_stops_serving_before_a_successor_is_elected() {
    let mut c = Cluster::new(5, 7, |_| {});
    let old = c.await_leader();
    c.run_for(200);
    let buddy = c.nodes.keys().copied().find(|n| *n != old).unwrap();
    c.put(old, "k", "1", Durability::Durable);
    c.run_for(100);
    c.isolate(&[old, buddy]);
    // `check_global` asserts after every step that at most one node holds a valid lease.
    assert!(c.run_until_cond(3_000, |c| c.leader().is_some_and(|l| l != old)));
    let new = c.leader().unwrap();
    assert!(!c.status(old).leader_lease_valid);
    let stale = c.get(old, "k", ReadLevel::Monotonic);
    c.run_for(50);
    let reply = c.reply(stale).cloned();
    assert!(
        reply.is_none_or(|r| r.result.is_err()),
        "no monotonic read served by the deposed leader"
    );
    c.put(new, "k", "2", Durability::Durable);
    c.heal();
    assert!(c.run_until_cond(3_000, |c| c.status(old).leader == Some(new)));
}

#[test]
fn a_deposed_leaders_undurable_suffix_is_rolled_back() {
    let mut c = cluster3(8);
    let old = c.await_leader();
    c.run_for(200);
    c.put(old, "k", "durable", Durability::Durable);
    c.run_for(100);
    c.isolate(&[old]);
    for i in 0..5 {
        c.put(old, "k", &format!("lost{i}"), Durability::Memory);
    }
    assert_eq!(
        c.engine(old).read_applied(b"k").unwrap().0,
        Some(Value::from_static(b"lost4")),
        "applied before durable"
    );
    assert!(c.run_until_cond(3_000, |c| c.leader().is_some_and(|l| l != old)));
    let new = c.leader().unwrap();
    let tag = c.put(new, "k", "new", Durability::Durable);
    c.await_reply(tag, 500);
    c.heal();
    let ok = c.run_until_cond(3_000, |c| {
        c.engine(old).read_applied(b"k").unwrap().0 == Some(b"new".to_vec().into())
    });
    assert!(ok, "the old leader adopts the new leader's log");
    assert!(c.engine(old).counters().rolled_back_entries >= 5);
    assert!(c.run_until_cond(1_000, |c| c.engine(old).applied_digest()
        == c.engine(new).applied_digest()));
}

#[test]
fn a_restarted_cluster_recovers_what_was_durable() {
    let mut c = cluster3(9);
    let leader = c.await_leader();
    c.run_for(100);
    let tag = c.put(leader, "k", "v", Durability::Durable);
    c.await_reply(tag, 500);
    let tag = c.request(
        leader,
        Command::Incr { key: "n".into(), delta: 5 },
        Some(Durability::Durable),
        None,
        3,
        1,
    );
    c.await_reply(tag, 500);
    for id in ids(3) {
        c.crash(id);
    }
    for id in ids(3) {
        c.boot(id);
        assert!(!c.status(id).active, "a restarted node is outside any active set");
    }
    let leader = c.await_leader();
    let read = c.get(leader, "k", ReadLevel::Linearizable);
    assert_eq!(Cluster::value_of(&c.await_reply(read, 1_000)), Some(Value::from_static(b"v")));
    let read = c.get(leader, "n", ReadLevel::Monotonic);
    assert_eq!(Cluster::value_of(&c.await_reply(read, 1_000)), Some(Value::from_static(b"5")));
}

#[test]
fn a_lagging_follower_is_caught_up_by_snapshot() {
    let chunks = catch_up_by_snapshot(1 << 20);
    assert!(chunks >= 1, "one chunk per snapshot: {chunks}");
}

#[test]
fn a_snapshot_taken_in_slices_is_sent_in_chunks() {
    let chunks = catch_up_by_snapshot(64);
    assert!(chunks > 10, "a snapshot of 60 keys in 64-byte chunks: {chunks}");
}

/// Isolates a follower while the leader writes and snapshots, heals it, and checks that
/// it catches up by installing a snapshot sent in chunks of `chunk_bytes`. Returns how
/// many chunks the follower accepted.
fn catch_up_by_snapshot(chunk_bytes: u64) -> u64 {
    let mut c = Cluster::new(3, 10, |config| {
        config.snapshot_entries_threshold = 20;
        config.append_entries_max = 8;
        config.snapshot_chunk_bytes = chunk_bytes;
    });
    let leader = c.await_leader();
    c.run_for(100);
    let lagging = c.nodes.keys().copied().find(|n| *n != leader).unwrap();
    c.isolate(&[lagging]);
    c.run_for(600); // removed from the active set, so the durable index moves on
    for i in 0..60 {
        c.put(leader, &format!("k{i}"), "v", Durability::Memory);
        c.run_for(5);
    }
    assert!(c.run_until_cond(1_000, |c| c.status(leader).snapshot_index >= LogIndex(20)));
    // The lagging follower needs it: the encoding is held to be sent.
    assert!(c.run_until_cond(1_000, |c| c.status(leader).snapshot_held_bytes > 0));
    c.heal();
    assert!(c.run_until_cond(3_000, |c| c.engine(lagging).counters().snapshots_installed >= 1));
    assert!(c.run_until_cond(3_000, |c| {
        c.status(lagging).last_index == c.status(leader).last_index
            && c.engine(lagging).applied_digest() == c.engine(leader).applied_digest()
    }));
    let chunks = c.engine(lagging).counters().snapshot_chunks_received;
    // Nobody needs it any more: no node holds an encoding once the leader hears of the
    // install.
    assert!(
        c.run_until_cond(1_000, |c| c.nodes.keys().all(|n| c.status(*n).snapshot_held_bytes == 0))
    );
    // A restart from the installed snapshot rebuilds the same state.
    c.run_for(300);
    c.crash(lagging);
    c.boot(lagging);
    assert!(c.run_until_cond(3_000, |c| c.engine(lagging).applied_digest()
        == c.engine(leader).applied_digest()));
    assert!(c.engine(leader).counters().snapshots_taken >= 1);
    chunks
}

/// Nodes configured with different deduplication bounds: the bound in force is the one
/// the leader of the epoch stated in the log, on every node; a follower configured to keep
/// fewer slots installs a snapshot holding more, and restarts from it (it used to refuse
/// such a snapshot, forever, and to fail to boot from one).
#[test]
fn nodes_configured_with_other_dedup_bounds_apply_the_leaders_and_install_its_snapshots() {
    let mut c = Cluster::new(3, 14, |config| {
        config.snapshot_entries_threshold = 20;
        config.dedup_clients_max = 50;
    });
    let leader = c.await_leader();
    c.run_for(100);
    let small = c.nodes.keys().copied().find(|n| *n != leader).unwrap();
    c.crash(small);
    c.config.dedup_clients_max = 2;
    c.boot(small);
    c.config.dedup_clients_max = 50;
    c.isolate(&[small]);
    c.run_for(600);
    for client in 1..=30 {
        let put = Command::Put { key: format!("k{client}").into_bytes().into(), value: "v".into() };
        c.request(leader, put, Some(Durability::Memory), None, client, 1);
        c.run_for(5);
    }
    assert!(c.run_until_cond(1_000, |c| c.status(leader).snapshot_index >= LogIndex(20)));
    c.heal();
    assert!(c.run_until_cond(3_000, |c| c.engine(small).counters().snapshots_installed >= 1));
    let same = |c: &Cluster| {
        c.status(small).last_index == c.status(leader).last_index
            && c.engine(small).applied_digest() == c.engine(leader).applied_digest()
    };
    assert!(c.run_until_cond(3_000, same));
    assert!(c.nodes.keys().all(|n| c.status(*n).dedup_clients_max == 50));
    // A retry of the oldest client is answered from the table on every replica alike.
    let retry = Command::Put { key: "k1".into(), value: "v".into() };
    let tag = c.request(small, retry, Some(Durability::Replicated), None, 1, 1);
    assert!(c.await_reply(tag, 1_000).result.is_ok());
    assert_eq!(c.engine(leader).counters().retries_deduplicated, 1);
    // A restart from the installed snapshot (30 slots, configured for 2).
    c.run_for(300);
    c.crash(small);
    c.boot(small);
    assert!(c.run_until_cond(3_000, same));
    // A new leader states its own bound, and every node applies it from there.
    c.crash(leader);
    assert!(c.run_until_cond(5_000, |c| c.leader().is_some_and(|l| l != leader)));
    let next = c.leader().unwrap();
    let expected = if next == small { 2 } else { 50 };
    let live: Vec<NodeId> = c.nodes.keys().copied().filter(|n| *n != leader).collect();
    assert!(c.run_until_cond(3_000, |c| live.iter().all(|n| {
        c.status(*n).dedup_clients_max == expected
            && c.status(*n).applied_index == c.status(next).last_index
    })));
}

#[test]
fn appends_hold_at_most_their_byte_budget_and_a_lagging_follower_still_catches_up() {
    // 1 KiB values, a budget of about four of them: an `Append` carries at most five
    // (the budget, then one that does not fit is left for the next), never all 40.
    let mut c = Cluster::new(3, 12, |config| config.append_bytes_max = 4 * 1024);
    let leader = c.await_leader();
    c.run_for(100);
    let lagging = c.nodes.keys().copied().find(|n| *n != leader).unwrap();
    c.isolate(&[lagging]);
    let value = "v".repeat(1024);
    for i in 0..40 {
        c.put(leader, &format!("k{i}"), &value, Durability::Memory);
    }
    c.run_for(50);
    c.heal();
    assert!(c.run_until_cond(3_000, |c| {
        c.status(lagging).last_index == c.status(leader).last_index
            && c.engine(lagging).applied_digest() == c.engine(leader).applied_digest()
    }));
    let (entries, bytes) = c.largest_append;
    assert!(entries >= 2 && bytes <= 4 * 1024, "largest append: {entries} entries, {bytes} B");
}

#[test]
fn a_retried_write_is_applied_once() {
    let mut c = cluster3(11);
    let leader = c.await_leader();
    c.run_for(100);
    let incr = Command::Incr { key: "n".into(), delta: 1 };
    let first = c.request(leader, incr.clone(), Some(Durability::Replicated), None, 7, 1);
    let first = c.await_reply(first, 100);
    let retry = c.request(leader, incr, Some(Durability::Replicated), None, 7, 1);
    let retry = c.await_reply(retry, 100);
    assert_eq!(first.result, retry.result);
    assert_eq!(c.engine(leader).read_applied(b"n").unwrap().0, Some(Value::from_static(b"1")));
}

#[test]
fn a_write_that_waits_too_long_times_out_and_its_retry_is_answered_once() {
    let mut c = Cluster::new(3, 23, |config| config.request_timeout = Span::from_millis(200));
    let leader = c.await_leader();
    c.run_for(100);
    // The followers' disks stall: a `durable` write cannot reach a majority's disk in time.
    for id in ids(3).into_iter().filter(|id| *id != leader) {
        c.fsync_of.insert(id, 2_000 * MS);
    }
    let incr = Command::Incr { key: "n".into(), delta: 1 };
    let first = c.request(leader, incr.clone(), Some(Durability::Durable), None, 7, 1);
    let first = c.await_reply(first, 1_000);
    assert_eq!(first.result, Err(KeelError::Timeout));
    assert!(first.result.unwrap_err().is_retryable(), "a timed-out write may be retried");
    assert_eq!(c.engine(leader).counters().writes_timed_out, 1);
    c.fsync_of.clear();
    c.run_for(3_000);
    // The retry carries the same (client, request): answered from the entry already in
    // the log, not applied a second time.
    let retry = c.request(leader, incr, Some(Durability::Durable), None, 7, 1);
    let retry = c.await_reply(retry, 1_000);
    assert!(matches!(retry.result, Ok(CommandResult::Counter { value: 1, .. })), "{retry:?}");
    assert_eq!(c.engine(leader).read_applied(b"n").unwrap().0, Some(Value::from_static(b"1")));
}

#[test]
fn limits_are_enforced_with_clear_errors() {
    let mut c = Cluster::new(3, 12, |config| {
        config.limits.key_bytes_max = 8;
        config.pending_requests_max = 2;
        config.undurable_entries_max = 50;
    });
    let leader = c.await_leader();
    c.run_for(100);
    let tag = c.put(leader, "a-very-long-key", "v", Durability::Memory);
    assert!(matches!(c.reply(tag).unwrap().result, Err(KeelError::KeyTooLarge { .. })));
    let tag = c.request(
        leader,
        Command::Incr { key: "s".into(), delta: 1 },
        Some(Durability::Memory),
        None,
        5,
        1,
    );
    assert!(c.reply(tag).unwrap().result.is_ok());
    c.put(leader, "s", "text", Durability::Memory);
    let tag = c.request(
        leader,
        Command::Incr { key: "s".into(), delta: 1 },
        Some(Durability::Memory),
        None,
        5,
        2,
    );
    assert_eq!(c.reply(tag).unwrap().result, Err(KeelError::NotAnInteger));
    c.fsync = 100 * MS;
    c.put(leader, "p", "1", Durability::Durable);
    c.put(leader, "q", "1", Durability::Durable);
    let busy = c.put(leader, "r", "1", Durability::Durable);
    let busy = c.reply(busy).unwrap();
    assert!(
        matches!(busy.result, Err(KeelError::Busy(_)))
            && busy.result.as_ref().unwrap_err().is_retryable()
    );
    c.run_for(500);
    let mut saw_busy = false;
    for i in 0..60 {
        let tag = c.put(leader, &format!("b{i}"), "v", Durability::Memory);
        saw_busy |= matches!(c.reply(tag).unwrap().result, Err(KeelError::Busy(_)));
    }
    assert!(saw_busy, "undurable_entries_max bounds the backlog");
    let mut c = Cluster::new(3, 19, |config| {
        config.limits.value_bytes_max = 1000;
        config.state_bytes_max = 4000;
    });
    let leader = c.await_leader();
    c.run_for(100);
    let big = "x".repeat(900);
    let results: Vec<_> =
        (0..6).map(|i| c.put(leader, &format!("k{i}"), &big, Durability::Memory)).collect();
    let full = c.reply(results[5]).unwrap();
    assert!(
        matches!(full.result, Err(KeelError::Unavailable(_))),
        "state_bytes_max bounds the state"
    );
    let delete = c.request(leader, Command::Delete { key: "k0".into() }, None, None, 9, 1);
    assert!(c.reply(delete).unwrap().result.is_ok(), "deletes are always accepted");
}

#[test]
fn scans_are_ordered_and_make_what_they_return_durable() {
    let mut c = cluster3(13);
    let leader = c.await_leader();
    c.run_for(100);
    for key in ["b", "a", "c", "d"] {
        c.put(leader, key, key, Durability::Memory);
    }
    c.request(leader, Command::Delete { key: "c".into() }, Some(Durability::Memory), None, 1, 999);
    let scan = Command::Scan { start: "a".into(), end: Some("d".into()), limit: 10 };
    let tag = c.request(leader, scan, None, Some(ReadLevel::Monotonic), 2, 0);
    let reply = c.await_reply(tag, 500);
    assert!(reply.durability_round);
    let Ok(CommandResult::Items { items }) = reply.result else { panic!("not items") };
    let keys: Vec<&[u8]> = items.iter().map(|(k, _, _)| &k[..]).collect();
    assert_eq!(keys, vec![b"a".as_slice(), b"b".as_slice()]);
}

/// A request in flight in the randomized test: its tag, the `(key, value)` of a durable
/// write (checked after the run), and the key.
type Pending = (RequestTag, Option<(Vec<u8>, Vec<u8>)>, Vec<u8>);

/// A small randomized run: random partitions, crashes and restarts while clients write
/// and read at `monotonic` on every node. Checks cross-client monotonic reads (no read
/// returns a version older than one any earlier read returned) and that acknowledged
/// `durable` writes survive.
#[test]
fn randomized_faults_keep_reads_monotonic_and_durable_writes() {
    let mut total_reads = 0;
    for seed in 0..24u64 {
        let mut rng = keel_types::rng::SplitMix64::new(seed);
        let mut c = Cluster::new(5, seed, |_| {});
        c.await_leader();
        let mut newest_read: BTreeMap<Vec<u8>, Version> = BTreeMap::new();
        let mut acked_durable: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let mut pending: Vec<Pending> = Vec::new();
        let mut request = 1u64;
        let mut reads_served = 0u32;
        for round in 0..80u64 {
            let node = NodeId(rng.range(1, 6) as u32);
            let key = format!("k{}", rng.range(0, 4)).into_bytes();
            if c.nodes[&node].replica.is_some() {
                if rng.range(0, 2) == 0 {
                    let value = format!("v{round}").into_bytes();
                    let durability = Durability::ALL[rng.range(0, 3) as usize];
                    let cmd = Command::Put { key: key.clone().into(), value: value.clone().into() };
                    let tag = c.request(node, cmd, Some(durability), None, seed * 100 + 1, request);
                    request += 1;
                    let track = (durability == Durability::Durable).then(|| (key.clone(), value));
                    pending.push((tag, track, key));
                } else {
                    let tag = c.request(
                        node,
                        Command::Get { key: key.clone().into() },
                        None,
                        Some(ReadLevel::Monotonic),
                        2,
                        0,
                    );
                    pending.push((tag, None, key));
                }
            }
            match rng.range(0, 16) {
                0 => {
                    let a = NodeId(rng.range(1, 6) as u32);
                    let b = NodeId(rng.range(1, 6) as u32);
                    c.isolate(&[a, b]);
                }
                1 => c.heal(),
                3 if rng.range(0, 3) == 0 => {
                    for id in ids(5) {
                        if c.nodes[&id].replica.is_some() {
                            c.crash(id);
                        }
                        c.boot(id);
                    }
                }
                2 => {
                    let victim = NodeId(rng.range(1, 6) as u32);
                    if c.nodes[&victim].replica.is_some() {
                        c.crash(victim);
                    } else {
                        c.boot(victim);
                    }
                }
                _ => {}
            }
            c.run_for(rng.range(5, 120));
            pending.retain(|(tag, track, key)| {
                let Some(reply) = c.reply(*tag) else { return true };
                match (&reply.result, track) {
                    (Ok(CommandResult::Value { version: Some(v), .. }), _) => {
                        let newest = newest_read.entry(key.clone()).or_default();
                        assert!(*v >= *newest, "seed {seed}: read {v} after {newest} of {key:?}");
                        *newest = *v;
                        reads_served += 1;
                    }
                    (Ok(CommandResult::Written { .. }), Some(kv)) => acked_durable.push(kv.clone()),
                    _ => {}
                }
                false
            });
        }
        eprintln!(
            "seed {seed}: {reads_served} reads served, {} durable writes acknowledged",
            acked_durable.len()
        );
        total_reads += reads_served;
        c.heal();
        for id in ids(5) {
            if c.nodes[&id].replica.is_none() {
                c.boot(id);
            }
        }
        let leader = c.await_leader();
        c.run_for(500);
        for (key, _) in &acked_durable {
            assert!(
                c.engine(leader).read_applied(key).is_some(),
                "seed {seed}: a durable write was lost"
            );
        }
        for (key, read) in &newest_read {
            let now = c.engine(leader).read_applied(key).map(|(_, v)| v).unwrap_or_default();
            assert!(
                now >= *read,
                "seed {seed}: {key:?} read at {read} but the survivor holds {now}"
            );
        }
    }
    assert!(total_reads >= 100, "the run exercised reads: {total_reads}");
}

#[test]
fn a_slow_follower_is_forced_out_and_readmitted_when_it_catches_up() {
    let mut c = Cluster::new(3, 14, |config| {
        config.slow_follower_lag_max = 5;
        config.slow_follower_timeout = Span::from_millis(100);
        config.flush_interval = Span::from_millis(20);
    });
    let leader = c.await_leader();
    c.run_for(200);
    let slow = c.nodes.keys().copied().find(|n| *n != leader).unwrap();
    c.fsync_of.insert(slow, 400 * MS);
    for i in 0..20 {
        c.put(leader, &format!("k{i}"), "v", Durability::Memory);
        c.run_for(10);
    }
    assert!(
        c.run_until_cond(2_000, |c| !c.status(leader).active_set.contains(&slow)),
        "forced out"
    );
    assert!(!c.status(slow).active, "it acknowledged the mark-out first");
    assert_eq!(c.engine(leader).counters().removals, 1);
    c.fsync_of.remove(&slow);
    assert!(
        c.run_until_cond(3_000, |c| c.status(leader).active_set.contains(&slow)),
        "re-admitted"
    );
}

#[test]
fn a_slow_member_of_a_bare_majority_active_set_gets_its_lease_back() {
    // Three nodes, an active set of two (the leader and one follower): the follower cannot
    // be removed (the set would fall below a majority), so marking it out when it is slow
    // must not last. It used to: the mark-out stayed forever and the follower never held
    // a lease again (found by `keel sim run` with an active-set target of a majority).
    let mut c = Cluster::new(3, 15, |config| {
        config.active_set_target = 2;
        config.slow_follower_lag_max = 5;
        config.slow_follower_timeout = Span::from_millis(100);
        config.flush_interval = Span::from_millis(20);
    });
    let leader = c.await_leader();
    c.run_for(300);
    let member = c.status(leader).active_set.iter().copied().find(|n| *n != leader);
    let member = member.expect("the active set holds one follower");
    assert!(c.status(member).active, "the member holds a lease");
    c.fsync_of.insert(member, 400 * MS);
    for i in 0..20 {
        c.put(leader, &format!("k{i}"), "v", Durability::Memory);
        c.run_for(10);
    }
    c.run_for(500);
    assert!(c.status(leader).active_set.contains(&member), "never removed below a majority");
    c.fsync_of.remove(&member);
    assert!(
        c.run_until_cond(3_000, |c| c.status(member).active),
        "the member holds a lease again once it has caught up"
    );
}

/// The negative control for ORCA Fig. 5(i): with a removal timeout shorter than the
/// mark-out timeout (allowed only by `unsafe_allow_hasty_removal`), the leader drops a
/// partitioned follower while it still holds its lease, and the follower serves an older
/// value than a client has already read. With the safe configuration the same script
/// does not produce the stale read.
#[test]
fn hasty_removal_exposes_a_stale_read_and_the_safe_timeout_does_not() {
    for hasty in [true, false] {
        let mut c = Cluster::new(3, 15, |config| {
            if hasty {
                config.unsafe_allow_hasty_removal = true;
                config.removal_timeout = Span::from_millis(40);
            }
        });
        let leader = c.await_leader();
        c.run_for(200);
        let follower = c.nodes.keys().copied().find(|n| *n != leader).unwrap();
        let tag = c.put(leader, "a", "a1", Durability::Durable);
        c.await_reply(tag, 500);
        c.run_for(100);
        assert!(
            c.status(follower).durable_index
                >= c.engine(follower).read_applied(b"a").unwrap().1.index
        );
        c.isolate(&[follower]);
        c.put(leader, "a", "a2", Durability::Memory);
        let newer = c.get(leader, "a", ReadLevel::Monotonic);
        let newer = c.await_reply(newer, 1_000);
        assert_eq!(Cluster::value_of(&newer), Some(Value::from_static(b"a2")));
        let stale = c.get(follower, "a", ReadLevel::Monotonic);
        let stale = c.reply(stale).cloned();
        let served_a1 = stale.is_some_and(|r| {
            r.result.is_ok() && Cluster::value_of(&r) == Some(Value::from_static(b"a1"))
        });
        assert_eq!(served_a1, hasty, "hasty={hasty}: a stale read after a2 was read");
    }
}

#[test]
fn forwards_to_a_deposed_leader_are_answered_when_the_epoch_changes() {
    let mut c = cluster3(16);
    let old = c.await_leader();
    c.run_for(200);
    let follower = c.nodes.keys().copied().find(|n| *n != old).unwrap();
    c.isolate(&[old]);
    let write = c.put(follower, "k", "v", Durability::Memory);
    let read = c.get(follower, "k", ReadLevel::Linearizable);
    assert!(c.reply(write).is_none() && c.reply(read).is_none(), "forwarded to the old leader");
    let start = c.now;
    assert!(c.run_until_cond(3_000, |c| c.leader().is_some_and(|l| l != old)));
    let write = c.await_reply(write, 100);
    let read = c.await_reply(read, 100);
    assert!(c.now - start < 2_000 * MS, "answered at the epoch change, not at request_timeout");
    assert_eq!(write.result, Err(KeelError::Timeout), "a forwarded write's outcome is unknown");
    assert!(matches!(read.result, Err(KeelError::NotLeader { .. })));
    assert!(write.result.unwrap_err().is_retryable());
}

#[test]
fn the_active_set_is_capped_at_its_target() {
    let mut c = Cluster::new(5, 17, |config| config.active_set_target = 4);
    let leader = c.await_leader();
    assert!(c.run_until_cond(2_000, |c| c.status(leader).active_set.len() == 4), "ORCA's 4 of 5");
    c.run_for(500);
    assert_eq!(c.status(leader).active_set.len(), 4, "stays capped");
    let outside =
        c.nodes.keys().copied().find(|n| !c.status(leader).active_set.contains(n)).unwrap();
    assert!(!c.status(outside).active, "the follower outside holds no lease");
    c.put(leader, "k", "v", Durability::Memory);
    let read = c.get(outside, "k", ReadLevel::Monotonic);
    assert_eq!(c.await_reply(read, 500).served_by, leader, "a non-member forwards");
}

/// ORCA Fig. 1(i): a write held in memory by a majority, read by a client, then a crash
/// of a majority member and an election among nodes that never saw it. With CAD the read
/// made the write durable on the whole active set first, so it survives.
#[test]
fn figure_1i_a_read_write_survives_a_crash_and_an_election_without_it() {
    let mut c = Cluster::new(5, 18, |_| {});
    let leader = c.await_leader();
    c.run_for(200);
    let others: Vec<NodeId> = c.nodes.keys().copied().filter(|n| *n != leader).collect();
    let (s2, s3, slow) = (others[0], others[1], [others[2], others[3]]);
    c.isolate(&slow);
    let tag = c.put(leader, "b", "b", Durability::Replicated);
    c.await_reply(tag, 200);
    let read = c.get(leader, "b", ReadLevel::Monotonic);
    let read = c.await_reply(read, 2_000);
    assert_eq!(Cluster::value_of(&read), Some(Value::from_static(b"b")));
    assert!(read.durability_round);
    // The leader and S3 crash; S2, S3 and the two slow nodes must elect someone with b.
    c.crash(leader);
    c.crash(s3);
    c.heal();
    c.boot(s3);
    let new = c.await_leader();
    assert_ne!(new, leader);
    let again = c.get(new, "b", ReadLevel::Linearizable);
    assert_eq!(Cluster::value_of(&c.await_reply(again, 2_000)), Some(Value::from_static(b"b")));
    assert!(c.engine(s2).read_applied(b"b").is_some());
}

#[test]
fn a_follower_whose_clock_restarted_lower_rejoins_safely() {
    let mut c = cluster3(20);
    let leader = c.await_leader();
    c.run_for(300);
    let follower = c.nodes.keys().copied().find(|n| *n != leader).unwrap();
    assert!(c.status(follower).active);
    c.crash(follower);
    // A machine reboot: the follower's clock now reads far less than before the crash.
    c.nodes.get_mut(&follower).unwrap().offset = 0;
    c.now += 10 * MS;
    c.boot(follower);
    assert!(!c.status(follower).active);
    assert!(c.run_until_cond(2_000, |c| c.status(follower).active), "leases are granted again");
    let tag = c.put(leader, "k", "v", Durability::Memory);
    c.await_reply(tag, 10);
    let read = c.get(leader, "k", ReadLevel::Monotonic);
    assert!(c.await_reply(read, 1_000).durability_round);
    assert!(c.run_until_cond(1_000, |c| c.status(follower).durable_index
        >= c.status(leader).durable_index));
}

#[test]
fn a_returning_partitioned_follower_does_not_depose_the_leader() {
    let mut c = cluster3(21);
    let leader = c.await_leader();
    c.run_for(200);
    let epoch = c.status(leader).epoch;
    let follower = c.nodes.keys().copied().find(|n| *n != leader).unwrap();
    c.isolate(&[follower]);
    c.run_for(2_000);
    assert_eq!(c.status(follower).epoch, epoch, "pre-votes fail without a majority: no new epoch");
    c.heal();
    assert!(c.run_until_cond(1_000, |c| c.status(follower).active));
    assert_eq!(c.leader(), Some(leader));
    assert_eq!(c.status(leader).epoch, epoch);
}

/// A node outside the active set learns a durable index above what it has fsynced, then
/// wins an election before its fsync completes (found by the simulator, seed 102391).
/// The inherited durable index stays (it is durable on the old active set), the new leader
/// fsyncs its log at once, and it serves a `monotonic` read above its own disk only after
/// that fsync returns. Before the fix the engine panicked on election ("durable beyond
/// the leader's own disk").
#[test]
fn a_leader_elected_with_an_inherited_durable_index_fsyncs_before_serving_above_its_disk() {
    let (n1, n2, n3) = (NodeId(1), NodeId(2), NodeId(3));
    let config = Config::new(n1, ids(3));
    let mut engine = LeaderEngine::new(config, PersistedState::default(), 7, Time(0)).unwrap();
    let e1 = Epoch(1);
    let write = |index: u64, key: &str| Entry {
        epoch: e1,
        index: LogIndex(index),
        payload: EntryPayload::Write {
            client: ClientId(9),
            request: RequestId(index),
            durability: Durability::Memory,
            command: Command::Put { key: Key::copy_from_slice(key.as_bytes()), value: "v".into() },
        },
    };
    // Leader 2 of epoch 1 sends entries 1..=2 with durable index 2; node 1 is not granted a
    // lease (outside the active set) and its fsync never returns before the election.
    let append = Message::Append {
        epoch: e1,
        prev_epoch: Epoch(0),
        prev_index: LogIndex::ZERO,
        entries: vec![write(1, "a"), write(2, "k")],
        commit_index: LogIndex(2),
        durable_index: LogIndex(2),
        lease: Lease::Withheld,
        flush_through: None,
        sent_at: Time(MS),
    };
    engine.step(Time(MS), Input::Message { from: n2, message: append });
    let status = engine.status();
    assert_eq!((status.durable_index, status.persisted_index), (LogIndex(2), LogIndex::ZERO));

    // Leader 2 falls silent: node 1 probes, then campaigns, and node 3 votes for it.
    let mut now = Time(2_000 * MS);
    let out = engine.step(now, Input::Tick);
    assert!(out.messages.iter().any(|(_, m)| matches!(m, Message::PreVote { .. })));
    let grant = Message::PreVoteReply { epoch: e1, granted: true };
    engine.step(now, Input::Message { from: n3, message: grant });
    let vote = Message::Vote { epoch: Epoch(2), granted: true };
    let out = engine.step(now, Input::Message { from: n3, message: vote });
    let status = engine.status();
    assert_eq!(status.role, Role::Leader, "node 1 won epoch 2");
    assert_eq!(status.durable_index, LogIndex(2), "the inherited durable index is kept");
    assert!(status.persisted_index < status.durable_index, "the situation under test");
    assert!(out.sync_through.is_some_and(|i| i >= LogIndex(3)), "fsyncs its log at once");

    // Node 3 acknowledges the new leader (lease), then a monotonic read of `k` (written at
    // 2, durable but not on this disk) must wait for the leader's own fsync.
    let sent_at = now;
    now = now + Span::from_millis(1);
    let reply = Message::AppendReply {
        epoch: Epoch(2),
        success: true,
        last_index: LogIndex(2),
        persisted_index: LogIndex(2),
        applied_index: LogIndex(2),
        match_index: LogIndex(2),
        released: false,
        echo_sent_at: sent_at,
        sent_at: Time(5 * MS),
    };
    engine.step(now, Input::Message { from: n3, message: reply });
    assert!(engine.status().leader_lease_valid);
    let read = ClientRequest {
        tag: RequestTag(1),
        client: ClientId(4),
        request: RequestId(0),
        command: Command::Get { key: "k".into() },
        durability: None,
        level: Some(ReadLevel::Monotonic),
        after: LogIndex::ZERO,
        mode: Default::default(),
        named: false,
    };
    let out = engine.step(now, Input::Client(read));
    assert!(out.replies.is_empty(), "served above the leader's own persisted index");
    assert_eq!(engine.counters().durability_rounds, 0, "already durable: no round");
    now = now + Span::from_millis(1);
    let out = engine.step(now, Input::LogSynced { index: LogIndex(3) });
    let reply = out.replies.iter().find(|r| r.tag == RequestTag(1)).expect("served after fsync");
    assert_eq!(Cluster::value_of(reply), Some(Value::from_static(b"v")));
    assert!(engine.status().persisted_index >= engine.status().durable_index);
}

/// Leases over round trips longer than the heartbeat interval (the geo setting): every
/// grant echoes a reply at least one round trip old, so a follower must not raise its lease
/// floor on replies nobody asked it to acknowledge. Followers become active and serve
/// monotonic reads locally, and a forced mark-out is still acknowledged and completed.
#[test]
fn leases_hold_and_mark_outs_complete_when_the_round_trip_exceeds_the_heartbeat() {
    let mut c = Cluster::new(3, 21, |config| {
        config.mark_out_timeout = Span::from_millis(300);
        config.removal_timeout = Span::from_millis(1_500);
        config.election_timeout_min = Span::from_millis(1_000);
        config.election_timeout_max = Span::from_millis(2_000);
        config.slow_follower_lag_max = 5;
        config.slow_follower_timeout = Span::from_millis(200);
    });
    c.latency = 20 * MS; // a 40 ms round trip against a 25 ms heartbeat interval
    assert!(c.config.heartbeat_interval.0 < 2 * c.latency);
    let leader = c.await_leader();
    let tag = c.put(leader, "k", "v", Durability::Memory);
    c.await_reply(tag, 1_000);
    let followers: Vec<NodeId> = c.nodes.keys().copied().filter(|n| *n != leader).collect();
    assert!(
        c.run_until_cond(1_000, |c| followers.iter().all(|f| c.status(*f).active)),
        "followers never accepted a lease"
    );
    c.run_for(500); // past the background flush: `k` is durable, no round needed
    for follower in &followers {
        let tag = c.get(*follower, "k", ReadLevel::Monotonic);
        let reply = c.await_reply(tag, 10);
        assert_eq!(reply.served_by, *follower, "served locally, not forwarded");
        assert_eq!(Cluster::value_of(&reply), Some(Value::from_static(b"v")));
    }

    // A follower with a slow disk is marked out; it keeps answering heartbeats, so only its
    // acknowledgement (not the removal timeout) can take it out of the set.
    let slow = followers[0];
    c.fsync_of.insert(slow, 5_000 * MS);
    for i in 0..20 {
        c.put(leader, &format!("s{i}"), "v", Durability::Memory);
        c.run_for(10);
    }
    assert!(
        c.run_until_cond(1_000, |c| !c.status(leader).active_set.contains(&slow)),
        "the mark-out was never acknowledged"
    );
    assert!(!c.status(slow).active, "it dropped its lease before the leader removed it");
    assert!(c.status(followers[1]).active, "the other follower kept its lease");
}

#[test]
fn a_new_leader_grants_no_lease_to_a_follower_that_lacks_a_durable_write() {
    // A follower cut off while a write became durable, and a leader that restarted (its
    // durable index back at its snapshot's) and won the next election: the leader used to
    // grant the follower a lease on its first reply, before it held the write, and the
    // follower served `monotonic` reads without it (keyspaces seed 9820328). Now a grant
    // waits until the follower has persisted and applied the new epoch's no-op.
    let mut c = Cluster::new(3, 21, |_| {});
    let leader = c.await_leader();
    c.run_for(200);
    let others: Vec<NodeId> = c.nodes.keys().copied().filter(|n| *n != leader).collect();
    let (cut, keeper) = (others[0], others[1]);
    c.isolate(&[cut]);
    c.run_for(800);
    assert!(!c.status(leader).active_set.contains(&cut), "the cut follower left the set");
    let tag = c.put(leader, "a", "1", Durability::Durable);
    let reply = c.await_reply(tag, 1_000);
    assert!(reply.result.is_ok(), "{reply:?}");
    c.crash(leader);
    c.crash(keeper);
    c.boot(keeper);
    // The new leader's entries to the follower are lost for a while (a stalled
    // connection), while its heartbeats pass.
    c.entries_lost_to.insert(cut);
    c.heal();
    let mut leased_without_it = 0;
    for _ in 0..3_000 {
        c.run_for(1);
        if c.status(cut).active && c.engine(cut).read_applied(b"a").is_none() {
            leased_without_it += 1;
        }
        if c.now > 2_600 * MS {
            c.entries_lost_to.clear();
        }
        if c.leader() == Some(keeper) && c.status(cut).active && c.now > 2_600 * MS {
            break;
        }
    }
    assert_eq!(c.leader(), Some(keeper), "the node holding the write leads");
    assert!(c.status(cut).active, "the follower gets its lease once it has caught up");
    assert_eq!(leased_without_it, 0, "ms the follower held a lease without the durable write");
}

/// Asks `node` to move keyspace 0's leadership to `target`.
fn transfer(c: &mut Cluster, node: NodeId, target: NodeId) -> RequestTag {
    let command = Command::Cluster(ClusterOp::TransferLeader(target));
    let request = c.next_tag;
    c.request(node, command, None, None, 9, request)
}

#[test]
fn a_transfer_moves_the_leadership_after_the_old_leader_gives_up_its_lease() {
    let mut c = cluster3(7);
    let old = c.await_leader();
    let put = c.put(old, "k", "v", Durability::Durable);
    c.await_reply(put, 1_000);
    let target = c.nodes.keys().copied().find(|n| *n != old).unwrap();
    let asked = transfer(&mut c, old, target);
    // No write while the leadership moves (the target must hold the log's end).
    let refused = c.put(old, "k", "w", Durability::Memory);
    let reply = c.reply(refused).expect("refused at once").clone();
    assert!(matches!(reply.result, Err(KeelError::Busy(_))), "{reply:?}");
    // From the hand-over on, the old leader holds no lease (the one-lease check runs
    // after every event too).
    assert!(c.run_until_cond(1_000, |c| c.status(old).handed_over), "no hand-over");
    assert!(!c.status(old).leader_lease_valid, "the lease outlived the hand-over");
    let reply = c.await_reply(asked, 2_000);
    assert!(matches!(reply.result, Ok(CommandResult::Written { .. })), "{reply:?}");
    assert_eq!(c.await_leader(), target);
    assert_eq!(c.status(old).role, Role::Follower);
    assert_eq!(c.status(old).leader, Some(target));
    assert_eq!(c.counters(target).elections, 1, "one campaign, no pre-vote round lost");
    let read = c.get(target, "k", ReadLevel::Linearizable);
    assert_eq!(Cluster::value_of(&c.await_reply(read, 1_000)), Some(Value::from("v")));
}

#[test]
fn a_transfer_asked_at_a_follower_is_answered_across_the_epoch_change() {
    let mut c = cluster3(8);
    let old = c.await_leader();
    let target = c.nodes.keys().copied().find(|n| *n != old).unwrap();
    // Asked at the target itself: it forwards, then campaigns, then leads.
    let asked = transfer(&mut c, target, target);
    let reply = c.await_reply(asked, 2_000);
    assert!(matches!(reply.result, Ok(CommandResult::Written { .. })), "{reply:?}");
    assert_eq!(c.await_leader(), target);
    // Again to the node that leads now: done at once.
    let again = transfer(&mut c, old, target);
    let reply = c.await_reply(again, 1_000);
    assert!(matches!(reply.result, Ok(CommandResult::Written { .. })), "{reply:?}");
}

#[test]
fn a_transfer_to_a_voter_that_cannot_catch_up_is_given_up_and_the_leader_stays() {
    let mut c = cluster3(9);
    let leader = c.await_leader();
    let target = c.nodes.keys().copied().find(|n| *n != leader).unwrap();
    cut(&mut c, &[leader], &[target]);
    let put = c.put(leader, "k", "v", Durability::Replicated);
    c.await_reply(put, 1_000);
    let asked = transfer(&mut c, leader, target);
    let reply = c.await_reply(asked, 2_000);
    assert!(matches!(&reply.result, Err(KeelError::Busy(why)) if why.contains("catch up")));
    assert!(!c.status(leader).handed_over);
    assert_eq!(c.leader(), Some(leader), "it goes on leading, its lease intact");
    let put = c.put(leader, "k", "w", Durability::Replicated);
    assert!(c.await_reply(put, 1_000).result.is_ok(), "writes again");
}

#[test]
fn a_voter_passes_its_stickiness_only_for_a_transfer_of_its_next_epoch() {
    let mut c = cluster3(2);
    let leader = c.await_leader();
    let follower = c.nodes.keys().copied().find(|n| *n != leader).unwrap();
    let other = c.nodes.keys().copied().find(|n| *n != leader && *n != follower).unwrap();
    let epoch = c.status(follower).epoch;
    let ask = |epoch: Epoch| Message::RequestVote {
        epoch,
        last_epoch: epoch,
        last_index: LogIndex(100),
        transfer: true,
    };
    let (from, skipping) = (other, ask(epoch.next().next()));
    c.step(follower, Input::Message { from, message: skipping });
    assert_eq!(c.status(follower).epoch, epoch, "two epochs ahead: stickiness holds");
    c.step(follower, Input::Message { from, message: ask(epoch.next()) });
    assert_eq!(c.status(follower).epoch, epoch.next(), "the next epoch: voted");
    assert_eq!(c.counters(follower).transfer_votes, 1);
    // The leader, which handed nothing over, refuses the same request.
    let before = c.status(leader).epoch;
    c.step(leader, Input::Message { from: other, message: ask(before.next()) });
    assert_eq!(c.status(leader).role, Role::Leader, "a leader that kept its lease refuses");
}

#[test]
fn a_node_made_a_voter_in_an_epoch_votes_only_in_later_ones() {
    // Node 4 became a voter by a membership entry of epoch 5, which already has its
    // leader; its vote of epoch 5 is forgotten (a wiped disk, added again under its id).
    // A second vote in epoch 5 could elect a second leader there: only epoch 6 on.
    let epoch = Epoch;
    let voters = Membership { voters: ids(4), learners: Vec::new() };
    let entries = vec![
        Entry { epoch: epoch(5), index: LogIndex(1), payload: EntryPayload::Noop },
        Entry { epoch: epoch(5), index: LogIndex(2), payload: EntryPayload::Membership(voters) },
    ];
    let persisted = PersistedState {
        hard_state: HardState {
            epoch: epoch(5),
            voted_for: None,
            repair_floor: None,
            members_epoch: 0,
        },
        snapshot: None,
        entries,
    };
    let mut config = Config::new(NodeId(4), ids(3));
    config.joining = true;
    let mut engine = LeaderEngine::new(config, persisted, 4, Time(0)).unwrap();
    assert_eq!(engine.status().voters, ids(4), "a voter by its log");
    let vote = |e| Message::RequestVote {
        epoch: epoch(e),
        last_epoch: epoch(5),
        last_index: LogIndex(2),
        transfer: false,
    };
    let granted = |out: &Outputs| {
        out.messages.iter().any(|(_, m)| matches!(m, Message::Vote { granted: true, .. }))
    };
    let quiet = 300 * MS; // past the boot stickiness
    let out = engine.step(Time(quiet), Input::Message { from: NodeId(2), message: vote(5) });
    assert!(!granted(&out), "a vote in the epoch of its membership entry");
    let out = engine.step(Time(quiet + 1), Input::Message { from: NodeId(3), message: vote(6) });
    assert!(granted(&out), "the next epoch's vote");
    assert_eq!(engine.status().epoch, epoch(6));
}

#[test]
fn a_target_whose_log_does_not_end_where_the_leaders_does_ignores_timeout_now() {
    // The leader judges the target's log from its replies; a crash since may have cut it.
    let mut c = cluster3(3);
    let leader = c.await_leader();
    let put = c.put(leader, "k", "v", Durability::Replicated);
    c.await_reply(put, 1_000);
    c.run_for(50);
    let target = c.nodes.keys().copied().find(|n| *n != leader).unwrap();
    let status = c.status(target);
    let (epoch, last) = (status.epoch, status.last_index);
    let timeout_now = |last_index| Message::TimeoutNow { epoch, last_epoch: epoch, last_index };
    c.step(target, Input::Message { from: leader, message: timeout_now(last.next()) });
    assert_eq!(c.status(target).epoch, epoch, "campaigned on a log short of the leader's");
    c.step(target, Input::Message { from: leader, message: timeout_now(last) });
    assert_eq!(c.status(target).epoch, epoch.next(), "its log ends there: it campaigns");
    assert_eq!(c.status(target).role, Role::Candidate);
}
