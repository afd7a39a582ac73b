//! The world a trace runs in: N nodes, each the loop body the server and the simulator
//! run (`keel_exec::Replica`, no append hold) over the write-ahead log on a simulated
//! disk (`keel_exec::VirtualDisk<SimStorage>`), and a network of in-flight messages.
//! Nothing happens unless a command says so: time moves by `advance`, timers fire by
//! `tick`, messages arrive by `deliver`, disk work completes by `disk`.

use crate::script::Cmd;
use keel_core::engine::{ClientReply, ClientRequest, Engine, Input, OpMode, PersistedState};
use keel_core::engine::{FromClient, OutputsOf, RequestTag, RoleView};
use keel_core::time::Time;
use keel_exec::{AppendHold, Completion, Front, Io, Replica, StorageOp, VirtualDisk};
use keel_storage::{SimStorage, Storage, StorageConfig};
use keel_types::{
    ClientId, Command, CommandResult, Durability, Entry, HardState, Key, LogIndex, LogRecord,
    NodeId, ReadLevel, RequestId, SnapshotMeta, Value,
};
use std::collections::{BTreeMap, BTreeSet};

const MS: u64 = 1_000_000;

/// Fault switches a runner turns on: an engine's negative-control flag by its name, or
/// one of the host's own (see [`HOST_CONTROLS`]).
#[derive(Clone, Debug, Default)]
pub struct Controls(pub BTreeSet<String>);

/// The switches the host itself implements.
pub const HOST_CONTROLS: [&str; 3] = [
    // The host sends a step's messages and replies at once, not after its hard state
    // is durable (the front's barrier skipped).
    "hard-state-unwaited",
    // The disk acknowledges every operation as soon as it is handed over, and syncs
    // nothing: a crash leaves it blank.
    "fsync-lies",
    // Client reads carry no session floor (`ClientRequest::after` is 0).
    "floor-dropped",
];

impl Controls {
    pub fn on(&self, name: &str) -> bool {
        self.0.contains(name)
    }
}

/// What a trace needs of an engine beyond [`Engine`]: its configuration, its negative
/// controls, and one-line forms of its messages and status.
pub trait Traced: Engine<Message: keel_wire::peer::PeerMessage> {
    /// The configuration of `node` among `members`, with the `cluster` command's options
    /// (those the runner does not take itself).
    fn configure(
        node: NodeId,
        members: Vec<NodeId>,
        options: &BTreeMap<String, String>,
    ) -> Result<Self::Config, String>;
    /// Turns on the engine's negative control `name`; whether it has one of that name.
    fn control(config: &mut Self::Config, name: &str) -> bool;
    /// A message on one line.
    fn message(message: &Self::Message) -> String;
    /// The node's state on one line.
    fn status_line(&self) -> String;
}

struct Node<E: Engine> {
    replica: Option<Replica<E>>,
    disk: VirtualDisk<SimStorage<E::Record>>,
    /// Messages the `hard-state-unwaited` host sent early, which the front will let go
    /// of later (sent once only).
    early: Vec<(NodeId, E::Message)>,
    early_replies: Vec<RequestTag>,
}

fn blank_disk<R: LogRecord>() -> VirtualDisk<SimStorage<R>> {
    VirtualDisk::new(SimStorage::new_sim(StorageConfig::small_segments(64 * 1024)))
}

/// A client request on its way: who asked what.
struct Asked {
    client: String,
    what: String,
}

pub struct World<E: Traced> {
    nodes: BTreeMap<NodeId, Node<E>>,
    configs: BTreeMap<NodeId, E::Config>,
    controls: Controls,
    seed: u64,
    now: u64,
    /// Messages sent and not yet delivered or dropped, in the order sent.
    flight: Vec<(NodeId, NodeId, E::Message)>,
    cut: BTreeSet<(NodeId, NodeId)>,
    next_tag: u64,
    asked: BTreeMap<RequestTag, Asked>,
    /// Each client's id, last request number and session floor.
    clients: BTreeMap<String, (ClientId, u64, LogIndex)>,
    /// The lines the current command printed.
    out: Vec<String>,
}

