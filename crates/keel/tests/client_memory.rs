//! The client-side attacks on memory, reproduced against real `keel server` processes:
//! connections that pipeline reads of a 1 MiB value and never read the replies,
//! connections that each send most of a large request and stall, and more stalled
//! connections than `connections_max`. The leader's resident memory is sampled
//! throughout: it stays within a bound of its start, every such connection is closed by
//! the server within its timeout, new clients are served afterwards, and the memory goes
//! back once the clients have left.
//!
//! The figures are printed (`cargo test --release -p keel --test client_memory --
//! --nocapture`) and recorded in `docs/performance.md`.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

use common::{rss, Peak};

fn bulk(bytes: &[u8]) -> Vec<u8> {
    let mut out = format!("${}\r\n", bytes.len()).into_bytes();
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
    out
}

fn command(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend(bulk(arg));
    }
    out
}

fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).unwrap();
    stream.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    stream
}

/// Stores a 1 MiB value under `big` through `addr`, the value every flood reads.
fn store_big(addr: SocketAddr) -> Vec<u8> {
    let value = vec![b'v'; MIB as usize];
    let mut writer = connect(addr);
    writer.write_all(&command(&[b"SET", b"big", &value])).unwrap();
    let mut ok = [0u8; 5];
    writer.read_exact(&mut ok).unwrap();
    assert_eq!(&ok, b"+OK\r\n");
    value
}

/// Client connections node `i` has open (its `/metrics`).
fn open_connections(cluster: &keel_server::local::LocalCluster, i: usize) -> f64 {
    let page = common::scrape(cluster.configs[i].http_addr.unwrap());
    common::sample(&page, "keel_connections_active").unwrap_or(f64::MAX)
}

/// Opens 300 connections to node `i` that each send `requests` and read nothing, and
/// waits until the node has closed them all: the node's peak resident growth meanwhile,
/// and how long the closing took.
fn flood_unread(
    cluster: &keel_server::local::LocalCluster,
    i: usize,
    requests: &[u8],
) -> (u64, Duration) {
    let pid = cluster.pid(i).expect("the node runs");
    let base = rss(pid);
    let peak = Peak::start(pid);
    let _readers: Vec<TcpStream> = (0..300)
        .map(|_| {
            let mut stream = connect(cluster.client_addrs()[i]);
            stream.write_all(requests).unwrap();
            stream
        })
        .collect();
    let started = Instant::now();
    assert!(
        common::wait_until(Duration::from_secs(30), || open_connections(cluster, i) == 0.0),
        "non-reading clients of n{} are disconnected",
        i + 1
    );
    (peak.highest().saturating_sub(base), started.elapsed())
}

