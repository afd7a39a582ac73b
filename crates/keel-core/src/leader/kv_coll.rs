//! The state machine's collection commands (`keel_types::coll`): writes applied as one
//! entry ([`execute`]) and reads of applied state ([`read`]).
//!
//! Layout: the shared steps (a key's collection of the kind a command wants, storing one
//! back), then the writes by type, then the reads by type, then ranges and combinations.
//!
//! Every write stores the changed collection under its key with the entry's version and
//! the key's expiry (Redis keeps a collection's expiry across changes), deletes the key
//! (a tombstone) when it is left empty, and changes nothing, answering with no version,
//! when the command finds nothing to do. A command on a key of another type answers
//! [`KeelError::WrongType`] and changes nothing.

use super::coll::{Coll, Score};
use super::kv::{Item, Kv, Undo, WriteResult};
use keel_types::coll::{
    Aggregate, Algebra, Answer, CollKind, CollOp, CollRead, End, LexBound, SortSpec, ZAddFlags,
    ZBy, ZCombine, ZRangeSpec, ANSWER_ELEMENTS_MAX,
};
use keel_types::rng::SplitMix64;
use keel_types::{CommandResult, KeelError, Key, LogIndex, Value, Version};
use std::collections::{BTreeMap, BTreeSet};

fn invalid(why: &str) -> KeelError {
    KeelError::InvalidArgument(why.to_string())
}

fn bulk(value: &Value) -> Answer {
    Answer::Bulk(value.clone())
}

fn double(score: f64) -> Answer {
    Answer::Double(score.to_bits())
}

/// The collection at `key` if it is of `kind` (`None`: no live key); `WRONGTYPE` if the
/// key holds a string or another type.
fn coll_of<'a>(kv: &'a Kv, key: &[u8], kind: CollKind) -> Result<Option<&'a Coll>, KeelError> {
    match kv.item(key) {
        Some(Item { coll: Some(coll), .. }) if coll.kind() == kind => Ok(Some(coll)),
        Some(item) if item.live() => Err(KeelError::WrongType),
        _ => Ok(None),
    }
}

/// A copy of the collection at `key` to change (an empty one if absent): O(1), the
/// containers being persistent.
fn coll_to_change(kv: &Kv, key: &[u8], kind: CollKind) -> Result<Coll, KeelError> {
    Ok(coll_of(kv, key, kind)?.cloned().unwrap_or_else(|| Coll::new(kind)))
}

/// Whether `key` holds a collection of `kind`, and a copy of it (or an empty one) to
/// change.
fn opened(kv: &Kv, key: &[u8], kind: CollKind) -> Result<(bool, Coll), KeelError> {
    let held = coll_of(kv, key, kind)?;
    Ok((held.is_some(), held.cloned().unwrap_or_else(|| Coll::new(kind))))
}

/// Stores `coll` under `key` at `version`, keeping the key's expiry if it held a
/// collection already; an empty one deletes the key (if it was live).
fn store(kv: &mut Kv, key: &Key, coll: Coll, version: Version, undo: &mut Undo) {
    let current = kv.item(key).filter(|item| item.live());
    if coll.is_empty() {
        if current.is_some() {
            kv.change(key.clone(), Some(Item::plain(None, version)), undo);
        }
        return;
    }
    let expires_at = current.filter(|item| item.coll.is_some()).and_then(|item| item.expires_at);
    let item = Item { value: None, coll: Some(coll), version, expires_at };
    kv.change(key.clone(), Some(item), undo);
}

/// Replaces whatever `key` holds by `coll` (a `STORE` destination: its expiry goes).
fn overwrite(kv: &mut Kv, key: &Key, coll: Coll, version: Version, undo: &mut Undo) {
    let live = kv.item(key).is_some_and(Item::live);
    if coll.is_empty() {
        if live {
            kv.change(key.clone(), Some(Item::plain(None, version)), undo);
        }
        return;
    }
    kv.change(
        key.clone(),
        Some(Item { value: None, coll: Some(coll), version, expires_at: None }),
        undo,
    );
}

/// What a write that changed nothing answers.
fn unchanged(answer: Answer) -> WriteResult {
    Ok(CommandResult::Answer { answer, version: None })
}

/// What a write answers: `answer`, with the entry's version if it changed the state.
fn answered(answer: Answer, changed: bool, version: Version) -> WriteResult {
    Ok(CommandResult::Answer { answer, version: changed.then_some(version) })
}

/// The client's name of a key the state machine holds (without its database prefix).
fn client_key(key: &[u8]) -> Value {
    let name = keel_types::db_of(key).map_or(key, |(_, name)| name);
    Value::copy_from_slice(name)
}

