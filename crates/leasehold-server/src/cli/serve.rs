//! `leasehold serve`: its flags, the store it picks (SQLite or PostgreSQL),
//! and the listeners, logging and signals around the server.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::ValueEnum;

use leasehold_core::SystemClock;
use leasehold_server::Backend;
use leasehold_server::engine::EngineConfig;
use leasehold_server::postgres::{PgBackend, PgConfig};
use leasehold_server::server;
use leasehold_server::sqlite::SyncMode;

/// `leasehold serve`: the flags of the server.
#[derive(Debug, clap::Args)]
pub(super) struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:7420", env = "LEASEHOLD_LISTEN")]
    listen: SocketAddr,
    /// SQLite database file (created if missing); the same as
    /// `--store sqlite:PATH`.
    #[arg(long, default_value = "./leasehold.db", env = "LEASEHOLD_DB")]
    db: PathBuf,
    /// Where the leases live: `sqlite:PATH` (one server, the default:
    /// `--db`), or `postgres://user@host:port/database` (any number of
    /// servers on one database; see docs/deploy.md).
    #[arg(long, env = "LEASEHOLD_STORE", value_parser = parse_store, conflicts_with = "db")]
    store: Option<StoreUrl>,
    /// PostgreSQL only: the schema holding leasehold's tables (created if
    /// missing). Every server of one deployment names the same schema.
    /// [default: leasehold]
    #[arg(long, env = "LEASEHOLD_PG_SCHEMA")]
    pg_schema: Option<String>,
    /// PostgreSQL only: connections in the pool. [default: 16]
    #[arg(long)]
    pg_pool_size: Option<usize>,
    /// PostgreSQL only: the most concurrent renewals one statement
    /// applies; 1 sends each renewal alone. [default: 256]
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    pg_renew_batch: Option<u16>,
    /// PostgreSQL only: the most concurrent grants, and the most
    /// concurrent releases, one statement applies; 1 sends each alone.
    /// [default: 256]
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    pg_write_batch: Option<u16>,
    /// SQLite only. full: every acknowledged write survives power loss;
    /// normal: survives crashes only. (PostgreSQL commits as the
    /// database's synchronous_commit says.) [default: full]
    #[arg(long, value_enum)]
    sync: Option<SqliteSync>,
    /// On SIGINT/SIGTERM, how long to wait for open connections to finish.
    #[arg(long, default_value_t = 5000)]
    drain_timeout_ms: u64,
    /// How long a key released cleanly is remembered (its last term, its
    /// settled tool calls) before it is forgotten; expired and suspended
    /// keys are kept until taken over.
    #[arg(long, alias = "ledger-retention-ms", default_value_t = leasehold_core::lessor::DEFAULT_RETENTION_MS)]
    retention_ms: u64,
    /// How many ended terms each key remembers (History).
    #[arg(long, default_value_t = leasehold_core::lessor::DEFAULT_HISTORY_LEN)]
    history_len: usize,
    /// Quarantine a key after this many terms in a row end by expiry or
    /// suspension, when its Acquire sets no limit of its own (0: never).
    #[arg(long, default_value_t = 0)]
    max_recoveries: u32,
    /// How many events the Watch log keeps (SQLite); a watcher resuming
    /// from an older revision must re-list.
    #[arg(long, default_value_t = leasehold_core::events::DEFAULT_EVENT_LOG_LEN)]
    event_log_len: usize,
    /// How many commits a watcher may fall behind before it is cut off.
    #[arg(long, default_value_t = 4096)]
    watch_buffer: usize,
    /// SQLite only. How long the writer stays awake after a commit for
    /// the next request before it sleeps, in microseconds (0, the
    /// default: never): lower latency for a request that follows a reply
    /// closely, for up to this much CPU per commit. For a host with a
    /// core to spare (400 is a good start); see docs/operations.md.
    #[arg(long)]
    writer_spin_us: Option<u64>,
    /// Grant every fence above N: raises the store's fence high-water mark
    /// to at least N before serving, durably, never lowering it (a floor
    /// at or below it changes nothing, and says so in the log). For a lock
    /// server whose store was reset or replaced while applications still
    /// hold fences it granted: N is the highest fence their fence tables
    /// hold (see docs/deploy.md). On PostgreSQL the whole fleet draws
    /// above it from then on.
    #[arg(long, value_name = "N", env = "LEASEHOLD_FENCE_FLOOR",
          value_parser = clap::value_parser!(u64).range(0..=leasehold_server::backend::MAX_FENCE_FLOOR))]
    fence_floor: Option<u64>,
    /// Log lines on stderr: text for people (coloured only on a terminal,
    /// and not when NO_COLOR is set), json for log pipelines (one JSON
    /// object per line). RUST_LOG picks the level (default info).
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "LEASEHOLD_LOG_FORMAT")]
    log_format: LogFormat,
    /// Also serve Prometheus metrics at http://ADDR/metrics (off unless given).
    #[arg(long, env = "LEASEHOLD_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,
    /// Also serve the web console at http://ADDR/ (off unless given; see
    /// docs/console.md). Off loopback it needs --auth (bearer tokens),
    /// or --insecure.
    #[arg(long, env = "LEASEHOLD_CONSOLE_LISTEN")]
    console_listen: Option<SocketAddr>,
    #[command(flatten)]
    tls: ServeSecurity,
    #[command(flatten)]
    limits: ServeLimits,
}

