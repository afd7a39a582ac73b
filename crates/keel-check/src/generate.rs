//! Deterministic generators of valid histories, for property tests and the benchmark.
//!
//! Layout: [`Rng`] (splitmix64; the seed is an input); [`Schedule`], which places each
//! operation of a sequential execution at a linearization point inside a concurrent
//! invoke/complete window of one of several clients; [`lin_history`] (single-key model ops
//! of any [`Model`]) and [`keel_history`] (a full Keel history with versions and
//! survivors). Every history generated is linearizable and satisfies cross-client
//! monotonic reads by construction: the operations take effect in order at their
//! linearization points, and every write that took effect survives.
//! [`rc_history`] makes release-consistency histories ([`crate::rc`]) the same way: one
//! global state, each op applied at its point, so every rule holds.

use crate::history::{KeelHistory, Op, OpKind, Outcome, Survivor};
use crate::model::{Action, LinOp, Model};
use crate::rc::{RcKind, RcOp, Stamp};
use keel_types::{Durability, ReadLevel, Version};
use std::collections::BTreeMap;

/// The generator histories are drawn from (Keel's splitmix64; the seed is an input).
pub use keel_types::rng::SplitMix64 as Rng;

/// The shape of a generated history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// The seed.
    pub seed: u64,
    /// Operations.
    pub ops: usize,
    /// Distinct keys.
    pub keys: usize,
    /// Concurrent clients.
    pub clients: usize,
    /// Percent of writes whose outcome is unknown (half of them take effect).
    pub unknown_percent: u32,
    /// How far (in time units) an operation's window may reach before and after its
    /// linearization point; linearization points are 10 units apart.
    pub window_max: u64,
}

impl Default for Shape {
    fn default() -> Self {
        Shape { seed: 1, ops: 1000, keys: 10, clients: 10, unknown_percent: 5, window_max: 40 }
    }
}

/// Where one operation sits in time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    /// The client issuing it.
    pub client: u64,
    /// Invocation time.
    pub invoke: u64,
    /// The moment it takes effect; `invoke <= point`.
    pub point: u64,
}

/// Places operations of a sequential execution on clients, one at a time per client.
#[derive(Clone, Debug)]
pub struct Schedule {
    free_at: Vec<u64>,
    point_last: u64,
    window_max: u64,
}

impl Schedule {
    /// A schedule for `clients` clients (at least one).
    pub fn new(clients: usize, window_max: u64) -> Schedule {
        assert!(clients > 0 && window_max > 0, "a schedule needs clients and a window");
        Schedule { free_at: vec![0; clients], point_last: 0, window_max }
    }

    /// The slot of the next operation: a free client, an invocation after that client's
    /// previous completion, and a linearization point after every earlier one.
    pub fn next(&mut self, rng: &mut Rng) -> Slot {
        let earliest_free = *self.free_at.iter().min().expect("clients");
        let point = (self.point_last + 10).max(earliest_free + 1);
        let start = rng.below(self.free_at.len() as u64) as usize;
        let client = (0..self.free_at.len())
            .map(|k| (start + k) % self.free_at.len())
            .find(|&c| self.free_at[c] < point)
            .expect("some client is free by construction");
        let invoke = point.saturating_sub(rng.below(self.window_max)).max(self.free_at[client] + 1);
        assert!(invoke <= point && invoke > self.free_at[client]);
        self.point_last = point;
        Slot { client: client as u64, invoke, point }
    }

    /// Completes the operation in `slot`: returns its completion time.
    pub fn complete(&mut self, slot: Slot, rng: &mut Rng) -> u64 {
        let complete = slot.point + rng.below(self.window_max);
        self.free_at[slot.client as usize] = complete;
        complete
    }

    /// The client gives up on the operation in `slot` (unknown outcome); it is free again
    /// after its timeout.
    pub fn abandon(&mut self, slot: Slot) {
        self.free_at[slot.client as usize] = slot.point + 2 * self.window_max;
    }
}

