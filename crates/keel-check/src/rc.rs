//! Release consistency: a checker for RC_Lin histories (the model of Kite, PPoPP 2020)
//! and the `keel-rc` history format (`docs/history-format.md`).
//!
//! A history is a set of [`RcOp`]s: relaxed reads and writes, acquires, releases and
//! read-modify-writes (FAA, CAS) on keys of a replicated store, each with the stamp of
//! the write it read or created. Every key's writes are totally ordered by [`Stamp`];
//! [`Stamp::ZERO`] is the initial value (absent) of every key. [`check`] applies the
//! rules below and returns an [`RcVerdict`]; each violation names its rule (the
//! constants of [`rule`]), the ops involved and, where it helps, the chain of edges
//! that proves it.
//!
//! # Terms
//!
//! - *Synchronization ops*: Acquire, Release, Faa, Cas. An RMW (Faa, Cas) is an acquire
//!   (its read) and a release (its write). A Cas that failed writes nothing: it is an
//!   acquire only. A *failed weak* Cas may complete locally (Kite's weak CAS), so it is
//!   exempt from the real-time rules (no real-time edges, rules 6 and 7); every other
//!   rule treats it as an acquire.
//! - *Effective writes*: the completed writes, and the writes of ops without a reply
//!   (`complete` null) that some read observed. An op without a reply that nobody read
//!   may never have taken effect and is left out of every order. A read of a stamp that no
//!   op recorded is *attributed* to an op without a reply (Write or Release, `wrote`
//!   null) on the key whose `arg` is the value read, or, when the stamp is an RMW's
//!   (`rmw` > 0), to an FAA or CAS without a reply on the key (a CAS only if its new value
//!   is the value read); the op then has that stamp.
//! - *Rank*: a write's place in its key's order of effective writes (1, 2, ...; 0 is the
//!   initial value). A read's rank is the rank of the write it read.
//! - *hb* (happens-before, §5.1 of the paper) is the transitive closure of:
//!   session order as the axioms require (any op → a later Release/RMW; Acquire/RMW →
//!   any later op; Release/RMW → a later Acquire/RMW; any op → a later op on the same key,
//!   all in the same session); synchronizes-with (a Release or RMW write → each Acquire
//!   or RMW that read it). Real time is not part of hb: it orders synchronization ops in
//!   rules 6 and 7, but it makes no acquire synchronize with a release it did not read.
//!
//! # Rules
//!
//! 0. [`rule::MALFORMED`]: the ops are well formed (the fields each kind needs, unique
//!    ids, unique `(session, seq)`, no completion before invocation). When this fails,
//!    nothing else is checked.
//! 1. Stamps: [`rule::ZERO_STAMP`] (a write with [`Stamp::ZERO`]),
//!    [`rule::DUPLICATE_STAMP`] (two ops recording the same key and stamp),
//!    [`rule::VALUE_MISMATCH`] (a read's value differs from the value written with the
//!    stamp it read, or a value read with the initial stamp), [`rule::PHANTOM_READ`] (a
//!    read of a stamp nobody wrote and no op without a reply can be attributed).
//! 2. RMWs: [`rule::FAA_ARITHMETIC`] (wrote ≠ read + delta, absent = 0, wrapping),
//!    [`rule::CAS_SEMANTICS`] (swapped iff the value read equals `expected`, and then
//!    wrote `arg`), [`rule::RMW_ATOMICITY`] (axiom 5: an RMW's write is the next
//!    effective write after the one it read: no write between), and
//!    [`rule::TWO_RMWS_ON_ONE_READ`] (two RMWs that both wrote read the same write).
//! 3. [`rule::HB_CYCLE`]: hb is acyclic. When it is not, rule 4 is not checked.
//! 4. Load value (axiom 6), for every completed read R (Read, Acquire, the read of an
//!    RMW) of write W on key k: [`rule::STALE_READ`] (no effective write on k newer than W
//!    happens-before R; with the initial value, no write on k at all),
//!    [`rule::FUTURE_READ`] (R does not happen-before W). Also
//!    [`rule::HB_WRITE_ORDER`]: a write that happens-before another write on the same
//!    key has the smaller stamp (without it "the latest write before R in hb" would not
//!    be the newest by stamp).
//! 5. [`rule::COHERENCE`] (per-key SC, relaxed ops included): per key, same-session
//!    order, reads-from, the write order and from-reads (a read → the writes after the
//!    one it read) are acyclic. An RMW is split into its read and its write here.
//! 6. [`rule::LINEARIZABILITY`]: per key, if synchronization op A completed before
//!    synchronization op B was invoked, B is not before A in the key's order. Positions:
//!    a write sits at its rank, a read just after the write it read; an RMW spans from
//!    its read to its write; B's first position must not precede A's last.
//! 7. [`rule::SYNC_ORDER`]: the synchronization ops of all keys fit one total order that
//!    keeps session order among them, real time, and each key's order (positions as in
//!    rule 6). RC_Lin makes releases and acquires take effect in session order and
//!    linearizably; per-key checks alone accept store buffering and IRIW on
//!    synchronization ops (litmus L5, L6), which this rule rejects. A per-key
//!    linearizability violation usually shows here too.
//!
//! # How, and what it costs (n ops, E edges with E ≤ 5n, K keys with writes)
//!
//! - Stamps, attribution, ranks: hash maps and one sort per key, O(n log n).
//! - Session order enters hb through at most four edges per op (each op → the next
//!   release after it in its session; the last acquire → each op; the last release →
//!   each acquire; the previous op on the same key → each op); their closure is the
//!   closure of the axioms' relation. Real time goes through one auxiliary node per
//!   distinct completion time of a synchronization op, chained in time order: A → the
//!   node of A's completion, the node of the last completion before B's invocation → B.
//!   O(n log n) edges and nodes.
//! - hb is ordered topologically (Kahn's algorithm, ties by invocation time),
//!   O(E log n); a cycle is reported per strongly connected component (Tarjan).
//! - Stale reads and hb write order: in topological order, each node's *frontier* is,
//!   per key with writes, the highest rank of a write that happens-before it (an array
//!   of K ranks, the maximum of its predecessors' frontiers with their own writes).
//!   A frontier is freed once pushed to every successor, so memory follows the width of
//!   the order, not n. Time O(E · K). This is exact: the frontier is the maximum over all
//!   hb-predecessors.
//! - Future reads: a read R can happen-before W only if R comes before W in the
//!   topological order. Such pairs are checked 64 at a time by one pass of bit sets over
//!   the stretch of the order between the first R and the last W of the batch.
//!   Exact; O((c / 64) · span) for c such pairs, where span is the edges in a stretch
//!   (short in practice, because the order follows invocation time).
//! - Coherence and sync order: one graph each (O(n) nodes and edges, the key order of
//!   rule 7 through two auxiliary nodes per rank of the keys that synchronization ops
//!   touch), Tarjan's algorithm, O(n).
//! - Linearizability: per key a sweep over invocations with a pointer over completions,
//!   O(n log n).
//!
//! Violations are all counted ([`RcVerdict::violation_count`]); the first
//! [`VIOLATIONS_KEPT`] are described (messages and paths are built only for those).

use crate::error::{InputError, LineSource};
use crate::fasthash::FastHash;
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::fmt;
use std::io::{BufRead, Write};

/// A write's identity in a key's total order: compared lexicographically (version, writer, rmw).
/// Stamp::ZERO (all zero) is the initial value of every key (value None).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct Stamp {
    /// The version (a per-key Lamport clock).
    pub version: u64,
    /// Breaks ties between equal versions (the writer's machine).
    pub writer: u64,
    /// Orders RMWs serialized after the same (version, writer) base.
    pub rmw: u64,
}

impl Stamp {
    /// The stamp of every key's initial value (absent).
    pub const ZERO: Stamp = Stamp { version: 0, writer: 0, rmw: 0 };
}

impl fmt::Display for Stamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == Stamp::ZERO {
            f.write_str("initial")
        } else {
            write!(f, "({},{},{})", self.version, self.writer, self.rmw)
        }
    }
}

/// What an op does. Read and Write are relaxed; the others synchronize.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RcKind {
    /// Relaxed read.
    Read,
    /// Relaxed write.
    Write,
    /// Acquire read.
    Acquire,
    /// Release write.
    Release,
    /// Fetch-and-add (an acquire and a release).
    Faa,
    /// Compare-and-swap (an acquire, and a release when it swaps).
    Cas,
}

impl RcKind {
    /// The kind's name (as in the JSON).
    pub fn name(self) -> &'static str {
        match self {
            RcKind::Read => "read",
            RcKind::Write => "write",
            RcKind::Acquire => "acquire",
            RcKind::Release => "release",
            RcKind::Faa => "faa",
            RcKind::Cas => "cas",
        }
    }

    /// Whether it is a synchronization op (Acquire, Release, Faa, Cas).
    pub fn is_sync(self) -> bool {
        !matches!(self, RcKind::Read | RcKind::Write)
    }

    /// Whether it reads (Read, Acquire, Faa, Cas).
    pub fn reads(self) -> bool {
        !matches!(self, RcKind::Write | RcKind::Release)
    }

    /// Whether it may write (Write, Release, Faa, Cas).
    pub fn writes(self) -> bool {
        !matches!(self, RcKind::Read | RcKind::Acquire)
    }
}

/// One operation of a release-consistency history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RcOp {
    /// Unique in the history.
    pub id: u64,
    /// The session that issued it.
    pub session: u64,
    /// The node the session is on.
    pub machine: u32,
    /// Session order: strictly increasing within a session.
    pub seq: u64,
    /// What it does.
    pub kind: RcKind,
    /// The key.
    pub key: u64,
    /// Invocation time (ns, one global time base).
    pub invoke: u64,
    /// Completion time; `None`: no reply (the op may or may not have taken effect).
    #[serde(default)]
    pub complete: Option<u64>,
    /// Read/Acquire/Faa/Cas when completed: the stamp and value of the write it read
    /// (`Stamp::ZERO`, `None`: the initial value).
    #[serde(default)]
    pub read: Option<(Stamp, Option<u64>)>,
    /// Write/Release when completed, Faa when completed, Cas when it swapped: the stamp
    /// and value it created. May be `None` for an op without a reply.
    #[serde(default)]
    pub wrote: Option<(Stamp, u64)>,
    /// Write/Release: the value written; Faa: the delta; Cas: the new value.
    #[serde(default)]
    pub arg: Option<u64>,
    /// Cas: the expected value (`None`: expect absent).
    #[serde(default)]
    pub expected: Option<u64>,
    /// Cas: strong (always remote) or weak (may fail locally).
    #[serde(default)]
    pub strong: bool,
}

/// One broken rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RcViolation {
    /// The rule's name (one of [`rule`]).
    pub rule: &'static str,
    /// What is wrong, with the ops described (may span several lines).
    pub message: String,
    /// The ids of the ops involved.
    pub ops: Vec<u64>,
}

