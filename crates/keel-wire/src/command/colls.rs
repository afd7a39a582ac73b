//! Parsers of Redis's collection commands: hashes, lists, sets, sorted sets and the
//! blocking pops, each to a [`ClientCommand::Coll`], [`ClientCommand::CollRead`] or
//! [`ClientCommand::Block`] carrying a `keel_types::coll` operation.
//!
//! Keel's options: a write takes a trailing `DURABILITY d`, a read `LEVEL l`, when the
//! last two words are the option's name and a valid value (a field or member named
//! `durability` or `level` as the last but one argument is read as the option).

use super::parse::{
    arity, at_least, exactly, integer, is, key, next, unknown_command, value, Words,
};
use super::{ClientCommand, CommandError, Reshape};
use bytes::Bytes;
use keel_types::coll::{
    parse_score, Aggregate, Algebra, CollKind, CollOp, CollRead, End, LexBound, ScoreBound,
    SortSpec, ZAddFlags, ZBy, ZCombine, ZRangeSpec,
};
use keel_types::{Durability, Key, Limits, ReadLevel, Value};
use std::time::Duration;

/// Elements an `HSCAN`, `SSCAN` or `ZSCAN` page holds unless `COUNT` says otherwise.
const SCAN_PAGE_DEFAULT: u64 = 10;

/// The collection command `name`, or Redis's unknown-command error.
pub(super) fn parse(
    name: &str,
    raw_name: Bytes,
    words: Vec<Bytes>,
    limits: &Limits,
) -> Result<ClientCommand, CommandError> {
    let Some(name) = NAMES.iter().copied().find(|n| *n == name) else {
        return Err(unknown_command(&raw_name, &words));
    };
    let mut words = words;
    let option = keel_option(&mut words);
    let count = words.len();
    let rest = words.into_iter();
    let mut command = parse_named(name, rest, count, limits)?;
    match (&mut command, option) {
        (_, None) => {}
        (ClientCommand::Coll { durability, .. }, Some(Opt::Durability(d)))
        | (ClientCommand::Block { durability, .. }, Some(Opt::Durability(d))) => {
            *durability = Some(d)
        }
        (ClientCommand::CollRead { level, .. }, Some(Opt::Level(l))) => *level = Some(l),
        _ => return Err(CommandError::Syntax),
    }
    Ok(command)
}

/// Every name [`parse`] knows.
pub const NAMES: &[&str] = &[
    "hset",
    "hmset",
    "hsetnx",
    "hget",
    "hmget",
    "hdel",
    "hexists",
    "hlen",
    "hstrlen",
    "hkeys",
    "hvals",
    "hgetall",
    "hincrby",
    "hincrbyfloat",
    "hrandfield",
    "hscan",
    "lpush",
    "rpush",
    "lpushx",
    "rpushx",
    "lpop",
    "rpop",
    "llen",
    "lrange",
    "lindex",
    "lset",
    "linsert",
    "lrem",
    "ltrim",
    "lpos",
    "lmove",
    "rpoplpush",
    "lmpop",
    "blpop",
    "brpop",
    "blmove",
    "brpoplpush",
    "blmpop",
    "sadd",
    "srem",
    "sismember",
    "smismember",
    "smembers",
    "scard",
    "spop",
    "srandmember",
    "smove",
    "sinter",
    "sunion",
    "sdiff",
    "sinterstore",
    "sunionstore",
    "sdiffstore",
    "sintercard",
    "sscan",
    "zadd",
    "zincrby",
    "zrem",
    "zscore",
    "zmscore",
    "zcard",
    "zcount",
    "zlexcount",
    "zrange",
    "zrangebyscore",
    "zrevrangebyscore",
    "zrangebylex",
    "zrevrangebylex",
    "zrevrange",
    "zrangestore",
    "sort",
    "sort_ro",
    "zrank",
    "zrevrank",
    "zpopmin",
    "zpopmax",
    "bzpopmin",
    "bzpopmax",
    "zremrangebyrank",
    "zremrangebyscore",
    "zremrangebylex",
    "zunion",
    "zinter",
    "zdiff",
    "zunionstore",
    "zinterstore",
    "zdiffstore",
    "zintercard",
    "zrandmember",
    "zmpop",
    "bzmpop",
    "zscan",
];

enum Opt {
    Durability(Durability),
    Level(ReadLevel),
}

/// A trailing `DURABILITY d` or `LEVEL l` with a valid value, taken off `words` when at
/// least a key and one argument stay before it.
fn keel_option(words: &mut Vec<Bytes>) -> Option<Opt> {
    let n = words.len();
    if n < 4 {
        return None;
    }
    let option = if is(&words[n - 2], "durability") {
        Opt::Durability(String::from_utf8_lossy(&words[n - 1]).parse().ok()?)
    } else if is(&words[n - 2], "level") {
        Opt::Level(String::from_utf8_lossy(&words[n - 1]).parse().ok()?)
    } else {
        return None;
    };
    words.truncate(n - 2);
    Some(option)
}

