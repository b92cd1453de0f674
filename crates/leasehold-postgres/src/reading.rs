//! What a reader (or an operator) asks of keys: Get, List and History, each
//! on a key brought up to date first (an expiry nobody moved yet is moved,
//! the line served), and Unquarantine.

use leasehold_core::error::{Error, Result};
use leasehold_core::lease::{Fence, Key};
use leasehold_core::lessor::{HistoryPage, KeyView, ListFilter, ListPage};

use crate::db::{Client, Db, db_error, serve_first_in};
use crate::key_row::{self, KeyNow, KeyRow, millis};
use crate::sql;

impl Db {
    /// Up to `page_size` ended terms of `key`, newest first, with fences
    /// below `before` when given (of the newest `history_len`).
    pub(crate) async fn history(
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
            page.entries.push(key_row::history_entry(row)?);
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
    pub(crate) async fn unquarantine(&self, key: &Key) -> Result<KeyView> {
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

    pub(crate) async fn get(&self, key: &Key) -> Result<KeyView> {
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

    pub(crate) async fn list(
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
}

/// The reader's view (never with a lease id leaving the server: the gRPC
/// layer strips it).
pub(crate) fn view(key: Key, state: KeyNow) -> KeyView {
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

/// `prefix` as a LIKE pattern matching every string that starts with it.
pub(crate) fn like_prefix(prefix: &str) -> String {
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
pub(crate) fn prefix_end(prefix: &str) -> String {
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
