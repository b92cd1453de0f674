//! Renew, release, check, get, list, and the sweeper: each a conditional
//! statement on one row, and on refusal a read of the row that explains it.

use super::line::serve_first_in;
use super::*;
use leasehold_core::stored::Stored;

impl Inner {
    pub(super) async fn renew(
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

    pub(super) async fn release(
        &self,
        key: &Key,
        fence: Fence,
        lease_id: LeaseId,
        suspend: bool,
        handoff: Option<Handoff>,
    ) -> Result<EndedTerm> {
        let end = if suspend {
            TermEnd::Suspended
        } else {
            TermEnd::Released
        };
        // The common case, nobody in line: one autocommit statement, shared
        // with this server's other releases (see `batch`).
        if let Some(ended) = self
            .release_batched(key, fence, lease_id, end, handoff.as_ref())
            .await?
        {
            return Ok(ended);
        }
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
                        return Err(row::denied(key, fence));
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
    pub(super) async fn holder_refusal(
        &self,
        client: &mut Client,
        key: &Key,
        fence: Fence,
        lease_id: LeaseId,
    ) -> Result<Option<Error>> {
        let snapshot = self.read_key_served(client, key).await?;
        Ok(snapshot.key.holder_refusal(key, fence, lease_id))
    }

    pub(super) async fn check(&self, key: &Key, fence: Fence) -> Result<Term> {
        let mut client = self.client().await?;
        let snapshot = self.read_key_served(&mut client, key).await?;
        match snapshot.key.live {
            Some(term) if term.fence == fence => Ok(term),
            _ => Err(row::stale(key, fence, snapshot.key.stale_reason(fence))),
        }
    }

    /// Up to `page_size` ended terms of `key`, newest first, with fences
    /// below `before` when given (of the newest `history_len`).
    pub(super) async fn history(
        &self,
        key: &Key,
        before: Option<Fence>,
        page_size: usize,
    ) -> Result<HistoryPage> {
        let limit = leasehold_core::lessor::page_limit(page_size)?;
        let mut client = self.client().await?;
        // An expiry nobody moved yet is in the history too.
        let snapshot = self.read_key_served(&mut client, key).await?;
        if !snapshot.found {
            return Err(Error::NotFound(key.clone()));
        }
        let stmt = client
            .prepare_cached(sql::HISTORY)
            .await
            .map_err(db_error)?;
        let before = before.map_or(i64::MAX, |f| f.0.min(i64::MAX as u64) as i64);
        let rows = client
            .query(
                &stmt,
                &[
                    &key.as_str(),
                    &self.history_len(),
                    &before,
                    &((limit + 1) as i64),
                ],
            )
            .await
            .map_err(db_error)?;
        let mut page = HistoryPage::default();
        for row in rows.iter().take(limit) {
            page.entries.push(row::history_entry(row)?);
        }
        if rows.len() > limit {
            page.next_before = page.entries.last().map(|h| h.fence);
        }
        Ok(page)
    }

    /// Lifts `key`'s quarantine and resets its failure count (an expiry
    /// nobody moved yet is moved first, so it cannot quarantine the key
    /// again afterwards), then hands the key to the first waiter who may
    /// take it.
    pub(super) async fn unquarantine(&self, key: &Key) -> Result<KeyView> {
        let mut client = self.client().await?;
        let history_len = self.history_len();
        let tx = client.transaction().await.map_err(db_error)?;
        let expire = tx.prepare_cached(sql::EXPIRE_KEY).await.map_err(db_error)?;
        tx.query_opt(&expire, &[&key.as_str(), &history_len])
            .await
            .map_err(db_error)?;
        let lift = tx
            .prepare_cached(sql::LIFT_QUARANTINE)
            .await
            .map_err(db_error)?;
        if tx
            .query_opt(&lift, &[&key.as_str()])
            .await
            .map_err(db_error)?
            .is_none()
        {
            tx.rollback().await.map_err(db_error)?;
            return Err(Error::NotFound(key.clone()));
        }
        serve_first_in(&tx, &self.channel, key, history_len).await?;
        let notify = tx.prepare_cached(sql::NOTIFY).await.map_err(db_error)?;
        tx.execute(&notify, &[&self.channel, &key.as_str()])
            .await
            .map_err(db_error)?;
        tx.commit().await.map_err(db_error)?;
        self.get_with(&mut client, key).await
    }

    pub(super) async fn get(&self, key: &Key) -> Result<KeyView> {
        let mut client = self.client().await?;
        self.get_with(&mut client, key).await
    }

    async fn get_with(&self, client: &mut Client, key: &Key) -> Result<KeyView> {
        let snapshot = self.read_key_served(client, key).await?;
        if !snapshot.found {
            return Err(Error::NotFound(key.clone()));
        }
        Ok(view(key.clone(), snapshot.key))
    }

    pub(super) async fn list(
        &self,
        prefix: String,
        filter: ListFilter,
        after: Option<Key>,
        page_size: usize,
    ) -> Result<ListPage> {
        let limit = leasehold_core::lessor::page_limit(page_size)?;
        let client = self.client().await?;
        let query = match filter {
            ListFilter::All => sql::LIST_ALL,
            ListFilter::Live => sql::LIST_LIVE,
            ListFilter::Recoverable => sql::LIST_RECOVERABLE,
            ListFilter::Quarantined => sql::LIST_QUARANTINED,
        };
        let stmt = client.prepare_cached(query).await.map_err(db_error)?;
        let pattern = like_prefix(&prefix);
        let end = prefix_end(&prefix);
        let after = after.as_ref().map_or("", |k| k.as_str());
        // One more than asked: whether there is a next page.
        let rows = client
            .query(
                &stmt,
                &[&pattern, &prefix, &end, &after, &((limit + 1) as i64)],
            )
            .await
            .map_err(db_error)?;
        let mut page = ListPage::default();
        for row in rows.iter().take(limit) {
            let now = millis(row.get("now"));
            let key = Key::parse(row.get::<_, String>("key"))
                .map_err(|e| Error::Storage(format!("stored key: {e}")))?;
            page.keys.push(view(key, KeyRow::from_row(row)?.at(now)));
        }
        if rows.len() > limit {
            page.next_after = page.keys.last().map(|v| v.key.clone());
        }
        Ok(page)
    }

    /// Moves expired terms to ended (waking their waiters), forgets keys
    /// past their retention, drops waiter rows long dead, numbers the
    /// queued Watch events and trims their log.
    pub(super) async fn sweep(&self) -> Result<()> {
        let client = self.client().await?;
        let expire = client
            .prepare_cached(sql::SWEEP_EXPIRED)
            .await
            .map_err(db_error)?;
        loop {
            let moved = client
                .query(&expire, &[&self.channel, &self.history_len()])
                .await
                .map_err(db_error)?;
            if moved.len() < 1000 {
                break;
            }
        }
        let retention = self.config.retention_ms.min(i64::MAX as u64) as i64;
        let prune = client
            .prepare_cached(sql::PRUNE_SETTLED_CALLS)
            .await
            .map_err(db_error)?;
        client
            .execute(&prune, &[&retention])
            .await
            .map_err(db_error)?;
        let forget = client
            .prepare_cached(sql::FORGET_RELEASED)
            .await
            .map_err(db_error)?;
        client
            .execute(&forget, &[&retention])
            .await
            .map_err(db_error)?;
        let dead = client
            .prepare_cached(sql::DROP_DEAD_WAITERS)
            .await
            .map_err(db_error)?;
        client.execute(&dead, &[]).await.map_err(db_error)?;
        // Number the events queued since, with or without watchers, so the
        // queue stays short and expiries reach watchers within a sweep; and
        // keep the log to this server's length.
        self.sequence(&client).await?;
        self.trim_events(&client).await
    }

    pub(super) async fn sweep_loop(self: Arc<Self>) {
        let mut tick = tokio::time::interval(self.config.sweep_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(e) = in_time(self.config.op_timeout, self.sweep()).await {
                tracing::warn!(error = %e, "sweep failed; trying again");
            }
        }
    }
}

/// The reader's view (never with a lease id leaving the server: the gRPC
/// layer strips it).
pub(super) fn view(key: Key, state: KeyNow) -> KeyView {
    KeyView {
        recoverable: state.recoverable(),
        key,
        live: state.live,
        last_ended: state.last_ended,
        quarantined: state.quarantined,
        reservation: state.reservation,
        visible_seq: 0,
    }
}

pub(super) fn raced(key: &Key) -> Error {
    Error::Unavailable(format!(
        "key {key:?} changed {RACE_RETRIES} times under this request; retry"
    ))
}

/// `prefix` as a LIKE pattern matching every string that starts with it.
pub(super) fn like_prefix(prefix: &str) -> String {
    let mut pattern = String::with_capacity(prefix.len() + 1);
    for c in prefix.chars() {
        if matches!(c, '%' | '_' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push('%');
    pattern
}

/// A string above every string that starts with `prefix` (in byte order,
/// which the `C` collation and UTF-8 share), so List reads one index range.
pub(super) fn prefix_end(prefix: &str) -> String {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = (last as u32 + 1..=char::MAX as u32).find_map(char::from_u32);
        if let Some(next) = next {
            chars.push(next);
            return chars.into_iter().collect();
        }
    }
    // Empty prefix (or only U+10FFFF): above every key, which is at most
    // 1024 bytes, i.e. fewer than 257 four-byte characters.
    std::iter::repeat_n(char::MAX, 257).collect()
}
