//! The Keel history format: versioned JSON Lines, one record per line
//! (`docs/history-format.md` is the specification; keep the two in step).
//!
//! ```text
//! {"type":"header","format":"keel-history","version":1}
//! {"type":"op","id":0,"client":3,"op":"put","key":"k","value":"v","durability":"memory",
//!  "invoke_ns":100,"complete_ns":250,"outcome":"ok","node":2,"version":{"epoch":1,"index":5}}
//! {"type":"op","id":1,"client":4,"op":"get","key":"k","level":"monotonic",
//!  "invoke_ns":300,"complete_ns":380,"outcome":"ok","node":1,"result":"v",
//!  "version":{"epoch":1,"index":5}}
//! {"type":"survivor","version":{"epoch":1,"index":5},"key":"k","value":"v"}
//! ```
//! (each record is one line in a file; wrapped here for reading).
//!
//! Keys and values are JSON strings holding the bytes as UTF-8; recorders convert
//! non-UTF-8 bytes lossily, so workloads that are checked use UTF-8 keys and values.
//!
//! Layout: the record types ([`Record`], [`Op`], [`OpKind`], [`Outcome`], [`Survivor`]);
//! [`HistoryWriter`], which recorders use; [`HistoryReader`], which streams and validates
//! a file record by record; [`read_history`] / [`parse_history`], which collect a whole
//! history into a [`KeelHistory`].

use crate::error::{InputError, LineSource};
use keel_types::{Durability, ReadLevel, Version};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::io::{BufRead, Write};
use std::path::Path;

/// The format's name in the header.
pub const FORMAT_NAME: &str = "keel-history";
/// The format version this crate writes: 2 adds transactions (`txn` and `txn-entry`
/// records). Readers accept it and version 1 (which holds no transactions).
pub const FORMAT_VERSION: u32 = 2;
/// The first version, still read.
pub const FORMAT_VERSION_V1: u32 = 1;

/// One line of a history file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Record {
    /// The first line: names the format and its version.
    Header {
        /// Always [`FORMAT_NAME`].
        format: String,
        /// Always [`FORMAT_VERSION`].
        version: u32,
    },
    /// One client operation, from invocation to completion.
    Op(Op),
    /// One write that survived in the cluster's final log, in log order. Written after
    /// every `op` record, once the run has ended and the cluster has converged.
    Survivor(Survivor),
    /// One transaction (`MULTI` ... `EXEC`, with what `WATCH` read); among the `op`
    /// records (version 2).
    Txn(Txn),
    /// One transaction's entry in the final log, in log order among the survivors, before
    /// the survivors of its writes (version 2).
    #[serde(rename = "txn-entry")]
    TxnEntry(TxnEntry),
}

/// One transaction: its watched keys, its operations (applied in order, all or none) and,
/// once committed, what they returned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Txn {
    /// Unique within the history, among op and txn ids alike.
    pub id: u64,
    /// The client (process) that issued it.
    pub client: u64,
    /// The keys `WATCH` read, with the version each had (`None`: never written).
    #[serde(default)]
    pub watch: Vec<Watched>,
    /// The operations, in order.
    pub ops: Vec<TxnOp>,
    /// The durability asked for.
    pub durability: Durability,
    /// Invocation time (the `WATCH` reads' start), nanoseconds on the recorder's clock.
    pub invoke_ns: u64,
    /// Completion time; `None` when the outcome is unknown.
    #[serde(default)]
    pub complete_ns: Option<u64>,
    /// `ok`: committed, its results as recorded; `fail`: applied nothing (aborted by
    /// `WATCH`, or an operation failed); `unknown`: may or may not have been applied.
    pub outcome: Outcome,
    /// For `fail`: whether `WATCH` aborted it (a watched key had changed).
    #[serde(default)]
    pub aborted: bool,
    /// The node that served it, when known.
    #[serde(default)]
    pub node: Option<u32>,
    /// When committed: the version of its log entry (every write of it has this version).
    #[serde(default)]
    pub version: Option<Version>,
}

/// A key `WATCH` read, and the version it had then.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Watched {
    /// The key.
    pub key: String,
    /// Its version when read (`None`: never written).
    #[serde(default)]
    pub version: Option<Version>,
}

