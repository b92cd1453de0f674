//! Every SQL statement of the PostgreSQL backend, in one place.
//!
//! Each rule of the contract is one conditional write on one `keys` row:
//! the `WHERE` says when the write is allowed (the key is free or its term
//! expired; the fence and lease_id are the live term's), PostgreSQL's row
//! lock orders concurrent writers, and under READ COMMITTED a writer that
//! waited re-checks the `WHERE` against the row as the other left it. No
//! rule rests on SERIALIZABLE reasoning across rows. Times are
//! `now_ms()`: the database's `clock_timestamp()` in milliseconds.
//!
//! Unqualified names resolve in the backend's schema (each connection's
//! `search_path`).

/// The ended term a grant moves out of the way: an expired live term
/// becomes the last ended one (ended at its deadline); with no live term the
/// last ended term stays.
macro_rules! end_expired_live {
    () => {
        "ended_fence    = CASE WHEN k.live_fence IS NULL THEN k.ended_fence    ELSE k.live_fence END,
         ended_owner    = CASE WHEN k.live_fence IS NULL THEN k.ended_owner    ELSE k.live_owner END,
         ended_lease_id = CASE WHEN k.live_fence IS NULL THEN k.ended_lease_id ELSE k.live_lease_id END,
         ended_end      = CASE WHEN k.live_fence IS NULL THEN k.ended_end      ELSE 3 END,
         ended_at_ms    = CASE WHEN k.live_fence IS NULL THEN k.ended_at_ms    ELSE k.live_expires_at_ms END"
    };
}

/// Counts the key's tool calls still running (for `unsettled_tool_calls`).
macro_rules! unsettled {
    () => {
        "(SELECT count(*) FROM tool_calls t WHERE t.key = k.key AND t.state = 1) AS unsettled"
    };
}

/// The line condition: waiters of the key not yet granted whose server is
/// alive and whose wait has not run out at `$now`.
macro_rules! in_line {
    ($w:literal, $now:literal) => {
        concat!(
            $w,
            ".granted_fence IS NULL AND ",
            $w,
            ".alive_until_ms > ",
            $now,
            " AND ",
            $w,
            ".wait_until_ms > ",
            $now
        )
    };
}

