//! An operator removing a data center during `general` (`KEEL.NODE REMOVE id`,
//! `docs/geo.md`, *Removing a data center*): a failed one, some time after it failed, or
//! (when none failed) a live one, which then counts as failed. The request goes through
//! the front door's conversion (`Command::Cluster`) to a node of another data center;
//! a refusal (the node suspects too many data centers, or is itself cut off) is asked
//! again later, elsewhere.

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
    /// The request in flight: its tag and when it was sent.
    asked: Option<(RequestTag, u64)>,
    /// Not before this time is it asked (again).
    not_before: u64,
    tries: u32,
    done: bool,
}

impl Removal {
    /// Draws a run's removal from `rng` (a stream apart from the run's other draws):
    /// none in half the runs; else a live data center at a random time in a third of
    /// them (if none failed by then), and a failed one 0.2 to 3 s after its failure.
    pub fn draw(mut rng: Rng, run_ns: u64) -> Option<Removal> {
        if !rng.chance(500_000) {
            return None;
        }
        let live_at = rng.chance(333_333).then(|| rng.range(1_000_000_000, run_ns - 1_000_000_000));
        let after_failure_ns = rng.range(200_000_000, 3_000_000_000);
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
        })
    }

    /// Whether nothing is left to do: removed, given up, or nothing to remove.
    pub fn finished(&self, world: &GeoWorld) -> bool {
        let nothing = self.target.is_none() && self.live_at.is_none() && world.failed.is_empty();
        self.done || self.tries >= TRIES_MAX || nothing
    }

    /// Chooses the data center, asks for its removal, and takes the answer, as their
    /// times come.
    pub fn drive(&mut self, world: &mut GeoWorld, log: &mut Vec<String>, now: u64) {
        if self.done {
            return;
        }
        if let Some((tag, at)) = self.asked {
            match world.replies.remove(&tag) {
                Some((_, reply)) => self.answered(world, reply.result, log, now),
                None if now >= at + ANSWER_NS => self.asked = None,
                None => return,
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
        self.asked = Some((world.submit_remove(at, member), now));
        log.push(format!(
            "{}ms: {at} asked to remove data center {dc} ({member})",
            now / 1_000_000
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
        self.target = Some(dc);
        Some(dc)
    }

    fn answered(
        &mut self,
        world: &mut GeoWorld,
        result: Result<keel_core::geo::GeoResult, KeelError>,
        log: &mut Vec<String>,
        now: u64,
    ) {
        self.asked = None;
        match result {
            Ok(_) => {
                self.done = true;
                world.reach("dc-removed");
                log.push(format!("{}ms: data center removed", now / 1_000_000));
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
