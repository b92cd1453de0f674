//! Running a turn's tool calls through the server's ledger, so no call id
//! ever runs its tool twice and a new owner knows what was left running.
//!
//! [`SessionGuard::run_tool_calls`] is the common loop: register the turn's
//! calls (before any side effect), run the new ones (as concurrently as the
//! caller allows), settle each as it finishes, and return one result per call
//! in the provider's call order. A call id the ledger already knows gets its
//! stored outcome instead of a second run.
//!
//! # Turns
//! Some models reuse call ids in every turn (`call_0`). Name the turn with
//! [`SessionGuard::tool_calls`], and a duplicate is looked for within that
//! turn only (or, with [`ToolCalls::across_turns`], in every turn):
//!
//! ```no_run
//! # use leasehold_client::{SessionGuard, ToolCallRequest, ToolOutcome, ClientError};
//! # async fn turn(guard: &SessionGuard, calls: Vec<ToolCallRequest>) -> Result<(), ClientError> {
//! let results = guard
//!     .tool_calls()
//!     .turn("turn-7")
//!     .run(calls, 4, |_invocation| async move { ToolOutcome::Succeeded(vec![]) })
//!     .await?;
//! # let _ = results;
//! # Ok(())
//! # }
//! ```
//!
//! Without a turn (what [`SessionGuard::run_tool_calls`] does) an id is
//! checked against every turn, as before turns existed. Which to use when:
//! `docs/tool-calls.md`.

use std::future::Future;

use futures_util::stream::{self, StreamExt};

use super::endpoints::Resend;
use super::error::ClientError;
use super::guard::SessionGuard;

use leasehold_core::Error;
use leasehold_core::lease::Fence;
use leasehold_core::ledger::{ToolCall, idempotency_key_in_turn, validate_turn};
use leasehold_wire::convert;
use leasehold_wire::pb;

/// One tool call of a turn, as the model provider asked for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCallRequest {
    /// The provider's call id (`call_…`, `toolu_…`).
    pub call_id: String,
    /// The tool's name.
    pub name: String,
    /// Optional digest of the input, stored with the call for audits.
    pub input_digest: String,
}

impl ToolCallRequest {
    /// A call with no input digest.
    pub fn new(call_id: impl Into<String>, name: impl Into<String>) -> Self {
        ToolCallRequest {
            call_id: call_id.into(),
            name: name.into(),
            input_digest: String::new(),
        }
    }
}

/// What a handler is given to run one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolInvocation {
    pub call: ToolCallRequest,
    /// The fence the call was registered under; pass it to fenced storage.
    pub fence: Fence,
    /// Stable across retries and duplicates: give it to downstream services
    /// that deduplicate (see `docs/tool-calls.md`). It includes the turn, so
    /// an id reused in a new turn gets a new key.
    pub idempotency_key: String,
    /// The turn the call was registered in (empty: none).
    pub turn: String,
}

/// How a call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolOutcome {
    /// It ran and succeeded, with this (small) result payload.
    Succeeded(Vec<u8>),
    /// It ran and failed, with this payload (an error message, say).
    Failed(Vec<u8>),
    /// Nobody knows whether its side effects happened (settled by a recoverer).
    Unknown,
    /// Recorded as running by an earlier turn or term and not settled yet:
    /// its outcome is still owed. The handler was not run.
    StillRunning,
}

/// One call's result, in the provider's call order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolResult {
    pub call_id: String,
    pub outcome: ToolOutcome,
    /// True when the outcome came from the ledger (a duplicate call id), so
    /// the handler did not run for this entry.
    pub reused: bool,
}

impl ToolOutcome {
    fn from_record(call: &pb::ToolCall) -> ToolOutcome {
        match pb::ToolCallState::try_from(call.state) {
            Ok(pb::ToolCallState::Succeeded) => ToolOutcome::Succeeded(call.result.clone()),
            Ok(pb::ToolCallState::Failed) => ToolOutcome::Failed(call.result.clone()),
            Ok(pb::ToolCallState::Unknown) => ToolOutcome::Unknown,
            _ => ToolOutcome::StillRunning,
        }
    }
}

