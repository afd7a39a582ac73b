//! A minimal HTTP/1.1 endpoint: `GET /metrics` (Prometheus text format, every keyspace's
//! metrics labelled with its id) and `GET /status` (JSON: the node and each keyspace). One request per connection (`Connection: close`), headers at
//! most [`REQUEST_BYTES_MAX`], answered within [`REQUEST_TIMEOUT`]; enough for Prometheus
//! and `curl`, with no HTTP library.

use crate::driver::{KeyspaceHandle, Keyspaces};
use crate::metrics::KeyspaceView;
use keel_core::engine::Report;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Most bytes of one request (request line and headers).
pub const REQUEST_BYTES_MAX: usize = 8 * 1024;
/// How long a request may take to arrive and be answered.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

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
    let doc = serde_json::json!({
        "node_id": keyspaces.node_id.0,
        "version": env!("CARGO_PKG_VERSION"),
        "keyspaces": docs,
    });
    doc.to_string()
}

/// Serves HTTP requests forever.
pub async fn serve(listener: TcpListener, keyspaces: std::sync::Arc<Keyspaces>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(crate::peer::BACKOFF_MIN).await;
            continue;
        };
        let keyspaces = keyspaces.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(REQUEST_TIMEOUT, answer(stream, &keyspaces)).await;
        });
    }
}

async fn answer(mut stream: TcpStream, keyspaces: &Keyspaces) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk).await?;
        if n == 0 || buf.len() + n > REQUEST_BYTES_MAX {
            return respond(&mut stream, "400 Bad Request", "text/plain", "bad request\n").await;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let line = String::from_utf8_lossy(&buf[..buf.iter().position(|b| *b == b'\r').unwrap_or(0)])
        .into_owned();
    let mut parts = line.split(' ');
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if method != "GET" {
        return respond(&mut stream, "405 Method Not Allowed", "text/plain", "GET only\n").await;
    }
    if path != "/metrics" && path != "/status" {
        return respond(&mut stream, "404 Not Found", "text/plain", "try /metrics or /status\n")
            .await;
    }
    let reports = match reports(keyspaces, REQUEST_TIMEOUT / 2).await {
        Ok(reports) => reports,
        Err(e) => {
            let body = format!("{e}\n");
            return respond(&mut stream, "503 Service Unavailable", "text/plain", &body).await;
        }
    };
    if path == "/status" {
        let body = node_status(keyspaces, &reports) + "\n";
        return respond(&mut stream, "200 OK", "application/json", &body).await;
    }
    let views: Vec<KeyspaceView<'_>> = reports
        .iter()
        .map(|(handle, report)| KeyspaceView { id: handle.id, metrics: &handle.metrics, report })
        .collect();
    let mut body = String::new();
    crate::metrics::render(&mut body, &keyspaces.node_metrics, &views);
    respond(&mut stream, "200 OK", "text/plain; version=0.0.4", &body).await
}

async fn respond(
    stream: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &str,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}
