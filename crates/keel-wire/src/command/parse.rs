//! One parser per command. Each checks the argument count first (Redis's arity error),
//! then options left to right; keys and values are checked against [`Limits`].

use super::{
    ClientCommand, ClientSubcommand, CommandError, CommandQuery, OpMode, ERROR_ARGS_BYTES_MAX,
    ERROR_NAME_BYTES_MAX, SCAN_COUNT_DEFAULT,
};
use super::{SetOptions, TtlForm};
use crate::num::parse_i64;
use crate::resp::{Frame, Protocol};
use bytes::Bytes;
use keel_types::{Durability, ExpireCond, Key, Limits, ReadLevel, SetCond, Ttl, Value};

/// Longest command name Keel knows (`keel.status`); longer names are unknown.
const NAME_BYTES_MAX: usize = 16;

/// The words of one request after its name, consumed front to back.
pub(super) type Words = std::vec::IntoIter<Bytes>;

/// Parses a decoded request frame: an array of bulk strings.
pub fn parse_frame(frame: Frame, limits: &Limits) -> Result<ClientCommand, CommandError> {
    let Frame::Array(items) = frame else {
        return Err(CommandError::NotBulkStrings);
    };
    let words = items
        .into_iter()
        .map(|item| match item {
            Frame::Bulk(bytes) => Ok(bytes),
            _ => Err(CommandError::NotBulkStrings),
        })
        .collect::<Result<Vec<_>, _>>()?;
    parse(words, limits)
}

/// Parses a request given as its words, the command name first.
pub fn parse(words: Vec<Bytes>, limits: &Limits) -> Result<ClientCommand, CommandError> {
    let Some(raw_name) = words.first() else {
        return Err(CommandError::Empty);
    };
    // Lowercased on the stack: every request's name goes through here.
    let mut name_buf = [0u8; NAME_BYTES_MAX];
    let name: &str = match name_buf.get_mut(..raw_name.len()) {
        Some(buf) => {
            for (lower, byte) in buf.iter_mut().zip(raw_name.iter()) {
                *lower = byte.to_ascii_lowercase();
            }
            // A name with other bytes than UTF-8 is unknown, as one too long is.
            std::str::from_utf8(buf).unwrap_or("")
        }
        None => "",
    };
    let mut words = words;
    let option = keel_option(name, &mut words)?;
    let count = words.len() - 1;
    let mut rest = words.into_iter();
    let raw_name = rest.next().expect("the name is there");
    let parsed = match name {
        "ping" => ping(rest, count),
        "echo" => echo(rest, count),
        "hello" => hello(rest),
        "get" => get(rest, count, limits),
        "set" => set(rest, count, limits),
        "setnx" | "getset" => set_short(name, rest, count, limits),
        "setex" | "psetex" => setex(name, rest, count, limits),
        "expire" | "pexpire" | "expireat" | "pexpireat" => expire(name, rest, count, limits),
        "persist" => persist(rest, count, limits),
        "mset" | "msetnx" => mset(name, rest, count, limits),
        "lcs" => lcs(rest, count, limits),
        "object" => object(rest, count, limits),
        "memory" => memory(rest, count, limits),
        "bitpos" => bitpos(rest, count, limits),
        "move" => move_key(rest, count, limits),
        "randomkey" => exactly("randomkey", count, 0).map(|()| ClientCommand::RandomKey),
        "time" => exactly("time", count, 0).map(|()| ClientCommand::Time),
        "debug" => debug(rest, count),
        "swapdb" => swap_db(rest, count),
        "scan" => scan_keys(rest, count),
        "append" | "setrange" | "setbit" | "incrbyfloat" | "getdel" | "getex" => {
            modify(name, rest, count, limits)
        }
        "rename" | "renamenx" | "copy" => transfer(name, rest, count, limits),
        "type" => exactly("type", count, 1).and_then(|()| {
            let key = key(next(&mut rest)?, limits)?;
            let (op, reshape) = (Box::new(keel_types::coll::CollRead::Type), super::Reshape::None);
            Ok(ClientCommand::CollRead { name: "type", key, op, level: None, reshape })
        }),
        "strlen" | "getrange" | "substr" | "getbit" | "bitcount" => {
            string_read(name, rest, count, limits)
        }
        "unlink" => keys("unlink", rest, count, limits).map(|keys| ClientCommand::Del { keys }),
        "touch" => keys("touch", rest, count, limits).map(|keys| ClientCommand::Exists { keys }),
        "flushdb" | "flushall" => flush(name, rest, count),
        "dbsize" => exactly("dbsize", count, 0).map(|()| ClientCommand::DbSize),
        "keys" => exactly("keys", count, 1)
            .and_then(|()| Ok(ClientCommand::Keys { pattern: next(&mut rest)? })),
        "function" => function(rest, count),
        "unwatch" => exactly("unwatch", count, 0).map(|()| ClientCommand::Unwatch),
        "ttl" | "pttl" | "expiretime" | "pexpiretime" => ttl_query(name, rest, count, limits),
        "del" => keys("del", rest, count, limits).map(|keys| ClientCommand::Del { keys }),
        "exists" => keys("exists", rest, count, limits).map(|keys| ClientCommand::Exists { keys }),
        "incr" | "decr" | "incrby" | "decrby" => incr(name, rest, count, limits),
        "keel.faa" => faa(rest, count, limits),
        "mget" => mget(rest, count, limits),
        "keel.cas" => cas(rest, count, limits),
        "keel.scan" => scan(rest, count, limits),
        "keel.enqueue" => enqueue(rest, count, limits),
        "keel.dequeue" => dequeue(rest, count, limits),
        "keel.qpeek" => queue_peek(rest, count, limits),
        "keel.node" => node(rest, count),
        "keel.slots" => slots(rest, count, limits),
        "keel.status" => exactly("keel.status", count, 0).map(|()| ClientCommand::Status),
        "keel.keyspaces" => exactly("keel.keyspaces", count, 0).map(|()| ClientCommand::Keyspaces),
        "info" => Ok(ClientCommand::Info { sections: rest.map(|w| lowercase(&w)).collect() }),
        "client" => client(rest, count),
        "subscribe" | "psubscribe" | "ssubscribe" | "unsubscribe" | "punsubscribe"
        | "sunsubscribe" | "publish" | "spublish" | "pubsub" => pubsub(name, rest, count),
        "command" => command(rest),
        "config" => config(rest, count),
        "select" => select(rest, count),
        "quit" => Ok(ClientCommand::Quit),
        _ => super::colls::parse(name, raw_name, rest.collect(), limits),
    };
    debug_assert!(parsed.is_err() || !name.is_empty(), "only known names parse");
    match option {
        None => parsed,
        Some(option) => parsed.map(|command| option.apply(command)),
    }
}

/// Keel's option on a Redis command that has none of its own in that place:
/// `DURABILITY d` after a write's arguments, `LEVEL l` after a read's.
#[derive(Clone, Copy, Debug)]
enum KeelOption {
    Durability(Durability),
    Level(ReadLevel),
}

impl KeelOption {
    fn apply(self, command: ClientCommand) -> ClientCommand {
        match (command, self) {
            (ClientCommand::Modify { key, op, .. }, KeelOption::Durability(d)) => {
                ClientCommand::Modify { key, op, durability: Some(d) }
            }
            (ClientCommand::Expire { key, ttl, cond, .. }, KeelOption::Durability(d)) => {
                ClientCommand::Expire { key, ttl, cond, durability: Some(d) }
            }
            (
                ClientCommand::Transfer { from, to, replace, remove_source, form, to_db, .. },
                KeelOption::Durability(d),
            ) => ClientCommand::Transfer {
                from,
                to,
                replace,
                remove_source,
                form,
                to_db,
                durability: Some(d),
            },
            (ClientCommand::ReadString { key, op, .. }, KeelOption::Level(l)) => {
                ClientCommand::ReadString { key, op, level: Some(l) }
            }
            (ClientCommand::CollRead { name, key, op, reshape, .. }, KeelOption::Level(l)) => {
                ClientCommand::CollRead { name, key, op, level: Some(l), reshape }
            }
            (other, _) => unreachable!("{} takes no such option", other.name()),
        }
    }
}

