//! An oversized request is a limit like the others: RESOURCE_EXHAUSTED with
//! `leasehold-limit: message_bytes`.
//!
//! tonic refuses a request message over `max_decoding_message_size` before
//! any handler runs, as OUT_OF_RANGE ("decoded message length too large").
//! That is the one limit whose refusal is not ours to build, so this wrapper
//! rewrites it on the way out; every other response passes untouched (a
//! Watch from a compacted revision is OUT_OF_RANGE too, with another
//! message, and stays so).

use std::convert::Infallible;
use std::task::{Context, Poll};

use tonic::codegen::{BoxFuture, Service, http};
use tonic::server::NamedService;

use leasehold_core::error::Error;
use leasehold_wire::status;

/// The text tonic starts its refusal of an oversized request with.
const TOO_LARGE: &str = "Error, decoded message length too large";

/// Wraps a generated gRPC service (see the module docs).
#[derive(Debug, Clone)]
pub struct OversizeIsExhausted<S>(pub S);

impl<S: NamedService> NamedService for OversizeIsExhausted<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> Service<http::Request<B>> for OversizeIsExhausted<S>
where
    S: Service<http::Request<B>, Response = http::Response<tonic::body::Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let reply = self.0.call(request);
        Box::pin(async move {
            let mut response = reply.await?;
            rewrite(response.headers_mut());
            Ok(response)
        })
    }
}

/// Turns tonic's OUT_OF_RANGE for an oversized request into the limit's
/// RESOURCE_EXHAUSTED, in a trailers-only response's headers.
fn rewrite(headers: &mut http::HeaderMap) {
    let Some(refusal) = tonic::Status::from_header_map(headers) else {
        return;
    };
    if let Some(limit) = as_limit(&refusal) {
        // `add_header` replaces grpc-status and grpc-message, and adds the
        // limit's metadata.
        let _ = limit.add_header(headers);
    }
}

/// The RESOURCE_EXHAUSTED for `refusal` if it is tonic's refusal of an
/// oversized message (also met inside a Session stream).
pub(crate) fn as_limit(refusal: &tonic::Status) -> Option<tonic::Status> {
    if refusal.code() != tonic::Code::OutOfRange || !refusal.message().starts_with(TOO_LARGE) {
        return None;
    }
    Some(status::to_status(Error::ResourceExhausted {
        limit: "message_bytes".into(),
        detail: refusal.message().to_owned(),
    }))
}
