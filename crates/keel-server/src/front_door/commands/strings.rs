//! The string family: `GET`, `MGET`, `SET`, `INCR`/`INCRBY`/`DECR`/`DECRBY`, `KEEL.FAA`
//! and `KEEL.CAS`, each mapped onto the engine's commands; their replies.
//!
//! Reply shapes of Keel's own forms:
//! - `GET k WITHVERSION` / `SET k v WITHVERSION`: `[reply, "epoch.index" | null]`;
//! - `KEEL.CAS`: `[swapped (1|0), current value | null, "epoch.index" | null]`;
//! - `KEEL.FAA`: the value before the addition.

use super::{mismatched, plain_submit, result_reply};
use crate::driver::{KeyspaceHandle, Submit};
use crate::front_door::conn::{Conn, Pending};
use crate::front_door::dispatch::Turn;
use bytes::Bytes;
use keel_core::engine::ClientReply;
use keel_types::{
    ClientId, Command, CommandResult, KeelError, Key, LogIndex, ReadLevel, RequestId, Value,
};
use keel_wire::command::{SetOptions, TransferForm};
use keel_wire::reply::{error_frame, value_frame, with_version_frame};
use keel_wire::resp::Frame;
use keel_wire::ClientCommand;
use std::future::Future;

/// Sends a string command its [`Turn`] has come for; a plain `GET` the node can answer at
/// once is answered here, off the engine loop.
pub(crate) fn send(conn: &mut Conn, command: ClientCommand, turn: Turn) -> Pending {
    let protocol = conn.protocol;
    match command {
        ClientCommand::Get { key, level, with_version, .. } => {
            let submit = Submit { level, ..turn.submit(Command::Get { key }) };
            if let Some(reply) = turn.loop_idle.then(|| conn.node.read_now(&submit)).flatten() {
                conn.last_looped = turn.looped_before;
                return Pending::ready(get_reply(Ok(reply), with_version), protocol);
            }
            let sent = conn.node.send(submit);
            Pending::engine(sent, (get_reply, with_version), protocol)
        }
        ClientCommand::MGet { keys, level } => {
            let subs = turn.per_key(conn, keys);
            let reply = values_reply(&conn.node, subs, level, turn.after, mget_frame);
            Pending::later(Box::pin(reply), protocol)
        }
        ClientCommand::Set { key, value, durability, options, .. } if options.get => {
            let ops = vec![string_check(&key), options.command(key, value)];
            let command = Command::Multi { ops, watch: Vec::new() };
            let sent = conn.node.send(Submit { durability, ..turn.submit(command) });
            noted(conn, sent, move |answer| match answer.and_then(|r| r.result) {
                Ok(CommandResult::Multi { results: Some(results) }) if results.len() == 2 => {
                    set_options_frame(&results[1], options)
                }
                Ok(_) => mismatched("set"),
                Err(e) => error_frame(&e),
            })
        }
        ClientCommand::Set { key, value, durability, with_version, options, .. } => {
            let command = options.command(key, value);
            let sent = conn.node.send(Submit { durability, ..turn.submit(command) });
            if options == SetOptions::PLAIN {
                return Pending::write(sent, (set_reply, with_version), protocol, conn.floor());
            }
            noted(conn, sent, move |answer| set_options_reply(answer, options))
        }
        ClientCommand::Modify { key, op, durability } => {
            let kind = ModifyReply::of(&op);
            let command = Command::Modify { key, op, now_ms: 0 };
            let sent = conn.node.send(Submit { durability, ..turn.submit(command) });
            noted(conn, sent, move |answer| modify_reply(answer, kind))
        }
        ClientCommand::Transfer { from, to, replace, remove_source, form, durability, .. } => {
            let command = Command::Transfer { from, to, replace, remove_source };
            let sent = conn.node.send(Submit { durability, ..turn.submit(command) });
            noted(conn, sent, move |answer| transfer_reply(answer, form))
        }
        ClientCommand::Lcs { a, b, form } => {
            let ops = vec![Command::Get { key: a }, Command::Get { key: b }];
            let sent = conn.node.send(turn.submit(Command::Multi { ops, watch: Vec::new() }));
            Pending::later(Box::pin(super::lcs::reply(sent, form)), protocol)
        }
        ClientCommand::ReadString { key, op, level } => {
            let sent = conn.node.send(Submit { level, ..turn.submit(Command::Get { key }) });
            let reply = async move {
                match sent.answer().await.and_then(|r| r.result) {
                    Ok(CommandResult::Value { value, .. }) => op.answer(value.as_deref()),
                    Ok(_) => mismatched("get"),
                    Err(e) => error_frame(&e),
                }
            };
            Pending::later(Box::pin(reply), protocol)
        }
        ClientCommand::MSet { pairs, only_new: true } => {
            let attempts: Vec<_> = match turn.named {
                // A pair the client named is one request: one attempt under it.
                true => vec![turn.pair],
                false => std::iter::once(turn.pair)
                    .chain((1..MSETNX_ATTEMPTS).map(|_| conn.next_pair()))
                    .collect(),
            };
            let reply = msetnx(conn.node.clone(), pairs, attempts, turn, conn.floor());
            Pending::later(Box::pin(reply), protocol)
        }
        ClientCommand::MSet { pairs, only_new: false } => {
            let ops = pairs.into_iter().map(|(key, value)| Command::Put { key, value }).collect();
            let sent = conn.node.send(turn.submit(Command::Multi { ops, watch: Vec::new() }));
            Pending::write(sent, (mset_reply, false), protocol, conn.floor())
        }
        ClientCommand::Incr { key, delta, fetch: false } => {
            let sent = conn.node.send(turn.submit(Command::Incr { key, delta }));
            Pending::write(sent, (result_reply, false), protocol, conn.floor())
        }
        ClientCommand::Incr { key, delta, fetch: true } => {
            let sent = conn.node.send(turn.submit(Command::Incr { key, delta }));
            noted(conn, sent, move |answer| faa_reply(answer, delta))
        }
        ClientCommand::Cas { key, expected, new, durability, .. } => {
            let command = Command::Cas { key, expected, new };
            let sent = conn.node.send(Submit { durability, ..turn.submit(command) });
            Pending::write(sent, (result_reply, false), protocol, conn.floor())
        }
        other => unreachable!("{} is not a string command", other.name()),
    }
}

