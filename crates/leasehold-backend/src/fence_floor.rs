//! The fence floor: a way out for keys whose fences a lock server forgot.
//!
//! Fences are only as monotonic as the server's storage. A lock server
//! started on a fresh database (its file lost, a new PostgreSQL schema, a
//! test database promoted by mistake) counts fences from 1 again, and every
//! application database that fences its writes (`leasehold_fence`) refuses
//! them: safe, but those keys can never be written again. `serve
//! --fence-floor N` raises the backend's high-water mark to at least `N`
//! before it serves, durably and never downwards, so every fence it grants
//! from then on is above `N`: an operator passes the highest fence the
//! applications' fence tables hold (their helpers report it) and the keys
//! work again. A floor at or below the mark changes nothing, so the flag
//! may stay in a unit file across restarts.

/// The highest floor accepted: far below `i64::MAX`, the largest fence
/// either backend stores (`INTEGER`, `bigint`), so fences granted above it
/// for the rest of the store's life still fit.
pub const MAX_FENCE_FLOOR: u64 = 1 << 62;

/// What raising the fence floor found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FenceFloor {
    /// The floor asked for.
    pub floor: u64,
    /// The store's highest fence (granted, or its high-water mark) before.
    pub before: u64,
}

impl FenceFloor {
    /// Whether the floor raised the mark (it was above every fence stored).
    pub fn raised(&self) -> bool {
        self.floor > self.before
    }

    /// The mark now: every fence granted from here on is above it.
    pub fn mark(&self) -> u64 {
        self.floor.max(self.before)
    }

    /// The start-up log line's message.
    pub fn describe(&self) -> String {
        if self.raised() {
            format!(
                "fence floor {}: fences were at {}; every fence granted from now on is above {}",
                self.floor, self.before, self.floor
            )
        } else {
            format!(
                "fence floor {} is not above the stored fences (at {}): nothing changed",
                self.floor, self.before
            )
        }
    }
}