fn write(name: &'static str, key: Key, op: CollOp) -> ClientCommand {
    ClientCommand::Coll { name, key, op: Box::new(op), durability: None, reshape: Reshape::None }
}

fn read(name: &'static str, key: Key, op: CollRead) -> ClientCommand {
    ClientCommand::CollRead { name, key, op: Box::new(op), level: None, reshape: Reshape::None }
}

fn values(words: Words, limits: &Limits) -> Result<Vec<Value>, CommandError> {
    words.map(|w| value(w, limits)).collect()
}

fn keys_of(words: Words, limits: &Limits) -> Result<Vec<Key>, CommandError> {
    words.map(|w| key(w, limits)).collect()
}

fn float(word: &[u8]) -> Result<f64, CommandError> {
    parse_score(word).ok_or(CommandError::NotAFloat)
}

/// A count that must not be negative (`LPOP k -1`: Redis's "must be positive").
fn positive(word: &[u8]) -> Result<u64, CommandError> {
    let n = integer(word)?;
    u64::try_from(n)
        .map_err(|_| CommandError::Unsupported("value is out of range, must be positive"))
}

fn end(word: &[u8]) -> Result<End, CommandError> {
    if is(word, "left") {
        Ok(End::Front)
    } else if is(word, "right") {
        Ok(End::Back)
    } else {
        Err(CommandError::Syntax)
    }
}

/// A blocking command's timeout in seconds (fractions allowed; 0: forever).
fn timeout(word: &[u8]) -> Result<Option<Duration>, CommandError> {
    let seconds = parse_score(word)
        .filter(|s| s.is_finite())
        .ok_or(CommandError::Unsupported("timeout is not a float or out of range"))?;
    if seconds < 0.0 {
        return Err(CommandError::Unsupported("timeout is negative"));
    }
    Ok((seconds > 0.0).then(|| Duration::from_secs_f64(seconds.min(1e9))))
}

/// `numkeys key [key ...]` of the multi-key forms: the keys, the words after them.
fn numkeys(name: &str, words: &mut Words, limits: &Limits) -> Result<Vec<Key>, CommandError> {
    let word = next(words)?;
    let sorted = name.starts_with('z') && name != "zmpop";
    let n = match sorted {
        // `ZUNION` and kin read any integer, then ask for one key at least.
        true => match integer(&word)? {
            n if n >= 1 => n,
            _ => {
                return Err(CommandError::Invalid(keel_types::KeelError::InvalidArgument(format!(
                    "at least 1 input key is needed for '{name}' command"
                ))))
            }
        },
        false => integer(&word)
            .ok()
            .filter(|n| *n > 0)
            .ok_or(CommandError::Unsupported("numkeys should be greater than 0"))?,
    };
    if n as usize > words.len() {
        return Err(match name {
            "sintercard" => {
                CommandError::Unsupported("Number of keys can't be greater than number of args")
            }
            _ => CommandError::Syntax,
        });
    }
    (0..n).map(|_| key(next(words)?, limits)).collect()
}

fn score_bound(word: &[u8]) -> Result<ScoreBound, CommandError> {
    let not_float = CommandError::Unsupported("min or max is not a float");
    let (open, text) = match word.split_first() {
        Some((b'(', rest)) => (true, rest),
        _ => (false, word),
    };
    let score = parse_score(text).ok_or(not_float)?;
    Ok(ScoreBound { score: score.to_bits(), open })
}

fn lex_bound(word: &Bytes) -> Result<LexBound, CommandError> {
    match word.first() {
        Some(b'-') if word.len() == 1 => Ok(LexBound::Min),
        Some(b'+') if word.len() == 1 => Ok(LexBound::Max),
        Some(b'[') => Ok(LexBound::Incl(word.slice(1..))),
        Some(b'(') => Ok(LexBound::Excl(word.slice(1..))),
        _ => Err(CommandError::Unsupported("min or max not valid string range item")),
    }
}

/// `SORT key [BY pattern] [LIMIT offset count] [ASC|DESC] [ALPHA] [STORE destination]`
/// and `SORT_RO` (without `STORE`). `BY` a pattern with no `*` means no sorting; `BY` a
/// pattern with one, and `GET`, read other keys and are refused.
fn sort(
    name: &'static str,
    w: &mut Words,
    count: usize,
    limits: &Limits,
) -> Result<ClientCommand, CommandError> {
    at_least(name, count, 1)?;
    let source = key(next(w)?, limits)?;
    let mut spec = SortSpec::default();
    let mut store = None;
    while let Some(option) = w.next() {
        if is(&option, "limit") {
            spec.limit = Some((integer(&next(w)?)?, integer(&next(w)?)?));
        } else if is(&option, "asc") {
            spec.desc = false;
        } else if is(&option, "desc") {
            spec.desc = true;
        } else if is(&option, "alpha") {
            spec.alpha = true;
        } else if is(&option, "by") {
            let pattern = next(w)?;
            if pattern.contains(&b'*') {
                return Err(CommandError::Unsupported(
                    "SORT ... BY a pattern is not supported: Keel sorts by the elements themselves",
                ));
            }
            spec.unsorted = true;
        } else if is(&option, "get") {
            return Err(CommandError::Unsupported(
                "SORT ... GET is not supported: Keel's SORT answers the elements themselves",
            ));
        } else if is(&option, "store") && name == "sort" {
            store = Some(key(next(w)?, limits)?);
        } else {
            return Err(CommandError::Syntax);
        }
    }
    Ok(match store {
        Some(dest) => write(name, dest, CollOp::SortStore { source, spec }),
        None => read(name, source, CollRead::Sort(spec)),
    })
}

