//! The load generator behind `leasehold-bench`.
//!
//! It drives a running server with N closed-loop clients for a fixed time and
//! reports operations per second and latency percentiles, as text or JSON.
//! The same code drives leasehold and, with the `peers` cargo feature, etcd
//! and ZooKeeper running the equivalent operations, so the numbers compare
//! like with like (`bench/compare.sh` runs all three side by side).
//!
//! # Modes
//! - `cycle`: Acquire + Release on a key of the client's own (distinct keys).
//!   etcd: LeaseGrant + Txn put-if-absent with the lease + LeaseRevoke.
//!   ZooKeeper: create an ephemeral-sequential node + delete it.
//! - `hot`: the clients contend for `--keys` keys, each Acquire waiting in
//!   line; one operation is one handover (acquire, then release). Every
//!   acquire must succeed within its wait (no lost wake-ups), and grants are
//!   checked for first-come-first-served order. etcd: the v3lock `Lock` /
//!   `Unlock` RPCs on a session lease; ZooKeeper: the lock recipe
//!   (ephemeral-sequential node, watch the predecessor).
//! - `renew`: Renew of a held lease, keeping its TTL. etcd: one
//!   `LeaseKeepAlive` round trip on a stream. ZooKeeper has no equivalent.
//! - `check`: Check of a held fence. etcd: a linearizable Get of the lock key,
//!   comparing its create revision; ZooKeeper: `exists` of the lock node,
//!   comparing its czxid (a local, not linearizable, read).
//! - `scale` (leasehold only): loads `--leases` live leases, `--expiring` of
//!   them expiring at one instant, and measures Acquire latency around that
//!   instant. `bench/scale.sh` adds the server's memory and restart time.
//! - `fsync` (no server): the physical floor of the one-client cycle, two
//!   `fdatasync`s of a 4 KiB overwrite in `--fsync-dir` (put it on the
//!   database's disk); one operation is the pair.
//!
//! # Shapes (leasehold)
//! How each client sends its operations (`--shape`): `unary` (one unary RPC
//! at a time, what a generated stub does), `session` (a Session stream of
//! its own, one operation in flight: a Python or TypeScript session), or
//! `pipelined` (`--stream`: the connection's one Session stream, shared by
//! the clients on it through the Rust client's multiplexer). The peers are
//! always driven one operation at a time per client over their shared
//! sessions, which is what each of these shapes is compared with.
//!
//! # Measuring
//! Clients connect first (one gRPC channel, or one peer session, per client
//! unless `--connections` says otherwise), then all start together. The first
//! `--warmup-secs` are not recorded; an operation counts when it started
//! after the warm-up and finished before the end. Latency is recorded per
//! operation in microseconds and summarised exactly (sorted, not bucketed).

mod driver;
#[cfg(feature = "peers")]
mod etcd;
mod fsync;
mod hot;
mod lh;
mod pgrow;
mod scale;
mod stats;
mod table;
#[cfg(feature = "peers")]
mod zookeeper;

use std::process::ExitCode;
use std::time::Duration;

use serde::Serialize;

pub use stats::Summary;

/// Which server the load goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    Leasehold,
    /// Needs the `peers` cargo feature.
    Etcd,
    /// Needs the `peers` cargo feature.
    Zookeeper,
    /// A hand-written PostgreSQL lease row (cycle and renew modes), the
    /// baseline for the PostgreSQL backend; see `--pg`.
    Pgrow,
}

/// Which operation mix the clients run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Acquire + Release, each client on its own key.
    Cycle,
    /// Handovers: the clients contend for `--keys` keys, waiting in line.
    Hot,
    /// Renew of a held lease (TTL kept).
    Renew,
    /// Check of a held fence.
    Check,
    /// Many live leases, a mass expiry, and Acquire latency around it (leasehold only).
    Scale,
    /// Two `fdatasync`s of a 4 KiB overwrite (no server): the one-client
    /// cycle's floor.
    Fsync,
}

/// How a leasehold client sends its operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Shape {
    /// One unary RPC at a time per client; clients share `--connections`.
    Unary,
    /// A Session stream per client, one operation in flight.
    Session,
    /// The connection's one Session stream, shared by its clients through the
    /// library client's multiplexer (many operations in flight).
    Pipelined,
}

