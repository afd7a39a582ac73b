//! The encoding of every [`Message`] variant and what it carries.
//!
//! Every encoder destructures its value naming each field (never `..`), so a field added
//! to a message is a compile error here until it is encoded; the round-trip property
//! test at the bottom builds each variant with every field random, so a field encoded but
//! not decoded (or the reverse) fails it.
//!
//! Message tags: 1 `RequestVote`, 2 `Vote`, 3 `Append`, 4 `AppendReply`,
//! 5 `InstallSnapshot`, 6 `InstallSnapshotReply`, 7 `Forward`, 8 `ForwardReply`,
//! 9 `PreVote`, 10 `PreVoteReply`, 11 `TimeoutNow`, 12 `RequestVote` of a leadership
//! transfer (so a vote request that is not one keeps tag 1's bytes). Tags are never
//! reused.
//! Entries, commands, durabilities and snapshot metadata use `keel_types::codec`.

use super::{PeerError, PeerLimits, TEXT_BYTES_MAX};
use keel_core::leader::{ClientReply, ClientRequest, Lease, Message, RequestTag};
use keel_core::time::Time;
use keel_types::codec::{
    put_i64, put_option_bytes, put_u32, put_u64, put_u8, CodecError, Decode, Encode, Reader,
    BYTES_LEN_MAX,
};
use keel_types::{
    ClientId, Command, CommandResult, Durability, Entry, Epoch, KeelError, LogIndex, NodeId,
    ReadLevel, RequestId, SnapshotMeta, Version,
};

const TAG_REQUEST_VOTE: u8 = 1;
const TAG_VOTE: u8 = 2;
const TAG_APPEND: u8 = 3;
const TAG_APPEND_REPLY: u8 = 4;
const TAG_INSTALL_SNAPSHOT: u8 = 5;
const TAG_INSTALL_SNAPSHOT_REPLY: u8 = 6;
const TAG_FORWARD: u8 = 7;
const TAG_FORWARD_REPLY: u8 = 8;
const TAG_PRE_VOTE: u8 = 9;
const TAG_PRE_VOTE_REPLY: u8 = 10;
const TAG_TIMEOUT_NOW: u8 = 11;
const TAG_REQUEST_TRANSFER_VOTE: u8 = 12;

/// Fewest bytes a log entry takes (format, epoch, index, payload tag).
const ENTRY_BYTES_MIN: u64 = 1 + 8 + 8 + 1;
/// Fewest bytes a scan item takes (two empty byte strings and a version).
const SCAN_ITEM_BYTES_MIN: u64 = 4 + 4 + 16;

/// Reads a `u32` count, refusing one above `max` or one whose items, at `item_bytes_min`
/// each, could not fit in the bytes left; so what is reserved for the items is bounded
/// by a small multiple of the input's size.
pub(super) fn count(
    reader: &mut Reader<'_>,
    what: &'static str,
    max: u32,
    item_bytes_min: u64,
) -> Result<usize, PeerError> {
    assert!(item_bytes_min >= 1);
    let count = reader.u32(what)?;
    if count > max {
        return Err(PeerError::TooMany { what, count: u64::from(count), max });
    }
    let needed = u64::from(count) * item_bytes_min;
    if needed > reader.remaining() {
        let remaining = reader.remaining();
        return Err(CodecError::Truncated { what, needed, remaining }.into());
    }
    Ok(count as usize)
}

/// Appends a blob (snapshot data) of any size a frame can hold.
fn put_blob(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = u32::try_from(bytes.len()).expect("a blob past 4 GiB cannot be framed; split it");
    put_u32(out, len);
    out.extend_from_slice(bytes);
}

fn put_flag(out: &mut Vec<u8>, value: bool) {
    put_u8(out, u8::from(value));
}

const LEASE_WITHHELD: u8 = 0;
const LEASE_GRANTED: u8 = 1;
const LEASE_MARK_OUT: u8 = 2;

fn put_lease(out: &mut Vec<u8>, lease: Lease) {
    match lease {
        Lease::Withheld => put_u8(out, LEASE_WITHHELD),
        Lease::Granted { anchor } => {
            put_u8(out, LEASE_GRANTED);
            put_u64(out, anchor.0);
        }
        Lease::MarkOut => put_u8(out, LEASE_MARK_OUT),
    }
}

fn read_lease(reader: &mut Reader<'_>) -> Result<Lease, PeerError> {
    Ok(match reader.u8("lease")? {
        LEASE_WITHHELD => Lease::Withheld,
        LEASE_GRANTED => Lease::Granted { anchor: Time(reader.u64("lease anchor")?) },
        LEASE_MARK_OUT => Lease::MarkOut,
        tag => return Err(CodecError::UnknownTag { what: "lease", tag }.into()),
    })
}

fn put_version(out: &mut Vec<u8>, version: Version) {
    put_u64(out, version.epoch.0);
    put_u64(out, version.index.0);
}

fn read_version(reader: &mut Reader<'_>) -> Result<Version, PeerError> {
    Ok(Version {
        epoch: Epoch(reader.u64("version epoch")?),
        index: LogIndex(reader.u64("version index")?),
    })
}

fn put_option_version(out: &mut Vec<u8>, version: Option<Version>) {
    put_flag(out, version.is_some());
    if let Some(version) = version {
        put_version(out, version);
    }
}

fn read_option_version(reader: &mut Reader<'_>) -> Result<Option<Version>, PeerError> {
    if reader.flag("version flag")? {
        Ok(Some(read_version(reader)?))
    } else {
        Ok(None)
    }
}

