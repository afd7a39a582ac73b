//! What the simulator needs from an engine beyond the engine interface
//! (`keel_core::engine::Engine`): a configuration per node from a template, the facts its
//! contract checks read off a message, how its requests and replies carry their tags, and
//! the watch that checks one keyspace's nodes as a run goes ([`Watch`]).
//!
//! The world (`crate::world::World`) names no engine kind's types: what it checks beyond
//! the output contract is the engine's [`SimEngine::Watch`]. The leader engines' watch is
//! the log [`Checker`] (one leader per epoch, log matching, the durable prefix, applied
//! agreement); their clients, nemeses and scenarios ask for [`LeaderSim`]. Kite's is
//! `crate::kite::sim::KiteWatch`.

use crate::invariants::{Checker, Violation};
use keel_core::engine::{ClientReply, ClientRequest, Engine, OutputsOf, RequestTag};
use keel_core::leader::{Config, Message, Status};
use keel_types::{Entry, Epoch, LogIndex, NodeId, SnapshotMeta};
use std::collections::BTreeMap;

/// What the contract checks read off a message before it is sent; `L` is the engine's log
/// record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MessageFacts<'a, L = Entry> {
    /// The sender's epoch, which must be durable before the message leaves.
    pub epoch: Epoch,
    /// A vote granted in `epoch` (the vote must be durable).
    pub grants_vote: bool,
    /// A vote request in `epoch` (the candidate's own vote must be durable).
    pub asks_vote: bool,
    /// A pre-vote probe (nothing durable; targeted nemeses tell it apart).
    pub asks_pre_vote: bool,
    /// An index the sender claims is on its disk.
    pub claims_persisted: Option<LogIndex>,
    /// Log records carried (each must be in the sender's log).
    pub entries: &'a [L],
}

impl<L> MessageFacts<'_, L> {
    /// The facts of a message that carries no epoch, vote or log (engines without them).
    pub fn none() -> Self {
        MessageFacts {
            epoch: Epoch(0),
            grants_vote: false,
            asks_vote: false,
            asks_pre_vote: false,
            claims_persisted: None,
            entries: &[],
        }
    }
}

/// What the world checks of one keyspace's nodes, beyond the output contract, as a run
/// goes: it sees every log write an engine asks for, what each engine shows after each
/// step, and what each node recovers at a restart. Violations are kept until the world
/// takes them.
pub trait Watch<E: SimEngine>: Sized + Send {
    /// What is read off an engine after a step, to check once its outputs are out.
    type Seen;

    /// A watch that has seen nothing.
    fn new() -> Self;
    /// What `engine` shows now.
    fn see(engine: &E) -> Self::Seen;
    /// The log writes of one step of `node`, as the engine wrote them.
    fn stepped(&mut self, node: NodeId, out: &OutputsOf<E>, at_ns: u64);
    /// What `node` showed after a step, with the index its disk has fsynced.
    fn observe(&mut self, node: NodeId, seen: &Self::Seen, synced: LogIndex, at_ns: u64);
    /// `node` restarted from `snapshot` and `entries` (a watch of a log keeps its model).
    fn recover(&mut self, node: NodeId, snapshot: Option<SnapshotMeta>, entries: &[E::Record]) {
        let _ = (node, snapshot, entries);
    }
    /// The epoch of `node`'s record at `index`, as far as the watch knows its log (`None`:
    /// it keeps no model of logs).
    fn epoch_at(&self, node: NodeId, index: LogIndex) -> Option<Epoch> {
        let _ = (node, index);
        None
    }
    /// The nodes whose last step showed them leading, with their epoch (none, for engines
    /// without leaders).
    fn leading(&self) -> &BTreeMap<NodeId, Epoch> {
        static NONE: BTreeMap<NodeId, Epoch> = BTreeMap::new();
        &NONE
    }
    /// How often each invariant's precondition held, by coverage name.
    fn preconditions(&self) -> &BTreeMap<&'static str, u64> {
        static NONE: BTreeMap<&'static str, u64> = BTreeMap::new();
        &NONE
    }
    /// Takes the violations found so far.
    fn take_violations(&mut self) -> Vec<Violation>;
}

