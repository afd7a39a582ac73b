//! The validation gate: a message that breaks the protocol's rules is dropped with a
//! reason, never applied, never a panic. The stateless half (`check_message`: shapes and
//! sizes) runs on the server's peer task too; the stateful half (`check_peer`) checks the
//! sender's place in the topology against what the bodies claim.

use super::super::types::{
    Back, Body, Candidate, Change, ChangeRefusal, Member, Message, Record, Update, Vector, DCS_MAX,
    LABEL_MAX, PARTITIONS_MAX,
};
use super::GeoEngine;
use keel_types::NodeId;

/// Most bodies in one message.
pub const BODIES_MAX: usize = 65_536;
/// Most updates one body carries.
pub const WRITES_MAX: usize = 1 << 20;

fn vector_ok(v: &Vector) -> bool {
    !v.dcs.is_empty() && v.dcs.len() <= DCS_MAX
}

/// A candidate's sizes: its vector, its lists, its label.
fn candidate_ok(c: &Candidate) -> bool {
    vector_ok(&c.snap)
        && c.writes.len() <= WRITES_MAX
        && c.keys.len() <= WRITES_MAX
        && c.participants.len() <= PARTITIONS_MAX as usize
        && c.label.as_ref().is_none_or(|l| !l.is_empty() && l.len() <= LABEL_MAX)
}

fn record_ok(r: &Record) -> bool {
    match r {
        // A commit's strong timestamp is above its snapshot's, so never 0.
        Record::Vote { candidate, ok, ts } => candidate_ok(candidate) && (!ok || *ts > 0),
        Record::Decide { commit, ts, .. } => !commit || *ts > 0,
        Record::Promise { .. } | Record::Forget { .. } => true,
    }
}

/// The largest certification ballot a message may carry: far beyond any run's elections,
/// and far enough below `u64::MAX` that ballot arithmetic never overflows.
pub const BALLOT_MAX: u64 = 1 << 48;

/// The certification ballots a body carries.
fn ballots(body: &Body) -> [u64; 2] {
    match body {
        Body::KnownLocal { ballot, .. }
        | Body::Vectors { ballot, .. }
        | Body::Vote { ballot, .. }
        | Body::Append { ballot, .. }
        | Body::Appended { ballot, .. }
        | Body::Elect { ballot, .. }
        | Body::Outvoted { ballot } => [*ballot, 0],
        Body::Elected { ballot, accepted, .. } => [*ballot, *accepted],
        _ => [0, 0],
    }
}

/// The largest epoch a data center reaches: its last removal after its last life.
const EPOCH_MAX: u32 = 2 * super::remove::LIVES_MAX + 1;

/// Earlier returns' cuts: each of an even epoch below the return's, at most one per life.
fn cuts_ok(cuts: &[(u64, u32)], epoch: u32) -> bool {
    cuts.len() <= super::remove::LIVES_MAX as usize
        && cuts.iter().all(|&(_, e)| e > 0 && e.is_multiple_of(2) && e < epoch)
}

/// A return's body names a return's epoch (even, within the lives), and the epochs an
/// answer lists are within bounds.
fn back_ok(back: &Back) -> bool {
    let epoch = back.epoch();
    let epoch_ok = epoch > 0 && epoch.is_multiple_of(2) && epoch < EPOCH_MAX;
    let epochs_ok = match back {
        Back::Answer { epochs, cuts, .. } => {
            epochs.len() <= DCS_MAX
                && epochs.iter().all(|&e| e <= EPOCH_MAX)
                && cuts_ok(cuts, epoch)
        }
        Back::Partial { cuts, .. } | Back::Cut { earlier: cuts, .. } => cuts_ok(cuts, epoch),
        Back::CopyAsk { need, .. } => need.len() <= DCS_MAX,
        Back::Chunk { txs, .. } => {
            txs.len() <= BODIES_MAX
                && txs.iter().all(|(_, t)| vector_ok(&t.commit) && t.writes.len() <= WRITES_MAX)
        }
        Back::Copied { known, kept, limits, .. } => {
            vector_ok(known)
                && kept.len() <= DCS_MAX
                && limits.len() <= DCS_MAX * super::remove::LIVES_MAX as usize
                && limits.iter().all(|&(_, _, e)| e > 0 && e.is_multiple_of(2) && e < EPOCH_MAX)
        }
        Back::Installed { known, .. } => vector_ok(known),
        _ => true,
    };
    epoch_ok && epochs_ok
}

