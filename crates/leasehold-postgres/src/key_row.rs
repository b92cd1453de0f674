//! Reading rows into domain values, and the refusals a key's state implies.
//!
//! The rules mirror the lessor's (`leasehold_core::lessor`): a term whose
//! deadline has passed is over even while its row still shows it live (the
//! sweeper moves it later), and a stale fence is explained the same way, a
//! newer term first, so clients get the same statuses and reasons from
//! either backend.

use leasehold_core::clock::Millis;
use leasehold_core::error::{Error, Result, StaleReason};
use leasehold_core::events::{Event, EventKind};
use leasehold_core::lease::{
    EndedTerm, Failures, Fence, HistoryEntry, Key, LeaseId, Lifecycle, Owner, RequestId,
    Reservation, Term, TermEnd, Ttl,
};
use leasehold_core::ledger::{CallState, ToolCall};
use leasehold_core::stored::{ReservationKind, Stored};
use tokio_postgres::Row;

/// A key's row as stored (possibly with a term past its deadline).
#[derive(Debug, Clone, Default)]
pub struct KeyRow {
    pub live: Option<Term>,
    pub last_ended: Option<EndedTerm>,
    /// The stored reservation (in force only while no term is live and its
    /// time has not run out).
    pub reservation: Option<Reservation>,
    /// Terms in a row that ended by expiry or suspension (as stored).
    pub failures: u32,
    pub quarantined: bool,
}

/// A key as it stands at the database's `now`.
#[derive(Debug, Clone, Default)]
pub struct KeyNow {
    /// The live term, if any is live at `now`.
    pub live: Option<Term>,
    /// The last ended term (an expired live term counts as ended at its deadline).
    pub last_ended: Option<EndedTerm>,
    /// Who alone may take the free key at `now`, if anyone is singled out
    /// (a lock-delay keeps everyone out).
    pub reservation: Option<Reservation>,
    /// Terms in a row that ended by expiry or suspension, an expiry nobody
    /// has recorded yet included.
    pub failures: u32,
    /// Acquires but forced ones are refused.
    pub quarantined: bool,
}

impl KeyRow {
    /// Reads the `live_*` and `ended_*` columns of `row`.
    ///
    /// # Errors
    /// [`Error::Storage`] when a stored value breaks the domain's rules.
    pub fn from_row(row: &Row) -> Result<KeyRow> {
        let live = match row
            .try_get::<_, Option<i64>>("live_fence")
            .map_err(storage)?
        {
            None => None,
            Some(fence) => Some(Term {
                fence: fence_of(fence),
                owner: owner_of(row.try_get("live_owner").map_err(storage)?)?,
                lease_id: LeaseId(row.try_get("live_lease_id").map_err(storage)?),
                request_id: RequestId::parse_optional(
                    row.try_get::<_, Option<String>>("live_request_id")
                        .map_err(storage)?
                        .unwrap_or_default(),
                )
                .map_err(|e| Error::Storage(format!("stored request_id: {e}")))?,
                ttl: Ttl::from_millis(millis(row.try_get("live_ttl_ms").map_err(storage)?))
                    .map_err(|e| Error::Storage(format!("stored ttl: {e}")))?,
                acquired_at: millis(row.try_get("live_acquired_at_ms").map_err(storage)?),
                expires_at: millis(row.try_get("live_expires_at_ms").map_err(storage)?),
                lifecycle: Lifecycle {
                    lock_delay_ms: millis(row.try_get("live_lock_delay_ms").map_err(storage)?),
                    max_recoveries: row
                        .try_get::<_, Option<i32>>("live_max_recoveries")
                        .map_err(storage)?
                        .map(|k| k.max(0) as u32),
                    handed_off: row.try_get("live_handed_off").map_err(storage)?,
                },
            }),
        };
        let last_ended = match row
            .try_get::<_, Option<i64>>("ended_fence")
            .map_err(storage)?
        {
            None => None,
            Some(fence) => Some(EndedTerm {
                fence: fence_of(fence),
                owner: owner_of(row.try_get("ended_owner").map_err(storage)?)?,
                lease_id: LeaseId(row.try_get("ended_lease_id").map_err(storage)?),
                end: term_end(row.try_get("ended_end").map_err(storage)?)?,
                ended_at: millis(row.try_get("ended_at_ms").map_err(storage)?),
            }),
        };
        let reservation = match row
            .try_get::<_, Option<i16>>("reserved_kind")
            .map_err(storage)?
        {
            None => None,
            Some(kind) => {
                let after = fence_of(row.try_get("reserved_after_fence").map_err(storage)?);
                let until = millis(row.try_get("reserved_until_ms").map_err(storage)?);
                match decode(kind, "reservation kind")? {
                    ReservationKind::LockDelay => Some(Reservation::LockDelay { after, until }),
                    ReservationKind::Handoff => Some(Reservation::Handoff {
                        from: after,
                        successor: owner_of(row.try_get("reserved_successor").map_err(storage)?)?,
                        until,
                    }),
                }
            }
        };
        Ok(KeyRow {
            live,
            last_ended,
            reservation,
            // NULL when READ_KEY found no row.
            failures: row
                .try_get::<_, Option<i32>>("failures")
                .map_err(storage)?
                .unwrap_or(0)
                .max(0) as u32,
            quarantined: row
                .try_get::<_, Option<bool>>("quarantined")
                .map_err(storage)?
                .unwrap_or(false),
        })
    }

