//! RESP drivers: a connection over `keel_wire`'s codec, and the Keel and Redis drivers.
//!
//! Keel: writes go to the leader with `SET k v DURABILITY d`; reads go to the leader or,
//! when spread, to node `client % nodes`, with `GET k LEVEL l`; scans use `KEEL.SCAN`.
//! Redis: writes go to the primary with `SET`, followed by `WAIT replicas 0` when
//! synchronous replication is asked for; reads go to the primary or are spread over
//! replicas (which need `READONLY` only in cluster mode, so nothing is sent).

use super::{Driver, DriverError, REPLY_BYTES_MAX, REQUEST_TIMEOUT};
use keel_wire::resp::encode::encode;
use keel_wire::{DecodeMode, Decoder, Frame, Protocol, RespLimits};
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What one command exchanged on a RESP3 connection ([`RespConn::call_with_pushes`]).
#[derive(Debug)]
pub struct Exchange {
    /// The push frames before the reply, each with when it arrived (since the send).
    pub pushes: Vec<(Frame, std::time::Duration)>,
    /// The reply.
    pub reply: Frame,
    /// When the reply arrived (since the send).
    pub reply_at: std::time::Duration,
    /// Bytes of the request.
    pub bytes_out: u64,
    /// Bytes of the pushes and the reply.
    pub bytes_in: u64,
}

/// One RESP2 connection.
#[derive(Debug)]
pub struct RespConn {
    addr: SocketAddr,
    stream: TcpStream,
    decoder: Decoder,
    read_buf: Vec<u8>,
    write_buf: Vec<u8>,
}

impl RespConn {
    /// Connects to `addr`.
    pub async fn connect(addr: SocketAddr) -> Result<RespConn, DriverError> {
        let stream = tokio::time::timeout(REQUEST_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| DriverError::Timeout)??;
        stream.set_nodelay(true)?;
        let limits =
            RespLimits { frame_bytes_max: REPLY_BYTES_MAX as u64, ..RespLimits::default() };
        Ok(RespConn {
            addr,
            stream,
            decoder: Decoder::new(DecodeMode::Reply, limits),
            read_buf: Vec::with_capacity(4096),
            write_buf: Vec::with_capacity(4096),
        })
    }

    /// The address connected to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Moves the connection to keyspace `keyspace` (`SELECT`); 0 needs nothing.
    pub async fn select(&mut self, keyspace: u32) -> Result<(), DriverError> {
        if keyspace != 0 {
            self.call(&[b"SELECT", keyspace.to_string().as_bytes()]).await?;
        }
        Ok(())
    }

    /// Sends one command and waits for its reply; an error reply becomes `Server`.
    pub async fn call(&mut self, args: &[&[u8]]) -> Result<Frame, DriverError> {
        assert!(!args.is_empty(), "a command needs a name");
        let frame = Frame::Array(args.iter().map(|a| Frame::Bulk(a.to_vec().into())).collect());
        self.write_buf.clear();
        encode(&frame, Protocol::Resp2, &mut self.write_buf);
        let reply = tokio::time::timeout(REQUEST_TIMEOUT, self.round_trip())
            .await
            .map_err(|_| DriverError::Timeout)??;
        match reply {
            Frame::Error(text) | Frame::BulkError(text) => {
                Err(DriverError::Server(String::from_utf8_lossy(&text).into_owned()))
            }
            other => Ok(other),
        }
    }

    /// Sends one command on a RESP3 connection (after `HELLO 3`) and reads every frame up
    /// to its reply: the pushes before it (each with the time it arrived, from the send)
    /// and the reply; with the bytes sent and received for it.
    pub async fn call_with_pushes(&mut self, args: &[&[u8]]) -> Result<Exchange, DriverError> {
        assert!(!args.is_empty(), "a command needs a name");
        let frame = Frame::Array(args.iter().map(|a| Frame::Bulk(a.to_vec().into())).collect());
        self.write_buf.clear();
        encode(&frame, Protocol::Resp2, &mut self.write_buf);
        let sent = std::time::Instant::now();
        let bytes_out = self.write_buf.len() as u64;
        self.stream.write_all(&self.write_buf).await?;
        let mut exchange = Exchange {
            pushes: Vec::new(),
            reply: Frame::Null,
            reply_at: Default::default(),
            bytes_out,
            bytes_in: 0,
        };
        loop {
            let (frame, consumed) = tokio::time::timeout(REQUEST_TIMEOUT, self.next_frame())
                .await
                .map_err(|_| DriverError::Timeout)??;
            exchange.bytes_in += consumed as u64;
            match frame {
                Frame::Push(items) => exchange.pushes.push((Frame::Push(items), sent.elapsed())),
                Frame::Error(text) | Frame::BulkError(text) => {
                    return Err(DriverError::Server(String::from_utf8_lossy(&text).into_owned()))
                }
                reply => {
                    exchange.reply = reply;
                    exchange.reply_at = sent.elapsed();
                    return Ok(exchange);
                }
            }
        }
    }

