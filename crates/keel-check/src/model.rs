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
#[derive(Debug)]
pub struct Values {
    /// Shared with `ids`, so each value's text is stored once.
    texts: Vec<Rc<str>>,
    ids: HashMap<Rc<str>, Val>,
}

impl Default for Values {
    fn default() -> Self {
        Values::new()
    }
}

impl Values {
    /// An interner holding only "absent".
    pub fn new() -> Values {
        Values { texts: vec![Rc::from("")], ids: HashMap::new() }
    }

    /// The id of `text`, interning it if new.
    pub fn intern(&mut self, text: &str) -> Val {
        if let Some(val) = self.ids.get(text) {
            return *val;
        }
        assert!(self.texts.len() < VALUES_MAX, "more than {VALUES_MAX} distinct values");
        let val = Val(u32::try_from(self.texts.len()).expect("VALUES_MAX fits u32"));
        let shared: Rc<str> = Rc::from(text);
        self.texts.push(Rc::clone(&shared));
        self.ids.insert(shared, val);
        val
    }

    /// The id of an optional value.
    pub fn intern_option(&mut self, text: Option<&str>) -> Val {
        text.map_or(Val::ABSENT, |t| self.intern(t))
    }

    /// The text of a value (`None`: absent).
    pub fn text(&self, val: Val) -> Option<&str> {
        if val == Val::ABSENT {
            return None;
        }
        Some(&self.texts[val.0 as usize])
    }

    /// A value for messages: quoted text, or `absent`.
    pub fn show(&self, val: Val) -> String {
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
    /// Appends text.
    Append(String),
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
            Action::Append { suffix } => Step::Append(suffix.clone()),
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
            Step::Append(suffix) => {
                let mut text = values.text(state).unwrap_or("").to_string();
                text.push_str(suffix);
                Some(values.intern(&text))
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
        step.apply(state, &mut values).map(|v| values.text(v).map(str::to_string))
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
