//! The cross-client monotonic-reads checker (ORCA §3) over a Keel history and its
//! survivor records.
//!
//! Reads checked: gets at level `monotonic` or `linearizable` with outcome `ok`. Positions
//! are ranks in the survivor list (its log order); a read's position is the rank of the
//! survivor it returned (of the last survivor of its version: a transaction's writes share
//! one, and reading one of them is reading after all of them), 0 for a read of a
//! never-written key (version null).
//!
//! - (a) **Nothing read is lost**: a read's version is a survivor of the same key and its
//!   value is that survivor's value (absent for a delete). A value with a null version is
//!   a violation too.
//! - (b) **Never older than anything read before**: for reads r1, r2 of any clients with
//!   r1 completed before r2 was invoked (strictly earlier time), r2 returns a position at
//!   least that of the newest surviving write to r2's key at or before r1's position
//!   (reading the state at position p means every write before p is visible, whatever
//!   its key).
//!
//! Layout: [`check`] indexes survivors, applies (a) to each read, then sweeps the reads by
//! time for (b): reads sorted by invocation and by completion; a pointer over completions
//! keeps the largest position read so far; each read looks up the newest survivor of its
//! key at or below that position by binary search. O(n log n) overall.

use crate::history::{KeelHistory, Op, OpKind, Outcome};
use keel_types::{ReadLevel, Version};
use std::collections::{BTreeMap, HashMap};

/// How many violations a report describes (all are counted).
pub const VIOLATIONS_SHOWN_MAX: usize = 20;

/// Which rule a violation breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// (a): the value read is not among the surviving writes of its key.
    Lost,
    /// (b): the read returned an older state than one already read.
    Backwards,
}

impl Rule {
    /// The rule's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Rule::Lost => "lost-read",
            Rule::Backwards => "read-went-backwards",
        }
    }
}

/// One violation: the offending read, and for (b) the earlier read it contradicts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The rule broken.
    pub rule: Rule,
    /// The offending read (r2 for rule (b)).
    pub read: Op,
    /// For (b): the read r1 that completed before `read` was invoked and saw newer state.
    pub earlier: Option<Op>,
    /// What is wrong, for humans.
    pub message: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{}: {}", self.rule.name(), self.message)?;
        writeln!(f, "  read:    {}", describe(&self.read))?;
        if let Some(earlier) = &self.earlier {
            writeln!(f, "  earlier: {}", describe(earlier))?;
        }
        Ok(())
    }
}

/// One line describing a get.
pub fn describe(op: &Op) -> String {
    let version = op.version.map_or("null".to_string(), |v| v.to_string());
    let result = match &op.kind {
        OpKind::Get { result: Some(v), .. } => format!("{v:?}"),
        _ => "absent".to_string(),
    };
    let complete = op.complete_ns.map_or("unknown".to_string(), |c| c.to_string());
    format!(
        "op {} client {} get({:?}) -> {result} version {version} [{}, {complete}]",
        op.id,
        op.client,
        op.kind.key(),
        op.invoke_ns
    )
}

/// The result of the check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// Reads checked.
    pub reads: usize,
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

    fn add(&mut self, violation: Violation) {
        self.violations_total += 1;
        if self.violations.len() < VIOLATIONS_SHOWN_MAX {
            self.violations.push(violation);
        }
    }
}

/// A read that passed (a), with its position.
#[derive(Clone, Copy, Debug)]
struct Placed {
    op: usize,
    position: usize,
    invoke: u64,
    complete: u64,
}

/// Survivors indexed by version and key, and by key.
struct Survivors<'a> {
    /// The rank of each survivor.
    rank_of: HashMap<(Version, &'a str), usize>,
    /// The last rank of each version: a transaction's writes share a version, and reading
    /// one of them reads the state after all of them (they apply as one entry).
    last_rank_of: HashMap<Version, usize>,
    ranks_of_key: BTreeMap<&'a str, Vec<usize>>,
}

