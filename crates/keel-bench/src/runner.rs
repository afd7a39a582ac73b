//! The load phase and the run phase: closed loop (N clients, each waits for its reply)
//! or open loop (a target rate; latency measured from each operation's intended start,
//! which corrects for coordinated omission).
//!
//! Each client is a tokio task with its own connection(s) and [`ClientStream`]; the
//! first `warmup` of the run is executed but not recorded. Benchmarks measure; nothing
//! here asserts on time.

use crate::driver::etcd::{EtcdDriver, EtcdOptions};
use crate::driver::resp::{KeelDriver, KeelOptions, RedisDriver, RedisOptions};
use crate::driver::zk::{ZkDriver, ZkOptions};
use crate::driver::{AnyDriver, Driver, DriverError};
use crate::workload::{insert_counter, key_name, ClientStream, Operation, WorkloadSpec};
use hdrhistogram::Histogram;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Runs `clients` client tasks, the `c`-th made by `make(c)`, on `runtime`, and gathers
/// their results in order; the first failure (or a task's panic) fails the run.
pub fn run_clients<T, F, Fut>(
    runtime: &tokio::runtime::Runtime,
    clients: usize,
    mut make: F,
) -> Result<Vec<T>, String>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = Result<T, String>> + Send + 'static,
    T: Send + 'static,
{
    runtime.block_on(async {
        let tasks: Vec<_> = (0..clients).map(|c| tokio::spawn(make(c))).collect();
        let mut results = Vec::with_capacity(clients);
        for task in tasks {
            results.push(task.await.map_err(|e| e.to_string())??);
        }
        Ok(results)
    })
}

/// Most clients one run may have.
pub const CLIENTS_MAX: usize = 1024;
/// Connections the load phase uses.
pub const LOAD_CLIENTS: usize = 16;
/// Highest latency the histograms hold, in microseconds (one minute).
pub const LATENCY_US_MAX: u64 = 60_000_000;
/// Most attempts at one load-phase write (a leader election takes a few).
pub const LOAD_RETRIES_MAX: u32 = 100;
/// Most reconnect attempts after a failed request before a client gives up.
pub const RECONNECTS_MAX: u32 = 100;

/// Where a client connects and how.
#[derive(Clone, Debug)]
pub enum Target {
    /// A Keel cluster.
    Keel {
        /// Client addresses.
        nodes: Vec<SocketAddr>,
        /// Each keyspace the clients use and the index of its leader; client `i` works
        /// in the `i mod len`-th.
        keyspaces: Vec<(u32, usize)>,
        /// Levels and read placement.
        options: KeelOptions,
    },
    /// A Redis primary (first) and replicas.
    Redis {
        /// Client addresses, primary first.
        nodes: Vec<SocketAddr>,
        /// Replication and read placement.
        options: RedisOptions,
    },
    /// An etcd cluster.
    Etcd {
        /// Gateway addresses.
        nodes: Vec<SocketAddr>,
        /// Index of the leader.
        leader: usize,
        /// Read kind and placement.
        options: EtcdOptions,
    },
    /// A ZooKeeper ensemble.
    Zk {
        /// Client addresses.
        nodes: Vec<SocketAddr>,
        /// Index of the leader.
        leader: usize,
        /// Read kind and placement.
        options: ZkOptions,
    },
}

impl Target {
    /// Connects client `client`.
    pub async fn connect(&self, client: usize) -> Result<AnyDriver, DriverError> {
        Ok(match self {
            Target::Keel { nodes, keyspaces, options } => {
                let (keyspace, leader) = keyspaces[client % keyspaces.len()];
                let options = options.clone();
                AnyDriver::Keel(
                    KeelDriver::connect(nodes, keyspace, leader, client, options).await?,
                )
            }
            Target::Redis { nodes, options } => {
                AnyDriver::Redis(RedisDriver::connect(nodes, client, options.clone()).await?)
            }
            Target::Etcd { nodes, leader, options } => {
                AnyDriver::Etcd(EtcdDriver::connect(nodes, *leader, client, options.clone()).await?)
            }
            Target::Zk { nodes, leader, options } => {
                AnyDriver::Zk(ZkDriver::connect(nodes, *leader, client, options.clone()).await?)
            }
        })
    }
}

/// How one run phase is driven.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Concurrent clients.
    pub clients: usize,
    /// Executed but not recorded, at the start.
    pub warmup: Duration,
    /// Recorded, after the warm-up.
    pub duration: Duration,
    /// Open loop at this many operations per second over all clients; `None`: closed loop.
    pub target_ops_s: Option<f64>,
    /// Fixes every client's operation stream.
    pub seed: u64,
}

