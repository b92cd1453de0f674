//! The command line: every command and its flags are parsed here (clap);
//! each kind of command runs in a module of its own, as mini-redis keeps
//! one per command under `cmd/`:
//!
//! - [`serve`]: the server and its flags.
//! - [`ops`]: the operator commands.
//! - [`transcript`]: the transcript tool.
//! - [`output`]: text and JSON printers.

mod ops;
mod output;
mod serve;
mod transcript;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use output::*;
use transcript::*;

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
    // Boxed: its flags make it far larger than the other commands.
    Serve(Box<serve::ServeArgs>),
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
        Command::Serve(args) => serve::run(*args).await,
        Command::Transcript { command } => transcript::run(command),
        other => ops::run(other).await,
    }
}
