//! Taking a removed data center back, step 3 (`docs/geo.md`, *Taking a data center back:
//! the protocol*): the copy, the install, and the new life's stale pasts.
//!
//! - Once every survivor's replica of its partition is settled, a **new replica** asks
//!   one of them, the *source*, for its copy, naming each survivor's propagated entry
//!   from its answer (`CopyAsk`): the streams the survivors sent it since their answers
//!   are held, and connect to a copy that covers those entries.
//! - The **source** copies once its known vector covers them: every transaction its
//!   known vector covers, in chunks of bounded size built from its log as the new
//!   replica acknowledges the ones before (never a second copy of the partition), then its known
//!   vector and, per data center, the entry above which it still holds transactions for
//!   forwarding (`Copied`). It learned the return before, so it collected nothing the new
//!   replica lacks since (`back.rs`).
//! - The new replica **installs** it: its log, known vector (its own entry at the cut),
//!   forwarding buffers; replays each survivor's held stream that connects (one whose
//!   data center was removed meanwhile may not: dropped, forwarding brings it); and is
//!   back: its clock runs in the new life, it serves clients, and it tells every
//!   survivor's replica of its partition (`Installed`), which hears it from then on as
//!   any sibling.
//! - A past naming a data center's old life above its cut is **stale**: what it read is
//!   gone, and the new life's entries would otherwise let it through. It is refused at
//!   begin and attach (`SessionExpired`: open a new session), and a read on such a
//!   snapshot is never answered.

use super::super::channel::Channel;
use super::super::types::{Back, Body, Change, Kind, Replicated, TxId, Vector};
use super::back::Limit;
use super::{GeoEngine, LogEntry};
use keel_types::{KeelError, Key};
use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

/// Bytes of updates in one chunk of a copy, about.
const CHUNK_BYTES: usize = 1 << 20;

/// Log entries in one chunk of a copy, about (a transaction's entries of one object are
/// never split, so a chunk may pass it by one transaction's): well within the gate's
/// bound on a chunk's transactions, however small the updates.
const CHUNK_ENTRIES: usize = 16_384;

/// Chunks of a copy queued on the channel at once: the source builds and sends the next
/// as the new replica acknowledges, so a copy never fills a peer frame, and a step
/// builds at most this many.
const CHUNKS_IN_FLIGHT: usize = 4;

/// An entry's place in a copy: its data center, its timestamp there, its transaction.
type EntryId = (u32, u64, TxId);

/// Where a chunk of a copy starts: an object of the log, and the last entry of it already
/// sent (`None`: from its first).
type Cursor = ((Key, Kind), Option<EntryId>);

/// A copy being sent, built a chunk at a time from the source's log as the new replica
/// acknowledges (the source never holds a second copy of its partition).
#[derive(Clone, Debug)]
pub(crate) struct Sending {
    /// What the copy covers, as when it began: entries this known vector covers (what
    /// arrives later is above it).
    pub known: Vector,
    /// The return's epoch.
    pub epoch: u32,
    /// Where the next chunk starts; `None` once every object was copied.
    pub next: Option<Cursor>,
    /// The copy's end (`Copied`), sent after the last chunk; `None` once queued.
    pub end: Option<Body>,
    /// The channel numbers of the chunks queued and not yet acknowledged.
    pub in_flight: VecDeque<u64>,
}

/// A new replica that is back holds its new sessions until what they would see covers
/// what every live data center stored when it copied (the copy's `kept`: stored at every
/// live data center but its own, so at `f + 1`, uniform), or until a suspicion time-out
/// passed (a sibling silent that long is suspected, and its row may never come). Its
/// uniform vector starts at zero and rises as the survivors' rows reach it; served at
/// once, a new session's first snapshot could show nothing of what survived.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CatchUp {
    /// Per data center, the entry a new snapshot must reach (0 for its own, and for a
    /// data center removed).
    pub floor: Vector,
    /// When it serves anyway.
    pub until: crate::time::Time,
}