/// A random action of `model` on a key holding `state`; `n` makes written values unique.
fn random_action(model: Model, state: &Option<String>, n: usize, rng: &mut Rng) -> Action {
    let roll = rng.below(100);
    let value = n.to_string();
    match (model, roll) {
        (_, 0..=39) => Action::Read { result: None },
        (Model::Kv, 40..=69) => Action::Append { suffix: format!("a{n} ") },
        (Model::Keel, 40..=49) => Action::Delete,
        (Model::Keel, 50..=64) => Action::Incr { delta: rng.below(5) as i64 - 2, result: None },
        (Model::Register | Model::Keel, 65..=84) => {
            let expected = if rng.chance(50 * 10_000) {
                state.clone()
            } else {
                Some(rng.below(n as u64 + 1).to_string())
            };
            Action::Cas { expected, value, swapped: None }
        }
        _ => Action::Write { value },
    }
}

/// Applies `action` to `state`, filling in its result: `false` when it cannot take
/// effect (an incr of a value that is not an integer).
fn execute(action: &mut Action, state: &mut Option<String>) -> bool {
    match action {
        Action::Read { result } => *result = state.clone(),
        Action::Write { value } => *state = Some(value.clone()),
        Action::Delete => *state = None,
        Action::Cas { expected, value, swapped } => {
            let holds = *expected == *state;
            *swapped = Some(holds);
            if holds {
                *state = Some(value.clone());
            }
        }
        Action::Append { suffix } => {
            *state = Some(format!("{}{suffix}", state.as_deref().unwrap_or("")));
        }
        Action::Incr { delta, result } => {
            let base = match state.as_deref().map(str::parse::<i64>) {
                None => 0,
                Some(Ok(base)) => base,
                Some(Err(_)) => return false,
            };
            let after = base + *delta;
            *result = Some(after);
            *state = Some(after.to_string());
        }
    }
    true
}

/// A linearizable single-model history: ops of `model` over `shape.keys` keys.
pub fn lin_history(model: Model, shape: &Shape) -> Vec<LinOp> {
    assert!(shape.keys > 0, "a history needs keys");
    let mut rng = Rng::new(shape.seed);
    let mut schedule = Schedule::new(shape.clients, shape.window_max);
    let initial = if model == Model::Kv { Some(String::new()) } else { None };
    let mut states: BTreeMap<String, Option<String>> = BTreeMap::new();
    let mut ops = Vec::with_capacity(shape.ops);
    for n in 0..shape.ops {
        let key = format!("k{}", rng.below(shape.keys as u64));
        let state = states.entry(key.clone()).or_insert_with(|| initial.clone());
        let mut action = random_action(model, state, n, &mut rng);
        let slot = schedule.next(&mut rng);
        let is_read = matches!(action, Action::Read { .. });
        if !is_read && rng.chance(shape.unknown_percent * 10_000) {
            schedule.abandon(slot);
            if rng.chance(50 * 10_000) {
                execute(&mut action.clone(), state);
            }
            clear_result(&mut action);
            ops.push(LinOp {
                id: n as u64,
                client: slot.client,
                key,
                action,
                invoke: slot.invoke,
                complete: None,
            });
            continue;
        }
        if !execute(&mut action, state) {
            schedule.complete(slot, &mut rng);
            continue; // a failed incr: did not take effect, not recorded
        }
        let complete = Some(schedule.complete(slot, &mut rng));
        ops.push(LinOp {
            id: n as u64,
            client: slot.client,
            key,
            action,
            invoke: slot.invoke,
            complete,
        });
    }
    ops
}

/// Executes `action`; true when it is a read or a write that took effect (not a cas that
/// did not swap, not an incr of a non-integer).
fn takes_effect(action: &mut Action, state: &mut Option<String>) -> bool {
    execute(action, state) && !matches!(action, Action::Cas { swapped: Some(false), .. })
}

fn clear_result(action: &mut Action) {
    match action {
        Action::Cas { swapped, .. } => *swapped = None,
        Action::Incr { result, .. } => *result = None,
        _ => {}
    }
}

