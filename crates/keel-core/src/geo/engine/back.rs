//! Taking a removed data center back, step 2 (`docs/geo.md`, *Taking a data center
//! back: the protocol*): what the survivors and the new replicas do once the return is
//! agreed (`agree.rs`, `remove.rs`).
//!
//! - A **survivor** that learns the return of `r` forgets `r`'s rows (so collection
//!   stops for it), and opens a fresh channel to each member of `r`: the `Changed` of
//!   the return first, then, to the new replica of its partition, its answer: what it
//!   stores of `r`'s old life (its known entry). On the cut it drops what it holds of
//!   the old life above it, and once its known entry reaches the cut it is settled.
//! - A **new replica** boots joining ([`Joining`]): it serves nothing and sends nothing
//!   until it learns its data center's return, then opens each channel with `Join`.
//!   Once every survivor answered (every data center not removed), it sends the largest
//!   entry they store to the new replica of partition 0, which takes the smallest over
//!   the partitions, the cut, and sends it to every replica of every survivor and of
//!   `r`: everything at or below it is stored at every partition by some survivor (and
//!   reaches all of them by forwarding), nothing above it is stored whole anywhere.
//! - A member of a returning data center is heard only from the boot whose channel
//!   opened with `Join` of the return's epoch (`heard_back`): the old life never sends
//!   one, and a new replica that restarts is lost as any.
//!
//! The copy, holding streams and the source's forwarding (step 3) come next: a return
//! stops at *settled*, and the data center still counts as removed meanwhile.

use super::super::channel::Channel;
use super::super::types::{Back, Body, Change, Message, Replicated, Vector};
use super::GeoEngine;
use keel_types::{KeelError, NodeId};
use std::collections::{BTreeMap, BTreeSet};

/// Timestamps of life `l` lie at or above `l << LIFE_SHIFT`: the two top bits name the
/// life (a wall clock in µs shifted by the partition bits stays below `1 << 62`).
pub(crate) const LIFE_SHIFT: u32 = 62;

/// The first timestamp of the life that `epoch` starts or continues.
pub(crate) fn life_floor(epoch: u32) -> u64 {
    u64::from(epoch / 2) << LIFE_SHIFT
}

/// A survivor's part in one data center's return.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Welcome {
    /// The return's epoch.
    pub epoch: u32,
    /// What it answered it stores of the old life (its known entry then): until the cut
    /// is applied, the row this partition reports to its siblings names no more of it
    /// (`reported_row`), so that its data center's stable entry stays at or below the
    /// cut, whatever a late survivor forwards meanwhile.
    pub stored: u64,
    /// The cut, once applied here.
    pub cut: Option<u64>,
    /// Whether it told the new replica of its partition it is settled.
    pub settled: bool,
    /// The copy its new replica asked for, until this source's known vector covers what
    /// it needs (`Back::CopyAsk`).
    pub copy: Option<Vec<u64>>,
}

/// What a survivor keeps of a data center's old life once it applied a cut, for good:
/// its stable entry for it never passes the cut below the next life's first timestamp
/// (a partition of its own data center that has not applied the cut may still hold
/// fragments above it), and what arrives of the old life above it is dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Limit {
    /// The cut.
    pub value: u64,
    /// The epoch of the return that made it.
    pub epoch: u32,
}

/// `cut` lowered out of every range an earlier return's cut lost: a survivor that never
/// applied that cut (the return was abandoned first) may store the old life above it at
/// one partition, while every survivor that applied it dropped the other partitions'
/// fragments (`docs/geo.md`, *Taken back again*).
pub(crate) fn below_earlier_cuts(mut cut: u64, earlier: &BTreeSet<Limit>) -> u64 {
    while let Some(l) = earlier.iter().find(|l| l.loses(cut)) {
        cut = l.value;
    }
    cut
}

impl Limit {
    /// Whether `ts` lies between the cut and the first timestamp of the return's life:
    /// lost. A data center taken back twice has a limit per return, each losing its own
    /// range (the second return's old life may be the first's, or still the one before
    /// if that return was abandoned before its new life issued anything).
    pub(crate) fn loses(&self, ts: u64) -> bool {
        ts > self.value && ts < life_floor(self.epoch)
    }
}

