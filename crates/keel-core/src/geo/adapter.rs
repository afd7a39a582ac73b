//! The geo engine behind the platform's engine interface (`crate::engine::Engine`).
//!
//! A geo keyspace's clients speak transactions (`KEEL.TX.BEGIN`, reads and updates,
//! `KEEL.TX.COMMIT`, `KEEL.BARRIER`, `KEEL.ATTACH`): the front door's single-key commands
//! carry no session vector, so they are refused here, naming what to use.

use super::types::{Config, GeoReply, GeoRequest, Message, Object, Status};
use super::GeoEngine;
use crate::engine::{
    BootError, ClientReply, ClientRequest, Engine, FromClient, HeldValue, Input, Metric, Outputs,
    PersistedState, Report, RoleView,
};
use crate::time::Time;
use keel_types::{Command, CommandResult, KeelError, NoRecord, NodeId};

impl FromClient for GeoRequest {
    /// A geo operation ([`Command::Geo`]) of the connection's session (its client id);
    /// every other command is refused, naming what to use: the front door's single-key
    /// commands carry no session vector.
    fn from_client(request: ClientRequest) -> Result<GeoRequest, KeelError> {
        match request.command {
            Command::Geo(op) => {
                Ok(GeoRequest { tag: request.tag, session: request.client.0, op })
            }
            Command::Cluster(keel_types::ClusterOp::Remove(member)) => Ok(GeoRequest {
                tag: request.tag,
                session: request.client.0,
                op: keel_types::geo::GeoOp::RemoveDc { member },
            }),
            Command::Cluster(keel_types::ClusterOp::Return(member)) => Ok(GeoRequest {
                tag: request.tag,
                session: request.client.0,
                op: keel_types::geo::GeoOp::ReturnDc { member },
            }),
            Command::Cluster(op) => Err(KeelError::InvalidArgument(format!(
                "KEEL.NODE {} has no meaning in a geo keyspace: its data centers are fixed but for removing one (KEEL.NODE REMOVE id removes the data center of node id) and taking it back (KEEL.NODE RETURN id), and no node leads it",
                op.word()
            ))),
            other => Err(KeelError::InvalidArgument(format!(
                "{} has no meaning in a geo keyspace: use KEEL.TX.BEGIN, its operations and KEEL.TX.COMMIT",
                other.name().to_uppercase()
            ))),
        }
    }
}

impl From<GeoReply> for ClientReply {
    /// A geo reply as the front door's common reply.
    fn from(reply: GeoReply) -> ClientReply {
        let result = reply.result.map(CommandResult::Geo);
        ClientReply { tag: reply.tag, served_by: reply.served_by, result, durability_round: false }
    }
}

impl HeldValue for GeoReply {
    /// A coordinator answers its own clients: no reply holds another node's value.
    fn forwarded_value(&mut self, _node: NodeId) -> Option<&mut keel_types::Value> {
        None
    }

    fn refuse_busy(&mut self, why: &str) {
        self.result = Err(KeelError::Busy(why.into()));
    }
}

impl Engine for GeoEngine {
    type Config = Config;
    type Message = Message;
    type Request = GeoRequest;
    type Reply = GeoReply;
    type Status = Status;
    type Record = NoRecord;

    /// Boots with nothing stored: a geo replica keeps its data in memory, and a data
    /// directory holding a snapshot was not written by this engine kind. A replica whose
    /// hard state shows it ran before boots lost ([`GeoEngine::is_lost`]).
    fn boot(
        config: Config,
        persisted: PersistedState<NoRecord>,
        _seed: u64,
        now: Time,
    ) -> Result<Self, BootError> {
        if persisted.snapshot.is_some() {
            return Err(BootError::Persisted(
                "the data directory holds a snapshot: it belongs to another engine kind".into(),
            ));
        }
        let rejoin_empty = config.unsafe_rejoin_empty;
        let mut engine = GeoEngine::boot(config, now)?;
        // A replica keeps its partition in memory: one that ran before (its hard state
        // says so) lost what it stored, and stays failed; a fresh one marks that it ran
        // before its first message leaves.
        if persisted.hard_state.epoch.0 > 0 && !rejoin_empty {
            engine.mark_lost();
        } else {
            engine.persist_first(keel_types::HardState {
                epoch: keel_types::Epoch(1),
                voted_for: None,
                repair_floor: None,
                members_epoch: 0,
            });
        }
        Ok(engine)
    }

    fn step(
        &mut self,
        now: Time,
        input: Input<Message, GeoRequest>,
    ) -> Outputs<Message, GeoReply, NoRecord> {
        GeoEngine::step(self, now, input)
    }

    fn check_invariants(&self) {
        GeoEngine::check_invariants(self)
    }

