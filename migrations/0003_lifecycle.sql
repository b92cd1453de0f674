-- The ownership lifecycle (see docs/lifecycle.md): what a live term asked for
-- its end, the free key's reservation, the quarantine count, term history.
ALTER TABLE keys ADD COLUMN live_lock_delay_ms INTEGER;     -- NULL: none
ALTER TABLE keys ADD COLUMN live_max_recoveries INTEGER;    -- NULL: the server default
ALTER TABLE keys ADD COLUMN live_handed_off INTEGER;        -- 1: granted to a named successor
ALTER TABLE keys ADD COLUMN reserved_kind INTEGER;          -- 1 lock-delay, 2 handoff; NULL: none
ALTER TABLE keys ADD COLUMN reserved_after_fence INTEGER;   -- the term whose end reserved the key
ALTER TABLE keys ADD COLUMN reserved_successor TEXT;        -- handoff: who alone may take it
ALTER TABLE keys ADD COLUMN reserved_until_ms INTEGER;
ALTER TABLE keys ADD COLUMN failures INTEGER NOT NULL DEFAULT 0;     -- failed terms in a row
ALTER TABLE keys ADD COLUMN quarantined INTEGER NOT NULL DEFAULT 0;

-- The last ended terms of each key (the server keeps the newest N); rows go
-- with their key when it is forgotten.
CREATE TABLE term_history (
    key                  TEXT NOT NULL,
    fence                INTEGER NOT NULL,
    owner                TEXT NOT NULL,
    acquired_at_ms       INTEGER NOT NULL,
    ended_at_ms          INTEGER NOT NULL,
    end_kind             INTEGER NOT NULL,   -- 1 released, 2 suspended, 3 expired
    unsettled_tool_calls INTEGER NOT NULL,
    handed_off           INTEGER NOT NULL,
    PRIMARY KEY (key, fence)
) WITHOUT ROWID;
