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

use keel_types::{Durability, ReadLevel, Version};
use serde::{Deserialize, Serialize};

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
}

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
