//! Per-key call order on this server (the backend contract: operations
//! take effect in the order they are called, which the Session stream
//! relies on to pipeline).
//!
//! Each operation takes its place in its key's order when it is *called*
//! and starts once everything it must follow has been applied: a write
//! (acquire, renew, release, begin, settle) follows every earlier operation
//! on the key; a read (check, get, list tool calls) follows only the
//! earlier writes, so reads of a busy key run side by side. A waiting
//! Acquire counts as applied once it is granted, refused or in line.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::FutureExt;
use futures_util::future::{Shared, join_all};
use tokio::sync::oneshot;

use leasehold_core::lease::Key;

/// Resolves once an operation has been applied (or dropped).
type Applied = Shared<oneshot::Receiver<()>>;

/// Whether an operation changes the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Access {
    Read,
    Write,
}

/// The order of operations in flight, per key.
#[derive(Default)]
pub(super) struct Turns {
    keys: Mutex<HashMap<Key, KeyOrder>>,
}

/// One key's operations in flight.
#[derive(Default)]
struct KeyOrder {
    /// The last write called, until it is done.
    last_write: Option<(u64, Applied)>,
    /// Reads called since that write, until each is done.
    reads: Vec<(u64, Applied)>,
    /// Numbers the key's operations; the entry goes when none is in flight.
    next: u64,
    in_flight: usize,
}

/// An operation's place in its key's order; dropping it tells those after
/// it that it was applied.
pub(super) struct Turn {
    _applied: oneshot::Sender<()>,
}

/// What an operation waits for before it starts.
pub(super) struct Predecessors(Vec<Applied>);

impl Predecessors {
    /// Resolves once every predecessor was applied (or dropped).
    pub(super) async fn applied(self) {
        join_all(self.0).await;
    }
}

impl Turns {
    /// Takes the next place in `key`'s order, at call time.
    pub(super) fn take(
        self: &Arc<Self>,
        key: &Key,
        access: Access,
    ) -> (Predecessors, Turn, TurnCleanup) {
        let (tx, rx) = oneshot::channel();
        let mine = rx.shared();
        let mut keys = self.keys.lock().expect("turns lock");
        let order = keys.entry(key.clone()).or_default();
        let number = order.next;
        order.next += 1;
        order.in_flight += 1;
        let mut before: Vec<Applied> = order.last_write.iter().map(|(_, w)| w.clone()).collect();
        match access {
            Access::Read => order.reads.push((number, mine)),
            Access::Write => {
                before.extend(order.reads.drain(..).map(|(_, r)| r));
                order.last_write = Some((number, mine));
            }
        }
        drop(keys);
        (
            Predecessors(before),
            Turn { _applied: tx },
            TurnCleanup {
                turns: self.clone(),
                key: key.clone(),
                number,
            },
        )
    }
}

/// Removes a finished operation from its key's order (and the key, when
/// nothing is in flight), so the map holds only keys in use.
pub(super) struct TurnCleanup {
    turns: Arc<Turns>,
    key: Key,
    number: u64,
}

impl Drop for TurnCleanup {
    fn drop(&mut self) {
        let mut keys = self.turns.keys.lock().expect("turns lock");
        let Some(order) = keys.get_mut(&self.key) else {
            return;
        };
        order.in_flight -= 1;
        if order.in_flight == 0 {
            keys.remove(&self.key);
            return;
        }
        if order
            .last_write
            .as_ref()
            .is_some_and(|(n, _)| *n == self.number)
        {
            order.last_write = None;
        }
        order.reads.retain(|(n, _)| *n != self.number);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn key() -> Key {
        Key::parse("k").unwrap()
    }

    #[tokio::test]
    async fn reads_after_a_write_run_together() {
        let turns = Arc::new(Turns::default());
        let (_, write, _c) = turns.take(&key(), Access::Write);
        let (first, _t1, _d1) = turns.take(&key(), Access::Read);
        let (second, _t2, _d2) = turns.take(&key(), Access::Read);
        let reads = tokio::spawn(async move {
            first.applied().await;
            second.applied().await;
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!reads.is_finished(), "reads wait for the write before them");
        drop(write);
        tokio::time::timeout(Duration::from_secs(1), reads)
            .await
            .expect("both reads start once the write is applied, neither waiting for the other")
            .unwrap();
    }

    #[tokio::test]
    async fn a_write_after_reads_waits_for_them() {
        let turns = Arc::new(Turns::default());
        let (_, read, _c) = turns.take(&key(), Access::Read);
        let (write, _t, _d) = turns.take(&key(), Access::Write);
        let waiting = tokio::spawn(write.applied());
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished());
        drop(read);
        tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("the write starts once the read is done")
            .unwrap();
    }

    #[test]
    fn finished_keys_leave_the_map() {
        let turns = Arc::new(Turns::default());
        let first = turns.take(&key(), Access::Write);
        let second = turns.take(&key(), Access::Read);
        drop(first);
        drop(second);
        assert!(turns.keys.lock().unwrap().is_empty());
    }
}
