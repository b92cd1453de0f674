//! The client's session guard over real gRPC on loopback: acquire, renewal,
//! the local deadline, loss, recovery after an outage, the gate and release.
//!
//! The servers run on a manual clock, so server-side expiry happens only when
//! a test advances it; the guards run on the real monotonic clock with short
//! TTLs.

mod common;

use std::time::Duration;

use common::client_support::{FreezingProxy, black_hole, eventually, within};
use common::{T0, TestServer};
use leasehold_client::{Client, ClientError, LossReason};
use leasehold_core::lease::TermEnd;
use leasehold_server::{limits::Limits, server};
use tokio::time::Instant;
use {leasehold_core::Error, leasehold_wire::pb};

const MS: Duration = Duration::from_millis(1);

async fn client_of(server: &TestServer) -> Client {
    Client::connect(format!("http://{}", server.addr))
        .await
        .expect("connect")
}

/// Makes the server end `key`'s term on its own clock and grants it to `owner`.
async fn take_over(server: &TestServer, key: &str, ttl: Duration, owner: &str) -> u64 {
    server.clock.advance(ttl.as_millis() as u64);
    let mut rpc = server.client().await;
    let lease = rpc
        .acquire(common::acquire(key, owner, 60_000))
        .await
        .expect("take over")
        .into_inner()
        .lease
        .unwrap();
    lease.fence
}

/// An acquire returns a valid guard with its fence, owner and a local deadline
/// of the TTL less the margin from the send.
#[tokio::test]
async fn acquire_returns_a_valid_guard() {
    let server = TestServer::start().await;
    let client = client_of(&server).await;
    let before = Instant::now();
    let guard = client
        .acquire("session:1")
        .owner("graph-a")
        .ttl(2000 * MS)
        .safety_margin(200 * MS)
        .await
        .unwrap();
    let after = Instant::now();
    assert_eq!(guard.key(), "session:1");
    assert_eq!(guard.owner(), "graph-a");
    assert!(guard.fence().0 >= 1);
    assert!(guard.is_valid());
    assert_eq!(guard.loss(), None);
    assert!(guard.previous().is_none());
    assert!(!guard.replayed());
    assert_eq!(guard.server_expires_at_ms(), T0 + 2000);
    assert!(guard.deadline() >= before + 1800 * MS && guard.deadline() <= after + 1800 * MS);
}

/// The guard renews in the background: its deadline moves on and the term
/// outlives its TTL on the server's clock.
#[tokio::test]
async fn the_guard_renews_in_the_background() {
    let server = TestServer::start().await;
    let client = client_of(&server).await;
    let guard = client.acquire("k").ttl(600 * MS).await.unwrap();
    for _ in 0..4 {
        let last = guard.deadline();
        eventually("a renewal moves the deadline", || guard.deadline() > last).await;
        // Half a TTL passes on the server between renewals.
        server.clock.advance(300);
    }
    // 1200 ms of server time have passed: the 600 ms term lives on.
    let mut rpc = server.client().await;
    let check = pb::CheckRequest {
        key: "k".into(),
        fence: guard.fence().0,
    };
    rpc.check(check).await.expect("still the live term");
    assert!(guard.server_expires_at_ms() > T0 + 600);
    assert!(guard.is_valid());
}

/// A held key is busy for others, and the error names the holder.
#[tokio::test]
async fn a_held_key_is_busy_with_the_holder_named() {
    let server = TestServer::start().await;
    let client = client_of(&server).await;
    let held = client.acquire("k").owner("graph-a").await.unwrap();
    let err = client.acquire("k").owner("graph-b").await.unwrap_err();
    match &err {
        ClientError::Server(Error::Busy { holder, fence, .. }) => {
            assert_eq!(holder, "graph-a");
            assert_eq!(*fence, held.fence());
        }
        other => panic!("expected busy, got {other:?}"),
    }
    assert_eq!(err.busy_holder(), Some("graph-a"));
    assert!(err.to_string().contains("graph-a"), "{err}");
}

