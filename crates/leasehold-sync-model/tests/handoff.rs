//! A key handed to the next waiter while waiters leave the line, over every
//! interleaving loom explores within the preemption bound; and each planted
//! bug found.

use leasehold_sync_model::check;
use leasehold_sync_model::handoff::{CancelOrder, Plant, release_cancel_timeout};

/// Exhaustive: three threads, about 5 s per clean check optimised.
const BOUND: Option<usize> = None;

/// A release racing a dropped request and a timed-out wait never loses the
/// key (the request's future drops its receiver before its place in line).
#[test]
fn handoff_races_keep_the_key_receiver_dropped_first() {
    check(BOUND, || {
        release_cancel_timeout(Plant::None, CancelOrder::ReceiverFirst)
    });
}

/// As above, with the place in line given up first.
#[test]
fn handoff_races_keep_the_key_place_dropped_first() {
    check(BOUND, || {
        release_cancel_timeout(Plant::None, CancelOrder::PlaceFirst)
    });
}

/// Planted: the hand-off grants a waiter without asking whether it waits.
#[test]
#[should_panic(expected = "key lost")]
fn finds_handoff_without_waiting_check() {
    check(BOUND, || {
        release_cancel_timeout(Plant::SkipWaitingCheck, CancelOrder::ReceiverFirst)
    });
}

/// Planted: a wait that ran out ignores the grant that raced in.
#[test]
#[should_panic(expected = "key lost")]
fn finds_timeout_ignoring_a_raced_grant() {
    check(BOUND, || {
        release_cancel_timeout(Plant::GiveUpIgnoresGrant, CancelOrder::ReceiverFirst)
    });
}