/// Takes a trailing `DURABILITY d` (the writes below) or `LEVEL l` (the reads) off
/// `words` when the command has at least its fewest arguments without them; `APPEND k
/// DURABILITY memory` is `APPEND` of `k` with the option, `APPEND durability memory` an
/// append to the key `durability`.
fn keel_option(name: &str, words: &mut Vec<Bytes>) -> Result<Option<KeelOption>, CommandError> {
    let (word, fewest) = match name {
        "append" | "incrbyfloat" | "rename" | "renamenx" | "copy" | "move" => ("durability", 2),
        "expire" | "pexpire" | "expireat" | "pexpireat" => ("durability", 2),
        "setrange" | "setbit" => ("durability", 3),
        "getdel" | "getex" | "persist" => ("durability", 1),
        "strlen" | "type" | "bitcount" => ("level", 1),
        "getbit" | "bitpos" | "object" => ("level", 2),
        "getrange" | "substr" => ("level", 3),
        _ => return Ok(None),
    };
    let n = words.len();
    if n < 3 + fewest || !is(&words[n - 2], word) {
        return Ok(None);
    }
    let value = words.pop().expect("counted");
    words.pop();
    Ok(Some(match word {
        "durability" => KeelOption::Durability(durability(&value)?),
        _ => KeelOption::Level(read_level(&value)?),
    }))
}

/// Lowercases ASCII; other bytes become U+FFFD (a name with them is unknown anyway).
fn lowercase(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).to_ascii_lowercase()
}

/// Redis's "unknown command" error: the name and the first arguments, quoted.
pub(super) fn unknown_command(raw_name: &[u8], args: &[Bytes]) -> CommandError {
    let name_len = raw_name.len().min(ERROR_NAME_BYTES_MAX);
    let name = String::from_utf8_lossy(&raw_name[..name_len]).into_owned();
    let mut shown = String::new();
    for arg in args {
        if shown.len() >= ERROR_ARGS_BYTES_MAX {
            break;
        }
        let room = ERROR_ARGS_BYTES_MAX - shown.len();
        // Each invalid byte becomes a 3-byte U+FFFD: cut the text, not only the bytes.
        let text = String::from_utf8_lossy(&arg[..arg.len().min(room)]);
        let mut end = text.len().min(room);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        shown.push('\'');
        shown.push_str(&text[..end]);
        shown.push_str("' ");
    }
    debug_assert!(shown.len() <= ERROR_ARGS_BYTES_MAX * 2 + args.len() * 3);
    CommandError::UnknownCommand { name, args: shown }
}

pub(super) fn arity(name: &str) -> CommandError {
    CommandError::WrongArity { name: name.to_string() }
}

/// Refuses an option given twice (`GET k WITHVERSION WITHVERSION`), as a syntax error.
fn once(seen: bool) -> Result<(), CommandError> {
    if seen {
        Err(CommandError::Syntax)
    } else {
        Ok(())
    }
}

/// Refuses anything but `expected` arguments.
pub(super) fn exactly(name: &str, count: usize, expected: usize) -> Result<(), CommandError> {
    if count == expected {
        Ok(())
    } else {
        Err(arity(name))
    }
}

/// Refuses fewer than `min` arguments.
pub(super) fn at_least(name: &str, count: usize, min: usize) -> Result<(), CommandError> {
    if count >= min {
        Ok(())
    } else {
        Err(arity(name))
    }
}

/// The next word; callers have checked the count, so a missing one is a syntax error.
pub(super) fn next(words: &mut Words) -> Result<Bytes, CommandError> {
    words.next().ok_or(CommandError::Syntax)
}

pub(super) fn key(bytes: Bytes, limits: &Limits) -> Result<Key, CommandError> {
    limits.check_key(&bytes).map_err(CommandError::Invalid)?;
    Ok(bytes)
}

pub(super) fn value(bytes: Bytes, limits: &Limits) -> Result<Value, CommandError> {
    limits.check_value(&bytes).map_err(CommandError::Invalid)?;
    Ok(bytes)
}

pub(super) fn integer(bytes: &[u8]) -> Result<i64, CommandError> {
    parse_i64(bytes).ok_or(CommandError::NotAnInteger)
}

fn read_level(word: &[u8]) -> Result<ReadLevel, CommandError> {
    String::from_utf8_lossy(word).parse().map_err(CommandError::UnknownName)
}

fn durability(word: &[u8]) -> Result<Durability, CommandError> {
    String::from_utf8_lossy(word).parse().map_err(CommandError::UnknownName)
}

pub(super) fn is(word: &[u8], option: &str) -> bool {
    word.eq_ignore_ascii_case(option.as_bytes())
}

fn ping(mut words: Words, count: usize) -> Result<ClientCommand, CommandError> {
    if count > 1 {
        return Err(arity("ping"));
    }
    Ok(ClientCommand::Ping { message: words.next() })
}

fn echo(mut words: Words, count: usize) -> Result<ClientCommand, CommandError> {
    exactly("echo", count, 1)?;
    Ok(ClientCommand::Echo { message: next(&mut words)? })
}

fn hello(mut words: Words) -> Result<ClientCommand, CommandError> {
    let mut command = ClientCommand::Hello { protocol: None, auth: None, client_name: None };
    let Some(version) = words.next() else {
        return Ok(command);
    };
    let protocol = match parse_i64(&version) {
        None => return Err(CommandError::ProtocolVersionNotInteger),
        Some(2) => Protocol::Resp2,
        Some(3) => Protocol::Resp3,
        Some(_) => return Err(CommandError::UnsupportedProtocol),
    };
    let ClientCommand::Hello { protocol: p, auth, client_name } = &mut command else {
        unreachable!("built above")
    };
    *p = Some(protocol);
    // Each pass consumes at least one word, so the loop is bounded by the request.
    while let Some(option) = words.next() {
        let missing = || CommandError::HelloOption(String::from_utf8_lossy(&option).into_owned());
        if is(&option, "auth") {
            let user = words.next().ok_or_else(missing)?;
            let password = words.next().ok_or_else(missing)?;
            *auth = Some((user, password));
        } else if is(&option, "setname") {
            *client_name = Some(words.next().ok_or_else(missing)?);
        } else {
            return Err(missing());
        }
    }
    Ok(command)
}

fn get(mut words: Words, count: usize, limits: &Limits) -> Result<ClientCommand, CommandError> {
    at_least("get", count, 1)?;
    let key = key(next(&mut words)?, limits)?;
    let (mut level, mut with_version, mut mode) = (None, false, OpMode::Plain);
    while let Some(option) = words.next() {
        if is(&option, "level") {
            once(level.is_some())?;
            level = Some(read_level(&next(&mut words)?)?);
        } else if is(&option, "withversion") {
            once(with_version)?;
            with_version = true;
        } else if is(&option, "acquire") {
            once(mode != OpMode::Plain)?;
            mode = OpMode::Acquire;
        } else {
            return Err(CommandError::Syntax);
        }
    }
    Ok(ClientCommand::Get { key, level, with_version, mode })
}

