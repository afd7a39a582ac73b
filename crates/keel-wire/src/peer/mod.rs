//! Peer frames: how nodes carry every keyspace's engine messages over one TCP connection
//! per pair of nodes, batched and pipelined.
//!
//! Layout:
//! - this file: the frame ([`PeerFrame`] to write, [`FrameView`] as read), its limits
//!   ([`PeerLimits`]), its errors ([`PeerError`]), the [`PeerMessage`] trait an engine's
//!   message type implements, [`encode_frame`] and [`decode_frame`].
//! - `kite`: the encoding of `keel_core::kite::Message` (a format byte, then postcard).
//! - `geo`: the encoding of `keel_core::geo::Message` (a format byte, then postcard).
//! - `link`: the link's own envelope, the peer protocol a node speaks.
//! - `message`: the encoding of every `keel_core::leader::Message` variant (one file, so
//!   that a new field is one edit; its round-trip property test names every field).
//!
//! Byte layout (integers little-endian, as `keel_types::codec`):
//!
//! ```text
//! offset  size  field
//! 0       4     body_len: u32, bytes after this 8-byte header
//! 4       4     crc32c: u32, CRC32C (Castagnoli) of the body
//! 8       1     format version: 2
//! 9       1     kind: 1 = link (one sender, one receiver)
//! 10      4     from: u32
//! 14      4     to: u32
//! 18      4     count: u32, then count envelopes:
//!               keyspace u32, len u32, len bytes of the keyspace's engine message
//! ```
//!
//! The frame does not know engine kinds: each envelope's bytes are decoded by the codec
//! of the engine its keyspace runs ([`PeerMessage::decode`]), so one connection carries
//! several keyspaces of several kinds. `body_len` is checked against
//! [`PeerLimits::frame_bytes_max`] as soon as the header is in, before waiting for or
//! allocating the body; every count and length is checked against its limit and against
//! the bytes left before anything is reserved for it.

mod geo;
mod kite;
mod link;
mod message;

pub use geo::GEO_FORMAT_V1;
pub use kite::KITE_FORMAT_V4;
pub use link::{
    Announce, LeaderNotice, LEADERS_KEYSPACE, LEADER_NOTICES_PROTOCOL, LINK_KEYSPACE,
    NOTICE_KEYSPACES_MAX, PEER_PROTOCOL, PEER_PROTOCOL_MIN, SLOTS_PROTOCOL,
};

use keel_types::codec::{put_u32, put_u8, CodecError, Reader};
use keel_types::{KeyspaceId, NodeId};

/// Bytes before the body: its length and its checksum.
pub const HEADER_BYTES: usize = 8;
/// The only frame format this version writes and reads (1 had no keyspaces).
pub const FRAME_FORMAT_V2: u8 = 2;
/// Frame kind: messages from one node to one node.
pub const KIND_LINK: u8 = 1;
/// Default largest frame body: 256 MiB, room for a snapshot chunk and a full batch.
pub const FRAME_BYTES_MAX_DEFAULT: u32 = 256 * 1024 * 1024;
/// Default most messages in one frame.
pub const MESSAGES_PER_FRAME_MAX_DEFAULT: u32 = 4096;
/// Default most log entries in one `Append`.
pub const ENTRIES_PER_MESSAGE_MAX_DEFAULT: u32 = 65_536;
/// Longest text (an error's reason) inside a message.
pub const TEXT_BYTES_MAX: u32 = 64 * 1024;
/// Fewest bytes an envelope takes: its keyspace, its length and a one-byte message.
const ENVELOPE_BYTES_MIN: u64 = 4 + 4 + 1;

const _: () = assert!(FRAME_BYTES_MAX_DEFAULT as usize > HEADER_BYTES);
const _: () = assert!(MESSAGES_PER_FRAME_MAX_DEFAULT <= FRAME_BYTES_MAX_DEFAULT);

