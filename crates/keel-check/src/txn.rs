//! The transaction checker: each transaction is all or nothing and isolated, judged
//! against the final log's replay (its `txn-entry` and `survivor` records,
//! `docs/history-format.md`).
//!
//! Rules, for a transaction T the client was told committed at version V:
//! - **txn-outcome**: V is a transaction's entry in the final log that applied (a
//!   `txn-entry` with `applied`), or not in the final log at all (then T was lost, which
//!   only `durable` forbids: **txn-durable-lost**). An entry that replaying the log does not
//!   apply (a watched key had changed, or an operation failed) was not committed.
//! - **txn-watch**: every key T watched has, just before V, the version `WATCH` read:
//!   nothing wrote it in between, a delete included.
//! - **txn-isolation**: every read in T returns the key as it was just before V, or as T's
//!   own earlier writes left it (and every `incr` the value that follows from it): no
//!   other write comes between T's operations.
//! - **txn-partial**: the survivors of version V are exactly T's writes (the last value
//!   T left in each key it wrote): all of them, and nothing else.
//!
//! and for a transaction told it applied nothing (`fail`):
//! - **txn-failed-visible**: a value only it wrote (no other op or transaction that may
//!   have taken effect wrote that value to that key) is in no survivor and no completed
//!   read.
//!
//! An abort (`fail`) is never held against the log: a transaction may always be aborted
//! (the recorder does not know the entry of an aborted attempt), so the rules above are
//! safety only. Transactions of unknown outcome are judged by what they may have written:
//! they count as writers for **txn-failed-visible**.
//!
//! Layout: [`check`] indexes the survivors (per key, in log order) and the entries, then
//! judges each transaction ([`judge_committed`], [`judge_failed`]). O(n log n).

use crate::history::{KeelHistory, OpKind, Outcome, Txn, TxnOp};
use keel_types::{Durability, Version};
use std::collections::{BTreeMap, HashMap, HashSet};

/// How many violations a report describes (all are counted).
pub const VIOLATIONS_SHOWN_MAX: usize = 20;

/// Which rule a violation breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// Told committed, but the final log's entry at its version did not apply.
    Outcome,
    /// A watched key changed between `WATCH` and the transaction's entry.
    Watch,
    /// A read (or an increment's result) inside the transaction saw another write.
    Isolation,
    /// The final log holds part of the transaction's writes, or others at its version.
    Partial,
    /// A committed `durable` transaction is not in the final log.
    DurableLost,
    /// A value only a transaction that applied nothing wrote is visible.
    FailedVisible,
}

impl Rule {
    /// The rule's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Rule::Outcome => "txn-outcome",
            Rule::Watch => "txn-watch",
            Rule::Isolation => "txn-isolation",
            Rule::Partial => "txn-partial",
            Rule::DurableLost => "txn-durable-lost",
            Rule::FailedVisible => "txn-failed-visible",
        }
    }
}

/// One violation: the transaction and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The rule broken.
    pub rule: Rule,
    /// The transaction's id.
    pub txn: u64,
    /// What is wrong, for humans.
    pub message: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: txn {}: {}", self.rule.name(), self.txn, self.message)
    }
}

/// The result of the check.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Transactions checked.
    pub txns: usize,
    /// Of them, committed (`ok`).
    pub committed: usize,
    /// Of them, aborted by `WATCH`.
    pub aborted: usize,
    /// Violations found, in total.
    pub violations_total: usize,
    /// The first violations (at most [`VIOLATIONS_SHOWN_MAX`]).
    pub violations: Vec<Violation>,
}

impl Report {
    /// `ok` or `violation`.
    pub fn verdict(&self) -> &'static str {
        crate::verdict(self.violations_total == 0)
    }

    fn add(&mut self, rule: Rule, txn: &Txn, message: String) {
        self.violations_total += 1;
        if self.violations.len() < VIOLATIONS_SHOWN_MAX {
            self.violations.push(Violation { rule, txn: txn.id, message });
        }
    }
}

