//! Transactions: `MULTI` ... `EXEC` as one log entry, `DISCARD`, `WATCH`, `UNWATCH`,
//! and `KEEL.REQ <client> <seq> EXEC` inside `MULTI` (`sessions`).
//!
//! The queued commands become one [`Command::Multi`] whose operations apply in order, all
//! or none, and not at all if a key `WATCH` read has another version by then. The
//! commands that read and write keys are queued (the string family, `DEL`, `EXISTS`, the
//! expiry commands, the transfers, `KEEL.CAS`), at most [`keel_types::MULTI_OPS_MAX`] and
//! [`queued_bytes_max`] bytes, besides `PING`, `ECHO`, `UNWATCH` and the node's `TIME` and
//! `CONFIG` (answered at `EXEC`); a refused one discards the transaction at `EXEC`
//! (`EXECABORT`, as Redis). With keys watched and no operation queued, `EXEC` still sends
//! the watch to the engine, which answers whether a key changed.

use super::acl::permitted;
use super::mismatched;
use super::plain_submit;
use super::sessions::req_pair;
use super::strings::{modify_frame, transfer_frame, ModifyReply};
use crate::acl::{category, Category};
use crate::driver::{Sent, Submit};
use crate::front_door::conn::{Conn, Floor, Kind, Pending};
use bytes::Bytes;
use keel_core::engine::OpMode;
use keel_types::coll::{Answer, CollRead};
use keel_types::{
    ClientId, Command, CommandResult, Durability, KeelError, Key, KeyspaceId, ReadLevel, RequestId,
    Version,
};
use keel_wire::command::{LcsForm, StringRead, TransferForm};
use keel_wire::reply::{error_frame, value_frame};
use keel_wire::resp::Frame;
use keel_wire::ClientCommand;

/// The commands queued since `MULTI`, and whether one was refused (then `EXEC` aborts, as
/// Redis's `EXECABORT`).
#[derive(Debug, Default)]
pub(crate) struct Transaction {
    commands: Vec<ClientCommand>,
    /// The queued commands' words, in bytes: at most one log entry's worth
    /// ([`queued_bytes_max`]), so a queue cannot hold more than `EXEC` could send.
    bytes: u64,
    refused: bool,
    /// The keyspace its commands with keys run in (a sharded cluster routes each by its
    /// keys' slot; one transaction is one entry of one keyspace's log).
    keyspace: Option<KeyspaceId>,
}

/// The keyspace the transaction being queued runs in, once a command with keys (or a
/// key it watches) fixed it; `None` outside `MULTI`.
pub(crate) fn transaction_keyspace(conn: &Conn) -> Option<KeyspaceId> {
    let tx = conn.transaction.as_ref()?;
    let watched = conn.watched.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    tx.keyspace.or(watched.keyspace)
}

/// Fixes the keyspace of the transaction being queued, if any, to `keyspace`.
pub(crate) fn fix_keyspace(conn: &mut Conn, keyspace: KeyspaceId) {
    if let Some(tx) = conn.transaction.as_mut() {
        tx.keyspace = Some(keyspace);
    }
}

/// Discards the transaction the connection is queueing, if any, at its `EXEC`
/// (`EXECABORT`): a command of it was refused.
pub(crate) fn refuse(conn: &mut Conn) {
    if let Some(tx) = conn.transaction.as_mut() {
        tx.refused = true;
    }
}

/// Most bytes of words one transaction may queue: what one entry may carry (the largest
/// value) and room for the commands' names and options.
fn queued_bytes_max(conn: &Conn) -> u64 {
    u64::from(conn.limits.value_bytes_max) + 64 * 1024
}

/// Commands Redis never queues (`ERR Command not allowed inside a transaction`).
const NOT_IN_TRANSACTIONS: &[&str] =
    &["save", "shutdown", "monitor", "sync", "psync", "replconf", "failover", "reset"];

/// The keys `WATCH` read and the versions it found; `failed` when a read failed (then
/// `EXEC` aborts, since nothing says the keys are unchanged).
#[derive(Debug, Default)]
pub(crate) struct Watched {
    keyspace: Option<KeyspaceId>,
    keys: Vec<(Key, Option<Version>)>,
    failed: bool,
}

