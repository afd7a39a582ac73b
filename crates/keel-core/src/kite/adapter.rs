//! Kite behind the platform's engine interface: front-door requests to Kite operations,
//! Kite results to front-door replies, the incarnation kept on disk, the report.
//!
//! A front-door request maps by its command and [`OpMode`]:
//!
//! | command | mode | operation |
//! |---|---|---|
//! | `Get` | plain / acquire | relaxed read / acquire |
//! | `Put` | plain / release | relaxed write / release |
//! | `Incr` | plain | fetch-and-add (the reply is the value after it) |
//! | `Cas` | plain or strong / weak | strong / weak compare-and-swap |
//! | `Cluster` add or promote / remove | plain | a membership change's step towards the voters with / without the node |
//!
//! Anything else (deletes, scans, transactions, queues, a read level or durability) is
//! refused with a reply that names the engine; the server refuses them before they get
//! here, so this is the second line.

use super::engine::KiteEngine;
use super::types::{
    Config, KiteOp, KiteReply, KiteRequest, KiteResult, Membership, Message, ReplyForm, Status,
    VotersWanted,
};
use crate::engine::{
    BootError, ClientReply, ClientRequest, Engine, FromClient, Input, Metric, OpMode, Outputs,
    PersistedState, Report, RoleView,
};
use crate::time::Time;
use keel_types::rng::SplitMix64;
use keel_types::{
    ClusterOp, Command, CommandResult, Epoch, HardState, KeelError, NoRecord, NodeId, Version,
};

impl FromClient for KiteRequest {
    /// Kite's operations by command and synchronization; durability and read levels (the
    /// leader engine's options) and every other command are refused.
    fn from_client(request: ClientRequest) -> Result<KiteRequest, KeelError> {
        let ClientRequest { tag, client, request, command, durability, level, mode, named, .. } =
            request;
        let session = client.0;
        let named = named.then_some(request.0);
        let refused = |what: String| {
            Err(KeelError::InvalidArgument(format!("{what} has no meaning in a kite keyspace")))
        };
        if durability.is_some() {
            return refused("DURABILITY".into());
        }
        if level.is_some() {
            return refused("LEVEL".into());
        }
        let (op, form) = match (command, mode) {
            (Command::Get { key }, OpMode::Plain) => (KiteOp::Read { key }, ReplyForm::Value),
            (Command::Get { key }, OpMode::Acquire) => (KiteOp::Acquire { key }, ReplyForm::Value),
            (Command::Put { key, value }, OpMode::Plain) => {
                (KiteOp::Write { key, value }, ReplyForm::Written)
            }
            (Command::Put { key, value }, OpMode::Release) => {
                (KiteOp::Release { key, value }, ReplyForm::Written)
            }
            (Command::Incr { key, delta }, OpMode::Plain) => {
                (KiteOp::Faa { key, delta }, ReplyForm::Counter { delta })
            }
            (Command::Cas { key, expected, new }, OpMode::Plain | OpMode::Strong) => {
                (KiteOp::Cas { key, expected, new, strong: true }, ReplyForm::Cas)
            }
            (Command::Cas { key, expected, new }, OpMode::Weak) => {
                (KiteOp::Cas { key, expected, new, strong: false }, ReplyForm::Cas)
            }
            (Command::Cluster(change), OpMode::Plain) => {
                let wanted = match change {
                    ClusterOp::AddLearner(node) | ClusterOp::Promote(node) => {
                        VotersWanted::With(node)
                    }
                    ClusterOp::Remove(node) => VotersWanted::Without(node),
                    ClusterOp::TransferLeader(_) => {
                        return refused("KEEL.NODE TRANSFER-LEADER (no node leads)".into())
                    }
                    ClusterOp::Return(_) => {
                        return refused("KEEL.NODE RETURN (geo keyspaces only)".into())
                    }
                };
                (KiteOp::reconfigure_to(wanted.clone()), ReplyForm::Membership(wanted))
            }
            (command, OpMode::Plain) => return refused(command.name().to_uppercase()),
            (command, mode) => {
                return refused(format!("{} with {}", command.name().to_uppercase(), mode.word()))
            }
        };
        Ok(KiteRequest { tag, session, op, form, named })
    }
}

