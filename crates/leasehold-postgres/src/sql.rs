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
//!
//! Stored codes (a term's end, a call's state, a reservation's kind, an
//! event's kind) are named, `stored!(TermEnd::Expired)`, never written as
//! numbers: `leasehold_core::stored` is their one table.

use leasehold_core::stored;

/// The `keys` columns that place the history entry of the term a statement
/// ends (migration 0008): when `$moved` (the term moves from live to ended
/// in this statement; nobody else records it) the entry gets the next
/// position of the key's ring of `$len` (the server's history length)
/// slots; otherwise they stay, and `history_rotated` is cleared.
///
/// A ring only grows: with `$len` above the ring's length, the ring grows
/// to `$len` and its entries are renumbered from position 0, oldest first
/// (`history_ends` becomes how many it held, plus this one). A ring that
/// had wrapped at a position other than 0 cannot be renumbered in place,
/// so it gets a new base past its old slots and `history_rotated` says
/// where its oldest entry was, for `record_history!` to move its rows
/// there in the same statement. With `$len` at or below the ring's length
/// the entry simply takes the next position of the ring as it is.
/// `history_ends` is kept at most twice the ring's length (less the length
/// once past it: the position, and whether the ring is full, stay), so it
/// fits an `integer` (every column here adds to each `keys` update).
macro_rules! ring_advance {
    ($moved:literal, $len:literal) => {
        concat!(
            "history_slots = CASE WHEN ", $moved, " THEN GREATEST(k.history_slots, ", $len, ")
                              ELSE k.history_slots END,
         history_ends = CASE WHEN NOT ", $moved, " THEN k.history_ends
                             WHEN ", $len, " > k.history_slots
                             THEN LEAST(k.history_ends, k.history_slots) + 1
                             WHEN k.history_ends >= 2 * k.history_slots
                             THEN k.history_ends + 1 - k.history_slots
                             ELSE k.history_ends + 1 END,
         history_base = CASE WHEN ", $moved, " AND ", $len, " > k.history_slots
                                  AND k.history_ends > k.history_slots
                                  AND k.history_ends % NULLIF(k.history_slots, 0) <> 0
                             THEN k.history_base + k.history_slots
                             ELSE k.history_base END,
         history_rotated = CASE WHEN ", $moved, " AND ", $len, " > k.history_slots
                                     AND k.history_ends > k.history_slots
                                     AND k.history_ends % NULLIF(k.history_slots, 0) <> 0
                                THEN (k.history_ends % NULLIF(k.history_slots, 0))::integer END"
        )
    };
}

/// The quarantine rule, `leasehold_core::lease::earns_quarantine`, for
/// row `k`'s (or the row alias given) live term ending failed (suspended
/// or expired): that failure, counted, reaches the term's recovery limit
/// (NULL or 0: none). The grant stores the limit in force (the term's or
/// the server's default) as `live_max_recoveries`.
macro_rules! earns_quarantine {
    () => {
        earns_quarantine!(k)
    };
    ($row:ident) => {
        concat!(
            "(COALESCE(",
            stringify!($row),
            ".live_max_recoveries, 0) > 0 AND ",
            stringify!($row),
            ".failures + 1 >= ",
            stringify!($row),
            ".live_max_recoveries)"
        )
    };
}

/// The ended term a grant moves out of the way: an expired live term
/// becomes the last ended one (ended at its deadline), with its failure
/// counted and the quarantine it earns; with no live term the last ended
/// term stays. (The grant then clears any reservation, and a term's
/// lock-delay only keeps others out: the `WHERE` of the grant checks it.)
macro_rules! end_expired_live {
    ($len:literal) => {
        concat!(
            ring_advance!("(k.live_fence IS NOT NULL AND k.live_acquired_at_ms IS NOT NULL)", $len),
            ",
         ended_fence    = CASE WHEN k.live_fence IS NULL THEN k.ended_fence    ELSE k.live_fence END,
         ended_owner    = CASE WHEN k.live_fence IS NULL THEN k.ended_owner    ELSE k.live_owner END,
         ended_lease_id = CASE WHEN k.live_fence IS NULL THEN k.ended_lease_id ELSE k.live_lease_id END,
         ended_end      = CASE WHEN k.live_fence IS NULL THEN k.ended_end      ELSE ", stored!(TermEnd::Expired), " END,
         ended_at_ms    = CASE WHEN k.live_fence IS NULL THEN k.ended_at_ms    ELSE k.live_expires_at_ms END,
         ended_acquired_at_ms = CASE WHEN k.live_fence IS NULL THEN k.ended_acquired_at_ms
                                     ELSE k.live_acquired_at_ms END,
         ended_handed_off = CASE WHEN k.live_fence IS NULL THEN k.ended_handed_off
                                 ELSE k.live_handed_off END,
         failures       = CASE WHEN k.live_fence IS NULL THEN k.failures ELSE k.failures + 1 END,
         quarantined    = CASE WHEN k.live_fence IS NULL THEN k.quarantined
                               ELSE k.quarantined OR ", earns_quarantine!(), " END,
         reserved_kind = NULL, reserved_after_fence = NULL, reserved_successor = NULL,
         reserved_until_ms = NULL"
        )
    };
}

/// Moves a live term that is past its deadline to ended (expired): its
/// failure counted, the quarantine it earns, and its lock-delay (a
/// reservation from its deadline) if it asked for one.
macro_rules! expire_live {
    ($len:literal) => {
        concat!(
            ring_advance!("(k.live_acquired_at_ms IS NOT NULL)", $len),
            ",
         ended_fence = k.live_fence, ended_owner = k.live_owner, ended_lease_id = k.live_lease_id,
         ended_end = ", stored!(TermEnd::Expired), ", ended_at_ms = k.live_expires_at_ms,
         ended_acquired_at_ms = k.live_acquired_at_ms, ended_handed_off = k.live_handed_off,
         failures = k.failures + 1,
         quarantined = k.quarantined OR ", earns_quarantine!(), ",
         reserved_kind        = CASE WHEN k.live_lock_delay_ms > 0 THEN ", stored!(ReservationKind::LockDelay), " END,
         reserved_after_fence = CASE WHEN k.live_lock_delay_ms > 0 THEN k.live_fence END,
         reserved_successor   = NULL,
         reserved_until_ms    = CASE WHEN k.live_lock_delay_ms > 0
                                     THEN k.live_expires_at_ms + k.live_lock_delay_ms END,
         live_fence = NULL, live_owner = NULL, live_lease_id = NULL, live_request_id = NULL,
         live_ttl_ms = NULL, live_acquired_at_ms = NULL, live_expires_at_ms = NULL,
         live_lock_delay_ms = 0, live_max_recoveries = NULL, live_handed_off = false"
        )
    };
}

/// Ends row `k`'s live term at `n.ms` as `$end` says (1 released, 2
/// suspended), keeping the key for `$successor` (NULL: nobody) for
/// `$for_ms`: a clean release resets the failure count and lifts a
/// quarantine; a suspension counts as a failure.
macro_rules! end_live {
    ($end:literal, $successor:literal, $for_ms:literal, $len:literal) => {
        concat!(
            ring_advance!("(k.live_acquired_at_ms IS NOT NULL)", $len),
            ",
         ended_fence = k.live_fence, ended_owner = k.live_owner, ended_lease_id = k.live_lease_id,
         ended_end = ", $end, ", ended_at_ms = n.ms,
         ended_acquired_at_ms = k.live_acquired_at_ms, ended_handed_off = k.live_handed_off,
         failures = CASE WHEN ", $end, " = ", stored!(TermEnd::Released), " THEN 0 ELSE k.failures + 1 END,
         quarantined = CASE WHEN ", $end, " = ", stored!(TermEnd::Released), " THEN false
                            ELSE k.quarantined OR ", earns_quarantine!(), " END,
         reserved_kind        = CASE WHEN ", $successor, " IS NULL THEN NULL ELSE ", stored!(ReservationKind::Handoff), " END,
         reserved_after_fence = CASE WHEN ", $successor, " IS NULL THEN NULL ELSE k.live_fence END,
         reserved_successor   = ", $successor, ",
         reserved_until_ms    = CASE WHEN ", $successor, " IS NULL THEN NULL ELSE n.ms + ", $for_ms, " END,
         live_fence = NULL, live_owner = NULL, live_lease_id = NULL, live_request_id = NULL,
         live_ttl_ms = NULL, live_acquired_at_ms = NULL, live_expires_at_ms = NULL,
         live_lock_delay_ms = 0, live_max_recoveries = NULL, live_handed_off = false"
        )
    };
}