/// `MULTI` ... `EXEC` as one log entry. `Err(words)`: the request is not a transaction's
/// concern.
pub(crate) async fn transaction(conn: &mut Conn, words: Vec<Bytes>) -> Result<Pending, Vec<Bytes>> {
    if conn.transaction.is_some() {
        return Ok(inside(conn, words).await);
    }
    let protocol = conn.protocol;
    let first = words.first().map_or(&[][..], |w| &w[..]);
    let is = |word: &str| first.eq_ignore_ascii_case(word.as_bytes());
    let ready = |frame: Frame| Ok(Pending::ready(frame, protocol));
    if is("multi") {
        conn.transaction = Some(Transaction::default());
        return ready(Frame::ok());
    }
    if is("exec") {
        return ready(Frame::error("ERR EXEC without MULTI"));
    }
    if is("discard") {
        return ready(Frame::error("ERR DISCARD without MULTI"));
    }
    if is("unwatch") {
        unwatch(conn);
        return ready(Frame::ok());
    }
    if is("watch") {
        return Ok(watch(conn, words).await);
    }
    Err(words)
}

/// A request inside `MULTI`: `EXEC` (or `KEEL.REQ <client> <seq> EXEC`) sends the
/// transaction, `DISCARD` drops it, anything else is queued or refused.
async fn inside(conn: &mut Conn, words: Vec<Bytes>) -> Pending {
    let protocol = conn.protocol;
    let first = words.first().map_or(&[][..], |w| &w[..]);
    let is = |word: &str| first.eq_ignore_ascii_case(word.as_bytes());
    let ready = |frame: Frame| Pending::ready(frame, protocol);
    if is("exec") {
        if words.len() != 1 {
            return ready(Frame::error("ERR wrong number of arguments for 'exec' command"));
        }
        let queued = conn.transaction.take().expect("inside MULTI");
        return exec(conn, queued, None).await;
    }
    // `KEEL.REQ <client> <seq> EXEC`: the transaction under a pair the client chose, so
    // that a retry (on a new connection, after a timeout) is applied once.
    if is("keel.req") && words.len() == 4 && words[3].eq_ignore_ascii_case(b"exec") {
        let pair = match req_pair(conn, &words) {
            Ok(pair) => pair,
            Err(refusal) => return ready(refusal),
        };
        let queued = conn.transaction.take().expect("inside MULTI");
        return exec(conn, queued, Some(pair)).await;
    }
    if is("discard") {
        conn.transaction = None;
        unwatch(conn);
        return ready(Frame::ok());
    }
    if is("multi") {
        return ready(Frame::error("ERR MULTI calls can not be nested"));
    }
    if is("watch") {
        return ready(Frame::error("ERR WATCH inside MULTI is not allowed"));
    }
    let bytes: u64 = words.iter().map(|w| w.len() as u64).sum();
    let max = queued_bytes_max(conn);
    let fits = conn.transaction.as_ref().is_some_and(|tx| tx.bytes + bytes <= max);
    let queued = match fits {
        true => queueable(conn, words),
        false => Err(Frame::error(&format!("ERR a transaction holds at most {max} bytes"))),
    };
    let tx = conn.transaction.as_mut().expect("inside MULTI");
    match queued {
        Ok(command) => {
            tx.bytes += bytes;
            tx.commands.push(command);
            ready(Frame::Simple(b"QUEUED".to_vec()))
        }
        Err(refusal) => {
            tx.refused = true;
            ready(refusal)
        }
    }
}