/// A waiting acquire gets the key when the holder releases it, and learns how
/// the previous term ended.
#[tokio::test]
async fn a_waiting_acquire_gets_the_key_on_release() {
    let server = TestServer::start().await;
    let client = client_of(&server).await;
    let first = client.acquire("k").owner("graph-a").await.unwrap();
    let first_fence = first.fence();
    let waiter = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .acquire("k")
                .owner("graph-b")
                .wait(Duration::from_secs(5))
                .await
        }
    });
    tokio::time::sleep(50 * MS).await;
    let ended = first.release().await.unwrap();
    assert_eq!(ended.end, TermEnd::Released);
    let second = within("the waiter", waiter).await.unwrap().unwrap();
    assert!(second.fence() > first_fence);
    let previous = second.previous().expect("previous term");
    assert_eq!(previous.fence, first_fence);
    assert_eq!(previous.owner, "graph-a");
    assert_eq!(previous.end, TermEnd::Released);
    assert!(second.is_valid());
}

/// Repeating an acquire with the same request id replays the same term; the
/// replayed guard renews at once, so it has a deadline it can trust.
#[tokio::test]
async fn a_repeated_request_id_replays_the_term() {
    let server = TestServer::start().await;
    let client = client_of(&server).await;
    let first = client
        .acquire("k")
        .owner("graph-a")
        .request_id("turn-7")
        .await
        .unwrap();
    let again = client
        .acquire("k")
        .owner("graph-a")
        .request_id("turn-7")
        .await
        .unwrap();
    assert!(again.replayed());
    assert_eq!(again.fence(), first.fence());
    assert!(again.is_valid());
    first.release().await.unwrap();
    // The term is over for the replayed guard too.
    let err = again.verify().await.unwrap_err();
    assert!(matches!(err, ClientError::Lost { .. }), "{err:?}");
}

/// A replay of a caller-supplied request id may answer a grant made long ago
/// by another process: with every renewal refused (the server allows no
/// Session stream), the replayed guard is never valid. The same case as the
/// Python (test_sync.py, test_async.py) and TypeScript (replay.test.ts)
/// clients' tests.
#[tokio::test]
async fn a_replay_of_a_supplied_request_id_trusts_nothing_until_a_renewal() {
    let options = server::ServeOptions {
        limits: Limits {
            streams_per_connection: 0,
            ..Limits::default()
        },
        ..common::test_options()
    };
    let server = TestServer::builder().options(options).start().await;
    let worker = client_of(&server).await;
    let first = worker
        .acquire("k")
        .owner("graph-a")
        .ttl(3000 * MS)
        .request_id("R1")
        .await
        .unwrap();
    let late = client_of(&server).await;
    match late
        .acquire("k")
        .owner("graph-a")
        .ttl(3000 * MS)
        .request_id("R1")
        .await
    {
        Ok(again) => {
            assert!(again.replayed());
            assert_eq!(again.fence(), first.fence());
            assert!(
                !again.is_valid(),
                "a replayed grant of unknown age was trusted"
            );
        }
        Err(err) => assert!(err.is_transient(), "{err:?}"),
    }
}

