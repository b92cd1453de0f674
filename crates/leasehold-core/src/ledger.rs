//! The tool-call ledger of one key: which calls were begun, under which
//! fence, and how they ended. No I/O.
//!
//! A call is recorded *before* its side effects run. A call id the ledger
//! already holds is never recorded again, so a provider that repeats an id
//! (in one turn or a later one) cannot make a tool run twice: the caller gets
//! the stored record back and reuses its outcome. After a crash or takeover,
//! the calls still `Running` are exactly the ones whose outcome nobody knows;
//! the new owner settles each explicitly, under its own, higher fence.

use std::collections::HashMap;

use crate::clock::Millis;
use crate::error::{Error, Result};
use crate::lease::{Fence, Key};

/// Longest call id, in bytes.
pub const MAX_CALL_ID_BYTES: usize = 256;
/// Longest tool name, in bytes.
pub const MAX_NAME_BYTES: usize = 256;
/// Longest input or result digest, in bytes.
pub const MAX_DIGEST_BYTES: usize = 256;
/// Largest result payload kept in the ledger, in bytes.
pub const MAX_RESULT_BYTES: usize = 64 * 1024;
/// Most calls one batch may begin.
pub const MAX_BATCH_CALLS: usize = 256;

/// The namespace of [`idempotency_key`]: UUIDv5 of the URL namespace and
/// `leasehold:tool-call`.
pub const IDEMPOTENCY_NAMESPACE: uuid::Uuid = uuid::uuid!("ab524bdc-58dc-56d8-b437-c4cf5ed10325");

/// A stable id for a tool call's side effects, for downstream services that
/// cannot check fences (an external API's idempotency key): the UUIDv5 of
/// `key`, a NUL byte and `call_id` in [`IDEMPOTENCY_NAMESPACE`]. In Python:
/// `uuid.uuid5(uuid.UUID("ab524bdc-58dc-56d8-b437-c4cf5ed10325"), key + "\0" + call_id)`.
pub fn idempotency_key(key: &str, call_id: &str) -> String {
    let mut name = Vec::with_capacity(key.len() + 1 + call_id.len());
    name.extend_from_slice(key.as_bytes());
    name.push(0);
    name.extend_from_slice(call_id.as_bytes());
    uuid::Uuid::new_v5(&IDEMPOTENCY_NAMESPACE, &name)
        .hyphenated()
        .to_string()
}

/// Where a call stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallState {
    /// Begun, not settled: its side effects may be under way.
    Running,
    Succeeded,
    Failed,
    /// Settled without knowing whether its side effects happened.
    Unknown,
}

impl CallState {
    /// Whether the call has a terminal outcome.
    pub fn is_settled(self) -> bool {
        self != CallState::Running
    }
}

/// What the caller wants to begin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallSpec {
    pub call_id: String,
    pub name: String,
    pub input_digest: String,
}

/// One ledger entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub call_id: String,
    pub name: String,
    pub input_digest: String,
    /// The term that began the call.
    pub fence: Fence,
    pub state: CallState,
    /// The term that settled it.
    pub settled_fence: Option<Fence>,
    pub result_digest: String,
    pub result: Vec<u8>,
    pub begun_at: Millis,
    pub settled_at: Option<Millis>,
    /// Registration order within the key.
    pub ordinal: u64,
}

/// A terminal outcome to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settlement {
    pub call_id: String,
    pub outcome: CallState,
    pub result_digest: String,
    pub result: Vec<u8>,
}

/// The result of [`Ledger::begin`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BeginOutcome {
    /// Every call was new and is now recorded as running, in request order.
    Recorded(Vec<ToolCall>),
    /// Some ids were already recorded or repeated in the request; nothing was
    /// recorded. `existing` holds the ledger's records for those it knows.
    Duplicate {
        ids: Vec<String>,
        existing: Vec<ToolCall>,
    },
}

/// Which calls [`Ledger::list`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallFilter {
    Unsettled,
    All,
}

/// The tool calls of one key, in registration order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ledger {
    /// Calls ordered by ordinal.
    calls: Vec<ToolCall>,
    /// call id -> position in `calls`.
    index: HashMap<String, usize>,
}

impl Ledger {
    /// Rebuilds a ledger from stored calls (any order).
    pub fn from_calls(mut calls: Vec<ToolCall>) -> Self {
        calls.sort_by_key(|c| c.ordinal);
        let index = calls
            .iter()
            .enumerate()
            .map(|(i, c)| (c.call_id.clone(), i))
            .collect();
        Ledger { calls, index }
    }

