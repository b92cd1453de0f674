//! The one error type of leasehold's lease rules.
//!
//! Every refusal the lessor can make is a named variant here. The gRPC layer
//! turns them into `tonic::Status` in exactly one place
//! (`leasehold_wire::status`), and the client turns statuses back into this
//! type through the reverse of that table.

use std::fmt;

use crate::clock::Millis;
use crate::lease::{Fence, Invalid, Key, Owner};

/// Why a presented fence is not the key's live term.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StaleReason {
    /// The term's TTL ran out at this time.
    Expired { at: Millis },
    /// The holder released the term at this time.
    Released { at: Millis },
    /// The holder released the term as unfinished at this time.
    Suspended { at: Millis },
    /// A later term (with this fence) has been granted since.
    Superseded { by: Fence },
    /// This key never had a term with this fence.
    Unknown,
}

impl StaleReason {
    /// A stable one-word name, used in status metadata.
    pub fn name(&self) -> &'static str {
        match self {
            StaleReason::Expired { .. } => "expired",
            StaleReason::Released { .. } => "released",
            StaleReason::Suspended { .. } => "suspended",
            StaleReason::Superseded { .. } => "superseded",
            StaleReason::Unknown => "unknown",
        }
    }
}

impl fmt::Display for StaleReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StaleReason::Expired { at } => write!(f, "it expired at {at} ms"),
            StaleReason::Released { at } => write!(f, "it was released at {at} ms"),
            StaleReason::Suspended { at } => write!(f, "it was suspended at {at} ms"),
            StaleReason::Superseded { by } => write!(f, "it was superseded by fence {by}"),
            StaleReason::Unknown => write!(f, "the key never had a term with this fence"),
        }
    }
}

/// Why a free key cannot be taken now (see [`Error::Reserved`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Held {
    /// In lock-delay after term `after` expired.
    LockDelay { after: Fence },
    /// Reserved for `successor`, named by the term that released it.
    Handoff { successor: Owner },
}

impl Held {
    /// A stable one-word name, used in status metadata.
    pub fn name(&self) -> &'static str {
        match self {
            Held::LockDelay { .. } => "lock_delay",
            Held::Handoff { .. } => "handoff",
        }
    }
}

impl fmt::Display for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Held::LockDelay { after } => write!(f, "in lock-delay after fence {after} expired"),
            Held::Handoff { successor } => write!(f, "reserved for successor {successor:?}"),
        }
    }
}

/// A refusal or failure of a lease operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The request itself is malformed; retrying it unchanged cannot succeed.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// The key is held by another term.
    #[error(
        "key {key:?} is held by owner {holder:?} (fence {fence}) for another {remaining_ms} ms"
    )]
    Busy {
        key: Key,
        holder: Owner,
        fence: Fence,
        remaining_ms: u64,
    },

    /// The key is free but reserved: for a lock-delay after an expiry, or
    /// for the successor its last holder named.
    #[error("key {key:?} is {reservation} for another {remaining_ms} ms")]
    Reserved {
        key: Key,
        reservation: Held,
        remaining_ms: u64,
    },
    /// Too many terms of the key in a row ended without a clean release;
    /// nobody may acquire it until an admin lifts the quarantine.
    #[error(
        "key {key:?} is quarantined: its last {failures} terms ended without a clean release \
         ({recent}); see History, and Unquarantine it (admin) once it is safe to resume"
    )]
    Quarantined {
        key: Key,
        failures: u32,
        /// The failed terms, oldest first, as `fence end` pairs (for people).
        recent: String,
    },
    /// The presented fence is not the key's live term.
    #[error("fence {fence} is not the live term of key {key:?}: {reason}")]
    StaleFence {
        key: Key,
        fence: Fence,
        reason: StaleReason,
    },

    /// The fence is live but the lease_id (the capability) does not match it.
    #[error("lease_id does not match the live term of key {key:?} (fence {fence})")]
    PermissionDenied { key: Key, fence: Fence },

    /// The key has never been acquired (or was forgotten).
    #[error("key {0:?} not found")]
    NotFound(Key),

    /// The key's tool-call ledger has no call with this id.
    #[error("key {key:?} has no tool call {call_id:?}")]
    ToolCallNotFound { key: Key, call_id: String },

    /// The request carries no credential, or one the server does not know.
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),

    /// The caller is known but its scopes do not grant `right` on `key`.
    #[error("principal {principal:?} has no {right} right on key {key:?}")]
    NotAllowed {
        principal: String,
        right: String,
        key: String,
    },

    /// A limit against abuse was reached; other clients are still served.
    #[error("limit {limit} reached: {detail}")]
    ResourceExhausted { limit: String, detail: String },

    /// The server cannot serve the request now (shutting down, storage failed).
    #[error("unavailable: {0}")]
    Unavailable(String),

    /// A watch asked to start from a revision the event log no longer
    /// holds: the watcher must re-list, then watch from the current one.
    #[error(
        "revision {requested} is compacted; the oldest the log holds is {oldest}: \
         list the keys again, then watch from the revision the list was read at"
    )]
    Compacted { requested: u64, oldest: u64 },
    /// This server (its storage backend) does not offer the feature asked
    /// for; the request changed nothing.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// Storage failed in a way the client did not cause.
    #[error("storage error: {0}")]
    Storage(String),
}

/// Result alias for lease operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<Invalid> for Error {
    fn from(invalid: Invalid) -> Error {
        Error::InvalidArgument(invalid.0)
    }
}
