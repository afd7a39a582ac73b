//! `CONFIG GET`, `CONFIG SET` and `CONFIG RESETSTAT`: Redis's run-time settings as far as
//! they mean something on a Keel node.
//!
//! Three kinds of parameter:
//! - **reported**: what Keel's own configuration fixes (`proto-max-bulk-len` is the
//!   largest value, `databases`, `maxmemory-policy noeviction`, ...). `CONFIG GET`
//!   answers them; `CONFIG SET` refuses them, naming the setting of Keel's configuration
//!   file that holds them.
//! - **accepted**: tuning knobs of Redis's own data layout (the
//!   `*-max-listpack-*` encodings, `hz`, ...). Keel has no such layout, so setting one
//!   changes nothing; it is kept per node so that `CONFIG GET` reads back what was set,
//!   as clients and test harnesses expect.
//! - **live**: `notify-keyspace-events`, the node's keyspace notifications
//!   (`crate::pubsub`), and `busy-reply-threshold` (twin `lua-time-limit`), when a
//!   running script makes the node answer `BUSY` (`scripting`), which take effect at
//!   once.
//! - every other name: refused as Redis refuses an unknown parameter.
//!
//! As Redis's, a `CONFIG SET` of several parameters applies all of them or none.

use crate::front_door::conn::Conn;
use bytes::Bytes;
use keel_wire::resp::Frame;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Redis parameters with no meaning for Keel's layout, and their defaults (Redis 7.0's).
const ACCEPTED: &[(&str, &str)] = &[
    ("activerehashing", "yes"),
    ("busy-reply-threshold", "5000"),
    ("hash-max-listpack-entries", "128"),
    ("hash-max-listpack-value", "64"),
    ("hash-max-ziplist-entries", "128"),
    ("hash-max-ziplist-value", "64"),
    ("hz", "10"),
    ("latency-tracking", "yes"),
    ("lazyfree-lazy-eviction", "no"),
    ("lazyfree-lazy-expire", "no"),
    ("lazyfree-lazy-server-del", "no"),
    ("lazyfree-lazy-user-del", "no"),
    ("lazyfree-lazy-user-flush", "no"),
    ("list-compress-depth", "0"),
    ("list-max-listpack-size", "-2"),
    ("list-max-ziplist-size", "-2"),
    ("lua-time-limit", "5000"),
    ("set-max-intset-entries", "512"),
    ("set-max-listpack-entries", "128"),
    ("slowlog-log-slower-than", "10000"),
    ("slowlog-max-len", "128"),
    ("stream-node-max-bytes", "4096"),
    ("stream-node-max-entries", "100"),
    ("zset-max-listpack-entries", "128"),
    ("zset-max-listpack-value", "64"),
    ("zset-max-ziplist-entries", "128"),
    ("zset-max-ziplist-value", "64"),
];

/// The keyspace notifications' parameter.
const NOTIFY: &str = "notify-keyspace-events";

/// The values `CONFIG SET` gave accepted parameters on this node.
static SET: Mutex<BTreeMap<&'static str, Bytes>> = Mutex::new(BTreeMap::new());

/// The parameters Keel's configuration fixes: their value on `conn`'s node and the
/// setting of the configuration file that holds it (`None`: nothing changes it).
fn reported(conn: &Conn) -> Vec<(&'static str, String, Option<&'static str>)> {
    let limits = &conn.limits;
    vec![
        ("appendonly", "yes".into(), None),
        ("databases", super::databases::DATABASES.to_string(), None),
        ("maxmemory", "0".into(), Some("engine.state_bytes_max")),
        ("maxmemory-policy", "noeviction".into(), None),
        ("proto-max-bulk-len", limits.value_bytes_max.to_string(), Some("engine.value_bytes_max")),
        ("save", String::new(), None),
    ]
}

