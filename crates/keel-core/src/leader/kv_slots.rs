//! Hash slots moving between keyspaces, in the state machine (`keel_types::slots`).
//!
//! A keyspace's log says where it stands with a slot only once a move touches it: the
//! [`SlotState`] lives under a reserved key ([`slot_state_key`]), so it is replicated,
//! rolled back, snapshotted and digested as every item is. A slot its log says nothing
//! of is served as the node's configuration says (the node's slot guard checks that).
//!
//! Every request is checked against these states where it is applied or read
//! ([`Kv::slot_check`]), in the same order as the moves' own entries, so the answer
//! never depends on a node's view of them:
//! - `Released`: every key of the slot is elsewhere (`MOVED`).
//! - `Migrating`: a key still here is served here; a key not here is the target's
//!   (`ASK`), so no key of the slot is created here again; a key being copied (held)
//!   waits (`TRYAGAIN`), and so does a request with keys both here and gone.
//!
//! So each key of a moving slot has one home at any point of either log: the source
//! while it holds the key, the target from the source's `Release` of it on. The mover
//! copies a held key only after the source stopped changing it, and the target takes
//! clients' requests for it only after the source let it go.

use super::kv::{Kv, Undo, WriteResult};
use keel_types::coll::Answer;
use keel_types::slots::{key_slot, slot_state_key, SlotOp, SlotState, SLOT_STATE_PREFIX};
use keel_types::{Command, CommandResult, KeelError, Key, Version};
use std::collections::BTreeSet;

/// The answer to a request with keys of a slot being moved both here and gone.
const SPLIT: &str = "Multiple keys request during rehashing of slot";

impl Kv {
    /// The state of `slot` this keyspace's log set (`None`: none; the configuration's).
    pub fn slot_state(&self, slot: u16) -> Option<SlotState> {
        self.slot_cache.get(&slot).cloned()
    }

    /// Every slot state the log set, by slot.
    pub fn slot_states(&self) -> Vec<(u16, SlotState)> {
        self.slot_cache.iter().map(|(slot, state)| (*slot, state.clone())).collect()
    }

    /// A number that changes whenever a slot state does (a move's step applied or
    /// rolled back): what a node watches to republish [`Self::slot_states`].
    pub fn slot_generation(&self) -> u64 {
        self.slot_generation
    }

    /// Whether this keyspace takes `command` now, as its slot states say (module docs).
    /// Applied entries and reads ask it; its refusals change nothing and are not
    /// remembered for deduplication (the same request may be taken later).
    pub fn slot_check(&self, command: &Command) -> Result<(), KeelError> {
        if self.slot_cache.is_empty() {
            return Ok(());
        }
        let (command, asking) = command.unasked();
        match command {
            Command::Slot(_) => return Ok(()),
            Command::Flush { .. } | Command::SwapDb { .. } => {
                let moving = self
                    .slot_states()
                    .iter()
                    .any(|(_, s)| matches!(s, SlotState::Migrating { .. }));
                return match moving {
                    true => Err(KeelError::TryAgain("slots are being moved".into())),
                    false => Ok(()),
                };
            }
            _ => {}
        }
        let queue = matches!(
            command,
            Command::Enqueue { .. } | Command::Dequeue { .. } | Command::QueuePeek { .. }
        );
        let (mut here, mut gone) = (false, None);
        for key in command.keys() {
            let slot = key_slot(key);
            match self.slot_cache.get(&slot) {
                None | Some(SlotState::Owned { .. }) => here = true,
                // Sent on by the source in this move: the source no longer holds the key.
                Some(SlotState::Importing { id, .. })
                    if asking == Some(*id) || self.unsafe_take_unasked =>
                {
                    here = true
                }
                // Only the source knows whether it still holds the key: whoever was not
                // sent on by it goes there.
                Some(SlotState::Importing { from, .. }) => {
                    return Err(KeelError::Redirect { slot, keyspace: *from, ask: None });
                }
                Some(SlotState::Released { to, .. }) => {
                    return Err(KeelError::Redirect { slot, keyspace: *to, ask: None });
                }
                Some(SlotState::Migrating { .. }) if queue => {
                    return Err(KeelError::InvalidArgument(format!(
                        "queue in slot {slot}, which is being moved: queues do not move"
                    )));
                }
                Some(SlotState::Migrating { to, held, id }) => {
                    if held.binary_search(key).is_ok() && !self.unsafe_serve_held {
                        return Err(KeelError::TryAgain(format!(
                            "key of slot {slot} being moved now"
                        )));
                    }
                    match self.items.get(key).is_some_and(|item| item.live()) {
                        true => here = true,
                        false => gone = gone.or(Some((slot, *to, *id))),
                    }
                }
            }
        }
        match gone {
            Some(_) if here => Err(KeelError::TryAgain(SPLIT.into())),
            Some((slot, to, id)) => Err(KeelError::Redirect { slot, keyspace: to, ask: Some(id) }),
            None => Ok(()),
        }
    }

