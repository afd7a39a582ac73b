//! The Redis Cluster protocol of a sharded cluster (`docs/operations.md`, *Sharding*):
//! each request's keys name one hash slot, whose keyspace the request runs in when this
//! node hosts it, else the client is sent on with `MOVED`; `CLUSTER SLOTS`, `SHARDS`,
//! `NODES`, `INFO`, `KEYSLOT` and `MYID` describe the map. In a cluster that is not
//! sharded, these commands answer as a Redis server without cluster support does.

use super::super::conn::{Conn, Pending};
use crate::config::PeerAddr;
use crate::placement::Placement;
use bytes::Bytes;
use keel_types::{KeyspaceId, NodeId};
use keel_wire::resp::Frame;
use keel_wire::slots::{key_slot, SLOTS};

/// Redis's answer to a cluster command on a server without cluster support.
const DISABLED: &str = "ERR This instance has cluster support disabled";
/// Redis's answer to keys of several slots in one request.
const CROSSSLOT: &str = "CROSSSLOT Keys in request don't hash to the same slot";

/// Commands whose keys follow a key count: (name, position of the count).
const NUMKEYS: &[(&str, usize)] = &[
    ("eval", 2),
    ("evalsha", 2),
    ("eval_ro", 2),
    ("evalsha_ro", 2),
    ("fcall", 2),
    ("fcall_ro", 2),
    ("zunion", 1),
    ("zinter", 1),
    ("zdiff", 1),
    ("zintercard", 1),
    ("sintercard", 1),
    ("lmpop", 1),
    ("zmpop", 1),
    ("blmpop", 2),
    ("bzmpop", 2),
];

/// Commands whose first key is a destination, then a key count and the sources.
const STORE_NUMKEYS: &[&str] = &["zunionstore", "zinterstore", "zdiffstore"];

/// Keel's options a request may end with: a word and its value, or a word alone.
const TRAILING_PAIRS: &[&str] = &["level", "durability"];
const TRAILING_WORDS: &[&str] = &["withversion", "acquire", "release"];

/// `words` without the options of Keel's own a request ends with (`LEVEL l`,
/// `DURABILITY d`, `WITHVERSION`), which Redis's key positions do not count.
fn without_keel_options(words: &[Bytes]) -> &[Bytes] {
    let is = |w: &Bytes, names: &[&str]| names.iter().any(|n| w.eq_ignore_ascii_case(n.as_bytes()));
    let mut end = words.len();
    loop {
        if end > 3 && is(&words[end - 2], TRAILING_PAIRS) {
            end -= 2;
        } else if end > 2 && is(&words[end - 1], TRAILING_WORDS) {
            end -= 1;
        } else {
            return &words[..end];
        }
    }
}

/// The keys of the request `words` (its name first), as Redis Cluster finds them: a key
/// count's keys, or the command table's key positions (Keel's trailing options set
/// aside); `KEEL.REQ`'s and `KEEL.INVOKE`'s wrapped request's. A guess at worst: every
/// keyspace refuses keys of slots it does not serve (`placement::SlotGuard`).
pub(crate) fn request_keys(words: &[Bytes]) -> Vec<&Bytes> {
    let Some(first) = words.first() else { return Vec::new() };
    let name = String::from_utf8_lossy(first).to_ascii_lowercase();
    if name == "keel.req" {
        return words.get(3..).map_or(Vec::new(), request_keys);
    }
    if name == "keel.invoke" {
        return words.get(1..).map_or(Vec::new(), request_keys);
    }
    if name == "object" || name == "memory" {
        return words.get(2).into_iter().collect(); // OBJECT ENCODING key, MEMORY USAGE key
    }
    let words = without_keel_options(words);
    if name == "sort" || name == "sort_ro" {
        let store = words.iter().position(|w| w.eq_ignore_ascii_case(b"store"));
        let dest = store.and_then(|at| words.get(at + 1));
        return words.get(1).into_iter().chain(dest).collect();
    }
    let counted = |at: usize, from: usize| -> Vec<&Bytes> {
        let count = words.get(at).and_then(|w| std::str::from_utf8(w).ok()?.parse::<usize>().ok());
        let count = count.unwrap_or(0).min(words.len().saturating_sub(from));
        words[from..from + count].iter().collect()
    };
    if let Some((_, at)) = NUMKEYS.iter().find(|(n, _)| *n == name) {
        return counted(*at, at + 1);
    }
    if STORE_NUMKEYS.contains(&name.as_str()) {
        let mut keys: Vec<&Bytes> = words.get(1).into_iter().collect();
        keys.extend(counted(2, 3));
        return keys;
    }
    keel_wire::command::table::find(first).and_then(|spec| spec.keys_of(words)).unwrap_or_default()
}

