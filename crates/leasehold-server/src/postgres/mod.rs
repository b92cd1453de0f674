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
//! SQLite engine does ([`row::KeyNow`]).
//!
//! # Waiting
//! A waiting Acquire is a row of `waiters`. Whoever finds a key free with
//! someone alive in line (a release, an expiry sweep, a newcomer, a waiter
//! waking up) grants it to the first waiter in the same transaction that
//! marks that row granted, and `NOTIFY`s the key; the waiting request picks
//! its grant up when woken ([`listen`]), at its holder's deadline, or at the
//! latest after [`PgConfig::poll`]. A waiting request keeps its row alive
//! with a heartbeat; dropping its future deletes the row, and rows of a
//! server that died lapse after [`PgConfig::waiter_lease`].
//!
//! # Order
//! Operations take effect in the order they are called on this server for
//! each key (the Session stream pipelines on it): each operation on a key
//! waits until the one called before it on the same key has been applied
//! (for a waiting Acquire: until it is in line). Lists are not ordered
//! against writes in flight.
//!
//! # Durability
//! A reply is sent only after its statement committed, and refusals read
//! committed rows only, so nothing a client is told can be undone by a
//! crash of a leasehold server. Whether a commit survives the database's
//! own failover is the database's replication setting (see
//! `docs/deploy.md`). When the database cannot be reached every request is
//! refused with UNAVAILABLE; nothing is guessed.

mod listen;
pub mod migrate;
mod row;
pub mod sql;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use futures_util::future::BoxFuture;
use tokio::sync::{broadcast, oneshot, watch};
use tokio::task::AbortHandle;
use tokio_postgres::NoTls;
use tokio_postgres::error::SqlState;

use leasehold_core::clock::Millis;
use leasehold_core::error::{Error, Result};
use leasehold_core::lease::{EndedTerm, Fence, Key, LeaseId, Term, TermEnd, Ttl};
use leasehold_core::ledger::{
    BeginOutcome, CallFilter, CallSpec, Settlement, ToolCall, validate_settlement, validate_specs,
};
use leasehold_core::lessor::{Acquire, DEFAULT_RETENTION_MS, Grant, KeyView, ListFilter, ListPage};
use leasehold_core::store::StoreError;

use crate::backend::{Backend, Pending};
use row::{KeyNow, KeyRow, millis};

/// The largest List page, and the one given when a request names none (as
/// the SQLite engine).
const MAX_PAGE_SIZE: usize = 1000;
const DEFAULT_PAGE_SIZE: usize = 100;

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
    /// How long to wait for a connection (pool or database) before a
    /// request is refused with UNAVAILABLE.
    pub connect_timeout: Duration,
    /// How long one operation may take (beyond an Acquire's own wait)
    /// before it is refused with UNAVAILABLE: a database that stopped
    /// answering (a partition, a hung failover) must not hold requests
    /// forever. Its outcome is then unknown, as for any lost reply.
    pub op_timeout: Duration,
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
            connect_timeout: Duration::from_secs(3),
            op_timeout: Duration::from_secs(10),
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
        pg.options(format!("-c search_path={}", config.schema));
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
        let mut client = pool.get().await.map_err(|e| open(e.to_string()))?;
        migrate::migrate(&mut client, &config.schema, &origin).await?;
        drop(client);
        let channel = channel_of(&config.schema);
        let (wakes, _) = broadcast::channel(1024);
        let inner = Arc::new(Inner {
            pool,
            channel: channel.clone(),
            wakes: wakes.clone(),
            closing: watch::Sender::new(false),
            turns: Arc::default(),
            config,
        });
        let listener = tokio::spawn(listen::run(pg, channel, wakes)).abort_handle();
        let sweeper = tokio::spawn(inner.clone().sweep_loop()).abort_handle();
        tracing::info!(database = %origin, schema = %inner.config.schema, "PostgreSQL backend ready");
        Ok(PgBackend {
            inner,
            _tasks: Arc::new(Tasks(vec![listener, sweeper])),
        })
    }

    /// Runs one sweep now: moves expired terms to ended and forgets keys
    /// past their retention (the background task does this every
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
}

