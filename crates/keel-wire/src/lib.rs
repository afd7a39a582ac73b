//! Keel's wire codecs. Pure and fuzzable: bytes in, frames out; no I/O, no clock.
//!
//! Layout:
//! - [`resp`]: RESP2/RESP3 frames, the streaming [`resp::Decoder`] (requests and
//!   replies, inline commands included) and the encoder that writes a reply in the
//!   connection's protocol version.
//! - [`command`]: from a decoded request to a typed [`command::ClientCommand`], with
//!   Redis-style errors, and from a data command to engine operations.
//! - [`reply`]: how Keel's errors and results look as RESP frames.
//! - [`peer`]: the length-prefixed, CRC32C-checked frames peers exchange, carrying every
//!   keyspace's engine messages in envelopes, and the encoding of each engine kind's
//!   messages ([`peer::PeerMessage`]; the leader engine's today).
//!
//! Every decoder here checks each length against a named limit before allocating for
//! it, and returns a typed error on malformed input; none panics on any input.
//! `docs/wire.md` holds the byte layouts and the command table.
//!
//! A server's read loop, with the socket left out:
//!
//! ```
//! use keel_types::Limits;
//! use keel_wire::command::parse_frame;
//! use keel_wire::resp::encode;
//! use keel_wire::{ClientCommand, DecodeMode, Decoder, Frame, Protocol, RespLimits};
//!
//! let limits = Limits::default();
//! let mut decoder = Decoder::new(DecodeMode::Request, RespLimits::for_server(&limits));
//! let mut buf = b"*1\r\n$4\r\nPING\r\nGET k LEVEL bogus\r\n".to_vec(); // bytes read so far
//! let mut out = Vec::new(); // bytes to write back
//! loop {
//!     let (frame, consumed) = match decoder.decode(&buf) {
//!         Ok(Some(done)) => done,
//!         Ok(None) => break, // read more bytes and call again
//!         Err(protocol_error) => {
//!             encode(&protocol_error.reply_frame(), Protocol::Resp2, &mut out);
//!             break; // then close the connection
//!         }
//!     };
//!     buf.drain(..consumed);
//!     let reply = match parse_frame(frame, &limits) {
//!         Ok(ClientCommand::Ping { message: None }) => Frame::simple("PONG"),
//!         Ok(_) => Frame::ok(), // the real server hands data commands to the engine
//!         Err(refused) => refused.reply_frame(),
//!     };
//!     encode(&reply, Protocol::Resp2, &mut out);
//! }
//! let expected = "+PONG\r\n-ERR unknown read level 'bogus' (expected one of: any, monotonic, linearizable)\r\n";
//! assert_eq!(String::from_utf8(out).unwrap(), expected);
//! ```

pub mod command;
pub mod glob;
mod num;
pub mod peer;
pub mod reply;
pub mod resp;
pub use keel_types::slots;

pub use command::{ClientCommand, CommandError};
pub use resp::{DecodeMode, Decoder, Frame, Protocol, ProtocolError, RespLimits};
