//! The PostgreSQL [`Backend`]: any number of stateless leasehold servers on
//! one database schema.
//!
//! Every rule of the contract is enforced inside PostgreSQL, by one
//! conditional write on one row (all statements are in [`sql`]): a grant is
//! an `INSERT … ON CONFLICT (key) DO UPDATE … WHERE <free or expired>`,
//! renew and release are `UPDATE … WHERE fence = $ AND lease_id = $ AND
//! <not expired>`, fences come from one database sequence, and every time
//! is the database clock's. Two servers never need to agree on anything:
//! whichever statement locks the row first wins, and the other re-checks
//! its condition against what the first left. A write that finds its
//! condition false reads the row and explains the refusal exactly as the
//! SQLite engine does (`row::KeyNow`).
//!
//! # Batching
//! A lock cycle on a free key is two autocommit statements, each shared
//! with this server's concurrent requests of the same kind (`batch`,
//! `renewals`): still one conditional write per row, each on its own
//! condition, so batching changes no rule, only the number of round trips
//! and commits. A request its batch did not apply takes the single-request
//! path below.
//!
//! # Waiting
//! A waiting Acquire is a row of `waiters`. Whoever finds a key free with
//! someone alive in line (a release, an expiry sweep, a newcomer, a waiter
//! waking up) grants it to the first waiter in the same transaction that
//! marks that row granted, and `NOTIFY`s the key; the waiting request picks
//! its grant up when woken (`listen`), at its holder's deadline, or at the
//! latest after [`PgConfig::poll`]. A waiting request keeps its row alive
//! with a heartbeat; dropping its future deletes the row, and rows of a
//! server that died lapse after [`PgConfig::waiter_lease`]. A line holds at
//! most [`PgConfig::max_waiters_per_key`] rows alive, whichever servers
//! queued them: joining it counts the line in the database under a lock
//! per key (`sql::LOCK_LINE`), and one more is refused as on SQLite.
//!
//! # Lifecycle
//! Lock-delay, handoff reservations, the failure count, quarantine and the
//! term history (#15) are columns of the key's row and rows of
//! `term_history`, written by the same single statements as the terms: the
//! statement that ends a term (release, sweeper, or the grant that replaces
//! an expired term) records its history entry (once: in the next slot of
//! the key's ring of rows, updated in place; see `sql::record_history` and
//! migration 0008), counts the failure and starts its lock-delay; the grant's
//! condition checks lock-delay, handoff (the successor goes ahead of the
//! line) and quarantine. Expiry stays lazy: until someone moves an expired
//! term, readers derive what its end does from the row (`row::KeyRow::at`),
//! and History, Unquarantine and refusals move it first (`sql::EXPIRE_KEY`).
//!
//! # Watch
//! The statements that change ownership also queue their events; a
//! sequencer step that any server runs, one at a time, gives them revisions
//! in commit order, and each server's watchers read the numbered log (see
//! `events`).
//!
//! # Order
//! Operations take effect in the order they are called on this server for
//! each key (the Session stream pipelines on it): each operation on a key
//! waits until the one called before it on the same key has been applied
//! (for a waiting Acquire: until it is in line). Lists are not ordered
//! against writes in flight.
//!
//! # Parts
//! - this module: configuration, start-up, the [`Backend`] implementation;
//! - [`sql`]: every statement; [`migrate`]: the versioned schema;
//! - `terms`: renew, release, check, get, list and the sweeper;
//! - `line`: Acquire and waiting in line; `listen`: the NOTIFY wake-ups;
//! - `renewals`: concurrent renewals batched into one statement;
//! - `batch`: concurrent grants of free keys, and releases of keys nobody
//!   waits for, batched into one statement each;
//! - `ledger`: the tool-call ledger; `order`: per-key call order;
//! - `events`: Watch (the event log's sequencer and each server's feed);
//! - `row`: rows to domain values, and the refusals a row implies.
//!
//! # Durability
//! A reply is sent only after its statement committed, and refusals read
//! committed rows only, so nothing a client is told can be undone by a
//! crash of a leasehold server. Whether a commit survives the database's
//! own failover is the database's replication setting (see
//! `docs/deploy.md`). When the database cannot be reached every request is
//! refused with UNAVAILABLE; nothing is guessed.

