//! Redis's databases (`SELECT 0..15`) on a Keel cluster, and the commands over a whole
//! database: `FLUSHDB`, `FLUSHALL`, `SWAPDB`, `DBSIZE`, `KEYS`.
//!
//! A database is a namespace inside a keyspace, not a keyspace of its own: `SELECT d`
//! picks keyspace `d` when the cluster has one (so `redis-cli -n d` reaches keyspace `d`
//! as it always did, in that keyspace's database 0), and otherwise database `d` of
//! keyspace 0, whose keys the state machine holds under `keel_types::DB_KEY_PREFIX`
//! and the database's number. One keyspace is one log and one leader, so the databases
//! of a keyspace share its order: a transaction, `FLUSHALL` or an expiry spans them as
//! one entry. `docs/redis-compatibility.md` argues the choice.

use super::keys::keys_of;
use super::mismatched;
use crate::driver::Submit;
use crate::front_door::conn::{Conn, Pending};
use crate::front_door::dispatch::Turn;
use keel_core::engine::ClientReply;
use keel_types::{
    db_key, ClientId, ClusterOp, Command, CommandResult, KeelError, KeyspaceId, RequestId,
    DB_KEY_PREFIX,
};
use keel_wire::command::TransferForm;
use keel_wire::reply::error_frame;
use keel_wire::resp::Frame;
use keel_wire::ClientCommand;

/// Databases `SELECT` accepts, as Redis's default `databases` setting (a cluster with
/// more keyspaces accepts each keyspace's number too).
pub(crate) const DATABASES: u32 = 16;

/// Where `SELECT index` leads: a keyspace and a database of it (0 when the keyspace has
/// the index's number); `None`: out of range, or a keyspace this node does not host.
pub(crate) fn select(conn: &Conn, index: u32) -> Option<(KeyspaceId, u8)> {
    if conn.keyspaces.get(KeyspaceId(index)).is_some() {
        return Some((KeyspaceId(index), 0));
    }
    if conn.keyspaces.placement().is_some_and(|p| p.groups.contains_key(&KeyspaceId(index))) {
        return None; // a keyspace of the cluster that other nodes host
    }
    let first = conn.keyspaces.first().id;
    (index < DATABASES).then(|| (first, u8::try_from(index).expect("under 16")))
}

/// `command` with its keys in database `db`: the client's keys as they are in database
/// 0 (where none may begin with the databases' prefix), prefixed in any other.
pub(crate) fn in_database(command: ClientCommand, conn: &Conn) -> Result<ClientCommand, Frame> {
    in_database_of(command, conn.db, conn.node.id, &|index| select(conn, index))
}

