//! The lease engine: the lessor's state shared by all requests, a writer
//! thread that commits changes in batches (group commit), an expiry timer,
//! and FIFO waiters.
//!
//! # Request path
//! A request locks the lessor (a std `Mutex`: nothing awaits while it is
//! held), applies its rule, and notes which sequence number must be durable
//! before its reply may go out. It then waits, without the lock, until the
//! writer has committed that sequence. While one commit syncs the disk, the
//! next requests pile up in the lessor's dirty set, so one fsync serves many
//! of them. Reads (Check, Get, List) wait only when the key they reveal has a
//! change that is not durable yet, so they normally never wait on the disk and
//! still never show a grant or release that a crash could undo.
//!
//! Refusals reveal state too ("held by a, fence 1", "released", "wrong
//! lease_id" for a live fence), so a refusal made by the lessor waits for its
//! key's visible sequence exactly as a success does: a client is never told
//! of a grant or release that a failed commit then undoes.
//!
//! # Failure
//! If a commit fails, the engine stops taking requests (UNAVAILABLE) rather
//! than retrying: after a failed fsync the state of the file is unknown
//! (PostgreSQL's "fsyncgate"). Restart the server to recover from the file.
//!
//! # Parts
//! - this module: the shared state and the operations ([`Engine`]);
//! - `writer`: the writer thread (group commit);
//! - `timer`: the expiry timer.

mod event_log;
mod timer;
mod writer;

use event_log::EventLog;
pub use leasehold_backend::Watching;

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::{Notify, oneshot, watch};

use leasehold_core::clock::{Clock, Millis};
use leasehold_core::error::{Error, Result};
use leasehold_core::events::{DEFAULT_EVENT_LOG_LEN, Selector};
use leasehold_core::lease::{EndedTerm, Fence, Handoff, Key, LeaseId, Term, Ttl};
use leasehold_core::ledger::{
    BeginOutcome, CallFilter, CallSpec, Settlement, ToolCall, validate_settlement, validate_specs,
};
use leasehold_core::lessor::{
    Acquire, AcquireOutcome, DEFAULT_HISTORY_LEN, DEFAULT_RETENTION_MS, Delivery, Grant,
    HistoryPage, KeyView, Lessor, ListFilter, ListPage, Stats, WaiterHandle, WaiterId, page_limit,
};
use leasehold_core::store::{Store, StoreError};

use futures_util::future::BoxFuture;
use leasehold_backend::metrics::{BATCH_BUCKETS, Exposition, Histogram, LATENCY_BUCKETS};
use leasehold_backend::{Backend, Pending};

/// At most this many lazily changed keys (expiries, renewals) go into one
/// commit, so a mass expiry is written in chunks that urgent changes ride
/// along with, instead of one long commit they queue behind.
const LAZY_CHUNK: usize = 500;

/// At most this many lazily changed keys ride along with urgent changes (a
/// reply waits for those): during a mass expiry every commit used to carry
/// a full [`LAZY_CHUNK`], and an Acquire waited for one such commit in
/// flight and then for its own, p99 over 100 ms. Lazy-only commits still
/// take full chunks.
const URGENT_LAZY_CHUNK: usize = 32;

/// At most this many deadlines are looked at per hold of the lessor lock, so a
/// mass expiry does not stall requests: 2,000 held it for 10-20 ms at a time
/// during a 100,000-lease expiry on a busy 2-core machine.
const EXPIRY_CHUNK: usize = 256;

/// Tuning knobs of the engine. The defaults suit production.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// How long changes that need no durability before their reply (renewals,
    /// expiries) may sit in memory before the writer commits them anyway.
    pub lazy_flush: Duration,
    /// How many keys one List call scans at most, bounding lock hold time.
    pub list_scan_budget: usize,
    /// How long a cleanly released key (its last term and its settled tool
    /// calls) is remembered before it is forgotten.
    pub retention_ms: u64,
    /// At most this many Acquires wait in one key's line.
    pub max_waiters_per_key: usize,
    /// How many ended terms each key remembers (History).
    pub history_len: usize,
    /// The recovery limit of terms whose Acquire names none (`None`: keys
    /// are never quarantined unless their Acquire asks).
    pub default_max_recoveries: Option<u32>,
    /// How many events the Watch log keeps (older revisions are compacted).
    pub event_log_len: usize,
    /// How many commits a watcher may fall behind before it is cut off.
    pub watch_buffer: usize,
    /// How long the writer stays awake after a commit, waiting for the
    /// next urgent change, before it sleeps (zero, the default: it sleeps
    /// at once; never longer than `lazy_flush`). It spares one sleep and wake-up of the writer on the path
    /// of a request that follows a reply closely, at the cost of up to
    /// this much CPU per commit (the writer yields its core to any other
    /// runnable thread meanwhile). Off by default: on a host whose cores
    /// are all busy, or under a container's CPU quota, the spin takes CPU
    /// from the requests it waits for (docs/benchmarks-history.md,
    /// session 8).
    pub writer_spin: Duration,
    /// Every fence granted is above this (`serve --fence-floor`, 0: no
    /// floor). [`Engine::start`] honours it in memory; the store must hold
    /// it durably too, which
    /// [`SqliteStore::raise_fence_floor`](crate::sqlite::SqliteStore::raise_fence_floor)
    /// does before the start (the server's `open_engine` calls it).
    pub fence_floor: u64,
}