impl fmt::Display for RcViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.rule, self.message)
    }
}

/// What [`check`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RcVerdict {
    /// Ops checked.
    pub ops: usize,
    /// Of which synchronization ops.
    pub sync_ops: usize,
    /// The first [`VIOLATIONS_KEPT`] violations.
    pub violations: Vec<RcViolation>,
    /// All violations found.
    pub violation_count: usize,
}

impl RcVerdict {
    /// Whether the history satisfies every rule.
    pub fn holds(&self) -> bool {
        self.violation_count == 0
    }

    /// `ok` or `violation`.
    pub fn verdict(&self) -> &'static str {
        crate::verdict(self.holds())
    }
}

/// How many violations a verdict describes (all are counted).
pub const VIOLATIONS_KEPT: usize = 20;

/// The most ops a `keel-rc` history may hold.
pub const OPS_MAX: usize = 50_000_000;

/// The names of the rules (see the module documentation).
pub mod rule {
    /// The ops are not well formed (missing fields, duplicate ids or seqs, times).
    pub const MALFORMED: &str = "malformed";
    /// A write with `Stamp::ZERO`, the initial value's stamp.
    pub const ZERO_STAMP: &str = "zero-stamp";
    /// Two ops wrote the same key with the same stamp.
    pub const DUPLICATE_STAMP: &str = "duplicate-stamp";
    /// A read's value differs from the value written with the stamp it read.
    pub const VALUE_MISMATCH: &str = "value-mismatch";
    /// A read of a write nobody made.
    pub const PHANTOM_READ: &str = "phantom-read";
    /// An FAA did not write what it read plus its delta.
    pub const FAA_ARITHMETIC: &str = "faa-arithmetic";
    /// A CAS swapped when it should not have, or the reverse, or wrote another value.
    pub const CAS_SEMANTICS: &str = "cas-semantics";
    /// Another write sits between an RMW's read and its write (axiom 5).
    pub const RMW_ATOMICITY: &str = "rmw-atomicity";
    /// Two RMWs that both wrote read the same write.
    pub const TWO_RMWS_ON_ONE_READ: &str = "two-rmws-on-one-read";
    /// Happens-before has a cycle.
    pub const HB_CYCLE: &str = "hb-cycle";
    /// A read returned a write older than one that happens-before it (axiom 6).
    pub const STALE_READ: &str = "stale-read";
    /// A read returned a write that it happens-before.
    pub const FUTURE_READ: &str = "future-read";
    /// A write happens-before a write of the same key with a smaller stamp.
    pub const HB_WRITE_ORDER: &str = "hb-write-order";
    /// A key's ops break per-key SC (session order, reads-from, write order, from-reads).
    pub const COHERENCE: &str = "coherence";
    /// A synchronization op is ordered before one that completed before it was invoked.
    pub const LINEARIZABILITY: &str = "linearizability";
    /// The synchronization ops fit no total order (session order, real time, key orders).
    pub const SYNC_ORDER: &str = "sync-order";
}

/// Checks `ops` against every rule (module documentation). Pure: same ops, same verdict.
pub fn check(ops: &[RcOp]) -> RcVerdict {
    let sync_ops = ops.iter().filter(|op| op.kind.is_sync()).count();
    let mut found = Found::default();
    let problems = problems(ops);
    if problems.is_empty() {
        let history = History::new(ops, &mut found);
        history.check_rmws(&mut found);
        history.check_hb(&mut found);
        history.check_coherence(&mut found);
        history.check_linearizability(&mut found);
        history.check_sync_order(&mut found);
    } else {
        for (id, problem) in problems {
            found.add(rule::MALFORMED, || (format!("op {id}: {problem}"), vec![id]));
        }
    }
    RcVerdict { ops: ops.len(), sync_ops, violations: found.kept, violation_count: found.count }
}

// ---------------------------------------------------------------------------------------
// JSON Lines

/// The first line of a `keel-rc` history.
pub const HEADER: &str = r#"{"format":"keel-rc","version":1}"#;

#[derive(Deserialize)]
struct Header {
    format: String,
    version: u64,
}

/// Reads a `keel-rc` history (header line, then one [`RcOp`] per line; blank lines are
/// skipped). Errors say `line N: what was wrong`.
pub fn read_jsonl(r: impl BufRead) -> Result<Vec<RcOp>, String> {
    parse_jsonl(r, "<input>").map_err(|e| format!("line {}: {}", e.line, e.message))
}

/// Reads a `keel-rc` history like [`read_jsonl`], with errors naming `file` and the line.
///
/// Checks the header, that every line is an op, each op's own well-formedness (the
/// fields its kind needs, completion not before invocation), unique ids and unique
/// `(session, seq)`; the consistency rules are [`check`]'s.
pub fn parse_jsonl(r: impl BufRead, file: &str) -> Result<Vec<RcOp>, InputError> {
    let mut lines = LineSource::new(r, file);
    let mut ops = Vec::new();
    let mut header = false;
    let mut ids: HashSet<u64, FastHash> = HashSet::default();
    let mut seqs: HashSet<(u64, u64), FastHash> = HashSet::default();
    while let Some(line) = lines.next_line()? {
        if line.trim().is_empty() {
            continue;
        }
        if !header {
            let h: Header = serde_json::from_str(&line)
                .map_err(|_| lines.error(format!("the first line must be the header {HEADER}")))?;
            if h.format != "keel-rc" {
                return Err(lines.error(format!(
                    "not a keel-rc history: the header names format {:?}",
                    h.format
                )));
            }
            if h.version != 1 {
                return Err(lines.error(format!(
                    "keel-rc version {} is not supported (this reader knows version 1)",
                    h.version
                )));
            }
            header = true;
            continue;
        }
        let op: RcOp = serde_json::from_str(&line)
            .map_err(|e| lines.error(format!("not a keel-rc op: {e}")))?;
        if let Some(problem) = op_problem(&op) {
            return Err(lines.error(format!("op {}: {problem}", op.id)));
        }
        if !ids.insert(op.id) {
            return Err(lines.error(format!("duplicate op id {}", op.id)));
        }
        if !seqs.insert((op.session, op.seq)) {
            return Err(lines.error(format!(
                "op {}: session {} already has an op with seq {}",
                op.id, op.session, op.seq
            )));
        }
        if ops.len() >= OPS_MAX {
            return Err(lines.error(format!("more than {OPS_MAX} ops")));
        }
        ops.push(op);
    }
    if !header {
        return Err(InputError::new(file, 1, format!("empty: no header {HEADER}")));
    }
    Ok(ops)
}

/// Writes a `keel-rc` history: the header line, then one op per line; flushes.
pub fn write_jsonl(mut w: impl Write, ops: &[RcOp]) -> std::io::Result<()> {
    writeln!(w, "{HEADER}")?;
    for op in ops {
        serde_json::to_writer(&mut w, op)?;
        w.write_all(b"\n")?;
    }
    w.flush()
}

// ---------------------------------------------------------------------------------------
// Well-formedness

/// What is wrong with one op on its own, if anything.
fn op_problem(op: &RcOp) -> Option<String> {
    let kind = op.kind.name();
    let done = op.complete.is_some();
    if let Some(complete) = op.complete {
        if complete < op.invoke {
            return Some(format!("completes ({complete}) before it is invoked ({})", op.invoke));
        }
    }
    if !op.kind.reads() && op.read.is_some() {
        return Some(format!("a {kind} has no `read`"));
    }
    if op.kind.reads() && done && op.read.is_none() {
        return Some(format!("a completed {kind} needs `read` (the stamp and value it read)"));
    }
    if !done && op.read.is_some() {
        return Some("an op without a reply (`complete` null) has no `read`".to_string());
    }
    if !op.kind.writes() && op.wrote.is_some() {
        return Some(format!("a {kind} has no `wrote`"));
    }
    if op.kind.writes() && op.arg.is_none() {
        let what = match op.kind {
            RcKind::Faa => "the delta",
            RcKind::Cas => "the new value",
            _ => "the value written",
        };
        return Some(format!("a {kind} needs `arg` ({what})"));
    }
    match op.kind {
        RcKind::Write | RcKind::Release | RcKind::Faa if done && op.wrote.is_none() => {
            Some(format!("a completed {kind} needs `wrote` (the stamp and value it created)"))
        }
        RcKind::Write | RcKind::Release => match op.wrote {
            Some((_, value)) if Some(value) != op.arg => Some(format!(
                "`wrote` has value {value} but `arg` is {}",
                op.arg.map_or("null".to_string(), |a| a.to_string())
            )),
            _ => None,
        },
        _ => None,
    }
}

/// Every well-formedness problem of `ops`: (op id, what).
fn problems(ops: &[RcOp]) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    if ops.len() > OPS_MAX {
        out.push((ops[OPS_MAX].id, format!("more than {OPS_MAX} ops")));
        return out;
    }
    let mut ids: HashSet<u64, FastHash> = HashSet::default();
    let mut seqs: HashSet<(u64, u64), FastHash> = HashSet::default();
    for op in ops {
        if let Some(problem) = op_problem(op) {
            out.push((op.id, problem));
        }
        if !ids.insert(op.id) {
            out.push((op.id, "duplicate op id".to_string()));
        }
        if !seqs.insert((op.session, op.seq)) {
            out.push((
                op.id,
                format!("session {} already has an op with seq {}", op.session, op.seq),
            ));
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// Violations

#[derive(Default)]
struct Found {
    kept: Vec<RcViolation>,
    count: usize,
}

impl Found {
    /// Counts a violation; builds its message and op list only if it is kept.
    fn add(&mut self, rule: &'static str, make: impl FnOnce() -> (String, Vec<u64>)) {
        self.count += 1;
        if self.kept.len() < VIOLATIONS_KEPT {
            let (message, ops) = make();
            self.kept.push(RcViolation { rule, message, ops });
        }
    }
}

// ---------------------------------------------------------------------------------------
// Graphs

/// No op / no rank.
const NONE: u32 = u32::MAX;

/// Why an edge exists (shown in paths and cycles).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Edge {
    /// The first node of a path.
    Start,
    /// Session order: an op before a later release or RMW (axiom 1).
    SoRelease,
    /// Session order: an acquire or RMW before a later op (axiom 2).
    SoAcquire,
    /// Session order: a release or RMW before a later acquire or RMW (axiom 3).
    SoReleaseAcquire,
    /// Session order on one key (axiom 4; in coherence, same-session same-key order).
    SoKey,
    /// Synchronizes-with: a release or RMW write read by an acquire or RMW.
    Sw,
    /// Real time between synchronization ops.
    Rt,
    /// Session order between synchronization ops (rule 7).
    So,
    /// Within one op (an RMW's read before its write).
    Inner,
    /// Reads-from.
    Rf,
    /// Write order (by stamp).
    Wo,
    /// From-read: a read before the write after the one it read.
    Fr,
    /// A key's order of writes and reads (rule 7).
    KeyOrder,
}

impl Edge {
    fn label(self) -> &'static str {
        match self {
            Edge::Start | Edge::Inner => "",
            Edge::SoRelease => "so(before release)",
            Edge::SoAcquire => "so(after acquire)",
            Edge::SoReleaseAcquire => "so(release to acquire)",
            Edge::SoKey => "so(same key)",
            Edge::Sw => "sw",
            Edge::Rt => "real time",
            Edge::So => "so",
            Edge::Rf => "rf",
            Edge::Wo => "wo",
            Edge::Fr => "fr",
            Edge::KeyOrder => "key order",
        }
    }
}

