//! The peer handshake on whatever bytes the other side sends, in either role: refusals
//! are errors, and a hello, challenge or proof the secret did not make never verifies
//! (the corpus holds one hello the secret made, so that proofs after it are explored).
#![no_main]

use keel_server::handshake::{
    verify_hello, Acceptor, ClusterKey, Dialer, CHALLENGE_BYTES, HELLO_BYTES, NONCE_BYTES,
    PROOF_BYTES,
};
use keel_types::NodeId;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let key = ClusterKey::new(b"the secret of the fuzzed cluster");
    let members = [NodeId(1), NodeId(2), NodeId(3)];
    let mut hello = [0u8; HELLO_BYTES];
    let n = data.len().min(HELLO_BYTES);
    hello[..n].copy_from_slice(&data[..n]);
    let rest = &data[n..];
    if let Ok(verified) = verify_hello(&key, NodeId(1), &members, &hello) {
        let (acceptor, _challenge) = Acceptor::new(&key, verified, [3; NONCE_BYTES]);
        let mut proof = [0u8; PROOF_BYTES];
        let m = rest.len().min(PROOF_BYTES);
        proof[..m].copy_from_slice(&rest[..m]);
        assert!(acceptor.finish(&proof).is_err(), "a forged proof verified");
    }
    let (dialer, _) = Dialer::new(&key, NodeId(2), NodeId(1), [5; NONCE_BYTES]);
    let mut challenge = [0u8; CHALLENGE_BYTES];
    let c = data.len().min(CHALLENGE_BYTES);
    challenge[..c].copy_from_slice(&data[..c]);
    assert!(dialer.answer(&challenge).is_err(), "a forged challenge verified");
});