/// Kite's stamps are not log versions: replies carry none (`WITHVERSION` is refused in
/// Kite keyspaces), and writes report this one.
const NO_VERSION: Version = Version::new(0, 0);

impl From<KiteReply> for ClientReply {
    fn from(reply: KiteReply) -> ClientReply {
        let KiteReply { tag, served_by, form, result, .. } = reply;
        let result = result.and_then(|r| match (form, r) {
            (ReplyForm::Membership(wanted), r) => membership_step(&wanted, r),
            (_, KiteResult::Value { value, .. }) => {
                Ok(CommandResult::Value { value, version: None })
            }
            (_, KiteResult::Written { .. }) => Ok(CommandResult::Written { version: NO_VERSION }),
            (ReplyForm::Counter { delta }, KiteResult::Rmw { read, .. }) => {
                let before = match read {
                    None => 0,
                    Some(v) => std::str::from_utf8(&v)
                        .ok()
                        .and_then(|s| s.parse::<i64>().ok())
                        .ok_or(KeelError::NotAnInteger)?,
                };
                let value = before.checked_add(delta).ok_or(KeelError::NotAnInteger)?;
                Ok(CommandResult::Counter { value, version: NO_VERSION })
            }
            (_, KiteResult::Rmw { read, wrote, .. }) => {
                Ok(CommandResult::Cas { swapped: wrote.is_some(), current: read, version: None })
            }
        });
        ClientReply { tag, served_by, result, durability_round: false }
    }
}

/// A membership change's step as a reply: done once the membership it left is settled on
/// what is wanted, else `BUSY` naming where it stands (the caller asks again).
fn membership_step(wanted: &VotersWanted, result: KiteResult) -> Result<CommandResult, KeelError> {
    let (bytes, swapped) = match result {
        KiteResult::Value { value, .. } => (value, false),
        KiteResult::Rmw { read, wrote, .. } => (read, wrote.is_some()),
        KiteResult::Written { .. } => (None, false),
    };
    let read = bytes.as_deref().and_then(Membership::decode);
    // A swap moved the membership read (absent: epoch 0, settled) one step on: from a
    // joint one to its new voters, from a settled one to a joint one.
    let m = match (read, swapped) {
        (Some(Membership { epoch, next: Some(next), .. }), true) => {
            Membership { epoch: epoch + 1, voters: next, next: None }
        }
        (_, true) => {
            return Err(KeelError::Busy("a change begun (joint voters): ask again".into()))
        }
        (Some(m), false) => m,
        (None, false) => {
            return Err(KeelError::Busy("the membership was not read: ask again".into()))
        }
    };
    if wanted.met_by(&m) {
        return Ok(CommandResult::Written { version: NO_VERSION });
    }
    let ids = |v: &[NodeId]| v.iter().map(|n| n.0.to_string()).collect::<Vec<_>>().join(",");
    let now = match &m.next {
        Some(next) => format!("voters {} moving to {}", ids(&m.voters), ids(next)),
        None => format!("voters {}", ids(&m.voters)),
    };
    Err(KeelError::Busy(format!("membership epoch {}: {now}; ask again", m.epoch)))
}

/// The incarnation a node boots as: one past the last one its disk recorded, or, on a
/// disk that recorded none, a random one (so that a node whose disk was replaced does not
/// reuse its earlier life's stamps, ballots and request ids by chance).
fn incarnation(persisted: &HardState, seed: u64) -> Result<u32, BootError> {
    match persisted.epoch.0 {
        0 => {
            let draw = SplitMix64::new(seed ^ 0x6b69_7465_696e_6361).below(1 << 31);
            Ok(u32::try_from(draw + 1).expect("below 2^31 + 1"))
        }
        last => last
            .checked_add(1)
            .and_then(|next| u32::try_from(next).ok())
            .ok_or_else(|| BootError::Persisted(format!("incarnation {last} is the last one"))),
    }
}

impl Engine for KiteEngine {
    type Config = Config;
    type Message = Message;
    type Request = KiteRequest;
    type Reply = KiteReply;
    type Status = Status;
    type Record = NoRecord;

