//! The history checker: pure functions from a [`History`] to a [`Report`].
//!
//! # What a term is, seen from outside
//!
//! The checker never sees the server's clock or state, only what workers
//! sent and got back, with monotonic times. It therefore reasons about
//! each term (a key and a fence) through two instants it can bound:
//!
//! * **start**: the earliest completion of an acknowledged Acquire that
//!   returned the fence. The grant happened at or before that instant.
//! * **end**: the earliest of
//!   - the *life bound*: for every acknowledged Acquire of the term, the
//!     first send of its request id plus the TTL the reply names, and for
//!     every acknowledged Renew, its send time plus the TTL it names; the
//!     largest of these, less the clock slack. The server computed
//!     `expires_at` from its own "now" when it handled the request, and it
//!     handled it after the send, so the term cannot expire before this.
//!     A restart only lengthens it (every unended term gets a full TTL from
//!     start-up), and a stopped server's clock keeps running, which can
//!     only end a term *later* in real time than this bound;
//!   - the first send of a Release of the fence (acknowledged or not: once
//!     it left, the server may have applied it at any moment after).
//!
//! Between start and end the term **must be live** if the server keeps its
//! promises. This interval is deliberately the *smallest* one the
//! evidence supports: renewals whose outcome is unknown do not lengthen
//! it, an unacknowledged release shortens it, replayed grants count from
//! the first send of their request id. So every violation the checker
//! reports is a real one (given the clock slack), at the price of missing
//! some that a larger interval would catch. The client's own belief
//! ("I hold the key until my last successful send plus TTL less margin")
//! lies inside this interval whenever its margin is at least the slack, so
//! two overlapping beliefs are caught as two overlapping terms.
//!
//! The issue's wording, "a term lives until its release is sent, or, when
//! the release never reached the server, until its send time plus the
//! TTL", describes how long a term *may* live, the other side of the same
//! coin: the checker cannot tell whether an unacknowledged release reached
//! the server, so for "must be live" it ends the term at the send.
//!
//! # Clock slack
//!
//! [`Config::slack`] covers the server's millisecond clock (a term can
//! expire up to 1 ms before the send time plus the TTL when its "now" was
//! truncated) and rate differences between the server's clock and ours
//! (both are `CLOCK_MONOTONIC` on one machine for SQLite; the database's
//! clock for PostgreSQL, which NTP may slew a little differently).
//!
//! # The checks
//!
//! See [`Kind`]: one variant per property, each with its reasoning.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use serde::Serialize;
use tonic::Code;

use crate::history::{Call, History, MS, Nanos, Op, Outcome, Reply, describe, ms};

/// Checker settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Subtracted from every term's life bound (see the module docs).
    pub slack: Nanos,
    /// *Added* to every term's life bound: a wrong assumption on purpose,
    /// to show on a real history that the checks have reach (with terms
    /// assumed to outlive their TTL, a run that hands keys over at expiry
    /// must show overlaps). Zero for a real check.
    pub overreach: Nanos,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            slack: 5 * MS,
            overreach: 0,
        }
    }
}

/// Which property a violation breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Kind {
    /// Two acknowledged grants returned one fence for different terms
    /// (another key, or another request id). Replays of one request id
    /// legitimately return the same fence.
    DuplicateFence,
    /// A new (not replayed) grant returned a fence no higher than one
    /// already revealed when it was sent: granted before, named as a
    /// holder, named as the superseding term, or shown by Get. The fence
    /// counter is one for all keys, so this is checked across keys: it is
    /// what "an acknowledged grant was lost in a restart" looks like.
    FenceRegressed,
    /// A read sent after a grant was acknowledged does not reflect it:
    /// Get shows an older fence or NOT_FOUND, or a Renew, Check or Release
    /// of the acknowledged fence is refused as `unknown` (never existed).
    LostGrant,
    /// After a Release was acknowledged, a request sent later found the
    /// term live (Check or Renew OK, Get showing it live, a busy refusal
    /// naming it as holder).
    LostRelease,
    /// Two terms of one key must both have been live at the same instant.
    Overlap,
    /// A request found a fence live (Check, Renew, Get, a busy refusal
    /// naming it) during an interval in which another term of the key must
    /// have been live throughout.
    StaleLive,
    /// A Renew, Check or Release of a term was refused (expired,
    /// superseded, released, ...) although the term must have been live
    /// over the whole time the request was in flight.
    EndedEarly,
    /// The fenced store accepted a write with a lower fence than one it
    /// accepted before for the key (or refused one it should have taken).
    StoreOrder,
    /// An error status that the status table does not document for this
    /// operation (INTERNAL, UNIMPLEMENTED, ...; a FAILED_PRECONDITION
    /// without a known reason; an ABORTED without the holder's fence).
    UndocumentedStatus,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// One broken property, with the operations that show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    pub kind: Kind,
    pub key: String,
    pub message: String,
    /// Indexes into `History::ops`.
    pub ops: Vec<usize>,
}