    /// Applies one step of a move (`SlotOp`): all of it, or (an error) none of it. A
    /// step of a move older than the state's (a late copy) changes nothing.
    pub(super) fn execute_slot(
        &mut self,
        version: Version,
        op: &SlotOp,
        undo: &mut Undo,
    ) -> WriteResult {
        if !op.valid() {
            // Refused at the door and by the gate; a log holding one (from no version of
            // Keel) is answered with an error on every replica alike, never a panic.
            let why = format!("slot {}: an invalid step", op.name());
            return Err(KeelError::InvalidArgument(why));
        }
        match op {
            SlotOp::Import { first, last, from, id } => {
                let (from, id) = (*from, *id);
                self.set_slots(version, op, *first, *last, undo, |state| match state {
                    None => Ok(Some(SlotState::Importing { from, since: version, id })),
                    Some(SlotState::Released { id: old, .. }) if *old < id => {
                        Ok(Some(SlotState::Importing { from, since: version, id }))
                    }
                    Some(SlotState::Importing { from: f, id: old, .. })
                        if *old == id && *f == from =>
                    {
                        Ok(None)
                    }
                    Some(SlotState::Owned { id: old }) if *old == id => Ok(None),
                    Some(_) => Err(()),
                })
            }
            SlotOp::Migrate { first, last, to, id } => {
                if let Some(queue) = self.queue_in_slots(*first, *last) {
                    let name = String::from_utf8_lossy(&queue);
                    let why =
                        format!("slot migrate: queue {name:?} holds elements: queues do not move");
                    return Err(KeelError::InvalidArgument(why));
                }
                let (to, id) = (*to, *id);
                self.set_slots(version, op, *first, *last, undo, |state| match state {
                    None => Ok(Some(SlotState::Migrating { to, held: Vec::new(), id })),
                    Some(SlotState::Owned { id: old }) if *old < id => {
                        Ok(Some(SlotState::Migrating { to, held: Vec::new(), id }))
                    }
                    Some(
                        SlotState::Migrating { to: t, id: old, .. }
                        | SlotState::Released { to: t, id: old },
                    ) if *old == id && *t == to => Ok(None),
                    Some(_) => Err(()),
                })
            }
            SlotOp::Own { first, last, id } => {
                let id = *id;
                self.set_slots(version, op, *first, *last, undo, |state| match state {
                    Some(SlotState::Importing { id: old, .. }) if *old == id => {
                        Ok(Some(SlotState::Owned { id }))
                    }
                    Some(SlotState::Owned { id: old }) if *old == id => Ok(None),
                    _ => Err(()),
                })
            }
            SlotOp::Give { first, last, id } => self.give(version, *first, *last, *id, undo),
            SlotOp::Occupied { first, last } => {
                let mut counts: Vec<(u16, i64)> = Vec::new();
                for (slot, _) in self.slot_index_range(*first, *last) {
                    match counts.last_mut() {
                        Some((s, n)) if *s == slot => *n += 1,
                        _ => counts.push((slot, 1)),
                    }
                }
                let flat = counts.into_iter().flat_map(|(s, n)| [i64::from(s), n]);
                let answer = Answer::Array(flat.map(Answer::Int).collect());
                Ok(CommandResult::Answer { answer, version: None })
            }
            SlotOp::Hold { slot, count, id } => {
                self.hold(version, op, *slot, *count as usize, *id, undo)
            }
            SlotOp::Fill { slot, items, id } => self.fill(version, op, *slot, items, *id, undo),
            SlotOp::Release { slot, keys, id } => self.release(version, op, *slot, keys, *id, undo),
        }
    }

