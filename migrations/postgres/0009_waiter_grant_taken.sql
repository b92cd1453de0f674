-- leasehold on PostgreSQL, schema version 9: whether a waiter's grant was
-- taken (#46).
--
-- A grant to a waiter row is made by whichever server frees the key; the
-- waiter's own server picks it up. When that server died first, nobody
-- ever will, and the key stayed held by the grant for its whole TTL. Now
-- the grant marks its row `granted_taken = false`, the pick-up (or a
-- replay of the grant to a retried Acquire) sets it true in the statement
-- that hands it out, and a sweep undoes a grant still not taken once its
-- row's heartbeat has lapsed (see sql::UNDO_UNTAKEN). NULL: not granted,
-- or granted by a server older than this version, which never undoes it.

ALTER TABLE waiters ADD COLUMN granted_taken boolean;

-- The untaken grants, for the sweep: few rows, and only changes of
-- granted_taken touch the index (a heartbeat stays a HOT update).
CREATE INDEX waiters_untaken ON waiters (key, id) WHERE granted_taken = false;
