//! Peer frames: how nodes carry engine [`Message`]s over TCP, batched and pipelined.
//!
//! Layout:
//! - this file: the frame ([`PeerFrame`]), its limits ([`PeerLimits`]), its errors
//!   ([`PeerError`]), [`encode_frame`] and [`decode_frame`].
//! - `message`: the encoding of every `keel_core::leader::Message` variant (one file, so
//!   that a new field is one edit; its round-trip property test names every field).
//!
//! Byte layout (integers little-endian, as `keel_types::codec`):
//!
//! ```text
//! offset  size  field
//! 0       4     body_len: u32, bytes after this 8-byte header
//! 4       4     crc32c: u32, CRC32C (Castagnoli) of the body
//! 8       1     format version: 1
//! 9       1     kind: 1 = link (one sender, one receiver), 2 = batch (each message addressed)
//! link:   from u32, to u32, count u32, then count messages
//! batch:  count u32, then count × (from u32, to u32, message)
//! ```
//!
//! `body_len` is checked against [`PeerLimits::frame_bytes_max`] as soon as the header is
//! in, before waiting for or allocating the body; every count is checked against its
//! limit and against the bytes left before anything is reserved for it.

mod message;

use keel_core::leader::Message;
use keel_types::codec::{put_u32, put_u8, CodecError, Reader};
use keel_types::NodeId;

/// Bytes before the body: its length and its checksum.
pub const HEADER_BYTES: usize = 8;
/// The only frame format this version writes and reads.
pub const FRAME_FORMAT_V1: u8 = 1;
/// Frame kind: messages from one node to one node.
pub const KIND_LINK: u8 = 1;
/// Frame kind: messages each with its own sender and receiver.
pub const KIND_BATCH: u8 = 2;
/// Default largest frame body: 256 MiB, room for a snapshot of a modest store.
pub const FRAME_BYTES_MAX_DEFAULT: u32 = 256 * 1024 * 1024;
/// Default most messages in one frame.
pub const MESSAGES_PER_FRAME_MAX_DEFAULT: u32 = 4096;
/// Default most log entries in one `Append`.
pub const ENTRIES_PER_MESSAGE_MAX_DEFAULT: u32 = 65_536;
/// Longest text (an error's reason) inside a message.
pub const TEXT_BYTES_MAX: u32 = 64 * 1024;

const _: () = assert!(FRAME_BYTES_MAX_DEFAULT as usize > HEADER_BYTES);
const _: () = assert!(MESSAGES_PER_FRAME_MAX_DEFAULT <= FRAME_BYTES_MAX_DEFAULT);

/// One frame's worth of messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerFrame {
    /// Messages from `from` to `to`, in order: what one connection between two nodes
    /// carries.
    Link {
        /// The sender.
        from: NodeId,
        /// The receiver.
        to: NodeId,
        /// The messages, in send order.
        messages: Vec<Message>,
    },
    /// Messages each carrying its own `(from, to)`: for relays and recorded traffic.
    Batch {
        /// `(from, to, message)` in send order.
        envelopes: Vec<(NodeId, NodeId, Message)>,
    },
}

impl PeerFrame {
    /// How many messages the frame carries.
    pub fn message_count(&self) -> usize {
        match self {
            PeerFrame::Link { messages, .. } => messages.len(),
            PeerFrame::Batch { envelopes } => envelopes.len(),
        }
    }
}

/// The limits on peer frames, checked before allocating.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerLimits {
    /// Largest frame body in bytes.
    pub frame_bytes_max: u32,
    /// Most messages in one frame.
    pub messages_per_frame_max: u32,
    /// Most log entries in one `Append`.
    pub entries_per_message_max: u32,
}

impl Default for PeerLimits {
    fn default() -> Self {
        PeerLimits {
            frame_bytes_max: FRAME_BYTES_MAX_DEFAULT,
            messages_per_frame_max: MESSAGES_PER_FRAME_MAX_DEFAULT,
            entries_per_message_max: ENTRIES_PER_MESSAGE_MAX_DEFAULT,
        }
    }
}

