//! The `session` and `snapshot-below-past` rules: within a session, each snapshot covers
//! the session's past; a move to another data center keeps the past only through an
//! attach there. A vector covers another life-aware (`CausalHistory::covered`): a
//! snapshot in a data center's new life does not cover a past naming its old life above
//! what survived of it, so a session let go on with such a past is caught.

use super::history::{CausalHistory, ClientTx, Outcome, Sync};
use super::{kind, Sink};
use std::collections::BTreeMap;

/// One event of a session.
#[derive(Clone, Copy)]
pub(crate) enum Event<'a> {
    Sync(&'a Sync),
    Tx(&'a ClientTx),
}

impl Event<'_> {
    fn order(&self) -> u64 {
        self.place().0
    }

    /// Its `(order, at_ns)`.
    pub(crate) fn place(&self) -> (u64, u64) {
        match self {
            Event::Sync(s) => (s.order, s.at_ns),
            Event::Tx(t) => (t.order, t.at_ns),
        }
    }
}

/// Every session's transactions and syncs, in session order (`order`).
pub(crate) fn sessions(history: &CausalHistory) -> BTreeMap<u64, Vec<Event<'_>>> {
    let mut sessions: BTreeMap<u64, Vec<Event<'_>>> = BTreeMap::new();
    for s in &history.syncs {
        sessions.entry(s.session).or_default().push(Event::Sync(s));
    }
    for t in &history.txs {
        sessions.entry(t.session).or_default().push(Event::Tx(t));
    }
    for events in sessions.values_mut() {
        events.sort_by_key(Event::order);
    }
    sessions
}

/// What a session has shown so far.
#[derive(Default)]
struct Walk<'a> {
    /// The session's past: what every later snapshot must cover (`None` at the start and
    /// after a move without attach).
    past: Option<&'a [u64]>,
    /// What set the past, for messages.
    from: String,
    /// The data center of the session's last transaction.
    dc: Option<u32>,
    /// The data center of an attach since the last transaction.
    attached: Option<u32>,
}

/// Checks every session of `history`.
pub(crate) fn check(history: &CausalHistory, sink: &mut Sink) {
    for (session, events) in sessions(history) {
        let mut walk = Walk::default();
        for event in events {
            match event {
                Event::Sync(s) => walk.sync(history, session, s, sink),
                Event::Tx(t) => walk.tx(history, t, sink),
            }
        }
    }
}

impl<'a> Walk<'a> {
    fn sync(&mut self, history: &CausalHistory, session: u64, s: &'a Sync, sink: &mut Sink) {
        let what = if s.barrier { "barrier" } else { "attach" };
        if let Some(past) = self.past {
            if !history.covered(past, &s.past) {
                sink.report(kind::SESSION, || {
                    format!(
                        "session {session}: the {what} at dc {} returning at {} ns carried past \
                         {:?}, below the session's past {past:?} (from {})",
                        s.dc, s.at_ns, s.past, self.from
                    )
                });
            }
        }
        if !s.barrier {
            self.past = Some(&s.past);
            self.from = format!("the attach at dc {} returning at {} ns", s.dc, s.at_ns);
            self.attached = Some(s.dc);
        }
    }

    fn tx(&mut self, history: &CausalHistory, t: &'a ClientTx, sink: &mut Sink) {
        if !history.covered(&t.past, &t.snap) {
            sink.report(kind::SNAPSHOT_BELOW_PAST, || {
                format!("tx {}: snapshot {:?} below its past {:?}", t.id, t.snap, t.past)
            });
        }
        if self.dc.is_some_and(|dc| dc != t.dc) && self.attached != Some(t.dc) {
            self.past = None;
        }
        if let Some(past) = self.past {
            if !history.covered(past, &t.snap) {
                sink.report(kind::SESSION, || {
                    format!(
                        "session {}: tx {} at dc {} (at {} ns) has snapshot {:?}, below the \
                         session's past {past:?} (from {})",
                        t.session, t.id, t.dc, t.at_ns, t.snap, self.from
                    )
                });
            }
        }
        match &t.outcome {
            Outcome::Committed { vector } => {
                self.past = Some(vector);
                self.from = format!("tx {}'s commit", t.id);
            }
            Outcome::Unknown => {
                self.past = Some(&t.snap);
                self.from = format!("tx {}'s snapshot (outcome unknown)", t.id);
            }
            Outcome::Aborted => {}
        }
        self.dc = Some(t.dc);
        self.attached = None;
    }
}
