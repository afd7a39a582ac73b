//! The collection family: hashes, lists, sets and sorted sets (`keel_types::coll`), each
//! command one engine command, and the blocking pops.
//!
//! A blocking pop (`BLPOP` and its kin) waits at the node the client is connected to: it
//! looks at its keys with reads at level `any` (answered by the node itself, off the
//! engine loop), and when one holds an element it sends the pop, a write through the
//! log like `LMPOP`; a pop that finds nothing (another client was first) goes back to
//! waiting. So an element is popped once, by a log entry, at the durability the pop asks,
//! wherever the push came from and whichever node leads; a leader change only delays it.
//! The connection sends nothing else until the pop is answered, as Redis's does.
//! The wait is a poll of local reads ([`POLL_FIRST`] doubling up to [`POLL_MAX`]), not a
//! wake-up on the write. Clients blocked on one key at one node are served in the order
//! they blocked, as Redis serves them (a line per key, [`LINES`]): a client sends its pop
//! only when the key holds more elements than those ahead of it in line ask for (the sum
//! of their counts), and asks for no more than is left past them, so a key with enough
//! for everyone serves them all at once, a lone element goes to the first, and a later
//! client with a large count does not take what the first waits for. A client leaving a
//! line wakes the others to look again ([`WAKE`]). Clients at different nodes
//! are not ordered among themselves.

use super::plain_submit;
use crate::driver::{KeyspaceHandle, Submit};
use crate::front_door::conn::{Conn, Floor, Pending};
use crate::front_door::dispatch::Turn;
use bytes::Bytes;
use keel_core::engine::ClientReply;
use keel_types::coll::{Answer, CollKind, CollOp, CollRead};
use keel_types::KeyspaceId;
use keel_types::{
    ClientId, Command, CommandResult, KeelError, Key, LogIndex, ReadLevel, RequestId,
};
use keel_wire::command::Reshape;
use keel_wire::reply::{answer_frame, error_frame};
use keel_wire::resp::{Frame, Protocol};
use keel_wire::ClientCommand;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Connections waiting in a blocking pop on this node (`INFO`'s `blocked_clients`).
pub(crate) static BLOCKED: AtomicU64 = AtomicU64::new(0);
/// One key's line: each waiting pop's ticket and the elements it asks for, in the order
/// they blocked.
type Line = VecDeque<(u64, u64)>;
/// The blocking pops waiting on each key of each keyspace.
static LINES: Mutex<BTreeMap<(KeyspaceId, Key), Line>> = Mutex::new(BTreeMap::new());
/// The next ticket.
static TICKETS: AtomicU64 = AtomicU64::new(1);
/// Wakes the waiting pops when one leaves its lines (its place frees the next one's).
static WAKE: std::sync::OnceLock<tokio::sync::Notify> = std::sync::OnceLock::new();

fn wake() -> &'static tokio::sync::Notify {
    WAKE.get_or_init(tokio::sync::Notify::new)
}
/// The blocking pops at this node by their connection's id, and how `CLIENT UNBLOCK`
/// asked each to end (0: it did not; [`AS_TIMEOUT`]; [`WITH_ERROR`]).
static UNBLOCKS: Mutex<BTreeMap<u64, Arc<AtomicU8>>> = Mutex::new(BTreeMap::new());
const AS_TIMEOUT: u8 = 1;
const WITH_ERROR: u8 = 2;

/// `CLIENT UNBLOCK id [TIMEOUT|ERROR]`: whether connection `id` was in a blocking pop,
/// which then ends as a time-out (null) or with `UNBLOCKED`.
pub(crate) fn unblock(id: u64, error: bool) -> bool {
    let guard = UNBLOCKS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(flag) = guard.get(&id).cloned() else { return false };
    drop(guard);
    flag.store(if error { WITH_ERROR } else { AS_TIMEOUT }, Ordering::Relaxed);
    wake().notify_waiters();
    true
}

/// A blocking pop's entry in [`UNBLOCKS`], removed when the pop ends.
struct Unblockable {
    id: u64,
    flag: Arc<AtomicU8>,
}

impl Unblockable {
    fn register(id: u64) -> Unblockable {
        let flag = Arc::new(AtomicU8::new(0));
        let mut guard = UNBLOCKS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        guard.insert(id, flag.clone());
        Unblockable { id, flag }
    }
}

