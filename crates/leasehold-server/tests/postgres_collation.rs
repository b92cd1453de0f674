//! The PostgreSQL backend on a database whose default collation is not
//! byte order (ICU `en-US`, as on many managed services): every statement
//! that locks several key rows locks them in byte order, so a grant batch
//! and a renewal or release batch cannot deadlock. The test creates the
//! database and drops it, passed or not. Both kinds of test: the lock order
//! itself, and two servers' batches that deadlocked before.

mod common;
#[macro_use]
mod pg_harness;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::requests::*;
use leasehold_server::postgres::sql;
use leasehold_wire::pb::leasehold_client::LeaseholdClient;
use pg_harness::{PgServer, Schema, counter, database, execute_on_own_runtime};
use tonic::Code;

/// A database of its own whose default collation is not byte order (ICU
/// `en-US`, where `a < B < M`; in bytes `B < M < a`), with a short
/// `deadlock_timeout` so a deadlock shows at once. Dropped when the test
/// ends, passed or not (its connections are forced off).
struct CollatedDatabase {
    admin_url: String,
    name: String,
    url: String,
}

impl CollatedDatabase {
    async fn create(admin_url: &str) -> CollatedDatabase {
        let name = format!("lh_collated_{}_{}", std::process::id(), rand_suffix());
        let (admin, connection) = tokio_postgres::connect(admin_url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(connection);
        // ICU where the server has it (PostgreSQL 15+), else glibc's en_US.
        let ways = [
            format!(
                "CREATE DATABASE {name} TEMPLATE template0 ENCODING 'UTF8'
                 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'"
            ),
            format!(
                "CREATE DATABASE {name} TEMPLATE template0 ENCODING 'UTF8'
                 LC_COLLATE 'en_US.UTF-8' LC_CTYPE 'en_US.UTF-8'"
            ),
        ];
        let mut failures = Vec::new();
        for way in &ways {
            match admin.batch_execute(way).await {
                Ok(()) => {
                    failures.clear();
                    break;
                }
                Err(e) => failures.push(format!("{way}: {e:?}")),
            }
        }
        assert!(
            failures.len() < ways.len(),
            "no non-C collation to test with:\n{}",
            failures.join("\n")
        );
        let db = CollatedDatabase {
            admin_url: admin_url.to_owned(),
            url: with_database(admin_url, &name),
            name,
        };
        admin
            .batch_execute(&format!(
                "ALTER DATABASE {} SET deadlock_timeout = '100ms'",
                db.name
            ))
            .await
            .unwrap();
        let (probe, connection) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
            .await
            .expect("connect to the collated database");
        tokio::spawn(connection);
        let sorted: String = probe
            .query_one(
                "SELECT string_agg(x, ',' ORDER BY x) FROM unnest(ARRAY['a', 'B', 'M']) x",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(sorted, "a,B,M", "the database sorts by its collation");
        db
    }
}

impl Drop for CollatedDatabase {
    fn drop(&mut self) {
        let dropped = execute_on_own_runtime(
            &self.admin_url,
            &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        );
        if !dropped && !std::thread::panicking() {
            panic!("could not drop database {}", self.name);
        }
    }
}

/// `url` with its database replaced by `name` (its options kept).
fn with_database(url: &str, name: &str) -> String {
    let (base, options) = match url.split_once('?') {
        Some((base, options)) => (base, format!("?{options}")),
        None => (url, String::new()),
    };
    let host = match base.rsplit_once('/') {
        Some((host, _)) if host.contains("//") && !host.ends_with('/') => host,
        _ => base.trim_end_matches('/'),
    };
    format!("{host}/{name}{options}")
}

fn rand_suffix() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos()
}

/// Waits until `n` backends of database `datname` wait for a lock in a
/// statement whose text has `marker`.
async fn lock_waits(db: &tokio_postgres::Client, datname: &str, marker: &str, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: i64 = db
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = $1 AND wait_event_type = 'Lock'
                   AND strpos(query, $2) > 0",
                &[&datname, &marker],
            )
            .await
            .unwrap()
            .get(0);
        if waiting >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{waiting} of {n} statements with {marker:?} wait for a lock"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A transaction on a connection of its own that holds key rows' locks
/// until `commit`.
struct RowLock(tokio_postgres::Client);

impl RowLock {
    async fn take(schema: &Schema, key: &str) -> RowLock {
        let db = schema.db().await;
        db.batch_execute(&format!(
            "BEGIN; SELECT 1 FROM keys WHERE key = '{key}' FOR UPDATE"
        ))
        .await
        .unwrap();
        RowLock(db)
    }

