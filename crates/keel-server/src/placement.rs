//! Where each keyspace of the cluster lives, as every node sees it from the
//! configuration: its replica group, the leader it prefers, and, in a sharded cluster,
//! the hash slots it serves. A node hosts only the keyspaces whose group names it; the
//! rest of the map is what it tells clients about the others (`MOVED`, `CLUSTER
//! SLOTS`, a `SELECT` of a keyspace served elsewhere).

use crate::config::{PeerAddr, ServerConfig};
use crate::metrics::{KeyspaceMetrics, SlotStates};
use keel_types::slots::SlotState;
use keel_types::{KeyspaceId, NodeId};
use keel_wire::slots::{SlotRanges, SLOTS};
use std::collections::BTreeMap;
use std::sync::Arc;

/// One keyspace's place in the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    /// Its name.
    pub name: String,
    /// The members that host it, in id order.
    pub replicas: Vec<NodeId>,
    /// The member it prefers as leader, if any.
    pub preferred_leader: Option<NodeId>,
    /// The slots it serves (a sharded cluster).
    pub slots: Option<SlotRanges>,
}

/// Every keyspace's place, and where each member's clients connect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// This node.
    pub me: NodeId,
    /// Every keyspace of the cluster, by id.
    pub groups: BTreeMap<KeyspaceId, Group>,
    /// Each member's client address, where the configuration gives it.
    pub client_addrs: BTreeMap<NodeId, PeerAddr>,
    /// The keyspace serving each slot (a sharded cluster; empty otherwise).
    owners: Vec<KeyspaceId>,
    /// The digest of what every member's configuration must say alike ([`Self::digest`]).
    digest: u32,
}

impl Placement {
    /// The placement `config` describes (validated).
    pub fn new(config: &ServerConfig) -> Placement {
        let leaders = config.preferred_leaders();
        let mut groups = BTreeMap::new();
        for ks in config.keyspace_settings() {
            let slots = ks.slots.as_deref().map(|s| SlotRanges::parse(s).expect("validated"));
            let group = Group {
                name: ks.name.clone(),
                replicas: config.replicas_of(&ks),
                preferred_leader: leaders.get(&ks.id).copied(),
                slots,
            };
            groups.insert(KeyspaceId(ks.id), group);
        }
        let mut client_addrs: BTreeMap<NodeId, PeerAddr> = config
            .members
            .iter()
            .filter_map(|m| Some((NodeId(m.id), m.client_addr.clone()?)))
            .collect();
        client_addrs.entry(NodeId(config.node_id)).or_insert(PeerAddr::Ip(config.client_addr));
        let mut owners = Vec::new();
        if groups.values().any(|g| g.slots.is_some()) {
            owners = vec![KeyspaceId(u32::MAX); usize::from(SLOTS)];
            for (id, group) in &groups {
                for &(a, b) in group.slots.as_ref().expect("validated: every one").ranges() {
                    owners[usize::from(a)..=usize::from(b)].fill(*id);
                }
            }
            assert!(owners.iter().all(|o| o.0 != u32::MAX), "validated: every slot served");
        }
        let digest = configured_digest(config);
        Placement { me: NodeId(config.node_id), groups, client_addrs, owners, digest }
    }

    /// A digest of what every member's configuration must say alike (every keyspace's
    /// replicas, slots and configured preferred leader, every member's configured client
    /// address), which leader notices carry: two nodes configured alike have the same,
    /// whatever their own `voters` and `client_addr`.
    pub fn digest(&self) -> u32 {
        self.digest
    }

    /// Whether the cluster is sharded (speaks the Redis Cluster protocol).
    pub fn sharded(&self) -> bool {
        !self.owners.is_empty()
    }

    /// The keyspace serving `slot` (a sharded cluster).
    pub fn owner(&self, slot: u16) -> KeyspaceId {
        self.owners[usize::from(slot)]
    }

    /// Where a `MOVED` for keyspace `id` sends the client: the client address of
    /// [`Self::target`] (empty when none is configured).
    pub fn redirect(
        &self,
        id: KeyspaceId,
        known: Option<NodeId>,
        reachable: &dyn Fn(NodeId) -> bool,
    ) -> String {
        let target = self.target(id, known, reachable);
        target.and_then(|n| self.client_addr(n)).unwrap_or_default()
    }

    /// Whether this node hosts keyspace `id`.
    pub fn hosted_here(&self, id: KeyspaceId) -> bool {
        self.groups.get(&id).is_some_and(|g| g.replicas.contains(&self.me))
    }

