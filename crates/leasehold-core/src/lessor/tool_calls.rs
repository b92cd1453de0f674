//! The lessor's side of the tool-call ledger: calls are begun and settled
//! only under the live term, and every change is durable before its reply.
//! The ledger's own rules live in [`crate::ledger`].

use crate::clock::Millis;
use crate::error::{Error, Result};
use crate::lease::{Fence, Key, LeaseId};
use crate::ledger::{BeginOutcome, CallFilter, CallSpec, Settlement, ToolCall};

use super::key_state::holder;
use super::{Lessor, WaiterHandle};

impl<W: WaiterHandle> Lessor<W> {
    /// Records tool calls as running under the live term `fence`, all or none.
    ///
    /// # Errors
    /// [`Error::StaleFence`] when `fence` is not the live term;
    /// [`Error::PermissionDenied`] when `lease_id` does not match it.
    pub fn begin_tool_calls(
        &mut self,
        key: &Key,
        fence: Fence,
        lease_id: LeaseId,
        specs: Vec<CallSpec>,
        now: Millis,
    ) -> Result<(BeginOutcome, u64)> {
        let mut ordinal = self.next_ordinal;
        self.catch_up(key, now);
        let state = holder(&mut self.keys, key, fence, lease_id)?;
        let outcome =
            state
                .ledger
                .get_or_insert_with(Box::default)
                .begin(specs, fence, now, &mut ordinal);
        self.next_ordinal = ordinal;
        let BeginOutcome::Recorded(calls) = &outcome else {
            return Ok((outcome, state.visible_seq));
        };
        let seq = self.changes.next_seq();
        state.visible_seq = seq;
        self.stats.unsettled_tool_calls += calls.len();
        for call in calls {
            self.changes.call(key, call.reference());
        }
        Ok((outcome, seq))
    }

    /// Records a tool call's outcome under the live term `fence`; the first
    /// terminal outcome wins. Returns the winning record and whether an
    /// earlier settle had won.
    ///
    /// # Errors
    /// [`Error::StaleFence`], [`Error::PermissionDenied`], or
    /// [`Error::ToolCallNotFound`] when the key's ledger has no such call.
    pub fn settle_tool_call(
        &mut self,
        key: &Key,
        fence: Fence,
        lease_id: LeaseId,
        settlement: Settlement,
        now: Millis,
    ) -> Result<(ToolCall, bool, u64)> {
        self.catch_up(key, now);
        let state = holder(&mut self.keys, key, fence, lease_id)?;
        let (call, already) = state
            .ledger
            .get_or_insert_with(Box::default)
            .settle(key, settlement, fence, now)?;
        if already {
            return Ok((call, true, state.visible_seq));
        }
        let seq = self.changes.next_seq();
        state.visible_seq = seq;
        self.stats.unsettled_tool_calls -= 1;
        self.changes.call(key, call.reference());
        Ok((call, false, seq))
    }

    /// The tool calls of `key` in registration order.
    ///
    /// # Errors
    /// [`Error::NotFound`] when the key was never acquired.
    pub fn list_tool_calls(
        &mut self,
        key: &Key,
        filter: CallFilter,
        now: Millis,
    ) -> Result<(Vec<ToolCall>, u64)> {
        self.catch_up(key, now);
        let state = self
            .keys
            .get(key)
            .ok_or_else(|| Error::NotFound(key.clone()))?;
        let calls = state
            .ledger
            .as_ref()
            .map_or_else(Vec::new, |l| l.list(filter));
        Ok((calls, state.visible_seq))
    }
}
