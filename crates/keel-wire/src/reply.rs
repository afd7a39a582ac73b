//! How Keel's errors and results look on a RESP connection.
//!
//! Every [`KeelError`] becomes an error line whose first word is a stable prefix telling
//! the client what to do:
//!
//! | prefix | errors | retry? |
//! |---|---|---|
//! | `BUSY` | a queue or limit is full | yes, after a pause |
//! | `TIMEOUT` | no answer in time; a write's outcome is unknown | yes, if idempotent |
//! | `NOTLEADER` | this node is not the leader (rare: nodes forward) | yes, elsewhere |
//! | `NOTACTIVE` | reserved: no node sends it today | yes, later or elsewhere |
//! | `UNAVAILABLE` | the node accepts no writes (disk full, failed fsync) | yes, elsewhere |
//! | `MOVED` | a sharded cluster's key another keyspace serves: `MOVED slot host:port` | yes, there |
//! | `ASK` | a key of a slot being moved, gone to its new keyspace: `ASK slot host:port` | yes, there, after `ASKING` |
//! | `TRYAGAIN` | keys of a slot being moved, being copied now | yes, after a pause |
//! | `ERR` | anything the same request would hit again | no |
//!
//! [`error_from_line`] reads such a line back (for Keel's own client).

use crate::resp::Frame;
use keel_types::{CommandResult, KeelError, Key, NodeId, Value, Version};

/// The stable first word of the error line for `error`.
pub fn error_prefix(error: &KeelError) -> &'static str {
    match error {
        KeelError::Busy(_) => "BUSY",
        KeelError::Timeout => "TIMEOUT",
        KeelError::NotLeader { .. } => "NOTLEADER",
        KeelError::NotActive => "NOTACTIVE",
        KeelError::Unavailable(_) => "UNAVAILABLE",
        KeelError::SessionExpired => "SESSIONEXPIRED",
        KeelError::Conflict(_) => "CONFLICT",
        KeelError::Moved { .. } => "MOVED",
        KeelError::Ask { .. } => "ASK",
        KeelError::Redirect { .. } | KeelError::TryAgain(_) => "TRYAGAIN",
        KeelError::WrongType => "WRONGTYPE",
        KeelError::KeyTooLarge { .. }
        | KeelError::ValueTooLarge { .. }
        | KeelError::NotAnInteger
        | KeelError::InvalidArgument(_) => "ERR",
    }
}

/// The whole error line for `error`, without the leading `-`.
pub fn error_text(error: &KeelError) -> String {
    let prefix = error_prefix(error);
    let text = match error {
        KeelError::Busy(why) | KeelError::Unavailable(why) | KeelError::Conflict(why) => {
            format!("{prefix} {why}")
        }
        KeelError::NotLeader { leader: Some(leader) } => {
            format!("{prefix} not the leader; the leader is {leader}")
        }
        KeelError::NotLeader { leader: None } => {
            format!("{prefix} not the leader; the leader is unknown")
        }
        other => format!("{prefix} {other}"),
    };
    let fatal = ["ERR", "SESSIONEXPIRED", "WRONGTYPE"].contains(&prefix);
    debug_assert!(text.starts_with(prefix) && fatal != error.is_retryable());
    text
}

/// The error frame for `error`.
pub fn error_frame(error: &KeelError) -> Frame {
    Frame::Error(error_text(error).into_bytes())
}

