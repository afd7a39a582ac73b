//! `SUBSCRIBE`, `PSUBSCRIBE`, `SSUBSCRIBE`, their `UN` forms, `PUBLISH`, `SPUBLISH` and
//! `PUBSUB`: a connection's side of the node's pub/sub (`crate::pubsub`).
//!
//! Confirmations are pushed, not replied: a subscription's confirmation and the messages
//! after it go through the connection's outbox in the order the broker's lock gives them,
//! so no message overtakes the confirmation of its channel. The command first waits for
//! every earlier reply of the connection to be resolved, so that its confirmations come
//! after them; its own reply is resolved and not written. In RESP2 a subscribed
//! connection runs only the (un)subscribe commands, `PING` (answered `[pong, message]`),
//! `QUIT` and `RESET`, as Redis's does; in RESP3 it runs anything.

use crate::front_door::conn::{Conn, Pending};
use crate::pubsub::Listener;
use bytes::Bytes;
use keel_wire::command::{PubSubCommand, Space};
use keel_wire::resp::{Frame, Protocol};
use std::collections::BTreeSet;
use std::sync::Arc;

/// Most bytes of names one connection may be subscribed to.
pub(crate) const SUBSCRIPTION_BYTES_MAX: usize = 8 << 20;

/// What one connection is subscribed to.
#[derive(Debug, Default)]
pub(crate) struct Subscriptions {
    names: [BTreeSet<Bytes>; 3],
    bytes: usize,
    listener: Option<Arc<Listener>>,
}

impl Subscriptions {
    /// Whether anything is subscribed to.
    pub(crate) fn any(&self) -> bool {
        self.names.iter().any(|names| !names.is_empty())
    }

    /// The count a confirmation in `space` carries: shard channels alone, or channels and
    /// patterns together (as Redis 7.0 counts them).
    fn count(&self, space: Space) -> i64 {
        let n = match space {
            Space::Shard => self.names[Space::Shard.at()].len(),
            _ => self.names[Space::Channel.at()].len() + self.names[Space::Pattern.at()].len(),
        };
        i64::try_from(n).unwrap_or(i64::MAX)
    }
}

/// Runs a pub/sub command.
pub(crate) async fn run(conn: &mut Conn, command: PubSubCommand) -> Pending {
    let protocol = conn.protocol;
    let broker = conn.keyspaces.broker.clone();
    let frame = match command {
        PubSubCommand::Subscribe { space, names } => return subscribe(conn, space, names).await,
        PubSubCommand::Unsubscribe { space, names } => {
            return unsubscribe(conn, space, names).await
        }
        PubSubCommand::Publish { shard, channel, message } => {
            let received = broker.publish(shard, channel, message);
            Frame::Integer(i64::try_from(received).unwrap_or(i64::MAX))
        }
        PubSubCommand::Channels { shard, pattern } => {
            let space = if shard { Space::Shard } else { Space::Channel };
            let names = broker.lock().names(space, pattern.as_deref());
            Frame::Array(names.into_iter().map(Frame::Bulk).collect())
        }
        PubSubCommand::NumSub { shard, channels } => {
            let space = if shard { Space::Shard } else { Space::Channel };
            let registry = broker.lock();
            let mut items = Vec::with_capacity(2 * channels.len());
            for channel in channels {
                let count = registry.count(space, &channel);
                items.push(Frame::Bulk(channel));
                items.push(Frame::Integer(i64::try_from(count).unwrap_or(i64::MAX)));
            }
            Frame::Array(items)
        }
        PubSubCommand::NumPat => {
            let patterns = broker.lock().distinct(Space::Pattern);
            Frame::Integer(i64::try_from(patterns).unwrap_or(i64::MAX))
        }
        PubSubCommand::Help => {
            Frame::Array(HELP.iter().map(|line| Frame::Simple(line.as_bytes().to_vec())).collect())
        }
    };
    Pending::ready(frame, protocol)
}