/// A new replica's state until it is back.
#[derive(Clone, Debug, Default)]
pub(crate) struct Joining {
    /// The epoch of its data center's return, once it learned it.
    pub epoch: Option<u32>,
    /// The answers, by survivor data center: what it stores of the old life, its
    /// propagated entry.
    pub answers: BTreeMap<u32, (u64, u64)>,
    /// Whether its partial went to the new replica of partition 0.
    pub partial_sent: bool,
    /// Partition 0: the partials (the largest entry a survivor stores), by partition.
    pub partials: BTreeMap<u32, u64>,
    /// The cuts of its data center's earlier returns that the answers (and, at partition
    /// 0, the partials) named.
    pub earlier_cuts: BTreeSet<Limit>,
    /// The cut, once known.
    pub cut: Option<u64>,
    /// The survivor data centers settled for its partition.
    pub settled: BTreeSet<u32>,
    /// The peers its channel opened with `Join` to.
    pub joined_to: BTreeSet<NodeId>,
    /// What it sent to a peer before it could open their channel with `Join`.
    pub unjoined: BTreeMap<NodeId, Vec<Body>>,
    /// What each survivor sent after its answer (its stream: transactions and its last
    /// heartbeat), held until the new replica is installed.
    pub held: BTreeMap<NodeId, Vec<Body>>,
    /// The survivor data center asked for the copy, once asked.
    pub source: Option<u32>,
    /// The copy's chunks so far.
    pub chunks: Vec<(u32, Replicated)>,
}

impl GeoEngine {
    /// The boot this node's messages to `peer` name: its own plus the epoch of the
    /// peer's data center, so that every change of a data center starts every direction
    /// to its members over (a removal's notice, a return's first `Changed`).
    pub(crate) fn boot_to(&self, peer: NodeId) -> u64 {
        let epoch = self.member(peer).map_or(0, |m| self.epochs[m.dc as usize]);
        self.boot.saturating_add(u64::from(epoch))
    }

    /// Whether `data center` is coming back as this node sees it: returning here, or
    /// this replica's own while it joins.
    fn coming_back(&self, dc: u32) -> bool {
        self.returning[dc as usize] || (dc == self.me.dc && self.joining.is_some())
    }

    /// Whether `message` from `from`, a member of data center `dc`, is heard: a member
    /// of a data center coming back only from the boot whose channel opened with `Join`
    /// of the return's epoch; a new replica hears nothing of its own data center before
    /// it learned the return.
    pub(crate) fn heard_back(&mut self, from: NodeId, dc: u32, message: &Message) -> bool {
        if !self.coming_back(dc) {
            // A member that came back is heard from the boot that joined, for good.
            return self.joined.get(&from).is_none_or(|&boot| message.boot == boot);
        }
        let epoch = self.epochs[dc as usize];
        if dc == self.me.dc && self.joining.as_ref().is_some_and(|j| j.epoch.is_none()) {
            return false;
        }
        match self.joined.get(&from) {
            Some(&boot) => message.boot == boot,
            None => {
                let opens = message.first == 0
                    && matches!(message.bodies.first(),
                        Some(Body::Back(Back::Join { epoch: e })) if *e == epoch);
                if opens {
                    self.joined.insert(from, message.boot);
                    self.counters.joins_heard += 1;
                }
                opens
            }
        }
    }

