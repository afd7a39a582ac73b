//! Checks the views of reads invoked as Correctables (`docs/correctables.md`,
//! `docs/checkers.md`).
//!
//! Rules, per read with preliminary views ([`Op::views`]):
//! - **order**: the views' levels strictly increase and stay below the read's own level
//!   (its final view); they came in order (`at_ns` never decreases) within the read,
//!   from invocation to completion;
//! - **freshness**: the final view's version is at least that of every preliminary view
//!   at `monotonic` or stronger (such a view is never lost, and the final one is read
//!   after it); an `any` view promises nothing of the kind;
//! - **each view passes its level's checker**: [`expand`] turns every preliminary view
//!   into a read of its own, so the monotonic-reads checker judges `monotonic` views as it
//!   judges reads; the final view is the read itself.
//!
//! A read closes exactly once by construction: one op record holds it.

use crate::history::{KeelHistory, Op, OpKind, Outcome};
use keel_types::ReadLevel;

/// Most violations kept in a report.
pub const VIOLATIONS_SHOWN_MAX: usize = 10;

/// What the views check found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Reads with preliminary views.
    pub invocations: usize,
    /// Preliminary views checked.
    pub views: usize,
    /// Violations found, in total.
    pub violations_total: usize,
    /// The first violations, as text (at most [`VIOLATIONS_SHOWN_MAX`]).
    pub violations: Vec<String>,
}

impl Report {
    /// `ok` or `violation`.
    pub fn verdict(&self) -> &'static str {
        crate::verdict(self.violations_total == 0)
    }

    fn violate(&mut self, rule: &str, op: &Op, what: String) {
        self.violations_total += 1;
        if self.violations.len() < VIOLATIONS_SHOWN_MAX {
            self.violations.push(format!("{rule}: op {} client {}: {what}", op.id, op.client));
        }
    }
}

/// Checks the order and freshness rules over every read with views.
pub fn check(history: &KeelHistory) -> Report {
    let mut report = Report::default();
    for op in history.ops.iter().filter(|op| !op.views.is_empty()) {
        report.invocations += 1;
        report.views += op.views.len();
        let OpKind::Get { level: final_level, .. } = &op.kind else {
            report.violate("order", op, "views on an op that is not a read".into());
            continue;
        };
        let mut last: Option<(ReadLevel, u64)> = None;
        for view in &op.views {
            if last.is_some_and(|(level, _)| view.level <= level) || view.level >= *final_level {
                let what = format!(
                    "a view at {} after {} (final view at {})",
                    view.level.as_str(),
                    last.map_or("nothing", |(level, _)| level.as_str()),
                    final_level.as_str()
                );
                report.violate("order", op, what);
            }
            let late = op.complete_ns.is_some_and(|complete| view.at_ns > complete);
            if view.at_ns < op.invoke_ns || late || last.is_some_and(|(_, at)| view.at_ns < at) {
                let what = format!("a view at {} ns, out of its read's time or order", view.at_ns);
                report.violate("order", op, what);
            }
            last = Some((view.level, view.at_ns));
            let fresh_needed = view.level >= ReadLevel::Monotonic && op.outcome == Outcome::Ok;
            if fresh_needed && op.version < view.version {
                let what = format!(
                    "final view at version {} is older than the {} view's {}",
                    op.version.map_or("null".into(), |v| v.to_string()),
                    view.level.as_str(),
                    view.version.map_or("null".into(), |v| v.to_string()),
                );
                report.violate("freshness", op, what);
            }
        }
    }
    report
}

