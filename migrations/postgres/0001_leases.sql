-- leasehold on PostgreSQL, schema version 1: keys, fences, waiters.
-- Applied once, in one transaction, under an advisory lock (see
-- crates/leasehold-server/src/postgres/migrate.rs). Never edit a migration
-- that has shipped: append a new file.
--
-- Every time is milliseconds since the Unix epoch by the database's clock
-- (now_ms()), so the leasehold servers' clocks never matter.

CREATE FUNCTION now_ms() RETURNS bigint
    LANGUAGE sql VOLATILE
    AS $$ SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint $$;

-- Every fence ever granted comes from here, for all keys: a sequence never
-- hands out a value twice, so a forgotten key acquired again still gets a
-- fence above every earlier one. Values may be skipped (a refused grant
-- burns one); fences only need to rise.
CREATE SEQUENCE fences AS bigint MINVALUE 1;

-- One row per key that has had a term and is not forgotten. live_* hold the
-- current term (all NULL when there is none; a term whose live_expires_at_ms
-- has passed is over even before the sweeper moves it to ended_*); ended_*
-- hold the last ended term (ended_end: 1 released, 2 suspended, 3 expired).
-- COLLATE "C": keys order by bytes, as on SQLite, so List pages agree.
CREATE TABLE keys (
    key                 text COLLATE "C" PRIMARY KEY,
    live_fence          bigint,
    live_owner          text,
    live_lease_id       uuid,
    live_request_id     text,
    live_ttl_ms         bigint,
    live_acquired_at_ms bigint,
    live_expires_at_ms  bigint,
    ended_fence         bigint,
    ended_owner         text,
    ended_lease_id      uuid,
    ended_end           smallint,
    ended_at_ms         bigint
);

-- List RECOVERABLE: keys whose last term expired or was suspended...
CREATE INDEX keys_recoverable ON keys (key)
    WHERE live_fence IS NULL AND ended_end IN (2, 3);
-- ...and terms past their deadline (the sweeper's work list, and the other
-- half of RECOVERABLE until the sweeper has moved them).
CREATE INDEX keys_deadline ON keys (live_expires_at_ms)
    WHERE live_fence IS NOT NULL;
-- Retention: keys released cleanly, by when.
CREATE INDEX keys_released ON keys (ended_at_ms)
    WHERE live_fence IS NULL AND ended_end = 1;

-- Acquires waiting in line, across every leasehold server on this schema.
-- The line of a key is its rows with granted_fence NULL, by id. A row counts
-- only while its server keeps alive_until_ms in the future (a server that
-- died leaves rows that lapse by themselves) and its wait has not run out.
-- granted_* are set, in the transaction that grants the key to the row, for
-- the waiting server to pick up.
CREATE TABLE waiters (
    id                     bigserial PRIMARY KEY,
    key                    text COLLATE "C" NOT NULL,
    owner                  text NOT NULL,
    ttl_ms                 bigint NOT NULL,
    request_id             text,
    wait_until_ms          bigint NOT NULL,
    alive_until_ms         bigint NOT NULL,
    granted_fence          bigint,
    granted_lease_id       uuid,
    granted_acquired_at_ms bigint,
    granted_expires_at_ms  bigint
);

CREATE INDEX waiters_line ON waiters (key, id) WHERE granted_fence IS NULL;
