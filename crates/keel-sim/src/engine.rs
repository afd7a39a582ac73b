//! What the simulator needs from an engine beyond the engine interface
//! (`keel_core::engine::Engine`): a configuration per node from a template, the facts its
//! contract checks read off a message, and optionally a digest of the applied state.
//!
//! The simulator drives any engine whose clients speak the front door's requests and
//! replies, whose status is the leader engine's and whose log holds the leader engine's
//! entries (its invariant checks read roles, epochs, indexes and entries); Kite's world
//! (`crate::kite`) brings checks of its own.

use keel_core::engine::{ClientReply, ClientRequest, Engine};
use keel_core::leader::{Config, Message, Status};
use keel_types::{Entry, Epoch, LogIndex, NodeId};

/// What the contract checks read off a message before it is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MessageFacts<'a> {
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
    /// Log entries carried (each must be in the sender's log).
    pub entries: &'a [Entry],
}

/// An engine the simulator can drive.
pub trait SimEngine:
    Engine<
    Request = ClientRequest,
    Reply = ClientReply,
    Status = Status,
    Record = Entry,
    Message: keel_wire::peer::PeerMessage,
>
{
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

    /// The facts the contract checks need.
    fn facts(message: &Self::Message) -> MessageFacts<'_>;

    /// The message as the receiver gets it, through the engine's peer codec and the
    /// stateless half of its gate ([`crate::codec::across`]), with its encoded length.
    fn across(message: &Self::Message) -> Result<(Self::Message, usize), String>;

    /// The clock drift between two nodes, in parts per million, the engine tolerates
    /// (the world keeps its clocks within it).
    fn drift_bound_ppm(config: &Self::Config) -> u32;

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
        | Message::ForwardReply { epoch, .. } => *epoch,
    }
}

impl SimEngine for keel_core::leader::LeaderEngine {
    fn configure(
        template: &Config,
        node: NodeId,
        members: Vec<NodeId>,
        keyspace: u32,
        spread_leaders: bool,
    ) -> Config {
        configure_leader(template, node, members, keyspace, spread_leaders)
    }

    fn across(message: &Message) -> Result<(Message, usize), String> {
        crate::codec::across::<Self>(message)
    }

    fn facts(message: &Message) -> MessageFacts<'_> {
        leader_facts(message)
    }

    fn drift_bound_ppm(config: &Config) -> u32 {
        config.clock_drift_ppm_max.min(100_000)
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
            ("lease-expired", c.leases_expired),
            ("campaign-withheld", c.campaigns_withheld),
            ("log-repaired", c.logs_repaired),
            ("epoch-raised-under-live-leader", c.epochs_raised_under_live_leader),
        ]
    }
}
