//! What a term's holder does, alone on one row: renew, release and check,
//! each a conditional statement, and on refusal a read of the row that
//! explains it (the lessor's wording, `key_row`). The batched paths
//! (`renewals`, `batch`) come first; these are what they fall back to.

use leasehold_core::error::{Error, Result};
use leasehold_core::lease::{EndedTerm, Fence, Handoff, Key, LeaseId, Term, TermEnd, Ttl};
use leasehold_core::stored::Stored;

use crate::db::{Client, Db, RACE_RETRIES, db_error, serve_first_in};
use crate::key_row::{self, KeyRow};
use crate::sql;

impl Db {
    /// Renews `key`'s term `fence` alone (the path of a renewal its batch
    /// did not apply): the conditional update, and on refusal the read that
    /// explains it.
    pub(crate) async fn renew(
        &self,
        key: &Key,
        fence: Fence,
        lease_id: LeaseId,
        ttl: Option<Ttl>,
    ) -> Result<Term> {
        let mut client = self.client().await?;
        let stmt = client.prepare_cached(sql::RENEW).await.map_err(db_error)?;
        let ttl = ttl.map(|t| t.as_millis() as i64);
        for _ in 0..RACE_RETRIES {
            let renewed = client
                .query_opt(
                    &stmt,
                    &[&key.as_str(), &(fence.0 as i64), &lease_id.0, &ttl],
                )
                .await
                .map_err(db_error)?;
            if let Some(row) = renewed {
                return KeyRow::from_row(&row)?
                    .live
                    .ok_or_else(|| Error::Storage("a renewal returned no term".into()));
            }
            if let Some(refusal) = self
                .holder_refusal(&mut client, key, fence, lease_id)
                .await?
            {
                return Err(refusal);
            }
        }
        Err(raced(key))
    }

    /// Ends `key`'s term `fence` (released or suspended) in a transaction
    /// that also hands the key to the first in line: the path of a release
    /// its batch did not apply (someone waits, or a refusal to explain).
    pub(crate) async fn release(
        &self,
        key: &Key,
        fence: Fence,
        lease_id: LeaseId,
        end: TermEnd,
        handoff: Option<Handoff>,
    ) -> Result<EndedTerm> {
        let mut client = self.client().await?;
        let successor = handoff.as_ref().map(|h| h.successor.as_str());
        let handoff_ms = handoff
            .as_ref()
            .map_or(0, |h| h.for_ms.min(i64::MAX as u64) as i64);
        for _ in 0..RACE_RETRIES {
            let tx = client.transaction().await.map_err(db_error)?;
            let stmt = tx.prepare_cached(sql::RELEASE).await.map_err(db_error)?;
            let released = tx
                .query_opt(
                    &stmt,
                    &[
                        &key.as_str(),
                        &(fence.0 as i64),
                        &lease_id.0,
                        &end.code(),
                        &successor,
                        &handoff_ms,
                        &self.history_len(),
                    ],
                )
                .await
                .map_err(db_error)?;
            if let Some(row) = released {
                let ended = KeyRow::from_row(&row)?
                    .last_ended
                    .ok_or_else(|| Error::Storage("a release returned no ended term".into()))?;
                // The first in line gets the key in the same commit, and
                // every server's waiters for the key are woken.
                serve_first_in(&tx, &self.channel, key, self.history_len()).await?;
                let notify = tx.prepare_cached(sql::NOTIFY).await.map_err(db_error)?;
                tx.execute(&notify, &[&self.channel, &key.as_str()])
                    .await
                    .map_err(db_error)?;
                tx.commit().await.map_err(db_error)?;
                return Ok(ended);
            }
            tx.rollback().await.map_err(db_error)?;
            let snapshot = self.read_key_served(&mut client, key).await?;
            let state = &snapshot.key;
            match (&state.live, &state.last_ended) {
                // A retried release: the term as it first ended, while no
                // newer term holds the key.
                (None, Some(ended)) if ended.fence == fence && ended.end != TermEnd::Expired => {
                    if ended.lease_id != lease_id {
                        return Err(key_row::denied(key, fence));
                    }
                    return Ok(ended.clone());
                }
                _ => {
                    if let Some(refusal) = state.holder_refusal(key, fence, lease_id) {
                        return Err(refusal);
                    }
                }
            }
        }
        Err(raced(key))
    }

    /// Why `fence`/`lease_id` is not the live term of `key`, or `None` if it
    /// now is.
    pub(crate) async fn holder_refusal(
        &self,
        client: &mut Client,
        key: &Key,
        fence: Fence,
        lease_id: LeaseId,
    ) -> Result<Option<Error>> {
        let snapshot = self.read_key_served(client, key).await?;
        Ok(snapshot.key.holder_refusal(key, fence, lease_id))
    }

    pub(crate) async fn check(&self, key: &Key, fence: Fence) -> Result<Term> {
        let mut client = self.client().await?;
        let snapshot = self.read_key_served(&mut client, key).await?;
        match snapshot.key.live {
            Some(term) if term.fence == fence => Ok(term),
            _ => Err(key_row::stale(key, fence, snapshot.key.stale_reason(fence))),
        }
    }
}

pub(crate) fn raced(key: &Key) -> Error {
    Error::Unavailable(format!(
        "key {key:?} changed {RACE_RETRIES} times under this request; retry"
    ))
}