    /// A survivor learned the return of data center `dc` at `change.epoch`: it forgets
    /// `dc`'s old rows, and opens a fresh channel to each of its members with the return,
    /// and to the new replica of its partition its answer.
    pub(crate) fn welcome_return(&mut self, change: Change) {
        let dc = change.dc as usize;
        let stored = self.partition.known.dcs[dc];
        self.welcomes[dc] =
            Some(Welcome { epoch: change.epoch, stored, cut: None, settled: false, copy: None });
        if !self.config.unsafe_no_freeze {
            let zero = Vector::zero(self.dcs);
            self.uniformity.global[dc] = zero.clone();
            self.uniformity.stable_matrix[dc] = zero;
        }
        let members = self.replicas[dc].clone();
        for &node in &members {
            self.removed_nodes.remove(&node);
            self.joined.remove(&node);
            let mut channel = Channel::default();
            channel.push(Body::Changed { change });
            self.channels.insert(node, channel);
        }
        let own = self.partition.propagated;
        let cuts = self.limits[dc].iter().map(|l| (l.value, l.epoch)).collect();
        let epochs = self.epochs.clone();
        let answer = Back::Answer { epoch: change.epoch, stored, own, epochs, cuts };
        self.send(self.replica(change.dc, self.me.partition), Body::Back(answer));
        self.counters.returns_welcomed += 1;
    }

    /// A survivor learned that the return of `dc` was abandoned (removed again): its
    /// members get the removal's notice again and are not heard; the limit stays.
    pub(crate) fn abandon_welcome(&mut self, change: Change) {
        let dc = change.dc as usize;
        self.welcomes[dc] = None;
        self.sending[dc] = None;
        for &node in &self.replicas[dc].clone() {
            self.joined.remove(&node);
            self.removed_nodes.insert(node);
            self.channels.insert(node, Channel::notice(Body::Changed { change }));
        }
    }

    /// The row this partition reports to its siblings: its known vector, with the entry
    /// of each data center whose return it welcomed, its cut not applied yet, capped at
    /// what its answer named. The cut is the smallest over the partitions of the largest
    /// answer, so the minimum of these rows (this data center's stable entry) stays at or
    /// below it, and the cut is never found below the stable entry (`cut_in`).
    pub(crate) fn reported_row(&self) -> Vector {
        let mut row = self.partition.known.clone();
        for (r, w) in self.welcomes.iter().enumerate() {
            if let Some(w) = w.as_ref().filter(|w| w.cut.is_none()) {
                row.dcs[r] = row.dcs[r].min(w.stored);
            }
        }
        row
    }

    /// Lowers `stable`'s entries to their data centers' limits, below each next life.
    pub(crate) fn clamp_to_limits(&self, stable: &mut Vector) {
        for (dc, limits) in self.limits.iter().enumerate() {
            for limit in limits {
                let entry = &mut stable.dcs[dc];
                if *entry < life_floor(limit.epoch) {
                    *entry = (*entry).min(limit.value);
                }
            }
        }
    }

    /// Keeps `stable`'s entry for a data center removed here (or returning) where it is,
    /// while another partition's row names a later life than that entry's, one whose
    /// return's cut this replica has not applied: the minimum over the partitions would
    /// pass fragments of the old life above that cut, which this replica has not dropped
    /// while its siblings did (`docs/geo.md`, *The cut, kept for good* and *Taken back
    /// again*). Once this replica applies the cut (a later return's cut brings those of
    /// the returns abandoned before theirs reached it), `clamp_to_limits` holds it instead.
    pub(crate) fn hold_unknown_lives(&self, stable: &mut Vector) {
        let held_dcs = (0..self.dcs).filter(|&j| self.removed[j] && !self.config.unsafe_no_hold);
        for j in held_dcs {
            let held = self.uniformity.stable.dcs[j];
            let Some(top) = self.uniformity.local.iter().map(|row| row.dcs[j] >> LIFE_SHIFT).max()
            else {
                continue;
            };
            let applied = |life: u64| self.limits[j].iter().any(|l| u64::from(l.epoch) == 2 * life);
            if ((held >> LIFE_SHIFT) + 1..=top).any(|life| !applied(life)) {
                stable.dcs[j] = stable.dcs[j].min(held);
            }
        }
    }

    /// The cut below `ts`, a timestamp of `origin`, if a cut applied here lost it: once
    /// the cut of `origin`'s return is applied, nothing of its old life above the cut (a
    /// forward sent before the sender applied it) is taken, and a heartbeat is lowered
    /// to the cut.
    pub(crate) fn lost_above(&self, origin: u32, ts: u64) -> Option<u64> {
        self.limits[origin as usize].iter().find(|l| l.loses(ts)).map(|l| l.value)
    }

