-- leasehold on PostgreSQL, schema version 8: each key's term history is a
-- ring of rows updated in place (#12).
--
-- Until now every statement that ended a term inserted a `term_history`
-- row keyed by (key, fence) and then trimmed the key to the newest
-- --history-len entries; finding the cut read the key's whole history at
-- every release (about 1 ms of a 1.6-1.9 ms release batch) and the insert,
-- its index entry and the delete were about 260 WAL bytes a cycle. Now the
-- key's history lives in at most `keys.history_slots` rows keyed by (key,
-- slot), and the statement that ends a term writes its entry over the
-- slot of the oldest one, chosen from counters in the key's row that the
-- same statement bumps:
--
--   history_ends   entries written into the ring as it is laid out now
--                  (less the ring's length whenever it would pass twice that:
--                  only its remainder, and whether the ring is full, count);
--   history_slots  the ring's length (0: no ring yet);
--   history_base   the slot number of ring position 0;
--   history_rotated set only by a statement that grew a ring that had
--                  wrapped (see below), NULL otherwise.
--
-- The entry numbered e (from 0) is at slot history_base + e mod
-- history_slots, so the ring holds the newest history_slots entries, and
-- once it is full a write is an update of one row that changes no indexed
-- column (HOT) and needs no trim: a plain `UPDATE` from a release, `INSERT
-- … ON CONFLICT (key, slot) DO UPDATE` from the sweeper or a grant (see
-- `sql::record_history` for why). A ring slot found without a row (see
-- there) gets one when the ring comes round to it.
-- Reads (History, the quarantine's recent ends) are unchanged: the key's
-- rows ordered by fence, newest first, limited to the asking server's
-- --history-len. Fences are never reused (the `fences` sequence), and a
-- key's terms end in fence order, so slot order and fence order agree.
--
-- Servers with different --history-len on one schema (or a restart with
-- another): a ring only grows. A statement whose length exceeds the key's
-- ring grows it to that length: if the ring had not wrapped (or sits
-- exactly at a wrap) its rows stay where they are; if it had, the same
-- statement moves its rows, oldest first, to the slots from history_base +
-- old length upwards (history_rotated tells it where the oldest was), so
-- no entry is lost and the ring keeps filling before it overwrites
-- anything. A statement whose length is below the key's ring writes into
-- the ring at the ring's length: the rows beyond a shrunken length stay,
-- are overwritten in turn, and go when the key is forgotten; a shorter
-- server reads only its newest N, and a longer one still finds its own N.
-- So every server sees exactly the newest N entries it is configured for
-- whenever that many were recorded since the ring reached N.
--
-- Exactly once: only the statement that moves a term from live to ended
-- bumps the counters (under the key's row lock). A grant or a served
-- waiter that offers an expired term someone else moved writes the slot
-- of the newest entry only if that slot holds an older fence, which it
-- never does (it holds this very term): nothing is written twice.
--
-- Here: the rows each key has are renumbered into a ring of exactly that
-- many slots, oldest first (so every entry is kept, the newest included,
-- and the ring sits at a wrap: the first server with a longer
-- --history-len grows it without moving a row).
--
-- Rolling upgrades: a server of version 7 refuses to start on this schema
-- (it is newer than it knows). One already running keeps reading history
-- (its reads order by fence, which still works), but every statement of
-- it that records an end (release, the expiry sweep, a grant that replaces
-- an expired term) fails on the missing slot (`null value in column
-- "slot"`) and changes nothing, so its clients get errors for those
-- requests until it is upgraded; the newer servers' sweepers expire the
-- terms its clients could not release. It cannot corrupt a ring: its
-- trim's delete is in the same failing statement.

ALTER TABLE keys
    ADD COLUMN history_ends    integer NOT NULL DEFAULT 0,
    ADD COLUMN history_slots   integer NOT NULL DEFAULT 0,
    ADD COLUMN history_base    integer NOT NULL DEFAULT 0,
    ADD COLUMN history_rotated integer;

ALTER TABLE term_history ADD COLUMN slot integer;

UPDATE term_history h SET slot = o.position
FROM (SELECT key, fence, row_number() OVER (PARTITION BY key ORDER BY fence) - 1 AS position
      FROM term_history) o
WHERE h.key = o.key AND h.fence = o.fence;

UPDATE keys k SET history_ends = n.entries, history_slots = n.entries
FROM (SELECT key, count(*) AS entries FROM term_history GROUP BY key) n
WHERE k.key = n.key;

ALTER TABLE term_history
    ALTER COLUMN slot SET NOT NULL,
    DROP CONSTRAINT term_history_pkey,
    ADD PRIMARY KEY (key, slot);