fn set(mut words: Words, count: usize, limits: &Limits) -> Result<ClientCommand, CommandError> {
    at_least("set", count, 2)?;
    let key = key(next(&mut words)?, limits)?;
    let value = value(next(&mut words)?, limits)?;
    let (mut durability_asked, mut with_version, mut mode) = (None, false, OpMode::Plain);
    let (mut cond, mut ttl, mut get) = (None, None, false);
    while let Some(option) = words.next() {
        if let Some(asked) = ["nx", "xx"].iter().position(|name| is(&option, name)) {
            once(cond.is_some())?;
            cond = Some([SetCond::IfAbsent, SetCond::IfPresent][asked]);
        } else if is(&option, "get") {
            once(get)?;
            get = true;
        } else if is(&option, "keepttl") {
            once(ttl.is_some())?;
            ttl = Some(Ttl::Keep);
        } else if let Some(unit) = TtlUnit::of(&option) {
            once(ttl.is_some())?;
            ttl = Some(unit.positive(integer(&next(&mut words)?)?, "set")?);
        } else if is(&option, "durability") {
            once(durability_asked.is_some())?;
            durability_asked = Some(durability(&next(&mut words)?)?);
        } else if is(&option, "withversion") {
            once(with_version)?;
            with_version = true;
        } else if is(&option, "release") {
            once(mode != OpMode::Plain)?;
            mode = OpMode::Release;
        } else {
            return Err(CommandError::Syntax);
        }
    }
    let (cond, ttl) = (cond.unwrap_or(SetCond::Always), ttl.unwrap_or(Ttl::Clear));
    let options = SetOptions { cond, ttl, get, integer_reply: false };
    let durability = durability_asked;
    Ok(ClientCommand::Set { key, value, durability, with_version, mode, options })
}

/// `SETNX key value` (`1` if it wrote) and `GETSET key value` (the value before).
fn set_short(
    name: &str,
    mut words: Words,
    count: usize,
    limits: &Limits,
) -> Result<ClientCommand, CommandError> {
    exactly(name, count, 2)?;
    let key = key(next(&mut words)?, limits)?;
    let value = value(next(&mut words)?, limits)?;
    let options = match name {
        "setnx" => {
            SetOptions { cond: SetCond::IfAbsent, ttl: Ttl::Clear, get: false, integer_reply: true }
        }
        _ => SetOptions { cond: SetCond::Always, ttl: Ttl::Clear, get: true, integer_reply: false },
    };
    let (durability, with_version, mode) = (None, false, OpMode::Plain);
    Ok(ClientCommand::Set { key, value, durability, with_version, mode, options })
}

/// `SETEX key seconds value`, `PSETEX key milliseconds value`.
fn setex(
    name: &str,
    mut words: Words,
    count: usize,
    limits: &Limits,
) -> Result<ClientCommand, CommandError> {
    exactly(name, count, 3)?;
    let key = key(next(&mut words)?, limits)?;
    let amount = integer(&next(&mut words)?)?;
    let unit = if name == "setex" { TtlUnit::Seconds } else { TtlUnit::Millis };
    let ttl = unit.positive(amount, name)?;
    let value = value(next(&mut words)?, limits)?;
    let options = SetOptions { cond: SetCond::Always, ttl, get: false, integer_reply: false };
    let (durability, with_version, mode) = (None, false, OpMode::Plain);
    Ok(ClientCommand::Set { key, value, durability, with_version, mode, options })
}

/// The units a TTL comes in, relative or absolute.
#[derive(Clone, Copy)]
enum TtlUnit {
    Seconds,
    Millis,
    UnixSeconds,
    UnixMillis,
}

impl TtlUnit {
    /// `EX`, `PX`, `EXAT`, `PXAT`.
    fn of(word: &[u8]) -> Option<TtlUnit> {
        let units = [TtlUnit::Seconds, TtlUnit::Millis, TtlUnit::UnixSeconds, TtlUnit::UnixMillis];
        ["ex", "px", "exat", "pxat"].iter().position(|name| is(word, name)).map(|at| units[at])
    }

    /// `amount` of this unit as a TTL, which must be positive (`SET`, `SETEX`, `GETEX`).
    fn positive(self, amount: i64, command: &str) -> Result<Ttl, CommandError> {
        if amount <= 0 {
            return Err(CommandError::InvalidExpireTime(command.to_string()));
        }
        self.ttl(amount, command)
    }

    /// `amount` of this unit as a TTL; a negative one is already past (`EXPIRE`). Refused
    /// when it does not fit in milliseconds with room for the clock added to it.
    fn ttl(self, amount: i64, command: &str) -> Result<Ttl, CommandError> {
        let invalid = || CommandError::InvalidExpireTime(command.to_string());
        let ms = match self {
            TtlUnit::Seconds | TtlUnit::UnixSeconds => {
                amount.checked_mul(1000).ok_or_else(invalid)?
            }
            TtlUnit::Millis | TtlUnit::UnixMillis => amount,
        };
        match self {
            _ if ms < 0 => Ok(Ttl::At(0)),
            TtlUnit::Seconds | TtlUnit::Millis if ms > RELATIVE_TTL_MS_MAX => Err(invalid()),
            TtlUnit::Seconds | TtlUnit::Millis => Ok(Ttl::After(ms as u64)),
            TtlUnit::UnixSeconds | TtlUnit::UnixMillis => Ok(Ttl::At(ms as u64)),
        }
    }
}

/// The longest relative TTL: one that, added to any clock reading before the year
/// 2100, still fits a signed 64-bit count of milliseconds (Redis refuses the same).
const RELATIVE_TTL_MS_MAX: i64 = i64::MAX - (1 << 42);

/// `EXPIRE key seconds [NX|XX|GT|LT]` and `PEXPIRE`, `EXPIREAT`, `PEXPIREAT`.
fn expire(
    name: &str,
    mut words: Words,
    count: usize,
    limits: &Limits,
) -> Result<ClientCommand, CommandError> {
    at_least(name, count, 2)?;
    let key = key(next(&mut words)?, limits)?;
    let amount = integer(&next(&mut words)?)?;
    let (mut exists, mut order) = (None, None);
    for option in words {
        let conds =
            [ExpireCond::IfNone, ExpireCond::IfSome, ExpireCond::IfLater, ExpireCond::IfEarlier];
        let Some(at) = ["nx", "xx", "gt", "lt"].iter().position(|word| is(&option, word)) else {
            let option = String::from_utf8_lossy(&option).into_owned();
            return Err(CommandError::UnsupportedExpireOption(option));
        };
        let slot = if at < 2 { &mut exists } else { &mut order };
        if slot.is_some_and(|seen| seen != conds[at]) {
            let which = if at < 2 { "NX and XX, GT or LT" } else { "GT and LT" };
            return Err(CommandError::IncompatibleExpireOptions(which));
        }
        *slot = Some(conds[at]);
        let nx_with_other = exists == Some(ExpireCond::IfNone) && order.is_some();
        if nx_with_other {
            return Err(CommandError::IncompatibleExpireOptions("NX and XX, GT or LT"));
        }
    }
    let cond = match (exists, order) {
        (Some(exists), None) => exists,
        (None, Some(order)) => order,
        // `XX GT`: a later expiry than an existing one, which `GT` alone already asks.
        (Some(ExpireCond::IfSome), Some(ExpireCond::IfLater)) => ExpireCond::IfLater,
        // `XX LT`: an earlier expiry than an existing one (`LT` alone counts none as
        // infinitely late, so it sets one on a key without).
        (Some(ExpireCond::IfSome), Some(_)) => ExpireCond::IfSomeEarlier,
        (Some(_), Some(_)) => {
            return Err(CommandError::IncompatibleExpireOptions("NX and XX, GT or LT"))
        }
        (None, None) => ExpireCond::Always,
    };
    let unit = match name {
        "expire" => TtlUnit::Seconds,
        "pexpire" => TtlUnit::Millis,
        "expireat" => TtlUnit::UnixSeconds,
        _ => TtlUnit::UnixMillis,
    };
    let ttl = unit.ttl(amount, name)?;
    Ok(ClientCommand::Expire { key, ttl, cond, durability: None })
}

