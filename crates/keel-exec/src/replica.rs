//! [`Replica`]: the loop body of one keyspace's engine on one node, the same code in the
//! tokio server and in the simulator.
//!
//! A host (a shell) owns the clocks, the channels or event queue, the sockets and the
//! disk. It hands a replica what happened: an input to step ([`Replica::step`],
//! [`Replica::clients`]), disk work done ([`Replica::complete`], [`Replica::prepared`]),
//! time passing ([`Replica::release_due`]). The replica does the rest, identically for
//! every host:
//! - it steps the engine under the write lock of its [`EngineCell`], closing reads off
//!   the loop while a hard state is not yet durable and opening them again after;
//! - it carries the outputs out through the [`Front`] (hard state before messages,
//!   truncation clamping, snapshots) and the [`AppendHold`] (appends merged for a
//!   moment), leaving the disk operations ready for the host ([`Replica::take_ready`]);
//! - it gives a batch of client requests to the engine in one step;
//! - of several fsync reports that complete together it gives the engine only the last,
//!   which covers the others;
//! - it checks after every step that the engine's epoch never goes back, and reports a
//!   role change once.
//!
//! What leaves (messages, replies, snapshots to write, memory to free, rejections) goes
//! through the host's [`Io`], in the contract's order, when the front lets it go. On the
//! way it spends the budgets of what clients make a node hold ([`crate::budget`]): a
//! message carrying client values goes only within its link's allowance (a short
//! refusal goes in its place otherwise), and a reply another node served holds its value
//! against the forwarded replies' budget until its client reads it (`BUSY` when spent).

use crate::budget::ByteBudget;
use crate::front::Front;
use crate::hold::AppendHold;
use crate::op::{Completion, DiskInput, StorageOp};
use keel_core::engine::{
    Engine, HeldValue, Input, OutputsOf, Rejection, Release, RoleView, SnapshotBytes,
};
use keel_core::time::Time;
use keel_types::{NodeId, SnapshotMeta};
use keel_wire::peer::PeerMessage;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard};

/// What a replica's host does with what leaves it. Every method is called on the loop,
/// in the contract's order: messages before the replies of the same step, both only
/// once the hard state they depend on is durable.
pub trait Io<E: Engine> {
    /// A peer message may leave now (best effort).
    fn send(&mut self, to: NodeId, message: E::Message);
    /// A peer message carrying `bulk` bytes of client values may leave now, if the link to
    /// `to` can queue them within its allowance ([`crate::LinkAllowance`]); `Err` gives
    /// the message back when it cannot (the replica then sheds it). A host without
    /// allowances queues everything.
    fn send_bulk(
        &mut self,
        to: NodeId,
        message: E::Message,
        bulk: usize,
    ) -> Result<(), E::Message> {
        let _ = bulk;
        self.send(to, message);
        Ok(())
    }
    /// A client reply may leave now.
    fn reply(&mut self, reply: E::Reply);
    /// Something the replica refused for want of a budget (for a host's metrics).
    fn refused(&mut self, refusal: Refusal) {
        let _ = refusal;
    }
    /// A snapshot this node took, to write and sync under its temporary name off the
    /// worker; then call [`Replica::prepared`].
    fn prepare(&mut self, meta: SnapshotMeta, data: SnapshotBytes);
    /// Memory the engine let go of, to free anywhere.
    fn release(&mut self, release: Vec<Release<E::Record>>) {
        drop(release);
    }
    /// A peer message the engine's gate dropped.
    fn rejected(&mut self, rejection: Rejection) {
        let _ = rejection;
    }
    /// Messages dropped for want of room behind an unsynced hard state.
    fn dropped(&mut self, messages: u64) {
        let _ = messages;
    }
    /// A step's outputs as the engine wrote them, before the front carries them out (for
    /// a host's checks and logs).
    fn stepped(&mut self, outputs: &OutputsOf<E>) {
        let _ = outputs;
    }
    /// The engine after a step and the carrying out of its outputs (for a host's checks).
    fn observe(&mut self, engine: &E) {
        let _ = engine;
    }
    /// A completion from the disk, before the front takes it (for a host's metrics).
    fn completed(&mut self, completion: &Completion) {
        let _ = completion;
    }
    /// Keyspace events of the step's applied writes, once its messages and replies left
    /// (recorded only after [`Replica::record_events`]).
    fn events(&mut self, events: Vec<keel_core::engine::KeyEvent>) {
        drop(events);
    }
}

