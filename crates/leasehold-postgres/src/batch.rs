//! Grant and release batching: concurrent Acquires of free keys, and
//! concurrent Releases of keys nobody waits for, share one statement each.
//!
//! A lock cycle on a free key is a grant and a release, each one conditional
//! write on one row. On a small database host the cycle is bound by the
//! database's CPU and WAL per commit, not by the rows: many grants in one
//! `INSERT … SELECT FROM unnest(…) ON CONFLICT DO UPDATE … WHERE <free>`
//! ([`sql::GRANT`]), and many releases in one `UPDATE … FROM unnest(…)`
//! ([`sql::RELEASE_MANY`]), are still one conditional write per row, each
//! with its own condition on the database clock, so batching changes no
//! rule: it only shares the round trip, the statement and the commit.
//!
//! As for renewals (`renewals`), the window is zero: a request queues, and
//! the next batch takes everything queued while the batches in flight ran
//! (up to [`PgConfig::write_batch`](crate::PgConfig::write_batch)). One client alone waits for nobody.
//! At most an eighth of the pool runs grant batches at once, and another
//! eighth release batches, so the single-request paths always find
//! connections and batches grow while the database is busy.
//!
//! A request its batch did not apply (its row was not returned: the key is
//! held, reserved, quarantined, or has a line; a stale fence; a replay)
//! goes on through the single-request path, which serves the line, explains
//! refusals and replays exactly as before. Keys in one batch are distinct
//! (the per-key order lets one write of a key run at a time on this
//! server; a duplicate still goes alone), and rows are locked in key order,
//! so two servers' batches cannot deadlock. An acknowledged grant or
//! release is committed before its reply: the reply is sent once the
//! batch's autocommit statement returned.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use tokio::sync::{Semaphore, mpsc, oneshot};

use leasehold_core::error::{Error, Result};
use leasehold_core::lease::{EndedTerm, Fence, Handoff, Key, LeaseId, TermEnd};
use leasehold_core::lessor::{Acquire, Grant};
use leasehold_core::stored::Stored;

use crate::db::{Client, Db, db_error, in_time};
use crate::key_row::KeyRow;
use crate::sql;

/// One kind of request (`J`: renewals, grants, releases) queued to share
/// statements: the queue, and what its statements carried. The loop that
/// takes the queue is [`run_batches`]; what one statement does is the
/// kind's own `run`.
/// A request that waits for a batch: the key its row is, and where its
/// answer goes (`None`: the batch did not apply it).
pub(crate) trait Job {
    type Done;
    fn key(&self) -> &Key;
    fn reply(self, outcome: Result<Option<Self::Done>>);
}

pub(crate) struct Batcher<J> {
    /// `None` when batching this kind is off.
    queue: Option<mpsc::UnboundedSender<J>>,
    /// Statements that carried batches, and the requests they carried.
    batches: AtomicU64,
    carried: AtomicU64,
}

impl<J> Batcher<J> {
    /// A batcher, and the far end of its queue for [`run_batches`] (`None`
    /// and batching off for a batch size of 1 or less: each request alone).
    pub(crate) fn new(max: usize) -> (Batcher<J>, Option<mpsc::UnboundedReceiver<J>>) {
        let (queue, queued) = if max > 1 {
            let (queue, queued) = mpsc::unbounded_channel();
            (Some(queue), Some(queued))
        } else {
            (None, None)
        };
        let batcher = Batcher {
            queue,
            batches: AtomicU64::new(0),
            carried: AtomicU64::new(0),
        };
        (batcher, queued)
    }

    /// Queues `job`, or gives it back when batching is off or its loop is
    /// gone.
    fn send(&self, job: J) -> std::result::Result<(), J> {
        match &self.queue {
            Some(queue) => queue.send(job).map_err(|mpsc::error::SendError(job)| job),
            None => Err(job),
        }
    }

