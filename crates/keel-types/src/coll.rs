//! Redis's collections: hashes, lists, sets and sorted sets, as commands of the state
//! machine ([`crate::Command::Coll`] writes, [`crate::Command::CollRead`] reads) and the
//! answer they give ([`Answer`]).
//!
//! A collection is the value of one key, as in Redis: the key's type is the collection's
//! (`TYPE`), a command of another type's family answers `WRONGTYPE`, and the key leaves
//! when its last element does. Every write runs in the state machine as one log entry, so
//! it is atomic on every replica; an operation that must choose "at random" (`SPOP`)
//! draws from its entry's index, so every replica chooses the same.
//!
//! Scores are `f64` carried as their IEEE-754 bits (so that commands and answers compare
//! and hash exactly); never NaN.

use crate::{KeelError, Key, Limits, Value};
use serde::{Deserialize, Serialize};

/// The four collection types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CollKind {
    /// A map of fields to values (`HSET`).
    Hash,
    /// A sequence (`LPUSH`).
    List,
    /// A set of members (`SADD`).
    Set,
    /// Members ordered by score (`ZADD`).
    ZSet,
}

impl CollKind {
    /// The name `TYPE` answers.
    pub fn name(self) -> &'static str {
        match self {
            CollKind::Hash => "hash",
            CollKind::List => "list",
            CollKind::Set => "set",
            CollKind::ZSet => "zset",
        }
    }
}

/// A list's end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum End {
    /// The head (`LEFT`, `LPUSH`).
    Front,
    /// The tail (`RIGHT`, `RPUSH`).
    Back,
}

/// One end of a score range: the score's bits and whether it is excluded (`(1.5`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ScoreBound {
    /// The score, as `f64` bits (may be infinite, never NaN).
    pub score: u64,
    /// Whether the bound itself is outside the range.
    pub open: bool,
}

impl ScoreBound {
    /// The bound's score.
    pub fn value(self) -> f64 {
        f64::from_bits(self.score)
    }
}

/// One end of a lexicographic range (`ZRANGEBYLEX`): `-`, `+`, `[member` or `(member`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LexBound {
    /// `-`: before every member.
    Min,
    /// `+`: after every member.
    Max,
    /// `[member`: the member included.
    Incl(Value),
    /// `(member`: the member excluded.
    Excl(Value),
}

/// How a sorted-set range is chosen.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ZBy {
    /// Ranks `start..=stop`, negative counting from the end.
    Rank(i64, i64),
    /// Scores between two bounds (`min`, `max`).
    Score(ScoreBound, ScoreBound),
    /// Members between two bounds (`min`, `max`), for members of equal scores.
    Lex(LexBound, LexBound),
}

/// A sorted-set range: `ZRANGE` with its options, and the older forms.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ZRangeSpec {
    /// Which elements.
    pub by: ZBy,
    /// From the highest score down (`REV`); the bounds are then given high first.
    pub rev: bool,
    /// `LIMIT offset count` (score and lex ranges only; a negative count: all).
    pub limit: Option<(i64, i64)>,
}

/// How `SORT` orders a list's, set's or sorted set's elements.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SortSpec {
    /// As text, byte by byte (`ALPHA`); else as numbers.
    pub alpha: bool,
    /// Highest first (`DESC`).
    pub desc: bool,
    /// No ordering at all (`BY` a pattern with no `*`): the elements as held.
    pub unsorted: bool,
    /// `LIMIT offset count` (a negative count: all from the offset).
    pub limit: Option<(i64, i64)>,
}

/// `ZADD`'s options.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ZAddFlags {
    /// `NX`: only new members.
    pub nx: bool,
    /// `XX`: only existing members.
    pub xx: bool,
    /// `GT`: only a higher score.
    pub gt: bool,
    /// `LT`: only a lower score.
    pub lt: bool,
    /// `CH`: count changed members, not only new ones.
    pub ch: bool,
    /// `INCR`: add the one score given; answer the new score.
    pub incr: bool,
}

/// How several sets combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Algebra {
    /// Members of any.
    Union,
    /// Members of all.
    Inter,
    /// Members of the first and of no other.
    Diff,
}

