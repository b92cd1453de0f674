//! leasehold's domain core: the values, rules and errors of per-key leases
//! with fencing tokens, with no network, no SQL and no I/O.
//!
//! - [`lease`]: the values (fence, lease id, term) and the input rules.
//! - [`error`]: the one error type of the lease rules.
//! - [`clock`]: the injected clock.
//! - [`ledger`]: the per-key tool-call ledger's rules.
//! - [`lessor`]: the lease table in memory: grants, renewals, releases,
//!   expiry, FIFO waiters, fence allocation, change tracking.
//! - [`store`]: the storage trait and the records it speaks in.
//! - [`stored`](mod@stored): the integer every enumerated value is stored as, for every backend.
//!
//! The server crate runs these rules behind gRPC over a durable store; the
//! client crate and the wire crate share the values and the error type.

pub mod clock;
pub mod error;
pub mod events;
pub mod lease;
pub mod ledger;
pub mod lessor;
pub mod store;
pub mod stored;

pub use clock::{Clock, ManualClock, Millis, SystemClock};
pub use error::{Error, Result, StaleReason};
pub use lease::{
    Ended, EndedTerm, Fence, Key, KeyState, Lease, LeaseId, Owner, RequestId, Term, TermEnd, Ttl,
    Wait,
};
