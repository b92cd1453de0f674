//! Conversions between domain values and the generated `pb` types, both
//! ways, in one place.
//!
//! - *Replies* (server side): domain values to `pb`.
//! - *Requests* (server side): `pb` fields to domain values, checked once;
//!   a malformed field is [`Error::InvalidArgument`].
//! - *Replies read by a client*: `pb` to domain values. A server's reply that
//!   does not parse is not the caller's fault: [`Error::Storage`] ("malformed
//!   reply"), never a silent default.

use crate::pb;
use leasehold_core::clock::Millis;
use leasehold_core::error::{Error, Result};
use leasehold_core::events::{Event, EventKind, Selector};
use leasehold_core::lease::{
    AcquireOptions, Ended, EndedTerm, Fence, Handoff, HistoryEntry, Key, KeyState, Lease, LeaseId,
    Owner, RequestId, Reservation, Term, TermEnd, Ttl, Wait,
};
use leasehold_core::ledger::{
    CallFilter, CallSpec, CallState, Settlement, ToolCall, idempotency_key_in_turn,
};
use leasehold_core::lessor::{Acquire, Grant, HistoryPage, KeyView, ListFilter};

// ---- Replies: domain to pb ------------------------------------------------

/// A term as a `pb::Lease`; `with_secret` decides whether the lease id is shown
/// (only to the holder: Acquire and Renew).
pub fn lease(key: &Key, term: &Term, with_secret: bool) -> pb::Lease {
    // Straight from the term: every Renew and Check reply passes here.
    pb::Lease {
        key: key.as_str().to_owned(),
        fence: term.fence.0,
        owner: term.owner.as_str().to_owned(),
        lease_id: if with_secret {
            term.lease_id.to_string()
        } else {
            String::new()
        },
        ttl_ms: term.ttl.as_millis(),
        acquired_at_ms: term.acquired_at,
        expires_at_ms: term.expires_at,
    }
}

/// An ended term as a `pb::EndedTerm` (its lease id never leaves the server).
pub fn ended(ended: &EndedTerm) -> pb::EndedTerm {
    pb::EndedTerm {
        fence: ended.fence.0,
        owner: ended.owner.as_str().to_owned(),
        end: term_end(ended.end) as i32,
        ended_at_ms: ended.ended_at,
        handed_off: false,
    }
}

/// A reservation of a free key on the wire.
pub fn reservation(reservation: &Reservation) -> pb::Reservation {
    use pb::reservation::Kind;
    match reservation {
        Reservation::LockDelay { after, until } => pb::Reservation {
            kind: Kind::LockDelay as i32,
            after_fence: after.0,
            successor: String::new(),
            until_ms: *until,
        },
        Reservation::Handoff {
            from,
            successor,
            until,
        } => pb::Reservation {
            kind: Kind::Handoff as i32,
            after_fence: from.0,
            successor: successor.as_str().to_owned(),
            until_ms: *until,
        },
    }
}

/// An event as Watch streams it.
pub fn event(e: &Event) -> pb::Event {
    let kind = match e.kind {
        EventKind::Granted => pb::event::Kind::Granted,
        EventKind::Released => pb::event::Kind::Released,
        EventKind::Suspended => pb::event::Kind::Suspended,
        EventKind::Expired => pb::event::Kind::Expired,
        EventKind::Forgotten => pb::event::Kind::Forgotten,
    };
    pb::Event {
        revision: e.revision,
        key: e.key.as_str().to_owned(),
        kind: kind as i32,
        fence: e.fence.0,
        owner: e.owner.as_str().to_owned(),
        at_ms: e.at,
    }
}

/// What a Watch request follows: its key, else its prefix.
///
/// # Errors
/// [`Error::InvalidArgument`] for a malformed key.
pub fn selector(key: String, prefix: String) -> Result<Selector> {
    if key.is_empty() {
        Ok(Selector::Prefix(prefix))
    } else if !prefix.is_empty() {
        Err(Error::InvalidArgument(
            "give a key or a prefix to watch, not both".into(),
        ))
    } else {
        Ok(Selector::Key(Key::parse(key)?))
    }
}