    /// Where member `node`'s clients connect, as `host:port`.
    pub fn client_addr(&self, node: NodeId) -> Option<String> {
        self.client_addrs.get(&node).map(|a| a.to_string())
    }

    /// The replica of keyspace `id` a client should be sent to, as this node knows it:
    /// the leader its own replica believes in, or a leader notice named (`known`), else
    /// the preferred leader when `reachable` says a link to it is up, else the
    /// first replica `reachable` says is, else the preferred leader or first replica.
    pub fn target(
        &self,
        id: KeyspaceId,
        known: Option<NodeId>,
        reachable: &dyn Fn(NodeId) -> bool,
    ) -> Option<NodeId> {
        let group = self.groups.get(&id)?;
        if let Some(leader) = known.filter(|l| group.replicas.contains(l)) {
            return Some(leader);
        }
        let up = |n: &NodeId| *n == self.me || reachable(*n);
        let preferred = group.preferred_leader.filter(|p| group.replicas.contains(p));
        preferred
            .filter(up)
            .or_else(|| group.replicas.iter().copied().find(up))
            .or(preferred)
            .or_else(|| group.replicas.first().copied())
    }
}

/// The hash slot states the keyspaces this node hosts applied (`keel_types::slots`), at
/// one moment: where the node sends a slot's requests while slots move. A keyspace's
/// engine decides for itself on every request it applies; this view only routes.
#[derive(Clone, Debug, Default)]
pub struct SlotView(Vec<(KeyspaceId, Arc<SlotStates>)>);

impl SlotView {
    /// The view of `hosted` (each keyspace with its metrics, where its loop publishes).
    pub fn of<'a>(hosted: impl IntoIterator<Item = (KeyspaceId, &'a KeyspaceMetrics)>) -> SlotView {
        let states = hosted.into_iter().map(|(id, m)| (id, m.slot_states()));
        SlotView(states.filter(|(_, s)| !s.is_empty()).collect())
    }

    /// Whether no keyspace here has a slot state.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Keyspace `id`'s state of `slot`, if this node hosts it and its log set one.
    pub fn state(&self, id: KeyspaceId, slot: u16) -> Option<&SlotState> {
        self.0.iter().find(|(k, _)| *k == id)?.1.get(&slot)
    }

    /// The keyspace serving `slot`: one here that owns it by a move or is moving it
    /// away, else the one a keyspace here released it to, else the source of a move
    /// into one here, else the configured owner.
    pub fn serving(&self, placement: &Placement, slot: u16) -> KeyspaceId {
        let (mut released, mut importing) = (None, None);
        for (id, states) in &self.0 {
            match states.get(&slot) {
                Some(SlotState::Owned { .. } | SlotState::Migrating { .. }) => return *id,
                Some(SlotState::Released { to, .. }) => released = Some(*to),
                Some(SlotState::Importing { from, .. }) => importing = Some(*from),
                None => {}
            }
        }
        released.or(importing).unwrap_or_else(|| placement.owner(slot))
    }

    /// A keyspace here importing `slot`, if any, and the move's id: where a request sent
    /// on by `ASK` runs, and as what.
    pub fn importing(&self, slot: u16) -> Option<(KeyspaceId, u64)> {
        self.0.iter().find_map(|(ks, states)| match states.get(&slot) {
            Some(SlotState::Importing { id, .. }) => Some((*ks, *id)),
            _ => None,
        })
    }

    /// The keyspace serving each slot ([`Self::serving`]), slot by slot.
    pub fn owners(&self, placement: &Placement) -> Vec<KeyspaceId> {
        (0..SLOTS).map(|slot| self.serving(placement, slot)).collect()
    }
}

/// What one keyspace of a sharded cluster takes: commands whose every key's hash slot
/// it serves, or imports. Every request a node hands the keyspace passes it
/// (`KeyspaceHandle::send` and its reads off the loop), whatever door it came in by (a
/// command, a transaction, a script, `WATCH`, `RESTORE`), so no key is ever written to
/// or read from a keyspace that does not serve its slot. The keyspace's own engine
/// checks the slots its log moved, in log order (`keel_core::leader::kv_slots`); its
/// refusals come back here and are turned into `ASK` and `MOVED` with addresses.
#[derive(Debug)]
pub struct SlotGuard {
    keyspace: KeyspaceId,
    placement: Arc<Placement>,
    node_metrics: Arc<crate::metrics::Metrics>,
    heard: Arc<crate::leaders::HeardLeaders>,
    /// Every keyspace this node hosts, with its metrics (slot states, known leader).
    hosted: Vec<(KeyspaceId, Arc<KeyspaceMetrics>)>,
}