/// Draws for a write that chooses (`SPOP`): from its entry's index and key, so every
/// replica draws the same.
fn write_draws(version: Version, key: &[u8]) -> SplitMix64 {
    let mix = key.iter().fold(version.index.0, |h, b| h.rotate_left(5) ^ u64::from(*b));
    SplitMix64::new(mix.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

// ----- writes ------------------------------------------------------------------------

/// Applies one collection write to `key`.
pub(super) fn execute(
    kv: &mut Kv,
    version: Version,
    key: &Key,
    op: &CollOp,
    undo: &mut Undo,
) -> WriteResult {
    match op {
        CollOp::HSet { .. }
        | CollOp::HDel { .. }
        | CollOp::HIncrBy { .. }
        | CollOp::HIncrByFloat { .. } => hash_write(kv, version, key, op, undo),
        CollOp::Push { .. }
        | CollOp::Pop { .. }
        | CollOp::LSet { .. }
        | CollOp::LInsert { .. }
        | CollOp::LRem { .. }
        | CollOp::LTrim { .. } => list_write(kv, version, key, op, undo),
        CollOp::LMove { to, from, to_end } => lmove(kv, version, key, to, *from, *to_end, undo),
        CollOp::SAdd { .. } | CollOp::SRem { .. } | CollOp::SPop { .. } => {
            set_write(kv, version, key, op, undo)
        }
        CollOp::SMove { to, member } => smove(kv, version, key, to, member, undo),
        CollOp::SStore { how, sources } => {
            let members = set_combine(kv, sources, *how)?;
            let mut coll = Coll::new(CollKind::Set);
            for member in members {
                coll.s_insert(member);
            }
            let len = coll.len() as i64;
            overwrite(kv, key, coll, version, undo);
            answered(Answer::Int(len), true, version)
        }
        CollOp::ZAdd { flags, pairs } => zadd(kv, version, key, *flags, pairs, undo),
        CollOp::ZRem { .. } | CollOp::ZPop { .. } | CollOp::ZRemRange { .. } => {
            zset_write(kv, version, key, op, undo)
        }
        CollOp::ZStore { first, combine } => {
            let scored = zset_combine(kv, first, combine)?;
            let mut coll = Coll::new(CollKind::ZSet);
            for (member, score) in scored {
                coll.z_insert(member, score);
            }
            let len = coll.len() as i64;
            overwrite(kv, key, coll, version, undo);
            answered(Answer::Int(len), true, version)
        }
        CollOp::SortStore { source, spec } => {
            let mut coll = Coll::new(CollKind::List);
            for element in sorted(kv, source, spec)? {
                coll.l_push(false, element);
            }
            let len = coll.len() as i64;
            overwrite(kv, key, coll, version, undo);
            answered(Answer::Int(len), true, version)
        }
        CollOp::ZRangeStore { source, spec } => {
            let mut coll = Coll::new(CollKind::ZSet);
            if let Some(z) = coll_of(kv, source, CollKind::ZSet)? {
                for at in zrange_positions(z.zset(), spec, usize::MAX) {
                    let (score, member) = z.zset().order()[at].clone();
                    coll.z_insert(member, score);
                }
            }
            let len = coll.len() as i64;
            overwrite(kv, key, coll, version, undo);
            answered(Answer::Int(len), true, version)
        }
        CollOp::MPop { others, end, count, zset } => {
            mpop(kv, version, key, others, *end, *count, *zset, undo)
        }
    }
}

fn hash_write(
    kv: &mut Kv,
    version: Version,
    key: &Key,
    op: &CollOp,
    undo: &mut Undo,
) -> WriteResult {
    let mut coll = coll_to_change(kv, key, CollKind::Hash)?;
    let answer = match op {
        CollOp::HSet { pairs, only_new: true } => {
            let (field, value) =
                pairs.first().ok_or_else(|| invalid("wrong number of arguments"))?;
            if coll.hash_map().contains_key(field) {
                return unchanged(Answer::Int(0));
            }
            coll.h_insert(field.clone(), value.clone());
            Answer::Int(1)
        }
        CollOp::HSet { pairs, only_new: false } => {
            let fresh = pairs.iter().filter(|(f, v)| coll.h_insert(f.clone(), v.clone()).is_none());
            Answer::Int(fresh.count() as i64)
        }
        CollOp::HDel { fields } => {
            let gone = fields.iter().filter(|f| coll.h_remove(f).is_some()).count();
            if gone == 0 {
                return unchanged(Answer::Int(0));
            }
            Answer::Int(gone as i64)
        }
        CollOp::HIncrBy { field, delta } => {
            let base = match coll.hash_map().get(field) {
                None => 0,
                Some(v) => std::str::from_utf8(v)
                    .ok()
                    .and_then(|t| t.parse::<i64>().ok())
                    .ok_or_else(|| invalid("hash value is not an integer"))?,
            };
            let new = base
                .checked_add(*delta)
                .ok_or_else(|| invalid("increment or decrement would overflow"))?;
            coll.h_insert(field.clone(), new.to_string().into());
            Answer::Int(new)
        }
        CollOp::HIncrByFloat { field, delta } => {
            let base = match coll.hash_map().get(field) {
                None => 0.0,
                Some(v) => super::kv_strings::parse_float(v)
                    .ok_or_else(|| invalid("hash value is not a float"))?,
            };
            let new = base + f64::from_bits(*delta);
            if !new.is_finite() {
                return Err(invalid("increment would produce NaN or Infinity"));
            }
            let text: Value = super::kv_strings::format_float(new).into();
            coll.h_insert(field.clone(), text.clone());
            Answer::Bulk(text)
        }
        _ => unreachable!("a hash write"),
    };
    store(kv, key, coll, version, undo);
    answered(answer, true, version)
}

/// A list index (negative from the end) as a position, if inside the list.
fn list_position(len: usize, index: i64) -> Option<usize> {
    let at = if index < 0 { index.checked_add(len as i64)? } else { index };
    (at >= 0 && (at as usize) < len).then_some(at as usize)
}

/// Redis's `start..=stop` range arithmetic (negative from the end, clamped): the
/// positions `[from, to)` it covers, empty when it covers none.
pub(super) fn span(len: usize, start: i64, stop: i64) -> (usize, usize) {
    let len_i = len as i64;
    let start = if start < 0 { (start.saturating_add(len_i)).max(0) } else { start };
    let stop = if stop < 0 { stop.saturating_add(len_i) } else { stop.min(len_i - 1) };
    if start > stop || start >= len_i {
        return (0, 0);
    }
    (start as usize, stop as usize + 1)
}

fn list_write(
    kv: &mut Kv,
    version: Version,
    key: &Key,
    op: &CollOp,
    undo: &mut Undo,
) -> WriteResult {
    let (existed, mut coll) = opened(kv, key, CollKind::List)?;
    let answer = match op {
        CollOp::Push { only_existing: true, .. } if !existed => {
            return unchanged(Answer::Int(0));
        }
        CollOp::Push { end, values, .. } => {
            for value in values {
                coll.l_push(*end == End::Front, value.clone());
            }
            Answer::Int(coll.len() as i64)
        }
        CollOp::Pop { count: Some(_), .. } if !existed => {
            return answered(Answer::NilArray, false, version);
        }
        CollOp::Pop { count: Some(0), .. } => return unchanged(Answer::Array(Vec::new())),
        CollOp::Pop { end, count } => {
            let take = count.unwrap_or(1).min(coll.len() as u64) as usize;
            if take > ANSWER_ELEMENTS_MAX {
                return Err(too_many());
            }
            let popped: Vec<Answer> = (0..take)
                .filter_map(|_| coll.l_pop(*end == End::Front))
                .map(Answer::Bulk)
                .collect();
            match count {
                None => popped.into_iter().next().unwrap_or(Answer::Nil),
                Some(_) => Answer::Array(popped),
            }
        }
        CollOp::LSet { index, value } => {
            if !existed {
                return Err(invalid("no such key"));
            }
            let at =
                list_position(coll.len(), *index).ok_or_else(|| invalid("index out of range"))?;
            coll.l_set(at, value.clone());
            Answer::Ok
        }
        CollOp::LInsert { before, pivot, value } => {
            if !existed {
                return unchanged(Answer::Int(0));
            }
            let Some(at) = coll.list().iter().position(|v| v == pivot) else {
                return answered(Answer::Int(-1), false, version);
            };
            coll.l_insert(if *before { at } else { at + 1 }, value.clone());
            Answer::Int(coll.len() as i64)
        }
        CollOp::LRem { count, value } => {
            let list = coll.list();
            let matches = list.iter().enumerate().filter(|(_, v)| *v == value).map(|(i, _)| i);
            let mut doomed: Vec<usize> = match *count {
                0 => matches.collect(),
                n if n > 0 => matches.take(n as usize).collect(),
                n => {
                    let all: Vec<usize> = matches.collect();
                    let keep = all.len().saturating_sub(n.unsigned_abs() as usize);
                    all[keep..].to_vec()
                }
            };
            doomed.sort_unstable();
            for at in doomed.iter().rev() {
                coll.l_remove(*at);
            }
            if doomed.is_empty() {
                return unchanged(Answer::Int(0));
            }
            Answer::Int(doomed.len() as i64)
        }
        CollOp::LTrim { start, stop } => {
            if !existed {
                return answered(Answer::Ok, false, version);
            }
            let (from, to) = span(coll.len(), *start, *stop);
            if (from, to) == (0, coll.len()) {
                return answered(Answer::Ok, false, version);
            }
            coll.l_keep(from, to);
            Answer::Ok
        }
        _ => unreachable!("a list write"),
    };
    store(kv, key, coll, version, undo);
    answered(answer, true, version)
}

fn too_many() -> KeelError {
    invalid("value is out of range: the answer would hold more than 1048576 elements")
}

/// `LMOVE`: checks both keys' types before anything moves.
fn lmove(
    kv: &mut Kv,
    version: Version,
    key: &Key,
    to: &Key,
    from: End,
    to_end: End,
    undo: &mut Undo,
) -> WriteResult {
    // As Redis: a missing source answers null whatever the destination holds.
    let Some(source) = coll_of(kv, key, CollKind::List)? else {
        return answered(Answer::Nil, false, version);
    };
    let mut source = source.clone();
    coll_of(kv, to, CollKind::List)?;
    let value = source.l_pop(from == End::Front).expect("a live list holds an element");
    if to == key {
        source.l_push(to_end == End::Front, value.clone());
        store(kv, key, source, version, undo);
    } else {
        let mut dest = coll_to_change(kv, to, CollKind::List)?;
        dest.l_push(to_end == End::Front, value.clone());
        store(kv, key, source, version, undo);
        store(kv, to, dest, version, undo);
    }
    answered(Answer::Bulk(value), true, version)
}

/// `LMPOP`, `ZMPOP` and the blocking pops: the first non-empty key of `key` and
/// `others`.
#[allow(clippy::too_many_arguments)]
fn mpop(
    kv: &mut Kv,
    version: Version,
    key: &Key,
    others: &[Key],
    end: End,
    count: u64,
    zset: bool,
    undo: &mut Undo,
) -> WriteResult {
    let kind = if zset { CollKind::ZSet } else { CollKind::List };
    for candidate in std::iter::once(key).chain(others) {
        let Some(coll) = coll_of(kv, candidate, kind)? else { continue };
        let mut coll = coll.clone();
        let take = (count.min(coll.len() as u64) as usize).min(ANSWER_ELEMENTS_MAX);
        let popped: Vec<Answer> = if zset {
            (0..take)
                .map(|_| {
                    let z = coll.zset();
                    let (score, member) =
                        if end == End::Front { z.order().front() } else { z.order().back() }
                            .cloned()
                            .expect("not empty");
                    coll.z_remove(&member);
                    Answer::Array(vec![Answer::Bulk(member), double(score.get())])
                })
                .collect()
        } else {
            (0..take).filter_map(|_| coll.l_pop(end == End::Front)).map(Answer::Bulk).collect()
        };
        store(kv, candidate, coll, version, undo);
        let answer =
            Answer::Array(vec![Answer::Bulk(client_key(candidate)), Answer::Array(popped)]);
        return answered(answer, true, version);
    }
    answered(Answer::NilArray, false, version)
}

fn set_write(
    kv: &mut Kv,
    version: Version,
    key: &Key,
    op: &CollOp,
    undo: &mut Undo,
) -> WriteResult {
    let (existed, mut coll) = opened(kv, key, CollKind::Set)?;
    let answer = match op {
        CollOp::SAdd { members } => {
            let added = members.iter().filter(|m| coll.s_insert((*m).clone())).count();
            if added == 0 {
                return unchanged(Answer::Int(0));
            }
            Answer::Int(added as i64)
        }
        CollOp::SRem { members } => {
            let gone = members.iter().filter(|m| coll.s_remove(m)).count();
            if gone == 0 {
                return unchanged(Answer::Int(0));
            }
            Answer::Int(gone as i64)
        }
        CollOp::SPop { count } => {
            if !existed {
                let none = if count.is_some() { Answer::Set(Vec::new()) } else { Answer::Nil };
                return answered(none, false, version);
            }
            let take = count.unwrap_or(1).min(coll.len() as u64) as usize;
            if take > ANSWER_ELEMENTS_MAX {
                return Err(too_many());
            }
            // One pass over the members and a partial shuffle of their positions: O(n),
            // whatever the count.
            let mut draws = write_draws(version, key);
            let mut members: Vec<Value> = coll.set().iter().cloned().collect();
            for i in 0..take {
                let j = i + draws.index(members.len() - i);
                members.swap(i, j);
            }
            let mut popped = Vec::with_capacity(take);
            for member in members.into_iter().take(take) {
                coll.s_remove(&member);
                popped.push(Answer::Bulk(member));
            }
            match count {
                None => popped.into_iter().next().unwrap_or(Answer::Nil),
                Some(_) if popped.is_empty() => {
                    return answered(Answer::Set(popped), false, version)
                }
                Some(_) => Answer::Set(popped),
            }
        }
        _ => unreachable!("a set write"),
    };
    store(kv, key, coll, version, undo);
    answered(answer, true, version)
}

fn smove(
    kv: &mut Kv,
    version: Version,
    key: &Key,
    to: &Key,
    member: &Value,
    undo: &mut Undo,
) -> WriteResult {
    // As Redis: a missing source answers 0 whatever the destination holds.
    let Some(source) = coll_of(kv, key, CollKind::Set)?.cloned() else {
        return unchanged(Answer::Int(0));
    };
    coll_of(kv, to, CollKind::Set)?;
    let source = Some(source);
    let Some(mut source) = source.filter(|s| s.set().contains(member)) else {
        return unchanged(Answer::Int(0));
    };
    if to == key {
        return answered(Answer::Int(1), false, version);
    }
    let mut dest = coll_to_change(kv, to, CollKind::Set)?;
    source.s_remove(member);
    store(kv, key, source, version, undo);
    // A member the destination holds already leaves it unchanged: no new version (a
    // `WATCH` of it holds), no event, as Redis.
    if dest.s_insert(member.clone()) {
        store(kv, to, dest, version, undo);
    }
    answered(Answer::Int(1), true, version)
}

fn zadd(
    kv: &mut Kv,
    version: Version,
    key: &Key,
    flags: ZAddFlags,
    pairs: &[(u64, Value)],
    undo: &mut Undo,
) -> WriteResult {
    let mut coll = coll_to_change(kv, key, CollKind::ZSet)?;
    let (mut added, mut changed) = (0, 0);
    let mut incr_result = None;
    for (bits, member) in pairs {
        let given = f64::from_bits(*bits);
        let old = coll.zset().score(member);
        let new = match (flags.incr, old) {
            (true, Some(old)) => old.get() + given,
            _ => given,
        };
        let new =
            Score::new(new).ok_or_else(|| invalid("resulting score is not a number (NaN)"))?;
        match old {
            Some(_) if flags.nx => continue,
            None if flags.xx => continue,
            Some(old) if (flags.gt && new <= old) || (flags.lt && new >= old) => continue,
            Some(old) => {
                if old != new {
                    coll.z_insert(member.clone(), new);
                    changed += 1;
                }
            }
            None => {
                coll.z_insert(member.clone(), new);
                added += 1;
            }
        }
        incr_result = Some(new.get());
    }
    let answer = match flags.incr {
        true => incr_result.map_or(Answer::Nil, double),
        false if flags.ch => Answer::Int(added + changed),
        false => Answer::Int(added),
    };
    if added + changed == 0 {
        return answered(answer, false, version);
    }
    store(kv, key, coll, version, undo);
    answered(answer, true, version)
}

fn zset_write(
    kv: &mut Kv,
    version: Version,
    key: &Key,
    op: &CollOp,
    undo: &mut Undo,
) -> WriteResult {
    let mut coll = coll_to_change(kv, key, CollKind::ZSet)?;
    let answer = match op {
        CollOp::ZRem { members } => {
            let gone = members.iter().filter(|m| coll.z_remove(m).is_some()).count();
            if gone == 0 {
                return unchanged(Answer::Int(0));
            }
            Answer::Int(gone as i64)
        }
        CollOp::ZPop { max, count } => {
            let take = count.unwrap_or(1).min(coll.len() as u64) as usize;
            if take > ANSWER_ELEMENTS_MAX {
                return Err(too_many());
            }
            let mut popped = Vec::with_capacity(take);
            for _ in 0..take {
                let z = coll.zset();
                let (score, member) = if *max { z.order().back() } else { z.order().front() }
                    .cloned()
                    .expect("not empty");
                coll.z_remove(&member);
                popped.push((Answer::Bulk(member), double(score.get())));
            }
            if popped.is_empty() {
                return answered(Answer::Array(Vec::new()), false, version);
            }
            match count {
                None => {
                    let (member, score) = popped.pop().expect("one");
                    Answer::Array(vec![member, score])
                }
                Some(_) => Answer::Pairs(popped),
            }
        }
        CollOp::ZRemRange { by } => {
            let spec = ZRangeSpec { by: by.clone(), rev: false, limit: None };
            let doomed: Vec<Value> = zrange_positions(coll.zset(), &spec, usize::MAX)
                .into_iter()
                .map(|at| coll.zset().order()[at].1.clone())
                .collect();
            for member in &doomed {
                coll.z_remove(member);
            }
            if doomed.is_empty() {
                return unchanged(Answer::Int(0));
            }
            Answer::Int(doomed.len() as i64)
        }
        _ => unreachable!("a sorted-set write"),
    };
    store(kv, key, coll, version, undo);
    answered(answer, true, version)
}

// ----- reads -------------------------------------------------------------------------

/// Serves one collection read of `key` from applied state: the answer, and the index
/// that must be durable before it is served at `monotonic` or above (the last write to
/// any key it read). `draw` seeds the reads that choose at random.
pub fn read(kv: &Kv, key: &Key, op: &CollRead, draw: u64) -> (WriteResult, LogIndex) {
    let needed = std::iter::once(key)
        .chain(op.other_keys())
        .map(|k| kv.update_index(k))
        .max()
        .unwrap_or(LogIndex::ZERO);
    let answer = match (op.kind(), op) {
        (None, CollRead::Encoding) => Ok(encoding_facts(kv, key)),
        (None, CollRead::Sort(spec)) => sorted(kv, key, spec).and_then(|elements| {
            if elements.len() > ANSWER_ELEMENTS_MAX {
                return Err(too_many());
            }
            Ok(Answer::Array(elements.iter().map(bulk).collect()))
        }),
        (None, CollRead::Memory) => Ok(match kv.item(key).filter(|item| item.live()) {
            Some(item) => Answer::Int(super::kv::item_bytes(key, item) as i64),
            None => Answer::Nil,
        }),
        (None, _) => Ok(Answer::Status(type_name(kv, key).to_string())),
        (Some(kind), _) => {
            coll_of(kv, key, kind).and_then(|coll| answer_read(kv, key, coll, op, draw))
        }
    };
    (answer.map(|answer| CommandResult::Answer { answer, version: None }), needed)
}

/// `SORT`'s elements of `key` (a list, a set or a sorted set; none if absent) in the
/// order `spec` asks: as numbers (ties by their bytes) or, `ALPHA`, by their bytes;
/// highest first with `DESC`; as held when unsorted (a sorted set's by score, reversed
/// with `DESC`, as Redis's); then `LIMIT`'s slice.
fn sorted(kv: &Kv, key: &[u8], spec: &SortSpec) -> Result<Vec<Value>, KeelError> {
    let zset = kv
        .item(key)
        .and_then(|item| item.coll.as_ref())
        .is_some_and(|c| c.kind() == CollKind::ZSet);
    let mut elements: Vec<Value> = match kv.item(key) {
        Some(Item { coll: Some(coll), .. }) => match coll.data() {
            super::coll::Data::List(list) => list.iter().cloned().collect(),
            super::coll::Data::Set(set) => set.iter().cloned().collect(),
            super::coll::Data::ZSet(z) => z.order().iter().map(|(_, m)| m.clone()).collect(),
            super::coll::Data::Hash(_) => return Err(KeelError::WrongType),
        },
        Some(item) if item.live() => return Err(KeelError::WrongType),
        _ => Vec::new(),
    };
    if !spec.unsorted {
        if spec.alpha {
            elements.sort();
        } else {
            let score = |e: &Value| {
                std::str::from_utf8(e)
                    .ok()
                    .and_then(|t| t.trim().parse::<f64>().ok())
                    .filter(|s| !s.is_nan())
                    .ok_or_else(|| invalid("One or more scores can't be converted into double"))
            };
            let mut scored =
                elements.into_iter().map(|e| Ok((score(&e)?, e))).collect::<Result<Vec<_>, _>>()?;
            scored.sort_by(|(a, x), (b, y)| a.total_cmp(b).then_with(|| x.cmp(y)));
            elements = scored.into_iter().map(|(_, e)| e).collect();
        }
        if spec.desc {
            elements.reverse();
        }
    } else if spec.desc && zset {
        elements.reverse();
    }
    if let Some((offset, count)) = spec.limit {
        let start = usize::try_from(offset.max(0)).unwrap_or(usize::MAX).min(elements.len());
        let end = match usize::try_from(count) {
            Ok(count) => start.saturating_add(count).min(elements.len()),
            Err(_) => elements.len(),
        };
        elements = elements[start..end].to_vec();
    }
    Ok(elements)
}

/// `OBJECT ENCODING`'s facts about a key ([`CollRead::Encoding`]).
fn encoding_facts(kv: &Kv, key: &[u8]) -> Answer {
    let Some(item) = kv.item(key).filter(|item| item.live()) else { return Answer::Nil };
    let Some(coll) = &item.coll else {
        let value = item.value.clone().expect("live");
        return Answer::Array(vec![Answer::Status("string".into()), Answer::Bulk(value)]);
    };
    let elements: Vec<&Value> = match coll.data() {
        super::coll::Data::Hash(map) => map.iter().flat_map(|(f, v)| [f, v]).collect(),
        super::coll::Data::List(list) => list.iter().collect(),
        super::coll::Data::Set(set) => set.iter().collect(),
        super::coll::Data::ZSet(z) => z.order().iter().map(|(_, m)| m).collect(),
    };
    let longest = elements.iter().map(|e| e.len()).max().unwrap_or(0);
    let integers = elements.iter().all(|e| {
        std::str::from_utf8(e)
            .ok()
            .and_then(|t| t.parse::<i64>().ok())
            .is_some_and(|n| n.to_string().as_bytes() == &e[..])
    });
    Answer::Array(vec![
        Answer::Status(coll.kind().name().into()),
        Answer::Int(coll.len() as i64),
        Answer::Int(longest as i64),
        Answer::Int(i64::from(integers)),
    ])
}

/// `TYPE`'s answer.
fn type_name(kv: &Kv, key: &[u8]) -> &'static str {
    match kv.item(key) {
        Some(Item { coll: Some(coll), .. }) => coll.kind().name(),
        Some(Item { value: Some(_), .. }) => "string",
        _ => "none",
    }
}

fn answer_read(
    kv: &Kv,
    key: &Key,
    coll: Option<&Coll>,
    op: &CollRead,
    draw: u64,
) -> Result<Answer, KeelError> {
    let len = coll.map_or(0, Coll::len);
    let limited = |n: usize| if n > ANSWER_ELEMENTS_MAX { Err(too_many()) } else { Ok(()) };
    Ok(match op {
        CollRead::Type | CollRead::Encoding | CollRead::Memory | CollRead::Sort(_) => {
            unreachable!("answered by the caller")
        }
        CollRead::HLen | CollRead::LLen | CollRead::SCard | CollRead::ZCard => {
            Answer::Int(len as i64)
        }
        CollRead::Scan { cursor, count, .. } => scan(coll, *cursor, *count),
        CollRead::HGet { .. }
        | CollRead::HExists(_)
        | CollRead::HStrLen(_)
        | CollRead::HAll { .. }
        | CollRead::HRandField { .. } => {
            if matches!(op, CollRead::HAll { .. }) {
                limited(len)?;
            }
            hash_read(coll, op, draw)?
        }
        CollRead::LRange(start, stop) => {
            let Some(coll) = coll else { return Ok(Answer::Array(Vec::new())) };
            let (from, to) = span(len, *start, *stop);
            limited(to - from)?;
            Answer::Array(coll.list().clone().slice(from..to).iter().map(bulk).collect())
        }
        CollRead::LIndex(index) => coll
            .and_then(|c| list_position(len, *index).map(|at| bulk(&c.list()[at])))
            .unwrap_or(Answer::Nil),
        CollRead::LPos { element, rank, count, max_len } => {
            lpos(coll, element, *rank, *count, *max_len)
        }
        CollRead::SIsMember { members, many } => {
            let has = |m: &Value| Answer::Int(i64::from(coll.is_some_and(|c| c.set().contains(m))));
            match many {
                false => has(&members[0]),
                true => Answer::Array(members.iter().map(has).collect()),
            }
        }
        CollRead::SMembers => {
            limited(len)?;
            Answer::Set(coll.map_or_else(Vec::new, |c| c.set().iter().map(bulk).collect()))
        }
        CollRead::SRandMember(count) => {
            let members: Vec<&Value> = coll.map_or_else(Vec::new, |c| c.set().iter().collect());
            pick(&members, *count, draw, |m| bulk(m), None::<fn(&&Value) -> Answer>)?
        }
        CollRead::SCombine { how, others, card } => {
            let sources: Vec<Key> =
                std::iter::once(key.clone()).chain(others.iter().cloned()).collect();
            let members = set_combine(kv, &sources, *how)?;
            match card {
                Some(0) => Answer::Int(members.len() as i64),
                Some(limit) => Answer::Int(members.len().min(*limit as usize) as i64),
                None => {
                    limited(members.len())?;
                    Answer::Set(members.iter().map(bulk).collect())
                }
            }
        }
        CollRead::ZScore { members, many } => {
            let score = |m: &Value| {
                coll.and_then(|c| c.zset().score(m)).map_or(Answer::Nil, |s| double(s.get()))
            };
            match many {
                false => score(&members[0]),
                true => Answer::Array(members.iter().map(score).collect()),
            }
        }
        CollRead::ZCount(by) => {
            let spec = ZRangeSpec { by: by.clone(), rev: false, limit: None };
            let (from, to) = coll.map_or((0, 0), |c| zrange_bounds(c.zset(), &spec));
            Answer::Int((to - from) as i64)
        }
        CollRead::ZRange { spec, with_scores } => {
            let Some(coll) = coll else { return Ok(Answer::Array(Vec::new())) };
            let positions = zrange_positions(coll.zset(), spec, ANSWER_ELEMENTS_MAX + 1);
            limited(positions.len())?;
            zanswer(positions.iter().map(|at| &coll.zset().order()[*at]), *with_scores)
        }
        CollRead::ZRank { member, rev } => {
            let Some(z) = coll.map(Coll::zset) else { return Ok(Answer::Nil) };
            match z.score(member) {
                None => Answer::Nil,
                Some(score) => {
                    let at = z.position(score, member).expect("held");
                    Answer::Int(if *rev { len - 1 - at } else { at } as i64)
                }
            }
        }
        CollRead::ZRandMember { count, with_scores } => {
            let pairs: Vec<&(Score, Value)> =
                coll.map_or_else(Vec::new, |c| c.zset().order().iter().collect());
            let scores = with_scores.then_some(|p: &&(Score, Value)| double(p.0.get()));
            pick(&pairs, *count, draw, |p| bulk(&p.1), scores)?
        }
        CollRead::ZCombine { combine, with_scores, card } => {
            let scored = zset_combine(kv, key, combine)?;
            match card {
                Some(0) => Answer::Int(scored.len() as i64),
                Some(limit) => Answer::Int(scored.len().min(*limit as usize) as i64),
                None => {
                    limited(scored.len())?;
                    let mut pairs: Vec<(Score, Value)> =
                        scored.into_iter().map(|(m, s)| (s, m)).collect();
                    pairs.sort();
                    zanswer(pairs.iter(), *with_scores)
                }
            }
        }
    })
}

fn hash_read(coll: Option<&Coll>, op: &CollRead, draw: u64) -> Result<Answer, KeelError> {
    let map = coll.map(Coll::hash_map);
    let get = |f: &Value| map.and_then(|m| m.get(f)).map_or(Answer::Nil, bulk);
    Ok(match op {
        CollRead::HGet { fields, many: false } => get(&fields[0]),
        CollRead::HGet { fields, many: true } => Answer::Array(fields.iter().map(get).collect()),
        CollRead::HExists(field) => {
            Answer::Int(i64::from(map.is_some_and(|m| m.contains_key(field))))
        }
        CollRead::HStrLen(field) => {
            Answer::Int(map.and_then(|m| m.get(field)).map_or(0, |v| v.len() as i64))
        }
        CollRead::HAll { fields: true, values: true } => Answer::Map(
            map.into_iter().flat_map(|m| m.iter()).map(|(f, v)| (bulk(f), bulk(v))).collect(),
        ),
        CollRead::HAll { fields, .. } => Answer::Array(
            map.into_iter()
                .flat_map(|m| m.iter())
                .map(|(f, v)| if *fields { bulk(f) } else { bulk(v) })
                .collect(),
        ),
        CollRead::HRandField { count, with_values } => {
            let pairs: Vec<(&Value, &Value)> = map.map_or_else(Vec::new, |m| m.iter().collect());
            let values = with_values.then_some(|p: &(&Value, &Value)| bulk(p.1));
            pick(&pairs, *count, draw, |p| bulk(p.0), values)?
        }
        _ => unreachable!("a hash read"),
    })
}

/// `SRANDMEMBER`, `HRANDFIELD`, `ZRANDMEMBER`: one element (no count: the element or
/// null), distinct ones (a positive count), or any with repeats (a negative count); each
/// with its second part when `second` is given. An answer of more than
/// [`ANSWER_ELEMENTS_MAX`] is refused before anything is drawn.
fn pick<T>(
    items: &[T],
    count: Option<i64>,
    draw: u64,
    first: impl Fn(&T) -> Answer,
    second: Option<impl Fn(&T) -> Answer>,
) -> Result<Answer, KeelError> {
    let size = match count {
        Some(n) if n < 0 => n.unsigned_abs(),
        Some(n) => (n as u64).min(items.len() as u64),
        None => 1,
    };
    if size > ANSWER_ELEMENTS_MAX as u64 {
        return Err(too_many());
    }
    Ok(pick_within(items, count, draw, first, second))
}

fn pick_within<T>(
    items: &[T],
    count: Option<i64>,
    draw: u64,
    first: impl Fn(&T) -> Answer,
    second: Option<impl Fn(&T) -> Answer>,
) -> Answer {
    let mut draws = SplitMix64::new(draw);
    let chosen: Vec<&T> = match count {
        None => {
            return match items.is_empty() {
                true => Answer::Nil,
                false => first(&items[draws.index(items.len())]),
            }
        }
        Some(_) if items.is_empty() => Vec::new(),
        Some(n) if n < 0 => {
            (0..n.unsigned_abs()).map(|_| &items[draws.index(items.len())]).collect()
        }
        Some(n) if n as usize >= items.len() => items.iter().collect(),
        Some(n) => {
            // A partial shuffle of the positions: `n` distinct ones.
            let mut positions: Vec<usize> = (0..items.len()).collect();
            for i in 0..n as usize {
                let j = i + draws.index(items.len() - i);
                positions.swap(i, j);
            }
            positions[..n as usize].iter().map(|at| &items[*at]).collect()
        }
    };
    match second {
        Some(second) => Answer::Pairs(chosen.into_iter().map(|t| (first(t), second(t))).collect()),
        None => Answer::Array(chosen.into_iter().map(first).collect()),
    }
}

fn lpos(
    coll: Option<&Coll>,
    element: &Value,
    rank: i64,
    count: Option<u64>,
    max_len: u64,
) -> Answer {
    let none = || if count.is_some() { Answer::Array(Vec::new()) } else { Answer::Nil };
    let Some(list) = coll.map(Coll::list) else { return none() };
    let limit = if max_len == 0 { list.len() } else { (max_len as usize).min(list.len()) };
    let wanted = match count {
        None => 1,
        Some(0) => usize::MAX,
        Some(n) => n as usize,
    };
    let mut skip = rank.unsigned_abs() - 1;
    let mut found = Vec::new();
    let positions: Box<dyn Iterator<Item = usize>> = if rank > 0 {
        Box::new(0..limit)
    } else {
        Box::new((list.len() - limit..list.len()).rev())
    };
    for at in positions {
        if list[at] != element {
            continue;
        }
        if skip > 0 {
            skip -= 1;
            continue;
        }
        found.push(Answer::Int(at as i64));
        if found.len() >= wanted {
            break;
        }
    }
    match count {
        None => found.pop().unwrap_or(Answer::Nil),
        Some(_) => Answer::Array(found),
    }
}

/// `HSCAN`/`SSCAN`/`ZSCAN`: up to `count` elements from position `cursor` (a small
/// collection whole, as Redis answers one), and the next cursor.
fn scan(coll: Option<&Coll>, cursor: u64, count: u64) -> Answer {
    let page = |next: usize, items: Vec<Answer>| {
        Answer::Array(vec![Answer::Bulk(next.to_string().into()), Answer::Array(items)])
    };
    let Some(coll) = coll else { return page(0, Vec::new()) };
    let len = coll.len();
    let from = usize::try_from(cursor).unwrap_or(usize::MAX).min(len);
    let take = if len <= 128 { len } else { (count.max(1) as usize).min(ANSWER_ELEMENTS_MAX) };
    let to = from.saturating_add(take).min(len);
    let mut items = Vec::new();
    match coll.data() {
        super::coll::Data::Hash(map) => map.iter().skip(from).take(to - from).for_each(|(f, v)| {
            items.push(bulk(f));
            items.push(bulk(v));
        }),
        super::coll::Data::Set(set) => {
            items.extend(set.iter().skip(from).take(to - from).map(bulk))
        }
        super::coll::Data::ZSet(z) => {
            z.order().iter().skip(from).take(to - from).for_each(|(s, m)| {
                items.push(bulk(m));
                items.push(Answer::Bulk(keel_types::coll::score_text(s.get()).into()));
            })
        }
        super::coll::Data::List(_) => unreachable!("lists are not scanned"),
    }
    page(if to >= len { 0 } else { to }, items)
}

// ----- ranges and combinations -------------------------------------------------------

fn zanswer<'a>(pairs: impl Iterator<Item = &'a (Score, Value)>, with_scores: bool) -> Answer {
    match with_scores {
        true => Answer::Pairs(pairs.map(|(s, m)| (bulk(m), double(s.get()))).collect()),
        false => Answer::Array(pairs.map(|(_, m)| bulk(m)).collect()),
    }
}

