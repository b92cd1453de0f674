//! gRPC health for a PostgreSQL server: whether the database answers. The
//! prober asks it every [`PgConfig::health_interval`](crate::PgConfig) and
//! publishes the answer; this part alone changes it.

use std::sync::Arc;

use tokio::sync::watch;

use leasehold_core::error::Result;

use crate::db::{Db, db_error, in_time};

/// Whether the database answered the last probe.
pub(crate) struct Health {
    reachable: watch::Sender<bool>,
}

impl Health {
    /// Serving until a probe says otherwise.
    pub(crate) fn new() -> Health {
        Health {
            reachable: watch::Sender::new(true),
        }
    }

    /// Follows the answer (see `Backend::serving`).
    pub(crate) fn subscribe(&self) -> watch::Receiver<bool> {
        self.reachable.subscribe()
    }

    /// Whether the last probe was answered.
    pub(crate) fn up(&self) -> bool {
        *self.reachable.borrow()
    }

    /// Publishes the database's reachability every health interval, logging
    /// each change once, until the server stops.
    pub(crate) async fn run(self: Arc<Self>, db: Arc<Db>) {
        let mut tick = tokio::time::interval(db.config.health_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if *db.closing.borrow() {
                // Stopping: the pool closes, which says nothing of the database.
                return;
            }
            let outcome = probe(&db).await;
            let up = outcome.is_ok();
            let changed = self.reachable.send_if_modified(|was| {
                let changed = *was != up;
                *was = up;
                changed
            });
            match outcome {
                Err(e) if changed => {
                    tracing::warn!(error = %e, "the database does not answer: health NOT_SERVING")
                }
                Ok(()) if changed => {
                    tracing::info!("the database answers again: health SERVING")
                }
                _ => {}
            }
        }
    }
}

/// Whether the database answers a trivial statement now, within the
/// connection timeout (a fresh connection when the pooled ones broke).
async fn probe(db: &Db) -> Result<()> {
    in_time(db.config.connect_timeout, async {
        let client = db.client().await?;
        client.simple_query("SELECT 1").await.map_err(db_error)?;
        Ok(())
    })
    .await
}