/// An offset of `SETRANGE`, `SETBIT`, `GETBIT`: a non-negative integer, within 512 MiB
/// (of bytes, or of bits for the bit commands).
fn offset(word: &[u8], bits: bool) -> Result<u64, CommandError> {
    let max = keel_types::STRING_BYTES_MAX * if bits { 8 } else { 1 };
    match parse_i64(word) {
        Some(n) if n >= 0 && (n as u64) < max => Ok(n as u64),
        _ if bits => Err(CommandError::BitOffset),
        _ => Err(CommandError::OffsetOutOfRange),
    }
}

/// `APPEND`, `SETRANGE`, `SETBIT`, `INCRBYFLOAT`, `GETDEL`, `GETEX`.
fn modify(
    name: &str,
    mut words: Words,
    count: usize,
    limits: &Limits,
) -> Result<ClientCommand, CommandError> {
    use keel_types::Modify;
    let arity = match name {
        "append" | "incrbyfloat" => 2,
        "setrange" | "setbit" => 3,
        "getdel" => 1,
        _ => 0,
    };
    if arity > 0 {
        exactly(name, count, arity)?;
    } else {
        at_least(name, count, 1)?;
    }
    let key = key(next(&mut words)?, limits)?;
    let op = match name {
        "append" => Modify::Append(value(next(&mut words)?, limits)?),
        "setrange" => {
            let offset = offset(&next(&mut words)?, false)?;
            Modify::SetRange { offset, value: value(next(&mut words)?, limits)? }
        }
        "setbit" => {
            let offset = offset(&next(&mut words)?, true)?;
            let on = match &next(&mut words)?[..] {
                b"1" => true,
                b"0" => false,
                _ => return Err(CommandError::BitValue),
            };
            Modify::SetBit { offset, on }
        }
        "incrbyfloat" => {
            let word = next(&mut words)?;
            let by = std::str::from_utf8(&word)
                .ok()
                .filter(|t| !t.is_empty() && t.trim() == *t)
                .and_then(|t| t.parse::<f64>().ok())
                .filter(|f| !f.is_nan())
                .ok_or(CommandError::NotAFloat)?;
            if by.is_infinite() {
                // Redis reads `+inf` as a float, then finds the sum infinite.
                return Err(CommandError::NotFinite);
            }
            Modify::IncrByFloat(by.to_bits())
        }
        "getdel" => Modify::GetDel,
        _ => {
            let ttl = match (words.next(), words.next(), words.next()) {
                (None, _, _) => Ttl::Keep,
                (Some(w), None, _) if is(&w, "persist") => Ttl::Clear,
                (Some(w), Some(amount), None) => match TtlUnit::of(&w) {
                    Some(unit) => unit.positive(integer(&amount)?, "getex")?,
                    None => return Err(CommandError::Syntax),
                },
                _ => return Err(CommandError::Syntax),
            };
            Modify::GetEx(ttl)
        }
    };
    Ok(ClientCommand::Modify { key, op, durability: None })
}

/// `RENAME`, `RENAMENX`, `COPY source destination [REPLACE]`.
fn transfer(
    name: &str,
    mut words: Words,
    count: usize,
    limits: &Limits,
) -> Result<ClientCommand, CommandError> {
    if name == "copy" {
        at_least(name, count, 2)?
    } else {
        exactly(name, count, 2)?
    }
    let from = key(next(&mut words)?, limits)?;
    let to = key(next(&mut words)?, limits)?;
    let (mut replace, mut to_db) = (name == "rename", None);
    while let Some(option) = words.next() {
        if name == "copy" && is(&option, "replace") {
            replace = true;
        } else if name == "copy" && is(&option, "db") {
            let db = integer(&next(&mut words)?)?;
            to_db = Some(u32::try_from(db).map_err(|_| CommandError::DbIndexOutOfRange)?);
        } else {
            return Err(CommandError::Syntax);
        }
    }
    let form = match name {
        "rename" => super::TransferForm::Rename,
        "renamenx" => super::TransferForm::RenameNx,
        _ => super::TransferForm::Copy,
    };
    let remove_source = name != "copy";
    Ok(ClientCommand::Transfer { from, to, replace, remove_source, form, to_db, durability: None })
}

/// `STRLEN`, `GETRANGE`, `SUBSTR`, `GETBIT`, `BITCOUNT`, `TYPE`.
fn string_read(
    name: &str,
    mut words: Words,
    count: usize,
    limits: &Limits,
) -> Result<ClientCommand, CommandError> {
    use super::StringRead;
    match name {
        "strlen" | "type" => exactly(name, count, 1)?,
        "getrange" | "substr" => exactly(name, count, 3)?,
        "getbit" => exactly(name, count, 2)?,
        _ => at_least(name, count, 1)?,
    }
    let key = key(next(&mut words)?, limits)?;
    let op = match name {
        "strlen" => StringRead::Strlen,
        "type" => StringRead::Type,
        "getrange" | "substr" => {
            StringRead::GetRange(integer(&next(&mut words)?)?, integer(&next(&mut words)?)?)
        }
        "getbit" => StringRead::GetBit(offset(&next(&mut words)?, true)?),
        _ => match count {
            1 => StringRead::BitCount(None),
            3 | 4 => {
                let (start, end) = (integer(&next(&mut words)?)?, integer(&next(&mut words)?)?);
                StringRead::BitCount(Some((start, end, in_bits(words.next())?)))
            }
            _ => return Err(CommandError::Syntax),
        },
    };
    Ok(ClientCommand::ReadString { key, op, level: None })
}

/// `SCAN cursor [MATCH pattern] [COUNT count] [TYPE type]`.
fn scan_keys(mut words: Words, count: usize) -> Result<ClientCommand, CommandError> {
    at_least("scan", count, 1)?;
    let cursor = std::str::from_utf8(&next(&mut words)?)
        .ok()
        .and_then(|t| t.parse::<u64>().ok())
        .ok_or(CommandError::InvalidCursor)?;
    let (mut pattern, mut page, mut type_name) = (None, SCAN_COUNT_DEFAULT, None);
    while let Some(option) = words.next() {
        if is(&option, "match") {
            pattern = Some(next(&mut words)?);
        } else if is(&option, "count") {
            page = match integer(&next(&mut words)?)? {
                n if n >= 1 => u32::try_from(n).unwrap_or(u32::MAX),
                _ => return Err(CommandError::Syntax),
            };
        } else if is(&option, "type") {
            type_name = Some(next(&mut words)?);
        } else {
            return Err(CommandError::Syntax);
        }
    }
    Ok(ClientCommand::ScanKeys { cursor, pattern, count: page, type_name })
}

/// `MSET`, `MSETNX key value [key value ...]`.
fn mset(
    name: &str,
    words: Words,
    count: usize,
    limits: &Limits,
) -> Result<ClientCommand, CommandError> {
    if count == 0 || !count.is_multiple_of(2) {
        return Err(arity(name));
    }
    if count / 2 > keel_types::MULTI_OPS_MAX {
        let (upper, max) = (name.to_ascii_uppercase(), keel_types::MULTI_OPS_MAX);
        let reason = format!("{upper} writes at most {max} keys at once");
        return Err(CommandError::Invalid(keel_types::KeelError::InvalidArgument(reason)));
    }
    let mut pairs = Vec::with_capacity(count / 2);
    let mut words = words;
    while let (Some(k), Some(v)) = (words.next(), words.next()) {
        pairs.push((key(k, limits)?, value(v, limits)?));
    }
    Ok(ClientCommand::MSet { pairs, only_new: name == "msetnx" })
}