/// Runs the server until SIGINT or SIGTERM.
pub(super) async fn run(args: ServeArgs) -> ExitCode {
    let ServeArgs {
        listen,
        db,
        store,
        pg_schema,
        pg_pool_size,
        pg_renew_batch,
        pg_write_batch,
        sync,
        drain_timeout_ms,
        retention_ms,
        history_len,
        max_recoveries,
        event_log_len,
        watch_buffer,
        writer_spin_us,
        fence_floor,
        log_format,
        metrics_listen,
        console_listen,
        tls,
        limits,
    } = args;
    init_logging(log_format);
    let drain_timeout = Duration::from_millis(drain_timeout_ms);
    let Some((server_tls, auth)) = prepare_security(listen, console_listen, &tls) else {
        return ExitCode::FAILURE;
    };
    let edge = Edge {
        listen,
        metrics_listen,
        console_listen,
        server_tls,
        auth,
        drain_timeout,
        limits: limits.limits(),
        max_transcript_bytes: limits.max_transcript_bytes,
    };
    let store = store.unwrap_or(StoreUrl::Sqlite(db));
    // A flag of the other backend is refused, not ignored: a PostgreSQL
    // fleet started with --sync normal was never going to get it.
    let misplaced = match store {
        StoreUrl::Sqlite(_) => [
            ("--pg-schema (LEASEHOLD_PG_SCHEMA)", pg_schema.is_some()),
            ("--pg-pool-size", pg_pool_size.is_some()),
            ("--pg-renew-batch", pg_renew_batch.is_some()),
            ("--pg-write-batch", pg_write_batch.is_some()),
        ]
        .into_iter()
        .find(|(_, given)| *given)
        .map(|(flag, _)| {
            (
                flag,
                "a PostgreSQL store (--store postgres://...)",
                "SQLite",
            )
        }),
        StoreUrl::Postgres(_) => [
            ("--sync", sync.is_some()),
            ("--writer-spin-us", writer_spin_us.is_some()),
        ]
        .into_iter()
        .find(|(_, given)| *given)
        .map(|(flag, _)| (flag, "a SQLite store", "PostgreSQL")),
    };
    if let Some((flag, for_store, this)) = misplaced {
        eprintln!("error: {flag} is for {for_store}; this server's store is {this}");
        return ExitCode::FAILURE;
    }
    match store {
        StoreUrl::Sqlite(db) => {
            let config = EngineConfig {
                retention_ms,
                max_waiters_per_key: limits.max_waiters_per_key,
                history_len,
                default_max_recoveries: (max_recoveries > 0).then_some(max_recoveries),
                event_log_len,
                watch_buffer,
                writer_spin: writer_spin_us.map_or(
                    leasehold_server::engine::DEFAULT_WRITER_SPIN,
                    Duration::from_micros,
                ),
                fence_floor: fence_floor.unwrap_or(0),
                ..EngineConfig::default()
            };
            serve(db, sync.unwrap_or(SqliteSync::Full), config, edge).await
        }
        StoreUrl::Postgres(url) => {
            let defaults = PgConfig::new(url);
            let config = PgConfig {
                schema: pg_schema.unwrap_or(defaults.schema.clone()),
                pool_size: pg_pool_size.unwrap_or(defaults.pool_size),
                renew_batch: pg_renew_batch.map_or(defaults.renew_batch, usize::from),
                write_batch: pg_write_batch.map_or(defaults.write_batch, usize::from),
                retention_ms,
                max_waiters_per_key: limits.max_waiters_per_key,
                history_len,
                default_max_recoveries: (max_recoveries > 0).then_some(max_recoveries),
                event_log_len,
                watch_buffer,
                fence_floor: fence_floor.unwrap_or(0),
                ..defaults
            };
            serve_postgres(config, edge).await
        }
    }
}

