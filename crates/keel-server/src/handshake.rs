//! The peer handshake: before a node reads a single frame from a connection, the node
//! that dialed it proves that it is the member it claims to be and that it knows the
//! cluster secret, and the accepting node proves the same back. Pure: the bytes and the
//! random nonces come in, the bytes to send and the verdicts go out; `peer` does the I/O
//! (with a deadline on the whole exchange).
//!
//! ```text
//! dialer -> acceptor  Hello      "KEELHELO" version:u8=2 0 0 0 from:u32 to:u32 nonce_d[32] mac_h[32]
//! acceptor -> dialer  Challenge  "KEELCHAL" nonce_a[32] mac_a[32]
//! dialer -> acceptor  Proof      "KEELPROF" mac_d[32]
//! mac_h = HMAC-SHA256(secret, label_h || from || to || nonce_d)
//! mac_x = HMAC-SHA256(secret, label_x || from || to || nonce_d || nonce_a)   (x = a, d)
//! ```
//!
//! The hello's own MAC lets the acceptor check the member a connection claims to be on
//! its first message, with no round trip ([`verify_hello`]): `peer` gives a member's
//! handshake slot only to a connection whose hello verified. The hello alone is no proof
//! of freshness (a hello copied off the network verifies again); the challenge and proof
//! are. Each of their MACs covers both nonces (a recorded exchange cannot be replayed),
//! both node ids (a proof for one link is no proof for another) and a label of its own
//! side (the acceptor's MAC cannot be reflected back as the dialer's, nor the hello's
//! taken for either). MACs are compared in constant time. The handshake authenticates the connection, not each frame after it: an
//! attacker who can rewrite traffic on the path between two members is out of its reach
//! (`docs/security.md`). Without a configured secret the key is a fixed, public one: the
//! exchange then checks only the ids, which is what a loopback-only cluster gets.

use keel_types::NodeId;
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

/// Size of each nonce and each MAC.
pub const NONCE_BYTES: usize = 32;
/// Size of a hello on the wire.
pub const HELLO_BYTES: usize = 8 + 4 + 4 + 4 + NONCE_BYTES + NONCE_BYTES;
/// Size of a [`Challenge`] on the wire.
pub const CHALLENGE_BYTES: usize = 8 + NONCE_BYTES + NONCE_BYTES;
/// Size of a proof on the wire.
pub const PROOF_BYTES: usize = 8 + NONCE_BYTES;
/// The handshake version this build speaks.
pub const HANDSHAKE_VERSION: u8 = 2;
/// Fewest bytes a cluster secret may have.
pub const SECRET_BYTES_MIN: usize = 16;
/// Most bytes a cluster secret may have.
pub const SECRET_BYTES_MAX: usize = 4096;

const HELLO_MAGIC: &[u8; 8] = b"KEELHELO";
const CHALLENGE_MAGIC: &[u8; 8] = b"KEELCHAL";
const PROOF_MAGIC: &[u8; 8] = b"KEELPROF";
const HELLO_LABEL: &[u8] = b"keel peer hello v2";
const ACCEPTOR_LABEL: &[u8] = b"keel peer acceptor v2";
const DIALER_LABEL: &[u8] = b"keel peer dialer v2";
/// The key of a cluster configured without a secret: public, so it proves nothing.
const NO_SECRET: &[u8] = b"keel: no cluster secret configured";

/// Why a handshake failed (each is also the reason counted and logged).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandshakeError {
    /// Bytes that are not this handshake (wrong magic: not a Keel peer, or garbage).
    NotAHandshake,
    /// Another handshake version.
    Version,
    /// The hello names another node as its receiver, or a sender that is not a member.
    WrongNodes,
    /// A MAC that does not verify (the hello's, the challenge's or the proof's): the
    /// other side does not know the cluster secret.
    BadProof,
}

impl HandshakeError {
    /// The reason as counted.
    pub fn as_str(self) -> &'static str {
        match self {
            HandshakeError::NotAHandshake => "not a handshake",
            HandshakeError::Version => "handshake version",
            HandshakeError::WrongNodes => "wrong nodes",
            HandshakeError::BadProof => "bad proof",
        }
    }
}

