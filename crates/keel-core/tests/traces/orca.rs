//! The leader engine (ORCA) in traces: its configuration, controls and one-line forms.

use crate::world::{entry_line, result_line, Traced};
use keel_core::leader::{Config, LeaderEngine, Lease, Message, Role};
use keel_types::NodeId;
use std::collections::BTreeMap;

impl Traced for LeaderEngine {
    /// Options: `prefer=n1` (the preferred leader), `follower-reads=false`.
    fn configure(
        node: NodeId,
        members: Vec<NodeId>,
        options: &BTreeMap<String, String>,
    ) -> Result<Config, String> {
        let mut config = Config::new(node, members);
        for (key, value) in options {
            match key.as_str() {
                "prefer" => {
                    let id = value.trim_start_matches('n').parse().map_err(|_| "prefer=nN")?;
                    config.preferred_leader = Some(NodeId(id));
                }
                "follower-reads" => {
                    config.follower_reads = value.parse().map_err(|_| "follower-reads=bool")?
                }
                other => return Err(format!("unknown orca option {other}")),
            }
        }
        Ok(config)
    }

    fn control(config: &mut Config, name: &str) -> bool {
        let c = config;
        let flags = vec![
            ("unsafe_allow_hasty_removal", &mut c.unsafe_allow_hasty_removal),
            ("unsafe_release_unasked", &mut c.unsafe_release_unasked),
            ("unsafe_view_reads_unchecked", &mut c.unsafe_view_reads_unchecked),
            ("unsafe_forget_leader_contact", &mut c.unsafe_forget_leader_contact),
            ("unsafe_skip_dedup", &mut c.unsafe_skip_dedup),
            ("unsafe_accept_expired_sessions", &mut c.unsafe_accept_expired_sessions),
            ("unsafe_accept_stale_opens", &mut c.unsafe_accept_stale_opens),
            ("unsafe_watch_ignores_deletes", &mut c.unsafe_watch_ignores_deletes),
            ("unsafe_ignore_repair_floor", &mut c.unsafe_ignore_repair_floor),
            ("unsafe_pre_vote_ignores_leader", &mut c.unsafe_pre_vote_ignores_leader),
        ];
        crate::world::turn_on(flags, name)
    }

    fn message(message: &Message) -> String {
        let granted = |g: &bool| if *g { "granted" } else { "refused" };
        match message {
            Message::PreVote { epoch, last_epoch, last_index } => {
                format!("PreVote e{} last={}.{}", epoch.0, last_epoch.0, last_index.0)
            }
            Message::PreVoteReply { epoch, granted: g } => {
                format!("PreVoteReply e{} {}", epoch.0, granted(g))
            }
            Message::RequestVote { epoch, last_epoch, last_index, transfer } => {
                let kind = if *transfer { " transfer" } else { "" };
                format!("RequestVote e{} last={}.{}{kind}", epoch.0, last_epoch.0, last_index.0)
            }
            Message::TimeoutNow { epoch, last_epoch, last_index } => {
                format!("TimeoutNow e{} last={}.{}", epoch.0, last_epoch.0, last_index.0)
            }
            Message::Vote { epoch, granted: g } => format!("Vote e{} {}", epoch.0, granted(g)),
            Message::Append {
                epoch,
                prev_epoch,
                prev_index,
                entries,
                commit_index,
                durable_index,
                lease,
                flush_through,
                ..
            } => {
                let entries: Vec<String> = entries.iter().map(entry_line).collect();
                let lease = match lease {
                    Lease::Granted { .. } => "lease",
                    Lease::Withheld => "no-lease",
                    Lease::MarkOut => "mark-out",
                };
                let flush = flush_through.map_or(String::new(), |f| format!(" flush={}", f.0));
                format!(
                    "Append e{} prev={}.{} [{}] commit={} durable={} {lease}{flush}",
                    epoch.0,
                    prev_epoch.0,
                    prev_index.0,
                    entries.join(", "),
                    commit_index.0,
                    durable_index.0,
                )
            }
            Message::AppendReply {
                epoch,
                success,
                last_index,
                persisted_index,
                applied_index,
                match_index,
                released,
                ..
            } => format!(
                "AppendReply e{} {} last={} persisted={} applied={} match={}{}",
                epoch.0,
                if *success { "ok" } else { "mismatch" },
                last_index.0,
                persisted_index.0,
                applied_index.0,
                match_index.0,
                if *released { " released" } else { "" },
            ),
            Message::InstallSnapshot { epoch, meta, offset, total, .. } => format!(
                "InstallSnapshot e{} through={} bytes {offset}..{total}",
                epoch.0, meta.last_index.0
            ),
            Message::InstallSnapshotReply { epoch, last_index, received } => {
                format!(
                    "InstallSnapshotReply e{} last={} received={received}",
                    epoch.0, last_index.0
                )
            }
            Message::Forward { epoch, request } => format!(
                "Forward e{} {}{}",
                epoch.0,
                crate::world::command_line(&request.command),
                if request.after.0 > 0 {
                    format!(" after={}", request.after.0)
                } else {
                    String::new()
                }
            ),
            Message::ForwardReply { epoch, reply } => {
                format!("ForwardReply e{} {}", epoch.0, result_line(reply))
            }
        }
    }

    fn status_line(&self) -> String {
        let s = self.status();
        let role = match s.role {
            Role::Leader => "leader",
            Role::Follower => "follower",
            Role::Candidate => "candidate",
        };
        let leader = s.leader.map_or(String::new(), |l| format!(" of {l}"));
        let active: Vec<String> = s.active_set.iter().map(|n| n.to_string()).collect();
        let active = if active.is_empty() {
            String::new()
        } else {
            format!(" active=[{}]", active.join(","))
        };
        format!(
            "{role}{leader} e{} last={} commit={} durable={} persisted={} applied={}{active}{}",
            s.epoch.0,
            s.last_index.0,
            s.commit_index.0,
            s.durable_index.0,
            s.persisted_index.0,
            s.applied_index.0,
            if s.leader_lease_valid { " lease" } else { "" },
        )
    }
}
