//! `keel example kite-stack|kite-queue|kite-list`: the lock-free data structures of the
//! Kite paper, built the way it builds them, on a Kite keyspace of a local cluster (or
//! `--connect` addresses). Each node of a structure is a key; its fields are the key's
//! value. A node's contents are written with relaxed writes, published by a strong CAS on
//! a pointer (a read-modify-write, so a release), and read after an acquire of the
//! pointer; so relaxed accesses carry the data and only the pointers synchronize.
//!
//! - `kite-stack`: a Treiber stack. Push: write the node (item, next = the head read),
//!   CAS the head to it. Pop: acquire the head, read its node, CAS the head to its next.
//! - `kite-queue`: a Michael-Scott queue with a sentinel. Enqueue: write the node, CAS the
//!   tail node's next from empty to it, swing the tail (anyone helps). Dequeue: acquire head
//!   and tail, read the head node's next, CAS the head to it, take its item.
//! - `kite-list`: a Harris-Michael sorted set. A node's value is its next pointer and a
//!   deletion mark; remove marks (a CAS on the node), then unlinks (a CAS on the one before);
//!   a search unlinks the marked nodes it meets.
//!
//! Workers on every node run random operations; node 3 is killed a third of the way
//! through and restarted at two thirds (`--no-kill` keeps it up), so its workers stop and
//! the others' releases take the slow path meanwhile; the restarted node rejoins, and the
//! final drain or walk runs there. Node keys are never reused, so no CAS meets an old
//! value again (no ABA). The run ends with the structure's invariants checked: every item
//! pushed popped once (stack), once and in each producer's order (queue), no key lost or
//! doubled and the list sorted (list). An operation whose reply was lost (its node died)
//! may or may not have happened, and the checks allow exactly that much.
//!
//! `--all-strong` turns every relaxed read into an acquire and every relaxed write into a
//! release: the baseline of the paper's Figure 10; the ratio of the two runs' throughputs
//! is what the paper reports.

use anyhow::Context;
use keel_client::{Client, ClientConfig, ClientError, KiteSession};
use keel_server::config::KeyspaceSettings;
use keel_server::local::LocalCluster;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The Kite keyspace of the local cluster.
const KITE: u32 = 1;
/// The empty pointer.
const NIL: &[u8] = b"-";

/// Flags of `keel example kite-stack|kite-queue|kite-list`.
#[derive(Debug, Clone, clap::Args)]
pub struct KiteArgs {
    /// Workers per node, each a Kite session pinned to its node.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Operations per worker.
    #[arg(long, default_value_t = 150)]
    pub ops: u64,
    /// Keep node 3 up (by default it is killed a third of the way through and restarted
    /// at two thirds; local cluster only).
    #[arg(long)]
    pub no_kill: bool,
    /// Every relaxed read an acquire, every relaxed write a release (the all-strong
    /// baseline).
    #[arg(long)]
    pub all_strong: bool,
    /// Keys of the list (`kite-list`): operations pick among this many.
    #[arg(long, default_value_t = 24)]
    pub keys: u64,
    /// Client addresses of a running cluster (comma-separated) instead of a local one.
    #[arg(long, value_delimiter = ',')]
    pub connect: Vec<SocketAddr>,
    /// The Kite keyspace of `--connect`'s cluster.
    #[arg(long, default_value_t = KITE)]
    pub keyspace: u32,
    /// Print one JSON object at the end instead of lines.
    #[arg(long)]
    pub json: bool,
    /// Where to put the local cluster (default: a fresh temporary directory, removed).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// Which structure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Structure {
    /// Treiber stack.
    Stack,
    /// Michael-Scott queue.
    Queue,
    /// Harris-Michael sorted list.
    List,
}

impl Structure {
    fn name(self) -> &'static str {
        match self {
            Structure::Stack => "kite-stack",
            Structure::Queue => "kite-queue",
            Structure::List => "kite-list",
        }
    }
}

/// Runs one example; exits 0 when its invariants hold, 1 when not, 2 when it could not run.
pub fn run(structure: Structure, args: &KiteArgs) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    match runtime.block_on(example(structure, args)) {
        Ok(report) => {
            if args.json {
                println!("{}", report);
            } else {
                print(&report);
            }
            if report["violations"].as_array().is_some_and(|v| v.is_empty()) {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("keel example {}: {e:#}", structure.name());
            ExitCode::from(2)
        }
    }
}

