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
//! strengths, which only Kite defines. Geo keyspaces take only their sessions'
//! operations (`KEEL.TX.*`, `KEEL.BARRIER`, `KEEL.ATTACH`, and reads and updates inside a
//! transaction: `front_door::commands::geo`), ordered by the front door.
//!
//! Adding an engine kind: its variant in `keel_core::engine::EngineKind`, its pack here
//! (one line in [`PACKS`], in the variant's order), and what the pack names.

use crate::config::{ConfigError, KeyspaceSettings, KeyspaceSpec, ServerConfig};
use crate::node::{start_keyspace, NodeError, Shared, Started};
use keel_core::engine::{EngineKind, OpMode};
use keel_core::geo::GeoEngine;
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
pub static PACKS: [Pack; 3] = [ORCA, KITE, GEO];

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
/// keyspace's limits: every member may vote, and the voters of a keyspace whose
/// membership never changed are the cluster's `voters` (every member without it).
fn kite_config(config: &ServerConfig, spec: &KeyspaceSpec) -> keel_core::kite::Config {
    let mut members: Vec<NodeId> = config.members.iter().map(|m| NodeId(m.id)).collect();
    members.sort_unstable();
    let mut kite = keel_core::kite::Config::new(NodeId(config.node_id), members);
    kite.voters = config.voter_ids();
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

/// The first words of requests only an ORCA keyspace has: those that read keys whole
/// into the front door and write them back through a log (scripts, `DUMP`, `RESTORE`),
/// and slot moves through the log (`KEEL.SLOTS`).
const WHOLE_KEY_WORDS: [&str; 7] =
    ["eval", "evalsha", "eval_ro", "evalsha_ro", "dump", "restore", "keel.slots"];

/// What a Kite keyspace makes of a request (see the module's docs).
fn kite_terms(asked: Asked<'_>, runs: &dyn Fn() -> String) -> Result<Terms, String> {
    let no_meaning =
        |name: &str| format!("ERR {name} has no meaning in a kite keyspace {}", runs());
    let command = match asked {
        Asked::Word(first) => {
            return match KITE_REFUSED_WORDS
                .iter()
                .chain(&WHOLE_KEY_WORDS)
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
        | ClientCommand::SwapDb { .. }
        | ClientCommand::DbSize
        | ClientCommand::Keys { .. }
        | ClientCommand::ScanKeys { .. }
        | ClientCommand::Enqueue { .. }
        | ClientCommand::Dequeue { .. }
        | ClientCommand::QueuePeek { .. }
        | ClientCommand::Coll { .. }
        | ClientCommand::CollRead { .. }
        | ClientCommand::Block { .. } => Err(no_meaning(&command.name().to_ascii_uppercase())),
        _ => Ok(Terms::FrontDoor),
    }
}

/// Whether `command` reads or changes a keyspace's data (the rest are the server's:
/// connection, introspection and configuration commands).
fn is_data(command: &ClientCommand) -> bool {
    !matches!(
        command,
        ClientCommand::Ping { .. }
            | ClientCommand::Echo { .. }
            | ClientCommand::Hello { .. }
            | ClientCommand::Time
            | ClientCommand::DebugSleep(_)
            | ClientCommand::Status
            | ClientCommand::FunctionFlush
            | ClientCommand::Unwatch
            | ClientCommand::Info { .. }
            | ClientCommand::Client(_)
            | ClientCommand::Command(_)
            | ClientCommand::ConfigGet { .. }
            | ClientCommand::ConfigSet { .. }
            | ClientCommand::ConfigResetStat
            | ClientCommand::Select { .. }
            | ClientCommand::Keyspaces
            | ClientCommand::Quit
    )
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

const GEO: Pack = Pack {
    kind: EngineKind::Geo,
    leader: false,
    start: |spec, shared| {
        let geo = geo_config(shared.config, &spec.config.limits).expect("checked at start");
        Box::pin(start_keyspace::<GeoEngine>(geo, spec, shared))
    },
    check_settings: geo_settings,
    terms: geo_terms,
};

/// The data centers of the members, by label in byte order (`None`: a member has no
/// label), each with its members' ids in order: data center `d` is the `d`-th label,
/// and partition `p` of it the `p`-th member.
fn data_centers(config: &ServerConfig) -> Option<Vec<(String, Vec<u32>)>> {
    let mut dcs: std::collections::BTreeMap<String, Vec<u32>> = Default::default();
    for member in &config.members {
        dcs.entry(member.dc.clone()?).or_default().push(member.id);
    }
    for ids in dcs.values_mut() {
        ids.sort_unstable();
    }
    Some(dcs.into_iter().collect())
}

/// A geo keyspace's engine configuration, from the members' data centers, the node's
/// clock and the keyspace's limits (`Err`: why the members make no geo deployment).
fn geo_config(
    config: &ServerConfig,
    limits: &keel_types::Limits,
) -> Result<keel_core::geo::Config, String> {
    use keel_core::geo::{Member, DCS_MAX, PARTITIONS_MAX};
    let Some(dcs) = data_centers(config) else {
        return Err("every member needs a data center label (`dc`)".into());
    };
    let partitions = dcs[0].1.len();
    if dcs.iter().any(|(_, ids)| ids.len() != partitions) {
        let sizes: Vec<String> = dcs.iter().map(|(l, ids)| format!("{l}: {}", ids.len())).collect();
        return Err(format!(
            "every data center needs as many members (one per partition); found {}",
            sizes.join(", ")
        ));
    }
    if dcs.len() % 2 == 0 || dcs.len() > DCS_MAX {
        return Err(format!(
            "a geo keyspace spans an odd number of data centers, 2f + 1 of at most {DCS_MAX}; found {}",
            dcs.len()
        ));
    }
    if partitions > PARTITIONS_MAX as usize {
        return Err(format!("at most {PARTITIONS_MAX} members per data center"));
    }
    let mut members = Vec::with_capacity(config.members.len());
    for (dc, (_, ids)) in dcs.iter().enumerate() {
        for (partition, id) in ids.iter().enumerate() {
            let (dc, partition) = (dc as u32, partition as u32);
            members.push(Member { node: NodeId(*id), dc, partition });
        }
    }
    let f = (dcs.len() as u32 - 1) / 2;
    let mut geo = keel_core::geo::Config::new(NodeId(config.node_id), members, f);
    geo.wall_clock_origin_us = crate::driver::wall_clock_origin_ms().saturating_mul(1000);
    geo.limits = limits.clone();
    geo.unsafe_expose_non_uniform = config.testing.unsafe_geo_expose_non_uniform;
    geo.strong = config.geo.strong;
    geo.central_certifier = config.geo.central_certifier;
    geo.spread_leaders = config.geo.spread_leaders;
    geo.joining = config.geo.joining;
    if let Some(label) = &config.geo.leader_dc {
        let dc = dcs.iter().position(|(l, _)| l == label);
        geo.leader_dc = dc.ok_or_else(|| format!("no member has dc = {label:?}"))? as u32;
    }
    for [a, b] in &config.geo.conflicts {
        geo.conflicts.declare(a, b);
    }
    Ok(geo)
}

/// A geo keyspace's settings: the members a geo deployment, and none of the settings
/// only a leader engine gives a meaning to.
fn geo_settings(config: &ServerConfig, ks: &KeyspaceSettings) -> Result<(), ConfigError> {
    let invalid = |field: String, reason: String| ConfigError::Invalid { field, reason };
    let limits = config.engine_config()?.limits;
    let geo = geo_config(config, &limits).map_err(|reason| invalid("members".into(), reason))?;
    geo.validate().map_err(|e| invalid(format!("keyspaces.{}.{}", ks.id, e.field), e.reason))?;
    let leader_only = [
        ("durability_default", ks.durability_default.is_some()),
        ("read_level_default", ks.read_level_default.is_some()),
        ("preferred_leader", ks.preferred_leader.is_some()),
    ];
    if let Some((name, _)) = leader_only.iter().find(|(_, set)| *set) {
        let reason = "has no meaning for engine \"geo\" (transactions are causal; a barrier makes what a session saw uniform)";
        return Err(invalid(format!("keyspaces.{}.{name}", ks.id), reason.into()));
    }
    Ok(())
}

/// The first words of the requests a geo keyspace has no meaning for.
const GEO_REFUSED_WORDS: [&str; 8] =
    ["multi", "exec", "discard", "watch", "keel.session", "keel.invoke", "keel.log", "keel.req"];

/// What a geo keyspace makes of a request: its sessions' commands, ordered by the front
/// door; no data command outside them.
fn geo_terms(asked: Asked<'_>, runs: &dyn Fn() -> String) -> Result<Terms, String> {
    match asked {
        Asked::Word(first) => {
            let refused = GEO_REFUSED_WORDS.iter().chain(&WHOLE_KEY_WORDS);
            match refused.into_iter().find(|w| first.eq_ignore_ascii_case(w.as_bytes())) {
                Some(name) => Err(format!(
                    "ERR {} has no meaning in a geo keyspace {}: use KEEL.TX.BEGIN ... KEEL.TX.COMMIT",
                    name.to_ascii_uppercase(),
                    runs()
                )),
                None => Ok(Terms::FrontDoor),
            }
        }
        // The engine takes `KEEL.NODE REMOVE` (a data center's removal), and refuses the rest.
        Asked::Command(ClientCommand::Node { .. }) => Ok(Terms::FrontDoor),
        Asked::Command(command) if is_data(command) => Err(format!(
            "ERR {} outside a transaction has no meaning in a geo keyspace {}: use KEEL.TX.BEGIN, then the command, then KEEL.TX.COMMIT",
            command.name().to_ascii_uppercase(),
            runs()
        )),
        Asked::Command(_) => Ok(Terms::FrontDoor),
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

    #[test]
    fn scripts_and_dumps_run_in_orca_keyspaces_only() {
        for word in WHOLE_KEY_WORDS {
            let asked = || Asked::Word(word.as_bytes());
            assert!(terms(EngineKind::Orca, KeyspaceId(0), asked()).is_ok(), "{word}");
            for kind in [EngineKind::Kite, EngineKind::Geo] {
                assert!(terms(kind, KeyspaceId(1), asked()).is_err(), "{word} in {kind:?}");
            }
        }
    }

    #[test]
    fn membership_changes_reach_every_engine_kind() {
        // A geo keyspace's engine takes `KEEL.NODE REMOVE` (a data center's removal) and
        // refuses the rest, naming why.
        let asked = || Asked::Word(b"KEEL.NODE");
        for (kind, ks) in [(EngineKind::Orca, 0), (EngineKind::Kite, 1), (EngineKind::Geo, 2)] {
            assert_eq!(terms(kind, KeyspaceId(ks), asked()), Ok(Terms::FrontDoor), "{kind:?}");
        }
    }
}