/// What leaves a replica during one call, in order.
enum Left<E: Engine> {
    Line(String),
    Send(NodeId, E::Message),
    Reply(E::Reply),
    Prepare(SnapshotMeta, keel_core::engine::SnapshotBytes),
}

/// The host's side of a replica's outputs during one call.
struct Collect<'a, E: Engine> {
    me: NodeId,
    left: Vec<Left<E>>,
    node_early: &'a mut Vec<(NodeId, E::Message)>,
    node_early_replies: &'a mut Vec<RequestTag>,
    unwaited: bool,
}

impl<E: Traced> Io<E> for Collect<'_, E> {
    fn send(&mut self, to: NodeId, message: E::Message) {
        if let Some(i) = self.node_early.iter().position(|(t, m)| *t == to && *m == message) {
            self.node_early.remove(i);
            return;
        }
        self.left.push(Left::Send(to, message));
    }

    fn reply(&mut self, reply: E::Reply) {
        let tag = reply.clone().into().tag;
        if let Some(i) = self.node_early_replies.iter().position(|t| *t == tag) {
            self.node_early_replies.remove(i);
            return;
        }
        self.left.push(Left::Reply(reply));
    }

    fn prepare(&mut self, meta: SnapshotMeta, data: keel_core::engine::SnapshotBytes) {
        self.left.push(Left::Prepare(meta, data));
    }

    fn rejected(&mut self, rejection: keel_core::engine::Rejection) {
        let line =
            format!("{} rejected a message of {}: {}", self.me, rejection.from, rejection.reason);
        self.left.push(Left::Line(line));
    }

    fn dropped(&mut self, messages: u64) {
        self.left.push(Left::Line(format!("{} dropped {messages} held messages", self.me)));
    }

    fn stepped(&mut self, outputs: &OutputsOf<E>) {
        if self.unwaited && outputs.hard_state.is_some() {
            for (to, message) in &outputs.messages {
                self.node_early.push((*to, message.clone()));
                self.left.push(Left::Send(*to, message.clone()));
            }
            for reply in &outputs.replies {
                self.node_early_replies.push(reply.clone().into().tag);
                self.left.push(Left::Reply(reply.clone()));
            }
        }
    }

    fn completed(&mut self, completion: &Completion) {
        let line = match completion {
            Completion::HardStateSaved { .. } => format!("{} disk: hard state saved", self.me),
            Completion::Synced { index, .. } => {
                format!("{} disk: synced through {}", self.me, index.0)
            }
            Completion::SnapshotSaved { meta } => {
                format!("{} disk: snapshot through {} saved", self.me, meta.last_index.0)
            }
        };
        self.left.push(Left::Line(line));
    }
}

fn node_id(word: &str) -> Result<NodeId, String> {
    word.strip_prefix('n')
        .and_then(|n| n.parse().ok())
        .map(NodeId)
        .ok_or_else(|| format!("not a node: {word}"))
}

/// `n1->n2`.
fn link(word: &str) -> Result<(NodeId, NodeId), String> {
    let (a, b) = word.split_once("->").ok_or_else(|| format!("not a link: {word}"))?;
    Ok((node_id(a)?, node_id(b)?))
}

fn duration(word: &str) -> Result<u64, String> {
    let bad = || format!("not a duration: {word}");
    if let Some(ms) = word.strip_suffix("ms") {
        return ms.parse::<u64>().map(|ms| ms * MS).map_err(|_| bad());
    }
    if let Some(s) = word.strip_suffix('s') {
        return s.parse::<u64>().map(|s| s * 1_000 * MS).map_err(|_| bad());
    }
    Err(bad())
}

