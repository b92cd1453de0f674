//! The lease API over real gRPC on loopback, on a real SQLite file, with a manual clock.

mod common;

use std::time::Duration;

use common::{T0, TestServer, acquire, lease_of};
use leasehold_wire::pb;
use tonic::Code;

fn release(lease: &pb::Lease, suspend: bool) -> pb::ReleaseRequest {
    pb::ReleaseRequest {
        key: lease.key.clone(),
        fence: lease.fence,
        lease_id: lease.lease_id.clone(),
        suspend,
        ..Default::default()
    }
}

fn renew(lease: &pb::Lease, ttl_ms: u64) -> pb::RenewRequest {
    pb::RenewRequest {
        key: lease.key.clone(),
        fence: lease.fence,
        lease_id: lease.lease_id.clone(),
        ttl_ms,
    }
}

fn check(key: &str, fence: u64) -> pb::CheckRequest {
    pb::CheckRequest {
        key: key.into(),
        fence,
    }
}

/// A grant carries the key, a fence, the owner, a UUID lease id and server times.
#[tokio::test]
async fn acquire_grants_a_fenced_lease() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let lease = lease_of(
        client
            .acquire(acquire("session:1", "graph-a", 5000))
            .await
            .unwrap(),
    );
    assert_eq!(lease.key, "session:1");
    assert_eq!(lease.owner, "graph-a");
    assert_eq!(lease.ttl_ms, 5000);
    assert_eq!(lease.acquired_at_ms, T0);
    assert_eq!(lease.expires_at_ms, T0 + 5000);
    assert!(lease.fence >= 1);
    assert!(uuid::Uuid::parse_str(&lease.lease_id).is_ok());
}

/// Fences strictly increase with every grant, across keys.
#[tokio::test]
async fn fences_strictly_increase_across_keys() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let mut last = 0;
    for i in 0..20 {
        let key = format!("k{}", i % 3);
        let lease = lease_of(client.acquire(acquire(&key, "o", 1000)).await.unwrap());
        assert!(lease.fence > last, "fence {} after {last}", lease.fence);
        last = lease.fence;
        client.release(release(&lease, false)).await.unwrap();
    }
}

/// A held key is ABORTED for others, naming the holder and the time left.
#[tokio::test]
async fn a_held_key_is_busy_with_holder_and_time_left() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    client.acquire(acquire("k", "graph-a", 5000)).await.unwrap();
    server.clock.advance(1500);
    let status = client
        .acquire(acquire("k", "graph-b", 5000))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Aborted);
    assert!(status.message().contains("graph-a"), "{}", status.message());
    assert!(status.message().contains("3500 ms"), "{}", status.message());
}

/// Malformed input is INVALID_ARGUMENT, never INTERNAL.
#[tokio::test]
async fn malformed_input_is_invalid_argument() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let long_key = "k".repeat(1025);
    let long_owner = "o".repeat(257);
    let cases = vec![
        acquire("", "o", 1000),
        acquire(&long_key, "o", 1000),
        acquire("bad\nkey", "o", 1000),
        acquire("bad\u{0}key", "o", 1000),
        acquire("k", "", 1000),
        acquire("k", &long_owner, 1000),
        acquire("k", "o", 99),
        acquire("k", "o", 0),
        acquire("k", "o", 24 * 3600 * 1000 + 1),
        pb::AcquireRequest {
            wait_ms: 5 * 60 * 1000 + 1,
            ..acquire("k", "o", 1000)
        },
    ];
    for case in cases {
        let status = client.acquire(case.clone()).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{case:?}: {status:?}");
    }
    // The bounds themselves are allowed.
    client.acquire(acquire("min", "o", 100)).await.unwrap();
    client
        .acquire(acquire("max", "o", 24 * 3600 * 1000))
        .await
        .unwrap();
    let lease = lease_of(client.acquire(acquire("k", "o", 1000)).await.unwrap());
    let bad_id = pb::RenewRequest {
        lease_id: "not-a-uuid".into(),
        ..renew(&lease, 0)
    };
    assert_eq!(
        client.renew(bad_id).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    let bad_ttl = renew(&lease, 50);
    assert_eq!(
        client.renew(bad_ttl).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    let bad_page = pb::ListRequest {
        page_token: "zz".into(),
        ..Default::default()
    };
    assert_eq!(
        client.list(bad_page).await.unwrap_err().code(),
        Code::InvalidArgument
    );
}

/// Renew extends the live term; ttl 0 keeps the old TTL.
#[tokio::test]
async fn renew_extends_the_live_term() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let lease = lease_of(client.acquire(acquire("k", "o", 1000)).await.unwrap());
    server.clock.advance(900);
    let renewed = client
        .renew(renew(&lease, 0))
        .await
        .unwrap()
        .into_inner()
        .lease
        .unwrap();
    assert_eq!(renewed.expires_at_ms, T0 + 1900);
    assert_eq!(renewed.fence, lease.fence);
    assert_eq!(renewed.lease_id, lease.lease_id);
    server.clock.advance(900);
    let renewed = client
        .renew(renew(&lease, 5000))
        .await
        .unwrap()
        .into_inner()
        .lease
        .unwrap();
    assert_eq!(renewed.ttl_ms, 5000);
    assert_eq!(renewed.expires_at_ms, T0 + 1800 + 5000);
    // Still held by us after the original TTL would have run out.
    server.clock.advance(2000);
    client.check(check("k", lease.fence)).await.unwrap();
}