/// The command `words` parse to if the transaction may queue it; the refusal, which
/// discards the transaction at `EXEC`.
fn queueable(conn: &Conn, words: Vec<Bytes>) -> Result<ClientCommand, Frame> {
    let first = words.first().map_or(&[][..], |w| &w[..]);
    let name = String::from_utf8_lossy(first).to_ascii_uppercase();
    if NOT_IN_TRANSACTIONS.iter().any(|n| first.eq_ignore_ascii_case(n.as_bytes())) {
        return Err(Frame::error("ERR Command not allowed inside a transaction"));
    }
    let command = keel_wire::command::parse(words, &conn.limits).map_err(|e| e.reply_frame())?;
    let command = super::databases::in_database(command, conn)?;
    if !transactable(&command) {
        let text = format!(
            "ERR {name} is not allowed inside MULTI (Keel's transactions read and write keys)"
        );
        return Err(Frame::error(&text));
    }
    permitted(conn, category(&command))?;
    let tx = conn.transaction.as_ref().expect("inside MULTI");
    if tx.commands.len() >= keel_types::MULTI_OPS_MAX {
        // One log entry holds at most this many operations; a longer queue is refused
        // here, not grown without bound until `EXEC`.
        let max = keel_types::MULTI_OPS_MAX;
        return Err(Frame::error(&format!("ERR a transaction holds at most {max} commands")));
    }
    Ok(command)
}

/// Whether a transaction may hold `command` (and a script run it): the commands that
/// read and write keys, and the few the node answers itself.
pub(crate) fn transactable(command: &ClientCommand) -> bool {
    matches!(
        command,
        ClientCommand::Get { .. }
            | ClientCommand::MGet { .. }
            | ClientCommand::Exists { .. }
            | ClientCommand::Set { .. }
            | ClientCommand::MSet { only_new: false, .. }
            | ClientCommand::Del { .. }
            | ClientCommand::Incr { fetch: false, .. }
            | ClientCommand::Cas { .. }
            | ClientCommand::Expire { .. }
            | ClientCommand::Modify { .. }
            | ClientCommand::Transfer { .. }
            | ClientCommand::ReadString { .. }
            | ClientCommand::Lcs { .. }
            | ClientCommand::Ping { .. }
            | ClientCommand::Echo { .. }
            | ClientCommand::Unwatch
            | ClientCommand::Time
            | ClientCommand::ConfigGet { .. }
            | ClientCommand::ConfigSet { .. }
            | ClientCommand::Coll { .. }
            | ClientCommand::CollRead { .. }
            | ClientCommand::Block { .. }
    ) && command.mode() == OpMode::Plain
}

impl Transaction {
    /// Marks the transaction refused: its `EXEC` discards it (`EXECABORT`).
    pub(crate) fn refuse(&mut self) {
        self.refused = true;
    }
}

fn unwatch(conn: &mut Conn) {
    *conn.watched.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Watched::default();
}

/// `WATCH key [key ...]`: reads each key's version at `linearizable` (the leader's latest),
/// for `EXEC` to compare. The versions are recorded when the reads are answered, which
/// `EXEC` (a write) waits for.
async fn watch(conn: &mut Conn, words: Vec<Bytes>) -> Pending {
    let protocol = conn.protocol;
    if words.len() < 2 {
        return Pending::ready(
            Frame::error("ERR wrong number of arguments for 'watch' command"),
            protocol,
        );
    }
    if let Err(refusal) = permitted(conn, Some(Category::Read)) {
        return Pending::ready(refusal, protocol);
    }
    let ks = conn.node.id;
    let level = Some(ReadLevel::Linearizable);
    conn.order_through_loop(Kind::Read(ks, level)).await;
    let after = conn.resolved.floor(ks);
    let db = conn.db;
    let keys: Vec<Bytes> =
        words.into_iter().skip(1).map(|key| keel_types::db_key(db, &key)).collect();
    let sent: Vec<_> = keys
        .iter()
        .map(|key| {
            let (client, request) = conn.next_pair();
            // An inspection reads the version of a key of any type (`GET` of a
            // collection answers `WRONGTYPE`).
            let command = Command::Inspect { key: key.clone() };
            (key.clone(), conn.node.send(plain_submit(client, request, command, level, after)))
        })
        .collect();
    let watched = conn.watched.clone();
    Pending::later(
        Box::pin(async move {
            let mut found = Vec::with_capacity(sent.len());
            let mut failed = None;
            for (key, one) in sent {
                match one.answer().await.and_then(|r| r.result) {
                    Ok(CommandResult::Held { version, .. }) => found.push((key, version)),
                    Ok(_) => {
                        failed = Some(KeelError::Unavailable("a watch read another kind".into()))
                    }
                    Err(e) => failed = Some(e),
                }
            }
            let mut watched = watched.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if watched.keyspace.is_some_and(|other| other != ks) {
                watched.failed = true; // keys of two keyspaces: no transaction can hold both
            }
            watched.keyspace = Some(ks);
            watched.keys.extend(found);
            match failed {
                Some(e) => {
                    watched.failed = true;
                    error_frame(&e)
                }
                None => Frame::ok(),
            }
        }),
        protocol,
    )
}

