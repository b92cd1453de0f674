//! What only the SQLite engine has, over real gRPC on loopback, on a real
//! SQLite file, with a manual clock: a clean restart, group commit, the
//! shutdown of waiters, the Session stream against the engine, and the
//! pruning of released keys. The lease contract both backends share is in
//! `contract.rs`.

mod common;

use std::time::Duration;

use common::requests::*;
use common::{T0, TestServer};
use leasehold_wire::pb;
use tonic::Code;

/// A clean restart keeps fences rising and gives live leases their full TTL again.
#[tokio::test]
async fn a_clean_restart_keeps_fences_and_live_leases() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let live = lease_of(client.acquire(acquire("live", "o", 1000)).await.unwrap());
    let done = lease_of(client.acquire(acquire("done", "o", 1000)).await.unwrap());
    client.release(release(&done, true)).await.unwrap();
    server.clock.advance(900);
    let server = server.restart().await;
    let mut client = server.client().await;
    // The restart gave the live term its full TTL from start-up.
    server.clock.advance(999);
    client.check(check("live", live.fence)).await.unwrap();
    // Its lease id still works.
    client.renew(renew(&live, 0)).await.unwrap();
    // The suspended key is still recoverable, and new fences are higher.
    let got = client
        .get(pb::GetRequest { key: "done".into() })
        .await
        .unwrap()
        .into_inner();
    assert!(got.recoverable);
    let next = lease_of(client.acquire(acquire("new", "o", 1000)).await.unwrap());
    assert!(next.fence > done.fence);
}

