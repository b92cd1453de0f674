//! Per-key call order on this server (the backend contract: operations
//! take effect in the order they are called, which the Session stream
//! relies on to pipeline).

use super::*;

/// Per-key call order on this server: each operation on a key starts once
/// the operation called before it on that key has been applied.
#[derive(Default)]
pub(super) struct Turns {
    /// The newest operation of each key with one in flight: its number, and
    /// what tells the next one it was applied.
    tails: Mutex<HashMap<Key, (u64, oneshot::Receiver<()>)>>,
    next: std::sync::atomic::AtomicU64,
}

/// An operation's place in its key's order; dropping it lets the next one go.
pub(super) struct Turn {
    _applied: oneshot::Sender<()>,
}

/// What an operation waits for before it starts.
pub(super) struct Predecessor(Option<oneshot::Receiver<()>>);

impl Predecessor {
    pub(super) async fn applied(self) {
        if let Some(rx) = self.0 {
            // Err: the predecessor was applied (or dropped): either way, go.
            let _ = rx.await;
        }
    }
}

impl Turns {
    /// Takes the next place in `key`'s order, at call time.
    pub(super) fn take(self: &Arc<Self>, key: &Key) -> (Predecessor, Turn, TurnCleanup) {
        let (tx, rx) = oneshot::channel();
        let number = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let previous = self
            .tails
            .lock()
            .expect("turns lock")
            .insert(key.clone(), (number, rx))
            .map(|(_, rx)| rx);
        (
            Predecessor(previous),
            Turn { _applied: tx },
            TurnCleanup {
                turns: self.clone(),
                key: key.clone(),
                number,
            },
        )
    }
}

/// Forgets a key's order entry when its newest operation is done, so the
/// map holds only keys with operations in flight.
pub(super) struct TurnCleanup {
    turns: Arc<Turns>,
    key: Key,
    number: u64,
}

impl Drop for TurnCleanup {
    fn drop(&mut self) {
        let mut tails = self.turns.tails.lock().expect("turns lock");
        if tails.get(&self.key).is_some_and(|(n, _)| *n == self.number) {
            tails.remove(&self.key);
        }
    }
}