/// Renew with a shorter TTL never makes the term end sooner than acknowledged.
#[tokio::test]
async fn renew_never_shortens_an_acknowledged_term() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let lease = lease_of(client.acquire(acquire("k", "o", 10_000)).await.unwrap());
    let renewed = client
        .renew(renew(&lease, 100))
        .await
        .unwrap()
        .into_inner()
        .lease
        .unwrap();
    assert_eq!(renewed.expires_at_ms, T0 + 10_000);
}

/// A right fence with a wrong lease id is PERMISSION_DENIED for renew and release.
#[tokio::test]
async fn wrong_lease_id_is_permission_denied() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let lease = lease_of(client.acquire(acquire("k", "o", 1000)).await.unwrap());
    let forged = uuid::Uuid::new_v4().to_string();
    let status = client
        .renew(pb::RenewRequest {
            lease_id: forged.clone(),
            ..renew(&lease, 0)
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    let status = client
        .release(pb::ReleaseRequest {
            lease_id: forged,
            ..release(&lease, false)
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    // The term is untouched.
    client.check(check("k", lease.fence)).await.unwrap();
}

/// After expiry, the old fence is refused by renew, release and check, saying it expired.
#[tokio::test]
async fn an_expired_fence_is_refused_everywhere() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let lease = lease_of(client.acquire(acquire("k", "o", 1000)).await.unwrap());
    server.clock.advance(999);
    client.check(check("k", lease.fence)).await.unwrap();
    server.clock.advance(1);
    for status in [
        client.renew(renew(&lease, 0)).await.unwrap_err(),
        client.release(release(&lease, false)).await.unwrap_err(),
        client.check(check("k", lease.fence)).await.unwrap_err(),
    ] {
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert!(status.message().contains("expired"), "{}", status.message());
    }
}

/// A released fence is refused, and one superseded by a newer grant says so.
#[tokio::test]
async fn released_and_superseded_fences_are_refused() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let first = lease_of(client.acquire(acquire("k", "a", 1000)).await.unwrap());
    client.release(release(&first, false)).await.unwrap();
    let status = client.check(check("k", first.fence)).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(
        status.message().contains("released"),
        "{}",
        status.message()
    );
    let status = client.renew(renew(&first, 0)).await.unwrap_err();
    assert!(
        status.message().contains("released"),
        "{}",
        status.message()
    );

    let second = lease_of(client.acquire(acquire("k", "b", 1000)).await.unwrap());
    client.release(release(&second, true)).await.unwrap();
    let third = lease_of(client.acquire(acquire("k", "c", 1000)).await.unwrap());
    let status = client.check(check("k", first.fence)).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(
        status
            .message()
            .contains(&format!("superseded by fence {}", third.fence)),
        "{}",
        status.message()
    );
    // A stale release cannot clear the newer holder's claim.
    let status = client.release(release(&first, false)).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    client.check(check("k", third.fence)).await.unwrap();
    // A fence never issued for this key is refused too.
    let status = client
        .check(check("k", third.fence + 100))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    let status = client.check(check("never-held", 1)).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
}

/// Releasing twice with the same fence is a no-op success that reports the first end.
#[tokio::test]
async fn a_retried_release_succeeds_again() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let lease = lease_of(client.acquire(acquire("k", "o", 1000)).await.unwrap());
    let first = client
        .release(release(&lease, true))
        .await
        .unwrap()
        .into_inner();
    server.clock.advance(10);
    let again = client
        .release(release(&lease, false))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first, again);
    assert_eq!(again.ended.unwrap().end, pb::TermEnd::Suspended as i32);
}

