//! `serve --fence-floor N`: a lock server whose store was reset grants every
//! fence above N, durably, and a later floor never lowers the mark; on
//! PostgreSQL the whole fleet on the schema draws above it. Real `leasehold
//! serve` processes on loopback, over a SQLite file or a fresh PostgreSQL
//! schema (`LEASEHOLD_TEST_POSTGRES`; skipped without it).

mod common;
#[macro_use]
#[path = "pg_harness/mod.rs"]
mod pg_harness;

use std::path::PathBuf;
use std::process::Child;

use common::{acquire, lease_of, spawn_serve};
use leasehold_wire::pb;
use leasehold_wire::pb::leasehold_client::LeaseholdClient;

/// Where a test's servers keep their state.
enum Store {
    Sqlite(tempfile::TempDir),
    Postgres(pg_harness::Schema),
}

impl Store {
    fn sqlite() -> Store {
        Store::Sqlite(tempfile::tempdir().expect("tempdir"))
    }

    fn args(&self) -> Vec<String> {
        match self {
            Store::Sqlite(dir) => {
                let db: PathBuf = dir.path().join("leasehold.db");
                vec!["--db".into(), db.to_str().expect("UTF-8").into()]
            }
            Store::Postgres(schema) => vec![
                "--store".into(),
                schema.url.clone(),
                "--pg-schema".into(),
                schema.name.clone(),
            ],
        }
    }
}

/// A `leasehold serve` process, killed (SIGKILL) when dropped.
struct Serve(Child, String);

