//! The Session stream's window, over the interleavings loom explores within
//! the preemption bound; and the planted bug found.

mod common;

use leasehold_sync_model::check;
use leasehold_sync_model::session::{Plant, stream};

/// Two operations, three threads (client, engine, the polling task): 2
/// preemptions explore about 15,000 executions in about a second; 3 take
/// 340,000 and half a minute.
const BOUND: Option<usize> = Some(2);

/// Two operations through a window of one: each answered, the stream ends.
#[test]
fn every_operation_is_answered() {
    check(BOUND, || stream(Plant::None, 2));
}

/// Planted: a full window answers `Pending` without polling its operations.
#[test]
fn finds_full_window_pending_at_once() {
    common::expect_deadlock("planted_full_window_pends_at_once");
}

/// The child run of [`finds_full_window_pending_at_once`].
#[test]
fn planted_full_window_pends_at_once() {
    if common::is_child() {
        check(BOUND, || stream(Plant::FullWindowPendsAtOnce, 2));
    }
}
