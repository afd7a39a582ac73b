//! Reading `KEEL.INVOKE`'s words into an [`Invocation`]: the operation, its levels and
//! options, checked against each other.

use crate::front_door::commands::parse_u64;
use crate::front_door::commands::sessions::req_numbers;
use bytes::Bytes;
use keel_types::{Command, Durability, Limits, ReadLevel};
use keel_wire::reply::error_text;

/// The operation a `KEEL.INVOKE` runs.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum InvokeOp {
    Get,
    /// With every key read, in order.
    MGet(Vec<Bytes>),
    /// A write: one final view, its reply. With the value written.
    Set(Bytes),
    Dequeue,
    /// With the element enqueued.
    Enqueue(Bytes),
}

impl InvokeOp {
    /// Reads: a view per level, each read one after the other.
    pub(super) fn is_read(&self) -> bool {
        matches!(self, InvokeOp::Get | InvokeOp::MGet(_))
    }
}

/// What a `KEEL.INVOKE` asks for.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Invocation {
    pub(super) op: InvokeOp,
    /// The key read, or the queue's name.
    pub(super) key: Bytes,
    /// Weakest first, without repeats; never empty. For a queue operation: the levels
    /// of its preliminary views (its final view is the operation itself).
    pub(super) levels: Vec<ReadLevel>,
    pub(super) confirm: bool,
    pub(super) with_version: bool,
    /// A queue operation's durability (`None`: the keyspace default).
    pub(super) durability: Option<Durability>,
    /// A queue operation's deduplication pair, as `KEEL.REQ` names it (`REQ <client>
    /// <seq>`): a retry of the invocation with the same pair is answered from the
    /// deduplication table, never applied twice.
    pub(super) req: Option<(u64, u64)>,
}

impl Invocation {
    /// The command of a step other than a read's (`is_final`: the last one), and its
    /// durability.
    pub(super) fn command(&self, is_final: bool) -> (Command, Option<Durability>) {
        let queue = || self.key.clone();
        match (&self.op, is_final) {
            (InvokeOp::Set(value), _) => {
                (Command::Put { key: self.key.clone(), value: value.clone() }, self.durability)
            }
            (InvokeOp::Get | InvokeOp::MGet(_), _) => unreachable!("a read's steps are gets"),
            (_, false) => (Command::QueuePeek { queue: queue() }, None),
            (InvokeOp::Dequeue, true) => (Command::Dequeue { queue: queue() }, self.durability),
            (InvokeOp::Enqueue(value), true) => {
                (Command::Enqueue { queue: queue(), value: value.clone() }, self.durability)
            }
        }
    }
}

/// `KEEL.INVOKE`'s usage, the reply to words it cannot read.
const INVOKE_USAGE: &str = "ERR usage: KEEL.INVOKE GET <key> | MGET <numkeys> <key> ... | SET <key> <value> \
                 | DEQUEUE <queue> | ENQUEUE <queue> <value> \
                 [LEVELS <level> ...] [DURABILITY <d>] [REQ <client> <seq>] [NOCONFIRM] [WITHVERSION]";

/// The invocation `KEEL.INVOKE ...` asks for; the error reply.
pub(super) fn parse_invoke(words: &[Bytes], limits: &Limits) -> Result<Invocation, String> {
    let (Some(command), Some(key)) = (words.get(1), words.get(2)) else {
        return Err(INVOKE_USAGE.into());
    };
    let (op, options) = parse_invoke_op(command, key, words, limits)?;
    let key = match &op {
        InvokeOp::MGet(keys) => keys[0].clone(),
        _ => {
            limits.check_key(key).map_err(|e| error_text(&e))?;
            key.clone()
        }
    };
    let mut invocation = Invocation {
        op,
        key,
        levels: Vec::new(),
        confirm: true,
        with_version: false,
        durability: None,
        req: None,
    };
    parse_invoke_options(&mut invocation, &words[options..])?;
    invoke_levels(invocation)
}

