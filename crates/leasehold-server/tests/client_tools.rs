//! The client's tool-call loop over the ledger: no call id runs twice.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::TestServer;
use leasehold_client::{Client, ClientError, ToolCallRequest, ToolOutcome};

async fn client_of(server: &TestServer) -> Client {
    Client::connect(format!("http://{}", server.addr))
        .await
        .unwrap()
}

fn calls(ids: &[&str]) -> Vec<ToolCallRequest> {
    ids.iter()
        .map(|id| ToolCallRequest::new(*id, "shell"))
        .collect()
}

/// A repeated id, in one turn or a later one, runs its handler once and
/// returns the stored outcome, in the provider's call order.
#[tokio::test]
async fn duplicate_ids_run_once_and_reuse_the_stored_outcome() {
    let server = TestServer::start().await;
    let client = client_of(&server).await;
    let guard = client
        .acquire("s")
        .ttl(Duration::from_secs(60))
        .await
        .unwrap();
    let side_effects = Arc::new(AtomicU32::new(0));
    let handler = |invocation: leasehold_client::ToolInvocation| {
        let side_effects = side_effects.clone();
        async move {
            side_effects.fetch_add(1, Ordering::SeqCst);
            ToolOutcome::Succeeded(format!("ran {}", invocation.call.call_id).into_bytes())
        }
    };
    let first = guard
        .run_tool_calls(calls(&["a", "a", "b"]), 4, handler)
        .await
        .unwrap();
    assert_eq!(side_effects.load(Ordering::SeqCst), 2);
    let ids: Vec<_> = first.iter().map(|r| r.call_id.as_str()).collect();
    assert_eq!(ids, ["a", "a", "b"]);
    assert_eq!(first[0].outcome, first[1].outcome);

    let second = guard
        .run_tool_calls(calls(&["b", "c"]), 4, handler)
        .await
        .unwrap();
    assert_eq!(side_effects.load(Ordering::SeqCst), 3, "only c ran");
    assert!(second[0].reused);
    assert_eq!(second[0].outcome, ToolOutcome::Succeeded(b"ran b".to_vec()));
    assert!(!second[1].reused);
    guard.release().await.unwrap();
}

/// Results come back in call order even when handlers finish out of order.
#[tokio::test]
async fn results_keep_the_call_order() {
    let server = TestServer::start().await;
    let client = client_of(&server).await;
    let guard = client
        .acquire("s")
        .ttl(Duration::from_secs(60))
        .await
        .unwrap();
    let results = guard
        .run_tool_calls(
            calls(&["slow", "mid", "fast"]),
            3,
            |invocation| async move {
                let delay = match invocation.call.call_id.as_str() {
                    "slow" => 60,
                    "mid" => 30,
                    _ => 0,
                };
                tokio::time::sleep(Duration::from_millis(delay)).await;
                ToolOutcome::Failed(invocation.idempotency_key.into_bytes())
            },
        )
        .await
        .unwrap();
    let ids: Vec<_> = results.iter().map(|r| r.call_id.as_str()).collect();
    assert_eq!(ids, ["slow", "mid", "fast"]);
    let expected = leasehold_core::ledger::idempotency_key("s", "mid");
    assert_eq!(
        results[1].outcome,
        ToolOutcome::Failed(expected.into_bytes())
    );
}

/// When the lease is lost mid-tool, the run is cancelled; the next holder
/// sees the call still running, settles it as unknown, and the first
/// holder can no longer settle it.
#[tokio::test]
async fn a_lost_lease_cancels_the_run_and_leaves_the_call_for_recovery() {
    let server = TestServer::start().await;
    let client = client_of(&server).await;
    let guard = client
        .acquire("s")
        .owner("graph-a")
        .ttl(Duration::from_millis(300))
        .await
        .unwrap();
    let run = guard.run_tool_calls(calls(&["stuck"]), 1, |_| async {
        std::future::pending::<()>().await;
        ToolOutcome::Unknown
    });
    let take_over = async {
        // Let the call be registered, then let the term run out on the server's clock.
        tokio::time::sleep(Duration::from_millis(50)).await;
        server.clock.advance(10_000);
        client
            .acquire("s")
            .owner("graph-b")
            .ttl(Duration::from_secs(60))
            .await
            .unwrap()
    };
    let (run, recoverer) = tokio::time::timeout(Duration::from_secs(10), async {
        tokio::join!(run, take_over)
    })
    .await
    .expect("the run ends once the lease is lost");
    assert!(matches!(run, Err(ClientError::Lost { .. })), "{run:?}");

    assert_eq!(guard.unsettled_at_grant(), 0);
    assert_eq!(
        recoverer.unsettled_at_grant(),
        1,
        "the grant counts the stuck call"
    );
    let unsettled = recoverer.unsettled_tool_calls().await.unwrap();
    assert_eq!(unsettled.len(), 1);
    assert_eq!(unsettled[0].call_id, "stuck");
    assert_eq!(unsettled[0].fence, guard.fence());
    let settled = recoverer
        .settle_tool_call("stuck", &ToolOutcome::Unknown)
        .await
        .unwrap();
    assert_eq!(settled.settled_fence, Some(recoverer.fence()));
    let late = guard
        .settle_tool_call("stuck", &ToolOutcome::Succeeded(vec![]))
        .await;
    assert!(matches!(late, Err(ClientError::Lost { .. })), "{late:?}");
    assert!(recoverer.unsettled_tool_calls().await.unwrap().is_empty());
}
