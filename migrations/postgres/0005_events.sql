-- leasehold on PostgreSQL, schema version 5: the Watch event log (#15,
-- docs/lifecycle.md), with the same events as the SQLite backend's.
--
-- Revisions must follow commit order across every server, and a sequence
-- drawn inside the writing transactions does not (a transaction can draw
-- 7, commit after another drew 8, and a watcher that saw 8 would miss 7).
-- So a change's events are queued by the very statement that changes the
-- key (event_queue, a provisional id), and revisions are given afterwards by
-- a sequencer step that any server runs, one at a time (it locks the one
-- event_head row): it moves every queued row it can see (committed, so
-- finished) to events with the next revisions. A transaction still running
-- is invisible to it and gets later revisions when it commits; a watcher
-- reads only events, so it never sees a revision below one it will see
-- later. See crates/leasehold-server/src/postgres/events.rs.
--
-- kind: 1 granted, 2 released, 3 suspended, 4 expired, 5 forgotten (an
-- ended term's ended_end + 1). at_ms: when it happened by the database
-- clock (an expiry: the term's deadline).

CREATE TABLE event_queue (
    id     bigserial PRIMARY KEY,
    key    text COLLATE "C" NOT NULL,
    kind   smallint NOT NULL,
    fence  bigint NOT NULL,
    owner  text NOT NULL,
    at_ms  bigint NOT NULL
);

-- The log: dense revisions from the oldest kept to event_head.revision. The
-- sequencer deletes those older than its server's --event-log-len.
CREATE TABLE events (
    revision bigint PRIMARY KEY,
    key      text COLLATE "C" NOT NULL,
    kind     smallint NOT NULL,
    fence    bigint NOT NULL,
    owner    text NOT NULL,
    at_ms    bigint NOT NULL
);

-- The highest revision given (kept when the log is trimmed empty), and the
-- sequencer's lock.
CREATE TABLE event_head (
    one      boolean PRIMARY KEY DEFAULT true CHECK (one),
    revision bigint NOT NULL
);
INSERT INTO event_head (one, revision) VALUES (true, 0);
