//! Shared helpers for integration tests: real servers on loopback, real SQLite files.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Clock, ManualClock};
use leasehold_server::server;
use leasehold_server::sqlite::SyncMode;
use leasehold_server::{Engine, EngineConfig};
use leasehold_wire::pb;
use leasehold_wire::pb::leasehold_client::LeaseholdClient;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

/// A start time far from zero, so "ms since epoch" arithmetic looks real.
pub const T0: u64 = 1_700_000_000_000;

/// An in-process server on 127.0.0.1:0 over a SQLite file in a temp dir.
pub struct TestServer {
    pub addr: SocketAddr,
    pub engine: Engine,
    pub clock: ManualClock,
    pub db: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
    /// Keeps the database directory alive for the test.
    _dir: Option<tempfile::TempDir>,
}

impl TestServer {
    /// A fresh server with a manual clock at [`T0`].
    pub async fn start() -> TestServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = dir.path().join("leasehold.db");
        let mut server = Self::start_on(&db, ManualClock::new(T0)).await;
        server._dir = Some(dir);
        server
    }

    /// A fresh server with these connection options.
    pub async fn start_with(options: server::ServeOptions) -> TestServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = dir.path().join("leasehold.db");
        let mut server = Self::start_on_with(&db, ManualClock::new(T0), options).await;
        server._dir = Some(dir);
        server
    }

    /// A server on an existing database file with the given clock.
    pub async fn start_on(db: &Path, clock: ManualClock) -> TestServer {
        let options = server::ServeOptions {
            drain_timeout: Duration::from_millis(300),
            ..server::ServeOptions::default()
        };
        Self::start_on_with(db, clock, options).await
    }

    async fn start_on_with(
        db: &Path,
        clock: ManualClock,
        options: server::ServeOptions,
    ) -> TestServer {
        let engine = server::open_engine(
            db,
            SyncMode::Full,
            Arc::new(clock.clone()) as Arc<dyn Clock>,
            EngineConfig::default(),
        )
        .expect("open engine");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn({
            let engine = engine.clone();
            async move {
                server::serve_with(
                    listener,
                    engine,
                    async {
                        let _ = stopped.await;
                    },
                    options,
                )
                .await
                .expect("serve");
            }
        });
        TestServer {
            addr,
            engine,
            clock,
            db: db.to_owned(),
            stop: Some(stop),
            task: Some(task),
            _dir: None,
        }
    }

    /// A new gRPC client connected to this server.
    pub async fn client(&self) -> LeaseholdClient<Channel> {
        LeaseholdClient::connect(format!("http://{}", self.addr))
            .await
            .expect("connect")
    }

    /// Stops the server cleanly (drain, flush) and starts a new one on the
    /// same file, with the same clock.
    pub async fn restart(mut self) -> TestServer {
        let dir = self._dir.take();
        let db = self.db.clone();
        let clock = self.clock.clone();
        self.stop().await;
        let mut server = Self::start_on(&db, clock).await;
        server._dir = dir;
        server
    }

    /// Stops the server cleanly.
    pub async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("server task");
        }
    }
}

/// An acquire request with sensible defaults.
pub fn acquire(key: &str, owner: &str, ttl_ms: u64) -> pb::AcquireRequest {
    pb::AcquireRequest {
        key: key.into(),
        owner: owner.into(),
        ttl_ms,
        wait_ms: 0,
        request_id: String::new(),
    }
}

/// The lease from an Acquire reply.
pub fn lease_of(reply: tonic::Response<pb::AcquireResponse>) -> pb::Lease {
    reply.into_inner().lease.expect("lease in reply")
}

/// The `leasehold` binary built for this test run.
pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_leasehold")
}

/// A real `leasehold serve` process, for crash tests.
pub struct ServerProcess {
    pub child: Child,
    pub addr: SocketAddr,
}

impl ServerProcess {
    /// Starts `leasehold serve` on 127.0.0.1:0 over `db` and waits until it listens.
    pub fn start(db: &Path) -> ServerProcess {
        let mut child = Command::new(binary())
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--drain-timeout-ms",
                "300",
                "--db",
            ])
            .arg(db)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn leasehold serve");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read listening line");
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .parse()
            .expect("address");
        ServerProcess { child, addr }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn client(&self) -> LeaseholdClient<Channel> {
        for _ in 0..50 {
            if let Ok(client) = LeaseholdClient::connect(self.url()).await {
                return client;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("cannot connect to {}", self.url());
    }

    /// `kill -9`: no shutdown, no flush.
    pub fn kill9(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reap");
    }

    /// SIGTERM and wait for a clean exit.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill -TERM");
        self.child.wait().expect("wait")
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
