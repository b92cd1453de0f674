//! The SQLite implementation of [`Store`].
//!
//! # Schema and migrations
//! Migrations are the plain `.sql` files in `migrations/`, embedded at build
//! time and applied in order inside one exclusive transaction; the number
//! applied is tracked by `PRAGMA user_version`. **Never remove or reorder an
//! entry of [`MIGRATIONS`]**: only append. A database with a higher version
//! than this build knows is refused, never reset.
//!
//! # Locking
//! The connection runs in `locking_mode=EXCLUSIVE`: the first server to read
//! the file keeps it locked until it exits, so a second server on the same
//! file fails at start-up instead of handing out fences of its own. The lock
//! is an OS file lock, so `kill -9` releases it.
//!
//! # Durability
//! WAL with `synchronous=FULL` by default: a commit returns only after the
//! WAL is synced, so every acknowledged Acquire and Release survives power
//! loss. [`SyncMode::Normal`] trades that for speed (a power loss may drop
//! the last commits; an application crash still loses nothing).
//!
//! # Performance
//! One commit carries a whole batch from the group-commit writer; rows are
//! written with one cached statement per key.

use std::path::Path;

use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSql, ToSqlOutput, ValueRef};
use rusqlite::{Connection, OptionalExtension, Row, TransactionBehavior, params};

use leasehold_core::events::DEFAULT_EVENT_LOG_LEN;
use leasehold_core::lease::{
    EndedTerm, Fence, HistoryEntry, Key, LeaseId, Lifecycle, Owner, RequestId, Reservation, Term,
    TermEnd, Ttl,
};
use leasehold_core::ledger::{CallState, ToolCall};
use leasehold_core::store::{Batch, KeyRecord};
use leasehold_core::stored::{ReservationKind, Stored};

use crate::event_codec;
use leasehold_backend::{FenceFloor, MAX_FENCE_FLOOR};
use leasehold_core::store::{Snapshot, Store, StoreError};

/// The schema migrations, in order. Never remove or reorder an entry; only append.
pub const MIGRATIONS: &[&str] = &[
    include_str!("../../../migrations/0001_leases.sql"),
    include_str!("../../../migrations/0002_tool_calls.sql"),
    include_str!("../../../migrations/0003_lifecycle.sql"),
    include_str!("../../../migrations/0004_events.sql"),
    include_str!("../../../migrations/0005_tool_call_turns.sql"),
    include_str!("../../../migrations/0006_history_by_fence.sql"),
];

/// The WAL is copied into the database (a checkpoint, run by the commit
/// that crosses it, on the writer thread) once it holds this many pages.
/// SQLite's default, 1,000 pages (4 MiB), made the checkpoint during a
/// 100,000-lease mass expiry a commit of 50-400 ms that every urgent change
/// waited behind; a quarter of that keeps the longest Acquire under 50 ms
/// there (docs/benchmarks-history.md, session 9), for about 2 % more
/// `fsync`s a commit at one client (a checkpoint every ~35 commits instead
/// of ~140).
const WAL_AUTOCHECKPOINT_PAGES: i64 = 256;

/// How hard a commit waits for the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SyncMode {
    /// Sync the WAL on every commit: survives power loss (the default).
    #[default]
    Full,
    /// Sync only at checkpoints: survives process crashes, not power loss.
    Normal,
}

/// Lease storage in one SQLite file.
pub struct SqliteStore {
    /// The one connection; the engine's writer thread owns the store.
    conn: Connection,
    /// Transactions committed, for batching metrics.
    commits: u64,
    /// How many events the stored log keeps at least; older rows go.
    event_log_len: u64,
    /// The first revision of the oldest stored row (0: none yet).
    oldest_revision: u64,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.conn.path())
            .field("commits", &self.commits)
            .finish()
    }
}

