//! Redis's databases (`SELECT 0..15`) on a Keel cluster, and the commands over a whole
//! database: `FLUSHDB`, `FLUSHALL`, `DBSIZE`, `KEYS`.
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
use keel_types::{db_key, Command, CommandResult, KeelError, KeyspaceId, DB_KEY_PREFIX};
use keel_wire::reply::error_frame;
use keel_wire::resp::Frame;
use keel_wire::ClientCommand;

/// Databases `SELECT` accepts, as Redis's default `databases` setting (a cluster with
/// more keyspaces accepts each keyspace's number too).
pub(crate) const DATABASES: u32 = 16;

/// Where `SELECT index` leads: a keyspace and a database of it (0 when the keyspace has
/// the index's number); `None`: out of range.
pub(crate) fn select(conn: &Conn, index: u32) -> Option<(KeyspaceId, u8)> {
    if conn.keyspaces.get(KeyspaceId(index)).is_some() {
        return Some((KeyspaceId(index), 0));
    }
    let first = conn.keyspaces.first().id;
    (index < DATABASES).then(|| (first, u8::try_from(index).expect("under 16")))
}

/// `command` with its keys in database `db`: the client's keys as they are in database
/// 0 (where none may begin with the databases' prefix), prefixed in any other.
pub(crate) fn in_database(command: ClientCommand, conn: &Conn) -> Result<ClientCommand, Frame> {
    let db = conn.db;
    let map = |key: keel_types::Key| -> Result<keel_types::Key, Frame> {
        if db == 0 && key.starts_with(DB_KEY_PREFIX) {
            return Err(Frame::error(
                "ERR keys beginning with \\xff\\xffkeel\\x02 are reserved for databases",
            ));
        }
        Ok(if db == 0 { key } else { db_key(db, &key) })
    };
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
        ClientCommand::Modify { key, op } => ClientCommand::Modify { key: map(key)?, op },
        ClientCommand::ReadString { key, op } => ClientCommand::ReadString { key: map(key)?, op },
        ClientCommand::Transfer { from, to, replace, remove_source, ok_reply, to_db } => {
            let to = match to_db {
                None => map(to)?,
                // Another database of the same keyspace: one log, so still one entry.
                Some(index) => match select(conn, index) {
                    Some((ks, other)) if ks == conn.node.id => db_key(other, &to),
                    Some(_) => {
                        return Err(Frame::error(
                            "ERR COPY between keyspaces is not supported: they are separate logs",
                        ))
                    }
                    None => return Err(keel_wire::CommandError::DbIndexOutOfRange.reply_frame()),
                },
            };
            let from = map(from)?;
            ClientCommand::Transfer { from, to, replace, remove_source, ok_reply, to_db: None }
        }
        ClientCommand::MSet { pairs } => ClientCommand::MSet {
            pairs: pairs
                .into_iter()
                .map(|(k, v)| Ok((map(k)?, v)))
                .collect::<Result<_, Frame>>()?,
        },
        ClientCommand::Exists { keys } => ClientCommand::Exists { keys: many(keys)? },
        ClientCommand::MGet { keys, level } => ClientCommand::MGet { keys: many(keys)?, level },
        ClientCommand::Incr { key, delta, fetch } => {
            ClientCommand::Incr { key: map(key)?, delta, fetch }
        }
        ClientCommand::Cas { key, expected, new, durability, mode } => {
            ClientCommand::Cas { key: map(key)?, expected, new, durability, mode }
        }
        ClientCommand::Expire { key, ttl, cond } => {
            ClientCommand::Expire { key: map(key)?, ttl, cond }
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
        ClientCommand::Scan { .. } if db != 0 => {
            return Err(Frame::error("ERR KEEL.SCAN reads database 0 of a keyspace: SELECT it"));
        }
        other => other,
    })
}

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
        ClientCommand::Keys { pattern } => {
            let limit = conn.limits.scan_items_max;
            let reply = keys_of(&conn.node, db, turn.after, Some(pattern), limit);
            Pending::later(Box::pin(reply), protocol)
        }
        other => unreachable!("{} is not a database command", other.name()),
    }
}

fn flush_reply(reply: Result<ClientReply, KeelError>) -> Frame {
    match reply.and_then(|r| r.result) {
        Ok(CommandResult::Count { .. }) => Frame::ok(),
        Ok(_) => mismatched("flush"),
        Err(e) => error_frame(&e),
    }
}
