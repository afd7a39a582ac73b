//! ORCA §5.3, Table 3: random crash/recover sequences on 5 nodes with one delayed node.
//!
//! One sequence: a random list of cluster states (which nodes run), e.g.
//! `12345 → 245 → 1245 → 145 → 1345 → 12345`, always a majority running. A random node
//! is *delayed*: it is cut off while each stage's items are inserted, so it misses
//! updates. At each stage: move to the state (crash the nodes not in it, losing their
//! unsynced writes; restart the others), wait for a leader, insert items (increasing
//! numbers written to one key), read at every running non-delayed node, then reconnect
//! the delayed node and read there at once. A sequence is *non-monotonic* if any read
//! returns an older item than a previous read did. Rejected reads (`NotActive`,
//! `NotLeader`, timeouts) are retried after a pause, as in the paper.
//!
//! Configurations (paper name in brackets), each with two eventual baselines, (a)
//! async persistence = `replicated` writes and (b) async replication and persistence =
//! `memory` writes:
//! - `weak` [weak-ZK]: baseline writes, `any` reads at all nodes;
//! - `strong` [strong-ZK]: `durable` writes, `linearizable` reads (at the leader);
//! - `sync-all` [sync-ZK-all]: `durable` writes, `any` reads at all nodes;
//! - `cad` [ORCA]: baseline writes, `monotonic` reads at all nodes.

use crate::disk::HardStateMode;
use crate::driver::Driver;
use crate::net::NetConfig;
use crate::rng::Rng;
use crate::scenario::engine_config;
use crate::world::{World, WorldConfig};
use clap::Args;
use keel_core::leader::LeaderEngine;
use keel_types::{Durability, KeelError, NodeId, ReadLevel};
use serde::Serialize;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};

/// Most sequences one invocation runs per configuration.
pub const SEQUENCES_MAX: u64 = 100_000;
/// Cluster size of the experiment.
const NODES: u32 = 5;
/// Items inserted per stage.
const ITEMS_PER_STAGE: u64 = 3;
/// Reads retried at most this many times after a rejection.
const READ_RETRIES_MAX: u32 = 20;
/// Pause before retrying a rejected read.
const RETRY_PAUSE_NS: u64 = 100_000_000;
/// Deadline of one request.
const REQUEST_TIMEOUT_NS: u64 = 2_000_000_000;
/// Longest wait for a leader at each stage.
const LEADER_WAIT_NS: u64 = 5_000_000_000;
/// The delayed node is read up to this long after it reconnects.
const CATCH_UP_NS_MAX: u64 = 300_000_000;
/// The key items are written to.
const KEY: &str = "item";

/// `keel sim table3` arguments.
#[derive(Args, Debug)]
pub struct Table3Args {
    /// Random sequences per configuration and baseline.
    #[arg(long, default_value_t = 500)]
    pub sequences: u64,
    /// The seed sequences derive from (every configuration sees the same sequences).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// One JSON object per configuration and baseline.
    #[arg(long)]
    pub json: bool,
    /// Worker threads (default: available cores).
    #[arg(long)]
    pub threads: Option<usize>,
}

/// The four configurations of Table 3.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Table3Config {
    /// Eventual writes, `any` reads at all nodes.
    Weak,
    /// `durable` writes, `linearizable` reads.
    Strong,
    /// `durable` writes, `any` reads at all nodes.
    SyncAll,
    /// Eventual writes, `monotonic` reads at all nodes.
    Cad,
}

/// The two eventual baselines.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Baseline {
    /// (a) sync replication, async persistence: `replicated` writes.
    AsyncPersistence,
    /// (b) async replication and persistence: `memory` writes.
    AsyncReplication,
}

impl Table3Config {
    /// Every configuration, in the paper's row order.
    pub const ALL: [Table3Config; 4] =
        [Table3Config::Weak, Table3Config::Strong, Table3Config::SyncAll, Table3Config::Cad];

