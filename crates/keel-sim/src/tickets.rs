//! The `tickets` scenario's clients: the Correctables paper's ticket selling on Keel's
//! replicated queue, under every fault the general scenario injects.
//!
//! [`ORGANIZERS`] organizers enqueue `tickets` tickets (`t1`, `t2`, ...), each one at a
//! time; meanwhile `retailers` retailers buy, each until it is told the queue is empty
//! after the whole stock was in. A purchase is what
//! `KEEL.INVOKE DEQUEUE` does: a `QueuePeek` at level `any` and the `Dequeue` itself, sent
//! together to one node; the peek's answer is the preliminary view, on which the retailer
//! sells at once when it shows more than `threshold` tickets left, the dequeue's the final
//! view. Every write goes under a deduplication session and is retried with the same pair
//! at another node when it fails or times out, at most [`RETRIES_MAX`] times (then its
//! outcome is unknown). Enqueues and dequeues are `durable`: an acknowledged dequeue that
//! a crash could undo would give its ticket out twice.
//!
//! Checked as operations complete and at the end (each a violation of its own):
//! - `queue-dequeued-twice`: two acknowledged dequeues took the same element;
//! - `queue-phantom`: a dequeue returned what no enqueue put there, or under another
//!   sequence number than its enqueue was told;
//! - `queue-order`: a dequeue that began after another one ended took an earlier element;
//! - `queue-lost`: a dequeue found the queue empty although more acknowledged enqueues
//!   finished before it began than dequeues (acknowledged or unknown) could have taken;
//! - `tickets-oversold`: more tickets sold than were put up for sale.
//!
//! A sale made on a preliminary view whose final view gives no ticket is taken back
//! (`revoked_sales`): a stale replica's view, which the threshold makes rare, not a
//! violation. The final view decides.
//!
//! The `jobs` scenario runs the same actors as a Redis job queue ([`Flavor::List`]): the
//! organizers are producers that `RPUSH` jobs (`j1`, `j2`, ...) to a list, the retailers
//! workers that take one with `LMOVE jobs processing LEFT RIGHT` (what `BLMOVE` sends once
//! a job is there) and, once told, remove it from `processing` with `LREM`, every write
//! `durable`. The checks are the queue's but the order one (producers push concurrently,
//! so a job's number is not its place in the list), named `job-popped-twice`,
//! `job-phantom` and `job-lost`. Its negative control acknowledges the pops at `memory`
//! ([`Flavor::List::pop_durability`]): a pop a crash undoes gives its job out again.

use crate::engine::LeaderSim;
use crate::rng::Rng;
use crate::world::{Keyspace, Notice, World};
use keel_core::leader::{ClientReply, ClientRequest, RequestTag};
use keel_types::coll::{Answer, CollOp, End};
use keel_types::{
    ClientId, Command, CommandResult, Durability, KeelError, LogIndex, ReadLevel, RequestId,
};
use std::collections::BTreeMap;

/// Timer class of the ticket clients (above the classes of `clients.rs`).
pub const TIMER_TICKETS: u64 = 5;
/// Most attempts after the first of one write.
pub const RETRIES_MAX: u32 = 4;
/// The queue's name.
const QUEUE: &[u8] = b"tickets";
/// The job list's name, and the list a worker moves its job to ([`Flavor::List`]).
const JOBS: &[u8] = b"jobs";
const PROCESSING: &[u8] = b"processing";

/// Which queue the actors use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// Keel's replicated queue (`KEEL.ENQUEUE`, `KEEL.INVOKE DEQUEUE`): the tickets sale.
    Queue,
    /// A Redis list as a reliable job queue (`RPUSH`, `LMOVE`, `LREM`).
    List {
        /// The durability pops are acknowledged at: `durable`, or `memory` for the
        /// negative control.
        pop_durability: Durability,
    },
}
/// Client ids of the ticket actors start here (apart from the general clients').
const CLIENT_BASE: u64 = 1_000;
/// Actors that enqueue the stock (the first ones); the rest are retailers.
pub const ORGANIZERS: usize = 3;