    /// At the source: deletes those of `keys` it holds (their copies are at the target)
    /// and holds them no more; answers how many it deleted.
    fn release(
        &mut self,
        version: Version,
        op: &SlotOp,
        slot: u16,
        keys: &[Key],
        id: u64,
        undo: &mut Undo,
    ) -> WriteResult {
        let (to, held) = match self.slot_state(slot) {
            Some(SlotState::Migrating { to, held, id: current }) if current == id => (to, held),
            other => return Err(not_now(op, slot, other.as_ref())),
        };
        let released: BTreeSet<&Key> = keys.iter().collect();
        let (mut deleted, mut kept) = (0, Vec::with_capacity(held.len()));
        for key in held {
            if !released.contains(&key) {
                kept.push(key);
            } else if self.items.get(&key).is_some_and(|item| item.live()) {
                self.change(key, Some(super::kv::Item::plain(None, version)), undo);
                deleted += 1;
            }
        }
        self.put_slot_state(version, slot, &SlotState::Migrating { to, held: kept, id }, undo);
        Ok(CommandResult::Count { keys: deleted })
    }

    /// Sets the state of every slot of `first..=last` to what `next` says of its current
    /// one (`Ok(None)`: left as it is; `Err`: the step may not be taken there, and
    /// nothing changes). Answers how many slots changed.
    fn set_slots(
        &mut self,
        version: Version,
        op: &SlotOp,
        first: u16,
        last: u16,
        undo: &mut Undo,
        next: impl Fn(Option<&SlotState>) -> Result<Option<SlotState>, ()>,
    ) -> WriteResult {
        let mut changes = Vec::new();
        for slot in first..=last {
            let current = self.slot_state(slot);
            match next(current.as_ref()) {
                Ok(Some(state)) => changes.push((slot, state)),
                Ok(None) => {}
                Err(()) => return Err(not_now(op, slot, current.as_ref())),
            }
        }
        for (slot, state) in &changes {
            self.put_slot_state(version, *slot, state, undo);
        }
        Ok(CommandResult::Count { keys: changes.len() as u64 })
    }

    /// At the source: the slots of `first..=last` that hold no key become released.
    fn give(
        &mut self,
        version: Version,
        first: u16,
        last: u16,
        id: u64,
        undo: &mut Undo,
    ) -> WriteResult {
        let op = SlotOp::Give { first, last, id };
        let mut released = Vec::new();
        for slot in first..=last {
            match self.slot_state(slot) {
                Some(SlotState::Migrating { held, id: current, to }) if current == id => {
                    if !held.is_empty() || self.slot_keys(slot, 1).next().is_some() {
                        return Err(KeelError::TryAgain(format!("slot {slot} still holds keys")));
                    }
                    released.push((slot, to));
                }
                Some(SlotState::Released { id: current, .. }) if current == id => {}
                other => return Err(not_now(&op, slot, other.as_ref())),
            }
        }
        for (slot, to) in &released {
            self.put_slot_state(version, *slot, &SlotState::Released { to: *to, id }, undo);
        }
        Ok(CommandResult::Count { keys: released.len() as u64 })
    }

