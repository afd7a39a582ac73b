//! A collection value of the state machine (`keel_types::coll`): a hash, list, set or
//! sorted set held under one key, with its size in bytes and its share of the state's
//! digest kept current as it changes.
//!
//! The containers are persistent (`imbl`): cloning one is O(1) and a change copies only
//! the path it touches. The state machine clones an item into its undo record and into a
//! snapshot in progress before it changes it, so a push to a list of a million elements
//! costs what the push does, not what the list holds.
//!
//! Orders are deterministic, so every replica answers a scan, a "random" pick or a pop of
//! the same state alike: hashes and sets by field or member bytes; sorted sets by score,
//! then member. A sorted set keeps its members twice: by member (score lookups) and, in
//! an indexable sequence sorted by (score, member), for ranks and ranges: a rank is a
//! binary search over the sequence, O(log² n); an insertion or removal O(log n).

use crate::fnv::WordHash;
use imbl::{OrdMap, OrdSet, Vector};
use keel_types::codec::{put_bytes, put_u64, put_u8, Reader};
use keel_types::coll::CollKind;
use keel_types::Value;
use std::cmp::Ordering;

/// What each element costs beyond its bytes, in the state's byte count: the container's
/// nodes and pointers, roughly.
pub const ELEMENT_OVERHEAD_BYTES: u64 = 16;

/// A score: never NaN, and -0 is stored as 0 (Redis compares scores with `<`, so the two
/// are equal, and the member breaks the tie).
#[derive(Clone, Copy, Debug)]
pub struct Score(f64);

impl Score {
    /// `value` as a score (`None` for NaN).
    pub fn new(value: f64) -> Option<Score> {
        if value.is_nan() {
            return None;
        }
        Some(Score(if value == 0.0 { 0.0 } else { value }))
    }

    /// The score.
    pub fn get(self) -> f64 {
        self.0
    }
}

impl PartialEq for Score {
    fn eq(&self, other: &Score) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}
impl Eq for Score {}
impl PartialOrd for Score {
    fn partial_cmp(&self, other: &Score) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Score {
    fn cmp(&self, other: &Score) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// A sorted set: each member's score, and the (score, member) pairs in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ZSet {
    scores: OrdMap<Value, Score>,
    order: Vector<(Score, Value)>,
}

impl ZSet {
    /// A member's score.
    pub fn score(&self, member: &[u8]) -> Option<Score> {
        self.scores.get(member).copied()
    }

    /// Members held.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The pairs in (score, member) order.
    pub fn order(&self) -> &Vector<(Score, Value)> {
        &self.order
    }

    /// The rank of `(score, member)`: its position if held, else where it would go.
    pub fn position(&self, score: Score, member: &[u8]) -> Result<usize, usize> {
        self.order.binary_search_by(|(s, m)| s.cmp(&score).then_with(|| m[..].cmp(member)))
    }

    /// The first rank whose pair is not before what `before` says is before.
    pub fn partition(&self, mut before: impl FnMut(Score, &Value) -> bool) -> usize {
        // `binary_search_by` never answers Equal here, so the error is the boundary.
        match self.order.binary_search_by(|(s, m)| {
            if before(*s, m) {
                Ordering::Less
            } else {
                Ordering::Greater
            }
        }) {
            Ok(at) | Err(at) => at,
        }
    }

    fn insert(&mut self, member: Value, score: Score) -> Option<Score> {
        let old = self.scores.insert(member.clone(), score);
        if let Some(old) = old {
            let at = self.position(old, &member).expect("the order mirrors the scores");
            self.order.remove(at);
        }
        let at = self.position(score, &member).expect_err("removed above");
        self.order.insert(at, (score, member));
        old
    }

    fn remove(&mut self, member: &[u8]) -> Option<Score> {
        let old = self.scores.remove(member)?;
        let at = self.position(old, member).expect("the order mirrors the scores");
        self.order.remove(at);
        Some(old)
    }
}

/// A collection's elements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Data {
    /// Fields to values.
    Hash(OrdMap<Value, Value>),
    /// Elements in order.
    List(Vector<Value>),
    /// Members.
    Set(OrdSet<Value>),
    /// Members by score.
    ZSet(ZSet),
}

/// A collection with its byte count and digest share, both kept as it changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Coll {
    data: Data,
    bytes: u64,
    hash: u64,
}

fn element_hash(kind: u64, a: &[u8], b: Option<&[u8]>, score: Option<Score>) -> u64 {
    let mut hash = WordHash::new();
    hash.write_u64(kind);
    hash.write_bytes(a);
    if let Some(b) = b {
        hash.write_bytes(b);
    }
    if let Some(score) = score {
        hash.write_u64(score.0.to_bits());
    }
    hash.finish()
}

