//! The HTTP endpoint, on hyper: `GET /metrics` (OpenMetrics text, which Prometheus reads;
//! every keyspace's metrics labelled with its id) and `GET /status` (JSON: the node and
//! each keyspace);
//! 404 for other paths, 405 for other methods.
//!
//! Bounds, for a port that may face a network: at most [`CONNECTIONS_MAX`] connections at
//! once (more wait in the kernel's backlog), a request's head at most
//! [`REQUEST_BYTES_MAX`] and within [`HEADER_TIMEOUT`] (a slow client is cut off), a
//! connection at most [`CONNECTION_TIMEOUT`] in all; keep-alive is allowed within it.
//! [`Access`] guards it for a port that faces a network: a bearer token every request must
//! carry (`http_token_file`, else 401) and TLS around the stream (`http_tls`); a node
//! refuses to start with a non-loopback `http_addr` without both.

use crate::driver::{KeyspaceHandle, Keyspaces};
use crate::metrics::KeyspaceView;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use keel_core::engine::Report;
use ring::hmac;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

/// Most bytes of one request's head (request line and headers) hyper buffers.
pub const REQUEST_BYTES_MAX: usize = 8 * 1024;
/// How long a request's head may take to arrive.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one connection may stay open, whatever it does.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);
/// Most connections served at once.
pub const CONNECTIONS_MAX: usize = 64;
/// How long a page may wait for the engines' reports.
const REPORT_WAIT: Duration = Duration::from_millis(2500);

/// One keyspace's status document, as `KEEL.STATUS` returns it and `/status` lists it:
/// the engine's report with the keyspace's id, name and engine kind and the server's
/// version.
pub fn keyspace_status(handle: &KeyspaceHandle, report: &Report) -> serde_json::Value {
    let mut doc = report.status.clone();
    let object = doc.as_object_mut().expect("an engine's status is an object");
    object.insert("keyspace".into(), handle.id.0.into());
    object.insert("keyspace_name".into(), handle.name.clone().into());
    object.insert("engine".into(), handle.kind.name().into());
    object.insert("node_id".into(), handle.node_id.0.into());
    object.insert("version".into(), env!("CARGO_PKG_VERSION").into());
    doc
}

/// Every keyspace's report, by id (waits for each loop at most `wait`).
async fn reports(
    keyspaces: &Keyspaces,
    wait: Duration,
) -> Result<Vec<(KeyspaceHandle, Report)>, keel_types::KeelError> {
    let mut all = Vec::new();
    for handle in keyspaces.iter() {
        let report = handle.report(wait).await?;
        all.push((handle.clone(), report));
    }
    Ok(all)
}

/// The `/status` document: the node, and each keyspace's status.
pub fn node_status(keyspaces: &Keyspaces, reports: &[(KeyspaceHandle, Report)]) -> String {
    let docs: Vec<serde_json::Value> = reports.iter().map(|(h, r)| keyspace_status(h, r)).collect();
    // The peer protocol of this node and of each member's latest inbound link.
    let protocols: serde_json::Map<String, serde_json::Value> = keyspaces
        .node_metrics
        .peer_protocols()
        .into_iter()
        .map(|(node, protocol)| (node.0.to_string(), protocol.into()))
        .collect();
    let mut doc = serde_json::json!({
        "node_id": keyspaces.node_id.0,
        "version": env!("CARGO_PKG_VERSION"),
        "peer_protocols": protocols,
        "keyspaces": docs,
    });
    if let Some(placement) = keyspaces.placement() {
        doc["placement"] = placement_status(placement);
        if let Some(heard) = &keyspaces.heard {
            let now = std::time::Instant::now();
            let disagreeing: Vec<u32> = heard.disagreeing(now).iter().map(|n| n.0).collect();
            doc["placement"]["disagreeing"] = disagreeing.into();
        }
    }
    doc.to_string()
}

