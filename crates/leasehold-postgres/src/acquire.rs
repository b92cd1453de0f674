//! Acquire: the grant now (or a replay, or the refusal), else a wait in
//! line. A waiting Acquire is a row of `waiters`; whoever finds a key free
//! with someone alive in line grants it to the first of them (in the
//! transaction that marks the row granted and notifies the key), and the
//! waiting request picks its grant up when woken ([`Line`], fed by
//! `listen`), at its holder's deadline, or after a poll interval.

use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::sync::broadcast;

use leasehold_core::clock::Millis;
use leasehold_core::error::{Error, Held, Result};
use leasehold_core::lease::{Fence, Key, LeaseId, Lifecycle, Reservation, Term, TermEnd};
use leasehold_core::lessor::{Acquire, Grant, line_full};

use crate::batch::{self, Batched, Grants};
use crate::db::{Client, Db, RACE_RETRIES, Snapshot, closed, db_error};
use crate::key_row::{self, millis};
use crate::listen;
use crate::order::Turn;
use crate::sql;

/// The wake-ups of this server's waiting Acquires: every key any server
/// notified (`listen` sends them; each waiter filters its own).
pub(crate) struct Line {
    wakes: broadcast::Sender<listen::Wake>,
}

impl Db {
    /// The recovery limit a term granted for `request` carries: its own,
    /// or this server's default.
    pub(crate) fn max_recoveries(&self, request: &Acquire) -> Option<i32> {
        request
            .options
            .max_recoveries
            .or(self.config.default_max_recoveries)
            .filter(|&k| k > 0)
            .map(|k| k.min(i32::MAX as u32) as i32)
    }

    /// The refusal of an Acquire of quarantined `key` after `failures`
    /// failed terms in a row, naming them (the core's wording).
    pub(crate) async fn quarantined(
        &self,
        client: &Client,
        key: &Key,
        failures: u32,
    ) -> Result<Error> {
        let stmt = client
            .prepare_cached(sql::RECENT_ENDS)
            .await
            .map_err(db_error)?;
        let shown = i64::from(failures).min(self.history_len());
        let rows = client
            .query(&stmt, &[&key.as_str(), &shown])
            .await
            .map_err(db_error)?;
        let mut recent = Vec::with_capacity(rows.len());
        for row in rows.iter().rev() {
            let end = match key_row::term_end(row.get("end_kind"))? {
                TermEnd::Released => "released",
                TermEnd::Suspended => "suspended",
                TermEnd::Expired => "expired",
            };
            let fence = key_row::fence_of(row.get("fence"));
            recent.push(format!("fence {fence} {end}"));
        }
        Ok(Error::Quarantined {
            key: key.clone(),
            failures,
            recent: recent.join(", "),
        })
    }

    /// The part of an Acquire that does not wait: the grant, a replay, or
    /// the refusal: busy, reserved (lock-delay, handoff) or quarantined. A
    /// free key with people in line goes to them first, but the successor
    /// a handoff names goes ahead of them.
    pub(crate) async fn acquire_now(
        &self,
        client: &mut Client,
        request: &Acquire,
        grant_tried: bool,
    ) -> Result<Grant> {
        let max_recoveries = self.max_recoveries(request);
        for attempt in 0..RACE_RETRIES {
            // A grant its batch just refused goes straight to the read.
            if attempt > 0 || !grant_tried {
                let rows = batch::grant_rows(self, client, &[(request, max_recoveries)]).await?;
                if let Some(row) = rows.first() {
                    return batch::grant_of(request, row);
                }
            }
            // Moves an expiry nobody recorded yet, and serves the line: a
            // free key with people in line goes to them first, and the next
            // look finds it held by the first of them.
            let snapshot = self.read_key_served(client, &request.key).await?;
            if let Some(term) = &snapshot.key.live {
                if replay_of(request, &snapshot).is_some() {
                    match self.replay(client, request, term.fence).await? {
                        Some(replay) => return Ok(replay),
                        // Undone just before it was taken: look again.
                        None => continue,
                    }
                }
                return Err(Error::Busy {
                    key: request.key.clone(),
                    holder: term.owner.clone(),
                    fence: term.fence,
                    remaining_ms: term.expires_at.saturating_sub(snapshot.now),
                });
            }
            if let Some(refusal) = self.refusal_of_free(client, request, &snapshot).await? {
                return Err(refusal);
            }
        }
        Err(Error::Unavailable(format!(
            "key {:?} changed {RACE_RETRIES} times while acquiring it; retry",
            request.key
        )))
    }