impl GeoEngine {
    /// Whether a transaction may begin here on `snap`: not at a new replica just back
    /// whose view is still below what survived (`CatchUp`); once it is, or the wait is
    /// over, for good.
    pub(crate) fn caught_up(&mut self, snap: &Vector) -> Result<(), KeelError> {
        let Some(c) = &self.catch_up else { return Ok(()) };
        let behind = (0..self.dcs).any(|i| !self.removed[i] && snap.dcs[i] < c.floor.dcs[i]);
        if behind && self.now < c.until {
            self.counters.begins_held += 1;
            return Err(KeelError::Unavailable(
                "this geo replica came back and is catching up with the survivors; retry shortly"
                    .into(),
            ));
        }
        self.counters.catch_ups_expired += u64::from(behind);
        self.catch_up = None;
        Ok(())
    }

    /// A new replica asks for its copy once it has the cut and every survivor's replica
    /// of its partition is settled (again, if its source was removed meanwhile).
    pub(crate) fn ask_copy(&mut self) {
        let d = self.me.dc as usize;
        let survivors: Vec<u32> = (0..self.dcs as u32)
            .filter(|&i| i as usize != d && !self.removed[i as usize])
            .collect();
        let dcs = self.dcs;
        let Some(j) = self.joining.as_mut() else { return };
        let (Some(epoch), Some(_)) = (j.epoch, j.cut) else { return };
        if j.source.is_some_and(|s| survivors.contains(&s)) {
            return;
        }
        if !survivors.iter().all(|s| j.settled.contains(s)) {
            return;
        }
        let Some(&source) = survivors.first() else { return };
        j.source = Some(source);
        j.chunks.clear();
        let mut need = vec![0; dcs];
        for &s in &survivors {
            need[s as usize] = j.answers.get(&s).map_or(0, |&(_, own)| own);
        }
        let to = self.replica(source, self.me.partition);
        self.send(to, Body::Back(Back::CopyAsk { epoch, need }));
    }

    /// The source takes its new replica's ask; it copies once it covers what is needed.
    pub(crate) fn copy_ask_in(&mut self, r: u32, epoch: u32, need: Vec<u64>) {
        let Some(w) = self.welcomes[r as usize].as_mut().filter(|w| w.epoch == epoch) else {
            return;
        };
        // Not for strong keyspaces (refused a return until step 5): the copy would send
        // strong deliveries the certification log must bring (`docs/geo.md`).
        let refused = self.config.strong;
        if refused || !w.settled || w.copy.is_some() || self.sending[r as usize].is_some() {
            self.counters.rejected += 1;
            return;
        }
        w.copy = Some(need);
        self.send_copies();
    }

    /// Copies for each new replica whose ask this source's known vector now covers
    /// (removed data centers are not waited for), and paces the copies under way.
    pub(crate) fn send_copies(&mut self) {
        for r in 0..self.dcs {
            let (known, removed) = (&self.partition.known, &self.removed);
            let Some(w) = self.welcomes[r].as_mut() else { continue };
            let Some(need) = &w.copy else { continue };
            if !(0..self.dcs).all(|i| removed[i] || known.dcs[i] >= need[i]) {
                continue;
            }
            let epoch = w.epoch;
            w.copy = None;
            self.sending[r] = Some(self.copy_of(r, epoch));
            self.counters.copies_sent += 1;
        }
        for r in 0..self.dcs {
            let to = self.replica(r as u32, self.me.partition);
            let Some(sending) = self.sending[r].as_mut() else { continue };
            let channel = self.channels.entry(to).or_default();
            let acked = channel.acked();
            while sending.in_flight.front().is_some_and(|&n| n < acked) {
                sending.in_flight.pop_front();
            }
            while sending.in_flight.len() < CHUNKS_IN_FLIGHT {
                let body = match sending.next.take() {
                    Some(from) => {
                        let (txs, next) = chunk_from(&self.partition.log, &sending.known, from);
                        sending.next = next;
                        Body::Back(Back::Chunk { epoch: sending.epoch, txs })
                    }
                    None => match sending.end.take() {
                        Some(end) => end,
                        None => break,
                    },
                };
                sending.in_flight.push_back(channel.next_number());
                channel.push(body);
            }
            if sending.next.is_none() && sending.end.is_none() {
                self.sending[r] = None;
            }
        }
    }

