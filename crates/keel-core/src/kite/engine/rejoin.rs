//! Rejoining after a restart: a node that lost its memory reads the state of enough other
//! nodes, page by page, before it serves a client or answers a quorum request.
//!
//! Why it is enough: a write, a promise, an acceptance or a slow release that completed
//! did so at a quorum `Q`. If this node's earlier incarnation was in `Q`, the rest of `Q`
//! holds it: `|Q| - 1 >= n - q` other nodes (with majority quorums, `q - 1`). Reading
//! `n - q + 1` other nodes then always reaches one of them, since the two sets of other
//! nodes, of sizes `q - 1` and `n - q + 1`, add up to more than the `n - 1` other nodes.
//! What reaches this node while it rejoins is safe to take: writes are applied and
//! acknowledged (it holds them from then on); requests whose answers vouch for older
//! state (reads, proposes, accepts, slow releases) go unanswered until it has rejoined,
//! and their senders send them again.
//!
//! Only nodes that have their memory count: when two nodes restart together, one must not
//! count the other, whose memory is gone too. A node that is itself rejoining answers that
//! it has nothing to vouch for, and is asked again later. When this node and the rejoining
//! nodes it heard from are a majority, a majority lost its memory at once and what only
//! those nodes held is lost (the in-memory keyspace's promise, `docs/kite.md`, Restarts):
//! the node then rejoins once every other node has answered, or after a grace period, so
//! that a cluster booting at once starts, and one with a node gone for good does too. A
//! node heard rejoining still counts among those without memory after it has rejoined:
//! otherwise, of two nodes booting beside a third gone for good, the one that rejoined
//! first left the other waiting for the dead node forever.

use super::{Bit, Cursor, KiteEngine, Message, NodeId, SlotImage, PAGE_ITEMS_MAX};
use crate::time::Time;
use std::collections::{BTreeMap, BTreeSet};

/// Roughly the most bytes of keys and values one page carries (a page holds at least
/// one item, so one item at the limits may exceed it).
const PAGE_BYTES_SOFT_MAX: usize = 512 * 1024;

/// An outcome as a state page carries it: the request, its key, its outcome.
type PagedOutcome = (super::RmwId, super::Key, super::RmwOutcome);

/// Whether a page holding `items` items of `bytes` bytes is full.
fn page_full(bytes: usize, items: usize) -> bool {
    items >= PAGE_ITEMS_MAX || bytes >= PAGE_BYTES_SOFT_MAX
}

/// How many retransmission paces a node whose rejoin found a majority without memory
/// waits for the nodes that have not answered before it rejoins without them.
const AMNESIA_GRACE_PACES: u64 = 20;

/// Where reading one other node's state stands.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Source {
    /// The page starting at this cursor was asked for, last at this time; `rejoining`:
    /// the node last said it is rejoining itself (it is asked again from the start).
    Asking { after: Cursor, sent_at: Time, rejoining: bool },
    /// Read to the end.
    Done,
}

/// A rejoin in progress (after a restart), or a sync (a new voter reading the old
/// voters' state during a membership change, `membership.rs`): the same pages.
#[derive(Clone, Debug)]
pub(super) struct Rejoin {
    sources: BTreeMap<NodeId, Source>,
    /// A restart: this node lost its memory (and serves nothing until done). Otherwise a
    /// sync, while the node serves.
    restarted: bool,
    /// Since when this node and the rejoining nodes it heard from have been a majority.
    amnesia_since: Option<Time>,
    /// The other nodes heard to be rejoining during this rejoin: they lost their memory
    /// in the same event as this node, and still count among those without it once they
    /// have rejoined (a node that rejoined without the state a majority lost holds no
    /// more of it than before).
    amnesiac: BTreeSet<NodeId>,
}

impl Rejoin {
    /// Reading `sources`, each asked for its first page at `now`.
    pub(super) fn reading(sources: Vec<NodeId>, now: Time, restarted: bool) -> Rejoin {
        let asking = || Source::Asking { after: Cursor::Start, sent_at: now, rejoining: false };
        let sources = sources.into_iter().map(|p| (p, asking())).collect();
        Rejoin { sources, restarted, amnesia_since: None, amnesiac: BTreeSet::new() }
    }

