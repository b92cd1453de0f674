//! The lease rules, in memory, with no I/O: grants, renewals, releases,
//! expiry, FIFO waiters and fence allocation.
//!
//! The [`Lessor`] is the live state of the server. Every operation changes it
//! at once and records which keys must be written to storage; the engine's
//! writer later takes those keys ([`Lessor::take_batch`]) and commits them in
//! one transaction (group commit). Each change that must be durable before
//! anyone may observe it gets a sequence number; a reply (or a refusal) waits
//! until the storage has committed up to the sequence of the key it reveals
//! ([`KeyView::visible_seq`], [`Lessor::visible_seq`]), which makes reads
//! linearizable with acknowledged writes without touching the disk.
//!
//! # Rules
//! - A term is live while `now < expires_at`; the server's clock decides.
//! - Fences come from one counter for all keys and only go up.
//! - A key that frees (release, expiry) is handed to the first waiter still
//!   waiting, before any newcomer: waiters are served first come, first served.
//! - Renew never makes a term shorter than what was already acknowledged.
//! - On restore (start-up), every term that had not ended gets at least its
//!   full TTL again, since its holder could not renew while the server was down.
//!
//! # Parts
//! - this module: the table and the lease operations;
//! - `key_state`: one key's state, its reader's view and its refusals;
//! - `waiters`: FIFO lines for held keys;
//! - `timers`: term deadlines and retention checks, one entry per key each;
//! - `changes`: change tracking for group commit;
//! - `retention`: forgetting cleanly released keys;
//! - `lifecycle`: lock-delay, handoff reservations, quarantine, term history;
//! - `tool_calls`: the tool-call ledger under the live term.

mod changes;
mod key_state;
mod lifecycle;
mod retention;
mod timers;
mod tool_calls;
mod waiters;

use std::collections::{BTreeMap, BTreeSet};

use crate::clock::Millis;
use crate::error::{Error, Result};
use crate::lease::{
    AcquireOptions, EndedTerm, Fence, Handoff, Key, LeaseId, Lifecycle, Owner, RequestId,
    Reservation, Term, TermEnd, Ttl, Wait,
};
use crate::ledger::{Ledger, ToolCall};
use crate::store::{Batch, KeyRecord};

use crate::events::{Event, EventKind};
use changes::{Changes, Draft};
use key_state::{KeyState, denied, holder, stale, unknown};
use timers::Timers;

pub use key_state::stale_reason;
pub use lifecycle::{DEFAULT_HISTORY_LEN, HistoryPage, line_full};
pub use retention::DEFAULT_RETENTION_MS;
pub use waiters::{WaiterHandle, WaiterId};

/// What an Acquire asks for: the one shape of an Acquire inside the server,
/// parsed once where it arrives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acquire {
    pub key: Key,
    pub owner: Owner,
    pub ttl: Ttl,
    /// How long to wait in line if the key is held (the lessor only queues;
    /// the engine runs the wait).
    pub wait: Wait,
    /// The retry token; `None` when the client sent none.
    pub request_id: Option<RequestId>,
    /// Lock-delay, recovery limit, force.
    pub options: AcquireOptions,
}

/// A term handed out by Acquire (new or replayed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub key: Key,
    pub term: Term,
    /// How the key's previous term ended, if it had one.
    pub previous: Option<EndedTerm>,
    /// True when this repeats an earlier grant for the same request id.
    pub replayed: bool,
    /// Tool calls earlier terms began and never settled.
    pub unsettled_tool_calls: usize,
    /// The reply may only be sent once storage has committed this sequence.
    pub visible_seq: u64,
}

/// The result of [`Lessor::acquire`].
#[derive(Debug)]
pub enum AcquireOutcome {
    /// The key was free (or this is a retry of the grant): here is the term.
    Granted(Grant),
    /// The key is held; the request waits in line under this id.
    Queued(WaiterId),
    /// The key is held (or reserved, or quarantined) and the request did
    /// not want to wait, or cannot.
    Busy(Error),
}

/// What a queued Acquire gets when it leaves the line: a grant, or a
/// refusal with the sequence it must wait for (the key was quarantined
/// while it waited).
#[derive(Debug)]
pub enum Delivery {
    Granted(Grant),
    Refused(Error, u64),
}

