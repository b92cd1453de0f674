//! The services' own metrics: request latency per RPC and refusals per
//! status code, written next to what the backend writes
//! ([`leasehold_backend::metrics`] has the writer and the histogram).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use leasehold_core::error::Error;

pub use leasehold_backend::metrics::{BATCH_BUCKETS, Exposition, Histogram, LATENCY_BUCKETS};

/// The RPCs whose latency is recorded, unary and Session-stream operations.
pub const RPCS: &[&str] = &[
    "Acquire",
    "Renew",
    "Release",
    "Check",
    "Get",
    "List",
    "BeginToolCall",
    "BeginToolCalls",
    "SettleToolCall",
    "ListToolCalls",
    "Session.Acquire",
    "Session.Renew",
    "Session.Release",
    "Session.Check",
    "Session.BeginToolCalls",
    "Session.SettleToolCall",
];

/// What the gRPC services measure, whatever the backend: request latency
/// per RPC, and refusals by status code and stale reason.
#[derive(Debug)]
pub struct ServiceMetrics {
    requests: BTreeMap<&'static str, Histogram>,
    refusals: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
}

impl Default for ServiceMetrics {
    fn default() -> Self {
        ServiceMetrics {
            requests: RPCS
                .iter()
                .map(|rpc| (*rpc, Histogram::new(LATENCY_BUCKETS)))
                .collect(),
            refusals: Mutex::new(BTreeMap::new()),
        }
    }
}

impl ServiceMetrics {
    /// Records one request of `rpc` that took `elapsed` and ended in
    /// `refusal` (`None`: it succeeded).
    ///
    /// Every answer passes here, so this is also where it is logged (at
    /// debug, inside the request's span: see [`crate::request_log`]); only
    /// the RPC, the code and the time, never a key, owner or lease id.
    pub fn record(&self, rpc: &'static str, elapsed: Duration, refusal: Option<&Error>) {
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        match refusal {
            None => tracing::debug!(rpc, micros, "answered"),
            Some(err) => tracing::debug!(
                rpc,
                micros,
                code = code_name(err),
                reason = reason_name(err),
                "refused"
            ),
        }
        if let Some(histogram) = self.requests.get(rpc) {
            histogram.observe_duration(elapsed);
        }
        if let Some(err) = refusal {
            let key = (code_name(err), reason_name(err));
            *self
                .refusals
                .lock()
                .expect("refusals")
                .entry(key)
                .or_default() += 1;
        }
    }

    /// How many requests of `rpc` were recorded.
    pub fn request_count(&self, rpc: &str) -> u64 {
        self.requests.get(rpc).map_or(0, Histogram::count)
    }

    pub fn write(&self, out: &mut Exposition) {
        out.histograms(
            "leasehold_request_seconds",
            "Time from a request's arrival to its answer (its commit included), by RPC.",
            self.requests
                .iter()
                .map(|(rpc, h)| (vec![("rpc", *rpc)], h)),
        );
        let refusals = self.refusals.lock().expect("refusals").clone();
        out.counters(
            "leasehold_refusals_total",
            "Requests answered with an error, by gRPC status code and (for FAILED_PRECONDITION) why the fence is stale.",
            refusals.into_iter().map(|((code, reason), n)| {
                let mut labels = vec![("code", code)];
                if !reason.is_empty() {
                    labels.push(("reason", reason));
                }
                (labels, n)
            }),
        );
    }
}

/// The canonical gRPC code name of a refusal (the status table decides).
fn code_name(err: &Error) -> &'static str {
    match err {
        Error::InvalidArgument(_) => "INVALID_ARGUMENT",
        Error::Busy { .. } | Error::Reserved { .. } => "ABORTED",
        Error::StaleFence { .. } | Error::Quarantined { .. } => "FAILED_PRECONDITION",
        Error::Unsupported(_) => "UNIMPLEMENTED",
        Error::Compacted { .. } => "OUT_OF_RANGE",
        Error::PermissionDenied { .. } | Error::NotAllowed { .. } => "PERMISSION_DENIED",
        Error::Unauthenticated(_) => "UNAUTHENTICATED",
        Error::ResourceExhausted { .. } => "RESOURCE_EXHAUSTED",
        Error::NotFound(_) | Error::ToolCallNotFound { .. } => "NOT_FOUND",
        Error::Unavailable(_) => "UNAVAILABLE",
        Error::Storage(_) => "INTERNAL",
    }
}

fn reason_name(err: &Error) -> &'static str {
    match err {
        Error::StaleFence { reason, .. } => reason.name(),
        _ => "",
    }
}
