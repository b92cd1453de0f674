//! loom models of the hand-written synchronisation inside the engine
//! (`leasehold-sqlite/src/engine`), checked over thread interleavings by
//! `cargo test -p leasehold-sync-model` (issue #17, part 3).
//!
//! The engine mixes a std `Mutex` and `Condvar` with tokio's `watch` and
//! `oneshot` and a tokio runtime, which loom cannot run. So each model here
//! mirrors one protocol of the engine line by line, on loom's primitives,
//! with tokio's channels replaced by small loom equivalents of the same
//! semantics. Every step names the engine code it mirrors; a change to that
//! code must change its model too (docs/reliability.md, "Concurrency inside
//! the server").
//!
//! - [`writer`]: the writer's sleep and wake-up (`writer_idle` and the
//!   condvar, with the lessor lock) and replies that wait for the durable
//!   sequence they reveal;
//! - [`handoff`]: a key handed to the next queued Acquire while waiters
//!   leave the line (a dropped request, a wait that ran out);
//! - [`session`]: the Session stream's window of operations in flight.
//!
//! Each model takes a `Plant` ([`writer::Plant`], [`handoff::Plant`],
//! [`session::Plant`]): `None` is the
//! engine as it is; the others plant one known bug, and the tests show that
//! loom finds each of them.

pub mod handoff;
pub mod oneshot;
pub mod session;
pub mod writer;

/// Runs `f` under loom, exploring every interleaving with at most
/// `preemptions` preemptions per execution (`None`: exhaustively), so the
/// check stays within seconds in CI. `LOOM_MAX_PREEMPTIONS` overrides the
/// bound (a deeper run).
pub fn check(preemptions: Option<usize>, f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = preemptions;
    }
    let bound = builder.preemption_bound;
    // A std atomic, outside the model: it counts the executions loom runs.
    let executions = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = executions.clone();
    builder.check(move || {
        counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        f();
    });
    eprintln!(
        "loom: {} executions, preemption bound {bound:?}",
        executions.load(std::sync::atomic::Ordering::Relaxed)
    );
}
