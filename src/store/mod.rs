//! Durable storage of the lease table, behind a small trait.
//!
//! The lessor keeps the live state in memory; storage is the source of truth
//! at start-up and the place every acknowledged write lands before its reply.
//! The trait speaks only in lessor records, so SQLite stays an implementation
//! detail ([`sqlite::SqliteStore`] is the first implementation).

pub mod sqlite;

use crate::ledger::ToolCall;
use crate::lessor::{Batch, KeyRecord};

/// A storage failure. Storage errors are never the client's fault.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database could not be opened or read.
    #[error("cannot open database {path}: {reason}")]
    Open { path: String, reason: String },
    /// The database was written by a newer leasehold; refusing to touch it.
    #[error(
        "database {path} has schema version {found}, newer than this build's {supported}; \
         upgrade leasehold instead of downgrading the database"
    )]
    TooNew {
        path: String,
        found: i64,
        supported: i64,
    },
    /// A read or write failed.
    #[error("storage: {0}")]
    Io(String),
}

/// Everything storage holds, as read at start-up.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub records: Vec<KeyRecord>,
    /// Every tool call, with its key.
    pub calls: Vec<(String, ToolCall)>,
    /// A fence at least as high as any granted whose key's row is gone.
    /// Start-up takes the highest of this and every fence in `records`, so
    /// a store must keep it current only when it deletes rows.
    pub fence_high_water: u64,
}

/// Durable storage for the lease table.
pub trait Store: Send + 'static {
    /// Reads the whole table.
    ///
    /// # Errors
    /// [`StoreError::Io`] when the data cannot be read.
    fn load(&mut self) -> Result<Snapshot, StoreError>;

    /// Writes a batch atomically and durably (per the store's sync setting)
    /// before returning.
    ///
    /// # Errors
    /// [`StoreError::Io`] when the batch could not be committed; nothing of it
    /// is then visible.
    fn commit(&mut self, batch: &Batch) -> Result<(), StoreError>;

    /// How many transactions [`Store::commit`] has committed so far (for
    /// tests and metrics that prove group commit happens).
    fn commits(&self) -> u64;
}
