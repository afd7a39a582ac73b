//! Membership changes: the voters of a Kite keyspace change while it serves, and nothing
//! completed is lost (`docs/kite.md`, Membership changes, gives the argument).
//!
//! - **Where it is decided.** The membership is the value of a reserved key
//!   ([`MEMBERSHIP_KEY`]), changed only by a compare-and-swap from epoch `e` to `e + 1`,
//!   through the per-key Paxos every read-modify-write uses. A node takes a membership
//!   when it applies a newer one (a commit, a rejoin's page), or from a peer (a reply's
//!   view, a page, a state request, a sync query, news), never going back.
//! - **Joint quorums.** A change from voters `C` to `C'` goes through the joint
//!   membership `(C, C')`, in which every quorum (reads, acknowledgements, promises,
//!   acceptances, slow releases) is a majority of `C` and a majority of `C'`, and a
//!   release's fast path waits for every voter of both.
//! - **One epoch per round.** Every reply carries its sender's epoch. A newer one is
//!   taken (from the view the reply carries) before the reply counts; a reply of an
//!   older epoch never counts, and its sender is sent the news. So a reply sent after its
//!   sender took a membership reaches a round only under that membership.
//! - **The sync.** Every voter of `C'` reads the state of a majority of `C` (the pages a
//!   rejoin reads; each node asked takes the joint membership before it answers: its
//!   fence). The change settles on `C'` alone only once a majority of `C'` has: a
//!   [`Message::SyncQuery`] round, then the second compare-and-swap. Everything completed
//!   under `C` alone is then held by a majority of `C'`.
//! - **The fast path.** A voter leaving (in `C`, not in `C'`) and a voter joining that has
//!   not synced serve no key from the fast path; every node raises its machine epoch when
//!   it takes a membership and when it finishes a sync, so keys read before come back to
//!   the fast path only through a quorum.
//! - **Nodes outside.** A node that votes on neither side serves no client; it still
//!   answers its peers (only replies of the asker's epoch count). Every node that takes a
//!   membership sends it to the members outside it, whom no round reaches.

use super::rejoin::Rejoin;
use super::{KiteEngine, KiteOp, KiteResult, Message, NodeId, Phase, RmwId, RoundId};
use crate::kite::types::{Membership, VotersWanted, MEMBERSHIP_KEY};
use keel_types::{KeelError, Key, Value};

/// What a step's read of the membership compares the key with: never a membership's bytes
/// (those are JSON), so the compare-and-swap reads and never swaps.
const CONFIRM_EXPECTED: &[u8] = b"\0keel:membership-read";

/// A membership change's step waiting for a majority of the new voters to have synced.
#[derive(Clone, Debug)]
pub(super) struct SyncWait {
    round: RoundId,
    /// The joint membership being settled.
    joint: Membership,
    rid: RmwId,
}

impl SyncWait {
    /// Whether it waits on round `id`.
    pub(super) fn waits_on(&self, id: RoundId) -> bool {
        self.round == id
    }

    /// The round it waits on.
    pub(super) fn round(&self) -> RoundId {
        self.round
    }
}

/// The smallest majority of `n` voters.
pub(super) fn majority(n: usize) -> usize {
    n / 2 + 1
}

impl KiteEngine {
    /// The membership this node knows.
    pub fn membership(&self) -> &Membership {
        &self.membership
    }

    /// The mask (member indexes) of `nodes`; nodes outside the members name no bit.
    pub(super) fn mask_of(&self, nodes: &[NodeId]) -> u64 {
        nodes.iter().filter_map(|&n| self.index_of(n)).fold(0, |m, i| m | (1 << i))
    }

    /// The voters of both sides: whom rounds are sent to, and whose acknowledgements a
    /// release's fast path waits for.
    pub(super) fn voting_mask(&self) -> u64 {
        self.voters_mask | self.next_mask
    }

