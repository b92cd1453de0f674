//! Watch over real gRPC on a real SQLite file: events in revision order,
//! exact resumption after a reconnect, a clean restart and `kill -9`, a
//! compacted revision refused as OUT_OF_RANGE, a slow watcher cut off (in
//! the engine, and over gRPC with a client that stops reading), and the
//! recoverer recipe of docs/lifecycle.md.

mod common;

use std::time::Duration;

use common::requests::*;
use common::{ServerProcess, T0, TestServer};
use futures_util::StreamExt;
use leasehold_client::{Client, ClientError, Error, Event, EventKind, Selector, Watch};
use leasehold_server::EngineConfig;
use leasehold_wire::pb;
use tonic::Code;

/// The next `n` events of `watch`, failing the test if they do not come.
async fn next_events(watch: &mut Watch, n: usize) -> Vec<Event> {
    let mut out = Vec::new();
    while out.len() < n {
        let event = tokio::time::timeout(Duration::from_secs(10), watch.next())
            .await
            .expect("an event within 10 s")
            .expect("the watch goes on")
            .expect("an event, not an error");
        out.push(event);
    }
    out
}

/// Nothing more arrives for a little while.
async fn quiet(watch: &mut Watch) {
    let more = tokio::time::timeout(Duration::from_millis(300), watch.next()).await;
    assert!(more.is_err(), "unexpected event: {more:?}");
}

fn kinds(events: &[Event]) -> Vec<(String, EventKind)> {
    events
        .iter()
        .map(|e| (e.key.as_str().to_owned(), e.kind))
        .collect()
}

/// Every change of a watched prefix comes once, in revision order, with its
/// fence, owner and time; keys outside the prefix do not.
#[tokio::test]
async fn a_watch_sees_every_change_of_its_prefix_in_order() {
    let server = TestServer::start().await;
    let client = Client::connect(server.url()).await.unwrap();
    let mut watch = client
        .watch(Selector::Prefix("s:".into()), 0)
        .await
        .unwrap();
    let mut raw = server.client().await;
    let a = lease_of(raw.acquire(acquire("s:1", "a", 1000)).await.unwrap());
    raw.acquire(acquire("other", "x", 1000)).await.unwrap();
    raw.release(release(&a, false)).await.unwrap();
    let b = lease_of(raw.acquire(acquire("s:2", "b", 1000)).await.unwrap());
    raw.release(release(&b, true)).await.unwrap();
    raw.acquire(acquire("s:3", "c", 1000)).await.unwrap();
    server.clock.advance(1000);
    let events = next_events(&mut watch, 6).await;
    assert_eq!(
        kinds(&events),
        vec![
            ("s:1".into(), EventKind::Granted),
            ("s:1".into(), EventKind::Released),
            ("s:2".into(), EventKind::Granted),
            ("s:2".into(), EventKind::Suspended),
            ("s:3".into(), EventKind::Granted),
            ("s:3".into(), EventKind::Expired),
        ]
    );
    for pair in events.windows(2) {
        assert!(pair[0].revision < pair[1].revision, "{events:?}");
    }
    assert_eq!(events[0].fence.0, a.fence);
    assert_eq!(events[0].owner, "a");
    assert_eq!(events[0].at, T0);
    assert_eq!(events[5].at, T0 + 1000, "an expiry is dated by its TTL");
    quiet(&mut watch).await;
}

/// A watcher that reconnects from the revision after the last one it saw
/// gets exactly what it missed, and one that asks for a key gets only it.
#[tokio::test]
async fn a_reconnecting_watcher_misses_nothing_and_sees_nothing_twice() {
    let server = TestServer::start().await;
    let client = Client::connect(server.url()).await.unwrap();
    let mut raw = server.client().await;
    let mut watch = client
        .watch(Selector::Prefix(String::new()), 0)
        .await
        .unwrap();
    let a = lease_of(raw.acquire(acquire("k", "a", 1000)).await.unwrap());
    let seen = next_events(&mut watch, 1).await;
    let resume = watch.next_revision();
    assert_eq!(resume, seen[0].revision + 1);
    drop(watch);
    raw.release(release(&a, false)).await.unwrap();
    raw.acquire(acquire("j", "b", 1000)).await.unwrap();
    raw.acquire(acquire("k", "c", 1000)).await.unwrap();

    let mut again = client
        .watch(Selector::Prefix(String::new()), resume)
        .await
        .unwrap();
    let missed = next_events(&mut again, 3).await;
    assert_eq!(missed[0].revision, resume);
    assert_eq!(
        kinds(&missed),
        vec![
            ("k".into(), EventKind::Released),
            ("j".into(), EventKind::Granted),
            ("k".into(), EventKind::Granted),
        ]
    );
    quiet(&mut again).await;

    let key = leasehold_core::lease::Key::parse("k").unwrap();
    let mut one_key = client.watch(Selector::Key(key), resume).await.unwrap();
    let only_k = next_events(&mut one_key, 2).await;
    assert!(only_k.iter().all(|e| e.key == "k"), "{only_k:?}");
    quiet(&mut one_key).await;
}

