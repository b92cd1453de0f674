//! Command-line parsing and the operator commands.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use serde_json::{Value, json};

use leasehold_client::{Client, ClientError};
use leasehold_core::SystemClock;
use leasehold_core::events::{Event, EventKind, Selector};
use leasehold_core::lease::{
    Ended, Fence, Handoff, HistoryEntry, Key, Lease, LeaseId, Reservation, TermEnd, Ttl,
};
use leasehold_core::lessor::ListFilter;
use leasehold_server::Backend;
use leasehold_server::engine::EngineConfig;
use leasehold_server::postgres::{PgBackend, PgConfig};
use leasehold_server::server;
use leasehold_server::sqlite::SyncMode;
use leasehold_transcript as transcript;
use leasehold_wire::{convert, pb};

/// How long `leasehold check` waits for its answer.
const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// leasehold: per-key leases with fencing tokens, over gRPC, on SQLite or PostgreSQL.
#[derive(Debug, Parser)]
#[command(name = "leasehold", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the lease server.
    Serve {
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
        store: Option<Store>,
        /// PostgreSQL only: the schema holding leasehold's tables (created if
        /// missing). Every server of one deployment names the same schema.
        #[arg(long, default_value = "leasehold", env = "LEASEHOLD_PG_SCHEMA")]
        pg_schema: String,
        /// PostgreSQL only: connections in the pool.
        #[arg(long, default_value_t = 16)]
        pg_pool_size: usize,
        /// PostgreSQL only: the most concurrent renewals one statement
        /// applies; 1 sends each renewal alone.
        #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u16).range(1..))]
        pg_renew_batch: u16,
        /// PostgreSQL only: the most concurrent grants, and the most
        /// concurrent releases, one statement applies; 1 sends each alone.
        #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u16).range(1..))]
        pg_write_batch: u16,
        /// SQLite only. full: every acknowledged write survives power loss;
        /// normal: survives crashes only. (PostgreSQL commits as the
        /// database's synchronous_commit says.)
        #[arg(long, value_enum, default_value_t = Sync::Full)]
        sync: Sync,
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
        #[arg(long, default_value_t = default_writer_spin_us())]
        writer_spin_us: u64,
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
    },
    /// Diagnose or repair tool-call pairing in a transcript (JSON array or JSON lines).
    Transcript {
        #[command(subcommand)]
        command: TranscriptCommand,
    },
    /// Acquire a lease on KEY.
    Acquire {
        key: String,
        #[command(flatten)]
        target: Target,
        /// Who holds the lease (shown to others).
        #[arg(long, default_value_t = default_owner())]
        owner: String,
        /// Lease duration in milliseconds.
        #[arg(long, default_value_t = 30_000)]
        ttl_ms: u64,
        /// Wait up to this long for a held key (FIFO).
        #[arg(long, default_value_t = 0)]
        wait_ms: u64,
        /// Retry token: repeating it returns the same lease.
        #[arg(long, default_value = "")]
        request_id: String,
        /// If the term expires, keep the key from everyone this long (ms).
        #[arg(long, default_value_t = 0)]
        lock_delay_ms: u64,
        /// Quarantine the key after this many failed terms in a row (0: the
        /// server's default).
        #[arg(long, default_value_t = 0)]
        max_recoveries: u32,
        /// Acquire even a quarantined key (needs the admin right).
        #[arg(long)]
        force: bool,
    },
    /// Extend a lease.
    Renew {
        key: String,
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        fence: u64,
        #[arg(long)]
        lease_id: String,
        /// New TTL in milliseconds (0 keeps the current one).
        #[arg(long, default_value_t = 0)]
        ttl_ms: u64,
    },
    /// End a lease.
    Release {
        key: String,
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        fence: u64,
        #[arg(long)]
        lease_id: String,
        /// Release as unfinished, so the key is listed as recoverable.
        #[arg(long)]
        suspend: bool,
        /// Keep the key for this owner: only its Acquire gets it.
        #[arg(long, default_value = "")]
        successor: String,
        /// How long the key waits for the successor (ms; 0: 30 s).
        #[arg(long, default_value_t = 0)]
        handoff_ms: u64,
    },
    /// Show a key's last ended terms, newest first.
    History {
        key: String,
        #[command(flatten)]
        target: Target,
        /// Entries per page (at most 1000).
        #[arg(long, default_value_t = 100)]
        page_size: u32,
    },
    /// Print every change of ownership of a key or prefix as it happens, one
    /// line per event (JSON with --json), until interrupted or --count.
    Watch {
        #[command(flatten)]
        target: Target,
        /// Keys starting with this (empty: every key).
        #[arg(long, default_value = "")]
        prefix: String,
        /// Exactly this key instead of a prefix.
        #[arg(long)]
        key: Option<String>,
        /// The first revision to print (0: only what happens from now on).
        #[arg(long, default_value_t = 0)]
        from_revision: u64,
        /// Stop after this many events.
        #[arg(long)]
        count: Option<usize>,
    },
    /// Lift a key's quarantine (admin).
    Unquarantine {
        key: String,
        #[command(flatten)]
        target: Target,
    },
    /// Succeed only while FENCE is KEY's live term.
    Check {
        key: String,
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        fence: u64,
    },
    /// Ask a server whether it is serving (the gRPC health service: its
    /// storage answers, it is not draining) and which release, protocol
    /// revision and backend it runs. Exits 1 when it is not serving: a
    /// container's HEALTHCHECK or a probe runs it as it is.
    Health {
        #[command(flatten)]
        target: Target,
    },
    /// Show a key's live lease, last ended term and recoverability.
    Get {
        key: String,
        #[command(flatten)]
        target: Target,
    },
    /// List keys.
    List {
        #[command(flatten)]
        target: Target,
        #[arg(long, default_value = "")]
        prefix: String,
        #[arg(long, value_enum, default_value_t = Filter::All)]
        filter: Filter,
        /// Keys per page (at most 1000).
        #[arg(long, default_value_t = 100)]
        page_size: u32,
        /// Continue from a previous page's token.
        #[arg(long, default_value = "")]
        page_token: String,
        /// Follow every page.
        #[arg(long)]
        all: bool,
    },
}

