//! The reliable FIFO channels between replicas (`docs/geo.md`, *Channels*): the protocol
//! assumes that what a replica sends a correct peer arrives once and in order, and the
//! network loses, duplicates and reorders. Each direction numbers its bodies; a message
//! carries a run of them and acknowledges what its sender received; what is not
//! acknowledged is sent again after the retransmission timeout; the receiver delivers
//! bodies in number order, each once, holding a bounded window of early ones.
//!
//! A channel lives as long as its ends' boots: a message names its sender's boot, and a
//! receiver that sees a later boot starts that direction over (the sender lost what it
//! had sent); an earlier boot's message is stale and dropped.

use super::types::{Body, Message};
use crate::time::{Span, Time};
use keel_types::NodeId;
use std::collections::{BTreeMap, VecDeque};

/// Bodies received ahead of the next one expected, at most, per peer.
pub const WINDOW: u64 = 65_536;
/// Bodies sent again in one message, at most.
const RESEND_BATCH: usize = 1_024;
/// A silent peer's resends back off, doubling the timeout up to this many times.
const BACKOFF_DOUBLINGS_MAX: u32 = 5;
/// A notice is sent this many times at most (the last 15 retransmission time-outs after
/// the first, 3 s by default), then again only when its peer is heard
/// ([`Channel::rearm_notice`]): a removed data center that stays down costs nothing.
pub const NOTICE_SENDS_MAX: u32 = 5;

/// One peer's channel, both directions.
#[derive(Debug, Default)]
pub struct Channel {
    /// Number of `unacked[0]`.
    base: u64,
    /// Sent, not yet acknowledged.
    unacked: VecDeque<Body>,
    /// Bodies queued this step, not yet sent.
    fresh: Vec<Body>,
    /// When the oldest unacknowledged body was last sent.
    sent_at: Option<Time>,
    /// Resends since the peer last acknowledged anything (the backoff's exponent).
    resends: u32,
    /// When the peer last acknowledged something new (or the channel began).
    acked_at: Option<Time>,
    /// The peer's boot whose bodies are received.
    peer_boot: u64,
    /// The next body number expected from the peer.
    expected: u64,
    /// Early bodies, by number.
    early: BTreeMap<u64, Body>,
    /// Whether the peer is owed an acknowledgement.
    ack_owed: bool,
    /// A notice channel ([`Channel::notice`]): its sends are bounded, and it holds
    /// nothing but its notice.
    notice: bool,
    /// A notice channel's sends since it was made or rearmed.
    notice_sends: u32,
}

impl Channel {
    /// Bodies sent and not acknowledged.
    pub fn unacked(&self) -> usize {
        self.unacked.len() + self.fresh.len()
    }

    /// The number the next body pushed will carry.
    pub fn next_number(&self) -> u64 {
        self.base + (self.unacked.len() + self.fresh.len()) as u64
    }

    /// The bodies below this number were acknowledged.
    pub fn acked(&self) -> u64 {
        self.base
    }

    /// A channel that tells the peer one last thing, `body`, whatever was sent before:
    /// its sender names a later boot for it (its own plus the removed data center's odd
    /// epoch, `GeoEngine::boot_to`), so the peer starts that direction over, as after a
    /// restart, and delivers `body` first (a removed data center's
    /// members learn they were removed; nothing else is sent to them, and nothing they
    /// send is taken).
    pub fn notice(body: Body) -> Channel {
        Channel { fresh: vec![body], notice: true, ..Channel::default() }
    }

    /// Whether this is a notice channel ([`Channel::notice`]).
    pub fn is_notice(&self) -> bool {
        self.notice
    }

    /// The peer of a notice channel was heard: it is running and may not have taken the
    /// notice, so the notice is due again now, and may be sent [`NOTICE_SENDS_MAX`] times
    /// more. Whether it was a notice channel at rest (its sends spent).
    pub fn rearm_notice(&mut self) -> bool {
        if !self.notice || self.notice_sends < NOTICE_SENDS_MAX {
            return false;
        }
        self.notice_sends = 0;
        self.resends = 0;
        self.sent_at = self.sent_at.map(|_| Time(0));
        true
    }

    /// Queues `body` for the peer.
    pub fn push(&mut self, body: Body) {
        self.fresh.push(body);
    }

