//! Helpers for the client tests: a server that comes back on the same address,
//! a listener that never answers, and bounded waiting.
//!
//! Included with `#[path = "common/client_support.rs"] mod client_support;`,
//! next to `mod common;`.
#![allow(dead_code)]

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Clock, ManualClock};
use leasehold_server::EngineConfig;
use leasehold_server::server;
use leasehold_server::sqlite::SyncMode;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Start time of the manual clock, as in `common::T0`.
pub const T0: u64 = 1_700_000_000_000;

/// How long any bounded wait in these tests may take before it fails.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// An in-process server that can be stopped and started again on the same
/// address, so a client's existing channel reaches the new one (as it would
/// reach a restarted server behind a fixed address).
pub struct PinnedServer {
    pub addr: SocketAddr,
    pub clock: ManualClock,
    pub db: PathBuf,
    /// The stop signal and serving task while running.
    running: Option<(oneshot::Sender<()>, JoinHandle<()>)>,
    /// Keeps the database directory alive for the test.
    _dir: tempfile::TempDir,
}

impl PinnedServer {
    /// A fresh server on 127.0.0.1:0 with a manual clock at [`T0`].
    pub async fn start() -> PinnedServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = dir.path().join("leasehold.db");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut server = PinnedServer {
            addr,
            clock: ManualClock::new(T0),
            db,
            running: None,
            _dir: dir,
        };
        server.serve(listener);
        server
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops the server cleanly (drain, flush); the address stops answering.
    pub async fn stop(&mut self) {
        if let Some((stop, task)) = self.running.take() {
            let _ = stop.send(());
            task.await.expect("server task");
        }
    }

    /// Starts the server again on the same address, database and clock.
    pub async fn start_again(&mut self) {
        assert!(self.running.is_none(), "still running");
        let listener = bind_again(self.addr).await;
        self.serve(listener);
    }

    fn serve(&mut self, listener: TcpListener) {
        let engine = server::open_engine(
            &self.db,
            SyncMode::Full,
            Arc::new(self.clock.clone()) as Arc<dyn Clock>,
            EngineConfig::default(),
        )
        .expect("open engine");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            server::serve(listener, engine, async {
                let _ = stopped.await;
            })
            .await
            .expect("serve");
        });
        self.running = Some((stop, task));
    }
}

impl Drop for PinnedServer {
    fn drop(&mut self) {
        if let Some((stop, _task)) = self.running.take() {
            let _ = stop.send(());
        }
    }
}

/// Binds `addr` again, retrying briefly while the old socket lets go.
async fn bind_again(addr: SocketAddr) -> TcpListener {
    for _ in 0..100 {
        if let Ok(listener) = TcpListener::bind(addr).await {
            return listener;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("cannot bind {addr} again");
}

/// A listener on `addr` that accepts connections and never answers, like a
/// hung server or a black-holed network. Abort the handle to close them all.
pub async fn black_hole(addr: SocketAddr) -> JoinHandle<()> {
    let listener = bind_again(addr).await;
    tokio::spawn(async move {
        let mut held: Vec<TcpStream> = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    })
}

/// Waits until `condition` holds, checking every 5 ms, for at most [`PATIENCE`].
pub async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let waited = tokio::time::timeout(PATIENCE, async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "timed out waiting until {what}");
}

/// Awaits `future` for at most [`PATIENCE`].
pub async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, future)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// A TCP proxy to `target` whose existing connections can be silenced at
/// once, as a network partition or a dead peer leaves them: the sockets stay
/// open, nothing more gets through, and no FIN or RST arrives. Connections
/// made after a freeze work normally.
pub struct FreezingProxy {
    pub addr: SocketAddr,
    /// Bumped by each freeze; a connection forwards while its epoch is current.
    epoch: Arc<tokio::sync::watch::Sender<u64>>,
    /// Connections accepted so far.
    accepted: Arc<std::sync::atomic::AtomicUsize>,
    task: JoinHandle<()>,
}

impl FreezingProxy {
    pub async fn start(target: SocketAddr) -> FreezingProxy {
        use std::sync::atomic::Ordering;
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let epoch = Arc::new(tokio::sync::watch::Sender::new(0u64));
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let task = tokio::spawn({
            let (epoch, accepted) = (epoch.clone(), accepted.clone());
            async move {
                let mut connections = tokio::task::JoinSet::new();
                while let Ok((mut inbound, _)) = listener.accept().await {
                    accepted.fetch_add(1, Ordering::SeqCst);
                    let mut frozen = epoch.subscribe();
                    connections.spawn(async move {
                        let Ok(mut outbound) = TcpStream::connect(target).await else {
                            return;
                        };
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                            _ = frozen.changed() => {
                                // Silent from now on, with both sockets held open.
                                std::future::pending::<()>().await;
                            }
                        }
                    });
                }
            }
        });
        FreezingProxy {
            addr,
            epoch,
            accepted,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Silences every connection made so far.
    pub fn freeze(&self) {
        self.epoch.send_modify(|e| *e += 1);
    }

    pub fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for FreezingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
