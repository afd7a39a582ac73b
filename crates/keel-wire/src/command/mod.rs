//! Client commands: from a decoded request (an array of bulk strings) to a typed
//! [`ClientCommand`], or a [`CommandError`] worded as Redis words it.
//!
//! Layout:
//! - this file: [`ClientCommand`] and its parts, [`Operations`] (what a data command
//!   asks of the engine), [`CommandError`] and the limits.
//! - `parse`: one parser per command name, and [`parse()`] / [`parse_frame()`].
//!
//! Command names and option words are case-insensitive. Keel's options are extra words
//! after the Redis arguments (`GET k LEVEL monotonic`, `SET k v DURABILITY durable`), so
//! Redis clients work unchanged for the commands they know. `docs/wire.md` has the table.
//!
//! Spelling of special arguments:
//! - `KEEL.CAS key expected new`: `expected` is `-nil` when the key must be absent. An
//!   argument starting with `--` stands for itself less its first `-` (`--nil` is the
//!   value `-nil`, `---x` is `--x`); any other argument is the value itself.
//! - `KEEL.SCAN start end`: `end` is `+inf` to scan to the end of the keyspace; an
//!   argument starting with `++` stands for itself less its first `+`.

pub mod colls;
mod parse;
pub mod table;

pub use parse::{parse, parse_frame};

use crate::resp::{Frame, Protocol};
use bytes::Bytes;
pub use keel_core::engine::OpMode;
use keel_types::level::UnknownName;
use keel_types::{Command, Durability, ExpireCond, KeelError, Key, ReadLevel, SetCond, Ttl, Value};

/// Items a `KEEL.SCAN` returns when it names no `COUNT`.
pub const SCAN_COUNT_DEFAULT: u32 = 10;
/// Longest command name shown back in an "unknown command" error, in bytes (as Redis).
pub const ERROR_NAME_BYTES_MAX: usize = 128;
/// Most bytes of arguments shown back in an "unknown command" error (as Redis).
pub const ERROR_ARGS_BYTES_MAX: usize = 128;