    /// Takes `message`'s acknowledgement and bodies; returns the bodies now deliverable,
    /// in order. `my_boot` is the receiver's boot.
    pub fn receive(&mut self, my_boot: u64, now: Time, message: Message) -> Vec<Body> {
        if message.boot < self.peer_boot {
            return Vec::new();
        }
        if message.boot > self.peer_boot {
            if self.peer_boot != 0 {
                // The peer restarted and lost what it had received: this direction
                // starts over too, and what it had not acknowledged is gone with it.
                self.base = 0;
                self.unacked.clear();
                self.sent_at = None;
                self.resends = 0;
            }
            self.peer_boot = message.boot;
            self.expected = 0;
            self.early.clear();
        }
        if self.resends > 0 {
            // The peer speaks again (a cut healed): what waits for it goes at once, with
            // no backoff left to run out, and its refreshes are queued again.
            self.resends = 0;
            self.sent_at = Some(Time(0));
            self.acked_at = Some(now);
        }
        if message.peer_boot == my_boot && message.ack > self.base {
            let acked = (message.ack - self.base).min(self.unacked.len() as u64);
            self.unacked.drain(..acked as usize);
            self.base += acked;
            // The peer is alive: the oldest body left waits a whole timeout again.
            self.sent_at = (!self.unacked.is_empty()).then_some(now);
            self.resends = 0;
            self.acked_at = Some(now);
        }
        let mut out = Vec::new();
        for (i, body) in message.bodies.into_iter().enumerate() {
            let number = message.first + i as u64;
            if number >= self.expected && number < self.expected + WINDOW {
                self.early.entry(number).or_insert(body);
            }
            self.ack_owed = true;
        }
        while let Some(body) = self.early.remove(&self.expected) {
            out.push(body);
            self.expected += 1;
        }
        out
    }

    /// The message to send now, if any: this step's bodies (with an acknowledgement),
    /// everything unacknowledged once `retransmit` has passed since it was last sent, or
    /// an acknowledgement alone when one is owed and `ack_only`. Whether it resent.
    pub fn flush(
        &mut self,
        my_boot: u64,
        now: Time,
        retransmit: Span,
        ack_only: bool,
    ) -> (Option<Message>, bool) {
        let due = self.resend_at(retransmit).is_some_and(|at| now >= at);
        let (first, bodies, resent) = if due {
            self.unacked.extend(self.fresh.drain(..));
            let bodies: Vec<Body> = self.unacked.iter().take(RESEND_BATCH).cloned().collect();
            self.sent_at = Some(now);
            self.resends = (self.resends + 1).min(BACKOFF_DOUBLINGS_MAX);
            self.notice_sends += u32::from(self.notice);
            (self.base, bodies, true)
        } else if !self.fresh.is_empty() {
            let first = self.base + self.unacked.len() as u64;
            let bodies = std::mem::take(&mut self.fresh);
            self.unacked.extend(bodies.iter().cloned());
            self.sent_at.get_or_insert(now);
            self.acked_at.get_or_insert(now);
            self.notice_sends += u32::from(self.notice);
            (first, bodies, false)
        } else if self.ack_owed && ack_only {
            (self.base + self.unacked.len() as u64, Vec::new(), false)
        } else {
            return (None, false);
        };
        self.ack_owed = false;
        let message =
            Message { boot: my_boot, peer_boot: self.peer_boot, ack: self.expected, first, bodies };
        (Some(message), resent)
    }

    /// When the oldest unacknowledged body is next due to be sent again (the timeout
    /// doubles with each resend the peer leaves unanswered).
    pub fn resend_at(&self, retransmit: Span) -> Option<Time> {
        if self.notice && self.notice_sends >= NOTICE_SENDS_MAX {
            return None;
        }
        let timeout = retransmit.0.saturating_mul(1 << self.resends);
        self.sent_at
            .filter(|_| !self.unacked.is_empty())
            .map(|at| Time(at.0.saturating_add(timeout)))
    }

    /// Whether the peer has acknowledged nothing for `after` while bodies wait for it
    /// (it is down or cut off): what only refreshes its view (heartbeats, vectors) is not
    /// queued for it meanwhile, as the next one after it answers carries the news.
    pub fn silent(&self, now: Time, after: Span) -> bool {
        !self.unacked.is_empty()
            && self.acked_at.is_some_and(|at| now.0 >= at.0.saturating_add(after.0))
    }