/// `[LIMIT offset count]` and `[WITHSCORES]` in any order, as the range forms allow.
fn range_options(
    words: &mut Words,
    limit_ok: bool,
    scores_ok: bool,
) -> Result<(Option<(i64, i64)>, bool), CommandError> {
    let (mut limit, mut with_scores) = (None, false);
    while let Some(option) = words.next() {
        if is(&option, "limit") && limit_ok {
            limit = Some((integer(&next(words)?)?, integer(&next(words)?)?));
        } else if is(&option, "withscores") && scores_ok {
            with_scores = true;
        } else {
            return Err(CommandError::Syntax);
        }
    }
    Ok((limit, with_scores))
}

/// The bounds of a range by `by` (`byscore`, `bylex` or rank), given in the command's
/// order (`rev`: high first), as a [`ZBy`] (always low first).
fn zby(kind: &str, a: &Bytes, b: &Bytes, rev: bool) -> Result<ZBy, CommandError> {
    let (low, high) = if rev { (b, a) } else { (a, b) };
    Ok(match kind {
        "score" => ZBy::Score(score_bound(low)?, score_bound(high)?),
        "lex" => ZBy::Lex(lex_bound(low)?, lex_bound(high)?),
        _ => ZBy::Rank(integer(a)?, integer(b)?),
    })
}

/// `ZRANGE`'s and `ZRANGESTORE`'s `min max [BYSCORE|BYLEX] [REV] [LIMIT o c]
/// [WITHSCORES]`.
fn zrange_spec(words: &mut Words, store: bool) -> Result<(ZRangeSpec, bool), CommandError> {
    let (a, b) = (next(words)?, next(words)?);
    let (mut by, mut rev, mut limit, mut with_scores) = ("rank", false, None, false);
    while let Some(option) = words.next() {
        if is(&option, "byscore") {
            by = "score";
        } else if is(&option, "bylex") {
            by = "lex";
        } else if is(&option, "rev") {
            rev = true;
        } else if is(&option, "limit") {
            limit = Some((integer(&next(words)?)?, integer(&next(words)?)?));
        } else if is(&option, "withscores") && !store {
            with_scores = true;
        } else {
            return Err(CommandError::Syntax);
        }
    }
    if limit.is_some() && by == "rank" {
        return Err(CommandError::Unsupported(
            "syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX",
        ));
    }
    if with_scores && by == "lex" {
        return Err(CommandError::Unsupported(
            "syntax error, WITHSCORES not supported in combination with BYLEX",
        ));
    }
    let by = zby(by, &a, &b, rev && by != "rank")?;
    Ok((ZRangeSpec { by, rev, limit }, with_scores))
}

/// `numkeys key ... [WEIGHTS w ...] [AGGREGATE SUM|MIN|MAX] [WITHSCORES]`.
fn zcombine(
    name: &str,
    how: Algebra,
    words: &mut Words,
    limits: &Limits,
    store: bool,
) -> Result<(Key, ZCombine, bool), CommandError> {
    let keys = numkeys(name, words, limits)?;
    let (mut weights, mut aggregate, mut with_scores) = (Vec::new(), Aggregate::Sum, false);
    while let Some(option) = words.next() {
        if is(&option, "weights") && how != Algebra::Diff {
            for _ in 0..keys.len() {
                let w = next(words)?;
                let w = parse_score(&w)
                    .ok_or(CommandError::Unsupported("weight value is not a float"))?;
                weights.push(w.to_bits());
            }
        } else if is(&option, "aggregate") && how != Algebra::Diff {
            let a = next(words)?;
            aggregate = if is(&a, "sum") {
                Aggregate::Sum
            } else if is(&a, "min") {
                Aggregate::Min
            } else if is(&a, "max") {
                Aggregate::Max
            } else {
                return Err(CommandError::Syntax);
            };
        } else if is(&option, "withscores") && !store {
            with_scores = true;
        } else {
            return Err(CommandError::Syntax);
        }
    }
    let mut keys = keys.into_iter();
    let first = keys.next().expect("numkeys is positive");
    Ok((first, ZCombine { how, others: keys.collect(), weights, aggregate }, with_scores))
}