    /// One body of a return, at a survivor or a new replica.
    pub(crate) fn back_in(&mut self, from: NodeId, back: Back) {
        let Some(peer) = self.member(from) else { return };
        match back {
            Back::Join { .. } => {}
            Back::Answer { epoch, stored, own, epochs, cuts } => {
                self.answer_in(peer.dc, epoch, (stored, own), &epochs, &cuts)
            }
            Back::Partial { epoch, stored, cuts } => {
                self.partial_in(peer.partition, epoch, stored, &cuts)
            }
            Back::Cut { epoch, cut, earlier } => self.cut_in(peer.dc, epoch, cut, &earlier),
            Back::Settled { epoch } => {
                if let Some(j) = self.joining.as_mut().filter(|j| j.epoch == Some(epoch)) {
                    j.settled.insert(peer.dc);
                }
                self.ask_copy();
            }
            Back::CopyAsk { epoch, need } => self.copy_ask_in(peer.dc, epoch, need),
            Back::Chunk { epoch, txs } => self.chunk_in(peer.dc, epoch, txs),
            Back::Copied { epoch, known, kept, limits } => {
                self.copied_in(peer.dc, epoch, known, &kept, &limits)
            }
            Back::Installed { epoch, known } => self.installed_in(peer.dc, epoch, &known),
        }
    }

    /// A new replica takes a survivor's answer.
    fn answer_in(
        &mut self,
        dc: u32,
        epoch: u32,
        stored_own: (u64, u64),
        epochs: &[u32],
        cuts: &[(u64, u32)],
    ) {
        let d = self.me.dc as usize;
        let Some(j) = self.joining.as_mut().filter(|j| j.epoch == Some(epoch)) else { return };
        if let std::collections::btree_map::Entry::Vacant(e) = j.answers.entry(dc) {
            // One answer per survivor: its cuts taken once (the gate bounds each list).
            e.insert(stored_own);
            j.earlier_cuts.extend(cuts.iter().map(|&(value, epoch)| Limit { value, epoch }));
        }
        self.learn_epochs(epochs, d);
        self.send_partial();
    }

    /// Once every survivor answered (the first `N - f` with the negative control
    /// `unsafe_cut_quorum`), a new replica sends the largest entry they store to the new
    /// replica of partition 0.
    fn send_partial(&mut self) {
        let d = self.me.dc as usize;
        let survivors: Vec<u32> = (0..self.dcs as u32)
            .filter(|&i| i as usize != d && !self.removed[i as usize])
            .collect();
        let quorum = self.dcs - self.config.f as usize;
        let Some(j) = self.joining.as_mut() else { return };
        let (Some(epoch), false) = (j.epoch, j.partial_sent) else { return };
        let answered = match self.config.unsafe_cut_quorum {
            true => j.answers.len() >= quorum,
            false => survivors.iter().all(|dc| j.answers.contains_key(dc)),
        };
        if !answered {
            return;
        }
        j.partial_sent = true;
        let stored = j.answers.values().map(|&(stored, _)| stored).max().unwrap_or(0);
        let cuts = j.earlier_cuts.iter().map(|l| (l.value, l.epoch)).collect();
        let to = self.replica(self.me.dc, 0);
        self.send(to, Body::Back(Back::Partial { epoch, stored, cuts }));
    }

    /// A new replica learns the other data centers' epochs from an answer (its own it
    /// knows: it is the return's).
    fn learn_epochs(&mut self, epochs: &[u32], own: usize) {
        for (i, &e) in epochs.iter().enumerate().filter(|&(i, _)| i != own) {
            self.note_epoch(i as u32, e);
        }
    }