const HELP: &[&str] = &[
    "PUBSUB <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "CHANNELS [<pattern>]",
    "    Return the currently active channels matching a <pattern> (default: '*').",
    "NUMPAT",
    "    Return number of subscriptions to patterns.",
    "NUMSUB [<channel> ...]",
    "    Return the number of subscribers for the specified channels, excluding",
    "    pattern subscriptions(default: no channels).",
    "SHARDCHANNELS [<pattern>]",
    "    Return the currently active shard level channels matching a <pattern> (default: '*').",
    "SHARDNUMSUB [<shardchannel> ...]",
    "    Return the number of subscribers for the specified shard level channel(s)",
    "HELP",
    "    Prints this help.",
];

/// Waits until every earlier reply of the connection is resolved: pushed frames queued
/// after this come after them.
async fn after_earlier_replies(conn: &Conn) {
    if conn.queued > 0 {
        conn.resolved.wait_past(conn.queued - 1).await;
    }
}

fn confirmation(word: &str, name: Option<Bytes>, count: i64) -> Frame {
    let name = name.map_or(Frame::Null, Frame::Bulk);
    Frame::Push(vec![Frame::bulk(word), name, Frame::Integer(count)])
}

async fn subscribe(conn: &mut Conn, space: Space, names: Vec<Bytes>) -> Pending {
    after_earlier_replies(conn).await;
    let listener = conn
        .subs
        .listener
        .get_or_insert_with(|| {
            let id = conn.client.0;
            Arc::new(Listener { id, outbox: conn.outbox.clone(), user: conn.user.clone() })
        })
        .clone();
    let broker = conn.keyspaces.broker.clone();
    let mut registry = broker.lock();
    for name in names {
        let fits = conn.subs.bytes + name.len() <= SUBSCRIPTION_BYTES_MAX;
        if fits && conn.subs.names[space.at()].insert(name.clone()) {
            conn.subs.bytes += name.len();
            registry.add(space, &name, &listener);
        }
        // Past the bound the name is not added, and the count says so.
        conn.outbox.push(confirmation(space.subscribe_word(), Some(name), conn.subs.count(space)));
    }
    Pending::nothing(conn.protocol)
}

async fn unsubscribe(conn: &mut Conn, space: Space, names: Vec<Bytes>) -> Pending {
    after_earlier_replies(conn).await;
    let names = match names.is_empty() {
        true => conn.subs.names[space.at()].iter().cloned().collect(),
        false => names,
    };
    let word = space.unsubscribe_word();
    let broker = conn.keyspaces.broker.clone();
    let mut registry = broker.lock();
    if names.is_empty() {
        conn.outbox.push(confirmation(word, None, conn.subs.count(space)));
    }
    for name in names {
        if conn.subs.names[space.at()].remove(&name) {
            conn.subs.bytes -= name.len();
            registry.remove(space, &name, conn.client.0);
        }
        conn.outbox.push(confirmation(word, Some(name), conn.subs.count(space)));
    }
    Pending::nothing(conn.protocol)
}

/// Ends every subscription of a connection that is closing (or `RESET`).
pub(crate) fn forget(conn: &mut Conn) {
    if !conn.subs.any() {
        return;
    }
    let broker = conn.keyspaces.broker.clone();
    let mut registry = broker.lock();
    for space in Space::ALL {
        for name in std::mem::take(&mut conn.subs.names[space.at()]) {
            registry.remove(space, &name, conn.client.0);
        }
    }
    conn.subs.bytes = 0;
}

/// A subscribed RESP2 connection's refusal of a command other than those it may run, or
/// its `PING`'s answer; `None`: run the command as usual.
pub(crate) fn subscribed_context(conn: &Conn, words: &[Bytes]) -> Option<Pending> {
    if !conn.subscribed() || conn.protocol != Protocol::Resp2 {
        return None;
    }
    let first = words.first().map_or(&[][..], |w| &w[..]);
    let is = |name: &str| first.eq_ignore_ascii_case(name.as_bytes());
    if is("ping") && words.len() <= 2 {
        let message = words.get(1).cloned().unwrap_or_default();
        let frame = Frame::Array(vec![Frame::bulk("pong"), Frame::Bulk(message)]);
        return Some(Pending::ready(frame, conn.protocol));
    }
    let allowed = [
        "subscribe",
        "psubscribe",
        "ssubscribe",
        "unsubscribe",
        "punsubscribe",
        "sunsubscribe",
        "ping",
        "quit",
        "reset",
    ];
    if allowed.iter().any(|name| is(name)) {
        return None;
    }
    let shown: String =
        String::from_utf8_lossy(first).chars().take(128).collect::<String>().to_lowercase();
    let text = format!(
        "ERR Can't execute '{shown}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context"
    );
    Some(Pending::ready(Frame::error(&text), conn.protocol))
}