/// A key as readers see it (never with a lease id leaving the server).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyView {
    pub key: Key,
    pub live: Option<Term>,
    pub last_ended: Option<EndedTerm>,
    /// No live term, the last one ended expired or suspended, and the key
    /// is not quarantined.
    pub recoverable: bool,
    /// Acquires are refused until an admin lifts the quarantine.
    pub quarantined: bool,
    /// Who alone may take the key now, if it is free but reserved.
    pub reservation: Option<Reservation>,
    /// The reply may only be sent once storage has committed this sequence.
    pub visible_seq: u64,
}

/// One page of [`Lessor::list`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListPage {
    pub keys: Vec<KeyView>,
    /// The key to continue after, when there may be more.
    pub next_after: Option<Key>,
    /// The highest `visible_seq` over every key scanned, returned or not.
    pub visible_seq: u64,
}

/// What the table holds and has done, for metrics: kept up to date as it
/// changes, so reading it costs nothing however large the table is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Keys the table holds.
    pub keys: usize,
    /// Terms not ended yet (one whose TTL just ran out counts until the
    /// timer or the next touch ends it).
    pub live_terms: usize,
    /// Acquires waiting in line, over all keys.
    pub waiters: usize,
    /// Tool calls recorded as running.
    pub unsettled_tool_calls: usize,
    /// Since start-up: new terms granted (replays not counted).
    pub grants: u64,
    /// Since start-up: terms released, suspended, expired.
    pub releases: u64,
    pub suspensions: u64,
    pub expirations: u64,
    /// Since start-up: successful renewals.
    pub renewals: u64,
    /// Keys quarantined now.
    pub quarantined: usize,
    /// Since start-up: keys that became quarantined.
    pub quarantines: u64,
}

/// The largest List page, and the one given when a request names none.
pub const MAX_PAGE_SIZE: usize = 1000;
pub const DEFAULT_PAGE_SIZE: usize = 100;

/// How many keys a List asked for `page_size` returns at most (0: the
/// default), the same on every backend.
///
/// # Errors
/// [`Error::InvalidArgument`] for a page size over [`MAX_PAGE_SIZE`].
pub fn page_limit(page_size: usize) -> Result<usize> {
    match page_size {
        0 => Ok(DEFAULT_PAGE_SIZE),
        n if n > MAX_PAGE_SIZE => Err(Error::InvalidArgument(format!(
            "page_size {n} is over the limit of {MAX_PAGE_SIZE}"
        ))),
        n => Ok(n),
    }
}

/// Which keys [`Lessor::list`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListFilter {
    Live,
    /// Free keys whose last term expired or was suspended (not quarantined).
    Recoverable,
    Quarantined,
    All,
}

/// The in-memory lease table and its rules. `W` is how a waiting Acquire is
/// woken; the lessor only stores it and hands it back with the grant.
#[derive(Debug)]
pub struct Lessor<W> {
    /// Every key known, ordered for List.
    keys: BTreeMap<Key, KeyState<W>>,
    /// The keys that are recoverable as stored (free, last term expired or
    /// suspended, not quarantined), ordered: List RECOVERABLE walks this,
    /// not the table, so a page costs what it returns. Kept up to date
    /// wherever a term ends, a key is taken, quarantined or lifted, restored
    /// or forgotten ([`Lessor::note_recoverable`]).
    recoverable: BTreeSet<Key>,
    /// The highest `visible_seq` at which a key left `recoverable` (a grant
    /// took it): a List RECOVERABLE page leaves such a key out, so it may
    /// only be sent once that grant is durable (a crash that undid it would
    /// make the key recoverable again).
    recoverable_left_seq: u64,
    /// The fence the next grant gets.
    next_fence: u64,
    /// Term deadlines and retention checks.
    timers: Timers,
    /// What changed since the last batch.
    changes: Changes,
    /// Grants (and refusals) for queued waiters, for the caller to deliver.
    handoffs: Vec<(W, Delivery)>,
    /// The id the next queued Acquire gets.
    next_waiter_id: WaiterId,
    /// The registration counter of tool calls, server-wide.
    next_ordinal: u64,
    /// How long a cleanly released key (its last term and its settled tool
    /// calls) is remembered.
    retention_ms: u64,
    /// Counts for metrics.
    stats: Stats,
    /// At most this many Acquires wait in one key's line.
    max_waiters_per_key: usize,
    /// How many ended terms each key remembers.
    history_len: usize,
    /// The recovery limit of terms whose Acquire named none (`None`: no
    /// quarantine).
    default_max_recoveries: Option<u32>,
    /// The revision the next event gets (see [`crate::events`]).
    next_revision: u64,
}