    /// Queues `job` and waits for its answer.
    pub(crate) async fn ask<T>(
        &self,
        job: J,
        replied: oneshot::Receiver<Result<Option<T>>>,
    ) -> Result<Batched<T>> {
        if self.send(job).is_err() {
            return Ok(Batched::Unsent);
        }
        match replied.await {
            Ok(Ok(Some(done))) => Ok(Batched::Applied(done)),
            Ok(Ok(None)) => Ok(Batched::Refused),
            Ok(Err(e)) => Err(e),
            Err(_) => Ok(Batched::Unsent),
        }
    }

    /// Counts a statement that ran with `carried` requests.
    fn count(&self, carried: usize) {
        self.batches.fetch_add(1, Relaxed);
        self.carried.fetch_add(carried as u64, Relaxed);
    }

    /// Statements run, and the requests they carried (metrics).
    pub(crate) fn counts(&self) -> (u64, u64) {
        (self.batches.load(Relaxed), self.carried.load(Relaxed))
    }
}

/// Grant attempts of free keys, batched.
pub(crate) type Grants = Batcher<GrantJob>;

/// Releases of keys nobody waits for, batched.
pub(crate) type Releases = Batcher<ReleaseJob>;

/// What became of a request sent through a batch.
pub(crate) enum Batched<T> {
    /// Its statement applied it.
    Applied(T),
    /// Its statement ran and did not apply it (the single path explains why).
    Refused,
    /// No statement ran for it (batching is off, or the batcher is gone).
    Unsent,
}