    fn check_message(message: &Message) -> Result<(), &'static str> {
        GeoEngine::check_message(message)
    }

    fn node_id(&self) -> NodeId {
        self.me.node
    }

    fn status(&self) -> Status {
        GeoEngine::status(self)
    }

    fn role(&self) -> RoleView {
        let role = match (self.lost, self.is_removed(), self.joining.is_some()) {
            (true, _, _) => "lost",
            (false, true, _) => "removed",
            (false, false, true) => "joining",
            (false, false, false) => "replica",
        };
        RoleView { role, leader: None, epoch: 0 }
    }

    fn report(&self) -> Report {
        let status = GeoEngine::status(self);
        let mut doc = serde_json::to_value(&status).expect("status serializes");
        let object = doc.as_object_mut().expect("a struct serializes to an object");
        object.insert("role".into(), GeoEngine::role(self).role.into());
        object.insert("engine".into(), "geo".into());
        let c = &status.counters;
        let mut metrics = vec![
            Metric::counter("keel_geo_begun_total", "Transactions begun here.", c.begun),
            Metric::counter(
                "keel_geo_committed_total",
                "Update transactions committed here.",
                c.committed,
            ),
            Metric::counter(
                "keel_geo_committed_read_only_total",
                "Read-only transactions committed here.",
                c.committed_read_only,
            ),
            Metric::counter("keel_geo_dropped_total", "Transactions dropped.", c.dropped),
            Metric::counter(
                "keel_geo_reads_waited_total",
                "Reads that waited for the snapshot.",
                c.reads_waited,
            ),
            Metric::counter(
                "keel_geo_replicated_in_total",
                "Remote transactions applied.",
                c.replicated_in,
            ),
            Metric::counter(
                "keel_geo_forwarded_total",
                "Transactions forwarded for suspected data centers.",
                c.forwarded,
            ),
            Metric::counter(
                "keel_geo_retransmits_total",
                "Channel messages sent again.",
                c.retransmits,
            ),
            Metric::counter(
                "keel_geo_messages_rejected_total",
                "Peer messages dropped by the gate.",
                c.rejected,
            ),
            Metric::gauge(
                "keel_geo_log_entries",
                "Operation-log entries held.",
                status.entries as u64,
            ),
            Metric::gauge(
                "keel_geo_open_transactions",
                "Transactions open here.",
                status.open as u64,
            ),
            Metric::gauge(
                "keel_geo_lost",
                "1 when this replica restarted and stays failed (its partition lost here).",
                u64::from(status.lost),
            ),
            Metric::gauge(
                "keel_geo_forwardable",
                "Remote transactions held until every data center not removed stores them.",
                status.forwardable as u64,
            ),
            Metric::gauge(
                "keel_geo_unacknowledged",
                "Messages sent to peers and not yet acknowledged.",
                status.unacked as u64,
            ),
            Metric::counter(
                "keel_geo_strong_committed_total",
                "Strong transactions committed (as coordinator).",
                c.strong_committed,
            ),
            Metric::counter(
                "keel_geo_strong_aborted_total",
                "Strong transactions certification aborted (as coordinator).",
                c.strong_aborted,
            ),
        ];
        metrics.extend(removal_metrics(&status));
        metrics.extend(certification_metrics(&status));
        Report { status: doc, metrics }
    }
}

/// The metrics of data-center removal (`engine/remove.rs`, `engine/agree.rs`).
fn removal_metrics(status: &Status) -> Vec<Metric> {
    let c = &status.counters;
    vec![
        Metric::gauge(
            "keel_geo_removed_dcs",
            "Data centers removed from the keyspace, as this replica knows.",
            status.removed.len() as u64,
        ),
        Metric::counter(
            "keel_geo_removed_dropped_total",
            "Peer messages dropped because their sender's data center was removed.",
            c.dropped_removed,
        ),
        Metric::counter(
            "keel_geo_notices_rearmed_total",
            "Removal notices sent again: their removed member was heard after the notice's \
             sends were spent.",
            c.notices_rearmed,
        ),
        Metric::counter(
            "keel_geo_removals_told_total",
            "Removals this replica learned from the removed data center's own member, which \
             tells the survivors as it stops.",
            c.removals_told,
        ),
        Metric::counter(
            "keel_geo_joins_restarted_total",
            "Joins this new replica started over: the return it joined was abandoned, and it \
             waits, as a wiped machine, for the next.",
            c.joins_restarted,
        ),
        Metric::counter(
            "keel_geo_begins_held_total",
            "Transactions a new replica just back refused to begin while what they would see \
             was still below what survived.",
            c.begins_held,
        ),
        Metric::counter(
            "keel_geo_removal_asks_total",
            "Asks this acceptor sent every acceptor to abort a removal vote it held \
             undecided too long (its proposer failed before deciding, say).",
            c.removal_asks,
        ),
        Metric::counter(
            "keel_geo_removals_aborted_total",
            "Removal votes this acceptor released as aborted on an ask.",
            c.removals_aborted,
        ),
        Metric::counter(
            "keel_geo_removals_found_made_total",
            "Removals this acceptor learned were made from a majority's votes.",
            c.removals_found_made,
        ),
    ]
}

