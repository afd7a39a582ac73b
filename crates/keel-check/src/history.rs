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
/// The format version this crate writes; readers accept exactly this one.
pub const FORMAT_VERSION: u32 = 1;

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
}

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

/// Writes a history: the header at once, then `op` records, then `survivor` records.
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
    /// Surviving writes, in log order (strictly increasing versions).
    pub survivors: Vec<Survivor>,
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
                if format != FORMAT_NAME || *version != FORMAT_VERSION {
                    return Err(self.lines.error(format!(
                        "header names format '{format}' version {version}; \
                         expected '{FORMAT_NAME}' version {FORMAT_VERSION}"
                    )));
                }
                self.header_seen = true;
                Ok(())
            }
            _ if !self.header_seen => Err(self.lines.error("the first record must be the header")),
            Record::Op(op) => self.validate_op(op),
            Record::Survivor(survivor) => self.validate_survivor(survivor),
        }
    }

    fn validate_op(&mut self, op: &Op) -> Result<(), InputError> {
        if self.survivors_started {
            return Err(self.lines.error("op record after survivor records"));
        }
        if self.op_ids.len() >= OPS_MAX {
            return Err(self.lines.error(format!("more than {OPS_MAX} operations")));
        }
        if !self.op_ids.insert(op.id) {
            return Err(self.lines.error(format!("duplicate op id {}", op.id)));
        }
        if !op.views.is_empty() && !matches!(op.kind, OpKind::Get { .. }) {
            return Err(self.lines.error(format!("op {} has views but is not a get", op.id)));
        }
        if op.views.len() > VIEWS_MAX {
            let n = op.views.len();
            return Err(self
                .lines
                .error(format!("op {} has {n} views; at most {VIEWS_MAX}", op.id)));
        }
        match (op.outcome, op.complete_ns) {
            (Outcome::Ok | Outcome::Fail, None) => {
                return Err(self.lines.error(format!(
                    "op {} has outcome {:?} but no complete_ns",
                    op.id, op.outcome
                )));
            }
            (_, Some(complete_ns)) if complete_ns < op.invoke_ns => {
                return Err(self.lines.error(format!(
                    "op {} completes ({complete_ns}) before it is invoked ({})",
                    op.id, op.invoke_ns
                )));
            }
            _ => {}
        }
        Ok(())
    }

    fn validate_survivor(&mut self, survivor: &Survivor) -> Result<(), InputError> {
        self.survivors_started = true;
        if self.survivor_count >= SURVIVORS_MAX {
            return Err(self.lines.error(format!("more than {SURVIVORS_MAX} survivors")));
        }
        if let Some(last) = self.survivor_last {
            if survivor.version <= last {
                return Err(self.lines.error(format!(
                    "survivor version {} is not after the previous one {last}: \
                     survivors must be in log order",
                    survivor.version
                )));
            }
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

/// Writes a whole history (header, ops, survivors) to `out`.
pub fn write_history<W: Write>(out: W, history: &KeelHistory) -> std::io::Result<W> {
    let mut writer = HistoryWriter::new(out)?;
    for op in &history.ops {
        writer.op(op)?;
    }
    for survivor in &history.survivors {
        writer.survivor(survivor)?;
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
        assert!(bytes.starts_with(HEADER.as_bytes()));
        assert_eq!(parse_history(&bytes[..], "mem").unwrap(), history);
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
