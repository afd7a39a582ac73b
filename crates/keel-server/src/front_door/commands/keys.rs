//! The key family: `DEL`, `EXISTS` and `KEEL.SCAN` (an array of `[key, value,
//! "epoch.index"]`), each mapped onto the engine's commands.

use super::strings::values_reply;
use super::{mismatched, plain_submit, result_reply};
use crate::driver::{KeyspaceHandle, Submit};
use crate::front_door::conn::{Conn, Floor, Pending};
use crate::front_door::dispatch::Turn;
use bytes::Bytes;
use keel_core::engine::ClientReply;
use keel_core::engine::EngineKind;
use keel_types::KeelError;
use keel_types::{ClientId, Command, CommandResult, LogIndex, ReadLevel, RequestId, Value};
use keel_wire::command::TtlForm;
use keel_wire::reply::error_frame;
use keel_wire::resp::Frame;
use keel_wire::ClientCommand;
use std::future::Future;

/// Sends a key command its [`Turn`] has come for.
pub(crate) fn send(conn: &mut Conn, command: ClientCommand, turn: Turn) -> Pending {
    let protocol = conn.protocol;
    match command {
        ClientCommand::Del { keys } => {
            let floor = conn.floor();
            let subs = turn.per_key(conn, keys);
            Pending::later(Box::pin(del(&conn.node, subs, turn.after, floor)), protocol)
        }
        ClientCommand::Exists { keys } if conn.node.kind == EngineKind::Kite => {
            // A Kite keyspace holds strings only: a get per key.
            let subs = turn.per_key(conn, keys);
            let reply = values_reply(&conn.node, subs, None, turn.after, exists_frame);
            Pending::later(Box::pin(reply), protocol)
        }
        ClientCommand::Exists { keys } => {
            let subs = turn.per_key(conn, keys);
            let sent = super::collections::types_of(&conn.node, subs, None, turn.after);
            let reply = async move {
                let mut count = 0;
                for one in sent {
                    let answer = one.answer().await;
                    if let Err(e) = answer.as_ref().map(|r| &r.result) {
                        return error_frame(e);
                    }
                    count += i64::from(super::collections::exists(&answer));
                }
                Frame::Integer(count)
            };
            Pending::later(Box::pin(reply), protocol)
        }
        ClientCommand::Expire { key, ttl, cond, durability } => {
            let command = Command::Expire { key, ttl, cond, now_ms: 0 };
            let sent = conn.node.send(Submit { durability, ..turn.submit(command) });
            Pending::write(sent, (expire_reply, false), protocol, conn.floor())
        }
        ClientCommand::Ttl { key, form, level } => {
            let sent = conn.node.send(Submit { level, ..turn.submit(Command::Inspect { key }) });
            let reply = async move { ttl_reply(sent.answer().await, form) };
            Pending::later(Box::pin(reply), protocol)
        }
        ClientCommand::Scan { start, end, count, level } => {
            let command = Command::Scan { start, end, limit: count };
            let sent = conn.node.send(Submit { level, ..turn.submit(command) });
            Pending::engine(sent, (result_reply, false), protocol)
        }
        other => unreachable!("{} is not a key command", other.name()),
    }
}

/// `DEL`: reads each key at level `any` to count the ones that existed, then deletes it;
/// every read and delete is sent at once, in that order. The count is advisory under
/// concurrent writers; the deletes are not.
fn del(
    node: &KeyspaceHandle,
    keys: Vec<(ClientId, RequestId, Bytes)>,
    after: LogIndex,
    floor: Floor,
) -> impl Future<Output = Frame> + Send + 'static {
    let mut sent = Vec::with_capacity(keys.len());
    for (client, request, key) in keys {
        // The read shares the delete's pair: reads never enter the dedup table.
        let any = Some(ReadLevel::Any);
        let sub = vec![(client, request, key.clone())];
        let read = super::collections::types_of(node, sub, any, after).pop().expect("one key");
        let delete = node.send(plain_submit(client, request, Command::Delete { key }, None, after));
        sent.push((read, delete));
    }
    async move {
        let mut existed = 0;
        let mut failed = None;
        for (read, delete) in sent {
            existed += i64::from(super::collections::exists(&read.answer().await));
            let answer = delete.answer().await;
            floor.note(&answer);
            if let Err(e) = answer.and_then(|r| r.result) {
                failed.get_or_insert(e);
            }
        }
        match failed {
            Some(e) => error_frame(&e),
            None => Frame::Integer(existed),
        }
    }
}

/// Keys one page of `KEYS` reads.
const KEYS_PAGE: u32 = 1_000;

/// `KEYS`: every key of database `db` that matches `pattern` (every key with `None`),
/// read a page at a time at the keyspace's default level (each page is a state of the
/// log; together they are not one, as a `SCAN` is not in Redis).
pub(crate) fn keys_of(
    node: &KeyspaceHandle,
    db: u8,
    after: LogIndex,
    pattern: Option<Bytes>,
    scan_items_max: u32,
) -> impl Future<Output = Frame> + Send + 'static {
    let node = node.clone();
    async move {
        let (mut start, end) = match db {
            0 => (Bytes::new(), None),
            db => {
                let (start, end) = keel_types::db_range(db);
                (start, Some(end))
            }
        };
        let limit = KEYS_PAGE.min(scan_items_max);
        let mut found = Vec::new();
        loop {
            let scan = Command::Scan { start: start.clone(), end: end.clone(), limit };
            let submit = plain_submit(ClientId(1), RequestId(1), scan, None, after);
            let items = match node.send(submit).answer().await.and_then(|r| r.result) {
                Ok(CommandResult::Items { items }) => items,
                Ok(_) => return mismatched("keys"),
                Err(e) => return error_frame(&e),
            };
            let full = items.len() as u32 >= limit;
            for (key, _, _) in &items {
                let Some((_, name)) = keel_types::db_of(key) else { continue };
                if pattern.as_ref().is_none_or(|p| keel_wire::glob::matches(p, name)) {
                    found.push(Frame::Bulk(Bytes::copy_from_slice(name)));
                }
            }
            match items.last() {
                Some((last, _, _)) if full => {
                    let mut next = last.to_vec();
                    next.push(0);
                    start = next.into();
                }
                _ => return Frame::Array(found),
            }
        }
    }
}

/// `EXPIRE` and its kin, `PERSIST`: `1` if the expiry was set or cleared, else `0`.
fn expire_reply(reply: Result<ClientReply, KeelError>, _: bool) -> Frame {
    match reply.and_then(|r| r.result) {
        Ok(CommandResult::Cas { swapped, .. }) => Frame::Integer(i64::from(swapped)),
        Ok(_) => mismatched("expire"),
        Err(e) => error_frame(&e),
    }
}

/// `TTL` and its kin, against this node's wall clock (the time left is the leader's to
/// keep: the key stays until its expiry entry, which the leader appends at its time).
fn ttl_reply(reply: Result<ClientReply, KeelError>, form: TtlForm) -> Frame {
    match reply.and_then(|r| r.result) {
        Ok(CommandResult::Held { value, expires_at, .. }) => {
            Frame::Integer(form.answer(value.is_some(), expires_at, crate::driver::wall_ms()))
        }
        Ok(_) => mismatched("ttl"),
        Err(e) => error_frame(&e),
    }
}

fn exists_frame(values: &[Option<Value>]) -> Frame {
    Frame::Integer(values.iter().filter(|v| v.is_some()).count() as i64)
}
