//! The sweeper against live traffic on PostgreSQL: two backends (two
//! servers' worth of pools, batches and sweepers) on one fresh schema of
//! the database `LEASEHOLD_TEST_POSTGRES` names (each test passes with a
//! note when it is unset), with a retention short enough that keys are
//! forgotten while others grant and release them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use leasehold_backend::Backend;
use leasehold_core::lease::{AcquireOptions, Key, Owner, Ttl, Wait};
use leasehold_core::lessor::Acquire;
use leasehold_postgres::{PgBackend, PgConfig};
use tokio::sync::Mutex;

/// A schema of the test's own, dropped when the test ends.
struct Schema {
    url: String,
    name: String,
}

impl Schema {
    fn fresh() -> Option<Schema> {
        let Ok(url) = std::env::var("LEASEHOLD_TEST_POSTGRES") else {
            eprintln!("skipped: LEASEHOLD_TEST_POSTGRES is not set");
            return None;
        };
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "lh_sweeps_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        Some(Schema { url, name })
    }

    async fn db(&self) -> tokio_postgres::Client {
        let (db, connection) = tokio_postgres::connect(&self.url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(connection);
        db.batch_execute(&format!("SET search_path = {}", self.name))
            .await
            .expect("search_path");
        db
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        let (url, sql) = (
            self.url.clone(),
            format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name),
        );
        // A runtime of its own: drop runs inside the test's runtime.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let (db, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                    .await
                    .expect("connect");
                tokio::spawn(connection);
                db.batch_execute(&sql).await.expect("drop the schema");
            });
        })
        .join();
        if dropped.is_err() && !std::thread::panicking() {
            panic!("could not drop schema {}", self.name);
        }
    }
}

fn request(key: &str, owner: &str) -> Acquire {
    Acquire {
        key: Key::parse(key).expect("key"),
        owner: Owner::parse(owner).expect("owner"),
        ttl: Ttl::from_millis(10_000).expect("ttl"),
        wait: Wait::from_millis(0).expect("wait"),
        request_id: None,
        options: AcquireOptions::default(),
    }
}

/// Forgetting released keys (with a retention of 0: every released key is
/// due at once) while two servers grant and release those keys in
/// batches, and both sweep without pause, never deadlocks: no Acquire,
/// Release or sweep fails with `deadlock detected` (#46: the forget
/// deleted in scan order, and a grant batch locks in key order); once the
/// traffic stops, the sweeps forget every key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forgetting_keys_never_deadlocks_with_grants_releases_or_sweeps() {
    let Some(schema) = Schema::fresh() else {
        return;
    };
    let config = PgConfig {
        schema: schema.name.clone(),
        pool_size: 12,
        retention_ms: 0,
        sweep_interval: Duration::from_millis(5),
        ..PgConfig::new(schema.url.clone())
    };
    let servers = [
        PgBackend::connect(config.clone()).await.expect("connect"),
        PgBackend::connect(config).await.expect("connect"),
    ];
    const KEYS: usize = 24;
    let deadlocks = Arc::new(Mutex::new(Vec::<String>::new()));
    let grants = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(6);
    let mut tasks = Vec::new();
    for worker in 0..24usize {
        let server = servers[worker % 2].clone();
        let (deadlocks, grants) = (deadlocks.clone(), grants.clone());
        tasks.push(tokio::spawn(async move {
            let owner = format!("w{worker}");
            let mut round = worker * 7;
            while Instant::now() < deadline {
                round += 1;
                // Keys spread so that each server's batches hold several
                // keys at once, in a different mix each round.
                let key = format!("k/{:02}", (round * 5 + worker) % KEYS);
                let grant = match server.acquire(request(&key, &owner)).await {
                    Ok(grant) => grant,
                    Err(e) => {
                        if e.to_string().contains("deadlock") {
                            deadlocks.lock().await.push(format!("acquire: {e}"));
                        }
                        continue;
                    }
                };
                grants.fetch_add(1, Ordering::Relaxed);
                let released = server
                    .release(
                        &grant.key,
                        grant.term.fence,
                        grant.term.lease_id,
                        false,
                        None,
                    )
                    .await;
                if let Err(e) = released
                    && e.to_string().contains("deadlock")
                {
                    deadlocks.lock().await.push(format!("release: {e}"));
                }
            }
        }));
    }
    // Both servers also sweep back to back, on top of their sweepers.
    for sweeper in 0..4usize {
        let server = servers[sweeper % 2].clone();
        let deadlocks = deadlocks.clone();
        tasks.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                if let Err(e) = server.sweep().await
                    && e.to_string().contains("deadlock")
                {
                    deadlocks.lock().await.push(format!("sweep: {e}"));
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("worker");
    }
    let deadlocks = deadlocks.lock().await;
    assert!(
        deadlocks.is_empty(),
        "{} deadlocks, first: {:?}",
        deadlocks.len(),
        deadlocks.first()
    );
    assert!(
        grants.load(Ordering::Relaxed) > 100,
        "too few grants to mean anything"
    );
    // Every key is released: sweeps forget them all (the background
    // sweepers may hold some rows at a moment, so look a few times).
    let db = schema.db().await;
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        servers[0].sweep().await.expect("a sweep");
        let left: i64 = db
            .query_one("SELECT count(*) FROM keys", &[])
            .await
            .expect("count keys")
            .get(0);
        if left == 0 {
            break;
        }
        assert!(Instant::now() < until, "{left} released keys not forgotten");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
