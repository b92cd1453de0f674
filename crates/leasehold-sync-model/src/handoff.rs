//! A freed key handed to the next queued Acquire while waiters leave the line.
//!
//! Mirrors, in `engine/mod.rs`: `Shared::with_lessor` (handoffs taken under
//! the lessor lock, sent after unlocking; a send to a waiter that is gone
//! fails), `PlaceInLine` (its drop takes a cancelled waiter out of line),
//! `Shared::give_up_waiting` (a wait that ran out: leave the line, and if the
//! grant raced in, take it); and in `leasehold-core/src/lessor/waiters.rs`
//! the hand-off loop, which skips waiters whose `is_waiting()` is false.
//!
//! The documented rule (engine `with_lessor`): "a waiter that left just now
//! loses its grant; the term then lapses at its TTL". So when everything has
//! settled, the key must be free, or held by a request that knows it holds
//! it, or held by a term whose request was dropped after the lessor chose it
//! while it was still waiting (its send failed, or the grant went down with
//! the dropped receiver): that term lapses. Any other holder is a lost key:
//! a request that got a reply (busy) while the key was granted to it, or a
//! grant to a request that was already gone, while others may be in line.

use std::collections::VecDeque;

use loom::sync::{Arc, Mutex};
use loom::thread;

use crate::oneshot::{self, Receiver, Sender};

/// Which bug to plant in the model (`None`: the engine as it is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plant {
    None,
    /// The hand-off loop grants the first waiter in line without asking
    /// whether it is still waiting (`is_waiting`).
    SkipWaitingCheck,
    /// A wait that ran out, finding itself no longer in line, reports busy
    /// instead of taking the grant that raced in.
    GiveUpIgnoresGrant,
}

/// In which order a dropped Acquire lets go of its receiver and its place in
/// line (the engine drops both with the request's future).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelOrder {
    ReceiverFirst,
    PlaceFirst,
}

type Owner = u32;
type Delivery = Owner;

struct Queued {
    id: u64,
    owner: Owner,
    handle: Sender<Delivery>,
}

/// The parts of `Lessor` a handoff uses: one key's holder and line.
struct Lessor {
    plant: Plant,
    holder: Option<Owner>,
    line: VecDeque<Queued>,
    handoffs: Vec<(Sender<Delivery>, Delivery)>,
    /// Ghost: each grant made by the hand-off loop, and whether its waiter
    /// had already left when it was chosen.
    decisions: Vec<(Owner, bool)>,
}

impl Lessor {
    /// `Lessor::release` by the holder (or expiry), then the hand-off loop.
    fn release(&mut self, owner: Owner) {
        if self.holder == Some(owner) {
            self.holder = None;
            self.hand_off();
        }
    }

    /// The hand-off loop of `lessor/waiters.rs`.
    fn hand_off(&mut self) {
        while self.holder.is_none() {
            let Some(queued) = self.line.pop_front() else {
                return;
            };
            let gone = queued.handle.is_closed();
            if self.plant != Plant::SkipWaitingCheck && gone {
                continue;
            }
            self.decisions.push((queued.owner, gone));
            self.holder = Some(queued.owner);
            self.handoffs.push((queued.handle, queued.owner));
        }
    }

    /// `Lessor::cancel_waiter`: false when no longer in line.
    fn cancel_waiter(&mut self, id: u64) -> bool {
        let before = self.line.len();
        self.line.retain(|q| q.id != id);
        before != self.line.len()
    }

    /// `acquire_now`: the key if it is free, else busy.
    fn acquire_now(&mut self, owner: Owner) -> bool {
        if self.holder.is_none() {
            self.holder = Some(owner);
            true
        } else {
            false
        }
    }
}

struct Shared {
    plant: Plant,
    lessor: Mutex<Lessor>,
    /// Ghost: requests that ended holding the key.
    holders: Mutex<Vec<Owner>>,
    /// Ghost: requests dropped (cancelled) rather than answered.
    abandoned: Mutex<Vec<Owner>>,
}