/// The sale's parameters.
#[derive(Clone, Debug)]
pub struct TicketsConfig {
    /// Tickets put up for sale.
    pub tickets: u32,
    /// Concurrent retailers.
    pub retailers: u32,
    /// A retailer sells on a preliminary view only when it shows more than this many
    /// tickets left.
    pub threshold: u64,
    /// How long an attempt may take before it is retried.
    pub attempt_timeout_ns: u64,
    /// Seeds the ticket clients' draws (apart from everything else's).
    pub seed: u64,
    /// The queue: Keel's, or a Redis list.
    pub flavor: Flavor,
}

/// What the sale came to.
#[derive(Clone, Debug, Default)]
pub struct TicketsOutcome {
    /// Tickets enqueued with an acknowledgement.
    pub stocked: u64,
    /// Tickets sold (acknowledged dequeues that gave one).
    pub sold: u64,
    /// Of them, sold on the preliminary view.
    pub sold_on_preliminary: u64,
    /// Purchases whose preliminary view showed a ticket and whose final view gave none.
    pub revoked: u64,
    /// Of them, sales made on the preliminary view and taken back.
    pub revoked_sales: u64,
    /// Writes whose retries ran out (enqueues and dequeues).
    pub unknown: u64,
    /// Attempts sent again with the same pair.
    pub retries: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Step {
    /// Opening the actor's session.
    Open,
    /// Enqueueing this ticket.
    Enqueue(String),
    /// A purchase (a job taken, [`Flavor::List`]).
    Dequeue,
    /// Removing a job the worker took from the processing list ([`Flavor::List`]).
    Finish(String),
}

struct Inflight {
    step: Step,
    request: ClientRequest,
    tags: Vec<RequestTag>,
    /// The preliminary view's peek, while unanswered.
    peek: Option<RequestTag>,
    attempts: u32,
    invoke_ns: u64,
    /// A preliminary view showed a ticket / the retailer sold on it.
    shown: bool,
    speculated: bool,
    /// Bumped per attempt: a deadline for an older attempt is stale.
    attempt_id: u64,
}

#[derive(Default)]
struct Actor {
    session: Option<ClientId>,
    /// A job taken and not yet removed from the processing list.
    holding: Option<String>,
    sessions_opened: u64,
    next_request: u64,
    inflight: Option<Inflight>,
    done: bool,
}

/// A completed (or abandoned) dequeue, for the checks.
struct Dequeue {
    invoke_ns: u64,
    complete_ns: u64,
    /// `None`: unknown outcome; `Some(None)`: the queue was empty.
    taken: Option<Option<(u64, String)>>,
}

/// The ticket clients of one run.
pub struct Tickets {
    config: TicketsConfig,
    keyspace: Keyspace,
    rng: Rng,
    /// The first [`ORGANIZERS`] actors enqueue, the rest are retailers.
    actors: Vec<Actor>,
    by_tag: BTreeMap<RequestTag, usize>,
    next_ticket: u32,
    /// When the last organizer finished (every ticket's enqueue ended).
    stocked_at_ns: Option<u64>,
    stopped: bool,
    next_attempt: u64,
    /// Every ticket enqueued (attempted) and the sequence number it was told (`None`:
    /// unknown), with when its enqueue completed.
    enqueued: BTreeMap<String, (Option<u64>, Option<u64>)>,
    dequeues: Vec<Dequeue>,
    /// What the sale came to.
    pub outcome: TicketsOutcome,
}

impl Tickets {
    /// The organizer and `config.retailers` retailers, on keyspace `keyspace`.
    pub fn new(config: TicketsConfig, keyspace: Keyspace) -> Tickets {
        assert!(config.retailers >= 1 && config.tickets >= 1);
        let actors =
            (0..ORGANIZERS + config.retailers as usize).map(|_| Actor::default()).collect();
        Tickets {
            rng: Rng::new(config.seed),
            config,
            keyspace,
            actors,
            by_tag: BTreeMap::new(),
            next_ticket: 1,
            stocked_at_ns: None,
            stopped: false,
            next_attempt: 0,
            enqueued: BTreeMap::new(),
            dequeues: Vec::new(),
            outcome: TicketsOutcome::default(),
        }
    }

