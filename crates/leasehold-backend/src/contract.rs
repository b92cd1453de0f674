//! The contract every [`Backend`] keeps, as a library its crate's tests run
//! (feature `contract`): the way object_store ships one integration suite
//! each store calls. A backend crate writes how to start one of its
//! backends on fresh state (a [`Subject`]) and declares the suite with
//! [`contract_tests!`](crate::contract_tests):
//!
//! ```ignore
//! async fn start(settings: Settings) -> Option<Box<dyn Subject>> { ... }
//! leasehold_backend::contract_tests!(start);
//! ```
//!
//! Each case calls the trait directly (no gRPC in between), so what it
//! checks is the backend's own behaviour: one live term per key, fences
//! that only rise, refusals that name the rule, the waiters' line and its
//! limit, the tool-call ledger. The gRPC-level contract (`leasehold-server`'s
//! `tests/contract.rs`) runs the same rules, and more, through the services.

use std::time::Duration;

use futures_util::future::BoxFuture;
use leasehold_core::error::{Error, StaleReason};
use leasehold_core::lease::{AcquireOptions, Fence, Key, LeaseId, Owner, TermEnd, Ttl, Wait};
use leasehold_core::ledger::{BeginOutcome, CallSpec, CallState, Settlement};
use leasehold_core::lessor::{Acquire, Grant, ListFilter};

use crate::Backend;

/// How a case wants its backend set up; each field is one `leasehold serve`
/// flag both backends take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// `--max-waiters-per-key`.
    pub max_waiters_per_key: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_waiters_per_key: crate::DEFAULT_MAX_WAITERS_PER_KEY,
        }
    }
}

/// The settings the case `name` runs with (what [`contract_tests!`](crate::contract_tests) passes).
pub fn settings_for(name: &str) -> Settings {
    match name {
        "a_full_line_refuses_one_more_waiter" => Settings {
            max_waiters_per_key: 1,
        },
        _ => Settings::default(),
    }
}

/// One backend on fresh, empty state, and how a case drives it.
pub trait Subject: Send + Sync {
    /// The backend under test.
    fn backend(&self) -> &dyn Backend;

    /// Lets `ms` of lease time pass (a clock step, or real time on a
    /// database's clock), and the backend act on what expired.
    fn pass(&self, ms: u64) -> BoxFuture<'_, ()>;

    /// Waits, for a bounded time, until `n` Acquires are in `key`'s line.
    fn in_line<'a>(&'a self, key: &'a Key, n: usize) -> BoxFuture<'a, ()>;
}

/// Declares every case of the contract as a `#[tokio::test]` of the calling
/// crate, each on a backend `$start(settings)` makes (`None`: skipped, as
/// when a database is not configured). The caller needs tokio (macros,
/// rt-multi-thread) among its dev-dependencies.
#[macro_export]
macro_rules! contract_tests {
    ($start:path) => {
        $crate::contract_tests!(@cases $start;
            a_term_is_granted_checked_renewed_and_released,
            fences_strictly_increase_and_never_repeat,
            a_held_key_is_busy_naming_its_holder,
            an_expired_term_is_refused_and_its_key_granted_again,
            a_wrong_lease_id_is_permission_denied,
            a_suspended_term_leaves_the_key_recoverable,
            an_expiry_at_the_recovery_limit_quarantines_its_key,
            a_waiter_gets_the_key_once_it_is_released,
            a_full_line_refuses_one_more_waiter,
            an_unknown_key_is_not_found,
            a_tool_call_begins_once_and_its_first_settlement_wins,
            a_lost_term_can_begin_no_tool_call
        );
    };
    (@cases $start:path; $($case:ident),* $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let settings = $crate::contract::settings_for(stringify!($case));
                let Some(subject) = $start(settings).await else {
                    return;
                };
                $crate::contract::$case(&*subject).await;
            }
        )*
    };
}

fn key(text: &str) -> Key {
    Key::parse(text).expect("a valid key")
}

fn owner(text: &str) -> Owner {
    Owner::parse(text).expect("a valid owner")
}

fn request(k: &str, who: &str, ttl_ms: u64, wait_ms: u64) -> Acquire {
    Acquire {
        key: key(k),
        owner: owner(who),
        ttl: Ttl::from_millis(ttl_ms).expect("a valid TTL"),
        wait: Wait::from_millis(wait_ms).expect("a valid wait"),
        request_id: None,
        options: AcquireOptions::default(),
    }
}

async fn grant(subject: &dyn Subject, k: &str, who: &str) -> Grant {
    subject
        .backend()
        .acquire(request(k, who, 10_000, 0))
        .await
        .expect("a free key is granted")
}

