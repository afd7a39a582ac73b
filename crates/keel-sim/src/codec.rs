//! Every peer message the simulator carries crosses the real codec, as it crosses a
//! server's peer link: encoded by the sender (`keel_wire::peer::PeerMessage::encode`),
//! decoded by the receiver under the server's default limits, and put through the
//! stateless half of the receiver's validation gate (`Engine::check_message`), as a
//! server's peer task does before its engine loop sees the message. A message an engine
//! wrote that does not decode to itself, whose encoding is not canonical, or that the
//! gate refuses is a violation: a codec or an engine that breaks its own rules.

use keel_core::engine::Engine;
use keel_wire::peer::{PeerLimits, PeerMessage};

/// The message as the receiver gets it from the sender's bytes, with the encoding's
/// length; `Err` says what went wrong.
pub fn across<E: Engine>(message: &E::Message) -> Result<(E::Message, usize), String>
where
    E::Message: PeerMessage,
{
    let mut bytes = Vec::new();
    message.encode(&mut bytes);
    let decoded = E::Message::decode(&bytes, &PeerLimits::default())
        .map_err(|e| format!("a message does not decode ({e}): {message:?}"))?;
    if decoded != *message {
        return Err(format!("a message decodes to another: {message:?} became {decoded:?}"));
    }
    let mut again = Vec::with_capacity(bytes.len());
    decoded.encode(&mut again);
    if again != bytes {
        return Err(format!("a message's encoding is not canonical: {message:?}"));
    }
    E::check_message(&decoded)
        .map_err(|reason| format!("the gate refuses {message:?}: {reason}"))?;
    Ok((decoded, bytes.len()))
}