/// How one queued command's reply is made from its operations' results.
#[derive(Clone, Debug)]
pub(crate) enum Shape {
    /// `PING`, `ECHO`, `UNWATCH`: a reply of their own, with no operation.
    Reply(Frame),
    /// `TIME`, `CONFIG GET`, `CONFIG SET`: answered by the node at `EXEC` (never when
    /// queued: a `DISCARD` must leave no setting changed), with no operation.
    Deferred(ClientCommand),
    /// `APPEND`, `SETRANGE`, `SETBIT`, `INCRBYFLOAT`, `GETDEL`, `GETEX`.
    Modify(ModifyReply),
    /// `RENAME`, `RENAMENX`, `COPY`, `MOVE`.
    Transfer(TransferForm),
    /// `STRLEN`, `GETRANGE`, `GETBIT`, `BITCOUNT`, `BITPOS`, `TYPE`, `OBJECT`: computed
    /// from a get.
    ReadString(StringRead),
    /// `LCS`: computed from two gets.
    Lcs(LcsForm),
    /// `MSET` of `n` keys: `OK`.
    MSet(usize),
    /// `SET` with Redis's options: `OK` or null, the value before (`GET`), `1`/`0`
    /// (`SETNX`).
    SetWith(keel_wire::command::SetOptions),
    /// `EXPIRE` and its kin: `1` if set.
    Expire,
    /// `GET`: the value (with its version if asked).
    Value { with_version: bool },
    /// `SET`: `OK` (with the version if asked).
    Written { with_version: bool },
    /// `INCR`: the integer.
    Counter,
    /// `KEEL.CAS`: `[swapped, current, version]`.
    Cas,
    /// `DEL` of `n` keys (a read and a delete each): how many existed.
    Del(usize),
    /// `EXISTS` of `n` keys: how many exist.
    Exists(usize),
    /// `MGET` of `n` keys: their values.
    MGet(usize),
    /// A collection command (a blocking pop does not block inside a transaction, as in
    /// Redis): its answer, reshaped.
    Coll(keel_wire::command::Reshape),
}