/// `LCS key1 key2 [LEN] [IDX] [MINMATCHLEN len] [WITHMATCHLEN]`.
fn lcs(mut words: Words, count: usize, limits: &Limits) -> Result<ClientCommand, CommandError> {
    at_least("lcs", count, 2)?;
    let a = key(next(&mut words)?, limits)?;
    let b = key(next(&mut words)?, limits)?;
    let mut form = super::LcsForm::default();
    while let Some(option) = words.next() {
        if is(&option, "len") {
            form.len = true;
        } else if is(&option, "idx") {
            form.idx = true;
        } else if is(&option, "withmatchlen") {
            form.with_match_len = true;
        } else if is(&option, "minmatchlen") {
            form.min_match_len = u64::try_from(integer(&next(&mut words)?)?).unwrap_or(0);
        } else {
            return Err(CommandError::Syntax);
        }
    }
    if form.len && form.idx {
        return Err(CommandError::LcsLenAndIdx);
    }
    Ok(ClientCommand::Lcs { a, b, form })
}

/// `OBJECT ENCODING|REFCOUNT|IDLETIME|FREQ key`, `OBJECT HELP`.
fn object(mut words: Words, count: usize, limits: &Limits) -> Result<ClientCommand, CommandError> {
    use super::StringRead;
    at_least("object", count, 1)?;
    let sub = next(&mut words)?;
    let op = match lowercase(&sub).as_str() {
        "encoding" => StringRead::Encoding,
        "refcount" => StringRead::RefCount,
        "idletime" => StringRead::IdleTime,
        "freq" => return Err(CommandError::NoLfu),
        "help" => {
            return Err(CommandError::Unsupported("OBJECT HELP: ENCODING, REFCOUNT, IDLETIME"))
        }
        _ => {
            let subcommand = String::from_utf8_lossy(&sub).into_owned();
            return Err(CommandError::UnknownSubcommand { command: "OBJECT", subcommand });
        }
    };
    exactly(&format!("object|{}", lowercase(&sub)), count, 2)?;
    let key = key(next(&mut words)?, limits)?;
    if op == StringRead::Encoding {
        // Any type's: the state machine tells the type and shape, the node names it.
        let (op, reshape) =
            (Box::new(keel_types::coll::CollRead::Encoding), super::Reshape::Encoding);
        return Ok(ClientCommand::CollRead { name: "object", key, op, level: None, reshape });
    }
    // Any type's: a constant for a key that exists.
    let constant = if op == StringRead::RefCount { 1 } else { 0 };
    let (op, reshape) =
        (Box::new(keel_types::coll::CollRead::Type), super::Reshape::IfExists(constant));
    Ok(ClientCommand::CollRead { name: "object", key, op, level: None, reshape })
}

/// `MEMORY USAGE key [SAMPLES n]`: the bytes the key takes in the state.
fn memory(mut words: Words, count: usize, limits: &Limits) -> Result<ClientCommand, CommandError> {
    at_least("memory", count, 1)?;
    let sub = next(&mut words)?;
    if !is(&sub, "usage") {
        let subcommand = String::from_utf8_lossy(&sub).into_owned();
        return Err(CommandError::UnknownSubcommand { command: "MEMORY", subcommand });
    }
    if count != 2 && count != 4 {
        return Err(arity("memory|usage"));
    }
    let key = key(next(&mut words)?, limits)?;
    if count == 4 && !is(&next(&mut words)?, "samples") {
        return Err(CommandError::Syntax);
    }
    let (op, reshape) = (Box::new(keel_types::coll::CollRead::Memory), super::Reshape::None);
    Ok(ClientCommand::CollRead { name: "memory", key, op, level: None, reshape })
}

/// `BITPOS key bit [start [end [BYTE|BIT]]]`.
fn bitpos(mut words: Words, count: usize, limits: &Limits) -> Result<ClientCommand, CommandError> {
    if !(2..=5).contains(&count) {
        return Err(arity("bitpos"));
    }
    let key = key(next(&mut words)?, limits)?;
    let bit = match &next(&mut words)?[..] {
        b"0" => false,
        b"1" => true,
        _ => return Err(CommandError::BitValue),
    };
    let range = match words.next() {
        None => None,
        Some(start) => {
            let start = integer(&start)?;
            let end = words.next().map(|w| integer(&w)).transpose()?;
            Some((start, end, in_bits(words.next())?))
        }
    };
    Ok(ClientCommand::ReadString { key, op: super::StringRead::BitPos(bit, range), level: None })
}

/// `DEBUG SLEEP seconds` (this connection waits; nothing else does), at most a minute.
fn debug(mut words: Words, count: usize) -> Result<ClientCommand, CommandError> {
    at_least("debug", count, 1)?;
    let sub = next(&mut words)?;
    if !is(&sub, "sleep") {
        let subcommand = String::from_utf8_lossy(&sub).into_owned();
        return Err(CommandError::UnknownSubcommand { command: "DEBUG", subcommand });
    }
    exactly("debug|sleep", count, 2)?;
    let seconds = std::str::from_utf8(&next(&mut words)?)
        .ok()
        .and_then(|t| t.parse::<f64>().ok())
        .filter(|s| (0.0..=60.0).contains(s))
        .ok_or(CommandError::Unsupported("DEBUG SLEEP takes 0 to 60 seconds"))?;
    Ok(ClientCommand::DebugSleep(std::time::Duration::from_secs_f64(seconds)))
}

/// The unit word of `BITCOUNT` and `BITPOS` ranges: `BIT` (true) or `BYTE`, the default.
fn in_bits(word: Option<Bytes>) -> Result<bool, CommandError> {
    match word {
        None => Ok(false),
        Some(w) if is(&w, "byte") => Ok(false),
        Some(w) if is(&w, "bit") => Ok(true),
        Some(_) => Err(CommandError::Syntax),
    }
}

/// `MOVE key db`: to another database of the same keyspace.
fn move_key(
    mut words: Words,
    count: usize,
    limits: &Limits,
) -> Result<ClientCommand, CommandError> {
    exactly("move", count, 2)?;
    let from = key(next(&mut words)?, limits)?;
    let db = integer(&next(&mut words)?)?;
    let db = u32::try_from(db).map_err(|_| CommandError::DbIndexOutOfRange)?;
    let (to, form) = (from.clone(), super::TransferForm::Move);
    Ok(ClientCommand::Transfer {
        from,
        to,
        replace: false,
        remove_source: true,
        form,
        to_db: Some(db),
        durability: None,
    })
}

/// `SWAPDB index index`, with Redis's refusals of an index that is no number.
fn swap_db(mut words: Words, count: usize) -> Result<ClientCommand, CommandError> {
    exactly("swapdb", count, 2)?;
    let mut index = |which: &'static str| -> Result<u32, CommandError> {
        let word = next(&mut words)?;
        let n = integer(&word).map_err(|_| CommandError::InvalidDbIndex(which))?;
        u32::try_from(n).map_err(|_| CommandError::DbIndexOutOfRange)
    };
    let a = index("first")?;
    let b = index("second")?;
    Ok(ClientCommand::SwapDb { a, b })
}