#[derive(Debug, Subcommand)]
enum TranscriptCommand {
    /// Report every unmatched, duplicate, late or orphaned tool result.
    /// Exit status: 0 healthy, 1 findings, 2 unreadable input.
    Check {
        /// The transcript file; `-` reads standard input.
        file: PathBuf,
        /// openai-chat, anthropic or openai-responses (default: detect).
        #[arg(long)]
        format: Option<transcript::Format>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Move genuine results next to their calls, drop duplicates and orphans,
    /// and add unknown-outcome placeholders; list every action on stderr.
    /// Exit status: 0 repaired output is healthy, 1 unrecoverable findings
    /// remain, 2 unreadable input.
    Repair {
        /// The transcript file; `-` reads standard input.
        file: PathBuf,
        /// Where to write the repaired transcript (default: standard output).
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// openai-chat, anthropic or openai-responses (default: detect).
        #[arg(long)]
        format: Option<transcript::Format>,
        /// A substring marking another tool's placeholder result (repeatable).
        #[arg(long = "placeholder-marker")]
        placeholder_markers: Vec<String>,
        /// Print the actions as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Limits against greedy clients, for `serve`; reaching one is
/// RESOURCE_EXHAUSTED for that client only.
#[derive(Debug, Clone, clap::Args)]
struct ServeLimits {
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
struct ServeSecurity {
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

/// Where operator commands send their request, and how they print.
#[derive(Debug, clap::Args)]
struct Target {
    /// The server's address; several, comma-separated, for servers on one
    /// PostgreSQL database: when one is unavailable the next is tried.
    #[arg(
        long,
        default_value = "http://127.0.0.1:7420",
        env = "LEASEHOLD_SERVER"
    )]
    server: String,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    /// PEM file of the CA the server's certificate chains to (implies TLS;
    /// without it, https:// trusts the system's roots).
    #[arg(long, env = "LEASEHOLD_TLS_CA")]
    tls_ca: Option<PathBuf>,
    /// PEM client certificate, for a server that requires mutual TLS.
    #[arg(long, env = "LEASEHOLD_CLIENT_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM key of the client certificate.
    #[arg(long, env = "LEASEHOLD_CLIENT_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Bearer token for a server run with --auth (prefer the environment
    /// variable: command lines are visible to other users).
    #[arg(long, env = "LEASEHOLD_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

/// Where `serve` keeps the leases.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Store {
    /// One server over a SQLite file.
    Sqlite(PathBuf),
    /// Any number of servers over one PostgreSQL database (its URL).
    Postgres(String),
}

/// Parses `--store`: `sqlite:PATH` or a `postgres://` / `postgresql://` URL.
fn parse_store(text: &str) -> Result<Store, String> {
    if let Some(path) = text.strip_prefix("sqlite:") {
        if path.is_empty() {
            return Err("sqlite: needs a file path, e.g. sqlite:./leasehold.db".into());
        }
        return Ok(Store::Sqlite(PathBuf::from(path)));
    }
    if text.starts_with("postgres://") || text.starts_with("postgresql://") {
        return Ok(Store::Postgres(text.to_owned()));
    }
    Err(format!(
        "{text:?} is not a store: use sqlite:PATH or postgres://user@host:port/database"
    ))
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Sync {
    Full,
    Normal,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Filter {
    Live,
    Recoverable,
    Quarantined,
    All,
}

fn default_owner() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "cli".into());
    format!("{host}:{}", std::process::id())
}

/// Runs the command line; the process exit code says how it went.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(run(cli.command))
}

async fn run(command: Command) -> ExitCode {
    match command {
        Command::Serve {
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
            log_format,
            metrics_listen,
            console_listen,
            tls,
            limits,
        } => {
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
            match store.unwrap_or(Store::Sqlite(db)) {
                Store::Sqlite(db) => {
                    let config = EngineConfig {
                        retention_ms,
                        max_waiters_per_key: limits.max_waiters_per_key,
                        history_len,
                        default_max_recoveries: (max_recoveries > 0).then_some(max_recoveries),
                        event_log_len,
                        watch_buffer,
                        writer_spin: Duration::from_micros(writer_spin_us),
                        ..EngineConfig::default()
                    };
                    serve(db, sync, config, edge).await
                }
                Store::Postgres(url) => {
                    let config = PgConfig {
                        schema: pg_schema,
                        pool_size: pg_pool_size,
                        renew_batch: usize::from(pg_renew_batch),
                        write_batch: usize::from(pg_write_batch),
                        retention_ms,
                        max_waiters_per_key: limits.max_waiters_per_key,
                        history_len,
                        default_max_recoveries: (max_recoveries > 0).then_some(max_recoveries),
                        event_log_len,
                        watch_buffer,
                        ..PgConfig::new(url)
                    };
                    serve_postgres(config, edge).await
                }
            }
        }
        Command::Transcript { command } => transcript_command(command),
        other => {
            let as_json = wants_json(&other);
            match operate(other).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(refusal) => {
                    if as_json {
                        println!("{}", refusal.json());
                    }
                    eprintln!("error: {}", refusal.message);
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// Where and how the server meets its clients, whatever the backend.
struct Edge {
    listen: SocketAddr,
    metrics_listen: Option<SocketAddr>,
    console_listen: Option<SocketAddr>,
    server_tls: Option<Arc<leasehold_server::tls::ServerTls>>,
    auth: Option<Arc<leasehold_server::auth::AuthConfig>>,
    drain_timeout: Duration,
    limits: leasehold_server::limits::Limits,
    max_transcript_bytes: usize,
}

/// Checks and loads the TLS and auth set-up; `None` (after saying why on
/// stderr) when the server must not start.
/// The server's TLS set-up and auth file, each when configured.
type Security = (
    Option<Arc<leasehold_server::tls::ServerTls>>,
    Option<Arc<leasehold_server::auth::AuthConfig>>,
);

fn prepare_security(
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
fn refuse_unauthenticated(
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

async fn serve(db: PathBuf, sync: Sync, config: EngineConfig, edge: Edge) -> ExitCode {
    let sync = match sync {
        Sync::Full => SyncMode::Full,
        Sync::Normal => SyncMode::Normal,
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
async fn serve_postgres(config: PgConfig, edge: Edge) -> ExitCode {
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
async fn serve_backend(
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
fn init_logging(format: LogFormat) {
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
fn colour_stderr() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Starts catching SIGINT and SIGTERM now (not at the first poll); the
/// future resolves on the first of them.
#[cfg(unix)]
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
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
fn reload_on_sighup(tls: std::sync::Arc<leasehold_server::tls::ServerTls>) {
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
fn reload_on_sighup(_tls: std::sync::Arc<leasehold_server::tls::ServerTls>) {}

/// Resolves on Ctrl-C.
#[cfg(not(unix))]
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}

async fn connect(target: &Target) -> Result<Client, Refusal> {
    let read = |path: &PathBuf| {
        std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
    };
    let tls = leasehold_client::Tls {
        ca_pem: target.tls_ca.as_ref().map(read).transpose()?,
        identity: match (&target.tls_cert, &target.tls_key) {
            (Some(cert), Some(key)) => Some((read(cert)?, read(key)?)),
            _ => None,
        },
        domain: None,
    };
    let credentials = match &target.token {
        Some(token) => leasehold_client::Credentials::bearer(token).map_err(refused)?,
        None => leasehold_client::Credentials::default(),
    };
    let endpoints = target
        .server
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty());
    Client::connect_any_with(endpoints, tls, credentials)
        .await
        .map_err(|e| Refusal::from(format!("cannot connect to {}: {e}", target.server)))
}

/// Why an operator command failed: printed as a human line on stderr and,
/// under `--json`, also as one JSON object on stdout (`code`, `message`,
/// `reason`, `metadata`), so a script that parses stdout never reads an
/// empty string.
#[derive(Debug)]
struct Refusal {
    /// The human line, as printed after `error: `.
    message: String,
    /// The rest, boxed: a `Result` with a `Refusal` stays small.
    detail: Box<RefusalDetail>,
}

#[derive(Debug)]
struct RefusalDetail {
    /// The gRPC status name the server (or the client's own check by the
    /// server's rules) gave, e.g. `FAILED_PRECONDITION`; `CLIENT` for a
    /// failure the CLI met without an answer (a file it cannot read, a
    /// server it cannot reach, a watch that ended).
    code: String,
    /// The status's `leasehold-reason` (why a fence is stale, ...), if any.
    reason: Option<String>,
    /// The status's other `leasehold-*` details (holder, fence,
    /// remaining_ms, limit, ...), by name without the prefix.
    metadata: serde_json::Map<String, Value>,
}

impl From<String> for Refusal {
    fn from(message: String) -> Refusal {
        Refusal {
            message,
            detail: Box::new(RefusalDetail {
                code: "CLIENT".to_owned(),
                reason: None,
                metadata: serde_json::Map::new(),
            }),
        }
    }
}

impl Refusal {
    fn json(&self) -> Value {
        json!({
            "code": self.detail.code,
            "message": self.message,
            "reason": self.detail.reason,
            "metadata": self.detail.metadata,
        })
    }
}

/// `FailedPrecondition` -> `FAILED_PRECONDITION`, the name the status has on
/// the wire and in the Python client.
fn code_name(code: tonic::Code) -> String {
    let mut name = String::new();
    for (i, c) in format!("{code:?}").chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            name.push('_');
        }
        name.push(c.to_ascii_uppercase());
    }
    name
}

/// A refusal as the CLI reports it: the status code, then the message, and
/// the status's details for `--json`.
fn refused(err: impl Into<ClientError>) -> Refusal {
    match err.into() {
        ClientError::Server(err) => {
            let status = leasehold_wire::status::to_status(err.clone());
            let mut metadata = serde_json::Map::new();
            let mut reason = None;
            for entry in status.metadata().iter() {
                let (name, value) = match entry {
                    tonic::metadata::KeyAndValueRef::Ascii(k, v) => (
                        k.as_str().to_owned(),
                        v.to_str().unwrap_or_default().to_owned(),
                    ),
                    tonic::metadata::KeyAndValueRef::Binary(k, v) => {
                        let bytes = v.to_bytes().unwrap_or_default();
                        (
                            k.as_str().to_owned(),
                            String::from_utf8_lossy(&bytes).into_owned(),
                        )
                    }
                };
                let Some(name) = name.strip_prefix("leasehold-") else {
                    continue;
                };
                let name = name.strip_suffix("-bin").unwrap_or(name).replace('-', "_");
                if name == "reason" {
                    reason = Some(value);
                } else {
                    // Numbers (fence, remaining_ms, at_ms) as JSON numbers.
                    let value = value
                        .parse::<u64>()
                        .map_or_else(|_| Value::String(value), Value::from);
                    metadata.insert(name, value);
                }
            }
            Refusal {
                message: format!("{:?}: {err}", status.code()),
                detail: Box::new(RefusalDetail {
                    code: code_name(status.code()),
                    reason,
                    metadata,
                }),
            }
        }
        other => Refusal::from(other.to_string()),
    }
}

/// The CLI's arguments, parsed by the same rules the server applies.
fn key(text: String) -> Result<Key, Refusal> {
    Key::parse(text).map_err(refused)
}

fn lease_id(text: &str) -> Result<LeaseId, Refusal> {
    LeaseId::parse(text).map_err(refused)
}

/// Whether the operator command asked for `--json`.
fn wants_json(command: &Command) -> bool {
    match command {
        Command::Acquire { target, .. }
        | Command::Renew { target, .. }
        | Command::Release { target, .. }
        | Command::History { target, .. }
        | Command::Watch { target, .. }
        | Command::Unquarantine { target, .. }
        | Command::Check { target, .. }
        | Command::Get { target, .. }
        | Command::Health { target }
        | Command::List { target, .. } => target.json,
        Command::Serve { .. } | Command::Transcript { .. } => false,
    }
}

async fn operate(command: Command) -> Result<(), Refusal> {
    match command {
        Command::Serve { .. } | Command::Transcript { .. } => {
            unreachable!("handled by run")
        }
        Command::Acquire {
            key,
            target,
            owner,
            ttl_ms,
            wait_ms,
            request_id,
            lock_delay_ms,
            max_recoveries,
            force,
        } => {
            let acquire = convert::acquire(pb::AcquireRequest {
                key,
                owner,
                ttl_ms,
                wait_ms,
                request_id,
                lock_delay_ms,
                max_recoveries,
                force,
            })
            .map_err(refused)?;
            let granted = connect(&target)
                .await?
                .grant(&acquire)
                .await
                .map_err(refused)?;
            print(
                target.json,
                json!({
                    "lease": lease_json(&granted.lease),
                    "previous": granted.previous.as_ref().map(ended_json),
                    "replayed": granted.replayed,
                }),
            );
        }
        Command::Renew {
            key: k,
            target,
            fence,
            lease_id: id,
            ttl_ms,
        } => {
            let (k, id) = (key(k)?, lease_id(&id)?);
            let ttl = Ttl::parse_optional(ttl_ms).map_err(refused)?;
            let lease = connect(&target)
                .await?
                .renew_term(&k, Fence(fence), id, ttl)
                .await
                .map_err(refused)?;
            print(target.json, json!({ "lease": lease_json(&lease) }));
        }
        Command::Release {
            key: k,
            target,
            fence,
            lease_id: id,
            suspend,
            successor,
            handoff_ms,
        } => {
            let (k, id) = (key(k)?, lease_id(&id)?);
            let handoff = Handoff::parse_optional(successor, handoff_ms).map_err(refused)?;
            let ended = connect(&target)
                .await?
                .release_term_to(&k, Fence(fence), id, suspend, handoff.as_ref())
                .await
                .map_err(refused)?;
            print(target.json, json!({ "ended": ended_json(&ended) }));
        }
        Command::History {
            key: k,
            target,
            page_size,
        } => {
            let k = key(k)?;
            let page = connect(&target)
                .await?
                .history(&k, page_size, None)
                .await
                .map_err(refused)?;
            let entries: Vec<Value> = page.entries.iter().map(history_json).collect();
            print(target.json, json!({ "entries": entries }));
        }
        Command::Watch {
            target,
            prefix,
            key: watched,
            from_revision,
            count,
        } => {
            use futures_util::StreamExt;
            let selector = match watched {
                Some(k) => Selector::Key(key(k)?),
                None => Selector::Prefix(prefix),
            };
            let mut watch = connect(&target)
                .await?
                .watch(selector, from_revision)
                .await
                .map_err(refused)?;
            let mut printed = 0;
            while count.is_none_or(|n| printed < n) {
                let Some(event) = watch.next().await else {
                    return Err(Refusal::from(format!(
                        "the watch ended; resume with --from-revision {}",
                        watch.next_revision()
                    )));
                };
                let event = event.map_err(|e| {
                    let mut refusal = refused(e);
                    refusal.message = format!(
                        "{}; resume with --from-revision {}",
                        refusal.message,
                        watch.next_revision()
                    );
                    refusal
                })?;
                print(target.json, event_json(&event));
                let _ = std::io::stdout().flush();
                printed += 1;
            }
        }
        Command::Unquarantine { key: k, target } => {
            let k = key(k)?;
            let state = connect(&target)
                .await?
                .unquarantine(&k)
                .await
                .map_err(refused)?;
            print(
                target.json,
                json!({
                    "key": k.as_str(),
                    "quarantined": state.quarantined,
                    "recoverable": state.recoverable,
                }),
            );
        }
        Command::Check {
            key: k,
            target,
            fence,
        } => {
            let k = key(k)?;
            let lease = connect(&target)
                .await?
                .check(&k, Fence(fence), CHECK_TIMEOUT)
                .await
                .map_err(refused)?;
            print(target.json, json!({ "lease": lease_json(&lease) }));
        }
        Command::Health { target } => {
            let client = connect(&target).await?;
            let serving = client.health().await.map_err(refused)?;
            // Health needs no credentials (a probe may have none); ServerInfo
            // does, and a server older than it has none: either way the
            // answer is still whether it serves.
            let info = match client.server_info().await {
                Ok(info) => Some(info),
                Err(ClientError::Server(
                    leasehold_core::Error::Unsupported(_)
                    | leasehold_core::Error::Unauthenticated(_),
                )) => None,
                Err(e) => return Err(refused(e)),
            };
            print(
                target.json,
                json!({
                    "serving": serving,
                    "version": info.as_ref().map(|i| i.version.clone()),
                    "protocol": info.as_ref().map(|i| i.protocol),
                    "backend": info.as_ref().map(|i| i.backend.clone()),
                }),
            );
            if !serving {
                return Err(Refusal::from(format!(
                    "{} is not serving (its storage does not answer, or it is draining)",
                    target.server
                )));
            }
        }
        Command::Get { key: k, target } => {
            let k = key(k)?;
            let state = connect(&target).await?.get(&k).await.map_err(refused)?;
            print(
                target.json,
                json!({
                    "lease": state.lease.as_ref().map(lease_json),
                    "last_ended": state.last_ended.as_ref().map(ended_json),
                    "recoverable": state.recoverable,
                    "quarantined": state.quarantined,
                    "reservation": state.reservation.as_ref().map(reservation_json),
                }),
            );
        }
        Command::List {
            target,
            prefix,
            filter,
            page_size,
            page_token,
            all,
        } => {
            let client = connect(&target).await?;
            let filter = match filter {
                Filter::Live => ListFilter::Live,
                Filter::Recoverable => ListFilter::Recoverable,
                Filter::Quarantined => ListFilter::Quarantined,
                Filter::All => ListFilter::All,
            };
            let mut token = (!page_token.is_empty()).then_some(page_token);
            let mut keys = Vec::new();
            loop {
                let page = client
                    .list(&prefix, filter, page_size, token.as_deref())
                    .await
                    .map_err(refused)?;
                keys.extend(page.keys.iter().map(|k| {
                    json!({
                        "key": k.key.as_str(),
                        "lease": k.lease.as_ref().map(lease_json),
                        "last_ended": k.last_ended.as_ref().map(ended_json),
                        "recoverable": k.recoverable,
                    })
                }));
                token = page.next_page_token;
                if !all || token.is_none() {
                    break;
                }
            }
            let page_token = token.unwrap_or_default();
            if target.json {
                print(true, json!({ "keys": keys, "next_page_token": page_token }));
            } else {
                for key in &keys {
                    println!("{}", one_line(key));
                }
                if !page_token.is_empty() {
                    println!("next_page_token: {page_token}");
                }
            }
        }
    }
    Ok(())
}

/// Reads a transcript from a file, or standard input for `-`.
fn read_transcript(file: &Path) -> Result<transcript::Transcript, String> {
    let text = if file == Path::new("-") {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| format!("cannot read standard input: {e}"))?;
        text
    } else {
        std::fs::read_to_string(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?
    };
    transcript::Transcript::parse_owned(text).map_err(|e| format!("{}: {e}", file.display()))
}

fn transcript_command(command: TranscriptCommand) -> ExitCode {
    const UNREADABLE: u8 = 2;
    let fail = |message: String| {
        eprintln!("error: {message}");
        ExitCode::from(UNREADABLE)
    };
    match command {
        TranscriptCommand::Check { file, format, json } => {
            let parsed = match read_transcript(&file) {
                Ok(parsed) => parsed,
                Err(message) => return fail(message),
            };
            let report = match transcript::check(&parsed, format) {
                Ok(report) => report,
                Err(e) => return fail(e.to_string()),
            };
            let Some(report) = report else {
                if json {
                    println!(
                        "{}",
                        json!({"healthy": true, "format": null, "messages": parsed.len(), "findings": []})
                    );
                } else {
                    println!("healthy: {} messages, no tool calls", parsed.len());
                }
                return ExitCode::SUCCESS;
            };
            if json {
                println!(
                    "{}",
                    leasehold_server::grpc::transcripts::report_json(&report)
                );
            } else {
                print!("{}", transcript::render_human(&report));
            }
            if report.is_healthy() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        TranscriptCommand::Repair {
            file,
            output,
            format,
            placeholder_markers,
            json,
        } => {
            let parsed = match read_transcript(&file) {
                Ok(parsed) => parsed,
                Err(message) => return fail(message),
            };
            let mut options = transcript::RepairOptions::default();
            options
                .extra_placeholder_markers
                .extend(placeholder_markers);
            let repaired = match transcript::repair_checked(&parsed, format, &options) {
                Ok(repaired) => repaired,
                Err(e) => return fail(e.to_string()),
            };
            let (text, actions, unrecoverable) = match &repaired {
                Some(r) => (r.transcript.to_text(), &r.actions[..], &r.unrecoverable[..]),
                None => (parsed.to_text(), &[][..], &[][..]),
            };
            let written = match &output {
                Some(path) => std::fs::write(path, &text)
                    .map_err(|e| format!("cannot write {}: {e}", path.display())),
                None => std::io::stdout()
                    .write_all(text.as_bytes())
                    .map_err(|e| format!("cannot write standard output: {e}")),
            };
            if let Err(message) = written {
                return fail(message);
            }
            if json {
                eprintln!(
                    "{}",
                    json!({"healthy": unrecoverable.is_empty(), "actions": actions, "unrecoverable": unrecoverable})
                );
            } else {
                for action in actions {
                    eprintln!(
                        "{}",
                        one_line(&serde_json::to_value(action).unwrap_or_default())
                    );
                }
                for finding in unrecoverable {
                    eprintln!(
                        "unrecoverable: message {} call {}: {}",
                        finding.index, finding.call_id, finding.detail
                    );
                }
                eprintln!(
                    "{} actions, {} unrecoverable",
                    actions.len(),
                    unrecoverable.len()
                );
            }
            if unrecoverable.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
    }
}

fn lease_json(lease: &Lease) -> Value {
    let mut value = json!({
        "key": lease.key.as_str(),
        "fence": lease.fence.0,
        "owner": lease.owner.as_str(),
        "ttl_ms": lease.ttl.as_millis(),
        "acquired_at_ms": lease.acquired_at,
        "expires_at_ms": lease.expires_at,
    });
    if let Some(id) = lease.lease_id {
        value["lease_id"] = json!(id.to_string());
    }
    value
}

fn end_name(end: TermEnd) -> &'static str {
    match end {
        TermEnd::Released => "RELEASED",
        TermEnd::Suspended => "SUSPENDED",
        TermEnd::Expired => "EXPIRED",
    }
}

fn ended_json(ended: &Ended) -> Value {
    json!({
        "fence": ended.fence.0,
        "owner": ended.owner.as_str(),
        "end": end_name(ended.end),
        "ended_at_ms": ended.ended_at,
        "handed_off": ended.handed_off,
    })
}

fn event_json(e: &Event) -> Value {
    let kind = match e.kind {
        EventKind::Granted => "GRANTED",
        EventKind::Released => "RELEASED",
        EventKind::Suspended => "SUSPENDED",
        EventKind::Expired => "EXPIRED",
        EventKind::Forgotten => "FORGOTTEN",
    };
    json!({
        "revision": e.revision,
        "key": e.key.as_str(),
        "kind": kind,
        "fence": e.fence.0,
        "owner": e.owner.as_str(),
        "at_ms": e.at,
    })
}

fn history_json(h: &HistoryEntry) -> Value {
    json!({
        "fence": h.fence.0,
        "owner": h.owner.as_str(),
        "acquired_at_ms": h.acquired_at,
        "ended_at_ms": h.ended_at,
        "end": end_name(h.end),
        "unsettled_tool_calls": h.unsettled_tool_calls,
        "handed_off": h.handed_off,
    })
}

fn reservation_json(r: &Reservation) -> Value {
    match r {
        Reservation::LockDelay { after, until } => json!({
            "kind": "LOCK_DELAY", "after_fence": after.0, "until_ms": until,
        }),
        Reservation::Handoff {
            from,
            successor,
            until,
        } => json!({
            "kind": "HANDOFF", "after_fence": from.0, "successor": successor.as_str(),
            "until_ms": until,
        }),
    }
}

/// Prints `value` as JSON, or as `field: value` lines for people.
fn print(as_json: bool, value: Value) {
    if as_json {
        println!("{value}");
        return;
    }
    let Value::Object(fields) = value else {
        println!("{value}");
        return;
    };
    for (name, field) in fields {
        match field {
            Value::Null => {}
            Value::Object(_) => println!("{name}: {}", one_line(&field)),
            other => println!("{name}: {other}"),
        }
    }
}

/// `a=1 b=x` rendering of a flat JSON object.
fn one_line(value: &Value) -> String {
    match value {
        Value::Object(fields) => fields
            .iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| match v {
                Value::String(s) => format!("{k}={s}"),
                Value::Object(_) => format!("{k}={{{}}}", one_line(v)),
                other => format!("{k}={other}"),
            })
            .collect::<Vec<_>>()
            .join(" "),
        other => other.to_string(),
    }
}

/// The CLI's `--writer-spin-us` default: the engine's.
const fn default_writer_spin_us() -> u64 {
    leasehold_server::engine::DEFAULT_WRITER_SPIN.as_micros() as u64
}