/// Takes queued jobs in batches of at most `max` until the queue closes,
/// with at most `slots` batches running at once: while they run, the next
/// batch grows.
pub(crate) async fn run_batches<J, F, Fut>(
    mut queue: mpsc::UnboundedReceiver<J>,
    max: usize,
    slots: usize,
    run: F,
) where
    J: Send + 'static,
    F: Fn(Vec<J>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let running = Arc::new(Semaphore::new(slots.max(1)));
    while let Some(first) = queue.recv().await {
        let Ok(slot) = running.clone().acquire_owned().await else {
            return;
        };
        let mut batch = vec![first];
        while batch.len() < max {
            match queue.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let batch = run(batch);
        tokio::spawn(async move {
            batch.await;
            drop(slot);
        });
    }
}

/// One Acquire's grant attempt, waiting for a batch.
pub(crate) struct GrantJob {
    request: Acquire,
    max_recoveries: Option<i32>,
    /// The grant, `None` when the batch did not apply it, or the batch's
    /// failure.
    reply: oneshot::Sender<Result<Option<Grant>>>,
}

/// One Release, waiting for a batch.
pub(crate) struct ReleaseJob {
    key: Key,
    fence: Fence,
    lease_id: LeaseId,
    end: TermEnd,
    handoff: Option<Handoff>,
    /// The ended term, `None` when the batch did not apply it, or the
    /// batch's failure.
    reply: oneshot::Sender<Result<Option<EndedTerm>>>,
}

impl<J: Job> Batcher<J> {
    /// Drops the jobs whose key an earlier job of the batch has (they are
    /// answered `None` and go alone), and indexes the rest by key.
    pub(crate) fn distinct(batch: Vec<J>) -> (Vec<J>, HashMap<String, usize>) {
        let mut seen: HashMap<String, usize> = HashMap::with_capacity(batch.len());
        let mut jobs = Vec::with_capacity(batch.len());
        for job in batch {
            let k = job.key().as_str();
            if seen.contains_key(k) {
                job.reply(Ok(None));
            } else {
                seen.insert(k.to_owned(), jobs.len());
                jobs.push(job);
            }
        }
        (jobs, seen)
    }

    /// Answers every job of a batch from what its statement returned, and
    /// counts the statement if it ran: a job whose key came back gets
    /// `outcome` of its row, the others `None` (the statement did not apply
    /// them; they go on alone); when the statement failed, every job gets
    /// its error.
    pub(crate) fn answer(
        &self,
        jobs: Vec<J>,
        index: &HashMap<String, usize>,
        applied: Result<Vec<tokio_postgres::Row>>,
        outcome: impl Fn(&J, &tokio_postgres::Row) -> Result<J::Done>,
    ) {
        let rows = match applied {
            Ok(rows) => rows,
            Err(e) => {
                for job in jobs {
                    job.reply(Err(e.clone()));
                }
                return;
            }
        };
        self.count(jobs.len());
        let mut outcomes: Vec<Option<Result<J::Done>>> = jobs.iter().map(|_| None).collect();
        for row in &rows {
            let key: String = row.get("key");
            if let Some(&i) = index.get(key.as_str()) {
                outcomes[i] = Some(outcome(&jobs[i], row));
            }
        }
        for (job, outcome) in jobs.into_iter().zip(outcomes) {
            job.reply(outcome.transpose());
        }
    }
}

impl Job for GrantJob {
    type Done = Grant;
    fn key(&self) -> &Key {
        &self.request.key
    }
    fn reply(self, outcome: Result<Option<Grant>>) {
        // The request may have gone (its client left): nobody to answer.
        let _ = self.reply.send(outcome);
    }
}

impl Job for ReleaseJob {
    type Done = EndedTerm;
    fn key(&self) -> &Key {
        &self.key
    }
    fn reply(self, outcome: Result<Option<EndedTerm>>) {
        let _ = self.reply.send(outcome);
    }
}

impl Grants {
    /// Tries to grant `request` through a batch (the common case: a free
    /// key and nobody in line), with the recovery limit `max_recoveries`.
    pub(crate) async fn grant(
        &self,
        request: &Acquire,
        max_recoveries: Option<i32>,
    ) -> Result<Batched<Grant>> {
        let (reply, replied) = oneshot::channel();
        let job = GrantJob {
            request: request.clone(),
            max_recoveries,
            reply,
        };
        self.ask(job, replied).await
    }

    /// Applies a batch of grant attempts in one statement and answers each.
    pub(crate) async fn run(&self, db: &Db, batch: Vec<GrantJob>) {
        let (jobs, index) = Self::distinct(batch);
        let requests: Vec<(&Acquire, Option<i32>)> = jobs
            .iter()
            .map(|j| (&j.request, j.max_recoveries))
            .collect();
        let applied = in_time(db.config.op_timeout, async {
            let client = db.client().await?;
            grant_rows(db, &client, &requests).await
        })
        .await;
        drop(requests);
        self.answer(jobs, &index, applied, |j, row| grant_of(&j.request, row));
    }
}

/// Runs [`sql::GRANT`] for `requests` (distinct keys) with
/// `max_recoveries` each, on `client`: the grants made, by key. The batch
/// and the single Acquire (`acquire`) share it.
pub(crate) async fn grant_rows(
    db: &Db,
    client: &Client,
    requests: &[(&Acquire, Option<i32>)],
) -> Result<Vec<tokio_postgres::Row>> {
    let keys: Vec<&str> = requests.iter().map(|(r, _)| r.key.as_str()).collect();
    let owners: Vec<&str> = requests.iter().map(|(r, _)| r.owner.as_str()).collect();
    let lease_ids: Vec<uuid::Uuid> = requests.iter().map(|_| LeaseId::random().0).collect();
    let request_ids: Vec<Option<&str>> = requests
        .iter()
        .map(|(r, _)| r.request_id.as_ref().map(|id| id.as_str()))
        .collect();
    let ttls: Vec<i64> = requests
        .iter()
        .map(|(r, _)| r.ttl.as_millis() as i64)
        .collect();
    let lock_delays: Vec<i64> = requests
        .iter()
        .map(|(r, _)| r.options.lock_delay_ms.min(i64::MAX as u64) as i64)
        .collect();
    let max_recoveries: Vec<Option<i32>> = requests.iter().map(|(_, m)| *m).collect();
    let forces: Vec<bool> = requests.iter().map(|(r, _)| r.options.force).collect();
    let stmt = client.prepare_cached(sql::GRANT).await.map_err(db_error)?;
    client
        .query(
            &stmt,
            &[
                &keys,
                &owners,
                &lease_ids,
                &request_ids,
                &ttls,
                &lock_delays,
                &max_recoveries,
                &forces,
                &db.history_len(),
            ],
        )
        .await
        .map_err(db_error)
}

impl Releases {
    /// Releases through a batch, or alone in one statement when batching is
    /// off: `None` when the key has someone in line or the term is not the
    /// live one (the transaction path then serves the line or explains).
    pub(crate) async fn release(
        &self,
        db: &Db,
        key: &Key,
        fence: Fence,
        lease_id: LeaseId,
        end: TermEnd,
        handoff: Option<&Handoff>,
    ) -> Result<Option<EndedTerm>> {
        let (reply, replied) = oneshot::channel();
        let job = ReleaseJob {
            key: key.clone(),
            fence,
            lease_id,
            end,
            handoff: handoff.cloned(),
            reply,
        };
        match self.send(job) {
            // A batch dropped unanswered (the server is stopping) counts as
            // not applied: the transaction path's release is conditional
            // too, and finds a release that did commit.
            Ok(()) => return replied.await.unwrap_or(Ok(None)),
            Err(job) => self.run(db, vec![job]).await,
        }
        replied.await.unwrap_or(Ok(None))
    }

    /// Applies a batch of releases in one statement and answers each.
    pub(crate) async fn run(&self, db: &Db, batch: Vec<ReleaseJob>) {
        let (jobs, index) = Self::distinct(batch);
        let keys: Vec<&str> = jobs.iter().map(|j| j.key.as_str()).collect();
        let fences: Vec<i64> = jobs.iter().map(|j| j.fence.0 as i64).collect();
        let lease_ids: Vec<uuid::Uuid> = jobs.iter().map(|j| j.lease_id.0).collect();
        let ends: Vec<i16> = jobs.iter().map(|j| j.end.code()).collect();
        let successors: Vec<Option<&str>> = jobs
            .iter()
            .map(|j| j.handoff.as_ref().map(|h| h.successor.as_str()))
            .collect();
        let handoff_ms: Vec<i64> = jobs
            .iter()
            .map(|j| {
                j.handoff
                    .as_ref()
                    .map_or(0, |h| h.for_ms.min(i64::MAX as u64) as i64)
            })
            .collect();
        let applied = in_time(db.config.op_timeout, async {
            let client = db.client().await?;
            // One key needs no lock in key order first (see RELEASE_ONE).
            let text = if keys.len() == 1 {
                sql::RELEASE_ONE
            } else {
                sql::RELEASE_MANY
            };
            let stmt = client.prepare_cached(text).await.map_err(db_error)?;
            client
                .query(
                    &stmt,
                    &[
                        &keys,
                        &fences,
                        &lease_ids,
                        &ends,
                        &successors,
                        &handoff_ms,
                        &db.history_len(),
                        &db.channel,
                    ],
                )
                .await
                .map_err(db_error)
        })
        .await;
        drop((keys, successors));
        self.answer(jobs, &index, applied, |_, row| {
            KeyRow::from_row(row).and_then(|r| {
                r.last_ended
                    .ok_or_else(|| Error::Storage("a release returned no ended term".into()))
            })
        });
    }
}

/// The grant of `request` that row `row` (returned by [`sql::GRANT`])
/// records.
pub(crate) fn grant_of(request: &Acquire, row: &tokio_postgres::Row) -> Result<Grant> {
    let stored = KeyRow::from_row(row)?;
    let term = stored
        .live
        .ok_or_else(|| Error::Storage("a grant returned no term".into()))?;
    Ok(Grant {
        key: request.key.clone(),
        term,
        previous: stored.last_ended,
        replayed: false,
        unsettled_tool_calls: row.get::<_, i64>("unsettled") as usize,
        visible_seq: 0,
    })
}
