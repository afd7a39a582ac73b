//! Leader notices (peer protocol 3): in a placed or sharded cluster, every node tells the
//! other members, twice a second, which keyspaces it leads and in which epoch, so that a
//! node that does not host a keyspace sends that keyspace's clients to its leader
//! (`MOVED`, `CLUSTER SLOTS`, a `SELECT` refusal) rather than to the member it would
//! prefer, which after a failover is a follower that forwards. A hint only: a keyspace
//! takes only keys of its slots whoever sends them (`placement::SlotGuard`), and a
//! follower forwards writes to its leader.

use crate::driver::Keyspaces;
use crate::peer::{Delivery, Inbox, PeerQueues};
use crate::placement::Placement;
use keel_types::{KeyspaceId, NodeId};
use keel_wire::peer::{LeaderNotice, Outgoing, LEADERS_KEYSPACE, LEADER_NOTICES_PROTOCOL};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

// A notice names every keyspace a node may host.
const _: () = assert!(crate::config::KEYSPACES_MAX <= keel_wire::peer::NOTICE_KEYSPACES_MAX);

/// How often a node tells the members which keyspaces it leads.
pub const NOTICE_PERIOD: Duration = Duration::from_millis(500);
/// How long a notice is believed without another (four periods).
pub const HEARD_FOR: Duration = Duration::from_millis(2_000);

/// The leaders this node heard of, by keyspace: the epoch, the leader, when; and the
/// members whose notices named another placement than this node's, with when.
#[derive(Debug, Default)]
pub struct HeardLeaders {
    by_keyspace: Mutex<BTreeMap<KeyspaceId, (u64, NodeId, Instant)>>,
    disagreeing: Mutex<BTreeMap<NodeId, Instant>>,
}

impl HeardLeaders {
    /// Records `from`'s notice, for the keyspaces `placement` names it a replica of: a
    /// keyspace's leader is replaced by one of a later epoch, or once it is stale. A
    /// notice of another placement is not believed: its sender is recorded as
    /// disagreeing, and logged when it starts to.
    pub fn heard(&self, from: NodeId, notice: &LeaderNotice, placement: &Placement, now: Instant) {
        if notice.placement != placement.digest() {
            let mut disagreeing = self.disagreeing.lock().unwrap_or_else(|e| e.into_inner());
            let before = disagreeing.insert(from, now);
            if before.is_none_or(|at| now.duration_since(at) > HEARD_FOR) {
                tracing::warn!(peer = %from, theirs = notice.placement, ours = placement.digest(),
                    "a member's configuration places keyspaces otherwise (replicas, slots or client addresses differ): its leader notices are ignored");
            }
            return;
        }
        let mut by_keyspace = self.by_keyspace.lock().unwrap_or_else(|e| e.into_inner());
        for &(keyspace, epoch) in &notice.led {
            let replica =
                placement.groups.get(&keyspace).is_some_and(|g| g.replicas.contains(&from));
            if !replica {
                continue;
            }
            let newer = by_keyspace.get(&keyspace).is_none_or(|(e, leader, at)| {
                epoch > *e
                    || (epoch == *e && *leader == from)
                    || now.duration_since(*at) > HEARD_FOR
            });
            if newer {
                by_keyspace.insert(keyspace, (epoch, from, now));
            }
        }
    }

    /// The members whose notices named another placement within [`HEARD_FOR`] of `now`.
    pub fn disagreeing(&self, now: Instant) -> Vec<NodeId> {
        let disagreeing = self.disagreeing.lock().unwrap_or_else(|e| e.into_inner());
        disagreeing
            .iter()
            .filter(|(_, at)| now.duration_since(**at) <= HEARD_FOR)
            .map(|(n, _)| *n)
            .collect()
    }

    /// The leader of `keyspace` heard of within [`HEARD_FOR`] of `now`.
    pub fn leader(&self, keyspace: KeyspaceId, now: Instant) -> Option<NodeId> {
        let by_keyspace = self.by_keyspace.lock().unwrap_or_else(|e| e.into_inner());
        let &(_, leader, at) = by_keyspace.get(&keyspace)?;
        (now.duration_since(at) <= HEARD_FOR).then_some(leader)
    }
}

