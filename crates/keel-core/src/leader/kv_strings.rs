//! The state machine's in-place string changes (`APPEND`, `SETRANGE`, `SETBIT`,
//! `INCRBYFLOAT`, `GETDEL`, `GETEX`) and transfers (`COPY`, `RENAME`, `RENAMENX`), each
//! one entry, so atomic on every replica. Every change keeps the key's expiry unless it
//! says otherwise, as Redis's do.

use super::kv::{Item, Kv, Undo, WriteResult};
use keel_types::{CommandResult, KeelError, Key, Modify, Ttl, Value, Version, STRING_BYTES_MAX};

/// Applies one in-place change of `key`.
pub(super) fn modify(
    kv: &mut Kv,
    version: Version,
    key: &Key,
    op: &Modify,
    now_ms: u64,
    undo: &mut Undo,
) -> WriteResult {
    if kv.item(key).is_some_and(|item| item.coll.is_some()) {
        return Err(KeelError::WrongType);
    }
    let current = kv.item(key).filter(|item| item.value.is_some()).cloned();
    let expires_at = current.as_ref().and_then(|item| item.expires_at);
    let before = current.and_then(|item| item.value);
    let done = |value: Option<Value>, number: i64| CommandResult::Modified {
        value,
        number,
        version: Some(version),
    };
    let (new, result) = match op {
        Modify::Append(more) => {
            let mut bytes = before.map_or_else(Vec::new, |b| b.to_vec());
            grown_to(bytes.len() as u64 + more.len() as u64)?;
            bytes.extend_from_slice(more);
            let len = bytes.len() as i64;
            (Some(Value::from(bytes)), done(None, len))
        }
        Modify::SetRange { value, .. } if value.is_empty() => {
            // Nothing to write: the length, and no change (no key created).
            let number = before.as_ref().map_or(0, |b| b.len() as i64);
            return Ok(CommandResult::Modified { value: None, number, version: None });
        }
        Modify::SetRange { offset, value } => {
            let bytes = set_range(before, *offset, value)?;
            let len = bytes.len() as i64;
            (Some(bytes), done(None, len))
        }
        Modify::SetBit { offset, on } => {
            let (bytes, was) = set_bit(before, *offset, *on)?;
            (Some(bytes), done(None, was))
        }
        Modify::IncrByFloat(bits) => {
            let base = match &before {
                None => 0.0,
                Some(bytes) => parse_float(bytes).ok_or_else(|| {
                    KeelError::InvalidArgument("value is not a valid float".into())
                })?,
            };
            let sum = base + f64::from_bits(*bits);
            if !sum.is_finite() {
                return Err(KeelError::InvalidArgument(
                    "increment would produce NaN or Infinity".into(),
                ));
            }
            let text = Value::from(format_float(sum));
            (Some(text.clone()), done(Some(text), 0))
        }
        Modify::GetDel => {
            let Some(value) = before else {
                return Ok(CommandResult::Modified { value: None, number: 0, version: None });
            };
            kv.change(key.clone(), Some(Item::plain(None, version)), undo);
            return Ok(done(Some(value), 1));
        }
        Modify::GetEx(ttl) => {
            let Some(value) = before else {
                return Ok(CommandResult::Modified { value: None, number: 0, version: None });
            };
            let new = ttl.resolve(now_ms, expires_at);
            if *ttl == Ttl::Keep || new == expires_at {
                return Ok(CommandResult::Modified {
                    value: Some(value),
                    number: 0,
                    version: None,
                });
            }
            let item = match new {
                Some(at) if at <= now_ms => Item::plain(None, version),
                _ => Item::string(Some(value.clone()), version, new),
            };
            kv.change(key.clone(), Some(item), undo);
            return Ok(done(Some(value), 1));
        }
    };
    kv.change(key.clone(), Some(Item::string(new, version, expires_at)), undo);
    Ok(result)
}