fn scan(
    name: &'static str,
    kind: CollKind,
    mut words: Words,
    count: usize,
    limits: &Limits,
) -> Result<ClientCommand, CommandError> {
    at_least(name, count, 2)?;
    let k = key(next(&mut words)?, limits)?;
    let cursor = std::str::from_utf8(&next(&mut words)?)
        .ok()
        .and_then(|t| t.parse::<u64>().ok())
        .ok_or(CommandError::InvalidCursor)?;
    let (mut pattern, mut page) = (None, SCAN_PAGE_DEFAULT);
    while let Some(option) = words.next() {
        if is(&option, "match") {
            pattern = Some(next(&mut words)?);
        } else if is(&option, "count") {
            page = match integer(&next(&mut words)?)? {
                n if n >= 1 => n as u64,
                _ => return Err(CommandError::Syntax),
            };
        } else {
            return Err(CommandError::Syntax);
        }
    }
    let op = CollRead::Scan { kind, cursor, count: page };
    let reshape = match pattern {
        Some(pattern) => Reshape::Match { pattern, pairs: kind != CollKind::Set },
        None => Reshape::None,
    };
    Ok(ClientCommand::CollRead { name, key: k, op: Box::new(op), level: None, reshape })
}

/// A random-pick read's `[count [WITHxxx]]`.
fn pick_options(words: &mut Words, with_word: &str) -> Result<(Option<i64>, bool), CommandError> {
    let Some(count) = words.next() else { return Ok((None, false)) };
    let count = integer(&count)?;
    let with = match words.next() {
        None => false,
        Some(w) if is(&w, with_word) && words.len() == 0 => true,
        Some(_) => return Err(CommandError::Syntax),
    };
    if with && count.unsigned_abs() > (i64::MAX as u64) / 2 {
        return Err(CommandError::Unsupported("value is out of range"));
    }
    Ok((Some(count), with))
}

fn parse_named(
    name: &'static str,
    mut w: Words,
    count: usize,
    limits: &Limits,
) -> Result<ClientCommand, CommandError> {
    let w = &mut w;
    match name {
        "sort" | "sort_ro" => sort(name, w, count, limits),
        "hscan" => scan(name, CollKind::Hash, std::mem::take(w), count, limits),
        "sscan" => scan(name, CollKind::Set, std::mem::take(w), count, limits),
        "zscan" => scan(name, CollKind::ZSet, std::mem::take(w), count, limits),
        // Arms shared across families live with the first: the blocking and multi-key
        // pops with the lists, the intersection counts with the sets.
        "bzpopmin" | "bzpopmax" | "zmpop" | "bzmpop" => parse_list(name, w, count, limits),
        "zintercard" => parse_set(name, w, count, limits),
        n if n.starts_with('h') => parse_hash(name, w, count, limits),
        n if n.starts_with('s') => parse_set(name, w, count, limits),
        n if n.starts_with('z') || n.starts_with("bz") => parse_zset(name, w, count, limits),
        _ => parse_list(name, w, count, limits),
    }
}

/// The hash commands.
fn parse_hash(
    name: &'static str,
    w: &mut Words,
    count: usize,
    limits: &Limits,
) -> Result<ClientCommand, CommandError> {
    let k = |w: &mut Words| key(next(w)?, limits);
    let v = |w: &mut Words| value(next(w)?, limits);
    Ok(match name {
        "hset" | "hmset" => {
            if count < 3 || count.is_multiple_of(2) {
                return Err(arity(name));
            }
            let key = k(w)?;
            let mut pairs = Vec::with_capacity(count / 2);
            while w.len() > 0 {
                pairs.push((v(w)?, v(w)?));
            }
            let mut command = write(name, key, CollOp::HSet { pairs, only_new: false });
            if name == "hmset" {
                if let ClientCommand::Coll { reshape, .. } = &mut command {
                    *reshape = Reshape::Ok;
                }
            }
            command
        }
        "hsetnx" => {
            exactly(name, count, 3)?;
            let key = k(w)?;
            write(name, key, CollOp::HSet { pairs: vec![(v(w)?, v(w)?)], only_new: true })
        }
        "hget" | "hexists" | "hstrlen" => {
            exactly(name, count, 2)?;
            let (key, field) = (k(w)?, v(w)?);
            let op = match name {
                "hget" => CollRead::HGet { fields: vec![field], many: false },
                "hexists" => CollRead::HExists(field),
                _ => CollRead::HStrLen(field),
            };
            read(name, key, op)
        }
        "hmget" => {
            at_least(name, count, 2)?;
            let key = k(w)?;
            read(
                name,
                key,
                CollRead::HGet { fields: values(std::mem::take(w), limits)?, many: true },
            )
        }
        "hdel" => {
            at_least(name, count, 2)?;
            let key = k(w)?;
            write(name, key, CollOp::HDel { fields: values(std::mem::take(w), limits)? })
        }
        "hlen" | "hkeys" | "hvals" | "hgetall" => {
            exactly(name, count, 1)?;
            let op = match name {
                "hlen" => CollRead::HLen,
                "hkeys" => CollRead::HAll { fields: true, values: false },
                "hvals" => CollRead::HAll { fields: false, values: true },
                _ => CollRead::HAll { fields: true, values: true },
            };
            read(name, k(w)?, op)
        }
        "hincrby" => {
            exactly(name, count, 3)?;
            let (key, field) = (k(w)?, v(w)?);
            write(name, key, CollOp::HIncrBy { field, delta: integer(&next(w)?)? })
        }
        "hincrbyfloat" => {
            exactly(name, count, 3)?;
            let (key, field) = (k(w)?, v(w)?);
            let delta = float(&next(w)?)?;
            if !delta.is_finite() {
                return Err(CommandError::Unsupported("value is NaN or Infinity"));
            }
            write(name, key, CollOp::HIncrByFloat { field, delta: delta.to_bits() })
        }
        "hrandfield" => {
            at_least(name, count, 1)?;
            let key = k(w)?;
            let (count, with_values) = pick_options(w, "withvalues")?;
            read(name, key, CollRead::HRandField { count, with_values })
        }
        _ => unreachable!("{name} is a hash command"),
    })
}