/// The inbox of leader notices ([`LEADERS_KEYSPACE`]).
pub struct LeadersInbox {
    /// Where what is heard goes.
    pub heard: Arc<HeardLeaders>,
    /// Which members may lead which keyspace.
    pub placement: Arc<Placement>,
}

impl Inbox for LeadersInbox {
    fn deliver(&self, from: NodeId, bytes: &[u8]) -> Delivery {
        let Some(notice) = LeaderNotice::decode(bytes) else {
            return Delivery::Rejected("leader notice does not decode");
        };
        self.heard.heard(from, &notice, &self.placement, Instant::now());
        Delivery::Queued
    }
}

/// The notice of the keyspaces this node leads now (as each engine loop last reported).
fn notice(keyspaces: &Keyspaces, placement: u32) -> LeaderNotice {
    let me = keyspaces.node_id;
    let led = keyspaces
        .iter()
        .filter_map(|h| match h.metrics.known_role() {
            (Some(leader), epoch) if leader == me => Some((h.id, epoch)),
            _ => None,
        })
        .collect();
    LeaderNotice { placement, led }
}

/// Every [`NOTICE_PERIOD`], until the node stops (`keyspaces` dropped): the keyspaces
/// this node leads, to every member that speaks protocol 3 or later (an older one would
/// drop the envelope as a keyspace it does not host).
pub async fn announce(keyspaces: Weak<Keyspaces>, peers: Arc<PeerQueues>) {
    let mut tick = tokio::time::interval(NOTICE_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(keyspaces) = keyspaces.upgrade() else { return };
        let Some(placement) = keyspaces.placement() else { return };
        let notice = notice(&keyspaces, placement.digest());
        let protocols = keyspaces.node_metrics.peer_protocols();
        let speaks = |to: &NodeId| protocols.get(to).is_some_and(|p| *p >= LEADER_NOTICES_PROTOCOL);
        for to in peers.members().filter(speaks) {
            let outgoing =
                Outgoing { keyspace: LEADERS_KEYSPACE, message: Box::new(notice.clone()) };
            let _ = peers.send(to, outgoing); // a full queue drops it: the next one comes
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{KeyspaceSettings, ServerConfig};

    fn placement() -> Placement {
        let mut config = ServerConfig::local(6, 1, 7000, std::path::Path::new("/tmp/x"));
        config.keyspaces = crate::local::placed_keyspaces(6, 2, 3, true);
        let _ = KeyspaceSettings::orca(0);
        Placement::new(&config)
    }

    #[test]
    fn a_later_epoch_wins_and_a_stale_word_is_forgotten() {
        let (heard, placement, t0) = (HeardLeaders::default(), placement(), Instant::now());
        let ks1 = KeyspaceId(1);
        let digest = placement.digest();
        let notice = |epoch| LeaderNotice { placement: digest, led: vec![(ks1, epoch)] };
        heard.heard(NodeId(4), &notice(3), &placement, t0);
        assert_eq!(heard.leader(ks1, t0), Some(NodeId(4)));
        heard.heard(NodeId(5), &notice(2), &placement, t0);
        assert_eq!(heard.leader(ks1, t0), Some(NodeId(4)), "an earlier epoch does not replace");
        heard.heard(NodeId(5), &notice(4), &placement, t0);
        assert_eq!(heard.leader(ks1, t0), Some(NodeId(5)), "a later one does");
        heard.heard(NodeId(1), &notice(9), &placement, t0);
        assert_eq!(heard.leader(ks1, t0), Some(NodeId(5)), "node 1 is no replica of keyspace 1");
        let later = t0 + HEARD_FOR + Duration::from_millis(1);
        assert_eq!(heard.leader(ks1, later), None, "stale");
        heard.heard(NodeId(6), &notice(1), &placement, later);
        assert_eq!(heard.leader(ks1, later), Some(NodeId(6)), "a stale word gives way");
        let other = LeaderNotice { placement: digest ^ 1, led: vec![(ks1, 99)] };
        heard.heard(NodeId(5), &other, &placement, later);
        assert_eq!(heard.leader(ks1, later), Some(NodeId(6)), "another placement: not believed");
        assert_eq!(heard.disagreeing(later), vec![NodeId(5)]);
        assert_eq!(heard.disagreeing(later + HEARD_FOR * 2), Vec::<NodeId>::new());
    }
}