/// An event from a Watch reply.
///
/// # Errors
/// [`Error::Storage`] when a field does not parse or the kind is unknown.
pub fn event_from_pb(e: pb::Event) -> Result<Event> {
    let kind = match pb::event::Kind::try_from(e.kind) {
        Ok(pb::event::Kind::Granted) => EventKind::Granted,
        Ok(pb::event::Kind::Released) => EventKind::Released,
        Ok(pb::event::Kind::Suspended) => EventKind::Suspended,
        Ok(pb::event::Kind::Expired) => EventKind::Expired,
        Ok(pb::event::Kind::Forgotten) => EventKind::Forgotten,
        _ => {
            let err = Error::InvalidArgument(format!("unknown event kind {}", e.kind));
            return Err(malformed("kind", &err));
        }
    };
    Ok(Event {
        revision: e.revision,
        key: reply_key(e.key)?,
        kind,
        fence: Fence(e.fence),
        owner: reply_owner(e.owner)?,
        at: e.at_ms,
    })
}

/// A page of a key's history, with the token for the next page.
pub fn history_response(page: &HistoryPage) -> pb::HistoryResponse {
    pb::HistoryResponse {
        entries: page.entries.iter().map(history_entry).collect(),
        next_page_token: page
            .next_before
            .map(|f| f.0.to_string())
            .unwrap_or_default(),
    }
}

fn history_entry(entry: &HistoryEntry) -> pb::HistoryEntry {
    pb::HistoryEntry {
        fence: entry.fence.0,
        owner: entry.owner.as_str().to_owned(),
        acquired_at_ms: entry.acquired_at,
        ended_at_ms: entry.ended_at,
        end: term_end(entry.end) as i32,
        unsettled_tool_calls: entry.unsettled_tool_calls,
        handed_off: entry.handed_off,
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
        key: view.key.as_str().to_owned(),
        lease: view.live.as_ref().map(|t| lease(&view.key, t, false)),
        last_ended: view.last_ended.as_ref().map(ended),
        recoverable: view.recoverable,
        quarantined: view.quarantined,
        reservation: view.reservation.as_ref().map(reservation),
    }
}

/// A grant as the holder sees it (with the lease id).
pub fn acquire_response(grant: &Grant) -> pb::AcquireResponse {
    pb::AcquireResponse {
        lease: Some(lease(&grant.key, &grant.term, true)),
        previous: grant.previous.as_ref().map(|previous| pb::EndedTerm {
            handed_off: grant.term.lifecycle.handed_off,
            ..ended(previous)
        }),
        replayed: grant.replayed,
        unsettled_tool_calls: u32::try_from(grant.unsettled_tool_calls).unwrap_or(u32::MAX),
    }
}

/// A ledger entry as a `pb::ToolCall`.
pub fn tool_call(key: &Key, call: &ToolCall) -> pb::ToolCall {
    pb::ToolCall {
        key: key.as_str().to_owned(),
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
        idempotency_key: idempotency_key_in_turn(key.as_str(), &call.turn, &call.call_id),
        turn: call.turn.clone(),
    }
}

/// A tool call's state on the wire.
pub fn call_state(state: CallState) -> pb::ToolCallState {
    match state {
        CallState::Running => pb::ToolCallState::Running,
        CallState::Succeeded => pb::ToolCallState::Succeeded,
        CallState::Failed => pb::ToolCallState::Failed,
        CallState::Unknown => pb::ToolCallState::Unknown,
    }
}

// ---- Requests: pb to domain, checked once ----------------------------------

/// An Acquire as the server takes it, from the unary or the stream form.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the first malformed field.
pub fn acquire(r: pb::AcquireRequest) -> Result<Acquire> {
    Ok(Acquire {
        key: Key::parse(r.key)?,
        owner: Owner::parse(r.owner)?,
        ttl: Ttl::from_millis(r.ttl_ms)?,
        wait: Wait::from_millis(r.wait_ms)?,
        request_id: RequestId::parse_optional(r.request_id)?,
        options: AcquireOptions::parse(r.lock_delay_ms, r.max_recoveries, r.force)?,
    })
}

