//! The handshake slots of the peer port, and the log of what it refuses. Pure: time is
//! passed in; `peer`'s listener does the I/O.
//!
//! An inbound connection goes through two kinds of slot before it is a member's link:
//!
//! ```text
//!  accepted ──► Pool (shared, pending_max, HELLO_TIMEOUT) ──hello verifies──► member's slot
//!                 │ the oldest evicted when a new one arrives       (one per member; a newer
//!                 │ into a full pool; closed at its deadline         verified hello displaces
//!                 ▼                                                  it) ──proof──► link
//!               closed                                               (OnePerMember again)
//! ```
//!
//! The pool holds what has proved nothing yet. It never refuses a newcomer (it evicts the
//! oldest instead), so a flood cannot keep a member's fresh connection out; and the
//! listener reads every pooled connection as soon as it is readable and once more just
//! before evicting it, so a member's hello (sent right after its connect) is read before
//! its connection can be evicted. A hello that verifies moves its connection out of the
//! pool into the slot of the member it proved to be, which no connection without that
//! member's hello can take.

use crate::metrics::LinkClosed;
use keel_types::NodeId;
use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::time::Instant;

/// How long a connection may stay in the pool without a verified hello (at most the
/// handshake timeout). A member sends its hello right after its connect: it is there
/// within a round trip.
pub const HELLO_TIMEOUT: Duration = Duration::from_millis(500);
/// At most one summary of refused peer connections per this interval.
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// The connections that have not yet sent a verified hello: at most `len_max`, oldest
/// first. Arrivals come in time order, so the oldest is also the first due.
#[derive(Debug)]
pub struct Pool<T> {
    entries: VecDeque<(Instant, T)>,
    len_max: usize,
    timeout: Duration,
}

impl<T> Pool<T> {
    /// A pool of at most `len_max` connections, each held at most `timeout`.
    pub fn new(len_max: usize, timeout: Duration) -> Pool<T> {
        assert!(len_max >= 1, "the pool holds at least one connection");
        Pool { entries: VecDeque::with_capacity(len_max), len_max, timeout }
    }

    /// Takes in `item`, arrived `now`. When the pool was full, the oldest entry leaves to
    /// make room and is given back: the caller gives it a last read, then closes it.
    pub fn admit(&mut self, now: Instant, item: T) -> Option<T> {
        assert!(self.entries.back().is_none_or(|(at, _)| *at <= now), "arrivals in order");
        let evicted = match self.entries.len() < self.len_max {
            true => None,
            false => self.entries.pop_front().map(|(_, item)| item),
        };
        self.entries.push_back((now, item));
        assert!(self.entries.len() <= self.len_max);
        evicted
    }

    /// When the oldest entry's time is up, if the pool holds any.
    pub fn deadline(&self) -> Option<Instant> {
        self.entries.front().map(|(at, _)| *at + self.timeout)
    }

    /// The oldest entry, if its time is up at `now`.
    pub fn expire(&mut self, now: Instant) -> Option<T> {
        let due = self.deadline().is_some_and(|deadline| deadline <= now);
        due.then(|| self.entries.pop_front().expect("a deadline has an entry").1)
    }

    /// Entry `index` (0 is the oldest), taken out of the pool.
    pub fn take(&mut self, index: usize) -> T {
        self.entries.remove(index).expect("an index of the pool").1
    }

    /// Entry `index` (0 is the oldest).
    pub fn get_mut(&mut self, index: usize) -> &mut T {
        &mut self.entries[index].1
    }

    /// Every entry, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.entries.iter().map(|(_, item)| item)
    }

    /// How many connections the pool holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the pool holds none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// One connection per member, each known by a connection id: a newer one displaces the
/// older. Used for the handshakes still under way (a member that redials has given up on
/// its older connection; a copied hello cannot hold the slot against the member's next)
/// and for the authenticated links.
#[derive(Debug)]
pub struct OnePerMember<H> {
    by_member: BTreeMap<NodeId, (u64, H)>,
}