/// The writer's default [`EngineConfig::writer_spin`]: none.
pub const DEFAULT_WRITER_SPIN: Duration = Duration::ZERO;

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            lazy_flush: Duration::from_secs(1),
            list_scan_budget: 10_000,
            retention_ms: DEFAULT_RETENTION_MS,
            max_waiters_per_key: leasehold_backend::DEFAULT_MAX_WAITERS_PER_KEY,
            history_len: DEFAULT_HISTORY_LEN,
            default_max_recoveries: None,
            event_log_len: DEFAULT_EVENT_LOG_LEN,
            watch_buffer: 4096,
            writer_spin: DEFAULT_WRITER_SPIN,
            fence_floor: 0,
        }
    }
}

/// One page of [`Engine::list`].
pub type Page = ListPage;

/// The wake-up end of a queued Acquire.
struct Waiter(oneshot::Sender<Delivery>);

/// What a queued Acquire was handed, as a reply still to be revealed.
fn delivered(delivery: Delivery) -> std::result::Result<Grant, (Error, u64)> {
    match delivery {
        Delivery::Granted(grant) => Ok(grant),
        Delivery::Refused(err, seq) => Err((err, seq)),
    }
}

impl WaiterHandle for Waiter {
    fn is_waiting(&self) -> bool {
        !self.0.is_closed()
    }
}

/// A reply (success or refusal) and the sequence that must be committed
/// before it may be sent. Refusals of malformed input reveal nothing and
/// carry sequence 0.
type Sequenced<T> = std::result::Result<(T, u64), (Error, u64)>;

/// An error that reveals no state, so it may be sent at once.
fn at_once(err: Error) -> (Error, u64) {
    (err, 0)
}

/// An operation applied to the lessor, not yet known to be durable.
struct Applied<T> {
    shared: Arc<Shared>,
    /// The reply, and the sequence that must be committed before it.
    result: Sequenced<T>,
}

impl<T> Applied<T> {
    /// The reply, once everything it reveals is durable.
    async fn durable(self) -> Result<T> {
        self.shared.reveal(self.result).await
    }
}

/// An Acquire after its immediate part.
enum Started {
    Granted(Grant),
    /// In line for the key until `until`.
    Queued {
        request: Acquire,
        place: PlaceInLine,
        granted: oneshot::Receiver<Delivery>,
        until: Millis,
    },
}

/// A waiting Acquire's place in its key's line. Dropping it (the request's
/// future was dropped: the client cancelled, its deadline passed, its
/// connection or Session stream closed) takes the waiter out of the line at
/// once, so abandoned waits cannot pile up while the key stays held.
struct PlaceInLine {
    shared: Arc<Shared>,
    key: Key,
    id: WaiterId,
    /// False once the waiter has left the line some other way.
    armed: bool,
}

impl PlaceInLine {
    /// Leaves the line now; true if the waiter was still in it (not granted).
    fn leave(&mut self) -> bool {
        self.armed = false;
        self.shared
            .with_lessor(|l| l.cancel_waiter(&self.key, self.id))
    }
}

impl Drop for PlaceInLine {
    fn drop(&mut self) {
        if self.armed {
            self.leave();
        }
    }
}

/// How far storage has caught up.
#[derive(Debug, Clone, Default)]
struct Durable {
    /// Every change up to this sequence is committed.
    seq: u64,
    /// Set when a commit failed (or the writer stopped): the engine then
    /// refuses all requests with this message.
    failure: Option<String>,
    /// Whether `failure` is a storage failure (not a clean stop).
    storage_failed: bool,
}

