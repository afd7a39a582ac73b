//! Shared by the black-box tests: a local cluster of real `keel server` processes in a
//! fresh directory, and bounded waits.

#![allow(dead_code)] // each test file uses a different part

use keel_server::local::LocalCluster;
use keel_server::ServerConfig;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Generous: the machine may be loaded (2 cores, parallel builds).
pub const LEADER_WAIT: Duration = Duration::from_secs(60);
/// How long to wait for nodes to converge after faults.
pub const CONVERGE_WAIT: Duration = Duration::from_secs(60);

/// A fresh directory for one test's cluster.
pub fn test_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "keel-test-{name}-{}-{}",
        std::process::id(),
        keel_client::fresh_id() % 1_000_000
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Starts a 3-node cluster of the built binary in a fresh directory, without waiting.
pub fn start(name: &str, tweak: impl Fn(&mut ServerConfig)) -> LocalCluster {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_keel"));
    LocalCluster::start(&exe, 3, &test_dir(name), None, tweak).expect("the cluster starts")
}

/// Starts a cluster of `nodes` nodes of the built binary in a fresh directory, without
/// waiting.
pub fn start_n(name: &str, nodes: u32, tweak: impl Fn(&mut ServerConfig)) -> LocalCluster {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_keel"));
    LocalCluster::start(&exe, nodes, &test_dir(name), None, tweak).expect("the cluster starts")
}

/// Starts a 3-node cluster of the built binary, waits for a leader; returns it and the
/// leader's index.
pub fn cluster(name: &str, tweak: impl Fn(&mut ServerConfig)) -> (LocalCluster, usize) {
    let cluster = start(name, tweak);
    let Some(leader) = cluster.wait_for_leader(LEADER_WAIT) else {
        dump_logs(&cluster);
        panic!("no leader within {LEADER_WAIT:?}");
    };
    (cluster, leader)
}

