//! Keel's binary codec: explicit-width, little-endian, hand-written.
//!
//! Layout of this module:
//! - [`encode`] / [`decode`]: the two entry points, for any type that is [`Encode`] /
//!   [`Decode`] ([`Entry`], [`HardState`], [`SnapshotMeta`], [`Command`], ...).
//! - [`Reader`]: a bounds-checked cursor over input bytes; every read checks what is left
//!   before it copies or allocates, so arbitrary input never panics and never makes the
//!   decoder allocate more than the input holds.
//! - Writer helpers (`put_*`) append fixed-width little-endian integers and
//!   length-prefixed byte strings.
//!
//! Rules: integers have explicit widths (`usize` never appears); byte strings are a `u32`
//! length then the bytes, at most [`BYTES_LEN_MAX`]; an `Option` is a `u8` flag (0 or 1)
//! then the value; every top-level record starts with a format version byte and every enum
//! with a tag byte, so later versions and payload kinds can be added without ambiguity.
//! `docs/format.md` lists the byte layouts.

use crate::limits::VALUE_BYTES_CEILING;
use crate::Version;
use crate::{
    ApplySettings, ClientId, ClusterOp, Command, Durability, Entry, EntryPayload, Epoch,
    ExpireCond, HardState, LogIndex, Membership, Modify, NodeId, RequestId, SetCond, SnapshotMeta,
    Ttl,
};

/// The longest byte string (key or value) the decoder accepts.
pub const BYTES_LEN_MAX: u32 = VALUE_BYTES_CEILING;

/// Format version byte that opens an encoded [`Entry`].
pub const ENTRY_FORMAT_V1: u8 = 1;
/// Format version byte that opens an encoded [`HardState`].
pub const HARD_STATE_FORMAT_V1: u8 = 1;
/// Format version of a [`HardState`] with a repair floor (written only when it has one,
/// so a hard state without one keeps the version-1 bytes).
pub const HARD_STATE_FORMAT_V2: u8 = 2;
/// Format version of a [`HardState`] with a Kite membership epoch: version 2's fields
/// with the repair floor behind a flag, then the epoch (written only when it is not 0).
pub const HARD_STATE_FORMAT_V3: u8 = 3;
/// Format version byte that opens an encoded [`SnapshotMeta`].
pub const SNAPSHOT_META_FORMAT_V1: u8 = 1;

const PAYLOAD_NOOP: u8 = 0;
const PAYLOAD_WRITE: u8 = 1;
const PAYLOAD_SETTINGS: u8 = 2;
const PAYLOAD_REAP: u8 = 3;
const PAYLOAD_MEMBERSHIP: u8 = 4;

const COMMAND_GET: u8 = 1;
const COMMAND_PUT: u8 = 2;
const COMMAND_DELETE: u8 = 3;
const COMMAND_CAS: u8 = 4;
const COMMAND_INCR: u8 = 5;
const COMMAND_SCAN: u8 = 6;
const COMMAND_MULTI: u8 = 7;
const COMMAND_OPEN_SESSION: u8 = 8;
const COMMAND_ENQUEUE: u8 = 9;
const COMMAND_DEQUEUE: u8 = 10;
const COMMAND_QUEUE_PEEK: u8 = 11;
const COMMAND_SET: u8 = 12;
const COMMAND_EXPIRE: u8 = 13;
const COMMAND_INSPECT: u8 = 14;
const COMMAND_FLUSH: u8 = 15;
const COMMAND_COUNT: u8 = 16;
const COMMAND_MODIFY: u8 = 17;
const COMMAND_TRANSFER: u8 = 18;
/// A geo keyspace's operation: written as its tag alone and never decoded (no log holds
/// one: only geo keyspaces serve them, and they keep no log).
const COMMAND_GEO: u8 = 19;
const COMMAND_COLL: u8 = 20;
const COMMAND_COLL_READ: u8 = 21;

/// `OpenSession` with the stamp of the node that received it (8: without, older logs).
const COMMAND_OPEN_SESSION_SEEN: u8 = 22;
const COMMAND_SWAP_DB: u8 = 23;
const COMMAND_FETCH: u8 = 24;
const COMMAND_RESTORE: u8 = 25;
const COMMAND_CLUSTER: u8 = 26;
/// A step of moving slots (`crate::slots::SlotOp`).
const COMMAND_SLOT: u8 = 27;
/// A command sent on by a slot's source (`Command::Asking`): the tag, the move's id
/// (u64), then the command.
const COMMAND_ASKING: u8 = 28;

const MODIFY_APPEND: u8 = 0;
const MODIFY_SET_RANGE: u8 = 1;
const MODIFY_SET_BIT: u8 = 2;
const MODIFY_INCR_BY_FLOAT: u8 = 3;
const MODIFY_GET_DEL: u8 = 4;
const MODIFY_GET_EX: u8 = 5;

const TTL_KEEP: u8 = 0;
const TTL_CLEAR: u8 = 1;
const TTL_AFTER: u8 = 2;
const TTL_AT: u8 = 3;

const DURABILITY_MEMORY: u8 = 0;
const DURABILITY_REPLICATED: u8 = 1;
const DURABILITY_DURABLE: u8 = 2;

/// Why bytes did not decode. Never retryable: the same bytes always fail the same way;
/// the bytes are corrupt, truncated or from an unknown format version.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// The input ended before a field was complete.
    #[error("truncated {what}: needed {needed} bytes, {remaining} left")]
    Truncated {
        /// The field being read.
        what: &'static str,
        /// Bytes the field needs.
        needed: u64,
        /// Bytes left in the input.
        remaining: u64,
    },
    /// A tag or version byte that this version of Keel does not know.
    #[error("unknown {what} tag {tag}")]
    UnknownTag {
        /// The kind of tag (format version, payload, command, durability, option flag).
        what: &'static str,
        /// The byte found.
        tag: u8,
    },
    /// A length prefix larger than the limit for that field.
    #[error("{what} of {len} bytes exceeds the limit of {max} bytes")]
    TooLong {
        /// The field being read.
        what: &'static str,
        /// The length found.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// A number outside the range its field allows.
    #[error("{what} {value} is outside 1..={max}")]
    OutOfRange {
        /// The field being read.
        what: &'static str,
        /// The number found.
        value: u64,
        /// The largest allowed.
        max: u64,
    },
    /// A value whose fields decode but break its rules.
    #[error("invalid {what}: {reason}")]
    Invalid {
        /// The value being read.
        what: &'static str,
        /// The rule broken.
        reason: &'static str,
    },
    /// Bytes left over after a complete value.
    #[error("{count} trailing bytes after a complete value")]
    TrailingBytes {
        /// How many bytes were left.
        count: u64,
    },
}

/// A type with a binary encoding.
pub trait Encode {
    /// Appends the encoding of `self` to `out`.
    fn encode_to(&self, out: &mut Vec<u8>);
}

