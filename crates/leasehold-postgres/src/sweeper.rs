//! The sweeper: every [`PgConfig::sweep_interval`](crate::PgConfig::sweep_interval)
//! one of this server's tasks moves expired terms to ended (waking their
//! waiters), undoes grants to waiters whose server never took them,
//! forgets what its retention let go, drops dead waiter rows and
//! numbers the queued Watch events. Any number of servers sweep one schema:
//! each statement is conditional, so two sweeps never move a term twice.

use std::sync::Arc;

use leasehold_core::error::Result;

use crate::db::{Db, db_error, in_time};
use crate::{events, sql};

/// The most rows one statement of a sweep takes: statements that lock
/// rows lock at most this many at a time, so a sweep never holds many
/// locks for long (and `SWEEP_EXPIRED` has it written in).
const BATCH: i64 = 1000;

/// The most batches of one kind a sweep runs: a backlog larger than
/// `BATCH * MAX_BATCHES` rows (a mass expiry, a retention just shortened)
/// is worked off over the next sweeps, so each sweep ends, and each kind
/// of work gets its turn in every sweep.
const MAX_BATCHES: usize = 64;

/// Runs `step` (one batch, answering how many rows it took) again while a
/// batch is full, at most [`MAX_BATCHES`] times.
async fn in_batches<F, Fut>(what: &str, mut step: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<u64>>,
{
    for _ in 0..MAX_BATCHES {
        if step().await? < BATCH as u64 {
            return Ok(());
        }
    }
    tracing::debug!(
        what,
        "sweep: more than {MAX_BATCHES} batches due; the next sweep goes on"
    );
    Ok(())
}

/// Moves expired terms to ended (waking their waiters), undoes grants
/// nobody took (`sql::UNDO_UNTAKEN`), forgets keys past their retention, drops waiter rows long dead, numbers the
/// queued Watch events and trims their log. Every statement that writes
/// several rows takes at most [`BATCH`] of them, locked first and skipping
/// rows another statement holds (see each in [`sql`]): a sweep never waits
/// for a `keys`, `waiters` or `tool_calls` row lock, so it cannot deadlock
/// with grants, releases or another server's sweep. (The log's trim
/// waits for another trim, in revision order: nothing else locks those
/// rows, see `sql::TRIM_EVENTS`.) A row skipped is another sweep's, or
/// the next sweep's.
pub(crate) async fn sweep(db: &Db) -> Result<()> {
    let client = &db.client().await?;
    let expire = &client
        .prepare_cached(sql::SWEEP_EXPIRED)
        .await
        .map_err(db_error)?;
    let history_len = &db.history_len();
    in_batches("expiries", || async move {
        let moved = client
            .query(expire, &[&db.channel, history_len])
            .await
            .map_err(db_error)?;
        Ok(moved.len() as u64)
    })
    .await?;
    let undo = &client
        .prepare_cached(sql::UNDO_UNTAKEN)
        .await
        .map_err(db_error)?;
    in_batches("untaken grants", || async move {
        let gone = client
            .query(undo, &[&db.channel, history_len, &BATCH])
            .await
            .map_err(db_error)?;
        Ok(gone.len() as u64)
    })
    .await?;
    let retention = &(db.config.retention_ms.min(i64::MAX as u64) as i64);
    let prune = &client
        .prepare_cached(sql::PRUNE_SETTLED_CALLS)
        .await
        .map_err(db_error)?;
    in_batches("settled tool calls", || async move {
        client
            .execute(prune, &[retention, &BATCH])
            .await
            .map_err(db_error)
    })
    .await?;
    let forget = &client
        .prepare_cached(sql::FORGET_RELEASED)
        .await
        .map_err(db_error)?;
    in_batches("released keys", || async move {
        client
            .execute(forget, &[retention, &BATCH])
            .await
            .map_err(db_error)
    })
    .await?;
    let dead = &client
        .prepare_cached(sql::DROP_DEAD_WAITERS)
        .await
        .map_err(db_error)?;
    in_batches("dead waiters", || async move {
        client.execute(dead, &[&BATCH]).await.map_err(db_error)
    })
    .await?;
    // Number the events queued since, with or without watchers, so the
    // queue stays short and expiries reach watchers within a sweep; and
    // keep the log to this server's length.
    events::sequence(client).await?;
    let len = db.config.event_log_len;
    in_batches("event log rows", || events::trim(client, len, BATCH)).await
}

/// Sweeps every sweep interval until the task is aborted.
pub(crate) async fn run(db: Arc<Db>) {
    let mut tick = tokio::time::interval(db.config.sweep_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = in_time(db.config.op_timeout, sweep(&db)).await {
            tracing::warn!(error = %e, "sweep failed; trying again");
        }
    }
}