    /// Boots a new incarnation that rejoins (`docs/kite.md`, Restarts) and asks for the
    /// incarnation to be made durable before its first message. A Kite keyspace keeps no
    /// log (its record is `NoRecord`: storage refuses a directory holding log segments)
    /// and takes no snapshot: a data directory holding one was not written by Kite.
    fn boot(
        mut config: Config,
        persisted: PersistedState<NoRecord>,
        seed: u64,
        now: Time,
    ) -> Result<Self, BootError> {
        if persisted.snapshot.is_some() {
            return Err(BootError::Persisted(
                "the data directory holds a snapshot: it belongs to another engine kind".into(),
            ));
        }
        config.incarnation = incarnation(&persisted.hard_state, seed)?;
        config.members_epoch = persisted.hard_state.members_epoch;
        config.rejoin = true;
        let incarnation = u64::from(config.incarnation);
        let members_epoch = config.members_epoch;
        let mut engine = KiteEngine::boot(config, seed, now)?;
        engine.persist_first(HardState {
            epoch: Epoch(incarnation),
            voted_for: None,
            repair_floor: None,
            members_epoch,
        });
        Ok(engine)
    }

    fn step(
        &mut self,
        now: Time,
        input: Input<Message, KiteRequest>,
    ) -> Outputs<Message, KiteReply, NoRecord> {
        KiteEngine::step(self, now, input)
    }

    fn check_message(message: &Message) -> Result<(), &'static str> {
        KiteEngine::check_message(message)
    }

    fn check_invariants(&self) {
        KiteEngine::check_invariants(self)
    }

    fn node_id(&self) -> NodeId {
        KiteEngine::node_id(self)
    }

    fn status(&self) -> Status {
        KiteEngine::status(self)
    }

    fn role(&self) -> RoleView {
        let (epoch, rejoining) = self.epoch_and_rejoining();
        let role = if rejoining { "rejoining" } else { "replica" };
        RoleView { role, leader: None, epoch }
    }

    fn report(&self) -> Report {
        report(&KiteEngine::status(self))
    }

    fn read_now(&self, request: &KiteRequest, _now: Time) -> Option<KiteReply> {
        KiteEngine::read_now(self, request)
    }
}

/// The status document and metrics of one Kite node.
fn report(status: &Status) -> Report {
    let mut doc = serde_json::to_value(status).expect("status serializes");
    let object = doc.as_object_mut().expect("a struct serializes to an object");
    let role = if status.rejoining { "rejoining" } else { "replica" };
    object.insert("role".into(), role.into());
    object.insert("engine".into(), "kite".into());
    let c = &status.counters;
    let delinquent = status.bits.iter().filter(|(_, b)| *b != super::Bit::Clear).count();
    let mut metrics = state_gauges(status, delinquent as u64);
    metrics.extend(path_counters(c));
    metrics.extend(table_metrics(status, c));
    Report { status: doc, metrics }
}

/// The node's state: its epoch, whether it rejoins, its membership, keys, sessions and
/// delinquents.
fn state_gauges(status: &Status, delinquent: u64) -> Vec<Metric> {
    let m = &status.membership;
    vec![
        Metric::gauge(
            "keel_kite_membership_epoch",
            "The epoch of the newest membership the node knows (raised by each change's step).",
            m.epoch,
        ),
        Metric::gauge(
            "keel_kite_voter",
            "1 while the node votes (on either side of a change under way).",
            u64::from(m.contains(status.node)),
        ),
        Metric::gauge(
            "keel_kite_voters_disagree",
            "Members found configured with other voters while the membership was never \
             changed: while above 0, the node serves nothing.",
            status.voters_disagree.len() as u64,
        ),
        Metric::gauge(
            "keel_kite_membership_changing",
            "1 while a membership change is under way (quorums of the old and new voters).",
            u64::from(m.next.is_some()),
        ),
        Metric::gauge(
            "keel_kite_epoch",
            "The machine epoch (raised by each slow acquire).",
            status.epoch,
        ),
        Metric::gauge(
            "keel_kite_rejoining",
            "1 while the node reads its peers' state after a restart.",
            u64::from(status.rejoining),
        ),
        Metric::gauge("keel_kite_keys", "Keys held.", status.keys as u64),
        Metric::gauge(
            "keel_kite_keys_in_epoch",
            "Keys served on the fast path.",
            status.keys_in_epoch as u64,
        ),
        Metric::gauge("keel_kite_sessions", "Sessions open.", status.sessions as u64),
        Metric::gauge("keel_kite_delinquent_bits", "Nodes this node deems delinquent.", delinquent),
    ]
}