/// A directed graph in compressed rows.
struct Graph {
    start: Vec<usize>,
    succ: Vec<(u32, Edge)>,
}

impl Graph {
    fn new(nodes: usize, edges: &[(u32, u32, Edge)]) -> Graph {
        let mut start = vec![0usize; nodes + 1];
        for &(from, _, _) in edges {
            start[from as usize + 1] += 1;
        }
        for i in 0..nodes {
            start[i + 1] += start[i];
        }
        let mut fill = start.clone();
        let mut succ = vec![(0, Edge::Start); edges.len()];
        for &(from, to, edge) in edges {
            succ[fill[from as usize]] = (to, edge);
            fill[from as usize] += 1;
        }
        Graph { start, succ }
    }

    fn nodes(&self) -> usize {
        self.start.len() - 1
    }

    fn succ(&self, x: u32) -> &[(u32, Edge)] {
        &self.succ[self.start[x as usize]..self.start[x as usize + 1]]
    }

    /// Kahn's algorithm, ready nodes taken by smallest `priority`; shorter than
    /// [`Graph::nodes`] when there is a cycle.
    fn topological_order(&self, priority: impl Fn(u32) -> u64) -> Vec<u32> {
        let n = self.nodes();
        let mut indegree = vec![0u32; n];
        for &(to, _) in &self.succ {
            indegree[to as usize] += 1;
        }
        let mut ready: BinaryHeap<Reverse<(u64, u32)>> = (0..n as u32)
            .filter(|&x| indegree[x as usize] == 0)
            .map(|x| Reverse((priority(x), x)))
            .collect();
        let mut order = Vec::with_capacity(n);
        while let Some(Reverse((_, x))) = ready.pop() {
            order.push(x);
            for &(y, _) in self.succ(x) {
                indegree[y as usize] -= 1;
                if indegree[y as usize] == 0 {
                    ready.push(Reverse((priority(y), y)));
                }
            }
        }
        order
    }

    /// The strongly connected components that hold a cycle (Tarjan, iterative), each
    /// sorted.
    fn cyclic_components(&self) -> Vec<Vec<u32>> {
        let n = self.nodes();
        let mut index = vec![NONE; n];
        let mut low = vec![0u32; n];
        let mut on_stack = vec![false; n];
        let mut stack: Vec<u32> = Vec::new();
        let mut call: Vec<(u32, usize)> = Vec::new();
        let mut next = 0u32;
        let mut out = Vec::new();
        for root in 0..n as u32 {
            if index[root as usize] != NONE {
                continue;
            }
            call.push((root, usize::MAX));
            while let Some(&(v, e)) = call.last() {
                let v_ = v as usize;
                if e == usize::MAX {
                    // First visit.
                    index[v_] = next;
                    low[v_] = next;
                    next += 1;
                    stack.push(v);
                    on_stack[v_] = true;
                    call.last_mut().expect("not empty").1 = self.start[v_];
                    continue;
                }
                if e < self.start[v_ + 1] {
                    call.last_mut().expect("not empty").1 = e + 1;
                    let w = self.succ[e].0;
                    if index[w as usize] == NONE {
                        call.push((w, usize::MAX));
                    } else if on_stack[w as usize] {
                        low[v_] = low[v_].min(index[w as usize]);
                    }
                    continue;
                }
                call.pop();
                if let Some(&(parent, _)) = call.last() {
                    low[parent as usize] = low[parent as usize].min(low[v_]);
                }
                if low[v_] == index[v_] {
                    let mut component = Vec::new();
                    loop {
                        let w = stack.pop().expect("v is on the stack");
                        on_stack[w as usize] = false;
                        component.push(w);
                        if w == v {
                            break;
                        }
                    }
                    if component.len() > 1 || self.succ(v).iter().any(|&(w, _)| w == v) {
                        component.sort_unstable();
                        out.push(component);
                    }
                }
            }
        }
        out
    }

    /// A shortest path from `from` to `to` through nodes that `allowed` accepts:
    /// (node, edge into it), the first with [`Edge::Start`]. With `from == to`, a cycle.
    fn path(&self, from: u32, to: u32, allowed: impl Fn(u32) -> bool) -> Option<Vec<(u32, Edge)>> {
        let mut parent: HashMap<u32, (u32, Edge), FastHash> = HashMap::default();
        let mut queue = VecDeque::from([from]);
        parent.insert(from, (from, Edge::Start));
        let unwind = |parent: &HashMap<u32, (u32, Edge), FastHash>, mut x: u32| {
            let mut path = Vec::new();
            loop {
                let (p, e) = parent[&x];
                path.push((x, e));
                if e == Edge::Start {
                    break;
                }
                x = p;
            }
            path.reverse();
            path
        };
        while let Some(x) = queue.pop_front() {
            for &(y, e) in self.succ(x) {
                if y == to {
                    let mut path = unwind(&parent, x);
                    path.push((y, e));
                    return Some(path);
                }
                if allowed(y) && !parent.contains_key(&y) {
                    parent.insert(y, (x, e));
                    queue.push_back(y);
                }
            }
        }
        None
    }

    /// A cycle through the first node of a cyclic `component`.
    fn cycle_in(&self, component: &[u32]) -> Vec<(u32, Edge)> {
        let members: HashSet<u32, FastHash> = component.iter().copied().collect();
        let first = component[0];
        self.path(first, first, |x| members.contains(&x)).unwrap_or(vec![(first, Edge::Start)])
    }
}

// ---------------------------------------------------------------------------------------
// The history, indexed

struct History<'a> {
    ops: &'a [RcOp],
    /// Per op: its key, densely numbered.
    key: Vec<u32>,
    /// Per op: the stamp of its write (recorded or attributed).
    stamp: Vec<Option<Stamp>>,
    /// Per op with a stamp: the value it wrote.
    value: Vec<u64>,
    /// Per op: its stamp was attributed from a read's value.
    attributed: Vec<bool>,
    /// Per op: the rank of its write if effective, else `NONE`.
    wrank: Vec<u32>,
    /// Per op: the rank of the write it read (0: initial), `NONE` if it read nothing
    /// known.
    rrank: Vec<u32>,
    /// Per op: the op whose write it read, `NONE` for the initial value or nothing.
    source: Vec<u32>,
    /// Per dense key: `writers[k][r - 1]` is the op whose write has rank r.
    writers: Vec<Vec<u32>>,
    /// The ops of each session in session order.
    sessions: Vec<Vec<u32>>,
}