/// A parsed client request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientCommand {
    /// `PING [message]`: `+PONG`, or the message as a bulk string.
    Ping {
        /// The message to echo, if any.
        message: Option<Bytes>,
    },
    /// `ECHO message`.
    Echo {
        /// The message to echo.
        message: Bytes,
    },
    /// `HELLO [protover [AUTH username password] [SETNAME name]]`.
    Hello {
        /// The protocol asked for; `None` keeps the current one.
        protocol: Option<Protocol>,
        /// `(username, password)` if given.
        auth: Option<(Bytes, Bytes)>,
        /// The connection's new name, if given.
        client_name: Option<Bytes>,
    },
    /// `GET key [LEVEL level] [WITHVERSION] [ACQUIRE]`.
    Get {
        /// The key read.
        key: Key,
        /// The read level; `None`: the keyspace default.
        level: Option<ReadLevel>,
        /// Whether the reply carries the version read.
        with_version: bool,
        /// [`OpMode::Acquire`] with `ACQUIRE` (Kite keyspaces), else plain.
        mode: OpMode,
    },
    /// `SET key value [DURABILITY durability] [WITHVERSION] [RELEASE]`.
    Set {
        /// The key written.
        key: Key,
        /// The value written.
        value: Value,
        /// When to acknowledge; `None`: the keyspace default.
        durability: Option<Durability>,
        /// Whether the reply carries the version created.
        with_version: bool,
        /// [`OpMode::Release`] with `RELEASE` (Kite keyspaces), else plain.
        mode: OpMode,
        /// Redis's options (`NX`, `XX`, `GET`, `EX` and its kin, `KEEPTTL`), and the
        /// forms `SETNX`, `SETEX`, `PSETEX` and `GETSET` stand for.
        options: SetOptions,
    },
    /// `EXPIRE`, `PEXPIRE`, `EXPIREAT`, `PEXPIREAT key time [NX|XX|GT|LT]`; `PERSIST key`
    /// (`ttl` clear, only if one is set): `1` if the expiry was set (or cleared).
    Expire {
        /// The key.
        key: Key,
        /// The new expiry (milliseconds, relative or unix time) or none.
        ttl: Ttl,
        /// When to set it.
        cond: ExpireCond,
        /// When to acknowledge (`DURABILITY`); `None`: the keyspace default.
        durability: Option<Durability>,
    },
    /// `TTL`, `PTTL`, `EXPIRETIME`, `PEXPIRETIME key [LEVEL level]`: `-2` for an absent
    /// key, `-1` for one without an expiry, else the time left or the time it expires.
    Ttl {
        /// The key read.
        key: Key,
        /// Which of the four answers.
        form: TtlForm,
        /// The read level; `None`: the keyspace default.
        level: Option<ReadLevel>,
    },
    /// `APPEND`, `SETRANGE`, `SETBIT`, `INCRBYFLOAT`, `GETDEL`, `GETEX`: one key changed in
    /// place by the state machine.
    Modify {
        /// The key changed.
        key: Key,
        /// The change.
        op: keel_types::Modify,
        /// When to acknowledge (`DURABILITY`); `None`: the keyspace default.
        durability: Option<Durability>,
    },
    /// `RENAME` (`+OK`), `RENAMENX`, `COPY` and `MOVE` (`1` or `0`).
    Transfer {
        /// The source.
        from: Key,
        /// The destination.
        to: Key,
        /// Whether an existing destination is overwritten (`RENAME`, `COPY ... REPLACE`).
        replace: bool,
        /// Whether the source goes (a rename).
        remove_source: bool,
        /// Which command: the reply's form, and what an absent source answers.
        form: TransferForm,
        /// `COPY ... DB n`, `MOVE key n`: the destination's database (`None`: the
        /// connection's).
        to_db: Option<u32>,
        /// When to acknowledge (`DURABILITY`); `None`: the keyspace default.
        durability: Option<Durability>,
    },
    /// `STRLEN`, `GETRANGE`/`SUBSTR`, `GETBIT`, `BITCOUNT`, `TYPE`: one key read, the reply
    /// computed from its value.
    ReadString {
        /// The key read.
        key: Key,
        /// What is computed.
        op: StringRead,
        /// The read level (`LEVEL`); `None`: the keyspace default.
        level: Option<ReadLevel>,
    },
    /// `MSET key value [key value ...]`: every pair written as one transaction;
    /// `MSETNX`: all of them only if none of the keys exists (`1`), else none (`0`).
    MSet {
        /// The pairs, at least one, at most `keel_types::MULTI_OPS_MAX`.
        pairs: Vec<(Key, Value)>,
        /// `MSETNX`.
        only_new: bool,
    },
    /// `LCS key1 key2 [LEN] [IDX [MINMATCHLEN n] [WITHMATCHLEN]]`: the longest common
    /// subsequence of two strings, or its length, or the matching ranges.
    Lcs {
        /// The first key read.
        a: Key,
        /// The second key read.
        b: Key,
        /// What is answered.
        form: LcsForm,
    },
    /// `RANDOMKEY`: a key of the connection's database, or null when it has none.
    RandomKey,
    /// `TIME`: the serving node's clock, `[seconds, microseconds]`.
    Time,
    /// `DEBUG SLEEP seconds`: the connection answers `+OK` after that long.
    DebugSleep(std::time::Duration),
    /// `DEL key [key ...]`: the number of keys that existed.
    Del {
        /// The keys removed, at least one.
        keys: Vec<Key>,
    },
    /// `EXISTS key [key ...]`: how many of the keys exist (repeats count again).
    Exists {
        /// The keys checked, at least one.
        keys: Vec<Key>,
    },
    /// `INCR`, `INCRBY`, `DECR`, `DECRBY`: add `delta` to the key's integer value;
    /// `KEEL.FAA key delta`: the same, answering the value before.
    Incr {
        /// The key changed.
        key: Key,
        /// The amount added (negative for the DECR forms).
        delta: i64,
        /// `KEEL.FAA`: the reply is the value before the addition.
        fetch: bool,
    },
    /// `MGET key [key ...] [LEVEL level]`. `LEVEL` is an option only when it is the
    /// second-to-last word and at least one key precedes it.
    MGet {
        /// The keys read, at least one.
        keys: Vec<Key>,
        /// The read level; `None`: the keyspace default.
        level: Option<ReadLevel>,
    },
    /// `KEEL.CAS key expected|-nil new [DURABILITY durability] [WEAK|STRONG]`.
    Cas {
        /// The key compared and written.
        key: Key,
        /// The value the key must hold; `None` (spelled `-nil`): the key must be absent.
        expected: Option<Value>,
        /// The value written if the comparison holds.
        new: Value,
        /// When to acknowledge; `None`: the keyspace default.
        durability: Option<Durability>,
        /// [`OpMode::Weak`] or [`OpMode::Strong`] when named (Kite keyspaces), else plain.
        mode: OpMode,
    },
    /// `KEEL.SCAN start end|+inf [COUNT n] [LEVEL level]`: keys in `[start, end)`.
    Scan {
        /// The first key included.
        start: Key,
        /// The first key excluded; `None` (spelled `+inf`): to the end.
        end: Option<Key>,
        /// The most items returned, in `1..=Limits::scan_items_max`.
        count: u32,
        /// The read level; `None`: the keyspace default.
        level: Option<ReadLevel>,
    },
    /// `KEEL.ENQUEUE queue value [DURABILITY durability]`: appends to a replicated FIFO
    /// queue; `[seq, length]`.
    Enqueue {
        /// The queue's name.
        queue: Key,
        /// The element appended.
        value: Value,
        /// When to acknowledge; `None`: the keyspace default.
        durability: Option<Durability>,
    },
    /// `KEEL.DEQUEUE queue [DURABILITY durability]`: removes the head;
    /// `[seq, value, remaining]`, or null when the queue is empty.
    Dequeue {
        /// The queue's name.
        queue: Key,
        /// When to acknowledge; `None`: the keyspace default.
        durability: Option<Durability>,
    },
    /// `KEEL.QPEEK queue [LEVEL level]`: the queue's head, length and next sequence
    /// number, `[seq, value, length, next]` (seq and value null when empty).
    QueuePeek {
        /// The queue's name.
        queue: Key,
        /// The read level; `None`: the keyspace default.
        level: Option<ReadLevel>,
    },
    /// `FLUSHDB [ASYNC|SYNC]` (`all: false`) and `FLUSHALL [ASYNC|SYNC]`: deletes every
    /// key of the connection's database, or of every database of its keyspace.
    Flush {
        /// `FLUSHALL`.
        all: bool,
    },
    /// `KEEL.NODE ADD|PROMOTE|REMOVE|TRANSFER-LEADER id`: changes the membership of the
    /// connection's keyspace by one node (through its log), or moves its leadership.
    Node {
        /// The change.
        op: keel_types::ClusterOp,
    },
    /// `KEEL.SLOTS ...`: a step of moving hash slots between keyspaces, through the
    /// connection's keyspace's log (`None`: `STATE`, the slot states its replica here
    /// applied).
    Slots {
        /// The step.
        op: Option<keel_types::slots::SlotOp>,
    },
    /// `SWAPDB a b`: exchanges two databases' keys (Redis's numbers, as `SELECT`'s).
    SwapDb {
        /// One database.
        a: u32,
        /// The other.
        b: u32,
    },
    /// `DBSIZE`: the live keys of the connection's database.
    DbSize,
    /// `KEYS pattern`: every key of the connection's database that matches.
    Keys {
        /// A glob pattern (`keel_wire::glob`).
        pattern: Bytes,
    },
    /// `SCAN cursor [MATCH pattern] [COUNT count] [TYPE type]`: a page of the connection's
    /// database's keys from where `cursor` left off (0: the start), and the next cursor
    /// (0: done).
    ScanKeys {
        /// Where the last page left off (0: the start).
        cursor: u64,
        /// Only keys matching this glob.
        pattern: Option<Bytes>,
        /// Keys examined per page (Redis's hint), at least 1.
        count: u32,
        /// Only keys of this type (`string`: all of them; any other: none).
        type_name: Option<Bytes>,
    },
    /// `FUNCTION FLUSH [ASYNC|SYNC]`: Keel runs no functions, so there are none to remove.
    FunctionFlush,
    /// `UNWATCH` (what it parses to inside `MULTI`, where it is queued and answers `OK`).
    Unwatch,
    /// `KEEL.STATUS`: this node's view of the cluster, in the connection's keyspace.
    Status,
    /// `INFO [section ...]`: server information, as Redis's `INFO`.
    Info {
        /// The sections asked for, lowercased; empty: the default sections.
        sections: Vec<String>,
    },
    /// `CLIENT subcommand ...`.
    Client(ClientSubcommand),
    /// A pub/sub command: `SUBSCRIBE`, `PUBLISH`, `PUBSUB ...` and their kin.
    PubSub(PubSubCommand),
    /// `COMMAND [COUNT | DOCS ... | INFO ...]`: what `redis-cli` asks at start-up.
    Command(CommandQuery),
    /// `CONFIG GET parameter ...`: answered with no parameters (what `redis-benchmark`
    /// asks at start-up).
    ConfigGet {
        /// The parameters asked for.
        parameters: Vec<Bytes>,
    },
    /// `CONFIG SET parameter value [parameter value ...]`: names lowercased.
    ConfigSet {
        /// The parameters and their new values, in order.
        pairs: Vec<(String, Bytes)>,
    },
    /// `CONFIG RESETSTAT`: the node's command statistics start again from zero.
    ConfigResetStat,
    /// `SELECT index`: the connection's keyspace from now on (a keyspace the node does
    /// not host is refused by the server with Redis's error).
    Select {
        /// The keyspace id.
        index: u32,
    },
    /// `KEEL.KEYSPACES`: the keyspaces this node hosts, `[id, name, engine]` each.
    Keyspaces,
    /// `QUIT`: reply `+OK` and close.
    Quit,
    /// A collection write (`HSET`, `LPUSH`, `SADD`, `ZADD` and the rest): one
    /// `keel_types::coll::CollOp` on `key`.
    Coll {
        /// The command's name.
        name: &'static str,
        /// The key written (the destination of a `STORE` form, the source of a move).
        key: Key,
        /// The operation.
        op: Box<keel_types::coll::CollOp>,
        /// When to acknowledge (`DURABILITY`); `None`: the keyspace default.
        durability: Option<Durability>,
        /// How the answer is drawn, when not as the state machine gives it.
        reshape: Reshape,
    },
    /// A collection read (`HGET`, `LRANGE`, `SMEMBERS`, `ZRANGE` and the rest).
    CollRead {
        /// The command's name.
        name: &'static str,
        /// The key read (the first of several).
        key: Key,
        /// The operation.
        op: Box<keel_types::coll::CollRead>,
        /// The read level (`LEVEL`); `None`: the keyspace default.
        level: Option<ReadLevel>,
        /// How the answer is drawn.
        reshape: Reshape,
    },
    /// A blocking pop (`BLPOP`, `BRPOP`, `BLMOVE`, `BRPOPLPUSH`, `BLMPOP`, `BZPOPMIN`,
    /// `BZPOPMAX`, `BZMPOP`): `op` once one of its keys holds an element, or null when
    /// `timeout` passes first (`None`: it never does).
    Block {
        /// The command's name.
        name: &'static str,
        /// The first key.
        key: Key,
        /// The pop (`CollOp::MPop` or `CollOp::LMove`).
        op: Box<keel_types::coll::CollOp>,
        /// How long to wait.
        timeout: Option<std::time::Duration>,
        /// When to acknowledge the pop (`DURABILITY`); `None`: the keyspace default.
        durability: Option<Durability>,
        /// How the answer is drawn.
        reshape: Reshape,
    },
}

