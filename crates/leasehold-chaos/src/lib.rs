//! Fault injection against a real `leasehold serve`, and a checker for the
//! history it records (issue 17, part 2).
//!
//! * [`history`]: every operation with its invocation and completion time
//!   (monotonic) and its outcome (OK, a status, or unknown).
//! * [`check`](mod@check): pure functions from a history to violations: fences unique
//!   and rising across restarts, no acknowledged grant or release lost, no
//!   two terms of a key live at once, the fenced store's accepted writes in
//!   fence order, every error a documented status.
//! * [`store`]: the fenced store the workers write to.
//! * [`proxy`]: a loopback TCP proxy that delays, partitions and cuts.
//! * [`server`]: the `leasehold` process: start, `kill -9`, SIGSTOP/SIGCONT.
//! * [`pg`]: a private PostgreSQL cluster that a run may crash.
//! * [`workload`]: the workers, on the Rust client crate.
//! * [`run`](mod@run): one run: topology, fault schedule, final reads, check.
//!
//! The short runs are `tests/short_run.rs` (SQLite; PostgreSQL when
//! `LEASEHOLD_TEST_POSTGRES` is set); the long run is the `leasehold-chaos`
//! binary (`scripts/chaos.sh`). What is checked and what is not:
//! `docs/reliability.md`.

pub mod check;
pub mod clock;
pub mod history;
pub mod pg;
pub mod proxy;
pub mod run;
pub mod server;
pub mod store;
pub mod workload;

pub use check::{Config, Kind, Report, Violation, check};
pub use history::{Call, History, Op, Outcome, Recorder, Refusal, Reply};
pub use run::{Backend, Fault, RunConfig, RunResult, run};