/// The argument `key`, parsed (absent: `None`).
fn parsed<T: std::str::FromStr>(cmd: &Cmd, key: &str) -> Result<Option<T>, String> {
    let parse = |w: &String| w.parse().map_err(|_| format!("unknown {key} {w}"));
    cmd.args.get(key).map(parse).transpose()
}

/// Turns on the flag named `name` among `flags`; whether there is one.
pub fn turn_on(flags: Vec<(&str, &mut bool)>, name: &str) -> bool {
    let found = flags.into_iter().find(|(n, _)| *n == name);
    found.map(|(_, flag)| *flag = true).is_some()
}

pub fn quoted(value: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(value))
}

/// A command as a client typed it.
pub fn command_line(command: &Command) -> String {
    match command {
        Command::Get { key } => format!("GET {}", String::from_utf8_lossy(key)),
        Command::Put { key, value } => {
            format!("SET {} {}", String::from_utf8_lossy(key), String::from_utf8_lossy(value))
        }
        Command::Delete { key } => format!("DEL {}", String::from_utf8_lossy(key)),
        Command::Incr { key, delta } => format!("INCRBY {} {delta}", String::from_utf8_lossy(key)),
        Command::Cas { key, expected, new } => format!(
            "CAS {} {} {}",
            String::from_utf8_lossy(key),
            expected.as_ref().map_or("-".into(), |e| String::from_utf8_lossy(e).into_owned()),
            String::from_utf8_lossy(new)
        ),
        other => other.name().to_uppercase(),
    }
}

pub fn entry_line(entry: &Entry) -> String {
    use keel_types::EntryPayload;
    let what = match &entry.payload {
        EntryPayload::Noop => "noop".to_string(),
        EntryPayload::Settings(_) => "settings".to_string(),
        EntryPayload::Write { command, .. } => command_line(command),
        EntryPayload::Reap { keys, .. } => format!("reap {}", keys.len()),
        EntryPayload::Membership(m) => format!("membership {m}"),
    };
    format!("{}.{} {what}", entry.epoch.0, entry.index.0)
}

/// A reply's result as a client sees it.
pub fn result_line(reply: &ClientReply) -> String {
    let version = |v: Option<keel_types::Version>| match v {
        Some(v) if v.index != LogIndex::ZERO => format!(" @{v}"),
        _ => String::new(),
    };
    let text = match &reply.result {
        Err(e) => format!("error: {e}"),
        Ok(CommandResult::Value { value: None, version: v }) => format!("nil{}", version(*v)),
        Ok(CommandResult::Value { value: Some(x), version: v }) => {
            format!("{}{}", quoted(x), version(*v))
        }
        Ok(CommandResult::Written { version: v }) => format!("OK{}", version(Some(*v))),
        Ok(CommandResult::Counter { value, version: v }) => format!("{value}{}", version(Some(*v))),
        Ok(CommandResult::Cas { swapped, current, version: v }) => format!(
            "{} (found {}){}",
            if *swapped { "swapped" } else { "not swapped" },
            current.as_deref().map_or("nil".into(), quoted),
            version(*v)
        ),
        Ok(other) => format!("{other:?}"),
    };
    if reply.durability_round {
        format!("{text} (after a durability round)")
    } else {
        text
    }
}

fn hard_state_line(hard: &HardState) -> String {
    let vote = hard.voted_for.map_or(String::new(), |v| format!(" vote={v}"));
    format!("hard state e{}{vote}", hard.epoch.0)
}

fn op_line<R: LogRecord>(op: &StorageOp<R>) -> String {
    match op {
        StorageOp::HardState(hard) => hard_state_line(hard),
        StorageOp::TruncateAfter(index) => format!("truncate after {}", index.0),
        StorageOp::Append(entries) => match (entries.first(), entries.last()) {
            (Some(a), Some(b)) => match (a.version().index, b.version().index) {
                (a, b) if a == b => format!("append {}", a.0),
                (a, b) => format!("append {}..{}", a.0, b.0),
            },
            _ => "append nothing".into(),
        },
        StorageOp::Sync => "sync".into(),
        StorageOp::Snapshot(meta, _) | StorageOp::Adopt(meta, _) => {
            format!("snapshot through {}", meta.last_index.0)
        }
    }
}