/// One operation of a transaction, with its result once committed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum TxnOp {
    /// A read: it sees the state before the transaction and the transaction's own
    /// writes before it.
    Get {
        /// The key.
        key: String,
        /// The value read (`None`: absent).
        #[serde(default)]
        result: Option<String>,
        /// The version of the write it read (`None`: never written).
        #[serde(default)]
        version: Option<Version>,
    },
    /// A write.
    Put {
        /// The key.
        key: String,
        /// The value written.
        value: String,
    },
    /// A delete.
    Delete {
        /// The key.
        key: String,
    },
    /// An increment (a value that is no integer fails the whole transaction).
    Incr {
        /// The key.
        key: String,
        /// The amount added.
        delta: i64,
        /// The value after it, once committed.
        #[serde(default)]
        result: Option<i64>,
    },
}

impl TxnOp {
    /// The key the operation touches.
    pub fn key(&self) -> &str {
        match self {
            TxnOp::Get { key, .. }
            | TxnOp::Put { key, .. }
            | TxnOp::Delete { key }
            | TxnOp::Incr { key, .. } => key,
        }
    }
}

/// A transaction's entry in the final log: whether replaying the log applied it (its
/// watched keys unchanged and no operation failing) or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnEntry {
    /// Its version.
    pub version: Version,
    /// Whether it applied (then its writes follow as survivors of this version).
    pub applied: bool,
}

/// Most operations (and most watched keys) one transaction may hold.
pub const TXN_OPS_MAX: usize = 1024;

/// One client operation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Op {
    /// Unique within the history.
    pub id: u64,
    /// The client (process) that issued it; one operation at a time per client.
    pub client: u64,
    /// What was asked and what came back.
    #[serde(flatten)]
    pub kind: OpKind,
    /// Invocation time, nanoseconds on the recorder's clock.
    pub invoke_ns: u64,
    /// Completion time; `None` when the outcome is unknown.
    #[serde(default)]
    pub complete_ns: Option<u64>,
    /// How it ended.
    pub outcome: Outcome,
    /// The node that served it, when known.
    #[serde(default)]
    pub node: Option<u32>,
    /// For reads: the version of the write whose value was returned (`None`: the key was
    /// never written). For writes: the version created.
    #[serde(default)]
    pub version: Option<Version>,
    /// For a read invoked as a Correctable: its preliminary views, in the order they
    /// came; the op's own `level`, `result` and `version` are the final view
    /// (`docs/correctables.md`). Empty for every other op.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub views: Vec<View>,
}

/// A preliminary view of a read (see [`Op::views`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct View {
    /// The level it satisfies.
    pub level: ReadLevel,
    /// The value it showed (`None`: absent).
    #[serde(default)]
    pub result: Option<String>,
    /// The version of the write it showed (`None`: the key was never written).
    #[serde(default)]
    pub version: Option<Version>,
    /// When it reached the client, on the recorder's clock.
    pub at_ns: u64,
}

/// Most preliminary views one op may carry (one per level below the strongest).
pub const VIEWS_MAX: usize = 2;

/// The operation and its operation-specific arguments and results.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum OpKind {
    /// A read of one key.
    Get {
        /// The key.
        key: String,
        /// The level asked for.
        level: ReadLevel,
        /// The value read (`None`: absent).
        #[serde(default)]
        result: Option<String>,
    },
    /// A write of one key.
    Put {
        /// The key.
        key: String,
        /// The value written.
        value: String,
        /// The durability asked for.
        durability: Durability,
    },
    /// A delete of one key.
    Delete {
        /// The key.
        key: String,
        /// The durability asked for.
        durability: Durability,
    },
    /// A compare-and-set: `ok` means it swapped, `fail` means the key did not hold
    /// `expected`.
    Cas {
        /// The key.
        key: String,
        /// The value required (`None`: absent).
        expected: Option<String>,
        /// The value written when it swaps.
        value: String,
        /// The durability asked for.
        durability: Durability,
    },
    /// An increment; the result is the value after it.
    Incr {
        /// The key.
        key: String,
        /// The amount added.
        delta: i64,
        /// The durability asked for.
        durability: Durability,
        /// The new value, when known.
        #[serde(default)]
        result: Option<i64>,
    },
}

/// How an operation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Completed; results are as recorded.
    Ok,
    /// Definitely did not take effect (for cas: did not swap, having read another value).
    Fail,
    /// May or may not have taken effect, at any point after invocation.
    Unknown,
}

/// One surviving write in the final log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Survivor {
    /// Its version.
    pub version: Version,
    /// The key it wrote.
    pub key: String,
    /// The value it left (`None`: a delete).
    #[serde(default)]
    pub value: Option<String>,
}