impl<'a> Survivors<'a> {
    fn new(history: &'a KeelHistory) -> Survivors<'a> {
        let mut survivors = Survivors {
            rank_of: HashMap::new(),
            last_rank_of: HashMap::new(),
            ranks_of_key: BTreeMap::new(),
        };
        for (i, s) in history.survivors.iter().enumerate() {
            let rank = i + 1;
            if i > 0 {
                let before = &history.survivors[i - 1];
                assert!(before.version <= s.version, "survivors are in log order");
            }
            let fresh = survivors.rank_of.insert((s.version, s.key.as_str()), rank).is_none();
            assert!(fresh, "one survivor per key and version");
            survivors.last_rank_of.insert(s.version, rank);
            survivors.ranks_of_key.entry(s.key.as_str()).or_default().push(rank);
        }
        survivors
    }

    /// The newest survivor rank of `key` at or below `position` (0: none).
    fn newest_at_or_before(&self, key: &str, position: usize) -> usize {
        let Some(ranks) = self.ranks_of_key.get(key) else { return 0 };
        let count = ranks.partition_point(|&r| r <= position);
        if count == 0 {
            0
        } else {
            ranks[count - 1]
        }
    }
}

fn is_checked_read(op: &Op) -> bool {
    matches!(op.kind, OpKind::Get { level: ReadLevel::Monotonic | ReadLevel::Linearizable, .. })
        && op.outcome == Outcome::Ok
        && op.complete_ns.is_some()
}

/// Rule (a) for one read: its position, or the reason it breaks the rule.
fn position(history: &KeelHistory, survivors: &Survivors<'_>, op: &Op) -> Result<usize, String> {
    let OpKind::Get { key, result, .. } = &op.kind else { unreachable!("only gets are checked") };
    let Some(version) = op.version else {
        return match result {
            None => Ok(0),
            Some(v) => Err(format!("returned {v:?} with a null version")),
        };
    };
    let Some(&last) = survivors.last_rank_of.get(&version) else {
        return Err(format!("version {version} is not among the surviving writes"));
    };
    let Some(&rank) = survivors.rank_of.get(&(version, key.as_str())) else {
        let other = &history.survivors[last - 1].key;
        return Err(format!("version {version} wrote key {other:?}, not {key:?}"));
    };
    let survivor = &history.survivors[rank - 1];
    if survivor.value != *result {
        let left = survivor.value.as_deref().map_or("absent".to_string(), |v| format!("{v:?}"));
        return Err(format!("version {version} left {left}, not the value read"));
    }
    Ok(last)
}

/// Checks rules (a) and (b) over `history`. Survivors must be in log order, several of
/// one version only for distinct keys (the reader checks it; violating it here is a
/// programmer error).
pub fn check(history: &KeelHistory) -> Report {
    let survivors = Survivors::new(history);
    let mut report = Report { reads: 0, violations_total: 0, violations: Vec::new() };
    let mut placed = Vec::new();
    for (i, op) in history.ops.iter().enumerate().filter(|(_, op)| is_checked_read(op)) {
        report.reads += 1;
        match position(history, &survivors, op) {
            Ok(position) => placed.push(Placed {
                op: i,
                position,
                invoke: op.invoke_ns,
                complete: op.complete_ns.expect("checked reads completed"),
            }),
            Err(message) => {
                report.add(Violation {
                    rule: Rule::Lost,
                    read: op.clone(),
                    earlier: None,
                    message,
                });
            }
        }
    }
    sweep(history, &survivors, &placed, &mut report);
    report
}

/// Rule (b): reads in invocation order against the largest position completed before.
fn sweep(history: &KeelHistory, survivors: &Survivors<'_>, placed: &[Placed], report: &mut Report) {
    let mut by_invoke: Vec<&Placed> = placed.iter().collect();
    by_invoke.sort_by_key(|p| (p.invoke, p.op));
    let mut by_complete: Vec<&Placed> = placed.iter().collect();
    by_complete.sort_by_key(|p| (p.complete, p.op));
    let mut done = 0;
    let mut newest: Option<&Placed> = None;
    for r2 in by_invoke {
        while done < by_complete.len() && by_complete[done].complete < r2.invoke {
            let r1 = by_complete[done];
            let newer = match newest {
                Some(n) => r1.position > n.position,
                None => true,
            };
            if newer {
                newest = Some(r1);
            }
            done += 1;
        }
        let Some(r1) = newest else { continue };
        debug_assert!(r1.complete < r2.invoke && r1.op != r2.op);
        let read = &history.ops[r2.op];
        let required = survivors.newest_at_or_before(read.kind.key(), r1.position);
        if r2.position < required {
            let message = format!(
                "returned log position {} but position {} of its key was already visible \
                 to a read that completed before it was invoked",
                r2.position, required
            );
            report.add(Violation {
                rule: Rule::Backwards,
                read: read.clone(),
                earlier: Some(history.ops[r1.op].clone()),
                message,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Survivor;

    fn get(id: u64, key: &str, result: Option<&str>, version: Option<u64>, at: (u64, u64)) -> Op {
        Op {
            id,
            client: id,
            kind: OpKind::Get {
                key: key.into(),
                level: ReadLevel::Monotonic,
                result: result.map(str::to_string),
            },
            invoke_ns: at.0,
            complete_ns: Some(at.1),
            outcome: Outcome::Ok,
            node: None,
            version: version.map(|i| Version::new(1, i)),
            views: Vec::new(),
        }
    }

    fn survivors() -> Vec<Survivor> {
        let s = |i, key: &str, value: &str| Survivor {
            version: Version::new(1, i),
            key: key.into(),
            value: Some(value.into()),
        };
        vec![s(1, "a", "a1"), s(2, "b", "b1"), s(3, "a", "a2")]
    }

    fn verdict(ops: Vec<Op>) -> Report {
        check(&KeelHistory { ops, survivors: survivors(), ..KeelHistory::default() })
    }

    #[test]
    fn forward_reads_hold() {
        let r = verdict(vec![
            get(0, "a", Some("a1"), Some(1), (0, 10)),
            get(1, "a", Some("a2"), Some(3), (20, 30)),
        ]);
        assert_eq!(r.verdict(), "ok");
        // Concurrent reads may disagree in either order.
        let r = verdict(vec![
            get(0, "a", Some("a2"), Some(3), (0, 10)),
            get(1, "a", Some("a1"), Some(1), (10, 30)),
        ]);
        assert_eq!(r.verdict(), "ok");
    }

    #[test]
    fn reading_one_write_of_a_transaction_makes_all_of_it_visible() {
        // A transaction at 4 wrote "a" then "b": reading its "a" means its "b" is visible.
        let mut survivors = survivors();
        let s = |key: &str, value: &str| Survivor {
            version: Version::new(1, 4),
            key: key.into(),
            value: Some(value.into()),
        };
        survivors.extend([s("a", "a3"), s("b", "b2")]);
        let history =
            |ops| KeelHistory { ops, survivors: survivors.clone(), ..KeelHistory::default() };
        let fractured = check(&history(vec![
            get(0, "a", Some("a3"), Some(4), (0, 10)),
            get(1, "b", Some("b1"), Some(2), (20, 30)),
        ]));
        assert_eq!(fractured.violations[0].rule, Rule::Backwards);
        let whole = check(&history(vec![
            get(0, "a", Some("a3"), Some(4), (0, 10)),
            get(1, "b", Some("b2"), Some(4), (20, 30)),
        ]));
        assert_eq!(whole.verdict(), "ok");
        let wrong_key = check(&history(vec![get(0, "c", Some("a3"), Some(4), (0, 10))]));
        assert_eq!(wrong_key.violations[0].rule, Rule::Lost);
    }

    #[test]
    fn lost_values_are_violations() {
        let r = verdict(vec![get(0, "a", Some("x"), Some(9), (0, 10))]);
        assert_eq!((r.verdict(), r.violations[0].rule), ("violation", Rule::Lost));
        let r = verdict(vec![get(0, "a", Some("b1"), Some(2), (0, 10))]);
        assert_eq!(r.violations[0].rule, Rule::Lost, "survivor of another key");
        let r = verdict(vec![get(0, "a", Some("zz"), Some(1), (0, 10))]);
        assert_eq!(r.violations[0].rule, Rule::Lost, "value differs");
    }

    #[test]
    fn backwards_across_keys_is_a_violation() {
        // r1 read b at position 2, so a1 (position 1) is visible: a later absent read of a is wrong.
        let r = verdict(vec![
            get(0, "b", Some("b1"), Some(2), (0, 10)),
            get(1, "a", None, None, (20, 30)),
        ]);
        assert_eq!(r.verdict(), "violation");
        let v = &r.violations[0];
        assert_eq!(
            (v.rule, v.read.id, v.earlier.as_ref().map(|e| e.id)),
            (Rule::Backwards, 1, Some(0))
        );
        assert!(v.to_string().contains("earlier: op 0"), "{v}");
        // But a2 (position 3) need not be visible.
        let r = verdict(vec![
            get(0, "b", Some("b1"), Some(2), (0, 10)),
            get(1, "a", Some("a1"), Some(1), (20, 30)),
        ]);
        assert_eq!(r.verdict(), "ok");
    }

    #[test]
    fn any_level_reads_are_not_checked() {
        let mut op = get(0, "a", Some("x"), Some(9), (0, 10));
        op.kind = OpKind::Get { key: "a".into(), level: ReadLevel::Any, result: Some("x".into()) };
        let r = verdict(vec![op]);
        assert_eq!((r.reads, r.verdict()), (0, "ok"));
    }
}
