//! ORCA §5.4, Table 4: two application workloads with readers that switch servers
//! under faults, each read classified as *inconsistent* (older than something some
//! client had already read: a cross-client monotonicity violation), *old* (consistent
//! but older than the newest write acknowledged before the read began) or *latest*.
//!
//! - **location**: writers move users (each write of `user:i` a higher number); readers
//!   read random users' locations, each read at a random node;
//! - **retwis**: 95% timeline reads, 5% posts (a post writes the next number to the
//!   poster's timeline key), readers at random nodes.
//!
//! Configurations: `weak` (`memory` writes, `any` reads), `strong` (`durable` writes,
//! `linearizable` reads), `cad` (`memory` writes, `monotonic` reads). Faults: crashes,
//! pauses and partitions from the nemesis (no slow disks), on 5 nodes linked by
//! wide-area latencies (2–20 ms one way), so follower reads often lag.

use crate::disk::HardStateMode;
use crate::nemesis::{Nemesis, NemesisConfig};
use crate::net::NetConfig;
use crate::rng::Rng;
use crate::scenario::engine_config;
use crate::world::{Notice, World, WorldConfig};
use clap::Args;
use keel_core::leader::{ClientReply, ClientRequest, LeaderEngine, RequestTag};
use keel_types::{
    ClientId, Command, CommandResult, Durability, NodeId, ReadLevel, RequestId, Version,
};
use serde::Serialize;
use std::collections::BTreeMap;
use std::process::ExitCode;

/// Most runs one invocation makes per cell.
pub const RUNS_MAX: u64 = 10_000;
/// Clients per run (the first [`WRITERS`] of the location workload write).
const CLIENTS: u64 = 8;
/// Writers in the location workload.
const WRITERS: u64 = 2;
/// Keys (users) per workload.
const USERS: u64 = 4;
/// Virtual time each run issues operations.
const LOAD_NS: u64 = 4_000_000_000;
/// A request unanswered after this is abandoned.
const TIMEOUT_NS: u64 = 1_000_000_000;
/// Pause between a client's operations.
const THINK_NS_MAX: u64 = 20_000_000;

/// `keel sim table4` arguments.
#[derive(Args, Debug)]
pub struct Table4Args {
    /// Runs (seeds) per workload and configuration.
    #[arg(long, default_value_t = 20)]
    pub runs: u64,
    /// The first seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// One JSON object per workload and configuration.
    #[arg(long)]
    pub json: bool,
}

/// One cell of Table 4.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Table4Row {
    /// `location` or `retwis`.
    pub workload: &'static str,
    /// `weak`, `strong` or `cad`.
    pub config: &'static str,
    /// Reads classified.
    pub reads: u64,
    /// Reads older than something already read.
    pub inconsistent: u64,
    /// Consistent reads older than the newest acknowledged write.
    pub old: u64,
    /// Reads of the newest acknowledged write (or newer).
    pub latest: u64,
}

/// The three configurations: name, write durability, read level.
pub const CONFIGS: [(&str, Durability, ReadLevel); 3] = [
    ("weak", Durability::Memory, ReadLevel::Any),
    ("strong", Durability::Durable, ReadLevel::Linearizable),
    ("cad", Durability::Memory, ReadLevel::Monotonic),
];

struct Pending {
    client: u64,
    key: String,
    write: bool,
    invoke_ns: u64,
}

#[derive(Default)]
struct Tracker {
    /// Per key, `(complete_ns, version)` of completed reads and acknowledged writes.
    reads: BTreeMap<String, Vec<(u64, Version)>>,
    writes: BTreeMap<String, Vec<(u64, Version)>>,
}

impl Tracker {
    fn newest(list: Option<&Vec<(u64, Version)>>, before_ns: u64) -> Version {
        list.into_iter()
            .flatten()
            .filter(|(c, _)| *c < before_ns)
            .map(|(_, v)| *v)
            .max()
            .unwrap_or_default()
    }

