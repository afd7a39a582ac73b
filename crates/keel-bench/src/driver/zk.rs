//! A minimal ZooKeeper client (the jute binary protocol over TCP, hand-written) and the
//! ZooKeeper driver.
//!
//! Frames are a big-endian `i32` length and a payload. A session opens with a
//! `ConnectRequest`; each request is `(xid, type)` and a body, each reply
//! `(xid, zxid, err)` and a body. Used: `create` (1), `getData` (4), `setData` (5),
//! `sync` (9). Keys are znodes under the root (`/user...`); a write is `setData`, and
//! `create` when the znode does not exist yet. ZooKeeper has no range reads: E is skipped.

use super::{Driver, DriverError, REPLY_BYTES_MAX, REQUEST_TIMEOUT};
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The session timeout asked for, in milliseconds (the server clamps it to 2..20 ticks).
pub const SESSION_TIMEOUT_MS: i32 = 30_000;
/// `ZNONODE`.
pub const ERR_NO_NODE: i32 = -101;
/// `ZNODEEXISTS`.
pub const ERR_NODE_EXISTS: i32 = -110;

const OP_CREATE: i32 = 1;
const OP_GET_DATA: i32 = 4;
const OP_SET_DATA: i32 = 5;
const OP_SYNC: i32 = 9;

/// Jute encoding into a buffer.
#[derive(Debug, Default)]
pub struct JuteWriter {
    /// The bytes so far, after a 4-byte length placeholder.
    pub buf: Vec<u8>,
}

impl JuteWriter {
    /// A frame under construction.
    pub fn new() -> JuteWriter {
        JuteWriter { buf: vec![0; 4] }
    }
    /// An `int`.
    pub fn int(&mut self, v: i32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }
    /// A `long`.
    pub fn long(&mut self, v: i64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }
    /// A `boolean`.
    pub fn boolean(&mut self, v: bool) -> &mut Self {
        self.buf.push(u8::from(v));
        self
    }
    /// A `buffer` or `ustring`: length, then bytes.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        let len = i32::try_from(v.len()).expect("jute buffers are under 2 GiB");
        self.int(len);
        self.buf.extend_from_slice(v);
        self
    }
    /// The frame with its length filled in.
    pub fn finish(&mut self) -> Vec<u8> {
        let len = u32::try_from(self.buf.len() - 4).expect("frame under 4 GiB");
        self.buf[..4].copy_from_slice(&len.to_be_bytes());
        std::mem::take(&mut self.buf)
    }
}

/// One ZooKeeper session.
#[derive(Debug)]
pub struct ZkConn {
    stream: TcpStream,
    xid: i32,
}

impl ZkConn {
    /// Connects and opens a session.
    pub async fn connect(addr: SocketAddr) -> Result<ZkConn, DriverError> {
        let stream = tokio::time::timeout(REQUEST_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| DriverError::Timeout)??;
        stream.set_nodelay(true)?;
        let mut conn = ZkConn { stream, xid: 0 };
        let frame = JuteWriter::new()
            .int(0) // protocolVersion
            .long(0) // lastZxidSeen
            .int(SESSION_TIMEOUT_MS)
            .long(0) // sessionId: a new session
            .bytes(&[0; 16]) // passwd
            .boolean(false) // readOnly
            .finish();
        conn.stream.write_all(&frame).await?;
        let reply = conn.read_frame().await?;
        if reply.len() < 16 {
            return Err(DriverError::Protocol("short ConnectResponse".into()));
        }
        let timeout = i32::from_be_bytes(reply[4..8].try_into().expect("4 bytes"));
        if timeout <= 0 {
            return Err(DriverError::Server("session refused".into()));
        }
        Ok(conn)
    }

    async fn read_frame(&mut self) -> Result<Vec<u8>, DriverError> {
        let mut len = [0u8; 4];
        self.stream.read_exact(&mut len).await?;
        let len = u32::from_be_bytes(len) as usize;
        if len > REPLY_BYTES_MAX {
            return Err(DriverError::Protocol(format!("frame of {len} bytes")));
        }
        let mut body = vec![0; len];
        self.stream.read_exact(&mut body).await?;
        Ok(body)
    }

    /// Sends request `op` with `body` (already jute-encoded) and returns `(err, reply body)`.
    async fn call(&mut self, op: i32, body: &[u8]) -> Result<(i32, Vec<u8>), DriverError> {
        self.xid = self.xid.wrapping_add(1).max(1);
        let xid = self.xid;
        let mut w = JuteWriter::new();
        w.int(xid).int(op);
        w.buf.extend_from_slice(body);
        let frame = w.finish();
        tokio::time::timeout(REQUEST_TIMEOUT, async {
            self.stream.write_all(&frame).await?;
            // Bounded by the timeout: skips only notifications and pings (negative xids).
            loop {
                let reply = self.read_frame().await?;
                if reply.len() < 16 {
                    return Err(DriverError::Protocol("short reply header".into()));
                }
                let got = i32::from_be_bytes(reply[0..4].try_into().expect("4 bytes"));
                let err = i32::from_be_bytes(reply[12..16].try_into().expect("4 bytes"));
                if got == xid {
                    return Ok((err, reply[16..].to_vec()));
                }
                if got >= 0 {
                    return Err(DriverError::Protocol(format!("reply xid {got}, expected {xid}")));
                }
            }
        })
        .await
        .map_err(|_| DriverError::Timeout)?
    }

