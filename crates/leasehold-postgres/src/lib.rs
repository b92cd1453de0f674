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
//! SQLite engine does (`key_row::KeyNow`).
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
//! server that died lapse after [`PgConfig::waiter_lease`]. The heartbeat
//! that finds a grant takes it (marks the row, before answering); a grant
//! still untaken when its row lapses (its server died after the grant was
//! made, or the wait was cancelled) is undone by a sweep
//! (`sql::UNDO_UNTAKEN`), so the key does not stay held by nobody for the
//! grant's TTL. A line holds at
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
//! term, readers derive what its end does from the row (`key_row::KeyRow::at`),
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
//! Each part owns its state and holds the code that changes it; they
//! share only the database (`db`), passed to each as `&Db`:
//! - this module: configuration, start-up (which wires the parts and
//!   starts their tasks), and the [`Backend`] implementation, the one place
//!   where an operation goes through more than one part (a renewal or a
//!   release tries its batch first, then the single-row path);
//! - `db`: the pool, the NOTIFY channel, the settings and the stopping
//!   flag; the read that brings a key up to date; the error table;
//! - `acquire`: Acquire, now or in line (`Line`, the wake-ups);
//!   `listen`: the NOTIFY connection that feeds them;
//! - `holding`: renew, release and check alone on one row; `reading`:
//!   Get, List, History, Unquarantine; `ledger`: the tool-call ledger;
//! - `renewals`, `batch`: the queues that let concurrent renewals, grants
//!   and releases share a statement (`Batcher`);
//! - `sweeper`: the periodic sweep; `health`: the database probe;
//!   `events`: Watch (the log's sequencer, and this server's `Feed`);
//! - `order`: per-key call order; `key_row`: a key's row read into domain
//!   values, and the refusals it implies; [`sql`]: every statement;
//!   [`migrate`]: the versioned schema.
//!
//! # Durability
//! A reply is sent only after its statement committed, and refusals read
//! committed rows only, so nothing a client is told can be undone by a
//! crash of a leasehold server. Whether a commit survives the database's
//! own failover is the database's replication setting (see
//! `docs/deploy.md`). When the database cannot be reached every request is
//! refused with UNAVAILABLE; nothing is guessed.

mod acquire;
mod batch;
mod config;
mod db;
mod events;
mod fence_floor;
mod health;
mod holding;
mod key_row;
mod ledger;
mod listen;
pub mod migrate;
mod order;
mod reading;
mod renewals;
pub mod sql;
mod sweeper;

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use futures_util::future::BoxFuture;
use tokio::sync::{broadcast, watch};
use tokio::task::AbortHandle;
use tokio_postgres::NoTls;

use leasehold_core::error::Result;
use leasehold_core::events::Selector;
use leasehold_core::lease::{EndedTerm, Fence, Handoff, Key, LeaseId, Term, TermEnd, Ttl};
use leasehold_core::ledger::{BeginOutcome, CallFilter, CallSpec, Settlement, ToolCall};
use leasehold_core::lessor::{Acquire, Grant, HistoryPage, KeyView, ListFilter, ListPage};
use leasehold_core::store::StoreError;

use acquire::Line;
use batch::{Batched, Grants, Releases, run_batches};
pub use config::PgConfig;
use db::{Db, in_time, pg_message};
use events::Feed;
use health::Health;
use leasehold_backend::{Backend, Pending};
use order::{Access, Turns};
use renewals::Renewals;

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
            .field("schema", &self.inner.db.config.schema)
            .finish_non_exhaustive()
    }
}

