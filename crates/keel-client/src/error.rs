//! The client's one error type; [`ClientError::is_retryable`] tells whether trying again
//! can help.

use crate::conn::ConnError;
use keel_types::KeelError;

/// Why an operation failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// The server answered with an error.
    #[error("{0}")]
    Keel(KeelError),
    /// The connection failed or timed out; a write's outcome is unknown.
    #[error("connection: {0}")]
    Connection(ConnError),
    /// The server's reply did not have the expected shape.
    #[error("unexpected reply: {0}")]
    Unexpected(String),
    /// Every attempt failed; the last failure is kept.
    #[error("gave up after {attempts} attempts: {last}")]
    Exhausted {
        /// Attempts made.
        attempts: u32,
        /// The last failure.
        last: Box<ClientError>,
    },
}

impl ClientError {
    /// Whether the same operation may succeed if retried.
    pub fn is_retryable(&self) -> bool {
        match self {
            ClientError::Keel(e) => e.is_retryable(),
            ClientError::Connection(_) => true,
            ClientError::Unexpected(_) => false,
            ClientError::Exhausted { last, .. } => last.is_retryable(),
        }
    }

    /// Whether a retry should go to another node (the connection failed, or this node
    /// may not serve the request now: a `TIMEOUT` is also what a node whose engine loop
    /// stopped answers what it had taken).
    pub fn moves_on(&self) -> bool {
        matches!(
            self,
            ClientError::Connection(_)
                | ClientError::Keel(
                    KeelError::NotLeader { .. }
                        | KeelError::NotActive
                        | KeelError::Unavailable(_)
                        | KeelError::Timeout
                )
        )
    }

    /// The error a call ends with when this one ends its last attempt: a refusal
    /// speaks for its own attempt only, so after an earlier attempt that may have been
    /// applied (`maybe_applied`) the call's outcome stays unknown.
    pub fn after_attempts(self, maybe_applied: bool, attempts: u32) -> ClientError {
        if maybe_applied && !self.outcome_unknown() {
            ClientError::Exhausted { attempts, last: Box::new(self) }
        } else {
            self
        }
    }

    /// Whether a write that failed this way may still have taken effect.
    pub fn outcome_unknown(&self) -> bool {
        match self {
            ClientError::Connection(ConnError::Connect { .. }) => false,
            ClientError::Connection(_)
            | ClientError::Keel(KeelError::Timeout | KeelError::SessionExpired) => true,
            ClientError::Keel(_) | ClientError::Unexpected(_) => false,
            ClientError::Exhausted { .. } => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_and_unknown_are_told_apart() {
        assert!(ClientError::Keel(KeelError::Busy("q".into())).is_retryable());
        assert!(!ClientError::Keel(KeelError::NotAnInteger).is_retryable());
        assert!(ClientError::Connection(ConnError::Timeout).outcome_unknown());
        assert!(!ClientError::Keel(KeelError::Busy("q".into())).outcome_unknown());
        assert!(ClientError::Keel(KeelError::NotActive).moves_on());
        assert!(ClientError::Keel(KeelError::Timeout).moves_on());
        assert!(!ClientError::Keel(KeelError::Busy("q".into())).moves_on());
    }

    #[test]
    fn a_refusal_after_an_attempt_that_may_have_been_applied_leaves_the_outcome_unknown() {
        let refused = ClientError::Keel(KeelError::Busy("q".into()));
        assert!(!refused.clone().after_attempts(false, 2).outcome_unknown());
        let after = refused.after_attempts(true, 2);
        assert!(after.outcome_unknown());
        assert!(matches!(after, ClientError::Exhausted { attempts: 2, .. }));
    }
}