/// How scores of one member in several sorted sets combine (`AGGREGATE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Aggregate {
    /// Their (weighted) sum.
    Sum,
    /// The least.
    Min,
    /// The greatest.
    Max,
}

/// Several sorted sets (or sets, scored 1) combined: `ZUNION`, `ZINTER`, `ZDIFF`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ZCombine {
    /// Union, intersection or difference.
    pub how: Algebra,
    /// The keys after the command's key (its first source).
    pub others: Vec<Key>,
    /// One weight per source (`f64` bits), or empty for 1 each.
    pub weights: Vec<u64>,
    /// How scores combine.
    pub aggregate: Aggregate,
}

/// A write to a collection, applied as one log entry to the command's key (and, for the
/// forms that say so, to other keys of the same keyspace).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CollOp {
    /// `HSET`/`HMSET` (`only_new` false: the number of new fields), `HSETNX` (only a new
    /// field: 1 or 0).
    HSet {
        /// Field, value pairs, in order (a later pair wins).
        pairs: Vec<(Value, Value)>,
        /// `HSETNX`.
        only_new: bool,
    },
    /// `HDEL`: the number of fields removed.
    HDel {
        /// The fields.
        fields: Vec<Value>,
    },
    /// `HINCRBY`: the new value.
    HIncrBy {
        /// The field.
        field: Value,
        /// The amount.
        delta: i64,
    },
    /// `HINCRBYFLOAT`: the new value, as text.
    HIncrByFloat {
        /// The field.
        field: Value,
        /// The amount, `f64` bits.
        delta: u64,
    },
    /// `LPUSH`/`RPUSH` (`only_existing`: `LPUSHX`/`RPUSHX`): the list's new length.
    Push {
        /// Which end each value goes to, in order.
        end: End,
        /// The values.
        values: Vec<Value>,
        /// Only if the list exists.
        only_existing: bool,
    },
    /// `LPOP`/`RPOP`: one element (no count), or up to `count` as an array.
    Pop {
        /// Which end.
        end: End,
        /// How many; `None`: one, answered as a value.
        count: Option<u64>,
    },
    /// `LSET`: `OK`.
    LSet {
        /// The index, negative from the end.
        index: i64,
        /// The new element.
        value: Value,
    },
    /// `LINSERT`: the new length, -1 if the pivot is absent, 0 if the list is.
    LInsert {
        /// Before the pivot (or after).
        before: bool,
        /// The element to insert next to (its first occurrence).
        pivot: Value,
        /// The element inserted.
        value: Value,
    },
    /// `LREM`: the number removed; `count` > 0 from the head, < 0 from the tail, 0 all.
    LRem {
        /// How many, and from which end.
        count: i64,
        /// The element removed.
        value: Value,
    },
    /// `LTRIM`: `OK`.
    LTrim {
        /// The first index kept.
        start: i64,
        /// The last index kept.
        stop: i64,
    },
    /// `LMOVE`/`RPOPLPUSH` (and the blocking forms once an element is there): the element
    /// moved, or null.
    LMove {
        /// The destination list.
        to: Key,
        /// The end of the source it is taken from.
        from: End,
        /// The end of the destination it goes to.
        to_end: End,
    },
    /// `SADD`: the number added.
    SAdd {
        /// The members.
        members: Vec<Value>,
    },
    /// `SREM`: the number removed.
    SRem {
        /// The members.
        members: Vec<Value>,
    },
    /// `SPOP`: one member (no count), or up to `count`, chosen by the entry's index.
    SPop {
        /// How many; `None`: one, answered as a value.
        count: Option<u64>,
    },
    /// `SMOVE`: 1 if moved, 0 if not a member.
    SMove {
        /// The destination set.
        to: Key,
        /// The member.
        member: Value,
    },
    /// `ZADD`: the number added (changed with `CH`), or with `INCR` the new score (null
    /// when a condition stopped it).
    ZAdd {
        /// Its options.
        flags: ZAddFlags,
        /// Score (`f64` bits), member pairs.
        pairs: Vec<(u64, Value)>,
    },
    /// `ZREM`: the number removed.
    ZRem {
        /// The members.
        members: Vec<Value>,
    },
    /// `ZPOPMIN`/`ZPOPMAX`: up to `count` (member, score) pairs.
    ZPop {
        /// The highest first (`ZPOPMAX`).
        max: bool,
        /// How many; `None`: one (answered flat, as Redis does).
        count: Option<u64>,
    },
    /// `ZREMRANGEBYRANK`/`BYSCORE`/`BYLEX`: the number removed.
    ZRemRange {
        /// Which.
        by: ZBy,
    },
    /// `SINTERSTORE`/`SUNIONSTORE`/`SDIFFSTORE`: the command's key (the destination) set
    /// to the result; its size.
    SStore {
        /// How the sources combine.
        how: Algebra,
        /// The sources.
        sources: Vec<Key>,
    },
    /// `ZUNIONSTORE`/`ZINTERSTORE`/`ZDIFFSTORE`: the destination set to the result; its
    /// size.
    ZStore {
        /// The first source.
        first: Key,
        /// The rest and how they combine.
        combine: ZCombine,
    },
    /// `SORT ... STORE`: the destination (a list) set to `source`'s elements in order
    /// (deleted if none); their number.
    SortStore {
        /// The list, set or sorted set sorted.
        source: Key,
        /// The order.
        spec: SortSpec,
    },
    /// `ZRANGESTORE`: the destination set to a range of `source`; its size.
    ZRangeStore {
        /// The source.
        source: Key,
        /// The range.
        spec: ZRangeSpec,
    },
    /// `LMPOP`, `ZMPOP`, `BLPOP` and their kin once an element is there: from the first of
    /// the command's key and `others` that is not empty, up to `count` elements;
    /// `[key, [elements]]` (`[key, [[member, score], ...]]` for sorted sets), or null.
    MPop {
        /// The keys after the command's key.
        others: Vec<Key>,
        /// A list's end (`LEFT`: front), or for sorted sets `Front` = `MIN`.
        end: End,
        /// How many at most.
        count: u64,
        /// Sorted sets (`ZMPOP`), not lists.
        zset: bool,
    },
}

