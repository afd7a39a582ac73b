//! RESP2 and RESP3: the protocol clients speak (`redis-cli`, `redis-benchmark`, every
//! Redis client library).
//!
//! Layout:
//! - this file: [`Frame`] (one value of either protocol version), [`Protocol`] (the
//!   version a connection speaks), [`RespLimits`] (every limit the decoder enforces, in
//!   one place) and [`ProtocolError`] (why bytes were refused).
//! - [`decode`]: [`Decoder`], a streaming decoder with an explicit stack (no recursion),
//!   in request mode (what servers read: arrays of bulk strings or inline commands) or
//!   reply mode (what clients read: any RESP2/RESP3 type).
//! - `inline`: splitting an inline command line into words (quotes and escapes as Redis).
//! - [`mod@encode`]: [`encode()`](encode::encode), which writes a frame in RESP2 or RESP3,
//!   and `to_bytes`.
//!
//! `docs/wire.md` lists the byte layout of every type and the RESP2 downgrades.

pub mod decode;
pub mod encode;
mod inline;

pub use decode::{DecodeMode, Decoder};
pub use encode::{encode, encode_shared};

/// Default largest bulk string: 512 MiB, as Redis's `proto-max-bulk-len`.
pub const BULK_BYTES_MAX_DEFAULT: u64 = 512 * 1024 * 1024;
/// Default most elements in one aggregate (array, set, push; pairs in a map).
pub const AGGREGATE_LEN_MAX_DEFAULT: u32 = 1024 * 1024;
/// Default deepest nesting of aggregates (a request is depth 1).
pub const DEPTH_MAX_DEFAULT: u32 = 64;
/// Default longest line: an inline command, a simple string or a type header. 64 KiB, as
/// Redis's `PROTO_INLINE_MAX_SIZE`.
pub const LINE_BYTES_MAX_DEFAULT: u32 = 64 * 1024;
/// Default most bytes one frame may span on the wire, headers included.
pub const FRAME_BYTES_MAX_DEFAULT: u64 = 1024 * 1024 * 1024;
/// Bytes a server adds to the value limit to get the bulk limit: room for the key and
/// arguments travelling as bulk strings beside the value.
pub const BULK_BYTES_SLACK: u64 = 64 * 1024;
/// Most elements the decoder reserves room for up front; longer aggregates grow as their
/// elements arrive, so a large length header alone never allocates much.
pub const AGGREGATE_PREALLOCATE_MAX: u32 = 1024;

/// Most elements of a request before the connection authenticates: what `AUTH` and
/// `HELLO ... AUTH ... SETNAME ...` need, as Redis's limit for unauthenticated clients.
pub const UNAUTHENTICATED_AGGREGATE_LEN_MAX: u32 = 10;
/// Most bytes of a request (and so of any bulk string in it) before the connection
/// authenticates, as Redis's 16 KiB bulk limit for unauthenticated clients.
pub const UNAUTHENTICATED_REQUEST_BYTES_MAX: u64 = 16 * 1024;

const _: () = assert!(BULK_BYTES_MAX_DEFAULT <= FRAME_BYTES_MAX_DEFAULT);
const _: () = assert!(AGGREGATE_PREALLOCATE_MAX <= AGGREGATE_LEN_MAX_DEFAULT);
const _: () = assert!(DEPTH_MAX_DEFAULT >= 1);
const _: () = assert!(UNAUTHENTICATED_REQUEST_BYTES_MAX <= LINE_BYTES_MAX_DEFAULT as u64);

