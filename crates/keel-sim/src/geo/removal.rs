//! An operator removing a data center during `general` (`KEEL.NODE REMOVE id`,
//! `docs/geo.md`, *Removing a data center*): a failed one, some time after it failed, or
//! (when none failed) a live one, which then counts as failed. The request goes through
//! the front door's conversion (`Command::Cluster`) to a node of another data center;
//! a refusal (the node suspects too many data centers, or is itself cut off) is asked
//! again later, elsewhere. In half the runs with a removal, once `f` data centers have
//! failed (or been removed) and the others had time to notice, the operator also asks,
//! by mistake, to remove a live one: the engine must refuse it, whichever node is asked
//! (a lost replica fails its data center for its partition only, and the node asked may
//! hold another one). In half the live removals, the data center is cut off from the
//! others for 1 to 3 s as it is asked: its sessions commit on there, untold, meanwhile;
//! half of those cuts last 6 to 8 s instead (or until the quiet end heals every cut),
//! past the removal notices' sends, so that the survivors tell it only once they hear it
//! again (`notice-rearmed`). In half the runs where a failed data center is removed and
//! `f` leaves room for another failure, the node first asked fails, with its data
//! center, within 300 ms of the request: its
//! proposal's promises (or its commit) are left undecided at the acceptors, which must
//! settle them among themselves (`promise-held` otherwise). The operator then removes the
//! asker's data center instead. In every run where a live data center is removed
//! with `f` spent by it, and that data center is not cut off, the node that made the
//! removal is cut off with its data center the moment it answers, before its news
//! leaves: the acceptors that recorded the commit must keep counting the removal, made
//! though none of them knows it, and the operator's removal of the cut-off data center,
//! asked 3.5 to 5.5 s later (after the acceptors asked each other about their undecided
//! votes), must be refused (`removal-beyond-f` otherwise). In half the runs that remove a
//! live data center not cut off, the node asked is cut off with its data center as the
//! removed data center's acceptor records the commit, and the operator waits
//! (`DecidingCut`): the acceptors settle the removal among themselves, and the removed
//! acceptor, which may be the only one that finds it made, must tell the survivors
//! (`removal-unknown` otherwise).

use super::world::GeoWorld;
use crate::rng::Rng;
use keel_core::engine::RequestTag;
use keel_types::{KeelError, NodeId};

/// How long after a refusal or a lost answer the removal is asked again, ns.
const RETRY_NS: u64 = 500_000_000;
/// Requests, at most.
const TRIES_MAX: u32 = 20;
/// How long an answer may take before the removal is asked again, ns.
const ANSWER_NS: u64 = 2_000_000_000;
/// How long after the `f`-th failure the mistaken removal is asked, at least and at most,
/// ns (the simulator suspects after 1 s of silence).
const MISTAKE_AFTER_NS: (u64, u64) = (1_500_000_000, 3_000_000_000);
/// How long a long cut of a live data center being removed lasts.
const LONG_CUT_NS: (u64, u64) = (6_000_000_000, 8_000_000_000);
/// How long after the first request the node asked fails, at most, when it does, ns:
/// the promises take one round trip between data centers (at most 200 ms here), the
/// commits another.
const ASKER_FAILS_NS: u64 = 300_000_000;
/// How long the asker of a live removal is cut off once the removed data center's
/// acceptor recorded the commit, at least: past the round's deadline (two suspicion
/// time-outs) and the acceptors' asks (three), ns.
const DECIDING_CUT_NS: u64 = 4_000_000_000;
/// How long after that another acceptor may record the commit and be held, ns.
const OTHER_COMMITS_NS: u64 = 500_000_000;
/// When the other committed acceptor's messages to the removed one are held, after it
/// recorded the commit: from shortly before its ask (three suspicion time-outs after
/// its record) until past the removed one's ask has reached it and been answered, ns.
const HELD_AROUND_ASKS_NS: (u64, u64) = (2_700_000_000, 3_700_000_000);
/// How long after the node that made a removal is cut off the operator asks to remove
/// its data center, at least and at most, ns: past the acceptors' asks about undecided
/// votes (three suspicion time-outs of 1 s).
const CUT_ASKER_REMOVED_AFTER_NS: (u64, u64) = (3_500_000_000, 5_500_000_000);

