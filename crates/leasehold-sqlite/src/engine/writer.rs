//! The writer thread: group commit.
//!
//! It owns the store. While one commit syncs the disk, new changes pile up in
//! the lessor, so the next commit takes them all: one fsync serves many
//! requests. Urgent changes (a reply waits for them) are committed at once;
//! lazy ones (renewals keeping the TTL, expiries) within `lazy_flush`, in
//! chunks, so a mass expiry never holds urgent changes up.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use leasehold_core::store::Store;

use super::{LAZY_CHUNK, Shared, URGENT_LAZY_CHUNK};

impl Shared {
    /// The writer thread: commits urgent changes at once, lazy ones within
    /// `lazy_flush`, everything at shutdown.
    pub(super) fn write_loop(&self, mut store: Box<dyn Store>) {
        let lazy_flush = self.config.lazy_flush;
        let mut last_flush = Instant::now();
        // Set when a lazy flush left keys for the next commit.
        let mut backlog = false;
        let mut lessor = self.lessor.lock().expect("lessor lock");
        loop {
            let stopping = self.stopping.load(Ordering::Acquire);
            let lazy_due = stopping || backlog || last_flush.elapsed() >= lazy_flush;
            let due = lessor.has_urgent() || (lessor.has_dirty() && lazy_due);
            if due {
                // A reply waits for urgent changes: keep their commit short.
                let lazy_limit = if lessor.has_urgent() {
                    URGENT_LAZY_CHUNK
                } else {
                    LAZY_CHUNK
                };
                let mut batch = lessor.take_batch_up_to(lazy_limit);
                backlog = lessor.has_lazy_backlog();
                drop(lessor);
                let started = Instant::now();
                let result = store.commit(&batch);
                last_flush = Instant::now();
                self.commit_seconds.observe_duration(last_flush - started);
                self.commit_batch_size.observe(
                    (batch.records.len() + batch.calls.len() + batch.forgotten.len()) as f64,
                );
                if let Err(e) = result {
                    tracing::error!(error = %e, "commit failed; refusing further requests");
                    self.durable.send_modify(|d| {
                        d.failure = Some(format!("storage failed: {e}"));
                        d.storage_failed = true;
                    });
                    // Keep the store, and with it the exclusive lock on its
                    // file, until the process exits: the file's state is
                    // unknown after a failed commit, and no second server may
                    // take it over while this one still answers (with
                    // UNAVAILABLE). Restarting the process reads it afresh.
                    std::mem::forget(store);
                    return;
                }
                self.commits.store(store.commits(), Ordering::Relaxed);
                // Durable now: watchers may see it.
                self.events.publish(std::mem::take(&mut batch.events));
                self.durable.send_modify(|d| d.seq = d.seq.max(batch.seq));
                lessor = self.lessor.lock().expect("lessor lock");
                continue;
            }
            if stopping {
                tracing::info!(commits = store.commits(), "writer stopped");
                // A request that slipped in after the last commit would
                // otherwise wait forever for a writer that is gone.
                self.durable
                    .send_modify(|d| d.failure = Some("the server has stopped".into()));
                return;
            }
            // Never past the lazy flush: renewals and expiries must not wait
            // on a window an operator set long.
            let spin = self.config.writer_spin.min(lazy_flush);
            if !spin.is_zero() && last_flush.elapsed() < spin {
                // Nothing to commit now, but a commit just ended: the next
                // request usually follows a reply within the window. Waiting
                // for it here, awake, spares this thread a sleep and a
                // wake-up (tens of microseconds on a virtual machine's idle
                // core) on that request's path.
                self.urgent_hint.store(false, Ordering::Relaxed);
                drop(lessor);
                self.spin_for_work(last_flush, spin);
                lessor = self.lessor.lock().expect("lessor lock");
                continue;
            }
            let wait = if lessor.has_dirty() {
                lazy_flush.saturating_sub(last_flush.elapsed())
            } else {
                lazy_flush
            };
            self.writer_idle.store(true, Ordering::Relaxed);
            self.writer_sleeps.fetch_add(1, Ordering::Relaxed);
            lessor = self
                .writer_wake
                .wait_timeout(lessor, wait.max(Duration::from_millis(1)))
                .expect("lessor lock")
                .0;
            self.writer_idle.store(false, Ordering::Relaxed);
        }
    }

    /// Waits, awake, until urgent work arrives, the server stops, or the
    /// window of `spin` after `last_flush` ends, yielding the core to any
    /// other runnable thread at each turn.
    ///
    /// Tried and not kept: giving up (for 100 ms) as soon as a yield came
    /// back late, a sign that another thread wanted the core. Most of the
    /// time that thread is the one about to send the work waited for, and
    /// the spin lost its gain on a quiet machine.
    fn spin_for_work(&self, last_flush: Instant, spin: Duration) {
        while !self.urgent_hint.load(Ordering::Relaxed)
            && !self.stopping.load(Ordering::Relaxed)
            && last_flush.elapsed() < spin
        {
            std::thread::yield_now();
        }
    }
}
