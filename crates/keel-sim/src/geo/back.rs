//! An operator taking a removed data center back during `general` (`GeoOp::ReturnDc`,
//! `docs/geo.md`, *Taking a data center back*). In half the runs whose removal was made
//! (and whose keyspace has no strong transactions), the operator replaces the removed
//! data center's replicas with new machines, wiped and joining, and asks, at a node of
//! another live data center, 0.3 to 2 s after the removal, to take it back; in half of
//! those, once it is made, to remove it again (abandoning the return: the new replicas
//! start over, waiting), then to rebuild it and take it back once more. A data center
//! that fails while a return is under way is removed too, as a return waits for every
//! data center not removed. A refusal or a lost answer is asked again later, elsewhere.
//! At the end, every replica still serving knows the same epochs (`changes-diverge`
//! otherwise), and every return under way is settled everywhere (`return-stalled`
//! otherwise). The late survivor's fault (`late.rs`) is armed from here, and so is the
//! split cut's (`split.rs`) in half the runs that abandon a return.

use super::late::LateSurvivor;
use super::split::SplitCut;
use super::world::GeoWorld;
use crate::rng::Rng;
use keel_core::engine::RequestTag;
use keel_types::geo::GeoOp;
use keel_types::{KeelError, NodeId};
use std::collections::BTreeSet;

/// How long after a refusal or a lost answer the change is asked again, ns.
const RETRY_NS: u64 = 500_000_000;
/// How long an answer may take before the change is asked again, ns (a proposal's two
/// rounds end within twice the suspicion time-out each).
const ANSWER_NS: u64 = 5_000_000_000;
/// Requests per change, at most.
const TRIES_MAX: u32 = 20;
/// How long sessions go on working once a return is back, ns.
const WORK_AFTER_BACK_NS: u64 = 2_000_000_000;

/// A change the operator asks of the removed data center, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// Take it back.
    Return,
    /// Remove it again: the return is abandoned.
    Abandon,
    /// Remove another data center, failed while the return is under way: a return
    /// waits for every data center not removed.
    RemoveFailed(u32),
}

/// The run's planned return.
pub struct Return {
    rng: Rng,
    /// How long after the removal was made the first change is asked.
    after_ns: u64,
    /// The changes left to ask.
    steps: Vec<Step>,
    /// The request in flight: its tag, when it was sent.
    asked: Option<(RequestTag, u64)>,
    not_before: Option<u64>,
    tries: u32,
    /// Returns made so far.
    returns: u32,
    /// The returning data center, while a return made is under way (not abandoned).
    under_way: Option<u32>,
    /// The data center taken back, once the first change is asked.
    dc: Option<u32>,
    /// The late survivor's fault ([`LateSurvivor`]), drawn from its own stream: whether
    /// it is planned, and once armed.
    late_rng: Rng,
    late_planned: bool,
    late: Option<LateSurvivor>,
    late_tried: bool,
    /// The split cut's fault ([`SplitCut`]), from a stream of its own: whether it is
    /// planned, and once armed.
    split_rng: Rng,
    split_planned: bool,
    split: Option<SplitCut>,
    /// When the last return came back.
    back_at: Option<u64>,
    /// What went wrong: a change refused for a reason it should not have been.
    pub violations: Vec<String>,
}

impl Return {
    /// Draws a run's return from `rng` (a stream of its own), in half the runs; the split
    /// cut's fault from `split_rng`, in half of those that abandon it.
    pub fn draw(mut rng: Rng, mut split_rng: Rng) -> Option<Return> {
        if !rng.chance(500_000) {
            return None;
        }
        let after_ns = rng.range(300_000_000, 2_000_000_000);
        let mut late_rng = rng.fork();
        let late_planned = late_rng.chance(500_000);
        let steps = match rng.chance(500_000) {
            true => vec![Step::Return, Step::Abandon, Step::Return],
            false => vec![Step::Return],
        };
        let split_planned = steps.contains(&Step::Abandon) && split_rng.chance(500_000);
        Some(Return {
            rng,
            after_ns,
            steps,
            asked: None,
            not_before: None,
            tries: 0,
            returns: 0,
            under_way: None,
            dc: None,
            late_rng,
            late_planned,
            late: None,
            late_tried: false,
            split_rng,
            split_planned,
            split: None,
            back_at: None,
            violations: Vec::new(),
        })
    }