/// Reads an error line written by [`error_text`] back into a [`KeelError`]. Lines with
/// the `ERR` prefix or an unknown one become [`KeelError::InvalidArgument`] holding the
/// text after the prefix, except the integer error, which keeps its kind.
pub fn error_from_line(line: &[u8]) -> KeelError {
    let line = String::from_utf8_lossy(line);
    let (prefix, rest) = line.split_once(' ').unwrap_or((&line, ""));
    match prefix {
        "BUSY" => KeelError::Busy(rest.to_string()),
        "TIMEOUT" => KeelError::Timeout,
        "NOTACTIVE" => KeelError::NotActive,
        "UNAVAILABLE" => KeelError::Unavailable(rest.to_string()),
        "SESSIONEXPIRED" => KeelError::SessionExpired,
        "WRONGTYPE" => KeelError::WrongType,
        "CONFLICT" => KeelError::Conflict(rest.to_string()),
        "NOTLEADER" => KeelError::NotLeader { leader: leader_in(rest) },
        "MOVED" | "ASK" => {
            match rest.split_once(' ').and_then(|(s, a)| Some((s.parse().ok()?, a))) {
                Some((slot, addr)) if prefix == "ASK" => {
                    KeelError::Ask { slot, addr: addr.to_string() }
                }
                Some((slot, addr)) => KeelError::Moved { slot, addr: addr.to_string() },
                None => KeelError::InvalidArgument(line.to_string()),
            }
        }
        "TRYAGAIN" => KeelError::TryAgain(rest.to_string()),
        _ if rest == KeelError::NotAnInteger.to_string() => KeelError::NotAnInteger,
        // The server words an invalid argument as its display does: the prefix is not
        // kept twice (`invalid argument: invalid argument: ...`).
        "ERR" => KeelError::InvalidArgument(
            rest.strip_prefix("invalid argument: ").unwrap_or(rest).to_string(),
        ),
        // Another code (NOAUTH, WRONGPASS, NOPERM, EXECABORT, ...) says what went wrong:
        // kept with the text.
        _ => KeelError::InvalidArgument(line.to_string()),
    }
}

/// The node named at the end of a `NOTLEADER` line (`... the leader is n2`).
fn leader_in(text: &str) -> Option<NodeId> {
    let word = text.rsplit(' ').next()?;
    word.strip_prefix('n')?.parse().ok().map(NodeId)
}

/// A version as Keel replies with it: the bulk string `epoch.index` (`2.17`).
pub fn version_frame(version: Version) -> Frame {
    Frame::bulk(version.to_string())
}

/// A value as `GET` replies with it: a bulk string (sharing the value's bytes), or null
/// when absent.
pub fn value_frame(value: Option<&Value>) -> Frame {
    match value {
        Some(bytes) => Frame::Bulk(bytes.clone()),
        None => Frame::Null,
    }
}

/// A count or sequence number as a RESP integer (saturating: they never reach 2^63).
fn integer(n: u64) -> Frame {
    Frame::Integer(i64::try_from(n).unwrap_or(i64::MAX))
}

/// A `WITHVERSION` reply: a two-element array of the plain reply and the version
/// (null when the key was never written).
pub fn with_version_frame(reply: Frame, version: Option<Version>) -> Frame {
    let version = version.map_or(Frame::Null, version_frame);
    Frame::Array(vec![reply, version])
}

