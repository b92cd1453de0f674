//! leasehold's SQLite backend: one server process, its lease state in
//! memory and durable in a SQLite file.
//!
//! - [`engine`]: the lessor shared by all requests, the writer thread
//!   (group commit) and the expiry timer; the [`Backend`](leasehold_backend::Backend)
//!   the services call ([`Engine`]).
//! - [`sqlite`]: the core's `Store` trait on SQLite (the schema, the codec
//!   of each row, the commit of a batch).
//! - [`event_codec`]: the stored form of Watch events.
//!
//! It depends on the core and the seam (`leasehold-backend`) only, never on
//! the server or on the PostgreSQL backend.

pub mod engine;
pub mod event_codec;
pub mod sqlite;

pub use engine::{Engine, EngineConfig};