/// A valid Keel history with versions and survivors: gets at every level (`any` reads
/// too, which here happen to be fresh), puts, deletes, cas and incr.
pub fn keel_history(shape: &Shape) -> KeelHistory {
    assert!(shape.keys > 0, "a history needs keys");
    let mut rng = Rng::new(shape.seed);
    let mut schedule = Schedule::new(shape.clients, shape.window_max);
    let mut states: BTreeMap<String, (Option<String>, Option<Version>)> = BTreeMap::new();
    let mut history = KeelHistory::default();
    for n in 0..shape.ops {
        let key = format!("k{}", rng.below(shape.keys as u64));
        let (state, version) = states.entry(key.clone()).or_insert((None, None));
        let mut action = random_action(Model::Keel, state, n, &mut rng);
        let slot = schedule.next(&mut rng);
        let is_read = matches!(action, Action::Read { .. });
        let unknown = !is_read && rng.chance(shape.unknown_percent * 10_000);
        let mut outcome = Outcome::Ok;
        let mut complete_ns = None;
        if unknown {
            schedule.abandon(slot);
            outcome = Outcome::Unknown;
            if rng.chance(50 * 10_000) && takes_effect(&mut action.clone(), state) {
                *version = Some(next_version(&history));
                history.survivors.push(Survivor {
                    version: version.expect("set"),
                    key: key.clone(),
                    value: state.clone(),
                });
            }
            clear_result(&mut action);
        } else {
            complete_ns = Some(schedule.complete(slot, &mut rng));
            let before = state.clone();
            if !takes_effect(&mut action, state) {
                outcome = Outcome::Fail;
            } else if !matches!(action, Action::Read { .. }) {
                *version = Some(next_version(&history));
                history.survivors.push(Survivor {
                    version: version.expect("set"),
                    key: key.clone(),
                    value: state.clone(),
                });
            }
            debug_assert!(is_read || outcome == Outcome::Ok || before == *state);
        }
        let op_version = if outcome == Outcome::Ok { *version } else { None };
        let kind = keel_kind(&key, action, &mut rng);
        history.ops.push(Op {
            id: n as u64,
            client: slot.client,
            kind,
            invoke_ns: slot.invoke,
            complete_ns,
            outcome,
            node: Some(rng.below(3) as u32 + 1),
            version: op_version,
            views: Vec::new(),
        });
    }
    history.ops.sort_by_key(|op| (op.invoke_ns, op.id));
    history
}

fn next_version(history: &KeelHistory) -> Version {
    let index = history.survivors.len() as u64 + 1;
    Version::new(1 + index / 1000, index)
}

fn keel_kind(key: &str, action: Action, rng: &mut Rng) -> OpKind {
    let key = key.to_string();
    let durability = Durability::ALL[rng.below(3) as usize];
    match action {
        Action::Read { result } => {
            OpKind::Get { key, level: ReadLevel::ALL[rng.below(3) as usize], result }
        }
        Action::Write { value } => OpKind::Put { key, value, durability },
        Action::Delete => OpKind::Delete { key, durability },
        Action::Cas { expected, value, .. } => OpKind::Cas { key, expected, value, durability },
        Action::Incr { delta, result } => OpKind::Incr { key, delta, durability, result },
        Action::Append { .. } => unreachable!("the keel model has no append"),
    }
}