/// Whether row `k` is quarantined at `$now`, counting the failure of a live
/// term past its deadline that nobody has moved to ended yet.
macro_rules! quarantined_at {
    ($now:literal) => {
        concat!(
            "COALESCE(k.quarantined OR (k.live_fence IS NOT NULL AND k.live_expires_at_ms <= ",
            $now,
            " AND ",
            earns_quarantine!(),
            "), false)"
        )
    };
}

/// Whether `$owner` may take row `k` at `$now` as far as terms and
/// reservations go: no term (and no reservation in force but a handoff to
/// `$owner`), or a term past its deadline and its lock-delay.
macro_rules! takeable_by {
    ($now:literal, $owner:literal) => {
        concat!(
            "COALESCE((k.live_fence IS NULL AND (k.reserved_until_ms IS NULL OR k.reserved_until_ms <= ",
            $now,
            " OR (k.reserved_kind = ",
            stored!(ReservationKind::Handoff),
            " AND k.reserved_successor = ",
            $owner,
            "))) OR (k.live_fence IS NOT NULL AND k.live_expires_at_ms + k.live_lock_delay_ms <= ",
            $now,
            "), false)"
        )
    };
}

/// Whether row `k` is reserved for `$owner` by a handoff in force at `$now`.
macro_rules! handoff_to {
    ($now:literal, $owner:literal) => {
        concat!(
            "COALESCE(k.live_fence IS NULL AND k.reserved_kind = ",
            stored!(ReservationKind::Handoff),
            " AND k.reserved_until_ms > ",
            $now,
            " AND k.reserved_successor = ",
            $owner,
            ", false)"
        )
    };
}

/// CTEs that record the ended term of each row of CTE `$rows` (a `keys`
/// row after a write that set its ring columns with [`ring_advance`]) in
/// the key's ring of `term_history` rows (migration 0008).
/// `history_added` returns the entries added: the terms this statement
/// ended (see `queue_grant_events!`).
///
/// The entry goes to the slot of ring position `history_ends - 1`: a new
/// row while the ring fills, and from then on the oldest entry's row,
/// updated in place without changing an indexed column (HOT, and no
/// trim). Readers order by fence, so the slot order never shows.
/// `history_regrown` moves the rows of a ring that [`ring_advance`] grew
/// after it had wrapped to their new positions, oldest first (from their
/// slots alone, so a row updated since the snapshot moves right too).
///
/// Three forms, by what the statement's snapshot may have missed:
/// - `released`: a release ends a term that was granted (and so every
///   earlier entry of the key written) before the statement began, and
///   no entry of the key can be written while that term is live, so the
///   snapshot sees every slot: a plain `UPDATE` of a full ring's slot (no
///   row lock record, no speculative insertion), a plain `INSERT` while it
///   fills (a duplicate would fail the statement, not pass silently), and
///   an `INSERT` too for a full ring's slot that has no row (see below).
/// - `$rows` alone: an expiry moved by the sweeper or by a read. The term
///   it moves may have been granted, and a slot filled, after the
///   statement's snapshot (while it waited for the key's row lock, or for
///   another key's in a batch), which an `UPDATE` would not see: `INSERT
///   … ON CONFLICT (key, slot) DO UPDATE` does. A term moved by this
///   statement cannot have been recorded before (a term ends once, under
///   its row lock, and fences are never reused). For the same reason
///   (here and in the next form) `history_regrown` can miss a row filled
///   after the snapshot (only when two terms of the key ended while this
///   statement waited, and the ring grows in it): that row stays below the
///   new ring's slots (a real entry, still read by fence, never
///   overwritten, deleted with the key), and its position in the new
///   ring, which has no row, gets one when the ring comes round to it.
/// - with `$which`: a grant or a served waiter, whose rows offered may
///   carry a term ended earlier (it replaces an expired term, or finds one
///   the sweeper moved and recorded already); `$which` narrows the rows
///   offered (a grant only ever ends an expired term: `r.ended_end` is expired
///   spares the hot path of a key released and taken again a look at the
///   ring). A term someone else moved did not advance the ring, so its
///   slot is the newest entry's, which holds that very term: the
///   conflict's `WHERE` (the slot holds an older fence) leaves it alone,
///   and each term is recorded once.
macro_rules! record_history {
    (released $rows:literal) => {
        concat!(
            history_regrown!($rows),
            ",
             history_overwritten AS (
                UPDATE term_history h
                SET fence = r.ended_fence, owner = r.ended_owner,
                    acquired_at_ms = r.ended_acquired_at_ms, ended_at_ms = r.ended_at_ms,
                    end_kind = r.ended_end,
                    unsettled_tool_calls =
                        (SELECT count(*) FROM tool_calls t WHERE t.key = r.key AND t.state = ",
            stored!(CallState::Running),
            "),
                    handed_off = r.ended_handed_off
                FROM ",
            $rows,
            " r
                WHERE r.ended_fence IS NOT NULL AND r.ended_acquired_at_ms IS NOT NULL
                  AND r.history_ends - 1 >= r.history_slots
                  AND h.key = r.key AND h.slot = r.history_base + (r.history_ends - 1) % r.history_slots
                RETURNING h.key),
             ",
            history_insert!(
                $rows,
                "(r.history_ends - 1 < r.history_slots
                  OR NOT EXISTS (SELECT 1 FROM history_overwritten o WHERE o.key = r.key))",
                ""
            )
        )
    };
    ($rows:literal) => {
        concat!(
            history_regrown!($rows),
            ",
             ",
            history_insert!($rows, "r.history_ends > 0", history_upsert!(""))
        )
    };
    ($rows:literal, $which:expr) => {
        concat!(
            history_regrown!($rows),
            ",
             ",
            history_insert!(
                $rows,
                concat!("r.history_ends > 0 AND ", $which),
                history_upsert!("WHERE term_history.fence < EXCLUDED.fence")
            )
        )
    };
}

/// `record_history!`'s move of a regrown ring's rows.
macro_rules! history_regrown {
    ($rows:literal) => {
        concat!(
            "history_regrown AS (
                UPDATE term_history h
                SET slot = r.history_base
                           + (h.slot - (r.history_base - (r.history_ends - 1)) - r.history_rotated
                              + (r.history_ends - 1)) % (r.history_ends - 1)
                FROM ",
            $rows,
            " r
                WHERE r.history_rotated IS NOT NULL AND h.key = r.key
                  AND h.slot >= r.history_base - (r.history_ends - 1) AND h.slot < r.history_base)"
        )
    };
}

/// `record_history!`'s insert of the entries of `$rows` that `$which`
/// picks, with `$conflict` (or none).
macro_rules! history_insert {
    ($rows:literal, $which:expr, $conflict:expr) => {
        concat!(
            "history_added AS (
                INSERT INTO term_history (key, slot, fence, owner, acquired_at_ms, ended_at_ms,
                                          end_kind, unsettled_tool_calls, handed_off)
                SELECT r.key, r.history_base + (r.history_ends - 1) % r.history_slots,
                       r.ended_fence, r.ended_owner, r.ended_acquired_at_ms, r.ended_at_ms,
                       r.ended_end,
                       (SELECT count(*) FROM tool_calls t WHERE t.key = r.key AND t.state = ",
            stored!(CallState::Running),
            "),
                       r.ended_handed_off
                FROM ",
            $rows,
            " r
                WHERE r.ended_fence IS NOT NULL AND r.ended_acquired_at_ms IS NOT NULL AND ",
            $which,
            "
                ",
            $conflict,
            "
                RETURNING key, fence, owner, ended_at_ms, end_kind)"
        )
    };
}