impl SessionGuard {
    /// The tool-call ledger of this guard's key, for one turn: set
    /// [`ToolCalls::turn`] (and [`ToolCalls::across_turns`]), then
    /// [`ToolCalls::run`] or [`ToolCalls::settle`]. Without a turn it is
    /// what [`SessionGuard::run_tool_calls`] and
    /// [`SessionGuard::settle_tool_call`] do.
    pub fn tool_calls(&self) -> ToolCalls<'_> {
        ToolCalls {
            guard: self,
            turn: String::new(),
            across_turns: false,
        }
    }

    /// Runs one turn's tool calls through the ledger, with no turn named (a
    /// call id is checked against every earlier call of the key); see
    /// [`ToolCalls::run`], and [`SessionGuard::tool_calls`] to name the turn.
    ///
    /// # Errors
    /// As [`ToolCalls::run`].
    pub async fn run_tool_calls<F, Fut>(
        &self,
        calls: Vec<ToolCallRequest>,
        concurrency: usize,
        handler: F,
    ) -> Result<Vec<ToolResult>, ClientError>
    where
        F: Fn(ToolInvocation) -> Fut,
        Fut: Future<Output = ToolOutcome>,
    {
        self.tool_calls().run(calls, concurrency, handler).await
    }

    /// Records a call's outcome under this guard's fence (the first terminal
    /// outcome wins; the winning record is returned). A recoverer uses it to
    /// settle the calls a dead holder left running, usually as
    /// [`ToolOutcome::Unknown`]. An id begun in several turns needs its
    /// turn: [`ToolCalls::settle`].
    ///
    /// # Errors
    /// As [`ToolCalls::settle`]; [`Error::InvalidArgument`] when the id was
    /// begun in several turns.
    pub async fn settle_tool_call(
        &self,
        call_id: &str,
        outcome: &ToolOutcome,
    ) -> Result<ToolCall, ClientError> {
        self.tool_calls().settle(call_id, outcome).await
    }

    /// The key's calls still recorded as running: after taking over a key,
    /// settle each before continuing.
    ///
    /// # Errors
    /// Server errors from `ListToolCalls`.
    pub async fn unsettled_tool_calls(&self) -> Result<Vec<ToolCall>, ClientError> {
        let shared = &self.shared;
        let message = pb::ListToolCallsRequest {
            key: shared.key.as_str().to_owned(),
            filter: pb::list_tool_calls_request::Filter::Unsettled as i32,
        };
        let timeout = shared.timing.rpc_timeout;
        let reply = unary!(
            shared.endpoints,
            Resend::Safe,
            "ListToolCalls",
            timeout,
            list_tool_calls,
            message
        )?;
        let calls = reply
            .calls
            .into_iter()
            .map(|c| convert::tool_call_from_pb(c).map(|(_, call)| call))
            .collect::<Result<_, _>>()?;
        Ok(calls)
    }
}

/// A guard's tool-call ledger for one turn: from [`SessionGuard::tool_calls`].
#[derive(Debug, Clone)]
#[must_use = "set the turn, then call run() or settle()"]
pub struct ToolCalls<'g> {
    /// The guard whose fence and lease id every ledger call presents.
    guard: &'g SessionGuard,
    /// The turn; empty means none (ids checked against every turn).
    turn: String,
    /// Refuse an id declared in any turn, not only this one.
    across_turns: bool,
}

