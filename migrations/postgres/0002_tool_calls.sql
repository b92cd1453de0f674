-- leasehold on PostgreSQL, schema version 2: the tool-call ledger.
-- state: 1 running, 2 succeeded, 3 failed, 4 unknown (as on SQLite).

-- Registration order, server-wide (as the SQLite engine's counter).
CREATE SEQUENCE tool_call_ordinals AS bigint MINVALUE 1;

CREATE TABLE tool_calls (
    key           text COLLATE "C" NOT NULL,
    call_id       text NOT NULL,
    ordinal       bigint NOT NULL,
    name          text NOT NULL,
    input_digest  text NOT NULL,
    fence         bigint NOT NULL,
    state         smallint NOT NULL,
    settled_fence bigint,
    result_digest text NOT NULL,
    result        bytea NOT NULL,
    begun_at_ms   bigint NOT NULL,
    settled_at_ms bigint,
    PRIMARY KEY (key, call_id)
);

CREATE INDEX tool_calls_running ON tool_calls (key) WHERE state = 1;