impl Drop for Unblockable {
    fn drop(&mut self) {
        let mut guard = UNBLOCKS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if guard.get(&self.id).is_some_and(|f| Arc::ptr_eq(f, &self.flag)) {
            guard.remove(&self.id);
        }
    }
}

/// Wakes the clients blocked at this node to look at their keys now (after a write
/// answered here that may have given them elements), rather than at their next look.
pub(crate) fn wake_blocked() {
    if BLOCKED.load(Ordering::Relaxed) > 0 {
        wake().notify_waiters();
    }
}

/// Pops one blocking command may send (each only after a read saw an element): the
/// deduplication pairs it reserves.
pub(crate) const BLOCK_ATTEMPTS_MAX: u64 = 1024;
/// The first wait between looks at a blocking pop's keys.
const POLL_FIRST: Duration = Duration::from_millis(1);
/// The longest wait between looks.
const POLL_MAX: Duration = Duration::from_millis(10);

/// Sends a collection command its [`Turn`] has come for.
pub(crate) fn send(conn: &mut Conn, command: ClientCommand, turn: Turn) -> Pending {
    let protocol = conn.protocol;
    let resp3 = protocol == Protocol::Resp3;
    match command {
        ClientCommand::Coll { key, op, durability, reshape, .. } => {
            // A write that may give a list or sorted set elements wakes the clients blocked
            // at this node once it is answered, rather than at their next look.
            let feeds = matches!(
                *op,
                CollOp::Push { .. }
                    | CollOp::LMove { .. }
                    | CollOp::LInsert { .. }
                    | CollOp::ZAdd { .. }
                    | CollOp::ZStore { .. }
                    | CollOp::ZRangeStore { .. }
                    | CollOp::SortStore { .. }
            );
            let sent =
                conn.node.send(Submit { durability, ..turn.submit(Command::Coll { key, op }) });
            let floor = conn.floor();
            let reply = async move {
                let answer = sent.answer().await;
                floor.note(&answer);
                if feeds {
                    wake_blocked();
                }
                frame(answer, &reshape, resp3)
            };
            Pending::later(Box::pin(reply), protocol)
        }
        ClientCommand::CollRead { key, op, level, reshape, .. } => {
            let submit = Submit { level, ..turn.submit(Command::CollRead { key, op }) };
            if let Some(reply) = turn.loop_idle.then(|| conn.node.read_now(&submit)).flatten() {
                conn.last_looped = turn.looped_before;
                return Pending::ready(frame(Ok(reply), &reshape, resp3), protocol);
            }
            let sent = conn.node.send(submit);
            Pending::later(
                Box::pin(async move { frame(sent.answer().await, &reshape, resp3) }),
                protocol,
            )
        }
        ClientCommand::Block { key, op, timeout, durability, reshape, .. } => {
            let (client, first) = turn.pair;
            // The pairs of the pops it may send: none of the connection's later requests
            // is sent before it is answered, so they precede every later pair.
            for _ in 1..BLOCK_ATTEMPTS_MAX {
                conn.next_pair();
            }
            let unblockable = Unblockable::register(conn.client.0);
            let wait = Blocked {
                unblocked: unblockable.flag.clone(),
                node: conn.node.clone(),
                floor: conn.floor(),
                client,
                first,
                after: turn.after,
                key,
                op: *op,
                timeout,
                durability,
            };
            let reply = async move {
                let answer = wait.run().await;
                if unblockable.flag.load(Ordering::Relaxed) == WITH_ERROR {
                    return Frame::error("UNBLOCKED client unblocked via CLIENT UNBLOCK");
                }
                frame(answer, &reshape, resp3)
            };
            Pending::later(Box::pin(reply), protocol)
        }
        other => unreachable!("{} is not a collection command", other.name()),
    }
}

/// The reply frame of a collection command's answer, reshaped as the command says.
fn frame(answer: Result<ClientReply, KeelError>, reshape: &Reshape, resp3: bool) -> Frame {
    match answer.and_then(|r| r.result) {
        Ok(result) => reshaped(result, reshape, resp3),
        Err(e) => error_frame(&e),
    }
}

