//! Deduplication under names the client chose: `KEEL.REQ <client> <seq> <command ...>`
//! and `KEEL.SESSION`.
//!
//! - `KEEL.REQ <client> <seq> <command ...>`: runs a single-key command (or, inside
//!   `MULTI`, `EXEC`: `transactions`) with the given deduplication pair instead of the
//!   connection's. A retried write carries the same pair and is applied at most once.
//!   `<client>` is a non-zero u64: below 2^63 a plain id (taken for a new client once the
//!   deduplication table forgets it), else a session from `KEEL.SESSION`.
//! - `KEEL.SESSION`: opens a deduplication session and answers its id, for `KEEL.REQ`:
//!   a retry of a session's request is never applied twice; once the table has forgotten
//!   the session, its requests get `-SESSIONEXPIRED` instead.
//!
//! An authenticated user's ids are its own (derived from its name, so that no other user
//! can advance or replay them): [`named_client`].

use super::acl::permitted;
use super::{parse_u64, plain_submit};
use crate::acl::Category;
use crate::front_door::conn::{Conn, Kind, Pending};
use crate::front_door::dispatch::dispatch;
use bytes::Bytes;
use keel_types::{ClientId, Command, RequestId};
use keel_wire::reply::error_frame;
use keel_wire::resp::Frame;
use keel_wire::ClientCommand;

/// A client-named pair's numbers if both are valid: a client other than 0 and the bare
/// session bit, a sequence number other than 0.
pub(crate) fn req_numbers(client: Option<u64>, seq: Option<u64>) -> Option<(u64, u64)> {
    let client = client.filter(|c| *c != 0 && *c != ClientId::SESSION_BIT);
    let seq = seq.filter(|s| *s != 0);
    client.zip(seq)
}

/// The client id the engine sees for the id `raw` a client named: an authenticated
/// user's ids are mapped into its own.
pub(crate) fn named_client(conn: &Conn, raw: u64) -> ClientId {
    conn.user.as_ref().map_or(ClientId(raw), |user| user.client_id(raw))
}

/// The deduplication pair `KEEL.REQ <client> <seq> ...` names, as the engine sees it.
pub(crate) fn req_pair(conn: &Conn, words: &[Bytes]) -> Result<(ClientId, RequestId), Frame> {
    if words.len() < 4 {
        return Err(Frame::error("ERR wrong number of arguments for 'keel.req' command"));
    }
    let Some((client, seq)) = req_numbers(parse_u64(&words[1]), parse_u64(&words[2])) else {
        return Err(Frame::error("ERR KEEL.REQ client and seq must be positive integers"));
    };
    Ok((named_client(conn, client), RequestId(seq)))
}

/// `KEEL.REQ <client> <seq> <command ...>` outside `MULTI`.
pub(crate) async fn keel_req(conn: &mut Conn, mut words: Vec<Bytes>) -> Pending {
    let protocol = conn.protocol;
    let (client, request) = match req_pair(conn, &words) {
        Ok(pair) => pair,
        Err(refusal) => return Pending::ready(refusal, protocol),
    };
    if words[3].eq_ignore_ascii_case(b"exec") {
        return Pending::ready(Frame::error("ERR EXEC without MULTI"), protocol);
    }
    let rest = words.split_off(3);
    let command = match keel_wire::command::parse(rest, &conn.limits) {
        Ok(command) => command,
        Err(e) => return Pending::ready(e.reply_frame(), protocol),
    };
    let single_key = matches!(
        &command,
        ClientCommand::Get { .. }
            | ClientCommand::Set { .. }
            | ClientCommand::Incr { .. }
            | ClientCommand::Cas { .. }
            | ClientCommand::Scan { .. }
            | ClientCommand::Enqueue { .. }
            | ClientCommand::Dequeue { .. }
            | ClientCommand::QueuePeek { .. }
    ) || matches!(&command, ClientCommand::Del { keys } if keys.len() == 1)
        || matches!(&command, ClientCommand::Slots { op: Some(_) });
    if !single_key {
        let text =
            "ERR KEEL.REQ takes one single-key command, a KEEL.SLOTS step (or EXEC inside MULTI)";
        return Pending::ready(Frame::error(text), protocol);
    }
    dispatch(conn, command, (client, request), true).await
}