impl Inner {
    async fn client(&self) -> Result<Client> {
        if self.pool.is_closed() {
            return Err(closed());
        }
        self.pool.get().await.map_err(pool_error)
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
        Ok(Snapshot {
            now,
            found,
            key: KeyRow::from_row(&row)?.at(now),
            unsettled: row.get::<_, i64>("unsettled") as usize,
            line: row.get("line"),
        })
    }

    /// Grants `key` to the first waiter alive in line if it is free, in one
    /// transaction with the waiter's row and the notification.
    async fn serve_first(&self, client: &mut Client, key: &Key) -> Result<()> {
        let tx = client.transaction().await.map_err(db_error)?;
        let served = serve_first_in(&tx, &self.channel, key).await?;
        tx.commit().await.map_err(db_error)?;
        if served {
            tracing::debug!(key = %key, "handed to the first waiter");
        }
        Ok(())
    }

    /// The part of an Acquire that does not wait: the grant, a replay, or
    /// the busy refusal (a free key with people in line goes to them first).
    async fn acquire_now(&self, client: &mut Client, request: &Acquire) -> Result<Grant> {
        let key = request.key.as_str();
        let request_id = request.request_id.as_ref().map(|r| r.as_str());
        let ttl = request.ttl.as_millis() as i64;
        let grant = client.prepare_cached(sql::GRANT).await.map_err(db_error)?;
        for _ in 0..RACE_RETRIES {
            let lease_id = LeaseId::random();
            let granted = client
                .query_opt(
                    &grant,
                    &[
                        &key,
                        &request.owner.as_str(),
                        &lease_id.0,
                        &request_id,
                        &ttl,
                    ],
                )
                .await
                .map_err(db_error)?;
            if let Some(row) = granted {
                let stored = KeyRow::from_row(&row)?;
                let term = stored
                    .live
                    .ok_or_else(|| Error::Storage("a grant returned no term".into()))?;
                return Ok(Grant {
                    key: request.key.clone(),
                    term,
                    previous: stored.last_ended,
                    replayed: false,
                    unsettled_tool_calls: row.get::<_, i64>("unsettled") as usize,
                    visible_seq: 0,
                });
            }
            let snapshot = self.read_key(client, &request.key).await?;
            if let Some(term) = &snapshot.key.live {
                if let Some(replay) = replay_of(request, &snapshot) {
                    return Ok(replay);
                }
                return Err(Error::Busy {
                    key: request.key.clone(),
                    holder: term.owner.clone(),
                    fence: term.fence,
                    remaining_ms: term.expires_at.saturating_sub(snapshot.now),
                });
            }
            if snapshot.line {
                // Free, with people in line: they go first; the next look
                // finds the key held by the first of them.
                self.serve_first(client, &request.key).await?;
            }
        }
        Err(Error::Unavailable(format!(
            "key {:?} changed {RACE_RETRIES} times while acquiring it; retry",
            request.key
        )))
    }

    /// An Acquire, waiting in line up to `request.wait` when the key is
    /// held. `applied` is signalled once the request is granted, refused or
    /// in line.
    async fn acquire(self: Arc<Self>, request: Acquire, applied: Turn) -> Result<Grant> {
        let mut client = self.client().await?;
        let wakes = self.wakes.subscribe();
        let first = self.acquire_now(&mut client, &request).await;
        let wait = request.wait.as_millis();
        let busy = match first {
            Err(busy @ Error::Busy { .. }) if wait > 0 => busy,
            other => return other,
        };
        if *self.closing.borrow() {
            return Err(closed());
        }
        let enqueue = client
            .prepare_cached(sql::ENQUEUE)
            .await
            .map_err(db_error)?;
        let lease = self.config.waiter_lease.as_millis() as i64;
        let row = client
            .query_one(
                &enqueue,
                &[
                    &request.key.as_str(),
                    &request.owner.as_str(),
                    &(request.ttl.as_millis() as i64),
                    &request.request_id.as_ref().map(|r| r.as_str()),
                    &(wait as i64),
                    &lease,
                ],
            )
            .await
            .map_err(db_error)?;
        let place = PlaceInLine {
            inner: self.clone(),
            id: row.get("id"),
            armed: true,
        };
        drop(applied);
        drop(busy);
        let until = millis(row.get("wait_until_ms"));
        self.wait_in_line(client, request, place, until, wakes)
            .await
    }