fn print(report: &serde_json::Value) {
    println!(
        "{}: {} operations by {} workers in {:.2} s ({:.0} ops/s){}{}",
        report["example"].as_str().unwrap_or("?"),
        report["operations"],
        report["workers"],
        report["seconds"].as_f64().unwrap_or(0.0),
        report["ops_per_second"].as_f64().unwrap_or(0.0),
        if report["all_strong"] == true { ", all accesses strong" } else { "" },
        if report["node_killed"] == true { ", node 3 killed and restarted" } else { "" },
    );
    println!("  {}", report["summary"].as_str().unwrap_or(""));
    match report["violations"].as_array() {
        Some(v) if v.is_empty() => println!("  invariants hold"),
        Some(v) => {
            v.iter().for_each(|line| println!("  VIOLATION: {}", line.as_str().unwrap_or("")))
        }
        None => {}
    }
}

/// One worker's accesses: relaxed ones, or all strong.
struct Ops {
    session: KiteSession,
    strong: bool,
    count: Arc<AtomicU64>,
}

impl Ops {
    async fn read(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, ClientError> {
        self.count.fetch_add(1, Ordering::Relaxed);
        match self.strong {
            true => self.session.acquire(key).await,
            false => self.session.read(key).await,
        }
    }

    async fn acquire(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, ClientError> {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.session.acquire(key).await
    }

    async fn write(&mut self, key: &[u8], value: &[u8]) -> Result<(), ClientError> {
        self.count.fetch_add(1, Ordering::Relaxed);
        match self.strong {
            true => self.session.release(key, value).await,
            false => self.session.write(key, value).await,
        }
    }

    async fn cas(&mut self, key: &[u8], expected: &[u8], new: &[u8]) -> Result<bool, ClientError> {
        self.count.fetch_add(1, Ordering::Relaxed);
        Ok(self.session.cas(key, Some(expected), new, true).await?.swapped)
    }
}

/// A node's value: two fields joined by `|` (fields never hold `|`).
fn join(a: &[u8], b: &[u8]) -> Vec<u8> {
    [a, b"|", b].concat()
}

fn split(value: &[u8]) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    let at = value.iter().position(|&c| c == b'|').context("a node without its fields")?;
    Ok((value[..at].to_vec(), value[at + 1..].to_vec()))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A worker's deterministic choices.
struct Dice(u64);

impl Dice {
    fn below(&mut self, n: u64) -> u64 {
        self.0 =
            self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

/// What one worker did: items or keys with the outcome of each operation.
#[derive(Debug, Default)]
struct Done {
    /// Stack/queue: items added (confirmed), in the worker's order.
    added: Vec<String>,
    /// Items whose add had no reply.
    added_maybe: Vec<String>,
    /// Items taken (confirmed), in the worker's order.
    taken: Vec<String>,
    /// Takes with no reply (each may have taken an item nobody saw).
    taken_maybe: u64,
    /// List: per key, (inserts, removes) that succeeded, and operations without a reply.
    inserted: BTreeMap<u64, u64>,
    removed: BTreeMap<u64, u64>,
    unsure: BTreeMap<u64, u64>,
    /// Operations completed.
    operations: u64,
}

// ----- Treiber stack -----

async fn push(ops: &mut Ops, item: &str, node: &str) -> Result<(), ClientError> {
    loop {
        let top = ops.acquire(b"stack:head").await?.unwrap_or_else(|| NIL.to_vec());
        ops.write(node.as_bytes(), &join(item.as_bytes(), &top)).await?;
        if ops.cas(b"stack:head", &top, node.as_bytes()).await? {
            return Ok(());
        }
    }
}

async fn pop(ops: &mut Ops) -> anyhow::Result<Option<String>> {
    loop {
        let top = ops.acquire(b"stack:head").await?.unwrap_or_else(|| NIL.to_vec());
        if top == NIL {
            return Ok(None);
        }
        let node = ops.read(&top).await?.context("the head names a node nobody wrote")?;
        let (item, next) = split(&node)?;
        if ops.cas(b"stack:head", &top, &next).await? {
            return Ok(Some(text(&item)));
        }
    }
}

// ----- Michael-Scott queue -----

const SENTINEL: &[u8] = b"queue:node:sentinel";

async fn queue_setup(ops: &mut Ops) -> Result<(), ClientError> {
    ops.write(SENTINEL, &join(b"", NIL)).await?;
    ops.session.release(b"queue:tail", SENTINEL).await?;
    ops.session.release(b"queue:head", SENTINEL).await
}

async fn enqueue(ops: &mut Ops, item: &str, node: &str) -> anyhow::Result<()> {
    ops.write(node.as_bytes(), &join(item.as_bytes(), NIL)).await?;
    loop {
        let tail = ops.acquire(b"queue:tail").await?.context("no tail")?;
        let tail_node = ops.acquire(&tail).await?.context("the tail names no node")?;
        let (tail_item, next) = split(&tail_node)?;
        if next == NIL {
            let linked = join(&tail_item, node.as_bytes());
            if ops.cas(&tail, &tail_node, &linked).await? {
                let _ = ops.cas(b"queue:tail", &tail, node.as_bytes()).await?;
                return Ok(());
            }
        } else {
            // The tail lags: help it along.
            let _ = ops.cas(b"queue:tail", &tail, &next).await?;
        }
    }
}

async fn dequeue(ops: &mut Ops) -> anyhow::Result<Option<String>> {
    loop {
        let head = ops.acquire(b"queue:head").await?.context("no head")?;
        let tail = ops.acquire(b"queue:tail").await?.context("no tail")?;
        let head_node = ops.acquire(&head).await?.context("the head names no node")?;
        let (_, next) = split(&head_node)?;
        if head == tail {
            if next == NIL {
                return Ok(None);
            }
            let _ = ops.cas(b"queue:tail", &tail, &next).await?;
            continue;
        }
        if next == NIL {
            continue; // read between a swing and its link: try again
        }
        let next_node = ops.read(&next).await?.context("a link to a node nobody wrote")?;
        let (item, _) = split(&next_node)?;
        if ops.cas(b"queue:head", &head, &next).await? {
            return Ok(Some(text(&item)));
        }
    }
}

// ----- Harris-Michael list -----

const LIST_HEAD: &[u8] = b"list:node:head";

/// The sort key a list node's name carries (`list:node:<key, 8 digits>:<unique>`); the
/// head sorts first.
fn list_key(node: &[u8]) -> Option<u64> {
    let name = std::str::from_utf8(node).ok()?;
    name.strip_prefix("list:node:")?.split(':').next()?.parse().ok()
}

async fn list_setup(ops: &mut Ops) -> Result<(), ClientError> {
    ops.session.release(LIST_HEAD, &join(NIL, b"0")).await
}

/// The nodes around `key`: `(prev, prev's value, cur, cur's value)` with `cur` the first
/// unmarked node whose key is at least `key` (`NIL` at the end), unlinking marked nodes
/// met on the way.
async fn find(ops: &mut Ops, key: u64) -> anyhow::Result<(Vec<u8>, Vec<u8>, Vec<u8>, Vec<u8>)> {
    'retry: loop {
        let mut prev = LIST_HEAD.to_vec();
        let mut prev_value = ops.acquire(&prev).await?.context("no list head")?;
        loop {
            let (cur, prev_mark) = split(&prev_value)?;
            if prev_mark == b"1" {
                continue 'retry; // prev was removed under us
            }
            if cur == NIL {
                return Ok((prev, prev_value, cur, Vec::new()));
            }
            let cur_value = ops.acquire(&cur).await?.context("a link to a node nobody wrote")?;
            let (next, mark) = split(&cur_value)?;
            if mark == b"1" {
                // Unlink the removed node; start again if prev changed.
                if !ops.cas(&prev, &prev_value, &join(&next, b"0")).await? {
                    continue 'retry;
                }
                prev_value = join(&next, b"0");
                continue;
            }
            if list_key(&cur).is_some_and(|k| k >= key) {
                return Ok((prev, prev_value, cur, cur_value));
            }
            prev = cur;
            prev_value = cur_value;
        }
    }
}

async fn insert(ops: &mut Ops, key: u64, node: &str) -> anyhow::Result<bool> {
    loop {
        let (prev, prev_value, cur, _) = find(ops, key).await?;
        if cur != NIL && list_key(&cur) == Some(key) {
            return Ok(false);
        }
        ops.write(node.as_bytes(), &join(&cur, b"0")).await?;
        if ops.cas(&prev, &prev_value, &join(node.as_bytes(), b"0")).await? {
            return Ok(true);
        }
    }
}

async fn remove(ops: &mut Ops, key: u64) -> anyhow::Result<bool> {
    loop {
        let (prev, prev_value, cur, cur_value) = find(ops, key).await?;
        if cur == NIL || list_key(&cur) != Some(key) {
            return Ok(false);
        }
        let (next, _) = split(&cur_value)?;
        if ops.cas(&cur, &cur_value, &join(&next, b"1")).await? {
            let _ = ops.cas(&prev, &prev_value, &join(&next, b"0")).await?;
            return Ok(true);
        }
    }
}

async fn contains(ops: &mut Ops, key: u64) -> anyhow::Result<bool> {
    let (_, _, cur, _) = find(ops, key).await?;
    Ok(cur != NIL && list_key(&cur) == Some(key))
}

/// The keys of the unmarked nodes, in list order.
async fn walk(ops: &mut Ops) -> anyhow::Result<Vec<u64>> {
    let mut keys = Vec::new();
    let mut at = LIST_HEAD.to_vec();
    for _ in 0..1_000_000 {
        let value = ops.acquire(&at).await?.context("a link to a node nobody wrote")?;
        let (next, mark) = split(&value)?;
        if at != LIST_HEAD && mark == b"0" {
            keys.push(list_key(&at).context("a node without a key")?);
        }
        if next == NIL {
            return Ok(keys);
        }
        at = next;
    }
    anyhow::bail!("the list does not end")
}

// ----- workers and checks -----

/// Whether an error says the worker's node is gone (its session with it).
fn node_gone(e: &anyhow::Error) -> bool {
    e.downcast_ref::<ClientError>().is_some_and(|c| matches!(c, ClientError::Connection(_)))
}

async fn worker(
    structure: Structure,
    mut ops: Ops,
    name: String,
    count: u64,
    keys: u64,
    seed: u64,
) -> Done {
    let mut done = Done::default();
    let mut dice = Dice(seed);
    for i in 0..count {
        let node = format!("{}:node:{name}.{i}", structure.name());
        let item = format!("{name}.{i}");
        let outcome: anyhow::Result<()> = match structure {
            Structure::Stack | Structure::Queue if dice.below(2) == 0 => {
                let added = match structure {
                    Structure::Stack => push(&mut ops, &item, &node).await.map_err(Into::into),
                    _ => enqueue(&mut ops, &item, &node).await,
                };
                match added {
                    Ok(()) => {
                        done.added.push(item);
                        Ok(())
                    }
                    Err(e) => {
                        done.added_maybe.push(item);
                        Err(e)
                    }
                }
            }
            Structure::Stack | Structure::Queue => {
                let taken = match structure {
                    Structure::Stack => pop(&mut ops).await,
                    _ => dequeue(&mut ops).await,
                };
                match taken {
                    Ok(taken) => {
                        done.taken.extend(taken);
                        Ok(())
                    }
                    Err(e) => {
                        done.taken_maybe += 1;
                        Err(e)
                    }
                }
            }
            Structure::List => {
                let key = dice.below(keys);
                let node = format!("list:node:{key:08}:{name}.{i}");
                let result = match dice.below(3) {
                    0 => insert(&mut ops, key, &node)
                        .await
                        .map(|ok| ok.then(|| *done.inserted.entry(key).or_default() += 1)),
                    1 => remove(&mut ops, key)
                        .await
                        .map(|ok| ok.then(|| *done.removed.entry(key).or_default() += 1)),
                    _ => contains(&mut ops, key).await.map(|_| None),
                };
                result.map(|_| ()).inspect_err(|_| *done.unsure.entry(key).or_default() += 1)
            }
        };
        match outcome {
            Ok(()) => done.operations += 1,
            Err(e) if node_gone(&e) => return done,
            Err(_) => {}
        }
    }
    done
}

async fn example(structure: Structure, args: &KiteArgs) -> anyhow::Result<serde_json::Value> {
    anyhow::ensure!(
        args.workers >= 1 && args.ops >= 1 && args.keys >= 1,
        "at least one worker, operation and key"
    );
    let dir = args.dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("keel-{}-{}", structure.name(), std::process::id()))
    });
    let (mut local, addrs, keyspace) = if args.connect.is_empty() {
        let exe = std::env::current_exe().context("locating the keel binary")?;
        let cluster = LocalCluster::start(&exe, 3, &dir, None, |c| {
            c.keyspaces = vec![KeyspaceSettings::orca(0), KeyspaceSettings::kite(KITE)];
        })
        .context("starting the cluster")?;
        anyhow::ensure!(
            cluster.wait_for_replicas(KITE, Duration::from_secs(30)),
            "the Kite keyspace did not start"
        );
        let addrs = cluster.client_addrs();
        (Some(cluster), addrs, KITE)
    } else {
        (None, args.connect.clone(), args.keyspace)
    };
    let result = drive(structure, args, addrs, keyspace, local.as_mut()).await;
    if let Some(mut cluster) = local {
        cluster.stop();
        if args.dir.is_none() {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    result
}

async fn drive(
    structure: Structure,
    args: &KiteArgs,
    addrs: Vec<SocketAddr>,
    keyspace: u32,
    mut cluster: Option<&mut LocalCluster>,
) -> anyhow::Result<serde_json::Value> {
    let mut config = ClientConfig::new(addrs.clone());
    config.keyspace = keyspace;
    config.attempt_timeout = Duration::from_secs(10);
    let client = Client::new(config);
    let count = Arc::new(AtomicU64::new(0));
    let ops_on = |node: usize| Ops {
        session: client.kite_session(node),
        strong: args.all_strong,
        count: count.clone(),
    };
    let mut setup = ops_on(0);
    match structure {
        Structure::Stack => setup.session.release(b"stack:head", NIL).await?,
        Structure::Queue => queue_setup(&mut setup).await?,
        Structure::List => list_setup(&mut setup).await?,
    }
    let kill = cluster.is_some() && !args.no_kill && addrs.len() >= 3;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for node in 0..addrs.len() {
        for w in 0..args.workers {
            let ops = ops_on(node);
            let name = format!("n{}w{w}", node + 1);
            let seed = (node * 1000 + w) as u64 + 7;
            tasks.push(tokio::spawn(worker(structure, ops, name, args.ops, args.keys, seed)));
        }
    }
    let finished = Arc::new(AtomicU64::new(0));
    let total = (addrs.len() * args.workers) as u64;
    let mut killed = false;
    let mut restarted = false;
    let budget = count.clone();
    // Operations make several accesses each: a third of the way is judged on accesses.
    let expected = args.ops * total * 4;
    let mut joined = Vec::new();
    let mut pending = tasks;
    while !pending.is_empty() {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let progress = budget.load(Ordering::Relaxed);
        if let Some(cluster) = cluster.as_deref_mut().filter(|_| kill) {
            if !killed && progress * 3 >= expected {
                cluster.kill(2);
                killed = true;
            } else if killed && !restarted && progress * 3 >= expected * 2 {
                cluster.restart(2).context("restarting node 3")?;
                restarted = true;
            }
        }
        let mut still = Vec::new();
        for task in pending {
            if task.is_finished() {
                joined.push(task.await.context("a worker panicked")?);
                finished.fetch_add(1, Ordering::Relaxed);
            } else {
                still.push(task);
            }
        }
        pending = still;
    }
    let seconds = started.elapsed().as_secs_f64();
    if let Some(cluster) = cluster.filter(|_| killed) {
        if !restarted {
            cluster.restart(2).context("restarting node 3")?;
        }
        anyhow::ensure!(
            cluster.wait_for_replicas(keyspace, Duration::from_secs(30)),
            "node 3 did not rejoin"
        );
    }
    // The final drain or walk runs on the last node (restarted, when one was killed), over
    // connections of their own (the pool's to node 3 died with it).
    let mut config = ClientConfig::new(addrs.clone());
    config.keyspace = keyspace;
    let fresh = Client::new(config);
    let mut last = Ops {
        session: fresh.kite_session(addrs.len() - 1),
        strong: args.all_strong,
        count: count.clone(),
    };
    let operations: u64 = joined.iter().map(|d| d.operations).sum();
    let mut violations = Vec::new();
    let summary = match structure {
        Structure::Stack | Structure::Queue => {
            let mut drained = Vec::new();
            loop {
                let taken = match structure {
                    Structure::Stack => pop(&mut last).await?,
                    _ => dequeue(&mut last).await?,
                };
                match taken {
                    Some(item) => drained.push(item),
                    None => break,
                }
            }
            check_bag(structure, &joined, &drained, &mut violations);
            let added: usize = joined.iter().map(|d| d.added.len()).sum();
            let taken: usize = joined.iter().map(|d| d.taken.len()).sum();
            let maybe: usize =
                joined.iter().map(|d| d.added_maybe.len() + d.taken_maybe as usize).sum();
            format!("{added} added, {taken} taken by the workers, {} drained at the end, {maybe} without a reply", drained.len())
        }
        Structure::List => {
            let keys = walk(&mut last).await?;
            check_list(&joined, &keys, &mut violations);
            let inserted: u64 = joined.iter().flat_map(|d| d.inserted.values()).sum();
            let removed: u64 = joined.iter().flat_map(|d| d.removed.values()).sum();
            let unsure: u64 = joined.iter().flat_map(|d| d.unsure.values()).sum();
            format!("{inserted} inserted, {removed} removed, {} keys in the list at the end, {unsure} operations without a reply", keys.len())
        }
    };
    Ok(serde_json::json!({
        "example": structure.name(),
        "workers": total,
        "operations": operations,
        "accesses": count.load(Ordering::Relaxed),
        "seconds": seconds,
        "ops_per_second": operations as f64 / seconds.max(1e-9),
        "all_strong": args.all_strong,
        "node_killed": killed,
        "summary": summary,
        "violations": violations,
    }))
}

/// Stack and queue: every item taken at most once, never one nobody added, every
/// confirmed item taken unless a take without a reply may have taken it; the queue keeps
/// each producer's order for every consumer.
fn check_bag(
    structure: Structure,
    done: &[Done],
    drained: &[String],
    violations: &mut Vec<String>,
) {
    let confirmed: BTreeSet<&String> = done.iter().flat_map(|d| &d.added).collect();
    let maybe: BTreeSet<&String> = done.iter().flat_map(|d| &d.added_maybe).collect();
    let mut seen = BTreeSet::new();
    for item in done.iter().flat_map(|d| &d.taken).chain(drained) {
        if !seen.insert(item) {
            violations.push(format!("{item} taken twice"));
        }
        if !confirmed.contains(item) && !maybe.contains(item) {
            violations.push(format!("{item} taken but never added"));
        }
    }
    let missing = confirmed.iter().filter(|i| !seen.contains(**i)).count() as u64;
    let takes_unknown: u64 = done.iter().map(|d| d.taken_maybe).sum();
    if missing > takes_unknown {
        violations.push(format!(
            "{missing} added items never taken, more than the {takes_unknown} takes without a reply"
        ));
    }
    if structure == Structure::Queue {
        // Items are `<producer>.<n>`: each consumer sees each producer's items in order.
        let order = |item: &str| -> Option<(String, u64)> {
            let (producer, n) = item.rsplit_once('.')?;
            Some((producer.to_string(), n.parse().ok()?))
        };
        for consumer in done.iter().map(|d| &d.taken[..]).chain(std::iter::once(drained)) {
            let mut last: BTreeMap<String, u64> = BTreeMap::new();
            for item in consumer {
                let Some((producer, n)) = order(item) else { continue };
                if last.get(&producer).is_some_and(|&before| before > n) {
                    violations.push(format!("{item} taken after a later item of {producer}"));
                }
                last.insert(producer, n);
            }
        }
    }
}

/// List: sorted without duplicates, and each key present iff its successful inserts
/// outnumber its removes, within the operations on it that had no reply.
fn check_list(done: &[Done], keys: &[u64], violations: &mut Vec<String>) {
    if keys.windows(2).any(|w| w[0] >= w[1]) {
        violations.push(format!("the list is not sorted without duplicates: {keys:?}"));
    }
    let present: BTreeSet<u64> = keys.iter().copied().collect();
    let sum = |pick: fn(&Done) -> &BTreeMap<u64, u64>, key: u64| -> i64 {
        done.iter().map(|d| pick(d).get(&key).copied().unwrap_or(0) as i64).sum()
    };
    let all: BTreeSet<u64> = done
        .iter()
        .flat_map(|d| d.inserted.keys().chain(d.removed.keys()).chain(d.unsure.keys()))
        .copied()
        .chain(present.iter().copied())
        .collect();
    for key in all {
        let net = sum(|d| &d.inserted, key) - sum(|d| &d.removed, key);
        let unsure = sum(|d| &d.unsure, key);
        let is = i64::from(present.contains(&key));
        if (net - is).abs() > unsure || !(-unsure..=1 + unsure).contains(&net) {
            violations.push(format!(
                "key {key}: {net} more inserts than removes succeeded, {unsure} unsure, present {}",
                is == 1
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(added: &[&str], taken: &[&str]) -> Done {
        Done {
            added: added.iter().map(|s| s.to_string()).collect(),
            taken: taken.iter().map(|s| s.to_string()).collect(),
            ..Done::default()
        }
    }

    #[test]
    fn the_bag_checks_catch_twice_never_added_lost_and_out_of_order() {
        let mut v = Vec::new();
        check_bag(Structure::Queue, &[done(&["a.1", "a.2"], &["a.1"])], &["a.2".into()], &mut v);
        assert!(v.is_empty(), "{v:?}");
        check_bag(Structure::Stack, &[done(&["a.1"], &["a.1"])], &["a.1".into()], &mut v);
        assert!(v.iter().any(|l| l.contains("taken twice")), "{v:?}");
        v.clear();
        check_bag(Structure::Stack, &[done(&[], &["x.9"])], &[], &mut v);
        assert!(v.iter().any(|l| l.contains("never added")), "{v:?}");
        v.clear();
        check_bag(Structure::Stack, &[done(&["a.1", "a.2"], &["a.1"])], &[], &mut v);
        assert!(v.iter().any(|l| l.contains("never taken")), "{v:?}");
        v.clear();
        let lost_reply = Done { taken_maybe: 1, ..done(&["a.1", "a.2"], &["a.1"]) };
        check_bag(Structure::Stack, &[lost_reply], &[], &mut v);
        assert!(v.is_empty(), "a take without a reply may have taken it: {v:?}");
        check_bag(Structure::Queue, &[done(&["a.1", "a.2"], &["a.2", "a.1"])], &[], &mut v);
        assert!(v.iter().any(|l| l.contains("after a later item")), "{v:?}");
    }

    #[test]
    fn the_list_checks_catch_unsorted_lost_and_doubled_keys() {
        let ops = |ins: &[(u64, u64)], rem: &[(u64, u64)], unsure: &[(u64, u64)]| Done {
            inserted: ins.iter().copied().collect(),
            removed: rem.iter().copied().collect(),
            unsure: unsure.iter().copied().collect(),
            ..Done::default()
        };
        let mut v = Vec::new();
        check_list(&[ops(&[(1, 2), (2, 1)], &[(1, 1)], &[])], &[1, 2], &mut v);
        assert!(v.is_empty(), "{v:?}");
        check_list(&[ops(&[(1, 1)], &[], &[])], &[], &mut v);
        assert!(v.iter().any(|l| l.contains("key 1")), "a lost key: {v:?}");
        v.clear();
        check_list(&[ops(&[(1, 2)], &[], &[])], &[1], &mut v);
        assert!(v.iter().any(|l| l.contains("key 1")), "inserted twice while present: {v:?}");
        v.clear();
        check_list(&[ops(&[(1, 1)], &[], &[(1, 1)])], &[], &mut v);
        assert!(v.is_empty(), "an unsure remove may have removed it: {v:?}");
        check_list(&[], &[2, 1], &mut v);
        assert!(v.iter().any(|l| l.contains("not sorted")), "{v:?}");
    }
}