    /// Whether the members of `mask` are a quorum: a majority of the voters and, during a
    /// change, of the new voters too.
    pub(super) fn is_quorum(&self, mask: u64) -> bool {
        let majority_of = |side: u64| 2 * (mask & side).count_ones() > side.count_ones();
        if self.next_mask != 0 && self.config.unsafe_new_quorum_only {
            return majority_of(self.next_mask);
        }
        majority_of(self.voters_mask) && (self.next_mask == 0 || majority_of(self.next_mask))
    }

    /// Whether this node votes on either side.
    pub(super) fn votes(&self) -> bool {
        self.membership.contains(self.config.node)
    }

    /// Whether relaxed accesses may take the fast path here: not while leaving, nor while
    /// joining and not yet synced (`docs/kite.md`, Membership changes).
    pub(super) fn fast_path(&self) -> bool {
        let me = self.config.node;
        let Some(next) = &self.membership.next else {
            return self.membership.voters.contains(&me);
        };
        next.contains(&me)
            && (self.membership.voters.contains(&me) || self.synced >= self.membership.epoch)
    }

    /// Takes `m` if it is newer than the membership known: rounds open are sent on to the
    /// voters they have not reached, the machine epoch rises, the view changes (so peers
    /// hear of it), and a change under way that names this node starts its sync.
    pub(super) fn take_membership(&mut self, m: Membership) {
        if m.epoch <= self.membership.epoch {
            return;
        }
        // The gate checks what peers send as a membership, but a value written at the
        // key is bytes: one that is not a membership of members is not taken.
        if !m.valid() || m.voters.iter().chain(m.target()).any(|&v| self.index_of(v).is_none()) {
            self.counters.rejected += 1;
            return;
        }
        let before = self.voting_mask();
        self.membership = m;
        self.voters_mask = self.mask_of(&self.membership.voters);
        self.next_mask = self.membership.next.as_deref().map_or(0, |n| self.mask_of(n));
        self.counters.memberships += 1;
        // The configured voters no longer decide anything.
        self.voters_disagree.clear();
        // On disk before any message this step sends: a restart rejoins only once it
        // learned a membership at least this new (its stale boot membership may make it
        // count the wrong voters, or none).
        self.out.hard_state = Some(keel_types::HardState {
            epoch: keel_types::Epoch(u64::from(self.config.incarnation)),
            members_epoch: self.membership.epoch,
            ..keel_types::HardState::default()
        });
        self.view_gen += 1;
        self.epoch += 1;
        let added = self.voting_mask() & !before;
        self.tell_outside();
        self.ask_rounds_again(added);
        self.sync = None;
        self.start_sync();
    }

    /// News of this node's membership, for a peer behind, outside or configured otherwise.
    fn news(&self) -> Message {
        Message::MembershipNews { membership: self.membership.clone() }
    }

    /// The members that vote on neither side (removed, or never added) are sent the
    /// membership just taken: no round reaches them, so they would keep the one they last
    /// took, and show it in their status.
    fn tell_outside(&mut self) {
        let (me, all) = (self.config.node, (1u64 << self.config.members.len()) - 1);
        for node in self.members_of(all & !self.voting_mask()).into_iter().filter(|&n| n != me) {
            let news = self.news();
            self.out.messages.push((node, news));
        }
    }

    /// Every open round asked again under the membership just taken: its replies were
    /// counted under the one before, whose quorums may not meet the new one's (a Paxos
    /// acceptance counted under a later membership could choose a value a proposer of the
    /// earlier one rightly never saw: found by the simulator, seed 93000463). This node
    /// answers its own rounds again at once (its own proposal granted again: seed
    /// 98002586 read a key past its session's own write when it was refused).
    fn ask_rounds_again(&mut self, added: u64) {
        let (me, now, mixed) = (self.config.node, self.now, self.config.unsafe_mixed_epoch_rounds);
        for (_, msg) in self.rounds.ask_again(added, now, mixed) {
            if let Some(reply) = self.serve(me, msg) {
                self.record_reply(me, reply);
            }
        }
    }

    /// Takes the membership a peer sent; answers a peer found behind with this node's.
    pub(super) fn on_membership_news(&mut self, from: NodeId, m: Membership) {
        if self.compare_configured(from, &m) {
            // Found to disagree just now: the sender is told this node's list in turn.
            let news = self.news();
            self.out.messages.push((from, news));
        }
        if m.epoch < self.membership.epoch {
            let news = self.news();
            self.out.messages.push((from, news));
        }
        self.take_membership(m);
    }