/// The positions `[from, to)` a range covers in (score, member) order, before `REV`
/// and `LIMIT`.
fn zrange_bounds(z: &super::coll::ZSet, spec: &ZRangeSpec) -> (usize, usize) {
    let len = z.len();
    match &spec.by {
        ZBy::Rank(start, stop) => {
            let (from, to) = span(len, *start, *stop);
            if spec.rev {
                // Ranks count from the highest score.
                (len - to, len - from)
            } else {
                (from, to)
            }
        }
        ZBy::Score(min, max) => {
            let from =
                z.partition(
                    |s, _| if min.open { s.get() <= min.value() } else { s.get() < min.value() },
                );
            let to =
                z.partition(
                    |s, _| if max.open { s.get() < max.value() } else { s.get() <= max.value() },
                );
            (from, to.max(from))
        }
        ZBy::Lex(min, max) => {
            let below_min = |m: &Value| match min {
                LexBound::Min => false,
                LexBound::Max => true,
                LexBound::Incl(b) => m < b,
                LexBound::Excl(b) => m <= b,
            };
            let within_max = |m: &Value| match max {
                LexBound::Min => false,
                LexBound::Max => true,
                LexBound::Incl(b) => m <= b,
                LexBound::Excl(b) => m < b,
            };
            let from = z.partition(|_, m| below_min(m));
            let to = z.partition(|_, m| within_max(m));
            (from, to.max(from))
        }
    }
}