/// A key's state: the version of its last write (`None`: never written) and its value.
type State<'a> = (Option<Version>, Option<&'a str>);

/// The final log, as the checker looks it up.
struct FinalLog<'a> {
    /// Per key, its surviving writes in log order.
    by_key: HashMap<&'a str, Vec<(Version, Option<&'a str>)>>,
    /// Per version, the survivors of that version (a transaction's writes).
    at: HashMap<Version, Vec<(&'a str, Option<&'a str>)>>,
    /// Each transaction entry's version, and whether it applied.
    entries: HashMap<Version, bool>,
}

impl<'a> FinalLog<'a> {
    fn new(history: &'a KeelHistory) -> FinalLog<'a> {
        let mut log =
            FinalLog { by_key: HashMap::new(), at: HashMap::new(), entries: HashMap::new() };
        for s in &history.survivors {
            let value = s.value.as_deref();
            log.by_key.entry(s.key.as_str()).or_default().push((s.version, value));
            log.at.entry(s.version).or_default().push((s.key.as_str(), value));
        }
        for entry in &history.txn_entries {
            log.entries.insert(entry.version, entry.applied);
        }
        log
    }

    /// `key` just before version `v`.
    fn before(&self, key: &str, v: Version) -> State<'a> {
        let Some(writes) = self.by_key.get(key) else { return (None, None) };
        let n = writes.partition_point(|(w, _)| *w < v);
        match n {
            0 => (None, None),
            _ => (Some(writes[n - 1].0), writes[n - 1].1),
        }
    }
}

/// Checks every transaction of `history` (see the module documentation).
pub fn check(history: &KeelHistory) -> Report {
    let log = FinalLog::new(history);
    let mut report = Report { txns: history.txns.len(), ..Report::default() };
    let writers = possible_writers(history);
    let visible = visible_values(history);
    for txn in &history.txns {
        match txn.outcome {
            Outcome::Ok => {
                report.committed += 1;
                judge_committed(&log, txn, &mut report);
            }
            Outcome::Fail => {
                report.aborted += usize::from(txn.aborted);
                judge_failed(txn, &writers, &visible, &mut report);
            }
            Outcome::Unknown => {}
        }
    }
    report
}

/// The rules for a committed transaction.
fn judge_committed(log: &FinalLog<'_>, txn: &Txn, report: &mut Report) {
    let v = txn.version.expect("the reader requires a committed transaction's version");
    match log.entries.get(&v) {
        Some(true) => {}
        Some(false) => {
            let message = format!(
                "told committed at {v}, but replaying the final log its entry applies nothing \
                 (a watched key had changed or an operation failed)"
            );
            return report.add(Rule::Outcome, txn, message);
        }
        None if log.at.contains_key(&v) => {
            let message =
                format!("told committed at {v}, where the final log holds no transaction");
            return report.add(Rule::Outcome, txn, message);
        }
        None => {
            if txn.durability == Durability::Durable {
                let message = format!("committed durable at {v}, absent from the final log");
                report.add(Rule::DurableLost, txn, message);
            }
            return; // lost with its epoch: nothing more to judge it by
        }
    }
    for watched in &txn.watch {
        let (then, _) = log.before(&watched.key, v);
        if then != watched.version {
            let message = format!(
                "watched {:?} at {}, but just before {v} it was at {}",
                watched.key,
                show_version(watched.version),
                show_version(then)
            );
            report.add(Rule::Watch, txn, message);
        }
    }
    let written = replay(log, txn, v, report);
    let mut expected: Vec<(&str, Option<&str>)> =
        written.iter().map(|(k, (_, value))| (*k, value.as_deref())).collect();
    let mut found = log.at.get(&v).cloned().unwrap_or_default();
    expected.sort();
    found.sort();
    if expected != found {
        let message = format!("wrote {expected:?} at {v}, but the final log holds {found:?} there");
        report.add(Rule::Partial, txn, message);
    }
}

