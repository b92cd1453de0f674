//! Renewal batching: concurrent renewals on this server share one
//! statement.
//!
//! A holder renews every third of its TTL, so a server with many sessions
//! spends most of its database round trips on renewals. Each is a
//! conditional write on one row; many of them in one `UPDATE … FROM
//! unnest(…)` ([`sql::RENEW_MANY`]) are still one conditional write per row,
//! each with its own condition (fence, lease id, not expired) on the
//! database clock, so batching changes no rule: it only shares the round
//! trip and the commit.
//!
//! Like the SQLite engine's group commit: renewals queue while the batches
//! already in flight run, and the next batch takes everything queued (up to
//! [`PgConfig::renew_batch`](crate::PgConfig::renew_batch)), through the same loop as grants and releases
//! (`batch::run_batches`): an eighth of the pool runs renewal batches at
//! once, so acquires and releases always find connections and a batch
//! grows while the ones before it run.
//!
//! A renewal the batch did not apply (its row was not returned: a stale
//! fence, a wrong lease id, a key that changed under it) is sent again on
//! its own through the single-row path, which reads the row and explains
//! the refusal exactly as before. Keys in one batch are distinct (the
//! per-key order lets one renewal of a key run at a time on this server;
//! a duplicate still goes alone), and rows are locked in key order, so two
//! servers' batches cannot deadlock.

use tokio::sync::oneshot;

use leasehold_core::error::{Error, Result};
use leasehold_core::lease::{Fence, Key, LeaseId, Term, Ttl};

use crate::batch::{Batched, Batcher, Job};
use crate::db::{Db, db_error, in_time};
use crate::key_row::KeyRow;
use crate::sql;

/// One renewal waiting for a batch.
pub(crate) struct RenewJob {
    key: Key,
    fence: Fence,
    lease_id: LeaseId,
    ttl: Option<Ttl>,
    /// The renewed term, `None` when the batch did not apply it, or the
    /// batch's failure.
    reply: oneshot::Sender<Result<Option<Term>>>,
}

impl Job for RenewJob {
    type Done = Term;
    fn key(&self) -> &Key {
        &self.key
    }
    fn reply(self, outcome: Result<Option<Term>>) {
        let _ = self.reply.send(outcome);
    }
}

/// Renewals, batched.
pub(crate) type Renewals = Batcher<RenewJob>;

impl Renewals {
    /// Renews through a batch; a renewal it did not apply (or batching is
    /// off) goes alone, where the single-row path explains a refusal.
    pub(crate) async fn renew(
        &self,
        key: &Key,
        fence: Fence,
        lease_id: LeaseId,
        ttl: Option<Ttl>,
    ) -> Result<Batched<Term>> {
        let (reply, replied) = oneshot::channel();
        let job = RenewJob {
            key: key.clone(),
            fence,
            lease_id,
            ttl,
            reply,
        };
        self.ask(job, replied).await
    }

    /// Applies `batch` in one statement and answers each renewal.
    pub(crate) async fn run(&self, db: &Db, batch: Vec<RenewJob>) {
        // A key twice in one batch would be updated once: the later ones
        // go alone.
        let (jobs, seen) = Self::distinct(batch);
        let keys: Vec<&str> = jobs.iter().map(|j| j.key.as_str()).collect();
        let fences: Vec<i64> = jobs.iter().map(|j| j.fence.0 as i64).collect();
        let lease_ids: Vec<uuid::Uuid> = jobs.iter().map(|j| j.lease_id.0).collect();
        let ttls: Vec<Option<i64>> = jobs
            .iter()
            .map(|j| j.ttl.map(|t| t.as_millis() as i64))
            .collect();
        let applied = in_time(db.config.op_timeout, async {
            let client = db.client().await?;
            let stmt = client
                .prepare_cached(sql::RENEW_MANY)
                .await
                .map_err(db_error)?;
            client
                .query(&stmt, &[&keys, &fences, &lease_ids, &ttls])
                .await
                .map_err(db_error)
        })
        .await;
        self.answer(jobs, &seen, applied, |_, row| {
            KeyRow::from_row(row).and_then(|r| {
                r.live
                    .ok_or_else(|| Error::Storage("a renewal returned no term".into()))
            })
        });
    }
}
