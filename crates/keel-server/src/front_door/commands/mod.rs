//! The commands by family, each file holding its commands' parsing (when not
//! `keel_wire::command`'s), permission check, mapping onto the engine's commands and
//! replies:
//! - [`acl`]: `AUTH`, `HELLO ... AUTH`, `ACL WHOAMI`, and the permission check;
//! - [`strings`]: `GET`, `MGET`, `SET`, `INCR` and its kin, `KEEL.FAA`, `KEEL.CAS`;
//! - [`keys`]: `DEL`, `EXISTS`, `KEEL.SCAN`;
//! - [`collections`]: hashes, lists, sets, sorted sets and the blocking pops;
//! - [`lcs`]: `LCS`, the longest common subsequence;
//! - [`queues`]: `KEEL.ENQUEUE`, `KEEL.DEQUEUE`, `KEEL.QPEEK`;
//! - [`geo`]: a geo keyspace's sessions: `KEEL.TX.*`, `KEEL.BARRIER`, `KEEL.ATTACH`,
//!   `KEEL.PAST`, and reads and updates inside a transaction;
//! - [`transactions`]: `MULTI`, `EXEC`, `DISCARD`, `WATCH`, `UNWATCH`;
//! - [`settings`]: `CONFIG GET`, `CONFIG SET`, `CONFIG RESETSTAT`;
//! - [`pubsub`]: `SUBSCRIBE` and its kin, `PUBLISH`, `PUBSUB`;
//! - [`sessions`]: `KEEL.REQ` and `KEEL.SESSION`, deduplication under client-chosen pairs;
//! - [`correctables`]: `KEEL.INVOKE`, an operation as a Correctable, its views;
//! - [`server`]: connection and introspection commands (`PING`, `HELLO`, `CLIENT`,
//!   `SELECT`, `INFO`, `KEEL.STATUS`, `KEEL.KEYSPACES`, `KEEL.LOG`, ...).
//!
//! Below: the few leaves several families share.

pub(crate) mod acl;
pub(crate) mod cluster;
pub(crate) mod collections;
pub(crate) mod correctables;
pub(crate) mod databases;
pub(crate) mod dump;
pub(crate) mod geo;
pub(crate) mod keys;
pub(crate) mod lcs;
pub(crate) mod lua;
pub(crate) mod lua_libs;
pub(crate) mod pubsub;
pub(crate) mod queues;
pub(crate) mod scripting;
pub(crate) mod server;
pub(crate) mod sessions;
pub(crate) mod settings;
pub(crate) mod slots;
pub(crate) mod strings;
pub(crate) mod transactions;

use crate::driver::Submit;
use keel_core::engine::{ClientReply, OpMode};
use keel_types::{ClientId, Command, CommandResult, KeelError, LogIndex, ReadLevel, RequestId};
use keel_wire::reply::{error_frame, value_frame, version_frame};
use keel_wire::resp::Frame;

/// A word as a u64, if it is one.
pub(crate) fn parse_u64(word: &[u8]) -> Option<u64> {
    std::str::from_utf8(word).ok()?.parse().ok()
}

/// `command` as a request with no durability and no barrier, under a pair the front door
/// chose (`named: false`).
pub(crate) fn plain_submit(
    client: ClientId,
    request: RequestId,
    command: Command,
    level: Option<ReadLevel>,
    after: LogIndex,
) -> Submit {
    let mode = OpMode::Plain;
    Submit { client, request, command, durability: None, level, after, mode, named: false }
}

/// A reply of another kind than the request's (only a forwarded answer from a peer that
/// breaks the protocol can be one): an error for the client, never a panic.
pub(crate) fn mismatched(op: &str) -> Frame {
    Frame::error(&format!("ERR internal: a {op} was answered with another kind of result"))
}

/// The reply of `INCR`, `KEEL.CAS`, `KEEL.SCAN`, the queue commands (and any result,
/// by its kind).
pub(crate) fn result_reply(reply: Result<ClientReply, KeelError>, _: bool) -> Frame {
    match reply.and_then(|r| r.result) {
        Ok(CommandResult::Counter { value, .. }) => Frame::Integer(value),
        Ok(CommandResult::Cas { swapped, current, version }) => Frame::Array(vec![
            Frame::Boolean(swapped),
            value_frame(current.as_ref()),
            version.map_or(Frame::Null, version_frame),
        ]),
        Ok(CommandResult::Items { items }) => Frame::Array(
            items
                .into_iter()
                .map(|(k, v, version)| {
                    Frame::Array(vec![Frame::Bulk(k), Frame::Bulk(v), version_frame(version)])
                })
                .collect(),
        ),
        Ok(CommandResult::Written { .. }) => Frame::ok(),
        Ok(CommandResult::Count { keys }) => Frame::Integer(keys as i64),
        Ok(CommandResult::Modified { value: Some(value), .. }) => Frame::Bulk(value),
        Ok(CommandResult::Modified { number, .. }) => Frame::Integer(number),
        Ok(CommandResult::Value { value, .. } | CommandResult::Held { value, .. }) => {
            value_frame(value.as_ref())
        }
        Ok(
            result @ (CommandResult::Enqueued { .. }
            | CommandResult::Dequeued { .. }
            | CommandResult::Queue { .. }),
        ) => keel_wire::reply::result_frame(&result, false),
        Ok(CommandResult::Geo(result)) => keel_wire::reply::geo_frame(&result),
        Ok(CommandResult::Answer { answer, .. }) => keel_wire::reply::answer_frame(&answer, false),
        Ok(CommandResult::Multi { .. } | CommandResult::Image { .. }) => mismatched("command"),
        Err(e) => error_frame(&e),
    }
}