    /// Records `specs` as running under `fence`, all or none.
    ///
    /// `next_ordinal` is the server-wide registration counter.
    pub fn begin(
        &mut self,
        specs: Vec<CallSpec>,
        fence: Fence,
        now: Millis,
        next_ordinal: &mut u64,
    ) -> BeginOutcome {
        let mut seen = std::collections::HashSet::new();
        let mut ids = Vec::new();
        let mut existing = Vec::new();
        for spec in &specs {
            if let Some(call) = self.get(&spec.call_id) {
                if !ids.contains(&spec.call_id) {
                    ids.push(spec.call_id.clone());
                    existing.push(call.clone());
                }
            } else if !seen.insert(spec.call_id.as_str()) && !ids.contains(&spec.call_id) {
                ids.push(spec.call_id.clone());
            }
        }
        if !ids.is_empty() {
            return BeginOutcome::Duplicate { ids, existing };
        }
        let recorded: Vec<ToolCall> = specs
            .into_iter()
            .map(|spec| {
                let ordinal = *next_ordinal;
                *next_ordinal += 1;
                ToolCall {
                    call_id: spec.call_id,
                    name: spec.name,
                    input_digest: spec.input_digest,
                    fence,
                    state: CallState::Running,
                    settled_fence: None,
                    result_digest: String::new(),
                    result: Vec::new(),
                    begun_at: now,
                    settled_at: None,
                    ordinal,
                }
            })
            .collect();
        for call in &recorded {
            self.index.insert(call.call_id.clone(), self.calls.len());
            self.calls.push(call.clone());
        }
        BeginOutcome::Recorded(recorded)
    }

    /// Records a terminal outcome under `fence`; the first one wins.
    ///
    /// Returns the winning record and whether an earlier settle had won.
    ///
    /// # Errors
    /// [`Error::ToolCallNotFound`] when the ledger has no such call.
    pub fn settle(
        &mut self,
        key: &Key,
        settlement: Settlement,
        fence: Fence,
        now: Millis,
    ) -> Result<(ToolCall, bool)> {
        let Some(&i) = self.index.get(&settlement.call_id) else {
            return Err(Error::ToolCallNotFound {
                key: key.clone(),
                call_id: settlement.call_id,
            });
        };
        let call = &mut self.calls[i];
        if call.state.is_settled() {
            return Ok((call.clone(), true));
        }
        call.state = settlement.outcome;
        call.settled_fence = Some(fence);
        call.result_digest = settlement.result_digest;
        call.result = settlement.result;
        call.settled_at = Some(now);
        Ok((call.clone(), false))
    }

    /// The call with this id.
    pub fn get(&self, call_id: &str) -> Option<&ToolCall> {
        self.index.get(call_id).map(|&i| &self.calls[i])
    }

    /// Calls in registration order.
    pub fn list(&self, filter: CallFilter) -> Vec<ToolCall> {
        self.calls
            .iter()
            .filter(|c| filter == CallFilter::All || !c.state.is_settled())
            .cloned()
            .collect()
    }

    /// How many calls are still running.
    pub fn unsettled(&self) -> usize {
        self.calls.iter().filter(|c| !c.state.is_settled()).count()
    }

    /// Whether any call is settled (so pruning has work).
    pub fn has_settled(&self) -> bool {
        self.calls.iter().any(|c| c.state.is_settled())
    }

    /// Drops settled calls; returns their ids. Running calls stay: their
    /// outcome is still owed.
    pub fn prune_settled(&mut self) -> Vec<String> {
        let (settled, running): (Vec<_>, Vec<_>) = std::mem::take(&mut self.calls)
            .into_iter()
            .partition(|c| c.state.is_settled());
        *self = Ledger::from_calls(running);
        settled.into_iter().map(|c| c.call_id).collect()
    }

    /// Whether the ledger holds nothing.
    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }
}

/// Checks the specs of a batch.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the first rule broken.
pub fn validate_specs(specs: &[CallSpec]) -> Result<()> {
    if specs.is_empty() {
        return Err(Error::InvalidArgument("no tool calls given".into()));
    }
    if specs.len() > MAX_BATCH_CALLS {
        return Err(Error::InvalidArgument(format!(
            "{} tool calls in one batch; the limit is {MAX_BATCH_CALLS}",
            specs.len()
        )));
    }
    for spec in specs {
        validate_call_id(&spec.call_id)?;
        limit("name", &spec.name, MAX_NAME_BYTES)?;
        limit("input_digest", &spec.input_digest, MAX_DIGEST_BYTES)?;
    }
    Ok(())
}