    /// The name used in output.
    pub fn name(self) -> &'static str {
        match self {
            Table3Config::Weak => "weak",
            Table3Config::Strong => "strong",
            Table3Config::SyncAll => "sync-all",
            Table3Config::Cad => "cad",
        }
    }

    fn durability(self, baseline: Baseline) -> Durability {
        match (self, baseline) {
            (Table3Config::Strong | Table3Config::SyncAll, _) => Durability::Durable,
            (_, Baseline::AsyncPersistence) => Durability::Replicated,
            (_, Baseline::AsyncReplication) => Durability::Memory,
        }
    }

    fn level(self) -> ReadLevel {
        match self {
            Table3Config::Weak | Table3Config::SyncAll => ReadLevel::Any,
            Table3Config::Strong => ReadLevel::Linearizable,
            Table3Config::Cad => ReadLevel::Monotonic,
        }
    }
}

impl Baseline {
    /// Both baselines, (a) then (b).
    pub const ALL: [Baseline; 2] = [Baseline::AsyncPersistence, Baseline::AsyncReplication];

    /// The name used in output.
    pub fn name(self) -> &'static str {
        match self {
            Baseline::AsyncPersistence => "async-persistence",
            Baseline::AsyncReplication => "async-replication",
        }
    }
}

/// One row cell of Table 3.
#[derive(Clone, Debug, Serialize)]
pub struct Table3Row {
    /// The configuration.
    pub config: Table3Config,
    /// The baseline.
    pub baseline: Baseline,
    /// Sequences run.
    pub sequences: u64,
    /// Sequences in which every read was at least as new as all previous reads.
    pub correct: u64,
    /// Sequences with a read older than a previous read.
    pub non_monotonic: u64,
    /// Reads that were rejected at least once and then retried.
    pub retried_reads: u64,
    /// Reads given up after every retry was rejected.
    pub abandoned_reads: u64,
}

/// What one sequence saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SequenceOutcome {
    /// Some read went backwards.
    pub non_monotonic: bool,
    /// Reads that needed a retry.
    pub retried_reads: u64,
    /// Reads abandoned.
    pub abandoned_reads: u64,
}

/// The world of the experiment: 5 nodes on a LAN without loss (faults are the
/// sequence's crashes and the delayed node).
pub fn table3_world(rng: &mut Rng) -> WorldConfig {
    let fsync_ns_min = rng.range(500_000, 2_000_000);
    WorldConfig {
        engine: engine_config(NODES),
        nodes: NODES,
        net: NetConfig::lan(0, 0),
        client_latency_ns: 100_000,
        fsync_ns_min,
        fsync_ns_max: fsync_ns_min + 2_000_000,
        clock_offset_ns_max: 1_000_000_000,
        hard_state_mode: HardStateMode::Sync,
        torn_tail: false,
        events_max: 200_000,
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
    }
}

/// A random sequence of cluster states: starts and ends with every node up, each state
/// a majority, consecutive states different.
pub fn random_states(rng: &mut Rng) -> Vec<Vec<NodeId>> {
    let all: Vec<NodeId> = (1..=NODES).map(NodeId).collect();
    let mut states = vec![all.clone()];
    let stages = rng.range(3, 6);
    while (states.len() as u64) < stages + 1 {
        let state: Vec<NodeId> = all.iter().copied().filter(|_| rng.chance(650_000)).collect();
        if state.len() as u32 > NODES / 2 && Some(&state) != states.last() {
            states.push(state);
        }
    }
    states.push(all);
    states
}

/// Runs one sequence of the experiment.
pub fn run_sequence(config: Table3Config, baseline: Baseline, seed: u64) -> SequenceOutcome {
    let mut rng = Rng::new(seed);
    let world: World<LeaderEngine> = World::new(table3_world(&mut rng), rng.next_u64());
    let mut driver = Driver::new(world);
    let states = random_states(&mut rng);
    let all = driver.world.node_ids();
    let delayed = all[rng.index(all.len())];
    let mut run = SequenceRun {
        config,
        baseline,
        newest_read: 0,
        next_item: 0,
        outcome: SequenceOutcome::default(),
    };
    driver.wait_for_leader(LEADER_WAIT_NS);
    for state in states.iter().skip(1) {
        run.stage(&mut driver, &mut rng, state, delayed, &all);
    }
    run.outcome
}