/// An engine the simulator can drive.
pub trait SimEngine: Engine<Message: keel_wire::peer::PeerMessage> {
    /// What the world checks of one keyspace's nodes ([`Watch`]).
    type Watch: Watch<Self>;

    /// The configuration of `node` in a cluster of `members`, for keyspace `keyspace`,
    /// from a template. With `spread_leaders`, each keyspace prefers another leader (as
    /// a server spreads them).
    fn configure(
        template: &Self::Config,
        node: NodeId,
        members: Vec<NodeId>,
        keyspace: u32,
        spread_leaders: bool,
    ) -> Self::Config;

    /// Sets the unix time, in milliseconds, at which the node's local clock read 0 (its
    /// wall clock, for engines that read one); engines without one ignore it.
    fn set_wall_clock(config: &mut Self::Config, origin_ms: u64) {
        let _ = (config, origin_ms);
    }

    /// The facts the contract checks need.
    fn facts(message: &Self::Message) -> MessageFacts<'_, Self::Record>;

    /// The message as the receiver gets it, through the engine's peer codec and the
    /// stateless half of its gate ([`crate::codec::across`]), with its encoded length.
    fn across(message: &Self::Message) -> Result<(Self::Message, usize), String>;

    /// The clock drift between two nodes, in parts per million, the engine tolerates
    /// (the world keeps its clocks within it).
    fn drift_bound_ppm(config: &Self::Config) -> u32;

    /// Checks the keyspace events of one step against the engine after it: the last
    /// event of each key says whether it is live (`del`, `expired` and `rename_from`
    /// leave it absent; any other leaves it there). Engines that record none pass.
    fn check_events(engine: &Self, events: &[keel_core::engine::KeyEvent]) -> Result<(), String> {
        let _ = (engine, events);
        Ok(())
    }

    /// Whether `message` carries a client's session open to another node (a forward):
    /// the late-copy fault's target. Engines without sessions: never.
    fn opens_session(message: &Self::Message) -> bool {
        let _ = message;
        false
    }

    /// Gives `request` the tag its reply will carry.
    fn set_tag(request: &mut Self::Request, tag: RequestTag);

    /// The tag `request` carries.
    fn request_tag(request: &Self::Request) -> RequestTag;

    /// The tag of the request `reply` answers.
    fn reply_tag(reply: &Self::Reply) -> RequestTag;

    /// Whether `request` writes (a read may be answered off the loop).
    fn writes(request: &Self::Request) -> bool;

    /// The client connection (or session) `request` came on, when its requests are
    /// ordered by the engine rather than by the front door: a read is then answered off
    /// the loop only while no earlier request of it waits in the loop, as a server's
    /// connection does (`Conn::loop_idle`). `None`: each request stands alone.
    fn connection(request: &Self::Request) -> Option<u64> {
        let _ = request;
        None
    }

    /// Whether `message` answers a request of its receiver (an acknowledgement, a read's
    /// reply): one sent by an earlier incarnation of its sender and delivered after the
    /// sender restarted is counted as a late reply (`WorldStats::late_replies`).
    fn answers(message: &Self::Message) -> bool {
        let _ = message;
        false
    }

    /// A digest of the applied state at `status().applied_index`, when the engine
    /// offers one (used by the applied-agreement invariant).
    fn applied_digest(&self) -> Option<u64> {
        None
    }

    /// Whether the engine, stepped at local time `now`, would hold a valid leader lease
    /// (engines without leases: never). The world checks that at most one node of a
    /// keyspace does at any moment.
    fn leader_lease_valid_at(&self, _now: keel_core::time::Time) -> bool {
        false
    }

    /// How often this incarnation took each rare path the coverage report counts
    /// (`keel sim run --coverage`), by name.
    fn path_counts(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
}

/// The engines the leader scenarios drive: clients speaking the front door's requests and
/// replies, the leader engine's status, its log entries, watched by the log [`Checker`].
pub trait LeaderSim:
    SimEngine<
    Request = ClientRequest,
    Reply = ClientReply,
    Status = Status,
    Record = Entry,
    Watch = Checker,
>
{
}

impl<E> LeaderSim for E where
    E: SimEngine<
        Request = ClientRequest,
        Reply = ClientReply,
        Status = Status,
        Record = Entry,
        Watch = Checker,
    >
{
}

impl<E: SimEngine<Status = Status, Record = Entry>> Watch<E> for Checker {
    type Seen = (Box<Status>, Option<u64>);

