//! The gRPC face of a [`Backend`]: parses requests into domain values once,
//! shapes replies, nothing else.

pub mod transcripts;

mod oversize;

pub use oversize::OversizeIsExhausted;

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::Stream;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use tonic::{Request, Response, Status, Streaming};

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::auth::{AuthConfig, Caller, Principal, Right, subject_name};
use crate::backend::Backend;
use crate::limits::{Gate, KeyReservation, Limits, Slot, caller_name};
use crate::metrics::ServiceMetrics;
use leasehold_core::error::Error;
use leasehold_core::events::Selector;
use leasehold_core::lease::{Fence, Key, Ttl};
use leasehold_core::ledger::{BeginOutcome, ToolCall};
use leasehold_core::lessor::Acquire;
use leasehold_wire::pb;
use leasehold_wire::pb::leasehold_server::Leasehold;
use leasehold_wire::{convert, status};

/// The `leasehold.v1.Leasehold` service.
#[derive(Clone)]
pub struct LeaseholdService {
    backend: Arc<dyn Backend>,
    metrics: Arc<ServiceMetrics>,
    /// Who may do what; `None` serves everyone (loopback, or --insecure).
    auth: Option<Arc<AuthConfig>>,
    /// Limits against greedy clients.
    gate: Arc<Gate>,
}

impl std::fmt::Debug for LeaseholdService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseholdService").finish_non_exhaustive()
    }
}

impl LeaseholdService {
    /// Serves leases from `backend`.
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        Self::with_metrics(backend, Arc::default())
    }

    /// Serves leases from `backend`, recording request latency and refusals
    /// in `metrics`.
    pub fn with_metrics(backend: Arc<dyn Backend>, metrics: Arc<ServiceMetrics>) -> Self {
        LeaseholdService {
            backend,
            metrics,
            auth: None,
            gate: Gate::new(Limits::default()),
        }
    }

    /// Enforces `limits` (per connection and per caller).
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.gate = Gate::new(limits);
        self
    }

    /// Checks every request against `auth`'s principals and scopes.
    pub fn with_auth(mut self, auth: Arc<AuthConfig>) -> Self {
        self.auth = Some(auth);
        self
    }

    /// The principal making `request`, when auth is on.
    /// Also takes one operation from the caller's rate budget.
    fn caller<T>(&self, rpc: &'static str, request: &Request<T>) -> Result<Option<Caller>, Status> {
        let refuse = |err: Error| {
            self.metrics.record(rpc, Duration::ZERO, Some(&err));
            status::to_status(err)
        };
        let principal = match &self.auth {
            None => None,
            Some(auth) => Some(identify(auth, request).map_err(refuse)?),
        };
        if self.gate.limits().ops_per_second > 0 {
            let name = caller_name(
                principal.as_ref().map(|p| p.name.as_str()),
                request.remote_addr(),
            );
            self.gate.take_op(&name).map_err(refuse)?;
        }
        Ok(principal)
    }

    /// A slot for a waiting Acquire on the caller's connection, held while
    /// it waits (none for an Acquire that does not wait).
    fn wait_slot(
        &self,
        rpc: &'static str,
        acquire: &Acquire,
        peer: Option<std::net::SocketAddr>,
    ) -> Result<Option<Slot>, Status> {
        if acquire.wait.as_millis() == 0 {
            return Ok(None);
        }
        self.gate.wait_slot(peer).map_err(|err| {
            self.metrics.record(rpc, Duration::ZERO, Some(&err));
            status::to_status(err)
        })
    }

    /// Counts an Acquire of `key` against its principal's
    /// `keys_per_principal` until it is answered (nothing without auth).
    fn reserve_key(
        &self,
        rpc: &'static str,
        who: Option<&Principal>,
        key: &Key,
    ) -> Result<Option<KeyReservation>, Status> {
        let Some(who) = who else {
            return Ok(None);
        };
        self.gate.reserve_key(&who.name, key).map_err(|err| {
            self.metrics.record(rpc, Duration::ZERO, Some(&err));
            status::to_status(err)
        })
    }

    /// `Ok` when `who` (if auth is on) holds `right` on `key`.
    fn authorize(
        &self,
        rpc: &'static str,
        who: Option<&Principal>,
        right: Right,
        key: &str,
    ) -> Result<(), Status> {
        let Some(who) = who else {
            return Ok(());
        };
        who.allow(right, key).map_err(|err| {
            self.metrics.record(rpc, Duration::ZERO, Some(&err));
            status::to_status(err)
        })
    }

    /// Parses a request field; a malformed one is refused (and counted)
    /// before the backend sees anything.
    fn parsed<T, E: Into<Error>>(
        &self,
        rpc: &'static str,
        value: Result<T, E>,
    ) -> Result<T, Status> {
        value.map_err(|err| {
            let err = err.into();
            self.metrics.record(rpc, Duration::ZERO, Some(&err));
            status::to_status(err)
        })
    }

    /// Awaits the backend's answer to `rpc`, recording its latency and
    /// refusal.
    async fn timed<T>(
        &self,
        rpc: &'static str,
        work: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        let started = Instant::now();
        let result = work.await;
        self.metrics
            .record(rpc, started.elapsed(), result.as_ref().err());
        result
    }
}

