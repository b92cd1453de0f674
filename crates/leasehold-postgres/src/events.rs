//! Watch on PostgreSQL: the event log in the database, its sequencer, and
//! each server's feed to its watchers.
//!
//! # Revisions in commit order
//! Every statement that changes a key's ownership (a grant, a release, the
//! move of an expired term, forgetting a key) also queues the change's
//! events in `event_queue`, in the same statement, so an event exists
//! exactly when its change committed. Queued events have no revision yet:
//! a sequence drawn inside the writing transaction would not follow commit
//! order (one transaction draws 7, another draws 8 and commits first; a
//! watcher that saw 8 could never be given 7). Revisions are given by the
//! **sequencer** ([`sequence`], one statement: [`sql::SEQUENCE_EVENTS`]),
//! which any server runs, one at a time (it locks the single `event_head`
//! row): it moves every queued event its statement can see to `events` with
//! the next revisions. What it sees has
//! committed; a transaction still running is invisible to it and gets
//! later revisions once it commits. Watchers read `events` only, so the
//! revisions they can see are always a prefix `1..=head`, and a watcher
//! that saw revision R never later meets an event numbered R or less.
//!
//! Two changes of one key are numbered in the order they committed: the
//! second locked the key's row after the first committed, and queued its
//! events (drawing their ids) after that, and the sequencer numbers in id
//! order. Changes of different keys made at overlapping times are numbered
//! in one of their possible orders. No two leasehold servers ever need to
//! agree on anything: the sequencer's lock and the rows decide.
//!
//! # Rows of many events
//! The sequencer writes what it numbers as rows of up to [`EVENTS_PER_ROW`]
//! events (arrays, revisions `revision ..` in array order; migration 0007),
//! not one row per event: a row per event cost an insert, an index entry
//! and a delete for each of the two events of a lock cycle (#12). Rows of
//! one event in the scalar columns, as servers before version 7 wrote them,
//! are read the same way. A read unnests only the rows that can hold the
//! page it asks for; the trim cuts the row the cut falls inside, so the
//! oldest revision kept is exact.
//!
//! # When events appear
//! Every server sequences at each sweep (so the queue stays short with
//! nobody watching), and a server with watchers also sequences and reads
//! the log every [`PgConfig::watch_poll`](crate::PgConfig::watch_poll). An expiry is an event once a
//! statement moves the term (the sweeper, within its period, or whoever
//! touches the key first); that statement alone queues it.
//!
//! # The feed
//! Each server reads the log once for all its watchers ([`Feed`]), and only
//! while it has some. A watcher first reads the log itself from its start
//! revision (a compacted start is OUT_OF_RANGE with the oldest kept), then
//! subscribes to the feed and reads the log once more, so whatever the feed
//! published before it subscribed is covered; it skips revisions it has
//! seen, so nothing comes twice. A watcher that falls more than
//! `--watch-buffer` feed items behind is cut off with RESOURCE_EXHAUSTED
//! naming the revision to resume from, as on SQLite.
//!
//! # Bounds
//! The log is trimmed to the newest `--event-log-len` revisions of the
//! server that trims: at every sweep, and by a feed after it numbered
//! events; the oldest revision reported is the oldest row left. A feed that finds the log trimmed past its position restarts, and
//! its watchers go back to the log, which tells them OUT_OF_RANGE.

use std::sync::{Arc, Mutex};

use futures_util::stream::{self, StreamExt};
use tokio::sync::broadcast;

use leasehold_core::error::{Error, Result};
use leasehold_core::events::{Event, Selector};

use leasehold_backend::{Commit, Watching, cut_off};

use crate::db::{Client, Db, db_error, in_time};
use crate::{key_row, sql};

/// Events read from the log by one statement (and so at most one feed item).
const PAGE: usize = 256;

/// Queue rows one sequencer statement moves at most (each holds one
/// event, or one statement's events: at most a batch, or a sweep's 1000).
const SEQUENCE_BATCH: i64 = 1_000;

