//! A geo keyspace's sessions (`docs/geo.md`, *Using it*): interactive causal
//! transactions, the uniform barrier and attach, with the session's past vector kept by
//! the connection.
//!
//! - `KEEL.TX.BEGIN [CAUSAL | STRONG [LABEL name]]`: opens a transaction on a snapshot
//!   that includes the session's past; `+OK`. A strong one (with `[geo] strong = true`)
//!   is certified at its commit against the strong transactions its label conflicts
//!   with, and is answered `-CONFLICT ...` if it missed one.
//! - inside it, reads and updates of the objects a key names, each answered at once:
//!   `GET`/`SET` (a last-writer-wins register), `INCR`/`DECR`/`INCRBY`/`DECRBY` (a
//!   counter; the reply is its value after), `SADD`/`SREM`/`SMEMBERS`/`SISMEMBER`/`SCARD`
//!   (an add-wins set), `KEEL.TX.MAX key n` (a max register), `KEEL.TX.GADD key element`
//!   (a grow-only set), `KEEL.TX.READ <register|counter|max|gset|set> key` (any object);
//! - `KEEL.TX.COMMIT`: commits (a causal one never aborts) and answers the session's new
//!   past vector;
//!   `KEEL.TX.ABORT` drops the transaction;
//! - `KEEL.BARRIER`: answers once everything the session observed is uniform (survives
//!   the failure of any f data centers);
//! - `KEEL.PAST`: the session's past vector (its data centers' entries, the strong entry
//!   last); `KEEL.ATTACH <entries...>` brings a past vector from another data center and
//!   answers once this one's uniform snapshot covers it, then joins it into the session's.
//!
//! A geo session runs one request at a time: each waits for its reply before the next is
//! read, so the session's vector and open transaction are the connection's alone.

use super::acl::permitted;
use crate::acl::Category;
use crate::front_door::conn::{Conn, Kind as Order, Pending};
use bytes::Bytes;
use keel_core::engine::EngineKind;
use keel_types::geo::{GeoOp, GeoResult, Kind, Object, TxId, Update, Vector};
use keel_types::{Command, CommandResult, KeyspaceId, RequestId};
use keel_wire::reply::{error_frame, geo_frame, vector_frame};
use keel_wire::resp::Frame;
use std::collections::BTreeMap;

/// One connection's geo session: its past vector per geo keyspace, and the transaction
/// it has open.
#[derive(Debug, Default)]
pub(crate) struct GeoSession {
    past: BTreeMap<KeyspaceId, Vector>,
    open: Option<(KeyspaceId, TxId)>,
    /// The open transaction's snapshot: what it read is in the session's past once it
    /// ends, committed or not.
    snap: Option<Vector>,
}

impl GeoSession {
    /// The transaction the session has open, if any: its keyspace and id.
    pub(crate) fn open(&self) -> Option<(KeyspaceId, TxId)> {
        self.open
    }
}

/// Drops `tx` of keyspace `handle` without waiting for the answer (a connection that
/// closed with its transaction open: the engine's time-out would drop it too, later).
pub(crate) fn abandon(
    handle: &crate::driver::KeyspaceHandle,
    client: keel_types::ClientId,
    tx: TxId,
) {
    let abort = GeoOp::Abort { tx };
    drop(handle.send(super::plain_submit(client, RequestId(0), Command::Geo(abort), None, ZERO)));
}

/// A geo operation carries no session floor: its session's past vector orders it.
const ZERO: keel_types::LogIndex = keel_types::LogIndex::ZERO;

/// The session commands, by first word (lowercase).
const SESSION_WORDS: [&str; 9] = [
    "keel.tx.begin",
    "keel.tx.commit",
    "keel.tx.abort",
    "keel.tx.read",
    "keel.tx.max",
    "keel.tx.gadd",
    "keel.barrier",
    "keel.attach",
    "keel.past",
];

/// The data commands a geo transaction takes, by first word (lowercase).
const TX_WORDS: [&str; 11] = [
    "get",
    "set",
    "incr",
    "decr",
    "incrby",
    "decrby",
    "sadd",
    "srem",
    "smembers",
    "sismember",
    "scard",
];

