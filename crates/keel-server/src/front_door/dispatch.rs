//! From one decoded request to its reply ([`handle`]): the request's words, `AUTH` and
//! the rule that nothing else runs before it on a node with users, the engine's terms
//! for the request, the transaction being queued, then the command's family
//! (`commands`). A data command is parsed by `keel_wire::command`, checked, ordered
//! among the connection's requests and handed to its family with its [`Turn`].

use super::commands::acl::{self, permitted, NOAUTH};
use super::commands::{
    cluster, collections, correctables, databases, dump, geo, keys, plain_submit, pubsub, queues,
    scripting, server, sessions, strings, transactions,
};
use super::conn::{Conn, Kind, Pending};
use crate::acl::category;
use crate::driver::Submit;
use crate::engines::{terms as engine_terms, Asked, Terms};
use bytes::Bytes;
use keel_core::engine::OpMode;
use keel_types::{ClientId, Command, KeyspaceId, LogIndex, RequestId};
use keel_wire::command::ReplyMode;
use keel_wire::resp::Frame;
use keel_wire::ClientCommand;

/// Turns one decoded request into its reply; a request for an engine is sent to it before
/// this returns (after the earlier requests it must follow are answered). Under `CLIENT
/// REPLY OFF` (or after `SKIP`, once) the reply is resolved and not written.
pub async fn handle(conn: &mut Conn, frame: Frame) -> Pending {
    let before = conn.reply;
    let reply = handle_request(conn, frame).await;
    if reply.silent {
        return reply;
    }
    if conn.reply != before {
        // `CLIENT REPLY` itself: its `OK` is written for `ON` only.
        return match conn.reply {
            ReplyMode::On => reply,
            ReplyMode::Off | ReplyMode::Skip => reply.silenced(),
        };
    }
    match before {
        ReplyMode::On => reply,
        ReplyMode::Off => reply.silenced(),
        ReplyMode::Skip => {
            conn.reply = ReplyMode::On;
            reply.silenced()
        }
    }
}

async fn handle_request(conn: &mut Conn, frame: Frame) -> Pending {
    if let Some(entry) = conn.entry() {
        entry.touch();
    }
    let words = match request_words(frame) {
        Ok(words) => words,
        Err(text) => return Pending::ready(Frame::error(&text), conn.protocol),
    };
    let first = words.first().map_or(&[][..], |w| &w[..]);
    if first.eq_ignore_ascii_case(b"auth") {
        return acl::auth(conn, &words).await;
    }
    let words = match acl::hello_auth(conn, words).await {
        Ok(words) => words,
        Err(refusal) => return refusal,
    };
    let first = words.first().map_or(&[][..], |w| &w[..]);
    let before_auth = [&b"hello"[..], b"quit"].iter().any(|w| first.eq_ignore_ascii_case(w));
    if conn.users.required() && conn.user.is_none() && !before_auth {
        return Pending::ready(Frame::error(NOAUTH), conn.protocol);
    }
    if let Some(reply) = pubsub::subscribed_context(conn, &words) {
        return reply;
    }
    if let Some(reply) = scripting::busy_refusal(conn, &words) {
        return reply;
    }
    if let Some(reply) = cluster::route(conn, &words) {
        return reply;
    }
    if let Err(text) = engine_terms(conn.node.kind, conn.node.id, Asked::Word(first)) {
        return Pending::ready(Frame::error(&text), conn.protocol);
    }
    match transactions::transaction(conn, words).await {
        Ok(reply) => reply,
        Err(words) => route(conn, words).await,
    }
}

/// A request outside a transaction's concern, to its family: the server-side commands by
/// their first word, the rest parsed and dispatched.
async fn route(conn: &mut Conn, words: Vec<Bytes>) -> Pending {
    let words = match geo::route(conn, words).await {
        Ok(reply) => return reply,
        Err(words) => words,
    };
    let words = match dump::route(conn, words).await {
        Ok(reply) => return reply,
        Err(words) => words,
    };
    let words = match scripting::route(conn, words).await {
        Ok(reply) => return reply,
        Err(words) => words,
    };
    let first = words.first().map_or(&[][..], |w| &w[..]);
    match first {
        w if w.eq_ignore_ascii_case(b"acl") => acl::acl(conn, &words),
        w if w.eq_ignore_ascii_case(b"keel.req") => sessions::keel_req(conn, words).await,
        w if w.eq_ignore_ascii_case(b"keel.session") => sessions::keel_session(conn, &words).await,
        w if w.eq_ignore_ascii_case(b"keel.invoke") => correctables::keel_invoke(conn, words).await,
        w if w.eq_ignore_ascii_case(b"keel.log") => server::keel_log(conn, &words),
        _ => match keel_wire::command::parse(words, &conn.limits) {
            Ok(command) => {
                let pair = conn.next_pair();
                dispatch(conn, command, pair, false).await
            }
            Err(e) => Pending::ready(e.reply_frame(), conn.protocol),
        },
    }
}