impl<W: WaiterHandle> Lessor<W> {
    /// Rebuilds the live state from storage at start-up.
    ///
    /// Terms that had not ended get at least their full TTL again from `now`
    /// (invariant 4: keep a lease longer, never shorter). The next fence is
    /// above both the stored high-water mark and every stored fence.
    pub fn restore(
        records: Vec<KeyRecord>,
        calls: Vec<(Key, ToolCall)>,
        fence_high_water: u64,
        now: Millis,
        retention_ms: u64,
    ) -> Self {
        let mut lessor = Lessor {
            keys: BTreeMap::new(),
            recoverable: BTreeSet::new(),
            recoverable_left_seq: 0,
            next_fence: fence_high_water + 1,
            timers: Timers::new(),
            changes: Changes::default(),
            handoffs: Vec::new(),
            next_waiter_id: 1,
            next_ordinal: 1,
            retention_ms,
            stats: Stats::default(),
            max_waiters_per_key: usize::MAX,
            history_len: DEFAULT_HISTORY_LEN,
            default_max_recoveries: None,
            next_revision: 1,
        };
        for record in records {
            let mut state = KeyState::new();
            lessor.restore_lifecycle(&record, &mut state, now);
            if let Some(mut term) = record.live {
                term.expires_at = term.expires_at.max(now + term.ttl.as_millis());
                lessor.next_fence = lessor.next_fence.max(term.fence.0 + 1);
                lessor.timers.file_deadline(
                    &record.key,
                    term.expires_at,
                    &mut state.deadline_entry,
                );
                state.live = Some(term);
                lessor.stats.live_terms += 1;
            }
            if let Some(ended) = &record.last_ended {
                lessor.next_fence = lessor.next_fence.max(ended.fence.0 + 1);
                if ended.end == TermEnd::Released && state.live.is_none() {
                    let at = ended.ended_at.saturating_add(retention_ms);
                    lessor.timers.schedule_prune(&record.key, at);
                    state.prune_scheduled = true;
                }
            }
            state.last_ended = record.last_ended;
            lessor.stats.quarantined += usize::from(state.quarantined);
            if recoverable_as_stored(&state) {
                lessor.recoverable.insert(record.key.clone());
            }
            lessor.keys.insert(record.key, state);
        }
        let mut by_key: BTreeMap<Key, Vec<ToolCall>> = BTreeMap::new();
        for (key, call) in calls {
            lessor.next_ordinal = lessor.next_ordinal.max(call.ordinal + 1);
            by_key.entry(key).or_default().push(call);
        }
        for (key, calls) in by_key {
            let state = lessor.keys.entry(key).or_insert_with(KeyState::new);
            let ledger = Ledger::from_calls(calls);
            lessor.stats.unsettled_tool_calls += ledger.unsettled();
            state.ledger = Some(Box::new(ledger));
        }
        lessor
    }

    /// Caps how many Acquires may wait in one key's line; one more is
    /// refused (RESOURCE_EXHAUSTED) instead of queued.
    pub fn set_max_waiters_per_key(&mut self, max: usize) {
        self.max_waiters_per_key = max;
    }

    /// How many ended terms each key remembers (at least 1).
    pub fn set_history_len(&mut self, len: usize) {
        self.history_len = len.max(1);
    }

    /// The recovery limit for terms whose Acquire named none; `None` never
    /// quarantines them.
    pub fn set_default_max_recoveries(&mut self, max: Option<u32>) {
        self.default_max_recoveries = max.filter(|&k| k > 0);
    }

    /// Continues the event log after `revision`, the highest stored.
    pub fn resume_revisions(&mut self, revision: u64) {
        self.next_revision = self.next_revision.max(revision + 1);
    }

    /// The highest revision given so far (0: none).
    pub fn revision(&self) -> u64 {
        self.next_revision - 1
    }

    /// An empty lessor whose first fence is 1.
    pub fn new() -> Self {
        Self::restore(Vec::new(), Vec::new(), 0, 0, DEFAULT_RETENTION_MS)
    }