/// A type that decodes from the binary encoding.
pub trait Decode: Sized {
    /// Reads one value from `reader`, leaving it just after the value.
    fn decode_from(reader: &mut Reader<'_>) -> Result<Self, CodecError>;
}

/// Appends the encoding of `value` to `out`.
pub fn encode<T: Encode>(value: &T, out: &mut Vec<u8>) {
    let len_before = out.len();
    value.encode_to(out);
    assert!(out.len() > len_before, "every encoding is at least one byte");
}

/// Decodes exactly one value from `bytes`; leftover bytes are an error.
pub fn decode<T: Decode>(bytes: &[u8]) -> Result<T, CodecError> {
    let mut reader = Reader::new(bytes);
    let value = T::decode_from(&mut reader)?;
    reader.finish()?;
    Ok(value)
}

/// A bounds-checked cursor over input bytes.
#[derive(Debug)]
pub struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A reader positioned at the start of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes }
    }

    /// Bytes not yet read.
    pub fn remaining(&self) -> u64 {
        self.bytes.len() as u64
    }

    /// Fails unless every byte has been read.
    pub fn finish(&self) -> Result<(), CodecError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(CodecError::TrailingBytes { count: self.remaining() })
        }
    }

    /// Takes the next `len` bytes, or fails without consuming anything.
    pub fn take(&mut self, what: &'static str, len: u64) -> Result<&'a [u8], CodecError> {
        if len > self.remaining() {
            return Err(CodecError::Truncated { what, needed: len, remaining: self.remaining() });
        }
        // `len <= remaining`, which is a slice length, so it fits in usize.
        let (head, tail) = self.bytes.split_at(len as usize);
        self.bytes = tail;
        debug_assert_eq!(head.len() as u64, len);
        Ok(head)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], CodecError> {
        let slice = self.take(what, N as u64)?;
        let mut array = [0u8; N];
        array.copy_from_slice(slice);
        Ok(array)
    }

    /// Reads one byte.
    pub fn u8(&mut self, what: &'static str) -> Result<u8, CodecError> {
        Ok(self.array::<1>(what)?[0])
    }

    /// Reads a little-endian u32.
    pub fn u32(&mut self, what: &'static str) -> Result<u32, CodecError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    /// Reads a little-endian u64.
    pub fn u64(&mut self, what: &'static str) -> Result<u64, CodecError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Reads a little-endian i64.
    pub fn i64(&mut self, what: &'static str) -> Result<i64, CodecError> {
        Ok(i64::from_le_bytes(self.array(what)?))
    }

    /// Reads a `u32` length then that many bytes; the length must be at most `len_max`
    /// and at most what is left, checked before allocating.
    pub fn slice(&mut self, what: &'static str, len_max: u32) -> Result<&'a [u8], CodecError> {
        let len = self.u32(what)?;
        if len > len_max {
            return Err(CodecError::TooLong { what, len: u64::from(len), max: u64::from(len_max) });
        }
        self.take(what, u64::from(len))
    }

    /// [`Reader::slice`], copied once into a buffer of its own, exactly sized (so that a
    /// key or value kept in the log or the state machine never holds a frame alive).
    pub fn bytes(&mut self, what: &'static str, len_max: u32) -> Result<bytes::Bytes, CodecError> {
        Ok(bytes::Bytes::copy_from_slice(self.slice(what, len_max)?))
    }

    /// [`Reader::slice`], copied into a `Vec`.
    pub fn bytes_vec(&mut self, what: &'static str, len_max: u32) -> Result<Vec<u8>, CodecError> {
        Ok(self.slice(what, len_max)?.to_vec())
    }

    /// Reads an option flag byte: 0 is absent, 1 is present, anything else is an error.
    pub fn flag(&mut self, what: &'static str) -> Result<bool, CodecError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            tag => Err(CodecError::UnknownTag { what, tag }),
        }
    }

    /// Reads an optional byte string (flag, then length-prefixed bytes when present).
    pub fn option_bytes(
        &mut self,
        what: &'static str,
        len_max: u32,
    ) -> Result<Option<bytes::Bytes>, CodecError> {
        if self.flag(what)? {
            Ok(Some(self.bytes(what, len_max)?))
        } else {
            Ok(None)
        }
    }
}

/// Appends one byte.
pub fn put_u8(out: &mut Vec<u8>, value: u8) {
    out.push(value);
}

/// Appends a little-endian u32.
pub fn put_u32(out: &mut Vec<u8>, value: u32) {
    out.extend_from_slice(&value.to_le_bytes());
}

/// Appends a little-endian u64.
pub fn put_u64(out: &mut Vec<u8>, value: u64) {
    out.extend_from_slice(&value.to_le_bytes());
}

/// Appends a little-endian i64.
pub fn put_i64(out: &mut Vec<u8>, value: i64) {
    out.extend_from_slice(&value.to_le_bytes());
}

/// Appends a `u32` length and the bytes. Panics (a programmer error) past
/// [`BYTES_LEN_MAX`]: callers validate sizes against [`crate::Limits`] first.
pub fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = u32::try_from(bytes.len()).ok().filter(|len| *len <= BYTES_LEN_MAX);
    let len = len.unwrap_or_else(|| panic!("byte string of {} bytes past the limit", bytes.len()));
    put_u32(out, len);
    out.extend_from_slice(bytes);
}

/// Appends an optional byte string (flag, then length-prefixed bytes when present).
pub fn put_option_bytes(out: &mut Vec<u8>, bytes: Option<&[u8]>) {
    match bytes {
        Some(bytes) => {
            put_u8(out, 1);
            put_bytes(out, bytes);
        }
        None => put_u8(out, 0),
    }
}

impl Encode for Durability {
    fn encode_to(&self, out: &mut Vec<u8>) {
        let tag = match self {
            Durability::Memory => DURABILITY_MEMORY,
            Durability::Replicated => DURABILITY_REPLICATED,
            Durability::Durable => DURABILITY_DURABLE,
        };
        put_u8(out, tag);
    }
}

impl Decode for Durability {
    fn decode_from(reader: &mut Reader<'_>) -> Result<Self, CodecError> {
        match reader.u8("durability")? {
            DURABILITY_MEMORY => Ok(Durability::Memory),
            DURABILITY_REPLICATED => Ok(Durability::Replicated),
            DURABILITY_DURABLE => Ok(Durability::Durable),
            tag => Err(CodecError::UnknownTag { what: "durability", tag }),
        }
    }
}

/// A transaction: its operations, then its watched keys with the versions they must have.
fn encode_multi(out: &mut Vec<u8>, ops: &[Command], watch: &[(crate::Key, Option<Version>)]) {
    put_u8(out, COMMAND_MULTI);
    put_u32(out, ops.len() as u32);
    for op in ops {
        op.encode_to(out);
    }
    put_u32(out, watch.len() as u32);
    for (key, version) in watch {
        put_bytes(out, key);
        put_u8(out, u8::from(version.is_some()));
        if let Some(version) = version {
            put_u64(out, version.epoch.0);
            put_u64(out, version.index.0);
        }
    }
}

impl Encode for Command {
    fn encode_to(&self, out: &mut Vec<u8>) {
        match self {
            Command::Get { key } => {
                put_u8(out, COMMAND_GET);
                put_bytes(out, key);
            }
            Command::Put { key, value } => {
                put_u8(out, COMMAND_PUT);
                put_bytes(out, key);
                put_bytes(out, value);
            }
            Command::Delete { key } => {
                put_u8(out, COMMAND_DELETE);
                put_bytes(out, key);
            }
            Command::Cas { key, expected, new } => {
                put_u8(out, COMMAND_CAS);
                put_bytes(out, key);
                put_option_bytes(out, expected.as_deref());
                put_bytes(out, new);
            }
            Command::Incr { key, delta } => {
                put_u8(out, COMMAND_INCR);
                put_bytes(out, key);
                put_i64(out, *delta);
            }
            Command::Scan { start, end, limit } => {
                put_u8(out, COMMAND_SCAN);
                put_bytes(out, start);
                put_option_bytes(out, end.as_deref());
                put_u32(out, *limit);
            }
            Command::Multi { ops, watch } => encode_multi(out, ops, watch),
            Command::OpenSession { seen: None } => put_u8(out, COMMAND_OPEN_SESSION),
            Command::OpenSession { seen: Some(seen) } => {
                put_u8(out, COMMAND_OPEN_SESSION_SEEN);
                put_u64(out, seen.epoch.0);
                put_u64(out, seen.index.0);
            }
            Command::Geo(_) => put_u8(out, COMMAND_GEO),
            Command::Enqueue { queue, value } => {
                put_u8(out, COMMAND_ENQUEUE);
                put_bytes(out, queue);
                put_bytes(out, value);
            }
            Command::Dequeue { queue } => {
                put_u8(out, COMMAND_DEQUEUE);
                put_bytes(out, queue);
            }
            Command::QueuePeek { queue } => {
                put_u8(out, COMMAND_QUEUE_PEEK);
                put_bytes(out, queue);
            }
            Command::Set { key, value, cond, ttl, now_ms } => {
                put_u8(out, COMMAND_SET);
                put_bytes(out, key);
                put_bytes(out, value);
                put_u8(out, *cond as u8);
                ttl.encode_to(out);
                put_u64(out, *now_ms);
            }
            Command::Expire { key, ttl, cond, now_ms } => {
                put_u8(out, COMMAND_EXPIRE);
                put_bytes(out, key);
                ttl.encode_to(out);
                put_u8(out, *cond as u8);
                put_u64(out, *now_ms);
            }
            Command::Inspect { key } => {
                put_u8(out, COMMAND_INSPECT);
                put_bytes(out, key);
            }
            Command::Flush { db } => {
                put_u8(out, COMMAND_FLUSH);
                put_u8(out, u8::from(db.is_some()));
                put_u8(out, db.unwrap_or(0));
            }
            Command::Fetch { key } => {
                put_u8(out, COMMAND_FETCH);
                put_bytes(out, key);
            }
            Command::Restore { key, image } => {
                put_u8(out, COMMAND_RESTORE);
                put_bytes(out, key);
                put_bytes(out, image);
            }
            Command::Cluster(op) => {
                put_u8(out, COMMAND_CLUSTER);
                let word = match op {
                    ClusterOp::AddLearner(_) => 0,
                    ClusterOp::Promote(_) => 1,
                    ClusterOp::Remove(_) => 2,
                    ClusterOp::TransferLeader(_) => 3,
                    ClusterOp::Return(_) => 4,
                };
                put_u8(out, word);
                put_u32(out, op.node().0);
            }
            Command::SwapDb { a, b } => {
                put_u8(out, COMMAND_SWAP_DB);
                put_u8(out, *a);
                put_u8(out, *b);
            }
            Command::Count { db } => {
                put_u8(out, COMMAND_COUNT);
                put_u8(out, *db);
            }
            Command::Modify { key, op, now_ms } => {
                put_u8(out, COMMAND_MODIFY);
                put_bytes(out, key);
                op.encode_to(out);
                put_u64(out, *now_ms);
            }
            Command::Transfer { from, to, replace, remove_source } => {
                put_u8(out, COMMAND_TRANSFER);
                put_bytes(out, from);
                put_bytes(out, to);
                put_u8(out, u8::from(*replace));
                put_u8(out, u8::from(*remove_source));
            }
            Command::Coll { key, op } => {
                put_u8(out, COMMAND_COLL);
                put_bytes(out, key);
                put_serialized(out, op);
            }
            Command::CollRead { key, op } => {
                put_u8(out, COMMAND_COLL_READ);
                put_bytes(out, key);
                put_serialized(out, op);
            }
            Command::Slot(op) => {
                put_u8(out, COMMAND_SLOT);
                put_serialized(out, op);
            }
            Command::Asking(id, inner) => {
                put_u8(out, COMMAND_ASKING);
                put_u64(out, *id);
                inner.encode_to(out);
            }
        }
    }
}

/// Deepest nesting of an [`crate::coll::Answer`] [`read_answer`] accepts: the state
/// machine's answers nest three deep at most (`ZMPOP`'s `[key, [[member, score]]]`).
pub const ANSWER_DEPTH_MAX: u32 = 8;

/// A collection command's answer, explicitly (not through serde, so that reading one
/// back is bounded in depth, not only in bytes): a tag byte, then its content.
pub fn put_answer(out: &mut Vec<u8>, answer: &crate::coll::Answer) {
    use crate::coll::Answer;
    let pairs = |out: &mut Vec<u8>, tag: u8, pairs: &[(Answer, Answer)]| {
        put_u8(out, tag);
        put_u32(out, u32::try_from(pairs.len()).expect("answers are bounded"));
        for (a, b) in pairs {
            put_answer(out, a);
            put_answer(out, b);
        }
    };
    let items = |out: &mut Vec<u8>, tag: u8, items: &[Answer]| {
        put_u8(out, tag);
        put_u32(out, u32::try_from(items.len()).expect("answers are bounded"));
        items.iter().for_each(|a| put_answer(out, a));
    };
    match answer {
        Answer::Nil => put_u8(out, 0),
        Answer::NilArray => put_u8(out, 1),
        Answer::Ok => put_u8(out, 2),
        Answer::Int(n) => {
            put_u8(out, 3);
            put_i64(out, *n);
        }
        Answer::Bulk(value) => {
            put_u8(out, 4);
            put_bytes(out, value);
        }
        Answer::Status(text) => {
            put_u8(out, 5);
            put_bytes(out, text.as_bytes());
        }
        Answer::Double(bits) => {
            put_u8(out, 6);
            put_u64(out, *bits);
        }
        Answer::Array(list) => items(out, 7, list),
        Answer::Set(list) => items(out, 10, list),
        Answer::Map(list) => pairs(out, 8, list),
        Answer::Pairs(list) => pairs(out, 9, list),
    }
}

/// Reads what [`put_answer`] wrote, at most [`ANSWER_DEPTH_MAX`] deep.
pub fn read_answer(reader: &mut Reader<'_>) -> Result<crate::coll::Answer, CodecError> {
    read_answer_at(reader, 0)
}

fn read_answer_at(reader: &mut Reader<'_>, depth: u32) -> Result<crate::coll::Answer, CodecError> {
    use crate::coll::Answer;
    if depth > ANSWER_DEPTH_MAX {
        return Err(CodecError::TooLong {
            what: "answer nesting",
            len: u64::from(depth),
            max: u64::from(ANSWER_DEPTH_MAX),
        });
    }
    let count = |reader: &mut Reader<'_>| -> Result<usize, CodecError> {
        let n = reader.u32("answer length")? as usize;
        // Each element takes a byte at least: a length past the input is a lie.
        if n as u64 > reader.remaining() {
            return Err(CodecError::TooLong {
                what: "answer length",
                len: n as u64,
                max: reader.remaining(),
            });
        }
        Ok(n)
    };
    Ok(match reader.u8("answer")? {
        0 => Answer::Nil,
        1 => Answer::NilArray,
        2 => Answer::Ok,
        3 => Answer::Int(reader.i64("answer integer")?),
        4 => Answer::Bulk(reader.bytes("answer bulk", BYTES_LEN_MAX)?),
        5 => {
            let text = reader.bytes_vec("answer status", BYTES_LEN_MAX)?;
            Answer::Status(String::from_utf8_lossy(&text).into_owned())
        }
        6 => Answer::Double(reader.u64("answer double")?),
        tag @ (7 | 10) => {
            let n = count(reader)?;
            let mut list = Vec::with_capacity(n);
            for _ in 0..n {
                list.push(read_answer_at(reader, depth + 1)?);
            }
            if tag == 7 {
                Answer::Array(list)
            } else {
                Answer::Set(list)
            }
        }
        tag @ (8 | 9) => {
            let n = count(reader)?;
            let mut list = Vec::with_capacity(n);
            for _ in 0..n {
                let a = read_answer_at(reader, depth + 1)?;
                list.push((a, read_answer_at(reader, depth + 1)?));
            }
            if tag == 8 {
                Answer::Map(list)
            } else {
                Answer::Pairs(list)
            }
        }
        tag => return Err(CodecError::UnknownTag { what: "answer", tag }),
    })
}

