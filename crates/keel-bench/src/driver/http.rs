//! A minimal HTTP/1.1 client (keep-alive, `Content-Length` and chunked bodies) on tokio:
//! how the benchmark reads a Keel node's `/metrics` and asks etcd's gateway which member
//! leads (`cluster.rs`); requests are measured through the drivers, never through it.

use super::{DriverError, REPLY_BYTES_MAX, REQUEST_TIMEOUT};
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Longest header block a response may have, in bytes.
pub const HEADER_BYTES_MAX: usize = 16 * 1024;

/// A keep-alive HTTP/1.1 connection.
#[derive(Debug)]
pub struct HttpConn {
    addr: SocketAddr,
    stream: TcpStream,
    buf: Vec<u8>,
}

/// The parts of a response the benchmark needs.
#[derive(Debug, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The body, de-chunked.
    pub body: Vec<u8>,
}

/// Where the header block ends (index past `\r\n\r\n`), if it is all in.
fn header_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4)
}

/// How a response body is delimited.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum BodyKind {
    Length(usize),
    Chunked,
    UntilClose,
}

/// Status and body framing from a header block.
fn parse_head(head: &[u8]) -> Result<(u16, BodyKind), DriverError> {
    let text =
        std::str::from_utf8(head).map_err(|_| DriverError::Protocol("non-UTF-8 head".into()))?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| DriverError::Protocol(format!("bad status line {status_line:?}")))?;
    let mut length = None;
    let mut chunked = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else { continue };
        let (name, value) = (name.trim().to_ascii_lowercase(), value.trim());
        if name == "content-length" {
            length = Some(value.parse().map_err(|_| DriverError::Protocol("bad length".into()))?);
        } else if name == "transfer-encoding" && value.eq_ignore_ascii_case("chunked") {
            chunked = true;
        }
    }
    match (length, chunked) {
        (Some(n), false) => Ok((status, BodyKind::Length(n))),
        (_, true) => Ok((status, BodyKind::Chunked)),
        (None, false) => Ok((status, BodyKind::UntilClose)),
    }
}

/// Decodes a complete chunked body: `Ok(Some((body, consumed)))` once the last chunk is in.
pub fn dechunk(buf: &[u8]) -> Result<Option<(Vec<u8>, usize)>, DriverError> {
    let mut body = Vec::new();
    let mut pos = 0;
    // Bounded: each pass consumes a chunk header, and the buffer is finite.
    loop {
        let Some(line_len) = buf[pos..].windows(2).position(|w| w == b"\r\n") else {
            return Ok(None);
        };
        let line = std::str::from_utf8(&buf[pos..pos + line_len]).unwrap_or("");
        let size_text = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| DriverError::Protocol(format!("bad chunk size {size_text:?}")))?;
        if size > REPLY_BYTES_MAX {
            return Err(DriverError::Protocol("chunk too large".into()));
        }
        let data = pos + line_len + 2;
        if buf.len() < data + size + 2 {
            return Ok(None);
        }
        if size == 0 {
            return Ok(Some((body, data + 2)));
        }
        body.extend_from_slice(&buf[data..data + size]);
        pos = data + size + 2;
    }
}

impl HttpConn {
    /// Connects to `addr`.
    pub async fn connect(addr: SocketAddr) -> Result<HttpConn, DriverError> {
        let stream = tokio::time::timeout(REQUEST_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| DriverError::Timeout)??;
        stream.set_nodelay(true)?;
        Ok(HttpConn { addr, stream, buf: Vec::with_capacity(4096) })
    }

    /// `GET path`.
    pub async fn get(&mut self, path: &str) -> Result<Response, DriverError> {
        let request = format!("GET {path} HTTP/1.1\r\nHost: {}\r\n\r\n", self.addr);
        tokio::time::timeout(REQUEST_TIMEOUT, self.exchange(request.as_bytes()))
            .await
            .map_err(|_| DriverError::Timeout)?
    }

    /// `POST path` with a JSON body.
    pub async fn post_json(&mut self, path: &str, body: &str) -> Result<Response, DriverError> {
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.addr,
            body.len()
        );
        tokio::time::timeout(REQUEST_TIMEOUT, self.exchange(request.as_bytes()))
            .await
            .map_err(|_| DriverError::Timeout)?
    }

    async fn fill(&mut self) -> Result<(), DriverError> {
        if self.buf.len() > REPLY_BYTES_MAX {
            return Err(DriverError::Protocol("response too large".into()));
        }
        let mut chunk = [0u8; 16 * 1024];
        let n = self.stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(DriverError::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }

    async fn exchange(&mut self, request: &[u8]) -> Result<Response, DriverError> {
        self.stream.write_all(request).await?;
        let end = loop {
            if let Some(end) = header_end(&self.buf) {
                break end;
            }
            if self.buf.len() > HEADER_BYTES_MAX {
                return Err(DriverError::Protocol("header block too large".into()));
            }
            self.fill().await?;
        };
        let (status, length) = parse_head(&self.buf[..end])?;
        self.buf.drain(..end);
        let body = match length {
            BodyKind::UntilClose => loop {
                match self.fill().await {
                    Ok(()) => {}
                    Err(DriverError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                        break std::mem::take(&mut self.buf);
                    }
                    Err(e) => return Err(e),
                }
            },
            BodyKind::Length(n) => {
                while self.buf.len() < n {
                    self.fill().await?;
                }
                self.buf.drain(..n).collect()
            }
            BodyKind::Chunked => loop {
                if let Some((body, consumed)) = dechunk(&self.buf)? {
                    self.buf.drain(..consumed);
                    break body;
                }
                self.fill().await?;
            },
        };
        Ok(Response { status, body })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_and_chunked_bodies_parse() {
        let head = b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n";
        assert_eq!(parse_head(head).unwrap(), (200, BodyKind::Length(12)));
        let head = b"HTTP/1.1 503 Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(parse_head(head).unwrap(), (503, BodyKind::Chunked));
        assert!(parse_head(b"garbage\r\n\r\n").is_err());
        let body = b"4\r\nWiki\r\n5;x=y\r\npedia\r\n0\r\n\r\nrest";
        let (decoded, consumed) = dechunk(body).unwrap().unwrap();
        assert_eq!(decoded, b"Wikipedia");
        assert_eq!(&body[consumed..], b"rest");
        assert_eq!(dechunk(b"4\r\nWi").unwrap(), None);
        assert_eq!(header_end(b"HTTP/1.1 200 OK\r\n\r\nx"), Some(19));
    }
}