fn role_line(id: NodeId, role: RoleView) -> String {
    let leader = role.leader.map_or(String::new(), |l| format!(" leader={l}"));
    format!("{id} is now {} epoch={}{leader}", role.role, role.epoch)
}

impl<E: Traced> World<E> {
    /// `cluster engine=... nodes=3 seed=1 [options]`, with `controls` on.
    /// Returns it with what booting printed.
    pub fn new(cmd: &Cmd, controls: Controls) -> Result<(World<E>, String), String> {
        let n: u32 = cmd.arg("nodes", 3)?;
        let seed: u64 = cmd.arg("seed", 1)?;
        let members: Vec<NodeId> = (1..=n).map(NodeId).collect();
        let mut options = cmd.args.clone();
        for taken in ["engine", "nodes", "seed"] {
            options.remove(taken);
        }
        let mut configs = BTreeMap::new();
        for id in &members {
            let mut config = E::configure(*id, members.clone(), &options)?;
            for name in &controls.0 {
                if !E::control(&mut config, name) && !HOST_CONTROLS.contains(&name.as_str()) {
                    return Err(format!("no control named {name}"));
                }
            }
            configs.insert(*id, config);
        }
        let mut world = World {
            nodes: BTreeMap::new(),
            configs,
            controls,
            seed,
            now: 1_000 * MS,
            flight: Vec::new(),
            cut: BTreeSet::new(),
            next_tag: 1,
            asked: BTreeMap::new(),
            clients: BTreeMap::new(),
            out: Vec::new(),
        };
        for id in members {
            let node = Node {
                replica: None,
                disk: blank_disk(),
                early: Vec::new(),
                early_replies: Vec::new(),
            };
            world.nodes.insert(id, node);
            world.boot(id)?;
        }
        let printed = world.out.join("\n");
        world.out.clear();
        Ok((world, printed))
    }

    /// Runs one command; returns what it printed.
    pub fn run(&mut self, cmd: &Cmd) -> Result<String, String> {
        self.out.clear();
        match cmd.name.as_str() {
            "tick" => {
                for id in self.targets(cmd)? {
                    self.step(id, Input::Tick);
                }
            }
            "advance" => self.now += duration(cmd.word(0)?)?,
            "deliver" => self.deliver(cmd)?,
            "drop" => {
                let (from, to) = link(cmd.word(0)?)?;
                let before = self.flight.len();
                self.flight.retain(|(f, t, _)| (*f, *t) != (from, to));
                self.out.push(format!("dropped {} messages", before - self.flight.len()));
            }
            "disk" => {
                for id in self.targets(cmd)? {
                    self.disk(id);
                }
            }
            "stabilize" => self.stabilize()?,
            "partition" => self.partition(cmd)?,
            "heal" => self.cut.clear(),
            "crash" => self.crash(node_id(cmd.word(0)?)?),
            "restart" => self.boot(node_id(cmd.word(0)?)?)?,
            "client" => self.client(cmd)?,
            "status" => {
                for id in self.targets(cmd)? {
                    let line = match &self.nodes[&id].replica {
                        None => format!("{id} down"),
                        Some(r) => format!("{id} {}", r.engine().status_line()),
                    };
                    self.out.push(line);
                }
            }
            "in-flight" => {
                for (from, to, m) in &self.flight {
                    self.out.push(format!("{from} -> {to} {}", E::message(m)));
                }
            }
            other => return Err(format!("unknown command {other}")),
        }
        Ok(if self.out.is_empty() { "ok".into() } else { self.out.join("\n") })
    }

