//! `keel sim bench --scale`: how writes scale with the replica groups of a sharded
//! cluster, in virtual time.
//!
//! On real processes, six nodes share this machine's two cores, so a second group of
//! three takes processor time from the first. Here each node has a processor of its own
//! ([`CpuCost`]: a cost per step and per message sent, a step's output leaving when it
//! is over): a cluster of `3 × G` nodes hosts `G` ORCA keyspaces, each on its own group
//! of three (placed as `keel up --nodes 3G --sharded` places them), the hash slots split
//! evenly among them. Closed-loop clients, as many per group, write keys, each sent to
//! the leader of its slot's keyspace, as a cluster client sends it: either any key
//! (each request's group drawn anew, so the requests waiting at a group vary around
//! their mean), or keys of one group per client (the load of every group held even,
//! which measures what the groups can take). The result depends only on the model, the
//! group count and the seed.

use crate::disk::HardStateMode;
use crate::net::NetConfig;
use crate::rng::Rng;
use crate::scenario::engine_config;
use crate::world::{CpuCost, Notice, World, WorldConfig};
use keel_core::leader::{ClientRequest, LeaderEngine, RequestTag};
use keel_types::{ClientId, Command, Durability, NodeId, RequestId};
use keel_wire::slots::{key_slot, SLOTS};
use std::collections::BTreeMap;

/// Replicas per group.
pub const REPLICAS: u32 = 3;
/// Closed-loop clients per group.
pub const CLIENTS_PER_GROUP: u64 = 128;
/// Keys written, uniformly.
pub const KEYS: u64 = 100_000;
/// The group counts measured.
pub const GROUPS: [u32; 4] = [1, 2, 4, 8];

/// The model's parameters.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Model {
    /// Processor cost of a step, ns.
    pub step_ns: u64,
    /// Processor cost of each message sent, ns.
    pub message_ns: u64,
    /// One-way network latency between nodes, ns (uniform in `[latency_ns, 2 × latency_ns)`).
    pub latency_ns: u64,
    /// One-way latency between a client and a node, ns.
    pub client_latency_ns: u64,
    /// The durability each write asks for.
    pub durability: Durability,
    /// Virtual time measured, after `warmup_ns`.
    pub measure_ns: u64,
    /// Virtual time run before measuring.
    pub warmup_ns: u64,
}

impl Default for Model {
    /// 5 µs per step and 2 µs per message sent (the order of a server's engine step and
    /// frame on this machine); 50 µs one way between nodes (a data-center network), 50
    /// µs to clients; replicated writes (a majority holds them in memory); 100 ms
    /// measured after 100 ms.
    fn default() -> Model {
        Model {
            step_ns: 5_000,
            message_ns: 2_000,
            latency_ns: 50_000,
            client_latency_ns: 50_000,
            durability: Durability::Replicated,
            measure_ns: 100_000_000,
            warmup_ns: 100_000_000,
        }
    }
}

/// One measured point.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Point {
    /// Replica groups (ORCA keyspaces, each with its share of the slots).
    pub groups: u32,
    /// Nodes.
    pub nodes: u32,
    /// Acknowledged writes per second of virtual time.
    pub writes_per_s: f64,
    /// Whether each client wrote keys of one group only.
    pub pinned: bool,
    /// Writes answered with an error (none expected without faults).
    pub failed: u64,
}

/// The keyspace serving `slot` when [`SLOTS`] are split evenly among `groups`, as
/// `keel_wire::slots::SlotRanges::share` splits them.
pub fn owner(slot: u16, groups: u32) -> u32 {
    let at = |k: u32| (u64::from(k) * u64::from(SLOTS) / u64::from(groups)) as u16;
    (0..groups).rev().find(|k| at(*k) <= slot).expect("slot 0 is in the first share")
}

fn world(groups: u32, model: &Model, seed: u64) -> World<LeaderEngine> {
    let nodes = groups * REPLICAS;
    let config = WorldConfig {
        engine: engine_config(REPLICAS),
        nodes,
        keyspaces: groups,
        net: NetConfig {
            latency_ns_min: model.latency_ns,
            latency_ns_max: 2 * model.latency_ns,
            ..NetConfig::perfect()
        },
        client_latency_ns: model.client_latency_ns,
        fsync_ns_min: 100_000,
        fsync_ns_max: 200_000,
        clock_offset_ns_max: 1,
        hard_state_mode: HardStateMode::Sync,
        torn_tail: false,
        events_max: 10_000_000,
        crash_after_vote_ppm: 0,
        late_open_copy_ppm: 0,
        unsafe_skip_truncation_clamp: false,
        spread_leaders: true,
        reads_off_loop_ppm: 0,
        process_crash_ppm: 0,
        clock_reboot_ppm: 0,
        drift_change_ppm: 0,
        fault_seed: seed,
        link_bulk_bytes_max: keel_exec::LINK_BULK_BYTES_MAX,
        unsafe_unbounded_links: false,
        forwarded_replies_bytes_max: keel_exec::FORWARDED_REPLIES_BYTES_MAX,
        wall_skew_ms_max: 0,
        voters: 0,
        replicas: REPLICAS,
    };
    World::new(config, seed)
}