/// Counts that show a run was not vacuous.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    pub ops: usize,
    /// Terms with an acknowledged grant.
    pub terms: usize,
    /// Terms that must have been live for a non-empty interval.
    pub terms_with_life: usize,
    pub replayed_grants: usize,
    pub renewals_ok: usize,
    pub releases_ok: usize,
    pub checks_ok: usize,
    pub gets_ok: usize,
    /// Outcomes unknown to the worker (timeouts, broken connections, and
    /// statuses that leave the effect unknown).
    pub unknown: usize,
    /// Refusals by code name.
    pub refusals: BTreeMap<String, usize>,
    /// FAILED_PRECONDITION refusals by reason.
    pub stale_reasons: BTreeMap<String, usize>,
    pub writes_accepted: usize,
    /// Writes the fenced store refused: late writers it stopped.
    pub writes_rejected: usize,
}

/// The checker's verdict.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    pub violations: Vec<Violation>,
    pub stats: Stats,
}

impl Report {
    /// Whether no property is broken.
    pub fn is_clean(&self) -> bool {
        self.violations.is_empty()
    }

    /// The violations of one kind.
    pub fn of(&self, kind: Kind) -> Vec<&Violation> {
        self.violations.iter().filter(|v| v.kind == kind).collect()
    }

    /// Each violation with the history around it, for people.
    pub fn explain(&self, history: &History, limit: usize) -> String {
        let mut out = String::new();
        for v in self.violations.iter().take(limit) {
            out.push_str(&format!("{}: {} (key {:?})\n", v.kind, v.message, v.key));
            for &i in &v.ops {
                out.push_str(&format!("    {}\n", describe(i, &history.ops[i])));
            }
            let from = v.ops.iter().map(|&i| history.ops[i].invoked).min();
            let to = v.ops.iter().map(|&i| history.ops[i].completed).max();
            if let (Some(from), Some(to)) = (from, to) {
                out.push_str("  history of the key around it:\n");
                let excerpt = history.excerpt(&v.key, from.saturating_sub(200 * MS), to + 200 * MS);
                for line in excerpt.lines().take(60) {
                    out.push_str(&format!("    {line}\n"));
                }
            }
        }
        if self.violations.len() > limit {
            out.push_str(&format!("... and {} more\n", self.violations.len() - limit));
        }
        out
    }
}

/// What the checker knows about one term.
#[derive(Debug, Clone)]
struct Term {
    key: String,
    fence: u64,
    /// Earliest acknowledgement of its grant.
    start: Nanos,
    /// The acknowledged grant that defines `start`.
    grant_op: usize,
    /// Life bound less slack (see the module docs).
    life_end: Nanos,
    /// Sends of Releases of this fence: (time, op).
    release_sends: Vec<(Nanos, usize)>,
    /// Earliest acknowledged Release: (completion, op).
    release_acked: Option<(Nanos, usize)>,
}

impl Term {
    /// The end of the must-live interval, ignoring the release `except`
    /// (a Release cannot be judged against its own send).
    fn end_except(&self, except: Option<usize>) -> Nanos {
        self.release_sends
            .iter()
            .filter(|(_, op)| Some(*op) != except)
            .map(|(at, _)| *at)
            .fold(self.life_end, Nanos::min)
    }

    fn end(&self) -> Nanos {
        self.end_except(None)
    }
}

/// Checks a history; see [`Kind`] for the properties.
pub fn check(history: &History, config: &Config) -> Report {
    let ops = &history.ops;
    let mut out = Vec::new();
    let stats = stats(ops);
    statuses(ops, &mut out);
    duplicate_fences(ops, &mut out);
    fence_order(ops, &mut out);
    let terms = terms(ops, config);
    lost_grants(ops, &terms, &mut out);
    overlaps(&terms, &mut out);
    live_facts(ops, &terms, &mut out);
    ended_early(ops, &terms, &mut out);
    store_order(ops, &mut out);
    let mut stats = stats;
    stats.terms = terms.len();
    stats.terms_with_life = terms.values().filter(|t| t.end() > t.start).count();
    Report {
        violations: out,
        stats,
    }
}

