//! The short chaos run on PostgreSQL (about 35 s): two servers on one
//! database, in a schema of the run's own (created by the servers, dropped
//! at the end), with kill -9 of one, SIGSTOP, the client proxies, and a
//! proxy between each server and the database that cuts and partitions.
//! Skipped (it passes, saying so) unless `LEASEHOLD_TEST_POSTGRES` is set;
//! the database is `LEASEHOLD_TEST_PG_URL`, else `LEASEHOLD_TEST_POSTGRES`.

mod common;

use leasehold_chaos::run::Backend;

fn database() -> Option<String> {
    let set = std::env::var("LEASEHOLD_TEST_POSTGRES")
        .ok()
        .filter(|v| !v.is_empty())?;
    Some(
        std::env::var("LEASEHOLD_TEST_PG_URL")
            .ok()
            .filter(|v| !v.is_empty())
            .unwrap_or(set),
    )
}

/// Every property of the history checker holds under every PostgreSQL fault.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_history_under_faults_is_clean() {
    let Some(url) = database() else {
        eprintln!("chaos PostgreSQL run skipped: LEASEHOLD_TEST_POSTGRES is not set");
        return;
    };
    common::short_run(Backend::Postgres { url }).await;
}

/// The same on a PostgreSQL cluster of the run's own, which is also
/// crashed (immediate stop) and restarted. Needs `initdb`/`pg_ctl` (and,
/// as root, the `postgres` user); runs only when `LEASEHOLD_CHAOS_PRIVATE_PG`
/// is set, since it adds half a minute and a cluster start-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_postgres_history_under_faults_and_database_crashes_is_clean() {
    if std::env::var_os("LEASEHOLD_CHAOS_PRIVATE_PG").is_none() {
        eprintln!("chaos private-PostgreSQL run skipped: LEASEHOLD_CHAOS_PRIVATE_PG is not set");
        return;
    }
    common::short_run(Backend::PrivatePostgres).await;
}
