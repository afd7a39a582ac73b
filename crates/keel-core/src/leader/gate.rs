//! The leader engine's validation gate: what a message (or persisted state) must satisfy
//! before the engine acts on it. Decoding checks syntax; this checks the protocol's rules.
//!
//! Two halves:
//! - [`check`]: stateless, on the message alone. Epochs at most [`EPOCH_MAX`], indexes at
//!   most [`LOG_INDEX_MAX`], a candidate's log no newer than its epoch, an `Append`'s
//!   entries contiguous after `prev`, their epochs non-decreasing and no newer than the
//!   sender's, only writes in log entries, snapshot chunks inside their snapshot.
//! - stateful rules, where the state is: an `Append`'s entries may not conflict with the
//!   durable prefix, nor with the prefix verified in the same epoch, nor go back past the
//!   snapshot's epoch ([`check_entries_against_log`]); only one leader per epoch; a
//!   follower's reply may not match past the leader's log or echo a send time from the
//!   future (`leading/replication.rs`); a snapshot may not conflict with the same
//!   prefixes ([`check_snapshot_against_log`]). These run before the message counts as
//!   contact from a leader. A snapshot that does not decode once whole is discarded later
//!   (`follower.rs`), after its chunks were accepted from the epoch's leader.
//!
//! A message that fails is dropped and reported in `Outputs::rejected`; the engine's
//! state is untouched. [`check_persisted`] applies the same rules to what a node
//! recovers from its disk, so that a damaged or forged data directory stops the node
//! with a message instead of a panic.

use super::core::Core;
use super::io::{Message, PersistedState};
use keel_types::limits::{EPOCH_MAX, LOG_INDEX_MAX};
use keel_types::{Command, Entry, EntryPayload, Epoch, LogIndex, SnapshotMeta};

fn epoch_ok(epoch: Epoch) -> bool {
    epoch.0 <= EPOCH_MAX
}

fn index_ok(index: LogIndex) -> bool {
    index.0 <= LOG_INDEX_MAX
}

/// The stateless half: `Err` names the rule `message` breaks.
pub fn check(message: &Message) -> Result<(), &'static str> {
    match message {
        Message::PreVote { epoch, last_epoch, last_index }
        | Message::RequestVote { epoch, last_epoch, last_index, .. }
        | Message::TimeoutNow { epoch, last_epoch, last_index } => {
            check_epoch(*epoch)?;
            check_index(*last_index)?;
            if last_epoch > epoch {
                return Err("a candidate's log is newer than its epoch");
            }
            Ok(())
        }
        Message::PreVoteReply { epoch, .. } | Message::Vote { epoch, .. } => check_epoch(*epoch),
        Message::Append { .. } => check_append(message),
        Message::AppendReply {
            epoch,
            last_index,
            persisted_index,
            applied_index,
            match_index,
            ..
        } => {
            check_epoch(*epoch)?;
            for index in [last_index, persisted_index, applied_index, match_index] {
                check_index(*index)?;
            }
            Ok(())
        }
        Message::InstallSnapshot { epoch, meta, offset, total, data } => {
            check_epoch(*epoch)?;
            check_index(meta.last_index)?;
            if meta.last_epoch > *epoch {
                return Err("a snapshot newer than its sender's epoch");
            }
            if meta.last_index == LogIndex::ZERO || *total == 0 {
                return Err("an empty snapshot");
            }
            let end = offset.checked_add(data.len() as u64);
            if end.is_none_or(|end| end > *total) {
                return Err("a snapshot chunk past the snapshot's end");
            }
            Ok(())
        }
        Message::InstallSnapshotReply { epoch, last_index, .. } => {
            check_epoch(*epoch)?;
            check_index(*last_index)
        }
        Message::Forward { epoch, .. } | Message::ForwardReply { epoch, .. } => check_epoch(*epoch),
    }
}

fn check_epoch(epoch: Epoch) -> Result<(), &'static str> {
    if epoch_ok(epoch) {
        Ok(())
    } else {
        Err("epoch out of range")
    }
}

fn check_index(index: LogIndex) -> Result<(), &'static str> {
    if index_ok(index) {
        Ok(())
    } else {
        Err("log index out of range")
    }
}