/// Release ends the term as finished; suspend ends it as unfinished, so the
/// key is recoverable.
#[tokio::test]
async fn release_and_suspend_end_the_term() {
    let server = TestServer::start().await;
    let client = client_of(&server).await;
    let guard = client.acquire("done").await.unwrap();
    let fence = guard.fence();
    let ended = guard.release().await.unwrap();
    assert_eq!((ended.fence, ended.end), (fence, TermEnd::Released));

    let guard = client.acquire("unfinished").await.unwrap();
    let ended = guard.suspend().await.unwrap();
    assert_eq!(ended.end, TermEnd::Suspended);
    let mut rpc = server.client().await;
    let got = rpc
        .get(pb::GetRequest {
            key: "unfinished".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(got.lease.is_none());
    assert!(got.recoverable);
}

/// Dropping a guard stops renewal and suspends the term in the background.
#[tokio::test]
async fn dropping_a_guard_suspends_its_term() {
    let server = TestServer::start().await;
    let client = client_of(&server).await;
    let guard = client.acquire("k").owner("graph-a").await.unwrap();
    let fence = guard.fence().0;
    drop(guard);
    let mut rpc = server.client().await;
    let mut ended = None;
    within("the background suspension", async {
        while ended.is_none() {
            let got = rpc
                .get(pb::GetRequest { key: "k".into() })
                .await
                .unwrap()
                .into_inner();
            if got.lease.is_none() {
                ended = got.last_ended;
            } else {
                tokio::time::sleep(5 * MS).await;
            }
        }
    })
    .await;
    let ended = ended.unwrap();
    assert_eq!(ended.fence, fence);
    assert_eq!(ended.end, pb::TermEnd::Suspended as i32);
}

/// The gate passes with the fence while the term is live; once another holder
/// took over, it fails as lost for good, and so does everything after.
#[tokio::test]
async fn the_gate_fails_for_good_once_the_term_is_superseded() {
    let server = TestServer::start().await;
    let client = client_of(&server).await;
    // Renewing rarely, so the gate (not a renewal) is what finds out.
    let guard = client
        .acquire("k")
        .ttl(Duration::from_secs(10))
        .renew_every(Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(guard.gate().await.unwrap(), guard.fence());
    guard.verify().await.unwrap();
    let newer = take_over(&server, "k", guard.ttl(), "graph-b").await;
    // Locally nothing has changed yet: the server's clock ran ahead.
    assert!(guard.is_valid());
    let err = guard.gate().await.unwrap_err();
    // The server says the old term expired (on its clock) and was followed.
    match &err {
        ClientError::Lost {
            reason: LossReason::Refused(Error::StaleFence { fence, .. }),
            ..
        } => assert_eq!(*fence, guard.fence()),
        other => panic!("expected lost (stale fence), got {other:?}"),
    }
    assert!(newer > guard.fence().0);
    assert!(!err.is_transient());
    assert!(!guard.is_valid());
    assert!(matches!(
        within("lost()", guard.lost()).await,
        LossReason::Refused(_)
    ));
    assert!(matches!(
        guard.verify().await,
        Err(ClientError::Lost { .. })
    ));
    assert!(matches!(
        guard.release().await,
        Err(ClientError::Lost { .. })
    ));
}

/// A renewal refused with FAILED_PRECONDITION makes the guard lost for good:
/// `lost()` resolves without any call from the holder, and it stays lost.
#[tokio::test]
async fn a_refused_renewal_is_final_and_resolves_lost() {
    let server = TestServer::start().await;
    let client = client_of(&server).await;
    let guard = client.acquire("k").ttl(900 * MS).await.unwrap();
    let lost = guard.lost();
    take_over(&server, "k", guard.ttl(), "graph-b").await;
    let reason = within("lost()", lost).await;
    assert!(
        matches!(reason, LossReason::Refused(Error::StaleFence { .. })),
        "{reason:?}"
    );
    assert!(reason.is_final());
    // Well past the old local deadline: still lost, never revived.
    tokio::time::sleep(300 * MS).await;
    assert!(!guard.is_valid());
    assert_eq!(guard.loss(), Some(reason));
}

/// While the server is down the guard becomes invalid at its local deadline,
/// without any round trip; after a restart a renewal succeeds with the same
/// fence and the guard is valid again.
#[tokio::test]
async fn the_guard_recovers_after_a_server_restart() {
    let mut server = TestServer::start().await;
    let client = Client::connect(server.url()).await.unwrap();
    let guard = client
        .acquire("k")
        .ttl(300 * MS)
        .safety_margin(30 * MS)
        .await
        .unwrap();
    let fence = guard.fence();
    server.stop().await;
    let down_at = Instant::now();
    assert_eq!(
        within("lost()", guard.lost()).await,
        LossReason::DeadlinePassed
    );
    // The deadline rests on the last renewal sent before the server went down.
    assert!(guard.deadline() <= down_at + 270 * MS);
    assert!(Instant::now() >= guard.deadline());
    assert!(!guard.is_valid());
    assert_eq!(guard.loss(), Some(LossReason::DeadlinePassed));
    let err = guard.gate().await.unwrap_err();
    assert!(err.is_transient(), "{err:?}");

    server.start_again().await;
    eventually("a renewal revives the guard", || guard.is_valid()).await;
    assert_eq!(guard.fence(), fence);
    assert_eq!(guard.gate().await.unwrap(), fence);
    guard.release().await.unwrap();
}

/// A server that accepts connections but never answers cannot hang the
/// guard: calls time out, and the local deadline still passes.
#[tokio::test]
async fn a_hung_server_cannot_hang_the_guard() {
    let mut server = TestServer::start().await;
    let client = Client::connect(server.url()).await.unwrap();
    let guard = client
        .acquire("k")
        .ttl(300 * MS)
        .rpc_timeout(100 * MS)
        .await
        .unwrap();
    server.stop().await;
    let hole = black_hole(server.addr).await;
    let started = Instant::now();
    let err = guard.verify().await.unwrap_err();
    assert!(
        matches!(&err, ClientError::Server(Error::Unavailable(_))),
        "{err:?}"
    );
    assert!(
        started.elapsed() < 2 * guard.ttl(),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        within("lost()", guard.lost()).await,
        LossReason::DeadlinePassed
    );
    hole.abort();
    let _ = hole.await;
    server.start_again().await;
    eventually("a renewal revives the guard", || guard.is_valid()).await;
}

/// A connection that goes silent (a partition or a dead peer: no FIN, no
/// RST) is found dead by HTTP/2 keep-alive pings, and the guard carries on
/// over a new connection and a new Session stream instead of staying stuck
/// on the dead one until TCP gives up (many minutes).
#[tokio::test]
async fn a_silently_dead_connection_is_replaced() {
    let server = TestServer::start().await;
    let proxy = FreezingProxy::start(server.addr).await;
    let channel = tonic::transport::Endpoint::from_shared(proxy.url())
        .unwrap()
        .http2_keep_alive_interval(100 * MS)
        .keep_alive_timeout(200 * MS)
        .keep_alive_while_idle(true)
        .connect()
        .await
        .unwrap();
    let client = Client::new(channel);
    let guard = client
        .acquire("k")
        .ttl(Duration::from_secs(30))
        .rpc_timeout(200 * MS)
        .await
        .unwrap();
    guard.verify().await.unwrap();
    assert_eq!(proxy.accepted(), 1);
    proxy.freeze();
    within("a check over a new connection", async {
        while guard.verify().await.is_err() {
            tokio::time::sleep(20 * MS).await;
        }
    })
    .await;
    assert!(proxy.accepted() >= 2, "no new connection was made");
    assert!(guard.is_valid());
    let ended = within("release", guard.release()).await.unwrap();
    assert_eq!(ended.end, TermEnd::Released);
}

/// `run` hands the fence to the work and returns its output while the lease
/// holds, and cancels the work when the lease is lost.
#[tokio::test]
async fn run_cancels_work_when_the_lease_is_lost() {
    let server = TestServer::start().await;
    let client = client_of(&server).await;
    let guard = client.acquire("k").ttl(900 * MS).await.unwrap();
    let fence = guard.run(|fence| async move { fence }).await.unwrap();
    assert_eq!(fence, guard.fence());

    let work = guard.run(|_| std::future::pending::<()>());
    let takeover = async {
        tokio::time::sleep(20 * MS).await;
        take_over(&server, "k", guard.ttl(), "graph-b").await
    };
    let (outcome, _) = within("run to give up", async { tokio::join!(work, takeover) }).await;
    assert!(
        matches!(outcome, Err(ClientError::Lost { .. })),
        "{outcome:?}"
    );
}

/// Bad input is refused as invalid: timing on the client, TTL bounds on the server.
#[tokio::test]
async fn invalid_input_is_refused() {
    let server = TestServer::start().await;
    let client = client_of(&server).await;
    let err = client
        .acquire("k")
        .ttl(300 * MS)
        .safety_margin(300 * MS)
        .await
        .unwrap_err();
    assert!(
        matches!(err, ClientError::Server(Error::InvalidArgument(_))),
        "{err:?}"
    );
    let err = client.acquire("k").ttl(50 * MS).await.unwrap_err();
    assert!(
        matches!(err, ClientError::Server(Error::InvalidArgument(_))),
        "{err:?}"
    );
    let err = client.acquire("").await.unwrap_err();
    assert!(
        matches!(err, ClientError::Server(Error::InvalidArgument(_))),
        "{err:?}"
    );
}

/// Connecting where nothing listens is a clean "unavailable", not a hang.
#[tokio::test]
async fn connecting_to_nothing_is_unavailable() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let err = within("connect", Client::connect(addr.to_string()))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ClientError::Server(Error::Unavailable(_))),
        "{err:?}"
    );
    assert!(err.is_transient());
}