fn stats(ops: &[Op]) -> Stats {
    let mut s = Stats {
        ops: ops.len(),
        ..Stats::default()
    };
    for op in ops {
        match &op.outcome {
            Outcome::Ok(Reply::Granted { replayed, .. }) => s.replayed_grants += *replayed as usize,
            Outcome::Ok(Reply::Renewed { .. }) => s.renewals_ok += 1,
            Outcome::Ok(Reply::Released) => s.releases_ok += 1,
            Outcome::Ok(Reply::Live) => s.checks_ok += 1,
            Outcome::Ok(Reply::State { .. }) => s.gets_ok += 1,
            Outcome::Ok(Reply::Accepted { .. }) => s.writes_accepted += 1,
            Outcome::Ok(Reply::Rejected { .. }) => s.writes_rejected += 1,
            Outcome::Err(r) => {
                *s.refusals.entry(format!("{:?}", r.code())).or_default() += 1;
                if let Some(reason) = &r.reason {
                    *s.stale_reasons.entry(reason.clone()).or_default() += 1;
                }
                if !r.is_definite() {
                    s.unknown += 1;
                }
            }
            Outcome::Unknown(_) => s.unknown += 1,
        }
    }
    s
}

/// The reasons a FAILED_PRECONDITION may carry (`StaleReason::name`).
const REASONS: [&str; 5] = ["expired", "released", "suspended", "superseded", "unknown"];

/// Whether `code` is documented for `call` (README "Status codes", and
/// `leasehold_wire::status`). The transport's own codes (a broken
/// connection is UNAVAILABLE or UNKNOWN, a deadline DEADLINE_EXCEEDED, a
/// reset stream CANCELLED, and the INTERNAL "h2 protocol error" tonic
/// reports for a stream cut by a server's shutdown, which every client maps
/// to UNAVAILABLE) are allowed everywhere; any other INTERNAL is "reserved
/// for server faults", so it is reported: under these faults the table says
/// a storage failure is UNAVAILABLE.
fn documented(call: &Call, code: Code, message: &str) -> bool {
    let transport = matches!(
        code,
        Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded
    ) || (code == Code::Internal && message.starts_with("h2 protocol error"));
    let common = matches!(
        code,
        Code::InvalidArgument
            | Code::ResourceExhausted
            | Code::Unauthenticated
            | Code::PermissionDenied
    );
    let specific = match call {
        Call::Acquire { .. } => code == Code::Aborted,
        Call::Renew { .. } | Call::Release { .. } | Call::Check { .. } => {
            code == Code::FailedPrecondition
        }
        Call::Get => code == Code::NotFound,
        Call::Write { .. } => false,
    };
    transport || common || specific
}

fn statuses(ops: &[Op], out: &mut Vec<Violation>) {
    for (i, op) in ops.iter().enumerate() {
        let Some(r) = op.refusal() else { continue };
        let problem = if !documented(&op.call, r.code(), &r.message) {
            Some(format!(
                "{:?} is not documented for {:?}",
                r.code(),
                op.call
            ))
        } else if r.code() == Code::FailedPrecondition
            && !r.reason.as_deref().is_some_and(|x| REASONS.contains(&x))
        {
            Some(format!(
                "FAILED_PRECONDITION with reason {:?}, not one of {REASONS:?}",
                r.reason
            ))
        } else if r.code() == Code::Aborted && r.fence.is_none() {
            Some("ABORTED without the holder's fence".into())
        } else {
            None
        };
        if let Some(message) = problem {
            out.push(Violation {
                kind: Kind::UndocumentedStatus,
                key: op.key.clone(),
                message,
                ops: vec![i],
            });
        }
    }
}

fn duplicate_fences(ops: &[Op], out: &mut Vec<Violation>) {
    // fence -> (key, request id, op) of the first grant seen.
    let mut first: HashMap<u64, (&str, &str, usize)> = HashMap::new();
    for (i, op) in ops.iter().enumerate() {
        let (Some((fence, _, _)), Call::Acquire { request_id, .. }) = (op.granted(), &op.call)
        else {
            continue;
        };
        match first.get(&fence) {
            None => {
                first.insert(fence, (&op.key, request_id, i));
            }
            Some(&(key, rid, j)) if key != op.key || rid != request_id => {
                out.push(Violation {
                    kind: Kind::DuplicateFence,
                    key: op.key.clone(),
                    message: format!(
                        "fence {fence} granted to two terms: key {key:?} request {rid:?}, \
                         and key {:?} request {request_id:?}",
                        op.key
                    ),
                    ops: vec![j, i],
                });
            }
            Some(_) => {}
        }
    }
}