impl std::fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The cluster secret as an HMAC key.
pub struct ClusterKey {
    key: hmac::Key,
    secret: bool,
}

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterKey").field("secret", &self.secret).finish_non_exhaustive()
    }
}

impl ClusterKey {
    /// The key of `secret` (its length checked by the configuration).
    pub fn new(secret: &[u8]) -> ClusterKey {
        ClusterKey { key: hmac::Key::new(hmac::HMAC_SHA256, secret), secret: true }
    }

    /// The public key of a cluster without a secret.
    pub fn none() -> ClusterKey {
        ClusterKey { key: hmac::Key::new(hmac::HMAC_SHA256, NO_SECRET), secret: false }
    }

    /// Whether a real secret is configured.
    pub fn is_secret(&self) -> bool {
        self.secret
    }

    fn mac(&self, label: &[u8], hello: &Hello, nonce_a: &[u8]) -> hmac::Tag {
        hmac::sign(&self.key, &transcript(label, hello, nonce_a))
    }

    fn verify(&self, label: &[u8], hello: &Hello, nonce_a: &[u8], mac: &[u8]) -> bool {
        hmac::verify(&self.key, &transcript(label, hello, nonce_a), mac).is_ok()
    }
}

/// What a MAC covers: its label, both node ids, the dialer's nonce and (for the
/// challenge's and the proof's, empty for the hello's) the acceptor's nonce.
fn transcript(label: &[u8], hello: &Hello, nonce_a: &[u8]) -> Vec<u8> {
    assert!(nonce_a.is_empty() || nonce_a.len() == NONCE_BYTES);
    let mut message = Vec::with_capacity(label.len() + 8 + 2 * NONCE_BYTES);
    message.extend_from_slice(label);
    message.extend_from_slice(&hello.from.0.to_le_bytes());
    message.extend_from_slice(&hello.to.0.to_le_bytes());
    message.extend_from_slice(&hello.nonce);
    message.extend_from_slice(nonce_a);
    message
}

/// A fresh nonce from the operating system's generator.
pub fn nonce() -> [u8; NONCE_BYTES] {
    let mut nonce = [0u8; NONCE_BYTES];
    SystemRandom::new().fill(&mut nonce).expect("the system random generator works");
    nonce
}

/// Whether `start` (the first 8 bytes of a connection) opens a hello: lets the acceptor
/// refuse what is not a Keel peer at once instead of waiting for a whole hello.
pub fn opens_hello(start: &[u8; 8]) -> bool {
    start == HELLO_MAGIC
}

/// The dialer's opening message (its MAC is made on encoding and checked on decoding).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    /// Who dials.
    pub from: NodeId,
    /// Whom it means to reach.
    pub to: NodeId,
    /// The dialer's nonce.
    pub nonce: [u8; NONCE_BYTES],
}

/// Where the hello's MAC starts.
const HELLO_MAC_AT: usize = HELLO_BYTES - NONCE_BYTES;

impl Hello {
    /// The bytes on the wire, with the hello's MAC made with `key`.
    pub fn encode(&self, key: &ClusterKey) -> [u8; HELLO_BYTES] {
        let mut out = [0u8; HELLO_BYTES];
        out[..8].copy_from_slice(HELLO_MAGIC);
        out[8] = HANDSHAKE_VERSION;
        out[12..16].copy_from_slice(&self.from.0.to_le_bytes());
        out[16..20].copy_from_slice(&self.to.0.to_le_bytes());
        out[20..HELLO_MAC_AT].copy_from_slice(&self.nonce);
        out[HELLO_MAC_AT..].copy_from_slice(key.mac(HELLO_LABEL, self, &[]).as_ref());
        out
    }

    /// Reads a hello and checks its form; its MAC is [`verify_hello`]'s to check.
    fn decode(bytes: &[u8; HELLO_BYTES]) -> Result<Hello, HandshakeError> {
        if &bytes[..8] != HELLO_MAGIC {
            return Err(HandshakeError::NotAHandshake);
        }
        if bytes[8] != HANDSHAKE_VERSION || bytes[9..12] != [0, 0, 0] {
            return Err(HandshakeError::Version);
        }
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4"));
        let mut nonce = [0u8; NONCE_BYTES];
        nonce.copy_from_slice(&bytes[20..HELLO_MAC_AT]);
        Ok(Hello { from: NodeId(u32_at(12)), to: NodeId(u32_at(16)), nonce })
    }
}

