//! The ownership lifecycle beyond grant and release: lock-delay after an
//! expiry, handoff to a named successor, the recovery limit (quarantine) and
//! each key's term history.
//!
//! - **Lock-delay** (Chubby, Consul): a term that asked for one and ends by
//!   *expiry* keeps its key free but untakeable for that long, so writes its
//!   holder sent before it was paused can drain before the next holder
//!   starts. A clean release or a suspension skips it: the holder said it is
//!   done writing.
//! - **Handoff**: a release may reserve the key for one successor for a
//!   while; it gets the key ahead of every waiter, others get it when the
//!   time runs out.
//! - **Quarantine**: a key whose terms end by expiry or suspension K times in
//!   a row (no clean release in between) is refused to every Acquire but a
//!   forced one, until an admin lifts it. A session that crashes every worker
//!   that resumes it stops being resumed.
//! - **History**: each key keeps its last N ended terms, forgotten with the
//!   key.
//!
//! Reservations and quarantine are key state like the live term: stored with
//! the key's row, restored at start-up. A reservation's end is a timer entry
//! (the key's one deadline entry, free while no term is live).

use crate::clock::Millis;
use crate::error::{Error, Held, Result};
use crate::lease::{Ending, Fence, HistoryEntry, Key, Reservation, Term, TermEnd};
use crate::store::KeyRecord;

use super::key_state::KeyState;
use super::{KeyView, Lessor, WaiterHandle};

/// How many ended terms a key remembers by default.
pub const DEFAULT_HISTORY_LEN: usize = 32;

/// The refusal of a waiting Acquire of `key` while `waiting` Acquires
/// already wait in its line (`--max-waiters-per-key`): one wording for
/// every backend, so a client cannot tell which one refused it.
pub fn line_full(key: &Key, waiting: usize) -> Error {
    Error::ResourceExhausted {
        limit: "waiters_per_key".into(),
        detail: format!("{waiting} Acquires already wait for key {key:?}"),
    }
}

/// One page of a key's history, newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HistoryPage {
    pub entries: Vec<HistoryEntry>,
    /// The fence to continue below, when there may be more.
    pub next_before: Option<Fence>,
    /// The reply may only be sent once storage has committed this sequence.
    pub visible_seq: u64,
}

impl<W> KeyState<W> {
    /// Records `ending`, the end of `term` (`Term::ending`): its history
    /// entry, and the failures and quarantine it leaves the key with.
    pub(super) fn record_end(&mut self, term: &Term, ending: &Ending, history_len: usize) {
        self.history.push_back(HistoryEntry {
            fence: term.fence,
            owner: term.owner.clone(),
            acquired_at: term.acquired_at,
            ended_at: ending.ended.ended_at,
            end: ending.ended.end,
            unsettled_tool_calls: u32::try_from(self.unsettled_tool_calls()).unwrap_or(u32::MAX),
            handed_off: term.lifecycle.handed_off,
        });
        self.history_unsaved += 1;
        while self.history.len() > history_len {
            if let Some(dropped) = self.history.pop_front() {
                self.history_dropped.push(dropped.fence);
            }
        }
        self.history_unsaved = self.history_unsaved.min(self.history.len());
        self.failures = ending.failures.count;
        self.quarantined = ending.failures.quarantined;
        self.last_ended = Some(ending.ended.clone());
    }

    /// The refusal of an Acquire while the key is quarantined.
    pub(super) fn quarantined_error(&self, key: &Key) -> Error {
        let shown = (self.failures as usize).min(self.history.len());
        let recent = self.history.range(self.history.len() - shown..);
        let recent: Vec<String> = recent
            .map(|h| format!("fence {} {}", h.fence, end_name(h.end)))
            .collect();
        Error::Quarantined {
            key: key.clone(),
            failures: self.failures,
            recent: recent.join(", "),
        }
    }

    /// The refusal of an Acquire while `reservation` holds the key.
    pub(super) fn reserved_error(
        &self,
        key: &Key,
        reservation: &Reservation,
        now: Millis,
    ) -> Error {
        let held = match reservation {
            Reservation::LockDelay { after, .. } => Held::LockDelay { after: *after },
            Reservation::Handoff { successor, .. } => Held::Handoff {
                successor: successor.clone(),
            },
        };
        Error::Reserved {
            key: key.clone(),
            reservation: held,
            remaining_ms: reservation.until().saturating_sub(now),
        }
    }
}

