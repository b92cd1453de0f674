//! A server of either backend for the contract suites (`contract.rs`,
//! `tool_calls.rs`): each test is written once against [`Backend`] and
//! declared for both backends by [`contract!`], so `sqlite::<test>` runs it
//! on a real SQLite file with a manual clock and `postgres::<test>` on a
//! fresh PostgreSQL schema on the database's clock (skipped with a note
//! when `LEASEHOLD_TEST_POSTGRES` is unset).
//!
//! A test lets time pass with [`Backend::pass`] (a clock step on SQLite,
//! real time on PostgreSQL, so TTLs that expire are a few hundred
//! milliseconds), waits for waiters with [`Backend::in_line`], and asserts
//! times relative to what the server returned, never a fixed origin.
//!
//! A test that needs a server set up otherwise than by default names a
//! function returning its [`Settings`] in the macro
//! (`contract!(a_test with its_settings)`); both backends' servers get them.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use leasehold_core::Clock;
use leasehold_server::EngineConfig;
use leasehold_server::limits::DEFAULT_MAX_WAITERS_PER_KEY;
use leasehold_server::postgres::PgConfig;
use leasehold_wire::pb::leasehold_client::LeaseholdClient;
use tonic::transport::Channel;

use super::common::TestServer;
use super::pg_harness::{self, PgServer, Schema};

/// What a contract test may set on the server, whichever the backend: each
/// is one `leasehold serve` flag, which both backends' configurations take.
/// The default is the flags' defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// `--max-waiters-per-key`.
    pub max_waiters_per_key: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_waiters_per_key: DEFAULT_MAX_WAITERS_PER_KEY,
        }
    }
}

impl Settings {
    fn engine_config(self) -> EngineConfig {
        EngineConfig {
            max_waiters_per_key: self.max_waiters_per_key,
            ..EngineConfig::default()
        }
    }

    fn pg_config(self, config: PgConfig) -> PgConfig {
        PgConfig {
            max_waiters_per_key: self.max_waiters_per_key,
            ..config
        }
    }
}

/// A server of either backend, and how a test drives its clock.
pub enum Backend {
    Sqlite(TestServer),
    // The server goes before its schema (fields drop in order). `lazy`:
    // no sweeper, so every expiry is first acted on by a request.
    Postgres {
        server: PgServer,
        schema: Schema,
        lazy: bool,
        settings: Settings,
    },
}

impl Backend {
    pub async fn sqlite() -> Backend {
        Self::sqlite_with(Settings::default()).await
    }

    pub async fn sqlite_with(settings: Settings) -> Backend {
        let server = TestServer::builder()
            .config(settings.engine_config())
            .start()
            .await;
        Backend::Sqlite(server)
    }

    /// `None` (the test passes, with a note) when no database is configured.
    pub async fn postgres() -> Option<Backend> {
        Self::postgres_with(Settings::default()).await
    }

    pub async fn postgres_with(settings: Settings) -> Option<Backend> {
        Self::start_postgres(false, settings).await
    }

    /// PostgreSQL without the sweeper: every expiry is moved lazily, by the
    /// first request that meets it (`contract_lazy!`).
    pub async fn postgres_without_sweeper(settings: Settings) -> Option<Backend> {
        Self::start_postgres(true, settings).await
    }

    async fn start_postgres(lazy: bool, settings: Settings) -> Option<Backend> {
        let schema = Schema::fresh(pg_harness::database()?);
        let server = PgServer::start_with(Self::config(&schema, lazy, settings)).await;
        Some(Backend::Postgres {
            server,
            schema,
            lazy,
            settings,
        })
    }

    fn config(schema: &Schema, lazy: bool, settings: Settings) -> PgConfig {
        settings.pg_config(if lazy {
            schema.config_without_sweeper()
        } else {
            schema.config()
        })
    }

    pub async fn client(&self) -> LeaseholdClient<Channel> {
        match self {
            Backend::Sqlite(server) => server.client().await,
            Backend::Postgres { server, .. } => server.client().await,
        }
    }

    pub fn url(&self) -> String {
        match self {
            Backend::Sqlite(server) => server.url(),
            Backend::Postgres { server, .. } => server.url(),
        }
    }

    /// Stops the server cleanly and starts a new one on the same store.
    pub async fn restart(self) -> Backend {
        match self {
            Backend::Sqlite(server) => Backend::Sqlite(server.restart().await),
            Backend::Postgres {
                mut server,
                schema,
                lazy,
                settings,
            } => {
                server.stop().await;
                let server = PgServer::start_with(Self::config(&schema, lazy, settings)).await;
                Backend::Postgres {
                    server,
                    schema,
                    lazy,
                    settings,
                }
            }
        }
    }

    /// The lease clock's time (ms since the epoch).
    pub async fn now_ms(&self) -> u64 {
        match self {
            Backend::Sqlite(server) => server.clock.now(),
            Backend::Postgres { schema, .. } => schema.now_ms().await,
        }
    }

    /// Lets `ms` pass on the lease clock: one step of the manual clock, or
    /// real time until the database's clock has moved that far.
    pub async fn pass(&self, ms: u64) {
        match self {
            Backend::Sqlite(server) => {
                server.clock.advance(ms);
                // The engine's timer runs on the runtime: let it act.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Backend::Postgres { schema, .. } => {
                let until = schema.now_ms().await + ms;
                let deadline = Instant::now() + Duration::from_secs(10);
                loop {
                    let now = schema.now_ms().await;
                    if now >= until {
                        return;
                    }
                    assert!(Instant::now() < deadline, "the database clock stands still");
                    tokio::time::sleep(Duration::from_millis((until - now).min(100))).await;
                }
            }
        }
    }

    /// Waits until `n` Acquires wait in line for `key` (SQLite: `n` in all).
    pub async fn in_line(&self, key: &str, n: usize) {
        match self {
            Backend::Sqlite(server) => {
                let deadline = Instant::now() + Duration::from_secs(10);
                while server.engine.waiter_count() < n {
                    assert!(Instant::now() < deadline, "fewer than {n} in line");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            Backend::Postgres { schema, .. } => schema.in_line(key, n).await,
        }
    }
}

/// The [`Settings`] of a test declared `with settings` (a function in the
/// suite), else the defaults; expanded in the suite's `sqlite` and
/// `postgres` modules, hence `super::`.
#[macro_export]
macro_rules! settings_of {
    () => {
        super::backends::Settings::default()
    };
    ($settings:ident) => {
        super::$settings()
    };
}

/// Declares each contract test once per backend; `a_test with settings`
/// starts its servers with `settings()` (a function beside the tests
/// returning [`Settings`]) instead of the defaults.
#[macro_export]
macro_rules! contract {
    ($($name:ident $(with $settings:ident)?),+ $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let settings = settings_of!($($settings)?);
                    super::$name(super::backends::Backend::sqlite_with(settings).await).await;
                }
            )+
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let settings = settings_of!($($settings)?);
                    if let Some(backend) = super::backends::Backend::postgres_with(settings).await {
                        super::$name(backend).await;
                    }
                }
            )+
        }
    };
}

/// Declares each test once more on PostgreSQL without the sweeper
/// (`postgres_lazy::<test>`), for behaviour that must not depend on it.
#[macro_export]
macro_rules! contract_lazy {
    ($($name:ident $(with $settings:ident)?),+ $(,)?) => {
        mod postgres_lazy {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let settings = settings_of!($($settings)?);
                    if let Some(backend) =
                        super::backends::Backend::postgres_without_sweeper(settings).await
                    {
                        super::$name(backend).await;
                    }
                }
            )+
        }
    };
}