type Reply<T> = Result<Response<T>, Status>;

/// The reply to BeginToolCalls (unary or on the Session stream).
fn begun_response(key: &Key, outcome: BeginOutcome) -> pb::BeginToolCallsResponse {
    match outcome {
        BeginOutcome::Recorded(calls) => pb::BeginToolCallsResponse {
            calls: calls.iter().map(|c| convert::tool_call(key, c)).collect(),
            duplicate: false,
            duplicate_call_ids: Vec::new(),
        },
        BeginOutcome::Duplicate { ids, existing } => pb::BeginToolCallsResponse {
            calls: existing
                .iter()
                .map(|c| convert::tool_call(key, c))
                .collect(),
            duplicate: true,
            duplicate_call_ids: ids,
        },
    }
}

/// The reply to SettleToolCall (unary or on the Session stream): the winning
/// record, and whether an earlier settle had won.
fn settled_response(key: &Key, (call, already): (ToolCall, bool)) -> pb::SettleToolCallResponse {
    pb::SettleToolCallResponse {
        call: Some(convert::tool_call(key, &call)),
        already_settled: already,
    }
}

fn reply<T>(result: Result<T, Error>) -> Reply<T> {
    result.map(Response::new).map_err(status::to_status)
}

#[tonic::async_trait]
impl Leasehold for LeaseholdService {
    async fn acquire(&self, request: Request<pb::AcquireRequest>) -> Reply<pb::AcquireResponse> {
        let who = self.caller("Acquire", &request)?;
        let peer = request.remote_addr();
        let acquire = self.parsed("Acquire", convert::acquire(request.into_inner()))?;
        let _waiting = self.wait_slot("Acquire", &acquire, peer)?;
        self.authorize("Acquire", who.as_deref(), Right::Hold, acquire.key.as_str())?;
        if acquire.options.force {
            // Overriding a quarantine is an operator's decision.
            self.authorize(
                "Acquire",
                who.as_deref(),
                Right::Admin,
                acquire.key.as_str(),
            )?;
        }
        if let Some(who) = &who {
            self.parsed("Acquire", who.allow_owner(acquire.owner.as_str()))?;
        }
        let reservation = self.reserve_key("Acquire", who.as_deref(), &acquire.key)?;
        let grant = self.timed("Acquire", self.backend.acquire(acquire)).await;
        if let (Ok(g), Some(reservation)) = (&grant, reservation) {
            reservation.granted(&g.key, &g.term);
        }
        reply(grant.map(|g| convert::acquire_response(&g)))
    }

    async fn renew(&self, request: Request<pb::RenewRequest>) -> Reply<pb::RenewResponse> {
        let who = self.caller("Renew", &request)?;
        let r = request.into_inner();
        let (key, lease_id) = self.parsed("Renew", convert::held(r.key, &r.lease_id))?;
        self.authorize("Renew", who.as_deref(), Right::Hold, key.as_str())?;
        let ttl = self.parsed("Renew", Ttl::parse_optional(r.ttl_ms))?;
        let term = self
            .timed(
                "Renew",
                self.backend.renew(&key, Fence(r.fence), lease_id, ttl),
            )
            .await;
        if let (Ok(t), Some(_)) = (&term, &who) {
            self.gate.renewed(&key, t);
        }
        reply(term.map(|t| pb::RenewResponse {
            lease: Some(convert::lease(&key, &t, true)),
        }))
    }

