//! `keel sim bench`: measurements, not tests. Engine throughput without I/O (a 3-node
//! cluster driven in-process with zero latency, one thread) and simulated seeds per
//! second of the general scenario.

use crate::cli::BenchArgs;
use crate::disk::HardStateMode;
use crate::driver::Driver;
use crate::net::NetConfig;
use crate::scenario::{engine_config, run_general, GeneralConfig};
use crate::world::{Notice, World, WorldConfig};
use keel_core::leader::{ClientRequest, LeaderEngine, RequestTag};
use keel_types::{ClientId, Command, Durability, RequestId};
use std::process::ExitCode;
use std::time::Instant;

/// Requests kept outstanding against the leader in the throughput measurement.
const OUTSTANDING: u64 = 64;

/// Operations per second of a 3-node cluster with zero latency, on one thread.
pub fn engine_throughput(ops: u64) -> f64 {
    let config = WorldConfig {
        engine: engine_config(3),
        nodes: 3,
        net: NetConfig::perfect(),
        client_latency_ns: 0,
        fsync_ns_min: 0,
        fsync_ns_max: 1,
        clock_offset_ns_max: 1,
        hard_state_mode: HardStateMode::Sync,
        torn_tail: false,
        events_max: 1_000_000,
        crash_after_vote_ppm: 0,
        late_open_copy_ppm: 0,
        keyspaces: 1,
        unsafe_skip_truncation_clamp: false,
        spread_leaders: false,
        reads_off_loop_ppm: 0,
        process_crash_ppm: 0,
        clock_reboot_ppm: 0,
        drift_change_ppm: 0,
        fault_seed: 0,
        link_bulk_bytes_max: keel_exec::LINK_BULK_BYTES_MAX,
        unsafe_unbounded_links: false,
        forwarded_replies_bytes_max: keel_exec::FORWARDED_REPLIES_BYTES_MAX,
        voters: 0,
        replicas: 0,
        wall_skew_ms_max: 0,
    };
    let mut driver = Driver::new(World::<LeaderEngine>::new(config, 1));
    let leader =
        driver.wait_for_leader(10_000_000_000).expect("a fault-free cluster elects a leader");
    let started = Instant::now();
    let (mut sent, mut done) = (0u64, 0u64);
    let submit = |world: &mut World<LeaderEngine>, n: u64| {
        let request = ClientRequest {
            tag: RequestTag(0),
            client: ClientId(n % OUTSTANDING + 1),
            request: RequestId(n + 1),
            command: Command::Put {
                key: format!("k{}", n % 1024).into_bytes().into(),
                value: b"value".to_vec().into(),
            },
            durability: Some(Durability::Memory),
            level: None,
            after: keel_types::LogIndex::ZERO,
            mode: Default::default(),
            named: false,
        };
        world.submit(leader, request);
    };
    while sent < OUTSTANDING.min(ops) {
        submit(&mut driver.world, sent);
        sent += 1;
    }
    while done < ops {
        let Some(t) = driver.world.next_event_ns() else { break };
        // Zero-latency worlds stall only on timers; skip ahead to them.
        driver.world.advance_to(t);
        if let Some(Notice::Reply { .. }) = driver.world.step() {
            done += 1;
            if sent < ops {
                submit(&mut driver.world, sent);
                sent += 1;
            }
        }
    }
    done as f64 / started.elapsed().as_secs_f64().max(1e-9)
}

/// Seeds of the general scenario per second, on one thread.
pub fn seeds_per_second(seeds: u64) -> f64 {
    let started = Instant::now();
    for seed in 0..seeds {
        let _ = run_general::<LeaderEngine>(&GeneralConfig::new(seed));
    }
    seeds as f64 / started.elapsed().as_secs_f64().max(1e-9)
}

/// `keel sim bench`.
pub fn run_cli(args: &BenchArgs) -> ExitCode {
    let ops_s = engine_throughput(args.ops.max(1));
    let seeds_s = seeds_per_second(args.seeds.max(1));
    if args.json {
        println!(
            "{}",
            serde_json::json!({"measure": "engine_ops_per_s_per_core", "nodes": 3, "ops": args.ops, "value": ops_s})
        );
        println!(
            "{}",
            serde_json::json!({"measure": "general_seeds_per_s_per_core", "seeds": args.seeds, "value": seeds_s})
        );
    } else {
        println!(
            "engine, 3 nodes in-process, zero latency, memory puts: {ops_s:.0} ops/s per core"
        );
        println!("general scenario: {seeds_s:.2} seeds/s per core ({} seeds)", args.seeds);
        println!("replay: keel sim bench --ops {} --seeds {}", args.ops, args.seeds);
    }
    ExitCode::SUCCESS
}