/// Appends `message` as its format byte, then its postcard encoding (the engines whose
/// messages follow their serde types: Kite's, the geo engine's).
pub(crate) fn postcard_encode<T: serde::Serialize>(format: u8, message: &T, out: &mut Vec<u8>) {
    out.push(format);
    let bytes = postcard::to_allocvec(message).expect("an engine message always serializes");
    out.extend_from_slice(&bytes);
}

/// Decodes exactly `bytes` as [`postcard_encode`] wrote a message of `format` (`what`
/// names it in errors): another format byte is refused by number, a body past the frame
/// bound or with bytes after the message is malformed.
pub(crate) fn postcard_decode<T: serde::de::DeserializeOwned>(
    format: u8,
    what: &str,
    bytes: &[u8],
    limits: &PeerLimits,
) -> Result<T, PeerError> {
    let (&found, body) =
        bytes.split_first().ok_or_else(|| PeerError::Malformed(format!("empty {what}")))?;
    if found != format {
        return Err(PeerError::UnknownVersion(found));
    }
    if body.len() as u64 > u64::from(limits.frame_bytes_max) {
        return Err(PeerError::FrameTooLarge {
            len: body.len() as u64,
            max: limits.frame_bytes_max,
        });
    }
    let (message, rest) = postcard::take_from_bytes::<T>(body)
        .map_err(|e| PeerError::Malformed(format!("{what}: {e}")))?;
    if !rest.is_empty() {
        return Err(PeerError::Malformed(format!("{} bytes after a {what}", rest.len())));
    }
    Ok(message)
}

/// An engine's peer message as it travels: every engine kind's message type implements
/// this (the leader engine's in `message`).
pub trait PeerMessage: Sized {
    /// Appends the message's encoding.
    fn encode(&self, out: &mut Vec<u8>);
    /// Decodes one message from exactly `bytes` (trailing bytes are an error).
    fn decode(bytes: &[u8], limits: &PeerLimits) -> Result<Self, PeerError>;
    /// Bytes of client values the message carries that no protocol step waits on (the
    /// value in the reply to a forwarded request): a link may refuse to queue more of
    /// these than it can send soon, so that they do not hold back the messages that keep
    /// the cluster live. 0 (the default): a protocol message, always queued.
    fn bulk_bytes(&self) -> usize {
        0
    }
    /// What to send instead when a link refuses this message's bulk (a short error
    /// reply to the same request); `None`: nothing (the waiting side times out).
    fn shed(&self) -> Option<Self> {
        None
    }
}

/// The object-safe half of [`PeerMessage`], for queues that carry several engine kinds.
pub trait PeerEncode: Send + Sync {
    /// Appends the message's encoding.
    fn encode_to(&self, out: &mut Vec<u8>);
}

impl<T: PeerMessage + Send + Sync> PeerEncode for T {
    fn encode_to(&self, out: &mut Vec<u8>) {
        self.encode(out);
    }
}

/// One message on its way: the keyspace it belongs to and the message.
pub struct Outgoing {
    /// The keyspace.
    pub keyspace: KeyspaceId,
    /// The message, encoded by the sender's task.
    pub message: Box<dyn PeerEncode>,
}

impl std::fmt::Debug for Outgoing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outgoing").field("keyspace", &self.keyspace).finish_non_exhaustive()
    }
}

/// One frame's worth of messages from `from` to `to`, in send order: what one
/// connection between two nodes carries.
#[derive(Debug)]
pub struct PeerFrame<'a> {
    /// The sender.
    pub from: NodeId,
    /// The receiver.
    pub to: NodeId,
    /// The messages, in send order.
    pub messages: &'a [Outgoing],
}

/// A frame as read: the sender, the receiver, and each envelope's keyspace and message
/// bytes (borrowed from the buffer; decode each with its keyspace's engine codec).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameView<'a> {
    /// The sender.
    pub from: NodeId,
    /// The receiver.
    pub to: NodeId,
    /// `(keyspace, message bytes)` in send order.
    pub envelopes: Vec<(KeyspaceId, &'a [u8])>,
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
    /// The peer protocol this node speaks (`link`): a message a later protocol added is
    /// refused as an older build would refuse it. [`PEER_PROTOCOL`] but in upgrade tests.
    pub protocol: u8,
}

