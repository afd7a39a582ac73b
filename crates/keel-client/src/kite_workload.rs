//! A workload on a Kite keyspace (release consistency, `docs/kite.md`) whose outcomes are
//! checked as it runs and at its end: what `keel torture` runs beside the leader engine's
//! workload.
//!
//! Sessions are spread over the nodes (a [`KiteSession`] moves to the next node when its
//! node cannot be reached). The first session of each node is a **writer** that owns the
//! pair `d<w>.<g>`, `f<w>.<g>`: round after round it writes `d = v` relaxed and then
//! releases `f = v`, with `v` growing. When its session moves to another node it starts
//! generation `g + 1`: a moved session is a new one as far as ordering goes, and writes of
//! two sessions to one key are ordered by their stamps, not by when they were made (an
//! early version of this workload kept one pair across moves and took the old session's
//! late write, which outranked the new one's, for a violation). The other sessions draw
//! among:
//! - **message passing**: acquire the flag of a random writer's current generation, then
//!   read its data relaxed on the same node. Release consistency says the read sees the
//!   writes before the release the acquire read: `d >= f` (`kite-message-passing` when
//!   not);
//! - **fetch-and-add** by 1 on one of the counters `k<i>`: FAAs are linearizable, so no two
//!   acknowledged ones on a key return the same value before (`kite-faa-duplicate`), and
//!   the counter read at the end (an acquire) is at least one past every value returned
//!   and at most the number of FAAs that may have been applied (`kite-faa-final`);
//! - **compare-and-swap increments** on one of the counters `c<i>`: a strong `KEEL.CAS`
//!   from the value the session last saw to the next one (from absent to 1 at first); a
//!   CAS that does not swap tells the session the current value for its next try. A swap
//!   from `v` is an increment that found `v`, so the same two rules hold
//!   (`kite-cas-duplicate`: two acknowledged swaps from one value; `kite-cas-final`).
//!
//! The sessions other than the writers spend half their operations on message passing,
//! a quarter on FAAs and a quarter on CAS increments.
//!
//! A relaxed write, a release, an acquire or a read whose node cannot be reached fails
//! (only FAAs and CASes are sent again at the next node), so both calls of a round or of a pair run
//! on one node. A pair whose acquire found no flag yet is not counted as judged.
//!
//! Kite keeps its data in memory only: when a majority of the nodes loses its memory at
//! once, what only they held is lost, and these checks do not apply. The caller decides
//! whether they do (`keel torture` judges a schedule whose faults stopped at most one
//! node; see `docs/testing.md`).

use crate::client::Client;
use crate::error::ClientError;
use crate::kite::KiteSession;
use crate::workload::{Progress, Rng, ERROR_PAUSE};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Counters the FAAs go to (`k0..`).
pub const COUNTERS: u64 = 3;
/// Counters the CAS increments go to (`c0..`).
pub const CAS_COUNTERS: u64 = 2;
/// Most violations described (all are counted).
pub const VIOLATIONS_SHOWN_MAX: usize = 5;

/// What to run.
#[derive(Clone, Debug)]
pub struct KiteConfig {
    /// Sessions per node (the first of each node writes its pair).
    pub sessions_per_node: usize,
    /// How long to run.
    pub duration: Duration,
    /// Seeds the sessions' choices.
    pub seed: u64,
}

/// What the sessions saw, for the checks.
#[derive(Clone, Debug, Default)]
pub struct KiteLog {
    /// Operations sent, and how many failed.
    pub ops: u64,
    /// Operations that failed (their outcome unknown or refused).
    pub failed: u64,
    /// Per counter: the value each of its acknowledged increments found (FAAs on
    /// `k<i>`, swaps on `c<i>`).
    pub faa_before: BTreeMap<String, Vec<i64>>,
    /// Per counter: increments whose outcome is unknown.
    pub faa_unknown: BTreeMap<String, u64>,
    /// FAAs refused (certainly not applied), and the first few errors, for a reader of
    /// a `kite-faa-final` violation.
    pub faa_refused: (usize, Vec<String>),
    /// Every FAA (up to [`FAAS_RECORDED_MAX`]), for a reader of a violation.
    pub faas: Vec<FaaRecord>,
    /// Acquire-then-read pairs judged.
    pub pairs: u64,
    /// Violations found while running (message passing).
    pub violations: Vec<String>,
    /// Their number.
    pub violations_total: usize,
}

/// Most FAAs a [`KiteLog`] describes one by one.
pub const FAAS_RECORDED_MAX: usize = 1_000_000;

