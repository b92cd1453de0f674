//! The client's one error type.
//!
//! Whatever the server says comes back as the domain [`Error`], through the
//! reverse status table in [`leasehold_wire::status::from_status`]; this module
//! adds only what a client alone can know: that its guard has lost the lease.

use std::fmt;
use std::time::Duration;

use leasehold_core::Error;
use leasehold_core::lease::{Fence, Key};
use leasehold_transcript::Report;

/// "3 findings; first: missing call_1 at message 4 (...)".
fn summary(report: &Report) -> String {
    match report.findings.first() {
        Some(first) => format!(
            "{} finding(s); first: {} for call {} at message {}: {}",
            report.findings.len(),
            first.kind,
            first.call_id,
            first.index,
            first.provider_error
        ),
        None => "no findings".into(),
    }
}

/// A failure of a client call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// What the server answered: [`Error::Busy`] (with the holder),
    /// [`Error::StaleFence`], [`Error::PermissionDenied`],
    /// [`Error::InvalidArgument`] and so on. A server that cannot be reached,
    /// or does not answer in time, is [`Error::Unavailable`].
    #[error(transparent)]
    Server(#[from] Error),

    /// The transcript about to be sent would be rejected by the model
    /// provider (see [`leasehold_transcript`]); repair it or leave it for a person.
    #[error("the transcript is not safe to send: {}", summary(.0))]
    UnhealthyTranscript(Box<Report>),

    /// The transcript could not be checked (mixed formats, a message that is
    /// not an object).
    #[error("the transcript cannot be checked: {0}")]
    UncheckableTranscript(String),

    /// The guard no longer holds its term, or can no longer be sure it does.
    #[error("the lease on key {key:?} (fence {fence}) is lost: {reason}")]
    Lost {
        key: Key,
        fence: Fence,
        reason: LossReason,
    },
}

impl ClientError {
    /// Whether the same call may succeed if retried later: the server was
    /// unreachable or failed, or the guard's local deadline passed while a
    /// renewal may still succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            ClientError::Server(err) => matches!(err, Error::Unavailable(_) | Error::Storage(_)),
            ClientError::Lost { reason, .. } => !reason.is_final(),
            ClientError::UnhealthyTranscript(_) | ClientError::UncheckableTranscript(_) => false,
        }
    }

    /// The holder named by a busy refusal, if this is one.
    pub fn busy_holder(&self) -> Option<&str> {
        match self {
            ClientError::Server(Error::Busy { holder, .. }) => Some(holder.as_str()),
            _ => None,
        }
    }

    /// A call that got no reply within `timeout`.
    pub(crate) fn timed_out(call: &str, timeout: Duration) -> Self {
        ClientError::Server(Error::Unavailable(format!(
            "{call} got no reply within {} ms",
            timeout.as_millis()
        )))
    }
}

/// Input the client checks before sending, refused as the server would
/// refuse it (`Error::InvalidArgument`).
impl From<leasehold_core::lease::Invalid> for ClientError {
    fn from(invalid: leasehold_core::lease::Invalid) -> Self {
        ClientError::Server(invalid.into())
    }
}

/// The one place a gRPC status becomes a client error.
impl From<tonic::Status> for ClientError {
    fn from(status: tonic::Status) -> Self {
        ClientError::Server(leasehold_wire::status::from_status(&status))
    }
}

/// Why a guard is not valid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LossReason {
    /// No renewal succeeded before the local deadline (the send time of the
    /// last successful renewal plus the TTL, less the safety margin). The
    /// server may have expired the term, so the guard must not act; if a
    /// later renewal succeeds with the same fence, nobody else held the key in
    /// between and the guard is valid again.
    DeadlinePassed,
    /// The server refused the term (`FAILED_PRECONDITION`: it expired on the
    /// server's clock, was released, or a newer term superseded it). Final.
    Refused(Error),
    /// The guard was released, suspended or dropped. Final.
    Released,
}

impl LossReason {
    /// Whether the guard can never become valid again.
    pub fn is_final(&self) -> bool {
        !matches!(self, LossReason::DeadlinePassed)
    }
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LossReason::DeadlinePassed => write!(
                f,
                "no renewal succeeded before the local deadline, so the server may have expired it"
            ),
            LossReason::Refused(err) => write!(f, "the server refused it: {err}"),
            LossReason::Released => write!(f, "the guard was released"),
        }
    }
}

/// Whether `err`, answering a Renew, Check or Release of a term, means that
/// term is over for good (retrying cannot help).
pub(crate) fn ends_the_term(err: &Error) -> bool {
    matches!(
        err,
        Error::StaleFence { .. }
            | Error::PermissionDenied { .. }
            | Error::InvalidArgument(_)
            | Error::NotFound(_)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_core::StaleReason;
    use leasehold_wire::status::to_status;

    /// A busy status becomes a busy client error that still names the holder.
    #[test]
    fn a_busy_status_keeps_the_holder() {
        let err = ClientError::from(to_status(Error::Busy {
            key: Key::parse("session:1").unwrap(),
            holder: leasehold_core::Owner::parse("graph-a").unwrap(),
            fence: Fence(4),
            remaining_ms: 900,
        }));
        assert_eq!(err.busy_holder(), Some("graph-a"));
        assert!(!err.is_transient());
    }

    /// Transport trouble is transient; a stale fence is not.
    #[test]
    fn transport_trouble_is_transient_and_stale_is_final() {
        let unreachable = ClientError::from(tonic::Status::unavailable("connection refused"));
        assert!(unreachable.is_transient());
        let stale = Error::StaleFence {
            key: Key::parse("k").unwrap(),
            fence: Fence(2),
            reason: StaleReason::Superseded { by: Fence(3) },
        };
        assert!(ends_the_term(&stale));
        assert!(!ends_the_term(&Error::Unavailable("down".into())));
        let lost = ClientError::Lost {
            key: Key::parse("k").unwrap(),
            fence: Fence(2),
            reason: LossReason::Refused(stale),
        };
        assert!(!lost.is_transient());
        assert!(lost.to_string().contains("superseded by fence 3"), "{lost}");
    }
}
