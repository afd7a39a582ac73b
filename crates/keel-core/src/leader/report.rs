//! The leader engine's status document and metrics, as `/status`, `KEEL.STATUS` and
//! `/metrics` show them.

use super::core::Counters;
use super::io::{Role, Status};
use crate::engine::{Metric, Report};

impl Role {
    /// The role's name in reports and metric labels.
    pub fn name(self) -> &'static str {
        match self {
            Role::Leader => "leader",
            Role::Follower => "follower",
            Role::Candidate => "candidate",
        }
    }
}

/// The status document (the `Status` fields, the role in lowercase, the counters) and
/// the metrics of one leader engine.
pub fn report(status: &Status, c: &Counters) -> Report {
    let mut doc = serde_json::to_value(status).expect("status serializes");
    let object = doc.as_object_mut().expect("a struct serializes to an object");
    object.insert("role".into(), status.role.name().into());
    object.insert("counters".into(), counters_doc(c));
    let mut metrics = status_gauges(status);
    metrics.extend(counter_metrics(c));
    Report { status: doc, metrics }
}

/// The counters as `KEEL.STATUS` shows them.
fn counters_doc(c: &Counters) -> serde_json::Value {
    serde_json::json!({
        "durability_rounds": c.durability_rounds,
        "durability_rounds_finished": c.durability_rounds_finished,
        "durability_round_nanos": c.durability_round_nanos,
        "reads_with_round": c.reads_with_round,
        "forwarded": c.forwarded,
        "elections": c.elections,
        "removals": c.removals,
        "rolled_back_entries": c.rolled_back_entries,
        "snapshots_installed": c.snapshots_installed,
        "snapshots_taken": c.snapshots_taken,
        "snapshot_chunks_received": c.snapshot_chunks_received,
        "messages_rejected": c.messages_rejected,
        "writes_timed_out": c.writes_timed_out,
        "forced_mark_outs": c.forced_mark_outs,
        "released_removals": c.released_removals,
        "retries_deduplicated": c.retries_deduplicated,
        "keys_expired": c.keys_expired,
        "sessions_expired": c.sessions_expired,
        "stale_opens_refused": c.stale_opens_refused,
        "leases_expired": c.leases_expired,
        "campaigns_withheld": c.campaigns_withheld,
        "logs_repaired": c.logs_repaired,
        "epochs_raised_under_live_leader": c.epochs_raised_under_live_leader,
        "transfers_handed_over": c.transfers_handed_over,
        "transfer_votes": c.transfer_votes,
    })
}

/// The engine state as gauges.
fn status_gauges(status: &Status) -> Vec<Metric> {
    let mut metrics: Vec<Metric> = [Role::Leader, Role::Follower, Role::Candidate]
        .into_iter()
        .map(|role| Metric {
            label: Some(("role", role.name())),
            ..Metric::gauge(
                "keel_role",
                "1 for the role this node plays.",
                u64::from(role == status.role),
            )
        })
        .collect();
    metrics.extend([
        Metric::gauge("keel_epoch", "The current epoch.", status.epoch.0),
        Metric::gauge("keel_last_index", "The last log index.", status.last_index.0),
        Metric::gauge(
            "keel_commit_index",
            "Highest index known replicated on a majority.",
            status.commit_index.0,
        ),
        Metric::gauge(
            "keel_durable_index",
            "Highest index known durable on the active set.",
            status.durable_index.0,
        ),
        Metric::gauge("keel_persisted_index", "Highest index fsynced locally.", status.persisted_index.0),
        Metric::gauge("keel_applied_index", "Highest index applied locally.", status.applied_index.0),
        Metric::gauge(
            "keel_snapshot_index",
            "The last index the snapshot covers.",
            status.snapshot_index.0,
        ),
        Metric::gauge(
            "keel_snapshot_held_bytes",
            "Snapshot bytes held to send to followers.",
            status.snapshot_held_bytes,
        ),
        Metric::gauge(
            "keel_active_set_size",
            "The leader's active set, itself included.",
            status.active_set.len() as u64,
        ),
        Metric::gauge(
            "keel_active",
            "1 while this node may serve monotonic reads.",
            u64::from(status.active),
        ),
        Metric::gauge(
            "keel_dedup_clients_max",
            "The deduplication bound in force: the cluster's, from the log's latest settings entry.",
            status.dedup_clients_max as u64,
        ),
        Metric::gauge(
            "keel_leader_lease_valid",
            "1 while this node leads under a valid lease.",
            u64::from(status.leader_lease_valid),
        ),
    ]);
    metrics
}

