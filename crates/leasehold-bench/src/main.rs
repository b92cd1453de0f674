//! `leasehold-bench`: drives a running leasehold server (or, with the `peers`
//! feature, etcd or ZooKeeper) with closed-loop clients and reports
//! throughput and latency. A binary of its own, so the server's build carries
//! none of the load generator.

use clap::Parser;

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
