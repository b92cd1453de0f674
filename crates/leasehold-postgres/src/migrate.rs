//! Schema migrations, applied at start-up.
//!
//! **Never remove or reorder an entry of [`MIGRATIONS`]**: only append. The
//! versions applied are rows of `leasehold_migrations` in the backend's
//! schema; each migration runs in its own transaction with its row. Every
//! server runs this at start-up under a transaction-independent advisory
//! lock named after the schema, so servers starting together apply each
//! migration once, one after the other; a schema at a higher version than
//! this build knows is refused rather than touched.

use deadpool_postgres::Object;
use leasehold_core::store::StoreError;

use super::sql;

/// The migrations, in order: entry `i` takes the schema to version `i + 1`.
pub const MIGRATIONS: &[&str] = &[
    include_str!("../../../migrations/postgres/0001_leases.sql"),
    include_str!("../../../migrations/postgres/0002_tool_calls.sql"),
    include_str!("../../../migrations/postgres/0003_lifecycle.sql"),
    include_str!("../../../migrations/postgres/0004_tool_call_turns.sql"),
    include_str!("../../../migrations/postgres/0005_events.sql"),
    include_str!("../../../migrations/postgres/0006_event_batches.sql"),
    include_str!("../../../migrations/postgres/0007_event_log_batches.sql"),
    include_str!("../../../migrations/postgres/0008_history_ring.sql"),
    include_str!("../../../migrations/postgres/0009_waiter_grant_taken.sql"),
];

/// Creates `schema` if needed and brings it to the newest version.
///
/// # Errors
/// [`StoreError::TooNew`] when the schema is newer than this build;
/// [`StoreError::Io`] when a statement fails.
pub async fn migrate(client: &mut Object, schema: &str, origin: &str) -> Result<(), StoreError> {
    let lock_name = format!("leasehold-migrate:{schema}");
    client
        .execute(sql::MIGRATION_LOCK, &[&lock_name])
        .await
        .map_err(io("taking the migration lock"))?;
    let migrated = apply(client, schema, origin).await;
    // Unlock even after a failure; a dropped connection unlocks by itself.
    let unlocked = client
        .execute(sql::MIGRATION_UNLOCK, &[&lock_name])
        .await
        .map_err(io("releasing the migration lock"));
    migrated.and(unlocked.map(drop))
}

async fn apply(client: &mut Object, schema: &str, origin: &str) -> Result<(), StoreError> {
    client
        .batch_execute(&sql::create_schema(schema))
        .await
        .map_err(io("creating the schema"))?;
    let found: i32 = client
        .query_one(&sql::schema_version(schema), &[])
        .await
        .map_err(io("reading the schema version"))?
        .get(0);
    let supported = MIGRATIONS.len() as i32;
    if found > supported {
        return Err(StoreError::TooNew {
            path: format!("{origin} (schema {schema})"),
            found: found.into(),
            supported: supported.into(),
        });
    }
    for (index, migration) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        let version = index as i32 + 1;
        let tx = client
            .transaction()
            .await
            .map_err(io("starting a migration"))?;
        // The connection's search_path names the schema, so the migration's
        // unqualified names land in it.
        tx.batch_execute(migration).await.map_err(|e| {
            StoreError::Io(format!("migration {version}: {}", super::pg_message(&e)))
        })?;
        tx.execute(&sql::record_version(schema), &[&version])
            .await
            .map_err(io("recording a migration"))?;
        tx.commit().await.map_err(io("committing a migration"))?;
        tracing::info!(schema, version, "PostgreSQL schema migrated");
    }
    Ok(())
}

/// A failed statement, saying which step failed.
fn io(what: &'static str) -> impl Fn(tokio_postgres::Error) -> StoreError {
    move |e| StoreError::Io(format!("{what}: {}", super::pg_message(&e)))
}