/// How a collection command's answer becomes its reply, when not as it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reshape {
    /// As it is.
    None,
    /// `+OK` (`HMSET`).
    Ok,
    /// A scan page filtered by `MATCH` (`pairs`: elements come with a value or score).
    Match {
        /// The glob.
        pattern: Bytes,
        /// Whether each element is followed by its value or score.
        pairs: bool,
    },
    /// `BLPOP`/`BRPOP`: `[key, element]` from an `MPop`'s `[key, [element]]`.
    PopOne,
    /// `BZPOPMIN`/`BZPOPMAX`: `[key, member, score]` from `[key, [[member, score]]]`.
    ZPopOne,
    /// `OBJECT REFCOUNT` and `OBJECT IDLETIME` from a `TYPE` answer: this number if the
    /// key exists, else null.
    IfExists(i64),
    /// `OBJECT ENCODING`: the encoding Redis would use for the shape
    /// `keel_types::coll::CollRead::Encoding` answers, by the node's settings.
    Encoding,
}

/// What a [`ClientCommand::ReadString`] computes from a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StringRead {
    /// `STRLEN`: its length.
    Strlen,
    /// `GETRANGE key start end` (`SUBSTR`): the bytes from `start` to `end` inclusive,
    /// negative counting from the end.
    GetRange(i64, i64),
    /// `GETBIT key offset`.
    GetBit(u64),
    /// `BITCOUNT key [start end [BYTE|BIT]]`: `(start, end, in bits)`.
    BitCount(Option<(i64, i64, bool)>),
    /// `TYPE`: `string` or `none`.
    Type,
    /// `BITPOS key bit [start [end [BYTE|BIT]]]`: `(bit, start, end, in bits)`.
    BitPos(bool, Option<(i64, Option<i64>, bool)>),
    /// `OBJECT ENCODING`: what Redis would name the value's encoding after a `SET` of it
    /// (`int`, `embstr`, `raw`); Keel keeps every value as bytes.
    Encoding,
    /// `OBJECT REFCOUNT`: always 1 (no value is shared between keys).
    RefCount,
    /// `OBJECT IDLETIME`: always 0 (Keel tracks no access times).
    IdleTime,
}