/// Attempts of one `MSETNX` whose keys another write changed between its reads and its
/// transaction, before it gives up.
const MSETNX_ATTEMPTS: usize = 8;

/// `MSETNX`: reads each key's version at `linearizable`; if one holds a value, `0`;
/// otherwise the writes as one transaction watching those versions, `1` once applied.
/// A transaction a concurrent write aborted starts over under the next pair, so the
/// reply is linearized at the reads (`0`) or at the transaction (`1`), as Redis's.
async fn msetnx(
    node: KeyspaceHandle,
    pairs: Vec<(Key, Value)>,
    attempts: Vec<(ClientId, RequestId)>,
    turn: Turn,
    floor: crate::front_door::conn::Floor,
) -> Frame {
    let level = Some(ReadLevel::Linearizable);
    let ops: Vec<Command> = pairs
        .iter()
        .map(|(key, value)| Command::Put { key: key.clone(), value: value.clone() })
        .collect();
    for (client, request) in attempts {
        let mut watch = Vec::with_capacity(pairs.len());
        let reads: Vec<_> = pairs
            .iter()
            .map(|(key, _)| {
                let (read_client, read_request) = (ClientId(1), RequestId(1));
                let submit = get_submit(read_client, read_request, key.clone(), level, turn.after);
                (key.clone(), node.send(submit))
            })
            .collect();
        for (key, read) in reads {
            match read.answer().await.and_then(|r| r.result) {
                Ok(CommandResult::Value { value: Some(_), .. }) => return Frame::Integer(0),
                Ok(CommandResult::Value { value: None, version }) => watch.push((key, version)),
                Ok(_) => return mismatched("get"),
                Err(e) => return error_frame(&e),
            }
        }
        let command = Command::Multi { ops: ops.clone(), watch };
        let submit = Submit { client, request, ..turn.submit(command) };
        let answer = node.send(submit).answer().await;
        floor.note(&answer);
        match answer.and_then(|r| r.result) {
            Ok(CommandResult::Multi { results: Some(_) }) => return Frame::Integer(1),
            Ok(CommandResult::Multi { results: None }) => continue,
            Ok(_) => return mismatched("msetnx"),
            Err(e) => return error_frame(&e),
        }
    }
    Frame::error("TRYAGAIN MSETNX: other writes kept changing its keys; retry it")
}

