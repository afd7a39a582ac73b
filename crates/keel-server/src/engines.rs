//! The registry of engine kinds: what the server does differently for each kind, in one
//! table ([`PACKS`]), so that nothing else in the server matches on the kind. A keyspace's
//! kind names its pack ([`pack`]); the pack starts the keyspace (its engine's
//! configuration from the node's, its loop, its inbox), checks its settings, and says
//! which front-door requests have a meaning there and how they are ordered ([`terms`]).
//!
//! Kite keyspaces take single-key reads, writes and read-modify-writes with their
//! barriers (and `EXISTS`, `MGET` as relaxed reads), each sent at once (a Kite session
//! orders its requests itself); they refuse transactions, sessions, Correctables and the
//! log, and the options only ORCA defines. ORCA keyspaces refuse the barriers and
//! strengths, which only Kite defines.
//!
//! Adding an engine kind: its variant in `keel_core::engine::EngineKind`, its pack here
//! (one line in [`PACKS`], in the variant's order), and what the pack names.

use crate::config::{ConfigError, KeyspaceSettings, KeyspaceSpec, ServerConfig};
use crate::node::{start_keyspace, NodeError, Shared, Started};
use keel_core::engine::{EngineKind, OpMode};
use keel_core::kite::KiteEngine;
use keel_core::leader::LeaderEngine;
use keel_types::{KeyspaceId, NodeId};
use keel_wire::ClientCommand;
use std::future::Future;
use std::pin::Pin;

/// A keyspace's start, as a pack runs it.
pub(crate) type Start<'a> = Pin<Box<dyn Future<Output = Result<Started, NodeError>> + Send + 'a>>;

/// What the server knows of one engine kind.
pub struct Pack {
    /// The kind.
    pub kind: EngineKind,
    /// Whether keyspaces of the kind elect a leader (leaderless ones take no leader
    /// preference and are not counted when leaders are spread).
    pub leader: bool,
    /// Starts a keyspace of the kind on this node.
    pub(crate) start: for<'a> fn(KeyspaceSpec, &'a Shared<'a>) -> Start<'a>,
    /// Checks a keyspace's settings against what the kind gives a meaning to.
    pub check_settings: fn(&ServerConfig, &KeyspaceSettings) -> Result<(), ConfigError>,
    /// Whether a front-door request has a meaning in a keyspace of the kind, and how it is
    /// ordered; `Err` is the refusal's text, naming the keyspace with what `runs` says
    /// (`(keyspace 1 runs orca)`, built only for a refusal: this runs for every request).
    pub(crate) terms: fn(Asked<'_>, runs: &dyn Fn() -> String) -> Result<Terms, String>,
}

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

/// Whether a keyspace of engine `kind` (keyspace `ks`) gives the request `asked` a
/// meaning, and how its requests are ordered; `Err` is the error text, naming the engine.
pub(crate) fn terms(kind: EngineKind, ks: KeyspaceId, asked: Asked<'_>) -> Result<Terms, String> {
    (pack(kind).terms)(asked, &|| format!("(keyspace {} runs {kind})", ks.0))
}

/// Every engine kind this build hosts, in `EngineKind`'s order.
pub static PACKS: [Pack; 2] = [ORCA, KITE];

/// The pack of `kind`.
pub fn pack(kind: EngineKind) -> &'static Pack {
    let pack = &PACKS[kind as usize];
    assert_eq!(pack.kind, kind, "PACKS lists the kinds in EngineKind's order");
    pack
}

const ORCA: Pack = Pack {
    kind: EngineKind::Orca,
    leader: true,
    start: |spec, shared| {
        Box::pin(start_keyspace::<LeaderEngine>(spec.config.clone(), spec, shared))
    },
    check_settings: |_, _| Ok(()),
    terms: |asked, runs| match asked {
        Asked::Word(_) => Ok(Terms::FrontDoor),
        Asked::Command(command) => match command.mode() {
            OpMode::Plain => Ok(Terms::FrontDoor),
            mode => Err(format!("ERR {} needs a kite keyspace {}", mode.word(), runs())),
        },
    },
};

const KITE: Pack = Pack {
    kind: EngineKind::Kite,
    leader: false,
    start: |spec, shared| {
        let kite = kite_config(shared.config, &spec);
        Box::pin(start_keyspace::<KiteEngine>(kite, spec, shared))
    },
    check_settings: kite_settings,
    terms: kite_terms,
};