    /// At the source: holds up to `count` keys of `slot` (those held already, if any,
    /// whatever `count`) and answers their images, in key order.
    fn hold(
        &mut self,
        version: Version,
        op: &SlotOp,
        slot: u16,
        count: usize,
        id: u64,
        undo: &mut Undo,
    ) -> WriteResult {
        let (to, held) = match self.slot_state(slot) {
            Some(SlotState::Migrating { to, held, id: current }) if current == id => (to, held),
            other => return Err(not_now(op, slot, other.as_ref())),
        };
        let held = match held.is_empty() {
            false => held,
            true => {
                let keys: Vec<Key> = self.slot_keys(slot, count).collect();
                if !keys.is_empty() {
                    let state = SlotState::Migrating { to, held: keys.clone(), id };
                    self.put_slot_state(version, slot, &state, undo);
                }
                keys
            }
        };
        let items = held
            .iter()
            .filter_map(|key| {
                let item = self.items.get(key).filter(|item| item.live())?;
                Some((key.clone(), super::kv_image::encode(item), item.version))
            })
            .collect();
        Ok(CommandResult::Items { items })
    }

    /// At the target: writes each image whose key was not written since the import
    /// began (a copy written already, or a client's write once the source let the key
    /// go); answers how many it wrote.
    fn fill(
        &mut self,
        version: Version,
        op: &SlotOp,
        slot: u16,
        items: &[(Key, keel_types::Value)],
        id: u64,
        undo: &mut Undo,
    ) -> WriteResult {
        let since = match self.slot_state(slot) {
            Some(SlotState::Importing { since, id: current, .. }) if current == id => since,
            other => return Err(not_now(op, slot, other.as_ref())),
        };
        let mut decoded = Vec::with_capacity(items.len());
        for (key, image) in items {
            let written = self.items.get(key).is_some_and(|item| item.version >= since);
            if !written || self.unsafe_fill_overwrites {
                decoded.push((key, super::kv_image::decode(image, version)?));
            }
        }
        let count = decoded.len() as u64;
        for (key, item) in decoded {
            self.change(key.clone(), Some(item), undo);
        }
        Ok(CommandResult::Count { keys: count })
    }

    /// Up to `count` live keys of `slot`, in key order.
    fn slot_keys(&mut self, slot: u16, count: usize) -> impl Iterator<Item = Key> + '_ {
        self.slot_index_range(slot, slot).take(count).map(|(_, k)| k)
    }

    /// `(slot, key)` of every live key of the slots `first..=last`, in order (builds the
    /// slot index on first use).
    fn slot_index_range(&mut self, first: u16, last: u16) -> impl Iterator<Item = (u16, Key)> + '_ {
        let index = self.slot_index.get_or_insert_with(|| {
            let items = self.items.iter().filter(|(key, item)| item.live() && indexed(key));
            items.map(|(key, _)| (key_slot(key), key.clone())).collect::<BTreeSet<_>>()
        });
        let start = (first, Key::new());
        index.range(start..).take_while(move |(s, _)| *s <= last).cloned()
    }

    fn put_slot_state(&mut self, version: Version, slot: u16, state: &SlotState, undo: &mut Undo) {
        let item = super::kv::Item::plain(Some(state.encode()), version);
        self.change(slot_state_key(slot), Some(item), undo);
    }

    /// Keeps the decoded slot states and their generation, and the slot index if built,
    /// as an item comes (`add`) or goes: called wherever the items change. A slot state's
    /// value that does not decode (none the steps write) counts as no state.
    pub(super) fn account_slots(&mut self, key: &[u8], item: &super::kv::Item, add: bool) {
        if key.starts_with(SLOT_STATE_PREFIX) {
            self.slot_generation += 1;
            let Some(slot) = keel_types::slots::slot_of_state_key(key) else { return };
            match add {
                true => {
                    let state = item.value.as_deref().and_then(SlotState::decode);
                    if let Some(state) = state.filter(|_| item.live()) {
                        self.slot_cache.insert(slot, state);
                    }
                }
                false => {
                    self.slot_cache.remove(&slot);
                }
            }
            return;
        }
        let Some(index) = self.slot_index.as_mut().filter(|_| item.live() && indexed(key)) else {
            return;
        };
        let entry = (key_slot(key), Key::copy_from_slice(key));
        let changed = if add { index.insert(entry) } else { index.remove(&entry) };
        assert!(changed, "the slot index mirrors the items");
    }

    /// Checks what the slot bookkeeping can check cheaply (the engine's invariant check
    /// runs it after every step): no more states than slots.
    pub fn check_slots(&self) {
        assert!(self.slot_cache.len() <= usize::from(keel_types::slots::SLOTS), "slot states");
    }

    /// Checks the decoded slot states, and the slot index if built, against the items
    /// (walks every item: tests).
    pub fn check_slot_index(&self) {
        let decoded: std::collections::BTreeMap<u16, SlotState> = self
            .items
            .iter()
            .filter(|(_, item)| item.live())
            .filter_map(|(key, item)| {
                let slot = keel_types::slots::slot_of_state_key(key)?;
                Some((slot, SlotState::decode(item.value.as_deref()?)?))
            })
            .collect();
        assert_eq!(decoded, self.slot_cache, "the decoded states mirror the items");
        for (slot, state) in &self.slot_cache {
            if let SlotState::Migrating { held, .. } = state {
                assert!(held.iter().all(|k| key_slot(k) == *slot), "held keys of their slot");
            }
        }
        if let Some(index) = &self.slot_index {
            let live: BTreeSet<(u16, Key)> = self
                .items
                .iter()
                .filter(|(k, i)| i.live() && indexed(k))
                .map(|(k, _)| (key_slot(k), k.clone()))
                .collect();
            assert_eq!(index, &live, "the slot index mirrors the live keys");
        }
    }
}