/// The backend as its parts, each owning its state, with the code that
/// changes it in its own module; they share only the database (`db`),
/// which holds no state a part changes but the stopping flag.
struct Inner {
    /// The pool, the channel, the settings, the stopping flag.
    db: Arc<Db>,
    /// Wake-ups for waiting Acquires (`acquire`).
    line: Line,
    /// Renewals, grants and releases queued to share statements
    /// (`renewals`, `batch`).
    renewals: Renewals,
    grants: Grants,
    releases: Releases,
    /// The feed of new events to this server's watchers (`events`).
    feed: Arc<Feed>,
    /// Whether the database answers (`health`).
    health: Arc<Health>,
    /// Per-key call order (`order`, see the module docs).
    turns: Arc<Turns>,
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
        if config.fence_floor > 0 {
            let floor = fence_floor::raise(&mut client, config.fence_floor).await?;
            tracing::info!(
                floor = floor.floor,
                before = floor.before,
                raised = floor.raised(),
                schema = %config.schema,
                "{}",
                floor.describe()
            );
        }
        drop(client);
        let channel = channel_of(&config.schema);
        let (wakes, _) = broadcast::channel(1024);
        let (renewals, renewal_queue) = Renewals::new(config.renew_batch);
        let (grants, grant_queue) = Grants::new(config.write_batch);
        let (releases, release_queue) = Releases::new(config.write_batch);
        let (renew_batch, write_batch) = (config.renew_batch, config.write_batch);
        let pool_size = config.pool_size;
        let db = Arc::new(Db {
            pool,
            channel: channel.clone(),
            closing: watch::Sender::new(false),
            config,
        });
        let inner = Arc::new(Inner {
            db: db.clone(),
            line: Line::new(wakes.clone()),
            renewals,
            grants,
            releases,
            feed: Arc::new(Feed::new(db.config.watch_buffer)),
            health: Arc::new(Health::new()),
            turns: Arc::default(),
        });
        let mut tasks = vec![
            tokio::spawn(listen::run(pg, channel, wakes)).abort_handle(),
            tokio::spawn(sweeper::run(db.clone())).abort_handle(),
            tokio::spawn(inner.health.clone().run(db.clone())).abort_handle(),
            tokio::spawn(inner.feed.clone().run(db.clone())).abort_handle(),
        ];
        // An eighth of the pool each for renewal, grant and release batches
        // at once, so single requests always find connections, and so a
        // batch waits long enough to grow: each statement and commit costs
        // the database more than a row in it (renewals had half the pool:
        // batches of about 4 where 64 clients renewed, and 0.7-0.8x the
        // renewals/s of two slots; docs/benchmarks-history.md, session 9).
        let slots = (pool_size / 8).max(1);
        // One batching loop per kind: what queued, at most `$max` a
        // statement, run by that kind's own `run`.
        macro_rules! batcher {
            ($queue:expr, $max:expr, $part:ident) => {
                if let Some(queued) = $queue {
                    let batcher = inner.clone();
                    let run = move |jobs| {
                        let inner = batcher.clone();
                        async move { inner.$part.run(&inner.db, jobs).await }
                    };
                    let loop_ = run_batches(queued, $max, slots, run);
                    tasks.push(tokio::spawn(loop_).abort_handle());
                }
            };
        }
        batcher!(renewal_queue, renew_batch, renewals);
        batcher!(grant_queue, write_batch, grants);
        batcher!(release_queue, write_batch, releases);
        tracing::info!(database = %origin, schema = %db.config.schema, "PostgreSQL backend ready");
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
    /// [`Error::Unavailable`](leasehold_core::error::Error::Unavailable)
    /// when the database cannot be reached.
    pub async fn sweep(&self) -> Result<()> {
        sweeper::sweep(&self.inner.db).await
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
        let limit = inner.db.config.op_timeout;
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
        let limit = inner.db.config.op_timeout + Duration::from_millis(request.wait.as_millis());
        Box::pin(async move {
            predecessor.applied().await;
            let _cleanup = cleanup;
            let acquire = inner.line.acquire(&inner.db, &inner.grants, request, turn);
            in_time(limit, acquire).await
        })
    }

