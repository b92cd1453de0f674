//! The ownership lifecycle over real gRPC on a real SQLite file, with a
//! manual clock: lock-delay, handoff to a named successor, term history and
//! quarantine (docs/lifecycle.md), through the raw API and the Rust client.

mod common;

use std::time::Duration;

use common::{T0, TestServer, acquire, lease_of};
use leasehold_client::{Client, ClientError, Error, Held, ListFilter, TermEnd};
use leasehold_core::lease::Key;
use leasehold_wire::pb;
use tonic::Code;

fn release_to(lease: &pb::Lease, suspend: bool, successor: &str, ms: u64) -> pb::ReleaseRequest {
    pb::ReleaseRequest {
        key: lease.key.clone(),
        fence: lease.fence,
        lease_id: lease.lease_id.clone(),
        suspend,
        successor: successor.into(),
        handoff_ms: ms,
    }
}

fn reason(status: &tonic::Status) -> &str {
    status
        .metadata()
        .get("leasehold-reason")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

fn with_delay(key: &str, owner: &str, ttl_ms: u64, lock_delay_ms: u64) -> pb::AcquireRequest {
    pb::AcquireRequest {
        lock_delay_ms,
        ..acquire(key, owner, ttl_ms)
    }
}

fn limited(key: &str, owner: &str, ttl_ms: u64, max_recoveries: u32) -> pb::AcquireRequest {
    pb::AcquireRequest {
        max_recoveries,
        ..acquire(key, owner, ttl_ms)
    }
}

/// After an expiry the key stays untakeable for the lock-delay (ABORTED,
/// reason lock_delay, with the time left); a clean release skips it.
#[tokio::test]
async fn lock_delay_holds_after_expiry_and_not_after_release() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let held = lease_of(
        client
            .acquire(with_delay("k", "a", 1000, 500))
            .await
            .unwrap(),
    );
    server.clock.advance(1200);
    let refused = client.acquire(acquire("k", "b", 1000)).await.unwrap_err();
    assert_eq!(refused.code(), Code::Aborted);
    assert_eq!(reason(&refused), "lock_delay");
    assert!(refused.message().contains("lock-delay"), "{refused:?}");
    assert_eq!(
        refused.metadata().get("leasehold-remaining-ms").unwrap(),
        "300"
    );
    let got = client
        .get(pb::GetRequest { key: "k".into() })
        .await
        .unwrap()
        .into_inner();
    let reservation = got.reservation.expect("reserved");
    assert_eq!(reservation.kind, pb::reservation::Kind::LockDelay as i32);
    assert_eq!(reservation.after_fence, held.fence);
    assert_eq!(reservation.until_ms, T0 + 1500);
    server.clock.advance(300);
    let next = lease_of(client.acquire(acquire("k", "b", 1000)).await.unwrap());
    assert!(next.fence > held.fence);

    // Released cleanly: the next holder starts at once.
    let r = lease_of(
        client
            .acquire(with_delay("r", "a", 1000, 500))
            .await
            .unwrap(),
    );
    client.release(release_to(&r, false, "", 0)).await.unwrap();
    client.acquire(acquire("r", "b", 1000)).await.unwrap();
}

/// A waiter keeps its place through a lock-delay and gets the key when the
/// delay ends, not when the term expires.
#[tokio::test]
async fn a_waiter_keeps_its_place_through_a_lock_delay() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    client
        .acquire(with_delay("k", "a", 1000, 500))
        .await
        .unwrap();
    let mut waiter = server.client().await;
    let waiting = tokio::spawn(async move {
        let req = pb::AcquireRequest {
            wait_ms: 60_000,
            ..acquire("k", "w", 1000)
        };
        waiter.acquire(req).await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.clock.advance(1000);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished(), "granted during the lock-delay");
    server.clock.advance(500);
    let reply = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("woken when the delay ends")
        .unwrap()
        .unwrap()
        .into_inner();
    let lease = reply.lease.unwrap();
    assert_eq!(lease.owner, "w");
    assert_eq!(lease.acquired_at_ms, T0 + 1500);
    assert_eq!(reply.previous.unwrap().end, pb::TermEnd::Expired as i32);
}