fn check_append(message: &Message) -> Result<(), &'static str> {
    let Message::Append {
        epoch,
        prev_epoch,
        prev_index,
        entries,
        commit_index,
        durable_index,
        flush_through,
        ..
    } = message
    else {
        unreachable!("called on an Append")
    };
    check_epoch(*epoch)?;
    for index in [prev_index, commit_index, durable_index] {
        check_index(*index)?;
    }
    if flush_through.is_some_and(|i| !index_ok(i)) {
        return Err("log index out of range");
    }
    if prev_epoch > epoch {
        return Err("an append's previous entry is newer than its sender's epoch");
    }
    check_entries(*epoch, *prev_epoch, *prev_index, entries)
}

/// Entries contiguous after `(prev_epoch, prev_index)`, epochs non-decreasing from
/// `prev_epoch` and at most `epoch`, only writes.
fn check_entries<'a>(
    epoch: Epoch,
    prev_epoch: Epoch,
    prev_index: LogIndex,
    entries: impl IntoIterator<Item = &'a Entry>,
) -> Result<(), &'static str> {
    let mut expected = prev_index;
    let mut last_epoch = prev_epoch;
    for entry in entries {
        if expected.0 >= LOG_INDEX_MAX || entry.index.0 != expected.0 + 1 {
            return Err("entries are not contiguous");
        }
        expected = entry.index;
        if entry.epoch < last_epoch || entry.epoch > epoch {
            return Err("entry epochs go back or past the sender's epoch");
        }
        last_epoch = entry.epoch;
        match &entry.payload {
            EntryPayload::Write { command, .. } if !command.is_write() => {
                return Err("a read inside a log entry");
            }
            // Never written so: a leader logs a membership change as its own entry, and a
            // geo operation never reaches an ORCA log.
            EntryPayload::Write { command: Command::Cluster(_) | Command::Geo(_), .. } => {
                return Err("a cluster change or a geo operation inside a write entry");
            }
            EntryPayload::Write { command: Command::Slot(op), .. } if !op.valid() => {
                return Err("a slot step out of range or with keys of another slot");
            }
            // Never written so: a client's transaction holds only what
            // `Command::fits_in_multi` allows (the fuzzer made one holding a scan, which
            // the state machine would take for a write).
            EntryPayload::Write { command: Command::Multi { ops, .. }, .. }
                if !ops.iter().all(Command::fits_in_multi) =>
            {
                return Err("a transaction holding what no transaction may");
            }
            // Never written so: a collection command passed its own rules at the door
            // (the fuzzer made a store with no source, and a transaction's `HMGET` of no
            // field, which the state machine must not be handed).
            EntryPayload::Write { command, .. } if !collection_shapes_hold(command) => {
                return Err("a collection command breaking its own rules");
            }
            EntryPayload::Membership(membership) if !membership.valid() => {
                return Err("a membership that is not sorted, disjoint and in bounds");
            }
            EntryPayload::Reap { keys, .. }
                if keys.is_empty()
                    || keys.len() > keel_types::REAP_KEYS_MAX
                    || keys.windows(2).any(|pair| pair[0] >= pair[1]) =>
            {
                return Err("an expiry entry's keys are not 1 to 64 in increasing order");
            }
            _ => {}
        }
    }
    Ok(())
}

/// Whether every collection write or read in `command` (itself, or inside a transaction)
/// keeps its own rules (`CollOp::check_shape`, `CollRead::check_shape`).
fn collection_shapes_hold(command: &Command) -> bool {
    match command {
        Command::Coll { op, .. } => op.check_shape().is_ok(),
        Command::CollRead { op, .. } => op.check_shape().is_ok(),
        Command::Multi { ops, .. } => ops.iter().all(collection_shapes_hold),
        _ => true,
    }
}