/// Every fence a reply revealed as granted: (completion, fence, key, op).
fn revealed(ops: &[Op]) -> Vec<(Nanos, u64, &str, usize)> {
    let mut facts = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let mut add = |fence: u64| facts.push((op.completed, fence, op.key.as_str(), i));
        match &op.outcome {
            Outcome::Ok(Reply::Granted { fence, .. }) => add(*fence),
            Outcome::Ok(Reply::State { live, last_ended }) => {
                live.iter().chain(last_ended.iter()).for_each(|f| add(*f))
            }
            Outcome::Err(r) if r.is_definite() => {
                if let Some(f) = r.fence {
                    add(f)
                }
            }
            _ => {}
        }
    }
    facts.sort();
    facts
}

fn fence_order(ops: &[Op], out: &mut Vec<Violation>) {
    let facts = revealed(ops);
    // prefix[i]: the highest fence (and its op) among facts[..=i].
    let mut prefix: Vec<(u64, usize)> = Vec::with_capacity(facts.len());
    for &(_, fence, _, op) in &facts {
        let best = prefix.last().copied().filter(|(f, _)| *f >= fence);
        prefix.push(best.unwrap_or((fence, op)));
    }
    for (i, op) in ops.iter().enumerate() {
        let Some((fence, _, false)) = op.granted() else {
            continue;
        };
        let before = facts.partition_point(|f| f.0 < op.invoked);
        if before == 0 {
            continue;
        }
        let (highest, j) = prefix[before - 1];
        if highest >= fence {
            out.push(Violation {
                kind: Kind::FenceRegressed,
                key: op.key.clone(),
                message: format!(
                    "new grant of fence {fence} sent at {:.3} ms, after fence {highest} \
                     (key {:?}) was revealed at {:.3} ms",
                    ms(op.invoked),
                    ops[j].key,
                    ms(ops[j].completed)
                ),
                ops: vec![j, i],
            });
        }
    }
}

fn terms(ops: &[Op], config: &Config) -> BTreeMap<(String, u64), Term> {
    // The first send of each (key, request id).
    let mut first_send: HashMap<(&str, &str), Nanos> = HashMap::new();
    for op in ops {
        if let Call::Acquire { request_id, .. } = &op.call {
            let at = first_send
                .entry((&op.key, request_id))
                .or_insert(op.invoked);
            *at = (*at).min(op.invoked);
        }
    }
    let mut terms: BTreeMap<(String, u64), Term> = BTreeMap::new();
    for (i, op) in ops.iter().enumerate() {
        let (Some((fence, ttl_ms, _)), Call::Acquire { request_id, .. }) = (op.granted(), &op.call)
        else {
            continue;
        };
        let bound = first_send[&(op.key.as_str(), request_id.as_str())] + ttl_ms * MS;
        let term = terms
            .entry((op.key.clone(), fence))
            .or_insert_with(|| Term {
                key: op.key.clone(),
                fence,
                start: op.completed,
                grant_op: i,
                life_end: 0,
                release_sends: Vec::new(),
                release_acked: None,
            });
        if op.completed < term.start {
            term.start = op.completed;
            term.grant_op = i;
        }
        term.life_end = term
            .life_end
            .max((bound + config.overreach).saturating_sub(config.slack));
    }
    for (i, op) in ops.iter().enumerate() {
        let Some(fence) = op.fence() else { continue };
        let Some(term) = terms.get_mut(&(op.key.clone(), fence)) else {
            continue;
        };
        match (&op.call, &op.outcome) {
            (Call::Renew { .. }, Outcome::Ok(Reply::Renewed { ttl_ms })) => {
                let bound =
                    (op.invoked + ttl_ms * MS + config.overreach).saturating_sub(config.slack);
                term.life_end = term.life_end.max(bound);
            }
            (Call::Release { .. }, outcome) => {
                term.release_sends.push((op.invoked, i));
                if matches!(outcome, Outcome::Ok(Reply::Released))
                    && term.release_acked.is_none_or(|(at, _)| op.completed < at)
                {
                    term.release_acked = Some((op.completed, i));
                }
            }
            _ => {}
        }
    }
    terms
}