    /// The copy for the new replica of data center `r`: every transaction this replica's
    /// known vector covers, in chunks built as they are sent, then its known vector and,
    /// per data center, the entry above which the new replica keeps transactions for
    /// forwarding (what every other live data center is known to store, as collection
    /// counts it).
    fn copy_of(&self, r: usize, epoch: u32) -> Sending {
        let known = &self.partition.known;
        let d = self.me.dc as usize;
        let kept = (0..self.dcs)
            .map(|j| {
                let others = (0..self.dcs).filter(|&i| i != j && i != r && !self.removed[i]);
                let stored = others.map(|i| match i == d {
                    true => known.dcs[j],
                    false => self.uniformity.global[i].dcs[j],
                });
                stored.min().unwrap_or(known.dcs[j])
            })
            .collect();
        let limits = self.cuts();
        let end = Back::Copied { epoch, known: known.clone(), kept, limits };
        let next = self.partition.log.keys().next().map(|object| (object.clone(), None));
        Sending {
            known: known.clone(),
            epoch,
            next,
            end: Some(Body::Back(end)),
            in_flight: VecDeque::new(),
        }
    }

    /// A new replica takes a chunk of its copy from its source.
    pub(crate) fn chunk_in(&mut self, dc: u32, epoch: u32, txs: Vec<(u32, Replicated)>) {
        let Some(j) = self.joining.as_mut().filter(|j| j.epoch == Some(epoch)) else { return };
        if j.source != Some(dc) {
            return;
        }
        j.chunks.extend(txs);
    }

    /// A new replica takes its copy's end: it installs the copy and is back.
    pub(crate) fn copied_in(
        &mut self,
        dc: u32,
        epoch: u32,
        known: Vector,
        kept: &[u64],
        limits: &[(u32, u64, u32)],
    ) {
        let Some(j) = self.joining.as_mut().filter(|j| j.epoch == Some(epoch)) else { return };
        let Some(cut) = j.cut.filter(|_| j.source == Some(dc)) else { return };
        let d = self.me.dc as usize;
        // A transaction's entries come object by object: its parts are joined here.
        let mut txs: BTreeMap<EntryId, Replicated> = BTreeMap::new();
        for (origin, part) in std::mem::take(&mut j.chunks) {
            let ts = part.commit.dcs[origin as usize];
            match txs.entry((origin, ts, part.tx)) {
                Entry::Vacant(v) => {
                    v.insert(part);
                }
                Entry::Occupied(mut o) => o.get_mut().writes.extend(part.writes),
            }
        }
        for ((origin, ts, _), tx) in txs {
            let commit = Arc::new(tx.commit.clone());
            self.append(tx.tx, origin, &commit, &tx.writes);
            if origin as usize != d && ts > kept[origin as usize] {
                self.partition.remote_commits[origin as usize].insert(ts, tx);
            }
        }
        let p = &mut self.partition;
        p.known = known;
        p.known.dcs[d] = cut;
        p.propagated = cut;
        // The source's cuts, its own data center's earlier returns' included, with this
        // return's (the source applied it before it settled).
        for &(i, value, epoch) in limits {
            self.limits[i as usize].push(Limit { value, epoch });
        }
        if !self.limits[d].contains(&Limit { value: cut, epoch }) {
            self.limits[d].push(Limit { value: cut, epoch });
        }
        for limits in &mut self.limits {
            limits.sort_by_key(|l| l.epoch);
            limits.dedup_by_key(|l| l.epoch);
        }
        self.replay_held();
        self.back(epoch, kept);
    }