    /// Waits in line until granted, replayed, the wait runs out (then one
    /// last look, as the SQLite engine), or the server closes.
    async fn wait_in_line(
        &self,
        mut client: Client,
        request: Acquire,
        mut place: PlaceInLine,
        until: Millis,
        mut wakes: broadcast::Receiver<listen::Wake>,
    ) -> Result<Grant> {
        let mut closing = self.closing.subscribe();
        let lease = self.config.waiter_lease.as_millis() as i64;
        loop {
            if *closing.borrow() {
                return match self.leave_line(&client, &mut place, &request).await? {
                    Some(grant) => Ok(grant),
                    None => Err(closed()),
                };
            }
            self.serve_first(&mut client, &request.key).await?;
            let heartbeat = client
                .prepare_cached(sql::HEARTBEAT)
                .await
                .map_err(db_error)?;
            let mine = client
                .query_opt(&heartbeat, &[&place.id, &lease])
                .await
                .map_err(db_error)?;
            let snapshot = self.read_key(&client, &request.key).await?;
            let Some(mine) = mine else {
                // Our row is gone (removed as dead after a long stall): take
                // one last look instead of waiting on nothing.
                place.armed = false;
                return self.acquire_now(&mut client, &request).await;
            };
            if let Some(fence) = mine.get::<_, Option<i64>>("granted_fence") {
                let grant = granted(&request, &mine, fence, &snapshot)?;
                place.leave(&client).await;
                return Ok(grant);
            }
            if let Some(replay) = replay_of(&request, &snapshot) {
                place.leave(&client).await;
                return Ok(replay);
            }
            let now = snapshot.now;
            if now >= until {
                return match self.leave_line(&client, &mut place, &request).await? {
                    Some(grant) => Ok(grant),
                    None => self.acquire_now(&mut client, &request).await,
                };
            }
            let mut sleep = Duration::from_millis(until - now).min(self.config.poll);
            if let Some(term) = &snapshot.key.live {
                // Wake when the holder's term runs out, if nobody renews it.
                let left = Duration::from_millis(term.expires_at.saturating_sub(now) + 1);
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
            client = self.client().await?;
        }
    }

    /// Leaves the line; returns the grant if one raced in first.
    async fn leave_line(
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
        let grant = granted(request, &mine, fence, &snapshot)?;
        place.leave(client).await;
        Ok(Some(grant))
    }

    async fn renew(
        &self,
        key: &Key,
        fence: Fence,
        lease_id: LeaseId,
        ttl: Option<Ttl>,
    ) -> Result<Term> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(sql::RENEW).await.map_err(db_error)?;
        let ttl = ttl.map(|t| t.as_millis() as i64);
        for _ in 0..RACE_RETRIES {
            let renewed = client
                .query_opt(
                    &stmt,
                    &[&key.as_str(), &(fence.0 as i64), &lease_id.0, &ttl],
                )
                .await
                .map_err(db_error)?;
            if let Some(row) = renewed {
                return KeyRow::from_row(&row)?
                    .live
                    .ok_or_else(|| Error::Storage("a renewal returned no term".into()));
            }
            if let Some(refusal) = self.holder_refusal(&client, key, fence, lease_id).await? {
                return Err(refusal);
            }
        }
        Err(raced(key))
    }

