//! The console's JSON: the gRPC replies (`pb` values) as the page reads them.
//!
//! Every shape is written out field by field, so nothing reaches a page that
//! is not named here: in particular no `lease_id`, which the gRPC replies
//! the console asks for leave empty anyway (Get, List), and which the one
//! place that handles one (force-release) never puts in a reply.

use serde_json::{Value, json};

use leasehold_wire::pb;

/// A live term, without its lease id.
pub fn lease(lease: &pb::Lease) -> Value {
    json!({
        "fence": lease.fence,
        "owner": lease.owner,
        "ttl_ms": lease.ttl_ms,
        "acquired_at_ms": lease.acquired_at_ms,
        "expires_at_ms": lease.expires_at_ms,
    })
}

/// How a term ended, as a word.
pub fn term_end(end: i32) -> &'static str {
    match pb::TermEnd::try_from(end) {
        Ok(pb::TermEnd::Released) => "released",
        Ok(pb::TermEnd::Suspended) => "suspended",
        Ok(pb::TermEnd::Expired) => "expired",
        _ => "unknown",
    }
}

/// A key's last ended term.
pub fn ended(ended: &pb::EndedTerm) -> Value {
    json!({
        "fence": ended.fence,
        "owner": ended.owner,
        "end": term_end(ended.end),
        "ended_at_ms": ended.ended_at_ms,
    })
}

/// A free key's reservation (lock-delay or handoff).
pub fn reservation(reservation: &pb::Reservation) -> Value {
    let kind = match pb::reservation::Kind::try_from(reservation.kind) {
        Ok(pb::reservation::Kind::LockDelay) => "lock_delay",
        Ok(pb::reservation::Kind::Handoff) => "handoff",
        _ => "unknown",
    };
    json!({
        "kind": kind,
        "after_fence": reservation.after_fence,
        "successor": reservation.successor,
        "until_ms": reservation.until_ms,
    })
}

/// One key as List and Get describe it.
pub fn key_state(state: &pb::KeyState) -> Value {
    json!({
        "key": state.key,
        "lease": state.lease.as_ref().map(lease),
        "last_ended": state.last_ended.as_ref().map(ended),
        "recoverable": state.recoverable,
        "quarantined": state.quarantined,
        "reservation": state.reservation.as_ref().map(reservation),
    })
}

/// A Get reply as a key state.
pub fn get_response(key: &str, reply: &pb::GetResponse) -> Value {
    key_state(&pb::KeyState {
        key: key.to_owned(),
        lease: reply.lease.clone(),
        last_ended: reply.last_ended.clone(),
        recoverable: reply.recoverable,
        quarantined: reply.quarantined,
        reservation: reply.reservation.clone(),
    })
}

/// One ended term of a key's history.
pub fn history_entry(entry: &pb::HistoryEntry) -> Value {
    json!({
        "fence": entry.fence,
        "owner": entry.owner,
        "acquired_at_ms": entry.acquired_at_ms,
        "ended_at_ms": entry.ended_at_ms,
        "end": term_end(entry.end),
        "unsettled_tool_calls": entry.unsettled_tool_calls,
        "handed_off": entry.handed_off,
    })
}

/// One entry of a key's tool-call ledger (the result's size, not its bytes).
pub fn tool_call(call: &pb::ToolCall) -> Value {
    let state = match pb::ToolCallState::try_from(call.state) {
        Ok(pb::ToolCallState::Running) => "running",
        Ok(pb::ToolCallState::Succeeded) => "succeeded",
        Ok(pb::ToolCallState::Failed) => "failed",
        Ok(pb::ToolCallState::Unknown) => "unknown",
        _ => "unspecified",
    };
    json!({
        "call_id": call.call_id,
        "name": call.name,
        "turn": call.turn,
        "state": state,
        "fence": call.fence,
        "settled_fence": call.settled_fence,
        "begun_at_ms": call.begun_at_ms,
        "settled_at_ms": call.settled_at_ms,
        "ordinal": call.ordinal,
        "input_digest": call.input_digest,
        "result_digest": call.result_digest,
        "result_bytes": call.result.len(),
        "idempotency_key": call.idempotency_key,
    })
}

/// One Watch event, as one NDJSON line's object.
pub fn event(event: &pb::Event) -> Value {
    let kind = match pb::event::Kind::try_from(event.kind) {
        Ok(pb::event::Kind::Granted) => "granted",
        Ok(pb::event::Kind::Released) => "released",
        Ok(pb::event::Kind::Suspended) => "suspended",
        Ok(pb::event::Kind::Expired) => "expired",
        Ok(pb::event::Kind::Forgotten) => "forgotten",
        _ => "unknown",
    };
    json!({
        "type": "event",
        "revision": event.revision,
        "key": event.key,
        "kind": kind,
        "fence": event.fence,
        "owner": event.owner,
        "at_ms": event.at_ms,
    })
}