impl SqliteStore {
    /// Opens (creating if missing) the database at `path` and migrates it.
    ///
    /// # Errors
    /// [`StoreError::Open`] when the file cannot be opened, is not a database
    /// or is locked by another server; [`StoreError::TooNew`] when a newer
    /// leasehold wrote it.
    pub fn open(path: &Path, sync: SyncMode) -> Result<Self, StoreError> {
        let shown = path.display().to_string();
        let open_err = |e: rusqlite::Error| StoreError::Open {
            path: shown.clone(),
            reason: explain(e),
        };
        let conn = Connection::open(path).map_err(open_err)?;
        // rusqlite waits 5 s on a locked file by default; the lock is ours
        // alone (exclusive mode), so a locked file means another server:
        // say so quickly.
        conn.busy_timeout(std::time::Duration::from_millis(200))
            .map_err(open_err)?;
        conn.pragma_update(None, "locking_mode", "EXCLUSIVE")
            .map_err(open_err)?;
        let mode: String = conn
            .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
            .map_err(open_err)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Open {
                path: shown,
                reason: format!("cannot switch to WAL journaling (got {mode})"),
            });
        }
        let sync = match sync {
            SyncMode::Full => "FULL",
            SyncMode::Normal => "NORMAL",
        };
        conn.pragma_update(None, "synchronous", sync)
            .map_err(open_err)?;
        conn.pragma_update(None, "wal_autocheckpoint", WAL_AUTOCHECKPOINT_PAGES)
            .map_err(open_err)?;
        let mut store = SqliteStore {
            conn,
            commits: 0,
            event_log_len: DEFAULT_EVENT_LOG_LEN as u64,
            oldest_revision: 0,
        };
        store.migrate(&shown)?;
        Ok(store)
    }

    /// Keeps at least the last `len` events for Watch (older ones are
    /// deleted as new ones come, a few thousand at a time).
    pub fn set_event_log_len(&mut self, len: usize) {
        self.event_log_len = len.max(1) as u64;
    }

    /// Applies the migrations this database has not seen yet, in one
    /// exclusive transaction. Running it again is a no-op.
    fn migrate(&mut self, shown: &str) -> Result<(), StoreError> {
        let open_err = |e: rusqlite::Error| StoreError::Open {
            path: shown.to_owned(),
            reason: explain(e),
        };
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Exclusive)
            .map_err(open_err)?;
        let version: i64 = tx
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .map_err(open_err)?;
        let supported = MIGRATIONS.len() as i64;
        if version > supported {
            return Err(StoreError::TooNew {
                path: shown.to_owned(),
                found: version,
                supported,
            });
        }
        for migration in &MIGRATIONS[version as usize..] {
            tx.execute_batch(migration).map_err(open_err)?;
        }
        tx.pragma_update(None, "user_version", supported)
            .map_err(open_err)?;
        tx.commit().map_err(open_err)
    }

    /// Raises the fence high-water mark to at least `floor`, durably (in a
    /// transaction of its own, before [`Store::load`] reads it), and never
    /// lowers it: `serve --fence-floor` (see [`FenceFloor`]).
    ///
    /// # Errors
    /// [`StoreError::Io`] when the floor is above [`MAX_FENCE_FLOOR`] or
    /// the database cannot be read or written.
    pub fn raise_fence_floor(&mut self, floor: u64) -> Result<FenceFloor, StoreError> {
        if floor > MAX_FENCE_FLOOR {
            return Err(StoreError::Io(format!(
                "fence floor {floor} is above the highest accepted, {MAX_FENCE_FLOOR}"
            )));
        }
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(io)?;
        // The store's highest fence: the mark, or a fence in a key's row
        // (start-up takes the highest of both; the mark alone may be low).
        let before: i64 = tx
            .query_row(
                "SELECT max(
                     coalesce((SELECT value FROM meta WHERE name = 'fence_high_water'), 0),
                     coalesce((SELECT max(max(coalesce(live_fence, 0), coalesce(ended_fence, 0)))
                               FROM keys), 0))",
                [],
                |row| row.get(0),
            )
            .map_err(io)?;
        // max(): a floor below the mark is a no-op, never a step down.
        tx.execute(
            "UPDATE meta SET value = max(value, ?1) WHERE name = 'fence_high_water'",
            [floor as i64],
        )
        .map_err(io)?;
        tx.commit().map_err(io)?;
        Ok(FenceFloor {
            floor,
            before: before as u64,
        })
    }

    /// The schema version recorded in the database.
    ///
    /// # Errors
    /// [`StoreError::Io`] when it cannot be read.
    pub fn schema_version(&self) -> Result<i64, StoreError> {
        self.conn
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .map_err(io)
    }
}

impl Store for SqliteStore {
    fn load(&mut self) -> Result<Snapshot, StoreError> {
        let fence_high_water: i64 = self
            .conn
            .query_row(
                "SELECT value FROM meta WHERE name = 'fence_high_water'",
                [],
                |row| row.get(0),
            )
            .optional()
            .map_err(io)?
            .unwrap_or(0);
        let mut stmt = self
            .conn
            .prepare(
                "SELECT key, live_fence, live_owner, live_lease_id, live_request_id, live_ttl_ms,
                        live_acquired_at_ms, live_expires_at_ms, ended_fence, ended_owner,
                        ended_lease_id, ended_end, ended_at_ms, live_lock_delay_ms,
                        live_max_recoveries, live_handed_off, reserved_kind, reserved_after_fence,
                        reserved_successor, reserved_until_ms, failures, quarantined
                 FROM keys ORDER BY key",
            )
            .map_err(io)?;
        let mut records = stmt
            .query_map([], read_record)
            .map_err(io)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(io)?;
        // In fence order (the table's own), so each key's entries arrive
        // oldest first; records are in key order, so each finds its record
        // by binary search instead of a sort of the whole history.
        let mut stmt = self
            .conn
            .prepare(
                "SELECT key, fence, owner, acquired_at_ms, ended_at_ms, end_kind,
                        unsettled_tool_calls, handed_off
                 FROM term_history ORDER BY fence",
            )
            .map_err(io)?;
        let mut rows = stmt.query([]).map_err(io)?;
        while let Some(row) = rows.next().map_err(io)? {
            let (key, entry) = read_history(row).map_err(io)?;
            // History of a key without a row: left over, never read.
            if let Ok(at) = records.binary_search_by(|r| r.key.cmp(&key)) {
                records[at].history.push(entry);
            }
        }
        let mut stmt = self
            .conn
            .prepare(
                "SELECT key, call_id, ordinal, name, input_digest, fence, state, settled_fence,
                        result_digest, result, begun_at_ms, settled_at_ms, turn
                 FROM tool_calls",
            )
            .map_err(io)?;
        let calls = stmt
            .query_map([], read_call)
            .map_err(io)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(io)?;
        let mut stmt = self
            .conn
            .prepare("SELECT first_revision, data FROM events ORDER BY first_revision")
            .map_err(io)?;
        let mut events = Vec::new();
        let mut rows = stmt.query([]).map_err(io)?;
        while let Some(row) = rows.next().map_err(io)? {
            let first: i64 = row.get(0).map_err(io)?;
            if self.oldest_revision == 0 {
                self.oldest_revision = first as u64;
            }
            let data: Vec<u8> = row.get(1).map_err(io)?;
            let decoded = event_codec::decode(&data)
                .map_err(|e| StoreError::Io(format!("stored events at revision {first}: {e}")))?;
            events.extend(decoded);
        }
        Ok(Snapshot {
            records,
            calls,
            fence_high_water: fence_high_water as u64,
            events,
        })
    }

