//! Time as the lease logic sees it.
//!
//! The lessor never reads the system clock itself: it is handed a [`Clock`], so
//! tests drive expiry with a [`ManualClock`] instead of sleeping through TTLs
//! (etcd's lessor learned this late; see its "use clockwork" TODO).
//!
//! The production [`SystemClock`] reads wall-clock time once, at start-up, and
//! then advances with the monotonic clock. A wall-clock jump while the server
//! runs therefore cannot expire leases early (invariant 4: safety over
//! liveness); timestamps in replies stay close to wall time for humans.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

/// Milliseconds since the Unix epoch, on the server's clock.
pub type Millis = u64;

/// A future returned by [`Clock::sleep_until`].
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// The source of time for lease expiry and waits.
pub trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> Millis;

    /// A future that resolves once [`Clock::now`] has reached `deadline`.
    ///
    /// It may resolve early (callers re-check the time); it must not resolve
    /// late by more than scheduling noise.
    fn sleep_until(&self, deadline: Millis) -> Sleep;
}

/// Wall time read once at start-up, advanced by the monotonic clock.
#[derive(Debug, Clone)]
pub struct SystemClock {
    /// Wall-clock milliseconds at `anchor`.
    anchor_ms: Millis,
    /// The monotonic instant matching `anchor_ms`.
    anchor: Instant,
}

impl SystemClock {
    /// Anchors a new clock at the current wall time.
    pub fn new() -> Self {
        let anchor_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as Millis);
        SystemClock {
            anchor_ms,
            anchor: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Millis {
        self.anchor_ms + self.anchor.elapsed().as_millis() as Millis
    }

    fn sleep_until(&self, deadline: Millis) -> Sleep {
        let wait = deadline.saturating_sub(self.now());
        // Round up by one millisecond so a wake-up never lands just before the deadline.
        Box::pin(tokio::time::sleep(Duration::from_millis(wait + 1)))
    }
}

/// A clock that only moves when told to. Cheap to clone; clones share the time.
#[derive(Debug, Clone)]
pub struct ManualClock {
    /// The current time; sleepers watch it.
    now: Arc<watch::Sender<Millis>>,
}

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: Millis) -> Self {
        ManualClock {
            now: Arc::new(watch::Sender::new(start)),
        }
    }

    /// Moves the clock forward by `ms`, waking every sleeper whose deadline passed.
    pub fn advance(&self, ms: Millis) {
        self.now.send_modify(|now| *now += ms);
    }

    /// Sets the clock to `at` (which may be in the past, to test clock jumps).
    pub fn set(&self, at: Millis) {
        self.now.send_replace(at);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Millis {
        *self.now.borrow()
    }

    fn sleep_until(&self, deadline: Millis) -> Sleep {
        let mut rx = self.now.subscribe();
        Box::pin(async move {
            if rx.wait_for(|now| *now >= deadline).await.is_err() {
                // The clock is gone, so time will never reach the deadline.
                std::future::pending::<()>().await;
            }
        })
    }
}
