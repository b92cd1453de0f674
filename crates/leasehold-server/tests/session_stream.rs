//! The Session stream with many operations in flight (pipelining), over real
//! gRPC on loopback: arrival order is the order of application, each
//! operation gets exactly one response with its id, a quick operation is not
//! held up behind a slow one, refusals carry the unary details, and the
//! client shares one stream among all its guards.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{TestServer, acquire, lease_of};
use leasehold_client::{Client, ClientError};
use leasehold_core::error::StaleReason;
use leasehold_core::lease::{Fence, Key, Owner};
use leasehold_wire::pb;
use leasehold_wire::pb::session_request::Op;
use leasehold_wire::status::from_refusal;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::Code;
use {leasehold_core::Error, leasehold_server::grpc::SESSION_WINDOW};

/// A raw Session stream: send without waiting, read responses as they come.
struct Pipe {
    tx: mpsc::UnboundedSender<pb::SessionRequest>,
    rx: tonic::Streaming<pb::SessionResponse>,
}

impl Pipe {
    async fn open(server: &TestServer) -> Pipe {
        let (tx, outbound) = mpsc::unbounded_channel();
        let rx = server
            .client()
            .await
            .session(UnboundedReceiverStream::new(outbound))
            .await
            .expect("open Session")
            .into_inner();
        Pipe { tx, rx }
    }

    fn send(&self, id: u64, op: Op) {
        self.tx
            .send(pb::SessionRequest { op: Some(op), id })
            .expect("stream open");
    }

    async fn next(&mut self) -> pb::SessionResponse {
        tokio::time::timeout(Duration::from_secs(10), self.rx.message())
            .await
            .expect("a response within 10 s")
            .expect("no stream error")
            .expect("stream not ended")
    }

    /// The next `n` responses, by id; each id must come exactly once.
    async fn collect(&mut self, n: usize) -> HashMap<u64, pb::SessionResponse> {
        let mut got = HashMap::new();
        for _ in 0..n {
            let response = self.next().await;
            let id = response.id;
            assert!(got.insert(id, response).is_none(), "id {id} answered twice");
        }
        got
    }
}

fn release(lease: &pb::Lease) -> Op {
    Op::Release(pb::ReleaseRequest {
        key: lease.key.clone(),
        fence: lease.fence,
        lease_id: lease.lease_id.clone(),
        suspend: false,
        ..Default::default()
    })
}

fn check(key: &str, fence: u64) -> Op {
    Op::Check(pb::CheckRequest {
        key: key.into(),
        fence,
    })
}

fn acquire_op(key: &str, owner: &str, wait_ms: u64) -> Op {
    let mut request = acquire(key, owner, 60_000);
    request.wait_ms = wait_ms;
    Op::Acquire(request)
}