/// Events the sequencer puts in one log row at most (migration 0007): a
/// page of [`PAGE`] events then reads at most two rows it does not need
/// whole, however large the backlog it numbered at once.
const EVENTS_PER_ROW: i64 = 256;

/// Pages the feed reads per poll at most, so one poll cannot run long.
const PAGES_PER_POLL: usize = 16;

/// This server's feed of new events, shared by its watchers: where it
/// reads the log from, and the channel its watchers follow.
pub(crate) struct Feed {
    state: Mutex<TailState>,
    /// How many items the feed holds for a slow watcher.
    buffer: usize,
}

struct TailState {
    /// The highest revision published on `live`; `None` while nobody
    /// follows (the feed then reads nothing, and the first watcher to
    /// subscribe says where to start).
    position: Option<u64>,
    live: broadcast::Sender<Commit>,
}

impl Feed {
    pub(crate) fn new(buffer: usize) -> Feed {
        let buffer = buffer.max(1);
        Feed {
            state: Mutex::new(TailState {
                position: None,
                live: broadcast::channel(buffer).0,
            }),
            buffer,
        }
    }

    /// Follows the feed. When nobody followed it, it starts after `head`, a
    /// head of the log the caller read (so at most the database's head now:
    /// the caller's own read of the log after this covers the rest).
    fn subscribe(&self, head: u64) -> broadcast::Receiver<Commit> {
        let mut state = self.state.lock().expect("feed lock");
        if state.position.is_none() {
            state.position = Some(head);
        }
        state.live.subscribe()
    }

    /// Where the feed reads from next, or `None` when nobody follows it (it
    /// then forgets its position).
    fn position(&self) -> Option<u64> {
        let mut state = self.state.lock().expect("feed lock");
        if state.live.receiver_count() == 0 {
            state.position = None;
        }
        state.position
    }

    /// Publishes the events read after `from`, if the feed is still there.
    fn publish(&self, from: u64, events: Vec<Event>) {
        let Some(last) = events.last().map(|e| e.revision) else {
            return;
        };
        let mut state = self.state.lock().expect("feed lock");
        if state.position == Some(from) {
            state.position = Some(last);
            // No receiver is fine: the last watcher just left.
            let _ = state.live.send(events.into());
        }
    }

    /// Closes the feed (its followers go back to the log) and starts a new
    /// one with nobody following.
    fn restart(&self) {
        let mut state = self.state.lock().expect("feed lock");
        state.position = None;
        state.live = broadcast::channel(self.buffer).0;
    }

    /// Watchers following the feed, and the highest revision it published.
    pub(crate) fn stats(&self) -> (usize, u64) {
        let state = self.state.lock().expect("feed lock");
        (state.live.receiver_count(), state.position.unwrap_or(0))
    }
}

/// One read of the log.
struct Page {
    /// The highest revision given.
    head: u64,
    /// The oldest revision kept (`head + 1` when the log is empty).
    oldest: u64,
    /// Up to [`PAGE`] events after the revision asked for, in order.
    events: Vec<Event>,
}

impl Feed {
    /// Starts a watch of `selector` from revision `start` (0: from now on).
    ///
    /// # Errors
    /// [`Error::Compacted`] when `start` is older than the log keeps;
    /// [`Error::Unavailable`] when the database cannot be reached.
    pub(crate) async fn watch(
        self: Arc<Self>,
        db: Arc<Db>,
        selector: Selector,
        start: u64,
    ) -> Result<Watching> {
        let client = db.client().await?;
        let now = read_events(&client, u64::MAX, 0).await?;
        drop(client);
        if start != 0 && start < now.oldest {
            return Err(Error::Compacted {
                requested: start,
                oldest: now.oldest,
            });
        }
        let watcher = Watcher {
            seen: if start == 0 { now.head } else { start - 1 },
            db,
            feed: self,
            selector,
            phase: Phase::CatchUp(None),
        };
        let events = stream::unfold(watcher, |mut watcher| async move {
            let item = watcher.next().await?;
            Some((item, watcher))
        });
        Ok(Watching {
            revision: now.head,
            events: events.boxed(),
        })
    }

