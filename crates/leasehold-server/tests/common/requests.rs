//! Request builders and status readers shared by the gRPC suites, so each
//! suite says what it asks and checks, not how a request is spelled.

use leasehold_client::{Error, StaleReason};
use leasehold_wire::pb;
use leasehold_wire::status::from_status;
use tonic::Code;

#[allow(unused_imports)] // not every suite reads replies
pub use super::{acquire, lease_of};

/// Acquire that waits up to `wait_ms` for the key.
pub fn waiting(key: &str, owner: &str, ttl_ms: u64, wait_ms: u64) -> pb::AcquireRequest {
    pb::AcquireRequest {
        wait_ms,
        ..acquire(key, owner, ttl_ms)
    }
}

/// Acquire with a lock-delay after an expiry.
pub fn with_delay(key: &str, owner: &str, ttl_ms: u64, lock_delay_ms: u64) -> pb::AcquireRequest {
    pb::AcquireRequest {
        lock_delay_ms,
        ..acquire(key, owner, ttl_ms)
    }
}

/// Acquire that quarantines the key after `max_recoveries` failures.
pub fn limited(key: &str, owner: &str, ttl_ms: u64, max_recoveries: u32) -> pb::AcquireRequest {
    pb::AcquireRequest {
        max_recoveries,
        ..acquire(key, owner, ttl_ms)
    }
}

pub fn renew(lease: &pb::Lease, ttl_ms: u64) -> pb::RenewRequest {
    pb::RenewRequest {
        key: lease.key.clone(),
        fence: lease.fence,
        lease_id: lease.lease_id.clone(),
        ttl_ms,
    }
}

pub fn release(lease: &pb::Lease, suspend: bool) -> pb::ReleaseRequest {
    pb::ReleaseRequest {
        key: lease.key.clone(),
        fence: lease.fence,
        lease_id: lease.lease_id.clone(),
        suspend,
        ..Default::default()
    }
}

/// Release handing the key to `successor` for `ms` ("" and 0: no handoff).
pub fn release_to(
    lease: &pb::Lease,
    suspend: bool,
    successor: &str,
    ms: u64,
) -> pb::ReleaseRequest {
    pb::ReleaseRequest {
        successor: successor.into(),
        handoff_ms: ms,
        ..release(lease, suspend)
    }
}

pub fn check(key: &str, fence: u64) -> pb::CheckRequest {
    pb::CheckRequest {
        key: key.into(),
        fence,
    }
}

pub fn get(key: &str) -> pb::GetRequest {
    pb::GetRequest { key: key.into() }
}

/// `leasehold-reason` of a refusal ("" when absent).
pub fn reason(status: &tonic::Status) -> &str {
    status
        .metadata()
        .get("leasehold-reason")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// `leasehold-remaining-ms` of a refusal.
pub fn remaining_ms(status: &tonic::Status) -> u64 {
    status
        .metadata()
        .get("leasehold-remaining-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("leasehold-remaining-ms")
}

/// The stale reason of a FAILED_PRECONDITION status.
pub fn stale_reason(status: &tonic::Status) -> StaleReason {
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    match from_status(status) {
        Error::StaleFence { reason, .. } => reason,
        other => panic!("not a stale fence: {other:?}"),
    }
}