    /// Grants `request.key` if it is free; otherwise queues `waiter` or
    /// reports busy.
    ///
    /// A request whose owner and request id match the live term gets that term
    /// back (a retry after a lost reply), not a conflict.
    pub fn acquire(&mut self, request: Acquire, now: Millis, waiter: Option<W>) -> AcquireOutcome {
        self.catch_up(&request.key, now);
        if let Some(state) = self.keys.get(&request.key) {
            if let Some(term) = &state.live {
                if request.request_id.is_some()
                    && term.request_id == request.request_id
                    && term.owner == request.owner
                {
                    return AcquireOutcome::Granted(Grant {
                        key: request.key,
                        term: term.clone(),
                        previous: state.last_ended.clone(),
                        replayed: true,
                        unsettled_tool_calls: state.unsettled_tool_calls(),
                        visible_seq: state.visible_seq,
                    });
                }
                if waiter.is_some() && state.waiters.len() >= self.max_waiters_per_key {
                    return AcquireOutcome::Busy(self.line_full(&request.key));
                }
                return match waiter {
                    Some(handle) => AcquireOutcome::Queued(self.enqueue(request, handle)),
                    None => AcquireOutcome::Busy(Error::Busy {
                        holder: term.owner.clone(),
                        fence: term.fence,
                        remaining_ms: term.expires_at.saturating_sub(now),
                        key: request.key,
                    }),
                };
            }
            if state.quarantined && !request.options.force {
                return AcquireOutcome::Busy(state.quarantined_error(&request.key));
            }
            match state.reservation_at(now) {
                Some(Reservation::Handoff { successor, .. }) if *successor == request.owner => {
                    return AcquireOutcome::Granted(self.grant(request, now, true));
                }
                Some(reservation) => {
                    let refusal = state.reserved_error(&request.key, reservation, now);
                    if waiter.is_some() && state.waiters.len() >= self.max_waiters_per_key {
                        return AcquireOutcome::Busy(self.line_full(&request.key));
                    }
                    return match waiter {
                        Some(handle) => AcquireOutcome::Queued(self.enqueue(request, handle)),
                        None => AcquireOutcome::Busy(refusal),
                    };
                }
                None => {}
            }
        }
        AcquireOutcome::Granted(self.grant(request, now, false))
    }

    /// Extends the live term `fence` of `key` to `now + ttl` (never shortening it).
    ///
    /// `ttl = None` keeps the term's TTL. Returns the term and the sequence
    /// the reply must wait for: a longer TTL is made durable before the reply,
    /// because a restart restores terms with their stored TTL.
    ///
    /// # Errors
    /// [`Error::StaleFence`] when `fence` is not the live term;
    /// [`Error::PermissionDenied`] when `lease_id` does not match it.
    pub fn renew(
        &mut self,
        key: &Key,
        fence: Fence,
        lease_id: LeaseId,
        ttl: Option<Ttl>,
        now: Millis,
    ) -> Result<(Term, u64)> {
        self.catch_up(key, now);
        let state = holder(&mut self.keys, key, fence, lease_id)?;
        let term = state.live.as_mut().expect("holder has a live term");
        let ttl = ttl.unwrap_or(term.ttl);
        let longer_ttl = ttl > term.ttl;
        term.ttl = ttl;
        term.expires_at = term.expires_at.max(now + ttl.as_millis());
        let term = term.clone();
        self.stats.renewals += 1;
        if longer_ttl {
            state.visible_seq = self.changes.next_seq();
        }
        let visible_seq = state.visible_seq;
        self.changes.key(key, longer_ttl);
        Ok((term, visible_seq))
    }

    /// Ends the live term `fence` of `key`, as released or (with `suspend`) as
    /// unfinished, and hands the key to the first waiter.
    ///
    /// Releasing a term this same fence already released or suspended succeeds
    /// again and returns the term as it first ended, so retries are safe, as
    /// long as no newer term holds the key (then the retry is refused as
    /// superseded: that is the truth).
    ///
    /// With a `handoff`, the freed key is kept for the named successor for
    /// that long: it gets the key ahead of every waiter (at once, if it is
    /// already in line), others only once the time runs out.
    ///
    /// # Errors
    /// [`Error::StaleFence`] when `fence` is not the live term (and was not
    /// released by that fence); [`Error::PermissionDenied`] when `lease_id`
    /// does not match it.
    pub fn release(
        &mut self,
        key: &Key,
        fence: Fence,
        lease_id: LeaseId,
        suspend: bool,
        handoff: Option<Handoff>,
        now: Millis,
    ) -> Result<(EndedTerm, u64)> {
        self.catch_up(key, now);
        let state = self.keys.get_mut(key).ok_or_else(|| unknown(key, fence))?;
        match (&state.live, &state.last_ended) {
            (Some(term), _) if term.fence == fence => {
                if term.lease_id != lease_id {
                    return Err(denied(key, fence));
                }
            }
            (None, Some(ended)) if ended.fence == fence && ended.end != TermEnd::Expired => {
                if ended.lease_id != lease_id {
                    return Err(denied(key, fence));
                }
                return Ok((ended.clone(), state.visible_seq));
            }
            _ => return Err(stale(key, fence, state.stale_reason(fence))),
        }
        let end = if suspend {
            TermEnd::Suspended
        } else {
            TermEnd::Released
        };
        let ended = self
            .end_term(key, end, now)
            .expect("live term checked above");
        if let Some(handoff) = handoff {
            self.reserve(
                key,
                Reservation::Handoff {
                    from: fence,
                    successor: handoff.successor,
                    until: now.saturating_add(handoff.for_ms),
                },
            );
        }
        if end == TermEnd::Released {
            self.schedule_prune(key, now.saturating_add(self.retention_ms));
        }
        self.serve_waiters(key, now);
        Ok((ended, self.visible_seq(key)))
    }

