//! The link's own envelope: the **peer protocol** a node speaks, announced as the first
//! envelope on every connection it dials, so that the receiver knows which messages the
//! sender can decode (`docs/operations.md`, *Rolling upgrade*).
//!
//! | protocol | what it added |
//! |---|---|
//! | 1 | everything before the announcement (no envelope is sent: its absence says 1) |
//! | 2 | leadership transfer: `TimeoutNow` (message tag 11), a transfer's vote (tag 12); this announcement |
//!
//! The envelope goes to [`LINK_KEYSPACE`], which no engine hosts: a node of protocol 1
//! drops it as a message for a keyspace it does not host and keeps the link, so a node of
//! the next protocol can join a cluster of the previous one. Its bytes: `b'V'`, then the
//! protocol as one byte. A node of protocol `n` decodes everything protocols `n - 1` and
//! `n` send; a feature of protocol `n` is used only once every member announced `n`.

use super::PeerEncode;
use keel_types::KeyspaceId;

/// The peer protocol this build speaks.
pub const PEER_PROTOCOL: u8 = 2;
/// The oldest peer protocol this build still works with (its messages decode here).
pub const PEER_PROTOCOL_MIN: u8 = 1;
/// The keyspace id of the link's own envelopes (the publish/subscribe fan-out has
/// `u32::MAX`).
pub const LINK_KEYSPACE: KeyspaceId = KeyspaceId(u32::MAX - 1);
/// The announcement's first byte.
const ANNOUNCE: u8 = b'V';

/// The announcement of the peer protocol the sender speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Announce(pub u8);

impl PeerEncode for Announce {
    fn encode_to(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&[ANNOUNCE, self.0]);
    }
}

impl Announce {
    /// Reads an announcement; `None` for anything else, or a protocol below the first one
    /// that announces (a forged or corrupt envelope changes nothing).
    pub fn decode(bytes: &[u8]) -> Option<Announce> {
        match bytes {
            [ANNOUNCE, protocol] if *protocol > PEER_PROTOCOL_MIN => Some(Announce(*protocol)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_announcement_round_trips_and_nothing_else_reads_as_one() {
        let mut out = Vec::new();
        Announce(PEER_PROTOCOL).encode_to(&mut out);
        assert_eq!(Announce::decode(&out), Some(Announce(PEER_PROTOCOL)));
        for bytes in [&b""[..], b"V", b"V\x01", b"V\x00", b"W\x02", b"V\x02\x00"] {
            assert_eq!(Announce::decode(bytes), None, "{bytes:?}");
        }
    }
}
