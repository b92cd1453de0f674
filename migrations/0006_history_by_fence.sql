-- Term history keyed by fence alone. A fence is never given twice, so it
-- names one history entry across all keys. Keyed by (key, fence), every
-- release wrote its entry into a B-tree page of its own key, so a commit of
-- N releases (or N expiries) dirtied about N history pages; keyed by fence,
-- the entries of one commit have neighbouring fences and share the rightmost
-- page, and the entries that fall out of the
-- history (by fence, named by the server) sit together further left. The
-- server deletes a forgotten key's entries by their fences too, so no index
-- on key is kept. An older leasehold refuses this database (its schema
-- version is newer), never reads it wrongly.
CREATE TABLE term_history_by_fence (
    fence                INTEGER PRIMARY KEY,
    key                  TEXT NOT NULL,
    owner                TEXT NOT NULL,
    acquired_at_ms       INTEGER NOT NULL,
    ended_at_ms          INTEGER NOT NULL,
    end_kind             INTEGER NOT NULL,   -- 1 released, 2 suspended, 3 expired
    unsettled_tool_calls INTEGER NOT NULL,
    handed_off           INTEGER NOT NULL
);
INSERT OR REPLACE INTO term_history_by_fence (fence, key, owner, acquired_at_ms, ended_at_ms,
        end_kind, unsettled_tool_calls, handed_off)
    SELECT fence, key, owner, acquired_at_ms, ended_at_ms, end_kind, unsettled_tool_calls,
           handed_off
    FROM term_history ORDER BY fence;
DROP TABLE term_history;
ALTER TABLE term_history_by_fence RENAME TO term_history;
