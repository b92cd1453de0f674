//! leasehold: a session-ownership lock service with fencing tokens.
//!
//! AI agent servers keep each conversation as a durable session; when two
//! processes drive one session at once, its transcript is corrupted. leasehold
//! hands out per-key leases, each with a fencing token that strictly increases
//! with every grant and survives crashes, so exactly one process owns a
//! session and storage can refuse a stale one.
//!
//! # Layout
//! - [`lease`]: the values (fence, lease id, term) and input rules.
//! - [`lessor`]: the lease rules in memory, with no I/O.
//! - [`ledger`]: the per-key tool-call ledger, with no I/O.
//! - [`clock`]: the injected clock.
//! - [`store`]: durable storage behind a trait; [`store::sqlite`] implements it.
//! - [`engine`]: shared state, the group-commit writer, expiry and waiters.
//! - [`grpc`]: the tonic service and the one error-to-status table.
//! - [`server`]: running it all on a listener.
//! - [`client`]: the Rust client and its fenced [`client::SessionGuard`].
//! - [`fence`]: storage-side fencing for applications' own databases.
//! - [`bench`]: the load generator behind `leasehold bench`.
//! - [`transcript`]: diagnose and repair tool-call pairing in transcripts
//!   (no dependency on the server).
//! - [`pb`]: generated protobuf code.

pub mod bench;
pub mod client;
pub mod clock;
pub mod engine;
pub mod error;
pub mod fence;
pub mod grpc;
pub mod lease;
pub mod ledger;
pub mod lessor;
pub mod pb;
pub mod server;
pub mod store;
pub mod transcript;

pub use clock::{Clock, ManualClock, SystemClock};
pub use engine::{Engine, EngineConfig};
pub use error::{Error, StaleReason};
pub use lease::{Fence, LeaseId};