    /// Sends one command without waiting for its reply (read it with [`RespConn::recv`]);
    /// returns the bytes sent.
    pub async fn send(&mut self, args: &[&[u8]]) -> Result<u64, DriverError> {
        assert!(!args.is_empty(), "a command needs a name");
        let frame = Frame::Array(args.iter().map(|a| Frame::Bulk(a.to_vec().into())).collect());
        self.write_buf.clear();
        encode(&frame, Protocol::Resp2, &mut self.write_buf);
        self.stream.write_all(&self.write_buf).await?;
        Ok(self.write_buf.len() as u64)
    }

    /// The next frame the server sends (a push or a reply) and its bytes; an error reply
    /// becomes `Server`.
    pub async fn recv(&mut self) -> Result<(Frame, u64), DriverError> {
        let (frame, bytes) = tokio::time::timeout(REQUEST_TIMEOUT, self.next_frame())
            .await
            .map_err(|_| DriverError::Timeout)??;
        match frame {
            Frame::Error(text) | Frame::BulkError(text) => {
                Err(DriverError::Server(String::from_utf8_lossy(&text).into_owned()))
            }
            other => Ok((other, bytes as u64)),
        }
    }

    /// The next whole frame and the bytes it took.
    async fn next_frame(&mut self) -> Result<(Frame, usize), DriverError> {
        loop {
            let decoded = self
                .decoder
                .decode(&self.read_buf)
                .map_err(|e| DriverError::Protocol(e.to_string()))?;
            if let Some((frame, consumed)) = decoded {
                self.read_buf.drain(..consumed);
                return Ok((frame, consumed));
            }
            if self.read_buf.len() > REPLY_BYTES_MAX {
                return Err(DriverError::Protocol("reply too large".into()));
            }
            let mut chunk = [0u8; 16 * 1024];
            let n = self.stream.read(&mut chunk).await?;
            if n == 0 {
                return Err(DriverError::Io(std::io::ErrorKind::UnexpectedEof.into()));
            }
            self.read_buf.extend_from_slice(&chunk[..n]);
        }
    }

    async fn round_trip(&mut self) -> Result<Frame, DriverError> {
        self.stream.write_all(&self.write_buf).await?;
        // Bounded: each pass reads at least one byte and the reply is at most REPLY_BYTES_MAX.
        Ok(self.next_frame().await?.0)
    }
}

/// Keel: where reads go and at which level, how writes are acknowledged.
#[derive(Clone, Debug)]
pub struct KeelOptions {
    /// `DURABILITY` of writes: `memory`, `replicated` or `durable`.
    pub durability: String,
    /// `LEVEL` of reads: `any`, `monotonic` or `linearizable`.
    pub read_level: String,
    /// Reads spread over every node (client `i` reads at node `i % n`) rather than the leader.
    pub reads_everywhere: bool,
}

/// A Keel client: a connection to the leader, and one to its read node if different.
#[derive(Debug)]
pub struct KeelDriver {
    leader: RespConn,
    reader: Option<RespConn>,
    options: KeelOptions,
}

