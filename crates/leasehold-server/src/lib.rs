//! The leasehold server: per-key leases with fencing tokens, served over gRPC
//! from a durable store.
//!
//! - [`backend`]: the seam the gRPC services talk through ([`Backend`]), the
//!   crate `leasehold-backend`.
//! - [`engine`], [`sqlite`], [`event_codec`]: the SQLite backend (the lessor
//!   in memory, group commit, the expiry timer; the store), the crate
//!   `leasehold-sqlite`.
//! - [`postgres`]: the PostgreSQL [`Backend`], for several stateless servers
//!   on one database, the crate `leasehold-postgres`.
//! - [`grpc`]: the tonic services (leases, the Session stream, transcripts).
//! - [`server`]: running it all on a listener, with health and reflection.
//! - [`console`]: the web console (`serve --console-listen`).
//! - [`coalesce`]: one `writev` for the replies of many requests.
//! - [`request_log`]: the request id on every log line of a request.
//!
//! The rules themselves live in `leasehold-core`; the wire format in
//! `leasehold-wire`.

pub mod auth;
pub mod coalesce;
pub mod console;
pub mod grpc;
pub mod limits;
pub mod metrics;
pub mod request_log;
pub mod server;
pub mod tls;

pub use leasehold_backend as backend;
pub use leasehold_postgres as postgres;
pub use leasehold_sqlite::{engine, event_codec, sqlite};

pub use backend::Backend;
pub use engine::{Engine, EngineConfig};