/// A hello whose ids and MAC verified: made by a holder of the cluster secret, as member
/// [`VerifiedHello::from`], for this node (but maybe copied off the network: the
/// challenge and proof tell a live member from a replay). Only [`verify_hello`] makes one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifiedHello(Hello);

impl VerifiedHello {
    /// The member the hello was made by.
    pub fn from(&self) -> NodeId {
        self.0.from
    }
}

/// Checks a hello's form, that it names `me` as its receiver and another member as its
/// sender, and its MAC (in constant time). Cheap (one HMAC of 62 bytes): the acceptor
/// runs it on every hello, before it spends anything else on the connection.
pub fn verify_hello(
    key: &ClusterKey,
    me: NodeId,
    members: &[NodeId],
    bytes: &[u8; HELLO_BYTES],
) -> Result<VerifiedHello, HandshakeError> {
    let hello = Hello::decode(bytes)?;
    if hello.to != me || hello.from == me || !members.contains(&hello.from) {
        return Err(HandshakeError::WrongNodes);
    }
    if !key.verify(HELLO_LABEL, &hello, &[], &bytes[HELLO_MAC_AT..]) {
        return Err(HandshakeError::BadProof);
    }
    Ok(VerifiedHello(hello))
}

/// The acceptor's side: answers a verified hello with a challenge, checks the proof.
#[derive(Debug)]
pub struct Acceptor<'a> {
    key: &'a ClusterKey,
    hello: Hello,
    nonce: [u8; NONCE_BYTES],
}

impl<'a> Acceptor<'a> {
    /// The acceptor of `hello`, with the challenge to send.
    pub fn new(
        key: &'a ClusterKey,
        hello: VerifiedHello,
        nonce: [u8; NONCE_BYTES],
    ) -> (Acceptor<'a>, [u8; CHALLENGE_BYTES]) {
        let VerifiedHello(hello) = hello;
        let mut challenge = [0u8; CHALLENGE_BYTES];
        challenge[..8].copy_from_slice(CHALLENGE_MAGIC);
        challenge[8..8 + NONCE_BYTES].copy_from_slice(&nonce);
        challenge[8 + NONCE_BYTES..]
            .copy_from_slice(key.mac(ACCEPTOR_LABEL, &hello, &nonce).as_ref());
        (Acceptor { key, hello, nonce }, challenge)
    }

    /// Checks the dialer's proof; the member it proved to be.
    pub fn finish(self, proof: &[u8; PROOF_BYTES]) -> Result<NodeId, HandshakeError> {
        if &proof[..8] != PROOF_MAGIC {
            return Err(HandshakeError::NotAHandshake);
        }
        if !self.key.verify(DIALER_LABEL, &self.hello, &self.nonce, &proof[8..]) {
            return Err(HandshakeError::BadProof);
        }
        Ok(self.hello.from)
    }
}

/// The dialer's side: the hello to send, then the proof in answer to the challenge.
#[derive(Debug)]
pub struct Dialer<'a> {
    key: &'a ClusterKey,
    hello: Hello,
}

impl<'a> Dialer<'a> {
    /// A dialer from `from` to `to`, and its hello.
    pub fn new(
        key: &'a ClusterKey,
        from: NodeId,
        to: NodeId,
        nonce: [u8; NONCE_BYTES],
    ) -> (Dialer<'a>, [u8; HELLO_BYTES]) {
        let hello = Hello { from, to, nonce };
        let bytes = hello.encode(key);
        (Dialer { key, hello }, bytes)
    }