impl KeelDriver {
    /// Connects client `client` to keyspace `keyspace` of a cluster whose nodes are
    /// `nodes`, the keyspace's leader at `leader`.
    pub async fn connect(
        nodes: &[SocketAddr],
        keyspace: u32,
        leader: usize,
        client: usize,
        options: KeelOptions,
    ) -> Result<KeelDriver, DriverError> {
        assert!(leader < nodes.len(), "leader index out of range");
        let mut conn = RespConn::connect(nodes[leader]).await?;
        conn.select(keyspace).await?;
        let read_at = if options.reads_everywhere { client % nodes.len() } else { leader };
        let reader = if read_at == leader {
            None
        } else {
            let mut reader = RespConn::connect(nodes[read_at]).await?;
            reader.select(keyspace).await?;
            Some(reader)
        };
        Ok(KeelDriver { leader: conn, reader, options })
    }
}

impl Driver for KeelDriver {
    async fn read(&mut self, key: &[u8]) -> Result<bool, DriverError> {
        let level = self.options.read_level.as_bytes();
        let conn = self.reader.as_mut().unwrap_or(&mut self.leader);
        let reply = conn.call(&[b"GET", key, b"LEVEL", level]).await?;
        Ok(!matches!(reply, Frame::Null))
    }

    async fn write(&mut self, key: &[u8], value: &[u8]) -> Result<(), DriverError> {
        let durability = self.options.durability.as_bytes();
        self.leader.call(&[b"SET", key, value, b"DURABILITY", durability]).await?;
        Ok(())
    }

    async fn scan(&mut self, start: &[u8], count: u64) -> Result<u64, DriverError> {
        let level = self.options.read_level.as_bytes();
        let count = count.to_string();
        let conn = self.reader.as_mut().unwrap_or(&mut self.leader);
        let args: [&[u8]; 7] =
            [b"KEEL.SCAN", start, b"+inf", b"COUNT", count.as_bytes(), b"LEVEL", level];
        match conn.call(&args).await? {
            Frame::Array(items) | Frame::Set(items) => Ok(items.len() as u64),
            Frame::Map(pairs) => Ok(pairs.len() as u64),
            other => Err(DriverError::Protocol(format!("KEEL.SCAN replied {other:?}"))),
        }
    }
}

/// Redis: replication and where reads go.
#[derive(Clone, Debug)]
pub struct RedisOptions {
    /// After each write, `WAIT replicas 0` (synchronous replication to that many replicas).
    pub wait_replicas: Option<u32>,
    /// Reads spread over every node (client `i` reads at node `i % n`) rather than the primary.
    pub reads_everywhere: bool,
}

/// A Redis client: a connection to the primary, and one to its read node if different.
#[derive(Debug)]
pub struct RedisDriver {
    primary: RespConn,
    reader: Option<RespConn>,
    options: RedisOptions,
}

impl RedisDriver {
    /// Connects client `client`; `nodes[0]` is the primary.
    pub async fn connect(
        nodes: &[SocketAddr],
        client: usize,
        options: RedisOptions,
    ) -> Result<RedisDriver, DriverError> {
        assert!(!nodes.is_empty(), "a Redis deployment has a primary");
        let primary = RespConn::connect(nodes[0]).await?;
        let read_at = if options.reads_everywhere { client % nodes.len() } else { 0 };
        let reader =
            if read_at == 0 { None } else { Some(RespConn::connect(nodes[read_at]).await?) };
        Ok(RedisDriver { primary, reader, options })
    }
}

impl Driver for RedisDriver {
    async fn read(&mut self, key: &[u8]) -> Result<bool, DriverError> {
        let conn = self.reader.as_mut().unwrap_or(&mut self.primary);
        let reply = conn.call(&[b"GET", key]).await?;
        Ok(!matches!(reply, Frame::Null))
    }

    async fn write(&mut self, key: &[u8], value: &[u8]) -> Result<(), DriverError> {
        self.primary.call(&[b"SET", key, value]).await?;
        if let Some(replicas) = self.options.wait_replicas {
            let replicas = replicas.to_string();
            let reply = self.primary.call(&[b"WAIT", replicas.as_bytes(), b"0"]).await?;
            let acked = matches!(reply, Frame::Integer(n) if n >= i64::from(replicas.parse::<u32>().unwrap_or(0)));
            if !acked {
                return Err(DriverError::Server(format!("WAIT replied {reply:?}")));
            }
        }
        Ok(())
    }

    async fn scan(&mut self, _start: &[u8], _count: u64) -> Result<u64, DriverError> {
        Err(DriverError::Unsupported("Redis has no ordered range reads (YCSB E)"))
    }
}