/// A Kite keyspace's engine configuration, from the node's `[kite]` section and the
/// keyspace's limits.
fn kite_config(config: &ServerConfig, spec: &KeyspaceSpec) -> keel_core::kite::Config {
    let mut members: Vec<NodeId> = config.members.iter().map(|m| NodeId(m.id)).collect();
    members.sort_unstable();
    let mut kite = keel_core::kite::Config::new(NodeId(config.node_id), members);
    kite.limits = spec.config.limits.clone();
    kite.release_timeout = keel_core::time::Span::from_millis(config.kite.release_timeout_ms);
    kite.retransmit = keel_core::time::Span::from_millis(config.kite.retransmit_ms);
    kite.sessions_max = config.kite.sessions_max as usize;
    kite.rmw_backoff_max = keel_core::time::Span::from_micros(config.kite.rmw_backoff_max_us);
    kite.outcomes_max = config.kite.outcomes_max as usize;
    kite.outcomes_bytes_max = (config.kite.outcomes_mib_max as usize) << 20;
    kite.unsafe_no_slow_path = config.testing.unsafe_kite_no_slow_path;
    kite
}

/// A Kite keyspace's settings: the `[kite]` section valid, and none of the settings only
/// a leader engine gives a meaning to.
fn kite_settings(config: &ServerConfig, ks: &KeyspaceSettings) -> Result<(), ConfigError> {
    config.kite.validate()?;
    let leader_only = [
        ("durability_default", ks.durability_default.is_some()),
        ("read_level_default", ks.read_level_default.is_some()),
        ("preferred_leader", ks.preferred_leader.is_some()),
    ];
    if let Some((name, _)) = leader_only.iter().find(|(_, set)| *set) {
        let reason =
            "has no meaning for engine \"kite\" (leaderless; each operation names its barrier)";
        return Err(ConfigError::Invalid {
            field: format!("keyspaces.{}.{name}", ks.id),
            reason: reason.into(),
        });
    }
    Ok(())
}

/// The first words of the requests a Kite keyspace has no meaning for.
const KITE_REFUSED_WORDS: [&str; 7] =
    ["multi", "exec", "discard", "watch", "keel.session", "keel.invoke", "keel.log"];

/// What a Kite keyspace makes of a request (see the module's docs).
fn kite_terms(asked: Asked<'_>, runs: &dyn Fn() -> String) -> Result<Terms, String> {
    let no_meaning =
        |name: &str| format!("ERR {name} has no meaning in a kite keyspace {}", runs());
    let command = match asked {
        Asked::Word(first) => {
            return match KITE_REFUSED_WORDS
                .iter()
                .find(|w| first.eq_ignore_ascii_case(w.as_bytes()))
            {
                Some(name) => Err(no_meaning(&name.to_ascii_uppercase())),
                None => Ok(Terms::FrontDoor),
            }
        }
        Asked::Command(command) => command,
    };
    if let Some(option) = orca_option(command) {
        return Err(format!(
            "ERR {option} has no meaning in a kite keyspace {}: use ACQUIRE, RELEASE, WEAK or STRONG",
            runs()
        ));
    }
    match command {
        ClientCommand::Set { options, .. } if *options != keel_wire::command::SetOptions::PLAIN => {
            Err(no_meaning("SET with NX, XX, GET or an expiry"))
        }
        ClientCommand::Get { .. }
        | ClientCommand::Set { .. }
        | ClientCommand::Incr { .. }
        | ClientCommand::Cas { .. }
        | ClientCommand::Exists { .. }
        | ClientCommand::MGet { .. } => Ok(Terms::Engine),
        ClientCommand::Del { .. }
        | ClientCommand::Scan { .. }
        | ClientCommand::Expire { .. }
        | ClientCommand::Ttl { .. }
        | ClientCommand::MSet { .. }
        | ClientCommand::Modify { .. }
        | ClientCommand::Transfer { .. }
        | ClientCommand::ReadString { .. }
        | ClientCommand::Lcs { .. }
        | ClientCommand::RandomKey
        | ClientCommand::Flush { .. }
        | ClientCommand::DbSize
        | ClientCommand::Keys { .. }
        | ClientCommand::ScanKeys { .. }
        | ClientCommand::Enqueue { .. }
        | ClientCommand::Dequeue { .. }
        | ClientCommand::QueuePeek { .. } => Err(no_meaning(&command.name().to_ascii_uppercase())),
        _ => Ok(Terms::FrontDoor),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_pack_in_order() {
        for kind in EngineKind::ALL {
            assert_eq!(pack(kind).kind, kind);
        }
        assert_eq!(PACKS.len(), EngineKind::ALL.len());
    }
}