#[test]
fn unread_replies_partial_requests_and_stalled_connections_stay_within_bounds() {
    let budget = 64 * MIB;
    let (cluster, leader) = common::cluster("client-memory", |c| {
        c.client_output_timeout_ms = 2_000;
        c.partial_request_timeout_ms = 2_000;
        // Connections whose replies all fit in the socket buffers (a full engine queue
        // answers -BUSY at once) are not stalled but idle: this closes those.
        c.client_idle_timeout_ms = 3_000;
        c.client_request_buffers_bytes_max = budget;
        // Values of at most 1 MiB, so that the budget holds a few largest requests.
        c.engine.value_bytes_max = Some(MIB as u32);
        // Each request waiting in a pipeline costs about half a KiB (its decoded frame,
        // the engine request, the reply channel): 128 deep keeps that part of the bound
        // at 300 x 128 x 0.5 KiB, so that what the test measures is the replies' values.
        c.pipeline_depth_max = 128;
        c.forwarded_replies_bytes_max = budget;
        // Every read at a follower goes to the leader (phase 1b).
        c.engine.follower_reads = Some(false);
    });
    let addr = cluster.client_addrs()[leader];
    let pid = cluster.pid(leader).expect("the leader runs");
    let value = store_big(addr);
    // The start: once the resident set stops moving between two samples 20 ms apart.
    let mut last = rss(pid);
    common::wait_until(Duration::from_secs(10), || {
        let now = rss(pid);
        std::mem::replace(&mut last, now) == now
    });
    let base = rss(pid);
    let mb = |bytes: u64| bytes as f64 / MIB as f64;

    let epoch = |i: usize| {
        common::sample(
            &common::scrape(cluster.configs[i].http_addr.unwrap()),
            "keel_epoch{keyspace=\"0\"}",
        )
    };
    let epoch_first = epoch(leader);

    // 1. 300 connections each pipeline 1,024 GETs of the 1 MiB value and read nothing.
    let get = command(&[b"GET", b"big"]).repeat(1024);
    let (unread, started) = flood_unread(&cluster, leader, &get);
    // Client work must not hold back the leader's heartbeats past an election timeout.
    if epoch(leader) != epoch_first {
        common::dump_logs(&cluster);
        panic!(
            "the flood of unread replies moved leadership: epoch {epoch_first:?} -> {:?}",
            epoch(leader)
        );
    }
    eprintln!(
        "unread replies: 300 connections x 1024 GETs of 1 MiB: peak +{:.0} MiB, all closed after {:?}",
        mb(unread),
        started
    );

    // 1b. The same against a follower: each read is forwarded to the leader, whose reply
    // carries a copy of the value over the peer link; the leader queues at most
    // LINK_BULK_BYTES_MAX of them per link (a short BUSY goes instead), the
    // follower holds at most forwarded_replies_bytes_max of them for its clients.
    let follower = (leader + 1) % cluster.configs.len();
    let (forwarded, started) = flood_unread(&cluster, follower, &get);
    let shed = common::sample(
        &common::scrape(cluster.configs[leader].http_addr.unwrap()),
        "keel_peer_bulk_shed_total",
    )
    .unwrap_or(0.0);
    let refused = common::sample(
        &common::scrape(cluster.configs[follower].http_addr.unwrap()),
        "keel_forwarded_replies_refused_total",
    )
    .unwrap_or(0.0);
    eprintln!(
        "forwarded reads: 300 connections x 1024 GETs of 1 MiB at a follower: peak +{:.0} MiB, {shed} replies shed by the leader's link, {refused} refused by the follower's budget, all closed after {:?}; leader's epoch {:?} -> {:?}",
        mb(forwarded),
        started,
        epoch_first,
        epoch(leader),
    );
    assert!(shed + refused > 0.0, "the bounds on forwarded replies were reached");

    // 2. 200 connections each send all but the last byte of a 1 MiB SET and stall.
    let peak = Peak::start(pid);
    let set = command(&[b"SET", b"partial", &value]);
    let partial = &set[..set.len() - 3];
    let stalled: Vec<TcpStream> = (0..200)
        .filter_map(|_| {
            let mut stream = connect(addr);
            stream.write_all(partial).ok().map(|()| stream)
        })
        .collect();
    let started = Instant::now();
    assert!(
        common::wait_until(Duration::from_secs(30), || open_connections(&cluster, leader) == 0.0),
        "stalled requests are cut off"
    );
    let page = common::scrape(cluster.configs[leader].http_addr.unwrap());
    let refused = common::sample(&page, "keel_request_budget_refused_total").unwrap_or(0.0);
    let partials = peak.highest() - base;
    eprintln!(
        "partial requests: 200 connections x 1 MiB: peak +{:.0} MiB (budget {} MiB), {} refused by the budget, all closed after {:?}",
        mb(partials),
        budget / MIB,
        refused,
        started.elapsed()
    );
    assert!(refused >= 100.0, "the budget refused most: {refused}");
    drop(stalled);
    drop(peak);

    // 3. 1,030 connections (connections_max is 1,024) that never finish a request.
    let stuck: Vec<TcpStream> = (0..1030)
        .map(|_| {
            let mut stream = connect(addr);
            let _ = stream.write_all(b"*2\r\n$3\r\nGET");
            stream
        })
        .collect();
    let started = Instant::now();
    assert!(
        common::wait_until(Duration::from_secs(30), || open_connections(&cluster, leader) == 0.0),
        "stalled connections are closed"
    );
    assert!(common::serves(addr), "a new client is served");
    eprintln!("stalled connections: 1030 closed after {:?}", started.elapsed());
    drop(stuck);

    // The memory goes back once the clients have left.
    let left = Instant::now();
    let back = common::wait_until(Duration::from_secs(60), || rss(pid) < base + 32 * MIB);
    eprintln!(
        "after the clients left: {:.0} MiB after {:?} (start {:.0} MiB)",
        mb(rss(pid)),
        left.elapsed(),
        mb(base)
    );
    // Bounds: what the limits allow plus the connections' fixed buffers and the
    // allocator's not yet purged pages, far below the unbounded cost (a 1 MiB copy per
    // connection and reply; 200 x 1 MiB buffers).
    // (+99 MiB seen under the full suite in parallel; +447 MiB when replies are copied.)
    assert!(unread < 160 * MIB, "unread replies grew the node by {:.0} MiB", mb(unread));
    // (Before these bounds, the same attack on a `keel up` follower: +786 and +1450 MiB
    // in two runs, each with a new leader elected.)
    assert!(
        forwarded < budget + 128 * MIB,
        "forwarded replies grew the follower by {:.0} MiB",
        mb(forwarded)
    );
    assert!(partials < budget + 96 * MIB, "partial requests grew it by {:.0} MiB", mb(partials));
    assert!(back, "resident memory returned within a minute");
    assert!(common::serves(addr), "still serving");
    common::finish(cluster);
}