/// What a [`ClientCommand::Transfer`] stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransferForm {
    /// `RENAME`: `+OK`; an absent source is an error.
    Rename,
    /// `RENAMENX`: `1` or `0`; an absent source is an error.
    RenameNx,
    /// `COPY`: `1` or `0` (`0` for an absent source).
    Copy,
    /// `MOVE`: `1` or `0` (`0` for an absent source).
    Move,
}

/// What `LCS` answers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LcsForm {
    /// `LEN`: only the length.
    pub len: bool,
    /// `IDX`: the matching ranges, from the strings' ends backwards (as Redis).
    pub idx: bool,
    /// `MINMATCHLEN n`: only ranges at least this long (with `IDX`).
    pub min_match_len: u64,
    /// `WITHMATCHLEN`: each range with its length (with `IDX`).
    pub with_match_len: bool,
}

impl StringRead {
    /// The reply for a key holding `value` (`None`: absent).
    pub fn answer(self, value: Option<&[u8]>) -> Frame {
        let bytes = value.unwrap_or(&[]);
        match self {
            StringRead::Strlen => Frame::Integer(bytes.len() as i64),
            StringRead::Type => {
                Frame::Simple(if value.is_some() { b"string".to_vec() } else { b"none".to_vec() })
            }
            StringRead::GetRange(start, end) => match span(bytes.len() as i64, start, end) {
                Some((a, b)) => Frame::Bulk(Bytes::copy_from_slice(&bytes[a..=b])),
                None => Frame::Bulk(Bytes::new()),
            },
            StringRead::GetBit(offset) => {
                let byte = usize::try_from(offset / 8).ok().and_then(|at| bytes.get(at));
                Frame::Integer(byte.map_or(0, |b| i64::from(b & (0x80 >> (offset % 8)) != 0)))
            }
            StringRead::BitCount(None) => {
                Frame::Integer(bytes.iter().map(|b| i64::from(b.count_ones())).sum())
            }
            StringRead::BitCount(Some((start, end, false))) => {
                match span(bytes.len() as i64, start, end) {
                    Some((a, b)) => {
                        Frame::Integer(bytes[a..=b].iter().map(|b| i64::from(b.count_ones())).sum())
                    }
                    None => Frame::Integer(0),
                }
            }
            StringRead::BitCount(Some((start, end, true))) => {
                let bits = bytes.len() as i64 * 8;
                match span(bits, start, end) {
                    Some((a, b)) => Frame::Integer(
                        (a..=b).filter(|i| bytes[i / 8] & (0x80 >> (i % 8)) != 0).count() as i64,
                    ),
                    None => Frame::Integer(0),
                }
            }
            StringRead::BitPos(bit, range) => Frame::Integer(match value {
                None => -i64::from(bit),
                Some(bytes) => bit_pos(bytes, bit, range),
            }),
            _ if value.is_none() => Frame::Null,
            StringRead::Encoding => Frame::Bulk(Bytes::from_static(encoding(bytes).as_bytes())),
            StringRead::RefCount => Frame::Integer(1),
            StringRead::IdleTime => Frame::Integer(0),
        }
    }
}