/// `KEEL.NODE ADD|PROMOTE|REMOVE|TRANSFER-LEADER|RETURN id`.
fn node(mut words: Words, count: usize) -> Result<ClientCommand, CommandError> {
    exactly("keel.node", count, 2)?;
    let change = next(&mut words)?;
    let id = next(&mut words)?;
    let id = integer(&id).ok().and_then(|n| u32::try_from(n).ok()).filter(|n| *n > 0);
    let Some(id) = id.map(keel_types::NodeId) else {
        return Err(CommandError::NotAnInteger);
    };
    use keel_types::ClusterOp;
    let op = if is(&change, "add") {
        ClusterOp::AddLearner(id)
    } else if is(&change, "promote") {
        ClusterOp::Promote(id)
    } else if is(&change, "remove") {
        ClusterOp::Remove(id)
    } else if is(&change, "transfer-leader") {
        ClusterOp::TransferLeader(id)
    } else if is(&change, "return") {
        ClusterOp::Return(id)
    } else {
        let subcommand = String::from_utf8_lossy(&change).into_owned();
        return Err(CommandError::UnknownSubcommand { command: "KEEL.NODE", subcommand });
    };
    Ok(ClientCommand::Node { op })
}

/// `KEEL.SLOTS STATE | OCCUPIED first last | IMPORT|MIGRATE id keyspace first last |
/// HOLD id slot count | FILL id slot key image [key image ...] | RELEASE id slot key
/// [key ...] | OWN|GIVE id first last` (`keel_types::slots`; `id`: the move's).
fn slots(mut words: Words, count: usize, limits: &Limits) -> Result<ClientCommand, CommandError> {
    use keel_types::slots::{SlotOp, SLOTS, SLOT_BATCH_MAX};
    at_least("keel.slots", count, 1)?;
    let sub = lowercase(&next(&mut words)?);
    let number = |word: Bytes, max: u64| -> Result<u64, CommandError> {
        let text = std::str::from_utf8(&word).map_err(|_| CommandError::NotAnInteger)?;
        text.parse::<u64>().ok().filter(|n| *n <= max).ok_or(CommandError::NotAnInteger)
    };
    let slot = |words: &mut Words| -> Result<u16, CommandError> {
        Ok(number(next(words)?, u64::from(SLOTS - 1))? as u16)
    };
    let range = |words: &mut Words| -> Result<(u16, u16), CommandError> {
        let (first, last) = (slot(words)?, slot(words)?);
        match first <= last {
            true => Ok((first, last)),
            false => Err(CommandError::Syntax),
        }
    };
    let keyspace = |words: &mut Words| -> Result<keel_types::KeyspaceId, CommandError> {
        Ok(keel_types::KeyspaceId(number(next(words)?, u64::from(u32::MAX))? as u32))
    };
    let id = |words: &mut Words| number(next(words)?, u64::MAX);
    let key = |word: Bytes| -> Result<Bytes, CommandError> {
        limits.check_key(&word).map_err(CommandError::Invalid)?;
        Ok(word)
    };
    let op = match (sub.as_str(), count) {
        ("state", 1) => None,
        ("occupied", 3) => {
            let (first, last) = range(&mut words)?;
            Some(SlotOp::Occupied { first, last })
        }
        ("import", 5) => {
            let (id, from) = (id(&mut words)?, keyspace(&mut words)?);
            let (first, last) = range(&mut words)?;
            Some(SlotOp::Import { first, last, from, id })
        }
        ("migrate", 5) => {
            let (id, to) = (id(&mut words)?, keyspace(&mut words)?);
            let (first, last) = range(&mut words)?;
            Some(SlotOp::Migrate { first, last, to, id })
        }
        ("hold", 4) => {
            let (id, slot) = (id(&mut words)?, slot(&mut words)?);
            let count = number(next(&mut words)?, SLOT_BATCH_MAX as u64)?.max(1) as u32;
            Some(SlotOp::Hold { slot, count, id })
        }
        ("fill", n) if n >= 3 && n % 2 == 1 && (n - 3) / 2 <= SLOT_BATCH_MAX => {
            let (id, slot) = (id(&mut words)?, slot(&mut words)?);
            let mut items = Vec::with_capacity((n - 3) / 2);
            while let Some(word) = words.next() {
                let image = next(&mut words)?;
                limits.check_value(&image).map_err(CommandError::Invalid)?;
                items.push((key(word)?, image));
            }
            Some(SlotOp::Fill { slot, items, id })
        }
        ("release", n) if n >= 3 && n - 3 <= SLOT_BATCH_MAX => {
            let (id, slot) = (id(&mut words)?, slot(&mut words)?);
            let keys = words.map(key).collect::<Result<Vec<_>, _>>()?;
            Some(SlotOp::Release { slot, keys, id })
        }
        ("own", 4) => {
            let id = id(&mut words)?;
            let (first, last) = range(&mut words)?;
            Some(SlotOp::Own { first, last, id })
        }
        ("give", 4) => {
            let id = id(&mut words)?;
            let (first, last) = range(&mut words)?;
            Some(SlotOp::Give { first, last, id })
        }
        (
            "state" | "import" | "migrate" | "hold" | "fill" | "release" | "own" | "occupied"
            | "give",
            _,
        ) => {
            return Err(CommandError::WrongArity { name: format!("keel.slots|{sub}") });
        }
        _ => {
            return Err(CommandError::UnknownSubcommand { command: "KEEL.SLOTS", subcommand: sub })
        }
    };
    if op.as_ref().is_some_and(|op| !op.valid()) {
        let why = "every key of a KEEL.SLOTS step must be of its slot".to_string();
        return Err(CommandError::Invalid(keel_types::KeelError::InvalidArgument(why)));
    }
    Ok(ClientCommand::Slots { op })
}

/// `FLUSHDB`, `FLUSHALL` `[ASYNC|SYNC]` (both flush at once: the deletion is one entry).
fn flush(name: &str, mut words: Words, count: usize) -> Result<ClientCommand, CommandError> {
    if count > 1 {
        return Err(CommandError::Syntax);
    }
    if let Some(mode) = words.next() {
        if !is(&mode, "async") && !is(&mode, "sync") {
            return Err(CommandError::Syntax);
        }
    }
    Ok(ClientCommand::Flush { all: name == "flushall" })
}

/// `FUNCTION FLUSH [ASYNC|SYNC]`; other `FUNCTION` subcommands are refused by name.
fn function(mut words: Words, count: usize) -> Result<ClientCommand, CommandError> {
    at_least("function", count, 1)?;
    let sub = next(&mut words)?;
    if !is(&sub, "flush") {
        let subcommand = String::from_utf8_lossy(&sub).into_owned();
        return Err(CommandError::UnknownSubcommand { command: "FUNCTION", subcommand });
    }
    match words.next() {
        Some(mode) if !is(&mode, "async") && !is(&mode, "sync") => Err(CommandError::Syntax),
        _ if count > 2 => Err(CommandError::Syntax),
        _ => Ok(ClientCommand::FunctionFlush),
    }
}

/// `PERSIST key`: clears an expiry (`1` if there was one).
fn persist(mut words: Words, count: usize, limits: &Limits) -> Result<ClientCommand, CommandError> {
    exactly("persist", count, 1)?;
    let key = key(next(&mut words)?, limits)?;
    Ok(ClientCommand::Expire { key, ttl: Ttl::Clear, cond: ExpireCond::IfSome, durability: None })
}

/// `TTL`, `PTTL`, `EXPIRETIME`, `PEXPIRETIME` `key [LEVEL level]`.
fn ttl_query(
    name: &str,
    mut words: Words,
    count: usize,
    limits: &Limits,
) -> Result<ClientCommand, CommandError> {
    at_least(name, count, 1)?;
    let key = key(next(&mut words)?, limits)?;
    let level = match (words.next(), words.next()) {
        (None, _) => None,
        (Some(option), Some(level)) if is(&option, "level") => Some(read_level(&level)?),
        _ => return Err(arity(name)),
    };
    if words.next().is_some() {
        return Err(arity(name));
    }
    let form = match name {
        "ttl" => TtlForm::Seconds,
        "pttl" => TtlForm::Millis,
        "expiretime" => TtlForm::UnixSeconds,
        _ => TtlForm::UnixMillis,
    };
    Ok(ClientCommand::Ttl { key, form, level })
}

