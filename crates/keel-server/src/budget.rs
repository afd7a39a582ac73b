//! Node-wide byte budgets for what clients make a node hold: the request buffers of
//! large requests (`client_request_buffers_bytes_max`, in `front_door::connection`) and
//! the values of replies another node served, held until their client reads them
//! (`forwarded_replies_bytes_max`, in `driver`). Whatever would go past a budget is
//! refused (an error to that client) instead of allocated.

use bytes::Bytes;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Bytes that may be taken and given back, never more than the budget in all.
#[derive(Debug)]
pub struct ByteBudget {
    free: AtomicUsize,
}

impl ByteBudget {
    /// A budget of `bytes`.
    pub fn new(bytes: usize) -> ByteBudget {
        ByteBudget { free: AtomicUsize::new(bytes) }
    }

    /// Takes `bytes` if that many are free.
    pub fn take(&self, bytes: usize) -> bool {
        self.free
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |free| free.checked_sub(bytes))
            .is_ok()
    }

    /// Gives back `bytes` taken before.
    pub fn give(&self, bytes: usize) {
        self.free.fetch_add(bytes, Ordering::AcqRel);
    }

    /// Bytes free now.
    pub fn free(&self) -> usize {
        self.free.load(Ordering::Acquire)
    }
}

/// A value's bytes charged to a budget until the last reference to them drops.
struct Charged {
    value: Bytes,
    budget: Arc<ByteBudget>,
}

impl AsRef<[u8]> for Charged {
    fn as_ref(&self) -> &[u8] {
        &self.value
    }
}

impl Drop for Charged {
    fn drop(&mut self) {
        self.budget.give(self.value.len());
    }
}

/// `value`, its length taken from `budget` until every clone of the result is dropped
/// (the reply written to its client, or the connection gone); `None` when the budget
/// cannot cover it.
pub fn charge(budget: &Arc<ByteBudget>, value: &Bytes) -> Option<Bytes> {
    if !budget.take(value.len()) {
        return None;
    }
    Some(Bytes::from_owner(Charged { value: value.clone(), budget: budget.clone() }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_charged_value_holds_its_bytes_until_its_last_clone_drops() {
        let budget = Arc::new(ByteBudget::new(100));
        let value = Bytes::from(vec![7u8; 60]);
        let held = charge(&budget, &value).expect("60 of 100 free");
        assert_eq!(held, value);
        assert_eq!(budget.free(), 40);
        assert!(charge(&budget, &value).is_none(), "60 more do not fit");
        assert_eq!(budget.free(), 40, "a refusal takes nothing");
        let clone = held.slice(10..20);
        drop(held);
        assert_eq!(budget.free(), 40, "a slice still holds the value");
        drop(clone);
        assert_eq!(budget.free(), 100);
    }
}
