//! A loopback TCP proxy that can delay, stall (partition) and cut the
//! connections through it: between the workers and a server, or between a
//! server and PostgreSQL.
//!
//! * **Delay**: every chunk waits before it is forwarded (latency; replies
//!   arrive after the worker's timeout, so outcomes become unknown).
//! * **Partition**: nothing is forwarded in either direction until the
//!   partition heals; the bytes wait in the socket buffers, as TCP
//!   retransmits across a real partition. Keep-alive pings go unanswered
//!   too, so a long partition makes the client drop the connection.
//! * **Cut**: every open connection is closed at once (new ones are
//!   accepted), as a reset, a crashed middlebox or a restarted database
//!   looks to the peers.
//!
//! The upstream address can change (a restarted server listens on a new
//! port) without the clients noticing anything but a cut.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the proxy does to traffic now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Pass,
    Delay(Duration),
    Partition,
}

/// Shared between the handle and the connection tasks.
#[derive(Debug)]
struct Shared {
    /// Where to connect; `None` refuses new connections (closes them).
    upstream: Mutex<Option<SocketAddr>>,
    /// The traffic mode; a watch so stalled pumps wake when it changes.
    mode: watch::Sender<Mode>,
    /// Bumped to close every open connection.
    cuts: watch::Sender<u64>,
}

/// A running proxy; dropping it stops accepting (open connections end at
/// the next cut or when a side closes).
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

impl Proxy {
    /// Starts a proxy on a free loopback port, forwarding to `upstream`.
    ///
    /// # Errors
    /// When no loopback port can be bound.
    pub async fn start(upstream: Option<SocketAddr>) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            upstream: Mutex::new(upstream),
            mode: watch::channel(Mode::Pass).0,
            cuts: watch::channel(0).0,
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        Ok(Proxy {
            addr,
            shared,
            accept,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Points new connections at `upstream`.
    pub fn set_upstream(&self, upstream: Option<SocketAddr>) {
        *self.shared.upstream.lock().expect("proxy lock") = upstream;
    }

    pub fn set_mode(&self, mode: Mode) {
        self.shared.mode.send_replace(mode);
    }

    /// Closes every open connection now.
    pub fn cut(&self) {
        self.shared.cuts.send_modify(|n| *n += 1);
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let upstream = *shared.upstream.lock().expect("proxy lock");
        let Some(upstream) = upstream else { continue };
        let shared = shared.clone();
        tokio::spawn(async move {
            let mut cuts = shared.cuts.subscribe();
            cuts.mark_unchanged();
            let Ok(server) = TcpStream::connect(upstream).await else {
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            // Either direction ending (or a cut) closes both sockets.
            tokio::select! {
                _ = pump(cr, sw, &shared) => {}
                _ = pump(sr, cw, &shared) => {}
                _ = cuts.changed() => {}
            }
        });
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    shared: &Shared,
) {
    let mut mode = shared.mode.subscribe();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        loop {
            let now = *mode.borrow_and_update();
            match now {
                Mode::Pass => break,
                Mode::Delay(d) => {
                    tokio::time::sleep(d).await;
                    break;
                }
                Mode::Partition => {
                    if mode.changed().await.is_err() {
                        return;
                    }
                }
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
