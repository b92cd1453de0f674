//! The expiry timer: ends terms at their deadlines, hands freed keys to
//! waiters, and forgets keys whose retention ran out, in chunks so a mass
//! expiry does not stall requests.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{EXPIRY_CHUNK, Shared};

impl Shared {
    /// Ends terms at their deadlines and hands freed keys to waiters.
    pub(super) async fn expiry_loop(self: Arc<Self>) {
        while !self.stopping.load(Ordering::Acquire) {
            let (more, next) = self.with_lessor(|l| {
                let more = l.expire_due_up_to(self.clock.now(), EXPIRY_CHUNK);
                (more, l.next_deadline())
            });
            if more {
                tokio::task::yield_now().await;
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
