//! A request id on every log line of a request.
//!
//! Each HTTP/2 request (a unary call, or a whole Session stream) runs inside
//! a `request` span whose `request_id` is the client's `x-request-id`
//! metadata when it sent a usable one, else one made here. Every event
//! logged while the request is handled carries the span: as
//! `span.request_id` with `--log-format json`, as a `request{request_id=…}:`
//! prefix in text. An operator greps one id to see one request's story; a
//! client that sets the header can find its own calls.
//!
//! Not to be confused with Acquire's `request_id` field, the retry token of
//! a grant: that one is part of the protocol, this one only of the logs.
//!
//! The span's fields are the id and the gRPC path, nothing a lease id could
//! hide in (`tests/logs.rs` checks a debug log of a whole run for them).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use tonic::codegen::http;

/// The metadata a client names its request with.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// The longest client-given id kept; a longer one is replaced.
pub const MAX_REQUEST_ID_BYTES: usize = 128;

/// The span a request is handled in (tonic's `trace_fn`).
///
/// Both fields are given when the span is made, so the subscriber formats
/// them once (recording a field afterwards formats the span's fields
/// again), and a generated id is written straight into that text instead
/// of into a `String` of its own. That saved about 1 % of a unary Check's
/// instructions; the one formatting pass left is still about 6 %. With
/// logging at `warn` the span is disabled and none of this runs.
pub fn request_span(request: &http::Request<()>) -> tracing::Span {
    let path = request.uri().path();
    match client_id(request) {
        Some(id) => tracing::info_span!("request", request_id = %id, path = %path),
        None => tracing::info_span!("request", request_id = %GeneratedId::next(), path = %path),
    }
}

/// The client's `x-request-id`, if it is one line of visible ASCII of at
/// most [`MAX_REQUEST_ID_BYTES`]: anything else (control characters,
/// megabytes) is not worth a log line and gets an id of ours instead.
fn client_id(request: &http::Request<()>) -> Option<&str> {
    let value = request.headers().get(REQUEST_ID_HEADER)?.to_str().ok()?;
    let usable = !value.is_empty()
        && value.len() <= MAX_REQUEST_ID_BYTES
        && value.bytes().all(|b| b.is_ascii_graphic());
    usable.then_some(value)
}

/// A fresh id: a random prefix per process (so servers sharing one
/// PostgreSQL database do not repeat each other's ids) and a counter,
/// shown as `prefix-counter`.
#[derive(Debug, Clone, Copy)]
struct GeneratedId(u64);

impl GeneratedId {
    fn next() -> GeneratedId {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        GeneratedId(NEXT.fetch_add(1, Ordering::Relaxed))
    }

    fn prefix() -> &'static str {
        static PREFIX: OnceLock<String> = OnceLock::new();
        PREFIX.get_or_init(|| uuid::Uuid::new_v4().simple().to_string()[..12].to_owned())
    }
}

impl std::fmt::Display for GeneratedId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", GeneratedId::prefix(), self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_header(value: &str) -> http::Request<()> {
        http::Request::builder()
            .header(REQUEST_ID_HEADER, value)
            .body(())
            .unwrap()
    }

    /// A well-formed client id is kept; an empty, over-long or
    /// multi-word one is not.
    #[test]
    fn only_a_usable_client_id_is_kept() {
        assert_eq!(client_id(&with_header("req-42")), Some("req-42"));
        assert_eq!(client_id(&with_header("")), None);
        assert_eq!(client_id(&with_header("a b")), None);
        assert_eq!(client_id(&with_header(&"x".repeat(129))), None);
        assert_eq!(client_id(&http::Request::new(())), None);
    }

    /// Generated ids do not repeat.
    #[test]
    fn generated_ids_differ() {
        assert_ne!(
            GeneratedId::next().to_string(),
            GeneratedId::next().to_string()
        );
    }
}