    /// Whether it is a restart's rejoin (not a sync).
    pub(super) fn restarted(&self) -> bool {
        self.restarted
    }

    /// The sources read to the end.
    fn done(&self) -> Vec<NodeId> {
        self.sources.iter().filter(|(_, s)| **s == Source::Done).map(|(&n, _)| n).collect()
    }
}

impl KiteEngine {
    /// Starts rejoining if the configuration asks for it and there is anyone to read from:
    /// every other member is asked (whoever votes in the membership this node learns
    /// counts; `membership.rs`).
    pub(super) fn start_rejoin(mut self) -> KiteEngine {
        let me = self.config.node;
        let peers: Vec<NodeId> = self.config.members.iter().copied().filter(|&p| p != me).collect();
        if !self.config.rejoin || self.config.unsafe_no_rejoin || peers.is_empty() {
            // No state request carries the membership to the peers: news does, so that a
            // peer configured with other voters is found before the first round.
            for &peer in &peers {
                let news = Message::MembershipNews { membership: self.membership.clone() };
                self.out.messages.push((peer, news));
            }
            return self;
        }
        for &peer in &peers {
            let ask = Message::StateRequest {
                rejoin: self.writer,
                after: Cursor::Start,
                membership: self.membership.clone(),
            };
            self.out.messages.push((peer, ask));
        }
        self.rejoin = Some(Rejoin::reading(peers, self.now, true));
        self.finish_rejoin_if_complete();
        self
    }

    /// Whether the rejoin is complete: enough nodes with their memory read, or a majority
    /// without memory and nobody left to wait for (or the grace period over).
    fn rejoin_complete(&mut self) -> bool {
        let now = self.now;
        let quorum = super::membership::majority(self.membership.voters.len());
        let grace = crate::time::Span(self.config.retransmit.0.saturating_mul(AMNESIA_GRACE_PACES));
        let Some(rejoin) = &self.rejoin else { return true };
        let everyone = rejoin.sources.values().all(|s| *s == Source::Done);
        if self.membership.epoch < self.config.members_epoch && !everyone {
            // The disk recorded a newer membership than the one known: until a peer tells
            // of it, this node does not know whose state it must read. (Every other node
            // read, none knowing it: it was chosen, but taken only by this node's earlier
            // incarnation, which no reply of another epoch reached; what the others know
            // is the membership.)
            return false;
        }
        if self.read_enough(&rejoin.done(), true) {
            return true;
        }
        let voters = &self.membership.voters;
        let amnesiac = rejoin.amnesiac.iter().filter(|n| voters.contains(n)).count();
        let me = usize::from(voters.contains(&self.config.node));
        let rejoin = self.rejoin.as_mut().expect("rejoining");
        if amnesiac + me < quorum || me == 0 {
            rejoin.amnesia_since = None;
            return false;
        }
        let since = *rejoin.amnesia_since.get_or_insert(now);
        let unheard = rejoin.sources.iter().any(|(n, s)| {
            voters.contains(n) && matches!(s, Source::Asking { rejoining: false, .. })
        });
        !unheard || since + grace <= now
    }

    /// Ends the rejoin (or the sync) if it is complete.
    pub(super) fn finish_rejoin_if_complete(&mut self) {
        if self.rejoin.is_some() && self.rejoin_complete() {
            self.rejoin = None;
            self.counters.rejoins += 1;
            self.synced_now();
        }
        let synced = self.sync.as_ref().is_some_and(|s| self.read_enough(&s.done(), false));
        if synced {
            self.sync = None;
            self.synced_now();
        }
    }

    /// Whether a rejoining node answers `message` (a write, which it then holds, and a
    /// reset, which answers nothing).
    pub(super) fn answers_while_rejoining(&self, message: &Message) -> bool {
        matches!(message, Message::Write { .. } | Message::ResetBit { .. })
    }