impl Shape {
    /// A queued command's operations, appended to `ops`; its shape and the durability it
    /// asked for.
    pub(crate) fn of(
        command: ClientCommand,
        ops: &mut Vec<Command>,
    ) -> (Shape, Option<Durability>) {
        match command {
            ClientCommand::Get { key, with_version, .. } => {
                ops.push(Command::Get { key });
                (Shape::Value { with_version }, None)
            }
            ClientCommand::Set { key, value, durability, with_version, options, .. } => {
                if options.get {
                    // As outside a transaction: a collection there fails it (`WRONGTYPE`).
                    ops.push(super::strings::string_check(&key));
                }
                ops.push(options.command(key, value));
                match options == keel_wire::command::SetOptions::PLAIN {
                    true => (Shape::Written { with_version }, durability),
                    false => (Shape::SetWith(options), durability),
                }
            }
            ClientCommand::Expire { key, ttl, cond, durability } => {
                ops.push(Command::Expire { key, ttl, cond, now_ms: 0 });
                (Shape::Expire, durability)
            }
            ClientCommand::Ping { message: None } => {
                (Shape::Reply(Frame::Simple(b"PONG".to_vec())), None)
            }
            ClientCommand::Ping { message: Some(message) } | ClientCommand::Echo { message } => {
                (Shape::Reply(Frame::Bulk(message)), None)
            }
            ClientCommand::Unwatch => (Shape::Reply(Frame::ok()), None),
            command @ (ClientCommand::Time
            | ClientCommand::ConfigGet { .. }
            | ClientCommand::ConfigSet { .. }) => (Shape::Deferred(command), None),
            ClientCommand::Modify { key, op, durability } => {
                let kind = ModifyReply::of(&op);
                ops.push(Command::Modify { key, op, now_ms: 0 });
                (Shape::Modify(kind), durability)
            }
            ClientCommand::Transfer {
                from, to, replace, remove_source, form, durability, ..
            } => {
                ops.push(Command::Transfer { from, to, replace, remove_source });
                (Shape::Transfer(form), durability)
            }
            // A level has no meaning inside a transaction: it reads the entry's state.
            ClientCommand::ReadString { key, op, .. } => {
                ops.push(Command::Get { key });
                (Shape::ReadString(op), None)
            }
            ClientCommand::Lcs { a, b, form } => {
                ops.extend([Command::Get { key: a }, Command::Get { key: b }]);
                (Shape::Lcs(form), None)
            }
            ClientCommand::MSet { pairs, .. } => {
                let n = pairs.len();
                ops.extend(pairs.into_iter().map(|(key, value)| Command::Put { key, value }));
                (Shape::MSet(n), None)
            }
            ClientCommand::Incr { key, delta, .. } => {
                ops.push(Command::Incr { key, delta });
                (Shape::Counter, None)
            }
            ClientCommand::Cas { key, expected, new, durability, .. } => {
                ops.push(Command::Cas { key, expected, new });
                (Shape::Cas, durability)
            }
            ClientCommand::Del { keys } => {
                let n = keys.len();
                for key in keys {
                    ops.push(Command::CollRead { key: key.clone(), op: Box::new(CollRead::Type) });
                    ops.push(Command::Delete { key });
                }
                (Shape::Del(n), None)
            }
            ClientCommand::Exists { keys } => {
                let n = keys.len();
                let op = || Box::new(CollRead::Type);
                ops.extend(keys.into_iter().map(|key| Command::CollRead { key, op: op() }));
                (Shape::Exists(n), None)
            }
            ClientCommand::MGet { keys, .. } => {
                let n = keys.len();
                ops.extend(keys.into_iter().map(|key| Command::Get { key }));
                (Shape::MGet(n), None)
            }
            ClientCommand::Coll { key, op, durability, reshape, .. } => {
                ops.push(Command::Coll { key, op });
                (Shape::Coll(reshape), durability)
            }
            ClientCommand::Block { key, op, durability, reshape, .. } => {
                ops.push(Command::Coll { key, op });
                (Shape::Coll(reshape), durability)
            }
            ClientCommand::CollRead { key, op, reshape, .. } => {
                ops.push(Command::CollRead { key, op });
                (Shape::Coll(reshape), None)
            }
            other => unreachable!("refused when queued: {other:?}"),
        }
    }

    /// How many operations the command took.
    fn ops(&self) -> usize {
        match self {
            Shape::Del(n) => 2 * n,
            Shape::SetWith(options) if options.get => 2,
            Shape::Exists(n) | Shape::MGet(n) | Shape::MSet(n) => *n,
            Shape::Lcs(_) => 2,
            Shape::Reply(_) | Shape::Deferred(_) => 0,
            _ => 1,
        }
    }