    async fn release(
        &self,
        key: &Key,
        fence: Fence,
        lease_id: LeaseId,
        suspend: bool,
    ) -> Result<EndedTerm> {
        let mut client = self.client().await?;
        let end = if suspend {
            TermEnd::Suspended
        } else {
            TermEnd::Released
        };
        for _ in 0..RACE_RETRIES {
            let tx = client.transaction().await.map_err(db_error)?;
            let stmt = tx.prepare_cached(sql::RELEASE).await.map_err(db_error)?;
            let released = tx
                .query_opt(
                    &stmt,
                    &[
                        &key.as_str(),
                        &(fence.0 as i64),
                        &lease_id.0,
                        &row::term_end_code(end),
                    ],
                )
                .await
                .map_err(db_error)?;
            if let Some(row) = released {
                let ended = KeyRow::from_row(&row)?
                    .last_ended
                    .ok_or_else(|| Error::Storage("a release returned no ended term".into()))?;
                // The first in line gets the key in the same commit, and
                // every server's waiters for the key are woken.
                serve_first_in(&tx, &self.channel, key).await?;
                let notify = tx.prepare_cached(sql::NOTIFY).await.map_err(db_error)?;
                tx.execute(&notify, &[&self.channel, &key.as_str()])
                    .await
                    .map_err(db_error)?;
                tx.commit().await.map_err(db_error)?;
                return Ok(ended);
            }
            tx.rollback().await.map_err(db_error)?;
            let snapshot = self.read_key(&client, key).await?;
            let state = &snapshot.key;
            match (&state.live, &state.last_ended) {
                // A retried release: the term as it first ended, while no
                // newer term holds the key.
                (None, Some(ended)) if ended.fence == fence && ended.end != TermEnd::Expired => {
                    if ended.lease_id != lease_id {
                        return Err(row::denied(key, fence));
                    }
                    return Ok(ended.clone());
                }
                _ => {
                    if let Some(refusal) = state.holder_refusal(key, fence, lease_id) {
                        return Err(refusal);
                    }
                }
            }
        }
        Err(raced(key))
    }

    /// Why `fence`/`lease_id` is not the live term of `key`, or `None` if it
    /// now is.
    async fn holder_refusal(
        &self,
        client: &Client,
        key: &Key,
        fence: Fence,
        lease_id: LeaseId,
    ) -> Result<Option<Error>> {
        let snapshot = self.read_key(client, key).await?;
        Ok(snapshot.key.holder_refusal(key, fence, lease_id))
    }

    async fn check(&self, key: &Key, fence: Fence) -> Result<Term> {
        let client = self.client().await?;
        let snapshot = self.read_key(&client, key).await?;
        match snapshot.key.live {
            Some(term) if term.fence == fence => Ok(term),
            _ => Err(row::stale(key, fence, snapshot.key.stale_reason(fence))),
        }
    }

    async fn get(&self, key: &Key) -> Result<KeyView> {
        let client = self.client().await?;
        let snapshot = self.read_key(&client, key).await?;
        if !snapshot.found {
            return Err(Error::NotFound(key.clone()));
        }
        Ok(view(key.clone(), snapshot.key))
    }

    async fn list(
        &self,
        prefix: String,
        filter: ListFilter,
        after: Option<Key>,
        page_size: usize,
    ) -> Result<ListPage> {
        if page_size > MAX_PAGE_SIZE {
            return Err(Error::InvalidArgument(format!(
                "page_size {page_size} is over the limit of {MAX_PAGE_SIZE}"
            )));
        }
        let limit = if page_size == 0 {
            DEFAULT_PAGE_SIZE
        } else {
            page_size
        };
        let client = self.client().await?;
        let query = match filter {
            ListFilter::All => sql::LIST_ALL,
            ListFilter::Live => sql::LIST_LIVE,
            ListFilter::Recoverable => sql::LIST_RECOVERABLE,
        };
        let stmt = client.prepare_cached(query).await.map_err(db_error)?;
        let pattern = like_prefix(&prefix);
        let end = prefix_end(&prefix);
        let after = after.as_ref().map_or("", |k| k.as_str());
        // One more than asked: whether there is a next page.
        let rows = client
            .query(
                &stmt,
                &[&pattern, &prefix, &end, &after, &((limit + 1) as i64)],
            )
            .await
            .map_err(db_error)?;
        let mut page = ListPage::default();
        for row in rows.iter().take(limit) {
            let now = millis(row.get("now"));
            let key = Key::parse(row.get::<_, String>("key"))
                .map_err(|e| Error::Storage(format!("stored key: {e}")))?;
            page.keys.push(view(key, KeyRow::from_row(row)?.at(now)));
        }
        if rows.len() > limit {
            page.next_after = page.keys.last().map(|v| v.key.clone());
        }
        Ok(page)
    }

