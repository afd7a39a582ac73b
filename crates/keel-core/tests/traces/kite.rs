//! Kite in traces: its configuration, controls and one-line forms. Round ids start at
//! random in each incarnation and are left out; stamps and ballots name their node, not
//! its incarnation.

use crate::world::{quoted, Traced};
use keel_core::kite::{Ballot, Bit, Config, KiteEngine, Message, Stamp};
use keel_types::{NodeId, Value};
use std::collections::BTreeMap;

fn stamp(s: &Stamp) -> String {
    let rmw = if s.rmw > 0 { format!(".{}", s.rmw) } else { String::new() };
    format!("{}{rmw}@n{}", s.version, s.writer >> 32)
}

fn ballot(b: &Ballot) -> String {
    format!("{}@n{}", b.round, b.proposer >> 32)
}

fn value(v: &Option<Value>) -> String {
    v.as_deref().map_or("nil".into(), quoted)
}

fn flag(on: bool, word: &str) -> String {
    if on {
        format!(" {word}")
    } else {
        String::new()
    }
}

impl Traced for KiteEngine {
    /// Options: `release-timeout=5` and `retransmit=20` (milliseconds).
    fn configure(
        node: NodeId,
        members: Vec<NodeId>,
        options: &BTreeMap<String, String>,
    ) -> Result<Config, String> {
        let mut config = Config::new(node, members);
        for (key, value) in options {
            let ms: u64 = value.parse().map_err(|_| format!("{key}: milliseconds"))?;
            match key.as_str() {
                "release-timeout" => {
                    config.release_timeout = keel_core::time::Span::from_millis(ms)
                }
                "retransmit" => config.retransmit = keel_core::time::Span::from_millis(ms),
                other => return Err(format!("unknown kite option {other}")),
            }
        }
        Ok(config)
    }

    fn control(config: &mut Config, name: &str) -> bool {
        let c = config;
        let flags = vec![
            ("unsafe_no_rejoin", &mut c.unsafe_no_rejoin),
            ("unsafe_unfenced_rejoin", &mut c.unsafe_unfenced_rejoin),
            ("unsafe_no_slow_path", &mut c.unsafe_no_slow_path),
            ("unsafe_release_before_acks", &mut c.unsafe_release_before_acks),
            ("unsafe_complete_without_quorum", &mut c.unsafe_complete_without_quorum),
            ("unsafe_no_epoch_snapshot", &mut c.unsafe_no_epoch_snapshot),
            ("unsafe_paper_reset", &mut c.unsafe_paper_reset),
            ("unsafe_uncommitted_failures", &mut c.unsafe_uncommitted_failures),
            ("unsafe_forget_outcomes", &mut c.unsafe_forget_outcomes),
        ];
        crate::world::turn_on(flags, name)
    }

    fn message(message: &Message) -> String {
        let delinquent = |d: &Option<u64>| flag(d.is_some(), "delinquent");
        let query = |q: &Option<u64>| flag(q.is_some(), "query");
        let key = |k: &[u8]| String::from_utf8_lossy(k).into_owned();
        match message {
            Message::Write { key: k, value: v, stamp: s, rmw, query: q, .. } => format!(
                "Write {}={} {}{}{}",
                key(k),
                quoted(v),
                stamp(s),
                flag(rmw.is_some(), "by-rmw"),
                query(q)
            ),
            Message::WriteAck { delinquent: d, .. } => format!("WriteAck{}", delinquent(d)),
            Message::Read { key: k, query: q, .. } => format!("Read {}{}", key(k), query(q)),
            Message::ReadReply { value: v, stamp: s, delinquent: d, .. } => {
                format!("ReadReply {} {}{}", value(v), stamp(s), delinquent(d))
            }
            Message::SlowRelease { delinquent: d, .. } => {
                let names: Vec<String> = d.iter().map(|n| n.to_string()).collect();
                format!("SlowRelease [{}]", names.join(","))
            }
            Message::SlowReleaseAck { .. } => "SlowReleaseAck".into(),
            Message::ResetBit { gen, .. } => format!("ResetBit gen={gen}"),
            Message::Propose { key: k, ballot: b, query: q, .. } => {
                format!("Propose {} ballot={}{}", key(k), ballot(b), query(q))
            }
            Message::Promise {
                ok, promised, accepted, value: v, stamp: s, delinquent: d, ..
            } => {
                format!(
                    "Promise {} promised={} {} {}{}{}",
                    if *ok { "ok" } else { "nack" },
                    ballot(promised),
                    value(v),
                    stamp(s),
                    flag(accepted.is_some(), "with-accepted"),
                    delinquent(d)
                )
            }
            Message::Accept { key: k, ballot: b, record, query: q, .. } => format!(
                "Accept {}={} ballot={} {}{}",
                key(k),
                quoted(&record.value),
                ballot(b),
                stamp(&record.stamp),
                query(q)
            ),
            Message::Accepted { ok, promised, delinquent: d, .. } => format!(
                "Accepted {} promised={}{}",
                if *ok { "ok" } else { "nack" },
                ballot(promised),
                delinquent(d)
            ),
            Message::ViewAck { gen, .. } => format!("ViewAck gen={gen}"),
            Message::StateRequest { .. } => "StateRequest".into(),
            Message::StatePage { rejoining, slots, outcomes, next, .. } => format!(
                "StatePage keys={} outcomes={}{}{}",
                slots.len(),
                outcomes.len(),
                flag(*rejoining, "rejoining"),
                flag(next.is_some(), "more")
            ),
            Message::SyncQuery { membership, .. } => {
                format!("SyncQuery epoch={}", membership.epoch)
            }
            Message::Synced { .. } => "Synced".into(),
            Message::MembershipNews { membership } => {
                format!("MembershipNews epoch={}", membership.epoch)
            }
        }
    }

    fn status_line(&self) -> String {
        let s = self.status();
        let bits: Vec<String> = s
            .bits
            .iter()
            .filter(|(_, b)| *b != Bit::Clear)
            .map(|(n, b)| format!("{n}:{}", if *b == Bit::Set { "set" } else { "transient" }))
            .collect();
        format!(
            "{} epoch={} incarnation={} keys={} in-epoch={}{}",
            if s.rejoining { "rejoining" } else { "replica" },
            s.epoch,
            s.incarnation,
            s.keys,
            s.keys_in_epoch,
            if bits.is_empty() {
                String::new()
            } else {
                format!(" delinquent=[{}]", bits.join(","))
            },
        )
    }
}