/// The first `bit` in `bytes` within `range` (`(start, end, in bits)`, Redis's
/// arithmetic), or -1. Looking for a clear bit with no end given finds the one just past
/// the value (Redis pads the right with zeros), with an end given -1.
fn bit_pos(bytes: &[u8], bit: bool, range: Option<(i64, Option<i64>, bool)>) -> i64 {
    let (start, end, in_bits) = range.unwrap_or((0, None, false));
    let unit = if in_bits { 1 } else { 8 };
    let total = bytes.len() as i64 * 8 / unit;
    let fix = |i: i64| if i < 0 { (total + i).max(0) } else { i };
    let (first, last) = (fix(start), fix(end.unwrap_or(-1)).min(total - 1));
    if first > last {
        return -1;
    }
    let (first_bit, last_bit) = (first * unit, last * unit + unit - 1);
    // Whole bytes holding none of the bits sought are skipped at once.
    let none_sought = if bit { 0x00 } else { 0xff };
    let mut i = first_bit;
    while i <= last_bit {
        let byte = bytes[(i / 8) as usize];
        if i % 8 == 0 && i + 7 <= last_bit && byte == none_sought {
            i += 8;
            continue;
        }
        if (byte & (0x80 >> (i % 8)) != 0) == bit {
            return i;
        }
        i += 1;
    }
    if !bit && end.is_none() {
        bytes.len() as i64 * 8
    } else {
        -1
    }
}

/// The encoding Redis gives a string value just written: `int` for a canonical 64-bit
/// integer, `embstr` up to 44 bytes, else `raw`.
fn encoding(bytes: &[u8]) -> &'static str {
    let canonical_integer = bytes.len() <= 20
        && crate::num::parse_i64(bytes).is_some_and(|n| n.to_string().as_bytes() == bytes);
    match bytes.len() {
        _ if canonical_integer => "int",
        0..=44 => "embstr",
        _ => "raw",
    }
}

/// Redis's range arithmetic over `len` units: negative positions count from the end,
/// both ends clamped; `None` when the range is empty.
fn span(len: i64, start: i64, end: i64) -> Option<(usize, usize)> {
    let fix = |i: i64| if i < 0 { (len + i).max(0) } else { i };
    let (start, end) = (fix(start), fix(end).min(len - 1));
    if len == 0 || start > end || start >= len {
        return None;
    }
    Some((start as usize, end as usize))
}

/// `SET`'s Redis options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SetOptions {
    /// `NX`, `XX` (`SETNX`: `NX`).
    pub cond: SetCond,
    /// `EX`, `PX`, `EXAT`, `PXAT`, `KEEPTTL`; [`Ttl::Clear`] when none is named.
    pub ttl: Ttl,
    /// `GET` (and `GETSET`): the reply is the value before.
    pub get: bool,
    /// `SETNX`: the reply is `1` if it wrote, else `0`.
    pub integer_reply: bool,
}

impl SetOptions {
    /// A plain `SET`: no condition, no expiry, `+OK`.
    pub const PLAIN: SetOptions =
        SetOptions { cond: SetCond::Always, ttl: Ttl::Clear, get: false, integer_reply: false };
}

impl SetOptions {
    /// The engine command: a plain `SET` is a put (what every engine kind knows); one
    /// with options is Redis's `SET`, its time left for the leader to fill in.
    pub fn command(self, key: Key, value: Value) -> Command {
        if self == SetOptions::PLAIN {
            return Command::Put { key, value };
        }
        let SetOptions { cond, ttl, .. } = self;
        Command::Set { key, value, cond, ttl, now_ms: 0 }
    }
}

/// What a TTL query answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TtlForm {
    /// `TTL`: seconds left, rounded.
    Seconds,
    /// `PTTL`: milliseconds left.
    Millis,
    /// `EXPIRETIME`: the unix time in seconds.
    UnixSeconds,
    /// `PEXPIRETIME`: the unix time in milliseconds.
    UnixMillis,
}

impl TtlForm {
    /// The reply for a key `held` (absent: `-2`), whose expiry is `expires_at` (none:
    /// `-1`), read when the clock says `now_ms` (unix milliseconds).
    pub fn answer(self, held: bool, expires_at: Option<u64>, now_ms: u64) -> i64 {
        let Some(at) = expires_at.filter(|_| held) else {
            return if held { -1 } else { -2 };
        };
        let at = i64::try_from(at).unwrap_or(i64::MAX);
        let left = at.saturating_sub(i64::try_from(now_ms).unwrap_or(i64::MAX)).max(0);
        match self {
            TtlForm::Seconds => (left + 500) / 1000,
            TtlForm::Millis => left,
            TtlForm::UnixSeconds => at / 1000,
            TtlForm::UnixMillis => at,
        }
    }
}

/// The `CLIENT` subcommands Keel tells apart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientSubcommand {
    /// `CLIENT SETNAME name`.
    SetName(Bytes),
    /// `CLIENT GETNAME`.
    GetName,
    /// `CLIENT ID`.
    Id,
    /// `CLIENT UNBLOCK id [TIMEOUT|ERROR]`: ends connection `id`'s blocking pop as if it
    /// timed out, or with an error.
    Unblock {
        /// The connection.
        id: u64,
        /// `ERROR`: answered `UNBLOCKED`; else null, as a time-out.
        error: bool,
    },
    /// `CLIENT SETINFO attribute value` (sent by client libraries; answered `+OK`).
    SetInfo {
        /// `LIB-NAME` or `LIB-VER`, lowercased.
        attribute: String,
        /// Its value.
        value: Bytes,
    },
    /// `CLIENT LIST [TYPE normal] [ID id ...]` (empty `ids`: every connection).
    List {
        /// Only these connections.
        ids: Vec<u64>,
    },
    /// `CLIENT INFO`: this connection's line of `CLIENT LIST`.
    Info,
    /// `CLIENT KILL`: closes the connections the filter picks.
    Kill {
        /// Which connections.
        filter: KillFilter,
        /// `CLIENT KILL ip:port`: `+OK` or an error, not a count.
        old_form: bool,
    },
    /// `CLIENT NO-EVICT on|off`: Keel evicts no client, so either is `+OK`.
    NoEvict,
    /// `CLIENT REPLY ON|OFF|SKIP`: whether the connection's replies are written.
    Reply(ReplyMode),
    /// Any other subcommand, lowercased; refused with Redis's unknown-subcommand error.
    Other(String),
}

