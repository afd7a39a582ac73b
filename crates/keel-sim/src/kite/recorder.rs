//! Records what simulated Kite sessions asked and were told, as a `keel-rc` history
//! (`keel_check::rc`), and gives each scripted step its result.

use super::world::KiteWorld;
use keel_check::rc::{RcKind, RcOp, Stamp as RcStamp};
use keel_core::engine::RequestTag;
use keel_core::kite::{KiteOp, KiteReply, KiteResult, RmwId, RmwOutcome, Stamp};
use keel_types::{Key, NodeId, Value};
use std::collections::BTreeMap;

/// The key named `n` in simulated histories.
pub fn key(n: u64) -> Key {
    Key::from(format!("k{n}"))
}

/// The number of a key made by [`key`].
pub fn key_number(key: &[u8]) -> u64 {
    std::str::from_utf8(key)
        .ok()
        .and_then(|s| s.strip_prefix('k'))
        .and_then(|s| s.parse().ok())
        .unwrap_or(u64::MAX)
}

/// A value as simulated sessions write it (a decimal number).
pub fn value(v: u64) -> Value {
    Value::from(v.to_string())
}

/// The number a value holds (`u64::MAX` for anything else, which no session writes).
pub fn number(v: &Value) -> u64 {
    std::str::from_utf8(v).ok().and_then(|s| s.parse().ok()).unwrap_or(u64::MAX)
}

fn stamp(s: Stamp) -> RcStamp {
    RcStamp { version: s.version, writer: s.writer, rmw: s.rmw }
}

/// One step's outcome as a scripted scenario reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    /// The value read (reads, acquires, read-modify-writes): `None` absent.
    pub read: Option<u64>,
    /// The stamp read.
    pub read_stamp: Stamp,
    /// The stamp written, if anything was.
    pub wrote: Option<Stamp>,
    /// The value written, if anything was.
    pub written: Option<u64>,
}

/// The history being recorded.
#[derive(Default)]
pub struct Recorder {
    ops: Vec<RcOp>,
    failed: Vec<bool>,
    by_tag: BTreeMap<RequestTag, usize>,
    /// What each request asked, and the client's number for it if it named it.
    requests: BTreeMap<RequestTag, (KiteOp, Option<u64>)>,
    seqs: BTreeMap<u64, u64>,
    machines: BTreeMap<u64, NodeId>,
    /// The history session a client's requests go to, when it is not the client's
    /// engine session (after its connection broke: [`Recorder::rename`]).
    aliases: BTreeMap<u64, u64>,
    /// Of each operation sent again, where it stood before ([`Recorder::retry`]): its
    /// session, number in it and machine, to return to if the retry is refused.
    retried_from: BTreeMap<usize, (u64, u64, u32)>,
}

impl Recorder {
    /// An empty history.
    pub fn new() -> Recorder {
        Recorder::default()
    }

    /// Submits `op` in `session` at `node` and records its invocation.
    pub fn submit(
        &mut self,
        world: &mut KiteWorld,
        node: NodeId,
        session: u64,
        op: KiteOp,
    ) -> RequestTag {
        self.submit_named(world, node, session, op, None)
    }