/// Revisions are stored: after a clean restart a watcher resumes exactly,
/// and new changes continue the numbering.
#[tokio::test]
async fn a_watch_resumes_exactly_across_a_restart() {
    let server = TestServer::start().await;
    let mut raw = server.client().await;
    let a = lease_of(raw.acquire(acquire("k", "a", 1000)).await.unwrap());
    raw.release(release(&a, false)).await.unwrap();
    let client = Client::connect(server.url()).await.unwrap();
    let mut watch = client
        .watch(Selector::Prefix(String::new()), 1)
        .await
        .unwrap();
    let before = next_events(&mut watch, 2).await;
    assert_eq!(before[0].revision, 1);
    assert_eq!(before[1].revision, 2);
    drop(watch);

    let server = server.restart().await;
    let mut raw = server.client().await;
    raw.acquire(acquire("k", "b", 1000)).await.unwrap();
    let client = Client::connect(server.url()).await.unwrap();
    let mut watch = client
        .watch(Selector::Prefix(String::new()), 3)
        .await
        .unwrap();
    let after = next_events(&mut watch, 1).await;
    assert_eq!(after[0].revision, 3);
    assert_eq!(after[0].owner, "b");
    quiet(&mut watch).await;
}

/// After `kill -9` of the real server under a stream of changes, the log
/// read back from revision 1 has no gap and no repeat, and holds every
/// acknowledged grant and release.
#[tokio::test]
async fn the_event_log_has_no_gap_after_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let server = ServerProcess::start(&db);
    let mut raw = server.client().await;
    let mut acknowledged = 0;
    for i in 0..20 {
        let lease = lease_of(
            raw.acquire(acquire(&format!("k{}", i % 3), "w", 60_000))
                .await
                .unwrap(),
        );
        raw.release(release(&lease, i % 2 == 0)).await.unwrap();
        acknowledged += 2;
    }
    server.kill9();
    let server = ServerProcess::start(&db);
    let client = Client::connect(server.url()).await.unwrap();
    let mut watch = client
        .watch(Selector::Prefix(String::new()), 1)
        .await
        .unwrap();
    let events = next_events(&mut watch, acknowledged).await;
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.revision, i as u64 + 1, "{events:?}");
    }
    quiet(&mut watch).await;
}

/// A revision older than the log holds is OUT_OF_RANGE with the oldest it
/// holds; watching from that one works.
#[tokio::test]
async fn a_compacted_revision_is_out_of_range_with_the_oldest_available() {
    let server = TestServer::builder()
        .config(EngineConfig {
            event_log_len: 4,
            ..EngineConfig::default()
        })
        .start()
        .await;
    let mut raw = server.client().await;
    for i in 0..5 {
        let lease = lease_of(
            raw.acquire(acquire(&format!("k{i}"), "w", 1000))
                .await
                .unwrap(),
        );
        raw.release(release(&lease, false)).await.unwrap();
    }
    // Ten events, the log holds the last four: 7..=10.
    let mut grpc = server.client().await;
    let refused = grpc
        .watch(pb::WatchRequest {
            start_revision: 2,
            ..Default::default()
        })
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(refused.code(), Code::OutOfRange);
    assert_eq!(
        refused.metadata().get("leasehold-oldest-revision").unwrap(),
        "7"
    );
    let client = Client::connect(server.url()).await.unwrap();
    match client.watch(Selector::Prefix(String::new()), 6).await {
        Err(ClientError::Server(Error::Compacted {
            requested: 6,
            oldest: 7,
        })) => {}
        other => panic!("expected compacted, got {:?}", other.map(|_| ())),
    }
    let mut watch = client
        .watch(Selector::Prefix(String::new()), 7)
        .await
        .unwrap();
    let events = next_events(&mut watch, 4).await;
    assert_eq!(events[0].revision, 7);
    assert_eq!(events[3].revision, 10);

    // The same after a restart: the stored log is bounded too.
    let server = server.restart().await;
    let client = Client::connect(server.url()).await.unwrap();
    assert!(
        client
            .watch(Selector::Prefix(String::new()), 2)
            .await
            .is_err()
    );
}

