//! Recording what clients saw, in the Keel history format (`docs/history-format.md`),
//! and the checks made on it during and after a run.
//!
//! The record types are `keel_check::history`'s, so `keel check` reads what is written.
//!
//! The [`Oracle`] checks, per key, as operations complete:
//! - **monotonic**: an `ok` read at `monotonic` or `linearizable` returns a version at
//!   least as new as every such read of the key that completed before it was invoked
//!   (cross-client monotonic reads, per key);
//! - **linearizable on durable keys**: an `ok` `linearizable` read of a key written only
//!   `durable` returns a version at least as new as every write of it acknowledged
//!   before the read was invoked;
//! - **value matches version**: a read returning version `v` returns the value the
//!   write `v` wrote.
//!
//! and, at the end of a run, against the final log: what was read at `monotonic` or
//! `linearizable`, and every acknowledged `durable` write, is still there.

pub use keel_check::history::{KeelHistory, Op, OpKind, Outcome, Record, Survivor};
use keel_types::{Durability, ReadLevel, Version};
use std::collections::{BTreeMap, BTreeSet};

/// Most operations one run records.
pub const OPS_MAX: usize = 1_000_000;

/// The durability of a write; `None` for a read.
pub fn durability_of(kind: &OpKind) -> Option<Durability> {
    match kind {
        OpKind::Get { .. } => None,
        OpKind::Put { durability, .. }
        | OpKind::Delete { durability, .. }
        | OpKind::Cas { durability, .. }
        | OpKind::Incr { durability, .. } => Some(*durability),
    }
}

/// The history as JSON Lines: header, ops, survivors.
pub fn to_jsonl(history: &KeelHistory) -> Vec<u8> {
    keel_check::history::write_history(Vec::new(), history).expect("memory writes")
}