    /// A joining replica records that data center `dc` (not its own) is at `epoch`: it
    /// tells no one, as it sends nothing but its return's bodies (one return is under
    /// way at a time, so another data center is removed at an odd epoch, or a member).
    fn note_epoch(&mut self, dc: u32, epoch: u32) {
        let i = dc as usize;
        if epoch <= self.epochs[i] {
            return;
        }
        self.epochs[i] = epoch;
        self.removed[i] = epoch % 2 == 1;
        if self.removed[i] {
            self.removed_nodes.extend(self.replicas[i].iter().copied());
            for &node in &self.replicas[i] {
                self.channels.remove(&node);
            }
            // A survivor removed meanwhile is not waited for, and a source removed is
            // replaced.
            self.send_partial();
            self.ask_copy();
        }
    }

    /// The new replica of partition 0 takes a partition's partial; with every
    /// partition's, it sends the smallest, the cut, to every replica of every survivor
    /// and of its own data center.
    fn partial_in(&mut self, partition: u32, epoch: u32, stored: u64, cuts: &[(u64, u32)]) {
        let partitions = self.partitions as usize;
        let Some(j) = self.joining.as_mut().filter(|j| j.epoch == Some(epoch)) else { return };
        if j.partials.contains_key(&partition) {
            return;
        }
        j.partials.insert(partition, stored);
        j.earlier_cuts.extend(cuts.iter().map(|&(value, epoch)| Limit { value, epoch }));
        if j.partials.len() < partitions {
            return;
        }
        let least = j.partials.values().copied().min().unwrap_or(0);
        let cut = match self.config.unsafe_no_earlier_cuts {
            true => least,
            false => below_earlier_cuts(least, &j.earlier_cuts),
        };
        let earlier: Vec<(u64, u32)> = j.earlier_cuts.iter().map(|l| (l.value, l.epoch)).collect();
        let to: Vec<NodeId> = (0..self.dcs)
            .filter(|&i| !self.removed[i])
            .flat_map(|i| self.replicas[i].clone())
            .collect();
        for node in to {
            let earlier = earlier.clone();
            self.send(node, Body::Back(Back::Cut { epoch, cut, earlier }));
        }
        self.counters.cuts_made += 1;
    }

    /// The cut of the return of `dc`: a new replica records it; a survivor drops what
    /// it holds of `dc`'s old life above it and lowers its rows to it.
    fn cut_in(&mut self, dc: u32, epoch: u32, cut: u64, earlier: &[(u64, u32)]) {
        if dc == self.me.dc {
            if let Some(j) = self.joining.as_mut().filter(|j| j.epoch == Some(epoch)) {
                j.cut.get_or_insert(cut);
            }
            return self.ask_copy();
        }
        let r = dc as usize;
        if self.welcomes[r].as_ref().is_none_or(|w| w.epoch != epoch || w.cut.is_some()) {
            return;
        }
        if !self.config.unsafe_no_cut && !self.config.unsafe_no_earlier_cuts {
            self.take_earlier_cuts(r, epoch, earlier);
        }
        // Every partition of some survivor stores the old life to the cut, and none
        // stores more of it whole: nothing above it can be stable here. A cut below this
        // replica's stable entry is not one its new replicas made: dropped.
        if self.uniformity.stable.dcs[r] > cut && !self.config.unsafe_cut_quorum {
            self.counters.rejected += 1;
            return;
        }
        let Some(w) = self.welcomes[r].as_mut() else { return };
        w.cut = Some(cut);
        self.counters.cuts_applied += 1;
        if self.config.unsafe_no_cut {
            return;
        }
        self.apply_limit(r, Limit { value: cut, epoch });
        self.refuse_stale_syncs();
    }

    /// Applies the cuts of `r`'s earlier returns that this replica never applied (each
    /// return was abandoned before its cut reached here, while siblings of this data
    /// center applied it): the ranges they lost are lost here too, or this data center's
    /// stable entry would stand in one, above what those siblings dropped.
    fn take_earlier_cuts(&mut self, r: usize, epoch: u32, earlier: &[(u64, u32)]) {
        for &(value, e) in earlier {
            if e < epoch && !self.limits[r].iter().any(|l| l.epoch == e) {
                self.apply_limit(r, Limit { value, epoch: e });
                self.counters.earlier_cuts_taken += 1;
            }
        }
    }