impl<'a> History<'a> {
    /// Indexes `ops` and applies rule 1 (stamps and attribution).
    fn new(ops: &'a [RcOp], found: &mut Found) -> History<'a> {
        let n = ops.len();
        let mut key_index: HashMap<u64, u32, FastHash> = HashMap::default();
        let key: Vec<u32> = ops
            .iter()
            .map(|op| {
                let next = key_index.len() as u32;
                *key_index.entry(op.key).or_insert(next)
            })
            .collect();
        let key_count = key_index.len();

        let mut by_session: HashMap<u64, Vec<u32>, FastHash> = HashMap::default();
        for (i, op) in ops.iter().enumerate() {
            by_session.entry(op.session).or_default().push(i as u32);
        }
        let mut sessions: Vec<(u64, Vec<u32>)> = by_session.into_iter().collect();
        sessions.sort_unstable_by_key(|(session, _)| *session);
        let sessions: Vec<Vec<u32>> = sessions
            .into_iter()
            .map(|(_, mut list)| {
                list.sort_unstable_by_key(|&i| ops[i as usize].seq);
                list
            })
            .collect();

        let mut history = History {
            ops,
            key,
            stamp: vec![None; n],
            value: vec![0; n],
            attributed: vec![false; n],
            wrank: vec![NONE; n],
            rrank: vec![NONE; n],
            source: vec![NONE; n],
            writers: vec![Vec::new(); key_count],
            sessions,
        };
        history.stamps(found);
        history
    }

    /// Rule 1, then the ranks of effective writes and of reads.
    fn stamps(&mut self, found: &mut Found) {
        let ops = self.ops;
        let n = ops.len();
        // Recorded stamps.
        let mut known: HashMap<(u32, Stamp), u32, FastHash> = HashMap::default();
        let mut duplicates: HashMap<(u32, Stamp), Vec<u32>, FastHash> = HashMap::default();
        for (i, op) in ops.iter().enumerate() {
            let Some((stamp, value)) = op.wrote else { continue };
            if stamp == Stamp::ZERO {
                found.add(rule::ZERO_STAMP, || {
                    (
                        format!(
                            "{} wrote with the initial stamp (0,0,0), which no write may have",
                            self.describe(i as u32)
                        ),
                        vec![op.id],
                    )
                });
                continue;
            }
            self.stamp[i] = Some(stamp);
            self.value[i] = value;
            let k = (self.key[i], stamp);
            match known.get(&k) {
                Some(&first) => duplicates.entry(k).or_insert_with(|| vec![first]).push(i as u32),
                None => {
                    known.insert(k, i as u32);
                }
            }
        }
        let mut duplicates: Vec<Vec<u32>> = duplicates.into_values().collect();
        duplicates.sort_unstable();
        for group in duplicates {
            found.add(rule::DUPLICATE_STAMP, || {
                let first = &ops[group[0] as usize];
                let mut message = format!(
                    "{} ops wrote key {} with the same stamp {}:",
                    group.len(),
                    first.key,
                    self.stamp[group[0] as usize].expect("recorded")
                );
                for &i in &group {
                    message.push_str(&format!("\n  {}", self.describe(i)));
                }
                (message, group.iter().map(|&i| ops[i as usize].id).collect())
            });
        }

        // Ops without a reply that a read may be attributed to, by (key, value).
        let mut candidates: HashMap<(u32, u64), Vec<u32>, FastHash> = HashMap::default();
        for (i, op) in ops.iter().enumerate() {
            if op.complete.is_none()
                && op.wrote.is_none()
                && matches!(op.kind, RcKind::Write | RcKind::Release)
            {
                let arg = op.arg.expect("validated: writes have arg");
                candidates.entry((self.key[i], arg)).or_default().push(i as u32);
            }
        }
        // RMWs without a reply: a read of an RMW's stamp (rmw > 0) nobody reported may be
        // theirs (a CAS by its new value; an FAA, whose value depends on what it read,
        // by key alone).
        let mut rmw_candidates: HashMap<u32, Vec<u32>, FastHash> = HashMap::default();
        for (i, op) in ops.iter().enumerate() {
            if op.complete.is_none()
                && op.wrote.is_none()
                && matches!(op.kind, RcKind::Faa | RcKind::Cas)
            {
                rmw_candidates.entry(self.key[i]).or_default().push(i as u32);
            }
        }

        // Resolve reads.
        let mut observed = vec![false; n];
        let mut resolved = vec![false; n];
        for (i, op) in ops.iter().enumerate() {
            let Some((stamp, value)) = op.read else { continue };
            if stamp == Stamp::ZERO {
                resolved[i] = true;
                if let Some(v) = value {
                    found.add(rule::VALUE_MISMATCH, || {
                        (
                            format!(
                                "{} read value {v} with the initial stamp; the initial value is absent",
                                self.describe(i as u32)
                            ),
                            vec![op.id],
                        )
                    });
                }
                continue;
            }
            let k = self.key[i];
            let mut writer = known.get(&(k, stamp)).copied();
            if writer.is_none() {
                let candidate = value.and_then(|v| candidates.get(&(k, v))).and_then(|list| {
                    list.iter().copied().find(|&c| self.stamp[c as usize].is_none())
                });
                let candidate = candidate.or_else(|| {
                    if stamp.rmw == 0 {
                        return None;
                    }
                    let v = value?;
                    rmw_candidates.get(&k)?.iter().copied().find(|&c| {
                        self.stamp[c as usize].is_none()
                            && (ops[c as usize].kind == RcKind::Faa
                                || ops[c as usize].arg == Some(v))
                    })
                });
                if let Some(c) = candidate {
                    self.stamp[c as usize] = Some(stamp);
                    self.value[c as usize] = value.expect("attributed by value");
                    self.attributed[c as usize] = true;
                    known.insert((k, stamp), c);
                    writer = Some(c);
                }
            }
            match writer {
                Some(w) => {
                    self.source[i] = w;
                    resolved[i] = true;
                    observed[w as usize] = true;
                    if value != Some(self.value[w as usize]) {
                        found.add(rule::VALUE_MISMATCH, || {
                            (
                                format!(
                                    "{} read value {} with stamp {stamp}, but that stamp's write has value {}:\n  writer: {}",
                                    self.describe(i as u32),
                                    value.map_or("absent".to_string(), |v| v.to_string()),
                                    self.value[w as usize],
                                    self.describe(w)
                                ),
                                vec![op.id, ops[w as usize].id],
                            )
                        });
                    }
                }
                None => found.add(rule::PHANTOM_READ, || {
                    (
                        format!(
                            "{} read a write nobody made: no op wrote key {} with stamp {stamp}, and no op without a reply wrote that value",
                            self.describe(i as u32),
                            op.key
                        ),
                        vec![op.id],
                    )
                }),
            }
        }

        // Ranks of effective writes: completed, or observed.
        let mut per_key: Vec<Vec<u32>> = vec![Vec::new(); self.writers.len()];
        for (i, op) in ops.iter().enumerate() {
            if self.stamp[i].is_some() && (op.complete.is_some() || observed[i]) {
                per_key[self.key[i] as usize].push(i as u32);
            }
        }
        for (k, mut list) in per_key.into_iter().enumerate() {
            list.sort_unstable_by_key(|&i| (self.stamp[i as usize], i));
            let mut last = None;
            for i in list {
                let stamp = self.stamp[i as usize];
                if stamp != last {
                    self.writers[k].push(i);
                    last = stamp;
                }
                self.wrank[i as usize] = self.writers[k].len() as u32;
            }
        }
        for (i, _) in resolved.iter().enumerate().filter(|(_, &resolved)| resolved) {
            let w = self.source[i];
            self.rrank[i] = if w == NONE { 0 } else { self.wrank[w as usize] };
        }
    }

    fn op(&self, i: u32) -> &RcOp {
        &self.ops[i as usize]
    }

    /// Acquire side: Acquire, Faa, Cas (a failed Cas too).
    fn acquires(&self, i: u32) -> bool {
        matches!(self.op(i).kind, RcKind::Acquire | RcKind::Faa | RcKind::Cas)
    }

    /// Release side: Release, Faa, a Cas that wrote.
    fn releases(&self, i: u32) -> bool {
        let op = self.op(i);
        match op.kind {
            RcKind::Release | RcKind::Faa => true,
            RcKind::Cas => op.wrote.is_some(),
            _ => false,
        }
    }

    /// A synchronization op bound by real time: all but a weak Cas that failed.
    fn timed(&self, i: u32) -> bool {
        let op = self.op(i);
        op.kind.is_sync()
            && !(op.kind == RcKind::Cas
                && !op.strong
                && op.complete.is_some()
                && op.wrote.is_none())
    }

    /// One line describing op `i`.
    fn describe(&self, i: u32) -> String {
        let op = self.op(i);
        let shown = |v: Option<u64>| v.map_or("absent".to_string(), |v| v.to_string());
        let mut s = format!(
            "op {} (session {} seq {} machine {}) {} key {}",
            op.id,
            op.session,
            op.seq,
            op.machine,
            op.kind.name(),
            op.key
        );
        let arg = shown(op.arg);
        match op.kind {
            RcKind::Read | RcKind::Acquire => {}
            RcKind::Write | RcKind::Release => s.push_str(&format!(" := {arg}")),
            RcKind::Faa => s.push_str(&format!(" += {arg}")),
            RcKind::Cas => s.push_str(&format!(
                " ({}) {} -> {arg}",
                if op.strong { "strong" } else { "weak" },
                shown(op.expected)
            )),
        }
        if let Some((stamp, value)) = op.read {
            s.push_str(&format!(", read {} @{stamp}", shown(value)));
        }
        if let Some(stamp) = self.stamp[i as usize] {
            s.push_str(&format!(", wrote {} @{stamp}", self.value[i as usize]));
            if self.attributed[i as usize] {
                s.push_str(" (stamp attributed from a read of its value)");
            }
        } else if op.kind == RcKind::Cas && op.complete.is_some() {
            s.push_str(", failed");
        }
        match op.complete {
            Some(c) => s.push_str(&format!(" [{}, {c}]", op.invoke)),
            None => s.push_str(&format!(" [{}, no reply]", op.invoke)),
        }
        s
    }

    /// Describes a path or cycle, one op per line. `op_of` maps a node to its op (None
    /// for auxiliary nodes). Returns the text and the op ids on it.
    fn format_path(
        &self,
        path: &[(u32, Edge)],
        op_of: impl Fn(u32) -> Option<u32>,
    ) -> (String, Vec<u64>) {
        let mut lines: Vec<String> = Vec::new();
        let mut ids: Vec<u64> = Vec::new();
        let mut last: Option<u32> = None;
        let mut label = Edge::Start;
        for &(x, edge) in path {
            if !matches!(edge, Edge::Start | Edge::Inner) {
                label = edge;
            }
            let Some(i) = op_of(x) else { continue };
            if last == Some(i) {
                continue;
            }
            let text = self.describe(i);
            lines.push(match last {
                None => format!("  {text}"),
                Some(_) => format!("  -{}-> {text}", label.label()),
            });
            let id = self.op(i).id;
            if !ids.contains(&id) {
                ids.push(id);
            }
            last = Some(i);
            label = Edge::Start;
        }
        const SHOWN: usize = 16;
        if lines.len() > SHOWN {
            let hidden = lines.len() - SHOWN;
            let tail = lines.split_off(lines.len() - SHOWN / 2);
            lines.truncate(SHOWN / 2);
            lines.push(format!("  ... {hidden} more ops ..."));
            lines.extend(tail);
        }
        (lines.join("\n"), ids)
    }

    // -----------------------------------------------------------------------------------
    // Rule 2

    fn check_rmws(&self, found: &mut Found) {
        let ops = self.ops;
        let shown = |v: Option<u64>| v.map_or("absent".to_string(), |v| v.to_string());
        let mut by_read: HashMap<(u32, u32), Vec<u32>, FastHash> = HashMap::default();
        for (i, op) in ops.iter().enumerate() {
            let i = i as u32;
            if !matches!(op.kind, RcKind::Faa | RcKind::Cas) {
                continue;
            }
            let Some((_, read)) = op.read else { continue };
            let arg = op.arg.expect("validated: RMWs have arg");
            if op.kind == RcKind::Faa {
                let (_, wrote) = op.wrote.expect("validated: a completed faa wrote");
                let want = read.unwrap_or(0).wrapping_add(arg);
                if wrote != want {
                    found.add(rule::FAA_ARITHMETIC, || {
                        (
                            format!(
                                "{} wrote {wrote}, but it read {} and adds {arg}: it must write {want}",
                                self.describe(i),
                                shown(read)
                            ),
                            vec![op.id],
                        )
                    });
                }
            } else {
                let matched = read == op.expected;
                let problem = match op.wrote {
                    Some(_) if !matched => Some(format!(
                        "swapped, but it read {} and expected {}",
                        shown(read),
                        shown(op.expected)
                    )),
                    Some((_, wrote)) if wrote != arg => {
                        Some(format!("swapped in {wrote}, but its new value is {arg}"))
                    }
                    None if matched => {
                        Some(format!("failed, but it read {}, the value it expected", shown(read)))
                    }
                    _ => None,
                };
                if let Some(problem) = problem {
                    found.add(rule::CAS_SEMANTICS, || {
                        (format!("{}: {problem}", self.describe(i)), vec![op.id])
                    });
                }
            }
            let (r, w) = (self.rrank[i as usize], self.wrank[i as usize]);
            if r != NONE && w != NONE {
                by_read.entry((self.key[i as usize], r)).or_default().push(i);
            }
        }
        let mut groups: Vec<Vec<u32>> = by_read.into_values().collect();
        groups.sort_unstable();
        for group in groups {
            let i = group[0];
            let k = self.key[i as usize] as usize;
            let (r, w) = (self.rrank[i as usize], self.wrank[i as usize]);
            if group.len() > 1 {
                found.add(rule::TWO_RMWS_ON_ONE_READ, || {
                    let mut message = format!(
                        "{} RMWs read the same write of key {} (@{}) and all wrote:",
                        group.len(),
                        self.op(i).key,
                        self.op(i).read.expect("completed").0
                    );
                    for &j in &group {
                        message.push_str(&format!("\n  {}", self.describe(j)));
                    }
                    (message, group.iter().map(|&j| self.op(j).id).collect())
                });
                continue;
            }
            if w == r + 1 {
                continue;
            }
            found.add(rule::RMW_ATOMICITY, || {
                if w <= r {
                    return (
                        format!(
                            "{}: its write is not after the write it read in the key's order",
                            self.describe(i)
                        ),
                        vec![self.op(i).id],
                    );
                }
                let between = &self.writers[k][r as usize..(w - 1) as usize];
                let mut message = format!(
                    "{}: {} write(s) sit between the write it read and its own:",
                    self.describe(i),
                    between.len()
                );
                for &j in between.iter().take(3) {
                    message.push_str(&format!("\n  {}", self.describe(j)));
                }
                if between.len() > 3 {
                    message.push_str(&format!("\n  ... {} more", between.len() - 3));
                }
                let mut ids = vec![self.op(i).id];
                ids.extend(between.iter().take(3).map(|&j| self.op(j).id));
                (message, ids)
            });
        }
    }

    // -----------------------------------------------------------------------------------
    // Rules 3 and 4

    /// Real-time edges among [`History::timed`] ops through auxiliary nodes numbered from
    /// `base`, one per distinct completion time; returns those times (node `base + j`
    /// stands for `times[j]`).
    fn real_time(&self, base: u32, edges: &mut Vec<(u32, u32, Edge)>) -> Vec<u64> {
        let n = self.ops.len() as u32;
        let mut times: Vec<u64> =
            (0..n).filter(|&i| self.timed(i)).filter_map(|i| self.op(i).complete).collect();
        times.sort_unstable();
        times.dedup();
        for j in 1..times.len() as u32 {
            edges.push((base + j - 1, base + j, Edge::Rt));
        }
        for i in (0..n).filter(|&i| self.timed(i)) {
            let op = self.op(i);
            if let Some(complete) = op.complete {
                let j = times.binary_search(&complete).expect("listed above") as u32;
                edges.push((i, base + j, Edge::Rt));
            }
            let before = times.partition_point(|&t| t < op.invoke) as u32;
            if before > 0 {
                edges.push((base + before - 1, i, Edge::Rt));
            }
        }
        times
    }

    /// The hb graph: ops are nodes 0..n, real-time nodes follow. Returns it with each
    /// node's priority for the topological order (invocation or completion time).
    fn hb_graph(&self) -> (Graph, Vec<u64>) {
        let n = self.ops.len();
        let mut edges: Vec<(u32, u32, Edge)> = Vec::with_capacity(4 * n);
        for session in &self.sessions {
            let (mut last_acquire, mut last_release) = (NONE, NONE);
            let mut before_release: Vec<u32> = Vec::new();
            let mut last_on_key: HashMap<u32, u32, FastHash> = HashMap::default();
            for &j in session {
                if self.releases(j) {
                    edges.extend(before_release.drain(..).map(|p| (p, j, Edge::SoRelease)));
                }
                if last_acquire != NONE {
                    edges.push((last_acquire, j, Edge::SoAcquire));
                }
                if self.acquires(j) && last_release != NONE {
                    edges.push((last_release, j, Edge::SoReleaseAcquire));
                }
                if let Some(p) = last_on_key.insert(self.key[j as usize], j) {
                    edges.push((p, j, Edge::SoKey));
                }
                before_release.push(j);
                if self.acquires(j) {
                    last_acquire = j;
                }
                if self.releases(j) {
                    last_release = j;
                }
            }
        }
        for i in 0..n as u32 {
            let w = self.source[i as usize];
            if w != NONE && w != i && self.acquires(i) && self.releases(w) {
                edges.push((w, i, Edge::Sw));
            }
        }
        // No real-time edges: RC_Lin orders synchronization ops in real time per key
        // (rule 6) and as a whole (rule 7), but an acquire synchronizes only with the
        // release it reads from. An acquire of one key that merely follows, in real time,
        // a release of another gives the acquirer's later relaxed reads nothing (Kite's
        // acquire asks a quorum about its own key only).
        let priority: Vec<u64> = self.ops.iter().map(|op| op.invoke).collect();
        (Graph::new(priority.len(), &edges), priority)
    }

    fn check_hb(&self, found: &mut Found) {
        let n = self.ops.len() as u32;
        let (graph, priority) = self.hb_graph();
        let order = graph.topological_order(|x| priority[x as usize]);
        let op_of = |x: u32| (x < n).then_some(x);
        if order.len() < graph.nodes() {
            for component in graph.cyclic_components() {
                found.add(rule::HB_CYCLE, || {
                    let cycle = graph.cycle_in(&component);
                    let (text, ids) = self.format_path(&cycle, op_of);
                    (
                        format!(
                            "happens-before has a cycle (stale-read, future-read and hb-write-order are not checked):\n{text}"
                        ),
                        ids,
                    )
                });
            }
            return;
        }
        let mut pos = vec![0u32; graph.nodes()];
        for (p, &x) in order.iter().enumerate() {
            pos[x as usize] = p as u32;
        }
        self.check_load_value(&graph, &order, &pos, found);
        self.check_future_reads(&graph, &order, &pos, found);
    }

    /// Stale reads and hb write order, by per-key frontiers pushed along `order`.
    fn check_load_value(&self, graph: &Graph, order: &[u32], pos: &[u32], found: &mut Found) {
        let n = self.ops.len();
        let mut column = vec![NONE; self.writers.len()];
        let mut width = 0usize;
        for (k, writers) in self.writers.iter().enumerate() {
            if !writers.is_empty() {
                column[k] = width as u32;
                width += 1;
            }
        }
        if width == 0 {
            return;
        }
        let op_of = |x: u32| ((x as usize) < n).then_some(x);
        let mut frontiers: Vec<Option<Vec<u32>>> = vec![None; graph.nodes()];
        let mut pool: Vec<Vec<u32>> = Vec::new();
        let fresh = |pool: &mut Vec<Vec<u32>>| match pool.pop() {
            Some(mut v) => {
                v.fill(0);
                v
            }
            None => vec![0u32; width],
        };
        for &x in order {
            let mut frontier = frontiers[x as usize].take().unwrap_or_else(|| fresh(&mut pool));
            if (x as usize) < n {
                let k = self.key[x as usize] as usize;
                let c = column[k];
                if c != NONE {
                    let newest = frontier[c as usize];
                    let (r, w) = (self.rrank[x as usize], self.wrank[x as usize]);
                    let stale = r != NONE && newest > r;
                    let path_from = |from: u32| {
                        graph
                            .path(from, x, |y| {
                                pos[y as usize] >= pos[from as usize]
                                    && pos[y as usize] <= pos[x as usize]
                            })
                            .map(|path| self.format_path(&path, op_of))
                    };
                    if stale {
                        let newer = self.writers[k][newest as usize - 1];
                        found.add(rule::STALE_READ, || {
                            let read = self.op(x).read.expect("resolved").0;
                            let (text, ids) = path_from(newer).unwrap_or_else(|| {
                                (format!("  {}", self.describe(newer)), vec![self.op(newer).id])
                            });
                            let mut ids = ids;
                            let source = self.source[x as usize];
                            if source != NONE && !ids.contains(&self.op(source).id) {
                                ids.push(self.op(source).id);
                            }
                            (
                                format!(
                                    "{}: a write of key {} newer than the one it read (@{} after @{read}) happens-before it:\n{text}",
                                    self.describe(x),
                                    self.op(x).key,
                                    self.stamp[newer as usize].expect("effective")
                                ),
                                ids,
                            )
                        });
                    }
                    if w != NONE {
                        if newest > w && !stale {
                            let newer = self.writers[k][newest as usize - 1];
                            found.add(rule::HB_WRITE_ORDER, || {
                                let (text, ids) = path_from(newer).unwrap_or_else(|| {
                                    (format!("  {}", self.describe(newer)), vec![self.op(newer).id])
                                });
                                (
                                    format!(
                                        "{} wrote key {} with a smaller stamp than a write that happens-before it:\n{text}",
                                        self.describe(x),
                                        self.op(x).key
                                    ),
                                    ids,
                                )
                            });
                        }
                        frontier[c as usize] = newest.max(w);
                    }
                }
            }
            let succ = graph.succ(x);
            let mut own = Some(frontier);
            for (e, &(y, _)) in succ.iter().enumerate() {
                let from = own.as_ref().expect("moved only on the last edge");
                match &mut frontiers[y as usize] {
                    Some(into) => {
                        for (a, &b) in into.iter_mut().zip(from.iter()) {
                            *a = (*a).max(b);
                        }
                    }
                    slot @ None => {
                        *slot = Some(if e + 1 == succ.len() {
                            own.take().expect("present")
                        } else {
                            let mut copy = pool.pop().unwrap_or_else(|| vec![0u32; width]);
                            copy.copy_from_slice(from);
                            copy
                        });
                    }
                }
            }
            if let Some(frontier) = own {
                pool.push(frontier);
            }
        }
    }

    /// Reads that happen-before the write they read: exact reachability from each read
    /// that precedes its write in `order`, 64 reads per pass of bit sets.
    fn check_future_reads(&self, graph: &Graph, order: &[u32], pos: &[u32], found: &mut Found) {
        let n = self.ops.len() as u32;
        let mut pairs: Vec<(u32, u32)> = (0..n)
            .filter_map(|r| {
                let w = self.source[r as usize];
                (w != NONE && w != r && pos[r as usize] < pos[w as usize]).then_some((r, w))
            })
            .collect();
        pairs.sort_unstable_by_key(|&(r, _)| pos[r as usize]);
        let mut bits = vec![0u64; graph.nodes()];
        let op_of = |x: u32| (x < n).then_some(x);
        for batch in pairs.chunks(64) {
            let low = pos[batch[0].0 as usize] as usize;
            let high =
                batch.iter().map(|&(_, w)| pos[w as usize]).max().expect("non-empty") as usize;
            for (b, &(r, _)) in batch.iter().enumerate() {
                bits[r as usize] |= 1u64 << b;
            }
            for &x in &order[low..=high] {
                let set = bits[x as usize];
                if set == 0 {
                    continue;
                }
                for &(y, _) in graph.succ(x) {
                    if pos[y as usize] as usize <= high {
                        bits[y as usize] |= set;
                    }
                }
            }
            for (b, &(r, w)) in batch.iter().enumerate() {
                if bits[w as usize] >> b & 1 == 1 {
                    found.add(rule::FUTURE_READ, || {
                        let (text, ids) = graph
                            .path(r, w, |y| pos[y as usize] <= pos[w as usize])
                            .map(|path| self.format_path(&path, op_of))
                            .unwrap_or_default();
                        (
                            format!(
                                "{} read the write of op {}, but the read happens-before that write:\n{text}",
                                self.describe(r),
                                self.op(w).id
                            ),
                            ids,
                        )
                    });
                }
            }
            for &x in &order[low..=high] {
                bits[x as usize] = 0;
            }
        }
    }

    // -----------------------------------------------------------------------------------
    // Rule 5

    fn check_coherence(&self, found: &mut Found) {
        let n = self.ops.len() as u32;
        // Op i is nodes 2i (its read, or where it enters) and 2i + 1 (its write, or where
        // it leaves).
        let (enter, leave) = (|i: u32| 2 * i, |i: u32| 2 * i + 1);
        let mut edges: Vec<(u32, u32, Edge)> = Vec::with_capacity(5 * n as usize);
        for i in 0..n {
            edges.push((enter(i), leave(i), Edge::Inner));
        }
        for session in &self.sessions {
            let mut last_on_key: HashMap<u32, u32, FastHash> = HashMap::default();
            for &j in session {
                if let Some(p) = last_on_key.insert(self.key[j as usize], j) {
                    edges.push((leave(p), enter(j), Edge::SoKey));
                }
            }
        }
        for i in 0..n {
            let r = self.rrank[i as usize];
            if r == NONE {
                continue;
            }
            let w = self.source[i as usize];
            if w != NONE && w != i {
                edges.push((leave(w), enter(i), Edge::Rf));
            }
            let writers = &self.writers[self.key[i as usize] as usize];
            if let Some(&next) = writers.get(r as usize) {
                if next != i {
                    edges.push((enter(i), leave(next), Edge::Fr));
                }
            }
        }
        for writers in &self.writers {
            for pair in writers.windows(2) {
                edges.push((leave(pair[0]), leave(pair[1]), Edge::Wo));
            }
        }
        let graph = Graph::new(2 * n as usize, &edges);
        for component in graph.cyclic_components() {
            found.add(rule::COHERENCE, || {
                let cycle = graph.cycle_in(&component);
                let key = self.op(component[0] / 2).key;
                let (text, ids) = self.format_path(&cycle, |x| Some(x / 2));
                (
                    format!(
                        "key {key}: its ops fit no order that keeps same-session order, reads-from, the write order and from-reads:\n{text}"
                    ),
                    ids,
                )
            });
        }
    }

    // -----------------------------------------------------------------------------------
    // Rules 6 and 7

    /// The first and last positions of a timed op in its key's order (write of rank w at
    /// 2w, a read of rank r at 2r + 1), if known.
    fn span(&self, i: u32) -> Option<(u64, u64)> {
        let (r, w) = (self.rrank[i as usize], self.wrank[i as usize]);
        let read = (r != NONE).then(|| 2 * u64::from(r) + 1);
        let write = (w != NONE).then(|| 2 * u64::from(w));
        match (read, write) {
            (Some(a), Some(b)) => Some((a, b)),
            (Some(a), None) => Some((a, a)),
            (None, Some(b)) => Some((b, b)),
            (None, None) => None,
        }
    }

    fn check_linearizability(&self, found: &mut Found) {
        let n = self.ops.len() as u32;
        let mut per_key: Vec<Vec<u32>> = vec![Vec::new(); self.writers.len()];
        for i in 0..n {
            if self.timed(i) && self.span(i).is_some() {
                per_key[self.key[i as usize] as usize].push(i);
            }
        }
        let place = |i: u32| {
            let op = self.op(i);
            match (self.span(i).expect("listed"), op.read) {
                ((first, last), Some((stamp, _))) if first == last => format!("read @{stamp}"),
                ((first, _), Some((stamp, _))) if first % 2 == 1 => format!(
                    "read @{stamp} and wrote @{}",
                    self.stamp[i as usize].map_or("?".to_string(), |s| s.to_string())
                ),
                _ => format!(
                    "wrote @{}",
                    self.stamp[i as usize].map_or("?".to_string(), |s| s.to_string())
                ),
            }
        };
        for mut invoked in per_key {
            let mut completed: Vec<u32> =
                invoked.iter().copied().filter(|&i| self.op(i).complete.is_some()).collect();
            invoked.sort_unstable_by_key(|&i| (self.op(i).invoke, i));
            completed.sort_unstable_by_key(|&i| (self.op(i).complete, i));
            let mut next = 0;
            let mut latest: Option<(u64, u32)> = None;
            for &b in &invoked {
                let invoke = self.op(b).invoke;
                while next < completed.len()
                    && self.op(completed[next]).complete.expect("completed") < invoke
                {
                    let a = completed[next];
                    let last = self.span(a).expect("listed").1;
                    if latest.is_none_or(|(l, _)| last > l) {
                        latest = Some((last, a));
                    }
                    next += 1;
                }
                let Some((last, a)) = latest else { continue };
                if self.span(b).expect("listed").0 < last {
                    found.add(rule::LINEARIZABILITY, || {
                        (
                            format!(
                                "key {}: op {} was invoked after op {} completed, but {} while the earlier op {}:\n  earlier: {}\n  later:   {}",
                                self.op(b).key,
                                self.op(b).id,
                                self.op(a).id,
                                place(b),
                                place(a),
                                self.describe(a),
                                self.describe(b)
                            ),
                            vec![self.op(a).id, self.op(b).id],
                        )
                    });
                }
            }
        }
    }

    fn check_sync_order(&self, found: &mut Found) {
        let n = self.ops.len() as u32;
        let mut edges: Vec<(u32, u32, Edge)> = Vec::new();
        for session in &self.sessions {
            let mut previous = NONE;
            for &j in session.iter().filter(|&&j| self.timed(j)) {
                if previous != NONE {
                    edges.push((previous, j, Edge::So));
                }
                previous = j;
            }
        }
        // Per key with positioned timed ops: nodes X_r (just after the write of rank r)
        // and A_r (after the reads of rank r), r = 0..=R; the key's timed writes sit
        // between A_(r-1) and X_r, its timed reads (not RMWs that wrote) between X_r and
        // A_r.
        let mut readers: Vec<Vec<u32>> = vec![Vec::new(); self.writers.len()];
        let mut used = vec![false; self.writers.len()];
        for i in (0..n).filter(|&i| self.timed(i)) {
            let k = self.key[i as usize] as usize;
            let w = self.wrank[i as usize];
            if w != NONE {
                used[k] |= self.writers[k][w as usize - 1] == i;
            } else if self.rrank[i as usize] != NONE {
                used[k] = true;
                readers[k].push(i);
            }
        }
        let mut next = n;
        for (k, writers) in self.writers.iter().enumerate() {
            if !used[k] {
                continue;
            }
            let ranks = writers.len() as u32;
            let x = |r: u32| next + 2 * r;
            let a = |r: u32| next + 2 * r + 1;
            for r in 0..=ranks {
                edges.push((x(r), a(r), Edge::KeyOrder));
                if r < ranks {
                    let w = writers[r as usize];
                    if self.timed(w) {
                        edges.push((a(r), w, Edge::KeyOrder));
                        edges.push((w, x(r + 1), Edge::KeyOrder));
                    } else {
                        edges.push((a(r), x(r + 1), Edge::KeyOrder));
                    }
                }
            }
            for &i in &readers[k] {
                let r = self.rrank[i as usize];
                edges.push((x(r), i, Edge::KeyOrder));
                edges.push((i, a(r), Edge::KeyOrder));
            }
            next += 2 * (ranks + 1);
        }
        let times = self.real_time(next, &mut edges);
        let graph = Graph::new(next as usize + times.len(), &edges);
        for component in graph.cyclic_components() {
            found.add(rule::SYNC_ORDER, || {
                let cycle = graph.cycle_in(&component);
                let (text, ids) = self.format_path(&cycle, |x| (x < n).then_some(x));
                (
                    format!(
                        "the synchronization ops fit no single order that keeps session order, real time and each key's order:\n{text}"
                    ),
                    ids,
                )
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use RcKind::*;

    const X: u64 = 1;
    const F: u64 = 2;
    const G: u64 = 3;
    const Y: u64 = 4;

    fn st(version: u64, writer: u64) -> Stamp {
        Stamp { version, writer, rmw: 0 }
    }

    fn rmw_st(version: u64, writer: u64, rmw: u64) -> Stamp {
        Stamp { version, writer, rmw }
    }

    /// A completed op of `session` on `key` over `[at, at + 1]`; ids and seqs are set by
    /// [`history`].
    fn base(kind: RcKind, session: u64, key: u64, at: u64) -> RcOp {
        RcOp {
            id: 0,
            session,
            machine: session as u32,
            seq: 0,
            kind,
            key,
            invoke: at,
            complete: Some(at + 1),
            read: None,
            wrote: None,
            arg: None,
            expected: None,
            strong: true,
        }
    }

    fn put(kind: RcKind, session: u64, key: u64, value: u64, stamp: Stamp, at: u64) -> RcOp {
        RcOp { wrote: Some((stamp, value)), arg: Some(value), ..base(kind, session, key, at) }
    }

    fn get(
        kind: RcKind,
        session: u64,
        key: u64,
        value: Option<u64>,
        stamp: Stamp,
        at: u64,
    ) -> RcOp {
        RcOp { read: Some((stamp, value)), ..base(kind, session, key, at) }
    }

    fn faa(
        session: u64,
        key: u64,
        delta: u64,
        read: (Stamp, Option<u64>),
        wrote: (Stamp, u64),
        at: u64,
    ) -> RcOp {
        RcOp {
            read: Some(read),
            wrote: Some(wrote),
            arg: Some(delta),
            ..base(Faa, session, key, at)
        }
    }

    fn cas(
        session: u64,
        key: u64,
        expected: Option<u64>,
        new: u64,
        read: (Stamp, Option<u64>),
        wrote: Option<Stamp>,
        at: u64,
    ) -> RcOp {
        RcOp {
            read: Some(read),
            wrote: wrote.map(|s| (s, new)),
            arg: Some(new),
            expected,
            ..base(Cas, session, key, at)
        }
    }

    /// Spans every op over `[0, 100]`: all concurrent, no real-time order.
    fn concurrent(mut op: RcOp) -> RcOp {
        op.invoke = 0;
        op.complete = op.complete.map(|_| 100);
        op
    }

    fn no_reply(mut op: RcOp) -> RcOp {
        op.complete = None;
        op
    }

    /// Numbers the ops (ids in order) and their seqs (per session, in order).
    fn history(mut ops: Vec<RcOp>) -> Vec<RcOp> {
        let mut seqs: HashMap<u64, u64> = HashMap::new();
        for (i, op) in ops.iter_mut().enumerate() {
            op.id = i as u64;
            let seq = seqs.entry(op.session).or_default();
            op.seq = *seq;
            *seq += 1;
        }
        ops
    }

    fn rules(ops: Vec<RcOp>) -> Vec<&'static str> {
        let verdict = check(&history(ops));
        let mut rules: Vec<&'static str> = verdict.violations.iter().map(|v| v.rule).collect();
        rules.dedup();
        for v in &verdict.violations {
            eprintln!("{v}");
        }
        rules
    }

    fn assert_ok(ops: Vec<RcOp>) {
        assert_eq!(rules(ops), Vec::<&str>::new());
    }

    fn assert_rejected(ops: Vec<RcOp>, rule: &str) {
        let found = rules(ops);
        assert!(found.contains(&rule), "expected {rule}, found {found:?}");
    }

    /// L1 (message passing): S1 writes x then releases f; S2 acquires f and reads x.
    fn message_passing(x_read: (Option<u64>, Stamp)) -> Vec<RcOp> {
        vec![
            put(Write, 1, X, 1, st(1, 1), 0),
            put(Release, 1, F, 1, st(1, 1), 2),
            get(Acquire, 2, F, Some(1), st(1, 1), 4),
            get(Read, 2, X, x_read.0, x_read.1, 6),
        ]
    }

    #[test]
    fn message_passing_reading_the_flag_after_the_release_is_ok() {
        assert_ok(message_passing((Some(1), st(1, 1))));
    }

    #[test]
    fn an_faa_chain_is_ok() {
        assert_ok(vec![
            faa(1, X, 1, (Stamp::ZERO, None), (rmw_st(0, 0, 1), 1), 0),
            faa(2, X, 2, (rmw_st(0, 0, 1), Some(1)), (rmw_st(0, 0, 2), 3), 1),
            faa(3, X, 3, (rmw_st(0, 0, 2), Some(3)), (rmw_st(0, 0, 3), 6), 1),
            get(Acquire, 1, X, Some(6), rmw_st(0, 0, 3), 10),
        ]);
    }

    #[test]
    fn a_cas_lock_is_ok() {
        const LOCK: u64 = 9;
        assert_ok(vec![
            // S1 takes the lock (absent -> 1), writes x, releases the lock (value 100).
            cas(1, LOCK, None, 1, (Stamp::ZERO, None), Some(rmw_st(0, 0, 1)), 0),
            put(Write, 1, X, 10, st(1, 1), 2),
            // S2 fails to take it while S1 holds it (strong and weak).
            cas(2, LOCK, None, 2, (rmw_st(0, 0, 1), Some(1)), None, 3),
            RcOp { strong: false, ..cas(2, LOCK, None, 3, (rmw_st(0, 0, 1), Some(1)), None, 4) },
            put(Release, 1, LOCK, 100, st(1, 1), 5),
            // S2 takes it from the release and sees x.
            cas(2, LOCK, Some(100), 4, (st(1, 1), Some(100)), Some(rmw_st(1, 1, 1)), 8),
            get(Read, 2, X, Some(10), st(1, 1), 10),
        ]);
    }

    #[test]
    fn a_relaxed_flag_may_read_a_stale_x() {
        // MP with relaxed ops: reading the flag does not order the read of x.
        assert_ok(vec![
            put(Write, 1, X, 1, st(1, 1), 0),
            put(Write, 1, F, 1, st(1, 1), 2),
            get(Read, 2, F, Some(1), st(1, 1), 4),
            get(Read, 2, X, None, Stamp::ZERO, 6),
        ]);
        // An acquire of a relaxed flag does not synchronize either.
        assert_ok(vec![
            put(Write, 1, X, 1, st(1, 1), 0),
            put(Write, 1, F, 1, st(1, 1), 2),
            get(Acquire, 2, F, Some(1), st(1, 1), 4),
            get(Read, 2, X, None, Stamp::ZERO, 6),
        ]);
    }

    #[test]
    fn store_buffering_with_relaxed_ops_may_read_0_0() {
        assert_ok(vec![
            put(Write, 1, X, 1, st(1, 1), 0),
            get(Read, 1, Y, None, Stamp::ZERO, 2),
            put(Write, 2, Y, 1, st(1, 2), 0),
            get(Read, 2, X, None, Stamp::ZERO, 2),
        ]);
    }

    #[test]
    fn relaxed_reads_of_another_session_may_disagree_through_a_release() {
        // S1 reads a newer x from S0 and releases; S2 acquires and reads an older x. S0's
        // write is relaxed, so nothing orders it before S2's read (Kite allows this).
        assert_ok(vec![
            put(Write, 0, X, 1, st(1, 0), 0),
            put(Write, 0, X, 2, st(2, 0), 1),
            get(Read, 1, X, Some(2), st(2, 0), 2),
            put(Release, 1, F, 1, st(1, 1), 4),
            get(Acquire, 2, F, Some(1), st(1, 1), 6),
            get(Read, 2, X, Some(1), st(1, 0), 8),
        ]);
    }

    #[test]
    fn duplicate_stamp_is_rejected() {
        assert_rejected(
            vec![put(Write, 1, X, 1, st(1, 1), 0), put(Write, 2, X, 2, st(1, 1), 0)],
            rule::DUPLICATE_STAMP,
        );
    }

    #[test]
    fn zero_stamp_is_rejected() {
        assert_rejected(vec![put(Write, 1, X, 1, Stamp::ZERO, 0)], rule::ZERO_STAMP);
    }

    #[test]
    fn value_mismatch_is_rejected() {
        assert_rejected(
            vec![put(Write, 1, X, 1, st(1, 1), 0), get(Read, 2, X, Some(2), st(1, 1), 2)],
            rule::VALUE_MISMATCH,
        );
        assert_rejected(vec![get(Read, 2, X, Some(2), Stamp::ZERO, 2)], rule::VALUE_MISMATCH);
    }

    #[test]
    fn a_phantom_read_is_rejected() {
        assert_rejected(vec![get(Read, 1, X, Some(9), st(5, 5), 0)], rule::PHANTOM_READ);
        // A completed write of that value does not count: its stamp is known and differs.
        assert_rejected(
            vec![put(Write, 1, X, 9, st(1, 1), 0), get(Read, 2, X, Some(9), st(5, 5), 2)],
            rule::PHANTOM_READ,
        );
    }

    #[test]
    fn faa_arithmetic_is_checked() {
        assert_rejected(
            vec![faa(1, X, 1, (Stamp::ZERO, None), (rmw_st(0, 0, 1), 5), 0)],
            rule::FAA_ARITHMETIC,
        );
        // Wrapping: u64::MAX + 1 = 0.
        assert_ok(vec![
            put(Write, 1, X, u64::MAX, st(1, 1), 0),
            faa(1, X, 1, (st(1, 1), Some(u64::MAX)), (rmw_st(1, 1, 1), 0), 2),
        ]);
    }

    #[test]
    fn cas_semantics_are_checked() {
        // Swapped though it read absent, not 3.
        assert_rejected(
            vec![cas(1, X, Some(3), 7, (Stamp::ZERO, None), Some(rmw_st(0, 0, 1)), 0)],
            rule::CAS_SEMANTICS,
        );
        // Failed though it read what it expected.
        assert_rejected(
            vec![cas(1, X, None, 7, (Stamp::ZERO, None), None, 0)],
            rule::CAS_SEMANTICS,
        );
        // Swapped in another value than its new one.
        let mut wrong = cas(1, X, None, 7, (Stamp::ZERO, None), Some(rmw_st(0, 0, 1)), 0);
        wrong.wrote = Some((rmw_st(0, 0, 1), 8));
        assert_rejected(vec![wrong], rule::CAS_SEMANTICS);
    }

    #[test]
    fn a_write_between_an_rmws_read_and_write_is_rejected() {
        assert_rejected(
            vec![
                put(Write, 2, X, 5, st(1, 1), 0),
                faa(1, X, 1, (Stamp::ZERO, None), (st(1, 2), 1), 0),
            ],
            rule::RMW_ATOMICITY,
        );
    }

    #[test]
    fn two_rmws_on_one_read_are_rejected() {
        let found = rules(vec![
            faa(1, X, 1, (Stamp::ZERO, None), (rmw_st(0, 0, 1), 1), 0),
            faa(2, X, 1, (Stamp::ZERO, None), (rmw_st(0, 0, 2), 1), 0),
        ]);
        assert!(found.contains(&rule::TWO_RMWS_ON_ONE_READ), "{found:?}");
        assert!(!found.contains(&rule::RMW_ATOMICITY), "named once: {found:?}");
    }

    #[test]
    fn an_hb_cycle_is_rejected() {
        // S1: Acq x (reads S2's Rel x); Rel y.  S2: Acq y (reads S1's Rel y); Rel x.
        assert_rejected(
            vec![
                concurrent(get(Acquire, 1, X, Some(2), st(1, 2), 0)),
                concurrent(put(Release, 1, Y, 1, st(1, 1), 0)),
                concurrent(get(Acquire, 2, Y, Some(1), st(1, 1), 0)),
                concurrent(put(Release, 2, X, 2, st(1, 2), 0)),
            ],
            rule::HB_CYCLE,
        );
        // An acquire that completed before the release it read was invoked: real time is
        // not in hb, so the sync-order rules catch it.
        let found = rules(vec![
            get(Acquire, 1, F, Some(5), st(1, 2), 0),
            put(Release, 2, F, 5, st(1, 2), 10),
        ]);
        assert!(
            found.contains(&rule::LINEARIZABILITY) || found.contains(&rule::SYNC_ORDER),
            "{found:?}"
        );
    }

    #[test]
    fn l1_a_stale_read_after_an_acquire_is_rejected() {
        assert_rejected(message_passing((None, Stamp::ZERO)), rule::STALE_READ);
        // The same with every op concurrent: session order and sw alone order it.
        let ops = message_passing((None, Stamp::ZERO)).into_iter().map(concurrent).collect();
        assert_rejected(ops, rule::STALE_READ);
    }

    #[test]
    fn l3_a_stale_read_through_a_transitive_chain_is_rejected() {
        let ops = vec![
            put(Write, 1, X, 1, st(1, 1), 0),
            put(Release, 1, F, 1, st(1, 1), 0),
            get(Acquire, 2, F, Some(1), st(1, 1), 0),
            put(Release, 2, G, 1, st(1, 2), 0),
            get(Acquire, 3, G, Some(1), st(1, 2), 0),
            get(Read, 3, X, None, Stamp::ZERO, 0),
        ];
        let ops: Vec<RcOp> = ops.into_iter().map(concurrent).collect();
        let verdict = check(&history(ops.clone()));
        assert_eq!(verdict.violations.len(), 1, "{:?}", verdict.violations);
        assert_eq!(verdict.violations[0].rule, rule::STALE_READ);
        // The message shows the chain W x -> Rel f1 -> Acq f1 -> Rel f2 -> Acq f2 -> R x.
        assert_eq!(verdict.violations[0].message.matches("\n  ").count(), 6);
        // With x read as 1 it holds.
        let mut good = ops;
        good[5] = concurrent(get(Read, 3, X, Some(1), st(1, 1), 0));
        assert_ok(good);
    }

    #[test]
    fn l10_rmws_as_barriers() {
        // MP with an FAA as the release and a CAS as the acquire.
        let ops = |x: (Option<u64>, Stamp)| {
            vec![
                concurrent(put(Write, 1, X, 1, st(1, 1), 0)),
                concurrent(faa(1, F, 1, (Stamp::ZERO, None), (rmw_st(0, 0, 1), 1), 0)),
                concurrent(cas(
                    2,
                    F,
                    Some(1),
                    7,
                    (rmw_st(0, 0, 1), Some(1)),
                    Some(rmw_st(0, 0, 2)),
                    0,
                )),
                concurrent(get(Read, 2, X, x.0, x.1, 0)),
            ]
        };
        assert_ok(ops((Some(1), st(1, 1))));
        assert_rejected(ops((None, Stamp::ZERO)), rule::STALE_READ);
    }

    #[test]
    fn a_read_from_the_future_is_rejected() {
        // S1: R x (reads S2's later write); Rel f.  S2: Acq f; W x.
        let ops = vec![
            get(Read, 1, X, Some(7), st(1, 2), 0),
            put(Release, 1, F, 1, st(1, 1), 0),
            get(Acquire, 2, F, Some(1), st(1, 1), 0),
            put(Write, 2, X, 7, st(1, 2), 0),
        ];
        assert_rejected(ops.into_iter().map(concurrent).collect(), rule::FUTURE_READ);
    }

    #[test]
    fn a_write_ordered_before_an_hb_earlier_write_is_rejected() {
        // S1: W x @(5,1); Rel f.  S2: Acq f; W x @(1,2): smaller than a write before it.
        let ops = vec![
            put(Write, 1, X, 1, st(5, 1), 0),
            put(Release, 1, F, 1, st(1, 1), 0),
            get(Acquire, 2, F, Some(1), st(1, 1), 0),
            put(Write, 2, X, 2, st(1, 2), 0),
        ];
        assert_rejected(ops.into_iter().map(concurrent).collect(), rule::HB_WRITE_ORDER);
    }

    #[test]
    fn corr_is_rejected_by_coherence() {
        let found = rules(vec![
            put(Write, 0, X, 1, st(1, 0), 0),
            put(Write, 0, X, 2, st(2, 0), 1),
            get(Read, 1, X, Some(2), st(2, 0), 2),
            get(Read, 1, X, Some(1), st(1, 0), 3),
        ]);
        assert_eq!(found, vec![rule::COHERENCE]);
    }

    #[test]
    fn reading_older_than_ones_own_write_is_rejected_by_coherence() {
        let found = rules(vec![
            put(Write, 0, X, 1, st(1, 0), 0),
            put(Write, 1, X, 2, st(2, 1), 1),
            get(Read, 1, X, Some(1), st(1, 0), 3),
        ]);
        assert!(found.contains(&rule::COHERENCE), "{found:?}");
    }

    #[test]
    fn an_acquire_missing_a_completed_release_breaks_linearizability() {
        let ops = vec![
            put(Release, 0, X, 1, st(1, 0), 0),
            put(Release, 1, X, 2, st(2, 1), 10),
            get(Acquire, 2, X, Some(1), st(1, 0), 20),
        ];
        assert_rejected(ops, rule::LINEARIZABILITY);
    }

    #[test]
    fn acquires_going_backwards_in_real_time_break_only_linearizability() {
        // Both read relaxed writes, so happens-before does not see it; rule 6 does.
        let ops = vec![
            put(Write, 0, X, 1, st(1, 0), 0),
            put(Write, 0, X, 2, st(2, 0), 1),
            get(Acquire, 1, X, Some(2), st(2, 0), 10),
            get(Acquire, 2, X, Some(1), st(1, 0), 20),
        ];
        let found = rules(ops.clone());
        assert!(found.contains(&rule::LINEARIZABILITY), "{found:?}");
        assert!(!found.contains(&rule::STALE_READ), "{found:?}");
        // Concurrent, they are fine.
        assert_ok(vec![ops[0].clone(), ops[1].clone(), ops[2].clone(), {
            let mut late = ops[3].clone();
            late.invoke = 5;
            late
        }]);
    }

    #[test]
    fn a_failed_weak_cas_may_read_locally() {
        // A weak CAS that fails after a completed release may have read a stale local
        // value; a strong one may not.
        let ops = |strong: bool| {
            vec![
                put(Release, 0, X, 1, st(1, 0), 0),
                put(Release, 1, X, 2, st(2, 1), 10),
                RcOp { strong, ..cas(2, X, Some(2), 3, (st(1, 0), Some(1)), None, 20) },
            ]
        };
        assert_ok(ops(false));
        assert_rejected(ops(true), rule::LINEARIZABILITY);
    }

    #[test]
    fn l5_store_buffering_on_sync_ops_is_rejected() {
        // S1: Rel x; Acq y reads 0.  S2: Rel y; Acq x reads 0. All concurrent.
        let ops = vec![
            put(Release, 1, X, 1, st(1, 1), 0),
            get(Acquire, 1, Y, None, Stamp::ZERO, 0),
            put(Release, 2, Y, 1, st(1, 2), 0),
            get(Acquire, 2, X, None, Stamp::ZERO, 0),
        ];
        let found = rules(ops.into_iter().map(concurrent).collect());
        assert_eq!(found, vec![rule::SYNC_ORDER]);
    }

    #[test]
    fn l6_iriw_on_sync_ops_is_rejected_and_its_relaxed_form_accepted() {
        let ops = |read: RcKind| {
            vec![
                put(Release, 1, X, 1, st(1, 1), 0),
                put(Release, 2, Y, 1, st(1, 2), 0),
                get(Acquire, 3, X, Some(1), st(1, 1), 0),
                get(read, 3, Y, None, Stamp::ZERO, 0),
                get(Acquire, 4, Y, Some(1), st(1, 2), 0),
                get(read, 4, X, None, Stamp::ZERO, 0),
            ]
            .into_iter()
            .map(concurrent)
            .collect::<Vec<_>>()
        };
        assert_eq!(rules(ops(Acquire)), vec![rule::SYNC_ORDER]);
        // The second reads relaxed: the first acquire orders them, but a relaxed read may
        // miss a release that does not happen-before it.
        assert_ok(ops(Read));
    }

    #[test]
    fn an_incomplete_write_is_attributed_by_value() {
        // S1's write has no reply and no stamp; S2 reads its value with a new stamp.
        assert_ok(vec![
            no_reply(RcOp { wrote: None, ..put(Write, 1, X, 5, st(9, 9), 0) }),
            get(Read, 2, X, Some(5), st(3, 1), 2),
        ]);
        // Attributed, it took effect, so a read after an acquire of S1's later release
        // must see it (it is before the release in S1's session order).
        let ops = |seen: bool| {
            let mut ops = vec![
                no_reply(RcOp { wrote: None, ..put(Write, 1, X, 5, st(9, 9), 0) }),
                put(Release, 1, F, 1, st(1, 1), 2),
                get(Acquire, 2, F, Some(1), st(1, 1), 4),
                get(Read, 2, X, None, Stamp::ZERO, 6),
            ];
            if seen {
                ops.push(get(Read, 3, X, Some(5), st(3, 1), 8));
            }
            ops
        };
        assert_ok(ops(false));
        assert_rejected(ops(true), rule::STALE_READ);
    }

    #[test]
    fn an_incomplete_rmw_is_attributed_from_a_read_of_its_stamp() {
        // S1's FAA has no reply; S2 reads the RMW stamp it made (version 0, rmw 1).
        let incomplete = RcOp {
            complete: None,
            read: None,
            wrote: None,
            ..faa(1, X, 2, (Stamp::ZERO, None), (rmw_st(0, 0, 1), 2), 0)
        };
        assert_ok(vec![incomplete.clone(), get(Read, 2, X, Some(2), rmw_st(0, 0, 1), 2)]);
        // A CAS without a reply is attributed only when the value read is its new value.
        let cas_incomplete = RcOp {
            complete: None,
            read: None,
            wrote: None,
            ..cas(1, X, None, 7, (Stamp::ZERO, None), None, 0)
        };
        assert_ok(vec![cas_incomplete.clone(), get(Read, 2, X, Some(7), rmw_st(0, 0, 1), 2)]);
        assert_rejected(
            vec![cas_incomplete, get(Read, 2, X, Some(8), rmw_st(0, 0, 1), 2)],
            rule::PHANTOM_READ,
        );
        // A plain write's stamp (rmw 0) is never taken for an RMW's.
        assert_rejected(
            vec![incomplete, get(Read, 2, X, Some(2), st(4, 4), 2)],
            rule::PHANTOM_READ,
        );
    }

    #[test]
    fn an_unobserved_incomplete_write_is_left_out() {
        // A write without a reply that nobody read may never have happened: a later read
        // of the initial value after acquiring a release that follows it is fine.
        assert_ok(vec![
            no_reply(put(Write, 1, X, 5, st(3, 1), 0)),
            put(Release, 1, F, 1, st(1, 1), 2),
            get(Acquire, 2, F, Some(1), st(1, 1), 4),
            get(Read, 2, X, None, Stamp::ZERO, 6),
        ]);
    }

    #[test]
    fn malformed_ops_are_reported_alone() {
        let mut acquire = get(Acquire, 1, X, None, Stamp::ZERO, 0);
        acquire.read = None;
        let verdict = check(&history(vec![acquire]));
        assert_eq!(verdict.violations[0].rule, rule::MALFORMED);
        assert!(verdict.violations[0].message.contains("needs `read`"));
        let mut twice = history(vec![get(Read, 1, X, None, Stamp::ZERO, 0); 2]);
        twice[1].seq = 0;
        assert_eq!(check(&twice).violations[0].rule, rule::MALFORMED);
    }

    #[test]
    fn violations_are_counted_beyond_those_kept() {
        let ops: Vec<RcOp> = (0..30).map(|i| get(Read, i, X, Some(9), st(5, 5), 0)).collect();
        let verdict = check(&history(ops));
        assert_eq!(verdict.violation_count, 30);
        assert_eq!(verdict.violations.len(), VIOLATIONS_KEPT);
        assert_eq!(verdict.verdict(), "violation");
    }

    #[test]
    fn jsonl_round_trips_and_checks_the_header() {
        let ops = history(message_passing((Some(1), st(1, 1))));
        let mut bytes = Vec::new();
        write_jsonl(&mut bytes, &ops).unwrap();
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(text.starts_with(HEADER));
        assert_eq!(read_jsonl(&bytes[..]).unwrap(), ops);
        let e = read_jsonl(&b"{\"format\":\"keel-history\",\"version\":1}\n"[..]).unwrap_err();
        assert!(e.starts_with("line 1:") && e.contains("keel-history"), "{e}");
        let e = read_jsonl(&b"{\"format\":\"keel-rc\",\"version\":2}\n"[..]).unwrap_err();
        assert!(e.contains("version 2"), "{e}");
        let minimal = "{\"format\":\"keel-rc\",\"version\":1}\n\n{\"id\":1,\"session\":1,\"machine\":0,\"seq\":0,\"kind\":\"acquire\",\"key\":3,\"invoke\":5,\"complete\":6,\"read\":[{\"version\":0,\"writer\":0,\"rmw\":0},null]}\n";
        let read = read_jsonl(minimal.as_bytes()).unwrap();
        assert_eq!(read[0].kind, Acquire);
        assert!(check(&read).holds());
        let duplicate = format!("{minimal}{}", minimal.lines().nth(2).unwrap());
        let e = read_jsonl(duplicate.as_bytes()).unwrap_err();
        assert!(e.starts_with("line 4: duplicate op id"), "{e}");
        let incomplete = minimal.replace("\"complete\":6,", "");
        let e = read_jsonl(incomplete.as_bytes()).unwrap_err();
        assert!(e.starts_with("line 3:") && e.contains("without a reply"), "{e}");
    }
}