    /// The command's reply from its operations' results.
    pub(crate) fn frame(self, results: &[CommandResult]) -> Frame {
        let present = |r: &CommandResult| matches!(r, CommandResult::Answer { answer: Answer::Status(name), .. } if name != "none");
        let value = |r: &CommandResult| match r {
            CommandResult::Value { value, .. } => value.clone(),
            _ => None,
        };
        match self {
            Shape::Reply(frame) => frame,
            Shape::Deferred(command) => unreachable!("answered at EXEC: {}", command.name()),
            Shape::Modify(kind) => modify_frame(Ok(results[0].clone()), kind),
            Shape::Transfer(form) => transfer_frame(Ok(results[0].clone()), form),
            Shape::ReadString(op) => op.answer(value(&results[0]).as_deref()),
            Shape::Lcs(form) => {
                let (a, b) = (value(&results[0]), value(&results[1]));
                super::lcs::lcs_frame(&a.unwrap_or_default(), &b.unwrap_or_default(), form)
            }
            Shape::MSet(_) => Frame::ok(),
            Shape::SetWith(options) => {
                let set = if options.get { &results[1] } else { &results[0] };
                super::strings::set_options_frame(set, options)
            }
            Shape::Expire => match &results[0] {
                CommandResult::Cas { swapped, .. } => Frame::Integer(i64::from(*swapped)),
                _ => mismatched("expire"),
            },
            Shape::Value { with_version } | Shape::Written { with_version } => {
                keel_wire::reply::result_frame(&results[0], with_version)
            }
            Shape::Counter | Shape::Cas => keel_wire::reply::result_frame(&results[0], false),
            Shape::Del(_) => {
                Frame::Integer(results.iter().step_by(2).filter(|r| present(r)).count() as i64)
            }
            Shape::Exists(_) => {
                Frame::Integer(results.iter().filter(|r| present(r)).count() as i64)
            }
            Shape::Coll(reshape) => {
                super::collections::reshaped(results[0].clone(), &reshape, false)
            }
            Shape::MGet(_) => {
                Frame::Array(results.iter().map(|r| value_frame(value(r).as_ref())).collect())
            }
        }
    }
}

/// What `EXEC` answers without the engine, if anything: a transaction refused while
/// queuing, a queued command the connection's user may no longer run (`AUTH` inside
/// `MULTI` switches users at once), a watch that failed or spans keyspaces (as if a
/// watched key changed), or nothing queued.
fn exec_answered_here(conn: &Conn, queued: &Transaction, watched: &Watched) -> Option<Frame> {
    if queued.refused {
        let text = "EXECABORT Transaction discarded because of previous errors.";
        return Some(Frame::error(text));
    }
    for command in &queued.commands {
        if let Err(refusal) = permitted(conn, category(command)) {
            return Some(refusal);
        }
    }
    if watched.failed || watched.keyspace.is_some_and(|other| other != conn.node.id) {
        return Some(Frame::NullArray);
    }
    queued.commands.is_empty().then(|| Frame::Array(Vec::new()))
}

