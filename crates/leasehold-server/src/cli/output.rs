//! How the operator commands print: a line for people, or JSON.

use serde_json::{Value, json};

use leasehold_core::events::{Event, EventKind};
use leasehold_core::lease::{Ended, HistoryEntry, Lease, Reservation, TermEnd};

pub(super) fn lease_json(lease: &Lease) -> Value {
    let mut value = json!({
        "key": lease.key.as_str(),
        "fence": lease.fence.0,
        "owner": lease.owner.as_str(),
        "ttl_ms": lease.ttl.as_millis(),
        "acquired_at_ms": lease.acquired_at,
        "expires_at_ms": lease.expires_at,
    });
    if let Some(id) = lease.lease_id {
        value["lease_id"] = json!(id.to_string());
    }
    value
}

pub(super) fn end_name(end: TermEnd) -> &'static str {
    match end {
        TermEnd::Released => "RELEASED",
        TermEnd::Suspended => "SUSPENDED",
        TermEnd::Expired => "EXPIRED",
    }
}

pub(super) fn ended_json(ended: &Ended) -> Value {
    json!({
        "fence": ended.fence.0,
        "owner": ended.owner.as_str(),
        "end": end_name(ended.end),
        "ended_at_ms": ended.ended_at,
        "handed_off": ended.handed_off,
    })
}

pub(super) fn event_json(e: &Event) -> Value {
    let kind = match e.kind {
        EventKind::Granted => "GRANTED",
        EventKind::Released => "RELEASED",
        EventKind::Suspended => "SUSPENDED",
        EventKind::Expired => "EXPIRED",
        EventKind::Forgotten => "FORGOTTEN",
    };
    json!({
        "revision": e.revision,
        "key": e.key.as_str(),
        "kind": kind,
        "fence": e.fence.0,
        "owner": e.owner.as_str(),
        "at_ms": e.at,
    })
}

pub(super) fn history_json(h: &HistoryEntry) -> Value {
    json!({
        "fence": h.fence.0,
        "owner": h.owner.as_str(),
        "acquired_at_ms": h.acquired_at,
        "ended_at_ms": h.ended_at,
        "end": end_name(h.end),
        "unsettled_tool_calls": h.unsettled_tool_calls,
        "handed_off": h.handed_off,
    })
}

pub(super) fn reservation_json(r: &Reservation) -> Value {
    match r {
        Reservation::LockDelay { after, until } => json!({
            "kind": "LOCK_DELAY", "after_fence": after.0, "until_ms": until,
        }),
        Reservation::Handoff {
            from,
            successor,
            until,
        } => json!({
            "kind": "HANDOFF", "after_fence": from.0, "successor": successor.as_str(),
            "until_ms": until,
        }),
    }
}

/// Prints `value` as JSON, or as `field: value` lines for people.
pub(super) fn print(as_json: bool, value: Value) {
    if as_json {
        println!("{value}");
        return;
    }
    let Value::Object(fields) = value else {
        println!("{value}");
        return;
    };
    for (name, field) in fields {
        match field {
            Value::Null => {}
            Value::Object(_) => println!("{name}: {}", one_line(&field)),
            other => println!("{name}: {other}"),
        }
    }
}

/// `a=1 b=x` rendering of a flat JSON object.
pub(super) fn one_line(value: &Value) -> String {
    match value {
        Value::Object(fields) => fields
            .iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| match v {
                Value::String(s) => format!("{k}={s}"),
                Value::Object(_) => format!("{k}={{{}}}", one_line(v)),
                other => format!("{k}={other}"),
            })
            .collect::<Vec<_>>()
            .join(" "),
        other => other.to_string(),
    }
}
