//! The `leasehold` command: the server and operator commands.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