/// A waiter whose client vanished without closing its connection loses its
/// place in line once the server's pings go unanswered, so the key goes to
/// the live waiter behind it instead of to a grant nobody will use.
#[tokio::test]
async fn a_vanished_waiter_does_not_keep_its_place_in_line() {
    let server = TestServer::builder()
        .options(leasehold_server::server::ServeOptions {
            drain_timeout: 300 * MS,
            keep_alive_interval: 200 * MS,
            keep_alive_timeout: 1000 * MS,
            ..leasehold_server::server::ServeOptions::default()
        })
        .start()
        .await;
    let holder = client_of(&server).await;
    let held = holder
        .acquire("k")
        .ttl(Duration::from_secs(60))
        .await
        .unwrap();

    // The vanishing waiter queues first, through a proxy that will go silent.
    let proxy = FreezingProxy::start(server.addr).await;
    let mut vanishing = pb::leasehold_client::LeaseholdClient::connect(proxy.url())
        .await
        .unwrap();
    let mut request = common::acquire("k", "vanishing", 60_000);
    request.wait_ms = 60_000;
    let vanished = tokio::spawn(async move { vanishing.acquire(request).await });
    eventually("the first waiter is in line", || proxy.accepted() == 1).await;
    tokio::time::sleep(100 * MS).await;

    // The live waiter queues behind it.
    let live = client_of(&server).await;
    let waiting = tokio::spawn(async move {
        live.acquire("k")
            .owner("live")
            .ttl(Duration::from_secs(60))
            .wait(Duration::from_secs(60))
            .await
    });
    tokio::time::sleep(100 * MS).await;
    proxy.freeze();
    // Long enough for the server to find the silent connection dead (a ping
    // and its timeout, about 1.2 s), with room for a slow machine.
    tokio::time::sleep(3000 * MS).await;
    held.release().await.unwrap();

    let got = within("the live waiter's grant", waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.owner(), "live");
    vanished.abort();
}