fn keys(name: &str, words: Words, count: usize, limits: &Limits) -> Result<Vec<Key>, CommandError> {
    at_least(name, count, 1)?;
    let keys = words.map(|word| key(word, limits)).collect::<Result<Vec<_>, _>>()?;
    assert_eq!(keys.len(), count);
    Ok(keys)
}

fn incr(
    name: &str,
    mut words: Words,
    count: usize,
    limits: &Limits,
) -> Result<ClientCommand, CommandError> {
    let by = name.ends_with("by");
    exactly(name, count, if by { 2 } else { 1 })?;
    let key = key(next(&mut words)?, limits)?;
    let amount = if by { integer(&next(&mut words)?)? } else { 1 };
    let delta = if name.starts_with("decr") {
        amount.checked_neg().ok_or(CommandError::DecrementOverflow)?
    } else {
        amount
    };
    Ok(ClientCommand::Incr { key, delta, fetch: false })
}

/// `KEEL.FAA key delta`: fetch-and-add, answering the value before.
fn faa(mut words: Words, count: usize, limits: &Limits) -> Result<ClientCommand, CommandError> {
    exactly("keel.faa", count, 2)?;
    let key = key(next(&mut words)?, limits)?;
    let delta = integer(&next(&mut words)?)?;
    Ok(ClientCommand::Incr { key, delta, fetch: true })
}

fn mget(words: Words, count: usize, limits: &Limits) -> Result<ClientCommand, CommandError> {
    at_least("mget", count, 1)?;
    let mut words: Vec<Bytes> = words.collect();
    let mut level = None;
    if words.len() >= 3 && is(&words[words.len() - 2], "level") {
        let word = words.pop().expect("at least three words");
        level = Some(read_level(&word)?);
        words.pop();
    }
    let keys = words.into_iter().map(|word| key(word, limits)).collect::<Result<Vec<_>, _>>()?;
    debug_assert!(!keys.is_empty());
    Ok(ClientCommand::MGet { keys, level })
}

/// Reads an argument that may be a sentinel (`-nil`, `+inf`): `None` for the sentinel,
/// the argument less its first byte when it starts with the escape (`--`, `++`).
fn sentinel(word: Bytes, sentinel: &[u8], escape: &[u8]) -> Option<Bytes> {
    if word == sentinel {
        None
    } else if word.starts_with(escape) {
        Some(word.slice(1..))
    } else {
        Some(word)
    }
}

fn cas(mut words: Words, count: usize, limits: &Limits) -> Result<ClientCommand, CommandError> {
    at_least("keel.cas", count, 3)?;
    let key = key(next(&mut words)?, limits)?;
    let expected = match sentinel(next(&mut words)?, b"-nil", b"--") {
        Some(bytes) => Some(value(bytes, limits)?),
        None => None,
    };
    let new = value(next(&mut words)?, limits)?;
    let (mut durability_asked, mut mode) = (None, OpMode::Plain);
    while let Some(option) = words.next() {
        if is(&option, "durability") {
            once(durability_asked.is_some())?;
            durability_asked = Some(durability(&next(&mut words)?)?);
        } else if is(&option, "weak") || is(&option, "strong") {
            once(mode != OpMode::Plain)?;
            mode = if is(&option, "weak") { OpMode::Weak } else { OpMode::Strong };
        } else {
            return Err(CommandError::Syntax);
        }
    }
    Ok(ClientCommand::Cas { key, expected, new, durability: durability_asked, mode })
}

/// `[DURABILITY d]`, the only option of the queue writes.
fn durability_option(mut words: Words) -> Result<Option<Durability>, CommandError> {
    let mut asked = None;
    while let Some(option) = words.next() {
        if !is(&option, "durability") {
            return Err(CommandError::Syntax);
        }
        once(asked.is_some())?;
        asked = Some(durability(&next(&mut words)?)?);
    }
    Ok(asked)
}

fn enqueue(mut words: Words, count: usize, limits: &Limits) -> Result<ClientCommand, CommandError> {
    at_least("keel.enqueue", count, 2)?;
    let queue = key(next(&mut words)?, limits)?;
    let value = value(next(&mut words)?, limits)?;
    Ok(ClientCommand::Enqueue { queue, value, durability: durability_option(words)? })
}

fn dequeue(mut words: Words, count: usize, limits: &Limits) -> Result<ClientCommand, CommandError> {
    at_least("keel.dequeue", count, 1)?;
    let queue = key(next(&mut words)?, limits)?;
    Ok(ClientCommand::Dequeue { queue, durability: durability_option(words)? })
}

fn queue_peek(
    mut words: Words,
    count: usize,
    limits: &Limits,
) -> Result<ClientCommand, CommandError> {
    at_least("keel.qpeek", count, 1)?;
    let queue = key(next(&mut words)?, limits)?;
    let mut level = None;
    while let Some(option) = words.next() {
        if !is(&option, "level") {
            return Err(CommandError::Syntax);
        }
        once(level.is_some())?;
        level = Some(read_level(&next(&mut words)?)?);
    }
    Ok(ClientCommand::QueuePeek { queue, level })
}

fn scan(mut words: Words, count: usize, limits: &Limits) -> Result<ClientCommand, CommandError> {
    at_least("keel.scan", count, 2)?;
    let start = key(next(&mut words)?, limits)?;
    let end = match sentinel(next(&mut words)?, b"+inf", b"++") {
        Some(bytes) => Some(key(bytes, limits)?),
        None => None,
    };
    let (mut items, mut level, mut counted) = (SCAN_COUNT_DEFAULT, None, false);
    while let Some(option) = words.next() {
        if is(&option, "count") {
            once(counted)?;
            counted = true;
            let asked = integer(&next(&mut words)?)?;
            items = u32::try_from(asked).map_err(|_| CommandError::NotAnInteger)?;
        } else if is(&option, "level") {
            once(level.is_some())?;
            level = Some(read_level(&next(&mut words)?)?);
        } else {
            return Err(CommandError::Syntax);
        }
    }
    let command = keel_types::Command::Scan { start, end, limit: items };
    command.validate(limits).map_err(CommandError::Invalid)?;
    let keel_types::Command::Scan { start, end, limit } = command else {
        unreachable!("built above")
    };
    Ok(ClientCommand::Scan { start, end, count: limit, level })
}