fn request_words(frame: Frame) -> Result<Vec<Bytes>, String> {
    let Frame::Array(items) = frame else {
        return Err("ERR Protocol error: expected an array of bulk strings".into());
    };
    // Pushed into a new vector, not collected in place: in place, the frames' buffer
    // was shrunk to the words' size, a reallocation per request.
    let mut words = Vec::with_capacity(items.len());
    for item in items {
        match item {
            Frame::Bulk(bytes) => words.push(bytes),
            _ => return Err("ERR Protocol error: expected an array of bulk strings".into()),
        }
    }
    Ok(words)
}

/// What a data command is sent with, fixed once its turn among the connection's requests
/// has come.
pub(crate) struct Turn {
    /// Its deduplication pair.
    pub(crate) pair: (ClientId, RequestId),
    /// Whether the client chose the pair (`KEEL.REQ`).
    pub(crate) named: bool,
    /// The command's barrier or strength (Kite), or none.
    pub(crate) mode: OpMode,
    /// Whether a read may be answered off the engine loop (`Conn::loop_idle`).
    pub(crate) loop_idle: bool,
    /// The connection's last request through a loop before this one: restored when this
    /// one is answered off the loop after all.
    pub(crate) looped_before: Option<u64>,
    /// The connection's session floor: every write before the command is answered.
    pub(crate) after: LogIndex,
}

impl Turn {
    /// The request for `command` under the turn's pair, with no durability or level of
    /// its own.
    pub(crate) fn submit(&self, command: Command) -> Submit {
        let (client, request) = self.pair;
        let plain = plain_submit(client, request, command, None, self.after);
        Submit { mode: self.mode, named: self.named, ..plain }
    }

    /// One `(client, request, key)` per key: the first key takes the turn's pair, the
    /// rest fresh sequence numbers of the connection.
    pub(crate) fn per_key(
        &self,
        conn: &mut Conn,
        keys: Vec<Bytes>,
    ) -> Vec<(ClientId, RequestId, Bytes)> {
        let mut out = Vec::with_capacity(keys.len());
        for (i, key) in keys.into_iter().enumerate() {
            let (client, request) = if i == 0 { self.pair } else { conn.next_pair() };
            out.push((client, request, key));
        }
        out
    }
}

/// Runs a parsed command with the deduplication pair `pair` (`named`: chosen by the
/// client, `KEEL.REQ`): a data command is sent to the engine now, its reply's future
/// returned; the others are answered by the server family.
pub(crate) async fn dispatch(
    conn: &mut Conn,
    command: ClientCommand,
    pair: (ClientId, RequestId),
    named: bool,
) -> Pending {
    let protocol = conn.protocol;
    let command = match databases::in_database(command, conn) {
        Ok(command) => command,
        Err(refusal) => return Pending::ready(refusal, protocol),
    };
    if let Err(refusal) = permitted(conn, category(&command)) {
        return Pending::ready(refusal, protocol);
    }
    let ks = conn.node.id;
    let terms = match engine_terms(conn.node.kind, ks, Asked::Command(&command)) {
        Ok(terms) => terms,
        Err(refusal) => return Pending::ready(Frame::error(&refusal), protocol),
    };
    let command = match command {
        ClientCommand::PubSub(command) => return pubsub::run(conn, command).await,
        command => command,
    };
    let Some(kind) = order_kind(&command, ks, terms, conn.queued) else {
        return server::admin(conn, command);
    };
    let mode = command.mode();
    conn.order(kind).await;
    let turn = Turn {
        pair,
        named,
        mode,
        loop_idle: conn.loop_idle(),
        looped_before: conn.last_looped.replace(conn.queued),
        // After `order`: every write before this request on the connection is answered.
        after: conn.resolved.floor(ks),
    };
    match command {
        ClientCommand::Get { .. }
        | ClientCommand::MGet { .. }
        | ClientCommand::Set { .. }
        | ClientCommand::MSet { .. }
        | ClientCommand::Modify { .. }
        | ClientCommand::Transfer { .. }
        | ClientCommand::ReadString { .. }
        | ClientCommand::Lcs { .. }
        | ClientCommand::Incr { .. }
        | ClientCommand::Cas { .. } => strings::send(conn, command, turn),
        ClientCommand::Del { .. }
        | ClientCommand::Exists { .. }
        | ClientCommand::Scan { .. }
        | ClientCommand::Expire { .. }
        | ClientCommand::Ttl { .. } => keys::send(conn, command, turn),
        ClientCommand::Flush { .. }
        | ClientCommand::SwapDb { .. }
        | ClientCommand::Node { .. }
        | ClientCommand::Slots { .. }
        | ClientCommand::DbSize
        | ClientCommand::Keys { .. }
        | ClientCommand::RandomKey
        | ClientCommand::ScanKeys { .. } => databases::send(conn, command, turn),
        ClientCommand::Enqueue { .. }
        | ClientCommand::Dequeue { .. }
        | ClientCommand::QueuePeek { .. } => queues::send(conn, command, turn),
        ClientCommand::Coll { .. }
        | ClientCommand::CollRead { .. }
        | ClientCommand::Block { .. } => collections::send(conn, command, turn),
        other => unreachable!("{} has no order kind", other.name()),
    }
}