fn body_ok(body: &Body) -> Result<(), &'static str> {
    if ballots(body).iter().any(|&b| b > BALLOT_MAX) {
        return Err("a certification ballot out of bounds");
    }
    if let Body::Vectors { leaders, .. } = body {
        if leaders.len() > PARTITIONS_MAX as usize || leaders.iter().any(|&b| b > BALLOT_MAX) {
            return Err("a certification ballot out of bounds");
        }
    }
    let ok = match body {
        Body::GetVersion { snap, .. } | Body::Prepare { snap, .. } => vector_ok(snap),
        Body::Commit { commit, .. } => vector_ok(commit),
        Body::Replicate { txs, .. } => {
            txs.iter().all(|t| vector_ok(&t.commit) && t.writes.len() <= WRITES_MAX)
        }
        Body::KnownLocal { known, suspected, .. } => vector_ok(known) && suspected.len() <= DCS_MAX,
        Body::Vectors { stable, known, .. } => vector_ok(stable) && vector_ok(known),
        Body::Certify(c) => candidate_ok(c),
        Body::Vote { participants, ok, ts, .. } => {
            participants.len() <= PARTITIONS_MAX as usize && (!ok || *ts > 0)
        }
        Body::Append { records, .. } | Body::Elected { records, .. } => {
            records.len() <= BODIES_MAX && records.iter().all(record_ok)
        }
        Body::Settle { txs } => txs.len() <= super::settle::SETTLE_MAX,
        Body::Settled { txs } => txs.len() <= super::settle::SETTLE_MAX,
        Body::ChangePromised { removed, failed, .. } => {
            removed.len() <= DCS_MAX && failed.len() <= DCS_MAX
        }
        Body::ChangeRefused { why: ChangeRefusal::BeyondF { gone }, .. } => gone.len() <= DCS_MAX,
        Body::Back(back) => back_ok(back),
        Body::ChangeRefused {
            why:
                ChangeRefusal::Pending { .. }
                | ChangeRefusal::Aborted
                | ChangeRefusal::Epoch { .. }
                | ChangeRefusal::Returning { .. },
            ..
        }
        | Body::ChangePropose { .. }
        | Body::ChangeWithdrawn { .. }
        | Body::ChangeCommit { .. }
        | Body::ChangeAbort { .. }
        | Body::ChangeVote { .. }
        | Body::Version { .. }
        | Body::Forgotten { .. }
        | Body::PrepareAck { .. }
        | Body::Heartbeat { .. }
        | Body::Appended { .. }
        | Body::Elect { .. }
        | Body::Outvoted { .. }
        | Body::Changed { .. } => true,
    };
    if ok {
        Ok(())
    } else {
        Err("a vector or write list out of bounds")
    }
}

