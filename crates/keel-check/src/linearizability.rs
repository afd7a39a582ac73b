//! The linearizability checker: a Wing & Gong / Lowe search with memoization, as in
//! Porcupine, run separately for each key (P-compositionality).
//!
//! Layout: [`check`] splits a history by key and combines the per-key verdicts;
//! [`Search`] is the search over one key; [`Counterexample`] is what a violation reports.
//!
//! The search keeps the key's invocation and completion events in one time-ordered,
//! doubly linked list. It repeatedly tries to linearize next an operation whose invocation
//! comes before the first completion still in the list ("minimal" operations); on success
//! it removes the operation's two events (lift) and pushes a frame; when the first
//! completion is reached without success, it pops the last frame and puts its events back
//! (unlift). A set of (linearized-operations bitset, model state) pairs already explored
//! cuts repeated work, with subsumption for unknown-outcome ops (see `Explored`). There
//! is no recursion: the frames live on an explicit stack.
//!
//! Operations with unknown outcome have no completion event: they may be linearized at
//! any point after their invocation, and need not be linearized at all. The search ends
//! with success when every completed operation is linearized. Two sound cuts keep them
//! from multiplying the search (subsumption in `Explored`; no blind write right after
//! one, in `Search::run`), and the search runs in two candidate orders in turn
//! ([`Order`]), each with half the budget.
//!
//! Before searching, a value test (`unproducible_read`) reports a read whose value
//! nothing could have produced.
//!
//! Events at equal times: invocations sort before completions, so an operation that
//! completes at `t` and one invoked at `t` are concurrent.

use crate::fasthash::FastHash;
use crate::model::{Action, LinOp, Model, Step, Val, Values};
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, HashSet};

/// The default search budget: steps per key before giving up with `unknown`.
pub const BUDGET_STEPS_DEFAULT: u64 = 2_000_000;
/// List entries the search may pass over (without trying them) per step of budget: a
/// bound on the cheap part of the work, which the budget does not count.
pub const SCAN_PER_STEP_MAX: u64 = 64;
/// How many operations of the longest linearized prefix a counterexample shows.
pub const PREFIX_SHOWN_MAX: usize = 10;
/// The first pass over the keys gets this share (1/n) of the budget (see [`check`]).
const FIRST_PASS_SHARE: u64 = 16;
/// How many completions ahead the kv model's dead-state test looks (`Search::dead`).
const DEAD_READS_MAX: usize = 8;
/// How many operations that could not be placed a counterexample shows.
pub const STUCK_SHOWN_MAX: usize = 10;

/// Settings of a check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Search steps allowed per key (one step tries one op or backtracks once); past it
    /// the key's verdict is `unknown`.
    pub budget_steps: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config { budget_steps: BUDGET_STEPS_DEFAULT }
    }
}

/// The verdict on a whole history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every key has a linearization.
    Linearizable,
    /// Some key has none; the first such key (in key order) is described.
    NotLinearizable(Box<Counterexample>),
    /// No key was found non-linearizable, but some key ran out of budget.
    Unknown {
        /// The first key (in key order) whose search ran out of budget.
        key: String,
        /// The budget it exhausted.
        budget_steps: u64,
    },
}

impl Verdict {
    /// The verdict's name on the command line.
    pub fn name(&self) -> &'static str {
        match self {
            Verdict::Linearizable => "linearizable",
            Verdict::NotLinearizable(_) => "not-linearizable",
            Verdict::Unknown { .. } => "unknown",
        }
    }
}

/// Why a key has no linearization.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counterexample {
    /// The key.
    pub key: String,
    /// The length of the longest linearized prefix the search found.
    pub prefix_len: usize,
    /// The last operations of that prefix (at most [`PREFIX_SHOWN_MAX`]), in order.
    pub prefix_tail: Vec<LinOp>,
    /// The model state after that prefix, for humans (`absent` or a quoted value).
    pub state: String,
    /// Operations that could come next (invoked before the first pending completion) but
    /// could not be placed there: none extends the prefix to a full linearization. Each
    /// with the reason (impossible result from this state, or a dead end further on).
    pub stuck: Vec<(LinOp, String)>,
}

impl std::fmt::Display for Counterexample {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "key {:?}: no linearization extends a prefix of {} operations",
            self.key, self.prefix_len
        )?;
        if self.prefix_len > self.prefix_tail.len() {
            writeln!(f, "  ... {} earlier operations", self.prefix_len - self.prefix_tail.len())?;
        }
        for op in &self.prefix_tail {
            writeln!(f, "  linearized: {op}")?;
        }
        writeln!(f, "  state then: {}", self.state)?;
        for (op, why) in &self.stuck {
            writeln!(f, "  cannot be next: {op} ({why})")?;
        }
        Ok(())
    }
}

/// The result of checking one history, with its size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// The verdict.
    pub verdict: Verdict,
    /// Keys checked.
    pub keys: usize,
    /// Operations checked.
    pub ops: usize,
    /// Search steps taken over all keys.
    pub steps: u64,
}