/// The metrics of a replica's part in its partition's certification.
fn certification_metrics(status: &Status) -> Vec<Metric> {
    let c = &status.counters;
    vec![
        Metric::counter(
            "keel_geo_certification_elections_total",
            "Elections this replica started for its partition's certification.",
            c.elections,
        ),
        Metric::counter(
            "keel_geo_certification_takeovers_total",
            "Elections this replica won.",
            c.takeovers,
        ),
        Metric::gauge(
            "keel_geo_certification_leader",
            "1 when this replica leads its partition's certification.",
            u64::from(status.certification.as_ref().is_some_and(|c| c.leads)),
        ),
        Metric::gauge(
            "keel_geo_certification_ballot",
            "The certification ballot this replica is in.",
            status.certification.as_ref().map_or(0, |c| c.ballot),
        ),
        Metric::gauge(
            "keel_geo_certification_outcomes",
            "Decided strong transactions this replica remembers (until settled).",
            status.certification.as_ref().map_or(0, |c| c.outcomes as u64),
        ),
        Metric::counter(
            "keel_geo_certification_outcomes_forgotten_total",
            "Decided strong transactions this replica forgot once settled.",
            c.outcomes_forgotten,
        ),
    ]
}

impl GeoEngine {
    /// The node's state.
    pub fn status(&self) -> Status {
        Status {
            node: self.me.node,
            dc: self.me.dc,
            partition: self.me.partition,
            known: self.partition.known.clone(),
            stable: self.uniformity.stable.clone(),
            uniform: self.uniformity.uniform.clone(),
            keys: self.partition.log.len(),
            entries: self.partition.entries,
            open: self.coordinator.txs.len(),
            prepared: self.partition.prepared.len(),
            suspected: self.suspected(),
            unacked: self.channels.values().map(|c| c.unacked()).sum(),
            forwardable: self.partition.remote_commits.iter().map(|c| c.len()).sum(),
            lost: self.lost,
            removed: self.removed_list(),
            removal_promised: self.agreement.promised().filter(|c| c.removes()).map(|c| c.dc),
            removal_committed: self.agreement.committed_dcs(),
            return_promised: self.agreement.promised().filter(|c| !c.removes()).map(|c| c.dc),
            returning: (0..self.dcs as u32).filter(|&d| self.returning[d as usize]).collect(),
            epochs: self.epochs.clone(),
            joining: self.joining.is_some(),
            join: self.joining.as_ref().map(|j| super::types::JoinStatus {
                epoch: j.epoch,
                answered: j.answers.keys().copied().collect(),
                cut: j.cut,
                settled: j.settled.iter().copied().collect(),
                source: j.source,
            }),
            cuts: self.cuts(),
            certification: self.config.strong.then(|| super::types::Certification {
                ballot: self.certifier.ballot,
                leader_dc: self.own_leader_dc(self.certifier.ballot),
                leads: self.leads(),
                log: self.certifier.log.len(),
                durable: self.certifier.durable,
                open_votes: self.certifier.open.len(),
                outcomes: self.certifier.outcomes.len(),
            }),
            counters: self.counters,
        }
    }

    /// The object of `key` of `kind` on snapshot `snap`, as this replica stores it (tests
    /// and the simulator's convergence check; `None`: the key is not this partition's).
    pub fn object_on(
        &self,
        key: &keel_types::Key,
        kind: super::types::Kind,
        snap: &super::types::Vector,
    ) -> Option<Object> {
        if self.partition_of(key) != self.me.partition {
            return None;
        }
        Some(self.object_at(key, kind, snap))
    }

    /// Every (key, kind) this replica's log holds.
    pub fn stored_keys(&self) -> Vec<(keel_types::Key, super::types::Kind)> {
        self.partition.log.keys().cloned().collect()
    }

    /// This replica's place.
    pub fn place(&self) -> super::types::Member {
        self.me
    }

    /// The local commits applied here but not yet sent on to the siblings, in timestamp
    /// order (the simulator records them when it fails the replica: reads in its data
    /// center may have seen them, though no other data center ever will).
    pub fn unpropagated(&self) -> impl Iterator<Item = &super::types::Replicated> {
        self.partition.local_commits.values()
    }
}