/// Operations sent back to back are applied in the order sent, and a quick
/// one (Check) is answered while an earlier one (an Acquire waiting in line)
/// is still pending on the same stream.
#[tokio::test]
async fn pipelined_operations_apply_in_order_and_answer_as_they_complete() {
    let server = TestServer::start().await;
    let mut rpc = server.client().await;
    let first = lease_of(rpc.acquire(acquire("k", "a", 60_000)).await.unwrap());
    let mut pipe = Pipe::open(&server).await;

    // 1 waits in line behind `a`; 2 must not wait for it.
    pipe.send(1, acquire_op("k", "b", 30_000));
    pipe.send(2, check("k", first.fence));
    let quick = pipe.next().await;
    assert_eq!(quick.id, 2, "the Check was held up: {quick:?}");
    assert_eq!(quick.code, 0, "{quick:?}");
    // 3 releases `a`, which hands the key to 1.
    pipe.send(3, release(&first));
    let got = pipe.collect(2).await;
    assert_eq!(got[&3].code, 0, "{:?}", got[&3]);
    let second = got[&1].lease.clone().expect("1 was granted");
    assert_eq!(second.owner, "b");
    assert!(second.fence > first.fence);
    assert_eq!(got[&1].previous.as_ref().unwrap().fence, first.fence);

    // Back to back, without waiting: the release is applied before the
    // acquire after it, so the acquire (which does not wait) gets the key,
    // and the check after the release already sees the fence as stale.
    pipe.send(10, release(&second));
    pipe.send(11, check("k", second.fence));
    pipe.send(12, acquire_op("k", "c", 0));
    let got = pipe.collect(3).await;
    assert_eq!(got[&10].code, 0, "{:?}", got[&10]);
    assert_eq!(got[&11].code, Code::FailedPrecondition as i32);
    assert_eq!(got[&11].reason, "released");
    assert_eq!(got[&12].code, 0, "{:?}", got[&12]);
    let third = got[&12].lease.clone().unwrap();
    assert!(third.fence > second.fence);

    // Durable like the unary form.
    drop(pipe);
    drop(rpc);
    let server = server.restart().await;
    let got = server
        .client()
        .await
        .get(pb::GetRequest { key: "k".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.lease.unwrap().fence, third.fence);
}

/// A refusal over the stream carries the same details as the unary status,
/// so it turns back into the same domain error.
#[tokio::test]
async fn refusals_carry_the_unary_details() {
    let server = TestServer::start().await;
    let mut rpc = server.client().await;
    let held = lease_of(rpc.acquire(acquire("k", "holder-ä", 60_000)).await.unwrap());
    let mut pipe = Pipe::open(&server).await;
    pipe.send(1, acquire_op("k", "other", 0));
    pipe.send(2, release(&held));
    pipe.send(3, check("k", held.fence));
    let got = pipe.collect(3).await;
    let busy = &got[&1];
    assert_eq!(busy.code, Code::Aborted as i32);
    assert_eq!(
        from_refusal(busy.code, &busy.message, &busy.details),
        Error::Busy {
            key: Key::parse("k").unwrap(),
            holder: Owner::parse("holder-ä").unwrap(),
            fence: Fence(held.fence),
            remaining_ms: 60_000,
        }
    );
    let stale = &got[&3];
    let Error::StaleFence { key, fence, reason } =
        from_refusal(stale.code, &stale.message, &stale.details)
    else {
        panic!("not a stale fence: {stale:?}");
    };
    assert_eq!((key.as_str(), fence), ("k", Fence(held.fence)));
    assert!(matches!(reason, StaleReason::Released { .. }), "{reason:?}");

    // The unary status of the same refusal says the same.
    let status = rpc
        .check(pb::CheckRequest {
            key: "k".into(),
            fence: held.fence,
        })
        .await
        .unwrap_err();
    assert_eq!(
        leasehold_wire::status::from_status(&status),
        from_refusal(stale.code, &stale.message, &stale.details)
    );
}

/// Far more operations than the window, all sent before any response is
/// read: the server applies backpressure instead of failing, and every
/// operation is answered exactly once, correctly.
#[tokio::test]
async fn more_operations_than_the_window_are_all_answered() {
    let server = TestServer::start().await;
    let mut rpc = server.client().await;
    let held = lease_of(rpc.acquire(acquire("k", "a", 60_000)).await.unwrap());
    let mut pipe = Pipe::open(&server).await;
    let n = 3 * SESSION_WINDOW as u64;
    for id in 0..n {
        // Even ids present the live fence, odd ones a stale one.
        let fence = if id % 2 == 0 {
            held.fence
        } else {
            held.fence + 1
        };
        pipe.send(id, check("k", fence));
    }
    let got = pipe.collect(n as usize).await;
    assert_eq!(got.len() as u64, n);
    for (id, response) in &got {
        if id % 2 == 0 {
            assert_eq!(response.code, 0, "{response:?}");
        } else {
            assert_eq!(response.code, Code::FailedPrecondition as i32);
            assert_eq!(response.reason, "unknown");
        }
    }
}

/// A client half-closes with operations still in flight: each is still
/// answered (the release is committed), then the stream ends.
#[tokio::test]
async fn half_close_drains_in_flight_operations() {
    let server = TestServer::start().await;
    let mut rpc = server.client().await;
    let held = lease_of(rpc.acquire(acquire("k", "a", 60_000)).await.unwrap());
    let Pipe { tx, mut rx } = Pipe::open(&server).await;
    tx.send(pb::SessionRequest {
        op: Some(release(&held)),
        id: 5,
    })
    .unwrap();
    drop(tx);
    let response = rx.message().await.unwrap().expect("answered");
    assert_eq!((response.id, response.code), (5, 0));
    assert!(rx.message().await.unwrap().is_none(), "the stream ends");
    let got = rpc
        .get(pb::GetRequest { key: "k".into() })
        .await
        .unwrap()
        .into_inner();
    assert!(got.lease.is_none());
    assert_eq!(got.last_ended.unwrap().fence, held.fence);
}

/// One client, many guards, many concurrent checks: all travel over the
/// client's one stream, and each gets its own answer (a stale fence is
/// refused with its reason while the live ones pass).
#[tokio::test]
async fn one_client_multiplexes_many_guards() {
    let server = TestServer::start().await;
    let client = Client::connect(format!("http://{}", server.addr))
        .await
        .unwrap();
    let mut guards = Vec::new();
    for i in 0..16 {
        let guard = client
            .acquire(format!("s/{i}"))
            .ttl(Duration::from_secs(30))
            .await
            .unwrap();
        guards.push(guard);
    }
    // End the last guard's term behind its back: its fence goes stale.
    let last = guards.pop().unwrap();
    let (last_key, last_fence) = (last.key().clone(), last.fence());
    last.release().await.unwrap();

    let mut tasks = tokio::task::JoinSet::new();
    for guard in guards {
        let client = client.clone();
        tasks.spawn(async move {
            for _ in 0..50 {
                guard.verify().await.expect("live guard verifies");
                let lease = client
                    .check(guard.key(), guard.fence(), Duration::from_secs(5))
                    .await
                    .expect("live fence checks");
                assert_eq!(lease.fence, guard.fence());
            }
            guard.release().await.expect("release over the stream");
        });
    }
    for _ in 0..50 {
        let err = client
            .check(&last_key, last_fence, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(
            matches!(
                &err,
                ClientError::Server(Error::StaleFence {
                    reason: StaleReason::Released { .. },
                    ..
                })
            ),
            "{err:?}"
        );
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("task");
    }
    // Every release went through: all keys are free again.
    for i in 0..15 {
        let got = client
            .rpc()
            .get(pb::GetRequest {
                key: format!("s/{i}"),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(got.lease.is_none(), "s/{i} still held");
    }
}

fn begin_calls(lease: &pb::Lease, ids: &[&str]) -> Op {
    Op::BeginToolCalls(pb::BeginToolCallsRequest {
        key: lease.key.clone(),
        fence: lease.fence,
        lease_id: lease.lease_id.clone(),
        calls: ids
            .iter()
            .map(|id| pb::ToolCallSpec {
                call_id: (*id).into(),
                name: "shell".into(),
                input_digest: "sha256:abc".into(),
            })
            .collect(),
        ..Default::default()
    })
}

fn settle_call(lease: &pb::Lease, call_id: &str, outcome: pb::ToolCallState) -> Op {
    Op::SettleToolCall(pb::SettleToolCallRequest {
        key: lease.key.clone(),
        fence: lease.fence,
        lease_id: lease.lease_id.clone(),
        call_id: call_id.into(),
        outcome: outcome as i32,
        result: b"ok".to_vec(),
        ..Default::default()
    })
}

fn begun(response: &pb::SessionResponse) -> &pb::BeginToolCallsResponse {
    match &response.ledger {
        Some(pb::session_response::Ledger::BeginToolCalls(begun)) => begun,
        _ => panic!("no BeginToolCalls reply: {response:?}"),
    }
}

fn settled(response: &pb::SessionResponse) -> &pb::SettleToolCallResponse {
    match &response.ledger {
        Some(pb::session_response::Ledger::SettleToolCall(settled)) => settled,
        _ => panic!("no SettleToolCall reply: {response:?}"),
    }
}

/// BeginToolCalls and SettleToolCall on the stream answer as the unary RPCs
/// do: new calls recorded, a known id a duplicate with nothing recorded, the
/// first settle wins, each committed before its reply and kept across a
/// restart.
#[tokio::test]
async fn the_ledger_over_the_stream_records_and_settles_as_the_unary_rpcs() {
    let server = TestServer::start().await;
    let mut rpc = server.client().await;
    let held = lease_of(rpc.acquire(acquire("k", "a", 60_000)).await.unwrap());
    let mut pipe = Pipe::open(&server).await;

    let before = server.engine.commits();
    pipe.send(1, begin_calls(&held, &["c1", "c2"]));
    let first = pipe.next().await;
    assert_eq!((first.id, first.code), (1, 0), "{first:?}");
    assert!(server.engine.commits() > before, "begun before committed");
    let reply = begun(&first);
    assert!(!reply.duplicate);
    let ids: Vec<_> = reply.calls.iter().map(|c| c.call_id.as_str()).collect();
    assert_eq!(ids, ["c1", "c2"]);
    assert!(reply.calls.iter().all(|c| c.fence == held.fence));
    assert!(
        reply
            .calls
            .iter()
            .all(|c| c.state == pb::ToolCallState::Running as i32)
    );

    // All or nothing, as unary: one known id records none of the batch.
    pipe.send(2, begin_calls(&held, &["c3", "c1"]));
    let again = pipe.next().await;
    assert_eq!(again.code, 0, "{again:?}");
    let reply = begun(&again);
    assert!(reply.duplicate);
    assert_eq!(reply.duplicate_call_ids, ["c1"]);
    assert_eq!(reply.calls.len(), 1);
    assert_eq!(reply.calls[0].call_id, "c1");

    let before = server.engine.commits();
    pipe.send(3, settle_call(&held, "c1", pb::ToolCallState::Succeeded));
    let won = pipe.next().await;
    assert_eq!((won.id, won.code), (3, 0), "{won:?}");
    assert!(server.engine.commits() > before, "settled before committed");
    let reply = settled(&won);
    assert!(!reply.already_settled);
    let call = reply.call.as_ref().unwrap();
    assert_eq!(call.state, pb::ToolCallState::Succeeded as i32);
    assert_eq!(
        (call.settled_fence, call.result.as_slice()),
        (held.fence, &b"ok"[..])
    );

    // The first terminal outcome wins.
    pipe.send(4, settle_call(&held, "c1", pb::ToolCallState::Failed));
    let lost = pipe.next().await;
    let reply = settled(&lost);
    assert!(reply.already_settled);
    assert_eq!(
        reply.call.as_ref().unwrap().state,
        pb::ToolCallState::Succeeded as i32
    );

    drop(pipe);
    drop(rpc);
    let server = server.restart().await;
    let calls = server
        .client()
        .await
        .list_tool_calls(pb::ListToolCallsRequest {
            key: "k".into(),
            filter: 0,
        })
        .await
        .unwrap()
        .into_inner()
        .calls;
    let states: Vec<_> = calls
        .iter()
        .map(|c| (c.call_id.as_str(), c.state))
        .collect();
    assert_eq!(
        states,
        [
            ("c1", pb::ToolCallState::Succeeded as i32),
            ("c2", pb::ToolCallState::Running as i32)
        ]
    );
}

/// Each ledger refusal on the stream is the unary call's refusal (same code
/// and the same domain error), answered in the stream, which stays open.
#[tokio::test]
async fn ledger_refusals_on_the_stream_are_the_unary_ones_and_keep_it_open() {
    let server = TestServer::start().await;
    let mut rpc = server.client().await;
    let held = lease_of(rpc.acquire(acquire("k", "a", 60_000)).await.unwrap());
    let mut pipe = Pipe::open(&server).await;
    pipe.send(1, begin_calls(&held, &["c"]));
    assert_eq!(pipe.next().await.code, 0);

    let mut forged = held.clone();
    forged.lease_id = uuid::Uuid::new_v4().to_string();
    let mut stale = held.clone();
    stale.fence += 1;
    let mut too_big = settle_call(&held, "c", pb::ToolCallState::Succeeded);
    if let Op::SettleToolCall(r) = &mut too_big {
        r.result = vec![0; 64 * 1024 + 1];
    }
    let cases: Vec<(&str, Op, Code)> = vec![
        (
            "empty batch",
            begin_calls(&held, &[]),
            Code::InvalidArgument,
        ),
        (
            "bad call id",
            begin_calls(&held, &["bad\nid"]),
            Code::InvalidArgument,
        ),
        (
            "running is no outcome",
            settle_call(&held, "c", pb::ToolCallState::Running),
            Code::InvalidArgument,
        ),
        ("result too big", too_big, Code::InvalidArgument),
        (
            "unknown call",
            settle_call(&held, "nope", pb::ToolCallState::Failed),
            Code::NotFound,
        ),
        (
            "forged lease id",
            begin_calls(&forged, &["d"]),
            Code::PermissionDenied,
        ),
        (
            "forged settle",
            settle_call(&forged, "c", pb::ToolCallState::Failed),
            Code::PermissionDenied,
        ),
        (
            "stale fence",
            begin_calls(&stale, &["d"]),
            Code::FailedPrecondition,
        ),
    ];
    for (i, (what, op, code)) in cases.into_iter().enumerate() {
        let id = 10 + i as u64;
        pipe.send(id, op.clone());
        let refused = pipe.next().await;
        assert_eq!(
            (refused.id, refused.code),
            (id, code as i32),
            "{what}: {refused:?}"
        );
        assert!(refused.ledger.is_none(), "{what}: {refused:?}");
        let unary = match op {
            Op::BeginToolCalls(r) => rpc.begin_tool_calls(r).await.map(|_| ()),
            Op::SettleToolCall(r) => rpc.settle_tool_call(r).await.map(|_| ()),
            _ => unreachable!(),
        }
        .unwrap_err();
        assert_eq!(
            from_refusal(refused.code, &refused.message, &refused.details),
            leasehold_wire::status::from_status(&unary),
            "{what}"
        );
    }

    // A term ended: its fence is refused with the reason, stream still open.
    pipe.send(30, release(&held));
    assert_eq!(pipe.next().await.code, 0);
    pipe.send(31, settle_call(&held, "c", pb::ToolCallState::Unknown));
    let late = pipe.next().await;
    assert_eq!(late.code, Code::FailedPrecondition as i32, "{late:?}");
    assert_eq!(late.reason, "released");
    pipe.send(32, check("k", held.fence));
    assert_eq!(pipe.next().await.id, 32, "the stream is still open");
    // Nothing refused was recorded.
    let calls = rpc
        .list_tool_calls(pb::ListToolCallsRequest {
            key: "k".into(),
            filter: 0,
        })
        .await
        .unwrap()
        .into_inner()
        .calls;
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].state, pb::ToolCallState::Running as i32);
}
