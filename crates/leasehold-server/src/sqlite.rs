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

use rusqlite::{Connection, OptionalExtension, Row, TransactionBehavior, params};

use leasehold_core::lease::{EndedTerm, Fence, LeaseId, Term, TermEnd};
use leasehold_core::ledger::{CallState, ToolCall};
use leasehold_core::store::{Batch, KeyRecord};
use leasehold_core::store::{Snapshot, Store, StoreError};

/// The schema migrations, in order. Never remove or reorder an entry; only append.
pub const MIGRATIONS: &[&str] = &[
    include_str!("../../../migrations/0001_leases.sql"),
    include_str!("../../../migrations/0002_tool_calls.sql"),
];

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
        let mut store = SqliteStore { conn, commits: 0 };
        store.migrate(&shown)?;
        Ok(store)
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
                        ended_lease_id, ended_end, ended_at_ms
                 FROM keys ORDER BY key",
            )
            .map_err(io)?;
        let records = stmt
            .query_map([], read_record)
            .map_err(io)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(io)?;
        let mut stmt = self
            .conn
            .prepare(
                "SELECT key, call_id, ordinal, name, input_digest, fence, state, settled_fence,
                        result_digest, result, begun_at_ms, settled_at_ms
                 FROM tool_calls",
            )
            .map_err(io)?;
        let calls = stmt
            .query_map([], read_call)
            .map_err(io)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(io)?;
        Ok(Snapshot {
            records,
            calls,
            fence_high_water: fence_high_water as u64,
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
                forget.execute([key]).map_err(io)?;
            }
            let mut put = tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO keys (key, live_fence, live_owner, live_lease_id,
                        live_request_id, live_ttl_ms, live_acquired_at_ms, live_expires_at_ms,
                        ended_fence, ended_owner, ended_lease_id, ended_end, ended_at_ms)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
                )
                .map_err(io)?;
            for record in &batch.records {
                let live = record.live.as_ref();
                let ended = record.last_ended.as_ref();
                put.execute(params![
                    record.key,
                    live.map(|t| t.fence.0 as i64),
                    live.map(|t| t.owner.as_str()),
                    live.map(|t| t.lease_id.0.as_bytes().as_slice()),
                    live.and_then(|t| t.request_id.as_deref()),
                    live.map(|t| t.ttl_ms as i64),
                    live.map(|t| t.acquired_at as i64),
                    live.map(|t| t.expires_at as i64),
                    ended.map(|e| e.fence.0 as i64),
                    ended.map(|e| e.owner.as_str()),
                    ended.map(|e| e.lease_id.0.as_bytes().as_slice()),
                    ended.map(|e| end_code(e.end)),
                    ended.map(|e| e.ended_at as i64),
                ])
                .map_err(io)?;
            }
            let mut prune = tx
                .prepare_cached("DELETE FROM tool_calls WHERE key = ?1 AND call_id = ?2")
                .map_err(io)?;
            for (key, call_ids) in &batch.pruned_calls {
                for call_id in call_ids {
                    prune.execute(params![key, call_id]).map_err(io)?;
                }
            }
            let mut put_call = tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO tool_calls (key, call_id, ordinal, name, input_digest,
                        fence, state, settled_fence, result_digest, result, begun_at_ms,
                        settled_at_ms)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
                )
                .map_err(io)?;
            for (key, call) in &batch.calls {
                put_call
                    .execute(params![
                        key,
                        call.call_id,
                        call.ordinal as i64,
                        call.name,
                        call.input_digest,
                        call.fence.0 as i64,
                        state_code(call.state),
                        call.settled_fence.map(|f| f.0 as i64),
                        call.result_digest,
                        call.result,
                        call.begun_at as i64,
                        call.settled_at.map(|t| t as i64),
                    ])
                    .map_err(io)?;
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

fn end_code(end: TermEnd) -> i64 {
    match end {
        TermEnd::Released => 1,
        TermEnd::Suspended => 2,
        TermEnd::Expired => 3,
    }
}

fn state_code(state: CallState) -> i64 {
    match state {
        CallState::Running => 1,
        CallState::Succeeded => 2,
        CallState::Failed => 3,
        CallState::Unknown => 4,
    }
}

fn read_call(row: &Row<'_>) -> rusqlite::Result<(String, ToolCall)> {
    let state = match row.get::<_, i64>(6)? {
        1 => CallState::Running,
        2 => CallState::Succeeded,
        3 => CallState::Failed,
        _ => CallState::Unknown,
    };
    let call = ToolCall {
        call_id: row.get(1)?,
        ordinal: row.get::<_, i64>(2)? as u64,
        name: row.get(3)?,
        input_digest: row.get(4)?,
        fence: Fence(row.get::<_, i64>(5)? as u64),
        state,
        settled_fence: row.get::<_, Option<i64>>(7)?.map(|f| Fence(f as u64)),
        result_digest: row.get(8)?,
        result: row.get(9)?,
        begun_at: row.get::<_, i64>(10)? as u64,
        settled_at: row.get::<_, Option<i64>>(11)?.map(|t| t as u64),
    };
    Ok((row.get(0)?, call))
}

fn read_record(row: &Row<'_>) -> rusqlite::Result<KeyRecord> {
    let uuid = |idx: usize| -> rusqlite::Result<LeaseId> {
        let bytes: Vec<u8> = row.get(idx)?;
        uuid::Uuid::from_slice(&bytes).map(LeaseId).map_err(|e| {
            rusqlite::Error::FromSqlConversionFailure(idx, rusqlite::types::Type::Blob, Box::new(e))
        })
    };
    let live = match row.get::<_, Option<i64>>(1)? {
        None => None,
        Some(fence) => Some(Term {
            fence: Fence(fence as u64),
            owner: row.get(2)?,
            lease_id: uuid(3)?,
            request_id: row.get(4)?,
            ttl_ms: row.get::<_, i64>(5)? as u64,
            acquired_at: row.get::<_, i64>(6)? as u64,
            expires_at: row.get::<_, i64>(7)? as u64,
        }),
    };
    let last_ended = match row.get::<_, Option<i64>>(8)? {
        None => None,
        Some(fence) => Some(EndedTerm {
            fence: Fence(fence as u64),
            owner: row.get(9)?,
            lease_id: uuid(10)?,
            end: match row.get::<_, i64>(11)? {
                1 => TermEnd::Released,
                2 => TermEnd::Suspended,
                _ => TermEnd::Expired,
            },
            ended_at: row.get::<_, i64>(12)? as u64,
        }),
    };
    Ok(KeyRecord {
        key: row.get(0)?,
        live,
        last_ended,
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

    /// Fences survive a reopen whether they sit in a key's row or, once
    /// rows are deleted (forgotten keys), in the high-water mark alone.
    #[test]
    fn fences_never_regress_across_a_reopen_even_after_rows_are_deleted() {
        use leasehold_core::lessor::{Lessor, WaiterHandle};
        /// No test here queues a waiter.
        struct NoWaiter;
        impl WaiterHandle for NoWaiter {
            fn is_waiting(&self) -> bool {
                false
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.db");
        let mut lessor: Lessor<NoWaiter> = Lessor::restore(Vec::new(), Vec::new(), 0, 0, 100);
        let spec = |key: &str| leasehold_core::lessor::AcquireSpec {
            key: key.into(),
            owner: "o".into(),
            ttl_ms: 1000,
            request_id: None,
        };
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
        let leasehold_core::lessor::AcquireOutcome::Granted(c) =
            reopened.acquire(spec("c"), 0, None)
        else {
            panic!("not granted");
        };
        assert!(c.term.fence > b.term.fence, "from the rows");

        // Release b, the key with the highest fence, and let it be forgotten.
        reopened
            .release("b", b.term.fence, b.term.lease_id, false, 10)
            .unwrap();
        reopened
            .release("c", c.term.fence, c.term.lease_id, false, 10)
            .unwrap();
        reopened.expire_due(110);
        let batch = reopened.take_batch();
        assert_eq!(batch.forgotten.len(), 2);
        store.commit(&batch).unwrap();
        drop(store);
        let mut store = SqliteStore::open(&path, SyncMode::Full).unwrap();
        let snapshot = store.load().unwrap();
        assert_eq!(snapshot.records.len(), 1, "only a is left");
        assert_eq!(snapshot.records[0].key, "a");
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