fn element_bytes(a: &[u8], b: usize) -> u64 {
    a.len() as u64 + b as u64 + ELEMENT_OVERHEAD_BYTES
}

impl Coll {
    /// An empty collection of `kind` (a key holds one only while it has elements).
    pub fn new(kind: CollKind) -> Coll {
        let data = match kind {
            CollKind::Hash => Data::Hash(OrdMap::new()),
            CollKind::List => Data::List(Vector::new()),
            CollKind::Set => Data::Set(OrdSet::new()),
            CollKind::ZSet => Data::ZSet(ZSet::default()),
        };
        Coll { data, bytes: 0, hash: 0 }
    }

    /// Its type.
    pub fn kind(&self) -> CollKind {
        match self.data {
            Data::Hash(_) => CollKind::Hash,
            Data::List(_) => CollKind::List,
            Data::Set(_) => CollKind::Set,
            Data::ZSet(_) => CollKind::ZSet,
        }
    }

    /// Its elements.
    pub fn data(&self) -> &Data {
        &self.data
    }

    /// Elements held.
    pub fn len(&self) -> usize {
        match &self.data {
            Data::Hash(map) => map.len(),
            Data::List(list) => list.len(),
            Data::Set(set) => set.len(),
            Data::ZSet(z) => z.len(),
        }
    }

    /// Whether it holds nothing (then its key is deleted).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of its elements plus [`ELEMENT_OVERHEAD_BYTES`] each.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Its share of the state's digest: a wrapping sum over its elements (a list's is
    /// blind to their order; the simulator's convergence checks compare answers too).
    pub fn hash(&self) -> u64 {
        self.hash
    }

    fn add(&mut self, bytes: u64, hash: u64) {
        self.bytes += bytes;
        self.hash = self.hash.wrapping_add(hash);
    }

    fn sub(&mut self, bytes: u64, hash: u64) {
        self.bytes = self.bytes.checked_sub(bytes).expect("the byte count mirrors the elements");
        self.hash = self.hash.wrapping_sub(hash);
    }

    // ----- hashes --------------------------------------------------------------------

    /// The hash's map (panics on another type: callers check the kind first).
    pub fn hash_map(&self) -> &OrdMap<Value, Value> {
        match &self.data {
            Data::Hash(map) => map,
            _ => panic!("not a hash"),
        }
    }

    /// Sets a field; returns the value it had.
    pub fn h_insert(&mut self, field: Value, value: Value) -> Option<Value> {
        let Data::Hash(map) = &mut self.data else { panic!("not a hash") };
        let (bytes, hash) =
            (element_bytes(&field, value.len()), element_hash(1, &field, Some(&value), None));
        let old = map.insert(field.clone(), value);
        self.add(bytes, hash);
        if let Some(old) = &old {
            self.sub(element_bytes(&field, old.len()), element_hash(1, &field, Some(old), None));
        }
        old
    }

    /// Removes a field; returns its value.
    pub fn h_remove(&mut self, field: &[u8]) -> Option<Value> {
        let Data::Hash(map) = &mut self.data else { panic!("not a hash") };
        let old = map.remove(field)?;
        self.sub(element_bytes(field, old.len()), element_hash(1, field, Some(&old), None));
        Some(old)
    }

    // ----- lists ---------------------------------------------------------------------

    /// The list's elements (panics on another type).
    pub fn list(&self) -> &Vector<Value> {
        match &self.data {
            Data::List(list) => list,
            _ => panic!("not a list"),
        }
    }

    fn list_mut(&mut self) -> &mut Vector<Value> {
        match &mut self.data {
            Data::List(list) => list,
            _ => panic!("not a list"),
        }
    }

    /// Adds an element at `front` or the back.
    pub fn l_push(&mut self, front: bool, value: Value) {
        self.add(element_bytes(&value, 0), element_hash(2, &value, None, None));
        let list = self.list_mut();
        if front {
            list.push_front(value);
        } else {
            list.push_back(value);
        }
    }

    /// Removes the element at `front` or the back.
    pub fn l_pop(&mut self, front: bool) -> Option<Value> {
        let list = self.list_mut();
        let value = if front { list.pop_front() } else { list.pop_back() }?;
        self.sub(element_bytes(&value, 0), element_hash(2, &value, None, None));
        Some(value)
    }

