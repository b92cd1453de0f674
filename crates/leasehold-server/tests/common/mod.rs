//! Shared helpers for integration tests: real servers on loopback, real SQLite files.
#![allow(dead_code)]

pub mod client_support;
pub mod requests;

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
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

/// A start time far from zero, so "ms since epoch" arithmetic looks real.
pub const T0: u64 = 1_700_000_000_000;

/// An in-process server over a SQLite file, with a manual clock. Start one
/// with [`TestServer::start`] or configure it with [`TestServer::builder`].
pub struct TestServer {
    pub addr: SocketAddr,
    pub engine: Engine,
    pub clock: ManualClock,
    pub db: PathBuf,
    /// The connection options it serves with, kept for restarts.
    pub options: server::ServeOptions,
    /// The engine's configuration, kept for restarts.
    pub config: EngineConfig,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
    /// Keeps the database directory alive for the test.
    _dir: Option<tempfile::TempDir>,
}

/// How to start a [`TestServer`]. Every setting has a default: a fresh
/// database in a temp dir, a manual clock at [`T0`], [`test_options`], and
/// a free port on 127.0.0.1.
#[derive(Default)]
#[must_use]
pub struct TestServerBuilder {
    db: Option<PathBuf>,
    clock: Option<ManualClock>,
    options: Option<server::ServeOptions>,
    pinned_addr: Option<SocketAddr>,
    config: Option<EngineConfig>,
}

/// The connection options of a test server: the defaults with a short drain,
/// so stopping a server with idle clients connected does not take seconds.
pub fn test_options() -> server::ServeOptions {
    server::ServeOptions {
        drain_timeout: Duration::from_millis(300),
        ..server::ServeOptions::default()
    }
}

impl TestServerBuilder {
    /// Serve this database file (it may exist already) instead of a fresh one.
    pub fn db(mut self, path: &Path) -> Self {
        self.db = Some(path.to_owned());
        self
    }

    /// Run on this clock instead of a new one at [`T0`].
    pub fn clock(mut self, clock: ManualClock) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Serve with these connection options instead of [`test_options`].
    pub fn options(mut self, options: server::ServeOptions) -> Self {
        self.options = Some(options);
        self
    }

    /// Run the engine with this configuration instead of the default.
    pub fn config(mut self, config: EngineConfig) -> Self {
        self.config = Some(config);
        self
    }

    /// Listen on exactly this address (retrying briefly while a stopped
    /// server's socket lets go), so clients that knew an earlier server there
    /// reconnect to this one.
    pub fn pinned_addr(mut self, addr: SocketAddr) -> Self {
        self.pinned_addr = Some(addr);
        self
    }

    /// Opens the engine and starts serving.
    pub async fn start(self) -> TestServer {
        let (db, dir) = match self.db {
            Some(db) => (db, None),
            None => {
                let dir = tempfile::tempdir().expect("temp dir");
                (dir.path().join("leasehold.db"), Some(dir))
            }
        };
        let clock = self.clock.unwrap_or_else(|| ManualClock::new(T0));
        let options = self.options.unwrap_or_else(test_options);
        let config = self.config.unwrap_or_default();
        let engine = server::open_engine(
            &db,
            SyncMode::Full,
            Arc::new(clock.clone()) as Arc<dyn Clock>,
            config.clone(),
        )
        .expect("open engine");
        let listener = match self.pinned_addr {
            Some(addr) => bind_again(addr).await,
            None => TcpListener::bind("127.0.0.1:0").await.expect("bind"),
        };
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
            db,
            options,
            config,
            stop: Some(stop),
            task: Some(task),
            _dir: dir,
        }
    }
}

impl TestServer {
    /// A fresh server with every default of [`TestServerBuilder`].
    pub async fn start() -> TestServer {
        Self::builder().start().await
    }

    /// Configures a server; see [`TestServerBuilder`].
    pub fn builder() -> TestServerBuilder {
        TestServerBuilder::default()
    }

    /// A builder for a server on this one's database, clock and options.
    fn successor(&self) -> TestServerBuilder {
        Self::builder()
            .db(&self.db)
            .clock(self.clock.clone())
            .options(self.options)
            .config(self.config.clone())
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A new gRPC client connected to this server.
    pub async fn client(&self) -> LeaseholdClient<Channel> {
        LeaseholdClient::connect(self.url()).await.expect("connect")
    }

    /// Stops the server cleanly (drain, flush) and starts a new one on the
    /// same file, with the same clock and options, on a new port.
    pub async fn restart(mut self) -> TestServer {
        self.stop().await;
        let mut server = self.successor().start().await;
        server._dir = self._dir.take();
        server
    }

    /// Starts a stopped server again on the same address, file, clock and
    /// options, so a client's existing channel reaches the new server (as it
    /// would reach a restarted server behind a fixed address).
    pub async fn start_again(&mut self) {
        assert!(self.task.is_none(), "still running");
        let mut server = self.successor().pinned_addr(self.addr).start().await;
        server._dir = self._dir.take();
        *self = server;
    }

    /// Stops the server cleanly (drain, flush); the address stops answering.
    pub async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("server task");
        }
    }
}

/// Binds `addr` again, retrying briefly while the old socket lets go.
pub async fn bind_again(addr: SocketAddr) -> TcpListener {
    for _ in 0..100 {
        if let Ok(listener) = TcpListener::bind(addr).await {
            return listener;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("cannot bind {addr} again");
}

/// An acquire request with sensible defaults.
pub fn acquire(key: &str, owner: &str, ttl_ms: u64) -> pb::AcquireRequest {
    pb::AcquireRequest {
        key: key.into(),
        owner: owner.into(),
        ttl_ms,
        wait_ms: 0,
        request_id: String::new(),
        ..Default::default()
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

/// Starts the `leasehold serve` binary on 127.0.0.1:0 with `args` added
/// (and none of the store variables of the test's environment), and waits
/// until it prints the address it listens on.
pub fn spawn_serve(args: &[&str]) -> (Child, SocketAddr) {
    let mut child = Command::new(binary())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--drain-timeout-ms",
            "300",
        ])
        .args(args)
        .env("RUST_LOG", "warn")
        .env_remove("LEASEHOLD_DB")
        .env_remove("LEASEHOLD_STORE")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn leasehold serve");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read the listening line");
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .parse()
        .expect("address");
    (child, addr)
}

/// A real `leasehold serve` process, for crash tests.
pub struct ServerProcess {
    pub child: Child,
    pub addr: SocketAddr,
}

impl ServerProcess {
    /// Starts `leasehold serve` on 127.0.0.1:0 over `db` and waits until it listens.
    pub fn start(db: &Path) -> ServerProcess {
        let db = db.to_str().expect("a UTF-8 path");
        let (child, addr) = spawn_serve(&["--db", db]);
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
