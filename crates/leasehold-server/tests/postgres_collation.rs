//! The PostgreSQL backend on a database whose default collation is not
//! byte order (ICU `en-US`, as on many managed services): every statement
//! that locks several key rows locks them in byte order, so a grant batch
//! and a renewal or release batch cannot deadlock. The test creates the
//! database and drops it, passed or not.

mod common;
#[macro_use]
mod pg_harness;

use std::time::{Duration, Instant};

use common::requests::*;
use leasehold_server::postgres::sql;
use pg_harness::{PgServer, Schema, database};

/// A database of the test's own with the ICU `en-US` collation, dropped on drop.
struct IcuDatabase {
    admin_url: String,
    name: String,
    url: String,
}

impl IcuDatabase {
    async fn create(admin_url: String) -> IcuDatabase {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let name = format!("lh_icu_{}_{nanos}", std::process::id());
        let (db, connection) = tokio_postgres::connect(&admin_url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(connection);
        db.batch_execute(&format!(
            "CREATE DATABASE {name} TEMPLATE template0 LOCALE_PROVIDER = icu \
             ICU_LOCALE = 'en-US' LOCALE = 'C.UTF-8'"
        ))
        .await
        .expect("create an ICU database");
        let base = admin_url.rsplit_once('/').expect("a URL with a database").0;
        let url = format!("{base}/{name}");
        IcuDatabase {
            admin_url,
            name,
            url,
        }
    }
}

impl Drop for IcuDatabase {
    fn drop(&mut self) {
        let (url, name) = (self.admin_url.clone(), self.name.clone());
        // Its own thread and runtime: this may run while a test panics.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                    .await
                    .expect("connect to drop the test database");
                tokio::spawn(connection);
                client
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .await
                    .expect("drop the test database");
            });
        })
        .join();
    }
}

/// [`sql::GRANT`] for keys `a` and `B` (both held, so nothing is granted),
/// with its parameters written in as literals.
fn grant_a_and_b() -> String {
    let literals = [
        ("$9", "32"),
        ("$8", "ARRAY[false, false]"),
        ("$7", "ARRAY[NULL, NULL]::integer[]"),
        ("$6", "ARRAY[0, 0]"),
        ("$5", "ARRAY[10000, 10000]"),
        ("$4", "ARRAY[NULL, NULL]::text[]"),
        ("$3", "ARRAY[gen_random_uuid(), gen_random_uuid()]"),
        ("$2", "ARRAY['x', 'x']"),
        ("$1", "ARRAY['a', 'B']"),
    ];
    let mut statement = sql::GRANT.to_owned();
    for (param, literal) in literals {
        statement = statement.replace(param, literal);
    }
    statement
}

/// A grant batch over `a` and `B` locks `B` first (byte order, as renewal
/// and release batches do), not `a` (the database's collation order): while
/// `B` is locked elsewhere, the batch waits without holding `a`. Locking in
/// two orders is what let a grant batch `[a, B]` and a renewal batch
/// `[B, M, a]` deadlock.
#[tokio::test]
async fn a_grant_batch_locks_keys_in_byte_order_on_an_icu_database() {
    let Some(admin) = database() else { return };
    let icu = IcuDatabase::create(admin).await;
    let schema = Schema::fresh(icu.url.clone());
    let server = PgServer::start(&schema).await;
    let mut c = server.client().await;
    c.acquire(acquire("a", "holder-a", 60_000)).await.unwrap();
    c.acquire(acquire("B", "holder-b", 60_000)).await.unwrap();

    // Another transaction holds B's row.
    let x = schema.db().await;
    x.batch_execute("BEGIN; SELECT key FROM keys WHERE key = 'B' FOR UPDATE")
        .await
        .unwrap();
    // The grant batch starts, and must wait for B.
    let y = schema.db().await;
    let y_pid: i32 = y
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let grant = tokio::spawn(async move { y.simple_query(&grant_a_and_b()).await.map(drop) });
    let watcher = schema.db().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: bool = watcher
            .query_one(
                "SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1",
                &[&y_pid],
            )
            .await
            .unwrap()
            .get(0);
        if waiting {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the grant batch never waited for B"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // It holds nothing else meanwhile: a is free to lock.
    let z = schema.db().await;
    z.batch_execute("BEGIN").await.unwrap();
    let a = z
        .batch_execute("SELECT key FROM keys WHERE key = 'a' FOR UPDATE NOWAIT")
        .await;
    z.batch_execute("ROLLBACK").await.unwrap();
    x.batch_execute("COMMIT").await.unwrap();
    grant
        .await
        .unwrap()
        .expect("the grant batch ends once B is free");
    assert!(
        a.is_ok(),
        "the grant batch locked a before B (collation order): {a:?}"
    );
    drop(server);
}