    /// `getData path`: `Ok(None)` if the znode does not exist.
    pub async fn get_data(&mut self, path: &str) -> Result<Option<Vec<u8>>, DriverError> {
        let mut w = JuteWriter { buf: Vec::new() };
        w.bytes(path.as_bytes()).boolean(false);
        match self.call(OP_GET_DATA, &w.buf).await? {
            (0, body) => Ok(Some(body)),
            (ERR_NO_NODE, _) => Ok(None),
            (err, _) => Err(DriverError::Server(format!("getData error {err}"))),
        }
    }

    /// `setData path data -1`, or `create` (open ACL, persistent) when absent.
    pub async fn upsert(&mut self, path: &str, data: &[u8]) -> Result<(), DriverError> {
        let mut w = JuteWriter { buf: Vec::new() };
        w.bytes(path.as_bytes()).bytes(data).int(-1);
        match self.call(OP_SET_DATA, &w.buf).await?.0 {
            0 => return Ok(()),
            ERR_NO_NODE => {}
            err => return Err(DriverError::Server(format!("setData error {err}"))),
        }
        let mut w = JuteWriter { buf: Vec::new() };
        w.bytes(path.as_bytes()).bytes(data);
        w.int(1).int(31).bytes(b"world").bytes(b"anyone"); // one ACL: all permissions
        w.int(0); // persistent
        match self.call(OP_CREATE, &w.buf).await?.0 {
            0 => Ok(()),
            // Created concurrently by another client: overwrite it.
            ERR_NODE_EXISTS => match self
                .call(OP_SET_DATA, &{
                    let mut w = JuteWriter { buf: Vec::new() };
                    w.bytes(path.as_bytes()).bytes(data).int(-1);
                    w.buf
                })
                .await?
                .0
            {
                0 => Ok(()),
                err => Err(DriverError::Server(format!("setData error {err}"))),
            },
            err => Err(DriverError::Server(format!("create error {err}"))),
        }
    }

    /// `sync path`: the connected server catches up with the leader.
    pub async fn sync(&mut self, path: &str) -> Result<(), DriverError> {
        let mut w = JuteWriter { buf: Vec::new() };
        w.bytes(path.as_bytes());
        match self.call(OP_SYNC, &w.buf).await?.0 {
            0 => Ok(()),
            err => Err(DriverError::Server(format!("sync error {err}"))),
        }
    }
}

/// ZooKeeper: where reads go and whether they `sync` first.
#[derive(Clone, Debug)]
pub struct ZkOptions {
    /// `sync` before each read.
    pub sync_reads: bool,
    /// Reads spread over every node (client `i` reads at node `i % n`).
    pub reads_everywhere: bool,
}

/// A ZooKeeper client: a session on the leader, and one on its read node if different.
#[derive(Debug)]
pub struct ZkDriver {
    writer: ZkConn,
    reader: Option<ZkConn>,
    options: ZkOptions,
}

impl ZkDriver {
    /// Connects client `client`; writes go to `nodes[leader]`.
    pub async fn connect(
        nodes: &[SocketAddr],
        leader: usize,
        client: usize,
        options: ZkOptions,
    ) -> Result<ZkDriver, DriverError> {
        assert!(leader < nodes.len());
        let writer = ZkConn::connect(nodes[leader]).await?;
        let read_at = if options.reads_everywhere { client % nodes.len() } else { leader };
        let reader =
            if read_at == leader { None } else { Some(ZkConn::connect(nodes[read_at]).await?) };
        Ok(ZkDriver { writer, reader, options })
    }
}

fn znode(key: &[u8]) -> String {
    format!("/{}", String::from_utf8_lossy(key))
}

impl Driver for ZkDriver {
    async fn read(&mut self, key: &[u8]) -> Result<bool, DriverError> {
        let path = znode(key);
        let conn = self.reader.as_mut().unwrap_or(&mut self.writer);
        if self.options.sync_reads {
            conn.sync(&path).await?;
        }
        Ok(conn.get_data(&path).await?.is_some())
    }

    async fn write(&mut self, key: &[u8], value: &[u8]) -> Result<(), DriverError> {
        self.writer.upsert(&znode(key), value).await
    }

    async fn scan(&mut self, _start: &[u8], _count: u64) -> Result<u64, DriverError> {
        Err(DriverError::Unsupported("ZooKeeper has no ordered range reads (YCSB E)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jute_frames_are_length_prefixed_big_endian() {
        let frame = JuteWriter::new().int(1).long(-1).boolean(true).bytes(b"ab").finish();
        assert_eq!(&frame[..4], &[0, 0, 0, 19]);
        assert_eq!(&frame[4..8], &[0, 0, 0, 1]);
        assert_eq!(&frame[8..16], &[0xFF; 8]);
        assert_eq!(frame[16], 1);
        assert_eq!(&frame[17..], &[0, 0, 0, 2, b'a', b'b']);
        assert_eq!(znode(b"user1"), "/user1");
    }
}
