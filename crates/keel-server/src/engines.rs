//! The registry of engine kinds: what the server does differently for each kind, in one
//! table ([`PACKS`]), so that nothing else in the server matches on the kind. A keyspace's
//! kind names its pack ([`pack`]); the pack starts the keyspace (its engine's
//! configuration from the node's, its loop, its inbox), checks its settings, and says
//! which front-door commands have a meaning there.
//!
//! Adding an engine kind: its variant in `keel_core::engine::EngineKind`, its pack here
//! (one line in [`PACKS`], in the variant's order), and what the pack names.

use crate::config::{ConfigError, KeyspaceSettings, KeyspaceSpec, ServerConfig};
use crate::node::{start_keyspace, NodeError, Shared, Started};
use keel_core::engine::{EngineKind, OpMode};
use keel_core::kite::KiteEngine;
use keel_core::leader::LeaderEngine;
use keel_types::NodeId;
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
    /// Whether a front-door command has a meaning in a keyspace of the kind; `Err` is the
    /// refusal's text, naming the keyspace with what `runs` says (`(keyspace 1 runs
    /// orca)`, built only for a refusal: this runs for every request).
    pub permits: fn(&ClientCommand, runs: &dyn Fn() -> String) -> Result<(), String>,
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
    permits: |command, runs| match command.mode() {
        OpMode::Plain => Ok(()),
        mode => Err(format!("ERR {} needs a kite keyspace {}", mode.word(), runs())),
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
    permits: kite_permits,
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

/// Kite keyspaces take single-key reads, writes and read-modify-writes with their
/// barriers (and `EXISTS`, `MGET` as relaxed reads); the leader engine's options (levels,
/// durabilities, versions) and its other commands have no meaning there.
fn kite_permits(command: &ClientCommand, runs: &dyn Fn() -> String) -> Result<(), String> {
    let option = match command {
        ClientCommand::Get { level: Some(_), .. } | ClientCommand::MGet { level: Some(_), .. } => {
            Some("LEVEL")
        }
        ClientCommand::Get { with_version: true, .. }
        | ClientCommand::Set { with_version: true, .. } => Some("WITHVERSION"),
        ClientCommand::Set { durability: Some(_), .. }
        | ClientCommand::Cas { durability: Some(_), .. } => Some("DURABILITY"),
        _ => None,
    };
    if let Some(option) = option {
        return Err(format!(
            "ERR {option} has no meaning in a kite keyspace {}: use ACQUIRE, RELEASE, WEAK or STRONG",
            runs()
        ));
    }
    match command {
        ClientCommand::Del { .. }
        | ClientCommand::Scan { .. }
        | ClientCommand::Enqueue { .. }
        | ClientCommand::Dequeue { .. }
        | ClientCommand::QueuePeek { .. } => {
            let name = command.name().to_ascii_uppercase();
            Err(format!("ERR {name} has no meaning in a kite keyspace {}", runs()))
        }
        _ => Ok(()),
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
