//! The backend contract (`leasehold_backend::contract`) on PostgreSQL: a
//! fresh schema per case on the database `LEASEHOLD_TEST_POSTGRES` names
//! (each case passes with a note when it is unset), the database's clock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use leasehold_backend::Backend;
use leasehold_backend::contract::{Settings, Subject};
use leasehold_core::lease::Key;
use leasehold_postgres::{PgBackend, PgConfig};

struct Pg {
    // Taken in drop, before the schema goes.
    backend: Option<PgBackend>,
    url: String,
    schema: String,
}

impl Pg {
    async fn db(&self) -> tokio_postgres::Client {
        let (db, connection) = tokio_postgres::connect(&self.url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(connection);
        db.batch_execute(&format!("SET search_path = {}", self.schema))
            .await
            .expect("search_path");
        db
    }
}

impl Subject for Pg {
    fn backend(&self) -> &dyn Backend {
        self.backend.as_ref().expect("running")
    }

    fn pass(&self, ms: u64) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            // The database's clock runs as ours does; its sweeper (every
            // 100 ms here) or the next request acts on what expired.
            tokio::time::sleep(Duration::from_millis(ms + 50)).await;
        })
    }

    fn in_line<'a>(&'a self, key: &'a Key, n: usize) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let db = self.db().await;
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let queued: i64 = db
                    .query_one(
                        "SELECT count(*) FROM waiters
                         WHERE key = $1 AND granted_fence IS NULL AND alive_until_ms > now_ms()",
                        &[&key.as_str()],
                    )
                    .await
                    .expect("count the line")
                    .get(0);
                if queued as usize >= n {
                    return;
                }
                assert!(Instant::now() < deadline, "fewer than {n} in line");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    }
}

impl Drop for Pg {
    fn drop(&mut self) {
        drop(self.backend.take());
        let (url, sql) = (
            self.url.clone(),
            format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema),
        );
        // A runtime of its own: drop may run inside the test's runtime.
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
            panic!("could not drop schema {}", self.schema);
        }
    }
}

async fn start(settings: Settings) -> Option<Box<dyn Subject>> {
    let Ok(url) = std::env::var("LEASEHOLD_TEST_POSTGRES") else {
        eprintln!("skipped: LEASEHOLD_TEST_POSTGRES is not set");
        return None;
    };
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let schema = format!(
        "lh_contract_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let config = PgConfig {
        schema: schema.clone(),
        pool_size: 4,
        sweep_interval: Duration::from_millis(100),
        poll: Duration::from_millis(200),
        max_waiters_per_key: settings.max_waiters_per_key,
        ..PgConfig::new(url.clone())
    };
    let backend = PgBackend::connect(config).await.expect("connect");
    Some(Box::new(Pg {
        backend: Some(backend),
        url,
        schema,
    }))
}

leasehold_backend::contract_tests!(start);
