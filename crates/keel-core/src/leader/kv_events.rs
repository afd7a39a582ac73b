//! Keyspace events (Redis's keyspace notifications): what each applied write did to each
//! key, named as Redis names it, recorded only while the host asks for them
//! ([`Kv::record_events`]) and taken after every step into `Outputs::events`.
//!
//! Events are derived from the changes a command made (its undo record), not written by
//! each command: a command that changed nothing (`SADD` of members already there, `SREM`
//! of members that are not) records nothing, as Redis sends nothing. For each key a
//! command changed, in the order of the changes:
//! - `new` (class `n`) if the key was absent or expired before and is live after;
//! - the command's event for that key (its class is the type's: `lpush` is `l`), which
//!   a multi-key command names per key (`LMOVE`: `lpop` on the source, `rpush` on the
//!   destination; `RENAME`: `rename_from`, `rename_to`);
//! - `del` (class `g`) if the key was live before and is not after (a list's last
//!   element popped), unless the command's event already says so (`del`,
//!   `rename_from`).
//!
//! A `STORE` whose result is empty records only the destination's `del`; the leader's
//! expiry entry records `expired` (class `x`) for each key it removes. `FLUSHDB` and
//! `FLUSHALL` record nothing, as in Redis, and neither do the replicated queues' keys.

use super::kv::{Item, Kv, Undo};
use crate::engine::{EventClass, KeyEvent};
use keel_types::coll::{Algebra, CollOp, End, ZBy};
use keel_types::{Command, Key, Modify, Ttl};

impl Kv {
    /// Turns the recording of keyspace events on (kept until taken) or off (dropping
    /// any not taken).
    pub fn record_events(&mut self, on: bool) {
        match (on, self.events.is_some()) {
            (true, false) => self.events = Some(Vec::new()),
            (false, true) => self.events = None,
            _ => {}
        }
    }

    /// Whether keyspace events are recorded.
    pub fn recording_events(&self) -> bool {
        self.events.is_some()
    }

