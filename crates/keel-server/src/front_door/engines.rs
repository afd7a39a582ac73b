//! What each engine kind makes of a request, in one function ([`engine_terms`]), so that
//! the front door asks one place, and an engine registry can later replace it whole.
//!
//! Kite keyspaces take single-key reads, writes and read-modify-writes with their
//! barriers (and `EXISTS`, `MGET` as relaxed reads), each sent at once (a Kite session
//! orders its requests itself); they refuse transactions, sessions, Correctables and the
//! log, and the options only ORCA defines. ORCA keyspaces refuse the barriers and
//! strengths, which only Kite defines.

use keel_core::engine::{EngineKind, OpMode};
use keel_types::KeyspaceId;
use keel_wire::ClientCommand;

/// A request as the engine check sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Asked<'a> {
    /// A request by its first word, before it is parsed (server-side commands such as
    /// `MULTI` or `KEEL.INVOKE` are never parsed into a [`ClientCommand`]).
    Word(&'a [u8]),
    /// A parsed command, before it is sent.
    Command(&'a ClientCommand),
}

/// How a request the engine takes is ordered among its connection's requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Terms {
    /// By the front door (`Conn::order`): a request of another kind than the one before
    /// it waits for every earlier reply.
    FrontDoor,
    /// By the engine: every request is sent at once (a Kite session orders its own).
    Engine,
}

/// The first words of the requests a Kite keyspace has no meaning for.
const KITE_REFUSED_WORDS: [&str; 7] =
    ["multi", "exec", "discard", "watch", "keel.session", "keel.invoke", "keel.log"];

/// Whether a keyspace of engine `kind` (keyspace `ks`) gives the request `asked` a
/// meaning, and how its requests are ordered; `Err` is the error text, naming the engine.
/// The one place the front door looks at an [`EngineKind`].
pub(crate) fn engine_terms(
    kind: EngineKind,
    ks: KeyspaceId,
    asked: Asked<'_>,
) -> Result<Terms, String> {
    // The refusals' words are built only for a refusal: this runs for every request.
    let runs = || format!("(keyspace {} runs {kind})", ks.0);
    let no_meaning =
        |name: &str| format!("ERR {name} has no meaning in a kite keyspace {}", runs());
    match (kind, asked) {
        (EngineKind::Orca, Asked::Word(_)) => Ok(Terms::FrontDoor),
        (EngineKind::Orca, Asked::Command(command)) => match command.mode() {
            OpMode::Plain => Ok(Terms::FrontDoor),
            mode => Err(format!("ERR {} needs a kite keyspace {}", mode.word(), runs())),
        },
        (EngineKind::Kite, Asked::Word(first)) => {
            match KITE_REFUSED_WORDS.iter().find(|w| first.eq_ignore_ascii_case(w.as_bytes())) {
                Some(name) => Err(no_meaning(&name.to_ascii_uppercase())),
                None => Ok(Terms::FrontDoor),
            }
        }
        (EngineKind::Kite, Asked::Command(command)) => {
            if let Some(option) = orca_option(command) {
                return Err(format!(
                    "ERR {option} has no meaning in a kite keyspace {}: use ACQUIRE, RELEASE, WEAK or STRONG",
                    runs()
                ));
            }
            match command {
                ClientCommand::Get { .. }
                | ClientCommand::Set { .. }
                | ClientCommand::Incr { .. }
                | ClientCommand::Cas { .. }
                | ClientCommand::Exists { .. }
                | ClientCommand::MGet { .. } => Ok(Terms::Engine),
                ClientCommand::Del { .. }
                | ClientCommand::Scan { .. }
                | ClientCommand::Enqueue { .. }
                | ClientCommand::Dequeue { .. }
                | ClientCommand::QueuePeek { .. } => {
                    Err(no_meaning(&command.name().to_ascii_uppercase()))
                }
                _ => Ok(Terms::FrontDoor),
            }
        }
    }
}

/// The option of `command` only ORCA defines (a read level, a version, a durability), if
/// it carries one.
fn orca_option(command: &ClientCommand) -> Option<&'static str> {
    match command {
        ClientCommand::Get { level: Some(_), .. } | ClientCommand::MGet { level: Some(_), .. } => {
            Some("LEVEL")
        }
        ClientCommand::Get { with_version: true, .. }
        | ClientCommand::Set { with_version: true, .. } => Some("WITHVERSION"),
        ClientCommand::Set { durability: Some(_), .. }
        | ClientCommand::Cas { durability: Some(_), .. } => Some("DURABILITY"),
        _ => None,
    }
}