/// `CLIENT REPLY`'s modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyMode {
    /// Every reply is written (the default).
    On,
    /// No reply is written (pushes still are).
    Off,
    /// The next command's reply is not written.
    Skip,
}

/// The three name spaces of pub/sub: channels, patterns over channels, and shard
/// channels (Redis 7's `SSUBSCRIBE`, kept apart from the others).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Space {
    /// `SUBSCRIBE`: a channel's exact name.
    Channel,
    /// `PSUBSCRIBE`: a glob-style pattern over channel names.
    Pattern,
    /// `SSUBSCRIBE`: a shard channel's name.
    Shard,
}

impl Space {
    /// Every space, in order.
    pub const ALL: [Space; 3] = [Space::Channel, Space::Pattern, Space::Shard];

    /// The space's place in [`Space::ALL`].
    pub fn at(self) -> usize {
        self as usize
    }

    /// The word of a subscription's confirmation (`subscribe`, `psubscribe`, ...).
    pub fn subscribe_word(self) -> &'static str {
        match self {
            Space::Channel => "subscribe",
            Space::Pattern => "psubscribe",
            Space::Shard => "ssubscribe",
        }
    }

    /// The word of an unsubscription's confirmation.
    pub fn unsubscribe_word(self) -> &'static str {
        match self {
            Space::Channel => "unsubscribe",
            Space::Pattern => "punsubscribe",
            Space::Shard => "sunsubscribe",
        }
    }
}

/// A pub/sub command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PubSubCommand {
    /// `SUBSCRIBE`, `PSUBSCRIBE`, `SSUBSCRIBE` (at least one name).
    Subscribe {
        /// Which space.
        space: Space,
        /// The channels or patterns.
        names: Vec<Bytes>,
    },
    /// `UNSUBSCRIBE`, `PUNSUBSCRIBE`, `SUNSUBSCRIBE` (no name: all of the space).
    Unsubscribe {
        /// Which space.
        space: Space,
        /// The channels or patterns.
        names: Vec<Bytes>,
    },
    /// `PUBLISH` or `SPUBLISH`: the number of this node's connections that received it.
    Publish {
        /// A shard channel (`SPUBLISH`).
        shard: bool,
        /// The channel.
        channel: Bytes,
        /// The message.
        message: Bytes,
    },
    /// `PUBSUB CHANNELS [pattern]` or `PUBSUB SHARDCHANNELS [pattern]`.
    Channels {
        /// Shard channels.
        shard: bool,
        /// Only the channels it matches.
        pattern: Option<Bytes>,
    },
    /// `PUBSUB NUMSUB [channel ...]` or `PUBSUB SHARDNUMSUB [channel ...]`.
    NumSub {
        /// Shard channels.
        shard: bool,
        /// The channels.
        channels: Vec<Bytes>,
    },
    /// `PUBSUB NUMPAT`: how many distinct patterns are subscribed to.
    NumPat,
    /// `PUBSUB HELP`.
    Help,
}

impl PubSubCommand {
    /// The command's name as `COMMAND` lists it.
    pub fn name(&self) -> &'static str {
        match self {
            PubSubCommand::Subscribe { space, .. } => space.subscribe_word(),
            PubSubCommand::Unsubscribe { space, .. } => space.unsubscribe_word(),
            PubSubCommand::Publish { shard: false, .. } => "publish",
            PubSubCommand::Publish { shard: true, .. } => "spublish",
            _ => "pubsub",
        }
    }
}

/// Which connections a `CLIENT KILL` closes: those matching every filter given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KillFilter {
    /// `ID`.
    pub id: Option<u64>,
    /// `ADDR ip:port` (or the old form's argument).
    pub addr: Option<String>,
    /// `USER name`.
    pub user: Option<String>,
    /// `SKIPME yes` (the default of the new form): never the connection asking.
    pub skip_me: bool,
    /// `TYPE` other than `normal` (Keel has no replica or pub/sub connections): none.
    pub none: bool,
}

/// The `COMMAND` forms Keel answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CommandQuery {
    /// Bare `COMMAND`: the table of commands.
    All,
    /// `COMMAND COUNT`.
    Count,
    /// `COMMAND DOCS [name ...]`.
    Docs(Vec<Bytes>),
    /// `COMMAND INFO [name ...]`.
    Info(Vec<Bytes>),
    /// `COMMAND LIST`: the names.
    List,
    /// `COMMAND GETKEYS command [arg ...]`: the keys of that request.
    GetKeys(Vec<Bytes>),
}

/// What a data command asks of the engine: one operation per key, and its options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Operations {
    /// The operations, in the order their results make up the reply (`DEL a b`: two
    /// deletes; `MGET a b` and `EXISTS a b`: two gets).
    pub commands: Vec<Command>,
    /// The read level asked for (reads only).
    pub level: Option<ReadLevel>,
    /// The durability asked for (writes only).
    pub durability: Option<Durability>,
    /// Whether the reply carries versions.
    pub with_version: bool,
}