    /// Checks the channel's own rules.
    pub fn check(&self, peer: NodeId) {
        assert!(
            self.early.keys().all(|&n| n > self.expected && n < self.expected + WINDOW),
            "{peer}: an early body at or below the next expected, or past the window"
        );
        assert!(
            self.sent_at.is_some() || self.unacked.is_empty(),
            "{peer}: bodies unacknowledged that were never sent"
        );
        assert!(
            !self.notice || self.unacked.len() + self.fresh.len() == 1,
            "{peer}: a notice channel holding more than its notice"
        );
        assert!(
            self.notice_sends <= NOTICE_SENDS_MAX && (self.notice || self.notice_sends == 0),
            "{peer}: a notice sent past its bound, or a notice count on another channel"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(n: u64) -> Body {
        Body::Heartbeat { origin: 0, ts: n }
    }

    fn ts(bodies: &[Body]) -> Vec<u64> {
        bodies
            .iter()
            .map(|b| match b {
                Body::Heartbeat { ts, .. } => *ts,
                _ => unreachable!(),
            })
            .collect()
    }

    #[test]
    fn bodies_arrive_once_and_in_order_through_loss_duplication_and_reordering() {
        let (mut a, mut b) = (Channel::default(), Channel::default());
        let retransmit = Span::from_millis(10);
        let mut got = Vec::new();
        for n in 0..3 {
            a.push(body(n));
            let (m, _) = a.flush(1, Time(0), retransmit, false);
            let m = m.unwrap();
            if n == 1 {
                continue; // lost
            }
            got.extend(ts(&b.receive(2, Time(0), m.clone())));
            got.extend(ts(&b.receive(2, Time(0), m))); // duplicated
        }
        assert_eq!(got, vec![0], "1 is missing: 2 waits");
        let (m, resent) = a.flush(1, Time(20_000_000), retransmit, false);
        assert!(resent);
        got.extend(ts(&b.receive(2, Time(0), m.unwrap())));
        assert_eq!(got, vec![0, 1, 2]);
        let (ack, _) = b.flush(2, Time(20_000_000), retransmit, true);
        let _ = a.receive(1, Time(0), ack.unwrap());
        assert_eq!(a.unacked(), 0);
        a.check(NodeId(2));
        b.check(NodeId(1));
    }

    #[test]
    fn a_later_boot_starts_the_direction_over_and_an_earlier_one_is_dropped() {
        let mut b = Channel::default();
        let m =
            |boot, first, n| Message { boot, peer_boot: 0, ack: 0, first, bodies: vec![body(n)] };
        assert_eq!(ts(&b.receive(2, Time(0), m(5, 0, 7))), vec![7]);
        assert_eq!(ts(&b.receive(2, Time(0), m(9, 0, 8))), vec![8], "a new boot numbers from 0");
        assert!(b.receive(2, Time(0), m(5, 1, 9)).is_empty(), "the earlier boot is stale");
    }

    #[test]
    fn a_notice_reaches_a_peer_past_what_it_had_received_and_holds_only_itself() {
        let (mut a, mut b) = (Channel::default(), Channel::default());
        let retransmit = Span::from_millis(10);
        for n in 0..3 {
            a.push(body(n));
        }
        let (m, _) = a.flush(5, Time(0), retransmit, false);
        assert_eq!(ts(&b.receive(2, Time(0), m.unwrap())).len(), 3);
        // The sender replaces the channel with a notice: a later boot's body 0.
        let mut notice = Channel::notice(body(99));
        let (m, _) = notice.flush(6, Time(0), retransmit, false);
        let m = m.unwrap();
        assert_eq!((m.boot, m.first), (6, 0));
        assert_eq!(ts(&b.receive(2, Time(0), m)), vec![99]);
        // Unacknowledged, it is sent again, alone, with the backoff, until its sends are
        // spent; then only once its peer is heard again.
        let mut now = Time(0);
        for _ in 1..NOTICE_SENDS_MAX {
            now = notice.resend_at(retransmit).expect("due again");
            let (m, resent) = notice.flush(5, now, retransmit, false);
            assert!(resent && m.unwrap().bodies.len() == 1);
            notice.check(NodeId(2));
        }
        assert_eq!(now, Time(Span::from_millis(10 * 15).0), "spent 15 time-outs after the first");
        assert_eq!(notice.resend_at(retransmit), None, "at rest");
        assert!(notice.flush(5, Time(u64::MAX / 2), retransmit, false).0.is_none());
        assert!(notice.rearm_notice() && !notice.rearm_notice(), "rearmed once");
        let (m, resent) = notice.flush(5, Time(u64::MAX / 2), retransmit, false);
        assert!(resent && m.unwrap().bodies == vec![body(99)], "sent at once when rearmed");
        notice.check(NodeId(2));
    }
}