/// An `Append`'s entries against this node's log. None may replace an entry at or below
/// `floor`: the durable index (the durable prefix is in every later leader's log) or, for
/// a follower of the `Append`'s own epoch, the prefix already verified to match that
/// epoch's leader (one leader per epoch, whose log only grows). None above the snapshot
/// may be older than the snapshot's last entry (a log's epochs never go back).
pub(super) fn check_entries_against_log(
    core: &Core,
    floor: LogIndex,
    prev_index: LogIndex,
    entries: &[Entry],
) -> Result<(), &'static str> {
    let base = core.log.snapshot();
    if entries.iter().any(|e| e.index > base.last_index && e.epoch < base.last_epoch) {
        return Err("entries older than the snapshot");
    }
    if entries.is_empty() || prev_index >= floor {
        return Ok(());
    }
    let conflicts = entries
        .iter()
        .take_while(|e| e.index <= floor)
        .filter(|e| e.index > base.last_index)
        .any(|e| core.log.epoch_at(e.index).is_some_and(|held| held != e.epoch));
    if conflicts {
        return Err("entries conflict with the durable or verified prefix");
    }
    Ok(())
}

/// A snapshot against this node's log: one whose last entry is at or below `floor` (see
/// [`check_entries_against_log`]) must agree with the log there.
pub(super) fn check_snapshot_against_log(
    core: &Core,
    floor: LogIndex,
    meta: &SnapshotMeta,
) -> Result<(), &'static str> {
    let s = meta.last_index;
    let covered =
        s <= core.log.snapshot().last_index || core.log.epoch_at(s) == Some(meta.last_epoch);
    if !covered && s <= floor {
        return Err("snapshot conflicts with the durable or verified prefix");
    }
    Ok(())
}

