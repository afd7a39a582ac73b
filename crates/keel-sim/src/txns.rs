//! Transactions in the simulated workload, as a Redis client runs them: `WATCH` a few
//! `t*` keys (each a `linearizable` read, one after the other, recording the version
//! read), think a moment, then `MULTI` ... `EXEC` as one [`Command::Multi`] carrying the
//! watched versions. The outcome becomes a `txn` record of the history
//! (`keel_check::history::Txn`), judged by `keel_check::txn` against the final log.
//!
//! Clients of odd number read their watched keys as a script does (`Fetch`, the item whole
//! with its version) and write as a script's write-back does (`Restore` of a string
//! item, which replaces the key as a put does); the others with `Get` and `Put`.
//!
//! What a transaction holds: 1 to 4 operations on the `t*` keys (reads, writes, deletes,
//! and increments, which fail on the words `t*` keys mostly hold and so make the whole
//! transaction fail), at least one of them a write, so that a committed transaction
//! always learns its entry's version. Other clients write and delete the same few keys,
//! with transactions and plain operations alike (`Clients::next_t_operation`), so watched
//! keys change, deletes included, between `WATCH` and `EXEC`.

use crate::rng::Rng;
use keel_check::history::{Outcome, Txn, TxnOp, Watched};
use keel_types::{Command, CommandResult, Durability, KeelError, Version};

/// Most keys one transaction watches.
pub const WATCHED_MAX: u64 = 2;
/// Most operations in one simulated transaction.
pub const OPS_MAX: u64 = 4;
/// Of the operations on `t*` keys, the share (ppm) that are transactions; the rest are
/// plain reads, writes and deletes of the same keys.
pub const TXN_SHARE_PPM: u32 = 600_000;

/// The name of `t*` key slot `slot`.
pub fn key_name(slot: u64) -> String {
    format!("t{slot}")
}

/// A transaction drawn, not yet run: its record (results to be filled) and the keys its
/// `WATCH` reads, in order.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The history record, with `watch` empty and results unset.
    pub txn: Txn,
    /// The keys to watch, in the order they are read.
    pub watch: Vec<String>,
}

/// Draws a transaction of client `client` (its `request`-th request) over `keys` `t*`
/// keys; `suffix` ends every value written (the keyspace's, with several).
pub fn draw(
    rng: &mut Rng,
    client: u64,
    request: u64,
    keys: u64,
    durabilities: &[Durability],
    suffix: &str,
) -> Plan {
    let key = |rng: &mut Rng| key_name(rng.range(0, keys));
    let mut watch: Vec<String> = (0..rng.range(0, WATCHED_MAX + 1)).map(|_| key(rng)).collect();
    watch.dedup();
    let n = rng.range(1, OPS_MAX + 1);
    let mut ops = Vec::new();
    for i in 0..n {
        let key = key(rng);
        let op = match rng.range(0, 20) {
            0..=5 => TxnOp::Get { key, result: None, version: None },
            6..=12 => TxnOp::Put { key, value: format!("c{client}r{request}o{i}{suffix}") },
            13..=16 => TxnOp::Delete { key },
            _ => TxnOp::Incr { key, delta: rng.range(1, 6) as i64, result: None },
        };
        ops.push(op);
    }
    if ops.iter().all(|op| matches!(op, TxnOp::Get { .. })) {
        let key = ops[0].key().to_string();
        ops.push(TxnOp::Put { key, value: format!("c{client}r{request}o{n}{suffix}") });
    }
    let durability = durabilities[rng.index(durabilities.len())];
    let txn = Txn {
        id: 0,
        client,
        watch: Vec::new(),
        ops,
        durability,
        invoke_ns: 0,
        complete_ns: None,
        outcome: Outcome::Unknown,
        aborted: false,
        node: None,
        version: None,
    };
    Plan { txn, watch }
}

/// The command `EXEC` sends for `txn`: its operations and what `WATCH` read.
pub fn command(txn: &Txn) -> Command {
    let bytes = |s: &str| s.as_bytes().to_vec().into();
    let ops = txn
        .ops
        .iter()
        .map(|op| match op {
            TxnOp::Get { key, .. } => Command::Get { key: bytes(key) },
            // Clients of odd number write as a script's write-back does: the item whole.
            TxnOp::Put { key, value } if txn.client % 2 == 1 => Command::Restore {
                key: bytes(key),
                image: keel_core::leader::kv_image::string(value.as_bytes()),
            },
            TxnOp::Put { key, value } => Command::Put { key: bytes(key), value: bytes(value) },
            TxnOp::Delete { key } => Command::Delete { key: bytes(key) },
            TxnOp::Incr { key, delta, .. } => Command::Incr { key: bytes(key), delta: *delta },
        })
        .collect();
    let watch = txn.watch.iter().map(|w| (bytes(&w.key), w.version)).collect();
    Command::Multi { ops, watch }
}

/// The watched key `key` read at `version`.
pub fn watched(key: String, version: Option<Version>) -> Watched {
    Watched { key, version }
}

