-- leasehold on PostgreSQL, schema version 3: the ownership lifecycle (#15,
-- docs/lifecycle.md): lock-delay, handoff to a named successor, the recovery
-- limit (quarantine) and each key's term history, with the same meaning as
-- the SQLite backend's migration 0003.
--
-- Expiry stays lazy: a term past live_expires_at_ms is over before anyone
-- moves it to ended_*. Whichever statement first moves it (a grant, a
-- waiter being served, the sweeper, History, Unquarantine) also records its
-- history entry, counts the failure and starts its lock-delay, in the same
-- statement; the row lock makes that happen exactly once. Until then every
-- reader derives the same outcome from the live_* columns.

-- What the live term asked for its end, and how it began.
ALTER TABLE keys ADD COLUMN live_lock_delay_ms  bigint NOT NULL DEFAULT 0;  -- 0: none
ALTER TABLE keys ADD COLUMN live_max_recoveries integer;  -- the effective limit; NULL: none
ALTER TABLE keys ADD COLUMN live_handed_off     boolean NOT NULL DEFAULT false;
-- The last ended term, the parts its history entry needs.
ALTER TABLE keys ADD COLUMN ended_acquired_at_ms bigint;
ALTER TABLE keys ADD COLUMN ended_handed_off     boolean NOT NULL DEFAULT false;
-- Who alone may take the free key, until when (1 lock-delay: nobody; 2
-- handoff: reserved_successor). Only meaningful while live_fence IS NULL
-- and reserved_until_ms is in the future.
ALTER TABLE keys ADD COLUMN reserved_kind        smallint;
ALTER TABLE keys ADD COLUMN reserved_after_fence bigint;
ALTER TABLE keys ADD COLUMN reserved_successor   text;
ALTER TABLE keys ADD COLUMN reserved_until_ms    bigint;
-- Terms in a row that ended by expiry or suspension; the quarantine flag.
ALTER TABLE keys ADD COLUMN failures    integer NOT NULL DEFAULT 0;
ALTER TABLE keys ADD COLUMN quarantined boolean NOT NULL DEFAULT false;

-- List QUARANTINED.
CREATE INDEX keys_quarantined ON keys (key) WHERE quarantined;

-- A waiting Acquire's lifecycle options, whether its grant was a handoff,
-- and whether it was refused (the key became quarantined while it waited;
-- a refused row is out of the line, and its request answers with the
-- quarantine).
ALTER TABLE waiters ADD COLUMN lock_delay_ms      bigint NOT NULL DEFAULT 0;
ALTER TABLE waiters ADD COLUMN max_recoveries     integer;
ALTER TABLE waiters ADD COLUMN force              boolean NOT NULL DEFAULT false;
ALTER TABLE waiters ADD COLUMN granted_handed_off boolean NOT NULL DEFAULT false;
ALTER TABLE waiters ADD COLUMN refused            boolean NOT NULL DEFAULT false;

-- The last ended terms of each key (each server reads the newest N of its
-- --history-len; the statement that adds an entry trims to that many). Rows
-- go with their key when it is forgotten (in the same statement).
CREATE TABLE term_history (
    key                  text COLLATE "C" NOT NULL,
    fence                bigint NOT NULL,
    owner                text NOT NULL,
    acquired_at_ms       bigint NOT NULL,
    ended_at_ms          bigint NOT NULL,
    end_kind             smallint NOT NULL,   -- 1 released, 2 suspended, 3 expired
    unsettled_tool_calls integer NOT NULL,
    handed_off           boolean NOT NULL,
    PRIMARY KEY (key, fence)
);