/// The history with each preliminary view also as a read of its own: same key and client
/// as its read, invoked with it, completed when the view came, at the view's level, with
/// a fresh id. Other checkers then judge the views as reads.
pub fn expand(history: &KeelHistory) -> KeelHistory {
    let mut expanded = history.clone();
    let ids = history.ops.iter().map(|op| op.id).chain(history.txns.iter().map(|t| t.id));
    let mut next_id = ids.max().map_or(0, |id| id + 1);
    for op in history.ops.iter().filter(|op| !op.views.is_empty()) {
        let OpKind::Get { key, .. } = &op.kind else { continue };
        for view in &op.views {
            expanded.ops.push(Op {
                id: next_id,
                client: op.client,
                kind: OpKind::Get {
                    key: key.clone(),
                    level: view.level,
                    result: view.result.clone(),
                },
                invoke_ns: op.invoke_ns,
                complete_ns: Some(view.at_ns),
                outcome: Outcome::Ok,
                node: op.node,
                version: view.version,
                views: Vec::new(),
            });
            next_id += 1;
        }
    }
    expanded
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Survivor, View};
    use crate::monotonic;
    use keel_types::{Durability, Version};

    fn write(id: u64, index: u64, value: &str, at: u64) -> Op {
        Op {
            id,
            client: 9,
            kind: OpKind::Put {
                key: "k".into(),
                value: value.into(),
                durability: Durability::Durable,
            },
            invoke_ns: at,
            complete_ns: Some(at + 1),
            outcome: Outcome::Ok,
            node: Some(1),
            version: Some(Version::new(1, index)),
            views: Vec::new(),
        }
    }

    /// A read at `linearizable` (invoked at 100, complete at 200) that returned version
    /// `index` with the given views `(level, index, at_ns)`.
    fn invoked(id: u64, index: u64, views: &[(ReadLevel, u64, u64)]) -> Op {
        Op {
            id,
            client: id,
            kind: OpKind::Get {
                key: "k".into(),
                level: ReadLevel::Linearizable,
                result: Some(format!("v{index}")),
            },
            invoke_ns: 100,
            complete_ns: Some(200),
            outcome: Outcome::Ok,
            node: Some(2),
            version: Some(Version::new(1, index)),
            views: views
                .iter()
                .map(|(level, index, at)| View {
                    level: *level,
                    result: Some(format!("v{index}")),
                    version: Some(Version::new(1, *index)),
                    at_ns: *at,
                })
                .collect(),
        }
    }

    fn history(ops: Vec<Op>) -> KeelHistory {
        let survivors = [1, 2]
            .map(|i| Survivor {
                version: Version::new(1, i),
                key: "k".into(),
                value: Some(format!("v{i}")),
            })
            .to_vec();
        KeelHistory { ops, survivors, ..KeelHistory::default() }
    }

    #[test]
    fn views_in_order_and_no_fresher_than_the_final_one_pass() {
        let h = history(vec![
            write(0, 1, "v1", 0),
            write(1, 2, "v2", 50),
            invoked(2, 2, &[(ReadLevel::Any, 1, 120), (ReadLevel::Monotonic, 2, 150)]),
        ]);
        let report = check(&h);
        assert_eq!((report.invocations, report.views, report.verdict()), (1, 2, "ok"));
        assert_eq!(monotonic::check(&expand(&h)).verdict(), "ok");
    }

    #[test]
    fn an_any_view_newer_than_the_final_one_is_divergence_not_a_violation() {
        let h = history(vec![write(0, 1, "v1", 0), invoked(1, 1, &[(ReadLevel::Any, 2, 120)])]);
        assert_eq!(check(&h).verdict(), "ok");
    }

    #[test]
    fn a_final_view_older_than_a_monotonic_one_is_caught() {
        // Negative control: a stale final view.
        let h =
            history(vec![write(0, 2, "v2", 0), invoked(1, 1, &[(ReadLevel::Monotonic, 2, 150)])]);
        let report = check(&h);
        assert_eq!(report.verdict(), "violation");
        assert!(report.violations[0].starts_with("freshness"), "{report:?}");
    }

    #[test]
    fn views_out_of_level_or_time_order_are_caught() {
        let cases = [
            vec![(ReadLevel::Monotonic, 1, 120), (ReadLevel::Any, 1, 130)],
            vec![(ReadLevel::Any, 1, 120), (ReadLevel::Any, 1, 130)],
            vec![(ReadLevel::Linearizable, 1, 120)],
            vec![(ReadLevel::Any, 1, 150), (ReadLevel::Monotonic, 1, 140)],
            vec![(ReadLevel::Any, 1, 250)],
        ];
        for views in cases {
            let h = history(vec![write(0, 1, "v1", 0), invoked(1, 1, &views)]);
            let report = check(&h);
            assert_eq!(report.verdict(), "violation", "{views:?}");
            assert!(report.violations[0].starts_with("order"), "{report:?}");
        }
    }

    #[test]
    fn a_stale_monotonic_view_is_judged_by_the_monotonic_checker() {
        // Client 5 read v2 at monotonic and completed; a later invocation's monotonic
        // view shows v1: a monotonic read going back, though its final view is fresh.
        let mut earlier = invoked(5, 2, &[]);
        earlier.kind =
            OpKind::Get { key: "k".into(), level: ReadLevel::Monotonic, result: Some("v2".into()) };
        earlier.invoke_ns = 10;
        earlier.complete_ns = Some(20);
        let h = history(vec![
            write(0, 1, "v1", 0),
            write(1, 2, "v2", 5),
            earlier,
            invoked(6, 2, &[(ReadLevel::Monotonic, 1, 150)]),
        ]);
        assert_eq!(monotonic::check(&h).verdict(), "ok", "the views alone are not reads");
        assert_eq!(monotonic::check(&expand(&h)).verdict(), "violation");
    }
}
