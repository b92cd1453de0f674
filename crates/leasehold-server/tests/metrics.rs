//! The Prometheus endpoint reflects a known sequence of operations: counts,
//! not timings, and never a key, owner or lease id.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::{T0, acquire, lease_of};
use leasehold_core::{Clock, ManualClock};
use leasehold_server::EngineConfig;
use leasehold_server::server;
use leasehold_server::sqlite::SyncMode;
use leasehold_wire::pb;
use leasehold_wire::pb::leasehold_client::LeaseholdClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Fetches `path` from the metrics listener with a plain HTTP/1.1 GET.
async fn get(addr: std::net::SocketAddr, path: &str) -> (String, String) {
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    socket
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut response = String::new();
    tokio::time::timeout(
        Duration::from_secs(10),
        socket.read_to_string(&mut response),
    )
    .await
    .expect("the endpoint answers")
    .unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    (head.to_owned(), body.to_owned())
}

/// `name{labels} value` lines as a map.
fn samples(page: &str) -> HashMap<String, f64> {
    page.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (name, value) = l.rsplit_once(' ').unwrap();
            (name.to_owned(), value.parse().unwrap())
        })
        .collect()
}

#[tokio::test]
async fn metrics_count_what_happened() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let engine = server::open_engine(
        &dir.path().join("l.db"),
        SyncMode::Full,
        Arc::new(clock.clone()) as Arc<dyn Clock>,
        EngineConfig::default(),
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (addr, metrics_addr) = (
        listener.local_addr().unwrap(),
        metrics.local_addr().unwrap(),
    );
    tokio::spawn(server::serve_with_metrics(
        listener,
        metrics,
        engine.clone(),
        std::future::pending(),
        server::ServeOptions::default(),
    ));
    let mut rpc = LeaseholdClient::connect(format!("http://{addr}"))
        .await
        .unwrap();

    let k1 = lease_of(rpc.acquire(acquire("k1", "a", 10_000)).await.unwrap());
    let busy = rpc.acquire(acquire("k1", "b", 10_000)).await.unwrap_err();
    assert_eq!(busy.code(), tonic::Code::Aborted);
    let k2 = lease_of(rpc.acquire(acquire("k2", "a", 10_000)).await.unwrap());
    rpc.renew(pb::RenewRequest {
        key: "k1".into(),
        fence: k1.fence,
        lease_id: k1.lease_id.clone(),
        ttl_ms: 0,
    })
    .await
    .unwrap();
    rpc.release(pb::ReleaseRequest {
        key: "k1".into(),
        fence: k1.fence,
        lease_id: k1.lease_id.clone(),
        suspend: false,
        ..Default::default()
    })
    .await
    .unwrap();
    rpc.release(pb::ReleaseRequest {
        key: "k2".into(),
        fence: k2.fence,
        lease_id: k2.lease_id.clone(),
        suspend: true,
        ..Default::default()
    })
    .await
    .unwrap();
    let stale = rpc
        .check(pb::CheckRequest {
            key: "k1".into(),
            fence: k1.fence,
        })
        .await
        .unwrap_err();
    assert_eq!(stale.code(), tonic::Code::FailedPrecondition);
    let bad = rpc.acquire(acquire("", "a", 10_000)).await.unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    let k3 = lease_of(rpc.acquire(acquire("k3", "a", 1_000)).await.unwrap());
    clock.advance(2_000);
    // The expiry timer ends k3's term by itself.
    for _ in 0..500 {
        if engine.stats().expirations == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let (head, page) = get(metrics_addr, "/metrics").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    let m = samples(&page);
    let expect = [
        ("leasehold_grants_total", 3.0),
        ("leasehold_releases_total{end=\"released\"}", 1.0),
        ("leasehold_releases_total{end=\"suspended\"}", 1.0),
        ("leasehold_expirations_total", 1.0),
        ("leasehold_renewals_total", 1.0),
        ("leasehold_leases_live", 0.0),
        ("leasehold_waiters", 0.0),
        ("leasehold_keys", 3.0),
        ("leasehold_refusals_total{code=\"ABORTED\"}", 1.0),
        (
            "leasehold_refusals_total{code=\"FAILED_PRECONDITION\",reason=\"released\"}",
            1.0,
        ),
        ("leasehold_refusals_total{code=\"INVALID_ARGUMENT\"}", 1.0),
        ("leasehold_request_seconds_count{rpc=\"Acquire\"}", 5.0),
        ("leasehold_request_seconds_count{rpc=\"Release\"}", 2.0),
        ("leasehold_request_seconds_count{rpc=\"Check\"}", 1.0),
    ];
    for (name, value) in expect {
        assert_eq!(m.get(name), Some(&value), "{name} in\n{page}");
    }
    assert!(m["leasehold_commit_seconds_count"] >= 1.0, "{page}");
    assert!(m["leasehold_commits_total"] >= 1.0, "{page}");
    // No secret and no client-chosen name is ever a label or a value.
    for secret in [&k1.lease_id, &k2.lease_id, &k3.lease_id] {
        assert!(!page.contains(secret.as_str()), "a lease id leaked");
    }
    assert!(!page.contains("k1") && !page.contains("\"a\""), "{page}");

    let (head, _) = get(metrics_addr, "/elsewhere").await;
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
}