/// [`in_database`] for database `db` of keyspace `keyspace`, with `select` saying where
/// each `SELECT` index leads (for `MOVE` and `COPY ... DB`).
pub(crate) fn in_database_of(
    command: ClientCommand,
    db: u8,
    keyspace: KeyspaceId,
    select: &dyn Fn(u32) -> Option<(KeyspaceId, u8)>,
) -> Result<ClientCommand, Frame> {
    let map = |key: keel_types::Key| key_in_database(db, key);
    let many =
        |keys: Vec<keel_types::Key>| keys.into_iter().map(map).collect::<Result<Vec<_>, _>>();
    Ok(match command {
        ClientCommand::Get { key, level, with_version, mode } => {
            ClientCommand::Get { key: map(key)?, level, with_version, mode }
        }
        ClientCommand::Set { key, value, durability, with_version, mode, options } => {
            ClientCommand::Set { key: map(key)?, value, durability, with_version, mode, options }
        }
        ClientCommand::Del { keys } => ClientCommand::Del { keys: many(keys)? },
        ClientCommand::Modify { key, op, durability } => {
            ClientCommand::Modify { key: map(key)?, op, durability }
        }
        ClientCommand::ReadString { key, op, level } => {
            ClientCommand::ReadString { key: map(key)?, op, level }
        }
        ClientCommand::Transfer { from, to, replace, remove_source, form, to_db, durability } => {
            let to = match to_db {
                None => map(to)?,
                Some(index) => transfer_to(&to, index, form, db, keyspace, select)?,
            };
            let from = map(from)?;
            ClientCommand::Transfer {
                from,
                to,
                replace,
                remove_source,
                form,
                to_db: None,
                durability,
            }
        }
        ClientCommand::MSet { pairs, only_new } => ClientCommand::MSet {
            pairs: pairs
                .into_iter()
                .map(|(k, v)| Ok((map(k)?, v)))
                .collect::<Result<_, Frame>>()?,
            only_new,
        },
        ClientCommand::Lcs { a, b, form } => ClientCommand::Lcs { a: map(a)?, b: map(b)?, form },
        ClientCommand::Exists { keys } => ClientCommand::Exists { keys: many(keys)? },
        ClientCommand::MGet { keys, level } => ClientCommand::MGet { keys: many(keys)?, level },
        ClientCommand::Incr { key, delta, fetch } => {
            ClientCommand::Incr { key: map(key)?, delta, fetch }
        }
        ClientCommand::Cas { key, expected, new, durability, mode } => {
            ClientCommand::Cas { key: map(key)?, expected, new, durability, mode }
        }
        ClientCommand::Expire { key, ttl, cond, durability } => {
            ClientCommand::Expire { key: map(key)?, ttl, cond, durability }
        }
        ClientCommand::Ttl { key, form, level } => {
            ClientCommand::Ttl { key: map(key)?, form, level }
        }
        ClientCommand::Enqueue { queue, value, durability } => {
            ClientCommand::Enqueue { queue: map(queue)?, value, durability }
        }
        ClientCommand::Dequeue { queue, durability } => {
            ClientCommand::Dequeue { queue: map(queue)?, durability }
        }
        ClientCommand::QueuePeek { queue, level } => {
            ClientCommand::QueuePeek { queue: map(queue)?, level }
        }
        ClientCommand::Coll { name, key, mut op, durability, reshape } => {
            for other in op.other_keys_mut() {
                *other = map(std::mem::take(other))?;
            }
            ClientCommand::Coll { name, key: map(key)?, op, durability, reshape }
        }
        ClientCommand::Block { name, key, mut op, timeout, durability, reshape } => {
            for other in op.other_keys_mut() {
                *other = map(std::mem::take(other))?;
            }
            ClientCommand::Block { name, key: map(key)?, op, timeout, durability, reshape }
        }
        ClientCommand::CollRead { name, key, mut op, level, reshape } => {
            for other in op.other_keys_mut() {
                *other = map(std::mem::take(other))?;
            }
            ClientCommand::CollRead { name, key: map(key)?, op, level, reshape }
        }
        ClientCommand::Scan { .. } if db != 0 => {
            return Err(Frame::error("ERR KEEL.SCAN reads database 0 of a keyspace: SELECT it"));
        }
        other => other,
    })
}

/// The destination `to` of a `COPY` or `MOVE` into database `index` (`DB`): another
/// database of the same keyspace only (one log, so still one entry).
fn transfer_to(
    to: &keel_types::Key,
    index: u32,
    form: TransferForm,
    db: u8,
    keyspace: KeyspaceId,
    select: &dyn Fn(u32) -> Option<(KeyspaceId, u8)>,
) -> Result<keel_types::Key, Frame> {
    match select(index) {
        Some((_, other)) if form == TransferForm::Move && other == db => {
            Err(Frame::error("ERR source and destination objects are the same"))
        }
        Some((ks, other)) if ks == keyspace => Ok(db_key(other, to)),
        Some(_) => Err(Frame::error(
            "ERR COPY and MOVE between keyspaces are not supported: they are separate logs",
        )),
        None => Err(keel_wire::CommandError::DbIndexOutOfRange.reply_frame()),
    }
}