/// The run's planned removal.
pub struct Removal {
    rng: Rng,
    /// When to remove a live data center, if none failed by then.
    live_at: Option<u64>,
    /// How long after a data center failed to remove it.
    after_failure_ns: u64,
    /// When a failure was first seen, and the data center.
    failed_seen: Option<(u64, u32)>,
    /// The data center being removed, once chosen.
    target: Option<u32>,
    /// The request in flight: its tag, when it was sent, and the node asked.
    asked: Option<(RequestTag, u64, NodeId)>,
    /// Not before this time is it asked (again).
    not_before: u64,
    tries: u32,
    done: bool,
    /// The data center removed, and when, once the removal is made.
    made: Option<(u32, u64)>,
    /// A live data center being removed is cut off from the others until then, in half
    /// the live removals: its clients go on committing there, untold, for a while. Half
    /// the cuts last 6 to 8 s (or until the quiet end heals every cut), past the notices'
    /// sends (`NOTICE_SENDS_MAX`), so the survivors tell it again only once they hear it.
    cut_until: Option<u64>,
    /// The mistaken removal beyond `f`, if the run asks one: how long after the `f`-th
    /// failure, when that was seen, the request in flight, and whether it was answered.
    mistake: Option<Mistake>,
    /// Whether the node first asked fails (if `f` leaves room), drawn from a stream of
    /// its own; once asked, when and which node.
    asker_fails: Option<Rng>,
    asker_crash: Option<(u64, NodeId)>,
    /// The stream of the cut of the node that made a live removal with its data center
    /// (if that spent `f`); once cut, the operator's removal of its data center.
    asker_cut: Option<Rng>,
    cut_asker: Option<CutAsker>,
    /// A live removal's asker cut off with its data center while it decides: when, the
    /// node, how long, and (once cut) until when.
    deciding_cut: Option<DecidingCut>,
    /// What went wrong: a removal beyond `f` that was made.
    pub violations: Vec<String>,
}

/// The data center of the node that made a removal, cut off as it answered, and the
/// operator's removal of it, which must be refused (`f` is spent).
struct CutAsker {
    rng: Rng,
    dc: u32,
    /// The cut lasts until then (re-applied after another fault's heal); `None` once
    /// healed.
    until: Option<u64>,
    /// When the operator asks to remove `dc`, and the request in flight.
    ask_at: u64,
    asked: Option<(RequestTag, u64)>,
    tries: u32,
    answered: bool,
}

/// The node asked to remove a live data center, cut off with its data center the moment
/// the removed data center's own acceptor `R` records the commit (the votes not back
/// yet), until the acceptors have asked each other about their votes; the operator waits,
/// so the acceptors alone settle what was made. When another acceptor `X`, outside the
/// asker's data center, recorded the commit too, `X`'s messages to `R` are held around
/// the acceptors' asks: `X`'s ask and its answer to `R`'s reach `R` together, so `R`
/// learns the removal from `X`'s answer and stops before its own answer to `X` leaves.
/// `R` is then the only one that knows the removal was made: it must tell every survivor.
struct DecidingCut {
    node: NodeId,
    /// `R`.
    acceptor: NodeId,
    /// When the cut began, and `X` with when it recorded the commit, once seen.
    since: Option<u64>,
    other: Option<(NodeId, u64)>,
}

/// A removal beyond `f`, asked by mistake; the engine must refuse it.
struct Mistake {
    rng: Rng,
    after_ns: u64,
    spent_at: Option<u64>,
    asked: Option<(RequestTag, u64, u32)>,
    tries: u32,
    answered: bool,
    /// After a refusal for another reason (a removal under way), asked again from then.
    not_before: u64,
}

