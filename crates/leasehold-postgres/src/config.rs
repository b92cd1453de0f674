//! How to reach the database, and the tuning of the PostgreSQL backend
//! (`leasehold serve --store postgres://...` and its flags fill it in).

use std::time::Duration;

use leasehold_core::events::DEFAULT_EVENT_LOG_LEN;
use leasehold_core::lessor::{DEFAULT_HISTORY_LEN, DEFAULT_RETENTION_MS};

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
    /// Raise the schema's fence sequence to at least this at start-up
    /// (`--fence-floor`, 0: leave it), never lowering it, so every fence
    /// any server on the schema grants from then on is above it (see
    /// `fence_floor`).
    pub fence_floor: u64,
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
            fence_floor: 0,
        }
    }
}