/// The reply for a command's result:
///
/// | result | reply | with `with_version` |
/// |---|---|---|
/// | value (get) | bulk string or null | `[value, version]` |
/// | written (set, del) | `+OK` | `[OK, version]` |
/// | counter (incr) | integer | `[integer, version]` |
/// | cas | `[swapped (boolean), current value or null, version or null]` | the same |
/// | items (scan) | array of `[key, value, version]` | the same |
/// | multi (exec) | array of each operation's reply, or null when a watched key changed | the same |
/// | enqueued | `[seq, length]` | `[[seq, length], version]` |
/// | dequeued | `[seq, value, remaining]`, or null when the queue was empty | `[reply, version]` |
/// | queue (peek) | `[head seq or null, head value or null, length, next seq]` | `[reply, version or null]` |
/// | geo | [`geo_frame`] | the same |
///
/// Booleans are integers (`1`/`0`) in RESP2, as the encoder writes them.
pub fn result_frame(result: &CommandResult, with_version: bool) -> Frame {
    let (reply, version) = match result {
        CommandResult::Geo(result) => return geo_frame(result),
        CommandResult::Answer { answer, version } => (answer_frame(answer, false), *version),
        CommandResult::Value { value, version } | CommandResult::Held { value, version, .. } => {
            (value_frame(value.as_ref()), *version)
        }
        CommandResult::Written { version } => (Frame::ok(), Some(*version)),
        CommandResult::Image { image, version } => (value_frame(image.as_ref()), *version),
        CommandResult::Count { keys } => (integer(*keys), None),
        CommandResult::Modified { value: Some(value), version, .. } => {
            (Frame::Bulk(value.clone()), *version)
        }
        CommandResult::Modified { value: None, number, version } => {
            (Frame::Integer(*number), *version)
        }
        CommandResult::Counter { value, version } => (Frame::Integer(*value), Some(*version)),
        CommandResult::Enqueued { seq, length, version } => {
            (Frame::Array(vec![integer(*seq), integer(*length)]), Some(*version))
        }
        CommandResult::Dequeued { head, remaining, version } => {
            let reply = match head {
                Some((seq, value)) => Frame::Array(vec![
                    integer(*seq),
                    Frame::Bulk(value.clone()),
                    integer(*remaining),
                ]),
                None => Frame::Null,
            };
            (reply, Some(*version))
        }
        CommandResult::Queue { head, length, next, version } => {
            let (seq, value) = match head {
                Some((seq, value)) => (integer(*seq), Frame::Bulk(value.clone())),
                None => (Frame::Null, Frame::Null),
            };
            (Frame::Array(vec![seq, value, integer(*length), integer(*next)]), *version)
        }
        CommandResult::Cas { swapped, current, version } => {
            let version = version.map_or(Frame::Null, version_frame);
            return Frame::Array(vec![
                Frame::Boolean(*swapped),
                value_frame(current.as_ref()),
                version,
            ]);
        }
        CommandResult::Items { items } => {
            let item = |(key, value, version): &(Key, Value, Version)| {
                Frame::Array(vec![
                    Frame::bulk(key.clone()),
                    Frame::bulk(value.clone()),
                    version_frame(*version),
                ])
            };
            return Frame::Array(items.iter().map(item).collect());
        }
        CommandResult::Multi { results } => {
            return match results {
                Some(results) => Frame::Array(
                    results.iter().map(|result| result_frame(result, with_version)).collect(),
                ),
                None => Frame::NullArray,
            };
        }
    };
    if with_version {
        with_version_frame(reply, version)
    } else {
        reply
    }
}

/// A vector as a reply: its data centers' entries in order, the strong entry last.
pub fn vector_frame(vector: &keel_types::geo::Vector) -> Frame {
    let entry = |t: u64| Frame::Integer(i64::try_from(t).unwrap_or(i64::MAX));
    Frame::Array(vector.flat().into_iter().map(entry).collect())
}

/// The reply for a geo operation's result:
///
/// | result | reply |
/// |---|---|
/// | a register | bulk string, or null when never set |
/// | a counter | integer |
/// | a max register | integer, or null when never raised |
/// | a set (grow-only, add-wins) | array of its elements in byte order |
/// | committed | the session's new past vector ([`vector_frame`]) |
/// | began, aborted, synced | `+OK` |
pub fn geo_frame(result: &keel_types::geo::GeoResult) -> Frame {
    use keel_types::geo::{GeoResult, Object};
    match result {
        GeoResult::Object(Object::Register(value)) => {
            value_frame(value.as_ref().map(|(value, _)| value))
        }
        GeoResult::Object(Object::Counter(n)) => Frame::Integer(*n),
        GeoResult::Object(Object::Max(n)) => n.map_or(Frame::Null, Frame::Integer),
        GeoResult::Object(Object::GSet(set)) => {
            Frame::Array(set.iter().map(|e| Frame::bulk(e.clone())).collect())
        }
        GeoResult::Object(Object::AwSet(set)) => {
            Frame::Array(set.keys().map(|e| Frame::bulk(e.clone())).collect())
        }
        GeoResult::Committed { vector } => vector_frame(vector),
        GeoResult::Began { .. } | GeoResult::Aborted | GeoResult::Synced => Frame::ok(),
    }
}

