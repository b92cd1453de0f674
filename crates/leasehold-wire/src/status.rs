//! The one table between [`Error`] and `tonic::Status`, both ways.
//!
//! The server turns every refusal into a status here and nowhere else; the
//! client turns statuses back with [`from_status`]. Details a program needs
//! (holder, remaining time, why a fence is stale) travel as metadata, so
//! clients never parse messages.

use std::collections::HashMap;

use tonic::metadata::{
    AsciiMetadataKey, AsciiMetadataValue, BinaryMetadataKey, KeyAndValueRef, MetadataMap,
    MetadataValue,
};
use tonic::{Code, Status};

use leasehold_core::error::{Error, Held, StaleReason};
use leasehold_core::lease::{Fence, Key, Owner};

const KEY: &str = "leasehold-key-bin";
const HOLDER: &str = "leasehold-holder-bin";
const FENCE: &str = "leasehold-fence";
const REMAINING: &str = "leasehold-remaining-ms";
/// The metadata key naming why a fence is stale.
pub const REASON: &str = "leasehold-reason";
const AT: &str = "leasehold-at-ms";
const CALL_ID: &str = "leasehold-call-id-bin";
const PRINCIPAL: &str = "leasehold-principal-bin";
const RIGHT: &str = "leasehold-right";
const LIMIT: &str = "leasehold-limit";
const BY: &str = "leasehold-superseded-by";
const SUCCESSOR: &str = "leasehold-successor-bin";
const FAILURES: &str = "leasehold-failures";
const OLDEST: &str = "leasehold-oldest-revision";

/// Turns a domain error into the gRPC status a client sees.
pub fn to_status(err: Error) -> Status {
    let message = err.to_string();
    let mut meta = MetadataMap::new();
    let code = match &err {
        Error::InvalidArgument(_) => Code::InvalidArgument,
        Error::Busy {
            key,
            holder,
            fence,
            remaining_ms,
        } => {
            put_bin(&mut meta, KEY, key.as_str());
            put_bin(&mut meta, HOLDER, holder.as_str());
            put(&mut meta, FENCE, fence.0);
            put(&mut meta, REMAINING, *remaining_ms);
            Code::Aborted
        }
        Error::Reserved {
            key,
            reservation,
            remaining_ms,
        } => {
            put_bin(&mut meta, KEY, key.as_str());
            meta.insert(REASON, MetadataValue::from_static(reservation.name()));
            put(&mut meta, REMAINING, *remaining_ms);
            match reservation {
                Held::LockDelay { after } => put(&mut meta, FENCE, after.0),
                Held::Handoff { successor } => put_bin(&mut meta, SUCCESSOR, successor.as_str()),
            }
            Code::Aborted
        }
        Error::Quarantined { key, failures, .. } => {
            put_bin(&mut meta, KEY, key.as_str());
            meta.insert(REASON, MetadataValue::from_static("quarantined"));
            put(&mut meta, FAILURES, u64::from(*failures));
            Code::FailedPrecondition
        }
        Error::StaleFence { key, fence, reason } => {
            put_bin(&mut meta, KEY, key.as_str());
            put(&mut meta, FENCE, fence.0);
            meta.insert(REASON, MetadataValue::from_static(reason.name()));
            match reason {
                StaleReason::Expired { at }
                | StaleReason::Released { at }
                | StaleReason::Suspended { at } => put(&mut meta, AT, *at),
                StaleReason::Superseded { by } => put(&mut meta, BY, by.0),
                StaleReason::Unknown => {}
            }
            Code::FailedPrecondition
        }
        Error::PermissionDenied { key, fence } => {
            put_bin(&mut meta, KEY, key.as_str());
            put(&mut meta, FENCE, fence.0);
            Code::PermissionDenied
        }
        Error::NotFound(key) => {
            put_bin(&mut meta, KEY, key.as_str());
            Code::NotFound
        }
        Error::ToolCallNotFound { key, call_id } => {
            put_bin(&mut meta, KEY, key.as_str());
            put_bin(&mut meta, CALL_ID, call_id);
            Code::NotFound
        }
        Error::Unauthenticated(_) => Code::Unauthenticated,
        Error::ResourceExhausted { limit, .. } => {
            if let Ok(value) = AsciiMetadataValue::try_from(limit.as_str()) {
                meta.insert(LIMIT, value);
            }
            Code::ResourceExhausted
        }
        Error::NotAllowed {
            principal,
            right,
            key,
        } => {
            put_bin(&mut meta, PRINCIPAL, principal);
            put_bin(&mut meta, KEY, key);
            if let Ok(value) = AsciiMetadataValue::try_from(right.as_str()) {
                meta.insert(RIGHT, value);
            }
            Code::PermissionDenied
        }
        Error::Unavailable(_) => Code::Unavailable,
        Error::Unsupported(_) => Code::Unimplemented,
        Error::Compacted { oldest, .. } => {
            put(&mut meta, OLDEST, *oldest);
            Code::OutOfRange
        }
        Error::Storage(_) => Code::Internal,
    };
    Status::with_metadata(code, message, meta)
}

