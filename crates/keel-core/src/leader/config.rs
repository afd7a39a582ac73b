//! Defaults and validation of [`Config`], and the timing bounds derived from it.
//!
//! The bounds (see `docs/protocol.md`, "Timers"):
//! - `heartbeat_interval ≤ mark_out_timeout / 3`: several renewals per lease.
//! - `removal_timeout ≥ 5 · mark_out_timeout` (ORCA's ratio): a follower the leader has
//!   not heard from for `rt` has marked itself out on its own clock first. Safety needs
//!   only `rt > mt · (1 + ρ)²`, which the ratio covers for any drift up to 10%.
//! - leader lease `= election_timeout_min / (1 + ρ)² − mark_out_timeout − heartbeat_interval`,
//!   which must be positive and at least two heartbeats: a deposed leader stops serving,
//!   and every follower lease it granted ends, before a successor can be elected.

use super::io::Config;
use crate::time::Span;
use keel_types::{Durability, Limits, NodeId, ReadLevel};

/// Most members a cluster may have.
pub const MEMBERS_MAX: usize = 7;
/// Ceiling on `append_entries_max` (bounds one message).
pub const APPEND_ENTRIES_CEILING: usize = 65_536;
/// Ceiling on `pending_requests_max` (bounds memory; `dedup_clients_max` has
/// `keel_types::limits::DEDUP_CLIENTS_CEILING`).
pub const QUEUE_CEILING: usize = 1 << 20;
/// Default ceiling on the applied state: 2 GiB (a node holds up to about three times it).
pub const STATE_BYTES_MAX_DEFAULT: u64 = 2 << 30;
/// Default most bytes of entries in one `Append`.
pub const APPEND_BYTES_MAX_DEFAULT: u64 = 8 << 20;
/// Ceiling on `append_bytes_max` (an `Append` travels in one peer frame).
pub const APPEND_BYTES_CEILING: u64 = 64 << 20;
/// Room in a peer message for everything but its entries or snapshot data.
pub const PEER_MESSAGE_OVERHEAD_BYTES: u64 = 64 << 10;
/// Ceiling on `snapshot_chunk_bytes`: a chunk travels in one peer frame.
pub const SNAPSHOT_CHUNK_BYTES_CEILING: u64 = 64 << 20;
/// The ratio ORCA recommends between removal and mark-out timeouts.
pub const REMOVAL_TO_MARK_OUT_RATIO_MIN: u64 = 5;

const _: () = assert!(MEMBERS_MAX % 2 == 1);
const _: () = assert!(REMOVAL_TO_MARK_OUT_RATIO_MIN >= 2);

pub use crate::engine::ConfigError;

fn fail(field: &'static str, reason: impl Into<String>) -> Result<(), ConfigError> {
    Err(ConfigError { field, reason: reason.into() })
}

/// How many members the leader keeps in its active set, itself included, with `voters`
/// voters in force: the configured target (`Config::active_set_target`) while it names
/// fewer than the `configured_voters` (`Config::members`), within a majority and every
/// voter in force; else every voter in force.
pub fn active_set_target(configured: usize, configured_voters: usize, voters: usize) -> usize {
    match configured < configured_voters {
        true => configured.clamp(voters / 2 + 1, voters),
        false => voters,
    }
}

/// `span · (1 + ppm/10⁶)`, rounded up.
fn stretch(span: Span, ppm: u32) -> Span {
    let extra = (u128::from(span.0) * u128::from(ppm)).div_ceil(1_000_000);
    Span(span.0.saturating_add(u64::try_from(extra).unwrap_or(u64::MAX)))
}

/// `span / (1 + ppm/10⁶)`, rounded down.
fn shrink(span: Span, ppm: u32) -> Span {
    let value = u128::from(span.0) * 1_000_000 / (1_000_000 + u128::from(ppm));
    Span(u64::try_from(value).expect("shrinking never grows"))
}