/// The counters as metrics.
fn counter_metrics(c: &Counters) -> Vec<Metric> {
    vec![
        Metric::counter(
            "keel_durability_rounds_total",
            "Durability rounds started as leader.",
            c.durability_rounds,
        ),
        Metric::counter(
            "keel_durability_rounds_finished_total",
            "Durability rounds finished as leader.",
            c.durability_rounds_finished,
        ),
        // In microseconds, not the base unit: these metrics carry whole numbers.
        Metric::counter(
            "keel_durability_round_microseconds_total",
            "Time the finished durability rounds took, each from its start to its end \
             (divided by keel_durability_rounds_finished_total: a round's mean time).",
            c.durability_round_nanos / 1_000,
        ),
        Metric::counter(
            "keel_reads_with_durability_round_total",
            "Reads that waited for a durability round.",
            c.reads_with_round,
        ),
        Metric::counter("keel_forwarded_total", "Requests forwarded to the leader.", c.forwarded),
        Metric::counter("keel_elections_total", "Elections started.", c.elections),
        Metric::counter(
            "keel_active_set_removals_total",
            "Followers removed from the active set.",
            c.removals,
        ),
        Metric::counter(
            "keel_rolled_back_entries_total",
            "Entries rolled back after a truncation.",
            c.rolled_back_entries,
        ),
        Metric::counter(
            "keel_snapshots_installed_total",
            "Snapshots installed from a leader.",
            c.snapshots_installed,
        ),
        Metric::counter("keel_snapshots_taken_total", "Snapshots taken and saved.", c.snapshots_taken),
        Metric::counter(
            "keel_snapshot_chunks_received_total",
            "Snapshot chunks accepted.",
            c.snapshot_chunks_received,
        ),
        Metric::counter(
            "keel_write_timeouts_total",
            "Writes at the leader that timed out before their durability point.",
            c.writes_timed_out,
        ),
        Metric::counter(
            "keel_forced_mark_outs_total",
            "Active-set members this leader began to mark out (slow or past the target).",
            c.forced_mark_outs,
        ),
        Metric::counter(
            "keel_released_removals_total",
            "Removals after a follower acknowledged its mark-out.",
            c.released_removals,
        ),
        Metric::counter(
            "keel_retries_deduplicated_total",
            "Write retries answered from the deduplication table.",
            c.retries_deduplicated,
        ),
        Metric::counter(
            "keel_keys_expired_total",
            "Keys this node, as leader, expired by active expiry.",
            c.keys_expired,
        ),
        Metric::counter(
            "keel_sessions_expired_total",
            "Writes refused because the deduplication table no longer held their session.",
            c.sessions_expired,
        ),
        Metric::counter(
            "keel_stale_opens_refused_total",
            "Session opens refused as possibly late copies: stamped below the last use of a session the deduplication table evicted.",
            c.stale_opens_refused,
        ),
        Metric::counter(
            "keel_leases_expired_total",
            "Active-set leases held as a follower that ran out without renewal.",
            c.leases_expired,
        ),
        Metric::counter(
            "keel_campaigns_withheld_total",
            "Election timeouts without a campaign: the log is below its repair floor.",
            c.campaigns_withheld,
        ),
        Metric::counter(
            "keel_logs_repaired_total",
            "Repair floors cleared: the log is durable again past the damage recovery cut.",
            c.logs_repaired,
        ),
        Metric::counter(
            "keel_epochs_raised_under_live_leader_total",
            "Higher epochs learned from a reply or forward while a live leader's lease counted on this node.",
            c.epochs_raised_under_live_leader,
        ),
        Metric::counter(
            "keel_transfers_handed_over_total",
            "Leadership transfers this node, as leader, handed over (TimeoutNow sent, its lease given up).",
            c.transfers_handed_over,
        ),
        Metric::counter(
            "keel_transfer_votes_total",
            "Votes given to a leadership transfer's candidate past this node's stickiness.",
            c.transfer_votes,
        ),
    ]
}
