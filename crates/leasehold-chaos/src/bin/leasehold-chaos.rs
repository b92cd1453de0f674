//! `leasehold-chaos`: a long fault-injection run against the real server,
//! then the history check. Exit status 0 when the history is clean, 1 when
//! it breaks a property, 2 when the run could not be set up.
//!
//! ```sh
//! leasehold-chaos --minutes 30 --backend sqlite
//! leasehold-chaos --minutes 30 --backend postgres --pg-url postgres://postgres@127.0.0.1:5432/test
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use leasehold_chaos::run::{Backend, RunConfig, run};
use leasehold_chaos::server::find_binary;

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Which {
    Sqlite,
    Postgres,
    /// PostgreSQL on a cluster of the run's own (initdb + pg_ctl), which is
    /// also crashed and restarted.
    PrivatePostgres,
}

#[derive(Debug, Parser)]
#[command(
    name = "leasehold-chaos",
    about = "Fault injection with a history check (issue 17)"
)]
struct Args {
    /// How long workers run, in minutes (fractions allowed).
    #[arg(long, default_value_t = 1.0)]
    minutes: f64,
    #[arg(long, value_enum, default_value_t = Which::Sqlite)]
    backend: Which,
    /// The PostgreSQL database (a schema of the run's own is created and dropped).
    #[arg(
        long,
        env = "LEASEHOLD_TEST_PG_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/test"
    )]
    pg_url: String,
    /// Concurrent workers (each with its own connection).
    #[arg(long, default_value_t = 6)]
    workers: u32,
    /// Hot keys they compete for.
    #[arg(long, default_value_t = 3)]
    keys: usize,
    /// The lease TTL.
    #[arg(long, default_value_t = 1000)]
    ttl_ms: u64,
    /// Seeds the workers' and the fault schedule's choices.
    #[arg(long, default_value_t = 17)]
    seed: u64,
    /// The `leasehold` binary (default: $LEASEHOLD_BIN, or next to this one).
    #[arg(long)]
    bin: Option<PathBuf>,
    /// Keep the run's files (SQLite file, server logs, history.json) here.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Print at most this many violations in full.
    #[arg(long, default_value_t = 5)]
    show: usize,
    /// Worker processes besides the in-process workers (SIGSTOPped by the
    /// `worker SIGSTOP` fault).
    #[arg(long, default_value_t = 2)]
    process_workers: u32,
    /// Check a stored history (a run's history.json) instead of running.
    #[arg(long, value_name = "HISTORY_JSON")]
    check: Option<PathBuf>,
    /// With --check: assume every term outlives its TTL by this much (a
    /// wrong assumption on purpose, to see how close a history came).
    #[arg(long, default_value_t = 0)]
    overreach_ms: u64,
    /// A Python interpreter that can `import leasehold` (clients/python):
    /// adds a worker process on the Python client.
    #[arg(long)]
    python: Option<PathBuf>,
    /// Only the faults whose name starts with one of these (repeatable; e.g.
    /// `--fault wall` for the wall-clock jumps alone). Default: every fault.
    #[arg(long = "fault", value_name = "NAME")]
    only: Vec<String>,
    /// Node.js, with the TypeScript client built (`npm run build` in
    /// clients/typescript): adds two worker processes on the TypeScript
    /// client, one per transport.
    #[arg(long)]
    node: Option<PathBuf>,
    /// Worker mode (used by the harness itself): run one worker against
    /// this URL and write its operations to stdout.
    #[arg(long, hide = true)]
    worker_url: Option<String>,
    #[arg(long, hide = true, default_value_t = 0)]
    worker_id: u32,
    /// The harness's time zero, as CLOCK_MONOTONIC nanoseconds.
    #[arg(long, hide = true, default_value_t = 0)]
    origin_ns: u64,
}

/// Checks a stored history.
fn check_file(path: &std::path::Path, args: &Args) -> ExitCode {
    use leasehold_chaos::check::{Config, check};
    use leasehold_chaos::history::{History, MS};
    let history: History = match std::fs::read(path)
        .map_err(|e| e.to_string())
        .and_then(|bytes| serde_json::from_slice(&bytes).map_err(|e| e.to_string()))
    {
        Ok(history) => history,
        Err(e) => {
            eprintln!("cannot read {}: {e}", path.display());
            return ExitCode::from(2);
        }
    };
    let config = Config {
        overreach: args.overreach_ms * MS,
        ..Config::default()
    };
    let report = check(&history, &config);
    println!(
        "{}",
        serde_json::to_string_pretty(&report.stats).expect("stats json")
    );
    if report.is_clean() {
        println!(
            "check: PASS, no violations in {} operations",
            report.stats.ops
        );
        ExitCode::SUCCESS
    } else {
        let mut kinds = std::collections::BTreeMap::new();
        for v in &report.violations {
            *kinds.entry(v.kind).or_insert(0) += 1;
        }
        println!(
            "check: FAIL, {} violation(s): {kinds:?}",
            report.violations.len()
        );
        println!("{}", report.explain(&history, args.show));
        ExitCode::from(1)
    }
}