#[cfg(test)]
mod tests {
    use crate::front_door::dispatch::handle;
    use crate::front_door::tests::{conn, words};
    use crate::pubsub::{Outbox, Pushed};
    use keel_wire::resp::Frame;

    fn pushed(pushes: &mut crate::pubsub::Pushes) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(Pushed::Frame(frame, ..)) = pushes.rx.try_recv() {
            let Frame::Push(items) = frame else { panic!("{frame:?}") };
            let text: Vec<String> = items
                .iter()
                .map(|item| match item {
                    Frame::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
                    Frame::Integer(n) => n.to_string(),
                    other => format!("{other:?}"),
                })
                .collect();
            out.push(text.join(" "));
        }
        out
    }

    #[tokio::test]
    async fn subscriptions_confirm_by_push_and_a_subscribed_resp2_connection_is_restricted() {
        let (mut c, _rx, _resolved) = conn();
        let (outbox, mut pushes) = Outbox::new();
        c.outbox = outbox;
        let reply = handle(&mut c, words(&["SUBSCRIBE", "a", "b", "a"])).await;
        assert!(reply.silent, "confirmed by push, not by the reply");
        assert_eq!(pushed(&mut pushes), ["subscribe a 1", "subscribe b 2", "subscribe a 2"]);
        handle(&mut c, words(&["PSUBSCRIBE", "a*"])).await;
        assert_eq!(pushed(&mut pushes), ["psubscribe a* 3"]);
        let refused = handle(&mut c, words(&["GET", "k"])).await.resolve().await;
        let Frame::Error(text) = refused else { panic!("{refused:?}") };
        assert!(String::from_utf8_lossy(&text).starts_with("ERR Can't execute 'get'"));
        let ping = handle(&mut c, words(&["PING"])).await.resolve().await;
        assert_eq!(ping, Frame::Array(vec![Frame::bulk("pong"), Frame::bulk("")]));
        let published = handle(&mut c, words(&["UNSUBSCRIBE"])).await;
        assert!(published.silent);
        assert_eq!(pushed(&mut pushes), ["unsubscribe a 2", "unsubscribe b 1"]);
        handle(&mut c, words(&["PUNSUBSCRIBE"])).await;
        assert_eq!(pushed(&mut pushes), ["punsubscribe a* 0"]);
        handle(&mut c, words(&["PUNSUBSCRIBE"])).await;
        assert_eq!(pushed(&mut pushes), ["punsubscribe Null 0"], "nothing to leave: one reply");
        assert!(!c.subscribed());
    }

    #[tokio::test]
    async fn client_reply_off_and_skip_silence_replies_but_not_pushes() {
        let (mut c, _rx, _resolved) = conn();
        let (outbox, mut pushes) = Outbox::new();
        c.outbox = outbox;
        assert!(handle(&mut c, words(&["CLIENT", "REPLY", "SKIP"])).await.silent);
        assert!(handle(&mut c, words(&["PING"])).await.silent, "skipped");
        assert!(!handle(&mut c, words(&["PING"])).await.silent, "one only");
        assert!(handle(&mut c, words(&["CLIENT", "REPLY", "OFF"])).await.silent);
        assert!(handle(&mut c, words(&["PING"])).await.silent);
        handle(&mut c, words(&["SUBSCRIBE", "x"])).await;
        assert_eq!(pushed(&mut pushes), ["subscribe x 1"], "pushes are written all the same");
        let refused = handle(&mut c, words(&["CLIENT", "REPLY", "ON"])).await;
        assert!(refused.silent, "refused in a subscribed RESP2 context, and silent");
        handle(&mut c, words(&["UNSUBSCRIBE"])).await;
        assert!(!handle(&mut c, words(&["CLIENT", "REPLY", "ON"])).await.silent);
    }
}