impl SlotGuard {
    /// The guard of keyspace `keyspace` in `placement`, which must be sharded.
    /// `heard`: the leaders other members' notices named, where redirects point;
    /// `hosted`: the keyspaces this node hosts.
    pub fn new(
        keyspace: KeyspaceId,
        placement: Arc<Placement>,
        node_metrics: Arc<crate::metrics::Metrics>,
        heard: Arc<crate::leaders::HeardLeaders>,
        hosted: Vec<(KeyspaceId, Arc<KeyspaceMetrics>)>,
    ) -> SlotGuard {
        assert!(placement.sharded(), "slot guards are for sharded clusters");
        SlotGuard { keyspace, placement, node_metrics, heard, hosted }
    }

    /// `Ok` when the keyspace serves (or imports) every key of `command`; else `MOVED`
    /// for the first key it does not, naming where that key's keyspace takes clients (a
    /// key of a database other than 0, which a sharded cluster does not have, is refused).
    pub fn check(&self, command: &keel_types::Command) -> Result<(), keel_types::KeelError> {
        let mut view = None;
        for key in command.keys() {
            if key.starts_with(keel_types::DB_KEY_PREFIX) {
                let why = "a sharded cluster has database 0 only".to_string();
                return Err(keel_types::KeelError::InvalidArgument(why));
            }
            let slot = keel_wire::slots::key_slot(key);
            if self.placement.owner(slot) == self.keyspace && self.unmoved() {
                continue; // the common case: no slot moved here
            }
            let view = view.get_or_insert_with(|| self.view());
            let owner = view.serving(&self.placement, slot);
            let importing =
                matches!(view.state(self.keyspace, slot), Some(SlotState::Importing { .. }));
            if owner != self.keyspace && !importing {
                return Err(keel_types::KeelError::Moved { slot, addr: self.addr(owner) });
            }
        }
        Ok(())
    }

    /// `error` as the client sees it: the engine's [`keel_types::KeelError::Redirect`]
    /// becomes `ASK` or `MOVED`, naming where that keyspace takes clients.
    pub fn translate(&self, error: keel_types::KeelError) -> keel_types::KeelError {
        match error {
            keel_types::KeelError::Redirect { slot, keyspace, ask } => {
                let addr = self.addr(keyspace);
                match ask {
                    Some(_) => keel_types::KeelError::Ask { slot, addr },
                    None => keel_types::KeelError::Moved { slot, addr },
                }
            }
            other => other,
        }
    }

    /// Whether no keyspace here has a slot state.
    fn unmoved(&self) -> bool {
        self.hosted.iter().all(|(_, m)| m.slot_states().is_empty())
    }

    fn view(&self) -> SlotView {
        SlotView::of(self.hosted.iter().map(|(id, m)| (*id, &**m)))
    }

    /// Where keyspace `id` takes clients, as far as this node knows.
    fn addr(&self, id: KeyspaceId) -> String {
        let reachable = |n: NodeId| reachable(&self.node_metrics, self.placement.me, n);
        let known = match self.hosted.iter().find(|(k, _)| *k == id) {
            Some((_, metrics)) => metrics.known_leader(),
            None => self.heard.leader(id, std::time::Instant::now()),
        };
        self.placement.redirect(id, known, &reachable)
    }
}

/// Whether `node`'s peer link to node `me` is up (it announced itself on a link that has
/// not closed since), or `node` is `me`.
pub fn reachable(node_metrics: &crate::metrics::Metrics, me: NodeId, node: NodeId) -> bool {
    node == me || node_metrics.peer_protocols().contains_key(&node)
}