mod batch;
mod events;
mod ledger;
mod line;
mod listen;
pub mod migrate;
mod order;
mod renewals;
mod row;
pub mod sql;
mod terms;

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use futures_util::future::BoxFuture;
use tokio::sync::{broadcast, watch};
use tokio::task::AbortHandle;
use tokio_postgres::NoTls;
use tokio_postgres::error::SqlState;

use leasehold_core::clock::Millis;
use leasehold_core::error::{Error, Result};
use leasehold_core::events::{DEFAULT_EVENT_LOG_LEN, Selector};
use leasehold_core::lease::{EndedTerm, Fence, Handoff, Key, LeaseId, Term, TermEnd, Ttl};
use leasehold_core::ledger::{
    BeginOutcome, CallFilter, CallSpec, Settlement, ToolCall, validate_settlement, validate_specs,
};
use leasehold_core::lessor::{
    Acquire, DEFAULT_HISTORY_LEN, DEFAULT_RETENTION_MS, Grant, HistoryPage, KeyView, ListFilter,
    ListPage,
};
use leasehold_core::store::StoreError;

use leasehold_backend::{Backend, Pending};
use order::{Access, Turns};
use row::{KeyNow, KeyRow, millis};

/// How many times an operation re-reads a key that changed under it before
/// it gives up with UNAVAILABLE (only under extreme contention).
const RACE_RETRIES: usize = 16;

/// How to reach the database, and the tuning of this backend.
#[derive(Debug, Clone)]
pub struct PgConfig {
    /// `postgres://user[:password]@host[:port]/database[?options]`.
    pub url: String,
    /// The schema holding leasehold's tables (created if missing), so tests
    /// and several deployments can share one database.
    pub schema: String,
    /// Connections in the pool.
    pub pool_size: usize,
    /// How long a cleanly released key is remembered before it is forgotten.
    pub retention_ms: u64,
    /// How often this server moves expired terms to ended (waking their
    /// waiters) and forgets released keys past their retention.
    pub sweep_interval: Duration,
    /// How often a waiting Acquire looks again without a notification.
    pub poll: Duration,
    /// How long a waiter row stays in line without its server's heartbeat.
    pub waiter_lease: Duration,
    /// At most this many Acquires wait in one key's line
    /// (`--max-waiters-per-key`), counted in the database: the waiters of
    /// every server on the schema together. One more is refused with
    /// RESOURCE_EXHAUSTED (`waiters_per_key`), as on SQLite. Each server
    /// holds the line to its own value, so a fleet should share one.
    pub max_waiters_per_key: usize,
    /// How long to wait for a connection (pool or database) before a
    /// request is refused with UNAVAILABLE.
    pub connect_timeout: Duration,
    /// How long one operation may take (beyond an Acquire's own wait)
    /// before it is refused with UNAVAILABLE: a database that stopped
    /// answering (a partition, a hung failover) must not hold requests
    /// forever. Its outcome is then unknown, as for any lost reply.
    pub op_timeout: Duration,
    /// How many ended terms each key remembers (History): the newest this
    /// many are shown. Each key's ring of history rows grows to the
    /// largest length any server wrote it with and never shrinks while the
    /// key exists (migration 0008), so servers with different lengths on
    /// one schema each see their own newest N.
    pub history_len: usize,
    /// The recovery limit of terms whose Acquire names none (`None`: keys
    /// are quarantined only when their Acquire asks). Fixed into each term
    /// when it is granted, so servers with different defaults never
    /// disagree about a term.
    pub default_max_recoveries: Option<u32>,
    /// How often this server asks the database whether it answers (within
    /// [`PgConfig::connect_timeout`]), for gRPC health: NOT_SERVING while it
    /// does not, SERVING again after it does.
    pub health_interval: Duration,
    /// The most renewals one statement applies (see `renewals`); 1 sends
    /// each renewal alone.
    pub renew_batch: usize,
    /// The most grants, and the most releases, one statement applies (see
    /// `batch`); 1 sends each alone.
    pub write_batch: usize,
    /// How many Watch events the log keeps (`--event-log-len`): whichever
    /// server numbers new events trims the log to its own length.
    pub event_log_len: usize,
    /// How many feed items a watcher may fall behind before it is cut off
    /// (`--watch-buffer`).
    pub watch_buffer: usize,
    /// How often a server with watchers numbers queued events and reads new
    /// ones for them (see `events`).
    pub watch_poll: Duration,
}