/// Options of `leasehold bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// The leasehold server to drive.
    #[arg(long, default_value = "http://127.0.0.1:7420")]
    pub server: String,
    /// Which server to drive: leasehold, or (with the `peers` feature) etcd or zookeeper.
    #[arg(long, value_enum, default_value_t = Target::Leasehold)]
    pub target: Target,
    /// The etcd endpoint (host:port), for `--target etcd`.
    #[arg(long, default_value = "127.0.0.1:2379")]
    pub etcd: String,
    /// The ZooKeeper connect string (host:port), for `--target zookeeper`.
    #[arg(long, default_value = "127.0.0.1:2181")]
    pub zookeeper: String,
    /// The PostgreSQL database, for `--target pgrow`.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/test")]
    pub pg: String,
    /// The operation mix.
    #[arg(long, value_enum, default_value_t = Mode::Cycle)]
    pub mode: Mode,
    /// Concurrent closed-loop clients.
    #[arg(long, short = 'c', default_value_t = 16)]
    pub clients: usize,
    /// Connections shared by the clients (default: one per client).
    #[arg(long)]
    pub connections: Option<usize>,
    /// Seconds recorded, after the warm-up.
    #[arg(long, default_value_t = 10.0)]
    pub duration_secs: f64,
    /// Seconds run but not recorded, first.
    #[arg(long, default_value_t = 1.0)]
    pub warmup_secs: f64,
    /// Hot mode: how many keys the clients contend for.
    #[arg(long, default_value_t = 4)]
    pub keys: usize,
    /// Lease TTL in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    pub ttl_ms: u64,
    /// Hot mode: how long each Acquire may wait in line, in milliseconds.
    #[arg(long, default_value_t = 60_000)]
    pub wait_ms: u64,
    /// Hot mode: a grant to a request sent this much later than a waiting
    /// one, ahead of it, counts as out of order (allows for send jitter).
    #[arg(long, default_value_t = 20)]
    pub fifo_slack_ms: u64,
    /// Scale mode: live leases to load.
    #[arg(long, default_value_t = 1_000_000)]
    pub leases: usize,
    /// Scale mode: how many of them expire at one instant.
    #[arg(long, default_value_t = 100_000)]
    pub expiring: usize,
    /// Scale mode: clients timing Acquire around the mass expiry.
    #[arg(long, default_value_t = 8)]
    pub probe_clients: usize,
    /// Print one JSON object on stdout instead of text.
    #[arg(long)]
    pub json: bool,
    /// Cycle, hot, renew and check modes against leasehold: send the
    /// operations over the Session stream instead of unary calls, through the
    /// library client, so the clients that share a connection (see
    /// `--connections`) pipeline their operations over its one stream. The
    /// same as `--shape pipelined`.
    #[arg(long)]
    pub stream: bool,
    /// How each leasehold client sends its operations: unary calls, a
    /// Session stream of its own (one operation in flight), or the
    /// connection's shared Session stream (pipelined).
    #[arg(long, value_enum, default_value_t = Shape::Unary)]
    pub shape: Shape,
    /// Fsync mode: the directory to time `fdatasync` in (put it on the
    /// database's disk).
    #[arg(long, default_value = ".")]
    pub fsync_dir: std::path::PathBuf,
    /// A label copied into the report (e.g. the round number).
    #[arg(long)]
    pub label: Option<String>,
    /// Instead of running, print the side-by-side table of the JSON reports
    /// in this file (one a line, from `--json`), with median ratios.
    #[arg(long, value_name = "FILE")]
    pub summarize: Option<std::path::PathBuf>,
}

impl BenchArgs {
    fn warmup(&self) -> Duration {
        Duration::from_secs_f64(self.warmup_secs.max(0.0))
    }

    fn duration(&self) -> Duration {
        Duration::from_secs_f64(self.duration_secs.max(0.001))
    }

    /// The leasehold clients' shape (`--stream` is `--shape pipelined`).
    fn shape(&self) -> Shape {
        if self.stream {
            Shape::Pipelined
        } else {
            self.shape
        }
    }