fn spec(call_id: &str) -> CallSpec {
    CallSpec {
        call_id: call_id.into(),
        name: "shell".into(),
        input_digest: String::new(),
        turn: String::new(),
        across_turns: false,
    }
}

/// Acquire, Check, Renew, Release of one term, and the key free after.
pub async fn a_term_is_granted_checked_renewed_and_released(subject: &dyn Subject) {
    let b = subject.backend();
    let g = grant(subject, "contract/a", "a").await;
    assert_eq!(g.term.owner, owner("a"));
    assert!(g.previous.is_none(), "a new key has no previous term");
    let k = key("contract/a");
    let checked = b
        .check(&k, g.term.fence)
        .await
        .expect("the live fence checks");
    assert_eq!(checked.fence, g.term.fence);
    let renewed = b
        .renew(&k, g.term.fence, g.term.lease_id, None)
        .await
        .expect("the holder renews");
    assert_eq!(renewed.fence, g.term.fence, "a renewal keeps the term");
    assert!(renewed.expires_at >= g.term.expires_at);
    let ended = b
        .release(&k, g.term.fence, g.term.lease_id, false, None)
        .await
        .expect("the holder releases");
    assert_eq!((ended.fence, ended.end), (g.term.fence, TermEnd::Released));
    match b.check(&k, g.term.fence).await {
        Err(Error::StaleFence {
            reason: StaleReason::Released { .. },
            ..
        }) => {}
        other => panic!("a released fence must be stale (released), got {other:?}"),
    }
    let view = b.get(&k).await.expect("a released key is known");
    assert!(view.live.is_none());
    assert_eq!(view.last_ended.map(|e| e.end), Some(TermEnd::Released));
}

/// Every grant's fence is above every earlier one, across keys and terms.
pub async fn fences_strictly_increase_and_never_repeat(subject: &dyn Subject) {
    let b = subject.backend();
    let mut last = Fence(0);
    for round in 0..3 {
        for k in ["contract/f1", "contract/f2"] {
            let g = grant(subject, k, &format!("o{round}")).await;
            assert!(
                g.term.fence > last,
                "fence {} after {}",
                g.term.fence.0,
                last.0
            );
            last = g.term.fence;
            b.release(&key(k), g.term.fence, g.term.lease_id, false, None)
                .await
                .expect("release");
        }
    }
}

/// A second Acquire of a held key, not waiting, is Busy and names the holder.
pub async fn a_held_key_is_busy_naming_its_holder(subject: &dyn Subject) {
    let g = grant(subject, "contract/busy", "a").await;
    match subject
        .backend()
        .acquire(request("contract/busy", "b", 10_000, 0))
        .await
    {
        Err(Error::Busy { holder, fence, .. }) => {
            assert_eq!((holder, fence), (owner("a"), g.term.fence));
        }
        other => panic!("a held key must be busy, got {other:?}"),
    }
}

/// Once its TTL passes, a term is refused everywhere (Check, Renew,
/// Release) as expired, and the key goes to the next Acquire with a higher
/// fence that names the expired term as previous.
pub async fn an_expired_term_is_refused_and_its_key_granted_again(subject: &dyn Subject) {
    let b = subject.backend();
    let k = key("contract/expiry");
    let g = b
        .acquire(request("contract/expiry", "a", 200, 0))
        .await
        .expect("grant");
    subject.pass(600).await;
    let expired = |r: &Result<(), Error>| {
        matches!(
            r,
            Err(Error::StaleFence {
                reason: StaleReason::Expired { .. },
                ..
            })
        )
    };
    let checked = b.check(&k, g.term.fence).await.map(|_| ());
    assert!(expired(&checked), "check: {checked:?}");
    let renewed = b
        .renew(&k, g.term.fence, g.term.lease_id, None)
        .await
        .map(|_| ());
    assert!(expired(&renewed), "renew: {renewed:?}");
    let released = b
        .release(&k, g.term.fence, g.term.lease_id, false, None)
        .await
        .map(|_| ());
    assert!(expired(&released), "release: {released:?}");
    let next = grant(subject, "contract/expiry", "b").await;
    assert!(next.term.fence > g.term.fence);
    let previous = next.previous.expect("the expired term is the previous one");
    assert_eq!(
        (previous.fence, previous.end),
        (g.term.fence, TermEnd::Expired)
    );
}