/// How often each path of the protocol was taken.
fn path_counters(c: &super::Counters) -> Vec<Metric> {
    vec![
        Metric::counter(
            "keel_kite_reads_fast_total",
            "Relaxed reads served locally.",
            c.reads_fast,
        ),
        Metric::counter(
            "keel_kite_reads_slow_total",
            "Relaxed reads that read a quorum.",
            c.reads_slow,
        ),
        Metric::counter(
            "keel_kite_writes_fast_total",
            "Relaxed writes on the fast path.",
            c.writes_fast,
        ),
        Metric::counter(
            "keel_kite_writes_slow_total",
            "Relaxed writes that read stamps from a quorum.",
            c.writes_slow,
        ),
        Metric::counter(
            "keel_kite_releases_fast_total",
            "Releases whose earlier writes every node had.",
            c.releases_fast,
        ),
        Metric::counter(
            "keel_kite_releases_slow_total",
            "Releases that timed out and sent a delinquent set.",
            c.releases_slow,
        ),
        Metric::counter(
            "keel_kite_acquires_fast_total",
            "Acquires no replica deemed delinquent.",
            c.acquires_fast,
        ),
        Metric::counter(
            "keel_kite_acquires_slow_total",
            "Acquires that raised the machine epoch.",
            c.acquires_slow,
        ),
        Metric::counter("keel_kite_rmws_total", "Read-modify-writes completed.", c.rmws),
        Metric::counter(
            "keel_kite_rmw_retries_total",
            "Paxos rounds started again.",
            c.rmw_retries,
        ),
        Metric::counter(
            "keel_kite_rmws_finished_covered_total",
            "Covered records that carried too much, set out to be finished, not carried.",
            c.rmws_finished_covered,
        ),
        Metric::counter(
            "keel_kite_rmws_found_done_total",
            "Read-modify-writes a quorum showed done already (helped, or a retry).",
            c.rmws_found_done,
        ),
        Metric::counter(
            "keel_kite_failures_committed_total",
            "Failed read-modify-writes of named requests committed, keeping the value.",
            c.failures_committed,
        ),
        Metric::counter(
            "keel_kite_rmws_reused_total",
            "Requests refused: their client had used their number for another command.",
            c.rmws_reused,
        ),
        Metric::counter(
            "keel_kite_rmws_superseded_total",
            "Late retries refused: a later request of their client was done.",
            c.rmws_superseded,
        ),
    ]
}