/// Grants a key that is free (no term, or its term expired) and has nobody
/// alive in line, to a newcomer: `$1` key, `$2` owner, `$3` lease_id, `$4`
/// request_id (NULL for none), `$5` ttl_ms. Returns the row after the grant
/// (its ended_* are the grant's `previous`), or nothing when the key is not
/// free for a newcomer.
///
/// The fence is `nextval` in the `DO UPDATE` branch, which PostgreSQL
/// evaluates only after it has locked the row: a grant that waited for the
/// lock cannot carry a fence drawn before the term it replaces.
pub const GRANT: &str = concat!(
    "WITH n AS (SELECT now_ms() AS ms)
     INSERT INTO keys AS k (key, live_fence, live_owner, live_lease_id, live_request_id,
                            live_ttl_ms, live_acquired_at_ms, live_expires_at_ms)
     SELECT $1, nextval('fences'), $2, $3, $4, $5, n.ms, n.ms + $5 FROM n
     ON CONFLICT (key) DO UPDATE SET ",
    end_expired_live!(),
    ",
         live_fence          = nextval('fences'),
         live_owner          = EXCLUDED.live_owner,
         live_lease_id       = EXCLUDED.live_lease_id,
         live_request_id     = EXCLUDED.live_request_id,
         live_ttl_ms         = EXCLUDED.live_ttl_ms,
         live_acquired_at_ms = EXCLUDED.live_acquired_at_ms,
         live_expires_at_ms  = EXCLUDED.live_expires_at_ms
     WHERE (k.live_fence IS NULL OR k.live_expires_at_ms <= EXCLUDED.live_acquired_at_ms)
       AND NOT EXISTS (SELECT 1 FROM waiters w WHERE w.key = k.key AND ",
    in_line!("w", "EXCLUDED.live_acquired_at_ms"),
    ")
     RETURNING k.*, ",
    unsettled!()
);

/// Grants a free key to the first waiter alive in its line: `$1` key, `$2`
/// the new term's lease_id. Returns the waiter's id and the term, or nothing
/// when the key is held or nobody waits. Run in a transaction with
/// [`MARK_GRANTED`] and [`NOTIFY`].
pub const SERVE_FIRST: &str = concat!(
    "WITH n AS (SELECT now_ms() AS ms),
     w AS (SELECT w.id, w.owner, w.ttl_ms, w.request_id FROM waiters w, n
           WHERE w.key = $1 AND ",
    in_line!("w", "n.ms"),
    " ORDER BY w.id LIMIT 1)
     UPDATE keys k SET ",
    end_expired_live!(),
    ",
         live_fence          = nextval('fences'),
         live_owner          = w.owner,
         live_lease_id       = $2,
         live_request_id     = w.request_id,
         live_ttl_ms         = w.ttl_ms,
         live_acquired_at_ms = n.ms,
         live_expires_at_ms  = n.ms + w.ttl_ms
     FROM w, n
     WHERE k.key = $1 AND (k.live_fence IS NULL OR k.live_expires_at_ms <= n.ms)
     RETURNING w.id AS waiter_id, k.live_fence, k.live_lease_id,
               k.live_acquired_at_ms, k.live_expires_at_ms"
);

/// Hands a grant to its waiter row: `$1` waiter id, `$2` fence, `$3`
/// lease_id, `$4` acquired_at, `$5` expires_at.
pub const MARK_GRANTED: &str = "UPDATE waiters SET granted_fence = $2, granted_lease_id = $3,
            granted_acquired_at_ms = $4, granted_expires_at_ms = $5
     WHERE id = $1";

/// Wakes the waiters of key `$2` on every server (delivered at commit):
/// `$1` the schema's channel.
pub const NOTIFY: &str = "SELECT pg_notify($1, $2)";

/// Everything about one key at the database's now, in one row even when the
/// key has no row (`found` is then NULL): `$1` key.
pub const READ_KEY: &str = concat!(
    "SELECT n.ms AS now, k.key AS found, k.*, ",
    unsettled!(),
    ",
            EXISTS (SELECT 1 FROM waiters w WHERE w.key = $1 AND ",
    in_line!("w", "n.ms"),
    ") AS line
     FROM (SELECT now_ms() AS ms) n LEFT JOIN keys k ON k.key = $1"
);

/// Extends the live term: `$1` key, `$2` fence, `$3` lease_id, `$4` new
/// ttl_ms or NULL to keep it. Never moves the deadline earlier.
pub const RENEW: &str = "WITH n AS (SELECT now_ms() AS ms)
     UPDATE keys k SET
         live_ttl_ms        = COALESCE($4::bigint, k.live_ttl_ms),
         live_expires_at_ms = GREATEST(k.live_expires_at_ms, n.ms + COALESCE($4::bigint, k.live_ttl_ms))
     FROM n
     WHERE k.key = $1 AND k.live_fence = $2 AND k.live_lease_id = $3 AND k.live_expires_at_ms > n.ms
     RETURNING k.*";

/// [`RENEW`] for many terms at once: `$1` keys (distinct), `$2` fences, `$3`
/// lease_ids, `$4` ttl_ms or NULL, as arrays of one length. Each row keeps
/// its own condition; a row not returned was not renewed. The rows are
/// locked in key order first, so concurrent batches cannot deadlock.
pub const RENEW_MANY: &str = "WITH n AS (SELECT now_ms() AS ms),
     r AS (SELECT * FROM unnest($1::text[], $2::bigint[], $3::uuid[], $4::bigint[])
           AS r(key, fence, lease_id, ttl_ms)),
     locked AS (SELECT k.key FROM keys k WHERE k.key IN (SELECT key FROM r)
                ORDER BY k.key FOR UPDATE)
     UPDATE keys k SET
         live_ttl_ms        = COALESCE(r.ttl_ms, k.live_ttl_ms),
         live_expires_at_ms = GREATEST(k.live_expires_at_ms, n.ms + COALESCE(r.ttl_ms, k.live_ttl_ms))
     FROM n, r, locked
     WHERE k.key = r.key AND locked.key = r.key
       AND k.live_fence = r.fence AND k.live_lease_id = r.lease_id AND k.live_expires_at_ms > n.ms
     RETURNING k.*";

/// Ends the live term: `$1` key, `$2` fence, `$3` lease_id, `$4` how (1
/// released, 2 suspended).
pub const RELEASE: &str = "WITH n AS (SELECT now_ms() AS ms)
     UPDATE keys k SET
         ended_fence = k.live_fence, ended_owner = k.live_owner, ended_lease_id = k.live_lease_id,
         ended_end = $4, ended_at_ms = n.ms,
         live_fence = NULL, live_owner = NULL, live_lease_id = NULL, live_request_id = NULL,
         live_ttl_ms = NULL, live_acquired_at_ms = NULL, live_expires_at_ms = NULL
     FROM n
     WHERE k.key = $1 AND k.live_fence = $2 AND k.live_lease_id = $3 AND k.live_expires_at_ms > n.ms
     RETURNING k.*";

/// Puts an Acquire in line: `$1` key, `$2` owner, `$3` ttl_ms, `$4`
/// request_id, `$5` wait_ms, `$6` how long the row lives without a
/// heartbeat.
pub const ENQUEUE: &str =
    "INSERT INTO waiters (key, owner, ttl_ms, request_id, wait_until_ms, alive_until_ms)
     SELECT $1, $2, $3, $4, n.ms + $5, n.ms + $6 FROM (SELECT now_ms() AS ms) n
     RETURNING id, wait_until_ms";

/// A waiter's heartbeat, which also tells it whether it was granted: `$1`
/// id, `$2` how long the row lives from now.
pub const HEARTBEAT: &str = "UPDATE waiters SET alive_until_ms = now_ms() + $2 WHERE id = $1
     RETURNING granted_fence, granted_lease_id, granted_acquired_at_ms, granted_expires_at_ms";

/// Leaves the line: `$1` id.
pub const LEAVE: &str = "DELETE FROM waiters WHERE id = $1";

/// Leaves the line unless granted meanwhile: `$1` id. Returns a row when
/// the waiter was still in line.
pub const LEAVE_UNGRANTED: &str =
    "DELETE FROM waiters WHERE id = $1 AND granted_fence IS NULL RETURNING id";

/// The grant of a waiter row (after [`LEAVE_UNGRANTED`] found it granted):
/// `$1` id.
pub const WAITER_GRANT: &str =
    "SELECT granted_fence, granted_lease_id, granted_acquired_at_ms, granted_expires_at_ms
     FROM waiters WHERE id = $1";

/// Moves terms past their deadline to ended (expired) and wakes their
/// waiters, at most 1000 keys a call: `$1` the schema's channel. Returns
/// one row per key it moved. Each row is re-checked under its lock, so a
/// renewal that got there first wins.
pub const SWEEP_EXPIRED: &str = "WITH n AS (SELECT now_ms() AS ms),
     due AS (SELECT k.key FROM keys k
             WHERE k.live_fence IS NOT NULL AND k.live_expires_at_ms <= (SELECT ms FROM n)
             ORDER BY k.live_expires_at_ms LIMIT 1000 FOR UPDATE OF k SKIP LOCKED),
     moved AS (
         UPDATE keys k SET
             ended_fence = k.live_fence, ended_owner = k.live_owner, ended_lease_id = k.live_lease_id,
             ended_end = 3, ended_at_ms = k.live_expires_at_ms,
             live_fence = NULL, live_owner = NULL, live_lease_id = NULL, live_request_id = NULL,
             live_ttl_ms = NULL, live_acquired_at_ms = NULL, live_expires_at_ms = NULL
         FROM due, n
         WHERE k.key = due.key AND k.live_fence IS NOT NULL AND k.live_expires_at_ms <= n.ms
         RETURNING k.key)
     SELECT moved.key, pg_notify($1, moved.key) FROM moved";

/// Retention, step 1: drops the settled tool calls of keys released cleanly
/// at least `$1` ms ago.
pub const PRUNE_SETTLED_CALLS: &str = "DELETE FROM tool_calls t USING keys k
     WHERE t.key = k.key AND t.state <> 1
       AND k.live_fence IS NULL AND k.ended_end = 1 AND k.ended_at_ms <= (SELECT now_ms() - $1)";

/// Retention, step 2: forgets keys released cleanly at least `$1` ms ago
/// that have no running tool calls and nobody in line. The fence sequence
/// lives apart from the rows, so a forgotten key's fences are never reused.
pub const FORGET_RELEASED: &str = "DELETE FROM keys k
     WHERE k.live_fence IS NULL AND k.ended_end = 1 AND k.ended_at_ms <= (SELECT now_ms() - $1)
       AND NOT EXISTS (SELECT 1 FROM tool_calls t WHERE t.key = k.key)
       AND NOT EXISTS (SELECT 1 FROM waiters w WHERE w.key = k.key AND w.granted_fence IS NULL)";

/// Waiter rows whose server stopped keeping them alive (or whose grant was
/// never picked up) for a minute.
pub const DROP_DEAD_WAITERS: &str =
    "DELETE FROM waiters WHERE alive_until_ms < (SELECT now_ms() - 60000)";

/// List ALL: `$1` LIKE pattern of the prefix, `$2` the prefix (range start),
/// `$3` the range end, `$4` list after this key ('' for the first page),
/// `$5` how many.
pub const LIST_ALL: &str = "SELECT n.ms AS now, k.* FROM keys k, (SELECT now_ms() AS ms) n
     WHERE k.key >= $2 AND k.key < $3 AND k.key LIKE $1 AND k.key > $4
     ORDER BY k.key LIMIT $5";

/// List LIVE, parameters as [`LIST_ALL`].
pub const LIST_LIVE: &str = "SELECT n.ms AS now, k.* FROM keys k, (SELECT now_ms() AS ms) n
     WHERE k.key >= $2 AND k.key < $3 AND k.key LIKE $1 AND k.key > $4
       AND k.live_fence IS NOT NULL AND k.live_expires_at_ms > n.ms
     ORDER BY k.key LIMIT $5";

/// List RECOVERABLE, parameters as [`LIST_ALL`]. Each half reads through
/// its own partial index: `keys_recoverable` (last term expired or
/// suspended) in key order, and `keys_deadline` for terms past their
/// deadline that the sweeper has not moved yet (at most 1000 of them, the
/// earliest; a mass expiry beyond that shows up as the sweeper catches up).
/// `now` is read once, and used as a plan parameter (an InitPlan), so the
/// deadline half is an index range, not a scan of every live key.
pub const LIST_RECOVERABLE: &str = "WITH n AS (SELECT now_ms() AS ms)
     SELECT * FROM (
         (SELECT n.ms AS now, k.* FROM keys k, n
          WHERE k.live_fence IS NULL AND k.ended_end IN (2, 3)
            AND k.key >= $2 AND k.key < $3 AND k.key LIKE $1 AND k.key > $4
          ORDER BY k.key LIMIT $5)
         UNION ALL
         (SELECT n.ms AS now, d.* FROM n,
                 (SELECT * FROM keys k
                  WHERE k.live_fence IS NOT NULL AND k.live_expires_at_ms <= (SELECT ms FROM n)
                  ORDER BY k.live_expires_at_ms LIMIT 1000) d
          WHERE d.key >= $2 AND d.key < $3 AND d.key LIKE $1 AND d.key > $4
          ORDER BY d.key LIMIT $5)
     ) r ORDER BY r.key LIMIT $5";

/// Locks the live term for the rest of the transaction, so no release or
/// grant can commit between this check and the ledger write: `$1` key,
/// `$2` fence, `$3` lease_id. Returns `now` when the term is live.
pub const LOCK_LIVE_TERM: &str = "SELECT n.ms AS now FROM keys k, (SELECT now_ms() AS ms) n
     WHERE k.key = $1 AND k.live_fence = $2 AND k.live_lease_id = $3 AND k.live_expires_at_ms > n.ms
     FOR SHARE OF k";

/// The key's calls among `$2` (call ids): `$1` key.
pub const CALLS_BY_ID: &str = "SELECT * FROM tool_calls WHERE key = $1 AND call_id = ANY($2)";

/// Draws `$1` registration ordinals, in order.
pub const ORDINALS: &str =
    "SELECT nextval('tool_call_ordinals') AS ordinal FROM generate_series(1, $1::int) ORDER BY 1";

/// Records calls as running: `$1` key, `$2` call ids, `$3` names, `$4` input
/// digests, `$5` ordinals, `$6` fence, `$7` begun_at.
pub const INSERT_CALLS: &str =
    "INSERT INTO tool_calls (key, call_id, ordinal, name, input_digest, fence, state,
                             result_digest, result, begun_at_ms)
     SELECT $1, c.call_id, c.ordinal, c.name, c.input_digest, $6, 1, '', ''::bytea, $7
     FROM unnest($2::text[], $3::text[], $4::text[], $5::bigint[])
          AS c(call_id, name, input_digest, ordinal)";

/// Settles a running call under the live term, in one statement that locks
/// the term first: `$1` key, `$2` fence, `$3` lease_id, `$4` call id, `$5`
/// state, `$6` result digest, `$7` result. Returns the call, or nothing
/// when the term is not live or the call is not running.
pub const SETTLE: &str = "WITH n AS (SELECT now_ms() AS ms),
     term AS (SELECT k.key FROM keys k, n
              WHERE k.key = $1 AND k.live_fence = $2 AND k.live_lease_id = $3
                AND k.live_expires_at_ms > n.ms
              FOR SHARE OF k)
     UPDATE tool_calls t SET state = $5, settled_fence = $2, result_digest = $6, result = $7,
                             settled_at_ms = n.ms
     FROM term, n
     WHERE t.key = term.key AND t.call_id = $4 AND t.state = 1
     RETURNING t.*";

/// One call: `$1` key, `$2` call id.
pub const CALL: &str = "SELECT * FROM tool_calls WHERE key = $1 AND call_id = $2";

/// Whether the key has a row: `$1` key.
pub const KEY_EXISTS: &str = "SELECT EXISTS (SELECT 1 FROM keys WHERE key = $1)";

/// The key's calls in registration order: `$1` key.
pub const CALLS: &str = "SELECT * FROM tool_calls WHERE key = $1 ORDER BY ordinal";

/// The key's running calls in registration order: `$1` key.
pub const RUNNING_CALLS: &str =
    "SELECT * FROM tool_calls WHERE key = $1 AND state = 1 ORDER BY ordinal";

/// Migrations, step 0: the schema and the table of versions applied. `{schema}`
/// is a checked plain identifier (see `check_schema_name`).
pub fn create_schema(schema: &str) -> String {
    format!(
        "CREATE SCHEMA IF NOT EXISTS {schema};
         CREATE TABLE IF NOT EXISTS {schema}.leasehold_migrations (
             version    integer PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
         );"
    )
}

/// The schema's version (0 when new).
pub fn schema_version(schema: &str) -> String {
    format!("SELECT coalesce(max(version), 0) FROM {schema}.leasehold_migrations")
}

/// Records migration `$1` as applied.
pub fn record_version(schema: &str) -> String {
    format!("INSERT INTO {schema}.leasehold_migrations (version) VALUES ($1)")
}

/// The advisory lock that serialises migrations of one schema across
/// servers (session-level: taken and released on one connection): `$1` a
/// name naming the schema.
pub const MIGRATION_LOCK: &str = "SELECT pg_advisory_lock(hashtextextended($1, 0))";
pub const MIGRATION_UNLOCK: &str = "SELECT pg_advisory_unlock(hashtextextended($1, 0))";