    /// Feeds this server's watchers: every [`PgConfig::watch_poll`](crate::PgConfig::watch_poll) while
    /// anyone follows the feed, sequences and publishes what is new.
    pub(crate) async fn run(self: Arc<Self>, db: Arc<Db>) {
        let mut tick = tokio::time::interval(db.config.watch_poll);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tick.tick().await;
            if self.position().is_none() {
                continue;
            }
            match in_time(db.config.op_timeout, self.poll(&db)).await {
                Ok(()) => failing = false,
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(error = %e, "reading the event log failed; trying again");
                }
                Err(_) => {}
            }
        }
    }

    /// One poll of the feed.
    async fn poll(&self, db: &Db) -> Result<()> {
        let client = db.client().await?;
        if sequence(&client).await? > 0 {
            // One batch: the sweeps work off a longer backlog.
            trim(&client, db.config.event_log_len, POLL_TRIM_ROWS).await?;
        }
        for _ in 0..PAGES_PER_POLL {
            let Some(from) = self.position() else {
                return Ok(());
            };
            let page = read_events(&client, from, PAGE).await?;
            if from + 1 < page.oldest {
                // Trimmed past the feed (it was stopped longer than the log
                // is long): its watchers must hear it from the log.
                self.restart();
                return Ok(());
            }
            let full = page.events.len() == PAGE;
            self.publish(from, page.events);
            if !full {
                return Ok(());
            }
        }
        Ok(())
    }
}

/// Gives revisions to the queued events (see the module docs); returns
/// how many it numbered. When it returns, every event committed before
/// it was called has a revision (short of a backlog over
/// [`SEQUENCE_BATCH`] numbered meanwhile by another server, which the
/// next run takes).
///
/// # Errors
/// [`Error::Unavailable`] when the database cannot be reached.
pub(crate) async fn sequence(client: &Client) -> Result<i64> {
    let queued = client
        .prepare_cached(sql::EVENTS_QUEUED)
        .await
        .map_err(db_error)?;
    if !client
        .query_one(&queued, &[])
        .await
        .map_err(db_error)?
        .get::<_, bool>(0)
    {
        return Ok(0);
    }
    let number = client
        .prepare_cached(sql::SEQUENCE_EVENTS)
        .await
        .map_err(db_error)?;
    let mut total = 0;
    loop {
        let row = client
            .query_one(&number, &[&SEQUENCE_BATCH, &EVENTS_PER_ROW])
            .await
            .map_err(db_error)?;
        total += row.get::<_, i64>("numbered");
        if row.get::<_, i64>("moved") < SEQUENCE_BATCH {
            return Ok(total);
        }
    }
}

/// The most log rows a poll of the feed trims (see [`trim`]).
const POLL_TRIM_ROWS: i64 = 1000;

/// Trims the log to `len` events, this server's `--event-log-len` (one index probe
/// when there is nothing to trim), at most `batch` log rows; returns how
/// many rows at or below the cut it took (see `sql::TRIM_EVENTS`).
///
/// # Errors
/// [`Error::Unavailable`] when the database cannot be reached.
pub(crate) async fn trim(client: &Client, len: usize, batch: i64) -> Result<u64> {
    let len = len.clamp(1, i64::MAX as usize) as i64;
    let trim = client
        .prepare_cached(sql::TRIM_EVENTS)
        .await
        .map_err(db_error)?;
    let row = client
        .query_one(&trim, &[&len, &batch])
        .await
        .map_err(db_error)?;
    Ok(row.get::<_, i64>("locked").max(0) as u64)
}

