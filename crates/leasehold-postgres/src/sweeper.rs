//! The sweeper: every [`PgConfig::sweep_interval`](crate::PgConfig::sweep_interval)
//! one of this server's tasks moves expired terms to ended (waking their
//! waiters), forgets what its retention let go, drops dead waiter rows and
//! numbers the queued Watch events. Any number of servers sweep one schema:
//! each statement is conditional, so two sweeps never move a term twice.

use std::sync::Arc;

use leasehold_core::error::Result;

use crate::db::{Db, db_error, in_time};
use crate::{events, sql};

/// Moves expired terms to ended (waking their waiters), forgets keys
/// past their retention, drops waiter rows long dead, numbers the
/// queued Watch events and trims their log.
pub(crate) async fn sweep(db: &Db) -> Result<()> {
    let client = db.client().await?;
    let expire = client
        .prepare_cached(sql::SWEEP_EXPIRED)
        .await
        .map_err(db_error)?;
    loop {
        let moved = client
            .query(&expire, &[&db.channel, &db.history_len()])
            .await
            .map_err(db_error)?;
        if moved.len() < 1000 {
            break;
        }
    }
    let retention = db.config.retention_ms.min(i64::MAX as u64) as i64;
    let prune = client
        .prepare_cached(sql::PRUNE_SETTLED_CALLS)
        .await
        .map_err(db_error)?;
    client
        .execute(&prune, &[&retention])
        .await
        .map_err(db_error)?;
    let forget = client
        .prepare_cached(sql::FORGET_RELEASED)
        .await
        .map_err(db_error)?;
    client
        .execute(&forget, &[&retention])
        .await
        .map_err(db_error)?;
    let dead = client
        .prepare_cached(sql::DROP_DEAD_WAITERS)
        .await
        .map_err(db_error)?;
    client.execute(&dead, &[]).await.map_err(db_error)?;
    // Number the events queued since, with or without watchers, so the
    // queue stays short and expiries reach watchers within a sweep; and
    // keep the log to this server's length.
    events::sequence(&client).await?;
    events::trim(&client, db.config.event_log_len).await
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