    async fn release(&self, request: Request<pb::ReleaseRequest>) -> Reply<pb::ReleaseResponse> {
        let who = self.caller("Release", &request)?;
        let r = request.into_inner();
        let (key, lease_id) = self.parsed("Release", convert::held(r.key, &r.lease_id))?;
        self.authorize("Release", who.as_deref(), Right::Hold, key.as_str())?;
        let handoff = self.parsed("Release", convert::handoff(r.successor, r.handoff_ms))?;
        let ended = self
            .timed(
                "Release",
                self.backend
                    .release(&key, Fence(r.fence), lease_id, r.suspend, handoff),
            )
            .await;
        if let (Ok(e), Some(_)) = (&ended, &who) {
            self.gate.released(&key, e.fence);
        }
        reply(ended.map(|e| pb::ReleaseResponse {
            ended: Some(convert::ended(&e)),
        }))
    }

    async fn check(&self, request: Request<pb::CheckRequest>) -> Reply<pb::CheckResponse> {
        let who = self.caller("Check", &request)?;
        let r = request.into_inner();
        let key = self.parsed("Check", Key::parse(r.key))?;
        self.authorize("Check", who.as_deref(), Right::Check, key.as_str())?;
        let term = self
            .timed("Check", self.backend.check(&key, Fence(r.fence)))
            .await;
        reply(term.map(|t| pb::CheckResponse {
            lease: Some(convert::lease(&key, &t, false)),
        }))
    }

    async fn get(&self, request: Request<pb::GetRequest>) -> Reply<pb::GetResponse> {
        let who = self.caller("Get", &request)?;
        let key = self.parsed("Get", Key::parse(request.into_inner().key))?;
        self.authorize("Get", who.as_deref(), Right::Read, key.as_str())?;
        let view = self.timed("Get", self.backend.get(&key)).await;
        reply(view.map(|v| {
            let state = convert::key_state(&v);
            pb::GetResponse {
                lease: state.lease,
                last_ended: state.last_ended,
                recoverable: state.recoverable,
                quarantined: state.quarantined,
                reservation: state.reservation,
            }
        }))
    }

    async fn list(&self, request: Request<pb::ListRequest>) -> Reply<pb::ListResponse> {
        let who = self.caller("List", &request)?;
        let r = request.into_inner();
        let after = self.parsed("List", convert::parse_page_token(&r.page_token))?;
        let page = self
            .timed(
                "List",
                self.backend.list(
                    &r.prefix,
                    convert::list_filter(r.filter),
                    after.as_ref(),
                    r.page_size as usize,
                ),
            )
            .await;
        // Only the keys the caller may read; a page may come back short.
        let page = page.map(|mut p| {
            if let Some(who) = &who {
                p.keys.retain(|k| who.can(Right::Read, k.key.as_str()));
            }
            p
        });
        reply(page.map(|p| {
            pb::ListResponse {
                keys: p.keys.iter().map(convert::key_state).collect(),
                next_page_token: p
                    .next_after
                    .as_ref()
                    .map(convert::page_token)
                    .unwrap_or_default(),
            }
        }))
    }

    async fn history(&self, request: Request<pb::HistoryRequest>) -> Reply<pb::HistoryResponse> {
        let who = self.caller("History", &request)?;
        let r = request.into_inner();
        let key = self.parsed("History", Key::parse(r.key))?;
        self.authorize("History", who.as_deref(), Right::Read, key.as_str())?;
        let before = self.parsed("History", convert::history_token(&r.page_token))?;
        let page = self
            .timed(
                "History",
                self.backend.history(&key, before, r.page_size as usize),
            )
            .await;
        reply(page.map(|p| convert::history_response(&p)))
    }

    async fn unquarantine(
        &self,
        request: Request<pb::UnquarantineRequest>,
    ) -> Reply<pb::UnquarantineResponse> {
        let who = self.caller("Unquarantine", &request)?;
        let key = self.parsed("Unquarantine", Key::parse(request.into_inner().key))?;
        self.authorize("Unquarantine", who.as_deref(), Right::Admin, key.as_str())?;
        let view = self
            .timed("Unquarantine", self.backend.unquarantine(&key))
            .await;
        reply(view.map(|v| pb::UnquarantineResponse {
            key: Some(convert::key_state(&v)),
        }))
    }