/// [`Placement::digest`] of `config`: CRC-32C of the keyspaces' ids, replicas, slots and
/// configured preferred leaders, and the members' ids and configured client addresses.
fn configured_digest(config: &ServerConfig) -> u32 {
    let mut bytes = Vec::new();
    let mut put = |text: String| {
        bytes.extend_from_slice(&(text.len() as u32).to_le_bytes());
        bytes.extend_from_slice(text.as_bytes());
    };
    for ks in config.keyspace_settings() {
        put(ks.id.to_string());
        put(config.replicas_of(&ks).iter().map(|n| n.0.to_string()).collect::<Vec<_>>().join(","));
        put(ks
            .slots
            .as_deref()
            .map(|s| SlotRanges::parse(s).map(|r| r.to_string()))
            .map_or(String::new(), |r| r.unwrap_or_default()));
        put(ks.preferred_leader.map_or(String::new(), |p| p.to_string()));
    }
    let mut members: Vec<_> = config.members.iter().collect();
    members.sort_by_key(|m| m.id);
    for m in members {
        put(m.id.to_string());
        put(m.client_addr.as_ref().map_or(String::new(), |a| a.to_string()));
    }
    crc32c::crc32c(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::KeyspaceSettings;

    fn sharded(nodes: u32, groups: u32, node: u32) -> ServerConfig {
        let mut config = ServerConfig::local(nodes, node, 7000, std::path::Path::new("/tmp/x"));
        config.keyspaces = (0..groups)
            .map(|g| KeyspaceSettings {
                replicas: Some((0..3).map(|r| (g * 3 + r) % nodes + 1).collect()),
                slots: Some(SlotRanges::share(g, groups).to_string()),
                ..KeyspaceSettings::orca(g)
            })
            .collect();
        config
    }

    #[test]
    fn six_nodes_in_two_groups_split_the_slots_and_lead_apart() {
        let config = sharded(6, 2, 4);
        config.validate().unwrap();
        let specs = config.keyspace_specs().unwrap();
        assert_eq!(specs.len(), 1, "node 4 hosts one group");
        assert_eq!(specs[0].id, KeyspaceId(1));
        assert_eq!(specs[0].config.members, vec![NodeId(4), NodeId(5), NodeId(6)]);
        let placement = Placement::new(&config);
        assert!(placement.sharded());
        assert_eq!(placement.owner(0), KeyspaceId(0));
        assert_eq!(placement.owner(8191), KeyspaceId(0));
        assert_eq!(placement.owner(8192), KeyspaceId(1));
        assert_eq!(placement.groups[&KeyspaceId(0)].preferred_leader, Some(NodeId(1)));
        assert_eq!(placement.groups[&KeyspaceId(1)].preferred_leader, Some(NodeId(4)));
        assert!(placement.hosted_here(KeyspaceId(1)) && !placement.hosted_here(KeyspaceId(0)));
        assert_eq!(placement.client_addr(NodeId(2)).as_deref(), Some("127.0.0.1:7001"));
        let other = Placement::new(&sharded(6, 2, 1));
        assert_eq!(placement.digest(), other.digest(), "the same on every node");
        // Placed, not sharded, members without client addresses, one node joining (its
        // own `voters` without itself): the digest is still every node's.
        let placed = |node: u32| {
            let mut c = sharded(6, 2, node);
            c.keyspaces.iter_mut().for_each(|k| k.slots = None);
            c.members.iter_mut().for_each(|m| m.client_addr = None);
            if node == 6 {
                c.voters = Some(vec![1, 2, 3, 4, 5]);
            }
            Placement::new(&c).digest()
        };
        assert!(
            (2..=6).all(|n| placed(n) == placed(1)),
            "{:?}",
            (1..=6).map(placed).collect::<Vec<_>>()
        );
        let mut moved = sharded(6, 2, 1);
        moved.keyspaces[1].slots = Some("8191-16383".into());
        moved.keyspaces[0].slots = Some("0-8190".into());
        assert_ne!(Placement::new(&moved).digest(), placement.digest());
    }

    #[test]
    fn redirects_go_to_the_known_leader_else_a_reachable_replica() {
        let placement = Placement::new(&sharded(6, 2, 4));
        let none = |_: NodeId| false;
        let all = |_: NodeId| true;
        let ks0 = KeyspaceId(0);
        assert_eq!(placement.target(ks0, None, &all), Some(NodeId(1)), "preferred");
        assert_eq!(placement.target(ks0, None, &|n| n != NodeId(1)), Some(NodeId(2)));
        assert_eq!(placement.target(ks0, None, &none), Some(NodeId(1)), "none up: preferred");
        assert_eq!(placement.target(ks0, Some(NodeId(3)), &none), Some(NodeId(3)), "known");
        assert_eq!(placement.target(ks0, Some(NodeId(5)), &all), Some(NodeId(1)), "not a replica");
        assert_eq!(placement.target(KeyspaceId(9), None, &all), None);
    }

    #[test]
    fn four_keyspaces_on_six_nodes_spread_their_leaders() {
        let mut config = ServerConfig::local(6, 1, 7000, std::path::Path::new("/tmp/x"));
        config.keyspaces = (0..4)
            .map(|k| KeyspaceSettings {
                replicas: Some((0..3).map(|r| (k * 3 + r) % 6 + 1).collect()),
                ..KeyspaceSettings::orca(k)
            })
            .collect();
        config.validate().unwrap();
        let leaders: Vec<u32> = config.preferred_leaders().values().map(|n| n.0).collect();
        assert_eq!(leaders, vec![1, 4, 2, 5]);
        let hosted: Vec<u32> = config.keyspace_specs().unwrap().iter().map(|s| s.id.0).collect();
        assert_eq!(hosted, vec![0, 2], "node 1 hosts the groups that name it");
    }

    #[test]
    fn a_keyspace_takes_only_keys_of_its_slots_whatever_carries_them() {
        use keel_types::{Command, KeelError};
        let placement = std::sync::Arc::new(Placement::new(&sharded(6, 2, 1)));
        let guard = SlotGuard::new(
            KeyspaceId(0),
            placement,
            Default::default(),
            Default::default(),
            Vec::new(),
        );
        let key = |k: &str| keel_types::Key::from(k.as_bytes().to_vec());
        let put = |k: &str| Command::Put { key: key(k), value: key("v") };
        // `bar` is in slot 5061 (keyspace 0), `foo` in 12182 (keyspace 1, on node 4).
        assert_eq!(guard.check(&put("bar")), Ok(()));
        let moved = KeelError::Moved { slot: 12182, addr: "127.0.0.1:7003".into() };
        assert_eq!(guard.check(&put("foo")), Err(moved.clone()));
        let multi = Command::Multi { ops: vec![put("bar"), put("foo")], watch: Vec::new() };
        assert_eq!(guard.check(&multi), Err(moved.clone()), "a transaction's every key");
        let watch = Command::Multi { ops: vec![put("bar")], watch: vec![(key("foo"), None)] };
        assert_eq!(guard.check(&watch), Err(moved.clone()), "the keys it watches too");
        let renamed = Command::Transfer {
            from: key("bar"),
            to: key("foo"),
            replace: true,
            remove_source: true,
        };
        assert!(guard.check(&renamed).is_err(), "both keys of a transfer");
        let hidden = Command::Put { key: keel_types::db_key(1, b"bar"), value: key("v") };
        assert!(matches!(guard.check(&hidden), Err(KeelError::InvalidArgument(_))));
        assert_eq!(guard.check(&Command::Count { db: 0 }), Ok(()), "no keys");
    }

    #[test]
    fn placements_that_cannot_work_are_refused_by_field() {
        let field = |config: &ServerConfig| match config.validate() {
            Err(crate::config::ConfigError::Invalid { field, .. }) => field,
            other => panic!("expected an invalid field, got {other:?}"),
        };
        let mut gap = sharded(6, 2, 1);
        gap.keyspaces[1].slots = Some("8192-16382".into());
        assert_eq!(field(&gap), "keyspaces");
        let mut overlap = sharded(6, 2, 1);
        overlap.keyspaces[1].slots = Some("8000-16383".into());
        assert_eq!(field(&overlap), "keyspaces.1.slots");
        let mut unsharded = sharded(6, 2, 1);
        unsharded.keyspaces[1].slots = None;
        assert_eq!(field(&unsharded), "keyspaces.1.slots");
        let mut stranger = sharded(6, 2, 1);
        stranger.keyspaces[0].replicas = Some(vec![1, 2, 9]);
        assert_eq!(field(&stranger), "keyspaces.0.replicas");
        let mut empty = sharded(6, 2, 1);
        empty.keyspaces[1].replicas = Some(Vec::new());
        assert_eq!(field(&empty), "keyspaces.1.replicas", "a group elsewhere, empty");
        let mut pair = sharded(6, 2, 1);
        pair.keyspaces[0].replicas = Some(vec![1, 2]);
        assert!(field(&pair).ends_with("members"), "two replicas make no group");
        let mut idle = sharded(7, 2, 7);
        idle.keyspaces[1].replicas = Some(vec![4, 5, 6]);
        assert_eq!(field(&idle), "keyspaces", "node 7 hosts nothing");
        let mut blind = sharded(6, 2, 1);
        blind.members[3].client_addr = None;
        assert_eq!(field(&blind), "members.4.client_addr");
        let mut whole = ServerConfig::local(6, 1, 7000, std::path::Path::new("/tmp/x"));
        whole.keyspaces = vec![KeyspaceSettings::orca(0)];
        assert!(whole.validate().is_err(), "six members cannot all vote in one keyspace");
    }
}