fn put_text(out: &mut Vec<u8>, text: &str) {
    let len = text.len().min(TEXT_BYTES_MAX as usize);
    // Cut on a character boundary so the receiver always gets UTF-8.
    let len = (0..=len).rev().find(|&at| text.is_char_boundary(at)).unwrap_or(0);
    keel_types::codec::put_bytes(out, &text.as_bytes()[..len]);
}

fn read_text(reader: &mut Reader<'_>, what: &'static str) -> Result<String, PeerError> {
    let bytes = reader.bytes_vec(what, TEXT_BYTES_MAX)?;
    String::from_utf8(bytes).map_err(|_| PeerError::InvalidUtf8(what))
}

/// Appends one message.
pub(super) fn put_message(out: &mut Vec<u8>, message: &Message) {
    match message {
        Message::PreVote { epoch, last_epoch, last_index } => {
            put_u8(out, TAG_PRE_VOTE);
            put_u64(out, epoch.0);
            put_u64(out, last_epoch.0);
            put_u64(out, last_index.0);
        }
        Message::PreVoteReply { epoch, granted } => {
            put_u8(out, TAG_PRE_VOTE_REPLY);
            put_u64(out, epoch.0);
            put_flag(out, *granted);
        }
        Message::RequestVote { epoch, last_epoch, last_index, transfer } => {
            put_u8(out, if *transfer { TAG_REQUEST_TRANSFER_VOTE } else { TAG_REQUEST_VOTE });
            put_u64(out, epoch.0);
            put_u64(out, last_epoch.0);
            put_u64(out, last_index.0);
        }
        Message::TimeoutNow { epoch, last_epoch, last_index } => {
            put_u8(out, TAG_TIMEOUT_NOW);
            put_u64(out, epoch.0);
            put_u64(out, last_epoch.0);
            put_u64(out, last_index.0);
        }
        Message::Vote { epoch, granted } => {
            put_u8(out, TAG_VOTE);
            put_u64(out, epoch.0);
            put_flag(out, *granted);
        }
        Message::Append { .. } => put_append(out, message),
        Message::AppendReply { .. } => put_append_reply(out, message),
        Message::InstallSnapshot { epoch, meta, offset, total, data } => {
            put_u8(out, TAG_INSTALL_SNAPSHOT);
            put_u64(out, epoch.0);
            meta.encode_to(out);
            put_u64(out, *offset);
            put_u64(out, *total);
            put_blob(out, data);
        }
        Message::InstallSnapshotReply { epoch, last_index, received } => {
            put_u8(out, TAG_INSTALL_SNAPSHOT_REPLY);
            put_u64(out, epoch.0);
            put_u64(out, last_index.0);
            put_u64(out, *received);
        }
        Message::Forward { epoch, request } => {
            put_u8(out, TAG_FORWARD);
            put_u64(out, epoch.0);
            put_request(out, request);
        }
        Message::ForwardReply { epoch, reply } => {
            put_u8(out, TAG_FORWARD_REPLY);
            put_u64(out, epoch.0);
            put_reply(out, reply);
        }
    }
}

fn put_append(out: &mut Vec<u8>, message: &Message) {
    let Message::Append {
        epoch,
        prev_epoch,
        prev_index,
        entries,
        commit_index,
        durable_index,
        lease,
        flush_through,
        sent_at,
    } = message
    else {
        unreachable!("called for Append only")
    };
    put_u8(out, TAG_APPEND);
    put_u64(out, epoch.0);
    put_u64(out, prev_epoch.0);
    put_u64(out, prev_index.0);
    put_u32(out, u32::try_from(entries.len()).expect("entries per append fit a u32"));
    entries.iter().for_each(|entry| entry.encode_to(out));
    put_u64(out, commit_index.0);
    put_u64(out, durable_index.0);
    put_lease(out, *lease);
    put_flag(out, flush_through.is_some());
    if let Some(index) = flush_through {
        put_u64(out, index.0);
    }
    put_u64(out, sent_at.0);
}

fn put_append_reply(out: &mut Vec<u8>, message: &Message) {
    let Message::AppendReply {
        epoch,
        success,
        last_index,
        persisted_index,
        applied_index,
        match_index,
        released,
        echo_sent_at,
        sent_at,
    } = message
    else {
        unreachable!("called for AppendReply only")
    };
    put_u8(out, TAG_APPEND_REPLY);
    put_u64(out, epoch.0);
    put_flag(out, *success);
    for index in [last_index, persisted_index, applied_index, match_index] {
        put_u64(out, index.0);
    }
    put_flag(out, *released);
    put_u64(out, echo_sent_at.0);
    put_u64(out, sent_at.0);
}

impl super::PeerMessage for Message {
    fn encode(&self, out: &mut Vec<u8>) {
        put_message(out, self);
    }

    fn decode(bytes: &[u8], limits: &PeerLimits) -> Result<Message, PeerError> {
        let mut reader = Reader::new(bytes);
        let message = read_message(&mut reader, limits)?;
        reader.finish()?;
        Ok(message)
    }

    fn bulk_bytes(&self) -> usize {
        match self {
            Message::ForwardReply { reply, .. } => match &reply.result {
                Ok(CommandResult::Value { value: Some(value), .. })
                | Ok(CommandResult::Cas { current: Some(value), .. }) => value.len(),
                _ => 0,
            },
            _ => 0,
        }
    }

    fn shed(&self) -> Option<Message> {
        let Message::ForwardReply { epoch, reply } = self else { return None };
        let error = KeelError::Busy("the link from the leader to this node is saturated".into());
        let reply = ClientReply { result: Err(error), ..reply.clone() };
        Some(Message::ForwardReply { epoch: *epoch, reply })
    }
}