/// The refusal for an RPC the server does not implement.
fn missing_rpc(message: &str) -> String {
    let said = if message.is_empty() {
        String::new()
    } else {
        format!(" ({message})")
    };
    format!(
        "the server does not implement this call{said}: it is an older leasehold than this \
         client (which speaks leasehold.v1 revision {}) or not a leasehold server; \
         `leasehold health` against it prints its version",
        crate::PROTOCOL
    )
}

/// Turns a status from a leasehold server back into the domain error.
///
/// Statuses without leasehold metadata (from a proxy, a deadline, a broken
/// connection) map by code: transport trouble becomes
/// [`Error::Unavailable`], anything unrecognised (including a refusal code
/// without the key it refers to) [`Error::Storage`] with the original
/// message.
pub fn from_status(status: &Status) -> Error {
    let meta = status.metadata();
    let message = status.message().to_owned();
    if status.code() == Code::ResourceExhausted {
        let limit = meta.get(LIMIT).and_then(|v| v.to_str().ok()).unwrap_or("");
        let prefix = format!("limit {limit} reached: ");
        return Error::ResourceExhausted {
            limit: limit.to_owned(),
            detail: message.strip_prefix(&prefix).unwrap_or(&message).to_owned(),
        };
    }
    // A stream cut by the server's shutdown (an HTTP/2 GOAWAY or reset,
    // NO_ERROR among them) is reported by tonic as INTERNAL "h2 protocol
    // error": it is the transport's, as retryable as UNAVAILABLE, not a
    // server fault (found by the chaos harness, docs/reliability.md).
    if status.code() == Code::Internal && message.starts_with("h2 protocol error") {
        return Error::Unavailable(message);
    }
    if status.code() == Code::OutOfRange {
        if let Some(oldest) = get(meta, OLDEST) {
            let requested = message
                .strip_prefix("revision ")
                .and_then(|m| m.split_once(' '))
                .and_then(|(r, _)| r.parse().ok())
                .unwrap_or(0);
            return Error::Compacted { requested, oldest };
        }
    }
    if status.code() == Code::PermissionDenied {
        if let Some(right) = meta.get(RIGHT).and_then(|v| v.to_str().ok()) {
            return Error::NotAllowed {
                principal: get_bin(meta, PRINCIPAL).unwrap_or_default(),
                right: right.to_owned(),
                key: get_bin(meta, KEY).unwrap_or_default(),
            };
        }
    }
    let key = get_bin(meta, KEY).and_then(|k| Key::parse(k).ok());
    let Some(key) = key.filter(|_| refers_to_a_key(status.code())) else {
        return by_code(status.code(), message);
    };
    let fence = || Fence(get(meta, FENCE).unwrap_or(0));
    let reason = meta.get(REASON).and_then(|v| v.to_str().ok());
    match (status.code(), reason) {
        (Code::Aborted, Some("lock_delay")) => {
            return Error::Reserved {
                key,
                reservation: Held::LockDelay { after: fence() },
                remaining_ms: get(meta, REMAINING).unwrap_or(0),
            };
        }
        (Code::Aborted, Some("handoff")) => {
            if let Some(successor) = get_bin(meta, SUCCESSOR).and_then(|s| Owner::parse(s).ok()) {
                return Error::Reserved {
                    key,
                    reservation: Held::Handoff { successor },
                    remaining_ms: get(meta, REMAINING).unwrap_or(0),
                };
            }
        }
        (Code::FailedPrecondition, Some("quarantined")) => {
            // The failed terms are for people; the message carries them.
            let recent = message
                .split_once("without a clean release (")
                .and_then(|(_, rest)| rest.split_once(')'))
                .map(|(recent, _)| recent.to_owned())
                .unwrap_or_default();
            return Error::Quarantined {
                key,
                failures: get(meta, FAILURES)
                    .and_then(|f| u32::try_from(f).ok())
                    .unwrap_or(0),
                recent,
            };
        }
        _ => {}
    }
    match status.code() {
        Code::Aborted => match get_bin(meta, HOLDER).and_then(|h| Owner::parse(h).ok()) {
            Some(holder) => Error::Busy {
                key,
                holder,
                fence: fence(),
                remaining_ms: get(meta, REMAINING).unwrap_or(0),
            },
            None => by_code(Code::Aborted, message),
        },
        Code::FailedPrecondition => {
            let at = || get(meta, AT).unwrap_or(0);
            let reason = match meta.get(REASON).and_then(|v| v.to_str().ok()) {
                Some("expired") => StaleReason::Expired { at: at() },
                Some("released") => StaleReason::Released { at: at() },
                Some("suspended") => StaleReason::Suspended { at: at() },
                Some("superseded") => StaleReason::Superseded {
                    by: Fence(get(meta, BY).unwrap_or(0)),
                },
                _ => StaleReason::Unknown,
            };
            Error::StaleFence {
                key,
                fence: fence(),
                reason,
            }
        }
        Code::PermissionDenied => Error::PermissionDenied {
            key,
            fence: fence(),
        },
        Code::NotFound => match get_bin(meta, CALL_ID) {
            Some(call_id) => Error::ToolCallNotFound { key, call_id },
            None => Error::NotFound(key),
        },
        code => by_code(code, message),
    }
}