/// How a data command is ordered among its connection's requests (`None`: not a data
/// command, answered by the server family).
fn order_kind(
    command: &ClientCommand,
    ks: KeyspaceId,
    terms: Terms,
    position: u64,
) -> Option<Kind> {
    let kind = match command {
        // The engine orders the request itself: it is sent at once.
        ClientCommand::Get { .. }
        | ClientCommand::Set { .. }
        | ClientCommand::Incr { .. }
        | ClientCommand::Cas { .. }
        | ClientCommand::Exists { .. }
        | ClientCommand::MGet { .. }
            if terms == Terms::Engine =>
        {
            Kind::Write(ks)
        }
        ClientCommand::Get { level, .. }
        | ClientCommand::ReadString { level, .. }
        | ClientCommand::Scan { level, .. }
        | ClientCommand::MGet { level, .. }
        | ClientCommand::Ttl { level, .. }
        | ClientCommand::QueuePeek { level, .. }
        | ClientCommand::CollRead { level, .. } => Kind::Read(ks, *level),
        ClientCommand::DbSize
        | ClientCommand::Keys { .. }
        | ClientCommand::ScanKeys { .. }
        | ClientCommand::RandomKey => Kind::Read(ks, None),
        ClientCommand::Exists { .. } => Kind::Read(ks, None),
        ClientCommand::Set { .. }
        | ClientCommand::Incr { .. }
        | ClientCommand::Cas { .. }
        | ClientCommand::Del { .. }
        | ClientCommand::Expire { .. }
        | ClientCommand::MSet { .. }
        | ClientCommand::Modify { .. }
        | ClientCommand::Transfer { .. }
        | ClientCommand::Lcs { .. }
        | ClientCommand::Flush { .. }
        | ClientCommand::SwapDb { .. }
        | ClientCommand::Node { .. }
        | ClientCommand::Slots { .. }
        | ClientCommand::Enqueue { .. }
        | ClientCommand::Dequeue { .. }
        | ClientCommand::Coll { .. } => Kind::Write(ks),
        ClientCommand::Block { .. } => Kind::Alone(ks, position),
        _ => return None,
    };
    Some(kind)
}

#[cfg(test)]
mod tests {
    use super::handle;
    use crate::front_door::tests::{conn, submitted, words};
    use std::future::Future;
    use std::pin::Pin;

    /// Polls `future` once (after letting other tasks run): `Some` if it finished.
    async fn futures_poll<F: Future + Unpin>(future: &mut F) -> Option<F::Output> {
        tokio::task::yield_now().await;
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        match Pin::new(future).poll(&mut cx) {
            std::task::Poll::Ready(out) => Some(out),
            std::task::Poll::Pending => None,
        }
    }

    #[tokio::test]
    async fn a_pipeline_reaches_the_engine_whole_and_a_read_after_writes_waits_for_them() {
        let (mut c, mut rx, resolved) = conn();
        for key in ["a", "b"] {
            let pending = handle(&mut c, words(&["SET", key, "v"])).await;
            c.queued_one();
            drop(pending);
        }
        let (a, b) = (submitted(&mut rx).await, submitted(&mut rx).await);
        assert!(a.command.is_write() && b.command.is_write(), "both writes sent unanswered");
        let mut get = Box::pin(handle(&mut c, words(&["GET", "a"])));
        let early = futures_poll(&mut get).await;
        assert!(early.is_none(), "a read after unanswered writes waits");
        assert!(rx.try_recv().is_err(), "and is not sent");
        resolved.one_more();
        assert!(futures_poll(&mut get).await.is_none(), "the second write is not answered yet");
        resolved.one_more();
        let _pending = get.await;
        assert!(
            !submitted(&mut rx).await.command.is_write(),
            "the read is sent once both are answered"
        );
    }
}