/// The operation `KEEL.INVOKE <command> <key> ...` names, with its values checked, and
/// where its options begin.
fn parse_invoke_op(
    command: &[u8],
    key: &Bytes,
    words: &[Bytes],
    limits: &Limits,
) -> Result<(InvokeOp, usize), String> {
    let usage = || INVOKE_USAGE.to_string();
    if command.eq_ignore_ascii_case(b"get") {
        Ok((InvokeOp::Get, 3))
    } else if command.eq_ignore_ascii_case(b"mget") {
        let count = parse_u64(key)
            .filter(|n| (1..=keel_types::MULTI_OPS_MAX as u64).contains(n))
            .ok_or_else(|| {
            format!("ERR KEEL.INVOKE MGET takes 1 to {} keys", keel_types::MULTI_OPS_MAX)
        })?;
        let keys = words.get(3..3 + count as usize).ok_or_else(usage)?;
        for key in keys {
            limits.check_key(key).map_err(|e| error_text(&e))?;
        }
        Ok((InvokeOp::MGet(keys.to_vec()), 3 + count as usize))
    } else if command.eq_ignore_ascii_case(b"set") {
        let value = words.get(3).ok_or_else(usage)?;
        limits.check_value(value).map_err(|e| error_text(&e))?;
        Ok((InvokeOp::Set(value.clone()), 4))
    } else if command.eq_ignore_ascii_case(b"dequeue") {
        Ok((InvokeOp::Dequeue, 3))
    } else if command.eq_ignore_ascii_case(b"enqueue") {
        let value = words.get(3).ok_or_else(usage)?;
        limits.check_value(value).map_err(|e| error_text(&e))?;
        Ok((InvokeOp::Enqueue(value.clone()), 4))
    } else {
        Err("ERR KEEL.INVOKE supports GET, MGET, SET, DEQUEUE and ENQUEUE".into())
    }
}

/// `[LEVELS <level> ...] [DURABILITY <d>] [REQ <client> <seq>] [NOCONFIRM]
/// [WITHVERSION]`, in any order, into `invocation`.
fn parse_invoke_options(invocation: &mut Invocation, options: &[Bytes]) -> Result<(), String> {
    let usage = || INVOKE_USAGE.to_string();
    let mut in_levels = false;
    let mut words = options.iter();
    while let Some(word) = words.next() {
        let text = std::str::from_utf8(word).map_err(|_| usage())?;
        match text.to_ascii_lowercase().as_str() {
            "levels" => in_levels = true,
            "noconfirm" => (invocation.confirm, in_levels) = (false, false),
            "withversion" => (invocation.with_version, in_levels) = (true, false),
            "durability" if !invocation.op.is_read() => {
                in_levels = false;
                let word = words.next().ok_or_else(usage)?;
                let name = std::str::from_utf8(word).map_err(|_| usage())?;
                let durability = name.parse::<Durability>().map_err(|e| format!("ERR {e}"))?;
                invocation.durability = Some(durability);
            }
            "req" if !invocation.op.is_read() => {
                in_levels = false;
                let mut number = || words.next().and_then(|w| parse_u64(w));
                let Some(pair) = req_numbers(number(), number()) else {
                    return Err(
                        "ERR KEEL.INVOKE REQ client and seq must be positive integers".into()
                    );
                };
                invocation.req = Some(pair);
            }
            name if in_levels => {
                let level = name.parse::<ReadLevel>().map_err(|e| format!("ERR {e}"))?;
                invocation.levels.push(level);
            }
            _ => return Err(usage()),
        }
    }
    Ok(())
}

