//! The short chaos run on SQLite (about 35 s): workers on three hot keys
//! under kill -9 and restart on the same file, SIGSTOP past the TTL, and a
//! proxy that delays, partitions and cuts; then a last kill -9, a read of
//! every key, and the history check.

mod common;

use leasehold_chaos::run::Backend;

/// Every property of the history checker holds under every SQLite fault.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_history_under_faults_is_clean() {
    common::short_run(Backend::Sqlite).await;
}