/// A read of a collection.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CollRead {
    /// `TYPE`: the key's type name (any key, strings included), or `none`.
    Type,
    /// `OBJECT ENCODING`'s facts, for any key: null if absent; `[string, value]`; or
    /// `[type, elements, longest element's bytes, 1 if every element is an integer]`.
    Encoding,
    /// `MEMORY USAGE`: the bytes the key takes in the state (its key, value or elements,
    /// and overheads), or null if absent.
    Memory,
    /// `HGET` (one field: a value) or `HMGET` (`many`: an array).
    HGet {
        /// The fields.
        fields: Vec<Value>,
        /// `HMGET`.
        many: bool,
    },
    /// `HEXISTS`.
    HExists(Value),
    /// `HLEN`.
    HLen,
    /// `HSTRLEN`.
    HStrLen(Value),
    /// `HKEYS`, `HVALS`, `HGETALL`: fields, values or both.
    HAll {
        /// The fields.
        fields: bool,
        /// The values.
        values: bool,
    },
    /// `HRANDFIELD [count [WITHVALUES]]`.
    HRandField {
        /// The count (negative: repeats allowed); `None`: one field.
        count: Option<i64>,
        /// With their values.
        with_values: bool,
    },
    /// `LLEN`.
    LLen,
    /// `LRANGE`.
    LRange(i64, i64),
    /// `LINDEX`.
    LIndex(i64),
    /// `LPOS element [RANK r] [COUNT c] [MAXLEN m]`.
    LPos {
        /// The element sought.
        element: Value,
        /// Which match first (negative: from the tail), never 0.
        rank: i64,
        /// How many (0: all); `None`: one, answered as an integer or null.
        count: Option<u64>,
        /// Most elements compared (0: all).
        max_len: u64,
    },
    /// `SISMEMBER` (one: an integer) or `SMISMEMBER` (`many`: an array).
    SIsMember {
        /// The members.
        members: Vec<Value>,
        /// `SMISMEMBER`.
        many: bool,
    },
    /// `SMEMBERS`.
    SMembers,
    /// `SCARD`.
    SCard,
    /// `SRANDMEMBER [count]`.
    SRandMember(Option<i64>),
    /// `SINTER`/`SUNION`/`SDIFF` of the key and `others`; `SINTERCARD` (`card`: the size
    /// only, at most the limit when non-zero).
    SCombine {
        /// How.
        how: Algebra,
        /// The other keys.
        others: Vec<Key>,
        /// `SINTERCARD`'s `LIMIT` (0: none); `None`: the members.
        card: Option<u64>,
    },
    /// `ZSCORE` (one: a score) or `ZMSCORE` (`many`: an array).
    ZScore {
        /// The members.
        members: Vec<Value>,
        /// `ZMSCORE`.
        many: bool,
    },
    /// `ZCARD`.
    ZCard,
    /// `ZCOUNT` (scores) or `ZLEXCOUNT` (members): the number in the range.
    ZCount(ZBy),
    /// `SORT` and `SORT_RO` of a list, set or sorted set: its elements in order.
    Sort(SortSpec),
    /// `ZRANGE` and the older `ZRANGEBY*`/`ZREV*` forms.
    ZRange {
        /// The range.
        spec: ZRangeSpec,
        /// Each member with its score.
        with_scores: bool,
    },
    /// `ZRANK`/`ZREVRANK`.
    ZRank {
        /// The member.
        member: Value,
        /// From the highest.
        rev: bool,
    },
    /// `ZRANDMEMBER [count [WITHSCORES]]`.
    ZRandMember {
        /// The count (negative: repeats allowed); `None`: one member.
        count: Option<i64>,
        /// With their scores.
        with_scores: bool,
    },
    /// `ZUNION`/`ZINTER`/`ZDIFF` (the key is the first source), or `ZINTERCARD` (`card`).
    ZCombine {
        /// The rest and how they combine.
        combine: ZCombine,
        /// With scores.
        with_scores: bool,
        /// `ZINTERCARD`'s `LIMIT` (0: none); `None`: the members.
        card: Option<u64>,
    },
    /// `HSCAN`/`SSCAN`/`ZSCAN cursor [MATCH p] [COUNT c]`: `[next cursor, elements]` from
    /// the cursor on (a position in the collection's order; 0: the start, and when done).
    Scan {
        /// The collection type the command is for.
        kind: CollKind,
        /// Where the last page ended (0: the start).
        cursor: u64,
        /// Elements per page (a hint; `MATCH` filters the page at the front door, after
        /// the page is read, as Redis filters it).
        count: u64,
    },
}

