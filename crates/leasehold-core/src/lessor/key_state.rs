//! What the lessor knows about one key, and the refusals it derives from it.

use std::collections::{BTreeMap, VecDeque};

use crate::clock::Millis;
use crate::error::{Error, Result, StaleReason};
use crate::lease::{
    EndedTerm, Failures, Fence, HistoryEntry, Key, LeaseId, Reservation, Term, TermEnd,
};
use crate::ledger::Ledger;

use super::KeyView;
use super::waiters::Queued;

/// Everything the lessor knows about one key.
#[derive(Debug)]
pub(super) struct KeyState<W> {
    /// The term holding the key, if any. It may have expired and not yet been
    /// ended: `Lessor::catch_up` ends it on the next touch or timer tick.
    pub live: Option<Term>,
    /// The last ended term, for `previous`, recoverability and retried releases.
    pub last_ended: Option<EndedTerm>,
    /// Acquires waiting for this key, first come first served.
    pub waiters: VecDeque<Queued<W>>,
    /// Sequence of the last change to this key that must be durable before it
    /// is revealed (by a reply or by a refusal).
    pub visible_seq: u64,
    /// The key's tool calls; boxed and optional so keys without calls stay small.
    pub ledger: Option<Box<Ledger>>,
    /// Whether the retention timer holds an entry for this key (at most one).
    pub prune_scheduled: bool,
    /// The deadline under which the expiry timer holds this key, if it does
    /// (at most one entry per key). It serves the live term's expiry, or,
    /// while the key is free, the end of its reservation.
    pub deadline_entry: Option<Millis>,
    /// Who alone may take the key while it is free (lock-delay, handoff).
    pub reservation: Option<Reservation>,
    /// Terms in a row that ended by expiry or suspension.
    pub failures: u32,
    /// Refuses Acquires (but forced ones) until an admin lifts it.
    pub quarantined: bool,
    /// The last ended terms, oldest first, at most the lessor's history
    /// length.
    pub history: VecDeque<HistoryEntry>,
    /// How many entries at the back of `history` storage has not seen.
    pub history_unsaved: usize,
    /// The fences of entries dropped from the front since storage last saw
    /// the key, so it must drop them too.
    pub history_dropped: Vec<Fence>,
}

impl<W> KeyState<W> {
    pub fn new() -> Self {
        KeyState {
            live: None,
            last_ended: None,
            waiters: VecDeque::new(),
            visible_seq: 0,
            ledger: None,
            prune_scheduled: false,
            deadline_entry: None,
            reservation: None,
            failures: 0,
            quarantined: false,
            history: VecDeque::new(),
            history_unsaved: 0,
            history_dropped: Vec::new(),
        }
    }

    /// The reservation in force at `now`, if any.
    pub fn reservation_at(&self, now: Millis) -> Option<&Reservation> {
        self.reservation.as_ref().filter(|r| now < r.until())
    }

    pub fn unsettled_tool_calls(&self) -> usize {
        self.ledger.as_ref().map_or(0, |l| l.unsettled())
    }

    /// Why `fence` is not this key's live term.
    pub fn stale_reason(&self, fence: Fence) -> StaleReason {
        stale_reason(self.live.as_ref(), self.last_ended.as_ref(), fence)
    }

    /// Where the key stands on failed terms, as stored.
    pub fn standing(&self) -> Failures {
        Failures {
            count: self.failures,
            quarantined: self.quarantined,
        }
    }

    /// The reader's view at `now`: a term past its deadline that nothing has
    /// ended yet shows as its end will write it (`Term::expiry`: ended,
    /// the failure counted, the quarantine it earns, its lock-delay), so
    /// readers never see a dead term as live, nor a key recoverable that its
    /// expiry quarantines.
    pub fn view(&self, key: &Key, now: Millis, default_max_recoveries: Option<u32>) -> KeyView {
        let (live, last_ended, quarantined, reservation) = match &self.live {
            Some(term) if !term.is_live_at(now) => {
                let ending = term.expiry(self.standing(), default_max_recoveries);
                (
                    None,
                    Some(ending.ended),
                    ending.failures.quarantined,
                    ending.lock_delay,
                )
            }
            live => (
                live.clone(),
                self.last_ended.clone(),
                self.quarantined,
                self.reservation.clone(),
            ),
        };
        let reservation = reservation.filter(|r| live.is_none() && now < r.until());
        let recoverable = live.is_none()
            && !quarantined
            && last_ended.as_ref().is_some_and(|e| e.end.is_recoverable());
        KeyView {
            key: key.clone(),
            live,
            last_ended,
            recoverable,
            quarantined,
            reservation,
            visible_seq: self.visible_seq,
        }
    }

    /// Whether the key holds a term past its deadline at `now` that nothing
    /// has ended yet.
    pub fn lapsed_at(&self, now: Millis) -> bool {
        self.live.as_ref().is_some_and(|t| !t.is_live_at(now))
    }
}

/// Why `fence` is not the live term of a key whose live term is `live` and
/// whose last ended term is `last_ended`: the one rule every backend gives
/// its refusals by.
///
/// A newer live term decides first: the last ended term may be `fence`
/// itself, but a retry is told the truth, that it was superseded, not how
/// it ended.
pub fn stale_reason(
    live: Option<&Term>,
    last_ended: Option<&EndedTerm>,
    fence: Fence,
) -> StaleReason {
    if let Some(live) = live {
        if fence < live.fence {
            return StaleReason::Superseded { by: live.fence };
        }
    }
    if let Some(ended) = last_ended {
        if ended.fence == fence {
            return match ended.end {
                TermEnd::Expired => StaleReason::Expired { at: ended.ended_at },
                TermEnd::Released => StaleReason::Released { at: ended.ended_at },
                TermEnd::Suspended => StaleReason::Suspended { at: ended.ended_at },
            };
        }
    }
    let latest = live.map(|t| t.fence).or(last_ended.map(|e| e.fence));
    match latest {
        Some(latest) if fence < latest => StaleReason::Superseded { by: latest },
        _ => StaleReason::Unknown,
    }
}

/// The state of `key` if `fence` is its live term and `lease_id` its secret.
/// Call after `Lessor::catch_up`, so an expired term is not taken for live.
pub(super) fn holder<'a, W>(
    keys: &'a mut BTreeMap<Key, KeyState<W>>,
    key: &Key,
    fence: Fence,
    lease_id: LeaseId,
) -> Result<&'a mut KeyState<W>> {
    let state = keys.get_mut(key).ok_or_else(|| unknown(key, fence))?;
    match &state.live {
        Some(term) if term.fence == fence => {
            if term.lease_id != lease_id {
                return Err(denied(key, fence));
            }
            Ok(state)
        }
        _ => Err(stale(key, fence, state.stale_reason(fence))),
    }
}

pub(super) fn stale(key: &Key, fence: Fence, reason: StaleReason) -> Error {
    Error::StaleFence {
        key: key.clone(),
        fence,
        reason,
    }
}

pub(super) fn unknown(key: &Key, fence: Fence) -> Error {
    stale(key, fence, StaleReason::Unknown)
}

pub(super) fn denied(key: &Key, fence: Fence) -> Error {
    Error::PermissionDenied {
        key: key.clone(),
        fence,
    }
}
