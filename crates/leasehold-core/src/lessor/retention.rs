//! Forgetting cleanly released keys, and pruning their settled tool calls.
//!
//! Forgetting keeps the table from growing with every key ever used (a
//! session id is used for a while, then never again). It is safe: the fence
//! high-water mark is kept apart from the keys, so a forgotten key acquired
//! again still gets a fence above every earlier one, and a fence presented
//! for it is refused as unknown. Keys that expired or were suspended are
//! never forgotten: they are recoverable, and stay until someone takes them
//! over.

use crate::clock::Millis;
use crate::events::EventKind;
use crate::lease::{Key, TermEnd};

use super::changes::Draft;
use super::{Lessor, WaiterHandle};

/// How long a cleanly released key, with its settled tool calls, is
/// remembered by default (24 h).
pub const DEFAULT_RETENTION_MS: u64 = 24 * 60 * 60 * 1000;

impl<W: WaiterHandle> Lessor<W> {
    /// Makes sure `key` is looked at again no later than `at`, to prune its
    /// settled calls and forget it if it is still released then.
    pub(super) fn schedule_prune(&mut self, key: &Key, at: Millis) {
        let Some(state) = self.keys.get_mut(key) else {
            return;
        };
        // An earlier entry is still pending: when it comes due it finds the
        // key not yet due and re-schedules it for the right time.
        if std::mem::replace(&mut state.prune_scheduled, true) {
            return;
        }
        self.timers.schedule_prune(key, at);
    }

    /// For keys released cleanly at least the retention time ago (and not
    /// acquired since): drops their settled tool calls, then forgets the key
    /// itself unless calls are still running or someone waits for it.
    pub(super) fn prune_due(&mut self, now: Millis) {
        while let Some(key) = self.timers.pop_due_prune(now) {
            let retention = self.retention_ms;
            let Some(state) = self.keys.get_mut(&key) else {
                continue;
            };
            state.prune_scheduled = false;
            let released_at = match (&state.live, &state.last_ended) {
                (None, Some(ended)) if ended.end == TermEnd::Released => ended.ended_at,
                // Taken again (or suspended, or expired) since: its next
                // clean release schedules it anew.
                _ => continue,
            };
            let due = released_at.saturating_add(retention);
            if due > now {
                // Released again since this entry was pushed.
                state.prune_scheduled = true;
                self.timers.schedule_prune(&key, due);
                continue;
            }
            if let Some(ledger) = state.ledger.as_mut() {
                let pruned = ledger.prune_settled();
                if ledger.is_empty() {
                    state.ledger = None;
                }
                if !pruned.is_empty() {
                    self.changes.pruned(&key, pruned);
                }
            }
            if state.ledger.is_none() && state.waiters.is_empty() {
                self.forget(key, now);
            }
        }
    }

    /// Removes `key` from the table; the next batch deletes its row.
    fn forget(&mut self, key: Key, now: Millis) {
        let Some(state) = self.keys.remove(&key) else {
            return;
        };
        // Only cleanly released keys are forgotten, never recoverable ones;
        // the index is kept right whatever the caller.
        self.note_recoverable(&key);
        if let Some(at) = state.deadline_entry {
            self.timers.remove_deadline(&key, at);
        }
        if let Some(last) = state.last_ended {
            self.changes.event(Draft {
                key: key.clone(),
                kind: EventKind::Forgotten,
                fence: last.fence,
                owner: last.owner,
                at: now,
            });
        }
        let history = state.history.iter().map(|h| h.fence);
        self.changes
            .forgotten(key, history.chain(state.history_dropped.iter().copied()));
    }
}