/// Checks a history against `model`, key by key. Every op's action must be one `model`
/// has (callers check with [`Model::allows`]; violating that is a programmer error).
pub fn check(model: Model, ops: &[LinOp], config: Config) -> Report {
    assert!(config.budget_steps > 0, "a search needs a budget");
    let mut by_key: BTreeMap<&str, Vec<&LinOp>> = BTreeMap::new();
    for op in ops {
        assert!(model.allows(&op.action), "model {model} has no {}", op.action.name());
        by_key.entry(op.key.as_str()).or_default().push(op);
    }
    let mut report =
        Report { verdict: Verdict::Linearizable, keys: by_key.len(), ops: ops.len(), steps: 0 };
    // Two passes: every key first with a sixteenth of the budget, then the keys that need
    // more with the rest. A violation anywhere ends the check, so one that is quick to
    // refute is not found only after another key has spent its whole budget.
    let first_budget = (config.budget_steps / FIRST_PASS_SHARE).max(1);
    let mut deferred = Vec::new();
    for (key, key_ops) in &by_key {
        let (outcome, steps) = match unproducible_read(model, key_ops) {
            Some(read) => (Outcome::Illegal(Box::new(unproducible_counterexample(read))), 0),
            None => search_both_orders(model, key_ops, first_budget),
        };
        report.steps += steps;
        match outcome {
            Outcome::Linearizable => {}
            Outcome::Illegal(counterexample) => {
                report.verdict = Verdict::NotLinearizable(counterexample);
                return report;
            }
            Outcome::OutOfBudget => deferred.push((*key, key_ops)),
        }
    }
    let rest = config.budget_steps.saturating_sub(first_budget);
    for (key, key_ops) in deferred {
        let (outcome, steps) = if rest == 0 {
            (Outcome::OutOfBudget, 0)
        } else {
            search_both_orders(model, key_ops, rest)
        };
        report.steps += steps;
        match outcome {
            Outcome::Linearizable => {}
            Outcome::Illegal(counterexample) => {
                report.verdict = Verdict::NotLinearizable(counterexample);
                return report;
            }
            Outcome::OutOfBudget => {
                if report.verdict == Verdict::Linearizable {
                    report.verdict = Verdict::Unknown {
                        key: key.to_string(),
                        budget_steps: config.budget_steps,
                    };
                }
            }
        }
    }
    report
}

/// A completed read whose value neither the initial state nor any operation invoked
/// before the read completed could have produced.
///
/// A cheap and sound test (an over-approximation of the values a key can hold) run
/// before the search: such a read fails in every state, and finding that out by search
/// alone means trying every placement of the operations before it, which is exponential
/// when many outcomes are unknown.
fn unproducible_read<'a>(model: Model, ops: &[&'a LinOp]) -> Option<&'a LinOp> {
    let initial = if model == Model::Kv { Some("") } else { None };
    let mut first_write: HashMap<&str, u64> = HashMap::new();
    let mut first_delete = u64::MAX;
    let mut first_incr = u64::MAX;
    let mut appends: Vec<(&str, u64)> = Vec::new();
    for op in ops {
        match &op.action {
            Action::Write { value } | Action::Cas { value, swapped: Some(true) | None, .. } => {
                let first = first_write.entry(value.as_str()).or_insert(u64::MAX);
                *first = (*first).min(op.invoke);
            }
            Action::Delete => first_delete = first_delete.min(op.invoke),
            Action::Incr { .. } => first_incr = first_incr.min(op.invoke),
            Action::Append { suffix } => appends.push((suffix.as_str(), op.invoke)),
            Action::Read { .. } | Action::Cas { swapped: Some(false), .. } => {}
        }
    }
    ops.iter().copied().find(|read| {
        let (Action::Read { result }, Some(complete)) = (&read.action, read.complete) else {
            return false;
        };
        let producible = match result.as_deref() {
            value if value == initial => true,
            None => first_delete <= complete,
            Some(value) => {
                first_write.get(value).is_some_and(|&t| t <= complete)
                    || (first_incr <= complete && value.parse::<i64>().is_ok())
                    || appends.iter().any(|&(suffix, t)| t <= complete && value.ends_with(suffix))
            }
        };
        !producible
    })
}

fn unproducible_counterexample(read: &LinOp) -> Counterexample {
    Counterexample {
        key: read.key.clone(),
        prefix_len: 0,
        prefix_tail: Vec::new(),
        state: "any".to_string(),
        stuck: vec![(
            read.clone(),
            "no operation invoked before it completed, nor the initial state, could have \
             produced this value"
                .to_string(),
        )],
    }
}

/// Runs the search with completed ops tried first, then, if that ran out of its half of
/// the budget, in time order with the other half (one run in time order with the whole
/// budget when every op completed).
///
/// Both orders are complete searches and reach the same verdict; each has histories on
/// which it wanders (time order tries unknown-outcome ops eagerly, completed-first tries
/// them late), so the pair settles more histories within a budget than either alone.
fn search_both_orders(model: Model, ops: &[&LinOp], budget_steps: u64) -> (Outcome, u64) {
    if ops.iter().all(|op| op.complete.is_some()) {
        // Without unknown-outcome ops the two orders are the same: one run, whole budget.
        return Search::new(model, ops).run(budget_steps, Order::Time);
    }
    let first_budget = (budget_steps / 2).max(1);
    let (outcome, steps) = Search::new(model, ops).run(first_budget, Order::CompletedFirst);
    let second_budget = budget_steps.saturating_sub(first_budget);
    if !matches!(outcome, Outcome::OutOfBudget) || second_budget == 0 {
        return (outcome, steps);
    }
    let (outcome, more) = Search::new(model, ops).run(second_budget, Order::Time);
    (outcome, steps + more)
}