    /// Asks again for the pages not answered within the retransmission pace.
    pub(super) fn rejoin_resend_due(&mut self) {
        let (now, pace, writer) = (self.now, self.config.retransmit, self.writer);
        let membership = self.membership.clone();
        let reading = if self.rejoin.is_some() { &mut self.rejoin } else { &mut self.sync };
        let Some(rejoin) = reading else { return };
        for (&peer, source) in rejoin.sources.iter_mut() {
            if let Source::Asking { after, sent_at, .. } = source {
                if *sent_at + pace <= now {
                    *sent_at = now;
                    let ask = Message::StateRequest {
                        rejoin: writer,
                        after: after.clone(),
                        membership: membership.clone(),
                    };
                    self.out.messages.push((peer, ask));
                    self.counters.retransmits += 1;
                }
            }
        }
    }

    /// When the next page request is due again.
    pub(super) fn rejoin_wake(&self) -> Option<Time> {
        let rejoin = self.rejoin.as_ref().or(self.sync.as_ref())?;
        let grace = crate::time::Span(self.config.retransmit.0.saturating_mul(AMNESIA_GRACE_PACES));
        rejoin
            .sources
            .values()
            .filter_map(|s| match s {
                Source::Asking { sent_at, .. } => Some(*sent_at + self.config.retransmit),
                Source::Done => None,
            })
            .chain(rejoin.amnesia_since.map(|since| since + grace))
            .min()
    }

    /// The page of this node's state from `after`, for the rejoin `rejoin`: keys first,
    /// then outcomes, each page within [`PAGE_ITEMS_MAX`] items and about
    /// [`PAGE_BYTES_SOFT_MAX`] bytes.
    pub(super) fn state_page(&self, rejoin: u64, after: Cursor) -> Message {
        if self.rejoin.is_some() {
            let (slots, outcomes, bits) = (Vec::new(), Vec::new(), Vec::new());
            return Message::StatePage {
                rejoin,
                after,
                rejoining: true,
                slots,
                outcomes,
                bits,
                next: None,
                membership: self.membership.clone(),
            };
        }
        let bits = match after {
            Cursor::Start => self
                .bits
                .iter()
                .filter(|(_, b)| **b != Bit::Clear)
                .map(|(&node, _)| (node, true, self.gens.get(&node).copied().unwrap_or(0)))
                .collect(),
            _ => Vec::new(),
        };
        let mut bytes = 0usize;
        let (slots, mut next) = self.page_slots(&after, &mut bytes);
        let mut outcomes = Vec::new();
        if next.is_none() {
            (outcomes, next) = self.page_outcomes(&after, bytes, slots.len());
        }
        assert!(slots.len() + outcomes.len() <= PAGE_ITEMS_MAX, "a state page past its bound");
        let membership = self.membership.clone();
        Message::StatePage {
            rejoin,
            after,
            rejoining: false,
            slots,
            outcomes,
            bits,
            next,
            membership,
        }
    }

    /// The keys of a page from `after` (none when it starts among the outcomes), and the
    /// cursor of the next page if the keys fill this one.
    fn page_slots(&self, after: &Cursor, bytes: &mut usize) -> (Vec<SlotImage>, Option<Cursor>) {
        let from = match after {
            Cursor::Start => std::ops::Bound::Unbounded,
            Cursor::Key(k) => std::ops::Bound::Excluded(k.clone()),
            Cursor::Outcome(..) => return (Vec::new(), None),
        };
        let mut slots = Vec::new();
        for (key, slot) in self.keys.range((from, std::ops::Bound::Unbounded)) {
            if page_full(*bytes, slots.len()) {
                let last = slots.last().map_or(key.clone(), |s: &SlotImage| s.key.clone());
                return (slots, Some(Cursor::Key(last)));
            }
            *bytes += key.len() + slot.value.as_ref().map_or(0, |v| v.len());
            if let Some((_, r)) = &slot.accepted {
                *bytes += r.value.len() + r.read.as_ref().map_or(0, |v| v.len());
            }
            slots.push(SlotImage {
                key: key.clone(),
                value: slot.value.clone(),
                stamp: slot.stamp,
                promised: slot.promised,
                accepted: slot.accepted.clone(),
                made_by: slot.made_by.clone(),
            });
        }
        // Keys are done: outcomes follow, in this page if it has room.
        let next = page_full(*bytes, slots.len()).then_some(Cursor::Outcome(0, 0));
        (slots, next)
    }

