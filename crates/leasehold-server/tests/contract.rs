//! The lease contract, one suite for both backends (#12): every test below
//! runs twice over real gRPC, once against a server on a real SQLite file
//! (`sqlite::…`, with a manual clock) and once against a server on a fresh
//! PostgreSQL schema (`postgres::…`, on the database's clock; skipped with a
//! note when `LEASEHOLD_TEST_POSTGRES` is unset); the cases an expiry sets
//! off run a third time on PostgreSQL without the sweeper
//! (`postgres_lazy::…`), where the first request that meets an expired term
//! must move it.
//!
//! The harness and the `contract!` macro are in `backends/` (shared with
//! the tool-call ledger's contract in `tool_calls.rs`). What only one backend has stays
//! in its own suite: restarts, commit counting and the Session stream's
//! internals in `lease_api.rs`; several servers on one schema, outages and
//! the sweeper in `postgres.rs`.

mod common;
mod pg_harness;
#[macro_use]
mod backends;

use std::time::Duration;

use backends::{Backend, Settings};
use common::requests::*;
use leasehold_client::{Error, StaleReason};
use leasehold_wire::pb;
use leasehold_wire::status::from_status;
use tonic::Code;

contract!(
    a_term_is_granted_checked_renewed_and_released,
    fences_strictly_increase_across_keys,
    a_held_key_is_busy_with_holder_fence_and_time_left,
    malformed_input_is_invalid_argument,
    every_stale_reason_and_permission_denied,
    an_expired_fence_is_refused_everywhere,
    get_hides_the_lease_id_and_unknown_keys_are_not_found,
    retried_acquires_and_releases_replay,
    an_expired_key_is_free_and_previous_says_expired,
    waiters_are_served_in_arrival_order,
    waiters_get_expired_keys_and_give_up_in_time,
    a_full_line_refuses_one_more_waiter_until_one_leaves with two_waiters_per_key,
    recoverable_keys_are_listed_until_someone_acquires_them,
    list_pages_in_key_order,
    lock_delay_holds_after_expiry_and_not_after_release,
    a_waiter_keeps_its_place_through_a_lock_delay,
    a_handoff_goes_to_the_named_successor_ahead_of_a_waiter,
    a_handoff_times_out_to_the_waiter,
    a_handoff_survives_a_restart,
    history_pages_in_order_and_survives_a_restart,
    a_key_is_quarantined_after_k_expiries_and_released_from_quarantine,
    bad_lifecycle_fields_are_invalid_arguments,
    the_rust_client_hands_off_reads_history_and_lifts_quarantine,
);

// What an expiry sets off (a lock-delay, a waiter's grant, a history entry,
// a failure towards quarantine) must not wait for PostgreSQL's sweeper: the
// first request that meets the expired term moves it.
contract_lazy!(
    an_expired_fence_is_refused_everywhere,
    an_expired_key_is_free_and_previous_says_expired,
    waiters_get_expired_keys_and_give_up_in_time,
    recoverable_keys_are_listed_until_someone_acquires_them,
    lock_delay_holds_after_expiry_and_not_after_release,
    a_waiter_keeps_its_place_through_a_lock_delay,
    history_pages_in_order_and_survives_a_restart,
    a_key_is_quarantined_after_k_expiries_and_released_from_quarantine,
);

/// A term's life: the grant (key, fence, owner, a UUID lease id, server
/// times), Check (never showing the lease id), renew (longer; a shorter TTL
/// is stored but never moves the deadline earlier), release, and what
/// Check and Get say afterwards.
async fn a_term_is_granted_checked_renewed_and_released(h: Backend) {
    let mut c = h.client().await;
    let before = h.now_ms().await;
    let granted = c
        .acquire(acquire("session:1", "graph-a", 5_000))
        .await
        .unwrap()
        .into_inner();
    let lease = granted.lease.unwrap();
    assert_eq!(lease.key, "session:1");
    assert!(lease.fence >= 1);
    assert_eq!(lease.owner, "graph-a");
    assert_eq!(lease.ttl_ms, 5_000);
    assert!(
        lease.acquired_at_ms >= before,
        "granted on the server's clock"
    );
    assert_eq!(lease.expires_at_ms - lease.acquired_at_ms, 5_000);
    assert!(uuid::Uuid::parse_str(&lease.lease_id).is_ok());
    assert!(granted.previous.is_none() && !granted.replayed);

    let checked = c.check(check("session:1", lease.fence)).await.unwrap();
    let checked = checked.into_inner().lease.unwrap();
    assert_eq!(checked.fence, lease.fence);
    assert!(
        checked.lease_id.is_empty(),
        "Check never shows the lease id"
    );

    h.pass(900).await;
    let renewed = c.renew(renew(&lease, 0)).await.unwrap().into_inner();
    let renewed = renewed.lease.unwrap();
    assert_eq!(renewed.ttl_ms, 5_000, "ttl 0 keeps the TTL");
    assert!(renewed.expires_at_ms >= lease.expires_at_ms + 900);
    assert_eq!(
        (renewed.fence, &renewed.lease_id),
        (lease.fence, &lease.lease_id)
    );
    let longer = c.renew(renew(&lease, 60_000)).await.unwrap().into_inner();
    let longer = longer.lease.unwrap();
    assert_eq!(longer.ttl_ms, 60_000);
    assert!(longer.expires_at_ms >= renewed.expires_at_ms + 55_000);
    let shorter = c.renew(renew(&lease, 1_000)).await.unwrap().into_inner();
    let shorter = shorter.lease.unwrap();
    assert_eq!(shorter.ttl_ms, 1_000);
    assert_eq!(shorter.expires_at_ms, longer.expires_at_ms);
    // Held past the first TTL.
    h.pass(5_000).await;
    c.check(check("session:1", lease.fence)).await.unwrap();

    let ended = c
        .release(release(&lease, false))
        .await
        .unwrap()
        .into_inner();
    let ended = ended.ended.unwrap();
    assert_eq!(ended.fence, lease.fence);
    assert_eq!(ended.end(), pb::TermEnd::Released);
    let refused = c.check(check("session:1", lease.fence)).await.unwrap_err();
    assert!(
        matches!(stale_reason(&refused), StaleReason::Released { at } if at == ended.ended_at_ms)
    );
    let state = c.get(get("session:1")).await.unwrap().into_inner();
    assert!(state.lease.is_none());
    assert_eq!(state.last_ended.unwrap().end(), pb::TermEnd::Released);
    assert!(!state.recoverable);
}