/// The invocation with its levels checked against its operation, defaulted when none
/// was given, sorted weakest first and without repeats.
fn invoke_levels(mut invocation: Invocation) -> Result<Invocation, String> {
    // A queue operation's write is sent with its views' reads: a read that waits (for a
    // durability round, or the leader) could see the operation's own effect. Its views
    // are the local replica's, as the paper's peek at the closest replica.
    let queue = matches!(invocation.op, InvokeOp::Dequeue | InvokeOp::Enqueue(_));
    if queue && invocation.levels.iter().any(|l| *l != ReadLevel::Any) {
        return Err("ERR a queue operation's preliminary views are read at level any".into());
    }
    if matches!(invocation.op, InvokeOp::Set(_)) && !invocation.levels.is_empty() {
        return Err("ERR a write answers with one final view: no LEVELS".into());
    }
    if invocation.levels.is_empty() {
        invocation.levels = match invocation.op {
            InvokeOp::Get | InvokeOp::MGet(_) => ReadLevel::ALL.to_vec(),
            InvokeOp::Set(_) => Vec::new(),
            InvokeOp::Dequeue | InvokeOp::Enqueue(_) => vec![ReadLevel::Any],
        };
    }
    invocation.levels.sort();
    invocation.levels.dedup();
    Ok(invocation)
}

#[cfg(test)]
mod tests {
    use super::{parse_invoke, InvokeOp};
    use bytes::Bytes;
    use keel_types::{Durability, Limits, ReadLevel};

    #[test]
    fn invocations_parse_with_levels_sorted_and_options_anywhere() {
        let parse = |ws: &[&str]| {
            let words: Vec<Bytes> = ws.iter().map(|w| Bytes::from(w.to_string())).collect();
            parse_invoke(&words, &Limits::default())
        };
        let all = parse(&["KEEL.INVOKE", "get", "k"]).unwrap();
        assert_eq!(
            (all.levels, all.confirm, all.with_version),
            (ReadLevel::ALL.to_vec(), true, false)
        );
        let some = parse(&[
            "KEEL.INVOKE",
            "GET",
            "k",
            "LEVELS",
            "linearizable",
            "any",
            "any",
            "NOCONFIRM",
        ]);
        let some = some.unwrap();
        assert_eq!(some.levels, [ReadLevel::Any, ReadLevel::Linearizable]);
        assert!(!some.confirm);
        let late =
            parse(&["KEEL.INVOKE", "GET", "k", "WITHVERSION", "LEVELS", "monotonic"]).unwrap();
        assert_eq!((late.levels, late.with_version), (vec![ReadLevel::Monotonic], true));
        assert!(parse(&["KEEL.INVOKE", "GET"]).is_err());
        assert!(parse(&["KEEL.INVOKE", "DEL", "k"]).is_err());
        let set = parse(&["KEEL.INVOKE", "SET", "k", "v", "DURABILITY", "durable"]).unwrap();
        assert_eq!((set.levels.len(), set.durability), (0, Some(Durability::Durable)));
        assert!(parse(&["KEEL.INVOKE", "SET", "k", "v", "LEVELS", "any"]).is_err());
        let mget = parse(&["KEEL.INVOKE", "MGET", "2", "levels", "b", "LEVELS", "any"]).unwrap();
        let keys = vec![Bytes::from("levels"), Bytes::from("b")];
        assert_eq!((mget.op, mget.levels), (InvokeOp::MGet(keys), vec![ReadLevel::Any]));
        assert!(parse(&["KEEL.INVOKE", "MGET", "3", "a", "b"]).is_err(), "fewer keys than said");
        assert!(parse(&["KEEL.INVOKE", "MGET", "0"]).is_err());
        assert!(parse(&["KEEL.INVOKE", "DEQUEUE", "q", "LEVELS", "monotonic"]).is_err());
        assert!(parse(&["KEEL.INVOKE", "GET", "k", "DURABILITY", "durable"]).is_err());
        assert!(parse(&["KEEL.INVOKE", "GET", "k", "any"]).is_err(), "a level without LEVELS");
        assert!(parse(&["KEEL.INVOKE", "GET", "k", "LEVELS", "strong"]).is_err());
        let long = "k".repeat(Limits::default().key_bytes_max as usize + 1);
        assert!(parse(&["KEEL.INVOKE", "GET", &long]).is_err());
    }
}