/// The outcomes table, retransmissions, rejections and rejoins.
fn table_metrics(status: &Status, c: &super::Counters) -> Vec<Metric> {
    vec![
        Metric::gauge(
            "keel_kite_outcomes",
            "Committed read-modify-write outcomes kept.",
            status.outcomes as u64,
        ),
        Metric::counter(
            "keel_kite_outcomes_dropped_total",
            "Outcomes dropped to stay within the bounds.",
            c.outcomes_dropped,
        ),
        Metric::counter(
            "keel_kite_retransmits_total",
            "Requests sent again after the timer.",
            c.retransmits,
        ),
        Metric::counter(
            "keel_kite_writes_hurried_total",
            "Backed-off writes sent at once when their node answered again.",
            c.writes_hurried,
        ),
        Metric::counter(
            "keel_kite_messages_rejected_total",
            "Peer messages dropped by the gate.",
            c.rejected,
        ),
        Metric::counter("keel_kite_rejoins_total", "Rejoins completed.", c.rejoins),
        Metric::counter(
            "keel_kite_memberships_total",
            "Newer memberships taken (by a commit, a view, a page or news).",
            c.memberships,
        ),
        Metric::counter(
            "keel_kite_syncs_total",
            "Reads of the old voters' state finished as a new voter of a change.",
            c.syncs,
        ),
        Metric::counter(
            "keel_kite_replies_other_voters_total",
            "Replies not counted: a member was found configured with other voters.",
            c.replies_other_voters,
        ),
        Metric::counter(
            "keel_kite_replies_other_epoch_total",
            "Replies not counted: their sender knew a membership of another epoch.",
            c.replies_other_epoch,
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(epoch: u64, voters: &[u32], next: Option<&[u32]>) -> Membership {
        let ids = |v: &[u32]| v.iter().copied().map(NodeId).collect::<Vec<_>>();
        Membership { epoch, voters: ids(voters), next: next.map(ids) }
    }

    fn value(m: &Membership) -> KiteResult {
        KiteResult::Value { value: Some(m.encode()), stamp: super::super::Stamp::ZERO }
    }

    fn swap(read: Option<&Membership>, swapped: bool) -> KiteResult {
        let stamp = super::super::Stamp::ZERO;
        KiteResult::Rmw {
            read: read.map(Membership::encode),
            read_stamp: stamp,
            wrote: swapped.then_some(stamp),
            local: false,
        }
    }

    #[test]
    fn node_changes_map_to_a_step_towards_the_voters_with_or_without_the_node() {
        let ask = |op| ClientRequest {
            tag: crate::engine::RequestTag(1),
            client: keel_types::ClientId(7),
            request: keel_types::RequestId(1),
            command: Command::Cluster(op),
            durability: None,
            level: None,
            after: keel_types::LogIndex::ZERO,
            mode: OpMode::Plain,
            named: false,
        };
        let add = KiteRequest::from_client(ask(ClusterOp::AddLearner(NodeId(4)))).unwrap();
        assert_eq!(add.op, KiteOp::reconfigure_to(VotersWanted::With(NodeId(4))));
        assert_eq!(add.form, ReplyForm::Membership(VotersWanted::With(NodeId(4))));
        let promote = KiteRequest::from_client(ask(ClusterOp::Promote(NodeId(4)))).unwrap();
        assert_eq!(promote.op, add.op, "no learners: promoting is adding");
        let remove = KiteRequest::from_client(ask(ClusterOp::Remove(NodeId(1)))).unwrap();
        assert_eq!(remove.op, KiteOp::reconfigure_to(VotersWanted::Without(NodeId(1))));
        let transfer = KiteRequest::from_client(ask(ClusterOp::TransferLeader(NodeId(1))));
        assert!(matches!(transfer, Err(KeelError::InvalidArgument(_))), "{transfer:?}");
    }

    #[test]
    fn a_step_is_done_only_once_the_membership_it_left_is_settled_on_what_was_wanted() {
        let with4 = VotersWanted::With(NodeId(4));
        let busy = |r: Result<CommandResult, KeelError>| matches!(r, Err(KeelError::Busy(_)));
        // Already settled on it (a step asked again).
        assert!(membership_step(&with4, value(&m(2, &[1, 2, 3, 4], None))).is_ok());
        // The first step: from epoch 0 (the key absent) or a settled one to a joint one.
        assert!(busy(membership_step(&with4, swap(None, true))));
        assert!(busy(membership_step(&with4, swap(Some(&m(2, &[1, 2, 3], None)), true))));
        // The second: from the joint one to the new voters alone.
        let joint = m(3, &[1, 2, 3], Some(&[1, 2, 3, 4]));
        assert!(membership_step(&with4, swap(Some(&joint), true)).is_ok());
        // A compare that failed shows the membership found: another change's, or this one's.
        assert!(busy(membership_step(&with4, swap(Some(&joint), false))));
        assert!(membership_step(&with4, swap(Some(&m(4, &[1, 2, 3, 4], None)), false)).is_ok());
        let other = m(4, &[1, 2, 3, 5], None);
        let shown = membership_step(&with4, swap(Some(&other), false));
        assert!(
            matches!(&shown, Err(KeelError::Busy(why)) if why.contains("epoch 4: voters 1,2,3,5")),
            "{shown:?}"
        );
        // Removing: done once the node is out.
        let without1 = VotersWanted::Without(NodeId(1));
        assert!(membership_step(&without1, value(&m(6, &[2, 3, 4], None))).is_ok());
        assert!(busy(membership_step(&without1, value(&m(5, &[1, 2, 3, 4], Some(&[2, 3, 4]))))));
    }
}
