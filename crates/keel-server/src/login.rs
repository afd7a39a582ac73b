//! Password checks off the runtime, and what slows a party that guesses passwords.
//!
//! A check ([`Users::check`]) is PBKDF2: a few milliseconds of one core. It runs on the
//! node's own hashing thread ([`HASH_THREADS`], named `keel-auth`), fed through a queue of
//! [`HASH_QUEUE_MAX`] checks. When the queue is full the attempt is refused at once
//! ([`Failure::Busy`]): it is never queued without bound and never runs on a thread of
//! the runtime, whose threads also run the engine loops and peer links (four connections
//! pipelining wrong passwords there deposed a leader).
//!
//! Before its check an attempt waits, by the checks that failed recently ([`Throttle`]):
//! - from its source address (IPv6: its /64): after [`FAILURES_FREE`] failures, attempts
//!   from the address start one at a time, `delay(failures)` apart (100 ms, doubling, at
//!   most [`FAILURE_DELAY_MAX`]), however many connections carry them; one that would
//!   wait longer than [`ADDRESS_WAIT_MAX`] is refused unchecked ([`Failure::Throttled`])
//!   after [`FAILURE_DELAY_MAX`];
//! - for its user name, known or not (an unknown name costs a guesser the same: a hash,
//!   and the delay): each attempt waits at least `delay(failures)` of the name, but not in
//!   turn, so that a guesser elsewhere slows the owner's login by at most
//!   [`FAILURE_DELAY_MAX`] and cannot lock it out.
//!
//! A connection is closed after [`CONNECTION_FAILURES_MAX`] failures (`commands`).
//! Failures are forgotten [`FAILURES_FORGOTTEN_AFTER`] after the last one. Waits are
//! `tokio::time::sleep` in the connection's task: no thread is held while one waits.
//! Both tables are fixed arrays of [`BUCKETS`] slots indexed by a hash keyed at random
//! when the node starts, so they hold the same memory whatever a guesser sends (names
//! that share a slot share its delay).
//!
//! Failures are counted by reason (`keel_client_auth_failures_total{reason}`) and logged
//! at WARN at most once per [`FAILURE_LOG_INTERVAL`]: one line summarizing the counts
//! since the last.

use crate::acl::{Refusal, User, Users};
use crate::metrics::Metrics;
use std::hash::{BuildHasher, RandomState};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Threads that check passwords (their own OS threads, not the runtime's).
pub const HASH_THREADS: usize = 1;
/// Checks waiting for a hashing thread; past it an attempt is refused at once.
pub const HASH_QUEUE_MAX: usize = 16;
/// Failures of an address or name before its attempts are delayed.
pub const FAILURES_FREE: u32 = 3;
/// The first delay, doubled per further failure.
pub const FAILURE_DELAY_MIN: Duration = Duration::from_millis(100);
/// The longest delay between two attempts of one address, and of one name.
pub const FAILURE_DELAY_MAX: Duration = Duration::from_secs(2);
/// The longest an attempt waits for its address's turn; longer: refused, unchecked.
pub const ADDRESS_WAIT_MAX: Duration = Duration::from_secs(4);
/// Failures of an address or name are forgotten this long after its last one.
pub const FAILURES_FORGOTTEN_AFTER: Duration = Duration::from_secs(60);
/// Failed attempts on one connection before it is closed.
pub const CONNECTION_FAILURES_MAX: u32 = 5;
/// At most one WARN line about failures per this long.
pub const FAILURE_LOG_INTERVAL: Duration = Duration::from_secs(1);
/// Slots per table (addresses, names).
pub const BUCKETS: usize = 4096;

const _: () = assert!(FAILURE_DELAY_MIN.as_millis() <= FAILURE_DELAY_MAX.as_millis());
const _: () = assert!(ADDRESS_WAIT_MAX.as_millis() >= FAILURE_DELAY_MAX.as_millis());
const _: () = assert!(HASH_THREADS >= 1 && HASH_QUEUE_MAX >= HASH_THREADS);

/// Why an attempt to authenticate failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The user exists; the password is not its.
    WrongPassword,
    /// No user has the name.
    UnknownUser,
    /// Refused unchecked: its address had too many attempts waiting.
    Throttled,
    /// Refused unchecked: the hashing queue was full.
    Busy,
}