impl Config {
    /// The defaults for `node_id` in a cluster of `members`: mt 100 ms and rt 500 ms
    /// (ORCA §4.6), heartbeats every 25 ms, elections after 300–600 ms, background fsync
    /// every 200 ms, 100 ppm drift, every member in the active set, follower reads on,
    /// `memory` writes and `monotonic` reads by default.
    pub fn new(node_id: NodeId, members: Vec<NodeId>) -> Config {
        let active_set_target = members.len();
        Config {
            node_id,
            members,
            joining: false,
            heartbeat_interval: Span::from_millis(25),
            mark_out_timeout: Span::from_millis(100),
            removal_timeout: Span::from_millis(500),
            election_timeout_min: Span::from_millis(300),
            election_timeout_max: Span::from_millis(600),
            flush_interval: Span::from_millis(200),
            clock_drift_ppm_max: 100,
            active_set_target,
            preferred_leader: None,
            follower_reads: true,
            durability_default: Durability::Memory,
            read_level_default: ReadLevel::Monotonic,
            limits: Limits::default(),
            append_entries_max: 256,
            append_bytes_max: APPEND_BYTES_MAX_DEFAULT,
            inflight_appends_max: 8,
            pending_requests_max: 10_000,
            undurable_entries_max: 100_000,
            state_bytes_max: STATE_BYTES_MAX_DEFAULT,
            dedup_clients_max: 10_000,
            snapshot_entries_threshold: 10_000,
            snapshot_log_percent: 50,
            snapshot_chunk_bytes: 1 << 20,
            snapshot_slice_interval: Span::from_millis(4),
            slow_follower_lag_max: 10_000,
            slow_follower_timeout: Span::from_millis(1_000),
            request_timeout: Span::from_millis(5_000),
            unsafe_allow_hasty_removal: false,
            unsafe_release_unasked: false,
            unsafe_view_reads_unchecked: false,
            unsafe_forget_leader_contact: false,
            unsafe_skip_dedup: false,
            unsafe_accept_expired_sessions: false,
            unsafe_accept_stale_opens: false,
            unsafe_watch_ignores_deletes: false,
            unsafe_slots_serve_held: false,
            unsafe_slots_fill_overwrites: false,
            unsafe_slots_take_unasked: false,
            unsafe_ignore_repair_floor: false,
            unsafe_pre_vote_ignores_leader: false,
            wall_clock_origin_ms: 0,
            unsafe_expire_on_local_clock: false,
            unsafe_count_removed: false,
            unsafe_learner_reads_early: false,
            unsafe_transfer_keeps_lease: false,
        }
    }

    /// The range this node draws election timeouts from (nanoseconds, `[low, high)`):
    /// the whole range, or a preferred leader's early quarter, or the late half for the
    /// others while a leader is preferred. Every draw is at least `election_timeout_min`,
    /// which the leader lease is computed from.
    pub fn election_timeout_range(&self) -> (u64, u64) {
        let (min, max) = (self.election_timeout_min.0, self.election_timeout_max.0);
        let span = max - min;
        let range = match self.preferred_leader {
            None => (min, max),
            Some(p) if p == self.node_id => (min, min + (span / 4).max(1)),
            Some(_) => (min + span / 2, max),
        };
        assert!(range.0 >= min && range.0 < range.1 && range.1 <= max);
        range
    }

    /// The range of the first election timeout after boot: as
    /// [`Config::election_timeout_range`], except that while another member is preferred
    /// this node waits `[max, max + span/2)`, so that the preferred one wins the first
    /// election even when the members' processes start a little apart.
    pub fn election_timeout_range_at_boot(&self) -> (u64, u64) {
        let (min, max) = (self.election_timeout_min.0, self.election_timeout_max.0);
        match self.preferred_leader {
            Some(p) if p != self.node_id => (max, max + ((max - min) / 2).max(1)),
            _ => self.election_timeout_range(),
        }
    }

    /// The largest peer message this configuration can send: a snapshot chunk, or an
    /// `Append` of `append_bytes_max` bytes plus one largest entry (a compare-and-set
    /// carries two values), each with room for its other fields. A receiver need not
    /// accept larger frames.
    pub fn peer_message_bytes_max(&self) -> u64 {
        let entry =
            256 + u64::from(self.limits.key_bytes_max) + 2 * u64::from(self.limits.value_bytes_max);
        let append = self.append_bytes_max + entry;
        self.snapshot_chunk_bytes.max(append) + PEER_MESSAGE_OVERHEAD_BYTES
    }

    /// A strict majority of the configured voters (the log's membership, once it names
    /// one, decides: `Core::majority`).
    pub fn majority(&self) -> usize {
        self.members.len() / 2 + 1
    }

