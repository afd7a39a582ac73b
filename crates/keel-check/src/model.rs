//! Sequential models of one key, and the operation shape every history format is read
//! into before checking.
//!
//! Layout: [`LinOp`] and [`Action`] (what a reader produces); [`Model`] (which actions a
//! model allows and its initial state); [`Values`] (interned values, so a model state is a
//! small integer); [`Step`] and [`Step::apply`] (one sequential step of a model).
//!
//! All three models share one state: the key's value or absent. They differ in the initial
//! state and in the actions they accept:
//!
//! | model      | initial state | actions                           |
//! |------------|---------------|-----------------------------------|
//! | `register` | absent (nil)  | read, write, cas                  |
//! | `kv`       | `""`          | read (get), write (put), append   |
//! | `keel`     | absent        | read, write, delete, cas, incr    |

use crate::fasthash::FastHash;
use std::collections::HashMap;
use std::fmt;
use std::rc::Rc;

/// One operation of one key, in the shape the linearizability checker reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinOp {
    /// Names the operation in reports: the op id for Keel histories, the line of the
    /// invocation for Jepsen logs.
    pub id: u64,
    /// The client (process) that issued it.
    pub client: u64,
    /// The key (one key per object; P-compositionality splits by it).
    pub key: String,
    /// What it did and what came back.
    pub action: Action,
    /// When it was invoked.
    pub invoke: u64,
    /// When it completed; `None` when its outcome is unknown (returns at +infinity: it may
    /// take effect at any point after `invoke`, or never).
    pub complete: Option<u64>,
}

/// An operation on one key and its observed result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Read the value; `result` is what came back (`None`: absent / nil).
    Read {
        /// The value returned.
        result: Option<String>,
    },
    /// Set the value.
    Write {
        /// The value written.
        value: String,
    },
    /// Remove the key.
    Delete,
    /// Compare-and-set.
    Cas {
        /// The value required (`None`: absent).
        expected: Option<String>,
        /// The value written when it swaps.
        value: String,
        /// `Some(true)`: swapped; `Some(false)`: did not swap (saw another value);
        /// `None`: unknown.
        swapped: Option<bool>,
    },
    /// Concatenate to the value (absent counts as `""`).
    Append {
        /// The suffix.
        suffix: String,
    },
    /// Add to the integer value (absent counts as 0).
    Incr {
        /// The amount added.
        delta: i64,
        /// The value after, when known.
        result: Option<i64>,
    },
}

impl Action {
    /// The action's name in messages.
    pub fn name(&self) -> &'static str {
        match self {
            Action::Read { .. } => "read",
            Action::Write { .. } => "write",
            Action::Delete => "delete",
            Action::Cas { .. } => "cas",
            Action::Append { .. } => "append",
            Action::Incr { .. } => "incr",
        }
    }
}

/// A sequential specification of one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum)]
pub enum Model {
    /// read / write / cas; starts absent (Jepsen's etcd register).
    Register,
    /// get / put / append; starts `""` (Jepsen's kv test).
    Kv,
    /// Keel: get / put / delete / cas / incr; starts absent; incr on absent counts from 0.
    Keel,
}

impl Model {
    /// The model's name on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Model::Register => "register",
            Model::Kv => "kv",
            Model::Keel => "keel",
        }
    }

    /// Whether the model has the action.
    pub fn allows(self, action: &Action) -> bool {
        match self {
            Model::Register => {
                matches!(action, Action::Read { .. } | Action::Write { .. } | Action::Cas { .. })
            }
            Model::Kv => {
                matches!(action, Action::Read { .. } | Action::Write { .. } | Action::Append { .. })
            }
            Model::Keel => !matches!(action, Action::Append { .. }),
        }
    }

    /// The initial state of every key.
    pub fn initial(self, values: &mut Values) -> Val {
        match self {
            Model::Register | Model::Keel => Val::ABSENT,
            Model::Kv => values.intern(""),
        }
    }
}