/// Writes per second of `groups` groups under `model`; `pinned`: each client writes keys
/// of one group only (client `c` of group `c mod groups`).
pub fn measure(groups: u32, model: &Model, seed: u64, pinned: bool) -> Point {
    let mut world = world(groups, model, seed);
    // Elections first, without processor costs.
    let mut t = 0;
    let leaders = loop {
        t += 10_000_000;
        world.run_until(t);
        let leaders: Option<Vec<NodeId>> = (0..groups).map(|ks| world.leader_in(ks)).collect();
        if let Some(leaders) = leaders {
            break leaders;
        }
        assert!(t < 30_000_000_000, "{groups} groups elected no leaders in 30 s");
    };
    for (ks, leader) in leaders.iter().enumerate() {
        assert!(world.group(ks as u32).contains(leader), "keyspace {ks} led from outside");
    }
    world.cpu = Some(CpuCost { step_ns: model.step_ns, message_ns: model.message_ns });
    let start = world.now_ns();
    let mut rng = Rng::new(seed ^ 0x5CA1E);
    let mut client_of: BTreeMap<RequestTag, u64> = BTreeMap::new();
    let mut serial = 0u64;
    let mut send = |world: &mut World<LeaderEngine>, client: u64, serial: &mut u64| {
        *serial += 1;
        let (key, ks) = loop {
            let key = format!("key:{}", rng.range(0, KEYS));
            let ks = owner(key_slot(key.as_bytes()), groups);
            if !pinned || u64::from(ks) == client % u64::from(groups) {
                break (key, ks);
            }
        };
        let request = ClientRequest {
            tag: RequestTag(0),
            client: ClientId(client),
            request: RequestId(*serial),
            command: Command::Put { key: key.into_bytes().into(), value: b"value".to_vec().into() },
            durability: Some(model.durability),
            level: None,
            after: keel_types::LogIndex::ZERO,
            mode: Default::default(),
            named: false,
        };
        world.submit_to(leaders[ks as usize], ks, request)
    };
    for client in 1..=CLIENTS_PER_GROUP * u64::from(groups) {
        let tag = send(&mut world, client, &mut serial);
        client_of.insert(tag, client);
    }
    let (measure_from, end) = (start + model.warmup_ns, start + model.warmup_ns + model.measure_ns);
    let (mut done, mut failed) = (0u64, 0u64);
    while world.now_ns() < end {
        let step_to = world.now_ns() + 10_000;
        for notice in world.run_until(step_to) {
            let Notice::Reply { reply, .. } = notice else { continue };
            let Some(client) = client_of.remove(&reply.tag) else { continue };
            let at = world.now_ns();
            if (measure_from..end).contains(&at) {
                match reply.result {
                    Ok(_) => done += 1,
                    Err(_) => failed += 1,
                }
            }
            let tag = send(&mut world, client, &mut serial);
            client_of.insert(tag, client);
        }
    }
    assert!(world.violations().is_empty(), "{:?}", world.violations());
    Point {
        groups,
        nodes: groups * REPLICAS,
        writes_per_s: done as f64 * 1e9 / model.measure_ns as f64,
        pinned,
        failed,
    }
}

/// `keel sim bench --scale`: each group count of [`GROUPS`], as a table or one JSON
/// object per point.
pub fn run_cli(json: bool, seed: u64) -> std::process::ExitCode {
    let model = Model::default();
    let mut points = Vec::new();
    for groups in GROUPS {
        points.push(measure(groups, &model, seed, false));
        points.push(measure(groups, &model, seed, true));
    }
    if json {
        for p in &points {
            println!("{}", serde_json::json!({"model": model, "seed": seed, "point": p}));
        }
        return std::process::ExitCode::SUCCESS;
    }
    println!(
        "Sharded ORCA in virtual time: groups of {REPLICAS}, {CLIENTS_PER_GROUP} closed-loop clients per group, {} ns per step, {} ns per message sent, {} µs one way, {:?} writes",
        model.step_ns,
        model.message_ns,
        model.latency_ns / 1_000,
        model.durability
    );
    println!("| groups | nodes | any key: writes/s | × one group | one group's keys per client: writes/s | × one group | failed |");
    println!("|---|---|---|---|---|---|---|");
    let one = |pinned: bool| {
        points.iter().find(|p| p.pinned == pinned).map_or(1.0, |p| p.writes_per_s.max(1.0))
    };
    for pair in points.chunks(2) {
        let (any, pinned) = (&pair[0], &pair[1]);
        println!(
            "| {} | {} | {:.0} | {:.2} | {:.0} | {:.2} | {} |",
            any.groups,
            any.nodes,
            any.writes_per_s,
            any.writes_per_s / one(false),
            pinned.writes_per_s,
            pinned.writes_per_s / one(true),
            any.failed + pinned.failed
        );
    }
    println!("replay: keel sim bench --scale --seed {seed}");
    std::process::ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_go_to_the_share_that_holds_them() {
        for groups in [1, 2, 3, 8] {
            for g in 0..groups {
                let share = keel_wire::slots::SlotRanges::share(g, groups);
                let (a, b) = share.ranges()[0];
                assert_eq!(owner(a, groups), g);
                assert_eq!(owner(b, groups), g);
            }
        }
    }

    #[test]
    fn two_groups_write_about_twice_what_one_does() {
        let model = Model { measure_ns: 20_000_000, warmup_ns: 20_000_000, ..Model::default() };
        let one = measure(1, &model, 1, true);
        let two = measure(2, &model, 1, true);
        assert_eq!((one.failed, two.failed), (0, 0));
        let ratio = two.writes_per_s / one.writes_per_s;
        assert!((1.8..2.2).contains(&ratio), "one {one:?}, two {two:?}");
    }
}