/// The order in which candidates for the next linearized op are tried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Order {
    /// Completed ops first, then unknown-outcome ops (never required, so tried last).
    CompletedFirst,
    /// Invocation order.
    Time,
}

/// The outcome of one key's search.
enum Outcome {
    Linearizable,
    Illegal(Box<Counterexample>),
    OutOfBudget,
}

/// Marks the end of the event list and "no completion event".
const NIL: u32 = u32::MAX;
/// The list head sentinel's node number.
const HEAD: u32 = 0;

/// One linearized operation on the stack: its call node and the state before it.
struct Frame {
    node: u32,
    state_before: Val,
    /// The scan phase it was chosen in (see [`Search::run`]).
    unknown_phase: bool,
    /// Whether the op before it had an unknown outcome.
    after_unknown_before: bool,
    /// Linearized as an observer that matched (see [`Search::run`]): its node had no
    /// other choice worth trying.
    forced: bool,
}

/// The moving parts of one run of the search.
struct Walk {
    linearized: Linearized,
    explored: Explored,
    stack: Vec<Frame>,
    /// The call nodes of the longest linearized prefix seen, for the counterexample.
    best: Vec<u32>,
    state: Val,
    /// The list node being considered.
    entry: u32,
    /// In completed-first order: whether the scan is in its unknown-outcome phase.
    unknown_phase: bool,
    /// Whether the scan is looking for a matching observer first (at a new node).
    observers_first: bool,
    /// Completed ops not yet linearized.
    remaining: usize,
    /// Ops `first_unknown..` have unknown outcomes.
    first_unknown: usize,
}

/// The search over one key's operations.
struct Search<'a> {
    ops: Vec<&'a LinOp>,
    steps_compiled: Vec<Step>,
    values: Values,
    initial: Val,
    /// Node 0 is the head; node 2i+1 is op i's call, 2i+2 its completion; the tail is last.
    next: Vec<u32>,
    prev: Vec<u32>,
    tail: u32,
    /// Results of increments already computed, per (op, state).
    transitions: HashMap<(u32, Val), Option<Val>, FastHash>,
    /// For the kv model: per op, the prefix hashes of the value a completed read saw
    /// (see [`Search::dead`]).
    read_prefixes: Vec<Option<Vec<u64>>>,
    /// [`Search::dead`]'s list of puts, kept between calls (no allocation per step).
    puts: Vec<Val>,
}

/// Which operations are linearized: completed ones and unknown-outcome ones apart (ops
/// are numbered completed first), so that the explored set can compare the latter.
struct Linearized {
    complete: Vec<u64>,
    unknown: Vec<u64>,
    first_unknown: usize,
    /// The bit of `unknown` past the unknown-outcome ops, set when the last op linearized
    /// has an unknown outcome. It is part of the node: from such a node a blind write is
    /// not tried (see [`Search::run`]), so the node can do less than one without the bit,
    /// which the subset test of [`Explored`] then orders correctly.
    flag_bit: usize,
}

impl Linearized {
    fn new(ops: usize, first_unknown: usize) -> Linearized {
        assert!(first_unknown <= ops);
        Linearized {
            complete: vec![0; first_unknown.div_ceil(64)],
            // One more bit: "the last op linearized has an unknown outcome".
            unknown: vec![0; (ops - first_unknown + 1).div_ceil(64)],
            first_unknown,
            flag_bit: ops - first_unknown,
        }
    }

    /// Whether the last op linearized has an unknown outcome.
    fn after_unknown(&self) -> bool {
        self.unknown[self.flag_bit / 64] & (1 << (self.flag_bit % 64)) != 0
    }

    fn set_after_unknown(&mut self, after_unknown: bool) {
        let word = &mut self.unknown[self.flag_bit / 64];
        if after_unknown {
            *word |= 1 << (self.flag_bit % 64);
        } else {
            *word &= !(1 << (self.flag_bit % 64));
        }
    }

    fn word(&mut self, op: usize) -> (&mut u64, u64) {
        if op < self.first_unknown {
            (&mut self.complete[op / 64], 1 << (op % 64))
        } else {
            let i = op - self.first_unknown;
            (&mut self.unknown[i / 64], 1 << (i % 64))
        }
    }

    fn set(&mut self, op: usize) {
        let (word, bit) = self.word(op);
        debug_assert!(*word & bit == 0, "op linearized twice");
        *word |= bit;
    }

    fn clear(&mut self, op: usize) {
        let (word, bit) = self.word(op);
        debug_assert!(*word & bit != 0, "op not linearized");
        *word &= !bit;
    }
}

fn small(words: &[u64]) -> u128 {
    debug_assert!(words.len() <= 2);
    let low = u128::from(words.first().copied().unwrap_or(0));
    let high = u128::from(words.get(1).copied().unwrap_or(0));
    low | (high << 64)
}

fn is_subset(a: &[u64], b: &[u64]) -> bool {
    a.iter().zip(b).all(|(x, y)| x & !y == 0)
}

/// A bitset held inline, of two or four words.
trait Bits: Copy {
    fn subset_of(&self, other: &Self) -> bool;
}

impl Bits for u128 {
    fn subset_of(&self, other: &Self) -> bool {
        *self & !*other == 0
    }
}

impl Bits for Medium {
    fn subset_of(&self, other: &Self) -> bool {
        is_subset(self, other)
    }
}