/// An address on loopback where nothing listens (connections are refused).
async fn dead_endpoint() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}")
}

/// A client given several endpoints starts on the first that answers and
/// guards work through it; the dead one is kept for later failovers.
#[tokio::test]
async fn connect_any_starts_on_the_first_endpoint_that_answers() {
    let server = TestServer::start().await;
    let dead = dead_endpoint().await;
    let live = format!("http://{}", server.addr);
    let client = Client::connect_any([dead.clone(), live.clone()])
        .await
        .expect("one endpoint answers");
    assert_eq!(client.current_endpoint(), live);
    assert_eq!(client.endpoints(), [dead, live]);
    let guard = client
        .acquire("any")
        .ttl(Duration::from_secs(5))
        .await
        .expect("acquire");
    guard.gate().await.expect("gate");
    guard.release().await.expect("release");
}

/// When no endpoint answers, connecting fails UNAVAILABLE naming each; an
/// empty list is a usage error.
#[tokio::test]
async fn connect_any_without_a_live_endpoint_fails() {
    let (one, two) = (dead_endpoint().await, dead_endpoint().await);
    let err = Client::connect_any([one.clone(), two.clone()])
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ClientError::Server(Error::Unavailable(_))),
        "{err}"
    );
    let text = err.to_string();
    assert!(text.contains(&one) && text.contains(&two), "{text}");
    let err = Client::connect_any(Vec::<String>::new()).await.unwrap_err();
    assert!(
        matches!(err, ClientError::Server(Error::InvalidArgument(_))),
        "{err}"
    );
}

/// A server that stops makes the client move to the next endpoint: the
/// call that met the stopped server is resent there (a Get is safe to send
/// twice), and later calls start there.
#[tokio::test]
async fn calls_fail_over_when_a_server_stops() {
    let mut first = TestServer::start().await;
    let second = TestServer::start().await;
    // Only the second server knows the key, so the answer says who replied.
    second
        .client()
        .await
        .acquire(common::acquire("only-on-second", "b", 60_000))
        .await
        .unwrap();
    let (one, two) = (first.url(), second.url());
    let client = Client::connect_any([one.clone(), two.clone()])
        .await
        .unwrap();
    let key = leasehold_client::Key::parse("only-on-second").unwrap();
    let err = client.get(&key).await.unwrap_err();
    assert!(
        matches!(err, ClientError::Server(Error::NotFound(_))),
        "a refusal is an answer, not a reason to fail over: {err}"
    );
    assert_eq!(client.current_endpoint(), one);

    first.stop().await;
    let state = client.get(&key).await.expect("answered by the second");
    assert_eq!(state.lease.unwrap().owner.as_str(), "b");
    assert_eq!(client.current_endpoint(), two);
}