/// A generation no state machine of this process started from: a node that rebuilds its
/// state from a snapshot publishes its states again (`Kv::slot_generation`).
pub(super) fn fresh_generation() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) << 32
}

/// Whether the slot index holds `key`: a client's key of database 0.
fn indexed(key: &[u8]) -> bool {
    matches!(keel_types::db_of(key), Some((0, _)))
}

/// The refusal of `op` on `slot` in state `state` (a step of an earlier move than the
/// state's, a late copy, is refused too: it changes nothing).
fn not_now(op: &SlotOp, slot: u16, state: Option<&SlotState>) -> KeelError {
    let state = state.map_or("served as configured".to_string(), |state| {
        format!("{} (move {})", state.name(), state.id())
    });
    KeelError::InvalidArgument(format!("slot {}: slot {slot} is {state}", op.name()))
}

#[cfg(test)]
mod tests {
    use super::super::kv::Applied;
    use super::*;
    use keel_types::{ClientId, Durability, Entry, EntryPayload, Epoch, KeyspaceId, LogIndex};
    use keel_types::{RequestId, Value};

    /// Applies `command` as the next entry, from a client of its own; the result.
    fn run(kv: &mut Kv, command: Command) -> WriteResult {
        let index = kv.applied_index().0 + 1;
        let entry = Entry {
            epoch: Epoch(1),
            index: LogIndex(index),
            payload: EntryPayload::Write {
                client: ClientId(index),
                request: RequestId(1),
                durability: Durability::Memory,
                command,
            },
        };
        let Applied::Write(result) = kv.apply(&entry) else { panic!("a write") };
        kv.check_slots();
        kv.check_slot_index();
        result
    }

    fn put(key: &str) -> Command {
        Command::Put { key: Key::copy_from_slice(key.as_bytes()), value: Value::from_static(b"v") }
    }

    fn get(key: &str) -> Command {
        Command::Get { key: Key::copy_from_slice(key.as_bytes()) }
    }

    /// Keys of slot 12182 (`foo`'s) by their hash tag.
    fn tagged(n: u32) -> String {
        format!("{{foo}}{n}")
    }