/// The most operations one history may hold (a bound on the reader's memory).
pub const OPS_MAX: usize = 50_000_000;
/// The most survivor records one history may hold.
pub const SURVIVORS_MAX: usize = 50_000_000;

impl OpKind {
    /// The key the operation touches.
    pub fn key(&self) -> &str {
        match self {
            OpKind::Get { key, .. }
            | OpKind::Put { key, .. }
            | OpKind::Delete { key, .. }
            | OpKind::Cas { key, .. }
            | OpKind::Incr { key, .. } => key,
        }
    }

    /// Gives the operation another key (a simulator's combined history names each
    /// keyspace's keys apart).
    pub fn rename_key(&mut self, to: String) {
        match self {
            OpKind::Get { key, .. }
            | OpKind::Put { key, .. }
            | OpKind::Delete { key, .. }
            | OpKind::Cas { key, .. }
            | OpKind::Incr { key, .. } => *key = to,
        }
    }

    /// The operation's name as written in the format.
    pub fn name(&self) -> &'static str {
        match self {
            OpKind::Get { .. } => "get",
            OpKind::Put { .. } => "put",
            OpKind::Delete { .. } => "delete",
            OpKind::Cas { .. } => "cas",
            OpKind::Incr { .. } => "incr",
        }
    }
}

/// Writes a history: the header at once, then `op` and `txn` records, then `txn-entry`
/// and `survivor` records.
///
/// Recorders (simulator, server tests, benchmarks) use it over any `io::Write`. Writing
/// an op after a survivor is a programmer error and panics, because readers reject it.
pub struct HistoryWriter<W: Write> {
    out: W,
    survivors_started: bool,
    line: Vec<u8>,
}

impl<W: Write> HistoryWriter<W> {
    /// Starts a history on `out` by writing the header line.
    pub fn new(out: W) -> std::io::Result<HistoryWriter<W>> {
        let mut writer = HistoryWriter { out, survivors_started: false, line: Vec::new() };
        writer
            .record(&Record::Header { format: FORMAT_NAME.to_string(), version: FORMAT_VERSION })?;
        Ok(writer)
    }

    /// Appends one operation. Panics if a survivor was already written.
    pub fn op(&mut self, op: &Op) -> std::io::Result<()> {
        assert!(!self.survivors_started, "op record written after survivor records");
        if let Some(complete_ns) = op.complete_ns {
            assert!(complete_ns >= op.invoke_ns, "op {} completes before it is invoked", op.id);
        }
        self.record(&Record::Op(op.clone()))
    }

    /// Appends one surviving write; survivors must come in log order.
    pub fn survivor(&mut self, survivor: &Survivor) -> std::io::Result<()> {
        self.survivors_started = true;
        self.record(&Record::Survivor(survivor.clone()))
    }

    /// Appends one transaction. Panics if a survivor was already written.
    pub fn txn(&mut self, txn: &Txn) -> std::io::Result<()> {
        assert!(!self.survivors_started, "txn record written after survivor records");
        self.record(&Record::Txn(txn.clone()))
    }

    /// Appends one transaction entry of the final log, before the survivors of its
    /// writes.
    pub fn txn_entry(&mut self, entry: &TxnEntry) -> std::io::Result<()> {
        self.survivors_started = true;
        self.record(&Record::TxnEntry(*entry))
    }

    /// Flushes and returns the underlying writer.
    pub fn finish(mut self) -> std::io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }

    fn record(&mut self, record: &Record) -> std::io::Result<()> {
        self.line.clear();
        serde_json::to_writer(&mut self.line, record)?;
        debug_assert!(!self.line.contains(&b'\n'), "a record is one line");
        self.line.push(b'\n');
        self.out.write_all(&self.line)
    }
}

/// A whole Keel history: its operations in file order and its surviving writes in log
/// order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeelHistory {
    /// Operations, in file order.
    pub ops: Vec<Op>,
    /// Surviving writes, in log order (increasing versions; several survivors share a
    /// version only as the writes of one transaction, each of another key).
    pub survivors: Vec<Survivor>,
    /// Transactions, in file order.
    pub txns: Vec<Txn>,
    /// Transactions' entries in the final log, in log order.
    pub txn_entries: Vec<TxnEntry>,
}