/// Whether a leasehold refusal with this code names a key.
fn refers_to_a_key(code: Code) -> bool {
    matches!(
        code,
        Code::Aborted | Code::FailedPrecondition | Code::PermissionDenied | Code::NotFound
    )
}

/// A status mapped by its code alone.
fn by_code(code: Code, message: String) -> Error {
    match code {
        Code::Unauthenticated => Error::Unauthenticated(
            message
                .strip_prefix("unauthenticated: ")
                .unwrap_or(&message)
                .to_owned(),
        ),
        Code::InvalidArgument => Error::InvalidArgument(
            message
                .strip_prefix("invalid argument: ")
                .unwrap_or(&message)
                .to_owned(),
        ),
        // UNKNOWN is never sent by a leasehold server (its own faults are
        // INTERNAL): it is what the client's transport reports when the
        // connection failed under a call (a refused TLS handshake, a reset),
        // so it is as retryable as UNAVAILABLE.
        // A leasehold server's own refusal says "unsupported: ..."; anything
        // else is the RPC itself missing (tonic answers an unknown method with
        // no message), so the client names the likely cause.
        Code::Unimplemented => Error::Unsupported(match message.strip_prefix("unsupported: ") {
            Some(feature) => feature.to_owned(),
            None => missing_rpc(&message),
        }),
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown => {
            Error::Unavailable(
                message
                    .strip_prefix("unavailable: ")
                    .unwrap_or(&message)
                    .to_owned(),
            )
        }
        _ => Error::Storage(
            message
                .strip_prefix("storage error: ")
                .unwrap_or(&message)
                .to_owned(),
        ),
    }
}

/// A refusal as it travels inside a `SessionResponse`: the status code, the
/// message and the status metadata, so a Session stream says exactly what
/// the unary RPC would.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: i32,
    pub message: String,
    /// The `leasehold-reason` detail, repeated for readers of the stream
    /// that do not look at `details`.
    pub reason: String,
    pub details: HashMap<String, Vec<u8>>,
}

/// Turns a domain error into the refusal fields of a `SessionResponse`.
pub fn to_refusal(err: Error) -> Refusal {
    let status = to_status(err);
    let mut details = HashMap::new();
    for entry in status.metadata().iter() {
        match entry {
            KeyAndValueRef::Ascii(name, value) => {
                details.insert(name.as_str().to_owned(), value.as_encoded_bytes().to_vec());
            }
            KeyAndValueRef::Binary(name, value) => {
                if let Ok(bytes) = value.to_bytes() {
                    details.insert(name.as_str().to_owned(), bytes.to_vec());
                }
            }
        }
    }
    Refusal {
        code: status.code() as i32,
        message: status.message().to_owned(),
        reason: status
            .metadata()
            .get(REASON)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned(),
        details,
    }
}

/// Turns the refusal fields of a `SessionResponse` back into the domain
/// error, through the same table as [`from_status`]. Details it does not
/// know are ignored.
pub fn from_refusal(code: i32, message: &str, details: &HashMap<String, Vec<u8>>) -> Error {
    let mut meta = MetadataMap::new();
    for (name, value) in details {
        if name.ends_with("-bin") {
            if let Ok(name) = BinaryMetadataKey::from_bytes(name.as_bytes()) {
                meta.insert_bin(name, MetadataValue::from_bytes(value));
            }
        } else if let (Ok(name), Ok(value)) = (
            AsciiMetadataKey::from_bytes(name.as_bytes()),
            AsciiMetadataValue::try_from(value.as_slice()),
        ) {
            meta.insert(name, value);
        }
    }
    from_status(&Status::with_metadata(Code::from(code), message, meta))
}

fn put(meta: &mut MetadataMap, name: &'static str, value: u64) {
    meta.insert(name, MetadataValue::from(value));
}