/// Unknown-outcome sets explored for one (completed set, state), none a subset of
/// another. Nearly always one set, kept inline.
enum Antichain<T> {
    One(T),
    Many(Vec<T>),
}

impl<T: Bits> Antichain<T> {
    /// Adds `u` unless a kept set is a subset of it (then false); drops kept supersets.
    fn insert(&mut self, u: T) -> bool {
        match self {
            Antichain::One(k) if k.subset_of(&u) => false,
            Antichain::One(k) if u.subset_of(k) => {
                *k = u;
                true
            }
            Antichain::One(k) => {
                *self = Antichain::Many(vec![*k, u]);
                true
            }
            Antichain::Many(kept) => {
                if kept.iter().any(|k| k.subset_of(&u)) {
                    return false;
                }
                kept.retain(|k| !u.subset_of(k));
                kept.push(u);
                true
            }
        }
    }
}

/// Bitset words (for the large explored set).
type Words = Box<[u64]>;

/// Words of a bitset of the medium explored set (up to 256 operations), inline.
const MEDIUM_WORDS: usize = 4;
type Medium = [u64; MEDIUM_WORDS];

fn medium(words: &[u64]) -> Medium {
    let mut out = [0; MEDIUM_WORDS];
    out[..words.len()].copy_from_slice(words);
    out
}

/// Adds unknown-outcome set `u` under `key` of an inline explored map; false if a kept
/// set subsumes it.
fn insert_inline<T: Bits + Eq + std::hash::Hash>(
    map: &mut HashMap<(T, u32), Antichain<T>, FastHash>,
    key: (T, u32),
    u: T,
) -> bool {
    match map.entry(key) {
        Entry::Vacant(slot) => {
            slot.insert(Antichain::One(u));
            true
        }
        Entry::Occupied(mut slot) => slot.get_mut().insert(u),
    }
}

/// The search nodes already explored, with subsumption.
///
/// A node is (completed ops linearized, unknown-outcome ops linearized, state). Node
/// (C, U, s) subsumes (C, U', s) when U is a subset of U': the latter can do nothing the
/// former cannot, since an unknown-outcome op not yet linearized may still be linearized
/// or left out. So for each (C, s) the explored U sets are kept as an antichain and a new
/// node is pruned when some kept U is a subset of its own. Without unknown-outcome ops this
/// is plain memoization of (C, s). Up to 128 ops of each kind the sets are stored inline;
/// up to 256, in fixed arrays (no allocation per node); beyond, as boxed words looked up
/// without allocating.
#[derive(Default)]
struct Explored {
    /// Without unknown-outcome ops there is nothing to subsume: plain sets of (completed
    /// ops, state), half the memory of the maps below (the search is bound by memory).
    plain_small: HashSet<(u128, u32), FastHash>,
    plain_medium: HashSet<(Medium, u32), FastHash>,
    /// Whether the key has unknown-outcome ops.
    unknowns: bool,
    small: HashMap<(u128, u32), Antichain<u128>, FastHash>,
    medium: HashMap<(Medium, u32), Antichain<Medium>, FastHash>,
    large: HashMap<Words, Vec<Words>, FastHash>,
    scratch: Vec<u64>,
}

impl Explored {
    /// Records the node; false if an explored node subsumes it.
    fn insert(&mut self, linearized: &Linearized, state: Val) -> bool {
        let (complete, unknown) = (&linearized.complete, &linearized.unknown);
        if !self.unknowns && complete.len() <= 2 {
            return self.plain_small.insert((small(complete), state.0));
        }
        if !self.unknowns && complete.len() <= MEDIUM_WORDS {
            return self.plain_medium.insert((medium(complete), state.0));
        }
        if complete.len() <= 2 && unknown.len() <= 2 {
            return insert_inline(&mut self.small, (small(complete), state.0), small(unknown));
        }
        if complete.len() <= MEDIUM_WORDS && unknown.len() <= MEDIUM_WORDS {
            let key = (medium(complete), state.0);
            return insert_inline(&mut self.medium, key, medium(unknown));
        }
        self.scratch.clear();
        self.scratch.extend_from_slice(complete);
        self.scratch.push(u64::from(state.0));
        if let Some(kept) = self.large.get_mut(self.scratch.as_slice()) {
            if kept.iter().any(|k| is_subset(k, unknown)) {
                return false;
            }
            kept.retain(|k| !is_subset(unknown, k));
            kept.push(unknown.clone().into_boxed_slice());
            return true;
        }
        self.large.insert(
            self.scratch.clone().into_boxed_slice(),
            vec![unknown.clone().into_boxed_slice()],
        );
        true
    }
}