    /// Moves the keys of `slot` from `source` to `target` a batch of two at a time.
    fn empty(source: &mut Kv, target: &mut Kv, slot: u16, id: u64) {
        loop {
            let hold = run(source, Command::Slot(SlotOp::Hold { slot, count: 2, id }));
            let Ok(CommandResult::Items { items }) = hold else { panic!("{hold:?}") };
            if items.is_empty() {
                return;
            }
            let keys = items.iter().map(|(k, _, _)| k.clone()).collect();
            let fill = items.into_iter().map(|(k, image, _)| (k, image)).collect();
            run(target, Command::Slot(SlotOp::Fill { slot, items: fill, id })).unwrap();
            run(source, Command::Slot(SlotOp::Release { slot, keys, id })).unwrap();
        }
    }

    #[test]
    fn a_slot_moves_key_by_key_and_each_key_has_one_home_throughout() {
        let slot = key_slot(b"foo");
        let (mut source, mut target) = (Kv::new(100), Kv::new(100));
        for n in 0..5 {
            run(&mut source, put(&tagged(n))).unwrap();
        }
        run(&mut source, put("bar")).unwrap(); // another slot: never touched
        let (a, b, id) = (KeyspaceId(0), KeyspaceId(1), 10);
        let import = SlotOp::Import { first: slot, last: slot, from: a, id };
        run(&mut target, Command::Slot(import.clone())).unwrap();
        assert_eq!(run(&mut target, Command::Slot(import)), Ok(CommandResult::Count { keys: 0 }));
        // The target takes the slot's keys only from requests the source sent on.
        let to_source = KeelError::Redirect { slot, keyspace: a, ask: None };
        assert_eq!(target.slot_check(&get(&tagged(0))), Err(to_source.clone()));
        assert_eq!(run(&mut target, put(&tagged(0))), Err(to_source));
        let asked = |c: Command| Command::Asking(id, Box::new(c));
        assert_eq!(target.slot_check(&asked(get(&tagged(0)))), Ok(()));
        let earlier = Command::Asking(id - 1, Box::new(get(&tagged(0))));
        let sent_on_before = KeelError::Redirect { slot, keyspace: a, ask: None };
        assert_eq!(target.slot_check(&earlier), Err(sent_on_before), "sent on in another move");
        let migrate = SlotOp::Migrate { first: slot, last: slot, to: b, id };
        run(&mut source, Command::Slot(migrate)).unwrap();
        let occupied = run(&mut source, Command::Slot(SlotOp::Occupied { first: 0, last: 16383 }));
        let flat = vec![Answer::Int(i64::from(key_slot(b"bar"))), Answer::Int(1)];
        let flat = [flat, vec![Answer::Int(i64::from(slot)), Answer::Int(5)]].concat();
        assert_eq!(
            occupied,
            Ok(CommandResult::Answer { answer: Answer::Array(flat), version: None })
        );
        // Present keys are served here; new ones go to the target, once.
        assert_eq!(source.slot_check(&get(&tagged(0))), Ok(()));
        let ask = KeelError::Redirect { slot, keyspace: b, ask: Some(id) };
        assert_eq!(run(&mut source, put(&tagged(9))), Err(ask.clone()));
        assert_eq!(source.slot_check(&get(&tagged(9))), Err(ask.clone()));
        assert_eq!(source.slot_check(&get("bar")), Ok(()));
        // A batch of two held: they wait; the others are served.
        let hold = Command::Slot(SlotOp::Hold { slot, count: 2, id });
        let Ok(CommandResult::Items { items }) = run(&mut source, hold.clone()) else {
            panic!("images")
        };
        let held: Vec<Key> = items.iter().map(|(k, _, _)| k.clone()).collect();
        assert_eq!(held, vec![Key::from(tagged(0)), Key::from(tagged(1))]);
        assert!(matches!(run(&mut source, put(&tagged(0))), Err(KeelError::TryAgain(_))));
        assert_eq!(run(&mut source, put(&tagged(2))).map(|_| ()), Ok(()));
        let again = run(&mut source, hold);
        assert_eq!(again, Ok(CommandResult::Items { items: items.clone() }), "a retry");
        let fill: Vec<(Key, keel_types::Value)> =
            items.into_iter().map(|(k, image, _)| (k, image)).collect();
        let fill = Command::Slot(SlotOp::Fill { slot, items: fill, id });
        assert_eq!(run(&mut target, fill.clone()), Ok(CommandResult::Count { keys: 2 }));
        let release = Command::Slot(SlotOp::Release { slot, keys: held.clone(), id });
        assert_eq!(run(&mut source, release.clone()), Ok(CommandResult::Count { keys: 2 }));
        assert_eq!(run(&mut source, put(&tagged(0))), Err(ask.clone()), "gone: the target's");
        let asked_put = Command::Asking(
            id,
            Box::new(Command::Put { key: Key::from(tagged(0)), value: Value::from_static(b"new") }),
        );
        assert!(run(&mut target, asked_put).is_ok(), "sent on by the source");
        // Late copies of the batch's steps change nothing: the copy does not undo the
        // client's write, the release deletes none of the next batch's keys.
        assert_eq!(run(&mut target, fill), Ok(CommandResult::Count { keys: 0 }));
        assert_eq!(target.get(tagged(0).as_bytes()).0, Some(Value::from_static(b"new")));
        let split = Command::Multi { ops: vec![put(&tagged(0)), put(&tagged(2))], watch: vec![] };
        assert!(matches!(run(&mut source, split), Err(KeelError::TryAgain(_))));
        run(&mut source, Command::Slot(SlotOp::Hold { slot, count: 2, id })).unwrap();
        assert_eq!(run(&mut source, release), Ok(CommandResult::Count { keys: 0 }));
        assert!(source.get(tagged(2).as_bytes()).0.is_some(), "the next batch kept");
        // Giving the slot away while it holds keys is refused; the rest moves, then it is.
        let give = Command::Slot(SlotOp::Give { first: slot, last: slot, id });
        assert!(matches!(run(&mut source, give.clone()), Err(KeelError::TryAgain(_))));
        empty(&mut source, &mut target, slot, id);
        run(&mut target, Command::Slot(SlotOp::Own { first: slot, last: slot, id })).unwrap();
        run(&mut source, give).unwrap();
        let moved = KeelError::Redirect { slot, keyspace: b, ask: None };
        assert_eq!(source.slot_check(&get(&tagged(3))), Err(moved));
        assert_eq!(target.slot_check(&get(&tagged(3))), Ok(()));
        for n in 0..5 {
            assert!(target.get(tagged(n).as_bytes()).0.is_some(), "{n} moved");
            assert!(source.get(tagged(n).as_bytes()).0.is_none(), "{n} left");
        }
        assert_eq!(source.get(b"bar").0, Some(Value::from_static(b"v")));
        assert_eq!(source.slot_state(slot), Some(SlotState::Released { to: b, id }));
        assert_eq!(target.slot_states(), vec![(slot, SlotState::Owned { id })]);
        // And back, by a later move; a late copy of the first move's import is ignored.
        let late = SlotOp::Import { first: slot, last: slot, from: a, id };
        assert_eq!(run(&mut target, Command::Slot(late)), Ok(CommandResult::Count { keys: 0 }));
        let back = id + 1;
        run(
            &mut source,
            Command::Slot(SlotOp::Import { first: slot, last: slot, from: b, id: back }),
        )
        .unwrap();
        run(
            &mut target,
            Command::Slot(SlotOp::Migrate { first: slot, last: slot, to: a, id: back }),
        )
        .unwrap();
        // A step of an earlier move is refused and changes nothing.
        let stale = SlotOp::Migrate { first: slot, last: slot, to: b, id };
        let before = source.slot_state(slot);
        assert!(matches!(
            run(&mut source, Command::Slot(stale)),
            Err(KeelError::InvalidArgument(_))
        ));
        assert_eq!(source.slot_state(slot), before);
        empty(&mut target, &mut source, slot, back);
        run(&mut source, Command::Slot(SlotOp::Own { first: slot, last: slot, id: back })).unwrap();
        run(&mut target, Command::Slot(SlotOp::Give { first: slot, last: slot, id: back }))
            .unwrap();
        for n in 0..5 {
            assert!(source.get(tagged(n).as_bytes()).0.is_some(), "{n} back");
        }
        assert_eq!(source.get(tagged(0).as_bytes()).0, Some(Value::from_static(b"new")));
    }

