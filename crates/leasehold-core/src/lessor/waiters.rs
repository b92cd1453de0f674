//! FIFO waiters: Acquires in line for a held key.

use std::collections::VecDeque;

use crate::clock::Millis;
use crate::lease::{Key, Reservation};

use super::{Acquire, Delivery, Grant, Lessor};

/// The waiting side of a queued Acquire, owned by whoever delivers grants.
pub trait WaiterHandle {
    /// False once the waiter has given up (its request was cancelled), so the
    /// key is not handed to nobody.
    fn is_waiting(&self) -> bool;
}

/// Identifies a queued Acquire, to take it out of line.
pub type WaiterId = u64;

/// One waiting Acquire.
#[derive(Debug)]
pub(super) struct Queued<W> {
    pub id: WaiterId,
    pub request: Acquire,
    pub handle: W,
}

impl<W: WaiterHandle> Lessor<W> {
    /// Removes a queued Acquire (its wait ran out, or its request was
    /// dropped). Returns false when it is no longer queued (it was granted
    /// meanwhile; the grant is in its handoff).
    pub fn cancel_waiter(&mut self, key: &Key, id: WaiterId) -> bool {
        let Some(state) = self.keys.get_mut(key) else {
            return false;
        };
        let before = state.waiters.len();
        state.waiters.retain(|q| q.id != id);
        let removed = before - state.waiters.len();
        self.stats.waiters -= removed;
        removed != 0
    }

    /// How many Acquires wait in line, over all keys (O(1)).
    pub fn waiter_count(&self) -> usize {
        self.stats.waiters
    }

    /// Grants (and refusals) for queued waiters since the last call, to
    /// deliver.
    pub fn take_handoffs(&mut self) -> Vec<(W, Delivery)> {
        std::mem::take(&mut self.handoffs)
    }

    /// Puts `request` in line for `key`.
    pub(super) fn enqueue(&mut self, request: Acquire, handle: W) -> WaiterId {
        let id = self.next_waiter_id;
        self.next_waiter_id += 1;
        let state = self.keys.get_mut(&request.key).expect("a held key");
        state.waiters.push_back(Queued {
            id,
            request,
            handle,
        });
        self.stats.waiters += 1;
        id
    }

    /// While `key` is free, grants it to the first waiter still waiting:
    /// the named successor first while a handoff reserves the key, nobody
    /// during a lock-delay, and only forced Acquires while it is
    /// quarantined (the others are refused, not left waiting for nothing).
    pub(super) fn serve_waiters(&mut self, key: &Key, now: Millis) {
        loop {
            let Some(state) = self.keys.get_mut(key) else {
                return;
            };
            if state.live.is_some() || state.waiters.is_empty() {
                return;
            }
            if state.quarantined && state.waiters.iter().any(|q| !q.request.options.force) {
                let refusal = state.quarantined_error(key);
                let seq = state.visible_seq;
                let (forced, refused): (VecDeque<_>, VecDeque<_>) =
                    std::mem::take(&mut state.waiters)
                        .into_iter()
                        .partition(|q| q.request.options.force);
                state.waiters = forced;
                self.stats.waiters -= refused.len();
                for queued in refused {
                    let delivery = Delivery::Refused(refusal.clone(), seq);
                    self.handoffs.push((queued.handle, delivery));
                }
                continue;
            }
            let (index, handed_off) = match state.reservation_at(now) {
                None => (0, false),
                Some(Reservation::LockDelay { .. }) => return,
                Some(Reservation::Handoff { successor, .. }) => {
                    match state
                        .waiters
                        .iter()
                        .position(|q| q.request.owner == *successor)
                    {
                        Some(index) => (index, true),
                        None => return,
                    }
                }
            };
            let queued = state.waiters.remove(index).expect("an index in line");
            self.stats.waiters -= 1;
            if !queued.handle.is_waiting() {
                continue;
            }
            // Retries of this same request further back in line get its
            // term as a replay, rather than waiting behind it for nothing.
            let retries = take_retries(&mut state.waiters, &queued.request);
            self.stats.waiters -= retries.len();
            let grant = self.grant(queued.request, now, handed_off);
            let replays: Vec<_> = retries
                .into_iter()
                .map(|retry| {
                    let replay = Grant {
                        replayed: true,
                        ..grant.clone()
                    };
                    (retry.handle, Delivery::Granted(replay))
                })
                .collect();
            self.handoffs
                .push((queued.handle, Delivery::Granted(grant)));
            self.handoffs.extend(replays);
        }
    }
}

/// Takes out of `line` the retries of `request` (same owner and request id),
/// in order. Retries in line are rare: the line is only rebuilt when one is
/// there.
fn take_retries<W>(line: &mut VecDeque<Queued<W>>, request: &Acquire) -> VecDeque<Queued<W>> {
    if request.request_id.is_none() {
        return VecDeque::new();
    }
    let is_retry = |q: &Queued<W>| {
        q.request.request_id == request.request_id && q.request.owner == request.owner
    };
    if !line.iter().any(is_retry) {
        return VecDeque::new();
    }
    let (retries, others): (VecDeque<_>, VecDeque<_>) =
        std::mem::take(line).into_iter().partition(is_retry);
    *line = others;
    retries
}