/// The list commands.
fn parse_list(
    name: &'static str,
    w: &mut Words,
    count: usize,
    limits: &Limits,
) -> Result<ClientCommand, CommandError> {
    let k = |w: &mut Words| key(next(w)?, limits);
    let v = |w: &mut Words| value(next(w)?, limits);
    Ok(match name {
        "lpush" | "rpush" | "lpushx" | "rpushx" => {
            at_least(name, count, 2)?;
            let key = k(w)?;
            let end = if name.starts_with('l') { End::Front } else { End::Back };
            let values = values(std::mem::take(w), limits)?;
            write(name, key, CollOp::Push { end, values, only_existing: name.ends_with('x') })
        }
        "lpop" | "rpop" => {
            if !(1..=2).contains(&count) {
                return Err(arity(name));
            }
            let key = k(w)?;
            let end = if name == "lpop" { End::Front } else { End::Back };
            let count = w.next().map(|c| positive(&c)).transpose()?;
            write(name, key, CollOp::Pop { end, count })
        }
        "llen" => {
            exactly(name, count, 1)?;
            read(name, k(w)?, CollRead::LLen)
        }
        "lrange" => {
            exactly(name, count, 3)?;
            let key = k(w)?;
            read(name, key, CollRead::LRange(integer(&next(w)?)?, integer(&next(w)?)?))
        }
        "lindex" => {
            exactly(name, count, 2)?;
            let key = k(w)?;
            read(name, key, CollRead::LIndex(integer(&next(w)?)?))
        }
        "lset" => {
            exactly(name, count, 3)?;
            let key = k(w)?;
            let index = integer(&next(w)?)?;
            write(name, key, CollOp::LSet { index, value: v(w)? })
        }
        "linsert" => {
            exactly(name, count, 4)?;
            let key = k(w)?;
            let place = next(w)?;
            let before = if is(&place, "before") {
                true
            } else if is(&place, "after") {
                false
            } else {
                return Err(CommandError::Syntax);
            };
            write(name, key, CollOp::LInsert { before, pivot: v(w)?, value: v(w)? })
        }
        "lrem" => {
            exactly(name, count, 3)?;
            let key = k(w)?;
            let n = integer(&next(w)?)?;
            write(name, key, CollOp::LRem { count: n, value: v(w)? })
        }
        "ltrim" => {
            exactly(name, count, 3)?;
            let key = k(w)?;
            write(
                name,
                key,
                CollOp::LTrim { start: integer(&next(w)?)?, stop: integer(&next(w)?)? },
            )
        }
        "lpos" => lpos(w, count, limits)?,
        "lmove" | "blmove" => {
            exactly(name, count, if name == "lmove" { 4 } else { 5 })?;
            let (from_key, to) = (k(w)?, k(w)?);
            let (from, to_end) = (end(&next(w)?)?, end(&next(w)?)?);
            let op = CollOp::LMove { to, from, to_end };
            match name {
                "lmove" => write(name, from_key, op),
                _ => block(name, from_key, op, timeout(&next(w)?)?, Reshape::None),
            }
        }
        "rpoplpush" | "brpoplpush" => {
            exactly(name, count, if name == "rpoplpush" { 2 } else { 3 })?;
            let (from_key, to) = (k(w)?, k(w)?);
            let op = CollOp::LMove { to, from: End::Back, to_end: End::Front };
            match name {
                "rpoplpush" => write(name, from_key, op),
                _ => block(name, from_key, op, timeout(&next(w)?)?, Reshape::None),
            }
        }
        "blpop" | "brpop" | "bzpopmin" | "bzpopmax" => {
            at_least(name, count, 2)?;
            let mut keys = Vec::with_capacity(count - 1);
            for _ in 0..count - 1 {
                keys.push(k(w)?);
            }
            let wait = timeout(&next(w)?)?;
            let zset = name.starts_with("bz");
            let end = if name == "blpop" || name == "bzpopmin" { End::Front } else { End::Back };
            let mut keys = keys.into_iter();
            let first = keys.next().expect("at least one key");
            let op = CollOp::MPop { others: keys.collect(), end, count: 1, zset };
            let reshape = if zset { Reshape::ZPopOne } else { Reshape::PopOne };
            block(name, first, op, wait, reshape)
        }
        "lmpop" | "blmpop" | "zmpop" | "bzmpop" => {
            at_least(name, count, if name.starts_with('b') { 4 } else { 3 })?;
            let wait = match name.starts_with('b') {
                true => Some(timeout(&next(w)?)?),
                false => None,
            };
            let keys = numkeys(name, w, limits)?;
            let zset = name.contains('z');
            let dir = next(w)?;
            let end = match zset {
                false => end(&dir)?,
                true if is(&dir, "min") => End::Front,
                true if is(&dir, "max") => End::Back,
                true => return Err(CommandError::Syntax),
            };
            let mut n = 1;
            if let Some(option) = w.next() {
                if !is(&option, "count") {
                    return Err(CommandError::Syntax);
                }
                n = integer(&next(w)?)
                    .ok()
                    .filter(|c| *c > 0)
                    .ok_or(CommandError::Unsupported("count should be greater than 0"))?
                    as u64;
                if w.len() > 0 {
                    return Err(CommandError::Syntax);
                }
            }
            let mut keys = keys.into_iter();
            let first = keys.next().expect("numkeys is positive");
            let op = CollOp::MPop { others: keys.collect(), end, count: n, zset };
            match wait {
                Some(wait) => block(name, first, op, wait, Reshape::None),
                None => write(name, first, op),
            }
        }
        _ => unreachable!("{name} is a list command"),
    })
}

