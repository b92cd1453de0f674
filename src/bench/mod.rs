//! The load generator behind `leasehold bench` (being built; see issue 6).

use std::process::ExitCode;

/// Options of `leasehold bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// The leasehold server to drive.
    #[arg(long, default_value = "http://127.0.0.1:7420")]
    pub server: String,
}

/// Runs the benchmark described by `args`.
pub async fn run(args: BenchArgs) -> ExitCode {
    eprintln!("bench against {} is not implemented yet", args.server);
    ExitCode::FAILURE
}
