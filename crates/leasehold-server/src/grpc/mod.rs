//! The gRPC face of the engine: translates requests and replies, nothing else.

pub mod transcripts;

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::Stream;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use tonic::{Request, Response, Status, Streaming};

use crate::engine::Engine;
use leasehold_core::error::Error;
use leasehold_core::ledger::BeginOutcome;
use leasehold_wire::pb;
use leasehold_wire::pb::leasehold_server::Leasehold;
use leasehold_wire::{convert, status};

/// The `leasehold.v1.Leasehold` service.
#[derive(Debug, Clone)]
pub struct LeaseholdService {
    engine: Engine,
}

impl LeaseholdService {
    /// Serves leases from `engine`.
    pub fn new(engine: Engine) -> Self {
        LeaseholdService { engine }
    }
}

type Reply<T> = Result<Response<T>, Status>;

fn reply<T>(result: Result<T, Error>) -> Reply<T> {
    result.map(Response::new).map_err(status::to_status)
}

#[tonic::async_trait]
impl Leasehold for LeaseholdService {
    async fn acquire(&self, request: Request<pb::AcquireRequest>) -> Reply<pb::AcquireResponse> {
        let r = request.into_inner();
        let grant = self.engine.acquire(convert::acquire_request(r)).await;
        reply(grant.map(|g| convert::acquire_response(&g)))
    }

    async fn renew(&self, request: Request<pb::RenewRequest>) -> Reply<pb::RenewResponse> {
        let r = request.into_inner();
        let term = self
            .engine
            .renew(&r.key, r.fence, &r.lease_id, r.ttl_ms)
            .await;
        reply(term.map(|t| pb::RenewResponse {
            lease: Some(convert::lease(&r.key, &t, true)),
        }))
    }

    async fn release(&self, request: Request<pb::ReleaseRequest>) -> Reply<pb::ReleaseResponse> {
        let r = request.into_inner();
        let ended = self
            .engine
            .release(&r.key, r.fence, &r.lease_id, r.suspend)
            .await;
        reply(ended.map(|e| pb::ReleaseResponse {
            ended: Some(convert::ended(&e)),
        }))
    }

    async fn check(&self, request: Request<pb::CheckRequest>) -> Reply<pb::CheckResponse> {
        let r = request.into_inner();
        let term = self.engine.check(&r.key, r.fence).await;
        reply(term.map(|t| pb::CheckResponse {
            lease: Some(convert::lease(&r.key, &t, false)),
        }))
    }

    async fn get(&self, request: Request<pb::GetRequest>) -> Reply<pb::GetResponse> {
        let r = request.into_inner();
        let view = self.engine.get(&r.key).await;
        reply(view.map(|v| {
            let state = convert::key_state(&v);
            pb::GetResponse {
                lease: state.lease,
                last_ended: state.last_ended,
                recoverable: state.recoverable,
            }
        }))
    }

    async fn list(&self, request: Request<pb::ListRequest>) -> Reply<pb::ListResponse> {
        let r = request.into_inner();
        let after = if r.page_token.is_empty() {
            None
        } else {
            Some(convert::parse_page_token(&r.page_token).ok_or_else(|| {
                status::to_status(Error::InvalidArgument("malformed page_token".into()))
            })?)
        };
        let page = self
            .engine
            .list(
                &r.prefix,
                convert::list_filter(r.filter),
                after.as_deref(),
                r.page_size as usize,
            )
            .await;
        reply(page.map(|p| {
            pb::ListResponse {
                keys: p.keys.iter().map(convert::key_state).collect(),
                next_page_token: p
                    .next_after
                    .as_deref()
                    .map(convert::page_token)
                    .unwrap_or_default(),
            }
        }))
    }

    async fn begin_tool_call(
        &self,
        request: Request<pb::BeginToolCallRequest>,
    ) -> Reply<pb::BeginToolCallResponse> {
        let r = request.into_inner();
        let spec = pb::ToolCallSpec {
            call_id: r.call_id,
            name: r.name,
            input_digest: r.input_digest,
        };
        let outcome = self
            .engine
            .begin_tool_calls(&r.key, r.fence, &r.lease_id, vec![convert::call_spec(spec)])
            .await;
        reply(outcome.map(|outcome| {
            let (calls, duplicate) = match outcome {
                BeginOutcome::Recorded(calls) => (calls, false),
                BeginOutcome::Duplicate { existing, .. } => (existing, true),
            };
            pb::BeginToolCallResponse {
                call: calls.first().map(|c| convert::tool_call(&r.key, c)),
                duplicate,
            }
        }))
    }

    async fn begin_tool_calls(
        &self,
        request: Request<pb::BeginToolCallsRequest>,
    ) -> Reply<pb::BeginToolCallsResponse> {
        let r = request.into_inner();
        let specs = r.calls.into_iter().map(convert::call_spec).collect();
        let outcome = self
            .engine
            .begin_tool_calls(&r.key, r.fence, &r.lease_id, specs)
            .await;
        reply(outcome.map(|outcome| {
            match outcome {
                BeginOutcome::Recorded(calls) => pb::BeginToolCallsResponse {
                    calls: calls
                        .iter()
                        .map(|c| convert::tool_call(&r.key, c))
                        .collect(),
                    duplicate: false,
                    duplicate_call_ids: Vec::new(),
                },
                BeginOutcome::Duplicate { ids, existing } => pb::BeginToolCallsResponse {
                    calls: existing
                        .iter()
                        .map(|c| convert::tool_call(&r.key, c))
                        .collect(),
                    duplicate: true,
                    duplicate_call_ids: ids,
                },
            }
        }))
    }