/// `RENAME`: `+OK`; `RENAMENX`, `COPY`, `MOVE`: `1` or `0`, and `MOVE` of an absent key
/// `0` (a rename's "no such key" error).
fn transfer_reply(reply: Result<ClientReply, KeelError>, form: TransferForm) -> Frame {
    transfer_frame(reply.and_then(|r| r.result), form)
}

/// [`transfer_reply`] from the result alone.
pub(crate) fn transfer_frame(
    result: Result<CommandResult, KeelError>,
    form: TransferForm,
) -> Frame {
    match (result, form) {
        (Err(KeelError::InvalidArgument(why)), TransferForm::Move) if why == "no such key" => {
            Frame::Integer(0)
        }
        (result, TransferForm::Rename) => modify_frame(result, ModifyReply::Ok),
        (result, _) => modify_frame(result, ModifyReply::Number),
    }
}

/// A write's reply made by `frame` from its answer, once the connection's session floor
/// has noted it (for replies that need more than a [`Pending::write`] finisher carries).
fn noted(
    conn: &Conn,
    sent: crate::driver::Sent,
    frame: impl FnOnce(Result<ClientReply, KeelError>) -> Frame + Send + 'static,
) -> Pending {
    let floor = conn.floor();
    let reply = async move {
        let answer = sent.answer().await;
        floor.note(&answer);
        frame(answer)
    };
    Pending::later(Box::pin(reply), conn.protocol)
}

/// A plain get of `key` at `level` (reads never enter the deduplication table).
pub(crate) fn get_submit(
    client: ClientId,
    request: RequestId,
    key: Bytes,
    level: Option<ReadLevel>,
    after: LogIndex,
) -> Submit {
    plain_submit(client, request, Command::Get { key }, level, after)
}

/// `KEEL.FAA`: the value before the addition (the engine answers the value after it).
fn faa_reply(reply: Result<ClientReply, KeelError>, delta: i64) -> Frame {
    match reply.and_then(|r| r.result) {
        Ok(CommandResult::Counter { value, .. }) => match value.checked_sub(delta) {
            Some(before) => Frame::Integer(before),
            None => mismatched("fetch-and-add"),
        },
        Ok(_) => mismatched("fetch-and-add"),
        Err(e) => error_frame(&e),
    }
}

/// Sends a get per key at once; the values in key order, or the first error.
fn values(
    node: &KeyspaceHandle,
    keys: Vec<(ClientId, RequestId, Bytes)>,
    level: Option<ReadLevel>,
    after: LogIndex,
) -> impl Future<Output = Result<Vec<Option<Bytes>>, KeelError>> + Send + 'static {
    let sent: Vec<_> = keys
        .into_iter()
        .map(|(client, request, key)| node.send(get_submit(client, request, key, level, after)))
        .collect();
    async move {
        let mut values = Vec::with_capacity(sent.len());
        for one in sent {
            let result = match one.answer().await.and_then(|r| r.result) {
                // A key holding a collection is no string: `MGET` answers null for it.
                Err(KeelError::WrongType) => CommandResult::Value { value: None, version: None },
                other => other?,
            };
            match result {
                CommandResult::Value { value, .. } => values.push(value),
                // A reply of another kind (a peer's forwarded answer that breaks the
                // protocol) is refused, not trusted.
                other => {
                    let kind = format!("a get was answered with {other:?}");
                    return Err(KeelError::Unavailable(kind));
                }
            }
        }
        Ok(values)
    }
}

/// `EXISTS` and `MGET`: a get per key, sent at once, and `frame` of their values.
pub(crate) fn values_reply(
    node: &KeyspaceHandle,
    keys: Vec<(ClientId, RequestId, Bytes)>,
    level: Option<ReadLevel>,
    after: LogIndex,
    frame: fn(&[Option<Value>]) -> Frame,
) -> impl Future<Output = Frame> + Send + 'static {
    let values = values(node, keys, level, after);
    async move {
        match values.await {
            Ok(values) => frame(&values),
            Err(e) => error_frame(&e),
        }
    }
}

fn mget_frame(values: &[Option<Value>]) -> Frame {
    Frame::Array(values.iter().map(|v| value_frame(v.as_ref())).collect())
}

