//! The tool-call ledger over real gRPC on a real SQLite file.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::{TestServer, acquire, lease_of};
use leasehold_wire::pb;
use leasehold_wire::pb::leasehold_client::LeaseholdClient;
use tonic::Code;
use tonic::transport::Channel;

type Client = LeaseholdClient<Channel>;

fn spec(call_id: &str) -> pb::ToolCallSpec {
    pb::ToolCallSpec {
        call_id: call_id.into(),
        name: "shell".into(),
        input_digest: String::new(),
    }
}

fn begin(lease: &pb::Lease, call_id: &str) -> pb::BeginToolCallRequest {
    pb::BeginToolCallRequest {
        key: lease.key.clone(),
        fence: lease.fence,
        lease_id: lease.lease_id.clone(),
        call_id: call_id.into(),
        name: "shell".into(),
        input_digest: "sha256:abc".into(),
    }
}

fn begin_batch(lease: &pb::Lease, ids: &[&str]) -> pb::BeginToolCallsRequest {
    pb::BeginToolCallsRequest {
        key: lease.key.clone(),
        fence: lease.fence,
        lease_id: lease.lease_id.clone(),
        calls: ids.iter().map(|id| spec(id)).collect(),
    }
}

fn settle(
    lease: &pb::Lease,
    call_id: &str,
    outcome: pb::ToolCallState,
) -> pb::SettleToolCallRequest {
    pb::SettleToolCallRequest {
        key: lease.key.clone(),
        fence: lease.fence,
        lease_id: lease.lease_id.clone(),
        call_id: call_id.into(),
        outcome: outcome as i32,
        result_digest: String::new(),
        result: b"ok".to_vec(),
    }
}

async fn list(client: &mut Client, key: &str, unsettled: bool) -> Vec<pb::ToolCall> {
    use pb::list_tool_calls_request::Filter;
    let filter = if unsettled {
        Filter::Unsettled
    } else {
        Filter::All
    };
    client
        .list_tool_calls(pb::ListToolCallsRequest {
            key: key.into(),
            filter: filter as i32,
        })
        .await
        .unwrap()
        .into_inner()
        .calls
}

/// A minimal runner: begin the turn's calls, run only the new ones, settle them.
async fn run_turn(client: &mut Client, lease: &pb::Lease, ids: &[&str], side_effects: &AtomicU32) {
    let reply = client
        .begin_tool_calls(begin_batch(lease, ids))
        .await
        .unwrap()
        .into_inner();
    let fresh: Vec<&str> = if reply.duplicate {
        let mut fresh = Vec::new();
        for id in ids {
            if !reply.duplicate_call_ids.iter().any(|d| d == id) && !fresh.contains(id) {
                fresh.push(*id);
            }
        }
        if !fresh.is_empty() {
            let again = client
                .begin_tool_calls(begin_batch(lease, &fresh))
                .await
                .unwrap()
                .into_inner();
            assert!(!again.duplicate);
        }
        // An id repeated within the turn but new to the ledger runs once.
        for id in &reply.duplicate_call_ids {
            let known = reply.calls.iter().any(|c| &c.call_id == id);
            if !known && !fresh.contains(&id.as_str()) {
                let single = client
                    .begin_tool_call(begin(lease, id))
                    .await
                    .unwrap()
                    .into_inner();
                assert!(!single.duplicate);
                fresh.push(ids.iter().find(|i| *i == id).unwrap());
            }
        }
        fresh
    } else {
        ids.to_vec()
    };
    for id in fresh {
        side_effects.fetch_add(1, Ordering::SeqCst);
        client
            .settle_tool_call(settle(lease, id, pb::ToolCallState::Succeeded))
            .await
            .unwrap();
    }
}

/// A call id seen before, in the same batch or a later turn, never runs its tool again.
#[tokio::test]
async fn duplicate_call_ids_never_run_twice() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let lease = lease_of(
        client
            .acquire(acquire("s", "graph-a", 60_000))
            .await
            .unwrap(),
    );
    let counter = AtomicU32::new(0);

    run_turn(&mut client, &lease, &["call_a", "call_a"], &counter).await;
    assert_eq!(counter.load(Ordering::SeqCst), 1, "repeat within one batch");

    run_turn(&mut client, &lease, &["call_a", "call_b"], &counter).await;
    assert_eq!(counter.load(Ordering::SeqCst), 2, "only call_b is new");

    let single = client
        .begin_tool_call(begin(&lease, "call_b"))
        .await
        .unwrap()
        .into_inner();
    assert!(single.duplicate);
    let existing = single.call.unwrap();
    assert_eq!(existing.state, pb::ToolCallState::Succeeded as i32);
    assert_eq!(existing.result, b"ok");

    let calls = list(&mut client, "s", false).await;
    let ids: Vec<_> = calls.iter().map(|c| c.call_id.as_str()).collect();
    assert_eq!(ids, ["call_a", "call_b"]);
    assert!(calls[0].ordinal < calls[1].ordinal);
}

