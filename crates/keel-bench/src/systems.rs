//! Named configurations of each system, and starting a cluster for one.
//!
//! | system | config | writes | reads |
//! |---|---|---|---|
//! | keel | `immediate` / `strong` | `DURABILITY durable` | `LEVEL linearizable` |
//! | keel | `eventual` / `weak` | `DURABILITY memory` | `LEVEL any` |
//! | keel | `cad` | `DURABILITY memory` | `LEVEL monotonic` |
//! | keel | `cad-replicated` | `DURABILITY replicated` | `LEVEL monotonic` |
//! | keel | `eventual-replicated` | `DURABILITY replicated` | `LEVEL any` |
//! | redis | `immediate` | `appendfsync always`, `WAIT 1 0` | `GET` |
//! | redis | `eventual` | `appendfsync everysec` | `GET` |
//! | etcd | `linearizable` | put (fsync on commit) | linearizable range |
//! | etcd | `serializable` | put | serializable range |
//! | zookeeper | `strong-zk` | `forceSync=yes` | `sync` then `getData` |
//! | zookeeper | `weak-zk` | `forceSync=no` | `getData` at the connected server |
//!
//! Reads go to the leader (primary), or with `all` to node `client % 3`.

use crate::cluster::{self, ClusterError, EtcdCluster, KeelCluster, RedisCluster, ZkCluster};
use crate::driver::etcd::EtcdOptions;
use crate::driver::resp::{KeelOptions, RedisOptions};
use crate::driver::zk::ZkOptions;
use crate::runner::Target;
use std::path::Path;

/// A system under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum System {
    /// Keel.
    Keel,
    /// Redis 7.
    Redis,
    /// etcd 3.4.
    Etcd,
    /// ZooKeeper 3.8.
    Zookeeper,
}

impl System {
    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            System::Keel => "keel",
            System::Redis => "redis",
            System::Etcd => "etcd",
            System::Zookeeper => "zookeeper",
        }
    }

    /// The configuration names this system knows.
    pub fn configs(self) -> &'static [&'static str] {
        match self {
            System::Keel => &[
                "immediate",
                "strong",
                "eventual",
                "weak",
                "cad",
                "cad-replicated",
                "eventual-replicated",
            ],
            System::Redis => &["immediate", "eventual"],
            System::Etcd => &["linearizable", "serializable"],
            System::Zookeeper => &["strong-zk", "weak-zk"],
        }
    }
}

impl std::str::FromStr for System {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "keel" => Ok(System::Keel),
            "redis" => Ok(System::Redis),
            "etcd" => Ok(System::Etcd),
            "zookeeper" | "zk" => Ok(System::Zookeeper),
            other => {
                Err(format!("unknown system {other:?}: expected keel, redis, etcd or zookeeper"))
            }
        }
    }
}

/// Why a system/configuration pair cannot run.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// The configuration name is unknown for the system; not retryable.
    #[error("{system} has no configuration {config:?}; known: {known}")]
    UnknownConfig {
        /// System name.
        system: &'static str,
        /// The name asked for.
        config: String,
        /// The names known.
        known: String,
    },
    /// The system has no driver in this build; not retryable.
    #[error("{0} is not supported by this build of keel bench")]
    Unsupported(&'static str),
    /// The cluster did not start.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
}

/// Keel's options for a configuration name.
pub fn keel_options(config: &str, reads_everywhere: bool) -> Option<KeelOptions> {
    let (durability, level) = match config {
        "immediate" | "strong" => ("durable", "linearizable"),
        "eventual" | "weak" => ("memory", "any"),
        "cad" => ("memory", "monotonic"),
        "cad-replicated" => ("replicated", "monotonic"),
        "eventual-replicated" => ("replicated", "any"),
        _ => return None,
    };
    Some(KeelOptions { durability: durability.into(), read_level: level.into(), reads_everywhere })
}

/// A running cluster of some system; stopped on drop.
#[derive(Debug)]
pub enum Running {
    /// Keel.
    Keel(KeelCluster),
    /// Redis.
    Redis(RedisCluster),
    /// etcd.
    Etcd(EtcdCluster),
    /// ZooKeeper.
    Zk(ZkCluster),
}

impl Running {
    /// The cluster's directory (its processes name it in their arguments).
    pub fn dir(&self) -> &Path {
        match self {
            Running::Keel(k) => k.dir(),
            Running::Redis(r) => r.dir(),
            Running::Etcd(e) => e.dir(),
            Running::Zk(z) => z.dir(),
        }
    }