impl Failure {
    /// Every reason, in the order of the metric's samples.
    pub const ALL: [Failure; 4] =
        [Failure::WrongPassword, Failure::UnknownUser, Failure::Throttled, Failure::Busy];

    /// Its label in metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Failure::WrongPassword => "wrong_password",
            Failure::UnknownUser => "unknown_user",
            Failure::Throttled => "throttled",
            Failure::Busy => "busy",
        }
    }

    /// Its position in [`Failure::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// The delay of an address or name after `failures` failures.
pub fn delay(failures: u32) -> Duration {
    if failures < FAILURES_FREE {
        return Duration::ZERO;
    }
    let doublings = (failures - FAILURES_FREE).min(16);
    FAILURE_DELAY_MIN.saturating_mul(1 << doublings).min(FAILURE_DELAY_MAX)
}

/// What a table remembers of one address or name.
#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    failures: u32,
    last_failure: Option<Instant>,
    /// When the next attempt may start (addresses only).
    next_start: Option<Instant>,
}

impl Slot {
    fn forget_old(&mut self, now: Instant) {
        let old = |at: Instant| now.saturating_duration_since(at) >= FAILURES_FORGOTTEN_AFTER;
        if self.last_failure.is_some_and(old) {
            self.failures = 0;
            self.last_failure = None;
        }
    }
}

/// Recent failures by source address and by user name (see the module docs).
#[derive(Debug)]
pub struct Throttle {
    addresses: Vec<Slot>,
    names: Vec<Slot>,
    keys: RandomState,
}

impl Default for Throttle {
    fn default() -> Self {
        Throttle {
            addresses: vec![Slot::default(); BUCKETS],
            names: vec![Slot::default(); BUCKETS],
            keys: RandomState::new(),
        }
    }
}

impl Throttle {
    fn slots(&self, from: IpAddr, name: &[u8]) -> (usize, usize) {
        // An IPv6 host usually holds a whole /64: count it as one address.
        let address: (u8, u128) = match from.to_canonical() {
            IpAddr::V4(v4) => (4, u128::from(v4.to_bits())),
            IpAddr::V6(v6) => (6, v6.to_bits() >> 64),
        };
        let bucket = |hash: u64| (hash % BUCKETS as u64) as usize;
        (bucket(self.keys.hash_one(address)), bucket(self.keys.hash_one(name)))
    }

    /// How long an attempt from `from` as `name` waits before its check; `None`: it is
    /// refused (its address's turn is more than [`ADDRESS_WAIT_MAX`] away).
    pub fn admit(&mut self, from: IpAddr, name: &[u8], now: Instant) -> Option<Duration> {
        let (a, n) = self.slots(from, name);
        self.addresses[a].forget_old(now);
        self.names[n].forget_old(now);
        let address = &mut self.addresses[a];
        let start = address.next_start.map_or(now, |at| at.max(now));
        let wait = start - now;
        if wait > ADDRESS_WAIT_MAX {
            return None;
        }
        address.next_start = Some(start + delay(address.failures));
        debug_assert!(wait <= ADDRESS_WAIT_MAX);
        Some(wait.max(delay(self.names[n].failures)))
    }

    /// Counts a failed check of `name` from `from`.
    pub fn failed(&mut self, from: IpAddr, name: &[u8], now: Instant) {
        let (a, n) = self.slots(from, name);
        for slot in [&mut self.addresses[a], &mut self.names[n]] {
            slot.forget_old(now);
            slot.failures = slot.failures.saturating_add(1);
            slot.last_failure = Some(now);
        }
    }
}

/// Failures since the last WARN line.
#[derive(Debug, Default)]
struct FailureLog {
    counts: [u64; Failure::ALL.len()],
    last: Option<(IpAddr, String)>,
    logged_at: Option<Instant>,
}