fn end_name(end: TermEnd) -> &'static str {
    match end {
        TermEnd::Released => "released",
        TermEnd::Suspended => "suspended",
        TermEnd::Expired => "expired",
    }
}

impl<W: WaiterHandle> Lessor<W> {
    /// Reserves the free `key` (lock-delay or handoff) and makes sure the
    /// timer looks at it when the reservation ends.
    pub(super) fn reserve(&mut self, key: &Key, reservation: Reservation) {
        let Some(state) = self.keys.get_mut(key) else {
            return;
        };
        self.timers
            .file_deadline(key, reservation.until(), &mut state.deadline_entry);
        state.reservation = Some(reservation);
        self.changes.key(key, false);
    }

    /// Ends `key`'s reservation once its time has run out.
    pub(super) fn lapse_reservation(&mut self, key: &Key, now: Millis) {
        let Some(state) = self.keys.get_mut(key) else {
            return;
        };
        if state.reservation.as_ref().is_some_and(|r| r.until() <= now) {
            state.reservation = None;
            self.changes.key(key, false);
        }
    }

    /// The refusal of one Acquire too many in `key`'s line.
    pub(super) fn line_full(&self, key: &Key) -> Error {
        line_full(key, self.keys.get(key).map_or(0, |s| s.waiters.len()))
    }

    /// Restores the lifecycle part of a stored key: its reservation (kept
    /// only if it has not run out), quarantine and history.
    pub(super) fn restore_lifecycle(
        &mut self,
        record: &KeyRecord,
        state: &mut KeyState<W>,
        now: Millis,
    ) {
        state.failures = record.failures;
        state.quarantined = record.quarantined;
        state.history = record.history.iter().cloned().collect();
        while state.history.len() > self.history_len {
            if let Some(dropped) = state.history.pop_front() {
                state.history_dropped.push(dropped.fence);
            }
        }
        if let Some(reservation) = record.reservation.as_ref().filter(|r| now < r.until()) {
            if record.live.is_none() {
                self.timers.file_deadline(
                    &record.key,
                    reservation.until(),
                    &mut state.deadline_entry,
                );
                state.reservation = Some(reservation.clone());
            }
        }
    }

    /// Lifts `key`'s quarantine (and resets its count of failed terms), then
    /// hands it to the first waiter. Lifting a key that is not quarantined
    /// succeeds and changes nothing.
    ///
    /// # Errors
    /// [`Error::NotFound`] when the table does not hold the key.
    pub fn unquarantine(&mut self, key: &Key, now: Millis) -> Result<(KeyView, u64)> {
        self.catch_up(key, now);
        let state = self
            .keys
            .get_mut(key)
            .ok_or_else(|| Error::NotFound(key.clone()))?;
        if state.quarantined || state.failures > 0 {
            self.stats.quarantined -= usize::from(state.quarantined);
            state.quarantined = false;
            state.failures = 0;
            state.visible_seq = self.changes.next_seq();
            self.changes.key(key, true);
            self.note_recoverable(key);
        }
        self.serve_waiters(key, now);
        let view = self.get(key, now)?;
        let seq = view.visible_seq;
        Ok((view, seq))
    }

    /// Up to `limit` ended terms of `key`, newest first, with fences below
    /// `before` when given.
    ///
    /// # Errors
    /// [`Error::NotFound`] when the table does not hold the key.
    pub fn history(
        &mut self,
        key: &Key,
        before: Option<Fence>,
        limit: usize,
        now: Millis,
    ) -> Result<HistoryPage> {
        self.catch_up(key, now);
        let state = self
            .keys
            .get(key)
            .ok_or_else(|| Error::NotFound(key.clone()))?;
        let mut older = state
            .history
            .iter()
            .rev()
            .filter(|h| before.is_none_or(|b| h.fence < b));
        let entries: Vec<HistoryEntry> = older.by_ref().take(limit).cloned().collect();
        let next_before = match older.next() {
            Some(_) => entries.last().map(|h| h.fence),
            None => None,
        };
        Ok(HistoryPage {
            entries,
            next_before,
            visible_seq: state.visible_seq,
        })
    }
}