/// Replays `txn`'s operations on the state just before `v`, checking each read and
/// increment it recorded; returns the keys it wrote and the version and value it left.
fn replay<'a>(
    log: &FinalLog<'a>,
    txn: &'a Txn,
    v: Version,
    report: &mut Report,
) -> BTreeMap<&'a str, (Option<Version>, Option<String>)> {
    let mut written: BTreeMap<&str, (Option<Version>, Option<String>)> = BTreeMap::new();
    let state = |written: &BTreeMap<&str, (Option<Version>, Option<String>)>, key: &str| {
        written.get(key).cloned().unwrap_or_else(|| {
            let (version, value) = log.before(key, v);
            (version, value.map(str::to_string))
        })
    };
    for op in &txn.ops {
        match op {
            TxnOp::Get { key, result, version } => {
                let (then, value) = state(&written, key);
                if (*version, result) != (then, &value) {
                    let message = format!(
                        "read {key:?} = {result:?} at {}, but the transaction's state holds {value:?} at {}",
                        show_version(*version),
                        show_version(then)
                    );
                    report.add(Rule::Isolation, txn, message);
                }
            }
            TxnOp::Put { key, value } => {
                written.insert(key, (Some(v), Some(value.clone())));
            }
            TxnOp::Delete { key } => {
                written.insert(key, (Some(v), None));
            }
            TxnOp::Incr { key, delta, result } => {
                let (_, value) = state(&written, key);
                let base = value.as_deref().map_or(Some(0), |s| s.parse::<i64>().ok());
                let after = base.and_then(|b| b.checked_add(*delta));
                if after.is_none() || result.is_some_and(|r| Some(r) != after) {
                    let message = format!(
                        "incr {key:?} by {delta} returned {result:?}, but the transaction's state holds {value:?}"
                    );
                    report.add(Rule::Isolation, txn, message);
                }
                let left = result.or(after).map(|n| n.to_string());
                written.insert(key, (Some(v), left));
            }
        }
    }
    written
}

/// The rule for a transaction that applied nothing.
fn judge_failed(
    txn: &Txn,
    writers: &HashMap<(&str, &str), usize>,
    visible: &HashSet<(&str, &str)>,
    report: &mut Report,
) {
    let mut own: HashSet<(&str, &str)> = HashSet::new();
    for op in &txn.ops {
        if let TxnOp::Put { key, value } = op {
            own.insert((key.as_str(), value.as_str()));
        }
    }
    for (key, value) in own {
        let only_this = writers.get(&(key, value)).copied().unwrap_or(0) == 0;
        if only_this && visible.contains(&(key, value)) {
            let message = format!(
                "applied nothing, yet {key:?} = {value:?}, which only it wrote, is in the final \
                 log or was read"
            );
            report.add(Rule::FailedVisible, txn, message);
        }
    }
}

/// How many ops and transactions that may have taken effect (`ok` or `unknown`) wrote
/// each (key, value).
fn possible_writers(history: &KeelHistory) -> HashMap<(&str, &str), usize> {
    let mut writers: HashMap<(&str, &str), usize> = HashMap::new();
    for op in history.ops.iter().filter(|op| op.outcome != Outcome::Fail) {
        if let OpKind::Put { key, value, .. } | OpKind::Cas { key, value, .. } = &op.kind {
            *writers.entry((key.as_str(), value.as_str())).or_default() += 1;
        }
    }
    for txn in history.txns.iter().filter(|t| t.outcome != Outcome::Fail) {
        for op in &txn.ops {
            if let TxnOp::Put { key, value } = op {
                *writers.entry((key.as_str(), value.as_str())).or_default() += 1;
            }
        }
    }
    writers
}