    fn commit(&mut self, batch: &Batch) -> Result<(), StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(io)?;
        {
            // Before the puts: a forgotten key may have been created again since.
            let mut forget = tx
                .prepare_cached("DELETE FROM keys WHERE key = ?1")
                .map_err(io)?;
            for key in &batch.forgotten {
                forget.execute([Sql(key)]).map_err(io)?;
            }
            // History rows go by fence (see migration 0006): a forgotten
            // key's, and those that fell out of a key's history.
            let mut drop_history = tx
                .prepare_cached("DELETE FROM term_history WHERE fence = ?1")
                .map_err(io)?;
            for fence in &batch.forgotten_history {
                drop_history.execute([Sql(fence)]).map_err(io)?;
            }
            let mut put = tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO keys (key, live_fence, live_owner, live_lease_id,
                        live_request_id, live_ttl_ms, live_acquired_at_ms, live_expires_at_ms,
                        ended_fence, ended_owner, ended_lease_id, ended_end, ended_at_ms,
                        live_lock_delay_ms, live_max_recoveries, live_handed_off, reserved_kind,
                        reserved_after_fence, reserved_successor, reserved_until_ms, failures,
                        quarantined)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15,
                        ?16, ?17, ?18, ?19, ?20, ?21, ?22)",
                )
                .map_err(io)?;
            let mut put_history = tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO term_history (key, fence, owner, acquired_at_ms,
                        ended_at_ms, end_kind, unsettled_tool_calls, handed_off)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                )
                .map_err(io)?;
            for record in &batch.records {
                let live = record.live.as_ref();
                let ended = record.last_ended.as_ref();
                let lifecycle = live.map(|t| t.lifecycle);
                let reservation = record.reservation.as_ref();
                let (kind, after, successor) = match reservation {
                    None => (None, None, None),
                    Some(Reservation::LockDelay { after, .. }) => {
                        (Some(ReservationKind::LockDelay.code()), Some(after), None)
                    }
                    Some(Reservation::Handoff {
                        from, successor, ..
                    }) => (
                        Some(ReservationKind::Handoff.code()),
                        Some(from),
                        Some(Sql(successor)),
                    ),
                };
                put.execute(params![
                    Sql(&record.key),
                    live.map(|t| Sql(&t.fence)),
                    live.map(|t| Sql(&t.owner)),
                    live.map(|t| Sql(&t.lease_id)),
                    live.and_then(|t| t.request_id.as_ref().map(Sql)),
                    live.map(|t| Sql(&t.ttl)),
                    live.map(|t| t.acquired_at as i64),
                    live.map(|t| t.expires_at as i64),
                    ended.map(|e| Sql(&e.fence)),
                    ended.map(|e| Sql(&e.owner)),
                    ended.map(|e| Sql(&e.lease_id)),
                    ended.map(|e| Sql(&e.end)),
                    ended.map(|e| e.ended_at as i64),
                    lifecycle
                        .filter(|l| l.lock_delay_ms > 0)
                        .map(|l| l.lock_delay_ms as i64),
                    lifecycle.and_then(|l| l.max_recoveries.map(i64::from)),
                    lifecycle.filter(|l| l.handed_off).map(|_| true),
                    kind,
                    after.map(Sql),
                    successor,
                    reservation.map(|r| r.until() as i64),
                    i64::from(record.failures),
                    record.quarantined,
                ])
                .map_err(io)?;
                for fence in &record.history_dropped {
                    drop_history.execute([Sql(fence)]).map_err(io)?;
                }
                for h in &record.history {
                    put_history
                        .execute(params![
                            Sql(&record.key),
                            Sql(&h.fence),
                            Sql(&h.owner),
                            h.acquired_at as i64,
                            h.ended_at as i64,
                            Sql(&h.end),
                            i64::from(h.unsettled_tool_calls),
                            h.handed_off,
                        ])
                        .map_err(io)?;
                }
            }
            let mut prune = tx
                .prepare_cached(
                    "DELETE FROM tool_calls WHERE key = ?1 AND turn = ?2 AND call_id = ?3",
                )
                .map_err(io)?;
            for (key, calls) in &batch.pruned_calls {
                for call in calls {
                    prune
                        .execute(params![Sql(key), call.turn, call.call_id])
                        .map_err(io)?;
                }
            }
            let mut put_call = tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO tool_calls (key, call_id, ordinal, name, input_digest,
                        fence, state, settled_fence, result_digest, result, begun_at_ms,
                        settled_at_ms, turn)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
                )
                .map_err(io)?;
            for (key, call) in &batch.calls {
                put_call
                    .execute(params![
                        Sql(key),
                        call.call_id,
                        call.ordinal as i64,
                        call.name,
                        call.input_digest,
                        Sql(&call.fence),
                        Sql(&call.state),
                        call.settled_fence.as_ref().map(Sql),
                        call.result_digest,
                        call.result,
                        call.begun_at as i64,
                        call.settled_at.map(|t| t as i64),
                        call.turn,
                    ])
                    .map_err(io)?;
            }
            if let (Some(first), Some(last)) = (batch.events.first(), batch.events.last()) {
                tx.prepare_cached(
                    "INSERT INTO events (first_revision, last_revision, data) VALUES (?1, ?2, ?3)",
                )
                .map_err(io)?
                .execute(params![
                    first.revision as i64,
                    last.revision as i64,
                    event_codec::encode(&batch.events)
                ])
                .map_err(io)?;
                if self.oldest_revision == 0 {
                    self.oldest_revision = first.revision;
                }
                // Compact in steps of an eighth of the log, not every commit.
                let keep_from = last.revision.saturating_sub(self.event_log_len);
                if keep_from > self.oldest_revision + self.event_log_len / 8 {
                    tx.prepare_cached("DELETE FROM events WHERE last_revision < ?1")
                        .map_err(io)?
                        .execute([keep_from as i64])
                        .map_err(io)?;
                    self.oldest_revision = keep_from;
                }
            }
            // Every fence granted is in its key's row until the row is
            // deleted, and start-up takes the highest of the rows' fences and
            // this mark: so the mark must be raised only when rows go. Not
            // writing it otherwise spares a page in the WAL on every commit.
            if !batch.forgotten.is_empty() {
                tx.prepare_cached(
                    "UPDATE meta SET value = max(value, ?1) WHERE name = 'fence_high_water'",
                )
                .map_err(io)?
                .execute([batch.fence_high_water as i64])
                .map_err(io)?;
            }
        }
        tx.commit().map_err(io)?;
        self.commits += 1;
        Ok(())
    }

    fn commits(&self) -> u64 {
        self.commits
    }
}