/// Fences strictly increase with every grant, across keys.
async fn fences_strictly_increase_across_keys(h: Backend) {
    let mut c = h.client().await;
    let mut last = 0;
    for i in 0..20 {
        let key = format!("k{}", i % 3);
        let lease = lease_of(c.acquire(acquire(&key, "o", 1000)).await.unwrap());
        assert!(lease.fence > last, "fence {} after {last}", lease.fence);
        last = lease.fence;
        c.release(release(&lease, false)).await.unwrap();
    }
}

/// A held key is ABORTED for others with the holder, its fence and the
/// time left; it is not re-entrant for its own owner either.
async fn a_held_key_is_busy_with_holder_fence_and_time_left(h: Backend) {
    let mut c = h.client().await;
    let lease = lease_of(c.acquire(acquire("k", "graph-a", 10_000)).await.unwrap());
    h.pass(1_500).await;
    let refused = c.acquire(acquire("k", "graph-b", 1_000)).await.unwrap_err();
    assert_eq!(refused.code(), Code::Aborted);
    assert!(
        refused.message().contains("graph-a"),
        "{}",
        refused.message()
    );
    match from_status(&refused) {
        Error::Busy {
            key,
            holder,
            fence,
            remaining_ms,
        } => {
            assert_eq!(key, "k");
            assert_eq!(holder, "graph-a");
            assert_eq!(fence.0, lease.fence);
            assert!(
                remaining_ms <= 8_500 && remaining_ms > 5_000,
                "{remaining_ms}"
            );
        }
        other => panic!("expected busy, got {other:?}"),
    }
    let again = c.acquire(acquire("k", "graph-a", 1_000)).await.unwrap_err();
    assert_eq!(again.code(), Code::Aborted, "not re-entrant");
}

/// Malformed input is INVALID_ARGUMENT, never INTERNAL; the bounds
/// themselves are allowed.
async fn malformed_input_is_invalid_argument(h: Backend) {
    let mut c = h.client().await;
    let long_key = "k".repeat(1025);
    let long_owner = "o".repeat(257);
    let cases = vec![
        acquire("", "o", 1000),
        acquire(&long_key, "o", 1000),
        acquire("bad\nkey", "o", 1000),
        acquire("bad\u{0}key", "o", 1000),
        acquire("k", "", 1000),
        acquire("k", &long_owner, 1000),
        acquire("k", "o", 99),
        acquire("k", "o", 0),
        acquire("k", "o", 24 * 3600 * 1000 + 1),
        waiting("k", "o", 1000, 5 * 60 * 1000 + 1),
    ];
    for case in cases {
        let status = c.acquire(case.clone()).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{case:?}: {status:?}");
    }
    c.acquire(acquire("min", "o", 100)).await.unwrap();
    c.acquire(acquire("max", "o", 24 * 3600 * 1000))
        .await
        .unwrap();
    let lease = lease_of(c.acquire(acquire("k", "o", 1000)).await.unwrap());
    let bad_id = pb::RenewRequest {
        lease_id: "not-a-uuid".into(),
        ..renew(&lease, 0)
    };
    assert_eq!(
        c.renew(bad_id).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    let bad_ttl = renew(&lease, 50);
    assert_eq!(
        c.renew(bad_ttl).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    for bad_page in [
        pb::ListRequest {
            page_token: "zz".into(),
            ..Default::default()
        },
        pb::ListRequest {
            page_size: 1001,
            ..Default::default()
        },
    ] {
        let status = c.list(bad_page).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
    }
}

/// Every stale reason (unknown, released, suspended, superseded) and
/// PERMISSION_DENIED for the live fence with a wrong lease id; a stale
/// release never clears a newer holder's claim.
async fn every_stale_reason_and_permission_denied(h: Backend) {
    let mut c = h.client().await;
    // unknown: a key never acquired, and a fence the key never had.
    let refused = c.check(check("never", 7)).await.unwrap_err();
    assert_eq!(stale_reason(&refused), StaleReason::Unknown);
    let lease = lease_of(c.acquire(acquire("k", "a", 5_000)).await.unwrap());
    let refused = c.check(check("k", lease.fence + 1000)).await.unwrap_err();
    assert_eq!(stale_reason(&refused), StaleReason::Unknown);

    // permission denied: the live fence with another lease id; the term is untouched.
    let mut forged = lease.clone();
    forged.lease_id = uuid::Uuid::new_v4().to_string();
    let refused = c.renew(renew(&forged, 0)).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);
    let refused = c.release(release(&forged, false)).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);
    c.check(check("k", lease.fence)).await.unwrap();

    // released
    let ended = c
        .release(release(&lease, false))
        .await
        .unwrap()
        .into_inner();
    let at = ended.ended.unwrap().ended_at_ms;
    for refused in [
        c.check(check("k", lease.fence)).await.unwrap_err(),
        c.renew(renew(&lease, 0)).await.unwrap_err(),
    ] {
        assert_eq!(stale_reason(&refused), StaleReason::Released { at });
        assert!(refused.message().contains("released"), "{refused:?}");
    }

    // suspended, then superseded once the key is taken again.
    let second = lease_of(c.acquire(acquire("k", "b", 5_000)).await.unwrap());
    let ended = c
        .release(release(&second, true))
        .await
        .unwrap()
        .into_inner();
    let at = ended.ended.unwrap().ended_at_ms;
    let refused = c.renew(renew(&second, 0)).await.unwrap_err();
    assert_eq!(stale_reason(&refused), StaleReason::Suspended { at });
    let third = lease_of(c.acquire(acquire("k", "c", 5_000)).await.unwrap());
    assert!(third.fence > second.fence);
    for fence in [lease.fence, second.fence] {
        let refused = c.check(check("k", fence)).await.unwrap_err();
        assert_eq!(
            stale_reason(&refused),
            StaleReason::Superseded {
                by: leasehold_core::Fence(third.fence)
            }
        );
        assert!(
            refused
                .message()
                .contains(&format!("superseded by fence {}", third.fence)),
            "{refused:?}"
        );
    }
    // A retried release of an old term is told the truth, and cannot clear
    // the newer holder's claim.
    let refused = c.release(release(&second, true)).await.unwrap_err();
    assert!(matches!(
        stale_reason(&refused),
        StaleReason::Superseded { .. }
    ));
    c.check(check("k", third.fence)).await.unwrap();
}