/// A value of the collection vocabulary (`crate::coll`), as its postcard encoding with a
/// length prefix: compact, deterministic (a command's digest is its encoding's), and
/// checked field by field when read back.
pub fn put_serialized<T: serde::Serialize>(out: &mut Vec<u8>, value: &T) {
    let bytes = postcard::to_allocvec(value).expect("the collection vocabulary serializes");
    put_bytes(out, &bytes);
}

/// Reads a value [`put_serialized`] wrote.
pub fn read_serialized<T: serde::de::DeserializeOwned>(
    reader: &mut Reader<'_>,
    what: &'static str,
) -> Result<T, CodecError> {
    let bytes = reader.slice(what, BYTES_LEN_MAX)?;
    postcard::from_bytes(bytes).map_err(|_| CodecError::UnknownTag { what, tag: 0 })
}

impl Encode for Modify {
    fn encode_to(&self, out: &mut Vec<u8>) {
        match self {
            Modify::Append(value) => {
                put_u8(out, MODIFY_APPEND);
                put_bytes(out, value);
            }
            Modify::SetRange { offset, value } => {
                put_u8(out, MODIFY_SET_RANGE);
                put_u64(out, *offset);
                put_bytes(out, value);
            }
            Modify::SetBit { offset, on } => {
                put_u8(out, MODIFY_SET_BIT);
                put_u64(out, *offset);
                put_u8(out, u8::from(*on));
            }
            Modify::IncrByFloat(bits) => {
                put_u8(out, MODIFY_INCR_BY_FLOAT);
                put_u64(out, *bits);
            }
            Modify::GetDel => put_u8(out, MODIFY_GET_DEL),
            Modify::GetEx(ttl) => {
                put_u8(out, MODIFY_GET_EX);
                ttl.encode_to(out);
            }
        }
    }
}