/// One FAA as its session saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaaRecord {
    /// The counter.
    pub key: String,
    /// The session (its `KEEL.REQ` id).
    pub session: u64,
    /// The node it was sent to first, and the node the session was on after it (1-based).
    pub nodes: (usize, usize),
    /// When it was sent and answered, in nanoseconds from the run's start.
    pub invoke_ns: u64,
    /// When its answer (or error) came.
    pub complete_ns: u64,
    /// The value before, or the error.
    pub result: Result<i64, String>,
}

impl KiteLog {
    /// Writes the FAAs as JSON Lines.
    pub fn write_faas(&self, path: &std::path::Path) -> std::io::Result<()> {
        use std::io::Write;
        let mut file = std::io::BufWriter::new(std::fs::File::create(path)?);
        for faa in &self.faas {
            let (ok, error) = match &faa.result {
                Ok(before) => (Some(*before), None),
                Err(e) => (None, Some(e.as_str())),
            };
            let line = serde_json::json!({
                "key": faa.key,
                "session": faa.session,
                "nodes": [faa.nodes.0, faa.nodes.1],
                "invoke_ns": faa.invoke_ns,
                "complete_ns": faa.complete_ns,
                "before": ok,
                "error": error,
            });
            serde_json::to_writer(&mut file, &line)?;
            file.write_all(b"\n")?;
        }
        file.flush()
    }

    fn found(&mut self, what: String) {
        note(&mut self.violations_total, &mut self.violations, what);
    }
}

/// Counts a violation and describes it if fewer than [`VIOLATIONS_SHOWN_MAX`] are.
fn note(total: &mut usize, shown: &mut Vec<String>, what: String) {
    *total += 1;
    if shown.len() < VIOLATIONS_SHOWN_MAX {
        shown.push(what);
    }
}

/// The verdict on a Kite run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KiteReport {
    /// Operations, and failed ones.
    pub ops: u64,
    /// Failed operations.
    pub failed: u64,
    /// Acknowledged FAAs.
    pub faas: usize,
    /// Acknowledged CAS increments (swaps).
    pub swaps: usize,
    /// Acquire-then-read pairs judged.
    pub pairs: u64,
    /// Violations, in total.
    pub violations_total: usize,
    /// The first ones, as `kind: detail`.
    pub violations: Vec<String>,
}

impl KiteReport {
    /// `ok` or `violation`.
    pub fn verdict(&self) -> &'static str {
        if self.violations_total == 0 {
            "ok"
        } else {
            "violation"
        }
    }
}