/// Limits against greedy clients, for `serve`; reaching one is
/// RESOURCE_EXHAUSTED for that client only.
#[derive(Debug, Clone, clap::Args)]
pub(super) struct ServeLimits {
    /// Acquires that may wait in one key's line (on PostgreSQL: from every
    /// server on the schema together).
    #[arg(long, default_value_t = leasehold_server::limits::DEFAULT_MAX_WAITERS_PER_KEY)]
    max_waiters_per_key: usize,
    /// Waiting Acquires one connection may have at once.
    #[arg(long, default_value_t = 10_000)]
    max_waits_per_connection: usize,
    /// Session streams one connection may have open at once.
    #[arg(long, default_value_t = 64)]
    max_streams_per_connection: usize,
    /// Operations per second per caller (principal, else IP address); 0 is
    /// no limit.
    #[arg(long, default_value_t = 0)]
    max_ops_per_second: u32,
    /// The largest request message, in bytes.
    #[arg(long, default_value_t = 4 * 1024 * 1024)]
    max_message_bytes: usize,
    /// The largest transcript a `Transcripts` request may carry, in bytes.
    #[arg(long, default_value_t = leasehold_server::grpc::transcripts::DEFAULT_MAX_TRANSCRIPT_BYTES)]
    max_transcript_bytes: usize,
    /// Keys one principal (under --auth) may hold at once: its live terms
    /// and Acquires in flight; 0 is no limit.
    #[arg(long, default_value_t = 10_000)]
    max_keys_per_principal: usize,
}

impl ServeLimits {
    fn limits(&self) -> leasehold_server::limits::Limits {
        leasehold_server::limits::Limits {
            waits_per_connection: self.max_waits_per_connection,
            streams_per_connection: self.max_streams_per_connection,
            ops_per_second: self.max_ops_per_second,
            max_message_bytes: self.max_message_bytes,
            keys_per_principal: self.max_keys_per_principal,
        }
    }
}

/// TLS and client authentication for `serve`.
#[derive(Debug, Clone, clap::Args)]
pub(super) struct ServeSecurity {
    /// PEM certificate chain: serve TLS (reloaded on SIGHUP).
    #[arg(long, env = "LEASEHOLD_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of the certificate.
    #[arg(long, env = "LEASEHOLD_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// PEM CA certificates: require client certificates that chain to them
    /// (mutual TLS).
    #[arg(long, env = "LEASEHOLD_CLIENT_CA", requires = "tls_cert")]
    client_ca: Option<PathBuf>,
    /// A TOML file of principals (bearer tokens or client-certificate
    /// subjects) and their scopes; every request is checked against it.
    #[arg(long, env = "LEASEHOLD_AUTH")]
    auth: Option<PathBuf>,
    /// Serve on a non-loopback address without authenticating clients
    /// (--auth or --client-ca). Anyone who can reach the port can then
    /// acquire any key.
    #[arg(long)]
    insecure: bool,
}

/// Where `serve` keeps the leases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum StoreUrl {
    /// One server over a SQLite file.
    Sqlite(PathBuf),
    /// Any number of servers over one PostgreSQL database (its URL).
    Postgres(String),
}