/// The handoff a Release asks for, if any.
///
/// # Errors
/// [`Error::InvalidArgument`] for a malformed successor or time.
pub fn handoff(successor: String, handoff_ms: u64) -> Result<Option<Handoff>> {
    Ok(Handoff::parse_optional(successor, handoff_ms)?)
}

/// The page a History request starts at: below this fence (`None`: the
/// newest).
///
/// # Errors
/// [`Error::InvalidArgument`] when the token is malformed.
pub fn history_token(token: &str) -> Result<Option<Fence>> {
    if token.is_empty() {
        return Ok(None);
    }
    token
        .parse::<u64>()
        .map(|f| Some(Fence(f)))
        .map_err(|_| Error::InvalidArgument("malformed page_token".into()))
}

/// An Acquire as it travels (the client's side of [`acquire`]).
pub fn acquire_to_pb(acquire: &Acquire) -> pb::AcquireRequest {
    pb::AcquireRequest {
        key: acquire.key.as_str().to_owned(),
        owner: acquire.owner.as_str().to_owned(),
        ttl_ms: acquire.ttl.as_millis(),
        wait_ms: acquire.wait.as_millis(),
        request_id: acquire
            .request_id
            .as_ref()
            .map(|id| id.as_str().to_owned())
            .unwrap_or_default(),
        lock_delay_ms: acquire.options.lock_delay_ms,
        max_recoveries: acquire.options.max_recoveries.unwrap_or(0),
        force: acquire.options.force,
    }
}

/// The key and secret of a term a request presents (Renew, Release, the
/// tool-call operations).
///
/// # Errors
/// [`Error::InvalidArgument`] for a malformed key or lease id.
pub fn held(key: String, lease_id: &str) -> Result<(Key, LeaseId)> {
    Ok((Key::parse(key)?, LeaseId::parse(lease_id)?))
}

/// The List filter a client asked for; unspecified (and unknown) mean all.
pub fn list_filter(value: i32) -> ListFilter {
    match pb::ListFilter::try_from(value) {
        Ok(pb::ListFilter::Live) => ListFilter::Live,
        Ok(pb::ListFilter::Recoverable) => ListFilter::Recoverable,
        Ok(pb::ListFilter::Quarantined) => ListFilter::Quarantined,
        _ => ListFilter::All,
    }
}

/// The List filter as the wire spells it.
pub fn list_filter_to_pb(filter: ListFilter) -> pb::ListFilter {
    match filter {
        ListFilter::Live => pb::ListFilter::Live,
        ListFilter::Recoverable => pb::ListFilter::Recoverable,
        ListFilter::Quarantined => pb::ListFilter::Quarantined,
        ListFilter::All => pb::ListFilter::All,
    }
}

/// A call to begin, as the domain sees it (checked by the ledger's rules).
pub fn call_spec(spec: pb::ToolCallSpec, turn: &str, across_turns: bool) -> CallSpec {
    CallSpec {
        call_id: spec.call_id,
        name: spec.name,
        input_digest: spec.input_digest,
        turn: turn.to_owned(),
        across_turns,
    }
}

