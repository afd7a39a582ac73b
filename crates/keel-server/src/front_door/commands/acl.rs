//! `AUTH`, `HELLO ... AUTH` and `ACL WHOAMI`; the permission check every command family
//! runs before it sends anything ([`permitted`]).

use crate::acl::Category;
use crate::front_door::conn::{Conn, Pending};
use crate::login::{Failure, CONNECTION_FAILURES_MAX};
use bytes::Bytes;
use keel_wire::resp::Frame;
use keel_wire::ClientCommand;

/// The reply to an attempt to authenticate on a node without users.
pub(crate) const NO_AUTHENTICATION: &str = "ERR AUTH called without any password configured for the default user. Are you sure your configuration is correct?";
/// The reply to a command before authentication, on a node with users.
pub(crate) const NOAUTH: &str = "NOAUTH Authentication required.";
/// The reply to a failed authentication.
const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";

/// `AUTH [user] password`. Waits for the check (on the hashing thread, after the
/// throttle's delay) before the connection reads its next request.
pub(crate) async fn auth(conn: &mut Conn, words: &[Bytes]) -> Pending {
    let protocol = conn.protocol;
    let (name, password) = match words {
        [_, password] => (crate::acl::DEFAULT_USER.as_bytes(), password),
        [_, name, password] => (&name[..], password),
        _ => {
            let text = "ERR wrong number of arguments for 'auth' command";
            return Pending::ready(Frame::error(text), protocol);
        }
    };
    if !conn.users.required() {
        return Pending::ready(Frame::error(NO_AUTHENTICATION), protocol);
    }
    match login(conn, name, password).await {
        Ok(()) => Pending::ready(Frame::ok(), protocol),
        Err(refusal) => refusal,
    }
}

/// Authenticates the connection as `name`, or the refusal to queue: `WRONGPASS` (the
/// same for an unknown name), or an error saying to retry later when the attempt was
/// refused unchecked; closing the connection at its [`CONNECTION_FAILURES_MAX`]th failure.
async fn login(conn: &mut Conn, name: &[u8], password: &[u8]) -> Result<(), Pending> {
    let failure = match conn.login.authenticate(conn.from, name, password).await {
        Ok(user) => {
            if let Some(entry) = conn.entry() {
                entry.set_user(&user.name);
            }
            conn.user = Some(user);
            return Ok(());
        }
        Err(failure) => failure,
    };
    conn.auth_failures += 1;
    let text = match failure {
        Failure::WrongPassword | Failure::UnknownUser => WRONGPASS,
        Failure::Throttled => "ERR too many failed authentications from this address; retry later",
        Failure::Busy => "BUSY too many authentications in progress; retry later",
    };
    let refusal = Pending::ready(Frame::error(text), conn.protocol);
    if conn.auth_failures >= CONNECTION_FAILURES_MAX {
        return Err(refusal.closing());
    }
    Err(refusal)
}

/// `HELLO ... AUTH <user> <password> ...` on a node with users: authenticates first (as
/// `AUTH`), then leaves the words to `HELLO` with its `AUTH` option answered. Other
/// requests pass through.
pub(crate) async fn hello_auth(conn: &mut Conn, words: Vec<Bytes>) -> Result<Vec<Bytes>, Pending> {
    let first = words.first().map_or(&[][..], |w| &w[..]);
    if !first.eq_ignore_ascii_case(b"hello") || !conn.users.required() {
        return Ok(words);
    }
    let parsed = keel_wire::command::parse(words.clone(), &conn.limits);
    let Ok(ClientCommand::Hello { protocol, auth: Some((name, password)), client_name }) = parsed
    else {
        return Ok(words); // without AUTH, or malformed: HELLO's own parse answers it
    };
    login(conn, &name, &password).await?;
    // The same HELLO without its AUTH option, now answered.
    let version = protocol.map_or(2, |p| p.version());
    let mut words = vec![Bytes::from_static(b"HELLO"), Bytes::from(version.to_string())];
    if let Some(client_name) = client_name {
        words.extend([Bytes::from_static(b"SETNAME"), client_name]);
    }
    Ok(words)
}

/// `ACL WHOAMI` (the only `ACL` subcommand Keel answers; users live in the configuration).
pub(crate) fn acl(conn: &Conn, words: &[Bytes]) -> Pending {
    let protocol = conn.protocol;
    match words {
        [_, sub] if sub.eq_ignore_ascii_case(b"whoami") => {
            let name = conn.user.as_ref().map_or(crate::acl::DEFAULT_USER, |u| u.name.as_str());
            Pending::ready(Frame::bulk(name), protocol)
        }
        _ => Pending::ready(
            Frame::error("ERR unknown ACL subcommand: Keel answers ACL WHOAMI; users are configured in [[users]]"),
            protocol,
        ),
    }
}

/// Whether the connection may run a command of `category` in its keyspace; the refusal.
pub(crate) fn permitted(conn: &Conn, category: Option<Category>) -> Result<(), Frame> {
    let (Some(user), Some(category)) = (&conn.user, category) else { return Ok(()) };
    if user.may(category, conn.keyspace()) {
        return Ok(());
    }
    let what = match category {
        Category::Read => "read",
        Category::Write => "write",
        Category::Admin => "admin",
    };
    Err(Frame::error(&format!(
        "NOPERM User {} has no permissions to run {what} commands in keyspace {}",
        user.name,
        conn.keyspace().0
    )))
}

#[cfg(test)]
mod tests {
    use crate::front_door::conn::Body;
    use crate::front_door::handle;
    use crate::front_door::tests::{conn, ready_text, words};
    use keel_wire::resp::{Frame, Protocol};

    #[tokio::test]
    async fn authentication_is_not_pretended() {
        let (mut c, _rx, _resolved) = conn();
        for ws in [
            &["AUTH", "secret"][..],
            &["AUTH", "user", "secret"],
            &["HELLO", "3", "AUTH", "u", "p"],
        ] {
            let text = ready_text(handle(&mut c, words(ws)).await);
            assert!(text.starts_with("ERR AUTH called without any password"), "{ws:?}: {text}");
        }
        assert_eq!(c.protocol, Protocol::Resp2, "a refused HELLO changes nothing");
        let hello = handle(&mut c, words(&["HELLO", "3"])).await;
        assert!(matches!(hello.body, Body::Ready(Frame::Map(_))), "HELLO without AUTH works");
    }
}