struct SequenceRun {
    config: Table3Config,
    baseline: Baseline,
    newest_read: u64,
    next_item: u64,
    outcome: SequenceOutcome,
}

impl SequenceRun {
    fn stage(
        &mut self,
        driver: &mut Driver<LeaderEngine>,
        rng: &mut Rng,
        state: &[NodeId],
        delayed: NodeId,
        all: &[NodeId],
    ) {
        // Delay the node only when the others still form a majority; otherwise the
        // stage could not elect a leader at all.
        let others_up = state.iter().filter(|n| **n != delayed).count() as u32;
        if others_up > NODES / 2 {
            driver.world.net.isolate(delayed, all);
        }
        for node in all {
            if state.contains(node) {
                driver.world.restart(*node);
            } else {
                driver.world.crash(*node);
            }
        }
        let Some(leader) = self.leader_other_than(driver, delayed) else {
            driver.world.net.heal();
            return;
        };
        for _ in 0..ITEMS_PER_STAGE {
            self.next_item += 1;
            let item = self.next_item.to_string();
            let durability = self.config.durability(self.baseline);
            driver.put(leader, KEY, &item, durability, REQUEST_TIMEOUT_NS);
        }
        for node in state.iter().filter(|n| **n != delayed) {
            self.read(driver, *node);
        }
        driver.world.net.heal();
        if state.contains(&delayed) {
            // The delayed node is read a random moment after it reconnects: sometimes
            // before it has caught up, sometimes after.
            let catch_up_ns = rng.range(0, CATCH_UP_NS_MAX);
            driver.run_for(catch_up_ns);
            self.read(driver, delayed);
        }
    }

    fn leader_other_than(
        &mut self,
        driver: &mut Driver<LeaderEngine>,
        delayed: NodeId,
    ) -> Option<NodeId> {
        let deadline = driver.world.now_ns() + LEADER_WAIT_NS;
        while driver.world.now_ns() < deadline {
            match driver.wait_for_leader(deadline - driver.world.now_ns()) {
                Some(leader) if leader != delayed => return Some(leader),
                Some(_) => driver.run_for(crate::driver::POLL_NS),
                None => return None,
            }
        }
        None
    }

    /// Reads the key at `node` (strong reads go to the leader), retrying rejections,
    /// and checks the item against every earlier read.
    fn read(&mut self, driver: &mut Driver<LeaderEngine>, node: NodeId) {
        let level = self.config.level();
        for attempt in 0..=READ_RETRIES_MAX {
            let target = match self.config {
                Table3Config::Strong => driver.world.leader().unwrap_or(node),
                _ => node,
            };
            match driver.get(target, KEY, level, REQUEST_TIMEOUT_NS) {
                Ok((value, _)) => {
                    let item = value.and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
                    self.outcome.non_monotonic |= item < self.newest_read;
                    self.newest_read = self.newest_read.max(item);
                    self.outcome.retried_reads += u64::from(attempt > 0);
                    return;
                }
                Err(e) => {
                    debug_assert!(
                        e.is_retryable() || matches!(e, KeelError::Timeout),
                        "read refused: {e}"
                    );
                    driver.run_for(RETRY_PAUSE_NS);
                }
            }
        }
        self.outcome.abandoned_reads += 1;
    }
}

