//! Object states: how the updates of [`super::history`] change them, and how a state
//! compares with what a read or a final state recorded ([`Seen`]).

use super::history::{Kind, Seen, TxId, Update};
use std::collections::{BTreeMap, BTreeSet};

/// An object's state, borrowing strings from the history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum State<'a> {
    /// The last value set (`None`: never set).
    Register(Option<&'a str>),
    /// The sum of the deltas (wide: the sum of any number of `i64`s a history can hold
    /// fits, so an overflow is found when the value is read, not while summing).
    Counter(i128),
    /// The highest value (`None`: never raised).
    Max(Option<i64>),
    /// The elements added.
    GSet(BTreeSet<&'a str>),
    /// Each present element's tags (the adding transactions not removed); an element whose
    /// tags are all removed is dropped.
    AwSet(BTreeMap<&'a str, BTreeSet<TxId>>),
}

impl<'a> State<'a> {
    /// The state of an object of `kind` that no update reached.
    pub(crate) fn empty(kind: Kind) -> State<'a> {
        match kind {
            Kind::Register => State::Register(None),
            Kind::Counter => State::Counter(0),
            Kind::Max => State::Max(None),
            Kind::GSet => State::GSet(BTreeSet::new()),
            Kind::AwSet => State::AwSet(BTreeMap::new()),
        }
    }

    /// Applies `update`, made by transaction `tx`; an update of another kind is ignored.
    pub(crate) fn apply(&mut self, update: &'a Update, tx: TxId) {
        match (self, update) {
            (State::Register(v), Update::Set { value }) => *v = Some(value),
            (State::Counter(n), Update::Add { delta }) => *n += i128::from(*delta),
            (State::Max(m), Update::Max { value }) => {
                *m = Some(m.map_or(*value, |old| old.max(*value)));
            }
            (State::GSet(s), Update::GAdd { elem }) => {
                s.insert(elem);
            }
            (State::AwSet(s), Update::SAdd { elem }) => {
                s.entry(elem).or_default().insert(tx);
            }
            (State::AwSet(s), Update::SRem { elem, seen }) => {
                if let Some(tags) = s.get_mut(elem.as_str()) {
                    for tag in seen {
                        tags.remove(tag);
                    }
                    if tags.is_empty() {
                        s.remove(elem.as_str());
                    }
                }
            }
            _ => {}
        }
    }

    /// Whether it is the state of an object no update reached (for sets: no element).
    pub(crate) fn is_empty(&self) -> bool {
        match self {
            State::Register(v) => v.is_none(),
            State::Counter(n) => *n == 0,
            State::Max(m) => m.is_none(),
            State::GSet(s) => s.is_empty(),
            State::AwSet(s) => s.is_empty(),
        }
    }

    /// Whether `seen` records this state; `Err(sum)` when a counter's sum does not fit
    /// an `i64`.
    pub(crate) fn matches(&self, seen: &Seen) -> Result<bool, i128> {
        Ok(match (self, seen) {
            (State::Register(v), Seen::Register { value }) => value.as_deref() == *v,
            (State::Counter(n), Seen::Counter { value }) => {
                i64::try_from(*n).map_err(|_| *n)? == *value
            }
            (State::Max(m), Seen::Max { value }) => m == value,
            (State::GSet(s), Seen::Set { elems }) => {
                s.len() == elems.len() && s.iter().zip(elems).all(|(a, b)| *a == b)
            }
            (State::AwSet(s), Seen::Set { elems }) => {
                s.len() == elems.len() && s.keys().zip(elems).all(|(a, b)| *a == b)
            }
            _ => false,
        })
    }

    /// Whether `got` (absent: the object is not listed) records this state, an absent
    /// object being the empty state.
    pub(crate) fn matches_listed(&self, got: Option<&Seen>) -> Result<bool, i128> {
        match got {
            Some(seen) => self.matches(seen),
            None => match self {
                State::Counter(n) if i64::try_from(*n).is_err() => Err(*n),
                _ => Ok(self.is_empty()),
            },
        }
    }

    /// The state as a read records it, for messages (a counter that does not fit an
    /// `i64` is shown saturated).
    pub(crate) fn seen(&self) -> Seen {
        match self {
            State::Register(v) => Seen::Register { value: v.map(str::to_string) },
            State::Counter(n) => Seen::Counter {
                value: i64::try_from(*n).unwrap_or(if *n < 0 { i64::MIN } else { i64::MAX }),
            },
            State::Max(m) => Seen::Max { value: *m },
            State::GSet(s) => Seen::Set { elems: s.iter().map(|e| e.to_string()).collect() },
            State::AwSet(s) => Seen::Set { elems: s.keys().map(|e| e.to_string()).collect() },
        }
    }
}

/// Whether `seen` is the state of an object no update reached.
pub(crate) fn seen_is_empty(seen: &Seen) -> bool {
    match seen {
        Seen::Register { value } => value.is_none(),
        Seen::Counter { value } => *value == 0,
        Seen::Max { value } => value.is_none(),
        Seen::Set { elems } => elems.is_empty(),
    }
}

/// Whether `seen` is a state an object of `kind` can have (sets: either set kind).
pub(crate) fn seen_fits(kind: Kind, seen: &Seen) -> bool {
    matches!(
        (kind, seen),
        (Kind::Register, Seen::Register { .. })
            | (Kind::Counter, Seen::Counter { .. })
            | (Kind::Max, Seen::Max { .. })
            | (Kind::GSet | Kind::AwSet, Seen::Set { .. })
    )
}

/// `seen` as its JSON form, for messages.
pub(crate) fn show(seen: &Seen) -> String {
    serde_json::to_string(seen).unwrap_or_else(|_| format!("{seen:?}"))
}

/// The name of a kind as the format spells it.
pub(crate) fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Register => "register",
        Kind::Counter => "counter",
        Kind::Max => "max",
        Kind::GSet => "g_set",
        Kind::AwSet => "aw_set",
    }
}