/// The set commands.
fn parse_set(
    name: &'static str,
    w: &mut Words,
    count: usize,
    limits: &Limits,
) -> Result<ClientCommand, CommandError> {
    let k = |w: &mut Words| key(next(w)?, limits);
    let v = |w: &mut Words| value(next(w)?, limits);
    Ok(match name {
        "sadd" | "srem" => {
            at_least(name, count, 2)?;
            let key = k(w)?;
            let members = values(std::mem::take(w), limits)?;
            let op =
                if name == "sadd" { CollOp::SAdd { members } } else { CollOp::SRem { members } };
            write(name, key, op)
        }
        "sismember" => {
            exactly(name, count, 2)?;
            let key = k(w)?;
            read(name, key, CollRead::SIsMember { members: vec![v(w)?], many: false })
        }
        "smismember" => {
            at_least(name, count, 2)?;
            let key = k(w)?;
            read(
                name,
                key,
                CollRead::SIsMember { members: values(std::mem::take(w), limits)?, many: true },
            )
        }
        "smembers" | "scard" => {
            exactly(name, count, 1)?;
            read(name, k(w)?, if name == "scard" { CollRead::SCard } else { CollRead::SMembers })
        }
        "spop" => {
            if !(1..=2).contains(&count) {
                return Err(arity(name));
            }
            let key = k(w)?;
            let count = w.next().map(|c| positive(&c)).transpose()?;
            write(name, key, CollOp::SPop { count })
        }
        "srandmember" => {
            if !(1..=2).contains(&count) {
                return Err(arity(name));
            }
            let key = k(w)?;
            let count = w.next().map(|c| integer(&c)).transpose()?;
            read(name, key, CollRead::SRandMember(count))
        }
        "smove" => {
            exactly(name, count, 3)?;
            let (from, to) = (k(w)?, k(w)?);
            write(name, from, CollOp::SMove { to, member: v(w)? })
        }
        "sinter" | "sunion" | "sdiff" => {
            at_least(name, count, 1)?;
            let key = k(w)?;
            let how = algebra(name);
            read(
                name,
                key,
                CollRead::SCombine { how, others: keys_of(std::mem::take(w), limits)?, card: None },
            )
        }
        "sinterstore" | "sunionstore" | "sdiffstore" => {
            at_least(name, count, 2)?;
            let dest = k(w)?;
            let how = algebra(name);
            write(name, dest, CollOp::SStore { how, sources: keys_of(std::mem::take(w), limits)? })
        }
        "sintercard" | "zintercard" => {
            at_least(name, count, 2)?;
            let keys = numkeys(name, w, limits)?;
            let mut limit = 0;
            if let Some(option) = w.next() {
                if !is(&option, "limit") {
                    return Err(CommandError::Syntax);
                }
                let negative = CommandError::Unsupported("LIMIT can't be negative");
                limit =
                    integer(&next(w)?).ok().and_then(|n| u64::try_from(n).ok()).ok_or(negative)?;
                if w.len() > 0 {
                    return Err(CommandError::Syntax);
                }
            }
            let mut keys = keys.into_iter();
            let first = keys.next().expect("numkeys is positive");
            let others: Vec<Key> = keys.collect();
            let op = match name {
                "sintercard" => {
                    CollRead::SCombine { how: Algebra::Inter, others, card: Some(limit) }
                }
                _ => CollRead::ZCombine {
                    combine: ZCombine {
                        how: Algebra::Inter,
                        others,
                        weights: Vec::new(),
                        aggregate: Aggregate::Sum,
                    },
                    with_scores: false,
                    card: Some(limit),
                },
            };
            read(name, first, op)
        }
        _ => unreachable!("{name} is a set command"),
    })
}