/// Every (key, value) the final log holds or a completed read returned.
fn visible_values(history: &KeelHistory) -> HashSet<(&str, &str)> {
    let mut visible = HashSet::new();
    for s in &history.survivors {
        if let Some(value) = &s.value {
            visible.insert((s.key.as_str(), value.as_str()));
        }
    }
    for op in history.ops.iter().filter(|op| op.outcome == Outcome::Ok) {
        if let OpKind::Get { key, result: Some(value), .. } = &op.kind {
            visible.insert((key.as_str(), value.as_str()));
        }
    }
    for txn in history.txns.iter().filter(|t| t.outcome == Outcome::Ok) {
        for op in &txn.ops {
            if let TxnOp::Get { key, result: Some(value), .. } = op {
                visible.insert((key.as_str(), value.as_str()));
            }
        }
    }
    visible
}

fn show_version(version: Option<Version>) -> String {
    version.map_or("null (never written)".to_string(), |v| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Op, Survivor, TxnEntry, Watched};
    use keel_types::ReadLevel;

    fn v(index: u64) -> Version {
        Version::new(1, index)
    }

    fn survivor(index: u64, key: &str, value: Option<&str>) -> Survivor {
        Survivor { version: v(index), key: key.into(), value: value.map(Into::into) }
    }

    fn txn(id: u64, watch: &[(&str, Option<u64>)], ops: Vec<TxnOp>, at: Option<u64>) -> Txn {
        Txn {
            id,
            client: id,
            watch: watch
                .iter()
                .map(|(k, w)| Watched { key: k.to_string(), version: w.map(v) })
                .collect(),
            ops,
            durability: Durability::Memory,
            invoke_ns: 10,
            complete_ns: Some(20),
            outcome: if at.is_some() { Outcome::Ok } else { Outcome::Fail },
            aborted: false,
            node: Some(1),
            version: at.map(v),
        }
    }

    fn put(key: &str, value: &str) -> TxnOp {
        TxnOp::Put { key: key.into(), value: value.into() }
    }

    fn get(key: &str, result: Option<&str>, version: Option<u64>) -> TxnOp {
        TxnOp::Get { key: key.into(), result: result.map(Into::into), version: version.map(v) }
    }

    /// `a` written at 1 and deleted at 2; T at 3 watched `a` as never written and
    /// wrote `a` and `b` after reading `a`.
    fn watched_over_a_delete() -> KeelHistory {
        KeelHistory {
            survivors: vec![
                survivor(1, "a", Some("x")),
                survivor(2, "a", None),
                survivor(3, "a", Some("t")),
                survivor(3, "b", Some("u")),
            ],
            txns: vec![txn(
                7,
                &[("a", None)],
                vec![get("a", None, Some(2)), put("a", "t"), put("b", "u")],
                Some(3),
            )],
            txn_entries: vec![TxnEntry { version: v(3), applied: true }],
            ..KeelHistory::default()
        }
    }

    fn rules(report: &Report) -> Vec<&'static str> {
        report.violations.iter().map(|v| v.rule.name()).collect()
    }

    #[test]
    fn a_transaction_consistent_with_the_log_passes() {
        let mut h = watched_over_a_delete();
        h.txns[0].watch[0].version = Some(v(2));
        let report = check(&h);
        assert_eq!((report.verdict(), report.committed), ("ok", 1), "{:?}", report.violations);
    }

    #[test]
    fn a_commit_over_a_delete_of_a_watched_key_is_caught() {
        // WATCH saw `a` never written; it was set and deleted before T's entry.
        assert_eq!(rules(&check(&watched_over_a_delete())), ["txn-watch"]);
    }

    #[test]
    fn a_commit_whose_entry_the_log_does_not_apply_is_caught() {
        let mut h = watched_over_a_delete();
        h.txns[0].watch[0].version = Some(v(2));
        h.txn_entries[0].applied = false;
        h.survivors.truncate(2);
        assert_eq!(rules(&check(&h)), ["txn-outcome"]);
        // A version the final log gives a plain write.
        h.txn_entries.clear();
        h.survivors.push(survivor(3, "c", Some("plain")));
        assert_eq!(rules(&check(&h)), ["txn-outcome"]);
    }

    #[test]
    fn part_of_a_transaction_in_the_log_is_caught() {
        let mut h = watched_over_a_delete();
        h.txns[0].watch[0].version = Some(v(2));
        h.survivors.pop(); // `b` missing at 3
        assert_eq!(rules(&check(&h)), ["txn-partial"]);
        let mut h = watched_over_a_delete();
        h.txns[0].watch[0].version = Some(v(2));
        h.survivors.push(survivor(3, "c", Some("other")));
        assert_eq!(rules(&check(&h)), ["txn-partial"]);
    }

    #[test]
    fn a_read_that_sees_another_write_is_caught() {
        // T read `a` as written at 1 ("x"), but the delete at 2 came before it.
        let mut h = watched_over_a_delete();
        h.txns[0].watch[0].version = Some(v(2));
        h.txns[0].ops[0] = get("a", Some("x"), Some(1));
        assert_eq!(rules(&check(&h)), ["txn-isolation"]);
        // A read after T's own write sees that write.
        let mut h = watched_over_a_delete();
        h.txns[0].watch[0].version = Some(v(2));
        h.txns[0].ops.push(get("b", Some("u"), Some(3)));
        assert_eq!(check(&h).verdict(), "ok");
        h.txns[0].ops.push(get("b", None, None));
        assert_eq!(rules(&check(&h)), ["txn-isolation"]);
    }

    #[test]
    fn an_increment_is_checked_against_the_state_before_it() {
        let mut h = KeelHistory {
            survivors: vec![survivor(1, "n", Some("5")), survivor(2, "n", Some("6"))],
            txns: vec![txn(
                1,
                &[],
                vec![TxnOp::Incr { key: "n".into(), delta: 1, result: Some(6) }],
                Some(2),
            )],
            txn_entries: vec![TxnEntry { version: v(2), applied: true }],
            ..KeelHistory::default()
        };
        assert_eq!(check(&h).verdict(), "ok");
        h.txns[0].ops[0] = TxnOp::Incr { key: "n".into(), delta: 1, result: Some(9) };
        h.survivors[1].value = Some("9".into());
        assert_eq!(rules(&check(&h)), ["txn-isolation"]);
    }

    #[test]
    fn a_lost_durable_commit_is_caught_and_a_lost_memory_one_is_not() {
        let mut h = KeelHistory {
            txns: vec![txn(1, &[], vec![put("a", "x")], Some(4))],
            ..KeelHistory::default()
        };
        assert_eq!(check(&h).verdict(), "ok");
        h.txns[0].durability = Durability::Durable;
        assert_eq!(rules(&check(&h)), ["txn-durable-lost"]);
    }

    #[test]
    fn a_value_only_a_failed_transaction_wrote_must_stay_invisible() {
        let failed = txn(1, &[], vec![put("a", "mine")], None);
        let read = |result: &str| Op {
            id: 9,
            client: 2,
            kind: OpKind::Get {
                key: "a".into(),
                level: ReadLevel::Any,
                result: Some(result.into()),
            },
            invoke_ns: 30,
            complete_ns: Some(40),
            outcome: Outcome::Ok,
            node: Some(1),
            version: Some(v(3)),
            views: Vec::new(),
        };
        let mut h = KeelHistory { txns: vec![failed], ..KeelHistory::default() };
        assert_eq!(check(&h).verdict(), "ok");
        h.ops.push(read("mine"));
        assert_eq!(rules(&check(&h)), ["txn-failed-visible"]);
        // A survivor shows it just as well.
        let mut h = KeelHistory {
            txns: vec![txn(1, &[], vec![put("a", "mine")], None)],
            survivors: vec![survivor(3, "a", Some("mine"))],
            ..KeelHistory::default()
        };
        assert_eq!(rules(&check(&h)), ["txn-failed-visible"]);
        // Another writer of the same value (whose outcome is unknown) explains it.
        let mut other = txn(2, &[], vec![put("a", "mine")], None);
        other.outcome = Outcome::Unknown;
        other.complete_ns = None;
        h.txns.push(other);
        assert_eq!(check(&h).verdict(), "ok");
    }
}
