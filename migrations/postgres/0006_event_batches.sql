-- leasehold on PostgreSQL, schema version 6: one queued row per statement.
--
-- A statement that changes many keys at once (batched grants and releases,
-- the sweeper) queues all its events as one event_queue row of arrays,
-- in their order, instead of one row each: the queue's insert, index entry
-- and delete were a third of the WAL of a lock cycle. The sequencer numbers
-- a row's events in array order, rows in id order, so the order of one
-- key's changes is kept (see 0005 and
-- crates/leasehold-server/src/postgres/events.rs). Rows of one event (the
-- scalar columns, as written by version 5) stay valid, and are numbered
-- in the same id order.

ALTER TABLE event_queue
    ALTER COLUMN key   DROP NOT NULL,
    ALTER COLUMN kind  DROP NOT NULL,
    ALTER COLUMN fence DROP NOT NULL,
    ALTER COLUMN owner DROP NOT NULL,
    ALTER COLUMN at_ms DROP NOT NULL,
    ADD COLUMN keys   text[],
    ADD COLUMN kinds  smallint[],
    ADD COLUMN fences bigint[],
    ADD COLUMN owners text[],
    ADD COLUMN at_mss bigint[];