impl PgConfig {
    /// Defaults for the database at `url`, schema `leasehold`.
    pub fn new(url: impl Into<String>) -> PgConfig {
        PgConfig {
            url: url.into(),
            schema: "leasehold".into(),
            pool_size: 16,
            retention_ms: DEFAULT_RETENTION_MS,
            sweep_interval: Duration::from_millis(500),
            poll: Duration::from_millis(500),
            waiter_lease: Duration::from_secs(3),
            max_waiters_per_key: leasehold_backend::DEFAULT_MAX_WAITERS_PER_KEY,
            connect_timeout: Duration::from_secs(3),
            op_timeout: Duration::from_secs(10),
            history_len: DEFAULT_HISTORY_LEN,
            default_max_recoveries: None,
            health_interval: Duration::from_millis(500),
            renew_batch: 256,
            write_batch: 256,
            event_log_len: DEFAULT_EVENT_LOG_LEN,
            watch_buffer: 4096,
            watch_poll: Duration::from_millis(50),
        }
    }
}

/// A cheap, cloneable handle to the PostgreSQL backend. The background
/// tasks (notification listener, sweeper) stop with the last handle.
#[derive(Clone)]
pub struct PgBackend {
    inner: Arc<Inner>,
    /// Stops the background tasks when the last handle goes.
    _tasks: Arc<Tasks>,
}

impl std::fmt::Debug for PgBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgBackend")
            .field("schema", &self.inner.config.schema)
            .finish_non_exhaustive()
    }
}

struct Inner {
    /// Connections for every statement (never for LISTEN).
    pool: Pool,
    /// The NOTIFY channel of this schema.
    channel: String,
    /// Keys notified by any server; waiters subscribe and filter.
    wakes: broadcast::Sender<listen::Wake>,
    /// Set when the server begins to shut down: waiting Acquires give up.
    closing: watch::Sender<bool>,
    /// Per-key call order (see the module docs).
    turns: Arc<Turns>,
    /// Whether the database answered the last health probe (see
    /// [`Backend::serving`]).
    reachable: watch::Sender<bool>,
    /// Where renewals queue to share a statement; `None` when batching is
    /// off.
    renewals: Option<renewals::Queue>,
    /// Batch statements run, and the renewals they carried (metrics).
    renew_batches: std::sync::atomic::AtomicU64,
    renew_batched: std::sync::atomic::AtomicU64,
    /// Where grant attempts and releases queue to share a statement;
    /// `None` when batching them is off.
    grants: Option<batch::Queue<batch::GrantJob>>,
    releases: Option<batch::Queue<batch::ReleaseJob>>,
    /// Statements that carried grant attempts and releases (metrics).
    grant_counts: batch::Counts,
    release_counts: batch::Counts,
    /// This server's feed of new events to its watchers.
    tail: events::Tail,
    config: PgConfig,
}