/// Streams the records of a history, checking the header, the record order and each
/// record on its own (see `docs/history-format.md`, "Validity").
///
/// Yields the `op` and `survivor` records (not the header); stops at the first error.
pub struct HistoryReader<R> {
    lines: LineSource<R>,
    header_seen: bool,
    survivors_started: bool,
    failed: bool,
    op_ids: HashSet<u64>,
    survivor_count: usize,
    survivor_last: Option<Version>,
    /// The version the header names.
    version: u32,
    /// The last `txn-entry` that applied, and the keys its survivors named so far.
    txn_open: Option<(Version, HashSet<String>)>,
}

impl<R: BufRead> HistoryReader<R> {
    /// Reads `reader`, naming it `file` in errors.
    pub fn new(reader: R, file: &str) -> HistoryReader<R> {
        HistoryReader {
            lines: LineSource::new(reader, file),
            header_seen: false,
            survivors_started: false,
            failed: false,
            op_ids: HashSet::new(),
            survivor_count: 0,
            survivor_last: None,
            version: FORMAT_VERSION,
            txn_open: None,
        }
    }

    fn next_record(&mut self) -> Result<Option<Record>, InputError> {
        loop {
            let Some(text) = self.lines.next_line()? else {
                if !self.header_seen {
                    return Err(self.lines.error("empty history: no header line"));
                }
                return Ok(None);
            };
            if text.trim().is_empty() {
                continue;
            }
            let record: Record = serde_json::from_str(&text)
                .map_err(|e| self.lines.error(format!("not a history record: {e}")))?;
            self.validate(&record)?;
            if matches!(record, Record::Header { .. }) {
                continue;
            }
            return Ok(Some(record));
        }
    }

    fn validate(&mut self, record: &Record) -> Result<(), InputError> {
        match record {
            Record::Header { format, version } => {
                if self.header_seen {
                    return Err(self.lines.error("a second header record"));
                }
                let known = [FORMAT_VERSION_V1, FORMAT_VERSION];
                if format != FORMAT_NAME || !known.contains(version) {
                    return Err(self.lines.error(format!(
                        "header names format '{format}' version {version}; \
                         expected '{FORMAT_NAME}' version {FORMAT_VERSION_V1} or {FORMAT_VERSION}"
                    )));
                }
                self.header_seen = true;
                self.version = *version;
                Ok(())
            }
            _ if !self.header_seen => Err(self.lines.error("the first record must be the header")),
            Record::Op(op) => self.validate_op(op),
            Record::Survivor(survivor) => self.validate_survivor(survivor),
            Record::Txn(_) | Record::TxnEntry(_) if self.version < FORMAT_VERSION => {
                Err(self.lines.error(format!("transactions need format version {FORMAT_VERSION}")))
            }
            Record::Txn(txn) => self.validate_txn(txn),
            Record::TxnEntry(entry) => self.validate_txn_entry(entry),
        }
    }

    /// An op or txn id: before any survivor, unique, within the bound.
    fn new_op_id(&mut self, id: u64, what: &str) -> Result<(), InputError> {
        if self.survivors_started {
            return Err(self.lines.error(format!("{what} record after survivor records")));
        }
        if self.op_ids.len() >= OPS_MAX {
            return Err(self.lines.error(format!("more than {OPS_MAX} operations")));
        }
        if !self.op_ids.insert(id) {
            return Err(self.lines.error(format!("duplicate op id {id}")));
        }
        Ok(())
    }

    /// `complete_ns` present for `ok` and `fail`, never before `invoke_ns`.
    fn check_times(
        &self,
        id: u64,
        outcome: Outcome,
        invoke_ns: u64,
        complete_ns: Option<u64>,
    ) -> Result<(), InputError> {
        match (outcome, complete_ns) {
            (Outcome::Ok | Outcome::Fail, None) => {
                Err(self.lines.error(format!("op {id} has outcome {outcome:?} but no complete_ns")))
            }
            (_, Some(complete_ns)) if complete_ns < invoke_ns => Err(self.lines.error(format!(
                "op {id} completes ({complete_ns}) before it is invoked ({invoke_ns})"
            ))),
            _ => Ok(()),
        }
    }

