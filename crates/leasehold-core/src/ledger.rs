//! The tool-call ledger of one key: which calls were begun, under which
//! fence, and how they ended. No I/O.
//!
//! A call is recorded *before* its side effects run. A call id the ledger
//! already holds is never recorded again, so a provider that repeats an id
//! (in one turn or a later one) cannot make a tool run twice: the caller gets
//! the stored record back and reuses its outcome. After a crash or takeover,
//! the calls still `Running` are exactly the ones whose outcome nobody knows;
//! the new owner settles each explicitly, under its own, higher fence.
//!
//! # Turns
//! Some models reuse call ids across turns (`call_0` in every turn). A call
//! may name its **turn**; its identity is then `(turn, call_id)`, and a
//! duplicate is looked for within the turn only, unless the begin asks
//! `across_turns` (reject an id declared anywhere in the key's ledger). A
//! call that names no turn (the empty turn) is checked across every turn, as
//! before turns existed. Which to use: name the turn when the provider's ids
//! are only unique per turn; leave it out (or ask `across_turns`) when they
//! are unique per conversation, so a replayed id from an old turn is caught.

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

/// The identity of a call in a key's ledger.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CallRef {
    /// Empty when the call named no turn.
    pub turn: String,
    pub call_id: String,
}

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

/// [`idempotency_key`] of a call that named a turn: the UUIDv5 of `key`,
/// NUL, `turn`, NUL, `call_id` (a call without a turn keeps the key of
/// [`idempotency_key`]).
pub fn idempotency_key_in_turn(key: &str, turn: &str, call_id: &str) -> String {
    if turn.is_empty() {
        return idempotency_key(key, call_id);
    }
    idempotency_key(&format!("{key}\0{turn}"), call_id)
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
    /// The turn the call belongs to (empty: none; see the module docs).
    pub turn: String,
    /// Refuse an id declared in any turn, not only this one.
    pub across_turns: bool,
}

/// One ledger entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// The turn it was begun in (empty: none).
    pub turn: String,
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

impl ToolCall {
    /// This call's identity in its key's ledger.
    pub fn reference(&self) -> CallRef {
        CallRef {
            turn: self.turn.clone(),
            call_id: self.call_id.clone(),
        }
    }
}

/// A terminal outcome to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settlement {
    /// The call's turn; empty settles the one call with this id, whatever
    /// its turn (an id in several turns then needs the turn).
    pub turn: String,
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
    /// call id -> positions in `calls` (one per turn that used the id).
    index: HashMap<String, Vec<usize>>,
}

impl Ledger {
    /// Rebuilds a ledger from stored calls (any order).
    pub fn from_calls(mut calls: Vec<ToolCall>) -> Self {
        calls.sort_by_key(|c| c.ordinal);
        let mut index: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, c) in calls.iter().enumerate() {
            index.entry(c.call_id.clone()).or_default().push(i);
        }
        Ledger { calls, index }
    }

    /// The call a new `spec` would duplicate, if any.
    fn duplicate_of(&self, spec: &CallSpec) -> Option<&ToolCall> {
        let across = spec.turn.is_empty() || spec.across_turns;
        self.index
            .get(&spec.call_id)?
            .iter()
            .map(|&i| &self.calls[i])
            .find(|c| across || c.turn == spec.turn)
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
            if let Some(call) = self.duplicate_of(spec) {
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
                    turn: spec.turn,
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
            self.index
                .entry(call.call_id.clone())
                .or_default()
                .push(self.calls.len());
            self.calls.push(call.clone());
        }
        BeginOutcome::Recorded(recorded)
    }

    /// Records a terminal outcome under `fence`; the first one wins.
    ///
    /// Returns the winning record and whether an earlier settle had won.
    ///
    /// # Errors
    /// [`Error::ToolCallNotFound`] when the ledger has no such call;
    /// [`Error::InvalidArgument`] when no turn is named and the id is in
    /// several turns.
    pub fn settle(
        &mut self,
        key: &Key,
        settlement: Settlement,
        fence: Fence,
        now: Millis,
    ) -> Result<(ToolCall, bool)> {
        let found: Vec<usize> = self
            .index
            .get(&settlement.call_id)
            .map(|at| {
                at.iter()
                    .copied()
                    .filter(|&i| {
                        settlement.turn.is_empty() || self.calls[i].turn == settlement.turn
                    })
                    .collect()
            })
            .unwrap_or_default();
        let i = match found[..] {
            [i] => i,
            [] => {
                return Err(Error::ToolCallNotFound {
                    key: key.clone(),
                    call_id: settlement.call_id,
                });
            }
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "tool call {:?} was begun in several turns; name the turn to settle",
                    settlement.call_id
                )));
            }
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

    /// The call with this identity.
    pub fn get(&self, call: &CallRef) -> Option<&ToolCall> {
        self.index
            .get(&call.call_id)?
            .iter()
            .map(|&i| &self.calls[i])
            .find(|c| c.turn == call.turn)
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

    /// Drops settled calls; returns them. Running calls stay: their
    /// outcome is still owed.
    pub fn prune_settled(&mut self) -> Vec<CallRef> {
        let (settled, running): (Vec<_>, Vec<_>) = std::mem::take(&mut self.calls)
            .into_iter()
            .partition(|c| c.state.is_settled());
        *self = Ledger::from_calls(running);
        settled.into_iter().map(|c| c.reference()).collect()
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
        validate_turn(&spec.turn)?;
        limit("name", &spec.name, MAX_NAME_BYTES)?;
        limit("input_digest", &spec.input_digest, MAX_DIGEST_BYTES)?;
    }
    Ok(())
}

