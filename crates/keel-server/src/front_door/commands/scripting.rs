//! Scripts: `EVAL`, `EVALSHA`, `EVAL_RO`, `EVALSHA_RO` and `SCRIPT LOAD|EXISTS|FLUSH|KILL`.
//!
//! A script runs at the node its client is connected to, on a blocking thread of the
//! client runtime (`lua`), never on an engine loop. It runs against a private copy of
//! the keys it touches: before each `redis.call`, the keys the command names that the
//! script has not read yet are read whole from the leader ([`Command::Fetch`], at
//! `linearizable`) into a private state machine, where the command is applied as the
//! engine would apply it, with the script's one time. When the script ends, every key
//! whose item changed is written back, as [`Command::Restore`] (or a delete), in one
//! transaction that watches the version of every key the script read: applied whole if
//! none changed since, else not at all, and the script runs again (at most
//! [`ATTEMPTS_MAX`] times). So a script is atomic and isolated as Redis's are, its
//! writes replicate as their effects (never the script), and a script that wrote can
//! still be killed (nothing of it is applied before it ends). As Redis, a script that
//! fails keeps what its calls before the failure wrote.
//!
//! One script runs at a time on a node. One that runs past `busy-reply-threshold`
//! (`lua-time-limit`) makes the node answer `BUSY` to other clients' commands, as Redis
//! does, until it ends or `SCRIPT KILL` stops it ([`busy_refusal`]). Keel does not need
//! this for atomicity; it is there so that a runaway script is seen and stopped, as
//! Redis applications and operators expect.

use super::acl::permitted;
use super::databases::{in_database_of, select, DATABASES};
use super::lua::{self, Call, Job};
use super::transactions::{transactable, Shape};
use crate::acl::{category, Category};
use crate::driver::{KeyspaceHandle, Submit};
use crate::front_door::conn::{Conn, Floor, Kind, Pending};
use bytes::Bytes;
use keel_core::engine::OpMode;
use keel_core::leader::kv::{Applied, Kv};
use keel_types::{
    ClientId, Command, CommandResult, Durability, Entry, EntryPayload, Epoch, Key, KeyspaceId,
    Limits, LogIndex, ReadLevel, RequestId, Version,
};
use keel_wire::reply::error_frame;
use keel_wire::resp::Frame;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Runs of one script before it gives up on keys that keep changing under it.
pub(crate) const ATTEMPTS_MAX: usize = 16;
/// The longest pause before a run again (the pause doubles from 1 ms, drawn at random
/// below its bound, so that scripts racing from several nodes spread out).
const BACKOFF_MAX_MS: u64 = 64;
/// Most bytes of script text a node's cache holds (the oldest are forgotten first).
const CACHE_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Redis's refusal while a script is busy.
const BUSY: &str =
    "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.";
/// Commands a busy node still runs for other clients (Redis's `allow-busy` ones).
const ALLOWED_WHEN_BUSY: &[&str] = &[
    "auth", "hello", "quit", "reset", "multi", "discard", "watch", "unwatch", "script", "function",
    "shutdown",
];

/// The scripts `SCRIPT LOAD` and `EVAL` cached on this node, by SHA1, oldest first.
#[derive(Default)]
struct Cache {
    scripts: BTreeMap<String, (u64, Bytes)>,
    order: BTreeMap<u64, String>,
    next: u64,
    bytes: usize,
}

static CACHE: Mutex<Option<Cache>> = Mutex::new(None);

fn cache<T>(f: impl FnOnce(&mut Cache) -> T) -> T {
    let mut guard = CACHE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    f(guard.get_or_insert_with(Cache::default))
}

impl Cache {
    fn insert(&mut self, sha: String, source: Bytes) {
        if let Some((stamp, old)) = self.scripts.remove(&sha) {
            self.order.remove(&stamp);
            self.bytes -= old.len();
        }
        self.bytes += source.len();
        self.order.insert(self.next, sha.clone());
        self.scripts.insert(sha, (self.next, source));
        self.next += 1;
        while self.bytes > CACHE_BYTES_MAX {
            let Some((_, oldest)) = self.order.pop_first() else { break };
            if let Some((_, source)) = self.scripts.remove(&oldest) {
                self.bytes -= source.len();
            }
        }
    }
}