/// The sorted-set commands.
fn parse_zset(
    name: &'static str,
    w: &mut Words,
    count: usize,
    limits: &Limits,
) -> Result<ClientCommand, CommandError> {
    let k = |w: &mut Words| key(next(w)?, limits);
    let v = |w: &mut Words| value(next(w)?, limits);
    Ok(match name {
        "zadd" => zadd(w, count, limits)?,
        "zincrby" => {
            exactly(name, count, 3)?;
            let key = k(w)?;
            let by = float(&next(w)?)?;
            let flags = ZAddFlags { incr: true, ..ZAddFlags::default() };
            write(name, key, CollOp::ZAdd { flags, pairs: vec![(by.to_bits(), v(w)?)] })
        }
        "zrem" => {
            at_least(name, count, 2)?;
            let key = k(w)?;
            write(name, key, CollOp::ZRem { members: values(std::mem::take(w), limits)? })
        }
        "zscore" => {
            exactly(name, count, 2)?;
            let key = k(w)?;
            read(name, key, CollRead::ZScore { members: vec![v(w)?], many: false })
        }
        "zmscore" => {
            at_least(name, count, 2)?;
            let key = k(w)?;
            read(
                name,
                key,
                CollRead::ZScore { members: values(std::mem::take(w), limits)?, many: true },
            )
        }
        "zcard" => {
            exactly(name, count, 1)?;
            read(name, k(w)?, CollRead::ZCard)
        }
        "zcount" | "zlexcount" => {
            exactly(name, count, 3)?;
            let key = k(w)?;
            let (a, b) = (next(w)?, next(w)?);
            let by = zby(if name == "zcount" { "score" } else { "lex" }, &a, &b, false)?;
            read(name, key, CollRead::ZCount(by))
        }
        "zrange" => {
            at_least(name, count, 3)?;
            let key = k(w)?;
            let (spec, with_scores) = zrange_spec(w, false)?;
            read(name, key, CollRead::ZRange { spec, with_scores })
        }
        "zrangestore" => {
            at_least(name, count, 4)?;
            let (dest, source) = (k(w)?, k(w)?);
            let (spec, _) = zrange_spec(w, true)?;
            write(name, dest, CollOp::ZRangeStore { source, spec })
        }
        "zrangebyscore" | "zrevrangebyscore" | "zrangebylex" | "zrevrangebylex" | "zrevrange" => {
            at_least(name, count, 3)?;
            let key = k(w)?;
            let (a, b) = (next(w)?, next(w)?);
            let rev = name.starts_with("zrev");
            let kind = if name.ends_with("score") {
                "score"
            } else if name.ends_with("lex") {
                "lex"
            } else {
                "rank"
            };
            let (limit, with_scores) = range_options(w, kind != "rank", kind != "lex")?;
            let by = zby(kind, &a, &b, rev && kind != "rank")?;
            read(name, key, CollRead::ZRange { spec: ZRangeSpec { by, rev, limit }, with_scores })
        }
        "zrank" | "zrevrank" => {
            exactly(name, count, 2)?;
            let key = k(w)?;
            read(name, key, CollRead::ZRank { member: v(w)?, rev: name == "zrevrank" })
        }
        "zpopmin" | "zpopmax" => {
            if !(1..=2).contains(&count) {
                return Err(arity(name));
            }
            let key = k(w)?;
            let count = w.next().map(|c| positive(&c)).transpose()?;
            write(name, key, CollOp::ZPop { max: name == "zpopmax", count })
        }
        "zremrangebyrank" | "zremrangebyscore" | "zremrangebylex" => {
            exactly(name, count, 3)?;
            let key = k(w)?;
            let (a, b) = (next(w)?, next(w)?);
            let kind = name.trim_start_matches("zremrangeby");
            write(name, key, CollOp::ZRemRange { by: zby(kind, &a, &b, false)? })
        }
        "zunion" | "zinter" | "zdiff" => {
            at_least(name, count, 2)?;
            let (first, combine, with_scores) = zcombine(name, algebra(name), w, limits, false)?;
            read(name, first, CollRead::ZCombine { combine, with_scores, card: None })
        }
        "zunionstore" | "zinterstore" | "zdiffstore" => {
            at_least(name, count, 3)?;
            let dest = k(w)?;
            let (first, combine, _) = zcombine(name, algebra(name), w, limits, true)?;
            write(name, dest, CollOp::ZStore { first, combine })
        }
        "zrandmember" => {
            at_least(name, count, 1)?;
            let key = k(w)?;
            let (count, with_scores) = pick_options(w, "withscores")?;
            read(name, key, CollRead::ZRandMember { count, with_scores })
        }
        _ => unreachable!("{name} is a sorted-set command"),
    })
}

fn block(
    name: &'static str,
    key: Key,
    op: CollOp,
    timeout: Option<Duration>,
    reshape: Reshape,
) -> ClientCommand {
    ClientCommand::Block { name, key, op: Box::new(op), timeout, durability: None, reshape }
}

fn algebra(name: &str) -> Algebra {
    if name.contains("union") {
        Algebra::Union
    } else if name.contains("inter") {
        Algebra::Inter
    } else {
        Algebra::Diff
    }
}