/// The one slot of `keys`; `Err` when they name several, `Ok(None)` when there are none.
pub(crate) fn one_slot(keys: &[&Bytes]) -> Result<Option<u16>, ()> {
    let mut slot = None;
    for key in keys {
        let this = key_slot(key);
        if slot.is_some_and(|s| s != this) {
            return Err(());
        }
        slot = Some(this);
    }
    Ok(slot)
}

/// In a sharded cluster, routes the request `words` by its keys' slot: `Some(reply)`
/// answers it here (a cluster command, `CROSSSLOT`, `MOVED`, `SELECT` of another
/// database); `None` lets it run, in the keyspace serving its slot, which the
/// connection now uses. Outside a sharded cluster, only the cluster commands are
/// answered (as a server without cluster support).
pub(crate) fn route(conn: &mut Conn, words: &[Bytes]) -> Option<Pending> {
    let first = words.first()?;
    let is = |word: &str| first.eq_ignore_ascii_case(word.as_bytes());
    let protocol = conn.protocol;
    let ready = |frame: Frame| Some(Pending::ready(frame, protocol));
    let keyspaces = conn.keyspaces.clone();
    let Some(placement) = keyspaces.placement().filter(|p| p.sharded()) else {
        return (is("cluster") || is("readonly") || is("readwrite") || is("asking"))
            .then(|| Pending::ready(Frame::error(DISABLED), protocol));
    };
    if is("cluster") {
        return ready(cluster(conn, placement, &words[1..]));
    }
    // `ASKING` counts for the next request alone.
    let asking = std::mem::take(&mut conn.asking);
    conn.node.asking = None;
    if is("asking") {
        conn.asking = true;
        return ready(Frame::ok());
    }
    if is("readonly") || is("readwrite") {
        return ready(Frame::ok());
    }
    if is("swapdb") || is("move") {
        // Redis Cluster has database 0 only (`COPY ... DB n` meets the keyspace's guard).
        let name = String::from_utf8_lossy(first).to_ascii_uppercase();
        return ready(Frame::error(&format!("ERR {name} is not allowed in cluster mode")));
    }
    if is("select") {
        // Redis Cluster has database 0 only. Keel's own tools select a keyspace this
        // node hosts by its number (`KEEL.STATUS` of each), which the next request with
        // keys leaves for its slot's.
        let index = words.get(1).and_then(|w| std::str::from_utf8(w).ok()?.parse::<u32>().ok());
        return match index {
            Some(i) if words.len() == 2 && keyspaces.get(KeyspaceId(i)).is_some() => None,
            Some(0) if words.len() == 2 => ready(Frame::ok()),
            _ => ready(Frame::error("ERR SELECT is not allowed in cluster mode")),
        };
    }
    let slot = match one_slot(&request_keys(words)) {
        Ok(Some(slot)) => slot,
        Ok(None) => return None,
        Err(()) => return refuse_queued(conn, Frame::error(CROSSSLOT)),
    };
    let view = keyspaces.slot_view();
    let mut owner = view.serving(placement, slot);
    let asked = view.importing(slot).filter(|_| asking);
    if let Some((importing, _)) = asked {
        owner = importing; // sent on by the source's `ASK`
    }
    let Some(handle) = keyspaces.get(owner) else {
        let known = keyspaces.leader_of(owner);
        let addr = placement.redirect(owner, known, &|n| keyspaces.reachable(n));
        return refuse_queued(conn, Frame::error(&format!("MOVED {slot} {addr}")));
    };
    if super::transactions::transaction_keyspace(conn).is_some_and(|k| k != owner) {
        // One transaction is one entry of one keyspace's log.
        return refuse_queued(conn, Frame::error(CROSSSLOT));
    }
    if handle.id != conn.node.id {
        conn.node = handle.clone();
        conn.db = 0;
    }
    // The engine takes a key of a slot it imports only from a request the source sent
    // on: this one request goes as such.
    // (In the move this node's replica knows of: a request sent on in an earlier one is
    // refused there.)
    conn.node.asking = asked.map(|(_, id)| id);
    super::transactions::fix_keyspace(conn, owner);
    None
}