impl fmt::Display for Model {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An interned value: absent, or an index into [`Values`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Val(pub u32);

impl Val {
    /// The key holds no value.
    pub const ABSENT: Val = Val(0);
}

/// The most distinct values one check may intern (appends and increments create new
/// ones during the search; the search budget bounds them too).
pub const VALUES_MAX: usize = 1 << 30;

/// Interned values. Index 0 is "absent".
///
/// A value an append builds is kept as its base value and the appended text until its
/// text is asked for, so an append costs O(1) rather than a copy of the whole value: each
/// value carries a polynomial hash and the length of its text, computed from its base's,
/// and two values are the same value exactly when their texts are (a hash match is
/// confirmed by comparing texts, so a collision costs time, never a wrong verdict).
#[derive(Debug)]
pub struct Values {
    reprs: Vec<Repr>,
    /// Per value: the hash and length of its text.
    sigs: Vec<(u64, usize)>,
    /// The latest value with each hash and length of text ...
    ids: HashMap<(u64, usize), Val, FastHash>,
    /// ... and per value, the one before it with the same (`NO_VAL`: none).
    same_sig: Vec<Val>,
    /// Texts built for values held as appends.
    built: HashMap<Val, Rc<str>, FastHash>,
}

/// Ends a chain of [`Values::same_sig`].
const NO_VAL: Val = Val(u32::MAX);

/// How a value is held.
#[derive(Clone, Debug)]
enum Repr {
    /// Its text.
    Text(Rc<str>),
    /// A base value and the text appended to it.
    Append(Val, Rc<str>),
}

/// The multiplier of the polynomial hash of a value's text.
const HASH_BASE: u64 = 0x0000_0100_0000_01b3;

/// The hash of `text` and `HASH_BASE` to the power of its length.
fn text_hash(text: &str) -> (u64, u64) {
    text.bytes().fold((0, 1), |(hash, power), byte| {
        (hash.wrapping_mul(HASH_BASE).wrapping_add(u64::from(byte)), power.wrapping_mul(HASH_BASE))
    })
}

impl Default for Values {
    fn default() -> Self {
        Values::new()
    }
}

impl Values {
    /// An interner holding only "absent".
    pub fn new() -> Values {
        Values {
            reprs: vec![Repr::Text(Rc::from(""))],
            sigs: vec![(0, 0)],
            ids: HashMap::default(),
            same_sig: vec![NO_VAL],
            built: HashMap::default(),
        }
    }

    fn push(&mut self, repr: Repr, sig: (u64, usize)) -> Val {
        assert!(self.reprs.len() < VALUES_MAX, "more than {VALUES_MAX} distinct values");
        let val = Val(u32::try_from(self.reprs.len()).expect("VALUES_MAX fits u32"));
        self.reprs.push(repr);
        self.sigs.push(sig);
        let before = self.ids.insert(sig, val).unwrap_or(NO_VAL);
        self.same_sig.push(before);
        val
    }

    /// The id of `text`, interning it if new.
    pub fn intern(&mut self, text: &str) -> Val {
        let sig = (text_hash(text).0, text.len());
        let mut at = self.ids.get(&sig).copied().unwrap_or(NO_VAL);
        while at != NO_VAL {
            if self.text(at).as_deref() == Some(text) {
                return at;
            }
            at = self.same_sig[at.0 as usize];
        }
        self.push(Repr::Text(Rc::from(text)), sig)
    }

    /// The id of `base` with `suffix` appended; `suffix_hash` is [`text_hash`] of it.
    fn append(&mut self, base: Val, suffix: &Rc<str>, suffix_hash: (u64, u64)) -> Val {
        let (hash, len) = self.sigs[base.0 as usize];
        let sig =
            (hash.wrapping_mul(suffix_hash.1).wrapping_add(suffix_hash.0), len + suffix.len());
        let mut at = self.ids.get(&sig).copied().unwrap_or(NO_VAL);
        while at != NO_VAL {
            if self.equals_append(at, base, suffix) {
                return at;
            }
            at = self.same_sig[at.0 as usize];
        }
        self.push(Repr::Append(base, Rc::clone(suffix)), sig)
    }

    /// Whether value `val`'s text is `base`'s text followed by `suffix`: at once when
    /// `val` was built that way, else by comparing texts.
    fn equals_append(&mut self, val: Val, base: Val, suffix: &Rc<str>) -> bool {
        if let Repr::Append(b, s) = &self.reprs[val.0 as usize] {
            if *b == base && (Rc::ptr_eq(s, suffix) || **s == **suffix) {
                return true;
            }
        }
        let (Some(whole), Some(base)) = (self.text(val), self.text(base)) else { return false };
        whole.len() == base.len() + suffix.len()
            && whole.starts_with(&*base)
            && whole.ends_with(&**suffix)
    }

    /// The hash and length of a value's text ([`Values::prefix_hashes`] of it ends
    /// with the hash).
    pub fn sig(&self, val: Val) -> (u64, usize) {
        self.sigs[val.0 as usize]
    }

    /// The hash of each prefix of a value's text, by length (`len + 1` entries): value
    /// `v` may be a prefix of it only if `prefix_hashes[len(v)]` is `v`'s hash.
    pub fn prefix_hashes(&mut self, val: Val) -> Vec<u64> {
        let text = self.text(val).unwrap_or_else(|| Rc::from(""));
        let mut out = Vec::with_capacity(text.len() + 1);
        out.push(0);
        let mut hash = 0u64;
        for byte in text.bytes() {
            hash = hash.wrapping_mul(HASH_BASE).wrapping_add(u64::from(byte));
            out.push(hash);
        }
        out
    }

    /// The id of an optional value.
    pub fn intern_option(&mut self, text: Option<&str>) -> Val {
        text.map_or(Val::ABSENT, |t| self.intern(t))
    }

    /// The text of a value (`None`: absent), built and kept the first time it is asked
    /// for.
    pub fn text(&mut self, val: Val) -> Option<Rc<str>> {
        if val == Val::ABSENT {
            return None;
        }
        let mut chain = Vec::new();
        let mut at = val;
        let root = loop {
            if let Some(text) = self.built.get(&at) {
                break Rc::clone(text);
            }
            match &self.reprs[at.0 as usize] {
                Repr::Text(text) => break Rc::clone(text),
                Repr::Append(base, suffix) => {
                    chain.push((at, Rc::clone(suffix)));
                    at = *base;
                }
            }
        };
        let mut text = root.to_string();
        let mut last = root;
        for (built, suffix) in chain.into_iter().rev() {
            text.push_str(&suffix);
            last = Rc::from(text.as_str());
            self.built.insert(built, Rc::clone(&last));
        }
        Some(last)
    }

    /// A value for messages: quoted text, or `absent`.
    pub fn show(&mut self, val: Val) -> String {
        match self.text(val) {
            None => "absent".to_string(),
            Some(t) => format!("{t:?}"),
        }
    }
}

/// An action with its values interned: what the search applies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Must see this value; leaves it.
    Read(Val),
    /// Sets this value (absent for a delete).
    Write(Val),
    /// Compare-and-set with a known or unknown outcome.
    Cas {
        /// Required value.
        expected: Val,
        /// New value.
        value: Val,
        /// Known outcome, if any.
        swapped: Option<bool>,
    },
    /// Appends text (with its [`text_hash`]).
    Append(Rc<str>, (u64, u64)),
    /// Adds to an integer.
    Incr {
        /// Amount.
        delta: i64,
        /// Known result, if any.
        result: Option<i64>,
    },
}

impl Step {
    /// Interns the values of `action`.
    pub fn compile(action: &Action, values: &mut Values) -> Step {
        match action {
            Action::Read { result } => Step::Read(values.intern_option(result.as_deref())),
            Action::Write { value } => Step::Write(values.intern(value)),
            Action::Delete => Step::Write(Val::ABSENT),
            Action::Cas { expected, value, swapped } => Step::Cas {
                expected: values.intern_option(expected.as_deref()),
                value: values.intern(value),
                swapped: *swapped,
            },
            Action::Append { suffix } => Step::Append(Rc::from(suffix.as_str()), text_hash(suffix)),
            Action::Incr { delta, result } => Step::Incr { delta: *delta, result: *result },
        }
    }