impl Encode for Ttl {
    fn encode_to(&self, out: &mut Vec<u8>) {
        match self {
            Ttl::Keep => put_u8(out, TTL_KEEP),
            Ttl::Clear => put_u8(out, TTL_CLEAR),
            Ttl::After(ms) => {
                put_u8(out, TTL_AFTER);
                put_u64(out, *ms);
            }
            Ttl::At(ms) => {
                put_u8(out, TTL_AT);
                put_u64(out, *ms);
            }
        }
    }
}

impl Decode for Ttl {
    fn decode_from(reader: &mut Reader<'_>) -> Result<Self, CodecError> {
        match reader.u8("ttl")? {
            TTL_KEEP => Ok(Ttl::Keep),
            TTL_CLEAR => Ok(Ttl::Clear),
            TTL_AFTER => Ok(Ttl::After(reader.u64("ttl milliseconds")?)),
            TTL_AT => Ok(Ttl::At(reader.u64("expiry time")?)),
            tag => Err(CodecError::UnknownTag { what: "ttl", tag }),
        }
    }
}

fn decode_set_cond(reader: &mut Reader<'_>) -> Result<SetCond, CodecError> {
    const CONDS: [SetCond; 3] = [SetCond::Always, SetCond::IfAbsent, SetCond::IfPresent];
    let tag = reader.u8("set condition")?;
    CONDS
        .get(usize::from(tag))
        .copied()
        .ok_or(CodecError::UnknownTag { what: "set condition", tag })
}

fn decode_expire_cond(reader: &mut Reader<'_>) -> Result<ExpireCond, CodecError> {
    const CONDS: [ExpireCond; 6] = [
        ExpireCond::Always,
        ExpireCond::IfNone,
        ExpireCond::IfSome,
        ExpireCond::IfLater,
        ExpireCond::IfEarlier,
        ExpireCond::IfSomeEarlier,
    ];
    let tag = reader.u8("expire condition")?;
    CONDS
        .get(usize::from(tag))
        .copied()
        .ok_or(CodecError::UnknownTag { what: "expire condition", tag })
}

