//! The lease rules, in memory, with no I/O: grants, renewals, releases,
//! expiry, FIFO waiters and fence allocation.
//!
//! The [`Lessor`] is the live state of the server. Every operation changes it
//! at once and records which keys must be written to storage; the engine's
//! writer later takes those keys ([`Lessor::take_batch`]) and commits them in
//! one transaction (group commit). Each change that must be durable before
//! anyone may observe it gets a sequence number; a reply waits until the
//! storage has committed up to the sequence of the key it reveals
//! ([`KeyView::visible_seq`]), which makes reads linearizable with acknowledged
//! writes without touching the disk.
//!
//! # Rules
//! - A term is live while `now < expires_at`; the server's clock decides.
//! - Fences come from one counter for all keys and only go up.
//! - A key that frees (release, expiry) is handed to the first waiter still
//!   waiting, before any newcomer: waiters are served first come, first served.
//! - Renew never makes a term shorter than what was already acknowledged.
//! - On restore (start-up), every term that had not ended gets at least its
//!   full TTL again, since its holder could not renew while the server was down.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashSet, VecDeque};

use crate::clock::Millis;
use crate::error::{Error, Result, StaleReason};
use crate::lease::{EndedTerm, Fence, LeaseId, Term, TermEnd};
use crate::ledger::{BeginOutcome, CallFilter, CallSpec, Ledger, Settlement, ToolCall};
use crate::store::{Batch, KeyRecord};

/// The waiting side of a queued Acquire, owned by whoever delivers grants.
pub trait WaiterHandle {
    /// False once the waiter has given up (its request was cancelled), so the
    /// key is not handed to nobody.
    fn is_waiting(&self) -> bool;
}

/// Identifies a queued Acquire, to cancel it when its wait runs out.
pub type WaiterId = u64;

/// What an Acquire asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireSpec {
    pub key: String,
    pub owner: String,
    pub ttl_ms: u64,
    /// The retry token; `None` when the client sent none.
    pub request_id: Option<String>,
}

/// What an Acquire asks for, as received.
#[derive(Debug, Clone, Default)]
pub struct AcquireRequest {
    pub key: String,
    pub owner: String,
    pub ttl_ms: u64,
    pub wait_ms: u64,
    /// Empty means no retry token.
    pub request_id: String,
}

/// A term handed out by Acquire (new or replayed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub key: String,
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
    /// The key is held and the request did not want to wait.
    Busy(Error),
}

/// A key as readers see it (never with a lease id leaving the server).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyView {
    pub key: String,
    pub live: Option<Term>,
    pub last_ended: Option<EndedTerm>,
    /// No live term, and the last one ended expired or suspended.
    pub recoverable: bool,
    /// The reply may only be sent once storage has committed this sequence.
    pub visible_seq: u64,
}

/// One page of [`Lessor::list`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListPage {
    pub keys: Vec<KeyView>,
    /// The key to continue after, when there may be more.
    pub next_after: Option<String>,
    /// The highest `visible_seq` over every key scanned, returned or not.
    pub visible_seq: u64,
}

/// Which keys [`Lessor::list`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListFilter {
    Live,
    Recoverable,
    All,
}

/// One waiting Acquire.
#[derive(Debug)]
struct Queued<W> {
    id: WaiterId,
    spec: AcquireSpec,
    handle: W,
}

/// Everything the lessor knows about one key.
#[derive(Debug)]
struct KeyState<W> {
    /// The term holding the key, if any. It may have expired and not yet been
    /// ended: [`Lessor::settle`] ends it on the next touch or timer tick.
    live: Option<Term>,
    /// The last ended term, for `previous`, recoverability and retried releases.
    last_ended: Option<EndedTerm>,
    /// Acquires waiting for this key, first come first served.
    waiters: VecDeque<Queued<W>>,
    /// Sequence of the last change to this key that must be durable before it
    /// is revealed.
    visible_seq: u64,
    /// The key's tool calls; boxed and optional so keys without calls stay small.
    ledger: Option<Box<Ledger>>,
    /// Whether `prunes` holds an entry for this key (at most one does).
    prune_scheduled: bool,
    /// The deadline under which this key sits in `Lessor::deadlines`, if
    /// it does (at most one entry per key).
    deadline_entry: Option<Millis>,
}

impl<W> KeyState<W> {
    fn new() -> Self {
        KeyState {
            live: None,
            last_ended: None,
            waiters: VecDeque::new(),
            visible_seq: 0,
            ledger: None,
            prune_scheduled: false,
            deadline_entry: None,
        }
    }

    fn unsettled_tool_calls(&self) -> usize {
        self.ledger.as_ref().map_or(0, |l| l.unsettled())
    }

    /// Why `fence` is not this key's live term.
    fn stale_reason(&self, fence: Fence) -> StaleReason {
        // A newer live term decides first: the last ended term may be
        // `fence` itself, but a retry is told the truth, that it was
        // superseded, not how it ended.
        if let Some(live) = &self.live {
            if fence < live.fence {
                return StaleReason::Superseded { by: live.fence.0 };
            }
        }
        if let Some(ended) = &self.last_ended {
            if ended.fence == fence {
                return match ended.end {
                    TermEnd::Expired => StaleReason::Expired { at: ended.ended_at },
                    TermEnd::Released => StaleReason::Released { at: ended.ended_at },
                    TermEnd::Suspended => StaleReason::Suspended { at: ended.ended_at },
                };
            }
        }
        let latest = self
            .live
            .as_ref()
            .map(|t| t.fence)
            .or(self.last_ended.as_ref().map(|e| e.fence));
        match latest {
            Some(latest) if fence < latest => StaleReason::Superseded { by: latest.0 },
            _ => StaleReason::Unknown,
        }
    }

    /// The reader's view at `now`: an expired but not yet ended term shows as
    /// ended, so readers never see a dead term as live.
    fn view(&self, key: &str, now: Millis) -> KeyView {
        let (live, last_ended) = match &self.live {
            Some(term) if !term.is_live_at(now) => (None, Some(expired(term))),
            live => (live.clone(), self.last_ended.clone()),
        };
        let recoverable =
            live.is_none() && last_ended.as_ref().is_some_and(|e| e.end.is_recoverable());
        KeyView {
            key: key.to_owned(),
            live,
            last_ended,
            recoverable,
            visible_seq: self.visible_seq,
        }
    }
}