/// `KEEL.SESSION`: opens a deduplication session in the connection's keyspace and
/// answers its id (a bulk string: a u64 with `ClientId::SESSION_BIT` set) for
/// `KEEL.REQ`. The id is drawn at random; for an authenticated user the engine sees it
/// mapped, as every `KEEL.REQ` id.
pub(crate) async fn keel_session(conn: &mut Conn, words: &[Bytes]) -> Pending {
    use ring::rand::SecureRandom;
    let protocol = conn.protocol;
    if words.len() != 1 {
        return Pending::ready(
            Frame::error("ERR wrong number of arguments for 'keel.session' command"),
            protocol,
        );
    }
    if let Err(refusal) = permitted(conn, Some(Category::Write)) {
        return Pending::ready(refusal, protocol);
    }
    let mut nonce = [0u8; 8];
    if ring::rand::SystemRandom::new().fill(&mut nonce).is_err() {
        return Pending::ready(Frame::error("ERR no random id available"), protocol);
    }
    let raw = u64::from_le_bytes(nonce) | ClientId::SESSION_BIT;
    let client = named_client(conn, raw);
    let ks = conn.node.id;
    conn.order_through_loop(Kind::Write(ks)).await;
    let after = conn.resolved.floor(ks);
    let sent = conn.node.send(plain_submit(
        client,
        RequestId(0),
        Command::OpenSession { seen: None },
        None,
        after,
    ));
    let reply = async move {
        match sent.answer().await.and_then(|r| r.result) {
            Ok(_) => Frame::bulk(raw.to_string()),
            Err(e) => error_frame(&e),
        }
    };
    Pending::later(Box::pin(reply), protocol)
}

#[cfg(test)]
mod tests {
    use crate::front_door::handle;
    use crate::front_door::tests::{conn, ready_text, submitted, words};
    use keel_types::{ClientId, RequestId};

    #[tokio::test]
    async fn keel_req_refuses_bad_pairs_and_multi_key_commands() {
        let (mut c, _rx, _resolved) = conn();
        let text =
            ready_text(handle(&mut c, words(&["KEEL.REQ", "0", "1", "SET", "k", "v"])).await);
        assert!(text.starts_with("ERR KEEL.REQ client and seq"), "{text}");
        let text =
            ready_text(handle(&mut c, words(&["KEEL.REQ", "1", "1", "DEL", "a", "b"])).await);
        assert!(text.contains("one single-key command"), "{text}");
        let text = ready_text(handle(&mut c, words(&["KEEL.REQ", "1"])).await);
        assert!(text.contains("wrong number of arguments"), "{text}");
    }

    #[tokio::test]
    async fn keel_req_carries_the_given_pair_and_plain_requests_number_themselves() {
        let (mut c, mut rx, _resolved) = conn();
        let pending = handle(&mut c, words(&["KEEL.REQ", "7", "3", "SET", "k", "v"])).await;
        let writer = tokio::spawn(pending.resolve());
        let s = submitted(&mut rx).await;
        assert_eq!((s.client, s.request), (ClientId(7), RequestId(3)));
        writer.abort();
        _resolved.one_more(); // the SET was answered: the GETs need not wait
        let first = tokio::spawn(handle(&mut c, words(&["GET", "k"])).await.resolve());
        let second = tokio::spawn(handle(&mut c, words(&["GET", "k"])).await.resolve());
        let a = submitted(&mut rx).await;
        let b = submitted(&mut rx).await;
        assert_eq!(a.client, ClientId(42));
        assert!(b.request > a.request, "sequence numbers increase");
        first.abort();
        second.abort();
    }
}
