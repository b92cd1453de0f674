//! The harness's own parts: the fenced store, the proxy's faults, and the
//! database URL rewriting.

use std::time::Duration;

use leasehold_chaos::history::{Outcome, Recorder, Reply};
use leasehold_chaos::proxy::{Mode, Proxy};
use leasehold_chaos::run::redirect;
use leasehold_chaos::store::FencedStore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The store takes equal and higher fences, refuses lower ones, and
/// records its order.
#[test]
fn the_fenced_store_refuses_a_lower_fence() {
    let recorder = Recorder::new();
    let store = FencedStore::new();
    assert!(store.write(&recorder, 1, "k", 3));
    assert!(store.write(&recorder, 1, "k", 3));
    assert!(!store.write(&recorder, 2, "k", 2));
    assert!(store.write(&recorder, 2, "other", 1), "fences are per key");
    assert!(store.write(&recorder, 3, "k", 5));
    let outcomes: Vec<Outcome> = recorder
        .snapshot()
        .ops
        .into_iter()
        .map(|op| op.outcome)
        .collect();
    assert_eq!(
        outcomes,
        vec![
            Outcome::Ok(Reply::Accepted { seq: 1 }),
            Outcome::Ok(Reply::Accepted { seq: 2 }),
            Outcome::Ok(Reply::Rejected { highest: 3 }),
            Outcome::Ok(Reply::Accepted { seq: 3 }),
            Outcome::Ok(Reply::Accepted { seq: 4 }),
        ]
    );
}

/// An echo server on loopback.
async fn echo() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n) = socket.read(&mut buf).await {
                    if n == 0 || socket.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

async fn round_trip(socket: &mut TcpStream, within: Duration) -> Option<usize> {
    socket.write_all(b"ping").await.ok()?;
    let mut buf = [0u8; 4];
    match tokio::time::timeout(within, socket.read(&mut buf)).await {
        Ok(Ok(n)) => Some(n),
        _ => None,
    }
}

/// Traffic passes, stalls during a partition and resumes when it heals,
/// and a cut closes open connections.
#[tokio::test]
async fn the_proxy_partitions_heals_and_cuts() {
    let proxy = Proxy::start(Some(echo().await)).await.unwrap();
    let mut socket = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(
        round_trip(&mut socket, Duration::from_secs(5)).await,
        Some(4)
    );

    proxy.set_mode(Mode::Partition);
    assert_eq!(
        round_trip(&mut socket, Duration::from_millis(300)).await,
        None
    );
    proxy.set_mode(Mode::Pass);
    let mut buf = [0u8; 4];
    let n = tokio::time::timeout(Duration::from_secs(5), socket.read(&mut buf)).await;
    assert_eq!(
        n.unwrap().unwrap(),
        4,
        "the stalled bytes arrive after the heal"
    );

    proxy.set_mode(Mode::Delay(Duration::from_millis(200)));
    let start = std::time::Instant::now();
    assert_eq!(
        round_trip(&mut socket, Duration::from_secs(5)).await,
        Some(4)
    );
    assert!(
        start.elapsed() >= Duration::from_millis(400),
        "two delayed hops"
    );
    proxy.set_mode(Mode::Pass);

    proxy.cut();
    let closed = tokio::time::timeout(Duration::from_secs(5), socket.read(&mut buf)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "the cut closed the connection"
    );
    let mut fresh = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(
        round_trip(&mut fresh, Duration::from_secs(5)).await,
        Some(4),
        "new connections work"
    );
}

/// A PostgreSQL URL is pointed at a proxy, user and database kept.
#[test]
fn a_database_url_is_redirected() {
    let proxy = "127.0.0.1:6000".parse().unwrap();
    assert_eq!(
        redirect("postgres://postgres@127.0.0.1:5432/test", proxy),
        Some((
            "127.0.0.1:5432".into(),
            "postgres://postgres@127.0.0.1:6000/test".into()
        ))
    );
    assert_eq!(
        redirect("postgres://localhost/db", proxy),
        Some((
            "localhost:5432".into(),
            "postgres://127.0.0.1:6000/db".into()
        ))
    );
}