    /// `n1`, `n1 n2` or `all`.
    fn targets(&self, cmd: &Cmd) -> Result<Vec<NodeId>, String> {
        if cmd.words.is_empty() || cmd.words == ["all"] {
            return Ok(self.nodes.keys().copied().collect());
        }
        cmd.words.iter().map(|w| node_id(w)).collect()
    }

    fn boot(&mut self, id: NodeId) -> Result<(), String> {
        let node = self.nodes.get_mut(&id).ok_or_else(|| format!("no node {id}"))?;
        if node.replica.is_some() {
            return Err(format!("{id} is running"));
        }
        let recovered = node.disk.storage_mut().recover().map_err(|e| e.to_string())?;
        let persisted = PersistedState {
            hard_state: recovered.hard_state,
            snapshot: recovered.snapshot,
            entries: recovered.entries,
        };
        let log = match (persisted.entries.first(), persisted.entries.last()) {
            (Some(a), Some(b)) => format!("log {}..{}", a.version().index.0, b.version().index.0),
            _ => "empty log".into(),
        };
        let seed = self.seed.wrapping_mul(31).wrapping_add(u64::from(id.0));
        let disk_line = format!("{}, {log}", hard_state_line(&persisted.hard_state));
        let engine = E::boot(self.configs[&id].clone(), persisted, seed, Time(self.now))
            .map_err(|e| e.to_string())?;
        node.replica = Some(Replica::new(engine, Front::new(4096), AppendHold::new(0, 1)));
        self.out.push(format!("{id} boots from {disk_line}"));
        self.step(id, Input::Tick);
        Ok(())
    }

    fn crash(&mut self, id: NodeId) {
        let lies = self.controls.on("fsync-lies");
        let Some(node) = self.nodes.get_mut(&id) else { return };
        node.replica = None;
        node.early.clear();
        node.early_replies.clear();
        node.disk.crash();
        if lies {
            node.disk = blank_disk();
        } else {
            node.disk.storage_mut().crash();
        }
        self.out.push(format!("{id} crashed"));
    }

    fn step(&mut self, id: NodeId, input: Input<E::Message, E::Request>) {
        self.drive(id, |replica, now, io| replica.step(now, input, io));
    }