    /// The replay of `request`, whose earlier grant is the key's live term
    /// `fence` as last read, once it can no longer be undone: a grant to a
    /// waiter row nobody took yet (its server died, say, and this is the
    /// client's retry) is taken first (`sql::TAKE_REPLAYED`), and the key
    /// read again, since a sweep may have undone the grant just before
    /// (`sql::UNDO_UNTAKEN`). `None` when it is no longer live.
    pub(crate) async fn replay(
        &self,
        client: &Client,
        request: &Acquire,
        fence: Fence,
    ) -> Result<Option<Grant>> {
        let take = client
            .prepare_cached(sql::TAKE_REPLAYED)
            .await
            .map_err(db_error)?;
        client
            .execute(&take, &[&request.key.as_str(), &(fence.0 as i64)])
            .await
            .map_err(db_error)?;
        let again = self.read_key(client, &request.key).await?;
        Ok(replay_of(request, &again).filter(|replay| replay.term.fence == fence))
    }

    /// Why `request` may not take the free key of `snapshot` (quarantined,
    /// or reserved for someone else or for nobody), or `None` if it may.
    async fn refusal_of_free(
        &self,
        client: &Client,
        request: &Acquire,
        snapshot: &Snapshot,
    ) -> Result<Option<Error>> {
        let state = &snapshot.key;
        if state.quarantined && !request.options.force {
            return self
                .quarantined(client, &request.key, state.failures)
                .await
                .map(Some);
        }
        Ok(reserved_refusal(request, snapshot))
    }