/// A release naming a successor keeps the key for it, ahead of a waiter;
/// others are told whom it is kept for; the successor's grant says
/// handed_off; the waiter gets the key after the successor.
#[tokio::test]
async fn a_handoff_goes_to_the_named_successor_ahead_of_a_waiter() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let held = lease_of(client.acquire(acquire("s", "worker", 5000)).await.unwrap());
    let mut waiter = server.client().await;
    let waiting = tokio::spawn(async move {
        let req = pb::AcquireRequest {
            wait_ms: 60_000,
            ..acquire("s", "w", 5000)
        };
        waiter.acquire(req).await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    client
        .release(release_to(&held, true, "ui", 10_000))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiting.is_finished(),
        "the waiter went before the successor"
    );

    let refused = client.acquire(acquire("s", "x", 5000)).await.unwrap_err();
    assert_eq!(refused.code(), Code::Aborted);
    assert_eq!(reason(&refused), "handoff");
    assert!(refused.message().contains("\"ui\""), "{refused:?}");

    let ui = client
        .acquire(acquire("s", "ui", 5000))
        .await
        .unwrap()
        .into_inner();
    let previous = ui.previous.unwrap();
    assert!(previous.handed_off);
    assert_eq!(previous.end, pb::TermEnd::Suspended as i32);
    assert_eq!(previous.fence, held.fence);
    let ui = ui.lease.unwrap();
    client.release(release_to(&ui, false, "", 0)).await.unwrap();
    let reply = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter is served after the successor")
        .unwrap()
        .unwrap()
        .into_inner();
    assert_eq!(reply.lease.unwrap().owner, "w");
    assert!(!reply.previous.unwrap().handed_off);
}

/// A successor that does not come loses the key to the waiter when the
/// handoff time runs out.
#[tokio::test]
async fn a_handoff_times_out_to_the_waiter() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let held = lease_of(client.acquire(acquire("s", "worker", 5000)).await.unwrap());
    let mut waiter = server.client().await;
    let waiting = tokio::spawn(async move {
        let req = pb::AcquireRequest {
            wait_ms: 60_000,
            ..acquire("s", "w", 5000)
        };
        waiter.acquire(req).await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    client
        .release(release_to(&held, false, "ui", 2000))
        .await
        .unwrap();
    server.clock.advance(1999);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished());
    server.clock.advance(1);
    let reply = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("served when the handoff runs out")
        .unwrap()
        .unwrap()
        .into_inner();
    assert_eq!(reply.lease.unwrap().owner, "w");
    let late = client.acquire(acquire("s", "ui", 5000)).await.unwrap_err();
    assert_eq!(late.code(), Code::Aborted);
    assert_eq!(reason(&late), "", "plainly busy now: {late:?}");
}

/// History pages newest first, with a token for older entries, and
/// survives a restart; a key never acquired is NOT_FOUND.
#[tokio::test]
async fn history_pages_in_order_and_survives_a_restart() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let mut fences = Vec::new();
    for (i, end) in ["released", "suspended", "expired", "released"]
        .iter()
        .enumerate()
    {
        let lease = lease_of(
            client
                .acquire(acquire("h", &format!("w{i}"), 1000))
                .await
                .unwrap(),
        );
        fences.push(lease.fence);
        match *end {
            "expired" => server.clock.advance(1000),
            suspended => {
                let suspend = suspended == "suspended";
                client
                    .release(release_to(&lease, suspend, "", 0))
                    .await
                    .unwrap();
            }
        }
    }
    let history = |page_size, page_token: String| pb::HistoryRequest {
        key: "h".into(),
        page_size,
        page_token,
    };
    let server = server.restart().await;
    let mut client = server.client().await;
    let first = client
        .history(history(3, String::new()))
        .await
        .unwrap()
        .into_inner();
    let got: Vec<u64> = first.entries.iter().map(|h| h.fence).collect();
    assert_eq!(got, vec![fences[3], fences[2], fences[1]]);
    assert_eq!(first.entries[1].end, pb::TermEnd::Expired as i32);
    assert_eq!(first.entries[1].owner, "w2");
    assert_eq!(first.entries[2].end, pb::TermEnd::Suspended as i32);
    assert!(!first.next_page_token.is_empty());
    let second = client
        .history(history(3, first.next_page_token))
        .await
        .unwrap()
        .into_inner();
    let got: Vec<u64> = second.entries.iter().map(|h| h.fence).collect();
    assert_eq!(got, vec![fences[0]]);
    assert!(second.next_page_token.is_empty());

    let missing = client
        .history(pb::HistoryRequest {
            key: "never".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
}

/// K expiries in a row quarantine a key: Acquire is FAILED_PRECONDITION
/// (reason quarantined), List QUARANTINED shows it and RECOVERABLE does not,
/// it stays quarantined across a restart, a forced Acquire still gets it,
/// and Unquarantine lets everyone in again.
#[tokio::test]
async fn a_key_is_quarantined_after_k_expiries_and_released_from_quarantine() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    for _ in 0..2 {
        client
            .acquire(limited("q", "worker", 1000, 2))
            .await
            .unwrap();
        server.clock.advance(1000);
    }
    let refused = client
        .acquire(acquire("q", "worker", 1000))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert_eq!(reason(&refused), "quarantined");
    assert!(
        refused
            .message()
            .contains("fence 1 expired, fence 2 expired"),
        "{refused:?}"
    );

    let server = server.restart().await;
    let mut client = server.client().await;
    let list = |filter: pb::ListFilter| pb::ListRequest {
        filter: filter as i32,
        ..Default::default()
    };
    let quarantined = client
        .list(list(pb::ListFilter::Quarantined))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(quarantined.keys.len(), 1);
    assert!(quarantined.keys[0].quarantined);
    let recoverable = client
        .list(list(pb::ListFilter::Recoverable))
        .await
        .unwrap()
        .into_inner();
    assert!(recoverable.keys.is_empty(), "{recoverable:?}");
    let still = client
        .acquire(acquire("q", "worker", 1000))
        .await
        .unwrap_err();
    assert_eq!(reason(&still), "quarantined");

    // An operator may take it anyway (to look at it) without lifting it.
    let forced = lease_of(
        client
            .acquire(pb::AcquireRequest {
                force: true,
                ..acquire("q", "ops", 1000)
            })
            .await
            .unwrap(),
    );
    client
        .release(release_to(&forced, true, "", 0))
        .await
        .unwrap();
    let lifted = client
        .unquarantine(pb::UnquarantineRequest { key: "q".into() })
        .await
        .unwrap()
        .into_inner()
        .key
        .unwrap();
    assert!(!lifted.quarantined);
    assert!(lifted.recoverable);
    client.acquire(acquire("q", "worker", 1000)).await.unwrap();
}

