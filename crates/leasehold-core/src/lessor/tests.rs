//! The lessor's rules, tested on the table itself (no engine, no storage).

use super::*;
use crate::error::StaleReason;
use crate::ledger::CallSpec;

/// A waiter that is always waiting, tagged for assertions.
#[derive(Debug, PartialEq)]
struct Tag(&'static str);
impl WaiterHandle for Tag {
    fn is_waiting(&self) -> bool {
        true
    }
}

fn k(key: &str) -> Key {
    Key::parse(key).unwrap()
}

fn ttl(ms: u64) -> Ttl {
    Ttl::from_millis(ms).unwrap()
}

fn spec(key: &str, owner: &str) -> Acquire {
    Acquire {
        key: k(key),
        owner: Owner::parse(owner).unwrap(),
        ttl: ttl(1000),
        wait: Wait::default(),
        request_id: None,
        options: Default::default(),
    }
}

fn delivered(delivery: Delivery) -> Grant {
    match delivery {
        Delivery::Granted(grant) => grant,
        Delivery::Refused(err, _) => panic!("expected a grant, got {err}"),
    }
}

fn granted(outcome: AcquireOutcome) -> Grant {
    match outcome {
        AcquireOutcome::Granted(grant) => grant,
        other => panic!("expected a grant, got {other:?}"),
    }
}

#[test]
fn fences_rise_across_keys() {
    let mut lessor = Lessor::<Tag>::new();
    let a = granted(lessor.acquire(spec("a", "o"), 0, None));
    let b = granted(lessor.acquire(spec("b", "o"), 0, None));
    assert!(b.term.fence > a.term.fence);
}

#[test]
fn a_held_key_is_busy_until_it_expires() {
    let mut lessor = Lessor::<Tag>::new();
    let first = granted(lessor.acquire(spec("k", "a"), 0, None));
    assert!(matches!(
        lessor.acquire(spec("k", "b"), 999, None),
        AcquireOutcome::Busy(Error::Busy {
            remaining_ms: 1,
            ..
        })
    ));
    let second = granted(lessor.acquire(spec("k", "b"), 1000, None));
    assert!(second.term.fence > first.term.fence);
    let previous = second.previous.expect("previous term");
    assert_eq!(previous.end, TermEnd::Expired);
    assert_eq!(previous.ended_at, 1000);
}

#[test]
fn waiters_are_served_in_arrival_order() {
    let mut lessor = Lessor::<Tag>::new();
    let held = granted(lessor.acquire(spec("k", "a"), 0, None));
    assert!(matches!(
        lessor.acquire(spec("k", "b"), 1, Some(Tag("b"))),
        AcquireOutcome::Queued(_)
    ));
    assert!(matches!(
        lessor.acquire(spec("k", "c"), 2, Some(Tag("c"))),
        AcquireOutcome::Queued(_)
    ));
    lessor
        .release(&k("k"), held.term.fence, held.term.lease_id, false, None, 3)
        .unwrap();
    let handoffs = lessor.take_handoffs();
    assert_eq!(handoffs.len(), 1);
    assert_eq!(handoffs[0].0, Tag("b"));
    // A newcomer arriving now queues behind c.
    assert!(matches!(
        lessor.acquire(spec("k", "d"), 4, None),
        AcquireOutcome::Busy(_)
    ));
    lessor.expire_due(2000);
    let handoffs = lessor.take_handoffs();
    assert_eq!(handoffs[0].0, Tag("c"));
}

#[test]
fn renew_never_shortens_a_term() {
    let mut lessor = Lessor::<Tag>::new();
    let g = granted(lessor.acquire(spec("k", "a"), 0, None));
    let (term, _) = lessor
        .renew(&k("k"), g.term.fence, g.term.lease_id, Some(ttl(100)), 10)
        .unwrap();
    assert_eq!(term.expires_at, 1000);
    assert_eq!(term.ttl, ttl(100));
}

#[test]
fn urgent_changes_never_wait_behind_a_lazy_backlog() {
    let mut lessor = Lessor::<Tag>::new();
    for i in 0..5 {
        granted(lessor.acquire(spec(&format!("e{i}"), "a"), 0, None));
    }
    lessor.take_batch();
    // Five expiries (lazy), then a grant (urgent).
    assert!(lessor.expire_due_up_to(1000, 3));
    assert!(!lessor.expire_due_up_to(1000, 3));
    let g = granted(lessor.acquire(spec("k", "b"), 1000, None));
    let batch = lessor.take_batch_up_to(2);
    assert_eq!(batch.records.len(), 3);
    assert!(batch.records.iter().any(|r| r.key == k("k")));
    assert_eq!(batch.seq, g.visible_seq);
    assert!(lessor.has_lazy_backlog());
    assert_eq!(lessor.take_batch_up_to(2).records.len(), 2);
    assert_eq!(lessor.take_batch_up_to(2).records.len(), 1);
    assert!(!lessor.has_dirty());
}

#[test]
fn restore_gives_unended_terms_their_full_ttl_again() {
    let mut lessor = Lessor::<Tag>::new();
    let g = granted(lessor.acquire(spec("k", "a"), 0, None));
    let batch = lessor.take_batch();
    let restored = Lessor::<Tag>::restore(
        batch.records,
        batch.calls,
        batch.fence_high_water,
        5000,
        DEFAULT_RETENTION_MS,
    );
    let mut restored = restored;
    let (term, _) = restored.check(&k("k"), g.term.fence, 5999).unwrap();
    assert_eq!(term.expires_at, 6000);
    let next = granted(restored.acquire(spec("other", "a"), 5999, None));
    assert!(next.term.fence > g.term.fence);
}

/// A lessor with a 100 ms retention, so tests can step past it.
fn short_retention() -> Lessor<Tag> {
    Lessor::restore(Vec::new(), Vec::new(), 0, 0, 100)
}

#[test]
fn a_cleanly_released_key_is_forgotten_after_the_retention() {
    let mut lessor = short_retention();
    let g = granted(lessor.acquire(spec("done", "a"), 0, None));
    let s = granted(lessor.acquire(spec("paused", "a"), 0, None));
    lessor
        .release(&k("done"), g.term.fence, g.term.lease_id, false, None, 10)
        .unwrap();
    lessor
        .release(&k("paused"), s.term.fence, s.term.lease_id, true, None, 10)
        .unwrap();
    lessor.take_batch();

    lessor.expire_due(109);
    assert_eq!(lessor.key_count(), 2, "kept until the retention ends");
    assert_eq!(lessor.next_deadline(), Some(110));
    lessor.expire_due(110);
    assert_eq!(lessor.key_count(), 1, "the suspended key stays");
    assert!(lessor.has_dirty());
    let batch = lessor.take_batch();
    assert_eq!(batch.forgotten, vec![k("done")]);
    // Its history goes with it, named by fence (storage keys history so).
    assert_eq!(batch.forgotten_history, vec![g.term.fence]);
    assert!(batch.records.is_empty());
    assert!(matches!(
        lessor.get(&k("done"), 110),
        Err(Error::NotFound(_))
    ));
    assert!(matches!(
        lessor.check(&k("done"), g.term.fence, 110),
        Err(Error::StaleFence {
            reason: StaleReason::Unknown,
            ..
        })
    ));
    // Fences still rise for the forgotten key, in memory and after a restart.
    let again = granted(lessor.acquire(spec("done", "b"), 111, None));
    assert!(again.term.fence > s.term.fence);
    assert!(again.previous.is_none());
    let restored = Lessor::<Tag>::restore(Vec::new(), Vec::new(), batch.fence_high_water, 0, 100);
    let mut restored = restored;
    let after = granted(restored.acquire(spec("x", "c"), 0, None));
    assert!(after.term.fence > s.term.fence);
}

#[test]
fn a_key_taken_again_or_released_again_is_not_forgotten_early() {
    let mut lessor = short_retention();
    let g = granted(lessor.acquire(spec("k", "a"), 0, None));
    lessor
        .release(&k("k"), g.term.fence, g.term.lease_id, false, None, 10)
        .unwrap();
    // Taken again before the retention ends: kept while held.
    let h = granted(lessor.acquire(spec("k", "b"), 50, None));
    lessor.expire_due(200);
    assert_eq!(lessor.key_count(), 1);
    lessor
        .renew(
            &k("k"),
            h.term.fence,
            h.term.lease_id,
            Some(ttl(10_000)),
            200,
        )
        .unwrap();
    lessor
        .release(&k("k"), h.term.fence, h.term.lease_id, false, None, 300)
        .unwrap();
    lessor.expire_due(399);
    assert_eq!(
        lessor.key_count(),
        1,
        "retention counts from the last release"
    );
    lessor.expire_due(400);
    assert_eq!(lessor.key_count(), 0);
    assert_eq!(lessor.prune_entries(), 0, "no entries left behind");
}

#[test]
fn a_forgotten_key_created_again_in_the_same_batch_is_written_back() {
    let mut lessor = short_retention();
    let g = granted(lessor.acquire(spec("k", "a"), 0, None));
    lessor
        .release(&k("k"), g.term.fence, g.term.lease_id, false, None, 0)
        .unwrap();
    lessor.take_batch();
    lessor.expire_due(100);
    let again = granted(lessor.acquire(spec("k", "b"), 100, None));
    let batch = lessor.take_batch();
    // The store deletes first, then writes the new row.
    assert_eq!(batch.forgotten, vec![k("k")]);
    assert_eq!(batch.records.len(), 1);
    assert_eq!(
        batch.records[0].live.as_ref().unwrap().fence,
        again.term.fence
    );
}

#[test]
fn a_key_handed_over_again_and_again_keeps_one_timer_entry() {
    let mut lessor = Lessor::<Tag>::new();
    let mut held = granted(lessor.acquire(spec("hot", "a"), 0, None));
    for now in 0..10_000u64 {
        // A waiter queues; the holder renews, then releases: the key
        // goes to the waiter at once.
        assert!(matches!(
            lessor.acquire(spec("hot", "w"), now, Some(Tag("w"))),
            AcquireOutcome::Queued(_)
        ));
        lessor
            .renew(&k("hot"), held.term.fence, held.term.lease_id, None, now)
            .unwrap();
        lessor
            .release(
                &k("hot"),
                held.term.fence,
                held.term.lease_id,
                now % 2 == 0,
                None,
                now,
            )
            .unwrap();
        let mut handoffs = lessor.take_handoffs();
        assert_eq!(handoffs.len(), 1);
        held = delivered(handoffs.pop().unwrap().1);
    }
    assert_eq!(
        lessor.deadline_entries(),
        1,
        "one entry per key, whatever its history"
    );
    // The one entry still expires the live term, at its deadline.
    lessor.expire_due(held.term.expires_at);
    assert!(
        lessor
            .get(&k("hot"), held.term.expires_at)
            .unwrap()
            .live
            .is_none()
    );
    assert_eq!(lessor.deadline_entries(), 0);
}

#[test]
fn a_renewed_term_expires_at_its_new_deadline_not_the_first() {
    let mut lessor = Lessor::<Tag>::new();
    let g = granted(lessor.acquire(spec("k", "a"), 0, None));
    lessor
        .renew(&k("k"), g.term.fence, g.term.lease_id, None, 900)
        .unwrap();
    lessor.expire_due(1000);
    assert!(lessor.check(&k("k"), g.term.fence, 1000).is_ok());
    assert_eq!(lessor.deadline_entries(), 1);
    lessor.expire_due(1900);
    assert!(lessor.check(&k("k"), g.term.fence, 1900).is_err());
    assert_eq!(lessor.deadline_entries(), 0);
}

#[test]
fn a_short_term_after_a_long_one_expires_on_time() {
    let mut lessor = Lessor::<Tag>::new();
    let long = Acquire {
        ttl: Ttl::from_millis(100_000).unwrap(),
        ..spec("k", "a")
    };
    let g = granted(lessor.acquire(long, 0, None));
    lessor
        .release(&k("k"), g.term.fence, g.term.lease_id, false, None, 1)
        .unwrap();
    let short = granted(lessor.acquire(spec("k", "b"), 1, None));
    assert_eq!(lessor.next_deadline(), Some(short.term.expires_at));
    lessor.expire_due(short.term.expires_at);
    assert!(
        lessor
            .get(&k("k"), short.term.expires_at)
            .unwrap()
            .live
            .is_none()
    );
}

#[test]
fn a_retried_release_of_a_superseded_fence_is_refused_as_superseded() {
    let mut lessor = Lessor::<Tag>::new();
    let first = granted(lessor.acquire(spec("k", "a"), 0, None));
    lessor
        .release(
            &k("k"),
            first.term.fence,
            first.term.lease_id,
            false,
            None,
            1,
        )
        .unwrap();
    // The retry before anyone took the key: the same answer again.
    assert!(
        lessor
            .release(
                &k("k"),
                first.term.fence,
                first.term.lease_id,
                false,
                None,
                2
            )
            .is_ok()
    );
    let second = granted(lessor.acquire(spec("k", "b"), 3, None));
    let superseded = StaleReason::Superseded {
        by: second.term.fence,
    };
    assert_eq!(
        lessor.release(
            &k("k"),
            first.term.fence,
            first.term.lease_id,
            false,
            None,
            4
        ),
        Err(stale(&k("k"), first.term.fence, superseded))
    );
    assert_eq!(
        lessor.check(&k("k"), first.term.fence, 4),
        Err(stale(&k("k"), first.term.fence, superseded))
    );
    // The newer holder is untouched.
    assert!(lessor.check(&k("k"), second.term.fence, 4).is_ok());
}

#[test]
fn a_retry_waiting_behind_its_original_gets_the_replay_with_it() {
    let mut lessor = Lessor::<Tag>::new();
    let held = granted(lessor.acquire(spec("k", "a"), 0, None));
    let with_id = Acquire {
        request_id: RequestId::parse_optional("r1").unwrap(),
        ..spec("k", "b")
    };
    for tag in ["original", "retry"] {
        assert!(matches!(
            lessor.acquire(with_id.clone(), 1, Some(Tag(tag))),
            AcquireOutcome::Queued(_)
        ));
    }
    assert!(matches!(
        lessor.acquire(spec("k", "c"), 1, Some(Tag("c"))),
        AcquireOutcome::Queued(_)
    ));
    lessor
        .release(&k("k"), held.term.fence, held.term.lease_id, false, None, 2)
        .unwrap();
    let handoffs: Vec<(Tag, Grant)> = lessor
        .take_handoffs()
        .into_iter()
        .map(|(tag, d)| (tag, delivered(d)))
        .collect();
    assert_eq!(handoffs.len(), 2);
    assert_eq!(handoffs[0].0, Tag("original"));
    assert!(!handoffs[0].1.replayed);
    assert_eq!(handoffs[1].0, Tag("retry"));
    assert!(handoffs[1].1.replayed);
    assert_eq!(handoffs[0].1.term, handoffs[1].1.term);
    assert_eq!(lessor.waiter_count(), 1, "c still waits");
}

#[test]
fn list_reports_the_sequence_of_keys_its_filter_left_out() {
    let mut lessor = Lessor::<Tag>::new();
    let g = granted(lessor.acquire(spec("s:1", "a"), 0, None));
    lessor
        .release(&k("s:1"), g.term.fence, g.term.lease_id, true, None, 1)
        .unwrap();
    lessor.take_batch();
    let taken = granted(lessor.acquire(spec("s:1", "b"), 2, None));
    let page = lessor.list("s:", ListFilter::Recoverable, None, 10, 100, 2);
    assert!(page.keys.is_empty());
    assert_eq!(page.visible_seq, taken.visible_seq);
}

#[test]
fn a_key_with_running_tool_calls_is_not_forgotten() {
    let mut lessor = short_retention();
    let g = granted(lessor.acquire(spec("k", "a"), 0, None));
    let calls = vec![CallSpec {
        call_id: "c1".into(),
        name: "tool".into(),
        input_digest: String::new(),
        across_turns: Default::default(),
        turn: Default::default(),
    }];
    lessor
        .begin_tool_calls(&k("k"), g.term.fence, g.term.lease_id, calls, 0)
        .unwrap();
    lessor
        .release(&k("k"), g.term.fence, g.term.lease_id, false, None, 0)
        .unwrap();
    lessor.expire_due(1_000);
    assert_eq!(lessor.key_count(), 1);
    assert!(lessor.take_batch().forgotten.is_empty());
}

/// The metrics counts as a full scan of the table finds them.
fn recount(lessor: &Lessor<Tag>) -> (usize, usize, usize) {
    let live = lessor.keys.values().filter(|s| s.live.is_some()).count();
    let waiters = lessor.keys.values().map(|s| s.waiters.len()).sum();
    let unsettled = lessor.keys.values().map(|s| s.unsettled_tool_calls()).sum();
    (live, waiters, unsettled)
}

fn assert_stats_match(lessor: &Lessor<Tag>) {
    let stats = lessor.stats();
    assert_eq!(
        (stats.live_terms, stats.waiters, stats.unsettled_tool_calls),
        recount(lessor),
        "{stats:?}"
    );
    assert_eq!(stats.keys, lessor.keys.len());
}

#[test]
fn stats_follow_the_table() {
    let mut lessor = short_retention();
    let a = granted(lessor.acquire(spec("a", "o"), 0, None));
    let b = granted(lessor.acquire(spec("b", "o"), 0, None));
    let AcquireOutcome::Queued(w1) = lessor.acquire(spec("a", "w1"), 1, Some(Tag("w1"))) else {
        panic!("queued");
    };
    assert!(matches!(
        lessor.acquire(spec("a", "w2"), 1, Some(Tag("w2"))),
        AcquireOutcome::Queued(_)
    ));
    assert_stats_match(&lessor);
    assert!(lessor.cancel_waiter(&k("a"), w1));
    assert_stats_match(&lessor);
    let calls = vec![
        CallSpec {
            call_id: "c1".into(),
            name: "t".into(),
            input_digest: String::new(),
            across_turns: Default::default(),
            turn: Default::default(),
        },
        CallSpec {
            call_id: "c2".into(),
            name: "t".into(),
            input_digest: String::new(),
            across_turns: Default::default(),
            turn: Default::default(),
        },
    ];
    lessor
        .begin_tool_calls(&k("b"), b.term.fence, b.term.lease_id, calls, 2)
        .unwrap();
    let settle = crate::ledger::Settlement {
        call_id: "c1".into(),
        outcome: crate::ledger::CallState::Succeeded,
        result_digest: String::new(),
        result: Vec::new(),
        turn: Default::default(),
    };
    lessor
        .settle_tool_call(&k("b"), b.term.fence, b.term.lease_id, settle.clone(), 3)
        .unwrap();
    // A second settle of the same call changes nothing.
    lessor
        .settle_tool_call(&k("b"), b.term.fence, b.term.lease_id, settle, 3)
        .unwrap();
    assert_stats_match(&lessor);
    lessor
        .renew(&k("b"), b.term.fence, b.term.lease_id, None, 4)
        .unwrap();
    // a is released: w2 gets it at once.
    lessor
        .release(&k("a"), a.term.fence, a.term.lease_id, false, None, 5)
        .unwrap();
    assert_eq!(lessor.take_handoffs().len(), 1);
    assert_stats_match(&lessor);
    // Everything expires; the released key is forgotten after retention.
    lessor.expire_due(10_000);
    assert_stats_match(&lessor);
    let stats = lessor.stats();
    assert_eq!(
        (
            stats.grants,
            stats.releases,
            stats.expirations,
            stats.renewals
        ),
        (3, 1, 2, 1)
    );
    assert_eq!(stats.unsettled_tool_calls, 1);
    // A restore counts what it loads.
    let batch = lessor.take_batch();
    let restored = Lessor::<Tag>::restore(
        batch.records,
        batch.calls,
        batch.fence_high_water,
        10_000,
        100,
    );
    assert_stats_match(&restored);
}

// ---- lifecycle: lock-delay, handoff, quarantine, history ----

fn with_options(key: &str, owner: &str, options: AcquireOptions) -> Acquire {
    Acquire {
        options,
        ..spec(key, owner)
    }
}

fn delayed(key: &str, owner: &str, lock_delay_ms: u64) -> Acquire {
    with_options(
        key,
        owner,
        AcquireOptions {
            lock_delay_ms,
            ..Default::default()
        },
    )
}

#[test]
fn lock_delay_holds_after_expiry_and_not_after_release() {
    let mut lessor: Lessor<Tag> = Lessor::new();
    // Expired at 1000: nobody gets the key until 1500.
    granted(lessor.acquire(delayed("k", "a", 500), 0, None));
    match lessor.acquire(spec("k", "b"), 1200, None) {
        AcquireOutcome::Busy(Error::Reserved {
            reservation: crate::error::Held::LockDelay { after },
            remaining_ms,
            ..
        }) => {
            assert_eq!(after, Fence(1));
            assert_eq!(remaining_ms, 300);
        }
        other => panic!("expected a lock-delay refusal, got {other:?}"),
    }
    let view = lessor.get(&k("k"), 1200).unwrap();
    assert!(view.reservation.is_some());
    assert!(view.recoverable, "in lock-delay, still recoverable");
    let b = granted(lessor.acquire(spec("k", "b"), 1500, None));
    assert_eq!(b.term.fence, Fence(2));

    // Released cleanly: no delay.
    let c = granted(lessor.acquire(delayed("r", "c", 500), 0, None));
    lessor
        .release(&k("r"), c.term.fence, c.term.lease_id, false, None, 10)
        .unwrap();
    granted(lessor.acquire(spec("r", "d"), 11, None));
}

#[test]
fn a_waiter_keeps_its_place_through_a_lock_delay() {
    let mut lessor: Lessor<Tag> = Lessor::new();
    granted(lessor.acquire(delayed("k", "a", 500), 0, None));
    assert!(matches!(
        lessor.acquire(spec("k", "w"), 10, Some(Tag("w"))),
        AcquireOutcome::Queued(_)
    ));
    lessor.expire_due(1000);
    assert!(lessor.take_handoffs().is_empty(), "the delay runs first");
    assert_eq!(lessor.waiter_count(), 1);
    assert_eq!(lessor.next_deadline(), Some(1500));
    lessor.expire_due(1500);
    let handoffs = lessor.take_handoffs();
    assert_eq!(handoffs.len(), 1);
    assert_eq!(handoffs[0].0, Tag("w"));
}

fn handoff(successor: &str, for_ms: u64) -> Option<Handoff> {
    Handoff::parse_optional(successor, for_ms).unwrap()
}

#[test]
fn a_handoff_goes_to_the_successor_ahead_of_waiters() {
    let mut lessor: Lessor<Tag> = Lessor::new();
    let a = granted(lessor.acquire(spec("k", "a"), 0, None));
    assert!(matches!(
        lessor.acquire(spec("k", "w"), 1, Some(Tag("w"))),
        AcquireOutcome::Queued(_)
    ));
    lessor
        .release(
            &k("k"),
            a.term.fence,
            a.term.lease_id,
            false,
            handoff("ui", 200),
            10,
        )
        .unwrap();
    assert!(
        lessor.take_handoffs().is_empty(),
        "the waiter is not the successor"
    );
    match lessor.acquire(spec("k", "x"), 20, None) {
        AcquireOutcome::Busy(Error::Reserved {
            reservation: crate::error::Held::Handoff { successor },
            remaining_ms: 190,
            ..
        }) => assert_eq!(successor, "ui"),
        other => panic!("expected a reservation refusal, got {other:?}"),
    }
    let ui = granted(lessor.acquire(spec("k", "ui"), 30, None));
    assert!(ui.term.lifecycle.handed_off);
    assert_eq!(ui.previous.as_ref().unwrap().end, TermEnd::Released);
    assert_eq!(
        lessor.waiter_count(),
        1,
        "w still waits behind the successor"
    );
}

#[test]
fn a_waiting_successor_gets_the_key_at_the_release() {
    let mut lessor: Lessor<Tag> = Lessor::new();
    let a = granted(lessor.acquire(spec("k", "a"), 0, None));
    for who in ["w", "ui"] {
        assert!(matches!(
            lessor.acquire(spec("k", who), 1, Some(Tag(who))),
            AcquireOutcome::Queued(_)
        ));
    }
    lessor
        .release(
            &k("k"),
            a.term.fence,
            a.term.lease_id,
            true,
            handoff("ui", 200),
            10,
        )
        .unwrap();
    let handoffs = lessor.take_handoffs();
    assert_eq!(handoffs.len(), 1);
    assert_eq!(handoffs[0].0, Tag("ui"));
    let grant = match &handoffs[0].1 {
        Delivery::Granted(grant) => grant,
        Delivery::Refused(err, _) => panic!("{err}"),
    };
    assert!(grant.term.lifecycle.handed_off);
    assert_eq!(grant.previous.as_ref().unwrap().end, TermEnd::Suspended);
}

#[test]
fn a_handoff_times_out_to_the_waiter() {
    let mut lessor: Lessor<Tag> = Lessor::new();
    let a = granted(lessor.acquire(spec("k", "a"), 0, None));
    assert!(matches!(
        lessor.acquire(spec("k", "w"), 1, Some(Tag("w"))),
        AcquireOutcome::Queued(_)
    ));
    lessor
        .release(
            &k("k"),
            a.term.fence,
            a.term.lease_id,
            false,
            handoff("ui", 200),
            10,
        )
        .unwrap();
    lessor.expire_due(209);
    assert!(lessor.take_handoffs().is_empty());
    lessor.expire_due(210);
    let handoffs = lessor.take_handoffs();
    assert_eq!(handoffs.len(), 1);
    assert_eq!(handoffs[0].0, Tag("w"));
    // The successor, late, is now just busy.
    assert!(matches!(
        lessor.acquire(spec("k", "ui"), 220, None),
        AcquireOutcome::Busy(Error::Busy { .. })
    ));
}

fn limited(key: &str, owner: &str, max_recoveries: u32) -> Acquire {
    with_options(
        key,
        owner,
        AcquireOptions {
            max_recoveries: Some(max_recoveries),
            ..Default::default()
        },
    )
}

/// A term past its deadline that nothing has ended yet (no timer tick, no
/// operation on its key) reads as its end will write it: a reader of the
/// table sees the failure it counts, the quarantine it earns and the
/// lock-delay it starts, as PostgreSQL's readers derive them from a row the
/// sweeper has not moved (the same rule, `Term::ending`).
#[test]
fn a_lapsed_term_reads_as_its_end_will_write_it() {
    let mut lessor: Lessor<Tag> = Lessor::new();
    let options = AcquireOptions {
        max_recoveries: Some(1),
        lock_delay_ms: 500,
        ..Default::default()
    };
    let g = granted(lessor.acquire(with_options("k", "w", options), 0, None));
    let now = g.term.expires_at + 10;
    // No expire_due: the table still holds the term as live.
    let recoverable = lessor.list("", ListFilter::Recoverable, None, 10, 100, now);
    assert!(
        recoverable.keys.is_empty(),
        "an expiry that earns quarantine is not for recoverers: {:?}",
        recoverable.keys
    );
    let quarantined = lessor.list("", ListFilter::Quarantined, None, 10, 100, now);
    assert_eq!(quarantined.keys.len(), 1, "listed as quarantined");
    let view = &quarantined.keys[0];
    assert!(view.live.is_none());
    assert_eq!(
        view.reservation,
        Some(Reservation::LockDelay {
            after: g.term.fence,
            until: g.term.expires_at + 500
        })
    );
    // And the key, once brought up to date, says the same.
    let got = lessor.get(&k("k"), now).unwrap();
    assert!(got.quarantined && !got.recoverable);
    assert_eq!(got.reservation, view.reservation);
}

#[test]
fn a_key_is_quarantined_after_k_failed_terms_in_a_row() {
    let mut lessor: Lessor<Tag> = Lessor::new();
    let mut now = 0;
    // Expired, suspended, expired: three failures in a row at K = 3.
    for round in 0..3 {
        let g = granted(lessor.acquire(limited("k", "w", 3), now, None));
        if round == 1 {
            lessor
                .release(&k("k"), g.term.fence, g.term.lease_id, true, None, now + 1)
                .unwrap();
        }
        now += 2000;
        lessor.expire_due(now);
        assert_eq!(
            lessor.get(&k("k"), now).unwrap().quarantined,
            round == 2,
            "round {round}"
        );
    }
    match lessor.acquire(spec("k", "w"), now, None) {
        AcquireOutcome::Busy(Error::Quarantined {
            failures, recent, ..
        }) => {
            assert_eq!(failures, 3);
            assert_eq!(
                recent,
                "fence 1 expired, fence 2 suspended, fence 3 expired"
            );
        }
        other => panic!("expected quarantine, got {other:?}"),
    }
    let page = lessor.list("", ListFilter::Quarantined, None, 10, 100, now);
    assert_eq!(page.keys.len(), 1);
    assert_eq!(lessor.stats().quarantined, 1);
    assert_eq!(lessor.stats().quarantines, 1);
    let page = lessor.list("", ListFilter::Recoverable, None, 10, 100, now);
    assert!(
        page.keys.is_empty(),
        "a quarantined key is not for recoverers"
    );

    // Force gets it; lifting the quarantine lets anyone in.
    let forced = AcquireOptions {
        force: true,
        ..Default::default()
    };
    let f = granted(lessor.acquire(with_options("k", "admin", forced), now, None));
    lessor
        .release(&k("k"), f.term.fence, f.term.lease_id, true, None, now + 1)
        .unwrap();
    assert!(lessor.get(&k("k"), now + 1).unwrap().quarantined);
    let (view, _) = lessor.unquarantine(&k("k"), now + 2).unwrap();
    assert!(!view.quarantined);
    assert_eq!(lessor.stats().quarantined, 0);
    assert!(view.recoverable);
    granted(lessor.acquire(spec("k", "w"), now + 3, None));
}

#[test]
fn a_clean_release_resets_the_count_and_waiters_are_told_of_quarantine() {
    let mut lessor: Lessor<Tag> = Lessor::new();
    let g = granted(lessor.acquire(limited("k", "w", 2), 0, None));
    lessor.expire_due(1000);
    let g2 = granted(lessor.acquire(limited("k", "w", 2), 1000, None));
    assert_ne!(g.term.fence, g2.term.fence);
    lessor
        .release(&k("k"), g2.term.fence, g2.term.lease_id, false, None, 1001)
        .unwrap();
    // One more failure is not two in a row.
    granted(lessor.acquire(limited("k", "w", 2), 1002, None));
    assert!(matches!(
        lessor.acquire(spec("k", "waiter"), 1003, Some(Tag("waiter"))),
        AcquireOutcome::Queued(_)
    ));
    lessor.expire_due(2002);
    let handoffs = lessor.take_handoffs();
    assert_eq!(
        handoffs.len(),
        1,
        "one failure since the release: not quarantined"
    );
    assert!(matches!(handoffs[0].1, Delivery::Granted(_)));

    // At K = 1 the expiry quarantines the key, and its waiter is told so
    // instead of waiting for nothing.
    granted(lessor.acquire(limited("q", "w", 1), 0, None));
    assert!(matches!(
        lessor.acquire(spec("q", "waiter"), 1, Some(Tag("waiter"))),
        AcquireOutcome::Queued(_)
    ));
    lessor.expire_due(1000);
    let handoffs = lessor.take_handoffs();
    assert_eq!(handoffs.len(), 1);
    match &handoffs[0].1 {
        Delivery::Refused(Error::Quarantined { failures: 1, .. }, _) => {}
        other => panic!("expected a quarantine refusal, got {other:?}"),
    }
    assert_eq!(lessor.waiter_count(), 0);
}

#[test]
fn history_pages_newest_first_and_keeps_the_last_n() {
    let mut lessor: Lessor<Tag> = Lessor::new();
    lessor.set_history_len(3);
    for i in 0..5u64 {
        let g = granted(lessor.acquire(spec("k", "w"), i * 10, None));
        lessor
            .release(
                &k("k"),
                g.term.fence,
                g.term.lease_id,
                false,
                None,
                i * 10 + 5,
            )
            .unwrap();
    }
    let page = lessor.history(&k("k"), None, 2, 100).unwrap();
    let fences: Vec<u64> = page.entries.iter().map(|h| h.fence.0).collect();
    assert_eq!(fences, vec![5, 4]);
    assert_eq!(page.next_before, Some(Fence(4)));
    let page = lessor.history(&k("k"), page.next_before, 2, 100).unwrap();
    let fences: Vec<u64> = page.entries.iter().map(|h| h.fence.0).collect();
    assert_eq!(fences, vec![3]);
    assert_eq!(page.next_before, None);
    assert_eq!(page.entries[0].acquired_at, 20);
    assert_eq!(page.entries[0].ended_at, 25);

    // Storage gets each entry once, and the fence below which to drop.
    let batch = lessor.take_batch();
    let record = batch.records.iter().find(|r| r.key == "k").unwrap();
    let fences: Vec<u64> = record.history.iter().map(|h| h.fence.0).collect();
    assert_eq!(fences, vec![3, 4, 5]);
    assert_eq!(record.history_dropped, vec![Fence(1), Fence(2)]);
    let g = granted(lessor.acquire(spec("k", "w"), 100, None));
    lessor
        .release(&k("k"), g.term.fence, g.term.lease_id, false, None, 101)
        .unwrap();
    let batch = lessor.take_batch();
    let record = batch.records.iter().find(|r| r.key == "k").unwrap();
    assert_eq!(record.history.len(), 1);
    assert_eq!(record.history_dropped, vec![Fence(3)]);
}

#[test]
fn reservations_quarantine_and_history_survive_a_restore() {
    let mut lessor: Lessor<Tag> = Lessor::new();
    let a = granted(lessor.acquire(limited("q", "w", 1), 0, None));
    lessor
        .release(&k("q"), a.term.fence, a.term.lease_id, true, None, 1)
        .unwrap();
    let b = granted(lessor.acquire(spec("h", "w"), 0, None));
    lessor
        .release(
            &k("h"),
            b.term.fence,
            b.term.lease_id,
            false,
            handoff("ui", 500),
            2,
        )
        .unwrap();
    let batch = lessor.take_batch();
    let mut restored: Lessor<Tag> =
        Lessor::restore(batch.records, Vec::new(), 0, 100, DEFAULT_RETENTION_MS);
    assert!(restored.get(&k("q"), 100).unwrap().quarantined);
    assert_eq!(
        restored
            .history(&k("q"), None, 10, 100)
            .unwrap()
            .entries
            .len(),
        1
    );
    assert!(matches!(
        restored.acquire(spec("h", "x"), 100, None),
        AcquireOutcome::Busy(Error::Reserved { .. })
    ));
    granted(restored.acquire(spec("h", "ui"), 101, None));
}

// ---- events: revisions given at commit, with their key's row ----

#[test]
fn events_get_revisions_in_commit_order_and_wait_for_their_keys_row() {
    use crate::events::EventKind;
    let mut lessor: Lessor<Tag> = Lessor::new();
    lessor.resume_revisions(41);
    let long = Acquire {
        ttl: ttl(5000),
        ..spec("a", "w")
    };
    let a = granted(lessor.acquire(long, 0, None));
    granted(lessor.acquire(spec("lazy", "w"), 0, None));
    let batch = lessor.take_batch();
    let revisions: Vec<u64> = batch.events.iter().map(|e| e.revision).collect();
    assert_eq!(revisions, vec![42, 43]);
    assert_eq!(batch.events[0].kind, EventKind::Granted);
    assert_eq!(batch.events[0].fence, a.term.fence);

    // "lazy" expires (a lazy change), then "a" is released (urgent): a
    // batch that leaves the lazy key for later leaves its event too, and
    // the release gets the next revision.
    lessor.expire_due(1000);
    lessor
        .release(&k("a"), a.term.fence, a.term.lease_id, false, None, 1000)
        .unwrap();
    let batch = lessor.take_batch_up_to(0);
    assert_eq!(batch.records.len(), 1);
    assert_eq!(batch.events.len(), 1);
    assert_eq!(batch.events[0].key, "a");
    assert_eq!(batch.events[0].kind, EventKind::Released);
    assert_eq!(batch.events[0].revision, 44);
    let batch = lessor.take_batch();
    assert_eq!(batch.events.len(), 1);
    assert_eq!(batch.events[0].key, "lazy");
    assert_eq!(batch.events[0].kind, EventKind::Expired);
    assert_eq!(batch.events[0].revision, 45);
    assert_eq!(batch.events[0].at, 1000);
    assert_eq!(lessor.revision(), 45);
}

/// Partial takes during a lazy backlog: each batch carries exactly the
/// events of the keys it writes, each key's in order (an event left behind
/// with its key, then a newer one of the same key), and every event once.
#[test]
fn partial_takes_carry_exactly_their_keys_events_in_order() {
    use crate::events::EventKind;
    let mut lessor: Lessor<Tag> = Lessor::new();
    for i in 0..6 {
        granted(lessor.acquire(spec(&format!("e{i}"), "a"), 0, None));
    }
    lessor.take_batch();
    lessor.expire_due(1000); // six lazy expiries
    let first = lessor.take_batch_up_to(2);
    let keys: Vec<&str> = first.records.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, vec!["e0", "e1"]);
    let evs: Vec<(&str, EventKind)> = first
        .events
        .iter()
        .map(|e| (e.key.as_str(), e.kind))
        .collect();
    assert_eq!(
        evs,
        vec![("e0", EventKind::Expired), ("e1", EventKind::Expired)]
    );
    // e5, still in the backlog, is taken again (urgent), and e2 too.
    granted(lessor.acquire(spec("e5", "b"), 1001, None));
    granted(lessor.acquire(spec("e2", "b"), 1001, None));
    let second = lessor.take_batch_up_to(1);
    let keys: Vec<&str> = second.records.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, vec!["e2", "e3", "e5"]);
    let evs: Vec<(&str, EventKind)> = second
        .events
        .iter()
        .map(|e| (e.key.as_str(), e.kind))
        .collect();
    for key in ["e2", "e5"] {
        let mine: Vec<EventKind> = evs.iter().filter(|(k, _)| *k == key).map(|e| e.1).collect();
        assert_eq!(mine, vec![EventKind::Expired, EventKind::Granted], "{key}");
    }
    assert_eq!(evs.iter().filter(|(k, _)| *k == "e3").count(), 1);
    assert_eq!(evs.len(), 5);
    let rest = lessor.take_batch();
    let evs: Vec<(&str, EventKind)> = rest
        .events
        .iter()
        .map(|e| (e.key.as_str(), e.kind))
        .collect();
    assert_eq!(evs, vec![("e4", EventKind::Expired)]);
    let revisions: Vec<u64> = [first.events, second.events, rest.events]
        .concat()
        .iter()
        .map(|e| e.revision)
        .collect();
    assert!(
        revisions.windows(2).all(|w| w[1] == w[0] + 1),
        "{revisions:?}"
    );
    assert_eq!(revisions.len(), 8);
    assert!(!lessor.has_dirty());
}