fn client(mut words: Words, count: usize) -> Result<ClientCommand, CommandError> {
    at_least("client", count, 1)?;
    let subcommand = lowercase(&next(&mut words)?);
    let parsed = match subcommand.as_str() {
        "setname" => {
            exactly("client|setname", count, 2)?;
            ClientSubcommand::SetName(next(&mut words)?)
        }
        "getname" => {
            exactly("client|getname", count, 1)?;
            ClientSubcommand::GetName
        }
        "id" => {
            exactly("client|id", count, 1)?;
            ClientSubcommand::Id
        }
        "unblock" => {
            if !(2..=3).contains(&count) {
                return Err(CommandError::WrongArity { name: "client|unblock".into() });
            }
            let id = u64::try_from(integer(&next(&mut words)?)?)
                .map_err(|_| CommandError::NotAnInteger)?;
            let error = match words.next() {
                None => false,
                Some(how) if is(&how, "timeout") => false,
                Some(how) if is(&how, "error") => true,
                Some(_) => {
                    return Err(CommandError::Unsupported(
                        "CLIENT UNBLOCK reason should be TIMEOUT or ERROR",
                    ))
                }
            };
            ClientSubcommand::Unblock { id, error }
        }
        "setinfo" => {
            exactly("client|setinfo", count, 3)?;
            let attribute = lowercase(&next(&mut words)?);
            ClientSubcommand::SetInfo { attribute, value: next(&mut words)? }
        }
        "list" => {
            // `CLIENT LIST [TYPE normal] [ID id ...]`: the filters Keel applies.
            let mut ids = Vec::new();
            while let Some(option) = words.next() {
                if is(&option, "id") {
                    for id in words.by_ref() {
                        ids.push(
                            u64::try_from(integer(&id)?).map_err(|_| CommandError::NotAnInteger)?,
                        );
                    }
                } else if is(&option, "type") {
                    if !is(&next(&mut words)?, "normal") {
                        return Err(CommandError::Syntax);
                    }
                } else {
                    return Err(CommandError::Syntax);
                }
            }
            ClientSubcommand::List { ids }
        }
        "info" => {
            exactly("client|info", count, 1)?;
            ClientSubcommand::Info
        }
        "kill" => client_kill(words, count)?,
        "no-evict" => {
            exactly("client|no-evict", count, 2)?;
            match lowercase(&next(&mut words)?).as_str() {
                "on" | "off" => ClientSubcommand::NoEvict,
                _ => return Err(CommandError::Syntax),
            }
        }
        "reply" => {
            exactly("client|reply", count, 2)?;
            ClientSubcommand::Reply(match lowercase(&next(&mut words)?).as_str() {
                "on" => super::ReplyMode::On,
                "off" => super::ReplyMode::Off,
                "skip" => super::ReplyMode::Skip,
                _ => return Err(CommandError::Syntax),
            })
        }
        _ => ClientSubcommand::Other(subcommand),
    };
    Ok(ClientCommand::Client(parsed))
}

/// The pub/sub commands (`name` lowercased).
fn pubsub(name: &str, mut words: Words, count: usize) -> Result<ClientCommand, CommandError> {
    use super::{PubSubCommand as P, Space};
    // `n` is the name without its `un`: `subscribe`, `psubscribe` or `ssubscribe`.
    let space = |n: &str| match n {
        "psubscribe" => Space::Pattern,
        "ssubscribe" => Space::Shard,
        _ => Space::Channel,
    };
    let parsed = match name {
        "subscribe" | "psubscribe" | "ssubscribe" => {
            at_least(name, count, 1)?;
            P::Subscribe { space: space(name), names: words.collect() }
        }
        "unsubscribe" | "punsubscribe" | "sunsubscribe" => {
            let subscribe = name.replacen("un", "", 1);
            P::Unsubscribe { space: space(&subscribe), names: words.collect() }
        }
        "publish" | "spublish" => {
            exactly(name, count, 2)?;
            let channel = next(&mut words)?;
            P::Publish { shard: name == "spublish", channel, message: next(&mut words)? }
        }
        _ => {
            at_least("pubsub", count, 1)?;
            let sub = lowercase(&next(&mut words)?);
            match sub.as_str() {
                "channels" | "shardchannels" if count <= 2 => {
                    P::Channels { shard: sub.starts_with('s'), pattern: words.next() }
                }
                "numsub" | "shardnumsub" => {
                    P::NumSub { shard: sub.starts_with('s'), channels: words.collect() }
                }
                "numpat" if count == 1 => P::NumPat,
                "help" if count == 1 => P::Help,
                "channels" | "shardchannels" | "numpat" | "help" => {
                    return Err(arity(&format!("pubsub|{sub}")))
                }
                _ => {
                    return Err(CommandError::UnknownSubcommand {
                        command: "PUBSUB",
                        subcommand: sub,
                    })
                }
            }
        }
    };
    Ok(ClientCommand::PubSub(parsed))
}

/// `CLIENT KILL ip:port` (the old form), or `CLIENT KILL [ID id] [ADDR ip:port]
/// [USER name] [SKIPME yes|no]`.
fn client_kill(mut words: Words, count: usize) -> Result<ClientSubcommand, CommandError> {
    at_least("client|kill", count, 2)?;
    if count == 2 {
        let addr = String::from_utf8_lossy(&next(&mut words)?).into_owned();
        return Ok(ClientSubcommand::Kill {
            filter: super::KillFilter { addr: Some(addr), ..Default::default() },
            old_form: true,
        });
    }
    if count.is_multiple_of(2) {
        return Err(CommandError::Syntax);
    }
    let mut filter = super::KillFilter { skip_me: true, ..Default::default() };
    while let (Some(name), Some(value)) = (words.next(), words.next()) {
        let text = || String::from_utf8_lossy(&value).into_owned();
        match lowercase(&name).as_str() {
            "id" => {
                filter.id = Some(u64::try_from(integer(&value)?).map_err(|_| CommandError::Syntax)?)
            }
            "addr" => filter.addr = Some(text()),
            "user" => filter.user = Some(text()),
            "skipme" if is(&value, "yes") => filter.skip_me = true,
            "skipme" if is(&value, "no") => filter.skip_me = false,
            "type" if is(&value, "normal") => {}
            "type" => filter.none = true,
            _ => return Err(CommandError::Syntax),
        }
    }
    Ok(ClientSubcommand::Kill { filter, old_form: false })
}

fn command(mut words: Words) -> Result<ClientCommand, CommandError> {
    let Some(subcommand) = words.next() else {
        return Ok(ClientCommand::Command(CommandQuery::All));
    };
    let query = match lowercase(&subcommand).as_str() {
        "count" if words.len() == 0 => CommandQuery::Count,
        "count" => return Err(arity("command|count")),
        "list" => CommandQuery::List,
        "docs" => CommandQuery::Docs(words.collect()),
        "info" => CommandQuery::Info(words.collect()),
        "getkeys" if words.len() == 0 => return Err(arity("command|getkeys")),
        "getkeys" => CommandQuery::GetKeys(words.collect()),
        _ => {
            let subcommand = String::from_utf8_lossy(&subcommand).into_owned();
            return Err(CommandError::UnknownSubcommand { command: "COMMAND", subcommand });
        }
    };
    Ok(ClientCommand::Command(query))
}

fn config(mut words: Words, count: usize) -> Result<ClientCommand, CommandError> {
    at_least("config", count, 1)?;
    let subcommand = next(&mut words)?;
    if is(&subcommand, "get") {
        at_least("config|get", count, 2)?;
        return Ok(ClientCommand::ConfigGet { parameters: words.collect() });
    }
    if is(&subcommand, "set") {
        if count < 3 || count.is_multiple_of(2) {
            return Err(arity("config|set"));
        }
        let mut pairs = Vec::with_capacity(count / 2);
        while let (Some(name), Some(value)) = (words.next(), words.next()) {
            pairs.push((lowercase(&name), value));
        }
        return Ok(ClientCommand::ConfigSet { pairs });
    }
    if is(&subcommand, "resetstat") {
        exactly("config|resetstat", count, 1)?;
        return Ok(ClientCommand::ConfigResetStat);
    }
    let subcommand = String::from_utf8_lossy(&subcommand).into_owned();
    Err(CommandError::UnknownSubcommand { command: "CONFIG", subcommand })
}

fn select(mut words: Words, count: usize) -> Result<ClientCommand, CommandError> {
    exactly("select", count, 1)?;
    let index = integer(&next(&mut words)?)?;
    let index = u32::try_from(index).map_err(|_| CommandError::DbIndexOutOfRange)?;
    Ok(ClientCommand::Select { index })
}