/// Decodes a transaction's body: its operations (single-key, never another transaction)
/// and watched keys, each count checked against [`crate::MULTI_OPS_MAX`] before anything
/// is reserved for it.
fn decode_multi(reader: &mut Reader<'_>) -> Result<Command, CodecError> {
    let count = |r: &mut Reader<'_>, what: &'static str| -> Result<usize, CodecError> {
        let n = r.u32(what)? as usize;
        if n > crate::MULTI_OPS_MAX {
            return Err(CodecError::TooLong {
                what,
                len: n as u64,
                max: crate::MULTI_OPS_MAX as u64,
            });
        }
        Ok(n)
    };
    let n = count(reader, "transaction operations")?;
    let mut ops = Vec::with_capacity(n.min(reader.remaining() as usize));
    for _ in 0..n {
        // A transaction holds single-key operations only: no transaction inside it, and
        // no scan (the server never queues one, and the state machine executes only
        // gets and writes inside a transaction).
        let op = Command::decode_from(reader)?;
        let refused = match op {
            Command::Multi { .. } => Some(COMMAND_MULTI),
            Command::Scan { .. } => Some(COMMAND_SCAN),
            Command::OpenSession { .. } => Some(COMMAND_OPEN_SESSION),
            Command::Enqueue { .. } => Some(COMMAND_ENQUEUE),
            Command::Dequeue { .. } => Some(COMMAND_DEQUEUE),
            Command::QueuePeek { .. } => Some(COMMAND_QUEUE_PEEK),
            Command::Slot(_) => Some(COMMAND_SLOT),
            Command::Asking(..) => Some(COMMAND_ASKING),
            _ => None,
        };
        if let Some(tag) = refused {
            return Err(CodecError::UnknownTag { what: "operation in a transaction", tag });
        }
        ops.push(op);
    }
    let n = count(reader, "watched keys")?;
    let mut watch = Vec::with_capacity(n.min(reader.remaining() as usize));
    for _ in 0..n {
        let key = reader.bytes("watched key", BYTES_LEN_MAX)?;
        let version = if reader.flag("watched version flag")? {
            Some(Version {
                epoch: Epoch(reader.u64("watched epoch")?),
                index: LogIndex(reader.u64("watched index")?),
            })
        } else {
            None
        };
        watch.push((key, version));
    }
    Ok(Command::Multi { ops, watch })
}

impl Decode for Command {
    fn decode_from(reader: &mut Reader<'_>) -> Result<Self, CodecError> {
        let tag = reader.u8("command")?;
        let key = |r: &mut Reader<'_>| r.bytes("key", BYTES_LEN_MAX);
        let command = match tag {
            COMMAND_GET => Command::Get { key: key(reader)? },
            COMMAND_PUT => {
                Command::Put { key: key(reader)?, value: reader.bytes("value", BYTES_LEN_MAX)? }
            }
            COMMAND_DELETE => Command::Delete { key: key(reader)? },
            COMMAND_CAS => Command::Cas {
                key: key(reader)?,
                expected: reader.option_bytes("expected value", BYTES_LEN_MAX)?,
                new: reader.bytes("new value", BYTES_LEN_MAX)?,
            },
            COMMAND_INCR => Command::Incr { key: key(reader)?, delta: reader.i64("delta")? },
            COMMAND_SCAN => Command::Scan {
                start: key(reader)?,
                end: reader.option_bytes("scan end", BYTES_LEN_MAX)?,
                limit: reader.u32("scan limit")?,
            },
            COMMAND_MULTI => decode_multi(reader)?,
            COMMAND_OPEN_SESSION => Command::OpenSession { seen: None },
            COMMAND_OPEN_SESSION_SEEN => {
                let epoch = reader.u64("open's stamp")?;
                let index = reader.u64("open's stamp")?;
                Command::OpenSession { seen: Some(Version::new(epoch, index)) }
            }
            COMMAND_ENQUEUE => Command::Enqueue {
                queue: reader.bytes("queue", BYTES_LEN_MAX)?,
                value: reader.bytes("value", BYTES_LEN_MAX)?,
            },
            COMMAND_DEQUEUE => Command::Dequeue { queue: reader.bytes("queue", BYTES_LEN_MAX)? },
            COMMAND_QUEUE_PEEK => {
                Command::QueuePeek { queue: reader.bytes("queue", BYTES_LEN_MAX)? }
            }
            COMMAND_SET => Command::Set {
                key: key(reader)?,
                value: reader.bytes("value", BYTES_LEN_MAX)?,
                cond: decode_set_cond(reader)?,
                ttl: Ttl::decode_from(reader)?,
                now_ms: reader.u64("command time")?,
            },
            COMMAND_EXPIRE => Command::Expire {
                key: key(reader)?,
                ttl: Ttl::decode_from(reader)?,
                cond: decode_expire_cond(reader)?,
                now_ms: reader.u64("command time")?,
            },
            COMMAND_INSPECT => Command::Inspect { key: key(reader)? },
            COMMAND_FLUSH => {
                let all = !reader.flag("flush database flag")?;
                let db = reader.u8("flushed database")?;
                Command::Flush { db: (!all).then_some(db) }
            }
            COMMAND_COUNT => Command::Count { db: reader.u8("counted database")? },
            COMMAND_FETCH => Command::Fetch { key: key(reader)? },
            COMMAND_RESTORE => Command::Restore {
                key: key(reader)?,
                image: reader.bytes("restored image", BYTES_LEN_MAX)?,
            },
            COMMAND_CLUSTER => {
                let word = reader.u8("cluster change")?;
                let node = NodeId(reader.u32("cluster change's node")?);
                Command::Cluster(match word {
                    0 => ClusterOp::AddLearner(node),
                    1 => ClusterOp::Promote(node),
                    2 => ClusterOp::Remove(node),
                    3 => ClusterOp::TransferLeader(node),
                    4 => ClusterOp::Return(node),
                    tag => return Err(CodecError::UnknownTag { what: "cluster change", tag }),
                })
            }
            COMMAND_SWAP_DB => Command::SwapDb {
                a: reader.u8("swapped database")?,
                b: reader.u8("swapped database")?,
            },
            COMMAND_MODIFY => {
                let key = key(reader)?;
                let op = match reader.u8("modification")? {
                    MODIFY_APPEND => Modify::Append(reader.bytes("appended", BYTES_LEN_MAX)?),
                    MODIFY_SET_RANGE => Modify::SetRange {
                        offset: reader.u64("range offset")?,
                        value: reader.bytes("range value", BYTES_LEN_MAX)?,
                    },
                    MODIFY_SET_BIT => Modify::SetBit {
                        offset: reader.u64("bit offset")?,
                        on: reader.flag("bit")?,
                    },
                    MODIFY_INCR_BY_FLOAT => Modify::IncrByFloat(reader.u64("float increment")?),
                    MODIFY_GET_DEL => Modify::GetDel,
                    MODIFY_GET_EX => Modify::GetEx(Ttl::decode_from(reader)?),
                    tag => return Err(CodecError::UnknownTag { what: "modification", tag }),
                };
                Command::Modify { key, op, now_ms: reader.u64("command time")? }
            }
            COMMAND_TRANSFER => Command::Transfer {
                from: key(reader)?,
                to: key(reader)?,
                replace: reader.flag("replace")?,
                remove_source: reader.flag("remove source")?,
            },
            COMMAND_COLL => Command::Coll {
                key: key(reader)?,
                op: read_serialized(reader, "collection write")?,
            },
            COMMAND_COLL_READ => Command::CollRead {
                key: key(reader)?,
                op: read_serialized(reader, "collection read")?,
            },
            COMMAND_SLOT => Command::Slot(read_serialized(reader, "slot op")?),
            COMMAND_ASKING => {
                // One level: what an `ASK` sends on is a command with keys, never another.
                let id = reader.u64("asked move")?;
                let inner = Command::decode_from(reader)?;
                if !inner.may_be_asked() {
                    return Err(CodecError::UnknownTag {
                        what: "asked command",
                        tag: COMMAND_ASKING,
                    });
                }
                Command::Asking(id, Box::new(inner))
            }
            tag => return Err(CodecError::UnknownTag { what: "command", tag }),
        };
        Ok(command)
    }
}

