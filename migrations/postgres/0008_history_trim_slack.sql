-- leasehold on PostgreSQL, schema version 8: a key's history is trimmed at
-- every 16th clean or suspending release, not at each (#12).
--
-- Trimming looked for the key's len-th newest entry (a scan of its whole
-- history, some thirty rows on as many pages) in every release: about half
-- of what PostgreSQL spent executing a release batch. A release now counts
-- the entries it added since the last trim in history_since_trim (0-15, in
-- the same update of the key's row), and trims only when the count wraps
-- to 0, so a key keeps between --history-len and --history-len + 15 rows.
-- Readers never saw the rows beyond the newest --history-len (History and
-- the quarantine refusal read the newest N), so no answer changes. The
-- other statements that add an entry (a grant or a waiter replacing an
-- expired term, the sweeper) still trim every time; they are rare.
--
-- Rolling upgrades: a server of version 7 refuses to start on this schema.
-- One already running ignores the column (it names the columns it writes
-- and reads rows by column name) and trims at each of its releases, as
-- before; the counter is only a trigger, so whoever trims next trims all.

ALTER TABLE keys ADD COLUMN history_since_trim smallint NOT NULL DEFAULT 0;