fn lpos(w: &mut Words, count: usize, limits: &Limits) -> Result<ClientCommand, CommandError> {
    at_least("lpos", count, 2)?;
    let key = key(next(w)?, limits)?;
    let element = value(next(w)?, limits)?;
    let (mut rank, mut n, mut max_len) = (1, None, 0);
    while let Some(option) = w.next() {
        if is(&option, "rank") {
            rank = integer(&next(w)?)?;
            if rank == 0 || rank == i64::MIN {
                return Err(CommandError::Unsupported(
                    "RANK can't be zero: use 1 to start from the first match, 2 from the second ... or use negative to start from the end of the list",
                ));
            }
        } else if is(&option, "count") {
            n = Some(
                u64::try_from(integer(&next(w)?)?)
                    .map_err(|_| CommandError::Unsupported("COUNT can't be negative"))?,
            );
        } else if is(&option, "maxlen") {
            max_len = u64::try_from(integer(&next(w)?)?)
                .map_err(|_| CommandError::Unsupported("MAXLEN can't be negative"))?;
        } else {
            return Err(CommandError::Syntax);
        }
    }
    Ok(read("lpos", key, CollRead::LPos { element, rank, count: n, max_len }))
}

fn zadd(w: &mut Words, count: usize, limits: &Limits) -> Result<ClientCommand, CommandError> {
    at_least("zadd", count, 3)?;
    let key = key(next(w)?, limits)?;
    let mut flags = ZAddFlags::default();
    let mut rest: Vec<Bytes> = std::mem::take(w).collect();
    let mut at = 0;
    while at < rest.len() {
        let word = &rest[at];
        let flag = if is(word, "nx") {
            &mut flags.nx
        } else if is(word, "xx") {
            &mut flags.xx
        } else if is(word, "gt") {
            &mut flags.gt
        } else if is(word, "lt") {
            &mut flags.lt
        } else if is(word, "ch") {
            &mut flags.ch
        } else if is(word, "incr") {
            &mut flags.incr
        } else {
            break;
        };
        *flag = true;
        at += 1;
    }
    let pairs_words = rest.split_off(at);
    if pairs_words.is_empty() || !pairs_words.len().is_multiple_of(2) {
        return Err(CommandError::Syntax);
    }
    if flags.nx && flags.xx {
        return Err(CommandError::Unsupported(
            "XX and NX options at the same time are not compatible",
        ));
    }
    if (flags.nx && (flags.gt || flags.lt)) || (flags.gt && flags.lt) {
        return Err(CommandError::Unsupported(
            "GT, LT, and/or NX options at the same time are not compatible",
        ));
    }
    if flags.incr && pairs_words.len() > 2 {
        return Err(CommandError::Unsupported(
            "INCR option supports a single increment-element pair",
        ));
    }
    let mut pairs = Vec::with_capacity(pairs_words.len() / 2);
    let mut it = pairs_words.into_iter();
    while let (Some(score), Some(member)) = (it.next(), it.next()) {
        pairs.push((float(&score)?.to_bits(), value(member, limits)?));
    }
    Ok(write("zadd", key, CollOp::ZAdd { flags, pairs }))
}

#[cfg(test)]
mod tests {
    use super::super::parse;
    use super::*;

    fn p(words: &[&str]) -> Result<ClientCommand, CommandError> {
        let words = words.iter().map(|w| Bytes::copy_from_slice(w.as_bytes())).collect();
        parse(words, &Limits::default())
    }

    #[test]
    fn every_name_parses_or_refuses_by_its_own_rules() {
        for name in NAMES {
            // No name is unknown: too few arguments is an arity or syntax error.
            let err = p(&[name]).expect_err("no arguments");
            assert!(!matches!(err, CommandError::UnknownCommand { .. }), "{name}: {err}");
        }
        assert!(matches!(p(&["hset", "h", "f"]), Err(CommandError::WrongArity { .. })));
        let ClientCommand::Coll { durability, .. } =
            p(&["hset", "h", "f", "v", "DURABILITY", "durable"]).unwrap()
        else {
            panic!("a write")
        };
        assert_eq!(durability, Some(Durability::Durable));
        let ClientCommand::CollRead { op, .. } =
            p(&["zrevrangebyscore", "z", "(5", "-inf", "WITHSCORES", "LIMIT", "0", "2"]).unwrap()
        else {
            panic!("a read")
        };
        let CollRead::ZRange { spec, with_scores } = *op else { panic!("a range") };
        assert!(with_scores && spec.rev && spec.limit == Some((0, 2)));
        let ZBy::Score(low, high) = spec.by else { panic!("by score") };
        assert!(low.value() == f64::NEG_INFINITY && high.value() == 5.0 && high.open);
        assert!(p(&["zadd", "z", "nx", "xx", "1", "a"]).is_err());
        assert!(p(&["zadd", "z", "1", "a", "2"]).is_err());
        let ClientCommand::Block { timeout, .. } = p(&["blpop", "a", "b", "0.5"]).unwrap() else {
            panic!("a blocking pop")
        };
        assert_eq!(timeout, Some(Duration::from_millis(500)));
    }
}