    /// Replays each survivor's stream held since its answer, if it connects to the copy
    /// (the copy covers the survivor's propagated entry); one that does not (its data
    /// center was removed meanwhile) is dropped: forwarding brings it.
    fn replay_held(&mut self) {
        let j = self.joining.as_mut().expect("a joining replica installs");
        let held = std::mem::take(&mut j.held);
        let owns: BTreeMap<u32, u64> = j.answers.iter().map(|(&dc, &(_, own))| (dc, own)).collect();
        for (node, bodies) in held {
            // Held only from members (`receive` drops the rest before handling).
            let Some(dc) = self.member(node).map(|m| m.dc) else { continue };
            let connects =
                owns.get(&dc).is_some_and(|&own| self.partition.known.dcs[dc as usize] >= own);
            if self.removed[dc as usize] || !connects {
                self.counters.streams_dropped += 1;
                continue;
            }
            self.counters.streams_replayed += 1;
            for body in bodies {
                match body {
                    Body::Replicate { origin, txs } if origin == dc => self.replicate(origin, txs),
                    Body::Heartbeat { origin, ts } if origin == dc => self.heartbeat(origin, ts),
                    _ => self.counters.rejected += 1,
                }
            }
        }
    }

    /// The new replica is back: it serves, its clock runs in the new life, every data
    /// center counts as heard now, and it tells every survivor's replica of its partition.
    fn back(&mut self, epoch: u32, kept: &[u64]) {
        let d = self.me.dc as usize;
        if let Some(j) = self.joining.take() {
            self.open_unjoined(epoch, j.unjoined);
        }
        let mut floor = Vector::zero(self.dcs);
        for i in (0..self.dcs).filter(|&i| i != d && !self.removed[i]) {
            floor.dcs[i] = kept[i];
        }
        let until = crate::time::Time(self.now.0.saturating_add(self.config.suspect_after.0));
        self.catch_up = Some(CatchUp { floor, until });
        self.returning[d] = false;
        let now = self.now;
        self.uniformity.heard.iter_mut().for_each(|h| *h = now);
        self.uniformity.local_heard.iter_mut().for_each(|h| *h = now);
        self.next_propagate = now;
        self.next_broadcast = now;
        // The members of data centers removed meanwhile get their notice, as from any
        // survivor (it sent them nothing while it joined).
        for i in (0..self.dcs).filter(|&i| self.removed[i]) {
            let change = Change { dc: i as u32, epoch: self.epochs[i] };
            for &node in &self.replicas[i] {
                self.channels.insert(node, Channel::notice(Body::Changed { change }));
            }
        }
        let known = self.partition.known.clone();
        let survivors: Vec<u32> = (0..self.dcs as u32)
            .filter(|&i| i as usize != d && !self.removed[i as usize])
            .collect();
        for i in survivors {
            let to = self.replica(i, self.me.partition);
            self.send(to, Body::Back(Back::Installed { epoch, known: known.clone() }));
        }
        self.counters.copies_installed += 1;
    }

    /// A survivor hears its new replica back: from then on it is a sibling as any, its
    /// data center no longer counted failed here.
    pub(crate) fn installed_in(&mut self, r: u32, epoch: u32, known: &Vector) {
        let i = r as usize;
        let settled = self.welcomes[i].as_ref().is_some_and(|w| w.epoch == epoch && w.settled);
        if !settled {
            self.counters.rejected += 1;
            return;
        }
        self.welcomes[i] = None;
        self.sending[i] = None;
        self.returning[i] = false;
        self.removed[i] = false;
        self.uniformity.global[i].join(known);
        self.uniformity.heard[i] = self.now;
        self.counters.returns_back += 1;
    }

    /// Whether `ts`, an entry for data center `j`, names its old life above the cut this
    /// replica applied: lost, never to be stored again.
    pub(crate) fn lost_entry(&self, j: usize, ts: u64) -> bool {
        self.limits[j].iter().any(|l| l.loses(ts)) && !self.config.unsafe_no_life
    }

    /// A data center whose entry in `past` is lost (`lost_entry`).
    pub(crate) fn stale_past(&self, past: &Vector) -> Option<usize> {
        (0..self.dcs.min(past.dcs.len())).find(|&j| self.lost_entry(j, past.dcs[j]))
    }