/// A domain value in a SQLite column. Reading checks it as the gRPC edge
/// would: a stored key, owner, TTL or code this build does not know is an
/// error at load (the server refuses to start), never silently mapped to a
/// default.
struct Sql<T>(T);

impl ToSql for Sql<&Key> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::from(self.0.as_str()))
    }
}

impl FromSql for Sql<Key> {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
        Key::parse(String::column_result(value)?)
            .map(Sql)
            .map_err(|e| FromSqlError::Other(Box::new(e)))
    }
}

impl ToSql for Sql<&Owner> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::from(self.0.as_str()))
    }
}

impl FromSql for Sql<Owner> {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
        Owner::parse(String::column_result(value)?)
            .map(Sql)
            .map_err(|e| FromSqlError::Other(Box::new(e)))
    }
}

impl ToSql for Sql<&RequestId> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::from(self.0.as_str()))
    }
}

/// A stored request id: NULL (or empty) is none.
impl FromSql for Sql<Option<RequestId>> {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
        let text = Option::<String>::column_result(value)?.unwrap_or_default();
        RequestId::parse_optional(text)
            .map(Sql)
            .map_err(|e| FromSqlError::Other(Box::new(e)))
    }
}

impl ToSql for Sql<&Fence> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        let fence = i64::try_from(self.0.0)
            .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
        Ok(ToSqlOutput::from(fence))
    }
}

impl FromSql for Sql<Fence> {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
        let fence = i64::column_result(value)?;
        u64::try_from(fence)
            .map(|f| Sql(Fence(f)))
            .map_err(|_| FromSqlError::OutOfRange(fence))
    }
}

impl ToSql for Sql<&Ttl> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::from(self.0.as_millis() as i64))
    }
}

impl FromSql for Sql<Ttl> {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
        let ms = i64::column_result(value)?;
        u64::try_from(ms)
            .ok()
            .and_then(|ms| Ttl::from_millis(ms).ok())
            .map(Sql)
            .ok_or(FromSqlError::OutOfRange(ms))
    }
}

impl ToSql for Sql<&LeaseId> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::from(self.0.0.as_bytes().as_slice()))
    }
}