    /// Arms the late survivor's fault as a live data center is to be removed (`target`
    /// chosen), and lets its holds go when due; called at every turn of the run.
    pub fn tend(&mut self, world: &mut GeoWorld, log: &mut Vec<String>, target: Option<u32>) {
        let now = world.now();
        if let (Some(r), false, true) = (target, self.late_tried, self.plans_late(world)) {
            self.late_tried = true;
            self.late = LateSurvivor::arm(world, &mut self.late_rng, r, now);
            world.failures_held = self.late.is_some();
            if let Some(late) = &self.late {
                log.push(format!("{}ms: data center {} learns late", now / 1_000_000, late.z));
            }
        }
        if self.late.as_mut().is_some_and(|late| late.tend(world, now)) {
            self.late = None;
            world.failures_held = false;
            log.push(format!("{}ms: the late data center's links let go", now / 1_000_000));
        }
        if let Some(split) = self.split.take_if(|split| split.due(world)) {
            split.release(world);
            log.push(format!("{}ms: the split cut's links let go", now / 1_000_000));
        }
    }

    /// Whether the late survivor's fault is planned (in half the returns), for a keyspace
    /// of `f` = 2: the removal is then of a live data center, early in the run.
    pub fn plans_late(&self, world: &GeoWorld) -> bool {
        self.late_planned && world.shape.f == 2 && !world.shape.strong
    }

    /// The returning data center is back once each of its new replicas installed its
    /// copy and every replica still serving elsewhere heard it back: it counts as live
    /// again (its sessions go on, the checkers take its replicas), and the operator asks
    /// nothing more of it (a removal still in flight is taken as of a live one).
    pub fn tend_back(&mut self, world: &mut GeoWorld, log: &mut Vec<String>) {
        let Some(r) = self.under_way else { return };
        world.note_cuts();
        if !is_back(world, r) {
            return;
        }
        self.under_way = None;
        self.back_at = Some(world.now());
        world.returned(r);
        world.reach("return-back");
        if self.asked.is_none() {
            self.steps.clear();
        }
        log.push(format!("{}ms: data center {r} is back", world.now() / 1_000_000));
    }

    /// Whether a return made is not back yet.
    pub fn under_way(&self) -> bool {
        self.under_way.is_some()
    }

    /// Until when sessions start work, given `until` so far: on while a return is under
    /// way, and for `WORK_AFTER_BACK_NS` once it is back, so that the new life serves
    /// and the sessions parked in the old one go on (their stale pasts refused), within
    /// `cap`.
    pub fn work_until(&self, until: u64, now: u64, cap: u64) -> u64 {
        let wanted = match (self.under_way, self.back_at) {
            (Some(_), _) => now + 1,
            (None, Some(at)) => at + WORK_AFTER_BACK_NS,
            (None, None) => until,
        };
        until.max(wanted.min(cap))
    }

    /// Whether the late survivor's fault or the split cut's still holds links.
    pub fn holding(&self) -> bool {
        self.late.is_some() || self.split.is_some()
    }

    /// Whether nothing is left to ask (or nothing can be).
    pub fn finished(&self, world: &GeoWorld) -> bool {
        let idle = self.steps.is_empty() && self.failed_unremoved(world).is_none();
        world.shape.strong || idle || self.tries >= TRIES_MAX
    }

    /// A data center other than the returning one that failed and that no replica still
    /// serving knows removed, while a return is under way.
    fn failed_unremoved(&self, world: &GeoWorld) -> Option<u32> {
        let r = self.under_way?;
        world.failed.iter().find(|&&d| d != r)?;
        let removed: BTreeSet<u32> = (0..world.shape.dcs())
            .filter(|d| !world.failed.contains(d))
            .flat_map(|d| world.nodes_of(d))
            .filter_map(|n| world.world.engine(n).map(|e| e.status().removed))
            .flatten()
            .collect();
        world.failed.iter().copied().find(|&d| d != r && !removed.contains(&d))
    }