    async fn commit(self) {
        self.0.batch_execute("COMMIT").await.unwrap();
    }
}

/// What the other server's batch does while a grant batch waits.
#[derive(Clone, Copy, Debug)]
enum OtherBatch {
    Renew,
    Release,
}

/// Markers of the batch statements in `pg_stat_activity`.
const GRANT_MARKER: &str = "AS req(key, owner, lease_id, request_id";
const RENEW_MARKER: &str = "AS r(key, fence, lease_id, ttl_ms)";
const RELEASE_MARKER: &str = "AS req(key, fence, lease_id, end_kind";

/// On a database whose collation is not byte order, a grant batch `[a, B]`
/// on one server and a renewal or release batch `[B, M, a]` on another lock
/// their rows in one order (bytes), so neither fails with a deadlock. Made
/// deterministic with row locks of the test's own: each batch is formed
/// behind a blocked one (a plug) and held at a known row.
async fn batches_keep_one_lock_order(other: OtherBatch) {
    let Some(admin_url) = database() else {
        return;
    };
    let collated = CollatedDatabase::create(&admin_url).await;
    let schema = Schema::fresh(collated.url.clone());
    let granting = PgServer::start(&schema).await;
    let holding = PgServer::start(&schema).await;
    let mut c = holding.client().await;
    let mut leases = HashMap::new();
    for key in ["a", "B", "M", "Y", "Z"] {
        leases.insert(
            key,
            lease_of(c.acquire(acquire(key, "h", 60_000)).await.unwrap()),
        );
    }
    let watch = schema.db().await;
    let (lock_m, lock_y, lock_z) = (
        RowLock::take(&schema, "M").await,
        RowLock::take(&schema, "Y").await,
        RowLock::take(&schema, "Z").await,
    );
    let marker = match other {
        OtherBatch::Renew => RENEW_MARKER,
        OtherBatch::Release => RELEASE_MARKER,
    };
    let send = |key: &'static str| {
        let (mut c, lease) = (c.clone(), leases[key].clone());
        tokio::spawn(async move {
            match other {
                OtherBatch::Renew => c.renew(renew(&lease, 60_000)).await.map(drop),
                OtherBatch::Release => c.release(release(&lease, false)).await.map(drop),
            }
        })
    };
    // The holding server's batch slot is taken by Z's (blocked), so B, M
    // and a queue into one batch, which then locks B and waits for M.
    let plug = send("Z");
    lock_waits(&watch, &collated.name, marker, 1).await;
    let others: Vec<_> = ["B", "M", "a"].into_iter().map(send).collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    lock_z.commit().await;
    plug.await.unwrap().unwrap();
    lock_waits(&watch, &collated.name, marker, 1).await;
    // Likewise the granting server's grant batch [a, B], behind Y's.
    let grant = |key: &'static str| {
        let granting = granting.url();
        tokio::spawn(async move {
            let mut c = LeaseholdClient::connect(granting).await.unwrap();
            c.acquire(acquire(key, "g", 60_000)).await.map(drop)
        })
    };
    let grant_plug = grant("Y");
    lock_waits(&watch, &collated.name, GRANT_MARKER, 1).await;
    let grants: Vec<_> = ["a", "B"].into_iter().map(grant).collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    lock_y.commit().await;
    let busy = grant_plug.await.unwrap().unwrap_err();
    assert_eq!(busy.code(), Code::Aborted, "{busy:?}");
    lock_waits(&watch, &collated.name, GRANT_MARKER, 1).await;
    // Both batches wait now; M goes free, and each must finish.
    lock_m.commit().await;
    for (key, outcome) in ["B", "M", "a"].iter().zip(others) {
        let outcome = outcome.await.unwrap();
        assert!(outcome.is_ok(), "{other:?} of {key}: {outcome:?}");
    }
    for (key, outcome) in ["a", "B"].iter().zip(grants) {
        match (other, outcome.await.unwrap()) {
            (OtherBatch::Release, Ok(())) => {}
            (OtherBatch::Renew, Err(busy)) if busy.code() == Code::Aborted => {}
            (_, outcome) => panic!("grant of {key} beside a {other:?}: {outcome:?}"),
        }
    }
    // The batches were the ones described: two statements on each server,
    // carrying the plug and the batch.
    let kind = match other {
        OtherBatch::Renew => "renew",
        OtherBatch::Release => "release",
    };
    assert_eq!(
        (
            counter(&holding, &format!("leasehold_pg_{kind}_batches_total")),
            counter(&holding, &format!("leasehold_pg_{kind}_batched_total")),
        ),
        (2, 4),
        "the {kind} batch was [B, M, a]"
    );
    assert_eq!(
        (
            counter(&granting, "leasehold_pg_grant_batches_total"),
            counter(&granting, "leasehold_pg_grant_batched_total"),
        ),
        (2, 3),
        "the grant batch was [a, B]"
    );
    drop((granting, holding, watch));
    drop(schema);
    drop(collated);
}

/// A grant batch and a renewal batch over keys whose collation order is
/// not their byte order do not deadlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grant_and_renewal_batches_lock_rows_in_one_order() {
    batches_keep_one_lock_order(OtherBatch::Renew).await;
}

/// A grant batch and a release batch over keys whose collation order is
/// not their byte order do not deadlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grant_and_release_batches_lock_rows_in_one_order() {
    batches_keep_one_lock_order(OtherBatch::Release).await;
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
    let icu = CollatedDatabase::create(&admin).await;
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
