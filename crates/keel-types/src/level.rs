//! The durabilities a write may ask for and the levels a read may ask for.
//! See `docs/consistency.md` for what each promises and costs.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// When a write is acknowledged. Replication and fsync always continue in the background.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// The leader has it in memory (ORCA: eventual durability, async replication).
    Memory,
    /// A majority has it in memory (ORCA: eventual durability, async persistence).
    Replicated,
    /// A majority has fsynced it (ORCA: immediate durability).
    Durable,
}

/// What a read guarantees.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReadLevel {
    /// The contacted replica's applied state, at once. May be stale, may go backwards.
    Any,
    /// Cross-client monotonic reads: never older than any state any client has read,
    /// across failures; what was read is never lost.
    Monotonic,
    /// Linearizable for keys written `durable`: served by the leader under a valid lease.
    Linearizable,
}

impl Durability {
    /// Every durability, weakest first.
    pub const ALL: [Durability; 3] =
        [Durability::Memory, Durability::Replicated, Durability::Durable];

    /// The user-visible name.
    pub fn as_str(self) -> &'static str {
        match self {
            Durability::Memory => "memory",
            Durability::Replicated => "replicated",
            Durability::Durable => "durable",
        }
    }
}

impl ReadLevel {
    /// Every read level, weakest first.
    pub const ALL: [ReadLevel; 3] = [ReadLevel::Any, ReadLevel::Monotonic, ReadLevel::Linearizable];

    /// The user-visible name.
    pub fn as_str(self) -> &'static str {
        match self {
            ReadLevel::Any => "any",
            ReadLevel::Monotonic => "monotonic",
            ReadLevel::Linearizable => "linearizable",
        }
    }
}

/// A level or durability name that is not one Keel knows.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} '{name}' (expected one of: {expected})")]
pub struct UnknownName {
    /// "durability" or "read level".
    pub kind: &'static str,
    /// What was given.
    pub name: String,
    /// The accepted names, comma separated.
    pub expected: &'static str,
}

impl FromStr for Durability {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Durability::ALL.into_iter().find(|d| d.as_str().eq_ignore_ascii_case(s)).ok_or_else(|| {
            UnknownName {
                kind: "durability",
                name: s.to_string(),
                expected: "memory, replicated, durable",
            }
        })
    }
}

impl FromStr for ReadLevel {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ReadLevel::ALL.into_iter().find(|l| l.as_str().eq_ignore_ascii_case(s)).ok_or_else(|| {
            UnknownName {
                kind: "read level",
                name: s.to_string(),
                expected: "any, monotonic, linearizable",
            }
        })
    }
}

impl fmt::Display for Durability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for ReadLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in Durability::ALL {
            assert_eq!(d.as_str().parse::<Durability>().unwrap(), d);
        }
        for l in ReadLevel::ALL {
            assert_eq!(l.as_str().parse::<ReadLevel>().unwrap(), l);
        }
        assert_eq!("MONOTONIC".parse::<ReadLevel>().unwrap(), ReadLevel::Monotonic);
    }

    #[test]
    fn unknown_names_are_refused_with_the_choices() {
        let err = "strong".parse::<ReadLevel>().unwrap_err();
        assert!(err.to_string().contains("any, monotonic, linearizable"));
        assert!("fsync".parse::<Durability>().is_err());
    }
}
