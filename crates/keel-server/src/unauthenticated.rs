//! Client connections not yet authenticated, on a node with users: at most
//! `unauthenticated_connections_max` of them, fewer than `connections_max`, so that slots
//! stay free for clients that have authenticated.
//!
//! Each is registered here when accepted, holding its connection slot, oldest first. One
//! more than the cap closes the oldest: its slot is given back here, at once (before the
//! new connection's task runs), and its task is told to close. So a flood of silent
//! connections cannot lock out an administrator still authenticating: its connection is
//! the newest, and it takes its slot back from here when it authenticates
//! ([`Unauthenticated::authenticated`]).

use crate::metrics::Metrics;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::{Notify, OwnedSemaphorePermit};

/// The registry of unauthenticated connections.
#[derive(Debug)]
pub struct Unauthenticated {
    max: usize,
    waiting: Mutex<Waiting>,
    metrics: Arc<Metrics>,
}

#[derive(Debug, Default)]
struct Waiting {
    /// The next connection's number: numbers grow, so the first entry is the oldest.
    next: u64,
    by_number: BTreeMap<u64, Entry>,
}

#[derive(Debug)]
struct Entry {
    slot: OwnedSemaphorePermit,
    evicted: Arc<Notify>,
}

/// One connection's place in the registry; leaves it when dropped.
#[derive(Debug)]
pub struct Admission {
    number: u64,
    /// Notified when the connection must close to make room for a newer one.
    pub evicted: Arc<Notify>,
    registry: Arc<Unauthenticated>,
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.registry.lock().by_number.remove(&self.number);
    }
}

impl Unauthenticated {
    /// A registry of at most `max` connections (at least one).
    pub fn new(max: usize, metrics: Arc<Metrics>) -> Unauthenticated {
        assert!(max >= 1, "at least one connection may authenticate");
        Unauthenticated { max, waiting: Mutex::default(), metrics }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Waiting> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a new connection holding `slot`, closing the oldest first when the
    /// registry is full.
    pub fn admit(self: &Arc<Self>, slot: OwnedSemaphorePermit) -> Admission {
        let mut waiting = self.lock();
        // Bounded: the registry never holds more than `max`, so one pass is enough.
        while waiting.by_number.len() >= self.max {
            let (_, oldest) = waiting.by_number.pop_first().expect("not empty");
            oldest.evicted.notify_one();
            self.metrics.unauthenticated_evicted.fetch_add(1, Ordering::Relaxed);
            drop(oldest.slot); // free at once, not when its task gets to run
        }
        let number = waiting.next;
        waiting.next += 1;
        let evicted = Arc::new(Notify::new());
        waiting.by_number.insert(number, Entry { slot, evicted: evicted.clone() });
        debug_assert!(waiting.by_number.len() <= self.max);
        Admission { number, evicted, registry: self.clone() }
    }

    /// The slot of a connection that authenticated, taken out of the registry; `None`
    /// if it was closed meanwhile to make room (then it must close).
    pub fn authenticated(&self, admission: Admission) -> Option<OwnedSemaphorePermit> {
        let entry = self.lock().by_number.remove(&admission.number);
        entry.map(|entry| entry.slot)
    }

    /// Connections registered now.
    pub fn len(&self) -> usize {
        self.lock().by_number.len()
    }

    /// Whether none is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::Semaphore;

    #[tokio::test]
    async fn the_oldest_makes_room_and_gives_its_slot_back_at_once() {
        let slots = Arc::new(Semaphore::new(3));
        let registry = Arc::new(Unauthenticated::new(2, Arc::new(Metrics::default())));
        let first = registry.admit(slots.clone().try_acquire_owned().unwrap());
        let second = registry.admit(slots.clone().try_acquire_owned().unwrap());
        let third = registry.admit(slots.clone().try_acquire_owned().unwrap());
        assert_eq!(registry.len(), 2);
        assert_eq!(slots.available_permits(), 1, "the first's slot is free again");
        // The first is told to close; it cannot authenticate any more.
        tokio::time::timeout(std::time::Duration::from_secs(1), first.evicted.notified())
            .await
            .expect("notified");
        assert!(registry.authenticated(first).is_none());
        // The third authenticates: its slot moves to it, out of the registry.
        let slot = registry.authenticated(third).expect("still registered");
        assert_eq!(registry.len(), 1);
        drop(second);
        assert!(registry.is_empty());
        drop(slot);
        assert_eq!(slots.available_permits(), 3);
    }
}