/// Reads one message.
pub(super) fn read_message(
    reader: &mut Reader<'_>,
    limits: &PeerLimits,
) -> Result<Message, PeerError> {
    let epoch = |r: &mut Reader<'_>| r.u64("epoch").map(Epoch);
    let tag = reader.u8("message tag")?;
    if limits.protocol < 2 && [TAG_TIMEOUT_NOW, TAG_REQUEST_TRANSFER_VOTE].contains(&tag) {
        // Peer protocol 2's: a node of protocol 1 knows no such tag.
        return Err(CodecError::UnknownTag { what: "message tag", tag }.into());
    }
    let message = match tag {
        TAG_PRE_VOTE => Message::PreVote {
            epoch: epoch(reader)?,
            last_epoch: Epoch(reader.u64("last epoch")?),
            last_index: LogIndex(reader.u64("last index")?),
        },
        TAG_PRE_VOTE_REPLY => {
            Message::PreVoteReply { epoch: epoch(reader)?, granted: reader.flag("granted")? }
        }
        tag @ (TAG_REQUEST_VOTE | TAG_REQUEST_TRANSFER_VOTE) => Message::RequestVote {
            epoch: epoch(reader)?,
            last_epoch: Epoch(reader.u64("last epoch")?),
            last_index: LogIndex(reader.u64("last index")?),
            transfer: tag == TAG_REQUEST_TRANSFER_VOTE,
        },
        TAG_TIMEOUT_NOW => Message::TimeoutNow {
            epoch: epoch(reader)?,
            last_epoch: Epoch(reader.u64("last epoch")?),
            last_index: LogIndex(reader.u64("last index")?),
        },
        TAG_VOTE => Message::Vote { epoch: epoch(reader)?, granted: reader.flag("granted")? },
        TAG_APPEND => read_append(reader, limits)?,
        TAG_APPEND_REPLY => read_append_reply(reader)?,
        TAG_INSTALL_SNAPSHOT => Message::InstallSnapshot {
            epoch: epoch(reader)?,
            meta: SnapshotMeta::decode_from(reader)?,
            offset: reader.u64("snapshot offset")?,
            total: reader.u64("snapshot length")?,
            data: reader.bytes_vec("snapshot data", u32::MAX)?,
        },
        TAG_INSTALL_SNAPSHOT_REPLY => Message::InstallSnapshotReply {
            epoch: epoch(reader)?,
            last_index: LogIndex(reader.u64("last index")?),
            received: reader.u64("snapshot bytes received")?,
        },
        TAG_FORWARD => Message::Forward { epoch: epoch(reader)?, request: read_request(reader)? },
        TAG_FORWARD_REPLY => {
            Message::ForwardReply { epoch: epoch(reader)?, reply: read_reply(reader)? }
        }
        tag => return Err(CodecError::UnknownTag { what: "message", tag }.into()),
    };
    Ok(message)
}

fn read_append(reader: &mut Reader<'_>, limits: &PeerLimits) -> Result<Message, PeerError> {
    let epoch = Epoch(reader.u64("epoch")?);
    let prev_epoch = Epoch(reader.u64("prev epoch")?);
    let prev_index = LogIndex(reader.u64("prev index")?);
    let count = count(reader, "entries", limits.entries_per_message_max, ENTRY_BYTES_MIN)?;
    let mut entries = Vec::with_capacity(count);
    for _ in 0..count {
        entries.push(Entry::decode_from(reader)?);
    }
    Ok(Message::Append {
        epoch,
        prev_epoch,
        prev_index,
        entries,
        commit_index: LogIndex(reader.u64("commit index")?),
        durable_index: LogIndex(reader.u64("durable index")?),
        lease: read_lease(reader)?,
        flush_through: if reader.flag("flush flag")? {
            Some(LogIndex(reader.u64("flush through")?))
        } else {
            None
        },
        sent_at: Time(reader.u64("sent at")?),
    })
}

fn read_append_reply(reader: &mut Reader<'_>) -> Result<Message, PeerError> {
    Ok(Message::AppendReply {
        epoch: Epoch(reader.u64("epoch")?),
        success: reader.flag("success")?,
        last_index: LogIndex(reader.u64("last index")?),
        persisted_index: LogIndex(reader.u64("persisted index")?),
        applied_index: LogIndex(reader.u64("applied index")?),
        match_index: LogIndex(reader.u64("match index")?),
        released: reader.flag("released")?,
        echo_sent_at: Time(reader.u64("echo sent at")?),
        sent_at: Time(reader.u64("sent at")?),
    })
}

fn put_request(out: &mut Vec<u8>, request: &ClientRequest) {
    let ClientRequest {
        tag,
        client,
        request,
        command,
        durability,
        level,
        after,
        mode: _,
        named: _,
    } = request;
    put_u64(out, tag.0);
    put_u64(out, client.0);
    put_u64(out, request.0);
    command.encode_to(out);
    put_flag(out, durability.is_some());
    if let Some(durability) = durability {
        durability.encode_to(out);
    }
    put_flag(out, level.is_some());
    if let Some(level) = level {
        put_u8(out, level_tag(*level));
    }
    put_u64(out, after.0);
}