    /// The live term of `key` if it has fence `fence`.
    ///
    /// # Errors
    /// [`Error::StaleFence`] when `fence` is not the key's live term.
    pub fn check(&mut self, key: &Key, fence: Fence, now: Millis) -> Result<(Term, u64)> {
        self.catch_up(key, now);
        let state = self.keys.get(key).ok_or_else(|| unknown(key, fence))?;
        match &state.live {
            Some(term) if term.fence == fence => Ok((term.clone(), state.visible_seq)),
            _ => Err(stale(key, fence, state.stale_reason(fence))),
        }
    }

    /// The reader's view of `key`.
    ///
    /// # Errors
    /// [`Error::NotFound`] when the key was never acquired.
    pub fn get(&mut self, key: &Key, now: Millis) -> Result<KeyView> {
        self.catch_up(key, now);
        self.keys
            .get(key)
            .map(|state| state.view(key, now, self.default_max_recoveries))
            .ok_or_else(|| Error::NotFound(key.clone()))
    }

    /// Up to `limit` keys starting with `prefix`, in key order, after `after`.
    ///
    /// Scans at most `scan_budget` keys so one call never holds the table for
    /// long; returns the key to continue after when there may be more, and
    /// the highest `visible_seq` of every key it looked at: a key the filter
    /// left out may be left out because of a change not yet durable (a grant
    /// hides a recoverable key), so the page may only be sent once that
    /// change is. RECOVERABLE is served from an index of its own and visits
    /// only the keys it returns (see [`Lessor::list_counting`]).
    pub fn list(
        &self,
        prefix: &str,
        filter: ListFilter,
        after: Option<&Key>,
        limit: usize,
        scan_budget: usize,
        now: Millis,
    ) -> ListPage {
        self.list_counting(prefix, filter, after, limit, scan_budget, now)
            .0
    }

    /// As [`Lessor::list`], with how many keys the page visited (looked up
    /// in the table): for RECOVERABLE the keys returned, plus any whose
    /// term ran out and that the expiry timer has not ended yet; for the
    /// other filters every key scanned.
    pub fn list_counting(
        &self,
        prefix: &str,
        filter: ListFilter,
        after: Option<&Key>,
        limit: usize,
        scan_budget: usize,
        now: Millis,
    ) -> (ListPage, usize) {
        use std::ops::Bound;
        let start = match after {
            Some(after) if after.as_str() >= prefix => Bound::Excluded(after.as_str()),
            _ => Bound::Included(prefix),
        };
        if filter == ListFilter::Recoverable {
            return self.list_recoverable(prefix, start, limit, now);
        }
        let mut page = ListPage::default();
        let mut last = None;
        let mut scanned = 0;
        let range = self.keys.range::<str, _>((start, Bound::Unbounded));
        for (key, state) in range {
            if !key.as_str().starts_with(prefix) {
                return (page, scanned);
            }
            if page.keys.len() == limit || scanned == scan_budget {
                page.next_after = last;
                return (page, scanned);
            }
            scanned += 1;
            last = Some(key.clone());
            page.visible_seq = page.visible_seq.max(state.visible_seq);
            // Quarantine needs no view: most keys are skipped without one
            // (a lapsed term may still earn it: its view decides).
            if filter == ListFilter::Quarantined && !state.quarantined && !state.lapsed_at(now) {
                continue;
            }
            let view = state.view(key, now, self.default_max_recoveries);
            let wanted = match filter {
                ListFilter::Live => view.live.is_some(),
                ListFilter::Recoverable => view.recoverable,
                ListFilter::Quarantined => view.quarantined,
                ListFilter::All => true,
            };
            if wanted {
                page.keys.push(view);
            }
        }
        (page, scanned)
    }