    /// How long a leader may serve after the newest `Append` a majority acknowledged was
    /// sent: `election_timeout_min / (1 + ρ)² − mark_out_timeout − heartbeat_interval`
    /// (zero if negative; [`Config::validate`] refuses that).
    pub fn leader_lease(&self) -> Span {
        let ppm = self.clock_drift_ppm_max;
        let safe = shrink(shrink(self.election_timeout_min, ppm), ppm);
        Span(safe.0.saturating_sub(self.mark_out_timeout.0 + self.heartbeat_interval.0))
    }

    /// The shortest removal timeout allowed: `5 · mt`. It is safe while it exceeds
    /// `mt · (1 + ρ)²` (checked too, for drift bounds that make it matter).
    pub fn removal_timeout_min(&self) -> Span {
        let ppm = self.clock_drift_ppm_max;
        let ratio = Span(self.mark_out_timeout.0.saturating_mul(REMOVAL_TO_MARK_OUT_RATIO_MIN));
        let drifted = stretch(stretch(self.mark_out_timeout, ppm), ppm);
        ratio.max(Span(drifted.0 + 1))
    }

    /// Checks every field; the error names the first one out of range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_members()?;
        self.validate_settings()
    }

    /// Checks every field but the members (what a node that hosts no leader-engine
    /// keyspace still takes from this configuration: its limits).
    pub fn validate_settings(&self) -> Result<(), ConfigError> {
        self.validate_timers()?;
        self.validate_limits()
    }

    fn validate_members(&self) -> Result<(), ConfigError> {
        let n = self.members.len();
        // A new keyspace starts with 3, 5 or 7 voters; a node joining one names its voters
        // as they are now, which membership changes may have left at any count.
        let counts = keel_types::Membership::VOTERS_MIN..=keel_types::Membership::VOTERS_MAX;
        if !(matches!(n, 3 | 5 | 7) || (self.joining && counts.contains(&n))) {
            return fail("members", format!("need 3, 5 or 7 members, got {n}"));
        }
        let mut sorted = self.members.clone();
        sorted.sort();
        sorted.dedup();
        if sorted.len() != n {
            return fail("members", "duplicate member ids");
        }
        match (self.members.contains(&self.node_id), self.joining) {
            (false, false) => return fail("node_id", format!("{} is not a member", self.node_id)),
            (true, true) => {
                return fail("joining", "a member of the configured voters joins nothing")
            }
            _ => {}
        }
        if self.preferred_leader.is_some_and(|p| !self.members.contains(&p)) {
            return fail("preferred_leader", "must be a member");
        }
        if self.active_set_target < self.majority() || self.active_set_target > n {
            return fail("active_set_target", format!("must be in {}..={n}", self.majority()));
        }
        Ok(())
    }

    fn validate_timers(&self) -> Result<(), ConfigError> {
        if self.mark_out_timeout.0 == 0 || self.heartbeat_interval.0 == 0 {
            return fail("mark_out_timeout", "timers must be positive");
        }
        if self.heartbeat_interval.0.saturating_mul(3) > self.mark_out_timeout.0 {
            return fail("heartbeat_interval", "must be at most mark_out_timeout / 3");
        }
        let rt_min = self.removal_timeout_min();
        if self.removal_timeout < rt_min && !self.unsafe_allow_hasty_removal {
            let reason =
                format!("must be at least 5 × mark_out_timeout = {} ms", rt_min.as_millis());
            return fail("removal_timeout", reason);
        }
        if self.election_timeout_min >= self.election_timeout_max {
            return fail("election_timeout_max", "must exceed election_timeout_min");
        }
        if self.leader_lease().0 < self.heartbeat_interval.0.saturating_mul(2) {
            let reason = "election_timeout_min/(1+drift)² − mark_out_timeout − heartbeat_interval \
                          (the leader lease) must be at least two heartbeats";
            return fail("election_timeout_min", reason);
        }
        if self.clock_drift_ppm_max > 100_000 {
            return fail("clock_drift_ppm_max", "at most 100000 (10%)");
        }
        if self.flush_interval.0 == 0 || self.request_timeout.0 == 0 {
            return fail("flush_interval", "flush_interval and request_timeout must be positive");
        }
        if self.slow_follower_timeout.0 == 0 {
            return fail("slow_follower_timeout", "must be positive");
        }
        Ok(())
    }

    fn validate_limits(&self) -> Result<(), ConfigError> {
        if let Err(reason) = self.limits.validate() {
            return fail("limits", reason);
        }
        if self.append_entries_max == 0 || self.append_entries_max > APPEND_ENTRIES_CEILING {
            return fail("append_entries_max", format!("must be in 1..={APPEND_ENTRIES_CEILING}"));
        }
        if self.append_bytes_max == 0 || self.append_bytes_max > APPEND_BYTES_CEILING {
            return fail("append_bytes_max", format!("must be in 1..={APPEND_BYTES_CEILING}"));
        }
        if self.inflight_appends_max == 0 || self.inflight_appends_max > 1024 {
            return fail("inflight_appends_max", "must be in 1..=1024");
        }
        if self.pending_requests_max == 0 || self.pending_requests_max > QUEUE_CEILING {
            return fail("pending_requests_max", format!("must be in 1..={QUEUE_CEILING}"));
        }
        let dedup_ceiling = keel_types::limits::DEDUP_CLIENTS_CEILING as usize;
        if self.dedup_clients_max == 0 || self.dedup_clients_max > dedup_ceiling {
            return fail("dedup_clients_max", format!("must be in 1..={dedup_ceiling}"));
        }
        if self.state_bytes_max
            < u64::from(self.limits.value_bytes_max) + u64::from(self.limits.key_bytes_max)
        {
            return fail("state_bytes_max", "must hold at least one largest key and value");
        }
        if self.undurable_entries_max == 0 {
            return fail("undurable_entries_max", "must be positive");
        }
        if self.snapshot_chunk_bytes == 0
            || self.snapshot_chunk_bytes > SNAPSHOT_CHUNK_BYTES_CEILING
        {
            let ceiling = SNAPSHOT_CHUNK_BYTES_CEILING;
            return fail("snapshot_chunk_bytes", format!("must be in 1..={ceiling}"));
        }
        if self.snapshot_log_percent > 10_000 {
            return fail("snapshot_log_percent", "must be at most 10000");
        }
        if self.snapshot_entries_threshold == 0 {
            return fail("snapshot_entries_threshold", "must be positive");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn three() -> Config {
        Config::new(NodeId(1), vec![NodeId(1), NodeId(2), NodeId(3)])
    }

    #[test]
    fn defaults_are_valid_and_lease_is_shorter_than_election() {
        let config = three();
        config.validate().unwrap();
        let lease = config.leader_lease();
        assert!(lease.0 > 0);
        assert!(lease.0 + config.mark_out_timeout.0 < config.election_timeout_min.0);
    }

    #[test]
    fn validate_names_the_bad_field() {
        let mut config = three();
        config.removal_timeout = Span::from_millis(400);
        assert_eq!(config.validate().unwrap_err().field, "removal_timeout");
        config.unsafe_allow_hasty_removal = true;
        config.validate().unwrap();
        let mut config = three();
        config.members.push(NodeId(4));
        assert_eq!(config.validate().unwrap_err().field, "members");
        let mut config = three();
        config.election_timeout_min = Span::from_millis(120);
        config.election_timeout_max = Span::from_millis(240);
        assert_eq!(config.validate().unwrap_err().field, "election_timeout_min");
        let mut config = three();
        config.heartbeat_interval = Span::from_millis(50);
        assert_eq!(config.validate().unwrap_err().field, "heartbeat_interval");
        let mut config = three();
        config.active_set_target = 1;
        assert_eq!(config.validate().unwrap_err().field, "active_set_target");
    }

    #[test]
    fn a_preferred_leader_draws_early_and_the_others_late() {
        let mut config = three();
        assert_eq!(config.election_timeout_range(), (300_000_000, 600_000_000));
        config.preferred_leader = Some(NodeId(1));
        assert_eq!(config.election_timeout_range(), (300_000_000, 375_000_000));
        config.node_id = NodeId(2);
        assert_eq!(config.election_timeout_range(), (450_000_000, 600_000_000));
        assert_eq!(config.election_timeout_range_at_boot(), (600_000_000, 750_000_000));
        config.preferred_leader = Some(NodeId(9));
        assert_eq!(config.validate().unwrap_err().field, "preferred_leader");
    }

    #[test]
    fn removal_bound_is_five_mark_outs_and_drift_shortens_the_lease() {
        let mut config = three();
        assert_eq!(config.removal_timeout_min(), Span::from_millis(500));
        let lease_without_drift = {
            config.clock_drift_ppm_max = 0;
            config.leader_lease()
        };
        config.clock_drift_ppm_max = 10_000;
        assert!(config.leader_lease() < lease_without_drift);
        assert_eq!(lease_without_drift, Span::from_millis(175));
    }
}