impl Default for PeerLimits {
    fn default() -> Self {
        PeerLimits {
            frame_bytes_max: FRAME_BYTES_MAX_DEFAULT,
            messages_per_frame_max: MESSAGES_PER_FRAME_MAX_DEFAULT,
            entries_per_message_max: ENTRIES_PER_MESSAGE_MAX_DEFAULT,
            protocol: PEER_PROTOCOL,
        }
    }
}

/// Why a peer frame or message was refused. On decode, the link is out of step or its
/// bytes are corrupt: close the connection and reconnect (the engine retries what was
/// lost); a message that does not decode is dropped. On encode, the frame is too big:
/// send its messages in smaller frames.
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
    /// A message that does not decode as its engine kind's (named in the text).
    #[error("malformed peer message: {0}")]
    Malformed(String),
}

/// Appends `frame` to `out`. Refuses (and leaves `out` as it was) a frame over the limits.
pub fn encode_frame(
    frame: &PeerFrame<'_>,
    limits: &PeerLimits,
    out: &mut Vec<u8>,
) -> Result<(), PeerError> {
    let count = frame.messages.len();
    if count as u64 > u64::from(limits.messages_per_frame_max) {
        let max = limits.messages_per_frame_max;
        return Err(PeerError::TooMany { what: "messages", count: count as u64, max });
    }
    let start = out.len();
    out.extend_from_slice(&[0; HEADER_BYTES]);
    put_u8(out, FRAME_FORMAT_V2);
    put_u8(out, KIND_LINK);
    put_u32(out, frame.from.0);
    put_u32(out, frame.to.0);
    put_u32(out, count as u32);
    for outgoing in frame.messages {
        put_u32(out, outgoing.keyspace.0);
        let len_at = out.len();
        put_u32(out, 0);
        outgoing.message.encode_to(out);
        let len = out.len() - len_at - 4;
        if len as u64 > u64::from(limits.frame_bytes_max) {
            break; // refused below: the frame is too large whatever follows
        }
        out[len_at..len_at + 4].copy_from_slice(&(len as u32).to_le_bytes());
    }
    let body_len = out.len() - start - HEADER_BYTES;
    if body_len as u64 > u64::from(limits.frame_bytes_max) {
        out.truncate(start);
        return Err(PeerError::FrameTooLarge { len: body_len as u64, max: limits.frame_bytes_max });
    }
    let crc = crc32c::crc32c(&out[start + HEADER_BYTES..]);
    out[start..start + 4].copy_from_slice(&(body_len as u32).to_le_bytes());
    out[start + 4..start + HEADER_BYTES].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// Reads one frame from the front of `buf`: `Ok(None)` when more bytes are needed,
/// `Ok(Some((frame, consumed)))` when a whole frame was read.
pub fn decode_frame<'a>(
    buf: &'a [u8],
    limits: &PeerLimits,
) -> Result<Option<(FrameView<'a>, usize)>, PeerError> {
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
    debug_assert!(frame.envelopes.len() <= limits.messages_per_frame_max as usize);
    Ok(Some((frame, end)))
}

