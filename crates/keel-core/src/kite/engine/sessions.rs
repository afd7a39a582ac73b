//! Sessions: admission, the queue of a session's requests, and `advance`, which runs a
//! session one operation at a time (the operation in progress, then the queued ones).
//!
//! ```text
//!   admit ──► queue ──► begin_next ──► start ──► done: replied
//!                                        │
//!                                        ▼
//!                        park (active, its timer indexed)
//!                                        │ touched: a reply to its round, a tick,
//!                                        ▼ the key it queued for freed
//!                        take_active ──► progress ──► done: replied, next request
//!                                        └──► still going: parked again
//! ```
//!
//! A session's operation is only ever moved out (`take_active`) and back (`park`) here,
//! which keeps the index of waiting operations' timers (`waits`) in step with the phases.

use super::{Active, KiteEngine, KiteOp, KiteRequest, KiteResult, Phase, RmwId, RmwStage};
use crate::engine::RequestTag;
use crate::kite::types::{KiteReply, ReplyForm};
use keel_types::{KeelError, Key};

impl KiteEngine {
    /// Queues a client's request in its session (or answers it at once with a refusal);
    /// answers the session.
    pub(super) fn admit(&mut self, request: KiteRequest) -> u64 {
        let session = request.session;
        if let Err(err) = self.check_request(&request.op) {
            self.reply(&request, Err(err));
            return session;
        }
        if !self.sessions.contains_key(&session) && self.sessions.len() >= self.config.sessions_max
        {
            let err = KeelError::Busy(format!("{} sessions open", self.sessions.len()));
            self.reply(&request, Err(err));
            return session;
        }
        let queue_max = self.config.session_queue_max;
        let s = self.sessions.entry(session).or_default();
        if s.queue.len() >= queue_max {
            let err = KeelError::Busy(format!("{} requests waiting in the session", s.queue.len()));
            self.reply(&request, Err(err));
            return session;
        }
        s.queue.push_back(request);
        assert!(s.queue.len() <= queue_max, "a session queue past its bound");
        assert!(self.sessions.len() <= self.config.sessions_max, "sessions past their bound");
        session
    }

    /// A request's key and values within the limits.
    fn check_request(&self, op: &KiteOp) -> Result<(), KeelError> {
        if !self.votes() {
            let node = self.config.node.0;
            return Err(KeelError::Unavailable(format!(
                "node {node} is not a voter of the keyspace"
            )));
        }
        if let Some(&peer) = self.voters_disagree.first() {
            let (node, voters) = (self.config.node.0, &self.membership.voters);
            let voters: Vec<u32> = voters.iter().map(|v| v.0).collect();
            return Err(KeelError::Unavailable(format!(
                "node {} is configured with other voters than node {node}'s {voters:?}, and the \
                 keyspace's membership was never changed, so each would count other quorums: \
                 give every node the same `voters` and `members`",
                peer.0
            )));
        }
        let reconfigure = matches!(op, KiteOp::Reconfigure { .. });
        if op.key().starts_with(keel_types::RESERVED_KEY_PREFIX) != reconfigure {
            return Err(KeelError::InvalidArgument("a key in the reserved range".into()));
        }
        let limits = &self.config.limits;
        limits.check_key(op.key())?;
        match op {
            KiteOp::Write { value, .. } | KiteOp::Release { value, .. } => {
                limits.check_value(value)
            }
            KiteOp::Cas { expected, new, .. } => {
                if let Some(e) = expected {
                    limits.check_value(e)?;
                }
                limits.check_value(new)
            }
            _ => Ok(()),
        }
    }

    /// Answers `request`.
    fn reply(&mut self, request: &KiteRequest, result: Result<KiteResult, KeelError>) {
        self.answer(request.session, request.tag, request.form.clone(), result);
    }

    /// Answers the request `tag` of `session`.
    fn answer(
        &mut self,
        session: u64,
        tag: RequestTag,
        form: ReplyForm,
        result: Result<KiteResult, KeelError>,
    ) {
        let served_by = self.config.node;
        let result = match (&form, result) {
            // A membership step that read the key absent read epoch 0: the configured one.
            (
                ReplyForm::Membership(_),
                Ok(KiteResult::Rmw { read: None, read_stamp, wrote, local }),
            ) => {
                let read = Some(self.config.initial_membership().encode());
                Ok(KiteResult::Rmw { read, read_stamp, wrote, local })
            }
            (_, result) => result,
        };
        self.out.replies.push(KiteReply { tag, session, served_by, form, result });
    }