    /// Whether a reply of epoch `epoch` from `from` counts: only one of this node's
    /// epoch. (Its view was taken already.) A sender behind is sent the news; one ahead
    /// whose view this node lacks is sent this node's membership, which it answers with
    /// its own.
    pub(super) fn admit_epoch(&mut self, from: NodeId, epoch: u64) -> bool {
        if epoch == self.membership.epoch {
            return self.admit_configured();
        }
        self.counters.replies_other_epoch += 1;
        let news = self.news();
        self.out.messages.push((from, news));
        false
    }

    /// Compares the membership `from` sent (in a view, a page, a state request or news)
    /// with this node's while both are the configured one (epoch 0): two nodes configured
    /// with other `voters` would count other quorums, so while one is known, this node
    /// counts no reply and refuses its clients, naming it (`sessions.rs`), until it learns
    /// a changed membership (which the nodes agreed on) or hears the member's list agree
    /// (restarted with the same list).
    /// `true`: `from` was found to disagree just now.
    pub(super) fn compare_configured(&mut self, from: NodeId, m: &Membership) -> bool {
        if m.epoch != 0 || self.membership.epoch != 0 || from == self.config.node {
            return false;
        }
        if m.voters == self.membership.voters {
            self.voters_disagree.remove(&from);
            return false;
        }
        let new = self.voters_disagree.insert(from);
        self.counters.voters_disagreements += u64::from(new);
        new
    }

    /// Whether a reply of this node's epoch counts: not at epoch 0 while some member is
    /// known to be configured with other voters (the node then serves nothing: its own
    /// side of the lists may hold a majority of its voters, as the other side may of its
    /// own).
    pub(super) fn admit_configured(&mut self) -> bool {
        if self.membership.epoch != 0 || self.voters_disagree.is_empty() {
            return true;
        }
        self.counters.replies_other_voters += 1;
        false
    }

    /// A membership taken from the value of [`MEMBERSHIP_KEY`] just applied.
    pub(super) fn adopt_from_key(&mut self, key: &[u8]) {
        if key != MEMBERSHIP_KEY {
            return;
        }
        let decoded =
            self.keys.get(key).and_then(|s| s.value.as_deref()).and_then(Membership::decode);
        if let Some(m) = decoded {
            self.take_membership(m);
        }
    }

    /// Starts reading the old voters' state when a change under way names this node as a
    /// new voter (a node rejoining after a restart reads it as part of its rejoin).
    fn start_sync(&mut self) {
        let me = self.config.node;
        let Some(next) = &self.membership.next else { return };
        if !next.contains(&me) || self.synced >= self.membership.epoch {
            return;
        }
        if self.config.unsafe_unsynced_change {
            return;
        }
        if self.rejoin.is_some() {
            return;
        }
        let sources: Vec<NodeId> =
            self.membership.voters.iter().copied().filter(|&v| v != me).collect();
        let ask = |after| Message::StateRequest {
            rejoin: self.writer,
            after,
            membership: self.membership.clone(),
        };
        let asks: Vec<(NodeId, Message)> =
            sources.iter().map(|&p| (p, ask(super::Cursor::Start))).collect();
        self.out.messages.extend(asks);
        self.sync = Some(Rejoin::reading(sources, self.now, false));
        self.finish_rejoin_if_complete();
    }

    /// A sync (or a rejoin during a change) read enough: this node holds what the old
    /// voters held at their fences. A joining voter's fast path opens from a new epoch.
    pub(super) fn synced_now(&mut self) {
        if self.membership.next.is_some() && self.synced < self.membership.epoch {
            self.synced = self.membership.epoch;
            self.counters.syncs += 1;
            self.epoch += 1;
            self.answer_own_sync_queries();
        }
    }

