//! The `leasehold` command: the server and operator commands.

mod cli;

/// mimalloc instead of the system allocator: a unary request makes about 40
/// short-lived allocations (HTTP/2 frames, headers, the task, the reply),
/// and glibc's malloc and free were 14% of the server's instructions per
/// request (docs/benchmarks-history.md, session 6).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    cli::main()
}