/// The ended record of a term whose TTL ran out.
fn expired(term: &Term) -> EndedTerm {
    EndedTerm {
        fence: term.fence,
        owner: term.owner.clone(),
        lease_id: term.lease_id,
        end: TermEnd::Expired,
        ended_at: term.expires_at,
    }
}

/// The in-memory lease table and its rules. `W` is how a waiting Acquire is
/// woken; the lessor only stores it and hands it back with the grant.
#[derive(Debug)]
pub struct Lessor<W> {
    /// Every key ever granted, ordered for List.
    keys: BTreeMap<String, KeyState<W>>,
    /// The fence the next grant gets.
    next_fence: u64,
    /// Expiry deadlines, earliest first: at most one entry per key, at the
    /// deadline recorded in its `deadline_entry`. A renewal leaves the entry
    /// where it is (renewals are hot); [`Lessor::expire_due`] re-files an
    /// entry it pops early. A grant moves the key's entry only when the new
    /// deadline is earlier, so a key handed over again and again still has
    /// one entry, and the timer's work does not grow with its history.
    deadlines: BTreeSet<(Millis, String)>,
    /// Keys changed since the last batch by a change that must be durable
    /// before a reply (grants, releases, longer TTLs).
    dirty: HashSet<String>,
    /// Keys changed since the last batch by changes that need not be durable
    /// before any reply (expiries, renewals keeping the TTL). Kept apart so a
    /// mass expiry can be written in chunks without holding up urgent changes;
    /// in key order, so a chunk touches few table pages.
    lazy_dirty: BTreeSet<String>,
    /// Whether some change in `dirty` must be durable before a reply.
    urgent: bool,
    /// The last sequence number given to a change that must be durable.
    seq: u64,
    /// Grants made to queued waiters, for the caller to deliver.
    handoffs: Vec<(W, Grant)>,
    /// The id the next queued Acquire gets.
    next_waiter_id: WaiterId,
    /// Set when a grant's deadline became the earliest, so the timer re-arms.
    earliest_deadline_changed: bool,
    /// The registration counter of tool calls, server-wide.
    next_ordinal: u64,
    /// Tool calls changed since the last batch: (key, call id).
    dirty_calls: HashSet<(String, String)>,
    /// Tool calls pruned since the last batch.
    pruned_calls: Vec<(String, Vec<String>)>,
    /// Keys forgotten since the last batch.
    forgotten: Vec<String>,
    /// When to look at cleanly released keys again, to prune their settled
    /// calls and forget them, earliest first; at most one entry per key.
    prunes: BinaryHeap<Reverse<(Millis, String)>>,
    /// How long a cleanly released key (its last term and its settled tool
    /// calls) is remembered.
    retention_ms: u64,
}

/// How long a cleanly released key, with its settled tool calls, is
/// remembered by default (24 h).
pub const DEFAULT_RETENTION_MS: u64 = 24 * 60 * 60 * 1000;

impl<W: WaiterHandle> Lessor<W> {
    /// Rebuilds the live state from storage at start-up.
    ///
    /// Terms that had not ended get at least their full TTL again from `now`
    /// (invariant 4: keep a lease longer, never shorter). The next fence is
    /// above both the stored high-water mark and every stored fence.
    pub fn restore(
        records: Vec<KeyRecord>,
        calls: Vec<(String, ToolCall)>,
        fence_high_water: u64,
        now: Millis,
        retention_ms: u64,
    ) -> Self {
        let mut lessor = Lessor {
            keys: BTreeMap::new(),
            next_fence: fence_high_water + 1,
            deadlines: BTreeSet::new(),
            dirty: HashSet::new(),
            lazy_dirty: BTreeSet::new(),
            urgent: false,
            seq: 0,
            handoffs: Vec::new(),
            next_waiter_id: 1,
            earliest_deadline_changed: true,
            next_ordinal: 1,
            dirty_calls: HashSet::new(),
            pruned_calls: Vec::new(),
            forgotten: Vec::new(),
            prunes: BinaryHeap::new(),
            retention_ms,
        };
        for record in records {
            let mut state = KeyState::new();
            if let Some(mut term) = record.live {
                term.expires_at = term.expires_at.max(now + term.ttl_ms);
                lessor.next_fence = lessor.next_fence.max(term.fence.0 + 1);
                lessor
                    .deadlines
                    .insert((term.expires_at, record.key.clone()));
                state.deadline_entry = Some(term.expires_at);
                state.live = Some(term);
            }
            if let Some(ended) = &record.last_ended {
                lessor.next_fence = lessor.next_fence.max(ended.fence.0 + 1);
                if ended.end == TermEnd::Released && state.live.is_none() {
                    let at = ended.ended_at.saturating_add(retention_ms);
                    lessor.prunes.push(Reverse((at, record.key.clone())));
                    state.prune_scheduled = true;
                }
            }
            state.last_ended = record.last_ended;
            lessor.keys.insert(record.key, state);
        }
        let mut by_key: BTreeMap<String, Vec<ToolCall>> = BTreeMap::new();
        for (key, call) in calls {
            lessor.next_ordinal = lessor.next_ordinal.max(call.ordinal + 1);
            by_key.entry(key).or_default().push(call);
        }
        for (key, calls) in by_key {
            let state = lessor.keys.entry(key).or_insert_with(KeyState::new);
            state.ledger = Some(Box::new(Ledger::from_calls(calls)));
        }
        lessor
    }

    /// An empty lessor whose first fence is 1.
    pub fn new() -> Self {
        Self::restore(Vec::new(), Vec::new(), 0, 0, DEFAULT_RETENTION_MS)
    }

    /// Grants `spec.key` if it is free; otherwise queues `waiter` or reports busy.
    ///
    /// A request whose owner and request id match the live term gets that term
    /// back (a retry after a lost reply), not a conflict.
    pub fn acquire(&mut self, spec: AcquireSpec, now: Millis, waiter: Option<W>) -> AcquireOutcome {
        self.settle(&spec.key, now);
        if let Some(state) = self.keys.get_mut(&spec.key) {
            if let Some(term) = &state.live {
                if spec.request_id.is_some()
                    && term.request_id == spec.request_id
                    && term.owner == spec.owner
                {
                    return AcquireOutcome::Granted(Grant {
                        key: spec.key,
                        term: term.clone(),
                        previous: state.last_ended.clone(),
                        replayed: true,
                        unsettled_tool_calls: state.unsettled_tool_calls(),
                        visible_seq: state.visible_seq,
                    });
                }
                return match waiter {
                    Some(handle) => {
                        let id = self.next_waiter_id;
                        self.next_waiter_id += 1;
                        state.waiters.push_back(Queued { id, spec, handle });
                        AcquireOutcome::Queued(id)
                    }
                    None => AcquireOutcome::Busy(Error::Busy {
                        holder: term.owner.clone(),
                        fence: term.fence.0,
                        remaining_ms: term.expires_at.saturating_sub(now),
                        key: spec.key,
                    }),
                };
            }
        }
        AcquireOutcome::Granted(self.grant(spec, now))
    }