/// The background tasks, aborted when the last handle is dropped.
struct Tasks(Vec<AbortHandle>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

impl PgBackend {
    /// Connects to the database, creates the schema or migrates it under an
    /// advisory lock, and starts the notification listener and the
    /// sweeper. Must be called inside a tokio runtime.
    ///
    /// # Errors
    /// [`StoreError::Open`] for a bad URL or schema name or an unreachable
    /// database; [`StoreError::TooNew`] for a schema written by a newer
    /// leasehold; [`StoreError::Io`] when a migration fails.
    pub async fn connect(config: PgConfig) -> std::result::Result<PgBackend, StoreError> {
        let origin = describe(&config.url);
        let open = |reason: String| StoreError::Open {
            path: origin.clone(),
            reason,
        };
        check_schema_name(&config.schema).map_err(open)?;
        let mut pg: tokio_postgres::Config = config
            .url
            .parse()
            .map_err(|e| open(format!("not a PostgreSQL URL: {e}")))?;
        // Every connection resolves leasehold's names in its schema; options
        // given in the URL are kept.
        let search_path = format!("-c search_path={}", config.schema);
        let options = match pg.get_options() {
            Some(given) if !given.is_empty() => format!("{given} {search_path}"),
            _ => search_path,
        };
        pg.options(options);
        pg.connect_timeout(config.connect_timeout);
        // Notice a database that vanished without closing the connection
        // (a partition, a host that died) in seconds, not TCP's minutes.
        pg.keepalives(true);
        pg.keepalives_idle(Duration::from_secs(5));
        pg.keepalives_interval(Duration::from_secs(2));
        pg.keepalives_retries(3);
        if pg.get_application_name().is_none() {
            pg.application_name("leasehold");
        }
        let manager = Manager::from_config(
            pg.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(config.pool_size.max(1))
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(config.connect_timeout))
            .create_timeout(Some(config.connect_timeout))
            .recycle_timeout(Some(config.connect_timeout))
            .build()
            .map_err(|e| open(format!("connection pool: {e}")))?;
        let mut client = pool.get().await.map_err(|e| {
            open(match e {
                deadpool_postgres::PoolError::Backend(e) => pg_message(&e),
                other => other.to_string(),
            })
        })?;
        migrate::migrate(&mut client, &config.schema, &origin).await?;
        drop(client);
        let channel = channel_of(&config.schema);
        let (wakes, _) = broadcast::channel(1024);
        let batch = config.renew_batch;
        let (renewals, renewal_queue) = if batch > 1 {
            let (queue, queued) = tokio::sync::mpsc::unbounded_channel();
            (Some(queue), Some(queued))
        } else {
            (None, None)
        };
        let write_batch = config.write_batch;
        let (grants, grant_queue) = if write_batch > 1 {
            let (queue, queued) = tokio::sync::mpsc::unbounded_channel();
            (Some(queue), Some(queued))
        } else {
            (None, None)
        };
        let (releases, release_queue) = if write_batch > 1 {
            let (queue, queued) = tokio::sync::mpsc::unbounded_channel();
            (Some(queue), Some(queued))
        } else {
            (None, None)
        };
        let inner = Arc::new(Inner {
            pool,
            channel: channel.clone(),
            wakes: wakes.clone(),
            closing: watch::Sender::new(false),
            turns: Arc::default(),
            reachable: watch::Sender::new(true),
            renewals,
            renew_batches: Default::default(),
            renew_batched: Default::default(),
            grants,
            releases,
            grant_counts: Default::default(),
            release_counts: Default::default(),
            tail: events::Tail::new(config.watch_buffer),
            config,
        });
        let listener = tokio::spawn(listen::run(pg, channel, wakes)).abort_handle();
        let sweeper = tokio::spawn(inner.clone().sweep_loop()).abort_handle();
        let prober = tokio::spawn(inner.clone().probe_loop()).abort_handle();
        let feed = tokio::spawn(inner.clone().feed_loop()).abort_handle();
        let mut tasks = vec![listener, sweeper, prober, feed];
        // An eighth of the pool each for renewal, grant and release batches
        // at once, so single requests always find connections, and so a
        // batch waits long enough to grow: each statement and commit costs
        // the database more than a row in it (renewals had half the pool:
        // batches of about 4 where 64 clients renewed, and 0.7-0.8x the
        // renewals/s of two slots; docs/benchmarks-history.md, session 9).
        let slots = (inner.config.pool_size / 8).max(1);
        // One batching loop per kind: what queued, at most `$max` a
        // statement, run by `Inner::$run`.
        macro_rules! batcher {
            ($queue:expr, $max:expr, $run:ident) => {
                if let Some(queued) = $queue {
                    let batcher = inner.clone();
                    let run = move |jobs| {
                        let inner = batcher.clone();
                        async move { inner.$run(jobs).await }
                    };
                    let loop_ = batch::run_batches(queued, $max, slots, run);
                    tasks.push(tokio::spawn(loop_).abort_handle());
                }
            };
        }
        batcher!(renewal_queue, batch, run_renew_batch);
        batcher!(grant_queue, write_batch, run_grant_batch);
        batcher!(release_queue, write_batch, run_release_batch);
        tracing::info!(database = %origin, schema = %inner.config.schema, "PostgreSQL backend ready");
        Ok(PgBackend {
            inner,
            _tasks: Arc::new(Tasks(tasks)),
        })
    }

    /// Runs one sweep now: moves expired terms to ended, forgets keys past
    /// their retention, numbers queued Watch events and trims their log to
    /// this server's length (the background task does this every
    /// [`PgConfig::sweep_interval`]).
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the database cannot be reached.
    pub async fn sweep(&self) -> Result<()> {
        self.inner.sweep().await
    }
}

/// `postgres://user@host:port/db` without the password, for messages.
fn describe(url: &str) -> String {
    match url.parse::<tokio_postgres::Config>() {
        Ok(config) => {
            let hosts: Vec<String> = config
                .get_hosts()
                .iter()
                .map(|h| match h {
                    tokio_postgres::config::Host::Tcp(host) => host.clone(),
                    tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
                })
                .collect();
            let port = config.get_ports().first().copied().unwrap_or(5432);
            format!(
                "postgres://{}@{}:{port}/{}",
                config.get_user().unwrap_or(""),
                hosts.join(","),
                config.get_dbname().unwrap_or("")
            )
        }
        Err(_) => "a PostgreSQL database".into(),
    }
}

/// The NOTIFY channel of `schema`: `leasehold.<schema>`, or a stable hash
/// of it when that would pass PostgreSQL's 63-byte identifier limit (a
/// longer channel name is an error in `pg_notify`).
fn channel_of(schema: &str) -> String {
    let channel = format!("leasehold.{schema}");
    if channel.len() <= 63 {
        return channel;
    }
    // FNV-1a: stable across builds and platforms, unlike std's hasher.
    let hash = schema.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("leasehold.{hash:016x}")
}

/// A schema name goes into SQL text (`search_path`, `CREATE SCHEMA`), so
/// only plain lower-case identifiers are accepted.
fn check_schema_name(schema: &str) -> std::result::Result<(), String> {
    let mut chars = schema.chars();
    let valid = schema.len() <= 63
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "schema {schema:?} must be 1-63 characters of a-z, 0-9 and _, not starting with a digit"
        ))
    }
}