/// What a collection command answers: RESP's shapes, chosen by the state machine, drawn
/// by the front door in the connection's protocol.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Answer {
    /// Null.
    Nil,
    /// RESP2's null array (`*-1`: `LMPOP`, `BLPOP` finding nothing); RESP3's null.
    NilArray,
    /// `+OK`.
    Ok,
    /// An integer.
    Int(i64),
    /// A string.
    Bulk(Value),
    /// A status line (`TYPE`'s answer).
    Status(String),
    /// A score, `f64` bits (RESP2: its text).
    Double(u64),
    /// An array.
    Array(Vec<Answer>),
    /// Pairs (`HGETALL`): RESP3 a map, RESP2 a flat array.
    Map(Vec<(Answer, Answer)>),
    /// Pairs (`ZRANGE ... WITHSCORES`): RESP3 an array of two-element arrays, RESP2 a flat
    /// array.
    Pairs(Vec<(Answer, Answer)>),
    /// A set (`SMEMBERS`): RESP3 a set, RESP2 an array.
    Set(Vec<Answer>),
}

impl CollOp {
    /// The collection type the op is for.
    pub fn kind(&self) -> CollKind {
        match self {
            CollOp::HSet { .. }
            | CollOp::HDel { .. }
            | CollOp::HIncrBy { .. }
            | CollOp::HIncrByFloat { .. } => CollKind::Hash,
            CollOp::Push { .. }
            | CollOp::Pop { .. }
            | CollOp::LSet { .. }
            | CollOp::LInsert { .. }
            | CollOp::LRem { .. }
            | CollOp::LTrim { .. }
            | CollOp::LMove { .. }
            | CollOp::SortStore { .. } => CollKind::List,
            CollOp::SAdd { .. }
            | CollOp::SRem { .. }
            | CollOp::SPop { .. }
            | CollOp::SMove { .. }
            | CollOp::SStore { .. } => CollKind::Set,
            CollOp::MPop { zset: false, .. } => CollKind::List,
            CollOp::ZAdd { .. }
            | CollOp::ZRem { .. }
            | CollOp::ZPop { .. }
            | CollOp::ZRemRange { .. }
            | CollOp::ZStore { .. }
            | CollOp::ZRangeStore { .. }
            | CollOp::MPop { zset: true, .. } => CollKind::ZSet,
        }
    }