    /// List RECOVERABLE from the index, in O(page): the indexed keys after
    /// `start`, merged in key order with the keys whose term ran out at
    /// `now` but that the expiry timer has not ended yet (readers already
    /// see those as expired; normally there are none, during a mass expiry
    /// as many as the timer has still to reach). The page is full, and
    /// names the key to continue after, exactly when a scan of the table
    /// would be: `limit` keys returned and another key under `prefix`
    /// follows them.
    fn list_recoverable(
        &self,
        prefix: &str,
        start: std::ops::Bound<&str>,
        limit: usize,
        now: Millis,
    ) -> (ListPage, usize) {
        use std::ops::Bound;
        let in_range = |key: &Key| {
            let after_start = match start {
                Bound::Excluded(start) => key.as_str() > start,
                Bound::Included(start) => key.as_str() >= start,
                Bound::Unbounded => true,
            };
            after_start && key.as_str().starts_with(prefix)
        };
        let mut visited = 0;
        let mut page = ListPage {
            visible_seq: self.recoverable_left_seq,
            ..ListPage::default()
        };
        // Keys whose term ran out unseen: readers see them as ended.
        let mut lapsed: Vec<&Key> = self
            .timers
            .due_deadlines(now)
            .filter(|key| in_range(key))
            .filter(|key| {
                visited += 1;
                self.keys.get(*key).is_some_and(|state| {
                    page.visible_seq = page.visible_seq.max(state.visible_seq);
                    state.lapsed_at(now)
                        && state
                            .view(key, now, self.default_max_recoveries)
                            .recoverable
                })
            })
            .collect();
        lapsed.sort_unstable();
        let mut lapsed = lapsed.into_iter().peekable();
        let mut indexed = self
            .recoverable
            .range::<str, _>((start, Bound::Unbounded))
            .take_while(|key| key.as_str().starts_with(prefix))
            .peekable();
        while page.keys.len() < limit {
            // The smaller of the two heads (an indexed key is free, a lapsed
            // one still holds its term, so no key is in both).
            let key = match (indexed.peek(), lapsed.peek()) {
                (Some(a), Some(b)) if a < b => indexed.next(),
                (Some(_), Some(_)) | (None, Some(_)) => lapsed.next(),
                (Some(_), None) => indexed.next(),
                (None, None) => break,
            };
            let Some(key) = key else { break };
            let Some(state) = self.keys.get(key) else {
                continue;
            };
            visited += 1;
            page.visible_seq = page.visible_seq.max(state.visible_seq);
            page.keys
                .push(state.view(key, now, self.default_max_recoveries));
        }
        if page.keys.len() == limit {
            if let Some(last) = page.keys.last().map(|view| &view.key) {
                let more = self
                    .keys
                    .range::<Key, _>((Bound::Excluded(last), Bound::Unbounded))
                    .next()
                    .is_some_and(|(key, _)| key.as_str().starts_with(prefix));
                if more {
                    page.next_after = Some(last.clone());
                }
            }
        }
        (page, visited)
    }

    /// Brings `key`'s entry in the recoverable index up to its state, after
    /// a change that may have made it recoverable or not.
    fn note_recoverable(&mut self, key: &Key) {
        match self.keys.get(key) {
            Some(state) if recoverable_as_stored(state) => {
                if !self.recoverable.contains(key) {
                    self.recoverable.insert(key.clone());
                }
            }
            state => {
                if self.recoverable.remove(key) {
                    let seq = state.map_or(0, |s| s.visible_seq);
                    self.recoverable_left_seq = self.recoverable_left_seq.max(seq);
                }
            }
        }
    }

    /// The sequence that must be durable before anything about `key` may be
    /// revealed, refusals included (0 for a key the table does not hold).
    pub fn visible_seq(&self, key: &Key) -> u64 {
        self.keys.get(key).map_or(0, |s| s.visible_seq)
    }

    /// Ends every term whose deadline has passed, hands freed keys to waiters,
    /// and prunes ledgers whose retention ran out.
    pub fn expire_due(&mut self, now: Millis) {
        while self.expire_due_up_to(now, usize::MAX) {}
    }