/// State shared by request handlers, the writer thread and the expiry timer.
struct Shared {
    /// The live lease table.
    lessor: Mutex<Lessor<Waiter>>,
    /// Wakes the writer when a change must be made durable.
    writer_wake: Condvar,
    /// Whether the writer sleeps on `writer_wake`. Read and written only with
    /// the lessor locked, so a change never misses a sleeping writer; it
    /// spares every write while the writer is busy committing a futex wake.
    writer_idle: AtomicBool,
    /// Set when a change leaves urgent work for the writer: what the writer
    /// watches while it stays awake after a commit
    /// ([`EngineConfig::writer_spin`]).
    urgent_hint: AtomicBool,
    /// How often the writer went to sleep with nothing to commit.
    writer_sleeps: AtomicU64,
    /// Published by the writer after each commit; replies wait on it.
    durable: watch::Sender<Durable>,
    /// Wakes the expiry timer when a grant moved the earliest deadline.
    timer_wake: Notify,
    /// The lease clock.
    clock: Arc<dyn Clock>,
    /// Set when the server begins to shut down: waiting Acquires give up.
    closing: watch::Sender<bool>,
    /// Set when the writer must flush what is left and exit.
    stopping: AtomicBool,
    /// Transactions committed so far (to show batching).
    commits: AtomicU64,
    /// How long each commit took, and how many rows it wrote.
    commit_seconds: Histogram,
    commit_batch_size: Histogram,
    /// The writer thread, joined at shutdown.
    writer: Mutex<Option<JoinHandle<()>>>,
    /// Committed events, for Watch.
    events: EventLog,
    /// Tuning.
    config: EngineConfig,
}

/// A cheap, cloneable handle to the lease engine. When the last handle is
/// dropped the writer flushes what is pending and exits.
#[derive(Clone)]
pub struct Engine {
    shared: Arc<Shared>,
    /// Stops the background work when the last handle goes (mini-redis style).
    _guard: Arc<StopGuard>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("commits", &self.commits())
            .finish_non_exhaustive()
    }
}

struct StopGuard(Arc<Shared>);

impl Drop for StopGuard {
    fn drop(&mut self) {
        self.0.stop_writer();
    }
}