    /// Puts `request` in line for its wait: its row's id and when its wait
    /// ends.
    ///
    /// The count and the insert are one statement, after the key's line
    /// lock (`sql::LOCK_LINE`) in the same transaction, so Acquires joining
    /// at once through any servers cannot all take the last place. The four
    /// statements (BEGIN, the lock, the enqueue, COMMIT) are sent together:
    /// tokio-postgres pipelines them, so this is one round trip, as the
    /// single autocommit insert was. They are joined, not tried: each is
    /// sent when first polled, and `join!` (biased: in order) polls every
    /// one even when an earlier one fails, so the COMMIT is always sent
    /// after the BEGIN and no connection goes back to the pool inside a
    /// transaction holding the lock (`try_join!` would stop at the first
    /// error, possibly before the COMMIT was sent).
    ///
    /// # Errors
    /// [`Error::ResourceExhausted`] (`waiters_per_key`, the core's wording)
    /// when [`PgConfig::max_waiters_per_key`](crate::PgConfig::max_waiters_per_key) Acquires already wait for the
    /// key, on any server; UNAVAILABLE or INTERNAL from the database.
    async fn enqueue(&self, client: &Client, request: &Acquire) -> Result<(i64, Millis)> {
        let lock = client
            .prepare_cached(sql::LOCK_LINE)
            .await
            .map_err(db_error)?;
        let enqueue = client
            .prepare_cached(sql::ENQUEUE)
            .await
            .map_err(db_error)?;
        let line = format!(
            "leasehold-line:{}:{}",
            self.config.schema,
            request.key.as_str()
        );
        let max = self.config.max_waiters_per_key.min(i64::MAX as usize) as i64;
        let wait = request.wait.as_millis() as i64;
        let lease = self.config.waiter_lease.as_millis() as i64;
        let lock_delay = request.options.lock_delay_ms.min(i64::MAX as u64) as i64;
        let line: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&line];
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 10] = [
            &request.key.as_str(),
            &request.owner.as_str(),
            &(request.ttl.as_millis() as i64),
            &request.request_id.as_ref().map(|r| r.as_str()),
            &wait,
            &lease,
            &lock_delay,
            &self.max_recoveries(request),
            &request.options.force,
            &max,
        ];
        // `biased`: polled in this order, so sent in this order.
        let (begun, locked, row, committed) = tokio::join!(
            biased;
            client.batch_execute("BEGIN"),
            client.execute(&lock, &line),
            client.query_one(&enqueue, &params),
            client.batch_execute("COMMIT"),
        );
        // The first failure is the cause; the later ones follow from it.
        begun.map_err(db_error)?;
        locked.map_err(db_error)?;
        let row = row.map_err(db_error)?;
        committed.map_err(db_error)?;
        let Some(id) = row.get::<_, Option<i64>>("id") else {
            let waiting: i64 = row.get("waiting");
            return Err(line_full(&request.key, waiting as usize));
        };
        Ok((id, millis(row.get("wait_until_ms"))))
    }

    /// Leaves the line; returns the grant if one raced in first.
    pub(crate) async fn leave_line(
        &self,
        client: &Client,
        place: &mut PlaceInLine,
        request: &Acquire,
    ) -> Result<Option<Grant>> {
        let leave = client
            .prepare_cached(sql::LEAVE_UNGRANTED)
            .await
            .map_err(db_error)?;
        let left = client
            .query_opt(&leave, &[&place.id])
            .await
            .map_err(db_error)?;
        if left.is_some() {
            place.armed = false;
            return Ok(None);
        }
        let fetch = client
            .prepare_cached(sql::WAITER_GRANT)
            .await
            .map_err(db_error)?;
        let Some(mine) = client
            .query_opt(&fetch, &[&place.id])
            .await
            .map_err(db_error)?
        else {
            place.armed = false;
            return Ok(None);
        };
        let Some(fence) = mine.get::<_, Option<i64>>("granted_fence") else {
            return Ok(None);
        };
        let snapshot = self.read_key(client, &request.key).await?;
        let grant = granted(
            request,
            self.max_recoveries(request),
            &mine,
            fence,
            &snapshot,
        )?;
        place.leave(client).await;
        Ok(Some(grant))
    }
}

impl Line {
    pub(crate) fn new(wakes: broadcast::Sender<listen::Wake>) -> Line {
        Line { wakes }
    }

    /// An Acquire, waiting in line up to `request.wait` when the key is
    /// held or reserved. `applied` is signalled once the request is granted, refused or
    /// in line.
    pub(crate) async fn acquire(
        &self,
        db: &Db,
        grants: &Grants,
        request: Acquire,
        applied: Turn,
    ) -> Result<Grant> {
        let wakes = self.wakes.subscribe();
        // The common case, a free key with nobody in line: one statement
        // shared with this server's other Acquires (see `batch`), taken
        // before a connection of its own.
        let grant_tried = match grants.grant(&request, db.max_recoveries(&request)).await? {
            Batched::Applied(grant) => return Ok(grant),
            Batched::Refused => true,
            Batched::Unsent => false,
        };
        let mut client = db.client().await?;
        let first = db.acquire_now(&mut client, &request, grant_tried).await;
        let wait = request.wait.as_millis();
        // A reserved key keeps its line (waiters keep their places through
        // a lock-delay, and come after the successor); a quarantined one
        // sends everyone away.
        let busy = match first {
            Err(busy @ (Error::Busy { .. } | Error::Reserved { .. })) if wait > 0 => busy,
            other => return other,
        };
        if *db.closing.borrow() {
            return Err(closed());
        }
        // A full line refuses the wait (RESOURCE_EXHAUSTED) rather than the
        // Acquire being busy: as on SQLite, the client learns that waiting
        // is what it may not do.
        let (id, until) = db.enqueue(&client, &request).await?;
        let place = PlaceInLine {
            pool: db.pool.clone(),
            id,
            armed: true,
        };
        drop(applied);
        drop(busy);
        wait_in_line(db, client, request, place, until, wakes).await
    }
}