    /// Whether the row holds a term past its deadline at `now` that nobody
    /// has moved to ended yet.
    pub fn expired_unmoved(&self, now: Millis) -> bool {
        self.live.as_ref().is_some_and(|t| !t.is_live_at(now))
    }

    /// The key at `now`: a term past its deadline shows as its end will
    /// write it (`Term::expiry`, the lessor's own rule: ended, the failure
    /// counted, the quarantine it earns, its lock-delay), as the statement
    /// that records it writes it (`sql::expire_live`). The recovery limit is
    /// the term's own: the default was fixed into it at its grant.
    pub fn at(self, now: Millis) -> KeyNow {
        match self.live {
            Some(term) if !term.is_live_at(now) => {
                let before = Failures {
                    count: self.failures,
                    quarantined: self.quarantined,
                };
                let ending = term.expiry(before, None);
                KeyNow {
                    reservation: ending.lock_delay.filter(|r| now < r.until()),
                    quarantined: ending.failures.quarantined,
                    failures: ending.failures.count,
                    last_ended: Some(ending.ended),
                    live: None,
                }
            }
            live => KeyNow {
                reservation: self
                    .reservation
                    .filter(|r| live.is_none() && now < r.until()),
                live,
                last_ended: self.last_ended,
                failures: self.failures,
                quarantined: self.quarantined,
            },
        }
    }
}

/// Reads a `term_history` row.
///
/// # Errors
/// [`Error::Storage`] for a value outside the domain.
pub fn history_entry(row: &Row) -> Result<HistoryEntry> {
    Ok(HistoryEntry {
        fence: fence_of(row.try_get("fence").map_err(storage)?),
        owner: owner_of(row.try_get("owner").map_err(storage)?)?,
        acquired_at: millis(row.try_get("acquired_at_ms").map_err(storage)?),
        ended_at: millis(row.try_get("ended_at_ms").map_err(storage)?),
        end: term_end(row.try_get("end_kind").map_err(storage)?)?,
        unsettled_tool_calls: row
            .try_get::<_, i32>("unsettled_tool_calls")
            .map_err(storage)?
            .max(0) as u32,
        handed_off: row.try_get("handed_off").map_err(storage)?,
    })
}

impl KeyNow {
    /// No live term, the last one ended expired or suspended, and the key
    /// is not quarantined.
    pub fn recoverable(&self) -> bool {
        self.live.is_none()
            && !self.quarantined
            && self
                .last_ended
                .as_ref()
                .is_some_and(|e| e.end.is_recoverable())
    }

    /// Why `fence` is not the key's live term (the lessor's own rule).
    pub fn stale_reason(&self, fence: Fence) -> StaleReason {
        leasehold_core::lessor::stale_reason(self.live.as_ref(), self.last_ended.as_ref(), fence)
    }

    /// The refusal of an operation that needs `fence` to be the live term
    /// with secret `lease_id` (renew, release, the ledger), or `None` when it
    /// is (the operation lost a race and may be tried again).
    pub fn holder_refusal(&self, key: &Key, fence: Fence, lease_id: LeaseId) -> Option<Error> {
        match &self.live {
            Some(term) if term.fence == fence => {
                (term.lease_id != lease_id).then(|| denied(key, fence))
            }
            _ => Some(stale(key, fence, self.stale_reason(fence))),
        }
    }
}

pub fn stale(key: &Key, fence: Fence, reason: StaleReason) -> Error {
    Error::StaleFence {
        key: key.clone(),
        fence,
        reason,
    }
}

pub fn denied(key: &Key, fence: Fence) -> Error {
    Error::PermissionDenied {
        key: key.clone(),
        fence,
    }
}

