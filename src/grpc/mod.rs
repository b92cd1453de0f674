//! The gRPC face of the engine: translates requests and replies, nothing else.

pub mod convert;
pub mod status;

use tonic::{Request, Response, Status};

use crate::engine::{AcquireRequest, Engine};
use crate::error::Error;
use crate::pb;
use crate::pb::leasehold_server::Leasehold;

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
        let grant = self
            .engine
            .acquire(AcquireRequest {
                key: r.key,
                owner: r.owner,
                ttl_ms: r.ttl_ms,
                wait_ms: r.wait_ms,
                request_id: r.request_id,
            })
            .await;
        reply(grant.map(|g| pb::AcquireResponse {
            lease: Some(convert::lease(&g.key, &g.term, true)),
            previous: g.previous.as_ref().map(convert::ended),
            replayed: g.replayed,
        }))
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
}