    /// Keeps `limit` of data center `r` for good, in epoch order, and drops what this
    /// replica holds of the range it loses, lowering its rows for `r` out of it.
    fn apply_limit(&mut self, r: usize, limit: Limit) {
        self.limits[r].push(limit);
        self.limits[r].sort_by_key(|l| l.epoch);
        let lost = |ts: u64| limit.loses(ts);
        let lower = |ts: &mut u64| {
            if lost(*ts) {
                *ts = limit.value;
            }
        };
        let p = &mut self.partition;
        let mut dropped = 0;
        p.log.retain(|_, entries| {
            let before = entries.len();
            entries.retain(|e| e.origin as usize != r || !lost(e.commit.dcs[r]));
            dropped += before - entries.len();
            !entries.is_empty()
        });
        p.entries -= dropped;
        let above = p.remote_commits[r].split_off(&limit.value.saturating_add(1));
        p.remote_commits[r].extend(above.into_iter().filter(|&(ts, _)| !lost(ts)));
        lower(&mut p.known.dcs[r]);
        let u = &mut self.uniformity;
        for row in &mut u.local {
            lower(&mut row.dcs[r]);
        }
        lower(&mut u.stable.dcs[r]);
        let d = self.me.dc as usize;
        u.stable_matrix[d] = u.stable.clone();
        for sent in u.forwarded.iter_mut().filter(|((_, j), _)| *j as usize == r).map(|(_, s)| s) {
            lower(sent);
        }
        self.counters.old_life_dropped += dropped as u64;
    }

    /// A survivor whose known entry for a returning data center reached the applied cut
    /// tells the new replica of its partition it is settled.
    pub(crate) fn settle_returns(&mut self) {
        for r in 0..self.dcs {
            let Some(w) = self.welcomes[r].as_mut() else { continue };
            let Some(cut) = w.cut.filter(|_| !w.settled) else { continue };
            if self.partition.known.dcs[r] < cut {
                continue;
            }
            w.settled = true;
            let epoch = w.epoch;
            let to = self.replica(r as u32, self.me.partition);
            self.send(to, Body::Back(Back::Settled { epoch }));
            self.counters.returns_settled += 1;
        }
    }

    /// A joining replica learned a change of its own data center: a return starts its
    /// join (it opens its channels to its own data center's new replicas with `Join`;
    /// to a survivor, once that survivor's return reaches it); a later change abandons
    /// the return it joined, and it starts over as a new replica that knows the epochs
    /// (`rejoin`): a removal leaves it waiting for the next return, a later return (the
    /// removal in between missed) starts its join at once.
    pub(crate) fn own_change(&mut self, change: Change) {
        let d = self.me.dc as usize;
        if change.epoch <= self.epochs[d] {
            return;
        }
        self.epochs[d] = change.epoch;
        if self.joining.as_ref().is_some_and(|j| j.epoch.is_some()) {
            self.rejoin();
        }
        if change.removes() || self.is_removed() {
            return;
        }
        self.returning[d] = true;
        let Some(j) = self.joining.as_mut() else { return };
        j.epoch = Some(change.epoch);
        let own: Vec<NodeId> =
            self.replicas[d].iter().copied().filter(|&n| n != self.me.node).collect();
        for node in own {
            self.join_to(node);
        }
    }