/// Pages through List RECOVERABLE under `prefix`, `limit` keys at a time;
/// the keys, and the keys visited by each page.
fn recoverable_pages(
    lessor: &Lessor<Tag>,
    prefix: &str,
    limit: usize,
    now: Millis,
) -> (Vec<Key>, Vec<usize>) {
    let (mut keys, mut visits, mut after) = (Vec::new(), Vec::new(), None);
    loop {
        let (page, visited) = lessor.list_counting(
            prefix,
            ListFilter::Recoverable,
            after.as_ref(),
            limit,
            10_000,
            now,
        );
        assert!(page.keys.len() <= limit);
        assert!(page.keys.iter().all(|v| v.recoverable), "{page:?}");
        keys.extend(page.keys.iter().map(|v| v.key.clone()));
        visits.push(visited);
        match page.next_after {
            Some(next) => {
                assert_eq!(page.keys.len(), limit, "only a full page continues");
                after = Some(next);
            }
            None => return (keys, visits),
        }
        assert!(visits.len() < 10_000, "paging does not end");
    }
}

#[test]
fn list_recoverable_visits_only_the_keys_it_returns() {
    let mut lessor = Lessor::<Tag>::new();
    let mut expected = Vec::new();
    for i in 0..20_000 {
        let key = format!("s:{i:05}");
        let g = granted(lessor.acquire(spec(&key, "a"), 0, None));
        if i % 2_000 == 1_000 {
            lessor
                .release(&k(&key), g.term.fence, g.term.lease_id, true, None, 1)
                .unwrap();
            expected.push(k(&key));
        } else if i % 2 == 0 {
            lessor
                .release(&k(&key), g.term.fence, g.term.lease_id, false, None, 1)
                .unwrap();
        }
    }
    let (keys, visits) = recoverable_pages(&lessor, "s:", 3, 2);
    assert_eq!(keys, expected);
    // 10 keys in pages of 3: 3, 3, 3, 1, each page visiting what it returns.
    assert_eq!(visits, [3, 3, 3, 1]);
}

