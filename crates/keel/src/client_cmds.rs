//! `keel get|set|del|cas|faa|status`: one operation against a running cluster. In a Kite
//! keyspace (found by asking the node), `get`, `set`, `cas` and `faa` run as one
//! operation of a Kite session on that node; `--acquire`, `--release`, `--weak` and
//! `--strong` name its barrier or strength.

use anyhow::bail;
use keel_client::{Client, ClientConfig, ClientError, ClientTls};
use keel_server::local::{keyspace_entries, KeyspaceEntry};
use keel_types::{Durability, KeelError, ReadLevel};
use keel_wire::resp::Frame;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// A node's address as given (`host:port`) and what it resolved to (a name is looked
/// up once, the first address kept).
#[derive(Clone, Debug)]
pub struct NodeAddr {
    /// The host part as given (the name TLS checks the node's certificate against).
    pub host: String,
    /// The address.
    pub addr: SocketAddr,
}

pub(crate) fn resolve(text: &str) -> Result<NodeAddr, String> {
    use std::net::ToSocketAddrs;
    let mut addrs = text.to_socket_addrs().map_err(|e| format!("{text}: {e}"))?;
    let addr = addrs.next().ok_or_else(|| format!("{text}: no address"))?;
    let host = text.rsplit_once(':').map_or(text, |(host, _)| host);
    let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
    Ok(NodeAddr { host, addr })
}

