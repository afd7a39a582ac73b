//! The objects' merge rules (`docs/geo.md`, *Values*): an object's state on a snapshot is
//! its updates in that snapshot applied in arbitration order, a linear extension of the
//! causal order (by the sum of the commit vectors, then the origin, then the transaction);
//! a transaction's own updates come after them, in its order. Counters, max registers and
//! the sets commute, so every order gives them the same state; a register keeps the
//! arbitration's last write.

use super::types::{Arbitration, Kind, Object, TxId, Update};
use std::collections::{BTreeMap, BTreeSet};

impl Object {
    /// The state of an object of `kind` no update touched.
    pub fn empty(kind: Kind) -> Object {
        match kind {
            Kind::Register => Object::Register(None),
            Kind::Counter => Object::Counter(0),
            Kind::Max => Object::Max(None),
            Kind::GSet => Object::GSet(BTreeSet::new()),
            Kind::AwSet => Object::AwSet(BTreeMap::new()),
        }
    }

    /// Its kind.
    pub fn kind(&self) -> Kind {
        match self {
            Object::Register(_) => Kind::Register,
            Object::Counter(_) => Kind::Counter,
            Object::Max(_) => Kind::Max,
            Object::GSet(_) => Kind::GSet,
            Object::AwSet(_) => Kind::AwSet,
        }
    }

    /// Applies `update` by the transaction `arb` names. An update of another kind
    /// changes nothing (callers only apply an object's own kind). A counter saturates.
    pub fn apply(&mut self, update: &Update, arb: Arbitration) {
        match (self, update) {
            (Object::Register(slot), Update::Set(value))
                if slot.as_ref().is_none_or(|(_, at)| *at <= arb) =>
            {
                *slot = Some((value.clone(), arb));
            }
            (Object::Counter(n), Update::Add(delta)) => *n = n.saturating_add(*delta),
            (Object::Max(m), Update::Max(v)) => *m = Some(m.map_or(*v, |m| m.max(*v))),
            (Object::GSet(set), Update::GAdd(elem)) => {
                set.insert(elem.clone());
            }
            (Object::AwSet(set), Update::SAdd(elem)) => {
                set.entry(elem.clone()).or_default().insert(arb.tx);
            }
            (Object::AwSet(set), Update::SRem(elem, seen)) => {
                if let Some(tags) = set.get_mut(elem) {
                    for tx in seen {
                        tags.remove(tx);
                    }
                    if tags.is_empty() {
                        set.remove(elem);
                    }
                }
            }
            _ => {}
        }
    }

    /// The adds of `elem` this add-wins set holds (what a remove of it removes).
    pub fn adds_of(&self, elem: &[u8]) -> Vec<TxId> {
        match self {
            Object::AwSet(set) => {
                set.get(elem).map(|tags| tags.iter().copied().collect()).unwrap_or_default()
            }
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_types::Value as Bytes;

    fn arb(sum: u128, node: u32) -> Arbitration {
        Arbitration { sum, origin: node, tx: TxId { node, seq: 1 } }
    }

    #[test]
    fn concurrent_deposits_sum_in_any_order() {
        let (a, b) = (Update::Add(100), Update::Add(200));
        let mut one = Object::empty(Kind::Counter);
        one.apply(&a, arb(1, 1));
        one.apply(&b, arb(2, 2));
        let mut two = Object::empty(Kind::Counter);
        two.apply(&b, arb(2, 2));
        two.apply(&a, arb(1, 1));
        assert_eq!(one, Object::Counter(300));
        assert_eq!(one, two);
    }

    #[test]
    fn a_register_keeps_the_last_write_in_arbitration_order_whatever_the_arrival() {
        let mut r = Object::empty(Kind::Register);
        r.apply(&Update::Set(Bytes::from_static(b"late")), arb(9, 1));
        r.apply(&Update::Set(Bytes::from_static(b"early")), arb(3, 2));
        assert!(matches!(&r, Object::Register(Some((v, _))) if v == "late"));
    }

    #[test]
    fn a_remove_takes_only_the_adds_it_saw() {
        let x = Bytes::from_static(b"x");
        let mut s = Object::empty(Kind::AwSet);
        s.apply(&Update::SAdd(x.clone()), arb(1, 1));
        let seen = s.adds_of(&x);
        s.apply(&Update::SAdd(x.clone()), arb(2, 2));
        s.apply(&Update::SRem(x.clone(), seen), arb(3, 3));
        assert_eq!(s.adds_of(&x), vec![TxId { node: 2, seq: 1 }], "the concurrent add wins");
    }
}