/// A small deterministic generator (no dependency for one test).
struct Lcg(u64);
impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

/// What a scan of every key says List RECOVERABLE under `prefix` returns,
/// and where a page of `limit` keys starting there ends.
fn scanned_recoverable(lessor: &Lessor<Tag>, prefix: &str, now: Millis) -> Vec<Key> {
    let all = lessor.list(prefix, ListFilter::All, None, 1000, usize::MAX, now);
    assert!(all.next_after.is_none());
    all.keys
        .into_iter()
        .filter(|v| v.recoverable)
        .map(|v| v.key)
        .collect()
}

#[test]
fn list_recoverable_from_the_index_matches_a_scan_of_every_key() {
    let mut lessor = short_retention();
    let mut rng = Lcg(16);
    let mut held: BTreeMap<Key, Term> = BTreeMap::new();
    let mut stored: BTreeMap<Key, KeyRecord> = BTreeMap::new();
    let mut now = 0;
    let keys: Vec<String> = (0..24)
        .map(|i| format!("{}/{i:02}", ["a", "b", "ab"][i % 3]))
        .collect();
    for step in 0..3_000 {
        now += rng.below(60);
        let key = k(&keys[rng.below(keys.len() as u64) as usize]);
        match rng.below(10) {
            0..=3 => {
                let mut request = spec(key.as_str(), "o");
                request.ttl = ttl(100 + rng.below(200));
                if rng.below(3) == 0 {
                    request.options.max_recoveries = Some(2);
                }
                if let AcquireOutcome::Granted(g) = lessor.acquire(request, now, None) {
                    held.insert(key, g.term);
                }
            }
            4..=5 => {
                if let Some(term) = held.remove(&key) {
                    let suspend = rng.below(2) == 0;
                    let _ = lessor.release(&key, term.fence, term.lease_id, suspend, None, now);
                }
            }
            6 => {
                if let Some(term) = held.get(&key) {
                    let _ = lessor.renew(&key, term.fence, term.lease_id, None, now);
                }
            }
            7 => {
                let _ = lessor.unquarantine(&key, now);
            }
            // The timer runs now and then, and not always to the end, so
            // terms whose TTL ran out unseen are common.
            8 => {
                lessor.expire_due_up_to(now, rng.below(4) as usize);
            }
            _ => {
                let batch = lessor.take_batch();
                for key in batch.forgotten {
                    stored.remove(&key);
                }
                for record in batch.records {
                    stored.insert(record.key.clone(), record);
                }
            }
        }
        if step % 7 != 0 {
            continue;
        }
        for prefix in ["", "a", "a/", "ab/", "b/", "c"] {
            let expected = scanned_recoverable(&lessor, prefix, now);
            for limit in [1, 2, 5, 1000] {
                let (got, _) = recoverable_pages(&lessor, prefix, limit, now);
                assert_eq!(
                    got, expected,
                    "step {step}, prefix {prefix:?}, limit {limit}"
                );
                // A full page continues exactly when another key under the
                // prefix follows it in the table, as a scan's page would.
                if let Some(last) = got.get(limit - 1) {
                    let (page, _) = lessor.list_counting(
                        prefix,
                        ListFilter::Recoverable,
                        None,
                        limit,
                        10_000,
                        now,
                    );
                    let all = lessor.list(prefix, ListFilter::All, None, 1000, usize::MAX, now);
                    let follows = all.keys.iter().any(|v| v.key > *last);
                    assert_eq!(page.next_after.is_some(), follows, "step {step}");
                }
            }
        }
    }
    // Restored from what storage holds, the index is rebuilt.
    let batch = lessor.take_batch();
    for key in batch.forgotten {
        stored.remove(&key);
    }
    for record in batch.records {
        stored.insert(record.key.clone(), record);
    }
    let restored = Lessor::<Tag>::restore(stored.into_values().collect(), Vec::new(), 0, now, 100);
    let expected = scanned_recoverable(&restored, "", now);
    assert!(!expected.is_empty(), "the run left recoverable keys");
    assert_eq!(recoverable_pages(&restored, "", 3, now).0, expected);
}
