//! The database this server talks to: its connection pool, the schema's
//! NOTIFY channel, this server's settings and whether it is stopping; what
//! every part below shares, and the reads that bring a key up to date
//! before an operation looks at it. Every part takes a `&Db`; none of them
//! owns another's state.

use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::sync::watch;
use tokio_postgres::error::SqlState;

use leasehold_core::clock::Millis;
use leasehold_core::error::{Error, Result};
use leasehold_core::lease::{Key, LeaseId};

use crate::config::PgConfig;
use crate::key_row::{KeyNow, KeyRow, millis};
use crate::sql;

/// How many times an operation re-reads a key that changed under it before
/// it gives up with UNAVAILABLE (only under extreme contention).
pub(crate) const RACE_RETRIES: usize = 16;

/// The database, this server's settings, and its stopping flag.
pub(crate) struct Db {
    /// Connections for every statement (never for LISTEN).
    pub(crate) pool: Pool,
    /// The NOTIFY channel of this schema.
    pub(crate) channel: String,
    /// Set when the server begins to shut down: waiting Acquires give up,
    /// the health probe stops.
    pub(crate) closing: watch::Sender<bool>,
    pub(crate) config: PgConfig,
}

/// A database failure as the client sees it: the database could not be
/// reached or refused for a transient reason (UNAVAILABLE, retry), or a
/// fault of ours (INTERNAL). Never a guess about the lease.
pub(crate) fn db_error(e: tokio_postgres::Error) -> Error {
    let Some(db) = e.as_db_error() else {
        return Error::Unavailable(format!("database: {e}"));
    };
    let code = db.code().code();
    let transient = ["08", "40", "53", "55", "57", "58", "25"]
        .iter()
        .any(|class| code.starts_with(class));
    if transient || *db.code() == SqlState::READ_ONLY_SQL_TRANSACTION {
        Error::Unavailable(format!("database: {}", db.message()))
    } else {
        Error::Storage(format!("database: {} ({code})", db.message()))
    }
}

/// What went wrong, with the server's message when it sent one (a
/// `tokio_postgres::Error` alone only says "db error").
pub(crate) fn pg_message(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => e.to_string(),
    }
}

fn pool_error(e: deadpool_postgres::PoolError) -> Error {
    match e {
        deadpool_postgres::PoolError::Backend(e) => db_error(e),
        other => Error::Unavailable(format!("database: {other}")),
    }
}

/// `op`, or UNAVAILABLE once `limit` has passed without an answer.
pub(crate) async fn in_time<T>(
    limit: Duration,
    op: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout(limit, op).await.unwrap_or_else(|_| {
        Err(Error::Unavailable(format!(
            "the database did not answer within {} ms",
            limit.as_millis()
        )))
    })
}

pub(crate) fn closed() -> Error {
    Error::Unavailable("the server is shutting down".into())
}

pub(crate) type Client = deadpool_postgres::Object;

/// A `keys` row read with [`sql::READ_KEY`].
pub(crate) struct Snapshot {
    pub(crate) now: Millis,
    /// Whether the key has a row at all.
    pub(crate) found: bool,
    pub(crate) key: KeyNow,
    pub(crate) unsettled: usize,
    /// Whether someone alive waits in line.
    pub(crate) line: bool,
    /// Whether the row holds a term past its deadline that nobody has moved
    /// to ended yet (`key` already shows it ended).
    pub(crate) expired_unmoved: bool,
}

impl Db {
    pub(crate) async fn client(&self) -> Result<Client> {
        if self.pool.is_closed() {
            return Err(closed());
        }
        self.pool.get().await.map_err(pool_error)
    }

    /// The key as [`Db::read_key`] reads it, after moving a term past
    /// its deadline to ended (recording its history, failure and
    /// lock-delay) and handing the key to the first waiter in line who may
    /// take it: as the SQLite engine brings a key up to date before every
    /// operation, so a refusal or a Get never shows a free key that someone
    /// waits for (a fence whose term expired with people in line is then
    /// superseded, on either backend), and History shows every ended term.
    pub(crate) async fn read_key_served(&self, client: &mut Client, key: &Key) -> Result<Snapshot> {
        let snapshot = self.read_key(client, key).await?;
        if snapshot.expired_unmoved {
            self.expire_and_serve(client, key).await?;
            return self.read_key(client, key).await;
        }
        if snapshot.key.live.is_some() || !snapshot.line {
            return Ok(snapshot);
        }
        self.serve_first(client, key).await?;
        self.read_key(client, key).await
    }