    /// Applies the step to `state`: the next state, or `None` when the observed result is
    /// impossible from `state`.
    pub fn apply(&self, state: Val, values: &mut Values) -> Option<Val> {
        match self {
            Step::Read(seen) => (*seen == state).then_some(state),
            Step::Write(value) => Some(*value),
            Step::Cas { expected, value, swapped } => {
                let holds = *expected == state;
                match swapped {
                    Some(true) => holds.then_some(*value),
                    Some(false) => (!holds).then_some(state),
                    None => Some(if holds { *value } else { state }),
                }
            }
            Step::Append(suffix, hash) => {
                let base = if state == Val::ABSENT { values.intern("") } else { state };
                Some(values.append(base, suffix, *hash))
            }
            Step::Incr { delta, result } => {
                let base = match values.text(state) {
                    None => 0,
                    Some(text) => text.parse::<i64>().ok()?,
                };
                let after = base.checked_add(*delta)?;
                if result.is_some_and(|r| r != after) {
                    return None;
                }
                Some(values.intern(&after.to_string()))
            }
        }
    }
}

impl fmt::Display for LinOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |v: &Option<String>| match v {
            None => "absent".to_string(),
            Some(t) => format!("{t:?}"),
        };
        write!(f, "#{} client {} ", self.id, self.client)?;
        match &self.action {
            Action::Read { result } => write!(f, "read({:?}) -> {}", self.key, show(result))?,
            Action::Write { value } => write!(f, "write({:?}, {value:?})", self.key)?,
            Action::Delete => write!(f, "delete({:?})", self.key)?,
            Action::Cas { expected, value, swapped } => {
                let outcome = match swapped {
                    Some(true) => "swapped",
                    Some(false) => "did not swap",
                    None => "unknown",
                };
                write!(f, "cas({:?}, {} -> {value:?}) -> {outcome}", self.key, show(expected))?;
            }
            Action::Append { suffix } => write!(f, "append({:?}, {suffix:?})", self.key)?,
            Action::Incr { delta, result } => match result {
                Some(r) => write!(f, "incr({:?}, {delta}) -> {r}", self.key)?,
                None => write!(f, "incr({:?}, {delta})", self.key)?,
            },
        }
        match self.complete {
            Some(c) => write!(f, " [{}, {}]", self.invoke, c),
            None => write!(f, " [{}, unknown]", self.invoke),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(action: Action, state: Option<&str>) -> Option<Option<String>> {
        let mut values = Values::new();
        let state = values.intern_option(state);
        let step = Step::compile(&action, &mut values);
        step.apply(state, &mut values).map(|v| values.text(v).map(|t| t.to_string()))
    }

    #[test]
    fn read_must_see_state() {
        assert!(apply(Action::Read { result: Some("a".into()) }, Some("a")).is_some());
        assert!(apply(Action::Read { result: Some("a".into()) }, Some("b")).is_none());
        assert!(apply(Action::Read { result: None }, None).is_some());
        assert!(apply(Action::Read { result: None }, Some("")).is_none());
    }

    #[test]
    fn cas_outcomes() {
        let cas = |swapped| Action::Cas { expected: Some("a".into()), value: "b".into(), swapped };
        assert_eq!(apply(cas(Some(true)), Some("a")), Some(Some("b".into())));
        assert_eq!(apply(cas(Some(true)), Some("c")), None);
        assert_eq!(apply(cas(Some(false)), Some("c")), Some(Some("c".into())));
        assert_eq!(apply(cas(Some(false)), Some("a")), None);
        assert_eq!(apply(cas(None), Some("a")), Some(Some("b".into())));
        assert_eq!(apply(cas(None), None), Some(None));
    }

    #[test]
    fn incr_counts_from_zero_and_checks_result() {
        assert_eq!(apply(Action::Incr { delta: 2, result: Some(2) }, None), Some(Some("2".into())));
        assert_eq!(apply(Action::Incr { delta: 2, result: Some(3) }, None), None);
        assert_eq!(
            apply(Action::Incr { delta: -1, result: None }, Some("5")),
            Some(Some("4".into()))
        );
        assert_eq!(apply(Action::Incr { delta: 1, result: None }, Some("x")), None);
        assert_eq!(
            apply(Action::Incr { delta: 1, result: None }, Some(&i64::MAX.to_string())),
            None
        );
    }

    #[test]
    fn append_and_delete() {
        assert_eq!(
            apply(Action::Append { suffix: "y".into() }, Some("x")),
            Some(Some("xy".into()))
        );
        assert_eq!(apply(Action::Append { suffix: "y".into() }, None), Some(Some("y".into())));
        assert_eq!(apply(Action::Delete, Some("x")), Some(None));
    }

    #[test]
    fn models_allow_their_actions_only() {
        assert!(Model::Register.allows(&Action::Cas {
            expected: None,
            value: "1".into(),
            swapped: None
        }));
        assert!(!Model::Register.allows(&Action::Delete));
        assert!(Model::Kv.allows(&Action::Append { suffix: String::new() }));
        assert!(!Model::Keel.allows(&Action::Append { suffix: String::new() }));
        assert!(!Model::Kv.allows(&Action::Incr { delta: 1, result: None }));
    }
}