    fn validate_txn(&mut self, txn: &Txn) -> Result<(), InputError> {
        self.new_op_id(txn.id, "txn")?;
        let id = txn.id;
        if txn.ops.is_empty() || txn.ops.len() > TXN_OPS_MAX || txn.watch.len() > TXN_OPS_MAX {
            return Err(self.lines.error(format!(
                "txn {id} has {} operations and {} watched keys: 1 to {TXN_OPS_MAX} and at most {TXN_OPS_MAX}",
                txn.ops.len(),
                txn.watch.len()
            )));
        }
        if txn.aborted && txn.outcome != Outcome::Fail {
            return Err(self.lines.error(format!("txn {id} is aborted but not failed")));
        }
        if txn.outcome == Outcome::Ok && txn.version.is_none() {
            return Err(self.lines.error(format!("txn {id} committed without a version")));
        }
        self.check_times(id, txn.outcome, txn.invoke_ns, txn.complete_ns)
    }

    fn validate_txn_entry(&mut self, entry: &TxnEntry) -> Result<(), InputError> {
        self.survivors_started = true;
        if self.survivor_last.is_some_and(|last| entry.version <= last) {
            return Err(self.lines.error(format!(
                "txn-entry version {} is not after the previous survivor: survivors must be in log order",
                entry.version
            )));
        }
        self.survivor_last = Some(entry.version);
        self.txn_open = entry.applied.then(|| (entry.version, HashSet::new()));
        Ok(())
    }

    fn validate_op(&mut self, op: &Op) -> Result<(), InputError> {
        self.new_op_id(op.id, "op")?;
        if !op.views.is_empty() && !matches!(op.kind, OpKind::Get { .. }) {
            return Err(self.lines.error(format!("op {} has views but is not a get", op.id)));
        }
        if op.views.len() > VIEWS_MAX {
            let n = op.views.len();
            return Err(self
                .lines
                .error(format!("op {} has {n} views; at most {VIEWS_MAX}", op.id)));
        }
        self.check_times(op.id, op.outcome, op.invoke_ns, op.complete_ns)
    }

    fn validate_survivor(&mut self, survivor: &Survivor) -> Result<(), InputError> {
        self.survivors_started = true;
        if self.survivor_count >= SURVIVORS_MAX {
            return Err(self.lines.error(format!("more than {SURVIVORS_MAX} survivors")));
        }
        // A transaction's writes share its entry's version, each of another key.
        let of_txn = match &mut self.txn_open {
            Some((version, keys)) if *version == survivor.version => {
                if !keys.insert(survivor.key.clone()) {
                    return Err(self.lines.error(format!(
                        "two survivors of key {:?} at version {}",
                        survivor.key, survivor.version
                    )));
                }
                true
            }
            _ => false,
        };
        if let Some(last) = self.survivor_last.filter(|_| !of_txn) {
            if survivor.version <= last {
                return Err(self.lines.error(format!(
                    "survivor version {} is not after the previous one {last}: \
                     survivors must be in log order",
                    survivor.version
                )));
            }
        }
        if !of_txn {
            self.txn_open = None;
        }
        self.survivor_last = Some(survivor.version);
        self.survivor_count += 1;
        Ok(())
    }
}

impl<R: BufRead> Iterator for HistoryReader<R> {
    type Item = Result<Record, InputError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let item = self.next_record().transpose();
        if matches!(item, Some(Err(_))) {
            self.failed = true;
        }
        item
    }
}

/// Reads a whole history from `reader`, naming it `file` in errors.
pub fn parse_history<R: BufRead>(reader: R, file: &str) -> Result<KeelHistory, InputError> {
    let mut history = KeelHistory::default();
    for record in HistoryReader::new(reader, file) {
        match record? {
            Record::Op(op) => history.ops.push(op),
            Record::Survivor(survivor) => history.survivors.push(survivor),
            Record::Txn(txn) => history.txns.push(txn),
            Record::TxnEntry(entry) => history.txn_entries.push(entry),
            Record::Header { .. } => unreachable!("the reader does not yield headers"),
        }
    }
    Ok(history)
}

/// Reads a whole history file.
pub fn read_history(path: &Path) -> Result<KeelHistory, InputError> {
    let name = path.display().to_string();
    let file = std::fs::File::open(path)
        .map_err(|e| InputError::new(&name, 0, format!("cannot open: {e}")))?;
    parse_history(std::io::BufReader::new(file), &name)
}