/// The fence alone is not the capability: another lease id is refused.
pub async fn a_wrong_lease_id_is_permission_denied(subject: &dyn Subject) {
    let b = subject.backend();
    let k = key("contract/capability");
    let g = grant(subject, "contract/capability", "a").await;
    for result in [
        b.renew(&k, g.term.fence, LeaseId::random(), None)
            .await
            .map(|_| ()),
        b.release(&k, g.term.fence, LeaseId::random(), false, None)
            .await
            .map(|_| ()),
    ] {
        assert!(
            matches!(result, Err(Error::PermissionDenied { .. })),
            "{result:?}"
        );
    }
    b.check(&k, g.term.fence)
        .await
        .expect("the term is still live");
}

/// A term released as unfinished leaves its key recoverable (and listed so).
pub async fn a_suspended_term_leaves_the_key_recoverable(subject: &dyn Subject) {
    let b = subject.backend();
    let k = key("contract/suspend");
    let g = grant(subject, "contract/suspend", "a").await;
    let ended = b
        .release(&k, g.term.fence, g.term.lease_id, true, None)
        .await
        .expect("suspend");
    assert_eq!(ended.end, TermEnd::Suspended);
    let view = b.get(&k).await.expect("get");
    assert!(view.recoverable, "a suspended key is recoverable");
    let page = b
        .list("contract/suspend", ListFilter::Recoverable, None, 10)
        .await
        .expect("list");
    assert_eq!(
        page.keys.iter().map(|v| v.key.clone()).collect::<Vec<_>>(),
        vec![k]
    );
}

/// An Acquire that waits in line gets the key when its holder lets go.
pub async fn a_waiter_gets_the_key_once_it_is_released(subject: &dyn Subject) {
    let b = subject.backend();
    let k = key("contract/line");
    let g = grant(subject, "contract/line", "a").await;
    let waiting = b.acquire(request("contract/line", "b", 10_000, 10_000));
    let waiter = tokio::spawn(waiting);
    subject.in_line(&k, 1).await;
    b.release(&k, g.term.fence, g.term.lease_id, false, None)
        .await
        .expect("release");
    let got = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter is served in time")
        .expect("the waiter's task")
        .expect("the waiter is granted");
    assert_eq!(got.term.owner, owner("b"));
    assert!(got.term.fence > g.term.fence);
}

/// `--max-waiters-per-key 1`: a second waiter is refused at once
/// (RESOURCE_EXHAUSTED naming the limit), the first keeps its place.
pub async fn a_full_line_refuses_one_more_waiter(subject: &dyn Subject) {
    let b = subject.backend();
    let k = key("contract/full");
    let g = grant(subject, "contract/full", "a").await;
    let first = tokio::spawn(b.acquire(request("contract/full", "b", 10_000, 10_000)));
    subject.in_line(&k, 1).await;
    // Bounded: on a manual clock a wait that is not refused never ends.
    let refused = tokio::time::timeout(
        Duration::from_secs(5),
        b.acquire(request("contract/full", "c", 10_000, 10_000)),
    )
    .await
    .expect("a full line refuses one more waiter at once, it does not queue it");
    match refused {
        Err(Error::ResourceExhausted { limit, .. }) => {
            assert!(limit.contains("waiters"), "the limit is named: {limit}");
        }
        other => panic!("a full line must refuse one more waiter, got {other:?}"),
    }
    b.release(&k, g.term.fence, g.term.lease_id, false, None)
        .await
        .expect("release");
    let got = tokio::time::timeout(Duration::from_secs(10), first)
        .await
        .expect("the first waiter is served")
        .expect("task")
        .expect("granted");
    assert_eq!(got.term.owner, owner("b"));
}