/// `refusal`, which also discards the transaction being queued, if any, at `EXEC`.
fn refuse_queued(conn: &mut Conn, refusal: Frame) -> Option<Pending> {
    super::transactions::refuse(conn);
    Some(Pending::ready(refusal, conn.protocol))
}

/// `CLUSTER <subcommand> ...`.
fn cluster(conn: &Conn, placement: &Placement, words: &[Bytes]) -> Frame {
    let Some(sub) = words.first() else {
        return Frame::error("ERR wrong number of arguments for 'cluster' command");
    };
    let sub = String::from_utf8_lossy(sub).to_ascii_lowercase();
    let map = Map::new(conn, placement);
    match (sub.as_str(), words.len()) {
        ("keyslot", 2) => Frame::Integer(i64::from(key_slot(&words[1]))),
        ("myid", 1) => Frame::bulk(node_name(placement.me)),
        ("info", 1) => Frame::bulk(map.info()),
        ("slots", 1) => map.slots(),
        ("shards", 1) => map.shards(),
        ("nodes", 1) => Frame::bulk(map.nodes()),
        ("countkeysinslot" | "getkeysinslot", _) => Frame::error(
            "ERR Keel does not list a slot's keys (SCAN the node's keyspace instead)",
        ),
        ("keyslot" | "myid" | "info" | "slots" | "shards" | "nodes", _) => {
            Frame::error(&format!("ERR wrong number of arguments for 'cluster|{sub}' command"))
        }
        _ => Frame::error(&format!(
            "ERR unknown subcommand '{sub}'. Keel answers CLUSTER INFO, KEYSLOT, MYID, NODES, SHARDS and SLOTS."
        )),
    }
}

/// A member's 40-character name in Redis Cluster's replies: its id in hexadecimal.
pub(crate) fn node_name(node: NodeId) -> String {
    format!("{:040x}", node.0)
}

/// One keyspace of a sharded cluster as the map shows it.
struct Shard {
    /// Its slots, as ranges.
    ranges: Vec<(u16, u16)>,
    /// The replica clients should use: its leader as far as this node knows.
    target: NodeId,
    /// Its replicas, in id order.
    replicas: Vec<NodeId>,
}

/// The slot map as this node sees it now: each keyspace's slots, the replica clients
/// should use (its leader as far as this node knows), and which members are reachable.
struct Map<'a> {
    placement: &'a Placement,
    /// Per keyspace, in id order.
    shards: Vec<Shard>,
    reachable: std::collections::BTreeSet<NodeId>,
}