    /// Asks the next change of data center `dc`, removed at `removed_at`, when its time
    /// comes; takes the answer.
    pub fn drive(&mut self, world: &mut GeoWorld, log: &mut Vec<String>, dc: u32, removed_at: u64) {
        // The data center first removed is the one taken back (the removal may go on
        // to another, its asker's failed with it).
        let dc = *self.dc.get_or_insert(dc);
        let now = world.now();
        if self.finished(world) {
            return;
        }
        if let Some(d) = self.failed_unremoved(world) {
            if self.steps.first() != Some(&Step::RemoveFailed(d)) && self.asked.is_none() {
                self.steps.insert(0, Step::RemoveFailed(d));
                self.tries = 0;
            }
        }
        let step = self.steps[0];
        if let Some((tag, at)) = self.asked {
            match world.replies.remove(&tag) {
                Some((_, reply)) => self.answered(world, log, step, dc, reply.result),
                None if now >= at + ANSWER_NS => self.asked = None,
                None => {}
            }
            return;
        }
        let not_before = *self.not_before.get_or_insert(removed_at + self.after_ns);
        match self.split.as_ref().filter(|_| step == Step::Abandon) {
            // The split cut's abandon is asked once a survivor applied the cut.
            Some(split) if !split.cut_applied(world) && !split.expired(now) => return,
            Some(_) => {}
            None if now < not_before => return,
            None => {}
        }
        // The operator asks a node that knows the data center's latest change, as `keel
        // status` shows it: a node that has not heard of a return answers a removal of
        // that data center `OK` as already made (`docs/geo.md`).
        let epoch_at =
            |n: NodeId| world.world.engine(n).map_or(0, |e| e.status().epochs[dc as usize]);
        let candidates: Vec<NodeId> = (0..world.shape.dcs())
            .filter(|d| *d != dc && !world.failed.contains(d))
            .flat_map(|d| world.nodes_of(d))
            .collect();
        let latest = candidates.iter().map(|&n| epoch_at(n)).max().unwrap_or(0);
        let askers: Vec<NodeId> =
            candidates.into_iter().filter(|&n| epoch_at(n) == latest).collect();
        if askers.is_empty() {
            return;
        }
        let at = askers[self.rng.below(askers.len() as u64) as usize];
        let member = world.nodes_of(dc)[0];
        if step == Step::Return && self.tries == 0 {
            // The operator brings new machines up first: wiped, joining, silent until
            // they learn the return.
            world.rebuild_dc(dc);
            log.push(format!("{}ms: data center {dc} rebuilt, joining", now / 1_000_000));
        }
        let op = match step {
            Step::Return => GeoOp::ReturnDc { member },
            Step::Abandon => GeoOp::RemoveDc { member },
            Step::RemoveFailed(d) => GeoOp::RemoveDc { member: world.nodes_of(d)[0] },
        };
        self.tries += 1;
        self.asked = Some((world.submit(at, 0, op), now));
        log.push(format!("{}ms: {at} asked to {step:?} data center {dc}", now / 1_000_000));
    }

    fn answered(
        &mut self,
        world: &mut GeoWorld,
        log: &mut Vec<String>,
        step: Step,
        dc: u32,
        result: Result<keel_core::geo::GeoResult, KeelError>,
    ) {
        let now = world.now();
        self.asked = None;
        match result {
            Ok(_) => {
                world.reach(match step {
                    Step::Return if self.returns == 0 => "return-made",
                    Step::Return => "return-made-again",
                    Step::Abandon => "return-abandoned",
                    Step::RemoveFailed(_) => "return-failed-removed",
                });
                if step == Step::Return {
                    let epoch =
                        |n: NodeId| world.world.engine(n).map(|e| e.status().epochs[dc as usize]);
                    let live =
                        (0..world.shape.dcs()).filter(|d| *d != dc && !world.failed.contains(d));
                    let nodes: Vec<NodeId> = live.flat_map(|d| world.nodes_of(d)).collect();
                    let epoch = nodes.into_iter().filter_map(epoch).max().unwrap_or(0);
                    world.return_made(dc, epoch + epoch % 2);
                    if self.split_planned && self.returns == 0 {
                        self.split =
                            SplitCut::arm(world, &mut self.split_rng, dc, epoch + epoch % 2);
                    }
                }
                if let Some(split) = self.split.as_mut().filter(|_| step == Step::Abandon) {
                    split.abandoned = true;
                }
                match step {
                    Step::Return => self.under_way = Some(dc),
                    Step::Abandon => self.under_way = None,
                    Step::RemoveFailed(_) => {}
                }
                if step == Step::Abandon && !world.failed.contains(&dc) {
                    // Made after the data center came back: the removal of a live one.
                    world.remove_beyond_f(dc);
                    if world.failed.len() > world.shape.f as usize {
                        self.violations.push(format!(
                            "removal-beyond-f: data center {dc} removed again once back with {:?} failed",
                            world.failed
                        ));
                    }
                    self.steps.truncate(1);
                }
                if let Some(late) = self.late.as_mut().filter(|_| step == Step::Return) {
                    late.made(now);
                }
                self.returns += u32::from(step == Step::Return);
                log.push(format!("{}ms: {step:?} of data center {dc} made", now / 1_000_000));
                self.steps.remove(0);
                self.tries = 0;
                self.not_before = Some(now + RETRY_NS);
            }
            Err(error) => {
                // The node asked has not heard of the removal yet ("not removed"), a
                // promise for another change is held, or the asked node lost its
                // acceptors' answers: asked again, elsewhere. A return refused for a
                // keyspace's strong transactions, or past the lives, is a violation here.
                let text = error.to_string();
                if text.contains("strong transactions") || text.contains("times already") {
                    self.violations.push(format!("return-refused: {step:?} of {dc}: {text}"));
                    self.steps.clear();
                }
                world.reach("return-refused");
                self.not_before = Some(now + RETRY_NS);
            }
        }
    }
}