/// Why a peer frame was refused. On decode, the link is out of step or its bytes are
/// corrupt: close the connection and reconnect (the engine retries what was lost). On
/// encode, the frame is too big: send its messages in smaller frames.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PeerError {
    /// A body longer than the limit.
    #[error("frame body of {len} bytes exceeds the limit of {max} bytes")]
    FrameTooLarge {
        /// The body length.
        len: u64,
        /// The limit.
        max: u32,
    },
    /// More messages (or entries in one message) than the limit.
    #[error("{count} {what} exceed the limit of {max}")]
    TooMany {
        /// Messages or entries.
        what: &'static str,
        /// The count announced or given.
        count: u64,
        /// The limit.
        max: u32,
    },
    /// The body does not match its checksum.
    #[error("checksum mismatch: header says {expected:#010x}, body has {actual:#010x}")]
    Checksum {
        /// The checksum in the header.
        expected: u32,
        /// The checksum of the body received.
        actual: u32,
    },
    /// A frame format version this node does not know.
    #[error("unknown peer frame format version {0}")]
    UnknownVersion(u8),
    /// A field that does not decode (truncated, unknown tag, trailing bytes).
    #[error("malformed peer frame: {0}")]
    Codec(#[from] CodecError),
    /// Text that is not UTF-8.
    #[error("{0} is not UTF-8")]
    InvalidUtf8(&'static str),
}

/// Appends `frame` to `out`. Refuses (and leaves `out` as it was) a frame over the limits.
pub fn encode_frame(
    frame: &PeerFrame,
    limits: &PeerLimits,
    out: &mut Vec<u8>,
) -> Result<(), PeerError> {
    let count = frame.message_count();
    if count as u64 > u64::from(limits.messages_per_frame_max) {
        let max = limits.messages_per_frame_max;
        return Err(PeerError::TooMany { what: "messages", count: count as u64, max });
    }
    let start = out.len();
    out.extend_from_slice(&[0; HEADER_BYTES]);
    put_u8(out, FRAME_FORMAT_V1);
    match frame {
        PeerFrame::Link { from, to, messages } => {
            put_u8(out, KIND_LINK);
            put_u32(out, from.0);
            put_u32(out, to.0);
            put_u32(out, count as u32);
            messages.iter().for_each(|m| message::put_message(out, m));
        }
        PeerFrame::Batch { envelopes } => {
            put_u8(out, KIND_BATCH);
            put_u32(out, count as u32);
            for (from, to, m) in envelopes {
                put_u32(out, from.0);
                put_u32(out, to.0);
                message::put_message(out, m);
            }
        }
    }
    let body_len = out.len() - start - HEADER_BYTES;
    if body_len as u64 > u64::from(limits.frame_bytes_max) {
        out.truncate(start);
        return Err(PeerError::FrameTooLarge { len: body_len as u64, max: limits.frame_bytes_max });
    }
    assert!(body_len >= 2, "a body holds at least its version and kind");
    let crc = crc32c::crc32c(&out[start + HEADER_BYTES..]);
    out[start..start + 4].copy_from_slice(&(body_len as u32).to_le_bytes());
    out[start + 4..start + HEADER_BYTES].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// Reads one frame from the front of `buf`: `Ok(None)` when more bytes are needed,
/// `Ok(Some((frame, consumed)))` when a whole frame was read.
pub fn decode_frame(
    buf: &[u8],
    limits: &PeerLimits,
) -> Result<Option<(PeerFrame, usize)>, PeerError> {
    let Some(header) = buf.get(..HEADER_BYTES) else {
        return Ok(None);
    };
    let body_len = u32::from_le_bytes(header[..4].try_into().expect("four bytes"));
    let expected = u32::from_le_bytes(header[4..].try_into().expect("four bytes"));
    if body_len > limits.frame_bytes_max {
        return Err(PeerError::FrameTooLarge {
            len: u64::from(body_len),
            max: limits.frame_bytes_max,
        });
    }
    let end = HEADER_BYTES + body_len as usize;
    let Some(body) = buf.get(HEADER_BYTES..end) else {
        return Ok(None);
    };
    let actual = crc32c::crc32c(body);
    if actual != expected {
        return Err(PeerError::Checksum { expected, actual });
    }
    let frame = decode_body(body, limits)?;
    debug_assert!(frame.message_count() <= limits.messages_per_frame_max as usize);
    Ok(Some((frame, end)))
}

/// Decodes a checksummed body.
fn decode_body(body: &[u8], limits: &PeerLimits) -> Result<PeerFrame, PeerError> {
    let mut reader = Reader::new(body);
    let version = reader.u8("frame format version")?;
    if version != FRAME_FORMAT_V1 {
        return Err(PeerError::UnknownVersion(version));
    }
    let max = limits.messages_per_frame_max;
    let frame = match reader.u8("frame kind")? {
        KIND_LINK => {
            let from = NodeId(reader.u32("frame sender")?);
            let to = NodeId(reader.u32("frame receiver")?);
            let count = message::count(&mut reader, "messages", max, message::MESSAGE_BYTES_MIN)?;
            let mut messages = Vec::with_capacity(count);
            for _ in 0..count {
                messages.push(message::read_message(&mut reader, limits)?);
            }
            PeerFrame::Link { from, to, messages }
        }
        KIND_BATCH => {
            let count =
                message::count(&mut reader, "messages", max, 8 + message::MESSAGE_BYTES_MIN)?;
            let mut envelopes = Vec::with_capacity(count);
            for _ in 0..count {
                let from = NodeId(reader.u32("message sender")?);
                let to = NodeId(reader.u32("message receiver")?);
                envelopes.push((from, to, message::read_message(&mut reader, limits)?));
            }
            PeerFrame::Batch { envelopes }
        }
        tag => return Err(CodecError::UnknownTag { what: "frame kind", tag }.into()),
    };
    reader.finish()?;
    assert!(frame.message_count() <= limits.messages_per_frame_max as usize);
    Ok(frame)
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_types::{Epoch, LogIndex};
    use proptest::collection::vec;
    use proptest::prelude::*;

    fn frame() -> impl Strategy<Value = PeerFrame> {
        let node = || any::<u32>().prop_map(NodeId);
        prop_oneof![
            (node(), node(), vec(message::strategies::message(), 0..4))
                .prop_map(|(from, to, messages)| PeerFrame::Link { from, to, messages }),
            vec((node(), node(), message::strategies::message()), 0..4)
                .prop_map(|envelopes| PeerFrame::Batch { envelopes }),
        ]
    }

    proptest! {
        #[test]
        fn frames_round_trip_at_any_split(frame in frame(), cut in any::<prop::sample::Index>()) {
            let limits = PeerLimits::default();
            let mut bytes = Vec::new();
            encode_frame(&frame, &limits, &mut bytes).unwrap();
            let cut = cut.index(bytes.len());
            prop_assert_eq!(decode_frame(&bytes[..cut], &limits).unwrap(), None);
            prop_assert_eq!(decode_frame(&bytes, &limits).unwrap(), Some((frame, bytes.len())));
        }

        #[test]
        fn corrupt_bodies_with_valid_checksums_never_panic(
            frame in frame(),
            at in any::<prop::sample::Index>(),
            byte in any::<u8>(),
        ) {
            let limits = PeerLimits::default();
            let mut bytes = Vec::new();
            encode_frame(&frame, &limits, &mut bytes).unwrap();
            let at = HEADER_BYTES + at.index(bytes.len() - HEADER_BYTES);
            bytes[at] = byte;
            let crc = crc32c::crc32c(&bytes[HEADER_BYTES..]);
            bytes[4..HEADER_BYTES].copy_from_slice(&crc.to_le_bytes());
            let _ = decode_frame(&bytes, &limits);
        }
    }

    #[test]
    fn too_many_messages_are_refused_on_both_sides() {
        let limits = PeerLimits { messages_per_frame_max: 1, ..PeerLimits::default() };
        let frame =
            PeerFrame::Link { from: NodeId(1), to: NodeId(2), messages: vec![vote(), vote()] };
        let mut bytes = Vec::new();
        let err = encode_frame(&frame, &limits, &mut bytes).unwrap_err();
        assert!(matches!(err, PeerError::TooMany { what: "messages", count: 2, max: 1 }));
        encode_frame(&frame, &PeerLimits::default(), &mut bytes).unwrap();
        let err = decode_frame(&bytes, &limits).unwrap_err();
        assert!(matches!(err, PeerError::TooMany { what: "messages", count: 2, max: 1 }));
    }

    fn vote() -> Message {
        Message::Vote { epoch: Epoch(7), granted: true }
    }

    #[test]
    fn link_frame_layout_is_exact() {
        let frame = PeerFrame::Link { from: NodeId(1), to: NodeId(2), messages: vec![vote()] };
        let mut bytes = Vec::new();
        encode_frame(&frame, &PeerLimits::default(), &mut bytes).unwrap();
        let body: Vec<u8> = [
            &[FRAME_FORMAT_V1, KIND_LINK][..],
            &1u32.to_le_bytes(),
            &2u32.to_le_bytes(),
            &1u32.to_le_bytes(),
            &[2], // Vote
            &7u64.to_le_bytes(),
            &[1],
        ]
        .concat();
        assert_eq!(&bytes[..4], &(body.len() as u32).to_le_bytes());
        assert_eq!(&bytes[4..8], &crc32c::crc32c(&body).to_le_bytes());
        assert_eq!(&bytes[8..], &body[..]);
    }

    #[test]
    fn a_flipped_bit_fails_the_checksum() {
        let frame = PeerFrame::Batch { envelopes: vec![(NodeId(3), NodeId(1), vote())] };
        let mut bytes = Vec::new();
        encode_frame(&frame, &PeerLimits::default(), &mut bytes).unwrap();
        let (decoded, used) = decode_frame(&bytes, &PeerLimits::default()).unwrap().unwrap();
        assert_eq!((decoded, used), (frame, bytes.len()));
        let last = bytes.len() - 1;
        bytes[last] ^= 0x10;
        let err = decode_frame(&bytes, &PeerLimits::default()).unwrap_err();
        assert!(matches!(err, PeerError::Checksum { .. }));
    }

    #[test]
    fn oversized_frames_are_refused_on_both_sides() {
        let limits = PeerLimits { frame_bytes_max: 16, ..PeerLimits::default() };
        let messages = vec![
            Message::InstallSnapshotReply {
                epoch: Epoch(1),
                last_index: LogIndex(9),
                received: 0
            };
            2
        ];
        let frame = PeerFrame::Link { from: NodeId(1), to: NodeId(2), messages };
        let mut bytes = vec![0xAA];
        let err = encode_frame(&frame, &limits, &mut bytes).unwrap_err();
        assert!(matches!(err, PeerError::FrameTooLarge { max: 16, .. }));
        assert_eq!(bytes, [0xAA], "a refused frame leaves the buffer as it was");
        let header = [&u32::MAX.to_le_bytes()[..], &[0; 4]].concat();
        let err = decode_frame(&header, &limits).unwrap_err();
        assert!(matches!(err, PeerError::FrameTooLarge { .. }), "refused from the header alone");
    }
}
