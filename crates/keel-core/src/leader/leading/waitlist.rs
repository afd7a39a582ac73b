//! [`Waitlist`]: requests waiting at the leader, indexed by the log index they wait for
//! and by their deadline, so that a step touches only the requests that became
//! answerable or expired (`O(k log n)` for `k` of them out of `n` waiting), never every
//! request waiting.

use crate::time::Time;
use keel_types::LogIndex;
use std::collections::{BTreeMap, BTreeSet};

/// Items waiting for an index to be reached, each with a deadline.
#[derive(Clone, Debug)]
pub(crate) struct Waitlist<T> {
    /// Arrival order: an item's key in the two indexes.
    next: u64,
    items: BTreeMap<u64, (LogIndex, Time, T)>,
    by_index: BTreeSet<(LogIndex, u64)>,
    by_deadline: BTreeSet<(Time, u64)>,
}

impl<T> Default for Waitlist<T> {
    fn default() -> Self {
        Waitlist {
            next: 0,
            items: BTreeMap::new(),
            by_index: BTreeSet::new(),
            by_deadline: BTreeSet::new(),
        }
    }
}

impl<T> Waitlist<T> {
    /// Adds `item`, waiting for `index`, to be given up at `deadline`.
    pub fn push(&mut self, index: LogIndex, deadline: Time, item: T) {
        let key = self.next;
        self.next += 1;
        self.items.insert(key, (index, deadline, item));
        self.by_index.insert((index, key));
        self.by_deadline.insert((deadline, key));
    }

    fn take(&mut self, key: u64) -> (LogIndex, Time, T) {
        let (index, deadline, item) = self.items.remove(&key).expect("indexed items are held");
        self.by_deadline.remove(&(deadline, key));
        self.by_index.remove(&(index, key));
        (index, deadline, item)
    }

    /// Removes and returns every item waiting for an index at most `index` (lowest index
    /// first, then in arrival order), with its deadline.
    pub fn pop_through(&mut self, index: LogIndex) -> Vec<(Time, T)> {
        let mut out = Vec::new();
        while let Some(&(at, key)) = self.by_index.first() {
            if at > index {
                break;
            }
            let (_, deadline, item) = self.take(key);
            out.push((deadline, item));
        }
        out
    }

    /// Removes and returns every item whose deadline is at or before `now`.
    pub fn pop_expired(&mut self, now: Time) -> Vec<T> {
        let mut out = Vec::new();
        while let Some(&(deadline, key)) = self.by_deadline.first() {
            if deadline > now {
                break;
            }
            out.push(self.take(key).2);
        }
        out
    }

    /// The earliest deadline.
    pub fn deadline_min(&self) -> Option<Time> {
        self.by_deadline.first().map(|(t, _)| *t)
    }

    /// The highest index waited for.
    pub fn index_max(&self) -> Option<LogIndex> {
        self.by_index.last().map(|(i, _)| *i)
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Every item, in arrival order.
    pub fn into_items(self) -> impl Iterator<Item = T> {
        self.items.into_values().map(|(_, _, item)| item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_leave_by_index_then_arrival_and_by_deadline() {
        let mut list = Waitlist::default();
        list.push(LogIndex(5), Time(30), "a");
        list.push(LogIndex(3), Time(10), "b");
        list.push(LogIndex(5), Time(20), "c");
        list.push(LogIndex(9), Time(40), "d");
        assert_eq!(
            (list.len(), list.index_max(), list.deadline_min()),
            (4, Some(LogIndex(9)), Some(Time(10)))
        );
        assert_eq!(list.pop_through(LogIndex(2)), vec![]);
        assert_eq!(
            list.pop_through(LogIndex(5)),
            vec![(Time(10), "b"), (Time(30), "a"), (Time(20), "c")]
        );
        assert_eq!(list.pop_expired(Time(39)), Vec::<&str>::new());
        list.push(LogIndex(1), Time(35), "e");
        assert_eq!(list.pop_expired(Time(40)), vec!["e", "d"]);
        assert_eq!((list.len(), list.index_max(), list.deadline_min()), (0, None, None));
    }
}
