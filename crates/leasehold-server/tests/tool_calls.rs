//! The tool-call ledger over real gRPC: its contract on both backends
//! (`sqlite::…` and `postgres::…`, see `backends/`), and what only the
//! SQLite engine has (retention pruning, commit counting).

mod common;
mod pg_harness;
#[macro_use]
mod backends;

use backends::Backend;
use leasehold_client::StaleReason;

contract!(
    duplicate_call_ids_never_run_twice,
    a_batch_is_all_or_nothing,
    the_first_terminal_state_wins_under_concurrency,
    a_recoverer_settles_the_dead_holders_calls,
    begin_and_settle_span_a_restart,
    ledger_input_is_validated,
    calls_carry_a_stable_idempotency_key,
    the_ledger_records_settles_and_lists_under_the_live_term_only,
    a_reused_call_id_runs_in_a_new_turn_and_not_twice_in_one,
);

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::TestServer;
use common::requests::*;
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
        across_turns: Default::default(),
        turn: Default::default(),
    }
}

fn begin_batch(lease: &pb::Lease, ids: &[&str]) -> pb::BeginToolCallsRequest {
    pb::BeginToolCallsRequest {
        key: lease.key.clone(),
        fence: lease.fence,
        lease_id: lease.lease_id.clone(),
        calls: ids.iter().map(|id| spec(id)).collect(),
        across_turns: Default::default(),
        turn: Default::default(),
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
        turn: Default::default(),
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
async fn duplicate_call_ids_never_run_twice(h: Backend) {
    let mut client = h.client().await;
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
async fn a_batch_is_all_or_nothing(h: Backend) {
    let mut client = h.client().await;
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
async fn the_first_terminal_state_wins_under_concurrency(h: Backend) {
    let mut client = h.client().await;
    let lease = lease_of(client.acquire(acquire("s", "o", 60_000)).await.unwrap());
    client.begin_tool_call(begin(&lease, "c")).await.unwrap();
    let outcomes = [
        pb::ToolCallState::Succeeded,
        pb::ToolCallState::Failed,
        pb::ToolCallState::Unknown,
    ];
    let mut tasks = Vec::new();
    for i in 0..24 {
        let mut client = h.client().await;
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
async fn a_recoverer_settles_the_dead_holders_calls(h: Backend) {
    let mut client = h.client().await;
    let first = lease_of(client.acquire(acquire("s", "graph-a", 300)).await.unwrap());
    client.begin_tool_call(begin(&first, "slow")).await.unwrap();
    // graph-a stops renewing (killed); its lease runs out on the server's clock.
    h.pass(310).await;

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
async fn begin_and_settle_span_a_restart(h: Backend) {
    let mut client = h.client().await;
    let lease = lease_of(client.acquire(acquire("s", "o", 60_000)).await.unwrap());
    client.begin_tool_call(begin(&lease, "c1")).await.unwrap();
    drop(client);
    let h = h.restart().await;
    let mut client = h.client().await;
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
    let h = h.restart().await;
    let mut client = h.client().await;
    let calls = list(&mut client, "s", false).await;
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].call_id, "c1");
    assert_eq!(calls[0].state, pb::ToolCallState::Succeeded as i32);
    assert_eq!(calls[1].call_id, "c2");
    assert!(calls[0].ordinal < calls[1].ordinal);
}

/// Bad input is INVALID_ARGUMENT; unknown calls NOT_FOUND; a wrong secret PERMISSION_DENIED.
async fn ledger_input_is_validated(h: Backend) {
    let mut client = h.client().await;
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
async fn calls_carry_a_stable_idempotency_key(h: Backend) {
    let mut client = h.client().await;
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

/// Turn-scoped call ids: a model that reuses `call_0` in every turn runs it
/// again in a new turn, is refused within a turn, and (asked `across_turns`,
/// or naming no turn) is refused for any id already in the ledger; turns
/// survive a restart, and settling names the turn.
async fn a_reused_call_id_runs_in_a_new_turn_and_not_twice_in_one(h: Backend) {
    let mut client = h.client().await;
    let lease = lease_of(client.acquire(acquire("s", "w", 60_000)).await.unwrap());
    let in_turn = |turn: &str, across_turns: bool| pb::BeginToolCallsRequest {
        turn: turn.into(),
        across_turns,
        ..begin_batch(&lease, &["call_0"])
    };
    let first = client
        .begin_tool_calls(in_turn("t1", false))
        .await
        .unwrap()
        .into_inner();
    assert!(!first.duplicate);
    assert_eq!(first.calls[0].turn, "t1");
    let second = client
        .begin_tool_calls(in_turn("t2", false))
        .await
        .unwrap()
        .into_inner();
    assert!(!second.duplicate, "a new turn runs the reused id");
    assert_eq!(
        second.calls[0].idempotency_key,
        leasehold_core::ledger::idempotency_key_in_turn("s", "t2", "call_0")
    );
    assert_ne!(
        first.calls[0].idempotency_key, second.calls[0].idempotency_key,
        "each turn's call has its own idempotency key"
    );
    let again = client
        .begin_tool_calls(in_turn("t2", false))
        .await
        .unwrap()
        .into_inner();
    assert!(again.duplicate, "twice in one turn is refused");
    assert_eq!(again.duplicate_call_ids, ["call_0"]);
    assert_eq!(again.calls[0].turn, "t2");
    let across = client
        .begin_tool_calls(in_turn("t3", true))
        .await
        .unwrap()
        .into_inner();
    assert!(across.duplicate, "across_turns sees the earlier turns");
    assert_eq!(across.calls[0].turn, "t1", "the first declaration");
    let unscoped = client
        .begin_tool_call(begin(&lease, "call_0"))
        .await
        .unwrap()
        .into_inner();
    assert!(unscoped.duplicate, "no turn named: every turn counts");

    // Settling an id begun in two turns needs the turn.
    let ambiguous = client
        .settle_tool_call(settle(&lease, "call_0", pb::ToolCallState::Succeeded))
        .await
        .unwrap_err();
    assert_eq!(ambiguous.code(), Code::InvalidArgument);
    assert!(
        ambiguous.message().contains("several turns"),
        "{ambiguous:?}"
    );
    let missing = client
        .settle_tool_call(pb::SettleToolCallRequest {
            turn: "t9".into(),
            ..settle(&lease, "call_0", pb::ToolCallState::Succeeded)
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound, "{missing:?}");
    let settled = client
        .settle_tool_call(pb::SettleToolCallRequest {
            turn: "t1".into(),
            ..settle(&lease, "call_0", pb::ToolCallState::Succeeded)
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(settled.call.unwrap().turn, "t1");

    let h = h.restart().await;
    let mut client = h.client().await;
    let calls = list(&mut client, "s", false).await;
    let turns: Vec<(&str, i32)> = calls.iter().map(|c| (c.turn.as_str(), c.state)).collect();
    assert_eq!(
        turns,
        vec![
            ("t1", pb::ToolCallState::Succeeded as i32),
            ("t2", pb::ToolCallState::Running as i32)
        ]
    );
    let again = client
        .begin_tool_calls(in_turn("t2", false))
        .await
        .unwrap()
        .into_inner();
    assert!(again.duplicate, "still refused after a restart");
}

/// The tool-call ledger: begin all-or-none, the first settle wins, only
/// under the live term, and a recoverer learns of calls left running.
async fn the_ledger_records_settles_and_lists_under_the_live_term_only(h: Backend) {
    let mut c = h.client().await;
    let lease = lease_of(c.acquire(acquire("k", "a", 5_000)).await.unwrap());
    let begin_calls = |calls: Vec<pb::ToolCallSpec>| pb::BeginToolCallsRequest {
        key: "k".into(),
        fence: lease.fence,
        lease_id: lease.lease_id.clone(),
        calls,
        across_turns: Default::default(),
        turn: Default::default(),
    };
    let begun = c
        .begin_tool_calls(begin_calls(vec![spec("a"), spec("b"), spec("c")]))
        .await
        .unwrap()
        .into_inner();
    assert!(!begun.duplicate);
    let ids: Vec<_> = begun.calls.iter().map(|c| c.call_id.as_str()).collect();
    assert_eq!(ids, ["a", "b", "c"]);
    assert!(begun.calls.windows(2).all(|w| w[0].ordinal < w[1].ordinal));
    assert!(
        begun
            .calls
            .iter()
            .all(|c| c.state() == pb::ToolCallState::Running)
    );

    // A batch with a known id records nothing.
    let dup = c
        .begin_tool_calls(begin_calls(vec![spec("d"), spec("a")]))
        .await
        .unwrap()
        .into_inner();
    assert!(dup.duplicate);
    assert_eq!(dup.duplicate_call_ids, ["a"]);
    assert_eq!(dup.calls[0].call_id, "a");
    let dup = c
        .begin_tool_calls(begin_calls(vec![spec("e"), spec("e")]))
        .await
        .unwrap()
        .into_inner();
    assert!(dup.duplicate && dup.calls.is_empty());

    let first = c
        .settle_tool_call(settle(&lease, "a", pb::ToolCallState::Succeeded))
        .await
        .unwrap()
        .into_inner();
    assert!(!first.already_settled);
    let first = first.call.unwrap();
    assert_eq!(first.state(), pb::ToolCallState::Succeeded);
    assert_eq!(first.settled_fence, lease.fence);
    assert_eq!(first.result, b"ok");
    let second = c
        .settle_tool_call(settle(&lease, "a", pb::ToolCallState::Failed))
        .await
        .unwrap()
        .into_inner();
    assert!(second.already_settled);
    assert_eq!(second.call.unwrap(), first);
    let missing = c
        .settle_tool_call(settle(&lease, "zz", pb::ToolCallState::Failed))
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);

    let list = |filter| pb::ListToolCallsRequest {
        key: "k".into(),
        filter,
    };
    let all = c.list_tool_calls(list(2)).await.unwrap().into_inner().calls;
    let ids: Vec<_> = all.iter().map(|c| c.call_id.as_str()).collect();
    assert_eq!(ids, ["a", "b", "c"], "d was never recorded");
    let running = c.list_tool_calls(list(1)).await.unwrap().into_inner().calls;
    assert_eq!(running.len(), 2);

    // Only under the live term: after a suspend, settling is refused.
    c.release(release(&lease, true)).await.unwrap();
    let refused = c
        .settle_tool_call(settle(&lease, "b", pb::ToolCallState::Failed))
        .await
        .unwrap_err();
    assert!(matches!(
        stale_reason(&refused),
        StaleReason::Suspended { .. }
    ));
    let refused = c
        .begin_tool_calls(begin_calls(vec![spec("f")]))
        .await
        .unwrap_err();
    assert!(matches!(
        stale_reason(&refused),
        StaleReason::Suspended { .. }
    ));

    // The recoverer sees what was left running and settles it under its fence.
    let taken = c
        .acquire(acquire("k", "b", 5_000))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(taken.unsettled_tool_calls, 2);
    let next = taken.lease.unwrap();
    let settled = c
        .settle_tool_call(settle(&next, "b", pb::ToolCallState::Unknown))
        .await
        .unwrap()
        .into_inner()
        .call
        .unwrap();
    assert_eq!(settled.fence, lease.fence, "begun under the old term");
    assert_eq!(
        settled.settled_fence, next.fence,
        "settled under the new one"
    );
}