/// Runs the workload against `client` (whose keyspace is a Kite one, on `nodes` nodes),
/// counting in `progress` each round, pair, FAA or CAS increment (and those that failed),
/// until its deadline or `progress.stop`.
pub async fn run(client: Arc<Client>, config: KiteConfig, progress: Arc<Progress>) -> KiteLog {
    let nodes = client.config().nodes.len();
    let log = Arc::new(Mutex::new(KiteLog::default()));
    let origin = Instant::now();
    let deadline = origin + config.duration;
    // Each writer's generation: its pair's keys are `d<w>.<g>` and `f<w>.<g>`.
    let generations: Arc<Vec<AtomicU64>> = Arc::new((0..nodes).map(|_| 0.into()).collect());
    // Sessions end with the set: a caller that gives up on the run (drops it) leaves none
    // running.
    let mut tasks = tokio::task::JoinSet::new();
    for s in 0..nodes * config.sessions_per_node.max(1) {
        let (client, log, progress) = (client.clone(), log.clone(), progress.clone());
        let generations = generations.clone();
        let mut rng = Rng(config.seed ^ (s as u64 + 1).wrapping_mul(0x6B69_7465_5345_5353));
        tasks.spawn(async move {
            let mut session = client.kite_session(s % nodes);
            let writer = (s < nodes).then_some(s);
            let mut round = 0u64;
            let mut on = session.node();
            // The value of each CAS counter this session last saw (absent: none).
            let mut seen: BTreeMap<u64, Option<i64>> = BTreeMap::new();
            while Instant::now() < deadline && !progress.stop.load(Ordering::Relaxed) {
                let ok = match writer {
                    Some(w) => {
                        if session.node() != on {
                            // Moved: a new session as far as ordering goes, so a new pair.
                            on = session.node();
                            generations[w].fetch_add(1, Ordering::Relaxed);
                        }
                        let pair = Pair { w: w as u64, g: generations[w].load(Ordering::Relaxed) };
                        round += 1;
                        write_round(&mut session, pair, round, &log).await
                    }
                    None => match rng.below(4) {
                        0 | 1 => {
                            let w = rng.below(nodes as u64);
                            let g = generations[w as usize].load(Ordering::Relaxed);
                            pair(&mut session, Pair { w, g }, &log).await
                        }
                        2 => faa(&mut session, rng.below(COUNTERS), &log, origin).await,
                        _ => {
                            cas_increment(&mut session, rng.below(CAS_COUNTERS), &mut seen, &log)
                                .await
                        }
                    },
                };
                progress.ops.fetch_add(1, Ordering::Relaxed);
                if !ok {
                    progress.errors.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(ERROR_PAUSE).await;
                }
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("a kite session panicked");
    }
    let log = log.lock().expect("kite log").clone();
    log
}

fn count(log: &Mutex<KiteLog>, ok: bool) {
    let mut log = log.lock().expect("kite log");
    log.ops += 1;
    log.failed += u64::from(!ok);
}

/// A writer's message-passing pair in one generation: written by one session on one node
/// only (a writer whose session moves to another node starts the next generation).
/// Writes of different sessions to one key are ordered by their stamps, not by when they
/// were made: an old session's write still on its way could outrank the new session's,
/// so one pair must never span a move.
#[derive(Clone, Copy, Debug)]
struct Pair {
    w: u64,
    g: u64,
}

impl Pair {
    fn data(self) -> String {
        format!("d{}.{}", self.w, self.g)
    }

    fn flag(self) -> String {
        format!("f{}.{}", self.w, self.g)
    }
}

/// `d = v` relaxed, then `f = v` released; `false` if a call failed (the round is
/// abandoned, the next one writes a larger `v`).
async fn write_round(session: &mut KiteSession, pair: Pair, v: u64, log: &Mutex<KiteLog>) -> bool {
    let value = v.to_string();
    let wrote = session.write(pair.data().as_bytes(), value.as_bytes()).await.is_ok();
    count(log, wrote);
    if !wrote {
        return false;
    }
    let released = session.release(pair.flag().as_bytes(), value.as_bytes()).await.is_ok();
    count(log, released);
    released
}

fn number(value: &Option<Vec<u8>>) -> Option<u64> {
    match value {
        None => Some(0),
        Some(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
    }
}

/// Acquires the pair's flag, then reads its data on the same node: the read must see at
/// least what the acquire did.
async fn pair(session: &mut KiteSession, pair: Pair, log: &Mutex<KiteLog>) -> bool {
    let node = session.node();
    let flag = session.acquire(pair.flag().as_bytes()).await;
    count(log, flag.is_ok());
    let Ok(flag) = flag else { return false };
    let data = session.read(pair.data().as_bytes()).await;
    count(log, data.is_ok());
    let Ok(data) = data else { return false };
    if session.node() != node || flag.is_none() {
        return true;
    }
    let mut log = log.lock().expect("kite log");
    log.pairs += 1;
    match (number(&flag), number(&data)) {
        (Some(f), Some(d)) if d >= f => {}
        _ => log.found(format!(
            "kite-message-passing: on node {} an acquire of {} read {:?} and a later read of {} {:?}",
            node + 1,
            pair.flag(),
            flag.as_deref().map(String::from_utf8_lossy),
            pair.data(),
            data.as_deref().map(String::from_utf8_lossy),
        )),
    }
    true
}

/// An FAA by 1 on `k<i>`.
async fn faa(session: &mut KiteSession, i: u64, log: &Mutex<KiteLog>, origin: Instant) -> bool {
    let key = format!("k{i}");
    let first = session.node();
    let invoke_ns = origin.elapsed().as_nanos() as u64;
    let result = session.faa(key.as_bytes(), 1).await;
    let ok = result.is_ok();
    let mut log = log.lock().expect("kite log");
    log.ops += 1;
    log.failed += u64::from(!ok);
    if log.faas.len() < FAAS_RECORDED_MAX {
        let record = FaaRecord {
            key: key.clone(),
            session: session.id(),
            nodes: (first + 1, session.node() + 1),
            invoke_ns,
            complete_ns: origin.elapsed().as_nanos() as u64,
            result: result.as_ref().map(|b| *b).map_err(ToString::to_string),
        };
        log.faas.push(record);
    }
    match result {
        Ok(before) => log.faa_before.entry(key).or_default().push(before),
        Err(e) if e.outcome_unknown() => *log.faa_unknown.entry(key).or_default() += 1,
        Err(e) => {
            let (total, shown) = &mut log.faa_refused;
            note(total, shown, format!("{key}: {e}"));
        }
    }
    drop(log);
    ok
}

/// A strong CAS of `c<i>` from the value this session last saw (`seen`) to the next
/// one; `false` if it failed.
async fn cas_increment(
    session: &mut KiteSession,
    i: u64,
    seen: &mut BTreeMap<u64, Option<i64>>,
    log: &Mutex<KiteLog>,
) -> bool {
    let key = format!("c{i}");
    let expected = seen.get(&i).copied().flatten();
    let (expected_text, new) = (expected.map(|v| v.to_string()), expected.unwrap_or(0) + 1);
    let result = session
        .cas(
            key.as_bytes(),
            expected_text.as_deref().map(str::as_bytes),
            new.to_string().as_bytes(),
            true,
        )
        .await;
    let mut log = log.lock().expect("kite log");
    log.ops += 1;
    log.failed += u64::from(result.is_err());
    match &result {
        Ok(cas) if cas.swapped => {
            log.faa_before.entry(key).or_default().push(expected.unwrap_or(0));
            seen.insert(i, Some(new));
        }
        // Not swapped: the current value is the next try's expected one.
        Ok(cas) => match (&cas.current, number(&cas.current).and_then(|n| i64::try_from(n).ok())) {
            (None, _) => drop(seen.insert(i, None)),
            (Some(_), Some(n)) => drop(seen.insert(i, Some(n))),
            (Some(value), None) => {
                log.found(format!("kite-cas-value: {key} holds {value:?}, not a count"));
                seen.remove(&i);
            }
        },
        Err(e) if e.outcome_unknown() => *log.faa_unknown.entry(key).or_default() += 1,
        Err(_) => {}
    }
    result.is_ok()
}

/// The counters the final check reads: `k<i>` (FAAs) and `c<i>` (CAS increments).
fn counters() -> impl Iterator<Item = String> {
    (0..COUNTERS).map(|i| format!("k{i}")).chain((0..CAS_COUNTERS).map(|i| format!("c{i}")))
}

/// Whether `key` is one of the CAS counters (else an FAA counter).
fn is_cas_counter(key: &str) -> bool {
    key.starts_with('c')
}

/// Acknowledged increments on the CAS counters (`cas`) or on the FAA counters.
fn increments(log: &KiteLog, cas: bool) -> usize {
    let counted = log.faa_before.iter().filter(|(key, _)| is_cas_counter(key) == cas);
    counted.map(|(_, found)| found.len()).sum()
}

/// The names of the two rules for a counter's kind of increment.
fn rules(key: &str) -> (&'static str, &'static str, &'static str) {
    if is_cas_counter(key) {
        ("kite-cas-duplicate", "kite-cas-final", "swaps")
    } else {
        ("kite-faa-duplicate", "kite-faa-final", "FAAs")
    }
}

/// Reads every counter with an acquire at the end, trying each node in turn (a few
/// rounds): the values the final check compares against.
pub async fn finals(client: &Arc<Client>) -> Result<BTreeMap<String, i64>, ClientError> {
    let nodes = client.config().nodes.len();
    let mut out = BTreeMap::new();
    for key in counters() {
        let mut last = None;
        for attempt in 0..3 * nodes {
            let mut session = client.kite_session(attempt % nodes);
            match session.acquire(key.as_bytes()).await {
                Ok(value) => {
                    let n =
                        number(&value).and_then(|n| i64::try_from(n).ok()).ok_or_else(|| {
                            ClientError::Unexpected(format!("{key} holds {value:?}, not a count"))
                        })?;
                    out.insert(key.clone(), n);
                    last = None;
                    break;
                }
                Err(e) => {
                    last = Some(e);
                    tokio::time::sleep(ERROR_PAUSE * 10).await;
                }
            }
        }
        if let Some(e) = last {
            return Err(e);
        }
    }
    Ok(out)
}

/// The checks of the module doc on `log`, with the counters' `finals`.
pub fn check(log: &KiteLog, finals: &BTreeMap<String, i64>) -> KiteReport {
    let mut report = KiteReport {
        ops: log.ops,
        failed: log.failed,
        faas: increments(log, false),
        swaps: increments(log, true),
        pairs: log.pairs,
        violations_total: log.violations_total,
        violations: log.violations.clone(),
    };
    let mut found = |what| note(&mut report.violations_total, &mut report.violations, what);
    let keys: std::collections::BTreeSet<&String> =
        log.faa_before.keys().chain(log.faa_unknown.keys()).chain(finals.keys()).collect();
    for key in keys {
        let (duplicate, final_rule, what) = rules(key);
        let mut before = log.faa_before.get(key).cloned().unwrap_or_default();
        before.sort_unstable();
        for twice in before.windows(2).filter(|w| w[0] == w[1]) {
            found(format!("{duplicate}: two {what} on {key} both found {}", twice[0]));
        }
        let Some(&last) = finals.get(key) else { continue };
        let unknown = log.faa_unknown.get(key).copied().unwrap_or(0);
        let at_most = before.len() as u64 + unknown;
        let at_least = before.last().map_or(0, |b| b + 1);
        if last < at_least || last as u64 > at_most {
            found(format!(
                "{final_rule}: {key} ends at {last}, after {} acknowledged {what} (the largest value found {}) and {unknown} unknown",
                before.len(),
                before.last().map_or("none".to_string(), i64::to_string),
            ));
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(before: &[i64], unknown: u64) -> KiteLog {
        let mut log = KiteLog::default();
        log.faa_before.insert("k0".into(), before.to_vec());
        if unknown > 0 {
            log.faa_unknown.insert("k0".into(), unknown);
        }
        log
    }

    fn finals(n: i64) -> BTreeMap<String, i64> {
        BTreeMap::from([("k0".to_string(), n)])
    }

    #[test]
    fn counters_that_add_up_hold() {
        assert_eq!(check(&log(&[2, 0, 1], 0), &finals(3)).verdict(), "ok");
        // An unknown FAA may or may not have been applied.
        assert_eq!(check(&log(&[0, 1], 1), &finals(2)).verdict(), "ok");
        assert_eq!(check(&log(&[0, 1], 1), &finals(3)).verdict(), "ok");
        assert_eq!(check(&log(&[0, 2], 1), &finals(3)).verdict(), "ok");
    }

    #[test]
    fn each_counter_rule_catches_its_violation() {
        let kinds = |report: KiteReport| -> Vec<String> {
            report.violations.iter().map(|v| v.split(':').next().unwrap().to_string()).collect()
        };
        assert_eq!(kinds(check(&log(&[0, 1, 1], 0), &finals(3))), ["kite-faa-duplicate"]);
        // Lost increments: an FAA found 2, so the counter reached 3.
        assert_eq!(kinds(check(&log(&[0, 1, 2], 0), &finals(2))), ["kite-faa-final"]);
        // More increments than FAAs that may have run.
        assert_eq!(kinds(check(&log(&[0, 1], 0), &finals(5))), ["kite-faa-final"]);
        // A counter nobody acknowledged must still not grow by itself.
        assert_eq!(kinds(check(&log(&[], 0), &finals(1))), ["kite-faa-final"]);
    }

    #[test]
    fn cas_increments_are_judged_by_the_same_rules_under_their_own_names() {
        let mut log = KiteLog::default();
        log.faa_before.insert("c0".into(), vec![0, 1, 1]);
        log.faa_before.insert("k0".into(), vec![0]);
        let finals = BTreeMap::from([("c0".to_string(), 1), ("k0".to_string(), 1)]);
        let report = check(&log, &finals);
        assert_eq!((report.faas, report.swaps), (1, 3));
        let kinds: Vec<&str> =
            report.violations.iter().map(|v| v.split(':').next().unwrap()).collect();
        // Two swaps from 1, and a counter that ends below what the swaps reached.
        assert_eq!(kinds, ["kite-cas-duplicate", "kite-cas-final"]);
        log.faa_before.insert("c0".into(), vec![1, 0]);
        let finals = BTreeMap::from([("c0".to_string(), 2), ("k0".to_string(), 1)]);
        assert_eq!(check(&log, &finals).verdict(), "ok");
        assert_eq!(counters().collect::<Vec<_>>(), ["k0", "k1", "k2", "c0", "c1"]);
    }

    #[test]
    fn message_passing_violations_found_while_running_are_reported() {
        let mut log = KiteLog::default();
        for i in 0..7 {
            log.found(format!("kite-message-passing: {i}"));
        }
        let report = check(&log, &BTreeMap::new());
        assert_eq!((report.violations_total, report.violations.len()), (7, VIOLATIONS_SHOWN_MAX));
        assert_eq!(report.verdict(), "violation");
    }

    #[test]
    fn values_that_are_not_counts_are_not_taken_for_zero() {
        assert_eq!(number(&None), Some(0));
        assert_eq!(number(&Some(b"12".to_vec())), Some(12));
        assert_eq!(number(&Some(b"x".to_vec())), None);
    }
}