impl Engine {
    /// Loads the lease table from `store` and starts the writer and the
    /// expiry timer. Must be called inside a tokio runtime.
    ///
    /// # Errors
    /// Whatever [`Store::load`] returns.
    pub fn start(
        mut store: Box<dyn Store>,
        clock: Arc<dyn Clock>,
        config: EngineConfig,
    ) -> std::result::Result<Engine, StoreError> {
        let snapshot = store.load()?;
        let keys = snapshot.records.len();
        let mut lessor = Lessor::restore(
            snapshot.records,
            snapshot.calls,
            // The floor, if the store does not hold it yet: a fence above
            // it is durable in its key's row from its grant on.
            snapshot.fence_high_water.max(config.fence_floor),
            clock.now(),
            config.retention_ms,
        );
        lessor.set_max_waiters_per_key(config.max_waiters_per_key);
        lessor.set_history_len(config.history_len);
        lessor.set_default_max_recoveries(config.default_max_recoveries);
        let revision = snapshot.events.last().map_or(0, |e| e.revision);
        lessor.resume_revisions(revision);
        let events = EventLog::new(
            snapshot.events,
            revision,
            config.event_log_len,
            config.watch_buffer,
        );
        tracing::info!(
            keys,
            fence_high_water = snapshot.fence_high_water,
            "lease table loaded"
        );
        let shared = Arc::new(Shared {
            lessor: Mutex::new(lessor),
            writer_wake: Condvar::new(),
            writer_idle: AtomicBool::new(false),
            urgent_hint: AtomicBool::new(false),
            writer_sleeps: AtomicU64::new(0),
            durable: watch::Sender::new(Durable::default()),
            events,
            timer_wake: Notify::new(),
            clock,
            closing: watch::Sender::new(false),
            stopping: AtomicBool::new(false),
            commits: AtomicU64::new(0),
            commit_seconds: Histogram::new(LATENCY_BUCKETS),
            commit_batch_size: Histogram::new(BATCH_BUCKETS),
            writer: Mutex::new(None),
            config,
        });
        let writer = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("leasehold-writer".into())
                .spawn(move || shared.write_loop(store))
                .map_err(|e| StoreError::Io(format!("cannot start the writer thread: {e}")))?
        };
        *shared.writer.lock().expect("writer slot") = Some(writer);
        tokio::spawn(shared.clone().expiry_loop());
        Ok(Engine {
            _guard: Arc::new(StopGuard(shared.clone())),
            shared,
        })
    }

    /// Grants `request.key`, waiting up to `request.wait` in line if it is held.
    ///
    /// Like every operation here, the request is applied to the lease table
    /// when this is called, not when the returned future is first polled; the
    /// future only waits (in line, and for durability). So operations take
    /// effect in the order they are called, which the Session stream relies on
    /// to pipeline them. Dropping the future takes a waiting request out of
    /// line.
    ///
    /// # Errors
    /// [`Error::Busy`] when the key is still held after the wait;
    /// [`Error::Unavailable`] when the server is closing or storage failed.
    pub fn acquire(&self, request: Acquire) -> impl Future<Output = Result<Grant>> + Send + use<> {
        let shared = self.shared.clone();
        let started = self.shared.start_acquire(request);
        async move {
            let outcome = match started {
                Err(refusal) => Err(refusal),
                Ok(Started::Granted(grant)) => Ok(grant),
                Ok(Started::Queued {
                    request,
                    mut place,
                    mut granted,
                    until,
                }) => {
                    let mut closing = shared.closing.subscribe();
                    tokio::select! {
                        delivery = &mut granted => {
                            place.armed = false;
                            delivered(delivery.map_err(|_| closed())?)
                        }
                        _ = shared.clock.sleep_until(until) => {
                            shared.give_up_waiting(request, &mut place, &mut granted).await
                        }
                        _ = async { closing.wait_for(|closing| *closing).await.map(|_| ()) } => {
                            if place.leave() {
                                return Err(closed());
                            }
                            delivered(granted.await.map_err(|_| closed())?)
                        }
                    }
                }
            };
            let sequenced = outcome.map(|grant| {
                let seq = grant.visible_seq;
                (grant, seq)
            });
            shared.reveal(sequenced).await
        }
    }

    /// Extends the live term `fence` of `key`; `ttl = None` keeps its TTL.
    ///
    /// # Errors
    /// [`Error::StaleFence`], [`Error::PermissionDenied`], [`Error::Unavailable`].
    pub fn renew(
        &self,
        key: &Key,
        fence: Fence,
        lease_id: LeaseId,
        ttl: Option<Ttl>,
    ) -> impl Future<Output = Result<Term>> + Send + use<> {
        self.shared
            .apply(key, Ok(()), |l, now, ()| {
                l.renew(key, fence, lease_id, ttl, now)
            })
            .durable()
    }

    /// Ends the live term `fence` of `key` (as unfinished with `suspend`).
    ///
    /// # Errors
    /// [`Error::StaleFence`], [`Error::PermissionDenied`], [`Error::Unavailable`].
    pub fn release(
        &self,
        key: &Key,
        fence: Fence,
        lease_id: LeaseId,
        suspend: bool,
        handoff: Option<Handoff>,
    ) -> impl Future<Output = Result<EndedTerm>> + Send + use<> {
        self.shared
            .apply(key, Ok(()), |l, now, ()| {
                l.release(key, fence, lease_id, suspend, handoff, now)
            })
            .durable()
    }

    /// Up to `limit` ended terms of `key`, newest first, below `before`.
    ///
    /// # Errors
    /// [`Error::NotFound`], [`Error::InvalidArgument`] for a page size over
    /// 1000, [`Error::Unavailable`].
    pub fn history(
        &self,
        key: &Key,
        before: Option<Fence>,
        page_size: usize,
    ) -> impl Future<Output = Result<HistoryPage>> + Send + use<> {
        self.shared
            .apply(key, page_limit(page_size), |l, now, limit| {
                let page = l.history(key, before, limit, now)?;
                let seq = page.visible_seq;
                Ok((page, seq))
            })
            .durable()
    }

    /// Follows the keys `selector` picks from revision `start` (0: from
    /// now on): first what the log still holds from `start`, then each
    /// commit's events as it becomes durable.
    ///
    /// # Errors
    /// [`Error::Compacted`] when `start` is older than the log holds;
    /// [`Error::Unavailable`] when the engine is closed.
    pub fn watch(&self, selector: Selector, start: u64) -> Result<Watching> {
        self.shared.ensure_open()?;
        self.shared.events.watch(selector, start)
    }

    /// Lifts `key`'s quarantine; its state after.
    ///
    /// # Errors
    /// [`Error::NotFound`], [`Error::Unavailable`].
    pub fn unquarantine(&self, key: &Key) -> impl Future<Output = Result<KeyView>> + Send + use<> {
        self.shared
            .apply(key, Ok(()), |l, now, ()| l.unquarantine(key, now))
            .durable()
    }

    /// The live term of `key` if `fence` is it (Chubby's CheckSequencer).
    ///
    /// # Errors
    /// [`Error::StaleFence`], [`Error::Unavailable`].
    pub fn check(
        &self,
        key: &Key,
        fence: Fence,
    ) -> impl Future<Output = Result<Term>> + Send + use<> {
        self.shared
            .apply(key, Ok(()), |l, now, ()| l.check(key, fence, now))
            .durable()
    }

    /// The state of `key`.
    ///
    /// # Errors
    /// [`Error::NotFound`], [`Error::Unavailable`].
    pub fn get(&self, key: &Key) -> impl Future<Output = Result<KeyView>> + Send + use<> {
        self.shared
            .apply(key, Ok(()), |l, now, ()| {
                let view = l.get(key, now)?;
                let seq = view.visible_seq;
                Ok((view, seq))
            })
            .durable()
    }

    /// One page of keys starting with `prefix`, after the key `after`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a page size over 1000; [`Error::Unavailable`].
    pub fn list(
        &self,
        prefix: &str,
        filter: ListFilter,
        after: Option<&Key>,
        page_size: usize,
    ) -> impl Future<Output = Result<Page>> + Send + use<> {
        let input = page_limit(page_size);
        let budget = self.shared.config.list_scan_budget;
        // A List refuses nothing that reveals state, so no key's sequence
        // is needed for its refusals.
        self.shared
            .apply_unkeyed(input, |l, now, limit| {
                let page = l.list(prefix, filter, after, limit, budget, now);
                let seq = page.visible_seq;
                Ok((page, seq))
            })
            .durable()
    }

    /// Records tool calls as running under the live term, all or none.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`], [`Error::StaleFence`],
    /// [`Error::PermissionDenied`], [`Error::Unavailable`].
    pub fn begin_tool_calls(
        &self,
        key: &Key,
        fence: Fence,
        lease_id: LeaseId,
        specs: Vec<CallSpec>,
    ) -> impl Future<Output = Result<BeginOutcome>> + Send + use<> {
        let input = validate_specs(&specs).map(|()| specs);
        self.shared
            .apply(key, input, |l, now, specs| {
                l.begin_tool_calls(key, fence, lease_id, specs, now)
            })
            .durable()
    }

    /// Records a tool call's terminal outcome; the first one wins. Returns
    /// the winning record and whether an earlier settle had won.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`], [`Error::StaleFence`],
    /// [`Error::PermissionDenied`], [`Error::ToolCallNotFound`],
    /// [`Error::Unavailable`].
    pub fn settle_tool_call(
        &self,
        key: &Key,
        fence: Fence,
        lease_id: LeaseId,
        settlement: Settlement,
    ) -> impl Future<Output = Result<(ToolCall, bool)>> + Send + use<> {
        let input = validate_settlement(&settlement).map(|()| settlement);
        self.shared
            .apply(key, input, |l, now, settlement| {
                let (call, already, seq) =
                    l.settle_tool_call(key, fence, lease_id, settlement, now)?;
                Ok(((call, already), seq))
            })
            .durable()
    }

    /// The tool calls of `key` in registration order.
    ///
    /// # Errors
    /// [`Error::NotFound`], [`Error::Unavailable`].
    pub fn list_tool_calls(
        &self,
        key: &Key,
        filter: CallFilter,
    ) -> impl Future<Output = Result<Vec<ToolCall>>> + Send + use<> {
        self.shared
            .apply(key, Ok(()), |l, now, ()| {
                l.list_tool_calls(key, filter, now)
            })
            .durable()
    }

    /// Makes waiting Acquires give up with UNAVAILABLE, so a graceful shutdown
    /// does not wait out their waits. Requests in flight still complete.
    pub fn begin_shutdown(&self) {
        self.shared.closing.send_replace(true);
    }

    /// Commits everything pending and stops the writer. Call after the gRPC
    /// server has drained; later requests get UNAVAILABLE.
    pub async fn shutdown(&self) {
        self.begin_shutdown();
        self.shared.stop_writer();
        let writer = self.shared.writer.lock().expect("writer slot").take();
        if let Some(writer) = writer {
            let _ = tokio::task::spawn_blocking(move || writer.join()).await;
        }
    }

    /// Transactions committed so far; far fewer than writes under load.
    pub fn commits(&self) -> u64 {
        self.shared.commits.load(Ordering::Relaxed)
    }

    /// How often the writer went to sleep with nothing to commit (each
    /// sleep costs the next urgent request a wake-up of the writer).
    pub fn writer_sleeps(&self) -> u64 {
        self.shared.writer_sleeps.load(Ordering::Relaxed)
    }

    /// The number of keys in the table.
    pub fn key_count(&self) -> usize {
        self.shared.with_lessor(|l| l.key_count())
    }

    /// The lease table's counts, for metrics.
    pub fn stats(&self) -> Stats {
        self.shared.with_lessor(|l| l.stats())
    }

    /// How many Acquires wait in line, over all keys.
    pub fn waiter_count(&self) -> usize {
        self.shared.with_lessor(|l| l.waiter_count())
    }

    /// How many entries the expiry timer holds (at most one per key).
    pub fn deadline_entries(&self) -> usize {
        self.shared.with_lessor(|l| l.deadline_entries())
    }

    /// Resolves once a commit has failed: from then on every request is
    /// refused with UNAVAILABLE, and the server should stop so a supervisor
    /// restarts it on the durable file. Never resolves on a clean stop.
    pub fn failed(&self) -> impl Future<Output = String> + Send + use<> {
        let mut durable = self.shared.durable.subscribe();
        async move {
            let failure = durable
                .wait_for(|d| d.storage_failed)
                .await
                .map(|state| state.failure.clone().unwrap_or_default());
            match failure {
                Ok(failure) => failure,
                Err(_) => std::future::pending().await,
            }
        }
    }

    /// The lease clock's current time.
    pub fn now(&self) -> Millis {
        self.shared.clock.now()
    }
}