    /// Inserts an element before position `at`.
    pub fn l_insert(&mut self, at: usize, value: Value) {
        self.add(element_bytes(&value, 0), element_hash(2, &value, None, None));
        self.list_mut().insert(at, value);
    }

    /// Removes the element at `at`.
    pub fn l_remove(&mut self, at: usize) -> Value {
        let value = self.list_mut().remove(at);
        self.sub(element_bytes(&value, 0), element_hash(2, &value, None, None));
        value
    }

    /// Replaces the element at `at`.
    pub fn l_set(&mut self, at: usize, value: Value) {
        self.add(element_bytes(&value, 0), element_hash(2, &value, None, None));
        let old = self.list_mut().set(at, value);
        self.sub(element_bytes(&old, 0), element_hash(2, &old, None, None));
    }

    /// Keeps positions `start..end` only.
    pub fn l_keep(&mut self, start: usize, end: usize) {
        let list = self.list_mut();
        let kept = list.clone().slice(start..end);
        let dropped: Vec<Value> =
            list.iter().take(start).chain(list.iter().skip(end)).cloned().collect();
        *list = kept;
        for value in dropped {
            self.sub(element_bytes(&value, 0), element_hash(2, &value, None, None));
        }
    }

    // ----- sets ----------------------------------------------------------------------

    /// The set's members (panics on another type).
    pub fn set(&self) -> &OrdSet<Value> {
        match &self.data {
            Data::Set(set) => set,
            _ => panic!("not a set"),
        }
    }

    /// Adds a member; whether it is new.
    pub fn s_insert(&mut self, member: Value) -> bool {
        let Data::Set(set) = &mut self.data else { panic!("not a set") };
        let (bytes, hash) = (element_bytes(&member, 0), element_hash(3, &member, None, None));
        let fresh = set.insert(member).is_none();
        if fresh {
            self.add(bytes, hash);
        }
        fresh
    }

    /// Removes a member; whether it was there.
    pub fn s_remove(&mut self, member: &[u8]) -> bool {
        let Data::Set(set) = &mut self.data else { panic!("not a set") };
        let gone = set.remove(member).is_some();
        if gone {
            self.sub(element_bytes(member, 0), element_hash(3, member, None, None));
        }
        gone
    }

    // ----- sorted sets ---------------------------------------------------------------

    /// The sorted set (panics on another type).
    pub fn zset(&self) -> &ZSet {
        match &self.data {
            Data::ZSet(z) => z,
            _ => panic!("not a sorted set"),
        }
    }

    /// Sets a member's score; returns the score it had.
    pub fn z_insert(&mut self, member: Value, score: Score) -> Option<Score> {
        let Data::ZSet(z) = &mut self.data else { panic!("not a sorted set") };
        let (bytes, hash) =
            (element_bytes(&member, 8), element_hash(4, &member, None, Some(score)));
        let old = z.insert(member.clone(), score);
        self.add(bytes, hash);
        if let Some(old) = old {
            self.sub(element_bytes(&member, 8), element_hash(4, &member, None, Some(old)));
        }
        old
    }

    /// Removes a member; returns its score.
    pub fn z_remove(&mut self, member: &[u8]) -> Option<Score> {
        let Data::ZSet(z) = &mut self.data else { panic!("not a sorted set") };
        let old = z.remove(member)?;
        self.sub(element_bytes(member, 8), element_hash(4, member, None, Some(old)));
        Some(old)
    }

    // ----- snapshots -----------------------------------------------------------------