/// `record_history!`'s overwrite of a ring slot that exists, `$older`
/// its condition.
macro_rules! history_upsert {
    ($older:literal) => {
        concat!(
            "ON CONFLICT (key, slot) DO UPDATE
                SET fence = EXCLUDED.fence, owner = EXCLUDED.owner,
                    acquired_at_ms = EXCLUDED.acquired_at_ms, ended_at_ms = EXCLUDED.ended_at_ms,
                    end_kind = EXCLUDED.end_kind,
                    unsettled_tool_calls = EXCLUDED.unsettled_tool_calls,
                    handed_off = EXCLUDED.handed_off
                ",
            $older
        )
    };
}

/// A CTE that queues the Watch event of each term that ended in CTE `$rows`
/// (`keys` rows after a write that ended their live term: a release or an
/// expiry), for the sequencer to give it a revision (see `events`): one
/// queue row for the statement, its events in key order (migration 0006),
/// none when it ended nothing. The statement that moves a term to ended is
/// the only one to queue its end: the row lock makes that happen once.
macro_rules! queue_end_events {
    ($rows:literal) => {
        concat!(
            "events_queued AS (
                INSERT INTO event_queue (keys, kinds, fences, owners, at_mss)
                SELECT array_agg(r.key ORDER BY r.key), array_agg(r.ended_end + 1 ORDER BY r.key), -- an end's event (leasehold_core::stored)
                       array_agg(r.ended_fence ORDER BY r.key), array_agg(r.ended_owner ORDER BY r.key),
                       array_agg(r.ended_at_ms ORDER BY r.key)
                FROM ",
            $rows,
            " r
                HAVING count(*) > 0)"
        )
    };
}

/// A CTE that queues the Watch events of a grant (CTE `$rows`, the granted
/// `keys` rows) as one queue row: the end of the expired term each grant
/// replaced, if it replaced one, before every grant (so each key's end
/// comes before its grant). Whether a grant ended a term is whether it
/// added that term's history entry (`history_added`, which only the
/// statement that ends a term can add): an expired term moved earlier (by
/// the sweeper, say) was queued by whoever moved it.
macro_rules! queue_grant_events {
    ($rows:literal) => {
        concat!(
            "events_queued AS (
                INSERT INTO event_queue (keys, kinds, fences, owners, at_mss)
                SELECT array_agg(e.key ORDER BY e.step, e.key), array_agg(e.kind ORDER BY e.step, e.key),
                       array_agg(e.fence ORDER BY e.step, e.key), array_agg(e.owner ORDER BY e.step, e.key),
                       array_agg(e.at_ms ORDER BY e.step, e.key)
                FROM (
                    SELECT 0 AS step, h.key, h.end_kind + 1 AS kind, h.fence, h.owner, -- an end's event
                           h.ended_at_ms AS at_ms
                    FROM history_added h
                    UNION ALL
                    SELECT 1, g.key, ",
            stored!(EventKind::Granted),
            ", g.live_fence, g.live_owner, g.live_acquired_at_ms
                    FROM ",
            $rows,
            " g) e
                HAVING count(*) > 0)"
        )
    };
}

/// Counts the key's tool calls still running (for `unsettled_tool_calls`).
macro_rules! unsettled {
    () => {
        concat!(
            "(SELECT count(*) FROM tool_calls t WHERE t.key = k.key AND t.state = ",
            stored!(CallState::Running),
            ") AS unsettled"
        )
    };
}