/// What a replica refused on the way out, for want of a budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A message carrying client values to `to` did not fit the link's allowance: its
    /// stand-in (a short refusal to the same request) went instead, or nothing.
    Shed {
        /// The peer.
        to: NodeId,
    },
    /// A reply another node served did not fit the forwarded replies' budget: its client
    /// is answered `BUSY` instead.
    ForwardedReplyBusy,
}

/// A keyspace's engine as the loop and the reads off the loop share it: the loop
/// write-locks it to step it; a connection (a server) or a client event (the simulator)
/// read-locks it between steps to answer reads that need no step.
pub struct EngineCell<E> {
    engine: RwLock<E>,
    /// Whether reads may be served off the loop now: not while the front holds replies
    /// behind a hard state not yet durable. Written by the loop, read under the read lock.
    open: AtomicBool,
}

impl<E: Engine> EngineCell<E> {
    /// The engine, read-locked (the loop is the only writer, so on the loop this never
    /// waits).
    pub fn read(&self) -> RwLockReadGuard<'_, E> {
        self.engine.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The reply `request` gets at once, if the engine would answer it without waiting,
    /// no step is under way and no reply waits behind a hard state; with the time it was
    /// read at (`now` is read after the lock is taken: no earlier than the last step's).
    /// `None` sends it to the loop.
    pub fn read_now(
        &self,
        request: &E::Request,
        now: impl FnOnce() -> Time,
    ) -> Option<(E::Reply, Time)> {
        let engine = self.engine.try_read().ok()?;
        if !self.open.load(Ordering::Acquire) {
            return None;
        }
        let now = now();
        Some((engine.read_now(request, now)?, now))
    }
}

impl<E> std::fmt::Debug for EngineCell<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineCell").field("open", &self.open).finish_non_exhaustive()
    }
}

/// One keyspace's engine on one node with the executor's loop-side state.
pub struct Replica<E: Engine> {
    cell: Arc<EngineCell<E>>,
    front: Front<E::Message, E::Reply, E::Record>,
    hold: AppendHold<E::Record>,
    /// Disk operations the host is to hand its worker, in order.
    ready: Vec<(u64, StorageOp<E::Record>)>,
    wake_at: Option<Time>,
    /// The role after the last step.
    role: RoleView,
    /// Steps taken (every input, disk completions included).
    steps: u64,
    /// Fsync reports covered by a later one of the same batch, never given to the engine.
    coalesced: u64,
    /// This node (replies it served itself cost no budget).
    node: NodeId,
    /// What replies another node served may hold until their clients read them (`None`:
    /// no bound).
    forwarded_replies: Option<Arc<ByteBudget>>,
    /// Refusals so far: messages shed, replies answered `BUSY`.
    shed: u64,
    busy: u64,
}

impl<E: Engine> std::fmt::Debug for Replica<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica")
            .field("role", &self.role)
            .field("steps", &self.steps)
            .field("wake_at", &self.wake_at)
            .finish_non_exhaustive()
    }
}