/// Reads a `tool_calls` row.
///
/// # Errors
/// [`Error::Storage`] for a value outside the domain.
pub fn tool_call(row: &Row) -> Result<ToolCall> {
    Ok(ToolCall {
        call_id: row.try_get("call_id").map_err(storage)?,
        name: row.try_get("name").map_err(storage)?,
        input_digest: row.try_get("input_digest").map_err(storage)?,
        fence: fence_of(row.try_get("fence").map_err(storage)?),
        state: call_state(row.try_get("state").map_err(storage)?)?,
        settled_fence: row
            .try_get::<_, Option<i64>>("settled_fence")
            .map_err(storage)?
            .map(fence_of),
        result_digest: row.try_get("result_digest").map_err(storage)?,
        result: row.try_get("result").map_err(storage)?,
        begun_at: millis(row.try_get("begun_at_ms").map_err(storage)?),
        settled_at: row
            .try_get::<_, Option<i64>>("settled_at_ms")
            .map_err(storage)?
            .map(millis),
        ordinal: row.try_get::<_, i64>("ordinal").map_err(storage)? as u64,
        turn: row.try_get("turn").map_err(storage)?,
    })
}

/// The value stored as `code` (`leasehold_core::stored`); `what` names
/// the column's domain for the error.
///
/// # Errors
/// [`Error::Storage`] for a code this build does not know.
pub fn decode<T: Stored>(code: i16, what: &str) -> Result<T> {
    T::from_code(i64::from(code))
        .ok_or_else(|| Error::Storage(format!("unknown stored {what} {code}")))
}

pub fn term_end(code: i16) -> Result<TermEnd> {
    decode(code, "term end")
}

fn call_state(code: i16) -> Result<CallState> {
    decode(code, "call state")
}

/// Reads an `events` row (see `events`).
///
/// # Errors
/// [`Error::Storage`] for a value outside the domain.
pub fn event(row: &Row) -> Result<Event> {
    let kind: EventKind = decode(row.try_get("kind").map_err(storage)?, "event kind")?;
    let key: String = row.try_get("key").map_err(storage)?;
    Ok(Event {
        revision: row.try_get::<_, i64>("revision").map_err(storage)?.max(0) as u64,
        key: Key::parse(key).map_err(|e| Error::Storage(format!("stored key: {e}")))?,
        kind,
        fence: fence_of(row.try_get("fence").map_err(storage)?),
        owner: owner_of(row.try_get("owner").map_err(storage)?)?,
        at: millis(row.try_get("at_ms").map_err(storage)?),
    })
}

fn owner_of(owner: String) -> Result<Owner> {
    Owner::parse(owner).map_err(|e| Error::Storage(format!("stored owner: {e}")))
}

/// Fences and times are positive `bigint`s in the database.
pub fn fence_of(value: i64) -> Fence {
    Fence(value.max(0) as u64)
}

pub fn millis(value: i64) -> Millis {
    value.max(0) as Millis
}

/// A column that does not decode is a fault of the store, not the client.
fn storage(e: tokio_postgres::Error) -> Error {
    Error::Storage(format!("reading a row: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lapsing(max_recoveries: Option<u32>, lock_delay_ms: u64) -> KeyRow {
        KeyRow {
            live: Some(Term {
                fence: Fence(7),
                owner: Owner::parse("w").unwrap(),
                lease_id: LeaseId::random(),
                request_id: None,
                ttl: Ttl::from_millis(1_000).unwrap(),
                acquired_at: 0,
                expires_at: 1_000,
                lifecycle: Lifecycle {
                    lock_delay_ms,
                    max_recoveries,
                    handed_off: false,
                },
            }),
            failures: 1,
            ..KeyRow::default()
        }
    }

    #[test]
    fn a_row_past_its_deadline_reads_as_its_expiry_will_write_it() {
        let now = lapsing(Some(2), 500).at(1_100);
        assert!(now.live.is_none());
        assert_eq!(now.failures, 2, "the expiry is counted");
        assert!(now.quarantined, "the second failure in a row at limit 2");
        assert!(!now.recoverable());
        assert_eq!(
            now.reservation,
            Some(Reservation::LockDelay {
                after: Fence(7),
                until: 1_500
            })
        );
        let ended = now.last_ended.expect("ended");
        assert_eq!((ended.end, ended.ended_at), (TermEnd::Expired, 1_000));
        // Below its limit the key is for recoverers, once the delay is over.
        let later = lapsing(Some(3), 500).at(1_600);
        assert!(!later.quarantined && later.recoverable());
        assert_eq!(later.reservation, None);
        // Before the deadline nothing has ended.
        let live = lapsing(Some(1), 0).at(999);
        assert!(live.live.is_some() && !live.quarantined);
        assert_eq!(live.failures, 1);
    }
}