    fn renew(&self, key: &Key, fence: Fence, lease_id: LeaseId, ttl: Option<Ttl>) -> Pending<Term> {
        let k = key.clone();
        self.ordered(key, Access::Write, move |inner| async move {
            // Most renewals share a statement; one it did not apply goes
            // alone, where a refusal is explained.
            match inner.renewals.renew(&k, fence, lease_id, ttl).await? {
                Batched::Applied(term) => Ok(term),
                Batched::Refused | Batched::Unsent => {
                    inner.db.renew(&k, fence, lease_id, ttl).await
                }
            }
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
        let end = if suspend {
            TermEnd::Suspended
        } else {
            TermEnd::Released
        };
        self.ordered(key, Access::Write, move |inner| async move {
            // The common case, nobody in line: one autocommit statement,
            // shared with this server's other releases; else a transaction
            // that also serves the line, or explains the refusal.
            let batched =
                inner
                    .releases
                    .release(&inner.db, &k, fence, lease_id, end, handoff.as_ref());
            match batched.await? {
                Some(ended) => Ok(ended),
                None => inner.db.release(&k, fence, lease_id, end, handoff).await,
            }
        })
    }

    fn history(&self, key: &Key, before: Option<Fence>, limit: usize) -> Pending<HistoryPage> {
        let k = key.clone();
        self.ordered(key, Access::Read, move |inner| async move {
            inner.db.history(&k, before, limit).await
        })
    }

    fn unquarantine(&self, key: &Key) -> Pending<KeyView> {
        let k = key.clone();
        self.ordered(key, Access::Write, move |inner| async move {
            inner.db.unquarantine(&k).await
        })
    }

    fn watch(&self, selector: Selector, start: u64) -> Pending<leasehold_backend::Watching> {
        let (feed, db) = (self.inner.feed.clone(), self.inner.db.clone());
        let limit = db.config.op_timeout;
        Box::pin(in_time(limit, feed.watch(db, selector, start)))
    }

    fn check(&self, key: &Key, fence: Fence) -> Pending<Term> {
        let k = key.clone();
        self.ordered(key, Access::Read, move |inner| async move {
            inner.db.check(&k, fence).await
        })
    }

    fn get(&self, key: &Key) -> Pending<KeyView> {
        let k = key.clone();
        self.ordered(key, Access::Read, move |inner| async move {
            inner.db.get(&k).await
        })
    }

    fn list(
        &self,
        prefix: &str,
        filter: ListFilter,
        after: Option<&Key>,
        page_size: usize,
    ) -> Pending<ListPage> {
        let db = self.inner.db.clone();
        let (prefix, after) = (prefix.to_owned(), after.cloned());
        let limit = db.config.op_timeout;
        Box::pin(in_time(limit, async move {
            db.list(prefix, filter, after, page_size).await
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
            inner.db.begin_tool_calls(&k, fence, lease_id, specs).await
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
                .db
                .settle_tool_call(&k, fence, lease_id, settlement)
                .await
        })
    }

    fn list_tool_calls(&self, key: &Key, filter: CallFilter) -> Pending<Vec<ToolCall>> {
        let k = key.clone();
        self.ordered(key, Access::Read, move |inner| async move {
            inner.db.list_tool_calls(&k, filter).await
        })
    }

    fn begin_shutdown(&self) {
        self.inner.db.closing.send_replace(true);
    }

    fn shutdown(&self) -> BoxFuture<'static, ()> {
        let db = self.inner.db.clone();
        Box::pin(async move {
            db.closing.send_replace(true);
            // Nothing is pending: every acknowledged write is committed.
            // Later requests find the pool closed: UNAVAILABLE.
            db.pool.close();
        })
    }

    fn serving(&self) -> watch::Receiver<bool> {
        self.inner.health.subscribe()
    }

    fn write_metrics(&self, out: &mut leasehold_backend::metrics::Exposition) {
        out.gauge(
            "leasehold_pg_database_up",
            "Whether the database answered the last health probe (1) or not (0).",
            if self.inner.health.up() { 1.0 } else { 0.0 },
        );
        let (watchers, revision) = self.inner.feed.stats();
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
        let counts = [
            ("renew", "terms", "Renewals", self.inner.renewals.counts()),
            (
                "grant",
                "grant attempts",
                "Grant attempts",
                self.inner.grants.counts(),
            ),
            (
                "release",
                "releases",
                "Releases",
                self.inner.releases.counts(),
            ),
        ];
        for (name, what, carried, (batches, requests)) in counts {
            let help = if name == "renew" {
                "Statements that renewed a batch of terms.".to_owned()
            } else {
                format!("Statements that applied a batch of {what}.")
            };
            out.counter(
                &format!("leasehold_pg_{name}_batches_total"),
                &help,
                batches,
            );
            out.counter(
                &format!("leasehold_pg_{name}_batched_total"),
                &format!("{carried} carried by those statements."),
                requests,
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
    use super::reading::{like_prefix, prefix_end};
    use super::*;
    use leasehold_core::lease::Fence;

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