/// Once the TTL has passed, the old fence is refused by renew, release and
/// check alike, as expired at the term's deadline.
async fn an_expired_fence_is_refused_everywhere(h: Backend) {
    let mut c = h.client().await;
    let lease = lease_of(c.acquire(acquire("short", "a", 300)).await.unwrap());
    h.pass(310).await;
    for refused in [
        c.renew(renew(&lease, 0)).await.unwrap_err(),
        c.release(release(&lease, false)).await.unwrap_err(),
        c.check(check("short", lease.fence)).await.unwrap_err(),
    ] {
        assert_eq!(
            stale_reason(&refused),
            StaleReason::Expired {
                at: lease.expires_at_ms
            }
        );
        assert!(refused.message().contains("expired"), "{refused:?}");
    }
}

/// Get shows the live lease without its lease id; Get and ListToolCalls of
/// a key never acquired are NOT_FOUND.
async fn get_hides_the_lease_id_and_unknown_keys_are_not_found(h: Backend) {
    let mut c = h.client().await;
    let lease = lease_of(c.acquire(acquire("k", "o", 5_000)).await.unwrap());
    let got = c.get(get("k")).await.unwrap().into_inner();
    let live = got.lease.unwrap();
    assert_eq!(live.fence, lease.fence);
    assert!(live.lease_id.is_empty());
    assert!(!got.recoverable);
    assert_eq!(c.get(get("nope")).await.unwrap_err().code(), Code::NotFound);
    let listed = c
        .list_tool_calls(pb::ListToolCallsRequest {
            key: "nope".into(),
            filter: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(listed.code(), Code::NotFound);
}

/// The same owner and request id while the term is live gets the same term
/// back (as first granted, whatever TTL the retry asks); another request id
/// or owner is busy; once the term ended the request id starts a new term.
/// A retried release returns the term as it first ended.
async fn retried_acquires_and_releases_replay(h: Backend) {
    let mut c = h.client().await;
    let request = pb::AcquireRequest {
        request_id: "r1".into(),
        ..acquire("k", "a", 5_000)
    };
    let first = c.acquire(request.clone()).await.unwrap().into_inner();
    let retry = c
        .acquire(pb::AcquireRequest {
            ttl_ms: 9_000,
            ..request.clone()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(retry.replayed && !first.replayed);
    assert_eq!(retry.lease, first.lease, "the term as first granted");
    for other in [
        pb::AcquireRequest {
            request_id: "r2".into(),
            ..request.clone()
        },
        pb::AcquireRequest {
            owner: "b".into(),
            ..request.clone()
        },
    ] {
        assert_eq!(c.acquire(other).await.unwrap_err().code(), Code::Aborted);
    }

    let lease = first.lease.clone().unwrap();
    let ended = c.release(release(&lease, true)).await.unwrap().into_inner();
    h.pass(10).await;
    let again = c
        .release(release(&lease, false))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        again.ended, ended.ended,
        "a retry returns the term as it first ended"
    );
    assert_eq!(again.ended.unwrap().end(), pb::TermEnd::Suspended);

    let fresh = c.acquire(request).await.unwrap().into_inner();
    assert!(!fresh.replayed);
    assert!(fresh.lease.unwrap().fence > lease.fence);
}

/// A key whose term expired is free, and `previous` names the expired term,
/// ended at its deadline.
async fn an_expired_key_is_free_and_previous_says_expired(h: Backend) {
    let mut c = h.client().await;
    let old = lease_of(c.acquire(acquire("k", "graph-a", 300)).await.unwrap());
    let refused = c.acquire(acquire("k", "graph-b", 1000)).await.unwrap_err();
    assert_eq!(refused.code(), Code::Aborted);
    h.pass(310).await;
    let reply = c
        .acquire(acquire("k", "graph-b", 1000))
        .await
        .unwrap()
        .into_inner();
    let previous = reply.previous.unwrap();
    assert_eq!(previous.fence, old.fence);
    assert_eq!(previous.owner, "graph-a");
    assert_eq!(previous.end(), pb::TermEnd::Expired);
    assert_eq!(previous.ended_at_ms, old.expires_at_ms);
    assert!(reply.lease.unwrap().fence > old.fence);
}

/// Waiters are served first come, first served when the key is released;
/// while someone waits, a newcomer that would not wait is busy (named the
/// new holder), and does not jump the line.
async fn waiters_are_served_in_arrival_order(h: Backend) {
    let mut c = h.client().await;
    let held = lease_of(c.acquire(acquire("k", "holder", 60_000)).await.unwrap());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for (n, name) in ["w1", "w2", "w3"].into_iter().enumerate() {
        let mut waiter = h.client().await;
        let tx = tx.clone();
        tokio::spawn(async move {
            let reply = waiter.acquire(waiting("k", name, 60_000, 60_000)).await;
            tx.send(reply.map(lease_of)).unwrap();
        });
        // In line before the next one starts.
        h.in_line("k", n + 1).await;
    }
    let mut previous = held;
    for expected in ["w1", "w2", "w3"] {
        c.release(release(&previous, false)).await.unwrap();
        let lease = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("a waiter was woken")
            .unwrap()
            .unwrap();
        assert_eq!(lease.owner, expected);
        assert!(lease.fence > previous.fence);
        if expected == "w1" {
            let refused = c.acquire(acquire("k", "e", 1_000)).await.unwrap_err();
            assert!(
                matches!(from_status(&refused), Error::Busy { holder, .. } if holder == "w1"),
                "{refused:?}"
            );
        }
        previous = lease;
    }
}

/// A waiter gets the key when its holder's term expires, with `previous`
/// saying so; a wait that runs out first is busy, naming the holder.
async fn waiters_get_expired_keys_and_give_up_in_time(h: Backend) {
    let mut c = h.client().await;
    let held = lease_of(c.acquire(acquire("k", "holder", 300)).await.unwrap());
    let mut waiter = h.client().await;
    let waited = tokio::spawn(async move { waiter.acquire(waiting("k", "b", 5_000, 5_000)).await });
    h.in_line("k", 1).await;
    assert!(!waited.is_finished(), "granted before the expiry");
    h.pass(300).await;
    let got = tokio::time::timeout(Duration::from_secs(10), waited)
        .await
        .expect("woken by the expiry")
        .unwrap()
        .unwrap()
        .into_inner();
    assert_eq!(got.lease.unwrap().owner, "b");
    let previous = got.previous.unwrap();
    assert_eq!(previous.fence, held.fence);
    assert_eq!(previous.end(), pb::TermEnd::Expired);
    assert_eq!(previous.ended_at_ms, held.expires_at_ms);

    let mut late = h.client().await;
    let gave_up = tokio::spawn(async move { late.acquire(waiting("k", "c", 5_000, 300)).await });
    h.in_line("k", 1).await;
    h.pass(300).await;
    let refused = tokio::time::timeout(Duration::from_secs(10), gave_up)
        .await
        .expect("the wait ended")
        .unwrap()
        .unwrap_err();
    assert_eq!(refused.code(), Code::Aborted);
    assert!(refused.message().contains("\"b\""), "{refused:?}");
}

/// `--max-waiters-per-key 2`.
fn two_waiters_per_key() -> Settings {
    Settings {
        max_waiters_per_key: 2,
    }
}

/// With two places in a key's line, a third waiting Acquire is refused at
/// once, RESOURCE_EXHAUSTED naming the limit, in the same words on both
/// backends; an Acquire that would not wait is busy as ever, the two in
/// line keep their places, and once one has left a newcomer takes its
/// place.
async fn a_full_line_refuses_one_more_waiter_until_one_leaves(h: Backend) {
    let mut c = h.client().await;
    let held = lease_of(c.acquire(acquire("k", "holder", 60_000)).await.unwrap());
    let mut first = h.client().await;
    let first = tokio::spawn(async move { first.acquire(waiting("k", "w1", 5_000, 60_000)).await });
    h.in_line("k", 1).await;
    // Leaves when its wait runs out.
    let mut second = h.client().await;
    let second =
        tokio::spawn(async move { second.acquire(waiting("k", "w2", 5_000, 1_500)).await });
    h.in_line("k", 2).await;

    let refused = tokio::time::timeout(
        Duration::from_secs(5),
        c.acquire(waiting("k", "w3", 5_000, 60_000)),
    )
    .await
    .expect("refused at once, not queued")
    .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert_eq!(
        refused.metadata().get("leasehold-limit").unwrap(),
        "waiters_per_key"
    );
    assert_eq!(
        from_status(&refused),
        Error::ResourceExhausted {
            limit: "waiters_per_key".into(),
            detail: "2 Acquires already wait for key \"k\"".into(),
        }
    );
    let busy = c.acquire(acquire("k", "e", 1_000)).await.unwrap_err();
    assert!(
        matches!(from_status(&busy), Error::Busy { holder, .. } if holder == "holder"),
        "{busy:?}"
    );
    assert!(
        !first.is_finished() && !second.is_finished(),
        "kept in line"
    );

    h.pass(1_500).await;
    let gave_up = tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .expect("the wait ended")
        .unwrap()
        .unwrap_err();
    assert_eq!(gave_up.code(), Code::Aborted, "{gave_up:?}");
    let mut newcomer = h.client().await;
    let newcomer =
        tokio::spawn(async move { newcomer.acquire(waiting("k", "w4", 5_000, 60_000)).await });
    h.in_line("k", 2).await;
    assert!(!newcomer.is_finished(), "the newcomer was not kept in line");

    c.release(release(&held, false)).await.unwrap();
    let served = tokio::time::timeout(Duration::from_secs(10), first)
        .await
        .expect("the first in line was served")
        .unwrap();
    assert_eq!(lease_of(served.unwrap()).owner, "w1");
    newcomer.abort();
}

/// Suspended and expired keys are recoverable (Get says so, List
/// RECOVERABLE finds them); released ones are not; the next grant carries
/// the ended term as `previous`, exactly one recoverer wins, and taking a
/// key over clears it from the list.
async fn recoverable_keys_are_listed_until_someone_acquires_them(h: Backend) {
    let mut c = h.client().await;
    let expired = lease_of(c.acquire(acquire("s/crashed", "a", 300)).await.unwrap());
    let suspended = lease_of(c.acquire(acquire("s/paused", "a", 5_000)).await.unwrap());
    let released = lease_of(c.acquire(acquire("s/done", "a", 5_000)).await.unwrap());
    c.acquire(acquire("s/live", "a", 60_000)).await.unwrap();
    c.release(release(&suspended, true)).await.unwrap();
    c.release(release(&released, false)).await.unwrap();
    h.pass(310).await;

    let state = c.get(get("s/crashed")).await.unwrap().into_inner();
    assert!(state.recoverable && state.lease.is_none());
    assert_eq!(state.last_ended.unwrap().end(), pb::TermEnd::Expired);
    let state = c.get(get("s/paused")).await.unwrap().into_inner();
    assert!(state.recoverable);
    assert_eq!(state.last_ended.unwrap().end(), pb::TermEnd::Suspended);

    let list = |filter: pb::ListFilter| pb::ListRequest {
        prefix: "s/".into(),
        filter: filter as i32,
        page_size: 100,
        page_token: String::new(),
    };
    let mut keys = async |filter| -> Vec<String> {
        let reply = c.list(list(filter)).await.unwrap().into_inner();
        reply.keys.into_iter().map(|k| k.key).collect()
    };
    assert_eq!(
        keys(pb::ListFilter::Recoverable).await,
        ["s/crashed", "s/paused"]
    );
    assert_eq!(keys(pb::ListFilter::Live).await, ["s/live"]);
    assert_eq!(
        keys(pb::ListFilter::All).await,
        ["s/crashed", "s/done", "s/live", "s/paused"]
    );

    let mut c = h.client().await;
    let taken = c
        .acquire(acquire("s/crashed", "recoverer", 5_000))
        .await
        .unwrap()
        .into_inner();
    let previous = taken.previous.unwrap();
    assert_eq!(previous.fence, expired.fence);
    assert_eq!(previous.end(), pb::TermEnd::Expired);
    let second = c
        .acquire(acquire("s/crashed", "recoverer-2", 5_000))
        .await
        .unwrap_err();
    assert_eq!(second.code(), Code::Aborted, "exactly one recoverer wins");
    let list = list(pb::ListFilter::Recoverable);
    let recoverable = c.list(list.clone()).await.unwrap().into_inner();
    let recoverable: Vec<String> = recoverable.keys.into_iter().map(|k| k.key).collect();
    assert_eq!(recoverable, ["s/paused"]);
    let taken = c
        .acquire(acquire("s/paused", "recoverer", 5_000))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(taken.previous.unwrap().end(), pb::TermEnd::Suspended);
    let recoverable = c.list(list).await.unwrap().into_inner();
    assert!(recoverable.keys.is_empty(), "{recoverable:?}");
}

/// List pages through a prefix in key (byte) order with page tokens, ends
/// with an empty token, and takes LIKE wildcards in the prefix as plain
/// characters.
async fn list_pages_in_key_order(h: Backend) {
    let mut c = h.client().await;
    let mut expected = Vec::new();
    for i in (0..25).rev() {
        let key = format!("p%_{i:02}");
        c.acquire(acquire(&key, "a", 60_000)).await.unwrap();
        expected.push(key);
    }
    expected.sort();
    for other in ["p%x", "pa_1", "q", "p%"] {
        c.acquire(acquire(other, "a", 60_000)).await.unwrap();
    }
    let mut seen = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let page = c
            .list(pb::ListRequest {
                prefix: "p%_".into(),
                filter: pb::ListFilter::All as i32,
                page_size: 10,
                page_token: token.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        pages += 1;
        assert!(page.keys.len() <= 10);
        seen.extend(page.keys.into_iter().map(|k| k.key));
        token = page.next_page_token;
        if token.is_empty() || pages > 10 {
            break;
        }
    }
    assert_eq!(seen, expected);
    assert_eq!(pages, 3);
}

/// After an expiry the key stays untakeable for the lock-delay (ABORTED,
/// reason lock_delay, with the time left; Get shows the reservation), and
/// is granted once the delay has passed; a clean release or a suspension
/// skips it.
async fn lock_delay_holds_after_expiry_and_not_after_release(h: Backend) {
    let mut c = h.client().await;
    let held = lease_of(c.acquire(with_delay("k", "a", 300, 600)).await.unwrap());
    h.pass(400).await;
    let refused = c.acquire(acquire("k", "b", 1000)).await.unwrap_err();
    assert_eq!(refused.code(), Code::Aborted, "{refused:?}");
    assert_eq!(reason(&refused), "lock_delay");
    assert!(refused.message().contains("lock-delay"), "{refused:?}");
    let left = remaining_ms(&refused);
    assert!(left > 0 && left <= 500, "{left} ms left");
    let got = c.get(get("k")).await.unwrap().into_inner();
    let reservation = got.reservation.expect("reserved");
    assert_eq!(reservation.kind, pb::reservation::Kind::LockDelay as i32);
    assert_eq!(reservation.after_fence, held.fence);
    assert_eq!(reservation.until_ms, held.expires_at_ms + 600);
    h.pass(left).await;
    let next = c
        .acquire(acquire("k", "b", 1000))
        .await
        .unwrap()
        .into_inner();
    let lease = next.lease.unwrap();
    assert!(lease.fence > held.fence);
    assert!(lease.acquired_at_ms >= held.expires_at_ms + 600);
    assert_eq!(next.previous.unwrap().end(), pb::TermEnd::Expired);

    for suspend in [false, true] {
        let r = lease_of(c.acquire(with_delay("r", "a", 1000, 5000)).await.unwrap());
        c.release(release_to(&r, suspend, "", 0)).await.unwrap();
        let b = lease_of(c.acquire(acquire("r", "b", 1000)).await.unwrap());
        c.release(release_to(&b, false, "", 0)).await.unwrap();
    }
}

/// A waiter keeps its place through a lock-delay and gets the key when the
/// delay ends, not when the term expires.
async fn a_waiter_keeps_its_place_through_a_lock_delay(h: Backend) {
    let mut c = h.client().await;
    let held = lease_of(c.acquire(with_delay("k", "a", 300, 600)).await.unwrap());
    let mut waiter = h.client().await;
    let waited =
        tokio::spawn(async move { waiter.acquire(waiting("k", "w", 5_000, 10_000)).await });
    h.in_line("k", 1).await;
    h.pass(400).await;
    let refused = c.acquire(acquire("k", "x", 1000)).await.unwrap_err();
    assert_eq!(reason(&refused), "lock_delay", "{refused:?}");
    h.pass(remaining_ms(&refused)).await;
    let reply = tokio::time::timeout(Duration::from_secs(10), waited)
        .await
        .expect("woken when the delay ends")
        .unwrap()
        .unwrap()
        .into_inner();
    let lease = reply.lease.unwrap();
    assert_eq!(lease.owner, "w");
    assert!(
        lease.acquired_at_ms >= held.expires_at_ms + 600,
        "granted {} ms into the lock-delay",
        lease.acquired_at_ms - held.expires_at_ms
    );
    assert_eq!(reply.previous.unwrap().end(), pb::TermEnd::Expired);
}

/// A release naming a successor keeps the key for it, ahead of a waiter;
/// others are told whom it is kept for; the successor's grant says
/// handed_off; the waiter gets the key after the successor.
async fn a_handoff_goes_to_the_named_successor_ahead_of_a_waiter(h: Backend) {
    let mut c = h.client().await;
    let held = lease_of(c.acquire(acquire("s", "worker", 5000)).await.unwrap());
    let mut waiter = h.client().await;
    let waited = tokio::spawn(async move { waiter.acquire(waiting("s", "w", 5000, 10_000)).await });
    h.in_line("s", 1).await;
    c.release(release_to(&held, true, "ui", 10_000))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waited.is_finished(),
        "the waiter went before the successor"
    );

    let refused = c.acquire(acquire("s", "x", 5000)).await.unwrap_err();
    assert_eq!(refused.code(), Code::Aborted);
    assert_eq!(reason(&refused), "handoff");
    assert!(refused.message().contains("\"ui\""), "{refused:?}");
    let reservation = c.get(get("s")).await.unwrap().into_inner().reservation;
    let reservation = reservation.expect("reserved");
    assert_eq!(reservation.kind, pb::reservation::Kind::Handoff as i32);
    assert_eq!(reservation.successor, "ui");
    assert_eq!(reservation.after_fence, held.fence);

    let ui = c
        .acquire(acquire("s", "ui", 5000))
        .await
        .unwrap()
        .into_inner();
    let previous = ui.previous.unwrap();
    assert!(previous.handed_off);
    assert_eq!(previous.end(), pb::TermEnd::Suspended);
    assert_eq!(previous.fence, held.fence);
    let ui = ui.lease.unwrap();
    assert!(
        c.get(get("s"))
            .await
            .unwrap()
            .into_inner()
            .reservation
            .is_none()
    );
    c.release(release_to(&ui, false, "", 0)).await.unwrap();
    let reply = tokio::time::timeout(Duration::from_secs(10), waited)
        .await
        .expect("the waiter is served after the successor")
        .unwrap()
        .unwrap()
        .into_inner();
    assert_eq!(reply.lease.unwrap().owner, "w");
    assert!(!reply.previous.unwrap().handed_off);
}

/// A successor that does not come loses the key to the waiter when the
/// handoff time runs out, and is then plainly told the key is held.
async fn a_handoff_times_out_to_the_waiter(h: Backend) {
    let mut c = h.client().await;
    let held = lease_of(c.acquire(acquire("s", "worker", 5000)).await.unwrap());
    let mut waiter = h.client().await;
    let waited = tokio::spawn(async move { waiter.acquire(waiting("s", "w", 5000, 10_000)).await });
    h.in_line("s", 1).await;
    let ended = c
        .release(release_to(&held, false, "ui", 600))
        .await
        .unwrap();
    let released_at = ended.into_inner().ended.unwrap().ended_at_ms;
    h.pass(300).await;
    if h.now_ms().await < released_at + 600 {
        assert!(!waited.is_finished(), "served during the handoff");
    }
    h.pass(300).await;
    let reply = tokio::time::timeout(Duration::from_secs(10), waited)
        .await
        .expect("served when the handoff runs out")
        .unwrap()
        .unwrap()
        .into_inner();
    let lease = reply.lease.unwrap();
    assert_eq!(lease.owner, "w");
    assert!(lease.acquired_at_ms >= released_at + 600);
    assert!(!reply.previous.unwrap().handed_off);
    let late = c.acquire(acquire("s", "ui", 5000)).await.unwrap_err();
    assert_eq!(late.code(), Code::Aborted);
    assert_eq!(reason(&late), "", "plainly busy now: {late:?}");
}

/// A handoff reservation is stored with the key: after a restart only the
/// successor gets the key.
async fn a_handoff_survives_a_restart(h: Backend) {
    let mut c = h.client().await;
    let held = lease_of(c.acquire(acquire("s", "worker", 5000)).await.unwrap());
    c.release(release_to(&held, false, "ui", 60_000))
        .await
        .unwrap();
    let h = h.restart().await;
    let mut c = h.client().await;
    let refused = c.acquire(acquire("s", "x", 5000)).await.unwrap_err();
    assert_eq!(reason(&refused), "handoff");
    let ui = c
        .acquire(acquire("s", "ui", 5000))
        .await
        .unwrap()
        .into_inner();
    assert!(ui.previous.unwrap().handed_off);
}

/// History pages newest first, with a token for older entries, holds
/// expiries, and survives a restart; a key never acquired is NOT_FOUND.
async fn history_pages_in_order_and_survives_a_restart(h: Backend) {
    let mut c = h.client().await;
    let mut fences = Vec::new();
    for (i, end) in ["released", "suspended", "expired", "released", "expired"]
        .iter()
        .enumerate()
    {
        let lease = lease_of(
            c.acquire(acquire("h", &format!("w{i}"), 300))
                .await
                .unwrap(),
        );
        fences.push(lease.fence);
        match *end {
            "expired" => h.pass(310).await,
            suspended => {
                let suspend = suspended == "suspended";
                c.release(release_to(&lease, suspend, "", 0)).await.unwrap();
            }
        }
    }
    let h = h.restart().await;
    let mut c = h.client().await;
    let page = |page_size, page_token: String| pb::HistoryRequest {
        key: "h".into(),
        page_size,
        page_token,
    };
    let first = c
        .history(page(3, String::new()))
        .await
        .unwrap()
        .into_inner();
    let got: Vec<u64> = first.entries.iter().map(|e| e.fence).collect();
    assert_eq!(got, vec![fences[4], fences[3], fences[2]]);
    // The last expiry, which nobody acted on before the restart, is there.
    assert_eq!(first.entries[0].end, pb::TermEnd::Expired as i32);
    assert_eq!(first.entries[0].owner, "w4");
    assert_eq!(first.entries[2].end, pb::TermEnd::Expired as i32);
    assert_eq!(first.entries[2].owner, "w2");
    assert!(first.entries[2].ended_at_ms >= first.entries[2].acquired_at_ms + 300);
    assert!(!first.next_page_token.is_empty());
    let second = c
        .history(page(3, first.next_page_token))
        .await
        .unwrap()
        .into_inner();
    let got: Vec<u64> = second.entries.iter().map(|e| e.fence).collect();
    assert_eq!(got, vec![fences[1], fences[0]]);
    assert_eq!(second.entries[0].end, pb::TermEnd::Suspended as i32);
    assert!(second.next_page_token.is_empty());

    let missing = c
        .history(pb::HistoryRequest {
            key: "never".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
}

/// K expiries in a row quarantine a key: Acquire is FAILED_PRECONDITION
/// (reason quarantined) naming the failed terms, List QUARANTINED shows it
/// and RECOVERABLE does not, it stays quarantined across a restart, a
/// forced Acquire still gets it without lifting it, and Unquarantine lets
/// everyone in again (NOT_FOUND for a key never acquired).
async fn a_key_is_quarantined_after_k_expiries_and_released_from_quarantine(h: Backend) {
    let mut c = h.client().await;
    let mut fences = Vec::new();
    for _ in 0..2 {
        let lease = lease_of(c.acquire(limited("q", "worker", 300, 2)).await.unwrap());
        fences.push(lease.fence);
        h.pass(310).await;
    }
    // Before anyone acted on the second expiry, the lists already count it.
    let list = |filter: pb::ListFilter| pb::ListRequest {
        filter: filter as i32,
        ..Default::default()
    };
    let quarantined = c.list(list(pb::ListFilter::Quarantined)).await.unwrap();
    assert_eq!(quarantined.into_inner().keys.len(), 1);
    let recoverable = c.list(list(pb::ListFilter::Recoverable)).await.unwrap();
    assert!(recoverable.into_inner().keys.is_empty());
    let refused = c.acquire(acquire("q", "worker", 1000)).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert_eq!(reason(&refused), "quarantined");
    let expected = format!("fence {} expired, fence {} expired", fences[0], fences[1]);
    assert!(refused.message().contains(&expected), "{refused:?}");

    let h = h.restart().await;
    let mut c = h.client().await;
    let quarantined = c.list(list(pb::ListFilter::Quarantined)).await.unwrap();
    let quarantined = quarantined.into_inner();
    assert_eq!(quarantined.keys.len(), 1);
    assert!(quarantined.keys[0].quarantined);
    let recoverable = c.list(list(pb::ListFilter::Recoverable)).await.unwrap();
    assert!(recoverable.into_inner().keys.is_empty());
    let state = c.get(get("q")).await.unwrap().into_inner();
    assert!(state.quarantined && !state.recoverable);
    let still = c
        .acquire(waiting("q", "worker", 1000, 5000))
        .await
        .unwrap_err();
    assert_eq!(reason(&still), "quarantined", "a wait does not help");

    let forced = lease_of(
        c.acquire(pb::AcquireRequest {
            force: true,
            ..acquire("q", "ops", 1000)
        })
        .await
        .unwrap(),
    );
    c.release(release_to(&forced, true, "", 0)).await.unwrap();
    assert!(c.get(get("q")).await.unwrap().into_inner().quarantined);
    let lifted = c
        .unquarantine(pb::UnquarantineRequest { key: "q".into() })
        .await
        .unwrap()
        .into_inner()
        .key
        .unwrap();
    assert!(!lifted.quarantined);
    assert!(lifted.recoverable);
    let taken = lease_of(c.acquire(acquire("q", "worker", 1000)).await.unwrap());
    // A clean release resets the count: one more failure does not
    // quarantine again at K = 2.
    c.release(release_to(&taken, false, "", 0)).await.unwrap();
    let again = lease_of(c.acquire(limited("q", "worker", 1000, 2)).await.unwrap());
    c.release(release_to(&again, true, "", 0)).await.unwrap();
    c.acquire(acquire("q", "worker", 1000)).await.unwrap();
    let missing = c
        .unquarantine(pb::UnquarantineRequest {
            key: "never".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
}

/// Malformed lifecycle fields are refused at the edge, and refused calls
/// release nothing.
async fn bad_lifecycle_fields_are_invalid_arguments(h: Backend) {
    let mut c = h.client().await;
    let too_long = c
        .acquire(with_delay("k", "a", 1000, 60_001))
        .await
        .unwrap_err();
    assert_eq!(too_long.code(), Code::InvalidArgument);
    let held = lease_of(c.acquire(acquire("k", "a", 1000)).await.unwrap());
    let no_successor = c
        .release(release_to(&held, false, "", 1000))
        .await
        .unwrap_err();
    assert_eq!(no_successor.code(), Code::InvalidArgument);
    let too_long = c
        .release(release_to(&held, false, "ui", 600_001))
        .await
        .unwrap_err();
    assert_eq!(too_long.code(), Code::InvalidArgument);
    c.check(check("k", held.fence)).await.unwrap();
}

/// The Rust client: a guard hands its session to a named successor, whose
/// guard sees `handed_off`; refusals come back as typed errors; History and
/// Unquarantine work through the client.
async fn the_rust_client_hands_off_reads_history_and_lifts_quarantine(h: Backend) {
    use leasehold_client::{Client, ClientError, Held, ListFilter, TermEnd};
    use leasehold_core::lease::Key;
    let client = Client::connect(h.url()).await.unwrap();
    let worker = client
        .acquire("session:9")
        .owner("worker")
        .ttl(Duration::from_secs(30))
        .lock_delay(Duration::from_secs(5))
        .await
        .unwrap();
    worker
        .hand_off("ui", Duration::from_secs(30), false)
        .await
        .unwrap();
    match client.acquire("session:9").owner("other").await {
        Err(ClientError::Server(Error::Reserved {
            reservation: Held::Handoff { successor },
            ..
        })) => assert_eq!(successor, "ui"),
        other => panic!("expected a handoff refusal, got {other:?}"),
    }
    let ui = client
        .acquire("session:9")
        .owner("ui")
        .ttl(Duration::from_secs(30))
        .await
        .unwrap();
    let previous = ui.previous().expect("a previous term");
    assert!(previous.handed_off);
    assert_eq!(previous.end, TermEnd::Released);
    ui.release().await.unwrap();

    let key = Key::parse("session:9").unwrap();
    let page = client.history(&key, 10, None).await.unwrap();
    let owners: Vec<&str> = page.entries.iter().map(|e| e.owner.as_str()).collect();
    assert_eq!(owners, vec!["ui", "worker"]);
    assert!(page.entries[0].handed_off);

    // Quarantine at K = 1: one suspension is enough.
    let g = client
        .acquire("session:10")
        .max_recoveries(1)
        .await
        .unwrap();
    g.suspend().await.unwrap();
    match client.acquire("session:10").await {
        Err(ClientError::Server(Error::Quarantined { failures: 1, .. })) => {}
        other => panic!("expected quarantine, got {other:?}"),
    }
    let listed = client
        .list("session:", ListFilter::Quarantined, 10, None)
        .await
        .unwrap();
    assert_eq!(listed.keys.len(), 1);
    let key = Key::parse("session:10").unwrap();
    let state = client.unquarantine(&key).await.unwrap();
    assert!(!state.quarantined);
    client
        .acquire("session:10")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}