/// `key` of database `db` as the state machine holds it: as it is in database 0 (where
/// none may begin with the databases' prefix), prefixed in any other.
pub(crate) fn key_in_database(db: u8, key: keel_types::Key) -> Result<keel_types::Key, Frame> {
    if db == 0 && key.starts_with(DB_KEY_PREFIX) {
        return Err(Frame::error(
            "ERR keys beginning with \\xff\\xffkeel\\x02 are reserved for databases",
        ));
    }
    Ok(if db == 0 { key } else { db_key(db, &key) })
}

/// Why a membership change of the connection's keyspace cannot work: in a placed
/// cluster, a node to add, promote or lead that is not among the keyspace's replicas
/// runs no replica of it (it would never catch up). Removals are not checked: a dead
/// node may already be gone from the configuration; nor are returns (geo keyspaces only,
/// which are not placed).
fn not_a_replica(conn: &Conn, op: ClusterOp) -> Option<String> {
    if matches!(op, ClusterOp::Remove(_) | ClusterOp::Return(_)) {
        return None;
    }
    let group = conn.keyspaces.placement()?.groups.get(&conn.node.id)?;
    let node = op.node();
    (!group.replicas.contains(&node)).then(|| {
        let replicas: Vec<String> = group.replicas.iter().map(|n| n.0.to_string()).collect();
        format!(
            "ERR node {} is not a replica of keyspace {} (its replicas: {}); list it in the keyspace's replicas and start it first",
            node.0,
            conn.node.id.0,
            replicas.join(", ")
        )
    })
}

/// Why a leadership transfer may not be asked now: a member (or this node) speaks a peer
/// protocol older than the transfer's (2), and would drop its messages (`docs/operations.md`,
/// *Rolling upgrade*).
fn older_peer(conn: &Conn) -> Option<String> {
    let protocols = conn.keyspaces.node_metrics.peer_protocols();
    let (node, protocol) = protocols.into_iter().find(|(_, p)| *p < TRANSFER_PROTOCOL)?;
    Some(format!(
        "ERR node {} speaks peer protocol {protocol}; leadership transfer needs {TRANSFER_PROTOCOL} \
         on every member: finish the upgrade first",
        node.0
    ))
}

/// The peer protocol that brought leadership transfer.
const TRANSFER_PROTOCOL: u8 = 2;

/// Sends a whole-database command its turn has come for.
pub(crate) fn send(conn: &mut Conn, command: ClientCommand, turn: Turn) -> Pending {
    let protocol = conn.protocol;
    let db = conn.db;
    match command {
        ClientCommand::Flush { all } => {
            let flush = Command::Flush { db: (!all).then_some(db) };
            let sent = conn.node.send(turn.submit(flush));
            let floor = conn.floor();
            let reply = async move {
                let answer = sent.answer().await;
                floor.note(&answer);
                flush_reply(answer)
            };
            Pending::later(Box::pin(reply), protocol)
        }
        ClientCommand::Node { op } => {
            if let (ClusterOp::TransferLeader(_), Some(text)) = (op, older_peer(conn)) {
                return Pending::ready(Frame::error(&text), protocol);
            }
            if let Some(text) = not_a_replica(conn, op) {
                return Pending::ready(Frame::error(&text), protocol);
            }
            // Through the keyspace's log, at its leader: answered once committed.
            let sent = conn.node.send(turn.submit(Command::Cluster(op)));
            let reply = async move {
                match sent.answer().await.and_then(|reply| reply.result) {
                    Ok(_) => Frame::ok(),
                    Err(error) => error_frame(&error),
                }
            };
            Pending::later(Box::pin(reply), protocol)
        }
        ClientCommand::Slots { op } => super::slots::send(conn, op, turn),
        ClientCommand::SwapDb { a, b } => {
            let (a, b) = match (select(conn, a), select(conn, b)) {
                (Some((ka, a)), Some((kb, b))) if ka == conn.node.id && kb == ka => (a, b),
                (Some(_), Some(_)) => {
                    let text = "ERR SWAPDB swaps databases of the connection's keyspace only: \
                                keyspaces are separate logs";
                    return Pending::ready(Frame::error(text), protocol);
                }
                _ => {
                    let refusal = keel_wire::CommandError::DbIndexOutOfRange.reply_frame();
                    return Pending::ready(refusal, protocol);
                }
            };
            let sent = conn.node.send(turn.submit(Command::SwapDb { a, b }));
            let floor = conn.floor();
            let reply = async move {
                let answer = sent.answer().await;
                floor.note(&answer);
                // Lists may have come into the databases clients block on.
                super::collections::wake_blocked();
                flush_reply(answer)
            };
            Pending::later(Box::pin(reply), protocol)
        }
        ClientCommand::DbSize => {
            let sent = conn.node.send(Submit { ..turn.submit(Command::Count { db }) });
            let reply = async move {
                match sent.answer().await.and_then(|r| r.result) {
                    Ok(CommandResult::Count { keys }) => Frame::Integer(keys as i64),
                    Ok(_) => mismatched("dbsize"),
                    Err(e) => error_frame(&e),
                }
            };
            Pending::later(Box::pin(reply), protocol)
        }
        command @ ClientCommand::ScanKeys { .. } => scan_page(conn, command, turn.after),
        ClientCommand::Keys { pattern } => {
            let limit = conn.limits.scan_items_max;
            let reply = keys_of(&conn.node, db, turn.after, Some(pattern), limit);
            Pending::later(Box::pin(reply), protocol)
        }
        ClientCommand::RandomKey => {
            let reply = random_key(conn.node.clone(), db, turn.after);
            Pending::later(Box::pin(reply), protocol)
        }
        other => unreachable!("{} is not a database command", other.name()),
    }
}