    async fn begin_tool_call(
        &self,
        request: Request<pb::BeginToolCallRequest>,
    ) -> Reply<pb::BeginToolCallResponse> {
        let who = self.caller("BeginToolCall", &request)?;
        let r = request.into_inner();
        let (key, lease_id) = self.parsed("BeginToolCall", convert::held(r.key, &r.lease_id))?;
        self.authorize("BeginToolCall", who.as_deref(), Right::Hold, key.as_str())?;
        let spec = convert::call_spec(
            pb::ToolCallSpec {
                call_id: r.call_id,
                name: r.name,
                input_digest: r.input_digest,
            },
            &r.turn,
            r.across_turns,
        );
        let outcome = self
            .timed(
                "BeginToolCall",
                self.backend
                    .begin_tool_calls(&key, Fence(r.fence), lease_id, vec![spec]),
            )
            .await;
        reply(outcome.map(|outcome| {
            let (calls, duplicate) = match outcome {
                BeginOutcome::Recorded(calls) => (calls, false),
                BeginOutcome::Duplicate { existing, .. } => (existing, true),
            };
            pb::BeginToolCallResponse {
                call: calls.first().map(|c| convert::tool_call(&key, c)),
                duplicate,
            }
        }))
    }

    async fn begin_tool_calls(
        &self,
        request: Request<pb::BeginToolCallsRequest>,
    ) -> Reply<pb::BeginToolCallsResponse> {
        let who = self.caller("BeginToolCalls", &request)?;
        let r = request.into_inner();
        let (key, lease_id) = self.parsed("BeginToolCalls", convert::held(r.key, &r.lease_id))?;
        self.authorize("BeginToolCalls", who.as_deref(), Right::Hold, key.as_str())?;
        let specs = r
            .calls
            .into_iter()
            .map(|spec| convert::call_spec(spec, &r.turn, r.across_turns))
            .collect();
        let outcome = self
            .timed(
                "BeginToolCalls",
                self.backend
                    .begin_tool_calls(&key, Fence(r.fence), lease_id, specs),
            )
            .await;
        reply(outcome.map(|outcome| begun_response(&key, outcome)))
    }

    async fn settle_tool_call(
        &self,
        request: Request<pb::SettleToolCallRequest>,
    ) -> Reply<pb::SettleToolCallResponse> {
        let who = self.caller("SettleToolCall", &request)?;
        let r = request.into_inner();
        let (key, lease_id) = self.parsed("SettleToolCall", convert::held(r.key, &r.lease_id))?;
        self.authorize("SettleToolCall", who.as_deref(), Right::Hold, key.as_str())?;
        let settlement = self.parsed(
            "SettleToolCall",
            convert::settlement(r.turn, r.call_id, r.outcome, r.result_digest, r.result),
        )?;
        let settled = self
            .timed(
                "SettleToolCall",
                self.backend
                    .settle_tool_call(&key, Fence(r.fence), lease_id, settlement),
            )
            .await;
        reply(settled.map(|settled| settled_response(&key, settled)))
    }

    async fn list_tool_calls(
        &self,
        request: Request<pb::ListToolCallsRequest>,
    ) -> Reply<pb::ListToolCallsResponse> {
        let who = self.caller("ListToolCalls", &request)?;
        let r = request.into_inner();
        let key = self.parsed("ListToolCalls", Key::parse(r.key))?;
        self.authorize("ListToolCalls", who.as_deref(), Right::Read, key.as_str())?;
        let calls = self
            .timed(
                "ListToolCalls",
                self.backend
                    .list_tool_calls(&key, convert::call_filter(r.filter)),
            )
            .await;
        reply(calls.map(|calls| pb::ListToolCallsResponse {
            calls: calls.iter().map(|c| convert::tool_call(&key, c)).collect(),
        }))
    }

    type WatchStream = futures_util::stream::BoxStream<'static, Result<pb::WatchResponse, Status>>;

