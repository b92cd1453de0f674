//! Helpers for the client tests: a listener that never answers, a proxy
//! whose connections go silent, and bounded waiting. (A server that comes
//! back on the same address is [`TestServer::start_again`](super::TestServer::start_again).)

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use super::bind_again;

/// How long any bounded wait in these tests may take before it fails.
pub const PATIENCE: Duration = Duration::from_secs(10);

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
