//! Fencing inside an application's own SQLite database.
//!
//! One table remembers, per key, the highest fence that has written. Every
//! write transaction on a key first *advances* that fence: it records the
//! writer's fence if it is at least the stored one and changes nothing
//! otherwise, and a write whose fence changed nothing is rolled back. A holder
//! that lost its lease, and was overtaken by a newer holder's write, is
//! refused however late its write arrives, even if it passed its own checks.
//!
//! ```no_run
//! use leasehold_core::Fence;
//! use leasehold_client::fence::sqlite::{self, FenceError};
//!
//! # fn demo(guard_fence: Fence) -> Result<(), FenceError> {
//! let mut conn = rusqlite::Connection::open("sessions.db")?;
//! sqlite::install(&conn)?;
//! sqlite::write(&mut conn, "session:42", guard_fence, |tx| {
//!     tx.execute("INSERT INTO items (session, body) VALUES (?1, ?2)", ("session:42", "hello"))?;
//!     Ok::<_, FenceError>(())
//! })?;
//! # Ok(())
//! # }
//! ```
//!
//! # The SQL, for other languages
//! The table ([`CREATE_TABLE`]):
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS leasehold_fence (
//!     key   TEXT PRIMARY KEY NOT NULL,
//!     fence INTEGER NOT NULL
//! );
//! ```
//!
//! Inside the write transaction, before the application's own writes
//! ([`ADVANCE`]):
//!
//! ```sql
//! INSERT INTO leasehold_fence (key, fence) VALUES (:key, :fence)
//! ON CONFLICT (key) DO UPDATE SET fence = excluded.fence
//! WHERE excluded.fence >= leasehold_fence.fence;
//! ```
//!
//! One changed row means the fence is current: go on and commit. Zero changed
//! rows means a higher fence has written: roll back. An equal fence is
//! accepted, so one holder can write many times. In Python:
//!
//! ```python
//! conn = sqlite3.connect("sessions.db", isolation_level=None)  # explicit BEGIN
//!
//! def fenced_write(conn, key, fence, write):
//!     conn.execute("BEGIN IMMEDIATE")
//!     try:
//!         if conn.execute(ADVANCE, {"key": key, "fence": fence}).rowcount != 1:
//!             raise StaleFence(key, fence)
//!         write(conn)
//!         conn.execute("COMMIT")
//!     except BaseException:
//!         conn.execute("ROLLBACK")
//!         raise
//! ```
//!
//! In TypeScript with better-sqlite3, run the statement inside
//! `db.transaction(fn).immediate(...)` and throw when
//! `db.prepare(ADVANCE).run({ key, fence }).changes !== 1`.
//!
//! # Locking
//! Begin the transaction with `BEGIN IMMEDIATE` (as [`write()`] does): it takes
//! the write lock at once, so the comparison and the writes see the latest
//! committed fence and nothing can commit in between. A deferred transaction
//! is still safe, because the upsert is a write and SQLite will not let a
//! transaction write on an outdated snapshot (in WAL mode it fails with
//! `SQLITE_BUSY_SNAPSHOT`), but it fails later and more confusingly.
//!
//! # Compatibility
//! The upsert needs SQLite 3.24 (2018) or later. Fences are stored as
//! `INTEGER` (a signed 64-bit value); leasehold counts grants from 1, so they
//! never come near 2^63.

use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, named_params};

use leasehold_core::lease::Fence;

/// The table that holds the highest fence seen per key.
pub const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS leasehold_fence (
    key   TEXT PRIMARY KEY NOT NULL,
    fence INTEGER NOT NULL
)";

/// Records `:fence` for `:key` unless a higher fence is recorded; one changed
/// row means the fence is current, zero means it is stale.
pub const ADVANCE: &str = "INSERT INTO leasehold_fence (key, fence) VALUES (:key, :fence)
ON CONFLICT (key) DO UPDATE SET fence = excluded.fence
WHERE excluded.fence >= leasehold_fence.fence";

/// The highest fence recorded for `:key`.
pub const HIGHEST: &str = "SELECT fence FROM leasehold_fence WHERE key = :key";

/// The highest fence recorded for any key (NULL when none is).
pub const HIGHEST_OF_ALL: &str = "SELECT max(fence) FROM leasehold_fence";

