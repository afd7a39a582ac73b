//! A minimal HTTP/1.1 endpoint: `GET /metrics` (Prometheus text format) and
//! `GET /status` (JSON). One request per connection (`Connection: close`), headers at
//! most [`REQUEST_BYTES_MAX`], answered within [`REQUEST_TIMEOUT`]; enough for Prometheus
//! and `curl`, with no HTTP library.

use crate::driver::{NodeHandle, NodeReport};
use keel_core::leader::Role;
use keel_types::NodeId;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Most bytes of one request (request line and headers).
pub const REQUEST_BYTES_MAX: usize = 8 * 1024;
/// How long a request may take to arrive and be answered.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The JSON `/status` and `KEEL.STATUS` return: the engine's `Status` fields (role in
/// lowercase), the server version and the engine's counters.
pub fn status_json(node_id: NodeId, report: &NodeReport) -> String {
    let role = match report.status.role {
        Role::Leader => "leader",
        Role::Follower => "follower",
        Role::Candidate => "candidate",
    };
    let mut doc = serde_json::to_value(&report.status).expect("status serializes");
    let c = &report.counters;
    let object = doc.as_object_mut().expect("a struct serializes to an object");
    assert_eq!(object.get("node_id").and_then(|v| v.as_u64()), Some(u64::from(node_id.0)));
    object.insert("role".into(), role.into());
    object.insert("version".into(), env!("CARGO_PKG_VERSION").into());
    object.insert(
        "counters".into(),
        serde_json::json!({
            "durability_rounds": c.durability_rounds,
            "reads_with_round": c.reads_with_round,
            "forwarded": c.forwarded,
            "elections": c.elections,
            "removals": c.removals,
            "snapshots_installed": c.snapshots_installed,
            "snapshots_taken": c.snapshots_taken,
            "snapshot_chunks_received": c.snapshot_chunks_received,
        }),
    );
    doc.to_string()
}

/// Serves HTTP requests forever.
pub async fn serve(listener: TcpListener, node: NodeHandle) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(crate::peer::BACKOFF_MIN).await;
            continue;
        };
        let node = node.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(REQUEST_TIMEOUT, answer(stream, &node)).await;
        });
    }
}

async fn answer(mut stream: TcpStream, node: &NodeHandle) -> std::io::Result<()> {
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
    let report = node.report(REQUEST_TIMEOUT / 2).await;
    match (path, report) {
        ("/metrics", Ok(report)) => {
            let mut body = String::new();
            node.metrics.render(&mut body);
            crate::metrics::render_engine(&mut body, &report.status, &report.counters);
            respond(&mut stream, "200 OK", "text/plain; version=0.0.4", &body).await
        }
        ("/status", Ok(report)) => {
            let body = status_json(node.node_id, &report) + "\n";
            respond(&mut stream, "200 OK", "application/json", &body).await
        }
        ("/metrics" | "/status", Err(e)) => {
            respond(&mut stream, "503 Service Unavailable", "text/plain", &format!("{e}\n")).await
        }
        _ => respond(&mut stream, "404 Not Found", "text/plain", "try /metrics or /status\n").await,
    }
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