impl Encode for EntryPayload {
    fn encode_to(&self, out: &mut Vec<u8>) {
        match self {
            EntryPayload::Noop => put_u8(out, PAYLOAD_NOOP),
            EntryPayload::Settings(settings) => {
                put_u8(out, PAYLOAD_SETTINGS);
                put_u32(out, settings.dedup_clients_max);
            }
            EntryPayload::Write { client, request, durability, command } => {
                put_u8(out, PAYLOAD_WRITE);
                put_u64(out, client.0);
                put_u64(out, request.0);
                durability.encode_to(out);
                command.encode_to(out);
            }
            EntryPayload::Membership(membership) => {
                put_u8(out, PAYLOAD_MEMBERSHIP);
                membership.encode_to(out);
            }
            EntryPayload::Reap { now_ms, keys } => {
                put_u8(out, PAYLOAD_REAP);
                put_u64(out, *now_ms);
                put_u32(out, keys.len() as u32);
                for key in keys {
                    put_bytes(out, key);
                }
            }
        }
    }
}

impl Decode for EntryPayload {
    fn decode_from(reader: &mut Reader<'_>) -> Result<Self, CodecError> {
        match reader.u8("entry payload")? {
            PAYLOAD_NOOP => Ok(EntryPayload::Noop),
            PAYLOAD_SETTINGS => {
                let settings =
                    ApplySettings { dedup_clients_max: reader.u32("dedup clients max")? };
                if !settings.valid() {
                    return Err(CodecError::OutOfRange {
                        what: "dedup clients max",
                        value: u64::from(settings.dedup_clients_max),
                        max: u64::from(crate::limits::DEDUP_CLIENTS_CEILING),
                    });
                }
                Ok(EntryPayload::Settings(settings))
            }
            PAYLOAD_WRITE => Ok(EntryPayload::Write {
                client: ClientId(reader.u64("client id")?),
                request: RequestId(reader.u64("request id")?),
                durability: Durability::decode_from(reader)?,
                command: Command::decode_from(reader)?,
            }),
            PAYLOAD_REAP => {
                let now_ms = reader.u64("reap time")?;
                let n = reader.u32("reaped keys")?;
                if n == 0 || n as usize > crate::REAP_KEYS_MAX {
                    return Err(CodecError::OutOfRange {
                        what: "reaped keys",
                        value: u64::from(n),
                        max: crate::REAP_KEYS_MAX as u64,
                    });
                }
                let mut keys = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    keys.push(reader.bytes("reaped key", BYTES_LEN_MAX)?);
                }
                Ok(EntryPayload::Reap { now_ms, keys })
            }
            PAYLOAD_MEMBERSHIP => Ok(EntryPayload::Membership(Membership::decode_from(reader)?)),
            tag => Err(CodecError::UnknownTag { what: "entry payload", tag }),
        }
    }
}

impl Encode for Membership {
    fn encode_to(&self, out: &mut Vec<u8>) {
        for ids in [&self.voters, &self.learners] {
            put_u8(out, ids.len() as u8);
            for id in ids {
                put_u32(out, id.0);
            }
        }
    }
}

impl Decode for Membership {
    fn decode_from(reader: &mut Reader<'_>) -> Result<Self, CodecError> {
        let mut ids = || -> Result<Vec<NodeId>, CodecError> {
            let n = reader.u8("member count")?;
            if usize::from(n) > Membership::VOTERS_MAX {
                let max = Membership::VOTERS_MAX as u64;
                return Err(CodecError::OutOfRange { what: "member count", value: n.into(), max });
            }
            (0..n).map(|_| reader.u32("member id").map(NodeId)).collect()
        };
        let membership = Membership { voters: ids()?, learners: ids()? };
        if !membership.valid() {
            let reason = "not sorted, disjoint and in bounds";
            return Err(CodecError::Invalid { what: "membership", reason });
        }
        Ok(membership)
    }
}

impl Encode for Entry {
    fn encode_to(&self, out: &mut Vec<u8>) {
        put_u8(out, ENTRY_FORMAT_V1);
        put_u64(out, self.epoch.0);
        put_u64(out, self.index.0);
        self.payload.encode_to(out);
    }
}

impl Decode for Entry {
    fn decode_from(reader: &mut Reader<'_>) -> Result<Self, CodecError> {
        let version = reader.u8("entry format version")?;
        if version != ENTRY_FORMAT_V1 {
            return Err(CodecError::UnknownTag { what: "entry format version", tag: version });
        }
        Ok(Entry {
            epoch: Epoch(reader.u64("entry epoch")?),
            index: LogIndex(reader.u64("entry index")?),
            payload: EntryPayload::decode_from(reader)?,
        })
    }
}

impl Encode for HardState {
    fn encode_to(&self, out: &mut Vec<u8>) {
        let version = match (self.repair_floor, self.members_epoch) {
            (None, 0) => HARD_STATE_FORMAT_V1,
            (Some(_), 0) => HARD_STATE_FORMAT_V2,
            (_, _) => HARD_STATE_FORMAT_V3,
        };
        put_u8(out, version);
        put_u64(out, self.epoch.0);
        match self.voted_for {
            Some(node) => {
                put_u8(out, 1);
                put_u32(out, node.0);
            }
            None => put_u8(out, 0),
        }
        if version == HARD_STATE_FORMAT_V3 {
            put_u8(out, u8::from(self.repair_floor.is_some()));
        }
        if let Some(floor) = self.repair_floor {
            put_u64(out, floor.epoch.0);
            put_u64(out, floor.index.0);
        }
        if version == HARD_STATE_FORMAT_V3 {
            put_u64(out, self.members_epoch);
        }
    }
}

impl Decode for HardState {
    fn decode_from(reader: &mut Reader<'_>) -> Result<Self, CodecError> {
        let version = reader.u8("hard state format version")?;
        let known = [HARD_STATE_FORMAT_V1, HARD_STATE_FORMAT_V2, HARD_STATE_FORMAT_V3];
        if !known.contains(&version) {
            return Err(CodecError::UnknownTag { what: "hard state format version", tag: version });
        }
        let epoch = Epoch(reader.u64("hard state epoch")?);
        let voted_for =
            if reader.flag("vote flag")? { Some(NodeId(reader.u32("vote")?)) } else { None };
        let floored = match version {
            HARD_STATE_FORMAT_V1 => false,
            HARD_STATE_FORMAT_V2 => true,
            _ => reader.flag("repair floor flag")?,
        };
        let repair_floor = if floored {
            let floor_epoch = Epoch(reader.u64("repair floor epoch")?);
            let floor_index = LogIndex(reader.u64("repair floor index")?);
            Some(Version { epoch: floor_epoch, index: floor_index })
        } else {
            None
        };
        let members_epoch =
            if version == HARD_STATE_FORMAT_V3 { reader.u64("members epoch")? } else { 0 };
        Ok(HardState { epoch, voted_for, repair_floor, members_epoch })
    }
}