/// The script running on this node: whose it is, since when, and its kill flag.
struct Running {
    client: ClientId,
    since: Instant,
    kill: Arc<AtomicBool>,
}

static RUNNING: Mutex<Option<Running>> = Mutex::new(None);
/// One script at a time on a node.
static GATE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn running<T>(f: impl FnOnce(&mut Option<Running>) -> T) -> T {
    f(&mut RUNNING.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
}

/// Clears the running script when its run ends, however it ends.
struct RunningGuard;

impl Drop for RunningGuard {
    fn drop(&mut self) {
        running(|r| *r = None);
    }
}

/// The refusal of `words` from `conn` while another client's script is past
/// `busy-reply-threshold`: `BUSY`, which also discards a transaction being queued at its
/// `EXEC` (`EXECABORT`), as Redis's.
pub(crate) fn busy_refusal(conn: &mut Conn, words: &[Bytes]) -> Option<Pending> {
    let threshold = super::settings::number("busy-reply-threshold").max(0) as u128;
    let busy = running(|r| {
        r.as_ref()
            .is_some_and(|r| r.client != conn.client && r.since.elapsed().as_millis() >= threshold)
    });
    let first = words.first().map_or(&[][..], |w| &w[..]);
    if !busy || ALLOWED_WHEN_BUSY.iter().any(|w| first.eq_ignore_ascii_case(w.as_bytes())) {
        return None;
    }
    let frame = match (first.eq_ignore_ascii_case(b"exec"), conn.transaction.take()) {
        (true, Some(_)) => {
            Frame::error(&format!("EXECABORT Transaction discarded because of: {BUSY}"))
        }
        (_, tx) => {
            conn.transaction = tx.map(|mut tx| {
                tx.refuse();
                tx
            });
            Frame::error(BUSY)
        }
    };
    Some(Pending::ready(frame, conn.protocol))
}

/// `EVAL` and its kin, and `SCRIPT`; `Err(words)`: not a scripting command.
pub(crate) async fn route(conn: &mut Conn, words: Vec<Bytes>) -> Result<Pending, Vec<Bytes>> {
    let first =
        words.first().map_or(String::new(), |w| String::from_utf8_lossy(w).to_ascii_lowercase());
    let ready = |frame: Frame| Ok(Pending::ready(frame, conn.protocol));
    match first.as_str() {
        "script" => ready(script(&words)),
        "eval" | "evalsha" | "eval_ro" | "evalsha_ro" => {
            let read_only = first.ends_with("_ro");
            let source = match words.get(1) {
                None => return ready(wrong_arity(&first)),
                Some(body) if first.starts_with("evalsha") => {
                    let sha = String::from_utf8_lossy(body).to_ascii_lowercase();
                    match cache(|c| c.scripts.get(&sha).map(|(_, s)| s.clone())) {
                        Some(source) => source,
                        None => {
                            return ready(Frame::error(
                                "NOSCRIPT No matching script. Please use EVAL.",
                            ))
                        }
                    }
                }
                Some(body) => body.clone(),
            };
            Ok(eval(conn, words, source, read_only).await)
        }
        _ => Err(words),
    }
}

fn wrong_arity(name: &str) -> Frame {
    Frame::error(&format!("ERR wrong number of arguments for '{name}' command"))
}

/// `SCRIPT LOAD|EXISTS|FLUSH|KILL|HELP`.
fn script(words: &[Bytes]) -> Frame {
    let sub =
        words.get(1).map_or(String::new(), |w| String::from_utf8_lossy(w).to_ascii_lowercase());
    match (sub.as_str(), words.len()) {
        ("load", 3) => {
            let sha = lua::sha1_hex(&words[2]);
            cache(|c| c.insert(sha.clone(), words[2].clone()));
            Frame::Bulk(sha.into())
        }
        ("exists", n) if n >= 3 => Frame::Array(
            words[2..]
                .iter()
                .map(|sha| {
                    let sha = String::from_utf8_lossy(sha).to_ascii_lowercase();
                    Frame::Integer(i64::from(cache(|c| c.scripts.contains_key(&sha))))
                })
                .collect(),
        ),
        ("flush", 2 | 3) => {
            cache(|c| *c = Cache::default());
            Frame::ok()
        }
        ("kill", 2) => match running(|r| r.as_ref().map(|r| r.kill.clone())) {
            Some(kill) => {
                kill.store(true, Ordering::Relaxed);
                Frame::ok()
            }
            None => Frame::error("NOTBUSY No scripts in execution right now."),
        },
        ("help", 2) => Frame::Array(
            [
                "SCRIPT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "EXISTS <sha1> [<sha1> ...]",
                "FLUSH [ASYNC|SYNC]",
                "KILL",
                "LOAD <script>",
            ]
            .iter()
            .map(|line| Frame::Simple(line.as_bytes().to_vec()))
            .collect(),
        ),
        ("load" | "exists" | "flush" | "kill", _) => {
            Frame::error(&format!("ERR wrong number of arguments for 'script|{sub}' command"))
        }
        _ => Frame::error(&format!(
            "ERR unknown subcommand '{}'. Try SCRIPT HELP.",
            sub.chars().take(64).collect::<String>()
        )),
    }
}

/// What a script needs of its connection, taken before it runs (the run outlives the
/// borrow of the connection).
struct Context {
    node: KeyspaceHandle,
    client: ClientId,
    db: u8,
    limits: Limits,
    /// Where each `SELECT` index leads (`MOVE` and `COPY ... DB` inside a script).
    selects: Vec<Option<(KeyspaceId, u8)>>,
    may_read: bool,
    may_write: bool,
    read_only: bool,
    after: LogIndex,
    floor: Floor,
    /// A deduplication pair for each attempt's write-back.
    pairs: Vec<(ClientId, RequestId)>,
}

/// `EVAL script numkeys key... arg...` (and `EVALSHA`, the `_RO` forms).
async fn eval(conn: &mut Conn, words: Vec<Bytes>, source: Bytes, read_only: bool) -> Pending {
    let protocol = conn.protocol;
    let name = String::from_utf8_lossy(&words[0]).to_ascii_lowercase();
    if words.len() < 3 {
        return Pending::ready(wrong_arity(&name), protocol);
    }
    let numkeys = match std::str::from_utf8(&words[2]).ok().and_then(|w| w.parse::<i64>().ok()) {
        Some(n) if n < 0 => {
            return Pending::ready(Frame::error("ERR Number of keys can't be negative"), protocol)
        }
        Some(n) if n as usize > words.len() - 3 => {
            let text = "ERR Number of keys can't be greater than number of args";
            return Pending::ready(Frame::error(text), protocol);
        }
        Some(n) => n as usize,
        None => {
            let text = "ERR value is not an integer or out of range";
            return Pending::ready(Frame::error(text), protocol);
        }
    };
    let sha = lua::sha1_hex(&source);
    if !name.starts_with("evalsha") {
        cache(|c| c.insert(sha.clone(), source.clone()));
    }
    let keys = words[3..3 + numkeys].to_vec();
    let args = words[3 + numkeys..].to_vec();
    let ks = conn.node.id;
    conn.order_through_loop(Kind::Write(ks)).await;
    let context = Context {
        node: conn.node.clone(),
        client: conn.client,
        db: conn.db,
        limits: conn.limits.clone(),
        selects: (0..DATABASES).map(|index| select(conn, index)).collect(),
        may_read: permitted(conn, Some(Category::Read)).is_ok(),
        may_write: permitted(conn, Some(Category::Write)).is_ok(),
        read_only,
        after: conn.resolved.floor(ks),
        floor: conn.floor(),
        pairs: (0..ATTEMPTS_MAX).map(|_| conn.next_pair()).collect(),
    };
    let job = move |kill: Arc<AtomicBool>, calls| Job {
        source: source.clone(),
        sha: sha.clone(),
        keys: keys.clone(),
        args: args.clone(),
        kill,
        calls,
    };
    Pending::later(Box::pin(run(context, job)), protocol)
}

/// Runs the script until one attempt's write-back is applied (or nothing needs one).
async fn run(
    context: Context,
    job: impl Fn(Arc<AtomicBool>, tokio::sync::mpsc::Sender<Call>) -> Job,
) -> Frame {
    let _gate = GATE.lock().await;
    let kill = Arc::new(AtomicBool::new(false));
    running(|r| {
        *r = Some(Running { client: context.client, since: Instant::now(), kill: kill.clone() })
    });
    let _running = RunningGuard;
    for (attempt, pair) in context.pairs.iter().enumerate() {
        if attempt > 0 {
            tokio::time::sleep(backoff(attempt)).await;
        }
        let (calls, mut asked) = tokio::sync::mpsc::channel::<Call>(1);
        let lua = tokio::task::spawn_blocking({
            let job = job(kill.clone(), calls);
            move || lua::run(job)
        });
        let mut copy = Copy::new(crate::driver::wall_ms());
        while let Some(call) = asked.recv().await {
            let frame = copy.call(&context, call.words).await;
            let _ = call.reply.send(frame);
        }
        let frame =
            lua.await.unwrap_or_else(|_| Frame::error("ERR internal: the script's thread failed"));
        if kill.load(Ordering::Relaxed) {
            return Frame::error(lua::KILLED);
        }
        let (ops, mut watch) = copy.write_back();
        if context.node.unsafe_script_skip_watch {
            watch.clear(); // the negative control: nothing checks what the script read
        }
        // Nothing written and at most one key read: that read was atomic by itself.
        if ops.is_empty() && watch.len() <= 1 {
            return frame;
        }
        let command = Command::Multi { ops, watch };
        if let Err(e) = command.validate(&context.limits) {
            return error_frame(&e);
        }
        let (client, request) = *pair;
        let (after, mode) = (context.after, OpMode::Plain);
        let submit = Submit {
            client,
            request,
            command,
            durability: None,
            level: None,
            after,
            mode,
            named: false,
        };
        let answer = context.node.send(submit).answer().await;
        context.floor.note(&answer);
        match answer.and_then(|r| r.result) {
            Ok(CommandResult::Multi { results: Some(_) }) => {
                super::collections::wake_blocked();
                return frame;
            }
            Ok(CommandResult::Multi { results: None }) => continue, // a key changed: again
            Ok(_) => return super::mismatched("script write-back"),
            Err(e) => return error_frame(&e),
        }
    }
    Frame::error(&format!(
        "ERR the keys this script reads changed under each of its {ATTEMPTS_MAX} runs; try again"
    ))
}

/// One run's private copy of the keys it touched.
struct Copy {
    kv: Kv,
    /// The database the script's commands name keys in (`SELECT` inside it changes it,
    /// not the connection's).
    db: Option<u8>,
    /// Each key read, with its image and version as read.
    read: BTreeMap<Key, (Option<Bytes>, Option<Version>)>,
    /// The script's one time (unix milliseconds).
    now_ms: u64,
}

impl Copy {
    fn new(now_ms: u64) -> Copy {
        Copy { kv: Kv::new(1), db: None, read: BTreeMap::new(), now_ms }
    }

    /// One `redis.call`: its reply, from the copy.
    async fn call(&mut self, context: &Context, words: Vec<Bytes>) -> Frame {
        let not_allowed = || Frame::error("ERR This Redis command is not allowed from script");
        let command = match keel_wire::command::parse(words, &context.limits) {
            Ok(command) => command,
            Err(e) => return e.reply_frame(),
        };
        let select = |index: u32| context.selects.get(index as usize).copied().flatten();
        if let keel_wire::ClientCommand::Select { index } = command {
            return match select(index) {
                Some((ks, db)) if ks == context.node.id => {
                    self.db = Some(db);
                    Frame::ok()
                }
                Some(_) => {
                    Frame::error("ERR SELECT inside a script stays in the connection's keyspace")
                }
                None => keel_wire::CommandError::DbIndexOutOfRange.reply_frame(),
            };
        }
        let db = self.db.unwrap_or(context.db);
        let command = match in_database_of(command, db, context.node.id, &select) {
            Ok(command) => command,
            Err(refusal) => return refusal,
        };
        if !transactable(&command) {
            return not_allowed();
        }
        match category(&command) {
            Some(Category::Write) if context.read_only => {
                return Frame::error("ERR Write commands are not allowed from read-only scripts.")
            }
            Some(Category::Write) if !context.may_write => return no_permission("write"),
            Some(Category::Read) if !context.may_read => return no_permission("read"),
            Some(Category::Admin) => return not_allowed(),
            _ => {}
        }
        let mut ops = Vec::new();
        let (shape, _) = Shape::of(command, &mut ops);
        let shape = match shape {
            Shape::Deferred(keel_wire::ClientCommand::Time) => return super::server::time_frame(),
            Shape::Deferred(_) => return not_allowed(),
            shape => shape,
        };
        if ops.is_empty() {
            return shape.frame(&[]);
        }
        for op in &ops {
            for key in keys_of(op) {
                if let Err(e) = self.read_key(context, key).await {
                    return error_frame(&e);
                }
            }
        }
        let multi =
            keel_core::leader::stamp_time(Command::Multi { ops, watch: Vec::new() }, self.now_ms);
        let index = self.kv.applied_index().next();
        let entry = Entry {
            epoch: Epoch(1),
            index,
            payload: EntryPayload::Write {
                client: ClientId(1),
                request: RequestId(index.0),
                durability: Durability::Memory,
                command: multi,
            },
        };
        match self.kv.apply(&entry) {
            Applied::Write(Ok(CommandResult::Multi { results: Some(results) })) => {
                shape.frame(&results)
            }
            Applied::Write(Ok(_)) => super::mismatched("script command"),
            Applied::Write(Err(e)) => error_frame(&e),
            Applied::Noop => super::mismatched("script command"),
        }
    }

    /// Reads `key` whole from the leader into the copy, once.
    async fn read_key(
        &mut self,
        context: &Context,
        key: &Key,
    ) -> Result<(), keel_types::KeelError> {
        if self.read.contains_key(key) {
            return Ok(());
        }
        let fetch = Command::Fetch { key: key.clone() };
        let level = Some(ReadLevel::Linearizable);
        let submit = super::plain_submit(ClientId(1), RequestId(1), fetch, level, context.after);
        let (image, version) = match context.node.send(submit).answer().await?.result? {
            CommandResult::Image { image, version } => (image, version),
            _ => {
                return Err(keel_types::KeelError::Unavailable("a fetch read another kind".into()))
            }
        };
        // The copy's own versions count from 1; a key never written reads as version 0.
        let loaded = version.unwrap_or(Version::new(0, 0));
        self.kv.load(key.clone(), image.as_deref(), loaded)?;
        self.read.insert(key.clone(), (image, version));
        Ok(())
    }

    /// The write-back: a restore or delete of each key whose item changed, and every key
    /// read with the version it had.
    fn write_back(self) -> (Vec<Command>, Vec<(Key, Option<Version>)>) {
        let mut ops = Vec::new();
        let mut watch = Vec::with_capacity(self.read.len());
        for (key, (before, version)) in self.read {
            let after = self.kv.image(&key).0;
            if after != before {
                ops.push(match after {
                    Some(image) => Command::Restore { key: key.clone(), image },
                    None => Command::Delete { key: key.clone() },
                });
            }
            watch.push((key, version));
        }
        (ops, watch)
    }
}

/// A random pause below `min(2^attempt, BACKOFF_MAX_MS)` milliseconds.
fn backoff(attempt: usize) -> std::time::Duration {
    use ring::rand::SecureRandom;
    let bound = (1u64 << attempt.min(16)).min(BACKOFF_MAX_MS);
    let mut draw = [0u8; 8];
    let _ = ring::rand::SystemRandom::new().fill(&mut draw);
    std::time::Duration::from_micros(u64::from_le_bytes(draw) % (bound * 1000))
}

fn no_permission(what: &str) -> Frame {
    Frame::error(&format!(
        "NOPERM this user has no permissions to run {what} commands in this keyspace"
    ))
}

/// Every key `op` reads or writes.
fn keys_of(op: &Command) -> Vec<&Key> {
    match op {
        Command::Transfer { from, to, .. } => vec![from, to],
        Command::Coll { key, op } => std::iter::once(key).chain(op.other_keys()).collect(),
        Command::CollRead { key, op } => std::iter::once(key).chain(op.other_keys()).collect(),
        other => vec![other.key()],
    }
}