/// One RESP value. RESP2 has the first six kinds; RESP3 adds the rest.
///
/// Byte strings are bytes, never `String`: keys and values are opaque. Lines (simple
/// strings, errors) never hold `\r` or `\n`; the encoder replaces them with spaces.
#[derive(Clone, Debug, PartialEq)]
pub enum Frame {
    /// `+OK\r\n`: a short, binary-unsafe status line.
    Simple(Vec<u8>),
    /// `-ERR message\r\n`: an error; the first word is its kind (`ERR`, `BUSY`, ...).
    Error(Vec<u8>),
    /// `:42\r\n`: a signed 64-bit integer.
    Integer(i64),
    /// `$3\r\nfoo\r\n`: a binary-safe string (shared: a key or value goes from the
    /// request frame into the command, and from the state machine into a reply, uncopied).
    Bulk(bytes::Bytes),
    /// RESP3 `_\r\n`; RESP2 writes the null bulk string `$-1\r\n`. Both decode to this.
    Null,
    /// RESP2's null array `*-1\r\n`; RESP3 writes `_\r\n` (which decodes to [`Frame::Null`]).
    NullArray,
    /// `*2\r\n...`: an ordered list of frames.
    Array(Vec<Frame>),
    /// RESP3 `#t\r\n` / `#f\r\n`; RESP2 writes `:1` / `:0`.
    Boolean(bool),
    /// RESP3 `,1.5\r\n` (also `inf`, `-inf`, `nan`); RESP2 writes a bulk string.
    Double(f64),
    /// RESP3 `(123...\r\n`: an integer of any size, as its decimal digits with an
    /// optional leading `-`; RESP2 writes a bulk string.
    BigNumber(Vec<u8>),
    /// RESP3 `!len\r\n...`: a binary-safe error; RESP2 writes a simple error.
    BulkError(Vec<u8>),
    /// RESP3 `=len\r\nfmt:text\r\n`: text with a three-byte format (`txt`, `mkd`);
    /// RESP2 writes the text as a bulk string.
    Verbatim {
        /// The format, such as `txt` or `mkd`.
        format: [u8; 3],
        /// The text.
        text: Vec<u8>,
    },
    /// RESP3 `%n\r\n`: `n` key-value pairs in order; RESP2 writes a flat array of `2n`.
    Map(Vec<(Frame, Frame)>),
    /// RESP3 `~n\r\n`: an unordered collection; RESP2 writes an array.
    Set(Vec<Frame>),
    /// RESP3 `|n\r\n` pairs, then the frame they describe; RESP2 drops the pairs.
    Attribute {
        /// The attribute pairs.
        attributes: Vec<(Frame, Frame)>,
        /// The frame the attributes annotate.
        frame: Box<Frame>,
    },
    /// RESP3 `>n\r\n`: out-of-band data (pub/sub); RESP2 writes an array.
    Push(Vec<Frame>),
}

impl Frame {
    /// A simple string from text.
    pub fn simple(text: &str) -> Frame {
        Frame::Simple(text.as_bytes().to_vec())
    }

    /// An error line from text; `text` starts with the error kind (`ERR ...`).
    pub fn error(text: &str) -> Frame {
        Frame::Error(text.as_bytes().to_vec())
    }

    /// A bulk string, copied from `bytes` (a [`Frame::Bulk`] made from a `Bytes` it is
    /// given shares it instead).
    pub fn bulk(bytes: impl AsRef<[u8]>) -> Frame {
        Frame::Bulk(bytes::Bytes::copy_from_slice(bytes.as_ref()))
    }

    /// `+OK`.
    pub fn ok() -> Frame {
        Frame::simple("OK")
    }
}

/// The RESP version a connection speaks: RESP2 until the client says `HELLO 3`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    /// RESP2: what every client starts with.
    #[default]
    Resp2,
    /// RESP3: maps, sets, doubles, booleans, nulls and pushes as their own types.
    Resp3,
}

impl Protocol {
    /// The version number `HELLO` speaks of.
    pub fn version(self) -> u8 {
        match self {
            Protocol::Resp2 => 2,
            Protocol::Resp3 => 3,
        }
    }
}

/// Every limit the RESP decoder enforces, each checked before anything is allocated for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RespLimits {
    /// Largest bulk string, bulk error or verbatim string, in bytes.
    pub bulk_bytes_max: u64,
    /// Most elements in one aggregate (for maps and attributes: most pairs).
    pub aggregate_len_max: u32,
    /// Deepest nesting of aggregates; a request is depth 1.
    pub depth_max: u32,
    /// Longest line before its `\r\n`: an inline command, a simple string, a header.
    pub line_bytes_max: u32,
    /// Most bytes one frame may span on the wire, headers included.
    pub frame_bytes_max: u64,
}