impl<H> Default for OnePerMember<H> {
    fn default() -> Self {
        OnePerMember { by_member: BTreeMap::new() }
    }
}

impl<H> OnePerMember<H> {
    /// Makes connection `id` (`handle`) member `member`'s; gives back the one it displaces.
    pub fn put(&mut self, member: NodeId, id: u64, handle: H) -> Option<H> {
        let displaced = self.by_member.insert(member, (id, handle));
        assert!(displaced.as_ref().is_none_or(|(old, _)| *old != id), "ids are not reused");
        displaced.map(|(_, handle)| handle)
    }

    /// Forgets connection `id` of `member` if it is still the member's; whether it was.
    pub fn forget(&mut self, member: NodeId, id: u64) -> bool {
        let current = self.by_member.get(&member).is_some_and(|(held, _)| *held == id);
        if current {
            self.by_member.remove(&member);
        }
        current
    }

    /// How many members hold a slot.
    pub fn len(&self) -> usize {
        self.by_member.len()
    }

    /// Whether no member holds a slot.
    pub fn is_empty(&self) -> bool {
        self.by_member.is_empty()
    }
}

/// Refused peer connections, counted by reason between two summaries: a flood is logged
/// as at most one line per [`REFUSAL_LOG_INTERVAL`], and a lone refusal at once.
#[derive(Debug, Default)]
pub struct RefusalLog {
    held: [u64; LinkClosed::ALL.len()],
    last_from: Option<SocketAddr>,
    written_at: Option<Instant>,
}

impl RefusalLog {
    /// Counts a connection from `from` refused for `why`; the summary to write now, if
    /// the last was written at least an interval ago.
    pub fn note(&mut self, why: LinkClosed, from: SocketAddr, now: Instant) -> Option<Refusals> {
        self.held[why as usize] += 1;
        self.last_from = Some(from);
        self.flush(now)
    }

    /// The summary of what is held, if any is and the last was written at least an
    /// interval before `now`; the counts start again from zero.
    pub fn flush(&mut self, now: Instant) -> Option<Refusals> {
        let held: u64 = self.held.iter().sum();
        let due = self.written_at.is_none_or(|at| now >= at + REFUSAL_LOG_INTERVAL);
        if held == 0 || !due {
            return None;
        }
        let by_reason = LinkClosed::ALL
            .iter()
            .filter(|why| self.held[**why as usize] > 0)
            .map(|why| (*why, self.held[*why as usize]))
            .collect();
        let since = self.written_at.map(|at| now - at);
        self.held = [0; LinkClosed::ALL.len()];
        self.written_at = Some(now);
        let last_from = self.last_from.take().expect("a refusal names its address");
        Some(Refusals { count: held, by_reason, last_from, since })
    }
}

/// One summary line of refused peer connections.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusals {
    /// How many, all reasons together.
    pub count: u64,
    /// How many for each reason, in [`LinkClosed::ALL`]'s order.
    pub by_reason: Vec<(LinkClosed, u64)>,
    /// Where the last one came from.
    pub last_from: SocketAddr,
    /// The time since the previous summary (`None` for the first).
    pub since: Option<Duration>,
}