impl Removal {
    /// Draws a run's removal from `rng` (a stream apart from the run's other draws):
    /// none in half the runs; else a live data center at a random time in a third of
    /// them (if none failed by then), and a failed one 0.2 to 3 s after its failure. The
    /// mistaken removal beyond `f` is drawn from `apart`, its own stream.
    pub fn draw(mut rng: Rng, mut apart: Rng, run_ns: u64) -> Option<Removal> {
        if !rng.chance(500_000) {
            return None;
        }
        let live_at = rng.chance(333_333).then(|| rng.range(1_000_000_000, run_ns - 1_000_000_000));
        let after_failure_ns = rng.range(200_000_000, 3_000_000_000);
        let mistake = apart.chance(500_000).then(|| Mistake {
            after_ns: apart.range(MISTAKE_AFTER_NS.0, MISTAKE_AFTER_NS.1),
            rng: apart.fork(),
            spent_at: None,
            asked: None,
            tries: 0,
            answered: false,
            not_before: 0,
        });
        let asker_fails = apart.chance(500_000).then(|| apart.fork());
        let asker_cut = Some(apart.fork());
        Some(Removal {
            rng,
            live_at,
            after_failure_ns,
            failed_seen: None,
            target: None,
            asked: None,
            not_before: 0,
            tries: 0,
            done: false,
            made: None,
            cut_until: None,
            mistake,
            asker_fails,
            asker_crash: None,
            asker_cut,
            cut_asker: None,
            deciding_cut: None,
            violations: Vec::new(),
        })
    }

    /// Removes a live data center at `at` unless one failed by then (for the late
    /// survivor's fault, `super::late`).
    pub fn live_at(&mut self, at: u64) {
        self.live_at = Some(at);
    }

    /// The data center being removed, once chosen.
    pub fn target(&self) -> Option<u32> {
        self.target
    }

    /// The data center removed, and when, once the removal is made.
    pub fn made(&self) -> Option<(u32, u64)> {
        self.made
    }

    /// Whether nothing is left to do: removed, given up, or nothing to remove.
    pub fn finished(&self, world: &GeoWorld) -> bool {
        let nothing = self.target.is_none() && self.live_at.is_none() && world.failed.is_empty();
        let cut = self.deciding_cut.is_some();
        (self.done || self.tries >= TRIES_MAX || nothing) && !cut
    }

    /// The mistaken removal: once `f` data centers failed (none of them a live one whose
    /// removal is not made yet) and `after_ns` passed, a live data center, at a node of
    /// another live one. Refused, it is done; made, it is a violation.
    fn drive_mistake(&mut self, world: &mut GeoWorld, log: &mut Vec<String>, now: u64) {
        let f = world.shape.f as usize;
        let Some(m) = self.mistake.as_mut().filter(|m| !m.answered && f > 0) else { return };
        if let Some((tag, at, dc)) = m.asked {
            match world.replies.remove(&tag) {
                Some((_, reply)) => {
                    m.asked = None;
                    let refused = "removal-beyond-f-refused";
                    let violations = &mut self.violations;
                    m.answered = settled_beyond_f(world, violations, reply.result, dc, "", refused);
                    if !m.answered {
                        m.not_before = now + RETRY_NS;
                    }
                }
                None if now >= at + ANSWER_NS => m.asked = None,
                None => {}
            }
            return;
        }
        // Not while a failed data center is coming back: once back, `f` is no longer
        // spent, and the removal may rightly be made.
        let coming_back = world.lives.iter().any(|l| world.failed.contains(&l.dc));
        if world.failed.len() < f {
            // Not spent (any more: a data center taken back): counted from when it is.
            m.spent_at = None;
        }
        if world.failed.len() < f || m.tries >= TRIES_MAX || now < m.not_before {
            return;
        }
        // A live data center whose removal no node knows made (asked and not answered,
        // or left to the acceptors by the deciding cut, which may abort it: seed
        // 1190004397) may be live again, so `f` is not known spent.
        let pending_live = self.target.is_some() && !self.done && !world.removed_live.is_empty();
        if pending_live || world.removed_live.iter().any(|&d| !known_removed(world, d)) {
            return;
        }
        if coming_back {
            return;
        }
        let spent = *m.spent_at.get_or_insert(now);
        if now < spent + m.after_ns {
            return;
        }
        let live: Vec<u32> = (0..world.shape.dcs()).filter(|d| !world.failed.contains(d)).collect();
        if live.len() < 2 {
            return;
        }
        let dc = live[m.rng.below(live.len() as u64) as usize];
        // Asked at any node of another live data center, even one that has not heard of
        // a removal made so far (made at a node then cut off, say): removals are agreed,
        // so the acceptors that promised that one refuse this one until they know it made.
        let askers: Vec<NodeId> =
            live.iter().filter(|&&d| d != dc).flat_map(|&d| world.nodes_of(d)).collect();
        if askers.is_empty() {
            return;
        }
        let at = askers[m.rng.below(askers.len() as u64) as usize];
        let member = world.nodes_of(dc)[0];
        m.tries += 1;
        m.asked = Some((world.submit_remove(at, member), now, dc));
        log.push(format!(
            "{}ms: {at} asked, by mistake, to remove live data center {dc}",
            now / 1_000_000
        ));
    }