    fn connections(&self) -> usize {
        self.connections
            .unwrap_or(self.clients)
            .clamp(1, self.clients.max(1))
    }
}

/// What one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub target: Target,
    pub mode: Mode,
    /// How leasehold's clients sent their operations (none for the peers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shape: Option<Shape>,
    pub clients: usize,
    pub connections: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// Seconds recorded.
    pub seconds: f64,
    /// Operations that succeeded within the recorded window.
    pub ops: u64,
    /// Operations that failed within the recorded window.
    pub errors: u64,
    pub ops_per_sec: f64,
    /// Latency of the successful operations, in milliseconds.
    pub latency_ms: Summary,
    /// The first few distinct errors, to tell what went wrong.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub error_samples: Vec<String>,
    /// Mode-specific results (hot mode's order checks, scale mode's phases).
    #[serde(skip_serializing_if = "serde_json::Value::is_null")]
    pub details: serde_json::Value,
}

impl Report {
    fn print_text(&self) {
        let l = &self.latency_ms;
        println!(
            "{:<9} {:<6} {:<9} clients={:<3} ops/s={:>10.0}  p50={:.3}ms p90={:.3}ms p99={:.3}ms max={:.3}ms  ops={} errors={}",
            format!("{:?}", self.target).to_lowercase(),
            format!("{:?}", self.mode).to_lowercase(),
            self.shape
                .map(|s| format!("{s:?}").to_lowercase())
                .unwrap_or_default(),
            self.clients,
            self.ops_per_sec,
            l.p50,
            l.p90,
            l.p99,
            l.max,
            self.ops,
            self.errors,
        );
        for e in &self.error_samples {
            println!("  error: {e}");
        }
        if !self.details.is_null() {
            println!(
                "  details: {}",
                serde_json::to_string(&self.details).unwrap_or_default()
            );
        }
    }
}

/// Runs the benchmark described by `args`; exits non-zero when it could not
/// run or when an order check (hot mode) failed.
pub async fn run(args: BenchArgs) -> ExitCode {
    if let Some(path) = &args.summarize {
        return match std::fs::read_to_string(path) {
            Ok(text) => {
                print!("{}", table::summarize(&text));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: cannot read {}: {e}", path.display());
                ExitCode::FAILURE
            }
        };
    }
    if args.clients == 0 {
        eprintln!("error: --clients must be at least 1");
        return ExitCode::from(2);
    }
    let result = measure(&args).await;
    match result {
        Ok(report) => {
            if args.json {
                match serde_json::to_string(&report) {
                    Ok(json) => println!("{json}"),
                    Err(e) => {
                        eprintln!("error: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            } else {
                report.print_text();
            }
            let order_ok = report
                .details
                .get("order_ok")
                .and_then(serde_json::Value::as_bool)
                .unwrap_or(true);
            if order_ok {
                ExitCode::SUCCESS
            } else {
                eprintln!("error: the hot-key order checks failed (see details)");
                ExitCode::FAILURE
            }
        }
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the benchmark described by `args` and returns what it measured.
///
/// # Errors
/// A description of what kept the run from starting or finishing (no
/// server, a peer target without the `peers` feature, a failed set-up).
pub async fn measure(args: &BenchArgs) -> Result<Report, String> {
    match (args.target, args.mode) {
        (_, Mode::Fsync) => fsync::run(args).await,
        (Target::Leasehold, Mode::Scale) => scale::run(args).await,
        (_, Mode::Scale) => Err("scale mode drives leasehold only".to_owned()),
        (Target::Leasehold, _) => lh::run(args).await,
        (Target::Pgrow, _) => pgrow::run(args).await,
        #[cfg(feature = "peers")]
        (Target::Etcd, _) => etcd::run(args).await,
        #[cfg(feature = "peers")]
        (Target::Zookeeper, _) => zookeeper::run(args).await,
        #[cfg(not(feature = "peers"))]
        (target, _) => Err(format!(
            "--target {} needs a build with the `peers` feature \
             (cargo build --release --features peers)",
            format!("{target:?}").to_lowercase()
        )),
    }
}

/// A per-run prefix, so repeated runs against one server use fresh keys.
fn run_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..8].to_owned()
}
