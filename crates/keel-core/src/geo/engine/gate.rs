//! The validation gate: a message that breaks the protocol's rules is dropped with a
//! reason, never applied, never a panic. The stateless half (`check_message`: shapes and
//! sizes) runs on the server's peer task too; the stateful half (`check_peer`) checks the
//! sender's place in the topology against what the bodies claim.

use super::super::types::{Body, Message, Update, Vector, DCS_MAX};
use super::GeoEngine;
use keel_types::NodeId;

/// Most bodies in one message.
pub const BODIES_MAX: usize = 65_536;
/// Most updates one body carries.
pub const WRITES_MAX: usize = 1 << 20;

fn vector_ok(v: &Vector) -> bool {
    !v.dcs.is_empty() && v.dcs.len() <= DCS_MAX
}

fn body_ok(body: &Body) -> Result<(), &'static str> {
    let ok = match body {
        Body::GetVersion { snap, .. } | Body::Prepare { snap, .. } => vector_ok(snap),
        Body::Commit { commit, .. } => vector_ok(commit),
        Body::Replicate { txs, .. } => {
            txs.iter().all(|t| vector_ok(&t.commit) && t.writes.len() <= WRITES_MAX)
        }
        Body::KnownLocal { known } => vector_ok(known),
        Body::Vectors { stable, known } => vector_ok(stable) && vector_ok(known),
        Body::Version { .. } | Body::PrepareAck { .. } | Body::Heartbeat { .. } => true,
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
                Body::KnownLocal { known } => same_dc && shape(known),
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
                Body::Vectors { stable, known } => sibling && shape(stable) && shape(known),
            };
            if !ok {
                return Err("a body from the wrong replica or of the wrong shape");
            }
        }
        Ok(())
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