    /// Submits `op` as [`Recorder::submit`], named by its client as request `named` when
    /// given ([`KiteWorld::submit_named`]).
    pub fn submit_named(
        &mut self,
        world: &mut KiteWorld,
        node: NodeId,
        session: u64,
        op: KiteOp,
        named: Option<u64>,
    ) -> RequestTag {
        let tag = world.submit_named(node, session, op.clone(), named);
        self.requests.insert(tag, (op.clone(), named));
        let session = self.aliases.get(&session).copied().unwrap_or(session);
        let seq = self.seqs.entry(session).or_default();
        *seq += 1;
        self.machines.insert(session, node);
        let (kind, arg, expected, strong) = match &op {
            KiteOp::Read { .. } => (RcKind::Read, None, None, false),
            KiteOp::Write { value, .. } => (RcKind::Write, Some(number(value)), None, false),
            KiteOp::Acquire { .. } => (RcKind::Acquire, None, None, false),
            KiteOp::Release { value, .. } => (RcKind::Release, Some(number(value)), None, false),
            KiteOp::Faa { delta, .. } => (RcKind::Faa, Some(*delta as u64), None, false),
            KiteOp::Cas { expected, new, strong, .. } => {
                (RcKind::Cas, Some(number(new)), expected.as_ref().map(number), *strong)
            }
            KiteOp::Reconfigure { .. } => {
                unreachable!("membership changes are not clients' operations")
            }
        };
        self.by_tag.insert(tag, self.ops.len());
        self.ops.push(RcOp {
            id: self.ops.len() as u64,
            session,
            machine: node.0,
            seq: *seq,
            kind,
            key: key_number(op.key()),
            invoke: world.now(),
            complete: None,
            read: None,
            wrote: None,
            arg,
            expected,
            strong,
        });
        self.failed.push(false);
        tag
    }

    /// From now on, records the requests `client` sends (in its engine session `client`)
    /// in the history session `history`: a client whose connection broke goes on as a new
    /// session, unordered with what it sent over the broken connection and never heard
    /// back about.
    pub fn rename(&mut self, client: u64, history: u64) {
        self.aliases.insert(client, history);
    }

    /// Sends the request of `tag` again, as its client does when the connection broke
    /// before the reply came: at `node`, in the client's engine session `session`, with
    /// the same number if the client named it (not when it did not, or with `unnamed`: a
    /// retry is then a new request, which may be applied a second time). Both attempts
    /// are one operation of the history, which the first reply listened to completes; it
    /// moves to the session the client now records in ([`Recorder::rename`]), after what
    /// that session sent so far, keeping its first invocation time.
    pub fn retry(
        &mut self,
        world: &mut KiteWorld,
        tag: RequestTag,
        node: NodeId,
        session: u64,
        unnamed: bool,
    ) -> Option<RequestTag> {
        let (mut op, named) = self.requests.get(&tag).cloned()?;
        let named = named.filter(|_| !unnamed);
        // A weak CAS goes again as a strong one: a weak one could fail locally on this
        // node's copy without learning that its first attempt swapped.
        if let KiteOp::Cas { strong, .. } = &mut op {
            *strong = true;
        }
        let index = *self.by_tag.get(&tag)?;
        let again = world.submit_named(node, session, op.clone(), named);
        self.requests.insert(again, (op, named));
        self.by_tag.insert(again, index);
        let history = self.aliases.get(&session).copied().unwrap_or(session);
        let seq = self.seqs.entry(history).or_default();
        *seq += 1;
        let moved = &mut self.ops[index];
        self.retried_from.insert(index, (moved.session, moved.seq, moved.machine));
        moved.session = history;
        moved.seq = *seq;
        moved.machine = node.0;
        Some(again)
    }