/// A database failure as the client sees it: the database could not be
/// reached or refused for a transient reason (UNAVAILABLE, retry), or a
/// fault of ours (INTERNAL). Never a guess about the lease.
fn db_error(e: tokio_postgres::Error) -> Error {
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
fn pg_message(e: &tokio_postgres::Error) -> String {
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
async fn in_time<T>(
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

fn closed() -> Error {
    Error::Unavailable("the server is shutting down".into())
}

type Client = deadpool_postgres::Object;

/// A `keys` row read with [`sql::READ_KEY`].
struct Snapshot {
    now: Millis,
    /// Whether the key has a row at all.
    found: bool,
    key: KeyNow,
    unsettled: usize,
    /// Whether someone alive waits in line.
    line: bool,
    /// Whether the row holds a term past its deadline that nobody has moved
    /// to ended yet (`key` already shows it ended).
    expired_unmoved: bool,
}

impl Inner {
    async fn client(&self) -> Result<Client> {
        if self.pool.is_closed() {
            return Err(closed());
        }
        self.pool.get().await.map_err(pool_error)
    }

    /// The key as [`Inner::read_key`] reads it, after moving a term past
    /// its deadline to ended (recording its history, failure and
    /// lock-delay) and handing the key to the first waiter in line who may
    /// take it: as the SQLite engine brings a key up to date before every
    /// operation, so a refusal or a Get never shows a free key that someone
    /// waits for (a fence whose term expired with people in line is then
    /// superseded, on either backend), and History shows every ended term.
    async fn read_key_served(&self, client: &mut Client, key: &Key) -> Result<Snapshot> {
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
    async fn expire_and_serve(&self, client: &mut Client, key: &Key) -> Result<()> {
        let tx = client.transaction().await.map_err(db_error)?;
        let expire = tx.prepare_cached(sql::EXPIRE_KEY).await.map_err(db_error)?;
        let moved = tx
            .query_opt(&expire, &[&key.as_str(), &self.history_len()])
            .await
            .map_err(db_error)?;
        if moved.is_some() {
            line::serve_first_in(&tx, &self.channel, key, self.history_len()).await?;
            let notify = tx.prepare_cached(sql::NOTIFY).await.map_err(db_error)?;
            tx.execute(&notify, &[&self.channel, &key.as_str()])
                .await
                .map_err(db_error)?;
        }
        tx.commit().await.map_err(db_error)
    }

    /// The history length, as a statement parameter (at most `i32::MAX`:
    /// a key's ring length is an `integer`, migration 0008).
    fn history_len(&self) -> i64 {
        self.config.history_len.clamp(1, i32::MAX as usize) as i64
    }

    async fn read_key(&self, client: &Client, key: &Key) -> Result<Snapshot> {
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

impl Inner {
    /// Whether the database answers a trivial statement now, within the
    /// connection timeout (a fresh connection when the pooled ones broke).
    async fn probe(&self) -> Result<()> {
        in_time(self.config.connect_timeout, async {
            let client = self.client().await?;
            client.simple_query("SELECT 1").await.map_err(db_error)?;
            Ok(())
        })
        .await
    }

    /// Publishes the database's reachability every
    /// [`PgConfig::health_interval`], logging each change once.
    async fn probe_loop(self: Arc<Self>) {
        let mut tick = tokio::time::interval(self.config.health_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if *self.closing.borrow() {
                // Stopping: the pool closes, which says nothing of the database.
                return;
            }
            let outcome = self.probe().await;
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

impl PgBackend {
    /// Runs `op` on `key` in call order (see `order`): a write after
    /// everything called before it on the key, a read after the writes.
    fn ordered<T, F>(
        &self,
        key: &Key,
        access: Access,
        op: impl FnOnce(Arc<Inner>) -> F + Send + 'static,
    ) -> Pending<T>
    where
        F: std::future::Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        let (predecessor, turn, cleanup) = self.inner.turns.take(key, access);
        let inner = self.inner.clone();
        let limit = inner.config.op_timeout;
        Box::pin(async move {
            predecessor.applied().await;
            let out = in_time(limit, op(inner)).await;
            drop(turn);
            drop(cleanup);
            out
        })
    }
}

impl Backend for PgBackend {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn acquire(&self, request: Acquire) -> Pending<Grant> {
        // The next operation on the key starts once this one is granted,
        // refused or in line, not when its wait ends.
        let (predecessor, turn, cleanup) = self.inner.turns.take(&request.key, Access::Write);
        let inner = self.inner.clone();
        let limit = inner.config.op_timeout + Duration::from_millis(request.wait.as_millis());
        Box::pin(async move {
            predecessor.applied().await;
            let _cleanup = cleanup;
            in_time(limit, inner.acquire(request, turn)).await
        })
    }

    fn renew(&self, key: &Key, fence: Fence, lease_id: LeaseId, ttl: Option<Ttl>) -> Pending<Term> {
        let k = key.clone();
        self.ordered(key, Access::Write, move |inner| async move {
            inner.renew_batched(&k, fence, lease_id, ttl).await
        })
    }

    fn release(
        &self,
        key: &Key,
        fence: Fence,
        lease_id: LeaseId,
        suspend: bool,
        handoff: Option<Handoff>,
    ) -> Pending<EndedTerm> {
        let k = key.clone();
        self.ordered(key, Access::Write, move |inner| async move {
            inner.release(&k, fence, lease_id, suspend, handoff).await
        })
    }

    fn history(&self, key: &Key, before: Option<Fence>, limit: usize) -> Pending<HistoryPage> {
        let k = key.clone();
        self.ordered(key, Access::Read, move |inner| async move {
            inner.history(&k, before, limit).await
        })
    }

    fn unquarantine(&self, key: &Key) -> Pending<KeyView> {
        let k = key.clone();
        self.ordered(key, Access::Write, move |inner| async move {
            inner.unquarantine(&k).await
        })
    }

    fn watch(&self, selector: Selector, start: u64) -> Pending<leasehold_backend::Watching> {
        let inner = self.inner.clone();
        let limit = inner.config.op_timeout;
        Box::pin(in_time(limit, inner.watch(selector, start)))
    }

    fn check(&self, key: &Key, fence: Fence) -> Pending<Term> {
        let k = key.clone();
        self.ordered(key, Access::Read, move |inner| async move {
            inner.check(&k, fence).await
        })
    }

    fn get(&self, key: &Key) -> Pending<KeyView> {
        let k = key.clone();
        self.ordered(key, Access::Read, move |inner| async move {
            inner.get(&k).await
        })
    }

    fn list(
        &self,
        prefix: &str,
        filter: ListFilter,
        after: Option<&Key>,
        page_size: usize,
    ) -> Pending<ListPage> {
        let inner = self.inner.clone();
        let (prefix, after) = (prefix.to_owned(), after.cloned());
        let limit = inner.config.op_timeout;
        Box::pin(in_time(limit, async move {
            inner.list(prefix, filter, after, page_size).await
        }))
    }

    fn begin_tool_calls(
        &self,
        key: &Key,
        fence: Fence,
        lease_id: LeaseId,
        specs: Vec<CallSpec>,
    ) -> Pending<BeginOutcome> {
        let k = key.clone();
        self.ordered(key, Access::Write, move |inner| async move {
            inner.begin_tool_calls(&k, fence, lease_id, specs).await
        })
    }

    fn settle_tool_call(
        &self,
        key: &Key,
        fence: Fence,
        lease_id: LeaseId,
        settlement: Settlement,
    ) -> Pending<(ToolCall, bool)> {
        let k = key.clone();
        self.ordered(key, Access::Write, move |inner| async move {
            inner
                .settle_tool_call(&k, fence, lease_id, settlement)
                .await
        })
    }

    fn list_tool_calls(&self, key: &Key, filter: CallFilter) -> Pending<Vec<ToolCall>> {
        let k = key.clone();
        self.ordered(key, Access::Read, move |inner| async move {
            inner.list_tool_calls(&k, filter).await
        })
    }

    fn begin_shutdown(&self) {
        self.inner.closing.send_replace(true);
    }

    fn shutdown(&self) -> BoxFuture<'static, ()> {
        let inner = self.inner.clone();
        Box::pin(async move {
            inner.closing.send_replace(true);
            // Nothing is pending: every acknowledged write is committed.
            // Later requests find the pool closed: UNAVAILABLE.
            inner.pool.close();
        })
    }

    fn serving(&self) -> watch::Receiver<bool> {
        self.inner.reachable.subscribe()
    }

    fn write_metrics(&self, out: &mut leasehold_backend::metrics::Exposition) {
        use std::sync::atomic::Ordering::Relaxed;
        out.gauge(
            "leasehold_pg_database_up",
            "Whether the database answered the last health probe (1) or not (0).",
            if *self.inner.reachable.borrow() {
                1.0
            } else {
                0.0
            },
        );
        let (watchers, revision) = self.inner.tail.stats();
        out.gauge(
            "leasehold_watchers",
            "Watch streams following this server's live event feed.",
            watchers as f64,
        );
        out.gauge(
            "leasehold_revision",
            "The highest event revision this server published to its watchers (0 while none follow).",
            revision as f64,
        );
        out.counter(
            "leasehold_pg_renew_batches_total",
            "Statements that renewed a batch of terms.",
            self.inner.renew_batches.load(Relaxed),
        );
        out.counter(
            "leasehold_pg_renew_batched_total",
            "Renewals carried by those statements.",
            self.inner.renew_batched.load(Relaxed),
        );
        let counts = [
            (
                "grant",
                "grant attempts",
                "Grant attempts",
                &self.inner.grant_counts,
            ),
            (
                "release",
                "releases",
                "Releases",
                &self.inner.release_counts,
            ),
        ];
        for (name, what, carried, count) in counts {
            out.counter(
                &format!("leasehold_pg_{name}_batches_total"),
                &format!("Statements that applied a batch of {what}."),
                count.batches.load(Relaxed),
            );
            out.counter(
                &format!("leasehold_pg_{name}_batched_total"),
                &format!("{carried} carried by those statements."),
                count.carried.load(Relaxed),
            );
        }
    }

    fn failed(&self) -> BoxFuture<'static, String> {
        // The database going away is not this server's failure: requests get
        // UNAVAILABLE while it is down and succeed again once it is back, so
        // there is nothing a restart of this process would fix.
        Box::pin(std::future::pending())
    }
}

#[cfg(test)]
mod tests {
    use super::ledger::duplicates;
    use super::terms::{like_prefix, prefix_end};
    use super::*;

    #[test]
    fn prefixes_become_literal_like_patterns() {
        assert_eq!(like_prefix(""), "%");
        assert_eq!(like_prefix("a%b_c\\"), "a\\%b\\_c\\\\%");
    }

    #[test]
    fn the_prefix_end_is_above_every_key_with_the_prefix() {
        assert_eq!(prefix_end("ab"), "ac");
        assert_eq!(prefix_end("a\u{10FFFF}"), "b");
        let end = prefix_end("");
        let largest = "\u{10FFFF}".repeat(256); // 1024 bytes, the longest key
        assert!(largest.as_str() < end.as_str());
        for key in ["ab", "ab\u{10FFFF}", "abzzz", "ab\u{7f}"] {
            assert!(key < prefix_end("ab").as_str(), "{key:?}");
        }
        assert!("ac" >= prefix_end("ab").as_str());
    }

    #[test]
    fn schema_names_are_plain_identifiers() {
        for good in ["leasehold", "_x", "lh_test_1"] {
            assert!(check_schema_name(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "1x",
            "Leasehold",
            "a-b",
            "a;drop",
            "a b",
            &"x".repeat(64),
        ] {
            assert!(check_schema_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn channels_fit_the_identifier_limit() {
        assert_eq!(channel_of("leasehold"), "leasehold.leasehold");
        let long = "s".repeat(63);
        let channel = channel_of(&long);
        assert!(channel.len() <= 63, "{channel}");
        assert_eq!(channel, channel_of(&long), "stable");
        assert_ne!(channel, channel_of(&"t".repeat(63)));
    }

    #[test]
    fn descriptions_leave_the_password_out() {
        let text = describe("postgres://me:secret@db.internal:6543/leases");
        assert_eq!(text, "postgres://me@db.internal:6543/leases");
    }

    #[test]
    fn duplicates_follow_the_ledger_rule() {
        let spec = |id: &str| CallSpec {
            call_id: id.into(),
            name: "n".into(),
            input_digest: String::new(),
            across_turns: Default::default(),
            turn: Default::default(),
        };
        assert_eq!(duplicates(&[spec("a"), spec("b")], Vec::new()), None);
        let Some(BeginOutcome::Duplicate { ids, existing }) =
            duplicates(&[spec("a"), spec("b"), spec("b")], Vec::new())
        else {
            panic!("expected a duplicate");
        };
        assert_eq!(ids, ["b"]);
        assert!(existing.is_empty());
    }

    #[test]
    fn duplicates_follow_the_turn_rule() {
        let spec = |id: &str, turn: &str, across_turns: bool| CallSpec {
            call_id: id.into(),
            name: "n".into(),
            input_digest: String::new(),
            across_turns,
            turn: turn.into(),
        };
        let known = |turn: &str| ToolCall {
            turn: turn.into(),
            call_id: "call_0".into(),
            name: "n".into(),
            input_digest: String::new(),
            fence: Fence(1),
            state: leasehold_core::ledger::CallState::Running,
            settled_fence: None,
            result_digest: String::new(),
            result: Vec::new(),
            begun_at: 0,
            settled_at: None,
            ordinal: 1,
        };
        // Another turn's call_0 is no duplicate of this turn's...
        assert_eq!(
            duplicates(&[spec("call_0", "t2", false)], vec![known("t1")]),
            None
        );
        // ...but is when asked across turns, or when no turn is named.
        for s in [spec("call_0", "t2", true), spec("call_0", "", false)] {
            let Some(BeginOutcome::Duplicate { existing, .. }) =
                duplicates(&[s], vec![known("t1")])
            else {
                panic!("expected a duplicate");
            };
            assert_eq!(existing[0].turn, "t1");
        }
        assert!(duplicates(&[spec("call_0", "t1", false)], vec![known("t1")]).is_some());
    }
}