/// Every replica still serving (not removed, not lost, in a data center not failed)
/// knows the same epochs by the end of the quiet end: each change made is told to
/// every node once, over the reliable channels.
pub fn changes_diverge(world: &GeoWorld) -> Vec<String> {
    let mut seen: Vec<(NodeId, Vec<u32>)> = Vec::new();
    for dc in (0..world.shape.dcs()).filter(|d| !world.failed.contains(d)) {
        for node in world.nodes_of(dc) {
            let Some(engine) = world.world.engine(node) else { continue };
            if engine.is_removed() || engine.is_lost() {
                continue;
            }
            seen.push((node, engine.status().epochs));
        }
    }
    let mut out = Vec::new();
    if let Some((first, epochs)) = seen.first() {
        for (node, other) in &seen[1..] {
            if other != epochs {
                out.push(format!(
                    "changes-diverge: {node} knows epochs {other:?}, {first} knows {epochs:?}"
                ));
            }
        }
    }
    out
}

/// Whether every replica of data center `r` is back (installed, serving) and every
/// replica still serving elsewhere heard it back.
fn is_back(world: &GeoWorld, r: u32) -> bool {
    let back = world.nodes_of(r).into_iter().all(|node| {
        world.world.engine(node).is_some_and(|e| {
            !e.is_removed()
                && !e.is_lost()
                && !e.status().joining
                && e.status().returning.is_empty()
        })
    });
    let heard = (0..world.shape.dcs()).filter(|&d| d != r && !world.failed.contains(&d)).all(|d| {
        world.nodes_of(d).into_iter().all(|node| {
            world.world.engine(node).is_none_or(|e| {
                let status = e.status();
                e.is_removed()
                    || e.is_lost()
                    || !status.returning.contains(&r) && !status.removed.contains(&r)
            })
        })
    });
    back && heard
}

/// Every return under way at the end finished: each new replica of the returning data
/// center installed its copy and is back, and every replica of a survivor that still
/// serves heard it back (`return-stalled` otherwise, with how far each got). A return
/// waits for every data center not removed to answer, so one with a failed data center
/// not removed is not checked (it waits, as designed, until the operator removes that
/// one too).
pub fn returns_stalled(world: &mut GeoWorld) -> Vec<String> {
    let mut out = Vec::new();
    let serving = |world: &GeoWorld, node: NodeId| {
        let engine = world.world.engine(node)?;
        let status = engine.status();
        (!engine.is_removed() && !engine.is_lost() && !status.joining).then_some(status)
    };
    let mut returning = BTreeSet::new();
    let mut removed = BTreeSet::new();
    let mut live = Vec::new();
    for dc in (0..world.shape.dcs()).filter(|d| !world.failed.contains(d)) {
        live.push(dc);
        for node in world.nodes_of(dc) {
            if let Some(status) = serving(world, node) {
                returning.extend(status.returning);
                removed.extend(status.removed);
            }
        }
    }
    // A new replica still joining its data center's latest return stalls it too.
    let latest = |world: &GeoWorld, r: u32| {
        live.iter()
            .flat_map(|&d| world.nodes_of(d))
            .filter_map(|n| world.world.engine(n).map(|e| e.status().epochs[r as usize]))
            .max()
    };
    for r in 0..world.shape.dcs() {
        let epoch = latest(world, r);
        let joins = world.nodes_of(r).into_iter().any(|n| {
            world.world.engine(n).and_then(|e| e.status().join).is_some_and(|j| {
                j.epoch.is_some() && j.epoch == epoch && epoch.is_some_and(|e| e % 2 == 0)
            })
        });
        if joins {
            returning.insert(r);
        }
    }
    if world.failed.iter().any(|dc| !removed.contains(dc) && !returning.contains(dc)) {
        if !returning.is_empty() {
            world.reach("return-waits-for-failed");
        }
        return out;
    }
    for &r in &returning {
        let epoch = latest(world, r);
        for node in world.nodes_of(r) {
            let Some(join) = world.world.engine(node).and_then(|e| e.status().join) else {
                continue;
            };
            out.push(format!(
                "return-stalled: {node} still joins at epoch {:?} of {epoch:?}, with the cut {:?}, settled {:?} of {live:?}, source {:?}",
                join.epoch, join.cut, join.settled, join.source
            ));
        }
        for &dc in live.iter().filter(|&&dc| dc != r) {
            for node in world.nodes_of(dc) {
                let Some(status) = serving(world, node) else { continue };
                if status.returning.contains(&r) {
                    out.push(format!(
                        "return-stalled: {node} has not heard data center {r} back (its cuts: {:?})",
                        status.cuts
                    ));
                }
            }
        }
    }
    // Every data center taken back is back, and heard back everywhere.
    let back = world.lives.iter().all(|l| !world.failed.contains(&l.dc));
    if out.is_empty() && returning.is_empty() && !world.lives.is_empty() && back {
        world.reach("return-back-everywhere");
    }
    out
}
