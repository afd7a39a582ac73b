//! Byte budgets for what clients make a node hold, and the policy that spends them, the
//! same in the server and in the simulator:
//! - [`ByteBudget`]: node-wide, for the request buffers of large requests (the server's
//!   `client_request_buffers_bytes_max`) and for the values of replies another node
//!   served, held until their client reads them (`forwarded_replies_bytes_max`, charged
//!   by [`crate::Replica`]). Whatever would go past a budget is refused (an error to that
//!   client) instead of allocated.
//! - [`LinkAllowance`]: per link, for the client values queued to one peer
//!   ([`keel_wire::peer::PeerMessage::bulk_bytes`]); a message that does not fit is shed
//!   by [`crate::Replica`] (a short refusal goes in its place), so that the messages that
//!   keep the cluster live are never queued behind client values.

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

/// The default bound on the values of forwarded replies a node holds until their clients
/// read them (a server's `forwarded_replies_bytes_max`).
pub const FORWARDED_REPLIES_BYTES_MAX: usize = 256 << 20;

/// Client values a link queues at most (more when one value alone is larger): about
/// 70 ms of a 1 Gbit/s link, so that a heartbeat queued behind them is not late by an
/// election timeout, however many forwarded reads of large values are answered at once.
pub const LINK_BULK_BYTES_MAX: usize = 8 << 20;

/// The bytes of client values queued on one link, at most `max` (more only when one value
/// alone is larger).
#[derive(Clone, Debug)]
pub struct LinkAllowance {
    held: Arc<AtomicUsize>,
    max: usize,
    /// False only under the negative control [`LinkAllowance::unsafe_unbounded`].
    bounded: bool,
}

impl LinkAllowance {
    /// An allowance of `max` bytes.
    pub fn new(max: usize) -> LinkAllowance {
        assert!(max > 0, "a link allowance of nothing would shed every value");
        LinkAllowance { held: Arc::new(AtomicUsize::new(0)), max, bounded: true }
    }

    /// For negative-control tests only: the allowance counts what it holds but refuses
    /// nothing, so a link queues client values without bound. Shows that the simulator's
    /// check of what links hold catches a link past its allowance. Never in a server.
    pub fn unsafe_unbounded(mut self) -> LinkAllowance {
        self.bounded = false;
        self
    }

    /// The allowance, in bytes.
    pub fn max(&self) -> usize {
        self.max
    }

    /// A hold on `bytes`, given back when dropped (with the message it travels with, once
    /// written or lost); `None` when the link already holds its allowance. A value alone
    /// always fits.
    pub fn hold(&self, bytes: usize) -> Option<LinkHold> {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held == 0 || held + bytes <= self.max || !self.bounded).then_some(held + bytes)
            })
            .ok()?;
        Some(LinkHold { bytes, held: self.held.clone() })
    }

    /// Bytes held now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }
}

/// Part of a link's allowance, held by one queued message.
#[derive(Debug)]
pub struct LinkHold {
    bytes: usize,
    held: Arc<AtomicUsize>,
}

impl Drop for LinkHold {
    fn drop(&mut self) {
        self.held.fetch_sub(self.bytes, Ordering::AcqRel);
    }
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

    #[test]
    fn a_link_holds_its_allowance_but_always_one_value() {
        let link = LinkAllowance::new(100);
        let big = link.hold(500).expect("a value alone always fits");
        assert!(link.hold(1).is_none(), "nothing beside a value over the allowance");
        drop(big);
        let (a, b) = (link.hold(60).expect("60"), link.hold(40).expect("40 more fit"));
        assert!(link.hold(1).is_none());
        assert_eq!(link.held(), 100);
        drop((a, b));
        assert_eq!(link.held(), 0, "given back when dropped");
    }
}