    async fn watch(&self, request: Request<pb::WatchRequest>) -> Reply<Self::WatchStream> {
        use futures_util::StreamExt;
        let who = self.caller("Watch", &request)?;
        let slot = self
            .gate
            .stream_slot(request.remote_addr())
            .map_err(status::to_status)?;
        let r = request.into_inner();
        let selector = self.parsed("Watch", convert::selector(r.key, r.prefix))?;
        if let Selector::Key(key) = &selector {
            self.authorize("Watch", who.as_deref(), Right::Read, key.as_str())?;
        }
        let watching = self
            .timed("Watch", self.backend.watch(selector, r.start_revision))
            .await
            .map_err(status::to_status)?;
        let first = pb::WatchResponse {
            events: Vec::new(),
            revision: watching.revision,
        };
        // Each commit's events the caller may read, as one response; the
        // first response says where the watch starts.
        let events = watching.events.filter_map(move |batch| {
            let _slot = &slot;
            let out = match batch {
                Err(err) => Some(Err(status::to_status(err))),
                Ok(batch) => {
                    let revision = batch.last().map_or(0, |e| e.revision);
                    let events: Vec<pb::Event> = batch
                        .iter()
                        .filter(|e| {
                            who.as_ref()
                                .is_none_or(|w| w.can(Right::Read, e.key.as_str()))
                        })
                        .map(convert::event)
                        .collect();
                    (!events.is_empty()).then_some(Ok(pb::WatchResponse { events, revision }))
                }
            };
            std::future::ready(out)
        });
        let stream = futures_util::stream::once(std::future::ready(Ok(first))).chain(events);
        Ok(Response::new(stream.boxed()))
    }

    type SessionStream = SessionPipe;

    async fn session(
        &self,
        request: Request<Streaming<pb::SessionRequest>>,
    ) -> Reply<Self::SessionStream> {
        let who = self.caller("Session.Acquire", &request)?;
        let slot = self
            .gate
            .stream_slot(request.remote_addr())
            .map_err(status::to_status)?;
        let rate_key = (self.gate.limits().ops_per_second > 0)
            .then(|| caller_name(who.as_ref().map(|p| p.name.as_str()), request.remote_addr()));
        Ok(Response::new(SessionPipe {
            span: tracing::Span::current(),
            _slot: slot,
            gate: self.gate.clone(),
            rate_key,
            who,
            backend: self.backend.clone(),
            metrics: self.metrics.clone(),
            inbound: Some(request.into_inner()),
            pending: FuturesUnordered::new(),
        }))
    }