/// Checks a turn: at most [`MAX_CALL_ID_BYTES`], no control characters
/// (empty is no turn).
///
/// # Errors
/// [`Error::InvalidArgument`] naming the rule broken.
pub fn validate_turn(turn: &str) -> Result<()> {
    if turn.chars().any(char::is_control) {
        return Err(Error::InvalidArgument(
            "turn must not contain control characters".into(),
        ));
    }
    limit("turn", turn, MAX_CALL_ID_BYTES)
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
    validate_turn(&settlement.turn)?;
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
            across_turns: Default::default(),
            turn: Default::default(),
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
        let b = CallRef {
            turn: String::new(),
            call_id: "b".into(),
        };
        assert!(ledger.get(&b).is_none());
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
            turn: Default::default(),
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

    fn in_turn(id: &str, turn: &str, across_turns: bool) -> CallSpec {
        CallSpec {
            turn: turn.into(),
            across_turns,
            ..spec(id)
        }
    }

    #[test]
    fn a_reused_id_runs_in_a_new_turn_and_is_refused_within_one() {
        let mut ledger = Ledger::default();
        let mut ordinal = 1;
        let begin = |ledger: &mut Ledger, s: CallSpec, ordinal: &mut u64| {
            ledger.begin(vec![s], Fence(1), 0, ordinal)
        };
        assert!(matches!(
            begin(&mut ledger, in_turn("call_0", "t1", false), &mut ordinal),
            BeginOutcome::Recorded(_)
        ));
        // The same id in the next turn is a new call.
        assert!(matches!(
            begin(&mut ledger, in_turn("call_0", "t2", false), &mut ordinal),
            BeginOutcome::Recorded(_)
        ));
        // Within a turn it is a duplicate, with the existing record.
        match begin(&mut ledger, in_turn("call_0", "t2", false), &mut ordinal) {
            BeginOutcome::Duplicate { ids, existing } => {
                assert_eq!(ids, ["call_0"]);
                assert_eq!(existing[0].turn, "t2");
            }
            other => panic!("expected a duplicate, got {other:?}"),
        }
        // Across turns (asked, or no turn named): any earlier turn counts.
        assert!(matches!(
            begin(&mut ledger, in_turn("call_0", "t3", true), &mut ordinal),
            BeginOutcome::Duplicate { .. }
        ));
        assert!(matches!(
            begin(&mut ledger, spec("call_0"), &mut ordinal),
            BeginOutcome::Duplicate { .. }
        ));
        // Settling needs the turn once an id is in several.
        let key = Key::parse("k").unwrap();
        let settle = |turn: &str| Settlement {
            turn: turn.into(),
            call_id: "call_0".into(),
            outcome: CallState::Succeeded,
            result_digest: String::new(),
            result: Vec::new(),
        };
        assert!(matches!(
            ledger.settle(&key, settle(""), Fence(1), 1),
            Err(Error::InvalidArgument(_))
        ));
        let (call, already) = ledger.settle(&key, settle("t1"), Fence(1), 1).unwrap();
        assert_eq!(call.turn, "t1");
        assert!(!already);
        assert_eq!(ledger.unsettled(), 1);
        let pruned = ledger.prune_settled();
        assert_eq!(
            pruned,
            vec![CallRef {
                turn: "t1".into(),
                call_id: "call_0".into()
            }]
        );
        // One call left with the id: settling without a turn finds it.
        let (call, _) = ledger.settle(&key, settle(""), Fence(1), 2).unwrap();
        assert_eq!(call.turn, "t2");
    }

    #[test]
    fn a_turn_changes_the_idempotency_key_and_no_turn_keeps_it() {
        assert_eq!(
            idempotency_key_in_turn("k", "", "c"),
            idempotency_key("k", "c")
        );
        assert_ne!(
            idempotency_key_in_turn("k", "t1", "c"),
            idempotency_key_in_turn("k", "t2", "c")
        );
    }
}