    /// Records a reply delivered at global time `at`; returns what the step saw (`None`
    /// for an error, which Kite returns only for requests it never started, or for a late
    /// retry whose outcome is unknown).
    pub fn complete(&mut self, at: u64, reply: &KiteReply) -> Option<Seen> {
        let index = *self.by_tag.get(&reply.tag)?;
        if self.ops[index].complete.is_some() {
            // Another attempt of the request answered first.
            return None;
        }
        if let Err(keel_types::KeelError::SessionExpired) = &reply.result {
            // A retry refused because a later request of its client was done: it may have
            // been done, so it stays without a reply (its commit, if any, settles it),
            // back where it was sent first, unordered with the session the retry went to.
            // (Left in that session, it was ordered before the session's later requests,
            // which its first attempt, done or finished later, need not precede: Kite
            // general seed 810000389, a read after the refusal older than the FAA.)
            self.unretry(index);
            return None;
        }
        let named = self.requests.get(&reply.tag).is_some_and(|(_, named)| named.is_some());
        if let (Err(keel_types::KeelError::Unavailable(_)), true) = (&reply.result, named) {
            // A named request refused by a node that no longer votes: an earlier attempt
            // elsewhere may have been done, so it stays without a reply (its client sends
            // it again at a voter), unordered with the session it was refused in.
            self.unretry(index);
            return None;
        }
        // Answered: the operation stays where its last attempt put it.
        self.retried_from.remove(&index);
        let op = &mut self.ops[index];
        op.complete = Some(at);
        let result = match &reply.result {
            Ok(r) => r,
            Err(_) => {
                self.failed[index] = true;
                return None;
            }
        };
        let read_value = |v: &Option<Value>| v.as_ref().map(number);
        match result {
            KiteResult::Value { value, stamp: s } => {
                op.read = Some((stamp(*s), read_value(value)));
                Some(Seen { read: read_value(value), read_stamp: *s, wrote: None, written: None })
            }
            KiteResult::Written { stamp: s } => {
                op.wrote = Some((stamp(*s), op.arg.unwrap_or_default()));
                Some(Seen { read: None, read_stamp: Stamp::ZERO, wrote: Some(*s), written: op.arg })
            }
            KiteResult::Rmw { read, read_stamp, wrote, local } => {
                let read_number = read_value(read);
                let mut written = None;
                op.read = Some((stamp(*read_stamp), read_number));
                if *local {
                    // A weak compare-and-swap that failed locally is a relaxed read.
                    op.kind = RcKind::Read;
                    op.arg = None;
                    op.expected = None;
                } else if let Some(w) = wrote {
                    let value_written = match op.kind {
                        RcKind::Faa => read_number.unwrap_or(0).wrapping_add(op.arg.unwrap_or(0)),
                        _ => op.arg.unwrap_or_default(),
                    };
                    op.wrote = Some((stamp(*w), value_written));
                    written = Some(value_written);
                }
                Some(Seen { read: read_number, read_stamp: *read_stamp, wrote: *wrote, written })
            }
        }
    }

    /// Operation `index`, sent again and refused without an outcome, goes back to where
    /// it stood before that retry (nothing if it was not sent again).
    fn unretry(&mut self, index: usize) {
        if let Some((session, seq, machine)) = self.retried_from.remove(&index) {
            let op = &mut self.ops[index];
            (op.session, op.seq, op.machine) = (session, seq, machine);
        }
    }

    /// The key a request touches.
    pub fn key_of(&self, tag: RequestTag) -> Option<u64> {
        self.by_tag.get(&tag).map(|&i| self.ops[i].key)
    }

    /// Fills in what read-modify-writes left without a reply wrote, when some node
    /// committed them (`commits`: by request id; `ids`: the id each request went by, by
    /// tag, as its engine numbered it).
    pub fn settle_rmws(
        &mut self,
        commits: &BTreeMap<RmwId, RmwOutcome>,
        ids: &BTreeMap<RequestTag, RmwId>,
    ) {
        for (&tag, &index) in &self.by_tag {
            let (op, failed) = (&mut self.ops[index], self.failed[index]);
            if failed || op.complete.is_some() || !matches!(op.kind, RcKind::Faa | RcKind::Cas) {
                continue;
            }
            if let Some(outcome) = ids.get(&tag).and_then(|id| commits.get(id)) {
                // A failure committed as a record keeping the value wrote nothing.
                op.wrote = outcome.wrote().map(|s| (stamp(s), number(&outcome.value)));
            }
        }
    }

    /// The session a request belongs to.
    pub fn session_of(&self, tag: RequestTag) -> Option<u64> {
        self.by_tag.get(&tag).map(|&i| self.ops[i].session)
    }

    /// The history: every request that was started (refused ones left out).
    pub fn history(&self) -> Vec<RcOp> {
        self.ops.iter().zip(&self.failed).filter(|(_, f)| !**f).map(|(op, _)| op.clone()).collect()
    }

    /// Completed operations.
    pub fn completed(&self) -> usize {
        self.ops.iter().zip(&self.failed).filter(|(op, f)| !**f && op.complete.is_some()).count()
    }

    /// Started operations.
    pub fn started(&self) -> usize {
        self.failed.iter().filter(|f| !**f).count()
    }
}