impl Shared {
    /// Runs `f` on the locked lessor, then delivers handoffs and wakes the
    /// writer and the timer as the change requires, after unlocking, so a
    /// woken thread does not at once block on the lock it was woken for.
    ///
    /// Waking the writer after unlocking loses nothing: it decided to sleep
    /// (`writer_idle`) with the lock held, and a condvar wait releases the
    /// lock atomically, so it is already waiting when we see the flag.
    fn with_lessor<T>(&self, f: impl FnOnce(&mut Lessor<Waiter>) -> T) -> T {
        let (out, handoffs, wake_writer, wake_timer) = {
            let mut lessor = self.lessor.lock().expect("lessor lock");
            let out = f(&mut lessor);
            let handoffs = lessor.take_handoffs();
            let urgent = lessor.has_urgent();
            // Only a spinning writer reads the hint; a load first spares the
            // shared cache line a write when it is set already.
            if urgent
                && !self.config.writer_spin.is_zero()
                && !self.urgent_hint.load(Ordering::Relaxed)
            {
                self.urgent_hint.store(true, Ordering::Relaxed);
            }
            let wake_writer = urgent && self.writer_idle.load(Ordering::Relaxed);
            (out, handoffs, wake_writer, lessor.take_deadline_changed())
        };
        for (Waiter(tx), delivery) in handoffs {
            // A waiter that left just now loses its grant; the term then
            // lapses at its TTL (or its request-id retry picks it up).
            let _ = tx.send(delivery);
        }
        if wake_writer {
            self.writer_wake.notify_one();
        }
        if wake_timer {
            self.timer_wake.notify_one();
        }
        out
    }