    /// Chooses the data center, asks for its removal, and takes the answer, as their
    /// times come.
    pub fn drive(&mut self, world: &mut GeoWorld, log: &mut Vec<String>, now: u64) {
        if self.cut_until.is_some_and(|until| now >= until) {
            self.cut_until = None;
            world.heal();
            log.push(format!("{}ms: the data center being removed is reachable", now / 1_000_000));
        }
        self.drive_mistake(world, log, now);
        self.crash_asker(world, log, now);
        self.drive_cut_asker(world, log, now);
        self.drive_deciding_cut(world, log, now);
        if self.done {
            return;
        }
        if let Some((tag, at, node)) = self.asked {
            match world.replies.remove(&tag) {
                Some((_, reply)) => self.answered(world, reply.result, node, log, now),
                None if now >= at + ANSWER_NS => self.asked = None,
                None => return,
            }
            if self.done {
                return;
            }
        }
        if self.asked.is_some() || now < self.not_before || self.tries >= TRIES_MAX {
            return;
        }
        let Some(dc) = self.choose(world, log, now) else { return };
        let askers: Vec<NodeId> = (0..world.shape.dcs())
            .filter(|d| *d != dc && !world.failed.contains(d))
            .flat_map(|d| world.nodes_of(d))
            .collect();
        let Some(&at) = askers.get(self.rng.below(askers.len() as u64) as usize) else {
            return;
        };
        let members = world.nodes_of(dc);
        let member = members[self.rng.below(members.len() as u64) as usize];
        self.tries += 1;
        self.asked = Some((world.submit_remove(at, member), now, at));
        log.push(format!(
            "{}ms: {at} asked to remove data center {dc} ({member})",
            now / 1_000_000
        ));
        // Only for a failed data center: a live one whose removal the failure leaves
        // unmade is live again, which the simulator's count of failures cannot undo.
        // A live one's asker is cut off instead, unless the live one is (it then takes
        // no part in the votes).
        let failed = !world.removed_live.contains(&dc);
        match self.asker_fails.take() {
            Some(mut rng) if failed && world.shape.f >= 2 => {
                self.asker_crash = Some((now + rng.below(ASKER_FAILS_NS), at));
            }
            Some(_) if !failed && self.cut_until.is_none() => {
                let acceptor = world.nodes_of(dc)[0];
                let c = DecidingCut { node: at, acceptor, since: None, other: None };
                self.deciding_cut = Some(c);
            }
            _ => {}
        }
    }

    /// Cuts the asker of a live removal off with its data center once the removed data
    /// center's acceptor recorded the commit, if the removal is not answered yet (from
    /// then on the operator waits: the removal is not asked again); holds the other
    /// committed acceptor's messages to it around the asks; heals at the end.
    fn drive_deciding_cut(&mut self, world: &mut GeoWorld, log: &mut Vec<String>, now: u64) {
        let Some(c) = self.deciding_cut.as_mut() else { return };
        let dc = world.dc_of(c.node);
        let Some(since) = c.since else {
            if self.done || self.asked.is_none() {
                self.deciding_cut = None;
            } else if committed(world, c.acceptor, world.dc_of(c.acceptor)) {
                c.since = Some(now);
                self.done = true;
                world.isolate_dc(dc);
                world.reach("asker-cut-deciding");
                log.push(format!(
                    "{}ms: {}, asked to remove a live data center, is cut off with data center {dc} as it decides",
                    now / 1_000_000,
                    c.node
                ));
            }
            return;
        };
        let target = world.dc_of(c.acceptor);
        if c.other.is_none() && now < since + OTHER_COMMITS_NS {
            let others = (0..world.shape.dcs()).filter(|&d| d != dc && d != target);
            let acceptors: Vec<NodeId> = others.map(|d| world.nodes_of(d)[0]).collect();
            if let Some(x) = acceptors.into_iter().find(|&x| committed(world, x, target)) {
                c.other = Some((x, now));
                world.reach("asker-cut-deciding-other");
            }
        }
        let (hold_from, hold_until) = HELD_AROUND_ASKS_NS;
        let held = c.other.filter(|&(_, t)| now >= t + hold_from && now < t + hold_until);
        if let Some((x, _)) = held {
            world.world.net.cut_one_way(&[x], &[c.acceptor]);
        }
        let ended = c.other.map_or(since + OTHER_COMMITS_NS, |(_, t)| t + hold_until);
        if now < ended.max(since + DECIDING_CUT_NS) {
            world.isolate_dc(dc);
        } else {
            self.deciding_cut = None;
            world.heal();
            log.push(format!("{}ms: data center {dc} reachable again", now / 1_000_000));
        }
    }

