//! `DUMP` and `RESTORE`: a key's item as an opaque payload, and back.
//!
//! The payload is Keel's, not Redis's RDB encoding: `KEEL` and a format byte, then the
//! item's image (`keel_core::leader::kv_image`: the value or collection and its expiry),
//! read whole with [`Command::Fetch`]. So it moves keys between Keel keyspaces and
//! clusters, not between Keel and Redis; a payload of another form is refused with
//! Redis's error. `RESTORE` decodes the payload at the door (a forged collection, a field
//! twice, a NaN score are refused there) and writes it with [`Command::Restore`], the
//! expiry it asks for set by an `Expire` in the same entry, whose relative time the
//! leader stamps. Without `REPLACE` it reads the key's version first and writes only if
//! the key is still as read, absent (`BUSYKEY` otherwise).

use super::acl::permitted;
use super::databases::key_in_database;
use crate::acl::Category;
use crate::front_door::conn::{Conn, Kind, Pending};
use bytes::Bytes;
use keel_core::engine::OpMode;
use keel_types::{Command, CommandResult, ExpireCond, Key, ReadLevel, Ttl, Version};
use keel_wire::reply::error_frame;
use keel_wire::resp::Frame;

/// What every payload begins with: `KEEL` and the format (1).
const MAGIC: &[u8] = b"KEEL\x01";
/// Reads and writes a `RESTORE` without `REPLACE` tries while the key changes under it.
const ATTEMPTS_MAX: usize = 8;

/// `DUMP` and `RESTORE`; `Err(words)`: neither.
pub(crate) async fn route(conn: &mut Conn, words: Vec<Bytes>) -> Result<Pending, Vec<Bytes>> {
    let first = words.first().map_or(&[][..], |w| &w[..]);
    if first.eq_ignore_ascii_case(b"dump") {
        return Ok(dump(conn, words).await);
    }
    if first.eq_ignore_ascii_case(b"restore") {
        return Ok(restore(conn, words).await);
    }
    Err(words)
}

async fn dump(conn: &mut Conn, words: Vec<Bytes>) -> Pending {
    let protocol = conn.protocol;
    if words.len() != 2 {
        return Pending::ready(
            Frame::error("ERR wrong number of arguments for 'dump' command"),
            protocol,
        );
    }
    if let Err(refusal) = permitted(conn, Some(Category::Read)) {
        return Pending::ready(refusal, protocol);
    }
    let key = match key_in_database(conn.db, words[1].clone()) {
        Ok(key) => key,
        Err(refusal) => return Pending::ready(refusal, protocol),
    };
    let ks = conn.node.id;
    conn.order_through_loop(Kind::Read(ks, None)).await;
    let (client, request) = conn.next_pair();
    let after = conn.resolved.floor(ks);
    let submit = super::plain_submit(client, request, Command::Fetch { key }, None, after);
    let sent = conn.node.send(submit);
    let reply = async move {
        match sent.answer().await.and_then(|r| r.result) {
            Ok(CommandResult::Image { image: Some(image), .. }) => {
                let mut payload = Vec::with_capacity(MAGIC.len() + image.len());
                payload.extend_from_slice(MAGIC);
                payload.extend_from_slice(&image);
                Frame::Bulk(payload.into())
            }
            Ok(CommandResult::Image { image: None, .. }) => Frame::Null,
            Ok(_) => super::mismatched("dump"),
            Err(e) => error_frame(&e),
        }
    };
    Pending::later(Box::pin(reply), protocol)
}

/// `RESTORE key ttl payload [REPLACE] [ABSTTL] [IDLETIME s] [FREQ f]` as parsed.
struct Restore {
    key: Key,
    image: Bytes,
    ttl: Option<Ttl>,
    replace: bool,
}

