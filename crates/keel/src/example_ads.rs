//! `keel example ads`: the Correctables paper's ad serving (§4.2, §6.3.1) on Keel.
//!
//! `--profiles` profiles each reference `--refs` of `--ads` ads (`profile:<i>` holds the
//! ad ids, comma-separated; `ad:<j>` the ad). Serving a profile's ads:
//! - **speculative**: the references are read as a Correctable (`KEEL.INVOKE GET ...
//!   LEVELS any linearizable`) and `speculate` fetches the ads (`MGET ... LEVEL l`,
//!   `--ads-level`, `linearizable` by default) as soon as the preliminary view comes, in
//!   parallel with the strong read of the references; when the final view confirms
//!   it, the ads fetched on it are served, otherwise that fetch is aborted and the ads of
//!   the final view are fetched;
//! - **strong-only** (the baseline): the references at `linearizable`, then the ads.
//!
//! A writer changes one profile's references every `--update-every-ms`, so some
//! speculations are wrong. On the local cluster the example starts, the client talks to a
//! follower and every peer message waits `--delay-ms` (the client is far from the leader:
//! a strong read costs a wide-area round trip, a preliminary view none). The two modes run
//! alternately, request by request; both serve the ads of the final references.

use crate::example::median;
use anyhow::Context;
use keel_client::{Client, ClientConfig, ClientError, View};
use keel_server::local::LocalCluster;
use keel_types::ReadLevel;
use keel_wire::resp::Frame;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Flags of `keel example ads`.
#[derive(Debug, Clone, clap::Args)]
pub struct AdsArgs {
    /// Profiles.
    #[arg(long, default_value_t = 100)]
    pub profiles: u64,
    /// Ads.
    #[arg(long, default_value_t = 1000)]
    pub ads: u64,
    /// Ads each profile references.
    #[arg(long, default_value_t = 5)]
    pub refs: u64,
    /// Requests served in each mode.
    #[arg(long, default_value_t = 200)]
    pub requests: u64,
    /// Level the ads are fetched at (the strong-only system reads everything
    /// `linearizable`; ads may be withdrawn).
    #[arg(long, default_value = "linearizable")]
    pub ads_level: ReadLevel,
    /// One-way delay of every peer message on the local cluster, in ms.
    #[arg(long, default_value_t = 20)]
    pub delay_ms: u64,
    /// A writer changes one profile's references this often, in ms (0: never).
    #[arg(long, default_value_t = 20)]
    pub update_every_ms: u64,
    /// Client addresses of a running cluster (comma-separated; the first is contacted)
    /// instead of a local one; no delay is emulated then.
    #[arg(long, value_delimiter = ',')]
    pub connect: Vec<SocketAddr>,
    /// Print one JSON object at the end instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Where to put the local cluster (default: a fresh temporary directory, removed).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// Runs `keel example ads`.
pub fn run(runtime: &tokio::runtime::Runtime, args: &AdsArgs) -> ExitCode {
    match runtime.block_on(ads(args)) {
        Ok(report) => {
            if args.json {
                println!("{}", serde_json::to_string(&report).expect("json"));
            } else {
                println!(
                    "{} requests per mode, client {} ms from the leader (one way): speculative p50 {:.1} ms, strong-only p50 {:.1} ms; {} of {} speculations aborted; {:.0} vs {:.0} requests/s",
                    report["requests"], report["delay_ms"],
                    report["speculative_p50_ms"].as_f64().unwrap_or(f64::NAN),
                    report["strong_p50_ms"].as_f64().unwrap_or(f64::NAN),
                    report["aborted"], report["requests"],
                    report["speculative_per_s"].as_f64().unwrap_or(f64::NAN),
                    report["strong_per_s"].as_f64().unwrap_or(f64::NAN),
                );
            }
            if report["mismatched"] == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("keel example ads: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn ads(args: &AdsArgs) -> anyhow::Result<serde_json::Value> {
    anyhow::ensure!(args.profiles >= 1 && args.ads >= 1 && args.refs >= 1 && args.requests >= 1);
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("keel-ads-{}", std::process::id())));
    let mut local = None;
    let (addr, delay_ms) = if args.connect.is_empty() {
        let exe = std::env::current_exe().context("locating the keel binary")?;
        let delay = args.delay_ms;
        let cluster = LocalCluster::start(&exe, 3, &dir, None, |c| {
            for other in (1..=3).filter(|id| *id != c.node_id) {
                c.geo.peer_delay_ms.insert(other.to_string(), delay);
            }
        })
        .context("starting the cluster")?;
        let leader = crate::demo::wait_leader(&cluster).await.context("no leader elected")?;
        // A follower: its `any` reads are local, its strong ones cross to the leader.
        let addr = cluster.client_addrs()[(leader + 1) % 3];
        local = Some(cluster);
        (addr, delay)
    } else {
        (args.connect[0], 0)
    };
    let outcome = serve(args, addr, delay_ms).await;
    if let Some(mut cluster) = local {
        cluster.stop();
        if args.dir.is_none() {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    outcome
}

/// The references of profile `p` in generation `g`.
fn refs(p: u64, g: u64, args: &AdsArgs) -> String {
    let pick = |k: u64| {
        let mut z = (p << 32 ^ g << 8 ^ k).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        z ^= z >> 29;
        format!("a{}", z % args.ads)
    };
    (0..args.refs).map(pick).collect::<Vec<_>>().join(",")
}

/// The ads a reference list names, fetched in one `MGET` at `level`.
async fn fetch(
    client: &Client,
    refs: &Option<Vec<u8>>,
    level: ReadLevel,
) -> Result<Ads, ClientError> {
    let Some(refs) = refs else { return Ok(Vec::new()) };
    let keys: Vec<Vec<u8>> =
        refs.split(|b| *b == b',').map(|id| [b"ad:".as_slice(), id].concat()).collect();
    let mut words: Vec<&[u8]> = vec![b"MGET"];
    words.extend(keys.iter().map(Vec::as_slice));
    words.extend([b"LEVEL".as_slice(), level.as_str().as_bytes()]);
    match client.call(&words).await?.0 {
        Frame::Array(items) => Ok(items
            .into_iter()
            .map(|item| match item {
                Frame::Bulk(bytes) => Some(bytes.to_vec()),
                _ => None,
            })
            .collect()),
        other => Err(ClientError::Unexpected(format!("{other:?}"))),
    }
}

/// The ads of one reference list, in its order (`None`: no such ad).
type Ads = Vec<Option<Vec<u8>>>;

/// A fetch started on one view: its result once there, and how to abort it.
#[derive(Clone)]
struct Fetch {
    refs: Option<Vec<u8>>,
    done: watch::Receiver<Option<Result<Ads, ClientError>>>,
    abort: tokio::task::AbortHandle,
}

fn start_fetch(client: &Arc<Client>, refs: &Option<Vec<u8>>, level: ReadLevel) -> Fetch {
    let (tx, done) = watch::channel(None);
    let (client, owned) = (client.clone(), refs.clone());
    let task = tokio::spawn(async move {
        let _ = tx.send(Some(fetch(&client, &owned, level).await));
    });
    Fetch { refs: refs.clone(), done, abort: task.abort_handle() }
}

async fn finished(mut fetch: Fetch) -> Result<Ads, ClientError> {
    let done = fetch.done.wait_for(Option::is_some).await;
    match done {
        Ok(result) => result.clone().expect("waited for it"),
        Err(_) => Err(ClientError::Unexpected("the fetch was aborted".into())),
    }
}

/// Serves one request speculatively: the ads, the references they are for, whether the
/// speculation was aborted.
async fn speculative(
    client: &Arc<Client>,
    key: &[u8],
    level: ReadLevel,
    aborted: &Arc<AtomicU64>,
) -> Result<(Ads, Option<Vec<u8>>), ClientError> {
    let references = client.invoke(key, &[ReadLevel::Any, ReadLevel::Linearizable]);
    let on_abort = aborted.clone();
    let spawner = client.clone();
    let served = references.speculate(
        move |refs: &Option<Vec<u8>>| start_fetch(&spawner, refs, level),
        move |fetch: &Fetch| {
            fetch.abort.abort();
            on_abort.fetch_add(1, Ordering::Relaxed);
        },
    );
    let View { value: fetch, .. } = served.final_view().await?;
    let refs = fetch.refs.clone();
    Ok((finished(fetch).await?, refs))
}

/// Serves one request with the strong-only baseline.
async fn strong_only(
    client: &Arc<Client>,
    key: &[u8],
    level: ReadLevel,
) -> Result<(Ads, Option<Vec<u8>>), ClientError> {
    let words: [&[u8]; 4] = [b"GET", key, b"LEVEL", b"linearizable"];
    let refs = match client.call(&words).await?.0 {
        Frame::Bulk(bytes) => Some(bytes.to_vec()),
        Frame::Null => None,
        other => return Err(ClientError::Unexpected(format!("{other:?}"))),
    };
    Ok((fetch(client, &refs, level).await?, refs))
}

async fn serve(
    args: &AdsArgs,
    addr: SocketAddr,
    delay_ms: u64,
) -> anyhow::Result<serde_json::Value> {
    let mut config = ClientConfig::new(vec![addr]);
    config.attempt_timeout = Duration::from_secs(10);
    let client = Client::new(config);
    // Loaded by 32 sessions at once (each write crosses to the leader and back).
    let mut items: Vec<(String, String)> =
        (0..args.ads).map(|j| (format!("ad:{j}"), format!("ad {j}: {}", "x".repeat(64)))).collect();
    items.extend((0..args.profiles).map(|p| (format!("profile:{p}"), refs(p, 0, args))));
    let loaders: Vec<_> = (0..32)
        .map(|first| {
            let client = client.clone();
            let mine: Vec<(String, String)> =
                items.iter().skip(first).step_by(32).cloned().collect();
            tokio::spawn(async move {
                let mut session = client.session();
                for (key, value) in mine {
                    session.put(key.as_bytes(), value.as_bytes(), None).await?;
                }
                Ok::<(), ClientError>(())
            })
        })
        .collect();
    for loader in loaders {
        loader.await.context("a loader panicked")?.context("loading profiles and ads")?;
    }
    // Loaded at the contacted node too (its `any` views), before the clock starts.
    let last = format!("profile:{}", args.profiles - 1);
    let _ = client.call(&[b"GET", last.as_bytes(), b"LEVEL", b"monotonic"]).await;
    let stop = Arc::new(AtomicBool::new(false));
    let writer = (args.update_every_ms > 0).then(|| {
        let (client, stop, args) = (client.clone(), stop.clone(), args.clone());
        tokio::spawn(async move {
            let mut session = client.session();
            let mut generation = 0;
            while !stop.load(Ordering::Relaxed) {
                generation += 1;
                let p = generation % args.profiles;
                let key = format!("profile:{p}");
                let _ =
                    session.put(key.as_bytes(), refs(p, generation, &args).as_bytes(), None).await;
                tokio::time::sleep(Duration::from_millis(args.update_every_ms)).await;
            }
        })
    });
    let aborted = Arc::new(AtomicU64::new(0));
    let (mut fast, mut slow) = (Vec::new(), Vec::new());
    let (mut fast_time, mut slow_time) = (Duration::ZERO, Duration::ZERO);
    let mut mismatched = 0u64;
    for i in 0..args.requests {
        let key = format!("profile:{}", (i * 7919) % args.profiles).into_bytes();
        let started = Instant::now();
        let (served, refs) = speculative(&client, &key, args.ads_level, &aborted)
            .await
            .context("a speculative request")?;
        let took = started.elapsed();
        fast.push(took.as_micros() as u64);
        fast_time += took;
        // What it served must be the ads of the references it ended with (ads never
        // change: read at `any`).
        if served != fetch(&client, &refs, ReadLevel::Any).await.context("checking")? {
            mismatched += 1;
        }
        let started = Instant::now();
        strong_only(&client, &key, args.ads_level).await.context("a strong-only request")?;
        let took = started.elapsed();
        slow.push(took.as_micros() as u64);
        slow_time += took;
    }
    stop.store(true, Ordering::Relaxed);
    if let Some(writer) = writer {
        let _ = writer.await;
    }
    let ms = |v: Option<u64>| v.map(|us| us as f64 / 1000.0);
    let per_s = |t: Duration| args.requests as f64 / t.as_secs_f64();
    Ok(serde_json::json!({
        "requests": args.requests,
        "delay_ms": delay_ms,
        "profiles": args.profiles,
        "ads": args.ads,
        "refs": args.refs,
        "ads_level": args.ads_level.as_str(),
        "speculative_p50_ms": ms(median(fast)),
        "strong_p50_ms": ms(median(slow)),
        "speculative_per_s": per_s(fast_time),
        "strong_per_s": per_s(slow_time),
        "aborted": aborted.load(Ordering::Relaxed),
        "mismatched": mismatched,
    }))
}
