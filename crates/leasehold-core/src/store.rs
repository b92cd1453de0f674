//! Durable storage of the lease table, behind a small trait.
//!
//! The lessor keeps the live state in memory; storage is the source of truth
//! at start-up and the place every acknowledged write lands before its reply.
//! The trait speaks only in these records, so SQLite stays an implementation
//! detail of the server crate (its `sqlite::SqliteStore` is the first
//! implementation). The records are what the lessor's change tracking hands
//! the writer: the full current state of every key changed since the last
//! batch.

use crate::events::Event;
use crate::lease::{EndedTerm, Fence, HistoryEntry, Key, Reservation, Term};
use crate::ledger::{CallRef, ToolCall};

/// A key's durable state: what storage keeps, and what start-up restores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRecord {
    pub key: Key,
    pub live: Option<Term>,
    pub last_ended: Option<EndedTerm>,
    /// Who alone may take the free key, until when.
    pub reservation: Option<Reservation>,
    /// Terms in a row that ended by expiry or suspension.
    pub failures: u32,
    pub quarantined: bool,
    /// In a batch: ended terms storage has not seen yet, to add (oldest
    /// first). At load: the key's whole history.
    pub history: Vec<HistoryEntry>,
    /// In a batch: the fences of the key's history entries that fell out of
    /// the history since the last batch, for storage to delete. A fence is
    /// never given twice, so it names one entry across all keys, and storage
    /// can key its history by fence alone (rows of one commit then share a
    /// page, instead of one page per key). Empty at load.
    pub history_dropped: Vec<Fence>,
}

impl KeyRecord {
    /// A record of a key with only a live term and a last ended term.
    pub fn new(key: Key, live: Option<Term>, last_ended: Option<EndedTerm>) -> KeyRecord {
        KeyRecord {
            key,
            live,
            last_ended,
            reservation: None,
            failures: 0,
            quarantined: false,
            history: Vec::new(),
            history_dropped: Vec::new(),
        }
    }
}

/// A set of changes to commit in one transaction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    /// The full current state of every key changed since the last batch.
    pub records: Vec<KeyRecord>,
    /// Keys forgotten (released cleanly long enough ago): their rows go.
    /// Applied before `records`, which may hold a key created again since.
    pub forgotten: Vec<Key>,
    /// The fences of the forgotten keys' history entries, for storage to
    /// delete (see [`KeyRecord::history_dropped`]).
    pub forgotten_history: Vec<Fence>,
    /// Tool calls pruned from ledgers. Applied before `calls`.
    pub pruned_calls: Vec<(Key, Vec<CallRef>)>,
    /// The current state of every tool call changed since the last batch.
    pub calls: Vec<(Key, ToolCall)>,
    /// The highest fence ever granted. Storage must keep it durable by the
    /// time it deletes a row (`forgotten`): until then every fence granted
    /// is in its key's row, and start-up takes the highest of both.
    pub fence_high_water: u64,
    /// Once this batch commits, every change up to this sequence is durable.
    pub seq: u64,
    /// The events of this batch's changes, revisions rising, continuing the
    /// last batch's. Storage keeps a bounded tail of them for Watch.
    pub events: Vec<Event>,
}

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
    pub calls: Vec<(Key, ToolCall)>,
    /// A fence at least as high as any granted whose key's row is gone.
    /// Start-up takes the highest of this and every fence in `records`, so
    /// a store must keep it current only when it deletes rows.
    pub fence_high_water: u64,
    /// The stored tail of the event log, revisions rising (the last one is
    /// the highest revision ever given).
    pub events: Vec<Event>,
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