    fn new() -> Checker {
        Checker::default()
    }

    fn see(engine: &E) -> Self::Seen {
        (Box::new(engine.status()), engine.applied_digest())
    }

    fn stepped(&mut self, node: NodeId, out: &OutputsOf<E>, at_ns: u64) {
        if let Some(index) = out.truncate_after {
            self.truncate(node, index);
        }
        for entry in &out.append {
            self.append(node, entry, at_ns);
        }
        if let (Some((meta, _)), true) = (&out.snapshot, out.snapshot_installed) {
            self.reset_to_snapshot(node, *meta);
        }
    }

    fn observe(&mut self, node: NodeId, seen: &Self::Seen, synced: LogIndex, at_ns: u64) {
        let (status, digest) = seen;
        assert_eq!(status.node_id, node, "engine reports another node's id");
        if status.persisted_index > synced {
            let detail =
                format!("{node} reports persisted {} > fsynced {synced}", status.persisted_index);
            self.violate("contract-persisted", at_ns, detail);
        }
        Checker::observe(self, status, *digest, at_ns);
    }

    fn recover(&mut self, node: NodeId, snapshot: Option<SnapshotMeta>, entries: &[Entry]) {
        Checker::recover(self, node, snapshot, entries);
    }

    fn epoch_at(&self, node: NodeId, index: LogIndex) -> Option<Epoch> {
        self.log(node).epoch_at(index)
    }

    fn leading(&self) -> &BTreeMap<NodeId, Epoch> {
        Checker::leading(self)
    }

    fn preconditions(&self) -> &BTreeMap<&'static str, u64> {
        Checker::preconditions(self)
    }

    fn take_violations(&mut self) -> Vec<Violation> {
        Checker::take_violations(self)
    }
}

/// [`SimEngine::check_events`] for the leader engine, over `live` (whether a key is live
/// after the step).
pub fn check_leader_events(
    events: &[keel_core::engine::KeyEvent],
    live: impl Fn(&[u8]) -> bool,
) -> Result<(), String> {
    let mut last: BTreeMap<&[u8], &'static str> = BTreeMap::new();
    for event in events {
        last.insert(&event.key, event.event);
    }
    for (key, event) in last {
        let gone = matches!(event, "del" | "expired" | "rename_from");
        if gone == live(key) {
            let state = if gone { "is live" } else { "is absent" };
            return Err(format!(
                "the last event of {:?} is {event}, but the key {state}",
                String::from_utf8_lossy(key)
            ));
        }
    }
    Ok(())
}

/// The configuration of `node` among `members` for `keyspace`, from a leader-engine
/// template; with `spread_leaders`, keyspace `k` prefers member `k mod n` as a server's
/// keyspaces do.
pub fn configure_leader(
    template: &Config,
    node: NodeId,
    members: Vec<NodeId>,
    keyspace: u32,
    spread_leaders: bool,
) -> Config {
    let mut config = template.clone();
    config.node_id = node;
    if spread_leaders {
        config.preferred_leader = Some(members[keyspace as usize % members.len()]);
    }
    config.joining = !members.contains(&node);
    config.members = members;
    config
}

/// The facts of a leader-engine message.
pub fn leader_facts(message: &Message) -> MessageFacts<'_> {
    let mut facts = MessageFacts {
        epoch: message_epoch(message),
        grants_vote: false,
        asks_vote: false,
        asks_pre_vote: false,
        claims_persisted: None,
        entries: &[],
    };
    match message {
        Message::Vote { granted, .. } => facts.grants_vote = *granted,
        Message::RequestVote { .. } => facts.asks_vote = true,
        Message::PreVote { .. } => facts.asks_pre_vote = true,
        Message::AppendReply { persisted_index, .. } => {
            facts.claims_persisted = Some(*persisted_index)
        }
        Message::Append { entries, .. } => facts.entries = entries,
        _ => {}
    }
    facts
}