    /// The outcomes of a page from `after`, after `items` keys that took `bytes`, and the
    /// cursor of the next page if they fill this one.
    fn page_outcomes(
        &self,
        after: &Cursor,
        mut bytes: usize,
        items: usize,
    ) -> (Vec<PagedOutcome>, Option<Cursor>) {
        let from = match after {
            Cursor::Outcome(node, session) => std::ops::Bound::Excluded((*node, *session)),
            _ => std::ops::Bound::Unbounded,
        };
        let mut outcomes: Vec<PagedOutcome> = Vec::new();
        for ((node, session), key, outcome) in self.outcomes.range(from) {
            if page_full(bytes, items + outcomes.len()) {
                let (n, s) =
                    outcomes.last().map_or((node, session), |(id, _, _)| (id.node, id.session));
                return (outcomes, Some(Cursor::Outcome(n, s)));
            }
            bytes += key.len() + outcome.value.len() + outcome.read.as_ref().map_or(0, |v| v.len());
            let id = super::RmwId { node, session, seq: outcome.seq };
            outcomes.push((id, key.clone(), outcome.clone()));
        }
        (outcomes, None)
    }

    /// Merges a page into this node's state and asks for the next one; rejoins once
    /// enough nodes were read.
    pub(super) fn on_state_page(&mut self, from: NodeId, page: Message) {
        let Message::StatePage {
            rejoin,
            after,
            rejoining,
            slots,
            outcomes,
            bits,
            next,
            membership,
        } = page
        else {
            return;
        };
        // The sender's membership first: the page counts under it (a sync the news ends
        // or starts again takes no page of the one before). A page of a sender configured
        // with other voters, while both memberships are the configured one, counts not.
        self.compare_configured(from, &membership);
        self.take_membership(membership);
        if !self.admit_configured() {
            return;
        }
        let (writer, current) = (self.writer, self.membership.clone());
        let reading = if self.rejoin.is_some() { &mut self.rejoin } else { &mut self.sync };
        let Some(state) = reading else { return };
        let expected = matches!(state.sources.get(&from),
            Some(Source::Asking { after: asked, .. }) if *asked == after);
        if rejoin != writer || !expected {
            // A late or repeated page: what it holds is still true, but the cursor has
            // moved on; ignoring it keeps each page merged once.
            return;
        }
        let now = self.now;
        let source = match (&next, rejoining) {
            // Asked again from the start after the pace: it may have rejoined by then.
            (_, true) => Source::Asking { after: Cursor::Start, sent_at: now, rejoining: true },
            (Some(cursor), false) => {
                let ask = Message::StateRequest {
                    rejoin: writer,
                    after: cursor.clone(),
                    membership: current,
                };
                self.out.messages.push((from, ask));
                Source::Asking { after: cursor.clone(), sent_at: now, rejoining: false }
            }
            (None, false) => Source::Done,
        };
        state.sources.insert(from, source);
        if rejoining {
            state.amnesiac.insert(from);
        }
        if !rejoining {
            self.counters.rejoin_pages += 1;
        }
        for slot in slots {
            self.merge_slot(slot);
        }
        for (id, key, outcome) in outcomes {
            self.record_outcome(&key, id, outcome);
        }
        for (node, _, gen) in bits {
            // Conservative: a bit set or transient anywhere is set here (its node's next
            // acquire takes the slow path and resets it with this generation).
            if let Some(bit) = self.bits.get_mut(&node) {
                *bit = Bit::Set;
                let mine = self.gens.entry(node).or_default();
                *mine = (*mine).max(gen);
            }
        }
        self.finish_rejoin_if_complete();
    }

    /// Takes one key as another node holds it: the newer value, the higher promise, the
    /// accepted record of the higher ballot. Each is what that node holds, so any quorum
    /// argument that counted it holds here too; the key stays out of its epoch.
    fn merge_slot(&mut self, image: SlotImage) {
        let SlotImage { key, value, stamp, promised, accepted, made_by } = image;
        self.apply(&key, value, stamp, made_by);
        let slot = self.keys.entry(key).or_default();
        slot.promised = slot.promised.max(promised);
        if let Some((ballot, record)) = accepted {
            if slot.accepted.as_ref().is_none_or(|(mine, _)| *mine < ballot) {
                slot.accepted = Some((ballot, record));
                slot.accepted_here = None;
            }
        }
    }
}
