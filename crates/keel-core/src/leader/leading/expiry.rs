//! Expiry at the leader. Keys leave the state only through the leader's expiry entries
//! ([`EntryPayload::Reap`]), so an expiry is ordered, replicated and made durable as
//! every other write is, and every replica applies the log with the same times:
//! - a command that counts from "now" (`SET ... EX`, `EXPIRE`) gets the leader's wall
//!   clock stamped in before it is appended ([`stamp_time`]);
//! - before a write that touches a key whose time has passed, the leader appends that
//!   key's expiry (lazy expiry: the write sees the key gone, on every replica);
//! - each step, the leader appends the expiry of at most [`REAP_KEYS_MAX`] keys whose
//!   time has passed, earliest first (active expiry), and wakes at the next one's time.
//!
//! A read sees a key until the entry that expires it: what it returns is a state of the
//! log, at whatever level it asks, on whatever replica serves it.

use super::Leading;
use crate::leader::core::Core;
use crate::time::Time;
use keel_types::{Command, Entry, EntryPayload, Key, REAP_KEYS_MAX};

/// `command` with the leader's clock `now_ms` as its time (a transaction's operations
/// each get it): clients send 0, and whatever they send is replaced.
pub fn stamp_time(command: Command, now_ms: u64) -> Command {
    match command {
        Command::Set { key, value, cond, ttl, .. } => {
            Command::Set { key, value, cond, ttl, now_ms }
        }
        Command::Expire { key, ttl, cond, .. } => Command::Expire { key, ttl, cond, now_ms },
        Command::Modify { key, op, .. } => Command::Modify { key, op, now_ms },
        Command::Multi { ops, watch } => {
            let ops = ops.into_iter().map(|op| stamp_time(op, now_ms)).collect();
            Command::Multi { ops, watch }
        }
        Command::Asking(id, inner) => Command::Asking(id, Box::new(stamp_time(*inner, now_ms))),
        other => other,
    }
}

/// `command` as its time-free form: what deduplication compares (a retry is the same
/// command whatever time the leader stamped into its first attempt).
pub(crate) fn timeless(command: &Command) -> Option<Command> {
    match command {
        Command::Set { now_ms: 0, .. }
        | Command::Expire { now_ms: 0, .. }
        | Command::Modify { now_ms: 0, .. } => None,
        Command::Set { .. } | Command::Expire { .. } | Command::Modify { .. } => {
            Some(stamp_time(command.clone(), 0))
        }
        Command::Multi { ops, .. } if ops.iter().any(|op| timeless(op).is_some()) => {
            Some(stamp_time(command.clone(), 0))
        }
        Command::Asking(id, inner) => timeless(inner).map(|t| Command::Asking(*id, Box::new(t))),
        _ => None,
    }
}

/// The keys a write reads or changes (a transaction's operations and watched keys).
fn touched(command: &Command) -> Vec<&Key> {
    match command {
        Command::Multi { ops, watch } => {
            ops.iter().flat_map(touched).chain(watch.iter().map(|(key, _)| key)).collect()
        }
        Command::OpenSession { .. } | Command::Flush { .. } | Command::SwapDb { .. } => Vec::new(),
        Command::Transfer { from, to, .. } => vec![from, to],
        Command::Asking(_, inner) => touched(inner),
        other => vec![other.key()],
    }
}

impl Leading {
    /// Lazy expiry: appends the expiry of every key `command` touches whose time has
    /// passed on this leader's clock, so that the command, right after it, finds them
    /// gone.
    pub(super) fn reap_touched(&mut self, core: &mut Core, command: &Command) {
        let now_ms = core.wall_ms();
        if core.kv.next_expiry().is_none_or(|at| at > now_ms) {
            // No key is due at all (the common case): nothing to look up per key.
            return;
        }
        let mut keys: Vec<Key> = touched(command)
            .into_iter()
            .filter(|key| core.kv.expires_at(key).is_some_and(|at| at <= now_ms))
            .cloned()
            .collect();
        keys.sort();
        keys.dedup();
        for chunk in keys.chunks(REAP_KEYS_MAX) {
            self.append_reap(core, now_ms, chunk.to_vec());
        }
    }

    /// Active expiry: appends the expiry of up to [`REAP_KEYS_MAX`] keys whose time has
    /// passed, earliest first (one entry per step at most: bounded work per step).
    pub(super) fn reap_due(&mut self, core: &mut Core) {
        let now_ms = core.wall_ms();
        if core.kv.next_expiry().is_none_or(|at| at > now_ms) || !core.log_has_room() {
            return;
        }
        let mut keys = core.kv.due_keys(now_ms, REAP_KEYS_MAX);
        keys.sort();
        core.counters.keys_expired += keys.len() as u64;
        self.append_reap(core, now_ms, keys);
    }

    fn append_reap(&mut self, core: &mut Core, now_ms: u64, keys: Vec<Key>) {
        assert!(!keys.is_empty() && keys.len() <= REAP_KEYS_MAX);
        assert!(keys.windows(2).all(|pair| pair[0] < pair[1]), "reaped keys in order");
        let index = core.log.last_index().next();
        let payload = EntryPayload::Reap { now_ms, keys };
        core.append_entry(Entry { epoch: core.hard.epoch, index, payload });
        self.append_due = true;
    }

    /// When the next key's time comes on this node's clock (`None`: no key expires).
    pub fn next_expiry_at(&self, core: &Core) -> Option<Time> {
        let at = core.kv.next_expiry()?;
        let since_origin = at.saturating_sub(core.config.wall_clock_origin_ms);
        Some(Time(since_origin.saturating_mul(1_000_000)).max(core.now))
    }
}