    /// This node synced: it answers its own sync queries still open, which it could not
    /// when they opened, as it would a peer's.
    fn answer_own_sync_queries(&mut self) {
        let me = self.config.node;
        let Some(bit) = self.index_of(me).map(|i| 1u64 << i) else { return };
        let open: Vec<Message> = self
            .rounds
            .iter()
            .filter(|(_, r)| r.pending & bit != 0 && matches!(r.msg, Message::SyncQuery { .. }))
            .map(|(_, r)| r.msg.clone())
            .collect();
        for query in open {
            if let Some(reply) = self.serve(me, query) {
                self.record_reply(me, reply);
                self.counters.own_sync_queries_answered += 1;
            }
        }
    }

    /// Whether the pages read from `done` (nodes with their memory, read to the end) are
    /// enough: after a restart (`restarted`), `n - q + 1` other voters of each side this
    /// node votes on; during a change that names it a new voter, a majority of the old
    /// voters (itself counted if it is one and kept its memory).
    pub(super) fn read_enough(&self, done: &[NodeId], restarted: bool) -> bool {
        let me = self.config.node;
        let others =
            |side: &[NodeId]| done.iter().filter(|d| **d != me && side.contains(d)).count();
        let m = &self.membership;
        let sides = std::iter::once(&m.voters[..]).chain(m.next.as_deref());
        for side in sides {
            let n = side.len();
            if restarted && side.contains(&me) && others(side) < (n - majority(n) + 1).min(n - 1) {
                return false;
            }
        }
        if let Some(next) = &m.next {
            if next.contains(&me) {
                // What completed under the old voters alone is held by a majority of them:
                // read a majority of them (this node among them if it kept its memory), or,
                // if it is one that lost its memory, the `n - q + 1` others that meet
                // every majority it was part of.
                let n = m.voters.len();
                let need = match (m.voters.contains(&me), restarted) {
                    (true, false) => majority(n) - 1,
                    (true, true) => n - majority(n) + 1,
                    (false, _) => majority(n),
                };
                if others(&m.voters) < need.min(n - usize::from(m.voters.contains(&me))) {
                    return false;
                }
            }
        }
        true
    }

    /// Starts a membership change's next step towards `voters`.
    pub(super) fn reconfigure_start(
        &mut self,
        session: u64,
        rid: RmwId,
        wanted: VotersWanted,
    ) -> Result<KiteResult, Phase> {
        let m = self.membership.clone();
        let voters = wanted.resolve(m.target());
        let refuse = |reason: String| Err(Phase::Refused(KeelError::InvalidArgument(reason)));
        let wanted = Membership { epoch: 0, voters: voters.clone(), next: None };
        if !wanted.valid() || voters.iter().any(|&v| self.index_of(v).is_none()) {
            return refuse(format!("voters {voters:?}: sorted members without repeats"));
        }
        if !self.votes() {
            return refuse(format!("node {} is not a voter", self.config.node.0));
        }
        match &m.next {
            // Settled on it as far as this node knows, which may be behind: read it.
            None if m.voters == voters => self.membership_confirm(session, rid),
            None => {
                let joint =
                    Membership { epoch: m.epoch + 1, voters: m.voters.clone(), next: Some(voters) };
                self.membership_cas(session, rid, &m, &joint)
            }
            Some(next) if *next == voters => {
                let round = self.sync_query(session, &m);
                self.sync_wait_progress(session, SyncWait { round, joint: m, rid })
            }
            Some(next) => Err(Phase::Refused(KeelError::Busy(format!(
                "a change to voters {next:?} is under way: finish it first"
            )))),
        }
    }

    /// Reads the membership in force at a quorum, as a strong compare-and-swap that cannot
    /// swap ([`CONFIRM_EXPECTED`] is never the key's value): a step answered done must
    /// not go by a membership this node alone still holds.
    fn membership_confirm(&mut self, session: u64, rid: RmwId) -> Result<KiteResult, Phase> {
        let expected = Some(Value::from_static(CONFIRM_EXPECTED));
        self.membership_rmw(session, rid, expected, self.membership.encode())
    }