impl<E: Engine> Replica<E>
where
    E::Message: PeerMessage,
{
    /// A replica around a booted `engine`, with `front` (its bound on messages held
    /// behind a hard state) and `hold` (its append hold; one of 0 ns holds nothing).
    pub fn new(
        engine: E,
        front: Front<E::Message, E::Reply, E::Record>,
        hold: AppendHold<E::Record>,
    ) -> Replica<E> {
        let role = engine.role();
        let node = engine.node_id();
        let cell =
            Arc::new(EngineCell { engine: RwLock::new(engine), open: AtomicBool::new(true) });
        Replica {
            cell,
            front,
            hold,
            ready: Vec::new(),
            wake_at: None,
            role,
            steps: 0,
            coalesced: 0,
            node,
            forwarded_replies: None,
            shed: 0,
            busy: 0,
        }
    }

    /// Bounds what the replies another node served hold until their clients read them, by
    /// `budget` (shared by the node's keyspaces).
    pub fn with_forwarded_replies(mut self, budget: Arc<ByteBudget>) -> Replica<E> {
        self.forwarded_replies = Some(budget);
        self
    }

    /// What reads off the loop hold.
    pub fn cell(&self) -> &Arc<EngineCell<E>> {
        &self.cell
    }

    /// The engine, read-locked.
    pub fn engine(&self) -> RwLockReadGuard<'_, E> {
        self.cell.read()
    }

    /// Turns the engine's recording of keyspace events on or off (`Engine::record_events`):
    /// from the next step on, [`Io::events`] hears them.
    pub fn record_events(&mut self, on: bool) {
        let mut engine = self.cell.engine.write().unwrap_or_else(PoisonError::into_inner);
        engine.record_events(on);
    }

    /// Steps the engine with `input` at local time `now` and carries the outputs out.
    /// Returns the engine's role if this step changed it.
    pub fn step(
        &mut self,
        now: Time,
        input: Input<E::Message, E::Request>,
        io: &mut impl Io<E>,
    ) -> Option<RoleView> {
        let (out, role) = {
            let mut engine = self.cell.engine.write().unwrap_or_else(PoisonError::into_inner);
            let out = engine.step(now, input);
            if out.hard_state.is_some() {
                // Its replies wait for the disk: so do reads off the loop, from now on.
                self.cell.open.store(false, Ordering::Release);
            }
            (out, engine.role())
        };
        self.steps += 1;
        self.carry_out(now, out, io);
        io.observe(&self.cell.read());
        self.observe_role(role)
    }

    /// Gives the engine a batch of client requests that arrived together: one step for
    /// all of them (none: no step).
    pub fn clients(
        &mut self,
        now: Time,
        mut batch: Vec<E::Request>,
        io: &mut impl Io<E>,
    ) -> Option<RoleView> {
        match batch.len() {
            0 => None,
            1 => self.step(now, Input::Client(batch.pop().expect("one")), io),
            _ => self.step(now, Input::Clients(batch), io),
        }
    }

    /// Disk work done, in the order the worker reported it: each completion goes through
    /// the front (which may release held messages and replies) and becomes the engine's
    /// input; of several fsync reports in a row only the last reaches the engine (it
    /// covers the others).
    pub fn complete(
        &mut self,
        now: Time,
        completions: &[Completion],
        io: &mut impl Io<E>,
    ) -> Option<RoleView> {
        let mut changed = None;
        for (i, completion) in completions.iter().enumerate() {
            io.completed(completion);
            let superseded = matches!(completion, Completion::Synced { .. })
                && matches!(completions.get(i + 1), Some(Completion::Synced { .. }));
            let done = self.front.complete(*completion);
            self.reopen();
            self.leave(done.messages, done.replies, io);
            match done.input {
                Some(DiskInput::LogSynced(_)) if superseded => self.coalesced += 1,
                Some(input) => changed = self.step(now, input.into_input(), io).or(changed),
                None => {}
            }
        }
        changed
    }

    /// A snapshot given to [`Io::prepare`] is written: its adoption is queued.
    pub fn prepared(&mut self, now: Time, meta: SnapshotMeta, len: u64) {
        let op = self.front.prepared(meta, len);
        self.hold.push(now, op, &mut self.ready);
    }

    /// Releases the held appends if their time has come by `now`; whether it did.
    pub fn release_due(&mut self, now: Time) -> bool {
        if self.hold.due_at().is_some_and(|due| due <= now) {
            self.hold.release(&mut self.ready);
            return true;
        }
        false
    }

    /// Releases the held appends whatever the time (a host stopping hands them over).
    pub fn release_held(&mut self) {
        self.hold.release(&mut self.ready);
    }

    /// Moves the disk operations ready for the worker, in order, into `into`.
    pub fn take_ready(&mut self, into: &mut Vec<(u64, StorageOp<E::Record>)>) {
        into.append(&mut self.ready);
    }

    /// Whether disk operations wait for the host to hand them over.
    pub fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// When the engine asked to be ticked next.
    pub fn wake_at(&self) -> Option<Time> {
        self.wake_at
    }

    /// When the held appends are to be released.
    pub fn hold_due(&self) -> Option<Time> {
        self.hold.due_at()
    }

    /// Whether messages and replies wait for a hard state.
    pub fn holding(&self) -> bool {
        self.front.holding()
    }

    /// The engine's role after the last step.
    pub fn role(&self) -> RoleView {
        self.role
    }

    /// How many steps the engine took.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// How many fsync reports a later one of the same batch covered.
    pub fn coalesced(&self) -> u64 {
        self.coalesced
    }

    /// How many messages carrying client values were shed, and how many forwarded
    /// replies answered `BUSY`, for want of room.
    pub fn refusals(&self) -> (u64, u64) {
        (self.shed, self.busy)
    }

    fn carry_out(&mut self, now: Time, mut out: OutputsOf<E>, io: &mut impl Io<E>) {
        io.stepped(&out);
        let events = std::mem::take(&mut out.events);
        let effects = self.front.carry_out(out);
        for rejection in effects.rejected {
            io.rejected(rejection);
        }
        for op in effects.ops {
            self.hold.push(now, op, &mut self.ready);
        }
        if let Some((meta, data)) = effects.prepare {
            io.prepare(meta, data);
        }
        if !effects.release.is_empty() {
            io.release(effects.release);
        }
        if effects.messages_dropped > 0 {
            io.dropped(effects.messages_dropped);
        }
        self.leave(effects.messages, effects.replies, io);
        if !events.is_empty() {
            io.events(events);
        }
        self.wake_at = effects.wake_at;
    }

    fn leave(
        &mut self,
        messages: Vec<(NodeId, E::Message)>,
        replies: Vec<E::Reply>,
        io: &mut impl Io<E>,
    ) {
        for (to, message) in messages {
            let bulk = message.bulk_bytes();
            if bulk == 0 {
                io.send(to, message);
                continue;
            }
            let Err(message) = io.send_bulk(to, message, bulk) else { continue };
            // The link holds all the client values it may: a short refusal goes in this
            // one's place, so that heartbeats are not held back behind them.
            self.shed += 1;
            io.refused(Refusal::Shed { to });
            if let Some(stand_in) = message.shed() {
                assert_eq!(stand_in.bulk_bytes(), 0, "a stand-in carries no client value");
                io.send(to, stand_in);
            }
        }
        for reply in replies {
            let reply = self.hold_forwarded(reply, io);
            io.reply(reply);
        }
    }

    /// A reply another node served (a request this follower forwarded) carries a copy of
    /// its value, which this node holds until the client reads it: charged to the
    /// forwarded replies' budget, or answered `BUSY` when the budget is spent (clients
    /// that do not read their replies cannot make the node hold more). A reply served
    /// here shares the store's value and costs nothing.
    fn hold_forwarded(&mut self, mut reply: E::Reply, io: &mut impl Io<E>) -> E::Reply {
        let Some(budget) = &self.forwarded_replies else { return reply };
        let Some(value) = reply.forwarded_value(self.node) else { return reply };
        match crate::budget::charge(budget, value) {
            Some(held) => *value = held,
            None => {
                self.busy += 1;
                io.refused(Refusal::ForwardedReplyBusy);
                reply.refuse_busy(
                    "replies from the leader waiting for their clients to read them hold forwarded_replies_bytes_max",
                );
            }
        }
        reply
    }

    /// Opens reads off the loop again once the front holds nothing behind a hard state.
    fn reopen(&self) {
        if !self.front.holding() && !self.cell.open.load(Ordering::Relaxed) {
            self.cell.open.store(true, Ordering::Release);
        }
    }

    fn observe_role(&mut self, now: RoleView) -> Option<RoleView> {
        assert!(
            now.epoch >= self.role.epoch,
            "epochs never go back: {:?} after {:?}",
            now,
            self.role
        );
        if now == self.role {
            return None;
        }
        self.role = now;
        Some(now)
    }
}
