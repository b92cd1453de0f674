//! The writer's wake-up and durable replies, over every interleaving loom
//! explores within the preemption bound; and each planted bug found.

mod common;

use leasehold_sync_model::check;
use leasehold_sync_model::writer::{Plant, grant_and_read, two_grants};

/// Preemptions per execution: every planted bug here needs one or two.
/// Four threads (writer, two requests, main) at 2 take about 4 s optimised,
/// at 3 about 40 s; `LOOM_MAX_PREEMPTIONS` runs deeper.
const BOUND: Option<usize> = Some(2);

/// Three threads (writer, request, reader): 3 is still well under a second.
const READ_BOUND: Option<usize> = Some(3);

/// No change is left behind by a writer going to sleep, and no grant is
/// acknowledged before its commit.
#[test]
fn grants_are_committed_before_their_replies() {
    check(BOUND, || two_grants(Plant::None));
}

/// A read that reveals a grant waits for that grant's commit.
#[test]
fn reads_wait_for_what_they_reveal() {
    check(READ_BOUND, || grant_and_read(Plant::None));
}

/// Planted: `writer_idle` set after the lessor lock is let go. A change in
/// between does not wake the writer, and its reply waits forever.
#[test]
fn finds_idle_flag_set_after_unlock() {
    common::expect_deadlock("planted_idle_set_after_unlock");
}

/// Planted: `writer_idle` read before the change, outside the lock.
#[test]
fn finds_idle_flag_read_before_the_change() {
    common::expect_deadlock("planted_idle_read_before_the_change");
}

/// The child run of [`finds_idle_flag_set_after_unlock`] (a no-op otherwise).
#[test]
fn planted_idle_set_after_unlock() {
    if common::is_child() {
        check(BOUND, || two_grants(Plant::IdleSetAfterUnlock));
    }
}

/// The child run of [`finds_idle_flag_read_before_the_change`].
#[test]
fn planted_idle_read_before_the_change() {
    if common::is_child() {
        check(BOUND, || two_grants(Plant::IdleReadBeforeChange));
    }
}

/// Planted: the durable sequence published before the commit.
#[test]
#[should_panic(expected = "reply before its commit")]
fn finds_publish_before_commit() {
    check(BOUND, || two_grants(Plant::PublishBeforeCommit));
}

/// Planted: a read answered without waiting for the key's visible sequence.
#[test]
#[should_panic(expected = "read reveals a holder before its commit")]
fn finds_read_answered_at_once() {
    check(READ_BOUND, || grant_and_read(Plant::ReadAnswersAtOnce));
}