    /// Removes a queued Acquire whose wait ran out. Returns false when it is no
    /// longer queued (it was granted meanwhile; the grant is in its handoff).
    pub fn cancel_waiter(&mut self, key: &str, id: WaiterId) -> bool {
        let Some(state) = self.keys.get_mut(key) else {
            return false;
        };
        let before = state.waiters.len();
        state.waiters.retain(|q| q.id != id);
        state.waiters.len() != before
    }

    /// Extends the live term `fence` of `key` to `now + ttl` (never shortening it).
    ///
    /// `ttl_ms = None` keeps the term's TTL. Returns the term and the sequence
    /// the reply must wait for: a longer TTL is made durable before the reply,
    /// because a restart restores terms with their stored TTL.
    ///
    /// # Errors
    /// [`Error::StaleFence`] when `fence` is not the live term;
    /// [`Error::PermissionDenied`] when `lease_id` does not match it.
    pub fn renew(
        &mut self,
        key: &str,
        fence: Fence,
        lease_id: LeaseId,
        ttl_ms: Option<u64>,
        now: Millis,
    ) -> Result<(Term, u64)> {
        self.settle(key, now);
        let state = holder(&mut self.keys, key, fence, lease_id)?;
        let term = state.live.as_mut().expect("holder has a live term");
        let ttl_ms = ttl_ms.unwrap_or(term.ttl_ms);
        let longer_ttl = ttl_ms > term.ttl_ms;
        term.ttl_ms = ttl_ms;
        term.expires_at = term.expires_at.max(now + ttl_ms);
        let term = term.clone();
        if longer_ttl {
            self.seq += 1;
            state.visible_seq = self.seq;
            self.urgent = true;
        }
        let visible_seq = state.visible_seq;
        mark_dirty(&mut self.dirty, &mut self.lazy_dirty, key, longer_ttl);
        Ok((term, visible_seq))
    }

