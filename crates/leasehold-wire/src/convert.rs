//! Conversions between domain values and the generated `pb` types, in one place.

use crate::pb;
use leasehold_core::error::{Error, Result};
use leasehold_core::lease::{EndedTerm, Term, TermEnd};
use leasehold_core::ledger::{
    CallFilter, CallSpec, CallState, Settlement, ToolCall, idempotency_key,
};
use leasehold_core::lessor::AcquireRequest;
use leasehold_core::lessor::{Grant, KeyView, ListFilter};

/// A term as a `pb::Lease`; `with_secret` decides whether the lease id is shown
/// (only to the holder: Acquire and Renew).
pub fn lease(key: &str, term: &Term, with_secret: bool) -> pb::Lease {
    pb::Lease {
        key: key.to_owned(),
        fence: term.fence.0,
        owner: term.owner.clone(),
        lease_id: if with_secret {
            term.lease_id.to_string()
        } else {
            String::new()
        },
        ttl_ms: term.ttl_ms,
        acquired_at_ms: term.acquired_at,
        expires_at_ms: term.expires_at,
    }
}

/// An ended term as a `pb::EndedTerm` (its lease id never leaves the server).
pub fn ended(ended: &EndedTerm) -> pb::EndedTerm {
    pb::EndedTerm {
        fence: ended.fence.0,
        owner: ended.owner.clone(),
        end: term_end(ended.end) as i32,
        ended_at_ms: ended.ended_at,
    }
}

fn term_end(end: TermEnd) -> pb::TermEnd {
    match end {
        TermEnd::Released => pb::TermEnd::Released,
        TermEnd::Suspended => pb::TermEnd::Suspended,
        TermEnd::Expired => pb::TermEnd::Expired,
    }
}

/// A reader's view of a key as a `pb::KeyState`.
pub fn key_state(view: &KeyView) -> pb::KeyState {
    pb::KeyState {
        key: view.key.clone(),
        lease: view.live.as_ref().map(|t| lease(&view.key, t, false)),
        last_ended: view.last_ended.as_ref().map(ended),
        recoverable: view.recoverable,
    }
}

/// The List filter a client asked for; unspecified (and unknown) mean all.
pub fn list_filter(value: i32) -> ListFilter {
    match pb::ListFilter::try_from(value) {
        Ok(pb::ListFilter::Live) => ListFilter::Live,
        Ok(pb::ListFilter::Recoverable) => ListFilter::Recoverable,
        _ => ListFilter::All,
    }
}

/// A grant as the holder sees it (with the lease id).
/// An Acquire as the engine takes it, from the unary or the stream form.
pub fn acquire_request(r: pb::AcquireRequest) -> AcquireRequest {
    AcquireRequest {
        key: r.key,
        owner: r.owner,
        ttl_ms: r.ttl_ms,
        wait_ms: r.wait_ms,
        request_id: r.request_id,
    }
}

pub fn acquire_response(grant: &Grant) -> pb::AcquireResponse {
    pb::AcquireResponse {
        lease: Some(lease(&grant.key, &grant.term, true)),
        previous: grant.previous.as_ref().map(ended),
        replayed: grant.replayed,
        unsettled_tool_calls: u32::try_from(grant.unsettled_tool_calls).unwrap_or(u32::MAX),
    }
}

/// A ledger entry as a `pb::ToolCall`.
pub fn tool_call(key: &str, call: &ToolCall) -> pb::ToolCall {
    pb::ToolCall {
        key: key.to_owned(),
        call_id: call.call_id.clone(),
        name: call.name.clone(),
        input_digest: call.input_digest.clone(),
        fence: call.fence.0,
        state: call_state(call.state) as i32,
        settled_fence: call.settled_fence.map_or(0, |f| f.0),
        result_digest: call.result_digest.clone(),
        result: call.result.clone(),
        begun_at_ms: call.begun_at,
        settled_at_ms: call.settled_at.unwrap_or(0),
        ordinal: call.ordinal,
        idempotency_key: idempotency_key(key, &call.call_id),
    }
}

fn call_state(state: CallState) -> pb::ToolCallState {
    match state {
        CallState::Running => pb::ToolCallState::Running,
        CallState::Succeeded => pb::ToolCallState::Succeeded,
        CallState::Failed => pb::ToolCallState::Failed,
        CallState::Unknown => pb::ToolCallState::Unknown,
    }
}

/// A call to begin, as the domain sees it.
pub fn call_spec(spec: pb::ToolCallSpec) -> CallSpec {
    CallSpec {
        call_id: spec.call_id,
        name: spec.name,
        input_digest: spec.input_digest,
    }
}

/// A settle request as a domain settlement.
///
/// # Errors
/// [`Error::InvalidArgument`] when the outcome is not SUCCEEDED, FAILED or UNKNOWN.
pub fn settlement(r: pb::SettleToolCallRequest) -> Result<Settlement> {
    let outcome = match pb::ToolCallState::try_from(r.outcome) {
        Ok(pb::ToolCallState::Succeeded) => CallState::Succeeded,
        Ok(pb::ToolCallState::Failed) => CallState::Failed,
        Ok(pb::ToolCallState::Unknown) => CallState::Unknown,
        _ => {
            return Err(Error::InvalidArgument(format!(
                "outcome {} is not SUCCEEDED, FAILED or UNKNOWN",
                r.outcome
            )));
        }
    };
    Ok(Settlement {
        call_id: r.call_id,
        outcome,
        result_digest: r.result_digest,
        result: r.result,
    })
}

/// The ListToolCalls filter; unspecified (and unknown) mean all.
pub fn call_filter(value: i32) -> CallFilter {
    use pb::list_tool_calls_request::Filter;
    match Filter::try_from(value) {
        Ok(Filter::Unsettled) => CallFilter::Unsettled,
        _ => CallFilter::All,
    }
}

/// Encodes the key to continue after as an opaque page token.
pub fn page_token(after: &str) -> String {
    after.bytes().map(|b| format!("{b:02x}")).collect()
}

/// Decodes a page token made by [`page_token`]; `None` when it is malformed.
pub fn parse_page_token(token: &str) -> Option<String> {
    if token.len() % 2 != 0 {
        return None;
    }
    let bytes = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(token.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_tokens_round_trip() {
        for key in ["a", "session/ü/1", ""] {
            assert_eq!(parse_page_token(&page_token(key)).as_deref(), Some(key));
        }
        assert_eq!(parse_page_token("zz"), None);
        assert_eq!(parse_page_token("abc"), None);
    }
}