/// A collection command's answer in the connection's protocol (`resp3`): scores as
/// doubles (RESP2 writes their text as Redis 7.0 does), `HGETALL` as a map, `ZRANGE ...
/// WITHSCORES` as pairs (RESP2: one flat array).
pub fn answer_frame(answer: &keel_types::coll::Answer, resp3: bool) -> Frame {
    use keel_types::coll::{score_text, Answer};
    let pair = |(a, b): &(Answer, Answer)| (answer_frame(a, resp3), answer_frame(b, resp3));
    match answer {
        Answer::Nil => Frame::Null,
        Answer::NilArray => Frame::NullArray,
        Answer::Ok => Frame::ok(),
        Answer::Int(n) => Frame::Integer(*n),
        Answer::Bulk(value) => Frame::Bulk(value.clone()),
        Answer::Status(text) => Frame::Simple(text.clone().into_bytes()),
        Answer::Double(bits) if resp3 => Frame::Double(f64::from_bits(*bits)),
        Answer::Double(bits) => Frame::bulk(score_text(f64::from_bits(*bits))),
        Answer::Array(items) => {
            Frame::Array(items.iter().map(|a| answer_frame(a, resp3)).collect())
        }
        Answer::Set(items) => Frame::Set(items.iter().map(|a| answer_frame(a, resp3)).collect()),
        Answer::Map(pairs) => Frame::Map(pairs.iter().map(pair).collect()),
        Answer::Pairs(pairs) if resp3 => {
            Frame::Array(pairs.iter().map(pair).map(|(a, b)| Frame::Array(vec![a, b])).collect())
        }
        Answer::Pairs(pairs) => {
            Frame::Array(pairs.iter().map(pair).flat_map(|(a, b)| [a, b]).collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_kind_has_its_prefix_and_reads_back() {
        let errors = [
            KeelError::Busy("queue full".into()),
            KeelError::Timeout,
            KeelError::NotLeader { leader: Some(NodeId(2)) },
            KeelError::NotLeader { leader: None },
            KeelError::NotActive,
            KeelError::Unavailable("disk full".into()),
            KeelError::NotAnInteger,
            KeelError::SessionExpired,
            KeelError::Conflict("withdraw 7 was certified first".into()),
            KeelError::InvalidArgument("node 3 leads: transfer its leadership first".into()),
        ];
        for error in errors {
            let text = error_text(&error);
            assert_eq!(error_from_line(text.as_bytes()), error, "{text}");
        }
        assert_eq!(
            error_text(&KeelError::NotAnInteger),
            "ERR value is not an integer or out of range"
        );
        assert_eq!(error_text(&KeelError::Busy("queue full".into())), "BUSY queue full");
    }

    #[test]
    fn fatal_errors_read_back_as_invalid_arguments() {
        let error = KeelError::KeyTooLarge { len: 2000, max: 1024 };
        let text = error_text(&error);
        assert!(text.starts_with("ERR key of 2000 bytes"));
        assert!(!error_from_line(text.as_bytes()).is_retryable());
        // Other codes keep their code, which is what says what went wrong.
        let noauth = error_from_line(b"NOAUTH Authentication required.");
        assert_eq!(noauth, KeelError::InvalidArgument("NOAUTH Authentication required.".into()));
        assert!(!noauth.is_retryable());
    }

    #[test]
    fn results_have_one_reply_shape_each() {
        let version = Version::new(1, 5);
        let written = CommandResult::Written { version };
        assert_eq!(result_frame(&written, false), Frame::ok());
        let expected = Frame::Array(vec![Frame::ok(), Frame::bulk("1.5")]);
        assert_eq!(result_frame(&written, true), expected);
        let cas = CommandResult::Cas { swapped: false, current: None, version: None };
        let expected = Frame::Array(vec![Frame::Boolean(false), Frame::Null, Frame::Null]);
        assert_eq!(result_frame(&cas, true), expected);
        let items = CommandResult::Items {
            items: vec![(b"k".to_vec().into(), b"v".to_vec().into(), version)],
        };
        let row = Frame::Array(vec![Frame::bulk("k"), Frame::bulk("v"), Frame::bulk("1.5")]);
        assert_eq!(result_frame(&items, false), Frame::Array(vec![row]));
    }

    #[test]
    fn versions_are_epoch_dot_index() {
        assert_eq!(version_frame(Version::new(2, 17)), Frame::bulk("2.17"));
        let reply = with_version_frame(value_frame(None), None);
        assert_eq!(reply, Frame::Array(vec![Frame::Null, Frame::Null]));
    }
}
