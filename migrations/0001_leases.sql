-- The lease table: one row per key ever acquired.
-- Columns prefixed live_ hold the key's current term (all NULL when it has none);
-- ended_ columns hold its last ended term.
CREATE TABLE keys (
    key                 TEXT PRIMARY KEY NOT NULL,
    live_fence          INTEGER,
    live_owner          TEXT,
    live_lease_id       BLOB,
    live_request_id     TEXT,
    live_ttl_ms         INTEGER,
    live_acquired_at_ms INTEGER,
    live_expires_at_ms  INTEGER,
    ended_fence         INTEGER,
    ended_owner         TEXT,
    ended_lease_id      BLOB,
    ended_end           INTEGER,   -- 1 released, 2 suspended, 3 expired
    ended_at_ms         INTEGER
) WITHOUT ROWID;

-- Server-wide counters. 'fence_high_water' is the highest fence ever granted:
-- kept apart from the keys so fences never regress even if rows are pruned.
CREATE TABLE meta (
    name  TEXT PRIMARY KEY NOT NULL,
    value INTEGER NOT NULL
) WITHOUT ROWID;

INSERT INTO meta (name, value) VALUES ('fence_high_water', 0);
