//! The SQLite fence helper on a real database file: the highest fence per key
//! is recorded inside the application's transaction, and a lower one is
//! refused with everything it wrote rolled back.

mod common;

use common::TestServer;
use leasehold_client::Client;
use leasehold_client::fence::sqlite::{self, FenceError};
use leasehold_core::Fence;
use rusqlite::Connection;

/// An application database with the fence table and one table of its own.
fn app_db(dir: &tempfile::TempDir) -> std::path::PathBuf {
    let path = dir.path().join("app.db");
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch(
        "PRAGMA journal_mode = WAL;
         CREATE TABLE items (session TEXT NOT NULL, body TEXT NOT NULL, fence INTEGER NOT NULL);",
    )
    .unwrap();
    sqlite::install(&conn).unwrap();
    path
}

fn open(path: &std::path::Path) -> Connection {
    let conn = Connection::open(path).unwrap();
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .unwrap();
    conn
}

/// Appends one item to `session` under `fence`, the way an application would.
fn append(
    conn: &mut Connection,
    session: &str,
    fence: Fence,
    body: &str,
) -> Result<(), FenceError> {
    sqlite::write(conn, session, fence, |tx| {
        tx.execute(
            "INSERT INTO items (session, body, fence) VALUES (?1, ?2, ?3)",
            (session, body, fence.0 as i64),
        )?;
        Ok(())
    })
}

fn bodies(conn: &Connection, session: &str) -> Vec<String> {
    let mut stmt = conn
        .prepare("SELECT body FROM items WHERE session = ?1 ORDER BY rowid")
        .unwrap();
    stmt.query_map([session], |row| row.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// Equal and higher fences write; a lower one is refused, naming the highest,
/// and its rows are rolled back.
#[test]
fn a_lower_fence_is_refused_and_rolled_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut conn = open(&app_db(&dir));
    assert_eq!(sqlite::highest(&conn, "s").unwrap(), None);
    append(&mut conn, "s", Fence(5), "first").unwrap();
    append(&mut conn, "s", Fence(5), "same holder again").unwrap();
    let err = append(&mut conn, "s", Fence(3), "stale").unwrap_err();
    match err {
        FenceError::Stale {
            key,
            fence,
            highest,
        } => assert_eq!((key.as_str(), fence, highest), ("s", 3, 5)),
        other => panic!("expected stale, got {other:?}"),
    }
    append(&mut conn, "s", Fence(7), "newer holder").unwrap();
    assert_eq!(sqlite::highest(&conn, "s").unwrap(), Some(Fence(7)));
    assert_eq!(
        bodies(&conn, "s"),
        ["first", "same holder again", "newer holder"]
    );
    // Keys are fenced independently.
    append(&mut conn, "other", Fence(1), "elsewhere").unwrap();
}

/// The check refuses to run outside a transaction, where it would protect nothing.
#[test]
fn the_check_must_run_inside_a_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let conn = open(&app_db(&dir));
    let err = sqlite::advance(&conn, "s", Fence(1)).unwrap_err();
    assert!(
        matches!(err, FenceError::NotInTransaction { .. }),
        "{err:?}"
    );
    assert_eq!(sqlite::highest(&conn, "s").unwrap(), None);
}

/// Installing twice is a no-op that keeps the recorded fences.
#[test]
fn installing_twice_keeps_the_fences() {
    let dir = tempfile::tempdir().unwrap();
    let path = app_db(&dir);
    let mut conn = open(&path);
    append(&mut conn, "s", Fence(4), "x").unwrap();
    sqlite::install(&conn).unwrap();
    assert_eq!(sqlite::highest(&conn, "s").unwrap(), Some(Fence(4)));
}

/// The SQL shown in the docs works on its own, as another language would run it.
#[test]
fn the_documented_sql_works_by_hand() {
    let dir = tempfile::tempdir().unwrap();
    let conn = open(&dir.path().join("by-hand.db"));
    conn.execute_batch(sqlite::CREATE_TABLE).unwrap();
    let advance = |fence: i64| {
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        let changed = conn
            .execute(
                sqlite::ADVANCE,
                rusqlite::named_params! { ":key": "s", ":fence": fence },
            )
            .unwrap();
        conn.execute_batch(if changed == 1 { "COMMIT" } else { "ROLLBACK" })
            .unwrap();
        changed
    };
    assert_eq!(advance(2), 1);
    assert_eq!(advance(2), 1);
    assert_eq!(advance(1), 0);
    assert_eq!(advance(3), 1);
}

/// A holder that passed its own gate, then paused while its lease expired and
/// a newer holder wrote, is refused by the database when it resumes.
#[tokio::test]
async fn a_stale_writer_that_passed_its_gate_is_refused() {
    let server = TestServer::start().await;
    let client = Client::connect(format!("http://{}", server.addr))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = app_db(&dir);

    // Graph A holds the session and passes its gate...
    let a = client
        .acquire("session:1")
        .owner("graph-a")
        .ttl(std::time::Duration::from_secs(10))
        .await
        .unwrap();
    let a_fence = a.gate().await.unwrap();
    // ...and is paused before its write lands. Meanwhile its term expires on
    // the server's clock and graph B takes the session and writes.
    server.clock.advance(10_000);
    let b = client.acquire("session:1").owner("graph-b").await.unwrap();
    assert!(b.fence() > a_fence);
    let b_fence = b.gate().await.unwrap();
    append(&mut open(&path), "session:1", b_fence, "from b").unwrap();

    // A resumes: its local clock says little time has passed, but the write
    // carries the old fence and the database refuses it.
    let err = append(&mut open(&path), "session:1", a_fence, "from a").unwrap_err();
    assert!(
        matches!(err, FenceError::Stale { fence, highest, .. } if fence == a_fence.0 && highest == b_fence.0),
        "{err:?}"
    );
    assert_eq!(bodies(&open(&path), "session:1"), ["from b"]);
}

/// A stale writer's deferred transaction that read before the newer holder's
/// commit is refused too: it cannot write on an outdated snapshot.
#[test]
fn a_transaction_begun_earlier_is_still_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = app_db(&dir);
    let mut old = open(&path);
    append(&mut old, "s", Fence(1), "old holder's first write").unwrap();
    // The old holder opens a deferred transaction and reads...
    let tx = old.transaction().unwrap();
    let seen: i64 = tx
        .query_row("SELECT COUNT(*) FROM items", [], |row| row.get(0))
        .unwrap();
    assert_eq!(seen, 1);
    // ...while the newer holder commits.
    append(&mut open(&path), "s", Fence(2), "new holder").unwrap();
    // The old holder's fence check cannot write on its outdated snapshot:
    // in WAL mode SQLite refuses with SQLITE_BUSY_SNAPSHOT.
    let err = sqlite::advance(&tx, "s", Fence(1)).unwrap_err();
    assert!(
        matches!(&err, FenceError::Sqlite(rusqlite::Error::SqliteFailure(e, _))
            if e.extended_code == rusqlite::ffi::SQLITE_BUSY_SNAPSHOT),
        "{err:?}"
    );
    drop(tx);
    assert_eq!(
        bodies(&old, "s"),
        ["old holder's first write", "new holder"]
    );
}