impl std::fmt::Display for Refusals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} peer connection(s) refused", self.count)?;
        if let Some(since) = self.since {
            write!(f, " in {:.1} s", since.as_secs_f64())?;
        }
        let reasons: Vec<String> =
            self.by_reason.iter().map(|(why, n)| format!("{}: {n}", why.as_str())).collect();
        write!(f, " ({}), the last from {}", reasons.join(", "), self.last_from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn a_full_pool_evicts_its_oldest_and_never_refuses_a_newcomer() {
        let base = Instant::now();
        let mut pool = Pool::new(3, MS(500));
        assert_eq!(pool.deadline(), None);
        for (i, name) in ["a", "b", "c"].into_iter().enumerate() {
            assert_eq!(pool.admit(base + MS(i as u64), name), None);
        }
        assert_eq!(pool.admit(base + MS(3), "d"), Some("a"), "the oldest leaves");
        assert_eq!(pool.admit(base + MS(3), "e"), Some("b"));
        assert_eq!(pool.iter().copied().collect::<Vec<_>>(), ["c", "d", "e"]);
        assert_eq!(pool.len(), 3, "bounded");
        // One that verified or failed leaves from the middle; the next newcomer then
        // takes its place without evicting anyone.
        assert_eq!(pool.take(1), "d");
        assert_eq!(pool.admit(base + MS(4), "f"), None);
        assert_eq!(*pool.get_mut(0), "c");
        assert_eq!(pool.iter().copied().collect::<Vec<_>>(), ["c", "e", "f"]);
    }

    #[test]
    fn pooled_connections_leave_at_their_deadline_oldest_first() {
        let base = Instant::now();
        let mut pool = Pool::new(4, MS(500));
        pool.admit(base, 1);
        pool.admit(base + MS(100), 2);
        assert_eq!(pool.deadline(), Some(base + MS(500)));
        assert_eq!(pool.expire(base + MS(499)), None, "not before its deadline");
        assert_eq!(pool.expire(base + MS(500)), Some(1));
        assert_eq!(pool.expire(base + MS(500)), None, "the next is due later");
        assert_eq!(pool.deadline(), Some(base + MS(600)));
        assert_eq!(pool.expire(base + MS(10_000)), Some(2));
        assert!(pool.is_empty());
        assert_eq!(pool.deadline(), None);
    }

    #[test]
    fn a_members_newer_connection_displaces_its_older_and_only_its_own() {
        let mut slots = OnePerMember::default();
        assert_eq!(slots.put(NodeId(2), 1, "2's first"), None);
        assert_eq!(slots.put(NodeId(3), 2, "3's first"), None);
        assert_eq!(slots.put(NodeId(2), 3, "2's second"), Some("2's first"));
        assert_eq!(slots.len(), 2, "one per member");
        // The displaced connection's end does not free the slot its successor holds.
        assert!(!slots.forget(NodeId(2), 1));
        assert_eq!(slots.len(), 2);
        assert!(slots.forget(NodeId(2), 3));
        assert!(slots.forget(NodeId(3), 2));
        assert!(slots.is_empty());
    }

    #[test]
    fn refusals_are_summarised_at_most_once_an_interval() {
        let base = Instant::now();
        let from: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        let mut log = RefusalLog::default();
        // The first is written at once.
        let first = log.note(LinkClosed::TooManyPending, from, base).expect("written at once");
        assert_eq!(first.count, 1);
        assert_eq!(first.since, None);
        // A flood within the interval is held...
        for i in 0..1000 {
            let why = if i % 10 == 0 { LinkClosed::BadProof } else { LinkClosed::TooManyPending };
            assert_eq!(log.note(why, from, base + MS(1 + i / 2)), None);
        }
        assert_eq!(log.flush(base + MS(999)), None, "not before the interval");
        // ...and written as one line after it.
        let summary = log.flush(base + MS(1000)).expect("due");
        assert_eq!(summary.count, 1000);
        let expected = vec![(LinkClosed::BadProof, 100), (LinkClosed::TooManyPending, 900)];
        assert_eq!(summary.by_reason, expected);
        assert_eq!(
            summary.to_string(),
            "1000 peer connection(s) refused in 1.0 s (bad proof: 100, too many pending: 900), \
             the last from 127.0.0.1:4000"
        );
        assert_eq!(log.flush(base + MS(5000)), None, "nothing held");
        let late = log.note(LinkClosed::HandshakeTimeout, from, base + MS(5000));
        assert_eq!(late.map(|r| r.count), Some(1), "a lone one after a quiet interval: at once");
    }
}