impl ClientCommand {
    /// The engine operations of a data command (`GET`, `SET`, `DEL`, `EXISTS`, `INCR`
    /// and friends, `MGET`, `KEEL.CAS`, `KEEL.SCAN`); any other command comes back as
    /// `Err(self)` for the server to answer itself.
    pub fn into_operations(self) -> Result<Operations, ClientCommand> {
        let reads =
            |commands, level| Operations { commands, level, durability: None, with_version: false };
        let writes = |commands, durability| Operations {
            commands,
            level: None,
            durability,
            with_version: false,
        };
        let operations = match self {
            ClientCommand::Get { key, level, with_version, .. } => {
                Operations { with_version, ..reads(vec![Command::Get { key }], level) }
            }
            ClientCommand::Set { key, value, durability, with_version, options, .. } => {
                let command = options.command(key, value);
                Operations { with_version, ..writes(vec![command], durability) }
            }
            ClientCommand::Expire { key, ttl, cond, durability } => {
                writes(vec![Command::Expire { key, ttl, cond, now_ms: 0 }], durability)
            }
            ClientCommand::MSet { pairs, only_new: false } => {
                let ops =
                    pairs.into_iter().map(|(key, value)| Command::Put { key, value }).collect();
                writes(vec![Command::Multi { ops, watch: Vec::new() }], None)
            }
            ClientCommand::Ttl { key, level, .. } => reads(vec![Command::Inspect { key }], level),
            ClientCommand::Del { keys } => {
                writes(keys.into_iter().map(|key| Command::Delete { key }).collect(), None)
            }
            ClientCommand::Exists { keys } | ClientCommand::MGet { keys, level: None } => {
                reads(keys.into_iter().map(|key| Command::Get { key }).collect(), None)
            }
            ClientCommand::MGet { keys, level } => {
                reads(keys.into_iter().map(|key| Command::Get { key }).collect(), level)
            }
            ClientCommand::Incr { key, delta, .. } => {
                writes(vec![Command::Incr { key, delta }], None)
            }
            ClientCommand::Cas { key, expected, new, durability, .. } => {
                writes(vec![Command::Cas { key, expected, new }], durability)
            }
            ClientCommand::Scan { start, end, count, level } => {
                reads(vec![Command::Scan { start, end, limit: count }], level)
            }
            ClientCommand::Enqueue { queue, value, durability } => {
                writes(vec![Command::Enqueue { queue, value }], durability)
            }
            ClientCommand::Dequeue { queue, durability } => {
                writes(vec![Command::Dequeue { queue }], durability)
            }
            ClientCommand::QueuePeek { queue, level } => {
                reads(vec![Command::QueuePeek { queue }], level)
            }
            other => return Err(other),
        };
        assert!(!operations.commands.is_empty(), "a data command has at least one operation");
        debug_assert!(operations.level.is_none() || operations.durability.is_none());
        Ok(operations)
    }

    /// The synchronization the command asks (`ACQUIRE`, `RELEASE`, `WEAK`, `STRONG`);
    /// [`OpMode::Plain`] for every other command.
    pub fn mode(&self) -> OpMode {
        match self {
            ClientCommand::Get { mode, .. }
            | ClientCommand::Set { mode, .. }
            | ClientCommand::Cas { mode, .. } => *mode,
            _ => OpMode::Plain,
        }
    }

    /// The command's name in lowercase, as metrics and errors show it.
    pub fn name(&self) -> &'static str {
        match self {
            ClientCommand::Ping { .. } => "ping",
            ClientCommand::Echo { .. } => "echo",
            ClientCommand::Hello { .. } => "hello",
            ClientCommand::Get { .. } => "get",
            ClientCommand::Set { options, .. } if options.integer_reply => "setnx",
            ClientCommand::Set { .. } => "set",
            ClientCommand::Expire { .. } => "expire",
            ClientCommand::Ttl { .. } => "ttl",
            ClientCommand::Del { .. } => "del",
            ClientCommand::MSet { only_new: false, .. } => "mset",
            ClientCommand::MSet { only_new: true, .. } => "msetnx",
            ClientCommand::Lcs { .. } => "lcs",
            ClientCommand::RandomKey => "randomkey",
            ClientCommand::Time => "time",
            ClientCommand::DebugSleep(_) => "debug",
            ClientCommand::Modify { .. } => "modify",
            ClientCommand::Transfer { .. } => "transfer",
            ClientCommand::ReadString { .. } => "strread",
            ClientCommand::Exists { .. } => "exists",
            ClientCommand::Incr { fetch: true, .. } => "keel.faa",
            ClientCommand::Incr { .. } => "incr",
            ClientCommand::MGet { .. } => "mget",
            ClientCommand::Cas { .. } => "keel.cas",
            ClientCommand::Scan { .. } => "keel.scan",
            ClientCommand::Enqueue { .. } => "keel.enqueue",
            ClientCommand::Dequeue { .. } => "keel.dequeue",
            ClientCommand::QueuePeek { .. } => "keel.qpeek",
            ClientCommand::Status => "keel.status",
            ClientCommand::Flush { all: false } => "flushdb",
            ClientCommand::Flush { all: true } => "flushall",
            ClientCommand::Node { .. } => "keel.node",
            ClientCommand::Slots { .. } => "keel.slots",
            ClientCommand::SwapDb { .. } => "swapdb",
            ClientCommand::DbSize => "dbsize",
            ClientCommand::Keys { .. } => "keys",
            ClientCommand::ScanKeys { .. } => "scan",
            ClientCommand::FunctionFlush => "function",
            ClientCommand::Unwatch => "unwatch",
            ClientCommand::Info { .. } => "info",
            ClientCommand::Client(_) => "client",
            ClientCommand::PubSub(command) => command.name(),
            ClientCommand::Command(_) => "command",
            ClientCommand::ConfigGet { .. }
            | ClientCommand::ConfigSet { .. }
            | ClientCommand::ConfigResetStat => "config",
            ClientCommand::Select { .. } => "select",
            ClientCommand::Keyspaces => "keel.keyspaces",
            ClientCommand::Quit => "quit",
            ClientCommand::Coll { name, .. }
            | ClientCommand::CollRead { name, .. }
            | ClientCommand::Block { name, .. } => name,
        }
    }
}

