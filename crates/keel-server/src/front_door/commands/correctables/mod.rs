//! `KEEL.INVOKE`: an operation as a Correctable (`docs/correctables.md`), answered with
//! views of increasing strength: preliminary ones pushed as they come (RESP3), the final
//! one the reply.

mod parse;

use super::acl::permitted;
use super::sessions::named_client;
use super::strings::get_submit;
use super::{mismatched, plain_submit};
use crate::acl::Category;
use crate::driver::{KeyspaceHandle, Sent, Submit};
use crate::front_door::conn::{Conn, Floor, Kind, Pending};
use bytes::Bytes;
use keel_core::engine::ClientReply;
use keel_types::{Command, CommandResult, ReadLevel, RequestId, Version};
use keel_wire::reply::{error_frame, value_frame, version_frame, with_version_frame};
use keel_wire::resp::{Frame, Protocol};
use parse::{parse_invoke, Invocation, InvokeOp};
use tokio::sync::mpsc;

/// One view of a `KEEL.INVOKE`, for the connection's writer.
#[derive(Debug)]
pub enum View {
    /// A preliminary view: a RESP3 push frame, written at once.
    Push(Frame),
    /// The final view: the command's reply.
    Final(Frame),
}

/// The reply when an invocation's views stop without a final one (the node stopping).
/// `TIMEOUT`, outcome unknown: an invoked enqueue or dequeue may have been applied.
pub const INVOKE_ENDED: &str = "TIMEOUT the invocation ended without a final view";

/// `KEEL.INVOKE GET <key> [LEVELS <level> ...] [NOCONFIRM] [WITHVERSION]`: a read as a
/// Correctable (`docs/correctables.md`). The node reads `key` at each level, weakest
/// first, one after the other: each view but the last goes out at once as a RESP3 push
/// `["invoke", tag, level, value, version]` (`tag`: the request's sequence number on the
/// connection), and the last is the ordinary reply of `GET` (with `WITHVERSION`, of
/// `GET ... WITHVERSION`). A view equal to the one before it (value and version) carries
/// `+SAME` instead of the value, unless `NOCONFIRM`; RESP2 connections get the final
/// reply only, whole.
///
/// `KEEL.INVOKE DEQUEUE <queue> [LEVELS <level> ...] [DURABILITY d] [NOCONFIRM]
/// [WITHVERSION]` and `KEEL.INVOKE ENQUEUE <queue> <value> ...`: a queue operation as a
/// Correctable. `LEVELS any` (the default; no other level is taken) gives a preliminary
/// view: the operation simulated on the queue as this node holds it (`KEEL.QPEEK`), shaped as
/// the operation's reply (`[seq, value, remaining]` or null; `[seq, length]`). The final
/// view is the operation itself, ordered through the log, labelled `linearizable`; its
/// `+SAME` stands for a view equal to the last preliminary one (versions aside: the
/// operation's entry is always newer than what it read).
pub(crate) async fn keel_invoke(conn: &mut Conn, words: Vec<Bytes>) -> Pending {
    let protocol = conn.protocol;
    let mut invocation = match parse_invoke(&words, &conn.limits) {
        Ok(invocation) => invocation,
        Err(text) => return Pending::ready(Frame::error(&text), protocol),
    };
    // The keys (or the queue) of the connection's database.
    let db = conn.db;
    let in_db = |key: Bytes| super::databases::key_in_database(db, key);
    let mapped = in_db(invocation.key.clone()).and_then(|key| {
        invocation.key = key;
        if let InvokeOp::MGet(keys) = &mut invocation.op {
            *keys = std::mem::take(keys).into_iter().map(in_db).collect::<Result<_, _>>()?;
        }
        Ok(())
    });
    if let Err(refusal) = mapped {
        return Pending::ready(refusal, protocol);
    }
    let category = if invocation.op.is_read() { Category::Read } else { Category::Write };
    if let Err(refusal) = permitted(conn, Some(category)) {
        return Pending::ready(refusal, protocol);
    }
    let ks = conn.node.id;
    if invocation.op.is_read() {
        let strongest = invocation.levels.last().copied();
        conn.order(Kind::Read(ks, strongest)).await;
    } else {
        conn.order_through_loop(Kind::Write(ks)).await;
    }
    let count = invocation.levels.len() + usize::from(!invocation.op.is_read());
    // RESP2 cannot receive the preliminary views: only the final step runs.
    let first = if protocol == Protocol::Resp3 { 0 } else { count - 1 };
    let (mut steps, tag) = invoke_steps(conn, &invocation, first, count);
    let floor = conn.floor();
    let (tx, rx) = mpsc::channel(steps.len());
    let last = steps.len() - 1;
    let resp3 = protocol == Protocol::Resp3;
    let mut views = Views { invocation, tag, first, resp3, previous: None };
    let Some(done) = first_view_now(&conn.node, &mut views, &mut steps, &tx) else {
        return Pending::views(rx, protocol);
    };
    let node = conn.node.clone();
    tokio::spawn(async move {
        invoke_views(node, views, steps, done, last, floor, tx).await;
    });
    Pending::views(rx, protocol)
}