impl FailureLog {
    /// Logs the counts since the last line if there are any and one is due.
    fn flush(&mut self, now: Instant) {
        let due = self.logged_at.is_none_or(|at| now >= at + FAILURE_LOG_INTERVAL);
        let total: u64 = self.counts.iter().sum();
        if !due || total == 0 {
            return;
        }
        let [wrong_password, unknown_user, throttled, busy] = self.counts;
        let (from, user) = self.last.take().expect("a failure was noted");
        let since = match self.logged_at {
            Some(at) => {
                format!("in the {:.1} s since the last such line", (now - at).as_secs_f64())
            }
            None => "since the node started".to_string(),
        };
        tracing::warn!(failures = total, wrong_password, unknown_user, throttled, busy, last_from = %from, last_user = %user,
            "client authentication failed ({since})");
        self.counts = [0; Failure::ALL.len()];
        self.logged_at = Some(now);
    }
}

/// A check for a hashing thread.
struct Job {
    name: Vec<u8>,
    password: Vec<u8>,
    answer: oneshot::Sender<Result<Arc<User>, Refusal>>,
}

/// Authentication for every connection of a node: the hashing thread, the throttle and
/// the failure counts.
#[derive(Debug)]
pub struct Login {
    users: Arc<Users>,
    /// `None` without users: nothing to check, no thread.
    jobs: Option<std::sync::mpsc::SyncSender<Job>>,
    throttle: Mutex<Throttle>,
    log: Mutex<FailureLog>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Job") // never the password
    }
}

impl Login {
    /// Starts the hashing threads when `users` has any user; they end when this is
    /// dropped.
    pub fn new(users: Arc<Users>, metrics: Arc<Metrics>) -> Login {
        let jobs = users.required().then(|| {
            let (jobs, queue) = std::sync::mpsc::sync_channel::<Job>(HASH_QUEUE_MAX);
            let queue = Arc::new(Mutex::new(queue));
            for _ in 0..HASH_THREADS {
                let (queue, users) = (queue.clone(), users.clone());
                std::thread::Builder::new()
                    .name("keel-auth".into())
                    .spawn(move || hash_jobs(&queue, &users))
                    .expect("a hashing thread starts");
            }
            jobs
        });
        let (throttle, log) = (Mutex::default(), Mutex::default());
        Login { users, jobs, throttle, log, metrics }
    }

    /// The configured users.
    pub fn users(&self) -> &Arc<Users> {
        &self.users
    }

