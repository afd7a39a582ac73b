//! The committed read-modify-write outcomes a node keeps, the latest per session, so that
//! a proposer that lost track of its own request (or a client's retry of a request it
//! named, at any node) finds it done rather than doing it again.
//!
//! Bounded in entries and bytes: past either bound, the entry recorded longest ago is
//! dropped. A dropped entry's request is still found done while the value it made is in
//! place (the slot's `made_by`), or when a later request of its session was done (the
//! proposer is then refused, as a late retry whose outcome is unknown); otherwise a retry
//! that comes after more than the bound's worth of other sessions' read-modify-writes
//! can be applied again. Every drop is counted.

use super::{Key, RmwOutcome};
use std::collections::BTreeMap;

/// What one entry costs besides its key and values.
const ENTRY_OVERHEAD: usize = 96;

/// A session: the node (writer id, or `RmwId::CLIENT`) and the session (or client) id.
type SessionKey = (u64, u64);

#[derive(Debug)]
struct Entry {
    key: Key,
    outcome: RmwOutcome,
    /// When it was recorded, in recording order.
    tick: u64,
}

impl Entry {
    fn bytes(&self) -> usize {
        ENTRY_OVERHEAD
            + self.key.len()
            + self.outcome.value.len()
            + self.outcome.read.as_ref().map_or(0, |v| v.len())
    }
}

/// The latest committed outcome of each session, bounded.
#[derive(Debug)]
pub(super) struct Outcomes {
    entries: BTreeMap<SessionKey, Entry>,
    /// Sessions by the tick of their entry, oldest first.
    order: BTreeMap<u64, SessionKey>,
    bytes: usize,
    next_tick: u64,
    entries_max: usize,
    bytes_max: usize,
}

impl Outcomes {
    /// An empty table holding at most `entries_max` entries and `bytes_max` bytes (at
    /// least one entry, whatever its size).
    pub(super) fn new(entries_max: usize, bytes_max: usize) -> Outcomes {
        Outcomes {
            entries: BTreeMap::new(),
            order: BTreeMap::new(),
            bytes: 0,
            next_tick: 0,
            entries_max: entries_max.max(1),
            bytes_max,
        }
    }

    /// How many sessions have an entry.
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The bytes the entries take (roughly).
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The latest outcome recorded for `session`, with its key.
    pub(super) fn get(&self, session: &SessionKey) -> Option<(&Key, &RmwOutcome)> {
        self.entries.get(session).map(|e| (&e.key, &e.outcome))
    }

    /// Sessions from `from` on, in session order (state pages).
    pub(super) fn range(
        &self,
        from: std::ops::Bound<SessionKey>,
    ) -> impl Iterator<Item = (SessionKey, &Key, &RmwOutcome)> {
        self.entries
            .range((from, std::ops::Bound::Unbounded))
            .map(|(&s, e)| (s, &e.key, &e.outcome))
    }

    /// Records `outcome` on `key` for `session` unless a later request of the session is
    /// recorded; answers how many entries were dropped to stay within the bounds.
    pub(super) fn record(&mut self, session: SessionKey, key: &Key, outcome: RmwOutcome) -> u64 {
        if self.entries.get(&session).is_some_and(|e| e.outcome.seq > outcome.seq) {
            return 0;
        }
        if let Some(old) = self.entries.remove(&session) {
            self.order.remove(&old.tick);
            self.bytes -= old.bytes();
        }
        let entry = Entry { key: key.clone(), outcome, tick: self.next_tick };
        self.next_tick += 1;
        self.bytes += entry.bytes();
        self.order.insert(entry.tick, session);
        self.entries.insert(session, entry);
        let mut dropped = 0;
        while self.entries.len() > self.entries_max
            || (self.bytes > self.bytes_max && self.entries.len() > 1)
        {
            let Some((_, oldest)) = self.order.pop_first() else { break };
            if let Some(e) = self.entries.remove(&oldest) {
                self.bytes -= e.bytes();
                dropped += 1;
            }
        }
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kite::Stamp;

    fn outcome(seq: u64, value: &[u8]) -> RmwOutcome {
        RmwOutcome {
            seq,
            read: None,
            read_stamp: Stamp::ZERO,
            value: value.to_vec().into(),
            stamp: Stamp::ZERO,
            digest: 0,
        }
    }

    #[test]
    fn the_latest_request_of_a_session_is_kept() {
        let mut t = Outcomes::new(10, 1 << 20);
        let k: Key = b"k".to_vec().into();
        t.record((1, 1), &k, outcome(5, b"a"));
        t.record((1, 1), &k, outcome(3, b"b"));
        assert_eq!(
            t.get(&(1, 1)).map(|(_, o)| o.seq),
            Some(5),
            "an earlier one does not replace it"
        );
        t.record((1, 1), &k, outcome(7, b"c"));
        assert_eq!(t.get(&(1, 1)).map(|(_, o)| o.seq), Some(7));
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn past_either_bound_the_oldest_entry_goes() {
        let k: Key = b"k".to_vec().into();
        let mut t = Outcomes::new(3, 1 << 20);
        let mut dropped = 0;
        for s in 1..=5 {
            dropped += t.record((1, s), &k, outcome(s, b"v"));
        }
        assert_eq!((t.len(), dropped), (3, 2));
        assert!(t.get(&(1, 1)).is_none() && t.get(&(1, 2)).is_none());
        // Recording a session again makes it the newest.
        t.record((1, 3), &k, outcome(9, b"v"));
        t.record((1, 6), &k, outcome(1, b"v"));
        assert!(t.get(&(1, 3)).is_some() && t.get(&(1, 4)).is_none());

        let mut t = Outcomes::new(1000, 3 * (ENTRY_OVERHEAD + 1 + 100));
        for s in 1..=10 {
            t.record((2, s), &k, outcome(1, &[0; 100]));
        }
        assert_eq!(t.len(), 3, "bytes bound");
        assert!(t.bytes() <= 3 * (ENTRY_OVERHEAD + 1 + 100));
        // One entry larger than the bound is still kept (the newest).
        t.record((2, 11), &k, outcome(1, &[0; 10_000]));
        assert_eq!(t.len(), 1);
        assert!(t.get(&(2, 11)).is_some());
    }
}