fn read_request(reader: &mut Reader<'_>) -> Result<ClientRequest, PeerError> {
    Ok(ClientRequest {
        tag: RequestTag(reader.u64("request tag")?),
        client: ClientId(reader.u64("client id")?),
        request: RequestId(reader.u64("request id")?),
        command: Command::decode_from(reader)?,
        durability: if reader.flag("durability flag")? {
            Some(Durability::decode_from(reader)?)
        } else {
            None
        },
        level: if reader.flag("level flag")? { Some(read_level(reader)?) } else { None },
        after: LogIndex(reader.u64("session floor")?),
        mode: Default::default(),
        named: false,
    })
}

fn level_tag(level: ReadLevel) -> u8 {
    match level {
        ReadLevel::Any => 0,
        ReadLevel::Monotonic => 1,
        ReadLevel::Linearizable => 2,
    }
}

fn read_level(reader: &mut Reader<'_>) -> Result<ReadLevel, PeerError> {
    let tag = reader.u8("read level")?;
    let level = ReadLevel::ALL.into_iter().find(|level| level_tag(*level) == tag);
    level.ok_or_else(|| CodecError::UnknownTag { what: "read level", tag }.into())
}

fn put_reply(out: &mut Vec<u8>, reply: &ClientReply) {
    let ClientReply { tag, served_by, result, durability_round } = reply;
    put_u64(out, tag.0);
    put_u32(out, served_by.0);
    match result {
        Ok(result) => {
            put_u8(out, 0);
            put_result(out, result);
        }
        Err(error) => {
            put_u8(out, 1);
            put_error(out, error);
        }
    }
    put_flag(out, *durability_round);
}

fn read_reply(reader: &mut Reader<'_>) -> Result<ClientReply, PeerError> {
    let tag = RequestTag(reader.u64("reply tag")?);
    let served_by = NodeId(reader.u32("served by")?);
    let result = match reader.u8("reply result")? {
        0 => Ok(read_result(reader)?),
        1 => Err(read_error(reader)?),
        tag => return Err(CodecError::UnknownTag { what: "reply result", tag }.into()),
    };
    Ok(ClientReply { tag, served_by, result, durability_round: reader.flag("durability round")? })
}

fn put_result(out: &mut Vec<u8>, result: &CommandResult) {
    match result {
        CommandResult::Geo(_) => {
            unreachable!("only geo keyspaces answer geo operations, and they forward no reply")
        }
        CommandResult::Value { value, version } => {
            put_u8(out, 1);
            put_option_bytes(out, value.as_deref());
            put_option_version(out, *version);
        }
        CommandResult::Written { version } => {
            put_u8(out, 2);
            put_version(out, *version);
        }
        CommandResult::Cas { swapped, current, version } => {
            put_u8(out, 3);
            put_flag(out, *swapped);
            put_option_bytes(out, current.as_deref());
            put_option_version(out, *version);
        }
        CommandResult::Counter { value, version } => {
            put_u8(out, 4);
            put_i64(out, *value);
            put_version(out, *version);
        }
        CommandResult::Items { items } => {
            put_u8(out, 5);
            put_u32(out, u32::try_from(items.len()).expect("scan items fit a u32"));
            for (key, value, version) in items {
                keel_types::codec::put_bytes(out, key);
                keel_types::codec::put_bytes(out, value);
                put_version(out, *version);
            }
        }
        CommandResult::Enqueued { seq, length, version } => {
            put_u8(out, 7);
            put_u64(out, *seq);
            put_u64(out, *length);
            put_version(out, *version);
        }
        CommandResult::Dequeued { head, remaining, version } => {
            put_u8(out, 8);
            put_queue_head(out, head.as_ref());
            put_u64(out, *remaining);
            put_version(out, *version);
        }
        CommandResult::Queue { head, length, next, version } => {
            put_u8(out, 9);
            put_queue_head(out, head.as_ref());
            put_u64(out, *length);
            put_u64(out, *next);
            put_option_version(out, *version);
        }
        CommandResult::Held { value, version, expires_at } => {
            put_u8(out, 10);
            put_option_bytes(out, value.as_deref());
            put_option_version(out, *version);
            put_flag(out, expires_at.is_some());
            if let Some(at) = expires_at {
                put_u64(out, *at);
            }
        }
        CommandResult::Image { image, version } => {
            put_u8(out, 14);
            put_option_bytes(out, image.as_deref());
            put_option_version(out, *version);
        }
        CommandResult::Count { keys } => {
            put_u8(out, 11);
            put_u64(out, *keys);
        }
        CommandResult::Modified { value, number, version } => {
            put_u8(out, 12);
            put_option_bytes(out, value.as_deref());
            put_i64(out, *number);
            put_option_version(out, *version);
        }
        CommandResult::Answer { answer, version } => {
            put_u8(out, 13);
            keel_types::codec::put_answer(out, answer);
            put_option_version(out, *version);
        }
        CommandResult::Multi { results } => {
            put_u8(out, 6);
            put_flag(out, results.is_some());
            if let Some(results) = results {
                put_u32(out, results.len() as u32);
                for result in results {
                    put_result(out, result);
                }
            }
        }
    }
}

fn put_queue_head(out: &mut Vec<u8>, head: Option<&(u64, keel_types::Value)>) {
    put_flag(out, head.is_some());
    if let Some((seq, value)) = head {
        put_u64(out, *seq);
        keel_types::codec::put_bytes(out, value);
    }
}

fn read_queue_head(reader: &mut Reader<'_>) -> Result<Option<(u64, keel_types::Value)>, PeerError> {
    if !reader.flag("queue head flag")? {
        return Ok(None);
    }
    Ok(Some((reader.u64("queue head sequence")?, reader.bytes("queue head", BYTES_LEN_MAX)?)))
}