    /// How many elements a pop asks for (its count; 1 for the forms without one, and
    /// for any other write).
    pub fn pop_count(&self) -> u64 {
        match self {
            CollOp::MPop { count, .. } => *count,
            CollOp::Pop { count: Some(count), .. } | CollOp::ZPop { count: Some(count), .. } => {
                *count
            }
            _ => 1,
        }
    }

    /// The same op, popping at most `max` elements (at least 1); the forms without a
    /// count are unchanged.
    pub fn at_most(&self, max: u64) -> CollOp {
        let mut op = self.clone();
        match &mut op {
            CollOp::MPop { count, .. } => *count = (*count).min(max.max(1)),
            CollOp::Pop { count: Some(count), .. } | CollOp::ZPop { count: Some(count), .. } => {
                *count = (*count).min(max.max(1));
            }
            _ => {}
        }
        op
    }

    /// The keys the op touches besides the command's.
    pub fn other_keys(&self) -> Vec<&Key> {
        match self {
            CollOp::LMove { to, .. } | CollOp::SMove { to, .. } => vec![to],
            CollOp::SStore { sources, .. } => sources.iter().collect(),
            CollOp::ZStore { first, combine } => {
                std::iter::once(first).chain(combine.others.iter()).collect()
            }
            CollOp::ZRangeStore { source, .. } | CollOp::SortStore { source, .. } => vec![source],
            CollOp::MPop { others, .. } => others.iter().collect(),
            _ => Vec::new(),
        }
    }

    /// The keys of [`CollOp::other_keys`], to rewrite (a database's prefix).
    pub fn other_keys_mut(&mut self) -> Vec<&mut Key> {
        match self {
            CollOp::LMove { to, .. } | CollOp::SMove { to, .. } => vec![to],
            CollOp::SStore { sources, .. } => sources.iter_mut().collect(),
            CollOp::ZStore { first, combine } => {
                std::iter::once(first).chain(combine.others.iter_mut()).collect()
            }
            CollOp::ZRangeStore { source, .. } | CollOp::SortStore { source, .. } => vec![source],
            CollOp::MPop { others, .. } => others.iter_mut().collect(),
            _ => Vec::new(),
        }
    }

    /// Bytes of elements the op carries (what it may add to the state).
    pub fn payload_bytes(&self) -> usize {
        let keys: usize = self.other_keys().iter().map(|k| k.len()).sum();
        keys + match self {
            CollOp::HSet { pairs, .. } => pairs.iter().map(|(f, v)| f.len() + v.len()).sum(),
            CollOp::HDel { fields: values }
            | CollOp::Push { values, .. }
            | CollOp::SAdd { members: values }
            | CollOp::SRem { members: values }
            | CollOp::ZRem { members: values } => values.iter().map(|v| v.len()).sum(),
            CollOp::HIncrBy { field, .. } | CollOp::HIncrByFloat { field, .. } => field.len() + 24,
            CollOp::LSet { value, .. } | CollOp::LRem { value, .. } => value.len(),
            CollOp::LInsert { pivot, value, .. } => pivot.len() + value.len(),
            CollOp::SMove { member, .. } => member.len(),
            CollOp::ZAdd { pairs, .. } => pairs.iter().map(|(_, m)| m.len() + 8).sum(),
            _ => 0,
        }
    }