    /// Its snapshot encoding: the type, the element count, then each element (a hash's
    /// field and value, a sorted set's member and score bits), in the collection's order.
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_u8(out, kind_tag(self.kind()));
        put_u64(out, self.len() as u64);
        match &self.data {
            Data::Hash(map) => map.iter().for_each(|(f, v)| {
                put_bytes(out, f);
                put_bytes(out, v);
            }),
            Data::List(list) => list.iter().for_each(|v| put_bytes(out, v)),
            Data::Set(set) => set.iter().for_each(|m| put_bytes(out, m)),
            Data::ZSet(z) => z.order.iter().for_each(|(s, m)| {
                put_bytes(out, m);
                put_u64(out, s.0.to_bits());
            }),
        }
    }

    /// How many bytes [`Coll::encode`] writes.
    pub fn encoded_len(&self) -> usize {
        let mut len = 1 + 8;
        match &self.data {
            Data::Hash(map) => map.iter().for_each(|(f, v)| len += 8 + f.len() + v.len()),
            Data::List(list) => list.iter().for_each(|v| len += 4 + v.len()),
            Data::Set(set) => set.iter().for_each(|m| len += 4 + m.len()),
            Data::ZSet(z) => z.order.iter().for_each(|(_, m)| len += 4 + m.len() + 8),
        }
        len
    }

    /// Reads what [`Coll::encode`] wrote, refusing what it could not have: an unknown
    /// type, an empty collection, a repeated field or member, a NaN score.
    pub fn decode(reader: &mut Reader<'_>) -> Result<Coll, String> {
        let err = |e: keel_types::codec::CodecError| e.to_string();
        let kind = match reader.u8("collection type").map_err(err)? {
            1 => CollKind::Hash,
            2 => CollKind::List,
            3 => CollKind::Set,
            4 => CollKind::ZSet,
            tag => return Err(format!("collection type {tag}")),
        };
        let count = reader.u64("element count").map_err(err)?;
        if count == 0 || count > reader.remaining() {
            return Err(format!("a collection of {count} elements"));
        }
        let mut coll = Coll::new(kind);
        for _ in 0..count {
            let a = reader.bytes("element", u32::MAX).map_err(err)?;
            let fresh = match kind {
                CollKind::Hash => {
                    let value = reader.bytes("field value", u32::MAX).map_err(err)?;
                    coll.h_insert(a, value).is_none()
                }
                CollKind::List => {
                    coll.l_push(false, a);
                    true
                }
                CollKind::Set => coll.s_insert(a),
                CollKind::ZSet => {
                    let bits = reader.u64("score").map_err(err)?;
                    let score = Score::new(f64::from_bits(bits)).ok_or("a NaN score")?;
                    if score.0.to_bits() != bits {
                        return Err("a score of -0".into());
                    }
                    coll.z_insert(a, score).is_none()
                }
            };
            if !fresh {
                return Err("a field or member held twice".into());
            }
        }
        Ok(coll)
    }
}

fn kind_tag(kind: CollKind) -> u8 {
    match kind {
        CollKind::Hash => 1,
        CollKind::List => 2,
        CollKind::Set => 3,
        CollKind::ZSet => 4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Value {
        Value::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn counts_follow_changes_and_a_snapshot_round_trips() {
        let mut z = Coll::new(CollKind::ZSet);
        z.z_insert(v("b"), Score::new(2.0).unwrap());
        z.z_insert(v("a"), Score::new(2.0).unwrap());
        z.z_insert(v("c"), Score::new(-0.0).unwrap());
        z.z_insert(v("b"), Score::new(1.0).unwrap());
        let members: Vec<_> = z.zset().order().iter().map(|(_, m)| m.clone()).collect();
        assert_eq!(members, vec![v("c"), v("b"), v("a")]);
        let mut out = Vec::new();
        z.encode(&mut out);
        assert_eq!(out.len(), z.encoded_len());
        let back = Coll::decode(&mut Reader::new(&out)).unwrap();
        assert_eq!((back.bytes(), back.hash()), (z.bytes(), z.hash()));
        assert_eq!(back, z);
        for m in ["a", "b", "c"] {
            z.z_remove(m.as_bytes()).unwrap();
        }
        assert_eq!((z.bytes(), z.hash()), (0, 0), "every share taken back out");

        let mut l = Coll::new(CollKind::List);
        for x in ["1", "2", "3", "4"] {
            l.l_push(false, v(x));
        }
        l.l_keep(1, 3);
        l.l_set(0, v("x"));
        assert_eq!(l.list().iter().cloned().collect::<Vec<_>>(), vec![v("x"), v("3")]);
        let mut fresh = Coll::new(CollKind::List);
        fresh.l_push(true, v("3"));
        fresh.l_push(true, v("x"));
        assert_eq!((fresh.bytes(), fresh.hash()), (l.bytes(), l.hash()));
    }

    #[test]
    fn a_forged_collection_is_refused() {
        let mut out = Vec::new();
        put_u8(&mut out, 3);
        put_u64(&mut out, 2);
        put_bytes(&mut out, b"m");
        put_bytes(&mut out, b"m");
        assert!(Coll::decode(&mut Reader::new(&out)).is_err(), "a member twice");
        let mut out = Vec::new();
        put_u8(&mut out, 4);
        put_u64(&mut out, 1);
        put_bytes(&mut out, b"m");
        put_u64(&mut out, f64::NAN.to_bits());
        assert!(Coll::decode(&mut Reader::new(&out)).is_err(), "a NaN score");
        let mut out = Vec::new();
        put_u8(&mut out, 2);
        put_u64(&mut out, u64::MAX);
        assert!(Coll::decode(&mut Reader::new(&out)).is_err(), "a count past the input");
    }
}