/// What a run phase measured.
#[derive(Debug)]
pub struct RunOutcome {
    /// Latency of every successful recorded operation, in microseconds.
    pub latency_us: Histogram<u64>,
    /// Successful recorded operations.
    pub ops: u64,
    /// Failed recorded operations.
    pub errors: u64,
    /// Reads issued over the whole phase (warm-up included), read-modify-writes included.
    pub reads_total: u64,
    /// The recorded span.
    pub elapsed: Duration,
    /// The first error message seen, if any.
    pub first_error: Option<String>,
}

impl RunOutcome {
    /// Successful operations per second over the recorded span.
    pub fn throughput_ops_s(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 {
            self.ops as f64 / secs
        } else {
            0.0
        }
    }
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, 3).expect("valid histogram bounds")
}

/// The target once per keyspace (a Keel cluster with several), so that every keyspace
/// is loaded with every record; any other target as it is.
fn per_keyspace(target: &Target) -> Vec<Target> {
    match target {
        Target::Keel { nodes, keyspaces, options } if keyspaces.len() > 1 => keyspaces
            .iter()
            .map(|one| Target::Keel {
                nodes: nodes.clone(),
                keyspaces: vec![*one],
                options: options.clone(),
            })
            .collect(),
        other => vec![other.clone()],
    }
}

/// Loads `spec.record_count` records with [`LOAD_CLIENTS`] connections (into every
/// keyspace of a Keel cluster with several).
pub async fn load(target: &Target, spec: &WorkloadSpec, seed: u64) -> Result<(), DriverError> {
    for part in per_keyspace(target) {
        load_one(&part, spec, seed).await?;
    }
    Ok(())
}

async fn load_one(target: &Target, spec: &WorkloadSpec, seed: u64) -> Result<(), DriverError> {
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for client in 0..LOAD_CLIENTS {
        let (target, next) = (target.clone(), next.clone());
        let spec = Arc::new(spec.clone());
        tasks.spawn(async move {
            let mut driver = target.connect(client).await?;
            let counter = insert_counter(&spec);
            let record_count = spec.record_count;
            let mut stream = ClientStream::new(spec, seed, client as u64, counter);
            // Bounded: the shared counter hands out each of `record_count` numbers once.
            loop {
                let keynum = next.fetch_add(1, Ordering::Relaxed);
                if keynum >= record_count {
                    return Ok::<(), DriverError>(());
                }
                let value = stream.value();
                write_with_retries(
                    &target,
                    client,
                    &mut driver,
                    key_name(keynum).as_bytes(),
                    &value,
                )
                .await?;
            }
        });
    }
    while let Some(result) = tasks.join_next().await {
        result.expect("load task panicked")?;
    }
    Ok(())
}