/// Every keyspace of a placed or sharded cluster, as this node's configuration places
/// it: its replicas, preferred leader and slots.
fn placement_status(placement: &crate::placement::Placement) -> serde_json::Value {
    let groups: Vec<serde_json::Value> = placement
        .groups
        .iter()
        .map(|(id, group)| {
            serde_json::json!({
                "keyspace": id.0,
                "name": group.name,
                "replicas": group.replicas.iter().map(|n| n.0).collect::<Vec<_>>(),
                "preferred_leader": group.preferred_leader.map(|n| n.0),
                "slots": group.slots.as_ref().map(|s| s.to_string()),
            })
        })
        .collect();
    serde_json::json!({
        "sharded": placement.sharded(),
        "digest": placement.digest(),
        "keyspaces": groups,
    })
}

/// The endpoint's bounds.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// Most connections at once.
    pub connections_max: usize,
    /// How long a request's head may take to arrive.
    pub header_timeout: Duration,
    /// How long one connection may stay open.
    pub connection_timeout: Duration,
}

impl Default for Bounds {
    fn default() -> Bounds {
        Bounds {
            connections_max: CONNECTIONS_MAX,
            header_timeout: HEADER_TIMEOUT,
            connection_timeout: CONNECTION_TIMEOUT,
        }
    }
}

/// Who may read the endpoint.
#[derive(Clone, Default)]
pub struct Access {
    /// The bearer token's key and tag: a request's token is checked in constant time by
    /// verifying the tag over it.
    token: Option<Arc<(hmac::Key, hmac::Tag)>>,
    /// TLS around every connection.
    tls: Option<TlsAcceptor>,
}

impl Access {
    /// Requests must carry `token` (if given) and connections speak TLS (if `tls`).
    pub fn new(token: Option<&[u8]>, tls: Option<TlsAcceptor>) -> Access {
        let token = token.map(|token| {
            let key = hmac::Key::generate(hmac::HMAC_SHA256, &ring::rand::SystemRandom::new())
                .expect("the system random generator works");
            let tag = hmac::sign(&key, token);
            Arc::new((key, tag))
        });
        Access { token, tls }
    }

    /// Whether `request` may be answered: no token configured, or it carries the token.
    fn admits<B>(&self, request: &Request<B>) -> bool {
        let Some(token) = &self.token else { return true };
        let given = request
            .headers()
            .get(hyper::header::AUTHORIZATION)
            .and_then(|value| value.as_bytes().strip_prefix(b"Bearer "));
        given.is_some_and(|given| hmac::verify(&token.0, given, token.1.as_ref()).is_ok())
    }
}

/// Serves HTTP requests until the listener fails for good, within the default bounds.
pub async fn serve(listener: TcpListener, keyspaces: Arc<Keyspaces>, access: Access) {
    serve_within(listener, keyspaces, Bounds::default(), access).await;
}

/// Serves HTTP requests within `bounds`, to whom `access` admits.
pub async fn serve_within(
    listener: TcpListener,
    keyspaces: Arc<Keyspaces>,
    bounds: Bounds,
    access: Access,
) {
    let slots = Arc::new(Semaphore::new(bounds.connections_max));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else { return };
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(crate::peer::BACKOFF_MIN).await;
            continue;
        };
        let (keyspaces, access) = (keyspaces.clone(), access.clone());
        tokio::spawn(async move {
            let within = bounds.connection_timeout;
            match access.tls.clone() {
                None => {
                    let connection = connection(TokioIo::new(stream), keyspaces, access, bounds);
                    let _ = tokio::time::timeout(within, connection).await;
                }
                Some(acceptor) => {
                    let handshake = acceptor.accept(stream);
                    if let Ok(Ok(stream)) =
                        tokio::time::timeout(bounds.header_timeout, handshake).await
                    {
                        let connection =
                            connection(TokioIo::new(stream), keyspaces, access, bounds);
                        let _ = tokio::time::timeout(within, connection).await;
                    }
                }
            }
            drop(permit);
        });
    }
}

/// Serves one connection's requests.
async fn connection<I>(io: I, keyspaces: Arc<Keyspaces>, access: Access, bounds: Bounds)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |request| {
        let (keyspaces, access) = (keyspaces.clone(), access.clone());
        async move { Ok::<_, std::convert::Infallible>(answer(request, &keyspaces, &access).await) }
    });
    let mut http1 = hyper::server::conn::http1::Builder::new();
    http1
        .timer(TokioTimer::new())
        .header_read_timeout(bounds.header_timeout)
        .max_buf_size(REQUEST_BYTES_MAX);
    let _ = http1.serve_connection(io, service).await;
}