    /// The refusal of a stale past.
    pub(crate) fn stale_error(&mut self) -> KeelError {
        self.counters.stale_pasts_refused += 1;
        KeelError::SessionExpired
    }

    /// Refuses the attaches and barriers waiting here whose past a cut just made stale (a
    /// barrier waits on its own data center's entry only, which is all it keeps).
    pub(crate) fn refuse_stale_syncs(&mut self) {
        let stale: Vec<_> = self
            .coordinator
            .attaches
            .iter()
            .filter(|(_, past)| self.stale_past(past).is_some())
            .map(|(k, _)| *k)
            .collect();
        for key in stale {
            self.coordinator.attaches.remove(&key);
            let e = self.stale_error();
            self.reply(key.2, Err(e));
        }
        let d = self.me.dc as usize;
        let stale: Vec<_> = self
            .coordinator
            .barriers
            .keys()
            .filter(|(need, _)| self.lost_entry(d, *need))
            .copied()
            .collect();
        for key in stale {
            self.coordinator.barriers.remove(&key);
            let e = self.stale_error();
            self.reply(key.1, Err(e));
        }
    }
}

/// The chunk of a copy covering `known` that starts at `from` in `log`, and where the next
/// one starts (`None`: this was the last). Whole objects while they fit; an object with
/// more entries than a chunk holds is sent in its entries' order, a transaction's entries
/// together, each chunk resuming after the last entry the one before sent (so entries a
/// cut drops meanwhile are skipped, and none is sent twice).
fn chunk_from(
    log: &BTreeMap<(Key, Kind), Vec<LogEntry>>,
    known: &Vector,
    from: Cursor,
) -> (Vec<(u32, Replicated)>, Option<Cursor>) {
    let (start, mut after) = from;
    let mut txs: BTreeMap<EntryId, Replicated> = BTreeMap::new();
    let (mut bytes, mut entries) = (0, 0);
    for ((key, kind), list) in log.range(start..) {
        if bytes >= CHUNK_BYTES || entries >= CHUNK_ENTRIES {
            return (parts(txs), Some(((key.clone(), *kind), None)));
        }
        let mut due: Vec<(EntryId, &LogEntry)> = list
            .iter()
            .map(|e| ((e.origin, e.commit.dcs[e.origin as usize], e.tx), e))
            .filter(|&((origin, ts, _), _)| ts <= known.dcs[origin as usize])
            .filter(|(id, _)| after.is_none_or(|a| *id > a))
            .collect();
        due.sort_by_key(|(id, _)| *id);
        let mut last = None;
        for (id, e) in due {
            if last != Some(id) && (bytes >= CHUNK_BYTES || entries >= CHUNK_ENTRIES) {
                return (parts(txs), Some(((key.clone(), *kind), last)));
            }
            let tx = txs.entry(id).or_insert_with(|| Replicated {
                tx: e.tx,
                commit: (*e.commit).clone(),
                writes: Vec::new(),
            });
            tx.writes.push((key.clone(), e.update.clone()));
            bytes += key.len() + e.update.bytes();
            entries += 1;
            last = Some(id);
        }
        after = None;
    }
    (parts(txs), None)
}