    async fn settle_tool_call(
        &self,
        request: Request<pb::SettleToolCallRequest>,
    ) -> Reply<pb::SettleToolCallResponse> {
        let r = request.into_inner();
        let key = r.key.clone();
        let (fence, lease_id) = (r.fence, r.lease_id.clone());
        let settlement = convert::settlement(r).map_err(status::to_status)?;
        let settled = self
            .engine
            .settle_tool_call(&key, fence, &lease_id, settlement)
            .await;
        reply(settled.map(|(call, already)| pb::SettleToolCallResponse {
            call: Some(convert::tool_call(&key, &call)),
            already_settled: already,
        }))
    }

    async fn list_tool_calls(
        &self,
        request: Request<pb::ListToolCallsRequest>,
    ) -> Reply<pb::ListToolCallsResponse> {
        let r = request.into_inner();
        let calls = self
            .engine
            .list_tool_calls(&r.key, convert::call_filter(r.filter))
            .await;
        reply(calls.map(|calls| {
            pb::ListToolCallsResponse {
                calls: calls
                    .iter()
                    .map(|c| convert::tool_call(&r.key, c))
                    .collect(),
            }
        }))
    }

    type SessionStream = SessionPipe;

    async fn session(
        &self,
        request: Request<Streaming<pb::SessionRequest>>,
    ) -> Reply<Self::SessionStream> {
        Ok(Response::new(SessionPipe {
            engine: self.engine.clone(),
            inbound: Some(request.into_inner()),
            pending: FuturesUnordered::new(),
        }))
    }
}

/// At most this many operations are in flight on one Session stream; beyond
/// it the stream is not read until some complete (backpressure).
pub const SESSION_WINDOW: usize = 1024;

/// The response side of one Session stream: reads operations in order,
/// applies each to the engine as it arrives (the engine applies at call
/// time), and yields each response as soon as its operation completes.
///
/// It is polled by tonic's response encoder, which keeps polling while
/// responses are ready and sends them in one write: under load, one read and
/// one write carry many operations.
pub struct SessionPipe {
    engine: Engine,
    /// `None` once the client half-closed (or its stream failed).
    inbound: Option<Streaming<pb::SessionRequest>>,
    pending: FuturesUnordered<BoxFuture<'static, pb::SessionResponse>>,
}

impl Stream for SessionPipe {
    type Item = Result<pb::SessionResponse, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        while this.pending.len() < SESSION_WINDOW {
            let Some(inbound) = this.inbound.as_mut() else {
                break;
            };
            match Pin::new(inbound).poll_next(cx) {
                Poll::Ready(Some(Ok(message))) => {
                    this.pending.push(session_step(&this.engine, message));
                }
                Poll::Ready(Some(Err(status))) => {
                    this.inbound = None;
                    return Poll::Ready(Some(Err(status)));
                }
                Poll::Ready(None) => this.inbound = None,
                Poll::Pending => break,
            }
        }
        match Pin::new(&mut this.pending).poll_next(cx) {
            Poll::Ready(Some(response)) => Poll::Ready(Some(Ok(response))),
            Poll::Ready(None) if this.inbound.is_none() => Poll::Ready(None),
            _ => Poll::Pending,
        }
    }
}

/// One operation of a Session stream, applied now; the future yields its
/// response (a refusal travels in the response).
fn session_step(
    engine: &Engine,
    message: pb::SessionRequest,
) -> BoxFuture<'static, pb::SessionResponse> {
    use pb::session_request::Op;
    let id = message.id;
    match message.op {
        Some(Op::Renew(r)) => {
            let renewed = engine.renew(&r.key, r.fence, &r.lease_id, r.ttl_ms);
            respond(id, renewed, move |t| pb::SessionResponse {
                lease: Some(convert::lease(&r.key, &t, true)),
                ..Default::default()
            })
        }
        Some(Op::Check(r)) => {
            let checked = engine.check(&r.key, r.fence);
            respond(id, checked, move |t| pb::SessionResponse {
                lease: Some(convert::lease(&r.key, &t, false)),
                ..Default::default()
            })
        }
        Some(Op::Acquire(r)) => {
            let granted = engine.acquire(convert::acquire_request(r));
            respond(id, granted, |g| {
                let acquired = convert::acquire_response(&g);
                pb::SessionResponse {
                    lease: acquired.lease,
                    previous: acquired.previous,
                    replayed: acquired.replayed,
                    unsettled_tool_calls: acquired.unsettled_tool_calls,
                    ..Default::default()
                }
            })
        }
        Some(Op::Release(r)) => {
            let released = engine.release(&r.key, r.fence, &r.lease_id, r.suspend);
            respond(id, released, |e| pb::SessionResponse {
                ended: Some(convert::ended(&e)),
                ..Default::default()
            })
        }
        None => {
            let refused = Err(Error::InvalidArgument("empty Session request".into()));
            Box::pin(std::future::ready(answer(id, refused)))
        }
    }
}

/// The future of operation `id`: waits for `outcome`, then shapes the
/// response with `to_response` (or the refusal).
fn respond<T>(
    id: u64,
    outcome: impl Future<Output = Result<T, Error>> + Send + 'static,
    to_response: impl FnOnce(T) -> pb::SessionResponse + Send + 'static,
) -> BoxFuture<'static, pb::SessionResponse> {
    Box::pin(async move { answer(id, outcome.await.map(to_response)) })
}

/// The response to operation `id`: its result, or its refusal.
fn answer(id: u64, result: Result<pb::SessionResponse, Error>) -> pb::SessionResponse {
    match result {
        Ok(response) => pb::SessionResponse { id, ..response },
        Err(err) => {
            let refusal = status::to_refusal(err);
            pb::SessionResponse {
                id,
                code: refusal.code,
                message: refusal.message,
                reason: refusal.reason,
                details: refusal.details,
                ..Default::default()
            }
        }
    }
}
