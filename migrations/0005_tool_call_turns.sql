-- Tool calls may name a turn (models that reuse call ids in every turn):
-- a call's identity becomes (key, turn, call_id); '' is no turn. SQLite cannot
-- change a primary key in place, so the table is rebuilt with its rows.
CREATE TABLE tool_calls_v2 (
    key           TEXT NOT NULL,
    turn          TEXT NOT NULL DEFAULT '',
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
    PRIMARY KEY (key, turn, call_id)
) WITHOUT ROWID;
INSERT INTO tool_calls_v2 (key, turn, call_id, ordinal, name, input_digest, fence, state,
    settled_fence, result_digest, result, begun_at_ms, settled_at_ms)
SELECT key, '', call_id, ordinal, name, input_digest, fence, state, settled_fence,
    result_digest, result, begun_at_ms, settled_at_ms
FROM tool_calls;
DROP TABLE tool_calls;
ALTER TABLE tool_calls_v2 RENAME TO tool_calls;