    /// The common shape of a request about `key`: refuse bad `input` or a
    /// closed engine, else apply `op` to the lessor now. The result still
    /// has to wait until the sequence `op` returns is durable
    /// ([`Applied::durable`]); a refusal from `op` waits for `key`'s visible
    /// sequence, since it describes the key's state.
    fn apply<A, T>(
        self: &Arc<Self>,
        key: &Key,
        input: Result<A>,
        op: impl FnOnce(&mut Lessor<Waiter>, Millis, A) -> Result<(T, u64)>,
    ) -> Applied<T> {
        self.apply_with(input, op, |l| l.visible_seq(key))
    }

    /// As [`Shared::apply`], for an operation whose refusals reveal no state.
    fn apply_unkeyed<A, T>(
        self: &Arc<Self>,
        input: Result<A>,
        op: impl FnOnce(&mut Lessor<Waiter>, Millis, A) -> Result<(T, u64)>,
    ) -> Applied<T> {
        self.apply_with(input, op, |_| 0)
    }

    fn apply_with<A, T>(
        self: &Arc<Self>,
        input: Result<A>,
        op: impl FnOnce(&mut Lessor<Waiter>, Millis, A) -> Result<(T, u64)>,
        refusal_seq: impl FnOnce(&Lessor<Waiter>) -> u64,
    ) -> Applied<T> {
        let result = input
            .and_then(|input| {
                self.ensure_open()?;
                Ok(input)
            })
            .map_err(at_once)
            .and_then(|input| {
                let now = self.clock.now();
                self.with_lessor(|l| op(l, now, input).map_err(|e| (e, refusal_seq(l))))
            });
        Applied {
            shared: self.clone(),
            result,
        }
    }

    /// Sends `result` once the sequence it carries is durable. A refusal
    /// whose state a failed commit undid becomes UNAVAILABLE, as a success
    /// would.
    async fn reveal<T>(&self, result: Sequenced<T>) -> Result<T> {
        match result {
            Ok((out, seq)) => {
                self.wait_durable(seq).await?;
                Ok(out)
            }
            Err((err, seq)) => {
                self.wait_durable(seq).await?;
                Err(err)
            }
        }
    }