    /// Moves `key`'s term to ended if it is past its deadline, and hands the
    /// key to the first waiter who may take it, in one transaction.
    pub(crate) async fn expire_and_serve(&self, client: &mut Client, key: &Key) -> Result<()> {
        let tx = client.transaction().await.map_err(db_error)?;
        let expire = tx.prepare_cached(sql::EXPIRE_KEY).await.map_err(db_error)?;
        let moved = tx
            .query_opt(&expire, &[&key.as_str(), &self.history_len()])
            .await
            .map_err(db_error)?;
        if moved.is_some() {
            serve_first_in(&tx, &self.channel, key, self.history_len()).await?;
            let notify = tx.prepare_cached(sql::NOTIFY).await.map_err(db_error)?;
            tx.execute(&notify, &[&self.channel, &key.as_str()])
                .await
                .map_err(db_error)?;
        }
        tx.commit().await.map_err(db_error)
    }

    /// Grants `key` to the first waiter alive in line if it is free, in one
    /// transaction with the waiter's row and the notification.
    pub(crate) async fn serve_first(&self, client: &mut Client, key: &Key) -> Result<()> {
        let tx = client.transaction().await.map_err(db_error)?;
        let served = serve_first_in(&tx, &self.channel, key, self.history_len()).await?;
        tx.commit().await.map_err(db_error)?;
        if served {
            tracing::debug!(key = %key, "handed to the first waiter");
        }
        Ok(())
    }

    /// The history length, as a statement parameter (at most `i32::MAX`:
    /// a key's ring length is an `integer`, migration 0008).
    pub(crate) fn history_len(&self) -> i64 {
        self.config.history_len.clamp(1, i32::MAX as usize) as i64
    }

    pub(crate) async fn read_key(&self, client: &Client, key: &Key) -> Result<Snapshot> {
        let stmt = client
            .prepare_cached(sql::READ_KEY)
            .await
            .map_err(db_error)?;
        let row = client
            .query_one(&stmt, &[&key.as_str()])
            .await
            .map_err(db_error)?;
        let now = millis(row.get("now"));
        let found = row.get::<_, Option<String>>("found").is_some();
        let stored = KeyRow::from_row(&row)?;
        Ok(Snapshot {
            now,
            found,
            expired_unmoved: stored.expired_unmoved(now),
            key: stored.at(now),
            unsettled: row.get::<_, i64>("unsettled") as usize,
            line: row.get("line"),
        })
    }
}

/// How many times [`serve_first_in`] looks for a waiter that is still there.
const SERVE_ATTEMPTS: usize = 8;

/// Grants `key` to its first waiter alive in line, inside `tx`: the grant,
/// the waiter's row and the notification commit together. Returns whether
/// it granted.
///
/// `SERVE_FIRST` picks the waiter from its statement's snapshot, without
/// locking the waiter's row (the key's row is locked first, always). A
/// waiter whose request was cancelled right after that snapshot has its
/// row deleted, and `MARK_GRANTED` then touches nothing: the grant would
/// be a ghost term nobody holds until its TTL runs out. So the grant is
/// made under a savepoint and undone when the mark touched no row; the
/// next statement's snapshot no longer sees the deleted row, and the next
/// waiter (or nobody: the key stays free) is served instead.
pub(crate) async fn serve_first_in(
    tx: &deadpool_postgres::Transaction<'_>,
    channel: &str,
    key: &Key,
    history_len: i64,
) -> Result<bool> {
    let serve = tx
        .prepare_cached(sql::SERVE_FIRST)
        .await
        .map_err(db_error)?;
    let mark = tx
        .prepare_cached(sql::MARK_GRANTED)
        .await
        .map_err(db_error)?;
    for _ in 0..SERVE_ATTEMPTS {
        let lease_id = LeaseId::random();
        // Sent together: tokio-postgres pipelines the two, so the savepoint
        // costs no round trip of its own.
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
            [&key.as_str(), &lease_id.0, &history_len];
        let (_, served) = tokio::try_join!(
            tx.batch_execute("SAVEPOINT serve_first"),
            tx.query_opt(&serve, &params),
        )
        .map_err(db_error)?;
        let Some(row) = served else {
            return Ok(false);
        };
        let waiter: i64 = row.get("waiter_id");
        let fence: i64 = row.get("live_fence");
        let acquired: i64 = row.get("live_acquired_at_ms");
        let expires: i64 = row.get("live_expires_at_ms");
        let handed_off: bool = row.get("live_handed_off");
        let marked = tx
            .execute(
                &mark,
                &[
                    &waiter,
                    &fence,
                    &lease_id.0,
                    &acquired,
                    &expires,
                    &handed_off,
                ],
            )
            .await
            .map_err(db_error)?;
        if marked == 0 {
            // The waiter left after the snapshot: undo its grant (the term,
            // its history and events; the fence drawn is skipped, never reused).
            tx.batch_execute("ROLLBACK TO SAVEPOINT serve_first")
                .await
                .map_err(db_error)?;
            continue;
        }
        let notify = tx.prepare_cached(sql::NOTIFY).await.map_err(db_error)?;
        tx.execute(&notify, &[&channel, &key.as_str()])
            .await
            .map_err(db_error)?;
        return Ok(true);
    }
    // Waiters kept leaving under us: the key stays free, which is safe; the
    // next release, sweep or newcomer serves the line.
    Ok(false)
}