/// Writes a whole history (header, ops and txns, then txn entries and survivors in log
/// order) to `out`.
pub fn write_history<W: Write>(out: W, history: &KeelHistory) -> std::io::Result<W> {
    let mut writer = HistoryWriter::new(out)?;
    for op in &history.ops {
        writer.op(op)?;
    }
    for txn in &history.txns {
        writer.txn(txn)?;
    }
    // A transaction's entry goes before the survivors of its version.
    let mut entries = history.txn_entries.iter().peekable();
    for survivor in &history.survivors {
        while let Some(entry) = entries.next_if(|e| e.version <= survivor.version) {
            writer.txn_entry(entry)?;
        }
        writer.survivor(survivor)?;
    }
    for entry in entries {
        writer.txn_entry(entry)?;
    }
    writer.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = r#"{"type":"header","format":"keel-history","version":1}"#;
    const GET: &str = r#"{"type":"op","id":1,"client":4,"op":"get","key":"k","level":"monotonic","invoke_ns":300,"complete_ns":380,"outcome":"ok","node":1,"result":"v","version":{"epoch":1,"index":5}}"#;
    const SURVIVOR: &str =
        r#"{"type":"survivor","version":{"epoch":1,"index":5},"key":"k","value":"v"}"#;

    fn parse(lines: &[&str]) -> Result<KeelHistory, InputError> {
        parse_history(lines.join("\n").as_bytes(), "h.jsonl")
    }

    fn error_at(lines: &[&str]) -> (u64, String) {
        let e = parse(lines).unwrap_err();
        assert_eq!(e.file, "h.jsonl");
        assert!(e.to_string().starts_with(&format!("h.jsonl:{}: ", e.line)), "{e}");
        (e.line, e.message)
    }

    #[test]
    fn reads_the_documented_example() {
        let history = parse(&[HEADER, GET, "", SURVIVOR]).unwrap();
        assert_eq!(history.ops.len(), 1);
        assert_eq!(history.survivors[0].version, Version::new(1, 5));
        let OpKind::Get { level, result, .. } = &history.ops[0].kind else { panic!("a get") };
        assert_eq!((*level, result.as_deref()), (ReadLevel::Monotonic, Some("v")));
    }

    #[test]
    fn writer_output_reads_back() {
        let history = parse(&[HEADER, GET, SURVIVOR]).unwrap();
        let bytes = write_history(Vec::new(), &history).unwrap();
        assert!(bytes.starts_with(HEADER_V2.as_bytes()));
        assert_eq!(parse_history(&bytes[..], "mem").unwrap(), history);
        let history = parse(&[HEADER_V2, GET, TXN, SURVIVOR, TXN_ENTRY, TXN_A, TXN_B]).unwrap();
        let bytes = write_history(Vec::new(), &history).unwrap();
        assert_eq!(parse_history(&bytes[..], "mem").unwrap(), history);
    }

    const HEADER_V2: &str = r#"{"type":"header","format":"keel-history","version":2}"#;
    const TXN: &str = r#"{"type":"txn","id":2,"client":5,"watch":[{"key":"a","version":null}],"ops":[{"op":"get","key":"a","result":null,"version":null},{"op":"put","key":"a","value":"x"},{"op":"incr","key":"b","delta":2,"result":2}],"durability":"memory","invoke_ns":400,"complete_ns":500,"outcome":"ok","node":1,"version":{"epoch":1,"index":6}}"#;
    const TXN_ENTRY: &str =
        r#"{"type":"txn-entry","version":{"epoch":1,"index":6},"applied":true}"#;
    const TXN_A: &str =
        r#"{"type":"survivor","version":{"epoch":1,"index":6},"key":"a","value":"x"}"#;
    const TXN_B: &str =
        r#"{"type":"survivor","version":{"epoch":1,"index":6},"key":"b","value":"2"}"#;

    #[test]
    fn transactions_and_their_entries_read_in_version_2() {
        let history = parse(&[HEADER_V2, GET, TXN, SURVIVOR, TXN_ENTRY, TXN_A, TXN_B]).unwrap();
        assert_eq!((history.txns.len(), history.txn_entries.len()), (1, 1));
        assert_eq!(history.survivors.len(), 3, "two survivors share the transaction's version");
        assert_eq!(
            history.txns[0].ops[2],
            TxnOp::Incr { key: "b".into(), delta: 2, result: Some(2) }
        );
        // Version 1 holds no transactions.
        let (line, message) = error_at(&[HEADER, TXN]);
        assert_eq!(line, 2);
        assert!(message.contains("format version 2"), "{message}");
        // Survivors of one version: only after an applied txn-entry, each of another key.
        let (line, message) = error_at(&[HEADER_V2, TXN_ENTRY, TXN_A, TXN_A]);
        assert_eq!(line, 4);
        assert!(message.contains("two survivors of key"), "{message}");
        let (line, _) = error_at(&[HEADER_V2, TXN_A, TXN_B]);
        assert_eq!(line, 3, "a shared version without a txn-entry");
        let not_applied = TXN_ENTRY.replace("true", "false");
        assert_eq!(error_at(&[HEADER_V2, &not_applied, TXN_A]).0, 3);
        assert_eq!(error_at(&[HEADER_V2, TXN_A, TXN_ENTRY]).0, 3, "an entry out of log order");
        assert_eq!(error_at(&[HEADER_V2, SURVIVOR, TXN]).0, 3, "a txn after survivors");
        assert_eq!(error_at(&[HEADER_V2, GET, &TXN.replace("\"id\":2", "\"id\":1")]).0, 3);
        let uncommitted = TXN.replace(",\"version\":{\"epoch\":1,\"index\":6}}", "}");
        assert!(error_at(&[HEADER_V2, &uncommitted]).1.contains("without a version"));
        let aborted_ok = TXN.replace("\"outcome\":\"ok\"", "\"outcome\":\"ok\",\"aborted\":true");
        assert!(error_at(&[HEADER_V2, &aborted_ok]).1.contains("aborted but not failed"));
        let empty = TXN.replace(
            r#""ops":[{"op":"get","key":"a","result":null,"version":null},{"op":"put","key":"a","value":"x"},{"op":"incr","key":"b","delta":2,"result":2}]"#,
            r#""ops":[]"#,
        );
        assert!(error_at(&[HEADER_V2, &empty]).1.contains("0 operations"));
        let early = TXN.replace("\"complete_ns\":500", "\"complete_ns\":300");
        assert!(error_at(&[HEADER_V2, &early]).1.contains("before it is invoked"));
    }

    #[test]
    #[should_panic(expected = "after survivor")]
    fn writer_refuses_ops_after_survivors() {
        let history = parse(&[HEADER, GET, SURVIVOR]).unwrap();
        let mut writer = HistoryWriter::new(Vec::new()).unwrap();
        writer.survivor(&history.survivors[0]).unwrap();
        writer.op(&history.ops[0]).unwrap();
    }

    #[test]
    fn errors_name_the_line_and_the_problem() {
        assert_eq!(error_at(&[]).1, "empty history: no header line");
        assert_eq!(error_at(&[GET]), (1, "the first record must be the header".to_string()));
        let (line, message) = error_at(&[HEADER, "{not json"]);
        assert_eq!(line, 2);
        assert!(message.starts_with("not a history record"), "{message}");
        let wrong_version = r#"{"type":"header","format":"keel-history","version":9}"#;
        assert!(error_at(&[wrong_version]).1.contains("version 9"));
        assert_eq!(error_at(&[HEADER, GET, GET]), (3, "duplicate op id 1".to_string()));
        assert_eq!(
            error_at(&[HEADER, SURVIVOR, GET]),
            (3, "op record after survivor records".to_string())
        );
        let (line, message) = error_at(&[HEADER, SURVIVOR, SURVIVOR]);
        assert_eq!(line, 3);
        assert!(message.contains("log order"), "{message}");
        let early = GET.replace("\"complete_ns\":380", "\"complete_ns\":200");
        let (line, message) = error_at(&[HEADER, &early]);
        assert_eq!(line, 2);
        assert!(message.contains("completes (200) before it is invoked (300)"), "{message}");
        let unfinished = GET.replace(",\"complete_ns\":380", "");
        assert!(error_at(&[HEADER, &unfinished]).1.contains("no complete_ns"));
        let unknown_op = GET.replace("\"op\":\"get\"", "\"op\":\"scan\"");
        let (line, message) = error_at(&[HEADER, &unknown_op]);
        assert_eq!(line, 2);
        assert!(message.contains("scan"), "{message}");
        let bad_level = GET.replace("monotonic", "eventual");
        assert!(error_at(&[HEADER, &bad_level]).1.contains("eventual"));
    }

    #[test]
    fn the_reader_stops_after_an_error() {
        let text = [HEADER, "oops", GET].join("\n");
        let records: Vec<_> = HistoryReader::new(text.as_bytes(), "f").collect();
        assert_eq!(records.len(), 1);
        assert!(records[0].is_err());
    }
}
