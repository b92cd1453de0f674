//! In-process leasehold servers on the PostgreSQL backend over a fresh
//! schema each, for every PostgreSQL suite. The database is
//! named by `LEASEHOLD_TEST_POSTGRES` (e.g.
//! `postgres://postgres@127.0.0.1:5432/test`); without it every test says
//! once that it was skipped, and passes.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use leasehold_server::postgres::{PgBackend, PgConfig};
use leasehold_server::server;
use leasehold_wire::pb::leasehold_client::LeaseholdClient;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

/// The database URL, or `None` (and a note on stderr) to skip.
pub fn database() -> Option<String> {
    match std::env::var("LEASEHOLD_TEST_POSTGRES") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                let _ = std::io::Write::write_all(
                    &mut std::io::stderr(),
                    b"PostgreSQL suite skipped: LEASEHOLD_TEST_POSTGRES is not set \
                      (e.g. postgres://postgres@127.0.0.1:5432/test)\n",
                );
            });
            None
        }
    }
}

/// Skips the test (it passes) when no database is configured.
#[macro_export]
macro_rules! schema_or_skip {
    () => {
        match pg_harness::database() {
            Some(url) => pg_harness::Schema::fresh(url),
            None => return,
        }
    };
}

/// A schema of its own for one test, dropped when the test ends (passed or not).
pub struct Schema {
    pub url: String,
    pub name: String,
}

impl Schema {
    pub fn fresh(url: String) -> Schema {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let name = format!(
            "lh_test_{}_{}_{nanos}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        Schema { url, name }
    }

    /// Quick sweeps and polls, as the other PostgreSQL suite uses.
    pub fn config(&self) -> PgConfig {
        PgConfig {
            schema: self.name.clone(),
            pool_size: 4,
            sweep_interval: Duration::from_millis(100),
            poll: Duration::from_millis(200),
            ..PgConfig::new(self.url.clone())
        }
    }

    /// A server whose sweeper never runs during a test: every expiry is
    /// first acted on by a request (the lazy path).
    pub fn config_without_sweeper(&self) -> PgConfig {
        PgConfig {
            sweep_interval: Duration::from_secs(3600),
            ..self.config()
        }
    }

    /// A connection of the test's own, to look at rows.
    pub async fn db(&self) -> tokio_postgres::Client {
        let (db, connection) = tokio_postgres::connect(&self.url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(connection);
        db.batch_execute(&format!("SET search_path = {}", self.name))
            .await
            .expect("search_path");
        db
    }

    /// Waits until `n` Acquires are in line for `key` (alive, not granted),
    /// so a test can queue waiters in a known order.
    pub async fn in_line(&self, key: &str, n: usize) {
        let db = self.db().await;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let queued = line_len(&db, key).await;
            if queued >= n {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{queued} of {n} in line for {key}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The database's clock, in ms since the epoch.
    pub async fn now_ms(&self) -> u64 {
        let db = self.db().await;
        let now: i64 = db.query_one("SELECT now_ms()", &[]).await.unwrap().get(0);
        now as u64
    }
}

/// How many Acquires are in line for `key` now (alive, not granted), on
/// `db` (a [`Schema::db`] connection), whichever servers queued them.
pub async fn line_len(db: &tokio_postgres::Client, key: &str) -> usize {
    let count = "SELECT count(*) FROM waiters
         WHERE key = $1 AND granted_fence IS NULL AND alive_until_ms > now_ms()";
    let queued: i64 = db.query_one(count, &[&key]).await.unwrap().get(0);
    queued as usize
}

impl Drop for Schema {
    fn drop(&mut self) {
        let dropped = execute_on_own_runtime(
            &self.url,
            &format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name),
        );
        if !dropped && !std::thread::panicking() {
            panic!("could not drop schema {}", self.name);
        }
    }
}

/// Runs `sql` on a connection to `url` from a thread and runtime of its
/// own, for a `Drop` that may run while a test panics (or inside a runtime
/// that cannot block). Returns whether it succeeded.
pub fn execute_on_own_runtime(url: &str, sql: &str) -> bool {
    let (url, sql) = (url.to_owned(), sql.to_owned());
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .expect("connect");
            tokio::spawn(connection);
            client.batch_execute(&sql).await.expect(&sql);
        });
    })
    .join()
    .is_ok()
}

/// An in-process leasehold server on the PostgreSQL backend.
pub struct PgServer {
    pub addr: SocketAddr,
    pub backend: PgBackend,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl PgServer {
    pub async fn start(schema: &Schema) -> PgServer {
        Self::start_with(schema.config()).await
    }

    pub async fn start_with(config: PgConfig) -> PgServer {
        let backend = PgBackend::connect(config).await.expect("connect backend");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let options = server::ServeOptions {
            drain_timeout: Duration::from_millis(300),
            ..server::ServeOptions::default()
        };
        let task = tokio::spawn({
            let backend = backend.clone();
            async move {
                server::serve_with(
                    listener,
                    backend,
                    async {
                        let _ = stopped.await;
                    },
                    options,
                )
                .await
                .expect("serve");
            }
        });
        PgServer {
            addr,
            backend,
            stop: Some(stop),
            task: Some(task),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn client(&self) -> LeaseholdClient<Channel> {
        LeaseholdClient::connect(self.url()).await.expect("connect")
    }

    pub async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("server task");
        }
    }
}

/// A `leasehold serve --store postgres://…` process on a test schema,
/// killed (SIGKILL) when dropped: for what only a real process shows
/// (`kill -9`).
pub struct ServeProcess {
    child: std::process::Child,
    pub addr: SocketAddr,
}

impl ServeProcess {
    /// Starts the binary on 127.0.0.1:0 over `schema` (with `args` added)
    /// and waits until it listens.
    pub fn start(schema: &Schema, args: &[&str]) -> ServeProcess {
        let store = ["--store", &schema.url, "--pg-schema", &schema.name];
        let args: Vec<&str> = store.iter().copied().chain(args.iter().copied()).collect();
        let (child, addr) = super::common::spawn_serve(&args);
        ServeProcess { child, addr }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `kill -9`: no drain, no goodbye to its clients.
    pub fn kill9(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reap");
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of counter `name` in `server`'s metrics.
pub fn counter(server: &PgServer, name: &str) -> u64 {
    let mut out = leasehold_server::metrics::Exposition::default();
    leasehold_server::Backend::write_metrics(&server.backend, &mut out);
    let text = out.into_text();
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from\n{text}"))
}