    /// Each server process's resident memory, in KiB.
    pub fn server_rss_kib(&self) -> Vec<u64> {
        match self {
            Running::Keel(k) => cluster::rss_kib_under(k.dir()),
            Running::Redis(r) => r.server_rss_kib(),
            Running::Etcd(e) => e.server_rss_kib(),
            Running::Zk(z) => z.server_rss_kib(),
        }
    }

    /// Keel's HTTP addresses, for its counters; empty for peers.
    pub fn keel_http_addrs(&self) -> Vec<std::net::SocketAddr> {
        match self {
            Running::Keel(k) => k.http_addrs.clone(),
            _ => Vec::new(),
        }
    }
}

fn unknown(system: System, config: &str) -> SetupError {
    SetupError::UnknownConfig {
        system: system.name(),
        config: config.to_string(),
        known: system.configs().join(", "),
    }
}

/// Server settings of Keel clusters beyond the configuration name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeelSettings {
    /// Test emulation: microseconds added to every log fsync (0: none).
    pub emulated_fsync_us: u64,
    /// The background fsync period in milliseconds (`None`: the server's default).
    pub flush_interval_ms: Option<u64>,
    /// ORCA keyspaces the cluster hosts (clients spread over them).
    pub keyspaces: u32,
}

/// Starts a cluster of `system` for `config` and returns how clients reach it.
/// `keel_exe`: the `keel` binary Keel's nodes run; `keel`: their server settings.
pub async fn start(
    system: System,
    config: &str,
    reads_everywhere: bool,
    keel_exe: &Path,
    keel: &KeelSettings,
) -> Result<(Running, Target), SetupError> {
    if !system.configs().contains(&config) {
        return Err(unknown(system, config));
    }
    match system {
        System::Keel => {
            let options =
                keel_options(config, reads_everywhere).ok_or_else(|| unknown(system, config))?;
            let exe = keel_exe.to_path_buf();
            let settings = *keel;
            let cluster = tokio::task::spawn_blocking(move || cluster::start_keel(&exe, &settings))
                .await
                .expect("cluster start task")?;
            let target = Target::Keel {
                nodes: cluster.addrs.clone(),
                keyspaces: cluster.leaders.clone(),
                options,
            };
            Ok((Running::Keel(cluster), target))
        }
        System::Redis => {
            let immediate = config == "immediate";
            let cluster = cluster::start_redis(immediate).await?;
            // WAIT 1: the primary plus one replica make a majority of three.
            let options = RedisOptions { wait_replicas: immediate.then_some(1), reads_everywhere };
            let target = Target::Redis { nodes: cluster.addrs.clone(), options };
            Ok((Running::Redis(cluster), target))
        }
        System::Etcd => {
            if !cfg!(feature = "etcd") {
                return Err(SetupError::Unsupported(
                    "etcd (build keel with --features etcd, which needs protoc)",
                ));
            }
            let cluster = cluster::start_etcd().await?;
            let options = EtcdOptions { serializable: config == "serializable", reads_everywhere };
            let target =
                Target::Etcd { nodes: cluster.addrs.clone(), leader: cluster.leader, options };
            Ok((Running::Etcd(cluster), target))
        }
        System::Zookeeper => {
            let strong = config == "strong-zk";
            let cluster = cluster::start_zookeeper(strong).await?;
            let options = ZkOptions { sync_reads: strong, reads_everywhere };
            let target =
                Target::Zk { nodes: cluster.addrs.clone(), leader: cluster.leader, options };
            Ok((Running::Zk(cluster), target))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_keel_config_maps_to_levels() {
        for config in System::Keel.configs() {
            let options = keel_options(config, false).expect("known config");
            assert!(["memory", "replicated", "durable"].contains(&options.durability.as_str()));
            assert!(["any", "monotonic", "linearizable"].contains(&options.read_level.as_str()));
        }
        assert!(keel_options("bogus", false).is_none());
        assert_eq!(keel_options("cad", true).unwrap().read_level, "monotonic");
    }

    #[test]
    fn systems_parse_by_name() {
        for system in [System::Keel, System::Redis, System::Etcd, System::Zookeeper] {
            assert_eq!(system.name().parse::<System>(), Ok(system));
        }
        assert!("mysql".parse::<System>().is_err());
    }
}