/// The line condition: waiters of the key not yet granted (nor refused)
/// whose server is alive and whose wait has not run out at `$now`.
macro_rules! in_line {
    ($w:literal, $now:literal) => {
        concat!(
            $w,
            ".granted_fence IS NULL AND NOT ",
            $w,
            ".refused AND ",
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

/// Grants keys to newcomers, each on its own condition, in one statement:
/// `$1` keys (distinct), `$2` owners, `$3` lease_ids, `$4` request_ids
/// (NULL for none), `$5` ttl_ms, `$6` lock_delay_ms, `$7` the terms'
/// recovery limits (NULL: none), `$8` force, as arrays of one length, and
/// `$9` the history length. One request is an array of one; concurrent
/// Acquires of this server share the statement (see `batch`).
///
/// A key must be free for its request: no term, or a term past its
/// deadline and its lock-delay; no reservation but a handoff to this owner;
/// not quarantined (unless forced); and nobody alive in line who could take
/// it, unless the handoff is to this owner (the successor goes ahead of
/// every waiter). Returns the row after each grant (its ended_* are the
/// grant's `previous`); a key not returned was not free for its request.
/// An expired term a grant replaces is recorded (history, failure count,
/// quarantine) in the same statement.
///
/// The fence is `nextval` in the `DO UPDATE` branch, which PostgreSQL
/// evaluates only after it has locked the row: a grant that waited for the
/// lock cannot carry a fence drawn before the term it replaces. Rows are
/// inserted (and so locked) in byte order of their keys, `COLLATE "C"`,
/// the order every statement that locks several keys keeps (`req.key`
/// comes from `unnest`, in the database's default collation, which on an
/// `en_US` or ICU database sorts `a` before `B`; the `keys` column sorts
/// by bytes): `ON CONFLICT DO UPDATE` locks a conflicting row even when
/// its `WHERE` is false, so two servers' batches cannot deadlock.
pub const GRANT: &str = concat!(
    "WITH n AS (SELECT now_ms() AS ms),
     req AS (SELECT * FROM unnest($1::text[], $2::text[], $3::uuid[], $4::text[], $5::bigint[],
                                  $6::bigint[], $7::integer[], $8::boolean[])
             AS req(key, owner, lease_id, request_id, ttl_ms, lock_delay_ms, max_recoveries,
                    force)),
     granted AS (
     INSERT INTO keys AS k (key, live_fence, live_owner, live_lease_id, live_request_id,
                            live_ttl_ms, live_acquired_at_ms, live_expires_at_ms,
                            live_lock_delay_ms, live_max_recoveries)
     SELECT req.key, nextval('fences'), req.owner, req.lease_id, req.request_id, req.ttl_ms,
            n.ms, n.ms + req.ttl_ms, req.lock_delay_ms, req.max_recoveries
     FROM req, n ORDER BY req.key COLLATE \"C\"
     ON CONFLICT (key) DO UPDATE SET ",
    end_expired_live!("$9::bigint"),
    ",
         live_fence          = nextval('fences'),
         live_owner          = EXCLUDED.live_owner,
         live_lease_id       = EXCLUDED.live_lease_id,
         live_request_id     = EXCLUDED.live_request_id,
         live_ttl_ms         = EXCLUDED.live_ttl_ms,
         live_acquired_at_ms = EXCLUDED.live_acquired_at_ms,
         live_expires_at_ms  = EXCLUDED.live_expires_at_ms,
         live_lock_delay_ms  = EXCLUDED.live_lock_delay_ms,
         live_max_recoveries = EXCLUDED.live_max_recoveries,
         live_handed_off     = ",
    handoff_to!("EXCLUDED.live_acquired_at_ms", "EXCLUDED.live_owner"),
    "
     WHERE ",
    takeable_by!("EXCLUDED.live_acquired_at_ms", "EXCLUDED.live_owner"),
    "
       AND ((SELECT req.force FROM req WHERE req.key = EXCLUDED.key) OR NOT ",
    quarantined_at!("EXCLUDED.live_acquired_at_ms"),
    ")
       AND (",
    handoff_to!("EXCLUDED.live_acquired_at_ms", "EXCLUDED.live_owner"),
    " OR NOT EXISTS (SELECT 1 FROM waiters w WHERE w.key = k.key AND ",
    in_line!("w", "EXCLUDED.live_acquired_at_ms"),
    " AND (w.force OR NOT ",
    quarantined_at!("EXCLUDED.live_acquired_at_ms"),
    ")))
     RETURNING k.*, ",
    unsettled!(),
    "),
     ",
    record_history!(
        "granted",
        concat!("r.ended_end = ", stored!(TermEnd::Expired))
    ),
    ",
     ",
    queue_grant_events!("granted"),
    "
     SELECT * FROM granted"
);

/// Grants a free key to the first waiter alive in its line who may take
/// it: `$1` key, `$2` the new term's lease_id, `$3` the history length.
/// While a handoff reserves the key only the successor's rows qualify (the
/// successor goes ahead of every waiter); during a lock-delay nobody; while
/// the key is quarantined only forced Acquires. The others are refused, as
/// the SQLite engine refuses them once the key is free: each sees the free
/// quarantined key itself (`line`), and when a forced waiter takes the key
/// first they are marked refused in this statement. That mark needs the
/// grant's row (`refused` reads `served`), so the key's row is always
/// locked before any waiter row, the order every transaction that touches
/// both keeps: two servers serving one key cannot deadlock.
/// Returns the waiter's id and the term, or nothing when nobody qualifies.
/// Run in a transaction with [`MARK_GRANTED`] and [`NOTIFY`].
pub const SERVE_FIRST: &str = concat!(
    "WITH n AS (SELECT now_ms() AS ms),
     w AS (SELECT w.id, w.owner, w.ttl_ms, w.request_id, w.lock_delay_ms, w.max_recoveries,
                  w.force
           FROM waiters w, n, keys k
           WHERE k.key = $1 AND w.key = $1 AND ",
    in_line!("w", "n.ms"),
    " AND ",
    takeable_by!("n.ms", "w.owner"),
    " AND (w.force OR NOT ",
    quarantined_at!("n.ms"),
    ")
           ORDER BY w.id LIMIT 1),
     served AS (
     UPDATE keys k SET ",
    end_expired_live!("$3::bigint"),
    ",
         live_fence          = nextval('fences'),
         live_owner          = w.owner,
         live_lease_id       = $2,
         live_request_id     = w.request_id,
         live_ttl_ms         = w.ttl_ms,
         live_acquired_at_ms = n.ms,
         live_expires_at_ms  = n.ms + w.ttl_ms,
         live_lock_delay_ms  = w.lock_delay_ms,
         live_max_recoveries = w.max_recoveries,
         live_handed_off     = ",
    handoff_to!("n.ms", "w.owner"),
    "
     FROM w, n
     WHERE k.key = $1 AND ",
    takeable_by!("n.ms", "w.owner"),
    " AND (w.force OR NOT ",
    quarantined_at!("n.ms"),
    ")
     RETURNING k.*, w.id AS waiter_id),
     refused AS (
         UPDATE waiters w SET refused = true
         FROM served, n
         WHERE w.key = served.key AND served.quarantined AND NOT w.force AND ",
    in_line!("w", "n.ms"),
    "
         RETURNING w.id),
     ",
    record_history!(
        "served",
        concat!("r.ended_end = ", stored!(TermEnd::Expired))
    ),
    ",
     ",
    queue_grant_events!("served"),
    "
     SELECT waiter_id, live_fence, live_lease_id, live_acquired_at_ms, live_expires_at_ms,
            live_handed_off
     FROM served"
);

/// Hands a grant to its waiter row: `$1` waiter id, `$2` fence, `$3`
/// lease_id, `$4` acquired_at, `$5` expires_at, `$6` handed off. The grant
/// is not taken yet (`granted_taken`, migration 0009): its waiter's server
/// takes it with [`HEARTBEAT`] or [`WAITER_GRANT`], or [`UNDO_UNTAKEN`]
/// undoes it once that server's heartbeat has lapsed.
pub const MARK_GRANTED: &str = "UPDATE waiters SET granted_fence = $2, granted_lease_id = $3,
            granted_acquired_at_ms = $4, granted_expires_at_ms = $5, granted_handed_off = $6,
            granted_taken = false
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
                ORDER BY k.key COLLATE \"C\" FOR UPDATE)
     UPDATE keys k SET
         live_ttl_ms        = COALESCE(r.ttl_ms, k.live_ttl_ms),
         live_expires_at_ms = GREATEST(k.live_expires_at_ms, n.ms + COALESCE(r.ttl_ms, k.live_ttl_ms))
     FROM n, r, locked
     WHERE k.key = r.key AND locked.key = r.key
       AND k.live_fence = r.fence AND k.live_lease_id = r.lease_id AND k.live_expires_at_ms > n.ms
     RETURNING k.*";

/// Ends the live term: `$1` key, `$2` fence, `$3` lease_id, `$4` how (1
/// released, 2 suspended), `$5` the successor to keep the key for (NULL:
/// none), `$6` for how long, `$7` the history length. A clean release
/// resets the failure count and lifts a quarantine; a suspension counts as
/// a failure. The ended term is recorded in the history in the same
/// statement.
pub const RELEASE: &str = concat!(
    "WITH n AS (SELECT now_ms() AS ms),
     released AS (
     UPDATE keys k SET ",
    end_live!("$4::smallint", "$5::text", "$6::bigint", "$7::bigint"),
    "
     FROM n
     WHERE k.key = $1 AND k.live_fence = $2 AND k.live_lease_id = $3 AND k.live_expires_at_ms > n.ms
     RETURNING k.*),
     ",
    record_history!(released "released"),
    ",
     ",
    queue_end_events!("released"),
    "
     SELECT * FROM released"
);

/// [`RELEASE_MANY`] and [`RELEASE_ONE`]: `$locked` the CTE that locks the
/// rows first (or nothing), `$from` and `$on` join it (or nothing).
macro_rules! release_many {
    ($locked:literal, $from:literal, $on:literal) => {
        concat!(
            "WITH n AS (SELECT now_ms() AS ms),
     req AS (SELECT * FROM unnest($1::text[], $2::bigint[], $3::uuid[], $4::smallint[],
                                  $5::text[], $6::bigint[])
             AS req(key, fence, lease_id, end_kind, successor, handoff_ms)),",
            $locked,
            "
     released AS (
     UPDATE keys k SET ",
            end_live!("req.end_kind", "req.successor", "req.handoff_ms", "$7::bigint"),
            "
     FROM n, req",
            $from,
            "
     WHERE k.key = req.key",
            $on,
            "
       AND k.live_fence = req.fence AND k.live_lease_id = req.lease_id
       AND k.live_expires_at_ms > n.ms
       AND NOT EXISTS (SELECT 1 FROM waiters w WHERE w.key = k.key AND ",
            in_line!("w", "n.ms"),
            ")
     RETURNING k.*),
     ",
            record_history!(released "released"),
            ",
     ",
            queue_end_events!("released"),
            "
     SELECT released.*, pg_notify($8, released.key) FROM released"
        )
    };
}

/// Ends live terms whose keys nobody waits for, each on its own condition,
/// in one autocommit statement: `$1` keys (distinct), `$2` fences, `$3`
/// lease_ids, `$4` how (1 released, 2 suspended), `$5` the successors to
/// keep the keys for (NULL: none), `$6` for how long, as arrays of one
/// length; `$7` the history length, `$8` the schema's channel. As
/// [`RELEASE`] for each row, with its history entry and event, and a
/// `NOTIFY` of each key (a waiter that entered the line after this
/// statement's snapshot is woken by it, and serves itself). A key with
/// someone alive in line is not released here: [`RELEASE`] then serves the
/// line in a transaction. Returns the rows released; a key not returned
/// was not. Rows are locked in key order first, so concurrent batches
/// cannot deadlock.
pub const RELEASE_MANY: &str = release_many!(
    "
     locked AS (SELECT k.key FROM keys k WHERE k.key IN (SELECT key FROM req)
                ORDER BY k.key COLLATE \"C\" FOR UPDATE),",
    ", locked",
    " AND locked.key = req.key"
);

/// [`RELEASE_MANY`] for a batch of one key, without locking its row first:
/// a statement that waits for one `keys` row only, holding none, cannot be
/// part of a deadlock (the history rows it writes are only ever touched
/// under their key's row lock), and the lock taken first writes a WAL
/// record of its own before the update's (#12: about 55 bytes, most of a
/// lone client's cycle's extra over the unbatched release).
pub const RELEASE_ONE: &str = release_many!("", "", "");

/// Takes the lock that serialises joining one key's line across every
/// server of the schema, until the transaction ends: `$1` a name naming
/// the schema and the key (`Inner::enqueue`). [`ENQUEUE`] counts the line
/// in a statement of its own after this one, so its snapshot is taken
/// once the lock is held and sees every waiter that joined before it.
/// (A count in the statement that takes a lock would read the snapshot
/// taken before it waited: under READ COMMITTED, two Acquires could each
/// count one place left and both take it.) Only joining is serialised;
/// leaving the line needs no lock: a count that still sees a waiter who
/// is leaving at that moment only refuses a little early.
pub const LOCK_LINE: &str = "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))";

/// Puts an Acquire in line unless `$10` (`--max-waiters-per-key`) or more
/// already wait in it, counted as [`SERVE_FIRST`] sees the line (every
/// server's waiters alive and not yet granted): `$1` key, `$2` owner, `$3`
/// ttl_ms, `$4` request_id, `$5` wait_ms, `$6` how long the row lives
/// without a heartbeat, `$7` lock_delay_ms, `$8` the term's recovery
/// limit (NULL: none), `$9` force. Returns one row: `waiting`, how many
/// were in line, and the new row's `id` and `wait_until_ms`, both NULL
/// when the line was full. Run after [`LOCK_LINE`], in its transaction.
pub const ENQUEUE: &str = concat!(
    "WITH n AS (SELECT now_ms() AS ms),
     line AS (SELECT count(*) AS waiting FROM waiters w, n WHERE w.key = $1 AND ",
    in_line!("w", "n.ms"),
    "),
     queued AS (
         INSERT INTO waiters (key, owner, ttl_ms, request_id, wait_until_ms, alive_until_ms,
                              lock_delay_ms, max_recoveries, force)
         SELECT $1, $2, $3, $4, n.ms + $5, n.ms + $6, $7, $8, $9 FROM n, line
         WHERE line.waiting < $10::bigint
         RETURNING id, wait_until_ms)
     SELECT line.waiting, queued.id, queued.wait_until_ms FROM line LEFT JOIN queued ON true"
);

/// Marks a waiter row's grant, if it has one, taken: in the statement that
/// reads it for its waiter, which commits before the waiter can answer, so
/// a grant a client may have been told of is never undone.
macro_rules! take_grant {
    () => {
        "granted_taken = CASE WHEN granted_fence IS NULL THEN granted_taken ELSE true END"
    };
}

/// A waiter's heartbeat, which also tells it whether it was granted (and
/// takes the grant): `$1` id, `$2` how long the row lives from now.
pub const HEARTBEAT: &str = concat!(
    "UPDATE waiters SET alive_until_ms = now_ms() + $2, ",
    take_grant!(),
    " WHERE id = $1
     RETURNING granted_fence, granted_lease_id, granted_acquired_at_ms, granted_expires_at_ms,
               granted_handed_off, refused"
);

/// Leaves the line: `$1` id.
pub const LEAVE: &str = "DELETE FROM waiters WHERE id = $1";

/// Leaves the line unless granted meanwhile: `$1` id. Returns a row when
/// the waiter was still in line.
pub const LEAVE_UNGRANTED: &str =
    "DELETE FROM waiters WHERE id = $1 AND granted_fence IS NULL RETURNING id";

/// Takes the grant of a waiter row (after [`LEAVE_UNGRANTED`] found it
/// granted): `$1` id.
pub const WAITER_GRANT: &str = concat!(
    "UPDATE waiters SET ",
    take_grant!(),
    " WHERE id = $1
     RETURNING granted_fence, granted_lease_id, granted_acquired_at_ms, granted_expires_at_ms,
               granted_handed_off"
);

/// A cancelled wait leaves the line (`$1` id): its row goes, unless it
/// holds a grant nobody took, whose row [`LAPSE_UNTAKEN`] lapses instead.
pub const LEAVE_CANCELLED: &str =
    "DELETE FROM waiters WHERE id = $1 AND granted_taken IS NOT FALSE";

/// Lapses the row of a cancelled wait (`$1` id) that holds a grant nobody
/// took, so that the next sweep undoes the grant ([`UNDO_UNTAKEN`]): the
/// request that waited is gone, so nobody was told of it. (A retry with
/// the same request id takes it first, see [`TAKE_REPLAYED`].)
pub const LAPSE_UNTAKEN: &str =
    "UPDATE waiters SET alive_until_ms = 0 WHERE id = $1 AND granted_taken = false";

/// Takes the grant of term `$2` of key `$1` to a waiter row, if one holds
/// it untaken, before the term is replayed to a retried Acquire: the
/// replay hands the term out as surely as its waiter's pick-up does.
pub const TAKE_REPLAYED: &str = "UPDATE waiters SET granted_taken = true
     WHERE key = $1 AND granted_fence = $2 AND granted_taken = false";

/// Moves terms past their deadline to ended (expired) and wakes their
/// waiters, at most 1000 keys a call: `$1` the schema's channel, `$2` the
/// history length. Returns one row per key it moved. Each row is
/// re-checked under its lock, so a renewal that got there first wins; the
/// history entry, failure count, quarantine and lock-delay of each expiry
/// are written by whichever statement moves it first (this, a grant, or
/// [`EXPIRE_KEY`]), once.
pub const SWEEP_EXPIRED: &str = concat!(
    "WITH n AS (SELECT now_ms() AS ms),
     due AS (SELECT k.key FROM keys k
             WHERE k.live_fence IS NOT NULL AND k.live_expires_at_ms <= (SELECT ms FROM n)
             ORDER BY k.live_expires_at_ms LIMIT 1000 FOR UPDATE OF k SKIP LOCKED),
     moved AS (
         UPDATE keys k SET ",
    expire_live!("$2::bigint"),
    "
         FROM due, n
         WHERE k.key = due.key AND k.live_fence IS NOT NULL AND k.live_expires_at_ms <= n.ms
         RETURNING k.*),
     ",
    record_history!("moved"),
    ",
     ",
    queue_end_events!("moved"),
    "
     SELECT moved.key, pg_notify($1, moved.key) FROM moved"
);

/// Moves the term of key `$1` to ended (expired) if it is past its
/// deadline, as [`SWEEP_EXPIRED`] does: `$2` the history length. Returns a
/// row when it moved one. Run before reading what an expiry leaves behind
/// (History, Unquarantine, a refusal that quotes the history).
pub const EXPIRE_KEY: &str = concat!(
    "WITH n AS (SELECT now_ms() AS ms),
     moved AS (
         UPDATE keys k SET ",
    expire_live!("$2::bigint"),
    "
         FROM n
         WHERE k.key = $1 AND k.live_fence IS NOT NULL AND k.live_expires_at_ms <= n.ms
         RETURNING k.*),
     ",
    record_history!("moved"),
    ",
     ",
    queue_end_events!("moved"),
    "
     SELECT moved.key FROM moved"
);

/// Lifts the quarantine of key `$1` and resets its failure count. Returns
/// a row when the key exists. Run after [`EXPIRE_KEY`] in one transaction,
/// so an expiry nobody moved yet cannot quarantine the key again later.
pub const LIFT_QUARANTINE: &str =
    "UPDATE keys SET quarantined = false, failures = 0 WHERE key = $1 RETURNING key";

/// The newest ended terms of key `$1`: of its newest `$2` (the history
/// length), those with a fence below `$3`, newest first, at most `$4`.
pub const HISTORY: &str = "SELECT h.* FROM (SELECT * FROM term_history WHERE key = $1
                           ORDER BY fence DESC LIMIT $2) h
     WHERE h.fence < $3 ORDER BY h.fence DESC LIMIT $4";

/// The kinds of the newest `$2` ended terms of key `$1`, newest first (for
/// the quarantine refusal).
pub const RECENT_ENDS: &str = "SELECT fence, end_kind FROM term_history WHERE key = $1
     ORDER BY fence DESC LIMIT $2";

/// Retention, step 1: drops settled tool calls of keys released cleanly at
/// least `$1` ms ago, at most `$2` a call (the sweeper calls again while a
/// call drops that many). Returns how many it dropped.
///
/// # Locking
/// Nobody else writes a settled call of a key with no live term but
/// another server's sweep, and two deletes of one set of rows in
/// different orders (a plan, or a synchronised scan, can start anywhere)
/// deadlock: so the rows are locked first, in key order as every
/// statement that locks several rows, skipping those another sweep holds,
/// and the delete never waits.
pub const PRUNE_SETTLED_CALLS: &str = concat!(
    "WITH due AS (
         SELECT t.key, t.turn, t.call_id FROM tool_calls t, keys k
         WHERE t.key = k.key AND t.state <> ",
    stored!(CallState::Running),
    "
           AND k.live_fence IS NULL AND k.ended_end = ",
    stored!(TermEnd::Released),
    " AND k.ended_at_ms <= (SELECT now_ms() - $1)
         ORDER BY t.key COLLATE \"C\", t.ordinal LIMIT $2
         FOR UPDATE OF t SKIP LOCKED)
     DELETE FROM tool_calls t USING due
     WHERE t.key = due.key AND t.turn = due.turn AND t.call_id = due.call_id"
);

/// Retention, step 2: forgets keys released cleanly at least `$1` ms ago
/// that have no tool calls and nobody in line, with their history, and
/// queues their FORGOTTEN events (with the last term's fence and owner),
/// at most `$2` keys a call (the sweeper calls again while a call forgets
/// that many). Returns how many it forgot. The fence sequence lives apart
/// from the rows, so a forgotten key's fences are never reused.
///
/// # Locking
/// The keys are locked first, in byte order (`COLLATE "C"`) as every
/// statement that locks several keys, and a key another statement holds
/// (a grant batch, a release, a sweep) is skipped until a later sweep:
/// the delete never waits for a `keys` row, so it cannot deadlock with a
/// grant or release batch that holds some of the keys it wants (it did,
/// deleting in scan order: #46), nor with another server's sweep. A row
/// locked here is the newest version, re-checked against the conditions
/// on the row (READ COMMITTED re-reads a row changed since the snapshot),
/// so a key granted since is not forgotten. Its history rows are only
/// written under its row's lock, so deleting them does not wait either.
pub const FORGET_RELEASED: &str = concat!(
    "WITH due AS (
         SELECT k.key FROM keys k
         WHERE k.live_fence IS NULL AND k.ended_end = ",
    stored!(TermEnd::Released),
    " AND k.ended_at_ms <= (SELECT now_ms() - $1)
           AND NOT EXISTS (SELECT 1 FROM tool_calls t WHERE t.key = k.key)
           AND NOT EXISTS (SELECT 1 FROM waiters w WHERE w.key = k.key AND w.granted_fence IS NULL)
         ORDER BY k.key COLLATE \"C\" LIMIT $2
         FOR UPDATE OF k SKIP LOCKED),
     gone AS (
         DELETE FROM keys k USING due WHERE k.key = due.key
         RETURNING k.key, k.ended_fence, k.ended_owner),
     history_gone AS (DELETE FROM term_history h USING gone WHERE h.key = gone.key)
     INSERT INTO event_queue (key, kind, fence, owner, at_ms)
     SELECT gone.key, ",
    stored!(EventKind::Forgotten),
    ", gone.ended_fence, gone.ended_owner, now_ms() FROM gone"
);

/// Waiter rows whose server stopped keeping them alive (or whose grant was
/// never picked up) for a minute, at most `$1` a call (the sweeper calls
/// again while a call drops that many). Locked first in id order, skipping
/// rows another statement holds (another server's sweep dropping the same
/// rows, in whatever order its scan found them, would deadlock with this
/// one), so the delete never waits.
pub const DROP_DEAD_WAITERS: &str = "WITH dead AS (
         SELECT id FROM waiters WHERE alive_until_ms < (SELECT now_ms() - 60000)
         ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED)
     DELETE FROM waiters w USING dead WHERE w.id = dead.id";

/// Ends row `k`'s live term at `n.ms` as if it had not been granted: the
/// term a sweep undoes ([`UNDO_UNTAKEN`]) was never handed to anyone, so
/// it counts no failure and lifts no quarantine, starts no lock-delay and
/// keeps no reservation, and it ends as the term before it ended
/// (released when there was none): a key that needed recovering before
/// the grant still does (List RECOVERABLE), and one that did not still
/// does not. Its history entry and event say so.
macro_rules! undo_live {
    ($len:literal) => {
        concat!(
            ring_advance!("(k.live_acquired_at_ms IS NOT NULL)", $len),
            ",
         ended_fence = k.live_fence, ended_owner = k.live_owner, ended_lease_id = k.live_lease_id,
         ended_end = COALESCE(k.ended_end, ", stored!(TermEnd::Released), "), ended_at_ms = n.ms,
         ended_acquired_at_ms = k.live_acquired_at_ms, ended_handed_off = k.live_handed_off,
         reserved_kind = NULL, reserved_after_fence = NULL, reserved_successor = NULL,
         reserved_until_ms = NULL,
         live_fence = NULL, live_owner = NULL, live_lease_id = NULL, live_request_id = NULL,
         live_ttl_ms = NULL, live_acquired_at_ms = NULL, live_expires_at_ms = NULL,
         live_lock_delay_ms = 0, live_max_recoveries = NULL, live_handed_off = false"
        )
    };
}

/// Undoes grants to waiter rows that nobody took (#46), at most `$3` a
/// call: `$1` the schema's channel, `$2` the history length. Returns the
/// key of each row it removed, whose waiters it wakes (a row whose term
/// already ended some other way just goes).
///
/// A grant goes to a waiter alive in line (its row's heartbeat has not
/// lapsed), but its server can die before it picks the grant up; the key
/// then stayed held for the grant's whole TTL while newcomers were
/// refused. A grant whose row is still not taken once its heartbeat has
/// lapsed (its server stopped: killed, cut off, or its request was
/// cancelled, see [`LAPSE_UNTAKEN`]) is undone: the term ends (see
/// `undo_live`) and the key is notified, so the line moves on.
///
/// # Why no client can hold an undone grant
/// A grant reaches a client only through its waiter row: the waiter's
/// server reads it with [`HEARTBEAT`] or [`WAITER_GRANT`], a retried
/// Acquire replays it after [`TAKE_REPLAYED`], and each of those marks the
/// row taken in an autocommit statement before anyone can answer (the
/// lease id, which renew and release need, is nowhere else but in the
/// `keys` row). The undo deletes the row only if it is still not taken
/// and lapsed when the delete holds its lock (READ COMMITTED re-checks a
/// row changed since the snapshot), and ends the term only with that
/// row's delete, in one statement: so either the taking committed first
/// and the undo leaves the row alone, or the undo did and the taking
/// finds no row (a waiter that finds its row gone looks at the key
/// afresh; a replay reads the key again after taking). A grant whose
/// taking failed midway (the statement's outcome unknown to its server)
/// counts as taken if it committed: kept for its TTL, the safe side.
/// A term past its deadline is left to the expiry sweep. The term ended
/// was granted before the statement began (the row's mark commits with
/// the grant), so its history entry is written as a release's is.
///
/// # Locking
/// The keys rows first, in byte order, skipping keys another statement
/// holds (the next sweep comes back to them), then the waiter rows, the
/// order every transaction that touches both keeps.
pub const UNDO_UNTAKEN: &str = concat!(
    "WITH n AS (SELECT now_ms() AS ms),
     untaken AS (SELECT w.id, w.key FROM waiters w, n
                 WHERE w.granted_taken = false AND w.alive_until_ms <= n.ms
                 ORDER BY w.key COLLATE \"C\", w.id LIMIT $3),
     locked AS (SELECT k.key FROM keys k WHERE k.key IN (SELECT key FROM untaken)
                ORDER BY k.key COLLATE \"C\" FOR UPDATE SKIP LOCKED),
     gone AS (
         DELETE FROM waiters w USING untaken u, locked l, n
         WHERE w.id = u.id AND l.key = u.key
           AND w.granted_taken = false AND w.alive_until_ms <= n.ms
         RETURNING w.key, w.granted_fence, w.granted_lease_id),
     undone AS (
         UPDATE keys k SET ",
    undo_live!("$2::bigint"),
    "
         FROM gone g, n
         WHERE k.key = g.key AND k.live_fence = g.granted_fence
           AND k.live_lease_id = g.granted_lease_id AND k.live_expires_at_ms > n.ms
         RETURNING k.*),
     ",
    record_history!(released "undone"),
    ",
     ",
    queue_end_events!("undone"),
    "
     SELECT g.key, pg_notify($1, g.key) FROM gone g"
);

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

/// List RECOVERABLE, parameters as [`LIST_ALL`]: free keys whose last term
/// expired or was suspended, not quarantined. Each half reads through its
/// own partial index: `keys_recoverable` (last term expired or suspended)
/// in key order, and `keys_deadline` for terms past their deadline that the
/// sweeper has not moved yet (at most 1000 of them, the earliest; a mass
/// expiry beyond that shows up as the sweeper catches up), less those whose
/// expiry quarantines the key. `now` is read once, and used as a plan
/// parameter (an InitPlan), so the deadline half is an index range, not a
/// scan of every live key.
pub const LIST_RECOVERABLE: &str = concat!(
    "WITH n AS (SELECT now_ms() AS ms)
     SELECT * FROM (
         (SELECT n.ms AS now, k.* FROM keys k, n
          WHERE k.live_fence IS NULL AND k.ended_end IN (",
    stored!(TermEnd::Suspended),
    ", ",
    stored!(TermEnd::Expired),
    ") AND NOT k.quarantined
            AND k.key >= $2 AND k.key < $3 AND k.key LIKE $1 AND k.key > $4
          ORDER BY k.key LIMIT $5)
         UNION ALL
         (SELECT n.ms AS now, d.* FROM n,
                 (SELECT * FROM keys k
                  WHERE k.live_fence IS NOT NULL AND k.live_expires_at_ms <= (SELECT ms FROM n)
                  ORDER BY k.live_expires_at_ms LIMIT 1000) d
          WHERE d.key >= $2 AND d.key < $3 AND d.key LIKE $1 AND d.key > $4
            AND NOT (d.quarantined OR ",
    earns_quarantine!(d),
    ")
          ORDER BY d.key LIMIT $5)
     ) r ORDER BY r.key LIMIT $5"
);

/// List QUARANTINED, parameters as [`LIST_ALL`]: keys flagged (through
/// `keys_quarantined`), and keys whose expired term nobody has moved yet
/// whose expiry quarantines them (through `keys_deadline`, as in
/// [`LIST_RECOVERABLE`]).
pub const LIST_QUARANTINED: &str = concat!(
    "WITH n AS (SELECT now_ms() AS ms)
     SELECT * FROM (
         (SELECT n.ms AS now, k.* FROM keys k, n
          WHERE k.quarantined
            AND k.key >= $2 AND k.key < $3 AND k.key LIKE $1 AND k.key > $4
          ORDER BY k.key LIMIT $5)
         UNION ALL
         (SELECT n.ms AS now, d.* FROM n,
                 (SELECT * FROM keys k
                  WHERE k.live_fence IS NOT NULL AND k.live_expires_at_ms <= (SELECT ms FROM n)
                  ORDER BY k.live_expires_at_ms LIMIT 1000) d
          WHERE d.key >= $2 AND d.key < $3 AND d.key LIKE $1 AND d.key > $4
            AND NOT d.quarantined
            AND ",
    earns_quarantine!(d),
    "
          ORDER BY d.key LIMIT $5)
     ) r ORDER BY r.key LIMIT $5"
);

/// Locks the live term for the rest of the transaction, so no release or
/// grant can commit between this check and the ledger write, and so begins
/// on one key take turns: `$1` key, `$2` fence, `$3` lease_id. Returns `now`
/// when the term is live.
///
/// The lock is exclusive among begins (`FOR NO KEY UPDATE`, which still lets
/// readers and foreign keys through): since calls may name turns, an id is a
/// duplicate of rows under *other* primary keys (another turn, for a begin
/// without a turn or with `across_turns`), which no unique index can catch.
/// A begin that waited for another reads the ledger after the other
/// committed (each statement of a READ COMMITTED transaction reads afresh),
/// so the duplicate rule is checked against every call begun before it.
pub const LOCK_LIVE_TERM: &str = "SELECT n.ms AS now FROM keys k, (SELECT now_ms() AS ms) n
     WHERE k.key = $1 AND k.live_fence = $2 AND k.live_lease_id = $3 AND k.live_expires_at_ms > n.ms
     FOR NO KEY UPDATE OF k";

/// The key's calls with an id among `$2` (call ids), in every turn, in
/// registration order: `$1` key.
pub const CALLS_BY_ID: &str =
    "SELECT * FROM tool_calls WHERE key = $1 AND call_id = ANY($2) ORDER BY ordinal";

/// Draws `$1` registration ordinals, in order.
pub const ORDINALS: &str =
    "SELECT nextval('tool_call_ordinals') AS ordinal FROM generate_series(1, $1::int) ORDER BY 1";

/// Records calls as running: `$1` key, `$2` call ids, `$3` names, `$4` input
/// digests, `$5` ordinals, `$6` fence, `$7` begun_at, `$8` turns ('' for
/// none).
pub const INSERT_CALLS: &str = concat!(
    "INSERT INTO tool_calls (key, turn, call_id, ordinal, name, input_digest, fence, state,
                             result_digest, result, begun_at_ms)
     SELECT $1, c.turn, c.call_id, c.ordinal, c.name, c.input_digest, $6, ",
    stored!(CallState::Running),
    ", '', ''::bytea, $7
     FROM unnest($2::text[], $3::text[], $4::text[], $5::bigint[], $8::text[])
          AS c(call_id, name, input_digest, ordinal, turn)"
);

/// Settles a running call under the live term, in one statement that locks
/// the term first: `$1` key, `$2` fence, `$3` lease_id, `$4` call id, `$5`
/// state, `$6` result digest, `$7` result, `$8` the call's turn ('': the
/// one call with this id, whatever its turn; nothing is settled when the id
/// is in several turns). Returns the call, or nothing when the term is not
/// live or the call is not running (or is ambiguous).
pub const SETTLE: &str = concat!(
    "WITH n AS (SELECT now_ms() AS ms),
     term AS (SELECT k.key FROM keys k, n
              WHERE k.key = $1 AND k.live_fence = $2 AND k.live_lease_id = $3
                AND k.live_expires_at_ms > n.ms
              FOR SHARE OF k)
     UPDATE tool_calls t SET state = $5, settled_fence = $2, result_digest = $6, result = $7,
                             settled_at_ms = n.ms
     FROM term, n
     WHERE t.key = term.key AND t.call_id = $4 AND t.state = ",
    stored!(CallState::Running),
    "
       AND (t.turn = $8
            OR ($8 = '' AND (SELECT count(*) FROM tool_calls u
                             WHERE u.key = $1 AND u.call_id = $4) = 1))
     RETURNING t.*"
);

/// The calls of one id (in the turn `$3`, or in every turn when `$3` is
/// ''), in registration order: `$1` key, `$2` call id.
pub const CALLS_WITH_ID: &str = "SELECT * FROM tool_calls
     WHERE key = $1 AND call_id = $2 AND ($3 = '' OR turn = $3) ORDER BY ordinal";

/// Whether the key has a row: `$1` key.
pub const KEY_EXISTS: &str = "SELECT EXISTS (SELECT 1 FROM keys WHERE key = $1)";

/// The key's calls in registration order: `$1` key.
pub const CALLS: &str = "SELECT * FROM tool_calls WHERE key = $1 ORDER BY ordinal";

/// The key's running calls in registration order: `$1` key.
pub const RUNNING_CALLS: &str = concat!(
    "SELECT * FROM tool_calls WHERE key = $1 AND state = ",
    stored!(CallState::Running),
    " ORDER BY ordinal"
);

/// Whether any event waits for a revision (the sequencer's cheap first look).
pub const EVENTS_QUEUED: &str = "SELECT EXISTS (SELECT 1 FROM event_queue)";

/// The sequencer, in one statement: locks the one `event_head` row (waiting
/// for another server's sequencer to commit), gives the next revisions to
/// the events of the oldest `$1` queue rows, in queue order (a row's events
/// in array order), and moves them to the log as rows of at most
/// `$2` events (`events::EVENTS_PER_ROW`; migration 0007: one row, not one per event,
/// keeps the log's insert, index entry and delete off every event).
/// Returns the new head, how many events it numbered and how many queue
/// rows it moved.
///
/// One statement, so a server that dies or drops it midway never leaves a
/// transaction holding the lock. Its snapshot is older than the lock: an
/// event the sequencer before it took is skipped (deleting a row another
/// transaction deleted and committed is a no-op under READ COMMITTED), and
/// an event committed after the snapshot waits for the next run, numbered
/// after these (for one key, any later change committed later still). The
/// lock is a one-time filter of the `DELETE`, taken before any queued row
/// is touched, so two sequencers never delete at once.
pub const SEQUENCE_EVENTS: &str = "WITH head AS (SELECT revision FROM event_head FOR UPDATE),
     moved AS (
         DELETE FROM event_queue q
         WHERE (SELECT revision FROM head) IS NOT NULL
           AND q.id IN (SELECT id FROM event_queue ORDER BY id LIMIT $1)
         RETURNING q.*),
     flat AS (
         SELECT m.id, 1::bigint AS ord, m.key, m.kind, m.fence, m.owner, m.at_ms
         FROM moved m WHERE m.keys IS NULL
         UNION ALL
         SELECT m.id, u.ord, u.key, u.kind, u.fence, u.owner, u.at_ms
         FROM moved m,
              unnest(m.keys, m.kinds, m.fences, m.owners, m.at_mss)
                  WITH ORDINALITY AS u(key, kind, fence, owner, at_ms, ord)
         WHERE m.keys IS NOT NULL),
     numbered AS (
         SELECT row_number() OVER (ORDER BY id, ord) AS n, key, kind, fence, owner, at_ms
         FROM flat),
     added AS (
         INSERT INTO events (revision, keys, kinds, fences, owners, at_mss)
         SELECT (SELECT revision FROM head) + min(n), array_agg(key ORDER BY n),
                array_agg(kind ORDER BY n), array_agg(fence ORDER BY n),
                array_agg(owner ORDER BY n), array_agg(at_ms ORDER BY n)
         FROM numbered
         GROUP BY (n - 1) / $2::bigint
         RETURNING revision + cardinality(keys) - 1 AS last, cardinality(keys) AS events)
     UPDATE event_head
     SET revision = (SELECT coalesce(max(a.last), (SELECT revision FROM head)) FROM added a)
     RETURNING revision, (SELECT coalesce(sum(a.events), 0)::bigint FROM added a) AS numbered,
               (SELECT count(*) FROM moved) AS moved";

/// Trims the log to the newest `$1` revisions (idempotent), at most `$2`
/// log rows a call: a row goes once its last event is older than those (a
/// row of one event has no `keys`), and the row the cut falls inside keeps
/// only its newer events, so the oldest revision kept is exactly the first
/// after the cut. Returns `locked`, how many rows at or below the cut it
/// took (the sweeper calls again while that is `$2`).
///
/// # Locking
/// The rows at or below the cut are locked first, in revision order, and
/// only those are deleted or cut. Two deletes of one set of rows could
/// otherwise lock them in different orders and deadlock (the
/// sub-statements of a `WITH` run in no set order, and a scan can start
/// anywhere); locked in one order, a second trim waits for the first at
/// its first row and holds nothing meanwhile. It then re-reads each row
/// (READ COMMITTED): a row the first deleted is gone, and the cut row the
/// first moved is past the cut (or is cut further). Nothing else writes a
/// row below the head (the sequencer only adds rows above it). Waiting,
/// rather than skipping, keeps a trim's promise: when it returns, the log
/// is trimmed to its cut.
pub const TRIM_EVENTS: &str = "WITH cut AS (SELECT revision - $1::bigint AS at FROM event_head),
     old AS (
         SELECT x.revision FROM events x, cut WHERE x.revision <= cut.at
         ORDER BY x.revision LIMIT $2 FOR UPDATE OF x),
     gone AS (
         DELETE FROM events x USING cut, old
         WHERE x.revision = old.revision
           AND x.revision + coalesce(cardinality(x.keys), 1) - 1 <= cut.at),
     cut_row AS (
         UPDATE events x
         SET revision = cut.at + 1,
             keys   = x.keys[(cut.at + 2 - x.revision)::int:],
             kinds  = x.kinds[(cut.at + 2 - x.revision)::int:],
             fences = x.fences[(cut.at + 2 - x.revision)::int:],
             owners = x.owners[(cut.at + 2 - x.revision)::int:],
             at_mss = x.at_mss[(cut.at + 2 - x.revision)::int:]
         FROM cut, old
         WHERE x.revision = old.revision AND x.keys IS NOT NULL
           AND x.revision + cardinality(x.keys) - 1 > cut.at)
     SELECT count(*) AS locked FROM old";

/// The head and the oldest revision kept (NULL: the log is empty), and up to
/// `$2` events after revision `$1` in revision order (a row with NULL
/// `revision` when there are none), as of one snapshot. Rows of many events
/// are unnested (a row of one event as an array of one); only the rows that
/// can hold revisions `$1 + 1 ..= $1 + $2` are read, through the index: from
/// the last one that begins at or before `$1 + 1` to the last that begins
/// at or before `$1 + $2` (the caller keeps `$1 + $2 + 1` within `bigint`).
pub const READ_EVENTS: &str = "SELECT h.revision AS head,
            (SELECT min(x.revision) FROM events x) AS oldest,
            e.revision, e.key, e.kind, e.fence, e.owner, e.at_ms
     FROM event_head h
     LEFT JOIN LATERAL (
         SELECT x.revision + u.ord - 1 AS revision, u.key, u.kind, u.fence, u.owner, u.at_ms
         FROM events x,
              unnest(coalesce(x.keys, ARRAY[x.key]), coalesce(x.kinds, ARRAY[x.kind]),
                     coalesce(x.fences, ARRAY[x.fence]), coalesce(x.owners, ARRAY[x.owner]),
                     coalesce(x.at_mss, ARRAY[x.at_ms]))
                  WITH ORDINALITY AS u(key, kind, fence, owner, at_ms, ord)
         WHERE x.revision >= coalesce((SELECT max(y.revision) FROM events y
                                       WHERE y.revision <= $1::bigint + 1), 0)
           AND x.revision <= $1::bigint + $2::bigint
           AND x.revision + u.ord - 1 > $1::bigint
         ORDER BY 1 LIMIT $2) e ON true
     ORDER BY e.revision";

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

/// `ALTER SEQUENCE` takes a lock on the sequence that `nextval` waits
/// for until the transaction ends (`LOCK TABLE` refuses sequences): while
/// [`FENCE_FLOOR_RAISE`] reads and sets the value, no server of the fleet
/// can draw a fence in between, which would let the `setval` step below a
/// fence already granted. `NO CYCLE` is what the sequence already is (a
/// cycling sequence would repeat fences), so it changes nothing else.
pub const FENCE_FLOOR_LOCK: &str = "ALTER SEQUENCE fences NO CYCLE";

/// The sequence's highest value drawn (0: none yet), before the raise.
pub const FENCE_FLOOR_BEFORE: &str =
    "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM fences";

/// Raises the fence sequence so the next fence is above `$1` (a bigint),
/// and never lowers it: below the last value drawn, it sets the same value
/// back. Only under [`FENCE_FLOOR_LOCK`].
pub const FENCE_FLOOR_RAISE: &str = "SELECT setval('fences', GREATEST($1, last_value), \
     is_called OR $1 > last_value) FROM fences";

#[cfg(test)]
mod tests {
    #[test]
    fn the_quarantine_rule_renders_for_any_row_alias() {
        assert_eq!(
            earns_quarantine!(),
            "(COALESCE(k.live_max_recoveries, 0) > 0 AND k.failures + 1 >= k.live_max_recoveries)"
        );
        assert_eq!(
            earns_quarantine!(d),
            "(COALESCE(d.live_max_recoveries, 0) > 0 AND d.failures + 1 >= d.live_max_recoveries)"
        );
        // Every list of what is quarantined applies the one rule.
        assert!(super::LIST_QUARANTINED.contains(earns_quarantine!(d)));
        assert!(super::LIST_RECOVERABLE.contains(earns_quarantine!(d)));
    }
}