    fn classify(
        &mut self,
        row: &mut Table4Row,
        key: &str,
        invoke_ns: u64,
        now: u64,
        version: Version,
    ) {
        row.reads += 1;
        if version < Self::newest(self.reads.get(key), invoke_ns) {
            row.inconsistent += 1;
        } else if version < Self::newest(self.writes.get(key), invoke_ns) {
            row.old += 1;
        } else {
            row.latest += 1;
        }
        self.reads.entry(key.to_string()).or_default().push((now, version));
    }
}

/// Timer ids at or above this mark a request deadline (the tag in the low bits).
const DEADLINE_TIMER: u64 = 1 << 32;

/// The world of the experiment: 5 nodes on wide-area links, no loss.
fn table4_world() -> WorldConfig {
    WorldConfig {
        engine: engine_config(5),
        nodes: 5,
        // Wide-area links, so follower reads are often behind the leader.
        net: NetConfig {
            latency_ns_min: 2_000_000,
            latency_ns_max: 15_000_000,
            jitter_ns_max: 5_000_000,
            loss_ppm: 0,
            duplicate_ppm: 0,
            messages_in_flight_max: 20_000,
            stall_ppm: 0,
            stall_ns_max: crate::net::STALL_NS_MIN + 1,
        },
        client_latency_ns: 500_000,
        fsync_ns_min: 500_000,
        fsync_ns_max: 3_000_000,
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

/// One run: the cluster, its faults, the clients' requests in flight.
struct Run {
    workload: &'static str,
    durability: Durability,
    level: ReadLevel,
    world: World<LeaderEngine>,
    nemesis: Nemesis,
    rng: Rng,
    tracker: Tracker,
    pending: BTreeMap<RequestTag, Pending>,
    writes_per_client: Vec<u64>,
    next_request: u64,
}

impl Run {
    /// A client issues its next operation at a random node.
    fn issue(&mut self, client: u64) {
        assert!(client < CLIENTS, "client {client} out of range");
        let write = match self.workload {
            "location" => client < WRITERS,
            _ => self.rng.chance(50_000),
        };
        let key = format!("{}:{}", self.workload, self.rng.range(0, USERS));
        let command = if write {
            self.writes_per_client[client as usize] += 1;
            let value = client * 1_000_000 + self.writes_per_client[client as usize];
            Command::Put {
                key: key.clone().into_bytes().into(),
                value: value.to_string().into_bytes().into(),
            }
        } else {
            Command::Get { key: key.clone().into_bytes().into() }
        };
        self.next_request += 1;
        let nodes = self.world.node_ids();
        let node: NodeId = nodes[self.rng.index(nodes.len())];
        let request = ClientRequest {
            tag: RequestTag(0),
            client: ClientId(client + 1),
            request: RequestId(self.next_request),
            command,
            durability: write.then_some(self.durability),
            level: (!write).then_some(self.level),
            after: keel_types::LogIndex::ZERO,
            mode: Default::default(),
            named: false,
        };
        let tag = self.world.submit(node, request);
        let invoke_ns = self.world.now_ns();
        self.pending.insert(tag, Pending { client, key, write, invoke_ns });
        debug_assert!(tag.0 < DEADLINE_TIMER, "tags fit below the deadline mark");
        self.world.set_timer(invoke_ns + TIMEOUT_NS, DEADLINE_TIMER | tag.0);
    }

    fn think_then_issue(&mut self, client: u64) {
        let at = self.world.now_ns() + self.rng.range(0, THINK_NS_MAX);
        self.world.set_timer(at, client);
    }

    /// A request reached its deadline unanswered: the client gives up and moves on.
    fn expire(&mut self, tag: RequestTag) {
        if let Some(p) = self.pending.remove(&tag) {
            self.think_then_issue(p.client);
        }
    }

    /// A reply arrived: writes are remembered, reads classified.
    fn on_reply(&mut self, reply: ClientReply, row: &mut Table4Row) {
        let Some(p) = self.pending.remove(&reply.tag) else { return };
        let now = self.world.now_ns();
        match reply.result {
            Ok(CommandResult::Written { version }) if p.write => {
                self.tracker.writes.entry(p.key).or_default().push((now, version));
            }
            Ok(CommandResult::Value { version, .. }) if !p.write => {
                let version = version.unwrap_or_default();
                self.tracker.classify(row, &p.key, p.invoke_ns, now, version);
            }
            _ => {}
        }
        self.think_then_issue(p.client);
    }
}

/// Runs one seed of `workload` under configuration `config` (an index into
/// [`CONFIGS`]) and adds its reads to `row`.
pub fn run_once(workload: &'static str, config: usize, seed: u64, row: &mut Table4Row) {
    let (_, durability, level) = CONFIGS[config];
    let mut rng = Rng::new(seed);
    let world = World::new(table4_world(), rng.next_u64());
    let nemesis =
        Nemesis::new(NemesisConfig { slow_disk: false, ..NemesisConfig::all() }, rng.fork());
    let mut run = Run {
        workload,
        durability,
        level,
        world,
        nemesis,
        rng,
        tracker: Tracker::default(),
        pending: BTreeMap::new(),
        writes_per_client: vec![0; CLIENTS as usize],
        next_request: 0,
    };
    run.nemesis.start(&mut run.world);
    for client in 0..CLIENTS {
        run.think_then_issue(client);
    }
    while run.world.next_event_ns().is_some_and(|t| t <= LOAD_NS) {
        match run.world.step() {
            Some(Notice::Timer { id }) if id < CLIENTS => run.issue(id),
            Some(Notice::Timer { id }) if id & !(DEADLINE_TIMER - 1) == DEADLINE_TIMER => {
                run.expire(RequestTag(id & (DEADLINE_TIMER - 1)));
            }
            Some(Notice::Timer { id }) => {
                let handled = run.nemesis.handle(&mut run.world, id);
                assert!(handled, "timer {id} has no owner");
            }
            Some(Notice::Reply { reply, .. }) => run.on_reply(reply, row),
            None => {}
        }
    }
    assert_eq!(row.inconsistent + row.old + row.latest, row.reads);
}

fn percent(part: u64, whole: u64) -> u64 {
    (part * 100 + whole / 2) / whole.max(1)
}

/// `keel sim table4`.
pub fn run_cli(args: &Table4Args) -> ExitCode {
    if args.runs == 0 || args.runs > RUNS_MAX {
        eprintln!("--runs must be in 1..={RUNS_MAX}");
        return ExitCode::from(2);
    }
    let mut rows = Vec::new();
    for workload in ["location", "retwis"] {
        for (i, (name, _, _)) in CONFIGS.iter().enumerate() {
            let mut row = Table4Row { workload, config: name, ..Table4Row::default() };
            for run in 0..args.runs {
                run_once(workload, i, args.seed.wrapping_add(run), &mut row);
            }
            rows.push(row);
        }
    }
    if args.json {
        for row in &rows {
            println!("{}", serde_json::to_string(row).expect("rows serialize"));
        }
        return ExitCode::SUCCESS;
    }
    println!("Table 4 (ORCA §5.4): % of reads, readers switching servers under faults");
    println!("{} runs per cell from seed {}, 5 nodes", args.runs, args.seed);
    println!(
        "{:<20} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "outcome %", "loc:weak", "loc:strong", "loc:cad", "rtw:weak", "rtw:strong", "rtw:cad"
    );
    for (label, pick) in [("inconsistent", 0), ("consistent (old)", 1), ("consistent (latest)", 2)]
    {
        let cells: Vec<String> = rows
            .iter()
            .map(|r| percent([r.inconsistent, r.old, r.latest][pick], r.reads).to_string())
            .collect();
        println!(
            "{label:<20} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            cells[0], cells[1], cells[2], cells[3], cells[4], cells[5]
        );
    }
    println!("replay: keel sim table4 --runs {} --seed {}", args.runs, args.seed);
    ExitCode::SUCCESS
}