/// The log after revision `after`: its head, its oldest revision, and a
/// page of events, as of one snapshot.
async fn read_events(client: &Client, after: u64, limit: usize) -> Result<Page> {
    let stmt = client
        .prepare_cached(sql::READ_EVENTS)
        .await
        .map_err(db_error)?;
    // `after + limit + 1` must stay within `bigint` (only the read of the
    // head alone, with no limit, asks from the very end).
    let after = after.min(i64::MAX as u64 - limit as u64 - 1) as i64;
    let rows = client
        .query(&stmt, &[&after, &(limit as i64)])
        .await
        .map_err(db_error)?;
    let first = rows
        .first()
        .ok_or_else(|| Error::Storage("the event log has no head row".into()))?;
    let head = first.get::<_, i64>("head").max(0) as u64;
    let oldest = first
        .get::<_, Option<i64>>("oldest")
        .map_or(head + 1, |r| r.max(0) as u64);
    let mut events = Vec::with_capacity(rows.len());
    for row in &rows {
        if row.get::<_, Option<i64>>("revision").is_some() {
            events.push(key_row::event(row)?);
        }
    }
    Ok(Page {
        head,
        oldest,
        events,
    })
}

/// One Watch stream.
struct Watcher {
    db: Arc<Db>,
    feed: Arc<Feed>,
    selector: Selector,
    /// Every event up to this revision was delivered (or not selected).
    seen: u64,
    phase: Phase,
}

enum Phase {
    /// Reading the log after `seen`; once subscribed to the feed (`Some`),
    /// one more pass to the head, then [`Phase::Live`].
    CatchUp(Option<broadcast::Receiver<Commit>>),
    Live(broadcast::Receiver<Commit>),
    Done,
}

impl Watcher {
    /// The next batch of selected events, or the error that ends the watch.
    async fn next(&mut self) -> Option<Result<Vec<Event>>> {
        loop {
            match &mut self.phase {
                Phase::Done => return None,
                Phase::CatchUp(_) => match self.catch_up().await {
                    Ok(Some(events)) => return Some(Ok(events)),
                    Ok(None) => {}
                    Err(e) => {
                        self.phase = Phase::Done;
                        return Some(Err(e));
                    }
                },
                Phase::Live(live) => match live.recv().await {
                    Ok(commit) => {
                        let last = commit.last().map_or(self.seen, |e| e.revision);
                        let events: Vec<Event> = commit
                            .iter()
                            .filter(|e| e.revision > self.seen && self.selector.matches(&e.key))
                            .cloned()
                            .collect();
                        self.seen = self.seen.max(last);
                        if !events.is_empty() {
                            return Some(Ok(events));
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        self.phase = Phase::Done;
                        return Some(Err(cut_off(self.feed.buffer, self.seen + 1)));
                    }
                    // The feed restarted: back to the log from where we are.
                    Err(broadcast::error::RecvError::Closed) => self.phase = Phase::CatchUp(None),
                },
            }
        }
    }

    /// Reads one page of the log after `seen`; returns the selected events
    /// (`None`: none in this page).
    async fn catch_up(&mut self) -> Result<Option<Vec<Event>>> {
        let page = in_time(self.db.config.op_timeout, async {
            let client = self.db.client().await?;
            read_events(&client, self.seen, PAGE).await
        })
        .await?;
        if self.seen + 1 < page.oldest {
            return Err(Error::Compacted {
                requested: self.seen + 1,
                oldest: page.oldest,
            });
        }
        let full = page.events.len() == PAGE;
        let mut selected = Vec::new();
        for event in page.events {
            self.seen = self.seen.max(event.revision);
            if self.selector.matches(&event.key) {
                selected.push(event);
            }
        }
        if !full {
            // Read to the head: follow the feed (after one more pass, which
            // covers what it published before we subscribed).
            self.seen = self.seen.max(page.head);
            self.phase = match std::mem::replace(&mut self.phase, Phase::Done) {
                Phase::CatchUp(None) => Phase::CatchUp(Some(self.feed.subscribe(page.head))),
                Phase::CatchUp(Some(live)) => Phase::Live(live),
                other => other,
            };
        }
        Ok((!selected.is_empty()).then_some(selected))
    }
}