/// The response to one request.
pub async fn answer(
    request: Request<Incoming>,
    keyspaces: &Keyspaces,
    access: &Access,
) -> Response<Full<Bytes>> {
    if !access.admits(&request) {
        let mut response =
            respond(StatusCode::UNAUTHORIZED, "text/plain", "a bearer token is required\n".into());
        let challenge = hyper::header::HeaderValue::from_static("Bearer");
        response.headers_mut().insert(hyper::header::WWW_AUTHENTICATE, challenge);
        return response;
    }
    let path = request.uri().path();
    if path != "/metrics" && path != "/status" {
        return respond(StatusCode::NOT_FOUND, "text/plain", "try /metrics or /status\n".into());
    }
    if request.method() != Method::GET {
        return respond(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "GET only\n".into());
    }
    let reports = match reports(keyspaces, REPORT_WAIT).await {
        Ok(reports) => reports,
        Err(e) => return respond(StatusCode::SERVICE_UNAVAILABLE, "text/plain", format!("{e}\n")),
    };
    if path == "/status" {
        let body = node_status(keyspaces, &reports) + "\n";
        return respond(StatusCode::OK, "application/json", body);
    }
    let views: Vec<KeyspaceView<'_>> = reports
        .iter()
        .map(|(handle, report)| KeyspaceView { id: handle.id, metrics: &handle.metrics, report })
        .collect();
    let mut body = String::new();
    crate::metrics::render(&mut body, &keyspaces.node_metrics, &views);
    respond(StatusCode::OK, crate::metrics::CONTENT_TYPE, body)
}

