//! The seam between the gRPC services and the lease state.
//!
//! The services parse each request into domain values and call a
//! [`Backend`]; they know nothing of where the state lives. Two implement
//! it: the SQLite engine (`leasehold_sqlite::Engine`, the lessor in
//! memory over SQLite: group commit, one process) and the PostgreSQL
//! backend (`leasehold_postgres::PgBackend`, every rule a statement
//! on a database shared by several stateless servers). This crate also
//! holds the vocabulary both speak and neither owns ([`Watching`],
//! [`Commit`], [`cut_off`], [`DEFAULT_MAX_WAITERS_PER_KEY`], the
//! [`FenceFloor`] a start-up may raise) and the
//! metrics writer a backend writes its numbers with ([`metrics`]), so a
//! backend depends on this crate and the core, never on the server or on
//! another backend.
//!
//! # Contract
//! Every implementation keeps the invariants the services promise clients:
//! - at most one live term per key; fences strictly increase and never repeat;
//! - a reply, success *or refusal*, reveals only state that is durable;
//! - operations take effect in the order they are **called**, not the order
//!   their futures are polled: the Session stream calls them as messages
//!   arrive and relies on this to pipeline (a Check sent right after a
//!   Release sees the release). An implementation that cannot apply at call
//!   time must order the work itself (for example per stream);
//! - dropping an `acquire` future that waits in line takes it out of line.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use tokio::sync::watch;

use crate::metrics::Exposition;

#[cfg(feature = "contract")]
pub mod contract;
pub mod fence_floor;
pub mod metrics;

pub use fence_floor::{FenceFloor, MAX_FENCE_FLOOR};

/// How many Acquires may wait in one key's line unless configured
/// (`--max-waiters-per-key`), on either backend.
pub const DEFAULT_MAX_WAITERS_PER_KEY: usize = 1_000;
use leasehold_core::error::{Error, Result};
use leasehold_core::events::{Event, Selector};
use leasehold_core::lease::{EndedTerm, Fence, Handoff, Key, LeaseId, Term, Ttl};
use leasehold_core::ledger::{BeginOutcome, CallFilter, CallSpec, Settlement, ToolCall};
use leasehold_core::lessor::{Acquire, Grant, HistoryPage, KeyView, ListFilter, ListPage};

/// One commit's events, shared by every watcher.
pub type Commit = Arc<[Event]>;

/// The refusal that ends a watcher that fell more than `buffer` commits
/// behind, naming the revision to resume from (both backends' watchers
/// say the same).
pub fn cut_off(buffer: usize, resume: u64) -> Error {
    Error::ResourceExhausted {
        limit: "watch_buffer".into(),
        detail: format!(
            "the watcher fell more than {buffer} commits behind; \
             watch again from revision {resume}"
        ),
    }
}

/// A watcher's view: the revision it starts after, and its events (one item
/// per commit that touched a watched key).
pub struct Watching {
    /// The highest revision committed when the watch began.
    pub revision: u64,
    pub events: BoxStream<'static, Result<Vec<Event>>>,
}

/// A reply still on its way (waiting in line, or for durability).
pub type Pending<T> = BoxFuture<'static, Result<T>>;

/// The lease state behind the gRPC services. See the [module docs](self) for
/// the contract every implementation keeps.
pub trait Backend: Send + Sync + 'static {
    /// The storage behind it, as `ServerInfo` and the logs name it
    /// (`"sqlite"`, `"postgres"`).
    fn name(&self) -> &'static str;

    /// Grants `request.key`, waiting up to `request.wait` in line.
    fn acquire(&self, request: Acquire) -> Pending<Grant>;

    /// Extends the live term `fence` of `key`; `ttl = None` keeps its TTL.
    fn renew(&self, key: &Key, fence: Fence, lease_id: LeaseId, ttl: Option<Ttl>) -> Pending<Term>;

    /// Ends the live term `fence` of `key` (as unfinished with `suspend`),
    /// keeping the key for `handoff`'s successor for a while if given.
    fn release(
        &self,
        key: &Key,
        fence: Fence,
        lease_id: LeaseId,
        suspend: bool,
        handoff: Option<Handoff>,
    ) -> Pending<EndedTerm>;

    /// The live term of `key` if `fence` is it.
    fn check(&self, key: &Key, fence: Fence) -> Pending<Term>;

    /// The state of `key`.
    fn get(&self, key: &Key) -> Pending<KeyView>;

    /// One page of keys starting with `prefix`, after `after`.
    fn list(
        &self,
        prefix: &str,
        filter: ListFilter,
        after: Option<&Key>,
        page_size: usize,
    ) -> Pending<ListPage>;

    /// Up to `limit` ended terms of `key`, newest first, below `before`.
    fn history(&self, key: &Key, before: Option<Fence>, limit: usize) -> Pending<HistoryPage>;

    /// Lifts `key`'s quarantine; the key's state after.
    fn unquarantine(&self, key: &Key) -> Pending<KeyView>;

    /// Follows the keys `selector` picks, from revision `start` (0: from
    /// now on); events only once durable, in revision order, none twice.
    fn watch(&self, selector: Selector, start: u64) -> Pending<Watching>;

    /// Records tool calls as running under the live term, all or none.
    fn begin_tool_calls(
        &self,
        key: &Key,
        fence: Fence,
        lease_id: LeaseId,
        specs: Vec<CallSpec>,
    ) -> Pending<BeginOutcome>;

    /// Records a tool call's terminal outcome; the first one wins. Returns
    /// the winning record and whether an earlier settlement had won.
    fn settle_tool_call(
        &self,
        key: &Key,
        fence: Fence,
        lease_id: LeaseId,
        settlement: Settlement,
    ) -> Pending<(ToolCall, bool)>;

    /// The tool calls of `key` in registration order.
    fn list_tool_calls(&self, key: &Key, filter: CallFilter) -> Pending<Vec<ToolCall>>;

    /// Makes waiting Acquires give up (UNAVAILABLE): the server is draining.
    fn begin_shutdown(&self);

    /// Finishes what is pending and stops; later calls get UNAVAILABLE.
    fn shutdown(&self) -> BoxFuture<'static, ()>;

    /// Resolves (with a description) once the backend can no longer serve
    /// and the process should exit so a supervisor restarts it; never on a
    /// clean stop.
    fn failed(&self) -> BoxFuture<'static, String>;

    /// Whether the backend can serve requests now, as a watch the gRPC
    /// health service follows: `SERVING` while it holds `true`,
    /// `NOT_SERVING` while it holds `false` (and for good once the server
    /// stops or [`Backend::failed`] resolves). A backend that depends on
    /// another system it cannot restart (a database server) reports whether
    /// that system answers, so a load balancer or an orchestrator stops
    /// sending requests that could only be refused with UNAVAILABLE. The
    /// default is always `true`: the SQLite engine's storage is in-process,
    /// and its failure ends the server through [`Backend::failed`].
    fn serving(&self) -> watch::Receiver<bool> {
        watch::channel(true).1
    }

    /// Writes what the backend itself knows (live terms, waiters, grants,
    /// expirations, commit latency...) to a metrics scrape. The services add
    /// request latency and refusals; a backend with nothing to add writes
    /// nothing.
    fn write_metrics(&self, out: &mut Exposition) {
        let _ = out;
    }
}