    /// The compare-and-swap of the membership from `from` to `to`.
    fn membership_cas(
        &mut self,
        session: u64,
        rid: RmwId,
        from: &Membership,
        to: &Membership,
    ) -> Result<KiteResult, Phase> {
        assert_eq!(to.epoch, from.epoch + 1, "a change moves one epoch");
        let expected = (from.epoch > 0).then(|| from.encode());
        self.membership_rmw(session, rid, expected, to.encode())
    }

    /// A strong compare-and-swap of [`MEMBERSHIP_KEY`] as a step's read-modify-write.
    fn membership_rmw(
        &mut self,
        session: u64,
        rid: RmwId,
        expected: Option<Value>,
        new: Value,
    ) -> Result<KiteResult, Phase> {
        let key = Key::from_static(MEMBERSHIP_KEY);
        let op = KiteOp::Cas { key: key.clone(), expected, new, strong: true };
        let started = self.rmw_start(session, rid, op);
        if matches!(started, Ok(_) | Err(Phase::Refused(_))) {
            self.rmw_key_free(&key, session);
        }
        started
    }

    /// Asks the new voters whether they synced for `joint`.
    fn sync_query(&mut self, session: u64, joint: &Membership) -> RoundId {
        let msg = Message::SyncQuery { round: 0, membership: joint.clone() };
        let pending = self.next_mask;
        self.broadcast_to(session, msg, pending)
    }

    /// Waits for a majority of the new voters to have synced, then settles the change.
    pub(super) fn sync_wait_progress(
        &mut self,
        session: u64,
        wait: SyncWait,
    ) -> Result<KiteResult, Phase> {
        if self.membership != wait.joint {
            // Settled or moved on meanwhile: where it stands now, read at a quorum.
            self.close(wait.round);
            return self.membership_confirm(session, wait.rid);
        }
        let next = wait.joint.next.clone().expect("a joint membership");
        let synced = self.rounds.get(wait.round).map_or(0, |r| r.replies_bits);
        let enough = 2 * (synced & self.next_mask).count_ones() > self.next_mask.count_ones();
        if !enough && !self.config.unsafe_unsynced_change {
            return Err(Phase::SyncWait(wait));
        }
        self.close(wait.round);
        let settled = Membership { epoch: wait.joint.epoch + 1, voters: next, next: None };
        self.membership_cas(session, wait.rid, &wait.joint, &settled)
    }

    /// A sync query: taken, and answered once this node synced for it.
    pub(super) fn serve_sync_query(
        &mut self,
        from: NodeId,
        round: RoundId,
        m: Membership,
    ) -> Option<Message> {
        let epoch = m.epoch;
        self.take_membership(m);
        let synced = self.synced >= epoch || self.membership.epoch > epoch;
        synced.then(|| Message::Synced { round, by: self.origin_for(from) })
    }

    /// The membership's invariants: well formed, its masks in step, the key's value never
    /// ahead of it, a sync only for a change naming this node.
    pub(super) fn check_membership(&self) {
        let m = &self.membership;
        assert!(m.valid(), "a membership not well formed: {m:?}");
        assert_eq!(self.voters_mask, self.mask_of(&m.voters), "the voters' mask");
        assert_eq!(self.next_mask, m.next.as_deref().map_or(0, |n| self.mask_of(n)), "next mask");
        assert_eq!(self.voters_mask.count_ones() as usize, m.voters.len(), "voters are members");
        assert!(self.synced <= m.epoch, "synced for an epoch not reached");
        let kept = self.keys.get(MEMBERSHIP_KEY).and_then(|s| s.value.as_deref());
        if let Some(kept) = kept.and_then(Membership::decode) {
            assert!(kept.epoch <= m.epoch, "the membership key ahead of the membership");
        }
        assert!(self.rejoin.as_ref().is_none_or(|r| r.restarted()), "a rejoin not a restart's");
        if let Some(sync) = &self.sync {
            assert!(!sync.restarted(), "a sync kept as a restart's");
            assert!(self.rejoin.is_none(), "a sync while rejoining");
            assert!(m.next.as_ref().is_some_and(|n| n.contains(&self.config.node)), "a sync");
        }
    }
}