/// A finding of the oracle: the invariant's name and the evidence.
pub type Finding = (&'static str, String);

/// The per-key online checks (see the module documentation).
#[derive(Debug, Default)]
pub struct Oracle {
    /// Per key: `(complete_ns, version)` of ok monotonic/linearizable reads.
    reads: BTreeMap<String, Vec<(u64, Version)>>,
    /// Per key: `(complete_ns, version)` of ok writes (for durable-only keys).
    writes: BTreeMap<String, Vec<(u64, Version)>>,
    /// The value each acknowledged write left, by version and key (a transaction's
    /// writes share its version).
    written: BTreeMap<(Version, String), Option<String>>,
    /// Keys written only `durable` so far.
    durable_only: BTreeMap<String, bool>,
}

impl Oracle {
    /// Checks one completed operation and remembers it; returns what it breaks.
    pub fn complete(&mut self, op: &Op) -> Vec<Finding> {
        let mut findings = Vec::new();
        let key = op.kind.key().to_string();
        if let Some(d) = durability_of(&op.kind) {
            let only = self.durable_only.entry(key.clone()).or_insert(true);
            *only &= d == Durability::Durable;
        }
        let (Outcome::Ok, Some(complete)) = (op.outcome, op.complete_ns) else {
            return findings;
        };
        match &op.kind {
            OpKind::Get { level, result, .. } => {
                let version = op.version.unwrap_or_default();
                self.check_value(op, &key, result.as_ref(), &mut findings);
                if *level != ReadLevel::Any {
                    self.check_monotonic(op, &key, version, &mut findings);
                    self.reads.entry(key.clone()).or_default().push((complete, version));
                }
                if *level == ReadLevel::Linearizable
                    && self.durable_only.get(&key).copied().unwrap_or(true)
                {
                    self.check_fresh(op, &key, version, &mut findings);
                }
            }
            _ => self.remember_write(op, &key, complete),
        }
        findings
    }

    /// Checks one item of an `ok` scan (scans are not recorded in the history): its
    /// value is what its version wrote and, for a scan at `monotonic`/`linearizable`, it
    /// is not older than a read of that key at those levels that completed before the
    /// scan began. Keys a scan omits are not checked: a deletion or the scan's limit
    /// makes absence ambiguous without replaying the log.
    pub fn check_scan_item(
        &self,
        scan: &Op,
        key: &str,
        value: Option<String>,
        version: Version,
    ) -> Vec<Finding> {
        let OpKind::Get { level, .. } = scan.kind else { panic!("a scan is recorded as a get") };
        assert_eq!(scan.outcome, Outcome::Ok, "only completed scans are checked");
        let mut item = scan.clone();
        item.kind = OpKind::Get { key: key.to_string(), level, result: value };
        item.version = Some(version);
        let mut findings = Vec::new();
        let OpKind::Get { result, .. } = &item.kind else { unreachable!("set above") };
        self.check_value(&item, key, result.as_ref(), &mut findings);
        if level != ReadLevel::Any {
            self.check_monotonic(&item, key, version, &mut findings);
        }
        findings
    }

    fn remember_write(&mut self, op: &Op, key: &str, complete: u64) {
        let Some(version) = op.version else { return };
        let value = match &op.kind {
            OpKind::Put { value, .. } | OpKind::Cas { value, .. } => Some(value.clone()),
            OpKind::Incr { result, .. } => result.map(|r| r.to_string()),
            OpKind::Delete { .. } | OpKind::Get { .. } => None,
        };
        self.written.insert((version, key.to_string()), value);
        self.writes.entry(key.to_string()).or_default().push((complete, version));
    }

    /// Remembers a committed transaction's writes, as [`Oracle::complete`] does a write's
    /// (its reads are `keel_check::txn`'s to judge, against the final log).
    pub fn complete_txn(&mut self, txn: &keel_check::history::Txn) -> Vec<Finding> {
        for (key, _) in crate::txns::net_writes(txn) {
            let only = self.durable_only.entry(key).or_insert(true);
            *only &= txn.durability == Durability::Durable;
        }
        let (Outcome::Ok, Some(complete), Some(version)) =
            (txn.outcome, txn.complete_ns, txn.version)
        else {
            return Vec::new();
        };
        for (key, value) in crate::txns::net_writes(txn) {
            self.writes.entry(key.clone()).or_default().push((complete, version));
            self.written.insert((version, key), value);
        }
        Vec::new()
    }

    fn check_value(&self, op: &Op, key: &str, result: Option<&String>, out: &mut Vec<Finding>) {
        let Some(version) = op.version else { return };
        let start = (version, String::new());
        let mut at = self.written.range(start..).take_while(|((v, _), _)| *v == version);
        let Some(((_, first), first_value)) = at.next() else { return };
        let found = std::iter::once((first, first_value))
            .chain(at.map(|((_, k), value)| (k, value)))
            .find(|(k, _)| *k == key);
        let wrong = match found {
            Some((_, value)) => value.as_ref() != result,
            None => true,
        };
        if wrong {
            let (k, value) = found.unwrap_or((first, first_value));
            let detail = format!(
                "op {} read {key}={result:?} at {version}, but {version} wrote {k}={value:?}",
                op.id
            );
            out.push(("read-value-mismatch", detail));
        }
    }

    fn check_monotonic(&self, op: &Op, key: &str, version: Version, out: &mut Vec<Finding>) {
        let newest = self.reads.get(key).into_iter().flatten();
        if let Some((_, seen)) = newest
            .filter(|(c, _)| *c < op.invoke_ns)
            .max_by_key(|(_, v)| *v)
            .filter(|(_, v)| *v > version)
        {
            let detail = format!(
                "op {} (client {}) read {key} at {version} after a read at {seen} had completed",
                op.id, op.client
            );
            out.push(("non-monotonic-read", detail));
        }
    }

    fn check_fresh(&self, op: &Op, key: &str, version: Version, out: &mut Vec<Finding>) {
        let acked = self.writes.get(key).into_iter().flatten();
        if let Some((_, newer)) = acked
            .filter(|(c, _)| *c < op.invoke_ns)
            .max_by_key(|(_, v)| *v)
            .filter(|(_, v)| *v > version)
        {
            let detail = format!(
                "linearizable op {} read {key} at {version} after write {newer} was acknowledged",
                op.id
            );
            out.push(("stale-linearizable-read", detail));
        }
    }
}

/// The end-of-run check: reads at `monotonic`/`linearizable` and acknowledged `durable`
/// writes must be in the final log (`final_versions`: every entry's version there).
pub fn check_survival(ops: &[Op], final_versions: &BTreeSet<Version>) -> Vec<Finding> {
    let mut findings = Vec::new();
    for op in ops.iter().filter(|op| op.outcome == Outcome::Ok) {
        let Some(version) = op.version.filter(|v| v.index.0 > 0) else { continue };
        let (must, kind) = match &op.kind {
            OpKind::Get { level, .. } => (*level != ReadLevel::Any, "read-lost"),
            other => (durability_of(other) == Some(Durability::Durable), "durable-write-lost"),
        };
        if must && !final_versions.contains(&version) {
            let detail = format!(
                "op {} ({}) saw {version}, absent from the final log",
                op.id,
                op.kind.key()
            );
            findings.push((kind, detail));
        }
    }
    findings
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(id: u64, invoke: u64, complete: u64, level: ReadLevel, v: Option<Version>) -> Op {
        Op {
            id,
            client: id,
            kind: OpKind::Get {
                key: "k".into(),
                level,
                result: v.map(|v| format!("v{}", v.index.0)),
            },
            invoke_ns: invoke,
            complete_ns: Some(complete),
            outcome: Outcome::Ok,
            node: Some(1),
            version: v,
            views: Vec::new(),
        }
    }

    fn put(id: u64, complete: u64, v: Version, durability: Durability) -> Op {
        Op {
            id,
            client: id,
            kind: OpKind::Put { key: "k".into(), value: format!("v{}", v.index.0), durability },
            invoke_ns: 0,
            complete_ns: Some(complete),
            outcome: Outcome::Ok,
            node: Some(1),
            version: Some(v),
            views: Vec::new(),
        }
    }

    #[test]
    fn a_read_older_than_a_completed_read_is_non_monotonic() {
        let mut oracle = Oracle::default();
        assert!(oracle.complete(&put(0, 1, Version::new(1, 2), Durability::Memory)).is_empty());
        assert!(oracle.complete(&put(1, 1, Version::new(1, 3), Durability::Memory)).is_empty());
        let m = ReadLevel::Monotonic;
        assert!(oracle.complete(&get(2, 10, 20, m, Some(Version::new(1, 3)))).is_empty());
        // Overlapping the first read: allowed to be older.
        assert!(oracle.complete(&get(3, 15, 25, m, Some(Version::new(1, 2)))).is_empty());
        let found = oracle.complete(&get(4, 30, 40, m, Some(Version::new(1, 2))));
        assert_eq!(found[0].0, "non-monotonic-read");
        // Reads at `any` promise nothing.
        assert!(oracle
            .complete(&get(5, 50, 60, ReadLevel::Any, Some(Version::new(1, 2))))
            .is_empty());
    }

    #[test]
    fn scan_items_are_checked_like_reads_at_the_scan_level() {
        let mut oracle = Oracle::default();
        oracle.complete(&put(0, 1, Version::new(1, 2), Durability::Memory));
        oracle.complete(&put(1, 1, Version::new(1, 3), Durability::Memory));
        let m = ReadLevel::Monotonic;
        oracle.complete(&get(2, 10, 20, m, Some(Version::new(1, 3))));
        let scan = get(3, 30, 40, m, None);
        let old = Version::new(1, 2);
        let found = oracle.check_scan_item(&scan, "k", Some("v2".into()), old);
        assert_eq!(found.iter().map(|f| f.0).collect::<Vec<_>>(), ["non-monotonic-read"]);
        let fresh = oracle.check_scan_item(&scan, "k", Some("v3".into()), Version::new(1, 3));
        assert!(fresh.is_empty(), "{fresh:?}");
        let wrong = oracle.check_scan_item(&scan, "k", Some("x".into()), Version::new(1, 3));
        assert_eq!(wrong[0].0, "read-value-mismatch");
        let any = get(4, 30, 40, ReadLevel::Any, None);
        assert!(oracle.check_scan_item(&any, "k", Some("v2".into()), old).is_empty());
    }

    #[test]
    fn linearizable_reads_of_durable_keys_see_acknowledged_writes() {
        let mut oracle = Oracle::default();
        oracle.complete(&put(0, 5, Version::new(1, 1), Durability::Durable));
        oracle.complete(&put(1, 9, Version::new(1, 2), Durability::Durable));
        let l = ReadLevel::Linearizable;
        assert!(oracle.complete(&get(2, 8, 12, l, Some(Version::new(1, 1)))).is_empty());
        let found = oracle.complete(&get(3, 10, 12, l, Some(Version::new(1, 1))));
        assert_eq!(found[0].0, "stale-linearizable-read");
    }

    #[test]
    fn a_value_that_its_version_did_not_write_is_caught() {
        let mut oracle = Oracle::default();
        oracle.complete(&put(0, 5, Version::new(1, 1), Durability::Memory));
        let mut read = get(1, 6, 7, ReadLevel::Any, Some(Version::new(1, 1)));
        read.kind =
            OpKind::Get { key: "k".into(), level: ReadLevel::Any, result: Some("zzz".into()) };
        assert_eq!(oracle.complete(&read)[0].0, "read-value-mismatch");
    }

    #[test]
    fn survival_requires_read_and_durable_versions_in_the_final_log() {
        let ops = vec![
            put(0, 1, Version::new(1, 1), Durability::Durable),
            put(1, 1, Version::new(1, 2), Durability::Memory),
            get(2, 2, 3, ReadLevel::Monotonic, Some(Version::new(1, 2))),
        ];
        let all: BTreeSet<Version> = [Version::new(1, 1), Version::new(1, 2)].into();
        assert!(check_survival(&ops, &all).is_empty());
        let lost: BTreeSet<Version> = [Version::new(1, 1)].into();
        assert_eq!(check_survival(&ops, &lost)[0].0, "read-lost");
        assert_eq!(check_survival(&ops, &BTreeSet::new()).len(), 2);
    }

    #[test]
    fn history_lines_match_the_keel_format() {
        let history = KeelHistory {
            ops: vec![put(0, 1, Version::new(1, 1), Durability::Durable)],
            ..KeelHistory::default()
        };
        let text = String::from_utf8(to_jsonl(&history)).unwrap();
        let mut lines = text.lines();
        assert_eq!(
            lines.next().unwrap(),
            r#"{"type":"header","format":"keel-history","version":2}"#
        );
        let op = lines.next().unwrap();
        assert!(op.contains(r#""op":"put""#) && op.contains(r#""durability":"durable""#));
        assert!(op.contains(r#""version":{"epoch":1,"index":1}"#));
    }
}
