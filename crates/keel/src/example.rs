//! `keel example ...`: the papers' applications (`bank`: `example_bank`), run against a local cluster
//! they start themselves (or `--connect` addresses).
//!
//! `keel example tickets`: an organizer puts `--tickets` tickets in a replicated queue;
//! `--retailers` concurrent retailers sell them. Each purchase is one `KEEL.INVOKE
//! DEQUEUE` (named by the retailer's session, so a retry never takes a second ticket): while
//! the preliminary view shows more than `--threshold` tickets left, the retailer sells on
//! it at once and lets the dequeue complete in the background; below that it waits for the
//! final view, the dequeue ordered through the log. `revoked` counts purchases whose
//! preliminary view showed a ticket the final view did not give (`revoked_sales` those
//! sold on it, taken back), `oversold` tickets sold beyond the stock or twice.
//! `docs/correctables.md` describes it.

use anyhow::Context;
use keel_client::{Client, ClientConfig, ClientError, QueueItem, Session, View};
use keel_server::local::LocalCluster;
use keel_types::{Durability, ReadLevel};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a killed leader stays down (`--kill-leader`).
const DOWN_FOR: Duration = Duration::from_millis(1500);

/// Flags of `keel example`.
#[derive(Debug, Clone, clap::Args)]
pub struct ExampleArgs {
    #[command(subcommand)]
    pub example: Example,
}

/// The examples.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Example {
    /// Retailers sell tickets from a replicated queue, acting on preliminary views while
    /// many remain; never oversell.
    Tickets(TicketsArgs),
    /// Ad serving: a profile's ad references read as a Correctable, the ads fetched on
    /// the preliminary view (speculation), against a strong-only baseline.
    Ads(crate::example_ads::AdsArgs),
    /// UniStore's bank on a geo cluster: concurrent causal deposits at every data center
    /// converge to the exact sums; a session that called KEEL.BARRIER finds what it saw
    /// at another data center after its own fails.
    Bank(crate::example_bank::BankArgs),
    /// A Treiber stack on a Kite keyspace; every pushed item popped once.
    KiteStack(crate::example_kite::KiteArgs),
    /// A Michael-Scott queue on a Kite keyspace; every item dequeued once, in order.
    KiteQueue(crate::example_kite::KiteArgs),
    /// A Harris-Michael sorted list on a Kite keyspace; no key lost or doubled.
    KiteList(crate::example_kite::KiteArgs),
}