/// Prints the tail of every node's log (for a failing test).
pub fn dump_logs(cluster: &LocalCluster) {
    for i in 0..cluster.configs.len() {
        let text = std::fs::read_to_string(cluster.log_path(i)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        eprintln!("--- n{} log (last 30 lines) ---", i + 1);
        for line in &lines[lines.len().saturating_sub(30)..] {
            eprintln!("{line}");
        }
    }
}

/// Polls `condition` every 20 ms until it holds or `timeout` passes.
pub fn wait_until(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if condition() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    condition()
}

/// Stops the cluster and removes its directory (kept when the test failed before this).
pub fn finish(mut cluster: LocalCluster) {
    cluster.stop();
    let dir = cluster.dir().to_path_buf();
    drop(cluster);
    let _ = std::fs::remove_dir_all(dir);
}

/// Whether python3 with redis-py is installed; its absence skips the caller (`false`),
/// unless `KEEL_REQUIRE_REDIS_PY=1`, which makes it a failure (CI sets it).
pub fn redis_py() -> bool {
    let has = std::process::Command::new("python3")
        .args(["-c", "import redis"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has {
        let required = std::env::var("KEEL_REQUIRE_REDIS_PY").is_ok_and(|v| v == "1");
        assert!(!required, "python3 with redis-py is missing and KEEL_REQUIRE_REDIS_PY=1");
        eprintln!("skipping redis-py: python3 -c 'import redis' fails (pip install redis)");
    }
    has
}

/// The redis tool `name` if installed; `None` (skip) otherwise, unless
/// `KEEL_REQUIRE_REDIS_TOOLS=1`, which makes its absence a failure (CI sets it after
/// installing `redis-tools`).
pub fn tool(name: &'static str) -> Option<&'static str> {
    let found = std::process::Command::new(name)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if found {
        return Some(name);
    }
    let required = std::env::var("KEEL_REQUIRE_REDIS_TOOLS").is_ok_and(|v| v == "1");
    assert!(
        !required,
        "{name} is not installed and KEEL_REQUIRE_REDIS_TOOLS=1 (apt-get install redis-tools)"
    );
    eprintln!("skipping: {name} is not installed");
    None
}

/// Runs `program` with `args`; its standard output (it must succeed).
pub fn run(program: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(program).args(args).output().expect("the tool runs");
    assert!(out.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The `/metrics` page of the node whose HTTP endpoint is `addr`.
pub fn scrape(addr: std::net::SocketAddr) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("the HTTP port accepts");
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    text
}

/// The value of the sample `name` (labels included, as written) on a `/metrics` page.
pub fn sample(page: &str, name: &str) -> Option<f64> {
    page.lines().find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
}

/// Whether a fresh connection to `addr` answers `PING` with `PONG` within 5 s.
pub fn serves(addr: std::net::SocketAddr) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(addr) else { return false };
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut reply = [0u8; 7];
    stream.write_all(b"PING\r\n").is_ok()
        && stream.read_exact(&mut reply).is_ok()
        && &reply == b"+PONG\r\n"
}

/// A raw RESP connection for the black-box tests: bytes in, lines out.
pub struct Conn(pub std::net::TcpStream);

impl Conn {
    /// Connects (5 s) with a 20 s read timeout.
    pub fn open(addr: std::net::SocketAddr) -> Conn {
        let stream = std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(5))
            .expect("connect");
        stream.set_read_timeout(Some(std::time::Duration::from_secs(20))).unwrap();
        Conn(stream)
    }

    /// Writes `bytes`.
    pub fn send(&mut self, bytes: &[u8]) {
        self.0.write_all(bytes).unwrap();
    }

    /// Reads exactly `expected.len()` bytes and compares.
    pub fn expect(&mut self, expected: &[u8]) {
        let mut got = vec![0u8; expected.len()];
        self.0
            .read_exact(&mut got)
            .unwrap_or_else(|e| panic!("reading {:?}: {e}", String::from_utf8_lossy(expected)));
        assert_eq!(String::from_utf8_lossy(&got), String::from_utf8_lossy(expected));
    }

    /// Reads one line (through `\r\n`).
    pub fn line(&mut self) -> String {
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        while !line.ends_with(b"\r\n") {
            self.0.read_exact(&mut byte).expect("a reply line");
            line.push(byte[0]);
        }
        String::from_utf8_lossy(&line).into_owned()
    }

    /// Whether the server closed the connection.
    pub fn closed(&mut self) -> bool {
        let mut byte = [0u8; 1];
        matches!(self.0.read(&mut byte), Ok(0) | Err(_))
    }

    /// Sends one command whose reply is a bulk string, and reads its text (`None` for
    /// null); panics on another reply.
    pub fn bulk(&mut self, words: &[&str]) -> Option<String> {
        match self.call(words).as_str() {
            "$-1" => None,
            header if header.starts_with('$') => {
                Some(self.line().trim_end_matches("\r\n").to_string())
            }
            other => panic!("{words:?}: {other}"),
        }
    }

    /// Sends one command and reads the first line of its reply, without its CRLF.
    pub fn call(&mut self, words: &[&str]) -> String {
        let mut out = format!("*{}\r\n", words.len()).into_bytes();
        for w in words {
            out.extend_from_slice(format!("${}\r\n{w}\r\n", w.len()).as_bytes());
        }
        self.send(&out);
        self.line().trim_end_matches("\r\n").to_string()
    }
}

/// A local address other than loopback, if the machine has one.
pub fn non_loopback_ip() -> Option<std::net::IpAddr> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("10.255.255.255:9").ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// Resident memory of process `pid` in bytes.
pub fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    // Zero once the process is gone (a sampler may outlive it).
    let Some(line) = status.lines().find(|l| l.starts_with("VmRSS:")) else { return 0 };
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// Samples `pid`'s resident memory every 20 ms until dropped; the highest seen.
pub struct Peak {
    highest: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl Peak {
    pub fn start(pid: u32) -> Peak {
        let (highest, stop) =
            (Arc::new(AtomicU64::new(rss(pid))), Arc::new(AtomicBool::new(false)));
        let (h, s) = (highest.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                h.fetch_max(rss(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Peak { highest, stop }
    }

    pub fn highest(&self) -> u64 {
        self.highest.load(Ordering::Relaxed)
    }
}

impl Drop for Peak {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// `keel up --secure` in `dir` on ports from `base`, stopped with Ctrl-C (SIGINT) when
/// dropped, killed if that takes too long.
pub struct Up(pub std::process::Child);

impl Up {
    /// Starts it and waits until it says the cluster is up (it prints `Ctrl-C` last).
    pub fn secure(dir: &std::path::Path, base: u16) -> Up {
        Up::secure_printing(dir, base).0
    }

    /// [`Up::secure`], with what it printed until the cluster was up.
    pub fn secure_printing(dir: &std::path::Path, base: u16) -> (Up, String) {
        use std::io::BufRead;
        let mut up = Up(std::process::Command::new(env!("CARGO_BIN_EXE_keel"))
            .args(["up", "--secure", "--base-port", &base.to_string(), "--dir"])
            .arg(dir)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("keel up starts"));
        let mut lines = std::io::BufReader::new(up.0.stdout.take().unwrap()).lines();
        let mut printed = String::new();
        for line in lines.by_ref() {
            let line = line.unwrap();
            printed.push_str(&line);
            printed.push('\n');
            if line.starts_with("Ctrl-C") {
                break;
            }
        }
        assert!(printed.contains("cluster up, leader"), "{printed}");
        // Read what it prints later, so that it never writes into a closed pipe.
        std::thread::spawn(move || lines.for_each(drop));
        (up, printed)
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        let pid = self.0.id().to_string();
        let _ = std::process::Command::new("kill").args(["-INT", &pid]).status();
        let stopped =
            wait_until(Duration::from_secs(30), || self.0.try_wait().ok().flatten().is_some());
        if !stopped {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// After a recorded workload on `cluster`: drains its queues, reads the survivors from the
/// log of `leader` (an index), checks the history, and requires every promise the levels
/// make (cross-client monotonic reads, over a hundred of them; linearizability of the
/// `durable` keys read `linearizable`; each queue item taken once; some survivors). On a
/// failure the history is kept in the temporary directory and the logs printed.
pub fn check_history(
    cluster: &LocalCluster,
    runtime: &tokio::runtime::Runtime,
    client: &Arc<keel_client::Client>,
    recorder: &keel_client::history::Recorder,
    leader: usize,
    name: &str,
) -> keel_client::workload::Verdicts {
    use keel_client::workload;
    runtime.block_on(workload::drain(client, recorder)).expect("the queues drained");
    let survivors = runtime
        .block_on(keel_client::history::fetch_survivors(client, leader))
        .expect("the final log");
    let ops = recorder.ops();
    let verdicts = workload::check(&ops, &survivors, &recorder.queue_ops());
    if !verdicts.hold() {
        let file = format!("keel-{name}-history-{}.jsonl", std::process::id());
        let path = std::env::temp_dir().join(file);
        recorder.write(&path, &survivors).unwrap();
        dump_logs(cluster);
        eprintln!("history kept at {}", path.display());
    }
    assert_eq!(verdicts.monotonic.violations_total, 0, "{:?}", verdicts.monotonic.violations);
    assert!(verdicts.monotonic.reads > 100, "too few checked reads: {}", verdicts.monotonic.reads);
    assert!(
        matches!(verdicts.linearizable.verdict, keel_check::linearizability::Verdict::Linearizable),
        "durable keys: {:?}",
        verdicts.linearizable.verdict
    );
    assert_eq!(verdicts.queue.violations_total, 0, "{:?}", verdicts.queue.violations);
    assert!(!survivors.is_empty(), "acknowledged writes survived");
    verdicts
}

/// A recorded workload running against `cluster`: six sessions over four keys per family
/// for at most `duration`, until its progress says stop.
pub struct Workload {
    pub runtime: tokio::runtime::Runtime,
    pub client: Arc<keel_client::Client>,
    pub recorder: Arc<keel_client::history::Recorder>,
    pub progress: Arc<keel_client::workload::Progress>,
    pub work: tokio::task::JoinHandle<()>,
}

impl Workload {
    /// Starts it, its choices drawn from `seed`.
    pub fn start(cluster: &LocalCluster, duration: Duration, seed: u64) -> Workload {
        use keel_client::workload::{self, Progress, WorkloadConfig};
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let config = keel_client::ClientConfig::new(cluster.client_addrs());
        let client = keel_client::Client::new(config);
        let recorder = Arc::new(keel_client::history::Recorder::default());
        let progress = Arc::new(Progress::default());
        let config =
            WorkloadConfig { sessions: 6, keys: 4, duration, seed, any_as_monotonic: false };
        let run = workload::run(client.clone(), recorder.clone(), config, progress.clone());
        let work = runtime.spawn(run);
        Workload { runtime, client, recorder, progress, work }
    }

    /// Operations finished so far.
    pub fn ops(&self) -> u64 {
        self.progress.ops.load(Ordering::Relaxed)
    }

    /// Stops it and waits for its sessions to end.
    pub fn stop(&mut self) {
        self.progress.stop.store(true, Ordering::Relaxed);
        let work = std::mem::replace(&mut self.work, self.runtime.spawn(async {}));
        self.runtime.block_on(work).unwrap();
    }
}

/// The leader's index.
pub fn leader(cluster: &LocalCluster) -> usize {
    match cluster.wait_for_leader(LEADER_WAIT) {
        Some(leader) => leader,
        None => {
            dump_logs(cluster);
            let statuses: Vec<_> = (0..cluster.configs.len()).map(|i| cluster.status(i)).collect();
            panic!("no leader: {statuses:?}");
        }
    }
}

/// Waits until every member agrees that node index `i` leads.
pub fn assert_leads(cluster: &LocalCluster, i: usize) {
    let led =
        wait_until(LEADER_WAIT, || cluster.wait_for_leader(Duration::from_secs(1)) == Some(i));
    assert!(led, "node {} does not lead", i + 1);
}

/// `KEEL.NODE change id` at the leader, again while it is refused for now (a change not
/// yet committed, a learner not caught up, a leader being elected); panics on any other
/// refusal.
pub fn change(cluster: &LocalCluster, what: &str, id: u32) {
    change_retrying(cluster, what, id, false);
}

/// As [`change`]; `retry_older` also retries while a member still speaks an older peer
/// protocol (just after a rolling upgrade's last restart, before every link announced).
pub fn change_retrying(cluster: &LocalCluster, what: &str, id: u32, retry_older: bool) {
    let id = id.to_string();
    eprintln!("KEEL.NODE {what} {id}");
    let done = wait_until(Duration::from_secs(60), || {
        let Some(at) = cluster.wait_for_leader(Duration::from_secs(1)) else { return false };
        let at = cluster.configs[at].client_addr;
        let reply = Conn::open(at).call(&["KEEL.NODE", what, &id]);
        if reply != "+OK" {
            eprintln!("  {reply}");
        }
        match reply.as_str() {
            "+OK" => true,
            older if older.contains("speaks peer protocol") && retry_older => false,
            busy if busy.starts_with("-BUSY") || busy.starts_with("-TRYAGAIN") => false,
            moved if moved.contains("not the leader") || moved.starts_with("-MOVED") => false,
            timeout if timeout.contains("timed out") || timeout.contains("TIMEOUT") => false,
            other => panic!("KEEL.NODE {what} {id}: {other}"),
        }
    });
    if !done {
        dump_logs(cluster);
        panic!("KEEL.NODE {what} {id} never went through");
    }
}

/// Paces a test by progress, not time: each [`Pace::step`] waits until `every` more of
/// the workload's operations finished since the last.
pub struct Pace {
    every: u64,
    next: u64,
}

impl Pace {
    pub fn new(every: u64) -> Pace {
        Pace { every, next: every }
    }

    /// Waits for the next `every` operations (at most a minute) before `what`.
    pub fn step(&mut self, load: &Workload, cluster: &LocalCluster, what: &str) {
        let ok = wait_until(Duration::from_secs(60), || load.ops() >= self.next);
        if !ok {
            dump_logs(cluster);
            panic!("no progress before: {what} ({} ops)", load.ops());
        }
        self.next = load.ops() + self.every;
    }
}