/// Serves `words` if they are a geo session's request (`Err` gives them back for the other
/// families): the session commands anywhere (refused outside a geo keyspace), and data
/// commands while a transaction is open.
pub(crate) async fn route(conn: &mut Conn, words: Vec<Bytes>) -> Result<Pending, Vec<Bytes>> {
    let first = words.first().map(|w| w.to_ascii_lowercase()).unwrap_or_default();
    let first = std::str::from_utf8(&first).unwrap_or("");
    let session_word = SESSION_WORDS.contains(&first);
    let in_tx =
        conn.geo.open.is_some_and(|(ks, _)| ks == conn.node.id) && TX_WORDS.contains(&first);
    if !session_word && !in_tx {
        return Err(words);
    }
    let protocol = conn.protocol;
    if conn.node.kind != EngineKind::Geo {
        let text = format!(
            "ERR {} needs a geo keyspace (keyspace {} runs {})",
            first.to_ascii_uppercase(),
            conn.node.id.0,
            conn.node.kind
        );
        return Ok(Pending::ready(Frame::error(&text), protocol));
    }
    let frame = match serve(conn, first, &words).await {
        Ok(frame) => frame,
        Err(frame) => frame,
    };
    Ok(Pending::ready(frame, protocol))
}

/// A refusal, as the reply.
fn refuse(text: &str) -> Frame {
    Frame::error(text)
}

fn arity(name: &str) -> Frame {
    refuse(&format!("ERR wrong number of arguments for '{name}' command"))
}

/// One session request to its reply.
async fn serve(conn: &mut Conn, first: &str, words: &[Bytes]) -> Result<Frame, Frame> {
    let args = &words[1..];
    match first {
        "keel.tx.begin" => begin(conn, args).await,
        "keel.tx.commit" | "keel.tx.abort" => finish(conn, first == "keel.tx.commit").await,
        "keel.barrier" | "keel.attach" => sync(conn, first, args).await,
        "keel.past" => match conn.geo.past.get(&conn.node.id) {
            Some(past) => Ok(vector_frame(past)),
            None => Ok(Frame::Array(Vec::new())),
        },
        _ => {
            let (tx_ks, tx) = conn.geo.open.ok_or_else(|| {
                refuse(&format!("ERR {} outside a transaction", first.to_ascii_uppercase()))
            })?;
            if tx_ks != conn.node.id {
                return Err(refuse("ERR the open transaction is another keyspace's: SELECT it"));
            }
            let reply = operate(conn, tx, first, args).await;
            if let Err(Frame::Error(line)) = &reply {
                // The engine no longer holds it: the connection's is gone too.
                if String::from_utf8_lossy(line).contains(keel_types::geo::TX_GONE) {
                    conn.geo.open = None;
                    if let Some(snap) = conn.geo.snap.take() {
                        join(conn.geo.past.entry(tx_ks).or_default(), &snap);
                    }
                }
            }
            reply
        }
    }
}

/// Sends `op` for the session, after every earlier request of the connection is
/// answered, and waits for its result.
async fn send(conn: &mut Conn, op: GeoOp, category: Category) -> Result<GeoResult, Frame> {
    permitted(conn, Some(category))?;
    op.validate(&conn.limits).map_err(|e| error_frame(&e))?;
    conn.order(Order::Write(conn.node.id)).await;
    let (client, request) = conn.next_pair();
    let submit = super::plain_submit(client, request, Command::Geo(op), None, ZERO);
    let reply = conn.node.submit(submit).await.and_then(|r| r.result);
    match reply {
        Ok(CommandResult::Geo(result)) => Ok(result),
        Ok(_) => Err(super::mismatched("geo operation")),
        Err(e) => Err(error_frame(&e)),
    }
}

/// `KEEL.TX.BEGIN [CAUSAL | STRONG [LABEL name]]`.
async fn begin(conn: &mut Conn, args: &[Bytes]) -> Result<Frame, Frame> {
    let word = |a: &Bytes, w: &[u8]| a.eq_ignore_ascii_case(w);
    let strong = match args {
        [] => None,
        [mode] if word(mode, b"causal") => None,
        [mode] if word(mode, b"strong") => Some(None),
        [mode, label, name] if word(mode, b"strong") && word(label, b"label") => {
            let name = std::str::from_utf8(name)
                .map_err(|_| refuse("ERR a transaction label must be UTF-8"))?;
            Some(Some(name.to_owned()))
        }
        _ => return Err(refuse("ERR syntax error: KEEL.TX.BEGIN [CAUSAL | STRONG [LABEL name]]")),
    };
    if conn.geo.open.is_some() {
        return Err(refuse("ERR a transaction is already open: KEEL.TX.COMMIT or KEEL.TX.ABORT"));
    }
    let past = conn.geo.past.get(&conn.node.id).cloned().unwrap_or_default();
    let op = match strong {
        None => GeoOp::Begin { past },
        Some(label) => GeoOp::BeginStrong { past, label },
    };
    match send(conn, op, Category::Read).await? {
        GeoResult::Began { tx, snap } => {
            conn.geo.open = Some((conn.node.id, tx));
            conn.geo.snap = Some(snap);
            Ok(Frame::ok())
        }
        _ => Err(super::mismatched("KEEL.TX.BEGIN")),
    }
}

