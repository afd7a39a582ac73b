//! A mixed, recorded workload over every durability and read level, and the checks its
//! history must pass. `keel demo` and the black-box tests run it.
//!
//! Keys come in three families, and queues in a fourth, so that each promise can be checked:
//! - `d<i>`: written only `durable` (puts and cas): linearizable reads of them must be
//!   linearizable, whatever crashes happen;
//! - `m<i>`: written `memory` or `replicated`: those writes may be lost in a crash
//!   (acknowledged before they were durable), so only monotonic reads are checked;
//! - `c<i>`: counters, changed only by `INCRBY` (at the server's default durability,
//!   `memory`): monotonic reads are checked, as for `m`;
//! - queues `q0` and `q1`: `durable` enqueues of unique values and `durable` dequeues (a
//!   third of them invoked as Correctables), drained at the end by [`drain`] and checked
//!   by `keel_check::queue` (nothing taken twice, no phantom, FIFO in real time, nothing
//!   acknowledged lost).
//!
//! Reads of both families use every level; a third of the reads at `monotonic` or
//! `linearizable` are invoked as Correctables (`KEEL.INVOKE`, a view per level). Checks:
//! cross-client monotonic reads (rules (a) and (b) of `keel_check::monotonic`) on the
//! whole history with every preliminary view as a read of its own, the views' order and
//! freshness (`keel_check::views`), and linearizability (`keel_check::linearizability`,
//! model `keel`) on the `d` keys.

use crate::client::Client;
use crate::history::{QueueLog, Recorder, Recording};
use keel_check::history::{KeelHistory, Op, OpKind, Survivor};
use keel_check::linearizability::{self, Verdict};
use keel_check::model::Model;
use keel_types::{Durability, ReadLevel};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most sessions one workload runs.
pub const SESSIONS_MAX: usize = 256;
/// Pause after a failed operation, so a session does not spin against a node that is down.
pub const ERROR_PAUSE: Duration = Duration::from_millis(20);

/// What to run.
#[derive(Clone, Debug)]
pub struct WorkloadConfig {
    /// Concurrent sessions.
    pub sessions: usize,
    /// Keys per family (`d0..`, `m0..`).
    pub keys: usize,
    /// How long to run.
    pub duration: Duration,
    /// Seeds each session's choices.
    pub seed: u64,
    /// Negative control: reads at `any` are recorded as `monotonic`, so the checks must
    /// find them breaking that level's promise under faults. Off in every real run.
    pub any_as_monotonic: bool,
}

/// Shared progress and stop flag.
#[derive(Debug, Default)]
pub struct Progress {
    /// Operations finished.
    pub ops: AtomicU64,
    /// Operations that failed or timed out.
    pub errors: AtomicU64,
    /// Set to stop early (Ctrl-C).
    pub stop: AtomicBool,
}

/// SplitMix64: the workload's choices, and a fault harness's schedules, from a seed.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    /// The next draw.
    pub fn draw(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A draw in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "a choice among none");
        self.draw() % n
    }
}