/// The invocation's steps `first..count` and its tag (the first step's sequence number on
/// the connection).
fn invoke_steps(
    conn: &mut Conn,
    invocation: &Invocation,
    first: usize,
    count: usize,
) -> (Vec<Step>, u64) {
    let after = conn.resolved.floor(conn.node.id);
    let mut steps = Vec::with_capacity(count - first);
    let mut tag = None;
    for i in first..count {
        let is_final = i == count - 1;
        let (client, request) = match invocation.req {
            // As `KEEL.REQ`: an authenticated user's ids are its own.
            Some((client, seq)) if is_final => (named_client(conn, client), RequestId(seq)),
            _ => conn.next_pair(),
        };
        tag.get_or_insert(request.0);
        let level = invocation.levels.get(i).copied();
        let submit = |command| plain_submit(client, request, command, level, after);
        let step = match &invocation.op {
            InvokeOp::MGet(keys) => Step::Keys(
                keys.iter()
                    .map(|key| get_submit(client, request, key.clone(), level, after))
                    .collect(),
            ),
            // A read's levels are asked one after the other, each once the one before
            // it is answered.
            InvokeOp::Get => Step::Later(submit(Command::Get { key: invocation.key.clone() })),
            // A queue operation's steps (and a write's one) are all sent now, in order: its
            // write keeps its place among the connection's writes (a later request's write
            // must not reach the log first), and the views read the queue before the write.
            _ => {
                let (command, durability) = invocation.command(is_final);
                let submit = Submit { durability, ..submit(command) };
                match (!submit.command.is_write()).then(|| conn.node.read_now(&submit)).flatten() {
                    Some(reply) => Step::Ready(reply),
                    None => Step::Sent(conn.node.send(submit)),
                }
            }
        };
        steps.push(step);
    }
    (steps, tag.expect("at least one step"))
}

/// A read's first view, when the node can answer it at once (off the loop), made here and
/// handed to the writer directly, with no hop through a task: the steps done (0 or 1), or
/// `None` when that view ended the invocation.
fn first_view_now(
    node: &KeyspaceHandle,
    views: &mut Views,
    steps: &mut Vec<Step>,
    tx: &mpsc::Sender<View>,
) -> Option<usize> {
    if views.invocation.op != InvokeOp::Get || steps.len() < 2 {
        return Some(0);
    }
    let Some(Step::Later(submit)) = steps.first() else { return Some(0) };
    let Some(reply) = node.read_now(submit) else { return Some(0) };
    let viewed = match reply.result {
        Ok(result) => invoke_view(&views.invocation.op, result),
        Err(e) => Err(error_frame(&e)),
    };
    if let Some(view) = views.make(0, false, viewed) {
        let ends = matches!(view, View::Final(_));
        let _ = tx.try_send(view);
        if ends {
            return None;
        }
    }
    steps.remove(0);
    Some(1)
}

/// One step of an invocation: its request, still to send, or sent.
enum Step {
    Later(Submit),
    /// An `MGET` view: a get per key, all at one level, sent when the step comes.
    Keys(Vec<Submit>),
    Ready(ClientReply),
    Sent(Sent),
}

/// Reads of one `MGET` view: sent together, the values in key order and the greatest
/// version among them.
async fn keys_view(
    node: &KeyspaceHandle,
    submits: Vec<Submit>,
) -> Result<(Frame, Option<Version>), Frame> {
    let mut sent = Vec::with_capacity(submits.len());
    for submit in submits {
        sent.push(match node.read_now(&submit) {
            Some(reply) => Step::Ready(reply),
            None => Step::Sent(node.send(submit)),
        });
    }
    let (mut values, mut newest) = (Vec::with_capacity(sent.len()), None);
    for step in sent {
        let answer = match step {
            Step::Ready(reply) => Ok(reply),
            Step::Sent(sent) => sent.answer().await,
            Step::Later(_) | Step::Keys(_) => unreachable!("sent above"),
        };
        match answer.and_then(|reply| reply.result) {
            Ok(CommandResult::Value { value, version }) => {
                values.push(value_frame(value.as_ref()));
                newest = newest.max(version);
            }
            Ok(_) => return Err(mismatched("get")),
            Err(e) => return Err(error_frame(&e)),
        }
    }
    Ok((Frame::Array(values), newest))
}

/// Turns an invocation's step results into the views the connection writes: pushes for
/// the preliminary ones, the reply for the final one, confirmations in place of values
/// equal to the view before.
struct Views {
    invocation: Invocation,
    /// The request's tag in its pushes.
    tag: u64,
    /// The level of step `i` is `invocation.levels[first + i]`.
    first: usize,
    resp3: bool,
    /// The last view made: its value and version.
    previous: Option<(Frame, Option<Version>)>,
}