/// Waits in line until granted, replayed, the wait runs out (then one
/// last look, as the SQLite engine), or the server closes.
async fn wait_in_line(
    db: &Db,
    mut client: Client,
    request: Acquire,
    mut place: PlaceInLine,
    until: Millis,
    mut wakes: broadcast::Receiver<listen::Wake>,
) -> Result<Grant> {
    let mut closing = db.closing.subscribe();
    let lease = db.config.waiter_lease.as_millis() as i64;
    loop {
        if *closing.borrow() {
            return match db.leave_line(&client, &mut place, &request).await? {
                Some(grant) => Ok(grant),
                None => Err(closed()),
            };
        }
        db.serve_first(&mut client, &request.key).await?;
        let heartbeat = client
            .prepare_cached(sql::HEARTBEAT)
            .await
            .map_err(db_error)?;
        let mine = client
            .query_opt(&heartbeat, &[&place.id, &lease])
            .await
            .map_err(db_error)?;
        let snapshot = db.read_key(&client, &request.key).await?;
        let Some(mine) = mine else {
            // Our row is gone (removed as dead after a long stall): take
            // one last look instead of waiting on nothing.
            place.armed = false;
            return db.acquire_now(&mut client, &request, false).await;
        };
        if let Some(fence) = mine.get::<_, Option<i64>>("granted_fence") {
            let grant = granted(
                &request,
                db.max_recoveries(&request),
                &mine,
                fence,
                &snapshot,
            )?;
            place.leave(&client).await;
            return Ok(grant);
        }
        if let Some(fence) = replay_of(&request, &snapshot).map(|r| r.term.fence)
            && let Some(replay) = db.replay(&client, &request, fence).await?
        {
            place.leave(&client).await;
            return Ok(replay);
        }
        let shut = snapshot.key.live.is_none() && snapshot.key.quarantined;
        if mine.get::<_, bool>("refused") || (shut && !request.options.force) {
            // The key became quarantined while we waited: nobody but a
            // forced Acquire gets it (see `sql::SERVE_FIRST`), so say so
            // now rather than at the end of the wait.
            let failures = snapshot.key.failures.max(1);
            let refusal = db.quarantined(&client, &request.key, failures).await?;
            return match db.leave_line(&client, &mut place, &request).await? {
                Some(grant) => Ok(grant),
                None => Err(refusal),
            };
        }
        let now = snapshot.now;
        if now >= until {
            return match db.leave_line(&client, &mut place, &request).await? {
                Some(grant) => Ok(grant),
                None => db.acquire_now(&mut client, &request, false).await,
            };
        }
        let mut sleep = Duration::from_millis(until - now).min(db.config.poll);
        if let Some(term) = &snapshot.key.live {
            // Wake when the holder's term runs out, if nobody renews it.
            let left = Duration::from_millis(term.expires_at.saturating_sub(now) + 1);
            sleep = sleep.min(left);
        }
        if let Some(reservation) = &snapshot.key.reservation {
            // Look again when a lock-delay or handoff runs out: nobody
            // notifies that.
            let left = Duration::from_millis(reservation.until().saturating_sub(now) + 1);
            sleep = sleep.min(left);
        }
        // Return the connection to the pool while asleep.
        drop(client);
        let woken = async {
            loop {
                match wakes.recv().await {
                    Ok(key) if key == request.key.as_str() || key == listen::WAKE_ALL => {
                        return;
                    }
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(_)) => return,
                    Err(broadcast::error::RecvError::Closed) => {
                        std::future::pending::<()>().await;
                    }
                }
            }
        };
        tokio::select! {
            () = woken => {}
            () = tokio::time::sleep(sleep) => {}
            _ = closing.changed() => {}
        }
        client = db.client().await?;
    }
}