/// A term that expires as its key's last allowed failure (a recovery
/// limit of 1) quarantines the key, whether or not anything has moved the term yet:
/// Get shows it quarantined, not recoverable, in its lock-delay; List gives
/// it to Quarantined and not to Recoverable. Not even a forced Acquire
/// enters the lock-delay (the dead holder's writes drain first); after it,
/// a plain Acquire is refused QUARANTINED and a forced one is granted.
pub async fn an_expiry_at_the_recovery_limit_quarantines_its_key(subject: &dyn Subject) {
    let b = subject.backend();
    let k = key("contract/quarantine");
    let mut first = request("contract/quarantine", "a", 200, 0);
    first.options.max_recoveries = Some(1);
    first.options.lock_delay_ms = 1_000;
    let g = b.acquire(first).await.expect("grant");
    subject.pass(400).await;
    let view = b.get(&k).await.expect("get");
    assert!(view.live.is_none(), "{view:?}");
    assert!(view.quarantined && !view.recoverable, "{view:?}");
    assert_eq!(
        view.reservation,
        Some(leasehold_core::lease::Reservation::LockDelay {
            after: g.term.fence,
            until: g.term.expires_at + 1_000,
        }),
        "the expiry starts the term's lock-delay"
    );
    let listed = |filter| async move {
        b.list("contract/quarantine", filter, None, 10)
            .await
            .expect("list")
            .keys
            .len()
    };
    assert_eq!(listed(ListFilter::Quarantined).await, 1);
    assert_eq!(listed(ListFilter::Recoverable).await, 0);
    let forced = || Acquire {
        options: AcquireOptions {
            force: true,
            ..AcquireOptions::default()
        },
        ..request("contract/quarantine", "admin", 10_000, 0)
    };
    match b.acquire(forced()).await {
        Err(Error::Reserved { .. }) => {}
        other => panic!("a lock-delay holds even a forced Acquire, got {other:?}"),
    }
    subject.pass(1_000).await;
    match b
        .acquire(request("contract/quarantine", "b", 10_000, 0))
        .await
    {
        Err(Error::Quarantined { failures, .. }) => assert_eq!(failures, 1),
        other => panic!("a quarantined key refuses a plain Acquire, got {other:?}"),
    }
    let taken = b
        .acquire(forced())
        .await
        .expect("a forced Acquire is granted");
    assert!(taken.term.fence > g.term.fence);
}

/// Get of a key never acquired is NOT_FOUND naming it.
pub async fn an_unknown_key_is_not_found(subject: &dyn Subject) {
    let k = key("contract/never");
    match subject.backend().get(&k).await {
        Err(Error::NotFound(named)) => assert_eq!(named, k),
        other => panic!("an unknown key must be not found, got {other:?}"),
    }
}

/// A call id begins once under the live term (a second begin is a
/// duplicate, its record returned), and the first settlement wins.
pub async fn a_tool_call_begins_once_and_its_first_settlement_wins(subject: &dyn Subject) {
    let b = subject.backend();
    let k = key("contract/ledger");
    let g = grant(subject, "contract/ledger", "a").await;
    let (fence, id) = (g.term.fence, g.term.lease_id);
    match b
        .begin_tool_calls(&k, fence, id, vec![spec("call_1")])
        .await
        .expect("begin")
    {
        BeginOutcome::Recorded(calls) => {
            assert_eq!(calls.len(), 1);
            assert_eq!(calls[0].state, CallState::Running);
        }
        other => panic!("a new call is recorded, got {other:?}"),
    }
    match b
        .begin_tool_calls(&k, fence, id, vec![spec("call_1")])
        .await
        .expect("begin again")
    {
        BeginOutcome::Duplicate { ids, existing } => {
            assert_eq!(ids, vec!["call_1".to_string()]);
            assert_eq!(existing.len(), 1);
        }
        other => panic!("a call id begins once, got {other:?}"),
    }
    let settle = |outcome: CallState, result: &str| Settlement {
        turn: String::new(),
        call_id: "call_1".into(),
        outcome,
        result_digest: String::new(),
        result: result.as_bytes().to_vec(),
    };
    // The flag says whether an earlier settlement had already won.
    let (first, earlier_won) = b
        .settle_tool_call(&k, fence, id, settle(CallState::Succeeded, "ok"))
        .await
        .expect("settle");
    assert!(!earlier_won);
    assert_eq!(first.state, CallState::Succeeded);
    let (second, earlier_won) = b
        .settle_tool_call(&k, fence, id, settle(CallState::Failed, "no"))
        .await
        .expect("settle again");
    assert!(earlier_won, "the first settlement wins");
    assert_eq!(
        (second.state, second.result),
        (CallState::Succeeded, b"ok".to_vec())
    );
}

/// A term that is no longer live begins nothing: its fence is refused.
pub async fn a_lost_term_can_begin_no_tool_call(subject: &dyn Subject) {
    let b = subject.backend();
    let k = key("contract/lost");
    let g = grant(subject, "contract/lost", "a").await;
    b.release(&k, g.term.fence, g.term.lease_id, false, None)
        .await
        .expect("release");
    let next = grant(subject, "contract/lost", "b").await;
    let begun = b
        .begin_tool_calls(&k, g.term.fence, g.term.lease_id, vec![spec("late")])
        .await;
    assert!(
        matches!(begun, Err(Error::StaleFence { .. })),
        "a lost term's begin must be refused: {begun:?}"
    );
    let calls = b
        .list_tool_calls(&k, leasehold_core::ledger::CallFilter::All)
        .await
        .expect("list calls");
    assert!(calls.is_empty(), "nothing was recorded: {calls:?}");
    b.check(&k, next.term.fence)
        .await
        .expect("b's term is live");
}