/// Get shows the live lease without its lease id; unknown keys are NOT_FOUND.
#[tokio::test]
async fn get_hides_the_lease_id_and_reports_not_found() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let lease = lease_of(client.acquire(acquire("k", "o", 1000)).await.unwrap());
    let got = client
        .get(pb::GetRequest { key: "k".into() })
        .await
        .unwrap()
        .into_inner();
    let live = got.lease.unwrap();
    assert_eq!(live.fence, lease.fence);
    assert!(live.lease_id.is_empty());
    assert!(!got.recoverable);
    let checked = client
        .check(check("k", lease.fence))
        .await
        .unwrap()
        .into_inner();
    assert!(checked.lease.unwrap().lease_id.is_empty());
    let status = client
        .get(pb::GetRequest { key: "nope".into() })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
}

/// The same owner and request id while the term is live gets the same lease back.
#[tokio::test]
async fn a_retried_acquire_returns_the_same_lease() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let req = pb::AcquireRequest {
        request_id: "req-1".into(),
        ..acquire("k", "graph-a", 1000)
    };
    let first = client.acquire(req.clone()).await.unwrap().into_inner();
    let retry = client.acquire(req.clone()).await.unwrap().into_inner();
    assert!(retry.replayed);
    assert_eq!(first.lease, retry.lease);
    // Another owner with the same request id is still refused.
    let other = pb::AcquireRequest {
        owner: "graph-b".into(),
        ..req.clone()
    };
    assert_eq!(
        client.acquire(other).await.unwrap_err().code(),
        Code::Aborted
    );
    // Once the term ended, the same request id starts a new term.
    client
        .release(release(first.lease.as_ref().unwrap(), false))
        .await
        .unwrap();
    let fresh = client.acquire(req).await.unwrap().into_inner();
    assert!(!fresh.replayed);
    assert!(fresh.lease.unwrap().fence > first.lease.unwrap().fence);
}

/// Expiry follows the server's clock exactly, and `previous` tells how the last term ended.
#[tokio::test]
async fn an_expired_key_is_free_and_previous_says_expired() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let old = lease_of(client.acquire(acquire("k", "graph-a", 1000)).await.unwrap());
    server.clock.advance(999);
    assert_eq!(
        client
            .acquire(acquire("k", "graph-b", 1000))
            .await
            .unwrap_err()
            .code(),
        Code::Aborted
    );
    server.clock.advance(1);
    let reply = client
        .acquire(acquire("k", "graph-b", 1000))
        .await
        .unwrap()
        .into_inner();
    let previous = reply.previous.unwrap();
    assert_eq!(previous.fence, old.fence);
    assert_eq!(previous.owner, "graph-a");
    assert_eq!(previous.end, pb::TermEnd::Expired as i32);
    assert_eq!(previous.ended_at_ms, T0 + 1000);
    assert!(reply.lease.unwrap().fence > old.fence);
}

/// Waiters are served first come, first served when the key is released.
#[tokio::test]
async fn waiters_are_served_in_arrival_order() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let held = lease_of(
        client
            .acquire(acquire("k", "holder", 60_000))
            .await
            .unwrap(),
    );
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for name in ["w1", "w2", "w3"] {
        let mut waiter = server.client().await;
        let tx = tx.clone();
        tokio::spawn(async move {
            let req = pb::AcquireRequest {
                wait_ms: 60_000,
                ..acquire("k", name, 60_000)
            };
            let lease = lease_of(waiter.acquire(req).await.unwrap());
            tx.send(lease).unwrap();
        });
        // Let this waiter reach the queue before the next one starts.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut previous = held;
    for expected in ["w1", "w2", "w3"] {
        client.release(release(&previous, false)).await.unwrap();
        let lease = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("a waiter was woken")
            .unwrap();
        assert_eq!(lease.owner, expected);
        assert!(lease.fence > previous.fence);
        previous = lease;
    }
}