impl GeoEngine {
    /// The stateless half of the gate.
    pub fn check_message(message: &Message) -> Result<(), &'static str> {
        if message.bodies.len() > BODIES_MAX {
            return Err("too many bodies");
        }
        if message.first.checked_add(message.bodies.len() as u64).is_none() {
            return Err("body numbers overflow");
        }
        message.bodies.iter().try_for_each(body_ok)
    }

    /// The stateful half: the sender is a member, every vector has this keyspace's
    /// shape, and each body comes from the kind of replica that sends it (a replicated
    /// or forwarded transaction from a sibling and of another origin, a prepare from this
    /// data center).
    pub(crate) fn check_peer(&self, from: NodeId, message: &Message) -> Result<(), &'static str> {
        Self::check_message(message)?;
        let peer = self.member(from).ok_or("the sender is not a member")?;
        let same_dc = peer.dc == self.me.dc;
        let sibling = peer.partition == self.me.partition && !same_dc;
        for body in &message.bodies {
            let shape = |v: &Vector| v.dcs.len() == self.dcs;
            let ok = match body {
                Body::GetVersion { snap, .. } => same_dc && shape(snap),
                Body::Prepare { snap, writes, .. } => same_dc && shape(snap) && self.owns(writes),
                Body::Commit { commit, .. } => same_dc && shape(commit),
                Body::Version { .. } | Body::PrepareAck { .. } => same_dc,
                Body::KnownLocal { known, suspected, .. } => {
                    same_dc
                        && shape(known)
                        && suspected.iter().all(|&j| (j as usize) < self.dcs && j != self.me.dc)
                }
                Body::Replicate { origin, txs } => {
                    sibling
                        && *origin != self.me.dc
                        && (*origin as usize) < self.dcs
                        && txs.iter().all(|t| shape(&t.commit) && self.owns(&t.writes))
                        && txs.windows(2).all(|w| {
                            w[0].commit.dcs[*origin as usize] < w[1].commit.dcs[*origin as usize]
                        })
                }
                Body::Heartbeat { origin, .. } => {
                    sibling && *origin != self.me.dc && (*origin as usize) < self.dcs
                }
                Body::Vectors { stable, known, leaders, .. } => {
                    sibling
                        && shape(stable)
                        && shape(known)
                        && leaders.len() == self.partitions as usize
                }
                Body::Certify(c) => {
                    self.config.strong
                        && c.tx.node == from.0
                        && c.origin == peer.dc
                        && self.candidate_fits(c)
                }
                Body::Vote { participants, .. } => {
                    self.config.strong
                        && self.participants_ok(participants)
                        && participants.contains(&peer.partition)
                }
                Body::Append { ballot, records, .. } => {
                    self.config.strong
                        && sibling
                        && self.own_leader_dc(*ballot) == peer.dc
                        && self.records_fit(records)
                }
                Body::Elect { ballot, .. } => {
                    self.config.strong && sibling && self.own_leader_dc(*ballot) == peer.dc
                }
                Body::Elected { ballot, records, .. } => {
                    self.config.strong
                        && sibling
                        && self.own_leader_dc(*ballot) == self.me.dc
                        && self.records_fit(records)
                }
                Body::Appended { .. } | Body::Outvoted { .. } => self.config.strong && sibling,
                Body::Settle { .. } | Body::Settled { .. } => {
                    self.config.strong && peer.partition != self.me.partition
                }
                Body::Forgotten { .. } => self.config.strong,
                Body::Back(back) => self.back_body_fits(peer, back),
                Body::Changed { .. }
                | Body::ChangePropose { .. }
                | Body::ChangeWithdrawn { .. }
                | Body::ChangeCommit { .. }
                | Body::ChangeAbort { .. }
                | Body::ChangeVote { .. }
                | Body::ChangePromised { .. }
                | Body::ChangeRefused { .. } => self.change_body_fits(peer, body),
            };
            if !ok {
                return Err("a body from the wrong replica or of the wrong shape");
            }
        }
        Ok(())
    }

    /// Whether a body of a return (`back.rs`, `copy.rs`) comes from the replica that
    /// sends it, with this keyspace's shape.
    fn back_body_fits(&self, peer: Member, back: &Back) -> bool {
        let same_dc = peer.dc == self.me.dc;
        let sibling = peer.partition == self.me.partition && !same_dc;
        let shape = |v: &Vector| v.dcs.len() == self.dcs;
        match back {
            Back::Join { .. } => true,
            Back::Answer { epochs, .. } => sibling && epochs.len() == self.dcs,
            Back::Partial { .. } => same_dc && self.me.partition == 0,
            Back::Cut { .. } => peer.partition == 0,
            Back::Settled { .. } | Back::CopyAsk { .. } => sibling && self.back_vector_fits(back),
            Back::Chunk { txs, .. } => {
                sibling
                    && txs.iter().all(|(origin, t)| {
                        (*origin as usize) < self.dcs && shape(&t.commit) && self.owns(&t.writes)
                    })
            }
            Back::Copied { known, .. } | Back::Installed { known, .. } => {
                sibling && shape(known) && self.back_vector_fits(back)
            }
        }
    }

    /// Whether a body of data-center removal (`remove.rs`, `agree.rs`) comes from the
    /// replica that sends it, with data centers of this keyspace.
    fn change_body_fits(&self, peer: Member, body: &Body) -> bool {
        match body {
            Body::Changed { change } => self.change_fits(*change),
            // Proposals go to acceptors (partition 0), answers come from them.
            Body::ChangePropose { change, .. }
            | Body::ChangeWithdrawn { change, .. }
            | Body::ChangeCommit { change, .. } => {
                self.me.partition == 0 && self.change_fits(*change)
            }
            // Asks go between acceptors; votes come from one, to a proposer or to
            // an acceptor that asked.
            Body::ChangeAbort { proposer, change, .. } => {
                self.me.partition == 0
                    && peer.partition == 0
                    && self.change_fits(*change)
                    && self.member(*proposer).is_some()
            }
            Body::ChangeVote { proposer, change, .. } => {
                peer.partition == 0 && self.change_fits(*change) && self.member(*proposer).is_some()
            }
            Body::ChangePromised { removed, failed, .. } => {
                peer.partition == 0
                    && removed.iter().chain(failed).all(|&j| (j as usize) < self.dcs)
            }
            Body::ChangeRefused { why, .. } => {
                peer.partition == 0
                    && match why {
                        ChangeRefusal::Pending { change } => self.change_fits(*change),
                        ChangeRefusal::BeyondF { gone } => {
                            gone.iter().all(|&j| (j as usize) < self.dcs)
                        }
                        ChangeRefusal::Returning { dc } => (*dc as usize) < self.dcs,
                        ChangeRefusal::Aborted | ChangeRefusal::Epoch { .. } => true,
                    }
            }
            // (Called for the change bodies only.)
            _ => false,
        }
    }

    /// Whether `change` names a data center of this keyspace and an epoch a change can
    /// make (at most a removal after the last life).
    fn change_fits(&self, change: Change) -> bool {
        (change.dc as usize) < self.dcs
            && (1..=2 * super::remove::LIVES_MAX + 1).contains(&change.epoch)
    }

    /// Whether every vote among `records` fits this partition.
    fn records_fit(&self, records: &[Record]) -> bool {
        records.iter().all(|r| match r {
            Record::Vote { candidate, .. } => self.candidate_fits(candidate),
            Record::Decide { .. } | Record::Promise { .. } | Record::Forget { .. } => true,
        })
    }

    /// Whether participants are partitions of this keyspace, sorted, without repeats.
    fn participants_ok(&self, participants: &[u32]) -> bool {
        participants.iter().all(|&p| p < self.partitions)
            && participants.windows(2).all(|w| w[0] < w[1])
    }

    /// Whether a candidate is this partition's part of a transaction of this keyspace:
    /// its snapshot's shape, its keys and updates here, every update's key among its keys
    /// (so that conflicts see it), and this partition among the participants.
    fn candidate_fits(&self, c: &Candidate) -> bool {
        let limits = &self.config.limits;
        c.snap.dcs.len() == self.dcs
            && (c.origin as usize) < self.dcs
            && self.owns(&c.writes)
            && c.keys.iter().all(|k| {
                // A central certifier (partition 0) certifies every partition's keys.
                let central = self.config.central_certifier && self.me.partition == 0;
                (central || self.partition_of(k) == self.me.partition)
                    && limits.check_key(k).is_ok()
            })
            && {
                let keys: std::collections::BTreeSet<&keel_types::Key> = c.keys.iter().collect();
                c.writes.iter().all(|(k, _)| keys.contains(k))
            }
            && self.participants_ok(&c.participants)
            && c.participants.contains(&self.me.partition)
    }

    /// Whether a return's per-data-center list has this keyspace's shape.
    fn back_vector_fits(&self, back: &Back) -> bool {
        match back {
            Back::CopyAsk { need: v, .. } => v.len() == self.dcs,
            Back::Copied { kept, limits, .. } => {
                kept.len() == self.dcs && limits.iter().all(|&(dc, _, _)| (dc as usize) < self.dcs)
            }
            _ => true,
        }
    }

    /// Whether every update's key belongs to this partition and its value to the limits.
    fn owns(&self, writes: &[(keel_types::Key, Update)]) -> bool {
        let limits = &self.config.limits;
        writes.iter().all(|(key, update)| {
            self.partition_of(key) == self.me.partition
                && limits.check_key(key).is_ok()
                && match update {
                    Update::Set(v) | Update::GAdd(v) | Update::SAdd(v) | Update::SRem(v, _) => {
                        limits.check_value(v).is_ok()
                    }
                    Update::Add(_) | Update::Max(_) => true,
                }
        })
    }
}
