//! A survivor that learns of a live data center's removal, and then of its return, late
//! (`general`, with a return drawn and `f` = 2): the fault that reaches the rule that a
//! return's cut waits for every survivor (`docs/geo.md`, *Taking a data center back: the
//! protocol*). As the operator asks to remove live data center `r`, what `r` sends the
//! other survivors is held (it never arrives), and so is everything one survivor `z`
//! sends: `z` alone stores what `r` commits until `z` learns of the removal, and cannot
//! forward it. Once the return is made, `z`'s links to each other survivor's node are let
//! go as that node learns the return (a network that delivers in the worst order it
//! may), and its links to the new replicas 600 ms later: its answer comes after the
//! others'. A cut taken from the first `N - f` answers (the negative control
//! `unsafe_cut_quorum`) lies below what only `z` stored, which the cut then drops though
//! a surviving data center stored it, and which may have been shown meanwhile.

use super::world::GeoWorld;
use crate::rng::Rng;
use keel_types::NodeId;

/// How long after the return is made `z`'s link to the new replicas is let go, ns.
const RELEASE_ANSWER_NS: u64 = 600_000_000;
/// Every hold is let go this long after it began, whatever happened, ns.
const HOLD_MAX_NS: u64 = 8_000_000_000;

/// The fault, once armed.
pub struct LateSurvivor {
    /// The returning data center.
    pub r: u32,
    /// The late survivor.
    pub z: u32,
    /// Links held from the returning data center to the other survivors.
    from_r: Vec<(NodeId, NodeId)>,
    /// Links held from `z` to the other survivors.
    from_z: Vec<(NodeId, NodeId)>,
    /// Links held from `z` to the returning data center's replicas.
    z_to_r: Vec<(NodeId, NodeId)>,
    began: u64,
    /// When `z`'s links to the new replicas are let go, once the return is made.
    release_at: Option<u64>,
}

impl LateSurvivor {
    /// Arms the fault as live data center `r` is to be removed, if `f` is 2, no other
    /// data center failed, and `r` is not cut off; `z` drawn from `rng`.
    pub fn arm(world: &mut GeoWorld, rng: &mut Rng, r: u32, now: u64) -> Option<LateSurvivor> {
        let others: Vec<u32> = (0..world.shape.dcs()).filter(|&d| d != r).collect();
        let alone = world.failed == [r] && world.removed_live == [r];
        let cut = world.world.net.is_cut(world.nodes_of(r)[0], world.nodes_of(others[0])[0]);
        if world.shape.f != 2 || !alone || cut {
            return None;
        }
        let z = others[rng.below(others.len() as u64) as usize];
        let rest: Vec<NodeId> =
            others.iter().filter(|&&d| d != z).flat_map(|&d| world.nodes_of(d)).collect();
        let pairs = |from: Vec<NodeId>, to: &[NodeId]| -> Vec<(NodeId, NodeId)> {
            from.iter().flat_map(|&a| to.iter().map(move |&b| (a, b))).collect()
        };
        let late = LateSurvivor {
            r,
            z,
            from_r: pairs(world.nodes_of(r), &rest),
            from_z: pairs(world.nodes_of(z), &rest),
            z_to_r: pairs(world.nodes_of(z), &world.nodes_of(r)),
            began: now,
            release_at: None,
        };
        for &(a, b) in late.from_r.iter().chain(&late.from_z).chain(&late.z_to_r) {
            world.world.hold(a, b);
        }
        world.reach("late-survivor");
        Some(late)
    }

    /// The return was made now: `z`'s links to the new replicas are let go later.
    pub fn made(&mut self, now: u64) {
        self.release_at.get_or_insert(now + RELEASE_ANSWER_NS);
    }

    /// Lets go of what is due: `z`'s links to each node that learned the return, and
    /// the rest when due; whether every hold was let go.
    pub fn tend(&mut self, world: &mut GeoWorld, now: u64) -> bool {
        let expired = now >= self.began + HOLD_MAX_NS;
        let r = self.r;
        let welcomed = |world: &GeoWorld, node: NodeId| {
            world.world.engine(node).is_some_and(|e| e.status().returning.contains(&r))
        };
        let (due, held): (Vec<_>, Vec<_>) = std::mem::take(&mut self.from_z)
            .into_iter()
            .partition(|&(_, to)| expired || self.release_at.is_some() && welcomed(world, to));
        self.from_z = held;
        release(world, due);
        if self.from_z.is_empty() {
            release(world, std::mem::take(&mut self.from_r));
        }
        if expired || self.release_at.is_some_and(|at| now >= at) {
            release(world, std::mem::take(&mut self.z_to_r));
        }
        self.from_z.is_empty() && self.z_to_r.is_empty()
    }
}

fn release(world: &mut GeoWorld, links: Vec<(NodeId, NodeId)>) {
    for (a, b) in links {
        world.world.release(a, b);
    }
}