    /// Runs a session as far as it goes: the operation in progress, then queued ones.
    /// A rejoining node starts nothing (its requests wait in their sessions).
    pub(super) fn advance(&mut self, session: u64) {
        if self.rejoin.is_some() {
            return;
        }
        loop {
            let Some(s) = self.sessions.get(&session) else { return };
            let more =
                if s.active.is_some() { self.resume(session) } else { self.begin_next(session) };
            if !more {
                return;
            }
        }
    }

    /// Moves the session's operation on; `true` when it finished (the next may start).
    fn resume(&mut self, session: u64) -> bool {
        let Active { tag, form, phase } = self.take_active(session).expect("an operation runs");
        let rmw_key = phase.rmw_key().cloned();
        let outcome = self.progress(session, phase);
        if let (Some(key), Ok(_) | Err(Phase::Refused(_))) = (&rmw_key, &outcome) {
            self.rmw_key_free(key, session);
        }
        match outcome {
            Ok(result) => self.answer(session, tag, form, Ok(result)),
            Err(Phase::Refused(error)) => self.answer(session, tag, form, Err(error)),
            Err(phase) => {
                self.park(session, Active { tag, form, phase });
                return false;
            }
        }
        true
    }

    /// Starts the session's next request; `false` when none is queued (a session left
    /// idle is forgotten).
    fn begin_next(&mut self, session: u64) -> bool {
        let s = self.sessions.get_mut(&session).expect("an open session");
        assert!(s.active.is_none(), "session {session} starts a request while one runs");
        let Some(request) = s.queue.pop_front() else {
            if s.idle() {
                self.sessions.remove(&session);
            }
            return false;
        };
        let rid = self.request_id(session, request.named);
        let started = self.start(session, rid, request.op.clone());
        if request.op.is_rmw() && matches!(started, Ok(_) | Err(Phase::Refused(_))) {
            self.rmw_key_free(request.op.key(), session);
        }
        match started {
            Ok(result) => self.reply(&request, Ok(result)),
            Err(Phase::Refused(error)) => self.reply(&request, Err(error)),
            Err(phase) => {
                self.park(session, Active { tag: request.tag, form: request.form, phase })
            }
        }
        true
    }

    /// The id a request's read-modify-write goes by: numbered node-wide, so a session
    /// forgotten and begun again never reuses one; or by the client, which names it for
    /// every node.
    fn request_id(&mut self, session: u64, named: Option<u64>) -> RmwId {
        match named {
            Some(seq) => RmwId { node: RmwId::CLIENT, session, seq },
            None => {
                self.next_seq += 1;
                RmwId { node: self.writer, session, seq: self.next_seq }
            }
        }
    }

    /// Keeps an operation in its session until it can move on, its timer indexed.
    fn park(&mut self, session: u64, active: Active) {
        assert!(!matches!(active.phase, Phase::Refused(_)), "a refused operation kept");
        let wake = active.phase.wake();
        let s = self.sessions.get_mut(&session).expect("an operation's session is open");
        assert!(s.active.is_none(), "session {session} runs two operations");
        s.active = Some(active);
        if let Some(at) = wake {
            let new = self.waits.insert((at, session));
            assert!(new, "session {session} waits twice");
        }
    }

    /// Takes a session's operation out to move it on, and its timer out of the index.
    fn take_active(&mut self, session: u64) -> Option<Active> {
        let active = self.sessions.get_mut(&session)?.active.take()?;
        if let Some(at) = active.phase.wake() {
            let indexed = self.waits.remove(&(at, session));
            assert!(indexed, "session {session}'s timer was not indexed");
        }
        Some(active)
    }

    /// `session`'s read-modify-write on `key` is over: the next session of this node
    /// waiting to run one on the key starts it.
    pub(super) fn rmw_key_free(&mut self, key: &Key, session: u64) {
        if self.rmw_keys.get(key) != Some(&session) {
            return;
        }
        self.rmw_keys.remove(key);
        let waiting = self.sessions.iter().find_map(|(&s, state)| match &state.active {
            Some(Active { phase: Phase::Rmw(rmw, RmwStage::Queued), .. })
                if rmw.op.key() == key =>
            {
                Some(s)
            }
            _ => None,
        });
        if let Some(next) = waiting {
            assert_ne!(next, session, "a session waits for its own key");
            self.advance(next);
        }
    }
}