impl ToolCalls<'_> {
    /// The turn these calls belong to (the provider's turn or message id, a
    /// counter: any string up to 256 bytes without control characters).
    /// A duplicate is then looked for within `(key, turn, call_id)` only,
    /// so an id reused in a new turn runs again.
    pub fn turn(mut self, turn: impl Into<String>) -> Self {
        self.turn = turn.into();
        self
    }

    /// Also treat an id declared in *any* earlier turn as a duplicate (its
    /// stored record comes back and the handler does not run), while the
    /// calls are still recorded under [`ToolCalls::turn`]. For providers
    /// whose ids are unique per conversation, to catch a replayed old id.
    pub fn across_turns(mut self) -> Self {
        self.across_turns = true;
        self
    }

    /// Runs one turn's tool calls through the ledger; which to use when: `docs/tool-calls.md`.
    ///
    /// Calls are registered all at once before any handler runs. Up to
    /// `concurrency` handlers run at a time; each new call is settled (in
    /// this turn) as soon as its handler returns. An id repeated within the
    /// turn runs once and every occurrence gets its outcome. An id the
    /// ledger already holds (in this turn; in any turn with no turn named
    /// or with [`ToolCalls::across_turns`]) is not run: its stored outcome
    /// comes back with `reused = true`. If the lease is lost while handlers
    /// run, they are dropped (cancelled) and the error is returned: their
    /// calls stay recorded as running, for whoever recovers the key.
    ///
    /// # Errors
    /// [`ClientError::Lost`] when the guard is not valid or the server
    /// refuses its fence; [`Error::InvalidArgument`] for a malformed turn;
    /// server errors from the ledger calls.
    pub async fn run<F, Fut>(
        &self,
        calls: Vec<ToolCallRequest>,
        concurrency: usize,
        handler: F,
    ) -> Result<Vec<ToolResult>, ClientError>
    where
        F: Fn(ToolInvocation) -> Fut,
        Fut: Future<Output = ToolOutcome>,
    {
        let guard = self.guard;
        guard.ensure_valid()?;
        validate_turn(&self.turn)?;
        let mut unique: Vec<ToolCallRequest> = Vec::new();
        for call in &calls {
            if !unique.iter().any(|u| u.call_id == call.call_id) {
                unique.push(call.clone());
            }
        }
        let known = self.register(&unique).await?;
        let fresh: Vec<ToolCallRequest> = unique
            .into_iter()
            .filter(|c| !known.iter().any(|k| k.call_id == c.call_id))
            .collect();

        let fence = guard.fence();
        let key = guard.key().to_owned();
        let running = stream::iter(fresh)
            .map(|call| {
                let invocation = ToolInvocation {
                    idempotency_key: idempotency_key_in_turn(
                        key.as_str(),
                        &self.turn,
                        &call.call_id,
                    ),
                    fence,
                    turn: self.turn.clone(),
                    call,
                };
                let handler = &handler;
                async move {
                    let call_id = invocation.call.call_id.clone();
                    let outcome = handler(invocation).await;
                    self.settle(&call_id, &outcome).await?;
                    Ok::<_, ClientError>((call_id, outcome))
                }
            })
            .buffer_unordered(concurrency.max(1))
            .collect::<Vec<_>>();
        let ran = tokio::select! {
            ran = running => ran,
            reason = guard.lost() => return Err(guard.shared.lost_error(reason)),
        };
        let ran = ran.into_iter().collect::<Result<Vec<_>, _>>()?;
        Ok(calls
            .iter()
            .map(|call| {
                if let Some((_, outcome)) = ran.iter().find(|(id, _)| *id == call.call_id) {
                    return ToolResult {
                        call_id: call.call_id.clone(),
                        outcome: outcome.clone(),
                        reused: false,
                    };
                }
                let record = known
                    .iter()
                    .find(|k| k.call_id == call.call_id)
                    .expect("every call is either known or ran");
                ToolResult {
                    call_id: call.call_id.clone(),
                    outcome: ToolOutcome::from_record(record),
                    reused: true,
                }
            })
            .collect())
    }

    /// Registers `calls` (unique ids) in the ledger; returns the records of
    /// those it already held. The others are now recorded as running.
    async fn register(&self, calls: &[ToolCallRequest]) -> Result<Vec<pb::ToolCall>, ClientError> {
        let reply = self.begin_batch(calls).await?;
        if !reply.duplicate {
            return Ok(Vec::new());
        }
        // All or nothing: nothing was recorded. Register the new ones alone.
        let fresh: Vec<ToolCallRequest> = calls
            .iter()
            .filter(|c| !reply.calls.iter().any(|k| k.call_id == c.call_id))
            .cloned()
            .collect();
        if !fresh.is_empty() {
            let again = self.begin_batch(&fresh).await?;
            if again.duplicate {
                // Only this term's holder can register calls, so this means
                // another process holds our fence and lease id.
                return Err(ClientError::Server(Error::Unavailable(format!(
                    "tool calls {:?} were registered concurrently by another holder of this term",
                    again.duplicate_call_ids
                ))));
            }
        }
        Ok(reply.calls)
    }

    async fn begin_batch(
        &self,
        calls: &[ToolCallRequest],
    ) -> Result<pb::BeginToolCallsResponse, ClientError> {
        if calls.is_empty() {
            return Ok(pb::BeginToolCallsResponse::default());
        }
        let shared = &self.guard.shared;
        let message = pb::BeginToolCallsRequest {
            key: shared.key.as_str().to_owned(),
            fence: shared.fence.0,
            lease_id: shared.lease_id.clone(),
            calls: calls
                .iter()
                .map(|c| pb::ToolCallSpec {
                    call_id: c.call_id.clone(),
                    name: c.name.clone(),
                    input_digest: c.input_digest.clone(),
                })
                .collect(),
            turn: self.turn.clone(),
            across_turns: self.across_turns,
        };
        let timeout = shared.timing.rpc_timeout;
        // Not resent on another server: a registration applied twice looks
        // like another holder of this term.
        unary!(
            shared.endpoints,
            Resend::Unsafe,
            "BeginToolCalls",
            timeout,
            begin_tool_calls,
            message
        )
        .map_err(|err| shared.judge_ledger(err))
    }

    /// Records a call's outcome in this turn under the guard's fence (the
    /// first terminal outcome wins; the winning record is returned). With
    /// no turn named, settles the one call with this id, whatever its turn.
    ///
    /// # Errors
    /// [`ClientError::Lost`] when the fence is refused;
    /// [`Error::InvalidArgument`] for [`ToolOutcome::StillRunning`], an
    /// over-long payload, a malformed turn, or no turn named for an id begun
    /// in several turns; [`Error::ToolCallNotFound`] for an unknown call id
    /// (in this turn).
    pub async fn settle(
        &self,
        call_id: &str,
        outcome: &ToolOutcome,
    ) -> Result<ToolCall, ClientError> {
        let (state, result) = match outcome {
            ToolOutcome::Succeeded(result) => (pb::ToolCallState::Succeeded, result.clone()),
            ToolOutcome::Failed(result) => (pb::ToolCallState::Failed, result.clone()),
            ToolOutcome::Unknown => (pb::ToolCallState::Unknown, Vec::new()),
            ToolOutcome::StillRunning => {
                return Err(ClientError::Server(Error::InvalidArgument(
                    "a call cannot be settled as still running".into(),
                )));
            }
        };
        validate_turn(&self.turn)?;
        let shared = &self.guard.shared;
        let message = pb::SettleToolCallRequest {
            key: shared.key.as_str().to_owned(),
            fence: shared.fence.0,
            lease_id: shared.lease_id.clone(),
            call_id: call_id.to_owned(),
            outcome: state as i32,
            result_digest: String::new(),
            result,
            turn: self.turn.clone(),
        };
        let timeout = shared.timing.rpc_timeout;
        // Safe to resend: the first outcome wins, and a resend gets the
        // stored record back.
        let reply = unary!(
            shared.endpoints,
            Resend::Safe,
            "SettleToolCall",
            timeout,
            settle_tool_call,
            message
        )
        .map_err(|err| shared.judge_ledger(err))?;
        let call = reply.call.ok_or_else(|| {
            ClientError::Server(Error::Storage(
                "SettleToolCall reply carried no call".into(),
            ))
        })?;
        Ok(convert::tool_call_from_pb(call)?.1)
    }
}