    /// The node first asked fails with its data center when its time comes (if `f`
    /// still leaves room): the operator then asks to remove that data center instead.
    fn crash_asker(&mut self, world: &mut GeoWorld, log: &mut Vec<String>, now: u64) {
        let Some((at, node)) = self.asker_crash.filter(|&(at, _)| at <= now) else { return };
        self.asker_crash = None;
        let dc = world.dc_of(node);
        if !world.may_fail() || world.failed.contains(&dc) {
            return;
        }
        for partition in 0..world.shape.partitions {
            world.crash_replica(dc, partition);
        }
        world.reach("asker-failed");
        log.push(format!(
            "{}ms: {node}, asked to remove a data center, fails with data center {dc}",
            at / 1_000_000
        ));
        self.target = Some(dc);
        self.done = false;
        self.asked = None;
        self.not_before = now + RETRY_NS;
    }

    /// `node` made the removal of a live data center just now: in the runs drawn, if that
    /// spent `f` and the removed data center is not cut off itself, `node`'s data center
    /// is cut off before the removal's news leaves it (the news takes a wide-area
    /// latency; this runs within a millisecond of the answer).
    fn cut_the_asker(
        &mut self,
        world: &mut GeoWorld,
        node: NodeId,
        log: &mut Vec<String>,
        now: u64,
    ) {
        let Some(target) = self.target else { return };
        let live = world.removed_live.contains(&target);
        let spent = world.failed.len() >= world.shape.f as usize;
        if !live || !spent || self.cut_until.is_some() {
            return;
        }
        let Some(mut rng) = self.asker_cut.take() else { return };
        let dc = world.dc_of(node);
        let (low, high) = CUT_ASKER_REMOVED_AFTER_NS;
        let ask_at = now + rng.range(low, high);
        let until = Some(now + rng.range(LONG_CUT_NS.0, LONG_CUT_NS.1));
        world.isolate_dc(dc);
        world.reach("asker-cut");
        log.push(format!(
            "{}ms: {node}, which made the removal, is cut off with data center {dc}",
            now / 1_000_000
        ));
        self.cut_asker =
            Some(CutAsker { rng, dc, until, ask_at, asked: None, tries: 0, answered: false });
    }

    /// Keeps the cut-off asker's data center cut off until its time (another fault's
    /// heal may have restored it), and asks to remove it, at a node of another live data
    /// center, when its time comes. With `f` spent, it must be refused.
    fn drive_cut_asker(&mut self, world: &mut GeoWorld, log: &mut Vec<String>, now: u64) {
        let Some(c) = self.cut_asker.as_mut() else { return };
        match c.until {
            Some(until) if now < until => world.isolate_dc(c.dc),
            Some(_) => {
                c.until = None;
                world.heal();
                log.push(format!("{}ms: data center {} reachable again", now / 1_000_000, c.dc));
            }
            None => {}
        }
        if c.answered || now < c.ask_at {
            return;
        }
        if let Some((tag, at)) = c.asked {
            match world.replies.remove(&tag) {
                Some((_, reply)) => {
                    c.asked = None;
                    let why = " (cut off with the node that made a removal)";
                    let violations = &mut self.violations;
                    let result = reply.result;
                    c.answered =
                        settled_beyond_f(world, violations, result, c.dc, why, "asker-cut-refused");
                    // Busy, unavailable, or an unknown outcome: asked again later (a removal
                    // made from an unknown outcome is caught at the end,
                    // `removal-outcome-found`).
                    if !c.answered {
                        c.ask_at = now + RETRY_NS;
                    }
                }
                None if now >= at + 3 * ANSWER_NS => c.asked = None,
                None => {}
            }
            return;
        }
        if c.tries >= TRIES_MAX {
            return;
        }
        let askers: Vec<NodeId> = (0..world.shape.dcs())
            .filter(|d| *d != c.dc && !world.failed.contains(d))
            .flat_map(|d| world.nodes_of(d))
            .collect();
        if askers.is_empty() {
            return;
        }
        let at = askers[c.rng.below(askers.len() as u64) as usize];
        let member = world.nodes_of(c.dc)[0];
        c.tries += 1;
        c.asked = Some((world.submit_remove(at, member), now));
        log.push(format!(
            "{}ms: {at} asked to remove data center {}, cut off with the node that made a removal",
            now / 1_000_000,
            c.dc
        ));
    }

