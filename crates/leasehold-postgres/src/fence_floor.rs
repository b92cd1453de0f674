//! `serve --fence-floor` on PostgreSQL: the schema's `fences` sequence, from
//! which every server of the fleet draws its fences, raised at start-up.
//!
//! One short transaction: lock the sequence against `nextval`
//! ([`sql::FENCE_FLOOR_LOCK`]), read it, and set it to the greater of the
//! floor and its value ([`sql::FENCE_FLOOR_RAISE`]). The servers already
//! running wait for it in their next grant (for at most the lock timeout),
//! then draw above the floor too. The commit makes it durable; the role
//! must own the sequence (the one that ran the migrations does).

use deadpool_postgres::Object;
use leasehold_backend::{FenceFloor, MAX_FENCE_FLOOR};
use leasehold_core::store::StoreError;

use super::sql;

/// Raises the fence sequence so every fence drawn from now on is above
/// `floor`; a floor at or below it changes nothing.
///
/// # Errors
/// [`StoreError::Io`] when the floor is above [`MAX_FENCE_FLOOR`], the
/// sequence stays locked by others beyond the lock timeout, or a statement
/// fails (for example when the role does not own the sequence).
pub async fn raise(client: &mut Object, floor: u64) -> Result<FenceFloor, StoreError> {
    if floor > MAX_FENCE_FLOOR {
        return Err(StoreError::Io(format!(
            "fence floor {floor} is above the highest accepted, {MAX_FENCE_FLOOR}"
        )));
    }
    let failed = |what: &'static str| {
        move |e: tokio_postgres::Error| {
            StoreError::Io(format!(
                "raising the fence floor ({what}): {}",
                super::pg_message(&e)
            ))
        }
    };
    let tx = client.transaction().await.map_err(failed("begin"))?;
    // The fleet's grants wait behind this lock: give up rather than stall
    // them for long behind a transaction that holds the sequence.
    tx.batch_execute("SET LOCAL lock_timeout = '5s'")
        .await
        .map_err(failed("lock timeout"))?;
    tx.batch_execute(sql::FENCE_FLOOR_LOCK)
        .await
        .map_err(failed("locking the fences sequence"))?;
    let before: i64 = tx
        .query_one(sql::FENCE_FLOOR_BEFORE, &[])
        .await
        .map_err(failed("reading the fences sequence"))?
        .get(0);
    tx.query_one(sql::FENCE_FLOOR_RAISE, &[&(floor as i64)])
        .await
        .map_err(failed("setting the fences sequence"))?;
    tx.commit().await.map_err(failed("commit"))?;
    Ok(FenceFloor {
        floor,
        before: before as u64,
    })
}