/// The sender's epoch carried by every leader-engine message.
pub fn message_epoch(message: &Message) -> Epoch {
    match message {
        Message::RequestVote { epoch, .. }
        | Message::Vote { epoch, .. }
        | Message::PreVote { epoch, .. }
        | Message::PreVoteReply { epoch, .. }
        | Message::Append { epoch, .. }
        | Message::AppendReply { epoch, .. }
        | Message::InstallSnapshot { epoch, .. }
        | Message::InstallSnapshotReply { epoch, .. }
        | Message::Forward { epoch, .. }
        | Message::ForwardReply { epoch, .. }
        | Message::TimeoutNow { epoch, .. } => *epoch,
    }
}

impl SimEngine for keel_core::leader::LeaderEngine {
    type Watch = Checker;

    fn configure(
        template: &Config,
        node: NodeId,
        members: Vec<NodeId>,
        keyspace: u32,
        spread_leaders: bool,
    ) -> Config {
        configure_leader(template, node, members, keyspace, spread_leaders)
    }

    fn set_wall_clock(config: &mut Config, origin_ms: u64) {
        config.wall_clock_origin_ms = origin_ms;
    }

    fn across(message: &Message) -> Result<(Message, usize), String> {
        crate::codec::across::<Self>(message)
    }

    fn check_events(engine: &Self, events: &[keel_core::engine::KeyEvent]) -> Result<(), String> {
        check_leader_events(events, |key| engine.key_live(key))
    }

    fn opens_session(message: &Message) -> bool {
        matches!(message, Message::Forward { request, .. }
            if matches!(request.command, keel_types::Command::OpenSession { .. }))
    }

    fn facts(message: &Message) -> MessageFacts<'_> {
        leader_facts(message)
    }

    fn drift_bound_ppm(config: &Config) -> u32 {
        config.clock_drift_ppm_max.min(100_000)
    }

    fn set_tag(request: &mut ClientRequest, tag: RequestTag) {
        request.tag = tag;
    }

    fn request_tag(request: &ClientRequest) -> RequestTag {
        request.tag
    }

    fn reply_tag(reply: &ClientReply) -> RequestTag {
        reply.tag
    }

    fn writes(request: &ClientRequest) -> bool {
        request.command.is_write()
    }

    fn applied_digest(&self) -> Option<u64> {
        Some(keel_core::leader::LeaderEngine::applied_digest(self))
    }

    fn leader_lease_valid_at(&self, now: keel_core::time::Time) -> bool {
        keel_core::leader::LeaderEngine::leader_lease_valid_at(self, now)
    }

    fn path_counts(&self) -> Vec<(&'static str, u64)> {
        let c = self.counters();
        vec![
            ("election", c.elections),
            ("durability-round", c.durability_rounds),
            ("forwarded", c.forwarded),
            ("snapshot-taken", c.snapshots_taken),
            ("snapshot-installed", c.snapshots_installed),
            ("mark-out", c.forced_mark_outs),
            ("released", c.released_removals),
            ("removal", c.removals),
            ("rollback", c.rolled_back_entries),
            ("write-timeout", c.writes_timed_out),
            ("retry-deduplicated", c.retries_deduplicated),
            ("session-expired", c.sessions_expired),
            ("stale-open-refused", c.stale_opens_refused),
            ("lease-expired", c.leases_expired),
            ("campaign-withheld", c.campaigns_withheld),
            ("log-repaired", c.logs_repaired),
            ("epoch-raised-under-live-leader", c.epochs_raised_under_live_leader),
            ("transfer-handed-over", c.transfers_handed_over),
            ("transfer-vote", c.transfer_votes),
        ]
    }
}

#[cfg(test)]
mod event_tests {
    use super::check_leader_events;
    use keel_core::engine::{EventClass, KeyEvent};

    #[test]
    fn the_events_check_refuses_a_last_event_the_state_contradicts() {
        let event = |name, key: &str| KeyEvent {
            class: EventClass::Generic,
            event: name,
            key: key.as_bytes().to_vec().into(),
        };
        let events = [event("set", "a"), event("del", "a"), event("lpush", "b")];
        let live = |key: &[u8]| key == b"b";
        assert!(check_leader_events(&events, live).is_ok());
        assert!(check_leader_events(&events, |_| true).is_err(), "a said deleted, still live");
        assert!(check_leader_events(&events, |_| false).is_err(), "b said pushed, absent");
    }
}