impl FromSql for Sql<LeaseId> {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
        uuid::Uuid::from_slice(value.as_blob()?)
            .map(|id| Sql(LeaseId(id)))
            .map_err(|e| FromSqlError::Other(Box::new(e)))
    }
}

/// Term ends and tool-call states, stored as their codes
/// (`leasehold_core::stored`).
macro_rules! stored_as_code {
    ($($t:ty),*) => {$(
        impl ToSql for Sql<&$t> {
            fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
                Ok(ToSqlOutput::from(i64::from(self.0.code())))
            }
        }

        impl FromSql for Sql<$t> {
            fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
                let code = i64::column_result(value)?;
                <$t>::from_code(code).map(Sql).ok_or(FromSqlError::OutOfRange(code))
            }
        }
    )*};
}
stored_as_code!(TermEnd, CallState);

/// Reads column `idx` as the domain value `T`.
fn col<T>(row: &Row<'_>, idx: usize) -> rusqlite::Result<T>
where
    Sql<T>: FromSql,
{
    row.get::<_, Sql<T>>(idx).map(|Sql(value)| value)
}

fn read_call(row: &Row<'_>) -> rusqlite::Result<(Key, ToolCall)> {
    let call = ToolCall {
        call_id: row.get(1)?,
        ordinal: row.get::<_, i64>(2)? as u64,
        name: row.get(3)?,
        input_digest: row.get(4)?,
        fence: col(row, 5)?,
        state: col(row, 6)?,
        settled_fence: row.get::<_, Option<Sql<Fence>>>(7)?.map(|Sql(fence)| fence),
        result_digest: row.get(8)?,
        result: row.get(9)?,
        begun_at: row.get::<_, i64>(10)? as u64,
        settled_at: row.get::<_, Option<i64>>(11)?.map(|t| t as u64),
        turn: row.get(12)?,
    };
    Ok((col(row, 0)?, call))
}

fn read_history(row: &Row<'_>) -> rusqlite::Result<(Key, HistoryEntry)> {
    let entry = HistoryEntry {
        fence: col(row, 1)?,
        owner: col(row, 2)?,
        acquired_at: row.get::<_, i64>(3)? as u64,
        ended_at: row.get::<_, i64>(4)? as u64,
        end: col(row, 5)?,
        unsettled_tool_calls: row.get::<_, i64>(6)? as u32,
        handed_off: row.get(7)?,
    };
    Ok((col(row, 0)?, entry))
}

fn read_record(row: &Row<'_>) -> rusqlite::Result<KeyRecord> {
    let live = match row.get::<_, Option<Sql<Fence>>>(1)? {
        None => None,
        Some(Sql(fence)) => Some(Term {
            fence,
            owner: col(row, 2)?,
            lease_id: col(row, 3)?,
            request_id: col(row, 4)?,
            ttl: col(row, 5)?,
            acquired_at: row.get::<_, i64>(6)? as u64,
            expires_at: row.get::<_, i64>(7)? as u64,
            lifecycle: Lifecycle {
                lock_delay_ms: row.get::<_, Option<i64>>(13)?.unwrap_or(0) as u64,
                max_recoveries: row.get::<_, Option<i64>>(14)?.map(|k| k as u32),
                handed_off: row.get::<_, Option<bool>>(15)?.unwrap_or(false),
            },
        }),
    };
    let last_ended = match row.get::<_, Option<Sql<Fence>>>(8)? {
        None => None,
        Some(Sql(fence)) => Some(EndedTerm {
            fence,
            owner: col(row, 9)?,
            lease_id: col(row, 10)?,
            end: col(row, 11)?,
            ended_at: row.get::<_, i64>(12)? as u64,
        }),
    };
    let reservation = match row.get::<_, Option<i64>>(16)? {
        None => None,
        Some(kind) => {
            let until = row.get::<_, i64>(19)? as u64;
            let after = Fence(row.get::<_, i64>(17)? as u64);
            Some(match ReservationKind::from_code(kind) {
                Some(ReservationKind::LockDelay) => Reservation::LockDelay { after, until },
                Some(ReservationKind::Handoff) => Reservation::Handoff {
                    from: after,
                    successor: col(row, 18)?,
                    until,
                },
                None => {
                    return Err(rusqlite::Error::FromSqlConversionFailure(
                        16,
                        rusqlite::types::Type::Integer,
                        format!("unknown reservation kind {kind}").into(),
                    ));
                }
            })
        }
    };
    Ok(KeyRecord {
        key: col(row, 0)?,
        live,
        last_ended,
        reservation,
        failures: row.get::<_, i64>(20)? as u32,
        quarantined: row.get(21)?,
        history: Vec::new(),
        history_dropped: Vec::new(),
    })
}

fn io(e: rusqlite::Error) -> StoreError {
    StoreError::Io(e.to_string())
}

/// Turns SQLite's terse open errors into advice.
fn explain(e: rusqlite::Error) -> String {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::DatabaseBusy) | Some(rusqlite::ErrorCode::DatabaseLocked) => {
            format!("{e} (is another leasehold server using this file?)")
        }
        Some(rusqlite::ErrorCode::NotADatabase) => {
            format!("{e} (the file is not a SQLite database)")
        }
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_core::lessor::{Acquire, WaiterHandle};

    /// No test here queues a waiter.
    struct NoWaiter;
    impl WaiterHandle for NoWaiter {
        fn is_waiting(&self) -> bool {
            false
        }
    }

    /// An Acquire of `key` by owner "o" for `ttl_ms`, not waiting.
    fn spec(key: &str, ttl_ms: u64) -> Acquire {
        Acquire {
            key: Key::parse(key).unwrap(),
            owner: Owner::parse("o").unwrap(),
            ttl: Ttl::from_millis(ttl_ms).unwrap(),
            wait: Default::default(),
            request_id: None,
            options: Default::default(),
        }
    }

    /// The WAL never grows far past the checkpoint size: many commits of
    /// many keys leave a `-wal` file a fraction of what SQLite's default
    /// (1,000 pages, 4 MiB) lets it reach.
    #[test]
    fn checkpoints_keep_the_wal_small() {
        use leasehold_core::lessor::{AcquireOutcome, Lessor};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.db");
        let wal = dir.path().join("l.db-wal");
        let mut store = SqliteStore::open(&path, SyncMode::Normal).unwrap();
        let mut lessor: Lessor<NoWaiter> = Lessor::new();
        let mut largest = 0;
        // 60 commits of 500 new keys each: with SQLite's default the WAL
        // file reaches about 4 MiB before its first checkpoint.
        for batch in 0..60 {
            for i in 0..500 {
                let key = format!("session/{batch}/{i}");
                let granted = lessor.acquire(spec(&key, 60_000), 1, None);
                assert!(matches!(granted, AcquireOutcome::Granted(_)));
            }
            store.commit(&lessor.take_batch()).unwrap();
            largest = largest.max(std::fs::metadata(&wal).unwrap().len());
        }
        let page = 4096 + 24;
        assert!(
            largest > 64 * page,
            "the test wrote little: {largest} bytes"
        );
        assert!(
            largest < 600 * page,
            "the WAL reached {largest} bytes, past {WAL_AUTOCHECKPOINT_PAGES} pages and one commit"
        );
    }

    #[test]
    fn migrating_twice_is_a_no_op() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.db");
        let store = SqliteStore::open(&path, SyncMode::Full).unwrap();
        assert_eq!(store.schema_version().unwrap(), MIGRATIONS.len() as i64);
        drop(store);
        let mut store = SqliteStore::open(&path, SyncMode::Full).unwrap();
        assert_eq!(store.schema_version().unwrap(), MIGRATIONS.len() as i64);
        let snapshot = store.load().unwrap();
        assert_eq!(snapshot.fence_high_water, 0);
        assert!(snapshot.records.is_empty());
    }

    #[test]
    fn an_older_database_is_upgraded_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.db");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(MIGRATIONS[0]).unwrap();
        conn.pragma_update(None, "user_version", 1).unwrap();
        conn.execute(
            "UPDATE meta SET value = 41 WHERE name = 'fence_high_water'",
            [],
        )
        .unwrap();
        drop(conn);
        let mut store = SqliteStore::open(&path, SyncMode::Full).unwrap();
        assert_eq!(store.schema_version().unwrap(), MIGRATIONS.len() as i64);
        assert_eq!(store.load().unwrap().fence_high_water, 41);
    }

    /// Migration 0006 re-keys the term history by fence and keeps every
    /// entry, each key's oldest first.
    #[test]
    fn history_keyed_by_key_is_kept_when_rekeyed_by_fence() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.db");
        let conn = Connection::open(&path).unwrap();
        for migration in &MIGRATIONS[..5] {
            conn.execute_batch(migration).unwrap();
        }
        conn.pragma_update(None, "user_version", 5).unwrap();
        conn.execute_batch(
            "INSERT INTO keys (key, ended_fence, ended_owner, ended_lease_id, ended_end,
                 ended_at_ms) VALUES ('a', 4, 'o', x'00000000000000000000000000000001', 1, 40),
                                     ('b', 3, 'o', x'00000000000000000000000000000002', 3, 30);
             INSERT INTO term_history VALUES ('a', 4, 'o', 35, 40, 1, 0, 0),
                                             ('b', 3, 'p', 25, 30, 3, 2, 0),
                                             ('a', 1, 'o', 5, 10, 2, 0, 1),
                                             ('b', 2, 'p', 15, 20, 1, 0, 0);",
        )
        .unwrap();
        drop(conn);
        let mut store = SqliteStore::open(&path, SyncMode::Full).unwrap();
        assert_eq!(store.schema_version().unwrap(), MIGRATIONS.len() as i64);
        let snapshot = store.load().unwrap();
        let history = |key: &str| -> Vec<(u64, u64, u32)> {
            let record = snapshot.records.iter().find(|r| r.key == key).unwrap();
            record
                .history
                .iter()
                .map(|h| (h.fence.0, h.ended_at, h.unsettled_tool_calls))
                .collect()
        };
        assert_eq!(history("a"), vec![(1, 10, 0), (4, 40, 0)]);
        assert_eq!(history("b"), vec![(2, 20, 0), (3, 30, 2)]);
        let a = snapshot.records.iter().find(|r| r.key == "a").unwrap();
        assert!(a.history[0].handed_off);
        assert_eq!(a.history[0].end, TermEnd::Suspended);
    }

    /// Fences survive a reopen whether they sit in a key's row or, once
    /// rows are deleted (forgotten keys), in the high-water mark alone.
    #[test]
    fn fences_never_regress_across_a_reopen_even_after_rows_are_deleted() {
        use leasehold_core::lessor::Lessor;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.db");
        let mut lessor: Lessor<NoWaiter> = Lessor::restore(Vec::new(), Vec::new(), 0, 0, 100);
        let spec = |key: &str| spec(key, 1000);
        let k = |key: &str| Key::parse(key).unwrap();
        let leasehold_core::lessor::AcquireOutcome::Granted(a) = lessor.acquire(spec("a"), 0, None)
        else {
            panic!("not granted");
        };
        let leasehold_core::lessor::AcquireOutcome::Granted(b) = lessor.acquire(spec("b"), 0, None)
        else {
            panic!("not granted");
        };
        let mut store = SqliteStore::open(&path, SyncMode::Full).unwrap();
        store.commit(&lessor.take_batch()).unwrap();
        drop(store);
        let mut store = SqliteStore::open(&path, SyncMode::Full).unwrap();
        let snapshot = store.load().unwrap();
        let mut reopened: Lessor<NoWaiter> = Lessor::restore(
            snapshot.records,
            snapshot.calls,
            snapshot.fence_high_water,
            0,
            100,
        );
        // As the engine does: the event log continues after the stored one.
        reopened.resume_revisions(snapshot.events.last().map_or(0, |e| e.revision));
        let leasehold_core::lessor::AcquireOutcome::Granted(c) =
            reopened.acquire(spec("c"), 0, None)
        else {
            panic!("not granted");
        };
        assert!(c.term.fence > b.term.fence, "from the rows");

        // Release b, the key with the highest fence, and let it be forgotten.
        reopened
            .release(&k("b"), b.term.fence, b.term.lease_id, false, None, 10)
            .unwrap();
        reopened
            .release(&k("c"), c.term.fence, c.term.lease_id, false, None, 10)
            .unwrap();
        reopened.expire_due(110);
        let batch = reopened.take_batch();
        assert_eq!(batch.forgotten.len(), 2);
        store.commit(&batch).unwrap();
        drop(store);
        let mut store = SqliteStore::open(&path, SyncMode::Full).unwrap();
        let snapshot = store.load().unwrap();
        assert_eq!(snapshot.records.len(), 1, "only a is left");
        assert_eq!(snapshot.records[0].key, k("a"));
        assert!(snapshot.fence_high_water >= c.term.fence.0, "from the mark");
        let mut again: Lessor<NoWaiter> = Lessor::restore(
            snapshot.records,
            snapshot.calls,
            snapshot.fence_high_water,
            0,
            100,
        );
        let leasehold_core::lessor::AcquireOutcome::Granted(d) = again.acquire(spec("b"), 0, None)
        else {
            panic!("not granted");
        };
        assert!(d.term.fence > c.term.fence && c.term.fence > a.term.fence);
    }

    /// History rows are keyed by fence: the entries that fall out of a
    /// key's history and a forgotten key's entries are deleted by fence, so
    /// the table holds exactly what the lessor remembers, across reopens.
    #[test]
    fn history_rows_follow_the_lessor_across_reopens_and_forgetting() {
        use leasehold_core::lessor::{AcquireOutcome, Lessor};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.db");
        let k = |key: &str| Key::parse(key).unwrap();
        let spec = |key: &str| spec(key, 1000);
        let rows = |store: &SqliteStore| -> Vec<(String, i64)> {
            let mut stmt = store
                .conn
                .prepare("SELECT key, fence FROM term_history ORDER BY fence")
                .unwrap();
            stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap()
        };
        let cycle = |lessor: &mut Lessor<NoWaiter>, key: &str, at: u64| {
            let AcquireOutcome::Granted(g) = lessor.acquire(spec(key), at, None) else {
                panic!("not granted");
            };
            lessor
                .release(&k(key), g.term.fence, g.term.lease_id, false, None, at)
                .unwrap();
            g.term.fence.0 as i64
        };
        let mut lessor: Lessor<NoWaiter> = Lessor::new();
        lessor.set_history_len(3);
        let mut store = SqliteStore::open(&path, SyncMode::Full).unwrap();
        // Interleaved keys, a commit every two cycles: the trims of one key
        // must not touch the other's rows.
        let mut fences = Vec::new();
        for i in 0..5 {
            fences.push(("x", cycle(&mut lessor, "x", i)));
            fences.push(("y", cycle(&mut lessor, "y", i)));
            store.commit(&lessor.take_batch()).unwrap();
        }
        let newest = |key: &str| -> Vec<(String, i64)> {
            let mine: Vec<_> = fences.iter().filter(|(k, _)| *k == key).collect();
            mine[mine.len() - 3..]
                .iter()
                .map(|(k, f)| (k.to_string(), *f))
                .collect()
        };
        let mut want: Vec<(String, i64)> = newest("x").into_iter().chain(newest("y")).collect();
        want.sort_by_key(|(_, f)| *f);
        assert_eq!(rows(&store), want, "the newest 3 of each key, nothing else");

        // Reopened with a shorter history, the lessor drops the oldest entry
        // of each key, and storage with it once the key is written again.
        drop(store);
        let mut store = SqliteStore::open(&path, SyncMode::Full).unwrap();
        let mut snapshot = store.load().unwrap();
        let x = snapshot.records.iter().find(|r| r.key == k("x")).unwrap();
        let loaded: Vec<i64> = x.history.iter().map(|h| h.fence.0 as i64).collect();
        let want_x: Vec<i64> = newest("x").iter().map(|(_, f)| *f).collect();
        assert_eq!(loaded, want_x, "oldest first, from the fence-ordered table");
        let mut lessor: Lessor<NoWaiter> = Lessor::restore(
            std::mem::take(&mut snapshot.records),
            std::mem::take(&mut snapshot.calls),
            snapshot.fence_high_water,
            0,
            100,
        );
        lessor.resume_revisions(snapshot.events.last().map_or(0, |e| e.revision));
        lessor.set_history_len(2);
        let page = lessor.history(&k("x"), None, 10, 0).unwrap();
        assert_eq!(
            page.entries.len(),
            3,
            "restored before the new length applies"
        );
        let f = cycle(&mut lessor, "x", 10);
        store.commit(&lessor.take_batch()).unwrap();
        let xs: Vec<i64> = rows(&store)
            .into_iter()
            .filter(|(key, _)| key == "x")
            .map(|(_, f)| f)
            .collect();
        assert_eq!(xs, vec![want_x[2], f]);

        // Forgotten (clean release, retention over): its rows go, y's stay.
        lessor.expire_due(10_000);
        let batch = lessor.take_batch();
        assert_eq!(batch.forgotten.len(), 2);
        store.commit(&batch).unwrap();
        assert_eq!(rows(&store), Vec::<(String, i64)>::new());
    }

    /// What this build cannot read is refused at load, row by row: an
    /// unknown term end, an unknown tool-call state, a key the rules refuse.
    #[test]
    fn unknown_stored_values_are_errors_at_load() {
        let corruptions = [
            "INSERT INTO keys (key, ended_fence, ended_owner, ended_lease_id, ended_end, ended_at_ms)
             VALUES ('k', 1, 'o', zeroblob(16), 7, 0)",
            "INSERT INTO tool_calls (key, call_id, ordinal, name, input_digest, fence, state,
                result_digest, result, begun_at_ms)
             VALUES ('k', 'c', 1, 'tool', '', 1, 9, '', x'', 0)",
            "INSERT INTO keys (key, ended_fence, ended_owner, ended_lease_id, ended_end, ended_at_ms)
             VALUES ('', 1, 'o', zeroblob(16), 1, 0)",
            "INSERT INTO keys (key, live_fence, live_owner, live_lease_id, live_ttl_ms,
                live_acquired_at_ms, live_expires_at_ms)
             VALUES ('k', 1, 'o', zeroblob(16), 5, 0, 5)",
            "INSERT INTO keys (key, reserved_kind, reserved_after_fence, reserved_until_ms)
             VALUES ('k', 9, 1, 5)",
            "INSERT INTO events (first_revision, last_revision, data) VALUES (1, 1, x'0100')",
        ];
        for corruption in corruptions {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("l.db");
            drop(SqliteStore::open(&path, SyncMode::Full).unwrap());
            let conn = Connection::open(&path).unwrap();
            conn.execute(corruption, []).unwrap();
            drop(conn);
            let mut store = SqliteStore::open(&path, SyncMode::Full).unwrap();
            let err = store.load().expect_err(corruption);
            assert!(matches!(err, StoreError::Io(_)), "{err}");
        }
    }

    #[test]
    fn a_newer_schema_is_refused_not_reset() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.db");
        drop(SqliteStore::open(&path, SyncMode::Full).unwrap());
        let conn = Connection::open(&path).unwrap();
        conn.pragma_update(None, "user_version", 99).unwrap();
        drop(conn);
        let err = SqliteStore::open(&path, SyncMode::Full).unwrap_err();
        assert!(matches!(err, StoreError::TooNew { found: 99, .. }), "{err}");
    }

    #[test]
    fn a_second_server_on_the_same_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.db");
        let _first = SqliteStore::open(&path, SyncMode::Full).unwrap();
        let err = SqliteStore::open(&path, SyncMode::Full).unwrap_err();
        assert!(
            err.to_string().contains("another leasehold server"),
            "{err}"
        );
    }
}