/// `KEEL.TX.COMMIT` (`commit`) or `KEEL.TX.ABORT`. The transaction is closed whatever
/// the answer: a commit the engine refused (a transaction dropped past its time-out) is
/// gone too.
async fn finish(conn: &mut Conn, commit: bool) -> Result<Frame, Frame> {
    let Some((ks, tx)) = conn.geo.open else {
        let name = if commit { "KEEL.TX.COMMIT" } else { "KEEL.TX.ABORT" };
        return Err(refuse(&format!("ERR {name} without KEEL.TX.BEGIN")));
    };
    if ks != conn.node.id {
        return Err(refuse("ERR the open transaction is another keyspace's: SELECT it"));
    }
    conn.geo.open = None;
    // Whatever the outcome (an abort, a commit that timed out), the session read on the
    // snapshot: its past holds it.
    if let Some(snap) = conn.geo.snap.take() {
        join(conn.geo.past.entry(ks).or_default(), &snap);
    }
    let op = if commit { GeoOp::Commit { tx } } else { GeoOp::Abort { tx } };
    // Each update was checked against the user's permissions when it was made: a
    // read-only user commits its read-only transactions.
    match send(conn, op, Category::Read).await? {
        GeoResult::Committed { vector } => {
            let past = conn.geo.past.entry(ks).or_default();
            join(past, &vector);
            Ok(vector_frame(past))
        }
        GeoResult::Aborted => Ok(Frame::ok()),
        _ => Err(super::mismatched("KEEL.TX.COMMIT")),
    }
}

/// `KEEL.BARRIER` and `KEEL.ATTACH <entries...>`.
async fn sync(conn: &mut Conn, first: &str, args: &[Bytes]) -> Result<Frame, Frame> {
    if conn.geo.open.is_some() {
        return Err(refuse(&format!(
            "ERR {} inside a transaction: commit it first",
            first.to_ascii_uppercase()
        )));
    }
    let ks = conn.node.id;
    let mine = conn.geo.past.get(&ks).cloned().unwrap_or_default();
    let op = if first == "keel.barrier" {
        if !args.is_empty() {
            return Err(arity("keel.barrier"));
        }
        GeoOp::Barrier { past: mine }
    } else {
        GeoOp::Attach { past: parse_vector(args)? }
    };
    let brought = match &op {
        GeoOp::Attach { past } => Some(past.clone()),
        _ => None,
    };
    match send(conn, op, Category::Read).await? {
        GeoResult::Synced => {
            if let Some(brought) = brought {
                join(conn.geo.past.entry(ks).or_default(), &brought);
            }
            Ok(Frame::ok())
        }
        _ => Err(super::mismatched(first)),
    }
}

/// A vector as `KEEL.PAST` shows it: each data center's entry, the strong entry last.
fn parse_vector(args: &[Bytes]) -> Result<Vector, Frame> {
    let syntax =
        || refuse("ERR KEEL.ATTACH takes a past vector: its entries as KEEL.PAST gives them");
    if args.len() < 2 || args.len() > keel_core::geo::DCS_MAX + 1 {
        return Err(syntax());
    }
    let mut entries = Vec::with_capacity(args.len());
    for arg in args {
        entries.push(super::parse_u64(arg).ok_or_else(syntax)?);
    }
    let strong = entries.pop().expect("at least two");
    Ok(Vector { dcs: entries, strong })
}

/// Raises `past` to `other` (a session with no past takes `other` as it is).
fn join(past: &mut Vector, other: &Vector) {
    if past.dcs.is_empty() {
        *past = other.clone();
    } else if past.dcs.len() == other.dcs.len() {
        past.join(other);
    }
}