/// A valid release-consistency history (`keel-rc`): relaxed reads and writes, acquires,
/// releases, FAA and CAS (strong and weak) over `shape.keys` keys, `shape.clients`
/// sessions on 5 machines. Each op takes effect on one global state at its point inside
/// its window, so it is linearizable, hence RC_Lin. Writes get stamps `(version + 1,
/// machine, 0)`, RMWs `(version, writer, rmw + 1)` of the key's current stamp.
/// `shape.unknown_percent` of ops get no reply; half of those take effect, and half of
/// the writes and releases among them leave `wrote` null (a read attributes them by
/// their unique value).
pub fn rc_history(shape: &Shape) -> Vec<RcOp> {
    assert!(shape.keys > 0 && shape.clients > 0, "a history needs keys and sessions");
    let mut rng = Rng::new(shape.seed);
    let mut schedule = Schedule::new(shape.clients, shape.window_max);
    let mut state: Vec<(Stamp, Option<u64>)> = vec![(Stamp::ZERO, None); shape.keys];
    let mut seqs = vec![0u64; shape.clients];
    let mut ops = Vec::with_capacity(shape.ops);
    for n in 0..shape.ops as u64 {
        let slot = schedule.next(&mut rng);
        let session = slot.client;
        let machine = (session % 5) as u32;
        let key = rng.index(shape.keys);
        let kind = match rng.below(100) {
            0..=24 => RcKind::Read,
            25..=44 => RcKind::Write,
            45..=59 => RcKind::Acquire,
            60..=74 => RcKind::Release,
            75..=86 => RcKind::Faa,
            _ => RcKind::Cas,
        };
        let (current, value) = state[key];
        let write_stamp =
            Stamp { version: current.version + 1, writer: u64::from(machine), rmw: 0 };
        let rmw_stamp = Stamp { rmw: current.rmw + 1, ..current };
        let mut op = RcOp {
            id: n,
            session,
            machine,
            seq: seqs[session as usize],
            kind,
            key: key as u64,
            invoke: slot.invoke,
            complete: None,
            read: None,
            wrote: None,
            arg: None,
            expected: None,
            strong: false,
        };
        seqs[session as usize] += 1;
        let mut write = None;
        match kind {
            RcKind::Read | RcKind::Acquire => {}
            RcKind::Write | RcKind::Release => {
                let v = (1 << 40) + n;
                op.arg = Some(v);
                write = Some((write_stamp, v));
            }
            RcKind::Faa => {
                let delta = rng.below(5);
                op.arg = Some(delta);
                write = Some((rmw_stamp, value.unwrap_or(0).wrapping_add(delta)));
            }
            RcKind::Cas => {
                let new = (2 << 40) + n;
                op.arg = Some(new);
                op.strong = rng.below(2) == 0;
                op.expected = match rng.below(4) {
                    0 | 1 => value,
                    2 => None,
                    _ => Some(rng.below(4)),
                };
                if op.expected == value {
                    write = Some((rmw_stamp, new));
                }
            }
        }
        if rng.chance(shape.unknown_percent * 10_000) {
            schedule.abandon(slot);
            if let Some((stamp, v)) = write.filter(|_| rng.below(2) == 0) {
                state[key] = (stamp, Some(v));
                let blind = matches!(kind, RcKind::Write | RcKind::Release);
                if !blind || rng.below(2) == 0 {
                    op.wrote = Some((stamp, v));
                }
            }
        } else {
            op.complete = Some(schedule.complete(slot, &mut rng));
            if kind.reads() {
                op.read = Some((current, value));
            }
            if let Some((stamp, v)) = write {
                state[key] = (stamp, Some(v));
                op.wrote = Some((stamp, v));
            }
        }
        ops.push(op);
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_keep_one_op_per_client_and_points_inside_windows() {
        let mut rng = Rng::new(7);
        let mut schedule = Schedule::new(3, 40);
        let mut last_complete = [0u64; 3];
        let mut last_point = 0;
        for _ in 0..1000 {
            let slot = schedule.next(&mut rng);
            assert!(slot.invoke > last_complete[slot.client as usize]);
            assert!(slot.point > last_point && slot.invoke <= slot.point);
            last_point = slot.point;
            let complete = schedule.complete(slot, &mut rng);
            assert!(complete >= slot.point);
            last_complete[slot.client as usize] = complete;
        }
    }

    #[test]
    fn generation_is_deterministic() {
        let shape = Shape { ops: 300, ..Shape::default() };
        assert_eq!(keel_history(&shape), keel_history(&shape));
        assert_ne!(keel_history(&shape), keel_history(&Shape { seed: 2, ..shape }));
    }
}