    /// As [`Lessor::expire_due`], but looks at no more than `budget` deadlines,
    /// so the caller can let others at the table between chunks of a mass
    /// expiry. Returns whether more deadlines are due.
    pub fn expire_due_up_to(&mut self, now: Millis, budget: usize) -> bool {
        self.prune_due(now);
        for _ in 0..budget {
            let Some(key) = self.timers.pop_due_deadline(now) else {
                return false;
            };
            let Some(state) = self.keys.get_mut(&key) else {
                continue;
            };
            state.deadline_entry = None;
            // The entry serves the live term, or the free key's reservation.
            let due = match (&state.live, &state.reservation) {
                (Some(term), _) => Some(term.expires_at),
                (None, Some(reservation)) => Some(reservation.until()),
                (None, None) => None,
            };
            match due {
                // Renewed (or reserved again) since the entry was filed:
                // file it again.
                Some(at) if at > now => {
                    self.timers
                        .file_deadline(&key, at, &mut state.deadline_entry);
                }
                Some(_) => self.catch_up(&key, now),
                None => {}
            }
        }
        self.timers.deadline_due(now)
    }

    /// The earliest deadline the expiry timer must wake for.
    pub fn next_deadline(&self) -> Option<Millis> {
        self.timers.next()
    }

    /// Whether a grant moved the earliest deadline since the last call, so a
    /// sleeping timer must re-arm.
    pub fn take_deadline_changed(&mut self) -> bool {
        self.timers.take_earliest_changed()
    }

    /// How many entries the expiry timer holds (at most one per key).
    pub fn deadline_entries(&self) -> usize {
        self.timers.deadline_entries()
    }

    /// How many entries the retention timer holds (at most one per key).
    pub fn prune_entries(&self) -> usize {
        self.timers.prune_entries()
    }

    /// Whether a change waits to be made durable before some reply.
    pub fn has_urgent(&self) -> bool {
        self.changes.has_urgent()
    }

    /// Whether any change (urgent or not) is not yet handed to storage.
    pub fn has_dirty(&self) -> bool {
        self.changes.has_dirty()
    }

    /// Whether lazy changes are left over from a batch that took only some.
    pub fn has_lazy_backlog(&self) -> bool {
        self.changes.has_lazy_backlog()
    }

    /// How many keys changed lazily wait for storage.
    pub fn lazy_backlog(&self) -> usize {
        self.changes.lazy_backlog()
    }

    /// Takes every change since the last batch, for storage to commit at once.
    pub fn take_batch(&mut self) -> Batch {
        self.take_batch_up_to(usize::MAX)
    }

    /// Takes every change that must be durable before a reply, and at most
    /// `lazy_limit` keys changed lazily (the rest stay for the next batch).
    /// Committing the batch still makes every change up to its `seq` durable.
    pub fn take_batch_up_to(&mut self, lazy_limit: usize) -> Batch {
        let taken = self.changes.take(lazy_limit);
        let records = taken
            .keys
            .into_iter()
            .filter_map(|key| {
                let state = self.keys.get_mut(&key)?;
                let history = state
                    .history
                    .range(state.history.len() - state.history_unsaved..);
                let record = KeyRecord {
                    live: state.live.clone(),
                    last_ended: state.last_ended.clone(),
                    reservation: state.reservation.clone(),
                    failures: state.failures,
                    quarantined: state.quarantined,
                    history: history.cloned().collect(),
                    history_dropped: std::mem::take(&mut state.history_dropped),
                    key,
                };
                state.history_unsaved = 0;
                Some(record)
            })
            .collect();
        let calls = taken
            .calls
            .into_iter()
            .filter_map(|(key, call)| {
                let call = self.keys.get(&key)?.ledger.as_ref()?.get(&call)?.clone();
                Some((key, call))
            })
            .collect();
        let events = taken
            .events
            .into_iter()
            .map(|draft| {
                let revision = self.next_revision;
                self.next_revision += 1;
                Event {
                    revision,
                    key: draft.key,
                    kind: draft.kind,
                    fence: draft.fence,
                    owner: draft.owner,
                    at: draft.at,
                }
            })
            .collect();
        Batch {
            records,
            forgotten: taken.forgotten,
            forgotten_history: taken.forgotten_history,
            pruned_calls: taken.pruned_calls,
            calls,
            fence_high_water: self.next_fence - 1,
            seq: taken.seq,
            events,
        }
    }

    /// The number of keys the lessor tracks.
    pub fn key_count(&self) -> usize {
        self.keys.len()
    }