/// A waiter is woken when the holder's lease expires, by the server's timer.
#[tokio::test]
async fn a_waiter_gets_the_key_when_the_lease_expires() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let held = lease_of(client.acquire(acquire("k", "holder", 1000)).await.unwrap());
    let mut waiter = server.client().await;
    let waiting = tokio::spawn(async move {
        let req = pb::AcquireRequest {
            wait_ms: 10_000,
            ..acquire("k", "waiter", 1000)
        };
        waiter.acquire(req).await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished());
    server.clock.advance(1000);
    let reply = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("woken by expiry")
        .unwrap()
        .unwrap()
        .into_inner();
    assert_eq!(reply.lease.unwrap().owner, "waiter");
    assert_eq!(reply.previous.unwrap().fence, held.fence);
}

/// A wait that runs out is ABORTED with the holder named.
#[tokio::test]
async fn a_wait_that_runs_out_is_aborted() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    client
        .acquire(acquire("k", "holder", 60_000))
        .await
        .unwrap();
    let mut waiter = server.client().await;
    let waiting = tokio::spawn(async move {
        let req = pb::AcquireRequest {
            wait_ms: 500,
            ..acquire("k", "waiter", 1000)
        };
        waiter.acquire(req).await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.clock.advance(500);
    let status = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("wait ended")
        .unwrap()
        .unwrap_err();
    assert_eq!(status.code(), Code::Aborted);
    assert!(status.message().contains("holder"), "{}", status.message());
}

/// Suspended and expired keys are recoverable; released ones are not; acquiring clears it.
#[tokio::test]
async fn recoverable_keys_are_listed_until_someone_acquires_them() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let done = lease_of(client.acquire(acquire("s/done", "o", 1000)).await.unwrap());
    let paused = lease_of(
        client
            .acquire(acquire("s/paused", "o", 1000))
            .await
            .unwrap(),
    );
    client
        .acquire(acquire("s/crashed", "o", 500))
        .await
        .unwrap();
    client
        .acquire(acquire("s/live", "o", 60_000))
        .await
        .unwrap();
    client.release(release(&done, false)).await.unwrap();
    client.release(release(&paused, true)).await.unwrap();
    server.clock.advance(500);

    let list = |filter: pb::ListFilter| pb::ListRequest {
        prefix: "s/".into(),
        filter: filter as i32,
        page_size: 100,
        page_token: String::new(),
    };
    let keys = |reply: pb::ListResponse| reply.keys.into_iter().map(|k| k.key).collect::<Vec<_>>();
    let recoverable = client
        .list(list(pb::ListFilter::Recoverable))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(keys(recoverable), ["s/crashed", "s/paused"]);
    let live = client
        .list(list(pb::ListFilter::Live))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(keys(live), ["s/live"]);
    let all = client
        .list(list(pb::ListFilter::All))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(keys(all), ["s/crashed", "s/done", "s/live", "s/paused"]);

    let got = client
        .get(pb::GetRequest {
            key: "s/paused".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(got.recoverable);
    assert_eq!(got.last_ended.unwrap().end, pb::TermEnd::Suspended as i32);

    // A recoverer takes over; `previous` says what it recovers from.
    let reply = client
        .acquire(acquire("s/crashed", "recoverer", 1000))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.previous.unwrap().end, pb::TermEnd::Expired as i32);
    // Exactly one recoverer wins.
    assert_eq!(
        client
            .acquire(acquire("s/crashed", "recoverer-2", 1000))
            .await
            .unwrap_err()
            .code(),
        Code::Aborted
    );
    let recoverable = client
        .list(list(pb::ListFilter::Recoverable))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(keys(recoverable), ["s/paused"]);
}

/// List pages through keys in order, honours the prefix, and ends with an empty token.
#[tokio::test]
async fn list_pages_in_key_order() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    for i in (0..25).rev() {
        client
            .acquire(acquire(&format!("p/{i:02}"), "o", 60_000))
            .await
            .unwrap();
    }
    client
        .acquire(acquire("q/other", "o", 60_000))
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut token = String::new();
    for _ in 0..10 {
        let page = client
            .list(pb::ListRequest {
                prefix: "p/".into(),
                filter: pb::ListFilter::All as i32,
                page_size: 10,
                page_token: token.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.keys.len() <= 10);
        seen.extend(page.keys.into_iter().map(|k| k.key));
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    let expected: Vec<String> = (0..25).map(|i| format!("p/{i:02}")).collect();
    assert_eq!(seen, expected);
    let too_big = pb::ListRequest {
        page_size: 1001,
        ..Default::default()
    };
    assert_eq!(
        client.list(too_big).await.unwrap_err().code(),
        Code::InvalidArgument
    );
}

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