/// A request Keel refuses. The `Display` text is the whole error line after `-`, its
/// first word the error kind; none of these is retryable (the same request fails the
/// same way), and none closes the connection.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    /// An empty request (the decoder skips these; a direct caller may not).
    #[error("ERR empty command")]
    Empty,
    /// A request element that is not a bulk string.
    #[error("ERR Protocol error: expected an array of bulk strings")]
    NotBulkStrings,
    /// A command name Keel does not know.
    #[error("ERR unknown command '{name}', with args beginning with: {args}")]
    UnknownCommand {
        /// The name as sent (at most [`ERROR_NAME_BYTES_MAX`] bytes).
        name: String,
        /// The first arguments, each quoted and followed by a space.
        args: String,
    },
    /// The wrong number of arguments for a command.
    #[error("ERR wrong number of arguments for '{name}' command")]
    WrongArity {
        /// The command's lowercase name (`client|setname` for subcommands).
        name: String,
    },
    /// An option or argument in the wrong place.
    #[error("ERR syntax error")]
    Syntax,
    /// An argument that should be an integer (or a count) and is not.
    #[error("ERR value is not an integer or out of range")]
    NotAnInteger,
    /// A `SCAN` cursor that is not a number, or one this node did not hand out.
    #[error("ERR invalid cursor")]
    InvalidCursor,
    /// A bit offset out of range.
    #[error("ERR bit offset is not an integer or out of range")]
    BitOffset,
    /// A bit that is not 0 or 1.
    #[error("ERR bit is not an integer or out of range")]
    BitValue,
    /// A `SETRANGE` offset out of range.
    #[error("ERR offset is out of range")]
    OffsetOutOfRange,
    /// An argument that should be a float and is not.
    #[error("ERR value is not a valid float")]
    NotAFloat,
    /// An expiry that is not positive where it must be, or too large.
    #[error("ERR invalid expire time in '{0}' command")]
    InvalidExpireTime(String),
    /// An `EXPIRE` option that is not `NX`, `XX`, `GT` or `LT`.
    #[error("ERR Unsupported option {0}")]
    UnsupportedExpireOption(String),
    /// `EXPIRE` options that exclude each other.
    #[error("ERR {0} options at the same time are not compatible")]
    IncompatibleExpireOptions(&'static str),
    /// `INCRBYFLOAT key +inf`.
    #[error("ERR increment would produce NaN or Infinity")]
    NotFinite,
    /// `DECRBY key -9223372036854775808`.
    #[error("ERR decrement would overflow")]
    DecrementOverflow,
    /// A Redis option Keel does not support, named.
    #[error("ERR {command} option '{option}' is not supported by Keel")]
    UnsupportedOption {
        /// The command (uppercase).
        command: &'static str,
        /// The option as sent.
        option: String,
    },
    /// A read level or durability that is not one of Keel's.
    #[error("ERR {0}")]
    UnknownName(UnknownName),
    /// `SELECT` of any database but 0.
    #[error("ERR DB index is out of range")]
    DbIndexOutOfRange,
    /// `SWAPDB` with an index that is no number (`first` or `second`).
    #[error("ERR invalid {0} DB index")]
    InvalidDbIndex(&'static str),
    /// `HELLO` with a version that is not a number.
    #[error("ERR Protocol version is not an integer or out of range")]
    ProtocolVersionNotInteger,
    /// `HELLO` with a version other than 2 or 3.
    #[error("NOPROTO unsupported protocol version")]
    UnsupportedProtocol,
    /// A `HELLO` option that is not `AUTH` or `SETNAME`, or lacks its arguments.
    #[error("ERR Syntax error in HELLO option '{0}'")]
    HelloOption(String),
    /// A subcommand Keel does not know.
    #[error("ERR unknown subcommand '{subcommand}'. Try {command} HELP.")]
    UnknownSubcommand {
        /// The command (uppercase).
        command: &'static str,
        /// The subcommand as sent.
        subcommand: String,
    },
    /// `LCS` with both `LEN` and `IDX`.
    #[error("ERR If you want both the length and indexes, please just use IDX.")]
    LcsLenAndIdx,
    /// `OBJECT FREQ`: Keel evicts nothing, so it counts no accesses.
    #[error("ERR An LFU maxmemory policy is not selected, access frequency not tracked. Keel evicts no keys.")]
    NoLfu,
    /// A Redis command or form Keel does not support, with the reason.
    #[error("ERR {0}")]
    Unsupported(&'static str),
    /// An argument outside Keel's limits (key or value too large, scan count).
    #[error("ERR {0}")]
    Invalid(KeelError),
}

impl CommandError {
    /// The error frame the server replies with.
    pub fn reply_frame(&self) -> Frame {
        let text = self.to_string();
        debug_assert!(text.split(' ').next().is_some_and(|kind| !kind.is_empty()));
        Frame::Error(text.into_bytes())
    }
}