/// Flags of `keel example tickets`.
#[derive(Debug, Clone, clap::Args)]
pub struct TicketsArgs {
    /// Tickets for sale.
    #[arg(long, default_value_t = 500)]
    pub tickets: u64,
    /// Concurrent retailers (each a session of its own).
    #[arg(long, default_value_t = 4)]
    pub retailers: usize,
    /// Sell on the preliminary view only while more than this many tickets remain.
    #[arg(long, default_value_t = 20)]
    pub threshold: u64,
    /// Client addresses of a running cluster (comma-separated) instead of a local one.
    #[arg(long, value_delimiter = ',')]
    pub connect: Vec<SocketAddr>,
    /// SIGKILL the leader when a third of the tickets are sold, restart it 1.5 s later
    /// (local cluster only).
    #[arg(long)]
    pub kill_leader: bool,
    /// Durability of the dequeues (and enqueues): `durable` by default, since an
    /// acknowledged dequeue that a crash undid would give its ticket out again.
    #[arg(long, default_value = "durable")]
    pub durability: Durability,
    /// Print one JSON object at the end instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Where to put the local cluster (default: a fresh temporary directory, removed).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// Runs `keel example ...`.
pub fn run(args: &ExampleArgs) -> ExitCode {
    use crate::example_kite::Structure;
    match &args.example {
        Example::KiteStack(a) => return crate::example_kite::run(Structure::Stack, a),
        Example::KiteQueue(a) => return crate::example_kite::run(Structure::Queue, a),
        Example::KiteList(a) => return crate::example_kite::run(Structure::List, a),
        Example::Bank(a) => return crate::example_bank::run(a),
        _ => {}
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    match &args.example {
        Example::Ads(args) => crate::example_ads::run(&runtime, args),
        Example::KiteStack(_) | Example::KiteQueue(_) | Example::KiteList(_) | Example::Bank(_) => {
            unreachable!("run above")
        }
        Example::Tickets(args) => match runtime.block_on(tickets(args)) {
            Ok(report) => {
                if args.json {
                    println!("{}", serde_json::to_string(&report.json()).expect("json"));
                } else {
                    report.print();
                }
                if report.oversold == 0 {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::from(1)
                }
            }
            Err(e) => {
                eprintln!("keel example tickets: {e:#}");
                ExitCode::from(2)
            }
        },
    }
}

/// How one purchase ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A ticket sold, on the preliminary view (`speculated`) or the final one.
    Sold { ticket: Vec<u8>, speculated: bool },
    /// No ticket: the final view found the queue empty (`revoked`: a preliminary view
    /// had shown one).
    SoldOut { revoked: bool },
    /// Sold on a preliminary view that the final view did not back: the sale is taken
    /// back (the buyer told and refunded), so nothing is sold that does not exist.
    SaleRevoked,
}

/// Whether a preliminary view allows selling at once: it shows a ticket and more than
/// `threshold` tickets left with it (`remaining` counts those after it).
pub fn sell_on_preliminary(view: &Option<QueueItem>, threshold: u64) -> bool {
    matches!(view, Some(item) if item.remaining >= threshold)
}

/// How a purchase ends once the final view is in: `speculated` when it was sold on a
/// preliminary view, `shown` whether any preliminary view showed a ticket.
///
/// The Correctables paper's Listing 5 shows "Sold out" to a buyer already sold a ticket
/// on the preliminary view when the final view confirms it (its `else` fires when `done`
/// is true); here a speculative sale the final view confirms stays sold, and only one it
/// does not back is taken back.
pub fn settle(speculated: bool, shown: bool, final_view: Option<QueueItem>) -> Outcome {
    match (final_view, speculated) {
        (Some(item), _) => Outcome::Sold { ticket: item.value, speculated },
        (None, true) => Outcome::SaleRevoked,
        (None, false) => Outcome::SoldOut { revoked: shown },
    }
}

/// One purchase: an invocation and what the retailer made of its views; the latency to
/// the sale (or to the final answer) in µs.
async fn purchase(
    session: &mut Session,
    queue: &[u8],
    threshold: u64,
    durability: Durability,
) -> Result<(Outcome, u64), ClientError> {
    let started = Instant::now();
    let invocation = session.invoke_dequeue(queue, &[ReadLevel::Any], Some(durability)).await?;
    let mut views = invocation.views();
    let (mut speculated_at, mut shown) = (None, false);
    while let Some(view) = views.next().await {
        let View { level, value, .. } = view?;
        if level == ReadLevel::Linearizable {
            let latency = speculated_at.unwrap_or_else(|| micros(started.elapsed()));
            return Ok((settle(speculated_at.is_some(), shown, value), latency));
        }
        shown |= value.is_some();
        if speculated_at.is_none() && sell_on_preliminary(&value, threshold) {
            speculated_at = Some(micros(started.elapsed()));
        }
    }
    Err(ClientError::Unexpected("the invocation closed without a final view".into()))
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// What one retailer did.
#[derive(Debug, Default)]
struct Sales {
    sold: Vec<(Vec<u8>, bool, u64)>,
    revoked_sales: u64,
    revoked: u64,
    unknown: u64,
}

async fn retailer(
    client: Arc<Client>,
    queue: Vec<u8>,
    threshold: u64,
    durability: Durability,
    sold_count: Arc<AtomicU64>,
) -> Sales {
    let mut session = client.session();
    let mut sales = Sales::default();
    // A retailer stops at the first "sold out"; a purchase whose retries ran out leaves
    // its ticket unknown (it may or may not have been taken) and the retailer goes on.
    let mut failures_in_a_row = 0;
    loop {
        match purchase(&mut session, &queue, threshold, durability).await {
            Ok((Outcome::Sold { ticket, speculated }, latency)) => {
                sold_count.fetch_add(1, Ordering::Relaxed);
                sales.sold.push((ticket, speculated, latency));
                failures_in_a_row = 0;
            }
            Ok((Outcome::SaleRevoked, _)) => {
                sales.revoked_sales += 1;
                sales.revoked += 1;
            }
            Ok((Outcome::SoldOut { revoked }, _)) => {
                sales.revoked += u64::from(revoked);
                return sales;
            }
            Err(_) => {
                sales.unknown += 1;
                failures_in_a_row += 1;
                if failures_in_a_row >= 20 {
                    return sales;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// The outcome of a sale, as printed.
#[derive(Debug)]
pub struct TicketsReport {
    tickets: u64,
    retailers: usize,
    threshold: u64,
    sold: u64,
    sold_on_preliminary: u64,
    oversold: u64,
    duplicates: u64,
    revoked: u64,
    revoked_sales: u64,
    unknown: u64,
    left: u64,
    preliminary_p50_us: Option<u64>,
    final_p50_us: Option<u64>,
    leader_killed: bool,
    seconds: f64,
}

impl TicketsReport {
    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "tickets": self.tickets,
            "retailers": self.retailers,
            "threshold": self.threshold,
            "sold": self.sold,
            "sold_on_preliminary": self.sold_on_preliminary,
            "sold_on_final": self.sold - self.sold_on_preliminary,
            "oversold": self.oversold,
            "duplicates": self.duplicates,
            "revoked": self.revoked,
            "revoked_sales": self.revoked_sales,
            "unknown": self.unknown,
            "left": self.left,
            "preliminary_p50_us": self.preliminary_p50_us,
            "final_p50_us": self.final_p50_us,
            "leader_killed": self.leader_killed,
            "seconds": self.seconds,
        })
    }

    fn print(&self) {
        println!(
            "{} tickets, {} retailers, threshold {}{}",
            self.tickets,
            self.retailers,
            self.threshold,
            if self.leader_killed { ", leader killed during the sale" } else { "" }
        );
        println!(
            "sold {} ({} on the preliminary view, p50 {} µs; {} on the final view, p50 {} µs)",
            self.sold,
            self.sold_on_preliminary,
            self.preliminary_p50_us.map_or("-".into(), |v| v.to_string()),
            self.sold - self.sold_on_preliminary,
            self.final_p50_us.map_or("-".into(), |v| v.to_string()),
        );
        println!(
            "oversold {} (sold twice {}), revoked {} (sales taken back {}), unknown {}, left {}, {:.1} s",
            self.oversold,
            self.duplicates,
            self.revoked,
            self.revoked_sales,
            self.unknown,
            self.left,
            self.seconds
        );
    }
}

pub(crate) fn median(mut values: Vec<u64>) -> Option<u64> {
    values.sort_unstable();
    values.get(values.len() / 2).copied()
}

async fn tickets(args: &TicketsArgs) -> anyhow::Result<TicketsReport> {
    anyhow::ensure!(args.retailers >= 1, "at least one retailer");
    let mut local = None;
    let dir = args.dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("keel-tickets-{}", std::process::id()))
    });
    let addrs = if args.connect.is_empty() {
        let exe = std::env::current_exe().context("locating the keel binary")?;
        let cluster =
            LocalCluster::start(&exe, 3, &dir, None, |_| {}).context("starting the cluster")?;
        let addrs = cluster.client_addrs();
        local = Some(cluster);
        addrs
    } else {
        anyhow::ensure!(!args.kill_leader, "--kill-leader needs the local cluster");
        args.connect.clone()
    };
    let outcome = sell(args, addrs, local.as_mut()).await;
    if let Some(mut cluster) = local {
        cluster.stop();
        if args.dir.is_none() {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    outcome
}

async fn sell(
    args: &TicketsArgs,
    addrs: Vec<SocketAddr>,
    cluster: Option<&mut LocalCluster>,
) -> anyhow::Result<TicketsReport> {
    if let Some(cluster) = cluster.as_deref() {
        crate::demo::wait_leader(cluster).await.context("no leader elected")?;
    }
    let client = Client::new(ClientConfig::new(addrs));
    let queue = format!("tickets:{:x}", keel_client::fresh_id()).into_bytes();
    let mut organizer = client.session();
    for i in 1..=args.tickets {
        let ticket = format!("ticket-{i}");
        organizer
            .enqueue(&queue, ticket.as_bytes(), Some(args.durability))
            .await
            .with_context(|| format!("enqueueing {ticket}"))?;
    }
    let started = Instant::now();
    let sold_count = Arc::new(AtomicU64::new(0));
    let retailers: Vec<_> = (0..args.retailers)
        .map(|_| {
            let (client, queue, sold) = (client.clone(), queue.clone(), sold_count.clone());
            tokio::spawn(retailer(client, queue, args.threshold, args.durability, sold))
        })
        .collect();
    let mut leader_killed = false;
    if let Some(cluster) = cluster.filter(|_| args.kill_leader) {
        while sold_count.load(Ordering::Relaxed) < args.tickets / 3 {
            if retailers.iter().all(|r| r.is_finished()) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        if let Some(leader) = cluster.wait_for_leader(Duration::from_millis(500)) {
            cluster.kill(leader);
            leader_killed = true;
            tokio::time::sleep(DOWN_FOR).await;
            cluster.restart(leader).context("restarting the killed leader")?;
        }
    }
    let mut all = Sales::default();
    for retailer in retailers {
        let sales = retailer.await.context("a retailer panicked")?;
        all.sold.extend(sales.sold);
        all.revoked_sales += sales.revoked_sales;
        all.revoked += sales.revoked;
        all.unknown += sales.unknown;
    }
    let seconds = started.elapsed().as_secs_f64();
    // What is left: read through the log (`linearizable`), once every retailer stopped.
    let (frame, _) = client
        .call(&[b"KEEL.QPEEK", &queue, b"LEVEL", b"linearizable"])
        .await
        .context("reading what is left")?;
    let left = match frame {
        keel_wire::resp::Frame::Array(items) if items.len() == 4 => match items[2] {
            keel_wire::resp::Frame::Integer(n) => u64::try_from(n).unwrap_or(0),
            _ => anyhow::bail!("an unexpected KEEL.QPEEK reply"),
        },
        other => anyhow::bail!("an unexpected KEEL.QPEEK reply {other:?}"),
    };
    let distinct: BTreeSet<&Vec<u8>> = all.sold.iter().map(|(t, _, _)| t).collect();
    let duplicates = (all.sold.len() - distinct.len()) as u64;
    // Tickets handed out beyond the stock: sold twice, or more sales than tickets.
    let oversold = duplicates.max((all.sold.len() as u64).saturating_sub(args.tickets));
    let latencies = |speculated: bool| {
        median(all.sold.iter().filter(|s| s.1 == speculated).map(|s| s.2).collect())
    };
    Ok(TicketsReport {
        tickets: args.tickets,
        retailers: args.retailers,
        threshold: args.threshold,
        sold: all.sold.len() as u64,
        sold_on_preliminary: all.sold.iter().filter(|s| s.1).count() as u64,
        oversold,
        duplicates,
        revoked: all.revoked,
        revoked_sales: all.revoked_sales,
        unknown: all.unknown,
        left,
        preliminary_p50_us: latencies(true),
        final_p50_us: latencies(false),
        leader_killed,
        seconds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(remaining: u64) -> Option<QueueItem> {
        Some(QueueItem { seq: 1, value: b"t".to_vec(), remaining })
    }

    #[test]
    fn a_sale_on_a_preliminary_view_is_never_shown_sold_out() {
        // Listing 5's bug: a buyer sold a ticket on the preliminary view was then shown
        // "Sold out" although the final view confirmed it. A speculative sale ends sold,
        // or, if the final view does not back it, taken back.
        for final_view in [item(3), None] {
            let outcome = settle(true, true, final_view);
            assert!(!matches!(outcome, Outcome::SoldOut { .. }), "{outcome:?}");
        }
        assert_eq!(
            settle(true, true, item(3)),
            Outcome::Sold { ticket: b"t".to_vec(), speculated: true }
        );
        assert_eq!(settle(true, true, None), Outcome::SaleRevoked);
        // Waiting for the final view: sold, or sold out (revoked if a view had shown one).
        assert_eq!(
            settle(false, true, item(0)),
            Outcome::Sold { ticket: b"t".to_vec(), speculated: false }
        );
        assert_eq!(settle(false, true, None), Outcome::SoldOut { revoked: true });
        assert_eq!(settle(false, false, None), Outcome::SoldOut { revoked: false });
    }

    #[test]
    fn only_a_view_with_more_than_the_threshold_left_is_sold_on() {
        assert!(sell_on_preliminary(&item(20), 20), "21 left with this one");
        assert!(!sell_on_preliminary(&item(19), 20));
        assert!(!sell_on_preliminary(&None, 20));
        assert!(sell_on_preliminary(&item(0), 0));
    }
}