    /// Ends the live term `fence` of `key`, as released or (with `suspend`) as
    /// unfinished, and hands the key to the first waiter.
    ///
    /// Releasing a term this same fence already released or suspended succeeds
    /// again and returns the term as it first ended, so retries are safe.
    ///
    /// # Errors
    /// [`Error::StaleFence`] when `fence` is not the live term (and was not
    /// released by that fence); [`Error::PermissionDenied`] when `lease_id`
    /// does not match it.
    pub fn release(
        &mut self,
        key: &str,
        fence: Fence,
        lease_id: LeaseId,
        suspend: bool,
        now: Millis,
    ) -> Result<(EndedTerm, u64)> {
        self.settle(key, now);
        let state = self.keys.get_mut(key).ok_or_else(|| unknown(key, fence))?;
        let denied = || Error::PermissionDenied {
            key: key.to_owned(),
            fence: fence.0,
        };
        match (&state.live, &state.last_ended) {
            (Some(term), _) if term.fence == fence => {
                if term.lease_id != lease_id {
                    return Err(denied());
                }
            }
            // A retry of this fence's own release, while no newer term
            // holds the key; once one does, the retry is told it was
            // superseded (below), never a bare OK.
            (None, Some(ended)) if ended.fence == fence && ended.end != TermEnd::Expired => {
                if ended.lease_id != lease_id {
                    return Err(denied());
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
        if end == TermEnd::Released {
            self.schedule_prune(key, now.saturating_add(self.retention_ms));
        }
        self.settle(key, now);
        let visible_seq = self.keys[key].visible_seq;
        Ok((ended, visible_seq))
    }

    /// The live term of `key` if it has fence `fence`.
    ///
    /// # Errors
    /// [`Error::StaleFence`] when `fence` is not the key's live term.
    pub fn check(&mut self, key: &str, fence: Fence, now: Millis) -> Result<(Term, u64)> {
        self.settle(key, now);
        let state = self.keys.get(key).ok_or_else(|| unknown(key, fence))?;
        match &state.live {
            Some(term) if term.fence == fence => Ok((term.clone(), state.visible_seq)),
            _ => Err(stale(key, fence, state.stale_reason(fence))),
        }
    }

    /// Records tool calls as running under the live term `fence`, all or none.
    ///
    /// # Errors
    /// [`Error::StaleFence`] when `fence` is not the live term;
    /// [`Error::PermissionDenied`] when `lease_id` does not match it.
    pub fn begin_tool_calls(
        &mut self,
        key: &str,
        fence: Fence,
        lease_id: LeaseId,
        specs: Vec<CallSpec>,
        now: Millis,
    ) -> Result<(BeginOutcome, u64)> {
        let mut ordinal = self.next_ordinal;
        self.settle(key, now);
        let state = holder(&mut self.keys, key, fence, lease_id)?;
        let outcome =
            state
                .ledger
                .get_or_insert_with(Box::default)
                .begin(specs, fence, now, &mut ordinal);
        let mut changed = Vec::new();
        if let BeginOutcome::Recorded(calls) = &outcome {
            changed.extend(calls.iter().map(|c| c.call_id.clone()));
        }
        let visible_seq = if changed.is_empty() {
            state.visible_seq
        } else {
            self.seq += 1;
            state.visible_seq = self.seq;
            self.seq
        };
        for call_id in changed {
            self.dirty_calls.insert((key.to_owned(), call_id));
            self.urgent = true;
        }
        self.next_ordinal = ordinal;
        Ok((outcome, visible_seq))
    }

    /// Records a tool call's outcome under the live term `fence`; the first
    /// terminal outcome wins. Returns the winning record and whether an
    /// earlier settle had won.
    ///
    /// # Errors
    /// [`Error::StaleFence`], [`Error::PermissionDenied`], or
    /// [`Error::NotFound`] when the key's ledger has no such call.
    pub fn settle_tool_call(
        &mut self,
        key: &str,
        fence: Fence,
        lease_id: LeaseId,
        settlement: Settlement,
        now: Millis,
    ) -> Result<(ToolCall, bool, u64)> {
        let call_id = settlement.call_id.clone();
        self.settle(key, now);
        let state = holder(&mut self.keys, key, fence, lease_id)?;
        let (call, already) = state
            .ledger
            .get_or_insert_with(Box::default)
            .settle(key, settlement, fence, now)?;
        if already {
            return Ok((call, true, state.visible_seq));
        }
        self.seq += 1;
        state.visible_seq = self.seq;
        let visible_seq = self.seq;
        self.dirty_calls.insert((key.to_owned(), call_id));
        self.urgent = true;
        Ok((call, false, visible_seq))
    }

    /// The tool calls of `key` in registration order.
    ///
    /// # Errors
    /// [`Error::NotFound`] when the key was never acquired.
    pub fn list_tool_calls(
        &mut self,
        key: &str,
        filter: CallFilter,
        now: Millis,
    ) -> Result<(Vec<ToolCall>, u64)> {
        self.settle(key, now);
        let state = self
            .keys
            .get(key)
            .ok_or_else(|| Error::NotFound(key.to_owned()))?;
        let calls = state
            .ledger
            .as_ref()
            .map_or_else(Vec::new, |l| l.list(filter));
        Ok((calls, state.visible_seq))
    }

    /// The reader's view of `key`.
    ///
    /// # Errors
    /// [`Error::NotFound`] when the key was never acquired.
    pub fn get(&mut self, key: &str, now: Millis) -> Result<KeyView> {
        self.settle(key, now);
        self.keys
            .get(key)
            .map(|state| state.view(key, now))
            .ok_or_else(|| Error::NotFound(key.to_owned()))
    }

    /// Up to `limit` keys starting with `prefix`, in key order, after `after`.
    ///
    /// Scans at most `scan_budget` keys so one call never holds the table for
    /// long; returns the key to continue after when there may be more, and
    /// the highest `visible_seq` of every key it looked at: a key the filter
    /// left out may be left out because of a change not yet durable (a grant
    /// hides a recoverable key), so the page may only be sent once that
    /// change is.
    pub fn list(
        &self,
        prefix: &str,
        filter: ListFilter,
        after: Option<&str>,
        limit: usize,
        scan_budget: usize,
        now: Millis,
    ) -> ListPage {
        use std::ops::Bound;
        let start = match after {
            Some(after) if after >= prefix => Bound::Excluded(after.to_owned()),
            _ => Bound::Included(prefix.to_owned()),
        };
        let mut page = ListPage::default();
        let mut last = None;
        for (scanned, (key, state)) in self.keys.range((start, Bound::Unbounded)).enumerate() {
            if !key.starts_with(prefix) {
                return page;
            }
            if page.keys.len() == limit || scanned == scan_budget {
                page.next_after = last;
                return page;
            }
            last = Some(key.clone());
            page.visible_seq = page.visible_seq.max(state.visible_seq);
            let view = state.view(key, now);
            let wanted = match filter {
                ListFilter::Live => view.live.is_some(),
                ListFilter::Recoverable => view.recoverable,
                ListFilter::All => true,
            };
            if wanted {
                page.keys.push(view);
            }
        }
        page
    }

    /// The sequence that must be durable before anything about `key` may be
    /// revealed, refusals included (0 for a key the table does not hold).
    pub fn visible_seq(&self, key: &str) -> u64 {
        self.keys.get(key).map_or(0, |s| s.visible_seq)
    }

    /// How many Acquires wait in line, over all keys.
    pub fn waiter_count(&self) -> usize {
        self.keys.values().map(|s| s.waiters.len()).sum()
    }

    /// How many entries the expiry timer holds (at most one per key).
    pub fn deadline_entries(&self) -> usize {
        self.deadlines.len()
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
        let mut looked = 0;
        while let Some((deadline, _)) = self.deadlines.first() {
            if *deadline > now {
                break;
            }
            if looked == budget {
                return true;
            }
            looked += 1;
            let (_, key) = self.deadlines.pop_first().expect("peeked");
            let Some(state) = self.keys.get_mut(&key) else {
                continue;
            };
            state.deadline_entry = None;
            match state.live.as_ref().map(|t| t.expires_at) {
                Some(at) if at > now => {
                    // Renewed since the entry was filed: file it again.
                    state.deadline_entry = Some(at);
                    self.deadlines.insert((at, key));
                }
                Some(_) => self.settle(&key, now),
                None => {}
            }
        }
        false
    }

    /// Makes sure `key` is looked at again no later than `at`, to prune its
    /// settled calls and forget it if it is still released then.
    fn schedule_prune(&mut self, key: &str, at: Millis) {
        let Some(state) = self.keys.get_mut(key) else {
            return;
        };
        // An earlier entry is still pending: when it comes due it finds the
        // key not yet due and re-schedules it for the right time.
        if std::mem::replace(&mut state.prune_scheduled, true) {
            return;
        }
        if self.next_deadline().is_none_or(|next| at < next) {
            self.earliest_deadline_changed = true;
        }
        self.prunes.push(Reverse((at, key.to_owned())));
    }

    /// For keys released cleanly at least the retention time ago (and not
    /// acquired since): drops their settled tool calls, then forgets the key
    /// itself unless calls are still running or someone waits for it.
    ///
    /// Forgetting keeps the table from growing with every key ever used (a
    /// session id is used for a while, then never again). It is safe: the
    /// fence high-water mark is kept apart from the keys, so a forgotten key
    /// acquired again still gets a fence above every earlier one, and a
    /// fence presented for it is refused as unknown. Keys that expired or
    /// were suspended are never forgotten: they are recoverable, and stay
    /// until someone takes them over.
    fn prune_due(&mut self, now: Millis) {
        while let Some(Reverse((at, _))) = self.prunes.peek() {
            if *at > now {
                break;
            }
            let Reverse((_, key)) = self.prunes.pop().expect("peeked");
            let retention = self.retention_ms;
            let Some(state) = self.keys.get_mut(&key) else {
                continue;
            };
            state.prune_scheduled = false;
            let released_at = match (&state.live, &state.last_ended) {
                (None, Some(ended)) if ended.end == TermEnd::Released => ended.ended_at,
                // Taken again (or suspended, or expired) since: its next
                // clean release schedules it anew.
                _ => continue,
            };
            let due = released_at.saturating_add(retention);
            if due > now {
                // Released again since this entry was pushed.
                state.prune_scheduled = true;
                self.prunes.push(Reverse((due, key)));
                continue;
            }
            if let Some(ledger) = state.ledger.as_mut() {
                let pruned = ledger.prune_settled();
                if ledger.is_empty() {
                    state.ledger = None;
                }
                if !pruned.is_empty() {
                    self.pruned_calls.push((key.clone(), pruned));
                }
            }
            if state.ledger.is_none() && state.waiters.is_empty() {
                self.forget(key);
            }
        }
    }

    /// Removes `key` from the table; the next batch deletes its row.
    fn forget(&mut self, key: String) {
        if let Some(at) = self.keys.remove(&key).and_then(|s| s.deadline_entry) {
            self.deadlines.remove(&(at, key.clone()));
        }
        self.dirty.remove(&key);
        self.lazy_dirty.remove(&key);
        if !self.dirty_calls.is_empty() {
            self.dirty_calls.retain(|(k, _)| *k != key);
        }
        self.forgotten.push(key);
    }

    /// The earliest deadline the expiry timer must wake for.
    pub fn next_deadline(&self) -> Option<Millis> {
        let expiry = self.deadlines.first().map(|(at, _)| *at);
        let prune = self.prunes.peek().map(|Reverse((at, _))| *at);
        match (expiry, prune) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether a grant moved the earliest deadline since the last call, so a
    /// sleeping timer must re-arm.
    pub fn take_deadline_changed(&mut self) -> bool {
        std::mem::take(&mut self.earliest_deadline_changed)
    }

    /// Grants made to queued waiters since the last call, to deliver.
    pub fn take_handoffs(&mut self) -> Vec<(W, Grant)> {
        std::mem::take(&mut self.handoffs)
    }

    /// Whether a change waits to be made durable before some reply.
    pub fn has_urgent(&self) -> bool {
        self.urgent
    }

    /// Whether any change (urgent or not) is not yet handed to storage.
    pub fn has_dirty(&self) -> bool {
        !self.dirty.is_empty()
            || !self.lazy_dirty.is_empty()
            || !self.dirty_calls.is_empty()
            || !self.pruned_calls.is_empty()
            || !self.forgotten.is_empty()
    }

    /// Whether lazy changes are left over from a batch that took only some.
    pub fn has_lazy_backlog(&self) -> bool {
        !self.lazy_dirty.is_empty()
    }

    /// Takes every change since the last batch, for storage to commit at once.
    pub fn take_batch(&mut self) -> Batch {
        self.take_batch_up_to(usize::MAX)
    }

    /// Takes every change that must be durable before a reply, and at most
    /// `lazy_limit` keys changed lazily (the rest stay for the next batch).
    /// Committing the batch still makes every change up to its `seq` durable.
    pub fn take_batch_up_to(&mut self, lazy_limit: usize) -> Batch {
        let mut keys: Vec<String> = self.dirty.drain().collect();
        if self.lazy_dirty.len() <= lazy_limit {
            keys.extend(std::mem::take(&mut self.lazy_dirty));
        } else {
            keys.extend(std::iter::from_fn(|| self.lazy_dirty.pop_first()).take(lazy_limit));
        }
        // Rows written in key order share B-tree pages.
        keys.sort_unstable();
        let records = keys
            .into_iter()
            .filter_map(|key| {
                let state = self.keys.get(&key)?;
                Some(KeyRecord {
                    live: state.live.clone(),
                    last_ended: state.last_ended.clone(),
                    key,
                })
            })
            .collect();
        let calls = self
            .dirty_calls
            .drain()
            .filter_map(|(key, call_id)| {
                let call = self.keys.get(&key)?.ledger.as_ref()?.get(&call_id)?.clone();
                Some((key, call))
            })
            .collect();
        self.urgent = false;
        Batch {
            records,
            forgotten: std::mem::take(&mut self.forgotten),
            pruned_calls: std::mem::take(&mut self.pruned_calls),
            calls,
            fence_high_water: self.next_fence - 1,
            seq: self.seq,
        }
    }

    /// The number of keys the lessor tracks.
    pub fn key_count(&self) -> usize {
        self.keys.len()
    }

    /// Ends an expired term of `key`, then, if the key is free, grants it to
    /// the first waiter still waiting.
    fn settle(&mut self, key: &str, now: Millis) {
        let Some(state) = self.keys.get_mut(key) else {
            return;
        };
        if state.live.as_ref().is_some_and(|t| !t.is_live_at(now)) {
            let at = state.live.as_ref().map_or(now, |t| t.expires_at);
            self.end_term(key, TermEnd::Expired, at);
        }
        loop {
            let state = self.keys.get_mut(key).expect("checked above");
            if state.live.is_some() {
                return;
            }
            let Some(queued) = state.waiters.pop_front() else {
                return;
            };
            if queued.handle.is_waiting() {
                let grant = self.grant(queued.spec, now);
                if grant.term.request_id.is_some() {
                    self.handoffs.push((queued.handle, grant.clone()));
                    self.hand_replays(key, &grant);
                } else {
                    self.handoffs.push((queued.handle, grant));
                }
            }
        }
    }

    /// Hands `grant` as a replay to retries of the same request (same owner
    /// and request id) still waiting further back in the key's line, so a
    /// retry sent while the original still waited gets the term at once
    /// instead of waiting out its own wait behind it.
    fn hand_replays(&mut self, key: &str, grant: &Grant) {
        if grant.term.request_id.is_none() {
            return;
        }
        let Some(state) = self.keys.get_mut(key) else {
            return;
        };
        let (retries, others): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut state.waiters)
            .into_iter()
            .partition(|q: &Queued<W>| {
                q.spec.owner == grant.term.owner && q.spec.request_id == grant.term.request_id
            });
        state.waiters = others;
        for retry in retries {
            let replay = Grant {
                replayed: true,
                ..grant.clone()
            };
            self.handoffs.push((retry.handle, replay));
        }
    }

    /// Starts a new term on a free key.
    fn grant(&mut self, spec: AcquireSpec, now: Millis) -> Grant {
        let fence = Fence(self.next_fence);
        self.next_fence += 1;
        self.seq += 1;
        let term = Term {
            fence,
            owner: spec.owner,
            lease_id: LeaseId::random(),
            request_id: spec.request_id,
            ttl_ms: spec.ttl_ms,
            acquired_at: now,
            expires_at: now + spec.ttl_ms,
        };
        if self.next_deadline().is_none_or(|at| term.expires_at < at) {
            self.earliest_deadline_changed = true;
        }
        let state = self
            .keys
            .entry(spec.key.clone())
            .or_insert_with(KeyState::new);
        // One entry per key: keep an entry at or before the new deadline
        // (the timer re-files it when it comes due early); move a later one.
        match state.deadline_entry {
            Some(at) if at <= term.expires_at => {}
            entry => {
                if let Some(at) = entry {
                    self.deadlines.remove(&(at, spec.key.clone()));
                }
                self.deadlines.insert((term.expires_at, spec.key.clone()));
                state.deadline_entry = Some(term.expires_at);
            }
        }
        state.live = Some(term.clone());
        state.visible_seq = self.seq;
        mark_dirty(&mut self.dirty, &mut self.lazy_dirty, &spec.key, true);
        self.urgent = true;
        Grant {
            key: spec.key,
            term,
            previous: state.last_ended.clone(),
            replayed: false,
            unsettled_tool_calls: state.unsettled_tool_calls(),
            visible_seq: self.seq,
        }
    }

    /// Moves the live term of `key` to its ended record.
    ///
    /// A release must be durable before its reply; an expiry need not be, since
    /// a restart that forgets it only keeps the term longer.
    fn end_term(&mut self, key: &str, end: TermEnd, at: Millis) -> Option<EndedTerm> {
        let state = self.keys.get_mut(key)?;
        let term = state.live.take()?;
        let ended = EndedTerm {
            fence: term.fence,
            owner: term.owner,
            lease_id: term.lease_id,
            end,
            ended_at: at,
        };
        state.last_ended = Some(ended.clone());
        let urgent = end != TermEnd::Expired;
        if urgent {
            self.seq += 1;
            state.visible_seq = self.seq;
            self.urgent = true;
        }
        mark_dirty(&mut self.dirty, &mut self.lazy_dirty, key, urgent);
        Some(ended)
    }
}

impl<W: WaiterHandle> Default for Lessor<W> {
    fn default() -> Self {
        Self::new()
    }
}

/// Records that `key` changed: among the urgent keys when the change must be
/// durable before a reply, otherwise among the lazy ones (unless it is
/// already urgent, which writes its whole row anyway).
fn mark_dirty(
    dirty: &mut HashSet<String>,
    lazy_dirty: &mut BTreeSet<String>,
    key: &str,
    urgent: bool,
) {
    if urgent {
        lazy_dirty.remove(key);
        dirty.insert(key.to_owned());
    } else if !dirty.contains(key) {
        lazy_dirty.insert(key.to_owned());
    }
}

/// The state of `key` if `fence` is its live term and `lease_id` its secret.
/// Call after [`Lessor::settle`], so an expired term is not taken for live.
fn holder<'a, W>(
    keys: &'a mut BTreeMap<String, KeyState<W>>,
    key: &str,
    fence: Fence,
    lease_id: LeaseId,
) -> Result<&'a mut KeyState<W>> {
    let state = keys.get_mut(key).ok_or_else(|| unknown(key, fence))?;
    match &state.live {
        Some(term) if term.fence == fence => {
            if term.lease_id != lease_id {
                return Err(Error::PermissionDenied {
                    key: key.to_owned(),
                    fence: fence.0,
                });
            }
            Ok(state)
        }
        _ => Err(stale(key, fence, state.stale_reason(fence))),
    }
}

fn stale(key: &str, fence: Fence, reason: StaleReason) -> Error {
    Error::StaleFence {
        key: key.to_owned(),
        fence: fence.0,
        reason,
    }
}

fn unknown(key: &str, fence: Fence) -> Error {
    stale(key, fence, StaleReason::Unknown)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A waiter that is always waiting, tagged for assertions.
    #[derive(Debug, PartialEq)]
    struct Tag(&'static str);
    impl WaiterHandle for Tag {
        fn is_waiting(&self) -> bool {
            true
        }
    }

    fn spec(key: &str, owner: &str) -> AcquireSpec {
        AcquireSpec {
            key: key.into(),
            owner: owner.into(),
            ttl_ms: 1000,
            request_id: None,
        }
    }

    fn granted(outcome: AcquireOutcome) -> Grant {
        match outcome {
            AcquireOutcome::Granted(grant) => grant,
            other => panic!("expected a grant, got {other:?}"),
        }
    }

    #[test]
    fn fences_rise_across_keys() {
        let mut lessor = Lessor::<Tag>::new();
        let a = granted(lessor.acquire(spec("a", "o"), 0, None));
        let b = granted(lessor.acquire(spec("b", "o"), 0, None));
        assert!(b.term.fence > a.term.fence);
    }

    #[test]
    fn a_held_key_is_busy_until_it_expires() {
        let mut lessor = Lessor::<Tag>::new();
        let first = granted(lessor.acquire(spec("k", "a"), 0, None));
        assert!(matches!(
            lessor.acquire(spec("k", "b"), 999, None),
            AcquireOutcome::Busy(Error::Busy {
                remaining_ms: 1,
                ..
            })
        ));
        let second = granted(lessor.acquire(spec("k", "b"), 1000, None));
        assert!(second.term.fence > first.term.fence);
        let previous = second.previous.expect("previous term");
        assert_eq!(previous.end, TermEnd::Expired);
        assert_eq!(previous.ended_at, 1000);
    }

    #[test]
    fn waiters_are_served_in_arrival_order() {
        let mut lessor = Lessor::<Tag>::new();
        let held = granted(lessor.acquire(spec("k", "a"), 0, None));
        assert!(matches!(
            lessor.acquire(spec("k", "b"), 1, Some(Tag("b"))),
            AcquireOutcome::Queued(_)
        ));
        assert!(matches!(
            lessor.acquire(spec("k", "c"), 2, Some(Tag("c"))),
            AcquireOutcome::Queued(_)
        ));
        lessor
            .release("k", held.term.fence, held.term.lease_id, false, 3)
            .unwrap();
        let handoffs = lessor.take_handoffs();
        assert_eq!(handoffs.len(), 1);
        assert_eq!(handoffs[0].0, Tag("b"));
        // A newcomer arriving now queues behind c.
        assert!(matches!(
            lessor.acquire(spec("k", "d"), 4, None),
            AcquireOutcome::Busy(_)
        ));
        lessor.expire_due(2000);
        let handoffs = lessor.take_handoffs();
        assert_eq!(handoffs[0].0, Tag("c"));
    }

    #[test]
    fn renew_never_shortens_a_term() {
        let mut lessor = Lessor::<Tag>::new();
        let g = granted(lessor.acquire(spec("k", "a"), 0, None));
        let (term, _) = lessor
            .renew("k", g.term.fence, g.term.lease_id, Some(100), 10)
            .unwrap();
        assert_eq!(term.expires_at, 1000);
        assert_eq!(term.ttl_ms, 100);
    }

    #[test]
    fn urgent_changes_never_wait_behind_a_lazy_backlog() {
        let mut lessor = Lessor::<Tag>::new();
        for i in 0..5 {
            granted(lessor.acquire(spec(&format!("e{i}"), "a"), 0, None));
        }
        lessor.take_batch();
        // Five expiries (lazy), then a grant (urgent).
        assert!(lessor.expire_due_up_to(1000, 3));
        assert!(!lessor.expire_due_up_to(1000, 3));
        let g = granted(lessor.acquire(spec("k", "b"), 1000, None));
        let batch = lessor.take_batch_up_to(2);
        assert_eq!(batch.records.len(), 3);
        assert!(batch.records.iter().any(|r| r.key == "k"));
        assert_eq!(batch.seq, g.visible_seq);
        assert!(lessor.has_lazy_backlog());
        assert_eq!(lessor.take_batch_up_to(2).records.len(), 2);
        assert_eq!(lessor.take_batch_up_to(2).records.len(), 1);
        assert!(!lessor.has_dirty());
    }

    #[test]
    fn restore_gives_unended_terms_their_full_ttl_again() {
        let mut lessor = Lessor::<Tag>::new();
        let g = granted(lessor.acquire(spec("k", "a"), 0, None));
        let batch = lessor.take_batch();
        let restored = Lessor::<Tag>::restore(
            batch.records,
            batch.calls,
            batch.fence_high_water,
            5000,
            DEFAULT_RETENTION_MS,
        );
        let mut restored = restored;
        let (term, _) = restored.check("k", g.term.fence, 5999).unwrap();
        assert_eq!(term.expires_at, 6000);
        let next = granted(restored.acquire(spec("other", "a"), 5999, None));
        assert!(next.term.fence > g.term.fence);
    }

    /// A lessor with a 100 ms retention, so tests can step past it.
    fn short_retention() -> Lessor<Tag> {
        Lessor::restore(Vec::new(), Vec::new(), 0, 0, 100)
    }

    #[test]
    fn a_cleanly_released_key_is_forgotten_after_the_retention() {
        let mut lessor = short_retention();
        let g = granted(lessor.acquire(spec("done", "a"), 0, None));
        let s = granted(lessor.acquire(spec("paused", "a"), 0, None));
        lessor
            .release("done", g.term.fence, g.term.lease_id, false, 10)
            .unwrap();
        lessor
            .release("paused", s.term.fence, s.term.lease_id, true, 10)
            .unwrap();
        lessor.take_batch();

        lessor.expire_due(109);
        assert_eq!(lessor.key_count(), 2, "kept until the retention ends");
        assert_eq!(lessor.next_deadline(), Some(110));
        lessor.expire_due(110);
        assert_eq!(lessor.key_count(), 1, "the suspended key stays");
        assert!(lessor.has_dirty());
        let batch = lessor.take_batch();
        assert_eq!(batch.forgotten, vec!["done".to_string()]);
        assert!(batch.records.is_empty());
        assert!(matches!(lessor.get("done", 110), Err(Error::NotFound(_))));
        assert!(matches!(
            lessor.check("done", g.term.fence, 110),
            Err(Error::StaleFence {
                reason: StaleReason::Unknown,
                ..
            })
        ));
        // Fences still rise for the forgotten key, in memory and after a restart.
        let again = granted(lessor.acquire(spec("done", "b"), 111, None));
        assert!(again.term.fence > s.term.fence);
        assert!(again.previous.is_none());
        let restored =
            Lessor::<Tag>::restore(Vec::new(), Vec::new(), batch.fence_high_water, 0, 100);
        let mut restored = restored;
        let after = granted(restored.acquire(spec("x", "c"), 0, None));
        assert!(after.term.fence > s.term.fence);
    }

    #[test]
    fn a_key_taken_again_or_released_again_is_not_forgotten_early() {
        let mut lessor = short_retention();
        let g = granted(lessor.acquire(spec("k", "a"), 0, None));
        lessor
            .release("k", g.term.fence, g.term.lease_id, false, 10)
            .unwrap();
        // Taken again before the retention ends: kept while held.
        let h = granted(lessor.acquire(spec("k", "b"), 50, None));
        lessor.expire_due(200);
        assert_eq!(lessor.key_count(), 1);
        lessor
            .renew("k", h.term.fence, h.term.lease_id, Some(10_000), 200)
            .unwrap();
        lessor
            .release("k", h.term.fence, h.term.lease_id, false, 300)
            .unwrap();
        lessor.expire_due(399);
        assert_eq!(
            lessor.key_count(),
            1,
            "retention counts from the last release"
        );
        lessor.expire_due(400);
        assert_eq!(lessor.key_count(), 0);
        assert_eq!(lessor.prunes.len(), 0, "no entries left behind");
    }

    #[test]
    fn a_forgotten_key_created_again_in_the_same_batch_is_written_back() {
        let mut lessor = short_retention();
        let g = granted(lessor.acquire(spec("k", "a"), 0, None));
        lessor
            .release("k", g.term.fence, g.term.lease_id, false, 0)
            .unwrap();
        lessor.take_batch();
        lessor.expire_due(100);
        let again = granted(lessor.acquire(spec("k", "b"), 100, None));
        let batch = lessor.take_batch();
        // The store deletes first, then writes the new row.
        assert_eq!(batch.forgotten, vec!["k".to_string()]);
        assert_eq!(batch.records.len(), 1);
        assert_eq!(
            batch.records[0].live.as_ref().unwrap().fence,
            again.term.fence
        );
    }

    #[test]
    fn a_key_handed_over_again_and_again_keeps_one_timer_entry() {
        let mut lessor = Lessor::<Tag>::new();
        let mut held = granted(lessor.acquire(spec("hot", "a"), 0, None));
        for now in 0..10_000u64 {
            // A waiter queues; the holder renews, then releases: the key
            // goes to the waiter at once.
            assert!(matches!(
                lessor.acquire(spec("hot", "w"), now, Some(Tag("w"))),
                AcquireOutcome::Queued(_)
            ));
            lessor
                .renew("hot", held.term.fence, held.term.lease_id, None, now)
                .unwrap();
            lessor
                .release(
                    "hot",
                    held.term.fence,
                    held.term.lease_id,
                    now % 2 == 0,
                    now,
                )
                .unwrap();
            let mut handoffs = lessor.take_handoffs();
            assert_eq!(handoffs.len(), 1);
            held = handoffs.pop().unwrap().1;
        }
        assert_eq!(
            lessor.deadline_entries(),
            1,
            "one entry per key, whatever its history"
        );
        // The one entry still expires the live term, at its deadline.
        lessor.expire_due(held.term.expires_at);
        assert!(
            lessor
                .get("hot", held.term.expires_at)
                .unwrap()
                .live
                .is_none()
        );
        assert_eq!(lessor.deadline_entries(), 0);
    }

    #[test]
    fn a_renewed_term_expires_at_its_new_deadline_not_the_first() {
        let mut lessor = Lessor::<Tag>::new();
        let g = granted(lessor.acquire(spec("k", "a"), 0, None));
        lessor
            .renew("k", g.term.fence, g.term.lease_id, None, 900)
            .unwrap();
        lessor.expire_due(1000);
        assert!(lessor.check("k", g.term.fence, 1000).is_ok());
        assert_eq!(lessor.deadline_entries(), 1);
        lessor.expire_due(1900);
        assert!(lessor.check("k", g.term.fence, 1900).is_err());
        assert_eq!(lessor.deadline_entries(), 0);
    }

    #[test]
    fn a_short_term_after_a_long_one_expires_on_time() {
        let mut lessor = Lessor::<Tag>::new();
        let long = AcquireSpec {
            ttl_ms: 100_000,
            ..spec("k", "a")
        };
        let g = granted(lessor.acquire(long, 0, None));
        lessor
            .release("k", g.term.fence, g.term.lease_id, false, 1)
            .unwrap();
        let short = granted(lessor.acquire(spec("k", "b"), 1, None));
        assert_eq!(lessor.next_deadline(), Some(short.term.expires_at));
        lessor.expire_due(short.term.expires_at);
        assert!(
            lessor
                .get("k", short.term.expires_at)
                .unwrap()
                .live
                .is_none()
        );
    }

    #[test]
    fn a_retried_release_of_a_superseded_fence_is_refused_as_superseded() {
        let mut lessor = Lessor::<Tag>::new();
        let first = granted(lessor.acquire(spec("k", "a"), 0, None));
        lessor
            .release("k", first.term.fence, first.term.lease_id, false, 1)
            .unwrap();
        // The retry before anyone took the key: the same answer again.
        assert!(
            lessor
                .release("k", first.term.fence, first.term.lease_id, false, 2)
                .is_ok()
        );
        let second = granted(lessor.acquire(spec("k", "b"), 3, None));
        let superseded = StaleReason::Superseded {
            by: second.term.fence.0,
        };
        assert_eq!(
            lessor.release("k", first.term.fence, first.term.lease_id, false, 4),
            Err(stale("k", first.term.fence, superseded))
        );
        assert_eq!(
            lessor.check("k", first.term.fence, 4),
            Err(stale("k", first.term.fence, superseded))
        );
        // The newer holder is untouched.
        assert!(lessor.check("k", second.term.fence, 4).is_ok());
    }

    #[test]
    fn a_retry_waiting_behind_its_original_gets_the_replay_with_it() {
        let mut lessor = Lessor::<Tag>::new();
        let held = granted(lessor.acquire(spec("k", "a"), 0, None));
        let with_id = AcquireSpec {
            request_id: Some("r1".into()),
            ..spec("k", "b")
        };
        for tag in ["original", "retry"] {
            assert!(matches!(
                lessor.acquire(with_id.clone(), 1, Some(Tag(tag))),
                AcquireOutcome::Queued(_)
            ));
        }
        assert!(matches!(
            lessor.acquire(spec("k", "c"), 1, Some(Tag("c"))),
            AcquireOutcome::Queued(_)
        ));
        lessor
            .release("k", held.term.fence, held.term.lease_id, false, 2)
            .unwrap();
        let handoffs = lessor.take_handoffs();
        assert_eq!(handoffs.len(), 2);
        assert_eq!(handoffs[0].0, Tag("original"));
        assert!(!handoffs[0].1.replayed);
        assert_eq!(handoffs[1].0, Tag("retry"));
        assert!(handoffs[1].1.replayed);
        assert_eq!(handoffs[0].1.term, handoffs[1].1.term);
        assert_eq!(lessor.waiter_count(), 1, "c still waits");
    }

    #[test]
    fn list_reports_the_sequence_of_keys_its_filter_left_out() {
        let mut lessor = Lessor::<Tag>::new();
        let g = granted(lessor.acquire(spec("s:1", "a"), 0, None));
        lessor
            .release("s:1", g.term.fence, g.term.lease_id, true, 1)
            .unwrap();
        lessor.take_batch();
        let taken = granted(lessor.acquire(spec("s:1", "b"), 2, None));
        let page = lessor.list("s:", ListFilter::Recoverable, None, 10, 100, 2);
        assert!(page.keys.is_empty());
        assert_eq!(page.visible_seq, taken.visible_seq);
    }

    #[test]
    fn a_key_with_running_tool_calls_is_not_forgotten() {
        let mut lessor = short_retention();
        let g = granted(lessor.acquire(spec("k", "a"), 0, None));
        let calls = vec![CallSpec {
            call_id: "c1".into(),
            name: "tool".into(),
            input_digest: String::new(),
        }];
        lessor
            .begin_tool_calls("k", g.term.fence, g.term.lease_id, calls, 0)
            .unwrap();
        lessor
            .release("k", g.term.fence, g.term.lease_id, false, 0)
            .unwrap();
        lessor.expire_due(1_000);
        assert_eq!(lessor.key_count(), 1);
        assert!(lessor.take_batch().forgotten.is_empty());
    }
}