/// The reply frame of a collection command's result (inside a transaction too).
pub(crate) fn reshaped(result: CommandResult, reshape: &Reshape, resp3: bool) -> Frame {
    let CommandResult::Answer { answer, .. } = result else {
        return super::mismatched("collection command");
    };
    match (reshape, answer) {
        (Reshape::None, answer) => answer_frame(&answer, resp3),
        (Reshape::Ok, _) => Frame::ok(),
        (Reshape::Match { pattern, pairs }, Answer::Array(mut page)) if page.len() == 2 => {
            let Some(Answer::Array(items)) = page.pop() else {
                return answer_frame(&Answer::Array(page), resp3);
            };
            let step = if *pairs { 2 } else { 1 };
            let kept: Vec<Answer> = items
                .chunks(step)
                .filter(|chunk| match &chunk[0] {
                    Answer::Bulk(element) => keel_wire::glob::matches(pattern, element),
                    _ => true,
                })
                .flat_map(|chunk| chunk.iter().cloned())
                .collect();
            page.push(Answer::Array(kept));
            answer_frame(&Answer::Array(page), resp3)
        }
        (Reshape::PopOne | Reshape::ZPopOne, Answer::Array(mut parts)) if parts.len() == 2 => {
            let Some(Answer::Array(mut popped)) = parts.pop() else { return Frame::NullArray };
            let key = parts.pop().expect("two parts");
            match (reshape, popped.pop()) {
                (Reshape::ZPopOne, Some(Answer::Array(pair))) => {
                    let mut out = vec![key];
                    out.extend(pair);
                    answer_frame(&Answer::Array(out), resp3)
                }
                (_, Some(element)) => answer_frame(&Answer::Array(vec![key, element]), resp3),
                (_, None) => Frame::NullArray,
            }
        }
        (Reshape::Encoding, Answer::Array(facts)) => encoding_frame(&facts),
        (Reshape::IfExists(n), Answer::Status(kind)) if kind != "none" => Frame::Integer(*n),
        (Reshape::IfExists(_), _) => Frame::Null,
        (Reshape::PopOne | Reshape::ZPopOne, Answer::Nil | Answer::NilArray) => Frame::NullArray,
        (_, Answer::Nil) => Frame::Null,
        (_, answer) => answer_frame(&answer, resp3),
    }
}

/// `OBJECT ENCODING`: the name Redis 7.0 gives a value of that shape under the node's
/// settings (`CONFIG SET hash-max-listpack-entries` and kin). Keel keeps every collection
/// in one structure; the name is for clients and tests that ask.
fn encoding_frame(facts: &[Answer]) -> Frame {
    use keel_wire::command::StringRead;
    let setting = |name: &str| super::settings::number(name);
    match facts {
        [Answer::Status(kind), Answer::Bulk(value)] if kind == "string" => {
            StringRead::Encoding.answer(Some(value))
        }
        [Answer::Status(kind), Answer::Int(len), Answer::Int(longest), Answer::Int(integers)] => {
            let small =
                |entries: &str, value: &str| *len <= setting(entries) && *longest <= setting(value);
            let name = match kind.as_str() {
                "hash" if small("hash-max-listpack-entries", "hash-max-listpack-value") => {
                    "listpack"
                }
                "hash" => "hashtable",
                "list" => "quicklist",
                "set" if *integers == 1 && *len <= setting("set-max-intset-entries") => "intset",
                "set" => "hashtable",
                "zset" if small("zset-max-listpack-entries", "zset-max-listpack-value") => {
                    "listpack"
                }
                _ => "skiplist",
            };
            Frame::bulk(name)
        }
        _ => Frame::Null,
    }
}

/// A blocking pop waiting for an element.
struct Blocked {
    /// Set by `CLIENT UNBLOCK`.
    unblocked: Arc<AtomicU8>,
    node: KeyspaceHandle,
    floor: Floor,
    client: ClientId,
    first: RequestId,
    after: LogIndex,
    key: Key,
    op: CollOp,
    timeout: Option<Duration>,
    durability: Option<keel_types::Durability>,
}

/// Counts a connection as blocked while it lives.
struct BlockedGuard;

impl BlockedGuard {
    fn new() -> BlockedGuard {
        BLOCKED.fetch_add(1, Ordering::Relaxed);
        BlockedGuard
    }
}

