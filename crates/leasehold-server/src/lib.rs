//! The leasehold server: per-key leases with fencing tokens, served over gRPC
//! from a durable store.
//!
//! - [`engine`]: the lessor shared by all requests, the writer thread (group
//!   commit) and the expiry timer; the SQLite-backed [`Backend`].
//! - [`backend`]: the seam the gRPC services talk through ([`Backend`]).
//! - [`sqlite`]: the SQLite implementation of the core's `Store` trait.
//! - [`postgres`]: the PostgreSQL [`Backend`], for several stateless servers
//!   on one database.
//! - [`grpc`]: the tonic services (leases, the Session stream, transcripts).
//! - [`server`]: running it all on a listener, with health and reflection.
//! - [`console`]: the web console (`serve --console-listen`).
//! - [`coalesce`]: one `writev` for the replies of many requests.
//! - [`request_log`]: the request id on every log line of a request.
//!
//! The rules themselves live in `leasehold-core`; the wire format in
//! `leasehold-wire`.

pub mod auth;
pub use leasehold_backend as backend;
pub mod coalesce;
pub mod console;
pub mod engine;
pub mod event_codec;
pub mod grpc;
pub mod limits;
pub mod metrics;
pub mod postgres;
pub mod request_log;
pub mod server;
pub mod sqlite;
pub mod tls;

pub use backend::Backend;
pub use engine::{Engine, EngineConfig};