impl<'a> Map<'a> {
    fn new(conn: &Conn, placement: &'a Placement) -> Map<'a> {
        let keyspaces = &conn.keyspaces;
        let members: std::collections::BTreeSet<NodeId> =
            placement.groups.values().flat_map(|g| g.replicas.iter().copied()).collect();
        let reachable = members.into_iter().filter(|n| keyspaces.reachable(*n)).collect();
        let moved = served_ranges(placement, &keyspaces.slot_view());
        let mut shards = Vec::new();
        for (id, group) in &placement.groups {
            let Some(slots) = &group.slots else { continue };
            let known = keyspaces.leader_of(*id);
            // Validated: every group has a replica, so there is always a target.
            let Some(target) = placement.target(*id, known, &|n| keyspaces.reachable(n)) else {
                continue;
            };
            let ranges = match &moved {
                Some(moved) => moved.get(id).cloned().unwrap_or_default(),
                None => slots.ranges().to_vec(),
            };
            shards.push(Shard { ranges, target, replicas: group.replicas.clone() });
        }
        Map { placement, shards, reachable }
    }

    /// `(host, port)` of member `node`'s client address.
    fn endpoint(&self, node: NodeId) -> (String, u16) {
        match self.placement.client_addrs.get(&node) {
            Some(PeerAddr::Ip(addr)) => (addr.ip().to_string(), addr.port()),
            Some(PeerAddr::Name(host, port)) => (host.clone(), *port),
            None => (String::new(), 0),
        }
    }

    /// The shard's replicas, the target first.
    fn ordered(target: NodeId, replicas: &[NodeId]) -> Vec<NodeId> {
        let mut nodes = vec![target];
        nodes.extend(replicas.iter().copied().filter(|n| *n != target));
        nodes
    }

    fn info(&self) -> String {
        let served: u32 =
            self.shards.iter().flat_map(|s| &s.ranges).map(|(a, b)| u32::from(b - a) + 1).sum();
        let down = self.shards.iter().filter(|s| !self.reachable.contains(&s.target)).count();
        let state = if down == 0 { "ok" } else { "fail" };
        let known: std::collections::BTreeSet<NodeId> =
            self.shards.iter().flat_map(|s| s.replicas.iter().copied()).collect();
        format!(
            "cluster_enabled:1\r\ncluster_state:{state}\r\ncluster_slots_assigned:{served}\r\ncluster_slots_ok:{served}\r\ncluster_slots_pfail:0\r\ncluster_slots_fail:0\r\ncluster_known_nodes:{}\r\ncluster_size:{}\r\ncluster_current_epoch:1\r\ncluster_my_epoch:1\r\ncluster_stats_messages_sent:0\r\ncluster_stats_messages_received:0\r\ntotal_cluster_links_buffer_limit_exceeded:0\r\n",
            known.len(),
            self.shards.len(),
        )
    }

    /// `CLUSTER SLOTS`: per slot range, the target's endpoint, then the other replicas'.
    fn slots(&self) -> Frame {
        let mut out = Vec::new();
        for Shard { ranges, target, replicas } in &self.shards {
            let nodes: Vec<Frame> = Self::ordered(*target, replicas)
                .into_iter()
                .map(|n| {
                    let (host, port) = self.endpoint(n);
                    Frame::Array(vec![
                        Frame::bulk(host),
                        Frame::Integer(i64::from(port)),
                        Frame::bulk(node_name(n)),
                    ])
                })
                .collect();
            for (a, b) in ranges {
                let mut entry = vec![Frame::Integer(i64::from(*a)), Frame::Integer(i64::from(*b))];
                entry.extend(nodes.iter().cloned());
                out.push(Frame::Array(entry));
            }
        }
        Frame::Array(out)
    }

    /// `CLUSTER SHARDS`: per keyspace, its slots and its replicas with their roles.
    fn shards(&self) -> Frame {
        let text = |s: &str| Frame::bulk(s);
        let mut out = Vec::new();
        for Shard { ranges, target, replicas } in &self.shards {
            let slots: Vec<Frame> = ranges
                .iter()
                .flat_map(|(a, b)| [Frame::Integer(i64::from(*a)), Frame::Integer(i64::from(*b))])
                .collect();
            let nodes: Vec<Frame> = Self::ordered(*target, replicas)
                .into_iter()
                .map(|n| {
                    let (host, port) = self.endpoint(n);
                    let role = if n == *target { "master" } else { "replica" };
                    let health = if self.reachable.contains(&n) { "online" } else { "fail" };
                    Frame::Map(vec![
                        (text("id"), Frame::bulk(node_name(n))),
                        (text("port"), Frame::Integer(i64::from(port))),
                        (text("ip"), Frame::bulk(&host)),
                        (text("endpoint"), Frame::bulk(&host)),
                        (text("role"), text(role)),
                        (text("replication-offset"), Frame::Integer(0)),
                        (text("health"), text(health)),
                    ])
                })
                .collect();
            out.push(Frame::Map(vec![
                (text("slots"), Frame::Array(slots)),
                (text("nodes"), Frame::Array(nodes)),
            ]));
        }
        Frame::Array(out)
    }

    /// `CLUSTER NODES`: one line per member: a master serves the slots of the keyspaces
    /// it is the target of; a member that is no keyspace's target is a replica of its
    /// first keyspace's.
    fn nodes(&self) -> String {
        let members: std::collections::BTreeSet<NodeId> =
            self.shards.iter().flat_map(|s| s.replicas.iter().copied()).collect();
        let mut text = String::new();
        for node in members {
            let (host, port) = self.endpoint(node);
            let served: Vec<String> = self
                .shards
                .iter()
                .filter(|s| s.target == node)
                .flat_map(|s| s.ranges.iter())
                .map(|(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") })
                .collect();
            let myself = if node == self.placement.me { "myself," } else { "" };
            let link = if self.reachable.contains(&node) { "connected" } else { "disconnected" };
            let (role, master) = match served.is_empty() {
                false => ("master", "-".to_string()),
                true => {
                    let of = self.shards.iter().find(|s| s.replicas.contains(&node));
                    let of = of.map(|s| s.target);
                    ("slave", of.map_or("-".to_string(), node_name))
                }
            };
            let fail = if link == "connected" { "" } else { ",fail" };
            text.push_str(&format!(
                "{} {host}:{port}@{} {myself}{role}{fail} {master} 0 0 1 {link}",
                node_name(node),
                u32::from(port) + 10_000,
            ));
            for range in served {
                text.push(' ');
                text.push_str(&range);
            }
            text.push('\n');
        }
        text
    }
}

/// Each keyspace's slots as ranges, as this node sees them while slots move (`None`:
/// no keyspace here has moved a slot: the configuration's).
fn served_ranges(
    placement: &Placement,
    view: &crate::placement::SlotView,
) -> Option<std::collections::BTreeMap<KeyspaceId, Vec<(u16, u16)>>> {
    if view.is_empty() {
        return None;
    }
    let mut ranges: std::collections::BTreeMap<KeyspaceId, Vec<(u16, u16)>> = Default::default();
    for (slot, owner) in view.owners(placement).into_iter().enumerate() {
        let slot = slot as u16;
        let list = ranges.entry(owner).or_default();
        match list.last_mut() {
            Some((_, last)) if *last + 1 == slot => *last = slot,
            _ => list.push((slot, slot)),
        }
    }
    Some(ranges)
}

/// `INFO`'s `Cluster` section.
pub(crate) fn info_section(keyspaces: &crate::driver::Keyspaces) -> String {
    format!("cluster_enabled:{}\r\n", u8::from(keyspaces.sharded()))
}

const _: () = assert!(SLOTS == 16_384);

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<Bytes> {
        text.split(' ').map(|w| Bytes::copy_from_slice(w.as_bytes())).collect()
    }

    fn keys(text: &str) -> Vec<String> {
        let words = words(text);
        request_keys(&words).iter().map(|k| String::from_utf8_lossy(k).into_owned()).collect()
    }

    #[test]
    fn keys_are_found_as_redis_cluster_finds_them() {
        assert_eq!(keys("GET a"), ["a"]);
        assert_eq!(keys("MSET a 1 b 2"), ["a", "b"]);
        assert_eq!(keys("EVAL s 2 x y arg"), ["x", "y"]);
        assert_eq!(keys("EVALSHA s 0 arg"), Vec::<String>::new());
        assert_eq!(keys("ZUNIONSTORE d 2 a b WEIGHTS 1 2"), ["d", "a", "b"]);
        assert_eq!(keys("ZINTER 2 a b"), ["a", "b"]);
        assert_eq!(keys("BLMPOP 0 2 a b LEFT"), ["a", "b"]);
        assert_eq!(keys("KEEL.REQ 1 2 SET k v"), ["k"]);
        assert_eq!(keys("EVAL s 9 x"), ["x"], "a count past the words: the words there are");
        assert_eq!(keys("PING"), Vec::<String>::new());
        assert_eq!(keys("GET k WITHVERSION"), ["k"]);
        assert_eq!(keys("GET k LEVEL any WITHVERSION"), ["k"]);
        assert_eq!(keys("HINCRBY h f 1 DURABILITY memory"), ["h"]);
        assert_eq!(keys("MGET a b LEVEL linearizable"), ["a", "b"]);
        assert_eq!(keys("BLPOP a b 0 DURABILITY durable"), ["a", "b"]);
        assert_eq!(keys("OBJECT ENCODING k"), ["k"]);
        assert_eq!(keys("MEMORY USAGE k"), ["k"]);
        assert_eq!(keys("SORT s LIMIT 0 5 STORE d"), ["s", "d"]);
        assert_eq!(keys("KEEL.INVOKE GET k LEVEL linearizable"), ["k"]);
    }

    #[test]
    fn keys_of_one_slot_route_and_of_two_do_not() {
        let w = words("MSET {u1}a 1 {u1}b 2");
        assert_eq!(one_slot(&request_keys(&w)), Ok(Some(key_slot(b"u1"))));
        let w = words("MSET a 1 b 2");
        assert_eq!(one_slot(&request_keys(&w)), Err(()));
        assert_eq!(one_slot(&[]), Ok(None));
    }

    #[test]
    fn node_names_are_forty_hex_digits() {
        assert_eq!(node_name(NodeId(10)).len(), 40);
        assert!(node_name(NodeId(10)).ends_with("0a"));
    }
}