/// Checks a call id: non-empty, at most [`MAX_CALL_ID_BYTES`], no control characters.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the rule broken.
pub fn validate_call_id(call_id: &str) -> Result<()> {
    if call_id.is_empty() {
        return Err(Error::InvalidArgument("call_id must not be empty".into()));
    }
    if call_id.chars().any(char::is_control) {
        return Err(Error::InvalidArgument(
            "call_id must not contain control characters".into(),
        ));
    }
    limit("call_id", call_id, MAX_CALL_ID_BYTES)
}

/// Checks a settlement.
///
/// # Errors
/// [`Error::InvalidArgument`] for a bad call id, a non-terminal outcome, or
/// an over-long digest or payload.
pub fn validate_settlement(settlement: &Settlement) -> Result<()> {
    validate_call_id(&settlement.call_id)?;
    if !settlement.outcome.is_settled() {
        return Err(Error::InvalidArgument(
            "outcome must be SUCCEEDED, FAILED or UNKNOWN".into(),
        ));
    }
    limit("result_digest", &settlement.result_digest, MAX_DIGEST_BYTES)?;
    if settlement.result.len() > MAX_RESULT_BYTES {
        return Err(Error::InvalidArgument(format!(
            "result is {} bytes; the limit is {MAX_RESULT_BYTES}",
            settlement.result.len()
        )));
    }
    Ok(())
}

fn limit(what: &str, value: &str, max: usize) -> Result<()> {
    if value.len() > max {
        return Err(Error::InvalidArgument(format!(
            "{what} is {} bytes; the limit is {max}",
            value.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(id: &str) -> CallSpec {
        CallSpec {
            call_id: id.into(),
            name: "shell".into(),
            input_digest: String::new(),
        }
    }

    #[test]
    fn a_batch_with_a_known_id_records_nothing() {
        let mut ledger = Ledger::default();
        let mut ordinal = 1;
        assert!(matches!(
            ledger.begin(vec![spec("a")], Fence(1), 0, &mut ordinal),
            BeginOutcome::Recorded(_)
        ));
        let outcome = ledger.begin(vec![spec("b"), spec("a")], Fence(1), 0, &mut ordinal);
        let BeginOutcome::Duplicate { ids, existing } = outcome else {
            panic!("expected duplicate");
        };
        assert_eq!(ids, ["a"]);
        assert_eq!(existing[0].call_id, "a");
        assert!(ledger.get("b").is_none());
    }

    #[test]
    fn an_id_repeated_within_a_batch_is_a_duplicate() {
        let mut ledger = Ledger::default();
        let mut ordinal = 1;
        let outcome = ledger.begin(vec![spec("a"), spec("a")], Fence(1), 0, &mut ordinal);
        assert_eq!(
            outcome,
            BeginOutcome::Duplicate {
                ids: vec!["a".into()],
                existing: vec![]
            }
        );
        assert!(ledger.is_empty());
    }

    #[test]
    fn the_first_settle_wins() {
        let mut ledger = Ledger::default();
        let mut ordinal = 1;
        ledger.begin(vec![spec("a")], Fence(1), 0, &mut ordinal);
        let settle = |outcome| Settlement {
            call_id: "a".into(),
            outcome,
            result_digest: String::new(),
            result: Vec::new(),
        };
        let (first, already) = ledger
            .settle(
                &Key::parse("k").unwrap(),
                settle(CallState::Succeeded),
                Fence(1),
                5,
            )
            .unwrap();
        assert!(!already);
        let (second, already) = ledger
            .settle(
                &Key::parse("k").unwrap(),
                settle(CallState::Failed),
                Fence(1),
                6,
            )
            .unwrap();
        assert!(already);
        assert_eq!(first, second);
        assert_eq!(second.state, CallState::Succeeded);
    }

    #[test]
    fn idempotency_keys_match_the_documented_formula() {
        // uuid.uuid5(uuid.UUID("ab524bdc-..."), "session:1\0call_1") in Python.
        assert_eq!(
            idempotency_key("session:1", "call_1"),
            "a2d46a7a-2e77-5d22-b2cb-c49159a0b511"
        );
    }
}