/// Writes one record of the load phase, retrying (with a short back-off and, after a
/// broken connection, a new one) while a leader is elected, at most [`LOAD_RETRIES_MAX`]
/// times.
async fn write_with_retries(
    target: &Target,
    client: usize,
    driver: &mut AnyDriver,
    key: &[u8],
    value: &[u8],
) -> Result<(), DriverError> {
    let mut attempt = 0;
    loop {
        let error = match driver.write(key, value).await {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        attempt += 1;
        if attempt >= LOAD_RETRIES_MAX || matches!(error, DriverError::Unsupported(_)) {
            return Err(error);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        if error.needs_reconnect() {
            if let Ok(d) = target.connect(client).await {
                *driver = d;
            }
        }
    }
}

/// Executes one operation; `reads` counts the reads it issued.
async fn execute(
    driver: &mut AnyDriver,
    op: &Operation,
    reads: &mut u64,
) -> Result<(), DriverError> {
    match op {
        Operation::Read { key } => {
            *reads += 1;
            driver.read(key.as_bytes()).await.map(|_| ())
        }
        Operation::Update { key, value } | Operation::Insert { key, value, .. } => {
            driver.write(key.as_bytes(), value).await
        }
        Operation::Scan { start, count } => driver.scan(start.as_bytes(), *count).await.map(|_| ()),
        Operation::ReadModifyWrite { key, value } => {
            *reads += 1;
            driver.read(key.as_bytes()).await?;
            driver.write(key.as_bytes(), value).await
        }
    }
}

struct ClientResult {
    latency_us: Histogram<u64>,
    ops: u64,
    errors: u64,
    reads: u64,
    first_error: Option<String>,
}

impl ClientResult {
    /// Counts one operation that was meant to start at `intended` and ended at `done`;
    /// only `recorded` (post-warm-up) ones enter the histogram. Returns the error, if any.
    fn record(
        &mut self,
        outcome: Result<(), DriverError>,
        intended: Instant,
        done: Instant,
        recorded: bool,
    ) -> Result<(), DriverError> {
        debug_assert!(done >= intended, "an operation ended before its scheduled start");
        match outcome {
            Ok(()) if recorded => {
                let us = done.duration_since(intended).as_micros();
                let us = us.clamp(1, u128::from(LATENCY_US_MAX)) as u64;
                self.latency_us.record(us).expect("latency within the histogram's bounds");
                self.ops += 1;
                Ok(())
            }
            Ok(()) => Ok(()),
            Err(e) => {
                self.errors += u64::from(recorded);
                if self.first_error.is_none() {
                    self.first_error = Some(e.to_string());
                }
                Err(e)
            }
        }
    }
}

async fn client_loop(
    target: Target,
    mut stream: ClientStream,
    client: usize,
    start: Instant,
    config: RunConfig,
) -> Result<ClientResult, DriverError> {
    let measure_from = start + config.warmup;
    let end = measure_from + config.duration;
    let interval =
        config.target_ops_s.map(|rate| Duration::from_secs_f64(config.clients as f64 / rate));
    let mut driver = target.connect(client).await?;
    let mut result = ClientResult {
        latency_us: new_histogram(),
        ops: 0,
        errors: 0,
        reads: 0,
        first_error: None,
    };
    let (mut sent, mut reconnects) = (0u32, 0u32);
    // Bounded by `end`: each pass takes one operation's time or sleeps towards `end`.
    loop {
        let intended = match interval {
            // Clients start spread over one interval so they do not fire together.
            Some(step) => {
                start + step.mul_f64(f64::from(sent) + client as f64 / config.clients as f64)
            }
            None => Instant::now(),
        };
        if intended >= end || Instant::now() >= end {
            return Ok(result);
        }
        if interval.is_some() {
            tokio::time::sleep_until(intended.into()).await;
        }
        sent = sent.saturating_add(1);
        let op = match stream.next_operation() {
            Ok(op) => op,
            Err(_) => {
                tokio::task::yield_now().await;
                continue;
            }
        };
        let outcome = execute(&mut driver, &op, &mut result.reads).await;
        let done = Instant::now();
        if let (Ok(()), Operation::Insert { keynum, .. }) = (&outcome, &op) {
            stream.acknowledge(*keynum);
        }
        let Err(e) = result.record(outcome, intended, done, intended >= measure_from) else {
            continue;
        };
        if matches!(e, DriverError::Unsupported(_)) {
            return Err(e);
        }
        if e.needs_reconnect() {
            reconnects += 1;
            if reconnects > RECONNECTS_MAX {
                return Err(e);
            }
            // A short back-off so a restarting server is not hammered.
            tokio::time::sleep(Duration::from_millis(50)).await;
            if let Ok(d) = target.connect(client).await {
                driver = d;
            }
        }
    }
}

/// Runs the run phase of `spec` against `target`.
pub async fn run(
    target: &Target,
    spec: &WorkloadSpec,
    config: &RunConfig,
) -> Result<RunOutcome, DriverError> {
    assert!(config.clients >= 1 && config.clients <= CLIENTS_MAX, "clients in 1..={CLIENTS_MAX}");
    assert!(config.target_ops_s.is_none_or(|r| r > 0.0), "a target rate must be positive");
    let spec = Arc::new(spec.clone());
    let counter = insert_counter(&spec);
    // Connections and streams are made before the clock starts.
    let start = Instant::now() + Duration::from_millis(200);
    let mut tasks = tokio::task::JoinSet::new();
    for client in 0..config.clients {
        let stream = ClientStream::new(spec.clone(), config.seed, client as u64, counter.clone());
        tasks.spawn(client_loop(target.clone(), stream, client, start, config.clone()));
    }
    let mut outcome = RunOutcome {
        latency_us: new_histogram(),
        ops: 0,
        errors: 0,
        reads_total: 0,
        elapsed: config.duration,
        first_error: None,
    };
    while let Some(joined) = tasks.join_next().await {
        let client = joined.expect("client task panicked")?;
        outcome.latency_us.add(&client.latency_us).expect("same histogram bounds");
        outcome.ops += client.ops;
        outcome.errors += client.errors;
        outcome.reads_total += client.reads;
        if outcome.first_error.is_none() {
            outcome.first_error = client.first_error;
        }
    }
    Ok(outcome)
}