fn parse_restore(conn: &Conn, words: &[Bytes]) -> Result<Restore, Frame> {
    if words.len() < 4 {
        return Err(Frame::error("ERR wrong number of arguments for 'restore' command"));
    }
    let key = key_in_database(conn.db, words[1].clone())?;
    let ttl = std::str::from_utf8(&words[2]).ok().and_then(|t| t.parse::<i64>().ok());
    let ttl = match ttl {
        Some(ttl) if ttl >= 0 => ttl as u64,
        Some(_) => return Err(Frame::error("ERR Invalid TTL value, must be >= 0")),
        None => return Err(Frame::error("ERR value is not an integer or out of range")),
    };
    let (mut replace, mut absolute) = (false, false);
    let mut options = words[4..].iter();
    while let Some(option) = options.next() {
        let is = |name: &str| option.eq_ignore_ascii_case(name.as_bytes());
        if is("replace") {
            replace = true;
        } else if is("absttl") {
            absolute = true;
        } else if is("idletime") || is("freq") {
            // Keel keeps no access times or counts: accepted and not kept.
            let number =
                options.next().and_then(|n| std::str::from_utf8(n).ok()?.parse::<i64>().ok());
            if number.is_none_or(|n| n < 0) {
                return Err(Frame::error("ERR Invalid IDLETIME or FREQ value"));
            }
        } else {
            return Err(Frame::error("ERR syntax error"));
        }
    }
    let bad = || Frame::error("ERR DUMP payload version or checksum are wrong");
    let image = words[3].strip_prefix(MAGIC).ok_or_else(bad)?;
    // Decoded here, whatever the engine does again: a forged payload is refused before
    // it reaches the log, and its expiry is replaced by the one asked for.
    let mut item = keel_core::leader::kv_image::decode(image, Version::new(0, 0))
        .map_err(|_| Frame::error("ERR Bad data format"))?;
    item.expires_at = None;
    let image = keel_core::leader::kv_image::encode(&item);
    let ttl = match (ttl, absolute) {
        (0, _) => None,
        (ms, false) => Some(Ttl::After(ms)),
        (at, true) => Some(Ttl::At(at)),
    };
    Ok(Restore { key, image, ttl, replace })
}

async fn restore(conn: &mut Conn, words: Vec<Bytes>) -> Pending {
    let protocol = conn.protocol;
    if let Err(refusal) = permitted(conn, Some(Category::Write)) {
        return Pending::ready(refusal, protocol);
    }
    let restore = match parse_restore(conn, &words) {
        Ok(restore) => restore,
        Err(refusal) => return Pending::ready(refusal, protocol),
    };
    let ks = conn.node.id;
    conn.order_through_loop(Kind::Write(ks)).await;
    let node = conn.node.clone();
    let floor = conn.floor();
    let after = conn.resolved.floor(ks);
    let pairs: Vec<_> = (0..ATTEMPTS_MAX).map(|_| conn.next_pair()).collect();
    let mut ops = vec![Command::Restore { key: restore.key.clone(), image: restore.image }];
    if let Some(ttl) = restore.ttl {
        ops.push(Command::Expire {
            key: restore.key.clone(),
            ttl,
            cond: ExpireCond::Always,
            now_ms: 0,
        });
    }
    let reply = async move {
        for (client, request) in pairs {
            let mut watch = Vec::new();
            if !restore.replace {
                let fetch = Command::Fetch { key: restore.key.clone() };
                let level = Some(ReadLevel::Linearizable);
                let (reader, read) = (keel_types::ClientId(1), keel_types::RequestId(1));
                let submit = super::plain_submit(reader, read, fetch, level, after);
                match node.send(submit).answer().await.and_then(|r| r.result) {
                    Ok(CommandResult::Image { image: Some(_), .. }) => {
                        return Frame::error("BUSYKEY Target key name already exists.")
                    }
                    Ok(CommandResult::Image { image: None, version }) => {
                        watch.push((restore.key.clone(), version))
                    }
                    Ok(_) => return super::mismatched("restore"),
                    Err(e) => return error_frame(&e),
                }
            }
            let command = Command::Multi { ops: ops.clone(), watch };
            let submit = crate::driver::Submit {
                client,
                request,
                command,
                durability: None,
                level: None,
                after,
                mode: OpMode::Plain,
                named: false,
            };
            let answer = node.send(submit).answer().await;
            floor.note(&answer);
            match answer.and_then(|r| r.result) {
                Ok(CommandResult::Multi { results: Some(_) }) => {
                    super::collections::wake_blocked();
                    return Frame::ok();
                }
                Ok(CommandResult::Multi { results: None }) => continue, // written meanwhile
                Ok(_) => return super::mismatched("restore"),
                Err(e) => return error_frame(&e),
            }
        }
        Frame::error("BUSYKEY Target key name already exists.")
    };
    Pending::later(Box::pin(reply), protocol)
}