impl Serve {
    /// Starts a server on `store`, with `--fence-floor floor` when given,
    /// and waits until it listens (the floor is raised before that).
    fn start(store: &Store, floor: Option<u64>) -> Serve {
        let mut args = store.args();
        if let Some(floor) = floor {
            args.extend(["--fence-floor".into(), floor.to_string()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (child, addr) = spawn_serve(&args);
        Serve(child, format!("http://{addr}"))
    }

    /// The fence of a fresh Acquire of `key` (released again, so the next
    /// one on the same key is free).
    async fn fence_of(&self, key: &str) -> u64 {
        let mut c = LeaseholdClient::connect(self.1.clone())
            .await
            .expect("connect");
        let lease = lease_of(c.acquire(acquire(key, "o", 10_000)).await.expect("acquire"));
        c.release(pb::ReleaseRequest {
            key: lease.key.clone(),
            fence: lease.fence,
            lease_id: lease.lease_id.clone(),
            ..Default::default()
        })
        .await
        .expect("release");
        lease.fence
    }

    /// `kill -9`: whatever the floor wrote must already be durable.
    fn kill9(mut self) {
        self.0.kill().expect("SIGKILL");
        self.0.wait().expect("reap");
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A server started on a fresh store with a floor grants its first fence
/// above the floor (fences of a fresh store start at 1 otherwise).
async fn a_fresh_store_grants_above_the_floor(store: Store) {
    let server = Serve::start(&store, Some(1_000));
    let fence = server.fence_of("thread-1").await;
    assert!(fence > 1_000, "fence {fence} is not above the floor 1000");
    // Another key too: the floor is the store's, not a key's.
    assert!(server.fence_of("thread-2").await > fence);
}

/// The floor is in the store from the start: after a `kill -9` before any
/// grant, a server started without the flag still grants above it.
async fn the_floor_is_durable(store: Store) {
    Serve::start(&store, Some(1_000)).kill9();
    let server = Serve::start(&store, None);
    let fence = server.fence_of("k").await;
    assert!(
        fence > 1_000,
        "fence {fence} after a restart without the flag"
    );
}

/// A lower floor never lowers the mark: with nothing granted yet (so no
/// key's row holds a fence), a restart with floor 10 after floor 1000
/// still grants above 1000, and so does the next restart without a floor.
async fn a_lower_floor_never_lowers_the_mark(store: Store) {
    Serve::start(&store, Some(1_000)).kill9();
    let server = Serve::start(&store, Some(10));
    let first = server.fence_of("k").await;
    assert!(
        first > 1_000,
        "fence {first} after floor 10, floor 1000 before"
    );
    server.kill9();
    let server = Serve::start(&store, Some(0));
    let second = server.fence_of("other").await;
    assert!(second > first, "fence {second} after {first}");
}

/// A floor below the fences already granted changes nothing: fences go on
/// from where they were.
async fn a_floor_below_the_fences_changes_nothing(store: Store) {
    let server = Serve::start(&store, None);
    let mut last = 0;
    for _ in 0..5 {
        last = server.fence_of("k").await;
    }
    server.kill9();
    let server = Serve::start(&store, Some(2));
    let next = server.fence_of("k").await;
    // PostgreSQL's sequence may skip a value, never step back.
    assert!(next > last, "fence {next} after floor 2, {last} before");
    if matches!(store, Store::Sqlite(_)) {
        assert_eq!(next, last + 1);
    }
}

#[tokio::test]
async fn sqlite_a_fresh_store_grants_above_the_floor() {
    a_fresh_store_grants_above_the_floor(Store::sqlite()).await;
}

#[tokio::test]
async fn sqlite_the_floor_is_durable() {
    the_floor_is_durable(Store::sqlite()).await;
}

#[tokio::test]
async fn sqlite_a_lower_floor_never_lowers_the_mark() {
    a_lower_floor_never_lowers_the_mark(Store::sqlite()).await;
}

#[tokio::test]
async fn sqlite_a_floor_below_the_fences_changes_nothing() {
    a_floor_below_the_fences_changes_nothing(Store::sqlite()).await;
}

#[tokio::test]
async fn postgres_a_fresh_store_grants_above_the_floor() {
    a_fresh_store_grants_above_the_floor(Store::Postgres(schema_or_skip!())).await;
}

#[tokio::test]
async fn postgres_the_floor_is_durable() {
    the_floor_is_durable(Store::Postgres(schema_or_skip!())).await;
}

#[tokio::test]
async fn postgres_a_lower_floor_never_lowers_the_mark() {
    a_lower_floor_never_lowers_the_mark(Store::Postgres(schema_or_skip!())).await;
}

#[tokio::test]
async fn postgres_a_floor_below_the_fences_changes_nothing() {
    a_floor_below_the_fences_changes_nothing(Store::Postgres(schema_or_skip!())).await;
}

/// On PostgreSQL one server's floor is the fleet's: a server already
/// running on the schema (started without the flag) grants above the
/// floor another server raised as it started, and a third server started
/// later with a lower floor lowers nothing.
#[tokio::test]
async fn postgres_a_floor_raised_by_one_server_holds_for_the_fleet() {
    let store = Store::Postgres(schema_or_skip!());
    let running = Serve::start(&store, None);
    let before = running.fence_of("thread-1").await;
    assert!(before < 500);
    let floored = Serve::start(&store, Some(500));
    let fence = running.fence_of("thread-1").await;
    assert!(fence > 500, "the running server granted {fence}");
    let newer = floored.fence_of("thread-2").await;
    assert!(newer > fence);
    let late = Serve::start(&store, Some(3));
    let latest = late.fence_of("thread-3").await;
    assert!(
        latest > newer,
        "fence {latest} after floor 3, {newer} before"
    );
    assert!(running.fence_of("thread-1").await > latest);
}

/// The Rust fence helper end to end: after a reset store, an application's
/// fenced write is refused (the error names the stored fence and the
/// floor), and a server started with the floor `fence_floor` reports lets
/// it write again.
#[tokio::test]
async fn the_floor_the_rust_helper_reports_cures_a_reset_server() {
    use leasehold_client::fence::sqlite::{self as fence, FenceError};
    use leasehold_core::Fence;

    let app = tempfile::tempdir().expect("tempdir");
    let mut conn = rusqlite::Connection::open(app.path().join("app.db")).expect("open");
    fence::install(&conn).expect("install");
    assert_eq!(fence::fence_floor(&conn).expect("floor"), Fence(0));
    let write = |conn: &mut rusqlite::Connection, fence_: u64| {
        fence::write(conn, "thread-1", Fence(fence_), |_| Ok::<_, FenceError>(()))
    };

    let (first, second, third) = (Store::sqlite(), Store::sqlite(), Store::sqlite());
    let old = Serve::start(&first, None);
    let mut last = 0;
    for _ in 0..4 {
        last = old.fence_of("thread-1").await;
    }
    write(&mut conn, last).expect("the old server's fence writes");
    drop(old);

    let reset = Serve::start(&second, None);
    let fresh = reset.fence_of("thread-1").await;
    let refused = write(&mut conn, fresh).expect_err("a reset server's fence is stale");
    let message = refused.to_string();
    assert!(
        message.contains(&format!("fence {last} has already written")),
        "{message}"
    );
    assert!(message.contains("--fence-floor"), "{message}");
    drop(reset);

    let floor = fence::fence_floor(&conn).expect("floor");
    assert_eq!(floor, Fence(last));
    let cured = Serve::start(&third, Some(floor.0));
    let fence_ = cured.fence_of("thread-1").await;
    write(&mut conn, fence_).expect("a fence above the floor writes");
}