    /// The data center to remove, once its time has come: the first failed one, or a
    /// live one at its time when none failed (it counts as failed from then on).
    fn choose(&mut self, world: &mut GeoWorld, log: &mut Vec<String>, now: u64) -> Option<u32> {
        if let Some(dc) = self.target {
            return Some(dc);
        }
        if let Some(&dc) = world.failed.first() {
            let (seen, dc) = *self.failed_seen.get_or_insert((now, dc));
            if now < seen + self.after_failure_ns {
                return None;
            }
            self.target = Some(dc);
            return Some(dc);
        }
        let at = self.live_at?;
        if now < at || world.shape.f == 0 {
            return None;
        }
        let dc = self.rng.below(u64::from(world.shape.dcs())) as u32;
        world.remove_live(dc);
        world.reach("dc-remove-live");
        log.push(format!("{}ms: data center {dc} to be removed, live", now / 1_000_000));
        if self.rng.chance(500_000) {
            world.isolate_dc(dc);
            let long = self.rng.chance(500_000);
            let (low, high) = if long { LONG_CUT_NS } else { (1_000_000_000, 3_000_000_000) };
            self.cut_until = Some(now + self.rng.range(low, high));
            world.reach(if long { "dc-remove-live-long-cut" } else { "dc-remove-live-cut" });
            log.push(format!("{}ms: data center {dc} cut off", now / 1_000_000));
        }
        self.target = Some(dc);
        Some(dc)
    }

    fn answered(
        &mut self,
        world: &mut GeoWorld,
        result: Result<keel_core::geo::GeoResult, KeelError>,
        node: NodeId,
        log: &mut Vec<String>,
        now: u64,
    ) {
        self.asked = None;
        match result {
            Ok(_) => {
                self.done = true;
                self.made = self.target.map(|dc| (dc, now));
                world.reach("dc-removed");
                log.push(format!("{}ms: data center removed", now / 1_000_000));
                self.cut_the_asker(world, node, log, now);
            }
            Err(KeelError::InvalidArgument(why)) => {
                assert!(
                    why.contains("removed or suspected"),
                    "a removal refused for another reason: {why}"
                );
                world.reach("removal-refused");
                self.not_before = now + RETRY_NS;
            }
            // The node asked has failed since, or its data center was removed: elsewhere.
            Err(_) => self.not_before = now + RETRY_NS,
        }
    }
}

/// Whether some node knows data center `dc`'s removal made (for good: only a return
/// undoes it). A commit recorded with the outcome unknown may still be aborted.
fn known_removed(world: &GeoWorld, dc: u32) -> bool {
    let nodes = world.world.node_ids().into_iter().filter_map(|n| world.world.engine(n));
    nodes.map(|e| e.status().epochs[dc as usize]).any(|epoch| epoch % 2 == 1)
}

/// The answer to a removal of data center `dc` that must be refused, as `f` is spent:
/// whether it settled it. Made, it is a violation (`what` says more of `dc`), and `dc`
/// counts as failed; refused as beyond `f`, the run reaches `refused`. Any other answer
/// (busy, unavailable, an unknown outcome) settles nothing: it is asked again.
fn settled_beyond_f(
    world: &mut GeoWorld,
    violations: &mut Vec<String>,
    result: Result<keel_core::geo::GeoResult, KeelError>,
    dc: u32,
    what: &str,
    refused: &str,
) -> bool {
    match result {
        Ok(_) => {
            world.remove_beyond_f(dc);
            violations.push(format!(
                "removal-beyond-f: data center {dc}{what} removed at {}ms with {:?} failed already (f = {})",
                world.now() / 1_000_000,
                world.failed,
                world.shape.f
            ));
            true
        }
        Err(KeelError::InvalidArgument(why)) if why.contains("removed or suspected") => {
            world.reach(refused);
            true
        }
        Err(_) => false,
    }
}

