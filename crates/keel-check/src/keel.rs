//! What the linearizability check of a Keel history looks at.
//!
//! `any` and `monotonic` reads make no linearizability promise, so [`lin_ops`] keeps:
//! - gets at level `linearizable` with outcome `ok` (a get with outcome `fail` or
//!   `unknown` constrains nothing and is dropped);
//! - every write (put, delete, cas, incr) whatever its durability: `ok` as recorded,
//!   `unknown` as pending forever (it may take effect at any point after its invocation,
//!   or never), `fail` dropped (it did not take effect), except a cas `fail`, which is a
//!   read that saw something other than `expected`.
//!
//! A recorded completion time of an op with outcome `unknown` is ignored.

use crate::history::{Op, OpKind, Outcome};
use crate::model::{Action, LinOp};
use keel_types::ReadLevel;

/// The ops of `ops` that the linearizability check uses, in the same order.
///
/// Panics if an op with outcome `ok` or `fail` has no `complete_ns` (the reader rejects
/// such files; a recorder building a history in memory must not produce one).
pub fn lin_ops(ops: &[Op]) -> Vec<LinOp> {
    ops.iter().filter_map(lin_op).collect()
}

fn lin_op(op: &Op) -> Option<LinOp> {
    let complete = match op.outcome {
        Outcome::Unknown => None,
        Outcome::Ok | Outcome::Fail => {
            Some(op.complete_ns.expect("the reader checked ok/fail ops complete"))
        }
    };
    let action = match (&op.kind, op.outcome) {
        (OpKind::Get { level, result, .. }, Outcome::Ok) if *level == ReadLevel::Linearizable => {
            Action::Read { result: result.clone() }
        }
        (OpKind::Get { .. }, _) => return None,
        (OpKind::Cas { expected, value, .. }, outcome) => Action::Cas {
            expected: expected.clone(),
            value: value.clone(),
            swapped: match outcome {
                Outcome::Ok => Some(true),
                Outcome::Fail => Some(false),
                Outcome::Unknown => None,
            },
        },
        (_, Outcome::Fail) => return None,
        (OpKind::Put { value, .. }, _) => Action::Write { value: value.clone() },
        (OpKind::Delete { .. }, _) => Action::Delete,
        (OpKind::Incr { delta, result, .. }, outcome) => Action::Incr {
            delta: *delta,
            result: if outcome == Outcome::Ok { *result } else { None },
        },
    };
    debug_assert!(complete.is_some() || op.outcome == Outcome::Unknown);
    Some(LinOp {
        id: op.id,
        client: op.client,
        key: op.kind.key().to_string(),
        action,
        invoke: op.invoke_ns,
        complete,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_types::Durability;

    fn op(kind: OpKind, outcome: Outcome) -> Op {
        Op {
            id: 1,
            client: 2,
            kind,
            invoke_ns: 10,
            complete_ns: Some(20),
            outcome,
            node: None,
            version: None,
            views: Vec::new(),
        }
    }

    fn get(level: ReadLevel) -> OpKind {
        OpKind::Get { key: "k".into(), level, result: Some("v".into()) }
    }

    #[test]
    fn only_linearizable_ok_gets_are_kept() {
        assert_eq!(lin_ops(&[op(get(ReadLevel::Any), Outcome::Ok)]), vec![]);
        assert_eq!(lin_ops(&[op(get(ReadLevel::Monotonic), Outcome::Ok)]), vec![]);
        assert_eq!(lin_ops(&[op(get(ReadLevel::Linearizable), Outcome::Unknown)]), vec![]);
        let kept = lin_ops(&[op(get(ReadLevel::Linearizable), Outcome::Ok)]);
        assert_eq!(kept[0].action, Action::Read { result: Some("v".into()) });
    }

    #[test]
    fn failed_writes_drop_but_failed_cas_is_a_read() {
        let put =
            OpKind::Put { key: "k".into(), value: "v".into(), durability: Durability::Memory };
        assert_eq!(lin_ops(&[op(put.clone(), Outcome::Fail)]), vec![]);
        let unknown = lin_ops(&[op(put, Outcome::Unknown)]);
        assert_eq!(unknown[0].complete, None, "unknown ops never complete");
        let cas = OpKind::Cas {
            key: "k".into(),
            expected: None,
            value: "v".into(),
            durability: Durability::Durable,
        };
        let kept = lin_ops(&[op(cas, Outcome::Fail)]);
        assert!(matches!(kept[0].action, Action::Cas { swapped: Some(false), .. }));
        assert_eq!(kept[0].complete, Some(20));
    }
}
