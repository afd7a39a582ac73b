//! The link's own envelope: the **peer protocol** a node speaks, announced as the first
//! envelope on every connection it dials, so that the receiver knows which messages the
//! sender can decode (`docs/operations.md`, *Rolling upgrade*).
//!
//! | protocol | what it added |
//! |---|---|
//! | 1 | everything before the announcement (no envelope is sent: its absence says 1) |
//! | 2 | leadership transfer: `TimeoutNow` (message tag 11), a transfer's vote (tag 12); this announcement |
//! | 3 | leader notices ([`LeaderNotice`], keyspace [`LEADERS_KEYSPACE`]): which keyspaces the sender leads, for the members that do not host them |
//!
//! The envelope goes to [`LINK_KEYSPACE`], which no engine hosts: a node of protocol 1
//! drops it as a message for a keyspace it does not host and keeps the link, so a node of
//! the next protocol can join a cluster of the previous one. Its bytes: `b'V'`, then the
//! protocol as one byte. A node of protocol `n` decodes everything protocols `n - 1` and
//! `n` send; a feature of protocol `n` is used only once every member announced `n`.

use super::PeerEncode;
use keel_types::KeyspaceId;

/// The peer protocol this build speaks: 2 added leadership transfer, 3 leader notices, 4
/// slot moves (log entries of their steps and of requests sent on by `ASK`, and the slot
/// refusals a leader answers a forwarded request with).
pub const PEER_PROTOCOL: u8 = 4;
/// The peer protocol that brought slot moves: `KEEL.SLOTS` waits for every member at it.
pub const SLOTS_PROTOCOL: u8 = 4;
/// The oldest peer protocol this build still works with (its messages decode here).
pub const PEER_PROTOCOL_MIN: u8 = 1;
/// The keyspace id of the link's own envelopes (the publish/subscribe fan-out has
/// `u32::MAX`).
pub const LINK_KEYSPACE: KeyspaceId = KeyspaceId(u32::MAX - 1);
/// The announcement's first byte.
const ANNOUNCE: u8 = b'V';
/// The keyspace id of leader notices (protocol 3).
pub const LEADERS_KEYSPACE: KeyspaceId = KeyspaceId(u32::MAX - 2);
/// The first protocol whose nodes decode leader notices: none is sent to an older one.
pub const LEADER_NOTICES_PROTOCOL: u8 = 3;
/// Most keyspaces one leader notice names (a node hosts at most 64).
pub const NOTICE_KEYSPACES_MAX: usize = 64;
/// A leader notice's first byte.
const NOTICE: u8 = b'L';

/// A node's word that it leads these keyspaces, each in this epoch: how the members that
/// do not host a keyspace learn where its clients should go (a sharded cluster's
/// `MOVED`, `CLUSTER SLOTS`), and the digest of the placement its configuration names,
/// which a receiver compares with its own. A hint only: nothing safe depends on it. Its
/// bytes: `b'L'`, the digest (u32), the count as one byte, then per keyspace its id (u32)
/// and the epoch (u64), little-endian.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderNotice {
    /// The digest of the sender's placement.
    pub placement: u32,
    /// The keyspaces it leads, each with its epoch.
    pub led: Vec<(KeyspaceId, u64)>,
}

impl PeerEncode for LeaderNotice {
    fn encode_to(&self, out: &mut Vec<u8>) {
        assert!(self.led.len() <= NOTICE_KEYSPACES_MAX, "{} keyspaces", self.led.len());
        out.push(NOTICE);
        out.extend_from_slice(&self.placement.to_le_bytes());
        out.push(self.led.len() as u8);
        for (keyspace, epoch) in &self.led {
            out.extend_from_slice(&keyspace.0.to_le_bytes());
            out.extend_from_slice(&epoch.to_le_bytes());
        }
    }
}

impl LeaderNotice {
    /// Reads a notice; `None` for anything else (a wrong length, too many keyspaces).
    pub fn decode(bytes: &[u8]) -> Option<LeaderNotice> {
        let [NOTICE, d0, d1, d2, d3, count, rest @ ..] = bytes else { return None };
        let placement = u32::from_le_bytes([*d0, *d1, *d2, *d3]);
        let count = usize::from(*count);
        if count > NOTICE_KEYSPACES_MAX || rest.len() != count * 12 {
            return None;
        }
        let entries = rest
            .chunks_exact(12)
            .map(|c| {
                let id = u32::from_le_bytes(c[..4].try_into().expect("4 bytes"));
                let epoch = u64::from_le_bytes(c[4..].try_into().expect("8 bytes"));
                (KeyspaceId(id), epoch)
            })
            .collect();
        Some(LeaderNotice { placement, led: entries })
    }
}

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

    #[test]
    fn a_leader_notice_round_trips_and_malformed_ones_read_as_none() {
        let led = vec![(KeyspaceId(0), 7), (KeyspaceId(3), u64::MAX)];
        let notice = LeaderNotice { placement: 0xDEAD_BEEF, led };
        let mut out = Vec::new();
        notice.encode_to(&mut out);
        assert_eq!(out.len(), 6 + 2 * 12);
        assert_eq!(LeaderNotice::decode(&out), Some(notice));
        let none = LeaderNotice { placement: 1, led: Vec::new() };
        assert_eq!(LeaderNotice::decode(b"L\x01\x00\x00\x00\x00"), Some(none));
        let mut long = vec![NOTICE, 0, 0, 0, 0, 65];
        long.extend(std::iter::repeat_n(0u8, 65 * 12));
        for bytes in
            [&b""[..], b"L", b"L\x01\x00\x00\x00\x01", b"V\x03", &out[..out.len() - 1], &long]
        {
            assert_eq!(LeaderNotice::decode(bytes), None, "{bytes:?}");
        }
    }
}