impl Views {
    /// The view of step `i` (`None`: left out, a queue operation's failed preliminary
    /// view), or the final view an error ends the invocation with.
    fn make(
        &mut self,
        i: usize,
        is_final: bool,
        viewed: Result<(Frame, Option<Version>), Frame>,
    ) -> Option<View> {
        let op = &self.invocation.op;
        let (value, version) = match viewed {
            Ok(view) => view,
            // A queue operation's write is already sent: a preliminary view that failed
            // is left out, and the final view still tells how the operation ended.
            Err(_) if !is_final && !op.is_read() => return None,
            Err(frame) => return Some(View::Final(frame)),
        };
        // A read's view is the same when value and version are; a queue operation's final
        // view is always at a newer version than what its preliminary ones read.
        let same = self.invocation.confirm
            && self.resp3
            && self
                .previous
                .as_ref()
                .is_some_and(|p| p.0 == value && (p.1 == version || !op.is_read()));
        let shown = if same { Frame::Simple(b"SAME".to_vec()) } else { value.clone() };
        let view = if is_final {
            View::Final(if self.invocation.with_version {
                with_version_frame(shown, version)
            } else {
                shown
            })
        } else {
            let level =
                self.invocation.levels.get(self.first + i).expect("a preliminary view has a level");
            View::Push(Frame::Push(vec![
                Frame::bulk("invoke"),
                Frame::Integer(i64::try_from(self.tag).unwrap_or(i64::MAX)),
                Frame::bulk(level.as_str()),
                shown,
                version.map_or(Frame::Null, version_frame),
            ]))
        };
        self.previous = Some((value, version));
        Some(view)
    }
}

/// Produces the views of `steps` (the invocation's steps from `done` on), in order, into
/// `tx`.
async fn invoke_views(
    node: KeyspaceHandle,
    mut views: Views,
    steps: Vec<Step>,
    done: usize,
    last: usize,
    floor: Floor,
    tx: mpsc::Sender<View>,
) {
    for (i, step) in steps.into_iter().enumerate().map(|(i, s)| (i + done, s)) {
        let is_final = i == last;
        let viewed = match step {
            Step::Keys(mut submits) => {
                if is_final && node.unsafe_stale_invoke {
                    submits.iter_mut().for_each(|s| s.level = Some(ReadLevel::Any));
                }
                keys_view(&node, submits).await
            }
            one => {
                let reply = match one {
                    Step::Later(mut submit) => {
                        if is_final && node.unsafe_stale_invoke {
                            submit.level = Some(ReadLevel::Any);
                        }
                        match node.read_now(&submit) {
                            Some(reply) => Ok(reply),
                            None => node.send(submit).answer().await,
                        }
                    }
                    Step::Ready(reply) => Ok(reply),
                    Step::Sent(sent) => sent.answer().await,
                    Step::Keys(_) => unreachable!("matched above"),
                };
                if is_final && !views.invocation.op.is_read() {
                    floor.note(&reply);
                }
                match reply.and_then(|reply| reply.result) {
                    Ok(result) => invoke_view(&views.invocation.op, result),
                    Err(e) => Err(error_frame(&e)),
                }
            }
        };
        let Some(view) = views.make(i, is_final, viewed) else { continue };
        let ends = matches!(view, View::Final(_));
        if tx.send(view).await.is_err() || ends {
            return; // the connection went away, or the invocation ended
        }
    }
}

/// One step's result as a view: the frame the operation's reply would carry, and its
/// version; a result of another kind becomes an error frame.
fn invoke_view(op: &InvokeOp, result: CommandResult) -> Result<(Frame, Option<Version>), Frame> {
    let count = |n: u64| Frame::Integer(i64::try_from(n).unwrap_or(i64::MAX));
    match (op, result) {
        (InvokeOp::Get, CommandResult::Value { value, version }) => {
            Ok((value_frame(value.as_ref()), version))
        }
        // What a dequeue applied to the queue as read would return.
        (InvokeOp::Dequeue, CommandResult::Queue { head, length, version, .. }) => {
            let frame = match head {
                Some((seq, value)) => Frame::Array(vec![
                    count(seq),
                    Frame::Bulk(value),
                    count(length.saturating_sub(1)),
                ]),
                None => Frame::Null,
            };
            Ok((frame, version))
        }
        // What an enqueue applied to the queue as read would return.
        (InvokeOp::Enqueue(_), CommandResult::Queue { length, next, version, .. }) => {
            Ok((Frame::Array(vec![count(next), count(length + 1)]), version))
        }
        (InvokeOp::Set(_), CommandResult::Written { version }) => Ok((Frame::ok(), Some(version))),
        (_, result @ (CommandResult::Dequeued { .. } | CommandResult::Enqueued { .. })) => {
            let version = result.written_version();
            Ok((keel_wire::reply::result_frame(&result, false), version))
        }
        (InvokeOp::Get | InvokeOp::MGet(_), _) => Err(mismatched("get")),
        (InvokeOp::Set(_), _) => Err(mismatched("set")),
        (_, _) => Err(mismatched("queue operation")),
    }
}