impl Drop for BlockedGuard {
    fn drop(&mut self) {
        BLOCKED.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A blocking pop's place in the line of each of its keys, held until it is answered
/// (or its connection goes).
struct InLine {
    ticket: u64,
    keys: Vec<(KeyspaceId, Key)>,
}

impl InLine {
    /// Joins the line of each of `keys`, asking for `demand` elements (a pop's count).
    fn join(keyspace: KeyspaceId, keys: &[Key], demand: u64) -> InLine {
        let ticket = TICKETS.fetch_add(1, Ordering::Relaxed);
        let keys: Vec<_> = keys.iter().map(|k| (keyspace, k.clone())).collect();
        let mut lines = LINES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for key in &keys {
            lines.entry(key.clone()).or_default().push_back((ticket, demand));
        }
        InLine { ticket, keys }
    }

    /// Leaves the line of `key` (waking the others).
    fn leave(&mut self, key: &Key) {
        let Some(at) = self.keys.iter().position(|(_, k)| k == key) else { return };
        let entry = self.keys.swap_remove(at);
        let mut lines = LINES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(line) = lines.get_mut(&entry) {
            line.retain(|(t, _)| *t != self.ticket);
            if line.is_empty() {
                lines.remove(&entry);
            }
        }
        drop(lines);
        wake().notify_waiters();
    }

    /// How many elements those ahead of it in the line of `key` wait for (the sum of
    /// their counts).
    fn ahead(&self, key: &Key) -> u64 {
        let lines = LINES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let line = self.keys.iter().find(|(_, k)| k == key).and_then(|k| lines.get(k));
        let Some(line) = line else { return 0 };
        line.iter().take_while(|(t, _)| *t != self.ticket).map(|(_, d)| d).sum()
    }
}

impl Drop for InLine {
    fn drop(&mut self) {
        let mut lines = LINES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for key in &self.keys {
            if let Some(line) = lines.get_mut(key) {
                line.retain(|(t, _)| *t != self.ticket);
                if line.is_empty() {
                    lines.remove(key);
                }
            }
        }
        drop(lines);
        wake().notify_waiters();
    }
}

impl Blocked {
    /// Waits until a pop answers an element (or an error), or the time-out passes (an
    /// answer of null).
    async fn run(self) -> Result<ClientReply, KeelError> {
        let deadline = self.timeout.map(|t| Instant::now() + t);
        let kind = self.op.kind();
        let keys: Vec<Key> = std::iter::once(self.key.clone())
            .chain(
                self.op
                    .other_keys()
                    .into_iter()
                    .take(match self.op {
                        CollOp::LMove { .. } => 0,
                        _ => usize::MAX,
                    })
                    .cloned(),
            )
            .collect();
        let mut attempts = 0;
        let mut pause = POLL_FIRST;
        let mut guard = None;
        let mut line = InLine::join(self.node.id, &keys, self.op.pop_count());
        // A key of another type answers `WRONGTYPE` when the pop comes; once it waits, a
        // key that becomes another type does not wake it (as in Redis).
        let mut first_look = true;
        loop {
            if self.unblocked.load(Ordering::Relaxed) != 0 {
                return Ok(self.nothing());
            }
            let (ready, wrong) = self.ready_keys(&keys, kind, first_look).await?;
            first_look = false;
            // A key that became another type holds no place for this client: the next
            // in line is served first.
            for key in wrong {
                line.leave(key);
            }
            // The elements the clients ahead wait for are theirs: this one pops only past
            // them, and no more than is left past them.
            let past = ready.iter().find_map(|(key, held)| {
                let left = held.saturating_sub(line.ahead(key));
                (left > 0).then_some((*key, left))
            });
            if let Some((key, left)) = past {
                let request = RequestId(self.first.0 + attempts);
                attempts += 1;
                let command = self.pop_from(key, left);
                let plain = plain_submit(self.client, request, command, None, self.after);
                let submit = Submit { durability: self.durability, ..plain };
                let answer = self.node.send(submit).answer().await;
                self.floor.note(&answer);
                let empty = matches!(
                    answer.as_ref().map(|r| &r.result),
                    Ok(Ok(CommandResult::Answer { answer: Answer::Nil | Answer::NilArray, .. }))
                );
                if !empty {
                    return answer;
                }
                if attempts >= BLOCK_ATTEMPTS_MAX {
                    // Never a null before the time-out: the client is told to try again.
                    let why = "the blocking pop lost every race for an element; send it again";
                    return Err(KeelError::Busy(why.into()));
                }
                // Another client was first, or this node's view lags: the wait goes on
                // growing, so a lagging view does not send a pop a millisecond.
            }
            if deadline.is_some_and(|d| Instant::now() >= d)
                || self.unblocked.load(Ordering::Relaxed) != 0
            {
                return Ok(self.nothing());
            }
            guard.get_or_insert_with(BlockedGuard::new);
            let mut sleep = pause;
            if let Some(deadline) = deadline {
                sleep = sleep.min(deadline.saturating_duration_since(Instant::now()));
            }
            // Woken early when a pop ahead leaves its line.
            let _ = tokio::time::timeout(sleep, wake().notified()).await;
            pause = (pause * 2).min(POLL_MAX);
        }
    }

    /// The keys of `keys` that hold an element and how many, by this node's applied
    /// state (a read at `any`); a key of another type counts as one (the pop's error to
    /// give, to the first in line).
    async fn ready_keys<'a>(
        &self,
        keys: &'a [Key],
        kind: CollKind,
        wrong_type_ready: bool,
    ) -> Result<(Vec<(&'a Key, u64)>, Vec<&'a Key>), KeelError> {
        let mut ready = Vec::new();
        let mut wrong = Vec::new();
        for key in keys {
            let op = match kind {
                CollKind::ZSet => CollRead::ZCard,
                _ => CollRead::LLen,
            };
            let command = Command::CollRead { key: key.clone(), op: Box::new(op) };
            let submit =
                plain_submit(self.client, self.first, command, Some(ReadLevel::Any), self.after);
            let reply = match self.node.read_now(&submit) {
                Some(reply) => Ok(reply),
                None => self.node.send(submit).answer().await,
            };
            match reply?.result {
                Ok(CommandResult::Answer { answer: Answer::Int(0), .. }) => {}
                Ok(CommandResult::Answer { answer: Answer::Int(n), .. }) => {
                    ready.push((key, u64::try_from(n).unwrap_or(0)));
                }
                Err(KeelError::WrongType) if !wrong_type_ready => wrong.push(key),
                // A key of the wrong type: the pop answers it.
                Ok(_) | Err(KeelError::WrongType) => ready.push((key, 1)),
                Err(e) => return Err(e),
            }
        }
        Ok((ready, wrong))
    }

    /// The pop to send for the elements past those the clients ahead wait for: at most
    /// `left` of them, from `key`, the first of its keys that has such elements (a
    /// multi-key pop names that key alone: the keys before it are the clients' ahead, as
    /// Redis, serving them first, would find them empty at this client's turn).
    fn pop_from(&self, key: &Key, left: u64) -> Command {
        let op = match self.op.at_most(left) {
            CollOp::MPop { end, count, zset, .. } => {
                let op = CollOp::MPop { others: Vec::new(), end, count, zset };
                return Command::Coll { key: key.clone(), op: Box::new(op) };
            }
            op => op,
        };
        Command::Coll { key: self.key.clone(), op: Box::new(op) }
    }

    /// The answer of a pop that timed out.
    fn nothing(&self) -> ClientReply {
        ClientReply {
            tag: keel_core::engine::RequestTag(0),
            served_by: keel_types::NodeId(0),
            result: Ok(CommandResult::Answer { answer: Answer::NilArray, version: None }),
            durability_round: false,
        }
    }
}

/// `TYPE` of each key (sent at once, at level `any`): what `EXISTS` and `DEL`'s count
/// ask, whatever the key holds.
pub(crate) fn types_of(
    node: &KeyspaceHandle,
    keys: Vec<(ClientId, RequestId, Bytes)>,
    level: Option<ReadLevel>,
    after: LogIndex,
) -> Vec<crate::driver::Sent> {
    keys.into_iter()
        .map(|(client, request, key)| {
            let command = Command::CollRead { key, op: Box::new(CollRead::Type) };
            node.send(plain_submit(client, request, command, level, after))
        })
        .collect()
}

/// Whether a `TYPE` answer says the key exists.
pub(crate) fn exists(reply: &Result<ClientReply, KeelError>) -> bool {
    matches!(
        reply.as_ref().map(|r| &r.result),
        Ok(Ok(CommandResult::Answer { answer: Answer::Status(name), .. })) if name != "none"
    )
}