/// A transaction's results: at most `MULTI_OPS_MAX`, none of them a transaction's.
fn read_multi_results(reader: &mut Reader<'_>) -> Result<CommandResult, PeerError> {
    if !reader.flag("transaction applied")? {
        return Ok(CommandResult::Multi { results: None });
    }
    let count = count(reader, "transaction results", keel_types::MULTI_OPS_MAX as u32, 1)?;
    let mut results = Vec::with_capacity(count);
    for _ in 0..count {
        match read_result(reader)? {
            CommandResult::Multi { .. } => {
                let tag = 6;
                return Err(CodecError::UnknownTag { what: "result in a transaction", tag }.into());
            }
            result => results.push(result),
        }
    }
    Ok(CommandResult::Multi { results: Some(results) })
}

fn read_result(reader: &mut Reader<'_>) -> Result<CommandResult, PeerError> {
    let result = match reader.u8("command result")? {
        1 => CommandResult::Value {
            value: reader.option_bytes("value", BYTES_LEN_MAX)?,
            version: read_option_version(reader)?,
        },
        2 => CommandResult::Written { version: read_version(reader)? },
        13 => CommandResult::Answer {
            answer: keel_types::codec::read_answer(reader)?,
            version: read_option_version(reader)?,
        },
        3 => CommandResult::Cas {
            swapped: reader.flag("swapped")?,
            current: reader.option_bytes("current value", BYTES_LEN_MAX)?,
            version: read_option_version(reader)?,
        },
        4 => {
            CommandResult::Counter { value: reader.i64("counter")?, version: read_version(reader)? }
        }
        5 => {
            let count = count(reader, "scan items", u32::MAX, SCAN_ITEM_BYTES_MIN)?;
            let mut items = Vec::with_capacity(count);
            for _ in 0..count {
                let key = reader.bytes("key", BYTES_LEN_MAX)?;
                let value = reader.bytes("value", BYTES_LEN_MAX)?;
                items.push((key, value, read_version(reader)?));
            }
            CommandResult::Items { items }
        }
        6 => read_multi_results(reader)?,
        7 => CommandResult::Enqueued {
            seq: reader.u64("enqueued sequence")?,
            length: reader.u64("queue length")?,
            version: read_version(reader)?,
        },
        8 => CommandResult::Dequeued {
            head: read_queue_head(reader)?,
            remaining: reader.u64("queue remaining")?,
            version: read_version(reader)?,
        },
        9 => CommandResult::Queue {
            head: read_queue_head(reader)?,
            length: reader.u64("queue length")?,
            next: reader.u64("queue next")?,
            version: read_option_version(reader)?,
        },
        10 => CommandResult::Held {
            value: reader.option_bytes("value", BYTES_LEN_MAX)?,
            version: read_option_version(reader)?,
            expires_at: match reader.flag("expiry flag")? {
                true => Some(reader.u64("expiry")?),
                false => None,
            },
        },
        11 => CommandResult::Count { keys: reader.u64("key count")? },
        14 => CommandResult::Image {
            image: reader.option_bytes("item image", BYTES_LEN_MAX)?,
            version: read_option_version(reader)?,
        },
        12 => CommandResult::Modified {
            value: reader.option_bytes("modified value", BYTES_LEN_MAX)?,
            number: reader.i64("modified number")?,
            version: read_option_version(reader)?,
        },
        tag => return Err(CodecError::UnknownTag { what: "command result", tag }.into()),
    };
    Ok(result)
}

fn put_error(out: &mut Vec<u8>, error: &KeelError) {
    match error {
        KeelError::NotLeader { leader } => {
            put_u8(out, 1);
            put_flag(out, leader.is_some());
            if let Some(leader) = leader {
                put_u32(out, leader.0);
            }
        }
        KeelError::NotActive => put_u8(out, 2),
        KeelError::Busy(why) => {
            put_u8(out, 3);
            put_text(out, why);
        }
        KeelError::Timeout => put_u8(out, 4),
        KeelError::Unavailable(why) => {
            put_u8(out, 5);
            put_text(out, why);
        }
        KeelError::KeyTooLarge { len, max } | KeelError::ValueTooLarge { len, max } => {
            put_u8(out, if matches!(error, KeelError::KeyTooLarge { .. }) { 6 } else { 7 });
            put_u64(out, *len);
            put_u32(out, *max);
        }
        KeelError::NotAnInteger => put_u8(out, 8),
        KeelError::InvalidArgument(why) => {
            put_u8(out, 9);
            put_text(out, why);
        }
        KeelError::SessionExpired => put_u8(out, 10),
        KeelError::WrongType => put_u8(out, 12),
        KeelError::Conflict(why) => {
            put_u8(out, 11);
            put_text(out, why);
        }
        // The front door's answer for a key of another shard: no engine gives it, so no
        // message carries it; written as the invalid argument it would read as.
        KeelError::Moved { slot, addr } => {
            put_u8(out, 9);
            put_text(out, &format!("MOVED {slot} {addr}"));
        }
        KeelError::Ask { slot, addr } => {
            put_u8(out, 9);
            put_text(out, &format!("ASK {slot} {addr}"));
        }
        // A leader's answer to a request a follower forwarded, for a slot moved or moving.
        KeelError::Redirect { slot, keyspace, ask } => {
            put_u8(out, 13);
            out.extend_from_slice(&slot.to_le_bytes());
            put_u32(out, keyspace.0);
            put_flag(out, ask.is_some());
            if let Some(id) = ask {
                put_u64(out, *id);
            }
        }
        KeelError::TryAgain(why) => {
            put_u8(out, 14);
            put_text(out, why);
        }
    }
}