impl Encode for SnapshotMeta {
    fn encode_to(&self, out: &mut Vec<u8>) {
        put_u8(out, SNAPSHOT_META_FORMAT_V1);
        put_u64(out, self.last_index.0);
        put_u64(out, self.last_epoch.0);
    }
}

impl Decode for SnapshotMeta {
    fn decode_from(reader: &mut Reader<'_>) -> Result<Self, CodecError> {
        let version = reader.u8("snapshot meta format version")?;
        if version != SNAPSHOT_META_FORMAT_V1 {
            return Err(CodecError::UnknownTag {
                what: "snapshot meta format version",
                tag: version,
            });
        }
        Ok(SnapshotMeta {
            last_index: LogIndex(reader.u64("snapshot last index")?),
            last_epoch: Epoch(reader.u64("snapshot last epoch")?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_entry(command: Command) -> Entry {
        Entry {
            epoch: Epoch(3),
            index: LogIndex(17),
            payload: EntryPayload::Write {
                client: ClientId(9),
                request: RequestId(4),
                durability: Durability::Replicated,
                command,
            },
        }
    }

    fn round_trip<T: Encode + Decode + PartialEq + std::fmt::Debug>(value: &T) -> Vec<u8> {
        let mut bytes = Vec::new();
        encode(value, &mut bytes);
        assert_eq!(&decode::<T>(&bytes).unwrap(), value);
        bytes
    }

    #[test]
    fn answers_round_trip_and_a_deep_one_is_refused() {
        use crate::coll::Answer;
        let answer = Answer::Array(vec![
            Answer::Bulk(b"k".to_vec().into()),
            Answer::Pairs(vec![(Answer::Bulk(b"m".to_vec().into()), Answer::Double(7))]),
            Answer::Map(vec![(Answer::Int(-1), Answer::Status("set".into()))]),
            Answer::Set(vec![Answer::Nil, Answer::NilArray, Answer::Ok]),
        ]);
        let mut out = Vec::new();
        put_answer(&mut out, &answer);
        assert_eq!(read_answer(&mut Reader::new(&out)), Ok(answer));
        // An array of an array of ... nine deep, and a length past the input.
        let mut deep = Vec::new();
        for _ in 0..=ANSWER_DEPTH_MAX {
            deep.extend_from_slice(&[7, 1, 0, 0, 0]);
        }
        deep.push(0);
        assert!(read_answer(&mut Reader::new(&deep)).is_err());
        assert!(read_answer(&mut Reader::new(&[7, 255, 255, 255, 255])).is_err());
    }

    #[test]
    fn every_command_round_trips() {
        let commands = [
            Command::Get { key: b"k".to_vec().into() },
            Command::Put { key: b"k".to_vec().into(), value: b"v".to_vec().into() },
            Command::Delete { key: vec![].into() },
            Command::Cas { key: b"k".to_vec().into(), expected: None, new: b"n".to_vec().into() },
            Command::Cas {
                key: b"k".to_vec().into(),
                expected: Some(vec![].into()),
                new: vec![].into(),
            },
            Command::Incr { key: b"c".to_vec().into(), delta: i64::MIN },
            Command::Scan {
                start: vec![].into(),
                end: Some(b"z".to_vec().into()),
                limit: u32::MAX,
            },
            Command::Set {
                key: b"k".to_vec().into(),
                value: b"v".to_vec().into(),
                cond: SetCond::IfPresent,
                ttl: Ttl::After(1500),
                now_ms: 1_700_000_000_000,
            },
            Command::Set {
                key: b"k".to_vec().into(),
                value: vec![].into(),
                cond: SetCond::IfAbsent,
                ttl: Ttl::Keep,
                now_ms: 0,
            },
            Command::Expire {
                key: b"k".to_vec().into(),
                ttl: Ttl::At(u64::MAX),
                cond: ExpireCond::IfEarlier,
                now_ms: 7,
            },
            Command::Expire {
                key: b"k".to_vec().into(),
                ttl: Ttl::Clear,
                cond: ExpireCond::Always,
                now_ms: 7,
            },
            Command::Inspect { key: b"k".to_vec().into() },
            Command::Fetch { key: b"k".to_vec().into() },
            Command::Restore { key: b"k".to_vec().into(), image: b"\x01image".to_vec().into() },
            Command::SwapDb { a: 0, b: 15 },
            Command::Coll {
                key: b"l".to_vec().into(),
                op: Box::new(crate::coll::CollOp::Push {
                    end: crate::coll::End::Front,
                    values: vec![b"v".to_vec().into()],
                    only_existing: false,
                }),
            },
            Command::CollRead {
                key: b"z".to_vec().into(),
                op: Box::new(crate::coll::CollRead::ZCount(crate::coll::ZBy::Rank(0, -1))),
            },
            Command::Flush { db: None },
            Command::Flush { db: Some(9) },
            Command::OpenSession { seen: None },
            Command::OpenSession { seen: Some(Version::new(3, 77)) },
            Command::Count { db: 0 },
            Command::Modify {
                key: b"k".to_vec().into(),
                op: Modify::Append(b"v".to_vec().into()),
                now_ms: 0,
            },
            Command::Modify {
                key: b"k".to_vec().into(),
                op: Modify::SetRange { offset: 9, value: b"v".to_vec().into() },
                now_ms: 0,
            },
            Command::Modify {
                key: b"k".to_vec().into(),
                op: Modify::SetBit { offset: 7, on: true },
                now_ms: 0,
            },
            Command::Modify {
                key: b"k".to_vec().into(),
                op: Modify::IncrByFloat(1.5f64.to_bits()),
                now_ms: 0,
            },
            Command::Modify { key: b"k".to_vec().into(), op: Modify::GetDel, now_ms: 0 },
            Command::Modify {
                key: b"k".to_vec().into(),
                op: Modify::GetEx(Ttl::After(5)),
                now_ms: 3,
            },
            Command::Transfer {
                from: b"a".to_vec().into(),
                to: b"b".to_vec().into(),
                replace: true,
                remove_source: false,
            },
        ];
        for command in commands {
            round_trip(&write_entry(command));
        }
    }

    #[test]
    fn slot_moves_round_trip_and_an_asked_command_is_one_level_deep() {
        let commands = [
            Command::Slot(crate::slots::SlotOp::Fill {
                slot: crate::slots::key_slot(b"k"),
                items: vec![(b"k".to_vec().into(), b"\x01".to_vec().into())],
                id: 3,
            }),
            Command::Slot(crate::slots::SlotOp::Migrate {
                first: 1,
                last: 9,
                to: crate::KeyspaceId(2),
                id: u64::MAX,
            }),
            Command::Asking(
                7,
                Box::new(Command::Put { key: b"k".to_vec().into(), value: b"v".to_vec().into() }),
            ),
        ];
        for command in commands {
            round_trip(&write_entry(command));
        }
        // What an `ASK` sends on is a command with keys, one level deep.
        let nested = Command::Asking(
            1,
            Box::new(Command::Asking(1, Box::new(Command::Get { key: b"k".to_vec().into() }))),
        );
        let mut bytes = Vec::new();
        encode(&nested, &mut bytes);
        assert!(decode::<Command>(&bytes).is_err());
        round_trip(&Entry {
            epoch: Epoch(3),
            index: LogIndex(9),
            payload: EntryPayload::Reap {
                now_ms: 1_700_000_000_000,
                keys: vec![b"a".to_vec().into(), b"b".to_vec().into()],
            },
        });
        round_trip(&Entry {
            epoch: Epoch(u64::MAX),
            index: LogIndex(1),
            payload: EntryPayload::Noop,
        });
    }

    #[test]
    fn a_settings_entry_round_trips_and_out_of_range_settings_are_refused() {
        let settings = |n| Entry {
            epoch: Epoch(4),
            index: LogIndex(9),
            payload: EntryPayload::Settings(ApplySettings { dedup_clients_max: n }),
        };
        let bytes = round_trip(&settings(7));
        assert_eq!(bytes[17..], [PAYLOAD_SETTINGS, 7, 0, 0, 0]);
        round_trip(&settings(crate::limits::DEDUP_CLIENTS_CEILING));
        for n in [0, crate::limits::DEDUP_CLIENTS_CEILING + 1, u32::MAX] {
            let mut bytes = Vec::new();
            encode(&settings(n), &mut bytes);
            let refused = decode::<Entry>(&bytes);
            assert!(matches!(refused, Err(CodecError::OutOfRange { .. })), "{n}: {refused:?}");
        }
    }

    #[test]
    fn a_transaction_holding_a_scan_or_a_transaction_is_refused() {
        let scan = Command::Scan { start: vec![].into(), end: None, limit: 1 };
        let get = Command::Get { key: b"k".to_vec().into() };
        let nested = Command::Multi { ops: vec![get.clone()], watch: Vec::new() };
        for inner in [scan, nested] {
            let mut bytes = Vec::new();
            let multi = Command::Multi { ops: vec![get.clone(), inner], watch: Vec::new() };
            encode(&write_entry(multi), &mut bytes);
            let refused = decode::<Entry>(&bytes);
            assert!(matches!(refused, Err(CodecError::UnknownTag { .. })), "{refused:?}");
        }
        round_trip(&write_entry(Command::Multi { ops: vec![get], watch: Vec::new() }));
    }

    #[test]
    fn entry_layout_is_explicit_little_endian() {
        let entry = Entry { epoch: Epoch(2), index: LogIndex(0x0102), payload: EntryPayload::Noop };
        let bytes = round_trip(&entry);
        let expected = [1, 2, 0, 0, 0, 0, 0, 0, 0, 2, 1, 0, 0, 0, 0, 0, 0, PAYLOAD_NOOP];
        assert_eq!(bytes, expected);
        assert_ne!(bytes.len(), 0);
    }

    #[test]
    fn hard_state_and_snapshot_meta_round_trip() {
        round_trip(&HardState::default());
        let bytes = round_trip(&HardState {
            epoch: Epoch(5),
            voted_for: Some(NodeId(3)),
            repair_floor: None,
            members_epoch: 0,
        });
        assert_eq!(bytes.len(), 1 + 8 + 1 + 4);
        assert_eq!(bytes[0], HARD_STATE_FORMAT_V1, "no floor: the version-1 bytes");
        let floor = Some(Version { epoch: Epoch(4), index: LogIndex(17) });
        let bytes = round_trip(&HardState {
            epoch: Epoch(5),
            voted_for: None,
            repair_floor: floor,
            members_epoch: 0,
        });
        assert_eq!((bytes[0], bytes.len()), (HARD_STATE_FORMAT_V2, 1 + 8 + 1 + 16));
        let bytes = round_trip(&HardState { members_epoch: 9, ..HardState::default() });
        assert_eq!((bytes[0], bytes.len()), (HARD_STATE_FORMAT_V3, 1 + 8 + 1 + 1 + 8));
        let with_floor =
            HardState { repair_floor: floor, members_epoch: 9, ..HardState::default() };
        round_trip(&with_floor);
        round_trip(&SnapshotMeta { last_index: LogIndex(10), last_epoch: Epoch(2) });
    }

    #[test]
    fn unknown_tags_and_trailing_bytes_are_refused() {
        let mut bytes = Vec::new();
        encode(&write_entry(Command::Delete { key: b"k".to_vec().into() }), &mut bytes);
        let mut versioned = bytes.clone();
        versioned[0] = 2;
        assert!(matches!(decode::<Entry>(&versioned), Err(CodecError::UnknownTag { tag: 2, .. })));
        let mut trailing = bytes.clone();
        trailing.push(0);
        assert_eq!(decode::<Entry>(&trailing), Err(CodecError::TrailingBytes { count: 1 }));
    }

    #[test]
    fn every_strict_prefix_is_truncated() {
        let mut bytes = Vec::new();
        let command = Command::Cas {
            key: b"k".to_vec().into(),
            expected: Some(b"e".to_vec().into()),
            new: b"n".to_vec().into(),
        };
        encode(&write_entry(command), &mut bytes);
        for cut in 0..bytes.len() {
            let err = decode::<Entry>(&bytes[..cut]).unwrap_err();
            assert!(matches!(err, CodecError::Truncated { .. }), "cut {cut}: {err}");
        }
    }

    #[test]
    fn huge_length_prefixes_fail_before_allocating() {
        let mut bytes = vec![COMMAND_GET];
        put_u32(&mut bytes, u32::MAX);
        let err = decode::<Command>(&bytes).unwrap_err();
        assert!(matches!(err, CodecError::TooLong { .. }));
        let mut bytes = vec![COMMAND_GET];
        put_u32(&mut bytes, 1000);
        assert!(matches!(decode::<Command>(&bytes), Err(CodecError::Truncated { .. })));
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        // A fixed xorshift stream: deterministic, and covers short and long inputs.
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for round in 0..20_000u64 {
            let len = (next() % 64) as usize;
            let mut bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if let Some(first) = bytes.first_mut() {
                *first = (round % 3) as u8; // often a valid version byte
            }
            let _ = decode::<Entry>(&bytes);
            let _ = decode::<HardState>(&bytes);
            let _ = decode::<SnapshotMeta>(&bytes);
            let _ = decode::<Command>(&bytes);
        }
    }
}
