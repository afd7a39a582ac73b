//! A return's cut that reaches some survivors' replicas and not others before the return
//! is abandoned (`general`, with a return to be abandoned and made again): the fault that
//! reaches *Taken back again* (`docs/geo.md`). As the first return is made, what the new
//! replica of partition 0 (the one that sends the cut) sends to some replicas of one
//! survivor data center `s` is held: with two partitions or more, the replicas of every
//! other partition; with one, `s`'s only replica. The operator then asks to abandon the
//! return as soon as a survivor's replica applied the cut, and the holds are let go once
//! the abandon is made and every held replica learned it, so the held cut arrives after
//! its return ended there and is not applied. The next return's cut must then be lowered out of the range the first one
//! lost where it was applied, the replicas that never applied it must apply it with the
//! next cut, and meanwhile must not report storing what their siblings dropped.

use super::world::GeoWorld;
use crate::rng::Rng;
use keel_types::NodeId;

/// Every hold is let go this long after it began, whatever happened, ns.
const HOLD_MAX_NS: u64 = 6_000_000_000;

/// The fault, once armed.
pub struct SplitCut {
    /// The returning data center.
    r: u32,
    /// The return's epoch.
    epoch: u32,
    /// The links held: from `r`'s new replica of partition 0 to replicas of `s`.
    held: Vec<(NodeId, NodeId)>,
    began: u64,
    /// Whether the abandon was made.
    pub abandoned: bool,
}

impl SplitCut {
    /// Arms the fault as the return of `r` at `epoch` is made, if a survivor is left to
    /// hold; `s` and the held partitions drawn from `rng`.
    pub fn arm(world: &mut GeoWorld, rng: &mut Rng, r: u32, epoch: u32) -> Option<SplitCut> {
        let survivors: Vec<u32> =
            (0..world.shape.dcs()).filter(|&d| d != r && !world.failed.contains(&d)).collect();
        if survivors.is_empty() {
            return None;
        }
        let s = survivors[rng.below(survivors.len() as u64) as usize];
        let partitions = world.shape.partitions;
        let kept = rng.below(u64::from(partitions)) as u32;
        let sender = world.nodes_of(r)[0];
        let held: Vec<(NodeId, NodeId)> = world
            .nodes_of(s)
            .into_iter()
            .enumerate()
            .filter(|&(q, _)| partitions == 1 || q as u32 != kept)
            .map(|(_, node)| (sender, node))
            .collect();
        for &(a, b) in &held {
            world.world.hold(a, b);
        }
        world.reach("split-cut");
        Some(SplitCut { r, epoch, held, began: world.now(), abandoned: false })
    }

    /// Whether some survivor's replica applied the return's cut: the abandon is due.
    pub fn cut_applied(&self, world: &GeoWorld) -> bool {
        let survivors = (0..world.shape.dcs()).filter(|&d| d != self.r);
        survivors.flat_map(|d| world.nodes_of(d)).any(|n| {
            world.world.engine(n).is_some_and(|e| {
                e.status().cuts.iter().any(|&(d, _, e)| d == self.r && e == self.epoch)
            })
        })
    }

    /// Whether the abandon may still be waited for (the holds have not held too long).
    pub fn expired(&self, now: u64) -> bool {
        now >= self.began + HOLD_MAX_NS
    }

    /// Whether the holds are due to go: the abandon was made and every held replica
    /// learned it, or they held long enough.
    pub fn due(&self, world: &GeoWorld) -> bool {
        let knows = |node: NodeId| {
            world.world.engine(node).is_none_or(|e| e.status().epochs[self.r as usize] > self.epoch)
        };
        self.expired(world.now()) || self.abandoned && self.held.iter().all(|&(_, b)| knows(b))
    }

    /// Lets go of every hold; counts the abandon that came while the cut was split
    /// (`split-cut-abandoned`): some survivor's replica applied it, a held one did not.
    pub fn release(self, world: &mut GeoWorld) {
        let abandoned = self.abandoned;
        let lacks = |world: &GeoWorld, node: NodeId| {
            world.world.engine(node).is_some_and(|e| {
                !e.status().cuts.iter().any(|&(d, _, e)| d == self.r && e == self.epoch)
            })
        };
        if abandoned && self.cut_applied(world) && self.held.iter().any(|&(_, b)| lacks(world, b)) {
            world.reach("split-cut-abandoned");
        }
        for (a, b) in self.held {
            world.world.release(a, b);
        }
    }
}