/// Runs the workload against `client`, recording into `recorder`.
pub async fn run(
    client: Arc<Client>,
    recorder: Arc<Recorder>,
    config: WorkloadConfig,
    progress: Arc<Progress>,
) {
    assert!(
        config.sessions >= 1 && config.sessions <= SESSIONS_MAX,
        "sessions in 1..={SESSIONS_MAX}"
    );
    assert!(config.keys >= 1, "at least one key per family");
    let deadline = Instant::now() + config.duration;
    // Sessions end with the set: a caller that gives up on the run (drops it) leaves none
    // running.
    let mut tasks = tokio::task::JoinSet::new();
    for s in 0..config.sessions {
        let (client, recorder, progress, config) =
            (client.clone(), recorder.clone(), progress.clone(), config.clone());
        tasks.spawn(async move {
            let mut rng = Rng(config.seed ^ (s as u64 + 1).wrapping_mul(0xA24B_AED4_963E_E407));
            let mut rec = Recording { session: client.session(), recorder: &recorder };
            let mut n = 0u64;
            while Instant::now() < deadline
                && !progress.stop.load(Ordering::Relaxed)
                && !recorder.full()
            {
                n += 1;
                let ok = one_op(&mut rec, &mut rng, &config, n).await;
                progress.ops.fetch_add(1, Ordering::Relaxed);
                if !ok {
                    progress.errors.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(ERROR_PAUSE).await;
                }
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("a workload session panicked");
    }
}

/// One random operation; `false` if it failed.
async fn one_op(rec: &mut Recording<'_>, rng: &mut Rng, config: &WorkloadConfig, n: u64) -> bool {
    let keys = config.keys as u64;
    let family = rng.below(6);
    if family == 5 {
        return queue_op(rec, rng, n).await;
    }
    let durable_family = family < 2;
    let counter_family = family == 4;
    let prefix = match family {
        0 | 1 => 'd',
        4 => 'c',
        _ => 'm',
    };
    let key = format!("{prefix}{}", rng.below(keys));
    let value = format!("{}-{n}", rec.session.id() % 100_000);
    let choice = rng.below(10);
    if choice < 6 {
        let level = ReadLevel::ALL[rng.below(3) as usize];
        if level > ReadLevel::Any && rng.below(3) == 0 {
            // A third of the stronger reads as Correctables: every level up to this one.
            let levels: Vec<ReadLevel> =
                ReadLevel::ALL.into_iter().filter(|l| *l <= level).collect();
            return rec.invoke(&key, &levels).await.is_ok();
        }
        if level == ReadLevel::Any && config.any_as_monotonic {
            return rec.get_recorded_as(&key, level, ReadLevel::Monotonic).await.is_ok();
        }
        return rec.get(&key, level).await.is_ok();
    }
    if durable_family {
        if choice == 9 {
            let expected = rec.get(&key, ReadLevel::Linearizable).await.ok().flatten();
            let expected = expected.map(|v| String::from_utf8_lossy(&v).into_owned());
            return rec.cas(&key, expected.as_deref(), &value, Durability::Durable).await.is_ok();
        }
        return rec.put(&key, &value, Durability::Durable).await.is_ok();
    }
    if counter_family {
        // The server's default durability (`memory`, as in every cluster this runs on).
        let delta = 1 + rng.below(3) as i64;
        return rec.incr(&key, delta, Durability::Memory).await.is_ok();
    }
    let durability = if rng.below(2) == 0 { Durability::Memory } else { Durability::Replicated };
    rec.put(&key, &value, durability).await.is_ok()
}

/// Queues the workload uses (`q0`, `q1`).
pub const QUEUES: u64 = 2;

/// One operation on a queue: an enqueue of a value unique in the run, or a dequeue (a
/// third of them invoked as Correctables with a preliminary view at `any`). Both
/// `durable`, so that nothing acknowledged may be lost or taken twice.
async fn queue_op(rec: &mut Recording<'_>, rng: &mut Rng, n: u64) -> bool {
    let queue = format!("q{}", rng.below(QUEUES));
    if rng.below(2) == 0 {
        let value = format!("{}-{n}", rec.session.id());
        return rec.enqueue(&queue, &value, Durability::Durable).await.is_ok();
    }
    let levels: &[ReadLevel] = if rng.below(3) == 0 { &[ReadLevel::Any] } else { &[] };
    rec.dequeue(&queue, Durability::Durable, levels).await.is_ok()
}

/// Most dequeues [`drain`] sends to one queue (past it, the queue is not drained and the
/// `queue-lost` rule has no final dequeue to judge by).
pub const DRAIN_MAX: usize = 1_000_000;

/// Dequeues every workload queue until it is found empty, recording each dequeue: the
/// end of a run, so that the `queue-lost` rule sees every acknowledged enqueue
/// accounted for. Gives up (an error) after a few failures in a row on one queue.
pub async fn drain(client: &Arc<Client>, recorder: &Recorder) -> Result<(), crate::ClientError> {
    let mut rec = Recording { session: client.session(), recorder };
    for q in 0..QUEUES {
        let queue = format!("q{q}");
        let mut failures = 0;
        for _ in 0..DRAIN_MAX {
            match rec.dequeue(&queue, Durability::Durable, &[]).await {
                Ok(None) => break,
                Ok(Some(_)) => failures = 0,
                Err(e) => {
                    failures += 1;
                    if failures >= 5 {
                        return Err(e);
                    }
                    tokio::time::sleep(ERROR_PAUSE * 10).await;
                }
            }
        }
    }
    Ok(())
}

/// The verdicts on a recorded run.
#[derive(Debug)]
pub struct Verdicts {
    /// Cross-client monotonic reads over the whole history (views as reads).
    pub monotonic: keel_check::monotonic::Report,
    /// The invoked reads' views: order and freshness.
    pub views: keel_check::views::Report,
    /// Linearizability of the `d` keys.
    pub linearizable: linearizability::Report,
    /// Acknowledged `durable` writes (puts, and CASes that swapped) missing from the
    /// surviving log: how many, and the first few as `key=value`.
    pub durable_lost: (usize, Vec<String>),
    /// The queues (`keel_check::queue`).
    pub queue: keel_check::queue::Report,
}

impl Verdicts {
    /// Whether every promise held (an `unknown` linearizability verdict does not count
    /// as holding).
    pub fn hold(&self) -> bool {
        self.monotonic.violations_total == 0
            && self.views.violations_total == 0
            && self.durable_lost.0 == 0
            && self.queue.violations_total == 0
            && matches!(self.linearizable.verdict, Verdict::Linearizable)
    }

    /// Violations found: monotonic ones plus one per non-linearizable history.
    pub fn violations(&self) -> usize {
        let lin = usize::from(matches!(self.linearizable.verdict, Verdict::NotLinearizable(_)));
        self.monotonic.violations_total
            + self.views.violations_total
            + self.durable_lost.0
            + self.queue.violations_total
            + lin
    }
}

/// Checks `ops` against `survivors`, and the queue operations `queue`.
pub fn check(ops: &[Op], survivors: &[Survivor], queue: &QueueLog) -> Verdicts {
    let history =
        KeelHistory { ops: ops.to_vec(), survivors: survivors.to_vec(), ..KeelHistory::default() };
    let views = keel_check::views::check(&history);
    let monotonic = keel_check::monotonic::check(&keel_check::views::expand(&history));
    let durable: Vec<Op> =
        ops.iter().filter(|op| op.kind.key().starts_with('d')).cloned().collect();
    let lin_ops = keel_check::keel::lin_ops(&durable);
    let linearizable =
        linearizability::check(Model::Keel, &lin_ops, linearizability::Config::default());
    let durable_lost = durable_lost(ops, survivors);
    let queue = keel_check::queue::check(&queue.enqueues, &queue.dequeues);
    Verdicts { monotonic, views, linearizable, durable_lost, queue }
}

/// Most lost writes named in [`Verdicts::durable_lost`].
pub const LOST_SHOWN_MAX: usize = 5;

/// Acknowledged `durable` writes whose value is not among the survivors of their key.
fn durable_lost(ops: &[Op], survivors: &[Survivor]) -> (usize, Vec<String>) {
    use keel_check::history::Outcome;
    let kept: std::collections::BTreeSet<(&str, &str)> =
        survivors.iter().filter_map(|s| Some((s.key.as_str(), s.value.as_deref()?))).collect();
    let mut lost = (0, Vec::new());
    for op in ops.iter().filter(|op| op.outcome == Outcome::Ok) {
        let (OpKind::Put { key, value, durability } | OpKind::Cas { key, value, durability, .. }) =
            &op.kind
        else {
            continue;
        };
        if *durability == Durability::Durable && !kept.contains(&(key.as_str(), value.as_str())) {
            lost.0 += 1;
            if lost.1.len() < LOST_SHOWN_MAX {
                lost.1.push(format!("{key}={value}"));
            }
        }
    }
    lost
}

/// The latency label of an op: `get/monotonic`, `put/durable`, ...
pub fn label(op: &Op) -> String {
    match &op.kind {
        OpKind::Get { level, .. } => format!("get/{level}"),
        OpKind::Put { durability, .. } => format!("put/{durability}"),
        OpKind::Cas { durability, .. } => format!("cas/{durability}"),
        OpKind::Delete { durability, .. } => format!("delete/{durability}"),
        OpKind::Incr { durability, .. } => format!("incr/{durability}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_choices_stay_in_range_and_vary() {
        let mut rng = Rng(1);
        let draws: Vec<u64> = (0..100).map(|_| rng.below(3)).collect();
        assert!(draws.iter().all(|d| *d < 3));
        assert!(draws.contains(&0) && draws.contains(&2));
    }

    #[test]
    fn an_acknowledged_durable_write_missing_from_the_log_is_a_violation() {
        use keel_check::history::Outcome;
        let put = |value: &str, durability, outcome| Op {
            id: 0,
            client: 1,
            kind: OpKind::Put { key: "d0".into(), value: value.into(), durability },
            invoke_ns: 1,
            complete_ns: Some(2),
            outcome,
            node: Some(1),
            version: None,
            views: Vec::new(),
        };
        let ops = [
            put("kept", Durability::Durable, Outcome::Ok),
            put("gone", Durability::Durable, Outcome::Ok),
            // Not promised: a `memory` write, and a durable one never acknowledged.
            put("volatile", Durability::Memory, Outcome::Ok),
            put("unacked", Durability::Durable, Outcome::Unknown),
        ];
        let survivors = [Survivor {
            version: keel_types::Version {
                index: keel_types::LogIndex(1),
                epoch: keel_types::Epoch(1),
            },
            key: "d0".into(),
            value: Some("kept".into()),
        }];
        let verdicts = check(&ops, &survivors, &QueueLog::default());
        assert_eq!(verdicts.durable_lost, (1, vec!["d0=gone".to_string()]));
        assert!(!verdicts.hold());
        assert!(verdicts.violations() >= 1);
    }

    #[test]
    fn an_empty_history_holds() {
        let verdicts = check(&[], &[], &QueueLog::default());
        assert!(verdicts.hold());
        assert_eq!(verdicts.violations(), 0);
    }
}