/// The same flood of unread replies with the default settings (`pipeline_depth_max`
/// 1,024, `pipelined_requests_bytes_max` 32 MiB) on a machine kept busy by two spinning
/// threads: the leader keeps its role and its memory stays within the documented bound
/// (`docs/security.md`). `KEEL_UNREAD_RUNS` repeats it (10 for the figure) and
/// `KEEL_BUSY_LOOPS` sets how many threads spin (2).
///
/// Run by hand (`-- --ignored --nocapture`): its spinning threads would load the rest of
/// a test run. CI runs the same flood on an unloaded machine above. `KEEL_SEND_BUFFER=0`
/// (the kernel's own sizing of send buffers) is the control: the leader spends several
/// times the processor time copying replies nobody reads (`docs/security.md`).
#[test]
#[ignore = "a measurement by hand: two threads spin for the whole run"]
fn unread_replies_on_a_busy_machine_keep_the_leader_and_the_bound() {
    let runs: usize =
        std::env::var("KEEL_UNREAD_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let loops: usize =
        std::env::var("KEEL_BUSY_LOOPS").ok().and_then(|v| v.parse().ok()).unwrap_or(2);
    let budget = std::env::var("KEEL_PIPELINE_BYTES").ok().and_then(|v| v.parse().ok());
    let (cluster, leader) = common::cluster("client-memory-busy", |c| {
        c.client_output_timeout_ms = 2_000;
        c.client_idle_timeout_ms = 3_000;
        // By hand, the control: a budget too large to matter.
        c.pipelined_requests_bytes_max = budget.unwrap_or(c.pipelined_requests_bytes_max);
        let send = std::env::var("KEEL_SEND_BUFFER").ok().and_then(|v| v.parse().ok());
        c.client_send_buffer_bytes = send.unwrap_or(c.client_send_buffer_bytes);
    });
    let addr = cluster.client_addrs()[leader];
    store_big(addr);
    let epoch = || {
        common::sample(
            &common::scrape(cluster.configs[leader].http_addr.unwrap()),
            "keel_epoch{keyspace=\"0\"}",
        )
    };
    let first = epoch();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let spinners: Vec<_> = (0..loops)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut x: u64 = 1;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    std::hint::black_box(x);
                }
            })
        })
        .collect();
    let get = command(&[b"GET", b"big"]).repeat(1024);
    let mut peaks = Vec::new();
    // Growth over the resident set before the first run (a later run's own start may
    // still hold pages the allocator kept from the one before).
    let pid = cluster.pid(leader).expect("the leader runs");
    let start = rss(pid);
    // The leader's processor time (user and system, in clock ticks) from /proc.
    let cpu = || {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let after = stat.rsplit(')').next().unwrap_or_default();
        let fields: Vec<u64> = after.split_whitespace().filter_map(|f| f.parse().ok()).collect();
        fields.get(10).copied().unwrap_or(0) + fields.get(11).copied().unwrap_or(0)
    };
    for run in 0..runs {
        let (before, ticks) = (rss(pid), cpu());
        let (grew, closed) = flood_unread(&cluster, leader, &get);
        let grew = (before + grew).saturating_sub(start);
        let now = epoch();
        eprintln!(
            "busy machine ({loops} spinning), run {}: 300 x 1024 unread GETs of 1 MiB: peak +{:.0} MiB, leader's processor time {} ticks, closed after {closed:?}, epoch {first:?} -> {now:?}",
            run + 1,
            grew as f64 / MIB as f64,
            cpu() - ticks
        );
        peaks.push(grew);
        if now != first {
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            common::dump_logs(&cluster);
            panic!("run {}: the flood moved leadership: epoch {first:?} -> {now:?}", run + 1);
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for spinner in spinners {
        spinner.join().unwrap();
    }
    let highest = peaks.iter().copied().max().unwrap_or(0);
    // The bound in docs/security.md: the pipeline budget (32 MiB) and each connection's
    // buffers; the values themselves are shared with the store, never copied.
    assert!(highest < 64 * MIB, "peak +{:.0} MiB", highest as f64 / MIB as f64);
    common::finish(cluster);
}