fn put_bin(meta: &mut MetadataMap, name: &'static str, value: &str) {
    meta.insert_bin(name, MetadataValue::from_bytes(value.as_bytes()));
}

fn get(meta: &MetadataMap, name: &str) -> Option<u64> {
    meta.get(name)?.to_str().ok()?.parse().ok()
}

fn get_bin(meta: &MetadataMap, name: &str) -> Option<String> {
    let bytes = meta.get_bin(name)?.to_bytes().ok()?;
    String::from_utf8(bytes.to_vec()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: &str) -> Key {
        Key::parse(k).unwrap()
    }

    /// Every error survives the trip through a status and back unchanged.
    #[test]
    fn every_error_round_trips_through_a_status() {
        let errors = vec![
            Error::InvalidArgument("key must not be empty".into()),
            Error::Busy {
                key: key("sessión/1"),
                holder: Owner::parse("graph-ä").unwrap(),
                fence: Fence(7),
                remaining_ms: 1234,
            },
            Error::StaleFence {
                key: key("k"),
                fence: Fence(3),
                reason: StaleReason::Expired { at: 99 },
            },
            Error::StaleFence {
                key: key("k"),
                fence: Fence(3),
                reason: StaleReason::Released { at: 98 },
            },
            Error::StaleFence {
                key: key("k"),
                fence: Fence(3),
                reason: StaleReason::Suspended { at: 97 },
            },
            Error::StaleFence {
                key: key("k"),
                fence: Fence(3),
                reason: StaleReason::Superseded { by: Fence(9) },
            },
            Error::StaleFence {
                key: key("k"),
                fence: Fence(3),
                reason: StaleReason::Unknown,
            },
            Error::PermissionDenied {
                key: key("k"),
                fence: Fence(4),
            },
            Error::NotFound(key("nope")),
            Error::ToolCallNotFound {
                key: key("k"),
                call_id: "call_1".into(),
            },
            Error::Unauthenticated("no credential".into()),
            Error::ResourceExhausted {
                limit: "waiters_per_key".into(),
                detail: "1000 Acquires already wait for key \"k\"".into(),
            },
            Error::Reserved {
                key: key("k"),
                reservation: Held::LockDelay { after: Fence(4) },
                remaining_ms: 250,
            },
            Error::Reserved {
                key: key("k"),
                reservation: Held::Handoff {
                    successor: Owner::parse("ui-ü").unwrap(),
                },
                remaining_ms: 9,
            },
            Error::Quarantined {
                key: key("k"),
                failures: 3,
                recent: "fence 1 expired, fence 2 suspended, fence 3 expired".into(),
            },
            Error::Unsupported("handoff on the postgres backend".into()),
            Error::Compacted {
                requested: 3,
                oldest: 40,
            },
            Error::NotAllowed {
                principal: "dashboard".into(),
                right: "hold".into(),
                key: "session:1".into(),
            },
            Error::Unavailable("the server is shutting down".into()),
            Error::Storage("disk I/O error".into()),
        ];
        for err in errors {
            let status = to_status(err.clone());
            assert_eq!(from_status(&status), err, "status was {status:?}");
            let refusal = to_refusal(err.clone());
            assert_eq!(refusal.code, status.code() as i32);
            assert_eq!(
                from_refusal(refusal.code, &refusal.message, &refusal.details),
                err,
                "refusal was {refusal:?}"
            );
        }
    }

    #[test]
    fn codes_follow_the_table() {
        let code = |e: Error| to_status(e).code();
        assert_eq!(
            code(Error::InvalidArgument("x".into())),
            Code::InvalidArgument
        );
        assert_eq!(
            code(Error::PermissionDenied {
                key: key("k"),
                fence: Fence(1)
            }),
            Code::PermissionDenied
        );
        assert_eq!(code(Error::NotFound(key("k"))), Code::NotFound);
    }

    #[test]
    fn a_refusal_code_without_leasehold_details_maps_by_code() {
        let from_proxy = Status::new(Code::Aborted, "upstream aborted");
        assert_eq!(
            from_status(&from_proxy),
            Error::Storage("upstream aborted".into())
        );
        let deadline = Status::new(Code::DeadlineExceeded, "deadline");
        assert!(matches!(from_status(&deadline), Error::Unavailable(_)));
    }

    #[test]
    fn a_stream_cut_by_a_shutdown_is_unavailable_and_other_internals_are_not() {
        let cut = Status::new(Code::Internal, "h2 protocol error: http2 error");
        assert!(matches!(from_status(&cut), Error::Unavailable(_)));
        let fault = Status::new(Code::Internal, "storage error: disk I/O error");
        assert!(matches!(from_status(&fault), Error::Storage(_)));
    }
}