fn lost_grants(ops: &[Op], terms: &BTreeMap<(String, u64), Term>, out: &mut Vec<Violation>) {
    // Per key: facts revealed (completion, fence, op), sorted, with prefix max.
    let mut per_key: HashMap<&str, Vec<(Nanos, u64, usize)>> = HashMap::new();
    for (at, fence, key, op) in revealed(ops) {
        per_key.entry(key).or_default().push((at, fence, op));
    }
    let prefix_max = |facts: &Vec<(Nanos, u64, usize)>, before: Nanos| {
        let n = facts.partition_point(|f| f.0 < before);
        facts[..n].iter().max_by_key(|f| f.1).copied()
    };
    for (i, op) in ops.iter().enumerate() {
        match (&op.call, &op.outcome) {
            (Call::Get, Outcome::Ok(Reply::State { live, last_ended })) => {
                let shown = live.max(last_ended).unwrap_or(0);
                let known = per_key
                    .get(op.key.as_str())
                    .and_then(|f| prefix_max(f, op.invoked));
                if let Some((_, fence, j)) = known.filter(|k| k.1 > shown) {
                    out.push(Violation {
                        kind: Kind::LostGrant,
                        key: op.key.clone(),
                        message: format!(
                            "Get shows fence {shown} at most, but fence {fence} was revealed before it was sent"
                        ),
                        ops: vec![j, i],
                    });
                }
            }
            (Call::Get, Outcome::Err(r)) if r.code() == Code::NotFound => {
                let known = per_key
                    .get(op.key.as_str())
                    .and_then(|f| prefix_max(f, op.invoked));
                if let Some((_, fence, j)) = known {
                    out.push(Violation {
                        kind: Kind::LostGrant,
                        key: op.key.clone(),
                        message: format!(
                            "Get says NOT_FOUND, but fence {fence} was revealed before it was sent"
                        ),
                        ops: vec![j, i],
                    });
                }
            }
            (
                Call::Renew { fence, .. } | Call::Check { fence } | Call::Release { fence, .. },
                Outcome::Err(r),
            ) if r.reason.as_deref() == Some("unknown") => {
                if let Some(term) = terms
                    .get(&(op.key.clone(), *fence))
                    .filter(|t| t.start < op.invoked)
                {
                    out.push(Violation {
                        kind: Kind::LostGrant,
                        key: op.key.clone(),
                        message: format!(
                            "fence {fence} refused as never granted, but its grant was acknowledged before"
                        ),
                        ops: vec![term.grant_op, i],
                    });
                }
            }
            _ => {}
        }
    }
}

fn overlaps(terms: &BTreeMap<(String, u64), Term>, out: &mut Vec<Violation>) {
    let mut per_key: BTreeMap<&str, Vec<&Term>> = BTreeMap::new();
    for term in terms.values().filter(|t| t.end() > t.start) {
        per_key.entry(&term.key).or_default().push(term);
    }
    for (key, mut list) in per_key {
        list.sort_by_key(|t| (t.start, t.fence));
        let mut longest: Option<&Term> = None;
        for term in list {
            if let Some(prev) = longest {
                if term.start < prev.end() {
                    out.push(Violation {
                        kind: Kind::Overlap,
                        key: key.to_owned(),
                        message: format!(
                            "fence {} must be live over [{:.3}, {:.3}) ms and fence {} over [{:.3}, {:.3}) ms",
                            prev.fence,
                            ms(prev.start),
                            ms(prev.end()),
                            term.fence,
                            ms(term.start),
                            ms(term.end())
                        ),
                        ops: vec![prev.grant_op, term.grant_op],
                    });
                }
            }
            if longest.is_none_or(|p| term.end() > p.end()) {
                longest = Some(term);
            }
        }
    }
}

/// Replies saying that `fence` was the key's live term at some instant
/// while the request was in flight: (op, fence).
fn live_fact(op: &Op) -> Option<u64> {
    match (&op.call, &op.outcome) {
        (Call::Check { fence }, Outcome::Ok(Reply::Live))
        | (Call::Renew { fence, .. }, Outcome::Ok(Reply::Renewed { .. })) => Some(*fence),
        (Call::Get, Outcome::Ok(Reply::State { live, .. })) => *live,
        (Call::Acquire { .. }, Outcome::Err(r)) if r.code() == Code::Aborted => r.fence,
        _ => None,
    }
}

