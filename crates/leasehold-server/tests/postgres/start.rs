//! Starting: schemas, URL options, migrations (once, refused when newer), an
//! unreachable database, `leasehold serve` with either store and its
//! refusals.

use super::*;

/// A schema name at PostgreSQL's 63-byte limit works, wake-ups included
/// (its NOTIFY channel is shortened).
#[tokio::test]
async fn a_schema_name_of_63_bytes_works() {
    let mut schema = schema_or_skip!();
    schema.name = format!("{:_<63}", schema.name);
    let server = PgServer::start(&schema).await;
    let mut c = server.client().await;
    let lease = lease_of(c.acquire(acquire("k", "a", 10_000)).await.unwrap());
    let mut b = server.client().await;
    let waiting = tokio::spawn(async move { b.acquire(waiting("k", "b", 5_000, 5_000)).await });
    schema.in_line("k", 1).await;
    c.release(release(&lease, false)).await.unwrap();
    assert_eq!(lease_of(waiting.await.unwrap().unwrap()).owner, "b");
}

/// ServerInfo names the PostgreSQL backend.
#[tokio::test]
async fn server_info_names_the_postgres_backend() {
    let schema = schema_or_skip!();
    let server = PgServer::start(&schema).await;
    let reply = server
        .client()
        .await
        .server_info(pb::ServerInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.backend, "postgres");
    assert_eq!(reply.protocol, leasehold_wire::PROTOCOL);
}

/// Connection options in the URL are kept beside the schema's search_path:
/// here one that makes every transaction read-only, so the start fails.
#[tokio::test]
async fn url_options_are_kept() {
    let schema = schema_or_skip!();
    let separator = if schema.url.contains('?') { '&' } else { '?' };
    let url = format!(
        "{}{separator}options=-c%20default_transaction_read_only%3Don",
        schema.url
    );
    let err = PgBackend::connect(PgConfig {
        url,
        ..schema.config()
    })
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("read-only"), "{err}");
}

/// Two servers applying their migrations at the same moment on one fresh
/// schema both start (the advisory lock serialises them), and a third
/// start finds nothing left to do.
#[tokio::test]
async fn servers_starting_together_migrate_once() {
    let schema = schema_or_skip!();
    let (a, b) = tokio::join!(
        PgBackend::connect(schema.config()),
        PgBackend::connect(schema.config())
    );
    a.expect("first server");
    b.expect("second server");
    PgBackend::connect(schema.config())
        .await
        .expect("third server");
}

/// An unreachable database fails the start, naming the database and not the password.
#[tokio::test]
async fn an_unreachable_database_fails_the_start() {
    let Some(_) = database() else { return };
    let config = PgConfig {
        connect_timeout: Duration::from_millis(500),
        ..PgConfig::new("postgres://postgres:secret@127.0.0.1:1/test")
    };
    let err = PgBackend::connect(config).await.unwrap_err().to_string();
    assert!(err.contains("127.0.0.1"), "{err}");
    assert!(!err.contains("secret"), "{err}");
}

/// SIGTERM, and a clean exit.
fn terminate(mut child: std::process::Child) {
    let pid = child.id().to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill -TERM");
    let status = child.wait().expect("wait");
    assert!(status.success(), "{status:?}");
}

/// `serve --store postgres://…` serves leases from the database, in the
/// schema `--pg-schema` names.
#[tokio::test]
async fn serve_with_a_postgres_store() {
    let schema = schema_or_skip!();
    let (child, addr) = common::spawn_serve(&["--store", &schema.url, "--pg-schema", &schema.name]);
    let mut c = LeaseholdClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let lease = lease_of(c.acquire(acquire("k", "a", 5_000)).await.unwrap());
    // The same state through an in-process server on the same schema.
    let other = PgServer::start(&schema).await;
    let refused = other
        .client()
        .await
        .check(check("k", lease.fence + 1))
        .await;
    assert_eq!(refused.unwrap_err().code(), Code::FailedPrecondition);
    other
        .client()
        .await
        .check(check("k", lease.fence))
        .await
        .unwrap();
    terminate(child);
}

/// `serve --store sqlite:PATH` is the SQLite engine on PATH (no database needed).
#[tokio::test]
async fn serve_with_a_sqlite_store() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("store.db");
    let store = format!("sqlite:{}", db.display());
    let (child, addr) = common::spawn_serve(&["--store", &store]);
    let mut c = LeaseholdClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    c.acquire(acquire("k", "a", 5_000)).await.unwrap();
    terminate(child);
    assert!(db.exists());
}

/// A store that is neither, or `--store` together with `--db`, is refused.
#[test]
fn bad_store_arguments_are_refused() {
    for args in [
        &["--store", "mysql://x"][..],
        &["--store", "sqlite:"],
        &["--store", "sqlite:a.db", "--db", "b.db"],
    ] {
        let output = std::process::Command::new(common::binary())
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(args)
            .env_remove("LEASEHOLD_DB")
            .env_remove("LEASEHOLD_STORE")
            .output()
            .expect("run leasehold serve");
        assert!(!output.status.success(), "{args:?} was accepted");
        assert!(!output.stderr.is_empty());
    }
}

/// A schema migrated by a newer leasehold is refused, not touched.
#[tokio::test]
async fn a_schema_from_a_newer_leasehold_is_refused() {
    let schema = schema_or_skip!();
    PgBackend::connect(schema.config())
        .await
        .expect("first start");
    let (client, connection) = tokio_postgres::connect(&schema.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(&format!(
            "INSERT INTO {}.leasehold_migrations (version) VALUES (999)",
            schema.name
        ))
        .await
        .unwrap();
    let err = PgBackend::connect(schema.config()).await.unwrap_err();
    assert!(
        matches!(
            err,
            leasehold_core::store::StoreError::TooNew { found: 999, .. }
        ),
        "{err}"
    );
}