    /// The part of an Acquire that happens at once: validation, and a grant
    /// or a place in line.
    fn start_acquire(
        self: &Arc<Self>,
        request: Acquire,
    ) -> std::result::Result<Started, (Error, u64)> {
        self.ensure_open().map_err(at_once)?;
        let now = self.clock.now();
        let wait = request.wait.as_millis();
        if wait == 0 {
            return self
                .with_lessor(|l| acquire_now(l, request, now))
                .map(Started::Granted);
        }
        let (tx, granted) = oneshot::channel();
        // Only a waiting request needs itself again (to give up, or retry).
        let retry = request.clone();
        let outcome = self.with_lessor(|l| {
            let outcome = l.acquire(request, now, Some(Waiter(tx)));
            (outcome, l.visible_seq(&retry.key))
        });
        match outcome {
            (AcquireOutcome::Granted(grant), _) => Ok(Started::Granted(grant)),
            // A full line, or a quarantined key: the refusal waits for
            // what it reveals, as any other.
            (AcquireOutcome::Busy(err), seq) => Err((err, seq)),
            (AcquireOutcome::Queued(id), _) => Ok(Started::Queued {
                place: PlaceInLine {
                    shared: self.clone(),
                    key: retry.key.clone(),
                    id,
                    armed: true,
                },
                request: retry,
                granted,
                until: now + wait,
            }),
        }
    }

    /// Leaves the line after the wait ran out: busy, unless the grant raced in.
    async fn give_up_waiting(
        &self,
        request: Acquire,
        place: &mut PlaceInLine,
        granted: &mut oneshot::Receiver<Delivery>,
    ) -> std::result::Result<Grant, (Error, u64)> {
        let now = self.clock.now();
        place.armed = false;
        let outcome = self.with_lessor(|l| {
            if l.cancel_waiter(&request.key, place.id) {
                // One last look: the key may have freed with nobody ahead of us.
                Some(acquire_now(l, request, now))
            } else {
                None
            }
        });
        match outcome {
            Some(outcome) => outcome,
            // Granted between the timeout and the cancel: take the grant.
            None => granted
                .await
                .map_err(|_| at_once(closed()))
                .and_then(delivered),
        }
    }

    fn ensure_open(&self) -> Result<()> {
        if self.stopping.load(Ordering::Acquire) {
            return Err(closed());
        }
        if let Some(failure) = &self.durable.borrow().failure {
            return Err(Error::Unavailable(failure.clone()));
        }
        Ok(())
    }

    /// Waits until storage has committed every change up to `seq`.
    async fn wait_durable(&self, seq: u64) -> Result<()> {
        // Most reads reveal nothing in flight: answer without subscribing.
        if self.durable.borrow().seq >= seq {
            return Ok(());
        }
        let mut durable = self.durable.subscribe();
        let state = durable
            .wait_for(|d| d.seq >= seq || d.failure.is_some())
            .await
            .map_err(|_| closed())?;
        match &state.failure {
            Some(failure) if state.seq < seq => Err(Error::Unavailable(failure.clone())),
            _ => Ok(()),
        }
    }

    fn stop_writer(&self) {
        self.closing.send_replace(true);
        self.stopping.store(true, Ordering::Release);
        let _guard = self.lessor.lock().expect("lessor lock");
        self.writer_wake.notify_all();
        self.timer_wake.notify_one();
    }
}

/// An Acquire that does not wait: the grant, or the busy refusal with the
/// key's visible sequence (it names the holder, so that grant must be
/// durable before the refusal is sent).
fn acquire_now(
    lessor: &mut Lessor<Waiter>,
    request: Acquire,
    now: Millis,
) -> std::result::Result<Grant, (Error, u64)> {
    let key = request.key.clone();
    match lessor.acquire(request, now, None) {
        AcquireOutcome::Granted(grant) => Ok(grant),
        AcquireOutcome::Busy(err) => Err((err, lessor.visible_seq(&key))),
        AcquireOutcome::Queued(_) => unreachable!("no waiter was given"),
    }
}

fn closed() -> Error {
    Error::Unavailable("the server is shutting down".into())
}