/// A fenced write that must not happen.
#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    /// A higher fence has already written this key: the writer's lease is over.
    #[error(
        "fence {fence} for key {key:?} is stale: fence {highest} has already written \
         (a newer holder wrote; or, if the lock server's store was reset or replaced, \
         restart it with --fence-floor at least the highest fence stored, which \
         fence_floor() reports: see leasehold's docs/deploy.md)"
    )]
    Stale {
        key: String,
        fence: u64,
        highest: u64,
    },

    /// The check ran outside a transaction, where it would protect nothing.
    #[error("the fence check for key {key:?} must run inside the write's transaction")]
    NotInTransaction { key: String },

    /// The fence does not fit in an SQLite INTEGER.
    #[error("fence {0} does not fit in an SQLite INTEGER")]
    OutOfRange(u64),

    /// SQLite failed.
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
}

/// Creates the fence table if it does not exist. Running it again is a no-op.
///
/// # Errors
/// [`FenceError::Sqlite`] when SQLite fails.
pub fn install(conn: &Connection) -> Result<(), FenceError> {
    conn.execute_batch(CREATE_TABLE)?;
    Ok(())
}

/// Inside the caller's open transaction on `conn`, records `fence` as the
/// highest fence of `key`, or refuses it if a higher one has written. On a
/// refusal the caller must roll back (dropping a rusqlite `Transaction` does).
///
/// # Errors
/// [`FenceError::Stale`] when a higher fence has written `key`;
/// [`FenceError::NotInTransaction`] when `conn` is not in a transaction;
/// [`FenceError::OutOfRange`]; [`FenceError::Sqlite`].
pub fn advance(conn: &Connection, key: &str, fence: Fence) -> Result<(), FenceError> {
    if conn.is_autocommit() {
        return Err(FenceError::NotInTransaction {
            key: key.to_owned(),
        });
    }
    let value = i64::try_from(fence.0).map_err(|_| FenceError::OutOfRange(fence.0))?;
    let changed = conn
        .prepare_cached(ADVANCE)?
        .execute(named_params! { ":key": key, ":fence": value })?;
    if changed == 1 {
        return Ok(());
    }
    let highest = highest(conn, key)?.map_or(0, |f| f.0);
    Err(FenceError::Stale {
        key: key.to_owned(),
        fence: fence.0,
        highest,
    })
}

/// The highest fence that has written `key`, if any has.
///
/// # Errors
/// [`FenceError::Sqlite`] when SQLite fails.
pub fn highest(conn: &Connection, key: &str) -> Result<Option<Fence>, FenceError> {
    let fence: Option<i64> = conn
        .prepare_cached(HIGHEST)?
        .query_row(named_params! { ":key": key }, |row| row.get(0))
        .optional()?;
    // Stored values came from `advance`, so they are never negative.
    Ok(fence.map(|f| Fence(f as u64)))
}

/// The highest fence recorded for any key ([`Fence(0)`](Fence) when none
/// is): the least `leasehold serve --fence-floor` that lets every key write
/// again after the lock server's store was reset or replaced (its fences
/// start at 1 again). Take the highest over every database that fences
/// writes with this lock server.
///
/// # Errors
/// [`FenceError::Sqlite`] when SQLite fails, for example when the fence
/// table does not exist (not the database you meant).
pub fn fence_floor(conn: &Connection) -> Result<Fence, FenceError> {
    let fence: Option<i64> = conn
        .prepare_cached(HIGHEST_OF_ALL)?
        .query_row([], |row| row.get(0))?;
    Ok(Fence(fence.unwrap_or(0) as u64))
}

/// Runs `work` in an immediate transaction on `conn` that first advances the
/// fence of `key`, and commits only if both succeed. The short, safe way to
/// make one fenced write.
///
/// # Errors
/// Whatever `work` returns, and [`FenceError`] (converted into `E`) when the
/// fence is stale or SQLite fails; nothing is committed then.
pub fn write<T, E>(
    conn: &mut Connection,
    key: &str,
    fence: Fence,
    work: impl FnOnce(&Transaction<'_>) -> Result<T, E>,
) -> Result<T, E>
where
    E: From<FenceError>,
{
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(FenceError::from)?;
    advance(&tx, key, fence)?;
    let output = work(&tx)?;
    tx.commit().map_err(FenceError::from)?;
    Ok(output)
}