fn respond(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    let value = hyper::header::HeaderValue::from_static(content_type);
    response.headers_mut().insert(hyper::header::CONTENT_TYPE, value);
    if status == StatusCode::METHOD_NOT_ALLOWED {
        let allow = hyper::header::HeaderValue::from_static("GET");
        response.headers_mut().insert(hyper::header::ALLOW, allow);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::Event;
    use keel_core::engine::EngineKind;
    use keel_types::{KeyspaceId, NodeId};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    use tokio::sync::mpsc;

    /// An endpoint over one keyspace whose "engine" answers every report at once.
    async fn endpoint(bounds: Bounds) -> std::net::SocketAddr {
        endpoint_with(bounds, Access::default()).await
    }

    async fn endpoint_with(bounds: Bounds, access: Access) -> std::net::SocketAddr {
        let (events, mut rx) = mpsc::channel(8);
        tokio::spawn(async move {
            while let Some(event) = rx.recv().await {
                if let Event::Report(reply) = event {
                    let status = serde_json::json!({ "role": "leader" });
                    let _ = reply.send(Report { status, metrics: Vec::new() });
                }
            }
        });
        let handle = KeyspaceHandle {
            id: KeyspaceId(0),
            name: "default".into(),
            kind: EngineKind::Orca,
            events,
            view: None,
            metrics: Arc::new(crate::metrics::KeyspaceMetrics::default()),
            node_id: NodeId(1),
            unsafe_stale_invoke: false,
            unsafe_script_skip_watch: false,
            asking: None,
            guard: None,
        };
        let node_metrics = Arc::new(crate::metrics::Metrics::default());
        let keyspaces = Arc::new(Keyspaces::new(vec![handle], node_metrics, NodeId(1)));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve_within(listener, keyspaces, bounds, access));
        addr
    }

    /// Sends `request` and reads until the server closes (or 5 s pass).
    async fn exchange(addr: std::net::SocketAddr, request: &[u8]) -> String {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(request).await.unwrap();
        let mut out = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut out));
        let _ = read.await;
        String::from_utf8_lossy(&out).into_owned()
    }

    fn get(path: &str) -> Vec<u8> {
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").into_bytes()
    }

    #[tokio::test]
    async fn routes_answer_with_their_status_codes() {
        let addr = endpoint(Bounds::default()).await;
        let status = exchange(addr, &get("/status")).await;
        assert!(status.starts_with("HTTP/1.1 200"), "{status}");
        assert!(status.contains("application/json") && status.contains("\"role\":\"leader\""));
        let metrics = exchange(addr, &get("/metrics")).await;
        assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
        assert!(metrics.contains("keel_busy_refusals_total{keyspace=\"0\"} 0"), "{metrics}");
        let missing = exchange(addr, &get("/nope")).await;
        assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
        let post =
            b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        let refused = exchange(addr, post).await;
        assert!(refused.starts_with("HTTP/1.1 405"), "{refused}");
        assert!(refused.to_ascii_lowercase().contains("allow: get"), "{refused}");
    }

    #[tokio::test]
    async fn with_a_token_only_requests_that_carry_it_are_answered() {
        let token = b"0123456789abcdef-token";
        let addr = endpoint_with(Bounds::default(), Access::new(Some(token), None)).await;
        let bare = exchange(addr, &get("/status")).await;
        assert!(bare.starts_with("HTTP/1.1 401"), "{bare}");
        assert!(bare.to_ascii_lowercase().contains("www-authenticate: bearer"), "{bare}");
        let with = |value: &str| {
            format!("GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: {value}\r\nConnection: close\r\n\r\n")
                .into_bytes()
        };
        let wrong = exchange(addr, &with("Bearer 0123456789abcdef-tokeN")).await;
        assert!(wrong.starts_with("HTTP/1.1 401"), "{wrong}");
        let basic = exchange(addr, &with("Basic 0123456789abcdef-token")).await;
        assert!(basic.starts_with("HTTP/1.1 401"), "{basic}");
        let right = exchange(addr, &with("Bearer 0123456789abcdef-token")).await;
        assert!(right.starts_with("HTTP/1.1 200"), "{right}");
    }

    #[tokio::test]
    async fn an_oversized_head_is_refused() {
        let addr = endpoint(Bounds::default()).await;
        let mut request = b"GET /status HTTP/1.1\r\nHost: x\r\nX-Pad: ".to_vec();
        request.extend(std::iter::repeat_n(b'a', 2 * REQUEST_BYTES_MAX));
        request.extend_from_slice(b"\r\n\r\n");
        let reply = exchange(addr, &request).await;
        assert!(reply.is_empty() || reply.starts_with("HTTP/1.1 431"), "{reply}");
        assert!(!reply.contains("200 OK"));
    }

    #[tokio::test]
    async fn a_slow_client_is_cut_off() {
        let bounds = Bounds { header_timeout: Duration::from_millis(200), ..Bounds::default() };
        let addr = endpoint(bounds).await;
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(b"GET /status HTTP/1.1\r\nHost:").await.unwrap();
        let started = std::time::Instant::now();
        let mut out = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut out));
        assert!(read.await.is_ok(), "the connection was not closed");
        assert!(started.elapsed() < Duration::from_secs(2));
        assert!(!String::from_utf8_lossy(&out).contains("200 OK"));
    }

    #[tokio::test]
    async fn connections_past_the_limit_wait() {
        let bounds = Bounds { connections_max: 1, ..Bounds::default() };
        let addr = endpoint(bounds).await;
        // The only slot, taken for sure: a kept-alive connection that was answered once.
        let mut held = TcpStream::connect(addr).await.unwrap();
        held.write_all(b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let mut seen = Vec::new();
        let answered = tokio::time::timeout(Duration::from_secs(5), async {
            let mut chunk = [0u8; 512];
            while !String::from_utf8_lossy(&seen).contains("200 OK") {
                let n = held.read(&mut chunk).await.unwrap();
                assert!(n > 0, "the held connection was closed");
                seen.extend_from_slice(&chunk[..n]);
            }
        });
        assert!(answered.await.is_ok(), "the first connection is served");
        let request = get("/status");
        let waiting = tokio::time::timeout(Duration::from_millis(300), exchange(addr, &request));
        assert!(waiting.await.is_err(), "a second connection was served at once");
    }
}