/// The positions a range selects, in the order it answers them (`REV`: highest first),
/// after `LIMIT`, at most `cap` of them.
fn zrange_positions(z: &super::coll::ZSet, spec: &ZRangeSpec, cap: usize) -> Vec<usize> {
    let (from, to) = zrange_bounds(z, spec);
    let (offset, count) = match spec.limit {
        Some((offset, _)) if offset < 0 => return Vec::new(),
        Some((offset, count)) => {
            (offset as usize, if count < 0 { usize::MAX } else { count as usize })
        }
        None => (0, usize::MAX),
    };
    let take = |it: Box<dyn Iterator<Item = usize>>| it.skip(offset).take(count.min(cap)).collect();
    match spec.rev {
        true => take(Box::new((from..to).rev())),
        false => take(Box::new(from..to)),
    }
}

/// The members of several sets combined; every source a set or absent.
fn set_combine(kv: &Kv, sources: &[Key], how: Algebra) -> Result<BTreeSet<Value>, KeelError> {
    let mut sets = Vec::with_capacity(sources.len());
    let mut seen = BTreeSet::new();
    for (i, source) in sources.iter().enumerate() {
        let set = coll_of(kv, source, CollKind::Set)?.map(Coll::set);
        // A key named again changes no union or intersection, nor a difference past
        // its first source: read once (`SUNION k k k ...` costs one pass).
        if i == 0 || seen.insert(source) {
            sets.push(set);
        }
    }
    let mut out: BTreeSet<Value> = BTreeSet::new();
    match how {
        Algebra::Union => sets.iter().flatten().for_each(|s| out.extend(s.iter().cloned())),
        Algebra::Inter => {
            if sets.iter().any(Option::is_none) {
                return Ok(out);
            }
            let mut sets: Vec<_> = sets.into_iter().flatten().collect();
            sets.sort_by_key(|s| s.len());
            // No source (a client's command names one; a peer's entry is checked by
            // `CollOp::validate`, and this stays total regardless): nothing in common.
            let Some((smallest, rest)) = sets.split_first() else { return Ok(out) };
            out.extend(smallest.iter().filter(|m| rest.iter().all(|s| s.contains(*m))).cloned());
        }
        Algebra::Diff => {
            let Some(Some(first)) = sets.first() else { return Ok(out) };
            out.extend(
                first
                    .iter()
                    .filter(|m| sets[1..].iter().flatten().all(|s| !s.contains(*m)))
                    .cloned(),
            );
        }
    }
    Ok(out)
}