impl<'a> Search<'a> {
    fn new(model: Model, ops: &[&'a LinOp]) -> Search<'a> {
        assert!(ops.len() < (u32::MAX / 2 - 2) as usize, "too many operations on one key");
        // Completed ops first: the explored set keeps the two kinds apart.
        let mut ops = ops.to_vec();
        ops.sort_by_key(|op| op.complete.is_none());
        let mut values = Values::new();
        let initial = model.initial(&mut values);
        let steps_compiled = ops.iter().map(|op| Step::compile(&op.action, &mut values)).collect();
        let tail = u32::try_from(2 * ops.len() + 1).expect("bounded above");
        let mut search = Search {
            ops,
            steps_compiled,
            values,
            initial,
            next: vec![NIL; tail as usize + 1],
            prev: vec![NIL; tail as usize + 1],
            tail,
            transitions: HashMap::default(),
            read_prefixes: Vec::new(),
            puts: Vec::new(),
        };
        if model == Model::Kv {
            for op in 0..search.ops.len() {
                let prefixes = match search.steps_compiled[op] {
                    Step::Read(seen) if search.ops[op].complete.is_some() => {
                        Some(search.values.prefix_hashes(seen))
                    }
                    _ => None,
                };
                search.read_prefixes.push(prefixes);
            }
        }
        search.link_events();
        search
    }

    /// Builds the time-ordered event list (invocations before completions at equal times).
    fn link_events(&mut self) {
        let mut events: Vec<(u64, u8, u32)> = Vec::with_capacity(2 * self.ops.len());
        for (i, op) in self.ops.iter().enumerate() {
            let i = i as u32;
            events.push((op.invoke, 0, 2 * i + 1));
            if let Some(complete) = op.complete {
                assert!(complete >= op.invoke, "op {} completes before it is invoked", op.id);
                events.push((complete, 1, 2 * i + 2));
            }
        }
        events.sort_unstable();
        let mut last = HEAD;
        for &(_, _, node) in &events {
            self.next[last as usize] = node;
            self.prev[node as usize] = last;
            last = node;
        }
        self.next[last as usize] = self.tail;
        self.prev[self.tail as usize] = last;
    }

    fn op_of(node: u32) -> usize {
        debug_assert!(node != HEAD);
        ((node - 1) / 2) as usize
    }

    fn is_call(&self, node: u32) -> bool {
        node != self.tail && node % 2 == 1
    }

    fn completion_of(&self, op: usize) -> Option<u32> {
        self.ops[op].complete.map(|_| 2 * op as u32 + 2)
    }

    fn unlink(&mut self, node: u32) {
        let (p, n) = (self.prev[node as usize], self.next[node as usize]);
        self.next[p as usize] = n;
        self.prev[n as usize] = p;
    }

    fn relink(&mut self, node: u32) {
        let (p, n) = (self.prev[node as usize], self.next[node as usize]);
        debug_assert!(self.next[p as usize] == n && self.prev[n as usize] == p);
        self.next[p as usize] = node;
        self.prev[n as usize] = node;
    }

    /// Removes an operation's call and completion from the list.
    fn lift(&mut self, call: u32) {
        self.unlink(call);
        if let Some(completion) = self.completion_of(Self::op_of(call)) {
            self.unlink(completion);
        }
    }

    /// Puts back what [`Search::lift`] removed, in reverse order.
    fn unlift(&mut self, call: u32) {
        if let Some(completion) = self.completion_of(Self::op_of(call)) {
            self.relink(completion);
        }
        self.relink(call);
    }

    /// Applies op `op` to `state`, caching the results of steps that build new values.
    fn apply(&mut self, op: usize, state: Val) -> Option<Val> {
        match &self.steps_compiled[op] {
            // Appends are interned by hash, at once; an increment parses and prints.
            Step::Incr { .. } => {}
            cheap => return cheap.apply(state, &mut self.values),
        }
        let key = (op as u32, state);
        if let Some(after) = self.transitions.get(&key) {
            return *after;
        }
        let after = self.steps_compiled[op].apply(state, &mut self.values);
        self.transitions.insert(key, after);
        after
    }

    /// Runs the search: the outcome and the steps taken.
    ///
    /// The candidates for the next linearized op are the calls before the first
    /// completion in the list. In time order they are scanned once, in list order. With
    /// completed ops first they are scanned in two phases: completed ops, then
    /// unknown-outcome ops; each frame remembers its phase so that backtracking resumes the
    /// scan where it left off.
    ///
    /// One more cut: after an unknown-outcome op, a blind write (put or delete) is not
    /// tried next. The unknown-outcome op would be overwritten before anything observed
    /// it, so the same sequence without it (which leaves it out, as it may be) is explored
    /// anyway. Without this cut, sets of overwritten unknown writes multiply the search.
    fn run(mut self, budget_steps: u64, order: Order) -> (Outcome, u64) {
        let first_unknown = self.ops.iter().take_while(|op| op.complete.is_some()).count();
        let mut walk = Walk {
            linearized: Linearized::new(self.ops.len(), first_unknown),
            explored: Explored { unknowns: first_unknown < self.ops.len(), ..Explored::default() },
            stack: Vec::new(),
            best: Vec::new(),
            state: self.initial,
            entry: self.next[HEAD as usize],
            unknown_phase: false,
            observers_first: true,
            remaining: first_unknown,
            first_unknown,
        };
        let mut steps = 0u64;
        let mut scanned = 0u64;
        let scanned_max = budget_steps.saturating_mul(SCAN_PER_STEP_MAX);
        while walk.remaining > 0 {
            scanned += 1;
            if steps >= budget_steps || scanned > scanned_max {
                return (Outcome::OutOfBudget, steps);
            }
            if walk.observers_first {
                if !self.is_call(walk.entry) {
                    // No observer matches: try every candidate, from the head.
                    walk.observers_first = false;
                    walk.entry = self.next[HEAD as usize];
                    continue;
                }
                let op = Self::op_of(walk.entry);
                if op >= first_unknown || !self.observes(op, walk.state) {
                    walk.entry = self.next[walk.entry as usize];
                    continue;
                }
                steps += 1;
                if self.try_linearize(&mut walk, op) {
                    walk.stack.last_mut().expect("just pushed").forced = true;
                    continue;
                }
                // The node after it was explored and failed: so does this one.
                steps += 1;
                if !self.backtrack(&mut walk) {
                    let counterexample = self.counterexample(&walk.best);
                    return (Outcome::Illegal(Box::new(counterexample)), steps);
                }
                continue;
            }
            if !self.is_call(walk.entry) && !walk.unknown_phase && order == Order::CompletedFirst {
                // Completed ops were tried; now the unknown-outcome ones, same window.
                walk.unknown_phase = true;
                walk.entry = self.next[HEAD as usize];
                continue;
            }
            if !self.is_call(walk.entry) {
                // The first completion in the list: its op must come before anything later.
                steps += 1;
                if !self.backtrack(&mut walk) {
                    let counterexample = self.counterexample(&walk.best);
                    return (Outcome::Illegal(Box::new(counterexample)), steps);
                }
                continue;
            }
            let op = Self::op_of(walk.entry);
            let skip_phase =
                order == Order::CompletedFirst && (op >= first_unknown) != walk.unknown_phase;
            // An unknown-outcome op followed at once by a blind write is erased unseen:
            // the same sequence without it is explored anyway.
            let erases = walk.linearized.after_unknown()
                && matches!(self.steps_compiled[op], Step::Write(_));
            if skip_phase || erases {
                walk.entry = self.next[walk.entry as usize];
                continue;
            }
            steps += 1;
            if !self.try_linearize(&mut walk, op) {
                walk.entry = self.next[walk.entry as usize];
            }
        }
        debug_assert!(walk.stack.iter().all(|f| self.is_call(f.node)));
        debug_assert_eq!(
            walk.linearized.complete.iter().map(|w| w.count_ones() as usize).sum::<usize>(),
            first_unknown
        );
        (Outcome::Linearizable, steps)
    }

    /// Linearizes `op` (the call at `walk.entry`) next if the model accepts its result and
    /// the node it leads to was not explored; then restarts the scan from the head.
    fn try_linearize(&mut self, walk: &mut Walk, op: usize) -> bool {
        debug_assert_eq!(Self::op_of(walk.entry), op);
        let Some(after) = self.apply(op, walk.state) else { return false };
        if self.dead(op, after) {
            return false;
        }
        let after_unknown = walk.linearized.after_unknown();
        walk.linearized.set(op);
        walk.linearized.set_after_unknown(op >= walk.first_unknown);
        if !walk.explored.insert(&walk.linearized, after) {
            walk.linearized.clear(op);
            walk.linearized.set_after_unknown(after_unknown);
            return false;
        }
        walk.stack.push(Frame {
            node: walk.entry,
            state_before: walk.state,
            unknown_phase: walk.unknown_phase,
            after_unknown_before: after_unknown,
            forced: false,
        });
        walk.state = after;
        self.lift(walk.entry);
        walk.remaining -= usize::from(op < walk.first_unknown);
        if walk.stack.len() > walk.best.len() {
            walk.best = walk.stack.iter().map(|f| f.node).collect();
        }
        walk.entry = self.next[HEAD as usize];
        walk.unknown_phase = false;
        walk.observers_first = true;
        true
    }

    /// For the kv model: whether `state`, reached by linearizing `op`, can no longer give
    /// the value of a read still to be linearized.
    ///
    /// A read of `R` whose completion is in the list can only come after ops invoked
    /// before that completion (the calls before it in the list). Appends only extend the
    /// value, so `R` must begin with `state`'s text, or with the value of one of those ops
    /// that is a put. When neither holds (by polynomial hashes of prefixes: a match proves
    /// nothing, a mismatch proves the texts differ) no linearization goes through this
    /// node. The test looks at the first [`DEAD_READS_MAX`] completions.
    fn dead(&mut self, op: usize, state: Val) -> bool {
        if self.read_prefixes.is_empty() {
            return false;
        }
        let mut puts = std::mem::take(&mut self.puts);
        puts.clear();
        let dead = self.dead_with(op, state, &mut puts);
        self.puts = puts;
        dead
    }

    fn dead_with(&self, op: usize, state: Val, puts: &mut Vec<Val>) -> bool {
        let own = self.completion_of(op);
        let mut completions = 0;
        let mut node = self.next[HEAD as usize];
        while node != self.tail && completions < DEAD_READS_MAX {
            let other = Self::op_of(node);
            if other == op {
                node = self.next[node as usize];
                continue;
            }
            if self.is_call(node) {
                if let Step::Write(value) = self.steps_compiled[other] {
                    puts.push(value);
                }
            } else if Some(node) != own {
                completions += 1;
                if let Some(prefixes) = &self.read_prefixes[other] {
                    let may_begin = |val: Val| {
                        let (hash, len) = self.values.sig(val);
                        prefixes.get(len).is_some_and(|h| *h == hash)
                    };
                    if !may_begin(state) && !puts.iter().any(|put| may_begin(*put)) {
                        return true;
                    }
                }
            }
            node = self.next[node as usize];
        }
        false
    }

    /// Whether `op` is a completed observer that leaves `state` as it is and may come
    /// now: a read of `state`, or a cas known to have failed against it.
    ///
    /// Linearizing such an op next loses nothing: it is minimal (every op that completed
    /// before its invocation is linearized), so in any linearization from this node it
    /// can be moved to the front without breaking real-time order, and since it changes
    /// no state the ops after it see the same states. So a node where one matches tries
    /// only that op, and fails if that fails.
    fn observes(&self, op: usize, state: Val) -> bool {
        match self.steps_compiled[op] {
            Step::Read(seen) => seen == state,
            Step::Cas { expected, swapped: Some(false), .. } => expected != state,
            _ => false,
        }
    }

    /// Undoes the last linearized op and resumes the scan after it; false when there is
    /// nothing to undo (no linearization exists).
    ///
    /// A frame of a matching observer is undone with its node: that node had no other
    /// choice worth trying ([`Search::observes`]).
    fn backtrack(&mut self, walk: &mut Walk) -> bool {
        loop {
            let Some(frame) = walk.stack.pop() else { return false };
            let op = Self::op_of(frame.node);
            debug_assert!(self.is_call(frame.node));
            walk.linearized.clear(op);
            walk.linearized.set_after_unknown(frame.after_unknown_before);
            walk.state = frame.state_before;
            self.unlift(frame.node);
            walk.remaining += usize::from(op < walk.first_unknown);
            if frame.forced {
                continue;
            }
            walk.entry = self.next[frame.node as usize];
            walk.unknown_phase = frame.unknown_phase;
            walk.observers_first = false;
            return true;
        }
    }

    /// Describes the longest linearized prefix `best` (call nodes, in order) and the
    /// operations that could not come after it.
    fn counterexample(&mut self, best: &[u32]) -> Counterexample {
        let mut state = self.initial;
        let mut placed = vec![false; self.ops.len()];
        for &node in best {
            let op = Self::op_of(node);
            state =
                self.steps_compiled[op].apply(state, &mut self.values).expect("prefix was legal");
            placed[op] = true;
        }
        let first_completion = (0..self.ops.len())
            .filter(|&i| !placed[i])
            .filter_map(|i| self.ops[i].complete)
            .min()
            .unwrap_or(u64::MAX);
        let mut stuck = Vec::new();
        for i in
            (0..self.ops.len()).filter(|&i| !placed[i] && self.ops[i].invoke <= first_completion)
        {
            if stuck.len() >= STUCK_SHOWN_MAX {
                break;
            }
            let why = match self.steps_compiled[i].apply(state, &mut self.values) {
                None => "its result is impossible in this state".to_string(),
                Some(_) => "placing it here leads to a dead end later".to_string(),
            };
            stuck.push(((*self.ops[i]).clone(), why));
        }
        let shown_from = best.len().saturating_sub(PREFIX_SHOWN_MAX);
        Counterexample {
            key: self.ops.first().map(|op| op.key.clone()).unwrap_or_default(),
            prefix_len: best.len(),
            prefix_tail: best[shown_from..]
                .iter()
                .map(|&n| (*self.ops[Self::op_of(n)]).clone())
                .collect(),
            state: self.values.show(state),
            stuck,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(id: u64, action: Action, invoke: u64, complete: Option<u64>) -> LinOp {
        LinOp { id, client: id, key: "k".into(), action, invoke, complete }
    }
    fn write(v: &str) -> Action {
        Action::Write { value: v.into() }
    }
    fn read(v: Option<&str>) -> Action {
        Action::Read { result: v.map(str::to_string) }
    }

    fn verdict(model: Model, ops: &[LinOp]) -> &'static str {
        check(model, ops, Config::default()).verdict.name()
    }

    #[test]
    fn concurrent_write_and_reads() {
        // write(1) spans both reads: reads may see old then new, not new then old.
        let ok = [
            op(0, write("1"), 0, Some(100)),
            op(1, read(Some("1")), 10, Some(20)),
            op(2, read(Some("1")), 30, Some(40)),
        ];
        assert_eq!(verdict(Model::Register, &ok), "linearizable");
        let bad = [
            op(0, write("1"), 0, Some(100)),
            op(1, read(Some("1")), 10, Some(20)),
            op(2, read(None), 30, Some(40)),
        ];
        assert_eq!(verdict(Model::Register, &bad), "not-linearizable");
    }

    #[test]
    fn touching_intervals_are_concurrent() {
        let ops = [op(0, read(Some("1")), 0, Some(10)), op(1, write("1"), 10, Some(20))];
        assert_eq!(verdict(Model::Register, &ops), "linearizable");
        let ops = [op(0, read(Some("1")), 0, Some(9)), op(1, write("1"), 10, Some(20))];
        assert_eq!(verdict(Model::Register, &ops), "not-linearizable");
    }

    #[test]
    fn unknown_ops_may_take_effect_late_or_never() {
        let late = [
            op(0, write("1"), 0, None),
            op(1, read(None), 10, Some(20)),
            op(2, read(Some("1")), 30, Some(40)),
        ];
        assert_eq!(verdict(Model::Register, &late), "linearizable");
        let never = [op(0, write("1"), 0, None), op(1, read(None), 10, Some(20))];
        assert_eq!(verdict(Model::Register, &never), "linearizable");
        let before_invoke = [op(1, read(Some("1")), 0, Some(5)), op(0, write("1"), 10, None)];
        assert_eq!(verdict(Model::Register, &before_invoke), "not-linearizable");
    }

    #[test]
    fn counterexample_names_prefix_and_stuck_ops() {
        let ops = [
            op(0, write("1"), 0, Some(10)),
            op(1, write("2"), 20, Some(30)),
            op(2, read(Some("1")), 40, Some(50)),
        ];
        let report = check(Model::Register, &ops, Config::default());
        let Verdict::NotLinearizable(c) = report.verdict else { panic!("expected a violation") };
        assert_eq!((c.key.as_str(), c.prefix_len, c.state.as_str()), ("k", 2, "\"2\""));
        assert_eq!(c.stuck.len(), 1);
        assert_eq!(c.stuck[0].0.id, 2);
        assert!(c.to_string().contains("cannot be next: #2"), "{c}");
    }

    #[test]
    fn keys_are_checked_apart() {
        let mut a = op(0, write("1"), 0, Some(10));
        a.key = "a".into();
        let mut b = op(1, read(Some("1")), 20, Some(30));
        b.key = "b".into();
        let report = check(Model::Keel, &[a, b], Config::default());
        assert_eq!(report.keys, 2);
        assert_eq!(report.verdict.name(), "not-linearizable");
    }

    #[test]
    fn long_keys_use_the_large_explored_set() {
        // More than 128 completed and 128 unknown-outcome ops on one key.
        let mut ops = Vec::new();
        for i in 0..200u64 {
            ops.push(op(2 * i, write(&i.to_string()), 10 * i, Some(10 * i + 5)));
            ops.push(op(2 * i + 1, write(&format!("u{i}")), 10 * i + 1, None));
        }
        ops.push(op(1000, read(Some("199")), 3000, Some(3001)));
        assert_eq!(verdict(Model::Register, &ops), "linearizable");
        ops.push(op(1001, read(Some("u3")), 3002, Some(3003)));
        assert_eq!(
            verdict(Model::Register, &ops),
            "linearizable",
            "an unknown write may land late"
        );
        ops.push(op(1002, read(Some("5")), 3004, Some(3005)));
        assert_eq!(verdict(Model::Register, &ops), "not-linearizable");
    }

    #[test]
    fn a_tiny_budget_gives_unknown() {
        let ops: Vec<LinOp> = (0..20).map(|i| op(i, write(&i.to_string()), 0, Some(100))).collect();
        let report = check(Model::Register, &ops, Config { budget_steps: 3 });
        assert_eq!(report.verdict.name(), "unknown");
    }

    #[test]
    fn a_state_no_pending_read_can_grow_into_is_dead() {
        // After "b" then "a" the value is "ba"; the read of "ab" completes before anything
        // else may come, and no put can reset the value: the node is dead at once.
        let append = |suffix: &str| Action::Append { suffix: suffix.into() };
        let ops = [
            op(0, append("a"), 0, Some(10)),
            op(1, append("b"), 0, Some(10)),
            op(2, read(Some("ab")), 0, Some(20)),
            op(3, read(Some("ab")), 30, Some(40)),
        ];
        let report = check(Model::Kv, &ops, Config::default());
        assert_eq!(report.verdict.name(), "linearizable");
        let mut put = ops.to_vec();
        put.push(op(4, write("a"), 0, Some(10)));
        assert_eq!(verdict(Model::Kv, &put), "linearizable", "a put may begin the value");
        let mut bad = ops.to_vec();
        bad[3] = op(3, read(Some("ba")), 30, Some(40));
        assert_eq!(verdict(Model::Kv, &bad), "not-linearizable");
    }

    #[test]
    fn a_matching_read_is_placed_without_trying_its_alternatives() {
        // Two reads of the initial value beside a write: the reads go first, and a
        // history that needs one of them after the write is still refused.
        let ops = [
            op(0, read(None), 0, Some(10)),
            op(1, write("1"), 0, Some(10)),
            op(2, read(None), 0, Some(10)),
            op(3, read(Some("1")), 20, Some(30)),
        ];
        assert_eq!(verdict(Model::Register, &ops), "linearizable");
        let mut bad = ops.to_vec();
        bad[2] = op(2, read(None), 15, Some(18));
        assert_eq!(verdict(Model::Register, &bad), "not-linearizable");
    }

    #[test]
    fn fifty_concurrent_clients_appending_to_ten_keys_decide_on_a_small_budget() {
        // The shape of the published 50-client kv histories, valid by construction: the
        // cuts keep every verdict (this generator's histories are easy with or without
        // them; the benchmark in docs/performance.md measures what the cuts save).
        for seed in 1..=3 {
            let shape = crate::generate::Shape {
                seed,
                ops: 2000,
                keys: 10,
                clients: 50,
                unknown_percent: 0,
                window_max: 300,
            };
            let ops = crate::generate::lin_history(Model::Kv, &shape);
            let report = check(Model::Kv, &ops, Config { budget_steps: 200_000 });
            assert_eq!(report.verdict.name(), "linearizable", "seed {seed}");
        }
    }

    #[test]
    fn kv_starts_empty_and_appends() {
        let ops = [
            op(0, read(Some("")), 0, Some(1)),
            op(1, Action::Append { suffix: "a".into() }, 2, Some(3)),
            op(2, Action::Append { suffix: "b".into() }, 2, Some(5)),
            op(3, read(Some("ba")), 6, Some(7)),
        ];
        assert_eq!(verdict(Model::Kv, &ops), "linearizable");
        let mut bad = ops.clone();
        bad[2].invoke = 4; // now b is strictly after a
        assert_eq!(verdict(Model::Kv, &bad), "not-linearizable");
    }
}