/// A chunk's transactions, each with its data center.
fn parts(txs: BTreeMap<EntryId, Replicated>) -> Vec<(u32, Replicated)> {
    txs.into_iter().map(|((origin, _, _), tx)| (origin, tx)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_types::geo::Update;

    fn entry(origin: u32, ts: u64, seq: u64) -> LogEntry {
        let mut commit = Vector::zero(3);
        commit.dcs[origin as usize] = ts;
        let tx = TxId { node: origin, seq };
        LogEntry { tx, origin, commit: Arc::new(commit), update: Update::Add(1) }
    }

    fn object(name: &str) -> (Key, Kind) {
        (Key::copy_from_slice(name.as_bytes()), Kind::Counter)
    }

    /// Every chunk of a copy of `log` covering `known`, with `between` run on the log
    /// before each chunk after the first.
    fn chunks(
        log: &mut BTreeMap<(Key, Kind), Vec<LogEntry>>,
        known: &Vector,
        between: impl Fn(&mut BTreeMap<(Key, Kind), Vec<LogEntry>>),
    ) -> Vec<Vec<(u32, Replicated)>> {
        let mut out = Vec::new();
        let mut next = log.keys().next().map(|o| (o.clone(), None));
        while let Some(from) = next.take() {
            if !out.is_empty() {
                between(log);
            }
            let (txs, after) = chunk_from(log, known, from);
            out.push(txs);
            next = after;
        }
        out
    }

    #[test]
    fn a_copy_is_built_a_bounded_chunk_at_a_time_each_entry_once() {
        // A hot object with 70,000 one-entry transactions (tiny updates: 1 MiB of them
        // is more transactions than the gate takes in a chunk), a transaction that
        // updates it twice, and other objects, some entries above the known vector.
        let mut log: BTreeMap<(Key, Kind), Vec<LogEntry>> = BTreeMap::new();
        let hot = object("hot");
        for seq in 0..70_000u64 {
            log.entry(hot.clone()).or_default().push(entry((seq % 3) as u32, seq + 1, seq));
        }
        log.get_mut(&hot).unwrap().push(entry(1, 50, 49));
        for name in ["a", "b", "z"] {
            for seq in 0..10u64 {
                log.entry(object(name)).or_default().push(entry(0, 100_000 + seq, 100_000 + seq));
            }
        }
        let mut known = Vector::zero(3);
        known.dcs = vec![100_004, 69_000, 69_000];
        let due: usize = log
            .values()
            .flatten()
            .filter(|e| e.commit.dcs[e.origin as usize] <= known.dcs[e.origin as usize])
            .count();
        let all = chunks(&mut log, &known, |_| {});
        assert!(all.len() >= 5, "{} chunks", all.len());
        let mut seen = std::collections::BTreeSet::new();
        let mut sent = 0;
        for chunk in &all {
            let writes: usize = chunk.iter().map(|(_, t)| t.writes.len()).sum();
            assert!(writes <= CHUNK_ENTRIES + 1, "a chunk of {writes} entries");
            assert!(chunk.len() <= crate::geo::engine::gate::BODIES_MAX);
            for (origin, t) in chunk {
                for (key, _) in &t.writes {
                    sent += 1;
                    seen.insert((key.clone(), *origin, t.tx));
                }
            }
        }
        assert_eq!(sent, due, "entries sent, against those the known vector covers");
        let twice = all.iter().flatten().filter(|(_, t)| t.tx == TxId { node: 1, seq: 49 });
        assert_eq!(twice.map(|(_, t)| t.writes.len()).sum::<usize>(), 2, "tx 49's entries");
        // Entries a cut drops while the copy is under way are skipped; none is sent twice.
        let dropped = |log: &mut BTreeMap<(Key, Kind), Vec<LogEntry>>| {
            log.get_mut(&object("hot")).unwrap().retain(|e| e.origin != 2);
        };
        let mut log2 = log.clone();
        let all = chunks(&mut log2, &known, dropped);
        let mut ids = std::collections::BTreeMap::new();
        for (origin, t) in all.iter().flatten() {
            for (key, _) in &t.writes {
                *ids.entry((key.clone(), *origin, t.tx)).or_insert(0) += 1;
            }
        }
        let tx49 = TxId { node: 1, seq: 49 };
        assert!(ids.iter().all(|(id, &n)| n == 1 || (id.2 == tx49 && n == 2)), "sent twice");
        // What the cut left is all sent.
        let kept = seen.iter().filter(|(k, o, _)| *o != 2 || k.as_ref() != b"hot");
        assert!(kept.clone().all(|id| ids.contains_key(id)), "an entry the cut kept is missing");
        assert!(ids.len() < seen.len(), "the cut dropped nothing");
    }
}