fn read_error(reader: &mut Reader<'_>) -> Result<KeelError, PeerError> {
    let error = match reader.u8("error")? {
        1 => KeelError::NotLeader {
            leader: if reader.flag("leader flag")? {
                Some(NodeId(reader.u32("leader")?))
            } else {
                None
            },
        },
        2 => KeelError::NotActive,
        3 => KeelError::Busy(read_text(reader, "busy reason")?),
        4 => KeelError::Timeout,
        5 => KeelError::Unavailable(read_text(reader, "unavailable reason")?),
        6 => {
            KeelError::KeyTooLarge { len: reader.u64("key length")?, max: reader.u32("key limit")? }
        }
        7 => KeelError::ValueTooLarge {
            len: reader.u64("value length")?,
            max: reader.u32("value limit")?,
        },
        8 => KeelError::NotAnInteger,
        9 => KeelError::InvalidArgument(read_text(reader, "invalid argument")?),
        10 => KeelError::SessionExpired,
        12 => KeelError::WrongType,
        11 => KeelError::Conflict(read_text(reader, "conflict")?),
        13 => {
            let slot = u16::from_le_bytes([reader.u8("slot")?, reader.u8("slot")?]);
            if slot >= keel_types::slots::SLOTS {
                return Err(CodecError::UnknownTag { what: "slot", tag: 0 }.into());
            }
            KeelError::Redirect {
                slot,
                keyspace: keel_types::KeyspaceId(reader.u32("keyspace")?),
                ask: match reader.flag("ask flag")? {
                    true => Some(reader.u64("asked move")?),
                    false => None,
                },
            }
        }
        14 => KeelError::TryAgain(read_text(reader, "try again")?),
        tag => return Err(CodecError::UnknownTag { what: "error", tag }.into()),
    };
    Ok(error)
}

#[cfg(test)]
pub(crate) mod strategies {
    //! Strategies that build every message with every field random. Each struct literal
    //! names all fields, so a new field fails to compile here until it gets a strategy.

    use super::*;
    use keel_types::EntryPayload;
    use proptest::collection::vec;
    use proptest::option;
    use proptest::prelude::*;

    fn bytes() -> impl Strategy<Value = bytes::Bytes> {
        vec(any::<u8>(), 0..8).prop_map(bytes::Bytes::from)
    }

    fn version() -> impl Strategy<Value = Version> {
        (any::<u64>(), any::<u64>()).prop_map(|(e, i)| Version::new(e, i))
    }

    fn command() -> impl Strategy<Value = Command> {
        let watched = (bytes(), option::of(version()));
        prop_oneof![
            4 => single_command(),
            1 => (vec(transaction_op(), 1..4), vec(watched, 0..3))
                .prop_map(|(ops, watch)| Command::Multi { ops, watch }),
        ]
    }

    /// What a transaction may hold: any single-key command, no scan.
    fn transaction_op() -> impl Strategy<Value = Command> {
        single_command().prop_filter("no scan or queue operation in a transaction", |c| {
            !matches!(
                c,
                Command::Scan { .. }
                    | Command::Enqueue { .. }
                    | Command::Dequeue { .. }
                    | Command::QueuePeek { .. }
            )
        })
    }

    fn single_command() -> impl Strategy<Value = Command> {
        prop_oneof![
            bytes().prop_map(|key| Command::Get { key }),
            (bytes(), bytes()).prop_map(|(key, value)| Command::Put { key, value }),
            bytes().prop_map(|key| Command::Delete { key }),
            (bytes(), option::of(bytes()), bytes()).prop_map(|(key, expected, new)| Command::Cas {
                key,
                expected,
                new
            }),
            (bytes(), any::<i64>()).prop_map(|(key, delta)| Command::Incr { key, delta }),
            (bytes(), option::of(bytes()), any::<u32>())
                .prop_map(|(start, end, limit)| Command::Scan { start, end, limit }),
            (bytes(), bytes()).prop_map(|(queue, value)| Command::Enqueue { queue, value }),
            bytes().prop_map(|queue| Command::Dequeue { queue }),
            bytes().prop_map(|queue| Command::QueuePeek { queue }),
        ]
    }

    fn durability() -> impl Strategy<Value = Durability> {
        prop_oneof![
            Just(Durability::Memory),
            Just(Durability::Replicated),
            Just(Durability::Durable)
        ]
    }

    fn entry() -> impl Strategy<Value = Entry> {
        let payload = prop_oneof![
            Just(EntryPayload::Noop),
            (1..=keel_types::limits::DEDUP_CLIENTS_CEILING).prop_map(|dedup_clients_max| {
                EntryPayload::Settings(keel_types::ApplySettings { dedup_clients_max })
            }),
            (any::<u64>(), any::<u64>(), durability(), command()).prop_map(
                |(c, r, durability, command)| {
                    EntryPayload::Write {
                        client: ClientId(c),
                        request: RequestId(r),
                        durability,
                        command,
                    }
                }
            ),
        ];
        (any::<u64>(), any::<u64>(), payload).prop_map(|(e, i, payload)| Entry {
            epoch: Epoch(e),
            index: LogIndex(i),
            payload,
        })
    }

    fn request() -> impl Strategy<Value = ClientRequest> {
        let level = prop_oneof![
            Just(ReadLevel::Any),
            Just(ReadLevel::Monotonic),
            Just(ReadLevel::Linearizable)
        ];
        (any::<[u64; 4]>(), command(), option::of(durability()), option::of(level)).prop_map(
            |([tag, client, request, after], command, durability, level)| ClientRequest {
                tag: RequestTag(tag),
                client: ClientId(client),
                request: RequestId(request),
                command,
                durability,
                level,
                after: LogIndex(after),
                mode: Default::default(),
                named: false,
            },
        )
    }