    /// Elements the op may add to the state (each counts its overhead there).
    pub fn elements(&self) -> usize {
        match self {
            CollOp::HSet { pairs, .. } => pairs.len(),
            CollOp::Push { values, .. } => values.len(),
            CollOp::SAdd { members } => members.len(),
            CollOp::ZAdd { pairs, .. } => pairs.len(),
            _ => 1,
        }
    }

    /// Checks the op's arguments against the limits and its own rules.
    pub fn validate(&self, limits: &Limits) -> Result<(), KeelError> {
        self.check_shape()?;
        for key in self.other_keys() {
            limits.check_key(key)?;
            crate::check_not_reserved(key)?;
        }
        Ok(())
    }

    /// The op's own rules, whatever the limits: what the state machine relies on when it
    /// applies one (the ORCA gate checks them of a peer's entries too).
    pub fn check_shape(&self) -> Result<(), KeelError> {
        if self.other_keys().len() > KEYS_MAX {
            return Err(KeelError::InvalidArgument(format!("at most {KEYS_MAX} keys")));
        }
        let invalid = |why: &str| Err(KeelError::InvalidArgument(why.to_string()));
        let elements = match self {
            CollOp::HSet { pairs, .. } => pairs.len(),
            CollOp::HDel { fields: v }
            | CollOp::Push { values: v, .. }
            | CollOp::SAdd { members: v }
            | CollOp::SRem { members: v }
            | CollOp::ZRem { members: v } => v.len(),
            CollOp::ZAdd { pairs, flags } => {
                if pairs.iter().any(|(s, _)| f64::from_bits(*s).is_nan()) {
                    return invalid("value is not a valid float");
                }
                if flags.incr && pairs.len() != 1 {
                    return invalid("INCR option supports a single increment-element pair");
                }
                pairs.len()
            }
            CollOp::HIncrByFloat { delta, .. } if !f64::from_bits(*delta).is_finite() => {
                return invalid("value is NaN or Infinity");
            }
            CollOp::SStore { sources, .. } => sources.len(),
            CollOp::ZStore { combine, .. } if !combine.weights.is_empty() => {
                if combine.weights.len() != combine.others.len() + 1 {
                    return invalid("syntax error");
                }
                1
            }
            _ => 1,
        };
        if elements == 0 {
            return invalid("wrong number of arguments");
        }
        Ok(())
    }
}

impl CollRead {
    /// The collection type the read is for (`None`: any, `TYPE`).
    pub fn kind(&self) -> Option<CollKind> {
        Some(match self {
            CollRead::Type | CollRead::Encoding | CollRead::Memory | CollRead::Sort(_) => {
                return None
            }
            CollRead::HGet { .. }
            | CollRead::HExists(_)
            | CollRead::HLen
            | CollRead::HStrLen(_)
            | CollRead::HAll { .. }
            | CollRead::HRandField { .. } => CollKind::Hash,
            CollRead::LLen | CollRead::LRange(..) | CollRead::LIndex(_) | CollRead::LPos { .. } => {
                CollKind::List
            }
            CollRead::SIsMember { .. }
            | CollRead::SMembers
            | CollRead::SCard
            | CollRead::SRandMember(_)
            | CollRead::SCombine { .. } => CollKind::Set,
            CollRead::ZScore { .. }
            | CollRead::ZCard
            | CollRead::ZCount(_)
            | CollRead::ZRange { .. }
            | CollRead::ZRank { .. }
            | CollRead::ZRandMember { .. }
            | CollRead::ZCombine { .. } => CollKind::ZSet,
            CollRead::Scan { kind, .. } => *kind,
        })
    }

    /// The keys the read looks at besides the command's.
    pub fn other_keys(&self) -> &[Key] {
        match self {
            CollRead::SCombine { others, .. } => others,
            CollRead::ZCombine { combine, .. } => &combine.others,
            _ => &[],
        }
    }

    /// The keys of [`CollRead::other_keys`], to rewrite (a database's prefix).
    pub fn other_keys_mut(&mut self) -> Vec<&mut Key> {
        match self {
            CollRead::SCombine { others, .. } => others.iter_mut().collect(),
            CollRead::ZCombine { combine, .. } => combine.others.iter_mut().collect(),
            _ => Vec::new(),
        }
    }