/// A batch with one known id records none of its calls.
#[tokio::test]
async fn a_batch_is_all_or_nothing() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let lease = lease_of(client.acquire(acquire("s", "o", 60_000)).await.unwrap());
    client.begin_tool_call(begin(&lease, "old")).await.unwrap();
    let reply = client
        .begin_tool_calls(begin_batch(&lease, &["new1", "old", "new2"]))
        .await
        .unwrap()
        .into_inner();
    assert!(reply.duplicate);
    assert_eq!(reply.duplicate_call_ids, ["old"]);
    assert_eq!(reply.calls.len(), 1);
    assert_eq!(reply.calls[0].call_id, "old");
    let ids: Vec<_> = list(&mut client, "s", false)
        .await
        .into_iter()
        .map(|c| c.call_id)
        .collect();
    assert_eq!(ids, ["old"]);
}

/// Under concurrent settles exactly one outcome wins, and everyone sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_terminal_state_wins_under_concurrency() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let lease = lease_of(client.acquire(acquire("s", "o", 60_000)).await.unwrap());
    client.begin_tool_call(begin(&lease, "c")).await.unwrap();
    let outcomes = [
        pb::ToolCallState::Succeeded,
        pb::ToolCallState::Failed,
        pb::ToolCallState::Unknown,
    ];
    let mut tasks = Vec::new();
    for i in 0..24 {
        let mut client = server.client().await;
        let request = settle(&lease, "c", outcomes[i % 3]);
        tasks.push(tokio::spawn(async move {
            client.settle_tool_call(request).await.unwrap().into_inner()
        }));
    }
    let mut winners = 0;
    let mut records = Vec::new();
    for task in tasks {
        let reply = task.await.unwrap();
        if !reply.already_settled {
            winners += 1;
        }
        records.push(reply.call.unwrap());
    }
    assert_eq!(winners, 1);
    assert!(
        records.windows(2).all(|w| w[0] == w[1]),
        "all see the winning record"
    );
    assert_ne!(records[0].state, pb::ToolCallState::Running as i32);
}

/// A holder dies mid-tool; the next holder sees the unsettled call and settles it
/// as UNKNOWN; the first holder's late settle is refused.
#[tokio::test]
async fn a_recoverer_settles_the_dead_holders_calls() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let first = lease_of(client.acquire(acquire("s", "graph-a", 1000)).await.unwrap());
    client.begin_tool_call(begin(&first, "slow")).await.unwrap();
    // graph-a stops renewing (killed); its lease runs out on the server's clock.
    server.clock.advance(1000);

    let reply = client
        .acquire(acquire("s", "graph-b", 60_000))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.unsettled_tool_calls, 1);
    assert_eq!(reply.previous.unwrap().end, pb::TermEnd::Expired as i32);
    let second = reply.lease.unwrap();
    let unsettled = list(&mut client, "s", true).await;
    assert_eq!(unsettled.len(), 1);
    assert_eq!(unsettled[0].call_id, "slow");
    assert_eq!(unsettled[0].fence, first.fence);

    let settled = client
        .settle_tool_call(settle(&second, "slow", pb::ToolCallState::Unknown))
        .await
        .unwrap()
        .into_inner()
        .call
        .unwrap();
    assert_eq!(settled.state, pb::ToolCallState::Unknown as i32);
    assert_eq!(settled.settled_fence, second.fence);

    let status = client
        .settle_tool_call(settle(&first, "slow", pb::ToolCallState::Succeeded))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    let status = client
        .begin_tool_call(begin(&first, "another"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(list(&mut client, "s", true).await.is_empty());
}

/// The ledger survives a server restart between begin and settle.
#[tokio::test]
async fn begin_and_settle_span_a_restart() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let lease = lease_of(client.acquire(acquire("s", "o", 60_000)).await.unwrap());
    client.begin_tool_call(begin(&lease, "c1")).await.unwrap();
    drop(client);
    let server = server.restart().await;
    let mut client = server.client().await;
    let unsettled = list(&mut client, "s", true).await;
    assert_eq!(unsettled.len(), 1);
    let settled = client
        .settle_tool_call(settle(&lease, "c1", pb::ToolCallState::Succeeded))
        .await
        .unwrap()
        .into_inner();
    assert!(!settled.already_settled);
    // New calls after the restart are ordered after the old ones.
    client.begin_tool_call(begin(&lease, "c2")).await.unwrap();
    drop(client);
    let server = server.restart().await;
    let mut client = server.client().await;
    let calls = list(&mut client, "s", false).await;
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].call_id, "c1");
    assert_eq!(calls[0].state, pb::ToolCallState::Succeeded as i32);
    assert_eq!(calls[1].call_id, "c2");
    assert!(calls[0].ordinal < calls[1].ordinal);
}