/// `COPY` (`remove_source` false) and `RENAME`/`RENAMENX` (true): `to` gets `from`'s value
/// and expiry. A rename of an absent key is an error; a copy of one answers 0.
pub(super) fn transfer(
    kv: &mut Kv,
    version: Version,
    from: &Key,
    to: &Key,
    replace: bool,
    remove_source: bool,
    undo: &mut Undo,
) -> WriteResult {
    let unchanged = |number| Ok(CommandResult::Modified { value: None, number, version: None });
    let Some(source) = kv.item(from).filter(|item| item.live()).cloned() else {
        return match remove_source {
            true => Err(KeelError::InvalidArgument("no such key".into())),
            false => unchanged(0),
        };
    };
    if from == to {
        // Redis: a rename onto itself succeeds and changes nothing, a `RENAMENX` finds
        // the destination taken, and a copy onto itself is refused.
        return match (remove_source, replace) {
            (true, true) => unchanged(1),
            (true, false) => unchanged(0),
            (false, _) => Err(KeelError::InvalidArgument(
                "source and destination objects are the same".into(),
            )),
        };
    }
    let occupied = kv.item(to).is_some_and(|item| item.live());
    if occupied && !replace {
        return unchanged(0);
    }
    let moved = Item { version, ..source };
    kv.change(to.clone(), Some(moved), undo);
    if remove_source {
        kv.change(from.clone(), Some(Item::plain(None, version)), undo);
    }
    Ok(CommandResult::Modified { value: None, number: 1, version: Some(version) })
}

/// `SETRANGE`: `value` written at `offset` of `before`, zero-padded up to it.
fn set_range(before: Option<Value>, offset: u64, value: &[u8]) -> Result<Value, KeelError> {
    let end = offset.checked_add(value.len() as u64).ok_or_else(too_large)?;
    grown_to(end)?;
    let mut bytes = before.map_or_else(Vec::new, |b| b.to_vec());
    let end = usize::try_from(end).map_err(|_| too_large())?;
    if bytes.len() < end {
        bytes.resize(end, 0);
    }
    let start = usize::try_from(offset).map_err(|_| too_large())?;
    bytes[start..end].copy_from_slice(value);
    Ok(Value::from(bytes))
}

/// `SETBIT`: `before` with bit `offset` set to `on`, zero-padded up to it; and the bit
/// before.
fn set_bit(before: Option<Value>, offset: u64, on: bool) -> Result<(Value, i64), KeelError> {
    let byte = offset / 8;
    grown_to(byte + 1)?;
    let mut bytes = before.map_or_else(Vec::new, |b| b.to_vec());
    let at = usize::try_from(byte).map_err(|_| too_large())?;
    if bytes.len() <= at {
        bytes.resize(at + 1, 0);
    }
    let mask = 0x80u8 >> (offset % 8);
    let was = i64::from(bytes[at] & mask != 0);
    if on {
        bytes[at] |= mask;
    } else {
        bytes[at] &= !mask;
    }
    Ok((Value::from(bytes), was))
}

fn grown_to(len: u64) -> Result<(), KeelError> {
    if len > STRING_BYTES_MAX {
        return Err(too_large());
    }
    Ok(())
}

fn too_large() -> KeelError {
    KeelError::InvalidArgument("string exceeds maximum allowed size (proto-max-bulk-len)".into())
}

/// A value read as a float, as Redis reads one: decimal or exponent notation, no spaces,
/// not NaN.
pub fn parse_float(bytes: &[u8]) -> Option<f64> {
    let text = std::str::from_utf8(bytes).ok()?;
    if text.is_empty() || text.trim() != text {
        return None;
    }
    let value: f64 = text.parse().ok()?;
    (!value.is_nan()).then_some(value)
}

/// A float as `INCRBYFLOAT` writes it: the shortest decimal that reads back as the same
/// number, without exponent (`3.0e3` is `3000`, `1.5` is `1.5`).
pub fn format_float(value: f64) -> String {
    let text = format!("{value}");
    if text.contains('e') || text.contains('E') {
        format!("{value:.17}").trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}