    /// The events recorded since the last call.
    pub fn take_events(&mut self) -> Vec<KeyEvent> {
        self.events.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// How many events are recorded and not yet taken (a transaction drops those of its
    /// commands when a later one fails).
    pub(super) fn events_len(&self) -> usize {
        self.events.as_ref().map_or(0, Vec::len)
    }

    /// Drops the events recorded after the first `len`.
    pub(super) fn truncate_events(&mut self, len: usize) {
        if let Some(events) = self.events.as_mut() {
            events.truncate(len);
        }
    }

    /// Records the events of `command`, which made the changes `undo` holds from `from`
    /// on. Costs nothing unless recording.
    pub(super) fn note_command(&mut self, command: &Command, undo: &Undo, from: usize) {
        let silent = matches!(
            command,
            Command::Flush { .. }
                | Command::SwapDb { .. }
                | Command::Enqueue { .. }
                | Command::Dequeue { .. }
        );
        if self.events.is_none() || silent {
            return;
        }
        let mut noted = Vec::new();
        for (key, previous) in undo.changes_from(from) {
            let was = previous.as_ref().is_some_and(Item::live);
            let is = self.item(key).is_some_and(Item::live);
            if keel_types::db_of(key).is_none() {
                continue; // a replicated queue's key
            }
            if is && !was {
                noted.push(event(EventClass::New, "new", key));
            }
            let named = if !is && stores(command) { None } else { event_of(command, key) };
            if let Some((class, name)) = named {
                noted.push(event(class, name, key));
            }
            if is && sets_expiry(command) {
                noted.push(event(EventClass::Generic, "expire", key));
            }
            let said_del = named.is_some_and(|(_, name)| matches!(name, "del" | "rename_from"));
            if was && !is && !said_del {
                noted.push(event(EventClass::Generic, "del", key));
            }
        }
        self.events.as_mut().expect("recording").extend(noted);
    }

    /// Records `expired` for a key the leader's expiry entry removed.
    pub(super) fn note_expired(&mut self, key: &Key) {
        if let Some(events) = self.events.as_mut() {
            events.push(event(EventClass::Expired, "expired", key));
        }
    }
}

fn event(class: EventClass, event: &'static str, key: &Key) -> KeyEvent {
    KeyEvent { class, event, key: key.clone() }
}

/// Whether `command` is a `SET` with an expiry (`EX`, `PX`, ...): Redis says `expire`
/// after `set`.
fn sets_expiry(command: &Command) -> bool {
    matches!(command, Command::Set { ttl: Ttl::After(_) | Ttl::At(_), .. })
}

/// Whether `command` replaces its destination by a computed result (an empty one deletes
/// it, with only `del` to say so).
fn stores(command: &Command) -> bool {
    let Command::Coll { op, .. } = command else { return false };
    matches!(
        **op,
        CollOp::SStore { .. }
            | CollOp::ZStore { .. }
            | CollOp::ZRangeStore { .. }
            | CollOp::SortStore { .. }
    )
}

/// The event `command` names for a change of `key`, and its class.
fn event_of(command: &Command, key: &Key) -> Option<(EventClass, &'static str)> {
    use EventClass::{Generic, String};
    Some(match command {
        Command::Put { .. } | Command::Set { .. } | Command::Cas { .. } => (String, "set"),
        Command::Incr { .. } => (String, "incrby"),
        Command::Delete { .. } => (Generic, "del"),
        Command::Expire { ttl: Ttl::Clear, .. } => (Generic, "persist"),
        Command::Expire { .. } => (Generic, "expire"),
        Command::Modify { op, .. } => match op {
            Modify::Append(_) => (String, "append"),
            Modify::SetRange { .. } => (String, "setrange"),
            Modify::SetBit { .. } => (String, "setbit"),
            Modify::IncrByFloat(_) => (String, "incrbyfloat"),
            Modify::GetDel => (Generic, "del"),
            Modify::GetEx(Ttl::Clear) => (Generic, "persist"),
            Modify::GetEx(_) => (Generic, "expire"),
        },
        Command::Transfer { from, remove_source, .. } => match (key == from, remove_source) {
            (true, _) => (Generic, "rename_from"),
            (false, true) => (Generic, "rename_to"),
            (false, false) => (Generic, "copy_to"),
        },
        Command::Coll { key: first, op } => return coll_event(op, key == first),
        _ => return None,
    })
}

/// The event of collection write `op` for its command's key (`first`) or another.
fn coll_event(op: &CollOp, first: bool) -> Option<(EventClass, &'static str)> {
    use EventClass::{Hash, List, Set, ZSet};
    let end = |end: &End, front: &'static str, back: &'static str| match end {
        End::Front => front,
        End::Back => back,
    };
    Some(match op {
        CollOp::HSet { .. } => (Hash, "hset"),
        CollOp::HDel { .. } => (Hash, "hdel"),
        CollOp::HIncrBy { .. } => (Hash, "hincrby"),
        CollOp::HIncrByFloat { .. } => (Hash, "hincrbyfloat"),
        CollOp::Push { end: e, .. } => (List, end(e, "lpush", "rpush")),
        CollOp::Pop { end: e, .. } => (List, end(e, "lpop", "rpop")),
        CollOp::LSet { .. } => (List, "lset"),
        CollOp::LInsert { .. } => (List, "linsert"),
        CollOp::LRem { .. } => (List, "lrem"),
        CollOp::LTrim { .. } => (List, "ltrim"),
        CollOp::LMove { from, .. } if first => (List, end(from, "lpop", "rpop")),
        CollOp::LMove { to_end, .. } => (List, end(to_end, "lpush", "rpush")),
        CollOp::SAdd { .. } => (Set, "sadd"),
        CollOp::SortStore { .. } => (List, "sortstore"),
        CollOp::SRem { .. } => (Set, "srem"),
        CollOp::SPop { .. } => (Set, "spop"),
        CollOp::SMove { .. } if first => (Set, "srem"),
        CollOp::SMove { .. } => (Set, "sadd"),
        CollOp::ZAdd { flags, .. } if flags.incr => (ZSet, "zincr"),
        CollOp::ZAdd { .. } => (ZSet, "zadd"),
        CollOp::ZRem { .. } => (ZSet, "zrem"),
        CollOp::ZPop { max, .. } => (ZSet, if *max { "zpopmax" } else { "zpopmin" }),
        CollOp::ZRemRange { by } => (
            ZSet,
            match by {
                ZBy::Rank(..) => "zremrangebyrank",
                ZBy::Score(..) => "zremrangebyscore",
                ZBy::Lex(..) => "zremrangebylex",
            },
        ),
        CollOp::SStore { how, .. } => (
            Set,
            match how {
                Algebra::Union => "sunionstore",
                Algebra::Inter => "sinterstore",
                Algebra::Diff => "sdiffstore",
            },
        ),
        CollOp::ZStore { combine, .. } => (
            ZSet,
            match combine.how {
                Algebra::Union => "zunionstore",
                Algebra::Inter => "zinterstore",
                Algebra::Diff => "zdiffstore",
            },
        ),
        CollOp::ZRangeStore { .. } => (ZSet, "zrangestore"),
        CollOp::MPop { end: e, zset: false, .. } => (List, end(e, "lpop", "rpop")),
        CollOp::MPop { end: e, zset: true, .. } => (ZSet, end(e, "zpopmin", "zpopmax")),
    })
}
