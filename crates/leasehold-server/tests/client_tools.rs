//! The client's tool-call loop over the ledger: no call id runs twice.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::TestServer;
use leasehold_client::{Client, ClientError, Error, ToolCallRequest, ToolOutcome};

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

/// A handler that counts its runs and answers with the call's turn.
fn counting(
    runs: &Arc<AtomicU32>,
) -> impl Fn(leasehold_client::ToolInvocation) -> std::future::Ready<ToolOutcome> + '_ {
    move |invocation| {
        runs.fetch_add(1, Ordering::SeqCst);
        std::future::ready(ToolOutcome::Succeeded(invocation.turn.into_bytes()))
    }
}

/// With a turn named, an id reused in a new turn runs its side effect again
/// (with a new idempotency key), a duplicate within the turn runs once, and
/// the records carry their turn.
#[tokio::test]
async fn a_reused_id_runs_again_in_a_new_turn_and_once_within_it() {
    let server = TestServer::start().await;
    let client = client_of(&server).await;
    let guard = client
        .acquire("s")
        .ttl(Duration::from_secs(60))
        .await
        .unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let keys = std::sync::Mutex::new(Vec::new());
    let handler = |invocation: leasehold_client::ToolInvocation| {
        runs.fetch_add(1, Ordering::SeqCst);
        keys.lock()
            .unwrap()
            .push(invocation.idempotency_key.clone());
        std::future::ready(ToolOutcome::Succeeded(invocation.turn.into_bytes()))
    };
    let first = guard
        .tool_calls()
        .turn("t1")
        .run(calls(&["call_0"]), 1, handler)
        .await
        .unwrap();
    assert!(!first[0].reused);
    let second = guard
        .tool_calls()
        .turn("t2")
        .run(calls(&["call_0", "call_0"]), 2, handler)
        .await
        .unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2, "once per turn");
    assert_eq!(second[0].outcome, ToolOutcome::Succeeded(b"t2".to_vec()));
    assert_eq!(second[0].outcome, second[1].outcome);
    let keys = keys.into_inner().unwrap();
    assert_ne!(keys[0], keys[1], "each turn has its own idempotency key");
    assert_eq!(
        keys[1],
        leasehold_core::ledger::idempotency_key_in_turn("s", "t2", "call_0")
    );

    let again = guard
        .tool_calls()
        .turn("t2")
        .run(calls(&["call_0"]), 1, counting(&runs))
        .await
        .unwrap();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "a duplicate within t2 did not run"
    );
    assert!(again[0].reused);
    assert_eq!(again[0].outcome, ToolOutcome::Succeeded(b"t2".to_vec()));
    guard.release().await.unwrap();
}

/// `across_turns` refuses an id an earlier turn declared: the handler does
/// not run and the earlier turn's outcome comes back; so does a run that
/// names no turn.
#[tokio::test]
async fn across_turns_refuses_an_id_from_an_earlier_turn() {
    let server = TestServer::start().await;
    let client = client_of(&server).await;
    let guard = client
        .acquire("s")
        .ttl(Duration::from_secs(60))
        .await
        .unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    guard
        .tool_calls()
        .turn("t1")
        .run(calls(&["call_0"]), 1, counting(&runs))
        .await
        .unwrap();
    let across = guard
        .tool_calls()
        .turn("t2")
        .across_turns()
        .run(calls(&["call_0", "call_1"]), 2, counting(&runs))
        .await
        .unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2, "only call_1 ran");
    assert!(across[0].reused);
    assert_eq!(across[0].outcome, ToolOutcome::Succeeded(b"t1".to_vec()));
    assert!(!across[1].reused);
    assert_eq!(across[1].outcome, ToolOutcome::Succeeded(b"t2".to_vec()));
    let no_turn = guard
        .run_tool_calls(calls(&["call_1"]), 1, counting(&runs))
        .await
        .unwrap();
    assert!(
        no_turn[0].reused,
        "no turn named: checked across every turn"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// An id begun in two turns is settled by naming its turn; without one the
/// server cannot tell which call is meant.
#[tokio::test]
async fn settling_an_id_in_two_turns_needs_the_turn() {
    let server = TestServer::start().await;
    let client = client_of(&server).await;
    let guard = client
        .acquire("s")
        .ttl(Duration::from_secs(60))
        .await
        .unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    for turn in ["t1", "t2"] {
        guard
            .tool_calls()
            .turn(turn)
            .run(calls(&["call_0"]), 1, counting(&runs))
            .await
            .unwrap();
    }
    let ambiguous = guard
        .settle_tool_call("call_0", &ToolOutcome::Unknown)
        .await;
    assert!(
        matches!(
            ambiguous,
            Err(ClientError::Server(Error::InvalidArgument(_)))
        ),
        "{ambiguous:?}"
    );
    let t1 = guard
        .tool_calls()
        .turn("t1")
        .settle("call_0", &ToolOutcome::Unknown)
        .await
        .unwrap();
    assert_eq!(t1.turn, "t1");
    assert_eq!(t1.result, b"t1", "the first outcome of t1's call won");
    let missing = guard
        .tool_calls()
        .turn("t3")
        .settle("call_0", &ToolOutcome::Unknown)
        .await;
    assert!(
        matches!(
            missing,
            Err(ClientError::Server(Error::ToolCallNotFound { .. }))
        ),
        "{missing:?}"
    );
    assert!(guard.is_valid(), "a refused settle is not a lost lease");
}