/// Parses `--store`: `sqlite:PATH` or a `postgres://` / `postgresql://` URL.
pub(super) fn parse_store(text: &str) -> Result<StoreUrl, String> {
    if let Some(path) = text.strip_prefix("sqlite:") {
        if path.is_empty() {
            return Err("sqlite: needs a file path, e.g. sqlite:./leasehold.db".into());
        }
        return Ok(StoreUrl::Sqlite(PathBuf::from(path)));
    }
    if text.starts_with("postgres://") || text.starts_with("postgresql://") {
        return Ok(StoreUrl::Postgres(text.to_owned()));
    }
    Err(format!(
        "{text:?} is not a store: use sqlite:PATH or postgres://user@host:port/database"
    ))
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(super) enum SqliteSync {
    Full,
    Normal,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(super) enum LogFormat {
    Text,
    Json,
}

/// Where and how the server meets its clients, whatever the backend.
pub(super) struct Edge {
    listen: SocketAddr,
    metrics_listen: Option<SocketAddr>,
    console_listen: Option<SocketAddr>,
    server_tls: Option<Arc<leasehold_server::tls::ServerTls>>,
    auth: Option<Arc<leasehold_server::auth::AuthConfig>>,
    drain_timeout: Duration,
    limits: leasehold_server::limits::Limits,
    max_transcript_bytes: usize,
}

/// The server's TLS set-up and auth file, each when configured.
pub(super) type Security = (
    Option<Arc<leasehold_server::tls::ServerTls>>,
    Option<Arc<leasehold_server::auth::AuthConfig>>,
);

/// Checks and loads the TLS and auth set-up; `None` (after saying why on
/// stderr) when the server must not start.
pub(super) fn prepare_security(
    listen: SocketAddr,
    console_listen: Option<SocketAddr>,
    security: &ServeSecurity,
) -> Option<Security> {
    // Off loopback, every lease_id crosses the network and anyone who can
    // reach the port can take any key: insist on authenticated clients
    // (--auth or mutual TLS) or an explicit --insecure.
    let authenticated = security.client_ca.is_some() || security.auth.is_some();
    if refuse_unauthenticated(
        listen,
        authenticated,
        security.insecure,
        "serve",
        "--auth FILE (tokens or certificate subjects) or --tls-cert/--tls-key with \
         --client-ca (mutual TLS)",
    ) {
        return None;
    }
    // The console takes bearer tokens only: a client CA does not guard it.
    if let Some(console) = console_listen {
        if refuse_unauthenticated(
            console,
            security.auth.is_some(),
            security.insecure,
            "serve the console",
            "--auth FILE (bearer tokens; the console does not take client certificates)",
        ) {
            return None;
        }
    }
    let auth = match &security.auth {
        None => None,
        Some(path) => match leasehold_server::auth::AuthConfig::load(path) {
            Ok(config) => Some(Arc::new(config)),
            Err(e) => {
                eprintln!("error: {e}");
                return None;
            }
        },
    };
    if auth.is_some() && security.tls_cert.is_none() && !listen.ip().is_loopback() {
        tracing::warn!(
            "--auth without TLS: bearer tokens and lease ids cross the network in clear text"
        );
    }
    let server_tls = match (&security.tls_cert, &security.tls_key) {
        (Some(cert), Some(key)) => {
            let files = leasehold_server::tls::TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: security.client_ca.clone(),
            };
            match leasehold_server::tls::ServerTls::load(files) {
                Ok(loaded) => {
                    // Before the "listening on" line: a SIGHUP's default
                    // action would end the process.
                    reload_on_sighup(loaded.clone());
                    Some(loaded)
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    return None;
                }
            }
        }
        _ => None,
    };
    Some((server_tls, auth))
}

/// Whether to refuse to `what` on `addr`: it is not a loopback address, its
/// clients are not authenticated (`how` says how they could be), and
/// `--insecure` was not given. Says why on stderr.
pub(super) fn refuse_unauthenticated(
    addr: SocketAddr,
    authenticated: bool,
    insecure: bool,
    what: &str,
    how: &str,
) -> bool {
    if addr.ip().is_loopback() || authenticated || insecure {
        return false;
    }
    eprintln!(
        "error: refusing to {what} on {addr}, which is not a loopback address, without \
         client authentication: give {how}, or --insecure to accept any client"
    );
    true
}

pub(super) async fn serve(
    db: PathBuf,
    sync: SqliteSync,
    config: EngineConfig,
    edge: Edge,
) -> ExitCode {
    let sync = match sync {
        SqliteSync::Full => SyncMode::Full,
        SqliteSync::Normal => SyncMode::Normal,
    };
    let engine = match server::open_engine(&db, sync, Arc::new(SystemClock::new()), config) {
        Ok(engine) => engine,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let announce = |addr: SocketAddr| {
        tracing::info!(%addr, db = %db.display(), ?sync, "leasehold serving");
    };
    serve_backend(engine, announce, edge).await
}

/// `serve --store postgres://…`: connects (migrating the schema if needed),
/// then serves.
pub(super) async fn serve_postgres(config: PgConfig, edge: Edge) -> ExitCode {
    let schema = config.schema.clone();
    let backend = match PgBackend::connect(config).await {
        Ok(backend) => backend,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let announce = |addr: SocketAddr| {
        tracing::info!(%addr, store = "postgres", %schema, "leasehold serving");
    };
    serve_backend(backend, announce, edge).await
}

/// Listens where `edge` says and serves `backend` until SIGINT/SIGTERM;
/// `announce` logs the start-up line.
pub(super) async fn serve_backend(
    backend: impl Backend,
    announce: impl FnOnce(SocketAddr),
    edge: Edge,
) -> ExitCode {
    let Edge {
        listen,
        metrics_listen,
        console_listen,
        server_tls,
        auth,
        drain_timeout,
        limits,
        max_transcript_bytes,
    } = edge;
    let listener = match tokio::net::TcpListener::bind(listen).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("error: cannot listen on {listen}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let addr = listener.local_addr().map_or(listen, |a| a);
    let metrics_listener = match metrics_listen {
        None => None,
        Some(at) => match tokio::net::TcpListener::bind(at).await {
            Ok(listener) => Some(listener),
            Err(e) => {
                eprintln!("error: cannot listen for metrics on {at}: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    if let Some(metrics) = &metrics_listener {
        if let Ok(at) = metrics.local_addr() {
            tracing::info!(%at, "metrics at /metrics");
        }
    }
    let console_listener = match console_listen {
        None => None,
        Some(at) => match tokio::net::TcpListener::bind(at).await {
            Ok(listener) => Some(listener),
            Err(e) => {
                eprintln!("error: cannot listen for the console on {at}: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    let console_addr = console_listener
        .as_ref()
        .and_then(|listener| listener.local_addr().ok());
    // Catch SIGINT/SIGTERM from here on: a supervisor (or test) that signals
    // as soon as it reads the line below gets a clean shutdown, not the
    // signal's default action.
    let shutdown = shutdown_signal();
    announce(addr);
    // One plain line on stdout, so scripts (and tests) can learn a port chosen with :0.
    println!("listening on {addr}");
    // And the console's, on the next line, when it is served.
    if let Some(at) = console_addr {
        tracing::info!(%at, "console at http://{at}/");
        println!("console on http://{at}/");
    }
    let options = server::ServeOptions {
        drain_timeout,
        limits,
        max_transcript_bytes,
        ..server::ServeOptions::default()
    };
    let listeners = server::Listeners {
        grpc: listener,
        metrics: metrics_listener,
        tls: server_tls,
        auth,
        console: console_listener,
    };
    match server::serve_on(listeners, backend, shutdown, options).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Sends the server's logs to stderr in `format`, at the level RUST_LOG names
/// (default info).
pub(super) fn init_logging(format: LogFormat) {
    let logs = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        );
    match format {
        LogFormat::Text => logs.with_ansi(colour_stderr()).init(),
        LogFormat::Json => logs.json().with_ansi(false).init(),
    }
}

/// Colour codes only for a person at a terminal: not when stderr goes to a
/// file, a pipe or a journal, and not when NO_COLOR is set to anything but
/// the empty string (<https://no-color.org>).
pub(super) fn colour_stderr() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Starts catching SIGINT and SIGTERM now (not at the first poll); the
/// future resolves on the first of them.
#[cfg(unix)]
pub(super) fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{Signal, SignalKind, signal};
    async fn recv(signal: Option<Signal>) {
        match signal {
            Some(mut signal) => {
                signal.recv().await;
            }
            None => std::future::pending::<()>().await,
        }
    }
    let interrupt = recv(signal(SignalKind::interrupt()).ok());
    let terminate = recv(signal(SignalKind::terminate()).ok());
    async move {
        tokio::select! {
            () = interrupt => {}
            () = terminate => {}
        }
    }
}

/// Reads the TLS files again on every SIGHUP (certificate rotation); open
/// connections keep the configuration they started with.
#[cfg(unix)]
pub(super) fn reload_on_sighup(tls: std::sync::Arc<leasehold_server::tls::ServerTls>) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hangups) = signal(SignalKind::hangup()) else {
        tracing::warn!("cannot catch SIGHUP: TLS certificates will not be reloaded");
        return;
    };
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            match tls.reload() {
                Ok(()) => tracing::info!("TLS certificates reloaded"),
                Err(e) => {
                    tracing::error!(error = %e, "TLS reload failed; keeping the old certificates")
                }
            }
        }
    });
}

#[cfg(not(unix))]
pub(super) fn reload_on_sighup(_tls: std::sync::Arc<leasehold_server::tls::ServerTls>) {}

/// Resolves on Ctrl-C.
#[cfg(not(unix))]
pub(super) fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}
