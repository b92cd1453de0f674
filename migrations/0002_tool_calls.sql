-- The tool-call ledger: one row per (key, call id).
-- state: 1 running, 2 succeeded, 3 failed, 4 unknown.
CREATE TABLE tool_calls (
    key           TEXT NOT NULL,
    call_id       TEXT NOT NULL,
    ordinal       INTEGER NOT NULL,
    name          TEXT NOT NULL,
    input_digest  TEXT NOT NULL,
    fence         INTEGER NOT NULL,
    state         INTEGER NOT NULL,
    settled_fence INTEGER,
    result_digest TEXT NOT NULL,
    result        BLOB NOT NULL,
    begun_at_ms   INTEGER NOT NULL,
    settled_at_ms INTEGER,
    PRIMARY KEY (key, call_id)
) WITHOUT ROWID;