fn live_facts(ops: &[Op], terms: &BTreeMap<(String, u64), Term>, out: &mut Vec<Violation>) {
    // Per key, the terms with a non-empty interval, by start.
    let mut per_key: HashMap<&str, Vec<&Term>> = HashMap::new();
    for term in terms.values().filter(|t| t.end() > t.start) {
        per_key.entry(&term.key).or_default().push(term);
    }
    for list in per_key.values_mut() {
        list.sort_by_key(|t| (t.start, t.fence));
    }
    for (i, op) in ops.iter().enumerate() {
        let Some(fence) = live_fact(op) else { continue };
        // Seen live after its release was acknowledged.
        if let Some(term) = terms.get(&(op.key.clone(), fence)) {
            if let Some((acked, j)) = term.release_acked.filter(|(at, _)| *at < op.invoked) {
                out.push(Violation {
                    kind: Kind::LostRelease,
                    key: op.key.clone(),
                    message: format!(
                        "fence {fence} found live by a request sent at {:.3} ms, after its release \
                         was acknowledged at {:.3} ms",
                        ms(op.invoked),
                        ms(acked)
                    ),
                    ops: vec![j, i],
                });
            }
        }
        // Seen live while another term must have been live throughout.
        // Only the last term to start before the request can contain it
        // unless two intervals overlap, which `overlaps` reports.
        let Some(list) = per_key.get(op.key.as_str()) else {
            continue;
        };
        let n = list.partition_point(|t| t.start <= op.invoked);
        if n == 0 {
            continue;
        }
        let other = list[n - 1];
        if other.fence != fence && op.completed < other.end() {
            out.push(Violation {
                kind: Kind::StaleLive,
                key: op.key.clone(),
                message: format!(
                    "fence {fence} found live over [{:.3}, {:.3}] ms, while fence {} must be live \
                     over [{:.3}, {:.3}) ms",
                    ms(op.invoked),
                    ms(op.completed),
                    other.fence,
                    ms(other.start),
                    ms(other.end())
                ),
                ops: vec![other.grant_op, i],
            });
        }
    }
}

fn ended_early(ops: &[Op], terms: &BTreeMap<(String, u64), Term>, out: &mut Vec<Violation>) {
    for (i, op) in ops.iter().enumerate() {
        let (Some(fence), Some(r)) = (op.fence(), op.refusal()) else {
            continue;
        };
        if matches!(op.call, Call::Write { .. }) || !r.is_definite() {
            continue;
        }
        let Some(term) = terms.get(&(op.key.clone(), fence)) else {
            continue;
        };
        let end = term.end_except(Some(i));
        if term.start <= op.invoked && op.completed < end {
            out.push(Violation {
                kind: Kind::EndedEarly,
                key: op.key.clone(),
                message: format!(
                    "{:?} refused with {:?} ({}) over [{:.3}, {:.3}] ms, while fence {fence} must be \
                     live over [{:.3}, {:.3}) ms",
                    op.call,
                    r.code(),
                    r.reason.as_deref().unwrap_or("-"),
                    ms(op.invoked),
                    ms(op.completed),
                    ms(term.start),
                    ms(end)
                ),
                ops: vec![term.grant_op, i],
            });
        }
    }
}

fn store_order(ops: &[Op], out: &mut Vec<Violation>) {
    let mut accepted: Vec<(u64, usize)> = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        match (&op.call, &op.outcome) {
            (Call::Write { .. }, Outcome::Ok(Reply::Accepted { seq })) => accepted.push((*seq, i)),
            (Call::Write { fence }, Outcome::Ok(Reply::Rejected { highest }))
                if highest <= fence =>
            {
                out.push(Violation {
                    kind: Kind::StoreOrder,
                    key: op.key.clone(),
                    message: format!(
                        "the store refused fence {fence} although its highest was {highest}"
                    ),
                    ops: vec![i],
                });
            }
            _ => {}
        }
    }
    accepted.sort();
    let mut highest: HashMap<&str, (u64, usize)> = HashMap::new();
    for (_, i) in accepted {
        let op = &ops[i];
        let fence = op.fence().unwrap_or(0);
        if let Some(&(top, j)) = highest.get(op.key.as_str()) {
            if fence < top {
                out.push(Violation {
                    kind: Kind::StoreOrder,
                    key: op.key.clone(),
                    message: format!(
                        "the store accepted fence {fence} after it had accepted fence {top}"
                    ),
                    ops: vec![j, i],
                });
                continue;
            }
        }
        highest.insert(&op.key, (fence, i));
    }
}