    /// Runs one call into a running replica, then carries out what left it.
    fn drive(
        &mut self,
        id: NodeId,
        call: impl FnOnce(&mut Replica<E>, Time, &mut Collect<'_, E>) -> Option<RoleView>,
    ) {
        self.drive_once(id, call);
        if self.controls.on("fsync-lies") {
            // The disk answers at once, whatever it holds.
            for _ in 0..100 {
                if !self.disk(id) {
                    break;
                }
            }
        }
    }

    fn drive_once(
        &mut self,
        id: NodeId,
        call: impl FnOnce(&mut Replica<E>, Time, &mut Collect<'_, E>) -> Option<RoleView>,
    ) {
        let now = self.now;
        let unwaited = self.controls.on("hard-state-unwaited");
        let node = self.nodes.get_mut(&id).expect("a node");
        let Some(replica) = node.replica.as_mut() else { return };
        let mut io = Collect {
            me: id,
            left: Vec::new(),
            node_early: &mut node.early,
            node_early_replies: &mut node.early_replies,
            unwaited,
        };
        let role = call(replica, Time(now), &mut io);
        let left = io.left;
        let mut ops = Vec::new();
        replica.take_ready(&mut ops);
        if !ops.is_empty() {
            let list: Vec<String> = ops.iter().map(|(_, op)| op_line(op)).collect();
            self.out.push(format!("{id} disk <- {}", list.join(", ")));
        }
        node.disk.submit(ops, now, 0).expect("the simulated disk does not fail");
        if let Some(role) = role {
            self.out.push(role_line(id, role));
        }
        for item in left {
            match item {
                Left::Line(line) => self.out.push(line),
                Left::Send(to, message) => self.send(id, to, message),
                Left::Reply(reply) => self.reply(id, reply.into()),
                Left::Prepare(meta, data) => {
                    let node = self.nodes.get_mut(&id).expect("a node");
                    keel_storage::wal::prepare_snapshot(
                        node.disk.storage_mut().sim_disk(),
                        meta,
                        &data,
                    )
                    .expect("the simulated disk does not fail");
                    let replica = node.replica.as_mut().expect("running");
                    replica.prepared(Time(now), meta, data.len() as u64);
                    let mut ops = Vec::new();
                    replica.take_ready(&mut ops);
                    node.disk.submit(ops, now, 0).expect("the simulated disk does not fail");
                }
            }
        }
    }

    fn send(&mut self, from: NodeId, to: NodeId, message: E::Message) {
        let cut = if self.cut.contains(&(from, to)) { " (lost: partitioned)" } else { "" };
        self.out.push(format!("{from} -> {to} {}{cut}", E::message(&message)));
        if cut.is_empty() {
            self.flight.push((from, to, message));
        }
    }

    fn reply(&mut self, at: NodeId, reply: ClientReply) {
        let asked = self.asked.remove(&reply.tag);
        let (client, what) = asked.map_or(("?".into(), "?".into()), |a| (a.client, a.what));
        let index = match &reply.result {
            Ok(CommandResult::Written { version })
            | Ok(CommandResult::Counter { version, .. })
            | Ok(CommandResult::Cas { swapped: true, version: Some(version), .. }) => version.index,
            _ => LogIndex::ZERO,
        };
        if let Some((_, _, floor)) = self.clients.get_mut(&client) {
            *floor = (*floor).max(index);
        }
        self.out.push(format!("{at} -> {client} {what}: {}", result_line(&reply)));
    }

    /// Completes the disk work handed over so far; whether there was any.
    fn disk(&mut self, id: NodeId) -> bool {
        let now = self.now;
        let node = self.nodes.get_mut(&id).expect("a node");
        let done = node.disk.poll(now, 0).expect("the simulated disk does not fail");
        if done.is_empty() || node.replica.is_none() {
            return false;
        }
        self.drive_once(id, |replica, now, io| replica.complete(now, &done, io));
        true
    }

    fn deliver(&mut self, cmd: &Cmd) -> Result<(), String> {
        let only = match cmd.words.first().map(String::as_str) {
            None | Some("all") => None,
            Some(w) if w.contains("->") => Some(link(w)?),
            Some(w) => return Err(format!("deliver what? {w}")),
        };
        let (now, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.flight)
            .into_iter()
            .partition(|(f, t, _)| only.is_none_or(|l| l == (*f, *t)));
        self.flight = later;
        for (from, to, message) in now {
            self.arrive(from, to, message);
        }
        Ok(())
    }

    fn arrive(&mut self, from: NodeId, to: NodeId, message: E::Message) {
        if self.cut.contains(&(from, to)) {
            self.out.push(format!("lost {from} -> {to} {} (partitioned)", E::message(&message)));
        } else if self.nodes[&to].replica.is_none() {
            self.out.push(format!("lost {from} -> {to} {} ({to} down)", E::message(&message)));
        } else {
            self.step(to, Input::Message { from, message });
        }
    }

    /// Delivers and completes disk work until nothing is left in flight or on a disk.
    fn stabilize(&mut self) -> Result<(), String> {
        for _ in 0..200 {
            let flight = std::mem::take(&mut self.flight);
            let mut busy = !flight.is_empty();
            for (from, to, message) in flight {
                self.arrive(from, to, message);
            }
            let ids: Vec<NodeId> = self.nodes.keys().copied().collect();
            for id in ids {
                busy |= self.disk(id);
            }
            if !busy {
                return Ok(());
            }
        }
        Err("stabilize: still busy after 200 rounds".into())
    }

    /// `partition n1 | n2 n3`: every link between the groups is cut.
    fn partition(&mut self, cmd: &Cmd) -> Result<(), String> {
        let mut groups = vec![Vec::new()];
        for w in &cmd.words {
            if w == "|" {
                groups.push(Vec::new());
            } else {
                groups.last_mut().expect("one").push(node_id(w)?);
            }
        }
        for (i, a) in groups.iter().enumerate() {
            for b in groups.iter().skip(i + 1) {
                for x in a {
                    for y in b {
                        self.cut.insert((*x, *y));
                        self.cut.insert((*y, *x));
                    }
                }
            }
        }
        Ok(())
    }

    /// `client n2 SET k v [durability=..] [level=..] [c=name] [RELEASE|ACQUIRE|WEAK|STRONG]`.
    fn client(&mut self, cmd: &Cmd) -> Result<(), String> {
        let at = node_id(cmd.word(0)?)?;
        let verb = cmd.word(1)?.to_uppercase();
        let mut words: Vec<&str> = cmd.words[2..].iter().map(String::as_str).collect();
        let mut mode = OpMode::Plain;
        for (word, m) in [
            ("ACQUIRE", OpMode::Acquire),
            ("RELEASE", OpMode::Release),
            ("WEAK", OpMode::Weak),
            ("STRONG", OpMode::Strong),
        ] {
            if words.last() == Some(&word) {
                words.pop();
                mode = m;
            }
        }
        let key = |i: usize| -> Result<Key, String> {
            words.get(i).map(|w| Key::from(w.as_bytes().to_vec())).ok_or("too few words".into())
        };
        let value = |i: usize| -> Result<Value, String> { key(i) };
        let command = match verb.as_str() {
            "GET" => Command::Get { key: key(0)? },
            "SET" => Command::Put { key: key(0)?, value: value(1)? },
            "DEL" => Command::Delete { key: key(0)? },
            "INCRBY" => Command::Incr {
                key: key(0)?,
                delta: words.get(1).and_then(|d| d.parse().ok()).ok_or("INCRBY k delta")?,
            },
            "CAS" => Command::Cas {
                key: key(0)?,
                expected: Some(value(1)?).filter(|e| e.as_ref() != b"-"),
                new: value(2)?,
            },
            other => return Err(format!("unknown client command {other}")),
        };
        let durability = parsed::<Durability>(cmd, "durability")?;
        let level = parsed::<ReadLevel>(cmd, "level")?;
        let name = cmd.args.get("c").cloned().unwrap_or_else(|| "c1".into());
        let count = self.clients.len() as u64;
        let entry =
            self.clients.entry(name.clone()).or_insert((ClientId(count + 1), 0, LogIndex::ZERO));
        entry.1 += 1;
        let (client_id, request, floor) = (entry.0, RequestId(entry.1), entry.2);
        let after = if self.controls.on("floor-dropped") { LogIndex::ZERO } else { floor };
        let tag = RequestTag(self.next_tag);
        self.next_tag += 1;
        let what = command_line(&command);
        let request = ClientRequest {
            tag,
            client: client_id,
            request,
            command,
            durability,
            level,
            after,
            mode,
            named: false,
        };
        let request = match E::Request::from_client(request) {
            Ok(request) => request,
            Err(error) => {
                self.out.push(format!("{at} refuses {what}: {error}"));
                return Ok(());
            }
        };
        self.asked.insert(tag, Asked { client: name, what });
        let replica = self.nodes[&at].replica.as_ref().ok_or_else(|| format!("{at} is down"))?;
        let now = Time(self.now);
        if let Some((reply, _)) = replica.cell().read_now(&request, || now) {
            self.out.push(format!("{at} answers off the loop"));
            self.reply(at, reply.into());
            return Ok(());
        }
        self.drive(at, |replica, now, io| replica.clients(now, vec![request], io));
        Ok(())
    }
}