/// Bad input is INVALID_ARGUMENT; unknown calls NOT_FOUND; a wrong secret PERMISSION_DENIED.
#[tokio::test]
async fn ledger_input_is_validated() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let lease = lease_of(client.acquire(acquire("s", "o", 60_000)).await.unwrap());
    let long = "c".repeat(257);
    for call_id in ["", long.as_str(), "bad\nid"] {
        let status = client
            .begin_tool_call(begin(&lease, call_id))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{call_id:?}");
    }
    let status = client
        .begin_tool_calls(begin_batch(&lease, &[]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    client.begin_tool_call(begin(&lease, "c")).await.unwrap();
    let status = client
        .settle_tool_call(settle(&lease, "c", pb::ToolCallState::Running))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    let mut unknown_outcome = settle(&lease, "c", pb::ToolCallState::Succeeded);
    unknown_outcome.outcome = 42;
    assert_eq!(
        client
            .settle_tool_call(unknown_outcome)
            .await
            .unwrap_err()
            .code(),
        Code::InvalidArgument
    );
    let mut too_big = settle(&lease, "c", pb::ToolCallState::Succeeded);
    too_big.result = vec![0; 64 * 1024 + 1];
    assert_eq!(
        client.settle_tool_call(too_big).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    let status = client
        .settle_tool_call(settle(&lease, "nope", pb::ToolCallState::Failed))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    let mut forged = begin(&lease, "d");
    forged.lease_id = uuid::Uuid::new_v4().to_string();
    assert_eq!(
        client.begin_tool_call(forged).await.unwrap_err().code(),
        Code::PermissionDenied
    );
    let status = client
        .list_tool_calls(pb::ListToolCallsRequest {
            key: "never".into(),
            filter: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
}

/// Every call carries the documented idempotency key for downstream deduplication.
#[tokio::test]
async fn calls_carry_a_stable_idempotency_key() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let lease = lease_of(
        client
            .acquire(acquire("session:1", "o", 60_000))
            .await
            .unwrap(),
    );
    let call = client
        .begin_tool_call(begin(&lease, "call_1"))
        .await
        .unwrap()
        .into_inner()
        .call
        .unwrap();
    assert_eq!(call.idempotency_key, "a2d46a7a-2e77-5d22-b2cb-c49159a0b511");
    assert_eq!(
        call.idempotency_key,
        leasehold_core::ledger::idempotency_key("session:1", "call_1")
    );
}

/// Settled calls of a cleanly released key are pruned after the retention
/// time; running calls and suspended keys' calls are kept.
#[tokio::test]
async fn settled_calls_are_pruned_after_retention() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let done = lease_of(client.acquire(acquire("done", "o", 60_000)).await.unwrap());
    client
        .begin_tool_calls(begin_batch(&done, &["a", "b"]))
        .await
        .unwrap();
    client
        .settle_tool_call(settle(&done, "a", pb::ToolCallState::Succeeded))
        .await
        .unwrap();
    let paused = lease_of(
        client
            .acquire(acquire("paused", "o", 60_000))
            .await
            .unwrap(),
    );
    client.begin_tool_call(begin(&paused, "p")).await.unwrap();
    client
        .settle_tool_call(settle(&paused, "p", pb::ToolCallState::Failed))
        .await
        .unwrap();
    let release = |lease: &pb::Lease, suspend| pb::ReleaseRequest {
        key: lease.key.clone(),
        fence: lease.fence,
        lease_id: lease.lease_id.clone(),
        suspend,
        ..Default::default()
    };
    client.release(release(&done, false)).await.unwrap();
    client.release(release(&paused, true)).await.unwrap();

    server.clock.advance(24 * 60 * 60 * 1000 - 1);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        list(&mut client, "done", false).await.len(),
        2,
        "kept until retention ends"
    );
    server.clock.advance(1);
    let mut remaining = Vec::new();
    for _ in 0..200 {
        remaining = list(&mut client, "done", false).await;
        if remaining.len() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let ids: Vec<_> = remaining.iter().map(|c| c.call_id.as_str()).collect();
    assert_eq!(
        ids,
        ["b"],
        "the running call stays; the settled one is pruned"
    );
    assert_eq!(list(&mut client, "paused", false).await.len(), 1);

    // The pruning is durable.
    drop(client);
    let server = server.restart().await;
    let mut client = server.client().await;
    assert_eq!(list(&mut client, "done", false).await.len(), 1);
}

/// Counting begin/settle shares commits too (a smoke check of batching on the ledger path).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_writes_are_durable_before_reply() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let lease = Arc::new(lease_of(
        client.acquire(acquire("s", "o", 60_000)).await.unwrap(),
    ));
    let before = server.engine.commits();
    client.begin_tool_call(begin(&lease, "x")).await.unwrap();
    assert!(
        server.engine.commits() > before,
        "begin committed before its reply"
    );
    let before = server.engine.commits();
    client
        .settle_tool_call(settle(&lease, "x", pb::ToolCallState::Succeeded))
        .await
        .unwrap();
    assert!(
        server.engine.commits() > before,
        "settle committed before its reply"
    );
}
