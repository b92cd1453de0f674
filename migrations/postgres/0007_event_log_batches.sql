-- leasehold on PostgreSQL, schema version 7: the event log in rows of
-- many events (#12).
--
-- The sequencer used to unnest every queued row into one `events` row per
-- event, and the trim deleted each again: an insert, an index entry and a
-- delete per event, two events per lock cycle, about a fifth of the WAL of
-- a cycle. It now writes the events it numbers as rows of arrays, at most
-- 256 events a row (so a page of the log never reads a huge row): a row
-- with `keys` set holds the events `revision .. revision +
-- cardinality(keys) - 1`, in array order; a row without it is one event in
-- the scalar columns (as written by version 5 and 6, and still read). The
-- trim deletes a row only once its last event is past the length kept.
-- See crates/leasehold-server/src/postgres/events.rs.
--
-- Rolling upgrades: a server of version 6 refuses to start on this schema
-- (it is newer than it knows). One already running keeps working: its
-- writes are unchanged (its sequencer still writes one row per event,
-- which newer servers read), but its Watch streams cannot read rows of
-- arrays: its feed fails ("reading the event log failed", retried every
-- poll) and a watcher catching up ends with INTERNAL, so its watchers stall
-- or end (none skips an event) until it is upgraded; its trim deletes a
-- row by its first revision, so the log it trims may keep up to 255 events
-- fewer than asked.

ALTER TABLE events
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