    /// Starts every actor.
    pub fn start<E: LeaderSim>(&mut self, world: &mut World<E>) {
        for actor in 0..self.actors.len() {
            self.wake_later(world, actor);
        }
    }

    /// No new operations after this.
    pub fn stop(&mut self) {
        self.stopped = true;
    }

    /// Paths the sale reached, counted by name (for the coverage report).
    pub fn reached(&self) -> Vec<(&'static str, u64)> {
        let empty = self.dequeues.iter().filter(|d| matches!(d.taken, Some(None))).count();
        if matches!(self.config.flavor, Flavor::List { .. }) {
            return vec![
                ("job-popped", self.outcome.sold),
                ("job-retry", self.outcome.retries),
                ("job-unknown", self.outcome.unknown),
                ("jobs-found-empty", empty as u64),
            ];
        }
        vec![
            ("ticket-sold", self.outcome.sold),
            ("ticket-sold-on-preliminary", self.outcome.sold_on_preliminary),
            ("ticket-revoked", self.outcome.revoked),
            ("ticket-sale-revoked", self.outcome.revoked_sales),
            ("ticket-retry", self.outcome.retries),
            ("ticket-unknown", self.outcome.unknown),
            ("queue-found-empty", empty as u64),
        ]
    }

    /// Operations in flight.
    pub fn in_flight(&self) -> usize {
        self.actors.iter().filter(|a| a.inflight.is_some()).count()
    }

    fn wake_later<E: LeaderSim>(&mut self, world: &mut World<E>, actor: usize) {
        let at = world.now_ns() + self.rng.range(100_000, 2_000_000);
        world.set_timer(at, crate::clients::timer_id(TIMER_TICKETS, actor as u64));
    }

    /// Handles a notice meant for the ticket clients; false if it is not theirs.
    pub fn handle<E: LeaderSim>(&mut self, world: &mut World<E>, notice: &Notice) -> bool {
        match notice {
            Notice::Reply { reply, .. } => {
                let Some(actor) = self.by_tag.remove(&reply.tag) else { return false };
                self.on_reply(world, actor, reply);
                true
            }
            Notice::Timer { id } if id >> crate::clients::TIMER_CLASS_SHIFT == TIMER_TICKETS => {
                let payload = id & ((1 << crate::clients::TIMER_CLASS_SHIFT) - 1);
                // Deadlines carry the attempt id with the top payload bit set.
                if payload & 1 << 39 != 0 {
                    self.on_deadline(world, payload & !(1 << 39));
                } else {
                    self.on_wake(world, payload as usize);
                }
                true
            }
            Notice::Timer { .. } => false,
        }
    }