/// How to authenticate and whether to use TLS.
#[derive(Debug, Clone, clap::Args)]
pub struct Access {
    /// The user to authenticate as (nodes with `[[users]]`); the password is read from
    /// the environment variable `KEEL_PASSWORD`.
    #[arg(long)]
    pub user: Option<String>,
    /// Connect over TLS (to a node's `client_tls_addr`), trusting the certificate
    /// authority in this PEM file (`keel up --secure`: `<dir>/tls/ca.pem`).
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// The name the node's certificate must carry (default: the host of `--node`).
    #[arg(long, requires = "tls_ca")]
    pub tls_name: Option<String>,
    /// A client certificate chain (PEM) to present, for nodes that require one.
    #[arg(long, value_name = "FILE", requires_all = ["tls_ca", "tls_key"])]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of `--tls-cert`.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

impl Access {
    /// A client configuration for `nodes` (one at least) in `keyspace` with these
    /// credentials and TLS (the certificate's name: the first node's host by default).
    pub(crate) fn config(&self, nodes: &[NodeAddr], keyspace: u32) -> anyhow::Result<ClientConfig> {
        let node = nodes.first().ok_or_else(|| anyhow::anyhow!("no node"))?;
        let mut config = ClientConfig::new(nodes.iter().map(|n| n.addr).collect());
        config.keyspace = keyspace;
        if let Some(user) = &self.user {
            let password = std::env::var("KEEL_PASSWORD").unwrap_or_default();
            config.credentials = Some((user.clone(), password));
        }
        if let Some(ca) = &self.tls_ca {
            let name = self.tls_name.as_deref().unwrap_or(&node.host);
            let identity = self.tls_cert.as_deref().zip(self.tls_key.as_deref());
            config.tls = Some(ClientTls::new(ca, name, identity).map_err(anyhow::Error::msg)?);
        }
        Ok(config)
    }
}

/// Where to connect and how.
#[derive(Debug, Clone, clap::Args)]
pub struct Target {
    /// A node's client address, `host:port` (any node serves any command).
    #[arg(long, default_value = "127.0.0.1:7379", value_parser = resolve)]
    pub node: NodeAddr,
    /// The keyspace (what `SELECT` takes).
    #[arg(long, default_value_t = 0)]
    pub keyspace: u32,
    #[command(flatten)]
    pub(crate) access: Access,
}

/// `keel get KEY`.
#[derive(Debug, Clone, clap::Args)]
pub struct GetArgs {
    /// The key.
    pub key: String,
    /// Read level: any, monotonic, linearizable (default: the server's).
    #[arg(long, conflicts_with = "acquire")]
    pub level: Option<ReadLevel>,
    /// An acquire (Kite keyspaces): linearizable, and later reads see what came before
    /// the release it reads.
    #[arg(long)]
    pub acquire: bool,
    #[command(flatten)]
    target: Target,
}

/// `keel node add|promote|remove|transfer-leader|return ID`.
#[derive(Debug, Clone, clap::Args)]
pub struct NodeArgs {
    /// `add` (as a learner), `promote` (a learner to a voter), `remove` (a voter or a
    /// learner), `transfer-leader`. In a Kite keyspace, `add` and `promote` both make
    /// the node a voter (it reads the old voters' state first), `remove` stops its vote,
    /// and no node leads. In a geo keyspace only `remove` and `return` have a meaning:
    /// `remove` removes the node's whole data center, `return` takes a removed one back
    /// once its new machines run joining (`[geo] joining`); ask a node of another data
    /// center (`docs/geo.md`).
    #[arg(value_parser = ["add", "promote", "remove", "transfer-leader", "return"])]
    pub change: String,
    /// The node's id (as in `members`).
    pub id: u32,
    /// How long to keep asking while the change may not be made yet (`BUSY`: a learner
    /// catching up, the previous change not committed, the leadership moving), no leader
    /// is known, or the answer was lost; 0: ask once.
    #[arg(long, default_value_t = 30)]
    pub wait: u64,
    #[command(flatten)]
    target: Target,
}

/// Runs `keel node`: `KEEL.NODE` to the target node, which forwards it to the keyspace's
/// leader; answered once the change is committed (a change asked again once in effect is
/// answered as done, so asking again is safe). Removing the leader moves its leadership
/// to another voter first. In a Kite keyspace each request makes one step of the change
/// (to the joint voters, then, once the new voters have read the old ones' state, to the
/// new voters alone) and answers `BUSY` until it is settled: this asks again.
pub fn node(args: &NodeArgs) -> ExitCode {
    run(async {
        let client = client(&args.target)?;
        let deadline = std::time::Instant::now() + Duration::from_secs(args.wait);
        if args.change == "remove" {
            if let Some(to) = leader_successor(&client, args.id).await {
                eprintln!("node {} leads: moving its leadership to node {to} first", args.id);
                ask_until_done(&client, "transfer-leader", to, deadline).await?;
            }
        }
        ask_until_done(&client, &args.change, args.id, deadline).await?;
        println!("OK");
        Ok(())
    })
}

/// If node `id` leads, as the target node sees it: another voter to take over.
async fn leader_successor(client: &Client, id: u32) -> Option<u32> {
    let Ok(Frame::Bulk(json)) = client.call_node(0, &[b"KEEL.STATUS"]).await else {
        return None;
    };
    let status: serde_json::Value = serde_json::from_slice(&json).ok()?;
    if status["leader"].as_u64() != Some(u64::from(id)) {
        return None;
    }
    let voters = status["voters"].as_array()?.iter().filter_map(|v| v.as_u64());
    voters.map(|v| v as u32).find(|v| *v != id)
}

/// Asks `KEEL.NODE change id` again (every 200 ms, until `deadline`) while the change may
/// not be made yet, no leader is known, or the answer was lost.
async fn ask_until_done(
    client: &Client,
    change: &str,
    id: u32,
    deadline: std::time::Instant,
) -> anyhow::Result<()> {
    let id = id.to_string();
    let words: [&[u8]; 3] = [b"KEEL.NODE", change.as_bytes(), id.as_bytes()];
    // Each reason for waiting is printed once, not at every try.
    let mut said = String::new();
    loop {
        let error = match client.call_node(0, &words).await {
            Ok(_) => return Ok(()),
            Err(error) => error,
        };
        let passing = matches!(
            &error,
            ClientError::Keel(
                KeelError::Busy(_) | KeelError::NotLeader { .. } | KeelError::Timeout
            ) | ClientError::Connection(_)
        );
        if !passing || std::time::Instant::now() >= deadline {
            return Err(error.into());
        }
        let reason = error.to_string();
        if reason != said {
            eprintln!("not yet: {reason}");
            said = reason;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `keel set KEY VALUE`.
#[derive(Debug, Clone, clap::Args)]
pub struct SetArgs {
    /// The key.
    pub key: String,
    /// The value.
    pub value: String,
    /// Durability: memory, replicated, durable (default: the server's).
    #[arg(long, conflicts_with = "release")]
    pub durability: Option<Durability>,
    /// A release (Kite keyspaces).
    #[arg(long)]
    pub release: bool,
    #[command(flatten)]
    target: Target,
}

/// `keel faa KEY DELTA`.
#[derive(Debug, Clone, clap::Args)]
pub struct FaaArgs {
    /// The key (a decimal i64; absent counts as 0).
    pub key: String,
    /// The amount added (may be negative).
    #[arg(allow_hyphen_values = true)]
    pub delta: i64,
    #[command(flatten)]
    target: Target,
}

/// `keel del KEY`.
#[derive(Debug, Clone, clap::Args)]
pub struct DelArgs {
    /// The key.
    pub key: String,
    #[command(flatten)]
    target: Target,
}

/// `keel cas KEY EXPECTED NEW`.
#[derive(Debug, Clone, clap::Args)]
pub struct CasArgs {
    /// The key.
    pub key: String,
    /// The value the key must hold; `--absent` instead for "must not exist".
    #[arg(required_unless_present = "absent")]
    pub expected: Option<String>,
    /// The new value.
    #[arg(long)]
    pub new: String,
    /// The key must be absent.
    #[arg(long)]
    pub absent: bool,
    /// Durability: memory, replicated, durable.
    #[arg(long)]
    pub durability: Option<Durability>,
    /// A weak compare-and-swap (Kite keyspaces): may fail against the node's copy
    /// without a barrier. Kite's default is strong.
    #[arg(long, conflicts_with = "durability")]
    pub weak: bool,
    #[command(flatten)]
    target: Target,
}

/// `keel status`.
#[derive(Debug, Clone, clap::Args)]
pub struct StatusArgs {
    /// Client addresses of the nodes to ask (default: a local 3-node `keel up` cluster).
    #[arg(long = "node", default_values = ["127.0.0.1:7379", "127.0.0.1:7380", "127.0.0.1:7381"], value_parser = resolve)]
    pub nodes: Vec<NodeAddr>,
    /// Print each node's keyspaces' JSON documents instead of tables.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    access: Access,
}

pub(crate) fn run(body: impl std::future::Future<Output = anyhow::Result<()>>) -> ExitCode {
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    match runtime.block_on(body) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("keel: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn client(target: &Target) -> anyhow::Result<std::sync::Arc<Client>> {
    Ok(Client::new(target.access.config(std::slice::from_ref(&target.node), target.keyspace)?))
}

/// A Kite session on the target's node, if its keyspace runs Kite (`None`: another
/// engine, or a node that does not list its keyspaces).
async fn kite_session(target: &Target) -> anyhow::Result<Option<keel_client::KiteSession>> {
    let client = client(target)?;
    let listed = client.call_node(0, &[b"KEEL.KEYSPACES"]).await.ok();
    let kite = listed
        .as_ref()
        .and_then(keyspace_entries)
        .is_some_and(|all| all.iter().any(|k| k.id == target.keyspace && k.engine == "kite"));
    Ok(kite.then(|| client.kite_session(0)))
}

fn show(value: Option<&[u8]>) -> String {
    value.map_or("(nil)".to_string(), |v| String::from_utf8_lossy(v).into_owned())
}

/// Runs `keel get`.
pub fn get(args: &GetArgs) -> ExitCode {
    run(async {
        if let Some(mut kite) = kite_session(&args.target).await? {
            let key = args.key.as_bytes();
            let value =
                if args.acquire { kite.acquire(key).await? } else { kite.read(key).await? };
            println!("{}", show(value.as_deref()));
            return Ok(());
        }
        if args.acquire {
            bail!("--acquire needs a kite keyspace (keyspace {} is not one)", args.target.keyspace);
        }
        let read = client(&args.target)?.session().get(args.key.as_bytes(), args.level).await?;
        let version = read.version.map_or("-".to_string(), |v| v.to_string());
        println!("{}\t(version {version})", show(read.value.as_deref()));
        Ok(())
    })
}

/// Runs `keel set`.
pub fn set(args: &SetArgs) -> ExitCode {
    run(async {
        if let Some(mut kite) = kite_session(&args.target).await? {
            let (key, value) = (args.key.as_bytes(), args.value.as_bytes());
            match args.release {
                true => kite.release(key, value).await?,
                false => kite.write(key, value).await?,
            }
            println!("OK");
            return Ok(());
        }
        if args.release {
            bail!("--release needs a kite keyspace (keyspace {} is not one)", args.target.keyspace);
        }
        let mut session = client(&args.target)?.session();
        let written =
            session.put(args.key.as_bytes(), args.value.as_bytes(), args.durability).await?;
        println!("OK\t(version {})", written.version.map_or("-".to_string(), |v| v.to_string()));
        Ok(())
    })
}

/// Runs `keel del`.
pub fn del(args: &DelArgs) -> ExitCode {
    run(async {
        let existed = client(&args.target)?.session().delete(args.key.as_bytes()).await?;
        println!("{}", if existed { "deleted" } else { "absent" });
        Ok(())
    })
}

/// Runs `keel cas`.
pub fn cas(args: &CasArgs) -> ExitCode {
    run(async {
        if args.absent && args.expected.is_some() {
            bail!("give EXPECTED or --absent, not both");
        }
        let expected = args.expected.as_deref().map(str::as_bytes);
        if let Some(mut kite) = kite_session(&args.target).await? {
            let result =
                kite.cas(args.key.as_bytes(), expected, args.new.as_bytes(), !args.weak).await?;
            match result.swapped {
                true => println!("swapped"),
                false => println!("not swapped: found {}", show(result.current.as_deref())),
            }
            return Ok(());
        }
        if args.weak {
            bail!("--weak needs a kite keyspace (keyspace {} is not one)", args.target.keyspace);
        }
        let mut session = client(&args.target)?.session();
        let result = session
            .cas(args.key.as_bytes(), expected, args.new.as_bytes(), args.durability)
            .await?;
        let version = result.version.map_or("-".to_string(), |v| v.to_string());
        if result.swapped {
            println!("swapped\t(version {version})");
        } else {
            println!("not swapped: found {}\t(version {version})", show(result.current.as_deref()));
        }
        Ok(())
    })
}

/// Runs `keel faa`: prints the value before the addition.
pub fn faa(args: &FaaArgs) -> ExitCode {
    run(async {
        let before = match kite_session(&args.target).await? {
            Some(mut kite) => kite.faa(args.key.as_bytes(), args.delta).await?,
            None => {
                // ORCA: an increment deduplicated across retries, the value before derived.
                let after =
                    client(&args.target)?.session().incr(args.key.as_bytes(), args.delta).await?;
                after - args.delta
            }
        };
        println!("{before}");
        Ok(())
    })
}

/// One node's view of each keyspace it hosts: `(keyspace, its status)`, or `None`
/// when it did not answer.
type NodeView = Option<Vec<(KeyspaceEntry, Option<serde_json::Value>)>>;

/// How long each status query may take.
const STATUS_TIMEOUT: Duration = Duration::from_secs(1);

/// Asks `node` once, in `keyspace`, for the reply to `words` (an error reply is `None`).
async fn ask(access: &Access, node: &NodeAddr, keyspace: u32, words: &[&[u8]]) -> Option<Frame> {
    let mut config = access.config(std::slice::from_ref(node), keyspace).ok()?;
    // `KEEL.KEYSPACES` is the node's own: asked without selecting keyspace 0, which a
    // node of a placed cluster may not host.
    config.select = words.first() != Some(&&b"KEEL.KEYSPACES"[..]);
    config.attempts_max = 1;
    config.attempt_timeout = STATUS_TIMEOUT;
    config.connections_per_node = 1;
    Client::new(config).call_node(0, words).await.ok()
}

async fn node_view(access: &Access, node: &NodeAddr) -> NodeView {
    let keyspaces = keyspace_entries(&ask(access, node, 0, &[b"KEEL.KEYSPACES"]).await?)?;
    let mut view = Vec::with_capacity(keyspaces.len());
    for keyspace in keyspaces {
        let doc = match ask(access, node, keyspace.id, &[b"KEEL.STATUS"]).await {
            Some(Frame::Bulk(json)) => serde_json::from_slice(&json).ok(),
            _ => None,
        };
        view.push((keyspace, doc));
    }
    Some(view)
}

/// Runs `keel status`.
pub fn status(args: &StatusArgs) -> ExitCode {
    if let Some(node) = args.nodes.first() {
        // Settings that cannot work (an unreadable CA file, say) are said once, up front.
        if let Err(e) = args.access.config(std::slice::from_ref(node), 0) {
            eprintln!("keel status: {e:#}");
            return ExitCode::from(1);
        }
    }
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let views: Vec<(&SocketAddr, NodeView)> = runtime.block_on(async {
        let mut views = Vec::with_capacity(args.nodes.len());
        for node in &args.nodes {
            views.push((&node.addr, node_view(&args.access, node).await));
        }
        views
    });
    if args.json {
        for (addr, view) in &views {
            let docs: Vec<serde_json::Value> = view
                .iter()
                .flatten()
                .map(|(_, doc)| doc.clone().unwrap_or(serde_json::Value::Null))
                .collect();
            let line = if view.is_some() {
                serde_json::Value::Array(docs).to_string()
            } else {
                "unreachable".into()
            };
            println!("{addr}\t{line}");
        }
        return ExitCode::SUCCESS;
    }
    // Every keyspace some node hosts (a placed cluster's nodes each list their own).
    let mut keyspaces: Vec<KeyspaceEntry> = Vec::new();
    for (entry, _) in views.iter().filter_map(|(_, v)| v.as_ref()).flatten() {
        if keyspaces.iter().all(|k| k.id != entry.id) {
            keyspaces.push(entry.clone());
        }
    }
    keyspaces.sort_by_key(|k| k.id);
    if keyspaces.is_empty() {
        eprintln!("keel status: no node answered");
        return ExitCode::from(1);
    }
    for (i, keyspace) in keyspaces.iter().enumerate() {
        if keyspaces.len() > 1 {
            if i > 0 {
                println!();
            }
            println!("keyspace {} ({}, {})", keyspace.id, keyspace.name, keyspace.engine);
        }
        // A node that answered without this keyspace does not host it: not a row.
        let rows: Vec<(&SocketAddr, Option<serde_json::Value>)> = views
            .iter()
            .filter_map(|(addr, view)| match view {
                None => Some((*addr, None)),
                Some(v) => {
                    let (_, doc) = v.iter().find(|(k, _)| k.id == keyspace.id)?;
                    Some((*addr, doc.clone()))
                }
            })
            .collect();
        print_status(&rows);
    }
    ExitCode::SUCCESS
}

fn print_status(rows: &[(&SocketAddr, Option<serde_json::Value>)]) {
    let get = |d: &serde_json::Value, k: &str| d.get(k).map_or("-".to_string(), |v| v.to_string());
    if rows.iter().filter_map(|(_, d)| d.as_ref()).any(|d| d["engine"] == "kite") {
        print_kite_status(rows);
        return;
    }
    if rows.iter().filter_map(|(_, d)| d.as_ref()).any(|d| d["engine"] == "geo") {
        print_geo_status(rows);
        return;
    }
    let leader_doc = rows.iter().filter_map(|(_, d)| d.as_ref()).find(|d| d["role"] == "leader");
    match leader_doc {
        Some(d) => println!(
            "leader n{}  epoch {}  commit {}  durable {}  active set {}  voters {}  learners {}",
            get(d, "node_id"),
            get(d, "epoch"),
            get(d, "commit_index"),
            get(d, "durable_index"),
            get(d, "active_set"),
            get(d, "voters"),
            get(d, "learners"),
        ),
        None => println!("no leader reachable"),
    }
    println!(
        "{:<22} {:<5} {:<10} {:>6} {:>10} {:>10} {:>10} {:>7}",
        "node", "id", "role", "epoch", "persisted", "applied", "durable", "active"
    );
    for (addr, doc) in rows {
        let Some(d) = doc else {
            println!("{addr:<22} unreachable");
            continue;
        };
        println!(
            "{addr:<22} {:<5} {:<10} {:>6} {:>10} {:>10} {:>10} {:>7}",
            get(d, "node_id"),
            d["role"].as_str().unwrap_or("-"),
            get(d, "epoch"),
            get(d, "persisted_index"),
            get(d, "applied_index"),
            get(d, "durable_index"),
            get(d, "active"),
        );
    }
}

/// A geo keyspace's table: each node's data center and partition, keys and log entries,
/// open transactions, messages not yet acknowledged, how far its uniform vector lags its
/// own clock (the oldest remote transaction it may still hide, in ms; removed data
/// centers left out), its role
/// (`replica`, `lost`, `removed`) and the data centers it suspects; the header names the
/// data centers removed. Data centers are numbered from 1 in their labels' byte order.
fn print_geo_status(rows: &[(&SocketAddr, Option<serde_json::Value>)]) {
    let get = |d: &serde_json::Value, k: &str| d.get(k).map_or("-".to_string(), |v| v.to_string());
    let dcs = |v: &serde_json::Value| -> Vec<String> {
        let numbers = v.as_array().into_iter().flatten().filter_map(|dc| dc.as_u64());
        numbers.map(|n| (n + 1).to_string()).collect()
    };
    let mut removed: Vec<String> =
        rows.iter().filter_map(|(_, d)| d.as_ref()).flat_map(|d| dcs(&d["removed"])).collect();
    removed.sort();
    removed.dedup();
    match removed.is_empty() {
        true => println!("leaderless (geo)"),
        false => println!("leaderless (geo)  removed: data center {}", removed.join(",")),
    }
    println!(
        "{:<22} {:<5} {:>3} {:>9} {:>8} {:>9} {:>6} {:>8} {:>11} {:>8}  suspected",
        "node",
        "id",
        "dc",
        "partition",
        "keys",
        "entries",
        "open",
        "unacked",
        "uniform lag",
        "role"
    );
    for (addr, doc) in rows {
        let Some(d) = doc else {
            println!("{addr:<22} unreachable");
            continue;
        };
        let entries = |v: &serde_json::Value| -> Vec<u64> {
            v["dcs"].as_array().into_iter().flatten().filter_map(|t| t.as_u64()).collect()
        };
        let (known, uniform) = (entries(&d["known"]), entries(&d["uniform"]));
        let own = d["dc"].as_u64().and_then(|dc| known.get(dc as usize).copied()).unwrap_or(0);
        // Timestamps are microseconds shifted past the partition's 10 bits; a removed data
        // center's entry stays where it was, and is left out.
        let gone = dcs(&d["removed"]);
        let live = uniform.iter().enumerate().filter(|(j, _)| !gone.contains(&(j + 1).to_string()));
        let lag = live.map(|(_, &u)| own.saturating_sub(u) >> 10).max().unwrap_or(0);
        let suspected = dcs(&d["suspected"]);
        println!(
            "{addr:<22} {:<5} {:>3} {:>9} {:>8} {:>9} {:>6} {:>8} {:>9}ms {:>8}  {}",
            get(d, "node_id"),
            d["dc"].as_u64().map_or("-".to_string(), |n| (n + 1).to_string()),
            get(d, "partition"),
            get(d, "keys"),
            get(d, "entries"),
            get(d, "open"),
            get(d, "unacked"),
            lag / 1000,
            d["role"].as_str().unwrap_or("-"),
            if suspected.is_empty() { "-".to_string() } else { suspected.join(",") },
        );
    }
}

/// A Kite keyspace's table: leaderless; each node's epoch, incarnation, keys (in epoch),
/// sessions and the nodes it deems delinquent.
fn print_kite_status(rows: &[(&SocketAddr, Option<serde_json::Value>)]) {
    let get = |d: &serde_json::Value, k: &str| d.get(k).map_or("-".to_string(), |v| v.to_string());
    let newest = rows
        .iter()
        .filter_map(|(_, d)| d.as_ref())
        .max_by_key(|d| d["membership"]["epoch"].as_u64().unwrap_or(0));
    match newest {
        Some(d) => println!("leaderless (kite)  {}", show_membership(&d["membership"])),
        None => println!("leaderless (kite)"),
    }
    println!(
        "{:<22} {:<5} {:<10} {:<8} {:>6} {:>12} {:>8} {:>9} {:>9}  delinquent",
        "node", "id", "role", "votes", "epoch", "incarnation", "keys", "in epoch", "sessions"
    );
    for (addr, doc) in rows {
        let Some(d) = doc else {
            println!("{addr:<22} unreachable");
            continue;
        };
        let ids = |side: &serde_json::Value| -> Vec<u64> {
            side.as_array().into_iter().flatten().filter_map(|v| v.as_u64()).collect()
        };
        let me = d["node_id"].as_u64().or(d["node"].as_u64()).unwrap_or(0);
        let m = &d["membership"];
        let now = ids(&m["voters"]).contains(&me);
        // During a change, whether it votes once the change is done.
        let then = (!m["next"].is_null()).then(|| ids(&m["next"]).contains(&me));
        let votes = match (now, then) {
            (true, None | Some(true)) => "yes",
            (true, Some(false)) => "leaving",
            (false, Some(true)) => "joining",
            (false, _) => "no",
        };
        let delinquent: Vec<String> = d["bits"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|b| b[1] != "Clear")
            .map(|b| format!("n{}", b[0]))
            .collect();
        println!(
            "{addr:<22} {:<5} {:<10} {:<8} {:>6} {:>12} {:>8} {:>9} {:>9}  {}",
            get(d, "node_id"),
            d["role"].as_str().unwrap_or("-"),
            votes,
            get(d, "epoch"),
            get(d, "incarnation"),
            get(d, "keys"),
            get(d, "keys_in_epoch"),
            get(d, "sessions"),
            if delinquent.is_empty() { "-".to_string() } else { delinquent.join(",") },
        );
    }
    for (addr, doc) in rows {
        if let Some(line) = doc.as_ref().and_then(show_voters_disagree) {
            println!("{addr}: {line}");
        }
    }
}

/// The warning `keel status` prints for a Kite node that found members configured with
/// other `voters` (it serves nothing meanwhile), or `None`.
fn show_voters_disagree(d: &serde_json::Value) -> Option<String> {
    let others: Vec<String> =
        d["voters_disagree"].as_array()?.iter().map(|v| v.to_string()).collect();
    (!others.is_empty()).then(|| {
        format!(
            "configured with other voters than node(s) {}, and the membership was never \
             changed: it serves nothing until every node has the same `voters` and `members`",
            others.join(",")
        )
    })
}

/// A Kite membership as `keel status` shows it: `membership 2: voters 1,2,3` or, during a
/// change, `membership 3: voters 1,2,3 -> 1,2,3,4 (changing)`.
fn show_membership(m: &serde_json::Value) -> String {
    let ids = |side: &serde_json::Value| -> String {
        let ids: Vec<String> =
            side.as_array().into_iter().flatten().map(|v| v.to_string()).collect();
        ids.join(",")
    };
    let epoch = m["epoch"].as_u64().unwrap_or(0);
    match m["next"].is_null() {
        true => format!("membership {epoch}: voters {}", ids(&m["voters"])),
        false => format!(
            "membership {epoch}: voters {} -> {} (changing)",
            ids(&m["voters"]),
            ids(&m["next"])
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kite_membership_shows_its_voters_and_a_change_under_way() {
        let settled = serde_json::json!({"epoch": 2, "voters": [1, 2, 3], "next": null});
        assert_eq!(show_membership(&settled), "membership 2: voters 1,2,3");
        let changing = serde_json::json!({"epoch": 3, "voters": [1, 2, 3], "next": [1, 2, 3, 4]});
        assert_eq!(show_membership(&changing), "membership 3: voters 1,2,3 -> 1,2,3,4 (changing)");
    }

    #[test]
    fn a_kite_node_configured_with_other_voters_is_shown() {
        let d = serde_json::json!({"voters_disagree": [4, 5]});
        let line = show_voters_disagree(&d).expect("shown");
        assert!(line.starts_with("configured with other voters than node(s) 4,5"), "{line}");
        assert_eq!(show_voters_disagree(&serde_json::json!({"voters_disagree": []})), None);
    }

    #[test]
    fn absent_values_show_as_nil() {
        assert_eq!(show(None), "(nil)");
        assert_eq!(show(Some(b"v")), "v");
    }

    #[test]
    fn nodes_may_be_named_by_host() {
        let node = resolve("localhost:7379").expect("localhost resolves");
        assert!(node.addr.ip().is_loopback() && node.addr.port() == 7379, "{node:?}");
        assert_eq!(node.host, "localhost");
        let node = resolve("127.0.0.1:7380").unwrap();
        assert_eq!((node.addr.port(), node.host.as_str()), (7380, "127.0.0.1"));
        assert_eq!(resolve("[::1]:7381").unwrap().host, "::1");
        assert!(resolve("no-port").is_err());
    }
}