/// Worker mode: one worker, its operations on stdout as JSON lines.
async fn worker(args: &Args, url: &str) -> ExitCode {
    use leasehold_chaos::history::Recorder;
    use leasehold_chaos::store::FencedStore;
    use leasehold_chaos::workload::{self, Worker, Workload};
    let until = tokio::time::Instant::now() + Duration::from_secs_f64(args.minutes * 60.0);
    let Some(client) = workload::connect(url, until + Duration::from_secs(5)).await else {
        eprintln!("worker {}: cannot connect to {url}", args.worker_id);
        return ExitCode::from(2);
    };
    let load = Workload::new(args.keys, Duration::from_millis(args.ttl_ms));
    let recorder = Recorder::to_stdout(args.origin_ns);
    Worker::new(
        args.worker_id,
        client,
        recorder,
        FencedStore::new(),
        args.seed,
        load,
    )
    .run(until)
    .await;
    ExitCode::SUCCESS
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(url) = args.worker_url.clone() {
        return worker(&args, &url).await;
    }
    if let Some(path) = &args.check {
        return check_file(path, &args);
    }
    let Some(bin) = args.bin.clone().or_else(find_binary) else {
        eprintln!(
            "no leasehold binary: pass --bin, set LEASEHOLD_BIN, or `cargo build -p leasehold-server`"
        );
        return ExitCode::from(2);
    };
    let temp = tempfile::tempdir().expect("temp dir");
    let dir = args.dir.clone().unwrap_or_else(|| temp.path().to_owned());
    std::fs::create_dir_all(&dir).expect("run dir");
    let backend = match args.backend {
        Which::Sqlite => Backend::Sqlite,
        Which::Postgres => Backend::Postgres {
            url: args.pg_url.clone(),
        },
        Which::PrivatePostgres => Backend::PrivatePostgres,
    };
    let duration = Duration::from_secs_f64(args.minutes * 60.0);
    let mut config = RunConfig::new(backend, duration, &bin, &dir);
    config.workers = args.workers;
    config.seed = args.seed;
    config.worker_bin = std::env::current_exe().ok();
    config.process_workers = args.process_workers;
    config.python = args.python.clone();
    config.node = args.node.clone();
    if !args.only.is_empty() {
        config.faults.retain(|f| {
            args.only
                .iter()
                .any(|name| f.name().starts_with(name.as_str()))
        });
        if config.faults.is_empty() {
            eprintln!("leasehold-chaos: no fault matches {:?}", args.only);
            return ExitCode::from(2);
        }
    }
    config.workload =
        leasehold_chaos::workload::Workload::new(args.keys, Duration::from_millis(args.ttl_ms));
    println!(
        "leasehold-chaos: {:?}, {} s, {} workers, {} keys, ttl {} ms, seed {}, binary {}, files in {}",
        args.backend,
        duration.as_secs(),
        args.workers,
        args.keys,
        args.ttl_ms,
        args.seed,
        bin.display(),
        dir.display()
    );
    let result = match run(config).await {
        Ok(result) => result,
        Err(e) => {
            eprintln!("the run could not be set up: {e}");
            return ExitCode::from(2);
        }
    };
    println!("faults injected:");
    for (name, count) in &result.faults {
        println!("  {name:<28} {count}");
    }
    println!("  {:<28} {}", "server exits by itself", result.self_exits);
    for skipped in &result.skipped {
        println!("skipped: {skipped}");
    }
    println!(
        "{}",
        serde_json::to_string_pretty(&result.report.stats).expect("stats json")
    );
    if args.dir.is_some() {
        let path = dir.join("history.json");
        let json = serde_json::to_string(&result.history).expect("history json");
        std::fs::write(&path, json).expect("write history");
        println!("history: {}", path.display());
    }
    if !result.unreadable_at_end.is_empty() {
        println!(
            "keys unreadable after the final restart: {:?}",
            result.unreadable_at_end
        );
    }
    if result.report.is_clean() {
        println!(
            "check: PASS, no violations in {} operations",
            result.report.stats.ops
        );
        ExitCode::SUCCESS
    } else {
        println!(
            "check: FAIL, {} violation(s)",
            result.report.violations.len()
        );
        println!("{}", result.report.explain(&result.history, args.show));
        ExitCode::from(1)
    }
}