    async fn server_info(
        &self,
        request: Request<pb::ServerInfoRequest>,
    ) -> Reply<pb::ServerInfoResponse> {
        // Authenticated like every RPC, but no right on any key is needed.
        self.caller("ServerInfo", &request)?;
        self.metrics.record("ServerInfo", Duration::ZERO, None);
        Ok(Response::new(pb::ServerInfoResponse {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            protocol: leasehold_wire::PROTOCOL,
            backend: self.backend.name().to_owned(),
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
    /// The stream's request span (its request id): tonic polls the response
    /// body outside the span it handles the call in, so the pipe enters it
    /// itself, and each operation's log lines carry the stream's id.
    span: tracing::Span,
    /// This stream's slot on its connection, given back when it ends.
    _slot: Option<Slot>,
    gate: Arc<Gate>,
    /// Whom each operation's rate budget is taken from, when rates are limited.
    rate_key: Option<String>,
    /// The caller, when auth is on: every operation is checked against it.
    who: Option<Caller>,
    backend: Arc<dyn Backend>,
    metrics: Arc<ServiceMetrics>,
    /// `None` once the client half-closed (or its stream failed).
    inbound: Option<Streaming<pb::SessionRequest>>,
    pending: FuturesUnordered<BoxFuture<'static, pb::SessionResponse>>,
}

impl SessionPipe {
    /// The refusal of an operation over the caller's rate (one that is not
    /// takes a token).
    fn over_rate(&self) -> Option<Error> {
        let key = self.rate_key.as_deref()?;
        self.gate.take_op(key).err()
    }
}

impl Stream for SessionPipe {
    type Item = Result<pb::SessionResponse, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let _request = this.span.enter();
        while this.pending.len() < SESSION_WINDOW {
            let Some(inbound) = this.inbound.as_mut() else {
                break;
            };
            match Pin::new(inbound).poll_next(cx) {
                Poll::Ready(Some(Ok(message))) => {
                    if let Some(refusal) = this.over_rate() {
                        let refused = answer(message.id, Err(refusal));
                        this.pending.push(Box::pin(std::future::ready(refused)));
                        continue;
                    }
                    this.pending.push(session_step(
                        this.backend.as_ref(),
                        &this.metrics,
                        &this.gate,
                        this.who.as_deref(),
                        message,
                    ));
                }
                Poll::Ready(Some(Err(status))) => {
                    this.inbound = None;
                    let status = oversize::as_limit(&status).unwrap_or(status);
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
/// response (a refusal, malformed input included, travels in the response).
fn session_step(
    backend: &dyn Backend,
    metrics: &Arc<ServiceMetrics>,
    gate: &Arc<Gate>,
    who: Option<&Principal>,
    message: pb::SessionRequest,
) -> BoxFuture<'static, pb::SessionResponse> {
    use pb::session_request::Op;
    use pb::session_response::Ledger;
    let id = message.id;
    let step = Step {
        id,
        metrics: metrics.clone(),
        started: Instant::now(),
    };
    match message.op {
        Some(Op::Renew(r)) => {
            let step = step.named("Session.Renew");
            let parsed = convert::held(r.key, &r.lease_id)
                .and_then(|held| Ok((held, Ttl::parse_optional(r.ttl_ms)?)));
            let ((key, lease_id), ttl) = match parsed {
                Ok(parsed) => parsed,
                Err(err) => return step.refused(err),
            };
            if let Err(err) = allowed(who, Right::Hold, &key) {
                return step.refused(err);
            }
            let renewed = backend.renew(&key, Fence(r.fence), lease_id, ttl);
            let gate = who.map(|_| gate.clone());
            step.respond(renewed, move |t| {
                if let Some(gate) = gate {
                    gate.renewed(&key, &t);
                }
                pb::SessionResponse {
                    lease: Some(convert::lease(&key, &t, true)),
                    ..Default::default()
                }
            })
        }
        Some(Op::Check(r)) => {
            let step = step.named("Session.Check");
            let key = match Key::parse(r.key) {
                Ok(key) => key,
                Err(err) => return step.refused(err.into()),
            };
            if let Err(err) = allowed(who, Right::Check, &key) {
                return step.refused(err);
            }
            let checked = backend.check(&key, Fence(r.fence));
            step.respond(checked, move |t| pb::SessionResponse {
                lease: Some(convert::lease(&key, &t, false)),
                ..Default::default()
            })
        }
        Some(Op::Acquire(r)) => {
            let step = step.named("Session.Acquire");
            let acquire = match convert::acquire(r) {
                Ok(acquire) => acquire,
                Err(err) => return step.refused(err),
            };
            let owner_ok = who.map_or(Ok(()), |w| w.allow_owner(acquire.owner.as_str()));
            let force_ok = match acquire.options.force {
                true => allowed(who, Right::Admin, &acquire.key),
                false => Ok(()),
            };
            if let Err(err) = allowed(who, Right::Hold, &acquire.key)
                .and(owner_ok)
                .and(force_ok)
            {
                return step.refused(err);
            }
            let reservation = match who.map(|w| gate.reserve_key(&w.name, &acquire.key)) {
                Some(Err(err)) => return step.refused(err),
                Some(Ok(reservation)) => reservation,
                None => None,
            };
            let granted = backend.acquire(acquire);
            step.respond(granted, move |g| {
                if let Some(reservation) = reservation {
                    reservation.granted(&g.key, &g.term);
                }
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
            let step = step.named("Session.Release");
            let (key, lease_id) = match convert::held(r.key, &r.lease_id) {
                Ok(held) => held,
                Err(err) => return step.refused(err),
            };
            if let Err(err) = allowed(who, Right::Hold, &key) {
                return step.refused(err);
            }
            let handoff = match convert::handoff(r.successor, r.handoff_ms) {
                Ok(handoff) => handoff,
                Err(err) => return step.refused(err),
            };
            let released = backend.release(&key, Fence(r.fence), lease_id, r.suspend, handoff);
            let gate = who.map(|_| gate.clone());
            step.respond(released, move |e| {
                if let Some(gate) = gate {
                    gate.released(&key, e.fence);
                }
                pb::SessionResponse {
                    ended: Some(convert::ended(&e)),
                    ..Default::default()
                }
            })
        }
        Some(Op::BeginToolCalls(r)) => {
            // As the unary BeginToolCalls: the same parsing, right and
            // backend call, so the same answers and durability.
            let step = step.named("Session.BeginToolCalls");
            let (key, lease_id) = match convert::held(r.key, &r.lease_id) {
                Ok(held) => held,
                Err(err) => return step.refused(err),
            };
            if let Err(err) = allowed(who, Right::Hold, &key) {
                return step.refused(err);
            }
            let specs = r
                .calls
                .into_iter()
                .map(|spec| convert::call_spec(spec, &r.turn, r.across_turns))
                .collect();
            let begun = backend.begin_tool_calls(&key, Fence(r.fence), lease_id, specs);
            step.respond(begun, move |outcome| pb::SessionResponse {
                ledger: Some(Ledger::BeginToolCalls(begun_response(&key, outcome))),
                ..Default::default()
            })
        }
        Some(Op::SettleToolCall(r)) => {
            let step = step.named("Session.SettleToolCall");
            let (key, lease_id) = match convert::held(r.key, &r.lease_id) {
                Ok(held) => held,
                Err(err) => return step.refused(err),
            };
            if let Err(err) = allowed(who, Right::Hold, &key) {
                return step.refused(err);
            }
            let settlement = match convert::settlement(
                r.turn,
                r.call_id,
                r.outcome,
                r.result_digest,
                r.result,
            ) {
                Ok(settlement) => settlement,
                Err(err) => return step.refused(err),
            };
            let settled = backend.settle_tool_call(&key, Fence(r.fence), lease_id, settlement);
            step.respond(settled, move |settled| pb::SessionResponse {
                ledger: Some(Ledger::SettleToolCall(settled_response(&key, settled))),
                ..Default::default()
            })
        }
        None => {
            let empty = Error::InvalidArgument("empty Session request".into());
            Box::pin(std::future::ready(answer(id, Err(empty))))
        }
    }
}

/// `Ok` when `who` (if auth is on) holds `right` on `key`.
fn allowed(who: Option<&Principal>, right: Right, key: &Key) -> Result<(), Error> {
    who.map_or(Ok(()), |who| who.allow(right, key.as_str()))
}

/// The principal behind `request`: its bearer token, else the subject of
/// its client certificate.
pub(crate) fn identify<T>(auth: &Arc<AuthConfig>, request: &Request<T>) -> Result<Caller, Error> {
    let token = request
        .metadata()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    let subject = request
        .peer_certs()
        .and_then(|certs| certs.first().and_then(|c| subject_name(c.as_ref())));
    Caller::authenticate(auth, token, subject.as_deref())
}

/// One Session-stream operation being answered, and where its latency goes.
struct Step {
    id: u64,
    metrics: Arc<ServiceMetrics>,
    started: Instant,
}

/// A [`Step`] that knows which operation it is.
struct NamedStep {
    step: Step,
    rpc: &'static str,
}

impl Step {
    fn named(self, rpc: &'static str) -> NamedStep {
        NamedStep { step: self, rpc }
    }
}

impl NamedStep {
    /// A refusal before the backend saw the operation.
    fn refused(self, err: Error) -> BoxFuture<'static, pb::SessionResponse> {
        self.step
            .metrics
            .record(self.rpc, Duration::ZERO, Some(&err));
        Box::pin(std::future::ready(answer(self.step.id, Err(err))))
    }

    /// The future of the operation: waits for `outcome`, records it, then
    /// shapes the response with `to_response` (or the refusal).
    fn respond<T>(
        self,
        outcome: impl Future<Output = Result<T, Error>> + Send + 'static,
        to_response: impl FnOnce(T) -> pb::SessionResponse + Send + 'static,
    ) -> BoxFuture<'static, pb::SessionResponse> {
        Box::pin(async move {
            let result = outcome.await;
            let NamedStep { step, rpc } = self;
            step.metrics
                .record(rpc, step.started.elapsed(), result.as_ref().err());
            answer(step.id, result.map(to_response))
        })
    }
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