/// `CONFIG GET pattern [pattern ...]`: every parameter a pattern matches, name and value.
pub(crate) fn get(conn: &Conn, patterns: &[Bytes]) -> Frame {
    let set = SET.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut all: BTreeMap<&str, Bytes> =
        reported(conn).into_iter().map(|(name, value, _)| (name, Bytes::from(value))).collect();
    for (name, default) in ACCEPTED {
        let value =
            set.get(name).cloned().unwrap_or_else(|| Bytes::from_static(default.as_bytes()));
        all.insert(name, value);
    }
    all.insert(NOTIFY, Bytes::from(conn.keyspaces.broker.flags().letters()));
    let matched = all
        .into_iter()
        .filter(|(name, _)| {
            patterns
                .iter()
                .any(|p| keel_wire::glob::matches(&p.to_ascii_lowercase(), name.as_bytes()))
        })
        .map(|(name, value)| (Frame::bulk(name), Frame::Bulk(value)))
        .collect();
    Frame::Map(matched)
}

/// `CONFIG SET parameter value [...]`: all of them or, if one is refused, none.
/// An accepted setting's value as a number (its default if unset or not a number).
pub(crate) fn number(name: &str) -> i64 {
    let set = SET.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let default = ACCEPTED.iter().find(|(n, _)| *n == name).map_or("0", |(_, d)| d);
    let value = set.get(name).map(|v| String::from_utf8_lossy(v).into_owned());
    value.and_then(|v| v.parse().ok()).unwrap_or_else(|| default.parse().unwrap_or(0))
}

pub(crate) fn set(conn: &Conn, pairs: Vec<(String, Bytes)>) -> Frame {
    let fixed = reported(conn);
    let mut accepted = Vec::with_capacity(pairs.len());
    let mut notify = None;
    for (name, value) in pairs {
        if name == NOTIFY {
            match crate::pubsub::Flags::parse(&value) {
                Some(flags) => notify = Some(flags),
                None => {
                    return failed(&name, "Invalid event class character. Use 'Ag$lshzxeKEtmd'.")
                }
            }
            continue;
        }
        // A fixed setting set to what it is already (`save ""`) changes nothing.
        if fixed.iter().any(|(n, v, _)| *n == name && v.as_bytes() == &value[..]) {
            continue;
        }
        if let Some((_, _, holder)) = fixed.iter().find(|(n, _, _)| *n == name) {
            let why = match holder {
                Some(setting) => format!("Keel sets it as {setting} in the configuration file"),
                None => "fixed by Keel's design".to_string(),
            };
            return failed(&name, &why);
        }
        let Some((known, _)) = ACCEPTED.iter().find(|(n, _)| *n == name) else {
            let shown: String = name.chars().take(64).collect();
            return Frame::error(&format!(
                "ERR Unknown option or number of arguments for CONFIG SET - '{shown}'"
            ));
        };
        if value.len() > 64 {
            return failed(&name, "value too long");
        }
        accepted.push((*known, value));
    }
    if let Some(flags) = notify {
        conn.keyspaces.broker.set_flags(flags);
    }
    let mut set = SET.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    for (name, value) in accepted {
        // Redis's older `ziplist` names and the newer `listpack` ones are one setting.
        let twin = match name {
            "lua-time-limit" => "busy-reply-threshold".to_string(),
            "busy-reply-threshold" => "lua-time-limit".to_string(),
            _ if name.contains("ziplist") => name.replace("ziplist", "listpack"),
            _ => name.replace("listpack", "ziplist"),
        };
        if let Some((twin, _)) = ACCEPTED.iter().find(|(n, _)| *n == twin && twin != name) {
            set.insert(twin, value.clone());
        }
        set.insert(name, value);
    }
    Frame::ok()
}

fn failed(name: &str, why: &str) -> Frame {
    Frame::error(&format!("ERR CONFIG SET failed (possibly related to argument '{name}') - {why}"))
}

/// `CONFIG RESETSTAT`: `INFO commandstats` of the connection's keyspace counts from now.
pub(crate) fn reset_stat(conn: &Conn) -> Frame {
    for keyspace in conn.keyspaces.iter() {
        keyspace.metrics.reset_stats();
    }
    Frame::ok()
}