    /// Checks the acceptor's challenge (it knows the secret) and returns the proof.
    pub fn answer(
        &self,
        challenge: &[u8; CHALLENGE_BYTES],
    ) -> Result<[u8; PROOF_BYTES], HandshakeError> {
        if &challenge[..8] != CHALLENGE_MAGIC {
            return Err(HandshakeError::NotAHandshake);
        }
        let nonce_a: [u8; NONCE_BYTES] =
            challenge[8..8 + NONCE_BYTES].try_into().expect("fixed layout");
        if !self.key.verify(ACCEPTOR_LABEL, &self.hello, &nonce_a, &challenge[8 + NONCE_BYTES..]) {
            return Err(HandshakeError::BadProof);
        }
        let mut proof = [0u8; PROOF_BYTES];
        proof[..8].copy_from_slice(PROOF_MAGIC);
        proof[8..].copy_from_slice(self.key.mac(DIALER_LABEL, &self.hello, &nonce_a).as_ref());
        Ok(proof)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMBERS: [NodeId; 3] = [NodeId(1), NodeId(2), NodeId(3)];

    /// Runs a whole exchange from node 2 to node 1 with the given keys.
    fn exchange(dialer_key: &ClusterKey, acceptor_key: &ClusterKey) -> Result<NodeId, String> {
        let (dialer, hello) = Dialer::new(dialer_key, NodeId(2), NodeId(1), nonce());
        let hello = verify_hello(acceptor_key, NodeId(1), &MEMBERS, &hello)
            .map_err(|e| format!("acceptor: {e}"))?;
        let (acceptor, challenge) = Acceptor::new(acceptor_key, hello, nonce());
        let proof = dialer.answer(&challenge).map_err(|e| format!("dialer: {e}"))?;
        acceptor.finish(&proof).map_err(|e| format!("acceptor: {e}"))
    }

    #[test]
    fn members_with_one_secret_agree_and_a_wrong_secret_fails_at_the_hello() {
        let key = ClusterKey::new(b"0123456789abcdef0123456789abcdef");
        assert_eq!(exchange(&key, &key), Ok(NodeId(2)));
        let other = ClusterKey::new(b"0123456789abcdef0123456789abcdeF");
        assert_eq!(exchange(&other, &key), Err("acceptor: bad proof".into()));
        assert_eq!(exchange(&ClusterKey::none(), &key), Err("acceptor: bad proof".into()));
        assert_eq!(exchange(&key, &ClusterKey::none()), Err("acceptor: bad proof".into()));
        assert_eq!(exchange(&ClusterKey::none(), &ClusterKey::none()), Ok(NodeId(2)));
    }

    #[test]
    fn a_copied_hello_verifies_again_but_cannot_finish_a_handshake() {
        let key = ClusterKey::new(b"a cluster secret of enough bytes");
        let other = ClusterKey::new(b"another secret, of enough bytes!");
        let (dialer, hello) = Dialer::new(&key, NodeId(2), NodeId(1), nonce());
        let verified = verify_hello(&key, NodeId(1), &MEMBERS, &hello).unwrap();
        let (acceptor, challenge) = Acceptor::new(&key, verified, nonce());
        let proof = dialer.answer(&challenge).unwrap();
        assert_eq!(acceptor.finish(&proof), Ok(NodeId(2)));
        // The same bytes again (a replay): the hello verifies, so it may claim member 2's
        // slot; the old proof does not answer the new challenge, nor does one made
        // without the secret.
        let again = verify_hello(&key, NodeId(1), &MEMBERS, &hello).expect("a replay verifies");
        assert_eq!(again.from(), NodeId(2));
        let (acceptor, challenge) = Acceptor::new(&key, again, nonce());
        assert_eq!(acceptor.finish(&proof), Err(HandshakeError::BadProof));
        let nonce_a: [u8; NONCE_BYTES] = challenge[8..40].try_into().unwrap();
        let hello = Hello::decode(&hello).unwrap();
        let mut forged = [0u8; PROOF_BYTES];
        forged[..8].copy_from_slice(PROOF_MAGIC);
        forged[8..].copy_from_slice(other.mac(DIALER_LABEL, &hello, &nonce_a).as_ref());
        let again = verify_hello(&key, NodeId(1), &MEMBERS, &hello.encode(&key)).unwrap();
        let (acceptor, _) = Acceptor::new(&key, again, nonce_a);
        assert_eq!(acceptor.finish(&forged), Err(HandshakeError::BadProof));
    }

    #[test]
    fn a_hello_changed_anywhere_or_its_mac_used_elsewhere_does_not_verify() {
        let key = ClusterKey::new(b"a cluster secret of enough bytes");
        let (_, hello) = Dialer::new(&key, NodeId(2), NodeId(1), nonce());
        for at in [12, 16, 20, 51, 52, 83] {
            let mut changed = hello;
            changed[at] ^= 1;
            let verdict = verify_hello(&key, NodeId(1), &MEMBERS, &changed);
            assert!(verdict.is_err(), "byte {at} changed: {verdict:?}");
        }
        // Member 2's hello to node 1, readdressed to node 3 or sent as member 3's: refused.
        let mut readdressed = hello;
        readdressed[16..20].copy_from_slice(&3u32.to_le_bytes());
        let verdict = verify_hello(&key, NodeId(3), &MEMBERS, &readdressed);
        assert_eq!(verdict, Err(HandshakeError::BadProof));
        let mut impersonating = hello;
        impersonating[12..16].copy_from_slice(&3u32.to_le_bytes());
        let verdict = verify_hello(&key, NodeId(1), &MEMBERS, &impersonating);
        assert_eq!(verdict, Err(HandshakeError::BadProof));
        // The hello's MAC is not the acceptor's nor the dialer's for the same nonces.
        let decoded = Hello::decode(&hello).unwrap();
        let mac = &hello[HELLO_MAC_AT..];
        assert!(!key.verify(ACCEPTOR_LABEL, &decoded, &[], mac));
        assert!(!key.verify(DIALER_LABEL, &decoded, &[], mac));
    }

    #[test]
    fn the_acceptors_mac_cannot_be_reflected_or_replayed() {
        let key = ClusterKey::new(b"a cluster secret of enough bytes");
        let (dialer, hello) = Dialer::new(&key, NodeId(2), NodeId(1), nonce());
        let verified = verify_hello(&key, NodeId(1), &MEMBERS, &hello).expect("well formed");
        let (acceptor, challenge) = Acceptor::new(&key, verified.clone(), nonce());
        // Reflection: the acceptor's own MAC sent back as the proof.
        let mut reflected = [0u8; PROOF_BYTES];
        reflected[..8].copy_from_slice(PROOF_MAGIC);
        reflected[8..].copy_from_slice(&challenge[40..]);
        assert_eq!(acceptor.finish(&reflected), Err(HandshakeError::BadProof));
        // Replay: a proof from one exchange does not finish another with a new nonce.
        let proof = dialer.answer(&challenge).unwrap();
        let (again, _) = Acceptor::new(&key, verified, nonce());
        assert_eq!(again.finish(&proof), Err(HandshakeError::BadProof));
    }

    #[test]
    fn hellos_for_other_nodes_or_from_strangers_or_garbage_are_refused() {
        let key = ClusterKey::none();
        let hello = |from, to| Hello { from: NodeId(from), to: NodeId(to), nonce: [7; 32] };
        let verify = |bytes: [u8; HELLO_BYTES]| {
            verify_hello(&key, NodeId(1), &MEMBERS, &bytes).map(|hello| hello.from())
        };
        assert_eq!(verify(hello(2, 1).encode(&key)), Ok(NodeId(2)));
        assert_eq!(verify(hello(2, 3).encode(&key)), Err(HandshakeError::WrongNodes));
        assert_eq!(verify(hello(9, 1).encode(&key)), Err(HandshakeError::WrongNodes));
        assert_eq!(verify(hello(1, 1).encode(&key)), Err(HandshakeError::WrongNodes));
        assert_eq!(verify([0; HELLO_BYTES]), Err(HandshakeError::NotAHandshake));
        let mut versioned = hello(2, 1).encode(&key);
        versioned[8] = 1; // a version-1 node's hello
        assert_eq!(verify(versioned), Err(HandshakeError::Version));
        // An old node's peer frame (length, checksum, ...) is not a hello.
        let mut frame = [0u8; HELLO_BYTES];
        frame[..4].copy_from_slice(&35u32.to_le_bytes());
        assert_eq!(verify(frame), Err(HandshakeError::NotAHandshake));
        let decoded = Hello::decode(&hello(2, 1).encode(&key)).unwrap();
        assert_eq!(decoded, hello(2, 1));
        // Without a secret the key is public: anyone makes a hello that verifies.
        let public = ClusterKey::none();
        assert_eq!(verify(hello(3, 1).encode(&public)), Ok(NodeId(3)));
    }
}
