//! The expiry timer: ends terms at their deadlines, hands freed keys to
//! waiters, and forgets keys whose retention ran out, in chunks so a mass
//! expiry does not stall requests.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{EXPIRY_CHUNK, LAZY_CHUNK, Shared};

/// Between two chunks of a mass expiry the timer gives the lessor lock up for
/// this long. std's mutex is not fair: with only a task yield between
/// chunks, the timer took the lock back before the writer thread or a
/// request's worker woke, and they waited up to 75 ms for it.
const EXPIRY_PAUSE: Duration = Duration::from_millis(1);

/// While more lazily changed keys than this wait for storage, the timer ends
/// no more terms: the expired terms already look expired to every reader and
/// Acquire, and ending them faster than the writer stores them only piles up
/// events that each commit must sort out.
const EXPIRY_BACKLOG: usize = 8 * LAZY_CHUNK;

impl Shared {
    /// Ends terms at their deadlines and hands freed keys to waiters.
    pub(super) async fn expiry_loop(self: Arc<Self>) {
        while !self.stopping.load(Ordering::Acquire) {
            let (more, next) = self.with_lessor(|l| {
                if l.lazy_backlog() > EXPIRY_BACKLOG {
                    return (true, None);
                }
                let more = l.expire_due_up_to(self.clock.now(), EXPIRY_CHUNK);
                (more, l.next_deadline())
            });
            if more {
                tokio::time::sleep(EXPIRY_PAUSE).await;
                continue;
            }
            let sleep = match next {
                Some(at) => self.clock.sleep_until(at),
                None => Box::pin(std::future::pending()),
            };
            tokio::select! {
                _ = sleep => {}
                _ = self.timer_wake.notified() => {}
            }
        }
    }
}