/// A settle request as a domain settlement.
///
/// # Errors
/// [`Error::InvalidArgument`] when the outcome is not SUCCEEDED, FAILED or UNKNOWN.
pub fn settlement(
    turn: String,
    call_id: String,
    outcome: i32,
    result_digest: String,
    result: Vec<u8>,
) -> Result<Settlement> {
    let outcome = match pb::ToolCallState::try_from(outcome) {
        Ok(pb::ToolCallState::Succeeded) => CallState::Succeeded,
        Ok(pb::ToolCallState::Failed) => CallState::Failed,
        Ok(pb::ToolCallState::Unknown) => CallState::Unknown,
        _ => {
            return Err(Error::InvalidArgument(format!(
                "outcome {outcome} is not SUCCEEDED, FAILED or UNKNOWN"
            )));
        }
    };
    Ok(Settlement {
        call_id,
        outcome,
        result_digest,
        result,
        turn,
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
pub fn page_token(after: &Key) -> String {
    after.as_str().bytes().map(|b| format!("{b:02x}")).collect()
}

/// Decodes a page token made by [`page_token`]; empty means the first page.
///
/// # Errors
/// [`Error::InvalidArgument`] when it is malformed.
pub fn parse_page_token(token: &str) -> Result<Option<Key>> {
    if token.is_empty() {
        return Ok(None);
    }
    let malformed = || Error::InvalidArgument("malformed page_token".into());
    if token.len() % 2 != 0 {
        return Err(malformed());
    }
    let bytes = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(token.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()
        .ok_or_else(malformed)?;
    let text = String::from_utf8(bytes).map_err(|_| malformed())?;
    Key::parse(text).map(Some).map_err(|_| malformed())
}

// ---- Replies read by a client: pb to domain --------------------------------

/// A reply field that did not parse: the server (or something between) sent
/// what no leasehold server sends.
fn malformed(what: &str, err: &dyn std::fmt::Display) -> Error {
    Error::Storage(format!("malformed reply: {what}: {err}"))
}

fn reply_key(key: String) -> Result<Key> {
    Key::parse(key).map_err(|e| malformed("key", &e))
}

fn reply_owner(owner: String) -> Result<Owner> {
    Owner::parse(owner).map_err(|e| malformed("owner", &e))
}

/// A `pb::Lease` from a reply.
///
/// # Errors
/// [`Error::Storage`] when a field does not parse.
pub fn lease_from_pb(lease: pb::Lease) -> Result<Lease> {
    let lease_id = if lease.lease_id.is_empty() {
        None
    } else {
        Some(LeaseId::parse(&lease.lease_id).map_err(|e| malformed("lease_id", &e))?)
    };
    Ok(Lease {
        key: reply_key(lease.key)?,
        fence: Fence(lease.fence),
        owner: reply_owner(lease.owner)?,
        lease_id,
        ttl: Ttl::from_millis(lease.ttl_ms).map_err(|e| malformed("ttl_ms", &e))?,
        acquired_at: lease.acquired_at_ms,
        expires_at: lease.expires_at_ms,
    })
}

/// A `pb::EndedTerm` from a reply.
///
/// # Errors
/// [`Error::Storage`] when a field does not parse or the end is unknown.
pub fn ended_from_pb(ended: pb::EndedTerm) -> Result<Ended> {
    Ok(Ended {
        fence: Fence(ended.fence),
        owner: reply_owner(ended.owner)?,
        end: term_end_from_pb(ended.end)?,
        ended_at: ended.ended_at_ms,
        handed_off: ended.handed_off,
    })
}

fn term_end_from_pb(end: i32) -> Result<TermEnd> {
    match pb::TermEnd::try_from(end) {
        Ok(pb::TermEnd::Released) => Ok(TermEnd::Released),
        Ok(pb::TermEnd::Suspended) => Ok(TermEnd::Suspended),
        Ok(pb::TermEnd::Expired) => Ok(TermEnd::Expired),
        _ => {
            let err = Error::InvalidArgument(format!("unknown term end {end}"));
            Err(malformed("end", &err))
        }
    }
}

/// A `pb::Reservation` from a reply.
///
/// # Errors
/// [`Error::Storage`] when the kind is unknown or a successor malformed.
pub fn reservation_from_pb(r: pb::Reservation) -> Result<Reservation> {
    use pb::reservation::Kind;
    match Kind::try_from(r.kind) {
        Ok(Kind::LockDelay) => Ok(Reservation::LockDelay {
            after: Fence(r.after_fence),
            until: r.until_ms,
        }),
        Ok(Kind::Handoff) => Ok(Reservation::Handoff {
            from: Fence(r.after_fence),
            successor: reply_owner(r.successor)?,
            until: r.until_ms,
        }),
        _ => {
            let err = Error::InvalidArgument(format!("unknown reservation kind {}", r.kind));
            Err(malformed("reservation", &err))
        }
    }
}

/// A History reply's entries (newest first) and the fence to continue below.
///
/// # Errors
/// [`Error::Storage`] when a field does not parse.
pub fn history_from_pb(r: pb::HistoryResponse) -> Result<(Vec<HistoryEntry>, Option<Fence>)> {
    let entries = r
        .entries
        .into_iter()
        .map(|h| {
            Ok(HistoryEntry {
                fence: Fence(h.fence),
                owner: reply_owner(h.owner)?,
                acquired_at: h.acquired_at_ms,
                ended_at: h.ended_at_ms,
                end: term_end_from_pb(h.end)?,
                unsettled_tool_calls: h.unsettled_tool_calls,
                handed_off: h.handed_off,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let next = history_token(&r.next_page_token).map_err(|e| malformed("next_page_token", &e))?;
    Ok((entries, next))
}

/// A `pb::KeyState` from a Get or List reply.
///
/// # Errors
/// [`Error::Storage`] when a field does not parse.
pub fn key_state_from_pb(state: pb::KeyState) -> Result<KeyState> {
    Ok(KeyState {
        key: reply_key(state.key)?,
        lease: state.lease.map(lease_from_pb).transpose()?,
        last_ended: state.last_ended.map(ended_from_pb).transpose()?,
        recoverable: state.recoverable,
        quarantined: state.quarantined,
        reservation: state.reservation.map(reservation_from_pb).transpose()?,
    })
}

/// A `pb::ToolCall` from a reply, with its key.
///
/// # Errors
/// [`Error::Storage`] when a field does not parse or the state is unknown.
pub fn tool_call_from_pb(call: pb::ToolCall) -> Result<(Key, ToolCall)> {
    let state = match pb::ToolCallState::try_from(call.state) {
        Ok(pb::ToolCallState::Running) => CallState::Running,
        Ok(pb::ToolCallState::Succeeded) => CallState::Succeeded,
        Ok(pb::ToolCallState::Failed) => CallState::Failed,
        Ok(pb::ToolCallState::Unknown) => CallState::Unknown,
        _ => {
            let err = Error::InvalidArgument(format!("unknown tool call state {}", call.state));
            return Err(malformed("state", &err));
        }
    };
    let settled_at: Option<Millis> = state.is_settled().then_some(call.settled_at_ms);
    Ok((
        reply_key(call.key)?,
        ToolCall {
            call_id: call.call_id,
            name: call.name,
            input_digest: call.input_digest,
            fence: Fence(call.fence),
            state,
            settled_fence: (call.settled_fence != 0).then_some(Fence(call.settled_fence)),
            result_digest: call.result_digest,
            result: call.result,
            begun_at: call.begun_at_ms,
            settled_at,
            ordinal: call.ordinal,
            turn: call.turn,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_tokens_round_trip() {
        for key in ["a", "session/ü/1"] {
            let key = Key::parse(key).unwrap();
            assert_eq!(parse_page_token(&page_token(&key)).unwrap(), Some(key));
        }
        assert_eq!(parse_page_token("").unwrap(), None);
        assert!(parse_page_token("zz").is_err());
        assert!(parse_page_token("abc").is_err());
    }

    #[test]
    fn a_lease_round_trips_and_a_bad_reply_is_an_error() {
        let term = Term {
            fence: Fence(u64::MAX - 1),
            owner: Owner::parse("graph-a").unwrap(),
            lease_id: LeaseId::random(),
            request_id: None,
            ttl: Ttl::from_millis(1500).unwrap(),
            acquired_at: 10,
            expires_at: 1510,
            lifecycle: Default::default(),
        };
        let key = Key::parse("session:1").unwrap();
        let wire = lease(&key, &term, true);
        assert_eq!(
            lease_from_pb(wire.clone()).unwrap(),
            Lease::of(&key, &term, true)
        );
        let bad = pb::Lease { ttl_ms: 0, ..wire };
        assert!(matches!(lease_from_pb(bad), Err(Error::Storage(_))));
    }
}