/// A handoff reservation is stored with the key: after a restart only the
/// successor gets the key.
#[tokio::test]
async fn a_handoff_survives_a_restart() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let held = lease_of(client.acquire(acquire("s", "worker", 5000)).await.unwrap());
    client
        .release(release_to(&held, false, "ui", 60_000))
        .await
        .unwrap();
    let server = server.restart().await;
    let mut client = server.client().await;
    let refused = client.acquire(acquire("s", "x", 5000)).await.unwrap_err();
    assert_eq!(reason(&refused), "handoff");
    let ui = client
        .acquire(acquire("s", "ui", 5000))
        .await
        .unwrap()
        .into_inner();
    assert!(ui.previous.unwrap().handed_off);
}

/// Malformed lifecycle fields are refused at the edge.
#[tokio::test]
async fn bad_lifecycle_fields_are_invalid_arguments() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let too_long = client
        .acquire(with_delay("k", "a", 1000, 60_001))
        .await
        .unwrap_err();
    assert_eq!(too_long.code(), Code::InvalidArgument);
    let held = lease_of(client.acquire(acquire("k", "a", 1000)).await.unwrap());
    let no_successor = client
        .release(release_to(&held, false, "", 1000))
        .await
        .unwrap_err();
    assert_eq!(no_successor.code(), Code::InvalidArgument);
    let too_long = client
        .release(release_to(&held, false, "ui", 600_001))
        .await
        .unwrap_err();
    assert_eq!(too_long.code(), Code::InvalidArgument);
    // Nothing was released by the refused calls.
    client
        .check(pb::CheckRequest {
            key: "k".into(),
            fence: held.fence,
        })
        .await
        .unwrap();
}

/// The Rust client: a guard hands its session to a named successor, whose
/// guard sees `handed_off`; refusals come back as typed errors; History and
/// Unquarantine work through the client.
#[tokio::test]
async fn the_rust_client_hands_off_reads_history_and_lifts_quarantine() {
    let server = TestServer::start().await;
    let client = Client::connect(server.url()).await.unwrap();
    let worker = client
        .acquire("session:9")
        .owner("worker")
        .ttl(Duration::from_secs(30))
        .lock_delay(Duration::from_secs(5))
        .await
        .unwrap();
    worker
        .hand_off("ui", Duration::from_secs(30), false)
        .await
        .unwrap();
    match client.acquire("session:9").owner("other").await {
        Err(ClientError::Server(Error::Reserved {
            reservation: Held::Handoff { successor },
            ..
        })) => assert_eq!(successor, "ui"),
        other => panic!("expected a handoff refusal, got {other:?}"),
    }
    let ui = client
        .acquire("session:9")
        .owner("ui")
        .ttl(Duration::from_secs(30))
        .await
        .unwrap();
    let previous = ui.previous().expect("a previous term");
    assert!(previous.handed_off);
    assert_eq!(previous.end, TermEnd::Released);
    ui.release().await.unwrap();

    let key = Key::parse("session:9").unwrap();
    let page = client.history(&key, 10, None).await.unwrap();
    let owners: Vec<&str> = page.entries.iter().map(|h| h.owner.as_str()).collect();
    assert_eq!(owners, vec!["ui", "worker"]);
    assert!(page.entries[0].handed_off);

    // Quarantine at K = 1: one suspension is enough.
    let g = client
        .acquire("session:10")
        .max_recoveries(1)
        .await
        .unwrap();
    g.suspend().await.unwrap();
    match client.acquire("session:10").await {
        Err(ClientError::Server(Error::Quarantined { failures: 1, .. })) => {}
        other => panic!("expected quarantine, got {other:?}"),
    }
    let listed = client
        .list("session:", ListFilter::Quarantined, 10, None)
        .await
        .unwrap();
    assert_eq!(listed.keys.len(), 1);
    let key = Key::parse("session:10").unwrap();
    let state = client.unquarantine(&key).await.unwrap();
    assert!(!state.quarantined);
    client
        .acquire("session:10")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}
