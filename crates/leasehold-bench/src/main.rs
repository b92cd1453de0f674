//! `leasehold-bench`: drives a running leasehold server (or, with the `peers`
//! feature, etcd or ZooKeeper) with closed-loop clients and reports
//! throughput and latency. A binary of its own, so the server's build carries
//! none of the load generator.

use clap::Parser;

/// The same allocator as the server's: the load generator shares the
/// machine's cores with the server under test, and with glibc's malloc it
/// spent more CPU per operation than the server. Every target (leasehold
/// and its peers) is driven by this same process, so ratios stay fair.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Load generator for leasehold and its peers.
#[derive(Debug, Parser)]
#[command(name = "leasehold-bench", version, about)]
struct Cli {
    #[command(flatten)]
    args: leasehold_bench::BenchArgs,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    runtime.block_on(leasehold_bench::run(cli.args))
}