/// The refusal of `request` by a reservation of the free key of
/// `snapshot` in force now: a lock-delay keeps everyone out, a handoff
/// everyone but its successor.
fn reserved_refusal(request: &Acquire, snapshot: &Snapshot) -> Option<Error> {
    let reservation = snapshot.key.reservation.as_ref()?;
    let held = match reservation {
        Reservation::Handoff { successor, .. } if *successor == request.owner => return None,
        Reservation::Handoff { successor, .. } => Held::Handoff {
            successor: successor.clone(),
        },
        Reservation::LockDelay { after, .. } => Held::LockDelay { after: *after },
    };
    Some(Error::Reserved {
        key: request.key.clone(),
        reservation: held,
        remaining_ms: reservation.until().saturating_sub(snapshot.now),
    })
}

/// The replay of `request` if the key's live term is its earlier grant
/// (same owner and request id).
pub(crate) fn replay_of(request: &Acquire, snapshot: &Snapshot) -> Option<Grant> {
    let term = snapshot.key.live.as_ref()?;
    (request.request_id.is_some()
        && term.request_id == request.request_id
        && term.owner == request.owner)
        .then(|| Grant {
            key: request.key.clone(),
            term: term.clone(),
            previous: snapshot.key.last_ended.clone(),
            replayed: true,
            unsettled_tool_calls: snapshot.unsettled,
            visible_seq: 0,
        })
}

/// The grant a waiter row received. `previous` is known while the term is
/// still the key's live one (it nearly always is: the waiter picks it up at
/// once).
pub(crate) fn granted(
    request: &Acquire,
    max_recoveries: Option<i32>,
    mine: &tokio_postgres::Row,
    fence: i64,
    snapshot: &Snapshot,
) -> Result<Grant> {
    let fence = key_row::fence_of(fence);
    let term = Term {
        fence,
        owner: request.owner.clone(),
        lease_id: LeaseId(mine.get("granted_lease_id")),
        request_id: request.request_id.clone(),
        ttl: request.ttl,
        acquired_at: millis(mine.get("granted_acquired_at_ms")),
        expires_at: millis(mine.get("granted_expires_at_ms")),
        lifecycle: Lifecycle {
            lock_delay_ms: request.options.lock_delay_ms,
            max_recoveries: max_recoveries.map(|k| k as u32),
            handed_off: mine.get("granted_handed_off"),
        },
    };
    let current = snapshot.key.live.as_ref().is_some_and(|t| t.fence == fence);
    Ok(Grant {
        key: request.key.clone(),
        term,
        previous: if current {
            snapshot.key.last_ended.clone()
        } else {
            None
        },
        replayed: false,
        unsettled_tool_calls: snapshot.unsettled,
        visible_seq: 0,
    })
}

/// A waiting Acquire's row in `waiters`. Dropping it (the request's future
/// was dropped: the client cancelled, its deadline passed, its stream
/// closed) deletes the row, so the line moves on at once; a row granted
/// meanwhile that this request never took is lapsed instead, and the next
/// sweep undoes its grant (`sql::LAPSE_UNTAKEN`).
pub(crate) struct PlaceInLine {
    pool: Pool,
    id: i64,
    /// False once the row is gone some other way.
    armed: bool,
}

impl PlaceInLine {
    /// Deletes the row now (after its grant was picked up).
    pub(crate) async fn leave(&mut self, client: &Client) {
        self.armed = false;
        if let Ok(stmt) = client.prepare_cached(sql::LEAVE).await {
            // A row left behind lapses with its heartbeat and is swept.
            let _ = client.execute(&stmt, &[&self.id]).await;
        }
    }
}

impl Drop for PlaceInLine {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (pool, id) = (self.pool.clone(), self.id);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Ok(client) = pool.get().await {
                    // A row left behind lapses with its heartbeat: an
                    // ungranted one drops out of line, an untaken grant
                    // is undone, a taken one is swept.
                    if let Ok(0) = client.execute(sql::LEAVE_CANCELLED, &[&id]).await {
                        let _ = client.execute(sql::LAPSE_UNTAKEN, &[&id]).await;
                    }
                }
            });
        }
    }
}