/// What a node recovered: `Err` says what the engine could not have written.
pub(super) fn check_persisted(persisted: &PersistedState) -> Result<(), String> {
    let hard = persisted.hard_state;
    if !epoch_ok(hard.epoch) {
        return Err(format!("hard state epoch {} is out of range", hard.epoch.0));
    }
    let (base_index, base_epoch) = match &persisted.snapshot {
        Some((meta, _)) => (meta.last_index, meta.last_epoch),
        None => (LogIndex::ZERO, Epoch(0)),
    };
    if base_epoch > hard.epoch || !index_ok(base_index) {
        return Err(format!("the snapshot at {base_index} is newer than the hard state"));
    }
    let entries = persisted.entries.iter().filter(|e| e.index > base_index);
    check_entries(hard.epoch, base_epoch, base_index, entries)
        .map_err(|rule| format!("the recovered log breaks a rule: {rule}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_types::{ClientId, ClusterOp, Durability, NodeId, RequestId};

    fn write(epoch: u64, index: u64, command: Command) -> Entry {
        let payload = EntryPayload::Write {
            client: ClientId(1),
            request: RequestId(index),
            durability: Durability::Memory,
            command,
        };
        Entry { epoch: Epoch(epoch), index: LogIndex(index), payload }
    }

    fn membership(epoch: u64, index: u64, voters: &[u32], learners: &[u32]) -> Entry {
        let ids = |ids: &[u32]| ids.iter().copied().map(NodeId).collect();
        let membership = keel_types::Membership { voters: ids(voters), learners: ids(learners) };
        Entry {
            epoch: Epoch(epoch),
            index: LogIndex(index),
            payload: EntryPayload::Membership(membership),
        }
    }

    fn put(epoch: u64, index: u64) -> Entry {
        write(epoch, index, Command::Put { key: b"k".to_vec().into(), value: b"v".to_vec().into() })
    }

    fn append(epoch: u64, prev: (u64, u64), entries: Vec<Entry>) -> Message {
        Message::Append {
            epoch: Epoch(epoch),
            prev_epoch: Epoch(prev.0),
            prev_index: LogIndex(prev.1),
            entries,
            commit_index: LogIndex(0),
            durable_index: LogIndex(0),
            lease: super::super::io::Lease::Withheld,
            flush_through: None,
            sent_at: crate::time::Time(0),
        }
    }

    #[test]
    fn well_formed_appends_pass_and_each_broken_rule_is_named() {
        assert_eq!(check(&append(3, (2, 4), vec![put(2, 5), put(3, 6)])), Ok(()));
        assert_eq!(check(&append(3, (2, 4), vec![membership(3, 5, &[1, 2, 3], &[4])])), Ok(()));
        let cases = [
            (append(3, (2, 4), vec![put(2, 6)]), "entries are not contiguous"),
            (append(3, (2, 4), vec![put(1, 5)]), "entry epochs go back or past the sender's epoch"),
            (append(3, (2, 4), vec![put(4, 5)]), "entry epochs go back or past the sender's epoch"),
            (
                append(3, (2, 4), vec![write(3, 5, Command::Get { key: b"k".to_vec().into() })]),
                "a read inside a log entry",
            ),
            (
                append(
                    3,
                    (2, 4),
                    vec![write(3, 5, Command::Cluster(ClusterOp::Promote(NodeId(4))))],
                ),
                "a cluster change or a geo operation inside a write entry",
            ),
            (
                append(3, (2, 4), vec![membership(3, 5, &[1, 2, 2], &[])]),
                "a membership that is not sorted, disjoint and in bounds",
            ),
            (
                append(3, (2, 4), vec![membership(3, 5, &[1, 2, 3], &[3])]),
                "a membership that is not sorted, disjoint and in bounds",
            ),
            (
                append(
                    3,
                    (2, 4),
                    vec![write(
                        3,
                        5,
                        Command::Coll {
                            key: b"k".to_vec().into(),
                            op: Box::new(keel_types::coll::CollOp::SStore {
                                how: keel_types::coll::Algebra::Inter,
                                sources: vec![],
                            }),
                        },
                    )],
                ),
                "a collection command breaking its own rules",
            ),
            (
                append(
                    3,
                    (2, 4),
                    vec![write(
                        3,
                        5,
                        Command::Multi { ops: vec![Command::Count { db: 0 }], watch: vec![] },
                    )],
                ),
                "a transaction holding what no transaction may",
            ),
            (
                append(
                    3,
                    (2, 4),
                    vec![write(
                        3,
                        5,
                        Command::Multi {
                            ops: vec![Command::CollRead {
                                key: b"h".to_vec().into(),
                                op: Box::new(keel_types::coll::CollRead::HGet {
                                    fields: vec![],
                                    many: false,
                                }),
                            }],
                            watch: vec![],
                        },
                    )],
                ),
                "a collection command breaking its own rules",
            ),
            (append(u64::MAX, (2, 4), vec![]), "epoch out of range"),
            (
                append(3, (4, 4), vec![]),
                "an append's previous entry is newer than its sender's epoch",
            ),
            (append(3, (2, u64::MAX), vec![]), "log index out of range"),
        ];
        for (message, reason) in cases {
            assert_eq!(check(&message), Err(reason), "{message:?}");
        }
    }

    #[test]
    fn votes_replies_and_snapshot_chunks_are_checked() {
        let vote = Message::RequestVote {
            epoch: Epoch(2),
            last_epoch: Epoch(3),
            last_index: LogIndex(1),
            transfer: false,
        };
        assert_eq!(check(&vote), Err("a candidate's log is newer than its epoch"));
        let reply = Message::Vote { epoch: Epoch(u64::MAX), granted: true };
        assert_eq!(check(&reply), Err("epoch out of range"));
        let chunk = |offset: u64, total: u64, len: usize| Message::InstallSnapshot {
            epoch: Epoch(2),
            meta: keel_types::SnapshotMeta { last_index: LogIndex(9), last_epoch: Epoch(2) },
            offset,
            total,
            data: vec![0; len],
        };
        assert_eq!(check(&chunk(0, 10, 10)), Ok(()));
        assert_eq!(check(&chunk(5, 10, 6)), Err("a snapshot chunk past the snapshot's end"));
        assert_eq!(check(&chunk(u64::MAX, 10, 1)), Err("a snapshot chunk past the snapshot's end"));
        assert_eq!(check(&chunk(0, 0, 0)), Err("an empty snapshot"));
    }

    #[test]
    fn recovered_state_the_engine_cannot_have_written_is_named() {
        let mut persisted = PersistedState::default();
        persisted.hard_state.epoch = Epoch(2);
        persisted.entries = vec![put(1, 1), put(2, 2)];
        assert_eq!(check_persisted(&persisted), Ok(()));
        persisted.entries = vec![put(1, 1), put(3, 2)];
        assert!(check_persisted(&persisted).unwrap_err().contains("epochs"));
        persisted.entries = vec![put(1, 1), put(1, 3)];
        assert!(check_persisted(&persisted).unwrap_err().contains("contiguous"));
        persisted.entries.clear();
        persisted.hard_state.epoch = Epoch(u64::MAX);
        assert!(check_persisted(&persisted).unwrap_err().contains("out of range"));
    }
}