/// A read or an update inside transaction `tx`.
async fn operate(conn: &mut Conn, tx: TxId, first: &str, args: &[Bytes]) -> Result<Frame, Frame> {
    let key = |i: usize| args.get(i).cloned().ok_or_else(|| arity(first));
    let int = |i: usize| -> Result<i64, Frame> {
        let word = args.get(i).ok_or_else(|| arity(first))?;
        std::str::from_utf8(word)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| refuse("ERR value is not an integer or out of range"))
    };
    let exact = |n: usize| if args.len() == n { Ok(()) } else { Err(arity(first)) };
    let read = |key: Bytes, kind: Kind| GeoOp::Read { tx, key, kind };
    let update = |key: Bytes, update: Update| GeoOp::Update { tx, key, update };
    let result = match first {
        "get" => exact(1).and(Ok(read(key(0)?, Kind::Register))),
        "set" => exact(2).and(Ok(update(key(0)?, Update::Set(key(1)?)))),
        "incr" => exact(1).and(Ok(update(key(0)?, Update::Add(1)))),
        "decr" => exact(1).and(Ok(update(key(0)?, Update::Add(-1)))),
        "incrby" => exact(2).and(Ok(update(key(0)?, Update::Add(int(1)?)))),
        "decrby" => {
            let n = int(1)?.checked_neg().ok_or_else(|| refuse("ERR decrement would overflow"))?;
            exact(2).and(Ok(update(key(0)?, Update::Add(n))))
        }
        "keel.tx.max" => exact(2).and(Ok(update(key(0)?, Update::Max(int(1)?)))),
        "keel.tx.gadd" => exact(2).and(Ok(update(key(0)?, Update::GAdd(key(1)?)))),
        "smembers" | "scard" => exact(1).and(Ok(read(key(0)?, Kind::AwSet))),
        "sismember" => exact(2).and(Ok(read(key(0)?, Kind::AwSet))),
        "keel.tx.read" => exact(2).and(Ok(read(key(1)?, kind_named(&args[0])?))),
        "sadd" | "srem" => return members(conn, tx, first == "sadd", args).await,
        _ => unreachable!("{first} is a transaction word"),
    }?;
    let category = if result.is_write() { Category::Write } else { Category::Read };
    let frame = match send(conn, result, category).await? {
        GeoResult::Object(Object::AwSet(set)) if first == "scard" => {
            Frame::Integer(set.len() as i64)
        }
        GeoResult::Object(Object::AwSet(set)) if first == "sismember" => {
            Frame::Integer(i64::from(set.contains_key(&args[1])))
        }
        GeoResult::Object(Object::Register(_)) if first == "set" => Frame::ok(),
        GeoResult::Object(_) if first == "keel.tx.gadd" => Frame::ok(),
        result => geo_frame(&result),
    };
    Ok(frame)
}

/// `SADD`/`SREM key member [member ...]`: the set read, then one update per member that
/// changes it; the reply counts them, as Redis's does.
async fn members(conn: &mut Conn, tx: TxId, add: bool, args: &[Bytes]) -> Result<Frame, Frame> {
    let name = if add { "sadd" } else { "srem" };
    let [key, members @ ..] = args else { return Err(arity(name)) };
    if members.is_empty() {
        return Err(arity(name));
    }
    let read = GeoOp::Read { tx, key: key.clone(), kind: Kind::AwSet };
    let GeoResult::Object(Object::AwSet(mut set)) = send(conn, read, Category::Read).await? else {
        return Err(super::mismatched(name));
    };
    let mut changed = 0;
    for member in members {
        if set.contains_key(member) == add {
            continue;
        }
        let update = if add {
            Update::SAdd(member.clone())
        } else {
            // The engine fills in the adds the transaction saw.
            Update::SRem(member.clone(), Vec::new())
        };
        let op = GeoOp::Update { tx, key: key.clone(), update };
        if let GeoResult::Object(Object::AwSet(after)) = send(conn, op, Category::Write).await? {
            set = after;
        }
        changed += 1;
    }
    Ok(Frame::Integer(changed))
}

/// An object kind by the name `KEEL.TX.READ` takes.
fn kind_named(word: &[u8]) -> Result<Kind, Frame> {
    let names = [("register", Kind::Register), ("counter", Kind::Counter), ("max", Kind::Max)];
    let more = [("gset", Kind::GSet), ("set", Kind::AwSet)];
    names
        .iter()
        .chain(more.iter())
        .find(|(name, _)| word.eq_ignore_ascii_case(name.as_bytes()))
        .map(|(_, kind)| *kind)
        .ok_or_else(|| refuse("ERR KEEL.TX.READ <register|counter|max|gset|set> <key>"))
}