    fn on_wake<E: LeaderSim>(&mut self, world: &mut World<E>, actor: usize) {
        if self.stopped || self.actors[actor].done || self.actors[actor].inflight.is_some() {
            return;
        }
        let step = if self.actors[actor].session.is_none() {
            Step::Open
        } else if actor < ORGANIZERS {
            if self.next_ticket > self.config.tickets {
                self.actors[actor].done = true;
                if self.actors[..ORGANIZERS].iter().all(|a| a.done) {
                    self.stocked_at_ns = Some(world.now_ns());
                }
                return;
            }
            let prefix = if self.config.flavor == Flavor::Queue { "t" } else { "j" };
            let ticket = format!("{prefix}{}", self.next_ticket);
            self.next_ticket += 1;
            // Known as attempted from now on: a dequeue may take it before its enqueue's
            // answer arrives.
            self.enqueued.insert(ticket.clone(), (None, None));
            Step::Enqueue(ticket)
        } else if let Some(job) = self.actors[actor].holding.clone() {
            Step::Finish(job)
        } else {
            Step::Dequeue
        };
        let list = matches!(self.config.flavor, Flavor::List { .. });
        let state = &mut self.actors[actor];
        let (client, request, command) = match &step {
            Step::Open => {
                state.sessions_opened += 1;
                let id = ClientId(
                    ClientId::SESSION_BIT
                        | state.sessions_opened << 16
                        | (CLIENT_BASE + actor as u64),
                );
                (id, RequestId(0), Command::OpenSession { seen: None })
            }
            Step::Enqueue(ticket) => {
                state.next_request += 1;
                let value: keel_types::Value = ticket.clone().into_bytes().into();
                let command = match list {
                    true => coll(
                        JOBS,
                        CollOp::Push { end: End::Back, values: vec![value], only_existing: false },
                    ),
                    false => Command::Enqueue { queue: QUEUE.into(), value },
                };
                (state.session.expect("open"), RequestId(state.next_request), command)
            }
            Step::Dequeue => {
                state.next_request += 1;
                let command = match list {
                    true => coll(
                        JOBS,
                        CollOp::LMove {
                            to: PROCESSING.into(),
                            from: End::Front,
                            to_end: End::Back,
                        },
                    ),
                    false => Command::Dequeue { queue: QUEUE.into() },
                };
                (state.session.expect("open"), RequestId(state.next_request), command)
            }
            Step::Finish(job) => {
                state.next_request += 1;
                let value = job.clone().into_bytes().into();
                let command = coll(PROCESSING, CollOp::LRem { count: 1, value });
                (state.session.expect("open"), RequestId(state.next_request), command)
            }
        };
        let durability = match (&step, self.config.flavor) {
            (Step::Open, _) => None,
            (Step::Dequeue, Flavor::List { pop_durability }) => Some(pop_durability),
            _ => Some(Durability::Durable),
        };
        let request = ClientRequest {
            tag: RequestTag(0),
            client,
            request,
            durability,
            level: None,
            command,
            after: LogIndex::ZERO,
            mode: Default::default(),
            named: false,
        };
        let nodes = world.node_ids();
        let node = nodes[self.rng.index(nodes.len())];
        let mut peek = None;
        if step == Step::Dequeue && !list {
            // The preliminary view: the node's own copy of the queue, read before the
            // dequeue reaches it (as `KEEL.INVOKE DEQUEUE` sends them).
            let read = ClientRequest {
                tag: RequestTag(0),
                client: ClientId(CLIENT_BASE + actor as u64),
                request: RequestId(0),
                durability: None,
                level: Some(ReadLevel::Any),
                command: Command::QueuePeek { queue: QUEUE.into() },
                after: LogIndex::ZERO,
                mode: Default::default(),
                named: false,
            };
            let tag = world.submit_to(node, self.keyspace, read);
            self.by_tag.insert(tag, actor);
            peek = Some(tag);
        }
        let tag = world.submit_to(node, self.keyspace, request.clone());
        self.by_tag.insert(tag, actor);
        let attempt_id = self.next_attempt;
        self.next_attempt += 1;
        self.actors[actor].inflight = Some(Inflight {
            step,
            request,
            tags: vec![tag],
            peek,
            attempts: 0,
            invoke_ns: world.now_ns(),
            shown: false,
            speculated: false,
            attempt_id,
        });
        self.set_deadline(world, attempt_id);
    }

    fn set_deadline<E: LeaderSim>(&mut self, world: &mut World<E>, attempt_id: u64) {
        let at = world.now_ns() + self.config.attempt_timeout_ns;
        let payload = attempt_id | 1 << 39;
        world.set_timer(at, crate::clients::timer_id(TIMER_TICKETS, payload));
    }

    /// Sends the in-flight write of `actor` again, with the same pair, at another node;
    /// false when its retries ran out.
    fn retry<E: LeaderSim>(&mut self, world: &mut World<E>, actor: usize) -> bool {
        let inflight = self.actors[actor].inflight.as_mut().expect("in flight");
        if inflight.attempts >= RETRIES_MAX || self.stopped {
            return false;
        }
        inflight.attempts += 1;
        let nodes = world.node_ids();
        let node = nodes[self.rng.index(nodes.len())];
        let tag = world.submit_to(node, self.keyspace, inflight.request.clone());
        self.by_tag.insert(tag, actor);
        let inflight = self.actors[actor].inflight.as_mut().expect("in flight");
        inflight.tags.push(tag);
        inflight.attempt_id = self.next_attempt;
        self.next_attempt += 1;
        let attempt_id = inflight.attempt_id;
        self.outcome.retries += 1;
        self.set_deadline(world, attempt_id);
        true
    }