/// Runs the whole table: every configuration and baseline on the same `sequences`
/// sequences, on `threads` workers.
pub fn run_table(sequences: u64, seed: u64, threads: usize) -> Vec<Table3Row> {
    let cells: Vec<(Table3Config, Baseline)> = Table3Config::ALL
        .iter()
        .flat_map(|c| Baseline::ALL.iter().map(move |b| (*c, *b)))
        .collect();
    let counters: Vec<[AtomicU64; 4]> = cells.iter().map(|_| Default::default()).collect();
    let total = sequences * cells.len() as u64;
    let next = AtomicU64::new(0);
    std::thread::scope(|scope| {
        for _ in 0..threads.clamp(1, 64) {
            scope.spawn(|| loop {
                let task = next.fetch_add(1, Ordering::Relaxed);
                if task >= total {
                    break;
                }
                let (cell, sequence) =
                    ((task % cells.len() as u64) as usize, task / cells.len() as u64);
                let (config, baseline) = cells[cell];
                let outcome = run_sequence(
                    config,
                    baseline,
                    seed.wrapping_mul(1_000_003).wrapping_add(sequence),
                );
                let c = &counters[cell];
                c[0].fetch_add(1, Ordering::Relaxed);
                c[1].fetch_add(u64::from(outcome.non_monotonic), Ordering::Relaxed);
                c[2].fetch_add(outcome.retried_reads, Ordering::Relaxed);
                c[3].fetch_add(outcome.abandoned_reads, Ordering::Relaxed);
            });
        }
    });
    cells
        .iter()
        .zip(&counters)
        .map(|((config, baseline), c)| {
            let run = c[0].load(Ordering::Relaxed);
            let bad = c[1].load(Ordering::Relaxed);
            Table3Row {
                config: *config,
                baseline: *baseline,
                sequences: run,
                correct: run - bad,
                non_monotonic: bad,
                retried_reads: c[2].load(Ordering::Relaxed),
                abandoned_reads: c[3].load(Ordering::Relaxed),
            }
        })
        .collect()
}

fn percent(part: u64, whole: u64) -> u64 {
    (part * 100 + whole / 2) / whole.max(1)
}

/// `keel sim table3`.
pub fn run_cli(args: &Table3Args) -> ExitCode {
    if args.sequences == 0 || args.sequences > SEQUENCES_MAX {
        eprintln!("--sequences must be in 1..={SEQUENCES_MAX}");
        return ExitCode::from(2);
    }
    let threads =
        args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let started = std::time::Instant::now();
    let rows = run_table(args.sequences, args.seed, threads);
    if args.json {
        for row in &rows {
            println!("{}", serde_json::to_string(row).expect("rows serialize"));
        }
        return ExitCode::SUCCESS;
    }
    println!("Table 3 (ORCA §5.3): % of sequences correct / non-monotonic");
    println!(
        "{} sequences per cell, seed {}, 5 nodes, one delayed node",
        args.sequences, args.seed
    );
    println!(
        "{:<10} {:>28} {:>40}",
        "config", "(a) async persistence", "(b) async replication+persistence"
    );
    for config in Table3Config::ALL {
        let cell = |b: Baseline| {
            let row = rows
                .iter()
                .find(|r| r.config == config && r.baseline == b)
                .expect("every cell ran");
            format!(
                "{} / {}",
                percent(row.correct, row.sequences),
                percent(row.non_monotonic, row.sequences)
            )
        };
        println!(
            "{:<10} {:>28} {:>40}",
            config.name(),
            cell(Baseline::AsyncPersistence),
            cell(Baseline::AsyncReplication)
        );
    }
    let retried: u64 =
        rows.iter().filter(|r| r.config == Table3Config::Cad).map(|r| r.retried_reads).sum();
    let abandoned: u64 = rows.iter().map(|r| r.abandoned_reads).sum();
    println!(
        "cad reads served after a retry: {retried}; reads abandoned after {READ_RETRIES_MAX} retries (all cells): {abandoned}; {:.1}s",
        started.elapsed().as_secs_f64()
    );
    println!("replay: keel sim table3 --sequences {} --seed {}", args.sequences, args.seed);
    ExitCode::SUCCESS
}