    /// Checks `password` for `name` from `from`: waits its turn (see the module docs),
    /// then has a hashing thread check it. The user, or why not.
    pub async fn authenticate(
        &self,
        from: IpAddr,
        name: &[u8],
        password: &[u8],
    ) -> Result<Arc<User>, Failure> {
        let admitted = lock(&self.throttle).admit(from, name, Instant::now());
        let Some(wait) = admitted else {
            // Refused unchecked, but not at once: a connection gets no faster answer by
            // being refused, so opening more connections does not speed a guesser up.
            tokio::time::sleep(FAILURE_DELAY_MAX).await;
            return Err(self.failed(from, name, Failure::Throttled));
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        let (answer, answered) = oneshot::channel();
        let job = Job { name: name.to_vec(), password: password.to_vec(), answer };
        if self.jobs.as_ref().is_none_or(|jobs| jobs.try_send(job).is_err()) {
            return Err(self.failed(from, name, Failure::Busy));
        }
        let failure = match answered.await {
            Ok(Ok(user)) => return Ok(user),
            Ok(Err(Refusal::WrongPassword)) => Failure::WrongPassword,
            Ok(Err(Refusal::UnknownUser)) => Failure::UnknownUser,
            Err(_) => Failure::Busy, // the thread is gone: the node is stopping
        };
        if matches!(failure, Failure::WrongPassword | Failure::UnknownUser) {
            lock(&self.throttle).failed(from, name, Instant::now());
        }
        Err(self.failed(from, name, failure))
    }

    /// Counts and notes a failure; returns it.
    fn failed(&self, from: IpAddr, name: &[u8], failure: Failure) -> Failure {
        self.metrics.auth_failed(failure);
        let mut log = lock(&self.log);
        log.counts[failure.index()] += 1;
        let mut user = String::from_utf8_lossy(&name[..name.len().min(64)]).into_owned();
        user.retain(|c| !c.is_control());
        log.last = Some((from, user));
        log.flush(Instant::now());
        failure
    }

    /// Logs the failures not logged yet, if a line is due (called every
    /// [`FAILURE_LOG_INTERVAL`], so that the last failures of a burst are logged too).
    pub fn flush_log(&self) {
        lock(&self.log).flush(Instant::now());
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A hashing thread: checks until the node drops its [`Login`].
fn hash_jobs(queue: &Mutex<std::sync::mpsc::Receiver<Job>>, users: &Users) {
    loop {
        let job = lock(queue).recv();
        let Ok(job) = job else { return };
        let result = users.check(&job.name, &job.password);
        let _ = job.answer.send(result);
    }
}

/// Logs the failures of `login` every [`FAILURE_LOG_INTERVAL`] while it lives.
pub async fn log_failures(login: std::sync::Weak<Login>) {
    let mut tick = tokio::time::interval(FAILURE_LOG_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(login) = login.upgrade() else { return };
        login.flush_log();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acl::{Category, UserSettings};

    const HOME: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const AWAY: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    #[test]
    fn delays_grow_from_the_fourth_failure_to_their_cap() {
        assert_eq!(delay(0), Duration::ZERO);
        assert_eq!(delay(FAILURES_FREE - 1), Duration::ZERO);
        assert_eq!(delay(FAILURES_FREE), FAILURE_DELAY_MIN);
        assert_eq!(delay(FAILURES_FREE + 1), 2 * FAILURE_DELAY_MIN);
        assert_eq!(delay(FAILURES_FREE + 20), FAILURE_DELAY_MAX);
        assert_eq!(delay(u32::MAX), FAILURE_DELAY_MAX);
    }

    #[test]
    fn an_address_with_failures_gets_one_turn_at_a_time_and_no_long_queue() {
        let mut throttle = Throttle::default();
        let now = Instant::now();
        for _ in 0..20 {
            throttle.failed(HOME, b"admin", now);
        }
        // Many connections from one address: each attempt starts a delay after the last.
        let waits: Vec<Option<Duration>> =
            (0..4).map(|_| throttle.admit(HOME, b"other", now)).collect();
        let max = FAILURE_DELAY_MAX;
        assert_eq!(waits, [Some(Duration::ZERO), Some(max), Some(2 * max), None]);
        // Another address guessing the same name waits the name's delay, not in turn.
        assert_eq!(throttle.admit(AWAY, b"admin", now), Some(max));
        assert_eq!(throttle.admit(AWAY, b"admin", now), Some(max));
        // Forgotten after a quiet while.
        let later = now + FAILURES_FORGOTTEN_AFTER + ADDRESS_WAIT_MAX * 2;
        assert_eq!(throttle.admit(HOME, b"admin", later), Some(Duration::ZERO));
    }

    #[tokio::test]
    async fn checks_run_on_the_hashing_thread_and_failures_are_counted_by_reason() {
        let hash = crate::acl::hash_password(b"right", crate::acl::ITERATIONS_MIN);
        let settings = UserSettings {
            name: "admin".into(),
            password_hash: hash,
            permissions: vec![Category::Read],
            keyspaces: None,
        };
        let users = Arc::new(Users::new(&[settings]).expect("valid"));
        let metrics = Arc::new(Metrics::default());
        let login = Login::new(users, metrics.clone());
        let user = login.authenticate(HOME, b"admin", b"right").await.expect("its password");
        assert_eq!(user.name, "admin");
        let wrong = login.authenticate(HOME, b"admin", b"wrong").await;
        assert_eq!(wrong.unwrap_err(), Failure::WrongPassword);
        let unknown = login.authenticate(HOME, b"nobody", b"right").await;
        assert_eq!(unknown.unwrap_err(), Failure::UnknownUser);
        assert_eq!(metrics.auth_failures(Failure::WrongPassword), 1);
        assert_eq!(metrics.auth_failures(Failure::UnknownUser), 1);
    }
}