    fn on_deadline<E: LeaderSim>(&mut self, world: &mut World<E>, attempt_id: u64) {
        let actor = self
            .actors
            .iter()
            .position(|a| a.inflight.as_ref().is_some_and(|i| i.attempt_id == attempt_id));
        let Some(actor) = actor else { return }; // answered, or retried since
        if !self.retry(world, actor) {
            self.give_up(world, actor);
        }
    }

    /// The in-flight write's outcome stays unknown.
    fn give_up<E: LeaderSim>(&mut self, world: &mut World<E>, actor: usize) {
        let inflight = self.actors[actor].inflight.take().expect("in flight");
        for tag in inflight.tags.iter().chain(&inflight.peek) {
            self.by_tag.remove(tag);
        }
        match inflight.step {
            Step::Open => {}
            Step::Enqueue(ticket) => {
                self.outcome.unknown += 1;
                self.enqueued.insert(ticket, (None, None));
            }
            Step::Dequeue => {
                self.outcome.unknown += 1;
                self.dequeues.push(Dequeue {
                    invoke_ns: inflight.invoke_ns,
                    complete_ns: world.now_ns(),
                    taken: None,
                });
            }
            // Whether the job left the processing list is not checked: on to the next.
            Step::Finish(_) => self.actors[actor].holding = None,
        }
        self.wake_later(world, actor);
    }

    fn on_reply<E: LeaderSim>(&mut self, world: &mut World<E>, actor: usize, reply: &ClientReply) {
        let Some(inflight) = self.actors[actor].inflight.as_mut() else { return };
        if inflight.peek == Some(reply.tag) {
            inflight.peek = None;
            if let Ok(CommandResult::Queue { head: Some(_), length, .. }) = &reply.result {
                inflight.shown = true;
                // More than `threshold` left with this one: sell now.
                inflight.speculated = length.saturating_sub(1) >= self.config.threshold;
            }
            return;
        }
        let result = match &reply.result {
            Err(KeelError::SessionExpired) => {
                // Forgotten by the table: an earlier attempt may have been applied.
                self.actors[actor].session = None;
                return self.give_up(world, actor);
            }
            Err(e) if e.is_retryable() => {
                if !self.retry(world, actor) {
                    self.give_up(world, actor);
                }
                return;
            }
            other => other.clone(),
        };
        let inflight = self.actors[actor].inflight.take().expect("in flight");
        for tag in inflight.tags.iter().chain(&inflight.peek) {
            self.by_tag.remove(tag);
        }
        let now = world.now_ns();
        let result = result.map(|r| self.as_queue_result(&inflight.step, r));
        match (&inflight.step, result) {
            (Step::Open, Ok(_)) => self.actors[actor].session = Some(inflight.request.client),
            (Step::Open, Err(_)) => {}
            (Step::Enqueue(ticket), Ok(CommandResult::Enqueued { seq, .. })) => {
                self.outcome.stocked += 1;
                self.enqueued.insert(ticket.clone(), (Some(seq), Some(now)));
            }
            (Step::Dequeue, Ok(CommandResult::Dequeued { head, .. })) => {
                let taken: Option<(u64, String)> =
                    head.map(|(seq, value)| (seq, String::from_utf8_lossy(&value).into()));
                match &taken {
                    Some((_, job)) => {
                        if matches!(self.config.flavor, Flavor::List { .. }) {
                            self.actors[actor].holding = Some(job.clone());
                        }
                        self.outcome.sold += 1;
                        self.outcome.sold_on_preliminary += u64::from(inflight.speculated);
                    }
                    None => {
                        self.outcome.revoked += u64::from(inflight.shown);
                        self.outcome.revoked_sales += u64::from(inflight.speculated);
                        // Sold out, once the whole stock was in before it asked.
                        let stocked = self.stocked_at_ns.is_some_and(|t| t < inflight.invoke_ns);
                        self.actors[actor].done = stocked;
                    }
                }
                self.dequeues.push(Dequeue {
                    invoke_ns: inflight.invoke_ns,
                    complete_ns: now,
                    taken: Some(taken),
                });
                for (kind, detail) in self.check() {
                    world.violate(kind, detail);
                }
            }
            (Step::Finish(_), _) => self.actors[actor].holding = None,
            (step, Ok(other)) => panic!("{other:?} does not answer {step:?}"),
            // Refused for good (not retryable): nothing was applied.
            (Step::Enqueue(ticket), Err(_)) => {
                self.enqueued.insert(ticket.clone(), (None, None));
            }
            (Step::Dequeue, Err(_)) => {}
        }
        self.wake_later(world, actor);
    }