    fn text() -> impl Strategy<Value = String> {
        "[a-z é]{0,12}"
    }

    fn error() -> impl Strategy<Value = KeelError> {
        prop_oneof![
            option::of(any::<u32>()).prop_map(|l| KeelError::NotLeader { leader: l.map(NodeId) }),
            Just(KeelError::NotActive),
            text().prop_map(KeelError::Busy),
            Just(KeelError::Timeout),
            text().prop_map(KeelError::Unavailable),
            (any::<u64>(), any::<u32>()).prop_map(|(len, max)| KeelError::KeyTooLarge { len, max }),
            (any::<u64>(), any::<u32>())
                .prop_map(|(len, max)| KeelError::ValueTooLarge { len, max }),
            Just(KeelError::NotAnInteger),
            text().prop_map(KeelError::InvalidArgument),
            Just(KeelError::SessionExpired),
            text().prop_map(KeelError::Conflict),
        ]
    }

    fn single_result() -> impl Strategy<Value = CommandResult> {
        prop_oneof![
            (option::of(bytes()), option::of(version()))
                .prop_map(|(value, version)| CommandResult::Value { value, version }),
            version().prop_map(|version| CommandResult::Written { version }),
            (any::<bool>(), option::of(bytes()), option::of(version())).prop_map(
                |(swapped, current, version)| CommandResult::Cas { swapped, current, version }
            ),
            (any::<i64>(), version())
                .prop_map(|(value, version)| CommandResult::Counter { value, version }),
            vec((bytes(), bytes(), version()), 0..3)
                .prop_map(|items| CommandResult::Items { items }),
            (any::<u64>(), any::<u64>(), version()).prop_map(|(seq, length, version)| {
                CommandResult::Enqueued { seq, length, version }
            }),
            (option::of((any::<u64>(), bytes())), any::<u64>(), version()).prop_map(
                |(head, remaining, version)| CommandResult::Dequeued { head, remaining, version }
            ),
            (option::of((any::<u64>(), bytes())), any::<[u64; 2]>(), option::of(version()))
                .prop_map(|(head, [length, next], version)| CommandResult::Queue {
                    head,
                    length,
                    next,
                    version
                }),
        ]
    }

    fn result() -> impl Strategy<Value = CommandResult> {
        prop_oneof![
            4 => single_result(),
            1 => option::of(vec(single_result(), 1..4))
                .prop_map(|results| CommandResult::Multi { results }),
        ]
    }

    fn reply() -> impl Strategy<Value = ClientReply> {
        let result = prop_oneof![result().prop_map(Ok), error().prop_map(Err)];
        (any::<u64>(), any::<u32>(), result, any::<bool>()).prop_map(
            |(tag, node, result, durability_round)| ClientReply {
                tag: RequestTag(tag),
                served_by: NodeId(node),
                result,
                durability_round,
            },
        )
    }

    fn append() -> impl Strategy<Value = Message> {
        let lease = prop_oneof![
            Just(Lease::Withheld),
            any::<u64>().prop_map(|anchor| Lease::Granted { anchor: Time(anchor) }),
            Just(Lease::MarkOut),
        ];
        (any::<[u64; 8]>(), vec(entry(), 0..3), lease, option::of(any::<u64>())).prop_map(
            |(
                [epoch, prev_epoch, prev_index, commit, durable, sent, _, _],
                entries,
                lease,
                flush,
            )| {
                Message::Append {
                    epoch: Epoch(epoch),
                    prev_epoch: Epoch(prev_epoch),
                    prev_index: LogIndex(prev_index),
                    entries,
                    commit_index: LogIndex(commit),
                    durable_index: LogIndex(durable),
                    lease,
                    flush_through: flush.map(LogIndex),
                    sent_at: Time(sent),
                }
            },
        )
    }

    fn append_reply() -> impl Strategy<Value = Message> {
        (any::<[u64; 7]>(), any::<[bool; 2]>()).prop_map(
            |([epoch, last, persisted, applied, matched, echo, sent], [success, released])| {
                Message::AppendReply {
                    epoch: Epoch(epoch),
                    success,
                    last_index: LogIndex(last),
                    persisted_index: LogIndex(persisted),
                    applied_index: LogIndex(applied),
                    match_index: LogIndex(matched),
                    released,
                    echo_sent_at: Time(echo),
                    sent_at: Time(sent),
                }
            },
        )
    }