/// One source of a sorted-set combination, borrowed: a sorted set, or a set (each
/// member scored 1), or nothing.
#[derive(Clone, Copy)]
enum Scored<'a> {
    Z(&'a super::coll::ZSet),
    S(&'a imbl::OrdSet<Value>),
    None,
}

impl<'a> Scored<'a> {
    fn of(kv: &'a Kv, key: &[u8]) -> Result<Scored<'a>, KeelError> {
        Ok(match kv.item(key) {
            Some(Item { coll: Some(c), .. }) if c.kind() == CollKind::ZSet => Scored::Z(c.zset()),
            Some(Item { coll: Some(c), .. }) if c.kind() == CollKind::Set => Scored::S(c.set()),
            Some(item) if item.live() => return Err(KeelError::WrongType),
            _ => Scored::None,
        })
    }

    fn score(self, member: &Value) -> Option<f64> {
        match self {
            Scored::Z(z) => z.score(member).map(Score::get),
            Scored::S(s) => s.contains(member).then_some(1.0),
            Scored::None => None,
        }
    }

    fn pairs(self) -> Box<dyn Iterator<Item = (&'a Value, f64)> + 'a> {
        match self {
            Scored::Z(z) => Box::new(z.order().iter().map(|(s, m)| (m, s.get()))),
            Scored::S(s) => Box::new(s.iter().map(|m| (m, 1.0))),
            Scored::None => Box::new(std::iter::empty()),
        }
    }
}

/// The members and scores of several sorted sets (or sets, scored 1) combined. The
/// sources are read in place, never copied; only the result is built.
fn zset_combine(
    kv: &Kv,
    first: &Key,
    combine: &ZCombine,
) -> Result<BTreeMap<Value, Score>, KeelError> {
    let mut sources = Vec::with_capacity(combine.others.len() + 1);
    for key in std::iter::once(first).chain(&combine.others) {
        sources.push(Scored::of(kv, key)?);
    }
    let weight = |i: usize| combine.weights.get(i).map_or(1.0, |w| f64::from_bits(*w));
    // Redis's rules: a product or an aggregate that is NaN (`inf * 0`, `inf + -inf`)
    // counts as 0.
    let not_nan = |x: f64| if x.is_nan() { 0.0 } else { x };
    let aggregate = |a: f64, b: f64| {
        not_nan(match combine.aggregate {
            Aggregate::Sum => a + b,
            Aggregate::Min => a.min(b),
            Aggregate::Max => a.max(b),
        })
    };
    let mut out: BTreeMap<Value, f64> = BTreeMap::new();
    match combine.how {
        Algebra::Union => {
            for (i, source) in sources.iter().enumerate() {
                for (member, score) in source.pairs() {
                    let score = not_nan(score * weight(i));
                    match out.get_mut(member) {
                        Some(s) => *s = aggregate(*s, score),
                        None => {
                            out.insert(member.clone(), score);
                        }
                    }
                }
            }
        }
        Algebra::Inter => {
            'members: for (member, score) in sources[0].pairs() {
                let mut total = not_nan(score * weight(0));
                for (i, source) in sources.iter().enumerate().skip(1) {
                    match source.score(member) {
                        Some(s) => total = aggregate(total, not_nan(s * weight(i))),
                        None => continue 'members,
                    }
                }
                out.insert(member.clone(), total);
            }
        }
        Algebra::Diff => {
            for (member, score) in sources[0].pairs() {
                if sources[1..].iter().all(|s| s.score(member).is_none()) {
                    out.insert(member.clone(), score);
                }
            }
        }
    }
    Ok(out.into_iter().map(|(m, s)| (m, Score::new(s).expect("NaN counted as 0"))).collect())
}