    /// A list command's answer as the queue's result it stands for ([`Flavor::List`]):
    /// a push as an enqueue told the job's number, a move as a dequeue of the job (its
    /// number standing for a sequence number) or of nothing.
    fn as_queue_result(&self, step: &Step, result: CommandResult) -> CommandResult {
        let CommandResult::Answer { answer, version } = result else { return result };
        let version = version.unwrap_or_default();
        match (step, answer) {
            (Step::Enqueue(job), Answer::Int(length)) => {
                CommandResult::Enqueued { seq: job_number(job), length: length as u64, version }
            }
            (Step::Dequeue, Answer::Bulk(job)) => {
                let seq = job_number(&String::from_utf8_lossy(&job));
                CommandResult::Dequeued { head: Some((seq, job)), remaining: 0, version }
            }
            (Step::Dequeue, Answer::Nil | Answer::NilArray) => {
                CommandResult::Dequeued { head: None, remaining: 0, version }
            }
            (_, answer) => CommandResult::Answer { answer, version: Some(version) },
        }
    }

    /// A violation's name in this flavor.
    fn named(&self, queue: &'static str) -> &'static str {
        match (self.config.flavor, queue) {
            (Flavor::Queue, name) => name,
            (Flavor::List { .. }, "queue-dequeued-twice") => "job-popped-twice",
            (Flavor::List { .. }, "queue-phantom") => "job-phantom",
            (Flavor::List { .. }, "queue-lost") => "job-lost",
            (Flavor::List { .. }, name) => name,
        }
    }

    /// The checks of the module doc, on the last dequeue, against what completed before.
    fn check(&self) -> Vec<(&'static str, String)> {
        let mut found = self.check_queue();
        for (kind, _) in &mut found {
            *kind = self.named(kind);
        }
        found
    }

    fn check_queue(&self) -> Vec<(&'static str, String)> {
        let Some(last) = self.dequeues.last() else { return Vec::new() };
        let mut found: Vec<(&'static str, String)> = Vec::new();
        match &last.taken {
            Some(Some((seq, ticket))) => {
                let twice = self.dequeues[..self.dequeues.len() - 1]
                    .iter()
                    .any(|d| matches!(&d.taken, Some(Some((s, _))) if s == seq));
                if twice {
                    found.push(("queue-dequeued-twice", format!("element {seq} ({ticket})")));
                }
                match self.enqueued.get(ticket) {
                    None => found.push(("queue-phantom", format!("{ticket} was never enqueued"))),
                    Some((Some(told), _)) if told != seq => found.push((
                        "queue-phantom",
                        format!("{ticket} dequeued as {seq}, enqueued as {told}"),
                    )),
                    _ => {}
                }
                let ordered = self.config.flavor == Flavor::Queue;
                let earlier = self.dequeues.iter().filter(|_| ordered).find(|d| {
                    d.complete_ns < last.invoke_ns
                        && matches!(&d.taken, Some(Some((s, _))) if s > seq)
                });
                if let Some(Dequeue { taken: Some(Some((s, t))), .. }) = earlier {
                    found.push((
                        "queue-order",
                        format!("{ticket} ({seq}) dequeued after {t} ({s}) had been"),
                    ));
                }
            }
            Some(None) => {
                // Found empty: every ticket acknowledged before this dequeue began must
                // have been taken by a dequeue that began before it ended, or by one whose
                // outcome is unknown.
                let before = self
                    .enqueued
                    .values()
                    .filter(|(seq, done)| seq.is_some() && done.is_some_and(|d| d < last.invoke_ns))
                    .count();
                let could_take = self
                    .dequeues
                    .iter()
                    .filter(|d| match &d.taken {
                        Some(Some(_)) => d.invoke_ns < last.complete_ns,
                        None => true,
                        Some(None) => false,
                    })
                    .count()
                    // Dequeues still waiting for their answer may have been applied.
                    + self
                        .actors
                        .iter()
                        .filter_map(|a| a.inflight.as_ref())
                        .filter(|i| i.step == Step::Dequeue && i.invoke_ns < last.complete_ns)
                        .count();
                if before > could_take {
                    found.push((
                        "queue-lost",
                        format!(
                            "found empty with {before} acknowledged tickets and {could_take} dequeues that could have taken them"
                        ),
                    ));
                }
            }
            None => {}
        }
        if self.outcome.sold > u64::from(self.config.tickets) {
            let detail = format!("{} sold of {}", self.outcome.sold, self.config.tickets);
            found.push(("tickets-oversold", detail));
        }
        found
    }
}

/// A collection write on `key`.
fn coll(key: &[u8], op: CollOp) -> Command {
    Command::Coll { key: keel_types::Key::copy_from_slice(key), op: Box::new(op) }
}

/// The number of job `jN` (0 if the name is not one).
fn job_number(job: &str) -> u64 {
    job.trim_start_matches(['j', 't']).parse().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dequeue(invoke_ns: u64, complete_ns: u64, taken: Option<Option<(u64, &str)>>) -> Dequeue {
        let taken = taken.map(|t| t.map(|(s, v)| (s, v.to_string())));
        Dequeue { invoke_ns, complete_ns, taken }
    }

    #[test]
    fn the_checks_catch_a_double_dequeue_a_phantom_a_reordering_and_a_loss() {
        let config = TicketsConfig {
            tickets: 3,
            retailers: 1,
            threshold: 1,
            attempt_timeout_ns: 1,
            seed: 0,
            flavor: Flavor::Queue,
        };
        let run = |enqueued: &[(&str, u64, u64)], dequeues: Vec<Dequeue>| {
            let mut tickets = Tickets::new(config.clone(), 0);
            for (ticket, seq, done) in enqueued {
                tickets.enqueued.insert(ticket.to_string(), (Some(*seq), Some(*done)));
            }
            let mut kinds = Vec::new();
            for d in dequeues {
                tickets.dequeues.push(d);
                kinds.extend(tickets.check().into_iter().map(|(kind, _)| kind));
            }
            kinds
        };
        let stock = [("t1", 1, 10), ("t2", 2, 20), ("t3", 3, 30)];
        let good = vec![
            dequeue(40, 50, Some(Some((1, "t1")))),
            dequeue(60, 70, Some(Some((2, "t2")))),
            dequeue(65, 80, None),
            dequeue(90, 95, Some(None)),
        ];
        assert!(run(&stock, good).is_empty(), "an unknown dequeue may have taken t3");
        let twice =
            vec![dequeue(40, 50, Some(Some((1, "t1")))), dequeue(60, 70, Some(Some((1, "t1"))))];
        assert_eq!(run(&stock, twice), ["queue-dequeued-twice"]);
        assert_eq!(run(&stock, vec![dequeue(40, 50, Some(Some((2, "t1"))))]), ["queue-phantom"]);
        assert_eq!(run(&stock, vec![dequeue(40, 50, Some(Some((9, "t9"))))]), ["queue-phantom"]);
        let reordered =
            vec![dequeue(40, 50, Some(Some((2, "t2")))), dequeue(60, 70, Some(Some((1, "t1"))))];
        assert_eq!(run(&stock, reordered), ["queue-order"]);
        let lost = vec![dequeue(40, 50, Some(Some((1, "t1")))), dequeue(60, 70, Some(None))];
        assert_eq!(run(&stock, lost), ["queue-lost"]);
    }
}