/// Decodes a checksummed body.
fn decode_body<'a>(body: &'a [u8], limits: &PeerLimits) -> Result<FrameView<'a>, PeerError> {
    let mut reader = Reader::new(body);
    let version = reader.u8("frame format version")?;
    if version != FRAME_FORMAT_V2 {
        return Err(PeerError::UnknownVersion(version));
    }
    let kind = reader.u8("frame kind")?;
    if kind != KIND_LINK {
        return Err(CodecError::UnknownTag { what: "frame kind", tag: kind }.into());
    }
    let from = NodeId(reader.u32("frame sender")?);
    let to = NodeId(reader.u32("frame receiver")?);
    let max = limits.messages_per_frame_max;
    let count = message::count(&mut reader, "messages", max, ENVELOPE_BYTES_MIN)?;
    let mut envelopes = Vec::with_capacity(count);
    for _ in 0..count {
        let keyspace = KeyspaceId(reader.u32("envelope keyspace")?);
        let len = reader.u32("envelope length")?;
        envelopes.push((keyspace, reader.take("envelope message", u64::from(len))?));
    }
    reader.finish()?;
    assert!(envelopes.len() <= max as usize);
    Ok(FrameView { from, to, envelopes })
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_core::leader::Message;
    use keel_types::{Epoch, LogIndex};
    use proptest::collection::vec;
    use proptest::prelude::*;

    fn outgoing(keyspace: u32, message: Message) -> Outgoing {
        Outgoing { keyspace: KeyspaceId(keyspace), message: Box::new(message) }
    }

    fn frame_bytes(messages: &[Outgoing], limits: &PeerLimits) -> Result<Vec<u8>, PeerError> {
        let mut bytes = Vec::new();
        let frame = PeerFrame { from: NodeId(1), to: NodeId(2), messages };
        encode_frame(&frame, limits, &mut bytes)?;
        Ok(bytes)
    }

    /// Decodes every envelope of a frame as a leader-engine message.
    fn messages_of(view: &FrameView<'_>) -> Vec<(KeyspaceId, Message)> {
        view.envelopes
            .iter()
            .map(|(ks, bytes)| (*ks, Message::decode(bytes, &PeerLimits::default()).unwrap()))
            .collect()
    }

    proptest! {
        #[test]
        fn frames_round_trip_at_any_split(
            messages in vec((0u32..4, message::strategies::message()), 0..4),
            cut in any::<prop::sample::Index>(),
        ) {
            let limits = PeerLimits::default();
            let out: Vec<Outgoing> =
                messages.iter().map(|(ks, m)| outgoing(*ks, m.clone())).collect();
            let bytes = frame_bytes(&out, &limits).unwrap();
            let cut = cut.index(bytes.len());
            prop_assert_eq!(decode_frame(&bytes[..cut], &limits).unwrap(), None);
            let (view, used) = decode_frame(&bytes, &limits).unwrap().unwrap();
            prop_assert_eq!(used, bytes.len());
            prop_assert_eq!((view.from, view.to), (NodeId(1), NodeId(2)));
            let decoded = messages_of(&view);
            let expected: Vec<(KeyspaceId, Message)> =
                messages.into_iter().map(|(ks, m)| (KeyspaceId(ks), m)).collect();
            prop_assert_eq!(decoded, expected);
        }

        #[test]
        fn corrupt_bodies_with_valid_checksums_never_panic(
            messages in vec((0u32..4, message::strategies::message()), 1..4),
            at in any::<prop::sample::Index>(),
            byte in any::<u8>(),
        ) {
            let limits = PeerLimits::default();
            let out: Vec<Outgoing> = messages.into_iter().map(|(ks, m)| outgoing(ks, m)).collect();
            let mut bytes = frame_bytes(&out, &limits).unwrap();
            let at = HEADER_BYTES + at.index(bytes.len() - HEADER_BYTES);
            bytes[at] = byte;
            let crc = crc32c::crc32c(&bytes[HEADER_BYTES..]);
            bytes[4..HEADER_BYTES].copy_from_slice(&crc.to_le_bytes());
            if let Ok(Some((view, _))) = decode_frame(&bytes, &limits) {
                for (_, body) in view.envelopes {
                    let _ = Message::decode(body, &limits);
                }
            }
        }
    }

    #[test]
    fn too_many_messages_are_refused_on_both_sides() {
        let limits = PeerLimits { messages_per_frame_max: 1, ..PeerLimits::default() };
        let out = [outgoing(0, vote()), outgoing(0, vote())];
        let err = frame_bytes(&out, &limits).unwrap_err();
        assert!(matches!(err, PeerError::TooMany { what: "messages", count: 2, max: 1 }));
        let bytes = frame_bytes(&out, &PeerLimits::default()).unwrap();
        let err = decode_frame(&bytes, &limits).unwrap_err();
        assert!(matches!(err, PeerError::TooMany { what: "messages", count: 2, max: 1 }));
    }

    fn vote() -> Message {
        Message::Vote { epoch: Epoch(7), granted: true }
    }

    #[test]
    fn link_frame_layout_is_exact() {
        let bytes = frame_bytes(&[outgoing(3, vote())], &PeerLimits::default()).unwrap();
        let body: Vec<u8> = [
            &[FRAME_FORMAT_V2, KIND_LINK][..],
            &1u32.to_le_bytes(),
            &2u32.to_le_bytes(),
            &1u32.to_le_bytes(),
            &3u32.to_le_bytes(),  // keyspace
            &10u32.to_le_bytes(), // message length
            &[2],                 // Vote
            &7u64.to_le_bytes(),
            &[1],
        ]
        .concat();
        assert_eq!(&bytes[..4], &(body.len() as u32).to_le_bytes());
        assert_eq!(&bytes[4..8], &crc32c::crc32c(&body).to_le_bytes());
        assert_eq!(&bytes[8..], &body[..]);
    }

    #[test]
    fn a_flipped_bit_fails_the_checksum_and_an_old_format_is_refused() {
        let mut bytes = frame_bytes(&[outgoing(0, vote())], &PeerLimits::default()).unwrap();
        let (view, used) = decode_frame(&bytes, &PeerLimits::default()).unwrap().unwrap();
        assert_eq!((messages_of(&view), used), (vec![(KeyspaceId(0), vote())], bytes.len()));
        let last = bytes.len() - 1;
        bytes[last] ^= 0x10;
        let err = decode_frame(&bytes, &PeerLimits::default()).unwrap_err();
        assert!(matches!(err, PeerError::Checksum { .. }));
        let mut old = frame_bytes(&[outgoing(0, vote())], &PeerLimits::default()).unwrap();
        old[HEADER_BYTES] = 1;
        let crc = crc32c::crc32c(&old[HEADER_BYTES..]);
        old[4..HEADER_BYTES].copy_from_slice(&crc.to_le_bytes());
        let err = decode_frame(&old, &PeerLimits::default()).unwrap_err();
        assert_eq!(err, PeerError::UnknownVersion(1));
    }

    #[test]
    fn oversized_frames_are_refused_on_both_sides() {
        let limits = PeerLimits { frame_bytes_max: 16, ..PeerLimits::default() };
        let reply =
            Message::InstallSnapshotReply { epoch: Epoch(1), last_index: LogIndex(9), received: 0 };
        let out = [outgoing(0, reply.clone()), outgoing(0, reply)];
        let mut bytes = vec![0xAA];
        let frame = PeerFrame { from: NodeId(1), to: NodeId(2), messages: &out };
        let err = encode_frame(&frame, &limits, &mut bytes).unwrap_err();
        assert!(matches!(err, PeerError::FrameTooLarge { max: 16, .. }));
        assert_eq!(bytes, [0xAA], "a refused frame leaves the buffer as it was");
        let header = [&u32::MAX.to_le_bytes()[..], &[0; 4]].concat();
        let err = decode_frame(&header, &limits).unwrap_err();
        assert!(matches!(err, PeerError::FrameTooLarge { .. }), "refused from the header alone");
    }

    #[test]
    fn an_envelope_longer_than_the_frame_is_refused() {
        let mut bytes = frame_bytes(&[outgoing(0, vote())], &PeerLimits::default()).unwrap();
        let len_at = HEADER_BYTES + 2 + 4 + 4 + 4 + 4;
        bytes[len_at..len_at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        let crc = crc32c::crc32c(&bytes[HEADER_BYTES..]);
        bytes[4..HEADER_BYTES].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(
            decode_frame(&bytes, &PeerLimits::default()),
            Err(PeerError::Codec(CodecError::Truncated { .. }))
        ));
    }
}