/// Most `SCAN` cursors a process keeps (oldest forgotten first): a client that resumes
/// one forgotten is told `invalid cursor` and starts over.
const CURSORS_MAX: usize = 65_536;

/// Where `SCAN` cursors left off: the keyspace, the database, and the first key of the
/// next page. A cursor lives at the node that handed it out, not at the leader, so a
/// scan goes on across leader changes; it is checked against the connection's keyspace and
/// database before use.
#[derive(Default)]
struct Cursors {
    next_id: u64,
    open: std::collections::BTreeMap<u64, (KeyspaceId, u8, bytes::Bytes)>,
}

static CURSORS: std::sync::Mutex<Option<Cursors>> = std::sync::Mutex::new(None);

/// Keeps `(keyspace, db, next)` under a new cursor, forgetting the oldest past the bound.
fn open_cursor(keyspace: KeyspaceId, db: u8, next: bytes::Bytes) -> u64 {
    let mut guard = CURSORS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let cursors = guard.get_or_insert_with(|| Cursors {
        // Ids start apart per process, so that one from another node is rarely valid.
        next_id: 1 + (crate::driver::wall_ms() << 16),
        ..Cursors::default()
    });
    let id = cursors.next_id;
    cursors.next_id += 1;
    cursors.open.insert(id, (keyspace, db, next));
    while cursors.open.len() > CURSORS_MAX {
        cursors.open.pop_first();
    }
    id
}

/// The next key of cursor `id` if it was handed out for `keyspace` and `db`. Kept, not
/// taken: a page that failed (during an election) is asked again with the same cursor.
fn resume_cursor(id: u64, keyspace: KeyspaceId, db: u8) -> Option<bytes::Bytes> {
    let guard = CURSORS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let (ks, d, next) = guard.as_ref()?.open.get(&id)?;
    (*ks == keyspace && *d == db).then(|| next.clone())
}