fn get_reply(reply: Result<ClientReply, KeelError>, with_version: bool) -> Frame {
    match reply.and_then(|r| r.result) {
        Ok(CommandResult::Value { value, version }) => {
            let frame = value_frame(value.as_ref());
            if with_version {
                with_version_frame(frame, version)
            } else {
                frame
            }
        }
        Ok(_) => mismatched("get"),
        Err(e) => error_frame(&e),
    }
}

/// `SET` with Redis's options: `+OK`, or null when `NX`/`XX` kept it from writing; with
/// `GET`, the value before; `SETNX`: `1` or `0`.
fn set_options_reply(reply: Result<ClientReply, KeelError>, options: SetOptions) -> Frame {
    match reply.and_then(|r| r.result) {
        Ok(result) => set_options_frame(&result, options),
        Err(e) => error_frame(&e),
    }
}

/// What goes before a `SET ... GET` in its entry: a `GETEX` that changes nothing, and
/// fails the entry (`WRONGTYPE`, nothing written) if the key holds a collection, as Redis
/// refuses `SET ... GET` and `GETSET` of one. (A `GET` inside a transaction reads a
/// collection as null instead, as `MGET` does.)
pub(crate) fn string_check(key: &Key) -> Command {
    Command::Modify {
        key: key.clone(),
        op: keel_types::Modify::GetEx(keel_types::Ttl::Keep),
        now_ms: 0,
    }
}

/// [`set_options_reply`] of the `SET`'s result.
pub(crate) fn set_options_frame(result: &CommandResult, options: SetOptions) -> Frame {
    match result {
        CommandResult::Cas { swapped, current, .. } => match options {
            SetOptions { integer_reply: true, .. } => Frame::Integer(i64::from(*swapped)),
            SetOptions { get: true, .. } => value_frame(current.as_ref()),
            _ if *swapped => Frame::ok(),
            _ => Frame::Null,
        },
        _ => mismatched("set"),
    }
}

/// How an in-place change or a transfer answers.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ModifyReply {
    /// `APPEND`, `SETRANGE`, `SETBIT`, `RENAMENX`, `COPY`, `MOVE`: the number.
    Number,
    /// `INCRBYFLOAT`, `GETDEL`, `GETEX`: the value, or null.
    Value,
    /// `RENAME`: `+OK`.
    Ok,
}

impl ModifyReply {
    pub(crate) fn of(op: &keel_types::Modify) -> ModifyReply {
        use keel_types::Modify;
        match op {
            Modify::IncrByFloat(_) | Modify::GetDel | Modify::GetEx(_) => ModifyReply::Value,
            Modify::Append(_) | Modify::SetRange { .. } | Modify::SetBit { .. } => {
                ModifyReply::Number
            }
        }
    }
}

fn modify_reply(reply: Result<ClientReply, KeelError>, kind: ModifyReply) -> Frame {
    modify_frame(reply.and_then(|r| r.result), kind)
}

/// [`modify_reply`] from the result alone.
pub(crate) fn modify_frame(result: Result<CommandResult, KeelError>, kind: ModifyReply) -> Frame {
    match (result, kind) {
        (Ok(CommandResult::Modified { number, .. }), ModifyReply::Number) => Frame::Integer(number),
        (Ok(CommandResult::Modified { value, .. }), ModifyReply::Value) => {
            value_frame(value.as_ref())
        }
        (Ok(CommandResult::Modified { .. }), ModifyReply::Ok) => Frame::ok(),
        (Ok(_), _) => mismatched("modify"),
        (Err(KeelError::InvalidArgument(why)), _) => Frame::error(&format!("ERR {why}")),
        (Err(e), _) => error_frame(&e),
    }
}

/// `MSET`: `OK` once its transaction applied.
fn mset_reply(reply: Result<ClientReply, KeelError>, _: bool) -> Frame {
    match reply.and_then(|r| r.result) {
        Ok(CommandResult::Multi { results: Some(_) }) => Frame::ok(),
        Ok(_) => mismatched("mset"),
        Err(e) => error_frame(&e),
    }
}

fn set_reply(reply: Result<ClientReply, KeelError>, with_version: bool) -> Frame {
    match reply.and_then(|r| r.result) {
        Ok(CommandResult::Written { version }) => {
            if with_version {
                with_version_frame(Frame::ok(), Some(version))
            } else {
                Frame::ok()
            }
        }
        Ok(_) => mismatched("put"),
        Err(e) => error_frame(&e),
    }
}