/// `EXEC`: the queued commands as one transaction, sent as one write with the strongest
/// durability any of them asked for, under the connection's next pair or (`KEEL.REQ
/// <client> <seq> EXEC`) the one the client named: its retry with the same pair and the
/// same commands, wherever it is sent, is answered with the first attempt's result and
/// not applied again (the engine's deduplication compares a transaction's operations,
/// not what its `WATCH` read).
async fn exec(
    conn: &mut Conn,
    queued: Transaction,
    pair: Option<(ClientId, RequestId)>,
) -> Pending {
    let protocol = conn.protocol;
    let ks = conn.node.id;
    // After the watch reads: `EXEC` is a write, so `order` waits for them.
    conn.order_through_loop(Kind::Write(ks)).await;
    let watched = std::mem::take(
        &mut *conn.watched.lock().unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    if let Some(answer) = exec_answered_here(conn, &queued, &watched) {
        return Pending::ready(answer, protocol);
    }
    let (ops, shapes, durability) = exec_ops(queued.commands);
    let shapes: Vec<Shape> = shapes
        .into_iter()
        .map(|shape| match shape {
            Shape::Deferred(command) => Shape::Reply(deferred_frame(conn, command)),
            other => other,
        })
        .collect();
    if ops.is_empty() && watched.keys.is_empty() {
        // Only replies of their own (`PING`, `ECHO`, `CONFIG`, ...) and nothing watched:
        // nothing for the engine. With keys watched, the engine checks them (and writes
        // nothing).
        let frames = shapes.into_iter().map(|shape| shape.frame(&[])).collect();
        return Pending::ready(Frame::Array(frames), protocol);
    }
    let command = Command::Multi { ops, watch: watched.keys };
    if let Err(e) = command.validate(&conn.limits) {
        return Pending::ready(error_frame(&e), protocol);
    }
    let named = pair.is_some();
    let (client, request) = pair.unwrap_or_else(|| conn.next_pair());
    let after = conn.resolved.floor(ks);
    let mode = OpMode::Plain;
    let submit = Submit { client, request, command, durability, level: None, after, mode, named };
    let sent = conn.node.send(submit);
    Pending::later(Box::pin(exec_reply(sent, conn.floor(), shapes)), protocol)
}

/// A node command queued in the transaction, answered now (at `EXEC`).
fn deferred_frame(conn: &Conn, command: ClientCommand) -> Frame {
    match command {
        ClientCommand::Time => super::server::time_frame(),
        ClientCommand::ConfigGet { parameters } => super::settings::get(conn, &parameters),
        ClientCommand::ConfigSet { pairs } => super::settings::set(conn, pairs),
        other => unreachable!("{} is not deferred", other.name()),
    }
}

/// The queued commands' operations, in order, how each command's reply is made from
/// them, and the strongest durability any of them asked for.
fn exec_ops(commands: Vec<ClientCommand>) -> (Vec<Command>, Vec<Shape>, Option<Durability>) {
    let mut ops = Vec::new();
    let mut shapes = Vec::with_capacity(commands.len());
    let mut durability: Option<Durability> = None;
    for command in commands {
        let (shape, asked) = Shape::of(command, &mut ops);
        durability = match (durability, asked) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        shapes.push(shape);
    }
    (ops, shapes, durability)
}

/// `EXEC`'s reply: each command's reply from its operations' results, or a null array
/// when a watched key changed.
async fn exec_reply(sent: Sent, floor: Floor, shapes: Vec<Shape>) -> Frame {
    let answer = sent.answer().await;
    floor.note(&answer);
    match answer.and_then(|r| r.result) {
        Ok(CommandResult::Multi { results: Some(results) }) => {
            let mut frames = Vec::with_capacity(shapes.len());
            let mut at = 0;
            for shape in shapes {
                let n = shape.ops();
                let Some(part) = results.get(at..at + n) else {
                    return mismatched("transaction");
                };
                frames.push(shape.frame(part));
                at += n;
            }
            Frame::Array(frames)
        }
        Ok(CommandResult::Multi { results: None }) => Frame::NullArray,
        Ok(_) => mismatched("transaction"),
        Err(e) => error_frame(&e),
    }
}

#[cfg(test)]
mod tests {
    use crate::front_door::handle;
    use crate::front_door::tests::{conn, ready_text, submitted, words};
    use keel_types::{ClientId, Command, RequestId};
    use keel_wire::resp::Frame;

    #[tokio::test]
    async fn a_transaction_queues_at_most_what_one_entry_holds() {
        let (mut c, mut rx, _resolved) = conn();
        let simple = |text: &str| format!("{:?}", Frame::Simple(text.as_bytes().to_vec()));
        assert_eq!(ready_text(handle(&mut c, words(&["MULTI"])).await), simple("OK"));
        for _ in 0..keel_types::MULTI_OPS_MAX {
            let text = ready_text(handle(&mut c, words(&["INCR", "n"])).await);
            assert_eq!(text, simple("QUEUED"));
        }
        let text = ready_text(handle(&mut c, words(&["INCR", "n"])).await);
        assert_eq!(
            text,
            format!("ERR a transaction holds at most {} commands", keel_types::MULTI_OPS_MAX)
        );
        let text = ready_text(handle(&mut c, words(&["EXEC"])).await);
        assert!(text.starts_with("EXECABORT"), "{text}");
        assert!(rx.try_recv().is_err(), "nothing reached the engine");
    }

    #[tokio::test]
    async fn a_transaction_is_queued_and_sent_as_one_command_or_not_at_all() {
        let (mut c, mut rx, _resolved) = conn();
        let simple = |text: &str| format!("{:?}", Frame::Simple(text.as_bytes().to_vec()));
        let (ok, queued) = (simple("OK"), simple("QUEUED"));
        assert_eq!(ready_text(handle(&mut c, words(&["MULTI"])).await), ok);
        for ws in [&["SET", "k", "v"][..], &["INCR", "n"], &["GET", "k"], &["DEL", "a", "b"]] {
            assert_eq!(ready_text(handle(&mut c, words(ws)).await), queued, "{ws:?}");
        }
        assert!(rx.try_recv().is_err(), "nothing reaches the engine before EXEC");
        let text = ready_text(handle(&mut c, words(&["MULTI"])).await);
        assert_eq!(text, "ERR MULTI calls can not be nested");
        let _exec = handle(&mut c, words(&["exec"])).await;
        match rx.try_recv() {
            Ok(crate::driver::Event::Client { submit, .. }) => match submit.command {
                Command::Multi { ops, watch } => {
                    let names: Vec<&str> = ops.iter().map(Command::name).collect();
                    assert_eq!(
                        names,
                        ["put", "incr", "get", "coll-read", "delete", "coll-read", "delete"]
                    );
                    assert!(watch.is_empty());
                }
                other => panic!("not a transaction: {other:?}"),
            },
            _ => panic!("EXEC sends one request"),
        }
        assert!(rx.try_recv().is_err(), "and only one");
        // A refused command discards the whole transaction at EXEC.
        assert_eq!(ready_text(handle(&mut c, words(&["MULTI"])).await), ok);
        assert_eq!(ready_text(handle(&mut c, words(&["SET", "k", "v"])).await), queued);
        let text = ready_text(handle(&mut c, words(&["SELECT", "1"])).await);
        assert!(text.starts_with("ERR SELECT is not allowed inside MULTI"), "{text}");
        let text = ready_text(handle(&mut c, words(&["NOSUCH"])).await);
        assert!(text.starts_with("ERR unknown command"), "{text}");
        let text = ready_text(handle(&mut c, words(&["EXEC"])).await);
        assert!(text.starts_with("EXECABORT"), "{text}");
        assert!(rx.try_recv().is_err(), "nothing of it reached the engine");
        assert_eq!(ready_text(handle(&mut c, words(&["EXEC"])).await), "ERR EXEC without MULTI");
        assert_eq!(ready_text(handle(&mut c, words(&["MULTI"])).await), ok);
        assert_eq!(ready_text(handle(&mut c, words(&["DISCARD"])).await), ok);
        let text = ready_text(handle(&mut c, words(&["DISCARD"])).await);
        assert_eq!(text, "ERR DISCARD without MULTI");
        let _later = handle(&mut c, words(&["SET", "k", "v"])).await;
        assert!(rx.try_recv().is_ok(), "after DISCARD, commands run again");
    }

    #[tokio::test]
    async fn keel_req_exec_sends_the_transaction_under_the_named_pair() {
        let (mut c, mut rx, _resolved) = conn();
        let text = ready_text(handle(&mut c, words(&["KEEL.REQ", "7", "3", "EXEC"])).await);
        assert_eq!(text, "ERR EXEC without MULTI");
        let ok = format!("{:?}", Frame::Simple(b"OK".to_vec()));
        assert_eq!(ready_text(handle(&mut c, words(&["MULTI"])).await), ok);
        let _ = handle(&mut c, words(&["INCR", "n"])).await;
        let text = ready_text(handle(&mut c, words(&["KEEL.REQ", "0", "3", "EXEC"])).await);
        assert!(text.starts_with("ERR KEEL.REQ client and seq"), "{text}");
        let text = ready_text(handle(&mut c, words(&["EXEC", "now"])).await);
        assert!(text.starts_with("ERR wrong number of arguments"), "{text}");
        assert!(rx.try_recv().is_err(), "still queuing");
        let _exec = handle(&mut c, words(&["keel.req", "7", "3", "exec"])).await;
        let s = submitted(&mut rx).await;
        assert_eq!((s.client, s.request), (ClientId(7), RequestId(3)));
        assert!(matches!(s.command, Command::Multi { .. }));
        let text = ready_text(handle(&mut c, words(&["EXEC"])).await);
        assert_eq!(text, "ERR EXEC without MULTI", "the transaction was sent");
    }
}