    /// A joining replica whose return was abandoned starts over, as the operator's
    /// wiped machine would: a new boot (every channel it opened starts over at its
    /// peers, and nothing it sent under the old one is taken as the new one's), nothing
    /// of the join kept but the epochs it learned, so that a change it already knows,
    /// retransmitted by a survivor that learned it late, starts nothing. Stopping
    /// instead stalled the next return: a wiped replica built for it can take first a
    /// late survivor's retransmitted `Changed` of the abandoned return, then the
    /// abandon (seed 1170008548).
    fn rejoin(&mut self) {
        let Ok(mut fresh) = GeoEngine::boot(self.config.clone(), self.now) else {
            // Its own configuration booted it once, so this does not happen; if it did,
            // the replica stops, as a removed one.
            let d = self.me.dc as usize;
            self.joining = None;
            (self.removed[d], self.returning[d]) = (true, false);
            return self.stop_removed();
        };
        fresh.boot = fresh.boot.max(self.boot + 1);
        fresh.coordinator.next_tx = fresh.boot;
        fresh.epochs = std::mem::take(&mut self.epochs);
        for (i, &epoch) in fresh.epochs.iter().enumerate() {
            fresh.removed[i] = i != self.me.dc as usize && epoch % 2 == 1;
            if fresh.removed[i] {
                fresh.removed_nodes.extend(fresh.replicas[i].iter().copied());
            }
        }
        fresh.counters = self.counters;
        fresh.counters.joins_restarted += 1;
        fresh.out = std::mem::take(&mut self.out);
        fresh.first_hard_state = self.first_hard_state.take();
        *self = fresh;
    }

    /// Opens this new replica's channel to `node` with `Join`, once.
    fn join_to(&mut self, node: NodeId) {
        let Some(j) = self.joining.as_mut() else { return };
        let Some(epoch) = j.epoch else { return };
        if !j.joined_to.insert(node) {
            return;
        }
        let waiting = j.unjoined.remove(&node).unwrap_or_default();
        self.open_with_join(node, epoch, waiting);
    }

    /// Opens this new replica's channel to `node` with `Join`, then `bodies`.
    fn open_with_join(&mut self, node: NodeId, epoch: u32, bodies: Vec<Body>) {
        let channel = self.channels.entry(node).or_default();
        assert_eq!(channel.unacked(), 0, "{node}: a joining replica sent before its Join");
        channel.push(Body::Back(Back::Join { epoch }));
        for body in bodies {
            channel.push(body);
        }
    }

    /// Opens, with `Join`, each channel a new replica that is back never opened, with
    /// what it sent there meanwhile: a survivor of another partition whose return's
    /// `Changed` has not reached it yet still waits for the cut it holds (seed 299), and
    /// hears this replica only from a channel that opened with `Join`.
    pub(crate) fn open_unjoined(&mut self, epoch: u32, unjoined: BTreeMap<NodeId, Vec<Body>>) {
        for (node, bodies) in unjoined {
            self.open_with_join(node, epoch, bodies);
        }
    }

    /// One body at a joining replica: the changes, the return's bodies, and the
    /// survivors' streams (held); the rest is dropped.
    pub(crate) fn handle_joining(&mut self, from: NodeId, body: Body) {
        match body {
            Body::Changed { change } if change.dc == self.me.dc => {
                self.own_change(change);
                if self.joining.as_ref().is_some_and(|j| j.epoch == Some(change.epoch)) {
                    self.join_to(from);
                }
            }
            Body::Changed { change } => self.note_epoch(change.dc, change.epoch),
            Body::Back(back) => self.back_in(from, back),
            Body::Replicate { .. } | Body::Heartbeat { .. } => self.hold_stream(from, body),
            _ => self.counters.dropped_joining += 1,
        }
    }

    /// Holds a survivor's stream body; a heartbeat replaces one held last.
    fn hold_stream(&mut self, from: NodeId, body: Body) {
        let Some(j) = self.joining.as_mut().filter(|j| j.epoch.is_some()) else { return };
        let held = j.held.entry(from).or_default();
        let heartbeat = matches!(body, Body::Heartbeat { .. });
        if heartbeat && matches!(held.last(), Some(Body::Heartbeat { .. })) {
            held.pop();
        }
        held.push(body);
    }

    /// The cuts applied here, by data center, each with its return's epoch (`/status`).
    pub(crate) fn cuts(&self) -> Vec<(u32, u64, u32)> {
        let cuts = self.limits.iter().enumerate();
        cuts.flat_map(|(dc, l)| l.iter().map(move |l| (dc as u32, l.value, l.epoch))).collect()
    }

    /// A joining replica's refusal of its clients.
    pub(crate) fn joining_error() -> KeelError {
        KeelError::Unavailable(
            "this geo replica is joining: its data center is coming back; attach at another data center"
                .into(),
        )
    }
}