impl Shared {
    /// `Shared::with_lessor`: handoffs are sent after unlocking.
    fn with_lessor<T>(&self, f: impl FnOnce(&mut Lessor) -> T) -> T {
        let (out, handoffs) = {
            let mut lessor = self.lessor.lock().unwrap();
            let out = f(&mut lessor);
            (out, std::mem::take(&mut lessor.handoffs))
        };
        for (tx, delivery) in handoffs {
            // A waiter that left just now loses its grant: it lapses.
            let _ = tx.send(delivery);
        }
        out
    }

    /// `Shared::give_up_waiting`, for the request `owner` queued as `id`.
    fn give_up_waiting(&self, owner: Owner, id: u64, granted: Receiver<Delivery>) {
        let outcome = self.with_lessor(|l| {
            if l.cancel_waiter(id) {
                Some(l.acquire_now(owner))
            } else {
                None
            }
        });
        let holds = match outcome {
            Some(holds) => holds,
            None if self.plant == Plant::GiveUpIgnoresGrant => false,
            None => granted.recv() == Some(owner),
        };
        if holds {
            self.holders.lock().unwrap().push(owner);
        }
    }
}

/// Owner 0 holds the key; owners 1 and 2 wait in line. Concurrently: 0
/// releases, 1's request is dropped (`PlaceInLine`), and 2's wait runs out
/// (`give_up_waiting`). Checks, when all is done, that the key is not lost.
pub fn release_cancel_timeout(plant: Plant, order: CancelOrder) {
    let (tx1, rx1) = oneshot::channel();
    let (tx2, rx2) = oneshot::channel();
    let lessor = Lessor {
        plant,
        holder: Some(0),
        line: VecDeque::from([
            Queued {
                id: 1,
                owner: 1,
                handle: tx1,
            },
            Queued {
                id: 2,
                owner: 2,
                handle: tx2,
            },
        ]),
        handoffs: Vec::new(),
        decisions: Vec::new(),
    };
    let shared = Arc::new(Shared {
        plant,
        lessor: Mutex::new(lessor),
        holders: Mutex::new(Vec::new()),
        abandoned: Mutex::new(Vec::new()),
    });
    let releasing = {
        let shared = shared.clone();
        thread::spawn(move || shared.with_lessor(|l| l.release(0)))
    };
    let cancelled = {
        let shared = shared.clone();
        thread::spawn(move || {
            let leave = || shared.with_lessor(|l| l.cancel_waiter(1));
            shared.abandoned.lock().unwrap().push(1);
            match order {
                CancelOrder::ReceiverFirst => {
                    drop(rx1);
                    leave();
                }
                CancelOrder::PlaceFirst => {
                    leave();
                    drop(rx1);
                }
            }
        })
    };
    shared.give_up_waiting(2, 2, rx2);
    releasing.join().unwrap();
    cancelled.join().unwrap();

    let lessor = shared.lessor.lock().unwrap();
    let holders = shared.holders.lock().unwrap().clone();
    let abandoned = shared.abandoned.lock().unwrap().clone();
    assert!(lessor.line.is_empty(), "a waiter left behind in line");
    assert!(holders.len() <= 1, "two requests hold the key: {holders:?}");
    if let Some(owner) = lessor.holder {
        let known = holders.contains(&owner);
        let left_after_choice = abandoned.contains(&owner)
            && lessor
                .decisions
                .iter()
                .any(|&(chosen, gone)| chosen == owner && !gone);
        assert!(
            known || left_after_choice,
            "key lost: granted to {owner}, which neither holds it nor left after being chosen \
             (holders {holders:?}, abandoned {abandoned:?}, decisions {:?})",
            lessor.decisions
        );
    } else {
        assert!(holders.is_empty(), "a holder of a free key: {holders:?}");
    }
}