/// `SCAN`: one page of the connection's database from where the cursor left off.
fn scan_page(conn: &Conn, command: ClientCommand, after: keel_types::LogIndex) -> Pending {
    let ClientCommand::ScanKeys { cursor, pattern, count, type_name } = command else {
        unreachable!("a SCAN")
    };
    let (keyspace, db) = (conn.node.id, conn.db);
    let (range_start, end) = match db {
        0 => (bytes::Bytes::new(), None),
        db => {
            let (start, end) = keel_types::db_range(db);
            (start, Some(end))
        }
    };
    let start = match cursor {
        0 => range_start,
        id => match resume_cursor(id, keyspace, db) {
            Some(next) => next,
            None => {
                return Pending::ready(
                    keel_wire::CommandError::InvalidCursor.reply_frame(),
                    conn.protocol,
                )
            }
        },
    };
    let limit = count.clamp(1, conn.limits.scan_items_max);
    let node = conn.node.clone();
    let strings_only = type_name.as_ref().is_none_or(|t| t.eq_ignore_ascii_case(b"string"));
    let reply = async move {
        let scan = Command::Scan { start, end, limit };
        let submit = super::plain_submit(ClientId(1), RequestId(1), scan, None, after);
        let items = match node.send(submit).answer().await.and_then(|r| r.result) {
            Ok(CommandResult::Items { items }) => items,
            Ok(_) => return mismatched("scan"),
            Err(e) => return error_frame(&e),
        };
        let next = match items.last() {
            Some((last, _, _)) if items.len() as u32 >= limit => {
                let mut next = last.to_vec();
                next.push(0);
                open_cursor(keyspace, db, next.into())
            }
            _ => 0,
        };
        let keys = items
            .iter()
            .filter_map(|(key, _, _)| keel_types::db_of(key).map(|(_, name)| name))
            .filter(|name| {
                strings_only && pattern.as_ref().is_none_or(|p| keel_wire::glob::matches(p, name))
            })
            .map(|name| Frame::Bulk(bytes::Bytes::copy_from_slice(name)))
            .collect();
        Frame::Array(vec![Frame::Bulk(next.to_string().into()), Frame::Array(keys)])
    };
    Pending::later(Box::pin(reply), conn.protocol)
}

/// Keys `RANDOMKEY` reads from its random point, one of which it answers.
const RANDOM_WINDOW: u32 = 16;

/// `RANDOMKEY`: one key, drawn evenly, of the up to [`RANDOM_WINDOW`] keys of database
/// `db` at or after a random point of its range (wrapping round to its start); null when
/// it has none. Even over a database of at most that many keys; over a larger one, keys
/// after a wide gap come up more often, as Redis's draw favours keys alone in their hash
/// bucket.
async fn random_key(
    node: crate::driver::KeyspaceHandle,
    db: u8,
    after: keel_types::LogIndex,
) -> Frame {
    use std::hash::{BuildHasher, Hasher};
    let (range_start, end) = match db {
        0 => (bytes::Bytes::new(), None),
        db => {
            let (start, end) = keel_types::db_range(db);
            (start, Some(end))
        }
    };
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(crate::driver::wall_ms());
    let draw = hasher.finish();
    let mut point = range_start.to_vec();
    point.extend_from_slice(&draw.to_be_bytes()[..3]);
    let mut names: Vec<bytes::Bytes> = Vec::new();
    for start in [bytes::Bytes::from(point), range_start] {
        let room = RANDOM_WINDOW - names.len() as u32;
        if room == 0 {
            break;
        }
        let scan = Command::Scan { start, end: end.clone(), limit: room };
        let submit = super::plain_submit(ClientId(1), RequestId(1), scan, None, after);
        match node.send(submit).answer().await.and_then(|r| r.result) {
            Ok(CommandResult::Items { items }) => {
                for (key, _, _) in items {
                    let name = keel_types::db_of(&key).filter(|(in_db, _)| *in_db == db);
                    let name = name.map(|(_, name)| bytes::Bytes::copy_from_slice(name));
                    // The wrap round may find again what the first scan found.
                    if let Some(name) = name.filter(|n| !names.contains(n)) {
                        names.push(name);
                    }
                }
            }
            Ok(_) => return mismatched("randomkey"),
            Err(e) => return error_frame(&e),
        }
    }
    match names.len() {
        0 => Frame::Null,
        n => Frame::Bulk(names.swap_remove((draw >> 32) as usize % n)),
    }
}

fn flush_reply(reply: Result<ClientReply, KeelError>) -> Frame {
    match reply.and_then(|r| r.result) {
        Ok(CommandResult::Count { .. }) => Frame::ok(),
        Ok(_) => mismatched("flush"),
        Err(e) => error_frame(&e),
    }
}