impl Default for RespLimits {
    fn default() -> Self {
        RespLimits {
            bulk_bytes_max: BULK_BYTES_MAX_DEFAULT,
            aggregate_len_max: AGGREGATE_LEN_MAX_DEFAULT,
            depth_max: DEPTH_MAX_DEFAULT,
            line_bytes_max: LINE_BYTES_MAX_DEFAULT,
            frame_bytes_max: FRAME_BYTES_MAX_DEFAULT,
        }
    }
}

impl RespLimits {
    /// The limits a Keel server uses: bulk strings no larger than a value plus
    /// [`BULK_BYTES_SLACK`], frames no larger than a few of those.
    pub fn for_server(limits: &keel_types::Limits) -> RespLimits {
        let bulk_bytes_max = u64::from(limits.value_bytes_max) + BULK_BYTES_SLACK;
        // A request carries at most a key, a value and a few option words in practice;
        // four bulk strings' worth covers CAS (expected and new) with room to spare.
        let frame_bytes_max = bulk_bytes_max * 4;
        let result = RespLimits { bulk_bytes_max, frame_bytes_max, ..RespLimits::default() };
        debug_assert!(result.bulk_bytes_max <= result.frame_bytes_max);
        result
    }

    /// The limits before a connection authenticates (on a node with users): requests no
    /// longer than [`UNAUTHENTICATED_REQUEST_BYTES_MAX`] of at most
    /// [`UNAUTHENTICATED_AGGREGATE_LEN_MAX`] words, so that a party without credentials
    /// holds at most one small request per connection.
    pub fn unauthenticated() -> RespLimits {
        let bytes = UNAUTHENTICATED_REQUEST_BYTES_MAX;
        RespLimits {
            bulk_bytes_max: bytes,
            aggregate_len_max: UNAUTHENTICATED_AGGREGATE_LEN_MAX,
            depth_max: 1,
            line_bytes_max: u32::try_from(bytes).expect("16 KiB fits"),
            frame_bytes_max: bytes,
        }
    }
}

/// Why bytes were refused. Never retryable: the connection is out of step and the server
/// replies `-ERR Protocol error: <message>` and closes it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// An aggregate length header that is not a number in range.
    #[error("invalid multibulk length")]
    InvalidAggregateLength,
    /// A bulk length header that is not a number in range.
    #[error("invalid bulk length")]
    InvalidBulkLength,
    /// An aggregate longer than the limit.
    #[error("invalid multibulk length ({len} elements, more than the limit of {max})")]
    AggregateTooLong {
        /// The length announced.
        len: u64,
        /// The limit.
        max: u32,
    },
    /// A bulk string longer than the limit.
    #[error("invalid bulk length ({len} bytes, more than the limit of {max})")]
    BulkTooLong {
        /// The length announced.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// A frame that would span more bytes than the limit.
    #[error("frame exceeds the limit of {max} bytes")]
    FrameTooLarge {
        /// The limit.
        max: u64,
    },
    /// Aggregates nested deeper than the limit.
    #[error("nesting deeper than {max} levels")]
    TooDeep {
        /// The limit.
        max: u32,
    },
    /// An inline command or header line longer than the limit.
    #[error("too big inline request")]
    LineTooLong,
    /// A request array element that is not a bulk string.
    #[error("expected '$', got '{}'", char::from(*got))]
    ExpectedBulk {
        /// The type byte found.
        got: u8,
    },
    /// A type byte that is not one of RESP2's or RESP3's.
    #[error("unknown type byte '{}'", char::from(*got))]
    UnknownType {
        /// The byte found.
        got: u8,
    },
    /// An inline command with a quote that is never closed.
    #[error("unbalanced quotes in request")]
    UnbalancedQuotes,
    /// A bulk payload not followed by `\r\n`.
    #[error("expected CRLF after bulk data")]
    MissingCrlf,
    /// A line that does not hold what its type byte promises.
    #[error("invalid {kind} line")]
    InvalidLine {
        /// The type: integer, double, boolean, null, big number.
        kind: &'static str,
    },
    /// A verbatim string without its `fmt:` prefix.
    #[error("invalid verbatim string")]
    InvalidVerbatim,
}

impl ProtocolError {
    /// The error frame a server sends before closing the connection.
    pub fn reply_frame(&self) -> Frame {
        let text = format!("ERR Protocol error: {self}");
        debug_assert!(!text.contains('\n'));
        Frame::Error(text.into_bytes())
    }
}