/// Group commit: many concurrent acquires share few SQLite transactions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_acquires_share_commits() {
    let server = TestServer::start().await;
    let before = server.engine.commits();
    let mut tasks = Vec::new();
    for i in 0..64 {
        let mut client = server.client().await;
        tasks.push(tokio::spawn(async move {
            for j in 0..8 {
                client
                    .acquire(acquire(&format!("k{i}-{j}"), "o", 60_000))
                    .await
                    .unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let commits = server.engine.commits() - before;
    assert_eq!(server.engine.key_count(), 512);
    assert!(commits < 512, "{commits} commits for 512 acquires");
    assert!(commits >= 1);
}

/// On shutdown, a waiting Acquire gives up with UNAVAILABLE instead of holding the server.
#[tokio::test]
async fn shutdown_turns_waiters_away_with_unavailable() {
    let mut server = TestServer::start().await;
    let mut client = server.client().await;
    client
        .acquire(acquire("k", "holder", 60_000))
        .await
        .unwrap();
    let mut waiter = server.client().await;
    let waiting = tokio::spawn(async move {
        let req = pb::AcquireRequest {
            wait_ms: 60_000,
            ..acquire("k", "waiter", 1000)
        };
        waiter.acquire(req).await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.engine.begin_shutdown();
    let status = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter was turned away")
        .unwrap()
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    server.stop().await;
    // Once stopped, the engine refuses new work rather than losing it.
    let key = leasehold_core::Key::parse("k").unwrap();
    let err = server
        .engine
        .check(&key, leasehold_core::Fence(1))
        .await
        .unwrap_err();
    assert!(
        matches!(err, leasehold_core::Error::Unavailable(_)),
        "{err:?}"
    );
}

/// A Session stream renews and checks over one stream; refusals come back in the
/// response and the stream stays open.
#[tokio::test]
async fn session_stream_renews_checks_and_reports_refusals() {
    use pb::session_request::Op;
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let lease = lease_of(client.acquire(acquire("k", "o", 1000)).await.unwrap());
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut replies = client
        .session(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let mut send = async |op: Op| {
        tx.send(pb::SessionRequest {
            op: Some(op),
            id: 7,
        })
        .await
        .unwrap();
        replies
            .message()
            .await
            .unwrap()
            .expect("one reply per request")
    };
    server.clock.advance(900);
    let renewed = send(Op::Renew(renew(&lease, 0))).await;
    assert_eq!(renewed.code, 0, "{renewed:?}");
    assert_eq!(renewed.lease.unwrap().expires_at_ms, T0 + 1900);
    let checked = send(Op::Check(check("k", lease.fence))).await;
    assert_eq!(checked.code, 0);
    assert!(checked.lease.unwrap().lease_id.is_empty());
    server.clock.advance(1000);
    let refused = send(Op::Renew(renew(&lease, 0))).await;
    assert_eq!(refused.code, Code::FailedPrecondition as i32);
    assert_eq!(refused.reason, "expired");
    assert!(refused.message.contains("expired"), "{}", refused.message);
    // The stream is still usable after a refusal, for every kind of operation.
    let refused = send(Op::Check(check("k", lease.fence))).await;
    assert_eq!(refused.code, Code::FailedPrecondition as i32);
    let acquired = send(Op::Acquire(acquire("k", "o2", 1000))).await;
    assert_eq!(acquired.code, 0, "{acquired:?}");
    assert_eq!(acquired.previous.unwrap().end, pb::TermEnd::Expired as i32);
    let second = acquired.lease.unwrap();
    assert!(second.fence > lease.fence);
    let busy = send(Op::Acquire(acquire("k", "o3", 1000))).await;
    assert_eq!(busy.code, Code::Aborted as i32);
    assert!(busy.message.contains("o2"), "{}", busy.message);
    let released = send(Op::Release(release(&second, true))).await;
    assert_eq!(released.code, 0);
    assert_eq!(released.ended.unwrap().end, pb::TermEnd::Suspended as i32);
    // Durable like the unary form: a restart keeps the release.
    drop(client);
    let server = server.restart().await;
    let mut client = server.client().await;
    let got = client
        .get(pb::GetRequest { key: "k".into() })
        .await
        .unwrap()
        .into_inner();
    assert!(got.recoverable);
    assert_eq!(got.last_ended.unwrap().fence, second.fence);
}

/// A key released cleanly is forgotten once the retention (24 h by default)
/// has passed: Get answers NOT_FOUND, its old fence is unknown, its row is
/// gone after a restart, and fences still never repeat. A suspended key is
/// kept, since it is recoverable.
#[tokio::test]
async fn released_keys_are_forgotten_after_the_retention() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let done = lease_of(client.acquire(acquire("done", "o", 1000)).await.unwrap());
    let paused = lease_of(client.acquire(acquire("paused", "o", 1000)).await.unwrap());
    client.release(release(&done, false)).await.unwrap();
    client.release(release(&paused, true)).await.unwrap();
    let get = async |client: &mut pb::leasehold_client::LeaseholdClient<_>, key: &str| {
        client.get(pb::GetRequest { key: key.into() }).await
    };
    server.clock.advance(24 * 60 * 60 * 1000 - 1);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        get(&mut client, "done").await.is_ok(),
        "kept until the retention ends"
    );
    server.clock.advance(1);
    let mut forgotten = false;
    for _ in 0..200 {
        if let Err(status) = get(&mut client, "done").await {
            assert_eq!(status.code(), Code::NotFound);
            forgotten = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(forgotten, "the released key was not forgotten");
    let stale = client.check(check("done", done.fence)).await.unwrap_err();
    assert_eq!(stale.code(), Code::FailedPrecondition);
    assert!(
        get(&mut client, "paused")
            .await
            .unwrap()
            .into_inner()
            .recoverable
    );

    drop(client);
    let server = server.restart().await;
    let mut client = server.client().await;
    let status = get(&mut client, "done").await.unwrap_err();
    assert_eq!(
        status.code(),
        Code::NotFound,
        "the row is gone from the file"
    );
    assert!(get(&mut client, "paused").await.is_ok());
    let again = lease_of(client.acquire(acquire("done", "o2", 1000)).await.unwrap());
    assert!(again.fence > paused.fence, "fences never repeat");
}