    /// Checks the read's keys against the limits, and its own rules.
    pub fn validate(&self, limits: &Limits) -> Result<(), KeelError> {
        self.check_shape()?;
        for key in self.other_keys() {
            limits.check_key(key)?;
            crate::check_not_reserved(key)?;
        }
        Ok(())
    }

    /// The read's own rules, whatever the limits: what answering it relies on (the ORCA
    /// gate checks them of the reads inside a peer's transaction entries too).
    pub fn check_shape(&self) -> Result<(), KeelError> {
        if self.other_keys().len() > KEYS_MAX {
            return Err(KeelError::InvalidArgument(format!("at most {KEYS_MAX} keys")));
        }
        let empty = match self {
            CollRead::HGet { fields: v, .. }
            | CollRead::SIsMember { members: v, .. }
            | CollRead::ZScore { members: v, .. } => v.is_empty(),
            _ => false,
        };
        if empty {
            return Err(KeelError::InvalidArgument("wrong number of arguments".into()));
        }
        if let CollRead::ZCombine { combine, .. } = self {
            if !combine.weights.is_empty() && combine.weights.len() != combine.others.len() + 1 {
                return Err(KeelError::InvalidArgument("syntax error".into()));
            }
        }
        Ok(())
    }

    /// Bytes the read carries.
    pub fn payload_bytes(&self) -> usize {
        let elements: usize = match self {
            CollRead::HGet { fields: v, .. }
            | CollRead::SIsMember { members: v, .. }
            | CollRead::ZScore { members: v, .. } => v.iter().map(|x| x.len()).sum(),
            _ => 0,
        };
        elements + self.other_keys().iter().map(|k| k.len()).sum::<usize>()
    }
}

/// Most keys one command names besides its own (`SUNIONSTORE`, `ZUNION`, `BLPOP`):
/// each is read in the entry's apply, on every replica.
pub const KEYS_MAX: usize = 1024;

/// Most elements one answer may hold: a larger range is refused, never built (the cost
/// of a command is bounded; `docs/redis-compatibility.md`, *Limits*).
pub const ANSWER_ELEMENTS_MAX: usize = 1 << 20;

/// The error for a command on a key of another type, as Redis words it.
pub fn wrong_type() -> KeelError {
    KeelError::WrongType
}

/// A score's text as Redis 7.0 writes a double reply in RESP2 (C's `%.17g`): `inf`,
/// `-inf`, or 17 significant digits with trailing zeros dropped.
pub fn score_text(score: f64) -> String {
    if score.is_infinite() {
        return if score > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if score == 0.0 {
        return if score.is_sign_negative() { "-0".into() } else { "0".into() };
    }
    let sci = format!("{score:.16e}");
    let (mantissa, exponent) = sci.split_once('e').expect("exponent form");
    let exponent: i32 = exponent.parse().expect("an integer exponent");
    if !(-4..17).contains(&exponent) {
        let mantissa = trim_fraction(mantissa);
        let sign = if exponent < 0 { '-' } else { '+' };
        return format!("{mantissa}e{sign}{:02}", exponent.abs());
    }
    let decimals = usize::try_from(16 - exponent).unwrap_or(0);
    trim_fraction(&format!("{score:.decimals$}")).to_string()
}

/// `text` without the trailing zeros of its fraction (and the point if none is left).
fn trim_fraction(text: &str) -> &str {
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.')
    } else {
        text
    }
}

/// Parses a score as Redis does (`inf`, `+inf`, `-inf` included); `None` if not a float
/// or NaN.
pub fn parse_score(text: &[u8]) -> Option<f64> {
    let text = std::str::from_utf8(text).ok()?;
    if text.is_empty()
        || text.starts_with(char::is_whitespace)
        || text.ends_with(char::is_whitespace)
    {
        return None;
    }
    let value: f64 = match text.to_ascii_lowercase().as_str() {
        "inf" | "+inf" | "infinity" | "+infinity" => f64::INFINITY,
        "-inf" | "-infinity" => f64::NEG_INFINITY,
        other => other.parse().ok()?,
    };
    (!value.is_nan()).then_some(value)
}
