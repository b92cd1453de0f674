//! The tool-call ledger under the live term: begun all or none and settled
//! first-wins, each in a statement or transaction that holds the term's row
//! (begins exclusively, one after the other; see [`sql::LOCK_LIVE_TERM`]),
//! so no release or grant commits between the check that the term is live
//! and the ledger write. A call's identity is (key, turn, call_id), with the
//! duplicate rule of `leasehold_core::ledger` (a call naming no turn, or
//! asking `across_turns`, is checked against every turn).

use leasehold_core::error::{Error, Result};
use leasehold_core::lease::{Fence, Key, LeaseId};
use leasehold_core::ledger::{
    BeginOutcome, CallFilter, CallSpec, Settlement, ToolCall, validate_settlement, validate_specs,
};
use leasehold_core::stored::Stored;

use tokio_postgres::error::SqlState;

use crate::db::{Db, RACE_RETRIES, db_error};
use crate::holding::raced;
use crate::key_row::millis;
use crate::{key_row, sql};

impl Db {
    pub(crate) async fn begin_tool_calls(
        &self,
        key: &Key,
        fence: Fence,
        lease_id: LeaseId,
        specs: Vec<CallSpec>,
    ) -> Result<BeginOutcome> {
        validate_specs(&specs)?;
        let mut client = self.client().await?;
        for _ in 0..RACE_RETRIES {
            let tx = client.transaction().await.map_err(db_error)?;
            let lock = tx
                .prepare_cached(sql::LOCK_LIVE_TERM)
                .await
                .map_err(db_error)?;
            let Some(term) = tx
                .query_opt(&lock, &[&key.as_str(), &(fence.0 as i64), &lease_id.0])
                .await
                .map_err(db_error)?
            else {
                tx.rollback().await.map_err(db_error)?;
                match self
                    .holder_refusal(&mut client, key, fence, lease_id)
                    .await?
                {
                    Some(refusal) => return Err(refusal),
                    None => continue,
                }
            };
            let now = millis(term.get("now"));
            let ids: Vec<&str> = specs.iter().map(|s| s.call_id.as_str()).collect();
            let by_id = tx
                .prepare_cached(sql::CALLS_BY_ID)
                .await
                .map_err(db_error)?;
            let known = tx
                .query(&by_id, &[&key.as_str(), &ids])
                .await
                .map_err(db_error)?
                .iter()
                .map(key_row::tool_call)
                .collect::<Result<Vec<_>>>()?;
            if let Some(duplicate) = duplicates(&specs, known) {
                tx.rollback().await.map_err(db_error)?;
                return Ok(duplicate);
            }
            let ordinals = tx.prepare_cached(sql::ORDINALS).await.map_err(db_error)?;
            let ordinals: Vec<i64> = tx
                .query(&ordinals, &[&(specs.len() as i32)])
                .await
                .map_err(db_error)?
                .iter()
                .map(|r| r.get("ordinal"))
                .collect();
            let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
            let digests: Vec<&str> = specs.iter().map(|s| s.input_digest.as_str()).collect();
            let turns: Vec<&str> = specs.iter().map(|s| s.turn.as_str()).collect();
            let insert = tx
                .prepare_cached(sql::INSERT_CALLS)
                .await
                .map_err(db_error)?;
            let inserted = tx
                .execute(
                    &insert,
                    &[
                        &key.as_str(),
                        &ids,
                        &names,
                        &digests,
                        &ordinals,
                        &(fence.0 as i64),
                        &(now as i64),
                        &turns,
                    ],
                )
                .await;
            match inserted {
                Ok(_) => {}
                // Cannot happen while begins hold the term's row in turn;
                // should it, look again rather than fail.
                Err(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => continue,
                Err(e) => return Err(db_error(e)),
            }
            tx.commit().await.map_err(db_error)?;
            let calls = specs
                .into_iter()
                .zip(ordinals)
                .map(|(spec, ordinal)| ToolCall {
                    call_id: spec.call_id,
                    name: spec.name,
                    input_digest: spec.input_digest,
                    fence,
                    state: leasehold_core::ledger::CallState::Running,
                    settled_fence: None,
                    result_digest: String::new(),
                    result: Vec::new(),
                    begun_at: now,
                    settled_at: None,
                    ordinal: ordinal as u64,
                    turn: spec.turn,
                })
                .collect();
            return Ok(BeginOutcome::Recorded(calls));
        }
        Err(raced(key))
    }

    pub(crate) async fn settle_tool_call(
        &self,
        key: &Key,
        fence: Fence,
        lease_id: LeaseId,
        settlement: Settlement,
    ) -> Result<(ToolCall, bool)> {
        validate_settlement(&settlement)?;
        let mut client = self.client().await?;
        let settle = client.prepare_cached(sql::SETTLE).await.map_err(db_error)?;
        let calls = client
            .prepare_cached(sql::CALLS_WITH_ID)
            .await
            .map_err(db_error)?;
        for _ in 0..RACE_RETRIES {
            let settled = client
                .query_opt(
                    &settle,
                    &[
                        &key.as_str(),
                        &(fence.0 as i64),
                        &lease_id.0,
                        &settlement.call_id,
                        &settlement.outcome.code(),
                        &settlement.result_digest,
                        &settlement.result,
                        &settlement.turn,
                    ],
                )
                .await
                .map_err(db_error)?;
            if let Some(row) = settled {
                return Ok((key_row::tool_call(&row)?, false));
            }
            if let Some(refusal) = self
                .holder_refusal(&mut client, key, fence, lease_id)
                .await?
            {
                return Err(refusal);
            }
            // The term is live: the call is unknown, ambiguous (an id in
            // several turns, settled without naming one) or settled already.
            let found = client
                .query(
                    &calls,
                    &[&key.as_str(), &settlement.call_id, &settlement.turn],
                )
                .await
                .map_err(db_error)?;
            match &found[..] {
                [] => {
                    return Err(Error::ToolCallNotFound {
                        key: key.clone(),
                        call_id: settlement.call_id,
                    });
                }
                [row] => {
                    let call = key_row::tool_call(row)?;
                    if call.state.is_settled() {
                        return Ok((call, true));
                    }
                }
                _ => return Err(ambiguous(&settlement.call_id)),
            }
        }
        Err(raced(key))
    }

    pub(crate) async fn list_tool_calls(
        &self,
        key: &Key,
        filter: CallFilter,
    ) -> Result<Vec<ToolCall>> {
        let client = self.client().await?;
        let exists = client
            .prepare_cached(sql::KEY_EXISTS)
            .await
            .map_err(db_error)?;
        let found: bool = client
            .query_one(&exists, &[&key.as_str()])
            .await
            .map_err(db_error)?
            .get(0);
        if !found {
            return Err(Error::NotFound(key.clone()));
        }
        let query = match filter {
            CallFilter::All => sql::CALLS,
            CallFilter::Unsettled => sql::RUNNING_CALLS,
        };
        let stmt = client.prepare_cached(query).await.map_err(db_error)?;
        client
            .query(&stmt, &[&key.as_str()])
            .await
            .map_err(db_error)?
            .iter()
            .map(key_row::tool_call)
            .collect()
    }
}

/// The refusal of a settle that names no turn for an id begun in several,
/// worded as the Ledger's.
fn ambiguous(call_id: &str) -> Error {
    Error::InvalidArgument(format!(
        "tool call {call_id:?} was begun in several turns; name the turn to settle"
    ))
}

/// The Ledger's duplicate rule over the stored calls `known` (in
/// registration order): an id already recorded in the spec's turn (in any
/// turn, when the spec names none or asks `across_turns`), or repeated
/// within the batch.
pub(crate) fn duplicates(specs: &[CallSpec], known: Vec<ToolCall>) -> Option<BeginOutcome> {
    let mut seen = std::collections::HashSet::new();
    let mut ids: Vec<String> = Vec::new();
    let mut existing = Vec::new();
    for spec in specs {
        let across = spec.turn.is_empty() || spec.across_turns;
        let earlier = known
            .iter()
            .find(|c| c.call_id == spec.call_id && (across || c.turn == spec.turn));
        if let Some(call) = earlier {
            if !ids.contains(&spec.call_id) {
                ids.push(spec.call_id.clone());
                existing.push(call.clone());
            }
        } else if !seen.insert(spec.call_id.as_str()) && !ids.contains(&spec.call_id) {
            ids.push(spec.call_id.clone());
        }
    }
    (!ids.is_empty()).then_some(BeginOutcome::Duplicate { ids, existing })
}