/// Fills `txn`'s outcome from `EXEC`'s reply: committed with each operation's result and
/// the entry's version, aborted by `WATCH`, failed (an operation failed: nothing
/// applied), or unknown. Returns the outcome's name for the run's coverage.
pub fn complete(txn: &mut Txn, result: &Result<CommandResult, KeelError>) -> &'static str {
    match result {
        Ok(CommandResult::Multi { results: Some(results) }) => {
            assert_eq!(results.len(), txn.ops.len(), "one result per operation");
            for (op, result) in txn.ops.iter_mut().zip(results) {
                fill(op, result);
            }
            txn.version = Some(
                results
                    .iter()
                    .filter_map(CommandResult::written_version)
                    .max()
                    .expect("a simulated transaction writes"),
            );
            txn.outcome = Outcome::Ok;
            "txn-committed"
        }
        Ok(CommandResult::Multi { results: None }) => {
            txn.outcome = Outcome::Fail;
            txn.aborted = true;
            "txn-aborted"
        }
        Ok(other) => panic!("a transaction answered {other:?}"),
        Err(KeelError::Timeout | KeelError::SessionExpired) => {
            txn.outcome = Outcome::Unknown;
            "txn-unknown"
        }
        Err(e) if e.is_retryable() => {
            txn.outcome = Outcome::Unknown;
            "txn-unknown"
        }
        Err(_) => {
            txn.outcome = Outcome::Fail;
            "txn-failed"
        }
    }
}

/// Records one operation's result in the history's form.
fn fill(op: &mut TxnOp, result: &CommandResult) {
    let text =
        |v: &Option<keel_types::Value>| v.as_ref().map(|b| String::from_utf8_lossy(b).into_owned());
    match (op, result) {
        (TxnOp::Get { result, version, .. }, CommandResult::Value { value, version: v }) => {
            *result = text(value);
            *version = *v;
        }
        (TxnOp::Put { .. } | TxnOp::Delete { .. }, CommandResult::Written { .. }) => {}
        (TxnOp::Incr { result, .. }, CommandResult::Counter { value, .. }) => {
            *result = Some(*value);
        }
        (op, result) => panic!("result {result:?} does not answer {op:?}"),
    }
}

/// Appends `suffix` to every key `txn` names (a combined history's `@<keyspace>`).
pub fn rename_keys(txn: &mut Txn, suffix: &str) {
    for watched in &mut txn.watch {
        watched.key.push_str(suffix);
    }
    for op in &mut txn.ops {
        match op {
            TxnOp::Get { key, .. }
            | TxnOp::Put { key, .. }
            | TxnOp::Delete { key }
            | TxnOp::Incr { key, .. } => key.push_str(suffix),
        }
    }
}

/// The (key, value) each committed write of `txn` left, the last per key (`None`: a
/// delete), for the oracle.
pub fn net_writes(txn: &Txn) -> Vec<(String, Option<String>)> {
    let mut left: Vec<(String, Option<String>)> = Vec::new();
    for op in &txn.ops {
        let write = match op {
            TxnOp::Get { .. } => continue,
            TxnOp::Put { key, value } => (key.clone(), Some(value.clone())),
            TxnOp::Delete { key } => (key.clone(), None),
            TxnOp::Incr { key, result, .. } => (key.clone(), result.map(|r| r.to_string())),
        };
        left.retain(|(k, _)| *k != write.0);
        left.push(write);
    }
    left
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drawn_transaction_writes_and_its_reply_fills_it() {
        let mut rng = Rng::new(3);
        for request in 0..200 {
            let plan = draw(&mut rng, 1, request, 2, &Durability::ALL, "");
            assert!(plan.txn.ops.iter().any(|op| !matches!(op, TxnOp::Get { .. })));
            assert!(plan.watch.len() <= WATCHED_MAX as usize);
            let Command::Multi { ops, watch } = command(&plan.txn) else { panic!() };
            assert_eq!((ops.len(), watch.len()), (plan.txn.ops.len(), 0));
        }
        let mut txn = draw(&mut Rng::new(5), 1, 1, 1, &[Durability::Memory], "").txn;
        txn.ops = vec![
            TxnOp::Get { key: "t0".into(), result: None, version: None },
            TxnOp::Put { key: "t0".into(), value: "x".into() },
            TxnOp::Incr { key: "t0".into(), delta: 1, result: None },
        ];
        let v = Version::new(2, 9);
        let results = vec![
            CommandResult::Value { value: Some("old".into()), version: Some(Version::new(1, 3)) },
            CommandResult::Written { version: v },
            CommandResult::Counter { value: 4, version: v },
        ];
        let reply = Ok(CommandResult::Multi { results: Some(results) });
        assert_eq!(complete(&mut txn, &reply), "txn-committed");
        assert_eq!((txn.outcome, txn.version), (Outcome::Ok, Some(v)));
        assert_eq!(net_writes(&txn), [("t0".to_string(), Some("4".to_string()))]);
        let mut aborted = txn.clone();
        assert_eq!(
            complete(&mut aborted, &Ok(CommandResult::Multi { results: None })),
            "txn-aborted"
        );
        assert!(aborted.aborted && aborted.outcome == Outcome::Fail);
        let mut failed = txn.clone();
        assert_eq!(complete(&mut failed, &Err(KeelError::NotAnInteger)), "txn-failed");
        let mut unknown = txn;
        assert_eq!(complete(&mut unknown, &Err(KeelError::Timeout)), "txn-unknown");
    }
}