/// A watcher that does not read is cut off once it falls more commits
/// behind than the buffer holds, with the revision to resume from; others
/// are not held up.
#[tokio::test]
async fn a_slow_watcher_is_cut_off_with_the_revision_to_resume_from() {
    let server = TestServer::builder()
        .config(EngineConfig {
            watch_buffer: 2,
            ..EngineConfig::default()
        })
        .start()
        .await;
    let watching = server
        .engine
        .watch(leasehold_core::events::Selector::Prefix(String::new()), 0)
        .unwrap();
    let mut raw = server.client().await;
    for i in 0..6 {
        // Each awaited change is its own commit.
        raw.acquire(acquire(&format!("k{i}"), "w", 1000))
            .await
            .unwrap();
    }
    let mut events = watching.events;
    let cut = tokio::time::timeout(Duration::from_secs(10), events.next())
        .await
        .unwrap()
        .unwrap();
    match cut {
        Err(Error::ResourceExhausted { limit, detail }) => {
            assert_eq!(limit, "watch_buffer");
            assert!(detail.contains("from revision 1"), "{detail}");
        }
        other => panic!("expected a cut-off, got {other:?}"),
    }
    assert!(
        events.next().await.is_none(),
        "the stream ends after the cut"
    );
    // A fresh watcher from revision 1 still gets everything.
    let client = Client::connect(server.url()).await.unwrap();
    let mut watch = client
        .watch(Selector::Prefix(String::new()), 1)
        .await
        .unwrap();
    assert_eq!(next_events(&mut watch, 6).await.len(), 6);
}

/// The same over real gRPC: a client that stops reading fills its HTTP/2
/// window (a tiny one here), the server stops polling the watch, falls
/// behind by more commits than `watch_buffer`, and cuts the stream with
/// RESOURCE_EXHAUSTED naming the revision to resume from. The client then
/// reads what was in flight, the status, and resumes exactly there: every
/// event once, none missing.
#[tokio::test]
async fn a_grpc_watcher_that_stops_reading_is_cut_off_and_resumes_exactly() {
    const CHANGES: usize = 60;
    let server = TestServer::builder()
        .config(EngineConfig {
            watch_buffer: 2,
            ..EngineConfig::default()
        })
        .start()
        .await;
    let channel = tonic::transport::Endpoint::from_shared(server.url())
        .unwrap()
        .initial_stream_window_size(Some(1024))
        .connect()
        .await
        .unwrap();
    let mut slow = pb::leasehold_client::LeaseholdClient::new(channel);
    let mut stream = slow
        .watch(pb::WatchRequest {
            prefix: "slow/".into(),
            start_revision: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    // Nothing is read while the changes happen, each its own commit.
    let mut raw = server.client().await;
    for i in 0..CHANGES {
        raw.acquire(acquire(&format!("slow/{i}"), "w", 60_000))
            .await
            .unwrap();
    }
    let mut revisions = Vec::new();
    let status = loop {
        let next = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("the stream answers within 10 s");
        match next {
            Some(Ok(reply)) => revisions.extend(reply.events.iter().map(|e| e.revision)),
            Some(Err(status)) => break status,
            None => panic!("the stream ended without a status after {revisions:?}"),
        }
    };
    assert!(
        revisions.len() < CHANGES,
        "a cut-off came only after every event ({} of {CHANGES})",
        revisions.len()
    );
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let resume = revisions.last().map_or(1, |r| r + 1);
    match leasehold_wire::status::from_status(&status) {
        Error::ResourceExhausted { limit, detail } => {
            assert_eq!(limit, "watch_buffer");
            assert!(
                detail.contains(&format!("from revision {resume}")),
                "{detail} (last received {revisions:?})"
            );
        }
        other => panic!("expected the watch_buffer limit, got {other:?}"),
    }
    assert!(
        stream.next().await.is_none(),
        "the stream ends after the cut"
    );
    // Resuming where the status says gives the rest, exactly once each.
    let client = Client::connect(server.url()).await.unwrap();
    let mut watch = client
        .watch(Selector::Prefix("slow/".into()), resume)
        .await
        .unwrap();
    let rest = next_events(&mut watch, CHANGES - revisions.len()).await;
    revisions.extend(rest.iter().map(|e| e.revision));
    let expected: Vec<u64> = (1..=CHANGES as u64).collect();
    assert_eq!(revisions, expected, "every revision once, in order");
    quiet(&mut watch).await;
}

/// The recoverer recipe: watch RECOVERABLE-making events instead of
/// polling List, and take the session over when its holder's term expires.
#[tokio::test]
async fn a_recoverer_takes_over_an_expired_session_when_told() {
    let server = TestServer::start().await;
    let client = Client::connect(server.url()).await.unwrap();
    let mut watch = client
        .watch(Selector::Prefix("session:".into()), 0)
        .await
        .unwrap();
    let mut raw = server.client().await;
    raw.acquire(acquire("session:7", "worker-1", 1000))
        .await
        .unwrap();
    server.clock.advance(1000);
    let expired = loop {
        let event = next_events(&mut watch, 1).await.remove(0);
        if matches!(event.kind, EventKind::Expired | EventKind::Suspended) {
            break event;
        }
    };
    assert_eq!(expired.key, "session:7");
    let recovered = client
        .acquire(expired.key.as_str())
        .owner("recoverer")
        .ttl(Duration::from_secs(30))
        .await
        .unwrap();
    let previous = recovered.previous().unwrap();
    assert_eq!(previous.end, leasehold_client::TermEnd::Expired);
    assert_eq!(previous.fence, expired.fence);
    recovered.release().await.unwrap();
}