    #[test]
    fn slot_states_roll_back_travel_in_snapshots_and_refuse_forgeries() {
        let slot = key_slot(b"foo");
        let mut kv = Kv::new(100);
        run(&mut kv, put(&tagged(1))).unwrap();
        let at = kv.applied_index();
        let generation = kv.slot_generation();
        let migrate = SlotOp::Migrate { first: slot, last: slot + 1, to: KeyspaceId(3), id: 1 };
        run(&mut kv, Command::Slot(migrate)).unwrap();
        run(&mut kv, Command::Slot(SlotOp::Hold { slot, count: 8, id: 1 })).unwrap();
        assert_ne!(kv.slot_generation(), generation);
        let bytes = kv.encode_at(kv.applied_index());
        let version = keel_types::Version::new(1, kv.applied_index().0);
        let decoded = Kv::decode(&bytes, version, 100).unwrap();
        assert_eq!(decoded.slot_states(), kv.slot_states());
        assert_eq!(decoded.applied_digest(), kv.applied_digest());
        kv.rollback_after(at, Epoch(1));
        kv.check_slots();
        kv.check_slot_index();
        assert!(kv.slot_states().is_empty());
        assert_eq!(kv.slot_check(&put(&tagged(9))), Ok(()));
        // Steps that contradict the state are refused whole.
        let import = SlotOp::Import { first: 5, last: 6, from: KeyspaceId(1), id: 2 };
        run(&mut kv, Command::Slot(import)).unwrap();
        let wrong = SlotOp::Migrate { first: 4, last: 5, to: KeyspaceId(1), id: 3 };
        assert!(matches!(run(&mut kv, Command::Slot(wrong)), Err(KeelError::InvalidArgument(_))));
        assert_eq!(kv.slot_state(4), None, "nothing of a refused step");
        let unowned = SlotOp::Own { first: 7, last: 7, id: 2 };
        assert!(run(&mut kv, Command::Slot(unowned)).is_err());
        // A slot state that does not decode (no step writes one) counts as none, in a
        // snapshot too: nothing persisted stops a node.
        let mut bad = Kv::new(100);
        let one = keel_types::Version::new(1, 1);
        let item = super::super::kv::Item::plain(Some("x".into()), one);
        bad.replace(slot_state_key(1), Some(item));
        bad.applied = one;
        bad.check_slot_index();
        assert_eq!(bad.slot_state(1), None);
        let bytes = bad.encode_at(LogIndex(1));
        assert_eq!(Kv::decode(&bytes, one, 100).unwrap().slot_states(), Vec::new());
        // A slot holding a queue's elements is not migrated: queues do not move.
        let queue = Key::from(tagged(7));
        let enqueue = Command::Enqueue { queue: queue.clone(), value: Value::from_static(b"e") };
        run(&mut kv, enqueue).unwrap();
        let migrate = SlotOp::Migrate { first: slot, last: slot, to: KeyspaceId(2), id: 9 };
        assert!(matches!(
            run(&mut kv, Command::Slot(migrate.clone())),
            Err(KeelError::InvalidArgument(_))
        ));
        run(&mut kv, Command::Dequeue { queue }).unwrap();
        assert!(run(&mut kv, Command::Slot(migrate)).is_ok(), "an empty queue moves nothing");
        // FLUSHALL deletes every key and keeps every slot state.
        let released = SlotState::Released { to: KeyspaceId(1), id: 5 };
        let item = super::super::kv::Item::plain(Some(released.encode()), one);
        bad.replace(slot_state_key(2), Some(item));
        run(&mut bad, put(&tagged(1))).unwrap();
        run(&mut bad, Command::Flush { db: None }).unwrap();
        assert_eq!(bad.slot_state(2), Some(released));
        assert_eq!(bad.get(tagged(1).as_bytes()).0, None);
    }
}