/// The engine is the SQLite-backed [`Backend`]: each call applies to the
/// lease table at once, so call order is apply order.
impl Backend for Engine {
    /// The server runs the engine on SQLite only (other stores are tests'
    /// doubles of it).
    fn name(&self) -> &'static str {
        "sqlite"
    }

    fn acquire(&self, request: Acquire) -> Pending<Grant> {
        Box::pin(Engine::acquire(self, request))
    }

    fn renew(&self, key: &Key, fence: Fence, lease_id: LeaseId, ttl: Option<Ttl>) -> Pending<Term> {
        Box::pin(Engine::renew(self, key, fence, lease_id, ttl))
    }

    fn release(
        &self,
        key: &Key,
        fence: Fence,
        lease_id: LeaseId,
        suspend: bool,
        handoff: Option<Handoff>,
    ) -> Pending<EndedTerm> {
        Box::pin(Engine::release(
            self, key, fence, lease_id, suspend, handoff,
        ))
    }

    fn history(&self, key: &Key, before: Option<Fence>, limit: usize) -> Pending<HistoryPage> {
        Box::pin(Engine::history(self, key, before, limit))
    }

    fn unquarantine(&self, key: &Key) -> Pending<KeyView> {
        Box::pin(Engine::unquarantine(self, key))
    }

    fn watch(&self, selector: Selector, start: u64) -> Pending<Watching> {
        Box::pin(std::future::ready(Engine::watch(self, selector, start)))
    }

    fn check(&self, key: &Key, fence: Fence) -> Pending<Term> {
        Box::pin(Engine::check(self, key, fence))
    }

    fn get(&self, key: &Key) -> Pending<KeyView> {
        Box::pin(Engine::get(self, key))
    }

    fn list(
        &self,
        prefix: &str,
        filter: ListFilter,
        after: Option<&Key>,
        page_size: usize,
    ) -> Pending<ListPage> {
        Box::pin(Engine::list(self, prefix, filter, after, page_size))
    }

    fn begin_tool_calls(
        &self,
        key: &Key,
        fence: Fence,
        lease_id: LeaseId,
        specs: Vec<CallSpec>,
    ) -> Pending<BeginOutcome> {
        Box::pin(Engine::begin_tool_calls(self, key, fence, lease_id, specs))
    }

    fn settle_tool_call(
        &self,
        key: &Key,
        fence: Fence,
        lease_id: LeaseId,
        settlement: Settlement,
    ) -> Pending<(ToolCall, bool)> {
        Box::pin(Engine::settle_tool_call(
            self, key, fence, lease_id, settlement,
        ))
    }

    fn list_tool_calls(&self, key: &Key, filter: CallFilter) -> Pending<Vec<ToolCall>> {
        Box::pin(Engine::list_tool_calls(self, key, filter))
    }

    fn begin_shutdown(&self) {
        Engine::begin_shutdown(self);
    }

    fn shutdown(&self) -> BoxFuture<'static, ()> {
        let engine = self.clone();
        Box::pin(async move { Engine::shutdown(&engine).await })
    }

    fn failed(&self) -> BoxFuture<'static, String> {
        Box::pin(Engine::failed(self))
    }

    fn write_metrics(&self, out: &mut Exposition) {
        let stats = self.stats();
        out.gauge(
            "leasehold_leases_live",
            "Terms granted and not yet ended.",
            stats.live_terms as f64,
        );
        out.gauge(
            "leasehold_keys",
            "Keys the server remembers (held, recoverable, or released within the retention).",
            stats.keys as f64,
        );
        out.gauge(
            "leasehold_waiters",
            "Acquires waiting in line for a held key.",
            stats.waiters as f64,
        );
        out.gauge(
            "leasehold_tool_calls_unsettled",
            "Tool calls recorded as running and not yet settled.",
            stats.unsettled_tool_calls as f64,
        );
        out.gauge(
            "leasehold_keys_quarantined",
            "Keys refused to Acquire after too many failed terms in a row (see Unquarantine).",
            stats.quarantined as f64,
        );
        out.counter(
            "leasehold_quarantines_total",
            "Keys that became quarantined.",
            stats.quarantines,
        );
        let (watchers, revision) = self.shared.events.stats();
        out.gauge(
            "leasehold_watchers",
            "Watch streams following the live event feed.",
            watchers as f64,
        );
        out.gauge(
            "leasehold_revision",
            "The highest event revision committed and published to watchers.",
            revision as f64,
        );
        out.counter(
            "leasehold_grants_total",
            "New terms granted (replays not counted).",
            stats.grants,
        );
        out.counters(
            "leasehold_releases_total",
            "Terms ended by their holder: released (finished) or suspended (unfinished, recoverable).",
            [
                (vec![("end", "released")], stats.releases),
                (vec![("end", "suspended")], stats.suspensions),
            ],
        );
        out.counter(
            "leasehold_expirations_total",
            "Terms whose TTL ran out: their holder stopped renewing.",
            stats.expirations,
        );
        out.counter(
            "leasehold_renewals_total",
            "Successful renewals.",
            stats.renewals,
        );
        out.counter(
            "leasehold_commits_total",
            "Transactions committed to storage (one serves many requests).",
            self.commits(),
        );
        out.counter(
            "leasehold_writer_sleeps_total",
            "Times the writer went to sleep with nothing to commit (see --writer-spin-us).",
            self.writer_sleeps(),
        );
        out.histograms(
            "leasehold_commit_seconds",
            "Time to commit one batch to storage (fsync included).",
            [(Vec::new(), &self.shared.commit_seconds)],
        );
        out.histograms(
            "leasehold_commit_batch_size",
            "Rows written by one commit.",
            [(Vec::new(), &self.shared.commit_batch_size)],
        );
    }
}
