//! Durability across real process crashes: `kill -9` of `leasehold serve` under load.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{ServerProcess, acquire};
use leasehold_client::Client;
use leasehold_wire::pb;
use leasehold_wire::pb::session_request::Op;

/// What the load generator saw acknowledged before the crash.
#[derive(Default)]
struct Acked {
    /// (key, fence) of every acknowledged Acquire.
    acquired: Vec<(String, u64)>,
    /// (key, fence) of every acknowledged Release.
    released: Vec<(String, u64)>,
}

/// How the load reaches the server.
#[derive(Clone, Copy)]
enum Path {
    /// A connection and unary calls per worker.
    Unary,
    /// All workers pipelined over the one Session stream of a shared client.
    Stream,
}

/// One worker's Acquire and Release, by `path`.
#[derive(Clone)]
enum Loader {
    Unary(leasehold_wire::pb::leasehold_client::LeaseholdClient<tonic::transport::Channel>),
    Stream(Client),
}

impl Loader {
    async fn acquire(&mut self, key: &str) -> Option<pb::Lease> {
        match self {
            Loader::Unary(rpc) => {
                rpc.acquire(acquire(key, "loader", 600_000))
                    .await
                    .ok()?
                    .into_inner()
                    .lease
            }
            Loader::Stream(client) => {
                client
                    .session_op(Op::Acquire(acquire(key, "loader", 600_000)), TIMEOUT)
                    .await
                    .ok()?
                    .lease
            }
        }
    }

    async fn release(&mut self, lease: pb::Lease) -> bool {
        let release = pb::ReleaseRequest {
            key: lease.key,
            fence: lease.fence,
            lease_id: lease.lease_id,
            suspend: false,
            ..Default::default()
        };
        match self {
            Loader::Unary(rpc) => rpc.release(release).await.is_ok(),
            Loader::Stream(client) => client
                .session_op(Op::Release(release), TIMEOUT)
                .await
                .is_ok(),
        }
    }
}

const TIMEOUT: Duration = Duration::from_secs(10);

/// Every acknowledged acquire and release survives `kill -9`, and fences keep rising.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_kill_9_under_load() {
    crash_under_load(Path::Unary).await;
}

/// The same over the pipelined Session stream, where many operations are in
/// flight at once and each is answered as its commit lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_stream_writes_survive_kill_9_under_pipelined_load() {
    crash_under_load(Path::Stream).await;
}

async fn crash_under_load(path: Path) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("crash.db");
    let server = ServerProcess::start(&db);
    let acked = Arc::new(Mutex::new(Acked::default()));
    let shared = Client::connect(server.url()).await.unwrap();
    let mut tasks = Vec::new();
    for worker in 0..16 {
        let mut loader = match path {
            Path::Unary => Loader::Unary(server.client().await),
            Path::Stream => Loader::Stream(shared.clone()),
        };
        let acked = acked.clone();
        tasks.push(tokio::spawn(async move {
            // Bounded: stops at the first error (the crash) or after 100k steps.
            for n in 0..100_000u32 {
                let key = format!("w{worker}/{n}");
                let Some(lease) = loader.acquire(&key).await else {
                    return;
                };
                let fence = lease.fence;
                acked.lock().unwrap().acquired.push((key.clone(), fence));
                if n % 2 == 0 {
                    if !loader.release(lease).await {
                        return;
                    }
                    acked.lock().unwrap().released.push((key, fence));
                }
            }
        }));
    }
    // Let the load run, then crash the server in the middle of it.
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        if acked.lock().unwrap().acquired.len() >= 300 {
            break;
        }
    }
    server.kill9();
    for task in tasks {
        task.await.unwrap();
    }
    let acked = std::mem::take(&mut *acked.lock().unwrap());
    assert!(
        acked.acquired.len() >= 50,
        "load too small: {}",
        acked.acquired.len()
    );

    let server = ServerProcess::start(&db);
    let mut client = server.client().await;
    let released: std::collections::HashSet<_> = acked.released.iter().cloned().collect();
    let mut max_fence = 0;
    for (key, fence) in &acked.acquired {
        max_fence = max_fence.max(*fence);
        let got = client
            .get(pb::GetRequest { key: key.clone() })
            .await
            .unwrap_or_else(|s| panic!("acknowledged key {key} lost: {s:?}"))
            .into_inner();
        if released.contains(&(key.clone(), *fence)) {
            let ended = got.last_ended.expect("acknowledged release kept");
            assert_eq!(ended.fence, *fence);
            assert_eq!(ended.end, pb::TermEnd::Released as i32);
        } else {
            // An acquire whose release was in flight may show either state;
            // one never released must still be live with its fence.
            match (got.lease, got.last_ended) {
                (Some(lease), _) => assert_eq!(lease.fence, *fence),
                (None, Some(ended)) => assert_eq!(ended.fence, *fence),
                other => panic!("{key}: {other:?}"),
            }
        }
    }
    // New grants are above every fence acknowledged before the crash.
    let next = client
        .acquire(acquire("after-crash", "o", 1000))
        .await
        .unwrap();
    let next_fence = next.into_inner().lease.unwrap().fence;
    assert!(next_fence > max_fence, "{next_fence} <= {max_fence}");

    // A second crash right after a grant still never repeats a fence.
    server.kill9();
    let server = ServerProcess::start(&db);
    let mut client = server.client().await;
    let again = client
        .acquire(acquire("after-second-crash", "o", 1000))
        .await
        .unwrap();
    assert!(again.into_inner().lease.unwrap().fence > next_fence);
}

/// SIGTERM stops the server cleanly, and its leases are there after restart.
#[tokio::test]
async fn sigterm_stops_cleanly_and_keeps_leases() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("term.db");
    let server = ServerProcess::start(&db);
    let mut client = server.client().await;
    let lease = client
        .acquire(acquire("k", "o", 600_000))
        .await
        .unwrap()
        .into_inner()
        .lease
        .unwrap();
    let status = server.terminate();
    assert!(status.success(), "exit status {status:?}");
    let server = ServerProcess::start(&db);
    let mut client = server.client().await;
    client
        .check(pb::CheckRequest {
            key: "k".into(),
            fence: lease.fence,
        })
        .await
        .unwrap();
}