    /// Any message, every field random.
    pub(crate) fn message() -> impl Strategy<Value = Message> {
        prop_oneof![
            any::<[u64; 3]>().prop_map(|[e, le, li]| Message::PreVote {
                epoch: Epoch(e),
                last_epoch: Epoch(le),
                last_index: LogIndex(li),
            }),
            (any::<u64>(), any::<bool>())
                .prop_map(|(e, granted)| Message::PreVoteReply { epoch: Epoch(e), granted }),
            (any::<[u64; 3]>(), any::<bool>()).prop_map(|([e, le, li], transfer)| {
                Message::RequestVote {
                    epoch: Epoch(e),
                    last_epoch: Epoch(le),
                    last_index: LogIndex(li),
                    transfer,
                }
            }),
            any::<[u64; 3]>().prop_map(|[e, le, li]| Message::TimeoutNow {
                epoch: Epoch(e),
                last_epoch: Epoch(le),
                last_index: LogIndex(li),
            }),
            (any::<u64>(), any::<bool>())
                .prop_map(|(e, granted)| Message::Vote { epoch: Epoch(e), granted }),
            append(),
            append_reply(),
            (any::<[u64; 5]>(), bytes()).prop_map(|([e, li, le, offset, total], data)| {
                Message::InstallSnapshot {
                    epoch: Epoch(e),
                    meta: SnapshotMeta { last_index: LogIndex(li), last_epoch: Epoch(le) },
                    offset,
                    total,
                    data: data.to_vec(),
                }
            }),
            any::<[u64; 3]>().prop_map(|[e, li, received]| Message::InstallSnapshotReply {
                epoch: Epoch(e),
                last_index: LogIndex(li),
                received,
            }),
            (any::<u64>(), request())
                .prop_map(|(e, request)| Message::Forward { epoch: Epoch(e), request }),
            (any::<u64>(), reply())
                .prop_map(|(e, reply)| Message::ForwardReply { epoch: Epoch(e), reply }),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn round_trip(message: &Message) -> Message {
        let mut bytes = Vec::new();
        put_message(&mut bytes, message);
        assert!(!bytes.is_empty(), "an envelope's message takes at least one byte");
        let mut reader = Reader::new(&bytes);
        let decoded = read_message(&mut reader, &PeerLimits::default()).unwrap();
        reader.finish().unwrap();
        decoded
    }

    #[test]
    fn a_node_of_peer_protocol_1_refuses_what_protocol_2_added_and_decodes_the_rest() {
        let older = PeerLimits { protocol: 1, ..PeerLimits::default() };
        let vote = |transfer| Message::RequestVote {
            epoch: Epoch(3),
            last_epoch: Epoch(2),
            last_index: LogIndex(9),
            transfer,
        };
        let decode = |message: &Message| {
            let mut bytes = Vec::new();
            put_message(&mut bytes, message);
            read_message(&mut Reader::new(&bytes), &older)
        };
        assert_eq!(decode(&vote(false)), Ok(vote(false)), "tag 1's bytes are unchanged");
        let timeout_now =
            Message::TimeoutNow { epoch: Epoch(3), last_epoch: Epoch(3), last_index: LogIndex(9) };
        for added in [vote(true), timeout_now] {
            assert!(decode(&added).is_err(), "{added:?}");
            assert_eq!(round_trip(&added), added, "this protocol decodes it");
        }
    }

    proptest! {
        #[test]
        fn every_message_round_trips(message in strategies::message()) {
            prop_assert_eq!(round_trip(&message), message);
        }

        #[test]
        fn every_strict_prefix_is_refused(message in strategies::message()) {
            let mut bytes = Vec::new();
            put_message(&mut bytes, &message);
            for cut in 0..bytes.len() {
                let mut reader = Reader::new(&bytes[..cut]);
                prop_assert!(read_message(&mut reader, &PeerLimits::default()).is_err());
            }
        }
    }

    #[test]
    fn long_error_text_is_cut_on_a_character_boundary() {
        let why = "é".repeat(TEXT_BYTES_MAX as usize);
        let reply = ClientReply {
            tag: RequestTag(1),
            served_by: NodeId(1),
            result: Err(KeelError::Busy(why)),
            durability_round: false,
        };
        let Message::ForwardReply { reply, .. } =
            round_trip(&Message::ForwardReply { epoch: Epoch(1), reply })
        else {
            panic!("the variant survives")
        };
        let Err(KeelError::Busy(text)) = reply.result else { panic!("the error survives") };
        assert!(text.len() <= TEXT_BYTES_MAX as usize && !text.is_empty());
    }

    #[test]
    fn minimum_sizes_are_the_smallest_encodings() {
        let mut bytes = Vec::new();
        let noop =
            Entry { epoch: Epoch(0), index: LogIndex(0), payload: keel_types::EntryPayload::Noop };
        noop.encode_to(&mut bytes);
        assert_eq!(bytes.len() as u64, ENTRY_BYTES_MIN);
        bytes.clear();
        let items = CommandResult::Items {
            items: vec![(vec![].into(), vec![].into(), Version::default())],
        };
        put_result(&mut bytes, &items);
        assert_eq!(bytes.len() as u64, 1 + 4 + SCAN_ITEM_BYTES_MIN);
    }

    #[test]
    fn an_unknown_lease_tag_is_refused() {
        let mut bytes = vec![TAG_APPEND];
        for _ in 0..3 {
            put_u64(&mut bytes, 1);
        }
        put_u32(&mut bytes, 0);
        put_u64(&mut bytes, 1); // commit index
        put_u64(&mut bytes, 1); // durable index
        put_u8(&mut bytes, 7);
        let err = read_message(&mut Reader::new(&bytes), &PeerLimits::default()).unwrap_err();
        assert!(matches!(err, PeerError::Codec(CodecError::UnknownTag { what: "lease", tag: 7 })));
    }

    #[test]
    fn a_huge_entry_count_is_refused_before_reserving() {
        let mut bytes = vec![TAG_APPEND];
        for _ in 0..3 {
            put_u64(&mut bytes, 1);
        }
        put_u32(&mut bytes, u32::MAX);
        let err = read_message(&mut Reader::new(&bytes), &PeerLimits::default()).unwrap_err();
        assert!(matches!(err, PeerError::TooMany { what: "entries", .. }));
        let limits = PeerLimits { entries_per_message_max: u32::MAX, ..PeerLimits::default() };
        let err = read_message(&mut Reader::new(&bytes), &limits).unwrap_err();
        assert!(matches!(err, PeerError::Codec(CodecError::Truncated { .. })));
    }
}
