//! What the families' tests share: a connection on a node of two keyspaces without
//! users, whose requests land in a channel the test reads.

use super::conn::{Body, Conn, Pending, Resolved};
use crate::acl::Users;
use crate::driver::{Event, KeyspaceHandle, Keyspaces, Submit};
use crate::login::Login;
use keel_types::{KeyspaceId, Limits};
use keel_wire::resp::Frame;
use std::sync::Arc;
use tokio::sync::mpsc;

/// A connection in keyspace 0 of a node hosting keyspaces 0 and 2, the requests sent to
/// keyspace 0, and the count of its resolved replies.
pub(crate) fn conn() -> (Conn, mpsc::Receiver<Event>, Arc<Resolved>) {
    let (events, rx) = mpsc::channel(8);
    let handle = |id: u32, events| KeyspaceHandle {
        id: KeyspaceId(id),
        name: format!("ks{id}"),
        kind: keel_core::engine::EngineKind::Orca,
        events,
        view: None,
        metrics: Arc::new(crate::metrics::KeyspaceMetrics::default()),
        node_id: keel_types::NodeId(1),
        unsafe_stale_invoke: false,
        unsafe_script_skip_watch: false,
        asking: None,
        guard: None,
    };
    let (other, _) = mpsc::channel(8);
    let keyspaces = Keyspaces::new(
        vec![handle(0, events), handle(2, other)],
        Arc::new(crate::metrics::Metrics::default()),
        keel_types::NodeId(1),
    );
    let resolved = Arc::new(Resolved::default());
    let metrics = Arc::new(crate::metrics::Metrics::default());
    let login = Arc::new(Login::new(Arc::new(Users::default()), metrics));
    (Conn::new(42, Arc::new(keyspaces), Limits::default(), resolved.clone(), login), rx, resolved)
}

/// A request of `ws`.
pub(crate) fn words(ws: &[&str]) -> Frame {
    Frame::Array(ws.iter().map(|w| Frame::bulk(w.as_bytes())).collect())
}

/// A reply known at once: an error's text, another frame's debug form; `later` for one
/// still to come.
pub(crate) fn ready_text(pending: Pending) -> String {
    match pending.body {
        Body::Ready(Frame::Error(text)) => String::from_utf8(text).unwrap(),
        Body::Ready(other) => format!("{other:?}"),
        Body::Later(_) | Body::Engine(..) | Body::Views(_) => "later".into(),
    }
}

/// The next request sent to the engine.
pub(crate) async fn submitted(rx: &mut mpsc::Receiver<Event>) -> Submit {
    match rx.recv().await.expect("a request was submitted") {
        Event::Client { submit, .. } => submit,
        other => panic!("not a client request: {other:?}"),
    }
}
