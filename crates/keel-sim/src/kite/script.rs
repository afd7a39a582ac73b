//! Scripted sessions for the litmus tests and fault scenarios: each program is a list of
//! steps run in order in one session on one node; programs run concurrently.

use super::recorder::{key, Recorder, Seen};
use super::world::KiteWorld;
use keel_core::engine::RequestTag;
use keel_core::kite::{KiteOp, Stamp};
use keel_types::NodeId;

/// One step of a program.
pub enum Step {
    /// Issue an operation and wait for its reply.
    Op(KiteOp),
    /// Acquire `key` until it reads `value` (a spin on a flag).
    AwaitAcquire {
        /// The flag's key number.
        key: u64,
        /// The value waited for.
        value: u64,
    },
    /// FAA `key` by 0 until it reads at least `at_least` (a spin with an RMW as acquire).
    AwaitFaa {
        /// The counter's key number.
        key: u64,
        /// The least value waited for.
        at_least: u64,
    },
    /// Wait until step `step` of program `program` completed (real-time order).
    After {
        /// The program.
        program: usize,
        /// Its step.
        step: usize,
    },
    /// Wait this long (ns).
    Pause(u64),
    /// Act on the world (a fault, a rule) when reached.
    Call(Box<dyn FnMut(&mut KiteWorld)>),
}

/// A session's script.
pub struct Program {
    /// The node it runs on.
    pub node: NodeId,
    /// Its session id.
    pub session: u64,
    /// Its steps.
    pub steps: Vec<Step>,
}

/// What each step of each program saw (`None`: not reached or no reply).
pub type Results = Vec<Vec<Option<Seen>>>;

const TICK_NS: u64 = 50_000;
const SPIN_GAP_NS: u64 = 300_000;

/// Runs `programs` until all finish or `deadline` (global ns) passes; every request is
/// recorded in `recorder`. Returns each step's result and whether all finished.
pub fn run(
    world: &mut KiteWorld,
    recorder: &mut Recorder,
    mut programs: Vec<Program>,
    deadline: u64,
) -> (Results, bool) {
    let count = programs.len();
    let mut pos = vec![0usize; count];
    let mut waiting: Vec<Option<RequestTag>> = vec![None; count];
    let mut not_before = vec![0u64; count];
    let mut results: Results = programs.iter().map(|p| vec![None; p.steps.len()]).collect();
    let empty = Seen { read: None, read_stamp: Stamp::ZERO, wrote: None, written: None };
    let mut t = world.now();
    loop {
        // Start what can start.
        for i in 0..count {
            if waiting[i].is_some() || pos[i] >= programs[i].steps.len() || not_before[i] > t {
                continue;
            }
            if world.engine(programs[i].node).is_none() {
                continue;
            }
            let node = programs[i].node;
            let session = programs[i].session;
            match &mut programs[i].steps[pos[i]] {
                Step::Op(op) => {
                    let op = op.clone();
                    waiting[i] = Some(recorder.submit(world, node, session, op));
                }
                Step::AwaitAcquire { key: k, .. } => {
                    let op = KiteOp::Acquire { key: key(*k) };
                    waiting[i] = Some(recorder.submit(world, node, session, op));
                }
                Step::AwaitFaa { key: k, .. } => {
                    let op = KiteOp::Faa { key: key(*k), delta: 0 };
                    waiting[i] = Some(recorder.submit(world, node, session, op));
                }
                Step::After { program, step } => {
                    if results[*program][*step].is_some() {
                        results[i][pos[i]] = Some(empty.clone());
                        pos[i] += 1;
                    }
                }
                Step::Pause(ns) => {
                    not_before[i] = t + *ns;
                    results[i][pos[i]] = Some(empty.clone());
                    pos[i] += 1;
                }
                Step::Call(f) => {
                    f(world);
                    results[i][pos[i]] = Some(empty.clone());
                    pos[i] += 1;
                }
            }
        }
        if (0..count).all(|i| pos[i] >= programs[i].steps.len()) {
            return (results, true);
        }
        if t >= deadline {
            return (results, false);
        }
        t += TICK_NS;
        world.run_until(t);
        for (at, _, reply) in world.take_replies() {
            let seen = recorder.complete(at, &reply);
            let Some(i) = waiting.iter().position(|w| *w == Some(reply.tag)) else { continue };
            waiting[i] = None;
            let Some(seen) = seen else {
                // Refused: try again a little later.
                not_before[i] = t + SPIN_GAP_NS;
                continue;
            };
            let again = match &programs[i].steps[pos[i]] {
                Step::AwaitAcquire { value, .. } => seen.read != Some(*value),
                Step::AwaitFaa { at_least, .. } => seen.read.unwrap_or(0) < *at_least,
                _ => false,
            };
            if again {
                not_before[i] = t + SPIN_GAP_NS;
                continue;
            }
            results[i][pos[i]] = Some(seen);
            pos[i] += 1;
        }
    }
}

/// The value a step read (`None` when it read nothing or was not reached).
pub fn read(results: &Results, program: usize, step: usize) -> Option<u64> {
    results[program][step].as_ref().and_then(|s| s.read)
}

/// Whether a step completed.
pub fn done(results: &Results, program: usize, step: usize) -> bool {
    results[program][step].is_some()
}