    /// Counts for metrics (O(1)).
    pub fn stats(&self) -> Stats {
        Stats {
            keys: self.keys.len(),
            ..self.stats
        }
    }

    /// Brings `key` up to `now`: ends its term if it expired, then, if the
    /// key is free, grants it to the first waiter still waiting. Every
    /// operation on a key starts here, so nothing sees an expired term as
    /// live or a free key with waiters.
    fn catch_up(&mut self, key: &Key, now: Millis) {
        let Some(state) = self.keys.get(key) else {
            return;
        };
        if let Some(term) = state.live.as_ref().filter(|t| !t.is_live_at(now)) {
            let at = term.expires_at;
            self.end_term(key, TermEnd::Expired, at);
        }
        self.lapse_reservation(key, now);
        self.serve_waiters(key, now);
    }

    /// Starts a new term on a free key (for its named successor when
    /// `handed_off`), ending any reservation.
    fn grant(&mut self, request: Acquire, now: Millis, handed_off: bool) -> Grant {
        let fence = Fence(self.next_fence);
        self.next_fence += 1;
        let term = Term {
            fence,
            owner: request.owner,
            lease_id: LeaseId::random(),
            request_id: request.request_id,
            ttl: request.ttl,
            acquired_at: now,
            expires_at: now + request.ttl.as_millis(),
            lifecycle: Lifecycle {
                lock_delay_ms: request.options.lock_delay_ms,
                max_recoveries: request.options.max_recoveries,
                handed_off,
            },
        };
        let seq = self.changes.next_seq();
        let state = self
            .keys
            .entry(request.key.clone())
            .or_insert_with(KeyState::new);
        self.timers
            .file_deadline(&request.key, term.expires_at, &mut state.deadline_entry);
        state.live = Some(term.clone());
        state.reservation = None;
        state.visible_seq = seq;
        self.stats.live_terms += 1;
        self.stats.grants += 1;
        let grant = Grant {
            previous: state.last_ended.clone(),
            unsettled_tool_calls: state.unsettled_tool_calls(),
            key: request.key,
            term,
            replayed: false,
            visible_seq: seq,
        };
        self.note_recoverable(&grant.key);
        self.changes.key(&grant.key, true);
        self.changes.event(Draft {
            key: grant.key.clone(),
            kind: EventKind::Granted,
            fence,
            owner: grant.term.owner.clone(),
            at: now,
        });
        grant
    }

    /// Moves the live term of `key` to its ended record.
    ///
    /// A release must be durable before its reply; an expiry need not be, since
    /// a restart that forgets it only keeps the term longer.
    fn end_term(&mut self, key: &Key, end: TermEnd, at: Millis) -> Option<EndedTerm> {
        let state = self.keys.get_mut(key)?;
        let term = state.live.take()?;
        let ending = term.ending(end, at, state.standing(), self.default_max_recoveries);
        let ended = ending.ended.clone();
        self.stats.live_terms -= 1;
        let was_quarantined = state.quarantined;
        state.record_end(&term, &ending, self.history_len);
        match (was_quarantined, state.quarantined) {
            (false, true) => {
                self.stats.quarantined += 1;
                self.stats.quarantines += 1;
            }
            (true, false) => self.stats.quarantined -= 1,
            _ => {}
        }
        if let Some(lock_delay) = ending.lock_delay {
            self.reserve(key, lock_delay);
        }
        let state = self.keys.get_mut(key)?;
        match end {
            TermEnd::Released => self.stats.releases += 1,
            TermEnd::Suspended => self.stats.suspensions += 1,
            TermEnd::Expired => self.stats.expirations += 1,
        }
        let urgent = end != TermEnd::Expired;
        if urgent {
            state.visible_seq = self.changes.next_seq();
        }
        self.changes.key(key, urgent);
        self.note_recoverable(key);
        self.changes.event(Draft {
            key: key.clone(),
            kind: EventKind::of_end(end),
            fence: ended.fence,
            owner: ended.owner.clone(),
            at,
        });
        Some(ended)
    }
}

/// Whether a key is recoverable as stored: free, its last term expired or
/// suspended, not quarantined. (A reader's view also counts a term whose TTL
/// ran out and that nothing has ended yet.)
fn recoverable_as_stored<W>(state: &KeyState<W>) -> bool {
    state.live.is_none()
        && !state.quarantined
        && state
            .last_ended
            .as_ref()
            .is_some_and(|e| e.end.is_recoverable())
}

impl<W: WaiterHandle> Default for Lessor<W> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests;