/// An operator's mistake of another kind: `f + 1` removals asked at once, of live data
/// centers, each at a node of another data center, in a run with no failure yet. Each
/// passes its own node's count; the agreement must make at most `f` of them
/// (`keel-core/src/geo/engine/agree.rs`). A removal made counts its data center failed
/// from then on (its sessions go on until its replicas are told).
pub struct Pair {
    rng: Rng,
    /// When the removals are asked.
    at: u64,
    /// The requests in flight: tag, data center, when sent.
    asked: Vec<(RequestTag, u32, u64)>,
    sent: bool,
    /// Whether a removal was answered `TIMEOUT` (its outcome unknown: it may be made
    /// later, from the acceptors' votes): no data center fails for the rest of the run,
    /// as the count of failures no longer knows how many are removed.
    unknown: bool,
    /// What went wrong: more than `f` removals made.
    pub violations: Vec<String>,
}

impl Pair {
    /// Draws the mistake in a third of the runs, from `rng` (a stream of its own), at a
    /// random time in the first half of the run.
    pub fn draw(mut rng: Rng, run_ns: u64) -> Option<Pair> {
        if !rng.chance(333_333) {
            return None;
        }
        let at = rng.range(1_000_000_000, run_ns / 2);
        Some(Pair {
            rng,
            at,
            asked: Vec::new(),
            sent: false,
            unknown: false,
            violations: Vec::new(),
        })
    }

    /// Asks the removals when their time comes; takes the answers.
    pub fn drive(&mut self, world: &mut GeoWorld, log: &mut Vec<String>, now: u64) {
        let f = world.shape.f as usize;
        let mut left = Vec::new();
        for (tag, dc, at) in std::mem::take(&mut self.asked) {
            match world.replies.remove(&tag) {
                Some((_, reply)) => match reply.result {
                    Ok(_) => {
                        world.reach("pair-removed");
                        if !world.failed.contains(&dc) {
                            world.remove_beyond_f(dc);
                        }
                        log.push(format!("{}ms: data center {dc} removed", now / 1_000_000));
                        if world.failed.len() > f {
                            self.violations.push(format!(
                                "removal-beyond-f: removals asked at once made {:?} (f = {f})",
                                world.failed
                            ));
                        }
                    }
                    Err(KeelError::Timeout) => {
                        world.reach("pair-unknown");
                        self.unknown = true;
                    }
                    Err(_) => world.reach("pair-refused"),
                },
                // Each of a proposal's two rounds ends within twice the suspicion
                // time-out (2 s here): the answer comes by then.
                None if now < at + 3 * ANSWER_NS => left.push((tag, dc, at)),
                None => {}
            }
        }
        self.asked = left;
        world.failures_held = !self.asked.is_empty() || self.unknown;
        if self.sent || now < self.at {
            return;
        }
        self.sent = true;
        if !world.failed.is_empty() || f == 0 {
            return;
        }
        let mut dcs: Vec<u32> = (0..world.shape.dcs()).collect();
        self.rng.shuffle(&mut dcs);
        world.reach("pair-asked");
        for &dc in &dcs[..f + 1] {
            let askers: Vec<NodeId> = (0..world.shape.dcs())
                .filter(|&d| d != dc)
                .flat_map(|d| world.nodes_of(d))
                .collect();
            let at = askers[self.rng.below(askers.len() as u64) as usize];
            let member = world.nodes_of(dc)[0];
            self.asked.push((world.submit_remove(at, member), dc, now));
            log.push(format!(
                "{}ms: {at} asked, at once with others, to remove data center {dc}",
                now / 1_000_000
            ));
        }
        world.failures_held = true;
    }
}

/// Whether acceptor `node` recorded the commit of data center `dc`'s removal.
fn committed(world: &GeoWorld, node: NodeId, dc: u32) -> bool {
    world.world.engine(node).is_some_and(|e| e.status().removal_committed.contains(&dc))
}