    async fn begin_tool_calls(
        &self,
        key: &Key,
        fence: Fence,
        lease_id: LeaseId,
        specs: Vec<CallSpec>,
    ) -> Result<BeginOutcome> {
        validate_specs(&specs)?;
        let mut client = self.client().await?;
        for _ in 0..RACE_RETRIES {
            let tx = client.transaction().await.map_err(db_error)?;
            let lock = tx
                .prepare_cached(sql::LOCK_LIVE_TERM)
                .await
                .map_err(db_error)?;
            let Some(term) = tx
                .query_opt(&lock, &[&key.as_str(), &(fence.0 as i64), &lease_id.0])
                .await
                .map_err(db_error)?
            else {
                tx.rollback().await.map_err(db_error)?;
                match self.holder_refusal(&client, key, fence, lease_id).await? {
                    Some(refusal) => return Err(refusal),
                    None => continue,
                }
            };
            let now = millis(term.get("now"));
            let ids: Vec<&str> = specs.iter().map(|s| s.call_id.as_str()).collect();
            let by_id = tx
                .prepare_cached(sql::CALLS_BY_ID)
                .await
                .map_err(db_error)?;
            let known = tx
                .query(&by_id, &[&key.as_str(), &ids])
                .await
                .map_err(db_error)?
                .iter()
                .map(row::tool_call)
                .collect::<Result<Vec<_>>>()?;
            if let Some(duplicate) = duplicates(&specs, known) {
                tx.rollback().await.map_err(db_error)?;
                return Ok(duplicate);
            }
            let ordinals = tx.prepare_cached(sql::ORDINALS).await.map_err(db_error)?;
            let ordinals: Vec<i64> = tx
                .query(&ordinals, &[&(specs.len() as i32)])
                .await
                .map_err(db_error)?
                .iter()
                .map(|r| r.get("ordinal"))
                .collect();
            let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
            let digests: Vec<&str> = specs.iter().map(|s| s.input_digest.as_str()).collect();
            let insert = tx
                .prepare_cached(sql::INSERT_CALLS)
                .await
                .map_err(db_error)?;
            let inserted = tx
                .execute(
                    &insert,
                    &[
                        &key.as_str(),
                        &ids,
                        &names,
                        &digests,
                        &ordinals,
                        &(fence.0 as i64),
                        &(now as i64),
                    ],
                )
                .await;
            match inserted {
                Ok(_) => {}
                // Another server began one of these ids just now: look again.
                Err(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => continue,
                Err(e) => return Err(db_error(e)),
            }
            tx.commit().await.map_err(db_error)?;
            let calls = specs
                .into_iter()
                .zip(ordinals)
                .map(|(spec, ordinal)| ToolCall {
                    call_id: spec.call_id,
                    name: spec.name,
                    input_digest: spec.input_digest,
                    fence,
                    state: leasehold_core::ledger::CallState::Running,
                    settled_fence: None,
                    result_digest: String::new(),
                    result: Vec::new(),
                    begun_at: now,
                    settled_at: None,
                    ordinal: ordinal as u64,
                })
                .collect();
            return Ok(BeginOutcome::Recorded(calls));
        }
        Err(raced(key))
    }

    async fn settle_tool_call(
        &self,
        key: &Key,
        fence: Fence,
        lease_id: LeaseId,
        settlement: Settlement,
    ) -> Result<(ToolCall, bool)> {
        validate_settlement(&settlement)?;
        let client = self.client().await?;
        let settle = client.prepare_cached(sql::SETTLE).await.map_err(db_error)?;
        let call = client.prepare_cached(sql::CALL).await.map_err(db_error)?;
        for _ in 0..RACE_RETRIES {
            let settled = client
                .query_opt(
                    &settle,
                    &[
                        &key.as_str(),
                        &(fence.0 as i64),
                        &lease_id.0,
                        &settlement.call_id,
                        &row::call_state_code(settlement.outcome),
                        &settlement.result_digest,
                        &settlement.result,
                    ],
                )
                .await
                .map_err(db_error)?;
            if let Some(row) = settled {
                return Ok((row::tool_call(&row)?, false));
            }
            if let Some(refusal) = self.holder_refusal(&client, key, fence, lease_id).await? {
                return Err(refusal);
            }
            // The term is live: the call is unknown or settled already.
            match client
                .query_opt(&call, &[&key.as_str(), &settlement.call_id])
                .await
                .map_err(db_error)?
            {
                None => {
                    return Err(Error::ToolCallNotFound {
                        key: key.clone(),
                        call_id: settlement.call_id,
                    });
                }
                Some(row) => {
                    let call = row::tool_call(&row)?;
                    if call.state.is_settled() {
                        return Ok((call, true));
                    }
                }
            }
        }
        Err(raced(key))
    }

    async fn list_tool_calls(&self, key: &Key, filter: CallFilter) -> Result<Vec<ToolCall>> {
        let client = self.client().await?;
        let exists = client
            .prepare_cached(sql::KEY_EXISTS)
            .await
            .map_err(db_error)?;
        let found: bool = client
            .query_one(&exists, &[&key.as_str()])
            .await
            .map_err(db_error)?
            .get(0);
        if !found {
            return Err(Error::NotFound(key.clone()));
        }
        let query = match filter {
            CallFilter::All => sql::CALLS,
            CallFilter::Unsettled => sql::RUNNING_CALLS,
        };
        let stmt = client.prepare_cached(query).await.map_err(db_error)?;
        client
            .query(&stmt, &[&key.as_str()])
            .await
            .map_err(db_error)?
            .iter()
            .map(row::tool_call)
            .collect()
    }

    /// Moves expired terms to ended (waking their waiters), forgets keys
    /// past their retention, and drops waiter rows long dead.
    async fn sweep(&self) -> Result<()> {
        let client = self.client().await?;
        let expire = client
            .prepare_cached(sql::SWEEP_EXPIRED)
            .await
            .map_err(db_error)?;
        loop {
            let moved = client
                .query(&expire, &[&self.channel])
                .await
                .map_err(db_error)?;
            if moved.len() < 1000 {
                break;
            }
        }
        let retention = self.config.retention_ms.min(i64::MAX as u64) as i64;
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
        Ok(())
    }

    async fn sweep_loop(self: Arc<Self>) {
        let mut tick = tokio::time::interval(self.config.sweep_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(e) = in_time(self.config.op_timeout, self.sweep()).await {
                tracing::warn!(error = %e, "sweep failed; trying again");
            }
        }
    }
}

/// Grants `key` to its first waiter alive in line, inside `tx`: the grant,
/// the waiter's row and the notification commit together. Returns whether
/// it granted.
async fn serve_first_in(
    tx: &deadpool_postgres::Transaction<'_>,
    channel: &str,
    key: &Key,
) -> Result<bool> {
    let serve = tx
        .prepare_cached(sql::SERVE_FIRST)
        .await
        .map_err(db_error)?;
    let lease_id = LeaseId::random();
    let Some(row) = tx
        .query_opt(&serve, &[&key.as_str(), &lease_id.0])
        .await
        .map_err(db_error)?
    else {
        return Ok(false);
    };
    let mark = tx
        .prepare_cached(sql::MARK_GRANTED)
        .await
        .map_err(db_error)?;
    let waiter: i64 = row.get("waiter_id");
    let fence: i64 = row.get("live_fence");
    let acquired: i64 = row.get("live_acquired_at_ms");
    let expires: i64 = row.get("live_expires_at_ms");
    tx.execute(&mark, &[&waiter, &fence, &lease_id.0, &acquired, &expires])
        .await
        .map_err(db_error)?;
    let notify = tx.prepare_cached(sql::NOTIFY).await.map_err(db_error)?;
    tx.execute(&notify, &[&channel, &key.as_str()])
        .await
        .map_err(db_error)?;
    Ok(true)
}

/// The replay of `request` if the key's live term is its earlier grant
/// (same owner and request id).
fn replay_of(request: &Acquire, snapshot: &Snapshot) -> Option<Grant> {
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
fn granted(
    request: &Acquire,
    mine: &tokio_postgres::Row,
    fence: i64,
    snapshot: &Snapshot,
) -> Result<Grant> {
    let fence = row::fence_of(fence);
    let term = Term {
        fence,
        owner: request.owner.clone(),
        lease_id: LeaseId(mine.get("granted_lease_id")),
        request_id: request.request_id.clone(),
        ttl: request.ttl,
        acquired_at: millis(mine.get("granted_acquired_at_ms")),
        expires_at: millis(mine.get("granted_expires_at_ms")),
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

/// The reader's view (never with a lease id leaving the server: the gRPC
/// layer strips it).
fn view(key: Key, state: KeyNow) -> KeyView {
    KeyView {
        recoverable: state.recoverable(),
        key,
        live: state.live,
        last_ended: state.last_ended,
        visible_seq: 0,
    }
}

/// The Ledger's duplicate rule over the stored calls `known`: ids already
/// recorded, or repeated within the batch.
fn duplicates(specs: &[CallSpec], known: Vec<ToolCall>) -> Option<BeginOutcome> {
    let mut seen = std::collections::HashSet::new();
    let mut ids: Vec<String> = Vec::new();
    let mut existing = Vec::new();
    for spec in specs {
        if let Some(call) = known.iter().find(|c| c.call_id == spec.call_id) {
            if !ids.contains(&spec.call_id) {
                ids.push(spec.call_id.clone());
                existing.push(call.clone());
            }
        } else if !seen.insert(spec.call_id.as_str()) && !ids.contains(&spec.call_id) {
            ids.push(spec.call_id.clone());
        }
    }
    (!ids.is_empty()).then_some(BeginOutcome::Duplicate { ids, existing })
}

fn raced(key: &Key) -> Error {
    Error::Unavailable(format!(
        "key {key:?} changed {RACE_RETRIES} times under this request; retry"
    ))
}

/// `prefix` as a LIKE pattern matching every string that starts with it.
fn like_prefix(prefix: &str) -> String {
    let mut pattern = String::with_capacity(prefix.len() + 1);
    for c in prefix.chars() {
        if matches!(c, '%' | '_' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push('%');
    pattern
}

/// A string above every string that starts with `prefix` (in byte order,
/// which the `C` collation and UTF-8 share), so List reads one index range.
fn prefix_end(prefix: &str) -> String {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = (last as u32 + 1..=char::MAX as u32).find_map(char::from_u32);
        if let Some(next) = next {
            chars.push(next);
            return chars.into_iter().collect();
        }
    }
    // Empty prefix (or only U+10FFFF): above every key, which is at most
    // 1024 bytes, i.e. fewer than 257 four-byte characters.
    std::iter::repeat_n(char::MAX, 257).collect()
}

/// A waiting Acquire's row in `waiters`. Dropping it (the request's future
/// was dropped: the client cancelled, its deadline passed, its stream
/// closed) deletes the row, so the line moves on at once.
struct PlaceInLine {
    inner: Arc<Inner>,
    id: i64,
    /// False once the row is gone some other way.
    armed: bool,
}

impl PlaceInLine {
    /// Deletes the row now (after its grant was picked up).
    async fn leave(&mut self, client: &Client) {
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
        let (inner, id) = (self.inner.clone(), self.id);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Ok(client) = inner.pool.get().await {
                    let _ = client.execute(sql::LEAVE, &[&id]).await;
                }
            });
        }
    }
}

/// Per-key call order on this server: each operation on a key starts once
/// the operation called before it on that key has been applied.
#[derive(Default)]
struct Turns {
    /// The newest operation of each key with one in flight: its number, and
    /// what tells the next one it was applied.
    tails: Mutex<HashMap<Key, (u64, oneshot::Receiver<()>)>>,
    next: std::sync::atomic::AtomicU64,
}

/// An operation's place in its key's order; dropping it lets the next one go.
struct Turn {
    _applied: oneshot::Sender<()>,
}

/// What an operation waits for before it starts.
struct Predecessor(Option<oneshot::Receiver<()>>);

impl Predecessor {
    async fn applied(self) {
        if let Some(rx) = self.0 {
            // Err: the predecessor was applied (or dropped): either way, go.
            let _ = rx.await;
        }
    }
}

impl Turns {
    /// Takes the next place in `key`'s order, at call time.
    fn take(self: &Arc<Self>, key: &Key) -> (Predecessor, Turn, TurnCleanup) {
        let (tx, rx) = oneshot::channel();
        let number = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let previous = self
            .tails
            .lock()
            .expect("turns lock")
            .insert(key.clone(), (number, rx))
            .map(|(_, rx)| rx);
        (
            Predecessor(previous),
            Turn { _applied: tx },
            TurnCleanup {
                turns: self.clone(),
                key: key.clone(),
                number,
            },
        )
    }
}

/// Forgets a key's order entry when its newest operation is done, so the
/// map holds only keys with operations in flight.
struct TurnCleanup {
    turns: Arc<Turns>,
    key: Key,
    number: u64,
}

impl Drop for TurnCleanup {
    fn drop(&mut self) {
        let mut tails = self.turns.tails.lock().expect("turns lock");
        if tails.get(&self.key).is_some_and(|(n, _)| *n == self.number) {
            tails.remove(&self.key);
        }
    }
}

impl PgBackend {
    /// Runs `op` on `key` in call order (see the module docs); the next
    /// operation on the key starts once `op` is done.
    fn ordered<T, F>(
        &self,
        key: &Key,
        op: impl FnOnce(Arc<Inner>) -> F + Send + 'static,
    ) -> Pending<T>
    where
        F: std::future::Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        let (predecessor, turn, cleanup) = self.inner.turns.take(key);
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
    fn acquire(&self, request: Acquire) -> Pending<Grant> {
        // The next operation on the key starts once this one is granted,
        // refused or in line, not when its wait ends.
        let (predecessor, turn, cleanup) = self.inner.turns.take(&request.key);
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
        self.ordered(key, move |inner| async move {
            inner.renew(&k, fence, lease_id, ttl).await
        })
    }

    fn release(
        &self,
        key: &Key,
        fence: Fence,
        lease_id: LeaseId,
        suspend: bool,
    ) -> Pending<EndedTerm> {
        let k = key.clone();
        self.ordered(key, move |inner| async move {
            inner.release(&k, fence, lease_id, suspend).await
        })
    }

    fn check(&self, key: &Key, fence: Fence) -> Pending<Term> {
        let k = key.clone();
        self.ordered(
            key,
            move |inner| async move { inner.check(&k, fence).await },
        )
    }

    fn get(&self, key: &Key) -> Pending<KeyView> {
        let k = key.clone();
        self.ordered(key, move |inner| async move { inner.get(&k).await })
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
        self.ordered(key, move |inner| async move {
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
        self.ordered(key, move |inner| async move {
            inner
                .settle_tool_call(&k, fence, lease_id, settlement)
                .await
        })
    }

    fn list_tool_calls(&self, key: &Key, filter: CallFilter) -> Pending<Vec<ToolCall>> {
        let k = key.clone();
        self.ordered(key, move |inner| async move {
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

    fn failed(&self) -> BoxFuture<'static, String> {
        // The database going away is not this server's failure: requests get
        // UNAVAILABLE while it is down and succeed again once it is back, so
        // there is nothing a restart of this process would fix.
        Box::pin(std::future::pending())
    }
}

#[cfg(test)]
mod tests {
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
}
